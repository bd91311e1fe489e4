//! The HTTP client of `http` checks: the pool's (the system's roots) and a rule's own (its
//! `ca_file`). Apart from the checks, so the rules compile a rule's client and the checks use it
//! without the two files importing each other.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;

use crate::tap::upstream_tls::UpstreamTls;

/// The HTTP client of `http` checks (pooled, shared by every check): `http://` and `https://`
/// (rustls, the system's roots: systems of record are mostly behind TLS). `None` when no TLS
/// configuration could be made at all: every `http` check then reports `unreachable`.
#[derive(Clone)]
pub struct HttpClient(pub(super) Option<Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>>);

impl std::fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "HttpClient" } else { "HttpClient(none)" })
    }
}

pub fn http_client(connect_timeout: Duration) -> HttpClient {
    let tls = UpstreamTls::default().client_config().or_else(|e| {
        // No system roots (a minimal container): plain http checks still work; https ones report
        // `unreachable`, never a finding.
        eprintln!("mcp-health tap: verifiers: {e}; https checks will fail");
        rustls::ClientConfig::builder_with_provider(crate::config::tls::provider())
            .with_safe_default_protocol_versions()
            .map(|b| b.with_root_certificates(rustls::RootCertStore::empty()).with_no_client_auth())
            .map_err(|e| e.to_string())
    });
    HttpClient(tls.ok().map(|tls| build(tls, connect_timeout)))
}

/// A client that trusts only the CAs in `ca_file` (PEM), for a rule's `http.ca_file`.
pub(crate) fn http_client_trusting(ca_file: &str) -> Result<HttpClient, String> {
    let roots = crate::config::tls::read_roots("ca_file", ca_file).map_err(|e| e.to_string())?;
    let tls = rustls::ClientConfig::builder_with_provider(crate::config::tls::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(HttpClient(Some(build(tls, Duration::from_secs(5)))))
}

fn build(tls: rustls::ClientConfig, connect_timeout: Duration) -> Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>> {
    let mut c = HttpConnector::new();
    c.set_nodelay(true);
    c.set_connect_timeout(Some(connect_timeout));
    c.enforce_http(false);
    let https = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls).https_or_http().enable_http1().wrap_connector(c);
    Client::builder(hyper_util::rt::TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(30)).build(https)
}
