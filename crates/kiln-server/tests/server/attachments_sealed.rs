//! Attachments of an encrypted server (`kiln_docs`' sealed blobs) over HTTP: the
//! bytes go in and come back whole, by range and by hash, decrypted as they are
//! sent; no file of the data directory holds them; a changed byte in a blob file
//! cuts the body instead of sending other bytes.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use crate::common::Harness;
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

const MARKER: &[u8] = b"KILN-HTTP-SEALED-MARKER-c41d07";
const CHUNK: usize = 64 << 10;

fn secret_bytes() -> Vec<u8> {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut data: Vec<u8> = (0..5 * CHUNK + 777)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let n = data.len();
    for at in [0, CHUNK - 5, 3 * CHUNK + 9, n - MARKER.len()] {
        data[at..at + MARKER.len()].copy_from_slice(MARKER);
    }
    data
}

fn all_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

fn files_with_marker(dir: &Path) -> Vec<PathBuf> {
    all_files(dir)
        .into_iter()
        .filter(|p| {
            std::fs::read(p)
                .unwrap()
                .windows(MARKER.len())
                .any(|w| w == MARKER)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attachments_of_an_encrypted_server_are_sealed_on_disk_and_served_plain() {
    let key = kiln_storage::MasterKey::generate();
    let h = Harness::start_with(|c| c.docs.storage.encryption = Some(key.clone())).await;
    h.create_db("a").await;
    h.put_ok("a", "d", &json!({})).await;
    // The database's stats say it is encrypted, and under which master key.
    let stats: Value = h
        .http
        .get(h.url("/dbs/a"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(stats["encrypted"], json!(true), "{stats}");
    assert_eq!(
        stats["encryption_key_fingerprint"],
        json!(key.fingerprint()),
        "{stats}"
    );
    let data = secret_bytes();
    let url = h.url("/dbs/a/docs/d/attachments/f.bin");
    let r = h.http.put(&url).body(data.clone()).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let hash = r.json::<Value>().await.unwrap()["attachment"]["hash"]
        .as_str()
        .unwrap()
        .to_string();

    // Whole, then ranges: across a chunk boundary, the last bytes, one byte.
    let r = h.http.get(&url).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        r.headers()["content-length"],
        data.len().to_string().as_str()
    );
    assert!(r.bytes().await.unwrap().as_ref() == &data[..]);
    for (range, want) in [
        (
            format!("bytes={}-{}", CHUNK - 100, CHUNK + 100),
            &data[CHUNK - 100..=CHUNK + 100],
        ),
        (format!("bytes=-{}", MARKER.len()), MARKER),
        (
            format!("bytes={}-", data.len() - 1),
            &data[data.len() - 1..],
        ),
        (
            format!("bytes={0}-{0}", 3 * CHUNK + 9),
            &data[3 * CHUNK + 9..3 * CHUNK + 10],
        ),
    ] {
        let r = h
            .http
            .get(&url)
            .header("range", &range)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::PARTIAL_CONTENT, "{range}");
        assert!(r.bytes().await.unwrap().as_ref() == want, "{range}");
    }
    let r = h.http.head(&url).send().await.unwrap();
    assert_eq!(
        r.headers()["content-length"],
        data.len().to_string().as_str()
    );

    // By hash (what `kiln backup` copies): the plaintext.
    let r = h
        .http
        .get(h.url(&format!("/dbs/a/attachments/{hash}")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.bytes().await.unwrap().as_ref() == &data[..]);
    let r = h
        .http
        .get(h.url(&format!("/dbs/a/attachments/{}", "0".repeat(64))))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);

    // Staged bytes are sealed too.
    let mut staged = data.clone();
    staged.reverse();
    staged.extend_from_slice(MARKER);
    let r = h
        .http
        .post(h.url("/dbs/a/attachments"))
        .body(staged)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);

    let dir = h.shutdown().await;
    assert_eq!(files_with_marker(dir.path()), Vec::<PathBuf>::new());

    // A changed byte inside the blob's third chunk: the whole body is cut short
    // (the status went first), never other bytes; the first chunk's range still
    // reads.
    let blob = all_files(dir.path())
        .into_iter()
        .find(|p| p.file_name().is_some_and(|n| n == hash.as_str()))
        .unwrap();
    let mut bytes = std::fs::read(&blob).unwrap();
    bytes[40 + 2 * (40 + CHUNK) + 40 + 1000] ^= 1;
    std::fs::write(&blob, bytes).unwrap();
    let h = Harness::start_in(dir, |c| c.docs.storage.encryption = Some(key.clone())).await;
    let url = h.url("/dbs/a/docs/d/attachments/f.bin");
    let r = h.http.get(&url).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    // An error, or a short body: never the whole length of other bytes.
    if let Ok(body) = r.bytes().await {
        assert!(body.len() < data.len(), "{} bytes sent", body.len());
    }
    let r = h
        .http
        .get(&url)
        .header("range", "bytes=0-99")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::PARTIAL_CONTENT);
    assert!(r.bytes().await.unwrap().as_ref() == &data[..100]);
    h.shutdown().await;
}
