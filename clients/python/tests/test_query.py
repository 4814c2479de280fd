"""Queries: the generated text and parameters (unit tests, no server), and queries
against the server's `POST /dbs/{db}/queries`.

The server-backed tests run against the real server's query route; a server without
it fails them.
"""

from __future__ import annotations

import time

import pytest

from kiln_client import DocumentStore, Query
from kiln_client.query import check_field, quote_string

# --- the text (no server) --------------------------------------------------------------


def q(collection: str = "users") -> Query:
    return Query(None, collection)


def test_the_issue_example() -> None:
    text, params = q().where_greater_than("age", 30).order_by("name").take(20).to_rql()
    assert text == "from users where age > $p0 order by name limit 20"
    assert params == {"p0": 30}


def test_every_operator() -> None:
    text, params = (
        q().where_equals("a", 1).where_not_equals("b", "x").where_less_than("c", 2)
        .where_less_than_or_equal("d", 3).where_greater_than_or_equal("e", 4.5)
        .where_between("f", 1, 9).where_in("g", ("x", "y")).where_starts_with("name", "A")
        .where_exists("address.city").to_rql())
    assert text == ("from users where a = $p0 and b != $p1 and c < $p2 and d <= $p3 and "
                    "e >= $p4 and f between $p5 and $p6 and g in $p7 and name startsWith $p8 "
                    "and exists(address.city)")
    assert params == {"p0": 1, "p1": "x", "p2": 2, "p3": 3, "p4": 4.5, "p5": 1, "p6": 9,
                      "p7": ["x", "y"], "p8": "A"}


def test_or_not_and_subclauses() -> None:
    text, params = (
        q().where_equals("status", "active").or_else().open_subclause()
        .where_greater_than("age", 60).where_starts_with("name", "Z").close_subclause()
        .not_().where_equals("banned", True).to_rql())
    assert text == ("from users where status = $p0 or (age > $p1 and name startsWith $p2) "
                    "and not banned = $p3")
    assert params == {"p0": "active", "p1": 60, "p2": "Z", "p3": True}
    text, _ = q().not_().open_subclause().where_equals("a", 1).or_else() \
        .where_equals("b", 2).close_subclause().to_rql()
    assert text == "from users where not (a = $p0 or b = $p1)"


def test_order_paging_select_index() -> None:
    text, _ = (q().where_greater_than_or_equal("age", 18).order_by_descending("age")
               .order_by("name").take(20).skip(40).select_fields("name", "age").to_rql())
    assert text == ("from users where age >= $p0 order by age desc, name limit 20 offset 40 "
                    "select name, age")
    text, params = Query(None, index="users/by age").where_equals("tags[]", "x").to_rql()
    assert text == "from index 'users/by age' where tags[] = $p0"
    assert quote_string("it's") == "'it\\'s'"
    assert q().to_rql() == ("from users", {})


def test_values_are_never_spliced_and_names_are_checked() -> None:
    hostile = "x' or 1=1 --"
    text, params = q().where_equals("name", hostile).to_rql()
    assert hostile not in text and params["p0"] == hostile
    for bad in ["name; drop", "a b", "1abc", "a..b", "", "where", "a[]]", "a.$b"]:
        with pytest.raises(ValueError):
            check_field(bad)
    with pytest.raises(ValueError):
        Query(None, "users where 1")
    with pytest.raises(ValueError):
        q().take(-1)
    with pytest.raises(ValueError):
        q().open_subclause().where_equals("a", 1).to_rql()  # left open
    with pytest.raises(ValueError):
        q().or_else()


def test_raw_query_and_request_body() -> None:
    raw = Query(None, raw="from users where age >= $min", raw_params={"min": 30})
    assert raw.to_rql() == ("from users where age >= $min", {"min": 30})
    with pytest.raises(ValueError):
        raw.where_equals("a", 1)
    body = q().where_equals("a", 1).wait_for_non_stale(2500).request_body()
    assert body == {"query": "from users where a = $p0", "params": {"p0": 1},
                    "wait_for_non_stale_ms": 2500}
    assert "wait_for_non_stale_ms" not in q().request_body()


# --- against the server -----------------------------------------------------------------


@pytest.fixture()
def users(store: DocumentStore) -> DocumentStore:
    with store.session() as s:
        for i, (name, age) in enumerate([("Ada", 36), ("Bob", 25), ("Cy", 41), ("Di", 31),
                                         ("Ed", 52), ("Flo", 19)]):
            s.store({"name": name, "age": age, "@metadata": {"@collection": "users"}},
                    f"users/{i}")
        s.save_changes()
    return store


def test_query_against_server(users: DocumentStore) -> None:
    with users.session() as s:
        res = (s.query("users").where_greater_than("age", 30).order_by("name").take(20)
               .wait_for_non_stale(5000).execute())
        assert [d["name"] for d in res.results] == ["Ada", "Cy", "Di", "Ed"]
        assert res.total == 4 and res.stale is False
        # Results join the identity map.
        assert s.load("users/0") is res.results[0]
        page = s.query("users").order_by_descending("age").take(2).skip(1) \
            .wait_for_non_stale(5000).execute()
        assert [d["name"] for d in page] == ["Cy", "Ada"] and page.total == 6
        raw = s.raw_query("from users where age < $max", {"max": 26}).execute()
        assert sorted(d["name"] for d in raw) == ["Bob", "Flo"]
        assert s.query("users").where_starts_with("name", "D").count() == 1


def test_query_cache_revalidates(users: DocumentStore) -> None:
    for _ in range(3):
        with users.session() as s:
            s.query("users").where_equals("name", "Ada").wait_for_non_stale(5000).execute()
    assert users.stats.not_modified >= 1, "a repeated query is revalidated with a 304"
    with users.session() as s:
        ada = s.load("users/0")
        ada["age"] = 37
        s.save_changes()
    deadline = time.monotonic() + 5
    while True:
        with users.session() as s:
            r = s.query("users").where_equals("name", "Ada").wait_for_non_stale(5000).execute()
        if r.results and r.results[0]["age"] == 37:
            break
        assert time.monotonic() < deadline, "the changed document never showed in the query"


def test_group_by_text() -> None:
    text, params = (q("orders").where_equals("status", "paid").group_by("company")
                    .aggregate("n", "count").aggregate("total", "sum", "amount")
                    .order_by_descending("total").take(10).to_rql())
    assert text == ("from orders where status = $p0 group by company order by total desc "
                    "limit 10 select company, count() as n, sum(amount) as total")
    assert params == {"p0": "paid"}
    assert q("orders").group_by("company").to_rql()[0] == "from orders group by company"
    with pytest.raises(ValueError):
        q("orders").aggregate("n", "count").to_rql()
    with pytest.raises(ValueError):
        q("orders").group_by("company").aggregate("x", "median", "amount")
    with pytest.raises(ValueError):
        q("orders").group_by("company").aggregate("x", "sum")


def test_group_by_against_server(store: DocumentStore) -> None:
    with store.session() as s:
        for i in range(12):
            s.store({"company": ["acme", "globex", "initech"][i % 3], "amount": i,
                     "@metadata": {"@collection": "orders"}}, f"orders/{i}")
        s.save_changes()
    store.request("PUT", f"{store.db_path}/indexes/orders-by-company", json_body={
        "collection": "orders", "group_by": ["company"],
        "aggregate": {"n": "count()", "total": "sum(amount)"}})
    with store.session() as s:
        res = (s.query("orders").group_by("company").aggregate("n", "count")
               .aggregate("total", "sum", "amount").wait_for_non_stale(5000).execute())
    assert res.index == "orders-by-company" and res.total == 3
    assert res.results[0] == {"company": "acme", "n": 4, "total": 18}
