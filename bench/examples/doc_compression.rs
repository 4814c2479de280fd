//! What compressing documents would save and cost (issue 41, part 3: "document
//! compression, LZ4 or zstd per page or per value, with the speed it costs").
//!
//! Two corpora, each document compacted as Kiln stores it:
//! - YCSB: the load phase's records (`kiln_bench::ycsb::load_record`) as the JSON
//!   YCSB's Kiln binding sends (ten fields of 100 random printable bytes);
//! - real JSON: the records of cargo's registry index cache
//!   (`~/.cargo/registry/index/*/.cache`: one JSON object per published crate version,
//!   its name, version, dependencies with their requirements, checksum, features,
//!   publication time; 200 B..8 KiB each), or every `*.json` object file of that size
//!   under the directory given.
//!
//! Per codec: the stored bytes over the raw bytes, and the time to compress and to
//! decompress one document (median of the corpus, one core). "per value" compresses
//! each document alone (what kiln-docs could do in `record::encode`); "per 8 KiB
//! page" compresses runs of documents of about a page (what the engine could do to
//! a leaf page), the bound of what per-page compression gives; "dict" is zstd per
//! value with a dictionary trained on the first 1,000 documents (kept beside the
//! data once per database).
//!
//! cargo run --release --manifest-path bench/Cargo.toml --example doc_compression -- [DIR] [N]

use kiln_bench::ycsb::load_record;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The JSON objects of cargo's index cache files under `dir` (a binary header,
/// then version and record strings separated by NUL bytes).
fn index_records(dir: &Path, out: &mut Vec<Vec<u8>>, limit: usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if out.len() >= limit {
            return;
        }
        let p = e.path();
        if p.is_dir() {
            index_records(&p, out, limit);
            continue;
        }
        let Ok(bytes) = std::fs::read(&p) else {
            continue;
        };
        for chunk in bytes.split(|b| *b == 0) {
            if out.len() >= limit {
                return;
            }
            if chunk.first() == Some(&b'{') && (200..8192).contains(&chunk.len()) {
                if let Ok(v @ serde_json::Value::Object(_)) =
                    serde_json::from_slice::<serde_json::Value>(chunk)
                {
                    out.push(serde_json::to_vec(&v).expect("a Value serializes"));
                }
            }
        }
    }
}

fn json_files(dir: &Path, out: &mut Vec<Vec<u8>>, limit: usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if out.len() >= limit {
            return;
        }
        let p = e.path();
        let Ok(m) = p.symlink_metadata() else {
            continue;
        };
        if m.is_dir() {
            json_files(&p, out, limit);
        } else if p.extension().is_some_and(|x| x == "json") && (200..8192).contains(&m.len()) {
            let Ok(bytes) = std::fs::read(&p) else {
                continue;
            };
            // Compacted, as Kiln stores a body; objects only (a document is one).
            if let Ok(v @ serde_json::Value::Object(_)) =
                serde_json::from_slice::<serde_json::Value>(&bytes)
            {
                out.push(serde_json::to_vec(&v).expect("a Value serializes"));
            }
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

struct Outcome {
    name: &'static str,
    stored: u64,
    compress_us: f64,
    decompress_us: f64,
}

fn per_value(
    name: &'static str,
    docs: &[Vec<u8>],
    c: &dyn Fn(&[u8]) -> Vec<u8>,
    d: &dyn Fn(&[u8], usize) -> Vec<u8>,
) -> Outcome {
    let (mut stored, mut ct, mut dt) = (0u64, Vec::new(), Vec::new());
    for doc in docs {
        let t = Instant::now();
        let z = c(doc);
        ct.push(t.elapsed().as_secs_f64() * 1e6);
        // A value that does not shrink would be stored as it is (one flag byte).
        stored += (z.len().min(doc.len()) + 1) as u64;
        let t = Instant::now();
        let back = d(&z, doc.len());
        dt.push(t.elapsed().as_secs_f64() * 1e6);
        assert_eq!(&back, doc, "{name}: the round trip changed a document");
    }
    Outcome {
        name,
        stored,
        compress_us: median(ct),
        decompress_us: median(dt),
    }
}

/// Documents concatenated into runs of about 8 KiB, each run compressed alone;
/// times are per document (the run's time over its documents).
fn per_page(
    name: &'static str,
    docs: &[Vec<u8>],
    c: &dyn Fn(&[u8]) -> Vec<u8>,
    d: &dyn Fn(&[u8], usize) -> Vec<u8>,
) -> Outcome {
    let (mut stored, mut ct, mut dt) = (0u64, Vec::new(), Vec::new());
    let mut page = Vec::new();
    let mut in_page = 0usize;
    let mut flush = |page: &mut Vec<u8>, n: &mut usize| {
        if page.is_empty() {
            return;
        }
        let t = Instant::now();
        let z = c(page);
        ct.push(t.elapsed().as_secs_f64() * 1e6 / *n as f64);
        stored += z.len().min(page.len()) as u64;
        let t = Instant::now();
        let back = d(&z, page.len());
        dt.push(t.elapsed().as_secs_f64() * 1e6 / *n as f64);
        assert_eq!(&back, page);
        page.clear();
        *n = 0;
    };
    for doc in docs {
        if !page.is_empty() && page.len() + doc.len() > 8192 {
            flush(&mut page, &mut in_page);
        }
        page.extend_from_slice(doc);
        in_page += 1;
    }
    flush(&mut page, &mut in_page);
    Outcome {
        name,
        stored,
        compress_us: median(ct),
        decompress_us: median(dt),
    }
}

fn report(corpus: &str, docs: &[Vec<u8>]) {
    let raw: u64 = docs.iter().map(|d| d.len() as u64).sum();
    let lz4c = |b: &[u8]| lz4_flex::compress(b);
    let lz4d = |b: &[u8], n: usize| lz4_flex::decompress(b, n).expect("lz4 round trip");
    // zstd's contexts made once and reused, as a store would keep one per thread
    // (making one per call costs more than compressing a 1 KB document).
    let z1 = std::cell::RefCell::new(zstd::bulk::Compressor::new(1).expect("zstd"));
    let z3 = std::cell::RefCell::new(zstd::bulk::Compressor::new(3).expect("zstd"));
    let zdx = std::cell::RefCell::new(zstd::bulk::Decompressor::new().expect("zstd"));
    let z1c = |b: &[u8]| z1.borrow_mut().compress(b).expect("zstd");
    let z3c = |b: &[u8]| z3.borrow_mut().compress(b).expect("zstd");
    let zd = |b: &[u8], n: usize| zdx.borrow_mut().decompress(b, n).expect("zstd round trip");
    let samples: Vec<&[u8]> = docs.iter().take(1000).map(|d| d.as_slice()).collect();
    let sizes: Vec<usize> = samples.iter().map(|s| s.len()).collect();
    let flat: Vec<u8> = samples.concat();
    let dict = zstd::dict::from_continuous(&flat, &sizes, 16 << 10).unwrap_or_default();
    let dcx = std::cell::RefCell::new(
        zstd::bulk::Compressor::with_dictionary(3, &dict).expect("zstd dict"),
    );
    let ddx = std::cell::RefCell::new(
        zstd::bulk::Decompressor::with_dictionary(&dict).expect("zstd dict"),
    );
    let dc = |b: &[u8]| dcx.borrow_mut().compress(b).expect("zstd dict");
    let dd = |b: &[u8], n: usize| {
        ddx.borrow_mut()
            .decompress(b, n)
            .expect("zstd dict round trip")
    };
    let outcomes = [
        per_value("lz4 per value", docs, &lz4c, &lz4d),
        per_value("zstd-1 per value", docs, &z1c, &zd),
        per_value("zstd-3 per value", docs, &z3c, &zd),
        per_value("zstd-3 + 16 KiB dict per value", docs, &dc, &dd),
        per_page("lz4 per 8 KiB page", docs, &lz4c, &lz4d),
        per_page("zstd-1 per 8 KiB page", docs, &z1c, &zd),
    ];
    println!(
        "\n{corpus}: {} documents, {} bytes (mean {} B)",
        docs.len(),
        raw,
        raw / docs.len().max(1) as u64
    );
    println!("| codec | stored / raw | compress us/doc (median) | decompress us/doc (median) |");
    println!("|---|---:|---:|---:|");
    for o in outcomes {
        println!(
            "| {} | {:.3} | {:.2} | {:.2} |",
            o.name,
            o.stored as f64 / raw as f64,
            o.compress_us,
            o.decompress_us
        );
        println!(
            "{}",
            serde_json::json!({"workload": "DOCZIP", "corpus": corpus, "codec": o.name,
                "documents": docs.len(), "raw_bytes": raw, "stored_bytes": o.stored,
                "ratio": o.stored as f64 / raw as f64,
                "compress_us_per_doc": o.compress_us, "decompress_us_per_doc": o.decompress_us})
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("bench/ has a parent")
        .to_path_buf();
    let n: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let ycsb: Vec<Vec<u8>> = (0..n as u64)
        .map(|k| {
            let rec = load_record(kiln_bench::workload::SEED, k);
            let map: serde_json::Map<String, serde_json::Value> = rec
                .into_iter()
                .map(|(f, v)| (f, serde_json::Value::String(v)))
                .collect();
            serde_json::to_vec(&map).expect("a map serializes")
        })
        .collect();
    report("YCSB records", &ycsb);
    let mut real = Vec::new();
    let source = match args.first() {
        Some(d) => {
            json_files(Path::new(d), &mut real, n);
            index_records(Path::new(d), &mut real, n);
            PathBuf::from(d)
        }
        None => {
            let index = dirs_home().join(".cargo/registry/index");
            index_records(&index, &mut real, n);
            if real.is_empty() {
                json_files(&repo.join("studio/node_modules"), &mut real, n);
                repo.join("studio/node_modules")
            } else {
                index
            }
        }
    };
    if real.is_empty() {
        println!("no JSON documents found under {}", source.display());
        return;
    }
    println!("\nreal JSON from {}", source.display());
    report("real JSON", &real);
}

fn dirs_home() -> PathBuf {
    std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from)
}
