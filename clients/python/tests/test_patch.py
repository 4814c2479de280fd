"""DocumentStore.patch: a JSON merge patch (RFC 7396) applied by the server in one
transaction, If-Match, and the errors of a missing document or a bad patch."""

from __future__ import annotations

import threading

import pytest

import kiln_client.errors as E
from kiln_client import DocumentStore


def test_patch_merges_and_checks_if_match(store: DocumentStore) -> None:
    first = store.put("users/1", {"name": "Ada", "address": {"city": "London", "zip": "N1"}})
    etag = store.patch("users/1", {"address": {"zip": None}, "age": 36}, if_match=first)
    doc = store.get("users/1")
    assert doc is not None
    assert doc["address"] == {"city": "London"} and doc["age"] == 36 and doc["name"] == "Ada"
    assert doc["@metadata"]["@etag"] == etag != first
    with pytest.raises(E.ConcurrencyError):
        store.patch("users/1", {"age": 1}, if_match=first)
    with pytest.raises(E.DocumentNotFoundError):
        store.patch("users/none", {"a": 1})
    with pytest.raises(E.InvalidDocumentError):
        store.patch("users/1", {"@metadata": {"@etag": "1-00000000"}})
    doc = store.get("users/1")
    assert doc is not None and doc["age"] == 36


def test_concurrent_patches_lose_nothing(store: DocumentStore) -> None:
    store.put("hot", {})

    def patcher(t: int) -> None:
        for i in range(10):
            store.patch("hot", {f"t{t}_{i}": i})

    threads = [threading.Thread(target=patcher, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    doc = store.get("hot")
    assert doc is not None and len(doc) - 1 == 40
