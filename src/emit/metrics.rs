//! Metrics through `opentelemetry_sdk`: one `MeterProvider` with up to two readers, the SDK's
//! periodic reader (into the exporter queue, [`QueueMetricExporter`]) and a manual reader that the
//! Prometheus endpoint collects on each scrape, so both outputs carry the same series.
//!
//! Verdict metrics are labelled by tool and server, which are open sets: every instrument's stream
//! has the configured cardinality limit (`exporters.prometheus.cardinality_limit`, an SDK view),
//! and the SDK folds attribute sets past it into one `otel.metric.overflow="true"` series, as the
//! collector's `spanmetrics` connector does. (A hand-written guard used to do this under the SDK's
//! own default limit of 2000, so a configured limit above 2000 had no effect.)

use std::sync::Arc;
use std::time::Duration;

use opentelemetry::metrics::{Counter, Gauge, Histogram, Meter, MeterProvider as _, ObservableCounter};
use opentelemetry::KeyValue;
use opentelemetry_sdk::metrics::{ManualReader, SdkMeterProvider, Temporality};
use opentelemetry_sdk::Resource;
use rustc_hash::FxHashMap;

use crate::flow::outgoing::Outgoing;
use crate::flow::queue::{DepthGauge, Queue};
use crate::telemetry::instruments::{self as ins, Instrument};
use crate::telemetry::labels::{DropReason, ExportSignal, ItemKind, Transport};
use crate::telemetry::meters::{FlowMeters, ItemCounters};
use crate::verdict::{HealthState, Layer, Verdict};

/// The collector's exporter counters (`otelcol_exporter_sent_spans`, `..._send_failed_...`; the
/// `..._enqueue_failed_...` triple is the queues', in [`FlowMeters`]), counted in items rather
/// than requests so a dashboard can set them against the receivers' accepted counts. Labelled
/// `exporter` (always `otlp`: mcp-health has one), `signal` (what was sent: `passthrough`,
/// `health_spans`, `incident_logs`, `passthrough_metrics`, `passthrough_logs`, `own_metrics`) and
/// `transport` (`none` for an item no target takes).
#[derive(Clone)]
struct ExporterItems {
    sent: ItemCounters,
    send_failed: ItemCounters,
}

impl ExporterItems {
    fn new(meter: &Meter) -> Self {
        ExporterItems {
            sent: item_counters(meter, [&ins::EXPORTER_SENT_SPANS, &ins::EXPORTER_SENT_METRIC_POINTS, &ins::EXPORTER_SENT_LOG_RECORDS]),
            send_failed: item_counters(
                meter,
                [&ins::EXPORTER_SEND_FAILED_SPANS, &ins::EXPORTER_SEND_FAILED_METRIC_POINTS, &ins::EXPORTER_SEND_FAILED_LOG_RECORDS],
            ),
        }
    }

    fn add(counters: &ItemCounters, kind: ItemKind, n: u64, signal: ExportSignal, transport: Option<Transport>) {
        let attrs = [
            KeyValue::new("exporter", "otlp"),
            KeyValue::new("signal", signal.as_str()),
            KeyValue::new("transport", transport.map_or("none", Transport::as_str)),
        ];
        counters.of(kind).add(n, &attrs);
    }
}

/// The three item counters of one outcome, as [`ins`] declares them.
fn item_counters(meter: &Meter, [spans, metric_points, log_records]: [&Instrument; 3]) -> ItemCounters {
    ItemCounters { spans: counter(meter, spans), metric_points: counter(meter, metric_points), log_records: counter(meter, log_records) }
}

/// What a shared state store costs, from its [`StoreStats`](crate::state::StoreStats): reported
/// as the differences since the last report.
#[derive(Clone)]
pub(crate) struct StoreMeters {
    round_trips: Counter<u64>,
    bytes: Counter<u64>,
    versions: Gauge<u64>,
    deletes_left_to_expire: Counter<u64>,
}

impl StoreMeters {
    fn new(meter: &Meter) -> Self {
        StoreMeters {
            round_trips: counter(meter, &ins::STATE_STORE_ROUND_TRIPS),
            bytes: counter(meter, &ins::STATE_STORE_BYTES),
            versions: gauge(meter, &ins::STATE_STORE_VERSIONS),
            deletes_left_to_expire: counter(meter, &ins::STATE_STORE_DELETES_LEFT_TO_EXPIRE),
        }
    }

    /// Report `now` against `last` (what the previous report saw).
    pub(crate) fn report(&self, now: &crate::state::StoreStats, last: &crate::state::StoreStats) {
        let d = |a: u64, b: u64| a.saturating_sub(b);
        self.round_trips.add(d(now.round_trips, last.round_trips), &[]);
        self.bytes.add(d(now.bytes_sent, last.bytes_sent), &[KeyValue::new("direction", "sent")]);
        self.bytes.add(d(now.bytes_received, last.bytes_received), &[KeyValue::new("direction", "received")]);
        self.deletes_left_to_expire.add(d(now.deletes_left_to_expire, last.deletes_left_to_expire), &[]);
        self.versions.record(now.versions_held, &[]);
    }
}

/// A counter as [`ins`] declares it.
fn counter(meter: &Meter, i: &Instrument) -> Counter<u64> {
    debug_assert_eq!(i.kind, ins::Kind::Counter, "{}", i.name);
    meter.u64_counter(i.name).with_description(i.description).with_unit(i.unit).build()
}

/// A counter read at each collection (from the process-wide tallies `observe` reads).
fn observable_counter(
    meter: &Meter,
    i: &Instrument,
    observe: impl Fn(&dyn opentelemetry::metrics::AsyncInstrument<u64>) + Send + Sync + 'static,
) -> ObservableCounter<u64> {
    meter.u64_observable_counter(i.name).with_description(i.description).with_unit(i.unit).with_callback(observe).build()
}

/// A gauge read at each collection.
fn observable_gauge(
    meter: &Meter,
    i: &Instrument,
    observe: impl Fn(&dyn opentelemetry::metrics::AsyncInstrument<u64>) + Send + Sync + 'static,
) -> opentelemetry::metrics::ObservableGauge<u64> {
    meter.u64_observable_gauge(i.name).with_description(i.description).with_unit(i.unit).with_callback(observe).build()
}

/// A gauge as [`ins`] declares it.
fn gauge(meter: &Meter, i: &Instrument) -> Gauge<u64> {
    debug_assert_eq!(i.kind, ins::Kind::Gauge, "{}", i.name);
    meter.u64_gauge(i.name).with_description(i.description).with_unit(i.unit).build()
}

/// A histogram as [`ins`] declares it, with its bucket bounds.
fn histogram(meter: &Meter, i: &Instrument, bounds: &[f64]) -> Histogram<f64> {
    debug_assert_eq!(i.kind, ins::Kind::Histogram, "{}", i.name);
    meter.f64_histogram(i.name).with_description(i.description).with_unit(i.unit).with_boundaries(bounds.to_vec()).build()
}

/// The receivers' and the queues' counters: `early` (received, refused, rejected, looped,
/// signals received, refused and dropped, requests refused, attributes invalid) and
/// `enqueue_failed` made before, where [`HealthMeters::new`] keeps each in the order a
/// collection lists them; the receivers' item counters and the journal's made here, after them.
fn flow_meters(meter: &Meter, early: [Counter<u64>; 9], enqueue_failed: ItemCounters) -> FlowMeters {
    let [spans_received, spans_refused, spans_rejected, spans_looped, signals_received, signals_refused, requests_refused, signals_dropped, attributes_invalid] =
        early;
    FlowMeters {
        spans_received,
        spans_refused,
        spans_rejected,
        spans_looped,
        signals_received,
        signals_refused,
        requests_refused,
        signals_dropped,
        attributes_invalid,
        receiver_accepted: item_counters(
            meter,
            [&ins::RECEIVER_ACCEPTED_SPANS, &ins::RECEIVER_ACCEPTED_METRIC_POINTS, &ins::RECEIVER_ACCEPTED_LOG_RECORDS],
        ),
        receiver_refused: item_counters(
            meter,
            [&ins::RECEIVER_REFUSED_SPANS, &ins::RECEIVER_REFUSED_METRIC_POINTS, &ins::RECEIVER_REFUSED_LOG_RECORDS],
        ),
        enqueue_failed,
        journal_replayed: counter(meter, &ins::STATE_JOURNAL_REPLAYED),
    }
}

/// The meter every instrument is made with: one instrumentation scope, named and versioned, which
/// the Prometheus exposition writes as `otel_scope_name`/`otel_scope_version`.
pub(crate) fn meter(provider: &SdkMeterProvider) -> Meter {
    let scope = opentelemetry::InstrumentationScope::builder("mcp-health").with_version(env!("CARGO_PKG_VERSION")).build();
    provider.meter_with_scope(scope)
}

/// The rustc that built this binary (set by build.rs; empty when it could not be asked).
const RUSTC_VERSION: &str = env!("MCP_HEALTH_RUSTC_VERSION");

/// When the process started, as far as its metrics know: set when the first meters are made.
static STARTED: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

/// User and system CPU seconds of the whole process (getrusage), as the collector's
/// `otelcol_process_cpu_seconds`.
fn cpu_seconds() -> Option<(f64, f64)> {
    // SAFETY: getrusage only writes the struct it is given, which is zero-initialized plain data.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return None;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Some((secs(ru.ru_utime), secs(ru.ru_stime)))
}

/// Build info, CPU time and uptime, read at each collection: what every collector exposes
/// (`otelcol_process_cpu_seconds`, `otelcol_process_uptime`, the build's version on `target_info`)
/// so a dashboard can tell versions apart and see a restart or a busy process.
fn observe_process(meter: &Meter) {
    let started = *STARTED.get_or_init(std::time::Instant::now);
    let _info = meter
        .u64_observable_gauge(ins::BUILD_INFO.name)
        .with_description(ins::BUILD_INFO.description)
        .with_unit(ins::BUILD_INFO.unit)
        .with_callback(|o| {
            o.observe(1, &[KeyValue::new("version", env!("CARGO_PKG_VERSION")), KeyValue::new("rustc", RUSTC_VERSION)]);
        })
        .build();
    let _cpu = meter
        .f64_observable_counter(ins::PROCESS_CPU_TIME.name)
        .with_description(ins::PROCESS_CPU_TIME.description)
        .with_unit(ins::PROCESS_CPU_TIME.unit)
        .with_callback(|o| {
            if let Some((user, system)) = cpu_seconds() {
                o.observe(user, &[KeyValue::new("cpu.mode", "user")]);
                o.observe(system, &[KeyValue::new("cpu.mode", "system")]);
            }
        })
        .build();
    let _uptime = meter
        .f64_observable_counter(ins::PROCESS_UPTIME.name)
        .with_description(ins::PROCESS_UPTIME.description)
        .with_unit(ins::PROCESS_UPTIME.unit)
        .with_callback(move |o| o.observe(started.elapsed().as_secs_f64(), &[]))
        .build();
    let _expiry = meter
        .i64_observable_gauge(ins::TLS_CERTIFICATE_EXPIRY.name)
        .with_description(ins::TLS_CERTIFICATE_EXPIRY.description)
        .with_unit(ins::TLS_CERTIFICATE_EXPIRY.unit)
        .with_callback(|o| {
            for (l, not_after) in crate::receive::certificates::expiries() {
                o.observe(not_after, &[KeyValue::new("listener", l.as_str())]);
            }
        })
        .build();
    let _reloads = meter
        .u64_observable_counter(ins::TLS_RELOADS.name)
        .with_description(ins::TLS_RELOADS.description)
        .with_unit(ins::TLS_RELOADS.unit)
        .with_callback(|o| {
            for (l, result, n) in crate::receive::certificates::reload_counts() {
                if n > 0 {
                    o.observe(n, &[KeyValue::new("listener", l.as_str()), KeyValue::new("result", result.as_str())]);
                }
            }
        })
        .build();
}

/// Bucket bounds of `mcp_health.call.duration` (seconds): from a fast local tool to a long call.
pub(crate) const CALL_DURATION_BOUNDS: [f64; 15] =
    [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0];
/// Bucket bounds of `mcp_health.verifier.duration` (seconds).
const VERIFIER_DURATION_BOUNDS: [f64; 12] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];
/// Bucket bounds of `mcp_health.verdict.delay` (seconds): around `decision_wait` (500 ms by
/// default) up to `max_wait` and the late-span window.
pub(crate) const VERDICT_DELAY_BOUNDS: [f64; 14] = [0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0];

/// One exemplar: the trace of the last observation that fell into a bucket.
#[derive(Clone, Debug, PartialEq)]
pub struct Exemplar {
    /// Lowercase hex; the only exemplar label (never a tool name, request id or anything else a
    /// sender chose, which could hold a secret).
    pub trace_id: String,
    pub value: f64,
    /// When the observation was made (the decision moment), nanoseconds since the Unix epoch.
    pub time_ns: u64,
}

/// The last trace id per histogram bucket, so the OpenMetrics exposition can carry exemplars:
/// the OpenTelemetry SDK (0.33) has `HistogramDataPoint::exemplars()` but never records any
/// (every aggregation leaves the list empty). Bounded: only the latency histograms record here,
/// whose only attribute is `state` (a closed set), so at most states × buckets entries per metric.
#[derive(Debug, Default)]
pub struct Exemplars {
    by_bucket: std::sync::Mutex<FxHashMap<(String, usize), Exemplar>>,
}

impl Exemplars {
    /// The key of a series: its metric's OTLP name and its attributes, sorted by key.
    pub fn series_key<'a>(metric: &str, attrs: impl Iterator<Item = &'a KeyValue>) -> String {
        let mut kv: Vec<(&str, String)> = attrs.map(|kv| (kv.key.as_str(), kv.value.as_str().into_owned())).collect();
        kv.sort();
        let mut key = metric.to_string();
        for (k, v) in kv {
            key.push('\u{1f}');
            key.push_str(k);
            key.push('=');
            key.push_str(&v);
        }
        key
    }

    /// The exemplar of bucket `bucket` (0-based, the last is `+Inf`) of a series.
    pub fn get(&self, series: &str, bucket: usize) -> Option<Exemplar> {
        self.by_bucket.lock().unwrap_or_else(|p| p.into_inner()).get(&(series.to_string(), bucket)).cloned()
    }
}

/// The exemplars of one batch of verdicts, last per (series, bucket): `None` is
/// `mcp_health.verdict.delay`, `Some(state)` `mcp_health.call.duration` of that state.
#[derive(Default)]
pub struct BatchExemplars {
    by: FxHashMap<(Option<HealthState>, usize), (crate::evidence::TraceId, f64)>,
}

/// The bucket `value` falls into under explicit `bounds` (upper bounds inclusive, as in both
/// OpenTelemetry and Prometheus); `bounds.len()` is the `+Inf` bucket.
pub(crate) fn bucket_of(bounds: &[f64], value: f64) -> usize {
    bounds.iter().position(|b| value <= *b).unwrap_or(bounds.len())
}

/// The exporter queues' size and capacity (in requests), read at each collection, as the
/// collector's `otelcol_exporter_queue_size` / `_queue_capacity`. The callback holds a weak
/// gauge, so it never keeps the queue open at shutdown.
pub(crate) fn observe_exporter_queues(meter: &Meter, queues: &[&Queue<Outgoing>]) {
    let sizes: Vec<DepthGauge<Outgoing>> = queues.iter().map(|q| q.gauge()).collect();
    let capacities: Vec<(&'static str, u64)> = queues.iter().map(|q| (q.name(), q.capacity() as u64)).collect();
    let _size = meter
        .u64_observable_gauge(ins::EXPORTER_QUEUE_SIZE.name)
        .with_description(ins::EXPORTER_QUEUE_SIZE.description)
        .with_unit(ins::EXPORTER_QUEUE_SIZE.unit)
        .with_callback(move |o| {
            for g in &sizes {
                if let Some(depth) = g.depth() {
                    o.observe(depth as u64, &[KeyValue::new("exporter", g.name())]);
                }
            }
        })
        .build();
    let _capacity = meter
        .u64_observable_gauge(ins::EXPORTER_QUEUE_CAPACITY.name)
        .with_description(ins::EXPORTER_QUEUE_CAPACITY.description)
        .with_unit(ins::EXPORTER_QUEUE_CAPACITY.unit)
        .with_callback(move |o| {
            for (name, c) in &capacities {
                o.observe(*c, &[KeyValue::new("exporter", *name)]);
            }
        })
        .build();
}

/// What an on-disk sending queue holds, read at each collection by [`observe_disk_queue`].
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct DiskQueueReading {
    /// Requests waiting or being sent.
    pub requests: u64,
    /// Spans, log records, metric points.
    pub items: [u64; 3],
    pub bytes: u64,
    /// The bound in bytes (`sending_queue.storage_max_bytes`).
    pub capacity_bytes: u64,
    /// Files skipped because they could not be read back.
    pub damaged_files: u64,
}

/// The on-disk sending queue's gauges and its damaged-file counter, labelled
/// `exporter=<exporter>`; `read` is called at each collection (once per instrument). Nothing is
/// made for an in-memory queue: the caller does not call this.
pub(crate) fn observe_disk_queue(meter: &Meter, exporter: &'static str, read: impl Fn() -> DiskQueueReading + Send + Sync + 'static) {
    let read = Arc::new(read);
    let label = move || [KeyValue::new("exporter", exporter)];
    let gauge = |i: &'static ins::Instrument, value: fn(&DiskQueueReading) -> u64| {
        let read = read.clone();
        let _ = meter
            .u64_observable_gauge(i.name)
            .with_description(i.description)
            .with_unit(i.unit)
            .with_callback(move |o| o.observe(value(&read()), &label()))
            .build();
    };
    gauge(&ins::EXPORTER_QUEUE_STORED_REQUESTS, |r| r.requests);
    gauge(&ins::EXPORTER_QUEUE_STORED_BYTES, |r| r.bytes);
    gauge(&ins::EXPORTER_QUEUE_STORED_CAPACITY_BYTES, |r| r.capacity_bytes);
    let items = read.clone();
    let i = &ins::EXPORTER_QUEUE_STORED_ITEMS;
    let _ = meter
        .u64_observable_gauge(i.name)
        .with_description(i.description)
        .with_unit(i.unit)
        .with_callback(move |o| {
            let r = items();
            for (kind, n) in ["spans", "log_records", "metric_points"].into_iter().zip(r.items) {
                o.observe(n, &[KeyValue::new("exporter", exporter), KeyValue::new("kind", kind)]);
            }
        })
        .build();
    let i = &ins::EXPORTER_QUEUE_DAMAGED_FILES;
    let _ = meter
        .u64_observable_counter(i.name)
        .with_description(i.description)
        .with_unit(i.unit)
        .with_callback(move |o| o.observe(read().damaged_files, &label()))
        .build();
}

/// `mcp_health.memory.reserved`: what requests in flight and queued hold under
/// `processors.memory_limiter` (read, decoded, queued for pass-through, encoded for export), and
/// `mcp_health.memory.evidence`, what the engine's evidence holds; with the resident set they show
/// where the memory is and what the limiter counts.
pub(crate) fn observe_memory_limiter(meter: &Meter, limiter: &std::sync::Arc<crate::flow::memory::MemoryLimiter>) {
    let l = limiter.clone();
    let _reserved = meter
        .u64_observable_gauge(ins::MEMORY_RESERVED.name)
        .with_description(ins::MEMORY_RESERVED.description)
        .with_unit(ins::MEMORY_RESERVED.unit)
        .with_callback(move |o| o.observe(l.held(), &[]))
        .build();
    let l = limiter.clone();
    let _evidence = meter
        .u64_observable_gauge(ins::MEMORY_EVIDENCE.name)
        .with_description(ins::MEMORY_EVIDENCE.description)
        .with_unit(ins::MEMORY_EVIDENCE.unit)
        .with_callback(move |o| o.observe(l.engine_bytes(), &[]))
        .build();
}

/// The SDK's periodic reader hands mcp-health's own metrics to this exporter, which puts them in
/// the exporter queue: they then go out like every other signal (gRPC or HTTP, compression, TLS,
/// retries, item counts). A full queue drops the batch, counted as enqueue_failed; the next
/// collection carries the cumulative values again, so nothing is lost for good.
pub(crate) struct QueueMetricExporter {
    queue: std::sync::Mutex<Option<Queue<Outgoing>>>,
    meters: std::sync::OnceLock<HealthMeters>,
}

impl QueueMetricExporter {
    pub(crate) fn new(queue: Queue<Outgoing>) -> Self {
        QueueMetricExporter { queue: std::sync::Mutex::new(Some(queue)), meters: std::sync::OnceLock::new() }
    }
}

/// A handle to a [`QueueMetricExporter`] kept outside the provider (which owns the exporter), so
/// the meters can be given to it once they exist.
#[derive(Clone)]
pub struct QueueMetricExporterHandle(Arc<QueueMetricExporter>);

impl QueueMetricExporterHandle {
    pub fn new(queue: Queue<Outgoing>) -> Self {
        QueueMetricExporterHandle(Arc::new(QueueMetricExporter::new(queue)))
    }
}

impl opentelemetry_sdk::metrics::exporter::PushMetricExporter for QueueMetricExporterHandle {
    async fn export(&self, metrics: &opentelemetry_sdk::metrics::data::ResourceMetrics) -> opentelemetry_sdk::error::OTelSdkResult {
        let req = opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest::from(metrics);
        let item = Outgoing::OwnMetrics(req);
        let q = self.0.queue.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let meters = self.0.meters.get();
        let full = match q {
            Some(q) => q.offer(item, meters.map(|m| &m.flow)).is_err(),
            None => {
                if let Some(m) = meters {
                    let (kind, n) = item.items();
                    m.flow.enqueue_failed(ExportSignal::OwnMetrics, kind, n);
                }
                true
            }
        };
        if let Some(m) = meters.filter(|_| full) {
            m.export_dropped(ExportSignal::OwnMetrics, DropReason::QueueFull, 1);
        }
        Ok(())
    }
    fn force_flush(&self) -> opentelemetry_sdk::error::OTelSdkResult {
        Ok(())
    }
    /// Drops the queue sender, so the exporter workers can finish once the rest are gone.
    fn shutdown_with_timeout(&self, _timeout: Duration) -> opentelemetry_sdk::error::OTelSdkResult {
        self.0.queue.lock().unwrap_or_else(|p| p.into_inner()).take();
        Ok(())
    }
    fn temporality(&self) -> Temporality {
        Temporality::Cumulative
    }
}

/// Why the metrics pipeline could not be built.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("OTLP metric exporter: {0}")]
    Exporter(String),
}

/// The listeners' refusals (`timeouts: false`) or timeouts, with their listener and reason; a
/// listener that never refused or timed out has no series.
fn connection_counts(o: &dyn opentelemetry::metrics::AsyncInstrument<u64>, timeouts: bool) {
    for (l, why, n) in crate::receive::listen::closed_counts() {
        if n > 0 && why.is_timeout() == timeouts {
            o.observe(n, &[KeyValue::new("listener", l.as_str()), KeyValue::new("reason", why.as_str())]);
        }
    }
}

/// OTLP names of the latency histograms (the exemplar store is keyed by them).
pub(crate) const VERDICT_DELAY: &str = ins::VERDICT_DELAY.name;
pub(crate) const CALL_DURATION: &str = ins::CALL_DURATION.name;

/// Every instrument the service records.
#[derive(Clone)]
pub struct HealthMeters {
    verdicts: Counter<u64>,
    calls: Counter<u64>,
    protocol_success: Counter<u64>,
    verified_success: Counter<u64>,
    unconfirmed: Counter<u64>,
    /// What the receivers and the queues count (received, refused, dropped, enqueue failed).
    pub flow: FlowMeters,
    pub spans_late: Counter<u64>,
    pub spans_truncated: Counter<u64>,
    pub chains_evicted: Counter<u64>,
    pub chains_callless: Counter<u64>,
    pub joins: Counter<u64>,
    pub state_undecodable: Counter<u64>,
    pub receipts_capped: Counter<u64>,
    pub store_errors: Counter<u64>,
    pub store_conflicts: Counter<u64>,
    pub store_queue_waits: Counter<u64>,
    pub(crate) store: StoreMeters,
    pub incidents_unshared: Counter<u64>,
    pub late_evidence_dropped: Counter<u64>,
    pub spans_duplicate: Counter<u64>,
    pub verifiers_parked: Counter<u64>,
    pub verifiers_parked_dropped: Counter<u64>,
    pub http_spans_parked: Counter<u64>,
    pub http_spans_parked_dropped: Counter<u64>,
    pub chains_in_flight: Gauge<u64>,
    pub gauge_leader: Gauge<u64>,
    pub evidence_bytes: Gauge<u64>,
    pub exporter_sent: Counter<u64>,
    pub exporter_dropped: Counter<u64>,
    /// The collector's exporter counters, in items (see [`ExporterItems`]).
    exporter_items: ExporterItems,
    catalog_verdicts: Counter<u64>,
    pub drift_events: Counter<u64>,
    success_retracted: Counter<u64>,
    pub incidents_open: Gauge<u64>,
    pub incidents_transitions: Counter<u64>,
    pub catalog_convergence: Gauge<u64>,
    pub calls_working: Gauge<u64>,
    /// Entries the bounded tables evicted, by table: read from `crate::bounded::evictions` at each
    /// collection.
    pub state_evicted: ObservableCounter<u64>,
    /// Verdict-log records lost to failed writes (a full disk), read at each collection.
    pub verdict_log_write_errors: ObservableCounter<u64>,
    /// Export requests split in two because their encoding passed `max_request_bytes`, by signal.
    pub exporter_split: Counter<u64>,
    /// Verifier spans by rule and finding (`confirmed`, `missing`, `failed`, `stale`,
    /// `verifier_error`).
    pub verifier_runs: Counter<u64>,
    /// Verifiers that could not run, by rule and error class.
    pub verifier_errors: Counter<u64>,
    /// How long a verifier ran (its span's duration), by rule.
    pub verifier_duration: Histogram<f64>,
    /// Connections a listener closed at once (at `max_connections`) or whose TLS handshake failed,
    /// by listener and reason; read from `crate::receive::listen::closed_counts` at each collection.
    pub connections_refused: ObservableCounter<u64>,
    /// Connections a listener closed for `read_header_timeout` or `idle_timeout`, by listener and reason.
    pub connections_timed_out: ObservableCounter<u64>,
    /// Connections open now, by listener.
    /// Registered only where the level serves it (see [`MetricsPipeline::build`]).
    pub connections_open: Option<opentelemetry::metrics::ObservableGauge<u64>>,
    /// The process's resident set, read at each collection (what the memory limiter compares).
    pub process_memory_rss: opentelemetry::metrics::ObservableGauge<u64>,
    /// Time from a call's end (its latest span end) to its first verdict, in seconds.
    verdict_delay: Histogram<f64>,
    /// A `tools/call`'s duration (start to end of its spans), by the state of its first verdict.
    call_duration: Histogram<f64>,
    /// The trace id of the last observation per bucket of the two histograms above.
    pub exemplars: Arc<Exemplars>,
}

impl HealthMeters {
    pub fn new(meter: &Meter) -> Self {
        observe_process(meter);
        // Made in the order they always were (the order a collection lists them in).
        let verdicts = counter(meter, &ins::VERDICTS);
        let calls = counter(meter, &ins::CALLS);
        let protocol_success = counter(meter, &ins::CALLS_PROTOCOL_SUCCESS);
        let verified_success = counter(meter, &ins::CALLS_VERIFIED_SUCCESS);
        let unconfirmed = counter(meter, &ins::CALLS_UNCONFIRMED);
        // The receivers' counters come here in the order; the rest of the flow's further down.
        let flow_counters = [
            &ins::SPANS_RECEIVED,
            &ins::SPANS_REFUSED,
            &ins::SPANS_REJECTED,
            &ins::SPANS_LOOPED,
            &ins::SIGNALS_RECEIVED,
            &ins::SIGNALS_REFUSED,
            &ins::REQUESTS_REFUSED,
            &ins::SIGNALS_DROPPED,
            &ins::ATTRIBUTES_INVALID,
        ]
        .map(|i| counter(meter, i));
        let spans_late = counter(meter, &ins::SPANS_LATE);
        let spans_truncated = counter(meter, &ins::SPANS_TRUNCATED);
        let chains_evicted = counter(meter, &ins::CHAINS_EVICTED);
        let chains_callless = counter(meter, &ins::CHAINS_CALLLESS);
        let joins = counter(meter, &ins::JOINS);
        let state_undecodable = counter(meter, &ins::STATE_UNDECODABLE);
        let receipts_capped = counter(meter, &ins::RECEIPTS_CAPPED);
        let store_errors = counter(meter, &ins::STATE_STORE_ERRORS);
        let store_conflicts = counter(meter, &ins::STATE_STORE_CONFLICTS);
        let store_queue_waits = counter(meter, &ins::STATE_STORE_QUEUE_WAITS);
        let store = StoreMeters::new(meter);
        let incidents_unshared = counter(meter, &ins::INCIDENTS_UNSHARED);
        let late_evidence_dropped = counter(meter, &ins::SPANS_LATE_DROPPED);
        let spans_duplicate = counter(meter, &ins::SPANS_DUPLICATE);
        let verifiers_parked = counter(meter, &ins::VERIFIERS_PARKED);
        let verifiers_parked_dropped = counter(meter, &ins::VERIFIERS_PARKED_DROPPED);
        let http_spans_parked = counter(meter, &ins::HTTP_SPANS_PARKED);
        let http_spans_parked_dropped = counter(meter, &ins::HTTP_SPANS_PARKED_DROPPED);
        let chains_in_flight = gauge(meter, &ins::CHAINS_IN_FLIGHT);
        let gauge_leader = gauge(meter, &ins::STATE_LEASE_HOLDER);
        let evidence_bytes = gauge(meter, &ins::EVIDENCE_BYTES);
        let exporter_sent = counter(meter, &ins::EXPORTER_SENT);
        let exporter_dropped = counter(meter, &ins::EXPORTER_DROPPED);
        let exporter_items = ExporterItems::new(meter);
        let enqueue_failed = item_counters(
            meter,
            [&ins::EXPORTER_ENQUEUE_FAILED_SPANS, &ins::EXPORTER_ENQUEUE_FAILED_METRIC_POINTS, &ins::EXPORTER_ENQUEUE_FAILED_LOG_RECORDS],
        );
        HealthMeters {
            verdicts,
            calls,
            protocol_success,
            verified_success,
            unconfirmed,
            spans_late,
            spans_truncated,
            chains_evicted,
            chains_callless,
            joins,
            state_undecodable,
            receipts_capped,
            store_errors,
            store_conflicts,
            store_queue_waits,
            store,
            incidents_unshared,
            late_evidence_dropped,
            spans_duplicate,
            verifiers_parked,
            verifiers_parked_dropped,
            http_spans_parked,
            http_spans_parked_dropped,
            chains_in_flight,
            gauge_leader,
            evidence_bytes,
            exporter_sent,
            exporter_dropped,
            exporter_items,
            catalog_verdicts: counter(meter, &ins::CATALOG_VERDICTS),
            drift_events: counter(meter, &ins::CATALOG_DRIFT),
            incidents_open: gauge(meter, &ins::INCIDENTS_OPEN),
            incidents_transitions: counter(meter, &ins::INCIDENTS_TRANSITIONS),
            calls_working: gauge(meter, &ins::CALLS_WORKING),
            catalog_convergence: gauge(meter, &ins::CATALOG_CONVERGENCE),
            success_retracted: counter(meter, &ins::CALLS_SUCCESS_RETRACTED),
            exporter_split: counter(meter, &ins::EXPORTER_SPLIT_REQUESTS),
            verifier_runs: counter(meter, &ins::VERIFIER_RUNS),
            verifier_errors: counter(meter, &ins::VERIFIER_ERRORS),
            verifier_duration: histogram(meter, &ins::VERIFIER_DURATION, &VERIFIER_DURATION_BOUNDS),
            connections_refused: observable_counter(meter, &ins::CONNECTIONS_REFUSED, |o| connection_counts(o, false)),
            connections_timed_out: observable_counter(meter, &ins::CONNECTIONS_TIMED_OUT, |o| connection_counts(o, true)),
            connections_open: None,
            process_memory_rss: observable_gauge(meter, &ins::PROCESS_MEMORY_RSS, |o| {
                if let Some(rss) = crate::flow::memory::process_rss() {
                    o.observe(rss, &[]);
                }
            }),
            verdict_log_write_errors: observable_counter(meter, &ins::VERDICT_LOG_WRITE_ERRORS, |o| {
                o.observe(crate::telemetry::meters::VERDICT_LOG_WRITE_ERRORS.load(std::sync::atomic::Ordering::Relaxed), &[])
            }),
            state_evicted: observable_counter(meter, &ins::STATE_EVICTED, |o| {
                for (table, n) in crate::bounded::evictions() {
                    o.observe(n, &[KeyValue::new("table", table)]);
                }
            }),
            flow: flow_meters(meter, flow_counters, enqueue_failed),
            verdict_delay: histogram(meter, &ins::VERDICT_DELAY, &VERDICT_DELAY_BOUNDS),
            call_duration: histogram(meter, &ins::CALL_DURATION, &CALL_DURATION_BOUNDS),
            exemplars: Arc::new(Exemplars::default()),
        }
    }

    /// The latency histograms of a first verdict decided at `now`, each observation remembered as
    /// its bucket's exemplar. Revisions are left out: the call was counted with its first verdict,
    /// and a revision's delay measures how late the evidence came, not the service
    /// (`mcp_health.spans.late` counts those). A call without a known end is left out too.
    pub fn record_latency(&self, v: &Verdict, now: crate::evidence::time::Moment) {
        let mut batch = BatchExemplars::default();
        self.record_latency_into(v, now, &mut batch);
        self.flush_exemplars(&mut batch, now);
    }

    /// [`Self::record_latency`] for one verdict of a batch: the histograms take the value now,
    /// the exemplar waits in `batch` for [`Self::flush_exemplars`] (only the last of a batch per
    /// series and bucket would survive anyway: one series key and one hex id per batch, not per
    /// verdict, and no lock per verdict).
    pub fn record_latency_into(&self, v: &Verdict, now: crate::evidence::time::Moment, batch: &mut BatchExemplars) {
        if v.supersedes.is_some() || v.end_ns == 0 {
            return;
        }
        let now_ns = now.as_nanos();
        let delay = now_ns.saturating_sub(v.end_ns) as f64 / 1e9;
        self.verdict_delay.record(delay, &[]);
        batch.by.insert((None, bucket_of(&VERDICT_DELAY_BOUNDS, delay)), (v.trace_id, delay));
        // Like `mcp_health.calls`: tool calls only, not initialize or ping.
        if v.is_tools_call() && v.start_ns > 0 && v.end_ns >= v.start_ns {
            let duration = (v.end_ns - v.start_ns) as f64 / 1e9;
            self.call_duration.record(duration, &[KeyValue::new("state", v.state.as_str())]);
            batch.by.insert((Some(v.state), bucket_of(&CALL_DURATION_BOUNDS, duration)), (v.trace_id, duration));
        }
    }

    /// The exemplars a batch left, into [`Exemplars`]; `batch` is emptied.
    pub fn flush_exemplars(&self, batch: &mut BatchExemplars, now: crate::evidence::time::Moment) {
        if batch.by.is_empty() {
            return;
        }
        let now_ns = now.as_nanos();
        let mut map = self.exemplars.by_bucket.lock().unwrap_or_else(|p| p.into_inner());
        for ((state, bucket), (trace_id, value)) in batch.by.drain() {
            let series = match state {
                None => Exemplars::series_key(VERDICT_DELAY, [].iter()),
                Some(st) => Exemplars::series_key(CALL_DURATION, [KeyValue::new("state", st.as_str())].iter()),
            };
            map.insert((series, bucket), Exemplar { trace_id: crate::evidence::hash::to_hex(&trace_id), value, time_ns: now_ns });
        }
    }

    /// Items delivered upstream.
    pub fn export_sent(&self, signal: ExportSignal, transport: Transport, kind: ItemKind, n: u64) {
        ExporterItems::add(&self.exporter_items.sent, kind, n, signal, Some(transport));
        self.exporter_sent.add(1, &[KeyValue::new("signal", signal.as_str())]);
    }

    /// A request given up on (permanent error, retries exhausted, or no target for it, then
    /// `transport` is `None`): its items count as send_failed.
    pub fn export_failed(&self, signal: ExportSignal, transport: Option<Transport>, kind: ItemKind, n: u64) {
        ExporterItems::add(&self.exporter_items.send_failed, kind, n, signal, transport);
        self.export_dropped(signal, DropReason::SendFailed, 1);
    }

    /// `n` export requests (or health spans) of `signal` dropped.
    pub fn export_dropped(&self, signal: ExportSignal, reason: DropReason, n: u64) {
        self.exporter_dropped.add(n, &[KeyValue::new("signal", signal.as_str()), KeyValue::new("reason", reason.as_str())]);
    }

    /// An export request was split in two (it passed `max_request_bytes`).
    pub fn export_split(&self, signal: ExportSignal) {
        self.exporter_split.add(1, &[KeyValue::new("signal", signal.as_str())]);
    }

    /// Items the server refused inside an accepted request (partial success).
    pub fn export_failed_items(&self, signal: ExportSignal, transport: Transport, kind: ItemKind, n: u64) {
        ExporterItems::add(&self.exporter_items.send_failed, kind, n, signal, Some(transport));
    }

    /// Record one verdict (tests and low-volume callers; the pipeline uses a [`VerdictTally`]).
    pub fn record(&self, v: &Verdict) {
        let mut t = VerdictTally::default();
        t.add(v);
        t.flush(self);
    }

    /// Record a catalog verdict change.
    pub fn record_catalog(&self, server: Option<&str>, c: crate::classify::catalog::Convergence) {
        let attrs = vec![KeyValue::new("server.address", server.unwrap_or("").to_string()), KeyValue::new("convergence", c.as_str())];
        self.catalog_verdicts.add(1, &attrs);
    }

    /// Record a verifier run, as its span reported it.
    pub fn record_finding(&self, f: &crate::evidence::FindingMeta) {
        let verifier = KeyValue::new("verifier", f.verifier.as_deref().unwrap_or("").to_string());
        self.verifier_runs.add(1, &[verifier.clone(), KeyValue::new("result", f.result.unwrap_or("unknown"))]);
        if let Some(e) = f.error {
            self.verifier_errors.add(1, &[verifier.clone(), KeyValue::new("error", e)]);
        }
        self.verifier_duration.record(f.duration_ns as f64 / 1e9, &[verifier]);
    }

    /// Record a drift event (a definition that differs from its pin).
    pub fn record_drift(&self, server: &str, tool: &str) {
        let attrs = vec![KeyValue::new("server.address", server.to_string()), KeyValue::new("gen_ai.tool.name", tool.to_string())];
        self.drift_events.add(1, &attrs);
    }

    fn add_verdicts(&self, key: &CallKey, state: HealthState, layer: Option<Layer>, n: u64) {
        let mut va = key.attributes();
        va.push(KeyValue::new("state", state.as_str()));
        va.push(KeyValue::new("first_failed_layer", layer.map_or("none", |l| l.as_str())));
        self.verdicts.add(n, &va);
    }

    fn add_calls(&self, key: &CallKey, counts: [u64; 6]) {
        let ca = key.attributes();
        if counts[3] + counts[4] > 0 {
            let mut ra = ca.clone();
            ra.push(KeyValue::new("kind", "protocol"));
            self.success_retracted.add(counts[3], &ra);
            ra.pop();
            ra.push(KeyValue::new("kind", "verified"));
            self.success_retracted.add(counts[4], &ra);
        }
        self.calls.add(counts[0], &ca);
        // Both success counters get a point even at zero, so the series exist before the first
        // success and `rate(success) / rate(calls)` is 0 rather than absent.
        self.protocol_success.add(counts[1], &ca);
        self.verified_success.add(counts[2], &ca);
        if counts[5] > 0 {
            self.unconfirmed.add(counts[5], &ca);
        }
    }
}

/// The labels of a call series.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct CallKey {
    method: Option<String>,
    tool: Option<Arc<str>>,
    server: Option<Arc<str>>,
}

impl CallKey {
    fn attributes(&self) -> Vec<KeyValue> {
        vec![
            KeyValue::new("mcp.method.name", self.method.clone().unwrap_or_else(|| "unknown".into())),
            KeyValue::new("gen_ai.tool.name", self.tool.as_deref().unwrap_or("").to_string()),
            KeyValue::new("server.address", self.server.as_deref().unwrap_or("").to_string()),
        ]
    }
}

/// Verdict counts gathered between two flushes, so the SDK sees one `add` per series per flush
/// rather than four per verdict.
#[derive(Default)]
pub(crate) struct VerdictTally {
    /// By the hash of a call's labels: each series once, found by comparing the verdict's own
    /// fields, so counting a verdict clones nothing (issue 11: the key's `String` and `Arc`s
    /// were cloned twice per verdict).
    series: FxHashMap<u64, Vec<Series>>,
}

/// One call series' counts in a batch.
struct Series {
    key: CallKey,
    /// `mcp_health.verdicts` by state and first failed layer.
    verdicts: Vec<(HealthState, Option<Layer>, u64)>,
    /// calls, protocol successes, verified successes, protocol and verified retractions
    /// (`tools/call` only), unconfirmed attempts.
    calls: Option<[u64; 6]>,
}

fn labels_hash(method: Option<&str>, tool: Option<&str>, server: Option<&str>) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = rustc_hash::FxHasher::default();
    (method, tool, server).hash(&mut h);
    h.finish()
}

impl VerdictTally {
    /// Count a verdict. A revision counts the call once only: it adds a success that the previous
    /// verdict lacked; a success it withdraws is counted in `mcp_health.calls.success_retracted`
    /// (counters cannot go down). Every verdict, revisions included, counts in `mcp_health.verdicts`.
    pub(crate) fn add(&mut self, v: &Verdict) {
        let (method, tool, server) = (v.method.as_deref(), v.tool.as_deref(), v.server.as_deref());
        let bucket = self.series.entry(labels_hash(method, tool, server)).or_default();
        let at = match bucket
            .iter()
            .position(|s| s.key.method.as_deref() == method && s.key.tool.as_deref() == tool && s.key.server.as_deref() == server)
        {
            Some(at) => at,
            None => {
                let key = CallKey { method: v.method.clone(), tool: v.tool.clone(), server: v.server.clone() };
                bucket.push(Series { key, verdicts: Vec::new(), calls: None });
                bucket.len() - 1
            }
        };
        let series = &mut bucket[at];
        match series.verdicts.iter_mut().find(|(st, l, _)| *st == v.state && *l == v.first_failed_layer) {
            Some((_, _, n)) => *n += 1,
            None => series.verdicts.push((v.state, v.first_failed_layer, 1)),
        }
        // The two success rates count attempts only (SPEC section 2, `Verdict::attempt`): a
        // logical `tools/call`, or a session setup that failed; a `ping` or a successful setup is
        // a verdict, not an attempt.
        if !v.attempt {
            return;
        }
        let c = series.calls.get_or_insert([0; 6]);
        match v.supersedes {
            None => {
                c[0] += 1;
                c[1] += u64::from(v.protocol_success);
                c[2] += u64::from(v.verified_success);
                c[5] += u64::from(v.unconfirmed());
            }
            Some(p) => {
                c[5] += u64::from(v.unconfirmed() && !p.unconfirmed);
                c[1] += u64::from(v.protocol_success && !p.protocol_success);
                c[2] += u64::from(v.verified_success && !p.verified_success);
                c[3] += u64::from(p.protocol_success && !v.protocol_success);
                c[4] += u64::from(p.verified_success && !v.verified_success);
            }
        }
    }

    #[cfg(test)]
    fn calls(&self) -> Vec<[u64; 6]> {
        self.series.values().flatten().filter_map(|s| s.calls).collect()
    }

    #[cfg(test)]
    fn verdicts(&self) -> u64 {
        self.series.values().flatten().flat_map(|s| s.verdicts.iter().map(|(_, _, n)| n)).sum()
    }

    /// Hand the counts to the SDK and start over.
    pub(crate) fn flush(&mut self, m: &HealthMeters) {
        for (_, bucket) in self.series.drain() {
            for s in bucket {
                if let Some(c) = s.calls {
                    m.add_calls(&s.key, c);
                }
                for (state, layer, n) in s.verdicts {
                    m.add_verdicts(&s.key, state, layer, n);
                }
            }
        }
    }
}

/// The metrics pipeline: provider, instruments and the reader the Prometheus endpoint collects.
pub struct MetricsPipeline {
    pub provider: SdkMeterProvider,
    pub meters: HealthMeters,
    pub prometheus: Option<Arc<ManualReaderHandle>>,
}

/// A manual reader shared between the provider and the scrape endpoint.
#[derive(Debug)]
pub struct ManualReaderHandle(pub ManualReader);

impl opentelemetry_sdk::metrics::reader::MetricReader for SharedReader {
    fn register_pipeline(&self, pipeline: std::sync::Weak<opentelemetry_sdk::metrics::Pipeline>) {
        self.0 .0.register_pipeline(pipeline)
    }
    fn collect(&self, rm: &mut opentelemetry_sdk::metrics::data::ResourceMetrics) -> opentelemetry_sdk::error::OTelSdkResult {
        self.0 .0.collect(rm)
    }
    fn force_flush(&self) -> opentelemetry_sdk::error::OTelSdkResult {
        self.0 .0.force_flush()
    }
    fn shutdown_with_timeout(&self, timeout: Duration) -> opentelemetry_sdk::error::OTelSdkResult {
        self.0 .0.shutdown_with_timeout(timeout)
    }
    fn temporality(&self, kind: opentelemetry_sdk::metrics::InstrumentKind) -> Temporality {
        self.0 .0.temporality(kind)
    }
}

/// The provider owns its readers; this wrapper lets the scrape endpoint keep a handle too.
#[derive(Debug, Clone)]
struct SharedReader(Arc<ManualReaderHandle>);

/// Settings for [`MetricsPipeline::build`].
pub struct MetricsSettings {
    pub resource: Resource,
    pub prometheus: bool,
    pub otlp: Option<OtlpMetricsTarget>,
    pub cardinality_limit: usize,
    /// `service.telemetry.metrics.level`: which internal instruments are served.
    pub level: crate::telemetry::instruments::MetricsLevel,
}

/// Where OTLP metrics go: the exporter queue, every `interval` (the SDK's default, 60 s, or
/// `OTEL_METRIC_EXPORT_INTERVAL`, when `None`).
pub struct OtlpMetricsTarget {
    pub exporter: QueueMetricExporterHandle,
    pub interval: Option<Duration>,
}

impl MetricsPipeline {
    /// Build the provider. Must run inside a Tokio runtime (the tonic exporter needs one).
    pub fn build(s: MetricsSettings) -> Result<MetricsPipeline, MetricsError> {
        let mut builder = SdkMeterProvider::builder().with_resource(s.resource);
        let mut prom = None;
        if s.prometheus {
            let handle = Arc::new(ManualReaderHandle(ManualReader::builder().with_temporality(Temporality::Cumulative).build()));
            builder = builder.with_reader(SharedReader(handle.clone()));
            prom = Some(handle);
        }
        let mut queue_exporter = None;
        if let Some(t) = s.otlp {
            queue_exporter = Some(t.exporter.clone());
            let mut rb = opentelemetry_sdk::metrics::PeriodicReader::builder(t.exporter);
            if let Some(i) = t.interval {
                rb = rb.with_interval(i);
            }
            builder = builder.with_reader(rb.build());
        }
        // The configured limit on every stream: past it the SDK records into the overflow series.
        // An instrument the level does not serve is dropped here, for both readers, so the code
        // that records it need not know the level.
        let limit = s.cardinality_limit.max(1);
        let level = s.level;
        builder = builder.with_view(move |i: &opentelemetry_sdk::metrics::Instrument| {
            #[cfg(test)]
            tests::seen(i);
            let stream = opentelemetry_sdk::metrics::Stream::builder().with_cardinality_limit(limit);
            let served = ins::find(i.name()).is_none_or(|d| d.tier.served_at(level));
            let stream = if served { stream } else { stream.with_aggregation(opentelemetry_sdk::metrics::Aggregation::Drop) };
            stream.build().ok()
        });
        let provider = builder.build();
        let meter = meter(&provider);
        let mut meters = HealthMeters::new(&meter);
        // An observable instrument every view drops makes the SDK log an error at start
        // (`InstrumentCreationFailed`): one the level does not serve is not registered at all.
        if ins::CONNECTIONS_OPEN.tier.served_at(level) {
            meters.connections_open = Some(
                meter
                    .u64_observable_gauge(ins::CONNECTIONS_OPEN.name)
                    .with_description(ins::CONNECTIONS_OPEN.description)
                    .with_unit(ins::CONNECTIONS_OPEN.unit)
                    .with_callback(|o| {
                        for (l, n) in crate::receive::listen::open_counts() {
                            o.observe(n, &[KeyValue::new("listener", l.as_str())]);
                        }
                    })
                    .build(),
            );
        }
        if let Some(q) = queue_exporter {
            let _ = q.0.meters.set(meters.clone());
        }
        Ok(MetricsPipeline { provider, meters, prometheus: prom })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every instrument the SDK was asked to make, with its kind and unit (the views see each).
    static SEEN: std::sync::Mutex<Vec<(String, opentelemetry_sdk::metrics::InstrumentKind, String)>> = std::sync::Mutex::new(Vec::new());

    pub(super) fn seen(i: &opentelemetry_sdk::metrics::Instrument) {
        SEEN.lock().unwrap_or_else(|p| p.into_inner()).push((i.name().to_string(), i.kind(), i.unit().to_string()));
    }

    fn verdict(protocol: bool, verified: bool, supersedes: Option<crate::verdict::Superseded>) -> Verdict {
        Verdict { revision: u32::from(supersedes.is_some()), supersedes, ..crate::verdict::sample("tools/call", protocol, verified) }
    }

    #[test]
    fn a_revision_counts_the_change_not_the_call_again() {
        let mut t = VerdictTally::default();
        t.add(&verdict(true, false, None));
        let was = crate::verdict::Superseded {
            state: HealthState::Unverified,
            protocol_success: true,
            verified_success: false,
            unconfirmed: false,
        };
        t.add(&verdict(true, true, Some(was)));
        assert_eq!(t.calls(), vec![[1, 1, 1, 0, 0, 0]], "one call, one protocol success, one verified success");
        // A revision that withdraws a success is counted as a retraction.
        let mut t = VerdictTally::default();
        t.add(&verdict(true, true, None));
        let was =
            crate::verdict::Superseded { state: HealthState::Healthy, protocol_success: true, verified_success: true, unconfirmed: false };
        t.add(&verdict(true, false, Some(was)));
        assert_eq!(t.calls(), vec![[1, 1, 1, 0, 1, 0]]);
        assert_eq!(t.verdicts(), 2, "both verdicts are counted as verdicts");
        // Series apart by their labels; states apart within a series.
        let mut t = VerdictTally::default();
        t.add(&verdict(true, true, None));
        t.add(&Verdict { tool: Some("other".into()), ..verdict(true, true, None) });
        t.add(&Verdict { state: HealthState::ToolFailed, ..verdict(false, false, None) });
        assert_eq!(t.series.values().map(Vec::len).sum::<usize>(), 2, "two call series");
        assert_eq!(t.series.values().flatten().map(|s| s.verdicts.len()).sum::<usize>(), 3, "three (series, state) counts");
        assert_eq!(t.verdicts(), 3);
    }

    fn pipeline(limit: usize) -> MetricsPipeline {
        MetricsPipeline::build(MetricsSettings {
            resource: Resource::builder().with_service_name("t").build(),
            prometheus: true,
            otlp: None,
            cardinality_limit: limit,
            level: crate::telemetry::instruments::MetricsLevel::Detailed,
        })
        .unwrap()
    }

    fn verdicts_for_tools(p: &MetricsPipeline, n: usize) -> String {
        for i in 0..n {
            let mut v = verdict(true, false, None);
            v.tool = Some(std::sync::Arc::from(format!("tool_{i}")));
            p.meters.record(&v);
        }
        crate::emit::prometheus::render(p.prometheus.as_ref().unwrap())
    }

    /// Issue 10: a `cardinality_limit` above 2000 had no effect (the SDK's default stream limit
    /// applied under the hand-written guard). The configured limit is the SDK's now.
    #[test]
    fn a_cardinality_limit_above_2000_takes_effect_and_overflow_folds_past_it() {
        let text = verdicts_for_tools(&pipeline(3000), 2500);
        let series = text.lines().filter(|l| l.starts_with("mcp_health_calls_total{")).count();
        assert_eq!(series, 2500, "every tool its own series under a limit of 3000");
        assert!(!text.contains("otel_metric_overflow"));
        let text = verdicts_for_tools(&pipeline(10), 50);
        let series: Vec<&str> = text.lines().filter(|l| l.starts_with("mcp_health_calls_total{")).collect();
        assert!(series.len() <= 11, "at most the limit plus the overflow series: {}", series.len());
        assert!(series.iter().any(|l| l.contains("otel_metric_overflow=\"true\"")), "{series:?}");
    }

    fn timed(trace: u8, start_ns: u64, end_ns: u64, verified: bool) -> Verdict {
        Verdict { trace_id: [trace; 16], start_ns, end_ns, ..crate::verdict::sample("tools/call", true, verified) }
    }

    /// Issue 10: the latency histograms, and their trace-id exemplars on the buckets the
    /// observations fell into, in OpenMetrics only (the text format 0.0.4 has no exemplars).
    #[test]
    fn latency_histograms_carry_the_last_trace_id_per_bucket_in_openmetrics() {
        use crate::emit::prometheus::{render_as, Format};
        use crate::evidence::time::Moment;
        let p = pipeline(2000);
        let s = 1_000_000_000u64;
        let t0 = 1_700_000_000 * s;
        // Two healthy calls of 300 ms (the second replaces the first as its bucket's exemplar),
        // one unverified call of 2 s; verdicts 600 ms and 4 s after the calls' ends.
        p.meters.record_latency(&timed(0xa1, t0, t0 + 3 * s / 10, true), Moment::from_nanos(t0 + 9 * s / 10));
        p.meters.record_latency(&timed(0xa2, t0, t0 + 3 * s / 10, true), Moment::from_nanos(t0 + 9 * s / 10));
        p.meters.record_latency(&timed(0xb3, t0, t0 + 2 * s, false), Moment::from_nanos(t0 + 6 * s));
        // A revision and a call without a known end are not observed.
        let was = crate::verdict::Superseded {
            state: HealthState::Unverified,
            protocol_success: true,
            verified_success: false,
            unconfirmed: false,
        };
        p.meters.record_latency(&Verdict { supersedes: Some(was), ..timed(0xc4, t0, t0 + s, true) }, Moment::from_nanos(t0 + 2 * s));
        p.meters.record_latency(&timed(0xd5, t0, 0, true), Moment::from_nanos(t0 + 2 * s));

        let reader = p.prometheus.as_ref().unwrap();
        let om = render_as(reader, Format::OpenMetrics, Some(&p.meters.exemplars));
        let a2 = "a2".repeat(16);
        let b3 = "b3".repeat(16);
        // Every sample carries the scope, before `le`.
        let sc = format!("otel_scope_name=\"mcp-health\",otel_scope_version=\"{}\"", env!("CARGO_PKG_VERSION"));
        let has = |want: &str| assert!(om.lines().any(|l| l == want), "missing {want:?} in:\n{om}");
        has(&format!(
            "mcp_health_call_duration_seconds_bucket{{state=\"healthy\",{sc},le=\"0.5\"}} 2 # {{trace_id=\"{a2}\"}} 0.3 1700000000.9"
        ));
        has(&format!("mcp_health_call_duration_seconds_bucket{{state=\"healthy\",{sc},le=\"1\"}} 2"));
        has(&format!("mcp_health_call_duration_seconds_count{{state=\"healthy\",{sc}}} 2"));
        has(&format!(
            "mcp_health_call_duration_seconds_bucket{{state=\"unverified\",{sc},le=\"2.5\"}} 1 # {{trace_id=\"{b3}\"}} 2 1700000006"
        ));
        has(&format!("mcp_health_verdict_delay_seconds_bucket{{{sc},le=\"0.75\"}} 2 # {{trace_id=\"{a2}\"}} 0.6 1700000000.9"));
        has(&format!("mcp_health_verdict_delay_seconds_bucket{{{sc},le=\"5\"}} 3 # {{trace_id=\"{b3}\"}} 4 1700000006"));
        has(&format!("mcp_health_verdict_delay_seconds_count{{{sc}}} 3"));
        assert!(!om.contains(&"a1".repeat(16)) && !om.contains(&"c4".repeat(16)) && !om.contains(&"d5".repeat(16)), "{om}");
        // OpenMetrics framing: counter families without `_total`, samples with it, units named
        // where the family ends with them, `target_info` an info family, `# EOF` last.
        has("# TYPE mcp_health_build_info gauge");
        has("# TYPE mcp_health_call_duration_seconds histogram");
        has("# UNIT mcp_health_call_duration_seconds seconds");
        has("# TYPE mcp_health_process_uptime_seconds counter");
        has("# UNIT mcp_health_process_uptime_seconds seconds");
        has("# UNIT mcp_health_process_memory_rss_bytes bytes");
        has("# TYPE target info");
        assert!(om.lines().any(|l| l.starts_with("target_info{") && l.contains("service_name=\"t\"")), "{om}");
        assert!(om.ends_with("\n# EOF\n"), "{om}");
        assert!(om.lines().any(|l| l.starts_with("mcp_health_process_uptime_seconds_total{")), "{om}");
        assert!(om.lines().any(|l| l.starts_with("mcp_health_process_cpu_time_seconds_total{cpu_mode=\"user\",")), "{om}");
        // A unit line only under a family that ends with it (Prometheus refuses the scrape
        // otherwise), and none for annotations.
        for l in om.lines().filter(|l| l.starts_with("# UNIT ")) {
            let mut it = l.split(' ').skip(2);
            let (family, unit) = (it.next().unwrap(), it.next().unwrap());
            assert!(family.ends_with(&format!("_{unit}")), "{l}");
        }
        assert!(!om.contains("# UNIT mcp_health_calls "), "{om}");
        // Exemplars carry trace ids only.
        for l in om.lines().filter(|l| l.contains(" # {")) {
            let labels = &l[l.find(" # {").unwrap() + 4..l.rfind('}').unwrap()];
            assert!(labels.starts_with("trace_id=\"") && labels.len() == "trace_id=\"\"".len() + 32, "{l}");
        }

        let text = render_as(reader, Format::Text, Some(&p.meters.exemplars));
        assert!(
            !text.contains(" # {") && !text.contains("# EOF") && !text.contains("# UNIT"),
            "no exemplars, units or EOF in 0.0.4:\n{text}"
        );
        assert!(
            text.lines().any(|l| l == format!("mcp_health_call_duration_seconds_bucket{{state=\"healthy\",{sc},le=\"0.5\"}} 2")),
            "{text}"
        );
        assert!(text.lines().any(|l| l == "# TYPE mcp_health_process_uptime_seconds_total counter"), "{text}");
        assert!(text.lines().any(|l| l == "# TYPE target_info gauge"), "{text}");
    }

    /// The views see every instrument the service makes: each is declared in
    /// `telemetry::instruments` with its kind and unit, and every declaration is made.
    #[test]
    fn every_instrument_made_is_declared_and_every_declared_one_is_made() {
        use opentelemetry_sdk::metrics::InstrumentKind as K;
        let p = pipeline(10);
        let meter = meter(&p.provider);
        let (tx, _rx) = crate::flow::queue::bounded("otlp", 1, crate::flow::queue::OnFull::DropCounted);
        observe_exporter_queues(&meter, &[&tx]);
        observe_memory_limiter(&meter, &Arc::new(crate::flow::memory::MemoryLimiter::new(100, Some(20))));
        observe_disk_queue(&meter, "otlp", DiskQueueReading::default);
        let seen = SEEN.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for (name, kind, unit) in &seen {
            let Some(d) = ins::find(name) else { panic!("{name} is not declared in src/telemetry/instruments.rs") };
            let want = match kind {
                K::Counter | K::ObservableCounter => ins::Kind::Counter,
                K::Gauge | K::ObservableGauge | K::UpDownCounter | K::ObservableUpDownCounter => ins::Kind::Gauge,
                K::Histogram => ins::Kind::Histogram,
            };
            assert_eq!((d.kind, d.unit), (want, unit.as_str()), "{name}");
        }
        for d in ins::ALL {
            assert!(seen.iter().any(|(n, _, _)| n == d.name), "{} is declared but never made", d.name);
        }
    }

    /// `none` serves the verdict metrics and nothing of the service's own; each level serves
    /// what it declares.
    #[test]
    fn the_telemetry_level_chooses_the_internal_instruments() {
        use crate::telemetry::instruments::MetricsLevel;
        for level in [MetricsLevel::None, MetricsLevel::Basic, MetricsLevel::Normal, MetricsLevel::Detailed] {
            let p = MetricsPipeline::build(MetricsSettings {
                resource: Resource::builder().with_service_name("t").build(),
                prometheus: true,
                otlp: None,
                cardinality_limit: 100,
                level,
            })
            .unwrap();
            p.meters.record(&verdict(true, true, None));
            p.meters.flow.spans_received.add(1, &[KeyValue::new("transport", "grpc")]);
            p.meters.chains_in_flight.record(1, &[]);
            p.meters.exporter_sent.add(1, &[KeyValue::new("signal", "health_spans")]);
            let text = crate::emit::prometheus::render(p.prometheus.as_ref().unwrap());
            let served = |name: &str| text.lines().any(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']));
            assert!(served("mcp_health_calls_total") && served("target_info"), "{level:?}:\n{text}");
            for (i, name) in [
                (&ins::SPANS_RECEIVED, "mcp_health_spans_received_total"),
                (&ins::PROCESS_UPTIME, "mcp_health_process_uptime_seconds_total"),
                (&ins::CHAINS_IN_FLIGHT, "mcp_health_chains_in_flight"),
                (&ins::EXPORTER_SENT, "mcp_health_exporter_sent_total"),
            ] {
                assert_eq!(served(name), i.tier.served_at(level), "{name} at {level:?}:\n{text}");
            }
            if level == MetricsLevel::None {
                let internal: Vec<&str> = text
                    .lines()
                    .filter(|l| !l.starts_with('#') && !l.starts_with("target_info"))
                    .filter(|l| {
                        !ins::ALL.iter().any(|i| {
                            i.tier == ins::Tier::Output && l.starts_with(&crate::emit::prometheus::names(i.name, i.unit, i.kind).family)
                        })
                    })
                    .collect();
                assert!(internal.is_empty(), "internal metrics at level none: {internal:?}");
            }
        }
    }

    #[test]
    fn build_info_names_the_version_and_rustc() {
        let text = crate::emit::prometheus::render(pipeline(10).prometheus.as_ref().unwrap());
        // Labels in either order (the SDK may sort them).
        let (version, rustc) = (format!("version=\"{}\"", env!("CARGO_PKG_VERSION")), format!("rustc=\"{RUSTC_VERSION}\""));
        let line = text.lines().find(|l| l.starts_with("mcp_health_build_info{"));
        assert!(line.is_some_and(|l| l.contains(&version) && l.contains(&rustc) && l.ends_with("} 1")), "{line:?} in\n{text}");
        assert!(RUSTC_VERSION.starts_with("1."), "{RUSTC_VERSION:?}");
    }
}
