//! The query language's lexer: words, strings, numbers, `$parameters` and
//! symbols, each with its byte offset, so that every error names a line and
//! column.

use crate::QueryError;
use crate::{DocError, Result};

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Tok {
    Word(String),
    Str(String),
    Num(String),
    Param(String),
    Sym(&'static str),
    End,
}

pub(super) struct Token {
    pub(super) tok: Tok,
    pub(super) at: usize,
}

pub(super) fn position(text: &str, at: usize) -> (usize, usize) {
    let before = &text[..at.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

pub(super) fn error_at(text: &str, at: usize, message: impl Into<String>) -> DocError {
    let (line, column) = position(text, at);
    DocError::Query(QueryError::Invalid {
        line,
        column,
        message: message.into(),
    })
}

pub(super) fn lex(text: &str) -> Result<Vec<Token>> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        let start = i;
        let tok = match c {
            b'\'' | b'"' => {
                let (s, end) = string_literal(text, start)?;
                i = end;
                Tok::Str(s)
            }
            b'$' => {
                i += 1;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                    i += 1;
                }
                if i == start + 1 {
                    return Err(error_at(text, start, "a parameter needs a name after $"));
                }
                Tok::Param(text[start + 1..i].to_string())
            }
            b'-' | b'0'..=b'9' => {
                i = number_end(b, start);
                Tok::Num(text[start..i].to_string())
            }
            c if c.is_ascii_alphabetic() || c == b'_' || c == b'@' => {
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b"_@.[]".contains(&b[i])) {
                    i += 1;
                }
                Tok::Word(text[start..i].to_string())
            }
            _ => match symbol(&b[i..]) {
                Some((sym, len)) => {
                    i += len;
                    Tok::Sym(sym)
                }
                None => {
                    let ch = text[i..].chars().next().unwrap_or('?');
                    return Err(error_at(
                        text,
                        start,
                        format!("unexpected character {ch:?}"),
                    ));
                }
            },
        };
        out.push(Token { tok, at: start });
    }
    out.push(Token {
        tok: Tok::End,
        at: text.len(),
    });
    Ok(out)
}

/// The operator or punctuation `b` starts with, and its length in bytes.
pub(super) fn symbol(b: &[u8]) -> Option<(&'static str, usize)> {
    Some(match b {
        [b'(', ..] => ("(", 1),
        [b')', ..] => (")", 1),
        [b',', ..] => (",", 1),
        [b'=', b'=', ..] => ("=", 2),
        [b'=', ..] => ("=", 1),
        [b'!', b'=', ..] => ("!=", 2),
        [b'<', b'=', ..] => ("<=", 2),
        [b'<', b'>', ..] => ("!=", 2),
        [b'<', ..] => ("<", 1),
        [b'>', b'=', ..] => (">=", 2),
        [b'>', ..] => (">", 1),
        _ => return None,
    })
}

/// Where the number at `start` (a digit or `-`) ends: letters, digits and dots
/// (the number is checked when it is parsed), and a sign right after an exponent
/// mark.
pub(super) fn number_end(b: &[u8], start: usize) -> usize {
    let mut i = start + 1;
    while i < b.len()
        && (b[i].is_ascii_alphanumeric() || b[i] == b'.' || b[i] == b'+' || b[i] == b'-')
    {
        // Sign only right after an exponent mark.
        if (b[i] == b'+' || b[i] == b'-') && !matches!(b[i - 1], b'e' | b'E') {
            break;
        }
        i += 1;
    }
    i
}

/// The string literal at `start` (its opening quote, `'` or `"`): its text, and
/// where the text after it starts. A doubled quote stands for one; `\n`, `\t`,
/// `\\` and escaped quotes are unescaped.
pub(super) fn string_literal(text: &str, start: usize) -> Result<(String, usize)> {
    let b = text.as_bytes();
    let quote = b[start];
    let mut i = start + 1;
    let mut s = Vec::new();
    loop {
        match b.get(i) {
            None => return Err(error_at(text, start, "unterminated string")),
            Some(&q) if q == quote => {
                if b.get(i + 1) == Some(&quote) {
                    s.push(quote);
                    i += 2;
                } else {
                    i += 1;
                    break;
                }
            }
            Some(b'\\') => {
                let e = match b.get(i + 1) {
                    Some(b'n') => b'\n',
                    Some(b't') => b'\t',
                    Some(&x @ (b'\\' | b'\'' | b'"')) => x,
                    _ => return Err(error_at(text, i, "unknown escape in string")),
                };
                s.push(e);
                i += 2;
            }
            Some(&x) => {
                s.push(x);
                i += 1;
            }
        }
    }
    // The text is UTF-8 and only ASCII was unescaped: still UTF-8.
    let s = String::from_utf8(s).map_err(|_| error_at(text, start, "bad UTF-8"))?;
    Ok((s, i))
}
