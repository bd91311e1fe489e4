//! Several instances on one shared store (Redis): the multi-instance protocol.
//!
//! # What is shared, and how
//! - **Sessions** are written by every instance that sees a trace of them: before each write an
//!   instance reads what the others wrote and writes the union (compare-and-set on the version
//!   just read); the tool calls about to be judged have their sessions read first; every second
//!   up to [`CONVERGED_REFRESH`](sessions::CONVERGED_REFRESH) sessions this instance calls `converged` are read back.
//! - **Catalog changes** are held to the write that records them as emitted (`SessionRecord::
//!   emitted`): the instance whose write records a change emits it, once across instances; a
//!   `converged` one is held [`CONFIRM_CONVERGED_AFTER`](catalog::CONFIRM_CONVERGED_AFTER) first, for a confirming read.
//! - **Incidents** are folded into the store's record of their server by compare-and-set, so
//!   exactly one instance emits each transition; a refused record is folded again next round.
//! - **Shared lists**: refused-looking HTTP spans (`refusals`), client halves of split calls
//!   (`client_halves`), verifiers parked before their call (`parked_verifiers`); read, merged,
//!   compare-and-set; the writer deletes its own after `late_span_window`.
//! - **Drift** is reported by the instance whose write creates its record.
//! - **The gauge lease**: its holder counts every instance's incidents and sessions.
//! - **The store down**: chains are held up to [`STORE_DOWN_HOLD`](lease::STORE_DOWN_HOLD) (another instance's part of
//!   their evidence is in the store), then decided partial (`store_unavailable`).
//!
//! # Off the engine's path
//! Every store call goes through the [`Worker`](super::worker::Worker): for a network store a
//! thread of its own. The engine never waits for a round trip on its common path:
//! - chains that fall due have their shared parts (their sessions, the verifiers parked under
//!   their operation keys) **read when they are decided** and are classified when the answer is
//!   back — taken at a later step, in the order decided (the reads of the batches decided within
//!   [`GATHER_FOR`](reads::GATHER_FOR), and while one is in flight, gather into one: at most one in flight, so they
//!   coalesce further when the store is slower than the engine's steps), and at the latest `answer_within` of
//!   engine time after (`EngineConfig::store_answer_within`; the engine waits then: a store
//!   slower than that slows the engine rather than letting answers pile up). With
//!   `answer_within` zero (the default, for tests on a manual clock) every answer is taken in
//!   the step that asked for it, as if the calls were synchronous, only run on the store's
//!   thread;
//! - a **write round** is two jobs: one pipelined read (the incident records of the servers
//!   whose verdicts are held, the list records to add to, the sessions to write), then, once the
//!   engine has merged the sessions, one script with every change (drift, the incident fold
//!   and the list merges done on the store's thread, sessions, decided chains). A round starts
//!   at most every `PERSIST_EVERY` and is advanced at each step as its answers come back; while
//!   one is in flight the next waits its turn (the interval stretches to the store's pace);
//! - the converged sessions' read, the gauge lease and the probe of a store that is down are
//!   jobs whose answers are taken at a later step.
//!
//! An in-process shared store (tests) runs the same jobs inline: every answer is there at once,
//! so the engine behaves as if each call were synchronous. Rare reads whose answer the step
//! needs now (a decided chain for a late receipt, a client half's chain, refusals of a second,
//! parked verifiers' calls) are still waited for.
//!
//! # Where each part lives
//! One sub-protocol per file, each owning its state: [`sessions`] (read back and merged),
//! [`reads`] (the read groups of chains just decided), [`round`] (the two-phase write round),
//! [`catalog`] (the catalog hold), [`incidents`] (the incident fold), [`lists`] (the shared
//! lists), [`splits`] (split marks) and [`lease`] (the store's standing, the gauge lease and the
//! cluster's protocol). This file keeps [`Shared`], the step ([`Replica`]) that calls them in
//! order, and what they share: the link to the store and the engine time.

mod catalog;
mod incidents;
mod lease;
mod lists;
mod reads;
mod round;
mod sessions;
mod splits;

use std::time::Duration;

use crate::correlate::{CatalogChange, DecidedCalls};
use crate::evidence::time::Moment;
use crate::evidence::SpanEvidence;
use crate::state::{DriftRecord, StoreHandle, Table};
use crate::verdict::Verdict;

use super::link::Link;
use super::worker::Worker;
use super::{Batch, Decided, DriftEvent, GaugeSource, HeldVerdict, Keeps, Replica, ReplicaFigures, Tables};

use catalog::CatalogHold;
use incidents::IncidentFold;
use lease::{Lease, GAUGE_LEASE};
use lists::SharedLists;
use reads::ReadGroups;
use round::Rounds;
use sessions::SessionReads;

/// How soon the driver is asked to step again while answers are awaited.
const POLL_AFTER: Duration = Duration::from_millis(5);

/// What a store call did to the store's standing, in the order the calls were made.
#[derive(Clone, Copy, Debug)]
enum Effect {
    /// It answered: the store is up.
    Up,
    /// It failed: counted, the store is down.
    Failed,
    /// Records refused by compare-and-set (counted; the store answered).
    Conflicts(u64),
}

pub(crate) struct Shared {
    link: Link,
    /// The latest (engine time) an answer is taken after its job was submitted.
    answer_within: Duration,
    /// The engine time of the latest step (see `next_due`).
    now: Moment,
    reads: ReadGroups,
    sessions: SessionReads,
    rounds: Rounds,
    catalog: CatalogHold,
    incidents: IncidentFold,
    lists: SharedLists,
    lease: Lease,
}

impl Shared {
    pub(crate) fn new(store: StoreHandle, late_span_window: Duration, answer_within: Duration) -> Self {
        Shared {
            link: Link::new(Worker::for_store(store)),
            answer_within,
            now: Moment::from_nanos(0),
            reads: ReadGroups::default(),
            sessions: SessionReads::default(),
            rounds: Rounds::default(),
            catalog: CatalogHold::default(),
            incidents: IncidentFold::default(),
            lists: SharedLists::new(late_span_window),
            lease: Lease::new(),
        }
    }

    /// An answer asked for at `at` is to be taken now (waited for if it has not come).
    fn due(&self, at: Moment) -> bool {
        self.now.saturating_duration_since(at) >= self.answer_within
    }

    fn effects(&mut self, effects: &[Effect]) {
        for e in effects {
            match e {
                Effect::Up => self.link.down = false,
                Effect::Failed => self.link.failed(),
                Effect::Conflicts(n) => self.link.conflicts += n,
            }
        }
    }
}

impl Replica for Shared {
    fn keeps(&self) -> Keeps {
        // A split mark's way to another instance's halves: this round's write, that instance's
        // read and its next write, each answered within `answer_within` at worst.
        Keeps::Shared { settle: self.answer_within * 3 + crate::state::PERSIST_EVERY * 4 }
    }

    fn attach(&mut self, t: &mut Tables) {
        // The cluster's protocol before the first decision: an instance that knows no split
        // marks may share the store from the start.
        match self.link.call(|s| s.announce(GAUGE_LEASE)) {
            Ok(p) => self.heard_protocol(p),
            Err(e) => tracing::warn!(error = %e, "could not announce this instance's state protocol"),
        }
        self.tell_protocol(t, Moment::from_nanos(0));
        self.link.load(t, false);
    }

    fn before_ingest(&mut self, t: &mut Tables, spans: &[SpanEvidence]) {
        self.link.take_back(t, spans);
    }

    fn before_decide(&mut self, t: &mut Tables, now: Moment, all: bool, decided: &mut Vec<DecidedCalls>) -> bool {
        self.now = now;
        self.tell_protocol(t, now);
        let looks = t.chains.take_looks(now, all, self.paced_looks(now, all));
        self.pull_refusals(t, now, looks.refusal_seconds);
        self.join_remote_halves(t, looks.server_halves);
        self.adopt_rootless(t, now, looks.rootless, decided);
        if all {
            return false;
        }
        self.find_parked_calls(t, now, looks.parked_keys, decided);
        self.take_rivals(t, now, decided);
        self.hold_for_store(now)
    }

    fn every_second(&mut self, t: &mut Tables, now: Moment, drain: bool) {
        self.now = now;
        if drain {
            // A last look at what other instances wrote of the sessions this one calls converged.
            self.refresh_converged(t, true);
            return;
        }
        self.probe_store();
        self.renew_gauge_lease(now);
        self.refresh_converged(t, false);
    }

    fn admit(&mut self, _: &mut Tables, batch: Batch, ready: &mut Vec<Batch>) {
        self.admit_batch(batch, ready);
    }

    fn ready(&mut self, t: &mut Tables, now: Moment, settle: bool, ready: &mut Vec<Batch>) {
        self.now = now;
        self.link.worker.poll();
        self.take_probe();
        self.take_lease();
        self.take_converged(t, settle);
        // In the order decided: a revision is classified after what it revises.
        self.take_answered_groups(t, now, settle, ready);
    }

    fn persist(&mut self, t: &mut Tables, now: Moment, force: bool, out: &mut Vec<Decided>) {
        self.now = now;
        self.persist_round(t, now, force, out);
    }

    fn hold_catalog(&mut self, t: &mut Tables, now: Moment, ch: CatalogChange, out: &mut Vec<Decided>) -> Option<CatalogChange> {
        self.hold_change(t, now, ch, out);
        None
    }

    fn hold_verdict(&mut self, v: &Verdict) -> bool {
        self.hold_for_fold(v)
    }

    fn report_drift(&mut self, record: DriftRecord, event: DriftEvent) -> Option<DriftEvent> {
        // Reported by the instance whose write creates the record (the write round).
        self.rounds.report_drift(record, event);
        None
    }

    fn finish(&mut self, t: &mut Tables, catalog: bool, out: &mut Vec<Decided>) -> Vec<HeldVerdict> {
        self.advance_round(t, true, out);
        let unfolded = self.finish_incidents(t, out);
        if catalog {
            self.emit_pending_catalog(t, out);
        }
        unfolded
    }

    fn touched(&mut self) {
        self.rounds.touched();
    }

    fn next_due(&self) -> Option<Moment> {
        let write = self.rounds.next_write();
        // A held catalog change is emitted at a write: wake for the first write at or after it.
        let catalog = self.catalog.next_due(self.rounds.last_persisted());
        // Answers awaited: look again soon.
        let awaited = (self.reads.awaiting() || self.rounds.in_flight()).then_some(self.now + POLL_AFTER);
        [write, catalog, awaited].into_iter().flatten().min()
    }

    fn figures(&self) -> ReplicaFigures {
        ReplicaFigures {
            store_down: self.link.down,
            store_errors: self.link.errors,
            store_conflicts: self.link.conflicts,
            taken_over: self.link.taken_over,
            incidents_unshared: self.incidents.unshared(),
            queue_waits: self.link.worker.queue_waits() + self.reads.waits(),
            waited: self.link.worker.waited(),
            skipped: self.link.skipped,
            store: self.link.worker.store_stats(),
            // The evidence journal is for a store of one process (`storage.directory`).
            durable_at: None,
        }
    }

    fn gauges(&self) -> GaugeSource<'_> {
        self.lease.gauges()
    }

    fn gauge_leader(&self) -> bool {
        self.lease.leader()
    }
}

/// Put `items` back in front of `v` (what a round took and the store did not take).
fn prepend<T>(v: &mut Vec<T>, items: Vec<T>) {
    let rest = std::mem::replace(v, items);
    v.extend(rest);
}

/// A record of `table` under `key` was refused by the write (`None`: the write failed).
fn is_refused(refused: Option<&[(Table, String)]>, table: Table, key: &str) -> bool {
    refused.is_some_and(|r| r.iter().any(|(t, k)| *t == table && k == key))
}
