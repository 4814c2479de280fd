//! Databases, stats, metrics and health.

use crate::auth::Caller;
use crate::error::ApiError;
use crate::http_util::{blocking, json_value, ApiPath};
use crate::query_params::{NoParams, Params};
use crate::state::SharedState;
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// 200 `{"status": "ok"}`; 200 `{"status": "degraded", "waiting_for_space": [...]}`
/// while a database's write-back waits for disk space (it resumes by itself); 503
/// `{"status": "needs_restart", "needs_restart": [...]}` once a database latched after
/// a failed write (it refuses writes until the server restarts). Each entry names the
/// database and the failure's kind (`disk_full`, `io_error`, `internal_error`); the
/// details (file, operation) are in the log and in the answers to writes.
pub async fn health(_: NoParams, State(state): State<SharedState>) -> Response {
    let kind = |f: &kiln_storage::Failure| match f.kind() {
        kiln_storage::FailureKind::DiskFull => "disk_full",
        kiln_storage::FailureKind::Io => "io_error",
        _ => "internal_error",
    };
    let mut latched = Vec::new();
    let mut waiting = Vec::new();
    for db in state.store.databases() {
        if let Some(f) = db.failure() {
            latched.push(json!({"database": db.name(), "kind": kind(&f)}));
        } else if let Some(f) = db.write_back_stalled() {
            waiting.push(json!({"database": db.name(), "kind": kind(&f)}));
        }
    }
    if !latched.is_empty() {
        let mut body = json!({"status": "needs_restart", "needs_restart": latched});
        if !waiting.is_empty() {
            body["waiting_for_space"] = waiting.into();
        }
        return json_value(StatusCode::SERVICE_UNAVAILABLE, body);
    }
    if !waiting.is_empty() {
        return json_value(
            StatusCode::OK,
            json!({"status": "degraded", "waiting_for_space": waiting}),
        );
    }
    json_value(StatusCode::OK, json!({"status": "ok"}))
}

pub async fn metrics(_: NoParams, State(state): State<SharedState>) -> Response {
    let text = state.metrics.render(&state.store);
    let mut r = (StatusCode::OK, text).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(crate::metrics::CONTENT_TYPE),
    );
    r
}

/// The databases the caller may read (all of them without authentication).
pub async fn list_databases(
    _: NoParams,
    State(state): State<SharedState>,
    caller: Option<axum::Extension<Caller>>,
) -> Response {
    let mut names = state.store.database_names();
    if let Some(axum::Extension(caller)) = caller {
        names.retain(|db| caller.clearance.access_to(db).is_some());
    }
    json_value(StatusCode::OK, json!({"databases": names}))
}

/// Who the request comes from and what it may do: the studio and the clients
/// show only what the caller may use.
pub async fn whoami(_: NoParams, caller: Option<axum::Extension<Caller>>) -> Response {
    let body = match caller {
        Some(axum::Extension(c)) => json!({
            "authenticated": true,
            "key_id": c.id,
            "name": c.name,
            "kind": if c.certificate_sha256.is_some() { "certificate" } else { "key" },
            "clearance": c.clearance,
        }),
        // Without authentication every caller may do everything.
        None => json!({
            "authenticated": false,
            "clearance": crate::access::Clearance::Operator,
        }),
    };
    json_value(StatusCode::OK, body)
}

pub async fn create_database(
    _: NoParams,
    State(state): State<SharedState>,
    ApiPath(db): ApiPath<String>,
) -> Result<Response, ApiError> {
    if state.cluster.is_some() {
        crate::routes::cluster::create_database(&state, &db).await?;
    } else {
        let store = state.store.clone();
        let name = db.clone();
        blocking(move || store.create_database(&name).map(|_| ())).await?;
    }
    let mut r = json_value(StatusCode::CREATED, json!({"name": db}));
    if let Ok(v) = HeaderValue::from_str(&format!("/dbs/{db}")) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    Ok(r)
}

pub async fn delete_database(
    _: NoParams,
    State(state): State<SharedState>,
    ApiPath(db): ApiPath<String>,
) -> Result<Response, ApiError> {
    // Its changes connections end first: they hold the database open.
    state.hubs.remove(&db);
    if state.cluster.is_some() {
        crate::routes::cluster::delete_database(&state, &db).await?;
    } else {
        let store = state.store.clone();
        let name = db.clone();
        blocking(move || store.delete_database(&name)).await?;
    }
    Ok(json_value(StatusCode::OK, json!({"deleted": db})))
}

pub async fn database_stats(
    _: NoParams,
    State(state): State<SharedState>,
    ApiPath(db): ApiPath<String>,
) -> Result<Response, ApiError> {
    let database = state.store.database(&db)?;
    let s = database.stats()?;
    let e = &s.engine;
    Ok(json_value(
        StatusCode::OK,
        json!({
            "name": s.name,
            "documents": s.documents,
            "last_etag": s.last_etag.map(|e| e.to_string()),
            "collections": s.collections.iter().map(|c| json!({"name": c.name, "documents": c.documents})).collect::<Vec<_>>(),
            "backup_chain": s.backup_chain,
            "encrypted": s.encryption_key_fingerprint.is_some(),
            "encryption_key_fingerprint": s.encryption_key_fingerprint,
            "engine": {
                "last_txn_id": e.last_txn_id,
                "synced_txn_id": e.synced_txn_id,
                "commits": e.commits,
                "journal_writes": e.journal_writes,
                "journal_bytes": e.journal_bytes,
                "journal_write_p50_us": e.journal_write_latency.p50_us,
                "journal_write_p99_us": e.journal_write_latency.p99_us,
                "journal_direct_io": e.journal_direct_io,
                "commit_groups": e.commit_queue.groups,
                "commit_units": e.commit_queue.units_committed,
                "avg_group_units": e.commit_queue.avg_group_units(),
                "write_buffer_bytes": e.write_buffer_bytes,
                "write_buffer_freezes": e.write_buffer_freezes,
                "write_buffer_merges": e.write_buffer_merges,
                "write_buffer_keys_merged_ahead": e.write_buffer_keys_merged_ahead,
                "batches_read_ahead": e.batches_read_ahead,
                "data_syncs": e.data_syncs,
                "data_file_bytes": e.data_file_bytes,
                "pages_in_use": e.pages_in_use,
                "pages_free": e.pages_free,
            }
        }),
    ))
}

/// `GET /stats`: the server's and every database's figures as JSON, for dashboards
/// such as the studio's Live page. Counters are totals since start (a client takes
/// differences for rates); latencies are the engine's running p50/p99.
/// `documents_written` is the database's last etag sequence: every put and delete
/// takes one.
pub async fn server_stats(_: NoParams, State(state): State<SharedState>) -> Response {
    let m = &state.metrics;
    let dbs: Vec<_> = state
        .store
        .databases()
        .iter()
        .map(|db| {
            let e = db.env().stats();
            json!({
                "name": db.name(),
                "documents": db.document_count().unwrap_or(0),
                "documents_written": db.last_sequence(),
                "data_file_bytes": e.data_file_bytes,
                "commits": e.commits,
                "commit_groups": e.commit_queue.groups,
                "commit_units": e.commit_queue.units_committed,
                "journal_writes": e.journal_writes,
                "journal_bytes": e.journal_bytes,
                "journal_write_p50_us": e.journal_write_latency.p50_us,
                "journal_write_p99_us": e.journal_write_latency.p99_us,
                "data_syncs": e.data_syncs,
                "data_sync_p99_us": e.data_sync_latency.p99_us,
                "pages_written_back": e.pages_written_back,
                "pages_unflushed": e.pages_unflushed,
                "readers_open": e.readers_open,
            })
        })
        .collect();
    json_value(
        StatusCode::OK,
        json!({
            "uptime_seconds": m.uptime().as_secs(),
            "connections_open": m.connections_open.get(),
            "connections_total": m.connections_total.get(),
            "ws_connections_open": m.ws_connections_open.get(),
            "http_requests_by_status": m.requests_by_status_class(),
            "resident_memory_bytes": crate::metrics::resident_memory_bytes(),
            "databases": dbs,
        }),
    )
}

fn tombstone_json(db: &kiln_docs::Database, t: &kiln_docs::TombstoneStats) -> serde_json::Value {
    json!({
        "tombstones": t.count,
        "oldest_etag": t.oldest.map(|e| e.to_string()),
        "oldest_at": t.oldest_at_ms.map(kiln_docs::format_rfc3339_ms),
        "consumers": t.consumers.iter().map(|(name, seq)| json!({"name": name, "etag": db.etag_at(*seq).to_string()})).collect::<Vec<_>>(),
    })
}

/// `GET /dbs/{db}/tombstones`: how many deletes the change log still remembers.
pub async fn tombstones(
    _: NoParams,
    State(state): State<SharedState>,
    ApiPath(db): ApiPath<String>,
) -> Result<Response, ApiError> {
    let database = state.store.database(&db)?;
    let d = database.clone();
    let stats = blocking(move || d.tombstone_stats()).await?;
    Ok(json_value(
        StatusCode::OK,
        tombstone_json(&database, &stats),
    ))
}

#[derive(serde::Deserialize)]
pub struct PurgeQuery {
    before: Option<String>,
    older_than_ms: Option<u64>,
}

/// `DELETE /dbs/{db}/tombstones?before=<etag>&older_than_ms=N`: forgets deletes
/// below the etag and older than the age, never one a registered consumer has not
/// read yet. With neither, every tombstone the consumers allow.
///
/// In a cluster the purge is a log entry (`routes/cluster.rs`), so every node
/// forgets the same deletes: the age counts back from the leader's time carried
/// in the entry, never a node's clock. Consumer positions are each node's own
/// (its indexes advance with its own indexer, its backup chain with its own
/// backups), so they cannot decide a replicated purge: the bound is the
/// leader's (the etag given, its last write, its consumers) and every node
/// purges below it; each node's indexes first read the change log up to that
/// bound (an index still behind after 30 s is rebuilt from the documents, which
/// needs no tombstone), and a backup chain reads its own history, which a purge
/// does not touch. The answer is a single server's: the counts of the entry,
/// the tombstone figures of the node that answers.
pub async fn purge_tombstones(
    State(state): State<SharedState>,
    ApiPath(db): ApiPath<String>,
    Params(q): Params<PurgeQuery>,
) -> Result<Response, ApiError> {
    let database = state.store.database(&db)?;
    let before_sequence = q
        .before
        .as_deref()
        .map(|e| database.sequence_of(e))
        .transpose()?;
    let (out, stats) = if state.cluster.is_some() {
        let out = crate::routes::cluster::purge_tombstones(
            &state,
            &database,
            before_sequence,
            q.older_than_ms,
        )
        .await?;
        let d = database.clone();
        (out, blocking(move || d.tombstone_stats()).await?)
    } else {
        let rule = kiln_docs::PurgeRule {
            before_sequence,
            older_than_ms: q.older_than_ms,
        };
        let d = database.clone();
        blocking(move || Ok((d.purge_tombstones(rule)?, d.tombstone_stats()?))).await?
    };
    let mut v = tombstone_json(&database, &stats);
    v["purged"] = out.purged.into();
    v["purged_below_etag"] = database
        .etag_at(out.purged_below_sequence)
        .to_string()
        .into();
    Ok(json_value(StatusCode::OK, v))
}
