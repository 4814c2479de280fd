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
use serde_json::{json, Map, Value};
use std::collections::VecDeque;
use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, IsTerminal, Read};
use std::net::Shutdown;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

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
    /// The server, e.g. http://127.0.0.1:8080.
    #[arg(long)]
    pub url: String,
    /// The database (created if it does not exist).
    #[arg(long)]
    pub db: String,
    /// API key for a server running with --auth (sent as `Authorization: Bearer`).
    #[arg(long)]
    pub api_key: Option<String>,
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
  over an existing state file without --resume (delete it to start afresh).";

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
// Inputs

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Stream,
    Dir,
    Tar,
    TarGz,
}

struct Input {
    path: PathBuf,
    kind: Kind,
    /// Bytes to read, for the progress bar (None: unknown).
    size: Option<u64>,
}

fn classify(path: &Path) -> Result<Input, ImportError> {
    if path.as_os_str() == "-" {
        return Ok(Input {
            path: path.to_path_buf(),
            kind: Kind::Stream,
            size: None,
        });
    }
    let meta = std::fs::metadata(path).map_err(read_err(path.display()))?;
    let name = path.to_string_lossy().to_ascii_lowercase();
    let (kind, size) = if meta.is_dir() {
        let mut total = 0;
        for f in json_files(path)? {
            total += std::fs::metadata(&f).map(|m| m.len()).unwrap_or(0);
        }
        (Kind::Dir, total)
    } else if name.ends_with(".tar.gz") || name.ends_with(".tgz") {
        (Kind::TarGz, meta.len())
    } else if name.ends_with(".tar") {
        (Kind::Tar, meta.len())
    } else {
        (Kind::Stream, meta.len())
    };
    Ok(Input {
        path: path.to_path_buf(),
        kind,
        size: Some(size),
    })
}

/// The `.json` files under a directory, recursively, in path order.
fn json_files(dir: &Path) -> Result<Vec<PathBuf>, ImportError> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).map_err(read_err(d.display()))? {
            let entry = entry.map_err(read_err(d.display()))?;
            let path = entry.path();
            let ft = entry.file_type().map_err(read_err(path.display()))?;
            if ft.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|e| e == "json") {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Counts the bytes read through it (for the progress bar).
struct Counting<R> {
    inner: R,
    count: Arc<AtomicU64>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// One document read from an input: its raw JSON and, for files, the id its path
/// gives.
struct Record {
    loc: Loc,
    raw: Vec<u8>,
    path_id: Option<String>,
}

enum Flow {
    Go,
    Stop,
}

type Visit<'a> = dyn FnMut(Record) -> Result<Flow, ImportError> + 'a;

/// Calls `f` with each record of input `index`, in order.
fn visit(
    index: usize,
    input: &Input,
    count: &Arc<AtomicU64>,
    f: &mut Visit<'_>,
) -> Result<(), ImportError> {
    let name: Arc<str> = input.path.display().to_string().into();
    let open = |p: &Path| -> Result<Box<dyn Read>, ImportError> {
        let file = File::open(p).map_err(read_err(p.display()))?;
        Ok(Box::new(Counting {
            inner: file,
            count: count.clone(),
        }))
    };
    match input.kind {
        Kind::Stream => {
            let reader: Box<dyn Read> = if input.path.as_os_str() == "-" {
                Box::new(Counting {
                    inner: io::stdin().lock(),
                    count: count.clone(),
                })
            } else {
                open(&input.path)?
            };
            let mut r = BufReader::with_capacity(256 << 10, reader);
            let first = loop {
                let buf = r.fill_buf().map_err(read_err(&name))?;
                match buf.iter().position(|b| !b.is_ascii_whitespace()) {
                    Some(i) => break Some(buf[i]),
                    None if buf.is_empty() => break None,
                    None => {
                        let n = buf.len();
                        r.consume(n)
                    }
                }
            };
            match first {
                None => Ok(()),
                Some(b'[') => visit_array(index, name, r, f),
                Some(_) => visit_ndjson(index, name, r, f),
            }
        }
        Kind::Dir => {
            for file in json_files(&input.path)? {
                let rel = file.strip_prefix(&input.path).unwrap_or(&file);
                let id = id_from_path(&rel.to_string_lossy());
                let mut raw = Vec::new();
                open(&file)?
                    .take(MAX_RECORD_BYTES + 1)
                    .read_to_end(&mut raw)
                    .map_err(read_err(file.display()))?;
                let loc = Loc {
                    input: index,
                    name: file.display().to_string().into(),
                    line: 1,
                };
                if raw.len() as u64 > MAX_RECORD_BYTES {
                    return Err(too_large(&loc));
                }
                if let Flow::Stop = f(Record {
                    loc,
                    raw,
                    path_id: Some(id),
                })? {
                    return Ok(());
                }
            }
            Ok(())
        }
        Kind::Tar | Kind::TarGz => {
            let file = open(&input.path)?;
            let reader: Box<dyn Read> = if input.kind == Kind::TarGz {
                Box::new(flate2::read::GzDecoder::new(BufReader::new(file)))
            } else {
                Box::new(BufReader::new(file))
            };
            let mut archive = tar::Archive::new(reader);
            let entries = archive.entries().map_err(read_err(&name))?;
            for entry in entries {
                let mut entry = entry.map_err(read_err(&name))?;
                if !entry.header().entry_type().is_file() {
                    continue;
                }
                let path = entry
                    .path()
                    .map_err(read_err(&name))?
                    .to_string_lossy()
                    .into_owned();
                if !path.ends_with(".json") {
                    continue;
                }
                let loc = Loc {
                    input: index,
                    name: format!("{name}:{path}").into(),
                    line: 1,
                };
                let mut raw = Vec::new();
                (&mut entry)
                    .take(MAX_RECORD_BYTES + 1)
                    .read_to_end(&mut raw)
                    .map_err(read_err(&loc.name))?;
                if raw.len() as u64 > MAX_RECORD_BYTES {
                    return Err(too_large(&loc));
                }
                if let Flow::Stop = f(Record {
                    loc,
                    raw,
                    path_id: Some(id_from_path(&path)),
                })? {
                    return Ok(());
                }
            }
            Ok(())
        }
    }
}

fn too_large(loc: &Loc) -> ImportError {
    ImportError::Input {
        loc: loc.to_string(),
        why: format!("a document larger than {MAX_RECORD_BYTES} bytes"),
    }
}

/// `./users/ada.json` -> `users/ada` (`\` as `/` too).
fn id_from_path(rel: &str) -> String {
    let p = rel.replace('\\', "/");
    let p = p.trim_start_matches("./").trim_start_matches('/');
    p.strip_suffix(".json").unwrap_or(p).to_string()
}

fn visit_ndjson(
    index: usize,
    name: Arc<str>,
    mut r: impl BufRead,
    f: &mut Visit<'_>,
) -> Result<(), ImportError> {
    let mut line_no = 0u64;
    loop {
        let mut raw = Vec::new();
        let n = (&mut r)
            .take(MAX_RECORD_BYTES + 1)
            .read_until(b'\n', &mut raw)
            .map_err(read_err(&name))?;
        if n == 0 {
            return Ok(());
        }
        line_no += 1;
        let loc = Loc {
            input: index,
            name: name.clone(),
            line: line_no,
        };
        if raw.len() as u64 > MAX_RECORD_BYTES {
            return Err(too_large(&loc));
        }
        if raw.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        if let Flow::Stop = f(Record {
            loc,
            raw,
            path_id: None,
        })? {
            return Ok(());
        }
    }
}

/// Splits a JSON array into its elements as they are read: the bytes of one element
/// at a time (strings and nesting tracked), each parsed on its own.
fn visit_array(
    index: usize,
    name: Arc<str>,
    mut r: impl BufRead,
    f: &mut Visit<'_>,
) -> Result<(), ImportError> {
    let mut s = Scanner {
        r: &mut r,
        line: 1,
        name: name.clone(),
    };
    let bad = |line: u64, why: String| ImportError::Input {
        loc: format!("{name}:{line}"),
        why,
    };
    // The caller saw `[` (after whitespace).
    s.skip_ws()?;
    s.next()?;
    let mut element = 0u64;
    loop {
        s.skip_ws()?;
        match s.peek()? {
            None => return Err(bad(s.line, "the JSON array is not closed".into())),
            Some(b']') if element == 0 => {
                s.next()?;
                break;
            }
            _ => {}
        }
        let start_line = s.line;
        let raw = s.value()?;
        element += 1;
        let loc = Loc {
            input: index,
            name: name.clone(),
            line: start_line,
        };
        if let Flow::Stop = f(Record {
            loc,
            raw,
            path_id: None,
        })? {
            return Ok(());
        }
        s.skip_ws()?;
        match s.next()? {
            Some(b',') => continue,
            Some(b']') => break,
            Some(c) => {
                return Err(bad(
                    s.line,
                    format!(
                        "expected ',' or ']' after array element {element}, found {:?}",
                        c as char
                    ),
                ))
            }
            None => return Err(bad(s.line, "the JSON array is not closed".into())),
        }
    }
    s.skip_ws()?;
    if s.peek()?.is_some() {
        return Err(bad(s.line, "text after the end of the JSON array".into()));
    }
    Ok(())
}

struct Scanner<'a, R> {
    r: &'a mut R,
    line: u64,
    name: Arc<str>,
}

impl<R: BufRead> Scanner<'_, R> {
    fn peek(&mut self) -> Result<Option<u8>, ImportError> {
        let buf = self.r.fill_buf().map_err(read_err(&self.name))?;
        Ok(buf.first().copied())
    }

    fn next(&mut self) -> Result<Option<u8>, ImportError> {
        let b = self.peek()?;
        if let Some(b) = b {
            self.r.consume(1);
            if b == b'\n' {
                self.line += 1;
            }
        }
        Ok(b)
    }

    fn skip_ws(&mut self) -> Result<(), ImportError> {
        while let Some(b) = self.peek()? {
            if !b.is_ascii_whitespace() {
                break;
            }
            self.next()?;
        }
        Ok(())
    }

    /// The bytes of one JSON value (not validated beyond its extent).
    fn value(&mut self) -> Result<Vec<u8>, ImportError> {
        let start = self.line;
        let mut out = Vec::new();
        let mut depth = 0u32;
        let mut in_str = false;
        let mut esc = false;
        loop {
            let Some(b) = self.peek()? else {
                return Err(ImportError::Input {
                    loc: format!("{}:{start}", self.name),
                    why: "the input ends inside an array element".into(),
                });
            };
            if !in_str && depth == 0 && !out.is_empty() {
                let opened_container = matches!(out.first(), Some(b'{') | Some(b'['));
                if opened_container || matches!(b, b',' | b']') || b.is_ascii_whitespace() {
                    return Ok(out);
                }
            }
            self.next()?;
            out.push(b);
            if out.len() as u64 > MAX_RECORD_BYTES {
                return Err(ImportError::Input {
                    loc: format!("{}:{start}", self.name),
                    why: format!("an array element larger than {MAX_RECORD_BYTES} bytes"),
                });
            }
            if in_str {
                if esc {
                    esc = false;
                } else if b == b'\\' {
                    esc = true;
                } else if b == b'"' {
                    in_str = false;
                }
                continue;
            }
            match b {
                b'"' => in_str = true,
                b'{' | b'[' => depth += 1,
                b'}' | b']' => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Records -> bulk lines

struct Ids {
    prefix: Option<String>,
    run: String,
}

impl Ids {
    fn generated(&self, prefix: &str, ordinal: u64) -> String {
        format!("{prefix}{}-{ordinal}", self.run)
    }
}

/// The bulk line `{"id", "document"}` for a record; `ordinal` (1-based, over all
/// inputs) makes generated ids.
fn bulk_line(rec: &Record, ordinal: u64, ids: &Ids) -> Result<Vec<u8>, String> {
    let v: Value = serde_json::from_slice(&rec.raw).map_err(|e| {
        // serde's line is within the record; for NDJSON that is line 1 of it.
        format!("malformed JSON: {e}")
    })?;
    let Value::Object(mut obj) = v else {
        return Err("a document must be a JSON object".into());
    };
    let (id, document) = if let Some(id) = &rec.path_id {
        (id.clone(), obj)
    } else if is_bulk_form(&obj) {
        let id = match obj.remove("id") {
            Some(Value::String(s)) => s,
            _ => return Err("\"id\" must be a string".into()),
        };
        let Some(Value::Object(doc)) = obj.remove("document") else {
            return Err("\"document\" must be a JSON object".into());
        };
        let id = if id.ends_with('/') {
            ids.generated(&id, ordinal)
        } else {
            id
        };
        (id, doc)
    } else {
        let meta = obj.get("@metadata").and_then(Value::as_object);
        let given = meta
            .and_then(|m| m.get("@id"))
            .and_then(Value::as_str)
            .map(str::to_string);
        let id = match given {
            Some(id) => id,
            None => {
                let prefix = match &ids.prefix {
                    Some(p) => p.clone(),
                    None => match meta
                        .and_then(|m| m.get("@collection"))
                        .and_then(Value::as_str)
                    {
                        Some(c) => format!("{c}/"),
                        None => "docs/".to_string(),
                    },
                };
                ids.generated(&prefix, ordinal)
            }
        };
        (id, obj)
    };
    let mut line = serde_json::to_vec(&json!({"id": id, "document": Value::Object(document)}))
        .map_err(|e| format!("cannot serialize: {e}"))?;
    line.push(b'\n');
    Ok(line)
}

/// `{"id": "...", "document": {...}}` and nothing else.
fn is_bulk_form(obj: &Map<String, Value>) -> bool {
    obj.len() == 2 && obj.get("id").is_some_and(Value::is_string) && obj.contains_key("document")
}

// ---------------------------------------------------------------------------
// State file

#[derive(serde::Serialize, serde::Deserialize)]
struct State {
    version: u32,
    db: String,
    run: String,
    inputs: Vec<StateInput>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct StateInput {
    path: String,
    acked: u64,
}

fn state_path(args: &ImportArgs) -> Option<PathBuf> {
    if let Some(p) = &args.state {
        return Some(p.clone());
    }
    let first = args.inputs.first()?;
    if first.as_os_str() == "-" {
        return None;
    }
    let s = first.to_string_lossy();
    let s = s.trim_end_matches('/');
    Some(PathBuf::from(format!("{s}.kiln-import-state")))
}

fn input_key(p: &Path) -> String {
    std::fs::canonicalize(p)
        .unwrap_or_else(|_| p.to_path_buf())
        .display()
        .to_string()
}

fn save_state(path: &Path, state: &State) -> Result<(), ImportError> {
    let tmp = path.with_extension("kiln-import-state.tmp");
    let text = serde_json::to_vec_pretty(state).map_err(|e| ImportError::State(e.to_string()))?;
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| ImportError::State(format!("writing {}: {e}", path.display())))
}

fn load_state(path: &Path, args: &ImportArgs) -> Result<State, ImportError> {
    let text = std::fs::read(path).map_err(|e| {
        ImportError::State(format!(
            "{}: {e} (nothing to resume; run without --resume)",
            path.display()
        ))
    })?;
    let st: State = serde_json::from_slice(&text)
        .map_err(|e| ImportError::State(format!("{}: unreadable: {e}", path.display())))?;
    let keys: Vec<String> = args.inputs.iter().map(|p| input_key(p)).collect();
    let theirs: Vec<&str> = st.inputs.iter().map(|i| i.path.as_str()).collect();
    if st.db != args.db || keys.iter().map(String::as_str).ne(theirs.iter().copied()) {
        return Err(ImportError::State(format!(
            "{} is for database {:?} and inputs {:?}, not this import",
            path.display(),
            st.db,
            theirs
        )));
    }
    Ok(st)
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
            Ok(ExitCode::from(1))
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

fn import(args: &ImportArgs, started: Instant) -> Result<Summary, Failure> {
    let endpoint =
        Endpoint::parse(&args.url, args.api_key.clone()).map_err(|e| Box::new((e.into(), None)))?;
    let inputs: Vec<Input> = args
        .inputs
        .iter()
        .map(|p| classify(p))
        .collect::<Result<_, _>>()
        .map_err(|e| Box::new((e, None)))?;
    if inputs.iter().filter(|i| i.path.as_os_str() == "-").count() > 1 {
        return Err(Box::new((
            ImportError::Other("stdin (`-`) given twice".into()),
            None,
        )));
    }
    let state_file = state_path(args);
    let mut state = match (&state_file, args.resume) {
        (Some(p), true) => load_state(p, args).map_err(|e| Box::new((e, None)))?,
        (None, true) => {
            return Err(Box::new((
                ImportError::State("--resume needs --state FILE when reading stdin".into()),
                None,
            )))
        }
        (Some(p), false) if p.exists() => {
            return Err(Box::new((
                ImportError::State(format!(
                    "{} exists: an earlier import was interrupted; continue it with --resume, or delete the file to start over",
                    p.display()
                )),
                None,
            )))
        }
        _ => State {
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
        },
    };
    let skip: Vec<u64> = state.inputs.iter().map(|i| i.acked).collect();
    let skipped: u64 = skip.iter().sum();
    // Checked before the state file is written: a refused start leaves nothing behind.
    ensure_database(&endpoint, &args.db).map_err(|e| Box::new((e, None)))?;
    if let Some(p) = &state_file {
        save_state(p, &state).map_err(|e| Box::new((e, None)))?;
    }

    let total: Option<u64> = inputs.iter().map(|i| i.size).sum();
    let pb = progress_bar(args.quiet, total);
    let shared = Arc::new(Shared {
        unacked: Mutex::new(VecDeque::new()),
        stop: AtomicBool::new(false),
        bytes_read: Arc::new(AtomicU64::new(0)),
    });
    let ids = Ids {
        prefix: args.id_prefix.clone(),
        run: state.run.clone(),
    };
    let (writer, upload) = endpoint
        .start_upload(&format!("/dbs/{}/bulk", path_escape(&args.db)))
        .map_err(|e| Box::new((e.into(), None)))?;
    let killer = upload
        .shutdown_handle()
        .map_err(|e| Box::new((e.into(), None)))?;
    let sender = {
        let shared = shared.clone();
        let pb = pb.clone();
        let skip = skip.clone();
        std::thread::spawn(move || send_all(inputs, skip, ids, writer, &shared, &pb))
    };

    // Read the acks while the upload goes on.
    let mut acked_run = 0u64;
    let mut last_etag: Option<String> = None;
    let outcome = read_acks(
        upload,
        &shared,
        &mut state,
        state_file.as_deref(),
        &pb,
        started,
        skipped,
        &mut acked_run,
        &mut last_etag,
    );
    // Whatever happened, the sender stops now.
    shared.stop.store(true, Ordering::Relaxed);
    if outcome.is_err() {
        let _ = killer.shutdown(Shutdown::Both);
    }
    let sent = sender
        .join()
        .unwrap_or_else(|_| Err(ImportError::Other("the upload thread panicked".into())));
    pb.finish_and_clear();
    let summary = Summary {
        documents: acked_run,
        skipped,
        bytes: shared.bytes_read.load(Ordering::Relaxed),
        seconds: started.elapsed().as_secs_f64(),
        last_etag,
    };
    // A server error explains a failed send; an input error ends a good upload.
    if let Err(e) = outcome {
        return Err(Box::new((e, Some(summary))));
    }
    if let Err(e) = sent {
        return Err(Box::new((e, Some(summary))));
    }
    if let Some(p) = &state_file {
        let _ = std::fs::remove_file(p);
    }
    Ok(summary)
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

#[allow(clippy::too_many_arguments)]
fn read_acks(
    upload: crate::client::Upload,
    shared: &Shared,
    state: &mut State,
    state_file: Option<&Path>,
    pb: &ProgressBar,
    started: Instant,
    skipped: u64,
    acked_run: &mut u64,
    last_etag: &mut Option<String>,
) -> Result<(), ImportError> {
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
                "the connection to the server failed after {acked_run} documents were acknowledged: {e}"
            ))
        })?;
        if n == 0 {
            return Err(ImportError::Other(format!(
                "the server ended the answer without a final line after {acked_run} acknowledged documents (was it stopped?); --resume continues"
            )));
        }
        if text.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(&text).map_err(|e| {
            ImportError::Other(format!("unreadable answer line {:?}: {e}", text.trim()))
        })?;
        let acked = v.get("acked").and_then(Value::as_u64).unwrap_or(*acked_run);
        if let Some(e) = v.get("last_etag").and_then(Value::as_str) {
            *last_etag = Some(e.to_string());
        }
        // Move what this ack covers from the unacked queue into the state.
        let mut error_loc = None;
        let err_line = v.get("line").and_then(Value::as_u64);
        if let Ok(mut q) = shared.unacked.lock() {
            while q.front().is_some_and(|s| s.line <= acked) {
                if let Some(s) = q.pop_front() {
                    if let Some(si) = state.inputs.get_mut(s.loc.input) {
                        si.acked += 1;
                    }
                }
            }
            if let Some(k) = err_line {
                error_loc = q.iter().find(|s| s.line == k).map(|s| s.loc.to_string());
            }
        }
        *acked_run = acked;
        if let Some(p) = state_file {
            save_state(p, state)?;
        }
        let secs = started.elapsed().as_secs_f64().max(1e-9);
        pb.set_message(format!(
            "{} docs, {:.0} docs/s",
            skipped + acked,
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
        if v.get("done").and_then(Value::as_bool) == Some(true) {
            return Ok(());
        }
    }
}
