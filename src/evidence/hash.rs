//! Hashes of identifiers that must be joinable but not readable (session ids, credential ids,
//! incident causes). Pure functions; shared by the normalizers, the classifier and the emitters.

use sha2::{Digest, Sha256};

use crate::bounded::BoundedMap;

/// Hex SHA-256, for identifiers that must be joinable but not readable (session ids).
pub fn hash_hex(bytes: &[u8]) -> String {
    to_hex(&Sha256::digest(bytes))
}

/// Lower-case hex, as OTLP's JSON and every store key spell trace and span ids: written through
/// a table into a string of its final size. This is on the verdict path (session hashes, the
/// decided chains' store keys, the status page's ids): `hex::encode` collects an iterator of
/// `char`s, and building a `Vec<u8>` then checking it as UTF-8 cost more than the digits (15 %
/// of the engine thread with a memory store, in a profile). Ids and hashes (up to 32 bytes) are
/// spelled on the stack and checked there, which is a few words of ASCII: pushing each digit
/// as a `char` tested the string's room and the char's width 64 times for a trace id.
pub fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    const ON_STACK: usize = 32;
    if bytes.len() <= ON_STACK {
        let mut buf = [0u8; 2 * ON_STACK];
        for (b, pair) in bytes.iter().zip(buf.chunks_exact_mut(2)) {
            pair[0] = DIGITS[usize::from(b >> 4)];
            pair[1] = DIGITS[usize::from(b & 15)];
        }
        if let Ok(s) = std::str::from_utf8(&buf[..2 * bytes.len()]) {
            return s.to_owned();
        }
    }
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    out
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

#[cfg(test)]
mod tests {
    use super::to_hex;

    proptest::proptest! {
        /// Bytes of any length spell as the `hex` crate spells them (lowercase, two digits a
        /// byte), so the stored keys, the session hashes and the ids the status page shows do
        /// not change.
        #[test]
        fn bytes_spell_as_hex_encode(id in proptest::collection::vec(proptest::num::u8::ANY, 0..40)) {
            proptest::prop_assert_eq!(to_hex(&id), hex::encode(&id));
        }
    }
}
