//! The OTLP exporter: pass-through spans, metrics and logs, health spans, incident logs and
//! mcp-health's own metrics go upstream through one bounded queue and a few workers, over OTLP/gRPC
//! or OTLP/HTTP per signal (see [`super::otlp_target`] for how each signal's target is chosen).
//!
//! Each request is encoded (and compressed) once into bytes; retries resend those bytes (a
//! refcount, not a deep copy). The queue is what makes a down backend visible: receivers reserve a
//! place in it before they accept a request, so when it is full senders get a retryable refusal
//! and keep their data. Health spans never block: when the queue is full they are dropped and
//! counted. Delivery is counted in items (spans, metric points, log records) as the collector's
//! exporters count it: `sent`, `send_failed`, `enqueue_failed`.
//!
//! mcp-health's own output (health spans, incident records, own metrics) can wait on disk instead
//! ([`QueueStore::Disk`], see [`super::disk_queue`]): a backend that is down while the process is
//! killed or stopped then loses none of it. Pass-through never does: its senders hold the data and
//! retry when refused, which a disk copy would only hide from them. At exit each queue says what
//! it still holds ([`Leftover::report_at_exit`]): left on disk, or lost from memory.

use std::io::Write as _;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes};
use opentelemetry_proto::tonic::collector::logs::v1::{ExportLogsServiceRequest, ExportLogsServiceResponse};
use opentelemetry_proto::tonic::collector::metrics::v1::{ExportMetricsServiceRequest, ExportMetricsServiceResponse};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::logs::v1::{ResourceLogs, ScopeLogs};
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans};
use prost::Message;
use tokio::sync::{mpsc, Mutex};
use tonic::codec::{Codec, CompressionEncoding, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use super::disk_queue::{DiskQueue, QueueError, Record, RecordKind, Taken};
use super::export_health::ExportHealth;
use super::metrics::HealthMeters;
use super::otlp_http::HttpSender;
use super::otlp_target::{Compression, Protocol, Target, Targets};
use super::otlp_transport::{https_connector, Failure};
use crate::emit::config::RetryOnFailure;
use crate::flow::memory::Reservation;
use crate::flow::outgoing::{log_record_count, span_count, Outgoing};
use crate::telemetry::labels::{self, ItemKind};

/// Why the sender could not be set up.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ExportError {
    #[error("invalid OTLP endpoint {0:?}: {1}")]
    Endpoint(String, String),
    #[error(transparent)]
    Http(#[from] super::otlp_http::HttpSetupError),
    #[error(transparent)]
    Queue(QueueError),
}

/// Settings for [`spawn`].
#[derive(Clone, Debug)]
pub(crate) struct SenderSettings {
    pub targets: Targets,
    pub workers: usize,
    pub retry: RetryOnFailure,
    /// Requests whose encoding is larger are split before they are sent
    /// (`exporters.otlp.max_request_bytes`).
    pub max_request_bytes: usize,
}

/// Add `http://` when an endpoint is written as host:port, as the OTLP exporters accept.
pub(crate) fn endpoint_uri(e: &str) -> String {
    if e.contains("://") {
        e.to_string()
    } else {
        format!("http://{e}")
    }
}

/// How one signal is sent.
#[derive(Clone)]
enum Transport {
    Grpc(Channel),
    Http(Box<HttpSender>),
}

/// A target and its connection.
#[derive(Clone)]
struct Route {
    target: Target,
    transport: Transport,
}

impl Route {
    fn new(t: &Target) -> Result<Route, ExportError> {
        let transport = match t.protocol {
            Protocol::Grpc => Transport::Grpc(grpc_channel(t)?),
            Protocol::HttpProtobuf | Protocol::HttpJson => Transport::Http(Box::new(HttpSender::new(t)?)),
        };
        Ok(Route { target: t.clone(), transport })
    }
    fn transport(&self) -> labels::Transport {
        match self.transport {
            Transport::Grpc(_) => labels::Transport::Grpc,
            Transport::Http(_) => labels::Transport::Http,
        }
    }
}

/// One target's connection for a sender that sends each request once and counts what fails
/// (the evidence tap: spans it cannot deliver are dropped, never queued against the client's
/// traffic): the same transports (gRPC, http/protobuf, http/json), TLS, client certificates,
/// headers and compression as the service's own exporter, from the same settings
/// (`otlp_target::resolve`, the `OTEL_EXPORTER_OTLP_*` variables).
pub(crate) struct SpanSender(Route);

impl SpanSender {
    pub(crate) fn new(t: &Target) -> Result<SpanSender, ExportError> {
        Route::new(t).map(SpanSender)
    }

    /// The target's URL (never its headers: they are credentials).
    pub(crate) fn url(&self) -> &str {
        &self.0.target.url
    }

    /// Send `req` once: the spans the receiver rejected in a partial success, or why nothing went.
    pub(crate) async fn send(&self, req: ExportTraceServiceRequest) -> Result<u64, String> {
        let item = Outgoing::Health(req);
        let (bytes, encoding) = encode(&item, self.0.target.protocol, self.0.target.compression).map_err(|e| e.to_string())?;
        let once = RetryOnFailure { enabled: false, ..RetryOnFailure::default() };
        send_with_retry(&self.0, &once, bytes, encoding, ItemKind::Spans, None).await
    }
}

/// The gRPC channel of a target. TLS goes through our own connector (hyper-rustls with the
/// exporter's rustls configuration) rather than tonic's `ClientTlsConfig`, which cannot skip
/// verification or take a prepared configuration; tonic is given the `http://` form of the URL so
/// it never wraps TLS of its own around ours.
fn grpc_channel(t: &Target) -> Result<Channel, ExportError> {
    let plain = match t.url.strip_prefix("https://") {
        Some(rest) => format!("http://{rest}"),
        None => endpoint_uri(&t.url),
    };
    let ep = Endpoint::from_shared(plain.clone()).map_err(|e| ExportError::Endpoint(t.url.clone(), e.to_string()))?;
    let ep = ep.connect_timeout(t.timeout).timeout(t.timeout);
    Ok(match &t.tls {
        None => ep.connect_lazy(),
        Some(_) => ep.connect_with_connector_lazy(TlsConnect(https_connector(t, true))),
    })
}

/// Turns tonic's `http://` URI back into `https://` for hyper-rustls, which then does TLS.
#[derive(Clone)]
struct TlsConnect(hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower::Service<hyper::Uri> for TlsConnect {
    type Response = hyper_rustls::MaybeHttpsStream<hyper_util::rt::TokioIo<tokio::net::TcpStream>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn std::future::Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), BoxError>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, uri: hyper::Uri) -> Self::Future {
        let mut parts = uri.into_parts();
        parts.scheme = Some(hyper::http::uri::Scheme::HTTPS);
        match hyper::Uri::from_parts(parts) {
            Ok(u) => Box::pin(self.0.call(u)),
            Err(e) => Box::pin(std::future::ready(Err(BoxError::from(e)))),
        }
    }
}

/// The routes of the three signals.
struct Routes {
    traces: Option<Route>,
    metrics: Option<Route>,
    logs: Option<Route>,
}

impl Routes {
    fn for_item(&self, item: &Outgoing) -> Option<&Route> {
        match item {
            Outgoing::Passthrough(..) | Outgoing::PassthroughRaw(..) | Outgoing::Health(_) | Outgoing::HealthRaw(..) => {
                self.traces.as_ref()
            }
            Outgoing::PassthroughMetrics(..) | Outgoing::OwnMetrics(_) => self.metrics.as_ref(),
            Outgoing::Logs(_) | Outgoing::LogsRaw(..) | Outgoing::PassthroughLogs(..) => self.logs.as_ref(),
        }
    }
}

/// Where a queue keeps what waits for the backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum QueueStore {
    /// In memory: lost when the process ends (counted and logged at exit).
    Memory,
    /// On disk in `dir`, at most `max_bytes`: sent after a restart (see [`super::disk_queue`]).
    Disk { dir: std::path::PathBuf, max_bytes: u64 },
}

/// A started queue: its workers, and what it can tell about what it still holds.
pub(crate) struct Started {
    pub workers: Vec<tokio::task::JoinHandle<()>>,
    /// What the workers' attempts tell about the backend (for `/status/health`).
    pub health: Arc<ExportHealth>,
    pub leftover: Leftover,
    /// With a disk queue: where a request can be written straight to disk.
    pub spool: Option<std::sync::Arc<dyn crate::flow::outgoing::DiskSpool>>,
}

/// What a queue holds, read at exit (and by the gauges): requests waiting in memory, requests
/// a worker is sending, and with a disk queue the requests and bytes in its directory.
#[derive(Clone)]
pub(crate) struct Leftover {
    name: &'static str,
    rx: Arc<Mutex<mpsc::Receiver<Outgoing>>>,
    in_flight: Arc<std::sync::atomic::AtomicU64>,
    spool: Option<Arc<Spool>>,
    /// The writer and workers of a disk queue, stopped at exit (see [`Leftover::report_at_exit`]).
    tasks: Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>>,
}

/// What [`Leftover::disk_fill`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DiskFill {
    pub bytes: u64,
    pub limit: u64,
    pub last_full: Option<crate::evidence::time::Moment>,
}

/// What [`Leftover::count`] found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Left {
    /// Requests that only memory held (lost at exit).
    pub in_memory: u64,
    /// Requests (and their bytes) in the queue's directory, sent after the next start.
    pub on_disk: u64,
    pub disk_bytes: u64,
}

impl Leftover {
    /// Requests still held. A worker waiting on an empty channel holds its lock: then nothing
    /// waits there.
    pub(crate) fn count(&self) -> Left {
        use std::sync::atomic::Ordering;
        let queued = self.rx.try_lock().map_or(0, |r| r.len() as u64);
        match &self.spool {
            None => Left { in_memory: queued + self.in_flight.load(Ordering::Relaxed), ..Left::default() },
            Some(sp) => {
                let held = sp.q.held();
                Left { in_memory: queued, on_disk: held.requests, disk_bytes: held.bytes }
            }
        }
    }

    /// The exporter's name (`otlp`, `otlp/passthrough`).
    pub(crate) fn name(&self) -> &'static str {
        self.name
    }

    /// The on-disk queue's fill: bytes held, its bound, and when a request was last refused for
    /// lack of room. `None` for an in-memory queue.
    pub(crate) fn disk_fill(&self) -> Option<DiskFill> {
        self.spool.as_ref().map(|sp| DiskFill { bytes: sp.q.held().bytes, limit: sp.q.limit(), last_full: sp.q.last_full() })
    }

    /// The queue's directory, when it is on disk.
    pub(crate) fn directory(&self) -> Option<&std::path::Path> {
        self.spool.as_ref().map(|s| s.q.dir())
    }

    /// Say at exit what the queue still holds and where: requests left on disk are sent after
    /// the next start; requests held in memory only are lost. The tasks of a disk queue are
    /// then stopped: what they were sending stays on disk, for the next run or for the pipeline a
    /// SIGHUP reload starts on the same directory (which would otherwise send it a second time).
    pub(crate) fn report_at_exit(&self) -> Left {
        let left = self.count();
        for t in self.tasks.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
            t.abort();
        }
        if let Some(dir) = self.directory() {
            if left.on_disk > 0 {
                tracing::warn!(
                    exporter = self.name,
                    requests = left.on_disk,
                    bytes = left.disk_bytes,
                    directory = %dir.display(),
                    "sending queue not empty at exit: {} request(s), {} bytes left in {}; sent after the next start",
                    left.on_disk,
                    left.disk_bytes,
                    dir.display()
                );
            } else {
                tracing::info!(exporter = self.name, directory = %dir.display(), "sending queue empty at exit");
            }
        }
        if left.in_memory > 0 {
            tracing::warn!(
                exporter = self.name,
                requests = left.in_memory,
                "sending queue not empty at exit: {} request(s) held in memory only are lost",
                left.in_memory
            );
        }
        left
    }

    /// The on-disk queue's gauges and damaged-file counter (declared in
    /// `telemetry::instruments`, made by [`super::metrics::observe_disk_queue`]). Nothing for an
    /// in-memory queue.
    pub(crate) fn observe(&self, meter: &opentelemetry::metrics::Meter) {
        let Some(sp) = self.spool.clone() else { return };
        super::metrics::observe_disk_queue(meter, self.name, move || {
            let held = sp.q.held();
            super::metrics::DiskQueueReading {
                requests: held.requests,
                items: held.items,
                bytes: held.bytes,
                capacity_bytes: sp.q.limit(),
                damaged_files: sp.q.corrupt(),
            }
        });
    }
}

/// The on-disk queue and what its workers wait on.
struct Spool {
    q: Arc<DiskQueue>,
    /// A request was written, or the queue closed.
    ready: tokio::sync::Notify,
    /// Every sender is gone: the workers end once the directory holds nothing pending.
    closed: std::sync::atomic::AtomicBool,
}

impl Spool {
    /// The oldest pending request, waiting for one; `None` once the queue is closed and empty.
    async fn next(self: &Arc<Self>) -> Option<Taken> {
        use std::sync::atomic::Ordering;
        loop {
            let ready = self.ready.notified();
            tokio::pin!(ready);
            ready.as_mut().enable();
            if !self.q.is_empty() {
                let q = self.q.clone();
                if let Ok(Some(t)) = tokio::task::spawn_blocking(move || q.take()).await {
                    return Some(t);
                }
                continue;
            }
            if self.closed.load(Ordering::Acquire) {
                return None;
            }
            ready.await;
        }
    }
}

/// Rate limit of the "queue full" warning: one line per interval, with what was dropped since.
struct DropLog {
    last: Option<Instant>,
    since: u64,
}

impl DropLog {
    fn dropped(&mut self, dir: &std::path::Path, why: &QueueError) {
        self.since += 1;
        if self.last.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
            tracing::warn!(directory = %dir.display(), dropped = self.since, error = %why, "sending queue: request(s) dropped (counted as enqueue_failed)");
            self.last = Some(Instant::now());
            self.since = 0;
        }
    }
}

/// What goes on disk for a request: its kind, item count and encoded bytes. Pass-through never
/// reaches a disk queue (it keeps refusing the sender when its in-memory queue is full); were it
/// to, it is kept as the same signal.
fn to_record(item: Outgoing) -> (RecordKind, u64, Bytes) {
    let (_, n) = item.items();
    match item {
        Outgoing::Health(r) => (RecordKind::Spans, n, r.encode_to_vec().into()),
        Outgoing::Passthrough(r, _) => (RecordKind::PassedSpans, n, r.encode_to_vec().into()),
        Outgoing::HealthRaw(b, _, _) => (RecordKind::Spans, n, b),
        Outgoing::PassthroughRaw(b, _, _) => (RecordKind::PassedSpans, n, b),
        Outgoing::Logs(r) => (RecordKind::Logs, n, r.encode_to_vec().into()),
        Outgoing::PassthroughLogs(r, _) => (RecordKind::PassedLogs, n, r.encode_to_vec().into()),
        Outgoing::LogsRaw(b, _, _) => (RecordKind::Logs, n, b),
        Outgoing::OwnMetrics(r) => (RecordKind::Metrics, n, r.encode_to_vec().into()),
        Outgoing::PassthroughMetrics(r, _) => (RecordKind::PassedMetrics, n, r.encode_to_vec().into()),
    }
}

/// A request read back from disk, as the workers send it.
fn from_record(r: Record) -> Result<Outgoing, prost::DecodeError> {
    Ok(match r.kind {
        RecordKind::Spans => Outgoing::HealthRaw(r.payload, r.items, None),
        RecordKind::Logs => Outgoing::LogsRaw(r.payload, r.items, None),
        RecordKind::Metrics => Outgoing::OwnMetrics(ExportMetricsServiceRequest::decode(r.payload)?),
        RecordKind::PassedSpans => Outgoing::PassthroughRaw(r.payload, r.items, None),
        RecordKind::PassedLogs => Outgoing::PassthroughLogs(ExportLogsServiceRequest::decode(r.payload)?, None),
        RecordKind::PassedMetrics => Outgoing::PassthroughMetrics(ExportMetricsServiceRequest::decode(r.payload)?, None),
    })
}

/// Where the receivers write what they pass on when its queue is on disk: before they answer,
/// so a request acknowledged is on disk (the collector's persistent queue), not in a channel a
/// crash would empty.
struct SpoolHandle(Arc<Spool>);

impl crate::flow::outgoing::DiskSpool for SpoolHandle {
    /// Write `item` to the queue's directory (synchronous file I/O) and wake a worker. Its
    /// memory reservation is let go: the disk holds it now.
    fn push(&self, mut item: Outgoing) -> Result<(), String> {
        drop(item.take_reservation());
        let (kind, n, payload) = to_record(item);
        self.0.q.push(kind, n, &payload).map_err(|e| e.to_string())?;
        self.0.ready.notify_one();
        Ok(())
    }
}

impl std::fmt::Debug for SpoolHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("SpoolHandle").field(&self.0.q.dir()).finish()
    }
}

/// Start the workers on `rx` (named `name` in logs and gauges). They end when every sender is
/// dropped and the queue is drained. With [`QueueStore::Disk`], one task writes each request to
/// the directory as it arrives and the workers send from there, removing each request once its
/// send is over; what an earlier run left there is sent first.
pub(crate) fn spawn(
    s: SenderSettings,
    rx: mpsc::Receiver<Outgoing>,
    meters: HealthMeters,
    name: &'static str,
    store: QueueStore,
) -> Result<Started, ExportError> {
    let route = |t: &Option<Target>| t.as_ref().map(Route::new).transpose();
    let routes = Arc::new(Routes { traces: route(&s.targets.traces)?, metrics: route(&s.targets.metrics)?, logs: route(&s.targets.logs)? });
    for r in [&routes.traces, &routes.metrics, &routes.logs].into_iter().flatten() {
        tracing::info!(url = %r.target.url, protocol = r.target.protocol.as_str(), tls = r.target.tls.is_some(), compression = ?r.target.compression, "OTLP exporter target");
    }
    let spool = match store {
        QueueStore::Memory => None,
        QueueStore::Disk { dir, max_bytes } => {
            let q = DiskQueue::open(&dir, max_bytes).map_err(ExportError::Queue)?;
            let held = q.held();
            tracing::info!(exporter = name, directory = %dir.display(), max_bytes, requests = held.requests, bytes = held.bytes, "sending queue on disk");
            Some(Arc::new(Spool { q: Arc::new(q), ready: tokio::sync::Notify::new(), closed: false.into() }))
        }
    };
    let rx = Arc::new(Mutex::new(rx));
    let in_flight = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut leftover = Leftover { name, rx: rx.clone(), in_flight: in_flight.clone(), spool: spool.clone(), tasks: Arc::default() };
    let max_bytes = s.max_request_bytes.max(1024);
    let health = Arc::new(ExportHealth::default());
    let mut handles = Vec::new();
    if let Some(sp) = &spool {
        // The writer: from the channel to disk, in arrival order.
        let (sp, rx, meters) = (sp.clone(), rx.clone(), meters.clone());
        handles.push(tokio::spawn(async move {
            use std::sync::atomic::Ordering;
            let mut drops = DropLog { last: None, since: 0 };
            loop {
                let next = rx.lock().await.recv().await;
                let Some(item) = next else { break };
                let signal = item.signal();
                let (kind, items) = item.items();
                let (rk, n, payload) = to_record(item);
                let q = sp.q.clone();
                match tokio::task::spawn_blocking(move || q.push(rk, n, &payload)).await {
                    Ok(Ok(())) => sp.ready.notify_one(),
                    Ok(Err(e)) => {
                        meters.flow.enqueue_failed(signal, kind, items);
                        drops.dropped(sp.q.dir(), &e);
                    }
                    Err(e) => tracing::error!(error = %e, "sending queue writer failed"),
                }
            }
            sp.closed.store(true, Ordering::Release);
            sp.ready.notify_waiters();
        }));
    }
    for _ in 0..s.workers.max(1) {
        let (rx, routes, retry, meters, spool, in_flight, health) =
            (rx.clone(), routes.clone(), s.retry.clone(), meters.clone(), spool.clone(), in_flight.clone(), health.clone());
        handles.push(tokio::spawn(async move {
            use std::sync::atomic::Ordering;
            match spool {
                Some(sp) => {
                    while let Some(t) = sp.next().await {
                        match from_record(t.record.clone()) {
                            Ok(item) => deliver(item, &routes, &retry, &meters, max_bytes, &health).await,
                            Err(e) => tracing::warn!(directory = %sp.q.dir().display(), error = %e, "unreadable metrics request in the sending queue; dropped"),
                        }
                        let q = sp.q.clone();
                        let _ = tokio::task::spawn_blocking(move || q.ack(t)).await;
                    }
                }
                None => loop {
                    let next = rx.lock().await.recv().await;
                    let Some(item) = next else { break };
                    in_flight.fetch_add(1, Ordering::Relaxed);
                    deliver(item, &routes, &retry, &meters, max_bytes, &health).await;
                    in_flight.fetch_sub(1, Ordering::Relaxed);
                },
            }
        }));
    }
    if spool.is_some() {
        leftover.tasks = Arc::new(std::sync::Mutex::new(handles.iter().map(|h| h.abort_handle()).collect()));
    }
    let spool = spool.map(|s| std::sync::Arc::new(SpoolHandle(s)) as std::sync::Arc<dyn crate::flow::outgoing::DiskSpool>);
    Ok(Started { workers: handles, health, leftover, spool })
}

/// Send one request (split when it is larger than `max_bytes`), counting what went and what
/// did not.
async fn deliver(
    mut item: Outgoing,
    routes: &Routes,
    retry: &RetryOnFailure,
    meters: &HealthMeters,
    max_bytes: usize,
    health: &ExportHealth,
) {
    let signal = item.signal();
    let Some(route) = routes.for_item(&item) else {
        let (kind, items) = item.items();
        meters.export_failed(signal, None, kind, items);
        return;
    };
    // The decoded request's memory reservation follows what is held: its encoding
    // until it is sent or given up on (set, not checked: the bytes exist already,
    // refusing them would free nothing); released when the last part is done.
    let mut held = item.take_reservation();
    // A request larger than `max_request_bytes` is split until each part fits (or is
    // one item): one flush of many health spans must never make a request the
    // receiver refuses, stalling the queue behind it.
    let mut parts = vec![item];
    while let Some(item) = parts.pop() {
        let (kind, items) = item.items();
        let (bytes, encoding) = match encode(&item, route.target.protocol, route.target.compression) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(signal = signal.as_str(), error = %e, "cannot encode an export request; dropped");
                meters.export_failed(signal, Some(route.transport()), kind, items);
                continue;
            }
        };
        if bytes.len() > max_bytes {
            match split(item) {
                Ok((a, b)) => {
                    meters.export_split(signal);
                    parts.push(b);
                    parts.push(a);
                    continue;
                }
                // One item larger than the limit: sent as it is (the receiver may take it).
                Err(one) => drop(one),
            }
        } else {
            drop(item); // only the encoded bytes are held while retrying
        }
        // Parts still waiting share the request's buffer (raw bytes are sliced, not
        // copied): the reservation follows the bytes alone only for the last part.
        if let Some(h) = held.as_mut().filter(|_| parts.is_empty()) {
            h.set(bytes.len() as u64);
        }
        match send_with_retry(route, retry, bytes, encoding, kind, Some(health)).await {
            Ok(rejected) => {
                meters.export_sent(signal, route.transport(), kind, items.saturating_sub(rejected));
                if rejected > 0 {
                    meters.export_failed_items(signal, route.transport(), kind, rejected);
                }
            }
            Err(why) => {
                tracing::warn!(signal = signal.as_str(), url = %route.target.url, error = %why, "export upstream failed; request dropped");
                meters.export_failed(signal, Some(route.transport()), kind, items);
            }
        }
    }
    drop(held);
}

/// Encode once for the target's protocol and compress; the `Content-Encoding` / `grpc-encoding`
/// name rides along (gRPC compresses in tonic, per message, so its bytes stay uncompressed here).
fn encode(item: &Outgoing, protocol: Protocol, compression: Compression) -> Result<(Bytes, Option<&'static str>), std::io::Error> {
    let raw: Bytes = match (item, protocol) {
        // Bytes that came in as protobuf go out as they are (no decode, no re-encode).
        (Outgoing::PassthroughRaw(b, ..) | Outgoing::HealthRaw(b, ..), Protocol::HttpJson) => {
            let r = ExportTraceServiceRequest::decode(b.clone()).map_err(std::io::Error::other)?;
            serde_json::to_vec(&r)?.into()
        }
        (Outgoing::LogsRaw(b, ..), Protocol::HttpJson) => {
            let r = ExportLogsServiceRequest::decode(b.clone()).map_err(std::io::Error::other)?;
            serde_json::to_vec(&r)?.into()
        }
        (Outgoing::PassthroughRaw(b, ..) | Outgoing::HealthRaw(b, ..) | Outgoing::LogsRaw(b, ..), _) => b.clone(),
        (Outgoing::Passthrough(r, _) | Outgoing::Health(r), Protocol::HttpJson) => serde_json::to_vec(r)?.into(),
        (Outgoing::Logs(r) | Outgoing::PassthroughLogs(r, _), Protocol::HttpJson) => serde_json::to_vec(r)?.into(),
        (Outgoing::PassthroughMetrics(r, _) | Outgoing::OwnMetrics(r), Protocol::HttpJson) => serde_json::to_vec(r)?.into(),
        (Outgoing::Passthrough(r, _) | Outgoing::Health(r), _) => r.encode_to_vec().into(),
        (Outgoing::Logs(r) | Outgoing::PassthroughLogs(r, _), _) => r.encode_to_vec().into(),
        (Outgoing::PassthroughMetrics(r, _) | Outgoing::OwnMetrics(r), _) => r.encode_to_vec().into(),
    };
    if protocol == Protocol::Grpc {
        return Ok((raw, None));
    }
    Ok(match compression {
        Compression::None => (raw, None),
        Compression::Gzip => {
            let mut e = flate2::write::GzEncoder::new(Vec::with_capacity(raw.len() / 4), flate2::Compression::default());
            e.write_all(&raw)?;
            (Bytes::from(e.finish()?), Some("gzip"))
        }
        Compression::Zstd => (Bytes::from(zstd::bulk::compress(&raw, 3)?), Some("zstd")),
    })
}

/// A receiver's "message too large": tonic and grpc-go answer `OUT_OF_RANGE` or
/// `RESOURCE_EXHAUSTED` (without RetryInfo) with a message naming the length. OTLP lists
/// `OUT_OF_RANGE` as retryable, but these bytes can never pass.
fn too_large(st: &Status) -> bool {
    use tonic_types::StatusExt;
    let m = st.message().to_ascii_lowercase();
    let names_size = m.contains("too large") || m.contains("larger than") || m.contains("message length");
    match st.code() {
        Code::OutOfRange => names_size,
        Code::ResourceExhausted => names_size && st.get_details_retry_info().is_none(),
        _ => false,
    }
}

/// Split a request in two halves of its items, each part keeping its resources and scopes.
/// `Err` gives the request back when it holds one item, or is metrics (not split: the SDK's
/// own metrics are small, and a client's are passed on as they came).
pub(crate) fn split(item: Outgoing) -> Result<(Outgoing, Outgoing), Outgoing> {
    match item {
        // A reservation stays with the caller (it pays for the whole request until every part is sent).
        Outgoing::Passthrough(r, h) => split_traces(r)
            .map(|(a, b)| (Outgoing::Passthrough(a, None), Outgoing::Passthrough(b, None)))
            .map_err(|r| Outgoing::Passthrough(r, h)),
        Outgoing::PassthroughRaw(b, n, h) => split_raw(b, n, h),
        Outgoing::Health(r) => split_traces(r).map(|(a, b)| (Outgoing::Health(a), Outgoing::Health(b))).map_err(Outgoing::Health),
        Outgoing::HealthRaw(b, n, h) => match ExportTraceServiceRequest::decode(b.clone()) {
            Ok(r) => split_traces(r).map(|(x, y)| (Outgoing::Health(x), Outgoing::Health(y))).map_err(|_| Outgoing::HealthRaw(b, n, h)),
            Err(_) => Err(Outgoing::HealthRaw(b, n, h)),
        },
        Outgoing::Logs(r) => split_logs(r).map(|(a, b)| (Outgoing::Logs(a), Outgoing::Logs(b))).map_err(Outgoing::Logs),
        Outgoing::LogsRaw(b, n, h) => match ExportLogsServiceRequest::decode(b.clone()) {
            Ok(r) => split_logs(r).map(|(x, y)| (Outgoing::Logs(x), Outgoing::Logs(y))).map_err(|_| Outgoing::LogsRaw(b, n, h)),
            Err(_) => Err(Outgoing::LogsRaw(b, n, h)),
        },
        Outgoing::PassthroughLogs(r, h) => split_logs(r)
            .map(|(a, b)| (Outgoing::PassthroughLogs(a, None), Outgoing::PassthroughLogs(b, None)))
            .map_err(|r| Outgoing::PassthroughLogs(r, h)),
        other => Err(other),
    }
}

/// Raw bytes split at the `ResourceSpans` nearest the middle; one `ResourceSpans` alone is
/// decoded and split as structs (its scopes and spans).
fn split_raw(b: Bytes, n: u64, h: Option<Reservation>) -> Result<(Outgoing, Outgoing), Outgoing> {
    let pieces = crate::normalize::wire::split_resource_spans(&b, b.len() / 2).unwrap_or_default();
    if pieces.len() >= 2 {
        let cut = pieces[0].1;
        let (first, second) = (b.slice(..cut), b.slice(cut..));
        let count = |x: &Bytes| crate::normalize::wire::span_count(x).unwrap_or(0);
        let (n1, n2) = (count(&first), count(&second));
        return Ok((Outgoing::PassthroughRaw(first, n1, None), Outgoing::PassthroughRaw(second, n2, None)));
    }
    match ExportTraceServiceRequest::decode(b.clone()) {
        Ok(r) => split_traces(r)
            .map(|(x, y)| (Outgoing::Passthrough(x, None), Outgoing::Passthrough(y, None)))
            .map_err(|_| Outgoing::PassthroughRaw(b, n, h)),
        Err(_) => Err(Outgoing::PassthroughRaw(b, n, h)),
    }
}

/// One splitter per request type: the same walk over resource → scope → items.
macro_rules! splitter {
    ($name:ident, $req:ident, $groups:ident, $group:ident, $scopes:ident, $scope:ident, $items:ident, $count:ident) => {
        fn $name(r: $req) -> Result<($req, $req), $req> {
            let total = $count(&r) as usize;
            if total < 2 {
                return Err(r);
            }
            let mut want = total / 2;
            let (mut first, mut second) = ($req::default(), $req::default());
            for mut g in r.$groups {
                if want == 0 {
                    second.$groups.push(g);
                    continue;
                }
                let scopes = std::mem::take(&mut g.$scopes);
                let mut head = $group { resource: g.resource.clone(), schema_url: g.schema_url.clone(), $scopes: Vec::new() };
                let mut tail = $group { $scopes: Vec::new(), ..g };
                for mut sc in scopes {
                    let n = sc.$items.len();
                    if want == 0 {
                        tail.$scopes.push(sc);
                    } else if n <= want {
                        want -= n;
                        head.$scopes.push(sc);
                    } else {
                        let rest = sc.$items.split_off(want);
                        want = 0;
                        let sc2 = $scope { scope: sc.scope.clone(), schema_url: sc.schema_url.clone(), $items: rest };
                        head.$scopes.push(sc);
                        tail.$scopes.push(sc2);
                    }
                }
                first.$groups.push(head);
                if !tail.$scopes.is_empty() {
                    second.$groups.push(tail);
                }
            }
            Ok((first, second))
        }
    };
}

splitter!(split_traces, ExportTraceServiceRequest, resource_spans, ResourceSpans, scope_spans, ScopeSpans, spans, span_count);
splitter!(split_logs, ExportLogsServiceRequest, resource_logs, ResourceLogs, scope_logs, ScopeLogs, log_records, log_record_count);

/// OTLP: these gRPC codes are retryable (RESOURCE_EXHAUSTED only when the server says when).
fn retryable(st: &Status) -> Option<Option<Duration>> {
    use tonic_types::StatusExt;
    match st.code() {
        Code::Cancelled | Code::DeadlineExceeded | Code::Aborted | Code::OutOfRange | Code::Unavailable | Code::DataLoss => {
            Some(st.get_details_retry_info().and_then(|r| r.retry_delay))
        }
        Code::ResourceExhausted => st.get_details_retry_info().map(|r| r.retry_delay),
        _ => None,
    }
}

fn grpc_failure(st: Status) -> Failure {
    let why = format!("gRPC {:?}: {}", st.code(), st.message());
    if too_large(&st) {
        return Failure::TooLarge(why);
    }
    match retryable(&st) {
        Some(hint) => Failure::Retryable(hint, why),
        None => Failure::Permanent(why),
    }
}

const TRACES_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";
const LOGS_PATH: &str = "/opentelemetry.proto.collector.logs.v1.LogsService/Export";
const METRICS_PATH: &str = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export";

/// `interval` spread over `[1 − factor, 1 + factor]` by `r` in `[0, 1)`, as the collector's
/// exponential backoff does.
pub(crate) fn jittered(interval: Duration, factor: f64, r: f64) -> Duration {
    let f = factor.clamp(0.0, 1.0);
    interval.mul_f64((1.0 - f + 2.0 * f * r.clamp(0.0, 1.0)).max(0.0))
}

/// A number in `[0, 1)` for jitter (not for anything that needs to be unpredictable).
fn unit_random() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// Send with the configured retries; `Ok(rejected)` is the number of items the server refused in
/// a partial success. Every attempt is told to `health`: a backend down shows while the request
/// is still being retried, not only once it is given up on. A request too large for the
/// receiver tells nothing about the backend (it answered).
async fn send_with_retry(
    route: &Route,
    retry: &RetryOnFailure,
    bytes: Bytes,
    encoding: Option<&'static str>,
    kind: ItemKind,
    health: Option<&ExportHealth>,
) -> Result<u64, String> {
    use crate::evidence::time::Moment;
    let told = |ok: bool| {
        if let Some(h) = health {
            if ok {
                h.succeeded(Moment::wall_now());
            } else {
                h.failed(Moment::wall_now());
            }
        }
    };
    let started = Instant::now();
    let mut backoff = retry.initial_interval;
    loop {
        let sent = match &route.transport {
            Transport::Grpc(ch) => send_grpc(ch, &route.target, bytes.clone(), kind).await,
            Transport::Http(h) => h.send(bytes.clone(), encoding).await.map(|body| http_rejected(kind, &body)),
        };
        match &sent {
            Ok(_) => told(true),
            Err(Failure::Permanent(_) | Failure::Retryable(..)) => told(false),
            Err(Failure::TooLarge(_)) => {}
        }
        match sent {
            Ok(rejected) => return Ok(rejected),
            Err(Failure::Permanent(why)) => return Err(why),
            // The same bytes would be refused again: never retried (lower max_request_bytes).
            Err(Failure::TooLarge(why)) => {
                return Err(format!("{why} (too large for the receiver: lower exporters.otlp.max_request_bytes)"))
            }
            Err(Failure::Retryable(hint, why)) => {
                if !retry.enabled {
                    return Err(why);
                }
                // A delay the server asked for (RetryInfo, Retry-After) is kept; our own backoff is jittered.
                let wait = hint.unwrap_or_else(|| jittered(backoff, retry.randomization_factor, unit_random())).min(retry.max_interval);
                // 0 is no limit: retried until accepted or the service stops, as in the collector.
                if !retry.max_elapsed_time.is_zero() && started.elapsed() + wait > retry.max_elapsed_time {
                    return Err(format!("{why} (gave up after {:?})", started.elapsed()));
                }
                tracing::debug!(error = %why, ?wait, "export upstream failed; retrying");
                tokio::time::sleep(wait).await;
                backoff = backoff.mul_f64(retry.multiplier.max(1.0)).min(retry.max_interval);
            }
        }
    }
}

/// Items refused in an HTTP partial success (an unreadable body counts none).
fn http_rejected(kind: ItemKind, body: &[u8]) -> u64 {
    let (n, msg) = match kind {
        ItemKind::Spans => {
            ExportTraceServiceResponse::decode(body).ok().and_then(|r| r.partial_success).map(|p| (p.rejected_spans, p.error_message))
        }
        ItemKind::MetricPoints => ExportMetricsServiceResponse::decode(body)
            .ok()
            .and_then(|r| r.partial_success)
            .map(|p| (p.rejected_data_points, p.error_message)),
        ItemKind::LogRecords => {
            ExportLogsServiceResponse::decode(body).ok().and_then(|r| r.partial_success).map(|p| (p.rejected_log_records, p.error_message))
        }
    }
    .unwrap_or_default();
    rejected(kind, n, &msg)
}

fn rejected(kind: ItemKind, n: i64, msg: &str) -> u64 {
    if n > 0 {
        tracing::warn!(?kind, rejected = n, message = msg, "upstream rejected some items (partial success)");
    }
    n.max(0) as u64
}

async fn send_grpc(channel: &Channel, t: &Target, bytes: Bytes, kind: ItemKind) -> Result<u64, Failure> {
    match kind {
        ItemKind::Spans => send_once::<ExportTraceServiceResponse>(channel, t, bytes, TRACES_PATH)
            .await
            .map(|r| r.partial_success.map_or(0, |p| rejected(kind, p.rejected_spans, &p.error_message))),
        ItemKind::MetricPoints => send_once::<ExportMetricsServiceResponse>(channel, t, bytes, METRICS_PATH)
            .await
            .map(|r| r.partial_success.map_or(0, |p| rejected(kind, p.rejected_data_points, &p.error_message))),
        ItemKind::LogRecords => send_once::<ExportLogsServiceResponse>(channel, t, bytes, LOGS_PATH)
            .await
            .map(|r| r.partial_success.map_or(0, |p| rejected(kind, p.rejected_log_records, &p.error_message))),
    }
    .map_err(grpc_failure)
}

async fn send_once<R: Message + Default + Send + 'static>(
    channel: &Channel,
    t: &Target,
    bytes: Bytes,
    path: &'static str,
) -> Result<R, Status> {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    match t.compression {
        Compression::Gzip => grpc = grpc.send_compressed(CompressionEncoding::Gzip),
        Compression::Zstd => grpc = grpc.send_compressed(CompressionEncoding::Zstd),
        Compression::None => {}
    }
    if t.compression == Compression::None {
        return send_uncompressed(channel, t, bytes, path).await;
    }
    grpc.ready().await.map_err(|e| Status::unavailable(format!("upstream not ready: {e}")))?;
    let mut req = tonic::Request::new(bytes);
    for (k, v) in &t.headers {
        if let (Ok(k), Ok(v)) = (k.parse::<tonic::metadata::MetadataKey<tonic::metadata::Ascii>>(), v.parse()) {
            req.metadata_mut().insert(k, v);
        }
    }
    let resp: tonic::Response<R> =
        grpc.unary(req, tonic::codegen::http::uri::PathAndQuery::from_static(path), PreEncoded::<R>::default()).await?;
    Ok(resp.into_inner())
}

/// One unary gRPC call with an uncompressed message that is sent as it is held: the 5-byte frame
/// header and the message's own buffer are the request body's two chunks. tonic's encoder copies
/// every message into its buffer, and h2 holds that copy until the upstream reads it: with the
/// upstream slow or down, each worker held its request twice (issue 11: a held request costs
/// its wire size). The answer is read as tonic reads it: the status from the headers (a
/// trailers-only answer) or the trailers, an HTTP status without one mapped as the gRPC
/// specification maps it, the one response message decoded.
async fn send_uncompressed<R: Message + Default>(channel: &Channel, t: &Target, bytes: Bytes, path: &'static str) -> Result<R, Status> {
    use http_body_util::BodyExt;
    use tonic::codegen::http;
    use tower::ServiceExt;
    let mut header = [0u8; 5];
    let len = u32::try_from(bytes.len()).map_err(|_| Status::resource_exhausted("message larger than 4 GiB: too large"))?;
    header[1..].copy_from_slice(&len.to_be_bytes());
    let chunks = [Bytes::copy_from_slice(&header), bytes];
    let body = http_body_util::StreamBody::new(tokio_stream::iter(
        chunks.into_iter().map(|c| Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(c))),
    ));
    let mut req = http::Request::builder()
        .method(http::Method::POST)
        .uri(path)
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .body(tonic::body::Body::new(body))
        .map_err(|e| Status::internal(format!("cannot build the request: {e}")))?;
    for (k, v) in &t.headers {
        if let (Ok(k), Ok(v)) = (k.parse::<http::HeaderName>(), v.parse::<http::HeaderValue>()) {
            req.headers_mut().insert(k, v);
        }
    }
    let ch = channel.clone().ready_oneshot().await.map_err(|e| Status::unavailable(format!("upstream not ready: {e}")))?;
    // Transport errors read as tonic reads them (a refused connection UNAVAILABLE, a timeout
    // CANCELLED, an h2 reset its code).
    let resp = ch.oneshot(req).await.map_err(|e| Status::from_error(Box::new(e)))?;
    let (parts, body) = resp.into_parts();
    if let Some(st) = Status::from_header_map(&parts.headers).filter(|st| st.code() != Code::Ok) {
        return Err(st);
    }
    if parts.status != http::StatusCode::OK {
        return Err(http_status_to_grpc(parts.status));
    }
    let collected = body.collect().await?;
    let status = collected.trailers().and_then(Status::from_header_map).or_else(|| Status::from_header_map(&parts.headers));
    match status {
        Some(st) if st.code() != Code::Ok => return Err(st),
        Some(_) => {}
        None => return Err(Status::internal("the answer carries no grpc-status")),
    }
    let data = collected.to_bytes();
    if data.is_empty() {
        return Ok(R::default());
    }
    if data.len() < 5 || data[0] != 0 {
        return Err(Status::internal("bad upstream response: not one uncompressed message"));
    }
    let n = u32::from_be_bytes([data[1], data[2], data[3], data[4]]) as usize;
    let msg = data.get(5..5 + n).ok_or_else(|| Status::internal("bad upstream response: truncated message"))?;
    R::decode(msg).map_err(|e| Status::internal(format!("bad upstream response: {e}")))
}

/// An HTTP answer without a gRPC status, as the gRPC specification maps it
/// (doc/http-grpc-status-mapping.md): retryable where it says the server is unavailable.
fn http_status_to_grpc(s: tonic::codegen::http::StatusCode) -> Status {
    let code = match s.as_u16() {
        400 => Code::Internal,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::Unimplemented,
        429 | 502 | 503 | 504 => Code::Unavailable,
        _ => Code::Unknown,
    };
    Status::new(code, format!("HTTP status {s} without a gRPC status"))
}

/// A codec that sends bytes already encoded as an OTLP export request and decodes the generated
/// response type `R`. Public for the load generator, which sends pre-encoded batches.
pub(crate) struct PreEncoded<R = ExportTraceServiceResponse>(std::marker::PhantomData<fn() -> R>);

impl<R> Default for PreEncoded<R> {
    fn default() -> Self {
        PreEncoded(std::marker::PhantomData)
    }
}

impl<R: Message + Default + Send + 'static> Codec for PreEncoded<R> {
    type Encode = Bytes;
    type Decode = R;
    type Encoder = BytesEncoder;
    type Decoder = ResponseDecoder<R>;
    fn encoder(&mut self) -> Self::Encoder {
        BytesEncoder
    }
    fn decoder(&mut self) -> Self::Decoder {
        ResponseDecoder(std::marker::PhantomData)
    }
}

/// Writes pre-encoded bytes as the message.
#[derive(Clone, Copy, Default)]
pub(crate) struct BytesEncoder;

impl Encoder for BytesEncoder {
    type Item = Bytes;
    type Error = Status;
    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

/// Decodes a generated response message.
pub(crate) struct ResponseDecoder<R>(std::marker::PhantomData<fn() -> R>);

impl<R: Message + Default> Decoder for ResponseDecoder<R> {
    type Item = R;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<R>, Status> {
        let b = src.copy_to_bytes(src.remaining());
        R::decode(b).map(Some).map_err(|e| Status::internal(format!("bad upstream response: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::Span;

    fn request(shape: &[&[usize]]) -> ExportTraceServiceRequest {
        let mut n = 0u8;
        ExportTraceServiceRequest {
            resource_spans: shape
                .iter()
                .enumerate()
                .map(|(ri, scopes)| ResourceSpans {
                    resource: Some(Resource { dropped_attributes_count: ri as u32, ..Default::default() }),
                    scope_spans: scopes
                        .iter()
                        .enumerate()
                        .map(|(si, k)| ScopeSpans {
                            scope: Some(InstrumentationScope { name: format!("r{ri}s{si}"), ..Default::default() }),
                            spans: (0..*k)
                                .map(|_| {
                                    n += 1;
                                    Span { span_id: vec![n; 8], ..Default::default() }
                                })
                                .collect(),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
        }
    }

    /// (resource, scope name, span id) of every span, in order.
    fn flat(r: &ExportTraceServiceRequest) -> Vec<(u32, String, u8)> {
        r.resource_spans
            .iter()
            .flat_map(|rs| {
                rs.scope_spans.iter().flat_map(move |ss| {
                    ss.spans.iter().map(move |sp| {
                        (
                            rs.resource.as_ref().map_or(99, |x| x.dropped_attributes_count),
                            ss.scope.as_ref().unwrap().name.clone(),
                            sp.span_id[0],
                        )
                    })
                })
            })
            .collect()
    }

    /// Issue 11: an oversize request is split in halves that keep every span with its resource
    /// and scope, in order; one span is not split.
    #[test]
    fn split_keeps_every_span_with_its_resource_and_scope() {
        for shape in [&[&[3usize, 3][..], &[2, 4][..]][..], &[&[1][..], &[1][..]], &[&[7][..]], &[&[0, 5][..], &[][..], &[2][..]]] {
            let r = request(shape);
            let all = flat(&r);
            let Ok((Outgoing::Health(a), Outgoing::Health(b))) = split(Outgoing::Health(r)) else { panic!("{shape:?} splits") };
            let (fa, fb) = (flat(&a), flat(&b));
            assert_eq!(fa.len(), all.len() / 2, "{shape:?}");
            assert_eq!([fa, fb].concat(), all, "{shape:?}: nothing lost, nothing reordered, each span keeps its resource and scope");
        }
        assert!(split(Outgoing::Health(request(&[&[1]]))).is_err(), "one span is not split");
        assert!(split(Outgoing::OwnMetrics(Default::default())).is_err(), "metrics are not split");
    }

    /// "Too large" is never retried: the same bytes would be refused again.
    /// Issue 11: an uncompressed gRPC export is sent as its two chunks (no copy); the answer is
    /// read as tonic reads it. Against tonic's own server: the message arrives whole, a partial
    /// success is read, a status with RetryInfo keeps its code and delay, an error status its
    /// code and message, an HTTP answer without a gRPC status is mapped.
    #[tokio::test]
    async fn uncompressed_exports_go_out_as_they_are_held_and_answers_read_as_tonic_reads_them() {
        use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
        use opentelemetry_proto::tonic::collector::trace::v1::ExportTracePartialSuccess;
        #[derive(Clone, Default)]
        struct Sink(Arc<std::sync::Mutex<Vec<ExportTraceServiceRequest>>>);
        #[tonic::async_trait]
        impl TraceService for Sink {
            async fn export(
                &self,
                r: tonic::Request<ExportTraceServiceRequest>,
            ) -> Result<tonic::Response<ExportTraceServiceResponse>, Status> {
                let n = {
                    let mut seen = self.0.lock().unwrap();
                    seen.push(r.into_inner());
                    seen.len()
                };
                match n {
                    1 => Ok(tonic::Response::new(ExportTraceServiceResponse {
                        partial_success: Some(ExportTracePartialSuccess { rejected_spans: 3, error_message: "three".into() }),
                    })),
                    2 => {
                        use tonic_types::{ErrorDetails, StatusExt};
                        Err(Status::with_error_details(
                            Code::Unavailable,
                            "busy",
                            ErrorDetails::with_retry_info(Some(Duration::from_millis(1500))),
                        ))
                    }
                    _ => Err(Status::invalid_argument("bad request")),
                }
            }
        }
        let sink = Sink::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = sink.clone();
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(server))
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
                .await
        });
        let target = Target {
            protocol: Protocol::Grpc,
            url: format!("http://{addr}"),
            tls: None,
            server_name: None,
            headers: vec![("x-tenant".into(), "t1".into())],
            timeout: Duration::from_secs(5),
            compression: Compression::None,
        };
        let channel = grpc_channel(&target).unwrap();
        let req = crate::loadgen::build_request(1, 40);
        let bytes = Bytes::from(req.encode_to_vec());
        let ok: ExportTraceServiceResponse = send_once(&channel, &target, bytes.clone(), TRACES_PATH).await.unwrap();
        assert_eq!(ok.partial_success.map(|p| p.rejected_spans), Some(3));
        assert_eq!(sink.0.lock().unwrap()[0], req, "the message arrives whole");
        let busy = send_once::<ExportTraceServiceResponse>(&channel, &target, bytes.clone(), TRACES_PATH).await.unwrap_err();
        assert_eq!(busy.code(), Code::Unavailable);
        assert_eq!(retryable(&busy), Some(Some(Duration::from_millis(1500))), "RetryInfo kept");
        let bad = send_once::<ExportTraceServiceResponse>(&channel, &target, bytes, TRACES_PATH).await.unwrap_err();
        assert_eq!((bad.code(), bad.message()), (Code::InvalidArgument, "bad request"));
        assert!(matches!(grpc_failure(bad), Failure::Permanent(_)));
        assert_eq!(http_status_to_grpc(tonic::codegen::http::StatusCode::SERVICE_UNAVAILABLE).code(), Code::Unavailable);
        assert_eq!(http_status_to_grpc(tonic::codegen::http::StatusCode::NOT_FOUND).code(), Code::Unimplemented);
    }

    /// `max_elapsed_time: 0` is no limit, as in the collector (it used to mean "never retry"): a
    /// backend that refuses four times and then accepts gets the request.
    #[tokio::test]
    async fn max_elapsed_time_zero_retries_until_accepted() {
        use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
        #[derive(Clone, Default)]
        struct Flaky(Arc<std::sync::atomic::AtomicUsize>);
        #[tonic::async_trait]
        impl TraceService for Flaky {
            async fn export(
                &self,
                _: tonic::Request<ExportTraceServiceRequest>,
            ) -> Result<tonic::Response<ExportTraceServiceResponse>, Status> {
                match self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst) {
                    0..=3 => Err(Status::unavailable("not yet")),
                    _ => Ok(tonic::Response::new(ExportTraceServiceResponse::default())),
                }
            }
        }
        let flaky = Flaky::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = flaky.clone();
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(server))
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
                .await
        });
        let target = Target {
            protocol: Protocol::Grpc,
            url: format!("http://{addr}"),
            tls: None,
            server_name: None,
            headers: vec![],
            timeout: Duration::from_secs(5),
            compression: Compression::None,
        };
        let route = Route::new(&target).unwrap();
        let bytes = Bytes::from(crate::loadgen::build_request(1, 2).encode_to_vec());
        let retry = RetryOnFailure {
            initial_interval: Duration::from_millis(5),
            max_interval: Duration::from_millis(10),
            max_elapsed_time: Duration::ZERO,
            ..RetryOnFailure::default()
        };
        let sent = send_with_retry(&route, &retry, bytes.clone(), None, ItemKind::Spans, None).await;
        assert_eq!(sent, Ok(0), "accepted on the fifth try");
        assert_eq!(flaky.0.load(std::sync::atomic::Ordering::SeqCst), 5);
        // Retries off: one try, as before.
        flaky.0.store(0, std::sync::atomic::Ordering::SeqCst);
        let once = RetryOnFailure { enabled: false, ..retry };
        assert!(send_with_retry(&route, &once, bytes, None, ItemKind::Spans, None).await.is_err());
        assert_eq!(flaky.0.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    /// The on-disk queue through the exporter: with the backend down, what passes the byte
    /// bound is dropped and counted (`enqueue_failed`), the rest stays on disk; a second exporter
    /// on the same directory (a restart) sends it to a live backend and empties the directory.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_disk_queue_drops_past_its_bound_and_a_restart_sends_the_rest() {
        use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
        #[derive(Clone, Default)]
        struct Sink(Arc<std::sync::Mutex<Vec<ExportTraceServiceRequest>>>);
        #[tonic::async_trait]
        impl TraceService for Sink {
            async fn export(
                &self,
                r: tonic::Request<ExportTraceServiceRequest>,
            ) -> Result<tonic::Response<ExportTraceServiceResponse>, Status> {
                self.0.lock().unwrap().push(r.into_inner());
                Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
            }
        }
        let target = |addr: std::net::SocketAddr| Target {
            protocol: Protocol::Grpc,
            url: format!("http://{addr}"),
            tls: None,
            server_name: None,
            headers: vec![],
            timeout: Duration::from_secs(2),
            compression: Compression::None,
        };
        let settings = |t: Target| SenderSettings {
            targets: Targets { traces: Some(t), metrics: None, logs: None },
            workers: 1,
            retry: RetryOnFailure {
                initial_interval: Duration::from_millis(20),
                max_interval: Duration::from_millis(50),
                max_elapsed_time: Duration::ZERO,
                ..RetryOnFailure::default()
            },
            max_request_bytes: 1 << 20,
        };
        let pipeline = crate::emit::metrics::MetricsPipeline::build(crate::emit::metrics::MetricsSettings {
            resource: opentelemetry_sdk::Resource::builder().with_service_name("t").build(),
            prometheus: true,
            otlp: None,
            cardinality_limit: 100,
            level: crate::telemetry::instruments::MetricsLevel::Detailed,
        })
        .unwrap();
        let req = crate::loadgen::build_request(1, 3);
        let spans = span_count(&req);
        let payload = Bytes::from(req.encode_to_vec());
        let dir = tempfile::tempdir().unwrap();
        // Room for three requests (each file is the payload and a small header).
        let store = QueueStore::Disk { dir: dir.path().to_path_buf(), max_bytes: 3 * (payload.len() as u64 + 64) };

        // The backend is down (nothing listens on the port).
        let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let first = spawn(settings(target(dead)), rx, pipeline.meters.clone(), "otlp", store.clone()).unwrap();
        for _ in 0..5 {
            tx.try_send(Outgoing::HealthRaw(payload.clone(), spans, None)).unwrap();
        }
        let reader = pipeline.prometheus.clone().unwrap();
        let mut dropped = 0.0;
        for _ in 0..500 {
            let text = crate::emit::prometheus::render(&reader);
            dropped = text
                .lines()
                .filter(|l| l.starts_with("mcp_health_exporter_enqueue_failed_spans_total"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum();
            if dropped >= (2 * spans) as f64 && first.leftover.count().on_disk == 3 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(dropped, (2 * spans) as f64, "two requests past the bound, counted in spans");
        let left = first.leftover.count();
        assert_eq!((left.on_disk, left.in_memory), (3, 0), "{left:?}");
        assert_eq!(first.leftover.directory(), Some(dir.path()));
        // The process ends: its tasks are gone, the files stay.
        for w in first.workers {
            w.abort();
        }
        drop(tx);

        // A restart with the backend up sends the three and empties the directory.
        let sink = Sink::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = sink.clone();
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(server))
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
                .await
        });
        let (tx, rx) = tokio::sync::mpsc::channel::<Outgoing>(16);
        let second = spawn(settings(target(addr)), rx, pipeline.meters.clone(), "otlp", store).unwrap();
        drop(tx);
        for w in second.workers {
            w.await.unwrap();
        }
        let got = sink.0.lock().unwrap().clone();
        assert_eq!(got, vec![req.clone(), req.clone(), req], "each request once, as it was queued");
        assert_eq!(second.leftover.count(), Left::default());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "sent requests are removed");
    }

    #[test]
    fn too_large_answers_are_not_retried() {
        let st = Status::out_of_range("decoded message length too large: found 5000000 bytes, the limit is: 4194304 bytes");
        assert!(matches!(grpc_failure(st), Failure::TooLarge(_)));
        let st = Status::resource_exhausted("message larger than max (5000000 vs. 4194304)");
        assert!(matches!(grpc_failure(st), Failure::TooLarge(_)));
        assert!(matches!(grpc_failure(Status::unavailable("busy")), Failure::Retryable(..)));
        assert!(
            matches!(grpc_failure(Status::out_of_range("cursor out of range")), Failure::Retryable(..)),
            "OUT_OF_RANGE for another reason stays retryable, as OTLP says"
        );
    }

    /// Issue 10: retries are jittered (the OTLP exporter specification requires it), spread over
    /// `[1 − f, 1 + f]` of the interval as the collector's backoff does.
    #[test]
    fn retry_waits_are_jittered_within_the_randomization_factor() {
        let i = Duration::from_secs(2);
        for (r, want_ms) in [(0.0, 1_000), (0.5, 2_000), (0.999_999, 3_000)] {
            let got = jittered(i, 0.5, r).as_millis() as i64;
            assert!((got - want_ms).abs() <= 1, "r={r}: {got} ms");
        }
        assert_eq!(jittered(i, 0.0, 0.9), i, "no factor, no jitter");
        let draws: Vec<Duration> = (0..64).map(|_| jittered(i, 0.5, unit_random())).collect();
        assert!(draws.iter().all(|d| *d >= Duration::from_secs(1) && *d <= Duration::from_secs(3)));
        assert!(draws.iter().any(|d| *d != draws[0]), "the waits differ: {draws:?}");
    }
}
