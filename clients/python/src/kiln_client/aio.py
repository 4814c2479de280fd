"""asyncio flavour: :class:`AsyncDocumentStore` and :class:`AsyncSession`.

The same unit of work as the sync session (identity map, one batch with If-Match,
request budget, the HTTP cache with 304 revalidation), over ``httpx.AsyncClient``;
``load_many`` sends its GETs concurrently. Bulk insert, the changes feed and
aggressive caching are the sync store's (they run on their own threads and can be
used from async code as they are).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import ssl
import time
from datetime import datetime
from typing import Any, Callable, Dict, List, Optional, Sequence, Type, TypeVar, Union
from urllib.parse import quote

import httpx

from .cache import CacheStats, HttpCache
from .cluster import (PROBE_INTERVAL, ClusterView, after_retry, failover_of_answer,
                      failover_of_transport, is_not_clustered, is_write, no_leader_error,
                      normalize_urls, not_retried, probe_refused,
                      resend_cannot_duplicate)
from .errors import (ConcurrencyError, ConnectionFailedError, DocumentNotFoundError,
                     KilnError, RetriedWriteError, error_from_response)
from .query import Query, QueryResult
from .session import Session, _snapshot, to_document  # noqa: F401
from .store import CertArg, DocumentStore, Response, doc_path, strip_quotes, with_expiry

T = TypeVar("T")

log = logging.getLogger("kiln_client.cluster")


class AsyncDocumentStore:
    """``async with AsyncDocumentStore(url, database) as store: ...``

    ``url`` is one URL or a list of a cluster's nodes, as for
    :class:`~kiln_client.DocumentStore` (writes to the leader, one retry after a
    failover); :attr:`last_node` is the node that answered this task's last request.
    """

    def __init__(self, url: Union[str, Sequence[str]], database: str,
                 api_key: Optional[str] = None, ca: Optional[str] = None,
                 cert: CertArg = None, *,
                 cache_size_bytes: int = 64 << 20, max_requests_per_session: int = 30,
                 timeout: float = 30.0, failover_timeout: float = 10.0) -> None:
        urls, clustered = normalize_urls(url)
        self._view = ClusterView(urls, clustered)
        self._last: "contextvars.ContextVar[Optional[str]]" = contextvars.ContextVar(
            f"kiln_last_node_{id(self)}", default=None)
        self.database = database
        self.max_requests_per_session = max_requests_per_session
        self.timeout = timeout
        self.failover_timeout = failover_timeout
        ctx: Optional[ssl.SSLContext] = None
        if self._view.scheme == "https":
            ctx = DocumentStore.make_ssl_context(ca, cert)
        headers = {"Accept": "application/json", "User-Agent": "kiln-client-python/0.1"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._client = httpx.AsyncClient(headers=headers, timeout=timeout,
                                         verify=ctx if ctx is not None else True)
        self.cache = HttpCache(cache_size_bytes)
        self.stats = CacheStats()

    @property
    def url(self) -> str:
        """The node reads go to."""
        return self._view.current

    @property
    def urls(self) -> List[str]:
        return list(self._view.urls)

    @property
    def leader_url(self) -> Optional[str]:
        return self._view.leader

    @property
    def clustered(self) -> bool:
        return self._view.clustered

    @property
    def last_node(self) -> Optional[str]:
        """The URL of the node that answered this task's last request (a context
        variable: what a task sees is set by its own requests)."""
        return self._last.get()

    @property
    def db_path(self) -> str:
        return f"/dbs/{quote(self.database, safe='')}"

    def doc_path(self, doc_id: str) -> str:
        return doc_path(self.database, doc_id)

    async def send(self, method: str, path: str, *, json_body: Any = None,
                   content: Optional[bytes] = None, headers: Optional[Dict[str, str]] = None,
                   params: Optional[Dict[str, Any]] = None) -> httpx.Response:
        """As :meth:`DocumentStore.send`."""
        if json_body is not None:
            content = json.dumps(json_body, separators=(",", ":")).encode()
            headers = dict(headers or {})
            headers["Content-Type"] = "application/json"
        if is_write(method, path):
            return await self._send_write(method, path, content, headers, params)
        return await self._send_read(method, path, content, headers, params)

    async def _attempt(self, node: str, method: str, path: str, content: Optional[bytes],
                       headers: Optional[Dict[str, str]],
                       params: Optional[Dict[str, Any]]) -> httpx.Response:
        r = await self._client.request(method, node + path, content=content,
                                       headers=headers, params=params)
        self.stats.requests += 1
        self.stats.bytes_received += len(r.content)
        self._last.set(node)
        return r

    async def _send_read(self, method: str, path: str, content: Optional[bytes],
                         headers: Optional[Dict[str, str]],
                         params: Optional[Dict[str, Any]]) -> httpx.Response:
        node = self._view.current
        try:
            return await self._attempt(node, method, path, content, headers, params)
        except httpx.TransportError as e:
            first = e
        if self._view.clustered:
            for other in self._view.next_read_nodes(node):
                try:
                    r = await self._attempt(other, method, path, content, headers, params)
                except httpx.TransportError:
                    continue
                if self._view.current == node:
                    self._view.current = other
                return r
        err = ConnectionFailedError(f"{method} {node}{path}: {first!r}")
        err.node = node
        raise err from first

    async def _send_write(self, method: str, path: str, content: Optional[bytes],
                          headers: Optional[Dict[str, str]],
                          params: Optional[Dict[str, Any]]) -> httpx.Response:
        view = self._view
        if not view.clustered:
            node = view.current
        else:
            node = view.leader or await self._discover()
        try:
            r = await self._attempt(node, method, path, content, headers, params)
        except httpx.TransportError as e:
            if not view.clustered:
                err = ConnectionFailedError(f"{method} {node}{path}: {e!r}")
                err.node = node
                raise err from e
            first = failover_of_transport(node, method, path, e)
        else:
            failed = failover_of_answer(node, r.status_code, r.content, r.headers, view)
            if failed is None:
                return r
            first = failed
            view.clustered = True
        if first.maybe_applied and not resend_cannot_duplicate(method, path, content):
            self._forget_leader(node)
            raise not_retried(method, path, first)
        leader = view.leader
        if leader is None or leader == node:
            view.leader = None
            try:
                leader = await self._discover(first.hint)
            except KilnError as e:
                e.message = (f"{e.message}; the write was not sent again (it failed: "
                             f"{first.describe()})")
                raise
        log.info("%s %s failed during a failover (%s): sending it again to %s",
                 method, path, first.describe(), leader)
        self.stats.failover_retries += 1
        try:
            r = await self._attempt(leader, method, path, content, headers, params)
        except httpx.TransportError as e:
            self._forget_leader(leader)
            err = ConnectionFailedError(
                f"{method} {leader}{path}: {e!r} (the one retry, after: {first.describe()})")
            err.node = leader
            raise err from e
        again = failover_of_answer(leader, r.status_code, r.content, r.headers, view)
        if again is not None:
            self._forget_leader(leader)
            raise after_retry(method, path, headers, first, leader, again.error)
        if r.status_code >= 400:
            raise after_retry(method, path, headers, first, leader,
                              error_from_response(r.status_code, r.content, r.headers))
        return r

    def _forget_leader(self, node: str) -> None:
        if self._view.leader == node:
            self._view.leader = None

    async def _discover(self, hint: Optional[str] = None) -> str:
        """As :meth:`DocumentStore._discover` (concurrent tasks may each ask)."""
        view = self._view
        deadline = time.monotonic() + self.failover_timeout
        probe_timeout = min(self.timeout, 2.0)
        answered: List[str] = []
        while True:
            claims = []
            for url in view.probe_order(hint):
                try:
                    r = await self._client.get(url + "/cluster", timeout=probe_timeout)
                except httpx.TransportError:
                    continue
                self.stats.requests += 1
                answered.append(url)
                if is_not_clustered(r.status_code, r.content):
                    view.clustered = False
                    view.leader = None
                    return view.current
                refused = probe_refused(url, r)
                if refused is not None:
                    raise refused
                if r.status_code != 200:
                    continue
                try:
                    claim = view.absorb(url, r.json())
                except ValueError:
                    continue
                if claim is not None:
                    claims.append(claim)
            if claims:
                view.leader = view.choose(claims)
                return view.leader
            if time.monotonic() >= deadline:
                raise no_leader_error(view, answered, self.failover_timeout)
            await asyncio.sleep(PROBE_INTERVAL)

    async def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        r = await self.send(method, path, **kw)
        if r.status_code >= 400:
            err = error_from_response(r.status_code, r.content, r.headers)
            err.node = self.last_node
            raise err
        return r

    async def cached_request(self, method: str, path: str, body: Optional[bytes] = None,
                             on_request: Optional[Callable[[], None]] = None,
                             is_document: bool = False) -> Response:
        key = path if body is None else f"{method} {path}\n{body.decode()}"
        entry = self.cache.get(key)
        headers: Dict[str, str] = {}
        if entry is not None:
            headers["If-None-Match"] = f'"{entry.etag}"'
        if body is not None:
            headers["Content-Type"] = "application/json"
        if on_request is not None:
            on_request()
        r = await self.send(method, path, content=body, headers=headers)
        node = self.last_node
        etag = strip_quotes(r.headers.get("etag"))
        if r.status_code == 304 and entry is not None:
            self.stats.not_modified += 1
            self.cache.revalidated(key, 0)
            return Response(200, entry.content, entry.etag, "304", r.headers, node)
        if r.status_code == 200 and etag:
            self.cache.put(key, etag, r.content, 0, is_document)
        elif entry is not None:
            self.cache.remove(key)
        if r.status_code >= 400:
            err = error_from_response(r.status_code, r.content, r.headers)
            err.node = node
            raise err
        return Response(r.status_code, r.content, etag, "", r.headers, node)

    async def create_database(self, exist_ok: bool = True) -> None:
        try:
            r = await self.send("PUT", self.db_path)
        except RetriedWriteError as e:
            if exist_ok and e.status == 409:
                return
            raise
        if r.status_code == 409 and exist_ok:
            return
        if r.status_code >= 400:
            err = error_from_response(r.status_code, r.content, r.headers)
            err.node = self.last_node
            raise err

    async def get(self, doc_id: str) -> Optional[Dict[str, Any]]:
        try:
            r = await self.cached_request("GET", self.doc_path(doc_id), is_document=True)
        except DocumentNotFoundError:
            return None
        return r.json()  # type: ignore[no-any-return]

    async def put(self, doc_id: str, document: Dict[str, Any],
                  if_match: Optional[str] = None, expires: Optional[datetime] = None) -> str:
        headers = {"If-Match": f'"{if_match}"'} if if_match else None
        r = await self.request("PUT", self.doc_path(doc_id),
                               json_body=with_expiry(document, expires), headers=headers)
        self.cache.remove(self.doc_path(doc_id))
        return str(r.json()["etag"])

    async def delete(self, doc_id: str, if_match: Optional[str] = None) -> None:
        headers = {"If-Match": f'"{if_match}"'} if if_match else None
        await self.request("DELETE", self.doc_path(doc_id), headers=headers)
        self.cache.remove(self.doc_path(doc_id))

    async def batch(self, ops: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
        r = await self.request("POST", f"{self.db_path}/batch", json_body={"ops": list(ops)})
        results: List[Dict[str, Any]] = r.json()["results"]
        for res in results:
            self.cache.remove(self.doc_path(res["id"]))
        return results

    def session(self, max_requests: Optional[int] = None) -> "AsyncSession":
        return AsyncSession(self, max_requests if max_requests is not None
                            else self.max_requests_per_session)

    async def close(self) -> None:
        await self._client.aclose()

    async def __aenter__(self) -> "AsyncDocumentStore":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class AsyncSession(Session):
    """``async with store.session() as s:`` — ``await s.load(id)``, ``s.store(doc)``,
    ``await s.save_changes()``; ``store``, ``delete``, ``id_of`` are as in
    :class:`~kiln_client.Session`."""

    def __init__(self, store: AsyncDocumentStore, max_requests: int = 30) -> None:
        super().__init__(store, max_requests)  # type: ignore[arg-type]
        self.async_store = store

    async def __aenter__(self) -> "AsyncSession":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()

    async def load(self, doc_id: str, cls: Optional[Type[T]] = None) -> Any:
        known, value = self._known(doc_id)
        if known:
            return value
        try:
            r = await self.async_store.cached_request(
                "GET", self.async_store.doc_path(doc_id), on_request=self._count_request,
                is_document=True)
        except DocumentNotFoundError:
            self._missing.add(doc_id)
            return None
        return self._track_loaded(doc_id, json.loads(r.content), r.etag, cls)

    async def load_many(self, ids: Sequence[str],  # type: ignore[override]
                        cls: Optional[Type[T]] = None) -> Dict[str, Any]:
        """Loads the ids concurrently; ``{id: document or None}``."""
        ids = list(dict.fromkeys(ids))
        docs = await asyncio.gather(*(self.load(i, cls) for i in ids))
        return dict(zip(ids, docs))

    async def save_changes(self) -> None:  # type: ignore[override]
        ops = self._pending()
        if not ops:
            return
        targets = self._op_targets
        self._count_request()
        try:
            results = await self.async_store.batch(ops)
        except ConcurrencyError as e:
            raise self._conflict(e, ops) from None
        self._apply(ops, targets, results)

    async def execute(self, query: Query) -> QueryResult:
        """Runs a query built with :meth:`query` / :meth:`raw_query`."""
        body = json.dumps(query.request_body(), separators=(",", ":"),
                          sort_keys=True).encode()
        r = await self.async_store.cached_request(
            "POST", f"{self.async_store.db_path}/queries", body=body,
            on_request=self._count_request)
        return query._result(json.loads(r.content), r.from_cache)
