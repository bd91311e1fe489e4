//! Sessions shared between instances: read back, merged into the engine's own, and the sessions
//! this engine calls `converged` refreshed in turn (another instance may hold the signal that makes
//! one stale).

use crate::correlate::outbox::{ReadBack, SessionBack};
use crate::correlate::DecidedCalls;
use crate::evidence::{Method, SessionName, Side};
use crate::state::{Record, StoreError, Table};

use super::super::worker::Ticket;
use super::super::Tables;
use super::Shared;
use crate::evidence::time::Moment;

/// Converged sessions read back from the store per re-evaluation (one pipeline).
const CONVERGED_REFRESH: usize = 512;

/// Sessions read (`keys[i]` ↔ `records[i]`).
type SessionsRead = (Vec<String>, Result<Vec<Option<Record>>, StoreError>);

/// The session reads' own state: the converged sessions' read in flight and where the next
/// starts.
#[derive(Default)]
pub(super) struct SessionReads {
    converged_read: Option<(Moment, Ticket<SessionsRead>)>,
    refresh_cursor: usize,
}

impl Shared {
    /// Merge sessions read from the store (`keys[i]` ↔ `records[i]`).
    pub(super) fn merge_sessions(&mut self, t: &mut Tables, keys: &[String], records: Vec<Option<Record>>) {
        for (key, r) in keys.iter().zip(records) {
            if let Some(Record::Session(r)) = r {
                t.sessions.restore(SessionBack::Merged(key, (*r).into()));
            }
        }
    }

    /// Sessions read: merged; a failure marks the store down and is counted.
    pub(super) fn take_sessions(&mut self, t: &mut Tables, keys: &[String], read: Result<Vec<Option<Record>>, StoreError>) {
        match read {
            Ok(records) => {
                self.link.down = false;
                self.merge_sessions(t, keys, records);
            }
            Err(e) => {
                self.link.failed();
                tracing::warn!(error = %e, sessions = keys.len(), "could not read sessions from the state store");
            }
        }
    }

    /// Read back up to [`CONVERGED_REFRESH`] of the sessions this engine calls `converged` (in
    /// turn, one pipelined read): another instance may hold the signal that makes one stale,
    /// with nothing more of that session coming here to make this engine look again.
    pub(super) fn refresh_converged(&mut self, t: &mut Tables, wait: bool) {
        if self.sessions.converged_read.is_none() {
            let keys = t.sessions.to_read_back(ReadBack::Converged { limit: CONVERGED_REFRESH, from: self.sessions.refresh_cursor });
            self.sessions.refresh_cursor = self.sessions.refresh_cursor.wrapping_add(keys.len());
            if !keys.is_empty() {
                let ticket = self.link.worker.submit(move |s| {
                    let r = s.get_many(Table::Sessions, &keys);
                    (keys, r)
                });
                self.sessions.converged_read = Some((self.now, ticket));
            }
        }
        self.take_converged(t, wait);
    }

    pub(super) fn take_converged(&mut self, t: &mut Tables, wait: bool) {
        let Some((at, r)) = self.sessions.converged_read.take() else { return };
        if wait || self.due(at) {
            self.link.worker.wait(&r);
        }
        if !self.link.worker.has(&r) {
            self.sessions.converged_read = Some((at, r));
            return;
        }
        if let Some((keys, read)) = self.link.worker.take(r) {
            self.take_sessions(t, &keys, read);
        }
    }
}

/// The sessions of the tool calls in `decided`, in no order, a key repeated only when calls
/// of other sessions came between (a read group sorts and deduplicates its keys once, when it
/// is asked for).
///
/// Calls are many and sessions few, and the calls of one session come in runs: a key is built
/// once per run, and a run costs one comparison per call, not a hash.
pub(super) fn session_keys(decided: &[DecidedCalls]) -> Vec<String> {
    let mut keys = Vec::new();
    let mut last: Option<SessionName> = None;
    for c in decided.iter().flat_map(|d| d.calls.iter()).filter(|c| c.method == Some(Method::ToolsCall)) {
        let side = if c.client_seen { Side::Client } else { Side::Server };
        let Some(name) = SessionName::of(c.session_id.as_deref(), c.service.as_deref(), c.server.as_deref(), side) else { continue };
        if last != Some(name) {
            keys.push(name.key());
        }
        last = Some(name);
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evidence::call::CallEvidence;
    use std::sync::Arc;

    /// The keys are the keys of every call, once per run of calls with the same one.
    #[test]
    fn session_keys_are_every_calls_key_once_per_run() {
        let call = |session: Option<&str>, service: Option<&str>, server: Option<&str>, client: bool, tool: bool| CallEvidence {
            method: tool.then_some(Method::ToolsCall),
            session_id: session.map(Arc::from),
            service: service.map(Arc::from),
            server: server.map(Arc::from),
            client_seen: client,
            ..Default::default()
        };
        let calls = [
            call(Some("s1"), Some("a"), Some("x"), true, true),
            call(Some("s1"), Some("b"), None, false, true),
            call(None, Some("a"), Some("x"), true, true),
            call(None, Some("a"), Some("x"), false, true),
            call(None, None, Some("y"), true, true),
            call(Some("s2"), None, None, true, false),
            call(Some("s0"), None, None, false, true),
        ];
        let mut want: Vec<String> =
            calls.iter().filter(|c| c.method == Some(Method::ToolsCall)).filter_map(CallEvidence::session_key).collect();
        want.sort();
        want.dedup();
        let decided_of = |trace: u8, calls: Vec<CallEvidence>| DecidedCalls {
            trace_id: [trace; 16],
            calls,
            decision: crate::classify::Decision {
                revision: 0,
                decided_by: crate::verdict::DecidedBy::Quiet,
                root_seen: true,
                truncated: false,
            },
            previous: Vec::new(),
        };
        let decided = vec![decided_of(1, calls[..3].to_vec()), decided_of(2, calls[3..].to_vec())];
        let mut got = session_keys(&decided);
        // Calls 0 and 1 are one run of session s1 (one key); call 3, a server's without a
        // session id, names none.
        assert_eq!(got.len(), want.len(), "a key per run of calls: {got:?}");
        got.sort();
        assert_eq!(got, want);
        // A session named again after another's run is named again.
        let again = decided_of(3, vec![calls[0].clone(), calls[6].clone(), calls[1].clone()]);
        assert_eq!(session_keys(&[again]), ["session:s1", "session:s0", "session:s1"]);
        assert_eq!(want, ["client:?|server:y", "client:a|server:x", "session:s0", "session:s1"]);
    }
}
