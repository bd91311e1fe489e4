//! The shared lists: refused-looking HTTP spans (`refusals`), client halves of split calls
//! (`client_halves`) and verifiers parked before their call (`parked_verifiers`). Published
//! with each write round (read, merged, compare-and-set; the writer deletes its own after
//! `late_span_window`), and read where a decision needs them.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use rustc_hash::FxHashMap;

use crate::correlate::outbox::{FromStore, Paced, Restore};
use crate::correlate::{crossjoin, DecidedCalls};
use crate::evidence::time::Moment;
use crate::evidence::{SpanEvidence, TraceId};
use crate::state::{Changes, ClientHalf, Record, Table};

use super::super::records::{half_of, listed_half};
use super::super::Tables;
use super::{prepend, Shared};

/// Refused-looking HTTP spans kept per second in the store (the latest go in).
const REFUSALS_PER_SECOND: usize = 256;
/// How long after a refused-looking client request is decided its seconds are still read (an
/// HTTP span routed elsewhere that arrives later still revises it).
const REFUSAL_PULL_RECENT: Duration = Duration::from_secs(10);
/// Most seconds of refusals read in one step, and how often they are read at most.
const REFUSAL_SECONDS_PER_PULL: usize = 64;
const REFUSAL_PULL_EVERY: Duration = Duration::from_millis(20);
/// Verifiers kept per operation key in the store (as `chains`' own bound per key).
const MAX_SHARED_PARKED_PER_KEY: usize = 16;

/// One shared list's items by key, and the keys this instance wrote that expired.
pub(super) struct ListJob<T> {
    table: Table,
    by_key: BTreeMap<String, Vec<T>>,
    expired: Vec<(Moment, String)>,
}

/// The list records this instance wrote, oldest first: each write of a key is queued with its
/// time and the key's latest write is indexed, so an entry whose key was written again later is
/// passed over when it comes to the front (no scan of the queue per write).
#[derive(Default)]
struct OwnRecords {
    order: VecDeque<(Moment, String)>,
    latest: FxHashMap<String, Moment>,
}

/// The shared lists' own state: what is to be published (kept across a failed write), the
/// records this instance wrote, and when the lists were last read.
pub(super) struct SharedLists {
    late_span_window: Duration,
    /// Orphans, client halves and parked verifiers to publish (kept across a failed write).
    orphans: Vec<SpanEvidence>,
    halves: Vec<ClientHalf>,
    parked: Vec<(Box<str>, SpanEvidence)>,
    /// The list records this instance wrote and when (deleted `late_span_window` after).
    written: FxHashMap<Table, OwnRecords>,
    last_refusal_pull: Option<Moment>,
    /// The last look for parked verifiers' calls (`find_parked_calls`).
    last_parked_lookup: Option<Moment>,
}

impl SharedLists {
    pub(super) fn new(late_span_window: Duration) -> Self {
        SharedLists {
            late_span_window,
            orphans: Vec::new(),
            halves: Vec::new(),
            parked: Vec::new(),
            written: FxHashMap::default(),
            last_refusal_pull: None,
            last_parked_lookup: None,
        }
    }
}

impl<T> ListJob<T> {
    /// The keys of the records this job adds to (to read them first).
    pub(super) fn keys(&self) -> Vec<String> {
        self.by_key.keys().cloned().collect()
    }
}

impl Shared {
    pub(super) fn refusals_job(&mut self, published: Vec<SpanEvidence>, now: Moment) -> ListJob<SpanEvidence> {
        self.lists.orphans.extend(published);
        let over = self.lists.orphans.len().saturating_sub(crossjoin::MAX_ORPHANS);
        self.lists.orphans.drain(..over);
        let mut by_key: BTreeMap<String, Vec<SpanEvidence>> = BTreeMap::new();
        for o in self.lists.orphans.drain(..) {
            by_key.entry(crate::state::refusal_key(o.start_ns / 1_000_000_000)).or_default().push(o);
        }
        self.list_job(Table::Refusals, now, by_key)
    }

    pub(super) fn halves_job(&mut self, published: Vec<(TraceId, crossjoin::Half)>, now: Moment) -> ListJob<ClientHalf> {
        self.lists.halves.extend(published.into_iter().map(|(id, h)| listed_half(id, h)));
        let over = self.lists.halves.len().saturating_sub(crossjoin::MAX_ORPHANS);
        self.lists.halves.drain(..over);
        let mut by_key: BTreeMap<String, Vec<ClientHalf>> = BTreeMap::new();
        for h in self.lists.halves.drain(..) {
            by_key.entry(crossjoin::shared_half_key(&h.method, &h.request_id, h.start_ns / 1_000_000_000)).or_default().push(h);
        }
        self.list_job(Table::Halves, now, by_key)
    }

    pub(super) fn parked_job(&mut self, published: Vec<(Box<str>, SpanEvidence)>, now: Moment) -> ListJob<SpanEvidence> {
        self.lists.parked.extend(published);
        let mut by_key: BTreeMap<String, Vec<SpanEvidence>> = BTreeMap::new();
        for (k, v) in self.lists.parked.drain(..) {
            by_key.entry(k.into_string()).or_default().push(v);
        }
        self.list_job(Table::Parked, now, by_key)
    }

    /// A list's items by key, with the records this instance wrote more than `late_span_window`
    /// ago to delete (unless written again now).
    fn list_job<T>(&mut self, table: Table, now: Moment, by_key: BTreeMap<String, Vec<T>>) -> ListJob<T> {
        let window = self.lists.late_span_window;
        let written = self.lists.written.entry(table).or_default();
        let mut expired: Vec<(Moment, String)> = Vec::new();
        while written.order.front().is_some_and(|(at, _)| now.saturating_duration_since(*at) > window) {
            let Some((at, k)) = written.order.pop_front() else { break };
            if written.latest.get(&k) != Some(&at) {
                // Written again since: that later entry decides.
                continue;
            }
            written.latest.remove(&k);
            if !by_key.contains_key(&k) {
                expired.push((at, k));
            }
        }
        ListJob { table, by_key, expired }
    }

    /// A list's write answered: the records written are remembered (to delete them later);
    /// the items of a refused record, or of a write that failed, are returned to publish again.
    fn list_done<T>(&mut self, (job, read_ok): (ListJob<T>, bool), refused: Option<&[(Table, String)]>, now: Moment) -> Vec<T> {
        let written = self.lists.written.entry(job.table).or_default();
        if !read_ok {
            // Nothing of it was asked of the store: the expired records are deleted next time.
            for (at, k) in job.expired.into_iter().rev() {
                written.latest.insert(k.clone(), at);
                written.order.push_front((at, k));
            }
            return job.by_key.into_values().flatten().collect();
        }
        let Some(refused) = refused else { return job.by_key.into_values().flatten().collect() };
        let mut again = Vec::new();
        for (key, mine) in job.by_key {
            if refused.iter().any(|(t, k)| *t == job.table && *k == key) {
                self.link.conflicts += 1;
                again.extend(mine);
            } else {
                written.latest.insert(key.clone(), now);
                written.order.push_back((now, key));
            }
        }
        again
    }

    /// A round's write answered for the three lists: the records written remembered, the items
    /// of a refused record (or of a write that failed) held to publish again.
    pub(super) fn lists_written(
        &mut self,
        refusals: (ListJob<SpanEvidence>, bool),
        halves: (ListJob<ClientHalf>, bool),
        parked: (ListJob<SpanEvidence>, bool),
        refused: Option<&[(Table, String)]>,
        now: Moment,
    ) {
        let again = self.list_done(refusals, refused, now);
        prepend(&mut self.lists.orphans, again);
        let again = self.list_done(halves, refused, now);
        prepend(&mut self.lists.halves, again);
        let again = self.list_done(parked, refused, now);
        prepend(&mut self.lists.parked, again.into_iter().filter_map(|v| Some((v.operation_key.clone()?, v))).collect());
    }

    /// The shared lists' looks that are due: refusals at most every [`REFUSAL_PULL_EVERY`]
    /// (always at the drain, `all`), parked verifiers' calls at most every `PERSIST_EVERY` (not
    /// at the drain).
    pub(super) fn paced_looks(&self, now: Moment, all: bool) -> Paced {
        let since = |at: Option<Moment>, every: Duration| at.is_none_or(|at| now.saturating_duration_since(at) >= every);
        Paced {
            refusals: (all || since(self.lists.last_refusal_pull, REFUSAL_PULL_EVERY))
                .then_some((REFUSAL_PULL_RECENT, REFUSAL_SECONDS_PER_PULL)),
            parked: (!all && since(self.lists.last_parked_lookup, crate::state::PERSIST_EVERY)).then_some(256),
        }
    }

    /// Read the refusals of the seconds in which a refused-looking client request of a chain in
    /// flight (or decided lately) could have been answered (`secs`, see [`Shared::paced_looks`]),
    /// and take them as if they had come here, so the refused-request join sees the HTTP spans
    /// every instance received (one pipelined read).
    pub(super) fn pull_refusals(&mut self, t: &mut Tables, now: Moment, secs: Vec<u64>) {
        if secs.is_empty() {
            return;
        }
        self.lists.last_refusal_pull = Some(now);
        let keys: Vec<String> = secs.iter().map(|s| crate::state::refusal_key(*s)).collect();
        match self.link.call(move |s| s.get_many(Table::Refusals, &keys)) {
            Ok(records) => {
                self.link.down = false;
                for r in records.into_iter().flatten() {
                    if let Record::Refusals(r) = r {
                        for o in r.orphans {
                            t.chains.take_in(FromStore::Orphan(o), now, &mut Vec::new());
                        }
                    }
                }
            }
            Err(e) => {
                self.link.failed();
                tracing::warn!(error = %e, "could not read refusals from the state store");
            }
        }
    }

    /// The server halves about to be decided alone look for their client half among those other
    /// instances published; where exactly one qualifies, its decided chain is taken from the
    /// store, so the server half joins it here and revises its verdict instead of giving one of
    /// its own.
    pub(super) fn join_remote_halves(&mut self, t: &mut Tables, halves: Vec<(TraceId, crossjoin::Half)>) {
        if halves.is_empty() {
            return;
        }
        let mut keys: Vec<String> = halves.iter().flat_map(|(_, h)| crossjoin::shared_half_keys(h)).collect();
        keys.sort();
        keys.dedup();
        let asked = keys.clone();
        let records = match self.link.call(move |s| s.get_many(Table::Halves, &asked)) {
            Ok(r) => r,
            Err(e) => {
                self.link.failed();
                tracing::warn!(error = %e, "could not read client halves from the state store");
                return;
            }
        };
        let listed: FxHashMap<&String, crate::state::HalvesRecord> = keys
            .iter()
            .zip(records)
            .filter_map(|(k, r)| match r {
                Some(Record::Halves(r)) => Some((k, *r)),
                _ => None,
            })
            .collect();
        for (id, h) in halves {
            let mut found: Vec<crate::evidence::TraceId> = Vec::new();
            let mut overflow = false;
            for k in crossjoin::shared_half_keys(&h) {
                let Some(r) = listed.get(&k) else { continue };
                overflow |= r.overflow;
                for c in &r.halves {
                    let (trace, ch) = half_of(c);
                    if trace != id && crossjoin::client_matches(&ch, &h) && !found.contains(&trace) {
                        found.push(trace);
                    }
                }
            }
            if overflow || found.len() != 1 || t.chains.knows(&found[0]) {
                continue;
            }
            let _ = self.link.take_decided(t, found[0], "a client half's chain");
        }
    }

    /// Verifiers parked here (under `keys`, see [`Shared::paced_looks`]) look for their call in
    /// the store's operation index again: the call's instance may have written it after the
    /// verifier came, and decided it before it read what this instance published. A call found
    /// decided is taken from the store and the verifiers join it here (revising it).
    pub(super) fn find_parked_calls(&mut self, t: &mut Tables, now: Moment, keys: Vec<Box<str>>, decided: &mut Vec<DecidedCalls>) {
        let keys: Vec<String> = keys.into_iter().map(|k| k.into_string()).collect();
        if keys.is_empty() {
            return;
        }
        self.lists.last_parked_lookup = Some(now);
        let asked = keys.clone();
        let traces = match self.link.call(move |s| s.get_many(Table::Operations, &asked)) {
            Ok(r) => r,
            Err(e) => {
                self.link.failed();
                tracing::warn!(error = %e, "could not look for parked verifiers' calls in the state store");
                return;
            }
        };
        for (k, r) in keys.iter().zip(traces) {
            let Some(Record::Operation(trace)) = r else { continue };
            if !t.chains.knows(&trace) {
                match self.link.take_decided(t, trace, "a parked verifier's call") {
                    Some(true) => {}
                    Some(false) => continue,
                    None => return,
                }
            }
            t.chains.restore(Restore::Operation(k.as_str().into(), trace));
            t.chains.take_in(FromStore::Unpark(k.as_str().into()), now, decided);
        }
    }
}

/// Empty the items of a written list's records that the store took (not in `refused`).
pub(super) fn drop_taken<T>((job, written): &mut (ListJob<T>, bool), refused: &[(Table, String)]) {
    if !*written {
        return;
    }
    for (key, mine) in job.by_key.iter_mut() {
        if !refused.iter().any(|(t, k)| *t == job.table && k == key) {
            *mine = Vec::new();
        }
    }
}

impl<T> ListJob<T> {
    /// The changes [`list_changes`] makes of this job at most (a put per key, a delete per
    /// expired key).
    pub(super) fn changes_at_most(&self) -> usize {
        self.by_key.len() + self.expired.len()
    }
}

/// A list's items merged onto its records as read (`None`: the read failed, nothing is written
/// of it), and the expired records this instance wrote deleted; whether it went in.
pub(super) fn list_changes<T>(
    (job, stored): (ListJob<T>, Option<Vec<Option<Record>>>),
    merge: fn(Option<Record>, &[T]) -> Record,
    changes: &mut Changes,
) -> (ListJob<T>, bool) {
    let Some(stored) = stored else { return (job, false) };
    let mut stored = stored.into_iter();
    for (key, mine) in &job.by_key {
        changes.put(key.clone(), merge(stored.next().flatten(), mine));
    }
    for (_, k) in &job.expired {
        changes.delete(job.table, k.clone());
    }
    (job, true)
}

pub(super) fn merge_refusals(rec: Option<Record>, mine: &[SpanEvidence]) -> Record {
    let mut all = match rec {
        Some(Record::Refusals(r)) => r.orphans,
        _ => Vec::new(),
    };
    for o in mine {
        if !all.iter().any(|x| x.trace_id == o.trace_id && x.span_id == o.span_id) {
            all.push(o.clone());
        }
    }
    all.sort_by(|a, b| b.start_ns.cmp(&a.start_ns).then_with(|| a.trace_id.cmp(&b.trace_id)));
    all.truncate(REFUSALS_PER_SECOND);
    Record::Refusals(Box::new(crate::state::RefusalsRecord { orphans: all }))
}

pub(super) fn merge_halves(rec: Option<Record>, mine: &[ClientHalf]) -> Record {
    let mut r = match rec {
        Some(Record::Halves(r)) => *r,
        _ => crate::state::HalvesRecord::default(),
    };
    for h in mine {
        if !r.halves.iter().any(|x| x.trace_id == h.trace_id && x.start_ns == h.start_ns) {
            if r.halves.len() >= crossjoin::MAX_CANDIDATES {
                r.overflow = true;
            } else {
                r.halves.push(h.clone());
            }
        }
    }
    Record::Halves(Box::new(r))
}

pub(super) fn merge_parked(rec: Option<Record>, mine: &[SpanEvidence]) -> Record {
    let mut all = match rec {
        Some(Record::Parked(r)) => r.verifiers,
        _ => Vec::new(),
    };
    for v in mine {
        if all.len() < MAX_SHARED_PARKED_PER_KEY && !all.iter().any(|x| x.trace_id == v.trace_id && x.span_id == v.span_id) {
            all.push(v.clone());
        }
    }
    Record::Parked(Box::new(crate::state::ParkedRecord { verifiers: all }))
}
