"""Bulk insert: NDJSON streamed to ``POST /dbs/{db}/bulk`` over one connection.

The server commits batches while the upload goes on and streams back one
``{"acked": n, "last_etag": e}`` line per committed batch. An HTTP/1.1 client that
sends the whole body before reading the answer (httpx, http.client) cannot show those
acks as they come, so this module speaks HTTP/1.1 itself: one I/O thread writes the
chunked body and reads the acks from the same socket (plain or TLS), while the
caller's thread serializes documents into a bounded queue. Client memory is bounded by
``max_pending_bytes`` whatever the number of documents.
"""

from __future__ import annotations

import json
import os
import queue
import select
import socket
import ssl
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional
from urllib.parse import urlsplit

from .errors import (BulkInsertError, ConnectionFailedError, KilnError, error_from_response,
                     make_error)
from .session import collection_prefix, to_document

# For annotations only: store.py builds this module's objects and hands itself to
# them, so naming its types at run time would be an import circle.
if TYPE_CHECKING:
    from .store import DocumentStore


class BulkInsert:
    """``with store.bulk_insert() as bulk: bulk.store(doc, id)``.

    ``bulk.acked`` and ``bulk.last_etag`` follow the server's acks as they arrive
    (``on_ack(acked, last_etag)`` is called for each); leaving the block waits for the
    final answer and raises :class:`~kiln_client.errors.BulkInsertError` if the
    server stopped at a bad line (every line before it is committed).
    """

    #: Lines per HTTP chunk at most. The server parses a whole chunk into the batch it
    #: is filling before checking the batch's 8,192-document bound, so a chunk of many
    #: small lines could overshoot `kiln serve --max-batch-ops` (10,000) and fail the
    #: stream with `batch_too_long`; 1,024 lines per chunk keeps it below.
    MAX_LINES_PER_CHUNK = 1024

    def __init__(self, store: "DocumentStore", *, chunk_bytes: int = 64 << 10,
                 max_pending_bytes: int = 8 << 20,
                 on_ack: Optional[Callable[[int, Optional[str]], None]] = None,
                 timeout: float = 60.0) -> None:
        self._store = store
        self.chunk_bytes = chunk_bytes
        self._queue: "queue.Queue[Optional[bytes]]" = queue.Queue(
            maxsize=max(2, max_pending_bytes // chunk_bytes))
        self._buf: List[bytes] = []
        self._buf_len = 0
        self.on_ack = on_ack
        self.timeout = timeout
        self.acked = 0
        self.last_etag: Optional[str] = None
        self.stored = 0
        self.acks = 0
        self.done = False
        self.error: Optional[KilnError] = None
        self._finished = threading.Event()
        self._closed = False
        self._wake_r, self._wake_w = os.pipe()
        self._sock = self._connect()
        self._thread = threading.Thread(target=self._io, name="kiln-bulk", daemon=True)
        self._thread.start()

    # --- the caller's side ----------------------------------------------------------------

    def store(self, document: Any, id: Optional[str] = None) -> None:
        """Queues one document; ``id`` None (or ending in ``/``) lets the server
        generate one under the document's collection."""
        if self.error is not None:
            raise self.error
        if self._closed:
            raise KilnError("the bulk insert is closed", code="bulk_closed")
        body = to_document(document)
        if id is None:
            id = collection_prefix(document, body)
        line = json.dumps({"id": id, "document": body}, separators=(",", ":"),
                          ensure_ascii=False).encode()
        self._buf.append(line)
        self._buf.append(b"\n")
        self._buf_len += len(line) + 1
        self.stored += 1
        if self._buf_len >= self.chunk_bytes or len(self._buf) >= 2 * self.MAX_LINES_PER_CHUNK:
            self._flush()

    def _flush(self) -> None:
        if not self._buf:
            return
        data = b"".join(self._buf)
        self._buf = []
        self._buf_len = 0
        self._put(data)

    def _put(self, item: Optional[bytes]) -> None:
        while True:
            if self._finished.is_set():
                if self.error is not None:
                    raise self.error
                raise KilnError("the bulk insert ended early", code="bulk_closed")
            try:
                self._queue.put(item, timeout=0.2)
                os.write(self._wake_w, b"x")
                return
            except queue.Full:
                continue

    def close(self) -> None:
        """Sends the rest, waits for the server's final answer; raises if it failed."""
        if self._closed:
            if self.error is not None:
                raise self.error
            return
        self._closed = True
        try:
            self._flush()
            self._put(None)
        except KilnError:
            pass
        if not self._finished.wait(self.timeout):
            self.error = self.error or ConnectionFailedError(
                f"no final answer from the bulk insert within {self.timeout} s")
        self._thread.join(timeout=1)
        self._cleanup()
        if self.error is not None:
            raise self.error

    def abort(self) -> None:
        self._closed = True
        try:
            self._sock.close()
        except OSError:
            pass
        self._finished.wait(5)
        self._cleanup()

    def _cleanup(self) -> None:
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._wake_r = self._wake_w = -1

    def __enter__(self) -> "BulkInsert":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            self.abort()
            return
        self.close()

    # --- the I/O thread -------------------------------------------------------------------

    def _connect(self) -> socket.socket:
        s = self._store
        u = urlsplit(s.url)
        host = u.hostname or "127.0.0.1"
        port = u.port or (443 if u.scheme == "https" else 80)
        try:
            sock = socket.create_connection((host, port), timeout=10)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if s.ssl_context is not None:
                sock = s.ssl_context.wrap_socket(sock, server_hostname=host)
        except (OSError, ssl.SSLError) as e:
            raise ConnectionFailedError(f"bulk insert: cannot connect to {s.url}: {e!r}") from e
        sock.setblocking(False)
        head = [
            f"POST {s.db_path}/bulk HTTP/1.1",
            f"Host: {u.netloc}",
            "Content-Type: application/x-ndjson",
            "Transfer-Encoding: chunked",
            "Accept: application/x-ndjson",
            "User-Agent: kiln-client-python/0.1",
        ]
        head += [f"{k}: {v}" for k, v in s.auth_headers.items()]
        self._out = bytearray(("\r\n".join(head) + "\r\n\r\n").encode())
        return sock

    def _io(self) -> None:
        sock = self._sock
        out = self._out
        body_done = False  # the final chunk is queued in `out`
        write_ok = True
        reader = _ResponseReader(self)
        try:
            while not reader.finished:
                if write_ok and not body_done and len(out) < (1 << 20):
                    try:
                        while len(out) < (1 << 20):
                            item = self._queue.get_nowait()
                            if item is None:
                                out += b"0\r\n\r\n"
                                body_done = True
                                break
                            out += b"%x\r\n" % len(item)
                            out += item
                            out += b"\r\n"
                    except queue.Empty:
                        pass
                want_write = write_ok and bool(out)
                rl: List[Any] = [sock, self._wake_r]
                wl: List[Any] = [sock] if want_write else []
                pending = isinstance(sock, ssl.SSLSocket) and sock.pending() > 0
                if not pending:
                    r, w, _ = select.select(rl, wl, [], self.timeout)
                    if not r and not w:
                        raise ConnectionFailedError(
                            f"bulk insert: nothing moved for {self.timeout} s")
                else:
                    r, w = [sock], []
                if self._wake_r in r:
                    os.read(self._wake_r, 4096)
                if sock in w and out:
                    try:
                        n = sock.send(out[:1 << 18])
                        del out[:n]
                    except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
                        pass
                    except OSError:
                        # The server stopped reading (a bad line): its answer says why.
                        write_ok = False
                if sock in r:
                    while True:
                        try:
                            data = sock.recv(65536)
                        except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                            break
                        except OSError as e:
                            if reader.finished:
                                break
                            raise ConnectionFailedError(f"bulk insert: {e!r}") from e
                        if not data:
                            reader.eof()
                            break
                        reader.feed(data)
                        if not (isinstance(sock, ssl.SSLSocket) and sock.pending()):
                            break
        except KilnError as e:
            self.error = self.error or e
        except Exception as e:  # a bug must not hang the caller
            self.error = self.error or KilnError(f"bulk insert failed: {e!r}")
        finally:
            try:
                sock.close()
            except OSError:
                pass
            if not self.done and self.error is None:
                self.error = ConnectionFailedError(
                    "the bulk insert connection closed before the final answer")
            self._finished.set()

    def _on_line(self, line: Dict[str, Any]) -> None:
        if "error" in line:
            cause = make_error(line.get("error"), str(line.get("message", "")))
            self.acked = int(line.get("acked", self.acked))
            self.last_etag = line.get("last_etag", self.last_etag)
            self.error = BulkInsertError(
                f"bulk insert stopped at line {line.get('line')}: {line.get('error')}: "
                f"{line.get('message')} ({self.acked} documents before it committed)",
                code=str(line.get("error")), line=line.get("line"), acked=self.acked,
                last_etag=self.last_etag, cause=cause, body=line)
            return
        if "acked" in line:
            self.acked = int(line["acked"])
            self.last_etag = line.get("last_etag")
            if not line.get("done"):
                self.acks += 1
                if self.on_ack is not None:
                    self.on_ack(self.acked, self.last_etag)
        if line.get("done"):
            self.done = True


class _ResponseReader:
    """Parses the HTTP answer as it arrives: head, then a chunked (or close-delimited,
    or sized) body of NDJSON lines."""

    def __init__(self, bulk: BulkInsert) -> None:
        self.bulk = bulk
        self.buf = bytearray()
        self.head: Optional[Dict[str, str]] = None
        self.status = 0
        self.chunked = False
        self.length: Optional[int] = None
        self.body = bytearray()  # decoded body not yet split into lines
        self.error_body = bytearray()
        self.chunk_left = 0
        self.finished = False

    def feed(self, data: bytes) -> None:
        self.buf += data
        if self.head is None:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
            del self.buf[:end + 4]
            self.status = int(lines[0].split()[1])
            self.head = {}
            for l in lines[1:]:
                k, _, v = l.partition(":")
                self.head[k.strip().lower()] = v.strip()
            self.chunked = "chunked" in self.head.get("transfer-encoding", "").lower()
            if "content-length" in self.head:
                self.length = int(self.head["content-length"])
        self._decode()

    def _decode(self) -> None:
        if self.chunked:
            while True:
                if self.chunk_left == 0:
                    nl = self.buf.find(b"\r\n")
                    if nl < 0:
                        return
                    size_line = bytes(self.buf[:nl]).split(b";")[0].strip()
                    if not size_line:  # the CRLF after a chunk's data
                        del self.buf[:nl + 2]
                        continue
                    size = int(size_line, 16)
                    del self.buf[:nl + 2]
                    if size == 0:
                        self._body_end()
                        return
                    self.chunk_left = size
                take = min(self.chunk_left, len(self.buf))
                if take == 0:
                    return
                self._body(bytes(self.buf[:take]))
                del self.buf[:take]
                self.chunk_left -= take
        else:
            if self.buf:
                self._body(bytes(self.buf))
                if self.length is not None:
                    self.length -= len(self.buf)
                self.buf.clear()
            if self.length is not None and self.length <= 0:
                self._body_end()

    def _body(self, data: bytes) -> None:
        if self.status != 200:
            self.error_body += data
            return
        self.body += data
        while True:
            nl = self.body.find(b"\n")
            if nl < 0:
                return
            line = bytes(self.body[:nl]).strip()
            del self.body[:nl + 1]
            if line:
                self.bulk._on_line(json.loads(line))

    def _body_end(self) -> None:
        if self.finished:
            return
        self.finished = True
        if self.status != 200:
            self.bulk.error = error_from_response(self.status, bytes(self.error_body))
        elif self.body.strip():
            self.bulk._on_line(json.loads(bytes(self.body)))

    def eof(self) -> None:
        if self.head is not None:
            self._body_end()
        else:
            self.finished = True
