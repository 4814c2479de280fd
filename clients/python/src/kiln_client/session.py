"""The session: a unit of work with an identity map.

``load`` returns the same object for the same id within a session; changes made to
loaded dicts or dataclasses are found by comparing them with what was loaded;
``save_changes`` sends every new, changed and deleted document in ONE batch (one
transaction, all or nothing) with ``If-Match`` on every document the session loaded,
so a document changed by someone else meanwhile fails the whole batch with a
:class:`~kiln_client.errors.ConcurrencyError`.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from typing import (TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Set, Tuple, Type,
                    TypeVar)

from .errors import (ConcurrencyError, DocumentNotFoundError, RequestBudgetExceededError,
                     RetryConflictError, SessionClosedError)

# For annotations only: store.py builds this module's objects and hands itself to
# them, so naming its types at run time would be an import circle.
if TYPE_CHECKING:
    from .query import Query, QueryResult
    from .store import DocumentStore

T = TypeVar("T")

_SERVER_META = ("@id", "@etag", "@last-modified")
_oid = id  # `id` is also a parameter name below


def to_document(entity: Any) -> Dict[str, Any]:
    """The JSON object stored for an entity (a dict, or a dataclass instance)."""
    if isinstance(entity, dict):
        return entity
    if dataclasses.is_dataclass(entity) and not isinstance(entity, type):
        d = dataclasses.asdict(entity)
        d.pop("id", None)
        d["@metadata"] = {"@collection": collection_of_class(type(entity))}
        return d
    raise TypeError(f"a document is a dict or a dataclass instance, not {type(entity)!r}")


def collection_of_class(cls: type) -> str:
    """``User`` -> ``users``, ``OrderLine`` -> ``orderlines`` (a ``__collection__``
    class attribute overrides)."""
    explicit = getattr(cls, "__collection__", None)
    if isinstance(explicit, str):
        return explicit
    name = cls.__name__.lower()
    if name.endswith("y") and not name.endswith(("ay", "ey", "oy", "uy")):
        return name[:-1] + "ies"
    if name.endswith(("s", "x", "ch", "sh")):
        return name + "es"
    return name + "s"


def collection_prefix(entity: Any, body: Optional[Dict[str, Any]] = None) -> str:
    """The id prefix (``users/``) under which the server generates an id."""
    body = body if body is not None else to_document(entity)
    meta = body.get("@metadata")
    if isinstance(meta, dict) and isinstance(meta.get("@collection"), str):
        return str(meta["@collection"]) + "/"
    raise ValueError("no id given and no collection known: pass id= (or a prefix such as "
                     "'users/'), use a dataclass, or set @metadata.@collection")


def _snapshot(body: Dict[str, Any]) -> str:
    b = {k: v for k, v in body.items() if k != "@metadata"}
    meta = body.get("@metadata")
    if isinstance(meta, dict):
        b["@metadata"] = {k: v for k, v in meta.items() if k not in _SERVER_META}
    return json.dumps(b, sort_keys=True, separators=(",", ":"), default=str)


def _from_document(cls: Type[T], doc_id: str, body: Dict[str, Any]) -> T:
    names = {f.name for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    kwargs = {k: v for k, v in body.items() if k in names}
    if "id" in names:
        kwargs["id"] = doc_id
    return cls(**kwargs)


@dataclasses.dataclass
class _Tracked:
    id: Optional[str]
    entity: Any
    etag: Optional[str]
    snapshot: Optional[str]
    #: The prefix to generate an id under (a new document without an id).
    prefix: Optional[str] = None
    deleted: bool = False


class Session:
    """Made by :meth:`DocumentStore.session`; use it as a context manager."""

    def __init__(self, store: "DocumentStore", max_requests: int = 30) -> None:
        self.document_store = store
        self.max_requests = max_requests
        #: Requests this session sent to the server (304s count, aggressive hits don't).
        self.requests = 0
        self._by_id: Dict[str, _Tracked] = {}
        self._by_obj: Dict[int, _Tracked] = {}
        self._missing: Set[str] = set()
        self._deletes: Dict[str, Optional[str]] = {}
        self._new: List[_Tracked] = []
        self._closed = False

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._closed = True

    # --- the request budget --------------------------------------------------------------

    def _count_request(self) -> None:
        if self._closed:
            raise SessionClosedError("the session is closed")
        if self.requests >= self.max_requests:
            raise RequestBudgetExceededError(
                f"this session already made {self.requests} requests, its budget "
                f"(max_requests={self.max_requests}): a loop of loads would hammer the "
                "server. Load what you need once (load_many, a query), use a new session "
                "per unit of work, or raise max_requests if you mean it.")
        self.requests += 1

    # --- loading ------------------------------------------------------------------------

    def load(self, doc_id: str, cls: Optional[Type[T]] = None) -> Any:
        """The document (a dict, or an instance of the dataclass ``cls``), or None if it
        does not exist. Loading an id again returns the same object."""
        known, value = self._known(doc_id)
        if known:
            return value
        try:
            r = self.document_store.cached_request("GET", self.document_store.doc_path(doc_id),
                                          on_request=self._count_request, is_document=True)
        except DocumentNotFoundError:
            self._missing.add(doc_id)
            return None
        body = json.loads(r.content)
        return self._track_loaded(doc_id, body, r.etag, cls)

    def _known(self, doc_id: str) -> Tuple[bool, Any]:
        """(True, the object or None) when the session knows the id without asking."""
        t = self._by_id.get(doc_id)
        if t is not None:
            return True, (None if t.deleted else t.entity)
        if doc_id in self._missing:
            return True, None
        return False, None

    def load_many(self, ids: Iterable[str], cls: Optional[Type[T]] = None) -> Dict[str, Any]:
        """``{id: document or None}``; each id not yet in the session costs a request."""
        return {i: self.load(i, cls) for i in ids}

    def _track_loaded(self, doc_id: str, body: Dict[str, Any], etag: Optional[str],
                      cls: Optional[type]) -> Any:
        existing = self._by_id.get(doc_id)
        if existing is not None:
            return existing.entity
        entity: Any = body if cls is None else _from_document(cls, doc_id, body)
        if etag is None:
            meta = body.get("@metadata") or {}
            etag = meta.get("@etag")
        snap = _snapshot(to_document(entity) if cls is not None else copy.deepcopy(body))
        t = _Tracked(doc_id, entity, etag, snap)
        self._by_id[doc_id] = t
        self._by_obj[_oid(entity)] = t
        return entity

    # --- changing -----------------------------------------------------------------------

    def store(self, entity: Any, id: Optional[str] = None) -> None:
        """Adds a new document to the session (written by :meth:`save_changes`).

        ``id`` None, or ending in ``/``, has the server generate one (under the
        dataclass's collection, or ``@metadata.@collection``); it is known after
        ``save_changes`` (:meth:`id_of`)."""
        t = self._by_obj.get(_oid(entity))
        if t is not None:
            if id is not None and t.id is not None and id != t.id:
                raise ValueError(f"this object is already in the session as {t.id!r}")
            return  # already tracked: its changes are found by save_changes
        prefix = None
        if id is None or id.endswith("/"):
            prefix = id or collection_prefix(entity)
            doc_id = None
        else:
            doc_id = id
            if doc_id in self._by_id and not self._by_id[doc_id].deleted:
                raise ValueError(f"another object is already in the session as {doc_id!r}")
        t = _Tracked(doc_id, entity, None, None, prefix=prefix)
        if doc_id is not None:
            self._by_id[doc_id] = t
            self._missing.discard(doc_id)
            self._deletes.pop(doc_id, None)
        self._by_obj[_oid(entity)] = t
        self._new.append(t)

    def delete(self, entity_or_id: Any) -> None:
        """Deletes a document: a loaded one with If-Match, an id not loaded without."""
        if isinstance(entity_or_id, str):
            t = self._by_id.get(entity_or_id)
            doc_id = entity_or_id
        else:
            t = self._by_obj.get(_oid(entity_or_id))
            if t is None or t.id is None:
                raise ValueError("this object is not a stored document of the session")
            doc_id = t.id
        if t is not None:
            if t in self._new:
                self._new.remove(t)
                self._by_obj.pop(_oid(t.entity), None)
                self._by_id.pop(doc_id, None)
                if t.etag is None:
                    return
            t.deleted = True
            self._deletes[doc_id] = t.etag
        else:
            self._deletes[doc_id] = None
            self._missing.add(doc_id)

    def id_of(self, entity: Any) -> Optional[str]:
        t = self._by_obj.get(_oid(entity))
        return t.id if t else None

    def etag_of(self, entity: Any) -> Optional[str]:
        t = self._by_obj.get(_oid(entity))
        return t.etag if t else None

    def has_changes(self) -> bool:
        return bool(self._pending())

    def _pending(self) -> List[Dict[str, Any]]:
        ops: List[Dict[str, Any]] = []
        self._op_targets: List[_Tracked] = []
        new_ids = {_oid(t) for t in self._new}
        for t in self._new:
            op: Dict[str, Any] = {"op": "put", "id": t.id if t.id else t.prefix,
                                  "document": to_document(t.entity)}
            ops.append(op)
            self._op_targets.append(t)
        for doc_id, t in self._by_id.items():
            if _oid(t) in new_ids or t.deleted:
                continue
            body = to_document(t.entity)
            if _snapshot(body) != t.snapshot:
                op = {"op": "put", "id": doc_id, "document": body}
                if t.etag:
                    op["if_match"] = t.etag
                ops.append(op)
                self._op_targets.append(t)
        for doc_id, etag in self._deletes.items():
            op = {"op": "delete", "id": doc_id}
            if etag:
                op["if_match"] = etag
            ops.append(op)
            self._op_targets.append(self._by_id.get(doc_id) or _Tracked(doc_id, None, None, None))
        return ops

    def save_changes(self) -> None:
        """Sends every change as ONE batch (one transaction): all or nothing."""
        ops = self._pending()
        if not ops:
            return
        targets = self._op_targets
        self._count_request()
        try:
            results = self.document_store.batch(ops)
        except ConcurrencyError as e:
            raise self._conflict(e, ops) from None
        self._apply(ops, targets, results)

    def _apply(self, ops: List[Dict[str, Any]], targets: List[_Tracked],
               results: List[Dict[str, Any]]) -> None:
        """Records what a committed batch did: new etags, generated ids, deletes."""
        for op, t, res in zip(ops, targets, results):
            if op["op"] == "delete":
                self._by_id.pop(op["id"], None)
                if t.entity is not None:
                    self._by_obj.pop(_oid(t.entity), None)
                self._missing.add(op["id"])
                continue
            t.etag = res["etag"]
            if t.id is None:
                t.id = res["id"]
                self._by_id[t.id] = t
                self._set_generated_id(t.entity, t.id)
            t.prefix = None
            t.snapshot = _snapshot(to_document(t.entity))
        self._new = []
        self._deletes = {}

    @staticmethod
    def _set_generated_id(entity: Any, doc_id: str) -> None:
        if isinstance(entity, dict):
            meta = entity.setdefault("@metadata", {})
            if isinstance(meta, dict):
                meta["@id"] = doc_id
        elif dataclasses.is_dataclass(entity) and hasattr(entity, "id"):
            try:
                setattr(entity, "id", doc_id)
            except dataclasses.FrozenInstanceError:
                pass

    def _conflict(self, e: ConcurrencyError, ops: List[Dict[str, Any]]) -> ConcurrencyError:
        """Names the document and both etags (the server names the operation's index
        and sends the current etag)."""
        op: Optional[Dict[str, Any]] = None
        m = re.search(r"batch operation (\d+)", e.message)
        if m and int(m.group(1)) < len(ops):
            op = ops[int(m.group(1))]
        else:
            m = re.search(r'document "((?:[^"\\]|\\.)*)"', e.message)
            if m:
                op = next((o for o in ops if o["id"] == m.group(1)), None)
        doc_id = op["id"] if op else None
        expected = op.get("if_match") if op else None
        current = e.current_etag
        if isinstance(e, RetryConflictError):
            # Sent again after a failover: the first attempt may have written the
            # whole batch (a batch is all or nothing) before its answer was lost.
            out = RetryConflictError(
                f"document {doc_id!r}: this session's batch failed during a failover and "
                f"was sent again once, unchanged; the second attempt found etag "
                f"{current!r} where the session loaded {expected!r}. The first attempt "
                f"may have been applied (the whole batch): load the documents again "
                f"before deciding what to do ({e.message})",
                id=doc_id, expected_etag=expected, current_etag=current,
                status=e.status, body=e.body, code=e.code)
            out.first_error, out.retry_error, out.node = e.first_error, e.retry_error, e.node
            return out
        plain = ConcurrencyError(
            f"document {doc_id!r} was changed by someone else: this session loaded it at "
            f"etag {expected!r}, the server has {current!r}; nothing in the batch was "
            f"written ({e.message})",
            id=doc_id, expected_etag=expected, current_etag=current,
            status=e.status, body=e.body, code="conflict")
        plain.node = e.node
        return plain

    # --- queries ------------------------------------------------------------------------

    def query(self, collection: Optional[str] = None, *, index: Optional[str] = None,
              cls: Optional[type] = None) -> "Query":
        """A query builder: ``session.query("users").where_greater_than("age", 30)``."""
        from .query import Query

        return Query(self, collection=collection, index=index, cls=cls)

    def raw_query(self, text: str, params: Optional[Dict[str, Any]] = None,
                  cls: Optional[type] = None) -> "Query":
        """A query in the server's language, with ``$name`` parameters."""
        from .query import Query

        return Query(self, raw=text, raw_params=params or {}, cls=cls)

    def _track_query_result(self, body: Dict[str, Any], cls: Optional[type]) -> Any:
        meta = body.get("@metadata")
        if isinstance(meta, dict) and isinstance(meta.get("@id"), str):
            return self._track_loaded(meta["@id"], body, meta.get("@etag"), cls)
        return body


__all__ = ["Session", "to_document", "collection_prefix", "collection_of_class"]
