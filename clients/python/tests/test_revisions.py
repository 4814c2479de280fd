"""Document revisions through the store: the configuration, a document's previous
versions newest first, a revert to one, and their purge."""

from __future__ import annotations

import pytest

import kiln_client.errors as E
from kiln_client import DocumentStore


def test_revisions_revert_and_purge(store: DocumentStore) -> None:
    assert store.revisions_config() == {"collections": {}}
    config = {"collections": {"orders": {"max_revisions": 3, "max_age_ms": None}}}
    assert store.set_revisions_config(config) == config
    assert store.revisions_config() == config
    etags = [store.put("orders/1", {"v": v}) for v in range(1, 6)]
    revs = store.revisions("orders/1")
    assert [r["etag"] for r in revs] == [etags[3], etags[2], etags[1]]
    assert [r["document"]["v"] for r in revs] == [4, 3, 2]
    assert all(r["deleted"] is False and r["key_id"] is None for r in revs)
    assert [r["etag"] for r in store.revisions("orders/1", limit=2)] == etags[3:1:-1]
    assert store.revisions("orders/never") == []

    # Back to version 2, only if the document is still at version 5.
    with pytest.raises(E.ConcurrencyError):
        store.revert("orders/1", etags[1], if_match=etags[0])
    new = store.revert("orders/1", etags[1], if_match=etags[4])
    doc = store.get("orders/1")
    assert doc is not None and doc["v"] == 2 and doc["@metadata"]["@etag"] == new
    assert store.revisions("orders/1")[0]["etag"] == etags[4]
    with pytest.raises(E.RevisionNotFoundError):
        store.revert("orders/1", etags[0])

    store.delete("orders/1")
    deleted = store.revisions("orders/1")[0]
    assert deleted["deleted"] is True and deleted["document"]["v"] == 2
    assert store.purge_revisions("orders/1") == 3
    assert store.revisions("orders/1") == []

    with pytest.raises(E.InvalidRevisionsConfigError):
        store.set_revisions_config({"collections": {"orders": {"max_revisions": 0}}})
