//! Issue 37, reduced by issue 51 to framing: the server's own HTTP/1.1 loop
//! (`src/http1/`) frames its answers and reads its requests exactly as hyper
//! does, byte for byte, and hands over to hyper and the router exactly the
//! requests it must.
//!
//! What a document GET, PUT, POST or PATCH answers (its checks, status, etag,
//! headers, body) is defined once, in `doc_request.rs`, and both paths render
//! that one `DocAnswer`; admission is `app::admit` on both, and the request id
//! `observe::RequestId` on both. Those are tested where they are defined
//! (`doc_request.rs`, `http_util.rs` and `observe.rs` unit tests; `http_api.rs`,
//! `limits.rs`, `tls_auth.rs`, `front_door_layers.rs`), not here. What the two
//! transports can still differ in is compared here: how a request head and its
//! body are read (`Content-Length`, chunked, heads that do not parse, smuggling
//! shapes, a body cut short or that stops coming, the HTTP/2 preface), which
//! header value a head yields (duplicates, case, spaces, bytes past ASCII),
//! pipelining and the hand-over to hyper mid-pipeline, keep-alive and close,
//! HEAD, the status line and the framing headers (`content-length`,
//! `transfer-encoding`, `connection`), a refused write's unread body, and which
//! requests the loop leaves to the router because its front layers (CORS,
//! compression) would change the answer.
//!
//! Two servers start from copies of one stopped data directory: one as shipped
//! (`own_http1 = true`: document requests in the own loop, the connection handed
//! to hyper and the router at the first other request) and one with
//! `own_http1 = false` (`kiln serve --hyper-only`: everything through hyper and
//! the router). The copies hold the same databases with the same incarnations,
//! so the two servers hand out the same etags and generated ids when they are
//! sent the same requests in the same order. Every request goes to both over raw
//! TCP, and the answers are compared whole: the status line, every header (names
//! and values, duplicates kept, in any order), every body byte, and whether and
//! when the connection closes.
//!
//! Only what cannot be equal is normalised, each checked first:
//! - `date` (it must be an HTTP date);
//! - an `x-request-id` the server made up (16 hex digits: the request sent none),
//!   and the same id in an error's body; an id the request sent must come back
//!   byte for byte;
//! - the time of a write made during the test, in `last-modified` and in a body's
//!   `"@last-modified"`, when the two servers' are at most seconds apart
//!   (documents of the seed have the same times on both, by construction).
//!
//! The requests: (1) generated ones (proptest, fixed seed) that vary what framing
//! depends on (method and HEAD, a target the loop serves or hands over, a body
//! framed by its length or none, one refused before it is read, `Connection`,
//! `Accept-Encoding` and `Origin`, a key or none), alone, pipelined and trickled,
//! with authentication off and on; (2) raw shapes of request smuggling, odd
//! framing and odd heads, each kept open and half-closed; (3) pipelines whose
//! hand-over comes mid-way, cut anywhere; (4) a key presented in the ways a head
//! may carry it; (5) the front layers' hand-over. `KILN_DIFF_CASES` sets the
//! number of generated cases.
//!
//! Where the own loop answers otherwise by design (a head that does not parse: a
//! JSON 400 where hyper sends an empty one, `http1/head.rs`, `Parsed::Malformed`),
//! that documented answer is asserted instead (`Expect::Malformed`). Divergences
//! that remain are the `#[ignore]`d tests at the end, all of framing: each names
//! the request and both answers, and passes once the two answer alike. They are
//! kept on purpose: in each the own loop's answer is the more precise one (it says
//! `connection: close` when it closes, or answers in JSON where hyper sends an empty
//! or no answer), and `--hyper-only` is only a comparison mode.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use crate::common::Harness;
use kiln_server::{auth, ReadOffload, ServerConfig};
use proptest::prelude::*;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

// ---------------------------------------------------------------------------
// The wire: raw requests out, raw answers in.
// ---------------------------------------------------------------------------

/// One answer as it came off the wire.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Answer {
    status_line: String,
    /// In the order sent; names as sent, values after `": "`.
    headers: Vec<(String, String)>,
    /// As sent (a chunked body keeps its framing).
    body: Vec<u8>,
}

impl Answer {
    fn status(&self) -> u16 {
        self.status_line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Everything one connection got back.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Transcript {
    answers: Vec<Answer>,
    /// Bytes after the last whole answer (a cut answer); empty normally.
    rest: Vec<u8>,
    /// The server closed (or reset) the connection.
    closed: bool,
    /// Still open, and not all answers in, at the time limit.
    timed_out: bool,
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The whole answer at the start of `buf` and its length, if it is all there.
/// `to_head`: the answer to a HEAD (no body). `eof`: nothing more will come (a
/// body framed by the close ends here).
fn parse_answer(buf: &[u8], to_head: bool, eof: bool) -> Option<(Answer, usize)> {
    let head_end = find(buf, b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default().to_string();
    let headers: Vec<(String, String)> = lines
        .map(|l| match l.split_once(':') {
            Some((k, v)) => (k.to_string(), v.strip_prefix(' ').unwrap_or(v).to_string()),
            None => (l.to_string(), "<no colon>".to_string()),
        })
        .collect();
    let mut answer = Answer {
        status_line,
        headers,
        body: Vec::new(),
    };
    let start = head_end + 4;
    let rest = &buf[start..];
    let status = answer.status();
    let len = if to_head || status < 200 || status == 204 || status == 304 {
        0
    } else if answer
        .header("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
    {
        chunked_len(rest)?
    } else if let Some(len) = answer.header("content-length") {
        let len: usize = len.parse().expect("a numeric content-length");
        if rest.len() < len {
            return None;
        }
        len
    } else if eof {
        rest.len()
    } else {
        return None;
    };
    answer.body = rest[..len].to_vec();
    Some((answer, start + len))
}

/// The length of the whole chunked body at the start of `b`, framing included.
fn chunked_len(b: &[u8]) -> Option<usize> {
    let mut at = 0;
    loop {
        let line_end = at + find(&b[at..], b"\r\n")?;
        let size_text = std::str::from_utf8(&b[at..line_end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        at = line_end + 2;
        if size == 0 {
            // Trailers, then the blank line.
            loop {
                let e = at + find(&b[at..], b"\r\n")?;
                let blank = e == at;
                at = e + 2;
                if blank {
                    return Some(at);
                }
            }
        }
        if b.len() < at + size + 2 {
            return None;
        }
        at += size + 2;
    }
}

#[derive(Clone, Copy, Debug)]
enum Until {
    /// Until this many final (non-1xx) answers in all, or the close.
    Answers(usize),
    /// Until this many answers in all, interim (1xx) ones counted, or the close.
    AnyAnswers(usize),
    /// Until the server closes (an idle connection is closed after the read
    /// timeout, on both paths).
    Close,
}

/// What a client does on one connection, in order.
#[derive(Clone, Debug)]
enum Step {
    /// Waits, then writes (a write the server refuses is not an error).
    Write(Duration, Vec<u8>),
    /// Shuts the sending side (the server reads an end of stream).
    HalfClose,
    Read(Until),
}

/// How long a script may take on one connection.
const SCRIPT_LIMIT: Duration = Duration::from_secs(8);

/// Runs `steps` on a new connection to `addr`. `heads[i]`: the i-th final answer
/// answers a HEAD.
async fn run_script(addr: SocketAddr, steps: &[Step], heads: &[bool]) -> Transcript {
    let deadline = tokio::time::Instant::now() + SCRIPT_LIMIT;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let mut t = Transcript {
        answers: Vec::new(),
        rest: Vec::new(),
        closed: false,
        timed_out: false,
    };
    let mut finals = 0;
    let mut chunk = vec![0u8; 64 << 10];
    for step in steps {
        match step {
            Step::Write(pause, bytes) => {
                if !pause.is_zero() {
                    tokio::time::sleep(*pause).await;
                }
                // A server that closed mid-request fails the write: what it sent
                // before is still read below.
                let _ = tokio::time::timeout_at(deadline, stream.write_all(bytes)).await;
            }
            Step::HalfClose => {
                let _ = stream.shutdown().await;
            }
            Step::Read(until) => loop {
                while let Some((a, n)) = parse_answer(
                    &t.rest,
                    heads.get(finals).copied().unwrap_or(false),
                    t.closed,
                ) {
                    t.rest.drain(..n);
                    if a.status() >= 200 {
                        finals += 1;
                    }
                    t.answers.push(a);
                    if t.closed && t.rest.is_empty() {
                        break;
                    }
                }
                if t.closed {
                    break;
                }
                match *until {
                    Until::Answers(n) if finals >= n => break,
                    Until::AnyAnswers(n) if t.answers.len() >= n => break,
                    _ => {}
                }
                match tokio::time::timeout_at(deadline, stream.read(&mut chunk)).await {
                    Err(_) => {
                        t.timed_out = true;
                        break;
                    }
                    Ok(Ok(0)) | Ok(Err(_)) => t.closed = true,
                    Ok(Ok(n)) => t.rest.extend_from_slice(&chunk[..n]),
                }
            },
        }
        if t.timed_out {
            break;
        }
    }
    t
}

/// The steps of a client that writes `bytes` at once and reads `n` answers.
fn pipelined(bytes: Vec<u8>, n: usize) -> Vec<Step> {
    vec![
        Step::Write(Duration::ZERO, bytes),
        Step::Read(Until::Answers(n)),
    ]
}

// ---------------------------------------------------------------------------
// Normalising and comparing two transcripts.
// ---------------------------------------------------------------------------

/// What a made-up request id is replaced with in a body (as long as the id, so
/// the body's length is untouched).
const MADE_ID: &[u8; 16] = b"<made up id, 16>";

fn made_up_id(v: &str) -> bool {
    v.len() == 16
        && v.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// `2026-11-26T23:02:39.667Z` as milliseconds since the epoch.
fn rfc3339_ms(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() != 24 || b[4] != b'-' || b[10] != b'T' || b[19] != b'.' || b[23] != b'Z' {
        return None;
    }
    let n = |r: std::ops::Range<usize>| -> Option<i64> { s.get(r)?.parse().ok() };
    let (y, m, d) = (n(0..4)?, n(5..7)?, n(8..10)?);
    let (hh, mm, ss, ms) = (n(11..13)?, n(14..16)?, n(17..19)?, n(20..23)?);
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((((days * 24 + hh) * 60 + mm) * 60 + ss) * 1000 + ms)
}

fn http_date_ms(s: &str) -> Option<i64> {
    let t = httpdate::parse_http_date(s).ok()?;
    Some(t.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis() as i64)
}

/// Two servers write the same document a few milliseconds apart.
const WRITE_TIME_SLACK_MS: i64 = 10_000;

const LAST_MODIFIED_KEY: &[u8] = b"\"@last-modified\":\"";

/// Replaces what the two transcripts cannot have in common (see the module
/// comment), after checking it.
fn normalise(own: &mut Transcript, hyper: &mut Transcript) {
    for t in [&mut *own, &mut *hyper] {
        for a in &mut t.answers {
            normalise_alone(a);
        }
    }
    for (a, b) in own.answers.iter_mut().zip(hyper.answers.iter_mut()) {
        // The `last-modified` of a document written during the test.
        let lm = |x: &Answer| x.header("last-modified").map(str::to_string);
        if let (Some(x), Some(y)) = (lm(a), lm(b)) {
            if x != y {
                let (tx, ty) = (http_date_ms(&x), http_date_ms(&y));
                assert!(tx.is_some() && ty.is_some(), "last-modified {x:?} / {y:?}");
                if (tx.unwrap() - ty.unwrap()).abs() <= WRITE_TIME_SLACK_MS {
                    for z in [&mut *a, &mut *b] {
                        for (k, v) in &mut z.headers {
                            if k.eq_ignore_ascii_case("last-modified") {
                                *v = "<write time>".into();
                            }
                        }
                    }
                }
            }
        }
        // `"@last-modified":"..."` in bodies, occurrence by occurrence.
        let spots = |body: &[u8]| -> Vec<usize> {
            let mut at = Vec::new();
            let mut from = 0;
            while let Some(i) = find(&body[from..], LAST_MODIFIED_KEY) {
                let value = from + i + LAST_MODIFIED_KEY.len();
                at.push(value);
                from = value;
            }
            at
        };
        for (i, j) in spots(&a.body).into_iter().zip(spots(&b.body)) {
            let (Some(x), Some(y)) = (a.body.get(i..i + 24), b.body.get(j..j + 24)) else {
                continue;
            };
            if x == y {
                continue;
            }
            let (x, y) = (String::from_utf8_lossy(x), String::from_utf8_lossy(y));
            let (Some(tx), Some(ty)) = (rfc3339_ms(&x), rfc3339_ms(&y)) else {
                continue;
            };
            if (tx - ty).abs() <= WRITE_TIME_SLACK_MS {
                a.body[i..i + 24].copy_from_slice(b"<write time, rfc 3339..>");
                b.body[j..j + 24].copy_from_slice(b"<write time, rfc 3339..>");
            }
        }
    }
}

fn normalise_alone(a: &mut Answer) {
    let mut made = None;
    for (k, v) in &mut a.headers {
        if k.eq_ignore_ascii_case("date") {
            assert!(http_date_ms(v).is_some(), "date: {v:?} is not an HTTP date");
            *v = "<date>".into();
        } else if k.eq_ignore_ascii_case("x-request-id") && made_up_id(v) {
            made = Some(std::mem::replace(v, "<made up>".into()));
        }
    }
    if let Some(id) = made {
        let mut from = 0;
        while let Some(i) = find(&a.body[from..], id.as_bytes()) {
            let at = from + i;
            a.body[at..at + 16].copy_from_slice(MADE_ID);
            from = at + 16;
        }
    }
}

/// Every difference between two (normalised) transcripts, in words.
fn differences(own: &Transcript, hyper: &Transcript) -> Vec<String> {
    let mut out = Vec::new();
    if own.answers.len() != hyper.answers.len() {
        out.push(format!(
            "{} answers from the own loop, {} from hyper",
            own.answers.len(),
            hyper.answers.len()
        ));
    }
    for (i, (a, b)) in own.answers.iter().zip(&hyper.answers).enumerate() {
        if a.status_line != b.status_line {
            out.push(format!(
                "answer {i}: {:?} vs {:?}",
                a.status_line, b.status_line
            ));
        }
        let sorted = |x: &Answer| {
            let mut h = x.headers.clone();
            h.sort();
            h
        };
        let (ha, hb) = (sorted(a), sorted(b));
        if ha != hb {
            let only = |x: &[(String, String)], y: &[(String, String)]| -> Vec<String> {
                let mut y = y.to_vec();
                let mut left = Vec::new();
                for h in x {
                    match y.iter().position(|g| g == h) {
                        Some(p) => {
                            y.remove(p);
                        }
                        None => left.push(format!("{}: {}", h.0, h.1)),
                    }
                }
                left
            };
            out.push(format!(
                "answer {i}: headers only the own loop sent {:?}, only hyper sent {:?}",
                only(&ha, &hb),
                only(&hb, &ha)
            ));
        }
        if a.body != b.body {
            out.push(format!(
                "answer {i}: body {:?} vs {:?}",
                String::from_utf8_lossy(&a.body),
                String::from_utf8_lossy(&b.body)
            ));
        }
    }
    for (what, x, y) in [
        ("closed", own.closed, hyper.closed),
        ("timed out", own.timed_out, hyper.timed_out),
    ] {
        if x != y {
            out.push(format!("{what}: {x} (own loop) vs {y} (hyper)"));
        }
    }
    if own.rest != hyper.rest {
        out.push(format!(
            "left over {:?} vs {:?}",
            String::from_utf8_lossy(&own.rest),
            String::from_utf8_lossy(&hyper.rest)
        ));
    }
    out
}

fn show_bytes(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    if s.len() > 1500 {
        format!("{:?}... ({} bytes)", &s[..1500], b.len())
    } else {
        format!("{s:?}")
    }
}

fn show_transcript(t: &Transcript) -> String {
    let mut s = String::new();
    for a in &t.answers {
        let _ = writeln!(s, "    {}", a.status_line);
        for (k, v) in &a.headers {
            let _ = writeln!(s, "      {k}: {v}");
        }
        let _ = writeln!(s, "      body {}", show_bytes(&a.body));
    }
    let _ = writeln!(
        s,
        "    closed {} timed out {} left over {}",
        t.closed,
        t.timed_out,
        show_bytes(&t.rest)
    );
    s
}

fn show_steps(steps: &[Step]) -> String {
    let mut s = String::new();
    for step in steps {
        match step {
            Step::Write(pause, bytes) => {
                let _ = writeln!(s, "    write after {pause:?}: {}", show_bytes(bytes));
            }
            Step::HalfClose => s.push_str("    half-close\n"),
            Step::Read(until) => {
                let _ = writeln!(s, "    read {until:?}");
            }
        }
    }
    s
}

/// A report of a mismatch: what was sent, both answers, what differs.
fn report(
    name: &str,
    steps: &[Step],
    own: &Transcript,
    hyper: &Transcript,
    diff: &[String],
) -> String {
    format!(
        "{name}: the own loop and hyper answer differently\n  sent:\n{}  own loop:\n{}  hyper:\n{}  differences:\n    {}\n",
        show_steps(steps),
        show_transcript(own),
        show_transcript(hyper),
        diff.join("\n    ")
    )
}

// ---------------------------------------------------------------------------
// Two servers over copies of one data directory.
// ---------------------------------------------------------------------------

struct Pair {
    own: Harness,
    hyper: Harness,
}

impl Pair {
    async fn start(seed: &Path, tune: impl Fn(&mut ServerConfig)) -> Pair {
        let (own, hyper) = tokio::join!(
            Harness::start_on_copy(seed, |c| {
                c.own_http1 = true;
                tune(c);
            }),
            Harness::start_on_copy(seed, |c| {
                c.own_http1 = false;
                tune(c);
            }),
        );
        Pair { own, hyper }
    }

    /// The script on both servers at once (each on its own connection),
    /// normalised.
    async fn run(&self, steps: &[Step], heads: &[bool]) -> (Transcript, Transcript) {
        let (mut a, mut b) = tokio::join!(
            run_script(self.own.addr, steps, heads),
            run_script(self.hyper.addr, steps, heads)
        );
        normalise(&mut a, &mut b);
        (a, b)
    }

    /// The script must be answered alike; returns the (normalised) answers.
    async fn same(&self, name: &str, steps: &[Step], heads: &[bool]) -> Transcript {
        let (a, b) = self.run(steps, heads).await;
        let diff = differences(&a, &b);
        assert!(diff.is_empty(), "{}", report(name, steps, &a, &b, &diff));
        a
    }

    /// Shuts both down; returns how many connections the own loop handed to
    /// hyper, and how many it was given in all. `key`: for `/metrics` with
    /// authentication on.
    async fn shutdown(self, key: &str) -> (f64, f64) {
        let Pair { own, hyper } = self;
        let metrics = |h: &Harness| {
            let r = h.http.get(h.url("/metrics")).bearer_auth(key).send();
            async move { r.await.unwrap().text().await.unwrap() }
        };
        let (own_text, hyper_text) = tokio::join!(metrics(&own), metrics(&hyper));
        let value = |text: &str, series: &str| {
            crate::common::metric(text, series).unwrap_or_else(|| panic!("no {series} in {text}"))
        };
        let handed = value(&own_text, "kiln_http_connections_to_hyper_total");
        let total = value(&own_text, "kiln_http_connections_total");
        assert_eq!(
            value(&hyper_text, "kiln_http_connections_to_hyper_total"),
            0.0,
            "the hyper-only server has no own loop"
        );
        tokio::join!(own.shutdown(), hyper.shutdown());
        (handed, total)
    }
}

/// Makes a key in a (stopped) seed directory; returns it.
fn seed_key(dir: &Path) -> String {
    auth::create_api_key(dir, "good", kiln_server::access::Clearance::Operator)
        .unwrap()
        .1
}

/// A small but well-formed request: `METHOD target HTTP/1.1`, `Host`, the given
/// header lines, and the body with its `Content-Length` (none when `None`).
fn request(method: &str, target: &str, headers: &str, body: Option<&[u8]>) -> Vec<u8> {
    let mut r = format!("{method} {target} HTTP/1.1\r\nHost: kiln.test\r\n{headers}");
    if let Some(b) = body {
        let _ = write!(r, "Content-Length: {}\r\n", b.len());
    }
    r.push_str("\r\n");
    let mut r = r.into_bytes();
    if let Some(b) = body {
        r.extend_from_slice(b);
    }
    r
}

/// `--max-body-bytes` of the servers, low: the generated bodies go up to it and
/// past it (a write refused before its body is read).
const MAX_BODY: usize = 640;

// ---------------------------------------------------------------------------
// (1) Generated requests.
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Method {
    Get,
    Put,
    Post,
    Delete,
    Head,
    Options,
    Patch,
}

impl Method {
    fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Put => "PUT",
            Method::Post => "POST",
            Method::Delete => "DELETE",
            Method::Head => "HEAD",
            Method::Options => "OPTIONS",
            Method::Patch => "PATCH",
        }
    }

    fn writes(self) -> bool {
        matches!(
            self,
            Method::Put | Method::Post | Method::Delete | Method::Patch
        )
    }
}

/// The generated requests' databases: the seeded one, and a missing one (a write
/// to it is refused before its body is read).
const GEN_DBS: [&str; 2] = ["g", "nodb"];

/// Document ids as they go into the request target, each a case of what the own
/// loop serves (`http1/head.rs`, `doc_request::document_target`): plain, with
/// `/`, a prefix (trailing `/`), bytes a path may hold as they are, a dot
/// segment, an empty segment (served there); percent-encoded, raw UTF-8, with a
/// query or a fragment, empty (handed to hyper). The frozen one comes last.
fn gen_ids() -> Vec<String> {
    let mut ids: Vec<String> = [
        "a",
        "u/1",
        "u/2",
        "x/",
        "u/1/",
        "{\"k\"}|^!$*",
        "x[1]\\y",
        "d/../e",
        "a//b",
        "a%20b",
        "caf\u{e9}",
        "%zz",
        "q?rev=1",
        "h#frag",
        "",
    ]
    .map(String::from)
    .to_vec();
    ids.push(FROZEN_ID.to_string());
    ids
}

/// A seeded document of more than 1024 bytes (the compression layer's threshold)
/// that the generated requests never write: its `@last-modified` is the same on
/// both servers, so even a compressed answer compares byte for byte.
const FROZEN_ID: &str = "big";

#[derive(Clone, Copy, Debug)]
enum BodyKind {
    /// No body and no `Content-Length`.
    None,
    Empty,
    Small,
    /// Not JSON: refused once the body is read.
    Invalid,
    /// Valid JSON of `MAX_BODY + n` bytes (past it: refused before it is read).
    Sized(isize),
}

#[derive(Clone, Copy, Debug)]
enum Credential {
    None,
    Bearer,
    Wrong,
    XApiKey,
}

#[derive(Clone, Copy, Debug)]
enum Conn {
    None,
    Close,
    KeepAlive,
    KeepAliveClose,
    CloseThenKeepAlive,
    Te,
}

#[derive(Clone, Copy, Debug)]
enum Enc {
    None,
    Identity,
    Gzip,
    Many,
    Star,
}

#[derive(Clone, Debug)]
struct GenReq {
    method: Method,
    db: usize,
    id: usize,
    body: BodyKind,
    /// `If-None-Match: *`: a 304 without a body to a GET of a document, a
    /// conflict after its body to a write to one.
    revalidate: bool,
    key: Credential,
    conn: Conn,
    /// An `X-Request-Id` (else the servers make one up).
    rid: bool,
    enc: Enc,
    origin: bool,
    /// A POST goes to a prefix (`x/`, `u/1/`), not to the id drawn.
    post_to_prefix: bool,
}

#[derive(Clone, Copy, Debug)]
enum Mode {
    /// Each request after the answer to the one before.
    OneByOne,
    /// All in one write.
    Pipelined,
    /// All, the heads in writes of a few bytes each, a body with the last piece
    /// of its head (see `UNREAD_BODY_BYTES`).
    Trickled,
}

#[derive(Clone, Debug)]
struct Case {
    requests: Vec<GenReq>,
    mode: Mode,
    /// On the pair of servers with authentication on.
    auth: bool,
}

fn gen_req(n_ids: usize) -> impl Strategy<Value = GenReq> {
    let method = prop_oneof![
        8 => Just(Method::Get),
        8 => Just(Method::Put),
        3 => Just(Method::Post),
        2 => Just(Method::Delete),
        2 => Just(Method::Head),
        1 => Just(Method::Options),
        1 => Just(Method::Patch),
    ];
    let db = prop_oneof![8 => Just(0usize), 1 => Just(1)];
    // Mostly the first few ids, so that writes and reads meet.
    let id = prop_oneof![10 => 0..3usize, 5 => 0..n_ids];
    let body = prop_oneof![
        2 => Just(BodyKind::None),
        1 => Just(BodyKind::Empty),
        8 => Just(BodyKind::Small),
        1 => Just(BodyKind::Invalid),
        2 => prop_oneof![Just(-1isize), Just(0), Just(1), Just(900)].prop_map(BodyKind::Sized),
    ];
    let key = prop_oneof![
        3 => Just(Credential::None),
        14 => Just(Credential::Bearer),
        1 => Just(Credential::Wrong),
        3 => Just(Credential::XApiKey),
    ];
    let conn = prop_oneof![
        12 => Just(Conn::None),
        1 => Just(Conn::Close),
        2 => Just(Conn::KeepAlive),
        1 => Just(Conn::KeepAliveClose),
        1 => Just(Conn::CloseThenKeepAlive),
        1 => Just(Conn::Te),
    ];
    let enc = prop_oneof![
        6 => Just(Enc::None),
        1 => Just(Enc::Identity),
        2 => Just(Enc::Gzip),
        1 => Just(Enc::Many),
        1 => Just(Enc::Star),
    ];
    (
        (method, db, id, body, prop::bool::weighted(0.15)),
        (key, conn, prop::bool::weighted(0.7), enc),
        (prop::bool::weighted(0.05), prop::bool::weighted(0.8)),
    )
        .prop_map(
            |(
                (method, db, id, body, revalidate),
                (key, conn, rid, enc),
                (origin, post_to_prefix),
            )| GenReq {
                method,
                db,
                id,
                body,
                revalidate,
                key,
                conn,
                rid,
                enc,
                origin,
                post_to_prefix,
            },
        )
}

fn gen_case(n_ids: usize) -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(gen_req(n_ids), 1..=5),
        prop_oneof![3 => Just(Mode::OneByOne), 3 => Just(Mode::Pipelined), 1 => Just(Mode::Trickled)],
        any::<bool>(),
    )
        .prop_map(|(requests, mode, auth)| Case { requests, mode, auth })
}

/// A request whose body the router never reads (a GET with a body, a write it
/// refuses first) has it drained by hyper with a single read
/// (`poll_drain_or_close_read`), and the connection closed when that read did not
/// reach the body's end. What that read finds depends on how the bytes came in
/// and when each server read them, on either server; so such bodies are only
/// generated where every server reads them whole at once: requests written
/// whole, pipelines of at most this many bytes (one read: the own loop's buffer
/// and hyper's first read are 8 KiB), and trickled heads whose body comes whole
/// with the head's last piece. (The own loop, too, decides on a refused write's
/// body with what it has read: `a_refused_write_with_part_of_its_body` below.)
const UNREAD_BODY_BYTES: usize = 8000;

/// The id (index) a generated request targets: writes never touch the frozen
/// document, and most POSTs go to a prefix.
fn target_id(r: &GenReq, ids: &[String]) -> usize {
    match r.method {
        Method::Post if r.post_to_prefix => 3 + r.id % 2,
        m if m.writes() && ids[r.id] == FROZEN_ID => 0,
        _ => r.id,
    }
}

/// A generated request's bytes (`key`: the seed's API key; `number`: the
/// request's, for its request id and body), whether it is a HEAD, and the request
/// id it presents, which the server must echo.
fn render(r: &GenReq, ids: &[String], key: &str, number: u64) -> (Vec<u8>, bool, Option<String>) {
    let id = &ids[target_id(r, ids)];
    let mut h: Vec<u8> = Vec::new();
    let mut line = |name: &str, value: &[u8]| {
        h.extend_from_slice(name.as_bytes());
        h.extend_from_slice(b": ");
        h.extend_from_slice(value);
        h.extend_from_slice(b"\r\n");
    };
    if r.revalidate {
        line("If-None-Match", b"*");
    }
    match r.key {
        Credential::None => {}
        Credential::Bearer => line("Authorization", format!("Bearer {key}").as_bytes()),
        Credential::Wrong => line("Authorization", b"Bearer kiln_00000000_00"),
        Credential::XApiKey => line("X-Api-Key", key.as_bytes()),
    }
    match r.conn {
        Conn::None => {}
        Conn::Close => line("Connection", b"close"),
        Conn::KeepAlive => line("Connection", b"keep-alive"),
        Conn::KeepAliveClose => line("Connection", b"Keep-Alive, Close"),
        Conn::CloseThenKeepAlive => {
            line("Connection", b"close");
            line("Connection", b"keep-alive");
        }
        Conn::Te => line("Connection", b"TE"),
    }
    let presented = r.rid.then(|| format!("gen-{number}.{}", r.method.as_str()));
    if let Some(rid) = &presented {
        line("X-Request-Id", rid.as_bytes());
    }
    // A compressed answer carries its `@last-modified` compressed: an encoding is
    // only asked for where that is the seed's (the frozen document), or where
    // answers are small (below the compression layer's threshold).
    let enc = match r.method {
        Method::Get if id != FROZEN_ID => Enc::None,
        _ => r.enc,
    };
    match enc {
        Enc::None => {}
        Enc::Identity => line("Accept-Encoding", b"identity"),
        Enc::Gzip => line("Accept-Encoding", b"gzip"),
        Enc::Many => line("Accept-Encoding", b"gzip;q=0.5, br, zstd;q=0.1"),
        Enc::Star => line("Accept-Encoding", b"identity;q=1, *;q=0"),
    }
    if r.origin {
        line("Origin", b"https://app.example");
    }
    let body: Option<Vec<u8>> = match r.body {
        BodyKind::None => None,
        BodyKind::Empty => Some(Vec::new()),
        BodyKind::Small => Some(format!("{{\"n\":{number},\"s\":\"\u{e9}\"}}").into_bytes()),
        BodyKind::Invalid => Some(b"{\"n\": oops}".to_vec()),
        BodyKind::Sized(d) => {
            let len = (MAX_BODY as isize + d) as usize;
            Some(format!("{{\"s\":\"{}\"}}", "x".repeat(len - 8)).into_bytes())
        }
    };
    let target = format!("/dbs/{}/docs/{id}", GEN_DBS[r.db]);
    let mut bytes = format!(
        "{} {target} HTTP/1.1\r\nHost: kiln.test\r\n",
        r.method.as_str()
    )
    .into_bytes();
    bytes.extend_from_slice(&h);
    if let Some(b) = &body {
        bytes.extend_from_slice(format!("Content-Length: {}\r\n\r\n", b.len()).as_bytes());
        bytes.extend_from_slice(b);
    } else {
        bytes.extend_from_slice(b"\r\n");
    }
    (bytes, r.method == Method::Head, presented)
}

/// The steps of a case's requests in its mode.
fn case_steps(mode: Mode, requests: &[Vec<u8>]) -> Vec<Step> {
    let n = requests.len();
    match mode {
        Mode::OneByOne => requests
            .iter()
            .enumerate()
            .flat_map(|(i, r)| {
                [
                    Step::Write(Duration::ZERO, r.clone()),
                    Step::Read(Until::Answers(i + 1)),
                ]
            })
            .collect(),
        Mode::Pipelined => pipelined(requests.concat(), n),
        Mode::Trickled => {
            let mut steps = Vec::new();
            for r in requests {
                let head_len = find(r, b"\r\n\r\n").expect("a whole head") + 4;
                let (head, body) = r.split_at(head_len);
                let mut pieces: Vec<Vec<u8>> = head.chunks(23).map(<[u8]>::to_vec).collect();
                pieces.last_mut().unwrap().extend_from_slice(body);
                steps.extend(pieces.into_iter().map(|p| Step::Write(Duration::ZERO, p)));
            }
            steps.push(Step::Read(Until::Answers(n)));
            steps
        }
    }
}

#[test]
fn generated_requests_are_framed_alike() {
    use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
    use std::cell::RefCell;
    use std::collections::BTreeMap;

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let ids = gen_ids();
    let (seed, key) = rt.block_on(async {
        let h = Harness::start().await;
        h.create_db("g").await;
        h.put_ok("g", "a", &serde_json::json!({"n": 0})).await;
        h.put_ok("g", "u/1", &serde_json::json!({"n": 1})).await;
        let big: String = (0..250).map(|i| format!("{i:04}-")).collect();
        h.put_ok("g", FROZEN_ID, &serde_json::json!({"text": big}))
            .await;
        let dir = h.shutdown().await;
        let key = seed_key(dir.path());
        (dir, key)
    });
    let tune = |auth: bool| {
        move |c: &mut ServerConfig| {
            c.require_auth = auth;
            c.limits.max_body_bytes = MAX_BODY;
        }
    };
    let pairs = rt.block_on(async {
        let (open, closed) = tokio::join!(
            Pair::start(seed.path(), tune(false)),
            Pair::start(seed.path(), tune(true))
        );
        [open, closed]
    });

    let cases: u32 = std::env::var("KILN_DIFF_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500);
    let config = Config {
        cases,
        failure_persistence: None,
        // The servers keep the state of every case before: a shrunk case would not
        // meet the same state. The first failing case is reported whole instead.
        max_shrink_iters: 0,
        ..Config::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &[37; 32]));
    let number = RefCell::new(0u64);
    let statuses = RefCell::new(BTreeMap::<u16, u32>::new());
    let result = runner.run(&gen_case(ids.len()), |case| {
        let pair = &pairs[usize::from(case.auth)];
        let mut rendered = Vec::new();
        let mut heads = Vec::new();
        let mut presented = Vec::new();
        for r in &case.requests {
            let n = {
                let mut n = number.borrow_mut();
                *n += 1;
                *n
            };
            let (bytes, head, id) = render(r, &ids, &key, n);
            rendered.push(bytes);
            heads.push(head);
            presented.push(id);
        }
        let mode = match case.mode {
            Mode::Pipelined if rendered.concat().len() > UNREAD_BODY_BYTES => Mode::OneByOne,
            mode => mode,
        };
        let steps = case_steps(mode, &rendered);
        let (mut own, mut hyper) = rt.block_on(async {
            tokio::join!(
                run_script(pair.own.addr, &steps, &heads),
                run_script(pair.hyper.addr, &steps, &heads)
            )
        });
        // The ids presented come back byte for byte (checked before normalising).
        for t in [&own, &hyper] {
            for (a, id) in t.answers.iter().zip(&presented) {
                if let Some(id) = id {
                    if a.header("x-request-id") != Some(id.as_str()) {
                        return Err(TestCaseError::fail(format!(
                            "the request id {id:?} was not echoed:\n{}",
                            report("generated", &steps, &own, &hyper, &[])
                        )));
                    }
                }
            }
        }
        normalise(&mut own, &mut hyper);
        let diff = differences(&own, &hyper);
        if !diff.is_empty() {
            return Err(TestCaseError::fail(report(
                &format!("generated case (auth {})", case.auth),
                &steps,
                &own,
                &hyper,
                &diff,
            )));
        }
        let mut statuses = statuses.borrow_mut();
        for a in &own.answers {
            *statuses.entry(a.status()).or_default() += 1;
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    // Not vacuous: the cases met answers with a body and without (304, HEAD),
    // refusals before a body is read (401, 404, 405, 413) and after (400, 409), and
    // the own loop served many connections itself.
    let statuses = statuses.into_inner();
    eprintln!("generated: {cases} cases, answers by status {statuses:?}");
    for status in [200, 201, 304, 400, 401, 404, 405, 409, 413] {
        assert!(
            statuses.get(&status).is_some_and(|&n| n > 0),
            "no {status} among {statuses:?}"
        );
    }
    rt.block_on(async {
        for p in pairs {
            let (handed, total) = p.shutdown(&key).await;
            eprintln!("  own loop: {handed} of {total} connections handed to hyper");
            assert!(
                handed > 0.0 && handed < total - 10.0,
                "the own loop served many connections whole, and handed some over"
            );
        }
    });
}

// ---------------------------------------------------------------------------
// (2) Raw shapes: request smuggling, odd framing, odd heads.
// ---------------------------------------------------------------------------

/// How a shape's answers must compare.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    /// Byte for byte, after normalising.
    Same,
    /// The last answer is to a head that does not parse, or a target `http::Uri`
    /// refuses, read by the own loop: by design (`http1/head.rs`,
    /// `Parsed::Malformed`) it answers the JSON 400 every other error carries,
    /// where hyper sends an empty 400. Both close. Everything before is the same.
    Malformed,
    /// A divergence that is not by design: compared in the ignored test named.
    Diverges(&'static str),
}

struct Shape {
    name: String,
    steps: Vec<Step>,
    /// Kept open until the server closes it.
    expect: Expect,
    /// The same, half-closed after the last write.
    expect_half: Expect,
}

/// The read timeout of the shapes' servers: an idle connection is closed after
/// it (on both paths), which is how a shape's transcript ends.
const SHAPE_READ_TIMEOUT_MS: u64 = 500;

/// The shapes sent in one write. In each, `{d}` is the database, `{get}` a plain
/// GET of its seeded document (`X-Request-Id: second`; `{get-hex}` its length in
/// hex), and `{put ID}` the start of a PUT to ID (`X-Request-Id: first`), to which
/// the shape adds the rest of the head.
const ONE_WRITE_SHAPES: &[(&str, &[u8], Expect, Expect)] = {
    use Expect::{Malformed as M, Same as S};
    const STALLED: Expect = Expect::Diverges("a_body_that_stops_coming");
    const CUT: Expect = Expect::Diverges("a_body_cut_by_the_end_of_the_stream");
    const REFUSED: Expect = Expect::Diverges("a_refused_write_with_part_of_its_body");
    const HUGE: Expect = Expect::Diverges("a_content_length_hyper_refuses");
    const H2: Expect = Expect::Diverges("the_http2_preface");
    &[
        ("plain GET, then another", b"{get}{get}", S, S),
        // Smuggling: both lengths, or a chunked body holding a request.
        (
            "Content-Length then Transfer-Encoding",
            b"{put te1}Content-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n{get}",
            S,
            S,
        ),
        (
            "Transfer-Encoding then Content-Length",
            b"{put te2}Transfer-Encoding: chunked\r\nContent-Length: 6\r\n\r\n2\r\n{}\r\n0\r\n\r\n{get}",
            S,
            S,
        ),
        (
            "chunked, a request inside the chunk",
            b"{put te3}Transfer-Encoding: chunked\r\n\r\n{get-hex}\r\n{get}\r\n0\r\n\r\n{get}",
            S,
            S,
        ),
        (
            "chunked with an extension and a trailer",
            b"{put te4}Transfer-Encoding: chunked\r\n\r\n2;ext=1\r\n{}\r\n0\r\nX-Trailer: t\r\n\r\n{get}",
            S,
            S,
        ),
        (
            "chunked with a bad chunk size",
            b"{put te5}Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n{get}",
            S,
            S,
        ),
        (
            "Transfer-Encoding: CHUNKED",
            b"{put te6}Transfer-Encoding: CHUNKED\r\n\r\n2\r\n{}\r\n0\r\n\r\n{get}",
            S,
            S,
        ),
        (
            "Transfer-Encoding: xchunked, and a length",
            b"{put te7}Transfer-Encoding: xchunked\r\nContent-Length: 2\r\n\r\n{}{get}",
            S,
            S,
        ),
        (
            "Transfer-Encoding: chunked, identity",
            b"{put te8}Transfer-Encoding: chunked, identity\r\n\r\n2\r\n{}\r\n0\r\n\r\n{get}",
            S,
            S,
        ),
        (
            "Transfer-Encoding folded over two lines (obs-fold)",
            b"{put te9}Transfer-Encoding:\r\n chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n{get}",
            M,
            M,
        ),
        (
            "a chunked GET",
            b"GET /dbs/{d}/docs/seed HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n{get}",
            S,
            S,
        ),
        // Lengths hyper reads otherwise than plain digits.
        (
            "two equal Content-Lengths",
            b"{put cl1}Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}{get}",
            S,
            S,
        ),
        (
            "two different Content-Lengths",
            b"{put cl2}Content-Length: 2\r\nContent-Length: 12\r\n\r\n{}{get}",
            S,
            S,
        ),
        ("Content-Length: +2", b"{put cl3}Content-Length: +2\r\n\r\n{}{get}", S, S),
        ("Content-Length: -2", b"{put cl4}Content-Length: -2\r\n\r\n{}{get}", S, S),
        ("Content-Length with spaces around", b"{put cl5}Content-Length:   2  \r\n\r\n{}{get}", S, S),
        ("Content-Length after a tab", b"{put cl6}Content-Length:\t2\r\n\r\n{}{get}", S, S),
        ("Content-Length: 0x2", b"{put cl7}Content-Length: 0x2\r\n\r\n{}{get}", S, S),
        ("Content-Length: 2, 2", b"{put cl8}Content-Length: 2, 2\r\n\r\n{}{get}", S, S),
        ("Content-Length: 0002", b"{put cl9}Content-Length: 0002\r\n\r\n{}{get}", S, S),
        ("an empty Content-Length", b"{put cl10}Content-Length: \r\n\r\n{}{get}", S, S),
        (
            "a Content-Length past u64",
            b"{put cl11}Content-Length: 99999999999999999999999\r\n\r\n{}{get}",
            S,
            S,
        ),
        ("Content-Length: 0 on a PUT", b"{put cl12}Content-Length: 0\r\n\r\n{get}", S, S),
        ("a PUT without a length", b"{put cl13}\r\n{get}", S, S),
        // Bodies longer and shorter than their length.
        (
            "a body longer than its length, then a request",
            b"{put long1}Content-Length: 2\r\n\r\n{}XYZ{get}",
            S,
            S,
        ),
        (
            "a body longer than its length: the rest is no request",
            b"{put long2}Content-Length: 2\r\n\r\n{\"a\":1}\r\n\r\n",
            M,
            M,
        ),
        (
            "a body shorter than its length, then a request",
            b"{put short1}Content-Length: 40\r\n\r\n{}{get}",
            M,
            M,
        ),
        (
            "a GET with a body, then a request",
            b"GET /dbs/{d}/docs/seed HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello{get}",
            S,
            S,
        ),
        ("a body cut short", b"{put cut1}Content-Length: 10\r\n\r\n{\"a\":", STALLED, CUT),
        (
            "a refused write with all of its body, then a request",
            b"PUT /dbs/nodb/docs/x HTTP/1.1\r\nX-Request-Id: first\r\nContent-Length: 7\r\n\r\n{\"a\":1}{get}",
            S,
            S,
        ),
        (
            "a refused write with part of its body",
            b"PUT /dbs/nodb/docs/x HTTP/1.1\r\nX-Request-Id: first\r\nContent-Length: 100\r\n\r\n{\"a\":",
            REFUSED,
            REFUSED,
        ),
        (
            "a body over the limit, not sent",
            b"{put big2}Content-Length: 18446744073709551613\r\n\r\n{",
            REFUSED,
            REFUSED,
        ),
        (
            "a Content-Length hyper refuses (past u64::MAX - 2)",
            b"{put big3}Content-Length: 18446744073709551614\r\n\r\n{",
            HUGE,
            HUGE,
        ),
        // Line endings and header lines.
        (
            "bare LF line endings",
            b"GET /dbs/{d}/docs/seed HTTP/1.1\nHost: k\nX-Request-Id: lf\n\nPUT /dbs/{d}/docs/lf HTTP/1.1\nContent-Length: 2\n\n{}{get}",
            S,
            S,
        ),
        (
            "CRLF and LF mixed",
            b"GET /dbs/{d}/docs/seed HTTP/1.1\r\nHost: k\nX-Request-Id: mixed\r\n\n{get}",
            S,
            S,
        ),
        ("a bare CR line ending", b"GET /dbs/{d}/docs/seed HTTP/1.1\rHost: k\r\n\r\n{get}", M, M),
        (
            "a header line without a colon",
            b"GET /dbs/{d}/docs/seed HTTP/1.1\r\nNoColonHere\r\n\r\n{get}",
            M,
            M,
        ),
        ("a space before the colon", b"{put sp1}Content-Length : 2\r\n\r\n{}{get}", M, M),
        (
            "a NUL in a header value",
            b"GET /dbs/{d}/docs/seed HTTP/1.1\r\nX-Request-Id: a\0b\r\n\r\n{get}",
            M,
            M,
        ),
        (
            "bytes past ASCII in header values",
            b"GET /dbs/{d}/docs/seed HTTP/1.1\r\nIf-None-Match: \"\xff\xfe\"\r\nX-Api-Key: \xc3\xa9\r\nX-Request-Id: caf\xc3\xa9\r\n\r\n{get}",
            S,
            S,
        ),
        (
            "two X-Request-Ids",
            b"GET /dbs/{d}/docs/seed HTTP/1.1\r\nX-Request-Id: one\r\nX-Request-Id: two\r\n\r\n{get}",
            S,
            S,
        ),
        (
            "Connection: close, then a request",
            b"GET /dbs/{d}/docs/seed HTTP/1.1\r\nConnection: close\r\n\r\n{get}",
            S,
            S,
        ),
        (
            "Connection: close and keep-alive",
            b"GET /dbs/{d}/docs/seed HTTP/1.1\r\nConnection: close\r\nConnection: keep-alive\r\n\r\n{get}",
            S,
            S,
        ),
        // Request lines.
        ("HTTP/1.0", b"GET /dbs/{d}/docs/seed HTTP/1.0\r\n\r\n{get}", S, S),
        (
            "HTTP/1.0 keep-alive, then a request",
            b"GET /dbs/{d}/docs/seed HTTP/1.0\r\nConnection: keep-alive\r\n\r\n{get}",
            S,
            S,
        ),
        ("an HTTP/1.0 PUT", b"PUT /dbs/{d}/docs/h10 HTTP/1.0\r\nContent-Length: 2\r\n\r\n{}", S, S),
        ("HTTP/2.0 in the request line", b"GET /dbs/{d}/docs/seed HTTP/2.0\r\n\r\n{get}", M, M),
        ("the HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", H2, H2),
        ("a lowercase version", b"GET /dbs/{d}/docs/seed http/1.1\r\n\r\n{get}", M, M),
        (
            "an absolute-form target",
            b"GET http://k/dbs/{d}/docs/seed HTTP/1.1\r\nHost: k\r\n\r\n{get}",
            S,
            S,
        ),
        (
            "an absolute-form PUT",
            b"PUT http://k/dbs/{d}/docs/abs HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}{get}",
            S,
            S,
        ),
        ("the asterisk form", b"OPTIONS * HTTP/1.1\r\nHost: k\r\n\r\n{get}", S, S),
        ("a lowercase method", b"get /dbs/{d}/docs/seed HTTP/1.1\r\n\r\n{get}", S, S),
        (
            "empty lines before the request line",
            b"\r\n\r\nGET /dbs/{d}/docs/seed HTTP/1.1\r\n\r\n{get}",
            S,
            S,
        ),
        ("a space inside the target", b"GET /dbs/{d}/docs/se ed HTTP/1.1\r\n\r\n{get}", M, M),
        ("two spaces after the method", b"GET  /dbs/{d}/docs/seed HTTP/1.1\r\n\r\n{get}", M, M),
        ("a target http::Uri refuses", b"GET /dbs/{d}/docs/<seed> HTTP/1.1\r\n\r\n{get}", M, M),
        // Expect and Upgrade.
        (
            "Expect: 100-continue on a PUT",
            b"{put exp1}Expect: 100-continue\r\nContent-Length: 2\r\n\r\n{}{get}",
            S,
            S,
        ),
        (
            "Expect: 100-continue on a GET",
            b"GET /dbs/{d}/docs/seed HTTP/1.1\r\nExpect: 100-continue\r\n\r\n{get}",
            S,
            S,
        ),
        (
            "Expect: something else",
            b"{put exp3}Expect: 200-ok\r\nContent-Length: 2\r\n\r\n{}{get}",
            S,
            S,
        ),
        (
            "Upgrade: h2c",
            b"GET /dbs/{d}/docs/seed HTTP/1.1\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n{get}",
            S,
            S,
        ),
        ("a head cut short", b"GET /dbs/{d}/docs/seed HTTP/1.1\r\nHost: k\r\n", S, S),
    ]
};

/// Replaces `from` by `to` everywhere in `bytes`.
fn replace_all(bytes: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut rest = bytes;
    while let Some(i) = find(rest, from) {
        out.extend_from_slice(&rest[..i]);
        out.extend_from_slice(to);
        rest = &rest[i + from.len()..];
    }
    out.extend_from_slice(rest);
    out
}

/// Every shape, on database `d` (seeded with the document `seed`).
fn shapes(d: &str) -> Vec<Shape> {
    let get = format!("GET /dbs/{d}/docs/seed HTTP/1.1\r\nHost: k\r\nX-Request-Id: second\r\n\r\n");
    let expand = |template: &[u8]| -> Vec<u8> {
        let mut b = replace_all(
            template,
            b"{get-hex}",
            format!("{:x}", get.len()).as_bytes(),
        );
        b = replace_all(&b, b"{get}", get.as_bytes());
        b = replace_all(&b, b"{d}", d.as_bytes());
        while let Some(at) = find(&b, b"{put ") {
            let end = at + find(&b[at..], b"}").unwrap();
            let id = String::from_utf8(b[at + 5..end].to_vec()).unwrap();
            let head =
                format!("PUT /dbs/{d}/docs/{id} HTTP/1.1\r\nHost: k\r\nX-Request-Id: first\r\n");
            b.splice(at..=end, head.into_bytes());
        }
        b
    };
    let now = |bytes: Vec<u8>| Step::Write(Duration::ZERO, bytes);
    let mut all: Vec<Shape> = ONE_WRITE_SHAPES
        .iter()
        .map(|&(name, template, expect, expect_half)| Shape {
            name: name.to_string(),
            steps: vec![now(expand(template))],
            expect,
            expect_half,
        })
        .collect();
    let mut more = |name: &str, steps: Vec<Step>| {
        all.push(Shape {
            name: name.to_string(),
            steps,
            expect: Expect::Same,
            expect_half: Expect::Same,
        })
    };
    // Heads past the own loop's 64 KiB (it hands them to hyper) and past hyper's
    // limit (431); more headers than the own loop parses (32) and than hyper does.
    let padded = |kib: usize| {
        format!(
            "GET /dbs/{d}/docs/seed HTTP/1.1\r\nX-Pad: {}\r\n\r\n{get}",
            "p".repeat(kib << 10)
        )
    };
    more(
        "a 70 KiB head, then a request",
        vec![now(padded(70).into_bytes())],
    );
    more("a 500 KiB head", vec![now(padded(500).into_bytes())]);
    let headers = |n: usize| -> String { (0..n).map(|i| format!("X-H{i}: {i}\r\n")).collect() };
    for n in [40, 120] {
        let r = format!("GET /dbs/{d}/docs/seed HTTP/1.1\r\n{}\r\n{get}", headers(n));
        more(
            &format!("{n} headers, then a request"),
            vec![now(r.into_bytes())],
        );
    }
    // Bodies that come later than their heads.
    more(
        "Expect: 100-continue, the body after the 100",
        vec![
            now(expand(
                b"{put exp2}Expect: 100-continue\r\nContent-Length: 2\r\n\r\n",
            )),
            Step::Read(Until::AnyAnswers(1)),
            now(expand(b"{}{get}")),
        ],
    );
    more(
        "a head, then its body after a pause",
        vec![
            now(expand(b"{put slow1}Content-Length: 7\r\n\r\n")),
            Step::Write(Duration::from_millis(40), b"{\"a\":1}".to_vec()),
            Step::Write(Duration::from_millis(40), get.clone().into_bytes()),
        ],
    );
    more(
        "a body over the limit, sent whole, then a request",
        vec![now([
            expand(format!("{{put big1}}Content-Length: {}\r\n\r\n", MAX_BODY + 1).as_bytes()),
            format!("{{\"s\":\"{}\"}}", "x".repeat(MAX_BODY + 1 - 8)).into_bytes(),
            get.clone().into_bytes(),
        ]
        .concat())],
    );
    all
}

/// Shapes run in groups at once, each group on a database of its own (etags
/// count per database, so each server sees each group's writes in one order).
const SHAPE_GROUPS: usize = 8;

async fn shapes_pair() -> (tempfile::TempDir, Pair) {
    shapes_pair_reading(|_| ReadOffload::Auto).await
}

/// `shapes_pair`, with each server's document reads where `offload` says (given
/// whether the server is the one with the own loop).
async fn shapes_pair_reading(offload: impl Fn(bool) -> ReadOffload) -> (tempfile::TempDir, Pair) {
    let seed = {
        let h = Harness::start().await;
        for g in 0..SHAPE_GROUPS {
            let db = format!("x{g}");
            h.create_db(&db).await;
            h.put_ok(&db, "seed", &serde_json::json!({"seeded": g}))
                .await;
        }
        h.shutdown().await
    };
    let pair = Pair::start(seed.path(), |c| {
        c.limits.max_body_bytes = MAX_BODY;
        c.limits.request_read_timeout_ms = SHAPE_READ_TIMEOUT_MS;
        c.read_offload = offload(c.own_http1);
    })
    .await;
    (seed, pair)
}

/// Runs the shapes (each kept open, and half-closed) and checks each as it
/// expects; with `only`, just those that diverge as the ignored test `only`
/// says, which must then be answered alike. Returns how many ran, and the
/// reports of those that did not compare as expected.
async fn run_shapes(pair: &Pair, only: Option<&str>) -> (usize, Vec<String>) {
    let runs = (0..SHAPE_GROUPS).map(|g| async move {
        let db = format!("x{g}");
        let mut failures = Vec::new();
        let mut count = 0;
        for (i, shape) in shapes(&db).into_iter().enumerate() {
            if i % SHAPE_GROUPS != g {
                continue;
            }
            for half in [false, true] {
                let mut expect = if half {
                    shape.expect_half
                } else {
                    shape.expect
                };
                if let Some(test) = only {
                    if !matches!(expect, Expect::Diverges(t) if t == test) {
                        continue;
                    }
                    expect = Expect::Same;
                }
                let mut steps = shape.steps.clone();
                if half {
                    steps.push(Step::HalfClose);
                }
                steps.push(Step::Read(Until::Close));
                let name = format!("{}{}", shape.name, if half { " (half-closed)" } else { "" });
                count += 1;
                let (own, hyper) = pair.run(&steps, &[]).await;
                if let Err(e) = check_shape(expect, &own, &hyper) {
                    let diff = differences(&own, &hyper);
                    failures.push(format!("{}{e}", report(&name, &steps, &own, &hyper, &diff)));
                }
            }
        }
        (count, failures)
    });
    let results = futures_util::future::join_all(runs).await;
    let count = results.iter().map(|r| r.0).sum();
    (count, results.into_iter().flat_map(|r| r.1).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_shapes_are_answered_alike() {
    let (_seed, pair) = shapes_pair().await;
    let (count, failures) = run_shapes(&pair, None).await;
    assert!(
        failures.is_empty(),
        "{} of {count} shapes:\n{}",
        failures.len(),
        failures.join("\n")
    );
    eprintln!("raw shapes: {count} compared");
    assert!(count >= 130, "{count}");
    pair.shutdown("").await;
}

/// Reads on the blocking pool (`read_offload.rs`) are answered as reads on the
/// connection thread: the own loop and hyper with every read offloaded, against
/// hyper with none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_shapes_are_answered_alike_with_reads_offloaded() {
    let (_seed, pair) = shapes_pair_reading(|own_loop| match own_loop {
        true => ReadOffload::Always,
        false => ReadOffload::Never,
    })
    .await;
    let (count, failures) = run_shapes(&pair, None).await;
    assert!(
        failures.is_empty(),
        "{} of {count} shapes:\n{}",
        failures.len(),
        failures.join("\n")
    );
    let metrics = pair.own.http.get(pair.own.url("/metrics")).send();
    let text = metrics.await.unwrap().text().await.unwrap();
    let offloaded = crate::common::metric(&text, "kiln_document_reads_offloaded_total").unwrap();
    assert!(offloaded >= 10.0, "{offloaded} reads offloaded");
    pair.shutdown("").await;
}

/// The shapes that diverge as the ignored test `test` says: answered alike once
/// the server is fixed.
async fn shapes_diverging_as(test: &str) {
    let (_seed, pair) = shapes_pair().await;
    let (count, failures) = run_shapes(&pair, Some(test)).await;
    assert!(count > 0, "no shape diverges as {test}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    pair.shutdown("").await;
}

/// Whether a shape's answers compare as `expect` says.
fn check_shape(expect: Expect, own: &Transcript, hyper: &Transcript) -> Result<(), String> {
    match expect {
        Expect::Same => {
            let d = differences(own, hyper);
            if d.is_empty() {
                Ok(())
            } else {
                Err(String::new())
            }
        }
        // Kept honest: a divergence that went away is to be compared again.
        Expect::Diverges(test) => match differences(own, hyper).is_empty() {
            true => Err(format!(
                "\n  answered alike now: make it Expect::Same, and drop the ignored test {test}"
            )),
            false => Ok(()),
        },
        Expect::Malformed => check_malformed(own, hyper),
    }
}

/// The documented answer to a head that does not parse (see `Expect::Malformed`):
/// the answers before it the same; then the own loop's JSON 400 with a request id
/// and `connection: close`, and hyper's empty 400; both closed.
fn check_malformed(own: &Transcript, hyper: &Transcript) -> Result<(), String> {
    let (Some((o, own_before)), Some((h, hyper_before))) =
        (own.answers.split_last(), hyper.answers.split_last())
    else {
        return Err("\n  expected a 400 from each".into());
    };
    let before = |answers: &[Answer]| Transcript {
        answers: answers.to_vec(),
        rest: Vec::new(),
        closed: true,
        timed_out: false,
    };
    let d = differences(&before(own_before), &before(hyper_before));
    if !d.is_empty() {
        return Err(format!("\n  the answers before the 400 differ: {d:?}"));
    }
    let mut problems = Vec::new();
    if !(own.closed && hyper.closed && own.rest.is_empty() && hyper.rest.is_empty()) {
        problems.push("both close after the 400".to_string());
    }
    let own_names: Vec<&str> = {
        let mut n: Vec<&str> = o.headers.iter().map(|(k, _)| k.as_str()).collect();
        n.sort();
        n
    };
    let body: serde_json::Value = serde_json::from_slice(&o.body).unwrap_or_default();
    if o.status_line != "HTTP/1.1 400 Bad Request"
        || own_names
            != [
                "connection",
                "content-length",
                "content-type",
                "date",
                "x-request-id",
            ]
        || o.header("connection") != Some("close")
        || o.header("content-type") != Some("application/json")
        || body["error"] != "bad_request"
        || body["message"].as_str().is_none_or(str::is_empty)
        || body["request_id"].as_str().is_none()
    {
        problems.push("the own loop answers a JSON 400 bad_request with its request id".into());
    }
    let mut hyper_headers = h.headers.clone();
    hyper_headers.sort();
    let empty_400 = [
        ("connection".to_string(), "close".to_string()),
        ("content-length".to_string(), "0".to_string()),
        ("date".to_string(), "<date>".to_string()),
    ];
    if h.status_line != "HTTP/1.1 400 Bad Request"
        || hyper_headers != empty_400
        || !h.body.is_empty()
    {
        problems.push("hyper answers an empty 400".into());
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!("\n  documented: {}", problems.join("; ")))
    }
}

// ---------------------------------------------------------------------------
// (3) Pipelines: many requests in one write, the hand-over in the middle.
// ---------------------------------------------------------------------------

/// A pipeline of document requests (the own loop's), then `/health` (the
/// hand-over), then every other kind, ending with `Connection: close` and one
/// request after it that must not be answered. Returns the bytes, which answers
/// are to a HEAD, and how many answers there are.
fn mixed_pipeline(first_to_hyper: bool) -> (Vec<u8>, Vec<bool>, usize) {
    let id = |i: usize| format!("X-Request-Id: p-{i}\r\n");
    let mut requests: Vec<(Vec<u8>, bool)> = vec![
        (
            request("PUT", "/dbs/p/docs/a", &id(1), Some(b"{\"n\":1}")),
            false,
        ),
        (request("GET", "/dbs/p/docs/a", &id(2), None), false),
        (
            request("POST", "/dbs/p/docs/c/", &id(3), Some(b"{\"n\":2}")),
            false,
        ),
        (
            request(
                "GET",
                "/dbs/p/docs/a",
                &format!("{}If-None-Match: *\r\n", id(4)),
                None,
            ),
            false,
        ),
        (
            request("PUT", "/dbs/p/docs/a", &id(5), Some(b"{\"n\": oops}")),
            false,
        ),
        (request("GET", "/health", &id(6), None), false),
        (request("GET", "/dbs/p/docs/a", &id(7), None), false),
        (request("HEAD", "/dbs/p/docs/a", &id(8), None), true),
        (
            request("PUT", "/dbs/p/docs/b", &id(9), Some(b"{\"n\":3}")),
            false,
        ),
        (request("DELETE", "/dbs/p/docs/b", &id(10), None), false),
        (request("GET", "/dbs/p/docs/b", &id(11), None), false),
        (
            request("GET", "/dbs/p/docs?prefix=c/", &id(12), None),
            false,
        ),
        (
            request(
                "GET",
                "/dbs/p/docs/big",
                &format!("{}Accept-Encoding: gzip\r\n", id(13)),
                None,
            ),
            false,
        ),
        (
            request(
                "PUT",
                "/dbs/p/docs/a",
                &format!("{}If-Match: \"1-00000000\"\r\n", id(14)),
                Some(b"{}"),
            ),
            false,
        ),
        (
            request("POST", "/dbs/p/docs/a", &id(15), Some(b"{}")),
            false,
        ),
        (request("GET", "/dbs/p/docs/a%2Fb", &id(16), None), false),
        (
            request("PUT", "/dbs/p/docs/a", &id(17), Some(b"{\"n\":4}")),
            false,
        ),
        (
            request(
                "GET",
                "/dbs/p/docs/a",
                &format!("{}Connection: close\r\n", id(18)),
                None,
            ),
            false,
        ),
        (request("GET", "/dbs/p/docs/a", &id(19), None), false),
    ];
    if first_to_hyper {
        requests.insert(
            0,
            (
                request("GET", "/health", "X-Request-Id: p-0\r\n", None),
                false,
            ),
        );
    }
    let n = requests.len() - 1;
    let heads = requests.iter().map(|r| r.1).collect();
    (requests.into_iter().flat_map(|r| r.0).collect(), heads, n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelines_are_answered_alike_across_the_hand_over() {
    let seed = {
        let h = Harness::start().await;
        h.create_db("p").await;
        h.put_ok("p", "a", &serde_json::json!({"n": 0})).await;
        let text: String = (0..250).map(|i| format!("{i:04}-")).collect();
        h.put_ok("p", "big", &serde_json::json!({"text": text}))
            .await;
        h.shutdown().await
    };
    let pair = Pair::start(seed.path(), |c| c.limits.max_body_bytes = MAX_BODY).await;
    let mut compared = 0;

    // All at once, the document requests first (the own loop hands over at
    // /health), and again with /health first (hyper all along).
    for first_to_hyper in [false, true] {
        let (bytes, heads, n) = mixed_pipeline(first_to_hyper);
        let steps = vec![Step::Write(Duration::ZERO, bytes), Step::Read(Until::Close)];
        let t = pair.same("mixed pipeline", &steps, &heads).await;
        assert_eq!(
            t.answers.len(),
            n,
            "every request before the close is answered"
        );
        assert!(t.closed);
        for (i, a) in t.answers.iter().enumerate() {
            let want = format!("p-{}", i + usize::from(!first_to_hyper));
            assert_eq!(
                a.header("x-request-id"),
                Some(want.as_str()),
                "answers in order"
            );
        }
        let statuses: Vec<u16> = t.answers.iter().map(Answer::status).collect();
        let expected = [
            200, 200, 201, 304, 400, 200, 200, 200, 201, 200, 404, 200, 200, 409, 405, 404, 200,
            200,
        ];
        assert_eq!(&statuses[usize::from(first_to_hyper)..], &expected[..]);
        assert_eq!(
            t.answers[12 + usize::from(first_to_hyper)].header("content-encoding"),
            Some("gzip")
        );
        compared += 1;
    }

    // Cut in two at every 17th byte, the second part 2 ms later: heads and bodies
    // split anywhere, before and after the hand-over.
    let (bytes, heads, n) = mixed_pipeline(false);
    for cut in (1..bytes.len()).step_by(17) {
        let steps = vec![
            Step::Write(Duration::ZERO, bytes[..cut].to_vec()),
            Step::Write(Duration::from_millis(2), bytes[cut..].to_vec()),
            Step::Read(Until::Answers(n)),
        ];
        let t = pair
            .same(&format!("mixed pipeline cut at {cut}"), &steps, &heads)
            .await;
        assert_eq!(t.answers.len(), n);
        compared += 1;
    }

    // One byte a write.
    let short = [
        request(
            "PUT",
            "/dbs/p/docs/t",
            "X-Request-Id: t-1\r\n",
            Some(b"{\"t\":1}"),
        ),
        request("GET", "/dbs/p/docs/t", "", None),
        request("GET", "/health", "", None),
        request("GET", "/dbs/p/docs/t", "X-Request-Id: t-4\r\n", None),
    ]
    .concat();
    let mut steps: Vec<Step> = short
        .iter()
        .map(|b| Step::Write(Duration::ZERO, vec![*b]))
        .collect();
    steps.push(Step::Read(Until::Answers(4)));
    pair.same("one byte a write", &steps, &[]).await;
    compared += 1;

    // Answers past the own loop's 64 KiB of pending output, and a request stream
    // past its first 8 KiB read, on both sides of the hand-over.
    let get = request("GET", "/dbs/p/docs/a", "X-Request-Id: many\r\n", None);
    let many = [
        get.repeat(150),
        request("GET", "/health", "", None),
        get.repeat(150),
    ]
    .concat();
    let t = pair.same("301 pipelined", &pipelined(many, 301), &[]).await;
    assert_eq!(t.answers.len(), 301);
    compared += 1;

    // Expect: 100-continue in the middle: a 100, then its answer.
    let expect = [
        request("PUT", "/dbs/p/docs/e", "", Some(b"{\"e\":1}")),
        b"PUT /dbs/p/docs/e HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 7\r\n\r\n{\"e\":2}"
            .to_vec(),
        request("GET", "/dbs/p/docs/e", "", None),
    ]
    .concat();
    let t = pair
        .same("100-continue in a pipeline", &pipelined(expect, 3), &[])
        .await;
    let statuses: Vec<u16> = t.answers.iter().map(Answer::status).collect();
    assert_eq!(statuses, [201, 100, 200, 200]);
    compared += 1;

    // A request that does not parse: after document requests (the own loop's
    // documented JSON 400), and after the hand-over (hyper's on both).
    let bad = b"GET /dbs/p/docs/<a> HTTP/1.1\r\n\r\n".to_vec();
    let before = [
        request("PUT", "/dbs/p/docs/m", "", Some(b"{}")),
        request("GET", "/dbs/p/docs/m", "", None),
        bad.clone(),
        request("GET", "/dbs/p/docs/m", "", None),
    ]
    .concat();
    let steps = vec![
        Step::Write(Duration::ZERO, before),
        Step::Read(Until::Close),
    ];
    let (own, hyper) = pair.run(&steps, &[]).await;
    if let Err(e) = check_malformed(&own, &hyper) {
        let diff = differences(&own, &hyper);
        panic!(
            "{}{e}",
            report("malformed in the own loop", &steps, &own, &hyper, &diff)
        );
    }
    assert_eq!(own.answers.len(), 3);
    let after = [
        request("GET", "/health", "", None),
        request("GET", "/dbs/p/docs/m", "", None),
        bad,
        request("GET", "/dbs/p/docs/m", "", None),
    ]
    .concat();
    let steps = vec![Step::Write(Duration::ZERO, after), Step::Read(Until::Close)];
    let t = pair
        .same("malformed after the hand-over", &steps, &[])
        .await;
    assert_eq!(t.answers.len(), 3);
    compared += 2;

    // Half-closed after the pipeline: everything answered, then closed.
    let (bytes, heads, _) = mixed_pipeline(false);
    let keep = find(
        &bytes,
        b"GET /dbs/p/docs/a HTTP/1.1\r\nHost: kiln.test\r\nX-Request-Id: p-18",
    )
    .unwrap();
    let steps = vec![
        Step::Write(Duration::ZERO, bytes[..keep].to_vec()),
        Step::HalfClose,
        Step::Read(Until::Close),
    ];
    let t = pair.same("half-closed pipeline", &steps, &heads).await;
    assert_eq!(t.answers.len(), 17);
    compared += 1;

    eprintln!("pipelines: {compared} compared");
    let (handed, _) = pair.shutdown("").await;
    assert!(
        handed >= 10.0,
        "the own loop handed connections over: {handed}"
    );
}

// ---------------------------------------------------------------------------
// (4) A key, as a head carries it.
// ---------------------------------------------------------------------------

/// Ways a head may present a key: whether a key is valid is `app::admit`'s, one
/// rule on both paths (`tls_auth.rs` tests it); which value each path reads from
/// the head is the transport's (the first of two, a name's case, spaces and tabs
/// around the value, bytes past ASCII).
fn key_headers(good: &str) -> Vec<(&'static str, Vec<u8>)> {
    let h = |s: String| s.into_bytes();
    vec![
        ("no key", Vec::new()),
        ("Bearer", h(format!("Authorization: Bearer {good}\r\n"))),
        (
            "bearer, lowercase",
            h(format!("authorization: bearer {good}\r\n")),
        ),
        ("BEARER", h(format!("AUTHORIZATION: BEARER {good}\r\n"))),
        (
            "Bearer, padded",
            h(format!("Authorization: Bearer   {good} \r\n")),
        ),
        (
            "Bearer, no space after the colon",
            h(format!("Authorization:Bearer {good}\r\n")),
        ),
        (
            "Bearer, a tab before the value",
            h(format!("Authorization:\tBearer {good}\t\r\n")),
        ),
        (
            "Bearer and a tab",
            h(format!("Authorization: Bearer\t{good}\r\n")),
        ),
        ("Bearer, no key", h("Authorization: Bearer\r\n".into())),
        (
            "Bearer with a byte past ASCII",
            [
                format!("Authorization: Bearer {good}").as_bytes(),
                b"\xe9\r\n",
            ]
            .concat(),
        ),
        ("X-Api-Key", h(format!("X-Api-Key: {good}\r\n"))),
        ("x-api-key, lowercase", h(format!("x-api-key: {good}\r\n"))),
        (
            "two X-Api-Keys, good first",
            h(format!("X-Api-Key: {good}\r\nX-Api-Key: nope\r\n")),
        ),
        (
            "two X-Api-Keys, good second",
            h(format!("X-Api-Key: nope\r\nx-api-key: {good}\r\n")),
        ),
        (
            "two Authorizations, good second",
            h(format!(
                "Authorization: Bearer nope\r\nAuthorization: Bearer {good}\r\n"
            )),
        ),
    ]
}

/// Requests with the key headers `key`: the own loop's (a refused write leaves
/// its body unread), then the router's. The request id names the key and the
/// request.
fn auth_requests(key_name: &str, key: &[u8]) -> Vec<Vec<u8>> {
    let tag: String = key_name
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                b as char
            } else {
                '-'
            }
        })
        .collect();
    let with = |method: &str, target: &str, body: Option<&[u8]>, i: usize| {
        let mut r =
            format!("{method} {target} HTTP/1.1\r\nHost: kiln.test\r\nX-Request-Id: {tag}.{i}\r\n")
                .into_bytes();
        r.extend_from_slice(key);
        if let Some(b) = body {
            r.extend_from_slice(format!("Content-Length: {}\r\n", b.len()).as_bytes());
        }
        r.extend_from_slice(b"\r\n");
        r.extend_from_slice(body.unwrap_or_default());
        r
    };
    vec![
        with("GET", "/dbs/k/docs/a", None, 1),
        with("PUT", "/dbs/k/docs/w", Some(b"{\"w\":1}"), 2),
        with("POST", "/dbs/k/docs/p/", Some(b"{\"p\":1}"), 3),
        with("PUT", "/dbs/nodb/docs/w", Some(b"{}"), 4),
        with("GET", "/health", None, 5),
        with("PUT", "/dbs/k/docs/w", Some(b"{\"w\":2}"), 6),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_read_from_the_head_alike() {
    let (seed, good) = {
        let h = Harness::start().await;
        h.create_db("k").await;
        h.put_ok("k", "a", &serde_json::json!({"n": 0})).await;
        let dir = h.shutdown().await;
        let key = seed_key(dir.path());
        (dir, key)
    };
    let pair = Pair::start(seed.path(), |c| {
        c.require_auth = true;
        c.limits.max_body_bytes = MAX_BODY;
    })
    .await;
    let mut statuses = std::collections::BTreeMap::<u16, u32>::new();
    let mut compared = 0;
    for (name, key) in key_headers(&good) {
        let requests = auth_requests(name, &key);
        // Each alone on a connection of its own.
        for (i, r) in requests.iter().enumerate() {
            let t = pair
                .same(
                    &format!("{name}, request {i} alone"),
                    &pipelined(r.clone(), 1),
                    &[],
                )
                .await;
            for a in &t.answers {
                *statuses.entry(a.status()).or_default() += 1;
            }
            compared += 1;
        }
        // All on one connection, in one write: refused writes skip their bodies,
        // and the connection goes on, across the hand-over.
        let n = requests.len();
        pair.same(
            &format!("{name}, pipelined"),
            &pipelined(requests.concat(), n),
            &[],
        )
        .await;
        compared += 1;
    }
    eprintln!("keys: {compared} compared, answers by status {statuses:?}");
    for status in [200, 201, 401, 404] {
        assert!(
            statuses.contains_key(&status),
            "no {status} in {statuses:?}"
        );
    }
    pair.shutdown(&good).await;
}

// ---------------------------------------------------------------------------
// (5) The front layers: the own loop leaves to the router every request whose
// answer the router's CORS or compression layer would change
// (`cross_origin::FrontLayers`).
// ---------------------------------------------------------------------------

/// With `--cors-origin https://app.example`, every answer says `Vary: origin`
/// (`cross_origin::cors`), and only those to a request with that `Origin` carry
/// `access-control-allow-origin`, `-allow-credentials` and `-expose-headers`: the
/// own loop then serves nothing, and both paths give the same answers, with the
/// CORS headers exactly where the `Origin` is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_headers_only_for_an_origin() {
    let seed = {
        let h = Harness::start().await;
        h.create_db("c").await;
        h.put_ok("c", "a", &serde_json::json!({"n": 0})).await;
        h.shutdown().await
    };
    let pair = Pair::start(seed.path(), |c| {
        c.cors_origins = vec!["https://app.example".into()]
    })
    .await;
    let origin = "Origin: https://app.example\r\n";
    let script = [
        request("GET", "/dbs/c/docs/a", "X-Request-Id: c-1\r\n", None),
        request("PUT", "/dbs/c/docs/b", "X-Request-Id: c-2\r\n", Some(b"{}")),
        request("GET", "/dbs/c/docs/nothing", "X-Request-Id: c-3\r\n", None),
        request(
            "GET",
            "/dbs/c/docs/a",
            &format!("X-Request-Id: c-4\r\n{origin}"),
            None,
        ),
        request(
            "PUT",
            "/dbs/c/docs/b",
            &format!("X-Request-Id: c-5\r\n{origin}"),
            Some(b"{}"),
        ),
    ];
    for (i, r) in script.into_iter().enumerate() {
        let with_origin = i >= 3;
        let t = pair.same("--cors-origin set", &pipelined(r, 1), &[]).await;
        let a = &t.answers[0];
        assert!(
            a.header("vary").is_some_and(|v| v.contains("origin")),
            "request {i}: Vary: origin"
        );
        let cors: Vec<_> = a
            .headers
            .iter()
            .filter(|(k, _)| k.to_ascii_lowercase().starts_with("access-control-"))
            .collect();
        assert_eq!(!cors.is_empty(), with_origin, "request {i}: {cors:?}");
        if with_origin {
            assert_eq!(
                a.header("access-control-allow-origin"),
                Some("https://app.example")
            );
        }
    }
    pair.shutdown("").await;
}

/// The router's compression layer adds `vary: accept-encoding` to every answer
/// of at least 1024 bytes (`cross_origin::COMPRESSION_MIN_BYTES`), compressed or
/// not; the own loop says the same on the document GETs it serves (no encoding
/// asked for, or only `identity`), and hands over those that ask for one:
/// `GET /dbs/v/docs/big` (a 1,500-byte document).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn big_answers_vary_on_accept_encoding() {
    let seed = {
        let h = Harness::start().await;
        h.create_db("v").await;
        let text: String = (0..250).map(|i| format!("{i:04}-")).collect();
        h.put_ok("v", "big", &serde_json::json!({"text": text}))
            .await;
        h.shutdown().await
    };
    let pair = Pair::start(seed.path(), |_| {}).await;
    for (name, encoding, compressed) in [
        ("no Accept-Encoding", "", false),
        ("identity only", "Accept-Encoding: identity\r\n", false),
        ("gzip", "Accept-Encoding: gzip\r\n", true),
    ] {
        let get = request(
            "GET",
            "/dbs/v/docs/big",
            &format!("X-Request-Id: v-1\r\n{encoding}"),
            None,
        );
        let t = pair
            .same(&format!("a big document, {name}"), &pipelined(get, 1), &[])
            .await;
        let a = &t.answers[0];
        assert_eq!(a.header("vary"), Some("accept-encoding"), "{name}");
        assert_eq!(a.header("content-encoding").is_some(), compressed, "{name}");
    }
    pair.shutdown("").await;
}

/// A PUT's answer of 1024 bytes or more (an id of 500 `"`, 1,000 bytes once
/// escaped in the JSON) to a client that accepts gzip: the router compresses it
/// (`content-encoding: gzip`, `vary`, chunked); the own loop, which leaves every
/// request that accepts an encoding to the router, gives the same answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn big_write_answers_are_compressed() {
    let seed = {
        let h = Harness::start().await;
        h.create_db("w").await;
        h.shutdown().await
    };
    let pair = Pair::start(seed.path(), |_| {}).await;
    let target = format!("/dbs/w/docs/{}", "\"".repeat(500));
    let put = request(
        "PUT",
        &target,
        "X-Request-Id: w-1\r\nAccept-Encoding: gzip\r\n",
        Some(b"{}"),
    );
    let t = pair
        .same("a big PUT answer, gzip accepted", &pipelined(put, 1), &[])
        .await;
    assert_eq!(t.answers[0].header("content-encoding"), Some("gzip"));
    pair.shutdown("").await;
}

// ---------------------------------------------------------------------------
// The comparison itself: it misses no difference but the normalised ones.
// ---------------------------------------------------------------------------

#[test]
fn the_comparison_sees_every_byte_but_the_normalised_ones() {
    let answer = |date: &str, id: &str, written: &str, header_written: &str| Answer {
        status_line: "HTTP/1.1 200 OK".into(),
        headers: vec![
            ("content-type".into(), "application/json".into()),
            ("etag".into(), "\"3-0000000a\"".into()),
            ("last-modified".into(), header_written.into()),
            ("x-request-id".into(), id.into()),
            ("date".into(), date.into()),
        ],
        body: format!("{{\"@last-modified\":\"{written}\",\"request_id\":\"{id}\"}}").into_bytes(),
    };
    let transcript = |a: Answer| Transcript {
        answers: vec![a],
        rest: Vec::new(),
        closed: false,
        timed_out: false,
    };
    let base = || {
        transcript(answer(
            "Thu, 26 Nov 2026 23:00:24 GMT",
            "0123456789abcdef",
            "2026-11-26T23:00:23.379Z",
            "Thu, 26 Nov 2026 23:00:23 GMT",
        ))
    };
    // What may differ: the date, a made-up id, a write time a little apart.
    let mut a = base();
    let mut b = transcript(answer(
        "Thu, 26 Nov 2026 23:00:25 GMT",
        "fedcba9876543210",
        "2026-11-26T23:00:24.002Z",
        "Thu, 26 Nov 2026 23:00:24 GMT",
    ));
    normalise(&mut a, &mut b);
    assert_eq!(differences(&a, &b), Vec::<String>::new());

    // Anything else is a difference.
    type Change = Box<dyn Fn(&mut Transcript)>;
    let changes: Vec<(&str, Change)> = vec![
        (
            "the status line",
            Box::new(|t| t.answers[0].status_line = "HTTP/1.1 200 Ok".into()),
        ),
        (
            "a header value",
            Box::new(|t| t.answers[0].headers[1].1 = "\"3-0000000b\"".into()),
        ),
        (
            "a header name's case",
            Box::new(|t| t.answers[0].headers[0].0 = "Content-Type".into()),
        ),
        (
            "a duplicate header",
            Box::new(|t| {
                t.answers[0]
                    .headers
                    .push(("content-type".into(), "application/json".into()))
            }),
        ),
        (
            "a missing header",
            Box::new(|t| {
                t.answers[0].headers.remove(0);
            }),
        ),
        ("a body byte", Box::new(|t| t.answers[0].body[1] = b'\'')),
        (
            "a presented id",
            Box::new(|t| t.answers[0].headers[3].1 = "r-1".into()),
        ),
        (
            "a write time an hour apart",
            Box::new(|t| t.answers[0].headers[2].1 = "Thu, 26 Nov 2026 22:00:23 GMT".into()),
        ),
        (
            "a body's write time an hour apart",
            Box::new(|t| {
                let body = String::from_utf8(t.answers[0].body.clone()).unwrap();
                t.answers[0].body = body.replace("23:00:23.379Z", "22:00:23.379Z").into_bytes();
            }),
        ),
        (
            "one answer more",
            Box::new(|t| t.answers.push(t.answers[0].clone())),
        ),
        ("the close", Box::new(|t| t.closed = true)),
        ("bytes left over", Box::new(|t| t.rest = b"H".to_vec())),
    ];
    for (what, change) in changes {
        let mut a = base();
        let mut b = base();
        change(&mut b);
        normalise(&mut a, &mut b);
        assert!(!differences(&a, &b).is_empty(), "{what} went unseen");
    }
}

// ---------------------------------------------------------------------------
// Divergences found, not by design: each asserts that the two answer alike, so
// each fails until the server is fixed (or the difference is documented as
// intended and moved to the checks above). Run them with `-- --ignored`.
// ---------------------------------------------------------------------------

/// `PUT /dbs/x/docs/cut1` with `Content-Length: 10` and 5 bytes of it, then
/// nothing: both answer 408 `request_timeout` and close, but the own loop's
/// answer says `connection: close` and hyper's does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kept: the own loop says connection: close when it closes after a 408 (RFC 9112 9.6); hyper closes without saying so"]
async fn a_body_that_stops_coming() {
    shapes_diverging_as("a_body_that_stops_coming").await;
}

/// The same, then the client half-closes: both answer 400 `body_read_failed`
/// and close, but with other messages ("the connection ended after 5 of 10
/// bytes" / "error reading a body from connection"), so other lengths, and only
/// the own loop's says `connection: close`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kept: the own loop names how many bytes came and says connection: close; hyper's message is generic"]
async fn a_body_cut_by_the_end_of_the_stream() {
    shapes_diverging_as("a_body_cut_by_the_end_of_the_stream").await;
}

/// A write refused before its body is read (404 `database_not_found`, 413
/// `body_too_large` for a length over the limit) when not all of the body has
/// arrived: both answer alike and close, but only the own loop's answer says
/// `connection: close`. (When the rest of the body arrives while hyper's handler
/// runs, hyper even keeps the connection, where the own loop, which decides on
/// what it has read, closes it: see `UNREAD_BODY_BYTES`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kept: the own loop says connection: close when it will not read the rest of a refused body"]
async fn a_refused_write_with_part_of_its_body() {
    shapes_diverging_as("a_refused_write_with_part_of_its_body").await;
}

/// `Content-Length: 18446744073709551614` (or ...615): hyper refuses a length
/// past `u64::MAX - 2` while parsing the head, with an empty 431; the own loop
/// takes it and answers 413 `body_too_large` in JSON (401 first with
/// authentication on; tests/server/own_http1.rs asserts those on the own loop).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kept: a Content-Length past u64::MAX - 2 is a 413 body_too_large in JSON; hyper's empty 431 is the odd one"]
async fn a_content_length_hyper_refuses() {
    shapes_diverging_as("a_content_length_hyper_refuses").await;
}

/// `PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n` (an HTTP/2 client with prior knowledge):
/// hyper closes the connection without an answer; the own loop answers an
/// HTTP/1.1 JSON 400 ("not an HTTP/1.x request"). `Parsed::Malformed` documents
/// a JSON 400 where hyper sends an empty 400, not where hyper sends nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kept: the own loop answers the HTTP/2 preface with a JSON 400 that says HTTP/1.x; hyper closes without an answer"]
async fn the_http2_preface() {
    shapes_diverging_as("the_http2_preface").await;
}
