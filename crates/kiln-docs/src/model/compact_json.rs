//! A fast path for the common document body: JSON whose compact form is already
//! what parsing it into a `serde_json::Value` and serializing that again would give,
//! apart from insignificant whitespace.
//!
//! `PreparedDoc::parse` stores a body as `serde_json::to_vec(&value)`. Building the
//! `Value` (a map, a `String` per key, string and number) only to write it out
//! again is most of a PUT's parsing cost. [`compact`] scans the text once,
//! validating it and copying it without whitespace, and gives up (`None`) on
//! anything where the round trip through a `Value` could write something else:
//!
//! - a key repeated in an object (a `Value` keeps one),
//! - a string escape that `serde_json` would not write that way (`\/`, `\u0041`,
//!   `\u00e9`, upper-case hex...),
//! - a number with an exponent (`1E5` comes back as `1e+5`),
//! - a top-level `@metadata` key (the caller splits it off),
//! - anything that is not a JSON object, or not valid JSON at all.
//!
//! On `None` the caller takes the `Value` path, which also words the errors: the
//! fast path never decides that input is invalid, it only declines it.

/// The compact text of `input`, a JSON object, or `None` (see the module doc).
pub(crate) fn compact(input: &[u8]) -> Option<Vec<u8>> {
    // Outside strings only ASCII is valid JSON; inside, strings must be UTF-8.
    std::str::from_utf8(input).ok()?;
    let mut s = Scanner {
        input,
        pos: 0,
        out: Vec::with_capacity(input.len()),
    };
    s.skip_ws();
    if s.peek()? != b'{' {
        return None;
    }
    s.value(0)?;
    s.skip_ws();
    (s.pos == input.len()).then_some(s.out)
}

/// Nesting deeper than this is left to `serde_json` (whose own limit is 128).
const MAX_DEPTH: usize = 100;

/// Keys of one object compared pairwise at most; a larger object takes the slow
/// path (a duplicate check would need a set).
const MAX_KEYS: usize = 64;

struct Scanner<'a> {
    input: &'a [u8],
    pos: usize,
    out: Vec<u8>,
}

impl<'a> Scanner<'a> {
    fn peek(&self) -> Option<u8> {
        self.input.get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    fn value(&mut self, depth: usize) -> Option<()> {
        match self.peek()? {
            b'{' => self.object(depth + 1),
            b'[' => self.array(depth + 1),
            b'"' => self.string().map(|_| ()),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        if self.input[self.pos..].starts_with(word) {
            self.out.extend_from_slice(word);
            self.pos += word.len();
            Some(())
        } else {
            None
        }
    }

    fn object(&mut self, depth: usize) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.pos += 1;
        self.out.push(b'{');
        self.skip_ws();
        if self.peek()? == b'}' {
            self.pos += 1;
            self.out.push(b'}');
            return Some(());
        }
        let mut keys: Vec<&'a [u8]> = Vec::new();
        loop {
            if self.peek()? != b'"' {
                return None;
            }
            let key = self.string()?;
            // In canonical form equal keys are equal bytes.
            if keys.len() >= MAX_KEYS
                || keys.contains(&key)
                || (depth == 1 && key == b"\"@metadata\"")
            {
                return None;
            }
            keys.push(key);
            self.skip_ws();
            if self.peek()? != b':' {
                return None;
            }
            self.pos += 1;
            self.out.push(b':');
            self.skip_ws();
            self.value(depth)?;
            if self.comma_or_close(b'}')? {
                return Some(());
            }
        }
    }

    fn array(&mut self, depth: usize) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.pos += 1;
        self.out.push(b'[');
        self.skip_ws();
        if self.peek()? == b']' {
            self.pos += 1;
            self.out.push(b']');
            return Some(());
        }
        loop {
            self.value(depth)?;
            if self.comma_or_close(b']')? {
                return Some(());
            }
        }
    }

    /// After a member or element: copies a `,` (false: more follow) or `close`
    /// (true: the container ended); anything else is not for the fast path.
    fn comma_or_close(&mut self, close: u8) -> Option<bool> {
        self.skip_ws();
        let b = self.peek()?;
        if b != b',' && b != close {
            return None;
        }
        self.pos += 1;
        self.out.push(b);
        if b == b',' {
            self.skip_ws();
        }
        Some(b == close)
    }

    /// A string (at `"`) copied as it is when every escape in it is the one
    /// `serde_json` writes; returns its text, quotes included.
    fn string(&mut self) -> Option<&'a [u8]> {
        let start = self.pos;
        let input = self.input;
        let mut i = start + 1;
        loop {
            // Plain characters: the bulk of a string.
            while let Some(&b) = input.get(i) {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                i += 1;
            }
            match *input.get(i)? {
                b'"' => break,
                b'\\' => {
                    match *input.get(i + 1)? {
                        b'"' | b'\\' | b'b' | b'f' | b'n' | b'r' | b't' => i += 2,
                        b'u' => {
                            let hex = input.get(i + 2..i + 6)?;
                            // serde_json writes `\u00XX` (lower-case hex) only for
                            // the control characters without a short escape.
                            let lower_hex =
                                |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
                            if hex[0] != b'0'
                                || hex[1] != b'0'
                                || !matches!(hex[2], b'0' | b'1')
                                || !lower_hex(hex[3])
                            {
                                return None;
                            }
                            let code = (hex[2] - b'0') * 16
                                + if hex[3].is_ascii_digit() {
                                    hex[3] - b'0'
                                } else {
                                    hex[3] - b'a' + 10
                                };
                            if matches!(code, 0x08 | 0x09 | 0x0a | 0x0c | 0x0d) {
                                return None;
                            }
                            i += 6;
                        }
                        _ => return None,
                    }
                }
                // A raw control character is invalid JSON.
                _ => return None,
            }
        }
        let text = &input[start..=i];
        self.out.extend_from_slice(text);
        self.pos = i + 1;
        Some(text)
    }

    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?`; an exponent declines (see the module doc).
    fn number(&mut self) -> Option<()> {
        let input = self.input;
        let start = self.pos;
        let mut i = start;
        if input[i] == b'-' {
            i += 1;
        }
        let digits = |mut i: usize| {
            while input.get(i).is_some_and(u8::is_ascii_digit) {
                i += 1;
            }
            i
        };
        match *input.get(i)? {
            b'0' => i += 1,
            b'1'..=b'9' => i = digits(i + 1),
            _ => return None,
        }
        if input.get(i) == Some(&b'.') {
            let end = digits(i + 1);
            if end == i + 1 {
                return None;
            }
            i = end;
        }
        if matches!(input.get(i), Some(b'e' | b'E')) {
            return None;
        }
        self.out.extend_from_slice(&input[start..i]);
        self.pos = i;
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::compact;
    use proptest::prelude::*;
    use serde_json::Value;

    /// What the `Value` round trip stores, or None when it is not a JSON object.
    fn slow(input: &[u8]) -> Option<Vec<u8>> {
        match serde_json::from_slice::<Value>(input) {
            Ok(v @ Value::Object(_)) => Some(serde_json::to_vec(&v).unwrap()),
            _ => None,
        }
    }

    fn check(input: &str) {
        if let Some(fast) = compact(input.as_bytes()) {
            assert_eq!(
                Some(&fast),
                slow(input.as_bytes()).as_ref(),
                "input {input:?}: fast {:?}",
                String::from_utf8_lossy(&fast)
            );
        }
    }

    #[test]
    fn takes_canonical_and_spaced_objects() {
        for s in [
            r#"{}"#,
            r#" { } "#,
            r#"{"a":1}"#,
            r#"{"name":"user-1","age":1,"tags":["bench","w8"],"payload":"abc"}"#,
            "{\n  \"a\" : [ 1 , -0 , 0.5 , -12.500 , true , false , null ] ,\r\n\t\"b\": {\"c\": {}}}",
            "{\"s\":\"q\\\" b\\\\ n\\n r\\r t\\t b\\b f\\f c\\u001f d\\u0000 é 😀 \u{7f}\"}",
            r#"{"big":123456789012345678901234567890,"x":{"a":1,"b":{"a":2}}}"#,
            r#"{"@metadata2":1,"n":{"@metadata":{"x":1}}}"#,
        ] {
            assert!(compact(s.as_bytes()).is_some(), "declined {s:?}");
            check(s);
        }
    }

    #[test]
    fn declines_what_a_value_would_write_otherwise_and_invalid_input() {
        for s in [
            r#"{"a":1,"a":2}"#,
            r#"{"x":{"b":1,"b":2}}"#,
            r#"{"a":"\/"}"#,
            r#"{"a":"\u0041"}"#,
            r#"{"a":"\u00e9"}"#,
            r#"{"a":"\u001F"}"#,
            r#"{"a":"\u000a"}"#,
            r#"{"a":1e5}"#,
            r#"{"a":1.0E+2}"#,
            r#"{"@metadata":{"@collection":"c"}}"#,
            r#"[1,2]"#,
            r#""s""#,
            r#"{"a":01}"#,
            r#"{"a":1.}"#,
            r#"{"a":.5}"#,
            r#"{"a":+1}"#,
            r#"{"a":-}"#,
            r#"{"a":1,}"#,
            r#"{"a" 1}"#,
            r#"{a:1}"#,
            r#"{"a":tru}"#,
            r#"{"a":"unterminated}"#,
            "{\"a\":\"raw\ncontrol\"}",
            r#"{"a":1} x"#,
            r#"{"a":1}}"#,
            r#"{"a":[1,2}"#,
            "",
            "{",
        ] {
            assert!(compact(s.as_bytes()).is_none(), "took {s:?}");
        }
        assert!(compact(b"{\"a\":\"\xff\"}").is_none());
        let deep = "[".repeat(200) + &"]".repeat(200);
        assert!(compact(format!("{{\"a\":{deep}}}").as_bytes()).is_none());
    }

    /// JSON text built from pieces that stress the fast path's rules: repeated
    /// keys, every kind of escape, numbers with and without exponents, whitespace.
    fn json_text() -> impl Strategy<Value = String> {
        let ws = prop::sample::select(vec!["", " ", "\n", "\t ", "\r\n"]);
        let string = prop::collection::vec(
            prop::sample::select(vec![
                "a",
                "b",
                "é",
                "😀",
                "\\\"",
                "\\\\",
                "\\/",
                "\\n",
                "\\t",
                "\\b",
                "\\f",
                "\\r",
                "\\u0041",
                "\\u00e9",
                "\\u001f",
                "\\u001F",
                "\\u0000",
                "\\u000a",
                "\\ud83d\\ude00",
                "\u{7f}",
            ]),
            0..4,
        )
        .prop_map(|parts| format!("\"{}\"", parts.concat()));
        let number = prop::sample::select(vec![
            "0",
            "-0",
            "1",
            "-12",
            "0.5",
            "-0.250",
            "10",
            "1e5",
            "1E-2",
            "2.5e+3",
            "12345678901234567890123",
        ])
        .prop_map(str::to_string);
        let leaf = prop_oneof![
            string.clone(),
            number,
            prop::sample::select(vec!["true", "false", "null"]).prop_map(str::to_string),
        ];
        let key = prop::sample::select(vec![
            "\"a\"",
            "\"b\"",
            "\"@metadata\"",
            "\"\\u0061\"",
            "\"c\"",
        ]);
        let value = leaf.prop_recursive(4, 32, 4, move |inner| {
            prop_oneof![
                (prop::collection::vec((inner.clone(), ws.clone()), 0..4)).prop_map(|items| {
                    let body: Vec<String> = items
                        .into_iter()
                        .map(|(v, w)| format!("{w}{v}{w}"))
                        .collect();
                    format!("[{}]", body.join(","))
                }),
                (prop::collection::vec((key.clone(), inner, ws.clone()), 0..4)).prop_map(|items| {
                    let body: Vec<String> = items
                        .into_iter()
                        .map(|(k, v, w)| format!("{w}{k}{w}:{w}{v}{w}"))
                        .collect();
                    format!("{{{}}}", body.join(","))
                }),
            ]
        });
        value.prop_map(|v| format!("{{\"doc\":{v},\"n\":1}}"))
    }

    proptest! {
        #[test]
        fn whatever_it_takes_is_what_a_value_would_store(text in json_text()) {
            check(&text);
        }
    }
}
