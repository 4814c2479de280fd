//! A clustered server (`kiln serve --node-id N --cluster ...`): the cluster's
//! routes, and the writes that go through its log instead of the local write
//! queue.
//!
//! - `GET /cluster`: the cluster as this node sees it.
//! - `POST /cluster/raft/{append,vote,snapshot}`: Raft's messages between nodes.
//! - A write sent to a follower is redirected to the leader (307, the same path:
//!   a client that follows redirects resends it there), by `front_door`.
//! - On the leader, a write is proposed to the log and answered once a majority
//!   has it and this node has applied it: with the etag every node gives it.

use crate::error::{current_etag, error_code, ApiError, ErrorCode};
use crate::http_util::json_value;
use crate::http_util::ApiPath;
use crate::state::{AppState, SharedState};
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use kiln_cluster::{
    Answer, ClusterError, ClusterNode, Command, ErrorAnswer, LoggedCondition, LoggedOp, WriteAnswer,
};
use kiln_docs::{BatchOutcome, Condition, DeleteOutcome, DocError, Etag, PutOutcome};
use std::sync::Arc;

/// How the cluster's state machine reports a document error: the code and etag
/// this server would answer with, so the leader answers as a single server does.
pub fn classifier() -> kiln_cluster::command::ClassifyError {
    Arc::new(|e: &DocError| ErrorAnswer {
        code: error_code(e).as_str().to_string(),
        message: e.to_string(),
        current_etag: current_etag(e).map(|etag| etag.to_string()),
    })
}

fn node(state: &AppState) -> Result<&Arc<ClusterNode>, ApiError> {
    state.cluster.as_ref().ok_or_else(|| {
        ApiError::new(
            ErrorCode::NotClustered,
            "this server is not part of a cluster (start it with --node-id and --cluster)",
        )
    })
}

pub async fn status(State(state): State<SharedState>) -> Result<Response, ApiError> {
    let status = node(&state)?.status();
    Ok(json_value(
        StatusCode::OK,
        serde_json::to_value(status).unwrap_or_default(),
    ))
}

pub async fn raft_message(
    State(state): State<SharedState>,
    ApiPath(kind): ApiPath<String>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let node = node(&state)?;
    let presented = headers
        .get(kiln_cluster::network::CLUSTER_KEY_HEADER)
        .map(|v| v.as_bytes());
    if !node.admits(presented) {
        return Err(ApiError::new(
            ErrorCode::Unauthorized,
            "a Raft message without this cluster's key (the nodes' --cluster-key-file differ?)",
        ));
    }
    if node.waiting_for_disk() {
        // Handed to Raft, the message would wait behind the step that waits for
        // space, and the sender's retries would pile up behind it.
        let mut refused = ApiError::new(
            ErrorCode::ClusterError,
            "this node's disk is full: it takes no part in the cluster until it has room",
        );
        refused.status = StatusCode::SERVICE_UNAVAILABLE;
        refused.retry_after_s = Some(1);
        return Err(refused);
    }
    match node.handle_rpc(&kind, &body).await {
        Ok(answer) => Ok((
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static(kiln_cluster::codec::content_type(&answer)),
            )],
            answer,
        )
            .into_response()),
        Err(e) => Err(ApiError::new(ErrorCode::BadRequest, e.to_string())),
    }
}

/// `POST /cluster/members` with `{"id": N, "address": "host:port"}`: adds a node as
/// a learner; answers once it has caught up with the log (or a snapshot).
pub async fn add_member(
    State(state): State<SharedState>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let node = node(&state)?;
    let body: NewMember = serde_json::from_slice(&body).map_err(|e| {
        ApiError::new(
            ErrorCode::MalformedJson,
            format!("{e} (the body is {{\"id\": N, \"address\": \"host:port\"}})"),
        )
    })?;
    node.add_learner(body.id, body.address.clone())
        .await
        .map_err(cluster_error)?;
    Ok(json_value(
        StatusCode::OK,
        serde_json::json!({"id": body.id, "address": body.address, "role": "learner"}),
    ))
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewMember {
    id: u64,
    address: String,
}

/// `POST /cluster/members/{id}/promote`: a learner becomes a voter.
pub async fn promote_member(
    State(state): State<SharedState>,
    ApiPath(id): ApiPath<u64>,
) -> Result<Response, ApiError> {
    node(&state)?.promote(id).await.map_err(cluster_error)?;
    Ok(json_value(
        StatusCode::OK,
        serde_json::json!({"id": id, "role": "voter"}),
    ))
}

/// `DELETE /cluster/members/{id}`: the node leaves the cluster.
pub async fn remove_member(
    State(state): State<SharedState>,
    ApiPath(id): ApiPath<u64>,
) -> Result<Response, ApiError> {
    node(&state)?.remove(id).await.map_err(cluster_error)?;
    Ok(json_value(
        StatusCode::OK,
        serde_json::json!({"removed": id}),
    ))
}

/// Middleware of a clustered server: a write that reaches a follower goes to the
/// leader (307 to the same path there), or fails with `no_quorum` while there is
/// no leader. Reads are served here (they may lag the leader).
pub async fn front_door(State(state): State<SharedState>, req: Request, next: Next) -> Response {
    let Some(node) = state.cluster.clone() else {
        return next.run(req).await;
    };
    let mut resp = match route_in_cluster(&node, req, next).await {
        Ok(resp) | Err(resp) => resp,
    };
    // Which node answered and how far it has applied the log: a read on a follower
    // may lag the leader by what it has not applied yet.
    let status = node.status();
    let h = resp.headers_mut();
    h.insert("kiln-node-id", HeaderValue::from(node.node_id()));
    if let Some(applied) = status.last_applied {
        h.insert("kiln-applied-index", HeaderValue::from(applied));
    }
    if let Some(leader) = status.leader {
        h.insert("kiln-leader-id", HeaderValue::from(leader));
    }
    resp
}

/// Writes to the leader; `?consistency=linearizable` reads too, after the leader
/// confirmed with a majority that it still leads and applied what was committed.
async fn route_in_cluster(
    node: &ClusterNode,
    mut req: Request,
    next: Next,
) -> Result<Response, Response> {
    let linearizable = take_consistency(&mut req).map_err(IntoResponse::into_response)?;
    let write = is_replicated_write(req.method(), req.uri().path());
    // A subscription's worker is served by the leader, which proposes its
    // acknowledgments (it answers as a linearizable read would be: 307 elsewhere).
    let leader_only = linearizable || is_subscription_worker(req.method(), req.uri().path());
    if !write && !leader_only {
        return Ok(next.run(req).await);
    }
    let leads = node.status().leader == Some(node.node_id());
    if !leads {
        let Some((_, address)) = node.leader() else {
            let mut refused = ApiError::new(
                ErrorCode::NoQuorum,
                "the cluster has no leader at the moment: retry",
            );
            refused.retry_after_s = Some(1);
            refused.outcome = write.then_some("not_written");
            return Err(refused.into_response());
        };
        let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
        if !write && !linearizable {
            return Err(redirect_to_leader(
                node.scheme(),
                &address,
                path,
                RedirectOf::Worker,
            ));
        }
        let path = if linearizable {
            format!(
                "{path}{}consistency=linearizable",
                if path.contains('?') { "&" } else { "?" }
            )
        } else {
            path.to_string()
        };
        let of = if write {
            RedirectOf::Write
        } else {
            RedirectOf::LinearizableRead
        };
        return Err(redirect_to_leader(node.scheme(), &address, &path, of));
    }
    if linearizable {
        node.ensure_linearizable()
            .await
            .map_err(|e| cluster_error(e).into_response())?;
    }
    Ok(next.run(req).await)
}

/// Removes `consistency` from the request's query (the routes do not take it):
/// true for `linearizable`, false for `local` or none.
fn take_consistency(req: &mut Request) -> Result<bool, ApiError> {
    let Some(query) = req.uri().query() else {
        return Ok(false);
    };
    if !query.contains("consistency=") {
        return Ok(false);
    }
    let mut linearizable = false;
    let mut kept = form_urlencoded::Serializer::new(String::new());
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        if k == "consistency" {
            linearizable = match v.as_ref() {
                "linearizable" => true,
                "local" => false,
                other => {
                    return Err(ApiError::new(
                        ErrorCode::InvalidQuery,
                        format!("consistency={other:?}: give linearizable or local"),
                    ))
                }
            };
        } else {
            kept.append_pair(&k, &v);
        }
    }
    let kept = kept.finish();
    let path = req.uri().path();
    let uri = if kept.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{kept}")
    };
    *req.uri_mut() = uri
        .parse()
        .map_err(|_| ApiError::new(ErrorCode::InvalidQuery, "the query does not parse"))?;
    Ok(linearizable)
}

/// Whether a request changes what the cluster replicates (so only the leader
/// takes it). Queries are POSTs that only read.
fn is_replicated_write(method: &Method, path: &str) -> bool {
    let writes = matches!(
        *method,
        Method::PUT | Method::POST | Method::PATCH | Method::DELETE
    );
    writes && !path.starts_with("/cluster/raft/") && !path.ends_with("/queries")
}

/// `GET /dbs/{db}/subscriptions/{name}/ws`: a data subscription's worker.
fn is_subscription_worker(method: &Method, path: &str) -> bool {
    let parts: Vec<&str> = path.split('/').collect();
    *method == Method::GET && matches!(parts.as_slice(), ["", "dbs", _, "subscriptions", _, "ws"])
}

/// What only the leader answers.
#[derive(Clone, Copy)]
enum RedirectOf {
    Write,
    LinearizableRead,
    Worker,
}

/// 307 `not_leader` to the leader's URL for this request.
fn redirect_to_leader(scheme: &str, address: &str, path: &str, of: RedirectOf) -> Response {
    let location = format!("{scheme}://{address}{path}");
    let what = match of {
        RedirectOf::Write => "send writes",
        RedirectOf::LinearizableRead => "send linearizable reads",
        RedirectOf::Worker => "connect subscription workers",
    };
    let mut e = ApiError::new(
        ErrorCode::NotLeader,
        format!("this node is not the leader; {what} to {location}"),
    );
    e.status = StatusCode::TEMPORARY_REDIRECT;
    let mut resp = e.into_response();
    if let Ok(v) = HeaderValue::from_str(&location) {
        resp.headers_mut().insert(header::LOCATION, v);
    }
    resp
}

/// Proposes a command and waits for its answer (the Raft round trip: appended
/// here, replicated to a majority, applied; `kiln.raft.write` in a trace).
async fn propose(node: &ClusterNode, command: Command) -> Result<Answer, ApiError> {
    use tracing::Instrument;
    node.write(command)
        .instrument(tracing::info_span!("kiln.raft.write"))
        .await
        .map_err(cluster_error)
}

pub(crate) fn cluster_error(e: ClusterError) -> ApiError {
    let code = match &e {
        ClusterError::NotLeader { .. } => ErrorCode::NotLeader,
        ClusterError::NoQuorum { .. } => ErrorCode::NoQuorum,
        _ => ErrorCode::ClusterError,
    };
    // Only a refusal decided before the entry entered the log is "not_written"
    // (a client may resend it); one after may still be applied: "unknown".
    let outcome = match &e {
        ClusterError::NotLeader { .. } | ClusterError::NoQuorum { .. } => {
            Some(if e.may_have_been_written() {
                "unknown"
            } else {
                "not_written"
            })
        }
        _ => None,
    };
    let mut api = ApiError::new(code, e.to_string());
    api.retry_after_s = Some(1);
    api.outcome = outcome;
    api
}

/// An error the state machine answered, as this server answers it.
fn answered_error(e: ErrorAnswer) -> ApiError {
    let code = ErrorCode::ALL
        .iter()
        .copied()
        .find(|c| c.as_str() == e.code)
        .unwrap_or(ErrorCode::InternalError);
    let mut api = ApiError::new(code, e.message);
    api.current_etag = e.current_etag.and_then(|t| Etag::parse(&t).ok());
    api
}

/// Proposes `command` to the log and waits for what applying it answered.
pub(crate) async fn propose_command(
    node: &ClusterNode,
    command: Command,
) -> Result<Answer, ApiError> {
    propose(node, command).await
}

/// The error an answer other than the one expected stands for.
pub(crate) fn answer_error(answer: Answer) -> ApiError {
    match answer {
        Answer::Failed(e) => answered_error(e),
        other => unexpected(&other),
    }
}

fn unexpected(answer: &Answer) -> ApiError {
    ApiError::new(
        ErrorCode::InternalError,
        format!("the cluster answered a write with {answer:?}"),
    )
}

/// Writes through the log: one command, its writes each on its own (or all or
/// none); one outcome per write.
pub(crate) async fn write(
    state: &AppState,
    database: &str,
    ops: Vec<LoggedOp>,
    all_or_none: bool,
) -> Result<Vec<Result<BatchOutcome, ApiError>>, ApiError> {
    let node = node(state)?;
    let command = Command::Write {
        database: database.to_string(),
        at_ms: now_ms(),
        all_or_none,
        ops,
    };
    match propose(node, command).await? {
        Answer::Writes(answers) => answers.into_iter().map(outcome).collect(),
        Answer::Failed(e) => Err(answered_error(e)),
        other => Err(unexpected(&other)),
    }
}

fn outcome(answer: WriteAnswer) -> Result<Result<BatchOutcome, ApiError>, ApiError> {
    let etag = |text: &str| {
        Etag::parse(text).map_err(|_| {
            ApiError::new(
                ErrorCode::InternalError,
                format!("the cluster answered etag {text:?}"),
            )
        })
    };
    Ok(match answer {
        WriteAnswer::Put {
            id,
            etag: e,
            collection,
            last_modified_ms,
            created,
        } => Ok(BatchOutcome::Put(PutOutcome {
            id,
            etag: etag(&e)?,
            collection,
            last_modified_ms,
            created,
        })),
        WriteAnswer::Delete {
            id,
            deleted_etag,
            etag: e,
        } => Ok(BatchOutcome::Delete(DeleteOutcome {
            id,
            etag: etag(&deleted_etag)?,
            tombstone_etag: etag(&e)?,
        })),
        WriteAnswer::Failed(e) => Err(answered_error(e)),
    })
}

/// One write through the log.
pub(crate) async fn write_one(
    state: &AppState,
    database: &str,
    op: LoggedOp,
) -> Result<BatchOutcome, ApiError> {
    let mut outcomes = write(state, database, vec![op], false).await?;
    match outcomes.pop() {
        Some(result) if outcomes.is_empty() => result,
        _ => Err(ApiError::new(
            ErrorCode::InternalError,
            "the cluster answered one write with several outcomes",
        )),
    }
}

pub(crate) fn logged_delete(id: String, condition: &Condition) -> LoggedOp {
    LoggedOp::Delete {
        id,
        condition: LoggedCondition::from_condition(condition),
    }
}

pub(crate) async fn create_database(state: &AppState, name: &str) -> Result<(), ApiError> {
    kiln_docs::validate_database_name(name)?;
    let command = Command::CreateDatabase {
        name: name.to_string(),
        incarnation: rand::random(),
    };
    match propose(node(state)?, command).await? {
        Answer::DatabaseCreated { .. } => Ok(()),
        Answer::Failed(e) => Err(answered_error(e)),
        other => Err(unexpected(&other)),
    }
}

pub(crate) async fn delete_database(state: &AppState, name: &str) -> Result<(), ApiError> {
    let command = Command::DeleteDatabase {
        name: name.to_string(),
    };
    match propose(node(state)?, command).await? {
        Answer::DatabaseDeleted { .. } => Ok(()),
        Answer::Failed(e) => Err(answered_error(e)),
        other => Err(unexpected(&other)),
    }
}

/// A restore through the log (`POST /dbs/{db}/restore` on a cluster): the backup's
/// bytes as an upload of the database (made first, empty, when there is none; it
/// goes again if the restore is refused), then `Command::RestoreDatabase`, which
/// every node applies alike from the same bytes: the same etags everywhere. The
/// restore's report, as a single server answers it.
pub(crate) async fn restore_database(
    state: &AppState,
    database: &str,
    until: Option<String>,
    force: bool,
    body: axum::body::Body,
) -> Result<serde_json::Value, ApiError> {
    let node = node(state)?.clone();
    let existed = state.store.database(database).is_ok();
    if existed && !force {
        return Err(
            DocError::Database(kiln_docs::DatabaseError::Exists(database.to_string())).into(),
        );
    }
    if !existed {
        create_database(state, database).await?;
    }
    // Whether the refusal is final (nothing will restore later): then a database
    // made above for the upload goes again.
    let (result, final_refusal) = match upload_body(state, &node, database, body, None).await {
        Err(e) => (Err(e), true),
        Ok(upload) => {
            let command = Command::RestoreDatabase {
                database: database.to_string(),
                at_ms: now_ms(),
                upload_id: upload.upload_id,
                size_bytes: upload.size_bytes,
                hash: upload.hash,
                until,
            };
            match propose(&node, command).await {
                Ok(Answer::Restored { report_json }) => (
                    serde_json::from_str(&report_json)
                        .map_err(|e| ApiError::new(ErrorCode::InternalError, e.to_string())),
                    false,
                ),
                Ok(other) => (Err(answer_error(other)), true),
                Err(e) => (Err(e), false),
            }
        }
    };
    if result.is_err() && final_refusal && !existed {
        if let Err(e) = delete_database(state, database).await {
            tracing::warn!(database, error = %e.message, "the database made for a refused restore stays");
        }
    }
    result
}

/// Defines an index on every node; true when it is new.
pub(crate) async fn define_index(
    state: &AppState,
    database: &str,
    definition: kiln_docs::IndexDefinition,
) -> Result<bool, ApiError> {
    let command = Command::DefineIndex {
        database: database.to_string(),
        definition,
    };
    match propose(node(state)?, command).await? {
        Answer::IndexDefined { created } => Ok(created),
        Answer::Failed(e) => Err(answered_error(e)),
        other => Err(unexpected(&other)),
    }
}

pub(crate) async fn delete_index(
    state: &AppState,
    database: &str,
    name: &str,
) -> Result<(), ApiError> {
    let command = Command::DeleteIndex {
        database: database.to_string(),
        name: name.to_string(),
    };
    match propose(node(state)?, command).await? {
        Answer::IndexDeleted => Ok(()),
        Answer::Failed(e) => Err(answered_error(e)),
        other => Err(unexpected(&other)),
    }
}

/// Sets which collections keep revisions, on every node.
pub(crate) async fn set_revisions_config(
    state: &AppState,
    database: &str,
    config: kiln_docs::RevisionsConfig,
) -> Result<(), ApiError> {
    let command = Command::SetRevisionsConfig {
        database: database.to_string(),
        config,
    };
    match propose(node(state)?, command).await? {
        Answer::RevisionsConfigSet => Ok(()),
        Answer::Failed(e) => Err(answered_error(e)),
        other => Err(unexpected(&other)),
    }
}

/// Purges a document's revisions on every node; how many there were.
pub(crate) async fn purge_revisions(
    state: &AppState,
    database: &str,
    id: &str,
) -> Result<u64, ApiError> {
    let command = Command::PurgeRevisions {
        database: database.to_string(),
        id: id.to_string(),
    };
    match propose(node(state)?, command).await? {
        Answer::RevisionsPurged { count } => Ok(count),
        Answer::Failed(e) => Err(answered_error(e)),
        other => Err(unexpected(&other)),
    }
}

/// The bytes of an attachment in one log entry (base64 in the entry's JSON: about
/// 350 KB). openraft gives an append one heartbeat interval (50 ms at a 200 ms
/// election timeout) to be decoded and made durable by the follower, and sends it
/// again whole when that runs out: with 1 MiB chunks and a few in flight, appends
/// of 4 to 6 MB kept timing out on a loaded machine and an upload failed `no_quorum`.
pub(crate) const UPLOAD_CHUNK_BYTES: usize = 256 << 10;
/// Chunks of one upload proposed and not yet applied, at most: memory stays flat
/// whatever the attachment's size, and the log's appends overlap.
const CHUNKS_IN_FLIGHT: usize = 4;

/// An attachment upload through the log: the request's body in chunks
/// (`Command::AttachmentChunk`, a few in flight), then `Command::PutAttachment`,
/// which every node answers alike (checks the upload's size and SHA-256 and
/// attaches it with the document's new version). Answers as a single server:
/// the document's outcome and the attachment's entry.
pub(crate) async fn put_attachment(
    state: &AppState,
    database: &str,
    target: (String, String, String),
    condition: &Condition,
    body: axum::body::Body,
    cap: Option<u64>,
) -> Result<(PutOutcome, kiln_docs::AttachmentInfo), ApiError> {
    let node = node(state)?.clone();
    let (id, name, content_type) = target;
    let upload = upload_body(state, &node, database, body, cap).await?;
    let command = Command::PutAttachment {
        database: database.to_string(),
        at_ms: now_ms(),
        upload_id: upload.upload_id,
        id,
        name: name.clone(),
        content_type: content_type.clone(),
        size_bytes: upload.size_bytes,
        hash: upload.hash.clone(),
        condition: LoggedCondition::from_condition(condition),
    };
    let out = attachment_outcome(propose(&node, command).await?)?;
    let info = kiln_docs::AttachmentInfo {
        name,
        hash: upload.hash,
        size_bytes: upload.size_bytes,
        content_type,
    };
    Ok((out, info))
}

/// Bytes for a batch (`POST /dbs/{db}/attachments`) through the log: the body
/// in chunks as an attachment upload's, then `Command::StageAttachment`, which
/// every node applies alike (the upload's size and SHA-256 checked, the blob
/// kept until the leader's time plus `STAGED_TTL_MS`). Answers the hash and
/// size, as a single server.
pub(crate) async fn stage_attachment(
    state: &AppState,
    database: &str,
    body: axum::body::Body,
    cap: Option<u64>,
) -> Result<(String, u64), ApiError> {
    let node = node(state)?.clone();
    let upload = upload_body(state, &node, database, body, cap).await?;
    let command = Command::StageAttachment {
        database: database.to_string(),
        at_ms: now_ms(),
        upload_id: upload.upload_id,
        size_bytes: upload.size_bytes,
        hash: upload.hash,
    };
    match propose(&node, command).await? {
        Answer::AttachmentStaged { hash, size_bytes } => Ok((hash, size_bytes)),
        Answer::Failed(e) => Err(answered_error(e)),
        other => Err(unexpected(&other)),
    }
}

/// An upload every node holds once `upload_body` returns.
struct Upload {
    upload_id: u64,
    /// SHA-256 of the bytes, lower-case hex.
    hash: String,
    size_bytes: u64,
}

/// Streams a request's body into the log as `Command::AttachmentChunk`s of a new
/// upload (a few in flight); on failure the upload is dropped (best effort: it
/// expires after `UPLOAD_TTL_MS` anyway).
async fn upload_body(
    state: &AppState,
    node: &Arc<ClusterNode>,
    database: &str,
    body: axum::body::Body,
    cap: Option<u64>,
) -> Result<Upload, ApiError> {
    let mut sender = ChunkSender::new(node, database);
    if let Err(e) = sender.send_body(state, body, cap).await {
        sender.drop_upload();
        return Err(e);
    }
    Ok(sender.finish())
}

/// A new upload being sent: a body's bytes hashed and proposed in chunks.
struct ChunkSender<'a> {
    node: &'a Arc<ClusterNode>,
    database: &'a str,
    upload_id: u64,
    hasher: sha2::Sha256,
    /// The bytes proposed so far: the next chunk's offset.
    size_bytes: u64,
    /// Bytes read, not yet proposed.
    pending: Vec<u8>,
    /// The chunks proposed, oldest first (at most `CHUNKS_IN_FLIGHT`).
    in_flight: std::collections::VecDeque<tokio::task::JoinHandle<Result<Answer, ClusterError>>>,
}

impl<'a> ChunkSender<'a> {
    fn new(node: &'a Arc<ClusterNode>, database: &'a str) -> Self {
        use sha2::Digest;
        ChunkSender {
            node,
            database,
            upload_id: rand::random(),
            hasher: sha2::Sha256::new(),
            size_bytes: 0,
            pending: Vec::with_capacity(UPLOAD_CHUNK_BYTES),
            in_flight: std::collections::VecDeque::new(),
        }
    }

    /// Reads `body` to its end, proposing it in chunks, and waits until every
    /// chunk is written.
    async fn send_body(
        &mut self,
        state: &AppState,
        body: axum::body::Body,
        cap: Option<u64>,
    ) -> Result<(), ApiError> {
        use futures_util::StreamExt;
        use sha2::Digest;
        let mut stream = body.into_data_stream();
        loop {
            let next = stream.next().await;
            let done = next.is_none();
            if let Some(piece) = next {
                let piece = piece.map_err(crate::http_util::body_read_failed)?;
                self.hasher.update(&piece);
                self.pending.extend_from_slice(&piece);
                // `--max-attachment-bytes`, for a body without Content-Length.
                if cap.is_some_and(|c| self.size_bytes + self.pending.len() as u64 > c) {
                    return Err(crate::http_util::attachment_too_large(None, &state.limits));
                }
            }
            while self.pending.len() >= UPLOAD_CHUNK_BYTES || (done && !self.pending.is_empty()) {
                self.send_chunk().await?;
            }
            if done {
                break;
            }
        }
        while !self.in_flight.is_empty() {
            chunk_written(self.in_flight.pop_front()).await?;
        }
        Ok(())
    }

    /// Proposes the next chunk of the pending bytes, once fewer than
    /// `CHUNKS_IN_FLIGHT` are in flight.
    async fn send_chunk(&mut self) -> Result<(), ApiError> {
        let take = self.pending.len().min(UPLOAD_CHUNK_BYTES);
        let bytes: Vec<u8> = self.pending.drain(..take).collect();
        if self.in_flight.len() >= CHUNKS_IN_FLIGHT {
            chunk_written(self.in_flight.pop_front()).await?;
        }
        let at_ms = now_ms();
        let command = Command::AttachmentChunk {
            database: self.database.to_string(),
            at_ms,
            upload_id: self.upload_id,
            offset: self.size_bytes,
            keep_until_ms: at_ms + UPLOAD_TTL_MS,
            bytes,
        };
        // A task of its own: the proposal goes on while the body is read.
        let node = self.node.clone();
        self.in_flight
            .push_back(tokio::spawn(async move { node.write(command).await }));
        self.size_bytes += take as u64;
        Ok(())
    }

    /// Drops the upload once its chunks in flight are done, in a task of its own.
    fn drop_upload(self) {
        // Best effort: an upload left behind expires after UPLOAD_TTL_MS anyway.
        let command = Command::DropUpload {
            database: self.database.to_string(),
            upload_id: self.upload_id,
        };
        let node = self.node.clone();
        let in_flight = self.in_flight;
        tokio::spawn(async move {
            for task in in_flight {
                let _ = task.await;
            }
            let _ = node.write(command).await;
        });
    }

    /// The upload, every chunk of it written.
    fn finish(self) -> Upload {
        use sha2::Digest;
        let hash: String = self
            .hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Upload {
            upload_id: self.upload_id,
            hash,
            size_bytes: self.size_bytes,
        }
    }
}

/// Purges tombstones on every node: the bound is this leader's
/// (`Database::tombstone_purge_bound`: the etag given, its last write, its
/// registered consumers), the age counts back from this leader's time carried
/// in the entry; every node removes the same tombstones
/// (`Database::purge_tombstones_logged`).
pub(crate) async fn purge_tombstones(
    state: &AppState,
    database: &Arc<kiln_docs::Database>,
    before_sequence: Option<u64>,
    older_than_ms: Option<u64>,
) -> Result<kiln_docs::PurgeOutcome, ApiError> {
    let d = database.clone();
    let below_sequence =
        crate::http_util::blocking(move || d.tombstone_purge_bound(before_sequence)).await?;
    let command = Command::PurgeTombstones {
        database: database.name().to_string(),
        incarnation: database.incarnation(),
        at_ms: now_ms(),
        below_sequence,
        older_than_ms,
    };
    match propose(node(state)?, command).await? {
        Answer::TombstonesPurged {
            purged,
            remaining,
            purged_below_sequence,
        } => Ok(kiln_docs::PurgeOutcome {
            purged,
            remaining,
            purged_below_sequence,
        }),
        Answer::Failed(e) => Err(answered_error(e)),
        other => Err(unexpected(&other)),
    }
}

/// How long an upload's file is kept after its last chunk (leader time): an
/// upload whose leader died or whose client went away is removed by the first
/// entry of its database after that.
const UPLOAD_TTL_MS: u64 = kiln_docs::STAGED_TTL_MS;

async fn chunk_written(
    task: Option<tokio::task::JoinHandle<Result<Answer, ClusterError>>>,
) -> Result<(), ApiError> {
    let Some(task) = task else {
        return Ok(());
    };
    let answer = task.await.map_err(|e| {
        ApiError::new(
            ErrorCode::InternalError,
            format!("an upload's proposal failed: {e}"),
        )
    })?;
    match answer.map_err(cluster_error)? {
        Answer::UploadWritten => Ok(()),
        Answer::Failed(e) => Err(answered_error(e)),
        other => Err(unexpected(&other)),
    }
}

/// The document's outcome of an attachment write.
fn attachment_outcome(answer: Answer) -> Result<PutOutcome, ApiError> {
    match answer {
        Answer::Writes(mut answers) if answers.len() == 1 => {
            match outcome(answers.pop().expect("one answer"))?? {
                BatchOutcome::Put(out) => Ok(out),
                BatchOutcome::Delete(_) => Err(ApiError::new(
                    ErrorCode::InternalError,
                    "the cluster answered an attachment write with a delete",
                )),
            }
        }
        Answer::Failed(e) => Err(answered_error(e)),
        other => Err(unexpected(&other)),
    }
}

/// Removes an attachment through the log.
pub(crate) async fn delete_attachment(
    state: &AppState,
    database: &str,
    id: String,
    name: String,
    condition: &Condition,
) -> Result<PutOutcome, ApiError> {
    let command = Command::DeleteAttachment {
        database: database.to_string(),
        at_ms: now_ms(),
        id,
        name,
        condition: LoggedCondition::from_condition(condition),
    };
    attachment_outcome(propose(node(state)?, command).await?)
}

/// Creates a data subscription on every node (checked here first, so that a bad
/// name, query or start is refused before it enters the log).
pub(crate) async fn create_subscription(
    state: &AppState,
    database: &kiln_docs::Database,
    new: NewSubscription,
) -> Result<(), ApiError> {
    let node = node(state)?;
    let start = kiln_docs::SubscriptionStart::parse(&new.start);
    database.check_new_subscription(&new.name, &new.query, &new.parameters, &start)?;
    let command = Command::CreateSubscription {
        database: database.name().to_string(),
        at_ms: now_ms(),
        name: new.name,
        query: new.query,
        parameters: new.parameters,
        start: new.start,
    };
    match propose(node, command).await? {
        Answer::SubscriptionCreated => Ok(()),
        other => Err(answer_error(other)),
    }
}

/// A subscription to create, as the request gave it.
pub(crate) struct NewSubscription {
    pub name: String,
    pub query: String,
    pub parameters: serde_json::Map<String, serde_json::Value>,
    /// `beginning`, `now` or an etag.
    pub start: String,
}

/// Deletes a data subscription on every node (its worker, on the leader, is let go).
pub(crate) async fn delete_subscription(
    state: &AppState,
    database: &str,
    name: &str,
) -> Result<(), ApiError> {
    let command = Command::DeleteSubscription {
        database: database.to_string(),
        name: name.to_string(),
    };
    match propose(node(state)?, command).await? {
        Answer::SubscriptionDeleted => Ok(()),
        other => Err(answer_error(other)),
    }
}

/// Moves a subscription's position to `up_to` on every node (a worker's
/// acknowledgment, proposed by the leader serving it); the position after it.
pub(crate) async fn acknowledge_subscription(
    node: &ClusterNode,
    database: &str,
    name: &str,
    up_to: u64,
) -> Result<u64, ApiError> {
    let command = Command::AcknowledgeSubscription {
        database: database.to_string(),
        at_ms: now_ms(),
        name: name.to_string(),
        up_to,
    };
    match propose(node, command).await? {
        Answer::SubscriptionAcknowledged { position } => Ok(position),
        other => Err(answer_error(other)),
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod redirect_tests {
    use super::*;

    /// The body a client sees: the 307 as `observe` stamps it.
    async fn seen(of: RedirectOf) -> serde_json::Value {
        let resp = redirect_to_leader("http", "10.0.0.2:8080", "/dbs/d/docs/a", of);
        let id = crate::observe::RequestId::from_presented(Some(b"req-307"));
        let resp = crate::app::with_request_id(resp, &id).await;
        assert_eq!(resp.status(), StatusCode::TEMPORARY_REDIRECT);
        let body = axum::body::to_bytes(resp.into_body(), 1 << 16)
            .await
            .unwrap();
        serde_json::from_slice(&body).unwrap()
    }

    #[tokio::test]
    async fn a_redirect_to_the_leader_has_a_request_id_and_says_what_to_send() {
        let write = seen(RedirectOf::Write).await;
        assert_eq!(write["error"], "not_leader");
        assert_eq!(write["request_id"], "req-307", "{write}");
        assert!(
            write["message"]
                .as_str()
                .unwrap()
                .contains("send writes to http://10.0.0.2:8080/dbs/d/docs/a"),
            "{write}"
        );
        let read = seen(RedirectOf::LinearizableRead).await;
        assert_eq!(read["request_id"], "req-307", "{read}");
        let said = read["message"].as_str().unwrap();
        assert!(
            said.contains("linearizable reads") && !said.contains("writes"),
            "{read}"
        );
        let worker = seen(RedirectOf::Worker).await;
        let said = worker["message"].as_str().unwrap();
        assert!(
            said.contains("connect subscription workers to http://10.0.0.2:8080"),
            "{worker}"
        );
    }

    #[test]
    fn only_a_subscriptions_websocket_is_a_worker() {
        assert!(is_subscription_worker(
            &Method::GET,
            "/dbs/shop/subscriptions/s1/ws"
        ));
        assert!(!is_subscription_worker(
            &Method::GET,
            "/dbs/shop/subscriptions/ws"
        ));
        assert!(!is_subscription_worker(
            &Method::GET,
            "/dbs/shop/changes/ws"
        ));
        assert!(!is_subscription_worker(
            &Method::GET,
            "/dbs/subscriptions/changes/ws"
        ));
        assert!(!is_subscription_worker(
            &Method::DELETE,
            "/dbs/shop/subscriptions/ws"
        ));
    }
}
