//! `kiln export`: writes a database as NDJSON bulk lines `{"id", "document"}`, the
//! form `kiln import` (and `POST /dbs/{db}/bulk`) reads back.
//!
//! Consistency: export reads the changes feed (`GET /dbs/{db}/changes?include_docs=
//! true`) in etag order, page by page, up to the database's last etag when the export
//! started. Each page is one snapshot, the whole export is not: while writes go on,
//! every document that existed at the start and is not deleted before its page is
//! read is exported, at its version at the start or a later one; a document written
//! during the export may or may not be in it, and may appear twice (an older version,
//! then the newer one later in the file: importing applies them in order, so the
//! newer wins); a delete during the export is not reflected if the document was
//! already written out. With no writes during the export, it is exactly the
//! database's documents.
//!
//! Attachments: the documents keep `@metadata.@attachments` (names, hashes, sizes,
//! types); the bytes go into a directory of blob files named by their SHA-256,
//! `<out>.attachments/<sha256>` beside an export to a file (the layout of the old
//! backups' sidecar), or `--attachments-dir D` (which also lets an export to stdout
//! carry them). Each blob is fetched (`GET /dbs/{db}/attachments/{hash}`) as the
//! first document naming it is written, once per export. `kiln import` uploads the
//! blobs of `<input>.attachments/` (or its `--attachments-dir`) before the
//! documents. An export to stdout without `--attachments-dir` carries the
//! documents only, and says how many blobs it left out.

use crate::client::{path_escape, query_escape, ClientError, Endpoint};
use serde_json::{json, Value};
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// `@metadata` keys the server sets on every write; the others (`@collection` and a
/// client's own keys) are kept so that an import gives the same documents.
const SERVER_KEYS: [&str; 3] = ["@id", "@etag", "@last-modified"];

#[derive(clap::Args)]
pub struct ExportArgs {
    #[command(flatten)]
    pub server: crate::client::ServerArgs,
    /// The database.
    #[arg(long)]
    pub db: String,
    /// Where to write the NDJSON (`-`: stdout).
    #[arg(long, default_value = "-")]
    pub out: PathBuf,
    /// Documents per request to the changes feed (at most the server's
    /// --max-page-size).
    #[arg(long, default_value_t = 1000)]
    pub page_size: usize,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
    /// Where the attachments' bytes go, one file per SHA-256 (default: beside an
    /// export to a file, `<out>.attachments/`; none for stdout).
    #[arg(long)]
    pub attachments_dir: Option<PathBuf>,
    /// Print the summary as JSON (on stderr when the export goes to stdout).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug)]
enum ExportError {
    Client(ClientError),
    Write { what: String, source: io::Error },
    Answer(String),
}

impl std::fmt::Display for ExportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExportError::Client(e) => write!(f, "{e}"),
            ExportError::Write { what, source } => write!(f, "writing {what}: {source}"),
            ExportError::Answer(m) => write!(f, "unexpected answer from the server: {m}"),
        }
    }
}

impl From<ClientError> for ExportError {
    fn from(e: ClientError) -> Self {
        ExportError::Client(e)
    }
}

struct Summary {
    documents: u64,
    /// Attachments' blobs written beside, their bytes, and those left out (no
    /// directory for them).
    blobs: u64,
    blob_bytes: u64,
    blobs_left_out: u64,
    bytes: u64,
    seconds: f64,
    last_etag: Option<String>,
}

pub fn run(args: ExportArgs) -> crate::AnyResult<ExitCode> {
    let started = Instant::now();
    let to_stdout = args.out.as_os_str() == "-";
    match export(&args, started) {
        Ok(s) => {
            let rate = if s.seconds > 0.0 {
                s.documents as f64 / s.seconds
            } else {
                0.0
            };
            if args.json {
                let v = json!({"documents": s.documents, "bytes": s.bytes, "seconds": s.seconds, "docs_per_sec": rate, "last_etag": s.last_etag, "attachment_blobs": s.blobs, "attachment_bytes": s.blob_bytes, "attachment_blobs_left_out": s.blobs_left_out});
                if to_stdout {
                    eprintln!("{v}");
                } else {
                    println!("{v}");
                }
            } else if !args.quiet {
                eprintln!(
                    "exported {} documents ({:.1} MB) in {:.2} s, {:.0} docs/s{}{}",
                    s.documents,
                    s.bytes as f64 / 1e6,
                    s.seconds,
                    rate,
                    s.last_etag
                        .as_ref()
                        .map(|e| format!("; up to etag {e}"))
                        .unwrap_or_default(),
                    if s.blobs > 0 {
                        format!(
                            "; {} attachment blobs ({:.1} MB)",
                            s.blobs,
                            s.blob_bytes as f64 / 1e6
                        )
                    } else {
                        String::new()
                    }
                );
            }
            if s.blobs_left_out > 0 {
                eprintln!(
                    "note: {} attachment blobs named by the documents were not exported \
                     (give --attachments-dir D to export them with an export to stdout)",
                    s.blobs_left_out
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("error: {e}");
            let code = match &e {
                ExportError::Client(c) => crate::exit::for_client(c),
                _ => crate::exit::FAILED,
            };
            Ok(ExitCode::from(code))
        }
    }
}

/// The sequence part of an etag `<sequence>-<incarnation>`.
fn sequence(etag: &str) -> Option<u64> {
    etag.split('-').next()?.parse().ok()
}

fn export(args: &ExportArgs, started: Instant) -> Result<Summary, ExportError> {
    let endpoint = args.server.endpoint()?;
    let db = path_escape(&args.db);
    let at_start = database_at_start(&endpoint, &db)?;
    let mut out = Output::open(&args.out)?;
    let pb = export_progress_bar(args.quiet, at_start.documents);
    let mut blobs = Blobs::new(args);
    let mut summary = Summary {
        documents: 0,
        blobs: 0,
        blob_bytes: 0,
        blobs_left_out: 0,
        bytes: 0,
        seconds: 0.0,
        last_etag: at_start.last_etag.clone(),
    };
    let end = at_start
        .last_etag
        .as_deref()
        .and_then(sequence)
        .unwrap_or(0);
    let mut since = String::new();
    loop {
        if end == 0 {
            // An empty database: nothing to export.
            break;
        }
        let page = changes_page(&endpoint, &db, args.page_size, &since)?;
        let results = page
            .get("results")
            .and_then(Value::as_array)
            .ok_or_else(|| ExportError::Answer("a changes page without results".into()))?;
        for change in results {
            let Some(line) = export_line(change)? else {
                continue;
            };
            blobs.export(&endpoint, &db, change, &mut summary)?;
            out.write_all(&line)?;
            summary.documents += 1;
            summary.bytes += line.len() as u64;
            pb.inc(1);
        }
        let next = page
            .get("last_etag")
            .and_then(Value::as_str)
            .ok_or_else(|| ExportError::Answer("a changes page without last_etag".into()))?
            .to_string();
        let reached = sequence(&next).unwrap_or(0);
        // Past the start's last etag, or a page that moved nothing: done.
        if reached >= end || (next == since && results.is_empty()) {
            break;
        }
        since = next;
    }
    out.flush()?;
    pb.finish_and_clear();
    summary.seconds = started.elapsed().as_secs_f64();
    Ok(summary)
}

/// The attachments' blobs of an export: the directory they go to (none: they are
/// left out, and counted), and those exported so far (each once).
struct Blobs {
    dir: Option<PathBuf>,
    seen: std::collections::HashSet<String>,
}

impl Blobs {
    fn new(args: &ExportArgs) -> Blobs {
        let dir = match (&args.attachments_dir, to_stdout(&args.out)) {
            (Some(d), _) => Some(d.clone()),
            (None, false) => Some(crate::backup_blobs::sidecar(&args.out)),
            (None, true) => None,
        };
        Blobs {
            dir,
            seen: Default::default(),
        }
    }

    /// Exports the blobs `change`'s document names that no earlier one did.
    fn export(
        &mut self,
        endpoint: &Endpoint,
        db: &str,
        change: &Value,
        summary: &mut Summary,
    ) -> Result<(), ExportError> {
        for hash in attachment_hashes(change) {
            if !self.seen.insert(hash.clone()) {
                continue;
            }
            match &self.dir {
                Some(dir) => {
                    let path = format!("/dbs/{db}/attachments/{hash}");
                    let mut resp = endpoint.get_stream(&path)?;
                    let n = crate::backup_blobs::save(dir, &hash, &mut resp.body)
                        .map_err(|e| ExportError::Answer(format!("attachment {hash}: {e}")))?;
                    summary.blobs += 1;
                    summary.blob_bytes += n;
                }
                None => summary.blobs_left_out += 1,
            }
        }
        Ok(())
    }
}

/// The database when the export starts: its document count (for the progress bar)
/// and its last etag, where the export stops.
struct AtStart {
    documents: Option<u64>,
    last_etag: Option<String>,
}

fn database_at_start(endpoint: &Endpoint, db: &str) -> Result<AtStart, ExportError> {
    let stats: Value =
        serde_json::from_slice(&endpoint.request("GET", &format!("/dbs/{db}"), b"")?)
            .map_err(|e| ExportError::Answer(format!("database stats: {e}")))?;
    Ok(AtStart {
        documents: stats.get("documents").and_then(Value::as_u64),
        last_etag: stats
            .get("last_etag")
            .and_then(Value::as_str)
            .map(str::to_string),
    })
}

/// Where the NDJSON goes (stdout or a file), buffered; its errors name it.
struct Output {
    out: BufWriter<Box<dyn Write>>,
    what: String,
}

impl Output {
    fn open(path: &Path) -> Result<Output, ExportError> {
        let what = path.display().to_string();
        let out: Box<dyn Write> = if path.as_os_str() == "-" {
            Box::new(io::stdout().lock())
        } else {
            Box::new(File::create(path).map_err(|source| ExportError::Write {
                what: what.clone(),
                source,
            })?)
        };
        Ok(Output {
            out: BufWriter::with_capacity(256 << 10, out),
            what,
        })
    }

    fn write_all(&mut self, bytes: &[u8]) -> Result<(), ExportError> {
        self.out.write_all(bytes).map_err(|e| self.error(e))
    }

    fn flush(&mut self) -> Result<(), ExportError> {
        self.out.flush().map_err(|e| self.error(e))
    }

    fn error(&self, source: io::Error) -> ExportError {
        ExportError::Write {
            what: self.what.clone(),
            source,
        }
    }
}

/// Import's progress bar, counting documents rather than bytes when the total is
/// known.
fn export_progress_bar(quiet: bool, total: Option<u64>) -> indicatif::ProgressBar {
    let pb = crate::import_cmd::progress_bar(quiet, total);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{bar:30} {pos}/{len} docs {per_sec} {msg} ETA {eta}",
    ) {
        if total.is_some() {
            pb.set_style(style);
        }
    }
    pb
}

/// One page of the changes feed after etag `since` (from the start if empty), with
/// the documents.
fn changes_page(
    endpoint: &Endpoint,
    db: &str,
    page_size: usize,
    since: &str,
) -> Result<Value, ExportError> {
    let path = format!(
        "/dbs/{db}/changes?include_docs=true&limit={page_size}&since={}",
        query_escape(since)
    );
    serde_json::from_slice(&endpoint.request("GET", &path, b"")?)
        .map_err(|e| ExportError::Answer(format!("changes page: {e}")))
}

fn to_stdout(out: &Path) -> bool {
    out.as_os_str() == "-"
}

/// The hashes a change's document lists in `@metadata.@attachments`.
fn attachment_hashes(change: &Value) -> Vec<String> {
    change
        .pointer("/document/@metadata/@attachments")
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .filter_map(|a| a.get("hash").and_then(Value::as_str))
                .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// A change's bulk line `{"id", "document"}` and its newline; None for a change
/// that is not a put (a delete: nothing to write).
fn export_line(change: &Value) -> Result<Option<Vec<u8>>, ExportError> {
    if change.get("change").and_then(Value::as_str) != Some("put") {
        return Ok(None);
    }
    let id = change
        .get("id")
        .and_then(Value::as_str)
        .ok_or_else(|| ExportError::Answer("a change without an id".into()))?;
    let Some(Value::Object(doc)) = change.get("document") else {
        let why = change
            .get("document_error")
            .and_then(Value::as_str)
            .unwrap_or("no document");
        return Err(ExportError::Answer(format!("document {id:?}: {why}")));
    };
    let mut doc = doc.clone();
    // The server sets these again on import; the rest of `@metadata` is the
    // document's own.
    if let Some(Value::Object(meta)) = doc.get_mut("@metadata") {
        for k in SERVER_KEYS {
            meta.shift_remove(k);
        }
        if meta.is_empty() {
            doc.shift_remove("@metadata");
        }
    }
    let mut line = serde_json::to_vec(&json!({"id": id, "document": Value::Object(doc)}))
        .map_err(|e| ExportError::Answer(format!("document {id:?}: {e}")))?;
    line.push(b'\n');
    Ok(Some(line))
}
