//! Etags: `<sequence>-<incarnation>`, e.g. `42-9f3a1c2b`.
//!
//! The sequence grows with every write to the database; the incarnation is a random
//! number chosen when the database was created. Two etags compare equal only if both
//! parts do, so a database that is dropped and created again never repeats an etag.

use crate::{DocError, Result};
use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Etag {
    pub incarnation: u32,
    pub sequence: u64,
}

impl fmt::Display for Etag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{:08x}", self.sequence, self.incarnation)
    }
}

impl Etag {
    /// Parses the form `Display` writes (without the quotes HTTP puts around it).
    pub fn parse(text: &str) -> Result<Etag> {
        let bad = || DocError::InvalidEtag(text.to_string());
        let (seq, inc) = text.split_once('-').ok_or_else(bad)?;
        if seq.is_empty() || !seq.bytes().all(|b| b.is_ascii_digit()) || inc.len() != 8 {
            return Err(bad());
        }
        Ok(Etag {
            sequence: seq.parse().map_err(|_| bad())?,
            incarnation: u32::from_str_radix(inc, 16).map_err(|_| bad())?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_and_parse_round_trip() {
        let e = Etag {
            incarnation: 0x9f3a_1c2b,
            sequence: 42,
        };
        assert_eq!(e.to_string(), "42-9f3a1c2b");
        assert_eq!(Etag::parse("42-9f3a1c2b").unwrap(), e);
        for bad in [
            "",
            "42",
            "-9f3a1c2b",
            "x-9f3a1c2b",
            "42-9f3a",
            "42-zzzzzzzz",
            "+4-9f3a1c2b",
        ] {
            assert!(Etag::parse(bad).is_err(), "{bad:?}");
        }
    }
}
