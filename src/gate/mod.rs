//! The gate: what an agent runtime or MCP gateway asks before a tool call — "may I call this tool
//! with this definition?" — and "what is the catalog verdict of this session or server now?".
//!
//! [`GateState`] is the answerable state, shared between the correlator (which publishes catalog
//! verdicts as they change) and the gRPC service in [`service`] (defined in
//! `proto/mcp_health/v1/gate.proto`).

pub(crate) mod config;
pub mod service;

use std::sync::{Arc, RwLock};

use crate::bounded::BoundedMap;
use crate::classify::catalog::CatalogVerdict;
use crate::classify::drift::ContractChange;
use crate::classify::pinning::{Lockfile, PinCheck};

/// Sessions a board keeps unless `processors.mcp_health.limits.gate_board` says otherwise.
pub const DEFAULT_BOARD_CAPACITY: usize = 100_000;

/// The latest catalog verdict of every session, as the correlator last decided it. Bounded: past
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

/// What to answer for a tool that has no pin.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnpinnedPolicy {
    #[default]
    Allow,
    Deny,
}

/// The gate's answer about one tool definition.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolDecision {
    pub allow: bool,
    /// `matches_pin`, `unpinned`, `contract_drift`, `projection_mismatch`, `no_lockfile`.
    pub reason: &'static str,
    pub pinned_digest: Option<String>,
    pub changes: Vec<ContractChange>,
}

/// Shared state behind the gate.
#[derive(Clone, Default)]
pub struct GateState {
    pub pins: Option<Arc<Lockfile>>,
    pub board: Arc<CatalogBoard>,
    pub unpinned: UnpinnedPolicy,
    /// Set while the configured state store is unavailable (`service::Heartbeat`): catalog
    /// verdicts that other instances hold are then unknown here, and the gate says so
    /// (UNAVAILABLE) rather than answering from this instance's board alone.
    pub store_down: Option<Arc<dyn Fn() -> bool + Send + Sync>>,
    /// A shared state store, and the session limits the engine judges catalogs by: a session's
    /// verdict is then read from the store (every instance's evidence, merged), so any instance
    /// answers for any session, not only for those whose traces it received.
    pub shared: Option<(crate::state::StoreHandle, crate::correlate::SessionLimits)>,
}

impl GateState {
    /// Allow or deny a call that is about to use `digest` as the definition of `tool` on `server`.
    pub fn check_tool(&self, server: &str, tool: &str, digest: &str) -> ToolDecision {
        let Some(pins) = &self.pins else {
            return ToolDecision {
                allow: self.unpinned == UnpinnedPolicy::Allow,
                reason: "no_lockfile",
                pinned_digest: None,
                changes: vec![],
            };
        };
        match pins.check(server, tool, digest, crate::normalize::definitions::lookup(digest).as_ref()) {
            PinCheck::Matches => {
                ToolDecision { allow: true, reason: "matches_pin", pinned_digest: Some(digest.to_string()), changes: vec![] }
            }
            PinCheck::Unpinned => {
                ToolDecision { allow: self.unpinned == UnpinnedPolicy::Allow, reason: "unpinned", pinned_digest: None, changes: vec![] }
            }
            PinCheck::ProjectionMismatch { .. } => ToolDecision {
                allow: false,
                reason: "projection_mismatch",
                pinned_digest: pins.pin(server, tool).map(|p| p.digest.clone()),
                changes: vec![],
            },
            PinCheck::Drift { pinned_digest, changes } => {
                ToolDecision { allow: false, reason: "contract_drift", pinned_digest: Some(pinned_digest), changes }
            }
        }
    }

    /// The catalog verdict of a session (by `mcp.session.id`), or of a client at a server where the
    /// protocol has no session.
    pub fn catalog_of(&self, session_id: Option<&str>, client: Option<&str>, server: Option<&str>) -> Option<CatalogVerdict> {
        let key = crate::evidence::session_key(session_id, client, server, crate::evidence::Side::Client)?;
        if let Some((store, limits)) = &self.shared {
            match store.peek(crate::state::Table::Sessions, &key) {
                Ok(Some(crate::state::Record::Session(r))) => {
                    // The store holds the union every instance wrote (at most 100 ms behind each);
                    // judged now, as the engine would.
                    let mut one = crate::correlate::Sessions::new(limits.clone());
                    one.restore(key.clone(), (*r).into());
                    let now = crate::evidence::time::Moment::wall_now();
                    if let Some(c) = one.all_at(now).into_iter().next() {
                        return Some(c.verdict);
                    }
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "gate: could not read a session from the state store; answering from this instance"),
            }
        }
        self.board.get(&key).map(|(_, v)| v)
    }
}
