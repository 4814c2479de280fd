"""The changes feed over one WebSocket (``GET /dbs/{db}/changes/ws``).

Each subscription remembers the etag of the last change it saw. When the connection
drops (the server restarted, the network failed, or the server closed it with 4008 as
a slow consumer) the client reconnects with backoff and subscribes again from that
etag, so no change is missed or repeated.
"""

from __future__ import annotations

import json
import logging
import queue
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from .errors import KilnError, make_error

# For annotations only: store.py builds this module's objects and hands itself to
# them, so naming its types at run time would be an import circle.
if TYPE_CHECKING:
    from .store import DocumentStore

log = logging.getLogger("kiln_client.changes")


@dataclass(frozen=True)
class Change:
    id: str
    etag: str
    #: "put" or "delete"
    change: str
    collection: Optional[str]
    #: The subscription it came through.
    sub: str

    @property
    def sequence(self) -> int:
        return int(self.etag.split("-", 1)[0])


class ChangesIteratorOverflow(KilnError):
    code = "iterator_overflow"


class Subscription:
    """One filter on a changes connection. Give it callbacks with :meth:`subscribe`,
    or iterate over it (``for change in sub``; ``sub.next(timeout)``)."""

    def __init__(self, changes: "Changes", name: str, filt: Dict[str, str],
                 since: Optional[str], buffer: int) -> None:
        self._changes = changes
        self.name = name
        self.filter = filt
        #: The etag to resume from (the last change seen, or where it went live).
        self.resume_etag: Optional[str] = since
        self._callbacks: List[Callable[[Change], None]] = []
        self._queue: "queue.Queue[Change]" = queue.Queue(maxsize=buffer)
        self._overflowed = False
        self.subscribed = threading.Event()
        self.caught_up = threading.Event()
        self.closed = False
        self.received = 0

    def subscribe(self, callback: Callable[[Change], None]) -> "Subscription":
        self._callbacks.append(callback)
        return self

    def _deliver(self, c: Change) -> None:
        self.resume_etag = c.etag
        self.received += 1
        for cb in list(self._callbacks):
            try:
                cb(c)
            except Exception:  # a callback's failure must not stop the feed
                log.exception("a changes callback failed")
        try:
            self._queue.put_nowait(c)
        except queue.Full:
            self._overflowed = True

    def next(self, timeout: Optional[float] = None) -> Optional[Change]:
        """The next change, or None after ``timeout`` seconds."""
        if self._overflowed and self._queue.empty():
            raise ChangesIteratorOverflow(
                "more changes arrived than the iterator buffer holds; read faster, use "
                "a callback, or pass a larger buffer")
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def __iter__(self) -> Iterator[Change]:
        while not self.closed or not self._queue.empty():
            c = self.next(timeout=0.5)
            if c is not None:
                yield c

    def wait_subscribed(self, timeout: float = 5.0) -> bool:
        return self.subscribed.wait(timeout)

    def close(self) -> None:
        self._changes._unsubscribe(self)


class Changes:
    """A changes connection of a :class:`~kiln_client.DocumentStore`, run by a
    background thread."""

    def __init__(self, store: "DocumentStore", *, reconnect_delay: float = 0.1,
                 max_reconnect_delay: float = 5.0, buffer: int = 100_000,
                 on_connected: Optional[Callable[[], None]] = None,
                 on_disconnected: Optional[Callable[[], None]] = None,
                 on_error: Optional[Callable[[KilnError], None]] = None,
                 name: str = "changes") -> None:
        self._store = store
        self.reconnect_delay = reconnect_delay
        self.max_reconnect_delay = max_reconnect_delay
        self._buffer = buffer
        self._on_connected = on_connected
        self._on_disconnected = on_disconnected
        self._on_error = on_error
        self._subs: Dict[str, Subscription] = {}
        self._lock = threading.Lock()
        self._ws: Optional[ClientConnection] = None
        self._connected = threading.Event()
        self._closed = threading.Event()
        self._next_sub = 0
        #: How many times a connection was opened (1 for the first).
        self.connections = 0
        self.last_close: Optional[str] = None
        self.errors: List[KilnError] = []
        self._thread = threading.Thread(target=self._run, name=f"kiln-{name}", daemon=True)
        self._thread.start()

    @property
    def ws_url(self) -> str:
        """The feed on the node the store reads from (in a cluster, a connection that
        fails moves the store on to the next node, and the feed resumes there: every
        node gives a change the same etag)."""
        return self._ws_url_at(self._store.url)

    def _ws_url_at(self, node: str) -> str:
        base = node.replace("https://", "wss://", 1).replace("http://", "ws://", 1)
        return f"{base}{self._store.db_path}/changes/ws"

    # --- subscriptions -----------------------------------------------------------------

    def _add(self, filt: Dict[str, str], since: Optional[str]) -> Subscription:
        with self._lock:
            self._next_sub += 1
            sub = Subscription(self, f"s{self._next_sub}", filt, since, self._buffer)
            self._subs[sub.name] = sub
            ws = self._ws
            if ws is not None:
                self._send_subscribe(ws, sub)
        return sub

    def for_document(self, doc_id: str, since: Optional[str] = None) -> Subscription:
        return self._add({"id": doc_id}, since)

    def for_prefix(self, prefix: str, since: Optional[str] = None) -> Subscription:
        return self._add({"prefix": prefix}, since)

    def for_collection(self, collection: str, since: Optional[str] = None) -> Subscription:
        return self._add({"collection": collection}, since)

    def for_all(self, since: Optional[str] = None) -> Subscription:
        """Every change of the database; from ``since`` (an etag) if given, else live."""
        return self._add({}, since)

    def _unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            sub.closed = True
            self._subs.pop(sub.name, None)
            ws = self._ws
            if ws is not None:
                try:
                    ws.send(json.dumps({"op": "unsubscribe", "sub": sub.name}))
                except Exception:
                    pass

    def _send_subscribe(self, ws: ClientConnection, sub: Subscription) -> None:
        msg: Dict[str, Any] = {"op": "subscribe", "sub": sub.name, **sub.filter}
        if sub.resume_etag is not None:
            msg["since"] = sub.resume_etag
        try:
            ws.send(json.dumps(msg))
        except Exception:
            pass  # the reader notices the broken connection and reconnects

    # --- state --------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def wait_connected(self, timeout: float = 5.0) -> bool:
        return self._connected.wait(timeout)

    def drop_connection(self) -> None:
        """Closes the WebSocket as a network failure would (it then reconnects)."""
        ws = self._ws
        if ws is not None:
            try:
                # shutdown() wakes the reader blocked in recv; close() alone would not.
                ws.socket.shutdown(socket.SHUT_RDWR)
            except Exception:
                pass

    def close(self) -> None:
        self._closed.set()
        ws = self._ws
        if ws is not None:
            try:
                ws.close()
            except Exception:
                pass
        self._thread.join(timeout=5)
        for s in list(self._subs.values()):
            s.closed = True

    def __enter__(self) -> "Changes":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- the connection's thread ----------------------------------------------------------

    def _run(self) -> None:
        delay = self.reconnect_delay
        while not self._closed.is_set():
            node = self._store.url
            try:
                # Entered by hand: websockets >= 17 connects in __enter__ (and warns
                # about a bare connect()), older versions in connect() itself.
                cm = connect(
                    self._ws_url_at(node),
                    additional_headers=self._store.auth_headers,
                    ssl=self._store.ssl_context,
                    open_timeout=5,
                    ping_interval=10,
                    ping_timeout=10,
                    close_timeout=1,
                    max_size=1 << 20,
                )
                ws = cm.__enter__()
            except Exception as e:  # refused, TLS, 401/429 at the upgrade
                log.debug("changes connection failed: %r", e)
                self.last_close = f"connect failed: {e!r}"
                # Refused or unreachable (not a 401 or 429 at the upgrade, not TLS).
                if isinstance(e, OSError) and not isinstance(e, ssl.SSLError):
                    self._store._read_node_failed(node)
                if self._closed.wait(delay):
                    return
                delay = min(delay * 2, self.max_reconnect_delay)
                continue
            self.connections += 1
            with self._lock:
                self._ws = ws
                for sub in self._subs.values():
                    self._send_subscribe(ws, sub)
                if not self._subs:
                    self._connected.set()
            try:
                self._read(ws)
                delay = self.reconnect_delay
            except ConnectionClosed as e:
                rcvd = e.rcvd
                self.last_close = f"{rcvd.code} {rcvd.reason}" if rcvd else "no close frame"
            except Exception as e:
                self.last_close = repr(e)
            finally:
                with self._lock:
                    self._ws = None
                was = self._connected.is_set()
                if was and self._on_disconnected is not None:
                    self._on_disconnected()
                self._connected.clear()
                for s in self._subs.values():
                    s.subscribed.clear()
                if not self._closed.is_set():  # else close() is closing it
                    try:
                        cm.__exit__(None, None, None)
                    except Exception:
                        pass
            if self._closed.wait(delay):
                return
            delay = min(delay * 2, self.max_reconnect_delay)

    def _read(self, ws: ClientConnection) -> None:
        while True:
            # Reads on after close() until the connection is closed: websockets stops
            # reading the socket while its queue of unread messages is full, and the
            # server's close frame would wait behind them until close_timeout.
            text = ws.recv()
            if self._closed.is_set():
                continue
            msg = json.loads(text)
            kind = msg.get("type")
            sub = self._subs.get(msg.get("sub", ""))
            if kind == "change":
                if sub is not None:
                    sub._deliver(Change(msg["id"], msg["etag"], msg["change"],
                                        msg.get("collection"), msg["sub"]))
            elif kind == "subscribed":
                if sub is not None:
                    if sub.resume_etag is None:
                        # Live from here: a reconnection resumes from this point.
                        sub.resume_etag = msg.get("last_etag")
                    sub.subscribed.set()
                    if all(s.subscribed.is_set() for s in self._subs.values()):
                        if not self._connected.is_set():
                            # The callback first: whoever waits on the event must
                            # find the aggressive cache's state already connected.
                            if self._on_connected is not None:
                                self._on_connected()
                            self._connected.set()
            elif kind == "caught_up":
                if sub is not None:
                    e = msg.get("last_etag")
                    if e and (sub.resume_etag is None or _seq(e) > _seq(sub.resume_etag)):
                        sub.resume_etag = e
                    sub.caught_up.set()
            elif kind == "error":
                err = make_error(msg.get("code"), msg.get("message", ""))
                self.errors.append(err)
                if self._on_error is not None:
                    self._on_error(err)
            # heartbeats and "unsubscribed" need nothing


def _seq(etag: str) -> int:
    try:
        return int(etag.split("-", 1)[0])
    except ValueError:
        return -1
