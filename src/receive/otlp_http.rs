//! OTLP/HTTP receiver: `POST /v1/traces`, `/v1/metrics` and `/v1/logs` (metrics and logs are
//! passed on, not read), protobuf or JSON bodies, optionally gzip, zstd or deflate.
//!
//! Answers as the OTLP specification says: 200 with a partial-success body in the request's own
//! encoding; 400 with a `google.rpc.Status` for undecodable input; 413 for a body over the limit
//! (checked after decompression too, so a small gzip or zstd bomb is refused); 415 for other media types;
//! 503 with `Retry-After` when the service sheds load.

use std::io::Read;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use opentelemetry_proto::tonic::collector::logs::v1::{ExportLogsServiceRequest, ExportLogsServiceResponse};
use opentelemetry_proto::tonic::collector::metrics::v1::{ExportMetricsServiceRequest, ExportMetricsServiceResponse};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTracePartialSuccess, ExportTraceServiceResponse};
use prost::Message;

use super::admit::{Admission, Admitted};
use super::otlp_json;
use crate::flow::memory::{self, Reservation};
use crate::telemetry::labels::{RefusalReason, Signal, Transport};

#[derive(Clone)]
struct HttpState {
    admission: Admission,
    max_body: usize,
    /// The bearer token every request must carry (`auth.bearer_token`), if any.
    token: Option<std::sync::Arc<str>>,
}

/// A request without the configured bearer token: 401, counted as `unauthenticated`.
fn unauthenticated(st: &HttpState, signal: Signal, headers: &HeaderMap) -> Option<Response> {
    let t = st.token.as_deref()?;
    if super::bearer_matches(headers.get(header::AUTHORIZATION).map(|v| v.as_bytes()), t) {
        return None;
    }
    Some(refuse(st, signal, Encoding::Protobuf, RefusalReason::Unauthenticated, "a bearer token is required"))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Encoding {
    Protobuf,
    Json,
}

/// The `/v1/traces`, `/v1/metrics` and `/v1/logs` router.
pub(crate) fn router(admission: Admission, max_body: usize, token: Option<std::sync::Arc<str>>) -> Router {
    Router::new()
        .route("/v1/traces", post(traces))
        .route("/v1/metrics", post(metrics))
        .route("/v1/logs", post(logs))
        .with_state(HttpState { admission, max_body, token })
}

async fn traces(State(st): State<HttpState>, headers: HeaderMap, body: Body) -> Response {
    if let Some(r) = unauthenticated(&st, Signal::Traces, &headers) {
        return r;
    }
    let (enc, bytes, mut held) = match read_body(&st, Signal::Traces, &headers, body).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    if let Some(r) = reserve_decode(&st, Signal::Traces, enc, &bytes, &mut held) {
        return r;
    }
    let admitted = match enc {
        // Protobuf is read from its bytes (`normalize::wire`), and passed on as it came.
        Encoding::Protobuf => {
            st.admission.admit_wire(bytes, Transport::Http, held).map_err(|e| format!("body is not an ExportTraceServiceRequest: {e}"))
        }
        Encoding::Json => {
            otlp_json::decode_traces(&bytes).map(|req| st.admission.admit(req, Transport::Http, held)).map_err(|e| e.to_string())
        }
    };
    match admitted {
        Ok(Admitted::Accepted { rejected, message, durable }) => {
            if let Some(d) = durable {
                if let Err(reason) = d.settle().await {
                    return refusal(enc, reason, AT_CAPACITY);
                }
            }
            ok(
                enc,
                &ExportTraceServiceResponse {
                    partial_success: (rejected > 0)
                        .then_some(ExportTracePartialSuccess { rejected_spans: rejected as i64, error_message: message }),
                },
            )
        }
        Ok(Admitted::Busy(reason)) => refusal(enc, reason, AT_CAPACITY),
        Err(msg) => refuse(&st, Signal::Traces, enc, RefusalReason::Undecodable, &msg),
    }
}

/// Metrics are passed on (or dropped), not read.
async fn metrics(State(st): State<HttpState>, headers: HeaderMap, body: Body) -> Response {
    if let Some(r) = unauthenticated(&st, Signal::Metrics, &headers) {
        return r;
    }
    let (enc, bytes, mut held) = match read_body(&st, Signal::Metrics, &headers, body).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    if let Some(r) = reserve_decode(&st, Signal::Metrics, enc, &bytes, &mut held) {
        return r;
    }
    let req = match enc {
        Encoding::Protobuf => {
            ExportMetricsServiceRequest::decode(bytes).map_err(|e| format!("body is not an ExportMetricsServiceRequest: {e}"))
        }
        Encoding::Json => otlp_json::decode_metrics(&bytes),
    };
    match req.map(|r| st.admission.admit_metrics(r, Transport::Http, held)) {
        Ok(Admitted::Accepted { .. }) => ok(enc, &ExportMetricsServiceResponse { partial_success: None }),
        Ok(Admitted::Busy(reason)) => refusal(enc, reason, AT_CAPACITY),
        Err(msg) => refuse(&st, Signal::Metrics, enc, RefusalReason::Undecodable, &msg),
    }
}

/// Logs are passed on (or dropped), not read.
async fn logs(State(st): State<HttpState>, headers: HeaderMap, body: Body) -> Response {
    if let Some(r) = unauthenticated(&st, Signal::Logs, &headers) {
        return r;
    }
    let (enc, bytes, mut held) = match read_body(&st, Signal::Logs, &headers, body).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    if let Some(r) = reserve_decode(&st, Signal::Logs, enc, &bytes, &mut held) {
        return r;
    }
    let req = match enc {
        Encoding::Protobuf => ExportLogsServiceRequest::decode(bytes).map_err(|e| format!("body is not an ExportLogsServiceRequest: {e}")),
        Encoding::Json => otlp_json::decode_logs(&bytes),
    };
    match req.map(|r| st.admission.admit_logs(r, Transport::Http, held)) {
        Ok(Admitted::Accepted { .. }) => ok(enc, &ExportLogsServiceResponse { partial_success: None }),
        Ok(Admitted::Busy(reason)) => refusal(enc, reason, AT_CAPACITY),
        Err(msg) => refuse(&st, Signal::Logs, enc, RefusalReason::Undecodable, &msg),
    }
}

/// Under the memory limiter, grow the request's reservation to what decoding `bytes` will hold
/// at its peak, before decoding; the refusal (counted) when that does not fit: retryably (503)
/// when it does not fit now, for good (413) when it could not fit even in an idle process (a
/// body of empty JSON spans decodes to 100 times its size).
fn reserve_decode(st: &HttpState, signal: Signal, enc: Encoding, bytes: &Bytes, held: &mut Option<Reservation>) -> Option<Response> {
    let Some(r) = held else { return None };
    let wire = bytes.len() as u64;
    // JSON expands by its shape (a 3-byte `{}` span is a 264-byte struct): bounded from the text
    // by one pass over it, not by a multiple of its size.
    let decoded = match (enc, signal) {
        (Encoding::Protobuf, _) => wire.saturating_mul(memory::DECODED_PER_WIRE_BYTE),
        (Encoding::Json, Signal::Traces) => otlp_json::decoded_bound(bytes, otlp_json::JsonDecoder::Direct),
        (Encoding::Json, _) => otlp_json::decoded_bound(bytes, otlp_json::JsonDecoder::Tree),
    };
    let need = wire.saturating_add(decoded);
    if r.resize(need) {
        return None;
    }
    let soft = st.admission.memory.as_ref().map_or(u64::MAX, |m| m.limits().0);
    if need > soft {
        let msg = format!("decoding this body needs up to {} MiB, more than the memory limit allows; send smaller requests", need >> 20);
        return Some(refuse(st, signal, enc, RefusalReason::TooLarge, &msg));
    }
    Some(refuse(st, signal, enc, RefusalReason::MemoryLimit, AT_CAPACITY))
}

/// Media type, body within the limit, decompressed within the limit; or the error answer.
///
/// Under `processors.memory_limiter` the body's memory is reserved before it is read (its
/// `Content-Length`, else the largest body allowed), then before it is decompressed (the largest
/// decompressed body allowed), each trimmed to the bytes really held afterwards: concurrent large
/// requests are refused before they allocate, not after.
async fn read_body(
    st: &HttpState,
    signal: Signal,
    headers: &HeaderMap,
    body: Body,
) -> Result<(Encoding, Bytes, Option<Reservation>), Response> {
    let refused = |enc, reason, message: &str| refuse(st, signal, enc, reason, message);
    let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let enc = match ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase().as_str() {
        "application/x-protobuf" | "application/protobuf" => Encoding::Protobuf,
        "application/json" => Encoding::Json,
        _ => {
            drain(body, st.max_body).await;
            return Err(refused(
                Encoding::Protobuf,
                RefusalReason::UnsupportedMediaType,
                "Content-Type must be application/x-protobuf or application/json",
            ));
        }
    };
    // Above the memory limit, or a queue it needs full: refuse before the body is decoded. The
    // body is read and dropped first (never held), so the client, still sending, gets the
    // status and its `Retry-After` rather than a broken pipe.
    let early = if st.admission.over_memory() { Some(RefusalReason::MemoryLimit) } else { st.admission.full_before_decode(signal) };
    if let Some(reason) = early {
        drain(body, st.max_body).await;
        return Err(refused(enc, reason, AT_CAPACITY));
    }
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse::<u64>().ok());
    let mut held = match &st.admission.memory {
        Some(m) => match m.reserve(declared.unwrap_or(st.max_body as u64).min(st.max_body as u64)) {
            Some(r) => Some(r),
            None => {
                drain(body, st.max_body).await;
                return Err(refused(enc, RefusalReason::MemoryLimit, AT_CAPACITY));
            }
        },
        None => None,
    };
    let raw = match axum::body::to_bytes(body, st.max_body).await {
        Ok(b) => b,
        Err(_) => return Err(refused(enc, RefusalReason::TooLarge, &format!("request body exceeds {} bytes", st.max_body))),
    };
    let content_encoding =
        headers.get(header::CONTENT_ENCODING).and_then(|v| v.to_str().ok()).unwrap_or("identity").trim().to_ascii_lowercase();
    if let Some(r) = held.as_mut() {
        // A body longer than it declared is already read: count it as it is.
        r.set(raw.len() as u64);
        let compressed = !matches!(content_encoding.as_str(), "identity" | "");
        if compressed && !r.resize(raw.len() as u64 + st.max_body as u64) {
            return Err(refused(enc, RefusalReason::MemoryLimit, AT_CAPACITY));
        }
    }
    match decompress(&content_encoding, raw, st.max_body) {
        Some(Ok(b)) => {
            if let Some(r) = held.as_mut() {
                r.set(b.len() as u64);
            }
            Ok((enc, b, held))
        }
        Some(Err(DecompressError::TooLarge)) => {
            Err(refused(enc, RefusalReason::TooLarge, &format!("decompressed body exceeds {} bytes", st.max_body)))
        }
        Some(Err(DecompressError::Corrupt(e))) => {
            Err(refused(enc, RefusalReason::Undecodable, &format!("{content_encoding} body could not be decompressed: {e}")))
        }
        None => Err(refused(
            enc,
            RefusalReason::UnsupportedEncoding,
            &format!("Content-Encoding {content_encoding:?} is not supported (use gzip, zstd, deflate or none)"),
        )),
    }
}

/// Read a body to its end (at most `limit` bytes) and drop it as it comes: nothing is held, and a
/// client sending a body the service refuses gets its answer, not a closed connection.
async fn drain(body: Body, limit: usize) {
    use http_body_util::BodyExt;
    let mut body = body;
    let mut read = 0usize;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => {
                read += f.data_ref().map_or(0, |d| d.len());
                if read > limit {
                    return;
                }
            }
            Err(_) => return,
        }
    }
}

fn ok<M: Message + serde::Serialize>(enc: Encoding, resp: &M) -> Response {
    match enc {
        Encoding::Protobuf => ([(header::CONTENT_TYPE, "application/x-protobuf")], resp.encode_to_vec()).into_response(),
        Encoding::Json => {
            ([(header::CONTENT_TYPE, "application/json")], serde_json::to_vec(resp).unwrap_or_else(|_| b"{}".to_vec())).into_response()
        }
    }
}

/// What every retryable refusal says.
const AT_CAPACITY: &str = "mcp-health is at capacity; retry later";

/// Count a refusal of `signal` and answer it.
fn refuse(st: &HttpState, signal: Signal, enc: Encoding, reason: RefusalReason, message: &str) -> Response {
    st.admission.refused_signal(signal, Transport::Http, reason);
    refusal(enc, reason, message)
}

/// The answer to a request refused for `reason`, the one place a refusal's status is chosen (as
/// the OTLP/HTTP specification says: 503 with `Retry-After` when the service sheds load, so the
/// sender retries and keeps its data; 400 for data that cannot be read, 401 without the bearer
/// token, 413 for a body too large, 415 for a media type or encoding not supported; none of these
/// is retried). The body is a `google.rpc.Status` with the matching gRPC code.
fn refusal(enc: Encoding, reason: RefusalReason, message: &str) -> Response {
    let (status, code) = match reason {
        RefusalReason::MemoryLimit | RefusalReason::CorrelatorBusy | RefusalReason::ExporterBusy | RefusalReason::JournalFull => {
            (StatusCode::SERVICE_UNAVAILABLE, 14)
        }
        // Invalid spans are refused inside an accepted request (partial success), not by a status;
        // a request of nothing else would be bad data.
        RefusalReason::Undecodable | RefusalReason::InvalidSpan => (StatusCode::BAD_REQUEST, 3),
        RefusalReason::Unauthenticated => (StatusCode::UNAUTHORIZED, 16),
        RefusalReason::TooLarge => (StatusCode::PAYLOAD_TOO_LARGE, 8),
        RefusalReason::UnsupportedMediaType | RefusalReason::UnsupportedEncoding => (StatusCode::UNSUPPORTED_MEDIA_TYPE, 3),
    };
    let mut r = error(enc, status, code, message);
    if status == StatusCode::SERVICE_UNAVAILABLE {
        r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    r
}

#[derive(Debug)]
pub(super) enum DecompressError {
    TooLarge,
    Corrupt(std::io::Error),
}

/// Undo `Content-Encoding`, reading at most `limit` bytes out; `None` for an encoding not known.
pub(super) fn decompress(content_encoding: &str, raw: Bytes, limit: usize) -> Option<Result<Bytes, DecompressError>> {
    Some(match content_encoding {
        "identity" | "" => Ok(raw),
        "gzip" | "x-gzip" => gunzip(&raw, limit),
        "zstd" => unzstd(&raw, limit),
        "deflate" => inflate(&raw, limit),
        _ => return None,
    })
}

/// Read `dec` to its end, or fail as soon as it yields more than `limit` bytes.
fn read_limited(dec: impl Read, compressed_len: usize, limit: usize) -> Result<Bytes, DecompressError> {
    let mut out = Vec::with_capacity(compressed_len.saturating_mul(4).min(limit));
    dec.take(limit as u64 + 1).read_to_end(&mut out).map_err(DecompressError::Corrupt)?;
    if out.len() > limit {
        return Err(DecompressError::TooLarge);
    }
    Ok(Bytes::from(out))
}

fn gunzip(raw: &[u8], limit: usize) -> Result<Bytes, DecompressError> {
    // Every member of a multi-member body (RFC 1952 §2.2): concatenated members are one stream,
    // and a protobuf body split over members is the concatenation, a valid message.
    read_limited(flate2::read::MultiGzDecoder::new(raw), raw.len(), limit)
}

/// zstd (RFC 8878); concatenated frames are read as one stream, like gzip members. The window a
/// frame may ask for is bounded by the body limit (at least 8 MiB, the usual encoders' default),
/// so a small body cannot make the decoder reserve zstd's default maximum of 128 MiB.
fn unzstd(raw: &[u8], limit: usize) -> Result<Bytes, DecompressError> {
    let mut dec = zstd::stream::read::Decoder::with_buffer(raw).map_err(DecompressError::Corrupt)?;
    let window_log = (usize::BITS - limit.saturating_sub(1).leading_zeros()).clamp(23, 30);
    dec.window_log_max(window_log).map_err(DecompressError::Corrupt)?;
    read_limited(dec, raw.len(), limit)
}

/// `deflate` is zlib (RFC 9110 §8.4.1.2, RFC 1950); a raw deflate stream (RFC 1951), which some
/// clients send under that name, is read too: it is told apart by the zlib header's check bits,
/// and a body that only looks like zlib (a raw stream can start with valid check bits) and does
/// not read as zlib is read as raw deflate.
fn inflate(raw: &[u8], limit: usize) -> Result<Bytes, DecompressError> {
    let zlib = raw.len() >= 2 && raw[0] & 0x0f == 8 && raw[0] >> 4 <= 7 && (u16::from(raw[0]) << 8 | u16::from(raw[1])) % 31 == 0;
    let raw_deflate = || read_limited(flate2::read::DeflateDecoder::new(raw), raw.len(), limit);
    if !zlib {
        return raw_deflate();
    }
    match read_limited(flate2::read::ZlibDecoder::new(raw), raw.len(), limit) {
        Err(DecompressError::Corrupt(e)) => raw_deflate().map_err(|_| DecompressError::Corrupt(e)),
        r => r,
    }
}

/// An error answer with a `google.rpc.Status` body in the request's encoding.
fn error(enc: Encoding, status: StatusCode, code: i32, message: &str) -> Response {
    let body = tonic_types::Status { code, message: message.to_string(), details: vec![] };
    match enc {
        Encoding::Protobuf => (status, [(header::CONTENT_TYPE, "application/x-protobuf")], body.encode_to_vec()).into_response(),
        Encoding::Json => {
            (status, [(header::CONTENT_TYPE, "application/json")], serde_json::json!({"code": code, "message": message}).to_string())
                .into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    /// Each refusal's status, as the OTLP/HTTP specification asks: only shedding load is
    /// answered retryable (503 with `Retry-After`).
    #[test]
    fn each_refusal_has_its_status_and_only_shedding_load_is_retryable() {
        use RefusalReason::*;
        let cases = [
            (MemoryLimit, 503),
            (CorrelatorBusy, 503),
            (ExporterBusy, 503),
            (Undecodable, 400),
            (InvalidSpan, 400),
            (Unauthenticated, 401),
            (TooLarge, 413),
            (UnsupportedMediaType, 415),
            (UnsupportedEncoding, 415),
        ];
        for (reason, status) in cases {
            let r = refusal(Encoding::Protobuf, reason, "m");
            assert_eq!(r.status().as_u16(), status, "{reason}");
            assert_eq!(r.headers().contains_key(header::RETRY_AFTER), status == 503, "{reason}");
        }
    }

    fn gz(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    /// Issue 10: a body of 15 concatenated gzip members was answered 200 with only the first read.
    #[test]
    fn every_member_of_a_multi_member_gzip_body_is_read() {
        let parts: Vec<Vec<u8>> = (0..15u8).map(|i| vec![i; 100]).collect();
        let body: Vec<u8> = parts.iter().flat_map(|p| gz(p)).collect();
        let out = gunzip(&body, 1 << 20).expect("decompressed");
        assert_eq!(out.len(), 1500);
        assert_eq!(&out[..], &parts.concat()[..]);
        // The size limit holds over all members together.
        assert!(matches!(gunzip(&body, 1000), Err(DecompressError::TooLarge)));
    }

    fn bomb_of(n: usize) -> Vec<u8> {
        vec![b'z'; n]
    }

    #[test]
    fn zstd_bodies_are_read_and_a_zstd_bomb_is_too_large() {
        let data = b"hello zstd".repeat(100);
        let z = zstd::encode_all(&data[..], 3).unwrap();
        let out = decompress("zstd", Bytes::from(z.clone()), 1 << 20).unwrap().unwrap();
        assert_eq!(&out[..], &data[..]);
        // Concatenated frames are one stream.
        let two: Vec<u8> = [z.clone(), z].concat();
        assert_eq!(unzstd(&two, 1 << 20).unwrap().len(), 2 * data.len());
        // 16 MiB inflated from a few hundred bytes, against a 64 KiB limit.
        let bomb = zstd::encode_all(&bomb_of(16 << 20)[..], 19).unwrap();
        assert!(bomb.len() < 4096, "{}", bomb.len());
        assert!(matches!(unzstd(&bomb, 64 << 10), Err(DecompressError::TooLarge)));
        assert!(matches!(unzstd(b"not zstd at all", 1 << 20), Err(DecompressError::Corrupt(_))));
    }

    #[test]
    fn deflate_is_zlib_and_raw_deflate_is_read_too() {
        let data = b"hello deflate".repeat(100);
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        z.write_all(&data).unwrap();
        let zlib = z.finish().unwrap();
        assert_eq!(&decompress("deflate", Bytes::from(zlib), 1 << 20).unwrap().unwrap()[..], &data[..]);
        let mut r = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
        r.write_all(&data).unwrap();
        let raw = r.finish().unwrap();
        assert_eq!(&inflate(&raw, 1 << 20).unwrap()[..], &data[..]);
        let mut b = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
        b.write_all(&bomb_of(16 << 20)).unwrap();
        assert!(matches!(inflate(&b.finish().unwrap(), 64 << 10), Err(DecompressError::TooLarge)));
    }

    #[test]
    fn unknown_encodings_are_not_guessed() {
        assert!(decompress("br", Bytes::from_static(b"x"), 10).is_none());
        assert_eq!(&decompress("identity", Bytes::from_static(b"x"), 10).unwrap().unwrap()[..], b"x");
    }
}
