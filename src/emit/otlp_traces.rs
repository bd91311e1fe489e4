//! The OTLP/gRPC trace sender: pass-through spans and health spans go upstream through one bounded
//! queue and a few workers.
//!
//! Each request is encoded once into bytes; retries resend those bytes (a refcount, not a deep
//! copy). The queue is what makes a down backend visible: receivers reserve a place in it before
//! they accept a request, so when it is full senders get a retryable refusal and keep their data.
//! Health spans never block: when the queue is full they are dropped and counted.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes};
use opentelemetry::KeyValue;
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
}

impl Outgoing {
    fn signal(&self) -> &'static str {
        match self {
            Outgoing::Passthrough(_) => "passthrough",
            Outgoing::Health(_) => "health_spans",
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
                let bytes = match &item {
                    Outgoing::Passthrough(r) | Outgoing::Health(r) => Bytes::from(r.encode_to_vec()),
                };
                drop(item);
                match send_with_retry(&channel, &s, bytes).await {
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

async fn send_with_retry(channel: &Channel, s: &TraceSenderSettings, bytes: Bytes) -> Result<(), Status> {
    let started = Instant::now();
    let mut backoff = s.retry.initial_interval;
    loop {
        match send_once(channel, s, bytes.clone()).await {
            Ok(()) => return Ok(()),
            Err(st) => {
                let Some(hint) = retryable(&st).filter(|_| s.retry.enabled) else { return Err(st) };
                let wait = hint.unwrap_or(backoff).min(s.retry.max_interval);
                if started.elapsed() + wait > s.retry.max_elapsed_time {
                    return Err(st);
                }
                tracing::debug!(code = ?st.code(), ?wait, "export upstream failed; retrying");
                tokio::time::sleep(wait).await;
                backoff = (backoff * 2).min(s.retry.max_interval);
            }
        }
    }
}

async fn send_once(channel: &Channel, s: &TraceSenderSettings, bytes: Bytes) -> Result<(), Status> {
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
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/opentelemetry.proto.collector.trace.v1.TraceService/Export");
    let resp: tonic::Response<ExportTraceServiceResponse> = grpc.unary(req, path, PreEncoded).await?;
    if let Some(ps) = resp.get_ref().partial_success.as_ref().filter(|p| p.rejected_spans > 0) {
        tracing::warn!(rejected = ps.rejected_spans, "upstream rejected some spans");
    }
    Ok(())
}

/// A codec that sends bytes already encoded as an `ExportTraceServiceRequest` and decodes the
/// generated response type. Public for the load generator, which sends pre-encoded batches.
#[derive(Clone, Copy, Default)]
pub struct PreEncoded;

impl Codec for PreEncoded {
    type Encode = Bytes;
    type Decode = ExportTraceServiceResponse;
    type Encoder = PreEncoded;
    type Decoder = ResponseDecoder;
    fn encoder(&mut self) -> Self::Encoder {
        PreEncoded
    }
    fn decoder(&mut self) -> Self::Decoder {
        ResponseDecoder
    }
}

impl Encoder for PreEncoded {
    type Item = Bytes;
    type Error = Status;
    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

#[derive(Clone, Copy, Default)]
pub struct ResponseDecoder;

impl Decoder for ResponseDecoder {
    type Item = ExportTraceServiceResponse;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Status> {
        let b = src.copy_to_bytes(src.remaining());
        ExportTraceServiceResponse::decode(b).map(Some).map_err(|e| Status::internal(format!("bad upstream response: {e}")))
    }
}
