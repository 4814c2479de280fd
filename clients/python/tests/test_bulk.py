"""Bulk insert against a real server: 100,000 documents, acks as they stream, a bad
line, an unknown database."""

from __future__ import annotations

import dataclasses
import time

import pytest

from conftest import metric
from kiln_client import BulkInsertError, DatabaseNotFoundError, DocumentStore


@dataclasses.dataclass
class Order:
    customer: str
    total: float


def test_bulk_insert_100k(server, store: DocumentStore) -> None:
    acks = []
    t0 = time.perf_counter()
    with store.bulk_insert(on_ack=lambda n, e: acks.append(n)) as bulk:
        for i in range(100_000):
            bulk.store({"n": i, "name": f"user {i}", "tag": f"t{i % 100}"}, f"users/{i}")
        # Acks arrive while the upload goes on, not only at the end.
        acked_while_uploading = bulk.acked
    dt = time.perf_counter() - t0
    print(f"bulk insert: 100,000 documents in {dt:.2f} s ({100_000 / dt:,.0f} docs/s), "
          f"{len(acks)} acks, {acked_while_uploading} acked before the last line was sent")
    assert bulk.done and bulk.acked == 100_000
    assert bulk.last_etag is not None
    assert acks and acks == sorted(acks) and acks[-1] == 100_000
    assert len(acks) > 1, "the server acked batch by batch"
    stats = store.database_stats()
    assert stats["documents"] == 100_000
    assert stats["last_etag"] == bulk.last_etag
    assert store.get("users/99999")["n"] == 99_999
    assert metric(server.metrics(), "kiln_bulk_documents_total") >= 100_000


def test_bulk_generated_ids_and_dataclasses(store: DocumentStore) -> None:
    with store.bulk_insert() as bulk:
        for i in range(10):
            bulk.store(Order(f"c{i}", i * 1.5))
        bulk.store({"x": 1}, "misc/")
    assert bulk.acked == 11
    cols = {c["name"]: c["documents"] for c in store.database_stats()["collections"]}
    assert cols["orders"] == 10 and cols["misc"] == 1


def test_bulk_bad_line_names_it_and_keeps_lines_before(store: DocumentStore) -> None:
    with pytest.raises(BulkInsertError) as info:
        with store.bulk_insert() as bulk:
            for i in range(1000):
                bulk.store({"n": i}, f"ok/{i}")
            bulk.store({"n": -1}, "bad\u0001id")
            for i in range(1000, 1100):
                try:
                    bulk.store({"n": i}, f"ok/{i}")
                except BulkInsertError:
                    break
    e = info.value
    assert e.line == 1001 and e.code == "invalid_id"
    assert e.acked == 1000
    assert "line 1001" in str(e)
    assert store.database_stats()["documents"] == 1000
    assert store.get("ok/999") is not None and store.get("ok/1000") is None


def test_bulk_unknown_database(server) -> None:
    with DocumentStore(server.url, "no_such_db_here") as st:
        with pytest.raises(DatabaseNotFoundError):
            with st.bulk_insert() as bulk:
                bulk.store({"a": 1}, "a/1")


def test_bulk_client_memory_is_bounded(store: DocumentStore) -> None:
    import tracemalloc

    tracemalloc.start()
    try:
        with store.bulk_insert(max_pending_bytes=1 << 20) as bulk:
            base = tracemalloc.get_traced_memory()[0]
            for i in range(30_000):
                bulk.store({"i": i, "pad": "p" * 300}, f"m/{i}")
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    total = 30_000 * 330
    print(f"bulk insert: {total / 1e6:.1f} MB sent, client peak {peak / 1e6:.1f} MB")
    assert bulk.acked == 30_000
    assert peak < 4 << 20, "the client holds about max_pending_bytes, not the whole upload"
