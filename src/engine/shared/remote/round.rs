//! The two-phase write round: one pipelined read (the incident records of the servers whose
//! verdicts are held, the list records to add to, the sessions to write, the split marks), then,
//! once the engine has merged the sessions, one script with every change. A round starts at most
//! every `PERSIST_EVERY`; while one is in flight the next waits its turn.

use rustc_hash::FxHashMap;

use crate::classify::catalog::Convergence;
use crate::correlate::outbox::{FromStore, ReadBack, Restore, SessionBack};
use crate::correlate::splits::Server;
use crate::correlate::CatalogChange;
use crate::correlate::DecidedCalls;
use crate::evidence::time::Moment;
use crate::evidence::SpanEvidence;
use crate::state::{server_key, Changes, ClientHalf, DriftRecord, Record, StateStore, StoreError, Table};

use super::super::records::{chain_changes, session_changes};
use super::super::worker::{Ticket, Worker};
use super::super::{Decided, DriftEvent, Tables};
use super::incidents::{fold_incidents, ByServer, Folded, HeldByServer};
use super::lists::{drop_taken, list_changes, merge_halves, merge_parked, merge_refusals, ListJob};
use super::reads::StepRead;
use super::splits::{splits_job, take_split_read, SplitsJob};
use super::{is_refused, prepend, Shared};

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
        incidents: HeldByServer,
        lists: (ListJob<SpanEvidence>, ListJob<ClientHalf>, ListJob<SpanEvidence>),
        sessions: Vec<String>,
        splits: SplitsJob,
    },
    Writing {
        ticket: Ticket<Written>,
        at: Moment,
        drift: Vec<(DriftRecord, DriftEvent)>,
        incidents: HeldByServer,
        emitting: Vec<CatalogChange>,
        stored_emitted: FxHashMap<String, Option<Convergence>>,
        sessions_written: Vec<String>,
        changes: usize,
        /// Marks of servers seen to split, written with this round.
        marks: Vec<Server>,
    },
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

/// The write rounds' own state: the round in flight, when the last started, and the drift
/// detected here that a round's write is to create (reported by the instance whose write does).
#[derive(Default)]
pub(super) struct Rounds {
    current: Option<Round>,
    last_persisted: Option<Moment>,
    /// Evidence was taken in since the last write.
    unwritten: bool,
    /// Drift detected here, reported once its record is created.
    drift: Vec<(DriftRecord, DriftEvent)>,
    /// Decided chains whose write here was refused (another instance wrote a revision of its
    /// own first): read at the next step and merged (see [`Shared::take_rivals`]). At most
    /// [`MAX_RIVALS`]; past that the oldest go (counted), their chains then keep this
    /// instance's revision alone.
    rivals: Vec<crate::evidence::TraceId>,
}

/// Most refused decided chains waiting to be read and merged: a round's worth and more.
const MAX_RIVALS: usize = 4096;

impl Rounds {
    /// Evidence was taken in since the last write.
    pub(super) fn touched(&mut self) {
        self.unwritten = true;
    }

    /// Drift detected here: reported by the instance whose write creates its record.
    pub(super) fn report_drift(&mut self, record: DriftRecord, event: DriftEvent) {
        self.drift.push((record, event));
    }

    /// The drift no round has written (at the end, reported here rather than never).
    pub(super) fn take_drift(&mut self) -> Vec<(DriftRecord, DriftEvent)> {
        std::mem::take(&mut self.drift)
    }

    pub(super) fn last_persisted(&self) -> Option<Moment> {
        self.last_persisted
    }

    /// When the next write is due (evidence came since the last).
    pub(super) fn next_write(&self) -> Option<Moment> {
        match (self.unwritten, self.last_persisted) {
            (true, Some(at)) => Some(at + crate::state::PERSIST_EVERY),
            _ => None,
        }
    }

    /// A round is in flight.
    pub(super) fn in_flight(&self) -> bool {
        self.current.is_some()
    }
}

impl Shared {
    /// Write what changed: advance the round in flight, and start the next when one is due
    /// (at most every `PERSIST_EVERY`, always when `force`; one round at a time).
    pub(super) fn persist_round(&mut self, t: &mut Tables, now: Moment, force: bool, out: &mut Vec<Decided>) {
        self.advance_round(t, force, out);
        let due = force || self.rounds.last_persisted.is_none_or(|at| now.saturating_duration_since(at) >= crate::state::PERSIST_EVERY);
        if !due {
            return;
        }
        if self.rounds.current.is_some() {
            if !force {
                // One round at a time: the write interval stretches to the store's pace.
                return;
            }
            self.advance_round(t, true, out);
        }
        self.rounds.last_persisted = Some(now);
        self.rounds.unwritten = false;
        self.start_round(t, now, force);
        self.advance_round(t, force, out);
    }

    /// Advance the write round as far as its answers allow (`wait`: to its end).
    pub(super) fn advance_round(&mut self, t: &mut Tables, wait: bool, out: &mut Vec<Decided>) {
        loop {
            let Some(round) = self.rounds.current.as_ref() else { return };
            if !round.answered(&self.link.worker) {
                if !wait && !self.due(round.at()) {
                    return;
                }
                round.wait(&mut self.link.worker);
            }
            match self.rounds.current.take() {
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
                        t.chains.restore(Restore::MarksAgain(marks));
                        self.round_lost(drift, incidents);
                        return;
                    };
                    if w.result.is_err() {
                        t.chains.restore(Restore::MarksAgain(marks));
                    }
                    self.round_written(t, at, drift, incidents, w, emitting, stored_emitted, sessions_written, changes, out);
                }
                None => return,
            }
        }
    }

    /// The store's thread ended with a round in flight: what it held is held again.
    pub(super) fn round_lost(&mut self, drift: Vec<(DriftRecord, DriftEvent)>, incidents: HeldByServer) {
        self.link.failed();
        prepend(&mut self.rounds.drift, drift);
        self.incidents.hold_again(incidents);
    }

    /// Start a write round: one pipelined read of the incident records of the servers whose
    /// verdicts are held, the list records to add to, and the sessions to write.
    fn start_round(&mut self, t: &mut Tables, now: Moment, force: bool) {
        let drift = std::mem::take(&mut self.rounds.drift);
        let incidents = self.incidents.take_pending();
        let published = t.chains.take_for_round(now);
        let lists =
            (self.refusals_job(published.orphans, now), self.halves_job(published.halves, now), self.parked_job(published.parked, now));
        // Catalog changes held for emission whose time has come: their sessions are read and
        // written now, so the write decides who emits them.
        self.mark_catalog_due(t, now, force);
        let sessions = t.sessions.to_read_back(ReadBack::ToWrite);
        let splits = splits_job(published.marks, published.ask_marks);
        let asks = vec![
            (Table::Incidents, incidents.keys().map(|s| server_key(s.as_deref())).collect::<Vec<_>>()),
            (Table::Refusals, lists.0.keys()),
            (Table::Halves, lists.1.keys()),
            (Table::Parked, lists.2.keys()),
            (Table::Sessions, sessions.clone()),
            (Table::Splits, splits.keys()),
        ];
        let ticket = asks.iter().any(|(_, k)| !k.is_empty()).then(|| self.link.worker.submit(move |s| s.get_tables(&asks)));
        self.rounds.current = Some(Round::Reading { ticket, at: now, force, drift, incidents, lists, sessions, splits });
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
        incidents: HeldByServer,
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
            self.hold_change(t, now, ch, out);
        }
        let emitting = if read_sessions { self.choose_catalog(t, now, force, &stored_emitted, out) } else { Vec::new() };
        let mut changes = Changes::default();
        session_changes(t.sessions.take_changes(), &mut changes);
        chain_changes(t.chains.take_changes(), &mut changes);
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
        self.rounds.current =
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
        incidents: HeldByServer,
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
        match &refused {
            // A record another instance created first was reported there.
            Some(_) => out.extend(
                drift
                    .into_iter()
                    .filter(|(d, _)| !is_refused(refused.as_deref(), Table::DriftReported, &d.key()))
                    .map(|(_, e)| Decided::Drift(Box::new(e))),
            ),
            None => prepend(&mut self.rounds.drift, drift),
        }
        self.take_round_fold(t, w.folded, refused.as_deref(), incidents, out);
        self.lists_written(w.refusals, w.halves, w.parked, refused.as_deref(), now);
        let conflict =
            refused.as_ref().is_some_and(|r| r.iter().any(|(t, _)| matches!(t, Table::Sessions | Table::Decided | Table::Operations)));
        if conflict {
            self.link.conflicts += 1;
            // A decided chain another instance revised at the same time: its revision is read
            // and merged with this one's at the next step (a verdict of both).
            let traces = refused.iter().flatten().filter(|(t, _)| *t == Table::Decided).filter_map(|(_, k)| crate::state::trace_of_key(k));
            self.rounds.rivals.extend(traces);
            let over = self.rounds.rivals.len().saturating_sub(MAX_RIVALS);
            if over > 0 {
                self.rounds.rivals.drain(..over);
                crate::bounded::counter("decided_rivals").fetch_add(over as u64, std::sync::atomic::Ordering::Relaxed);
            }
            // Another instance wrote one of them in between: read, merge and write the sessions
            // again next time (the refused one among them).
            for k in &sessions_written {
                t.sessions.restore(SessionBack::WriteAgain(k));
            }
            tracing::warn!(changes, "records changed by another instance; merged and written again next round");
        }
        self.catalog_written(t, now, emitting, &stored_emitted, refused.as_deref(), out);
    }

    /// The decided chains whose write here was refused, read as the store holds them now
    /// (another instance's revision) and merged: the spans that revision holds and the chain
    /// here lacks join it as late spans, so the next revision holds the evidence of both (a late
    /// span here, a verifier that reached the other instance). Without it each instance's
    /// revision stands alone, and the store keeps whichever was written first.
    pub(super) fn take_rivals(&mut self, t: &mut Tables, now: Moment, decided: &mut Vec<DecidedCalls>) {
        if self.rounds.rivals.is_empty() {
            return;
        }
        let mut traces = std::mem::take(&mut self.rounds.rivals);
        traces.sort_unstable();
        traces.dedup();
        let keys: Vec<String> = traces.iter().map(crate::state::trace_key).collect();
        let read = match self.link.call(move |s| s.get_many(Table::Decided, &keys)) {
            Ok(r) => r,
            Err(e) => {
                self.link.failed();
                tracing::warn!(error = %e, "could not read decided chains another instance revised");
                return;
            }
        };
        for r in read.into_iter().flatten() {
            if let Record::Decided(r) = r {
                t.chains.take_in(FromStore::Rival((*r).into()), now, decided);
            }
        }
    }
}

/// The second job of a round, on the store's thread: the incident fold and the list merges
/// onto the records read, then every change in one script.
fn write_round(s: &mut dyn StateStore, job: WriteJob) -> Written {
    // The sessions and decided chains first, as they came (most of a round, not moved again);
    // the rest are of other tables, so the order changes nothing the store does.
    let mut changes = job.changes;
    let more = job.drift.len()
        + job.incidents.as_ref().map_or(0, |(by_server, _)| by_server.len())
        + job.refusals.0.changes_at_most()
        + job.halves.0.changes_at_most()
        + job.parked.0.changes_at_most();
    changes.changes.reserve_exact(more);
    for d in &job.drift {
        changes.put(d.key(), Record::DriftReported(d.clone()));
    }
    let folded = job.incidents.map(|(pending, stored)| fold_incidents(pending, stored, &mut changes));
    let refusals = list_changes(job.refusals, merge_refusals, &mut changes);
    let halves = list_changes(job.halves, merge_halves, &mut changes);
    let parked = list_changes(job.parked, merge_parked, &mut changes);
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
