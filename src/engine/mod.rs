//! The engine: the one pipeline every driver runs (the service, `replay`, the tests).
//!
//! Synchronous and single-owner: [`Engine::ingest`] takes a normalized batch, [`Engine::tick`]
//! lets time pass, [`Engine::drain`] decides what is left. Time is always a parameter (a
//! [`Moment`]): the service passes the wall clock, `replay` the span-time clock, tests a manual
//! one. Nothing here reads a clock, does I/O or knows where its records go: everything it decides
//! comes out as [`Decided`] records for the sinks (`emit/`).
//!
//! The engine owns every piece of state that outlives one batch: the chain table and its joins,
//! the catalog sessions, the incident book, the drift already reported, the calls already
//! reported `working`, and the gate's view of the catalogs.
//!
//! What goes beyond the process — a state store ([`EngineConfig::store`]) of its own, or one
//! shared by several instances — is the replica's ([`shared`]): the engine hands it what it
//! decided and what changed, at fixed places of each step, and classifies what it hands back.
//! The engine never waits on a network round trip: with a shared store, chains that fall due
//! are classified once their shared parts have been read (a later step), and writes run on the
//! store's own thread.
//!
//! A chain whose evidence may be split — decided at shutdown or by eviction, decided while the
//! store is unavailable, or (with [`EngineConfig::partial_before_start`]) started before the
//! engine's first ingest — is marked partial after classification and never comes out `healthy`
//! (`classify::partial`).

pub(crate) mod board;
pub(crate) mod decided;
pub(crate) mod shared;

use std::sync::Arc;
use std::time::Duration;

use rustc_hash::FxHashMap;

use crate::classify::catalog::Convergence;
use crate::classify::incidents::IncidentBook;
use crate::classify::partial::{partial_reason, Since};
use crate::classify::pinning::{Lockfile, PinCheck};
use crate::classify::progress::{InFlight, ProgressPolicy, Standing};
use crate::classify::{classify_call, Decision, SessionContext};
use crate::correlate::{ChainLimits, ChainStats, Chains, DecidedCalls, SessionLimits, Sessions};
use crate::evidence::call::CallEvidence;
use crate::evidence::time::Moment;
use crate::evidence::{Method, SpanEvidence};
use crate::normalize::NormalizedBatch;
use crate::verdict::{DecidedBy, HealthState, Partial, Verdict};

pub use decided::{CatalogLine, Decided, DriftEvent, IncidentChange};
use shared::{Batch, GaugeSource, Keeps, Replica, Tables};

/// How often (on the engine's clock) time-based verdicts are re-evaluated: catalog TTLs and
/// `max_age` policies, and the progress clocks of calls in flight.
const REEVALUATE_EVERY: Duration = Duration::from_secs(1);
/// How often idle sessions are expired.
const EXPIRE_EVERY: Duration = Duration::from_secs(10);
/// [`EngineConfig::store_answer_within`] for the service on a network store: a store's answer
/// normally comes within a round trip and is taken at the next step; this is the backstop past
/// which the engine waits for it (a store slower than this slows the engine).
pub const SHARED_STORE_ANSWER_WITHIN: Duration = Duration::from_secs(1);

#[derive(Clone, Debug, Default)]
pub struct EngineConfig {
    pub chains: ChainLimits,
    pub sessions: SessionLimits,
    pub progress: ProgressPolicy,
    pub pins: Option<Arc<Lockfile>>,
    /// Most (server, tool, digest) drift reports remembered (each is reported once).
    pub max_drift_reported: usize,
    /// Most in-flight calls remembered as already reported `working`.
    pub max_working_reported: usize,
    /// Most sessions on the gate's board (`processors.mcp_health.limits.gate_board`); 0 (the
    /// default) takes the board's default.
    pub max_gate_board: usize,
    /// Where the cross-trace state is kept beyond the process (`storage`); `None` keeps it in
    /// the engine's own tables only.
    pub store: Option<crate::state::StoreHandle>,
    /// Mark partial the chains whose earliest call predates the engine's first ingest less
    /// `decision_wait` (`processors.mcp_health.partial_before_start`; see `classify::partial`).
    pub partial_before_start: bool,
    /// On a shared store, the latest (engine time) the answer of a store call is taken after
    /// it was asked: chains whose shared parts are being read are classified when the answer
    /// comes, at the latest this much later (the engine waits then). Zero (the default) takes
    /// every answer in the step that asked for it: the store's round trips are then on the
    /// engine's path, and a manual clock sees the same steps as with synchronous calls. The
    /// service sets [`SHARED_STORE_ANSWER_WITHIN`].
    pub store_answer_within: Duration,
    /// What the engine's input is normalized with where its driver normalizes it (replay): the
    /// receipt keys trusted, the caches' sizes. The service's receivers are given theirs by their
    /// own constructor (`receive::admit::Admission`).
    pub normalize: crate::normalize::Settings,
}

impl EngineConfig {
    pub fn new(chains: ChainLimits, sessions: SessionLimits) -> Self {
        EngineConfig { chains, sessions, max_drift_reported: 100_000, max_working_reported: 100_000, ..Default::default() }
    }
}

/// Point-in-time figures the metric sinks report as gauges.
#[derive(Clone, Debug, Default)]
pub struct Gauges {
    pub chains_in_flight: u64,
    pub evidence_bytes: u64,
    pub chain_stats: ChainStats,
    /// What the cross-trace joins did (see `correlate::crossjoin`).
    pub join_stats: crate::correlate::crossjoin::CrossJoinStats,
    /// Stored records the load could not read, by table and reason.
    pub state_skipped: crate::state::SkipCounts,
    /// Open incidents by (first failed layer, state, server, incident state). On a shared store
    /// these and `convergence` are every instance's, reported by the holder of the gauge lease
    /// only (the others report none), so a sum across instances is right.
    pub incidents_open: FxHashMap<[String; 4], u64>,
    /// Sessions by (server, convergence).
    pub convergence: FxHashMap<(String, Convergence), u64>,
    /// This instance reports the global gauges (always, without a shared store).
    pub gauge_leader: bool,
    /// Calls reported working, by (tool, server).
    pub working: FxHashMap<(String, String), u64>,
    /// Chains that gave no verdict because they hold no MCP request (a verifier or an HTTP span alone).
    pub callless_chains: u64,
    /// Receipts that said they checked later than they arrived: dated at their arrival.
    pub receipts_capped: u64,
    /// Batches read back from the evidence journal at the start, and records it could not read.
    pub journal_replayed: (u64, u64),
    /// Loads and writes of the state store that failed (the engine went on in memory).
    pub store_errors: u64,
    /// Writes a shared store refused because another instance changed the record first (they
    /// are read, merged and written again).
    pub store_conflicts: u64,
    /// Verdicts folded into this instance's incidents alone, not the shared store's (the store
    /// was unreachable past the bound, or at shutdown): their transitions may be emitted by
    /// another instance as well.
    pub incidents_unshared: u64,
    /// Store calls that waited for room in the store thread's queue (it was full: the engine
    /// went at the store's pace).
    pub store_queue_waits: u64,
    /// What a network store has cost so far (round trips, bytes, versions remembered).
    pub store: Option<crate::state::StoreStats>,
}

/// The engine. See the module documentation.
pub struct Engine {
    chains: Chains,
    sessions: Sessions,
    pins: Option<Arc<Lockfile>>,
    /// The tool definitions seen, by digest (shared with the normalizer that fills it): what a
    /// drift report diffs against.
    definitions: Arc<crate::normalize::definitions::Definitions>,
    /// What the input is normalized with where the engine's driver normalizes it (replay).
    normalize: crate::normalize::Settings,
    progress: ProgressPolicy,
    incidents: IncidentBook,
    /// Drift already reported, oldest first out.
    drift_reported: crate::bounded::BoundedSet<(Arc<str>, Arc<str>, Arc<str>)>,
    /// In-flight calls already reported `working` (reported once; the final verdict follows).
    working_reported: crate::bounded::BoundedSet<([u8; 16], [u8; 8])>,
    /// Calls already reported `waiting` (once each, as `working_reported`).
    waiting_reported: crate::bounded::BoundedSet<([u8; 16], [u8; 8])>,
    working: FxHashMap<(String, String), u64>,
    /// Where catalog verdicts are published for the gate API.
    board: Arc<board::CatalogBoard>,
    last_reevaluated: Option<Moment>,
    last_expired: Option<Moment>,
    callless_chains: u64,
    /// Receipts dated later than they arrived, dated at their arrival.
    receipts_capped: u64,
    /// What the evidence journal gave back at the start (batches, damaged records).
    journal_replayed: (u64, u64),
    scratch: Vec<DecidedCalls>,
    /// Verdict allocations the sinks were done with (see [`Engine::recycle`]), at most
    /// [`MAX_SPARE_VERDICTS`].
    spare_verdicts: Vec<Arc<Verdict>>,
    /// Batches the replica has handed back, ready to classify (reused).
    ready: Vec<Batch>,
    /// Engine time of the first ingest: what predates it (less the grace) may be split.
    started_ns: Option<u64>,
    /// `decision_wait` in ns, the grace of the start rule; `None` when the rule is off.
    partial_grace_ns: Option<u64>,
    /// Decided chains restored or taken over from the store: their earlier evidence came back
    /// with them, so the start rule does not apply to them. As many as decided chains are kept
    /// for revision (`max_decided`); past it the oldest go, counted.
    restored: crate::bounded::BoundedSet<crate::evidence::TraceId>,
    /// Chains whose last decision was marked partial, and why: a revision supersedes the
    /// verdict as reported (capped), so the success counts it undoes are the ones it added.
    /// As many as decided chains are kept for revision.
    partial_decided: crate::bounded::BoundedMap<crate::evidence::TraceId, Partial>,
    /// The engine time of the current step.
    now: Moment,
    /// The store a replica keeps the state in (none, one process's, or shared).
    replica: Box<dyn Replica>,
    has_store: bool,
}

/// Lend the engine's tables to its replica for one call: `lend!(self, |replica, tables| …)`.
macro_rules! lend {
    ($e:ident, |$r:ident, $t:ident| $body:expr) => {{
        let $r = &mut $e.replica;
        let mut $t = Tables {
            chains: &mut $e.chains,
            sessions: &mut $e.sessions,
            incidents: &mut $e.incidents,
            board: &$e.board,
            restored: &mut $e.restored,
            drift_reported: &mut $e.drift_reported,
        };
        $body
    }};
}

/// Most verdict allocations kept for reuse ([`Engine::recycle`]): a step's worth and more (a step
/// decides at most 1024 chains in the service), under 4 MiB.
const MAX_SPARE_VERDICTS: usize = 4096;

impl Engine {
    pub fn new(cfg: EngineConfig) -> Self {
        let grace = u64::try_from(cfg.chains.decision_wait.as_nanos()).unwrap_or(u64::MAX);
        let partial_grace_ns = cfg.partial_before_start.then_some(grace);
        let max_decided = cfg.chains.max_decided.max(1);
        let has_store = cfg.store.is_some();
        let replica = shared::for_store(cfg.store, cfg.chains.late_span_window, cfg.store_answer_within);
        let mut e = Engine {
            chains: Chains::new(cfg.chains),
            sessions: Sessions::new(cfg.sessions),
            pins: cfg.pins,
            definitions: cfg.normalize.definitions.clone(),
            normalize: cfg.normalize,
            progress: cfg.progress,
            incidents: IncidentBook::default(),
            drift_reported: crate::bounded::BoundedSet::with_capacity("drift_reported", cfg.max_drift_reported),
            working_reported: crate::bounded::BoundedSet::with_capacity("working_reported", cfg.max_working_reported),
            waiting_reported: crate::bounded::BoundedSet::with_capacity("waiting_reported", cfg.max_working_reported),
            working: FxHashMap::default(),
            board: Arc::new(match cfg.max_gate_board {
                0 => board::CatalogBoard::default(),
                n => board::CatalogBoard::with_capacity(n),
            }),
            last_reevaluated: None,
            last_expired: None,
            callless_chains: 0,
            receipts_capped: 0,
            journal_replayed: (0, 0),
            scratch: Vec::new(),
            spare_verdicts: Vec::new(),
            ready: Vec::new(),
            started_ns: None,
            partial_grace_ns,
            restored: crate::bounded::BoundedSet::with_capacity("restored_decided", max_decided),
            partial_decided: crate::bounded::BoundedMap::with_capacity("partial_decided", max_decided),
            now: Moment::from_nanos(0),
            replica,
            has_store,
        };
        e.keep_for_store(e.replica.keeps());
        lend!(e, |r, t| r.attach(&mut t));
        // The sessions taken back from a store go on the gate's board as they stand.
        for (key, server, verdict) in e.sessions.all_current() {
            e.board.publish(&key, server, verdict);
        }
        e
    }

    /// Turn on what the tables keep for the replica's store before it takes anything back, so
    /// its first write carries every change.
    fn keep_for_store(&mut self, keeps: Keeps) {
        match keeps {
            Keeps::Nothing => {}
            Keeps::Own => {
                self.chains.keep_for_store(None);
                self.sessions.keep_for_store();
                self.incidents.keep_for_store();
            }
            Keeps::Shared { settle } => {
                self.chains.keep_for_store(Some(settle));
                self.sessions.keep_for_store();
            }
        }
    }

    /// Decided chains taken from the store for evidence that came to this engine (a receipt
    /// for a call another instance decided, a client half's chain, a parked verifier's call).
    pub fn taken_over(&self) -> u64 {
        self.replica.figures().taken_over
    }

    /// Wall-clock time this engine's thread spent blocked on its store's thread (zero without a
    /// store on the network): the store's cost to the thread that decides every verdict.
    pub fn store_waited(&self) -> std::time::Duration {
        self.replica.figures().waited
    }

    /// The earliest engine time whose evidence the engine may still need from the evidence
    /// journal after a crash: what came before it is decided and in the store (or was let go).
    /// `None` while nothing is known to be in the store (no store of one process, no round
    /// written yet): then everything is needed.
    pub fn journal_horizon(&self) -> Option<Moment> {
        let written = self.replica.figures().durable_at? + std::time::Duration::from_nanos(1);
        Some(self.chains.oldest_needed().map_or(written, |o| o.min(written)))
    }

    /// The engine time through which everything decided is in the store (a store of one
    /// process; `None` without one, or before its first write).
    pub fn written_through(&self) -> Option<Moment> {
        self.replica.figures().durable_at
    }

    /// What the evidence journal gave back at the start: `batches` replayed, `damaged` records
    /// lost (reported with the gauges).
    pub fn note_journal_replay(&mut self, batches: u64, damaged: u64) {
        self.journal_replayed = (batches, damaged);
    }

    /// Loads and writes of the state store that failed.
    pub fn store_errors(&self) -> u64 {
        self.replica.figures().store_errors
    }

    /// A store is configured and its last load, read or write failed: verdicts are capped
    /// (`store_unavailable`) and the health check says degraded until an operation succeeds.
    pub fn store_down(&self) -> bool {
        self.has_store && self.replica.figures().store_down
    }

    /// The gate's view of the catalogs (shared with the gate service, published by the engine).
    pub fn board(&self) -> Arc<board::CatalogBoard> {
        self.board.clone()
    }

    /// The pins with the definitions they are checked against.
    fn pins(&self) -> Option<Pins<'_>> {
        Pins::of(self.pins.as_deref(), &self.definitions)
    }

    /// The tool definitions seen (shared with the normalizer that fills them and the gate).
    pub fn definitions(&self) -> Arc<crate::normalize::definitions::Definitions> {
        self.definitions.clone()
    }

    /// What a driver that normalizes the engine's input itself (replay) normalizes it with.
    pub fn normalize_settings(&self) -> &crate::normalize::Settings {
        &self.normalize
    }

    pub fn chains(&self) -> &Chains {
        &self.chains
    }

    /// Empty `records` the sinks are done with, keeping the verdicts no sink still holds for the
    /// next ones: under steady load verdicts are made and dropped by the thousand a second, and
    /// one allocated anew (most of a kilobyte) came from pages the allocator had just returned
    /// near the memory limit, a page fault each (a fifth of the faults on the MCP-only line).
    pub fn recycle(&mut self, records: &mut Vec<Decided>) {
        for r in records.drain(..) {
            if let Decided::Call(mut v) = r {
                if self.spare_verdicts.len() < MAX_SPARE_VERDICTS && Arc::get_mut(&mut v).is_some() {
                    self.spare_verdicts.push(v);
                }
            }
        }
    }

    /// `v` behind an `Arc`: a spare one's allocation (see [`Engine::recycle`]) where there is one.
    fn shared(spare_verdicts: &mut Vec<Arc<Verdict>>, v: Verdict) -> Arc<Verdict> {
        if let Some(mut spare) = spare_verdicts.pop() {
            if let Some(slot) = Arc::get_mut(&mut spare) {
                *slot = v;
                return spare;
            }
        }
        Arc::new(v)
    }

    /// When a chain next falls due (see `Chains::next_due`), or when the replica next needs a
    /// step: a write due (another instance reading a shared store sees this one's evidence at
    /// most [`PERSIST_EVERY`](crate::state::PERSIST_EVERY) after it came), a held catalog
    /// change, answers awaited. Time-based catalog and progress checks run on the driver's
    /// regular tick.
    pub fn next_due(&self) -> Option<Moment> {
        [self.chains.next_due(), self.replica.next_due()].into_iter().flatten().min()
    }

    pub fn in_flight(&self) -> usize {
        self.chains.in_flight()
    }

    /// Evidence bytes held (chains in flight and decided chains kept for revision); O(1).
    pub fn evidence_bytes(&self) -> u64 {
        self.chains.bytes() as u64
    }

    /// Receipts of `batch` dated later than its arrival (or `now`, whichever is earlier; see
    /// [`NormalizedBatch::received`]) dated at it: how many. Done again on a batch already dated,
    /// it changes nothing, so a batch can be dated before it is written to the evidence journal
    /// (the journal then holds the dates it was decided on) and again as it is taken in.
    pub fn date_receipts(batch: &mut NormalizedBatch, now: Moment) -> u64 {
        cap_future_receipts(&mut batch.evidence, batch.received.map_or(now, |r| r.min(now)))
    }

    /// Count receipts dated by [`Self::date_receipts`] before [`Self::ingest`] took their batch.
    pub fn count_dated_receipts(&mut self, n: u64) {
        self.receipts_capped += n;
    }

    /// Take in one normalized batch at `now`.
    pub fn ingest(&mut self, mut batch: NormalizedBatch, now: Moment, out: &mut Vec<Decided>) {
        self.now = now;
        self.receipts_capped += Self::date_receipts(&mut batch, now);
        self.chains.drop_duplicates(&mut batch.evidence);
        self.started_ns.get_or_insert(now.as_nanos());
        self.replica.touched();
        out.extend(batch.evidence.iter().filter_map(|e| e.finding.as_deref()).map(|f| Decided::Finding(Box::new(f.clone()))));
        let changes = self.sessions.observe(&batch.evidence, now);
        self.publish_catalog(changes, out);
        if let Some(pins) = self.pins.clone() {
            self.detect_drift(&batch.evidence, &pins, out);
        }
        lend!(self, |r, t| r.before_ingest(&mut t, &batch.evidence));
        let mut decided = std::mem::take(&mut self.scratch);
        self.chains.ingest(batch, now, &mut decided);
        self.classify_decided(&mut decided, now, false, out);
        self.scratch = decided;
        self.persist(now, false, out);
        self.publish_merged(out);
    }

    /// Let time pass to `now`: decide due chains, move time-based verdicts (TTL expiry, `max_age`,
    /// progress clocks), forget idle sessions.
    pub fn tick(&mut self, now: Moment, out: &mut Vec<Decided>) {
        self.tick_within(now, usize::MAX, out);
    }

    /// [`tick`](Self::tick), deciding at most about `budget` calls of the chains due (see
    /// `Chains::tick_within`): the rest are due still ([`next_due`](Self::next_due) says so) and
    /// are decided first by the next step, in the same order. A burst of chains falling due at
    /// once is then held a budget at a time — its calls, verdicts and what the sinks make of them
    /// — not all together.
    pub fn tick_within(&mut self, now: Moment, budget: usize, out: &mut Vec<Decided>) {
        self.now = now;
        let mut decided = std::mem::take(&mut self.scratch);
        let hold = lend!(self, |r, t| r.before_decide(&mut t, now, false, &mut decided));
        if !hold {
            self.chains.tick_within(now, budget, &mut decided);
        }
        if self.last_reevaluated.is_none_or(|t| now.saturating_duration_since(t) >= REEVALUATE_EVERY) {
            self.last_reevaluated = Some(now);
            lend!(self, |r, t| r.every_second(&mut t, now, false));
            self.publish_merged(out);
            let changes = self.sessions.reevaluate(now);
            self.publish_catalog(changes, out);
            self.check_progress(now, &mut decided, out);
        }
        if self.last_expired.is_none_or(|t| now.saturating_duration_since(t) >= EXPIRE_EVERY) {
            self.last_expired = Some(now);
            let gone = self.sessions.expire(now);
            self.board.forget(&gone);
        }
        self.classify_decided(&mut decided, now, false, out);
        self.scratch = decided;
        self.persist(now, false, out);
        self.publish_merged(out);
    }

    /// Decide everything still in flight (shutdown, end of a replay), marked `by`.
    pub fn drain(&mut self, by: DecidedBy, now: Moment, out: &mut Vec<Decided>) {
        self.now = now;
        lend!(self, |r, t| r.every_second(&mut t, now, true));
        self.publish_merged(out);
        let mut decided = std::mem::take(&mut self.scratch);
        lend!(self, |r, t| r.before_decide(&mut t, now, true, &mut decided));
        self.chains.drain(by, now, &mut decided);
        self.classify_decided(&mut decided, now, true, out);
        self.scratch = decided;
        self.persist(now, true, out);
        self.finish_replica(false, out);
        self.publish_merged(out);
        self.persist(now, true, out);
        self.finish_replica(true, out);
    }

    /// Write every pending change to the store now, and take every answer awaited (tests call it
    /// to let a shared store settle; the driver stops with [`Engine::drain`]).
    pub fn flush_store(&mut self, now: Moment, out: &mut Vec<Decided>) {
        let mut none = Vec::new();
        self.classify_decided(&mut none, now, true, out);
        self.persist(now, true, out);
        self.finish_replica(true, out);
    }

    /// The replica's end (see [`Replica::finish`]); the verdicts it hands back are folded here,
    /// like any verdict it does not hold.
    fn finish_replica(&mut self, catalog: bool, out: &mut Vec<Decided>) {
        let unfolded = lend!(self, |r, t| r.finish(&mut t, catalog, out));
        for v in unfolded {
            out.extend(Decided::incidents(self.incidents.fold(&v)));
        }
    }

    fn persist(&mut self, now: Moment, force: bool, out: &mut Vec<Decided>) {
        lend!(self, |r, t| r.persist(&mut t, now, force, out));
    }

    /// The figures the metric sinks report as gauges.
    pub fn gauges(&self) -> Gauges {
        let (incidents_open, convergence) = match self.replica.gauges() {
            GaugeSource::Own => {
                let mut open = FxHashMap::default();
                count_open(&mut open, self.incidents.open_incidents());
                (open, self.sessions.convergence_counts())
            }
            GaugeSource::Global((open, convergence)) => (open.clone(), convergence.clone()),
            GaugeSource::Elsewhere => Default::default(),
        };
        let f = self.replica.figures();
        Gauges {
            chains_in_flight: self.chains.in_flight() as u64,
            evidence_bytes: self.chains.bytes() as u64,
            chain_stats: self.chains.stats.clone(),
            join_stats: self.chains.cross.stats.clone(),
            state_skipped: f.skipped,
            incidents_open,
            convergence,
            gauge_leader: self.replica.gauge_leader(),
            working: self.working.clone(),
            callless_chains: self.callless_chains,
            receipts_capped: self.receipts_capped,
            journal_replayed: self.journal_replayed,
            store_errors: f.store_errors,
            store_conflicts: f.store_conflicts,
            incidents_unshared: f.incidents_unshared,
            store_queue_waits: f.queue_waits,
            store: f.store,
        }
    }

    /// The current catalog verdict of every session, evaluated at `now` (for `replay`).
    pub fn catalog_rows(&self, now: Moment) -> Vec<crate::correlate::CatalogChange> {
        self.sessions.all_at(now)
    }

    /// Every tool definition discovered, in (server, tool, time) order (for `lock`).
    pub fn discoveries(&self) -> Vec<crate::correlate::Discovery> {
        self.sessions.discoveries()
    }

    /// Publish catalog changes: on the gate's board and as records — unless the replica holds
    /// them (on a shared store, to the write that records them as emitted).
    fn publish_catalog(&mut self, changes: Vec<crate::correlate::CatalogChange>, out: &mut Vec<Decided>) {
        let now = self.now;
        for ch in changes {
            let Some(ch) = lend!(self, |r, t| r.hold_catalog(&mut t, now, ch, out)) else { continue };
            self.board.publish(&ch.session_key, ch.server.clone(), ch.verdict.clone());
            let converged =
                (ch.verdict.convergence == Convergence::Converged).then(|| (ch.session_key.clone(), ch.server.clone(), ch.at_ns));
            out.push(Decided::Catalog(Box::new(ch)));
            if let Some((session_key, server, at_ns)) = converged {
                // A catalog-caused incident resolves when the catalog converges (one process: on
                // a shared store incidents are folded from verdicts only, see the README).
                let (session, agent) = match session_key.strip_prefix("session:") {
                    Some(sid) => (Some(crate::evidence::hash::session_hash(sid)), None),
                    None => (None, session_key.strip_prefix("client:").and_then(|r| r.split_once("|server:")).map(|(a, _)| a)),
                };
                out.extend(Decided::incidents(self.incidents.catalog_converged(server.as_ref(), session.as_deref(), agent, at_ns)));
            }
        }
    }

    /// Sessions that another instance's evidence (read from a shared store) added to.
    pub fn sessions_merged(&self) -> u64 {
        self.sessions.merges
    }

    /// Publish the catalog verdicts that evidence merged from a shared store changed.
    fn publish_merged(&mut self, out: &mut Vec<Decided>) {
        let changes = self.sessions.take_merged_changes();
        self.publish_catalog(changes, out);
    }

    /// Fold a verdict into the incidents (unless the replica folds it in the store, where the
    /// instance whose write made a transition emits it, once across instances).
    fn observe_incidents(replica: &mut dyn Replica, incidents: &mut IncidentBook, v: &Verdict, out: &mut Vec<Decided>) {
        if replica.hold_verdict(v) {
            return;
        }
        out.extend(Decided::incidents(incidents.observe(v)));
    }

    /// Hand what was just decided to the replica and classify what it hands back ready (at once
    /// without a shared store; with one, once the chains' shared parts have been read, in the
    /// order decided). `settle`: every answer awaited is waited for.
    fn classify_decided(&mut self, decided: &mut Vec<DecidedCalls>, now: Moment, settle: bool, out: &mut Vec<Decided>) {
        let mut ready = std::mem::take(&mut self.ready);
        if !decided.is_empty() {
            let batch = (now, std::mem::take(decided));
            lend!(self, |r, t| r.admit(&mut t, batch, &mut ready));
        }
        lend!(self, |r, t| r.ready(&mut t, now, settle, &mut ready));
        self.publish_merged(out);
        for (at, mut batch) in ready.drain(..) {
            self.classify_batch(&mut batch, at, out);
            if decided.capacity() < batch.capacity() {
                *decided = batch;
            }
        }
        self.ready = ready;
    }

    fn classify_batch(&mut self, decided: &mut Vec<DecidedCalls>, now: Moment, out: &mut Vec<Decided>) {
        let store_down = self.store_down();
        for d in decided.drain(..) {
            if !d.calls.iter().any(|c| c.method.is_some()) && d.previous.is_empty() {
                // A verifier alone, an HTTP span alone: nothing was called, so nothing is judged.
                self.callless_chains += 1;
                self.chains.recycle_calls(d.calls);
                continue;
            }
            let since = self.partial_grace_ns.zip(self.started_ns).map(|(grace_ns, start_ns)| Since { start_ns, grace_ns });
            let earliest = d.calls.iter().map(|c| c.start_ns).filter(|t| *t > 0).min();
            let partial = partial_reason(d.decision.decided_by, earliest, since, self.restored.contains(&d.trace_id), store_down);
            let previous_partial = if d.previous.is_empty() { None } else { self.partial_decided.get(&d.trace_id).copied() };
            match partial {
                Some(why) => {
                    self.partial_decided.insert(d.trace_id, why);
                }
                None => {
                    self.partial_decided.remove(&d.trace_id);
                }
            }
            // Each verdict taken as it is made, not gathered first: a verdict is most of a
            // kilobyte, and every step through an iterator or a vector moved it again.
            let pins = Pins::of(self.pins.as_deref(), &self.definitions);
            let (replica, incidents, spare) = (&mut *self.replica, &mut self.incidents, &mut self.spare_verdicts);
            each_verdict_superseding(&d, &self.sessions, pins, &self.progress, now.as_nanos(), previous_partial, |mut v| {
                if let Some(why) = partial {
                    crate::classify::partial::mark(&mut v, why);
                }
                Self::observe_incidents(replica, incidents, &v, out);
                out.push(Decided::Call(Self::shared(spare, v)));
            });
            self.chains.recycle_calls(d.calls);
        }
    }

    /// Check the clocks of calls in flight with progress: report each working call once (interim),
    /// hold its chain past `max_wait`, decide it when a clock expires.
    fn check_progress(&mut self, now: Moment, decided: &mut Vec<DecidedCalls>, out: &mut Vec<Decided>) {
        let mut working: FxHashMap<(String, String), u64> = FxHashMap::default();
        let now_ns = now.as_nanos();
        for id in self.chains.progress_chains() {
            let Some(calls) = self.chains.peek_calls(&id) else { continue };
            let (mut hold, mut expired) = (false, false);
            for c in &calls {
                if let Some(standing) = crate::classify::progress::standing(c, &self.progress, now_ns) {
                    match standing {
                        Standing::Working | Standing::Waiting => {
                            hold = true;
                            if standing == Standing::Working {
                                *working
                                    .entry((c.tool.as_deref().unwrap_or("").to_string(), c.server.as_deref().unwrap_or("").to_string()))
                                    .or_default() += 1;
                            }
                            // Reported once per call and standing (a waiting call that then runs
                            // as a working task is reported again).
                            let key = (c.trace_id, c.anchor_span_id);
                            let fresh = if standing == Standing::Waiting {
                                self.waiting_reported.insert(key)
                            } else {
                                self.working_reported.insert(key)
                            };
                            if fresh {
                                out.push(self.interim(c, now_ns));
                            }
                        }
                        Standing::Expired(_) => expired = true,
                    }
                    continue;
                }
                if c.progress.is_empty() {
                    continue;
                }
                let f = crate::classify::progress::check(c);
                match crate::classify::progress::in_flight(c, &f, self.progress.clocks(c.tool.as_deref()), now_ns) {
                    InFlight::Working => {
                        hold = true;
                        *working
                            .entry((c.tool.as_deref().unwrap_or("").to_string(), c.server.as_deref().unwrap_or("").to_string()))
                            .or_default() += 1;
                        if self.working_reported.insert((c.trace_id, c.anchor_span_id)) {
                            out.push(self.interim(c, now_ns));
                        }
                    }
                    InFlight::InactivityExceeded | InFlight::DeadlineExceeded => expired = true,
                    _ => {}
                }
            }
            self.chains.set_hold(&id, hold);
            if expired && !hold {
                self.chains.decide_now(id, DecidedBy::Clock, now, decided);
            }
        }
        self.working = working;
    }

    /// The interim report of a call still in flight (`working`, `waiting`); its final verdict follows.
    fn interim(&self, c: &CallEvidence, now_ns: u64) -> Decided {
        let d = Decision { revision: 0, decided_by: DecidedBy::InFlight, root_seen: false, truncated: false };
        Decided::Interim(Arc::new(classify_with_clocks(c, &self.sessions, self.pins(), &self.progress, now_ns, d)))
    }

    /// Check the tools of every `tools/list` page in `spans` against the pins; each drifted
    /// (server, tool, digest) is reported once.
    fn detect_drift(&mut self, spans: &[SpanEvidence], pins: &Lockfile, out: &mut Vec<Decided>) {
        for s in spans {
            let (Some(server), Some(page)) = (&s.server, s.catalog.as_ref().and_then(|c| c.page.as_ref())) else { continue };
            for (tool, digest) in &page.tools {
                let key = (server.clone(), tool.clone(), digest.clone());
                if self.drift_reported.contains(&key) {
                    continue;
                }
                if let PinCheck::Drift { pinned_digest, changes } =
                    pins.check(server, tool, digest, self.definitions.lookup(digest).as_ref())
                {
                    self.drift_reported.insert(key.clone());
                    let event = DriftEvent {
                        drift: true,
                        server: server.to_string(),
                        tool: tool.to_string(),
                        pinned_digest,
                        digest: digest.to_string(),
                        changes,
                        trace_id: s.trace_id,
                        span_id: s.span_id,
                    };
                    let record = crate::state::DriftRecord { server: key.0, tool: key.1, digest: key.2 };
                    out.extend(self.replica.report_drift(record, event).map(|e| Decided::Drift(Box::new(e))));
                }
            }
        }
    }
}

/// The pins calls are checked against, with the tool definitions seen (what a drift diffs
/// against).
#[derive(Clone, Copy)]
pub struct Pins<'a> {
    pub lockfile: &'a Lockfile,
    pub definitions: &'a crate::normalize::definitions::Definitions,
}

impl<'a> Pins<'a> {
    /// The pins to check against, when a lockfile is configured.
    fn of(lockfile: Option<&'a Lockfile>, definitions: &'a crate::normalize::definitions::Definitions) -> Option<Self> {
        lockfile.map(|lockfile| Pins { lockfile, definitions })
    }
}

/// The session facts a call is classified with: its catalog's convergence when the call started,
/// and whether the tool definition it used differs from its pin.
pub fn session_context(sessions: &Sessions, pins: Option<Pins<'_>>, c: &CallEvidence) -> SessionContext {
    // Catalog staleness and drift are about choosing a tool; a `tools/list` is the remedy, not a victim.
    if c.method != Some(Method::ToolsCall) {
        return SessionContext::default();
    }
    // No session has catalog evidence: nothing to look up, no key to build.
    let key = (!sessions.is_empty()).then(|| c.session_key()).flatten();
    let catalog = key.as_ref().and_then(|k| sessions.verdict_at(k, c.start_ns));
    let mut ctx = SessionContext {
        catalog_stale: catalog.as_ref().map(|v| v.convergence == Convergence::Stale),
        tool_in_catalog: catalog.as_ref().zip(c.tool.as_deref()).and_then(|(v, t)| v.knows_tool(t)),
        ..SessionContext::default()
    };
    if let (Some(pins), Some(server), Some(tool)) = (pins, c.server.as_deref(), c.tool.as_deref()) {
        let in_use = c.tool_digest.clone().or_else(|| key.as_ref().and_then(|k| sessions.tool_digest_at(k, tool, c.start_ns)));
        if let Some(d) = in_use {
            if let PinCheck::Drift { changes, .. } = pins.lockfile.check(server, tool, &d, pins.definitions.lookup(&d).as_ref()) {
                ctx.contract_drift = Some(changes);
            }
        }
    }
    ctx
}

/// Whether a verdict is worth reporting: every `tools/call`, and any other request that failed
/// somewhere. A successful `tools/list` or `initialize` has no outcome to verify; reporting it as
/// `unverified` would be noise, and it is covered by the catalog verdict.
pub fn reportable(v: &Verdict) -> bool {
    v.is_tools_call() || v.attempt || v.first_failed_layer.is_some() || !matches!(v.state, HealthState::Unverified | HealthState::Healthy)
}

/// Classify a decided chain.
#[cfg(test)]
pub fn verdicts_of(d: &DecidedCalls, sessions: &Sessions, pins: Option<Pins<'_>>, progress: &ProgressPolicy, now_ns: u64) -> Vec<Verdict> {
    let mut all = Vec::new();
    each_verdict_superseding(d, sessions, pins, progress, now_ns, None, |v| all.push(v));
    all
}

/// Each reportable verdict of a decided chain, in order, to `take`; where the previous decision
/// of a revised chain was marked partial (`previous_partial`), what a revision supersedes is the
/// verdict as it was reported, capped.
fn each_verdict_superseding(
    d: &DecidedCalls,
    sessions: &Sessions,
    pins: Option<Pins<'_>>,
    progress: &ProgressPolicy,
    now_ns: u64,
    previous_partial: Option<Partial>,
    mut take: impl FnMut(Verdict),
) {
    let classify = |c: &CallEvidence| classify_with_clocks(c, sessions, pins, progress, now_ns, d.decision);
    let previous: Vec<Verdict> = d
        .previous
        .iter()
        .map(classify)
        .map(|mut v| {
            if let Some(why) = previous_partial {
                crate::classify::partial::mark(&mut v, why);
            }
            v
        })
        .filter(reportable)
        .collect();
    for c in &d.calls {
        let mut v = classify(c);
        if !reportable(&v) {
            continue;
        }
        // A revision names what it replaces: the same call is the one under the same span, or,
        // for a multi-round call, under the span of one of its rounds (a round decided before
        // the others arrived), or the one that rested on the same server span (a call first
        // decided from its server half alone, which its client half joined late).
        let same = |p: &&Verdict| {
            p.span_id == v.span_id
                || c.round_spans.contains(&p.span_id)
                || (p.server_span_id.is_some() && p.server_span_id == v.server_span_id)
        };
        v.supersedes = previous.iter().find(same).map(|p| crate::verdict::Superseded {
            state: p.state,
            protocol_success: p.protocol_success,
            verified_success: p.verified_success,
            unconfirmed: p.unconfirmed(),
        });
        take(v);
    }
}

/// Classify a call with its session context and its progress clocks at `now_ns`.
pub fn classify_with_clocks(
    c: &CallEvidence,
    sessions: &Sessions,
    pins: Option<Pins<'_>>,
    progress: &ProgressPolicy,
    now_ns: u64,
    d: Decision,
) -> Verdict {
    let mut ctx = session_context(sessions, pins, c);
    if let Some(standing) = crate::classify::progress::standing(c, progress, now_ns) {
        return match standing {
            Standing::Working => {
                ctx.working = true;
                classify_call(c, &ctx, d)
            }
            Standing::Waiting => {
                ctx.waiting = true;
                classify_call(c, &ctx, d)
            }
            Standing::Expired(why) => {
                let mut c = c.clone();
                c.clock_expired = Some(why);
                classify_call(&c, &ctx, d)
            }
        };
    }
    if c.progress.is_empty() {
        return classify_call(c, &ctx, d);
    }
    let f = crate::classify::progress::check(c);
    match crate::classify::progress::in_flight(c, &f, progress.clocks(c.tool.as_deref()), now_ns) {
        InFlight::Working => {
            ctx.working = true;
            classify_call(c, &ctx, d)
        }
        expired @ (InFlight::InactivityExceeded | InFlight::DeadlineExceeded) => {
            let mut c = c.clone();
            c.clock_expired = Some(if expired == InFlight::DeadlineExceeded { "deadline_exceeded" } else { "inactivity_exceeded" });
            classify_call(&c, &ctx, d)
        }
        _ => classify_call(c, &ctx, d),
    }
}

#[cfg(test)]
mod partial_tests;
#[cfg(test)]
mod store_tests;
#[cfg(test)]
mod tests;

/// How far past its arrival a receipt may say it checked (the two clocks may differ a little).
const RECEIPT_CLOCK_SLACK: std::time::Duration = std::time::Duration::from_secs(2);

/// Receipts that say they checked later than they arrived (plus [`RECEIPT_CLOCK_SLACK`]) are
/// dated at their arrival: "the latest receipt decides", so a receipt dated in the future would
/// otherwise outrank every real one after it. How many were capped.
fn cap_future_receipts(evidence: &mut [SpanEvidence], now: Moment) -> u64 {
    let latest = (now + RECEIPT_CLOCK_SLACK).as_nanos();
    let mut capped = 0;
    for ev in evidence.iter_mut().filter(|e| !e.outcomes.is_empty()) {
        if ev.outcomes.iter().any(|o| o.checked_at_ns > latest) {
            let mut v = ev.outcomes.to_vec();
            for o in v.iter_mut().filter(|o| o.checked_at_ns > latest) {
                o.checked_at_ns = now.as_nanos();
                capped += 1;
            }
            ev.outcomes = v.into();
        }
    }
    capped
}

/// Count open incidents by (first failed layer, state, server, incident state).
fn count_open<'a>(m: &mut FxHashMap<[String; 4], u64>, incidents: impl Iterator<Item = &'a crate::classify::incidents::Incident>) {
    for inc in incidents {
        let c = &inc.cause;
        let key = [
            c.first_failed_layer.map_or("none", |l| l.as_str()).to_string(),
            c.state.as_str().to_string(),
            c.server.as_deref().unwrap_or("").to_string(),
            inc.state.as_str().to_string(),
        ];
        *m.entry(key).or_default() += 1;
    }
}
