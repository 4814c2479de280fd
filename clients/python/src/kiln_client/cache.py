"""The HTTP cache: answers by URL (or by URL and body, for queries) with their ETag.

Bounded by bytes, least recently used first out. A cached answer is revalidated with
``If-None-Match``; a 304 costs no body. In aggressive mode (see
:meth:`kiln_client.DocumentStore.aggressive_caching`) an answer is given from the
cache without a request while the changes feed is connected and has said nothing
about it since it was validated.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Dict, Optional


@dataclass
class CacheEntry:
    etag: str
    content: bytes
    #: When the server last confirmed this answer (time.monotonic()).
    validated_at: float
    #: The store's change counter captured before the request that confirmed it.
    validated_counter: int
    #: True for a single document's URL (a change names it); False for answers that
    #: any change may affect (queries, listings).
    is_document: bool = False

    @property
    def size(self) -> int:
        return len(self.content) + len(self.etag) + 64


@dataclass
class CacheStats:
    #: Requests actually sent over HTTP (any method, any status).
    requests: int = 0
    #: GETs and queries answered 304 Not Modified (the cached body was used).
    not_modified: int = 0
    #: Answers given from the cache without a request (aggressive mode).
    aggressive_hits: int = 0
    #: Cached answers dropped to stay under the byte bound.
    evictions: int = 0
    #: Body bytes received from the server.
    bytes_received: int = 0
    #: Writes sent a second time after a failover (each one at most once).
    failover_retries: int = 0


class HttpCache:
    """A byte-bounded LRU map of cache key -> :class:`CacheEntry` (thread-safe)."""

    def __init__(self, max_bytes: int = 64 << 20) -> None:
        self.max_bytes = max_bytes
        self._entries: "OrderedDict[str, CacheEntry]" = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def get(self, key: str) -> Optional[CacheEntry]:
        with self._lock:
            e = self._entries.get(key)
            if e is not None:
                self._entries.move_to_end(key)
            return e

    def put(self, key: str, etag: str, content: bytes, counter: int,
            is_document: bool = False) -> None:
        entry = CacheEntry(etag, content, time.monotonic(), counter, is_document)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.size
            if entry.size > self.max_bytes:
                return
            self._entries[key] = entry
            self._bytes += entry.size
            while self._bytes > self.max_bytes and self._entries:
                _, dropped = self._entries.popitem(last=False)
                self._bytes -= dropped.size
                self.evictions += 1

    def revalidated(self, key: str, counter: int) -> Optional[CacheEntry]:
        """A 304 confirmed the entry: it is fresh as of ``counter``."""
        with self._lock:
            e = self._entries.get(key)
            if e is not None:
                e.validated_at = time.monotonic()
                e.validated_counter = max(e.validated_counter, counter)
                self._entries.move_to_end(key)
            return e

    def remove(self, key: str) -> None:
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.size

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0


@dataclass
class _Invalidation:
    """What the changes feed said, as counters (see ``AggressiveState.can_serve``)."""

    counter: int = 0
    connected_at: int = 0
    connected: bool = False
    any_change: int = 0
    floor: int = 0
    by_key: Dict[str, int] = field(default_factory=dict)


class AggressiveState:
    """Tracks what the changes feed said, to decide whether a cached answer may be
    given without asking the server.

    Every notification bumps a counter. An entry remembers the counter as it was just
    before the request that validated it. It may be served aggressively while:
    the feed is connected and was connected before the entry was validated; no change
    to its document (for a document URL) or no change at all (for a query or a
    listing) was announced after it was validated; and it is younger than the
    aggressive duration.
    """

    MAX_TRACKED_KEYS = 50_000

    def __init__(self) -> None:
        self._s = _Invalidation()
        self._lock = threading.Lock()

    @property
    def counter(self) -> int:
        return self._s.counter

    @property
    def connected(self) -> bool:
        return self._s.connected

    def on_connected(self) -> None:
        with self._lock:
            self._s.counter += 1
            self._s.connected_at = self._s.counter
            self._s.connected = True

    def on_disconnected(self) -> None:
        with self._lock:
            self._s.counter += 1
            self._s.connected = False

    def on_change(self, key: Optional[str]) -> None:
        with self._lock:
            s = self._s
            s.counter += 1
            s.any_change = s.counter
            if key is not None:
                if len(s.by_key) >= self.MAX_TRACKED_KEYS:
                    # Forget the per-key detail: everything validated before now is
                    # revalidated once.
                    s.by_key.clear()
                    s.floor = s.counter
                s.by_key[key] = s.counter

    def can_serve(self, key: str, entry: CacheEntry, duration: float) -> bool:
        s = self._s
        if not s.connected:
            return False
        v = entry.validated_counter
        if v < s.connected_at or v < s.floor:
            return False
        if entry.is_document:
            if v < s.by_key.get(key, 0):
                return False
        elif v < s.any_change:
            return False
        return time.monotonic() - entry.validated_at <= duration
