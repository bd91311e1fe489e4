//! The read groups: the shared parts (sessions, parked verifiers) of the chains just decided are
//! read off the engine's path, the batches decided meanwhile gathering into one read, and the
//! chains are classified in the order decided once their group's answer is back. Also the rare
//! read of decided chains a rootless chain looks for.

use std::collections::VecDeque;

use crate::correlate::outbox::FromStore;
use crate::correlate::DecidedCalls;
use crate::evidence::time::Moment;
use crate::evidence::TraceId;
use crate::state::{Record, StoreError, Table};

use super::super::worker::Ticket;
use super::super::{Batch, Tables};
use super::sessions::session_keys;
use super::Shared;
use std::time::Duration;

/// Decided chains awaiting the read of their shared parts, at most; past it the engine waits
/// for the store (counted in `store_queue_waits`).
const MAX_AWAITING_CHAINS: usize = 20_000;
/// A read group gathers the batches decided for this long (of engine time, and never longer
/// than `answer_within`) or until it names this many keys before it is asked for: one round
/// trip, one wake of the store's thread and one answer for ten steps of a busy engine instead
/// of one each, for at most this much later a verdict.
const GATHER_FOR: Duration = Duration::from_millis(10);
const GATHER_KEYS: usize = 256;

/// Decided chains waiting for the read of their group.
struct Awaiting {
    batch: Batch,
    group: u64,
}

/// One read of the shared parts (sessions, parked verifiers) of the batches decided since the
/// last: at most one is in flight; the batches decided meanwhile gather in the next, so the
/// reads coalesce when the store is slower than the engine's steps.
struct ReadGroup {
    id: u64,
    /// When its first batch was decided (its answer is due `answer_within` after).
    at: Moment,
    /// The keys its batches named: sorted and deduplicated once the group is asked for (and
    /// with its read while that is in flight).
    parked: Vec<String>,
    sessions: Vec<String>,
    /// The read asked for; it hands the keys back with its answer (they went to the store's
    /// thread, not a copy of them).
    ticket: Option<Ticket<(Asks, StepRead)>>,
}

/// What a group asks for: its parked verifiers' keys, then its sessions'.
type Asks = Vec<(Table, Vec<String>)>;

/// A group's read: parked verifiers and sessions, in one round trip.
pub(super) type StepRead = Result<Vec<Vec<Option<Record>>>, StoreError>;

/// The read groups' own state: the batches awaiting their group's answer, in the order decided.
#[derive(Default)]
pub(super) struct ReadGroups {
    awaiting: VecDeque<Awaiting>,
    /// The reads of the awaiting batches: the first in flight, the last gathering.
    groups: VecDeque<ReadGroup>,
    next_group: u64,
    /// Chains awaiting (bounded by MAX_AWAITING_CHAINS), and how often the bound made the
    /// engine wait.
    awaiting_chains: usize,
    awaiting_waits: u64,
}

impl ReadGroups {
    /// Batches are awaiting their group's answer.
    pub(super) fn awaiting(&self) -> bool {
        !self.awaiting.is_empty()
    }

    /// How often the bound on awaiting chains made the engine wait for the store.
    pub(super) fn waits(&self) -> u64 {
        self.awaiting_waits
    }
}

impl Shared {
    /// A group's read is back: the verifiers other instances parked under its calls' operation
    /// keys are taken in (a verifier that reported before its call, elsewhere, still revises it;
    /// the revisions join the group's last batch), and its tool calls' sessions merged as every
    /// instance wrote them (a session's signal may have gone to another instance in another
    /// trace).
    fn take_group_read(&mut self, t: &mut Tables, group: ReadGroup, read: StepRead, batches: &mut [Batch]) {
        let mut tables = match read {
            Ok(r) => {
                self.link.down = false;
                r.into_iter()
            }
            Err(e) => {
                self.link.failed();
                tracing::warn!(error = %e, "could not read parked verifiers and sessions from the state store");
                return;
            }
        };
        let (parked, sessions) = (tables.next().unwrap_or_default(), tables.next().unwrap_or_default());
        // Chains the parked verifiers revised may name sessions the read did not (the group's
        // sessions are every key its batches named, sorted): those are read now.
        let mut missing: Vec<String> = Vec::new();
        if let Some((now, decided)) = batches.last_mut() {
            let mut more = Vec::new();
            for r in parked.into_iter().flatten() {
                if let Record::Parked(r) = r {
                    for v in r.verifiers {
                        t.chains.take_in(FromStore::Verifier(v), *now, &mut more);
                    }
                }
            }
            missing = session_keys(&more).into_iter().filter(|k| group.sessions.binary_search(k).is_err()).collect();
            missing.sort_unstable();
            missing.dedup();
            decided.extend(more);
        }
        self.merge_sessions(t, &group.sessions, sessions);
        if !missing.is_empty() {
            let keys = missing.clone();
            let r = self.link.call(move |s| Ok(s.get_many(Table::Sessions, &keys)));
            self.take_sessions(t, &missing, r.and_then(|r| r));
        }
    }

    /// Submit the first group not yet asked for, when none is in flight.
    /// (Not yet while it gathers, unless `settle`: every answer awaited is to be taken now.)
    fn submit_group(&mut self, now: Moment, settle: bool) {
        if self.reads.groups.iter().any(|g| g.ticket.is_some()) {
            return;
        }
        let within = GATHER_FOR.min(self.answer_within);
        let Some(g) = self.reads.groups.iter_mut().next() else { return };
        if !settle && now.saturating_duration_since(g.at) < within && g.parked.len() + g.sessions.len() < GATHER_KEYS {
            return;
        }
        g.parked.sort_unstable();
        g.parked.dedup();
        g.sessions.sort_unstable();
        g.sessions.dedup();
        let asks = vec![(Table::Parked, std::mem::take(&mut g.parked)), (Table::Sessions, std::mem::take(&mut g.sessions))];
        g.ticket = Some(self.link.worker.submit(move |s| {
            let read = s.get_tables(&asks);
            (asks, read)
        }));
    }

    /// Chains just decided join the read group not yet asked for (or open one); a batch that
    /// names no shared part, with none awaiting before it, is ready at once.
    pub(super) fn admit_batch(&mut self, batch: Batch, ready: &mut Vec<Batch>) {
        if batch.1.is_empty() {
            return;
        }
        let parked: Vec<String> =
            batch.1.iter().flat_map(|d| d.calls.iter()).filter_map(|c| c.operation_key.as_deref()).map(str::to_string).collect();
        let sessions = session_keys(&batch.1);
        if parked.is_empty() && sessions.is_empty() && self.reads.awaiting.is_empty() {
            ready.push(batch);
            return;
        }
        // Join the group not yet asked for, or open one.
        if self.reads.groups.back().is_none_or(|g| g.ticket.is_some()) {
            self.reads.next_group += 1;
            self.reads.groups.push_back(ReadGroup {
                id: self.reads.next_group,
                at: batch.0,
                parked: Vec::new(),
                sessions: Vec::new(),
                ticket: None,
            });
        }
        let Some(g) = self.reads.groups.back_mut() else { return };
        // Sorted and deduplicated once, when the group is asked for: a group gathers many
        // batches while the store is busy, and sorting its keys again at each was most of what
        // this cost the engine.
        g.parked.extend(parked);
        g.sessions.extend(sessions);
        let group = g.id;
        let at = batch.0;
        self.reads.awaiting_chains += batch.1.len();
        self.reads.awaiting.push_back(Awaiting { batch, group });
        self.submit_group(at, false);
    }

    /// The batches whose group's answer is back go to `ready`, in the order decided (a revision
    /// is classified after what it revises); `settle`: every one awaited, waited for.
    pub(super) fn take_answered_groups(&mut self, t: &mut Tables, now: Moment, settle: bool, ready: &mut Vec<Batch>) {
        loop {
            self.submit_group(now, settle || self.reads.awaiting_chains > MAX_AWAITING_CHAINS);
            let Some(g) = self.reads.groups.front() else { break };
            let Some(ticket) = g.ticket.as_ref() else { break };
            if !self.link.worker.has(ticket) {
                // Bounded: past MAX_AWAITING_CHAINS the engine waits for the store (counted).
                let over = self.reads.awaiting_chains > MAX_AWAITING_CHAINS;
                if !settle && !over && !self.due(g.at) {
                    break;
                }
                if over {
                    self.reads.awaiting_waits += 1;
                }
                self.link.worker.wait(ticket);
            }
            let Some(mut g) = self.reads.groups.pop_front() else { break };
            let read = match g.ticket.take().and_then(|tk| self.link.worker.take(tk)) {
                Some((mut asks, read)) => {
                    if let Some((_, sessions)) = asks.pop() {
                        g.sessions = sessions;
                    }
                    read
                }
                None => Err(StoreError::Backend("the store's thread has ended".into())),
            };
            let mut batches = Vec::new();
            while self.reads.awaiting.front().is_some_and(|a| a.group == g.id) {
                if let Some(a) = self.reads.awaiting.pop_front() {
                    self.reads.awaiting_chains -= a.batch.1.len();
                    batches.push(a.batch);
                }
            }
            self.take_group_read(t, g, read, &mut batches);
            ready.extend(batches);
        }
    }

    /// Chains in flight here whose root never came look for their trace among the store's decided
    /// chains, once each: an instance that stopped (or lost the trace to the collector's ring)
    /// decided the call — partial, at its drain — and this is the rest of its evidence. Found,
    /// the call is revised (one attempt), as one process would have revised it.
    pub(super) fn adopt_rootless(&mut self, t: &mut Tables, now: Moment, ids: Vec<TraceId>, decided: &mut Vec<DecidedCalls>) {
        if ids.is_empty() {
            return;
        }
        let keys: Vec<String> = ids.iter().map(crate::state::trace_key).collect();
        let records = match self.link.call(move |s| s.get_many(Table::Decided, &keys)) {
            Ok(r) => r,
            Err(e) => {
                self.link.failed();
                tracing::warn!(error = %e, "could not look for decided chains in the state store");
                return;
            }
        };
        for (id, r) in ids.into_iter().zip(records) {
            let Some(Record::Decided(r)) = r else { continue };
            if r.trace_id != id {
                continue;
            }
            self.link.taken_over += 1;
            t.restored.insert(id);
            t.chains.take_in(FromStore::Adopt((*r).into()), now, decided);
        }
    }
}
