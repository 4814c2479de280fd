"""The changes feed against a real server: filters, callbacks and iterators, resume
from an etag, reconnect after the connection drops and after the server restarts."""

from __future__ import annotations

import threading
import time
from typing import List

from conftest import KilnServer
from kiln_client import Change, DocumentStore


def _wait(cond, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.005)
    return cond()


def test_filters_callbacks_and_iterator(store: DocumentStore) -> None:
    with store.changes() as changes:
        doc = changes.for_document("users/ada")
        prefix = changes.for_prefix("users/")
        coll = changes.for_collection("orders")
        everything = changes.for_all()
        seen: List[Change] = []
        doc.subscribe(seen.append)
        for s in (doc, prefix, coll, everything):
            assert s.wait_subscribed(5)
        assert changes.wait_connected(1)
        store.put("users/ada", {"n": 1})
        store.put("users/bob", {"n": 1})
        store.put("orders/1", {"total": 3})
        store.delete("users/bob")
        assert _wait(lambda: everything.received >= 4), everything.received
        time.sleep(0.05)
        assert everything.received == 4, [everything.next(0.1) for _ in range(everything.received)]
        assert _wait(lambda: len(seen) == 1)
        assert seen[0].id == "users/ada" and seen[0].change == "put"
        got = [prefix.next(timeout=2) for _ in range(3)]
        assert [(c.id, c.change) for c in got] == [
            ("users/ada", "put"), ("users/bob", "put"), ("users/bob", "delete")]
        assert coll.next(timeout=2).id == "orders/1"
        assert coll.next(timeout=0.1) is None
        etags = [everything.next(timeout=2).etag for _ in range(4)]
        assert [int(e.split("-")[0]) for e in etags] == sorted(int(e.split("-")[0]) for e in etags)


def test_subscribe_since_etag_sends_the_backlog(store: DocumentStore) -> None:
    first = store.put("a/1", {"v": 1})
    store.put("a/2", {"v": 2})
    store.put("a/3", {"v": 3})
    with store.changes() as changes:
        sub = changes.for_prefix("a/", since=first)
        assert sub.caught_up.wait(5)
        ids = [sub.next(timeout=2).id for _ in range(2)]
        assert ids == ["a/2", "a/3"]
        store.put("a/4", {"v": 4})
        assert sub.next(timeout=2).id == "a/4"


def test_reconnect_after_drop_resumes_without_loss_or_repeat(store: DocumentStore) -> None:
    with store.changes(reconnect_delay=0.3) as changes:
        sub = changes.for_prefix("r/")
        assert sub.wait_subscribed(5)
        for i in range(5):
            store.put(f"r/{i}", {"i": i})
        assert _wait(lambda: sub.received == 5)
        changes.drop_connection()
        assert _wait(lambda: not changes.connected, 2)
        # Written while the client is disconnected (it waits 0.3 s to reconnect).
        for i in range(5, 10):
            store.put(f"r/{i}", {"i": i})
        assert _wait(lambda: sub.received == 10, 5), sub.received
        assert changes.connections == 2
        ids = [sub.next(timeout=1).id for _ in range(10)]
        assert ids == [f"r/{i}" for i in range(10)]
        time.sleep(0.1)
        assert sub.next(timeout=0.05) is None, "nothing repeated"


def test_reconnect_after_server_restart(tmp_path) -> None:
    srv = KilnServer(data_dir=str(tmp_path / "d"))
    try:
        st = DocumentStore(srv.url, "feed")
        st.create_database()
        received: List[str] = []
        lock = threading.Lock()

        def on_change(c: Change) -> None:
            with lock:
                received.append(c.id)

        with st.changes(reconnect_delay=0.5, max_reconnect_delay=0.5) as changes:
            sub = changes.for_all().subscribe(on_change)
            assert sub.wait_subscribed(5)
            for i in range(3):
                st.put(f"k/{i}", {"i": i})
            assert _wait(lambda: len(received) == 3)
            srv.kill()
            assert _wait(lambda: not changes.connected, 5)
            srv.start()
            # Written before the client reconnects (it retries every 0.5 s).
            for i in range(3, 6):
                st.put(f"k/{i}", {"i": i})
            assert _wait(lambda: len(received) == 6, 10), (received, changes.last_close)
            st.put("k/6", {"i": 6})
            assert _wait(lambda: len(received) == 7)
            assert received == [f"k/{i}" for i in range(7)]
            assert changes.connections >= 2
        st.close()
    finally:
        srv.stop()
