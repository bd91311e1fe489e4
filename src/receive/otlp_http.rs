//! OTLP/HTTP receiver: `POST /v1/traces`, protobuf or JSON bodies, optionally gzip.
//!
//! Answers as the OTLP specification says: 200 with a partial-success body in the request's own
//! encoding; 400 with a `google.rpc.Status` for undecodable input; 413 for a body over the limit
//! (checked after decompression too, so a small gzip bomb is refused); 415 for other media types;
//! 503 with `Retry-After` when the service sheds load.

use std::io::Read;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTracePartialSuccess, ExportTraceServiceRequest, ExportTraceServiceResponse};
use prost::Message;

use super::admit::{Admission, Admitted};
use super::otlp_json;

#[derive(Clone)]
struct HttpState {
    admission: Admission,
    max_body: usize,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Encoding {
    Protobuf,
    Json,
}

/// The `/v1/traces` router.
pub fn router(admission: Admission, max_body: usize) -> Router {
    Router::new().route("/v1/traces", post(traces)).with_state(HttpState { admission, max_body })
}

async fn traces(State(st): State<HttpState>, headers: HeaderMap, body: Body) -> Response {
    let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let enc = match ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase().as_str() {
        "application/x-protobuf" | "application/protobuf" => Encoding::Protobuf,
        "application/json" => Encoding::Json,
        _ => {
            st.admission.refused("http", "unsupported_media_type");
            return error(
                Encoding::Protobuf,
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                3,
                "Content-Type must be application/x-protobuf or application/json",
            );
        }
    };
    let raw = match axum::body::to_bytes(body, st.max_body).await {
        Ok(b) => b,
        Err(_) => {
            st.admission.refused("http", "too_large");
            return error(enc, StatusCode::PAYLOAD_TOO_LARGE, 8, &format!("request body exceeds {} bytes", st.max_body));
        }
    };
    let content_encoding =
        headers.get(header::CONTENT_ENCODING).and_then(|v| v.to_str().ok()).unwrap_or("identity").trim().to_ascii_lowercase();
    let bytes = match content_encoding.as_str() {
        "identity" | "" => raw,
        "gzip" => match gunzip(&raw, st.max_body) {
            Ok(b) => b,
            Err(GunzipError::TooLarge) => {
                st.admission.refused("http", "too_large");
                return error(enc, StatusCode::PAYLOAD_TOO_LARGE, 8, &format!("decompressed body exceeds {} bytes", st.max_body));
            }
            Err(GunzipError::Corrupt(e)) => {
                st.admission.refused("http", "undecodable");
                return error(enc, StatusCode::BAD_REQUEST, 3, &format!("gzip body could not be decompressed: {e}"));
            }
        },
        other => {
            st.admission.refused("http", "unsupported_encoding");
            return error(
                enc,
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                3,
                &format!("Content-Encoding {other:?} is not supported (use gzip or none)"),
            );
        }
    };
    let req = match enc {
        Encoding::Protobuf => {
            ExportTraceServiceRequest::decode(bytes).map_err(|e| format!("body is not an ExportTraceServiceRequest: {e}"))
        }
        Encoding::Json => otlp_json::decode_traces(&bytes).map_err(|e| e.to_string()),
    };
    let req = match req {
        Ok(r) => r,
        Err(msg) => {
            st.admission.refused("http", "undecodable");
            return error(enc, StatusCode::BAD_REQUEST, 3, &msg);
        }
    };
    match st.admission.admit(req, "http") {
        Admitted::Accepted { rejected, message } => {
            let resp = ExportTraceServiceResponse {
                partial_success: (rejected > 0)
                    .then_some(ExportTracePartialSuccess { rejected_spans: rejected as i64, error_message: message }),
            };
            match enc {
                Encoding::Protobuf => ([(header::CONTENT_TYPE, "application/x-protobuf")], resp.encode_to_vec()).into_response(),
                Encoding::Json => {
                    ([(header::CONTENT_TYPE, "application/json")], serde_json::to_vec(&resp).unwrap_or_else(|_| b"{}".to_vec()))
                        .into_response()
                }
            }
        }
        Admitted::Busy => {
            let mut r = error(enc, StatusCode::SERVICE_UNAVAILABLE, 14, "mcp-health is at capacity; retry later");
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            r
        }
    }
}

enum GunzipError {
    TooLarge,
    Corrupt(std::io::Error),
}

fn gunzip(raw: &[u8], limit: usize) -> Result<Bytes, GunzipError> {
    let mut out = Vec::with_capacity(raw.len().saturating_mul(4).min(limit));
    // Every member of a multi-member body (RFC 1952 §2.2): concatenated members are one stream,
    // and a protobuf body split over members is the concatenation, a valid message.
    let mut dec = flate2::read::MultiGzDecoder::new(raw).take(limit as u64 + 1);
    dec.read_to_end(&mut out).map_err(GunzipError::Corrupt)?;
    if out.len() > limit {
        return Err(GunzipError::TooLarge);
    }
    Ok(Bytes::from(out))
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
        let out = gunzip(&body, 1 << 20).ok().expect("decompressed");
        assert_eq!(out.len(), 1500);
        assert_eq!(&out[..], &parts.concat()[..]);
        // The size limit holds over all members together.
        assert!(matches!(gunzip(&body, 1000), Err(GunzipError::TooLarge)));
    }
}
