//! `extensions.gate`, the gate's configuration: its listener and the answer for an unpinned tool.
//! Declared beside the gate; `config` assembles the tree.

use crate::receive::config::{check_endpoint, check_listener, empty_is_default, listener_config};
use crate::receive::tls::TlsServerSettings;

listener_config! {
    pub struct GateConfig {
        #[serde(default = "default_gate_endpoint")]
        pub endpoint: String,
        /// The answer for a tool with no pin (or when no lockfile is configured): `allow` or `deny`.
        #[serde(default)]
        pub unpinned: crate::gate::UnpinnedPolicy,
        /// TLS (the collector's `configtls` server keys); absent: plaintext.
        #[serde(default, deserialize_with = "empty_is_default")]
        pub tls: Option<TlsServerSettings>,
    }
}

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
