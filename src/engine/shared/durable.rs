//! One process on a store of its own (memory, embedded redb): what changed is written at most
//! every [`PERSIST_EVERY`](crate::state::PERSIST_EVERY) of engine time and at every drain, and
//! loaded back when the engine is made. Nobody else writes it, so nothing is read back while the
//! engine runs except decided chains it forgot under its bounds. A store error is logged and
//! counted and the engine goes on in memory: no verdict depends on a write.

use crate::correlate::{CatalogChange, DecidedCalls};
use crate::evidence::time::Moment;
use crate::evidence::SpanEvidence;
use crate::state::{Changes, StoreError, StoreHandle};
use crate::verdict::Verdict;

use super::link::Link;
use super::worker::Worker;
use super::{Batch, Decided, DriftEvent, GaugeSource, HeldVerdict, Keeps, Replica, ReplicaFigures, Tables};

pub(crate) struct Durable {
    link: Link,
    last_persisted: Option<Moment>,
    /// The last round that left the store holding every change made up to it.
    durable_at: Option<Moment>,
    /// Evidence was taken in since the last write.
    unwritten: bool,
    /// Drift reported since the last write.
    drift_dirty: Vec<crate::state::DriftRecord>,
}

impl Durable {
    pub(crate) fn new(store: StoreHandle) -> Self {
        Durable {
            link: Link::new(Worker::for_store(store)),
            last_persisted: None,
            durable_at: None,
            unwritten: false,
            drift_dirty: Vec::new(),
        }
    }
}

impl Replica for Durable {
    fn keeps(&self) -> Keeps {
        Keeps::Own
    }

    fn attach(&mut self, t: &mut Tables) {
        self.link.load(t, true);
    }

    fn before_ingest(&mut self, t: &mut Tables, spans: &[SpanEvidence]) {
        self.link.take_back(t, spans);
    }

    fn before_decide(&mut self, _: &mut Tables, _: Moment, _: bool, _: &mut Vec<DecidedCalls>) -> bool {
        false
    }

    fn every_second(&mut self, _: &mut Tables, _: Moment, _: bool) {
        // A store marked down is asked whether it answers again, so the mark (and the health
        // check's `degraded`) ends when it is back even if nothing is written meanwhile.
        if !self.link.down {
            return;
        }
        if matches!(self.link.call(|s| s.probe().unwrap_or(Err(StoreError::Backend(String::new())))), Ok(())) {
            self.link.down = false;
            tracing::info!("the state store answers again");
        }
    }

    fn admit(&mut self, _: &mut Tables, batch: Batch, ready: &mut Vec<Batch>) {
        ready.push(batch);
    }

    fn ready(&mut self, _: &mut Tables, _: Moment, _: bool, _: &mut Vec<Batch>) {}

    fn persist(&mut self, t: &mut Tables, now: Moment, force: bool, _: &mut Vec<Decided>) {
        if !force && self.last_persisted.is_some_and(|at| now.saturating_duration_since(at) < crate::state::PERSIST_EVERY) {
            return;
        }
        self.last_persisted = Some(now);
        self.unwritten = false;
        let mut changes = Changes::default();
        super::records::session_changes(t.sessions.take_changes(), &mut changes);
        crate::state::incident_changes(t.incidents, &mut changes);
        super::records::chain_changes(t.chains.take_changes(), &mut changes);
        for d in self.drift_dirty.drain(..) {
            changes.put(d.key(), crate::state::Record::DriftReported(d));
        }
        if changes.is_empty() {
            if !self.link.down {
                self.durable_at = Some(now);
            }
            return;
        }
        let n = changes.len();
        match self.link.call(move |s| s.apply(&changes)) {
            Ok(()) => {
                self.link.down = false;
                self.durable_at = Some(now);
            }
            Err(e) => {
                if matches!(e, StoreError::Conflict { .. }) {
                    self.link.conflicts += 1;
                    self.link.down = false;
                } else {
                    self.link.failed();
                }
                tracing::warn!(error = %e, changes = n, "could not write the state store; going on in memory");
            }
        }
    }

    fn hold_catalog(&mut self, _: &mut Tables, _: Moment, ch: CatalogChange, _: &mut Vec<Decided>) -> Option<CatalogChange> {
        Some(ch)
    }

    fn hold_verdict(&mut self, _: &Verdict) -> bool {
        false
    }

    fn report_drift(&mut self, record: crate::state::DriftRecord, event: DriftEvent) -> Option<DriftEvent> {
        self.drift_dirty.push(record);
        Some(event)
    }

    fn finish(&mut self, _: &mut Tables, _: bool, _: &mut Vec<Decided>) -> Vec<HeldVerdict> {
        Vec::new()
    }

    fn touched(&mut self) {
        self.unwritten = true;
    }

    fn next_due(&self) -> Option<Moment> {
        match (self.unwritten, self.last_persisted) {
            (true, Some(t)) => Some(t + crate::state::PERSIST_EVERY),
            _ => None,
        }
    }

    fn figures(&self) -> ReplicaFigures {
        ReplicaFigures {
            store_down: self.link.down,
            store_errors: self.link.errors,
            store_conflicts: self.link.conflicts,
            taken_over: self.link.taken_over,
            queue_waits: self.link.worker.queue_waits(),
            waited: self.link.worker.waited(),
            skipped: self.link.skipped,
            store: self.link.worker.store_stats(),
            durable_at: self.durable_at,
            ..Default::default()
        }
    }

    fn gauges(&self) -> GaugeSource<'_> {
        GaugeSource::Own
    }

    fn gauge_leader(&self) -> bool {
        true
    }
}
