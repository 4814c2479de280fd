"""The query builder: text in the server's query language, values as parameters.

``session.query("users").where_greater_than("age", 30).order_by("name").take(20)``
is ``from users where age > $p0 order by name limit 20`` with ``{"p0": 30}``.
Values are never spliced into the text; field, collection and index names are checked
against the language's grammar (or quoted) and anything else is refused.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import (TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Sequence, Tuple)

# For annotations only: store.py builds this module's objects and hands itself to
# them, so naming its types at run time would be an import circle.
if TYPE_CHECKING:
    from .session import Session

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_FIELD_RE = re.compile(rf"^{_IDENT}(\[\])?(\.{_IDENT}(\[\])?)*$")
_COLLECTION_RE = re.compile(rf"^{_IDENT}$")
_KEYWORDS = {"from", "where", "and", "or", "not", "order", "by", "asc", "desc", "limit",
             "offset", "select", "between", "in", "startswith", "exists", "index", "true",
             "false", "null"}


def check_field(name: str) -> str:
    """A field path (``age``, ``address.city``, ``tags[]``), or ValueError."""
    if not isinstance(name, str) or not _FIELD_RE.match(name) or name.lower() in _KEYWORDS:
        raise ValueError(f"invalid field path {name!r}: identifiers joined by '.', "
                         "optionally ending in [] (each element of an array)")
    return name


def quote_string(text: str) -> str:
    """A single-quoted string literal of the language (for an index name)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


@dataclass
class QueryResult:
    """What ``POST /dbs/{db}/queries`` answered."""

    results: List[Any]
    total: int
    skipped: int = 0
    #: True when the index had not caught up at the query's snapshot.
    stale: bool = False
    index: Optional[str] = None
    index_etag: Optional[str] = None
    duration_ms: Optional[float] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)
    #: "" (a fresh answer), "304" (revalidated) or "aggressive".
    from_cache: str = ""
    #: With ``search()``: each result's BM25 score (``@metadata.@score``, None without
    #: one) and ``select highlight(path)``'s snippets (``@metadata.@highlights``: path ->
    #: HTML, the text escaped and the matched words in ``<b>``), in the order of
    #: ``results``. Taken out of the documents' ``@metadata`` (the raw answer keeps
    #: them), so that a search result saved again does not store them.
    scores: List[Optional[float]] = field(default_factory=list)
    highlights: List[Dict[str, str]] = field(default_factory=list)

    def hits(self) -> Iterator[Tuple[Any, Optional[float], Dict[str, str]]]:
        """``(document, score, highlights)`` for each result."""
        return iter(zip(self.results, self.scores, self.highlights))

    def __iter__(self) -> Iterator[Any]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)


class Query:
    """Built by :meth:`Session.query` / :meth:`Session.raw_query`. Each ``where_*``
    clause joins the previous one with ``and`` unless :meth:`or_else` came between.
    """

    def __init__(self, session: Optional["Session"], collection: Optional[str] = None, *,
                 index: Optional[str] = None, raw: Optional[str] = None,
                 raw_params: Optional[Dict[str, Any]] = None,
                 cls: Optional[type] = None) -> None:
        if raw is None and (collection is None) == (index is None):
            raise ValueError("give a collection or an index (one of them)")
        if collection is not None and not _COLLECTION_RE.match(collection):
            raise ValueError(f"invalid collection name {collection!r}")
        self._session = session
        self._collection = collection
        self._index = index
        self._raw = raw
        self._params: Dict[str, Any] = dict(raw_params or {})
        self._where: List[str] = []
        self._next_join = "and"
        self._negate = False
        self._open = 0
        self._order: List[str] = []
        self._limit: Optional[int] = None
        self._offset: Optional[int] = None
        self._select: List[str] = []
        self._group: List[str] = []
        self._aggregates: List[str] = []
        self._highlight: List[str] = []
        self._wait_ms: Optional[int] = None
        self._cls = cls
        self._n = 0

    # --- where ---------------------------------------------------------------------------

    def _param(self, value: Any) -> str:
        while f"p{self._n}" in self._params:
            self._n += 1
        name = f"p{self._n}"
        self._n += 1
        self._params[name] = value
        return f"${name}"

    def _clause(self, text: str) -> "Query":
        if self._raw is not None:
            raise ValueError("a raw query takes no builder clauses")
        if self._where and not self._where[-1].endswith("("):
            self._where.append(self._next_join)
        if self._negate:
            text = f"not {text}"
            self._negate = False
        self._where.append(text)
        self._next_join = "and"
        return self

    def _cmp(self, name: str, op: str, value: Any) -> "Query":
        return self._clause(f"{check_field(name)} {op} {self._param(value)}")

    def where_equals(self, name: str, value: Any) -> "Query":
        return self._cmp(name, "=", value)

    def where_not_equals(self, name: str, value: Any) -> "Query":
        return self._cmp(name, "!=", value)

    def where_greater_than(self, name: str, value: Any) -> "Query":
        return self._cmp(name, ">", value)

    def where_greater_than_or_equal(self, name: str, value: Any) -> "Query":
        return self._cmp(name, ">=", value)

    def where_less_than(self, name: str, value: Any) -> "Query":
        return self._cmp(name, "<", value)

    def where_less_than_or_equal(self, name: str, value: Any) -> "Query":
        return self._cmp(name, "<=", value)

    def where_between(self, name: str, low: Any, high: Any) -> "Query":
        return self._clause(
            f"{check_field(name)} between {self._param(low)} and {self._param(high)}")

    def where_in(self, name: str, values: Sequence[Any]) -> "Query":
        return self._clause(f"{check_field(name)} in {self._param(list(values))}")

    def where_starts_with(self, name: str, prefix: str) -> "Query":
        return self._cmp(name, "startsWith", prefix)

    def where_exists(self, name: str) -> "Query":
        return self._clause(f"exists({check_field(name)})")

    def search(self, name: str, text: str) -> "Query":
        """A full-text condition, ``search(name, $p)`` with ``text`` as the parameter:
        words (any of them; more of them and rarer ones rank higher), ``"a phrase"``,
        ``prefix*``, ``+required``, ``-excluded``, ``word^2`` (boost). Needs a full-text
        index of the collection with ``name`` (``"search": true``); a condition of the
        where's top-level ``and`` (not after :meth:`or_else`, under :meth:`not_` or in a
        subclause: the server refuses those)."""
        if not isinstance(text, str):
            raise ValueError("search() needs the text as a string")
        return self._clause(f"search({check_field(name)}, {self._param(text)})")

    def and_also(self) -> "Query":
        self._next_join = "and"
        return self

    def or_else(self) -> "Query":
        if not self._where or self._where[-1].endswith("("):
            raise ValueError("or_else() needs a clause before it")
        self._next_join = "or"
        return self

    def not_(self) -> "Query":
        """Negates the next clause or sub-clause."""
        self._negate = not self._negate
        return self

    def open_subclause(self) -> "Query":
        if self._where and not self._where[-1].endswith("("):
            self._where.append(self._next_join)
        self._where.append("not (" if self._negate else "(")
        self._negate = False
        self._next_join = "and"
        self._open += 1
        return self

    def close_subclause(self) -> "Query":
        if self._open == 0 or not self._where or self._where[-1] in ("(", "not ("):
            raise ValueError("close_subclause() without an open, non-empty subclause")
        self._where.append(")")
        self._open -= 1
        return self

    # --- the rest --------------------------------------------------------------------------

    def order_by(self, *names: str) -> "Query":
        self._order += [check_field(n) for n in names]
        return self

    def order_by_descending(self, *names: str) -> "Query":
        self._order += [f"{check_field(n)} desc" for n in names]
        return self

    def order_by_score(self, ascending: bool = False) -> "Query":
        """Orders by the :meth:`search` relevance (BM25), best first unless ``ascending``;
        each result's score is in :attr:`QueryResult.scores`."""
        self._order.append("score() asc" if ascending else "score()")
        return self

    def highlight(self, *names: str) -> "Query":
        """Asks for snippets of these full-text fields with the matched words in
        ``<b>`` (:attr:`QueryResult.highlights`); the documents stay whole."""
        self._highlight += [f"highlight({check_field(n)})" for n in names]
        return self

    def take(self, n: int) -> "Query":
        if not isinstance(n, int) or n < 0:
            raise ValueError("take() needs a non-negative integer")
        self._limit = n
        return self

    def skip(self, n: int) -> "Query":
        if not isinstance(n, int) or n < 0:
            raise ValueError("skip() needs a non-negative integer")
        self._offset = n
        return self

    def select_fields(self, *names: str) -> "Query":
        """Projects the results to these fields (they are not tracked by the session)."""
        self._select += [check_field(n) for n in names]
        return self

    def group_by(self, *names: str) -> "Query":
        """One result per group of these fields: a plain dict of the group fields and
        the :meth:`aggregate` outputs (``count`` when none is asked for). A reduce index
        with the same fields and aggregates answers it (else the server reduces a
        scan)."""
        if not names:
            raise ValueError("group_by() needs at least one field")
        self._group += [check_field(n) for n in names]
        return self

    def aggregate(self, name: str, function: str, field: Optional[str] = None) -> "Query":
        """Adds an output ``name``: ``function`` is count, sum, avg, min or max (all but
        count of ``field``), e.g. ``.aggregate("total", "sum", "amount")``."""
        function = function.lower()
        if function not in ("count", "sum", "avg", "min", "max"):
            raise ValueError(f"unknown aggregate {function!r}: count, sum, avg, min or max")
        if (function == "count") != (field is None):
            raise ValueError("count takes no field; sum, avg, min and max take one")
        arg = "" if field is None else check_field(field)
        self._aggregates.append(f"{function}({arg}) as {check_field(name)}")
        return self

    def wait_for_non_stale(self, timeout_ms: int = 15_000) -> "Query":
        """The server waits (bounded) for the index to catch up with the database's
        etag at the time of the query."""
        self._wait_ms = int(timeout_ms)
        return self

    # --- the text --------------------------------------------------------------------------

    def to_rql(self) -> Tuple[str, Dict[str, Any]]:
        """``(text, params)`` as sent to the server."""
        if self._raw is not None:
            return self._raw, dict(self._params)
        if self._open:
            raise ValueError(f"{self._open} subclause(s) left open")
        if self._collection is not None:
            parts = [f"from {self._collection}"]
        else:
            parts = [f"from index {quote_string(self._index or '')}"]
        if self._where:
            text = ""
            for tok in self._where:
                if tok == ")":
                    text += ")"
                elif text.endswith("("):
                    text += tok
                else:
                    text += (" " if text else "") + tok
            parts.append(f"where {text}")
        if self._aggregates and not self._group:
            raise ValueError("aggregate() needs group_by()")
        if self._group:
            parts.append("group by " + ", ".join(self._group))
        if self._order:
            parts.append("order by " + ", ".join(self._order))
        if self._limit is not None:
            parts.append(f"limit {self._limit}")
        if self._offset is not None:
            parts.append(f"offset {self._offset}")
        outputs = self._select + self._aggregates
        if self._group and not self._select:
            outputs = self._group + self._aggregates
        if outputs and (self._aggregates or self._select):
            outputs = outputs + self._highlight
        else:
            outputs = list(self._highlight)
        if outputs:
            parts.append("select " + ", ".join(outputs))
        return " ".join(parts), dict(self._params)

    def __str__(self) -> str:
        return self.to_rql()[0]

    def request_body(self) -> Dict[str, Any]:
        text, params = self.to_rql()
        body: Dict[str, Any] = {"query": text, "params": params}
        if self._wait_ms is not None:
            body["wait_for_non_stale_ms"] = self._wait_ms
        return body

    # --- running -------------------------------------------------------------------------

    def execute(self) -> QueryResult:
        """Runs the query (``POST /dbs/{db}/queries``, through the HTTP cache)."""
        if self._session is None:
            raise ValueError("this query is not bound to a session")
        s = self._session
        store = s.document_store
        body = json.dumps(self.request_body(), separators=(",", ":"), sort_keys=True).encode()
        r = store.cached_request("POST", f"{store.db_path}/queries", body=body,
                                 on_request=s._count_request)
        return self._result(json.loads(r.content), r.from_cache)

    def _result(self, a: Dict[str, Any], from_cache: str) -> QueryResult:
        results, scores, highlights = _take_search_metadata(a.get("results", []))
        if not self._select and not self._group and self._session is not None:
            results = [self._session._track_query_result(d, self._cls) for d in results]
        return QueryResult(results=results, total=int(a.get("total", len(results))),
                           skipped=int(a.get("skipped", 0)), stale=bool(a.get("stale")),
                           index=a.get("index"), index_etag=a.get("index_etag"),
                           duration_ms=a.get("duration_ms"), raw=a, from_cache=from_cache,
                           scores=scores, highlights=highlights)

    def to_list(self) -> List[Any]:
        return self.execute().results

    def first(self) -> Optional[Any]:
        saved = self._limit
        self._limit = 1
        try:
            res = self.execute().results
        finally:
            self._limit = saved
        return res[0] if res else None

    def count(self) -> int:
        """The exact number of matches (the answer's ``total``)."""
        saved = self._limit
        self._limit = 1
        try:
            return self.execute().total
        finally:
            self._limit = saved

    def __iter__(self) -> Iterator[Any]:
        return iter(self.execute().results)


def _take_search_metadata(results: List[Any]) -> Tuple[List[Any], List[Optional[float]],
                                                       List[Dict[str, str]]]:
    """The results without ``@score`` and ``@highlights`` in their ``@metadata`` (new
    dicts: the raw answer keeps them), and those values, one per result."""
    out: List[Any] = []
    scores: List[Optional[float]] = []
    highlights: List[Dict[str, str]] = []
    for r in results:
        meta = r.get("@metadata") if isinstance(r, dict) else None
        if isinstance(meta, dict) and ("@score" in meta or "@highlights" in meta):
            meta = dict(meta)
            score = meta.pop("@score", None)
            scores.append(float(score) if isinstance(score, (int, float)) else None)
            highlights.append(dict(meta.pop("@highlights", None) or {}))
            r = {**r, "@metadata": meta}
        else:
            scores.append(None)
            highlights.append({})
        out.append(r)
    return out, scores, highlights
