//! `GET /metrics` in the Prometheus text format: HTTP figures kept here, engine
//! figures read from each database at scrape time, process figures from /proc.

use kiln_docs::DocStore;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

type RequestCounts = BTreeMap<String, BTreeMap<String, BTreeMap<u16, u64>>>;

/// Upper bounds of the request latency buckets, in microseconds.
const LATENCY_BUCKETS_US: [u64; 16] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000,
];

/// The route template of the document requests, as the router matches them and
/// the metrics label them (the own HTTP/1.1 loop labels its requests with it too).
pub(crate) const DOCUMENT_ROUTE: &str = "/dbs/{db}/docs/{*id}";

/// The document route's common answers get counters of their own: every GET and
/// PUT of a document otherwise took a lock shared by all workers and three map
/// lookups by string (about a tenth of the server's CPU under W9, by perf).
const HOT_METHODS: [&str; 3] = ["GET", "PUT", "POST"];
const HOT_STATUSES: [u16; 6] = [200, 201, 304, 404, 409, 412];

pub struct Metrics {
    started: Instant,
    /// Requests by route template, method and status (nested so that counting one
    /// looks up borrowed strings and allocates only the first time), except those
    /// in `document_hot`.
    requests: Mutex<RequestCounts>,
    /// `[method][status]` counts of `DOCUMENT_ROUTE` for `HOT_METHODS` x `HOT_STATUSES`.
    document_hot: [[AtomicU64; HOT_STATUSES.len()]; HOT_METHODS.len()],
    latency_buckets: [AtomicU64; LATENCY_BUCKETS_US.len()],
    latency_count: AtomicU64,
    latency_sum_us: AtomicU64,
    pub connections_open: AtomicUsize,
    pub connections_total: AtomicU64,
    pub connections_refused: AtomicU64,
    /// Connections the own HTTP/1.1 loop handed to hyper (at their first request
    /// that is not one document's GET, PUT or POST).
    pub connections_to_hyper: AtomicU64,
    pub ws_connections_open: AtomicUsize,
    pub ws_connections_total: AtomicU64,
    pub ws_messages: AtomicU64,
    pub ws_slow_consumers_dropped: AtomicU64,
    pub bulk_running: AtomicUsize,
    pub bulk_documents: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            started: Instant::now(),
            requests: Mutex::new(BTreeMap::new()),
            document_hot: Default::default(),
            latency_buckets: Default::default(),
            latency_count: AtomicU64::new(0),
            latency_sum_us: AtomicU64::new(0),
            connections_open: AtomicUsize::new(0),
            connections_total: AtomicU64::new(0),
            connections_refused: AtomicU64::new(0),
            connections_to_hyper: AtomicU64::new(0),
            ws_connections_open: AtomicUsize::new(0),
            ws_connections_total: AtomicU64::new(0),
            ws_messages: AtomicU64::new(0),
            ws_slow_consumers_dropped: AtomicU64::new(0),
            bulk_running: AtomicUsize::new(0),
            bulk_documents: AtomicU64::new(0),
        }
    }
}

impl Metrics {
    pub fn record_request(&self, route: &str, method: &str, status: u16, elapsed: Duration) {
        if let Some(counter) = self.hot_counter(route, method, status) {
            counter.fetch_add(1, Relaxed);
        } else {
            let mut requests = self.requests.lock();
            let methods = match requests.get_mut(route) {
                Some(m) => m,
                None => requests.entry(route.to_string()).or_default(),
            };
            let statuses = match methods.get_mut(method) {
                Some(s) => s,
                None => methods.entry(method.to_string()).or_default(),
            };
            *statuses.entry(status).or_insert(0) += 1;
        }
        let us = elapsed.as_micros() as u64;
        if let Some(i) = LATENCY_BUCKETS_US.iter().position(|&b| us <= b) {
            self.latency_buckets[i].fetch_add(1, Relaxed);
        }
        self.latency_count.fetch_add(1, Relaxed);
        self.latency_sum_us.fetch_add(us, Relaxed);
    }

    fn hot_counter(&self, route: &str, method: &str, status: u16) -> Option<&AtomicU64> {
        if route != DOCUMENT_ROUTE {
            return None;
        }
        let m = HOT_METHODS.iter().position(|&h| h == method)?;
        let s = HOT_STATUSES.iter().position(|&h| h == status)?;
        Some(&self.document_hot[m][s])
    }

    /// Every request count so far: the map with the hot counters folded in.
    fn request_counts(&self) -> RequestCounts {
        let mut counts = self.requests.lock().clone();
        for (m, method) in HOT_METHODS.iter().enumerate() {
            for (s, status) in HOT_STATUSES.iter().enumerate() {
                let n = self.document_hot[m][s].load(Relaxed);
                if n > 0 {
                    *counts
                        .entry(DOCUMENT_ROUTE.to_string())
                        .or_default()
                        .entry(method.to_string())
                        .or_default()
                        .entry(*status)
                        .or_insert(0) += n;
                }
            }
        }
        counts
    }

    /// Requests so far by status class: `{"2xx": n, "3xx": n, "4xx": n, "5xx": n}`
    /// (and `1xx` when any).
    pub fn requests_by_status_class(&self) -> BTreeMap<String, u64> {
        let mut out: BTreeMap<String, u64> = ["2xx", "3xx", "4xx", "5xx"]
            .into_iter()
            .map(|c| (c.to_string(), 0))
            .collect();
        for statuses in self.request_counts().values().flat_map(BTreeMap::values) {
            for (status, n) in statuses {
                *out.entry(format!("{}xx", status / 100)).or_insert(0) += n;
            }
        }
        out
    }

    fn render_feeds(&self, o: &mut String) {
        gauge(
            o,
            "kiln_changes_ws_connections_open",
            "Open WebSocket changes connections",
            self.ws_connections_open.load(Relaxed) as f64,
        );
        counter(
            o,
            "kiln_changes_ws_connections_total",
            "WebSocket changes connections accepted",
            self.ws_connections_total.load(Relaxed),
        );
        counter(
            o,
            "kiln_changes_ws_messages_total",
            "Messages sent on changes connections (changes, heartbeats, acks)",
            self.ws_messages.load(Relaxed),
        );
        counter(
            o,
            "kiln_changes_ws_slow_consumers_dropped_total",
            "Changes connections closed because their reader fell behind",
            self.ws_slow_consumers_dropped.load(Relaxed),
        );
        gauge(
            o,
            "kiln_bulk_inserts_running",
            "Bulk inserts in progress",
            self.bulk_running.load(Relaxed) as f64,
        );
        counter(
            o,
            "kiln_bulk_documents_total",
            "Documents committed by bulk inserts",
            self.bulk_documents.load(Relaxed),
        );
    }

    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    pub fn render(&self, store: &DocStore) -> String {
        let mut out = String::with_capacity(8192);
        let o = &mut out;
        header(
            o,
            "kiln_http_requests_total",
            "counter",
            "HTTP requests by route, method and status",
        );
        for (route, methods) in self.request_counts().iter() {
            for (method, statuses) in methods {
                for (status, n) in statuses {
                    let _ = writeln!(
                        o,
                        "kiln_http_requests_total{{route=\"{}\",method=\"{method}\",status=\"{status}\"}} {n}",
                        escape(route)
                    );
                }
            }
        }
        header(
            o,
            "kiln_http_request_duration_seconds",
            "histogram",
            "HTTP request latency",
        );
        let mut cumulative = 0;
        for (i, bound) in LATENCY_BUCKETS_US.iter().enumerate() {
            cumulative += self.latency_buckets[i].load(Relaxed);
            let _ = writeln!(
                o,
                "kiln_http_request_duration_seconds_bucket{{le=\"{}\"}} {cumulative}",
                *bound as f64 / 1e6
            );
        }
        let count = self.latency_count.load(Relaxed);
        let _ = writeln!(
            o,
            "kiln_http_request_duration_seconds_bucket{{le=\"+Inf\"}} {count}"
        );
        let _ = writeln!(
            o,
            "kiln_http_request_duration_seconds_sum {}",
            self.latency_sum_us.load(Relaxed) as f64 / 1e6
        );
        let _ = writeln!(o, "kiln_http_request_duration_seconds_count {count}");
        gauge(
            o,
            "kiln_http_connections_open",
            "Open client connections",
            self.connections_open.load(Relaxed) as f64,
        );
        counter(
            o,
            "kiln_http_connections_total",
            "Accepted connections",
            self.connections_total.load(Relaxed),
        );
        counter(
            o,
            "kiln_http_connections_refused_total",
            "Connections refused over the connection limit",
            self.connections_refused.load(Relaxed),
        );
        counter(
            o,
            "kiln_http_connections_to_hyper_total",
            "Connections the own HTTP/1.1 loop handed to hyper at a request other than a document GET, PUT or POST",
            self.connections_to_hyper.load(Relaxed),
        );
        self.render_feeds(o);
        self.render_engines(o, store);
        gauge(
            o,
            "kiln_uptime_seconds",
            "Seconds since the server started",
            self.uptime().as_secs_f64(),
        );
        if let Some(rss) = resident_memory_bytes() {
            gauge(
                o,
                "kiln_process_resident_memory_bytes",
                "Resident memory",
                rss as f64,
            );
        }
        if let Some(fds) = open_fds() {
            gauge(
                o,
                "kiln_process_open_fds",
                "Open file descriptors",
                fds as f64,
            );
        }
        out
    }

    fn render_engines(&self, o: &mut String, store: &DocStore) {
        let stats: Vec<(String, kiln_storage::Stats, u64)> = store
            .databases()
            .iter()
            .map(|db| {
                let docs = db.document_count().unwrap_or(0);
                (db.name().to_string(), db.env().stats(), docs)
            })
            .collect();
        type Field = fn(&kiln_storage::Stats) -> f64;
        let series: [(&str, &str, &str, Field); 13] = [
            (
                "kiln_commits_total",
                "counter",
                "Committed write transactions",
                |s| s.commits as f64,
            ),
            (
                "kiln_commit_groups_total",
                "counter",
                "Groups of merged units committed by the commit queue",
                |s| s.commit_queue.groups as f64,
            ),
            (
                "kiln_commit_units_total",
                "counter",
                "Units committed through the commit queue",
                |s| s.commit_queue.units_committed as f64,
            ),
            (
                "kiln_commit_group_units_max",
                "gauge",
                "Largest commit group so far",
                |s| s.commit_queue.max_group_units as f64,
            ),
            (
                "kiln_commit_overloaded_total",
                "counter",
                "Writes refused because the commit queue was full",
                |s| s.commit_queue.overloaded_rejections as f64,
            ),
            (
                "kiln_journal_writes_total",
                "counter",
                "Durable journal writes",
                |s| s.journal_writes as f64,
            ),
            (
                "kiln_journal_bytes_total",
                "counter",
                "Bytes written to the journal",
                |s| s.journal_bytes as f64,
            ),
            (
                "kiln_journal_referenced_value_bytes_total",
                "counter",
                "Bytes of merged values the journal named by key instead of writing again",
                |s| s.journal_referenced_value_bytes as f64,
            ),
            (
                "kiln_data_file_syncs_total",
                "counter",
                "Data-file syncs by the flusher",
                |s| s.data_syncs as f64,
            ),
            (
                "kiln_data_file_bytes",
                "gauge",
                "Size of the data file",
                |s| s.data_file_bytes as f64,
            ),
            (
                "kiln_pages_unflushed",
                "gauge",
                "Committed pages not yet written back",
                |s| s.pages_unflushed as f64,
            ),
            (
                "kiln_readers_open",
                "gauge",
                "Open read transactions",
                |s| s.readers_open as f64,
            ),
            (
                "kiln_journal_direct_io",
                "gauge",
                "1 when the journal is written with O_DIRECT",
                |s| s.journal_direct_io as u8 as f64,
            ),
        ];
        for (name, kind, help, field) in series {
            header(o, name, kind, help);
            for (db, s, _) in &stats {
                let _ = writeln!(o, "{name}{{db=\"{db}\"}} {}", field(s));
            }
        }
        header(o, "kiln_documents", "gauge", "Documents per database");
        for (db, _, docs) in &stats {
            let _ = writeln!(o, "kiln_documents{{db=\"{db}\"}} {docs}");
        }
        for (name, help, pick) in [
            (
                "kiln_journal_write_seconds",
                "Durable journal write latency",
                (|s: &kiln_storage::Stats| s.journal_write_latency)
                    as fn(&kiln_storage::Stats) -> kiln_storage::LatencySummary,
            ),
            (
                "kiln_data_file_sync_seconds",
                "Data-file sync latency",
                |s| s.data_sync_latency,
            ),
        ] {
            header(o, name, "summary", help);
            for (db, s, _) in &stats {
                let l = pick(s);
                let _ = writeln!(
                    o,
                    "{name}{{db=\"{db}\",quantile=\"0.5\"}} {}",
                    l.p50_us as f64 / 1e6
                );
                let _ = writeln!(
                    o,
                    "{name}{{db=\"{db}\",quantile=\"0.99\"}} {}",
                    l.p99_us as f64 / 1e6
                );
                let _ = writeln!(
                    o,
                    "{name}_sum{{db=\"{db}\"}} {}",
                    l.mean_us * l.count as f64 / 1e6
                );
                let _ = writeln!(o, "{name}_count{{db=\"{db}\"}} {}", l.count);
            }
        }
    }
}

fn header(o: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn gauge(o: &mut String, name: &str, help: &str, v: f64) {
    header(o, name, "gauge", help);
    let _ = writeln!(o, "{name} {v}");
}

fn counter(o: &mut String, name: &str, help: &str, v: u64) {
    header(o, name, "counter", help);
    let _ = writeln!(o, "{name} {v}");
}

fn escape(label: &str) -> String {
    label
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

pub(crate) fn resident_memory_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok()?)
}

fn open_fds() -> Option<usize> {
    Some(std::fs::read_dir("/proc/self/fd").ok()?.count())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hot_and_mapped_counts_add_up_in_one_view() {
        let m = Metrics::default();
        let ms = Duration::from_millis(1);
        for _ in 0..3 {
            m.record_request(DOCUMENT_ROUTE, "GET", 200, ms);
        }
        m.record_request(DOCUMENT_ROUTE, "GET", 500, ms); // not a hot status
        m.record_request(DOCUMENT_ROUTE, "DELETE", 200, ms); // not a hot method
        m.record_request("/health", "GET", 200, ms); // not the hot route
        let counts = m.request_counts();
        let doc = &counts[DOCUMENT_ROUTE];
        assert_eq!(doc["GET"][&200], 3);
        assert_eq!(doc["GET"][&500], 1);
        assert_eq!(doc["DELETE"][&200], 1);
        assert_eq!(counts["/health"]["GET"][&200], 1);
        let classes = m.requests_by_status_class();
        assert_eq!((classes["2xx"], classes["5xx"]), (5, 1));
        assert_eq!(m.latency_count.load(Relaxed), 6);
    }

    /// `record_request`'s cost, in ns per call, on one thread and on two at once
    /// (the two cores under W9). A measure to print, not a test: run it with
    /// `cargo test -p kiln-server --release --lib record_request_cost -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn record_request_cost() {
        const N: u32 = 5_000_000;
        let elapsed = Duration::from_micros(180);
        let cases: [(&str, &str, &str, u16); 3] = [
            ("hot (document GET 200)", DOCUMENT_ROUTE, "GET", 200),
            ("not hot (document DELETE 200)", DOCUMENT_ROUTE, "DELETE", 200),
            ("not hot (another route)", "/dbs/{db}/queries", "POST", 200),
        ];
        for (what, route, method, status) in cases {
            let m = Metrics::default();
            let one = |m: &Metrics| {
                let start = Instant::now();
                for _ in 0..N {
                    m.record_request(
                        std::hint::black_box(route),
                        std::hint::black_box(method),
                        std::hint::black_box(status),
                        elapsed,
                    );
                }
                start.elapsed().as_nanos() as f64 / f64::from(N)
            };
            let single = one(&m);
            let both = std::thread::scope(|s| {
                let a = s.spawn(|| one(&m));
                let b = s.spawn(|| one(&m));
                (a.join().unwrap() + b.join().unwrap()) / 2.0
            });
            println!("record_request {what}: {single:.1} ns/op on one thread, {both:.1} ns/op on each of two");
        }
    }
}
