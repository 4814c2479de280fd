"""The document store: one per server (or cluster) and database, shared by the whole
program.

It holds the HTTP connection pool, the HTTP cache and (in aggressive mode) a changes
connection that keeps the cache honest; sessions, bulk inserts and changes
subscriptions are made from it. Given the URLs of a cluster's nodes, it sends writes
to the leader and fails over as :mod:`kiln_client.cluster` describes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import ssl
import threading
import time
from datetime import datetime, timezone
from typing import (IO, TYPE_CHECKING, Any, Callable, Dict, Iterable, Iterator, List,
                    Optional, Sequence, Tuple, Union)
from urllib.parse import quote

import httpx

from .cache import AggressiveState, CacheStats, HttpCache
from .cluster import (PROBE_INTERVAL, ClusterView, after_retry, failover_of_answer,
                      failover_of_transport, is_not_clustered, is_write, no_leader_error,
                      normalize_urls, not_retried, probe_refused,
                      resend_cannot_duplicate)
from .errors import (ConnectionFailedError, DocumentNotFoundError, KilnError,
                     RetriedWriteError, error_from_response)

if TYPE_CHECKING:
    from .bulk import BulkInsert
    from .changes import Change, Changes
    from .session import Session
    from .subscriptions import DataSubscription

CertArg = Union[str, Tuple[str, str], None]

log = logging.getLogger("kiln_client.cluster")


def doc_path(database: str, doc_id: str) -> str:
    """The URL path of a document, encoded as the server encodes it.

    Slashes stay as they are, except in an id containing ``/attachments/``: the
    server reads a literal ``/attachments/`` in a document's path as an
    attachment's, so such an id has every slash sent as ``%2F``."""
    safe = '-._~' if '/attachments/' in doc_id else '/-._~'
    return f"/dbs/{quote(database, safe='')}/docs/{quote(doc_id, safe=safe)}"


def with_expiry(document: Dict[str, Any], expires: Optional[datetime]) -> Dict[str, Any]:
    """``document`` with ``@metadata.@expires`` set to ``expires`` (RFC 3339, in UTC):
    the server deletes the document once that time has passed (within its
    ``--expiration-check-ms``). A naive datetime is local time, as Python takes it.
    ``None`` leaves the document as it is; ``document`` itself is not changed."""
    if expires is None:
        return document
    at = expires.astimezone(timezone.utc).isoformat(timespec="milliseconds")
    metadata = dict(document.get("@metadata") or {})
    metadata["@expires"] = at.replace("+00:00", "Z")
    return {**document, "@metadata": metadata}


def strip_quotes(etag: Optional[str]) -> Optional[str]:
    if etag is None:
        return None
    e = etag.strip()
    if e.startswith("W/"):
        e = e[2:]
    if len(e) >= 2 and e[0] == '"' and e[-1] == '"':
        e = e[1:-1]
    return e


class Response:
    """What a request answered, after the cache had its say."""

    __slots__ = ("status", "content", "etag", "from_cache", "headers", "node")

    def __init__(self, status: int, content: bytes, etag: Optional[str],
                 from_cache: str = "", headers: Optional[httpx.Headers] = None,
                 node: Optional[str] = None) -> None:
        self.status = status
        self.content = content
        self.etag = etag
        #: "" (the server sent the body), "304" (revalidated) or "aggressive".
        self.from_cache = from_cache
        self.headers = headers
        #: The URL of the node that answered (None from the aggressive cache).
        self.node = node

    def json(self) -> Any:
        return json.loads(self.content)


class DocumentStore:
    """A Kiln server (or cluster) and one of its databases.

    ``url`` is ``http://host:port`` or ``https://host:port``, or a list of them: the
    nodes of a cluster (see :mod:`kiln_client.cluster`). With a list, writes go to the
    leader (found with ``GET /cluster``, again after a failover), reads to the node
    the store is using (the first URL, then the next one that answers when it stops
    answering), and a write that fails because of a failover is sent again once to
    the new leader; ``failover_timeout`` bounds the wait for a leader. Which node
    answered a request is :attr:`last_node`.

    ``api_key`` is sent as ``Authorization: Bearer <key>``; ``ca`` is a PEM file of
    certificates to trust (for a self-signed server certificate); ``cert`` is a client
    certificate, a PEM file holding certificate and key or a ``(cert, key)`` pair.
    """

    def __init__(self, url: Union[str, Sequence[str]], database: str,
                 api_key: Optional[str] = None, ca: Optional[str] = None,
                 cert: CertArg = None, *,
                 cache_size_bytes: int = 64 << 20, max_requests_per_session: int = 30,
                 timeout: float = 30.0, failover_timeout: float = 10.0) -> None:
        urls, clustered = normalize_urls(url)
        self._view = ClusterView(urls, clustered)
        self._discover_lock = threading.Lock()
        self._last = threading.local()
        self.database = database
        self.api_key = api_key
        self.max_requests_per_session = max_requests_per_session
        self.timeout = timeout
        self.failover_timeout = failover_timeout
        self._ssl: Optional[ssl.SSLContext] = None
        if self._view.scheme == "https":
            self._ssl = self.make_ssl_context(ca, cert)
        headers = {"Accept": "application/json", "User-Agent": "kiln-client-python/0.1"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._headers = headers
        self._client = httpx.Client(
            headers=headers, timeout=timeout,
            verify=self._ssl if self._ssl is not None else True,
            limits=httpx.Limits(max_connections=32, max_keepalive_connections=16),
        )
        self.cache = HttpCache(cache_size_bytes)
        self.stats = CacheStats()
        self._stats_lock = threading.Lock()
        self._aggressive = AggressiveState()
        self._aggressive_local = threading.local()
        self._watcher: Optional["Changes"] = None
        self._watcher_lock = threading.Lock()
        self._closed = False

    # --- nodes ------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The node reads (and the changes feed) go to: the first URL given, until it
        stops answering."""
        return self._view.current

    @property
    def urls(self) -> List[str]:
        """The URLs the store was given."""
        return list(self._view.urls)

    @property
    def leader_url(self) -> Optional[str]:
        """The leader writes go to, once found (None before, and for a single server)."""
        return self._view.leader

    @property
    def clustered(self) -> bool:
        """Whether the store treats its servers as a cluster."""
        return self._view.clustered

    @property
    def last_node(self) -> Optional[str]:
        """The URL of the node that answered this thread's last request through the
        store (for a write: the leader that took it, after a failover the new one);
        None before any, and after an answer given from the aggressive cache."""
        return getattr(self._last, "node", None)

    def _set_last_node(self, node: Optional[str]) -> None:
        self._last.node = node

    # --- plumbing ---------------------------------------------------------------------

    @staticmethod
    def make_ssl_context(ca: Optional[str], cert: CertArg) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=ca) if ca else ssl.create_default_context()
        if cert is not None:
            if isinstance(cert, tuple):
                ctx.load_cert_chain(cert[0], cert[1])
            else:
                ctx.load_cert_chain(cert)
        return ctx

    @property
    def ssl_context(self) -> Optional[ssl.SSLContext]:
        return self._ssl

    @property
    def auth_headers(self) -> Dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    @property
    def db_path(self) -> str:
        return f"/dbs/{quote(self.database, safe='')}"

    def doc_path(self, doc_id: str) -> str:
        return doc_path(self.database, doc_id)

    def _count(self, n_bytes: int) -> None:
        with self._stats_lock:
            self.stats.requests += 1
            self.stats.bytes_received += n_bytes

    def send(self, method: str, path: str, *, json_body: Any = None,
             content: Optional[bytes] = None, headers: Optional[Dict[str, str]] = None,
             params: Optional[Dict[str, Any]] = None) -> httpx.Response:
        """One HTTP request (to the leader for a write, in a cluster); connection
        failures become :class:`ConnectionFailedError` and error answers are returned,
        not raised, except the failover's: a write that fails because of a failover
        is sent again once (see :mod:`kiln_client.cluster`), and raises when that
        fails too, or with a :class:`RetriedWriteError` when its first attempt may
        have been applied and the second one was refused."""
        if self._closed:
            raise KilnError("the document store is closed", code="store_closed")
        if json_body is not None:
            content = json.dumps(json_body, separators=(",", ":")).encode()
            headers = dict(headers or {})
            headers["Content-Type"] = "application/json"
        if is_write(method, path):
            return self._send_write(method, path, content, headers, params)
        return self._send_read(method, path, content, headers, params)

    def _attempt(self, node: str, method: str, path: str, content: Optional[bytes],
                 headers: Optional[Dict[str, str]],
                 params: Optional[Dict[str, Any]]) -> httpx.Response:
        """Sends the request to one node (httpx's transport errors pass through)."""
        r = self._client.request(method, node + path, content=content, headers=headers,
                                 params=params)
        self._count(len(r.content))
        self._set_last_node(node)
        return r

    def _send_read(self, method: str, path: str, content: Optional[bytes],
                   headers: Optional[Dict[str, str]],
                   params: Optional[Dict[str, Any]]) -> httpx.Response:
        node = self._view.current
        try:
            return self._attempt(node, method, path, content, headers, params)
        except httpx.TransportError as e:
            first = e
        if self._view.clustered:
            # A read changes nothing: the other nodes are asked in turn, and the first
            # that answers is the one the store uses from now on.
            for other in self._view.next_read_nodes(node):
                try:
                    r = self._attempt(other, method, path, content, headers, params)
                except httpx.TransportError:
                    continue
                with self._view.lock:
                    if self._view.current == node:
                        self._view.current = other
                return r
        err = ConnectionFailedError(f"{method} {node}{path}: {first!r}")
        err.node = node
        raise err from first

    def _read_node_failed(self, node: str) -> None:
        """``node`` could not be reached (by the changes feed): in a cluster, reads
        move on to the next node."""
        view = self._view
        if not view.clustered:
            return
        with view.lock:
            if view.current == node:
                others = view.next_read_nodes(node)
                if others:
                    view.current = others[0]

    def _write_node(self) -> str:
        view = self._view
        if not view.clustered:
            return view.current
        leader = view.leader
        if leader is not None:
            return leader
        with self._discover_lock:
            if view.leader is not None:
                return view.leader
            return self._discover()

    def _send_write(self, method: str, path: str, content: Optional[bytes],
                    headers: Optional[Dict[str, str]],
                    params: Optional[Dict[str, Any]]) -> httpx.Response:
        node = self._write_node()
        try:
            r = self._attempt(node, method, path, content, headers, params)
        except httpx.TransportError as e:
            if not self._view.clustered:
                err = ConnectionFailedError(f"{method} {node}{path}: {e!r}")
                err.node = node
                raise err from e
            first = failover_of_transport(node, method, path, e)
        else:
            failed = failover_of_answer(node, r.status_code, r.content, r.headers, self._view)
            if failed is None:
                return r
            first = failed
            # Only a cluster's node answers so: a store given one URL finds it out here.
            self._view.clustered = True
        if first.maybe_applied and not resend_cannot_duplicate(method, path, content):
            self._forget_leader(node)
            raise not_retried(method, path, first)
        try:
            leader = self._leader_after(node, first.hint)
        except KilnError as e:
            e.message = f"{e.message}; the write was not sent again (it failed: {first.describe()})"
            raise
        log.info("%s %s failed during a failover (%s): sending it again to %s",
                 method, path, first.describe(), leader)
        with self._stats_lock:
            self.stats.failover_retries += 1
        try:
            r = self._attempt(leader, method, path, content, headers, params)
        except httpx.TransportError as e:
            self._forget_leader(leader)
            err = ConnectionFailedError(
                f"{method} {leader}{path}: {e!r} (the one retry, after: {first.describe()})")
            err.node = leader
            raise err from e
        again = failover_of_answer(leader, r.status_code, r.content, r.headers, self._view)
        if again is not None:
            self._forget_leader(leader)
            raise after_retry(method, path, headers, first, leader, again.error)
        if r.status_code >= 400:
            raise after_retry(method, path, headers, first, leader,
                              error_from_response(r.status_code, r.content, r.headers))
        return r

    def _forget_leader(self, node: str) -> None:
        with self._view.lock:
            if self._view.leader == node:
                self._view.leader = None

    def _leader_after(self, failed: str, hint: Optional[str]) -> str:
        """The leader to send a write to after it failed on ``failed`` because of a
        failover (found again, unless another thread already did)."""
        with self._discover_lock:
            leader = self._view.leader
            if leader is not None and leader != failed:
                return leader
            self._view.leader = None
            return self._discover(hint)

    def _discover(self, hint: Optional[str] = None) -> str:
        """Asks the nodes for ``GET /cluster`` until one says it leads (at most
        ``failover_timeout`` seconds); the caller holds the discovery lock."""
        view = self._view
        deadline = time.monotonic() + self.failover_timeout
        probe_timeout = min(self.timeout, 2.0)
        answered: List[str] = []
        while True:
            claims = []
            for url in view.probe_order(hint):
                try:
                    r = self._client.get(url + "/cluster", timeout=probe_timeout)
                except httpx.TransportError:
                    continue
                self._count(len(r.content))
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
            time.sleep(PROBE_INTERVAL)

    def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """Like :meth:`send`, raising the mapped :class:`KilnError` for an error answer
        (its ``node`` is the node that answered)."""
        r = self.send(method, path, **kw)
        if r.status_code >= 400:
            err = error_from_response(r.status_code, r.content, r.headers)
            err.node = self.last_node
            raise err
        return r

    def cached_request(self, method: str, path: str, body: Optional[bytes] = None,
                       on_request: Optional[Callable[[], None]] = None,
                       is_document: bool = False) -> Response:
        """A GET (or a query POST) through the HTTP cache.

        ``on_request`` is called before a request is actually sent (a session counts it
        against its budget); an answer from the aggressive cache sends none.
        """
        key = path if body is None else f"{method} {path}\n{body.decode()}"
        entry = self.cache.get(key)
        duration = self._aggressive_duration()
        if duration is not None and entry is not None:
            self._ensure_watcher()
            if self._aggressive.can_serve(key, entry, duration):
                with self._stats_lock:
                    self.stats.aggressive_hits += 1
                self._set_last_node(None)
                return Response(200, entry.content, entry.etag, "aggressive")
        counter = self._aggressive.counter
        headers: Dict[str, str] = {}
        if entry is not None:
            headers["If-None-Match"] = f'"{entry.etag}"'
        if body is not None:
            headers["Content-Type"] = "application/json"
        if on_request is not None:
            on_request()
        r = self.send(method, path, content=body, headers=headers)
        node = self.last_node
        etag = strip_quotes(r.headers.get("etag"))
        if r.status_code == 304 and entry is not None:
            with self._stats_lock:
                self.stats.not_modified += 1
            self.cache.revalidated(key, counter)
            return Response(200, entry.content, entry.etag, "304", r.headers, node)
        if r.status_code == 200 and etag:
            self.cache.put(key, etag, r.content, counter, is_document)
        elif entry is not None:
            self.cache.remove(key)
        if r.status_code >= 400:
            err = error_from_response(r.status_code, r.content, r.headers)
            err.node = node
            raise err
        return Response(r.status_code, r.content, etag, "", r.headers, node)

    def invalidate(self, doc_id: str) -> None:
        """Forgets the cached answer for a document (after this client wrote it)."""
        self.cache.remove(self.doc_path(doc_id))
        self._aggressive.on_change(self.doc_path(doc_id))

    # --- aggressive caching -------------------------------------------------------------

    def _aggressive_duration(self) -> Optional[float]:
        stack = getattr(self._aggressive_local, "stack", None)
        return stack[-1] if stack else None

    @contextlib.contextmanager
    def aggressive_caching(self, duration: Union[float, Any] = 300.0,
                           wait_connected: float = 2.0) -> Iterator[None]:
        """Within the block (on this thread), answers cached by the HTTP cache are
        given without asking the server while the changes feed is connected and has
        announced no change to them, for at most ``duration`` seconds (a number or a
        ``timedelta``) after the server last confirmed them. A change announced by the
        feed invalidates the affected answers at once; while the feed is down every
        read is revalidated (If-None-Match) as usual.
        """
        if hasattr(duration, "total_seconds"):
            duration = duration.total_seconds()
        stack = getattr(self._aggressive_local, "stack", None)
        if stack is None:
            stack = self._aggressive_local.stack = []
        watcher = self._ensure_watcher()
        if not self._aggressive.connected and wait_connected > 0:
            watcher.wait_connected(wait_connected)
        stack.append(float(duration))
        try:
            yield
        finally:
            stack.pop()

    @property
    def aggressive_feed_connected(self) -> bool:
        return self._aggressive.connected

    def _ensure_watcher(self) -> "Changes":
        with self._watcher_lock:
            if self._watcher is None:
                from .changes import Changes

                agg = self._aggressive
                w = Changes(self, on_connected=agg.on_connected,
                            on_disconnected=agg.on_disconnected, name="aggressive-cache")

                def on_change(c: "Change") -> None:
                    agg.on_change(self.doc_path(c.id))

                w.for_all().subscribe(on_change)
                self._watcher = w
            return self._watcher

    # --- the API ------------------------------------------------------------------------

    def session(self, max_requests: Optional[int] = None) -> "Session":
        from .session import Session

        return Session(self, max_requests if max_requests is not None
                       else self.max_requests_per_session)

    def changes(self, **kw: Any) -> "Changes":
        """A changes connection (one WebSocket): ``.for_document(id)``, ``.for_prefix(p)``,
        ``.for_collection(c)``, ``.for_all()``. Reconnects and resumes by itself."""
        from .changes import Changes

        return Changes(self, **kw)

    def bulk_insert(self, **kw: Any) -> "BulkInsert":
        """``with store.bulk_insert() as bulk: bulk.store(doc, id)``: streams NDJSON to
        ``POST /dbs/{db}/bulk``; see :class:`kiln_client.bulk.BulkInsert`."""
        from .bulk import BulkInsert

        return BulkInsert(self, **kw)

    def create_database(self, exist_ok: bool = True) -> None:
        try:
            r = self.send("PUT", self.db_path)
        except RetriedWriteError as e:
            if exist_ok and e.status == 409:
                return  # this store's first attempt may well have created it
            raise
        if r.status_code == 409 and exist_ok:
            return
        if r.status_code >= 400:
            err = error_from_response(r.status_code, r.content, r.headers)
            err.node = self.last_node
            raise err

    def delete_database(self) -> None:
        self.request("DELETE", self.db_path)
        self.cache.clear()

    def database_stats(self) -> Dict[str, Any]:
        return self.request("GET", self.db_path).json()  # type: ignore[no-any-return]

    def whoami(self) -> Dict[str, Any]:
        """``GET /whoami``: the key or certificate this store authenticates with and its
        ``clearance`` (``"operator"``, or ``{"databases": [{"database", "access"}]}``)."""
        return self.request("GET", "/whoami").json()  # type: ignore[no-any-return]

    def create_api_key(self, name: str, *, operator: bool = False,
                       grants: Sequence[str] = (),
                       certificate_pem: Optional[str] = None) -> Dict[str, Any]:
        """``POST /admin/api-keys`` (an operator's key): a new API key with ``operator``
        or ``grants`` (``"shop:read_write"``, ``"reports-*:read"``...), or, with
        ``certificate_pem``, a client certificate registered with them. The record
        (``id``, ``name``, ``kind``, ``clearance``...) with ``key`` for a key: shown
        this once. In a cluster it reaches every node through the log."""
        body: Dict[str, Any] = {"name": name}
        if operator:
            body["operator"] = True
        if grants:
            body["grants"] = list(grants)
        if certificate_pem is not None:
            body["certificate_pem"] = certificate_pem
        return self.request("POST", "/admin/api-keys", json_body=body).json()  # type: ignore[no-any-return]

    def api_keys(self) -> List[Dict[str, Any]]:
        """``GET /admin/api-keys``: every key and registered certificate (never a
        secret or its hash)."""
        return list(self.request("GET", "/admin/api-keys").json()["keys"])

    def revoke_api_key(self, key_id: str) -> None:
        """``DELETE /admin/api-keys/{id}``: the key is refused from the next request
        (on every node of a cluster); :class:`NotFoundError` if there is none."""
        self.request("DELETE", "/admin/api-keys/" + quote(key_id, safe=""))

    def database_names(self) -> List[str]:
        """The server's databases the caller may read (``GET /dbs``)."""
        return list(self.request("GET", "/dbs").json()["databases"])

    def get(self, doc_id: str) -> Optional[Dict[str, Any]]:
        """One document (through the cache), or None; outside any session."""
        try:
            r = self.cached_request("GET", self.doc_path(doc_id), is_document=True)
        except DocumentNotFoundError:
            return None
        return r.json()  # type: ignore[no-any-return]

    def put(self, doc_id: str, document: Dict[str, Any],
            if_match: Optional[str] = None, expires: Optional[datetime] = None) -> str:
        """Writes one document outside any session; returns its new etag. With
        ``expires``, the server deletes it once that time has passed."""
        headers = {"If-Match": f'"{if_match}"'} if if_match else None
        body = with_expiry(document, expires)
        r = self.request("PUT", self.doc_path(doc_id), json_body=body, headers=headers)
        self.invalidate(doc_id)
        return str(r.json()["etag"])

    def patch(self, doc_id: str, changes: Dict[str, Any],
              if_match: Optional[str] = None) -> str:
        """Merges ``changes`` into the document (a JSON merge patch, RFC 7396: ``None``
        removes a field, a dict merges into the field's dict, anything else replaces
        it), read and written in one transaction on the server; returns the new etag.
        Raises :class:`DocumentNotFoundError` if there is no document, and with
        ``if_match``, :class:`ConcurrencyError` if the document has another etag."""
        headers = {"Content-Type": "application/merge-patch+json"}
        if if_match:
            headers["If-Match"] = f'"{if_match}"'
        content = json.dumps(changes, separators=(",", ":")).encode()
        r = self.request("PATCH", self.doc_path(doc_id), content=content, headers=headers)
        self.invalidate(doc_id)
        return str(r.json()["etag"])

    def delete(self, doc_id: str, if_match: Optional[str] = None) -> None:
        headers = {"If-Match": f'"{if_match}"'} if if_match else None
        self.request("DELETE", self.doc_path(doc_id), headers=headers)
        self.invalidate(doc_id)

    def batch(self, ops: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
        """``POST /dbs/{db}/batch``: one transaction, all or nothing."""
        r = self.request("POST", f"{self.db_path}/batch", json_body={"ops": list(ops)})
        results: List[Dict[str, Any]] = r.json()["results"]
        for res in results:
            self.invalidate(res["id"])
        return results

    # --- revisions ----------------------------------------------------------------------

    def revisions_path(self, doc_id: str) -> str:
        return f"{self.db_path}/revisions/docs/{quote(doc_id, safe='/-._~')}"

    def revisions_config(self) -> Dict[str, Any]:
        """Which collections keep revisions: ``{"collections": {name: {"max_revisions":
        N, "max_age_ms": ms or None}}}`` (empty until configured)."""
        r = self.request("GET", f"{self.db_path}/revisions/config")
        return r.json()  # type: ignore[no-any-return]

    def set_revisions_config(self, config: Dict[str, Any]) -> Dict[str, Any]:
        """Replaces the whole revisions configuration (``{"collections": {...}}``, as
        :meth:`revisions_config` gives it); returns it as stored."""
        r = self.request("PUT", f"{self.db_path}/revisions/config", json_body=config)
        return r.json()  # type: ignore[no-any-return]

    def revisions(self, doc_id: str, limit: Optional[int] = None) -> List[Dict[str, Any]]:
        """The document's revisions (its previous versions), newest first, each
        ``{"etag", "last_modified", "replaced_at", "deleted", "key_id", "document"}``;
        at most ``limit`` of them. A deleted document's are listed too."""
        out: List[Dict[str, Any]] = []
        continuation: Optional[str] = None
        while limit is None or len(out) < limit:
            params: Dict[str, Any] = {"limit": 100 if limit is None else min(100, limit - len(out))}
            if continuation is not None:
                params["continuation"] = continuation
            page = self.request("GET", self.revisions_path(doc_id), params=params).json()
            out.extend(page["revisions"])
            continuation = page["continuation"]
            if continuation is None:
                break
        return out

    def revert(self, doc_id: str, etag: str, if_match: Optional[str] = None) -> str:
        """Writes the revision ``etag`` of the document back as its new version (with
        ``if_match``, only if the document has that etag now); returns the new etag."""
        headers = {"If-Match": f'"{if_match}"'} if if_match else None
        path = f"{self.db_path}/revisions/revert/{quote(doc_id, safe='/-._~')}"
        r = self.request("POST", path, headers=headers, params={"etag": etag})
        self.invalidate(doc_id)
        return str(r.json()["etag"])

    def purge_revisions(self, doc_id: str) -> int:
        """Removes every revision of the document; returns how many there were."""
        return int(self.request("DELETE", self.revisions_path(doc_id)).json()["purged"])

    # --- attachments ---------------------------------------------------------------------

    def attachment_path(self, doc_id: str, name: str) -> str:
        return f"{self.doc_path(doc_id)}/attachments/{quote(name, safe='-._~')}"

    def put_attachment(self, doc_id: str, name: str,
                       data: Union[bytes, IO[bytes], Iterable[bytes]],
                       content_type: str = "application/octet-stream",
                       if_match: Optional[str] = None) -> Dict[str, Any]:
        """Attaches ``data`` to the document as ``name`` (replacing an attachment of
        that name): bytes, a binary file object or an iterable of byte chunks, sent as
        it is read (a large file is never held in memory). With ``if_match``, only if
        the document has that etag. Returns ``{"id", "etag", "attachment": {"name",
        "hash", "size", "content_type"}}``; ``etag`` is the document's new etag.
        A stream is sent once: it is not retried on a failover."""
        headers = {"Content-Type": content_type, **self.auth_headers}
        if if_match:
            headers["If-Match"] = f'"{if_match}"'
        path = self.attachment_path(doc_id, name)
        if isinstance(data, (bytes, bytearray)):
            r = self.request("PUT", path, content=bytes(data), headers=headers)
        else:
            r = self._client.request("PUT", self._write_node() + path, content=data,
                                     headers=headers)
            if r.status_code >= 400:
                raise error_from_response(r.status_code, r.content, r.headers)
        self.invalidate(doc_id)
        return r.json()  # type: ignore[no-any-return]

    @contextlib.contextmanager
    def get_attachment(self, doc_id: str, name: str,
                       byte_range: Optional[Tuple[int, Optional[int]]] = None
                       ) -> Iterator[httpx.Response]:
        """The attachment as a streamed answer (a context manager): read it with
        ``iter_bytes()``; ``headers["etag"]`` is its SHA-256, quoted. ``byte_range``
        ``(start, end)`` (``end`` inclusive, or ``None`` for the rest) asks for part
        of it (206). Raises :class:`AttachmentNotFoundError` if there is none."""
        headers = dict(self.auth_headers)
        if byte_range is not None:
            start, end = byte_range
            headers["Range"] = f"bytes={start}-{'' if end is None else end}"
        url = self._write_node() + self.attachment_path(doc_id, name)
        with self._client.stream("GET", url, headers=headers) as r:
            if r.status_code >= 400:
                r.read()
                raise error_from_response(r.status_code, r.content, r.headers)
            yield r

    def attachment_bytes(self, doc_id: str, name: str) -> bytes:
        """The whole attachment in memory (for small ones; see :meth:`get_attachment`)."""
        with self.get_attachment(doc_id, name) as r:
            return b"".join(r.iter_bytes())

    def attachments(self, doc_id: str) -> List[Dict[str, Any]]:
        """The document's attachments (``@metadata.@attachments``); ``[]`` if none."""
        doc = self.get(doc_id)
        if doc is None:
            raise DocumentNotFoundError(f"document {doc_id!r} does not exist",
                                        code="document_not_found")
        return list((doc.get("@metadata") or {}).get("@attachments") or [])

    def delete_attachment(self, doc_id: str, name: str,
                          if_match: Optional[str] = None) -> str:
        """Removes the attachment; returns the document's new etag."""
        headers = {"If-Match": f'"{if_match}"'} if if_match else None
        r = self.request("DELETE", self.attachment_path(doc_id, name), headers=headers)
        self.invalidate(doc_id)
        return str(r.json()["etag"])

    # --- data subscriptions --------------------------------------------------------------

    def create_subscription(self, name: str, query: str, *,
                            parameters: Optional[Dict[str, Any]] = None,
                            start: str = "beginning") -> "DataSubscription":
        """Creates a data subscription: ``query`` is ``from <collection> [where ...]``;
        ``start`` is ``beginning``, ``now`` or an etag (its writes after it). Raises
        :class:`SubscriptionExistsError` if the name is taken."""
        body: Dict[str, Any] = {"name": name, "query": query, "start": start}
        if parameters:
            body["parameters"] = parameters
        self.request("POST", f"{self.db_path}/subscriptions", json_body=body)
        return self.subscription(name)

    def subscription(self, name: str) -> "DataSubscription":
        """The data subscription ``name`` (nothing is asked of the server): its
        ``run(handler)`` processes batches, ``info()`` shows its position."""
        from .subscriptions import DataSubscription
        return DataSubscription(self, name)

    def subscriptions(self) -> List[Dict[str, Any]]:
        """Every data subscription of the database with its position."""
        r = self.request("GET", f"{self.db_path}/subscriptions")
        return r.json()["subscriptions"]  # type: ignore[no-any-return]

    def delete_subscription(self, name: str) -> None:
        self.subscription(name).delete()

    def metrics_text(self) -> str:
        return self.request("GET", "/metrics").text

    def wait_feed(self, timeout: float = 5.0) -> bool:
        """Waits for the aggressive-cache feed to be connected."""
        w = self._ensure_watcher()
        return w.wait_connected(timeout)

    def close(self) -> None:
        if self._closed:
            return
        with self._watcher_lock:
            if self._watcher is not None:
                self._watcher.close()
                self._watcher = None
        self._closed = True
        self._client.close()

    def __enter__(self) -> "DocumentStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        url = self._view.urls if self._view.clustered else self.url
        return f"DocumentStore({url!r}, {self.database!r})"


def _monotonic_ms() -> float:
    return time.monotonic() * 1000
