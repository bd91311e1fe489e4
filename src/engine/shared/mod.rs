//! Where the engine's state goes beyond its own tables: the **replica** behind one trait.
//!
//! The engine (`engine/mod.rs`) ingests, ticks, drains, classifies and keeps the clocks; it never
//! talks to a store. What it hands on and reads back goes through a [`Replica`]:
//!
//! - [`Alone`]: no store (the default). Every hook is a no-op; what is decided is emitted at once.
//! - [`Durable`](durable::Durable): one process on the memory or embedded (redb) store. Changes are
//!   written at most every [`PERSIST_EVERY`](crate::state::PERSIST_EVERY) and at the drain, and
//!   loaded back when the engine is made; no other writer, so nothing is read back while it runs.
//! - [`Shared`](remote::Shared): several instances on one shared store (Redis). The multi-instance
//!   protocol: sessions read back and merged, incidents folded in the store by compare-and-set,
//!   the shared lists (refusals, client halves, parked verifiers), the gauge lease, and the hold
//!   while the store is down. Its store calls run on a worker thread of their own
//!   ([`worker`]): writes are pipelined, and the reads a decision needs are issued when the
//!   chains fall due and their answers taken on a later step, so no network round trip is on
//!   the engine's path.
//!
//! The engine's tables the replica reads and merges into are lent to it as [`Tables`] for the
//! length of one call.

pub(crate) mod durable;
pub(crate) mod link;
pub(crate) mod records;
pub(crate) mod remote;
pub(crate) mod worker;

use rustc_hash::FxHashMap;

use crate::classify::catalog::Convergence;
use crate::classify::incidents::{IncidentBook, IncidentFacts};
use crate::correlate::{CatalogChange, Chains, DecidedCalls, Sessions};
use crate::evidence::time::Moment;
use crate::evidence::SpanEvidence;
use crate::verdict::Verdict;

use super::decided::{Decided, DriftEvent};

/// The engine's own tables, lent to the replica for one call: what it restores, merges into and
/// takes changes from.
pub(crate) struct Tables<'a> {
    pub chains: &'a mut Chains,
    pub sessions: &'a mut Sessions,
    pub incidents: &'a mut IncidentBook,
    pub board: &'a super::board::CatalogBoard,
    /// Decided chains restored or taken over from the store (the start rule does not apply).
    pub restored: &'a mut crate::bounded::BoundedSet<crate::evidence::TraceId>,
    pub drift_reported: &'a mut crate::bounded::BoundedSet<(std::sync::Arc<str>, std::sync::Arc<str>, std::sync::Arc<str>)>,
}

impl Tables<'_> {
    /// Publish a catalog change on the gate's board and as a record.
    pub(crate) fn emit_catalog(&self, ch: CatalogChange, out: &mut Vec<Decided>) {
        self.board.publish(&ch.session_key, ch.server.clone(), ch.verdict.clone());
        out.push(Decided::Catalog(Box::new(ch)));
    }
}

/// A verdict the replica holds for the store's incident fold, as the fold reads it. A server's
/// are kept side by side in one list, and a round shares that list with the store's thread
/// (which folds it) while the engine's keeps it to hold again when a write fails: one
/// allocation a server and round, not one a verdict.
pub(crate) type HeldVerdict = IncidentFacts<'static>;

/// Decided chains with the engine time they were decided at (classified with that time).
pub(crate) type Batch = (Moment, Vec<DecidedCalls>);

/// What the holder of the gauge lease last counted in a shared store: open incidents and
/// sessions, grouped as in [`super::Gauges`].
pub(crate) type GlobalCounts = (FxHashMap<[String; 4], u64>, FxHashMap<(String, Convergence), u64>);

/// The replica's figures, for the engine's gauges and accessors.
#[derive(Clone, Debug, Default)]
pub(crate) struct ReplicaFigures {
    /// A store is configured and its last operation failed.
    pub store_down: bool,
    pub store_errors: u64,
    pub store_conflicts: u64,
    pub taken_over: u64,
    pub incidents_unshared: u64,
    /// Store calls that waited for room in the worker's queue (it was full).
    pub queue_waits: u64,
    /// Wall-clock time the engine's thread spent blocked on the store's thread.
    pub waited: std::time::Duration,
    /// Stored records the load could not read (damaged, or of a newer format), by table.
    pub skipped: crate::state::SkipCounts,
    /// What a network store has cost so far (round trips, bytes, versions remembered).
    pub store: Option<crate::state::StoreStats>,
    /// The engine time of the last store round that wrote (or had nothing to write): what was
    /// decided up to then is in the store.
    pub durable_at: Option<Moment>,
}

/// How the engine's gauges of incidents and convergence are reported.
pub(crate) enum GaugeSource<'a> {
    /// From this engine's own tables (one process).
    Own,
    /// Every instance's, counted in the store by the holder of the gauge lease.
    Global(&'a GlobalCounts),
    /// Another instance holds the lease: none from here.
    Elsewhere,
}

/// What a replica's store needs the engine's tables to keep: their changes since each write, and
/// for a store other instances share, what those instances read too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Keeps {
    /// No store: nothing is kept.
    Nothing,
    /// A store of this instance's own: the chains', the sessions' and the incidents' changes.
    Own,
    /// A store other instances share: the chains' changes and, for `settle`, their orphans and
    /// split marks; the sessions' changes. Incidents are folded in the store itself (the write
    /// round), not written from the engine's book.
    Shared { settle: std::time::Duration },
}

/// The multi-instance protocol, or its absence. Every method is called on the engine's thread,
/// once per step at the places named; none may block on a network round trip.
pub(crate) trait Replica: Send {
    /// What the engine's tables must keep for this replica's store, from the start (asked once,
    /// before `attach`). The engine turns the keeping on: it owns the tables, and the replica
    /// only reads what they keep.
    fn keeps(&self) -> Keeps;
    /// Take back what the store holds (once, when the engine is made).
    fn attach(&mut self, t: &mut Tables);
    /// Before a batch enters the chains: decided chains its evidence revises that the store holds
    /// and the engine does not (forgotten under a bound, or decided by another instance).
    fn before_ingest(&mut self, t: &mut Tables, spans: &[SpanEvidence]);
    /// Before due chains are decided (`all`: the drain): what other instances published that the
    /// chains about to be decided join. True: hold the due chains (the store is down).
    fn before_decide(&mut self, t: &mut Tables, now: Moment, all: bool, decided: &mut Vec<DecidedCalls>) -> bool;
    /// Every re-evaluation (1 s) and at the drain: probe a store that is down, the gauge lease,
    /// converged sessions read back.
    fn every_second(&mut self, t: &mut Tables, now: Moment, drain: bool);
    /// Chains just decided: those ready to be classified go to `ready` (at once without a shared
    /// store; with one, once the reads they need have come back).
    fn admit(&mut self, t: &mut Tables, batch: Batch, ready: &mut Vec<Batch>);
    /// Batches whose reads have come back (`settle`: wait for every one in flight).
    fn ready(&mut self, t: &mut Tables, now: Moment, settle: bool, ready: &mut Vec<Batch>);
    /// Write what changed: at most every `PERSIST_EVERY`, always when `force`.
    fn persist(&mut self, t: &mut Tables, now: Moment, force: bool, out: &mut Vec<Decided>);
    /// A catalog change: `Some` to emit it now, `None` when the replica holds it.
    fn hold_catalog(&mut self, t: &mut Tables, now: Moment, ch: CatalogChange, out: &mut Vec<Decided>) -> Option<CatalogChange>;
    /// A verdict for the incidents: true when the replica folds it (in the store), false to fold
    /// it in the engine's own book.
    fn hold_verdict(&mut self, v: &Verdict) -> bool;
    /// A drift detected here: `Some` to report it now, `None` when the replica holds it.
    fn report_drift(&mut self, record: crate::state::DriftRecord, event: DriftEvent) -> Option<DriftEvent>;
    /// At the end (drain, flush): the drift the store did not take is emitted from here, and
    /// (`catalog`) the catalog changes still held. The verdicts held whose incidents the store did
    /// not take are handed back, for the engine to fold into its own book as if never held.
    fn finish(&mut self, t: &mut Tables, catalog: bool, out: &mut Vec<Decided>) -> Vec<HeldVerdict>;
    /// Evidence was taken in since the last write.
    fn touched(&mut self);
    /// When the replica next needs a step (a write due, a held catalog change).
    fn next_due(&self) -> Option<Moment>;
    fn figures(&self) -> ReplicaFigures;
    fn gauges(&self) -> GaugeSource<'_>;
    /// This instance reports the global gauges.
    fn gauge_leader(&self) -> bool;
}

/// The replica for a configured store: [`remote::Shared`] when other instances write it too,
/// [`durable::Durable`] otherwise; [`Alone`] without one.
pub(crate) fn for_store(
    store: Option<crate::state::StoreHandle>,
    late_span_window: std::time::Duration,
    answer_within: std::time::Duration,
) -> Box<dyn Replica> {
    match store {
        None => Box::new(Alone),
        Some(s) if s.is_shared() => Box::new(remote::Shared::new(s, late_span_window, answer_within)),
        Some(s) => Box::new(durable::Durable::new(s)),
    }
}

/// No store: one process, nothing beyond its own tables.
pub(crate) struct Alone;

impl Replica for Alone {
    fn keeps(&self) -> Keeps {
        Keeps::Nothing
    }
    fn attach(&mut self, _: &mut Tables) {}
    fn before_ingest(&mut self, _: &mut Tables, _: &[SpanEvidence]) {}
    fn before_decide(&mut self, _: &mut Tables, _: Moment, _: bool, _: &mut Vec<DecidedCalls>) -> bool {
        false
    }
    fn every_second(&mut self, _: &mut Tables, _: Moment, _: bool) {}
    fn admit(&mut self, _: &mut Tables, batch: Batch, ready: &mut Vec<Batch>) {
        ready.push(batch);
    }
    fn ready(&mut self, _: &mut Tables, _: Moment, _: bool, _: &mut Vec<Batch>) {}
    fn persist(&mut self, _: &mut Tables, _: Moment, _: bool, _: &mut Vec<Decided>) {}
    fn hold_catalog(&mut self, _: &mut Tables, _: Moment, ch: CatalogChange, _: &mut Vec<Decided>) -> Option<CatalogChange> {
        Some(ch)
    }
    fn hold_verdict(&mut self, _: &Verdict) -> bool {
        false
    }
    fn report_drift(&mut self, _: crate::state::DriftRecord, event: DriftEvent) -> Option<DriftEvent> {
        Some(event)
    }
    fn finish(&mut self, _: &mut Tables, _: bool, _: &mut Vec<Decided>) -> Vec<HeldVerdict> {
        Vec::new()
    }
    fn touched(&mut self) {}
    fn next_due(&self) -> Option<Moment> {
        None
    }
    fn figures(&self) -> ReplicaFigures {
        ReplicaFigures::default()
    }
    fn gauges(&self) -> GaugeSource<'_> {
        GaugeSource::Own
    }
    fn gauge_leader(&self) -> bool {
        true
    }
}
