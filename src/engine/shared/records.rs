//! What the chains and sessions keep for a store (`correlate::outbox`), as the store's records
//! (`state`), and back. The conversions live beside the replica that writes and reads the
//! records, so `correlate/` names nothing of the stored format (which is versioned, SPEC §7):
//! each record keeps its layout field for field.

use crate::correlate::crossjoin::Half;
use crate::correlate::outbox::{ChainChange, KeptChain, KeptSession};
use crate::evidence::TraceId;
use crate::state::{trace_key, Changes, ClientHalf, DecidedRecord, Record, SessionRecord, Table};

impl From<DecidedRecord> for KeptChain {
    fn from(r: DecidedRecord) -> Self {
        KeptChain {
            trace_id: r.trace_id,
            spans: r.spans,
            root_seen: r.root_seen,
            truncated: r.truncated,
            revision: r.revision,
            decided_at_ns: r.decided_at_ns,
        }
    }
}

impl From<KeptChain> for DecidedRecord {
    fn from(c: KeptChain) -> Self {
        DecidedRecord {
            trace_id: c.trace_id,
            spans: c.spans,
            root_seen: c.root_seen,
            truncated: c.truncated,
            revision: c.revision,
            decided_at_ns: c.decided_at_ns,
        }
    }
}

impl From<SessionRecord> for KeptSession {
    fn from(r: SessionRecord) -> Self {
        KeptSession {
            events: r.events,
            page_requests: r.page_requests,
            last_seen_ns: r.last_seen_ns,
            last: r.last,
            last_activity_ns: r.last_activity_ns,
            server: r.server,
            trace_id: r.trace_id,
            span_id: r.span_id,
            has_ttl: r.has_ttl,
            emitted: r.emitted,
        }
    }
}

impl From<KeptSession> for SessionRecord {
    fn from(s: KeptSession) -> Self {
        SessionRecord {
            events: s.events,
            page_requests: s.page_requests,
            last_seen_ns: s.last_seen_ns,
            last: s.last,
            last_activity_ns: s.last_activity_ns,
            server: s.server,
            trace_id: s.trace_id,
            span_id: s.span_id,
            has_ttl: s.has_ttl,
            emitted: s.emitted,
        }
    }
}

/// The chains' changes as store changes, in their order.
pub(crate) fn chain_changes(changes: Vec<ChainChange>, out: &mut Changes) {
    out.changes.reserve(changes.len());
    for c in changes {
        match c {
            ChainChange::Decided(c) => out.put(trace_key(&c.trace_id), Record::Decided(Box::new(c.into()))),
            ChainChange::Forgotten(id) => out.delete(Table::Decided, trace_key(&id)),
            ChainChange::Operation(key, trace) => out.put(key.into_string(), Record::Operation(trace)),
            ChainChange::OperationGone(key) => out.delete(Table::Operations, key.into_string()),
        }
    }
}

/// The sessions' changes as store changes: put, or deleted when forgotten.
pub(crate) fn session_changes(changes: Vec<(String, Option<KeptSession>)>, out: &mut Changes) {
    for (key, kept) in changes {
        match kept {
            Some(s) => out.put(key, Record::Session(Box::new(s.into()))),
            None => out.delete(Table::Sessions, key),
        }
    }
}

/// The client half of chain `trace` as a shared store lists it. The tool and the join keys are
/// not listed (the record keeps its layout; see [`Half::listed`]).
pub(crate) fn listed_half(trace: TraceId, h: Half) -> ClientHalf {
    ClientHalf {
        trace_id: trace,
        method: h.method,
        request_id: h.request_id,
        start_ns: h.start_ns,
        end_ns: h.end_ns,
        server: h.server,
        session: h.session,
    }
}

/// A client half a shared store listed, and its chain's trace.
pub(crate) fn half_of(c: &ClientHalf) -> (TraceId, Half) {
    (c.trace_id, Half::listed(c.method.clone(), c.request_id.clone(), c.start_ns, c.end_ns, c.server.clone(), c.session.as_deref()))
}
