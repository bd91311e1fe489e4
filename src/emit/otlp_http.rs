//! The OTLP/HTTP transport of the exporter: `POST` of a protobuf (or JSON) export request to the
//! signal's URL, answered as the OTLP/HTTP specification says: 2xx is delivered (a partial
//! success in the body is read), 429, 502, 503 and 504 are retryable and their `Retry-After` is
//! honoured, 413 is "too large" (never retried; the exporter splits what it sends below `max_request_bytes`),
//! every other status (400, 401, 403, 404, 415, 500...) is permanent.
//!
//! hyper-util's pooled client with hyper-rustls: the TLS configuration is the one the gRPC channel
//! uses (`crate::emit::tls_client`).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{HeaderName, HeaderValue, CONTENT_ENCODING, CONTENT_TYPE, RETRY_AFTER, USER_AGENT};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::otlp_target::{Protocol, Target};
use super::otlp_transport::{https_connector, Failure};

/// A response body larger than this is not read (a partial-success message or a status is small).
const MAX_RESPONSE: usize = 64 << 10;

/// One signal's OTLP/HTTP sender.
#[derive(Clone)]
pub(crate) struct HttpSender {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    url: hyper::Uri,
    headers: Vec<(HeaderName, HeaderValue)>,
    timeout: Duration,
    json: bool,
}

/// Why an HTTP sender could not be set up.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HttpSetupError {
    #[error("invalid OTLP/HTTP URL {0:?}: {1}")]
    Url(String, String),
    #[error("header {0:?} is not a valid HTTP header")]
    Header(String),
}

impl HttpSender {
    pub(crate) fn new(t: &Target) -> Result<HttpSender, HttpSetupError> {
        let url: hyper::Uri = t.url.parse().map_err(|e: hyper::http::uri::InvalidUri| HttpSetupError::Url(t.url.clone(), e.to_string()))?;
        let mut headers = Vec::new();
        for (k, v) in &t.headers {
            let name = HeaderName::from_bytes(k.as_bytes()).map_err(|_| HttpSetupError::Header(k.clone()))?;
            let value = HeaderValue::from_str(v).map_err(|_| HttpSetupError::Header(k.clone()))?;
            headers.push((name, value));
        }
        let connector = https_connector(t, false);
        let client = Client::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(30)).build(connector);
        Ok(HttpSender { client, url, headers, timeout: t.timeout, json: t.protocol == Protocol::HttpJson })
    }

    /// Send one encoded (and compressed, named by `encoding`) request; the response body on success.
    pub(crate) async fn send(&self, body: Bytes, encoding: Option<&'static str>) -> Result<Bytes, Failure> {
        let mut req = hyper::Request::post(self.url.clone())
            .header(CONTENT_TYPE, if self.json { "application/json" } else { "application/x-protobuf" })
            .header(USER_AGENT, concat!("mcp-health/", env!("CARGO_PKG_VERSION")));
        if let Some(e) = encoding {
            req = req.header(CONTENT_ENCODING, e);
        }
        let mut req = req.body(Full::new(body)).map_err(|e| Failure::Permanent(format!("cannot build the request: {e}")))?;
        for (k, v) in &self.headers {
            req.headers_mut().insert(k.clone(), v.clone());
        }
        let exchange = async {
            let resp =
                self.client.request(req).await.map_err(|e| Failure::Retryable(None, format!("upstream unreachable: {}", chain(&e))))?;
            let status = resp.status();
            let retry_after = resp.headers().get(RETRY_AFTER).and_then(|v| v.to_str().ok()).and_then(parse_retry_after);
            let body = Limited::new(resp.into_body(), MAX_RESPONSE).collect().await.map(|b| b.to_bytes()).unwrap_or_default();
            Ok::<_, Failure>((status, retry_after, body))
        };
        let (status, retry_after, body) = match tokio::time::timeout(self.timeout, exchange).await {
            Ok(r) => r?,
            Err(_) => return Err(Failure::Retryable(None, format!("no answer within {:?}", self.timeout))),
        };
        classify(status.as_u16(), retry_after, body)
    }
}

/// The OTLP/HTTP specification's answer to each status.
fn classify(status: u16, retry_after: Option<Duration>, body: Bytes) -> Result<Bytes, Failure> {
    match status {
        200..=299 => Ok(body),
        429 | 502 | 503 | 504 => Err(Failure::Retryable(retry_after, format!("HTTP {status}{}", status_message(&body)))),
        413 => Err(Failure::TooLarge(format!("HTTP 413{}", status_message(&body)))),
        _ => Err(Failure::Permanent(format!("HTTP {status}{}", status_message(&body)))),
    }
}

/// The message of a `google.rpc.Status` body, if the body is one.
fn status_message(body: &[u8]) -> String {
    use prost::Message;
    match tonic_types::Status::decode(body) {
        Ok(s) if !s.message.is_empty() => format!(": {}", s.message),
        _ => String::new(),
    }
}

/// `Retry-After`: delay-seconds or an HTTP date.
pub(crate) fn parse_retry_after(v: &str) -> Option<Duration> {
    let v = v.trim();
    if let Ok(s) = v.parse::<u64>() {
        return Some(Duration::from_secs(s));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(at.duration_since(std::time::SystemTime::now()).unwrap_or(Duration::ZERO))
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_answered_as_the_otlp_http_specification_says() {
        for s in [200, 202, 204] {
            assert!(classify(s, None, Bytes::new()).is_ok(), "{s}");
        }
        for s in [429, 502, 503, 504] {
            assert!(
                matches!(classify(s, Some(Duration::from_secs(3)), Bytes::new()), Err(Failure::Retryable(Some(d), _)) if d == Duration::from_secs(3)),
                "{s}"
            );
        }
        assert!(matches!(classify(413, None, Bytes::new()), Err(Failure::TooLarge(_))), "413 is too large: never retried, split");
        for s in [400, 401, 403, 404, 405, 415, 500, 501] {
            assert!(matches!(classify(s, Some(Duration::from_secs(3)), Bytes::new()), Err(Failure::Permanent(_))), "{s} is not retried");
        }
    }

    #[test]
    fn retry_after_takes_seconds_and_dates() {
        assert_eq!(parse_retry_after("7"), Some(Duration::from_secs(7)));
        let later = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(120));
        let d = parse_retry_after(&later).unwrap();
        assert!(d > Duration::from_secs(100) && d <= Duration::from_secs(120), "{d:?}");
        assert_eq!(parse_retry_after("Thu, 01 Jan 1970 00:00:00 GMT"), Some(Duration::ZERO), "a past date: now");
        assert_eq!(parse_retry_after("soon"), None);
    }
}
