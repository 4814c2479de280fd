"""Data subscriptions: a named, durable cursor on the server over a collection
(``from orders where total > 100``), read by one worker at a time.

``store.subscription("name").run(handler)`` connects a worker
(``/dbs/{db}/subscriptions/{name}/ws``), calls ``handler(batch)`` for each batch and
acknowledges the batch when the handler returns. The server moves the subscription's
position only on that acknowledgment, so a worker that dies (or whose handler raises)
gets the same batch again: delivery is at least once, in etag order. A document
written several times before it is delivered comes once, at its latest version;
deleted documents are not delivered.
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional
from urllib.parse import quote

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from .errors import KilnError, error_from_response, make_error

if TYPE_CHECKING:  # pragma: no cover
    from .store import DocumentStore

log = logging.getLogger("kiln_client.subscriptions")

#: Close codes of the server (see docs/http-api.md).
CLOSE_TAKEN_OVER = 4009
CLOSE_DELETED = 4004
#: A cluster's node that stopped leading: the worker connects to the leader.
CLOSE_NOT_LEADER = 4307


@dataclass
class SubscriptionBatch:
    """One batch: ``documents`` (each with its ``@metadata``, ``@etag`` included), in
    etag order; ``last_etag`` is where the position moves when it is acknowledged."""

    number: int
    documents: List[Dict[str, Any]]
    last_etag: str
    after: Optional[str]

    def __len__(self) -> int:
        return len(self.documents)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.documents)


class SubscriptionClosedError(KilnError):
    """The server ended the worker: the subscription was deleted (4004), or another
    worker took it over (4009)."""

    code = "subscription_closed"

    def __init__(self, message: str, close_code: int) -> None:
        super().__init__(message, code=self.code)
        self.close_code = close_code


class DataSubscription:
    """A data subscription of a :class:`~kiln_client.DocumentStore` (made by
    ``store.subscription(name)``; it need not exist yet: see :meth:`create`)."""

    def __init__(self, store: "DocumentStore", name: str) -> None:
        self._store = store
        self.name = name
        self._stop = threading.Event()
        #: Connections opened by :meth:`run` (1 for the first).
        self.connections = 0
        #: Batches acknowledged by :meth:`run`.
        self.batches = 0

    @property
    def path(self) -> str:
        return f"{self._store.db_path}/subscriptions/{quote(self.name, safe='')}"

    def info(self) -> Dict[str, Any]:
        """``{"name", "query", "collection", "position", "connected", ...}``."""
        return self._store.request("GET", self.path).json()  # type: ignore[no-any-return]

    def delete(self) -> None:
        self._store.request("DELETE", self.path)

    def stop(self) -> None:
        """Makes :meth:`run` return after the batch in hand (from any thread)."""
        self._stop.set()

    def _node(self) -> str:
        """The node a worker connects to: the leader in a cluster (it serves the
        workers and commits their acknowledgments), else the store's server."""
        if self._store.clustered:
            return self._store._write_node()
        return self._store.url

    def _ws_url(self, node: str, batch_size: Optional[int], strategy: str) -> str:
        base = node.replace("https://", "wss://", 1).replace("http://", "ws://", 1)
        query = f"strategy={strategy}"
        if batch_size is not None:
            query += f"&batch_size={int(batch_size)}"
        return f"{base}{self.path}/ws?{query}"

    def run(self, handler: Callable[[SubscriptionBatch], None], *,
            batch_size: Optional[int] = None, strategy: str = "wait",
            max_batches: Optional[int] = None, reconnect: bool = True,
            reconnect_delay: float = 0.1, max_reconnect_delay: float = 5.0) -> None:
        """Calls ``handler(batch)`` for every batch, acknowledging each when the
        handler returns, until :meth:`stop` is called, ``max_batches`` were
        acknowledged, or the server ends the worker (:class:`SubscriptionClosedError`:
        deleted, taken over). A handler that raises ends ``run`` with its exception
        and the batch unacknowledged (the next worker gets it again). Lost
        connections are opened again (the server restarting, a network failure)
        unless ``reconnect`` is false. ``strategy``: ``wait`` (while another worker
        holds it), ``take_over`` or ``if_free``."""
        self._stop.clear()
        delay = reconnect_delay
        done = 0
        while not self._stop.is_set():
            node = None
            try:
                node = self._node()
                cm = connect(
                    self._ws_url(node, batch_size, strategy),
                    additional_headers=self._store.auth_headers,
                    ssl=self._store.ssl_context,
                    open_timeout=5,
                    # The server pings the worker; answering is the library's job.
                    ping_interval=None,
                    close_timeout=1,
                    # Batches are bounded by the server (4 MiB, or one larger document).
                    max_size=None,
                )
                ws = cm.__enter__()
            except Exception as e:
                status = getattr(getattr(e, "response", None), "status_code", None)
                if node is not None and self._store.clustered:
                    # Not the leader (307), or down: found again at the next try.
                    self._store._forget_leader(node)
                redirected = status == 307 and self._store.clustered
                if status is not None and status < 500 and status != 429 and not redirected:
                    resp = e.response  # type: ignore[attr-defined]
                    raise error_from_response(status, resp.body or b"") from None
                if not reconnect or (isinstance(e, ssl.SSLError)):
                    raise
                log.debug("subscription connection failed: %r", e)
                if self._stop.wait(delay):
                    return
                delay = min(delay * 2, max_reconnect_delay)
                continue
            self.connections += 1
            try:
                while not self._stop.is_set():
                    try:
                        text = ws.recv(timeout=0.5)
                    except TimeoutError:
                        continue
                    msg = json.loads(text)
                    kind = msg.get("type")
                    if kind == "batch":
                        batch = SubscriptionBatch(msg["batch"], msg["documents"],
                                                  msg["last_etag"], msg.get("after"))
                        handler(batch)
                        ws.send(json.dumps({"op": "ack", "batch": batch.number}))
                        self.batches += 1
                        done += 1
                        delay = reconnect_delay
                        if max_batches is not None and done >= max_batches:
                            self._wait_acknowledged(ws, batch.number)
                            return
                    elif kind == "error":
                        raise make_error(msg.get("code"), msg.get("message", ""))
                    # subscribed, waiting, acknowledged, heartbeat: nothing to do
            except ConnectionClosed as e:
                rcvd = e.rcvd
                if rcvd is not None and rcvd.code in (CLOSE_TAKEN_OVER, CLOSE_DELETED):
                    raise SubscriptionClosedError(
                        f"subscription {self.name!r}: {rcvd.reason}", rcvd.code) from None
                if not reconnect:
                    raise
                if self._store.clustered:
                    # The leader stopped leading (4307) or is gone: find it again.
                    self._store._forget_leader(node)
                log.debug("subscription connection lost: %r", e)
            finally:
                try:
                    cm.__exit__(None, None, None)
                except Exception:
                    pass
            if self._stop.wait(delay):
                return
            delay = min(delay * 2, max_reconnect_delay)

    @staticmethod
    def _wait_acknowledged(ws: Any, number: int, timeout: float = 5.0) -> None:
        """Waits for the server's confirmation that the last acknowledgment moved
        the position (so that ``run(max_batches=...)`` returns with it durable)."""
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                msg = json.loads(ws.recv(timeout=max(0.0, deadline - time.monotonic())))
            except TimeoutError:
                return
            if msg.get("type") == "acknowledged" and msg.get("batch") == number:
                return
            if msg.get("type") == "error":
                raise make_error(msg.get("code"), msg.get("message", ""))
