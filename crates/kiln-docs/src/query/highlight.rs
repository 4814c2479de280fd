//! `select highlight(path)`: a snippet of a field's text with the words that matched
//! in `<b>` (the rest HTML-escaped).
//!
//! The words marked are those of the field's `search()` clauses (outside a `not`,
//! not `-excluded`), analyzed as the index analyzes them: a one-term word wherever
//! its term occurs, and a phrase (`"quick fox"`, or a word the analyzer splits in
//! several terms, as `power-cut`) only where it occurs as a phrase: its terms at
//! their relative positions. tantivy's own snippet generator marks each term of a
//! phrase wherever it is, so a document with "quick" and "fox" apart had both
//! marked for `"quick fox"`; the fragment is chosen as tantivy chooses it (the
//! first window of at most 200 bytes with the most weight, a term weighing
//! 1 / (1 + its document frequency)). Prefixes and fuzzy words are not marked.

use super::parse::{Field, SearchText};
use crate::search::text::Kind;
use std::collections::HashMap;
use tantivy::query::Occur;
use tantivy::tokenizer::TextAnalyzer;
use tantivy::{Searcher, Term};

/// The longest snippet, in bytes of the text.
const MAX_CHARS: usize = 200;

/// What to mark in one field's text.
pub(super) struct Highlighter {
    analyzer: TextAnalyzer,
    /// Each sequence of terms to mark where it occurs: (position after the first
    /// term's, term text, weight). One term for a word; a phrase's terms together.
    sequences: Vec<Vec<(usize, String, f32)>>,
}

/// A token of the text: its byte range, position and term.
struct Tok {
    from: usize,
    to: usize,
    position: usize,
    text: String,
}

impl Highlighter {
    /// The highlighter of `field` (tantivy field `tfield`, analyzed by `analyzer`)
    /// for the `searches` of a query (each with whether it is under a `not`).
    pub(super) fn new(
        field: &Field,
        tfield: tantivy::schema::Field,
        mut analyzer: TextAnalyzer,
        searches: &[(&Field, &SearchText, bool)],
        searcher: &Searcher,
    ) -> tantivy::Result<Highlighter> {
        let mut sequences = Vec::new();
        for (f, text, negated) in searches {
            if *negated || f.path != field.path {
                continue;
            }
            for clause in &text.clauses {
                if clause.occur == Occur::MustNot {
                    continue;
                }
                let (Kind::Words(words) | Kind::Phrase(words)) = &clause.kind else {
                    continue;
                };
                let terms = tokens(&mut analyzer, words);
                let Some(first) = terms.first().map(|t| t.position) else {
                    continue;
                };
                let mut seq = Vec::with_capacity(terms.len());
                for t in terms {
                    let df = searcher.doc_freq(&Term::from_field_text(tfield, &t.text))?;
                    if df == 0 {
                        // No document has it: no match to mark.
                        seq.clear();
                        break;
                    }
                    seq.push((t.position - first, t.text, 1.0 / (1.0 + df as f32)));
                }
                if !seq.is_empty() {
                    sequences.push(seq);
                }
            }
        }
        Ok(Highlighter {
            analyzer,
            sequences,
        })
    }

    /// The snippet of `text` as HTML; empty when nothing in it matched.
    pub(super) fn snippet_html(&self, text: &str) -> String {
        let toks = tokens(&mut self.analyzer.clone(), text);
        let weights = self.marks(&toks);
        // tantivy's fragments: windows of tokens at most MAX_CHARS bytes long.
        let mut best: Option<(f32, usize, usize, Vec<usize>)> = None;
        let mut frag: (f32, usize, usize, Vec<usize>) = (0.0, 0, 0, Vec::new());
        let mut close = |frag: (f32, usize, usize, Vec<usize>)| {
            if frag.0 > 0.0 && best.as_ref().is_none_or(|b| frag.0 > b.0) {
                best = Some(frag);
            }
        };
        for (i, t) in toks.iter().enumerate() {
            if t.to - frag.1 > MAX_CHARS {
                let next = (0.0, t.from, t.from, Vec::new());
                close(std::mem::replace(&mut frag, next));
            }
            frag.2 = t.to;
            if let Some(w) = weights[i] {
                frag.0 += w;
                frag.3.push(i);
            }
        }
        close(frag);
        let Some((_, start, stop, marked)) = best else {
            return String::new();
        };
        let mut html = String::new();
        let mut at = start;
        for i in marked {
            let t = &toks[i];
            if t.from < at {
                continue;
            }
            escape(&text[at..t.from], &mut html);
            html.push_str("<b>");
            escape(&text[t.from..t.to], &mut html);
            html.push_str("</b>");
            at = t.to;
        }
        escape(&text[at..stop], &mut html);
        html
    }

    /// Each token's weight when it is marked: a word's term, or a term of a
    /// phrase where the whole phrase occurs.
    fn marks(&self, toks: &[Tok]) -> Vec<Option<f32>> {
        let mut marks = vec![None; toks.len()];
        let mut by_position: HashMap<usize, Vec<usize>> = HashMap::new();
        for (i, t) in toks.iter().enumerate() {
            by_position.entry(t.position).or_default().push(i);
        }
        let at = |position: usize, term: &str| {
            by_position
                .get(&position)?
                .iter()
                .copied()
                .find(|&j| toks[j].text == term)
        };
        for (i, t) in toks.iter().enumerate() {
            for seq in &self.sequences {
                let Some((_, head, w)) = seq.first() else {
                    continue;
                };
                if t.text != *head {
                    continue;
                }
                if seq.len() == 1 {
                    marks[i] = Some(*w);
                    continue;
                }
                let rest: Option<Vec<(usize, f32)>> = seq[1..]
                    .iter()
                    .map(|(off, term, w)| at(t.position + off, term).map(|j| (j, *w)))
                    .collect();
                if let Some(rest) = rest {
                    marks[i] = Some(*w);
                    for (j, w) in rest {
                        marks[j] = Some(w);
                    }
                }
            }
        }
        marks
    }
}

/// The tokens of `text` as `analyzer` makes them.
fn tokens(analyzer: &mut TextAnalyzer, text: &str) -> Vec<Tok> {
    let mut out = Vec::new();
    let mut stream = analyzer.token_stream(text);
    stream.process(&mut |t| {
        out.push(Tok {
            from: t.offset_from,
            to: t.offset_to,
            position: t.position,
            text: t.text.clone(),
        })
    });
    out
}

/// `s` HTML-escaped onto `out` (as tantivy's snippets are: `& < > " '`).
fn escape(s: &str, out: &mut String) {
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#x27;"),
            c => out.push(c),
        }
    }
}
