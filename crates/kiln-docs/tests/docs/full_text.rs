//! Full-text indexes (tantivy): the answers equal tantivy's own on the same
//! documents (top 10 and BM25 scores); `search()` combined with other conditions
//! and orders equals a brute-force model over random documents, updates and
//! deletes; updates and deletes are visible after `wait_for_non_stale_ms`; offset
//! pages fit together; a reopened database resumes, a lost index directory is
//! rebuilt; bad definitions and queries get clear errors.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use kiln_docs::{
    Condition, DocError, DocStore, DocsOptions, IndexDefinition, IndexField, QueryOptions,
};
use kiln_docs::{IndexError, QueryError};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, BTreeSet};

const WORDS: &[&str] = &[
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "jumped",
    "jumping",
    "over",
    "lazy",
    "dog",
    "dogs",
    "running",
    "runs",
    "runner",
    "river",
    "stone",
    "bridge",
    "garden",
    "light",
    "lights",
    "house",
    "houses",
    "winter",
    "summer",
    "of",
    "and",
    "a",
    "to",
    "in",
    "is",
    "paper",
    "engine",
    "journal",
    "commit",
    "durable",
    "crash",
    "power",
    "disk",
    "page",
    "tree",
    "trees",
    "index",
    "indexes",
    "search",
    "searching",
    "query",
    "queries",
    "text",
];

fn options() -> DocsOptions {
    let mut o = DocsOptions::default();
    o.storage.journal_file_size_bytes = 1 << 20;
    o.storage.data_grow_step_bytes = 1 << 20;
    o.storage.write_buffer_bytes = 64 << 10;
    o.indexing.min_batch = 8;
    o.indexing.max_batch = 64;
    o
}

fn search_def(name: &str, collection: &str, fields: &[(&str, &str)]) -> IndexDefinition {
    IndexDefinition {
        name: name.into(),
        collection: Some(collection.into()),
        fields: fields
            .iter()
            .map(|(path, analyzer)| IndexField {
                path: path.to_string(),
                search: true,
                analyzer: Some(analyzer.to_string()),
                ..Default::default()
            })
            .collect(),
        auto: false,
        reduce: None,
    }
}

fn wait() -> QueryOptions {
    QueryOptions {
        wait_for_non_stale_ms: 10_000,
    }
}

fn sentence(rng: &mut StdRng, len: usize) -> String {
    (0..len)
        .map(|_| {
            // Skewed: early words are common, late ones rare (so IDF matters).
            let i = (rng.gen::<f64>().powi(2) * WORDS.len() as f64) as usize;
            let w = WORDS[i.min(WORDS.len() - 1)];
            if rng.gen_bool(0.1) {
                w.to_uppercase()
            } else {
                w.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn query(db: &kiln_docs::Database, q: &str) -> kiln_docs::QueryResult {
    db.query(q, &Map::new(), wait())
        .unwrap_or_else(|e| panic!("{q}: {e}"))
}

fn results(r: &kiln_docs::QueryResult) -> Vec<Value> {
    r.results
        .iter()
        .map(|b| serde_json::from_slice(b).unwrap())
        .collect()
}

fn ids_and_scores(r: &kiln_docs::QueryResult) -> Vec<(String, f64)> {
    results(r)
        .iter()
        .map(|v| {
            (
                v["@metadata"]["@id"].as_str().unwrap().to_string(),
                v["@metadata"]["@score"].as_f64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn answers_equal_tantivy_used_directly() {
    use tantivy::collector::TopDocs;
    use tantivy::query::QueryParser;
    use tantivy::schema::{
        IndexRecordOption, Schema, TextFieldIndexing, TextOptions, Value as _, STORED, STRING,
    };

    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.create_database("t").unwrap();
    db.define_index(search_def(
        "articles_text",
        "articles",
        &[("body", "english")],
    ))
    .unwrap();
    let mut rng = StdRng::seed_from_u64(7);
    let mut docs = Vec::new();
    for i in 0..400 {
        let len = rng.gen_range(3..40);
        let body = sentence(&mut rng, len);
        let id = format!("articles/{i}");
        db.put(
            &id,
            json!({"body": body, "@metadata": {"@collection": "articles"}})
                .to_string()
                .as_bytes(),
            Condition::None,
        )
        .unwrap();
        docs.push((id, body));
    }

    // The same documents in a tantivy index of our own, with the same analyzer.
    let mut sb = Schema::builder();
    let id_f = sb.add_text_field("id", STRING | STORED);
    let body_f = sb.add_text_field(
        "body",
        TextOptions::default().set_indexing_options(
            TextFieldIndexing::default()
                .set_tokenizer("english")
                .set_index_option(IndexRecordOption::WithFreqsAndPositions),
        ),
    );
    let index = tantivy::Index::create_in_ram(sb.build());
    index.tokenizers().register(
        "english",
        kiln_docs::search::analyzer::build("english").unwrap(),
    );
    let mut w: tantivy::IndexWriter = index.writer_with_num_threads(1, 15_000_000).unwrap();
    for (id, body) in &docs {
        let mut d = tantivy::TantivyDocument::new();
        d.add_text(id_f, id);
        d.add_text(body_f, body);
        w.add_document(d).unwrap();
    }
    w.commit().unwrap();
    let searcher = index.reader().unwrap().searcher();
    let parser = QueryParser::for_index(&index, vec![body_f]);

    for text in [
        "fox",
        "quick fox",
        "\"lazy dog\"",
        "running trees",
        "+durable crash",
        "journal -commit",
        "searching^2 index",
    ] {
        let ours = query(
            &db,
            &format!(
                "from articles where search(body, '{}') limit 10",
                text.replace('\'', "\\'")
            ),
        );
        assert!(!ours.stale);
        let theirs: Vec<(String, f64)> = searcher
            .search(
                &parser.parse_query(text).unwrap(),
                &TopDocs::with_limit(10).order_by_score(),
            )
            .unwrap()
            .into_iter()
            .map(|(score, addr)| {
                let d: tantivy::TantivyDocument = searcher.doc(addr).unwrap();
                (
                    d.get_first(id_f).unwrap().as_str().unwrap().to_string(),
                    f64::from(score),
                )
            })
            .collect();
        let got = ids_and_scores(&ours);
        assert!(!theirs.is_empty(), "{text}: the corpus has matches");
        assert_eq!(got.len(), theirs.len(), "{text}");
        for (i, ((a, sa), (b, sb))) in got.iter().zip(&theirs).enumerate() {
            assert!((sa - sb).abs() < 1e-4, "{text} #{i}: score {sa} vs {sb}");
            // Equal scores may come in either order; distinct ones must agree.
            if i + 1 < got.len()
                && (sa - got[i + 1].1).abs() > 1e-6
                && (i == 0 || (sa - got[i - 1].1).abs() > 1e-6)
            {
                assert_eq!(a, b, "{text} #{i}");
            }
        }
        let total = searcher
            .search(
                &parser.parse_query(text).unwrap(),
                &tantivy::collector::Count,
            )
            .unwrap();
        assert_eq!(ours.total, total as u64, "{text}: total");
    }
    // Prefixes: every document with a word starting so, constant score.
    let r = query(&db, "from articles where search(body, 'jump*') limit 1000");
    let want = docs
        .iter()
        .filter(|(_, b)| b.to_lowercase().split(' ').any(|w| w.starts_with("jump")))
        .count();
    assert_eq!(r.total as usize, want);
    assert_eq!(r.results.len(), want);
    drop(db);
    store.close().unwrap();
}

/// The model: which documents a `search()` matches, from the words themselves
/// (`standard` analyzer: lowercased words).
fn model_matches(body: &str, text: &str) -> bool {
    let words: BTreeSet<String> = body.split(' ').map(str::to_lowercase).collect();
    let mut should = Vec::new();
    for clause in text.split(' ') {
        if let Some(w) = clause.strip_prefix('+') {
            if !words.contains(w) {
                return false;
            }
        } else if let Some(w) = clause.strip_prefix('-') {
            if words.contains(w) {
                return false;
            }
        } else {
            should.push(clause);
        }
    }
    let has_required = text.split(' ').any(|c| c.starts_with('+'));
    let only_excluded = text.split(' ').all(|c| c.starts_with('-'));
    has_required || only_excluded || should.iter().any(|w| words.contains(*w))
}

#[test]
fn search_with_other_conditions_equals_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.create_database("m").unwrap();
    db.define_index(search_def(
        "notes_text",
        "notes",
        &[("body", "standard"), ("title", "standard")],
    ))
    .unwrap();
    let mut rng = StdRng::seed_from_u64(11);
    let mut model: BTreeMap<String, (String, i64)> = BTreeMap::new();
    for round in 0..3 {
        for _ in 0..150 {
            let id = format!("notes/{}", rng.gen_range(0..200));
            if rng.gen_bool(0.15) {
                if model.remove(&id).is_some() {
                    db.delete(&id, Condition::None).unwrap();
                }
                continue;
            }
            let len = rng.gen_range(1..12);
            let body = sentence(&mut rng, len);
            let n = rng.gen_range(0..50);
            db.put(
                &id,
                json!({"body": body, "title": "t", "n": n, "@metadata": {"@collection": "notes"}})
                    .to_string()
                    .as_bytes(),
                Condition::None,
            )
            .unwrap();
            model.insert(id, (body, n));
        }
        // Another collection's documents never match.
        db.put(
            &format!("other/{round}"),
            json!({"body": "fox dog river", "@metadata": {"@collection": "other"}})
                .to_string()
                .as_bytes(),
            Condition::None,
        )
        .unwrap();
        for text in [
            "fox",
            "fox dog",
            "+river stone",
            "-the",
            "tree -trees",
            "+light +house",
        ] {
            // `{s}` is the search; `keep` the model of the where, given whether the
            // body matches the search, the body and n.
            type Keep = fn(bool, &str, i64) -> bool;
            for (cond, keep) in [
                ("{s}", (|m, _, _| m) as Keep),
                ("{s} and n >= 25", |m, _, n| m && n >= 25),
                ("{s} and (n < 5 or n = 40)", |m, _, n| {
                    m && (n < 5 || n == 40)
                }),
                // Under or / not: the matches' union, or the collection scanned.
                ("{s} or search(body, 'stone')", |m, b, _| {
                    m || model_matches(b, "stone")
                }),
                ("({s} or n = 7) and n < 30", |m, _, n| {
                    (m || n == 7) && n < 30
                }),
                ("not {s} and n < 10", |m, _, n| !m && n < 10),
                ("n >= 45 or not ({s} or search(body, 'fox'))", |m, b, n| {
                    n >= 45 || !(m || model_matches(b, "fox"))
                }),
            ] {
                let cond = cond.replace("{s}", &format!("search(body, '{text}')"));
                let mut want: Vec<(i64, String)> = model
                    .iter()
                    .filter(|(_, (b, n))| keep(model_matches(b, text), b, *n))
                    .map(|(id, (_, n))| (*n, id.clone()))
                    .collect();
                // order by n, then id: exact order; paged by 7.
                want.sort();
                let mut got = Vec::new();
                let mut offset = 0;
                loop {
                    let r = query(
                        &db,
                        &format!("from notes where {cond} order by n limit 7 offset {offset}"),
                    );
                    assert_eq!(r.total as usize, want.len(), "round {round}: {cond}");
                    let page: Vec<(i64, String)> = results(&r)
                        .iter()
                        .map(|v| {
                            (
                                v["n"].as_i64().unwrap(),
                                v["@metadata"]["@id"].as_str().unwrap().to_string(),
                            )
                        })
                        .collect();
                    let done = page.len() < 7;
                    got.extend(page);
                    offset += 7;
                    if done {
                        break;
                    }
                }
                assert_eq!(got, want, "round {round}: {cond}");
                // By score: the same set, each once, across offset pages.
                let mut seen = BTreeSet::new();
                let mut offset = 0;
                let mut last_score = f64::INFINITY;
                loop {
                    let r = query(
                        &db,
                        &format!("from notes where {cond} limit 5 offset {offset}"),
                    );
                    for (id, score) in ids_and_scores(&r) {
                        assert!(score <= last_score + 1e-6, "{cond}: scores descend");
                        last_score = score;
                        assert!(seen.insert(id), "{cond}: a match twice");
                    }
                    if r.results.len() < 5 {
                        break;
                    }
                    offset += 5;
                }
                // Grouped: the matches' groups (n < 10 keeps it to a few).
                let mut groups: BTreeMap<i64, u64> = BTreeMap::new();
                for (n, _) in want.iter().filter(|(n, _)| *n < 10) {
                    *groups.entry(*n).or_default() += 1;
                }
                let r = query(
                    &db,
                    &format!(
                        "from notes where ({cond}) and n < 10 group by n order by n \
                         select n, count() as c limit 100"
                    ),
                );
                let got: BTreeMap<i64, u64> = results(&r)
                    .iter()
                    .map(|v| (v["n"].as_i64().unwrap(), v["c"].as_u64().unwrap()))
                    .collect();
                assert_eq!(got, groups, "round {round}: {cond} group by n");
                let want_ids: BTreeSet<String> = want.into_iter().map(|(_, id)| id).collect();
                assert_eq!(seen, want_ids, "round {round}: {cond} by score");
            }
        }
    }
    drop(db);
    store.close().unwrap();
}

#[test]
fn updates_deletes_restarts_and_a_lost_index() {
    let dir = tempfile::tempdir().unwrap();
    let count = |db: &kiln_docs::Database, text: &str| {
        query(db, &format!("from posts where search(body, '{text}')")).total
    };
    {
        let store = DocStore::open(dir.path(), options()).unwrap();
        let db = store.create_database("u").unwrap();
        for i in 0..30 {
            db.put(
                &format!("posts/{i}"),
                json!({"body": format!("winter garden {i}"), "tags": ["stone", {"deep": "bridge"}], "@metadata": {"@collection": "posts"}})
                    .to_string()
                    .as_bytes(),
                Condition::None,
            )
            .unwrap();
        }
        // Defined after the documents: built from the change log.
        db.define_index(search_def(
            "posts_text",
            "posts",
            &[("body", "english"), ("tags", "standard")],
        ))
        .unwrap();
        assert_eq!(count(&db, "winter"), 30);
        // Arrays and objects under a field: all their text.
        let r = query(&db, "from posts where search(tags, 'bridge')");
        assert_eq!(r.total, 30);
        db.put(
            "posts/3",
            json!({"body": "summer light", "@metadata": {"@collection": "posts"}})
                .to_string()
                .as_bytes(),
            Condition::None,
        )
        .unwrap();
        db.delete("posts/4", Condition::None).unwrap();
        assert_eq!(count(&db, "winter"), 28);
        assert_eq!(count(&db, "summer"), 1);
        // Highlights and scores.
        let r = query(
            &db,
            "from posts where search(body, 'summer') select highlight(body), body",
        );
        let v = &results(&r)[0];
        assert_eq!(v["@metadata"]["@highlights"]["body"], "<b>summer</b> light");
        assert!(v["@metadata"]["@score"].as_f64().unwrap() > 0.0);
        assert_eq!(v["body"], "summer light");
        assert!(v.get("tags").is_none());
        let info = db.index_info("posts_text").unwrap();
        assert!(!info.stale);
        drop(db);
        store.close().unwrap();
    }
    {
        // Reopened: resumes from its last commit; writes while closed... none,
        // so nothing to redo, and it answers at once.
        let store = DocStore::open(dir.path(), options()).unwrap();
        let db = store.database("u").unwrap();
        let r = db
            .query(
                "from posts where search(body, 'winter')",
                &Map::new(),
                QueryOptions::default(),
            )
            .unwrap();
        assert_eq!(r.total, 28);
        assert!(!r.stale);
        drop(db);
        store.close().unwrap();
    }
    // The index's files lost: rebuilt from the change log on open.
    let search_dir = dir.path().join("databases").join("u").join("search");
    assert!(search_dir.exists(), "{}", search_dir.display());
    std::fs::remove_dir_all(&search_dir).unwrap();
    {
        let store = DocStore::open(dir.path(), options()).unwrap();
        let db = store.database("u").unwrap();
        assert_eq!(count(&db, "winter"), 28);
        assert_eq!(count(&db, "summer"), 1);
        // Reset gives a new index (and removes the old files).
        db.reset_index("posts_text").unwrap();
        assert_eq!(count(&db, "winter"), 28);
        assert_eq!(std::fs::read_dir(&search_dir).unwrap().count(), 1);
        db.delete_index("posts_text").unwrap();
        assert_eq!(std::fs::read_dir(&search_dir).unwrap().count(), 0);
        drop(db);
        store.close().unwrap();
    }
}

#[test]
fn bad_definitions_and_queries_get_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.create_database("e").unwrap();
    let mut mixed = search_def("mixed", "posts", &[("body", "standard")]);
    mixed.fields.push(IndexField {
        path: "n".into(),
        ..Default::default()
    });
    let bad = |d: IndexDefinition| match db.define_index(d) {
        Err(DocError::Index(IndexError::Invalid(m))) => m,
        other => panic!("{other:?}"),
    };
    assert!(bad(mixed).contains("all full-text"));
    assert!(bad(search_def("x", "posts", &[("body", "klingon")])).contains("klingon"));
    let mut reduce = search_def("r", "posts", &[]);
    reduce.reduce = Some(kiln_docs::ReduceSpec {
        group_by: search_def("g", "posts", &[("body", "english")]).fields,
        aggregate: [("n".to_string(), "count()".to_string())].into(),
    });
    assert!(bad(reduce).contains("not full text"));
    // A misspelled key is refused, not ignored.
    assert!(serde_json::from_value::<IndexField>(json!({"path": "body", "serch": true})).is_err());
    db.define_index(search_def("posts_text", "posts", &[("body", "standard")]))
        .unwrap();
    for (q, why) in [
        ("from posts where search(body, '\"open')", "closing"),
        ("from posts where search(title, 'x')", "no full-text index"),
        ("from posts where n = 1 order by score()", "need a search()"),
        (
            "from posts where n = 1 select highlight(body)",
            "need a search()",
        ),
        ("from posts where search(body, 'x^0')", "boost"),
    ] {
        match db.query(q, &Map::new(), QueryOptions::default()) {
            Err(e @ DocError::Query(QueryError::Invalid { .. })) => {
                assert!(e.to_string().contains(why), "{q}: {e}")
            }
            other => panic!("{q}: {other:?}"),
        }
    }
    drop(db);
    store.close().unwrap();
}

#[test]
fn a_backup_carries_the_definition_and_a_restore_rebuilds() {
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.create_database("b").unwrap();
    db.define_index(search_def("posts_text", "posts", &[("body", "english")]))
        .unwrap();
    for i in 0..40 {
        let body = if i % 4 == 0 {
            "durable journal"
        } else {
            "garden path"
        };
        db.put(
            &format!("posts/{i}"),
            json!({"body": body, "@metadata": {"@collection": "posts"}})
                .to_string()
                .as_bytes(),
            Condition::None,
        )
        .unwrap();
    }
    assert_eq!(
        query(&db, "from posts where search(body, 'journals')").total,
        10
    );
    let mut backup = Vec::new();
    db.backup_to(&mut backup, Default::default(), |_| {})
        .unwrap();
    drop(db);
    store.close().unwrap();

    let out = tempfile::tempdir().unwrap();
    kiln_docs::restore_database(
        kiln_docs::RestoreSource::Files(vec![(
            "the backup".into(),
            Box::new(std::io::Cursor::new(backup)) as Box<dyn std::io::Read>,
        )]),
        out.path(),
        "copy",
        options().storage,
        false,
        kiln_docs::RestorePoint::Latest,
        |_| {},
    )
    .unwrap();
    let store = DocStore::open(out.path(), options()).unwrap();
    let db = store.database("copy").unwrap();
    let r = query(&db, "from posts where search(body, 'journals')");
    assert_eq!(r.total, 10);
    assert!(!r.stale);
    assert!(db.index_definition("posts_text").unwrap().is_search());
    drop(db);
    store.close().unwrap();
}

#[test]
fn equal_scores_page_the_same_whichever_plan_answers() {
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.create_database("ties").unwrap();
    db.define_index(search_def("t_text", "t", &[("body", "standard")]))
        .unwrap();
    // Identical texts: identical scores; written in reverse id order, so that the
    // index's order is not the ids'.
    for i in (0..25).rev() {
        db.put(
            &format!("t/{i:02}"),
            json!({"body": "same words here", "n": 1, "@metadata": {"@collection": "t", "@highlights": {"body": "<script>"}}})
                .to_string()
                .as_bytes(),
            Condition::None,
        )
        .unwrap();
    }
    let page = |q: &str| -> Vec<String> {
        results(&query(&db, q))
            .iter()
            .map(|v| {
                // Never what the client stored.
                assert!(v["@metadata"].get("@highlights").is_none(), "{v}");
                v["@metadata"]["@id"].as_str().unwrap().to_string()
            })
            .collect()
    };
    for offset in [0, 7, 14, 21] {
        // The top-hits plan, and the plan that checks another condition.
        let a = page(&format!(
            "from t where search(body, 'words') limit 7 offset {offset}"
        ));
        let b = page(&format!(
            "from t where search(body, 'words') and n = 1 limit 7 offset {offset}"
        ));
        assert_eq!(a, b, "offset {offset}");
    }
    drop(db);
    store.close().unwrap();
}

#[test]
fn fuzzy_words_match_within_their_edits() {
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.create_database("f").unwrap();
    db.define_index(search_def("w_text", "w", &[("body", "standard")]))
        .unwrap();
    for (id, body) in [
        ("w/1", "quick brown"),
        ("w/2", "quack"),
        ("w/3", "quickly"),
        ("w/4", "Quick"),
        ("w/5", "slow"),
    ] {
        db.put(
            id,
            json!({"body": body, "@metadata": {"@collection": "w"}})
                .to_string()
                .as_bytes(),
            Condition::None,
        )
        .unwrap();
    }
    let ids = |text: &str| -> BTreeSet<String> {
        let r = query(&db, &format!("from w where search(body, '{text}')"));
        results(&r)
            .iter()
            .map(|v| v["@metadata"]["@id"].as_str().unwrap().to_string())
            .collect()
    };
    let set = |ids: &[&str]| ids.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    // A swap is one edit; the word is lowercased as the index's terms are.
    assert_eq!(ids("QUIKC~1"), set(&["w/1", "w/4"]));
    assert_eq!(ids("quikc~0"), set(&[]));
    assert_eq!(ids("quick~0"), set(&["w/1", "w/4"]));
    // quack is one substitution away, quickly two insertions.
    assert_eq!(ids("quick~1"), set(&["w/1", "w/2", "w/4"]));
    assert_eq!(ids("quick~"), set(&["w/1", "w/2", "w/3", "w/4"]));
    assert_eq!(ids("quick~ -brown"), set(&["w/2", "w/3", "w/4"]));
    match db.query(
        "from w where search(body, 'quick~3')",
        &Map::new(),
        QueryOptions::default(),
    ) {
        Err(e @ DocError::Query(QueryError::Invalid { .. })) => {
            assert!(e.to_string().contains("~2"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    drop(db);
    store.close().unwrap();
}

/// Issue 55: a document that matches only the other side of an `or` had
/// `@score: -0` (the sum of no scores); it is 0.
#[test]
fn a_match_without_a_search_scores_positive_zero() {
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.create_database("z").unwrap();
    db.define_index(search_def("c_text", "c", &[("body", "standard")]))
        .unwrap();
    for (id, body, n) in [
        ("c/1", "x marks", 1),
        ("c/2", "nothing", 3),
        ("c/3", "y", 4),
    ] {
        db.put(
            id,
            json!({"body": body, "n": n, "@metadata": {"@collection": "c"}})
                .to_string()
                .as_bytes(),
            Condition::None,
        )
        .unwrap();
    }
    for text in [
        "from c where search(body, 'x') or n == 3",
        "from c where search(body, 'x') or n == 3 order by n",
        "from c where not search(body, 'y')",
    ] {
        let r = query(&db, text);
        assert_eq!(r.total, 2, "{text}");
        let mut zero = 0;
        for (raw, v) in r.results.iter().zip(results(&r)) {
            let score = v["@metadata"]["@score"].as_f64().unwrap();
            assert!(score.is_sign_positive(), "{text}: {v}");
            assert!(
                !String::from_utf8_lossy(raw).contains("\"@score\":-"),
                "{text}: {v}"
            );
            zero += usize::from(score == 0.0);
        }
        assert!(zero >= 1, "{text}: a match without a search");
    }
    drop(db);
    store.close().unwrap();
}

/// Issue 55: `highlight()` marked the words of a phrase wherever they were; only
/// the phrase's occurrences are marked (a word of the search alone, anywhere).
#[test]
fn highlights_mark_a_phrase_only_where_it_occurs() {
    let dir = tempfile::tempdir().unwrap();
    let store = DocStore::open(dir.path(), options()).unwrap();
    let db = store.create_database("h").unwrap();
    db.define_index(search_def("h_text", "h", &[("body", "standard")]))
        .unwrap();
    for (id, body, n) in [
        ("h/1", "a quick fox met a slow fox & a quick dog", 1),
        ("h/2", "quick brown fox", 2),
        ("h/3", "the fox is quick", 3),
        ("h/4", "Quick Fox, then fox quick, then quick fox", 4),
    ] {
        db.put(
            id,
            json!({"body": body, "n": n, "@metadata": {"@collection": "h"}})
                .to_string()
                .as_bytes(),
            Condition::None,
        )
        .unwrap();
    }
    let highlighted = |search: &str, rest: &str| -> Vec<(String, String)> {
        let r = query(
            &db,
            &format!(
                "from h where search(body, '{search}'){rest} order by n select highlight(body)"
            ),
        );
        results(&r)
            .iter()
            .map(|v| {
                (
                    v["@metadata"]["@id"].as_str().unwrap().to_string(),
                    v["@metadata"]["@highlights"]["body"]
                        .as_str()
                        .unwrap()
                        .to_string(),
                )
            })
            .collect()
    };
    let pairs = |p: &[(&str, &str)]| -> Vec<(String, String)> {
        p.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    };
    assert_eq!(
        highlighted("\"quick fox\"", ""),
        pairs(&[
            (
                "h/1",
                "a <b>quick</b> <b>fox</b> met a slow fox &amp; a quick dog"
            ),
            (
                "h/4",
                "<b>Quick</b> <b>Fox</b>, then fox quick, then <b>quick</b> <b>fox</b>"
            ),
        ])
    );
    // A word of the search alone is marked wherever it is; the phrase only where
    // it occurs (h/2 and h/3 match by `brown` and by n).
    assert_eq!(
        highlighted("\"quick fox\" brown slow", " or n = 3"),
        pairs(&[
            (
                "h/1",
                "a <b>quick</b> <b>fox</b> met a <b>slow</b> fox &amp; a quick dog"
            ),
            ("h/2", "quick <b>brown</b> fox"),
            ("h/3", ""),
            (
                "h/4",
                "<b>Quick</b> <b>Fox</b>, then fox quick, then <b>quick</b> <b>fox</b>"
            ),
        ])
    );
    // A word the analyzer splits in two is a phrase too; an excluded word is
    // never marked.
    assert_eq!(
        highlighted("brown-fox -slow", " or n = 3"),
        pairs(&[("h/2", "quick <b>brown</b> <b>fox</b>"), ("h/3", "")])
    );
    drop(db);
    store.close().unwrap();
}
