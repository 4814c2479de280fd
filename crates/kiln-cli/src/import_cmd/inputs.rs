//! Reading the inputs: files, standard input, directories and tar archives of
//! `.json` files, one record (an NDJSON line, an array element, a file) at a time.

use super::{read_err, ImportError, Loc, MAX_RECORD_BYTES};
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Stream,
    Dir,
    Tar,
    TarGz,
}

pub(super) struct Input {
    pub(super) path: PathBuf,
    kind: Kind,
    /// Bytes to read, for the progress bar (None: unknown).
    pub(super) size: Option<u64>,
}

pub(super) fn classify(path: &Path) -> Result<Input, ImportError> {
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
pub(super) struct Record {
    pub(super) loc: Loc,
    pub(super) raw: Vec<u8>,
    pub(super) path_id: Option<String>,
}

pub(super) enum Flow {
    Go,
    Stop,
}

type Visit<'a> = dyn FnMut(Record) -> Result<Flow, ImportError> + 'a;

/// Calls `f` with each record of input `index`, in order.
pub(super) fn visit(
    index: usize,
    input: &Input,
    count: &Arc<AtomicU64>,
    f: &mut Visit<'_>,
) -> Result<(), ImportError> {
    match input.kind {
        Kind::Stream => visit_stream(index, input, count, f),
        Kind::Dir => visit_dir(index, input, count, f),
        Kind::Tar | Kind::TarGz => visit_tar(index, input, count, f),
    }
}

/// The input's name in errors and record locations.
fn input_name(input: &Input) -> Arc<str> {
    input.path.display().to_string().into()
}

/// A file opened for reading, its bytes counted into `count`.
fn open_counted(p: &Path, count: &Arc<AtomicU64>) -> Result<Box<dyn Read>, ImportError> {
    let file = File::open(p).map_err(read_err(p.display()))?;
    Ok(Box::new(Counting {
        inner: file,
        count: count.clone(),
    }))
}

/// A file or stdin of NDJSON or one JSON array, told apart by its first byte that
/// is not whitespace.
fn visit_stream(
    index: usize,
    input: &Input,
    count: &Arc<AtomicU64>,
    f: &mut Visit<'_>,
) -> Result<(), ImportError> {
    let name = input_name(input);
    let reader: Box<dyn Read> = if input.path.as_os_str() == "-" {
        Box::new(Counting {
            inner: io::stdin().lock(),
            count: count.clone(),
        })
    } else {
        open_counted(&input.path, count)?
    };
    let mut r = BufReader::with_capacity(256 << 10, reader);
    match first_non_whitespace(&mut r, &name)? {
        None => Ok(()),
        Some(b'[') => visit_array(index, name, r, f),
        Some(_) => visit_ndjson(index, name, r, f),
    }
}

/// The first byte that is not whitespace, left unread (None: there is none).
fn first_non_whitespace(r: &mut impl BufRead, name: &str) -> Result<Option<u8>, ImportError> {
    loop {
        let buf = r.fill_buf().map_err(read_err(name))?;
        match buf.iter().position(|b| !b.is_ascii_whitespace()) {
            Some(i) => return Ok(Some(buf[i])),
            None if buf.is_empty() => return Ok(None),
            None => {
                let n = buf.len();
                r.consume(n)
            }
        }
    }
}

/// A directory: each `.json` file under it is a document, its id the file's path
/// under the directory.
fn visit_dir(
    index: usize,
    input: &Input,
    count: &Arc<AtomicU64>,
    f: &mut Visit<'_>,
) -> Result<(), ImportError> {
    for file in json_files(&input.path)? {
        let rel = file.strip_prefix(&input.path).unwrap_or(&file);
        let id = id_from_path(&rel.to_string_lossy());
        let reader = open_counted(&file, count)?;
        let loc = Loc {
            input: index,
            name: file.display().to_string().into(),
            line: 1,
        };
        let raw = read_whole_record(reader, &loc)?;
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

/// A tar archive (gzipped or not): each `.json` file in it is a document, its id
/// the file's path in the archive. Read as a stream, never unpacked.
fn visit_tar(
    index: usize,
    input: &Input,
    count: &Arc<AtomicU64>,
    f: &mut Visit<'_>,
) -> Result<(), ImportError> {
    let name = input_name(input);
    let file = open_counted(&input.path, count)?;
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
        let raw = read_whole_record(&mut entry, &loc)?;
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

/// All of a one-document file or archive entry, refused past MAX_RECORD_BYTES
/// (one byte more is read to tell).
fn read_whole_record(r: impl Read, loc: &Loc) -> Result<Vec<u8>, ImportError> {
    let mut raw = Vec::new();
    r.take(MAX_RECORD_BYTES + 1)
        .read_to_end(&mut raw)
        .map_err(read_err(&loc.name))?;
    if raw.len() as u64 > MAX_RECORD_BYTES {
        return Err(too_large(loc));
    }
    Ok(raw)
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
