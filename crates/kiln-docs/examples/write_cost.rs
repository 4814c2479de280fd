// Measures the document layer's cost per 1 KiB document written in units of 16
// (what the server's combiner does under load), without HTTP.
#![allow(clippy::unwrap_used)] // a measuring tool: a failure stops it
use kiln_docs::{Condition, DocId, DocStore, DocsOptions, ParsedDocument, WriteOp};
use std::time::Instant;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let dir = std::env::args().nth(1).unwrap_or("/tmp/wc".into());
    let _ = std::fs::remove_dir_all(&dir);
    let store = DocStore::open(&dir, DocsOptions::default()).unwrap();
    let db = store.create_database("bench").unwrap();
    let payload: String = (0..900)
        .map(|i| (b'a' + (i * 7 % 26) as u8) as char)
        .collect();
    let n = 32_000usize;
    let mut parse_ns = 0u128;
    let start = Instant::now();
    for chunk in 0..n / 16 {
        let t = Instant::now();
        let ops: Vec<WriteOp> = (0..16)
            .map(|i| {
                let body = format!(r#"{{"name":"user-{chunk}-{i}","age":{i},"tags":["bench","w8"],"payload":"{payload}"}}"#);
                WriteOp::Put {
                    id: DocId::Given(format!("users/{}-{chunk}", i * 4)),
                    document: ParsedDocument::parse(body.as_bytes()).unwrap(),
                    condition: Condition::None,
                }
            })
            .collect();
        parse_ns += t.elapsed().as_nanos();
        for r in db.write_each(ops) {
            r.unwrap();
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{n} docs in {secs:.2} s: {:.0} docs/s, {:.1} us/doc wall, parse {:.1} us/doc",
        n as f64 / secs,
        secs * 1e6 / n as f64,
        parse_ns as f64 / 1e3 / n as f64
    );
}
