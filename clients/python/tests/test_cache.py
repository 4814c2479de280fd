"""The HTTP cache against a real server: 304 revalidation counted by the server's
metrics, the LRU byte bound, aggressive caching invalidated by another process's
write, and the fallback to revalidation when the changes feed is down."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import pytest

from conftest import KilnServer, requests_to
from kiln_client import DocumentStore


def test_revalidation_sends_304_without_body(server, store: DocumentStore) -> None:
    store.put("users/ada", {"name": "Ada", "bio": "x" * 5000})
    before = server.metrics()
    bytes_before = store.stats.bytes_received
    with store.session() as s:
        assert s.load("users/ada")["name"] == "Ada"  # 200, cached with its ETag
    first_bytes = store.stats.bytes_received - bytes_before
    assert first_bytes > 5000
    for _ in range(20):
        with store.session() as s:
            assert s.load("users/ada")["bio"] == "x" * 5000
    after = server.metrics()
    assert requests_to(after, status="304") - requests_to(before, status="304") == 20
    assert requests_to(after, status="200") - requests_to(before, status="200") == 1
    assert store.stats.not_modified >= 20
    # A 304 carries no body: 20 revalidations transferred nothing.
    assert store.stats.bytes_received - bytes_before == first_bytes
    # A change is seen at the next revalidation (200 with the new body).
    store.put("users/ada", {"name": "Ada Lovelace"})
    with store.session() as s:
        assert s.load("users/ada")["name"] == "Ada Lovelace"


def test_cache_is_lru_bounded_by_bytes(server, db_name) -> None:
    st = DocumentStore(server.url, db_name, cache_size_bytes=20_000)
    try:
        st.create_database()
        for i in range(20):
            st.put(f"d/{i}", {"i": i, "pad": "p" * 1000})
        for i in range(20):
            assert st.get(f"d/{i}")["i"] == i
        assert st.cache.size_bytes <= 20_000
        assert 10 <= len(st.cache) < 20
        assert st.cache.evictions > 0
        # The most recent are kept, the oldest went first.
        assert st.doc_path("d/19") in st.cache
        assert st.doc_path("d/0") not in st.cache
        # Touching an entry makes it recent: it survives the next insertions.
        kept = len(st.cache)
        oldest_kept = 20 - kept
        st.get(f"d/{oldest_kept}")
        st.put("d/extra", {"pad": "p" * 1000})
        st.get("d/extra")
        assert st.doc_path(f"d/{oldest_kept}") in st.cache
        assert st.doc_path(f"d/{oldest_kept + 1}") not in st.cache
    finally:
        st.close()


def _write_from_other_process(url: str, path: str, body: str) -> float:
    """Writes with curl if present, else a separate Python process; returns the time
    (monotonic) when the write was acknowledged."""
    if shutil.which("curl"):
        cmd = ["curl", "-sf", "-X", "PUT", "--data-binary", body, f"{url}{path}"]
    else:
        code = ("import sys, urllib.request as u; "
                "u.urlopen(u.Request(sys.argv[1], data=sys.argv[2].encode(), method='PUT'))")
        cmd = [sys.executable, "-c", code, f"{url}{path}", body]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.monotonic()


def test_aggressive_caching_invalidated_by_another_process(server, store: DocumentStore) -> None:
    store.put("users/ada", {"name": "Ada", "v": 0})
    with store.aggressive_caching(duration=60):
        assert store.aggressive_feed_connected
        with store.session() as s:
            assert s.load("users/ada")["v"] == 0
        before = server.metrics()
        for _ in range(200):
            with store.session() as s:
                assert s.load("users/ada")["v"] == 0
                assert s.requests == 0, "answered from the cache without a request"
        after = server.metrics()
        assert requests_to(after) == requests_to(before), "no GET reached the server"
        assert store.stats.aggressive_hits >= 200

        lags = []
        for v in range(1, 4):
            acked = _write_from_other_process(server.url, store.doc_path("users/ada"),
                                              f'{{"name":"Ada","v":{v}}}')
            while True:
                with store.session() as s:
                    if s.load("users/ada")["v"] == v:
                        break
                if time.monotonic() - acked > 2:
                    pytest.fail("the change was not seen within 2 s")
                time.sleep(0.001)
            lags.append((time.monotonic() - acked) * 1000)
        print(f"aggressive cache: change from another process seen after "
              f"{', '.join(f'{x:.1f}' for x in lags)} ms")
        assert max(lags) <= 100, lags
        # After the invalidation it is served from the cache again.
        with store.session() as s:
            s.load("users/ada")
        with store.session() as s:
            s.load("users/ada")
            assert s.requests == 0


def test_aggressive_caching_unrelated_change_keeps_entry(server, store: DocumentStore) -> None:
    store.put("a/1", {"v": 1})
    with store.aggressive_caching(duration=60):
        store.get("a/1")
        _write_from_other_process(server.url, store.doc_path("b/1"), '{"v":1}')
        time.sleep(0.1)  # let the feed announce it
        n = store.stats.requests
        assert store.get("a/1")["v"] == 1
        assert store.stats.requests == n, "a change to another document keeps a/1 cached"


def test_aggressive_duration_expires(server, store: DocumentStore) -> None:
    store.put("a/1", {"v": 1})
    with store.aggressive_caching(duration=0.2):
        store.get("a/1")
        n = store.stats.requests
        store.get("a/1")
        assert store.stats.requests == n
        time.sleep(0.3)
        store.get("a/1")
        assert store.stats.requests == n + 1, "older than the duration: revalidated"


def test_aggressive_falls_back_to_revalidation_when_feed_is_down(tmp_path) -> None:
    # A server that refuses every changes connection (429 too_many_connections):
    # the feed never comes up, so nothing may be served without asking.
    srv = KilnServer(data_dir=str(tmp_path / "data"), extra=["--max-changes-connections", "0"])
    try:
        with DocumentStore(srv.url, "fb") as st:
            st.create_database()
            st.put("users/ada", {"v": 1})
            before = srv.metrics()
            with st.aggressive_caching(duration=60, wait_connected=0.3):
                assert not st.aggressive_feed_connected
                for _ in range(10):
                    with st.session() as s:
                        assert s.load("users/ada")["v"] == 1
                        assert s.requests == 1
            after = srv.metrics()
            assert requests_to(after, status="304") - requests_to(before, status="304") == 9
            assert st.stats.aggressive_hits == 0

        # A feed that goes down mid-way: the server is killed and started again;
        # entries cached before are revalidated, not trusted.
        srv.kill()
        srv.extra = []
        srv.start()
        with DocumentStore(srv.url, "fb") as st:
            with st.aggressive_caching(duration=60):
                assert st.get("users/ada")["v"] == 1
                n = st.stats.requests
                st.get("users/ada")
                assert st.stats.requests == n
                srv.kill()
                deadline = time.monotonic() + 5
                while st.aggressive_feed_connected and time.monotonic() < deadline:
                    time.sleep(0.01)
                assert not st.aggressive_feed_connected
                srv.start()
                # The feed is down or just reconnected: the entry is revalidated (304).
                assert st.get("users/ada")["v"] == 1
                assert st.stats.requests == n + 1
                assert st.stats.not_modified >= 1
    finally:
        srv.stop()
