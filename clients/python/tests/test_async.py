"""The asyncio flavour against a real server: concurrent load_many, identity map,
one batch with If-Match, conflicts, 304 revalidation."""

from __future__ import annotations

import asyncio

import pytest

from conftest import requests_to
from kiln_client import AsyncDocumentStore, ConcurrencyError, DocumentStore


def test_async_session(server, store: DocumentStore) -> None:
    async def main() -> None:
        async with AsyncDocumentStore(server.url, store.database) as st:
            async with st.session() as s:
                for i in range(10):
                    s.store({"i": i}, f"a/{i}")
                await s.save_changes()
                assert s.requests == 1
            before = server.metrics()
            async with st.session() as s:
                docs = await s.load_many([f"a/{i}" for i in range(10)] + ["a/none"])
                assert [docs[f"a/{i}"]["i"] for i in range(10)] == list(range(10))
                assert docs["a/none"] is None
                assert await s.load("a/3") is docs["a/3"]
                docs["a/3"]["i"] = 33
                await s.save_changes()
            async with st.session() as s:
                again = await s.load_many([f"a/{i}" for i in range(10)])
                assert again["a/3"]["i"] == 33
            after = server.metrics()
            # The second pass revalidated the 9 unchanged documents (304).
            assert requests_to(after, status="304") - requests_to(before, status="304") == 9
            async with st.session() as s:
                d = await s.load("a/1")
                d["i"] = -1
                await st.put("a/1", {"i": 100})
                with pytest.raises(ConcurrencyError) as info:
                    await s.save_changes()
                assert info.value.id == "a/1" and info.value.current_etag

    asyncio.run(main())
