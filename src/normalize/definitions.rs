//! The tool definitions seen in raw form (`mcp_health.catalog.tools`), by contract digest: what a
//! drift report diffs against. Process-wide because receivers on every thread add to it and the
//! correlator, the gate and the CLI read it; bounded, cleared when full (a missing definition only
//! makes a drift report say less, never wrong).

use std::sync::{Mutex, OnceLock};

use rustc_hash::FxHashMap;
use serde_json::Value;

const CAP: usize = 8_192;

fn store() -> &'static Mutex<FxHashMap<String, Value>> {
    static STORE: OnceLock<Mutex<FxHashMap<String, Value>>> = OnceLock::new();
    STORE.get_or_init(Default::default)
}

/// Remember the projection of a definition under its digest.
pub fn remember(digest: &str, projection: Value) {
    let mut m = store().lock().unwrap_or_else(|p| p.into_inner());
    if m.contains_key(digest) {
        return;
    }
    if m.len() >= CAP {
        m.clear();
    }
    m.insert(digest.to_string(), projection);
}

/// The projection of a definition seen with this digest, if any.
pub fn lookup(digest: &str) -> Option<Value> {
    store().lock().unwrap_or_else(|p| p.into_inner()).get(digest).cloned()
}
