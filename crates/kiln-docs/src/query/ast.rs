//! A parsed query: its source, its `where` as an expression tree, its grouping,
//! ordering, paging and selection (`parse.rs` makes it; `plan.rs`, `walk.rs`,
//! `eval.rs` and `group.rs` read it).

use crate::index::def::Step;
use crate::index::value::Scalar;

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Source {
    Collection(String),
    Index(String),
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Field {
    pub path: String,
    pub steps: Vec<Step>,
    /// `lower(path)`: compared case-insensitively.
    pub ci: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Expr {
    And(Vec<Expr>),
    Or(Vec<Expr>),
    Not(Box<Expr>),
    Cmp(Field, CmpOp, Scalar),
    In(Field, Vec<Scalar>),
    Between(Field, Scalar, Scalar),
    StartsWith(Field, String),
    Exists(Field),
    /// `search(path, 'text')`: full-text, only answered by a full-text index.
    Search(Field, SearchText),
}

/// The text of a `search()` as written and parsed (`search/text.rs`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SearchText {
    pub text: String,
    pub clauses: Vec<crate::search::text::Clause>,
}

impl Expr {
    /// Whether a `search()` appears anywhere in this expression.
    pub fn has_search(&self) -> bool {
        match self {
            Expr::Search(..) => true,
            Expr::And(parts) | Expr::Or(parts) => parts.iter().any(Expr::has_search),
            Expr::Not(inner) => inner.has_search(),
            _ => false,
        }
    }
}

impl Field {
    /// `score()` in an `order by` (a field has at least one step).
    pub fn is_score(&self) -> bool {
        self.steps.is_empty()
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Query {
    pub source: Source,
    pub filter: Option<Expr>,
    pub order: Vec<(Field, bool)>,
    pub limit: usize,
    pub offset: usize,
    pub select: Option<Vec<Field>>,
    /// `select highlight(path)`: snippets of full-text fields, in `@metadata`.
    pub highlight: Vec<Field>,
    /// `group by`: one result per group (`select` is then `None`).
    pub group: Option<Grouping>,
}

/// A grouped query's groups and what it selects of each.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Grouping {
    pub by: Vec<Field>,
    pub select: Vec<Selected>,
}

/// One output of a grouped query, by its name in the results.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Selected {
    /// The value of the group field `by[position]`.
    Group { position: usize, name: String },
    Aggregate {
        func: crate::index::reduce::Func,
        path: Option<String>,
        name: String,
    },
}

impl Selected {
    pub fn name(&self) -> &str {
        match self {
            Selected::Group { name, .. } | Selected::Aggregate { name, .. } => name,
        }
    }
}
