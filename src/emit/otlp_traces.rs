//! The OTLP/gRPC sender: pass-through spans, metrics and logs, health spans and incident logs go
//! upstream through one bounded queue and a few workers.
//!
//! Each request is encoded once into bytes; retries resend those bytes (a refcount, not a deep
//! copy). The queue is what makes a down backend visible: receivers reserve a place in it before
//! they accept a request, so when it is full senders get a retryable refusal and keep their data.
//! Health spans never block: when the queue is full they are dropped and counted.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes};
use opentelemetry::KeyValue;
use opentelemetry_proto::tonic::collector::logs::v1::{ExportLogsServiceRequest, ExportLogsServiceResponse};
use opentelemetry_proto::tonic::collector::metrics::v1::{ExportMetricsServiceRequest, ExportMetricsServiceResponse};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use prost::Message;
use tokio::sync::{mpsc, Mutex};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use super::metrics::HealthMeters;
use crate::config::RetryOnFailure;

/// What travels to the workers.
#[derive(Debug)]
pub enum Outgoing {
    /// Spans received from a client, passed on unchanged.
    Passthrough(ExportTraceServiceRequest),
    /// Health spans made by this service.
    Health(ExportTraceServiceRequest),
    /// Incident log records made by this service.
    Logs(ExportLogsServiceRequest),
    /// Metrics received from a client, passed on unchanged.
    PassthroughMetrics(ExportMetricsServiceRequest),
    /// Log records received from a client, passed on unchanged.
    PassthroughLogs(ExportLogsServiceRequest),
}

impl Outgoing {
    fn signal(&self) -> &'static str {
        match self {
            Outgoing::Passthrough(_) => "passthrough",
            Outgoing::Health(_) => "health_spans",
            Outgoing::Logs(_) => "incident_logs",
            Outgoing::PassthroughMetrics(_) => "passthrough_metrics",
            Outgoing::PassthroughLogs(_) => "passthrough_logs",
        }
    }
}

/// Why the sender could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("invalid OTLP endpoint {0:?}: {1}")]
    Endpoint(String, String),
}

/// Settings for [`spawn`].
#[derive(Clone, Debug)]
pub struct TraceSenderSettings {
    pub endpoint: String,
    pub timeout: Duration,
    pub headers: Vec<(String, String)>,
    pub gzip: bool,
    pub queue_size: usize,
    pub workers: usize,
    pub retry: RetryOnFailure,
}

/// The handles the rest of the service uses.
#[derive(Clone)]
pub struct TraceSender {
    pub queue: mpsc::Sender<Outgoing>,
}

/// Add `http://` when an endpoint is written as host:port, as the OTLP exporters accept.
pub fn endpoint_uri(e: &str) -> String {
    if e.contains("://") {
        e.to_string()
    } else {
        format!("http://{e}")
    }
}

/// Start the workers. Returns the sender and the join handles (they end when every sender is dropped
/// and the queue is drained).
pub fn spawn(s: TraceSenderSettings, meters: HealthMeters) -> Result<(TraceSender, Vec<tokio::task::JoinHandle<()>>), ExportError> {
    let uri = endpoint_uri(&s.endpoint);
    let channel = Endpoint::from_shared(uri.clone())
        .map_err(|e| ExportError::Endpoint(uri.clone(), e.to_string()))?
        .connect_timeout(s.timeout)
        .timeout(s.timeout)
        .connect_lazy();
    let (tx, rx) = mpsc::channel::<Outgoing>(s.queue_size);
    let rx = Arc::new(Mutex::new(rx));
    let mut handles = Vec::new();
    for _ in 0..s.workers.max(1) {
        let rx = rx.clone();
        let channel = channel.clone();
        let s = s.clone();
        let meters = meters.clone();
        handles.push(tokio::spawn(async move {
            loop {
                let next = rx.lock().await.recv().await;
                let Some(item) = next else { break };
                let signal = item.signal();
                let (bytes, path) = match &item {
                    Outgoing::Passthrough(r) | Outgoing::Health(r) => (Bytes::from(r.encode_to_vec()), TRACES_PATH),
                    Outgoing::Logs(r) | Outgoing::PassthroughLogs(r) => (Bytes::from(r.encode_to_vec()), LOGS_PATH),
                    Outgoing::PassthroughMetrics(r) => (Bytes::from(r.encode_to_vec()), METRICS_PATH),
                };
                drop(item);
                match send_with_retry(&channel, &s, bytes, path).await {
                    Ok(()) => meters.exporter_sent.add(1, &[KeyValue::new("signal", signal)]),
                    Err(e) => {
                        tracing::warn!(signal, code = ?e.code(), "export upstream failed; request dropped");
                        meters.exporter_dropped.add(1, &[KeyValue::new("signal", signal), KeyValue::new("reason", "send_failed")]);
                    }
                }
            }
        }));
    }
    Ok((TraceSender { queue: tx }, handles))
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

async fn send_with_retry(channel: &Channel, s: &TraceSenderSettings, bytes: Bytes, path: &'static str) -> Result<(), Status> {
    let started = Instant::now();
    let mut backoff = s.retry.initial_interval;
    loop {
        let sent = if path == LOGS_PATH {
            send_once::<ExportLogsServiceResponse>(channel, s, bytes.clone(), path).await.map(|r| {
                if let Some(ps) = r.partial_success.as_ref().filter(|p| p.rejected_log_records > 0) {
                    tracing::warn!(rejected = ps.rejected_log_records, "upstream rejected some log records");
                }
            })
        } else if path == METRICS_PATH {
            send_once::<ExportMetricsServiceResponse>(channel, s, bytes.clone(), path).await.map(|r| {
                if let Some(ps) = r.partial_success.as_ref().filter(|p| p.rejected_data_points > 0) {
                    tracing::warn!(rejected = ps.rejected_data_points, "upstream rejected some metric data points");
                }
            })
        } else {
            send_once::<ExportTraceServiceResponse>(channel, s, bytes.clone(), path).await.map(|r| {
                if let Some(ps) = r.partial_success.as_ref().filter(|p| p.rejected_spans > 0) {
                    tracing::warn!(rejected = ps.rejected_spans, "upstream rejected some spans");
                }
            })
        };
        match sent {
            Ok(()) => return Ok(()),
            Err(st) => {
                let Some(hint) = retryable(&st).filter(|_| s.retry.enabled) else { return Err(st) };
                // A delay the server asked for (RetryInfo) is kept; our own backoff is jittered.
                let wait = hint.unwrap_or_else(|| jittered(backoff, s.retry.randomization_factor, unit_random())).min(s.retry.max_interval);
                if started.elapsed() + wait > s.retry.max_elapsed_time {
                    return Err(st);
                }
                tracing::debug!(code = ?st.code(), ?wait, "export upstream failed; retrying");
                tokio::time::sleep(wait).await;
                backoff = backoff.mul_f64(s.retry.multiplier.max(1.0)).min(s.retry.max_interval);
            }
        }
    }
}

async fn send_once<R: Message + Default + Send + 'static>(
    channel: &Channel,
    s: &TraceSenderSettings,
    bytes: Bytes,
    path: &'static str,
) -> Result<R, Status> {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    if s.gzip {
        grpc = grpc.send_compressed(tonic::codec::CompressionEncoding::Gzip);
    }
    grpc.ready().await.map_err(|e| Status::unavailable(format!("upstream not ready: {e}")))?;
    let mut req = tonic::Request::new(bytes);
    for (k, v) in &s.headers {
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
