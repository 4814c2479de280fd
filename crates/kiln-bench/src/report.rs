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
    if as_json {
        print_json_object(wl, m, runs, raw, quick);
        return;
    }
    print_lines_against_targets(label, m);
    print_peak_rss(label, m);
    print_table_row(label, m, runs, raw);
}

/// A figure of the run's extras, NaN when the workload did not measure it: a
/// missing figure prints as NaN rather than hiding the whole line.
fn figure(m: &Run, key: &str) -> f64 {
    m.extra.get(key).and_then(Value::as_f64).unwrap_or(f64::NAN)
}

fn bytes_to_mib(bytes: f64) -> f64 {
    bytes / (1u64 << 20) as f64
}

fn ms_per_commit(m: &Run) -> f64 {
    m.seconds * 1e3 / m.commits as f64
}

/// `--json`: the run's common figures, then every figure the workload added.
fn print_json_object(wl: &str, m: &Run, runs: usize, raw: &RawFigures, quick: bool) {
    let ms_per_commit = ms_per_commit(m);
    let mut obj = Map::new();
    obj.insert("workload".into(), json!(wl));
    obj.insert("runs".into(), json!(runs));
    obj.insert("ops".into(), json!(m.ops));
    obj.insert("commits".into(), json!(m.commits));
    obj.insert("seconds".into(), json!(m.seconds));
    obj.insert("ops_per_sec".into(), json!(m.ops_per_sec()));
    obj.insert("ms_per_commit".into(), json!(ms_per_commit));
    obj.insert("raw_disk_ms_per_write".into(), json!(raw.mean_ms));
    obj.insert("raw_disk_p50_ms_per_write".into(), json!(raw.p50_ms));
    obj.insert("raw_disk_direct_io".into(), json!(raw.direct_io));
    obj.insert(
        "ratio_to_raw_write".into(),
        json!(ms_per_commit / raw.mean_ms),
    );
    obj.insert("quick".into(), json!(quick));
    obj.extend(m.extra.clone());
    println!("{}", Value::Object(obj));
}

/// The lines of the workloads that have targets or goals. Each printer looks for
/// the figure only its workload sets and prints nothing without it, so a run gets
/// the lines of its own workload, in this order.
fn print_lines_against_targets(label: &str, m: &Run) {
    print_redis_comparison(label, m);
    print_raw_write_around_run(label, m);
    print_reopen_after_kill(label, m);
    if m.extra.contains_key("backup_ratio_to_slower_disk") {
        crate::backupbench::report(label, m);
    }
    if let Some(why) = m.extra.get("redis_skipped").and_then(Value::as_str) {
        println!("         {label}: Redis peer skipped: {why}");
    }
    print_bulk_insert(label, m);
    print_replicated_puts(label, m);
    print_index_upkeep_cost(label, m);
    print_index_build_and_queries(label, m);
    print_index_lag(label, m);
    print_aggregations(label, m);
    print_subscriptions(label, m);
    print_attachments(label, m);
    print_full_text(label, m);
    print_idle_subscribers_and_notify(label, m);
    print_cpu_per_request(label, m);
}

/// HTTP workloads with a Redis peer: our request rate against Redis measured
/// alongside on the same machine.
fn print_redis_comparison(label: &str, m: &Run) {
    let Some(ratio) = m.extra.get("ratio_to_redis").and_then(Value::as_f64) else {
        return;
    };
    println!(
        "         {label}: {:.0} requests/s vs Redis {} (AOF, appendfsync always) {:.0}/s \
         measured alongside: {ratio:.2}x (target >= 1.0x); Redis p99 {:.0} us, server CPU \
         {:.1} us per request",
        m.ops_per_sec(),
        m.extra["redis_version"].as_str().unwrap_or("?"),
        figure(m, "redis_requests_per_sec"),
        figure(m, "redis_p99_us"),
        figure(m, "redis_server_cpu_us_per_request"),
    );
}

/// W1: the commit time against the raw durable write measured just before and
/// after the run, so that a disk whose speed drifts does not skew the ratio.
fn print_raw_write_around_run(label: &str, m: &Run) {
    let Some(ratio) = m
        .extra
        .get("ratio_to_raw_write_around_run")
        .and_then(Value::as_f64)
    else {
        return;
    };
    println!(
        "         {label}: raw 16 KiB durable write {:.3} ms before and {:.3} ms after the \
         run: {ratio:.2}x of their mean (target <= 1.25x), {:.0} us over it (proposed \
         target <= {W1_PROPOSED_EXCESS_US} us)",
        figure(m, "raw_disk_ms_before_run"),
        figure(m, "raw_disk_ms_after_run"),
        figure(m, "excess_over_raw_write_around_run_us"),
    );
}

/// W7: opening the database after a kill -9, and its first read.
fn print_reopen_after_kill(label: &str, m: &Run) {
    let Some(open_ms) = m.extra.get("open_ms").and_then(Value::as_f64) else {
        return;
    };
    println!(
        "         {label}: kill -9 with {:.0} MiB of journal ({} records replayed): open {open_ms:.0} ms, \
         first read {:.0} ms (target <= 1000 ms)",
        bytes_to_mib(figure(m, "journal_bytes_written")),
        figure(m, "records_replayed_on_open"),
        figure(m, "first_read_ms"),
    );
}

/// W10: one bulk insert against W8's PUTs, and the server's memory during it.
fn print_bulk_insert(label: &str, m: &Run) {
    let Some(ratio) = m.extra.get("ratio_to_w8").and_then(Value::as_f64) else {
        return;
    };
    // W15 has a ratio to W8 too: the rate by tenth is the bulk insert's own.
    if !m.extra.contains_key("last_tenth_to_first") {
        return;
    }
    println!(
        "         {label}: {:.0} documents/s in one bulk insert = {ratio:.2}x W8's {:.0} PUTs/s \
         (targets >= 150,000/s, >= 4x); server RSS growth {:.0} MiB (heap {:.0} MiB; \
         target <= 256); rate by tenth, last/first {:.2}",
        m.ops_per_sec(),
        figure(m, "w8_requests_per_sec"),
        bytes_to_mib(figure(m, "peak_rss_growth_bytes")),
        bytes_to_mib(figure(m, "peak_rss_anon_growth_bytes")),
        figure(m, "last_tenth_to_first")
    );
}

/// W15: PUTs replicated to a three-node cluster against W8 on one node, what each
/// cost the disk and the CPUs, and the failover after a kill -9 of the leader.
fn print_replicated_puts(label: &str, m: &Run) {
    if !m
        .extra
        .contains_key("follower_db_journal_writes_per_request")
    {
        return;
    }
    let ms = |k: &str| figure(m, k) / 1e3;
    println!(
        "         {label}: {:.0} PUTs/s to the leader of {:.0} nodes (p50 {:.2} ms, p99 {:.2} ms) \
         vs W8 on one node {:.0}/s (p50 {:.2} ms, p99 {:.2} ms) measured alongside: \
         {:.2}x (target >= 0.5x)",
        m.ops_per_sec(),
        figure(m, "nodes"),
        ms("p50_us"),
        ms("p99_us"),
        figure(m, "w8_requests_per_sec"),
        ms("w8_p50_us"),
        ms("w8_p99_us"),
        figure(m, "ratio_to_w8"),
    );
    println!(
        "         {label}: per request: database journal writes {:.2} on the leader, {:.2} \
         on each follower (W8: {:.3}); the disk (whole device) {:.2} writes, {:.2} flushes, \
         {:.1} KiB (W8: {:.3}, {:.3}, {:.1} KiB); CPU of the {:.0} servers {:.0} us (W8: {:.0} us)",
        figure(m, "leader_db_journal_writes_per_request"),
        figure(m, "follower_db_journal_writes_per_request"),
        1.0 / figure(m, "w8_requests_per_journal_write"),
        figure(m, "cluster_device_writes_per_request"),
        figure(m, "cluster_device_flushes_per_request"),
        figure(m, "cluster_device_bytes_per_request") / 1024.0,
        figure(m, "w8_device_writes_per_request"),
        figure(m, "w8_device_flushes_per_request"),
        figure(m, "w8_device_bytes_per_request") / 1024.0,
        figure(m, "nodes"),
        figure(m, "cluster_cpu_us_per_request"),
        figure(m, "w8_server_cpu_us_per_request"),
    );
    if figure(m, "failovers") > 0.0 {
        println!(
            "         {label}: {:.0} kill -9 of the leader -> first write acknowledged by the new \
             leader: p50 {:.0} ms, max {:.0} ms (target <= 2000 ms); the killed node back and \
             caught up: p50 {:.0} ms, max {:.0} ms",
            figure(m, "failovers"),
            figure(m, "failover_p50_ms"),
            figure(m, "failover_max_ms"),
            figure(m, "rejoin_p50_ms"),
            figure(m, "rejoin_max_ms"),
        );
    }
}

/// W8 with indexes: what keeping two indexes up costs the PUTs.
fn print_index_upkeep_cost(label: &str, m: &Run) {
    let Some(ratio) = m
        .extra
        .get("ratio_to_w8_without_indexes")
        .and_then(Value::as_f64)
    else {
        return;
    };
    println!(
        "         {label}: {:.0} PUTs/s with two indexes kept up in the background vs {:.0} \
         without: {ratio:.2}x (goal >= 0.8x)",
        m.ops_per_sec(),
        figure(m, "w8_without_indexes_requests_per_sec")
    );
}

/// W12: building an index, then the queries that use it.
fn print_index_build_and_queries(label: &str, m: &Run) {
    if !m.extra.contains_key("index_build_docs_per_sec") {
        return;
    }
    println!(
        "         {label}: {:.0} documents: index build (n, tag) {:.0} docs/s (goal >= 200,000); \
         where n > 0: first page p50 {:.3} ms p99 {:.3} ms (goal p50 <= 1), count {:.3} ms (goal <= 100); \
         where tag = 'x': p50 {:.3} ms, count {:.3} ms; half the index: p50 {:.3} ms, count {:.3} ms; \
         order by n desc limit 20: p50 {:.3} ms",
        figure(m, "documents"),
        figure(m, "index_build_docs_per_sec"),
        figure(m, "first_page_p50_ms"),
        figure(m, "first_page_p99_ms"),
        figure(m, "count_ms"),
        figure(m, "tag_first_page_p50_ms"),
        figure(m, "tag_count_ms"),
        figure(m, "half_first_page_p50_ms"),
        figure(m, "half_count_ms"),
        figure(m, "order_desc_first_page_p50_ms"),
    );
}

/// W16: a full-text index's build and queries, beside tantivy used directly.
fn print_full_text(label: &str, m: &Run) {
    if !m.extra.contains_key("tantivy_build_docs_per_sec") {
        return;
    }
    println!(
        "         {label}: {:.0} documents, {:.1} MB of text ({}): full-text index build {:.0} docs/s \
         {:.1} MB/s, tantivy alone {:.0} docs/s: {:.2}x (goal >= 0.7); term p50 {:.3} ms p99 {:.3} \
         (tantivy {:.3}), phrase p50 {:.3} ms p99 {:.3} (tantivy {:.3}), prefix p50 {:.3} ms p99 \
         {:.3} (tantivy {:.3}); idle update lag p50 {:.1} ms p99 {:.1}; index {:.1} MB; restore \
         to first query {:.2} s resuming the index the backup carries ({:.1} MB of its {:.1} MB; \
         restore alone {:.2} s) vs {:.2} s rebuilding it: {:.2}x; SQLite FTS5 and PostgreSQL: \
         bench/ --workloads W16",
        figure(m, "documents"),
        figure(m, "corpus_mb"),
        m.extra["corpus"].as_str().unwrap_or("?"),
        figure(m, "build_docs_per_sec"),
        figure(m, "build_mb_per_sec"),
        figure(m, "tantivy_build_docs_per_sec"),
        figure(m, "build_ratio_to_tantivy"),
        figure(m, "term_p50_ms"),
        figure(m, "term_p99_ms"),
        figure(m, "tantivy_term_p50_ms"),
        figure(m, "phrase_p50_ms"),
        figure(m, "phrase_p99_ms"),
        figure(m, "tantivy_phrase_p50_ms"),
        figure(m, "prefix_p50_ms"),
        figure(m, "prefix_p99_ms"),
        figure(m, "tantivy_prefix_p50_ms"),
        figure(m, "update_lag_p50_ms"),
        figure(m, "update_lag_p99_ms"),
        figure(m, "index_mb"),
        figure(m, "restore_to_first_query_seconds"),
        figure(m, "backup_search_mb"),
        figure(m, "backup_mb"),
        figure(m, "restore_seconds"),
        figure(m, "rebuild_restore_to_first_query_seconds"),
        figure(m, "restore_ratio_to_rebuild"),
    );
}

/// W19: a large attachment through the server against the disk's sequential speed.
fn print_attachments(label: &str, m: &Run) {
    if !m.extra.contains_key("upload_mb_per_sec") {
        return;
    }
    let mib = |k: &str| figure(m, k) / (1 << 20) as f64;
    println!(
        "         {label}: {:.0} MiB attachment: upload {:.0} MB/s, {:.2}x the disk's \
         sequential write ({:.0} MB/s incl. fdatasync); download {:.0} MB/s, {:.2}x its \
         cold sequential read ({:.0} MB/s) (goal >= 0.7x each); server RSS {:.0} MiB \
         before, peak {:.0} MiB during the upload, {:.0} MiB during the download",
        mib("size_bytes"),
        figure(m, "upload_mb_per_sec"),
        figure(m, "upload_ratio_to_disk"),
        figure(m, "disk_write_mb_per_sec"),
        figure(m, "download_mb_per_sec"),
        figure(m, "download_ratio_to_disk"),
        figure(m, "disk_read_mb_per_sec"),
        mib("server_rss_before_bytes"),
        mib("server_peak_rss_upload_bytes"),
        mib("server_peak_rss_download_bytes"),
    );
}

/// W18: a data subscription's delivery to one worker, and a live write's latency.
fn print_subscriptions(label: &str, m: &Run) {
    if !m.extra.contains_key("delivered_docs_per_sec") {
        return;
    }
    println!(
        "         {label}: {:.0} documents delivered to one worker in {:.0} acknowledged \
         batches of up to {:.0}: {:.0} docs/s (goal >= 100,000); live write delivered p50 \
         {:.2} ms p99 {:.2} ms (goal p50 <= 5) over {:.0} writes",
        figure(m, "documents"),
        figure(m, "batches"),
        figure(m, "batch_size"),
        figure(m, "delivered_docs_per_sec"),
        figure(m, "live_latency_p50_ms"),
        figure(m, "live_latency_p99_ms"),
        figure(m, "live_writes"),
    );
    if m.extra.contains_key("cluster_delivered_docs_per_sec") {
        println!(
            "         {label}, a three-node cluster's leader (each acknowledgment through the \
             log): {:.0} docs/s ({:.2}x the single node); live write delivered p50 {:.2} ms \
             p99 {:.2} ms",
            figure(m, "cluster_delivered_docs_per_sec"),
            figure(m, "cluster_ratio_to_single"),
            figure(m, "cluster_live_latency_p50_ms"),
            figure(m, "cluster_live_latency_p99_ms"),
        );
    }
}

/// W17: a reduce index's build, the grouped queries it answers, its update lag.
fn print_aggregations(label: &str, m: &Run) {
    if !m.extra.contains_key("build_docs_per_sec") || !m.extra.contains_key("all_groups_p50_ms") {
        return;
    }
    println!(
        "         {label}: {:.0} orders over {:.0} companies: reduce index build {:.0} docs/s; \
         grouped query first page p50 {:.3} ms p99 {:.3} ms (goal p50 <= 1), every group p50 \
         {:.3} ms p99 {:.3} ms; idle update lag p50 {:.2} ms p99 {:.2} ms (goal <= 5); \
         PostgreSQL: bench/ --workloads W17",
        figure(m, "documents"),
        figure(m, "groups"),
        figure(m, "build_docs_per_sec"),
        figure(m, "first_page_p50_ms"),
        figure(m, "first_page_p99_ms"),
        figure(m, "all_groups_p50_ms"),
        figure(m, "all_groups_p99_ms"),
        figure(m, "update_lag_p50_ms"),
        figure(m, "update_lag_p99_ms"),
    );
}

/// W13: how far the indexes lag behind acknowledged writes, idle and under a flood.
fn print_index_lag(label: &str, m: &Run) {
    if !m.extra.contains_key("lag_p50_ms") {
        return;
    }
    println!(
        "         {label}: idle lag ack -> non-stale p50 {:.2} ms p99 {:.2} ms (goal p50 <= 5); \
         bulk insert of {:.0} docs at {:.0}/s with 3 indexes: max lag {:.0} ms, catch-up {:.0} ms \
         after it (goal <= 1000); batch sizes {}",
        figure(m, "lag_p50_ms"),
        figure(m, "lag_p99_ms"),
        figure(m, "flood_documents"),
        figure(m, "flood_insert_docs_per_sec"),
        figure(m, "flood_max_lag_ms"),
        figure(m, "catch_up_ms"),
        m.extra["batch_sizes"]
    );
}

/// W11: the cost of idle change-stream subscribers, and how soon a PUT reaches them.
fn print_idle_subscribers_and_notify(label: &str, m: &Run) {
    if !m.extra.contains_key("bytes_per_connection") {
        return;
    }
    println!(
        "         {label}: {:.0} idle subscribers: {:.0} bytes each (target <= 16,384), idle CPU \
         {:.2} % of a core with heartbeats every {:.0} ms (target < 2 %); PUT answer -> change \
         at a subscriber: p50 {:.2} ms, p99 {:.2} ms (target p99 <= 5 ms) under {:.0} PUTs/s",
        figure(m, "idle_connections"),
        figure(m, "bytes_per_connection"),
        figure(m, "idle_cpu_percent"),
        figure(m, "heartbeat_ms"),
        figure(m, "notify_p50_ms"),
        figure(m, "notify_p99_ms"),
        figure(m, "live_puts_per_sec")
    );
}

/// HTTP workloads: the CPU the server and the load generator each spent per request.
fn print_cpu_per_request(label: &str, m: &Run) {
    let Some(server_us) = m
        .extra
        .get("server_cpu_us_per_request")
        .and_then(Value::as_f64)
    else {
        return;
    };
    let load_us = figure(m, "load_generator_cpu_us_per_request");
    println!(
        "         {label}: CPU per request: server {server_us:.1} us, load generator {load_us:.1} us"
    );
}

/// The server's peak RSS when the engine ran in a server, else the benchmark's own
/// (the engine ran in-process).
fn print_peak_rss(label: &str, m: &Run) {
    let peak_mib = |k: &str| m.extra.get(k).and_then(Value::as_f64).map(bytes_to_mib);
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
}

/// The variant's row of the table, under the header of [`print_header`].
fn print_table_row(label: &str, m: &Run, runs: usize, raw: &RawFigures) {
    let ms_per_commit = ms_per_commit(m);
    let whole_or_dash = |k: &str| {
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
        per_commit(ms_per_commit / raw.mean_ms, 2),
        figure(m, "journal_bytes_per_op"),
        format!(
            "{:.0}|{:.0}|{:.0}",
            figure(m, "journal_body_bytes_per_op_full_images"),
            figure(m, "journal_body_bytes_per_op_with_diffs"),
            figure(m, "journal_body_bytes_per_op_with_diffs_and_lz4")
        ),
        whole_or_dash("p50_us"),
        whole_or_dash("p99_us"),
        group
    );
}
