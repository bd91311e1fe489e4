//! OTLP/gRPC receiver: `TraceService`, `MetricsService` and `LogsService` `Export`, on tonic's
//! server with a codec that yields the request's bytes, not a decoded message.
//!
//! [`ReadMessage`] (a tower layer in front of the three services) reads each request's body
//! itself: it refuses before reading when the service is at its memory limit or the correlator's
//! queue is full, reserves the body's memory under `processors.memory_limiter` before it holds
//! it, checks the message against `max_recv_msg_size` from the length in its frame header, and
//! decompresses gzip or zstd (so the decompressed size is the one limited and reserved). The
//! message's bytes go to the service through the request's extensions; tonic sees an empty frame.
//! Spans are then read by the walk over those bytes (`normalize::wire`) and passed on as they came
//! (`Admission::admit_wire`); metrics and logs are decoded (they are only passed on).
//!
//! Every refusal's gRPC status follows from its error's type ([`ReadError::status`],
//! [`WireError`]): INVALID_ARGUMENT for undecodable input and RESOURCE_EXHAUSTED without
//! RetryInfo for an oversize message (both permanent for an OTLP client), RESOURCE_EXHAUSTED with
//! RetryInfo for a busy service (retryable, on the same instance: [`busy_status`]). tonic's own decoding, which reports undecodable input as INTERNAL and an
//! oversize message as OUT_OF_RANGE (both retried by OTLP clients), never runs.

use std::convert::Infallible;
use std::future::Future;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use opentelemetry_proto::tonic::collector::logs::v1::{ExportLogsServiceRequest, ExportLogsServiceResponse};
use opentelemetry_proto::tonic::collector::metrics::v1::{ExportMetricsServiceRequest, ExportMetricsServiceResponse};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTracePartialSuccess, ExportTraceServiceResponse};
use prost::Message;
use tonic::codec::{Codec, CompressionEncoding, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http;
use tonic::server::NamedService;
use tonic::{Request, Response, Status};

use super::admit::{Admission, Admitted, Durable};
use crate::flow::memory::{MemoryLimiter, Reservation};
use crate::normalize::wire::WireError;
use crate::telemetry::labels::{self, RefusalReason, Transport};

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

fn busy() -> Status {
    busy_status("mcp-health is at capacity; retry with backoff")
}

/// The message of one request, read by [`ReadMessage`], with the memory it holds.
#[derive(Clone)]
struct RawMessage(Arc<Mutex<Option<Read>>>);

/// A message read, and its memory reservation.
type Read = (Bytes, Option<Reservation>);

impl RawMessage {
    fn take<T>(req: &mut Request<T>) -> Option<Read> {
        let slot = req.extensions_mut().remove::<RawMessage>()?;
        let mut r = slot.0.lock().unwrap_or_else(|p| p.into_inner());
        r.take()
    }
}

/// The three signals, each one `Export` RPC.
trait Signal: Send + Sync + 'static {
    const SERVICE: &'static str;
    const PATH: &'static str;
    const LABEL: labels::Signal;
    type Response: Message + Default + Send + 'static;
    /// The answer, and what it waits for (the evidence journal) before it is given.
    fn export(admission: &Admission, message: Bytes, held: Option<Reservation>) -> Result<(Self::Response, Option<Durable>), Status>;
}

struct Traces;
struct Metrics;
struct Logs;

fn undecodable(admission: &Admission, signal: labels::Signal, what: &str, e: impl std::fmt::Display) -> Status {
    admission.refused_signal(signal, Transport::Grpc, RefusalReason::Undecodable);
    Status::invalid_argument(format!("the message is not an {what}: {e}"))
}

impl Signal for Traces {
    const SERVICE: &'static str = "opentelemetry.proto.collector.trace.v1.TraceService";
    const PATH: &'static str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";
    const LABEL: labels::Signal = labels::Signal::Traces;
    type Response = ExportTraceServiceResponse;
    fn export(admission: &Admission, message: Bytes, held: Option<Reservation>) -> Result<(Self::Response, Option<Durable>), Status> {
        match admission.admit_wire(message, Transport::Grpc, held) {
            Ok(Admitted::Accepted { rejected, message, durable }) => Ok((
                ExportTraceServiceResponse {
                    partial_success: (rejected > 0)
                        .then_some(ExportTracePartialSuccess { rejected_spans: rejected as i64, error_message: message }),
                },
                durable,
            )),
            Ok(Admitted::Busy(_)) => Err(busy()),
            Err(e @ WireError::Truncated)
            | Err(e @ WireError::Varint)
            | Err(e @ WireError::Key)
            | Err(e @ WireError::WireType { .. })
            | Err(e @ WireError::Utf8)
            | Err(e @ WireError::TooDeep)
            | Err(e @ WireError::Group) => Err(undecodable(admission, Self::LABEL, "ExportTraceServiceRequest", e)),
        }
    }
}

impl Signal for Metrics {
    const SERVICE: &'static str = "opentelemetry.proto.collector.metrics.v1.MetricsService";
    const PATH: &'static str = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export";
    const LABEL: labels::Signal = labels::Signal::Metrics;
    type Response = ExportMetricsServiceResponse;
    fn export(admission: &Admission, message: Bytes, held: Option<Reservation>) -> Result<(Self::Response, Option<Durable>), Status> {
        let req = ExportMetricsServiceRequest::decode(message)
            .map_err(|e| undecodable(admission, Self::LABEL, "ExportMetricsServiceRequest", e))?;
        match admission.admit_metrics(req, Transport::Grpc, held) {
            Admitted::Accepted { .. } => Ok((ExportMetricsServiceResponse { partial_success: None }, None)),
            Admitted::Busy(_) => Err(busy()),
        }
    }
}

impl Signal for Logs {
    const SERVICE: &'static str = "opentelemetry.proto.collector.logs.v1.LogsService";
    const PATH: &'static str = "/opentelemetry.proto.collector.logs.v1.LogsService/Export";
    const LABEL: labels::Signal = labels::Signal::Logs;
    type Response = ExportLogsServiceResponse;
    fn export(admission: &Admission, message: Bytes, held: Option<Reservation>) -> Result<(Self::Response, Option<Durable>), Status> {
        let req =
            ExportLogsServiceRequest::decode(message).map_err(|e| undecodable(admission, Self::LABEL, "ExportLogsServiceRequest", e))?;
        match admission.admit_logs(req, Transport::Grpc, held) {
            Admitted::Accepted { .. } => Ok((ExportLogsServiceResponse { partial_success: None }, None)),
            Admitted::Busy(_) => Err(busy()),
        }
    }
}

/// One signal's gRPC service (the generated server's shape: one `Export` method).
struct ExportService<S> {
    admission: Admission,
    /// The bearer token every request must carry (`auth.bearer_token`), if any.
    token: Option<Arc<str>>,
    _signal: PhantomData<fn() -> S>,
}

impl<S> Clone for ExportService<S> {
    fn clone(&self) -> Self {
        ExportService { admission: self.admission.clone(), token: self.token.clone(), _signal: PhantomData }
    }
}

impl<S: Signal> NamedService for ExportService<S> {
    const NAME: &'static str = S::SERVICE;
}

impl<S: Signal> tower::Service<http::Request<tonic::body::Body>> for ExportService<S> {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        if req.uri().path() != S::PATH {
            return Box::pin(async { Ok(Status::unimplemented("only Export is served").into_http()) });
        }
        if let Some(t) = &self.token {
            if !super::bearer_matches(req.headers().get("authorization").map(|v| v.as_bytes()), t) {
                self.admission.refused_signal(S::LABEL, Transport::Grpc, RefusalReason::Unauthenticated);
                return Box::pin(async { Ok(Status::unauthenticated("a bearer token is required").into_http()) });
            }
        }
        let admission = self.admission.clone();
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(EmptyCodec::<S::Response>(PhantomData))
                .accept_compressed(CompressionEncoding::Gzip)
                .accept_compressed(CompressionEncoding::Zstd)
                .send_compressed(CompressionEncoding::Gzip);
            Ok(grpc.unary(Unary::<S> { admission, _signal: PhantomData }, req).await)
        })
    }
}

struct Unary<S> {
    admission: Admission,
    _signal: PhantomData<fn() -> S>,
}

impl<S: Signal> tonic::server::UnaryService<()> for Unary<S> {
    type Response = S::Response;
    type Future = Pin<Box<dyn Future<Output = Result<Response<S::Response>, Status>> + Send>>;

    fn call(&mut self, mut request: Request<()>) -> Self::Future {
        let out = match RawMessage::take(&mut request) {
            Some((message, held)) => S::export(&self.admission, message, held),
            None => Err(Status::internal("the request was not read")),
        };
        Box::pin(async move {
            let (response, durable) = out?;
            if let Some(d) = durable {
                // Not written to the evidence journal: retryable, as a busy service is.
                d.settle().await.map_err(|_| busy())?;
            }
            Ok(Response::new(response))
        })
    }
}

/// The codec of the services: the request message was taken out by [`ReadMessage`] (tonic gets
/// an empty frame, decoded as `()`); responses are the generated messages.
struct EmptyCodec<R>(PhantomData<fn() -> R>);

impl<R: Message + Default + Send + 'static> Codec for EmptyCodec<R> {
    type Encode = R;
    type Decode = ();
    type Encoder = ResponseEncoder<R>;
    type Decoder = EmptyDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        ResponseEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        EmptyDecoder
    }
}

struct ResponseEncoder<R>(PhantomData<fn() -> R>);

impl<R: Message> Encoder for ResponseEncoder<R> {
    type Item = R;
    type Error = Status;

    fn encode(&mut self, item: R, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(dst).map_err(|e| Status::internal(e.to_string()))
    }
}

struct EmptyDecoder;

impl Decoder for EmptyDecoder {
    type Item = ();
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<()>, Status> {
        src.advance(src.remaining());
        Ok(Some(()))
    }
}

/// The largest HTTP/2 DATA frame this server announces it takes (SETTINGS_MAX_FRAME_SIZE).
/// HTTP/2's default, 16 KiB, cuts a 200 KB export into a dozen frames, each one read, flow-
/// controlled and copied on its own; clients that honour the setting (tonic, hyper) send a
/// typical export as one frame. Memory is still bounded by the stream and connection windows
/// (1 MiB each, hyper's defaults) and by `max_recv_msg_size`.
const MAX_FRAME_BYTES: u32 = 1 << 20;

/// Serve OTLP/gRPC on `listener` (its limits, timeouts and TLS: `super::listen`) until
/// `shutdown` resolves.
pub(crate) async fn serve(
    listener: super::listen::Listener,
    admission: Admission,
    max_message_bytes: usize,
    token: Option<Arc<str>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    let traces = ExportService::<Traces> { admission: admission.clone(), token: token.clone(), _signal: PhantomData };
    let metrics = ExportService::<Metrics> { admission: admission.clone(), token: token.clone(), _signal: PhantomData };
    let logs = ExportService::<Logs> { admission: admission.clone(), token, _signal: PhantomData };
    let (incoming, accepting) = listener.incoming();
    let r = tonic::transport::Server::builder()
        .max_frame_size(MAX_FRAME_BYTES)
        .layer(super::listen::TrackLayer)
        .layer(tower::layer::layer_fn(move |inner| ReadMessage { inner, admission: admission.clone(), max_message_bytes }))
        .add_service(traces)
        .add_service(metrics)
        .add_service(logs)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await;
    // The port is free when this returns (see `Listener::incoming`).
    let _ = accepting.await;
    r
}

/// Why a request was refused before it reached a service; its type picks the gRPC status.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadError {
    #[error("mcp-health is at its memory limit; retry with backoff")]
    MemoryLimit,
    #[error("the message exceeds the size limit of {0} bytes")]
    TooLarge(usize),
    #[error("{0}")]
    Undecodable(String),
    #[error("grpc-encoding {0:?} is not supported (use gzip, zstd or none)")]
    UnsupportedEncoding(String),
    #[error("reading the request: {0}")]
    Body(String),
}

impl ReadError {
    /// The OTLP answer: retryable (RESOURCE_EXHAUSTED with RetryInfo, see [`busy_status`]) only
    /// for memory.
    pub(crate) fn status(&self) -> Status {
        let m = self.to_string();
        match self {
            ReadError::MemoryLimit => busy_status(&m),
            ReadError::TooLarge(_) => Status::resource_exhausted(m),
            ReadError::Undecodable(_) => Status::invalid_argument(m),
            ReadError::UnsupportedEncoding(_) => Status::unimplemented(m),
            ReadError::Body(_) => Status::cancelled(m),
        }
    }

    /// The `reason` label it is counted under (`Body`: the client went away, not counted).
    pub(crate) fn reason(&self) -> Option<RefusalReason> {
        match self {
            ReadError::MemoryLimit => Some(RefusalReason::MemoryLimit),
            ReadError::TooLarge(_) => Some(RefusalReason::TooLarge),
            ReadError::Undecodable(_) => Some(RefusalReason::Undecodable),
            ReadError::UnsupportedEncoding(_) => Some(RefusalReason::UnsupportedEncoding),
            ReadError::Body(_) => None,
        }
    }
}

/// See the module docs.
#[derive(Clone)]
pub(crate) struct ReadMessage<S> {
    inner: S,
    admission: Admission,
    max_message_bytes: usize,
}

impl<S, RB> tower::Service<http::Request<tonic::body::Body>> for ReadMessage<S>
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
        let signal = if path == Metrics::PATH {
            Metrics::LABEL
        } else if path == Logs::PATH {
            Logs::LABEL
        } else {
            Traces::LABEL
        };
        // Above the memory limit, refuse before the request is read: reading what is refused is
        // what drives memory up under overload.
        if self.admission.over_memory() {
            self.admission.refused_signal(signal, Transport::Grpc, RefusalReason::MemoryLimit);
            let resp = busy().into_http::<RB>();
            return Box::pin(async move { Ok(resp) });
        }
        // A queue it needs is full: refuse before reading and walking it (retryable).
        if let Some(reason) = self.admission.full_before_decode(signal) {
            self.admission.refused_signal(signal, Transport::Grpc, reason);
            let resp = busy().into_http::<RB>();
            return Box::pin(async move { Ok(resp) });
        }
        // The service that was made ready answers this request; a clone takes its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let admission = self.admission.clone();
        let max_message = self.max_message_bytes;
        Box::pin(async move {
            // Metrics and logs are decoded: their peak is the decoded request. Spans are walked:
            // their peak is the message and the batch read from it (about its size again;
            // twice, for the allocator's size classes), alive together before
            // `Admission::admit_wire` trims the reservation. With pass-through, the request
            // passed on is the message itself (`via` spliced in place, in the room left after
            // it); a request that must be copied or rebuilt grows its reservation first.
            let peak_per_byte = match signal == Traces::LABEL {
                true => 2,
                false => crate::flow::memory::DECODED_PER_WIRE_BYTE,
            };
            match read_message(admission.memory.as_ref(), req, max_message, peak_per_byte).await {
                Ok(req) => inner.call(req).await,
                Err(e) => {
                    if let Some(reason) = e.reason() {
                        admission.refused_signal(signal, Transport::Grpc, reason);
                    }
                    Ok(e.status().into_http::<RB>())
                }
            }
        })
    }
}

/// The gRPC frame header: a compressed flag and a 4-byte big-endian length.
const FRAME_HEADER: usize = 5;

/// Read a unary request's one message: within `max_message` (from its frame header, before the
/// rest is held), decompressed (within `max_message` too), and under `processors.memory_limiter`
/// reserved step by step before it is held — the body as it arrives, then the decompressed
/// message; [`Admission::admit_wire`] trims the reservation to what the request really holds.
/// A step that does not fit is refused before it allocates, so concurrent large requests cannot
/// pass the limit between two samples of the resident set.
async fn read_message(
    memory: Option<&Arc<MemoryLimiter>>,
    req: http::Request<tonic::body::Body>,
    max_message: usize,
    peak_per_byte: u64,
) -> Result<http::Request<tonic::body::Body>, ReadError> {
    use http_body_util::BodyExt;
    let mut held = match memory {
        Some(m) => Some(m.reserve(0).ok_or(ReadError::MemoryLimit)?),
        None => None,
    };
    let (mut parts, mut body) = req.into_parts();
    let mut buf = bytes::BytesMut::new();
    let mut declared: Option<usize> = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ReadError::Body(e.to_string()))?;
        let Ok(data) = frame.into_data() else { continue };
        if declared.is_none() && buf.len() + data.len() >= FRAME_HEADER {
            let mut header = [0u8; FRAME_HEADER];
            let have = buf.len().min(FRAME_HEADER);
            header[..have].copy_from_slice(&buf[..have]);
            header[have..].copy_from_slice(&data[..FRAME_HEADER - have]);
            let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
            if len > max_message {
                return Err(ReadError::TooLarge(max_message));
            }
            declared = Some(len);
        }
        // The whole message is reserved and allocated at once from the length in its frame
        // header (growing the buffer by doubling would hold up to twice what is reserved).
        let want = match declared {
            Some(len) => (FRAME_HEADER + len).max(buf.len() + data.len()),
            None => buf.len() + data.len(),
        };
        if want > FRAME_HEADER + max_message {
            return Err(ReadError::Undecodable("a unary export carries one message".into()));
        }
        if let Some(h) = held.as_mut() {
            if want as u64 > h.bytes() && !h.resize(want as u64) {
                return Err(ReadError::MemoryLimit);
            }
        }
        if buf.capacity() < want {
            // Room for `mcp_health.via` after the message, so pass-through splices it in place
            // (`wire::splice_via_in_place`) instead of copying the request.
            let room = if declared.is_some() { crate::normalize::wire::VIA_HEADROOM } else { 0 };
            buf.reserve((want + room).saturating_sub(buf.len()));
        }
        buf.extend_from_slice(&data);
    }
    let Some(len) = declared else {
        return Err(ReadError::Undecodable("the request carries no message".into()));
    };
    if buf.len() != FRAME_HEADER + len {
        return Err(ReadError::Undecodable("a unary export carries exactly one whole message".into()));
    }
    let compressed = buf[0] != 0;
    let mut message = buf.freeze().slice(FRAME_HEADER..);
    let encoding = parts.headers.remove("grpc-encoding").and_then(|v| v.to_str().ok().map(str::to_ascii_lowercase));
    if compressed {
        let enc = match encoding.as_deref() {
            Some(e @ ("gzip" | "zstd")) => e.to_string(),
            Some(other) => return Err(ReadError::UnsupportedEncoding(other.to_string())),
            None => return Err(ReadError::Undecodable("a compressed message without grpc-encoding".into())),
        };
        if let Some(h) = held.as_mut() {
            if !h.resize((message.len() + max_message) as u64) {
                return Err(ReadError::MemoryLimit);
            }
        }
        message = match super::otlp_http::decompress(&enc, message, max_message) {
            Some(Ok(m)) => m,
            Some(Err(super::otlp_http::DecompressError::TooLarge)) => return Err(ReadError::TooLarge(max_message)),
            Some(Err(super::otlp_http::DecompressError::Corrupt(e))) => {
                return Err(ReadError::Undecodable(format!("{enc} message could not be decompressed: {e}")))
            }
            None => return Err(ReadError::UnsupportedEncoding(enc)),
        };
    }
    if let Some(h) = held.as_mut() {
        // The message, and (read uncompressed) the room left after it for `via`.
        let room = if compressed { 0 } else { crate::normalize::wire::VIA_HEADROOM as u64 };
        let len = message.len() as u64;
        h.set(len + room);
        if !h.resize((len + room).saturating_add(len.saturating_mul(peak_per_byte))) {
            return Err(ReadError::MemoryLimit);
        }
    }
    parts.extensions.insert(RawMessage(Arc::new(Mutex::new(Some((message, held))))));
    let empty = Bytes::from_static(&[0, 0, 0, 0, 0]);
    Ok(http::Request::from_parts(parts, tonic::body::Body::new(http_body_util::Full::new(empty))))
}

/// Bind a listener, with a message that names the address on failure.
pub(crate) async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await.map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))
}
