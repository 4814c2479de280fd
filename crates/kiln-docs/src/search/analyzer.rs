//! Analyzers: how a full-text field's text becomes terms. The same analyzer runs
//! when a document is indexed and when a `search()` is parsed, so a field's name in
//! a definition is enough for both (tantivy keeps the name in its schema).
//!
//! - `standard`: words (runs of letters and digits), lowercased, words over 40 bytes
//!   dropped (base64 and the like: they only bloat the dictionary).
//! - `english` and the other languages: `standard`, then the language's stop words
//!   removed and the rest stemmed (Snowball, through tantivy): "Running" and "runs"
//!   both become "run".
//! - `keyword`: the whole value as one term, as written (exact match).

use crate::IndexError;
use crate::{DocError, Result};
use tantivy::tokenizer::{
    Language, LowerCaser, RawTokenizer, RemoveLongFilter, SimpleTokenizer, Stemmer, StopWordFilter,
    TextAnalyzer, TokenizerManager,
};

pub(crate) const DEFAULT_ANALYZER: &str = "standard";
const LONGEST_TERM_BYTES: usize = 40;

/// The languages with a stemmer (and, for most, stop words), by analyzer name.
const LANGUAGES: &[(&str, Language)] = &[
    ("arabic", Language::Arabic),
    ("danish", Language::Danish),
    ("dutch", Language::Dutch),
    ("english", Language::English),
    ("finnish", Language::Finnish),
    ("french", Language::French),
    ("german", Language::German),
    ("greek", Language::Greek),
    ("hungarian", Language::Hungarian),
    ("italian", Language::Italian),
    ("norwegian", Language::Norwegian),
    ("portuguese", Language::Portuguese),
    ("romanian", Language::Romanian),
    ("russian", Language::Russian),
    ("spanish", Language::Spanish),
    ("swedish", Language::Swedish),
    ("tamil", Language::Tamil),
    ("turkish", Language::Turkish),
];

/// Every analyzer name a definition may give.
pub fn names() -> Vec<&'static str> {
    let mut out = vec![DEFAULT_ANALYZER, "keyword"];
    out.extend(LANGUAGES.iter().map(|(n, _)| *n));
    out
}

pub(crate) fn validate(name: Option<&str>) -> Result<()> {
    let name = name.unwrap_or(DEFAULT_ANALYZER);
    if build(name).is_none() {
        return Err(DocError::Index(IndexError::Invalid(format!(
            "analyzer {name:?} is not one of {}",
            names().join(", ")
        ))));
    }
    Ok(())
}

/// The analyzer called `name`, or `None` if there is none of that name.
pub fn build(name: &str) -> Option<TextAnalyzer> {
    let words = || {
        TextAnalyzer::builder(SimpleTokenizer::default())
            .filter(RemoveLongFilter::limit(LONGEST_TERM_BYTES))
            .filter(LowerCaser)
    };
    match name {
        DEFAULT_ANALYZER => Some(words().build()),
        "keyword" => Some(TextAnalyzer::builder(RawTokenizer::default()).build()),
        _ => {
            let (_, language) = LANGUAGES.iter().find(|(n, _)| *n == name)?;
            Some(match StopWordFilter::new(*language) {
                Some(stop) => words().filter(stop).filter(Stemmer::new(*language)).build(),
                None => words().filter(Stemmer::new(*language)).build(),
            })
        }
    }
}

/// Registers every analyzer with an index's tokenizer manager (at each open: tantivy
/// keeps only the names).
pub fn register_all(manager: &TokenizerManager) {
    for name in names() {
        if let Some(a) = build(name) {
            manager.register(name, a);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn terms(analyzer: &str, text: &str) -> Vec<String> {
        let mut a = build(analyzer).expect("known analyzer");
        let mut out = Vec::new();
        let mut stream = a.token_stream(text);
        stream.process(&mut |t| out.push(t.text.clone()));
        out
    }

    #[test]
    fn english_stems_and_drops_stop_words() {
        assert_eq!(
            terms("english", "The Runners are running quickly"),
            ["runner", "run", "quick"]
        );
        assert_eq!(terms("standard", "The Runners"), ["the", "runners"]);
        assert_eq!(terms("keyword", "The Runners"), ["The Runners"]);
    }

    #[test]
    fn unknown_analyzer_is_refused() {
        assert!(validate(Some("klingon")).is_err());
        assert!(validate(None).is_ok());
        for n in names() {
            assert!(validate(Some(n)).is_ok(), "{n}");
        }
    }
}
