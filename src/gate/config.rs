//! `extensions.gate`, the gate's configuration: its listener and the answer for an unpinned tool.
//! Declared beside the gate; `config` assembles the tree.

use std::time::Duration;

use serde::Deserialize;

use crate::receive::config::{check_endpoint, check_listener, connection_limits, d_10s, d_60s, d_max_connections, empty_is_default};
use crate::receive::tls::TlsServerSettings;

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GateConfig {
    #[serde(default = "default_gate_endpoint")]
    pub endpoint: String,
    /// The answer for a tool with no pin (or when no lockfile is configured): `allow` or `deny`.
    #[serde(default)]
    pub unpinned: crate::gate::UnpinnedPolicy,
    /// TLS (the collector's `configtls` server keys); absent: plaintext.
    #[serde(default, deserialize_with = "empty_is_default")]
    pub tls: Option<TlsServerSettings>,
    /// A connection that has not sent its first request head (TLS handshake included) this long
    /// after it was accepted is closed, counted in `mcp_health.connections.timed_out`.
    #[serde(default = "d_10s", with = "humantime_serde")]
    pub read_header_timeout: Duration,
    /// A connection with nothing to do this long (no request in flight and none arriving, or a
    /// request whose client sends nothing) is closed, counted in `mcp_health.connections.timed_out`.
    #[serde(default = "d_60s", with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// Connections held at once; one more is accepted and closed at once, counted in
    /// `mcp_health.connections.refused{reason="max_connections"}`.
    #[serde(default = "d_max_connections")]
    pub max_connections: usize,
}

connection_limits!(GateConfig);

impl GateConfig {
    /// The values that parsed but are not allowed: `Err((key, why))`, the key under `key_prefix`
    /// (`extensions.gate`).
    pub fn check(&self, key_prefix: &str) -> Result<(), (String, String)> {
        check_listener(key_prefix, self.connections(), self.tls.as_ref())?;
        check_endpoint(&format!("{key_prefix}.endpoint"), &self.endpoint, 4320)
    }
}

fn default_gate_endpoint() -> String {
    "127.0.0.1:4320".into()
}
