//! `GET /metrics` in the Prometheus text format (version 0.0.4), written by
//! `prometheus-client`: the HTTP figures are metrics of a registry kept here; the
//! process figures (/proc) and each database's engine figures are collectors, read
//! at scrape time.

use kiln_docs::DocStore;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    prometheus_text, DescriptorEncoder, EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet,
};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// The `Content-Type` of what `render` writes.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// Upper bounds of the request latency buckets, in microseconds.
const LATENCY_BUCKETS_US: [u64; 16] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000,
];

/// The route template of the document requests, as the router matches them and
/// the metrics label them (the own HTTP/1.1 loop labels its requests with it too).
pub(crate) const DOCUMENT_ROUTE: &str = "/dbs/{db}/docs/{*id}";

/// The document route's common answers are counted on the family's counters for
/// them, kept in an array once made: counting one then takes no lock, no map lookup
/// and no allocation (the family's lookup by labels, like the mutex and string
/// lookups before it, cost about a tenth of the server's CPU under W9, by perf).
const HOT_METHODS: [&str; 3] = ["GET", "PUT", "POST"];
const HOT_STATUSES: [u16; 6] = [200, 201, 304, 404, 409, 412];

/// The labels of `kiln_http_requests_total`, in that order. Borrowed where the
/// value is known in advance (the document route, the usual methods).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: Cow<'static, str>,
    method: Cow<'static, str>,
    status: u16,
}

pub struct Metrics {
    registry: Registry,
    started: Instant,
    /// Requests by route template, method and status.
    requests: Family<RequestLabels, Counter>,
    /// `requests`' series for `DOCUMENT_ROUTE` x `HOT_METHODS` x `HOT_STATUSES`,
    /// `[method][status]`, each made at its first request (so that the exposition,
    /// as before, shows only the answers given).
    document_hot: [[OnceLock<Counter>; HOT_STATUSES.len()]; HOT_METHODS.len()],
    /// Requests outside `document_hot`, by status class (`[2]` is 2xx), for `/stats`
    /// (a family cannot be read back).
    other_by_class: [AtomicU64; 10],
    latency: RequestLatency,
    pub connections_open: Gauge,
    pub connections_total: Counter,
    pub connections_refused: Counter,
    /// Connections the own HTTP/1.1 loop handed to hyper (at their first request
    /// that is not one document's GET, PUT or POST).
    pub connections_to_hyper: Counter,
    pub ws_connections_open: Gauge,
    pub ws_connections_total: Counter,
    pub ws_messages: Counter,
    pub ws_slow_consumers_dropped: Counter,
    pub bulk_running: Gauge,
    pub bulk_documents: Counter,
    /// Documents deleted because their `@metadata.@expires` passed.
    pub documents_expired: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        let started = Instant::now();
        let mut m = Metrics {
            registry: Registry::default(),
            started,
            requests: Family::default(),
            document_hot: Default::default(),
            other_by_class: Default::default(),
            latency: RequestLatency::default(),
            connections_open: Gauge::default(),
            connections_total: Counter::default(),
            connections_refused: Counter::default(),
            connections_to_hyper: Counter::default(),
            ws_connections_open: Gauge::default(),
            ws_connections_total: Counter::default(),
            ws_messages: Counter::default(),
            ws_slow_consumers_dropped: Counter::default(),
            bulk_running: Gauge::default(),
            bulk_documents: Counter::default(),
            documents_expired: Counter::default(),
        };
        m.register();
        m.registry
            .register_collector(Box::new(ProcessFigures { started }));
        m
    }
}

impl Metrics {
    /// Every metric kept here, under its exposed name (a counter's without the
    /// `_total` the encoding adds).
    fn register(&mut self) {
        let r = &mut self.registry;
        r.register(
            "kiln_http_requests",
            "HTTP requests by route, method and status",
            self.requests.clone(),
        );
        r.register(
            "kiln_http_request_duration_seconds",
            "HTTP request latency",
            self.latency.clone(),
        );
        r.register(
            "kiln_http_connections_open",
            "Open client connections",
            self.connections_open.clone(),
        );
        r.register(
            "kiln_http_connections",
            "Accepted connections",
            self.connections_total.clone(),
        );
        r.register(
            "kiln_http_connections_refused",
            "Connections refused over the connection limit",
            self.connections_refused.clone(),
        );
        r.register(
            "kiln_http_connections_to_hyper",
            "Connections the own HTTP/1.1 loop handed to hyper at a request other than a document GET, PUT or POST",
            self.connections_to_hyper.clone(),
        );
        r.register(
            "kiln_changes_ws_connections_open",
            "Open WebSocket changes connections",
            self.ws_connections_open.clone(),
        );
        r.register(
            "kiln_changes_ws_connections",
            "WebSocket changes connections accepted",
            self.ws_connections_total.clone(),
        );
        r.register(
            "kiln_changes_ws_messages",
            "Messages sent on changes connections (changes, heartbeats, acks)",
            self.ws_messages.clone(),
        );
        r.register(
            "kiln_changes_ws_slow_consumers_dropped",
            "Changes connections closed because their reader fell behind",
            self.ws_slow_consumers_dropped.clone(),
        );
        r.register(
            "kiln_bulk_inserts_running",
            "Bulk inserts in progress",
            self.bulk_running.clone(),
        );
        r.register(
            "kiln_bulk_documents",
            "Documents committed by bulk inserts",
            self.bulk_documents.clone(),
        );
        r.register(
            "kiln_documents_expired",
            "Documents deleted because their @metadata.@expires passed",
            self.documents_expired.clone(),
        );
    }

    /// Counts one answered request: once per request on the busiest path, so the
    /// document route's common answers touch only atomics (`document_hot`).
    pub fn record_request(&self, route: &str, method: &str, status: u16, elapsed: Duration) {
        match self.hot_counter(route, method, status) {
            Some(counter) => {
                counter.inc();
            }
            None => self.record_other(route, method, status),
        }
        self.latency.observe(elapsed);
    }

    fn hot_counter(&self, route: &str, method: &str, status: u16) -> Option<&Counter> {
        if route != DOCUMENT_ROUTE {
            return None;
        }
        let m = HOT_METHODS.iter().position(|&h| h == method)?;
        let s = HOT_STATUSES.iter().position(|&h| h == status)?;
        Some(self.document_hot[m][s].get_or_init(|| {
            let labels = RequestLabels {
                route: Cow::Borrowed(DOCUMENT_ROUTE),
                method: Cow::Borrowed(HOT_METHODS[m]),
                status,
            };
            self.requests.get_or_create(&labels).clone()
        }))
    }

    /// A request of another route, method or status: found (or made) in the
    /// family by its labels.
    fn record_other(&self, route: &str, method: &str, status: u16) {
        let labels = RequestLabels {
            route: if route == DOCUMENT_ROUTE {
                Cow::Borrowed(DOCUMENT_ROUTE)
            } else {
                Cow::Owned(route.to_owned())
            },
            method: match KNOWN_METHODS.iter().find(|&&m| m == method) {
                Some(&m) => Cow::Borrowed(m),
                None => Cow::Owned(method.to_owned()),
            },
            status,
        };
        self.requests.get_or_create(&labels).inc();
        self.other_by_class[status_class(status)].fetch_add(1, Relaxed);
    }

    /// Requests so far by status class: `{"2xx": n, "3xx": n, "4xx": n, "5xx": n}`
    /// (and another class when any).
    pub fn requests_by_status_class(&self) -> BTreeMap<String, u64> {
        let mut by_class: [u64; 10] = std::array::from_fn(|c| self.other_by_class[c].load(Relaxed));
        for counters in &self.document_hot {
            for (counter, status) in counters.iter().zip(HOT_STATUSES) {
                by_class[status_class(status)] += counter.get().map_or(0, Counter::get);
            }
        }
        by_class
            .iter()
            .enumerate()
            .filter(|&(c, &n)| n > 0 || (2..=5).contains(&c))
            .map(|(c, &n)| (format!("{c}xx"), n))
            .collect()
    }

    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// The exposition: the HTTP and process figures, then each database's.
    pub fn render(&self, store: &DocStore) -> String {
        self.render_with(EngineFigures::read(store))
    }

    fn render_with(&self, engines: EngineFigures) -> String {
        let mut scrape = Registry::default();
        scrape.register_collector(Box::new(engines));
        let mut out = String::with_capacity(16 << 10);
        let written = prometheus_text::encode(&mut out, &self.registry)
            .and_then(|()| prometheus_text::encode(&mut out, &scrape));
        if let Err(e) = written {
            // Only a value the format cannot hold fails (a gauge over i64::MAX).
            tracing::warn!(error = %e, "the metrics exposition stopped short");
        }
        out
    }
}

/// Methods whose label needs no allocation.
const KNOWN_METHODS: [&str; 7] = ["GET", "PUT", "POST", "DELETE", "HEAD", "OPTIONS", "PATCH"];

/// `status / 100`; a status is at most 999.
fn status_class(status: u16) -> usize {
    usize::from(status / 100).min(9)
}

/// `kiln_http_request_duration_seconds`, a histogram on atomics: the library's
/// `Histogram` takes a mutex per observation, one lock per request.
#[derive(Clone, Debug, Default)]
struct RequestLatency(Arc<LatencyBuckets>);

#[derive(Debug, Default)]
struct LatencyBuckets {
    /// Per bucket of `LATENCY_BUCKETS_US` (not cumulative), then the ones above
    /// the last bound; their sum is the count.
    counts: [AtomicU64; LATENCY_BUCKETS_US.len() + 1],
    sum_us: AtomicU64,
}

impl RequestLatency {
    fn observe(&self, elapsed: Duration) {
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        let bucket = LATENCY_BUCKETS_US.partition_point(|&bound| bound < us);
        self.0.counts[bucket].fetch_add(1, Relaxed);
        self.0.sum_us.fetch_add(us, Relaxed);
    }
}

impl EncodeMetric for RequestLatency {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let buckets: [(f64, u64); LATENCY_BUCKETS_US.len() + 1] = std::array::from_fn(|i| {
            let bound = LATENCY_BUCKETS_US
                .get(i)
                .map_or(f64::INFINITY, |&us| us as f64 / 1e6);
            (bound, self.0.counts[i].load(Relaxed))
        });
        let count = buckets.iter().map(|&(_, n)| n).sum();
        let sum = self.0.sum_us.load(Relaxed) as f64 / 1e6;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// Uptime, and the process's resident memory and open files from /proc.
#[derive(Debug)]
struct ProcessFigures {
    started: Instant,
}

impl Collector for ProcessFigures {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        gauge(
            &mut encoder,
            "kiln_uptime_seconds",
            "Seconds since the server started.",
            self.started.elapsed().as_secs_f64(),
        )?;
        if let Some(rss) = resident_memory_bytes() {
            gauge(
                &mut encoder,
                "kiln_process_resident_memory_bytes",
                "Resident memory.",
                rss,
            )?;
        }
        if let Some(fds) = open_fds() {
            gauge(
                &mut encoder,
                "kiln_process_open_fds",
                "Open file descriptors.",
                fds,
            )?;
        }
        let offloaded = ConstCounter::new(crate::read_offload::reads_offloaded());
        offloaded.encode(encoder.encode_descriptor(
            "kiln_document_reads_offloaded",
            "Document GETs read on the blocking pool because reads were waiting on the disk.",
            None,
            MetricType::Counter,
        )?)?;
        Ok(())
    }
}

fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: impl prometheus_client::encoding::EncodeGaugeValue,
) -> Result<(), std::fmt::Error> {
    let metric = ConstGauge::new(value);
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

/// Each database's engine figures, as read when the scrape began.
#[derive(Debug)]
struct EngineFigures {
    databases: Vec<DatabaseFigures>,
}

#[derive(Debug)]
struct DatabaseFigures {
    name: String,
    stats: kiln_storage::Stats,
    documents: u64,
}

type Field = fn(&DatabaseFigures) -> u64;

/// `(name, type, help, value)` of the per-database series labelled `db`; a
/// counter's name without the `_total` the encoding adds.
const ENGINE_SERIES: [(&str, MetricType, &str, Field); 14] = [
    (
        "kiln_commits",
        MetricType::Counter,
        "Committed write transactions.",
        |d| d.stats.commits,
    ),
    (
        "kiln_commit_groups",
        MetricType::Counter,
        "Groups of merged units committed by the commit queue.",
        |d| d.stats.commit_queue.groups,
    ),
    (
        "kiln_commit_units",
        MetricType::Counter,
        "Units committed through the commit queue.",
        |d| d.stats.commit_queue.units_committed,
    ),
    (
        "kiln_commit_group_units_max",
        MetricType::Gauge,
        "Largest commit group so far.",
        |d| d.stats.commit_queue.max_group_units,
    ),
    (
        "kiln_commit_overloaded",
        MetricType::Counter,
        "Writes refused because the commit queue was full.",
        |d| d.stats.commit_queue.overloaded_rejections,
    ),
    (
        "kiln_journal_writes",
        MetricType::Counter,
        "Durable journal writes.",
        |d| d.stats.journal_writes,
    ),
    (
        "kiln_journal_bytes",
        MetricType::Counter,
        "Bytes written to the journal.",
        |d| d.stats.journal_bytes,
    ),
    (
        "kiln_journal_referenced_value_bytes",
        MetricType::Counter,
        "Bytes of merged values the journal named by key instead of writing again.",
        |d| d.stats.journal_referenced_value_bytes,
    ),
    (
        "kiln_data_file_syncs",
        MetricType::Counter,
        "Data-file syncs by the flusher.",
        |d| d.stats.data_syncs,
    ),
    (
        "kiln_data_file_bytes",
        MetricType::Gauge,
        "Size of the data file.",
        |d| d.stats.data_file_bytes,
    ),
    (
        "kiln_pages_unflushed",
        MetricType::Gauge,
        "Committed pages not yet written back.",
        |d| d.stats.pages_unflushed,
    ),
    (
        "kiln_readers_open",
        MetricType::Gauge,
        "Open read transactions.",
        |d| d.stats.readers_open,
    ),
    (
        "kiln_journal_direct_io",
        MetricType::Gauge,
        "1 when the journal is written with O_DIRECT.",
        |d| u64::from(d.stats.journal_direct_io),
    ),
    (
        "kiln_documents",
        MetricType::Gauge,
        "Documents per database.",
        |d| d.documents,
    ),
];

type Latency = fn(&kiln_storage::Stats) -> kiln_storage::LatencySummary;

/// The engine's latencies, which it keeps as a running p50 and p99, a mean and a
/// count: `(name, help, which)`.
const ENGINE_LATENCIES: [(&str, &str, Latency); 2] = [
    (
        "kiln_journal_write_seconds",
        "Durable journal write latency",
        |s| s.journal_write_latency,
    ),
    (
        "kiln_data_file_sync_seconds",
        "Data-file sync latency",
        |s| s.data_sync_latency,
    ),
];

impl EngineFigures {
    fn read(store: &DocStore) -> EngineFigures {
        let databases = store
            .databases()
            .iter()
            .map(|db| DatabaseFigures {
                name: db.name().to_string(),
                stats: db.env().stats(),
                documents: db.document_count().unwrap_or(0),
            })
            .collect();
        EngineFigures { databases }
    }

    /// A summary's samples (`{quantile="0.5"}`, `{quantile="0.99"}`, `_sum` and
    /// `_count`, each labelled `db`). prometheus-client has no summary type: the
    /// samples keep their names and labels and are typed `untyped`, which a scraper
    /// stores as it would a summary's.
    fn encode_latency(
        &self,
        encoder: &mut DescriptorEncoder,
        (name, help, which): (&str, &str, Latency),
    ) -> Result<(), std::fmt::Error> {
        let summaries: Vec<_> = self
            .databases
            .iter()
            .map(|d| (d.name.as_str(), which(&d.stats)))
            .collect();
        let mut quantiles = encoder.encode_descriptor(
            name,
            &format!("{help}: the running p50 and p99."),
            None,
            MetricType::Unknown,
        )?;
        for &(db, l) in &summaries {
            for (quantile, us) in [("0.5", l.p50_us), ("0.99", l.p99_us)] {
                let labels = [("db", db), ("quantile", quantile)];
                quantiles
                    .encode_family(&labels)?
                    .encode_gauge(&(us as f64 / 1e6))?;
            }
        }
        let sum_name = format!("{name}_sum");
        let sum_help = format!("{help}: the sum of the latencies, in seconds.");
        let mut sums =
            encoder.encode_descriptor(&sum_name, &sum_help, None, MetricType::Unknown)?;
        for &(db, l) in &summaries {
            let sum = l.mean_us * l.count as f64 / 1e6;
            sums.encode_family(&[("db", db)])?.encode_gauge(&sum)?;
        }
        let count_name = format!("{name}_count");
        let count_help = format!("{help}: how many were measured.");
        let mut counts =
            encoder.encode_descriptor(&count_name, &count_help, None, MetricType::Unknown)?;
        for &(db, l) in &summaries {
            counts
                .encode_family(&[("db", db)])?
                .encode_gauge(&l.count)?;
        }
        Ok(())
    }
}

impl Collector for EngineFigures {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        if self.databases.is_empty() {
            return Ok(());
        }
        for (name, kind, help, field) in ENGINE_SERIES {
            let mut family = encoder.encode_descriptor(name, help, None, kind)?;
            for d in &self.databases {
                let labels = [("db", d.name.as_str())];
                let metric = family.encode_family(&labels)?;
                match kind {
                    MetricType::Counter => ConstCounter::new(field(d)).encode(metric)?,
                    _ => ConstGauge::new(field(d)).encode(metric)?,
                }
            }
        }
        for latency in ENGINE_LATENCIES {
            self.encode_latency(&mut encoder, latency)?;
        }
        Ok(())
    }
}

pub(crate) fn resident_memory_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok()?)
}

fn open_fds() -> Option<u64> {
    Some(std::fs::read_dir("/proc/self/fd").ok()?.count() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of the sample whose line starts with `series ` exactly.
    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    fn one_database() -> EngineFigures {
        EngineFigures {
            databases: vec![DatabaseFigures {
                name: "m".into(),
                stats: kiln_storage::Stats::default(),
                documents: 3,
            }],
        }
    }

    #[test]
    fn hot_and_other_counts_are_one_family() {
        let m = Metrics::default();
        let ms = Duration::from_millis(1);
        for _ in 0..3 {
            m.record_request(DOCUMENT_ROUTE, "GET", 200, ms);
        }
        m.record_request(DOCUMENT_ROUTE, "GET", 500, ms); // not a hot status
        m.record_request(DOCUMENT_ROUTE, "DELETE", 200, ms); // not a hot method
        m.record_request("/health", "GET", 200, ms); // not the hot route
        m.record_request("/health", "BREW", 418, ms); // a method of no list
        m.record_request("/a \"b\"", "GET", 404, Duration::from_secs(11)); // escaped; past the last bucket
        let text = m.render_with(one_database());
        let requests = |route: &str, method: &str, status: u16| {
            sample(
                &text,
                &format!(
                    r#"kiln_http_requests_total{{route="{route}",method="{method}",status="{status}"}}"#
                ),
            )
        };
        assert_eq!(requests(DOCUMENT_ROUTE, "GET", 200), Some(3.0));
        assert_eq!(requests(DOCUMENT_ROUTE, "GET", 500), Some(1.0));
        assert_eq!(requests(DOCUMENT_ROUTE, "DELETE", 200), Some(1.0));
        assert_eq!(requests("/health", "GET", 200), Some(1.0));
        assert_eq!(requests("/health", "BREW", 418), Some(1.0));
        assert_eq!(requests(r#"/a \"b\""#, "GET", 404), Some(1.0));
        // A hot series is shown once counted, as any other.
        assert_eq!(requests(DOCUMENT_ROUTE, "POST", 412), None);
        let classes = m.requests_by_status_class();
        assert_eq!(
            classes.into_iter().collect::<Vec<_>>(),
            [("2xx", 5), ("3xx", 0), ("4xx", 2), ("5xx", 1)].map(|(c, n)| (c.to_string(), n))
        );
        // The histogram: 1 ms is in the 0.001 bucket, 11 s only in +Inf.
        let bucket = |le: &str| {
            sample(
                &text,
                &format!(r#"kiln_http_request_duration_seconds_bucket{{le="{le}"}}"#),
            )
        };
        assert_eq!(bucket("0.0001"), Some(0.0));
        assert_eq!(bucket("0.001"), Some(7.0));
        assert_eq!(bucket("10"), Some(7.0));
        assert_eq!(bucket("+Inf"), Some(8.0));
        assert_eq!(
            sample(&text, "kiln_http_request_duration_seconds_count"),
            Some(8.0)
        );
        assert_eq!(
            sample(&text, "kiln_http_request_duration_seconds_sum"),
            Some(11.007)
        );
        assert!(text.contains("# TYPE kiln_http_request_duration_seconds histogram\n"));
        assert!(text.contains("# TYPE kiln_http_requests_total counter\n"));
    }

    /// Every series of the exposition as it was written by hand before
    /// prometheus-client wrote it: the same names, labels and types (the engine's
    /// latency summaries, which the library has no type for, are `untyped`).
    #[test]
    fn every_series_keeps_its_name() {
        let m = Metrics::default();
        m.record_request("/health", "GET", 200, Duration::from_micros(50));
        let text = m.render_with(one_database());
        let unlabelled = [
            ("kiln_http_request_duration_seconds_count", "histogram"),
            ("kiln_http_connections_open", "gauge"),
            ("kiln_http_connections_total", "counter"),
            ("kiln_http_connections_refused_total", "counter"),
            ("kiln_http_connections_to_hyper_total", "counter"),
            ("kiln_changes_ws_connections_open", "gauge"),
            ("kiln_changes_ws_connections_total", "counter"),
            ("kiln_changes_ws_messages_total", "counter"),
            ("kiln_changes_ws_slow_consumers_dropped_total", "counter"),
            ("kiln_bulk_inserts_running", "gauge"),
            ("kiln_bulk_documents_total", "counter"),
            ("kiln_documents_expired_total", "counter"),
            ("kiln_uptime_seconds", "gauge"),
            ("kiln_process_resident_memory_bytes", "gauge"),
            ("kiln_process_open_fds", "gauge"),
        ];
        for (name, kind) in unlabelled {
            assert!(sample(&text, name).is_some(), "{name}\n{text}");
            let family = name.strip_suffix("_count").unwrap_or(name);
            assert!(
                text.contains(&format!("# TYPE {family} {kind}\n")),
                "{family} {kind}\n{text}"
            );
        }
        let per_database = [
            ("kiln_commits_total", "counter"),
            ("kiln_commit_groups_total", "counter"),
            ("kiln_commit_units_total", "counter"),
            ("kiln_commit_group_units_max", "gauge"),
            ("kiln_commit_overloaded_total", "counter"),
            ("kiln_journal_writes_total", "counter"),
            ("kiln_journal_bytes_total", "counter"),
            ("kiln_journal_referenced_value_bytes_total", "counter"),
            ("kiln_data_file_syncs_total", "counter"),
            ("kiln_data_file_bytes", "gauge"),
            ("kiln_pages_unflushed", "gauge"),
            ("kiln_readers_open", "gauge"),
            ("kiln_journal_direct_io", "gauge"),
            ("kiln_documents", "gauge"),
            ("kiln_journal_write_seconds_sum", "untyped"),
            ("kiln_journal_write_seconds_count", "untyped"),
            ("kiln_data_file_sync_seconds_sum", "untyped"),
            ("kiln_data_file_sync_seconds_count", "untyped"),
        ];
        for (name, kind) in per_database {
            assert!(
                sample(&text, &format!(r#"{name}{{db="m"}}"#)).is_some(),
                "{name}\n{text}"
            );
            assert!(
                text.contains(&format!("# TYPE {name} {kind}\n")),
                "{name} {kind}\n{text}"
            );
        }
        assert_eq!(sample(&text, r#"kiln_documents{db="m"}"#), Some(3.0));
        for name in ["kiln_journal_write_seconds", "kiln_data_file_sync_seconds"] {
            for q in ["0.5", "0.99"] {
                let series = format!(r#"{name}{{db="m",quantile="{q}"}}"#);
                assert!(sample(&text, &series).is_some(), "{series}\n{text}");
            }
        }
        assert_eq!(
            sample(
                &text,
                r#"kiln_http_requests_total{route="/health",method="GET",status="200"}"#
            ),
            Some(1.0)
        );
        // Without databases, no engine family at all (not even its HELP).
        let bare = m.render_with(EngineFigures {
            databases: Vec::new(),
        });
        assert!(!bare.contains("kiln_commits_total"));
        assert!(bare.contains("kiln_uptime_seconds"));
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
            (
                "not hot (document DELETE 200)",
                DOCUMENT_ROUTE,
                "DELETE",
                200,
            ),
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
