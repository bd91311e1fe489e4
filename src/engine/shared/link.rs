//! What every store-backed replica does the same way: load at start, take back decided chains
//! the engine no longer holds, and count what failed.

use crate::classify::incidents::IncidentsBack;
use crate::correlate::outbox::{KeptChain, Restore, SessionBack};
use crate::correlate::takeback::StoreReads;
use crate::evidence::{SpanEvidence, TraceId};
use crate::state::{trace_key, Record, Snapshot, StoreError, Table};
use rustc_hash::FxHashSet;

use super::worker::Worker;
use super::Tables;

/// The engine's link to its store: the worker that runs the calls, and what they cost.
pub(crate) struct Link {
    pub worker: Worker,
    /// The store's last operation failed (a conflict is not a failure: the store answered).
    pub down: bool,
    pub errors: u64,
    pub conflicts: u64,
    /// Decided chains taken from the store for evidence that came here.
    pub taken_over: u64,
    /// Stored records the load could not read, by table and reason.
    pub skipped: crate::state::SkipCounts,
}

impl Link {
    pub(crate) fn new(worker: Worker) -> Self {
        Link { worker, down: false, errors: 0, conflicts: 0, taken_over: 0, skipped: Default::default() }
    }

    /// A store operation failed: counted, and the store is down until one succeeds.
    pub(crate) fn failed(&mut self) {
        self.errors += 1;
        self.down = true;
    }

    /// Run `job` and wait for it: for the rare reads whose answer the step needs now.
    pub(crate) fn call<T: Send + 'static>(
        &mut self,
        job: impl FnOnce(&mut dyn crate::state::StateStore) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.worker.call(job).unwrap_or_else(|| Err(StoreError::Backend("the store's thread has ended".into())))
    }

    /// One record, waiting for it; the store's answer marks it up or down.
    pub(crate) fn get(&mut self, table: Table, key: String) -> Result<Option<Record>, StoreError> {
        let r = self.call(move |s| s.get(table, &key));
        match &r {
            Ok(_) => self.down = false,
            Err(_) => self.failed(),
        }
        r
    }

    /// Load every record and put it back into the engine's tables. A record that cannot be
    /// read is skipped, named in the log and counted, the rest loaded; a store that cannot be
    /// read at all leaves the engine empty (nothing is judged from a state that could not be read).
    ///
    /// `own`: only this process writes the store (the embedded one). The decided chains the load
    /// holds neither whole nor by trace are then deleted: nothing would delete them later (a
    /// chain is deleted when the engine forgets it, and the engine never knew these), so a store
    /// a killed process left under heavy load kept them for good. A shared store's belong to
    /// their writers, which delete them or let their lifetime end them.
    pub(crate) fn load(&mut self, t: &mut Tables, own: bool) {
        let (keep, forgotten) = t.chains.decided_bounds();
        let bound = crate::state::DecidedBound { keep, forgotten, name_let_go: own };
        match self.call(move |s| s.load_into(crate::state::Snapshot::bounded(bound))) {
            Ok(snap) => {
                for s in &snap.skipped {
                    self.skipped.add(s.table, s.why);
                }
                restore(t, snap)
            }
            Err(e) => {
                self.failed();
                tracing::error!(error = %e, "could not load the state store; starting with empty state");
            }
        }
    }

    /// Before a batch is taken in: the decided chains its evidence revises that the store holds
    /// and the engine does not (see [`Chains::take_back`](crate::correlate::Chains::take_back)), read now and waited for (rare).
    pub(crate) fn take_back(&mut self, t: &mut Tables, spans: &[SpanEvidence]) {
        t.chains.take_back(spans, &mut Reads { link: self, restored: t.restored });
    }

    /// A decided chain another instance wrote, taken into the engine's chains (a client half's,
    /// a parked verifier's call): whether the store had it; `None` when the store failed.
    pub(crate) fn take_decided(&mut self, t: &mut Tables, trace: TraceId, what: &str) -> Option<bool> {
        match self.get(Table::Decided, trace_key(&trace)) {
            Ok(Some(Record::Decided(r))) if !t.chains.past_window(r.decided_at_ns) => {
                self.taken_over += 1;
                t.restored.insert(trace);
                t.chains.restore(Restore::Decided((*r).into()));
                Some(true)
            }
            Ok(_) => Some(false),
            Err(e) => {
                tracing::warn!(error = %e, "could not take {what} from the state store");
                None
            }
        }
    }
}

/// The chains' reads as a batch comes in ([`StoreReads`]): a store that fails is logged and
/// counted, and the evidence taken as without a store.
struct Reads<'a> {
    link: &'a mut Link,
    restored: &'a mut crate::bounded::BoundedSet<TraceId>,
}

impl StoreReads for Reads<'_> {
    fn spilled(&mut self, trace: TraceId) -> Option<KeptChain> {
        match self.link.get(Table::Decided, trace_key(&trace)) {
            Ok(Some(Record::Decided(r))) => Some((*r).into()),
            Ok(_) => None,
            Err(e) => {
                // The evidence is then late for a forgotten chain, as without a store.
                tracing::warn!(error = %e, "could not read a decided chain back from the state store");
                None
            }
        }
    }

    fn decided(&mut self, trace: TraceId, past: &dyn Fn(u64) -> bool) -> Option<KeptChain> {
        match self.link.get(Table::Decided, trace_key(&trace)) {
            Ok(Some(Record::Decided(r))) if !past(r.decided_at_ns) => {
                self.link.taken_over += 1;
                // Its earlier evidence comes with it: not "before the start".
                self.restored.insert(trace);
                Some((*r).into())
            }
            Ok(_) => None,
            Err(e) => {
                tracing::warn!(error = %e, "could not look for a decided chain in the state store");
                None
            }
        }
    }

    fn operation(&mut self, key: &str) -> Option<TraceId> {
        match self.link.get(Table::Operations, key.to_string()) {
            Ok(Some(Record::Operation(trace))) => Some(trace),
            Ok(_) => None,
            Err(e) => {
                tracing::warn!(error = %e, "could not look for an operation key in the state store");
                None
            }
        }
    }
}

/// Put a snapshot back into the engine's tables.
fn restore(t: &mut Tables, mut snap: Snapshot) {
    let counts = (snap.sessions.len(), snap.incidents.len(), snap.decided.len(), snap.forgotten.len(), snap.decided_read);
    /// The first skipped records are named one by one; past these, a count.
    const NAMED: usize = 32;
    for s in snap.skipped.iter().take(NAMED) {
        match s.why {
            crate::state::SkipReason::Damaged => {
                tracing::warn!(table = s.table.as_str(), key = %crate::state::shown_key(s.table, &s.key), "a state record could not be read: skipped, the rest loaded");
            }
            crate::state::SkipReason::Newer(version) => {
                tracing::warn!(table = s.table.as_str(), key = %crate::state::shown_key(s.table, &s.key), version, "a state record was written by a newer build: left as it is, not read");
            }
        }
    }
    if snap.skipped.len() > NAMED {
        tracing::warn!(more = snap.skipped.len() - NAMED, "more state records could not be read: skipped");
    }
    let skipped = snap.skipped.len();
    for (key, r) in snap.sessions {
        t.sessions.restore(SessionBack::Loaded(key, r.into()));
    }
    for part in snap.incidents {
        t.incidents.restore(IncidentsBack::Stored(part));
    }
    // Oldest first, so the late-span window and `max_decided` forget them in order: those the
    // load left in the store (older than every one it kept), then those it kept.
    snap.forgotten.sort_by_key(|d| (d.decided_at_ns, d.trace_id));
    for d in snap.forgotten {
        t.restored.insert(d.trace_id);
        t.chains.restore(Restore::Forgotten { trace_id: d.trace_id, decided_at_ns: d.decided_at_ns, operation_keys: d.operation_keys });
    }
    snap.decided.sort_by_key(|d| (d.decided_at_ns, d.trace_id));
    for d in snap.decided {
        t.restored.insert(d.trace_id);
        t.chains.restore(Restore::Decided(d.into()));
    }
    // The chains past the load's bound, and their calls' operation keys, deleted with the next
    // write round (named only for a store this process alone writes).
    let let_go: FxHashSet<TraceId> = snap.let_go.iter().copied().collect();
    for trace in snap.let_go {
        t.chains.restore(Restore::LetGo(trace));
    }
    for (key, trace) in snap.operations {
        match let_go.contains(&trace) {
            true => t.chains.restore(Restore::OperationGone(key.into())),
            false => t.chains.restore(Restore::Operation(key.into(), trace)),
        }
    }
    for d in snap.drift_reported {
        t.drift_reported.insert((d.server, d.tool, d.digest));
    }
    // Marked long enough ago to have settled: the instances that hold halves of these servers
    // have read the marks.
    for s in snap.splits {
        t.chains.restore(Restore::Mark(s.server));
    }
    tracing::info!(
        sessions = counts.0,
        incidents = counts.1,
        decided = counts.2,
        decided_forgotten = counts.3,
        decided_let_go = let_go.len(),
        decided_read = counts.4,
        skipped,
        "state loaded from the store"
    );
}
