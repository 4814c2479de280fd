//! Every API route, each method with the permission it needs and, where it is a
//! security-relevant event, the audit event it records. A route is added only
//! through [`ApiRoutes::route`], which takes its rules with its handlers, so no
//! route exists without a permission; a method a route serves but does not
//! declare is refused to every key (fail closed), and the test that walks the
//! OpenAPI document with a key of each clearance would catch it.
//!
//! The permission is checked after authentication (`app::authenticate`) and
//! after routing (the rule belongs to the route), by [`guard`]. The own HTTP/1.1
//! loop serves only the document route and checks the same [`DOCUMENT_RULES`].

use crate::access::Need;
use crate::metrics::DOCUMENT_ROUTE;
use crate::routes::{
    admin as routes_admin, api_keys, bulk, changes, docs as routes_docs, queries, revisions,
    subscriptions,
};
use crate::state::SharedState;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use axum::routing::{get, post, put, MethodRouter};
use axum::Router;

/// One method of a route: what it needs, and what it writes to the audit log.
#[derive(Clone, Copy, Debug)]
pub struct Rule {
    pub method: &'static str,
    pub need: Need,
    /// The audit log's `event` for this request (`audit.rs`), or none.
    pub audit: Option<&'static str>,
}

const fn rule(method: &'static str, need: Need) -> Rule {
    Rule {
        method,
        need,
        audit: None,
    }
}

const fn audited(method: &'static str, need: Need, event: &'static str) -> Rule {
    Rule {
        method,
        need,
        audit: Some(event),
    }
}

/// The rule of `method` (HEAD is GET's) among a route's.
pub fn rule_for(rules: &'static [Rule], method: &str) -> Option<&'static Rule> {
    let method = if method == "HEAD" { "GET" } else { method };
    rules.iter().find(|r| r.method == method)
}

/// A document, or an attachment (its id's tail): read, or written.
pub const DOCUMENT_RULES: &[Rule] = &[
    rule("GET", Need::READ),
    rule("PUT", Need::READ_WRITE),
    rule("POST", Need::READ_WRITE),
    rule("PATCH", Need::READ_WRITE),
    rule("DELETE", Need::READ_WRITE),
];

/// One route of the table: its path template and the rule of one of its methods.
#[derive(Clone, Copy, Debug)]
pub struct RouteRule {
    pub path: &'static str,
    pub rule: Rule,
}

/// The API routes being put together, with their table.
pub(crate) struct ApiRoutes {
    router: Router<SharedState>,
    table: Vec<RouteRule>,
    /// The state the rules are enforced with (with authentication or an audit log
    /// on); none: the rules are only listed.
    guarded: Option<SharedState>,
}

impl ApiRoutes {
    /// A route: its path, the rule of each method, and the handlers.
    fn route(
        mut self,
        path: &'static str,
        rules: &'static [Rule],
        methods: MethodRouter<SharedState>,
    ) -> ApiRoutes {
        let methods = match &self.guarded {
            Some(state) => methods.route_layer(axum::middleware::from_fn_with_state(
                Guard {
                    state: state.clone(),
                    rules,
                },
                guard,
            )),
            None => methods,
        };
        self.router = self.router.route(path, methods);
        self.table
            .extend(rules.iter().map(|&rule| RouteRule { path, rule }));
        self
    }
}

/// Checks a request's caller against its route's rule, answers 403 `forbidden`
/// when it falls short, and records the audited requests.
#[derive(Clone)]
struct Guard {
    state: SharedState,
    rules: &'static [Rule],
}

async fn guard(State(guard): State<Guard>, mut req: Request, next: Next) -> Response {
    let rule = rule_for(guard.rules, req.method().as_str());
    let db = database_of(&mut req).await;
    let check = crate::app::authorize(&guard.state, &req, rule, db.as_deref());
    match check {
        Err(refused) => refused,
        Ok(audit) => {
            let resp = next.run(req).await;
            if let Some(entry) = audit {
                entry.finish(resp.status().as_u16());
            }
            resp
        }
    }
}

/// The `{db}` of the route's path (percent-decoded, as the handler sees it), if
/// it has one.
async fn database_of(req: &mut Request) -> Option<String> {
    use axum::RequestExt;
    let params = req
        .extract_parts::<axum::extract::RawPathParams>()
        .await
        .ok()?;
    params
        .iter()
        .find(|(name, _)| *name == "db")
        .map(|(_, value)| value.to_string())
}

/// Every API route (the router's `api` part, before its layers), guarded or not.
pub(crate) fn api_routes(guarded: Option<SharedState>) -> ApiRoutes {
    let routes = ApiRoutes {
        router: Router::new(),
        table: Vec::new(),
        guarded,
    };
    let routes = admin_routes(routes);
    let routes = document_routes(routes);
    let routes = attachment_routes(routes);
    let routes = backup_routes(routes);
    let routes = index_routes(routes);
    let routes = revision_routes(routes);
    let routes = subscription_routes(routes);
    cluster_routes(routes)
}

impl ApiRoutes {
    pub(crate) fn into_router(self) -> Router<SharedState> {
        self.router
    }
}

/// Every API route's path, method and permission (for the OpenAPI test and the docs).
pub fn route_permissions() -> Vec<RouteRule> {
    api_routes(None).table
}

/// The server and its databases: metrics, statistics, databases created and
/// deleted, tombstones purged; who the caller is.
fn admin_routes(r: ApiRoutes) -> ApiRoutes {
    r.route(
        "/metrics",
        const { &[rule("GET", Need::Operator)] },
        get(routes_admin::metrics),
    )
    .route(
        "/stats",
        const { &[rule("GET", Need::Operator)] },
        get(routes_admin::server_stats),
    )
    .route(
        "/whoami",
        const { &[rule("GET", Need::Authenticated)] },
        get(routes_admin::whoami),
    )
    .route(
        "/admin/api-keys",
        const {
            &[
                rule("GET", Need::Operator),
                audited("POST", Need::Operator, "api_key.create"),
            ]
        },
        get(api_keys::list).post(api_keys::create),
    )
    .route(
        "/admin/api-keys/{id}",
        const { &[audited("DELETE", Need::Operator, "api_key.revoke")] },
        axum::routing::delete(api_keys::revoke),
    )
    .route(
        "/dbs",
        // Any caller; the list shows only the databases it may read.
        const { &[rule("GET", Need::Authenticated)] },
        get(routes_admin::list_databases),
    )
    .route(
        "/dbs/{db}",
        const {
            &[
                audited("PUT", Need::ADMIN, "database.create"),
                rule("GET", Need::READ),
                audited("DELETE", Need::ADMIN, "database.delete"),
            ]
        },
        put(routes_admin::create_database)
            .get(routes_admin::database_stats)
            .delete(routes_admin::delete_database),
    )
    .route(
        "/dbs/{db}/tombstones",
        const {
            &[
                rule("GET", Need::READ),
                audited("DELETE", Need::ADMIN, "tombstones.purge"),
            ]
        },
        get(routes_admin::tombstones).delete(routes_admin::purge_tombstones),
    )
}

/// Documents: read and written one at a time, in batches and in bulk, listed,
/// and their changes.
fn document_routes(r: ApiRoutes) -> ApiRoutes {
    r.route(
        "/dbs/{db}/docs",
        const { &[rule("GET", Need::READ)] },
        get(routes_docs::list_by_prefix),
    )
    .route(
        DOCUMENT_ROUTE,
        DOCUMENT_RULES,
        // An id with an `/attachments/{name}` tail is an attachment's path
        // (`routes/attachments.rs`); any other goes to `routes/docs.rs`.
        get(crate::routes::attachments::get)
            .put(crate::routes::attachments::put)
            .post(crate::routes::attachments::post)
            .patch(crate::routes::attachments::patch)
            .delete(crate::routes::attachments::delete)
            // Attachments stream: no body limit beyond the disk's.
            .layer(axum::extract::DefaultBodyLimit::disable()),
    )
    .route(
        "/dbs/{db}/batch",
        const { &[rule("POST", Need::READ_WRITE)] },
        post(routes_docs::batch),
    )
    .route(
        "/dbs/{db}/bulk",
        const { &[rule("POST", Need::READ_WRITE)] },
        post(bulk::bulk_insert),
    )
    .route(
        "/dbs/{db}/changes",
        const { &[rule("GET", Need::READ)] },
        get(changes::pull),
    )
    .route(
        "/dbs/{db}/changes/ws",
        const { &[rule("GET", Need::READ)] },
        get(changes::websocket),
    )
    .route(
        "/dbs/{db}/collections",
        const { &[rule("GET", Need::READ)] },
        get(routes_docs::collections),
    )
    .route(
        "/dbs/{db}/collections/{collection}/docs",
        const { &[rule("GET", Need::READ)] },
        get(routes_docs::list_collection),
    )
}

/// Attachments staged for a batch and their blobs (a document's attachments
/// share the document route: `document_routes`).
fn attachment_routes(r: ApiRoutes) -> ApiRoutes {
    r.route(
        "/dbs/{db}/attachments",
        const { &[rule("POST", Need::READ_WRITE), rule("GET", Need::READ)] },
        post(crate::routes::attachments::stage)
            .get(crate::routes::attachments::list_blobs)
            .layer(axum::extract::DefaultBodyLimit::disable()),
    )
    .route(
        "/dbs/{db}/attachments/{hash}",
        const { &[rule("GET", Need::READ)] },
        get(crate::routes::attachments::get_blob),
    )
}

/// A database's backups and restores: the whole database leaves or is replaced.
fn backup_routes(r: ApiRoutes) -> ApiRoutes {
    use crate::routes::backup;
    r.route(
        "/dbs/{db}/backup",
        const { &[audited("GET", Need::ADMIN, "backup")] },
        get(backup::backup),
    )
    .route(
        "/dbs/{db}/backup/chain",
        const {
            &[
                rule("GET", Need::ADMIN),
                audited("DELETE", Need::ADMIN, "backup.chain_stop"),
            ]
        },
        get(backup::chain_stats).delete(backup::chain_stop),
    )
    .route(
        "/dbs/{db}/restore",
        const { &[audited("POST", Need::ADMIN, "restore")] },
        post(backup::restore),
    )
}

/// Indexes and the queries that use them.
fn index_routes(r: ApiRoutes) -> ApiRoutes {
    r.route(
        "/dbs/{db}/indexes",
        const { &[rule("GET", Need::READ)] },
        get(queries::list_indexes),
    )
    .route(
        "/dbs/{db}/indexes/{name}",
        const {
            &[
                audited("PUT", Need::ADMIN, "index.put"),
                rule("GET", Need::READ),
                audited("DELETE", Need::ADMIN, "index.delete"),
            ]
        },
        put(queries::put_index)
            .get(queries::get_index)
            .delete(queries::delete_index),
    )
    .route(
        "/dbs/{db}/indexes/{name}/reset",
        const { &[audited("POST", Need::ADMIN, "index.reset")] },
        post(queries::reset_index),
    )
    .route(
        "/dbs/{db}/queries",
        // The query language only reads.
        const { &[rule("POST", Need::READ)] },
        post(queries::run_query),
    )
}

/// Document revisions: which collections keep them, listed, purged, reverted to.
fn revision_routes(r: ApiRoutes) -> ApiRoutes {
    r.route(
        "/dbs/{db}/revisions/config",
        const {
            &[
                rule("GET", Need::READ),
                audited("PUT", Need::ADMIN, "revisions.config"),
            ]
        },
        get(revisions::get_config).put(revisions::put_config),
    )
    .route(
        "/dbs/{db}/revisions/docs/{*id}",
        const {
            &[
                rule("GET", Need::READ),
                audited("DELETE", Need::ADMIN, "revisions.purge"),
            ]
        },
        get(revisions::list).delete(revisions::purge),
    )
    .route(
        "/dbs/{db}/revisions/revert/{*id}",
        // A revert is a document write.
        const { &[rule("POST", Need::READ_WRITE)] },
        post(revisions::revert),
    )
}

/// Subscriptions to a database's changes, and their websockets.
fn subscription_routes(r: ApiRoutes) -> ApiRoutes {
    r.route(
        "/dbs/{db}/subscriptions",
        const {
            &[
                rule("GET", Need::READ),
                audited("POST", Need::ADMIN, "subscription.create"),
            ]
        },
        get(subscriptions::list).post(subscriptions::create),
    )
    .route(
        "/dbs/{db}/subscriptions/{name}",
        const {
            &[
                rule("GET", Need::READ),
                audited("DELETE", Need::ADMIN, "subscription.delete"),
            ]
        },
        get(subscriptions::get_one).delete(subscriptions::delete),
    )
    .route(
        "/dbs/{db}/subscriptions/{name}/ws",
        // A worker reads documents; its acknowledgements move only its position.
        const { &[rule("GET", Need::READ)] },
        get(subscriptions::websocket),
    )
}

/// The cluster's status and membership (its Raft messages: `app::open_routes`).
fn cluster_routes(r: ApiRoutes) -> ApiRoutes {
    use crate::routes::cluster;
    r.route(
        "/cluster",
        // Clients of every clearance find the leader and the nodes here.
        const { &[rule("GET", Need::Authenticated)] },
        get(cluster::status),
    )
    .route(
        "/cluster/members",
        const { &[audited("POST", Need::Operator, "cluster.member_add")] },
        post(cluster::add_member),
    )
    .route(
        "/cluster/leader",
        const { &[audited("POST", Need::Operator, "cluster.leader_transfer")] },
        post(crate::routes::cluster_leader::transfer),
    )
    .route(
        "/cluster/members/{id}",
        const { &[audited("DELETE", Need::Operator, "cluster.member_remove")] },
        axum::routing::delete(cluster::remove_member),
    )
    .route(
        "/cluster/members/{id}/promote",
        const { &[audited("POST", Need::Operator, "cluster.member_promote")] },
        post(cluster::promote_member),
    )
}
