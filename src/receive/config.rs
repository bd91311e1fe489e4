//! `receivers:`, the OTLP receivers' configuration, and the keys every listener shares
//! (`endpoint`, `tls`, `read_header_timeout`, `idle_timeout`, `max_connections`) with their
//! checks. Declared beside the receivers and [`ConnectionLimits`]; the gate's, the Prometheus
//! exporter's and the health check's listeners use the shared keys from here, and `config`
//! assembles the tree.

use serde::Deserialize;

use crate::receive::listen::ConnectionLimits;
use crate::receive::tls::TlsServerSettings;

/// Declares a listener's configuration: the fields given, then the keys every listener shares
/// (`read_header_timeout`, `idle_timeout`, `max_connections`) with their defaults, and
/// `connections()` to read them. One declaration, so the five listeners' keys cannot drift
/// apart; serde's `flatten` would share them without a macro but cannot be combined with
/// `deny_unknown_fields`, which names a misspelt key at load.
macro_rules! listener_config {
    ($(#[$meta:meta])* pub struct $name:ident { $($fields:tt)* }) => {
        $(#[$meta])*
        #[derive(Clone, Debug, serde::Deserialize, PartialEq)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            $($fields)*
            /// A connection that has not sent its first request head (TLS handshake included)
            /// this long after it was accepted is closed, counted in
            /// `mcp_health.connections.timed_out`.
            #[serde(default = "crate::defaults::secs::<10>", with = "humantime_serde")]
            pub read_header_timeout: std::time::Duration,
            /// A connection with nothing to do this long (no request in flight and none
            /// arriving, or a request whose client sends nothing) is closed, counted in
            /// `mcp_health.connections.timed_out`.
            #[serde(default = "crate::defaults::secs::<60>", with = "humantime_serde")]
            pub idle_timeout: std::time::Duration,
            /// Connections held at once; one more is accepted and closed at once, counted in
            /// `mcp_health.connections.refused{reason="max_connections"}`.
            #[serde(default = "crate::defaults::count::<4_096>")]
            pub max_connections: usize,
        }

        impl $name {
            /// Its timeouts and connection limit.
            pub fn connections(&self) -> $crate::receive::listen::ConnectionLimits {
                $crate::receive::listen::ConnectionLimits {
                    read_header_timeout: self.read_header_timeout,
                    idle_timeout: self.idle_timeout,
                    max_connections: self.max_connections,
                }
            }
        }
    };
}
pub(crate) use listener_config;

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Receivers {
    #[serde(default)]
    pub otlp: OtlpReceiver,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OtlpReceiver {
    #[serde(default)]
    pub protocols: Protocols,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Protocols {
    #[serde(default, deserialize_with = "empty_is_default")]
    pub grpc: Option<GrpcReceiver>,
    #[serde(default, deserialize_with = "empty_is_default")]
    pub http: Option<HttpReceiver>,
}

listener_config! {
    pub struct GrpcReceiver {
        #[serde(default = "default_grpc_endpoint")]
        pub endpoint: String,
        /// Largest request accepted, in MiB (the collector's key).
        #[serde(default = "default_max_mib")]
        pub max_recv_msg_size_mib: usize,
        /// TLS (the collector's `configtls` server keys); absent: plaintext.
        #[serde(default, deserialize_with = "empty_is_default")]
        pub tls: Option<TlsServerSettings>,
        /// Require a bearer token of every sender (`auth: {bearer_token: "${env:OTLP_TOKEN}"}`): a
        /// request without it is refused (gRPC UNAUTHENTICATED, HTTP 401), counted as `unauthenticated`.
        /// A client certificate is required with `tls.client_ca_file`.
        #[serde(default)]
        pub auth: Option<ReceiverAuth>,
    }
}

listener_config! {
    pub struct HttpReceiver {
        #[serde(default = "default_http_endpoint")]
        pub endpoint: String,
        /// Largest body accepted, in bytes, after decompression (the collector's key).
        #[serde(default = "default_max_body")]
        pub max_request_body_size: usize,
        /// TLS (the collector's `configtls` server keys); absent: plaintext.
        #[serde(default, deserialize_with = "empty_is_default")]
        pub tls: Option<TlsServerSettings>,
        /// Require a bearer token of every sender (`auth: {bearer_token: "${env:OTLP_TOKEN}"}`): a
        /// request without it is refused (gRPC UNAUTHENTICATED, HTTP 401), counted as `unauthenticated`.
        /// A client certificate is required with `tls.client_ca_file`.
        #[serde(default)]
        pub auth: Option<ReceiverAuth>,
    }
}

/// `receivers.otlp.protocols.{grpc,http}.auth`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ReceiverAuth {
    pub bearer_token: String,
}

impl ReceiverAuth {
    /// The token every request must carry, when one is configured.
    pub fn token(auth: &Option<ReceiverAuth>) -> Option<std::sync::Arc<str>> {
        auth.as_ref().map(|a| std::sync::Arc::from(a.bearer_token.as_str()))
    }
}

impl Receivers {
    /// The values that parsed but are not allowed: `Err((key, why))`, the key under `key_prefix`
    /// (`receivers`).
    pub fn check(&self, key_prefix: &str) -> Result<(), (String, String)> {
        let p = &self.otlp.protocols;
        let key = |k: &str| format!("{key_prefix}.otlp.protocols.{k}");
        let auths = [("grpc", p.grpc.as_ref().and_then(|g| g.auth.as_ref())), ("http", p.http.as_ref().and_then(|h| h.auth.as_ref()))];
        for (protocol, auth) in auths {
            if auth.is_some_and(|a| a.bearer_token.trim().is_empty() || a.bearer_token.bytes().any(|b| b.is_ascii_control())) {
                return Err((key(&format!("{protocol}.auth.bearer_token")), "must be a non-empty token without control characters".into()));
            }
        }
        if let Some(g) = &p.grpc {
            check_listener(&key("grpc"), g.connections(), g.tls.as_ref())?;
        }
        if let Some(h) = &p.http {
            check_listener(&key("http"), h.connections(), h.tls.as_ref())?;
        }
        if let Some(g) = &p.grpc {
            check_endpoint(&key("grpc.endpoint"), &g.endpoint, 4317)?;
            if !(1..=MAX_MESSAGE_MIB).contains(&g.max_recv_msg_size_mib) {
                return Err((key("grpc.max_recv_msg_size_mib"), "must be from 1 to 4096 (MiB)".into()));
            }
        }
        if let Some(h) = &p.http {
            check_endpoint(&key("http.endpoint"), &h.endpoint, 4318)?;
        }
        Ok(())
    }
}

/// A component named with an empty value (`grpc:`, `health_check:`) is on with its defaults, as in
/// the collector; only a component that is not named at all is off.
pub(crate) fn empty_is_default<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    match Option::<T>::deserialize(d)? {
        Some(t) => Ok(Some(t)),
        None => T::deserialize(serde::de::value::MapDeserializer::<_, serde::de::value::Error>::new(std::iter::empty::<((), ())>()))
            .map(Some)
            .map_err(serde::de::Error::custom),
    }
}

fn default_grpc_endpoint() -> String {
    "127.0.0.1:4317".into()
}
fn default_http_endpoint() -> String {
    "127.0.0.1:4318".into()
}
fn default_max_mib() -> usize {
    4
}
fn default_max_body() -> usize {
    4 << 20
}

/// The most connections one listener may be configured to hold.
const MAX_CONNECTIONS: usize = 1 << 20;

/// The largest gRPC message size that may be configured: 4 GiB, far above any OTLP sender's.
const MAX_MESSAGE_MIB: usize = 4096;

/// The shared keys of a listener under `prefix`: its timeouts, connection limit and TLS files.
pub(crate) fn check_listener(prefix: &str, c: ConnectionLimits, tls: Option<&TlsServerSettings>) -> Result<(), (String, String)> {
    if c.read_header_timeout.is_zero() {
        return Err((format!("{prefix}.read_header_timeout"), "must be greater than zero".into()));
    }
    if c.idle_timeout.is_zero() {
        return Err((format!("{prefix}.idle_timeout"), "must be greater than zero".into()));
    }
    if !(1..=MAX_CONNECTIONS).contains(&c.max_connections) {
        return Err((format!("{prefix}.max_connections"), "must be from 1 to 1048576".into()));
    }
    // The files are read now, so `validate` and the start name a missing or unreadable
    // certificate or key by its key, not the first handshake.
    if let Some(Err(e)) = tls.map(|t| t.build(&[])) {
        return Err((format!("{prefix}.tls.{}", e.key()), e.to_string()));
    }
    Ok(())
}

/// A listener's `endpoint` (the full key) must be `host:port`; `port` is the example's.
pub(crate) fn check_endpoint(key: &str, endpoint: &str, port: u16) -> Result<(), (String, String)> {
    if listen_address_ok(endpoint) {
        return Ok(());
    }
    Err((key.to_string(), format!("must be host:port, e.g. 127.0.0.1:{port} or localhost:{port}")))
}

/// `host:port` where host is an IP address (IPv6 in brackets) or a DNS name, as the collector takes.
pub fn listen_address_ok(s: &str) -> bool {
    if s.parse::<std::net::SocketAddr>().is_ok() {
        return true;
    }
    let Some((host, port)) = s.rsplit_once(':') else { return false };
    port.parse::<u16>().is_ok()
        && !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|l| !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
}
