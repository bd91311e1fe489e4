//! Hashes of identifiers that must be joinable but not readable (session ids, credential ids,
//! incident causes). Pure functions; shared by the normalizers, the classifier and the emitters.

use sha2::{Digest, Sha256};

use crate::bounded::BoundedMap;

/// Hex SHA-256, for identifiers that must be joinable but not readable (session ids).
pub fn hash_hex(bytes: &[u8]) -> String {
    to_hex(&Sha256::digest(bytes))
}

/// Lower-case hex, without going through a `char` iterator (this is on the verdict path).
pub fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = Vec::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize]);
        out.push(DIGITS[(b & 15) as usize]);
    }
    // Only ASCII hex digits were written.
    String::from_utf8(out).unwrap_or_default()
}

/// Session hashes a thread keeps until told otherwise (`processors.mcp_health.limits.
/// redaction_cache`'s default).
pub const DEFAULT_SESSION_CACHE_CAPACITY: usize = 4096;

thread_local! {
    static SESSION_HASHES: std::cell::RefCell<BoundedMap<Box<str>, std::sync::Arc<str>>> =
        std::cell::RefCell::new(BoundedMap::with_capacity("redaction_cache", DEFAULT_SESSION_CACHE_CAPACITY));
}

/// Size this thread's session-hash cache (a receiving thread, from its component's settings, at
/// each batch: a change costs nothing when the size is the same).
pub fn fit_session_cache(cap: usize) {
    SESSION_HASHES.with(|m| {
        let mut m = m.borrow_mut();
        if m.capacity() != cap {
            m.set_capacity(cap);
        }
    })
}

/// The hash of a session key `session:<id>`, cached per thread: many calls share a session. Past
/// the cache's capacity the oldest is forgotten, counted as `redaction_cache`.
pub fn session_hash(session_id: &str) -> std::sync::Arc<str> {
    SESSION_HASHES.with(|m| {
        let mut m = m.borrow_mut();
        if let Some(h) = m.get(session_id) {
            return h.clone();
        }
        let mut h = Sha256::new();
        h.update(b"session:");
        h.update(session_id.as_bytes());
        let v: std::sync::Arc<str> = std::sync::Arc::from(to_hex(&h.finalize()));
        m.insert(session_id.into(), v.clone());
        v
    })
}
