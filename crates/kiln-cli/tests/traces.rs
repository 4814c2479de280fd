//! Traces (`kiln serve --otlp-endpoint`, `--slow-request-ms`): an OTLP/HTTP
//! receiver of the test's own takes what `kiln serve` exports, and the span tree
//! of one PUT (request → write-queue wait, commit → commit group → journal write)
//! and of one query (request → query, with its plan) is checked, both continuing
//! the trace of the `traceparent` the client sent; the answers carry
//! `traceresponse`; the slow-request log names the spans. Without the flags no
//! span is made and no `traceresponse` sent.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

mod common;

use common::raw_http::raw;
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const PUT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PUT_PARENT: &str = "00f067aa0ba902b7";
const QUERY_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const QUERY_PARENT: &str = "b7ad6b7169203331";

/// What the receiver was sent: the request line, content type and body of each.
type Received = Arc<Mutex<Vec<(String, String, Vec<u8>)>>>;

/// An OTLP/HTTP receiver: answers every POST with 200 `{}` (keep-alive, as
/// collectors do) and keeps what it got.
fn start_receiver() -> (u16, Received) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let received: Received = Arc::default();
    let keep = received.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            let keep = keep.clone();
            std::thread::spawn(move || serve_exporter(conn, &keep));
        }
    });
    (port, received)
}

fn serve_exporter(conn: TcpStream, keep: &Received) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut writer = conn;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let (mut length, mut content_type) = (0usize, String::new());
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            let (name, value) = line.split_once(':').unwrap();
            match name.to_ascii_lowercase().as_str() {
                "content-length" => length = value.trim().parse().unwrap(),
                "content-type" => content_type = value.trim().to_string(),
                _ => {}
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).unwrap();
        keep.lock()
            .unwrap()
            .push((request_line.trim_end().to_string(), content_type, body));
        let answer =
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
        if writer.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

/// One exported span, as the test looks at it.
#[derive(Debug, Clone)]
struct Exported {
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    name: String,
    attributes: serde_json::Map<String, Value>,
}

/// Every span of every export request (OTLP/JSON: ids in hex, attributes as
/// `{key, value: {stringValue | intValue | ...}}`), and the service names seen.
fn exported_spans(received: &Received) -> (Vec<Exported>, Vec<String>) {
    let mut spans = Vec::new();
    let mut services = Vec::new();
    for (line, content_type, body) in received.lock().unwrap().iter() {
        assert_eq!(line, "POST /v1/traces HTTP/1.1");
        assert_eq!(content_type, "application/json");
        let doc: Value = serde_json::from_slice(body).unwrap();
        for rs in doc["resourceSpans"].as_array().unwrap() {
            for a in rs["resource"]["attributes"]
                .as_array()
                .into_iter()
                .flatten()
            {
                if a["key"] == "service.name" {
                    services.push(a["value"]["stringValue"].as_str().unwrap().to_string());
                }
            }
            for ss in rs["scopeSpans"].as_array().unwrap() {
                for s in ss["spans"].as_array().unwrap() {
                    let mut attributes = serde_json::Map::new();
                    for a in s["attributes"].as_array().into_iter().flatten() {
                        let v = a["value"].as_object().unwrap();
                        let inner = v.values().next().cloned().unwrap_or(Value::Null);
                        attributes.insert(a["key"].as_str().unwrap().to_string(), inner);
                    }
                    let text = |k: &str| s[k].as_str().unwrap_or_default().to_string();
                    spans.push(Exported {
                        trace_id: text("traceId"),
                        span_id: text("spanId"),
                        parent_span_id: text("parentSpanId"),
                        name: text("name"),
                        attributes,
                    });
                }
            }
        }
    }
    (spans, services)
}

/// The span of `trace` whose parent is `parent`, named `name` (by prefix).
fn child<'a>(spans: &'a [Exported], trace: &str, parent: &str, name: &str) -> &'a Exported {
    spans
        .iter()
        .find(|s| s.trace_id == trace && s.parent_span_id == parent && s.name.starts_with(name))
        .unwrap_or_else(|| {
            let of_trace: Vec<_> = spans
                .iter()
                .filter(|s| s.trace_id == trace)
                .map(|s| (&s.name, &s.span_id, &s.parent_span_id))
                .collect();
            panic!("no span {name:?} under {parent} in trace {trace}: {of_trace:#?}")
        })
}

fn attr_text(span: &Exported, key: &str) -> String {
    match span.attributes.get(key) {
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
        None => panic!(
            "span {:?} has no attribute {key}: {:?}",
            span.name, span.attributes
        ),
    }
}

#[test]
fn a_put_and_a_query_are_exported_as_span_trees_that_continue_the_callers_trace() {
    let (receiver, received) = start_receiver();
    let dir = tempfile::tempdir().unwrap();
    let port = common::free_port();
    let mut server = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["serve", "--bind", &format!("127.0.0.1:{port}")])
        .args([
            "--journal-file-size-mib",
            common::TEST_JOURNAL_FILE_SIZE_MIB,
        ])
        .args(["--otlp-endpoint", &format!("http://127.0.0.1:{receiver}")])
        .args(["--otlp-protocol", "http/json", "--slow-request-ms", "0"])
        .arg("--data-dir")
        .arg(dir.path())
        // Export every 100 ms instead of every 5 s (the standard variable).
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = server.stderr.take().unwrap();
    let log = std::thread::spawn(move || {
        let mut text = String::new();
        BufReader::new(stderr).read_to_string(&mut text).unwrap();
        text
    });
    common::wait_until_healthy(&mut server, port, "kiln serve --otlp-endpoint");

    assert_eq!(raw(port, "PUT", "/dbs/t", &[], b"").status, 201);
    let put = raw(
        port,
        "PUT",
        "/dbs/t/docs/d1",
        &[("traceparent", &format!("00-{PUT_TRACE}-{PUT_PARENT}-01"))],
        br#"{"n":1,"@metadata":{"@collection":"c"}}"#,
    );
    assert_eq!(put.status, 201, "{}", String::from_utf8_lossy(&put.body));
    let put_response = put.header("traceresponse").unwrap().to_string();
    assert!(
        put_response.starts_with(&format!("00-{PUT_TRACE}-")),
        "{put_response}"
    );
    let query = raw(
        port,
        "POST",
        "/dbs/t/queries",
        &[(
            "traceparent",
            &format!("00-{QUERY_TRACE}-{QUERY_PARENT}-01"),
        )],
        br#"{"query":"from c where n == 1"}"#,
    );
    assert_eq!(
        query.status,
        200,
        "{}",
        String::from_utf8_lossy(&query.body)
    );

    // The spans of both requests reach the receiver while the server runs.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (spans, _) = exported_spans(&received);
        let has = |trace: &str, name: &str| {
            spans
                .iter()
                .any(|s| s.trace_id == trace && s.name.starts_with(name))
        };
        if has(PUT_TRACE, "kiln.journal.write") && has(QUERY_TRACE, "kiln.query") {
            break;
        }
        assert!(Instant::now() < deadline, "spans not exported: {spans:#?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: signals the child this test started.
    unsafe { libc::kill(server.id() as libc::pid_t, libc::SIGTERM) };
    assert!(server.wait().unwrap().success());
    let log = log.join().unwrap();

    let (spans, services) = exported_spans(&received);
    assert!(
        services.iter().all(|s| s == "kiln") && !services.is_empty(),
        "{services:?}"
    );

    // The PUT: the server's span is a child of the caller's, named by its route.
    let request = child(&spans, PUT_TRACE, PUT_PARENT, "PUT /dbs/{db}/docs/{*id}");
    assert_eq!(attr_text(request, "http.response.status_code"), "201");
    assert_eq!(attr_text(request, "http.route"), "/dbs/{db}/docs/{*id}");
    assert_eq!(attr_text(request, "url.path"), "/dbs/t/docs/d1");
    assert_eq!(
        &put_response[36..52],
        request.span_id,
        "traceresponse names the server's span"
    );
    child(&spans, PUT_TRACE, &request.span_id, "kiln.write_queue.wait");
    let commit = child(&spans, PUT_TRACE, &request.span_id, "kiln.commit");
    assert_eq!(attr_text(commit, "database"), "t");
    assert_eq!(attr_text(commit, "writes"), "1");
    let group = child(&spans, PUT_TRACE, &commit.span_id, "kiln.commit.group");
    assert_eq!(attr_text(group, "units"), "1");
    let journal = child(&spans, PUT_TRACE, &group.span_id, "kiln.journal.write");
    assert!(attr_text(journal, "journal_bytes").parse::<u64>().unwrap() >= 4096);

    // The query: its execution, with its plan and cost.
    let request = child(&spans, QUERY_TRACE, QUERY_PARENT, "POST /dbs/{db}/queries");
    assert_eq!(attr_text(request, "http.response.status_code"), "200");
    let q = child(&spans, QUERY_TRACE, &request.span_id, "kiln.query");
    assert_eq!(attr_text(q, "query"), "from c where n == 1");
    assert!(attr_text(q, "plan").contains("collection scan"), "{q:?}");
    assert_eq!(attr_text(q, "total"), "1");

    // --slow-request-ms 0: every request has its line, with its trace and spans.
    let put_line = log
        .lines()
        .find(|l| l.contains("slow request: PUT /dbs/t/docs/d1 201"))
        .unwrap_or_else(|| panic!("no slow-request line for the PUT in {log}"));
    assert!(
        put_line.contains(&format!("trace_id={PUT_TRACE}")),
        "{put_line}"
    );
    for name in [
        "kiln.write_queue.wait",
        "kiln.commit ",
        "kiln.journal.write",
    ] {
        assert!(put_line.contains(name), "{name} in {put_line}");
    }
    let query_line = log
        .lines()
        .find(|l| l.contains("slow request: POST /dbs/t/queries 200"))
        .unwrap_or_else(|| panic!("no slow-request line for the query in {log}"));
    assert!(query_line.contains("plan=collection scan"), "{query_line}");
    assert!(
        query_line.contains(&format!("trace_id={QUERY_TRACE}")),
        "{query_line}"
    );
}

#[test]
fn without_the_flags_no_trace_is_answered_and_a_bad_endpoint_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let port = common::free_port();
    let mut server = common::spawn_serve(dir.path(), port);
    assert_eq!(raw(port, "PUT", "/dbs/t", &[], b"").status, 201);
    let put = raw(
        port,
        "PUT",
        "/dbs/t/docs/d1",
        &[("traceparent", &format!("00-{PUT_TRACE}-{PUT_PARENT}-01"))],
        b"{}",
    );
    assert_eq!(put.status, 201);
    assert_eq!(put.header("traceresponse"), None, "{}", put.head);
    server.kill().unwrap();
    server.wait().unwrap();

    for (endpoint, says) in [
        ("ftp://collector:4318", "not an http:// URL"),
        ("https://collector:4318", "https is not supported"),
    ] {
        let out = common::kiln(&[
            "serve",
            "--otlp-endpoint",
            endpoint,
            "--data-dir",
            "/nonexistent/x",
        ]);
        assert_eq!(out.status.code(), Some(2), "{}", common::text(&out));
        assert!(common::text(&out).contains(says), "{}", common::text(&out));
    }
    let out = common::kiln(&["serve", "--otlp-protocol", "grpc"]);
    assert_eq!(out.status.code(), Some(2), "{}", common::text(&out));
    assert!(
        common::text(&out).contains("grpc is not supported"),
        "{}",
        common::text(&out)
    );
}
