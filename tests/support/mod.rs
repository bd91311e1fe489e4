//! Shared helpers for the end-to-end tests: an in-memory OTLP sink, a guard around a running
//! `mcp-health serve`, a tiny HTTP/1.1 client, raw gRPC senders and OTLP span builders.
//!
//! Everything listens on 127.0.0.1 with ports chosen by the OS, so test binaries and the tests
//! inside them can run in parallel. Every wait is a poll against a deadline.
#![allow(dead_code)]

pub mod prometheus;

use std::fmt::Write as _;
use std::future::Future;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes};
use opentelemetry_proto::tonic::collector::logs::v1::logs_service_server::{LogsService, LogsServiceServer};
use opentelemetry_proto::tonic::collector::logs::v1::{ExportLogsServiceRequest, ExportLogsServiceResponse};
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{MetricsService, MetricsServiceServer};
use opentelemetry_proto::tonic::collector::metrics::v1::{ExportMetricsServiceRequest, ExportMetricsServiceResponse};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{oneshot, Notify};
use tonic::codec::{Codec, CompressionEncoding, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::{Request, Response, Status};

pub mod pki;
pub mod redis_server;

// ---------------------------------------------------------------------------------------------
// Waiting
// ---------------------------------------------------------------------------------------------

/// Poll `f` every 25 ms until it returns `Some`, or panic naming `what` after `timeout`.
pub async fn eventually<T>(timeout: Duration, what: &str, f: impl FnMut() -> Option<T>) -> T {
    eventually_showing(timeout, what, f, String::new).await
}

/// [`eventually`], with what `show` says at the timeout in the panic (what was seen instead):
/// a wait that ends the other way is then a finding, not a bare timeout.
pub async fn eventually_showing<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>, show: impl Fn() -> String) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}{}", show());
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// [`eventually`] with an async probe.
pub async fn eventually_async<T, F, Fut>(timeout: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// OTLP sink
// ---------------------------------------------------------------------------------------------

#[derive(Default)]
struct SinkData {
    traces: Mutex<Vec<ExportTraceServiceRequest>>,
    metrics: Mutex<Vec<ExportMetricsServiceRequest>>,
    logs: Mutex<Vec<ExportLogsServiceRequest>>,
    changed: Notify,
}

#[derive(Clone)]
struct SinkSvc(Arc<SinkData>);

#[tonic::async_trait]
impl TraceService for SinkSvc {
    async fn export(&self, r: Request<ExportTraceServiceRequest>) -> Result<Response<ExportTraceServiceResponse>, Status> {
        self.0.traces.lock().unwrap().push(r.into_inner());
        self.0.changed.notify_waiters();
        Ok(Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl MetricsService for SinkSvc {
    async fn export(&self, r: Request<ExportMetricsServiceRequest>) -> Result<Response<ExportMetricsServiceResponse>, Status> {
        self.0.metrics.lock().unwrap().push(r.into_inner());
        self.0.changed.notify_waiters();
        Ok(Response::new(ExportMetricsServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl LogsService for SinkSvc {
    async fn export(&self, r: Request<ExportLogsServiceRequest>) -> Result<Response<ExportLogsServiceResponse>, Status> {
        self.0.logs.lock().unwrap().push(r.into_inner());
        self.0.changed.notify_waiters();
        Ok(Response::new(ExportLogsServiceResponse::default()))
    }
}

/// One span as received, with the resource and scope it came under.
#[derive(Clone, Debug, PartialEq)]
pub struct ReceivedSpan {
    pub resource: Option<Resource>,
    pub scope: Option<InstrumentationScope>,
    pub span: Span,
}

impl ReceivedSpan {
    pub fn attr(&self, key: &str) -> Option<&any_value::Value> {
        attr(&self.span.attributes, key)
    }
    pub fn attr_str(&self, key: &str) -> Option<&str> {
        match self.attr(key) {
            Some(any_value::Value::StringValue(s)) => Some(s),
            _ => None,
        }
    }
    pub fn is_health_span(&self) -> bool {
        self.attr("mcp_health.verdict.state").is_some()
    }
}

/// An OTLP/gRPC receiver (traces, metrics, logs) that keeps everything in memory.
pub struct Sink {
    pub addr: SocketAddr,
    data: Arc<SinkData>,
    stop: Option<oneshot::Sender<()>>,
}

impl Sink {
    /// Start on 127.0.0.1 with an OS-chosen port. Must be called inside a Tokio runtime.
    pub async fn start() -> Sink {
        Sink::start_at(SocketAddr::from(([127, 0, 0, 1], 0))).await
    }

    /// Start on `addr` (a backend coming back on the port it had). Must be called inside a
    /// Tokio runtime.
    pub async fn start_at(addr: SocketAddr) -> Sink {
        let listener = tokio::net::TcpListener::bind(addr).await.expect("bind sink");
        let addr = listener.local_addr().unwrap();
        let data = Arc::new(SinkData::default());
        let svc = SinkSvc(data.clone());
        let (stop, stopped) = oneshot::channel::<()>();
        let max = 64 << 20;
        tokio::spawn(async move {
            let r = tonic::transport::Server::builder()
                .add_service(
                    TraceServiceServer::new(svc.clone()).accept_compressed(CompressionEncoding::Gzip).max_decoding_message_size(max),
                )
                .add_service(
                    MetricsServiceServer::new(svc.clone()).accept_compressed(CompressionEncoding::Gzip).max_decoding_message_size(max),
                )
                .add_service(LogsServiceServer::new(svc).accept_compressed(CompressionEncoding::Gzip).max_decoding_message_size(max))
                .serve_with_incoming_shutdown(tonic::transport::server::TcpIncoming::from(listener), async {
                    let _ = stopped.await;
                })
                .await;
            if let Err(e) = r {
                eprintln!("sink failed: {e}");
            }
        });
        Sink { addr, data, stop: Some(stop) }
    }

    /// `http://127.0.0.1:PORT`, for `exporters.otlp.endpoint`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn trace_requests(&self) -> Vec<ExportTraceServiceRequest> {
        self.data.traces.lock().unwrap().clone()
    }
    pub fn metric_requests(&self) -> Vec<ExportMetricsServiceRequest> {
        self.data.metrics.lock().unwrap().clone()
    }
    pub fn log_requests(&self) -> Vec<ExportLogsServiceRequest> {
        self.data.logs.lock().unwrap().clone()
    }

    /// Every span received, flattened.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        flatten(&self.data.traces.lock().unwrap())
    }

    /// Spans carrying a verdict.
    pub fn health_spans(&self) -> Vec<ReceivedSpan> {
        self.spans().into_iter().filter(ReceivedSpan::is_health_span).collect()
    }

    /// Wait until `f` over the sink's current content returns `Some`.
    pub async fn wait_for<T>(&self, timeout: Duration, what: &str, mut f: impl FnMut(&Sink) -> Option<T>) -> T {
        let deadline = Instant::now() + timeout;
        loop {
            let notified = self.data.changed.notified();
            if let Some(v) = f(self) {
                return v;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                panic!("sink: timed out after {timeout:?} waiting for {what}");
            }
            // Woken by new data, or re-check at least every 100 ms.
            let _ = tokio::time::timeout(left.min(Duration::from_millis(100)), notified).await;
        }
    }

    /// Integer sums of the newest data point set of a metric, summed over all attribute sets
    /// matching `filter`. Metrics arrive cumulative, so the newest export that has the metric is
    /// its running total. `None` before the metric was exported at all.
    pub fn metric_sum(&self, name: &str, filter: impl Fn(&[KeyValue]) -> bool) -> Option<i64> {
        let reqs = self.data.metrics.lock().unwrap();
        for req in reqs.iter().rev() {
            let mut found = false;
            let mut total = 0i64;
            for rm in &req.resource_metrics {
                for sm in &rm.scope_metrics {
                    for m in sm.metrics.iter().filter(|m| m.name == name) {
                        found = true;
                        let points = match &m.data {
                            Some(metric::Data::Sum(s)) => &s.data_points,
                            Some(metric::Data::Gauge(g)) => &g.data_points,
                            _ => continue,
                        };
                        for p in points.iter().filter(|p| filter(&p.attributes)) {
                            total += match p.value {
                                Some(number_data_point::Value::AsInt(i)) => i,
                                Some(number_data_point::Value::AsDouble(d)) => d as i64,
                                None => 0,
                            };
                        }
                    }
                }
            }
            if found {
                return Some(total);
            }
        }
        None
    }

    /// Everything received, as debug text (for "no secret appears anywhere" checks).
    pub fn dump(&self) -> String {
        format!("{:?}\n{:?}\n{:?}", self.trace_requests(), self.metric_requests(), self.log_requests())
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

pub fn flatten(reqs: &[ExportTraceServiceRequest]) -> Vec<ReceivedSpan> {
    let mut out = Vec::new();
    for req in reqs {
        for rs in &req.resource_spans {
            for ss in &rs.scope_spans {
                for s in &ss.spans {
                    out.push(ReceivedSpan { resource: rs.resource.clone(), scope: ss.scope.clone(), span: s.clone() });
                }
            }
        }
    }
    out
}

pub fn attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a any_value::Value> {
    attrs.iter().find(|kv| kv.key == key).and_then(|kv| kv.value.as_ref()).and_then(|v| v.value.as_ref())
}

pub fn attr_is(attrs: &[KeyValue], key: &str, want: &str) -> bool {
    matches!(attr(attrs, key), Some(any_value::Value::StringValue(s)) if s == want)
}

// ---------------------------------------------------------------------------------------------
// The service under test
// ---------------------------------------------------------------------------------------------

/// The ports a service instance listens on.
#[derive(Clone, Copy, Debug)]
pub struct Ports {
    pub grpc: u16,
    pub http: u16,
    pub prometheus: u16,
    pub health: u16,
    /// For `extensions.gate`, when `Cfg::gate` is set.
    pub gate: u16,
}

impl Ports {
    /// Five distinct ports the OS just handed out (all held until all are chosen).
    pub fn pick() -> Ports {
        let ls: Vec<StdListener> = (0..5).map(|_| StdListener::bind("127.0.0.1:0").expect("bind port 0")).collect();
        let p: Vec<u16> = ls.iter().map(|l| l.local_addr().unwrap().port()).collect();
        Ports { grpc: p[0], http: p[1], prometheus: p[2], health: p[3], gate: p[4] }
    }
}

/// `mcp-health serve --config <config>` run to its end: for a start meant to fail. `write`
/// writes the config for ports `Ports::pick` chose (adjusting them first if it must) and returns
/// them. Picked ports are free when chosen, but a parallel test can take one before the service
/// binds it: a start that failed on a taken port other than `meant_taken` (the one a test holds
/// on purpose) is run again on other ports, up to five times.
pub fn serve_to_its_end(config: &Path, meant_taken: Option<u16>, mut write: impl FnMut(Ports) -> Ports) -> (Ports, std::process::Output) {
    let mut attempts = 0;
    loop {
        attempts += 1;
        let ports = write(Ports::pick());
        let out = Command::new(env!("CARGO_BIN_EXE_mcp-health"))
            .args(["serve", "--config"])
            .arg(config)
            .env_remove("RUST_LOG")
            .output()
            .expect("run mcp-health");
        let err = String::from_utf8_lossy(&out.stderr);
        let on_purpose = meant_taken.is_some_and(|p| err.contains(&format!("127.0.0.1:{p}")));
        if attempts < 5 && err.contains("Address already in use") && !on_purpose {
            eprintln!("a port was taken by a parallel test: trying other ports: {err}");
            continue;
        }
        return (ports, out);
    }
}

/// A port nobody listens on (for "the backend is down"). The port stays bound, without
/// listening, while this guard lives: connecting to it is refused, and no other test can get it.
pub struct DeadPort {
    _socket: tokio::net::TcpSocket,
    pub port: u16,
}

/// `python3` when it runs here (the tap tests' fake servers need only its standard library).
pub fn python() -> Option<&'static str> {
    Command::new("python3")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .ok()
        .filter(|s| s.success())
        .map(|_| "python3")
}

/// The interpreter of a Python virtual environment of the repository (`.venv-mcp`, made by
/// scripts/install-test-deps), or `None` with a skip line. Under CI (`CI` set) or with
/// MCP_HEALTH_REQUIRE_DIALECTS=1 a missing one fails the test instead.
pub fn venv_python(venv: &str) -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(venv).join("bin/python");
    if p.exists() {
        return Some(p);
    }
    let required = std::env::var_os("CI").is_some() || std::env::var("MCP_HEALTH_REQUIRE_DIALECTS").as_deref() == Ok("1");
    assert!(!required, "{} is missing: run scripts/install-test-deps", p.display());
    println!("SKIPPED: {} is missing (scripts/install-test-deps makes it)", p.display());
    None
}

/// Keep the machine's ambient OpenTelemetry settings from a scenario process: the scenarios set
/// their own endpoint, service names and propagators.
pub fn without_ambient_otel(cmd: &mut std::process::Command) -> &mut std::process::Command {
    for var in [
        "OTEL_SDK_DISABLED",
        "OTEL_SERVICE_NAME",
        "OTEL_RESOURCE_ATTRIBUTES",
        "OTEL_TRACES_EXPORTER",
        "OTEL_TRACES_SAMPLER",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS",
        "OTEL_PROPAGATORS",
        "TRACELOOP_TRACE_CONTENT",
    ] {
        cmd.env_remove(var);
    }
    cmd
}

/// The value of `name{listener=…,reason=…}` on /metrics (0 when the series is absent).
pub fn connection_count(text: &str, name: &str, listener: &str, reason: &str) -> f64 {
    let (l, r) = (format!("listener=\"{listener}\""), format!("reason=\"{reason}\""));
    text.lines()
        .filter(|line| line.starts_with(&format!("{name}{{")) && line.contains(&l) && line.contains(&r))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

pub fn dead_port() -> DeadPort {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.bind(SocketAddr::from(([127, 0, 0, 1], 0))).expect("bind");
    let port = socket.local_addr().unwrap().port();
    DeadPort { _socket: socket, port }
}

/// The knobs the tests turn; rendered into a collector-style YAML.
#[derive(Clone, Debug)]
pub struct Cfg {
    /// `exporters.otlp.endpoint`; no `otlp` exporter when `None`.
    pub exporter: Option<String>,
    pub passthrough: bool,
    pub health_spans: bool,
    pub otlp_metrics: bool,
    pub metrics_interval: &'static str,
    pub sending_queue_size: usize,
    /// Extra lines under `exporters.otlp.retry_on_failure` (already indented by 6 spaces).
    pub retry_on_failure: Option<&'static str>,
    /// Extra lines under `exporters.otlp` (already indented by 4 spaces): `protocol`, `compression`, `tls`...
    pub exporter_lines: Option<String>,
    pub exporter_timeout: &'static str,
    pub decision_wait: &'static str,
    pub max_wait: &'static str,
    pub max_spans_per_chain: usize,
    pub queue_size: usize,
    pub grpc_max_mib: usize,
    pub http_max_body: usize,
    pub shutdown_timeout: &'static str,
    pub log_level: &'static str,
    /// `service.telemetry.logs.encoding` (`console`, `json`); the service's default when `None`.
    pub log_encoding: Option<&'static str>,
    /// Environment variables for the service process (the OTEL_* ones are removed otherwise).
    pub env: Vec<(&'static str, String)>,
    /// `exporters.prometheus.cardinality_limit` (the service's default when `None`).
    pub cardinality_limit: Option<usize>,
    /// `processors.memory_limiter.limit_mib`; no limiter when `None`.
    pub memory_limit_mib: Option<u64>,
    /// `processors.memory_limiter.check_interval`.
    pub memory_check_interval: &'static str,
    /// `storage.directory` (the durable state store); none when `None`.
    pub storage: Option<PathBuf>,
    /// `storage: {kind: redis, endpoint}` (the shared state store), in place of `storage`.
    pub storage_redis: Option<String>,
    /// `extensions.gate` on `Ports::gate` (`unpinned: allow`).
    pub gate: bool,
    /// Extra keys of a listener, by component (`grpc`, `http`, `prometheus`, `health_check`,
    /// `gate`, and `mcp_health` for the processor): YAML lines written as if at the component's
    /// top level (indented here).
    pub listener_extra: Vec<(&'static str, String)>,
    /// The mcp-health binary to run (the test build's when `None`).
    pub binary: Option<PathBuf>,
    /// `service.telemetry.metrics.level` (the service's default when `None`).
    pub metrics_level: Option<&'static str>,
    /// `exporters.verdict_log.path` (`stdout` when `None`).
    pub verdict_log: Option<PathBuf>,
}

impl Default for Cfg {
    fn default() -> Self {
        Cfg {
            exporter: None,
            passthrough: true,
            health_spans: true,
            otlp_metrics: true,
            metrics_interval: "1s",
            sending_queue_size: 256,
            retry_on_failure: None,
            exporter_lines: None,
            exporter_timeout: "5s",
            decision_wait: "300ms",
            max_wait: "30s",
            max_spans_per_chain: 1000,
            queue_size: 256,
            grpc_max_mib: 4,
            http_max_body: 4 << 20,
            shutdown_timeout: "10s",
            log_level: "info",
            log_encoding: None,
            env: Vec::new(),
            cardinality_limit: None,
            memory_limit_mib: None,
            memory_check_interval: "100ms",
            storage: None,
            storage_redis: None,
            gate: false,
            listener_extra: Vec::new(),
            binary: None,
            metrics_level: None,
            verdict_log: None,
        }
    }
}

impl Cfg {
    pub fn with_sink(sink: &Sink) -> Cfg {
        Cfg { exporter: Some(sink.endpoint()), ..Cfg::default() }
    }

    /// `listener_extra` of `component`, each line indented by `indent` spaces.
    fn extra(&self, component: &str, indent: usize) -> String {
        let pad = " ".repeat(indent);
        self.listener_extra.iter().filter(|(c, _)| *c == component).flat_map(|(_, t)| t.lines()).map(|l| format!("{pad}{l}\n")).collect()
    }

    pub fn yaml(&self, p: &Ports) -> String {
        let mut y = String::new();
        let _ = write!(
            y,
            "receivers:\n  otlp:\n    protocols:\n      grpc:\n        endpoint: 127.0.0.1:{}\n        max_recv_msg_size_mib: {}\n{}      http:\n        endpoint: 127.0.0.1:{}\n        max_request_body_size: {}\n{}",
            p.grpc,
            self.grpc_max_mib,
            self.extra("grpc", 8),
            p.http,
            self.http_max_body,
            self.extra("http", 8)
        );
        let _ = write!(
            y,
            "processors:\n  mcp_health:\n    decision_wait: {}\n    max_wait: {}\n    max_spans_per_chain: {}\n    queue_size: {}\n",
            self.decision_wait, self.max_wait, self.max_spans_per_chain, self.queue_size
        );
        y.push_str(&self.extra("mcp_health", 4));
        if let Some(mib) = self.memory_limit_mib {
            let _ = write!(y, "  memory_limiter:\n    check_interval: {}\n    limit_mib: {mib}\n", self.memory_check_interval);
        }
        y.push_str("exporters:\n");
        if let Some(ep) = &self.exporter {
            let _ = write!(
                y,
                "  otlp:\n    endpoint: {ep}\n    timeout: {}\n    passthrough: {}\n    health_spans: {}\n    metrics: {}\n    metrics_interval: {}\n    sending_queue:\n      queue_size: {}\n",
                self.exporter_timeout, self.passthrough, self.health_spans, self.otlp_metrics, self.metrics_interval, self.sending_queue_size
            );
            if let Some(r) = self.retry_on_failure {
                let _ = write!(y, "    retry_on_failure:\n{r}\n");
            }
            if let Some(l) = &self.exporter_lines {
                let _ = writeln!(y, "{}", l.trim_end());
            }
        }
        let _ = write!(y, "  prometheus:\n    endpoint: 127.0.0.1:{}\n{}", p.prometheus, self.extra("prometheus", 4));
        if let Some(n) = self.cardinality_limit {
            let _ = writeln!(y, "    cardinality_limit: {n}");
        }
        match &self.verdict_log {
            Some(p) => {
                let _ = writeln!(y, "  verdict_log:\n    path: {}", serde_json::to_string(p).unwrap());
            }
            None => y.push_str("  verdict_log:\n    path: stdout\n"),
        }
        let _ = write!(y, "extensions:\n  health_check:\n    endpoint: 127.0.0.1:{}\n{}", p.health, self.extra("health_check", 4));
        if self.gate {
            let _ = write!(y, "  gate:\n    endpoint: 127.0.0.1:{}\n    unpinned: allow\n{}", p.gate, self.extra("gate", 4));
        }
        if let Some(d) = &self.storage {
            let _ = write!(y, "storage:\n  directory: {}\n", serde_json::to_string(d).unwrap());
        }
        if let Some(url) = &self.storage_redis {
            let _ = write!(
                y,
                "storage:\n  kind: redis\n  endpoint: {}\n  timeout: 500ms\n  retry_after: 200ms\n",
                serde_json::to_string(url).unwrap()
            );
        }
        let _ = write!(
            y,
            "service:\n  telemetry:\n    logs:\n      level: {}\n{}    shutdown_timeout: {}\n{}",
            self.log_level,
            self.log_encoding.map_or(String::new(), |e| format!("      encoding: {e}\n")),
            self.shutdown_timeout,
            self.metrics_level.map_or(String::new(), |l| format!("    metrics:\n      level: {l}\n"))
        );
        y
    }
}

/// The OTLP exporter variables a developer's shell might set, emptied for the service (mcp-health
/// reads an empty variable as unset) so only what a test sets applies.
const OTEL_EXPORTER_VARS: &[&str] = &[
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
    "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
    "OTEL_EXPORTER_OTLP_TIMEOUT",
    "OTEL_EXPORTER_OTLP_COMPRESSION",
    "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
    "OTEL_EXPORTER_OTLP_METRICS_COMPRESSION",
    "OTEL_EXPORTER_OTLP_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_CLIENT_KEY",
    "OTEL_EXPORTER_OTLP_INSECURE",
];

/// A running `mcp-health serve`. Killed on drop; its stdout and stderr are kept in files.
pub struct Service {
    pub ports: Ports,
    child: Mutex<Option<Child>>,
    dir: tempfile::TempDir,
    pub config_path: PathBuf,
}

impl Service {
    /// Write the config, start the binary, wait until the health endpoint answers 200. A port
    /// taken in the meantime by someone else makes the service exit at once; then new ports are
    /// chosen and it is started again.
    pub async fn start(cfg: Cfg) -> Service {
        let mut last_err = String::new();
        for _attempt in 0..5 {
            let ports = Ports::pick();
            let dir = tempfile::tempdir().expect("tempdir");
            let config_path = dir.path().join("mcp-health.yaml");
            std::fs::write(&config_path, cfg.yaml(&ports)).unwrap();
            let stdout = std::fs::File::create(dir.path().join("stdout")).unwrap();
            let stderr = std::fs::File::create(dir.path().join("stderr")).unwrap();
            let binary = cfg.binary.clone().unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_mcp-health")));
            let child = Command::new(binary)
                .arg("serve")
                .arg("--config")
                .arg(&config_path)
                .env_remove("RUST_LOG")
                .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
                .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                .env_remove("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
                .env_remove("OTEL_EXPORTER_OTLP_HEADERS")
                .envs(OTEL_EXPORTER_VARS.iter().map(|v| (*v, "")))
                .env_remove("OTEL_SERVICE_NAME")
                .envs(cfg.env.iter().map(|(k, v)| (*k, v.as_str())))
                .stdin(Stdio::null())
                .stdout(stdout)
                .stderr(stderr)
                .spawn()
                .expect("spawn mcp-health");
            let svc = Service { ports, child: Mutex::new(Some(child)), dir, config_path };
            match svc.wait_ready(Duration::from_secs(30)).await {
                Ok(()) => return svc,
                Err(e) => {
                    let stderr = svc.stderr();
                    if stderr.contains("cannot listen") || stderr.contains("Address already in use") {
                        last_err = stderr;
                        continue; // port race with a parallel test: try other ports
                    }
                    panic!("mcp-health did not become healthy: {e}\n--- config ---\n{}\n--- stderr ---\n{stderr}", cfg.yaml(&ports));
                }
            }
        }
        panic!("mcp-health could not bind free ports after 5 attempts:\n{last_err}");
    }

    async fn wait_ready(&self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            if !self.running() {
                return Err("exited early".into());
            }
            if let Ok(r) = http_get(self.health_addr(), "/").await {
                if r.status == 200 {
                    // The answer may come from another test's service that got the same port
                    // first while this one fails to bind another and exits: look again shortly.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    if !self.running() || self.stderr().contains("cannot listen") {
                        return Err("exited early".into());
                    }
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                return Err(format!("no 200 from the health endpoint within {timeout:?}"));
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    pub fn grpc_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.ports.grpc))
    }
    pub fn http_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.ports.http))
    }
    pub fn prom_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.ports.prometheus))
    }
    pub fn health_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.ports.health))
    }
    pub fn gate_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.ports.gate))
    }
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
    pub fn pid(&self) -> u32 {
        self.child.lock().unwrap().as_ref().expect("service running").id()
    }

    pub fn stdout(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stdout")).unwrap_or_default()
    }
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr")).unwrap_or_default()
    }

    /// Verdict JSON lines printed so far (complete lines only).
    pub fn verdicts(&self) -> Vec<serde_json::Value> {
        self.json_lines().into_iter().filter(|v: &serde_json::Value| v.get("trace_id").is_some() && v.get("state").is_some()).collect()
    }

    /// Every complete JSON line on stdout: call verdicts, and catalog (`"catalog": true`),
    /// incident (`"incident": true`) and drift (`"drift": true`) lines.
    pub fn json_lines(&self) -> Vec<serde_json::Value> {
        let out = self.stdout();
        let complete = match out.rfind('\n') {
            Some(i) => &out[..=i],
            None => "",
        };
        complete.lines().filter(|l| l.starts_with('{')).filter_map(|l| serde_json::from_str(l).ok()).collect()
    }

    /// Wait until at least `n` verdicts were printed.
    pub async fn wait_verdicts(&self, n: usize, timeout: Duration) -> Vec<serde_json::Value> {
        let what = format!("{n} verdict line(s) on stdout");
        eventually(timeout, &what, || Some(self.verdicts()).filter(|v| v.len() >= n)).await
    }

    /// Step 2 of the README's five-minute walkthrough against this service: `mcp-health send
    /// tests/fixtures/eight_calls.jsonl` (to this service's gRPC port, the default protocol), then
    /// every line it decided: the eight verdicts and, once they stop coming, the incident lines.
    pub async fn walkthrough_send(&self, timeout: Duration) -> Vec<serde_json::Value> {
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/eight_calls.jsonl");
        let endpoint = format!("http://{}", self.grpc_addr());
        let out = tokio::task::spawn_blocking(move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_mcp-health")).args(["send", "--endpoint", &endpoint]).arg(fixture).output()
        })
        .await
        .unwrap()
        .expect("run mcp-health send");
        assert!(out.status.success(), "send: {}", String::from_utf8_lossy(&out.stderr));
        self.wait_verdicts(8, timeout).await;
        // The incident lines come in the same engine step as their verdicts; wait until the lines
        // stop changing.
        let mut seen = self.json_lines().len();
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let now = self.json_lines();
            if now.len() == seen {
                return now;
            }
            seen = now.len();
        }
    }

    /// GET /metrics.
    pub async fn metrics_text(&self) -> String {
        let r = http_get(self.prom_addr(), "/metrics").await.expect("GET /metrics");
        assert_eq!(r.status, 200, "GET /metrics answered {}", r.status);
        r.text()
    }

    /// Wait until `sum(name)` in the Prometheus text satisfies `pred`; returns the text.
    pub async fn wait_metric(&self, name: &str, timeout: Duration, pred: impl Fn(f64) -> bool) -> String {
        let what = format!("Prometheus metric {name} to reach the expected value");
        eventually_async(timeout, &what, || async {
            let t = self.metrics_text().await;
            prom_sum(&t, name).filter(|v| pred(*v)).map(|_| t)
        })
        .await
    }

    /// Health endpoint status code.
    pub async fn health_status(&self) -> Option<u16> {
        http_get(self.health_addr(), "/").await.ok().map(|r| r.status)
    }

    /// POST /v1/traces.
    pub async fn post_traces(&self, content_type: &str, gzip_body: bool, body: &[u8]) -> HttpResponse {
        let mut headers = vec![("Content-Type", content_type)];
        let body = if gzip_body {
            headers.push(("Content-Encoding", "gzip"));
            gzip(body)
        } else {
            body.to_vec()
        };
        http_request(self.http_addr(), "POST", "/v1/traces", &headers, &body).await.expect("POST /v1/traces")
    }

    pub async fn post_json(&self, body: &[u8]) -> HttpResponse {
        self.post_traces("application/json", false, body).await
    }

    pub async fn post_proto(&self, req: &ExportTraceServiceRequest) -> HttpResponse {
        self.post_traces("application/x-protobuf", false, &req.encode_to_vec()).await
    }

    pub async fn grpc_export(&self, req: ExportTraceServiceRequest) -> Result<ExportTraceServiceResponse, Status> {
        grpc_export(self.grpc_addr(), req).await
    }

    /// The service is up: health answers 200, and a small valid request is accepted over gRPC
    /// and over HTTP (polled, since a service that just shed load may need a moment).
    pub async fn assert_alive(&self, timeout: Duration) {
        assert!(self.running(), "mcp-health exited:\n{}", self.stderr());
        eventually_async(timeout, "health endpoint 200", || async { (self.health_status().await == Some(200)).then_some(()) }).await;
        eventually_async(timeout, "a normal gRPC export to be accepted", || async {
            let req = request("alive", vec![call_span(new_trace_id(), new_span_id(), None, "alive_grpc", "1", vec![])]);
            match self.grpc_export(req).await {
                Ok(r) => {
                    assert!(r.partial_success.as_ref().is_none_or(|p| p.rejected_spans == 0), "normal span rejected: {r:?}");
                    Some(())
                }
                Err(s) if is_busy(&s) => None,
                Err(s) => panic!("normal gRPC export failed: {s:?}"),
            }
        })
        .await;
        eventually_async(timeout, "a normal HTTP export to be accepted", || async {
            let req = request("alive", vec![call_span(new_trace_id(), new_span_id(), None, "alive_http", "1", vec![])]);
            let r = self.post_proto(&req).await;
            match r.status {
                200 => Some(()),
                503 => None,
                s => panic!("normal HTTP export answered {s}: {:?}", r.text()),
            }
        })
        .await;
        assert!(self.running(), "mcp-health exited:\n{}", self.stderr());
    }

    /// Whether the process is still running (reaps it if it exited).
    pub fn running(&self) -> bool {
        match self.child.lock().unwrap().as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// SIGKILL the process (no shutdown of any kind) and reap it.
    pub fn kill(&self) {
        let mut guard = self.child.lock().unwrap();
        if let Some(mut c) = guard.take() {
            // SAFETY: kill(2) on the pid of a child we have not reaped yet.
            let rc = unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGKILL) };
            assert_eq!(rc, 0, "kill -KILL failed");
            let _ = c.wait();
        }
    }

    /// Send SIGTERM and wait for the exit, at most `timeout`. `None` when it did not exit in time.
    pub async fn terminate(&self, timeout: Duration) -> Option<ExitStatus> {
        self.signal_and_wait("TERM", timeout).await
    }

    /// Send a signal by name (`kill -NAME`) and wait up to `timeout` for the exit.
    pub async fn signal_and_wait(&self, name: &str, timeout: Duration) -> Option<ExitStatus> {
        let pid = self.child.lock().unwrap().as_ref()?.id();
        let st = Command::new("kill").arg(format!("-{name}")).arg(pid.to_string()).status().expect("run kill");
        assert!(st.success(), "kill -{name} {pid} failed");
        let deadline = Instant::now() + timeout;
        loop {
            {
                let mut guard = self.child.lock().unwrap();
                if let Some(Ok(Some(st))) = guard.as_mut().map(Child::try_wait) {
                    *guard = None;
                    return Some(st);
                }
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            let err = self.stderr();
            let tail: String = err.lines().rev().take(40).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
            eprintln!("--- mcp-health stderr (last 40 lines) ---\n{tail}\n---");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// HTTP/1.1
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl HttpResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

pub async fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<HttpResponse> {
    http_request(addr, "GET", path, &[], &[]).await
}

/// One request on a fresh connection (`Connection: close`), response read to EOF. The body is
/// written concurrently with reading, so a server that answers early (413) and stops reading does
/// not deadlock the client; write errors after a complete response are ignored.
pub async fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<HttpResponse> {
    let fut = async {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (mut rd, mut wr) = stream.into_split();
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
        for (k, v) in headers {
            let _ = write!(head, "{k}: {v}\r\n");
        }
        head.push_str("\r\n");
        let mut payload = head.into_bytes();
        payload.extend_from_slice(body);
        let writer = tokio::spawn(async move {
            let r = wr.write_all(&payload).await;
            let _ = wr.flush().await;
            // Keep the write half open until the reader is done (dropping it would half-close).
            (r, wr)
        });
        let mut buf = Vec::new();
        let read_result = rd.read_to_end(&mut buf).await;
        let _ = writer.await;
        match (read_result, parse_response(&buf)) {
            (_, Some(r)) => Ok(r),
            (Err(e), None) => Err(e),
            (Ok(_), None) => Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("incomplete HTTP response: {:?}", String::from_utf8_lossy(&buf)),
            )),
        }
    };
    tokio::time::timeout(Duration::from_secs(30), fut)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "HTTP request timed out"))?
}

fn parse_response(buf: &[u8]) -> Option<HttpResponse> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&buf[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let status: u16 = lines.next()?.split_whitespace().nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> =
        lines.filter_map(|l| l.split_once(':')).map(|(k, v)| (k.trim().to_string(), v.trim().to_string())).collect();
    let rest = &buf[end + 4..];
    let find = |n: &str| headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(n)).map(|(_, v)| v.clone());
    let body = if find("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        dechunk(rest)?
    } else if let Some(len) = find("content-length").and_then(|v| v.parse::<usize>().ok()) {
        if rest.len() < len {
            return None;
        }
        rest[..len].to_vec()
    } else {
        rest.to_vec()
    };
    Some(HttpResponse { status, headers, body })
}

fn dechunk(mut b: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = b.windows(2).position(|w| w == b"\r\n")?;
        let size_s = std::str::from_utf8(&b[..eol]).ok()?;
        let size = usize::from_str_radix(size_s.split(';').next()?.trim(), 16).ok()?;
        b = &b[eol + 2..];
        if size == 0 {
            return Some(out);
        }
        if b.len() < size + 2 {
            return None;
        }
        out.extend_from_slice(&b[..size]);
        b = &b[size + 2..];
    }
}

pub fn gzip(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// `sum(name)` over every sample line of exactly that metric name; `None` if there is none.
pub fn prom_sum(text: &str, name: &str) -> Option<f64> {
    let mut found = false;
    let mut total = 0.0;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = line.strip_prefix(name) else { continue };
        if !(rest.starts_with('{') || rest.starts_with(' ')) {
            continue;
        }
        if let Some(v) = rest.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) {
            found = true;
            total += v;
        }
    }
    found.then_some(total)
}

// ---------------------------------------------------------------------------------------------
// gRPC
// ---------------------------------------------------------------------------------------------

pub async fn grpc_client(addr: SocketAddr) -> TraceServiceClient<tonic::transport::Channel> {
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(30))
        .connect()
        .await
        .expect("connect to the gRPC receiver");
    TraceServiceClient::new(ch)
}

pub async fn grpc_export(addr: SocketAddr, req: ExportTraceServiceRequest) -> Result<ExportTraceServiceResponse, Status> {
    grpc_client(addr).await.export(req).await.map(Response::into_inner)
}

/// Send arbitrary bytes as the body of a TraceService/Export call.
pub async fn grpc_export_raw(addr: SocketAddr, bytes: Bytes) -> Result<ExportTraceServiceResponse, Status> {
    grpc_export_raw_within(addr, bytes, Duration::from_secs(30)).await
}

/// [`grpc_export_raw`], waiting up to `deadline` for the answer.
pub async fn grpc_export_raw_within(addr: SocketAddr, bytes: Bytes, deadline: Duration) -> Result<ExportTraceServiceResponse, Status> {
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().timeout(deadline).connect().await.expect("connect");
    let mut grpc = tonic::client::Grpc::new(ch);
    grpc.ready().await.map_err(|e| Status::unavailable(e.to_string()))?;
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/opentelemetry.proto.collector.trace.v1.TraceService/Export");
    grpc.unary(Request::new(bytes), path, RawCodec).await.map(Response::into_inner)
}

#[derive(Clone, Copy, Default)]
pub struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = ExportTraceServiceResponse;
    type Encoder = RawCodec;
    type Decoder = RawCodec;
    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }
    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = Status;
    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = ExportTraceServiceResponse;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Status> {
        let b = src.copy_to_bytes(src.remaining());
        ExportTraceServiceResponse::decode(b).map(Some).map_err(|e| Status::internal(e.to_string()))
    }
}

// ---------------------------------------------------------------------------------------------
// OTLP builders
// ---------------------------------------------------------------------------------------------

/// Fresh W3C ids: the library's own generator (the tap uses it too).
pub use mcp_health::testing::tap::{new_span_id, new_trace_id};

pub fn kv(key: &str, v: any_value::Value) -> KeyValue {
    KeyValue { key: key.into(), value: Some(AnyValue { value: Some(v) }), ..Default::default() }
}
pub fn kv_str(key: &str, v: &str) -> KeyValue {
    kv(key, any_value::Value::StringValue(v.into()))
}
pub fn kv_int(key: &str, v: i64) -> KeyValue {
    kv(key, any_value::Value::IntValue(v))
}
pub fn kv_bool(key: &str, v: bool) -> KeyValue {
    kv(key, any_value::Value::BoolValue(v))
}

/// The MCP semconv attributes of a `tools/call` (as in tests/fixtures/make_fixtures.py).
pub fn call_attrs(tool: &str, request_id: &str) -> Vec<KeyValue> {
    vec![
        kv_str("mcp.method.name", "tools/call"),
        kv_str("gen_ai.tool.name", tool),
        kv_str("gen_ai.operation.name", "execute_tool"),
        kv_str("jsonrpc.request.id", request_id),
        kv_str("mcp.session.id", "sess-e2e-1"),
        kv_str("mcp.protocol.version", "2025-11-25"),
        kv_str("network.transport", "tcp"),
        kv_str("server.address", "tickets.example.test"),
        kv_int("server.port", 8443),
    ]
}

pub fn now_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
}

/// A CLIENT `tools/call TOOL` span with the semconv attributes plus `extra`.
pub fn call_span(trace: [u8; 16], span: [u8; 8], parent: Option<[u8; 8]>, tool: &str, request_id: &str, extra: Vec<KeyValue>) -> Span {
    let mut attrs = call_attrs(tool, request_id);
    attrs.extend(extra);
    let t = now_ns();
    Span {
        trace_id: trace.to_vec(),
        span_id: span.to_vec(),
        parent_span_id: parent.map(|p| p.to_vec()).unwrap_or_default(),
        name: format!("tools/call {tool}"),
        kind: opentelemetry_proto::tonic::trace::v1::span::SpanKind::Client as i32,
        start_time_unix_nano: t - 40_000_000,
        end_time_unix_nano: t,
        attributes: attrs,
        ..Default::default()
    }
}

pub fn request(service: &str, spans: Vec<Span>) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource { attributes: vec![kv_str("service.name", service)], ..Default::default() }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope { name: "e2e".into(), ..Default::default() }),
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

// ---------------------------------------------------------------------------------------------
// Fixtures
// ---------------------------------------------------------------------------------------------

pub fn fixture_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// Non-empty lines of a JSONL fixture.
pub fn fixture_lines(name: &str) -> Vec<String> {
    std::fs::read_to_string(fixture_path(name))
        .expect("read fixture")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect()
}

pub fn fixture_json(name: &str) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(fixture_path(name)).expect("read fixture")).expect("fixture is JSON")
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A gRPC refusal meaning "busy, retry here": RESOURCE_EXHAUSTED with RetryInfo (what mcp-health
/// answers when its queue or memory is full; UNAVAILABLE would make a `load_balancing` exporter
/// quarantine and re-route).
pub fn is_busy(s: &tonic::Status) -> bool {
    use tonic_types::StatusExt;
    s.code() == tonic::Code::ResourceExhausted && s.get_details_retry_info().is_some()
}
