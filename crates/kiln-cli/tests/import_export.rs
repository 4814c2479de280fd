//! `kiln import` / `kiln export` against a real `kiln serve`: every input form,
//! an export imported into an empty database gives the same documents, a bad line
//! or a refused line is named by file and line with the documents before it
//! committed, and `--resume` completes an interrupted import without duplicates.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;

use common::{kiln, text};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Server {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn start() -> Server {
        let dir = tempfile::tempdir().unwrap();
        let port = common::free_port();
        let child = common::spawn_serve(&dir.path().join("data"), port);
        Server {
            child,
            port,
            _dir: dir,
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn try_request(&self, method: &str, path: &str) -> std::io::Result<(u16, Vec<u8>)> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
        )?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw)?;
        let end = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or_else(|| std::io::Error::other("no header end"))?;
        let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
        let status = head[9..12].parse().map_err(std::io::Error::other)?;
        let mut body = raw[end + 4..].to_vec();
        if head.contains("transfer-encoding: chunked") {
            let mut out = Vec::new();
            let mut rest = &body[..];
            loop {
                let nl = rest.windows(2).position(|w| w == b"\r\n").unwrap();
                let n =
                    usize::from_str_radix(std::str::from_utf8(&rest[..nl]).unwrap(), 16).unwrap();
                if n == 0 {
                    break;
                }
                out.extend_from_slice(&rest[nl + 2..nl + 2 + n]);
                rest = &rest[nl + 4 + n..];
            }
            body = out;
        }
        Ok((status, body))
    }

    fn get(&self, path: &str) -> (u16, Value) {
        let (status, body) = self.try_request("GET", path).unwrap();
        (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
    }

    fn count(&self, db: &str) -> u64 {
        let (status, v) = self.get(&format!("/dbs/{db}"));
        assert_eq!(status, 200, "{v}");
        v["documents"].as_u64().unwrap()
    }

    /// Every document of a database by id, without the per-write metadata.
    fn all_docs(&self, db: &str) -> BTreeMap<String, Value> {
        let mut out = BTreeMap::new();
        let mut after = String::new();
        loop {
            let (status, page) = self.get(&format!(
                "/dbs/{db}/docs?page_size=500{}",
                if after.is_empty() {
                    String::new()
                } else {
                    format!("&start_after={}", after.replace('/', "%2F"))
                }
            ));
            assert_eq!(status, 200, "{page}");
            for d in page["results"].as_array().unwrap() {
                let mut d = d.clone();
                let id = d["@metadata"]["@id"].as_str().unwrap().to_string();
                let meta = d["@metadata"].as_object_mut().unwrap();
                meta.shift_remove("@etag");
                meta.shift_remove("@last-modified");
                out.insert(id, d);
            }
            match page["next"].as_str() {
                Some(n) => after = n.to_string(),
                None => return out,
            }
        }
    }
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn every_input_form_imports_and_an_export_round_trips() {
    let server = Server::start();
    let url = server.url();
    let work = tempfile::tempdir().unwrap();

    // NDJSON: bulk lines, plain documents with and without @metadata, a blank line.
    let ndjson = work.path().join("a.ndjson");
    std::fs::write(
        &ndjson,
        concat!(
            "{\"id\":\"users/ada\",\"document\":{\"name\":\"Ada\",\"n\":1.50}}\n",
            "{\"name\":\"Bob\",\"@metadata\":{\"@id\":\"users/bob\",\"tag\":\"x\"}}\n",
            "\n",
            "{\"name\":\"Cy\",\"@metadata\":{\"@collection\":\"people\"}}\n",
            "{\"id\":\"misc/z\",\"document\":{\"z\":true,\"@metadata\":{\"@collection\":\"special\"}}}\n",
        ),
    )
    .unwrap();
    // A pretty-printed JSON array, with brackets and commas inside strings.
    let array = work.path().join("b.json");
    std::fs::write(
        &array,
        "[\n  {\"id\": \"arr/1\", \"document\": {\"s\": \"a ] b, } \\\" {\"}},\n  {\"name\": \"plain\", \"list\": [1, [2, 3], {\"k\": []}]}\n]\n",
    )
    .unwrap();
    // A directory of .json files: ids from paths.
    let dir = work.path().join("tree");
    std::fs::create_dir_all(dir.join("orders/2024")).unwrap();
    std::fs::write(dir.join("orders/2024/o1.json"), r#"{"total": 12}"#).unwrap();
    std::fs::write(dir.join("orders/o2.json"), r#"{"total": 7}"#).unwrap();
    std::fs::write(dir.join("orders/readme.txt"), "not a document").unwrap();
    // A .tar.gz of .json files.
    let tgz = work.path().join("c.tar.gz");
    {
        let gz = flate2::write::GzEncoder::new(
            std::fs::File::create(&tgz).unwrap(),
            flate2::Compression::default(),
        );
        let mut tar = tar::Builder::new(gz);
        for (name, body) in [
            ("products/p1.json", r#"{"price": 3}"#),
            (
                "products/p2.json",
                r#"{"price": 4, "@metadata": {"@collection": "goods"}}"#,
            ),
        ] {
            let mut h = tar::Header::new_gnu();
            h.set_size(body.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            tar.append_data(&mut h, name, body.as_bytes()).unwrap();
        }
        tar.into_inner().unwrap().finish().unwrap();
    }

    let out = kiln(&[
        "import",
        "--url",
        &url,
        "--db",
        "src",
        "--json",
        p(&ndjson),
        p(&array),
        p(&dir),
        p(&tgz),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let summary: Value = serde_json::from_slice(&out.stdout).expect("a JSON summary");
    assert_eq!(summary["documents"], 10, "{}", text(&out));
    assert!(summary["last_etag"].is_string(), "{summary}");
    assert_eq!(server.count("src"), 10);

    let (s, ada) = server.get("/dbs/src/docs/users/ada");
    assert_eq!(s, 200);
    assert_eq!(ada["name"], "Ada");
    assert_eq!(ada["n"].to_string(), "1.50", "numbers kept as written");
    let (_, bob) = server.get("/dbs/src/docs/users/bob");
    assert_eq!(bob["@metadata"]["tag"], "x");
    let (_, z) = server.get("/dbs/src/docs/misc/z");
    assert_eq!(z["@metadata"]["@collection"], "special");
    let (_, a1) = server.get("/dbs/src/docs/arr/1");
    assert_eq!(a1["s"], "a ] b, } \" {");
    let (s, o1) = server.get("/dbs/src/docs/orders/2024/o1");
    assert_eq!((s, o1["total"].as_i64()), (200, Some(12)));
    let (s, _) = server.get("/dbs/src/docs/orders/o2");
    assert_eq!(s, 200);
    let (s, p2) = server.get("/dbs/src/docs/products/p2");
    assert_eq!(s, 200);
    assert_eq!(p2["@metadata"]["@collection"], "goods");
    let (s, _) = server.get("/dbs/src/docs/products/p1");
    assert_eq!(s, 200);
    let docs = server.all_docs("src");
    let cy = docs
        .iter()
        .find(|(_, d)| d["name"] == "Cy")
        .expect("Cy imported");
    assert!(
        cy.0.starts_with("people/"),
        "generated under its collection: {}",
        cy.0
    );
    let plain = docs
        .iter()
        .find(|(_, d)| d["name"] == "plain")
        .expect("the plain array element imported");
    assert!(plain.0.starts_with("docs/"), "{}", plain.0);
    assert_eq!(plain.1["list"], serde_json::json!([1, [2, 3], {"k": []}]));
    // Every import consumed its state file.
    assert!(!work.path().join("a.ndjson.kiln-import-state").exists());

    // Export, then import the export into an empty database: the same documents.
    let exported = work.path().join("export.ndjson");
    let out = kiln(&[
        "export",
        "--url",
        &url,
        "--db",
        "src",
        "--out",
        p(&exported),
        "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let summary: Value = serde_json::from_slice(&out.stdout).expect("a JSON summary");
    assert_eq!(summary["documents"], 10, "{}", text(&out));
    let lines = std::fs::read_to_string(&exported).unwrap();
    assert_eq!(lines.lines().count(), 10);
    for l in lines.lines() {
        let v: Value = serde_json::from_str(l).unwrap();
        let meta = &v["document"]["@metadata"];
        assert!(v["id"].is_string() && v["document"].is_object(), "{l}");
        assert!(
            meta.get("@etag").is_none() && meta.get("@id").is_none(),
            "{l}"
        );
        assert!(meta.get("@last-modified").is_none(), "{l}");
    }
    let out = kiln(&[
        "import",
        "--url",
        &url,
        "--db",
        "copy",
        "--quiet",
        p(&exported),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let copy = server.all_docs("copy");
    assert_eq!(copy.len(), 10);
    assert_eq!(copy, docs, "the copy differs from the source");

    // Export to stdout works too (and an empty database exports nothing).
    let (s, _) = server.try_request("PUT", "/dbs/empty").unwrap();
    assert_eq!(s, 201);
    let out = kiln(&["export", "--url", &url, "--db", "empty", "--quiet"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(out.stdout.is_empty(), "{}", text(&out));
    let out = kiln(&["export", "--url", &url, "--db", "src", "--quiet"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(out.stdout, lines.as_bytes());
}

#[test]
fn a_bad_line_is_named_and_resume_completes_without_duplicates() {
    let server = Server::start();
    let url = server.url();
    let work = tempfile::tempdir().unwrap();
    let input = work.path().join("docs.ndjson");
    let state = work.path().join("docs.ndjson.kiln-import-state");
    let good = |i: u32| format!("{{\"n\":{i}}}\n");
    let mut body: String = (1..=30).map(good).collect();
    body.push_str("{\"n\": 31,\n");
    body.extend((32..=50).map(good));
    std::fs::write(&input, &body).unwrap();

    let out = kiln(&["import", "--url", &url, "--db", "r", p(&input)]);
    assert!(!out.status.success(), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("{}:31:", input.display())),
        "names file and line: {}",
        text(&out)
    );
    assert_eq!(server.count("r"), 30, "the documents before the bad line");
    let st: Value = serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
    assert_eq!(st["inputs"][0]["acked"], 30, "{st}");

    // Without --resume it refuses to start over the state file.
    let out = kiln(&["import", "--url", &url, "--db", "r", p(&input)]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--resume"),
        "{}",
        text(&out)
    );
    assert_eq!(server.count("r"), 30);

    // Simulate acks lost in an interruption: the server committed 30, the state says
    // 20. The resumed import resends 21..30 with the same generated ids.
    let mut st = st;
    st["inputs"][0]["acked"] = 20.into();
    std::fs::write(&state, st.to_string()).unwrap();
    let fixed: String = (1..=50).map(good).collect();
    std::fs::write(&input, fixed).unwrap();
    let out = kiln(&[
        "import",
        "--url",
        &url,
        "--db",
        "r",
        "--resume",
        "--json",
        p(&input),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["documents"], 30, "{summary}");
    assert_eq!(summary["skipped"], 20, "{summary}");
    assert_eq!(server.count("r"), 50, "no duplicates, nothing missing");
    let mut ns: Vec<i64> = server
        .all_docs("r")
        .values()
        .map(|d| d["n"].as_i64().unwrap())
        .collect();
    ns.sort();
    assert_eq!(ns, (1..=50).collect::<Vec<i64>>());
    assert!(!state.exists(), "a completed import removes its state file");
}

#[test]
fn a_line_the_server_refuses_is_mapped_to_its_file_and_line() {
    let server = Server::start();
    let url = server.url();
    let work = tempfile::tempdir().unwrap();
    let a = work.path().join("a.ndjson");
    let b = work.path().join("b.ndjson");
    std::fs::write(
        &a,
        "{\"id\":\"k/1\",\"document\":{}}\n{\"id\":\"k/2\",\"document\":{}}\n",
    )
    .unwrap();
    // Line 4 of b (after a blank line): an empty id, refused by the server.
    std::fs::write(
        &b,
        "{\"id\":\"k/3\",\"document\":{}}\n\n{\"id\":\"k/4\",\"document\":{}}\n{\"id\":\"\",\"document\":{}}\n{\"id\":\"k/5\",\"document\":{}}\n",
    )
    .unwrap();
    let out = kiln(&["import", "--url", &url, "--db", "m", p(&a), p(&b)]);
    assert!(!out.status.success(), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("{}:4:", b.display())),
        "{}",
        text(&out)
    );
    assert!(err.contains("invalid_id"), "{}", text(&out));
    assert_eq!(server.count("m"), 4);
    for id in ["k/1", "k/2", "k/3", "k/4"] {
        assert_eq!(server.get(&format!("/dbs/m/docs/{id}")).0, 200, "{id}");
    }
    assert_eq!(server.get("/dbs/m/docs/k/5").0, 404);
}

#[test]
fn a_killed_import_resumes_without_duplicates() {
    let server = Server::start();
    let url = server.url();
    let work = tempfile::tempdir().unwrap();
    let input = work.path().join("big.ndjson");
    let n = 60_000u32;
    let mut body = String::with_capacity(n as usize * 40);
    for i in 1..=n {
        body.push_str(&format!("{{\"n\":{i},\"pad\":\"{:0>20}\"}}\n", i));
    }
    std::fs::write(&input, body).unwrap();
    let state = work.path().join("big.ndjson.kiln-import-state");
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["import", "--url", &url, "--db", "k", "--quiet"])
        .arg(&input)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Kill it once some batches are acknowledged (or let it finish on a fast machine).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let acked = std::fs::read(&state)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .and_then(|v| v["inputs"][0]["acked"].as_u64())
            .unwrap_or(0);
        if acked > 0 || child.try_wait().unwrap().is_some() {
            break;
        }
        assert!(Instant::now() < deadline, "no ack within 20 s");
        std::thread::sleep(Duration::from_millis(2));
    }
    let _ = child.kill();
    let _ = child.wait();
    if state.exists() {
        let out = kiln(&[
            "import",
            "--url",
            &url,
            "--db",
            "k",
            "--resume",
            "--quiet",
            p(&input),
        ]);
        assert!(out.status.success(), "{}", text(&out));
    }
    assert_eq!(
        server.count("k"),
        n as u64,
        "no duplicates, nothing missing"
    );
}
