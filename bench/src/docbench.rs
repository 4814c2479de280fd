//! W16 (full-text search) and W17 (aggregations) against the peers the issue names,
//! each system over its own client protocol in the same run: `kiln serve` over HTTP
//! (hyper), SQLite FTS5 in-process (rusqlite; W16 only) and PostgreSQL over TCP (the
//! sync `postgres` client). `kiln bench` measures the same workloads embedded, Kiln
//! against tantivy (W16) and alone (W17): crates/kiln-bench/src/searchbench.rs and
//! aggbench.rs; the corpus and the orders are theirs (kiln_bench::corpus).
//!
//! W16: the man pages as `{"title", "section", "body"}`.
//! - Kiln: bulk insert (`POST /dbs/{db}/bulk`), then the full-text index
//!   (body: english, title: standard) defined and timed until `GET
//!   /dbs/{db}/indexes/pages-text` says it is not stale; queries through `POST
//!   /dbs/{db}/queries`: `from pages where search(body, $q) limit 10 select title`
//!   (the peers' answer: the top 10's ids and titles and the count) and, as the
//!   issue wrote it, without `select` (whole documents, ~10 man pages per answer).
//! - SQLite: `fts5(title, body, tokenize='porter unicode61')`, WAL and
//!   synchronous=FULL as bench/'s SQLite elsewhere; the build is every insert in one
//!   transaction and its commit; queries `body : <text>` (Kiln searches the body only),
//!   top 10 by `bm25(t)` and a `count(*)`.
//! - PostgreSQL: a table with the generated column `tsv tsvector GENERATED ALWAYS AS
//!   (to_tsvector('english', title || ' ' || body)) STORED`, loaded with COPY, then
//!   `CREATE INDEX ... USING GIN (tsv)` (the index after the data: the build is the
//!   COPY plus the CREATE INDEX, each also reported on its own); synchronous_commit
//!   = on; queries `websearch_to_tsquery('english', $1)` (terms, phrases) or
//!   `to_tsquery('english', 'conf:*')` (prefixes), top 10 by `ts_rank` and a
//!   `count(*)`.
//!
//! W17: N orders (kiln_bench::corpus::order, the documents of `kiln bench` W17).
//! - Kiln: bulk insert, then the reduce index `orders-by-company` (group by company:
//!   count, sum(amount), max(amount)) timed until not stale; the grouped query's
//!   first page (limit 20) and every group (limit 1000).
//! - PostgreSQL: a jsonb table loaded with COPY (the load is all there is to build),
//!   then the plain `GROUP BY` over it, first 20 groups and every group. Not a
//!   materialized aggregate: the issue's comparison is the reduce index against
//!   PostgreSQL's GROUP BY.
//! - Each grouped query runs 200 times (50 with --quick) after one warming run,
//!   or fewer once 30 s have passed (at least 20): `{query}_runs` says how many.
//!
//! Checks: each engine's counts (W16: matches per query text; W17: every group's
//! count, sum and max in cents) go to the results file; the parent compares Kiln's
//! with each peer's ([`check`]): W17's must be equal (a difference fails the run),
//! W16's differ by the analyzers (stemmers, stop words, PostgreSQL also searching
//! the title) and the difference is reported.

use anyhow::{anyhow, bail, Context, Result};
use kiln_bench::corpus::{self, Page, PHRASES, PREFIXES, TERMS};
use rand::{rngs::SmallRng, SeedableRng};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

pub const WORKLOADS: &[&str] = &["W16", "W17"];

const DB: &str = "docs";
const TEXT_INDEX: &str = "pages-text";
const REDUCE_INDEX: &str = "orders-by-company";
const FIRST_PAGE: &str = "from orders group by company limit 20 \
     select company, count() as n, sum(amount) as total, max(amount) as top";
const ALL_GROUPS: &str = "from orders group by company limit 1000 \
     select company, count() as n, sum(amount) as total, max(amount) as top";
#[cfg(feature = "postgres")]
const PG_FIRST_PAGE: &str =
    "SELECT doc->>'company', count(*), sum((doc->>'amount')::numeric)::text, \
     max((doc->>'amount')::numeric)::text FROM orders GROUP BY 1 ORDER BY 1 LIMIT 20";
#[cfg(feature = "postgres")]
const PG_ALL_GROUPS: &str =
    "SELECT doc->>'company', count(*), sum((doc->>'amount')::numeric)::text, \
     max((doc->>'amount')::numeric)::text FROM orders GROUP BY 1 ORDER BY 1";
/// Bytes of NDJSON per bulk request (the server commits in batches of its own).
const BULK_BYTES: usize = 16 << 20;

/// Why `engine` does not run `workload` (None: it does).
pub fn not_applicable(engine: &str, workload: &str) -> Option<&'static str> {
    match (engine, workload) {
        ("kiln" | "postgres", _) => None,
        ("sqlite", "W16") => None,
        ("sqlite", _) => Some("W17's peer is PostgreSQL's GROUP BY (the issue's choice)"),
        (_, "W16") => {
            Some("W16's peers are SQLite FTS5 and PostgreSQL (tsvector + GIN), the issue's choice")
        }
        _ => Some("W17's peer is PostgreSQL's GROUP BY over jsonb (the issue's choice)"),
    }
}

/// Pages of W16 (2,000 with --quick, else up to 20,000 and 128 MB of text, as
/// `kiln bench` W16) and orders of W17 (100,000 / 1,000,000).
fn sizes(quick: bool) -> (usize, u64) {
    if quick {
        (2_000, 100_000)
    } else {
        (20_000, 1_000_000)
    }
}

/// Query rounds after one warming round (W16) and runs of each grouped query (W17).
fn rounds(quick: bool) -> (usize, usize) {
    if quick {
        (5, 50)
    } else {
        (30, 200)
    }
}

/// One job: `workload` against `engine` in `dir`, as a child's JSON object.
pub fn run(engine: &str, workload: &str, dir: &Path, quick: bool) -> Result<Value> {
    std::fs::create_dir_all(dir)?;
    let started = Instant::now();
    let (rows, mut extra) = match (workload, engine) {
        ("W16", _) => {
            let (limit, _) = sizes(quick);
            let (name, pages) = corpus::corpus(limit, 128 << 20).map_err(|e| anyhow!("{e}"))?;
            let mut f = match engine {
                "kiln" => w16_kiln(dir, &pages, quick)?,
                #[cfg(feature = "sqlite")]
                "sqlite" => w16_sqlite(dir, &pages, quick)?,
                #[cfg(feature = "postgres")]
                "postgres" => w16_postgres(dir, &pages, quick)?,
                other => bail!("W16 does not run {other}"),
            };
            let bytes: usize = pages.iter().map(|p| p.body.len() + p.title.len()).sum();
            f.extra.insert("corpus".into(), json!(name));
            f.extra.insert("documents".into(), json!(pages.len()));
            f.extra
                .insert("corpus_mb".into(), json!(bytes as f64 / 1e6));
            (w16_rows(&f, pages.len()), f.extra)
        }
        ("W17", _) => {
            let (_, orders) = sizes(quick);
            let f = match engine {
                "kiln" => w17_kiln(dir, orders, quick)?,
                #[cfg(feature = "postgres")]
                "postgres" => w17_postgres(dir, orders, quick)?,
                other => bail!("W17 does not run {other}"),
            };
            (w17_rows(&f), f.extra)
        }
        _ => bail!("unknown document workload {workload:?}"),
    };
    // The flat row of the results file: workload, engine and every figure.
    let mut flat = Map::new();
    flat.insert("workload".into(), json!(workload));
    flat.insert("engine".into(), json!(engine));
    for (k, v) in &extra {
        if v.is_number() || v.is_string() {
            flat.insert(k.clone(), v.clone());
        }
    }
    extra.insert("documents_row".into(), Value::Object(flat));
    Ok(json!({
        "seconds": started.elapsed().as_secs_f64(),
        "rows": rows,
        "extra": extra,
    }))
}

/// What one engine measured: figures by name, and the rest for the results file.
struct Figures {
    extra: Map<String, Value>,
}

impl Figures {
    fn new() -> Figures {
        Figures { extra: Map::new() }
    }
    fn set(&mut self, k: &str, v: impl Into<Value>) {
        self.extra.insert(k.into(), v.into());
    }
    fn get(&self, k: &str) -> Option<f64> {
        self.extra.get(k).and_then(Value::as_f64)
    }
}

fn row(name: &str, unit: &str, value: f64, lower: bool) -> Value {
    json!({ "row": name, "unit": unit, "value": value, "lower_is_better": lower })
}

fn w16_rows(f: &Figures, docs: usize) -> Vec<Value> {
    let mut rows = Vec::new();
    if let Some(s) = f.get("load_and_build_seconds") {
        rows.push(row("W16 load + build", "docs/s", docs as f64 / s, false));
    }
    if let Some(s) = f.get("load_and_then_build_seconds") {
        rows.push(row(
            "W16 load, then build",
            "docs/s",
            docs as f64 / s,
            false,
        ));
    }
    if let Some(s) = f.get("index_build_seconds") {
        rows.push(row(
            "W16 index build alone",
            "docs/s",
            docs as f64 / s,
            false,
        ));
    }
    for kind in ["term", "phrase", "prefix"] {
        for q in ["p50", "p99"] {
            if let Some(v) = f.get(&format!("{kind}_{q}_ms")) {
                rows.push(row(&format!("W16 {kind} {q}"), "ms", v, true));
            }
        }
    }
    for kind in ["term", "phrase", "prefix"] {
        if let Some(v) = f.get(&format!("{kind}_whole_docs_p50_ms")) {
            rows.push(row(
                &format!("W16 {kind} p50, whole documents"),
                "ms",
                v,
                true,
            ));
        }
    }
    rows
}

fn w17_rows(f: &Figures) -> Vec<Value> {
    let docs = f.get("documents").unwrap_or(0.0);
    let mut rows = Vec::new();
    if let Some(s) = f.get("insert_seconds") {
        rows.push(row("W17 insert", "docs/s", docs / s, false));
    }
    if let Some(s) = f.get("build_seconds") {
        rows.push(row("W17 reduce index build", "docs/s", docs / s, false));
    }
    for name in ["first_page", "all_groups"] {
        for q in ["p50", "p99"] {
            if let Some(v) = f.get(&format!("{name}_{q}_ms")) {
                let label = if name == "first_page" {
                    "first 20 groups"
                } else {
                    "every group"
                };
                rows.push(row(&format!("W17 {label} {q}"), "ms", v, true));
            }
        }
    }
    rows
}

fn quantiles(mut ms: Vec<f64>) -> (f64, f64) {
    ms.sort_by(f64::total_cmp);
    (
        kiln_bench::stats::quantile(&ms, 0.5).unwrap_or(f64::NAN),
        kiln_bench::stats::quantile(&ms, 0.99).unwrap_or(f64::NAN),
    )
}

fn kinds() -> [(&'static str, &'static [&'static str]); 3] {
    [("term", TERMS), ("phrase", PHRASES), ("prefix", PREFIXES)]
}

/// Times `query(text)` (returns the count and the rows on the page) for every text
/// of every kind, one warming round then `rounds`; records p50/p99 per kind under
/// `{kind}{suffix}_p50_ms` and, once, the count per text under `matches`.
fn time_queries(
    f: &mut Figures,
    rounds: usize,
    suffix: &str,
    mut query: impl FnMut(&str, &str) -> Result<(u64, usize)>,
) -> Result<()> {
    let mut matches = Map::new();
    for (kind, texts) in kinds() {
        let mut ms = Vec::new();
        for round in 0..=rounds {
            for text in texts {
                let t = Instant::now();
                let (count, on_page) = query(kind, text)?;
                let elapsed = t.elapsed().as_secs_f64() * 1e3;
                if on_page as u64 != count.min(10) {
                    bail!("{text}: {on_page} on the first page of {count} matches");
                }
                if round == 0 {
                    matches.insert(text.to_string(), json!(count));
                } else {
                    ms.push(elapsed);
                }
            }
        }
        let (p50, p99) = quantiles(ms);
        f.set(&format!("{kind}{suffix}_p50_ms"), p50);
        f.set(&format!("{kind}{suffix}_p99_ms"), p99);
    }
    if suffix.is_empty() {
        f.set("matches", Value::Object(matches));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------
// Kiln over HTTP
// ---------------------------------------------------------------------------------

/// `kiln serve` (started as the YCSB runner starts it) and one keep-alive connection.
struct Kiln {
    rt: tokio::runtime::Runtime,
    local: tokio::task::LocalSet,
    conn: crate::ycsb::KilnConn,
    port: u16,
    system: crate::ycsb::System,
}

impl Kiln {
    fn start(dir: &Path) -> Result<Kiln> {
        let system = crate::ycsb::System::start("kiln", dir)?;
        let crate::ycsb::System::Kiln { port, .. } = &system else {
            bail!("not a kiln serve");
        };
        let port = *port;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let local = tokio::task::LocalSet::new();
        let conn = local.block_on(&rt, crate::ycsb::KilnConn::connect(port))?;
        let mut k = Kiln {
            rt,
            local,
            conn,
            port,
            system,
        };
        k.call(
            hyper::Method::PUT,
            &format!("/dbs/{DB}"),
            Vec::new(),
            &[200, 201],
        )?;
        Ok(k)
    }

    fn reconnect(&mut self) -> Result<()> {
        let port = self.port;
        self.conn = self
            .local
            .block_on(&self.rt, crate::ycsb::KilnConn::connect(port))?;
        Ok(())
    }

    fn call(
        &mut self,
        method: hyper::Method,
        path: &str,
        body: Vec<u8>,
        ok: &[u16],
    ) -> Result<bytes::Bytes> {
        let ct = (!body.is_empty()).then_some("application/json");
        let Kiln {
            rt, local, conn, ..
        } = self;
        local.block_on(rt, conn.expect(method, path, ct, body, ok))
    }

    fn json(&mut self, method: hyper::Method, path: &str, body: &Value) -> Result<Value> {
        let b = if body.is_null() {
            Vec::new()
        } else {
            serde_json::to_vec(body)?
        };
        let out = self.call(method, path, b, &[200, 201])?;
        Ok(serde_json::from_slice(&out)?)
    }

    /// Streams `lines` (NDJSON `{"id","document"}`) through the bulk endpoint, a
    /// request per [`BULK_BYTES`]; checks every line was acknowledged.
    fn bulk(&mut self, lines: impl Iterator<Item = Vec<u8>>) -> Result<u64> {
        self.bulk_into(DB, lines)
    }

    /// [`Kiln::bulk`] into the database `db`.
    fn bulk_into(&mut self, db: &str, lines: impl Iterator<Item = Vec<u8>>) -> Result<u64> {
        let mut sent = 0u64;
        let mut body = Vec::with_capacity(BULK_BYTES + (1 << 20));
        let mut in_body = 0u64;
        let flush = |k: &mut Kiln, body: &mut Vec<u8>, n: &mut u64| -> Result<()> {
            if *n == 0 {
                return Ok(());
            }
            let out = k.call(
                hyper::Method::POST,
                &format!("/dbs/{db}/bulk"),
                std::mem::take(body),
                &[200],
            )?;
            // The bulk endpoint answers `Connection: close`.
            k.reconnect()?;
            let text = String::from_utf8_lossy(&out);
            let last = text
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("");
            let v: Value = serde_json::from_str(last)
                .with_context(|| format!("bulk insert's last line: {last}"))?;
            if v["done"] != json!(true) || v.get("error").is_some() {
                bail!("bulk insert: {last}");
            }
            if let Some(acked) = v["acked"].as_u64() {
                if acked != *n {
                    bail!("bulk insert acknowledged {acked} of {n} documents: {last}");
                }
            }
            *n = 0;
            Ok(())
        };
        for line in lines {
            body.extend_from_slice(&line);
            body.push(b'\n');
            in_body += 1;
            sent += 1;
            if body.len() >= BULK_BYTES {
                flush(self, &mut body, &mut in_body)?;
            }
        }
        flush(self, &mut body, &mut in_body)?;
        Ok(sent)
    }

    /// Defines an index and waits until it is not stale; the seconds it took.
    fn build_index(&mut self, name: &str, definition: &Value) -> Result<f64> {
        let path = format!("/dbs/{DB}/indexes/{name}");
        let t = Instant::now();
        self.json(hyper::Method::PUT, &path, definition)?;
        self.wait_non_stale(&path, t)
    }

    /// Polls the index at `path` until it is not stale; the seconds since `t`.
    fn wait_non_stale(&mut self, path: &str, t: Instant) -> Result<f64> {
        let name = path.rsplit('/').next().unwrap_or(path);
        loop {
            let info = self.json(hyper::Method::GET, path, &Value::Null)?;
            if info["stale"] == json!(false) {
                return Ok(t.elapsed().as_secs_f64());
            }
            if t.elapsed() > Duration::from_secs(3600) {
                bail!("{name} still stale after an hour: {info}");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn query(&mut self, body: &Value) -> Result<Value> {
        let v = self.json(hyper::Method::POST, &format!("/dbs/{DB}/queries"), body)?;
        if v["stale"] == json!(true) {
            bail!("a stale answer after the index caught up: {}", v["index"]);
        }
        Ok(v)
    }

    fn finish(self, f: &mut Figures) {
        f.set("server_cpu_seconds", self.system.server_cpu_seconds());
        f.set(
            "settings",
            json!("kiln serve (its defaults), one HTTP/1.1 keep-alive connection (hyper)"),
        );
    }
}

/// The pages as the bulk endpoint's NDJSON lines.
fn page_lines(pages: &[Page]) -> impl Iterator<Item = Vec<u8>> + '_ {
    pages.iter().enumerate().map(|(i, p)| {
        serde_json::to_vec(&json!({"id": format!("pages/{i:06}"),
            "document": {"title": p.title, "section": p.section, "body": p.body}}))
        .expect("a page serializes")
    })
}

fn text_index_definition() -> Value {
    json!({"collection": "pages", "fields": [
        {"path": "body", "search": true, "analyzer": "english"},
        {"path": "title", "search": true}]})
}

fn w16_kiln(dir: &Path, pages: &[Page], quick: bool) -> Result<Figures> {
    let mut f = Figures::new();
    let mut k = Kiln::start(dir)?;
    let t = Instant::now();
    k.bulk(page_lines(pages))?;
    let insert = t.elapsed().as_secs_f64();
    let build = k.build_index(TEXT_INDEX, &text_index_definition())?;
    f.set("insert_seconds", insert);
    f.set("index_build_seconds", build);
    f.set("load_and_then_build_seconds", insert + build);
    // As SQLite's FTS5 table and PostgreSQL's generated column exist before their
    // rows arrive, the headline figure defines the index first, then loads, and
    // stops when the index has caught up: indexing overlaps the load (the indexer
    // is its own thread). The same pages go into a second database.
    let live = format!("{DB}_index_first");
    k.call(
        hyper::Method::PUT,
        &format!("/dbs/{live}"),
        Vec::new(),
        &[200, 201],
    )?;
    let t = Instant::now();
    let path = format!("/dbs/{live}/indexes/{TEXT_INDEX}");
    k.json(hyper::Method::PUT, &path, &text_index_definition())?;
    k.bulk_into(&live, page_lines(pages))?;
    let loaded = t.elapsed().as_secs_f64();
    let caught_up = k.wait_non_stale(&path, t)?;
    f.set("index_first_insert_seconds", loaded);
    f.set("load_and_build_seconds", caught_up);
    let (rounds, _) = rounds(quick);
    for (suffix, select) in [("", " select title"), ("_whole_docs", "")] {
        let text = format!("from pages where search(body, $q) limit 10{select}");
        time_queries(&mut f, rounds, suffix, |_, q| {
            let v = k.query(&json!({"query": text, "params": {"q": q}}))?;
            let total = v["total"]
                .as_u64()
                .ok_or_else(|| anyhow!("no total: {v}"))?;
            Ok((total, v["results"].as_array().map_or(0, Vec::len)))
        })?;
    }
    f.set(
        "query",
        json!("POST /dbs/docs/queries {\"query\": \"from pages where search(body, $q) limit 10 select title\"} (and without select: whole documents)"),
    );
    k.finish(&mut f);
    Ok(f)
}

fn w17_kiln(dir: &Path, orders: u64, quick: bool) -> Result<Figures> {
    let mut f = Figures::new();
    let mut k = Kiln::start(dir)?;
    let mut rng = SmallRng::seed_from_u64(0);
    let t = Instant::now();
    k.bulk((0..orders).map(|i| {
        let doc = corpus::order(&mut rng, i);
        let mut line = format!("{{\"id\":\"orders/{i:09}\",\"document\":").into_bytes();
        line.extend_from_slice(&doc);
        line.push(b'}');
        line
    }))?;
    f.set("documents", orders);
    f.set("insert_seconds", t.elapsed().as_secs_f64());
    let build = k.build_index(
        REDUCE_INDEX,
        &json!({"collection": "orders", "group_by": ["company"],
                "aggregate": {"n": "count()", "total": "sum(amount)", "top": "max(amount)"}}),
    )?;
    f.set("build_seconds", build);
    let (_, runs) = rounds(quick);
    let mut groups = Vec::new();
    for (name, text, want) in [
        ("first_page", FIRST_PAGE, 20),
        ("all_groups", ALL_GROUPS, 0),
    ] {
        let mut ms = Vec::new();
        let budget = Instant::now();
        for i in 0..=runs {
            if enough(i, budget) {
                break;
            }
            let t = Instant::now();
            let v = k.query(&json!({ "query": text }))?;
            let elapsed = t.elapsed().as_secs_f64() * 1e3;
            if v["index"] != json!(REDUCE_INDEX) {
                bail!(
                    "{name}: answered by {} instead of the reduce index",
                    v["index"]
                );
            }
            let results = v["results"].as_array().cloned().unwrap_or_default();
            if want > 0 && results.len() != want {
                bail!("{name}: {} groups on the page", results.len());
            }
            if i == 0 {
                if name == "all_groups" {
                    for g in &results {
                        groups.push(json!([
                            g["company"],
                            g["n"].as_u64().unwrap_or(0),
                            cents_of_number(&g["total"])?,
                            cents_of_number(&g["top"])?,
                        ]));
                    }
                }
            } else {
                ms.push(elapsed);
            }
        }
        f.set(&format!("{name}_runs"), ms.len());
        let (p50, p99) = quantiles(ms);
        f.set(&format!("{name}_p50_ms"), p50);
        f.set(&format!("{name}_p99_ms"), p99);
    }
    f.set("groups", groups.len());
    f.set("group_figures", Value::Array(groups));
    k.finish(&mut f);
    Ok(f)
}

/// Whether a W17 query has run often enough: after 20 timed runs once 30 s have
/// passed (PostgreSQL's GROUP BY over 1,000,000 rows takes about a second; 200 runs
/// of each query would take minutes).
fn enough(i: usize, since: Instant) -> bool {
    i > 20 && since.elapsed() > Duration::from_secs(30)
}

/// A JSON number with at most 2 decimals as cents.
fn cents_of_number(v: &Value) -> Result<i64> {
    let x = v.as_f64().ok_or_else(|| anyhow!("not a number: {v}"))?;
    Ok((x * 100.0).round() as i64)
}

/// A decimal's text (`1234.5`, `1234.56`, `-3`) as cents, exactly.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
fn cents_of_text(s: &str) -> Result<i64> {
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    let frac = frac.trim_end_matches('0');
    if frac.len() > 2 {
        bail!("{s}: more than 2 decimals");
    }
    let neg = int.starts_with('-');
    let whole: i64 = int.trim_start_matches('-').parse()?;
    let f: i64 = format!("{frac:0<2}").parse()?;
    let c = whole * 100 + f;
    Ok(if neg { -c } else { c })
}

// ---------------------------------------------------------------------------------
// SQLite FTS5
// ---------------------------------------------------------------------------------

#[cfg(feature = "sqlite")]
fn w16_sqlite(dir: &Path, pages: &[Page], quick: bool) -> Result<Figures> {
    use rusqlite::{params, Connection};
    let mut f = Figures::new();
    let mut conn = Connection::open(dir.join("fts.sqlite"))?;
    let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
    anyhow::ensure!(mode.eq_ignore_ascii_case("wal"), "journal_mode is {mode}");
    conn.pragma_update(None, "synchronous", "FULL")?;
    let version: String = conn.query_row("SELECT sqlite_version()", [], |r| r.get(0))?;
    let fts5: i64 = conn.query_row("SELECT sqlite_compileoption_used('ENABLE_FTS5')", [], |r| {
        r.get(0)
    })?;
    if fts5 != 1 {
        bail!("the bundled SQLite {version} has no FTS5");
    }
    const TABLE: &str =
        "CREATE VIRTUAL TABLE t USING fts5(title, body, tokenize='porter unicode61')";
    let t = Instant::now();
    conn.execute(TABLE, [])?;
    let tx = conn.transaction()?;
    {
        let mut st = tx.prepare("INSERT INTO t (rowid, title, body) VALUES (?1, ?2, ?3)")?;
        for (i, p) in pages.iter().enumerate() {
            st.execute(params![i as i64, p.title, p.body])?;
        }
    }
    tx.commit()?;
    let build = t.elapsed().as_secs_f64();
    f.set("load_and_build_seconds", build);
    let (rounds, _) = rounds(quick);
    let mut top = conn.prepare(
        "SELECT rowid, title, bm25(t) FROM t WHERE t MATCH ?1 ORDER BY bm25(t) LIMIT 10",
    )?;
    let mut count = conn.prepare("SELECT count(*) FROM t WHERE t MATCH ?1")?;
    time_queries(&mut f, rounds, "", |_, q| {
        // Kiln's texts are FTS5's syntax too ("a phrase", prefix*); the column
        // filter keeps to the body, as Kiln's search(body, ...).
        let m = format!("body : {q}");
        let mut on_page = 0;
        let mut rows = top.query(params![m])?;
        while let Some(r) = rows.next()? {
            let _: (i64, String, f64) = (r.get(0)?, r.get(1)?, r.get(2)?);
            on_page += 1;
        }
        let n: i64 = count.query_row(params![m], |r| r.get(0))?;
        Ok((n as u64, on_page))
    })?;
    drop((top, count));
    let bytes = std::fs::metadata(dir.join("fts.sqlite")).map_or(0, |m| m.len());
    f.set("database_mb", bytes as f64 / 1e6);
    f.set(
        "settings",
        json!({"version": version, "journal_mode": "WAL", "synchronous": "FULL",
               "table": TABLE, "build": "every page inserted in one transaction, then its commit",
               "query": "SELECT rowid, title, bm25(t) FROM t WHERE t MATCH 'body : <text>' ORDER BY bm25(t) LIMIT 10; SELECT count(*) FROM t WHERE t MATCH 'body : <text>'"}),
    );
    Ok(f)
}

// ---------------------------------------------------------------------------------
// PostgreSQL
// ---------------------------------------------------------------------------------

#[cfg(feature = "postgres")]
struct Pg {
    client: postgres::Client,
    server: crate::engines::PgTcpServer,
}

#[cfg(feature = "postgres")]
impl Pg {
    fn start(dir: &Path) -> Result<Pg> {
        let server = crate::engines::PgTcpServer::start(dir).map_err(|e| {
            crate::engines::Unavailable(format!("PostgreSQL could not start: {e:#}"))
        })?;
        let client = postgres::Config::new()
            .host("127.0.0.1")
            .port(server.port)
            .user("postgres")
            .dbname("postgres")
            .application_name("kiln-bench-docs")
            .connect(postgres::NoTls)
            .context("connecting to PostgreSQL over TCP")?;
        Ok(Pg { client, server })
    }

    /// COPY `rows` (each a line of COPY's text format) into `target`.
    fn copy(&mut self, target: &str, rows: impl Iterator<Item = String>) -> Result<()> {
        use std::io::Write;
        let mut w = self.client.copy_in(&format!("COPY {target} FROM STDIN"))?;
        let mut buf = Vec::with_capacity(1 << 20);
        for r in rows {
            buf.extend_from_slice(r.as_bytes());
            buf.push(b'\n');
            if buf.len() >= 1 << 20 {
                w.write_all(&buf)?;
                buf.clear();
            }
        }
        w.write_all(&buf)?;
        w.finish()?;
        Ok(())
    }

    fn settings(&mut self) -> Value {
        let mut s = Map::new();
        for name in crate::engines::PG_REPORTED_SETTINGS.iter().chain(&[
            "maintenance_work_mem",
            "work_mem",
            "max_parallel_workers_per_gather",
        ]) {
            if let Ok(row) = self.client.query_one("SELECT current_setting($1)", &[name]) {
                s.insert(name.to_string(), json!(row.get::<_, String>(0)));
            }
        }
        s.insert("version".into(), json!(self.server.version()));
        Value::Object(s)
    }
}

/// A value in COPY's text format.
#[cfg(feature = "postgres")]
fn copy_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            // PostgreSQL's text holds no NUL.
            '\0' => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(feature = "postgres")]
const PG_PAGES_TABLE: &str = "CREATE TABLE pages (id int PRIMARY KEY, title text NOT NULL, \
    section text NOT NULL, body text NOT NULL, tsv tsvector GENERATED ALWAYS AS \
    (to_tsvector('english', title || ' ' || body)) STORED)";
#[cfg(feature = "postgres")]
const PG_PAGES_INDEX: &str = "CREATE INDEX pages_tsv ON pages USING GIN (tsv)";

#[cfg(feature = "postgres")]
fn w16_postgres(dir: &Path, pages: &[Page], quick: bool) -> Result<Figures> {
    let mut f = Figures::new();
    let mut pg = Pg::start(dir)?;
    pg_load_pages(&mut pg, pages, &mut f)?;
    pg_time_searches(&mut pg, quick, &mut f)?;
    let size: i64 = pg
        .client
        .query_one("SELECT pg_total_relation_size('pages')", &[])?
        .get(0);
    let gin: i64 = pg
        .client
        .query_one("SELECT pg_relation_size('pages_tsv')", &[])?
        .get(0);
    f.set("table_and_indexes_mb", size as f64 / 1e6);
    f.set("gin_index_mb", gin as f64 / 1e6);
    let settings = pg.settings();
    f.set(
        "settings",
        json!({"server": settings, "table": PG_PAGES_TABLE, "index": PG_PAGES_INDEX,
               "build": "COPY of every page (the tsvector computed as each row goes in), then CREATE INDEX (GIN); each autocommit, durable",
               "query": "websearch_to_tsquery('english', $1) (terms, phrases) or to_tsquery('english', 'prefix:*'); top 10 by ts_rank DESC and a count(*)",
               "client": "the postgres crate over loopback TCP"}),
    );
    Ok(f)
}

/// W16's build on PostgreSQL: the table, the pages COPied in and the GIN index
/// created, each timed; then ANALYZE (not timed).
#[cfg(feature = "postgres")]
fn pg_load_pages(pg: &mut Pg, pages: &[Page], f: &mut Figures) -> Result<()> {
    pg.client.batch_execute(PG_PAGES_TABLE)?;
    let t = Instant::now();
    pg.copy(
        "pages (id, title, section, body)",
        pages.iter().enumerate().map(|(i, p)| {
            format!(
                "{i}\t{}\t{}\t{}",
                copy_text(&p.title),
                copy_text(&p.section),
                copy_text(&p.body)
            )
        }),
    )?;
    let copy = t.elapsed().as_secs_f64();
    let t = Instant::now();
    pg.client.batch_execute(PG_PAGES_INDEX)?;
    let index = t.elapsed().as_secs_f64();
    f.set("insert_seconds", copy);
    f.set("index_build_seconds", index);
    f.set("load_and_build_seconds", copy + index);
    pg.client.batch_execute("ANALYZE pages")?;
    Ok(())
}

/// W16's queries on PostgreSQL: top 10 by ts_rank and the count, through prepared
/// statements (websearch_to_tsquery, or to_tsquery for the prefixes).
#[cfg(feature = "postgres")]
fn pg_time_searches(pg: &mut Pg, quick: bool, f: &mut Figures) -> Result<()> {
    let top_web = pg.client.prepare(
        "SELECT id, title, ts_rank(tsv, q) AS r FROM pages, websearch_to_tsquery('english', $1) q \
         WHERE tsv @@ q ORDER BY r DESC LIMIT 10",
    )?;
    let count_web = pg
        .client
        .prepare("SELECT count(*) FROM pages WHERE tsv @@ websearch_to_tsquery('english', $1)")?;
    let top_prefix = pg.client.prepare(
        "SELECT id, title, ts_rank(tsv, q) AS r FROM pages, to_tsquery('english', $1) q \
         WHERE tsv @@ q ORDER BY r DESC LIMIT 10",
    )?;
    let count_prefix = pg
        .client
        .prepare("SELECT count(*) FROM pages WHERE tsv @@ to_tsquery('english', $1)")?;
    let (rounds, _) = rounds(quick);
    let client = &mut pg.client;
    time_queries(f, rounds, "", |kind, q| {
        let (top, count, text) = if kind == "prefix" {
            // conf* -> conf:*
            let p = q.trim_end_matches('*');
            (&top_prefix, &count_prefix, format!("{p}:*"))
        } else {
            (&top_web, &count_web, q.to_string())
        };
        let rows = client.query(top, &[&text])?;
        for r in &rows {
            let _: (i32, &str, f32) = (r.get(0), r.get(1), r.get(2));
        }
        let n: i64 = client.query_one(count, &[&text])?.get(0);
        Ok((n as u64, rows.len()))
    })
}

#[cfg(feature = "postgres")]
fn w17_postgres(dir: &Path, orders: u64, quick: bool) -> Result<Figures> {
    let mut f = Figures::new();
    let mut pg = Pg::start(dir)?;
    const TABLE: &str = "CREATE TABLE orders (id text PRIMARY KEY, doc jsonb NOT NULL)";
    pg.client.batch_execute(TABLE)?;
    let mut rng = SmallRng::seed_from_u64(0);
    let t = Instant::now();
    pg.copy(
        "orders (id, doc)",
        (0..orders).map(|i| {
            let doc = String::from_utf8(corpus::order(&mut rng, i)).expect("JSON is UTF-8");
            format!("orders/{i:09}\t{}", copy_text(&doc))
        }),
    )?;
    f.set("documents", orders);
    f.set("insert_seconds", t.elapsed().as_secs_f64());
    pg.client.batch_execute("VACUUM ANALYZE orders")?;
    let (_, runs) = rounds(quick);
    let mut groups = Vec::new();
    for (name, sql, want) in [
        ("first_page", PG_FIRST_PAGE, 20),
        ("all_groups", PG_ALL_GROUPS, 0),
    ] {
        let st = pg.client.prepare(sql)?;
        let mut ms = Vec::new();
        let budget = Instant::now();
        for i in 0..=runs {
            if enough(i, budget) {
                break;
            }
            let t = Instant::now();
            let rows = pg.client.query(&st, &[])?;
            let elapsed = t.elapsed().as_secs_f64() * 1e3;
            if want > 0 && rows.len() != want {
                bail!("{name}: {} groups", rows.len());
            }
            if i == 0 {
                if name == "all_groups" {
                    for r in &rows {
                        let (company, n, total, top): (&str, i64, &str, &str) =
                            (r.get(0), r.get(1), r.get(2), r.get(3));
                        groups.push(json!([
                            company,
                            n,
                            cents_of_text(total)?,
                            cents_of_text(top)?
                        ]));
                    }
                }
            } else {
                ms.push(elapsed);
            }
        }
        f.set(&format!("{name}_runs"), ms.len());
        let (p50, p99) = quantiles(ms);
        f.set(&format!("{name}_p50_ms"), p50);
        f.set(&format!("{name}_p99_ms"), p99);
    }
    f.set("groups", groups.len());
    f.set("group_figures", Value::Array(groups));
    let settings = pg.settings();
    f.set(
        "settings",
        json!({"server": settings, "table": TABLE,
               "load": "COPY of every order, then VACUUM ANALYZE (not timed); no index beyond the primary key and no materialized aggregate: the plain GROUP BY",
               "first_page": PG_FIRST_PAGE, "all_groups": PG_ALL_GROUPS,
               "client": "the postgres crate over loopback TCP, prepared statements"}),
    );
    Ok(f)
}

// ---------------------------------------------------------------------------------
// Kiln against each peer
// ---------------------------------------------------------------------------------

/// The first run's extra of `engine` for `workload`, from the collected cells.
fn extra_of<'a>(
    cells: &'a BTreeMap<String, BTreeMap<String, crate::Cell>>,
    workload: &str,
    engine: &str,
) -> Option<&'a Value> {
    cells
        .iter()
        .filter(|(row, _)| row.starts_with(&format!("{workload} ")))
        .find_map(|(_, by)| by.get(engine).and_then(|c| c.extras.first()))
}

/// Compares Kiln's answers with each peer's: W16's match counts (reported: the
/// analyzers differ), W17's groups (must be equal: an error otherwise). Also Kiln's
/// ratio to each peer on every row. Returns (the results file's section, errors
/// by workload and engine, lines to print).
pub fn check(
    cells: &BTreeMap<String, BTreeMap<String, crate::Cell>>,
) -> (Value, Vec<(String, String, String)>, Vec<String>) {
    let mut checks = Checks::default();
    checks.w16_matches(cells);
    checks.w17_groups(cells);
    checks.kiln_over_each_peer(cells);
    (Value::Object(checks.section), checks.errors, checks.lines)
}

/// What [`check`] gathers: the results file's section, the errors (workload,
/// engine, message) and the lines to print.
#[derive(Default)]
struct Checks {
    section: Map<String, Value>,
    errors: Vec<(String, String, String)>,
    lines: Vec<String>,
}

/// Kiln's and a peer's matches over the texts of one kind: (Kiln's total, the
/// peer's total, the largest relative difference of one text and that text).
fn kind_matches<'t>(kiln: &Value, peer: &Value, texts: &[&'t str]) -> (u64, u64, (f64, &'t str)) {
    let (mut k_sum, mut p_sum, mut worst) = (0u64, 0u64, (0.0f64, ""));
    for text in texts {
        let k = kiln["matches"][*text].as_u64().unwrap_or(0);
        let q = peer["matches"][*text].as_u64().unwrap_or(0);
        k_sum += k;
        p_sum += q;
        let rel = (q as f64 - k as f64) / (k.max(1) as f64);
        if worst.1.is_empty() || rel.abs() > worst.0.abs() {
            worst = (rel, text);
        }
    }
    (k_sum, p_sum, worst)
}

impl Checks {
    /// W16: the matches per text, Kiln's against each peer's.
    fn w16_matches(&mut self, cells: &BTreeMap<String, BTreeMap<String, crate::Cell>>) {
        let Some(kiln) = extra_of(cells, "W16", "kiln") else {
            return;
        };
        for peer in ["sqlite", "postgres"] {
            let Some(p) = extra_of(cells, "W16", peer) else {
                continue;
            };
            let mut per_kind = Map::new();
            for (kind, texts) in kinds() {
                let (k_sum, p_sum, worst) = kind_matches(kiln, p, texts);
                let rel = (p_sum as f64 - k_sum as f64) / (k_sum.max(1) as f64);
                per_kind.insert(
                    kind.into(),
                    json!({"kiln_matches": k_sum, "peer_matches": p_sum,
                           "difference": rel, "largest_text_difference": worst.0,
                           "largest_difference_text": worst.1}),
                );
                self.lines.push(format!(
                    "W16 {kind}: {peer} found {p_sum} matches over the {} texts, Kiln {k_sum} \
                     ({:+.1}%; largest {:+.1}% for {})",
                    texts.len(),
                    rel * 100.0,
                    worst.0 * 100.0,
                    worst.1
                ));
            }
            self.section.insert(
                format!("W16 kiln vs {peer} matches"),
                Value::Object(per_kind),
            );
        }
    }

    /// W17: every group equal, Kiln's and PostgreSQL's.
    fn w17_groups(&mut self, cells: &BTreeMap<String, BTreeMap<String, crate::Cell>>) {
        let (Some(kiln), Some(pg)) = (
            extra_of(cells, "W17", "kiln"),
            extra_of(cells, "W17", "postgres"),
        ) else {
            return;
        };
        let (k, p) = (&kiln["group_figures"], &pg["group_figures"]);
        let equal = k == p && k.as_array().is_some_and(|a| !a.is_empty());
        let n = k.as_array().map_or(0, Vec::len);
        self.section.insert(
            "W17 kiln vs postgres groups".into(),
            json!({"groups": n, "equal": equal}),
        );
        if equal {
            self.lines.push(format!(
                "W17: Kiln's and PostgreSQL's {n} groups are equal (count, sum and max of every company, in cents)"
            ));
        } else {
            let first = k
                .as_array()
                .into_iter()
                .flatten()
                .zip(p.as_array().into_iter().flatten())
                .find(|(a, b)| a != b)
                .map(|(a, b)| format!("Kiln {a} vs PostgreSQL {b}"))
                .unwrap_or_else(|| format!("{} groups vs {}", n, p.as_array().map_or(0, Vec::len)));
            let msg = format!("W17 groups differ from PostgreSQL's: {first}");
            self.lines.push(msg.clone());
            self.errors
                .push(("W17".to_string(), "kiln".to_string(), msg));
        }
    }

    /// Kiln over each peer, row by row (> 1: Kiln ahead).
    fn kiln_over_each_peer(&mut self, cells: &BTreeMap<String, BTreeMap<String, crate::Cell>>) {
        let mut ratios = Map::new();
        for (row, by) in cells {
            if !(row.starts_with("W16 ") || row.starts_with("W17 ")) {
                continue;
            }
            let Some(kc) = by.get("kiln") else { continue };
            let k = kiln_bench::stats::median(&kc.values);
            let mut r = Map::new();
            for (peer, pc) in by.iter().filter(|(e, _)| *e != "kiln") {
                let p = kiln_bench::stats::median(&pc.values);
                let ratio = if kc.lower_is_better { p / k } else { k / p };
                r.insert(peer.clone(), json!(ratio));
            }
            if !r.is_empty() {
                self.lines.push(format!(
                    "{row}: Kiln / {}",
                    r.iter()
                        .map(|(p, v)| format!("{p} {:.2}x", v.as_f64().unwrap_or(f64::NAN)))
                        .collect::<Vec<_>>()
                        .join(", Kiln / ")
                ));
                ratios.insert(row.clone(), Value::Object(r));
            }
        }
        self.section.insert(
            "kiln_over_each_peer".into(),
            json!({"meaning": "Kiln's speed over the peer's (for ms, the peer's time over Kiln's): > 1 means Kiln is ahead", "rows": ratios}),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_become_cents() {
        assert_eq!(cents_of_text("1234.56").unwrap(), 123_456);
        assert_eq!(cents_of_text("1234.5").unwrap(), 123_450);
        assert_eq!(cents_of_text("1234.500").unwrap(), 123_450);
        assert_eq!(cents_of_text("7").unwrap(), 700);
        assert_eq!(cents_of_text("-0.05").unwrap(), -5);
        assert!(cents_of_text("1.234").is_err());
        assert_eq!(cents_of_number(&json!(5023412.34)).unwrap(), 502_341_234);
        assert_eq!(cents_of_number(&json!(5.1)).unwrap(), 510);
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn copy_text_escapes() {
        assert_eq!(copy_text("a\\b\tc\nd\re\0f"), "a\\\\b\\tc\\nd\\ref");
    }
}
