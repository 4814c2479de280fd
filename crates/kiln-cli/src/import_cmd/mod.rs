//! `kiln import`: streams documents from NDJSON, JSON arrays, directories and tar
//! archives of `.json` files into a database through `POST /dbs/{db}/bulk`.
//!
//! One thread reads the inputs and writes the chunked upload; the main thread reads
//! the server's acks at the same time (full duplex), records them in a small state
//! file, and draws the progress bar. Memory stays bounded: inputs are read a record
//! at a time (a JSON array is split element by element), and what is kept per
//! document sent but not yet acknowledged is its input position.

use crate::client::{path_escape, ClientError, Endpoint};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::fmt;
use std::io::{self, BufRead, IsTerminal, Read};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

mod bulk_lines;
mod inputs;
mod state;

use bulk_lines::{bulk_line, Ids};
use inputs::{classify, visit, Flow, Input, Record};
use state::{input_key, load_state, save_state, state_path, State, StateInput};

/// The largest document (one NDJSON line, array element or file) read into memory.
const MAX_RECORD_BYTES: u64 = 64 << 20;
/// The upload is sent in HTTP chunks of about this size. Kept small on purpose: the
/// server stops reading when its filling batch holds 8,192 documents, but it parses
/// the whole chunk it has in hand first, so a batch can overshoot by one chunk's
/// lines; past `--max-batch-ops` (10,000) the batch is refused (`batch_too_long`).
/// 16 KiB is at most ~630 of the smallest possible lines.
const CHUNK_BYTES: usize = 16 << 10;

#[derive(clap::Args)]
#[command(after_long_help = IMPORT_HELP)]
pub struct ImportArgs {
    #[command(flatten)]
    pub server: crate::client::ServerArgs,
    /// The database (created if it does not exist).
    #[arg(long)]
    pub db: String,
    /// Prefix of generated ids for documents without one (default: the document's
    /// `@metadata.@collection` + `/`, else `docs/`).
    #[arg(long)]
    pub id_prefix: Option<String>,
    /// Continue an interrupted import from its state file.
    #[arg(long)]
    pub resume: bool,
    /// The state file (default: `<first input>.kiln-import-state`).
    #[arg(long)]
    pub state: Option<PathBuf>,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
    /// Print the summary as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// A directory of attachment blobs (files named by their SHA-256) to upload
    /// before the documents, besides each input's `<input>.attachments/` (where
    /// `kiln export --out F` puts them).
    #[arg(long)]
    pub attachments_dir: Option<PathBuf>,
    /// NDJSON or JSON-array files, directories or .tar / .tar.gz / .tgz archives of
    /// .json files; `-` reads NDJSON or a JSON array from stdin.
    #[arg(required = true)]
    pub inputs: Vec<PathBuf>,
}

const IMPORT_HELP: &str = "\
Inputs:
  NDJSON: one JSON object per line. A JSON array: one object per element (read as a
  stream, never whole). A directory or .tar/.tar.gz of .json files: one document per
  file, its id the path without `.json` (users/ada.json -> users/ada).

Ids:
  A line/element that is exactly {\"id\": ..., \"document\": {...}} is used as is (the
  form `kiln export` writes). Otherwise the object is the document: its id is its
  @metadata.@id if present, else generated. Generated ids are made by this command,
  not the server: <prefix><run>-<n>, where <run> is random per import (kept in the
  state file) and n the document's position in the inputs; a bulk line whose id ends
  in `/` gets the same treatment. So a resumed import resends the same ids.

Resume:
  While it runs, import keeps a state file (--state, default
  <first input>.kiln-import-state) with how many documents of each input the server
  acknowledged, updated after each ack (write + rename). After an interruption (a
  crash, Ctrl-C, a bad line fixed since) `--resume` skips those and continues. The
  batch that was in flight is sent again: its ids are given or generated
  deterministically, so a resend rewrites the same documents and duplicates nothing.
  The state file is removed when the import completes; an import refuses to start
  over an existing state file without --resume (delete it to start afresh).

Attachments:
  Documents may name attachments (@metadata.@attachments, by SHA-256). Their bytes
  are read from <input>.attachments/<sha256> (what `kiln export --out F` writes) and
  from --attachments-dir, uploaded (each checked against its hash) before the
  documents: the server keeps them an hour for the documents that name them.";

/// Where a record came from: input file (or archive entry) and line.
#[derive(Clone, Debug)]
struct Loc {
    input: usize,
    name: Arc<str>,
    line: u64,
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.name, self.line)
    }
}

#[derive(Debug)]
pub enum ImportError {
    /// A bad record in an input.
    Input {
        loc: String,
        why: String,
    },
    /// Reading an input failed.
    Read {
        what: String,
        source: io::Error,
    },
    /// The server refused a line of the upload.
    Server {
        loc: Option<String>,
        code: String,
        message: String,
    },
    Client(ClientError),
    State(String),
    Other(String),
}

impl fmt::Display for ImportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ImportError::Input { loc, why } => write!(f, "{loc}: {why}"),
            ImportError::Read { what, source } => write!(f, "{what}: {source}"),
            ImportError::Server { loc, code, message } => match loc {
                Some(l) => write!(f, "{l}: the server refused it: {code}: {message}"),
                None => write!(f, "the server stopped the import: {code}: {message}"),
            },
            ImportError::Client(e) => write!(f, "{e}"),
            ImportError::State(m) => write!(f, "state file: {m}"),
            ImportError::Other(m) => write!(f, "{m}"),
        }
    }
}

impl std::error::Error for ImportError {}

impl From<ClientError> for ImportError {
    fn from(e: ClientError) -> Self {
        ImportError::Client(e)
    }
}

fn read_err(what: impl fmt::Display) -> impl FnOnce(io::Error) -> ImportError {
    let what = what.to_string();
    move |source| ImportError::Read { what, source }
}

// ---------------------------------------------------------------------------
// The run

/// A document sent and not yet acknowledged: its line in the upload and where it
/// came from.
struct Sent {
    line: u64,
    loc: Loc,
}

struct Shared {
    unacked: Mutex<VecDeque<Sent>>,
    stop: AtomicBool,
    bytes_read: Arc<AtomicU64>,
}

impl Shared {
    fn new() -> Self {
        Shared {
            unacked: Mutex::new(VecDeque::new()),
            stop: AtomicBool::new(false),
            bytes_read: Arc::new(AtomicU64::new(0)),
        }
    }
}

pub fn run(args: ImportArgs) -> crate::AnyResult<ExitCode> {
    let started = Instant::now();
    match import(&args, started) {
        Ok(summary) => {
            if args.json {
                println!("{}", summary.to_json());
            } else if !args.quiet {
                eprintln!("{}", summary.text());
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(failure) => {
            let (e, summary) = *failure;
            eprintln!("error: {e}");
            if let Some(s) = summary {
                if args.json {
                    println!("{}", s.to_json());
                }
                eprintln!("{} (then stopped)", s.text());
            }
            let code = match &e {
                ImportError::Client(c) => crate::exit::for_client(c),
                ImportError::Server { .. } => crate::exit::REFUSED,
                _ => crate::exit::FAILED,
            };
            Ok(ExitCode::from(code))
        }
    }
}

struct Summary {
    documents: u64,
    skipped: u64,
    bytes: u64,
    seconds: f64,
    last_etag: Option<String>,
}

impl Summary {
    fn rate(&self) -> f64 {
        if self.seconds > 0.0 {
            self.documents as f64 / self.seconds
        } else {
            0.0
        }
    }

    fn to_json(&self) -> Value {
        json!({
            "documents": self.documents,
            "skipped": self.skipped,
            "bytes": self.bytes,
            "seconds": self.seconds,
            "docs_per_sec": self.rate(),
            "last_etag": self.last_etag,
        })
    }

    fn text(&self) -> String {
        let mut s = format!(
            "imported {} documents ({:.1} MB read) in {:.2} s, {:.0} docs/s",
            self.documents,
            self.bytes as f64 / 1e6,
            self.seconds,
            self.rate()
        );
        if self.skipped > 0 {
            s.push_str(&format!(
                "; skipped {} already imported (--resume)",
                self.skipped
            ));
        }
        if let Some(e) = &self.last_etag {
            s.push_str(&format!("; last etag {e}"));
        }
        s
    }
}

type Failure = Box<(ImportError, Option<Summary>)>;

/// A failure before the upload started: nothing was imported, no summary to print.
fn failed_before_upload(e: ImportError) -> Failure {
    Box::new((e, None))
}

fn import(args: &ImportArgs, started: Instant) -> Result<Summary, Failure> {
    let Prepared {
        endpoint,
        inputs,
        state_file,
        mut state,
    } = prepare(args).map_err(failed_before_upload)?;
    let skip: Vec<u64> = state.inputs.iter().map(|i| i.acked).collect();
    let skipped: u64 = skip.iter().sum();
    let total: Option<u64> = inputs.iter().map(|i| i.size).sum();
    let pb = progress_bar(args.quiet, total);
    let shared = Arc::new(Shared::new());
    let ids = Ids {
        prefix: args.id_prefix.clone(),
        run: state.run.clone(),
    };
    let (writer, upload) = endpoint
        .start_upload(&format!("/dbs/{}/bulk", path_escape(&args.db)))
        .map_err(|e| failed_before_upload(e.into()))?;
    let killer = upload.shutdown_handle();
    let sender = {
        let shared = shared.clone();
        let pb = pb.clone();
        let skip = skip.clone();
        std::thread::spawn(move || send_all(inputs, skip, ids, writer, &shared, &pb))
    };

    // Read the acks while the upload goes on.
    let mut acks = AckReader {
        shared: &shared,
        state: &mut state,
        state_file: state_file.as_deref(),
        pb: &pb,
        started,
        skipped,
        acked_run: 0,
        last_etag: None,
    };
    let outcome = acks.read_all(upload);
    // Whatever happened, the sender stops now.
    shared.stop.store(true, Ordering::Relaxed);
    if outcome.is_err() {
        killer.shutdown();
    }
    let sent = sender
        .join()
        .unwrap_or_else(|_| Err(ImportError::Other("the upload thread panicked".into())));
    pb.finish_and_clear();
    let summary = Summary {
        documents: acks.acked_run,
        skipped,
        bytes: shared.bytes_read.load(Ordering::Relaxed),
        seconds: started.elapsed().as_secs_f64(),
        last_etag: acks.last_etag,
    };
    // A server error explains a failed send; an input error ends a good upload.
    if let Err(e) = outcome.and(sent) {
        return Err(Box::new((e, Some(summary))));
    }
    if let Some(p) = &state_file {
        let _ = std::fs::remove_file(p);
    }
    Ok(summary)
}

/// What the upload starts from, once every check that can refuse the import has
/// passed.
struct Prepared {
    endpoint: Endpoint,
    inputs: Vec<Input>,
    state_file: Option<PathBuf>,
    state: State,
}

/// The checks before the upload (the inputs, the state file, the database), then
/// the state file written.
fn prepare(args: &ImportArgs) -> Result<Prepared, ImportError> {
    let endpoint = args.server.endpoint()?;
    let inputs = classify_inputs(&args.inputs)?;
    let state_file = state_path(args);
    let state = initial_state(args, state_file.as_deref())?;
    // Checked before the state file is written: a refused start leaves nothing behind.
    ensure_database(&endpoint, &args.db)?;
    upload_attachments(args, &endpoint)?;
    if let Some(p) = &state_file {
        save_state(p, &state)?;
    }
    Ok(Prepared {
        endpoint,
        inputs,
        state_file,
        state,
    })
}

/// Uploads the attachments' blobs of the inputs' `<input>.attachments/` and of
/// `--attachments-dir` (before the documents that name them).
fn upload_attachments(args: &ImportArgs, endpoint: &Endpoint) -> Result<u64, ImportError> {
    let mut dirs: Vec<PathBuf> = args
        .inputs
        .iter()
        .filter(|p| p.as_os_str() != "-")
        .map(|p| crate::backup_blobs::sidecar(p))
        .collect();
    if let Some(d) = &args.attachments_dir {
        if !d.is_dir() {
            return Err(ImportError::Other(format!(
                "--attachments-dir {}: not a directory",
                d.display()
            )));
        }
        dirs.push(d.clone());
    }
    let other = |e: Box<dyn std::error::Error>| ImportError::Other(e.to_string());
    let blobs = crate::backup_blobs::blobs_in(&dirs).map_err(other)?;
    crate::backup_blobs::upload_blobs(endpoint, &args.db, blobs).map_err(other)
}

/// Every input's kind and size; stdin can be read only once.
fn classify_inputs(paths: &[PathBuf]) -> Result<Vec<Input>, ImportError> {
    let inputs: Vec<Input> = paths
        .iter()
        .map(|p| classify(p))
        .collect::<Result<_, _>>()?;
    if inputs.iter().filter(|i| i.path.as_os_str() == "-").count() > 1 {
        return Err(ImportError::Other("stdin (`-`) given twice".into()));
    }
    Ok(inputs)
}

/// The state to start from: the state file's with `--resume`, else a fresh one (with
/// this run's random part of generated ids). Without `--resume`, an existing state
/// file is refused rather than overwritten: it holds an interrupted import's progress.
fn initial_state(args: &ImportArgs, state_file: Option<&Path>) -> Result<State, ImportError> {
    match (state_file, args.resume) {
        (Some(p), true) => load_state(p, args),
        (None, true) => Err(ImportError::State(
            "--resume needs --state FILE when reading stdin".into(),
        )),
        (Some(p), false) if p.exists() => Err(ImportError::State(format!(
            "{} exists: an earlier import was interrupted; continue it with --resume, or delete the file to start over",
            p.display()
        ))),
        _ => Ok(State {
            version: 1,
            db: args.db.clone(),
            run: format!("{:08x}", rand::random::<u32>()),
            inputs: args
                .inputs
                .iter()
                .map(|p| StateInput {
                    path: input_key(p),
                    acked: 0,
                })
                .collect(),
        }),
    }
}

fn ensure_database(endpoint: &Endpoint, db: &str) -> Result<(), ImportError> {
    let path = format!("/dbs/{}", path_escape(db));
    let (status, body) = endpoint.request_any("GET", &path, b"")?;
    match status {
        200 => Ok(()),
        404 => {
            let (status, body) = endpoint.request_any("PUT", &path, b"")?;
            if status == 201 || status == 409 {
                Ok(())
            } else {
                Err(ClientError::Status {
                    status,
                    body: String::from_utf8_lossy(&body).into_owned(),
                }
                .into())
            }
        }
        _ => Err(ClientError::Status {
            status,
            body: String::from_utf8_lossy(&body).into_owned(),
        }
        .into()),
    }
}

pub fn progress_bar(quiet: bool, total: Option<u64>) -> ProgressBar {
    if quiet || !io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let pb = match total {
        Some(t) => ProgressBar::with_draw_target(Some(t), ProgressDrawTarget::stderr()),
        None => ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()),
    };
    let template = if total.is_some() {
        "{bar:30} {bytes}/{total_bytes} {msg} ETA {eta}"
    } else {
        "{spinner} {bytes} {msg} {elapsed}"
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        pb.set_style(style);
    }
    pb.enable_steady_tick(std::time::Duration::from_millis(200));
    pb
}

/// The upload thread: reads every input, skips what an earlier run got acked, and
/// sends the rest as bulk lines. On a bad record it ends the upload cleanly (the
/// documents before it are committed) and returns the record's error.
fn send_all(
    inputs: Vec<Input>,
    skip: Vec<u64>,
    ids: Ids,
    mut writer: crate::client::ChunkedWriter,
    shared: &Shared,
    pb: &ProgressBar,
) -> Result<(), ImportError> {
    let mut buf: Vec<u8> = Vec::with_capacity(CHUNK_BYTES + (64 << 10));
    let mut ordinal = 0u64;
    let mut line = 0u64;
    let mut last_flush = Instant::now();
    let io_fail = |e: io::Error| ImportError::Read {
        what: "sending the upload".into(),
        source: e,
    };
    let mut result = Ok(());
    for (i, input) in inputs.iter().enumerate() {
        let mut seen = 0u64;
        let r = visit(i, input, &shared.bytes_read, &mut |rec: Record| {
            if shared.stop.load(Ordering::Relaxed) {
                return Ok(Flow::Stop);
            }
            ordinal += 1;
            seen += 1;
            if seen <= skip[i] {
                return Ok(Flow::Go);
            }
            let bulk = bulk_line(&rec, ordinal, &ids).map_err(|why| ImportError::Input {
                loc: rec.loc.to_string(),
                why,
            })?;
            line += 1;
            if let Ok(mut q) = shared.unacked.lock() {
                q.push_back(Sent { line, loc: rec.loc });
            }
            buf.extend_from_slice(&bulk);
            if buf.len() >= CHUNK_BYTES || last_flush.elapsed().as_millis() >= 200 {
                writer.chunk(&buf).map_err(io_fail)?;
                buf.clear();
                last_flush = Instant::now();
            }
            pb.set_position(shared.bytes_read.load(Ordering::Relaxed));
            Ok(Flow::Go)
        });
        if let Err(e) = r {
            result = Err(e);
            break;
        }
    }
    if shared.stop.load(Ordering::Relaxed) {
        return result;
    }
    // Send what is ready and end the body, also after a bad record: what came
    // before it is committed, and --resume continues at it.
    writer.chunk(&buf).map_err(io_fail)?;
    writer.finish().map_err(io_fail)?;
    result
}

/// The main thread's side of the upload: reads the server's acks, moves what they
/// cover from the unacked queue into the state (and its file), and tells progress.
struct AckReader<'a> {
    shared: &'a Shared,
    state: &'a mut State,
    state_file: Option<&'a Path>,
    pb: &'a ProgressBar,
    started: Instant,
    /// Acknowledged by earlier runs (`--resume`): counted in the progress message.
    skipped: u64,
    /// Acknowledged in this run so far.
    acked_run: u64,
    last_etag: Option<String>,
}

impl AckReader<'_> {
    /// Every ack line until the server's final one (`done`), or its error.
    fn read_all(&mut self, upload: crate::client::Upload) -> Result<(), ImportError> {
        let mut resp = upload.response()?;
        if resp.status != 200 {
            let mut body = String::new();
            let _ = resp.body.read_to_string(&mut body);
            return Err(ClientError::Status {
                status: resp.status,
                body,
            }
            .into());
        }
        let mut text = String::new();
        loop {
            text.clear();
            let n = resp.body.read_line(&mut text).map_err(|e| {
                ImportError::Other(format!(
                    "the connection to the server failed after {} documents were acknowledged: {e}",
                    self.acked_run
                ))
            })?;
            if n == 0 {
                return Err(ImportError::Other(format!(
                    "the server ended the answer without a final line after {} acknowledged documents (was it stopped?); --resume continues",
                    self.acked_run
                )));
            }
            if text.trim().is_empty() {
                continue;
            }
            let v: Value = serde_json::from_str(&text).map_err(|e| {
                ImportError::Other(format!("unreadable answer line {:?}: {e}", text.trim()))
            })?;
            if self.record(&v)? {
                return Ok(());
            }
        }
    }

    /// One ack line: its count into the state file and the progress message; then
    /// the server's error (placed at its input line), or whether it is the last.
    fn record(&mut self, v: &Value) -> Result<bool, ImportError> {
        let acked = v
            .get("acked")
            .and_then(Value::as_u64)
            .unwrap_or(self.acked_run);
        if let Some(e) = v.get("last_etag").and_then(Value::as_str) {
            self.last_etag = Some(e.to_string());
        }
        let error_loc = self.move_acked_into_state(acked, v.get("line").and_then(Value::as_u64));
        self.acked_run = acked;
        if let Some(p) = self.state_file {
            save_state(p, self.state)?;
        }
        let secs = self.started.elapsed().as_secs_f64().max(1e-9);
        self.pb.set_message(format!(
            "{} docs, {:.0} docs/s",
            self.skipped + acked,
            acked as f64 / secs
        ));
        if let Some(code) = v.get("error") {
            return Err(ImportError::Server {
                loc: error_loc,
                code: code.as_str().unwrap_or("error").to_string(),
                message: v
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
            });
        }
        Ok(v.get("done").and_then(Value::as_bool) == Some(true))
    }

    /// Moves the documents up to upload line `acked` from the unacked queue into
    /// their inputs' counts; returns where upload line `error_line` came from, so
    /// that a refusal names its input and line rather than the upload's.
    fn move_acked_into_state(&mut self, acked: u64, error_line: Option<u64>) -> Option<String> {
        let mut error_loc = None;
        if let Ok(mut q) = self.shared.unacked.lock() {
            while q.front().is_some_and(|s| s.line <= acked) {
                if let Some(s) = q.pop_front() {
                    if let Some(si) = self.state.inputs.get_mut(s.loc.input) {
                        si.acked += 1;
                    }
                }
            }
            if let Some(k) = error_line {
                error_loc = q.iter().find(|s| s.line == k).map(|s| s.loc.to_string());
            }
        }
        error_loc
    }
}
