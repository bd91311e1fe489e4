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

/// The generated service's implementation.
pub struct OtlpTraceService {
    admission: Admission,
}

#[tonic::async_trait]
impl TraceService for OtlpTraceService {
    async fn export(&self, request: Request<ExportTraceServiceRequest>) -> Result<Response<ExportTraceServiceResponse>, Status> {
        match self.admission.admit(request.into_inner(), "grpc") {
            Admitted::Accepted { rejected, message } => Ok(Response::new(ExportTraceServiceResponse {
                partial_success: (rejected > 0)
                    .then_some(ExportTracePartialSuccess { rejected_spans: rejected as i64, error_message: message }),
            })),
            Admitted::Busy => Err(busy()),
        }
    }
}

/// UNAVAILABLE is retryable for every OTLP client.
fn busy() -> Status {
    Status::unavailable("mcp-health is at capacity; retry with backoff")
}

#[tonic::async_trait]
impl MetricsService for OtlpTraceService {
    async fn export(&self, request: Request<ExportMetricsServiceRequest>) -> Result<Response<ExportMetricsServiceResponse>, Status> {
        match self.admission.admit_metrics(request.into_inner(), "grpc") {
            Admitted::Accepted { .. } => Ok(Response::new(ExportMetricsServiceResponse { partial_success: None })),
            Admitted::Busy => Err(busy()),
        }
    }
}

#[tonic::async_trait]
impl LogsService for OtlpTraceService {
    async fn export(&self, request: Request<ExportLogsServiceRequest>) -> Result<Response<ExportLogsServiceResponse>, Status> {
        match self.admission.admit_logs(request.into_inner(), "grpc") {
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
    tonic::transport::Server::builder()
        .layer(super::listen::TrackLayer)
        .layer(tower::layer::layer_fn(move |inner| OtlpStatus { inner, admission: admission.clone() }))
        .add_service(traces)
        .add_service(metrics)
        .add_service(logs)
        .serve_with_incoming_shutdown(listener.incoming(), shutdown)
        .await
}

/// See the module docs.
#[derive(Clone)]
pub struct OtlpStatus<S> {
    inner: S,
    admission: Admission,
}

impl<S, B, RB> tower::Service<http::Request<B>> for OtlpStatus<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>> + Send,
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

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
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
        let fut = self.inner.call(req);
        let admission = self.admission.clone();
        Box::pin(async move {
            let mut resp = fut.await?;
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

/// Bind a listener, with a message that names the address on failure.
pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await.map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))
}
