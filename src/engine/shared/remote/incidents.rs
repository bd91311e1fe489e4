//! The incident fold: verdicts decided here are held and folded into the store's record of their
//! server by compare-and-set, so exactly one instance emits each transition; a refused record is
//! folded again next round, and what the store never took is folded here at the end.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::classify::incidents::{IncidentBook, IncidentFacts, IncidentsBack, ServerIncidents, Transition};
use crate::state::{server_key, Changes, Record, StateStore, StoreError, Table};
use crate::verdict::{HealthState, Verdict};

use super::super::{Decided, HeldVerdict, Tables};
use super::{is_refused, Effect, Shared};

/// Verdicts held for the incident fold; past it a verdict is folded into this instance's own
/// book and its transitions emitted at once (counted: `incidents_unshared`), so an alert is
/// never lost for want of the store.
const MAX_PENDING_INCIDENT_VERDICTS: usize = 50_000;

/// One server's incidents as folded on the store's thread.
pub(super) struct Folded {
    server: Option<Arc<str>>,
    key: String,
    transitions: Vec<(Transition, crate::classify::incidents::Incident)>,
    new: ServerIncidents,
    resolved: u64,
}

/// Verdicts by server, as a job carries them.
pub(super) type ByServer = Vec<(Option<Arc<str>>, Vec<HeldVerdict>)>;

/// The incident fold's own state: the verdicts held for it, by server, and their count (with
/// those in a round in flight).
#[derive(Default)]
pub(super) struct IncidentFold {
    /// Verdicts decided here and not yet folded into the store's incidents, by server.
    pending: BTreeMap<Option<Arc<str>>, Vec<HeldVerdict>>,
    held: usize,
    unshared: u64,
}

impl IncidentFold {
    /// Verdicts folded into this instance's own book instead of the store's (a figure).
    pub(super) fn unshared(&self) -> u64 {
        self.unshared
    }

    /// The verdicts held, for a write round (still counted until folded).
    pub(super) fn take_pending(&mut self) -> BTreeMap<Option<Arc<str>>, Vec<HeldVerdict>> {
        std::mem::take(&mut self.pending)
    }

    /// Verdicts a round did not fold, held again for the next.
    pub(super) fn hold_again(&mut self, incidents: BTreeMap<Option<Arc<str>>, Vec<HeldVerdict>>) {
        for (server, vs) in incidents {
            self.pending.entry(server).or_default().extend(vs);
        }
    }
}

impl Shared {
    /// A verdict for the incidents: held for the store's fold (true), or, past the bound or not
    /// relevant to incidents, left to the engine's own book (false; counted when relevant).
    pub(super) fn hold_for_fold(&mut self, v: &Verdict) -> bool {
        let relevant = v.state.is_failure() || v.state == HealthState::Healthy;
        if relevant && self.incidents.held < MAX_PENDING_INCIDENT_VERDICTS {
            self.incidents.pending.entry(v.server.clone()).or_default().push(Arc::new(IncidentFacts::held(v)));
            self.incidents.held += 1;
            return true;
        }
        if relevant {
            self.incidents.unshared += 1;
        }
        false
    }

    /// A round's incident fold written (`refused`: `None` when the write failed): the
    /// transitions this write made are emitted and the book takes the servers' new records; the
    /// verdicts of refused records (folded into the newer record next round), or not folded at
    /// all, are held again.
    pub(super) fn take_round_fold(
        &mut self,
        t: &mut Tables,
        folded: Option<Vec<Folded>>,
        refused: Option<&[(Table, String)]>,
        mut incidents: BTreeMap<Option<Arc<str>>, Vec<HeldVerdict>>,
        out: &mut Vec<Decided>,
    ) {
        if let (Some(folded), Some(_)) = (folded, refused) {
            for f in folded {
                if is_refused(refused, Table::Incidents, &f.key) {
                    self.link.conflicts += 1;
                    continue;
                }
                self.apply_folded(t, f, &mut incidents, out);
            }
        }
        self.incidents.hold_again(incidents);
    }

    /// A server's fold the store took: its verdicts are no longer held, the book takes the
    /// server's new record, and the transitions this write made are emitted.
    fn apply_folded(&mut self, t: &mut Tables, f: Folded, held: &mut BTreeMap<Option<Arc<str>>, Vec<HeldVerdict>>, out: &mut Vec<Decided>) {
        if let Some(vs) = held.remove(&f.server) {
            self.incidents.held -= vs.len();
        }
        t.incidents.restore(IncidentsBack::Folded { part: f.new, resolved: f.resolved });
        out.extend(Decided::incidents(f.transitions));
    }

    /// At the end, verdicts the store did not take are handed back, to be folded into this
    /// instance's own incidents and emitted (counted, `incidents_unshared`): an incident emitted
    /// twice is better than one never emitted.
    pub(super) fn finish_incidents(&mut self, t: &mut Tables, out: &mut Vec<Decided>) -> Vec<HeldVerdict> {
        // A record another instance wrote meanwhile is refused: read and fold again, a few times.
        for _ in 0..3 {
            if self.incidents.pending.is_empty() || self.link.down {
                break;
            }
            self.fold_incidents_now(t, out);
        }
        // Drift the store did not take is reported here rather than never.
        out.extend(self.rounds.take_drift().into_iter().map(|(_, e)| Decided::Drift(Box::new(e))));
        if self.incidents.pending.is_empty() {
            return Vec::new();
        }
        let pending = std::mem::take(&mut self.incidents.pending);
        self.incidents.held = 0;
        let n: usize = pending.values().map(Vec::len).sum();
        tracing::warn!(verdicts = n, "the state store did not take these verdicts' incidents; emitting this instance's view of them");
        self.incidents.unshared += n as u64;
        pending.into_values().flatten().collect()
    }

    /// One incident fold, waited for (at the end).
    fn fold_incidents_now(&mut self, t: &mut Tables, out: &mut Vec<Decided>) {
        let incidents = std::mem::take(&mut self.incidents.pending);
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
                self.apply_folded(t, f, &mut incidents, out);
            }
        }
        for (server, vs) in incidents {
            self.incidents.pending.entry(server).or_default().extend(vs);
        }
    }
}

/// Fold the verdicts held into each of their servers' incident record as read, as changes. A
/// record another instance changed since is refused by the write; its verdicts are folded into
/// the newer record next round (the fold does not depend on the order of verdicts, so the
/// result is the one process's).
pub(super) fn fold_incidents(
    pending: Vec<(Option<Arc<str>>, Vec<HeldVerdict>)>,
    stored: Vec<Option<Record>>,
    changes: &mut Changes,
) -> Vec<Folded> {
    let mut folded = Vec::with_capacity(pending.len());
    let mut stored = stored.into_iter();
    for (server, verdicts) in pending {
        let key = server_key(server.as_deref());
        let part = match stored.next().flatten() {
            Some(Record::Incidents(p)) if p.server == server => *p,
            _ => ServerIncidents { server: server.clone(), ..Default::default() },
        };
        let mut book = IncidentBook::default();
        book.restore(IncidentsBack::Stored(part));
        let mut transitions = Vec::new();
        for v in &verdicts {
            book.fold_into(v, &mut transitions);
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
