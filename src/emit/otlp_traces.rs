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

use std::io::Write as _;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes};
use opentelemetry_proto::tonic::collector::logs::v1::{ExportLogsServiceRequest, ExportLogsServiceResponse};
use opentelemetry_proto::tonic::collector::metrics::v1::{ExportMetricsServiceRequest, ExportMetricsServiceResponse};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use prost::Message;
use tokio::sync::{mpsc, Mutex};
use tonic::codec::{Codec, CompressionEncoding, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use super::metrics::HealthMeters;
use super::otlp_http::HttpSender;
use super::otlp_target::{Compression, Protocol, Target, Targets};
use crate::config::RetryOnFailure;
use crate::receive::memory::Reservation;

/// What travels to the workers.
#[derive(Debug)]
pub enum Outgoing {
    /// Spans received from a client, passed on unchanged, with the memory they hold under
    /// `processors.memory_limiter` (released once sent or given up on).
    Passthrough(ExportTraceServiceRequest, Option<Reservation>),
    /// Health spans made by this service.
    Health(ExportTraceServiceRequest),
    /// Incident log records made by this service.
    Logs(ExportLogsServiceRequest),
    /// Metrics received from a client, passed on unchanged (and their memory reservation).
    PassthroughMetrics(ExportMetricsServiceRequest, Option<Reservation>),
    /// Log records received from a client, passed on unchanged (and their memory reservation).
    PassthroughLogs(ExportLogsServiceRequest, Option<Reservation>),
    /// This service's own metrics (the SDK's periodic reader).
    OwnMetrics(ExportMetricsServiceRequest),
}

/// What an export request carries, in the collector's units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ItemKind {
    Spans,
    MetricPoints,
    LogRecords,
}

impl Outgoing {
    /// The `signal` label of the exporter's counters.
    pub fn signal(&self) -> &'static str {
        match self {
            Outgoing::Passthrough(..) => "passthrough",
            Outgoing::Health(_) => "health_spans",
            Outgoing::Logs(_) => "incident_logs",
            Outgoing::PassthroughMetrics(..) => "passthrough_metrics",
            Outgoing::PassthroughLogs(..) => "passthrough_logs",
            Outgoing::OwnMetrics(_) => "own_metrics",
        }
    }

    /// The memory reservation of a pass-through item, taken out so it can outlive the item (the
    /// encoded bytes it becomes are held until sent).
    pub fn take_reservation(&mut self) -> Option<Reservation> {
        match self {
            Outgoing::Passthrough(_, r) | Outgoing::PassthroughMetrics(_, r) | Outgoing::PassthroughLogs(_, r) => r.take(),
            _ => None,
        }
    }

    /// How many items the request carries, and of which kind.
    pub fn items(&self) -> (ItemKind, u64) {
        match self {
            Outgoing::Passthrough(r, _) | Outgoing::Health(r) => (ItemKind::Spans, span_count(r)),
            Outgoing::Logs(r) | Outgoing::PassthroughLogs(r, _) => (ItemKind::LogRecords, log_record_count(r)),
            Outgoing::PassthroughMetrics(r, _) | Outgoing::OwnMetrics(r) => (ItemKind::MetricPoints, metric_point_count(r)),
        }
    }
}

pub fn span_count(r: &ExportTraceServiceRequest) -> u64 {
    r.resource_spans.iter().flat_map(|r| &r.scope_spans).map(|s| s.spans.len() as u64).sum()
}

pub fn log_record_count(r: &ExportLogsServiceRequest) -> u64 {
    r.resource_logs.iter().flat_map(|r| &r.scope_logs).map(|s| s.log_records.len() as u64).sum()
}

pub fn metric_point_count(r: &ExportMetricsServiceRequest) -> u64 {
    r.resource_metrics
        .iter()
        .flat_map(|r| &r.scope_metrics)
        .flat_map(|s| &s.metrics)
        .map(|m| match &m.data {
            Some(Data::Gauge(g)) => g.data_points.len(),
            Some(Data::Sum(s)) => s.data_points.len(),
            Some(Data::Histogram(h)) => h.data_points.len(),
            Some(Data::ExponentialHistogram(h)) => h.data_points.len(),
            Some(Data::Summary(s)) => s.data_points.len(),
            None => 0,
        } as u64)
        .sum()
}

/// Why the sender could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("invalid OTLP endpoint {0:?}: {1}")]
    Endpoint(String, String),
    #[error(transparent)]
    Http(#[from] super::otlp_http::HttpSetupError),
}

/// Why one attempt to send failed: retryable (with the delay the server asked for, if any) or
/// not.
#[derive(Debug)]
pub enum Failure {
    Retryable(Option<Duration>, String),
    Permanent(String),
}

/// Settings for [`spawn`].
#[derive(Clone, Debug)]
pub struct SenderSettings {
    pub targets: Targets,
    pub workers: usize,
    pub retry: RetryOnFailure,
}

/// The bounded queue the workers drain. Made before the workers so the metrics pipeline (whose
/// exporter feeds it) can be built first.
pub fn queue(size: usize) -> (mpsc::Sender<Outgoing>, mpsc::Receiver<Outgoing>) {
    mpsc::channel(size.max(1))
}

/// Add `http://` when an endpoint is written as host:port, as the OTLP exporters accept.
pub fn endpoint_uri(e: &str) -> String {
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
    fn transport(&self) -> &'static str {
        match self.transport {
            Transport::Grpc(_) => "grpc",
            Transport::Http(_) => "http",
        }
    }
}

/// A hyper-rustls connector with the target's TLS configuration (`https_or_http` when the target
/// is plaintext: its URL is `http://`, so no TLS is attempted). `h2` sets ALPN for gRPC.
pub fn https_connector(t: &Target, h2: bool) -> hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector> {
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(t.timeout));
    let (cfg, tls) = match &t.tls {
        Some(c) => ((**c).clone(), true),
        // Never used (the URL is http://); hyper-rustls wants a configuration all the same.
        None => (plaintext_placeholder(), false),
    };
    let b = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(cfg);
    let mut b = if tls { b.https_only() } else { b.https_or_http() };
    if let Some(n) = &t.server_name {
        b = b.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(n.clone()));
    }
    if h2 {
        b.enable_http2().wrap_connector(http)
    } else {
        b.enable_http1().wrap_connector(http)
    }
}

fn plaintext_placeholder() -> rustls::ClientConfig {
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map(|b| b.with_root_certificates(rustls::RootCertStore::empty()).with_no_client_auth())
        .unwrap_or_else(|_| unreachable!("ring supports the default protocol versions"))
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
            Outgoing::Passthrough(..) | Outgoing::Health(_) => self.traces.as_ref(),
            Outgoing::PassthroughMetrics(..) | Outgoing::OwnMetrics(_) => self.metrics.as_ref(),
            Outgoing::Logs(_) | Outgoing::PassthroughLogs(..) => self.logs.as_ref(),
        }
    }
}

/// Start the workers on `rx`. They end when every sender is dropped and the queue is drained.
pub fn spawn(
    s: SenderSettings,
    rx: mpsc::Receiver<Outgoing>,
    meters: HealthMeters,
) -> Result<Vec<tokio::task::JoinHandle<()>>, ExportError> {
    let route = |t: &Option<Target>| t.as_ref().map(Route::new).transpose();
    let routes = Arc::new(Routes { traces: route(&s.targets.traces)?, metrics: route(&s.targets.metrics)?, logs: route(&s.targets.logs)? });
    for r in [&routes.traces, &routes.metrics, &routes.logs].into_iter().flatten() {
        tracing::info!(url = %r.target.url, protocol = r.target.protocol.as_str(), tls = r.target.tls.is_some(), compression = ?r.target.compression, "OTLP exporter target");
    }
    let rx = Arc::new(Mutex::new(rx));
    let mut handles = Vec::new();
    for _ in 0..s.workers.max(1) {
        let rx = rx.clone();
        let routes = routes.clone();
        let retry = s.retry.clone();
        let meters = meters.clone();
        handles.push(tokio::spawn(async move {
            loop {
                let next = rx.lock().await.recv().await;
                let Some(mut item) = next else { break };
                let signal = item.signal();
                let (kind, items) = item.items();
                let Some(route) = routes.for_item(&item) else {
                    meters.export_failed(signal, "none", kind, items);
                    continue;
                };
                let encoded = encode(&item, route.target.protocol, route.target.compression);
                // From here the decoded request is freed and its encoding is what is held until
                // it is sent or given up on: the reservation follows (set, not checked: the bytes
                // exist already, refusing them would free nothing).
                let mut held = item.take_reservation();
                drop(item);
                if let (Some(h), Ok((b, _))) = (held.as_mut(), &encoded) {
                    h.set(b.len() as u64);
                }
                let (bytes, encoding) = match encoded {
                    Ok(b) => b,
                    Err(e) => {
                        tracing::warn!(signal, error = %e, "cannot encode an export request; dropped");
                        meters.export_failed(signal, route.transport(), kind, items);
                        continue;
                    }
                };
                match send_with_retry(route, &retry, bytes, encoding, kind).await {
                    Ok(rejected) => {
                        meters.export_sent(signal, route.transport(), kind, items.saturating_sub(rejected));
                        if rejected > 0 {
                            meters.export_failed_items(signal, route.transport(), kind, rejected);
                        }
                    }
                    Err(why) => {
                        tracing::warn!(signal, url = %route.target.url, error = %why, "export upstream failed; request dropped");
                        meters.export_failed(signal, route.transport(), kind, items);
                    }
                }
            }
        }));
    }
    Ok(handles)
}

/// Encode once for the target's protocol and compress; the `Content-Encoding` / `grpc-encoding`
/// name rides along (gRPC compresses in tonic, per message, so its bytes stay uncompressed here).
fn encode(item: &Outgoing, protocol: Protocol, compression: Compression) -> Result<(Bytes, Option<&'static str>), std::io::Error> {
    let raw = match (item, protocol) {
        (Outgoing::Passthrough(r, _) | Outgoing::Health(r), Protocol::HttpJson) => serde_json::to_vec(r)?,
        (Outgoing::Logs(r) | Outgoing::PassthroughLogs(r, _), Protocol::HttpJson) => serde_json::to_vec(r)?,
        (Outgoing::PassthroughMetrics(r, _) | Outgoing::OwnMetrics(r), Protocol::HttpJson) => serde_json::to_vec(r)?,
        (Outgoing::Passthrough(r, _) | Outgoing::Health(r), _) => r.encode_to_vec(),
        (Outgoing::Logs(r) | Outgoing::PassthroughLogs(r, _), _) => r.encode_to_vec(),
        (Outgoing::PassthroughMetrics(r, _) | Outgoing::OwnMetrics(r), _) => r.encode_to_vec(),
    };
    if protocol == Protocol::Grpc {
        return Ok((Bytes::from(raw), None));
    }
    Ok(match compression {
        Compression::None => (Bytes::from(raw), None),
        Compression::Gzip => {
            let mut e = flate2::write::GzEncoder::new(Vec::with_capacity(raw.len() / 4), flate2::Compression::default());
            e.write_all(&raw)?;
            (Bytes::from(e.finish()?), Some("gzip"))
        }
        Compression::Zstd => (Bytes::from(zstd::bulk::compress(&raw, 3)?), Some("zstd")),
    })
}

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
pub fn jittered(interval: Duration, factor: f64, r: f64) -> Duration {
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
/// a partial success.
async fn send_with_retry(
    route: &Route,
    retry: &RetryOnFailure,
    bytes: Bytes,
    encoding: Option<&'static str>,
    kind: ItemKind,
) -> Result<u64, String> {
    let started = Instant::now();
    let mut backoff = retry.initial_interval;
    loop {
        let sent = match &route.transport {
            Transport::Grpc(ch) => send_grpc(ch, &route.target, bytes.clone(), kind).await,
            Transport::Http(h) => h.send(bytes.clone(), encoding).await.map(|body| http_rejected(kind, &body)),
        };
        match sent {
            Ok(rejected) => return Ok(rejected),
            Err(Failure::Permanent(why)) => return Err(why),
            Err(Failure::Retryable(hint, why)) => {
                if !retry.enabled {
                    return Err(why);
                }
                // A delay the server asked for (RetryInfo, Retry-After) is kept; our own backoff is jittered.
                let wait = hint.unwrap_or_else(|| jittered(backoff, retry.randomization_factor, unit_random())).min(retry.max_interval);
                if started.elapsed() + wait > retry.max_elapsed_time {
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

/// A codec that sends bytes already encoded as an OTLP export request and decodes the generated
/// response type `R`. Public for the load generator, which sends pre-encoded batches.
pub struct PreEncoded<R = ExportTraceServiceResponse>(std::marker::PhantomData<fn() -> R>);

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
pub struct BytesEncoder;

impl Encoder for BytesEncoder {
    type Item = Bytes;
    type Error = Status;
    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

/// Decodes a generated response message.
pub struct ResponseDecoder<R>(std::marker::PhantomData<fn() -> R>);

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
