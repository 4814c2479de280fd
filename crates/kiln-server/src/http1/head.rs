//! Parsing a request head in the connection's buffer, and deciding whether the
//! connection's own loop serves it (one document's GET, PUT or POST in plain
//! HTTP/1.1) or hands the connection to hyper.

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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DocMethod {
    Get,
    Put,
    Post,
}

impl DocMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            DocMethod::Get => "GET",
            DocMethod::Put => "PUT",
            DocMethod::Post => "POST",
        }
    }
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
    authorization: Option<Range<usize>>,
    x_api_key: Option<Range<usize>>,
}

#[derive(Debug)]
pub enum Parsed {
    /// The head is not complete yet.
    Partial,
    /// Served here.
    Document(DocHead),
    /// Anything else, including a malformed head: hyper answers it as before.
    Other,
}

pub fn parse(buf: &[u8]) -> Parsed {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(_) => return Parsed::Other,
    };
    // HTTP/1.0 (no keep-alive by default, no chunked) is hyper's.
    if req.version != Some(1) {
        return Parsed::Other;
    }
    let method = match req.method {
        Some("GET") => DocMethod::Get,
        Some("PUT") => DocMethod::Put,
        Some("POST") => DocMethod::Post,
        _ => return Parsed::Other,
    };
    let Some(path) = req.path else {
        return Parsed::Other;
    };
    // A query or a fragment, bytes that `http::Uri` refuses or would need to check
    // (non-ASCII), a path longer than it takes: hyper answers those as it did.
    if path.len() > MAX_PATH_BYTES || !path.bytes().all(plain_path_byte) {
        return Parsed::Other;
    }
    let Some((db, id)) = crate::app::document_target(path) else {
        return Parsed::Other;
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
        authorization: None,
        x_api_key: None,
    };
    let mut content_length: Option<usize> = None;
    for h in req.headers.iter() {
        let name = h.name;
        let value = h.value;
        if name.eq_ignore_ascii_case("content-length") {
            // Two lengths, or one that is not plain digits: hyper refuses it.
            if content_length.is_some() || value.is_empty() || !value.iter().all(u8::is_ascii_digit)
            {
                return Parsed::Other;
            }
            match std::str::from_utf8(value).ok().and_then(|v| v.parse().ok()) {
                Some(n) => content_length = Some(n),
                None => return Parsed::Other,
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding")
            || name.eq_ignore_ascii_case("expect")
            || name.eq_ignore_ascii_case("upgrade")
        {
            // Chunked bodies, 100-continue and upgrades are hyper's.
            return Parsed::Other;
        } else if name.eq_ignore_ascii_case("connection") {
            let v = String::from_utf8_lossy(value).to_ascii_lowercase();
            if v.contains("upgrade") {
                return Parsed::Other;
            }
            head.close |= v.split(',').any(|t| t.trim() == "close");
        } else {
            let slot = if name.eq_ignore_ascii_case("if-match") {
                &mut head.if_match
            } else if name.eq_ignore_ascii_case("if-none-match") {
                &mut head.if_none_match
            } else if name.eq_ignore_ascii_case("authorization") {
                &mut head.authorization
            } else if name.eq_ignore_ascii_case("x-api-key") {
                &mut head.x_api_key
            } else {
                continue;
            };
            // The first value counts, as `HeaderMap::get` has it.
            if slot.is_none() {
                *slot = Some(range_of(value));
            }
        }
    }
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
            "authorization" => &self.head.authorization,
            "x-api-key" => &self.head.x_api_key,
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
        match parse(raw.as_bytes()) {
            Parsed::Document(h) => h,
            other => panic!("{raw:?} parsed as {other:?}"),
        }
    }

    fn is_other(raw: &str) -> bool {
        matches!(parse(raw.as_bytes()), Parsed::Other)
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

    #[test]
    fn a_head_in_pieces_is_partial_until_the_blank_line() {
        let raw = b"GET /dbs/a/docs/x HTTP/1.1\r\nHost: k\r\n\r\n";
        for cut in 0..raw.len() {
            assert!(
                matches!(parse(&raw[..cut]), Parsed::Partial),
                "cut at {cut}"
            );
        }
        assert!(matches!(parse(raw), Parsed::Document(_)));
    }

    #[test]
    fn everything_else_goes_to_hyper() {
        for raw in [
            "GET /dbs/a/docs/x HTTP/1.0\r\n\r\n",
            "DELETE /dbs/a/docs/x HTTP/1.1\r\n\r\n",
            "HEAD /dbs/a/docs/x HTTP/1.1\r\n\r\n",
            "GET /dbs/a/docs/x?y=1 HTTP/1.1\r\n\r\n",
            "GET /dbs/a/docs/x#frag HTTP/1.1\r\n\r\n",
            "PUT /dbs/a/docs/x<y> HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",
            "GET /dbs/a/docs/x`y HTTP/1.1\r\n\r\n",
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
            "GARBAGE\r\n\r\n",
            "GET /dbs/a/docs/x HTTP/1.1\r\nBad Header\r\n\r\n",
        ] {
            assert!(is_other(raw), "{raw:?} should go to hyper");
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
