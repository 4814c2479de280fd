//! The stored form of documents (`record.rs`, format 2: the server's `@metadata`
//! written at read time, LZ4 bodies) read back the JSON format 1 stored, byte for
//! byte; records of format 1 left by older servers still read the same; the documents
//! of a database written with one id-keyed tree (`docs`) move into `doc_ids` and
//! `doc_bodies` at open, also after a crash half way; and a body stored under another
//! sequence than its own is reported as corruption.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use kiln_docs::{format_rfc3339_ms, Condition, DocStore, DocsOptions, DocumentCompression};

fn options(compression: DocumentCompression) -> DocsOptions {
    let mut o = DocsOptions::default();
    o.storage.journal_file_size_bytes = 1 << 20;
    o.storage.data_grow_step_bytes = 1 << 20;
    o.document_compression = compression;
    o
}

/// (id, body sent, the JSON a client reads with `{E}` for the etag and `{T}` for
/// the last-modified time): the bytes format 1 stored.
const CASES: &[(&str, &str, &str)] = &[
    (
        "a",
        "{}",
        r#"{"@metadata":{"@id":"a","@etag":"{E}","@last-modified":"{T}"}}"#,
    ),
    (
        "users/1",
        r#"{"name": "Ada", "n": 1.50, "tags": ["x", {"y": null}]}"#,
        r#"{"name":"Ada","n":1.50,"tags":["x",{"y":null}],"@metadata":{"@id":"users/1","@collection":"users","@etag":"{E}","@last-modified":"{T}"}}"#,
    ),
    (
        "p/\"é\"",
        r#"{"@metadata":{"tag":"x","@etag":"forged","@collection":"people","@flags":3},"text":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}"#,
        r#"{"text":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa","@metadata":{"@id":"p/\"é\"","@collection":"people","@etag":"{E}","@last-modified":"{T}","tag":"x","@flags":3}}"#,
    ),
    (
        "e/1",
        r#"{"@metadata":{"@expires":"2999-01-01T00:00:00Z"},"v":"compressible compressible compressible compressible compressible"}"#,
        r#"{"v":"compressible compressible compressible compressible compressible","@metadata":{"@id":"e/1","@collection":"e","@etag":"{E}","@last-modified":"{T}","@expires":"2999-01-01T00:00:00Z"}}"#,
    ),
];

fn expected(template: &str, etag: kiln_docs::Etag, ms: u64) -> String {
    template
        .replace("{E}", &etag.to_string())
        .replace("{T}", &format_rfc3339_ms(ms))
}

fn open_env(dir: &std::path::Path, name: &str) -> kiln_storage::Env {
    let env_dir = dir.join("databases").join(name);
    kiln_storage::Env::open(&env_dir, options(DocumentCompression::None).storage).unwrap()
}

/// Every (key, value) of `tree`.
fn tree_items(r: &kiln_storage::ReadTxn<'_>, tree: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    let mut c = r.cursor(tree).unwrap();
    let mut e = c.first().unwrap();
    while let Some((k, v)) = e {
        out.push((k.to_vec(), v.to_vec()));
        e = c.next().unwrap();
    }
    out
}

/// The raw records of database `name` in `dir` (the store closed), by id: each
/// id's sequence in `doc_ids` leads to its record in `doc_bodies`, which holds
/// nothing else.
fn raw_records(dir: &std::path::Path, name: &str) -> Vec<(String, Vec<u8>)> {
    let env = open_env(dir, name);
    let r = env.begin_read().unwrap();
    assert!(!r.tree_exists("docs").unwrap(), "the legacy tree is gone");
    let bodies = tree_items(&r, "doc_bodies");
    let ids = tree_items(&r, "doc_ids");
    assert_eq!(
        bodies.len(),
        ids.len(),
        "one body per document, none left behind"
    );
    let out = ids
        .into_iter()
        .map(|(id, sequence)| {
            let body = &bodies.iter().find(|(k, _)| *k == sequence).unwrap().1;
            assert_eq!(
                &body[1..9],
                &sequence[..],
                "a body is keyed by its sequence"
            );
            (String::from_utf8(id).unwrap(), body.clone())
        })
        .collect();
    drop(r);
    env.close().unwrap();
    out
}

/// Moves the documents `which` selects back into the one `docs` tree (id ->
/// record) of databases written before the id and body trees; with none left in
/// the new trees they are dropped, as such a database never had them.
fn back_to_legacy(dir: &std::path::Path, name: &str, which: impl Fn(&str) -> bool) {
    let env = open_env(dir, name);
    let mut w = env.begin_write().unwrap();
    w.ensure_tree("docs").unwrap();
    let ids: Vec<(Vec<u8>, Vec<u8>)> = {
        let mut out = Vec::new();
        let mut c = w.cursor("doc_ids").unwrap();
        let mut e = c.first().unwrap();
        while let Some((k, v)) = e {
            out.push((k.to_vec(), v.to_vec()));
            e = c.next().unwrap();
        }
        out
    };
    for (id, sequence) in ids {
        if !which(std::str::from_utf8(&id).unwrap()) {
            continue;
        }
        let body = w.get("doc_bodies", &sequence).unwrap().unwrap().to_vec();
        w.put("docs", &id, &body).unwrap();
        assert!(w.delete("doc_ids", &id).unwrap());
        assert!(w.delete("doc_bodies", &sequence).unwrap());
    }
    if w.tree_len("doc_ids").unwrap() == 0 {
        w.drop_tree("doc_ids").unwrap();
        w.drop_tree("doc_bodies").unwrap();
    }
    w.commit().unwrap();
    env.close().unwrap();
}

#[test]
fn json_read_back_is_what_format_1_stored_with_and_without_compression() {
    let mut sizes = Vec::new();
    for compression in [DocumentCompression::None, DocumentCompression::Lz4] {
        let dir = tempfile::tempdir().unwrap();
        let store = DocStore::open(dir.path(), options(compression)).unwrap();
        let db = store.create_database("d").unwrap();
        let mut want = Vec::new();
        for (id, body, template) in CASES {
            let p = db.put(id, body.as_bytes(), Condition::None).unwrap();
            want.push((
                id.to_string(),
                expected(template, p.etag, p.last_modified_ms),
            ));
        }
        for (id, json) in &want {
            let got = db.get(id).unwrap().unwrap();
            assert_eq!(String::from_utf8(got.json).unwrap(), *json, "{compression}");
            // The zero-copy path answers the same bytes.
            let viewed = db.get_with(id, |v| v.json.to_vec()).unwrap().unwrap();
            assert_eq!(String::from_utf8(viewed).unwrap(), *json);
        }
        let mut listed: Vec<_> = db
            .list_by_prefix("", None, 100)
            .unwrap()
            .items
            .into_iter()
            .map(|d| (d.id, String::from_utf8(d.json).unwrap()))
            .collect();
        listed.sort();
        want.sort();
        assert_eq!(listed, want);
        assert_eq!(db.attachments("a").unwrap().unwrap().len(), 0);
        drop(db);
        store.close().unwrap();
        let raw = raw_records(dir.path(), "d");
        let e1 = &raw.iter().find(|(id, _)| id == "e/1").unwrap().1;
        assert_eq!(e1[0], 2, "format 2 is written");
        assert_eq!(e1[23], u8::from(compression == DocumentCompression::Lz4));
        sizes.push(raw.iter().map(|(_, v)| v.len()).sum::<usize>());
        // The server's keys are not stored.
        for (_, v) in &raw {
            let text = String::from_utf8_lossy(v);
            assert!(
                !text.contains("@last-modified") && !text.contains("@etag"),
                "{text}"
            );
        }
    }
    assert!(sizes[1] < sizes[0], "{sizes:?}");
}

#[test]
fn format_1_records_left_by_older_servers_read_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let mut want = Vec::new();
    {
        let store = DocStore::open(dir.path(), options(DocumentCompression::Lz4)).unwrap();
        let db = store.create_database("d").unwrap();
        for (id, body, template) in CASES {
            let p = db.put(id, body.as_bytes(), Condition::None).unwrap();
            let json = expected(template, p.etag, p.last_modified_ms);
            want.push((
                id.to_string(),
                p.etag,
                p.last_modified_ms,
                p.collection,
                json,
            ));
        }
        drop(db);
        store.close().unwrap();
    }
    // Rewrite every record as format 1 did: header, collection, the whole JSON, in
    // the one id-keyed tree that servers of format 1 had.
    back_to_legacy(dir.path(), "d", |_| true);
    {
        let env = open_env(dir.path(), "d");
        let mut w = env.begin_write().unwrap();
        for (id, etag, ms, collection, json) in &want {
            let coll = collection.as_deref().unwrap_or("");
            let mut rec = vec![1u8];
            rec.extend_from_slice(&etag.sequence.to_be_bytes());
            rec.extend_from_slice(&etag.incarnation.to_be_bytes());
            rec.extend_from_slice(&ms.to_be_bytes());
            rec.extend_from_slice(&(coll.len() as u16).to_be_bytes());
            rec.extend_from_slice(coll.as_bytes());
            rec.extend_from_slice(json.as_bytes());
            w.put("docs", id.as_bytes(), &rec).unwrap();
        }
        w.commit().unwrap();
        env.close().unwrap();
    }
    {
        let env = open_env(dir.path(), "d");
        let r = env.begin_read().unwrap();
        assert!(!r.tree_exists("doc_ids").unwrap());
        assert!(tree_items(&r, "docs").iter().all(|(_, v)| v[0] == 1));
        drop(r);
        env.close().unwrap();
    }
    let store = DocStore::open(dir.path(), options(DocumentCompression::Lz4)).unwrap();
    let db = store.database("d").unwrap();
    for (id, etag, _, _, json) in &want {
        let got = db.get(id).unwrap().unwrap();
        assert_eq!(
            (got.etag, String::from_utf8(got.json).unwrap()),
            (*etag, json.clone())
        );
    }
    let listed = db.list_by_prefix("", None, 100).unwrap().items;
    assert_eq!(listed.len(), want.len());
    for d in listed {
        let w = want.iter().find(|w| w.0 == d.id).unwrap();
        assert_eq!(String::from_utf8(d.json).unwrap(), w.4);
    }
    // A format-1 document replaced under its etag becomes format 2 and reads
    // as the new body with the same metadata layout.
    let (id, etag, ..) = &want[2];
    let p = db
        .put(
            id,
            br#"{"text":"b","@metadata":{"tag":"y"}}"#,
            Condition::IfMatch(*etag),
        )
        .unwrap();
    let got = db.get(id).unwrap().unwrap();
    let want_json = format!(
        r#"{{"text":"b","@metadata":{{"@id":"p/\"é\"","@collection":"p","@etag":"{}","@last-modified":"{}","tag":"y"}}}}"#,
        p.etag,
        format_rfc3339_ms(p.last_modified_ms)
    );
    assert_eq!(String::from_utf8(got.json).unwrap(), want_json);
    drop(db);
    store.close().unwrap();
    let raw = raw_records(dir.path(), "d");
    assert_eq!(raw.iter().find(|(i, _)| i == id).unwrap().1[0], 2);
}

/// A database whose documents were being moved out of `docs` when the server
/// stopped (some chunks moved, the rest not) opens with every document, at the
/// etag it had, in its collection and the counts; and writes to moved documents
/// replace their bodies rather than leave them behind.
#[test]
fn documents_of_the_one_tree_layout_move_at_open_even_half_way() {
    let dir = tempfile::tempdir().unwrap();
    let mut want = Vec::new();
    {
        let store = DocStore::open(dir.path(), options(DocumentCompression::Lz4)).unwrap();
        let db = store.create_database("d").unwrap();
        for i in 0..300u32 {
            let id = format!("items/{i:04}");
            let body = format!(r#"{{"n":{i},"text":"item number {i}"}}"#);
            db.put(&id, body.as_bytes(), Condition::None).unwrap();
        }
        for i in (0..300u32).step_by(7) {
            let id = format!("items/{i:04}");
            db.put(
                &id,
                format!(r#"{{"n":{i},"again":true}}"#).as_bytes(),
                Condition::None,
            )
            .unwrap();
        }
        for i in (0..300u32).step_by(11) {
            db.delete(&format!("items/{i:04}"), Condition::None)
                .unwrap();
        }
        for d in db.list_by_prefix("", None, 1000).unwrap().items {
            want.push((d.id, d.etag, String::from_utf8(d.json).unwrap()));
        }
        drop(db);
        store.close().unwrap();
    }
    assert_eq!(want.len(), 300 - 28);
    // Odd numbers back in `docs`, even ones already moved: a crash between chunks.
    back_to_legacy(dir.path(), "d", |id| {
        id.ends_with(['1', '3', '5', '7', '9'])
    });
    let store = DocStore::open(dir.path(), options(DocumentCompression::Lz4)).unwrap();
    let db = store.database("d").unwrap();
    assert_eq!(db.document_count().unwrap(), want.len() as u64);
    for (id, etag, json) in &want {
        let got = db.get(id).unwrap().unwrap();
        assert_eq!(
            (got.etag, String::from_utf8(got.json).unwrap()),
            (*etag, json.clone())
        );
    }
    let listed = db.list_collection("items", None, 1000).unwrap().items;
    let mut listed_ids: Vec<_> = listed.into_iter().map(|d| d.id).collect();
    listed_ids.sort();
    let want_ids: Vec<_> = want.iter().map(|w| w.0.clone()).collect();
    assert_eq!(listed_ids, want_ids);
    assert_eq!(db.collections().unwrap()[0].documents, want.len() as u64);
    // Writes after the move: a replaced body and a deleted one leave nothing behind.
    db.put(&want[0].0, br#"{"n":-1}"#, Condition::IfMatch(want[0].1))
        .unwrap();
    db.delete(&want[1].0, Condition::IfMatch(want[1].1))
        .unwrap();
    drop(db);
    store.close().unwrap();
    assert_eq!(raw_records(dir.path(), "d").len(), want.len() - 1);
}

/// A body found under a sequence other than its own (a damaged or hand-edited data
/// file) is reported as corruption naming the document, never served as it.
#[test]
fn a_body_under_another_sequence_is_corruption_not_an_answer() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = {
        let store = DocStore::open(dir.path(), options(DocumentCompression::None)).unwrap();
        let db = store.create_database("d").unwrap();
        let a = db.put("a", br#"{"v":1}"#, Condition::None).unwrap().etag;
        let b = db.put("b", br#"{"v":2}"#, Condition::None).unwrap().etag;
        drop(db);
        store.close().unwrap();
        (a, b)
    };
    {
        let env = open_env(dir.path(), "d");
        let mut w = env.begin_write().unwrap();
        let body_b = w
            .get("doc_bodies", &b.sequence.to_be_bytes())
            .unwrap()
            .unwrap()
            .to_vec();
        // b's record stored under a's sequence, and "a" pointed back there.
        w.put("doc_bodies", &a.sequence.to_be_bytes(), &body_b)
            .unwrap();
        w.put("doc_ids", b"a", &a.sequence.to_be_bytes()).unwrap();
        w.commit().unwrap();
        env.close().unwrap();
    }
    let store = DocStore::open(dir.path(), options(DocumentCompression::None)).unwrap();
    let db = store.database("d").unwrap();
    let err = db.get("a").unwrap_err().to_string();
    assert!(err.contains("carries another sequence"), "{err}");
    assert_eq!(db.get("b").unwrap().unwrap().etag, b);
}
