"""asyncio flavour: :class:`AsyncDocumentStore` and :class:`AsyncSession`.

The same unit of work as the sync session (identity map, one batch with If-Match,
request budget, the HTTP cache with 304 revalidation), over ``httpx.AsyncClient``;
``load_many`` sends its GETs concurrently. Bulk insert, the changes feed and
aggressive caching are the sync store's (they run on their own threads and can be
used from async code as they are).
"""

from __future__ import annotations

import asyncio
import json
import ssl
from typing import Any, Callable, Dict, List, Optional, Sequence, Type, TypeVar
from urllib.parse import quote, urlsplit

import httpx

from .cache import CacheStats, HttpCache
from .errors import (ConcurrencyError, ConnectionFailedError, DocumentNotFoundError,
                     error_from_response)
from .query import Query, QueryResult
from .session import Session, _snapshot, to_document  # noqa: F401
from .store import CertArg, DocumentStore, Response, doc_path, strip_quotes

T = TypeVar("T")


class AsyncDocumentStore:
    """``async with AsyncDocumentStore(url, database) as store: ...``"""

    def __init__(self, url: str, database: str, api_key: Optional[str] = None,
                 ca: Optional[str] = None, cert: CertArg = None, *,
                 cache_size_bytes: int = 64 << 20, max_requests_per_session: int = 30,
                 timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        if urlsplit(self.url).scheme not in ("http", "https"):
            raise ValueError(f"url must start with http:// or https://, not {url!r}")
        self.database = database
        self.max_requests_per_session = max_requests_per_session
        ctx: Optional[ssl.SSLContext] = None
        if self.url.startswith("https://"):
            ctx = DocumentStore.make_ssl_context(ca, cert)
        headers = {"Accept": "application/json", "User-Agent": "kiln-client-python/0.1"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._client = httpx.AsyncClient(base_url=self.url, headers=headers, timeout=timeout,
                                         verify=ctx if ctx is not None else True)
        self.cache = HttpCache(cache_size_bytes)
        self.stats = CacheStats()

    @property
    def db_path(self) -> str:
        return f"/dbs/{quote(self.database, safe='')}"

    def doc_path(self, doc_id: str) -> str:
        return doc_path(self.database, doc_id)

    async def send(self, method: str, path: str, *, json_body: Any = None,
                   content: Optional[bytes] = None, headers: Optional[Dict[str, str]] = None,
                   params: Optional[Dict[str, Any]] = None) -> httpx.Response:
        if json_body is not None:
            content = json.dumps(json_body, separators=(",", ":")).encode()
            headers = dict(headers or {})
            headers["Content-Type"] = "application/json"
        try:
            r = await self._client.request(method, path, content=content, headers=headers,
                                           params=params)
        except httpx.TransportError as e:
            raise ConnectionFailedError(f"{method} {self.url}{path}: {e!r}") from e
        self.stats.requests += 1
        self.stats.bytes_received += len(r.content)
        return r

    async def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        r = await self.send(method, path, **kw)
        if r.status_code >= 400:
            raise error_from_response(r.status_code, r.content, r.headers)
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
        etag = strip_quotes(r.headers.get("etag"))
        if r.status_code == 304 and entry is not None:
            self.stats.not_modified += 1
            self.cache.revalidated(key, 0)
            return Response(200, entry.content, entry.etag, "304", r.headers)
        if r.status_code == 200 and etag:
            self.cache.put(key, etag, r.content, 0, is_document)
        elif entry is not None:
            self.cache.remove(key)
        if r.status_code >= 400:
            raise error_from_response(r.status_code, r.content, r.headers)
        return Response(r.status_code, r.content, etag, "", r.headers)

    async def create_database(self, exist_ok: bool = True) -> None:
        r = await self.send("PUT", self.db_path)
        if r.status_code == 409 and exist_ok:
            return
        if r.status_code >= 400:
            raise error_from_response(r.status_code, r.content, r.headers)

    async def get(self, doc_id: str) -> Optional[Dict[str, Any]]:
        try:
            r = await self.cached_request("GET", self.doc_path(doc_id), is_document=True)
        except DocumentNotFoundError:
            return None
        return r.json()  # type: ignore[no-any-return]

    async def put(self, doc_id: str, document: Dict[str, Any],
                  if_match: Optional[str] = None) -> str:
        headers = {"If-Match": f'"{if_match}"'} if if_match else None
        r = await self.request("PUT", self.doc_path(doc_id), json_body=document,
                               headers=headers)
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
