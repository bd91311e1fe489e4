//! What both OTLP senders stand on: the hyper-rustls connector with a target's TLS (the gRPC
//! channel and the OTLP/HTTP client both connect through it) and why one attempt failed (both
//! answer in it, and the retry loop reads it). Below `otlp_traces` and `otlp_http`, so neither
//! has to import the other for it.

use std::sync::Arc;
use std::time::Duration;

use super::otlp_target::Target;

/// Why one attempt to send failed: retryable (with the delay the server asked for, if any) or
/// not.
#[derive(Debug)]
pub(crate) enum Failure {
    Retryable(Option<Duration>, String),
    Permanent(String),
    /// The request is larger than the receiver takes (gRPC `OUT_OF_RANGE` or `RESOURCE_EXHAUSTED`
    /// naming the size, HTTP 413): the same bytes will never pass, so they are never retried; a
    /// request of more than one item is split in two and each half sent.
    TooLarge(String),
}

/// A hyper-rustls connector with the target's TLS configuration (`https_or_http` when the target
/// is plaintext: its URL is `http://`, so no TLS is attempted). `h2` sets ALPN for gRPC.
pub(crate) fn https_connector(t: &Target, h2: bool) -> hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector> {
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
