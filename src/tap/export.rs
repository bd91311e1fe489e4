//! The tap's OTLP span exporter: a bounded queue, batches, and a sender that never blocks the
//! proxied stream. When the collector is down or slow, spans are dropped and counted, and stderr
//! says so at most once a minute. The connection is the service's own exporter's
//! (`emit::otlp_traces::SpanSender`): gRPC, http/protobuf or http/json, TLS and client
//! certificates, headers (`OTEL_EXPORTER_OTLP_HEADERS`), from the same settings and variables, so
//! a receiver that requires a bearer token or a client certificate can require them of the taps.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use tokio::sync::mpsc;

/// Settings of [`spawn`].
#[derive(Clone, Debug)]
pub struct ExportSettings {
    /// OTLP/gRPC endpoint (`http://host:port`, or `host:port`).
    pub endpoint: String,
    /// `service.name` of the resource: the client's identity where the protocol has no session.
    pub service_name: String,
    /// Spans held while the collector is slow; past it new spans are dropped.
    pub queue_size: usize,
    pub max_batch: usize,
    /// A batch is sent at the latest this long after its first span.
    pub batch_delay: Duration,
    pub timeout: Duration,
    /// How often a failing export may be reported on stderr.
    pub warn_interval: Duration,
    /// Headers sent with every export (besides `OTEL_EXPORTER_OTLP_HEADERS`).
    pub headers: Vec<(String, String)>,
    /// `grpc` (default), `http/protobuf`, `http/json` (else `OTEL_EXPORTER_OTLP_PROTOCOL`).
    pub protocol: Option<String>,
    /// TLS of the connection (else the `OTEL_EXPORTER_OTLP_CERTIFICATE`, `…CLIENT_CERTIFICATE`,
    /// `…CLIENT_KEY` variables; an `https://` endpoint is TLS).
    pub tls: Option<crate::config::tls_client::TlsClientSetting>,
    /// Also append every batch to this file, one OTLP/JSON `ExportTraceServiceRequest` per line
    /// (what `mcp-health replay` reads): a CI job records a test run's evidence, then gates on it.
    pub record: Option<std::path::PathBuf>,
    /// Send the batches over OTLP (off when the tap only records to a file).
    pub send: bool,
}

impl ExportSettings {
    pub fn new(endpoint: impl Into<String>, service_name: impl Into<String>) -> Self {
        ExportSettings {
            endpoint: endpoint.into(),
            service_name: service_name.into(),
            queue_size: 8192,
            max_batch: 512,
            batch_delay: Duration::from_millis(200),
            timeout: Duration::from_secs(5),
            warn_interval: Duration::from_secs(60),
            headers: Vec::new(),
            protocol: None,
            tls: None,
            record: None,
            send: true,
        }
    }
}

/// Counters of the exporter.
#[derive(Debug, Default)]
pub struct ExportStats {
    pub sent: AtomicU64,
    pub dropped: AtomicU64,
    pub failed_requests: AtomicU64,
    last_warn: Mutex<Option<Instant>>,
}

impl ExportStats {
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// Where the observer puts its spans. Cheap to clone; never blocks.
#[derive(Clone)]
pub struct SpanSink {
    tx: mpsc::Sender<Span>,
    stats: Arc<ExportStats>,
    endpoint: Arc<str>,
    warn_interval: Duration,
}

impl SpanSink {
    /// Queue a span; when the queue is full it is dropped and counted.
    pub fn emit(&self, span: Span) {
        if self.tx.try_send(span).is_err() {
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            warn_limited(&self.stats, self.warn_interval, &format!("span queue full (collector at {} slow or down)", self.endpoint));
        }
    }
}

/// Say on stderr that spans are being dropped, at most once per `interval`.
fn warn_limited(stats: &ExportStats, interval: Duration, why: &str) {
    let mut last = stats.last_warn.lock().unwrap_or_else(|p| p.into_inner());
    if last.is_some_and(|t| t.elapsed() < interval) {
        return;
    }
    *last = Some(Instant::now());
    eprintln!("mcp-health tap: {why}; spans are dropped ({} so far), the proxied traffic is not affected", stats.dropped());
}

/// The running exporter task.
pub struct Exporter {
    join: tokio::task::JoinHandle<()>,
    pub stats: Arc<ExportStats>,
}

impl Exporter {
    /// Wait until every queued span was sent or dropped (all [`SpanSink`]s must be dropped first),
    /// at most `timeout`. Returns (sent, dropped).
    pub async fn finish(self, timeout: Duration) -> (u64, u64) {
        let stats = self.stats.clone();
        let mut join = self.join;
        if tokio::time::timeout(timeout, &mut join).await.is_err() {
            join.abort();
        }
        (stats.sent(), stats.dropped())
    }
}

/// Add `http://` to `host:port`.
pub(crate) fn endpoint_uri(e: &str) -> String {
    crate::emit::otlp_traces::endpoint_uri(e)
}

/// Start the exporter. Must be called inside a Tokio runtime.
pub fn spawn(settings: ExportSettings) -> Result<(SpanSink, Exporter), String> {
    let mut o: crate::config::OtlpExporter = serde_yaml_ng::from_str("{}").map_err(|e| e.to_string())?;
    o.endpoint = Some(endpoint_uri(&settings.endpoint));
    o.timeout = Some(settings.timeout);
    o.protocol = settings.protocol.clone();
    o.tls = settings.tls.clone();
    o.headers = settings.headers.iter().cloned().collect();
    let targets = crate::emit::otlp_target::resolve(&o, &|k| std::env::var(k).ok()).map_err(|e| e.to_string())?;
    let target = targets.traces.ok_or("no OTLP endpoint")?;
    let sender = crate::emit::otlp_traces::SpanSender::new(&target).map_err(|e| e.to_string())?;
    let uri = sender.url().to_string();
    let sender = settings.send.then_some(sender);
    let mut record = settings.record.as_deref().map(Recorder::open).transpose()?;
    let (tx, mut rx) = mpsc::channel::<Span>(settings.queue_size.max(1));
    let stats = Arc::new(ExportStats::default());
    let sink = SpanSink { tx, stats: stats.clone(), endpoint: uri.clone().into(), warn_interval: settings.warn_interval };
    let resource = Resource {
        attributes: vec![
            str_kv("service.name", &settings.service_name),
            str_kv("telemetry.sdk.name", "mcp-health-tap"),
            str_kv("telemetry.sdk.language", "rust"),
            str_kv("telemetry.sdk.version", env!("CARGO_PKG_VERSION")),
        ],
        ..Default::default()
    };
    let scope = InstrumentationScope { name: "mcp-health-tap".into(), version: env!("CARGO_PKG_VERSION").into(), ..Default::default() };
    let st = stats.clone();
    let join = tokio::spawn(async move {
        let mut closed = false;
        while !closed {
            let Some(first) = rx.recv().await else { break };
            let mut batch = vec![first];
            let deadline = tokio::time::Instant::now() + settings.batch_delay;
            while batch.len() < settings.max_batch {
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(s)) => batch.push(s),
                    Ok(None) => {
                        closed = true;
                        break;
                    }
                    Err(_) => break,
                }
            }
            let n = batch.len() as u64;
            let req = ExportTraceServiceRequest {
                resource_spans: vec![ResourceSpans {
                    resource: Some(resource.clone()),
                    scope_spans: vec![ScopeSpans { scope: Some(scope.clone()), spans: batch, ..Default::default() }],
                    ..Default::default()
                }],
            };
            if let Some(r) = record.as_mut() {
                r.append(&req);
            }
            let Some(sender) = sender.as_ref() else {
                st.sent.fetch_add(n, Ordering::Relaxed);
                continue;
            };
            match sender.send(req).await {
                Ok(rejected) => {
                    st.sent.fetch_add(n - rejected.min(n), Ordering::Relaxed);
                    st.dropped.fetch_add(rejected.min(n), Ordering::Relaxed);
                }
                Err(why) => {
                    st.dropped.fetch_add(n, Ordering::Relaxed);
                    st.failed_requests.fetch_add(1, Ordering::Relaxed);
                    warn_limited(
                        &st,
                        settings.warn_interval,
                        &format!("OTLP export to {uri} failed ({})", why.chars().take(160).collect::<String>()),
                    );
                }
            }
        }
    });
    Ok((sink, Exporter { join, stats }))
}

/// The `--record` file: OTLP/JSON lines appended, each batch in one `write`, so several taps of
/// one test run (a client that starts its server more than once) can share a file.
struct Recorder {
    file: std::fs::File,
    path: std::path::PathBuf,
    failed: bool,
}

impl Recorder {
    fn open(path: &std::path::Path) -> Result<Recorder, String> {
        let file =
            std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(|e| format!("--record {}: {e}", path.display()))?;
        Ok(Recorder { file, path: path.to_path_buf(), failed: false })
    }

    /// Append one batch as a line. A failed write is said once on stderr; the proxied traffic is
    /// never affected.
    fn append(&mut self, req: &ExportTraceServiceRequest) {
        use std::io::Write;
        let line = serde_json::to_vec(req).map(|mut l| {
            l.push(b'\n');
            l
        });
        let res = line.map_err(std::io::Error::other).and_then(|l| self.file.write_all(&l));
        if let Err(e) = res {
            if !self.failed {
                eprintln!("mcp-health tap: --record {}: {e}; evidence is being lost", self.path.display());
            }
            self.failed = true;
        }
    }
}

fn str_kv(k: &str, v: &str) -> KeyValue {
    KeyValue { key: k.into(), value: Some(AnyValue { value: Some(any_value::Value::StringValue(v.into())) }), ..Default::default() }
}
