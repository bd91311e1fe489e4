//! The tool definitions seen in raw form (`mcp_health.catalog.tools`), by contract digest: what a
//! drift report diffs against. Shared because receivers on every thread add to it and the engine,
//! the gate and the CLI read it (each is handed the same [`Definitions`]); bounded: past its
//! capacity the oldest definition is forgotten, counted as `tool_definitions` (a missing
//! definition only makes a drift report say less, never wrong).

use std::sync::Mutex;

use serde_json::Value;

use crate::bounded::BoundedMap;

/// Default capacity (`processors.mcp_health.limits.tool_definitions`).
pub(crate) const DEFAULT_CAPACITY: usize = 8_192;

/// See the module documentation. One per service (or replay), handed as an `Arc` to the
/// normalizer's settings (which write it) and to the engine and the gate (which read it).
pub struct Definitions {
    map: Mutex<BoundedMap<String, Value>>,
}

impl Default for Definitions {
    fn default() -> Self {
        Definitions::with_capacity(DEFAULT_CAPACITY)
    }
}

impl std::fmt::Debug for Definitions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Definitions").field("len", &self.map.lock().unwrap_or_else(|p| p.into_inner()).len()).finish()
    }
}

impl Definitions {
    pub fn with_capacity(cap: usize) -> Self {
        Definitions { map: Mutex::new(BoundedMap::with_capacity("tool_definitions", cap)) }
    }

    /// Remember the projection of a definition under its digest.
    pub fn remember(&self, digest: &str, projection: Value) {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if m.contains(digest) {
            return;
        }
        m.insert(digest.to_string(), projection);
    }

    /// The projection of a definition seen with this digest, if any.
    pub fn lookup(&self, digest: &str) -> Option<Value> {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).get(digest).cloned()
    }
}
