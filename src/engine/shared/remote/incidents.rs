//! The incident fold: verdicts decided here are held and folded into the store's record of their
//! server by compare-and-set, so exactly one instance emits each transition; a refused record is
//! folded again next round, and what the store never took is folded here at the end.

use std::collections::btree_map::Entry;
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
pub(super) type ByServer = Vec<(Option<Arc<str>>, Arc<Vec<HeldVerdict>>)>;

/// Verdicts by server, as a round holds them while the store's thread folds them.
pub(super) type HeldByServer = BTreeMap<Option<Arc<str>>, Arc<Vec<HeldVerdict>>>;

/// The incident fold's own state: the verdicts held for it, by server, and their count (with
/// those in a round in flight).
#[derive(Default)]
pub(super) struct IncidentFold {
    /// Verdicts decided here and not yet folded into the store's incidents, by server.
    pending: BTreeMap<Option<Arc<str>>, Vec<HeldVerdict>>,
    held: usize,
    unshared: u64,
    /// Lists a round folded and the store's thread let go of, emptied, for the next round's
    /// servers: a server's verdicts go into memory already resident instead of a list grown
    /// afresh every round (freed pages go back to the OS near the memory limit, and each was
    /// faulted in again). Their capacities add up to at most [`MAX_PENDING_INCIDENT_VERDICTS`].
    spare: Vec<Vec<HeldVerdict>>,
}

impl IncidentFold {
    /// Verdicts folded into this instance's own book instead of the store's (a figure).
    pub(super) fn unshared(&self) -> u64 {
        self.unshared
    }

    /// A folded server's list back from its round: kept, emptied, for a server of the next
    /// (when the store's thread has let go of it and the spare lists have room).
    fn recycle(&mut self, vs: Arc<Vec<HeldVerdict>>) {
        let Ok(mut vs) = Arc::try_unwrap(vs) else { return };
        let kept: usize = self.spare.iter().map(Vec::capacity).sum();
        if kept + vs.capacity() <= MAX_PENDING_INCIDENT_VERDICTS {
            vs.clear();
            self.spare.push(vs);
        }
    }

    /// The verdicts held, for a write round (still counted until folded).
    pub(super) fn take_pending(&mut self) -> HeldByServer {
        std::mem::take(&mut self.pending).into_iter().map(|(server, vs)| (server, Arc::new(vs))).collect()
    }

    /// Verdicts a round did not fold, held again for the next (moved back when the store's
    /// thread has let go of them, as it has once its answer is read).
    pub(super) fn hold_again(&mut self, incidents: HeldByServer) {
        for (server, vs) in incidents {
            let vs = Arc::unwrap_or_clone(vs);
            match self.pending.entry(server) {
                Entry::Vacant(e) => {
                    e.insert(vs);
                }
                Entry::Occupied(mut e) => e.get_mut().extend(vs),
            }
        }
    }
}

impl Shared {
    /// A verdict for the incidents: held for the store's fold (true), or, past the bound or not
    /// relevant to incidents, left to the engine's own book (false; counted when relevant).
    pub(super) fn hold_for_fold(&mut self, v: &Verdict) -> bool {
        let relevant = v.state.is_failure() || v.state == HealthState::Healthy;
        if relevant && self.incidents.held < MAX_PENDING_INCIDENT_VERDICTS {
            // The server's name is cloned for its first verdict of a round only.
            let facts = IncidentFacts::held(v);
            match self.incidents.pending.get_mut(&v.server) {
                Some(vs) => vs.push(facts),
                None => {
                    let mut vs = self.incidents.spare.pop().unwrap_or_default();
                    vs.push(facts);
                    self.incidents.pending.insert(v.server.clone(), vs);
                }
            }
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
        mut incidents: HeldByServer,
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
    fn apply_folded(&mut self, t: &mut Tables, f: Folded, held: &mut HeldByServer, out: &mut Vec<Decided>) {
        if let Some(vs) = held.remove(&f.server) {
            self.incidents.held -= vs.len();
            self.incidents.recycle(vs);
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
        let incidents = self.incidents.take_pending();
        let job: ByServer = incidents.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
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
        self.incidents.hold_again(incidents);
    }
}

/// Fold the verdicts held into each of their servers' incident record as read, as changes. A
/// record another instance changed since is refused by the write; its verdicts are folded into
/// the newer record next round (the fold does not depend on the order of verdicts, so the
/// result is the one process's).
pub(super) fn fold_incidents(pending: ByServer, stored: Vec<Option<Record>>, changes: &mut Changes) -> Vec<Folded> {
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
        for v in verdicts.iter() {
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
fn sync_incidents(s: &mut dyn StateStore, pending: ByServer, effects: &mut Vec<Effect>) -> Option<(Vec<Folded>, Vec<String>)> {
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

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use super::*;
    use crate::verdict::{Confidence, LayerStatus};

    fn facts(end_ns: u64) -> HeldVerdict {
        IncidentFacts {
            state: HealthState::Healthy,
            first_failed_layer: None,
            server: Some(Arc::from("tickets:443")),
            tool: Some(Arc::from("create_ticket")),
            agent: None,
            session_id_hash: None,
            credential_hash: None,
            reason: None,
            required_scope: None,
            next_action: Cow::Borrowed(""),
            auth_flow_pending: false,
            confidence: Confidence::High,
            outcome_decided: true,
            outcome: LayerStatus::Passed,
            start_ns: end_ns,
            end_ns,
        }
    }

    fn list(n: u64) -> Arc<Vec<HeldVerdict>> {
        Arc::new((0..n).map(facts).collect())
    }

    /// A folded server's list is kept, emptied, for the next round's servers once the store's
    /// thread has let go of it; one still shared is left alone (its verdicts are not the
    /// engine's to clear), and what is kept stays within the held verdicts' bound.
    #[test]
    fn a_folded_list_is_kept_empty_for_the_next_round_within_the_bound() {
        let mut fold = IncidentFold::default();
        let folded = list(3);
        let at = folded.as_ptr();
        fold.recycle(folded);
        assert_eq!(fold.spare.len(), 1);
        assert!(fold.spare[0].is_empty() && fold.spare[0].capacity() >= 3);
        assert_eq!(fold.spare[0].as_ptr(), at, "the same memory, not a new list");

        let shared = list(2);
        let store_side = shared.clone();
        fold.recycle(shared);
        assert_eq!(fold.spare.len(), 1, "a list the store's thread still holds is not taken");
        assert_eq!(store_side.len(), 2);

        let mut big = Vec::with_capacity(MAX_PENDING_INCIDENT_VERDICTS);
        big.push(facts(1));
        fold.recycle(Arc::new(big));
        assert_eq!(fold.spare.len(), 1, "past the bound, a list is let go");
        let kept: usize = fold.spare.iter().map(Vec::capacity).sum();
        assert!(kept <= MAX_PENDING_INCIDENT_VERDICTS);
    }

    /// Verdicts a round did not fold are held again beside those held since, none lost, in
    /// the order they came.
    #[test]
    fn verdicts_held_again_join_those_held_since() {
        let mut fold = IncidentFold::default();
        let server: Option<Arc<str>> = Some(Arc::from("tickets:443"));
        fold.pending.insert(server.clone(), vec![facts(10)]);
        let round: HeldByServer = [(server.clone(), list(2)), (None, list(1))].into_iter().collect();
        fold.hold_again(round);
        let ends: Vec<u64> = fold.pending[&server].iter().map(|f| f.end_ns).collect();
        assert_eq!(ends, vec![10, 0, 1]);
        assert_eq!(fold.pending[&None].len(), 1);
    }
}
