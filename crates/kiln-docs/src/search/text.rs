//! The text of `search(field, '...')`, parsed when the query is (so a mistake is
//! reported with the query's line and column) and turned into a tantivy query with
//! the field's analyzer when the query runs:
//!
//! ```text
//! quick fox      either word; BM25 ranks documents with both (and rarer words) first
//! "quick fox"    the phrase (the words next to each other, in order)
//! qui*           a word starting with "qui" (lowercased, not stemmed: it matches the
//!                terms as indexed, so with `english` "runn*" does not find "running",
//!                indexed as "run")
//! quikc~         a word within 2 edits of "quikc" (`~1`: within 1; an insertion,
//!                deletion, substitution or swap of two letters is one edit;
//!                lowercased, not stemmed, as a prefix; every match scores the same)
//! +fox           documents must have it;  -slow: documents must not have it
//! fox^2          counts twice as much in the score (a phrase too: "quick fox"^2)
//! ```
//! Words are OR-ed, as in Lucene and RavenDB's `search()`; `+` makes one required.
//! A word the analyzer drops (a stop word) is ignored.

use tantivy::query::{
    AllQuery, BooleanQuery, BoostQuery, EmptyQuery, FuzzyTermQuery, Occur, PhraseQuery, Query,
    TermQuery,
};
use tantivy::schema::{Field, IndexRecordOption};
use tantivy::tokenizer::TextAnalyzer;
use tantivy::Term;

/// At most this many clauses in one `search()`.
pub const MAX_CLAUSES: usize = 64;
const MAX_BOOST: f32 = 1000.0;

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Kind {
    /// Words as typed (analyzed into one term, or a phrase if they give several).
    Words(String),
    Phrase(String),
    Prefix(String),
    /// A word and the edits allowed (0 to [`MAX_EDITS`]).
    Fuzzy(String, u8),
}

/// tantivy's Levenshtein automata go up to two edits (as Lucene's fuzzy queries).
pub const MAX_EDITS: u8 = 2;

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Clause {
    pub occur: Occur,
    pub kind: Kind,
    pub boost: Option<f32>,
}

/// The clauses of a search text, or an error with its byte offset in the text.
pub(crate) fn parse(text: &str) -> Result<Vec<Clause>, (usize, String)> {
    let b = text.as_bytes();
    let mut i = 0;
    let mut out = Vec::new();
    while i < b.len() {
        if b[i].is_ascii_whitespace() {
            i += 1;
            continue;
        }
        let start = i;
        let occur = parse_occur(b, &mut i);
        let kind = if b.get(i) == Some(&b'"') {
            parse_phrase(text, &mut i)?
        } else {
            parse_word(text, &mut i, start)?
        };
        let boost = parse_boost(text, &mut i)?;
        if b.get(i).is_some_and(|c| !c.is_ascii_whitespace()) {
            return Err((i, "clauses are separated by spaces".into()));
        }
        out.push(Clause { occur, kind, boost });
        if out.len() > MAX_CLAUSES {
            return Err((
                start,
                format!("more than {MAX_CLAUSES} clauses in one search"),
            ));
        }
    }
    Ok(out)
}

/// A clause's `+` (required) or `-` (excluded) at `i`, if it has one (else it
/// is optional); `i` moves past it.
fn parse_occur(b: &[u8], i: &mut usize) -> Occur {
    match b[*i] {
        b'+' => {
            *i += 1;
            Occur::Must
        }
        b'-' => {
            *i += 1;
            Occur::MustNot
        }
        _ => Occur::Should,
    }
}

/// The phrase whose opening `"` is at `i`; `i` moves past its closing one.
fn parse_phrase(text: &str, i: &mut usize) -> Result<Kind, (usize, String)> {
    let close = text[*i + 1..]
        .find('"')
        .ok_or((*i, "a phrase's closing \" is missing".to_string()))?;
    let phrase = &text[*i + 1..*i + 1 + close];
    *i += close + 2;
    Ok(Kind::Phrase(phrase.to_string()))
}

/// The word at `i` (up to a space, `^` or `"`): a prefix, a fuzzy word or words
/// as typed; `i` moves past it. A malformed one is reported at the clause's
/// `start`.
fn parse_word(text: &str, i: &mut usize, start: usize) -> Result<Kind, (usize, String)> {
    let end = text[*i..]
        .find(|c: char| c.is_ascii_whitespace() || c == '^' || c == '"')
        .map_or(text.len(), |n| *i + n);
    let word = &text[*i..end];
    *i = end;
    match word.strip_suffix('*') {
        Some(p) if p.is_empty() || p.contains('*') => {
            Err((start, format!("{word:?}: a prefix is letters then one *")))
        }
        Some(p) => Ok(Kind::Prefix(p.to_string())),
        None if word.is_empty() => {
            Err((start, "a + or - is followed by a word or a phrase".into()))
        }
        None => match word.split_once('~') {
            Some((w, edits)) => parse_fuzzy(word, w, edits, start),
            None => Ok(Kind::Words(word.to_string())),
        },
    }
}

/// The fuzzy word `word`, split at its `~` into the word `w` and its `edits`.
fn parse_fuzzy(word: &str, w: &str, edits: &str, start: usize) -> Result<Kind, (usize, String)> {
    let malformed = || {
        (
            start,
            format!("{word:?}: a fuzzy word is a word then ~, ~0, ~1 or ~2"),
        )
    };
    let edits = match edits {
        "" => MAX_EDITS,
        n => n
            .parse()
            .ok()
            .filter(|n| *n <= MAX_EDITS)
            .ok_or_else(malformed)?,
    };
    if w.is_empty() || w.contains('~') {
        return Err(malformed());
    }
    Ok(Kind::Fuzzy(w.to_string(), edits))
}

/// A clause's `^boost` at `i`, if it has one; `i` moves past it.
fn parse_boost(text: &str, i: &mut usize) -> Result<Option<f32>, (usize, String)> {
    if text.as_bytes().get(*i) != Some(&b'^') {
        return Ok(None);
    }
    let end = text[*i + 1..]
        .find(|c: char| c.is_ascii_whitespace())
        .map_or(text.len(), |n| *i + 1 + n);
    let raw = &text[*i + 1..end];
    let boost: f32 = raw
        .parse()
        .ok()
        .filter(|v: &f32| v.is_finite() && *v > 0.0 && *v <= MAX_BOOST)
        .ok_or((
            *i,
            format!("boost ^{raw}: a number above 0, at most {MAX_BOOST}"),
        ))?;
    *i = end;
    Ok(Some(boost))
}

/// The analyzed terms of `text`, with their positions.
fn analyze(analyzer: &mut TextAnalyzer, field: Field, text: &str) -> Vec<(usize, Term)> {
    let mut terms = Vec::new();
    let mut stream = analyzer.token_stream(text);
    stream.process(&mut |t| terms.push((t.position, Term::from_field_text(field, &t.text))));
    terms
}

/// The tantivy query of `clauses` on `field`; `lowercase_prefixes` where the
/// analyzer lowercases (all but `keyword`).
pub(crate) fn to_query(
    clauses: &[Clause],
    field: Field,
    analyzer: &mut TextAnalyzer,
    lowercase_prefixes: bool,
) -> Box<dyn Query> {
    let mut parts: Vec<(Occur, Box<dyn Query>)> = Vec::new();
    for c in clauses {
        let normalized = |w: &str| {
            let w = if lowercase_prefixes {
                w.to_lowercase()
            } else {
                w.to_string()
            };
            Term::from_field_text(field, &w)
        };
        let q: Box<dyn Query> = match &c.kind {
            // Distance 0 with a prefix: every term that starts with `p` (a
            // constant score, as Lucene's prefix queries have).
            Kind::Prefix(p) => Box::new(FuzzyTermQuery::new_prefix(normalized(p), 0, true)),
            // A swap of two letters counts as one edit (Damerau), as in Lucene.
            Kind::Fuzzy(w, edits) => Box::new(FuzzyTermQuery::new(normalized(w), *edits, true)),
            Kind::Words(text) | Kind::Phrase(text) => {
                let mut terms = analyze(analyzer, field, text);
                match terms.len() {
                    0 => continue,
                    1 => Box::new(TermQuery::new(
                        terms.pop().expect("one").1,
                        IndexRecordOption::WithFreqs,
                    )),
                    _ => Box::new(PhraseQuery::new_with_offset(terms)),
                }
            }
        };
        let q = match c.boost {
            Some(b) => Box::new(BoostQuery::new(q, b)),
            None => q,
        };
        parts.push((c.occur, q));
    }
    if parts.is_empty() {
        return Box::new(EmptyQuery);
    }
    if parts.iter().all(|(o, _)| *o == Occur::MustNot) {
        // Only exclusions: every document but those.
        parts.push((Occur::Must, Box::new(AllQuery)));
    }
    Box::new(BooleanQuery::new(parts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_forms() {
        let c = parse(r#"quick +fox -slow "lazy dog"^2 qui* fox^1.5"#).unwrap();
        assert_eq!(c.len(), 6);
        assert_eq!(c[0].kind, Kind::Words("quick".into()));
        assert_eq!(c[1].occur, Occur::Must);
        assert_eq!(c[2].occur, Occur::MustNot);
        assert_eq!(c[3].kind, Kind::Phrase("lazy dog".into()));
        assert_eq!(c[3].boost, Some(2.0));
        assert_eq!(c[4].kind, Kind::Prefix("qui".into()));
        assert_eq!(c[5].boost, Some(1.5));
        let c = parse("quikc~ fox~1^3 -dgo~0").unwrap();
        assert_eq!(c[0].kind, Kind::Fuzzy("quikc".into(), 2));
        assert_eq!(c[1].kind, Kind::Fuzzy("fox".into(), 1));
        assert_eq!(c[1].boost, Some(3.0));
        assert_eq!(
            (c[2].occur, &c[2].kind),
            (Occur::MustNot, &Kind::Fuzzy("dgo".into(), 0))
        );
    }

    #[test]
    fn refuses_malformed_text_with_a_position() {
        for (text, at) in [
            ("\"open phrase", 0),
            ("fox^", 3),
            ("fox^-1", 3),
            ("fox^nan", 3),
            ("*", 0),
            ("a**", 0),
            ("+ fox", 0),
            ("\"a\"b", 3),
            ("fox~3", 0),
            ("~1", 0),
            ("fox~~", 0),
            ("fox~x", 0),
        ] {
            let e = parse(text).unwrap_err();
            assert_eq!(e.0, at, "{text}: {e:?}");
        }
        let many = "w ".repeat(MAX_CLAUSES + 1);
        assert!(parse(&many).is_err());
        assert_eq!(parse("   ").unwrap(), vec![]);
    }
}
