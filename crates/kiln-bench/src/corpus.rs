//! The corpora of the document workloads, shared by `kiln bench` (W16, W17) and the
//! comparative benchmark in bench/ (its W16 and W17 peers), which builds this crate
//! without the `documents` feature: nothing here needs kiln-docs.
//!
//! - W16's pages: the manual pages under `/usr/share/man/man[1-8]` (gzip, troff
//!   stripped to its text), or the Python standard library's sources where fewer
//!   than 500 pages are installed.
//! - W17's orders: ~150-byte JSON documents over [`COMPANIES`] companies.

use crate::run::BenchResult;
use rand::{rngs::SmallRng, Rng};
use serde_json::{json, Value};
use std::io::Read;
use std::path::PathBuf;

/// W16's query texts in Kiln's search syntax: single terms, phrases, prefixes.
pub const TERMS: &[&str] = &[
    "file",
    "directory",
    "network",
    "memory",
    "signal",
    "password",
    "kernel",
    "compression",
    "terminal",
    "printer",
];
pub const PHRASES: &[&str] = &[
    "\"regular expression\"",
    "\"standard output\"",
    "\"configuration file\"",
    "\"exit status\"",
    "\"environment variable\"",
    "\"home directory\"",
];
pub const PREFIXES: &[&str] = &["conf*", "netw*", "compr*", "encrypt*", "sync*", "print*"];

/// One page of the corpus.
pub struct Page {
    pub title: String,
    pub section: String,
    pub body: String,
}

/// troff to text: requests lose their name (keeping their arguments: headings,
/// bold words), comments go, escapes become what they print.
pub fn strip_troff(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    for line in src.lines() {
        let line = if let Some(rest) = line.strip_prefix('.').or_else(|| line.strip_prefix('\'')) {
            if rest.starts_with("\\\"") {
                continue;
            }
            rest.split_once(char::is_whitespace)
                .map_or("", |(_, args)| args)
        } else {
            line
        };
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            if c != '\\' {
                out.push(if c == '"' { ' ' } else { c });
                continue;
            }
            match chars.next() {
                Some('f') => {
                    // \fB, \fI, \fR, \fP, \f(XX: the font's letter, or ( and two
                    let font = chars.next();
                    if font == Some('(') {
                        chars.next();
                        chars.next();
                    }
                }
                Some('(') => {
                    chars.next();
                    chars.next();
                    out.push(' ');
                }
                Some('-') => out.push('-'),
                Some('e') => out.push('\\'),
                Some('&') | Some('c') => {}
                Some(other) => out.push(other),
                None => {}
            }
        }
        out.push('\n');
    }
    out
}

pub fn man_pages(limit: usize, max_bytes: usize) -> Vec<Page> {
    let mut files: Vec<(PathBuf, String)> = Vec::new();
    for section in 1..=8 {
        let dir = PathBuf::from(format!("/usr/share/man/man{section}"));
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            files.push((e.path(), section.to_string()));
        }
    }
    files.sort();
    let mut pages = Vec::new();
    let mut bytes = 0;
    for (path, section) in files {
        if pages.len() >= limit || bytes >= max_bytes {
            break;
        }
        let Ok(raw) = std::fs::read(&path) else {
            continue;
        };
        let mut text = String::new();
        let ok = if path.extension().is_some_and(|e| e == "gz") {
            flate2::read::GzDecoder::new(&raw[..])
                .read_to_string(&mut text)
                .is_ok()
        } else {
            String::from_utf8(raw).map(|t| text = t).is_ok()
        };
        // Links to other pages (`.so`) and tiny stubs are not pages.
        if !ok || text.len() < 512 || text.starts_with(".so ") {
            continue;
        }
        let body = strip_troff(&text);
        bytes += body.len();
        let title = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.split('.').next())
            .unwrap_or("")
            .to_string();
        pages.push(Page {
            title,
            section,
            body,
        });
    }
    pages
}

pub fn python_sources(limit: usize, max_bytes: usize) -> Vec<Page> {
    let mut stack: Vec<PathBuf> = std::fs::read_dir("/usr/lib")
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("python3"))
                })
                .collect()
        })
        .unwrap_or_default();
    let mut files = Vec::new();
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "py") {
                files.push(p);
            }
        }
    }
    files.sort();
    let mut pages = Vec::new();
    let mut bytes = 0;
    for p in files {
        if pages.len() >= limit || bytes >= max_bytes {
            break;
        }
        if let Ok(body) = std::fs::read_to_string(&p) {
            if body.len() >= 512 {
                bytes += body.len();
                pages.push(Page {
                    title: p
                        .file_stem()
                        .and_then(|s| s.to_str())
                        .unwrap_or("")
                        .to_string(),
                    section: "py".into(),
                    body,
                });
            }
        }
    }
    pages
}

/// The corpus and its name.
pub fn corpus(limit: usize, max_bytes: usize) -> BenchResult<(&'static str, Vec<Page>)> {
    let pages = man_pages(limit, max_bytes);
    if pages.len() >= 500.min(limit) {
        return Ok(("man pages (/usr/share/man/man1-8)", pages));
    }
    let pages = python_sources(limit, max_bytes);
    if pages.len() >= 100.min(limit) {
        return Ok(("Python standard library sources (/usr/lib/python3*)", pages));
    }
    Err(
        "W16 needs English text offline: neither /usr/share/man nor /usr/lib/python3* has enough"
            .into(),
    )
}

/// W17's companies: an order's `company` is one of them.
pub const COMPANIES: u64 = 1_000;

/// W17's order `n` (`company` one of [`COMPANIES`], `amount` a decimal with cents,
/// `status`, `customer`) as JSON; `rng` is seeded with the first order's number and
/// draws in order.
pub fn order(rng: &mut SmallRng, n: u64) -> Vec<u8> {
    let cents: u64 = rng.gen_range(100..1_000_000);
    let amount: Value =
        serde_json::from_str(&format!("{}.{:02}", cents / 100, cents % 100)).unwrap_or(Value::Null);
    let status = ["new", "paid", "shipped"][(n % 3) as usize];
    json!({
        "company": format!("company-{:04}", n % COMPANIES),
        "amount": amount,
        "status": status,
        "customer": format!("customer-{}", rng.gen_range(0..100_000)),
    })
    .to_string()
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::strip_troff;

    #[test]
    fn troff_becomes_text() {
        let src = ".\\\" a comment\n.TH LS 1\n.SH DESCRIPTION\nList \\fBinformation\\fR about\n\\-a files \\(em all\n";
        let t = strip_troff(src);
        assert!(!t.contains("comment"));
        assert!(t.contains("DESCRIPTION"));
        assert!(t.contains("List information about"));
        assert!(t.contains("-a files"));
    }
}
