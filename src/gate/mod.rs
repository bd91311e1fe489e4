//! The gate: what an agent runtime or MCP gateway asks before a tool call — "may I call this tool
//! with this definition?" — and "what is the catalog verdict of this session or server now?".
//!
//! [`GateState`] is the answerable state, shared between the correlator (which publishes catalog
//! verdicts as they change) and the gRPC service in [`service`] (defined in
//! `proto/mcp_health/v1/gate.proto`).

pub(crate) mod config;
pub(crate) mod service;

use std::sync::Arc;

use crate::classify::catalog::CatalogVerdict;
use crate::classify::drift::ContractChange;
use crate::classify::pinning::{Lockfile, PinCheck};

pub use crate::engine::board::CatalogBoard;

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
pub(crate) struct GateState {
    pub pins: Option<Arc<Lockfile>>,
    pub board: Arc<CatalogBoard>,
    /// The tool definitions seen (the engine's), what a drifted definition is diffed against.
    pub definitions: Arc<crate::normalize::definitions::Definitions>,
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
    pub(crate) fn check_tool(&self, server: &str, tool: &str, digest: &str) -> ToolDecision {
        let Some(pins) = &self.pins else {
            return ToolDecision {
                allow: self.unpinned == UnpinnedPolicy::Allow,
                reason: "no_lockfile",
                pinned_digest: None,
                changes: vec![],
            };
        };
        match pins.check(server, tool, digest, self.definitions.lookup(digest).as_ref()) {
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
    pub(crate) fn catalog_of(&self, session_id: Option<&str>, client: Option<&str>, server: Option<&str>) -> Option<CatalogVerdict> {
        let key = crate::evidence::session_key(session_id, client, server, crate::evidence::Side::Client)?;
        if let Some((store, limits)) = &self.shared {
            match store.peek(crate::state::Table::Sessions, &key) {
                Ok(Some(crate::state::Record::Session(r))) => {
                    // The store holds the union every instance wrote (at most 100 ms behind each);
                    // judged now, as the engine would.
                    let mut one = crate::correlate::Sessions::new(limits.clone());
                    one.restore(crate::correlate::outbox::SessionBack::Loaded(key.clone(), (*r).into()));
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
