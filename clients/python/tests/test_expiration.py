"""Documents that expire: ``put(..., expires=...)`` writes ``@metadata.@expires`` as
RFC 3339 in UTC, and a server checking every 100 ms deletes the document once that
time has passed, while one without it stays."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta, timezone

from conftest import KilnServer
from kiln_client import AsyncDocumentStore, DocumentStore
from kiln_client.store import with_expiry


def test_with_expiry_writes_utc_rfc3339_and_keeps_the_document() -> None:
    doc = {"n": 1, "@metadata": {"@collection": "c", "tag": "x"}}
    at = datetime(2030, 1, 1, 14, 0, 0, 123456, tzinfo=timezone(timedelta(hours=2)))
    out = with_expiry(doc, at)
    assert out["@metadata"] == {"@collection": "c", "tag": "x",
                                "@expires": "2030-01-01T12:00:00.123Z"}
    assert "@expires" not in doc["@metadata"], "the caller's document is not changed"
    assert with_expiry(doc, None) is doc
    assert with_expiry({"n": 1}, at)["@metadata"] == {"@expires": "2030-01-01T12:00:00.123Z"}


def _gone(store: DocumentStore, doc_id: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        store.invalidate(doc_id)
        if store.get(doc_id) is None:
            return True
        time.sleep(0.05)
    return False


def test_an_expired_document_is_deleted(tmp_path) -> None:
    srv = KilnServer(data_dir=str(tmp_path / "d"), extra=["--expiration-check-ms", "100"])
    try:
        st = DocumentStore(srv.url, "exp")
        st.create_database()
        soon = datetime.now(timezone.utc) + timedelta(seconds=1)
        st.put("temp/1", {"n": 1}, expires=soon)
        st.put("keep/1", {"n": 1})
        stored = st.get("temp/1")
        assert stored is not None
        assert stored["@metadata"]["@expires"] == with_expiry({}, soon)["@metadata"]["@expires"]
        assert _gone(st, "temp/1", timeout=10)
        assert datetime.now(timezone.utc) >= soon, "deleted before its time"
        assert st.get("keep/1") is not None
        st.close()
    finally:
        srv.stop()


def test_the_async_store_sets_it_too(store: DocumentStore) -> None:
    async def main() -> None:
        at = datetime(2030, 1, 1, tzinfo=timezone.utc)
        async with AsyncDocumentStore(store.url, store.database) as st:
            await st.put("later/1", {"n": 1}, expires=at)
            doc = await st.get("later/1")
        assert doc is not None and doc["@metadata"]["@expires"] == "2030-01-01T00:00:00.000Z"

    asyncio.run(main())
