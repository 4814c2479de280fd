"""Full-text search: the builder's ``search()``, ``order_by_score()`` and
``highlight()`` (the text, no server), and queries against a real server's full-text
index (``"search": true`` fields), with the scores and highlights in
``QueryResult.scores`` / ``.highlights`` and not in the tracked documents.
"""

from __future__ import annotations

import pytest

from kiln_client import DocumentStore, Query
from kiln_client.errors import InvalidQueryError


def q(collection: str = "articles") -> Query:
    return Query(None, collection)


def test_search_text_order_and_highlight() -> None:
    text, params = (q().search("body", "lazy \"dog\" -cat").where_greater_than("year", 2000)
                    .order_by_score().take(10).highlight("body", "title").to_rql())
    assert text == ("from articles where search(body, $p0) and year > $p1 order by score() "
                    "limit 10 select highlight(body), highlight(title)")
    assert params == {"p0": "lazy \"dog\" -cat", "p1": 2000}
    text, _ = q().search("body", "x").order_by_score(ascending=True).select_fields("title") \
        .highlight("body").to_rql()
    assert text == ("from articles where search(body, $p0) order by score() asc "
                    "select title, highlight(body)")
    # The text is a parameter, never spliced.
    hostile = "x') or 1=1 --"
    text, params = q().search("body", hostile).to_rql()
    assert hostile not in text and params == {"p0": hostile}
    with pytest.raises(ValueError):
        q().search("body; drop", "x")
    with pytest.raises(ValueError):
        q().highlight("a b")
    with pytest.raises(ValueError):
        q().search("body", 3)  # type: ignore[arg-type]


ARTICLES = [
    ("Fox", "The quick brown fox jumps over the lazy dog", 2010),
    ("Dogs", "A lazy dog sleeps all day. The dog is lazy, so lazy.", 2015),
    ("Thinking", "Quick thinking by running foxes", 1999),
    ("Markup", "A page about <b>bold</b> and a dog", 2020),
    ("Cats", "Cats and mice", 2021),
]


@pytest.fixture()
def articles(store: DocumentStore) -> DocumentStore:
    r = store.request("PUT", f"{store.db_path}/indexes/articles-text", json_body={
        "collection": "articles",
        "fields": [{"path": "body", "search": True, "analyzer": "english"}]})
    assert r.status_code == 201, r.text
    with store.session() as s:
        for i, (title, body, year) in enumerate(ARTICLES, 1):
            s.store({"title": title, "body": body, "year": year,
                     "@metadata": {"@collection": "articles"}}, f"articles/{i}")
        s.save_changes()
    return store


def test_search_against_server(articles: DocumentStore) -> None:
    with articles.session() as s:
        res = (s.query("articles").search("body", "lazy dog").order_by_score()
               .highlight("body").wait_for_non_stale(5000).execute())
        assert res.stale is False and res.index == "articles-text"
        ids = [d["@metadata"]["@id"] for d in res]
        assert ids[0] == "articles/2" and sorted(ids) == ["articles/1", "articles/2",
                                                          "articles/4"]
        assert len(res.scores) == 3 and all(x is not None and x > 0 for x in res.scores)
        assert res.scores == sorted(res.scores, reverse=True)
        by_id = {d["@metadata"]["@id"]: h for d, _, h in res.hits()}
        assert "<b>lazy</b>" in by_id["articles/1"]["body"]
        assert "<b>dog</b>" in by_id["articles/1"]["body"]
        # The document's own markup comes back escaped.
        assert "&lt;b&gt;bold&lt;/b&gt;" in by_id["articles/4"]["body"]
        # The raw answer keeps them; the tracked documents do not.
        assert res.raw["results"][0]["@metadata"]["@score"] == res.scores[0]
        for d in res:
            assert "@score" not in d["@metadata"] and "@highlights" not in d["@metadata"]
        # A search result changed and saved does not store its score.
        res.results[0]["seen"] = True
        s.save_changes()
    stored = articles.get("articles/2")
    assert stored is not None and stored["seen"] is True
    assert "@score" not in stored["@metadata"] and "@highlights" not in stored["@metadata"]

    with articles.session() as s:
        # Stemming (english), another condition, and the score with any order.
        res = (s.query("articles").search("body", "jumping").wait_for_non_stale(5000)
               .execute())
        assert [d["@metadata"]["@id"] for d in res] == ["articles/1"]
        res = (s.query("articles").search("body", "dog").where_greater_than("year", 2012)
               .order_by_descending("year").wait_for_non_stale(5000).execute())
        assert [d["title"] for d in res] == ["Markup", "Dogs"]
        assert all(x is not None for x in res.scores) and res.highlights == [{}, {}]
        # Without search(): no scores.
        res = s.query("articles").where_equals("year", 2010).wait_for_non_stale(5000).execute()
        assert res.scores == [None] and res.highlights == [{}]


def test_bad_search_text_is_an_invalid_query(articles: DocumentStore) -> None:
    with articles.session() as s:
        with pytest.raises(InvalidQueryError) as e:
            s.query("articles").search("body", "\"unclosed").execute()
    assert e.value.status == 400 and e.value.code == "invalid_query"
