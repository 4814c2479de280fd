//! The query language: a recursive-descent parser over the lexer's tokens
//! (`lex.rs`), making the query tree of `ast.rs`.
//!
//! ```text
//! query   := 'from' ( 'index' STRING | NAME ) [ 'where' expr ] [ 'group' 'by' field ( ',' field )* ]
//!            [ 'order' 'by' order ( ',' order )* ] { 'limit' INT | 'offset' INT | 'select' item ( ',' item )* }
//! item    := field [ 'as' NAME ] | AGG '(' [ PATH ] ')' [ 'as' NAME ]     AGG: count sum avg min max
//!          | 'highlight' '(' PATH ')'
//! order   := field [ 'asc' | 'desc' ] | 'score' '(' ')' [ 'asc' | 'desc' ]     (score: desc by default)
//! expr    := and ( 'or' and )*
//! and     := unary ( 'and' unary )*
//! unary   := 'not' unary | '(' expr ')' | 'exists' '(' field ')'
//!          | 'startsWith' '(' field ',' value ')' | 'search' '(' PATH ',' value ')' | field pred
//! pred    := ( '=' | '==' | '!=' | '<>' | '<' | '<=' | '>' | '>=' ) value
//!          | 'in' '(' value ( ',' value )* ')' | 'in' PARAM
//!          | 'between' value 'and' value | 'startsWith' value | 'exists'
//! field   := PATH | 'lower' '(' PATH ')'          PATH: name ( '.' name | '[]' )*
//! value   := STRING | NUMBER | 'true' | 'false' | 'null' | '$'name
//! ```
//! Keywords are case-insensitive. Values come from the text or from parameters
//! (`$name`), never spliced. Every error names a line and column.
//!
//! `search(path, 'text')` is a full-text condition (its text: `search/text.rs`),
//! answered by a full-text index; it is a condition of the `where`'s top-level
//! `and` (not under `or` or `not`). `score()` is its BM25 relevance and
//! `highlight(path)` a snippet of the field with the matched words in `<b>`.

use crate::index::def::parse_path;
use crate::index::value::Scalar;
use crate::QueryError;
use crate::{DocError, Result};
use serde_json::{Map, Value};

pub(crate) use super::ast::{CmpOp, Expr, Field, Grouping, Query, SearchText, Selected, Source};
use super::lex::{error_at, lex, Tok, Token};

pub const MAX_QUERY_BYTES: usize = 16 * 1024;
pub const MAX_DEPTH: usize = 32;
pub const MAX_IN_VALUES: usize = 1024;
pub const MAX_LIMIT: usize = 10_000;
pub const MAX_OFFSET: usize = 1_000_000;
pub const DEFAULT_LIMIT: usize = 128;
const MAX_TERMS: usize = 256;

/// A query's `limit`, `offset` and `select`, each if it has one.
type LimitOffsetSelect = (Option<usize>, Option<usize>, Option<Vec<Item>>);

/// A select item as written.
enum Item {
    Field(Field, Option<String>),
    Highlight(Field),
    Call(String, Option<String>, Option<String>, usize),
}

struct Parser<'a> {
    text: &'a str,
    toks: Vec<Token>,
    pos: usize,
    params: &'a Map<String, Value>,
    terms: usize,
}

pub(crate) fn parse(text: &str, params: &Map<String, Value>) -> Result<Query> {
    if text.len() > MAX_QUERY_BYTES {
        return Err(DocError::Query(QueryError::Invalid {
            line: 0,
            column: 0,
            message: format!(
                "query of {} bytes exceeds the limit of {MAX_QUERY_BYTES}",
                text.len()
            ),
        }));
    }
    let toks = lex(text)?;
    let mut p = Parser {
        text,
        toks,
        pos: 0,
        params,
        terms: 0,
    };
    p.query()
}

impl<'a> Parser<'a> {
    fn peek(&self) -> &Tok {
        &self.toks[self.pos.min(self.toks.len() - 1)].tok
    }

    fn at(&self) -> usize {
        self.toks[self.pos.min(self.toks.len() - 1)].at
    }

    fn err(&self, message: impl Into<String>) -> DocError {
        error_at(self.text, self.at(), message)
    }

    fn describe(&self) -> String {
        match self.peek() {
            Tok::Word(w) => format!("{w:?}"),
            Tok::Str(s) => format!("string '{s}'"),
            Tok::Num(n) => format!("number {n}"),
            Tok::Param(p) => format!("${p}"),
            Tok::Sym(s) => format!("{s:?}"),
            Tok::End => "the end of the query".into(),
        }
    }

    fn bump(&mut self) {
        if self.pos < self.toks.len() - 1 {
            self.pos += 1;
        }
    }

    fn is_kw(&self, kw: &str) -> bool {
        matches!(self.peek(), Tok::Word(w) if w.eq_ignore_ascii_case(kw))
    }

    fn eat_kw(&mut self, kw: &str) -> bool {
        if self.is_kw(kw) {
            self.bump();
            true
        } else {
            false
        }
    }

    fn expect_kw(&mut self, kw: &str) -> Result<()> {
        if self.eat_kw(kw) {
            Ok(())
        } else {
            Err(self.err(format!("expected '{kw}', found {}", self.describe())))
        }
    }

    fn eat_sym(&mut self, s: &str) -> bool {
        if matches!(self.peek(), Tok::Sym(x) if *x == s) {
            self.bump();
            true
        } else {
            false
        }
    }

    fn expect_sym(&mut self, s: &str) -> Result<()> {
        if self.eat_sym(s) {
            Ok(())
        } else {
            Err(self.err(format!("expected '{s}', found {}", self.describe())))
        }
    }

    fn query(&mut self) -> Result<Query> {
        self.expect_kw("from")?;
        let source = self.source()?;
        let filter = if self.eat_kw("where") {
            Some(self.or_expr(0)?)
        } else {
            None
        };
        let group_by = if self.eat_kw("group") {
            Some(self.group_by()?)
        } else {
            None
        };
        let order = if self.eat_kw("order") {
            self.order_by()?
        } else {
            Vec::new()
        };
        let (limit, offset, select) = self.limit_offset_select()?;
        if *self.peek() != Tok::End {
            return Err(self.err(format!("unexpected {}", self.describe())));
        }
        let (select, highlight, group) = match group_by {
            None => {
                let (fields, highlight) = match select {
                    Some(items) => self.plain_fields(items)?,
                    None => (None, Vec::new()),
                };
                (fields, highlight, None)
            }
            Some(by) => {
                let select = self.grouped_select(&by, select)?;
                (None, Vec::new(), Some(Grouping { by, select }))
            }
        };
        let searching = filter.as_ref().is_some_and(Expr::has_search);
        if !searching && (!highlight.is_empty() || order.iter().any(|(f, _)| f.is_score())) {
            return Err(error_at(
                self.text,
                0,
                "score() and highlight() need a search() in the where",
            ));
        }
        Ok(Query {
            source,
            filter,
            order,
            limit: limit.unwrap_or(DEFAULT_LIMIT),
            offset: offset.unwrap_or(0),
            select,
            highlight,
            group,
        })
    }

    /// The fields after `group` (`by a, b`: at most 8).
    fn group_by(&mut self) -> Result<Vec<Field>> {
        self.expect_kw("by")?;
        let mut by = vec![self.field()?];
        while self.eat_sym(",") {
            by.push(self.field()?);
            if by.len() > 8 {
                return Err(self.err("at most 8 fields in group by"));
            }
        }
        Ok(by)
    }

    /// The `limit`, `offset` and `select` clauses that end a query, each at most
    /// once, in any order.
    fn limit_offset_select(&mut self) -> Result<LimitOffsetSelect> {
        let (mut limit, mut offset, mut select) = (None, None, None);
        loop {
            if self.is_kw("limit") && limit.is_none() {
                self.bump();
                limit = Some(self.count("limit", MAX_LIMIT)?);
            } else if self.is_kw("offset") && offset.is_none() {
                self.bump();
                offset = Some(self.count("offset", MAX_OFFSET)?);
            } else if self.is_kw("select") && select.is_none() {
                self.bump();
                select = Some(self.select_list()?);
            } else {
                break;
            }
        }
        Ok((limit, offset, select))
    }

    /// The items after `select` (at most 64).
    fn select_list(&mut self) -> Result<Vec<Item>> {
        let mut items = vec![self.select_item()?];
        while self.eat_sym(",") {
            items.push(self.select_item()?);
            if items.len() > 64 {
                return Err(self.err("at most 64 fields in select"));
            }
        }
        Ok(items)
    }

    /// `field [as name]` or `count()`, `sum(path)`, ... `[as name]`.
    fn select_item(&mut self) -> Result<Item> {
        let at = self.at();
        if let Tok::Word(w) = self.peek().clone() {
            let is_call = self
                .toks
                .get(self.pos + 1)
                .is_some_and(|t| t.tok == Tok::Sym("("));
            let lower = w.to_ascii_lowercase();
            if is_call && lower == "highlight" {
                self.bump();
                self.expect_sym("(")?;
                let f = self.field()?;
                self.expect_sym(")")?;
                return Ok(Item::Highlight(f));
            }
            if is_call && ["count", "sum", "avg", "min", "max"].contains(&lower.as_str()) {
                self.bump();
                self.expect_sym("(")?;
                let path = match self.peek().clone() {
                    Tok::Sym(")") => None,
                    Tok::Word(p) => {
                        self.bump();
                        Some(p)
                    }
                    _ => return Err(self.err(format!("expected a path in {lower}()"))),
                };
                self.expect_sym(")")?;
                let alias = self.alias()?;
                return Ok(Item::Call(lower, path, alias, at));
            }
        }
        let f = self.field()?;
        let alias = self.alias()?;
        Ok(Item::Field(f, alias))
    }

    fn alias(&mut self) -> Result<Option<String>> {
        if !self.eat_kw("as") {
            return Ok(None);
        }
        match self.peek().clone() {
            Tok::Word(w) if !is_reserved(&w) => {
                self.bump();
                Ok(Some(w))
            }
            Tok::Str(s) => {
                self.bump();
                Ok(Some(s))
            }
            _ => Err(self.err("expected a name after as")),
        }
    }

    /// The select of a query without `group by`: fields (none: the whole
    /// document), and highlights.
    fn plain_fields(&self, items: Vec<Item>) -> Result<(Option<Vec<Field>>, Vec<Field>)> {
        let (mut fields, mut highlight) = (Vec::new(), Vec::new());
        for item in items {
            match item {
                Item::Field(f, None) => fields.push(f),
                Item::Highlight(f) => highlight.push(f),
                Item::Field(_, Some(_)) => {
                    return Err(self.err("as names the outputs of a group by only"))
                }
                Item::Call(name, _, _, at) => {
                    return Err(error_at(
                        self.text,
                        at,
                        format!("{name}() needs a group by"),
                    ))
                }
            }
        }
        Ok(((!fields.is_empty()).then_some(fields), highlight))
    }

    /// The outputs of a grouped query (by default its group fields and `count()`).
    fn grouped_select(&self, by: &[Field], items: Option<Vec<Item>>) -> Result<Vec<Selected>> {
        let Some(items) = items else {
            let mut out: Vec<Selected> = by
                .iter()
                .enumerate()
                .map(|(position, f)| Selected::Group {
                    position,
                    name: f.path.clone(),
                })
                .collect();
            out.push(Selected::Aggregate {
                func: crate::index::reduce::Func::Count,
                path: None,
                name: "count".into(),
            });
            return Ok(out);
        };
        let mut out: Vec<Selected> = Vec::with_capacity(items.len());
        for item in items {
            let selected = match item {
                Item::Highlight(_) => {
                    return Err(self.err("highlight() is for search(), not group by"))
                }
                Item::Field(f, alias) => {
                    let Some(position) = by.iter().position(|g| *g == f) else {
                        return Err(self.err(format!(
                            "{} is not a group by field: select the group fields and aggregates",
                            f.path
                        )));
                    };
                    Selected::Group {
                        position,
                        name: alias.unwrap_or(f.path),
                    }
                }
                Item::Call(func, path, alias, at) => {
                    let call = format!("{func}({})", path.as_deref().unwrap_or(""));
                    let (func, path) = crate::index::reduce::parse_call(&call)
                        .map_err(|e| error_at(self.text, at, e.to_string()))?;
                    let name = alias.unwrap_or_else(|| {
                        path.as_ref().map_or(func.to_string(), |p| {
                            format!("{func}_{}", p.replace(['.', '[', ']'], "_"))
                        })
                    });
                    Selected::Aggregate { func, path, name }
                }
            };
            if out.iter().any(|o| o.name() == selected.name()) {
                return Err(self.err(format!("two outputs are named {}", selected.name())));
            }
            out.push(selected);
        }
        Ok(out)
    }

    /// After `from`: `index 'name'`, or a collection.
    fn source(&mut self) -> Result<Source> {
        if self.eat_kw("index") {
            return match self.peek().clone() {
                Tok::Str(s) => {
                    self.bump();
                    Ok(Source::Index(s))
                }
                _ => Err(self.err("expected the index name as a quoted string")),
            };
        }
        match self.peek().clone() {
            Tok::Word(w) if !is_reserved(&w) => {
                let at = self.at();
                crate::model::id::validate_collection(&w)
                    .map_err(|e| error_at(self.text, at, e.to_string()))?;
                self.bump();
                Ok(Source::Collection(w))
            }
            Tok::Str(s) => {
                self.bump();
                Ok(Source::Collection(s))
            }
            _ => Err(self.err(format!(
                "expected a collection or index 'name', found {}",
                self.describe()
            ))),
        }
    }

    /// After `order`: `by` and up to 8 fields, each ascending or descending.
    fn order_by(&mut self) -> Result<Vec<(Field, bool)>> {
        self.expect_kw("by")?;
        let mut order = Vec::new();
        loop {
            let score = self.is_kw("score") && self.next_is_paren();
            let f = if score {
                self.bump();
                self.expect_sym("(")?;
                self.expect_sym(")")?;
                Field {
                    path: "score()".into(),
                    steps: Vec::new(),
                    ci: false,
                }
            } else {
                self.field()?
            };
            let desc = if self.eat_kw("desc") || self.eat_kw("descending") {
                true
            } else {
                // The best matches first, unless asked otherwise.
                !(self.eat_kw("asc") || self.eat_kw("ascending")) && score
            };
            order.push((f, desc));
            if order.len() > 8 {
                return Err(self.err("at most 8 fields in order by"));
            }
            if !self.eat_sym(",") {
                break;
            }
        }
        Ok(order)
    }

    fn count(&mut self, what: &str, max: usize) -> Result<usize> {
        let at = self.at();
        let v = match self.peek().clone() {
            Tok::Num(n) => {
                self.bump();
                Value::Number(
                    serde_json::from_str::<serde_json::Number>(&n)
                        .map_err(|_| error_at(self.text, at, format!("bad number {n}")))?,
                )
            }
            Tok::Param(p) => {
                self.bump();
                self.param(&p, at)?.clone()
            }
            _ => return Err(self.err(format!("expected a number after {what}"))),
        };
        match v.as_u64() {
            Some(n) if n as usize <= max => Ok(n as usize),
            Some(n) => Err(error_at(
                self.text,
                at,
                format!("{what} {n} exceeds the limit of {max}"),
            )),
            None => Err(error_at(
                self.text,
                at,
                format!("{what} must be a whole number >= 0"),
            )),
        }
    }

    fn param(&self, name: &str, at: usize) -> Result<&'a Value> {
        self.params
            .get(name)
            .ok_or_else(|| error_at(self.text, at, format!("parameter ${name} is not given")))
    }

    fn or_expr(&mut self, depth: usize) -> Result<Expr> {
        let mut parts = vec![self.and_expr(depth)?];
        while self.eat_kw("or") {
            parts.push(self.and_expr(depth)?);
        }
        Ok(if parts.len() == 1 {
            parts.pop().expect("one")
        } else {
            Expr::Or(parts)
        })
    }

    fn and_expr(&mut self, depth: usize) -> Result<Expr> {
        let mut parts = vec![self.unary(depth)?];
        while self.eat_kw("and") {
            parts.push(self.unary(depth)?);
        }
        Ok(if parts.len() == 1 {
            parts.pop().expect("one")
        } else {
            Expr::And(parts)
        })
    }

    fn unary(&mut self, depth: usize) -> Result<Expr> {
        if depth >= MAX_DEPTH {
            return Err(self.err(format!("expression nested deeper than {MAX_DEPTH}")));
        }
        self.terms += 1;
        if self.terms > MAX_TERMS {
            return Err(self.err(format!("more than {MAX_TERMS} terms")));
        }
        if self.eat_kw("not") {
            return Ok(Expr::Not(Box::new(self.unary(depth + 1)?)));
        }
        if self.eat_sym("(") {
            let e = self.or_expr(depth + 1)?;
            self.expect_sym(")")?;
            return Ok(e);
        }
        if let Some(e) = self.call()? {
            return Ok(e);
        }
        let f = self.field()?;
        if let Some(op) = cmp_op(self.peek()) {
            self.bump();
            let v = self.value(f.ci)?;
            return Ok(Expr::Cmp(f, op, v));
        }
        if self.eat_kw("in") {
            let values = self.in_values(f.ci)?;
            return Ok(Expr::In(f, values));
        }
        if self.eat_kw("between") {
            let at = self.at();
            let lo = self.value(f.ci)?;
            self.expect_kw("and")?;
            let hi = self.value(f.ci)?;
            if lo.class() != hi.class() {
                return Err(error_at(
                    self.text,
                    at,
                    "the bounds of between must be of the same type",
                ));
            }
            return Ok(Expr::Between(f, lo, hi));
        }
        if self.eat_kw("startsWith") {
            let p = self.string_value("startsWith")?;
            return Ok(Expr::StartsWith(f.clone(), fold(p, f.ci)));
        }
        if self.eat_kw("exists") {
            return Ok(Expr::Exists(f));
        }
        Err(self.err(format!(
            "expected an operator (= != < <= > >= in between startsWith exists) after the field, found {}",
            self.describe()
        )))
    }

    /// `exists(field)` or `startsWith(field, 'prefix')`, if that comes next.
    fn call(&mut self) -> Result<Option<Expr>> {
        if self.is_kw("exists") && self.next_is_paren() {
            self.bump();
            self.expect_sym("(")?;
            let f = self.field()?;
            self.expect_sym(")")?;
            return Ok(Some(Expr::Exists(f)));
        }
        if self.is_kw("search") && self.next_is_paren() {
            self.bump();
            self.expect_sym("(")?;
            let f = self.field()?;
            if f.ci {
                return Err(self.err("search() takes a path: its analyzer decides the case"));
            }
            self.expect_sym(",")?;
            let at = self.at();
            let text = self.string_value("search")?;
            let clauses = crate::search::text::parse(&text).map_err(|(offset, why)| {
                error_at(
                    self.text,
                    at,
                    format!("search text at byte {offset}: {why}"),
                )
            })?;
            self.expect_sym(")")?;
            return Ok(Some(Expr::Search(f, SearchText { text, clauses })));
        }
        if self.is_kw("startsWith") && self.next_is_paren() {
            self.bump();
            self.expect_sym("(")?;
            let f = self.field()?;
            self.expect_sym(",")?;
            let p = self.string_value("startsWith")?;
            self.expect_sym(")")?;
            let ci = f.ci;
            return Ok(Some(Expr::StartsWith(f, fold(p, ci))));
        }
        Ok(None)
    }

    /// The values after `in`: a parameter holding an array, or a list in brackets.
    fn in_values(&mut self, ci: bool) -> Result<Vec<Scalar>> {
        let at = self.at();
        let mut values = Vec::new();
        if let Tok::Param(p) = self.peek().clone() {
            self.bump();
            let Value::Array(items) = self.param(&p, at)? else {
                return Err(error_at(
                    self.text,
                    at,
                    format!("${p} must be an array for in"),
                ));
            };
            if items.len() > MAX_IN_VALUES {
                return Err(error_at(
                    self.text,
                    at,
                    format!(
                        "in list of {} values exceeds the limit of {MAX_IN_VALUES}",
                        items.len()
                    ),
                ));
            }
            for v in items {
                values.push(self.scalar(v, at, ci)?);
            }
        } else {
            self.expect_sym("(")?;
            loop {
                values.push(self.value(ci)?);
                if values.len() > MAX_IN_VALUES {
                    return Err(self.err(format!(
                        "in list longer than the limit of {MAX_IN_VALUES} values"
                    )));
                }
                if !self.eat_sym(",") {
                    break;
                }
            }
            self.expect_sym(")")?;
        }
        Ok(values)
    }

    fn next_is_paren(&self) -> bool {
        matches!(
            self.toks.get(self.pos + 1).map(|t| &t.tok),
            Some(Tok::Sym("("))
        )
    }

    fn field(&mut self) -> Result<Field> {
        let at = self.at();
        let Tok::Word(w) = self.peek().clone() else {
            return Err(self.err(format!("expected a field, found {}", self.describe())));
        };
        if w.eq_ignore_ascii_case("lower") && self.next_is_paren() {
            self.bump();
            self.bump();
            let mut f = self.field()?;
            self.expect_sym(")")?;
            f.ci = true;
            return Ok(f);
        }
        if is_reserved(&w) {
            return Err(self.err(format!("expected a field, found the keyword {w:?}")));
        }
        self.bump();
        let steps = parse_path(&w).map_err(|e| error_at(self.text, at, e.to_string()))?;
        Ok(Field {
            path: w,
            steps,
            ci: false,
        })
    }

    fn string_value(&mut self, what: &str) -> Result<String> {
        let at = self.at();
        match self.value(false)? {
            Scalar::String(s) => Ok(s),
            _ => Err(error_at(self.text, at, format!("{what} takes a string"))),
        }
    }

    fn value(&mut self, ci: bool) -> Result<Scalar> {
        let at = self.at();
        let v = match self.peek().clone() {
            Tok::Str(s) => Value::String(s),
            Tok::Num(n) => Value::Number(
                serde_json::from_str::<serde_json::Number>(&n)
                    .map_err(|_| self.err(format!("bad number {n}")))?,
            ),
            Tok::Param(p) => self.param(&p, at)?.clone(),
            Tok::Word(w) if w.eq_ignore_ascii_case("true") => Value::Bool(true),
            Tok::Word(w) if w.eq_ignore_ascii_case("false") => Value::Bool(false),
            Tok::Word(w) if w.eq_ignore_ascii_case("null") => Value::Null,
            _ => return Err(self.err(format!("expected a value, found {}", self.describe()))),
        };
        self.bump();
        self.scalar(&v, at, ci)
    }

    fn scalar(&self, v: &Value, at: usize, ci: bool) -> Result<Scalar> {
        let s = Scalar::from_json(v).ok_or_else(|| {
            error_at(
                self.text,
                at,
                "a value must be a string, number, boolean or null (not an array or object)",
            )
        })?;
        Ok(if ci { s.folded() } else { s })
    }
}

fn cmp_op(t: &Tok) -> Option<CmpOp> {
    Some(match t {
        Tok::Sym("=") => CmpOp::Eq,
        Tok::Sym("!=") => CmpOp::Ne,
        Tok::Sym("<") => CmpOp::Lt,
        Tok::Sym("<=") => CmpOp::Le,
        Tok::Sym(">") => CmpOp::Gt,
        Tok::Sym(">=") => CmpOp::Ge,
        _ => return None,
    })
}

fn fold(s: String, ci: bool) -> String {
    if ci {
        s.to_lowercase()
    } else {
        s
    }
}

fn is_reserved(w: &str) -> bool {
    const RESERVED: [&str; 16] = [
        "from", "index", "where", "and", "or", "not", "order", "by", "limit", "offset", "select",
        "in", "between", "true", "false", "null",
    ];
    RESERVED.iter().any(|r| r.eq_ignore_ascii_case(w))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(q: &str) -> Result<Query> {
        parse(q, &Map::new())
    }

    #[test]
    fn parses_the_example() {
        let mut params = Map::new();
        params.insert("min".into(), serde_json::json!(21));
        let q = parse(
            "from users where age >= $min and name startsWith 'A'\norder by age desc, name limit 20 offset 40 select name, age",
            &params,
        )
        .unwrap();
        assert_eq!(q.source, Source::Collection("users".into()));
        assert_eq!(q.limit, 20);
        assert_eq!(q.offset, 40);
        assert_eq!(q.order.len(), 2);
        assert!(q.order[0].1);
        assert!(matches!(q.filter, Some(Expr::And(ref v)) if v.len() == 2));
    }

    #[test]
    fn errors_point_at_line_and_column() {
        match p("from users\nwhere n >") {
            Err(DocError::Query(QueryError::Invalid { line, column, .. })) => {
                assert_eq!((line, column), (2, 10))
            }
            other => panic!("{other:?}"),
        }
        match p("from users where n = 1 limit 999999999") {
            Err(DocError::Query(QueryError::Invalid { message, .. })) => {
                assert!(message.contains("limit"))
            }
            other => panic!("{other:?}"),
        }
        let deep = format!("from u where {}n = 1{}", "(".repeat(100), ")".repeat(100));
        assert!(matches!(
            p(&deep),
            Err(DocError::Query(QueryError::Invalid { .. }))
        ));
        assert!(matches!(
            p("from u where n = $x"),
            Err(DocError::Query(QueryError::Invalid { .. }))
        ));
        assert!(matches!(
            p("from u where n between 1 and 'a'"),
            Err(DocError::Query(QueryError::Invalid { .. }))
        ));
        assert!(matches!(
            p("from u where n = 'unterminated"),
            Err(DocError::Query(QueryError::Invalid { .. }))
        ));
    }
}

/// The parser's input comes from clients: whatever the text, it answers with a query
/// or an `InvalidQuery` that points inside the text, and never panics.
#[cfg(test)]
mod never_panics {
    use super::*;
    use proptest::prelude::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Pieces a query is made of, and pieces that break it: keywords in any case,
    /// names and paths, every operator, strings (closed, unclosed, escaped,
    /// non-ASCII), numbers (huge, negative, fractional, malformed), parameters that
    /// exist and do not, brackets, stray bytes.
    fn piece() -> impl Strategy<Value = String> {
        let fixed = prop::sample::select(vec![
            "from",
            "FROM",
            "where",
            "Where",
            "index",
            "order",
            "by",
            "asc",
            "desc",
            "limit",
            "offset",
            "select",
            "and",
            "or",
            "not",
            "exists",
            "startsWith",
            "in",
            "between",
            "lower",
            "true",
            "false",
            "null",
            "users",
            "u",
            "name",
            "age",
            "a.b",
            "tags[]",
            "a[].b",
            "x.",
            ".x",
            "[]",
            "=",
            "==",
            "!=",
            "<>",
            "<",
            "<=",
            ">",
            ">=",
            "(",
            ")",
            ",",
            ".",
            "'Ann'",
            "\"Bo\"",
            "'it''s'",
            "'\\''",
            "'unclosed",
            "\"",
            "'é'",
            "1",
            "0",
            "-1",
            "2.5",
            "1e400",
            "99999999999999999999999",
            "1.2.3",
            "-",
            "$min",
            "$list",
            "$missing",
            "$",
            "\n",
            "\t",
            "é",
            "日本",
            "\u{0}",
            "%",
            "@",
            "#",
            "`",
            "\\",
        ])
        .prop_map(str::to_string);
        prop_oneof![8 => fixed, 1 => "\\PC{0,6}", 1 => "[a-z_]{1,12}"]
    }

    /// A query that follows the grammar, so that a good share of cases parse.
    fn grammatical() -> impl Strategy<Value = String> {
        let field = prop::sample::select(vec!["name", "age", "a.b", "tags[]", "lower(name)"]);
        let value = prop::sample::select(vec!["1", "-2.5", "'x'", "true", "null", "$min"]);
        let op = prop::sample::select(vec!["=", "!=", "<", ">=", "<>"]);
        (
            prop::sample::select(vec!["from users", "from index 'by_age'", "FROM u"]),
            prop::option::of((field.clone(), op, value)),
            prop::option::of((field, prop::bool::ANY)),
            prop::option::of(0usize..20_000),
        )
            .prop_map(|(from, cond, order, limit)| {
                let mut q = from.to_string();
                if let Some((f, o, v)) = cond {
                    q += &format!(" where {f} {o} {v}");
                }
                if let Some((f, desc)) = order {
                    q += &format!(" order by {f}{}", if desc { " desc" } else { "" });
                }
                if let Some(l) = limit {
                    q += &format!(" limit {l}");
                }
                q
            })
    }

    fn params() -> Map<String, Value> {
        let mut p = Map::new();
        p.insert("min".into(), serde_json::json!(21));
        p.insert("list".into(), serde_json::json!([1, "a", null]));
        p
    }

    /// Parses `text` and checks what any answer must satisfy. `None`: it parsed;
    /// otherwise the error's line and column.
    fn check(text: &str) -> Option<(usize, usize)> {
        match parse(text, &params()) {
            Ok(q) => {
                assert!(q.limit <= MAX_LIMIT, "limit {} over the maximum", q.limit);
                assert!(
                    q.offset <= MAX_OFFSET,
                    "offset {} over the maximum",
                    q.offset
                );
                None
            }
            Err(DocError::Query(QueryError::Invalid {
                line,
                column,
                message,
            })) => {
                let lines = text.matches('\n').count() + 1;
                assert!(
                    (1..=lines).contains(&line),
                    "line {line} of {lines}: {message}"
                );
                let line_text = text.split('\n').nth(line - 1).unwrap_or("");
                let columns = line_text.chars().count() + 1;
                assert!(
                    (1..=columns).contains(&column),
                    "column {column} of {columns}: {message}"
                );
                assert!(!message.is_empty());
                Some((line, column))
            }
            Err(other) => panic!("not an InvalidQuery: {other:?}"),
        }
    }

    const CASES: u32 = 3000;

    fn cases() -> ProptestConfig {
        ProptestConfig {
            cases: CASES,
            ..ProptestConfig::default()
        }
    }

    #[test]
    fn pieces_in_any_order_never_panic_and_errors_point_inside_the_text() {
        let advanced = AtomicUsize::new(0);
        let separator = prop::sample::select(vec![" ", " ", " ", "", "\n"]);
        let start = prop::sample::select(vec!["", "from users ", "from users where "]);
        proptest!(cases(), |(start in start, pieces in prop::collection::vec((piece(), separator), 0..24))| {
            let text: String = std::iter::once(start)
                .chain(pieces.iter().flat_map(|(p, s)| [p.as_str(), *s]))
                .collect();
            // Past its start: a query, or an error after the first `start` bytes.
            let past_start = check(&text)
                .is_none_or(|(line, column)| line > 1 || column > start.len() + 1);
            advanced.fetch_add(usize::from(past_start), Ordering::Relaxed);
        });
        // Without a check that cases get past the first words, a parser that refused
        // everything at once would pass.
        let advanced = advanced.load(Ordering::Relaxed) as u32;
        assert!(
            advanced > CASES / 10,
            "only {advanced} cases got past their start"
        );
    }

    #[test]
    fn grammatical_queries_parse_and_damaged_ones_fail_cleanly() {
        let parsed = AtomicUsize::new(0);
        proptest!(cases(), |(q in grammatical(), cut in any::<prop::sample::Index>(), byte in any::<u8>())| {
            let whole = check(&q).is_none();
            // A limit over the maximum is the one way a grammatical query may fail.
            let over_limit = q.rsplit(' ').next().and_then(|l| l.parse::<usize>().ok())
                .is_some_and(|l| q.contains(" limit ") && l > MAX_LIMIT);
            prop_assert!(whole || over_limit, "{q:?} did not parse");
            parsed.fetch_add(usize::from(whole), Ordering::Relaxed);
            // Cut anywhere (on a character boundary), or one byte replaced.
            let mut at = cut.index(q.len() + 1);
            while !q.is_char_boundary(at) {
                at -= 1;
            }
            check(&q[..at]);
            let mut bytes = q.clone().into_bytes();
            if !bytes.is_empty() {
                let i = cut.index(bytes.len());
                bytes[i] = byte;
                check(&String::from_utf8_lossy(&bytes));
            }
        });
        assert!(parsed.load(Ordering::Relaxed) as u32 > CASES / 2);
    }
}
