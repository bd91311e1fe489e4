//! The tool definitions seen in raw form (`mcp_health.catalog.tools`), by contract digest: what a
//! drift report diffs against. Process-wide because receivers on every thread add to it and the
//! correlator, the gate and the CLI read it; bounded: past its capacity the oldest definition is
//! forgotten, counted as `tool_definitions` (a missing definition only makes a drift report say
//! less, never wrong).

use std::sync::{Mutex, OnceLock};

use serde_json::Value;

use crate::bounded::BoundedMap;

/// Default capacity (`processors.mcp_health.limits.tool_definitions`).
const CAP: usize = 8_192;

fn store() -> &'static Mutex<BoundedMap<String, Value>> {
    static STORE: OnceLock<Mutex<BoundedMap<String, Value>>> = OnceLock::new();
    STORE.get_or_init(|| Mutex::new(BoundedMap::with_capacity("tool_definitions", CAP)))
}

/// Set the capacity of the store (once, at start-up).
pub fn set_capacity(cap: usize) {
    store().lock().unwrap_or_else(|p| p.into_inner()).set_capacity(cap);
}

/// Remember the projection of a definition under its digest.
pub fn remember(digest: &str, projection: Value) {
    let mut m = store().lock().unwrap_or_else(|p| p.into_inner());
    if m.contains(digest) {
        return;
    }
    m.insert(digest.to_string(), projection);
}

/// The projection of a definition seen with this digest, if any.
pub fn lookup(digest: &str) -> Option<Value> {
    store().lock().unwrap_or_else(|p| p.into_inner()).get(digest).cloned()
}
