//! Several instances on one shared store (Redis): the multi-instance protocol.
//!
//! # What is shared, and how
//! - **Sessions** are written by every instance that sees a trace of them: before each write an
//!   instance reads what the others wrote and writes the union (compare-and-set on the version
//!   just read); the tool calls about to be judged have their sessions read first; every second
//!   up to [`CONVERGED_REFRESH`] sessions this instance calls `converged` are read back.
//! - **Catalog changes** are held to the write that records them as emitted (`SessionRecord::
//!   emitted`): the instance whose write records a change emits it, once across instances; a
//!   `converged` one is held [`CONFIRM_CONVERGED_AFTER`] first, for a confirming read.
//! - **Incidents** are folded into the store's record of their server by compare-and-set, so
//!   exactly one instance emits each transition; a refused record is folded again next round.
//! - **Shared lists**: refused-looking HTTP spans (`refusals`), client halves of split calls
//!   (`client_halves`), verifiers parked before their call (`parked_verifiers`); read, merged,
//!   compare-and-set; the writer deletes its own after `late_span_window`.
//! - **Drift** is reported by the instance whose write creates its record.
//! - **The gauge lease**: its holder counts every instance's incidents and sessions.
//! - **The store down**: chains are held up to [`STORE_DOWN_HOLD`] (another instance's part of
//!   their evidence is in the store), then decided partial (`store_unavailable`).
//!
//! # Off the engine's path
//! Every store call goes through the [`Worker`](super::worker::Worker): for a network store a
//! thread of its own. The engine never waits for a round trip on its common path:
//! - chains that fall due have their shared parts (their sessions, the verifiers parked under
//!   their operation keys) **read when they are decided** and are classified when the answer is
//!   back — taken at a later step, in the order decided (the reads of the batches decided within
//!   [`GATHER_FOR`], and while one is in flight, gather into one: at most one in flight, so they
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

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use rustc_hash::FxHashMap;

use crate::classify::catalog::Convergence;
use crate::classify::incidents::{IncidentBook, IncidentFacts, ServerIncidents, Transition};
use crate::correlate::splits::Server;
use crate::correlate::{crossjoin, CatalogChange, DecidedCalls};
use crate::evidence::time::Moment;
use crate::evidence::{Method, Side, SpanEvidence};
use crate::state::{server_key, Changes, ClientHalf, DriftRecord, Record, SplitRecord, StateStore, StoreError, StoreHandle, Table};
use crate::verdict::{HealthState, Verdict};

use super::super::decided::IncidentChange;
use super::link::Link;
use super::worker::{Ticket, Worker};
use super::{Batch, Decided, DriftEvent, GaugeSource, GlobalCounts, Replica, ReplicaFigures, Tables};

/// Converged sessions read back from the store per re-evaluation (one pipeline).
const CONVERGED_REFRESH: usize = 512;
/// Verdicts held for the incident fold; past it a verdict is folded into this instance's own
/// book and its transitions emitted at once (counted: `incidents_unshared`), so an alert is
/// never lost for want of the store.
const MAX_PENDING_INCIDENT_VERDICTS: usize = 50_000;
/// The gauge lease: renewed every re-evaluation (1 s), lost `GAUGE_LEASE` after its holder
/// stops renewing it.
const GAUGE_LEASE: Duration = Duration::from_secs(5);
/// How often the holder of the gauge lease counts every instance's incidents and sessions in the
/// store (one `SCAN` of each table).
const GLOBAL_GAUGES_EVERY: Duration = Duration::from_secs(10);
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
/// How long a `converged` catalog verdict is held before a read of the store confirms it:
/// longer than an instance takes to write what it received (`PERSIST_EVERY`).
const CONFIRM_CONVERGED_AFTER: Duration = Duration::from_millis(250);
/// Catalog changes held for emission, at most.
const MAX_PENDING_CATALOG: usize = 100_000;
/// How long chains wait for a store that is down before they are decided without it.
const STORE_DOWN_HOLD: Duration = Duration::from_secs(5);
/// Decided chains awaiting the read of their shared parts, at most; past it the engine waits
/// for the store (counted in `store_queue_waits`).
const MAX_AWAITING_CHAINS: usize = 20_000;
/// How soon the driver is asked to step again while answers are awaited.
const POLL_AFTER: Duration = Duration::from_millis(5);
/// A read group gathers the batches decided for this long (of engine time, and never longer
/// than `answer_within`) or until it names this many keys before it is asked for: one round
/// trip, one wake of the store's thread and one answer for ten steps of a busy engine instead
/// of one each, for at most this much later a verdict.
const GATHER_FOR: Duration = Duration::from_millis(10);
const GATHER_KEYS: usize = 256;

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
    parked: Vec<String>,
    sessions: Vec<String>,
    ticket: Option<Ticket<StepRead>>,
}

/// A group's read: parked verifiers and sessions, in one round trip.
type StepRead = Result<Vec<Vec<Option<Record>>>, StoreError>;

/// One shared list's items by key, and the keys this instance wrote that expired.
struct ListJob<T> {
    table: Table,
    by_key: BTreeMap<String, Vec<T>>,
    expired: Vec<(Moment, String)>,
}

/// One server's incidents as folded on the store's thread.
struct Folded {
    server: Option<Arc<str>>,
    key: String,
    transitions: Vec<(Transition, crate::classify::incidents::Incident)>,
    new: ServerIncidents,
    resolved: u64,
}

/// A verdict held for the incident fold, as the fold reads it: shared between the engine, which
/// holds it again when a round fails, and the write job that folds it, so a round copies nothing.
type HeldVerdict = Arc<IncidentFacts<'static>>;

/// Verdicts by server, as a job carries them.
type ByServer = Vec<(Option<Arc<str>>, Vec<HeldVerdict>)>;

/// Sessions read (`keys[i]` ↔ `records[i]`).
type SessionsRead = (Vec<String>, Result<Vec<Option<Record>>, StoreError>);

/// The second job of a write round: everything to write, in one script.
struct WriteJob {
    drift: Vec<DriftRecord>,
    /// Verdicts to fold by server, with the server's record as read (`None`: the read failed,
    /// the verdicts are held).
    incidents: Option<(ByServer, Vec<Option<Record>>)>,
    refusals: (ListJob<SpanEvidence>, Option<Vec<Option<Record>>>),
    halves: (ListJob<ClientHalf>, Option<Vec<Option<Record>>>),
    parked: (ListJob<SpanEvidence>, Option<Vec<Option<Record>>>),
    /// Sessions and decided chains.
    changes: Changes,
}

/// How the write went: the jobs back, what was folded, and the records refused (`Err`: the
/// write failed; `None`: nothing was written).
struct Written {
    refusals: (ListJob<SpanEvidence>, bool),
    halves: (ListJob<ClientHalf>, bool),
    parked: (ListJob<SpanEvidence>, bool),
    folded: Option<Vec<Folded>>,
    result: Result<Option<Vec<(Table, String)>>, StoreError>,
}

/// What a write round holds while its jobs run: first one pipelined read (incident records,
/// list records, dirty sessions), then one script with every change.
enum Round {
    Reading {
        ticket: Option<Ticket<StepRead>>,
        at: Moment,
        force: bool,
        drift: Vec<(DriftRecord, DriftEvent)>,
        incidents: BTreeMap<Option<Arc<str>>, Vec<HeldVerdict>>,
        lists: (ListJob<SpanEvidence>, ListJob<ClientHalf>, ListJob<SpanEvidence>),
        sessions: Vec<String>,
        splits: SplitsJob,
    },
    Writing {
        ticket: Ticket<Written>,
        at: Moment,
        drift: Vec<(DriftRecord, DriftEvent)>,
        incidents: BTreeMap<Option<Arc<str>>, Vec<HeldVerdict>>,
        emitting: Vec<CatalogChange>,
        stored_emitted: FxHashMap<String, Option<Convergence>>,
        sessions_written: Vec<String>,
        changes: usize,
        /// Marks of servers seen to split, written with this round.
        marks: Vec<Server>,
    },
}

/// The servers of a write round's split marks: those marked here (written unless the store has
/// them), then the others asked for (those whose client halves are held back here).
struct SplitsJob {
    servers: Vec<Server>,
    marked: usize,
}

impl Round {
    fn at(&self) -> Moment {
        match self {
            Round::Reading { at, .. } | Round::Writing { at, .. } => *at,
        }
    }

    fn answered(&self, w: &Worker) -> bool {
        match self {
            Round::Reading { ticket, .. } => ticket.as_ref().is_none_or(|t| w.has(t)),
            Round::Writing { ticket, .. } => w.has(ticket),
        }
    }

    fn wait(&self, w: &mut Worker) {
        match self {
            Round::Reading { ticket: Some(t), .. } => w.wait(t),
            Round::Reading { ticket: None, .. } => {}
            Round::Writing { ticket, .. } => w.wait(ticket),
        }
    }
}

/// The list records this instance wrote, oldest first: each write of a key is queued with its
/// time and the key's latest write is indexed, so an entry whose key was written again later is
/// passed over when it comes to the front (no scan of the queue per write).
#[derive(Default)]
struct OwnRecords {
    order: VecDeque<(Moment, String)>,
    latest: FxHashMap<String, Moment>,
}

/// The lease's answer: held, (when counted) the global figures, and the cluster's state
/// protocol (the announcement is renewed with the lease).
type LeaseAnswer = (Result<bool, StoreError>, Option<Result<GlobalCounts, StoreError>>, Result<u32, StoreError>);

pub(crate) struct Shared {
    link: Link,
    late_span_window: Duration,
    /// The latest (engine time) an answer is taken after its job was submitted.
    answer_within: Duration,
    last_persisted: Option<Moment>,
    /// Evidence was taken in since the last write.
    unwritten: bool,
    /// The engine time of the latest step (see `next_due`).
    now: Moment,
    awaiting: VecDeque<Awaiting>,
    /// The reads of the awaiting batches: the first in flight, the last gathering.
    groups: VecDeque<ReadGroup>,
    next_group: u64,
    /// Chains awaiting (bounded by MAX_AWAITING_CHAINS), and how often the bound made the
    /// engine wait.
    awaiting_chains: usize,
    awaiting_waits: u64,
    round: Option<Round>,
    converged_read: Option<(Moment, Ticket<SessionsRead>)>,
    lease: Option<(Moment, Ticket<LeaseAnswer>)>,
    probe: Option<(Moment, Ticket<Result<(), StoreError>>)>,
    /// Catalog changes held for emission, with when they are due (see `hold_catalog`).
    pending_catalog: Vec<(Moment, CatalogChange)>,
    /// Verdicts decided here and not yet folded into the store's incidents, by server; their
    /// count (with those in a round in flight).
    pending_incidents: BTreeMap<Option<Arc<str>>, Vec<HeldVerdict>>,
    pending_incident_verdicts: usize,
    incidents_unshared: u64,
    sessions_merged: u64,
    /// Orphans, client halves and parked verifiers to publish (kept across a failed write).
    pending_orphans: Vec<SpanEvidence>,
    pending_halves: Vec<ClientHalf>,
    pending_parked: Vec<(Box<str>, SpanEvidence)>,
    /// Drift detected here, reported once its record is created.
    pending_drift: Vec<(DriftRecord, DriftEvent)>,
    /// The list records this instance wrote and when (deleted `late_span_window` after).
    shared_written: FxHashMap<Table, OwnRecords>,
    last_refusal_pull: Option<Moment>,
    /// Since when the store has been down (see `hold_for_store`), and its last probe.
    store_down_since: Option<Moment>,
    last_probe: Option<Moment>,
    /// The last look for parked verifiers' calls (`find_parked_calls`).
    last_parked_lookup: Option<Moment>,
    refresh_cursor: usize,
    gauge_leader: bool,
    /// What the lease holder last counted, and when (engine time).
    global_gauges: Option<(Moment, GlobalCounts)>,
    /// The cluster's state protocol as last announced, and whether the chains know it yet.
    cluster_protocol: Option<u32>,
    cluster_protocol_told: bool,
}

impl Shared {
    pub fn new(store: StoreHandle, late_span_window: Duration, answer_within: Duration) -> Self {
        Shared {
            link: Link::new(Worker::for_store(store)),
            late_span_window,
            answer_within,
            last_persisted: None,
            unwritten: false,
            now: Moment::from_nanos(0),
            awaiting: VecDeque::new(),
            groups: VecDeque::new(),
            next_group: 0,
            awaiting_chains: 0,
            awaiting_waits: 0,
            round: None,
            converged_read: None,
            lease: None,
            cluster_protocol: None,
            cluster_protocol_told: true,
            probe: None,
            pending_catalog: Vec::new(),
            pending_incidents: BTreeMap::new(),
            pending_incident_verdicts: 0,
            incidents_unshared: 0,
            sessions_merged: 0,
            pending_orphans: Vec::new(),
            pending_halves: Vec::new(),
            pending_parked: Vec::new(),
            pending_drift: Vec::new(),
            shared_written: FxHashMap::default(),
            last_refusal_pull: None,
            store_down_since: None,
            last_probe: None,
            last_parked_lookup: None,
            refresh_cursor: 0,
            gauge_leader: false,
            global_gauges: None,
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

    /// Merge sessions read from the store (`keys[i]` ↔ `records[i]`).
    fn merge_sessions(&mut self, t: &mut Tables, keys: &[String], records: Vec<Option<Record>>) {
        for (key, r) in keys.iter().zip(records) {
            if let Some(Record::Session(r)) = r {
                self.sessions_merged += u64::from(t.sessions.merge(key, *r));
            }
        }
    }

    /// Sessions read: merged; a failure marks the store down and is counted.
    fn take_sessions(&mut self, t: &mut Tables, keys: &[String], read: Result<Vec<Option<Record>>, StoreError>) {
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
                        t.chains.take_remote_verifier(v, *now, &mut more);
                    }
                }
            }
            missing = session_keys(&more).into_iter().filter(|k| group.sessions.binary_search(k).is_err()).collect();
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
        if self.groups.iter().any(|g| g.ticket.is_some()) {
            return;
        }
        let within = GATHER_FOR.min(self.answer_within);
        let Some(g) = self.groups.iter_mut().next() else { return };
        if !settle && now.saturating_duration_since(g.at) < within && g.parked.len() + g.sessions.len() < GATHER_KEYS {
            return;
        }
        let asks = vec![(Table::Parked, g.parked.clone()), (Table::Sessions, g.sessions.clone())];
        g.ticket = Some(self.link.worker.submit(move |s| s.get_tables(&asks)));
    }

    /// Advance the write round as far as its answers allow (`wait`: to its end).
    fn advance_round(&mut self, t: &mut Tables, wait: bool, out: &mut Vec<Decided>) {
        loop {
            let Some(round) = self.round.as_ref() else { return };
            if !round.answered(&self.link.worker) {
                if !wait && !self.due(round.at()) {
                    return;
                }
                round.wait(&mut self.link.worker);
            }
            match self.round.take() {
                Some(Round::Reading { ticket, at, force, drift, incidents, lists, sessions, splits }) => {
                    let read = match ticket {
                        Some(tk) => {
                            self.link.worker.take(tk).unwrap_or_else(|| Err(StoreError::Backend("the store's thread has ended".into())))
                        }
                        // Nothing to read: six empty answers.
                        None => Ok(vec![Vec::new(); 6]),
                    };
                    self.round_read(t, at, force, drift, incidents, lists, sessions, splits, read, out);
                }
                Some(Round::Writing { ticket, at, drift, incidents, emitting, stored_emitted, sessions_written, changes, marks }) => {
                    let Some(w) = self.link.worker.take(ticket) else {
                        t.chains.split_marks_again(marks);
                        self.round_lost(drift, incidents);
                        return;
                    };
                    if w.result.is_err() {
                        t.chains.split_marks_again(marks);
                    }
                    self.round_written(t, at, drift, incidents, w, emitting, stored_emitted, sessions_written, changes, out);
                }
                None => return,
            }
        }
    }

    /// The store's thread ended with a round in flight: what it held is held again.
    fn round_lost(&mut self, drift: Vec<(DriftRecord, DriftEvent)>, incidents: BTreeMap<Option<Arc<str>>, Vec<HeldVerdict>>) {
        self.link.failed();
        prepend(&mut self.pending_drift, drift);
        for (server, vs) in incidents {
            self.pending_incidents.entry(server).or_default().extend(vs);
        }
    }

    /// Start a write round: one pipelined read of the incident records of the servers whose
    /// verdicts are held, the list records to add to, and the sessions to write.
    fn start_round(&mut self, t: &mut Tables, now: Moment, force: bool) {
        let drift = std::mem::take(&mut self.pending_drift);
        let incidents = std::mem::take(&mut self.pending_incidents);
        let lists = (self.refusals_job(t, now), self.halves_job(t, now), self.parked_job(t, now));
        // Catalog changes held for emission whose time has come: their sessions are read and
        // written now, so the write decides who emits them.
        for (_, ch) in self.pending_catalog.iter().filter(|(at, _)| force || *at <= now) {
            t.sessions.mark_dirty(&ch.session_key);
        }
        let sessions = t.sessions.dirty_keys();
        let mut servers = t.chains.take_split_marks();
        let marked = servers.len();
        // A marked server is known here, so never among those asked for.
        servers.extend(t.chains.split_servers_to_ask(now));
        let splits = SplitsJob { servers, marked };
        let asks = vec![
            (Table::Incidents, incidents.keys().map(|s| server_key(s.as_deref())).collect::<Vec<_>>()),
            (Table::Refusals, lists.0.by_key.keys().cloned().collect()),
            (Table::Halves, lists.1.by_key.keys().cloned().collect()),
            (Table::Parked, lists.2.by_key.keys().cloned().collect()),
            (Table::Sessions, sessions.clone()),
            (Table::Splits, splits.servers.iter().map(|s| server_key(s.as_deref())).collect()),
        ];
        let ticket = asks.iter().any(|(_, k)| !k.is_empty()).then(|| self.link.worker.submit(move |s| s.get_tables(&asks)));
        self.round = Some(Round::Reading { ticket, at: now, force, drift, incidents, lists, sessions, splits });
    }

    /// The read of a round is back: sessions merged and the catalog changes to emit chosen; then
    /// everything is written in one script (the incident fold and the list merges on the
    /// store's thread).
    #[allow(clippy::too_many_arguments)]
    fn round_read(
        &mut self,
        t: &mut Tables,
        now: Moment,
        force: bool,
        drift: Vec<(DriftRecord, DriftEvent)>,
        incidents: BTreeMap<Option<Arc<str>>, Vec<HeldVerdict>>,
        lists: (ListJob<SpanEvidence>, ListJob<ClientHalf>, ListJob<SpanEvidence>),
        sessions: Vec<String>,
        splits: SplitsJob,
        read: StepRead,
        out: &mut Vec<Decided>,
    ) {
        let read = match read {
            Ok(r) => Some(r),
            Err(e) => {
                self.link.failed();
                tracing::warn!(error = %e, "could not read the state store; holding what was to be written with it");
                None
            }
        };
        let ok = read.is_some();
        let mut read = read.unwrap_or_default().into_iter();
        let mut next = || read.next();
        let (inc_read, ref_read, half_read, park_read, sess_read, split_read) = (next(), next(), next(), next(), next(), next());
        let mut stored_emitted: FxHashMap<String, Option<Convergence>> = FxHashMap::default();
        let session_read = sess_read.filter(|_| !sessions.is_empty());
        if let Some(records) = session_read.as_ref() {
            for (k, r) in sessions.iter().zip(records) {
                let emitted = match r {
                    Some(Record::Session(r)) => r.emitted,
                    _ => None,
                };
                stored_emitted.insert(k.clone(), emitted);
            }
        }
        let read_sessions = session_read.is_some();
        if let Some(records) = session_read {
            self.merge_sessions(t, &sessions, records);
        }
        // What the merge changed is a catalog change too (held like any other).
        for ch in t.sessions.take_merged_changes() {
            let _ = self.hold_catalog(t, now, ch, out);
        }
        let mut emitting = Vec::new();
        if read_sessions {
            // A change is emitted by the instance whose write records it as emitted: one
            // already recorded by another instance is dropped here.
            let mut keep = Vec::new();
            for (at, ch) in std::mem::take(&mut self.pending_catalog) {
                if !t.sessions.contains(&ch.session_key) {
                    // Forgotten here meanwhile (idle, or a bound): nothing to write it with.
                    t.emit_catalog(ch, out);
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
                t.sessions.set_emitted(&ch.session_key, v);
                emitting.push(ch);
            }
            self.pending_catalog = keep;
        }
        let mut changes = Changes::default();
        t.sessions.take_changes(&mut changes);
        t.chains.take_changes(&mut changes);
        let marks = take_split_read(t, now, splits, split_read.filter(|_| ok), &mut changes);
        let sessions_written: Vec<String> = changes.changes.iter().filter(|c| c.table == Table::Sessions).map(|c| c.key.clone()).collect();
        let n = changes.len();
        let job = WriteJob {
            drift: drift.iter().map(|(d, _)| d.clone()).collect(),
            incidents: (ok || incidents.is_empty())
                .then(|| (incidents.iter().map(|(k, v)| (k.clone(), v.clone())).collect(), inc_read.unwrap_or_default())),
            refusals: (lists.0, ref_read.filter(|_| ok)),
            halves: (lists.1, half_read.filter(|_| ok)),
            parked: (lists.2, park_read.filter(|_| ok)),
            changes,
        };
        let ticket = self.link.worker.submit(move |s| write_round(s, job));
        self.round =
            Some(Round::Writing { ticket, at: now, drift, incidents, emitting, stored_emitted, sessions_written, changes: n, marks });
    }

    /// The write of a round is back: drift reported where this write created its record,
    /// incident transitions emitted where this write made them, list records remembered, and
    /// the catalog changes this write recorded as emitted emitted; what was refused, or a write
    /// that failed, waits for the next round.
    #[allow(clippy::too_many_arguments)]
    fn round_written(
        &mut self,
        t: &mut Tables,
        now: Moment,
        drift: Vec<(DriftRecord, DriftEvent)>,
        mut incidents: BTreeMap<Option<Arc<str>>, Vec<HeldVerdict>>,
        w: Written,
        emitting: Vec<CatalogChange>,
        stored_emitted: FxHashMap<String, Option<Convergence>>,
        sessions_written: Vec<String>,
        changes: usize,
        out: &mut Vec<Decided>,
    ) {
        let refused = match w.result {
            Ok(None) => Some(Vec::new()),
            Ok(Some(r)) => {
                // The store answered (a refusal too).
                self.link.down = false;
                Some(r)
            }
            Err(e) => {
                self.link.failed();
                tracing::warn!(error = %e, changes, "could not write the state store; going on in memory");
                None
            }
        };
        let is_refused = |table: Table, key: &str| refused.as_ref().is_some_and(|r| r.iter().any(|(t, k)| *t == table && k == key));
        match &refused {
            // A record another instance created first was reported there.
            Some(_) => {
                out.extend(drift.into_iter().filter(|(d, _)| !is_refused(Table::DriftReported, &d.key())).map(|(_, e)| Decided::Drift(e)))
            }
            None => prepend(&mut self.pending_drift, drift),
        }
        if let (Some(folded), Some(_)) = (w.folded, &refused) {
            for f in folded {
                if is_refused(Table::Incidents, &f.key) {
                    self.link.conflicts += 1;
                    continue;
                }
                if let Some(vs) = incidents.remove(&f.server) {
                    self.pending_incident_verdicts -= vs.len();
                }
                t.incidents.restore(f.new);
                t.incidents.resolved_total += f.resolved;
                for (transition, row) in f.transitions {
                    out.push(Decided::Incident(IncidentChange { incident: true, transition, row }));
                }
            }
        }
        // Refused records (folded into the newer record next round), or not folded at all.
        for (server, vs) in incidents {
            self.pending_incidents.entry(server).or_default().extend(vs);
        }
        let again = self.list_done(w.refusals, refused.as_deref(), now);
        prepend(&mut self.pending_orphans, again);
        let again = self.list_done(w.halves, refused.as_deref(), now);
        prepend(&mut self.pending_halves, again);
        let again = self.list_done(w.parked, refused.as_deref(), now);
        prepend(&mut self.pending_parked, again.into_iter().filter_map(|v| Some((v.operation_key.clone()?, v))).collect());
        let conflict =
            refused.as_ref().is_some_and(|r| r.iter().any(|(t, _)| matches!(t, Table::Sessions | Table::Decided | Table::Operations)));
        if conflict {
            self.link.conflicts += 1;
            // Another instance wrote one of them in between: read, merge and write the sessions
            // again next time (the refused one among them).
            for k in &sessions_written {
                t.sessions.mark_dirty(k);
            }
            tracing::warn!(changes, "records changed by another instance; merged and written again next round");
        }
        for ch in emitting {
            if refused.is_none() || is_refused(Table::Sessions, &ch.session_key) {
                let was = stored_emitted.get(&ch.session_key).copied().flatten();
                t.sessions.set_emitted(&ch.session_key, was);
                self.pending_catalog.push((now, ch));
            } else {
                t.emit_catalog(ch, out);
            }
        }
    }

    fn refusals_job(&mut self, t: &mut Tables, now: Moment) -> ListJob<SpanEvidence> {
        self.pending_orphans.extend(t.chains.take_published_orphans());
        let over = self.pending_orphans.len().saturating_sub(crossjoin::MAX_ORPHANS);
        self.pending_orphans.drain(..over);
        let mut by_key: BTreeMap<String, Vec<SpanEvidence>> = BTreeMap::new();
        for o in self.pending_orphans.drain(..) {
            by_key.entry(crate::state::refusal_key(o.start_ns / 1_000_000_000)).or_default().push(o);
        }
        self.list_job(Table::Refusals, now, by_key)
    }

    fn halves_job(&mut self, t: &mut Tables, now: Moment) -> ListJob<ClientHalf> {
        self.pending_halves.extend(t.chains.take_published_halves().map(|(id, h)| h.into_shared(id)));
        let over = self.pending_halves.len().saturating_sub(crossjoin::MAX_ORPHANS);
        self.pending_halves.drain(..over);
        let mut by_key: BTreeMap<String, Vec<ClientHalf>> = BTreeMap::new();
        for h in self.pending_halves.drain(..) {
            by_key.entry(crossjoin::shared_half_key(&h.method, &h.request_id, h.start_ns / 1_000_000_000)).or_default().push(h);
        }
        self.list_job(Table::Halves, now, by_key)
    }

    fn parked_job(&mut self, t: &mut Tables, now: Moment) -> ListJob<SpanEvidence> {
        self.pending_parked.extend(t.chains.take_published_parked());
        let mut by_key: BTreeMap<String, Vec<SpanEvidence>> = BTreeMap::new();
        for (k, v) in self.pending_parked.drain(..) {
            by_key.entry(k.into_string()).or_default().push(v);
        }
        self.list_job(Table::Parked, now, by_key)
    }

    /// A list's items by key, with the records this instance wrote more than `late_span_window`
    /// ago to delete (unless written again now).
    fn list_job<T>(&mut self, table: Table, now: Moment, by_key: BTreeMap<String, Vec<T>>) -> ListJob<T> {
        let window = self.late_span_window;
        let written = self.shared_written.entry(table).or_default();
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
        let written = self.shared_written.entry(job.table).or_default();
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

    /// On a store that is down, chains are not decided for up to [`STORE_DOWN_HOLD`]: another
    /// instance's part of their evidence (a session's signal, a refused request, a verifier) is
    /// in the store, and a verdict without it would be a guess (a stale catalog judged fine).
    /// The store is asked every `PERSIST_EVERY` meanwhile; past the hold, chains are decided,
    /// partial (`store_unavailable`). True while holding.
    fn hold_for_store(&mut self, now: Moment) -> bool {
        if !self.link.down {
            self.store_down_since = None;
            return false;
        }
        let since = *self.store_down_since.get_or_insert(now);
        if self.last_probe.is_none_or(|at| now.saturating_duration_since(at) >= crate::state::PERSIST_EVERY) {
            self.last_probe = Some(now);
            self.probe_store();
        }
        if !self.link.down {
            self.store_down_since = None;
            return false;
        }
        now.saturating_duration_since(since) < STORE_DOWN_HOLD
    }

    /// Ask a store marked down whether it answers again (the answer is taken when it comes).
    fn probe_store(&mut self) {
        if !self.link.down || self.probe.is_some() {
            return;
        }
        let ticket = self.link.worker.submit(|s| s.probe().unwrap_or(Err(StoreError::Backend(String::new()))));
        self.probe = Some((self.now, ticket));
        self.take_probe();
    }

    fn take_probe(&mut self) {
        let Some((at, p)) = self.probe.take() else { return };
        if self.due(at) {
            self.link.worker.wait(&p);
        }
        if !self.link.worker.has(&p) {
            self.probe = Some((at, p));
            return;
        }
        if let Some(Ok(())) = self.link.worker.take(p) {
            if self.link.down {
                self.link.down = false;
                tracing::info!("the state store answers again");
            }
        }
    }

    /// Take or renew the gauge lease; its holder counts every instance's open incidents and
    /// sessions in the store every [`GLOBAL_GAUGES_EVERY`]. A store error drops the lease here
    /// (another instance takes it once it expires) and is counted.
    fn renew_gauge_lease(&mut self, now: Moment) {
        if self.lease.is_some() {
            return;
        }
        let count = self.global_gauges.as_ref().is_none_or(|(at, _)| now.saturating_duration_since(*at) >= GLOBAL_GAUGES_EVERY);
        let ticket = self.link.worker.submit(move |s| {
            let held = s.lease(GAUGE_LEASE);
            let counts = match &held {
                Ok(true) if count => Some(count_global(s)),
                _ => None,
            };
            (held, counts, s.announce(GAUGE_LEASE))
        });
        self.lease = Some((now, ticket));
        self.take_lease();
    }

    /// The cluster's state protocol, as the store answered an announcement: told to the chains
    /// at the next step (`tell_protocol`), logged when it changes.
    fn heard_protocol(&mut self, p: u32) {
        if self.cluster_protocol != Some(p) {
            if self.cluster_protocol.is_some() || p < crate::state::format::CURRENT {
                tracing::info!(
                    cluster = p,
                    this_build = crate::state::format::CURRENT,
                    "the instances sharing the state store speak state protocol {p} (the lowest announced)"
                );
            }
            self.cluster_protocol = Some(p);
            self.cluster_protocol_told = false;
        }
    }

    fn tell_protocol(&mut self, t: &mut Tables, now: Moment) {
        if let (Some(p), false) = (self.cluster_protocol, self.cluster_protocol_told) {
            t.chains.set_cluster_protocol(p, now);
            self.cluster_protocol_told = true;
        }
    }

    fn take_lease(&mut self) {
        let Some((at, t)) = self.lease.take() else { return };
        if self.due(at) {
            self.link.worker.wait(&t);
        }
        if !self.link.worker.has(&t) {
            self.lease = Some((at, t));
            return;
        }
        let Some((held, counts, protocol)) = self.link.worker.take(t) else { return };
        match protocol {
            Ok(p) => self.heard_protocol(p),
            Err(e) => tracing::warn!(error = %e, "could not announce this instance's state protocol"),
        }
        let held = match held {
            Ok(h) => h,
            Err(e) => {
                self.link.failed();
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
        match counts {
            Some(Ok(c)) => self.global_gauges = Some((at, c)),
            Some(Err(e)) => {
                self.link.failed();
                tracing::warn!(error = %e, "could not count the incidents and sessions in the state store");
            }
            None => {}
        }
    }

    /// Read back up to [`CONVERGED_REFRESH`] of the sessions this engine calls `converged` (in
    /// turn, one pipelined read): another instance may hold the signal that makes one stale,
    /// with nothing more of that session coming here to make this engine look again.
    fn refresh_converged(&mut self, t: &mut Tables, wait: bool) {
        if self.converged_read.is_none() {
            let keys = t.sessions.converged_window(CONVERGED_REFRESH, self.refresh_cursor);
            self.refresh_cursor = self.refresh_cursor.wrapping_add(keys.len());
            if !keys.is_empty() {
                let ticket = self.link.worker.submit(move |s| {
                    let r = s.get_many(Table::Sessions, &keys);
                    (keys, r)
                });
                self.converged_read = Some((self.now, ticket));
            }
        }
        self.take_converged(t, wait);
    }

    fn take_converged(&mut self, t: &mut Tables, wait: bool) {
        let Some((at, r)) = self.converged_read.take() else { return };
        if wait || self.due(at) {
            self.link.worker.wait(&r);
        }
        if !self.link.worker.has(&r) {
            self.converged_read = Some((at, r));
            return;
        }
        if let Some((keys, read)) = self.link.worker.take(r) {
            self.take_sessions(t, &keys, read);
        }
    }

    /// Read the refusals of the seconds in which a refused-looking client request of a chain in
    /// flight (or decided lately) could have been answered, and take them as if they had come
    /// here, so the refused-request join sees the HTTP spans every instance received (at most
    /// every [`REFUSAL_PULL_EVERY`], one pipelined read; `force` at the drain).
    fn pull_refusals(&mut self, t: &mut Tables, now: Moment, force: bool) {
        if !force && self.last_refusal_pull.is_some_and(|at| now.saturating_duration_since(at) < REFUSAL_PULL_EVERY) {
            return;
        }
        let secs = t.chains.wanted_refusal_seconds(now, REFUSAL_PULL_RECENT, REFUSAL_SECONDS_PER_PULL);
        if secs.is_empty() {
            return;
        }
        self.last_refusal_pull = Some(now);
        let keys: Vec<String> = secs.iter().map(|s| crate::state::refusal_key(*s)).collect();
        match self.link.call(move |s| s.get_many(Table::Refusals, &keys)) {
            Ok(records) => {
                self.link.down = false;
                for r in records.into_iter().flatten() {
                    if let Record::Refusals(r) = r {
                        for o in r.orphans {
                            t.chains.take_remote_orphan(o, now);
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
    fn join_remote_halves(&mut self, t: &mut Tables, now: Moment, all: bool) {
        let halves = t.chains.server_halves_to_look_for(now, all);
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
                    let (trace, ch) = crossjoin::Half::from_shared(c);
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

    /// Chains in flight here whose root never came look for their trace among the store's decided
    /// chains, once each: an instance that stopped (or lost the trace to the collector's ring)
    /// decided the call — partial, at its drain — and this is the rest of its evidence. Found,
    /// the call is revised (one attempt), as one process would have revised it.
    fn adopt_rootless(&mut self, t: &mut Tables, now: Moment, decided: &mut Vec<DecidedCalls>) {
        let ids = t.chains.take_rootless_to_look();
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
            t.chains.adopt_decided(*r, now, decided);
        }
    }

    /// Verifiers parked here look for their call in the store's operation index again (at most
    /// every `PERSIST_EVERY`): the call's instance may have written it after the verifier came,
    /// and decided it before it read what this instance published. A call found decided is
    /// taken from the store and the verifiers join it here (revising it).
    fn find_parked_calls(&mut self, t: &mut Tables, now: Moment, decided: &mut Vec<DecidedCalls>) {
        if self.last_parked_lookup.is_some_and(|at| now.saturating_duration_since(at) < crate::state::PERSIST_EVERY) {
            return;
        }
        let keys: Vec<String> = t.chains.parked_keys(256).into_iter().map(|k| k.into_string()).collect();
        if keys.is_empty() {
            return;
        }
        self.last_parked_lookup = Some(now);
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
            t.chains.restore_operation(k, trace);
            t.chains.unpark(k, now, decided);
        }
    }

    /// At the end, verdicts the store did not take are folded into this instance's own
    /// incidents and emitted (counted, `incidents_unshared`): an incident emitted twice is
    /// better than one never emitted.
    fn fold_pending_locally(&mut self, t: &mut Tables, out: &mut Vec<Decided>) {
        // A record another instance wrote meanwhile is refused: read and fold again, a few times.
        for _ in 0..3 {
            if self.pending_incidents.is_empty() || self.link.down {
                break;
            }
            self.fold_incidents_now(t, out);
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
            for (transition, row) in t.incidents.fold(&v) {
                out.push(Decided::Incident(IncidentChange { incident: true, transition, row }));
            }
        }
    }

    /// One incident fold, waited for (at the end).
    fn fold_incidents_now(&mut self, t: &mut Tables, out: &mut Vec<Decided>) {
        let incidents = std::mem::take(&mut self.pending_incidents);
        let job: Vec<(Option<Arc<str>>, Vec<HeldVerdict>)> = incidents.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let answer = self.link.call(move |s| {
            let mut effects = Vec::new();
            let r = sync_incidents(s, job, &mut effects);
            Ok((effects, r))
        });
        let Ok((effects, folded)) = answer else {
            self.round_lost(Vec::new(), incidents);
            return;
        };
        self.effects(&effects);
        let mut incidents = incidents;
        if let Some((folded, refused)) = folded {
            for f in folded {
                if refused.contains(&f.key) {
                    continue;
                }
                if let Some(vs) = incidents.remove(&f.server) {
                    self.pending_incident_verdicts -= vs.len();
                }
                t.incidents.restore(f.new);
                t.incidents.resolved_total += f.resolved;
                for (transition, row) in f.transitions {
                    out.push(Decided::Incident(IncidentChange { incident: true, transition, row }));
                }
            }
        }
        for (server, vs) in incidents {
            self.pending_incidents.entry(server).or_default().extend(vs);
        }
    }

    /// At the end, catalog changes the store did not take are emitted here rather than never.
    fn emit_pending_catalog(&mut self, t: &mut Tables, out: &mut Vec<Decided>) {
        for (_, ch) in std::mem::take(&mut self.pending_catalog) {
            t.emit_catalog(ch, out);
        }
    }
}

impl Replica for Shared {
    fn attach(&mut self, t: &mut Tables) {
        t.chains.track_changes();
        t.sessions.track_changes();
        // Incidents are folded in the store (the write round), not written from the book.
        // A split mark's way to another instance's halves: this round's write, that instance's
        // read and its next write, each answered within `answer_within` at worst.
        t.chains.share_orphans(self.answer_within * 3 + crate::state::PERSIST_EVERY * 4);
        // The cluster's protocol before the first decision: an instance that knows no split
        // marks may share the store from the start.
        match self.link.call(|s| s.announce(GAUGE_LEASE)) {
            Ok(p) => self.heard_protocol(p),
            Err(e) => tracing::warn!(error = %e, "could not announce this instance's state protocol"),
        }
        self.tell_protocol(t, Moment::from_nanos(0));
        self.link.load(t);
    }

    fn before_ingest(&mut self, t: &mut Tables, spans: &[SpanEvidence]) {
        self.link.take_back_spilled(t.chains, spans);
        self.link.take_over_from_store(t, spans);
    }

    fn before_decide(&mut self, t: &mut Tables, now: Moment, all: bool, decided: &mut Vec<DecidedCalls>) -> bool {
        self.now = now;
        self.tell_protocol(t, now);
        self.pull_refusals(t, now, all);
        self.join_remote_halves(t, now, all);
        self.adopt_rootless(t, now, decided);
        if all {
            return false;
        }
        self.find_parked_calls(t, now, decided);
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
        if batch.1.is_empty() {
            return;
        }
        let parked: Vec<String> =
            batch.1.iter().flat_map(|d| d.calls.iter()).filter_map(|c| c.operation_key.as_deref()).map(str::to_string).collect();
        let sessions = session_keys(&batch.1);
        if parked.is_empty() && sessions.is_empty() && self.awaiting.is_empty() {
            ready.push(batch);
            return;
        }
        // Join the group not yet asked for, or open one.
        if self.groups.back().is_none_or(|g| g.ticket.is_some()) {
            self.next_group += 1;
            self.groups.push_back(ReadGroup { id: self.next_group, at: batch.0, parked: Vec::new(), sessions: Vec::new(), ticket: None });
        }
        let Some(g) = self.groups.back_mut() else { return };
        g.parked.extend(parked);
        g.parked.sort();
        g.parked.dedup();
        g.sessions.extend(sessions);
        g.sessions.sort();
        g.sessions.dedup();
        let group = g.id;
        let at = batch.0;
        self.awaiting_chains += batch.1.len();
        self.awaiting.push_back(Awaiting { batch, group });
        self.submit_group(at, false);
    }

    fn ready(&mut self, t: &mut Tables, now: Moment, settle: bool, ready: &mut Vec<Batch>) {
        self.now = now;
        self.link.worker.poll();
        self.take_probe();
        self.take_lease();
        self.take_converged(t, settle);
        // In the order decided: a revision is classified after what it revises.
        loop {
            self.submit_group(now, settle || self.awaiting_chains > MAX_AWAITING_CHAINS);
            let Some(g) = self.groups.front() else { break };
            let Some(ticket) = g.ticket.as_ref() else { break };
            if !self.link.worker.has(ticket) {
                // Bounded: past MAX_AWAITING_CHAINS the engine waits for the store (counted).
                let over = self.awaiting_chains > MAX_AWAITING_CHAINS;
                if !settle && !over && !self.due(g.at) {
                    break;
                }
                if over {
                    self.awaiting_waits += 1;
                }
                self.link.worker.wait(ticket);
            }
            let Some(mut g) = self.groups.pop_front() else { break };
            let read = g.ticket.take().and_then(|tk| self.link.worker.take(tk));
            let read = read.unwrap_or_else(|| Err(StoreError::Backend("the store's thread has ended".into())));
            let mut batches = Vec::new();
            while self.awaiting.front().is_some_and(|a| a.group == g.id) {
                if let Some(a) = self.awaiting.pop_front() {
                    self.awaiting_chains -= a.batch.1.len();
                    batches.push(a.batch);
                }
            }
            self.take_group_read(t, g, read, &mut batches);
            ready.extend(batches);
        }
    }

    fn persist(&mut self, t: &mut Tables, now: Moment, force: bool, out: &mut Vec<Decided>) {
        self.now = now;
        self.advance_round(t, force, out);
        let due = force || self.last_persisted.is_none_or(|at| now.saturating_duration_since(at) >= crate::state::PERSIST_EVERY);
        if !due {
            return;
        }
        if self.round.is_some() {
            if !force {
                // One round at a time: the write interval stretches to the store's pace.
                return;
            }
            self.advance_round(t, true, out);
        }
        self.last_persisted = Some(now);
        self.unwritten = false;
        self.start_round(t, now, force);
        self.advance_round(t, force, out);
    }

    fn hold_catalog(&mut self, t: &mut Tables, now: Moment, ch: CatalogChange, out: &mut Vec<Decided>) -> Option<CatalogChange> {
        // A newer verdict of the session replaces one held.
        self.pending_catalog.retain(|(_, p)| p.session_key != ch.session_key);
        let after = if ch.verdict.convergence == Convergence::Converged { CONFIRM_CONVERGED_AFTER } else { Duration::ZERO };
        if self.pending_catalog.len() >= MAX_PENDING_CATALOG {
            // Bounded: the oldest held change is emitted now (it may be emitted twice).
            let (_, old) = self.pending_catalog.remove(0);
            t.emit_catalog(old, out);
        }
        self.pending_catalog.push((now + after, ch));
        None
    }

    fn hold_verdict(&mut self, v: &Verdict) -> bool {
        let relevant = v.state.is_failure() || v.state == HealthState::Healthy;
        if relevant && self.pending_incident_verdicts < MAX_PENDING_INCIDENT_VERDICTS {
            self.pending_incidents.entry(v.server.clone()).or_default().push(Arc::new(IncidentFacts::held(v)));
            self.pending_incident_verdicts += 1;
            return true;
        }
        if relevant {
            self.incidents_unshared += 1;
        }
        false
    }

    fn report_drift(&mut self, record: DriftRecord, event: DriftEvent) -> Option<DriftEvent> {
        // Reported by the instance whose write creates the record (the write round).
        self.pending_drift.push((record, event));
        None
    }

    fn finish(&mut self, t: &mut Tables, catalog: bool, out: &mut Vec<Decided>) {
        self.advance_round(t, true, out);
        self.fold_pending_locally(t, out);
        if catalog {
            self.emit_pending_catalog(t, out);
        }
    }

    fn touched(&mut self) {
        self.unwritten = true;
    }

    fn next_due(&self) -> Option<Moment> {
        let write = match (self.unwritten, self.last_persisted) {
            (true, Some(at)) => Some(at + crate::state::PERSIST_EVERY),
            _ => None,
        };
        // A held catalog change is emitted at a write: wake for the first write at or after it.
        let catalog = match (self.pending_catalog.iter().map(|(at, _)| *at).min(), self.last_persisted) {
            (Some(at), Some(p)) => Some(at.max(p + crate::state::PERSIST_EVERY)),
            (Some(at), None) => Some(at),
            _ => None,
        };
        // Answers awaited: look again soon.
        let awaited = (!self.awaiting.is_empty() || self.round.is_some()).then_some(self.now + POLL_AFTER);
        [write, catalog, awaited].into_iter().flatten().min()
    }

    fn figures(&self) -> ReplicaFigures {
        ReplicaFigures {
            store_down: self.link.down,
            store_errors: self.link.errors,
            store_conflicts: self.link.conflicts,
            taken_over: self.link.taken_over,
            sessions_merged: self.sessions_merged,
            incidents_unshared: self.incidents_unshared,
            queue_waits: self.link.worker.queue_waits() + self.awaiting_waits,
            waited: self.link.worker.waited(),
            skipped: self.link.skipped,
            // The evidence journal is for a store of one process (`storage.directory`).
            durable_at: None,
        }
    }

    fn gauges(&self) -> GaugeSource<'_> {
        match &self.global_gauges {
            Some((_, counts)) if self.gauge_leader => GaugeSource::Global(counts),
            _ => GaugeSource::Elsewhere,
        }
    }

    fn gauge_leader(&self) -> bool {
        self.gauge_leader
    }
}

/// Put `items` back in front of `v` (what a round took and the store did not take).
fn prepend<T>(v: &mut Vec<T>, items: Vec<T>) {
    let rest = std::mem::replace(v, items);
    v.extend(rest);
}

/// The sessions of the tool calls in `decided` (sorted, once each).
///
/// Calls are many and sessions few: the key's parts are deduplicated first (borrowed), so a
/// key is built once per session, not once per call.
fn session_keys(decided: &[DecidedCalls]) -> Vec<String> {
    type Parts<'a> = (Option<&'a str>, Option<&'a str>, Option<&'a str>, bool);
    let mut parts: rustc_hash::FxHashSet<Parts> = Default::default();
    // Calls of one session come in runs: a run costs one comparison per call, not a hash.
    let mut last: Option<Parts> = None;
    for c in decided.iter().flat_map(|d| d.calls.iter()).filter(|c| c.method == Some(Method::ToolsCall)) {
        let p = (c.session_id.as_deref(), c.service.as_deref(), c.server.as_deref(), c.client_seen);
        if last != Some(p) {
            parts.insert(p);
            last = Some(p);
        }
    }
    let mut keys: Vec<String> = parts
        .into_iter()
        .filter_map(|(session, service, server, client)| {
            crate::evidence::session_key(session, service, server, if client { Side::Client } else { Side::Server })
        })
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

/// Every instance's open incidents and sessions, counted in the store (the lease holder).
fn count_global(s: &mut dyn StateStore) -> Result<GlobalCounts, StoreError> {
    let incidents = s.scan(Table::Incidents)?;
    let sessions = s.scan(Table::Sessions)?;
    let mut open = FxHashMap::default();
    for (_, r) in &incidents {
        if let Record::Incidents(part) = r {
            super::super::count_open(&mut open, part.open.iter());
        }
    }
    let mut convergence: FxHashMap<(String, Convergence), u64> = FxHashMap::default();
    for (_, r) in &sessions {
        if let Record::Session(s) = r {
            if let Some(c) = s.last {
                *convergence.entry((s.server.as_deref().unwrap_or("").to_string(), c)).or_default() += 1;
            }
        }
    }
    Ok((open, convergence))
}

/// The second job of a round, on the store's thread: the incident fold and the list merges
/// onto the records read, then every change in one script.
fn write_round(s: &mut dyn StateStore, job: WriteJob) -> Written {
    let mut changes = Changes::default();
    for d in &job.drift {
        changes.put(d.key(), Record::DriftReported(d.clone()));
    }
    let folded = job.incidents.map(|(pending, stored)| fold_incidents(pending, stored, &mut changes));
    let refusals = list_changes(job.refusals, merge_refusals, &mut changes);
    let halves = list_changes(job.halves, merge_halves, &mut changes);
    let parked = list_changes(job.parked, merge_parked, &mut changes);
    changes.changes.extend(job.changes.changes);
    let result = if changes.is_empty() {
        Ok(None)
    } else {
        match s.apply(&changes) {
            Ok(()) => Ok(Some(Vec::new())),
            Err(StoreError::Conflict { refused, .. }) => Ok(Some(refused)),
            Err(e) => Err(e),
        }
    };
    let (mut refusals, mut halves, mut parked) = (refusals, halves, parked);
    if let Ok(r) = &result {
        // What the store took is dropped here, on the store's thread, not carried back to the
        // engine's to be dropped there: only a refused record's items are published again.
        let refused = r.as_deref().unwrap_or_default();
        drop_taken(&mut refusals, refused);
        drop_taken(&mut halves, refused);
        drop_taken(&mut parked, refused);
    }
    Written { refusals, halves, parked, folded, result }
}

/// Empty the items of a written list's records that the store took (not in `refused`).
fn drop_taken<T>((job, written): &mut (ListJob<T>, bool), refused: &[(Table, String)]) {
    if !*written {
        return;
    }
    for (key, mine) in job.by_key.iter_mut() {
        if !refused.iter().any(|(t, k)| *t == job.table && k == key) {
            *mine = Vec::new();
        }
    }
}

/// Fold the verdicts held into each of their servers' incident record as read, as changes. A
/// record another instance changed since is refused by the write; its verdicts are folded into
/// the newer record next round (the fold does not depend on the order of verdicts, so the
/// result is the one process's).
fn fold_incidents(pending: Vec<(Option<Arc<str>>, Vec<HeldVerdict>)>, stored: Vec<Option<Record>>, changes: &mut Changes) -> Vec<Folded> {
    let mut folded = Vec::with_capacity(pending.len());
    let mut stored = stored.into_iter();
    for (server, verdicts) in pending {
        let key = server_key(server.as_deref());
        let part = match stored.next().flatten() {
            Some(Record::Incidents(p)) if p.server == server => *p,
            _ => ServerIncidents { server: server.clone(), ..Default::default() },
        };
        let mut book = IncidentBook::default();
        book.restore(part);
        let mut transitions = Vec::new();
        for v in &verdicts {
            transitions.extend(book.fold(v));
        }
        let new = book.parts(std::slice::from_ref(&server)).pop().unwrap_or_default();
        if new.is_empty() {
            changes.delete(Table::Incidents, key.clone());
        } else {
            changes.put(key.clone(), Record::Incidents(Box::new(new.clone())));
        }
        folded.push(Folded { server, key, transitions, new, resolved: book.resolved_total });
    }
    folded
}

/// A list's items merged onto its records as read (`None`: the read failed, nothing is written
/// of it), and the expired records this instance wrote deleted; whether it went in.
fn list_changes<T>(
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

/// The incident fold at the end, waited for: a read of the records and one script.
fn sync_incidents(
    s: &mut dyn StateStore,
    pending: Vec<(Option<Arc<str>>, Vec<HeldVerdict>)>,
    effects: &mut Vec<Effect>,
) -> Option<(Vec<Folded>, Vec<String>)> {
    if pending.is_empty() {
        return Some((Vec::new(), Vec::new()));
    }
    let keys: Vec<String> = pending.iter().map(|(s, _)| server_key(s.as_deref())).collect();
    let stored = match s.get_many(Table::Incidents, &keys) {
        Ok(r) => r,
        Err(e) => {
            effects.push(Effect::Failed);
            tracing::warn!(error = %e, servers = keys.len(), "could not read incidents from the state store; holding the verdicts");
            return None;
        }
    };
    let mut changes = Changes::default();
    let folded = fold_incidents(pending, stored, &mut changes);
    let refused = match s.apply(&changes) {
        Ok(()) => {
            effects.push(Effect::Up);
            Vec::new()
        }
        Err(StoreError::Conflict { refused, .. }) => {
            effects.push(Effect::Up);
            effects.push(Effect::Conflicts(refused.len() as u64));
            tracing::debug!(records = refused.len(), "incident records changed by another instance; folding again");
            refused.into_iter().map(|(_, k)| k).collect()
        }
        Err(e) => {
            effects.push(Effect::Failed);
            tracing::warn!(error = %e, servers = folded.len(), "could not write incidents to the state store; holding the verdicts");
            return None;
        }
    };
    Some((folded, refused))
}

fn merge_refusals(rec: Option<Record>, mine: &[SpanEvidence]) -> Record {
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

/// The split marks a round read: a server the store has marked is learned (its held-back halves
/// published); one marked here that the store lacks is written with this round (the marks to
/// write are returned). Without the read (it failed), the marks wait for the next round.
fn take_split_read(t: &mut Tables, now: Moment, job: SplitsJob, read: Option<Vec<Option<Record>>>, changes: &mut Changes) -> Vec<Server> {
    let Some(records) = read else {
        t.chains.split_marks_again(job.servers.into_iter().take(job.marked).collect());
        return Vec::new();
    };
    let mut marks = Vec::new();
    for (i, (server, r)) in job.servers.into_iter().zip(records.into_iter().chain(std::iter::repeat(None))).enumerate() {
        match r {
            Some(Record::Split(_)) => t.chains.learn_split(&server, now),
            _ if i < job.marked => {
                changes.put(server_key(server.as_deref()), Record::Split(SplitRecord { server: server.clone() }));
                marks.push(server);
            }
            _ => {}
        }
    }
    marks
}

fn merge_halves(rec: Option<Record>, mine: &[ClientHalf]) -> Record {
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

fn merge_parked(rec: Option<Record>, mine: &[SpanEvidence]) -> Record {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evidence::call::CallEvidence;

    /// The keys deduplicated by their parts are the keys of every call, sorted once each.
    #[test]
    fn session_keys_are_every_calls_key_once() {
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
        let decided = vec![
            DecidedCalls {
                trace_id: [1; 16],
                calls: calls[..3].to_vec(),
                decision: crate::classify::Decision {
                    revision: 0,
                    decided_by: crate::verdict::DecidedBy::Quiet,
                    root_seen: true,
                    truncated: false,
                },
                previous: Vec::new(),
            },
            DecidedCalls {
                trace_id: [2; 16],
                calls: calls[3..].to_vec(),
                decision: crate::classify::Decision {
                    revision: 0,
                    decided_by: crate::verdict::DecidedBy::Quiet,
                    root_seen: true,
                    truncated: false,
                },
                previous: Vec::new(),
            },
        ];
        assert_eq!(session_keys(&decided), want);
        assert_eq!(want, ["client:?|server:y", "client:a|server:x", "session:s0", "session:s1"]);
    }
}
