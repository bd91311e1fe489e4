//! OTLP/gRPC receiver on `opentelemetry-proto`'s generated `TraceService`, `MetricsService` and
//! `LogsService` (metrics and logs are passed on, not read). Requests may be gzip or zstd.
//!
//! tonic's prost codec reports undecodable input as INTERNAL and an oversize message as
//! OUT_OF_RANGE, which OTLP clients treat as "retry" — a malformed or oversize request would be
//! resent forever. [`OtlpStatusLayer`] rewrites them to the OTLP-specified answers (INVALID_ARGUMENT,
//! and RESOURCE_EXHAUSTED without RetryInfo, both permanent) and counts them as refused.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use opentelemetry_proto::tonic::collector::logs::v1::logs_service_server::{LogsService, LogsServiceServer};
use opentelemetry_proto::tonic::collector::logs::v1::{ExportLogsServiceRequest, ExportLogsServiceResponse};
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{MetricsService, MetricsServiceServer};
use opentelemetry_proto::tonic::collector::metrics::v1::{ExportMetricsServiceRequest, ExportMetricsServiceResponse};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTracePartialSuccess, ExportTraceServiceRequest, ExportTraceServiceResponse};
use tonic::codec::CompressionEncoding;
use tonic::codegen::http;
use tonic::{Request, Response, Status};

use super::admit::{Admission, Admitted};
use super::memory::{self, MemoryLimiter, Reservation};

/// The generated service's implementation.
pub struct OtlpTraceService {
    admission: Admission,
}

#[tonic::async_trait]
impl TraceService for OtlpTraceService {
    async fn export(&self, mut request: Request<ExportTraceServiceRequest>) -> Result<Response<ExportTraceServiceResponse>, Status> {
        let held = HeldSlot::take(&mut request);
        match self.admission.admit(request.into_inner(), "grpc", held) {
            Admitted::Accepted { rejected, message } => Ok(Response::new(ExportTraceServiceResponse {
                partial_success: (rejected > 0)
                    .then_some(ExportTracePartialSuccess { rejected_spans: rejected as i64, error_message: message }),
            })),
            Admitted::Busy => Err(busy()),
        }
    }
}

/// How long a client told "busy" is asked to wait before it tries again (RetryInfo).
const BUSY_RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// "Busy, retry here": RESOURCE_EXHAUSTED with RetryInfo. OTLP clients retry it after the delay
/// (the specification makes RESOURCE_EXHAUSTED retryable exactly when RetryInfo says recovery is
/// possible), and the collector's `load_balancing` exporter does not count it against the
/// endpoint: UNAVAILABLE would quarantine this instance and, with re-routing on, move its traces
/// to others — splitting the chains it holds (docs/multi-instance.md).
pub(crate) fn busy_status(message: &str) -> Status {
    use tonic_types::{ErrorDetails, StatusExt};
    Status::with_error_details(tonic::Code::ResourceExhausted, message, ErrorDetails::with_retry_info(Some(BUSY_RETRY_AFTER)))
}

/// A refusal made by [`busy_status`] (as against a message that is too large, which is
/// RESOURCE_EXHAUSTED without RetryInfo and must not be retried).
pub(crate) fn is_busy(status: &Status) -> bool {
    use tonic_types::StatusExt;
    status.code() == tonic::Code::ResourceExhausted && status.get_details_retry_info().is_some()
}

fn busy() -> Status {
    busy_status("mcp-health is at capacity; retry with backoff")
}

#[tonic::async_trait]
impl MetricsService for OtlpTraceService {
    async fn export(&self, mut request: Request<ExportMetricsServiceRequest>) -> Result<Response<ExportMetricsServiceResponse>, Status> {
        let held = HeldSlot::take(&mut request);
        match self.admission.admit_metrics(request.into_inner(), "grpc", held) {
            Admitted::Accepted { .. } => Ok(Response::new(ExportMetricsServiceResponse { partial_success: None })),
            Admitted::Busy => Err(busy()),
        }
    }
}

#[tonic::async_trait]
impl LogsService for OtlpTraceService {
    async fn export(&self, mut request: Request<ExportLogsServiceRequest>) -> Result<Response<ExportLogsServiceResponse>, Status> {
        let held = HeldSlot::take(&mut request);
        match self.admission.admit_logs(request.into_inner(), "grpc", held) {
            Admitted::Accepted { .. } => Ok(Response::new(ExportLogsServiceResponse { partial_success: None })),
            Admitted::Busy => Err(busy()),
        }
    }
}

/// Serve OTLP/gRPC on `listener` (its limits, timeouts and TLS: `super::listen`) until
/// `shutdown` resolves.
pub async fn serve(
    listener: super::listen::Listener,
    admission: Admission,
    max_message_bytes: usize,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    let traces = TraceServiceServer::new(OtlpTraceService { admission: admission.clone() })
        .accept_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Zstd)
        .send_compressed(CompressionEncoding::Gzip)
        .max_decoding_message_size(max_message_bytes);
    let metrics = MetricsServiceServer::new(OtlpTraceService { admission: admission.clone() })
        .accept_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Zstd)
        .send_compressed(CompressionEncoding::Gzip)
        .max_decoding_message_size(max_message_bytes);
    let logs = LogsServiceServer::new(OtlpTraceService { admission: admission.clone() })
        .accept_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Zstd)
        .send_compressed(CompressionEncoding::Gzip)
        .max_decoding_message_size(max_message_bytes);
    let (incoming, accepting) = listener.incoming();
    let r = tonic::transport::Server::builder()
        .layer(super::listen::TrackLayer)
        .layer(tower::layer::layer_fn(move |inner| OtlpStatus { inner, admission: admission.clone(), max_message_bytes }))
        .add_service(traces)
        .add_service(metrics)
        .add_service(logs)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await;
    // The port is free when this returns (see `Listener::incoming`).
    let _ = accepting.await;
    r
}

/// See the module docs.
#[derive(Clone)]
pub struct OtlpStatus<S> {
    inner: S,
    admission: Admission,
    max_message_bytes: usize,
}

impl<S, RB> tower::Service<http::Request<tonic::body::Body>> for OtlpStatus<S>
where
    S: tower::Service<http::Request<tonic::body::Body>, Response = http::Response<RB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    RB: Default + Send + 'static,
    S::Error: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let path = req.uri().path();
        let signal = if path.contains(".metrics.") {
            "metrics"
        } else if path.contains(".logs.") {
            "logs"
        } else {
            "traces"
        };
        // Above the memory limit, refuse before the request is read and decoded: decoding what is
        // refused is what drives memory up under overload.
        if self.admission.over_memory() {
            self.admission.refused_signal(signal, "grpc", "memory_limit");
            let resp = busy().into_http::<RB>();
            return Box::pin(async move { Ok(resp) });
        }
        // A queue it needs is full: refuse before reading and decoding it (retryable).
        if let Some(reason) = self.admission.full_before_decode(signal) {
            self.admission.refused_signal(signal, "grpc", reason);
            let resp = busy().into_http::<RB>();
            return Box::pin(async move { Ok(resp) });
        }
        // The service that was made ready answers this request; a clone takes its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let admission = self.admission.clone();
        let max_message = self.max_message_bytes;
        Box::pin(async move {
            let req = match &admission.memory {
                Some(m) => match read_reserved(m, req, max_message).await {
                    Ok(req) => req,
                    Err(status) => {
                        if is_busy(&status) {
                            admission.refused_signal(signal, "grpc", "memory_limit");
                        }
                        return Ok(status.into_http::<RB>());
                    }
                },
                None => req,
            };
            let mut resp = inner.call(req).await?;
            let h = resp.headers_mut();
            let status = h.get("grpc-status").and_then(|v| v.to_str().ok()).map(str::to_owned);
            // tonic percent-encodes grpc-message (a space is `%20`); match on the decoded text.
            let message = h.get("grpc-message").and_then(|v| v.to_str().ok()).unwrap_or("").replace("%20", " ");
            match status.as_deref() {
                // A decompressed message over the limit (a gzip or zstd bomb): RESOURCE_EXHAUSTED
                // already, without RetryInfo; only counted.
                Some("8") if message.contains("size limit") => admission.refused_signal(signal, "grpc", "too_large"),
                Some("13")
                    if message.contains("decode")
                        || message.contains("decompress")
                        || message.contains("invalid")
                        || message.contains("buffer") =>
                {
                    h.insert("grpc-status", http::HeaderValue::from_static("3"));
                    admission.refused_signal(signal, "grpc", "undecodable");
                }
                Some("11") if message.contains("too large") => {
                    h.insert("grpc-status", http::HeaderValue::from_static("8"));
                    admission.refused_signal(signal, "grpc", "too_large");
                }
                _ => {}
            }
            Ok(resp)
        })
    }
}

/// The memory reserved for a request while it was read, handed from [`OtlpStatus`] to the
/// service that decodes it (through the request's extensions, which must be `Clone`).
#[derive(Clone)]
struct HeldSlot(Arc<Mutex<Option<Reservation>>>);

impl HeldSlot {
    fn take<T>(req: &mut Request<T>) -> Option<Reservation> {
        let slot = req.extensions_mut().remove::<HeldSlot>()?;
        let mut r = slot.0.lock().unwrap_or_else(|p| p.into_inner());
        r.take()
    }
}

/// The gRPC frame header: a compressed flag and a 4-byte big-endian length.
const FRAME_HEADER: usize = 5;

/// Read a request body under `processors.memory_limiter`: every chunk is reserved before it is
/// kept, then the decompressed message (decompressed here, so its size is known and reserved),
/// then what decoding it holds at its peak ([`memory::DECODED_PER_WIRE_BYTE`]); the service
/// trims the reservation to what the decoded request really holds. A step that does not fit is
/// refused with `UNAVAILABLE` before it allocates, so concurrent large requests cannot pass the
/// limit between two samples of the resident set.
async fn read_reserved(
    m: &Arc<MemoryLimiter>,
    req: http::Request<tonic::body::Body>,
    max_message: usize,
) -> Result<http::Request<tonic::body::Body>, Status> {
    use http_body_util::BodyExt;
    let full = || busy_status("mcp-health is at its memory limit; retry with backoff");
    let mut held = m.reserve(0).ok_or_else(full)?;
    let (mut parts, mut body) = req.into_parts();
    let mut buf = bytes::BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame?;
        if let Ok(data) = frame.into_data() {
            // Reading past the largest message allowed: tonic refuses it (RESOURCE_EXHAUSTED)
            // from the length in the frame header; nothing more of it needs to be held.
            if buf.len() > max_message + FRAME_HEADER {
                continue;
            }
            // The whole message is reserved and allocated at once from the length in its frame
            // header (growing the buffer by doubling would hold up to twice what is reserved).
            let want = if buf.is_empty() && data.len() >= FRAME_HEADER {
                let len = u32::from_be_bytes([data[1], data[2], data[3], data[4]]) as usize;
                (FRAME_HEADER + len.min(max_message)).max(data.len())
            } else {
                buf.len() + data.len()
            };
            if want as u64 > held.bytes() && !held.resize(want as u64) {
                return Err(full());
            }
            buf.reserve(want.saturating_sub(buf.len()));
            buf.extend_from_slice(&data);
        }
    }
    let mut wire = buf.freeze();
    // One uncompressed or gzip/zstd message (unary export): decompress it here, so the size to
    // reserve for decoding is the real one, not the worst case.
    let encoding = parts.headers.get("grpc-encoding").and_then(|v| v.to_str().ok()).map(str::to_ascii_lowercase);
    let framed =
        wire.len() >= FRAME_HEADER && u32::from_be_bytes([wire[1], wire[2], wire[3], wire[4]]) as usize == wire.len() - FRAME_HEADER;
    if framed && wire[0] == 1 {
        if let Some(enc @ ("gzip" | "zstd")) = encoding.as_deref() {
            if !held.resize((wire.len() + max_message) as u64) {
                return Err(full());
            }
            match super::otlp_http::decompress(enc, wire.slice(FRAME_HEADER..), max_message) {
                Some(Ok(msg)) => {
                    let mut out = bytes::BytesMut::with_capacity(FRAME_HEADER + msg.len());
                    out.extend_from_slice(&[0]);
                    out.extend_from_slice(&(msg.len() as u32).to_be_bytes());
                    out.extend_from_slice(&msg);
                    drop(msg);
                    wire = out.freeze();
                    parts.headers.remove("grpc-encoding");
                }
                Some(Err(super::otlp_http::DecompressError::TooLarge)) => {
                    return Err(Status::resource_exhausted(format!("decompressed message exceeds the size limit of {max_message} bytes")))
                }
                // Left to tonic, which answers an undecodable message as such.
                _ => {}
            }
        }
    }
    let len = wire.len() as u64;
    if !held.resize(len.saturating_add(len.saturating_mul(memory::DECODED_PER_WIRE_BYTE))) {
        return Err(full());
    }
    parts.extensions.insert(HeldSlot(Arc::new(Mutex::new(Some(held)))));
    Ok(http::Request::from_parts(parts, tonic::body::Body::new(http_body_util::Full::new(wire))))
}

/// Bind a listener, with a message that names the address on failure.
pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await.map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))
}
