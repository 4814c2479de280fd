//! `kiln serve`.

use clap::Args;
use kiln_server::{ClusterSettings, Limits, ServerConfig, TlsConfig};
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Args)]
pub struct ServeArgs {
    /// Where the databases live (created if missing).
    #[arg(long, default_value = "./kiln-data")]
    data_dir: PathBuf,
    /// The address to listen on, HOST:PORT (a name such as localhost:8080 is
    /// resolved; port 0 picks a free port). Off loopback, --tls-cert and --auth are
    /// required (or --unsecured).
    #[arg(long, default_value = "127.0.0.1:8080", value_parser = parse_bind)]
    bind: SocketAddr,
    /// PEM certificate chain; with --tls-key, serves HTTPS.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert (PKCS#8, PKCS#1 or SEC1).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// PEM CA certificates: a client certificate signed by one and registered
    /// with `kiln api-key create --certificate` authenticates as its record.
    #[arg(long, requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// Require an API key (or a registered client certificate) on every request;
    /// each has the permissions it was created with.
    #[arg(long)]
    auth: bool,
    /// Append security-relevant events to this file, one JSON line each (failed
    /// authentications, denied requests, key changes, databases created and
    /// deleted, backups, restores, purges, cluster membership).
    #[arg(long)]
    audit_log: Option<PathBuf>,
    /// Rotate the audit log (FILE.1 ... FILE.5) when it would grow past this.
    #[arg(long, default_value_t = kiln_server::audit::DEFAULT_AUDIT_LOG_MAX_BYTES)]
    audit_log_max_bytes: u64,
    /// Listen on a non-loopback address without TLS and authentication anyway.
    #[arg(long)]
    unsecured: bool,
    /// A request body above this many bytes is refused (413 body_too_large) before
    /// it is read.
    #[arg(long, default_value_t = Limits::default().max_body_bytes)]
    max_body_bytes: usize,
    /// An attachment upload above this many bytes is refused (413
    /// attachment_too_large): before its body is read when its Content-Length says
    /// so, else as soon as the streamed body passes it; nothing is kept. 0: no cap.
    #[arg(long, default_value_t = kiln_server::DEFAULT_MAX_ATTACHMENT_BYTES)]
    max_attachment_bytes: u64,
    /// A document above this many bytes of JSON is refused (413 document_too_large).
    #[arg(long, default_value_t = kiln_docs::DocsOptions::default().max_document_bytes)]
    max_document_bytes: usize,
    /// A batch of more operations is refused (413 batch_too_long).
    #[arg(long, default_value_t = kiln_docs::DocsOptions::default().max_batch_ops)]
    max_batch_ops: usize,
    /// An auto index (made by a query) unused for this long is removed; 0: never.
    #[arg(long, default_value_t = kiln_docs::IndexingOptions::default().auto_index_idle_ms)]
    auto_index_idle_ms: u64,
    /// A query that no index narrows reads at most this many documents (400
    /// query_too_expensive beyond).
    #[arg(long, default_value_t = kiln_docs::IndexingOptions::default().max_scan_docs)]
    max_scan_docs: usize,
    /// A document id longer than this many bytes is refused (400 invalid_id).
    #[arg(long, default_value_t = kiln_docs::DocsOptions::default().max_id_bytes)]
    max_id_bytes: usize,
    /// How documents written from now on are stored: lz4 (each document's fields
    /// compressed when that saves bytes) or none. Documents stored either way are
    /// read whatever this says.
    #[arg(long, default_value_t = kiln_docs::DocumentCompression::default())]
    document_compression: kiln_docs::DocumentCompression,
    /// The largest page_size a listing may ask for (400 page_size_too_large).
    #[arg(long, default_value_t = Limits::default().max_page_size)]
    max_page_size: usize,
    /// Open HTTP connections at most; one more gets 429 too_many_connections.
    #[arg(long, default_value_t = Limits::default().max_connections)]
    max_connections: usize,
    /// A request whose head or body stalls this long is answered 408 and closed;
    /// an idle keep-alive connection is closed after it too.
    #[arg(long, default_value_t = Limits::default().request_read_timeout_ms)]
    request_read_timeout_ms: u64,
    /// An idle changes-feed WebSocket gets a heartbeat this often (one shared timer).
    #[arg(long, default_value_t = kiln_server::ChangesConfig::default().heartbeat_ms)]
    changes_heartbeat_ms: u64,
    /// Changes queued toward one WebSocket at most before it is closed as too slow.
    #[arg(long, default_value_t = kiln_server::ChangesConfig::default().subscriber_queue_len)]
    changes_queue_len: usize,
    /// Open changes-feed WebSockets at most (apart from --max-connections).
    #[arg(long, default_value_t = kiln_server::ChangesConfig::default().max_connections)]
    max_changes_connections: usize,
    /// Deletes are remembered in the changes feed (as tombstones) this many hours,
    /// then purged hourly; 0 keeps them until `DELETE /dbs/{db}/tombstones`.
    #[arg(long, default_value_t = 14 * 24)]
    tombstone_retention_hours: u64,
    /// Documents whose `@metadata.@expires` (an RFC 3339 time) has passed are
    /// deleted (with a tombstone, like any delete) by a check this often, so at
    /// most this many ms after they expire; in a cluster the leader checks and
    /// deletes through the log. 0: no check (expired documents stay).
    #[arg(long, default_value_t = kiln_server::DEFAULT_EXPIRATION_CHECK_MS)]
    expiration_check_ms: u64,
    /// Page copies a database may hold for write-back before commits wait (MiB):
    /// the bound on the engine's memory per busy database.
    #[arg(long, default_value_t = kiln_docs::DocsOptions::default().storage.max_unflushed_bytes >> 20)]
    max_unflushed_mib: u64,
    /// The flusher writes pages back in windows of this many MiB of commits
    /// (at most half of --max-unflushed-mib).
    #[arg(long, default_value_t = kiln_docs::DocsOptions::default().storage.write_back_window_bytes >> 20)]
    write_back_window_mib: u64,
    /// Worker threads for the async runtime (default: one per core).
    #[arg(long)]
    worker_threads: Option<usize>,
    /// Threads that turn queued document writes into commits: units in flight at
    /// once (for different databases; one database's writes that arrive while its
    /// unit commits go out together as its next unit).
    #[arg(long, default_value_t = kiln_docs::WriteQueueOptions::default().workers)]
    write_workers: usize,
    /// Serve every request through hyper, document GETs and PUTs included, instead
    /// of the server's own HTTP/1.1 loop for those (to compare the two).
    #[arg(long)]
    hyper_only: bool,
    /// Threads that serve connections, each with a single-threaded async runtime of
    /// its own (default: one per core but one, which is left to the engine's write
    /// and flush threads; at least one); 0 serves them on the shared runtime of
    /// --worker-threads instead.
    #[arg(long)]
    connection_threads: Option<usize>,
    /// Where document GETs are read: auto reads them on the connection thread and
    /// moves them to a pool of blocking threads while reads wait on the disk (data
    /// larger than memory), so one page fault does not stall every connection of
    /// its thread; always and never pin one of the two (to compare them).
    #[arg(long, value_enum, default_value_t = ReadOffloadArg::Auto)]
    read_offload: ReadOffloadArg,
    /// A browser origin allowed to call the API (CORS), e.g.
    /// https://app.example.com; repeat it or separate with commas; `*` allows any
    /// origin without credentials. None: no CORS headers.
    #[arg(long, value_delimiter = ',')]
    cors_origin: Vec<String>,
    /// Log a line per request (method, path, status, bytes, microseconds, request
    /// id, API key id) to stderr, in --log-format.
    #[arg(long)]
    pub access_log: bool,
    /// The format of the log lines on stderr: text, or json (one object per line).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Send traces (OpenTelemetry, OTLP over HTTP with JSON bodies) to this
    /// receiver, e.g. http://localhost:4318 (spans go to <URL>/v1/traces): a span
    /// per request with its admission, write-queue wait, commit, journal write,
    /// Raft round trip and query; a W3C traceparent is continued and the answer
    /// carries traceresponse. Off by default.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// How --otlp-endpoint's spans are encoded: http/protobuf or http/json.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_PROTOCOL",
        default_value = "http/protobuf",
        value_name = "PROTOCOL"
    )]
    pub otlp_protocol: kiln_server::telemetry::OtlpProtocol,
    /// Log (WARN, to stderr) every request that took at least this many
    /// milliseconds: its trace id and each span's start and duration, a query's
    /// plan and cost included.
    #[arg(long, value_name = "MS")]
    pub slow_request_ms: Option<u64>,
    /// This server's id in its cluster (with --cluster).
    #[arg(long, requires = "cluster")]
    node_id: Option<u64>,
    /// Run as a node of a cluster: every voter as ID=HOST:PORT, comma-separated
    /// (e.g. 1=127.0.0.1:8081,2=127.0.0.1:8082,3=127.0.0.1:8083), the same list on
    /// every node; the nodes reach each other at those addresses. Writes go to the
    /// leader (a follower redirects them); GET /cluster shows the cluster.
    #[arg(long, requires = "node_id", value_parser = parse_member, value_delimiter = ',')]
    cluster: Vec<(u64, String)>,
    /// Join a running cluster instead of forming one: --cluster then names this
    /// node only, and `kiln cluster add` on the cluster adds it.
    #[arg(long, requires = "cluster")]
    join: bool,
    /// Raft's election timeout in a cluster, at least (the most is twice this;
    /// heartbeats every quarter of it): how long followers wait for a silent
    /// leader before electing another.
    #[arg(long, default_value_t = 400, requires = "cluster")]
    election_timeout_ms: u64,
    /// A cluster node snapshots its state every this many log entries and
    /// purges the log before the snapshot (keeping up to 1,000 entries below it,
    /// at most this many): a follower further behind catches up from a snapshot.
    #[arg(long, default_value_t = 5_000, requires = "cluster", value_parser = clap::value_parser!(u64).range(1..))]
    snapshot_every_entries: u64,
    /// How long a cluster write waits to be committed by a majority before it is
    /// answered 503 `no_quorum` (it may still be committed later: the answer says
    /// so).
    #[arg(long, default_value_t = 5_000, requires = "cluster", value_parser = clap::value_parser!(u64).range(1..))]
    write_timeout_ms: u64,
    /// A file holding the cluster's shared secret (at least 32 printable
    /// characters, e.g. `openssl rand -hex 32`), the same on every node: every
    /// Raft message carries it and a node refuses one without it. Required with
    /// --auth.
    #[arg(long, requires = "cluster")]
    cluster_key_file: Option<PathBuf>,
    /// PEM CA certificate(s) that signed the other nodes' TLS certificates: with
    /// --tls-cert, the nodes reach each other over https and check each other by it.
    #[arg(long, requires = "cluster")]
    cluster_ca: Option<PathBuf>,
    #[command(flatten)]
    storage: crate::storage_args::StorageArgs,
}

/// The cluster key in `path` (surrounding whitespace and a final newline dropped).
fn read_cluster_key(path: &std::path::Path) -> crate::AnyResult<String> {
    std::fs::read_to_string(path)
        .map(|text| text.trim().to_string())
        .map_err(|e| format!("--cluster-key-file {}: {e}", path.display()).into())
}

/// One `--cluster` member: `ID=HOST:PORT`.
fn parse_member(text: &str) -> Result<(u64, String), String> {
    let (id, address) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?}: give ID=HOST:PORT, e.g. 1=127.0.0.1:8081"))?;
    let id = id
        .trim()
        .parse::<u64>()
        .map_err(|_| format!("{text:?}: the node id must be a number"))?;
    let address = address.trim();
    if address
        .rsplit_once(':')
        .is_none_or(|(_, port)| port.parse::<u16>().is_err())
    {
        return Err(format!("{text:?}: the address must be HOST:PORT"));
    }
    Ok((id, address.to_string()))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ReadOffloadArg {
    Auto,
    Always,
    Never,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

pub fn serve(a: ServeArgs) -> crate::AnyResult<()> {
    let config = server_config(&a)?;
    raise_open_file_limit(a.max_connections + a.max_changes_connections);
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    rt.enable_all()
        // Every write waits for its commit on a blocking thread: allow one per
        // connection.
        .max_blocking_threads(a.max_connections.clamp(16, 4096));
    if let Some(n) = a.worker_threads {
        rt.worker_threads(n);
    }
    let rt = rt.build()?;
    let scheme = if config.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let data_dir = a.data_dir.display().to_string();
    rt.block_on(kiln_server::run_until_signal(config, |server| {
        eprintln!(
            "kiln serving {data_dir} on {scheme}://{} (Ctrl-C to stop)",
            server.local_addr()
        );
    }))?;
    eprintln!("kiln stopped: every database flushed and closed");
    Ok(())
}

/// The server's configuration from the command line.
fn server_config(a: &ServeArgs) -> crate::AnyResult<ServerConfig> {
    let mut config = ServerConfig::new(&a.data_dir, a.bind);
    config.tls = match (a.tls_cert.clone(), a.tls_key.clone()) {
        (Some(cert_chain_pem), Some(private_key_pem)) => Some(TlsConfig {
            cert_chain_pem,
            private_key_pem,
            client_ca_pem: a.tls_client_ca.clone(),
        }),
        _ => None,
    };
    config.require_auth = a.auth;
    config.audit_log = a.audit_log.clone();
    config.audit_log_max_bytes = a.audit_log_max_bytes;
    config.cors_origins = a.cors_origin.clone();
    config.access_log = match (a.access_log, a.log_format) {
        (false, _) => kiln_server::AccessLog::Off,
        (true, LogFormat::Text) => kiln_server::AccessLog::Text,
        (true, LogFormat::Json) => kiln_server::AccessLog::Json,
    };
    config.unsecured = a.unsecured;
    config.own_http1 = !a.hyper_only;
    config.traces = kiln_server::telemetry::Traces {
        exported: a.otlp_endpoint.is_some(),
        slow_request_ms: a.slow_request_ms,
    };
    config.cluster = cluster_settings(a)?;
    if let Some(n) = a.connection_threads {
        config.connection_threads = n;
    }
    config.read_offload = match a.read_offload {
        ReadOffloadArg::Auto => kiln_server::ReadOffload::Auto,
        ReadOffloadArg::Always => kiln_server::ReadOffload::Always,
        ReadOffloadArg::Never => kiln_server::ReadOffload::Never,
    };
    config.limits = Limits {
        max_body_bytes: a.max_body_bytes,
        max_page_size: a.max_page_size,
        max_connections: a.max_connections,
        request_read_timeout_ms: a.request_read_timeout_ms,
        default_page_size: Limits::default().default_page_size.min(a.max_page_size),
        max_attachment_bytes: a.max_attachment_bytes,
    };
    config.docs.max_document_bytes = a.max_document_bytes;
    config.docs.max_batch_ops = a.max_batch_ops;
    config.docs.indexing.auto_index_idle_ms = a.auto_index_idle_ms;
    config.docs.indexing.max_scan_docs = a.max_scan_docs;
    config.docs.max_id_bytes = a.max_id_bytes;
    config.docs.document_compression = a.document_compression;
    config.docs.storage.max_unflushed_bytes = a.max_unflushed_mib << 20;
    config.docs.storage.write_back_window_bytes = a.write_back_window_mib << 20;
    a.storage.apply_to(&mut config.docs.storage)?;
    config.docs.write_queue.workers = a.write_workers.max(1);
    config.changes.heartbeat_ms = a.changes_heartbeat_ms.max(1);
    config.changes.max_connections = a.max_changes_connections;
    config.changes.tombstone_retention_ms =
        (a.tombstone_retention_hours > 0).then(|| a.tombstone_retention_hours * 3_600_000);
    config.changes.subscriber_queue_len = a.changes_queue_len.max(1);
    config.expiration_check_ms = a.expiration_check_ms;
    Ok(config)
}

/// A cluster node's settings, with `--node-id`.
fn cluster_settings(a: &ServeArgs) -> crate::AnyResult<Option<ClusterSettings>> {
    let Some(node_id) = a.node_id else {
        return Ok(None);
    };
    Ok(Some(ClusterSettings {
        node_id,
        members: a.cluster.iter().cloned().collect(),
        joining: a.join,
        election_timeout_ms: a.election_timeout_ms.max(10),
        snapshot_every_entries: a.snapshot_every_entries,
        write_timeout_ms: a.write_timeout_ms,
        cluster_key: a
            .cluster_key_file
            .as_deref()
            .map(read_cluster_key)
            .transpose()?,
        peer_ca_pem: a.cluster_ca.clone(),
    }))
}

/// `--bind`: an address, or a host name and port resolved now (its first IPv4
/// address, else its first address).
fn parse_bind(text: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    if !text.contains(':') {
        return Err(format!("{text:?}: give HOST:PORT, e.g. 127.0.0.1:8080"));
    }
    let addrs: Vec<SocketAddr> = text
        .to_socket_addrs()
        .map_err(|e| format!("{text:?} does not resolve: {e}"))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| format!("{text:?} resolves to no address"))
}

/// `--db shop:read_write`.
/// Each connection is a file descriptor (and each database several): raise the soft
/// limit toward the hard one so that `--max-connections` can actually be reached.
fn raise_open_file_limit(max_connections: usize) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return;
        }
        let wanted = (max_connections as u64 + 1024).min(lim.rlim_max);
        if wanted > lim.rlim_cur {
            lim.rlim_cur = wanted;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                eprintln!("warning: could not raise the open-file limit to {wanted}");
            }
        }
    }
}
