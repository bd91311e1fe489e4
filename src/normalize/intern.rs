//! A per-thread interner for the low-cardinality strings of the evidence model (tool names, server
//! addresses, protocol versions, methods): the hot path pays a hash lookup instead of an allocation
//! and a redaction check per span. Request ids and session ids are unique per call and are never
//! interned here (that would grow without bound; session ids have their own table, [`session`]). Each thread's table is capped: past its capacity the
//! oldest name is forgotten and counted as `interner`, which keeps it bounded under a flood of
//! distinct names.

use std::cell::RefCell;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use rustc_hash::FxHasher;

use super::redact;
use crate::bounded::BoundedMap;

/// Names a thread's table keeps until told otherwise (`processors.mcp_health.limits.interner`'s
/// default).
pub(crate) const DEFAULT_CAPACITY: usize = 4096;

/// Size this thread's table (a receiving thread, from its component's settings, at each batch: a
/// change costs nothing when the size is the same).
pub(crate) fn fit(cap: usize) {
    TABLE.with(|t| {
        let mut t = t.borrow_mut();
        if t.capacity() != cap {
            t.set_capacity(cap);
        }
    })
}

struct Entry {
    kind: u8,
    raw: Box<str>,
    extra: i64,
    value: Arc<str>,
}

thread_local! {
    static TABLE: RefCell<BoundedMap<u64, Entry>> = RefCell::new(BoundedMap::with_capacity("interner", DEFAULT_CAPACITY));
}

/// What is being interned; part of the key so a tool and a server of the same name stay apart.
#[derive(Clone, Copy)]
pub enum Kind {
    Tool = 1,
    Server = 2,
    Version = 3,
    Service = 5,
}

/// The redacted, shared form of `raw` (with `extra`, e.g. a port, as part of the key).
pub fn intern(kind: Kind, raw: &str, extra: Option<i64>, make: impl FnOnce() -> String) -> Arc<str> {
    let extra_v = extra.unwrap_or(i64::MIN);
    let mut h = FxHasher::default();
    (kind as u8).hash(&mut h);
    raw.hash(&mut h);
    extra_v.hash(&mut h);
    let key = h.finish();
    TABLE.with(|t| {
        let mut t = t.borrow_mut();
        if let Some(e) = t.get(&key) {
            if e.kind == kind as u8 && &*e.raw == raw && e.extra == extra_v {
                return e.value.clone();
            }
        }
        let made = make();
        // Each kind through its safe vocabulary: labels and identifiers never carry free text.
        let value: Arc<str> = Arc::from(match kind {
            Kind::Tool => redact::tool_name(&made),
            Kind::Server => redact::address(&made),
            Kind::Version | Kind::Service => redact::ident(&made),
        });
        t.insert(key, Entry { kind: kind as u8, raw: raw.into(), extra: extra_v, value: value.clone() });
        value
    })
}

thread_local! {
    static SESSIONS: RefCell<BoundedMap<u64, Arc<str>>> = RefCell::new(BoundedMap::with_capacity("session_interner", SESSION_CAPACITY));
}

/// Session ids each thread keeps shared: the sessions active now (a session spans many calls,
/// each of several spans). A table of their own, so a flood of sessions never pushes tool and
/// server names out.
const SESSION_CAPACITY: usize = 4096;

/// A session id as kept in evidence (raw: it is hashed wherever it is emitted), shared between
/// the spans of a session instead of one allocation per span.
pub(crate) fn session(raw: &str) -> Arc<str> {
    let mut h = FxHasher::default();
    raw.hash(&mut h);
    let key = h.finish();
    SESSIONS.with(|t| {
        let mut t = t.borrow_mut();
        if let Some(v) = t.get(&key) {
            if &**v == raw {
                return v.clone();
            }
        }
        let v: Arc<str> = Arc::from(raw);
        t.insert(key, v.clone());
        v
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_input_same_arc_and_kinds_stay_apart() {
        let a = intern(Kind::Tool, "create_ticket", None, || "create_ticket".into());
        let b = intern(Kind::Tool, "create_ticket", None, || unreachable!("cached"));
        assert!(Arc::ptr_eq(&a, &b));
        let s = intern(Kind::Server, "create_ticket", Some(1), || "create_ticket:1".into());
        assert_eq!(&*s, "create_ticket:1");
        let secret = intern(Kind::Tool, "Bearer abcdef", None, || "Bearer abcdef".into());
        assert!(secret.starts_with("sha256:"), "redaction still applies");
    }
}
