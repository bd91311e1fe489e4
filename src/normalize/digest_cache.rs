//! The digest cache: contract digests (`crate::evidence::digest`) keyed by a hash of the raw
//! definition bytes, so an unchanged definition is not re-parsed and re-canonicalized (JCS +
//! SHA-256 of a 2 KB definition costs ~100 µs; hashing the raw bytes ~2 µs). It lives here, not in
//! `classify/`, which stays pure (no cache, no global).
//!
//! Bounded: past its capacity the oldest digest is forgotten, counted as `digest_cache`. The
//! receivers use one cache per thread ([`with_thread_cache`], sized by [`fit_thread_cache`]); the
//! tap's observer owns one ([`DigestCache::with_capacity`]).

use std::cell::RefCell;

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::bounded::BoundedMap;
use crate::evidence::digest::{tool_digest, DigestError, ToolDigest};

/// Default capacity (`processors.mcp_health.limits.digest_cache`).
pub(crate) const DEFAULT_CAPACITY: usize = 16_384;

/// See the module documentation.
pub(crate) struct DigestCache {
    map: BoundedMap<[u8; 32], ToolDigest>,
    pub hits: u64,
    pub misses: u64,
}

impl Default for DigestCache {
    fn default() -> Self {
        DigestCache::with_capacity(DEFAULT_CAPACITY)
    }
}

impl DigestCache {
    pub(crate) fn with_capacity(cap: usize) -> Self {
        DigestCache { map: BoundedMap::with_capacity("digest_cache", cap), hits: 0, misses: 0 }
    }

    /// Digest a raw JSON tool definition.
    pub(crate) fn digest_raw(&mut self, raw: &[u8]) -> Result<ToolDigest, DigestError> {
        let key: [u8; 32] = Sha256::digest(raw).into();
        if let Some(d) = self.map.get(&key) {
            self.hits += 1;
            return Ok(d.clone());
        }
        self.misses += 1;
        let v: Value = serde_json::from_slice(raw).map_err(|e| DigestError::Json(e.to_string()))?;
        let d = tool_digest(&v)?;
        self.map.insert(key, d.clone());
        Ok(d)
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}

thread_local! {
    static THREAD_CACHE: RefCell<DigestCache> = RefCell::new(DigestCache::with_capacity(DEFAULT_CAPACITY));
}

/// Size this thread's cache (a receiving thread, from its component's settings, at each batch: a
/// change costs nothing when the size is the same).
pub(crate) fn fit_thread_cache(cap: usize) {
    THREAD_CACHE.with(|c| {
        let mut c = c.borrow_mut();
        if c.map.capacity() != cap {
            c.map.set_capacity(cap);
        }
    })
}

/// Run `f` with this thread's cache.
pub(crate) fn with_thread_cache<R>(f: impl FnOnce(&mut DigestCache) -> R) -> R {
    THREAD_CACHE.with(|c| f(&mut c.borrow_mut()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evidence::digest::PROJECTION_VERSION;

    #[test]
    fn digest_ignores_order_spacing_icons_and_meta() {
        let a = r#"{"name":"search","description":"Search docs","inputSchema":{"type":"object","properties":{"query":{"type":"string"}},"required":["query"]},"icons":[{"src":"a.png"}]}"#;
        let b = "{ \"inputSchema\" : { \"required\":[\"query\"], \"properties\" : {\"query\":{\"type\":\"string\"}}, \"type\":\"object\" },\n \"description\":\"Search docs\", \"name\":\"search\", \"_meta\": {\"x\": 1}, \"icons\":[{\"src\":\"b.svg\"}] }";
        let mut cache = DigestCache::default();
        let da = cache.digest_raw(a.as_bytes()).unwrap();
        let db = cache.digest_raw(b.as_bytes()).unwrap();
        assert_eq!(da, db);
        assert_eq!(da.projection_version, PROJECTION_VERSION);
        assert!(da.digest.starts_with("sha256:") && da.digest.len() == 7 + 64);
        assert_eq!(cache.misses, 2);
        cache.digest_raw(a.as_bytes()).unwrap();
        assert_eq!(cache.hits, 1, "an unchanged definition is not re-canonicalized");
    }

    #[test]
    fn bad_json_is_an_error() {
        assert!(DigestCache::default().digest_raw(b"{not json").is_err());
    }

    #[test]
    fn a_full_cache_forgets_the_oldest_and_still_answers() {
        let mut cache = DigestCache::with_capacity(2);
        let defs: Vec<String> = (0..3).map(|i| format!(r#"{{"name":"t{i}"}}"#)).collect();
        for d in &defs {
            cache.digest_raw(d.as_bytes()).unwrap();
        }
        assert_eq!(cache.len(), 2);
        let again = cache.digest_raw(defs[0].as_bytes()).unwrap();
        assert_eq!(again.name, "t0");
        assert_eq!((cache.hits, cache.misses), (0, 4), "t0 had been evicted and is digested again");
    }
}
