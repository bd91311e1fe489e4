//! `exporters:`, the exporters' configuration: the OTLP exporter (endpoints, queue, retry,
//! client TLS), the Prometheus endpoint and the verdict log. Declared beside the exporters;
//! `config` assembles the tree and adds what needs more than this part of it (the export-loop
//! check against the receivers, where the on-disk queue lives).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use crate::defaults;
use crate::emit::tls_client;
use crate::receive::config::{check_endpoint, check_listener, empty_is_default, listener_config};

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Exporters {
    #[serde(default, deserialize_with = "empty_is_default")]
    pub otlp: Option<OtlpExporter>,
    #[serde(default, deserialize_with = "empty_is_default")]
    pub prometheus: Option<PrometheusExporter>,
    #[serde(default, deserialize_with = "empty_is_default")]
    pub verdict_log: Option<VerdictLog>,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OtlpExporter {
    /// gRPC endpoint, e.g. `http://127.0.0.1:4317`. Falls back to `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`
    /// then `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub endpoint: Option<String>,
    /// Metrics endpoint, if different. Falls back to `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`, then `endpoint`.
    pub metrics_endpoint: Option<String>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Falls back to `OTEL_EXPORTER_OTLP_TIMEOUT` (milliseconds), then 10s.
    #[serde(default, with = "humantime_serde")]
    pub timeout: Option<Duration>,
    /// `gzip`, `zstd` or `none` (the collector's values). Falls back to
    /// `OTEL_EXPORTER_OTLP_{TRACES_,METRICS_}COMPRESSION`, then none.
    pub compression: Option<String>,
    /// `grpc` (the default), `http/protobuf` or `http/json`: the transport of every signal.
    ///
    /// A key on the one exporter rather than a second `otlphttp` exporter as the collector has:
    /// here one exporter owns the queue, the retry and what goes upstream (`passthrough`,
    /// `health_spans`, `metrics`); two exporters would split those or send everything twice. The
    /// values are the OTLP specification's, so the key and `OTEL_EXPORTER_OTLP_PROTOCOL` (its
    /// fallback, after `OTEL_EXPORTER_OTLP_{TRACES,METRICS}_PROTOCOL`) read the same.
    pub protocol: Option<String>,
    /// Client TLS (the collector's `configtls` client settings); see
    /// [`tls_client::TlsClientSetting`]. Its files fall back to `OTEL_EXPORTER_OTLP_CERTIFICATE`,
    /// `..._CLIENT_CERTIFICATE` and `..._CLIENT_KEY` (signal-specific first).
    #[serde(default, deserialize_with = "empty_is_default")]
    pub tls: Option<tls_client::TlsClientSetting>,
    /// Pass every received span on unchanged (the inline layout). Off unless asked for: in the
    /// fan-out layout, the default, the collector already sends every span to the backend, and
    /// passing them on as well would store each one twice.
    #[serde(default)]
    pub passthrough: bool,
    /// Send one health span per decided call.
    #[serde(default = "defaults::yes")]
    pub health_spans: bool,
    /// Export metrics over OTLP.
    #[serde(default = "defaults::yes")]
    pub metrics: bool,
    /// Falls back to `OTEL_METRIC_EXPORT_INTERVAL` (milliseconds).
    #[serde(default, with = "humantime_serde")]
    pub metrics_interval: Option<Duration>,
    #[serde(default)]
    pub sending_queue: SendingQueue,
    #[serde(default)]
    pub retry_on_failure: RetryOnFailure,
    /// Export requests whose encoding is larger are split in halves before they are sent
    /// (default 2 MiB, well under the 4 MiB that the collector's and Rotel's receivers take by
    /// default). A "too large" answer (`OUT_OF_RANGE` / `RESOURCE_EXHAUSTED` naming the size,
    /// HTTP 413) is never retried.
    #[serde(default = "d_max_request_bytes")]
    pub max_request_bytes: usize,
}

fn d_max_request_bytes() -> usize {
    DEFAULT_MAX_REQUEST_BYTES
}

/// `exporters.otlp.max_request_bytes` by default: 2 MiB, well under the 4 MiB a collector's
/// receiver takes by default.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 2 << 20;

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SendingQueue {
    /// The collector's switch. `false` keeps no requests waiting: a queue of one (pass-through
    /// is refused, retryably, as soon as the workers are busy; own output is dropped and
    /// counted), never on disk. The collector has the caller wait for the send instead; here the
    /// callers (receivers, the engine) never wait for the backend, so one slot is the nearest.
    #[serde(default = "defaults::yes")]
    pub enabled: bool,
    /// Export requests held while the backend is slow or down.
    #[serde(default = "defaults::count::<256>")]
    pub queue_size: usize,
    /// Where mcp-health's own output (health spans, incident records, own metrics) waits for the
    /// backend on disk: a directory, or `file_storage` naming the `extensions.file_storage`
    /// extension (the collector's spelling: a reference to a storage extension). Unset, the
    /// queue is on disk in `<storage.directory>/sending_queue` when `storage.directory` is set,
    /// in memory otherwise.
    #[serde(default)]
    pub storage: Option<String>,
    /// The bound of the on-disk queue, in bytes (requests that would pass it are dropped and
    /// counted as `enqueue_failed`).
    #[serde(default = "d_storage_max_bytes")]
    pub storage_max_bytes: u64,
    /// Requests sent at once from each queue (pass-through, and mcp-health's own output), as
    /// the collector's `sending_queue.num_consumers` (default 10, as there). With two, an inline
    /// mcp-health passed on at most two requests per backend round trip: its queue filled and
    /// clients were refused `exporter_busy` at a third of what the backend could take.
    #[serde(default = "d_num_consumers")]
    pub num_consumers: usize,
}

fn d_num_consumers() -> usize {
    10
}

/// `exporters.otlp.sending_queue.storage_max_bytes` by default: 256 MiB.
pub const DEFAULT_STORAGE_MAX_BYTES: u64 = 256 << 20;

fn d_storage_max_bytes() -> u64 {
    DEFAULT_STORAGE_MAX_BYTES
}

impl Default for SendingQueue {
    fn default() -> Self {
        SendingQueue {
            enabled: true,
            queue_size: defaults::count::<256>(),
            storage: None,
            storage_max_bytes: d_storage_max_bytes(),
            num_consumers: d_num_consumers(),
        }
    }
}

impl SendingQueue {
    /// Requests the in-memory queue holds: one when the queue is switched off.
    pub fn capacity(&self) -> usize {
        if self.enabled {
            self.queue_size
        } else {
            1
        }
    }
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RetryOnFailure {
    #[serde(default = "defaults::yes")]
    pub enabled: bool,
    #[serde(default = "defaults::millis::<500>", with = "humantime_serde")]
    pub initial_interval: Duration,
    #[serde(default = "defaults::secs::<30>", with = "humantime_serde")]
    pub max_interval: Duration,
    /// How long one request is retried at most; 0 is no limit (retried until it is accepted or
    /// the service stops), as in the collector.
    #[serde(default = "defaults::secs::<300>", with = "humantime_serde")]
    pub max_elapsed_time: Duration,
    /// Each wait is spread over `interval × [1 − f, 1 + f]` (the collector's default, 0.5): the
    /// OTLP exporter specification requires jitter, so many senders do not retry in step.
    #[serde(default = "d_half")]
    pub randomization_factor: f64,
    /// How much the interval grows after each retry (the collector's default, 1.5).
    #[serde(default = "d_one_and_half")]
    pub multiplier: f64,
}

fn d_half() -> f64 {
    0.5
}
fn d_one_and_half() -> f64 {
    1.5
}

impl Default for RetryOnFailure {
    fn default() -> Self {
        RetryOnFailure {
            enabled: true,
            initial_interval: defaults::millis::<500>(),
            max_interval: defaults::secs::<30>(),
            max_elapsed_time: defaults::secs::<300>(),
            randomization_factor: d_half(),
            multiplier: d_one_and_half(),
        }
    }
}

listener_config! {
    // Plaintext only (no `tls`): a scrape endpoint for a local or sidecar Prometheus.
    pub struct PrometheusExporter {
        #[serde(default = "default_prom_endpoint")]
        pub endpoint: String,
        /// Most series per metric; further attribute sets go to one `otel_metric_overflow="true"` series.
        #[serde(default = "defaults::count::<2_000>")]
        pub cardinality_limit: usize,
    }
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct VerdictLog {
    /// `stdout` or a file path; one JSON object per verdict.
    #[serde(default = "default_stdout")]
    pub path: String,
}

impl Exporters {
    /// The values that parsed but are not allowed: `Err((key, why))`, the key under `key_prefix`
    /// (`exporters`). `file_storage` says whether `extensions.file_storage` is configured (what
    /// `sending_queue.storage: file_storage` names).
    pub fn check(&self, key_prefix: &str, file_storage: bool) -> Result<(), (String, String)> {
        if let Some(o) = &self.otlp {
            o.retry_on_failure.check(&format!("{key_prefix}.otlp.retry_on_failure"))?;
        }
        if let Some(pr) = &self.prometheus {
            let prefix = format!("{key_prefix}.prometheus");
            check_listener(&prefix, pr.connections(), None)?;
            check_endpoint(&format!("{prefix}.endpoint"), &pr.endpoint, 9464)?;
            if pr.cardinality_limit == 0 {
                return Err((format!("{prefix}.cardinality_limit"), "must be at least 1".into()));
            }
        }
        if let Some(o) = &self.otlp {
            o.check(&format!("{key_prefix}.otlp"), file_storage)?;
        }
        Ok(())
    }
}

impl RetryOnFailure {
    fn check(&self, key_prefix: &str) -> Result<(), (String, String)> {
        if !(0.0..1.0).contains(&self.randomization_factor) {
            return Err((format!("{key_prefix}.randomization_factor"), "must be at least 0 and less than 1".into()));
        }
        if !(self.multiplier >= 1.0 && self.multiplier.is_finite()) {
            return Err((format!("{key_prefix}.multiplier"), "must be at least 1".into()));
        }
        Ok(())
    }
}

impl OtlpExporter {
    /// Everything but `retry_on_failure` (checked first, see [`Exporters::check`]).
    fn check(&self, key_prefix: &str, file_storage: bool) -> Result<(), (String, String)> {
        let bad = |key: &str, why: &str| Err((format!("{key_prefix}.{key}"), why.to_string()));
        if let Some(c) = &self.compression {
            if !["gzip", "zstd", "none"].contains(&c.as_str()) {
                return bad("compression", "must be gzip, zstd or none");
            }
        }
        if let Some(p) = &self.protocol {
            if !["grpc", "http/protobuf", "http/json"].contains(&p.as_str()) {
                return bad("protocol", "must be grpc, http/protobuf or http/json");
            }
        }
        if let Some(t) = &self.tls {
            if let Err(e) = t.check() {
                return bad("tls", &e.to_string());
            }
            let plain = |e: &Option<String>| e.as_deref().is_some_and(|e| e.starts_with("http://"));
            if t.asks_for_tls() && !t.insecure && (plain(&self.endpoint) || plain(&self.metrics_endpoint)) {
                return bad("tls", "TLS settings with an http:// endpoint would be unused: use https://");
            }
        }
        self.sending_queue.check(&format!("{key_prefix}.sending_queue"), file_storage)
    }
}

impl SendingQueue {
    fn check(&self, key_prefix: &str, file_storage: bool) -> Result<(), (String, String)> {
        let bad = |key: &str, why: &str| Err((format!("{key_prefix}.{key}"), why.to_string()));
        if self.queue_size == 0 {
            return bad("queue_size", "must be at least 1");
        }
        if !(1..=1000).contains(&self.num_consumers) {
            return bad("num_consumers", "must be between 1 and 1000");
        }
        match self.storage.as_deref() {
            Some(_) if !self.enabled => return bad("storage", "needs the queue: enabled: false keeps no requests waiting"),
            Some(s) if s.trim().is_empty() => return bad("storage", "must be a directory or file_storage"),
            Some("file_storage") if !file_storage => {
                return bad("storage", "file_storage names extensions.file_storage, which is not configured")
            }
            Some(s) if s.starts_with("file_storage/") => {
                return bad("storage", "one file_storage extension is supported: write file_storage")
            }
            _ => {}
        }
        if self.storage_max_bytes < 1 << 20 {
            return bad("storage_max_bytes", "must be at least 1048576 (1 MiB)");
        }
        Ok(())
    }
}

fn default_prom_endpoint() -> String {
    "127.0.0.1:9464".into()
}
fn default_stdout() -> String {
    "stdout".into()
}
