//! What `kiln bench` prints: the raw disk's line and the table's header, then per
//! workload variant one row (or one JSON object with `--json`) and, for the workloads
//! with targets, a line of their figures against the targets.

use crate::rawdisk::RawDiskResult;
use crate::run::Run;
use crate::storagebench::W1_PROPOSED_EXCESS_US;
use serde_json::{json, Map, Value};
use std::path::Path;

/// The raw 16 KiB durable write measured at the start of the run: the medians of
/// its samples.
pub struct RawFigures {
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub direct_io: bool,
}

/// The raw disk's line (the median mean; the first sample's p50 and p99) and the
/// table's header (not with `--json`).
pub fn print_header(raw: &RawFigures, first: &RawDiskResult, dir: &Path) {
    println!(
        "raw disk: 16 KiB {} write: {:.3} ms/write (mean; p50 {:.3}, p99 {:.3}), dir {}",
        if raw.direct_io {
            "O_DIRECT|O_DSYNC"
        } else {
            "pwrite+fdatasync (O_DIRECT refused)"
        },
        raw.mean_ms,
        first.p50_ms,
        first.p99_ms,
        dir.display()
    );
    println!(
        "{:<8} {:>4} {:>11} {:>10} {:>8} {:>10} {:>28} {:>9} {:>9} {:>7}",
        "workload",
        "runs",
        "ops/s",
        "ms/commit",
        "x raw",
        "jrnl B/op",
        "body B/op full|diff|diff+lz4",
        "p50 us",
        "p99 us",
        "group"
    );
}

/// One workload variant's row (or JSON object) and its lines against targets.
pub fn report(
    wl: &str,
    label: &str,
    m: &Run,
    runs: usize,
    raw: &RawFigures,
    as_json: bool,
    quick: bool,
) {
    let (raw_ms, raw_direct) = (raw.mean_ms, raw.direct_io);
    let ms_per_commit = m.seconds * 1e3 / m.commits as f64;
    if as_json {
        let mut obj = Map::new();
        obj.insert("workload".into(), json!(wl));
        obj.insert("runs".into(), json!(runs));
        obj.insert("ops".into(), json!(m.ops));
        obj.insert("commits".into(), json!(m.commits));
        obj.insert("seconds".into(), json!(m.seconds));
        obj.insert("ops_per_sec".into(), json!(m.ops_per_sec()));
        obj.insert("ms_per_commit".into(), json!(ms_per_commit));
        obj.insert("raw_disk_ms_per_write".into(), json!(raw_ms));
        obj.insert("raw_disk_p50_ms_per_write".into(), json!(raw.p50_ms));
        obj.insert("raw_disk_direct_io".into(), json!(raw_direct));
        obj.insert("ratio_to_raw_write".into(), json!(ms_per_commit / raw_ms));
        obj.insert("quick".into(), json!(quick));
        obj.extend(m.extra.clone());
        println!("{}", Value::Object(obj));
        return;
    }
    let f = |k: &str| m.extra.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN);
    if let Some(ratio) = m.extra.get("ratio_to_redis").and_then(Value::as_f64) {
        println!(
            "         {label}: {:.0} requests/s vs Redis {} (AOF, appendfsync always) {:.0}/s \
             measured alongside: {ratio:.2}x (target >= 1.0x); Redis p99 {:.0} us, server CPU \
             {:.1} us per request",
            m.ops_per_sec(),
            m.extra["redis_version"].as_str().unwrap_or("?"),
            f("redis_requests_per_sec"),
            f("redis_p99_us"),
            f("redis_server_cpu_us_per_request"),
        );
    }
    if let Some(ratio) = m
        .extra
        .get("ratio_to_raw_write_around_run")
        .and_then(Value::as_f64)
    {
        println!(
            "         {label}: raw 16 KiB durable write {:.3} ms before and {:.3} ms after the \
             run: {ratio:.2}x of their mean (target <= 1.25x), {:.0} us over it (proposed \
             target <= {W1_PROPOSED_EXCESS_US} us)",
            f("raw_disk_ms_before_run"),
            f("raw_disk_ms_after_run"),
            f("excess_over_raw_write_around_run_us"),
        );
    }
    if let Some(open_ms) = m.extra.get("open_ms").and_then(Value::as_f64) {
        println!(
            "         {label}: kill -9 with {:.0} MiB of journal ({} records replayed): open {open_ms:.0} ms, \
             first read {:.0} ms (target <= 1000 ms)",
            f("journal_bytes_written") / (1u64 << 20) as f64,
            f("records_replayed_on_open"),
            f("first_read_ms"),
        );
    }
    if m.extra.contains_key("backup_ratio_to_slower_disk") {
        crate::backupbench::report(label, m);
    }
    if let Some(why) = m.extra.get("redis_skipped").and_then(Value::as_str) {
        println!("         {label}: Redis peer skipped: {why}");
    }
    if let Some(ratio) = m.extra.get("ratio_to_w8").and_then(Value::as_f64) {
        let mib = |k: &str| f(k) / (1u64 << 20) as f64;
        println!(
            "         {label}: {:.0} documents/s in one bulk insert = {ratio:.2}x W8's {:.0} PUTs/s \
             (targets >= 150,000/s, >= 4x); server RSS growth {:.0} MiB (heap {:.0} MiB; \
             target <= 256); rate by tenth, last/first {:.2}",
            m.ops_per_sec(),
            f("w8_requests_per_sec"),
            mib("peak_rss_growth_bytes"),
            mib("peak_rss_anon_growth_bytes"),
            f("last_tenth_to_first")
        );
    }
    if let Some(ratio) = m
        .extra
        .get("ratio_to_w8_without_indexes")
        .and_then(Value::as_f64)
    {
        println!(
            "         {label}: {:.0} PUTs/s with two indexes kept up in the background vs {:.0} \
             without: {ratio:.2}x (goal >= 0.8x)",
            m.ops_per_sec(),
            f("w8_without_indexes_requests_per_sec")
        );
    }
    if m.extra.contains_key("index_build_docs_per_sec") {
        println!(
            "         {label}: {:.0} documents: index build (n, tag) {:.0} docs/s (goal >= 200,000); \
             where n > 0: first page p50 {:.3} ms p99 {:.3} ms (goal p50 <= 1), count {:.3} ms (goal <= 100); \
             where tag = 'x': p50 {:.3} ms, count {:.3} ms; half the index: p50 {:.3} ms, count {:.3} ms; \
             order by n desc limit 20: p50 {:.3} ms",
            f("documents"),
            f("index_build_docs_per_sec"),
            f("first_page_p50_ms"),
            f("first_page_p99_ms"),
            f("count_ms"),
            f("tag_first_page_p50_ms"),
            f("tag_count_ms"),
            f("half_first_page_p50_ms"),
            f("half_count_ms"),
            f("order_desc_first_page_p50_ms"),
        );
    }
    if m.extra.contains_key("lag_p50_ms") {
        println!(
            "         {label}: idle lag ack -> non-stale p50 {:.2} ms p99 {:.2} ms (goal p50 <= 5); \
             bulk insert of {:.0} docs at {:.0}/s with 3 indexes: max lag {:.0} ms, catch-up {:.0} ms \
             after it (goal <= 1000); batch sizes {}",
            f("lag_p50_ms"),
            f("lag_p99_ms"),
            f("flood_documents"),
            f("flood_insert_docs_per_sec"),
            f("flood_max_lag_ms"),
            f("catch_up_ms"),
            m.extra["batch_sizes"]
        );
    }
    if m.extra.contains_key("bytes_per_connection") {
        println!(
            "         {label}: {:.0} idle subscribers: {:.0} bytes each (target <= 16,384), idle CPU \
             {:.2} % of a core with heartbeats every {:.0} ms (target < 2 %); PUT answer -> change \
             at a subscriber: p50 {:.2} ms, p99 {:.2} ms (target p99 <= 5 ms) under {:.0} PUTs/s",
            f("idle_connections"),
            f("bytes_per_connection"),
            f("idle_cpu_percent"),
            f("heartbeat_ms"),
            f("notify_p50_ms"),
            f("notify_p99_ms"),
            f("live_puts_per_sec")
        );
    }
    if let Some(server_us) = m
        .extra
        .get("server_cpu_us_per_request")
        .and_then(Value::as_f64)
    {
        let load_us = f("load_generator_cpu_us_per_request");
        println!(
            "         {label}: CPU per request: server {server_us:.1} us, load generator {load_us:.1} us"
        );
    }
    let peak_mib = |k: &str| {
        m.extra
            .get(k)
            .and_then(Value::as_f64)
            .map(|b| b / (1u64 << 20) as f64)
    };
    match (
        peak_mib("server_peak_rss_bytes"),
        peak_mib("bench_process_peak_rss_bytes"),
    ) {
        (Some(server), _) => println!("         {label}: peak RSS of the server {server:.0} MiB"),
        (None, Some(own)) => println!(
            "         {label}: peak RSS of the benchmark process (engine in-process) {own:.0} MiB"
        ),
        _ => {}
    }
    let opt = |k: &str| {
        m.extra
            .get(k)
            .and_then(Value::as_f64)
            .map_or("-".to_string(), |v| format!("{v:.0}"))
    };
    let group = m
        .extra
        .get("avg_group_size")
        .and_then(Value::as_f64)
        .map_or("-".to_string(), |v| format!("{v:.1}"));
    // HTTP workloads (a request is not a commit of its own) and W7 (one reopen):
    // no per-commit columns.
    let http = m.extra.contains_key("requests_per_sec")
        || m.extra.contains_key("open_ms")
        || m.extra.contains_key("backup_ratio_to_slower_disk");
    let per_commit = |v: f64, digits: usize| {
        if http {
            "-".to_string()
        } else {
            format!("{v:.digits$}")
        }
    };
    println!(
        "{:<8} {:>4} {:>11.0} {:>10} {:>8} {:>10.0} {:>28} {:>9} {:>9} {:>7}",
        label,
        runs,
        m.ops_per_sec(),
        per_commit(ms_per_commit, 3),
        per_commit(ms_per_commit / raw_ms, 2),
        f("journal_bytes_per_op"),
        format!(
            "{:.0}|{:.0}|{:.0}",
            f("journal_body_bytes_per_op_full_images"),
            f("journal_body_bytes_per_op_with_diffs"),
            f("journal_body_bytes_per_op_with_diffs_and_lz4")
        ),
        opt("p50_us"),
        opt("p99_us"),
        group
    );
}
