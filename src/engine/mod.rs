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
//! With a state store ([`EngineConfig::store`], `storage.directory`), the engine records which
//! keys of that state changed and writes them as one transaction at most every
//! [`crate::state::PERSIST_EVERY`] of its own time and at every drain; it loads them back when it
//! is made (sessions, and the gate's view from them; open incidents and recoveries; decided chains
//! still in their late-span window, with their operation keys; drift reported). A store error is
//! logged and counted and the engine goes on in memory: no verdict depends on a write.
//!
//! A chain whose evidence may be split — decided at shutdown or by eviction, decided while the
//! store is unavailable, or (with [`EngineConfig::partial_before_start`]) started before the
//! engine's first ingest — is marked partial after classification and never comes out `healthy`
//! (`classify::partial`). A receipt for a call another instance decided (a ring change) takes
//! that chain from a shared store and revises it here (`take_over_from_store`).

pub mod decided;

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
use crate::verdict::{DecidedBy, HealthState, Verdict};

pub use decided::{CatalogLine, Decided, DriftEvent, IncidentChange};

/// How often (on the engine's clock) time-based verdicts are re-evaluated: catalog TTLs and
/// `max_age` policies, and the progress clocks of calls in flight.
const REEVALUATE_EVERY: Duration = Duration::from_secs(1);
/// How often idle sessions are expired.
const EXPIRE_EVERY: Duration = Duration::from_secs(10);
/// Converged sessions read back from a shared store per re-evaluation (one pipeline).
const CONVERGED_REFRESH: usize = 512;
/// Verdicts held for the incident fold on a shared store (see `sync_incidents`); past it a
/// verdict is folded into this instance's own book and its transitions emitted at once
/// (counted: `incidents_unshared`), so an alert is never lost for want of the store.
const MAX_PENDING_INCIDENT_VERDICTS: usize = 50_000;
/// The gauge lease on a shared store: renewed every re-evaluation (1 s), lost `GAUGE_LEASE` after
/// its holder stops renewing it.
const GAUGE_LEASE: Duration = Duration::from_secs(5);
/// How often the holder of the gauge lease counts every instance's incidents and sessions in the
/// store (one `SCAN` of each table).
const GLOBAL_GAUGES_EVERY: Duration = Duration::from_secs(10);
/// Refused-looking HTTP spans kept per second in a shared store (the latest go in).
const REFUSALS_PER_SECOND: usize = 256;
/// How long after a refused-looking client request is decided its seconds are still read from a
/// shared store (an HTTP span routed elsewhere that arrives later still revises it).
const REFUSAL_PULL_RECENT: Duration = Duration::from_secs(10);
/// Most seconds of refusals read in one step, and how often they are read at most.
const REFUSAL_SECONDS_PER_PULL: usize = 64;
const REFUSAL_PULL_EVERY: Duration = Duration::from_millis(20);
/// Verifiers kept per operation key in a shared store (as `chains`' own bound per key).
const MAX_SHARED_PARKED_PER_KEY: usize = 16;
/// How long a `converged` catalog verdict is held on a shared store before a read of the store
/// confirms it: longer than an instance takes to write what it received (`PERSIST_EVERY`).
const CONFIRM_CONVERGED_AFTER: Duration = Duration::from_millis(250);
/// Catalog changes held for emission on a shared store, at most.
const MAX_PENDING_CATALOG: usize = 100_000;
/// How long chains wait for a shared store that is down before they are decided without it.
const STORE_DOWN_HOLD: Duration = Duration::from_secs(5);

/// Everything the engine is configured with.
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
    /// Where the cross-trace state is kept beyond the process (`storage`); `None` keeps it in
    /// the engine's own tables only.
    pub store: Option<crate::state::StoreHandle>,
    /// Mark partial the chains whose earliest call predates the engine's first ingest less
    /// `decision_wait` (`processors.mcp_health.partial_before_start`; see `classify::partial`).
    pub partial_before_start: bool,
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
    /// Loads and writes of the state store that failed (the engine went on in memory).
    pub store_errors: u64,
    /// Writes a shared store refused because another instance changed the record first (they
    /// are read, merged and written again).
    pub store_conflicts: u64,
    /// Verdicts folded into this instance's incidents alone, not the shared store's (the store
    /// was unreachable past the bound, or at shutdown): their transitions may be emitted by
    /// another instance as well.
    pub incidents_unshared: u64,
}

/// What the holder of the gauge lease last counted in a shared store, and when (engine time):
/// open incidents and sessions, grouped as in [`Gauges`].
type GlobalGauges = (Moment, FxHashMap<[String; 4], u64>, FxHashMap<(String, Convergence), u64>);

/// The engine. See the module documentation.
pub struct Engine {
    chains: Chains,
    sessions: Sessions,
    pins: Option<Arc<Lockfile>>,
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
    board: Arc<crate::gate::CatalogBoard>,
    last_reevaluated: Option<Moment>,
    last_expired: Option<Moment>,
    callless_chains: u64,
    scratch: Vec<DecidedCalls>,
    store: Option<crate::state::StoreHandle>,
    last_persisted: Option<Moment>,
    store_errors: u64,
    /// Drift reported since the last write to the store.
    drift_dirty: Vec<crate::state::DriftRecord>,
    /// Engine time of the first ingest: what predates it (less the grace) may be split.
    started_ns: Option<u64>,
    /// `decision_wait` in ns, the grace of the start rule; `None` when the rule is off.
    partial_grace_ns: Option<u64>,
    /// Decided chains restored or taken over from the store: their earlier evidence came back
    /// with them, so the start rule does not apply to them. As many as decided chains are kept
    /// for revision (`max_decided`); past it the oldest go, counted.
    restored: crate::bounded::BoundedSet<crate::evidence::TraceId>,
    /// The store's last load, read or write failed (a conflict is not a failure: the store
    /// answered). Verdicts decided meanwhile are partial (`store_unavailable`).
    store_down: bool,
    /// Decided chains taken from the store for a receipt that came to this engine.
    taken_over: u64,
    /// Sessions another instance's evidence added to (shared store).
    sessions_merged: u64,
    /// Where the next read-back of converged sessions starts (see `refresh_converged`).
    refresh_cursor: usize,
    /// Chains whose last decision was marked partial, and why: a revision supersedes the
    /// verdict as reported (capped), so the success counts it undoes are the ones it added.
    /// As many as decided chains are kept for revision.
    partial_decided: crate::bounded::BoundedMap<crate::evidence::TraceId, crate::classify::partial::Partial>,
    /// With a shared store: the verdicts decided here and not yet folded into the store's
    /// incidents, by server (see `sync_incidents`); their count.
    pending_incidents: std::collections::BTreeMap<Option<Arc<str>>, Vec<Verdict>>,
    pending_incident_verdicts: usize,
    store_conflicts: u64,
    incidents_unshared: u64,
    /// On a shared store: this instance holds the gauge lease, and the global figures it last
    /// counted in the store (with the engine time it counted them).
    gauge_leader: bool,
    global_gauges: Option<GlobalGauges>,
    /// On a shared store: orphans to publish (kept across a failed write), the refusal records
    /// this instance wrote and when (deleted `late_span_window` after), and the last read of them.
    pending_orphans: Vec<SpanEvidence>,
    pending_halves: Vec<crate::state::ClientHalf>,
    pending_parked: Vec<(Box<str>, SpanEvidence)>,
    /// On a shared store: drift detected here, reported once its record is created (`sync_drift`).
    pending_drift: Vec<(crate::state::DriftRecord, DriftEvent)>,
    shared_written: FxHashMap<crate::state::Table, std::collections::VecDeque<(Moment, String)>>,
    last_refusal_pull: Option<Moment>,
    late_span_window: Duration,
    /// Evidence was taken in since the last write to the store (see `next_due`).
    unwritten: bool,
    /// On a shared store: catalog changes held for emission, with when they are due (see
    /// `publish_catalog`); and the engine time of the current step.
    pending_catalog: Vec<(Moment, crate::correlate::CatalogChange)>,
    now: Moment,
    /// Since when a shared store has been down (see `hold_for_store`), and its last probe.
    store_down_since: Option<Moment>,
    last_probe: Option<Moment>,
    /// The last look for parked verifiers' calls in a shared store (`find_parked_calls`).
    last_parked_lookup: Option<Moment>,
}

impl Engine {
    pub fn new(cfg: EngineConfig) -> Self {
        let store = cfg.store.clone();
        let grace = u64::try_from(cfg.chains.decision_wait.as_nanos()).unwrap_or(u64::MAX);
        let partial_grace_ns = cfg.partial_before_start.then_some(grace);
        let max_decided = cfg.chains.max_decided.max(1);
        let late_span_window = cfg.chains.late_span_window;
        let mut e = Engine {
            chains: Chains::new(cfg.chains),
            sessions: Sessions::new(cfg.sessions),
            pins: cfg.pins,
            progress: cfg.progress,
            incidents: IncidentBook::default(),
            drift_reported: crate::bounded::BoundedSet::with_capacity("drift_reported", cfg.max_drift_reported),
            working_reported: crate::bounded::BoundedSet::with_capacity("working_reported", cfg.max_working_reported),
            waiting_reported: crate::bounded::BoundedSet::with_capacity("waiting_reported", cfg.max_working_reported),
            working: FxHashMap::default(),
            board: Arc::default(),
            last_reevaluated: None,
            last_expired: None,
            callless_chains: 0,
            scratch: Vec::new(),
            store: None,
            last_persisted: None,
            store_errors: 0,
            drift_dirty: Vec::new(),
            started_ns: None,
            partial_grace_ns,
            restored: crate::bounded::BoundedSet::with_capacity("restored_decided", max_decided),
            store_down: false,
            taken_over: 0,
            sessions_merged: 0,
            refresh_cursor: 0,
            partial_decided: crate::bounded::BoundedMap::with_capacity("partial_decided", max_decided),
            pending_incidents: Default::default(),
            pending_incident_verdicts: 0,
            store_conflicts: 0,
            incidents_unshared: 0,
            gauge_leader: false,
            global_gauges: None,
            pending_orphans: Vec::new(),
            pending_halves: Vec::new(),
            pending_parked: Vec::new(),
            pending_drift: Vec::new(),
            shared_written: Default::default(),
            last_refusal_pull: None,
            late_span_window,
            unwritten: false,
            pending_catalog: Vec::new(),
            now: Moment::from_nanos(0),
            store_down_since: None,
            last_probe: None,
            last_parked_lookup: None,
        };
        if let Some(store) = store {
            e.attach(store);
        }
        e
    }

    /// Take back the state kept in `store` and keep it there from now on.
    fn attach(&mut self, store: crate::state::StoreHandle) {
        self.chains.track_changes();
        self.sessions.track_changes();
        if !store.is_shared() {
            // A shared store's incidents are folded in place (`sync_incidents`), not written
            // from this book.
            self.incidents.track_changes();
        } else {
            self.chains.share_orphans();
        }
        match store.load() {
            Ok(snap) => self.restore(snap),
            Err(e) => {
                // Carry on in memory: nothing is judged from a state that could not be read.
                self.store_failed();
                tracing::error!(error = %e, "could not load the state store; starting with empty state");
            }
        }
        self.store = Some(store);
    }

    fn restore(&mut self, mut snap: crate::state::Snapshot) {
        let counts = (snap.sessions.len(), snap.incidents.len(), snap.decided.len());
        for (key, r) in snap.sessions {
            self.sessions.restore(key, r);
        }
        for (key, server, verdict) in self.sessions.all_current() {
            self.board.publish(&key, server, verdict);
        }
        for part in snap.incidents {
            self.incidents.restore(part);
        }
        // Oldest first, so the late-span window and `max_decided` forget them in order.
        snap.decided.sort_by_key(|d| d.decided_at_ns);
        for d in snap.decided {
            self.restored.insert(d.trace_id);
            self.chains.restore_decided(d);
        }
        for (key, trace) in snap.operations {
            self.chains.restore_operation(&key, trace);
        }
        for d in snap.drift_reported {
            self.drift_reported.insert((d.server, d.tool, d.digest));
        }
        tracing::info!(sessions = counts.0, incidents = counts.1, decided = counts.2, "state loaded from the store");
    }

    /// Write what changed to the store: at most every `PERSIST_EVERY` of engine time, and
    /// whenever `force`. A failed write is logged and counted; the engine goes on in memory (its
    /// verdicts never depend on the store having taken a write).
    fn persist(&mut self, now: Moment, force: bool, out: &mut Vec<Decided>) {
        let Some(store) = self.store.clone() else { return };
        if !force && self.last_persisted.is_some_and(|t| now.saturating_duration_since(t) < crate::state::PERSIST_EVERY) {
            return;
        }
        self.last_persisted = Some(now);
        self.unwritten = false;
        let shared = store.is_shared();
        let mut stored_emitted: FxHashMap<String, Option<Convergence>> = FxHashMap::default();
        let mut emitting: Vec<crate::correlate::CatalogChange> = Vec::new();
        if shared {
            self.sync_drift(&store, out);
            self.sync_incidents(&store, out);
            self.publish_shared_lists(&store, now);
            // Catalog changes held for emission whose time has come: their sessions are read and
            // written now, so the write decides who emits them.
            for (_, ch) in self.pending_catalog.iter().filter(|(at, _)| force || *at <= now) {
                self.sessions.mark_dirty(&ch.session_key);
            }
            // Sessions are written by every instance that sees a trace of them: read what the
            // others wrote and write the union (compare-and-set on the version just read), so a
            // session converges on all its evidence instead of on whichever instance wrote first.
            let keys = self.sessions.dirty_keys();
            let mut read = false;
            if !keys.is_empty() {
                match store.get_many(crate::state::Table::Sessions, &keys) {
                    Ok(records) => {
                        read = true;
                        for (k, r) in keys.iter().zip(&records) {
                            let emitted = match r {
                                Some(crate::state::Record::Session(r)) => r.emitted,
                                _ => None,
                            };
                            stored_emitted.insert(k.clone(), emitted);
                        }
                        self.merge_sessions(&keys, records);
                    }
                    Err(e) => {
                        self.store_failed();
                        tracing::warn!(error = %e, sessions = keys.len(), "could not read sessions from the state store");
                    }
                }
            }
            // What the merge changed is a catalog change too (held like any other).
            let merged = self.sessions.take_merged_changes();
            self.publish_catalog(merged, out);
            if read {
                // A change is emitted by the instance whose write records it as emitted: one
                // already recorded by another instance is dropped here.
                let mut keep = Vec::new();
                for (at, ch) in std::mem::take(&mut self.pending_catalog) {
                    if !self.sessions.contains(&ch.session_key) {
                        // Forgotten here meanwhile (idle, or a bound): nothing to write it with.
                        self.board.publish(&ch.session_key, ch.server.clone(), ch.verdict.clone());
                        out.push(Decided::Catalog(ch));
                        continue;
                    }
                    let ready = (force || at <= now) && stored_emitted.contains_key(&ch.session_key);
                    if !ready {
                        keep.push((at, ch));
                        continue;
                    }
                    let v = Some(ch.verdict.convergence);
                    if stored_emitted.get(&ch.session_key) == Some(&v) {
                        continue;
                    }
                    self.sessions.set_emitted(&ch.session_key, v);
                    emitting.push(ch);
                }
                self.pending_catalog = keep;
            }
        }
        let mut changes = crate::state::Changes::default();
        self.sessions.take_changes(&mut changes);
        self.incidents.take_changes(&mut changes);
        self.chains.take_changes(&mut changes);
        for d in self.drift_dirty.drain(..) {
            changes.put(d.key(), crate::state::Record::DriftReported(d));
        }
        let mut refused: Vec<String> = Vec::new();
        let mut failed = false;
        if !changes.is_empty() {
            match store.apply(&changes) {
                Ok(()) => self.store_down = false,
                Err(e) => {
                    let conflict = matches!(e, crate::state::StoreError::Conflict { .. });
                    if conflict {
                        self.store_conflicts += 1;
                    } else {
                        self.store_errors += 1;
                        failed = true;
                    }
                    self.store_down = !conflict;
                    if let crate::state::StoreError::Conflict { refused: r, .. } = &e {
                        refused = r.iter().filter(|(t, _)| *t == crate::state::Table::Sessions).map(|(_, k)| k.clone()).collect();
                    }
                    if conflict && shared {
                        // Another instance wrote one of them in between: read, merge and write the
                        // sessions again next time (the refused one among them).
                        for c in changes.changes.iter().filter(|c| c.table == crate::state::Table::Sessions) {
                            self.sessions.mark_dirty(&c.key);
                        }
                    }
                    tracing::warn!(error = %e, changes = changes.len(), "could not write the state store; going on in memory");
                }
            }
        }
        // The catalog changes this write recorded as emitted are emitted; one whose record was
        // refused (or a write that failed) waits for the next write, with what was emitted as the
        // store said.
        for ch in emitting {
            if failed || refused.contains(&ch.session_key) {
                let was = stored_emitted.get(&ch.session_key).copied().flatten();
                self.sessions.set_emitted(&ch.session_key, was);
                self.pending_catalog.push((now, ch));
            } else {
                self.board.publish(&ch.session_key, ch.server.clone(), ch.verdict.clone());
                out.push(Decided::Catalog(ch));
            }
        }
    }

    /// Late evidence for a decided chain forgotten under a bound (`max_decided`, `max_bytes`)
    /// within its late-span window: take the chain back from the store first, so the evidence
    /// revises it instead of being dropped.
    fn take_back_spilled(&mut self, spans: &[SpanEvidence]) {
        let Some(store) = self.store.clone() else { return };
        for ev in spans {
            let Some(id) = self.chains.spilled_target(ev) else { continue };
            match store.get(crate::state::Table::Decided, &crate::state::trace_key(&id)) {
                Ok(Some(crate::state::Record::Decided(r))) => {
                    self.store_down = false;
                    self.chains.unspill(id, Some(*r))
                }
                Ok(_) => {
                    self.store_down = false;
                    self.chains.unspill(id, None)
                }
                Err(e) => {
                    // The evidence is then late for a forgotten chain, as without a store.
                    self.store_failed();
                    self.chains.unspill(id, None);
                    tracing::warn!(error = %e, "could not read a decided chain back from the state store");
                }
            }
        }
    }

    /// A receipt for a trace this engine does not know (or naming an operation key no call here
    /// named), with no request of that trace (or key) in the same batch: the call may have been
    /// decided by another instance on the same shared store (the collector's ring changed
    /// between the call and its receipt, a verifier reported in a trace of its own, or an
    /// instance restarted). Take that decided chain (and its operation key) from the store
    /// first, so the receipt revises it here — one process would have revised it too — instead
    /// of making a call-less chain that says nothing. At most two store reads (operation key,
    /// chain) per such receipt and batch.
    fn take_over_from_store(&mut self, spans: &[SpanEvidence]) {
        let Some(store) = self.store.clone() else { return };
        let with_request: rustc_hash::FxHashSet<crate::evidence::TraceId> =
            spans.iter().filter(|s| s.method.is_some()).map(|s| s.trace_id).collect();
        let with_key: rustc_hash::FxHashSet<&str> =
            spans.iter().filter(|s| s.method.is_some()).filter_map(|s| s.operation_key.as_deref()).collect();
        let mut asked = rustc_hash::FxHashSet::default();
        for ev in spans {
            if ev.outcomes.is_empty() || ev.method.is_some() {
                continue;
            }
            let mut id = ev.trace_id;
            // A verifier in a trace of its own names its call's operation key: the call's trace
            // is in the store's operation index when another instance holds the call.
            let mut key = None;
            if let Some(k) = ev.operation_key.as_deref() {
                if self.chains.has_operation(k) || with_key.contains(k) {
                    continue;
                }
                match store.get(crate::state::Table::Operations, k) {
                    Ok(Some(crate::state::Record::Operation(t))) => {
                        self.store_down = false;
                        id = t;
                        key = Some(k);
                    }
                    Ok(_) => {
                        self.store_down = false;
                        continue;
                    }
                    Err(e) => {
                        self.store_failed();
                        tracing::warn!(error = %e, "could not look for an operation key in the state store");
                        continue;
                    }
                }
            }
            if with_request.contains(&id) || self.chains.knows(&id) || !asked.insert(id) {
                continue;
            }
            match store.get(crate::state::Table::Decided, &crate::state::trace_key(&id)) {
                Ok(Some(crate::state::Record::Decided(r))) => {
                    self.store_down = false;
                    self.taken_over += 1;
                    // Its earlier evidence comes with it: not "before the start".
                    self.restored.insert(id);
                    self.chains.restore_decided(*r);
                    if let Some(k) = key {
                        self.chains.restore_operation(k, id);
                    }
                }
                Ok(_) => self.store_down = false,
                Err(e) => {
                    self.store_failed();
                    tracing::warn!(error = %e, "could not look for a decided chain in the state store");
                }
            }
        }
    }

    /// Decided chains taken from the store for a receipt that came here (see
    /// `take_over_from_store`).
    pub fn taken_over(&self) -> u64 {
        self.taken_over
    }

    /// A store operation failed: counted, and the store is down until one succeeds.
    fn store_failed(&mut self) {
        self.store_errors += 1;
        self.store_down = true;
    }

    /// Loads and writes of the state store that failed.
    pub fn store_errors(&self) -> u64 {
        self.store_errors
    }

    /// A store is configured and its last load, read or write failed: verdicts are capped
    /// (`store_unavailable`) and the health check says degraded until an operation succeeds.
    pub fn store_down(&self) -> bool {
        self.store.is_some() && self.store_down
    }

    /// The gate's view of the catalogs (shared with the gate service, published by the engine).
    pub fn board(&self) -> Arc<crate::gate::CatalogBoard> {
        self.board.clone()
    }

    pub fn chains(&self) -> &Chains {
        &self.chains
    }

    pub fn sessions(&self) -> &Sessions {
        &self.sessions
    }

    /// When a chain next falls due (see `Chains::next_due`), or, with a store and evidence taken
    /// in since the last write, when the next write is due: another instance reading a shared
    /// store sees this one's evidence at most [`PERSIST_EVERY`](crate::state::PERSIST_EVERY)
    /// after it came, not at the next regular tick. Time-based catalog and progress checks run on
    /// the driver's regular tick.
    pub fn next_due(&self) -> Option<Moment> {
        let write = match (self.unwritten, self.last_persisted) {
            (true, Some(t)) => Some(t + crate::state::PERSIST_EVERY),
            _ => None,
        };
        // A held catalog change is emitted at a write: wake for the first write at or after it.
        let catalog = match (self.pending_catalog.iter().map(|(at, _)| *at).min(), self.last_persisted) {
            (Some(at), Some(t)) => Some(at.max(t + crate::state::PERSIST_EVERY)),
            (Some(at), None) => Some(at),
            _ => None,
        };
        [self.chains.next_due(), write, catalog].into_iter().flatten().min()
    }

    pub fn in_flight(&self) -> usize {
        self.chains.in_flight()
    }

    /// Evidence bytes held (chains in flight and decided chains kept for revision); O(1).
    pub fn evidence_bytes(&self) -> u64 {
        self.chains.bytes() as u64
    }

    /// Take in one normalized batch at `now`.
    pub fn ingest(&mut self, batch: NormalizedBatch, now: Moment, out: &mut Vec<Decided>) {
        self.now = now;
        self.started_ns.get_or_insert(now.as_nanos());
        self.unwritten = self.store.is_some();
        out.extend(batch.evidence.iter().filter_map(|e| e.finding.as_deref()).cloned().map(Decided::Finding));
        let changes = self.sessions.observe(&batch.evidence, now);
        self.publish_catalog(changes, out);
        if let Some(pins) = self.pins.clone() {
            self.detect_drift(&batch.evidence, &pins, out);
        }
        self.take_back_spilled(&batch.evidence);
        self.take_over_from_store(&batch.evidence);
        let mut decided = std::mem::take(&mut self.scratch);
        self.chains.ingest(batch, now, &mut decided);
        self.classify_decided(&mut decided, now, out);
        self.scratch = decided;
        self.persist(now, false, out);
        self.publish_merged(out);
    }

    /// Let time pass to `now`: decide due chains, move time-based verdicts (TTL expiry, `max_age`,
    /// progress clocks), forget idle sessions.
    pub fn tick(&mut self, now: Moment, out: &mut Vec<Decided>) {
        self.now = now;
        let mut decided = std::mem::take(&mut self.scratch);
        self.pull_refusals(now, false, &mut decided);
        self.join_remote_halves(now, false);
        self.find_parked_calls(now, &mut decided);
        if !self.hold_for_store(now) {
            self.chains.tick(now, &mut decided);
        }
        if self.last_reevaluated.is_none_or(|t| now.saturating_duration_since(t) >= REEVALUATE_EVERY) {
            self.last_reevaluated = Some(now);
            self.probe_store();
            self.renew_gauge_lease(now);
            self.refresh_converged();
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
        self.classify_decided(&mut decided, now, out);
        self.scratch = decided;
        self.persist(now, false, out);
        self.publish_merged(out);
    }

    /// Decide everything still in flight (shutdown, end of a replay), marked `by`.
    pub fn drain(&mut self, by: DecidedBy, now: Moment, out: &mut Vec<Decided>) {
        self.now = now;
        // A last look at what other instances wrote of the sessions this one calls converged.
        self.refresh_converged();
        self.publish_merged(out);
        let mut decided = std::mem::take(&mut self.scratch);
        self.pull_refusals(now, true, &mut decided);
        self.join_remote_halves(now, true);
        self.chains.drain(by, now, &mut decided);
        self.classify_decided(&mut decided, now, out);
        self.scratch = decided;
        self.persist(now, true, out);
        self.fold_pending_locally(out);
        self.publish_merged(out);
        self.persist(now, true, out);
        self.emit_pending_catalog(out);
    }

    /// Write every pending change to the store now (the driver calls it before it stops).
    pub fn flush_store(&mut self, now: Moment, out: &mut Vec<Decided>) {
        self.persist(now, true, out);
        self.fold_pending_locally(out);
        self.emit_pending_catalog(out);
    }

    /// On a shared store, take or renew the gauge lease; its holder counts every instance's open
    /// incidents and sessions in the store every [`GLOBAL_GAUGES_EVERY`]. A store error drops the
    /// lease here (another instance takes it once it expires) and is counted.
    fn renew_gauge_lease(&mut self, now: Moment) {
        let Some(store) = self.store.clone() else { return };
        if !store.is_shared() {
            return;
        }
        let held = match store.lease(GAUGE_LEASE) {
            Ok(h) => h,
            Err(e) => {
                self.store_failed();
                tracing::warn!(error = %e, "could not renew the gauge lease");
                false
            }
        };
        if held != self.gauge_leader {
            tracing::info!(
                leader = held,
                "gauge lease: this instance {} the global gauges",
                if held { "reports" } else { "no longer reports" }
            );
        }
        self.gauge_leader = held;
        if !held {
            self.global_gauges = None;
            return;
        }
        if self.global_gauges.as_ref().is_some_and(|(at, ..)| now.saturating_duration_since(*at) < GLOBAL_GAUGES_EVERY) {
            return;
        }
        let scanned = store.scan(crate::state::Table::Incidents).and_then(|i| Ok((i, store.scan(crate::state::Table::Sessions)?)));
        match scanned {
            Ok((incidents, sessions)) => {
                let mut open = FxHashMap::default();
                for (_, r) in &incidents {
                    if let crate::state::Record::Incidents(part) = r {
                        count_open(&mut open, part.open.iter());
                    }
                }
                let mut convergence: FxHashMap<(String, Convergence), u64> = FxHashMap::default();
                for (_, r) in &sessions {
                    if let crate::state::Record::Session(s) = r {
                        if let Some(c) = s.last {
                            *convergence.entry((s.server.as_deref().unwrap_or("").to_string(), c)).or_default() += 1;
                        }
                    }
                }
                self.global_gauges = Some((now, open, convergence));
            }
            Err(e) => {
                self.store_failed();
                tracing::warn!(error = %e, "could not count the incidents and sessions in the state store");
            }
        }
    }

    /// The figures the metric sinks report as gauges.
    pub fn gauges(&self) -> Gauges {
        let shared = self.store.as_ref().is_some_and(|s| s.is_shared());
        let (incidents_open, convergence) = match (&self.global_gauges, shared) {
            (_, false) => {
                let mut open = FxHashMap::default();
                count_open(&mut open, self.incidents.open_incidents());
                (open, self.sessions.convergence_counts())
            }
            (Some((_, open, convergence)), true) if self.gauge_leader => (open.clone(), convergence.clone()),
            _ => Default::default(),
        };
        Gauges {
            chains_in_flight: self.chains.in_flight() as u64,
            evidence_bytes: self.chains.bytes() as u64,
            chain_stats: self.chains.stats.clone(),
            incidents_open,
            convergence,
            gauge_leader: !shared || self.gauge_leader,
            working: self.working.clone(),
            callless_chains: self.callless_chains,
            store_errors: self.store_errors,
            store_conflicts: self.store_conflicts,
            incidents_unshared: self.incidents_unshared,
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

    /// Publish catalog changes: on the gate's board and as records. On a shared store they are
    /// held for the next write, where the instance whose write records a change as emitted emits
    /// it (once across instances), and a `converged` one is held [`CONFIRM_CONVERGED_AFTER`]
    /// first, so that a read of the store (another instance writes what it received within
    /// `PERSIST_EVERY`) can show it stale before it is said.
    fn publish_catalog(&mut self, changes: Vec<crate::correlate::CatalogChange>, out: &mut Vec<Decided>) {
        let shared = self.store.as_ref().is_some_and(|s| s.is_shared());
        for ch in changes {
            if shared {
                // A newer verdict of the session replaces one held.
                self.pending_catalog.retain(|(_, p)| p.session_key != ch.session_key);
                let after = if ch.verdict.convergence == Convergence::Converged { CONFIRM_CONVERGED_AFTER } else { Duration::ZERO };
                if self.pending_catalog.len() >= MAX_PENDING_CATALOG {
                    // Bounded: the oldest held change is emitted now (it may be emitted twice).
                    let (_, old) = self.pending_catalog.remove(0);
                    self.board.publish(&old.session_key, old.server.clone(), old.verdict.clone());
                    out.push(Decided::Catalog(old));
                }
                self.pending_catalog.push((self.now + after, ch));
                continue;
            }
            self.board.publish(&ch.session_key, ch.server.clone(), ch.verdict.clone());
            let converged =
                (ch.verdict.convergence == Convergence::Converged).then(|| (ch.session_key.clone(), ch.server.clone(), ch.at_ns));
            out.push(Decided::Catalog(ch));
            if let Some((session_key, server, at_ns)) = converged {
                // A catalog-caused incident resolves when the catalog converges (one process: on
                // a shared store incidents are folded from verdicts only, see the README).
                let (session, agent) = match session_key.strip_prefix("session:") {
                    Some(sid) => (Some(crate::evidence::hash::session_hash(sid)), None),
                    None => (None, session_key.strip_prefix("client:").and_then(|r| r.split_once("|server:")).map(|(a, _)| a)),
                };
                for (transition, row) in self.incidents.catalog_converged(server.as_ref(), session.as_deref(), agent, at_ns) {
                    out.push(Decided::Incident(IncidentChange { incident: true, transition, row }));
                }
            }
        }
    }

    /// At shutdown, catalog changes the store did not take are emitted here rather than never.
    fn emit_pending_catalog(&mut self, out: &mut Vec<Decided>) {
        for (_, ch) in std::mem::take(&mut self.pending_catalog) {
            self.board.publish(&ch.session_key, ch.server.clone(), ch.verdict.clone());
            out.push(Decided::Catalog(ch));
        }
    }

    /// With a shared store, read the sessions of the tool calls about to be judged as every
    /// instance wrote them, and merge them in: a session's signal, discovery or install may have
    /// gone to another instance in another trace, and judging the call without it could call a
    /// stale catalog fine. One round trip per step (a pipeline); what another instance has not
    /// written yet (at most 100 ms behind) is not seen.
    fn refresh_sessions(&mut self, decided: &[DecidedCalls]) {
        let Some(store) = self.store.clone() else { return };
        if decided.is_empty() || !store.is_shared() {
            return;
        }
        let mut keys: Vec<String> = decided
            .iter()
            .flat_map(|d| d.calls.iter())
            .filter(|c| c.method == Some(Method::ToolsCall))
            .filter_map(CallEvidence::session_key)
            .collect();
        keys.sort();
        keys.dedup();
        if keys.is_empty() {
            return;
        }
        self.read_sessions(&store, &keys);
    }

    /// On a shared store that is down, chains are not decided for up to [`STORE_DOWN_HOLD`]:
    /// another instance's part of their evidence (a session's signal, a refused request, a
    /// verifier) is in the store, and a verdict without it would be a guess (a stale catalog
    /// judged fine). The store is asked every [`PERSIST_EVERY`](crate::state::PERSIST_EVERY)
    /// meanwhile; past the hold, chains are decided, partial (`store_unavailable`). True while
    /// holding.
    fn hold_for_store(&mut self, now: Moment) -> bool {
        let shared = self.store.as_ref().is_some_and(|s| s.is_shared());
        if !shared || !self.store_down {
            self.store_down_since = None;
            return false;
        }
        let since = *self.store_down_since.get_or_insert(now);
        if self.last_probe.is_none_or(|t| now.saturating_duration_since(t) >= crate::state::PERSIST_EVERY) {
            self.last_probe = Some(now);
            self.probe_store();
        }
        if !self.store_down {
            self.store_down_since = None;
            return false;
        }
        now.saturating_duration_since(since) < STORE_DOWN_HOLD
    }

    /// A store marked down is asked, once per re-evaluation, whether it answers again, so the
    /// mark (and the health check's `degraded`) ends when the store is back even if nothing is
    /// written meanwhile.
    fn probe_store(&mut self) {
        let Some(store) = self.store.clone() else { return };
        if !self.store_down {
            return;
        }
        if matches!(store.probe(), Some(Ok(()))) {
            self.store_down = false;
            tracing::info!("the state store answers again");
        }
    }

    /// Read `keys` from the store in one round trip and merge them; a failure marks the store
    /// down and is counted.
    fn read_sessions(&mut self, store: &crate::state::StoreHandle, keys: &[String]) {
        match store.get_many(crate::state::Table::Sessions, keys) {
            Ok(records) => {
                self.store_down = false;
                self.merge_sessions(keys, records);
            }
            Err(e) => {
                self.store_failed();
                tracing::warn!(error = %e, sessions = keys.len(), "could not read sessions from the state store");
            }
        }
    }

    /// Merge sessions read from a shared store (`keys[i]` ↔ `records[i]`).
    fn merge_sessions(&mut self, keys: &[String], records: Vec<Option<crate::state::Record>>) {
        for (key, r) in keys.iter().zip(records) {
            if let Some(crate::state::Record::Session(r)) = r {
                self.sessions_merged += u64::from(self.sessions.merge(key, *r));
            }
        }
    }

    /// With a shared store, read back up to [`CONVERGED_REFRESH`] of the sessions this engine
    /// calls `converged` (in turn, one pipelined round trip): another instance may hold the
    /// signal that makes one stale, with nothing more of that session coming here to make this
    /// engine look again. Runs with the time-based re-evaluation (every second).
    fn refresh_converged(&mut self) {
        let Some(store) = self.store.clone() else { return };
        if !store.is_shared() {
            return;
        }
        let keys = self.sessions.converged_window(CONVERGED_REFRESH, self.refresh_cursor);
        self.refresh_cursor = self.refresh_cursor.wrapping_add(keys.len());
        if keys.is_empty() {
            return;
        }
        self.read_sessions(&store, &keys);
    }

    /// Sessions that another instance's evidence (read from a shared store) added to.
    pub fn sessions_merged(&self) -> u64 {
        self.sessions_merged
    }

    /// Publish the catalog verdicts that evidence merged from a shared store changed.
    fn publish_merged(&mut self, out: &mut Vec<Decided>) {
        let changes = self.sessions.take_merged_changes();
        self.publish_catalog(changes, out);
    }

    /// Fold a verdict into the incidents. With a shared store it is held for the next write
    /// (`sync_incidents`), where it is folded into the store's record of its server: the
    /// transitions are emitted by the instance whose write made them, once across instances.
    fn observe_incidents(&mut self, v: &Verdict, out: &mut Vec<Decided>) {
        let shared = self.store.as_ref().is_some_and(|s| s.is_shared());
        let relevant = crate::classify::incidents::is_failure(v.state) || v.state == HealthState::Healthy;
        if shared && relevant && self.pending_incident_verdicts < MAX_PENDING_INCIDENT_VERDICTS {
            self.pending_incidents.entry(v.server.clone()).or_default().push(v.clone());
            self.pending_incident_verdicts += 1;
            return;
        }
        if shared && relevant {
            self.incidents_unshared += 1;
        }
        for (transition, row) in self.incidents.observe(v) {
            out.push(Decided::Incident(IncidentChange { incident: true, transition, row }));
        }
    }

    /// With a shared store: fold the verdicts held since the last write into the store's
    /// incident record of each of their servers, by compare-and-set, and emit the transitions
    /// of the records written. A record another instance changed in between is refused; its
    /// verdicts stay held and are folded into the newer record on the next write (the fold does
    /// not depend on the order of verdicts, so the result is the one process's). Two round trips
    /// per write with verdicts held (a pipelined read of their servers' records, one script).
    fn sync_incidents(&mut self, store: &crate::state::StoreHandle, out: &mut Vec<Decided>) {
        use crate::state::{server_key, Record, ServerIncidents, StoreError, Table};
        if self.pending_incidents.is_empty() {
            return;
        }
        let servers: Vec<Option<Arc<str>>> = self.pending_incidents.keys().cloned().collect();
        let keys: Vec<String> = servers.iter().map(|s| server_key(s.as_deref())).collect();
        let stored = match store.get_many(Table::Incidents, &keys) {
            Ok(r) => r,
            Err(e) => {
                self.store_failed();
                tracing::warn!(error = %e, servers = keys.len(), "could not read incidents from the state store; holding the verdicts");
                return;
            }
        };
        let mut changes = crate::state::Changes::default();
        let mut folded = Vec::with_capacity(servers.len());
        for ((server, key), rec) in servers.iter().zip(&keys).zip(stored) {
            let part = match rec {
                Some(Record::Incidents(p)) if p.server == *server => *p,
                _ => ServerIncidents { server: server.clone(), ..Default::default() },
            };
            let mut book = IncidentBook::default();
            book.restore(part);
            let mut transitions = Vec::new();
            for v in self.pending_incidents.get(server).map(Vec::as_slice).unwrap_or_default() {
                transitions.extend(book.observe(v));
            }
            let new = book.parts(std::slice::from_ref(server)).pop().unwrap_or_default();
            if new.is_empty() {
                changes.delete(Table::Incidents, key.clone());
            } else {
                changes.put(key.clone(), Record::Incidents(Box::new(new.clone())));
            }
            folded.push((server.clone(), key, transitions, new, book.resolved_total));
        }
        let refused: std::collections::BTreeSet<String> = match store.apply(&changes) {
            Ok(()) => {
                self.store_down = false;
                Default::default()
            }
            Err(StoreError::Conflict { refused, .. }) => {
                self.store_down = false;
                self.store_conflicts += refused.len() as u64;
                tracing::debug!(records = refused.len(), "incident records changed by another instance; folding again");
                refused.into_iter().map(|(_, k)| k).collect()
            }
            Err(e) => {
                self.store_failed();
                tracing::warn!(error = %e, servers = keys.len(), "could not write incidents to the state store; holding the verdicts");
                return;
            }
        };
        for (server, key, transitions, new, resolved) in folded {
            if refused.contains(key) {
                continue;
            }
            if let Some(vs) = self.pending_incidents.remove(&server) {
                self.pending_incident_verdicts -= vs.len();
            }
            self.incidents.restore(new);
            self.incidents.resolved_total += resolved;
            for (transition, row) in transitions {
                out.push(Decided::Incident(IncidentChange { incident: true, transition, row }));
            }
        }
    }

    /// With a shared store: publish the refused-looking HTTP spans kept here as orphans, by the
    /// second they started, and the client halves of split calls decided here, by request and
    /// second (read, merge, compare-and-set; a refused or failed write is tried again at the
    /// next); delete the records this instance wrote once `late_span_window` has passed (one
    /// another instance wrote since is left to that instance).
    fn publish_shared_lists(&mut self, store: &crate::state::StoreHandle, now: Moment) {
        use crate::state::{refusal_key, HalvesRecord, Record, RefusalsRecord, Table};
        self.pending_orphans.extend(self.chains.take_published_orphans());
        let over = self.pending_orphans.len().saturating_sub(crate::correlate::crossjoin::MAX_ORPHANS);
        self.pending_orphans.drain(..over);
        let mut orphans: std::collections::BTreeMap<String, Vec<SpanEvidence>> = Default::default();
        for o in std::mem::take(&mut self.pending_orphans) {
            orphans.entry(refusal_key(o.start_ns / 1_000_000_000)).or_default().push(o);
        }
        let outcome = self.merge_lists(store, now, Table::Refusals, orphans, |rec, mine| {
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
            Record::Refusals(Box::new(RefusalsRecord { orphans: all }))
        });
        self.pending_orphans = outcome;

        self.pending_halves.extend(self.chains.take_published_halves().into_iter().map(|(t, h)| h.to_shared(t)));
        let over = self.pending_halves.len().saturating_sub(crate::correlate::crossjoin::MAX_ORPHANS);
        self.pending_halves.drain(..over);
        let mut halves: std::collections::BTreeMap<String, Vec<crate::state::ClientHalf>> = Default::default();
        for h in std::mem::take(&mut self.pending_halves) {
            let key = crate::correlate::crossjoin::shared_half_key(&h.method, &h.request_id, h.start_ns / 1_000_000_000);
            halves.entry(key).or_default().push(h);
        }
        let outcome = self.merge_lists(store, now, Table::Halves, halves, |rec, mine| {
            let mut r = match rec {
                Some(Record::Halves(r)) => *r,
                _ => HalvesRecord::default(),
            };
            for h in mine {
                if !r.halves.iter().any(|x| x.trace_id == h.trace_id && x.start_ns == h.start_ns) {
                    if r.halves.len() >= crate::correlate::crossjoin::MAX_CANDIDATES {
                        r.overflow = true;
                    } else {
                        r.halves.push(h.clone());
                    }
                }
            }
            Record::Halves(Box::new(r))
        });
        self.pending_halves = outcome;

        self.pending_parked.extend(self.chains.take_published_parked());
        let mut parked: std::collections::BTreeMap<String, Vec<SpanEvidence>> = Default::default();
        for (k, v) in std::mem::take(&mut self.pending_parked) {
            parked.entry(k.into_string()).or_default().push(v);
        }
        let outcome = self.merge_lists(store, now, Table::Parked, parked, |rec, mine| {
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
        });
        self.pending_parked = outcome
            .into_iter()
            .filter_map(|v| {
                let k = v.operation_key.clone()?;
                Some((k, v))
            })
            .collect();
    }

    /// With a shared store: read the verifiers other instances parked under the operation keys
    /// of the calls just decided here (one pipelined read per step with such calls), and take
    /// them in: a verifier that reported before its call, on another instance, still revises it.
    fn pull_parked(&mut self, now: Moment, decided: &mut Vec<DecidedCalls>) {
        let Some(store) = self.store.clone() else { return };
        if !store.is_shared() {
            return;
        }
        let mut keys: Vec<String> =
            decided.iter().flat_map(|d| d.calls.iter()).filter_map(|c| c.operation_key.as_deref()).map(str::to_string).collect();
        if keys.is_empty() {
            return;
        }
        keys.sort();
        keys.dedup();
        match store.get_many(crate::state::Table::Parked, &keys) {
            Ok(records) => {
                self.store_down = false;
                let mut more = Vec::new();
                for r in records.into_iter().flatten() {
                    if let crate::state::Record::Parked(r) = r {
                        for v in r.verifiers {
                            self.chains.take_remote_verifier(v, now, &mut more);
                        }
                    }
                }
                decided.extend(more);
            }
            Err(e) => {
                self.store_failed();
                tracing::warn!(error = %e, "could not read parked verifiers from the state store");
            }
        }
    }

    /// Add `by_key`'s items to the list records of `table` (read, `merge`, compare-and-set, in
    /// one pipelined read and one script), and delete the records this instance wrote more than
    /// `late_span_window` ago. Returns the items still to write (their record was refused, or the
    /// store failed).
    fn merge_lists<T: Clone>(
        &mut self,
        store: &crate::state::StoreHandle,
        now: Moment,
        table: crate::state::Table,
        by_key: std::collections::BTreeMap<String, Vec<T>>,
        merge: impl Fn(Option<crate::state::Record>, &[T]) -> crate::state::Record,
    ) -> Vec<T> {
        use crate::state::StoreError;
        let keys: Vec<String> = by_key.keys().cloned().collect();
        let mut changes = crate::state::Changes::default();
        if !keys.is_empty() {
            let stored = match store.get_many(table, &keys) {
                Ok(r) => r,
                Err(e) => {
                    self.store_failed();
                    tracing::warn!(error = %e, table = table.as_str(), "could not read the state store");
                    return by_key.into_values().flatten().collect();
                }
            };
            for ((key, mine), rec) in by_key.iter().zip(stored) {
                changes.put(key.clone(), merge(rec, mine));
            }
        }
        let window = self.late_span_window;
        let mut expired: Vec<String> = Vec::new();
        let written = self.shared_written.entry(table).or_default();
        while written.front().is_some_and(|(t, _)| now.saturating_duration_since(*t) > window) {
            if let Some((_, k)) = written.pop_front() {
                if !by_key.contains_key(&k) && !expired.contains(&k) {
                    changes.delete(table, k.clone());
                    expired.push(k);
                }
            }
        }
        if changes.is_empty() {
            return Vec::new();
        }
        let refused: Vec<String> = match store.apply(&changes) {
            Ok(()) => Vec::new(),
            Err(StoreError::Conflict { refused, .. }) => {
                self.store_conflicts += refused.len() as u64;
                refused.into_iter().map(|(_, k)| k).collect()
            }
            Err(e) => {
                self.store_failed();
                tracing::warn!(error = %e, table = table.as_str(), "could not write the state store");
                return by_key.into_values().flatten().collect();
            }
        };
        let mut again = Vec::new();
        let written = self.shared_written.entry(table).or_default();
        for (key, mine) in by_key {
            if refused.contains(&key) {
                again.extend(mine);
            } else {
                written.retain(|(_, k)| *k != key);
                written.push_back((now, key));
            }
        }
        again
    }

    /// With a shared store: verifiers parked here look for their call in the store's operation
    /// index again (at most every `PERSIST_EVERY`): the call's instance may have written it after
    /// the verifier came, and decided it before it read what this instance published. A call
    /// found decided is taken from the store and the verifiers join it here (revising it), as a
    /// receipt arriving after its call's decision does (`take_over_from_store`).
    fn find_parked_calls(&mut self, now: Moment, decided: &mut Vec<DecidedCalls>) {
        let Some(store) = self.store.clone() else { return };
        if !store.is_shared() || self.last_parked_lookup.is_some_and(|t| now.saturating_duration_since(t) < crate::state::PERSIST_EVERY) {
            return;
        }
        let keys: Vec<String> = self.chains.parked_keys(256).into_iter().map(|k| k.into_string()).collect();
        if keys.is_empty() {
            return;
        }
        self.last_parked_lookup = Some(now);
        let traces = match store.get_many(crate::state::Table::Operations, &keys) {
            Ok(r) => r,
            Err(e) => {
                self.store_failed();
                tracing::warn!(error = %e, "could not look for parked verifiers' calls in the state store");
                return;
            }
        };
        for (k, r) in keys.iter().zip(traces) {
            let Some(crate::state::Record::Operation(t)) = r else { continue };
            if !self.chains.knows(&t) {
                match store.get(crate::state::Table::Decided, &crate::state::trace_key(&t)) {
                    Ok(Some(crate::state::Record::Decided(rec))) => {
                        self.taken_over += 1;
                        self.restored.insert(t);
                        self.chains.restore_decided(*rec);
                    }
                    Ok(_) => continue,
                    Err(e) => {
                        self.store_failed();
                        tracing::warn!(error = %e, "could not take a parked verifier's call from the state store");
                        return;
                    }
                }
            }
            self.chains.restore_operation(k, t);
            self.chains.unpark(k, now, decided);
        }
    }

    /// With a shared store: the server halves about to be decided alone look for their client
    /// half among those other instances published; where exactly one qualifies, its decided
    /// chain is taken from the store (like a receipt's, `take_over_from_store`), so the server
    /// half joins it here and revises its verdict instead of giving one of its own.
    fn join_remote_halves(&mut self, now: Moment, all: bool) {
        use crate::correlate::crossjoin::{self, Half};
        let Some(store) = self.store.clone() else { return };
        if !store.is_shared() {
            return;
        }
        let halves = self.chains.server_halves_to_look_for(now, all);
        if halves.is_empty() {
            return;
        }
        let mut keys: Vec<String> = halves.iter().flat_map(|(_, h)| crossjoin::shared_half_keys(h)).collect();
        keys.sort();
        keys.dedup();
        let records = match store.get_many(crate::state::Table::Halves, &keys) {
            Ok(r) => r,
            Err(e) => {
                self.store_failed();
                tracing::warn!(error = %e, "could not read client halves from the state store");
                return;
            }
        };
        let listed: FxHashMap<&String, crate::state::HalvesRecord> = keys
            .iter()
            .zip(records)
            .filter_map(|(k, r)| match r {
                Some(crate::state::Record::Halves(r)) => Some((k, *r)),
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
                    let (t, ch) = Half::from_shared(c);
                    if t != id && crossjoin::client_matches(&ch, &h) && !found.contains(&t) {
                        found.push(t);
                    }
                }
            }
            if overflow || found.len() != 1 || self.chains.knows(&found[0]) {
                continue;
            }
            let t = found[0];
            match store.get(crate::state::Table::Decided, &crate::state::trace_key(&t)) {
                Ok(Some(crate::state::Record::Decided(r))) => {
                    self.store_down = false;
                    self.taken_over += 1;
                    self.restored.insert(t);
                    self.chains.restore_decided(*r);
                }
                Ok(_) => self.store_down = false,
                Err(e) => {
                    self.store_failed();
                    tracing::warn!(error = %e, "could not take a client half's chain from the state store");
                }
            }
        }
    }

    /// With a shared store: read the refusals of the seconds in which a refused-looking client
    /// request of a chain in flight (or decided lately) could have been answered, and take them
    /// as if they had come here, so the refused-request join sees the HTTP spans every instance
    /// received (at most every [`REFUSAL_PULL_EVERY`], one pipelined read; `force` at the drain).
    fn pull_refusals(&mut self, now: Moment, force: bool, decided: &mut Vec<DecidedCalls>) {
        let Some(store) = self.store.clone() else { return };
        if !store.is_shared() {
            return;
        }
        if !force && self.last_refusal_pull.is_some_and(|t| now.saturating_duration_since(t) < REFUSAL_PULL_EVERY) {
            return;
        }
        let secs = self.chains.wanted_refusal_seconds(now, REFUSAL_PULL_RECENT, REFUSAL_SECONDS_PER_PULL);
        if secs.is_empty() {
            return;
        }
        self.last_refusal_pull = Some(now);
        let keys: Vec<String> = secs.iter().map(|s| crate::state::refusal_key(*s)).collect();
        match store.get_many(crate::state::Table::Refusals, &keys) {
            Ok(records) => {
                self.store_down = false;
                for r in records.into_iter().flatten() {
                    if let crate::state::Record::Refusals(r) = r {
                        for o in r.orphans {
                            self.chains.take_remote_orphan(o, now, decided);
                        }
                    }
                }
            }
            Err(e) => {
                self.store_failed();
                tracing::warn!(error = %e, "could not read refusals from the state store");
            }
        }
    }

    /// With a shared store: report each drift held since the last write only if this instance's
    /// write creates its record (compare-and-set on a key never seen: absent); one another
    /// instance created first was reported there. A store that fails keeps them for the next
    /// write (and the drain reports them here rather than never).
    fn sync_drift(&mut self, store: &crate::state::StoreHandle, out: &mut Vec<Decided>) {
        if self.pending_drift.is_empty() {
            return;
        }
        let mut changes = crate::state::Changes::default();
        for (d, _) in &self.pending_drift {
            changes.put(d.key(), crate::state::Record::DriftReported(d.clone()));
        }
        let refused: Vec<String> = match store.apply(&changes) {
            Ok(()) => Vec::new(),
            Err(crate::state::StoreError::Conflict { refused, .. }) => refused.into_iter().map(|(_, k)| k).collect(),
            Err(e) => {
                self.store_failed();
                tracing::warn!(error = %e, "could not write drift reports to the state store; holding them");
                return;
            }
        };
        for (d, event) in std::mem::take(&mut self.pending_drift) {
            if !refused.contains(&d.key()) {
                out.push(Decided::Drift(event));
            }
        }
    }

    /// At shutdown, verdicts the shared store did not take are folded into this instance's own
    /// incidents and emitted (counted, `incidents_unshared`): an incident emitted twice is better
    /// than one never emitted.
    fn fold_pending_locally(&mut self, out: &mut Vec<Decided>) {
        // A record another instance wrote meanwhile is refused: read and fold again, a few times.
        if let Some(store) = self.store.clone() {
            for _ in 0..3 {
                if self.pending_incidents.is_empty() || self.store_down {
                    break;
                }
                self.sync_incidents(&store, out);
            }
        }
        // Drift the store did not take is reported here rather than never.
        out.extend(std::mem::take(&mut self.pending_drift).into_iter().map(|(_, e)| Decided::Drift(e)));
        if self.pending_incidents.is_empty() {
            return;
        }
        let pending = std::mem::take(&mut self.pending_incidents);
        self.pending_incident_verdicts = 0;
        let n: usize = pending.values().map(Vec::len).sum();
        tracing::warn!(verdicts = n, "the state store did not take these verdicts' incidents; emitting this instance's view of them");
        self.incidents_unshared += n as u64;
        for v in pending.into_values().flatten() {
            for (transition, row) in self.incidents.observe(&v) {
                out.push(Decided::Incident(IncidentChange { incident: true, transition, row }));
            }
        }
    }

    fn classify_decided(&mut self, decided: &mut Vec<DecidedCalls>, now: Moment, out: &mut Vec<Decided>) {
        self.pull_parked(now, decided);
        self.refresh_sessions(decided);
        self.publish_merged(out);
        for d in decided.drain(..) {
            if !d.calls.iter().any(|c| c.method.is_some()) && d.previous.is_empty() {
                // A verifier alone, an HTTP span alone: nothing was called, so nothing is judged.
                self.callless_chains += 1;
                continue;
            }
            let since = self.partial_grace_ns.zip(self.started_ns).map(|(grace_ns, start_ns)| Since { start_ns, grace_ns });
            let earliest = d.calls.iter().map(|c| c.start_ns).filter(|t| *t > 0).min();
            let store_down = self.store.is_some() && self.store_down;
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
            let verdicts = verdicts_superseding(&d, &self.sessions, self.pins.as_deref(), &self.progress, now.as_nanos(), previous_partial);
            for mut v in verdicts {
                if let Some(why) = partial {
                    crate::classify::partial::mark(&mut v, why);
                }
                self.observe_incidents(&v, out);
                out.push(Decided::Call(v));
            }
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
        Decided::Interim(classify_with_clocks(c, &self.sessions, self.pins.as_deref(), &self.progress, now_ns, d))
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
                    pins.check(server, tool, digest, crate::normalize::definitions::lookup(digest).as_ref())
                {
                    let shared = self.store.as_ref().is_some_and(|st| st.is_shared());
                    if self.store.is_some() && !shared {
                        self.drift_dirty.push(crate::state::DriftRecord {
                            server: key.0.clone(),
                            tool: key.1.clone(),
                            digest: key.2.clone(),
                        });
                    }
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
                    if shared {
                        // Reported by the instance whose write creates the record (see `sync_drift`).
                        self.pending_drift.push((crate::state::DriftRecord { server: key.0, tool: key.1, digest: key.2 }, event));
                    } else {
                        out.push(Decided::Drift(event));
                    }
                }
            }
        }
    }
}

/// The session facts a call is classified with: its catalog's convergence when the call started,
/// and whether the tool definition it used differs from its pin.
pub fn session_context(sessions: &Sessions, pins: Option<&Lockfile>, c: &CallEvidence) -> SessionContext {
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
            if let PinCheck::Drift { changes, .. } = pins.check(server, tool, &d, crate::normalize::definitions::lookup(&d).as_ref()) {
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
    v.method.as_deref() == Some("tools/call")
        || v.first_failed_layer.is_some()
        || !matches!(v.state, HealthState::Unverified | HealthState::Healthy)
}

/// Classify a decided chain.
pub fn verdicts_of(d: &DecidedCalls, sessions: &Sessions, pins: Option<&Lockfile>, progress: &ProgressPolicy, now_ns: u64) -> Vec<Verdict> {
    verdicts_superseding(d, sessions, pins, progress, now_ns, None)
}

/// [`verdicts_of`], where the previous decision of a revised chain was marked partial
/// (`previous_partial`): what a revision supersedes is the verdict as it was reported, capped.
fn verdicts_superseding(
    d: &DecidedCalls,
    sessions: &Sessions,
    pins: Option<&Lockfile>,
    progress: &ProgressPolicy,
    now_ns: u64,
    previous_partial: Option<crate::classify::partial::Partial>,
) -> Vec<Verdict> {
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
    d.calls
        .iter()
        .map(|c| (c, classify(c)))
        .map(|(c, mut v)| {
            // A revision names what it replaces: the same call is the one under the same span,
            // or, for a multi-round call, under the span of one of its rounds (a round decided
            // before the others arrived).
            let same = |p: &&Verdict| p.span_id == v.span_id || c.round_spans.contains(&p.span_id);
            v.supersedes = previous.iter().find(same).map(|p| crate::verdict::Superseded {
                state: p.state,
                protocol_success: p.protocol_success,
                verified_success: p.verified_success,
            });
            v
        })
        .filter(reportable)
        .collect()
}

/// Classify a call with its session context and its progress clocks at `now_ns`.
pub fn classify_with_clocks(
    c: &CallEvidence,
    sessions: &Sessions,
    pins: Option<&Lockfile>,
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
