//! The documentation's commands, checked against the `kiln` binary just built, so that
//! the docs cannot drift from the code. The convention (docs/testing.md, "How the
//! documentation is tested"):
//!
//! - a ```` ```sh ```` block is run: the `sh` blocks of one file form one bash script,
//!   run in a fresh temporary directory against a fresh `kiln serve` on a free port
//!   (`localhost:8080` and `127.0.0.1:8080` are replaced by its address); every command
//!   must succeed, `curl` fails on an HTTP error. A `kiln serve` line is not run (the
//!   test's server stands in for it) but parse-checked as below.
//! - a ```` ```sh no-run ```` block is parse-checked: each `kiln ...` line (and the
//!   `kiln` part of `cargo run ... --bin kiln -- ...`) is given to the real argument
//!   parser with a probe flag appended; the parser must reach the probe, so every
//!   subcommand, flag and value before it was accepted.
//! - in any other block, and in inline code, a `kiln ...` line must name existing
//!   subcommands and only flags that its `--help` lists.
//!
//! Also: `kiln --help` and every subcommand's help must name no file that is missing
//! from the repository.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const KILN: &str = env!("CARGO_BIN_EXE_kiln");
/// Appended to a parse-checked command: clap must report it as the unexpected argument.
const PROBE: &str = "--docs-test-probe";
/// How long one file's script may run.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long one parse check may run (it fails before doing anything, or it is a bug).
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Files the help text names that are not in the repository, known and reported
/// (none today: the help names docs/benchmarks.md). Remove an entry once the help
/// stops naming it: the test fails on an entry it no longer finds, so that this list
/// stays true.
const KNOWN_MISSING_IN_HELP: &[&str] = &[];

/// The documentation: README.md, docs/*.md, the client's and the studio's READMEs.
fn doc_files() -> Vec<PathBuf> {
    let root = repo_root();
    let mut files = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/ exists")
        .map(|e| e.expect("readable docs/").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files.push(root.join("clients/python/README.md"));
    files.push(root.join("studio/README.md"));
    files
}

/// Files whose inline code is history: what they name was true when written.
fn inline_code_is_history(file: &Path) -> bool {
    file.ends_with("docs/benchmarks-history.md")
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn rel(file: &Path) -> String {
    file.strip_prefix(repo_root())
        .unwrap_or(file)
        .display()
        .to_string()
}

// ---------------------------------------------------------------------------------
// Markdown

/// A fenced code block: its info string ("sh", "sh no-run", "text", ...) and lines.
struct Block {
    info: String,
    /// (1-based line number in the file, the line)
    lines: Vec<(usize, String)>,
}

impl Block {
    fn language(&self) -> &str {
        self.info.split_whitespace().next().unwrap_or("")
    }
    fn is_run(&self) -> bool {
        self.language() == "sh" && !self.is_no_run()
    }
    fn is_no_run(&self) -> bool {
        self.language() == "sh" && self.info.split_whitespace().any(|w| w == "no-run")
    }
}

/// The fenced blocks of a Markdown text, and the text outside them (fenced lines
/// blanked, so that line numbers stay).
fn parse_markdown(text: &str) -> (Vec<Block>, String) {
    let mut blocks = Vec::new();
    let mut outside = String::new();
    let mut open: Option<(usize, Block)> = None; // (fence length, block)
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let ticks = trimmed.chars().take_while(|&c| c == '`').count();
        match &mut open {
            None if ticks >= 3 && !trimmed[ticks..].contains('`') => {
                let info = trimmed[ticks..].trim().to_string();
                open = Some((
                    ticks,
                    Block {
                        info,
                        lines: Vec::new(),
                    },
                ));
                outside.push('\n');
            }
            None => {
                outside.push_str(line);
                outside.push('\n');
            }
            Some((fence, block)) => {
                outside.push('\n');
                if !(ticks >= *fence && trimmed[ticks..].trim().is_empty()) {
                    block.lines.push((i + 1, line.to_string()));
                    continue;
                }
                if let Some((_, block)) = open.take() {
                    blocks.push(block);
                }
            }
        }
    }
    if let Some((_, block)) = open {
        blocks.push(block);
    }
    (blocks, outside)
}

/// Inline code spans of `text` (outside fenced blocks): (line number, content with
/// line breaks made spaces).
fn inline_spans(text: &str) -> Vec<(usize, String)> {
    let bytes = text.as_bytes();
    let mut spans = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'`' {
            i += 1;
            continue;
        }
        let run = bytes[i..].iter().take_while(|&&b| b == b'`').count();
        let start = i + run;
        // The closing run: exactly `run` backticks.
        let mut j = start;
        let mut close = None;
        while j < bytes.len() {
            if bytes[j] == b'`' {
                let r = bytes[j..].iter().take_while(|&&b| b == b'`').count();
                if r == run {
                    close = Some(j);
                    break;
                }
                j += r;
            } else if bytes[j] == b'\n' && bytes.get(j + 1) == Some(&b'\n') {
                break; // a span does not cross a paragraph
            } else {
                j += 1;
            }
        }
        match close {
            Some(end) => {
                let line = text[..i].matches('\n').count() + 1;
                let content = text[start..end].replace('\n', " ");
                spans.push((line, content.trim().to_string()));
                i = end + run;
            }
            None => i = start,
        }
    }
    spans
}

// ---------------------------------------------------------------------------------
// Shell words

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Word(String),
    /// `|`, `||`, `&&`, `;`, `&`, redirections
    Op(String),
}

/// Splits a shell command line into words and operators: quotes, backslashes and
/// comments as the shell reads them (no expansions). `None` if a quote is open.
fn shell_split(s: &str) -> Option<Vec<Tok>> {
    let mut toks = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut chars = s.chars().peekable();
    let flush = |cur: &mut String, in_word: &mut bool, toks: &mut Vec<Tok>| {
        if *in_word {
            toks.push(Tok::Word(std::mem::take(cur)));
            *in_word = false;
        }
    };
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(x) => cur.push(x),
                        None => return None,
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(x @ ('"' | '\\' | '$' | '`')) => cur.push(x),
                            Some('\n') => {}
                            Some(x) => {
                                cur.push('\\');
                                cur.push(x);
                            }
                            None => return None,
                        },
                        Some(x) => cur.push(x),
                        None => return None,
                    }
                }
            }
            '\\' => match chars.next() {
                Some('\n') => {}
                Some(x) => {
                    in_word = true;
                    cur.push(x);
                }
                None => {}
            },
            '#' if !in_word => {
                // A comment runs to the end of the line.
                for x in chars.by_ref() {
                    if x == '\n' {
                        break;
                    }
                }
            }
            ' ' | '\t' | '\n' => flush(&mut cur, &mut in_word, &mut toks),
            '|' | '&' | ';' | '<' | '>' => {
                // A redirection's fd (2>) belongs to the operator.
                let fd = in_word && cur.chars().all(|d| d.is_ascii_digit());
                if fd {
                    cur.clear();
                    in_word = false;
                } else {
                    flush(&mut cur, &mut in_word, &mut toks);
                }
                let mut op = c.to_string();
                while let Some(&n) = chars.peek() {
                    if matches!(n, '|' | '&' | '>' | '<') {
                        op.push(n);
                        chars.next();
                    } else {
                        break;
                    }
                }
                toks.push(Tok::Op(op));
            }
            x => {
                in_word = true;
                cur.push(x);
            }
        }
    }
    flush(&mut cur, &mut in_word, &mut toks);
    Some(toks)
}

/// A command of a shell block: where it starts and its lines as written.
struct ShellCommand {
    line: usize,
    text: String,
    toks: Vec<Tok>,
}

/// The commands of a block: lines joined where a quote is open, a line ends with a
/// backslash, or with an operator that needs more (`|`, `&&`, `||`).
fn shell_commands(block: &Block) -> Vec<ShellCommand> {
    let mut out = Vec::new();
    let mut buf = String::new();
    let mut first = 0;
    for (n, line) in &block.lines {
        if buf.is_empty() {
            if line.trim().is_empty() {
                continue;
            }
            first = *n;
        } else {
            buf.push('\n');
        }
        buf.push_str(line);
        let continued_by_backslash = line.trim_end().ends_with('\\') && {
            // not a backslash inside a comment
            shell_split(line).is_some()
        };
        match shell_split(&buf) {
            None => continue, // a quote is open
            Some(toks) => {
                let dangling = matches!(toks.last(), Some(Tok::Op(op)) if op == "|" || op == "&&" || op == "||");
                if continued_by_backslash || dangling {
                    continue;
                }
                if !toks.is_empty() {
                    out.push(ShellCommand {
                        line: first,
                        text: std::mem::take(&mut buf),
                        toks,
                    });
                }
                buf.clear();
            }
        }
    }
    if !buf.trim().is_empty() {
        out.push(ShellCommand {
            line: first,
            toks: shell_split(&buf).unwrap_or_default(),
            text: buf,
        });
    }
    out
}

/// The simple commands of a command line (split at `|`, `&&`, `||`, `;`, `&`), each
/// without its redirections and leading `VAR=value` assignments.
fn simple_commands(toks: &[Tok]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut cur: Vec<String> = Vec::new();
    let mut skip_next = false;
    for t in toks {
        match t {
            Tok::Op(op) if op.contains('>') || op.contains('<') => skip_next = true,
            Tok::Op(_) => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
            Tok::Word(w) => {
                if skip_next {
                    skip_next = false;
                } else if cur.is_empty() && is_assignment(w) {
                } else {
                    cur.push(w.clone());
                }
            }
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

fn is_assignment(w: &str) -> bool {
    match w.split_once('=') {
        Some((name, _)) => {
            !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        }
        None => false,
    }
}

/// The arguments `kiln` gets from a simple command: `kiln ARGS` or
/// `cargo run ... --bin kiln ... -- ARGS`.
fn kiln_args(words: &[String]) -> Option<Vec<String>> {
    let first = words.first()?;
    if first == "kiln" || first.ends_with("/kiln") {
        return Some(words[1..].to_vec());
    }
    if first == "cargo" && words.get(1).map(String::as_str) == Some("run") {
        let bin_kiln = words.windows(2).any(|w| w[0] == "--bin" && w[1] == "kiln")
            || words.iter().any(|w| w == "--bin=kiln");
        let sep = words.iter().position(|w| w == "--")?;
        if bin_kiln {
            return Some(words[sep + 1..].to_vec());
        }
    }
    None
}

// ---------------------------------------------------------------------------------
// The CLI's help

#[derive(Default, Clone)]
struct Help {
    subcommands: BTreeSet<String>,
    flags: BTreeSet<String>,
    /// The long flags that take a value (`--data-dir <DATA_DIR>`).
    value_flags: BTreeSet<String>,
    text: String,
}

/// `kiln <path> --help`, parsed and cached.
fn help(path: &[String]) -> Result<Help, String> {
    static CACHE: Mutex<BTreeMap<Vec<String>, Help>> = Mutex::new(BTreeMap::new());
    if let Some(h) = CACHE.lock().unwrap().get(path) {
        return Ok(h.clone());
    }
    let out = Command::new(KILN)
        .args(path)
        .arg("--help")
        .output()
        .map_err(|e| format!("running {KILN}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "`kiln {} --help` failed: {}",
            path.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let mut h = Help {
        text: text.clone(),
        ..Help::default()
    };
    let mut section = "";
    for line in text.lines() {
        if !line.starts_with(' ') && line.ends_with(':') {
            section = line;
            continue;
        }
        let t = line.trim_start();
        match section {
            "Commands:" if line.starts_with("  ") => {
                if let Some(name) = t.split_whitespace().next() {
                    if name != "help" {
                        h.subcommands.insert(name.to_string());
                    }
                }
            }
            "Options:" if t.starts_with('-') => {
                let mut last = None;
                for w in t.split(|c: char| c.is_whitespace() || c == ',') {
                    if w.is_empty() {
                        continue;
                    }
                    if !w.starts_with('-') {
                        if w.starts_with('<') {
                            if let Some(flag) = last.take() {
                                h.value_flags.insert(flag);
                            }
                        }
                        break;
                    }
                    h.flags.insert(w.to_string());
                    last = Some(w.to_string());
                }
            }
            _ => {}
        }
    }
    CACHE.lock().unwrap().insert(path.to_vec(), h.clone());
    Ok(h)
}

/// Checks the subcommands and flags a `kiln ...` text names (not run): `words` are
/// what follows `kiln`. Synopsis notation is understood: `[--flag X]`, `a|b`,
/// `(--url U | --data-dir D)`.
fn check_names(words: &[&str]) -> Result<(), String> {
    let mut path: Vec<String> = Vec::new();
    let mut alternatives: Vec<Vec<String>> = vec![path.clone()];
    let mut rest = words;
    // Descend through subcommands.
    while let Some((first, tail)) = rest.split_first() {
        let h = help(&path)?;
        if h.subcommands.is_empty() {
            break;
        }
        let names: Vec<&str> = first.split('|').collect();
        let is_word = names.iter().all(|n| {
            !n.is_empty()
                && n.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !n.starts_with('-')
        });
        if !is_word {
            break;
        }
        for n in &names {
            if !h.subcommands.contains(*n) {
                return Err(format!(
                    "`kiln {}{n}`: no such subcommand (there are: {})",
                    path.iter().map(|p| format!("{p} ")).collect::<String>(),
                    h.subcommands.iter().cloned().collect::<Vec<_>>().join(", ")
                ));
            }
        }
        alternatives = names
            .iter()
            .map(|n| {
                let mut p = path.clone();
                p.push(n.to_string());
                p
            })
            .collect();
        path = alternatives[0].clone();
        rest = tail;
        if names.len() > 1 {
            break;
        }
    }
    let helps: Vec<Help> = alternatives
        .iter()
        .map(|p| help(p))
        .collect::<Result<_, _>>()?;
    for w in rest {
        if *w == "#" || w.starts_with('#') {
            break; // a comment in a synopsis
        }
        for piece in w.split('|') {
            let piece =
                piece.trim_matches(|c| matches!(c, '[' | ']' | '(' | ')' | ',' | '.' | ';' | ':'));
            let flag = piece.split('=').next().unwrap_or("");
            let is_long = flag.starts_with("--")
                && flag.len() > 2
                && flag[2..]
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-');
            let is_short = flag.len() == 2
                && flag.starts_with('-')
                && flag[1..].chars().all(|c| c.is_ascii_alphabetic());
            if !(is_long || is_short) {
                continue;
            }
            if !helps.iter().any(|h| h.flags.contains(flag)) {
                return Err(format!(
                    "`kiln {}` has no flag `{flag}` (its flags: {})",
                    path.join(" "),
                    helps[0].flags.iter().cloned().collect::<Vec<_>>().join(" ")
                ));
            }
        }
    }
    Ok(())
}

/// The words after `kiln` in a text line or an inline span, if it is a kiln command.
fn kiln_words_in_text(s: &str) -> Option<Vec<&str>> {
    let words: Vec<&str> = s.split_whitespace().collect();
    if words.first() == Some(&"kiln") && words.len() > 1 {
        return Some(words[1..].to_vec());
    }
    if words.first() == Some(&"cargo") && words.get(1) == Some(&"run") {
        let bin_kiln = words.windows(2).any(|w| w[0] == "--bin" && w[1] == "kiln");
        let sep = words.iter().position(|w| *w == "--")?;
        if bin_kiln && sep + 1 < words.len() {
            return Some(words[sep + 1..].to_vec());
        }
    }
    None
}

// ---------------------------------------------------------------------------------
// Running

/// Runs `cmd` with a deadline; kills its process group when it passes.
fn run_with_timeout(
    mut cmd: Command,
    timeout: Duration,
) -> Result<(std::process::ExitStatus, String, String), String> {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let out_path = dir.path().join("stdout");
    let err_path = dir.path().join("stderr");
    cmd.stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .stdin(Stdio::null())
        .process_group(0);
    let mut child = cmd.spawn().map_err(|e| format!("spawn: {e}"))?;
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            kill_group(&mut child);
            let out = std::fs::read_to_string(&out_path).unwrap_or_default();
            let err = std::fs::read_to_string(&err_path).unwrap_or_default();
            return Err(format!(
                "timed out after {timeout:?}\n{}",
                tail(&format!("{out}{err}"), 40)
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let out = String::from_utf8_lossy(&std::fs::read(&out_path).unwrap_or_default()).to_string();
    let err = String::from_utf8_lossy(&std::fs::read(&err_path).unwrap_or_default()).to_string();
    Ok((status, out, err))
}

fn kill_group(child: &mut Child) {
    let _ = Command::new("kill")
        .args(["-9", &format!("-{}", child.id())])
        .status();
    let _ = child.kill();
    let _ = child.wait();
}

fn tail(s: &str, lines: usize) -> String {
    let v: Vec<&str> = s.lines().collect();
    v[v.len().saturating_sub(lines)..].join("\n")
}

/// Gives `args` plus the probe to the real parser, in an empty directory: Ok when the
/// parser accepted everything before the probe.
fn probe(args: &[String]) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(KILN);
    cmd.args(joined_values(args)?)
        .arg(PROBE)
        .current_dir(dir.path());
    let (status, out, err) = run_with_timeout(cmd, PROBE_TIMEOUT)
        .map_err(|e| format!("the parser did not stop at the probe: {e}"))?;
    let expected = format!("unexpected argument '{PROBE}'");
    if status.code() == Some(2) && err.contains(&expected) {
        Ok(())
    } else {
        Err(format!(
            "the argument parser refused it ({status}): {}",
            tail(&format!("{err}{out}"), 12).trim()
        ))
    }
}

/// `args` with every `--flag value` of a flag that takes a value written
/// `--flag=value`: clap checks a value given that way at once, while the value of the
/// last `--flag value` before the probe would be left unchecked when the probe stops
/// the parse.
fn joined_values(args: &[String]) -> Result<Vec<String>, String> {
    let mut path = Vec::new();
    let mut i = 0;
    while i < args.len() && help(&path)?.subcommands.contains(&args[i]) {
        path.push(args[i].clone());
        i += 1;
    }
    let value_flags = help(&path)?.value_flags;
    let mut out = args[..i].to_vec();
    while i < args.len() {
        let a = &args[i];
        if value_flags.contains(a) && i + 1 < args.len() {
            out.push(format!("{a}={}", args[i + 1]));
            i += 2;
        } else {
            out.push(a.clone());
            i += 1;
        }
    }
    Ok(out)
}

/// A `kiln serve` child on a free port with an empty data directory.
struct Server {
    child: Child,
    port: u16,
}

impl Server {
    /// Starts it; a port taken between choosing it and binding it gets another try.
    fn start(data_dir: &Path) -> Server {
        for _ in 0..3 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let mut child = Command::new(KILN)
                .args([
                    "serve",
                    "--bind",
                    &format!("127.0.0.1:{port}"),
                    "--journal-file-size-mib",
                    "4",
                    "--data-dir",
                ])
                .arg(data_dir)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                if healthy(port) {
                    return Server { child, port };
                }
                if let Ok(Some(_)) = child.try_wait() {
                    break; // exited: try another port
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("kiln serve did not answer /health within 30 s");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        panic!("kiln serve exited before answering /health, three times");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn healthy(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
    let mut out = String::new();
    s.read_to_string(&mut out).is_ok() && out.starts_with("HTTP/1.1 200")
}

fn have(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program} >/dev/null")])
        .status()
        .is_ok_and(|s| s.success())
}

/// Commands that never belong in a run block: they build, install or take minutes.
fn forbidden_in_run_block(words: &[String]) -> bool {
    let first = words.first().map(String::as_str).unwrap_or("");
    matches!(first, "cargo" | "pip" | "pip3" | "npm" | "npx" | ".ci/run")
        || (kiln_args(words)
            .is_some_and(|a| a.first().is_some_and(|s| s == "bench" || s == "disk-bench")))
}

/// The script of one file's run blocks, and for each marker the doc line and command.
fn build_script(
    file: &Path,
    blocks: &[Block],
    port: u16,
    failures: &mut Vec<String>,
) -> (String, Vec<(usize, String)>) {
    let mut script = String::from("set -euo pipefail\nexec 2>&1\n");
    script.push_str(&format!(
        "curl() {{ command curl -sS {} \"$@\"; }}\n",
        curl_fail_flag()
    ));
    let mut commands = Vec::new();
    for block in blocks.iter().filter(|b| b.is_run()) {
        for c in shell_commands(block) {
            let simple = simple_commands(&c.toks);
            let is_serve = simple
                .iter()
                .any(|w| kiln_args(w).is_some_and(|a| a.first().is_some_and(|s| s == "serve")));
            if let Some(w) = simple.iter().find(|w| forbidden_in_run_block(w)) {
                failures.push(format!(
                    "{}:{}: `{}` cannot run in a test: mark its block ```sh no-run",
                    rel(file),
                    c.line,
                    w.join(" ")
                ));
                continue;
            }
            let marker = commands.len();
            commands.push((c.line, c.text.clone()));
            // On a line of its own: the previous command's output may not end with one.
            script.push_str(&format!("printf '\\n>>> docs-test command {marker}\\n'\n"));
            if is_serve {
                script.push_str(": the test's own kiln serve stands in for this one\n");
            } else {
                let text = c
                    .text
                    .replace("localhost:8080", &format!("127.0.0.1:{port}"))
                    .replace("127.0.0.1:8080", &format!("127.0.0.1:{port}"));
                script.push_str(&text);
                script.push('\n');
            }
        }
    }
    (script, commands)
}

/// `--fail-with-body` (curl 7.76+) shows the error's body; older curls get `-f`.
fn curl_fail_flag() -> &'static str {
    static FLAG: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();
    FLAG.get_or_init(|| {
        let ok = Command::new("curl")
            .args([
                "-sS",
                "--fail-with-body",
                "-o",
                "/dev/null",
                "file:///dev/null",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            "--fail-with-body"
        } else {
            "-f"
        }
    })
}

fn read_docs() -> Vec<(PathBuf, Vec<Block>, String)> {
    doc_files()
        .into_iter()
        .map(|f| {
            let text =
                std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            let (blocks, outside) = parse_markdown(&text);
            (f, blocks, outside)
        })
        .collect()
}

// ---------------------------------------------------------------------------------
// The tests

/// Every `kiln` command of every `sh` block is accepted by the argument parser, and
/// every `kiln ...` in other blocks and inline code names existing subcommands and
/// flags.
#[test]
fn every_kiln_command_in_the_docs_parses() {
    let mut failures = Vec::new();
    let mut probed = 0;
    let mut named = 0;
    for (file, blocks, outside) in read_docs() {
        for block in &blocks {
            if block.language() == "sh" {
                for c in shell_commands(block) {
                    for words in simple_commands(&c.toks) {
                        if let Some(args) = kiln_args(&words) {
                            probed += 1;
                            if let Err(e) = probe(&args) {
                                failures.push(format!(
                                    "{}:{}: `kiln {}`: {e}",
                                    rel(&file),
                                    c.line,
                                    args.join(" ")
                                ));
                            }
                        }
                    }
                }
            } else {
                for (n, line) in &block.lines {
                    if let Some(words) = kiln_words_in_text(line.trim()) {
                        named += 1;
                        if let Err(e) = check_names(&words) {
                            failures.push(format!("{}:{n}: {e}", rel(&file)));
                        }
                    }
                }
            }
        }
        if inline_code_is_history(&file) {
            continue;
        }
        for (n, span) in inline_spans(&outside) {
            if let Some(words) = kiln_words_in_text(&span) {
                named += 1;
                if let Err(e) = check_names(&words) {
                    failures.push(format!("{}:{n}: `{span}`: {e}", rel(&file)));
                }
            }
        }
    }
    eprintln!("docs: {probed} kiln commands parse-checked, {named} kiln mentions name-checked");
    assert!(
        probed >= 40 && named >= 40,
        "too few kiln commands found: is the extraction broken?"
    );
    assert!(
        failures.is_empty(),
        "{} documentation problem(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The `sh` blocks of each file run, in order, against a real server.
#[test]
fn the_docs_sh_blocks_run() {
    let curl = have("curl");
    let docs = read_docs();
    let runnable: Vec<_> = docs
        .iter()
        .filter(|(_, blocks, _)| blocks.iter().any(Block::is_run))
        .collect();
    let started = Instant::now();
    // Two files at a time (one server each): the CI machine has two cores.
    let next = Mutex::new(0usize);
    let results = Mutex::new((Vec::new(), 0usize, 0usize)); // (failures, files run, commands run)
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| loop {
                let i = {
                    let mut n = next.lock().unwrap();
                    *n += 1;
                    *n - 1
                };
                let Some((file, blocks, _)) = runnable.get(i) else {
                    break;
                };
                let mut failures = Vec::new();
                let ran = run_file(file, blocks, curl, &mut failures);
                let mut r = results.lock().unwrap();
                r.0.extend(failures);
                if let Some(commands) = ran {
                    r.1 += 1;
                    r.2 += commands;
                }
            });
        }
    });
    let (failures, files_run, commands_run) = results.into_inner().unwrap();
    eprintln!(
        "docs: ran {commands_run} commands of {files_run} files in {:?}",
        started.elapsed()
    );
    assert!(
        failures.is_empty(),
        "{} documentation problem(s):\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    assert!(
        files_run >= 3 || !curl,
        "too few files with runnable blocks: is the extraction broken?"
    );
}

/// Runs one file's script; the number of commands it ran, or None if skipped.
fn run_file(
    file: &Path,
    blocks: &[Block],
    curl: bool,
    failures: &mut Vec<String>,
) -> Option<usize> {
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("work");
    let bin = tmp.path().join("bin");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(KILN, bin.join("kiln")).unwrap();
    let server = Server::start(&tmp.path().join("server-data"));
    let (script, commands) = build_script(file, blocks, server.port, failures);
    if !curl && script.contains("curl ") {
        eprintln!("docs: {} not run: no curl on this machine", rel(file));
        return None;
    }
    let script_path = tmp.path().join("script.sh");
    std::fs::write(&script_path, &script).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = Command::new("bash");
    cmd.arg(&script_path).current_dir(&work).env("PATH", path);
    let result = run_with_timeout(cmd, SCRIPT_TIMEOUT);
    let (ok, output) = match result {
        Ok((status, out, err)) => (status.success(), format!("{out}{err}\n(exit: {status})")),
        Err(e) => (false, e),
    };
    if !ok {
        // The last marker the script printed names the failing command.
        let last = output
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix(">>> docs-test command "))
            .and_then(|n| n.trim().parse::<usize>().ok());
        let (line, text) = last
            .and_then(|i| commands.get(i).cloned())
            .unwrap_or((0, "(before the first command)".into()));
        let shown: String = output
            .lines()
            .filter(|l| !l.starts_with(">>> docs-test"))
            .collect::<Vec<_>>()
            .join("\n");
        failures.push(format!(
            "{}:{line}: this command failed:\n{text}\n--- its output (last lines of the file's script):\n{}",
            rel(file),
            tail(&shown, 25)
        ));
    }
    drop(server);
    Some(commands.len())
}

/// The help text of every command names no file that the repository lacks.
#[test]
fn kiln_help_names_only_files_in_the_repository() {
    let root = repo_root();
    let mut missing: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut stack: Vec<Vec<String>> = vec![vec![]];
    let mut seen = 0;
    while let Some(path) = stack.pop() {
        let h = help(&path).unwrap();
        seen += 1;
        for sub in &h.subcommands {
            let mut p = path.clone();
            p.push(sub.clone());
            stack.push(p);
        }
        for word in h.text.split(|c: char| {
            c.is_whitespace() || matches!(c, '(' | ')' | ',' | ';' | '`' | '"' | '\'')
        }) {
            let word = word.trim_end_matches(['.', ':']);
            let is_file = [".md", ".rs", ".yaml", ".yml", ".toml", ".sh"]
                .iter()
                .any(|e| word.ends_with(e));
            if !is_file || word.contains('<') || word.contains('*') {
                continue;
            }
            let exists = if word.contains('/') {
                root.join(word.trim_start_matches("./")).exists()
            } else {
                root.join(word).exists() || root.join("docs").join(word).exists()
            };
            if !exists {
                missing
                    .entry(word.to_string())
                    .or_default()
                    .push(format!("kiln {} --help", path.join(" ")).replace("  ", " "));
            }
        }
    }
    assert!(seen > 15, "too few subcommands found ({seen})");
    let mut failures = Vec::new();
    for (word, wheres) in &missing {
        if !KNOWN_MISSING_IN_HELP.contains(&word.as_str()) {
            failures.push(format!(
                "{word} (named by {}) is not in the repository",
                wheres.join(", ")
            ));
        }
    }
    for known in KNOWN_MISSING_IN_HELP {
        if !missing.contains_key(*known) {
            failures.push(format!(
                "{known} is in KNOWN_MISSING_IN_HELP but no help names it any more: remove it from the list"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The checks catch what they are for: an unknown flag or subcommand.
#[test]
fn the_checks_refuse_unknown_flags_and_subcommands() {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert!(probe(&s(&["serve", "--data-dir", "d", "--bind", "127.0.0.1:0"])).is_ok());
    assert!(probe(&s(&["serve", "--no-such-flag"])).is_err());
    assert!(probe(&s(&["no-such-command"])).is_err());
    assert!(probe(&s(&["list", "shop", "--limit", "not-a-number"])).is_err());
    assert!(check_names(&["put", "[--data-dir", "D]", "DB", "ID", "JSON"]).is_ok());
    assert!(check_names(&["kv", "put|get|scan", "[--dir", "ENV_DIR]"]).is_ok());
    assert!(check_names(&[
        "backup",
        "chain-stop",
        "(--url",
        "U",
        "|",
        "--data-dir",
        "D)",
        "--db",
        "DB"
    ])
    .is_ok());
    assert!(check_names(&["put", "--no-such-flag"]).is_err());
    assert!(check_names(&["backup", "no-such-subcommand"]).is_err());
    // Extraction: a run block's commands, joined across lines, with kiln found in pipes.
    let (blocks, outside) = parse_markdown(
        "text `kiln get --data-dir D`\n\n```sh\nprintf x |\n  kiln import --url U --db d - # c\ncurl \\\n  -X PUT u\n```\n```sh no-run\nkiln bench\n```\n",
    );
    assert_eq!(blocks.len(), 2);
    assert!(blocks[0].is_run() && blocks[1].is_no_run());
    let cmds = shell_commands(&blocks[0]);
    assert_eq!(cmds.len(), 2);
    assert_eq!(
        kiln_args(&simple_commands(&cmds[0].toks)[1]).unwrap(),
        s(&["import", "--url", "U", "--db", "d", "-"])
    );
    assert_eq!(
        inline_spans(&outside),
        vec![(1, "kiln get --data-dir D".to_string())]
    );
}
