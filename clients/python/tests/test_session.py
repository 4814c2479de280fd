"""Sessions against a real server: identity map, one batch, optimistic concurrency,
request budget, dataclasses, generated ids."""

from __future__ import annotations

import dataclasses
from typing import List, Optional

import httpx
import pytest

from conftest import metric, requests_to
from kiln_client import ConcurrencyError, DocumentStore, RequestBudgetExceededError


@dataclasses.dataclass
class User:
    name: str
    age: int
    tags: List[str] = dataclasses.field(default_factory=list)
    id: Optional[str] = None


def test_store_load_identity_map(store: DocumentStore) -> None:
    with store.session() as s:
        s.store({"name": "Ada", "age": 36}, "users/ada")
        s.store({"name": "Bob", "age": 25}, "users/bob")
        s.save_changes()
    with store.session() as s:
        a1 = s.load("users/ada")
        a2 = s.load("users/ada")
        assert a1 is a2, "the identity map returns the same object"
        assert s.requests == 1, "the second load is answered by the identity map"
        assert a1["name"] == "Ada"
        assert a1["@metadata"]["@id"] == "users/ada"
        assert s.load("users/nobody") is None
        assert s.load("users/nobody") is None
        assert s.requests == 2
        many = s.load_many(["users/ada", "users/bob", "users/zed"])
        assert many["users/ada"] is a1 and many["users/bob"]["age"] == 25
        assert many["users/zed"] is None


def test_save_changes_is_one_batch(server, store: DocumentStore) -> None:
    with store.session() as s:
        for i in range(5):
            s.store({"n": i}, f"items/{i}")
        s.save_changes()
    before = server.metrics()
    with store.session() as s:
        docs = [s.load(f"items/{i}") for i in range(5)]
        for d in docs[:3]:
            d["n"] += 100
        s.delete("items/4")
        s.store({"n": 99}, "items/new")
        loaded_requests = s.requests
        s.save_changes()
        assert s.requests == loaded_requests + 1
        assert not s.has_changes()
        s.save_changes()  # nothing to send: no request
        assert s.requests == loaded_requests + 1
    after = server.metrics()
    batch = "/dbs/{db}/batch"
    assert requests_to(after, batch, "POST") - requests_to(before, batch, "POST") == 1
    assert requests_to(after, method="PUT") == requests_to(before, method="PUT")
    with store.session() as s:
        assert [s.load(f"items/{i}")["n"] for i in range(4)] == [100, 101, 102, 3]
        assert s.load("items/4") is None
        assert s.load("items/new")["n"] == 99


def test_unchanged_documents_are_not_written(server, store: DocumentStore) -> None:
    store.put("a/1", {"x": 1})
    with store.session() as s:
        s.load("a/1")
        assert not s.has_changes()
        s.save_changes()
        assert s.requests == 1


def test_conflict_names_document_and_both_etags(store: DocumentStore) -> None:
    store.put("users/ada", {"name": "Ada", "age": 36})
    store.put("users/bob", {"name": "Bob", "age": 25})
    with store.session() as s:
        ada = s.load("users/ada")
        bob = s.load("users/bob")
        loaded_etag = s.etag_of(bob)
        ada["age"] = 37
        bob["age"] = 26
        # Someone else changes Bob meanwhile (a plain HTTP client, not this store).
        r = httpx.put(f"{store.url}{store.doc_path('users/bob')}",
                      json={"name": "Bob", "age": 99})
        assert r.status_code == 200
        theirs = r.headers["etag"].strip('"')
        with pytest.raises(ConcurrencyError) as info:
            s.save_changes()
    e = info.value
    assert e.id == "users/bob"
    assert e.expected_etag == loaded_etag
    assert e.current_etag == theirs
    assert e.status == 409 and e.code == "conflict"
    text = str(e)
    assert "users/bob" in text and loaded_etag in text and theirs in text
    # All or nothing: Ada's change was not written either.
    with store.session() as s:
        assert s.load("users/ada")["age"] == 36
        assert s.load("users/bob")["age"] == 99


def test_conflict_on_delete(store: DocumentStore) -> None:
    store.put("x/1", {"v": 1})
    with store.session() as s:
        s.load("x/1")
        store.put("x/1", {"v": 2})
        s.delete("x/1")
        with pytest.raises(ConcurrencyError) as info:
            s.save_changes()
        assert info.value.id == "x/1" and info.value.current_etag


def test_request_budget(store: DocumentStore) -> None:
    with store.session(max_requests=10) as s:
        for i in range(10):
            s.load(f"missing/{i}")
        with pytest.raises(RequestBudgetExceededError) as info:
            s.load("missing/10")
        assert "budget" in str(info.value) and "10" in str(info.value)
    # The default budget is RavenDB's 30.
    with store.session() as s:
        assert s.max_requests == 30
        with pytest.raises(RequestBudgetExceededError):
            for i in range(31):
                s.load(f"other/{i}")
        assert s.requests == 30


def test_dataclasses_and_generated_ids(store: DocumentStore) -> None:
    with store.session() as s:
        u = User("Cy", 41, ["x"])
        s.store(u)
        s.save_changes()
        assert u.id is not None and u.id.startswith("users/")
        assert s.id_of(u) == u.id
        assert s.load(u.id) is u
    with store.session() as s:
        loaded = s.load(u.id, User)
        assert isinstance(loaded, User)
        assert (loaded.name, loaded.age, loaded.tags, loaded.id) == ("Cy", 41, ["x"], u.id)
        loaded.tags.append("y")
        s.save_changes()
    raw = store.get(u.id)
    assert raw is not None
    assert raw["tags"] == ["x", "y"] and raw["@metadata"]["@collection"] == "users"
    # A dict with @metadata.@collection gets a generated id too.
    with store.session() as s:
        d = {"sku": "A1", "@metadata": {"@collection": "products"}}
        s.store(d)
        s.save_changes()
        assert d["@metadata"]["@id"].startswith("products/")


def test_store_then_load_in_same_session_and_delete_new(store: DocumentStore) -> None:
    with store.session() as s:
        doc = {"v": 1}
        s.store(doc, "k/1")
        assert s.load("k/1") is doc
        s.store({"v": 2}, "k/2")
        s.delete("k/2")
        s.save_changes()
        assert s.requests == 1
    assert store.get("k/1") == {**store.get("k/1"), "v": 1}
    assert store.get("k/2") is None


def test_batch_is_all_or_nothing_on_bad_document(store: DocumentStore) -> None:
    from kiln_client import InvalidIdError

    with store.session() as s:
        s.store({"v": 1}, "good/1")
        s.store({"v": 2}, "bad\u0001id")
        with pytest.raises(InvalidIdError):
            s.save_changes()
    assert store.get("good/1") is None


def test_metrics_parser_sanity(server) -> None:
    text = server.metrics()
    assert metric(text, "kiln_uptime_seconds") > 0
