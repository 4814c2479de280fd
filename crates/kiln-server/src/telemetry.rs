//! Traces and the slow-request log (`kiln serve --otlp-endpoint URL`,
//! `--slow-request-ms N`).
//!
//! Spans are `tracing`'s: a request span (`kiln.request`) opened by the router's
//! `observe` layer, and children where a request's time goes — admission, the
//! write queue's wait, the commit and its journal write, the Raft round trip of a
//! cluster's write, a query's execution — named `kiln.*` in the crates that do the
//! work (the engine knows nothing of HTTP: its span is a child of whatever span is
//! current when it commits). Two layers read them, each only when asked for:
//! - OpenTelemetry (`tracing-opentelemetry`), exported over OTLP/HTTP with JSON
//!   bodies to `{endpoint}/v1/traces`; a W3C `traceparent` on a request is
//!   continued, and the answer carries `traceresponse` with the trace id;
//! - [`SpanTimings`], which keeps each request's child spans and their durations
//!   on the request's span, for the slow-request line `observe` writes.
//!
//! Off (neither flag), no span is created at all: the callsites are disabled once
//! (their filters look at metadata only) and `observe` makes no request span, so
//! the data path pays a branch. The own HTTP/1.1 loop (`http1/`) makes no spans:
//! with traces on, requests go through the router (`serve.rs`).

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use std::time::{Duration, Instant};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Span, Subscriber};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

pub const TRACEPARENT_HEADER: &str = "traceparent";
/// The answer's trace context (W3C Trace Context Level 2): `00-<trace id>-<span
/// id>-<flags>`, the span being the server's request span.
pub const TRACERESPONSE_HEADER: &str = "traceresponse";

/// The spans these layers look at: Kiln's own (`kiln.*`), not its libraries'.
fn kiln_span(meta: &tracing::Metadata<'_>) -> bool {
    meta.is_span() && meta.name().starts_with("kiln.")
}

/// What the server does with spans (`ServerConfig::traces`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traces {
    /// Spans go to an OpenTelemetry exporter (`--otlp-endpoint`).
    pub exported: bool,
    /// `--slow-request-ms`: a request that took at least this long gets a line
    /// (WARN, target `kiln::slow`) with its trace id and its spans' durations.
    pub slow_request_ms: Option<u64>,
}

impl Traces {
    /// Whether requests get spans at all.
    pub fn on(&self) -> bool {
        self.exported || self.slow_request_ms.is_some()
    }
}

/// How spans are encoded for the receiver (`OTEL_EXPORTER_OTLP_PROTOCOL`'s
/// `http/protobuf`, the standard's default, or `http/json`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OtlpProtocol {
    #[default]
    Protobuf,
    Json,
}

impl std::str::FromStr for OtlpProtocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "http/protobuf" => Ok(OtlpProtocol::Protobuf),
            "http/json" => Ok(OtlpProtocol::Json),
            "grpc" => Err(
                "grpc is not supported: use http/protobuf or http/json (port 4318 of a collector)"
                    .to_string(),
            ),
            other => Err(format!(
                "unknown OTLP protocol {other:?}: http/protobuf or http/json"
            )),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("--otlp-endpoint {endpoint}: {why}")]
    Endpoint { endpoint: String, why: String },
}

/// Keeps the exporter's provider; dropping it sends the spans still buffered
/// (a graceful shutdown loses no trace).
pub struct TelemetryGuard {
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take() {
            if let Err(e) = p.shutdown_with_timeout(Duration::from_secs(5)) {
                tracing::warn!("traces: the last spans were not sent: {e}");
            }
        }
    }
}

/// A layer of a boxed subscriber stack (the CLI composes it with its log layer).
pub type BoxedLayer<S> = Box<dyn Layer<S> + Send + Sync + 'static>;

/// The trace layers, if any were asked for.
pub type TraceLayers<S> = Option<Vec<BoxedLayer<S>>>;

/// The layers asked for, filtered to Kiln's spans: the OpenTelemetry exporter to
/// `otlp`'s endpoint (an `http://host:port` base, as `OTEL_EXPORTER_OTLP_ENDPOINT`),
/// and the slow-request timings; `None` when neither is (not an empty Vec: an empty
/// Vec of layers answers "never" for every call site, silencing the log lines
/// too). Must be called outside an async runtime (the exporter's HTTP client starts
/// its own).
pub fn layers<S>(
    otlp: Option<(&str, OtlpProtocol)>,
    slow_request_ms: Option<u64>,
) -> Result<(TraceLayers<S>, TelemetryGuard), TelemetryError>
where
    S: Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
{
    let mut layers: Vec<BoxedLayer<S>> = Vec::new();
    let mut guard = TelemetryGuard { provider: None };
    if let Some((endpoint, protocol)) = otlp {
        let provider = otlp_provider(endpoint, protocol)?;
        let tracer = provider.tracer("kiln");
        layers.push(Box::new(
            tracing_opentelemetry::layer()
                .with_tracer(tracer)
                .with_filter(tracing_subscriber::filter::filter_fn(kiln_span)),
        ));
        guard.provider = Some(provider);
    }
    if slow_request_ms.is_some() {
        layers.push(Box::new(
            SpanTimings.with_filter(tracing_subscriber::filter::filter_fn(kiln_span)),
        ));
    }
    Ok(((!layers.is_empty()).then_some(layers), guard))
}

fn otlp_provider(
    endpoint: &str,
    protocol: OtlpProtocol,
) -> Result<opentelemetry_sdk::trace::SdkTracerProvider, TelemetryError> {
    use opentelemetry_otlp::WithExportConfig;
    let fail = |why: String| TelemetryError::Endpoint {
        endpoint: endpoint.to_string(),
        why,
    };
    let base = endpoint.trim_end_matches('/');
    if base.starts_with("https://") {
        return Err(fail(
            "https is not supported: send the spans to a local OpenTelemetry Collector (or agent) over http, which forwards them".to_string(),
        ));
    }
    let valid = base
        .strip_prefix("http://")
        .is_some_and(|rest| !rest.is_empty() && base.parse::<axum::http::Uri>().is_ok());
    if !valid {
        return Err(fail(
            "not an http:// URL of an OTLP/HTTP receiver (e.g. http://localhost:4318)".to_string(),
        ));
    }
    let protocol = match protocol {
        OtlpProtocol::Protobuf => opentelemetry_otlp::Protocol::HttpBinary,
        OtlpProtocol::Json => opentelemetry_otlp::Protocol::HttpJson,
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(protocol)
        .with_endpoint(format!("{base}/v1/traces"))
        .with_timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| fail(e.to_string()))?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name("kiln")
        .build();
    Ok(opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build())
}

/// A request's span, continuing the trace of its `traceparent` (when spans are
/// exported), and the `traceresponse` value to answer with.
pub fn request_span(
    traces: &Traces,
    headers: &axum::http::HeaderMap,
    method: &str,
    path: &str,
    request_id: &str,
) -> (Span, String) {
    let span = tracing::info_span!(
        "kiln.request",
        otel.name = %format_args!("{method} {path}"),
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        http.request.method = %method,
        url.path = %path,
        http.route = tracing::field::Empty,
        http.response.status_code = tracing::field::Empty,
        request_id = %request_id,
        trace_id = tracing::field::Empty,
    );
    let response = if traces.exported {
        let parent = opentelemetry_sdk::propagation::TraceContextPropagator::new()
            .extract(&HeaderExtractor(headers));
        // A malformed or absent traceparent extracts an empty context: a new trace.
        let _ = span.set_parent(parent);
        let context = span.context();
        let sc = context.span().span_context().clone();
        format!(
            "00-{:032x}-{:016x}-{:02x}",
            sc.trace_id(),
            sc.span_id(),
            sc.trace_flags().to_u8()
        )
    } else {
        let presented = headers
            .get(TRACEPARENT_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(TraceParent::parse);
        let trace_id = presented.map_or_else(rand::random::<u128>, |p| p.trace_id);
        let flags = presented.map_or(1, |p| p.flags);
        format!(
            "00-{trace_id:032x}-{:016x}-{flags:02x}",
            rand::random::<u64>() | 1
        )
    };
    span.record("trace_id", &response[3..35]);
    (span, response)
}

/// The route template and status of the answer, on the request's span (named
/// `METHOD /route/{template}` from now on, as OpenTelemetry's conventions say).
pub fn record_answer(span: &Span, method: &str, route: Option<&str>, status: u16) {
    if let Some(route) = route {
        span.record("http.route", route);
        // The exported span was started with the path as its name (the route is
        // known only once routed): renamed on the live span itself.
        span.context()
            .span()
            .update_name(format!("{method} {route}"));
    }
    span.record("http.response.status_code", status);
    if status >= 500 {
        span.record("otel.status_code", "ERROR");
    }
}

/// A parsed W3C `traceparent` (version 00): `00-<32 hex>-<16 hex>-<2 hex>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: u128,
    pub parent_id: u64,
    pub flags: u8,
}

impl TraceParent {
    /// `None` for anything the specification says to ignore (a new trace starts).
    pub fn parse(value: &str) -> Option<TraceParent> {
        let mut parts = value.trim().split('-');
        let (version, trace, parent, flags) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let hex = |s: &str, n: usize| {
            s.len() == n && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        };
        if version != "00" || parts.next().is_some() || !hex(trace, 32) || !hex(parent, 16) {
            return None;
        }
        if !hex(flags, 2) {
            return None;
        }
        let trace_id = u128::from_str_radix(trace, 16).ok()?;
        let parent_id = u64::from_str_radix(parent, 16).ok()?;
        // All-zero ids are invalid (W3C Trace Context, 3.2.2.3 and 3.2.2.4).
        if trace_id == 0 || parent_id == 0 {
            return None;
        }
        Some(TraceParent {
            trace_id,
            parent_id,
            flags: u8::from_str_radix(flags, 16).ok()?,
        })
    }
}

struct HeaderExtractor<'a>(&'a axum::http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// Keeps, on each request span, its descendants' names, start offsets,
/// durations and fields, for the slow-request line.
pub struct SpanTimings;

/// When a span started, and its fields as text.
struct Started {
    at: Instant,
    fields: String,
}

/// A closed descendant of a request span.
#[derive(Clone, Debug)]
pub struct TimedSpan {
    pub name: &'static str,
    /// 1 for a child of the request span, 2 for a grandchild, ...
    pub depth: usize,
    pub started: Instant,
    pub elapsed: Duration,
    pub fields: String,
}

/// The closed descendants of a request span (in its extensions).
#[derive(Default)]
struct Timeline(Vec<TimedSpan>);

/// Appends `name=value` pairs to a string.
struct FieldText<'a>(&'a mut String);

impl Visit for FieldText<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write;
        if field.name().starts_with("otel.") {
            return;
        }
        if !self.0.is_empty() {
            self.0.push(' ');
        }
        let _ = write!(self.0, "{}={:?}", field.name(), value);
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.record_debug(field, &format_args!("{value}"));
    }
}

impl<S> Layer<S> for SpanTimings
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut fields = String::new();
        attrs.record(&mut FieldText(&mut fields));
        span.extensions_mut().insert(Started {
            at: Instant::now(),
            fields,
        });
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut ext = span.extensions_mut();
        if let Some(started) = ext.get_mut::<Started>() {
            values.record(&mut FieldText(&mut started.fields));
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let Some(started) = span.extensions_mut().remove::<Started>() else {
            return;
        };
        let ancestors: Vec<_> = span.scope().skip(1).collect();
        // A root has nobody to report to: `observe` reads its timeline.
        let Some(root) = ancestors.last() else { return };
        if root.name() != "kiln.request" {
            return;
        }
        let timed = TimedSpan {
            name: span.name(),
            depth: ancestors.len(),
            started: started.at,
            elapsed: started.at.elapsed(),
            fields: started.fields,
        };
        let mut ext = root.extensions_mut();
        match ext.get_mut::<Timeline>() {
            Some(t) => t.0.push(timed),
            None => ext.insert(Timeline(vec![timed])),
        }
    }
}

/// The request span's closed descendants, in the order they started (taken:
/// asked once, when the request is answered).
pub fn take_timeline(span: &Span) -> Vec<TimedSpan> {
    let mut out = span
        .with_subscriber(|(id, dispatch)| {
            let registry = dispatch.downcast_ref::<tracing_subscriber::Registry>()?;
            let data = registry.span(id)?;
            let mut ext = data.extensions_mut();
            ext.remove::<Timeline>().map(|t| t.0)
        })
        .flatten()
        .unwrap_or_default();
    out.sort_by_key(|t| t.started);
    out
}

/// The slow-request line: the request, its trace id, and each span's start (from
/// the request's) and duration, indented by depth.
pub fn slow_request_line(
    started: Instant,
    elapsed: Duration,
    what: &str,
    trace_id: &str,
    spans: &[TimedSpan],
) -> String {
    use std::fmt::Write;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mut line = format!(
        "slow request: {what} took {:.3} ms trace_id={trace_id}",
        ms(elapsed)
    );
    for s in spans {
        let offset = s.started.saturating_duration_since(started);
        let _ = write!(
            line,
            " | {}{} +{:.3}ms {:.3}ms",
            "  ".repeat(s.depth.saturating_sub(1)),
            s.name,
            ms(offset),
            ms(s.elapsed)
        );
        if !s.fields.is_empty() {
            let _ = write!(line, " {}", s.fields);
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_is_read_as_the_specification_says() {
        let p =
            TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        assert_eq!(p.trace_id, 0x4bf92f3577b34da6a3ce929d0e0e4736);
        assert_eq!(p.parent_id, 0x00f067aa0ba902b7);
        assert_eq!(p.flags, 1);
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_timings_layer_keeps_descendants_on_the_request_span() {
        use tracing_subscriber::layer::SubscriberExt;
        let subscriber = tracing_subscriber::registry()
            .with(SpanTimings.with_filter(tracing_subscriber::filter::filter_fn(kiln_span)));
        tracing::subscriber::with_default(subscriber, || {
            let request = tracing::info_span!("kiln.request", status = tracing::field::Empty);
            let started = Instant::now();
            {
                let _e = request.enter();
                let commit = tracing::info_span!("kiln.commit", writes = 3);
                {
                    let _c = commit.enter();
                    let journal = tracing::info_span!("kiln.journal.write", bytes = 4096);
                    drop(journal);
                }
                // Not Kiln's: filtered out.
                drop(tracing::info_span!("hyper.thing"));
                drop(commit);
            }
            let timeline = take_timeline(&request);
            let names: Vec<_> = timeline.iter().map(|t| (t.name, t.depth)).collect();
            assert_eq!(names, [("kiln.commit", 1), ("kiln.journal.write", 2)]);
            assert_eq!(timeline[0].fields, "writes=3");
            let line =
                slow_request_line(started, Duration::from_millis(7), "PUT /x", "ab", &timeline);
            assert!(line.contains("PUT /x took 7.000 ms trace_id=ab"), "{line}");
            assert!(line.contains("|   kiln.journal.write +"), "{line}");
            assert!(line.contains("bytes=4096"), "{line}");
            assert!(take_timeline(&request).is_empty(), "taken once");
        });
    }
}
