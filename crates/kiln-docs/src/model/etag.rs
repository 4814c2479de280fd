//! Etags: `<sequence>-<incarnation>`, e.g. `42-9f3a1c2b`.
//!
//! The sequence grows with every write to the database; the incarnation is a random
//! number chosen when the database was created. Two etags compare equal only if both
//! parts do, so a database that is dropped and created again never repeats an etag.

use super::error::DocumentError;
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
    pub fn parse(text: &str) -> Result<Etag, DocumentError> {
        let bad = || DocumentError::InvalidEtag(text.to_string());
        let (seq, inc) = text.split_once('-').ok_or_else(bad)?;
        // Only the form `Display` writes: `from_str_radix` alone would also take a
        // sign (`42-+1234567`), upper case or a leading zero, and two spellings of
        // one etag would both match.
        let digits = !seq.is_empty() && seq.bytes().all(|b| b.is_ascii_digit());
        let leading_zero = seq.len() > 1 && seq.starts_with('0');
        let hex = inc.len() == 8 && inc.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if !digits || leading_zero || !hex {
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
            "42-+9f3a1c2",
            "42-9F3A1C2B",
            "042-9f3a1c2b",
        ] {
            assert!(Etag::parse(bad).is_err(), "{bad:?}");
        }
    }

    use proptest::prelude::*;

    proptest! {
        /// Whatever a client sends as an etag: no panic, and what parses is exactly
        /// what `Display` writes for it (one spelling per etag).
        #[test]
        fn only_the_canonical_spelling_parses(text in prop_oneof![
            "\\PC{0,24}",
            "[0-9+-]{0,6}-[0-9a-fA-F+ ]{6,10}",
            (any::<u64>(), any::<u32>(), any::<prop::sample::Index>(), prop::sample::select(
                vec!["0", "+", "-", " ", "A", "F", "g", "\u{e9}", "00"],
            ))
                .prop_map(|(s, i, at, put)| {
                    // A real etag with one character inserted or replaced.
                    let mut t = format!("{s}-{i:08x}");
                    let mut at = at.index(t.len() + 1);
                    while !t.is_char_boundary(at) {
                        at -= 1;
                    }
                    if at % 2 == 0 {
                        t.insert_str(at, put);
                    } else if at < t.len() {
                        t.replace_range(at..at + 1, put);
                    }
                    t
                }),
        ]) {
            if let Ok(etag) = Etag::parse(&text) {
                prop_assert_eq!(etag.to_string(), text);
            }
        }

        #[test]
        fn every_etag_round_trips(sequence in any::<u64>(), incarnation in any::<u32>()) {
            let etag = Etag { sequence, incarnation };
            prop_assert_eq!(Etag::parse(&etag.to_string()).ok(), Some(etag));
        }
    }
}
