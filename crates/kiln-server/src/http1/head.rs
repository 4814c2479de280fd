//! Parsing a request head in the connection's buffer, and deciding whether the
//! connection's own loop serves it (one document's GET, PUT, POST or PATCH in
//! plain HTTP/1.1) or hands the connection to hyper.

use crate::cross_origin::FrontLayers;
use crate::doc_request::{document_target, DocMethod};
use crate::http_util::HeaderLookup;
use std::ops::Range;

/// Most headers a request may have and still be served here; more go to hyper,
/// which applies its own limit.
const MAX_HEADERS: usize = 32;

/// The longest request target `http::Uri` accepts (longer ones get 414 from hyper).
const MAX_PATH_BYTES: usize = u16::MAX as usize - 1;

/// A byte `http::Uri` takes in a path as it is: not `?` (a query), not `#` (a
/// fragment, which it cuts off), not `<`, `>` or a backtick (which it refuses), and
/// ASCII only (it checks other bytes as UTF-8 first).
fn plain_path_byte(b: u8) -> bool {
    matches!(b, 0x21 | 0x22 | 0x24..=0x3B | 0x3D | 0x40..=0x5F | 0x61..=0x7E)
}

/// A document request whose head is parsed; its parts are ranges of the
/// connection's buffer, so parsing allocates nothing and the buffer may grow
/// (reallocate) while the body arrives.
#[derive(Debug)]
pub struct DocHead {
    pub method: DocMethod,
    pub db: Range<usize>,
    pub id: Range<usize>,
    /// Bytes of the head, up to and including the blank line.
    pub head_len: usize,
    pub content_length: usize,
    /// The client asked to close the connection after this request.
    pub close: bool,
    if_match: Option<Range<usize>>,
    if_none_match: Option<Range<usize>>,
    if_modified_since: Option<Range<usize>>,
    authorization: Option<Range<usize>>,
    x_api_key: Option<Range<usize>>,
    x_request_id: Option<Range<usize>>,
    content_type: Option<Range<usize>>,
}

// The head lives on the stack: boxing it would allocate once per request on the
// own loop's hot path, to save bytes of a value that is matched at once.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Parsed {
    /// The head is not complete yet.
    Partial,
    /// Served here.
    Document(DocHead),
    /// Anything else: hyper and the router answer it.
    Other,
    /// A head that does not parse, or a request target `http::Uri` refuses:
    /// answered here with a JSON 400 (hyper would send an empty one), and the
    /// connection closed.
    Malformed(&'static str),
}

/// Parses the head at the start of `buf`; `front` says which requests the
/// router's layers would answer otherwise.
pub fn parse(buf: &[u8], front: &FrontLayers) -> Parsed {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        // Too many headers is hyper's to answer (it takes more than we parse).
        Err(httparse::Error::TooManyHeaders) => return Parsed::Other,
        Err(e) => return Parsed::Malformed(malformed_reason(e)),
    };
    let (method, db, id) = match document_line(&req) {
        Ok(line) => line,
        Err(parsed) => return parsed,
    };
    let range_of = |part: &[u8]| {
        let start = part.as_ptr() as usize - buf.as_ptr() as usize;
        start..start + part.len()
    };
    let mut head = DocHead {
        method,
        db: range_of(db.as_bytes()),
        id: range_of(id.as_bytes()),
        head_len,
        content_length: 0,
        close: false,
        if_match: None,
        if_none_match: None,
        if_modified_since: None,
        authorization: None,
        x_api_key: None,
        x_request_id: None,
        content_type: None,
    };
    let content_length = match read_headers(front, &mut head, req.headers, range_of) {
        Ok(length) => length,
        Err(parsed) => return parsed,
    };
    match (method, content_length) {
        (DocMethod::Get, None | Some(0)) => {}
        // A GET with a body is unusual enough to leave to hyper.
        (DocMethod::Get, Some(_)) => return Parsed::Other,
        (_, Some(n)) => head.content_length = n,
        // A write without a length: hyper reads it as an empty body.
        (_, None) => return Parsed::Other,
    }
    Parsed::Document(head)
}

/// The request line of a document request this loop serves: its method, database
/// and id (`Err` says what else it is).
fn document_line<'b>(
    req: &httparse::Request<'_, 'b>,
) -> Result<(DocMethod, &'b str, &'b str), Parsed> {
    // HTTP/1.0 (no keep-alive by default, no chunked) is hyper's.
    if req.version != Some(1) {
        return Err(Parsed::Other);
    }
    let Some(method) = req.method.and_then(DocMethod::from_name) else {
        return Err(Parsed::Other);
    };
    let Some(path) = req.path else {
        return Err(Parsed::Other);
    };
    // A query or a fragment, bytes that `http::Uri` refuses or would need to check
    // (non-ASCII), a path longer than it takes: hyper answers those as it did.
    if path.len() > MAX_PATH_BYTES {
        return Err(Parsed::Other);
    }
    if !path.bytes().all(plain_path_byte) {
        if axum::http::uri::PathAndQuery::try_from(path).is_err() && path.starts_with('/') {
            return Err(Parsed::Malformed(
                "the request target has characters a URL cannot hold as they are: percent-encode them",
            ));
        }
        return Err(Parsed::Other);
    }
    let Some((db, id)) = document_target(path) else {
        return Err(Parsed::Other);
    };
    // POST to a whole id is refused by the router's POST handler (405).
    if method == DocMethod::Post && !id.ends_with('/') {
        return Err(Parsed::Other);
    }
    Ok((method, db, id))
}

/// Reads the headers this loop needs into `head`; the Content-Length if any, or
/// `Err` when a header makes the request hyper's or the router's.
fn read_headers(
    front: &FrontLayers,
    head: &mut DocHead,
    headers: &[httparse::Header<'_>],
    range_of: impl Fn(&[u8]) -> Range<usize>,
) -> Result<Option<usize>, Parsed> {
    let mut content_length: Option<usize> = None;
    for h in headers {
        let name = h.name;
        let value = h.value;
        if name.eq_ignore_ascii_case("content-length") {
            // Two lengths, or one that is not plain digits: hyper refuses it.
            if content_length.is_some() || value.is_empty() || !value.iter().all(u8::is_ascii_digit)
            {
                return Err(Parsed::Other);
            }
            match std::str::from_utf8(value).ok().and_then(|v| v.parse().ok()) {
                Some(n) => content_length = Some(n),
                None => return Err(Parsed::Other),
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding")
            || name.eq_ignore_ascii_case("expect")
            || name.eq_ignore_ascii_case("upgrade")
        {
            // Chunked bodies, 100-continue and upgrades are hyper's.
            return Err(Parsed::Other);
        } else if front.header_changes_answer(name, value) {
            // The router's CORS or compression layer would change the answer.
            return Err(Parsed::Other);
        } else if name.eq_ignore_ascii_case("connection") {
            let v = String::from_utf8_lossy(value).to_ascii_lowercase();
            if v.contains("upgrade") {
                return Err(Parsed::Other);
            }
            head.close |= v.split(',').any(|t| t.trim() == "close");
        } else {
            let slot = if name.eq_ignore_ascii_case("if-match") {
                &mut head.if_match
            } else if name.eq_ignore_ascii_case("if-none-match") {
                &mut head.if_none_match
            } else if name.eq_ignore_ascii_case("if-modified-since") {
                &mut head.if_modified_since
            } else if name.eq_ignore_ascii_case("authorization") {
                &mut head.authorization
            } else if name.eq_ignore_ascii_case("x-api-key") {
                &mut head.x_api_key
            } else if name.eq_ignore_ascii_case("x-request-id") {
                &mut head.x_request_id
            } else if name.eq_ignore_ascii_case("content-type") {
                &mut head.content_type
            } else {
                continue;
            };
            // The first value counts, as `HeaderMap::get` has it.
            if slot.is_none() {
                *slot = Some(range_of(value));
            }
        }
    }
    Ok(content_length)
}

fn malformed_reason(e: httparse::Error) -> &'static str {
    match e {
        httparse::Error::Version => "not an HTTP/1.x request (or plain HTTP sent to a TLS port)",
        httparse::Error::Token => "a method or header name that is not an HTTP token",
        httparse::Error::HeaderName => "an invalid header name",
        httparse::Error::HeaderValue => "an invalid header value",
        _ => "a request head that does not parse as HTTP/1.1",
    }
}

/// The header values of a parsed head, read from the buffer it was parsed from.
pub struct HeadHeaders<'b> {
    pub head: &'b DocHead,
    pub buf: &'b [u8],
}

impl HeaderLookup for HeadHeaders<'_> {
    fn first(&self, name: &str) -> Option<&[u8]> {
        let range = match name {
            "if-match" => &self.head.if_match,
            "if-none-match" => &self.head.if_none_match,
            "if-modified-since" => &self.head.if_modified_since,
            "authorization" => &self.head.authorization,
            "x-api-key" => &self.head.x_api_key,
            "x-request-id" => &self.head.x_request_id,
            "content-type" => &self.head.content_type,
            _ => return None,
        };
        range.clone().map(|r| &self.buf[r])
    }
}

impl DocHead {
    pub fn db<'b>(&self, buf: &'b [u8]) -> &'b str {
        // The ranges came from `&str`s of this buffer.
        std::str::from_utf8(&buf[self.db.clone()]).unwrap_or_default()
    }

    pub fn id<'b>(&self, buf: &'b [u8]) -> &'b str {
        std::str::from_utf8(&buf[self.id.clone()]).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(raw: &str) -> DocHead {
        match parse(raw.as_bytes(), &FrontLayers::default()) {
            Parsed::Document(h) => h,
            other => panic!("{raw:?} parsed as {other:?}"),
        }
    }

    fn is_other(raw: &str) -> bool {
        matches!(
            parse(raw.as_bytes(), &FrontLayers::default()),
            Parsed::Other
        )
    }

    #[test]
    fn document_requests_are_taken_with_their_headers() {
        let raw = "PUT /dbs/app/docs/users/7 HTTP/1.1\r\nHost: k\r\nIf-Match: \"3-0000000a\"\r\n\
                   X-Api-Key: key1\r\nContent-Length: 12\r\nConnection: keep-alive, Close\r\n\r\n{\"a\":1}";
        let h = doc(raw);
        let buf = raw.as_bytes();
        assert_eq!(h.method, DocMethod::Put);
        assert_eq!((h.db(buf), h.id(buf)), ("app", "users/7"));
        assert_eq!(h.content_length, 12);
        assert!(h.close);
        assert_eq!(&buf[h.head_len..], b"{\"a\":1}");
        let headers = HeadHeaders { head: &h, buf };
        assert_eq!(headers.first("if-match"), Some(&b"\"3-0000000a\""[..]));
        assert_eq!(headers.first("x-api-key"), Some(&b"key1"[..]));
        assert_eq!(headers.first("authorization"), None);
        assert_eq!(headers.first("if-none-match"), None);

        let h = doc("GET /dbs/a/docs/x HTTP/1.1\r\nif-none-match: \"1-2\"\r\nif-none-match: \"9-9\"\r\n\r\n");
        assert_eq!(h.method, DocMethod::Get);
        assert!(!h.close);
        assert_eq!(h.content_length, 0);
        let buf = b"GET /dbs/a/docs/x HTTP/1.1\r\nif-none-match: \"1-2\"\r\nif-none-match: \"9-9\"\r\n\r\n";
        let headers = HeadHeaders { head: &h, buf };
        assert_eq!(headers.first("if-none-match"), Some(&b"\"1-2\""[..]));
    }

    /// Heads built from likely and unlikely pieces (methods, versions, paths with
    /// any byte, header names that matter, odd values, LF-only lines), sometimes with
    /// bytes flipped or cut: parsing never panics, a head served here has ranges
    /// inside it that agree with `document_target`, its length and flags agree with
    /// its headers, and every shorter prefix of it is `Partial`.
    mod properties {
        use super::super::*;
        use proptest::prelude::*;
        use proptest::test_runner::TestCaseError;

        fn method() -> impl Strategy<Value = String> {
            prop_oneof![
                3 => Just("GET".to_string()),
                3 => Just("PUT".to_string()),
                2 => Just("POST".to_string()),
                1 => Just("DELETE".to_string()),
                1 => "[A-Z]{1,7}",
            ]
        }

        fn path() -> impl Strategy<Value = Vec<u8>> {
            (
                proptest::collection::vec(any::<u8>(), 0..6),
                proptest::collection::vec(any::<u8>(), 0..10),
                prop::bool::weighted(0.85),
            )
                .prop_map(|(db, id, well_formed)| {
                    // Mostly bytes a path may hold as they are, now and then any byte.
                    const PLAIN: &[u8] = b"abcXYZ019-_.~!$&'()*+,;=:@/{}|\"%?#<>`";
                    let mut p = Vec::new();
                    if well_formed {
                        p.extend_from_slice(b"/dbs/");
                        p.extend(db.iter().map(|b| b'a' + b % 26));
                        p.extend_from_slice(b"/docs/");
                        p.push(b'x');
                        p.extend(id.iter().map(|&b| match PLAIN.get(usize::from(b)) {
                            Some(&plain) => plain,
                            None if b < 230 => PLAIN[usize::from(b) % 6],
                            None => b,
                        }));
                    } else {
                        p.push(b'/');
                        p.extend_from_slice(&db);
                        p.extend_from_slice(&id);
                    }
                    p
                })
        }

        fn header() -> impl Strategy<Value = Vec<u8>> {
            let name = prop_oneof![
                1 => Just("Content-Length"),
                3 => Just("Connection"),
                3 => Just("If-Match"),
                3 => Just("If-None-Match"),
                3 => Just("Authorization"),
                3 => Just("X-Api-Key"),
                1 => Just("Transfer-Encoding"),
                1 => Just("Expect"),
                6 => Just("Host"),
            ];
            let value = prop_oneof![
                (0u64..100_000).prop_map(|n| n.to_string().into_bytes()),
                Just(b"close".to_vec()),
                Just(b"keep-alive, Close".to_vec()),
                Just(b"upgrade".to_vec()),
                proptest::collection::vec(any::<u8>(), 0..12),
            ];
            (name, value).prop_map(|(n, v)| {
                let mut h = n.as_bytes().to_vec();
                h.extend_from_slice(b": ");
                h.extend_from_slice(&v);
                h
            })
        }

        fn head() -> impl Strategy<Value = Vec<u8>> {
            (
                method(),
                path(),
                prop_oneof![8 => Just("HTTP/1.1"), 1 => Just("HTTP/1.0"), 1 => Just("HTTP/2")],
                proptest::collection::vec(header(), 0..5),
                prop::option::weighted(0.8, 0u64..100_000),
                any::<bool>(),
                prop_oneof![
                    3 => Just(Vec::new()),
                    1 => proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..3),
                ],
                proptest::collection::vec(any::<u8>(), 0..8),
            )
                .prop_map(|(m, p, v, mut headers, length, lf_only, flips, body)| {
                    if let Some(n) = length.filter(|_| m != "GET") {
                        headers.push(format!("content-length: {n}").into_bytes());
                    }
                    let eol: &[u8] = if lf_only { b"\n" } else { b"\r\n" };
                    let mut raw = m.into_bytes();
                    raw.push(b' ');
                    raw.extend_from_slice(&p);
                    raw.push(b' ');
                    raw.extend_from_slice(v.as_bytes());
                    raw.extend_from_slice(eol);
                    for h in headers {
                        raw.extend_from_slice(&h);
                        raw.extend_from_slice(eol);
                    }
                    raw.extend_from_slice(eol);
                    raw.extend_from_slice(&body);
                    for (at, b) in flips {
                        let i = at.index(raw.len());
                        raw[i] = b;
                    }
                    raw
                })
        }

        fn check(raw: &[u8]) -> Result<bool, TestCaseError> {
            let Parsed::Document(h) = parse(raw, &FrontLayers::default()) else {
                return Ok(false);
            };
            prop_assert!(h.head_len <= raw.len());
            for r in [&h.db, &h.id] {
                prop_assert!(
                    r.start < r.end && r.end <= h.head_len,
                    "{r:?} in {}",
                    h.head_len
                );
            }
            let line_end = raw.iter().position(|&b| b == b'\n').unwrap_or(raw.len());
            let line = std::str::from_utf8(&raw[..line_end]).unwrap_or_default();
            let target = line.split(' ').nth(1).unwrap_or_default();
            prop_assert_eq!(
                crate::doc_request::document_target(target),
                Some((h.db(raw), h.id(raw)))
            );
            prop_assert!(line.starts_with(h.method.as_str()));
            if h.method == DocMethod::Get {
                prop_assert_eq!(h.content_length, 0);
            }
            for cut in 0..h.head_len {
                prop_assert!(
                    matches!(parse(&raw[..cut], &FrontLayers::default()), Parsed::Partial),
                    "cut at {} of {:?}",
                    cut,
                    String::from_utf8_lossy(raw)
                );
            }
            Ok(true)
        }

        #[test]
        fn parsing_any_head_is_safe_and_consistent() {
            use proptest::test_runner::{Config, TestRunner};
            let served = std::cell::Cell::new(0u32);
            let mut runner = TestRunner::new(Config {
                cases: 3000,
                failure_persistence: None,
                ..Config::default()
            });
            runner
                .run(&head(), |raw| {
                    served.set(served.get() + u32::from(check(&raw)?));
                    Ok(())
                })
                .unwrap();
            // Not vacuous: a good share of the heads are served by the own loop.
            // (POSTs to a whole id, a third of the POSTs, are the router's.)
            assert!(
                served.get() > 200,
                "only {} of 3000 heads served here",
                served.get()
            );
        }
    }

    #[test]
    fn a_head_in_pieces_is_partial_until_the_blank_line() {
        let raw = b"GET /dbs/a/docs/x HTTP/1.1\r\nHost: k\r\n\r\n";
        for cut in 0..raw.len() {
            assert!(
                matches!(parse(&raw[..cut], &FrontLayers::default()), Parsed::Partial),
                "cut at {cut}"
            );
        }
        assert!(matches!(
            parse(raw, &FrontLayers::default()),
            Parsed::Document(_)
        ));
    }

    #[test]
    fn everything_else_goes_to_hyper() {
        for raw in [
            "GET /dbs/a/docs/x HTTP/1.0\r\n\r\n",
            "DELETE /dbs/a/docs/x HTTP/1.1\r\n\r\n",
            "HEAD /dbs/a/docs/x HTTP/1.1\r\n\r\n",
            "GET /dbs/a/docs/x?y=1 HTTP/1.1\r\n\r\n",
            "GET /dbs/a/docs/x#frag HTTP/1.1\r\n\r\n",
            "GET /dbs/a/docs/a%20b HTTP/1.1\r\n\r\n",
            "GET /dbs/a HTTP/1.1\r\n\r\n",
            "GET /health HTTP/1.1\r\n\r\n",
            "GET http://k/dbs/a/docs/x HTTP/1.1\r\n\r\n",
            "GET /dbs/a/docs/x HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
            "PUT /dbs/a/docs/x HTTP/1.1\r\n\r\n",
            "PUT /dbs/a/docs/x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            "PUT /dbs/a/docs/x HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}",
            "PUT /dbs/a/docs/x HTTP/1.1\r\nContent-Length: +2\r\n\r\n{}",
            "PUT /dbs/a/docs/x HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n",
            "PUT /dbs/a/docs/x HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n",
            "GET /dbs/a/docs/x HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
            // What the router's compression layer may change, and a POST to a
            // whole id (the router's 405).
            "GET /dbs/a/docs/x HTTP/1.1\r\nAccept-Encoding: gzip, br\r\n\r\n",
            "POST /dbs/a/docs/users/ada HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",
        ] {
            assert!(is_other(raw), "{raw:?} should go to hyper");
        }
        // An Origin is the CORS layer's when there is one, and changes nothing
        // when there is none.
        let origin = "GET /dbs/a/docs/x HTTP/1.1\r\nOrigin: https://app.example\r\n\r\n";
        doc(origin);
        let cors = FrontLayers {
            cors_origins: vec!["https://app.example".into()],
        };
        assert!(matches!(parse(origin.as_bytes(), &cors), Parsed::Other));
        // Stays here: an encoding that changes nothing.
        doc("GET /dbs/a/docs/x HTTP/1.1\r\nAccept-Encoding: identity\r\n\r\n");
        assert!(is_other(
            "PUT /dbs/a/docs/x HTTP/1.1\r\nAccept-Encoding: gzip\r\nContent-Length: 2\r\n\r\n{}"
        ));
        doc("POST /dbs/a/docs/users/ HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}");
        // Heads hyper would answer with an empty 400 get a JSON one here.
        for raw in [
            "PUT /dbs/a/docs/x<y> HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",
            "GET /dbs/a/docs/x`y HTTP/1.1\r\n\r\n",
            "GET /dbs/x/changes?since=1-<incarnation> HTTP/1.1\r\n\r\n",
            "GARBAGE\r\n\r\n",
            "GET /dbs/a/docs/x HTTP/1.1\r\nBad Header\r\n\r\n",
        ] {
            assert!(
                matches!(
                    parse(raw.as_bytes(), &FrontLayers::default()),
                    Parsed::Malformed(_)
                ),
                "{raw:?} should be answered 400 here"
            );
        }
        let non_ascii = "GET /dbs/a/docs/caf\u{e9} HTTP/1.1\r\n\r\n";
        assert!(is_other(non_ascii), "non-ASCII paths are hyper's");
        let long = format!(
            "GET /dbs/a/docs/{} HTTP/1.1\r\n\r\n",
            "x".repeat(MAX_PATH_BYTES)
        );
        assert!(
            is_other(&long),
            "a target over http's limit is hyper's (414)"
        );
        let odd = doc("GET /dbs/a/docs/{\"k\"}!|~$ HTTP/1.1\r\n\r\n");
        assert_eq!(
            odd.id(b"GET /dbs/a/docs/{\"k\"}!|~$ HTTP/1.1\r\n\r\n"),
            "{\"k\"}!|~$"
        );
        let many = format!(
            "GET /dbs/a/docs/x HTTP/1.1\r\n{}\r\n",
            "x-h: 1\r\n".repeat(MAX_HEADERS + 1)
        );
        assert!(is_other(&many));
    }
}
