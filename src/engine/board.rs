//! The gate's board: the latest catalog verdict of every session, as the engine last decided
//! it. The engine publishes on it as verdicts change; the gate (`gate::GateState`) answers from
//! it. It lives with its writer, so the engine names nothing of the gate above it.

use std::sync::{Arc, RwLock};

use crate::bounded::BoundedMap;
use crate::classify::catalog::CatalogVerdict;

/// Sessions a board keeps unless `processors.mcp_health.limits.gate_board` says otherwise.
pub(crate) const DEFAULT_BOARD_CAPACITY: usize = 100_000;

/// The latest catalog verdict of every session, as the engine last decided it. Bounded: past
/// its capacity the session published least recently is forgotten (counted as `gate_board`).
pub struct CatalogBoard {
    sessions: RwLock<BoundedMap<String, BoardEntry>>,
}

/// A session's server (if known) and catalog verdict.
type BoardEntry = (Option<Arc<str>>, CatalogVerdict);

impl Default for CatalogBoard {
    fn default() -> Self {
        CatalogBoard::with_capacity(DEFAULT_BOARD_CAPACITY)
    }
}

impl CatalogBoard {
    pub fn with_capacity(cap: usize) -> Self {
        CatalogBoard { sessions: RwLock::new(BoundedMap::with_capacity("gate_board", cap)) }
    }

    pub fn publish(&self, session_key: &str, server: Option<Arc<str>>, v: CatalogVerdict) {
        let mut m = self.sessions.write().unwrap_or_else(|p| p.into_inner());
        m.insert(session_key.to_string(), (server, v));
    }

    /// Forget sessions the correlator forgot.
    pub fn forget(&self, session_keys: &[String]) {
        if session_keys.is_empty() {
            return;
        }
        let mut m = self.sessions.write().unwrap_or_else(|p| p.into_inner());
        for k in session_keys {
            m.remove(k);
        }
    }

    pub fn get(&self, session_key: &str) -> Option<(Option<Arc<str>>, CatalogVerdict)> {
        self.sessions.read().unwrap_or_else(|p| p.into_inner()).get(session_key).cloned()
    }

    /// Every session of a server: (session key hash, verdict).
    pub fn for_server(&self, server: &str) -> Vec<(String, CatalogVerdict)> {
        let m = self.sessions.read().unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<_> = m
            .iter()
            .filter(|(_, (s, _))| s.as_deref() == Some(server))
            .map(|(k, (_, v))| (crate::normalize::redact::hash_hex(k.as_bytes()), v.clone()))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}
