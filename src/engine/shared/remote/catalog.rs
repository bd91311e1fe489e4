//! The catalog hold: a catalog change is held to the write round that records it as emitted, so
//! the instance whose write records a change emits it, once across instances; a `converged` one
//! is held a while first, for a confirming read.

use std::time::Duration;

use rustc_hash::FxHashMap;

use crate::classify::catalog::Convergence;
use crate::correlate::outbox::SessionBack;
use crate::correlate::CatalogChange;
use crate::evidence::time::Moment;
use crate::state::Table;

use super::super::{Decided, Tables};
use super::{is_refused, Shared};

/// How long a `converged` catalog verdict is held before a read of the store confirms it:
/// longer than an instance takes to write what it received (`PERSIST_EVERY`).
const CONFIRM_CONVERGED_AFTER: Duration = Duration::from_millis(250);
/// Catalog changes held for emission, at most.
const MAX_PENDING_CATALOG: usize = 100_000;

/// The catalog changes held for emission, with when they are due.
#[derive(Default)]
pub(super) struct CatalogHold {
    held: Vec<(Moment, CatalogChange)>,
}

impl CatalogHold {
    /// When a held change next needs a step: the first write at or after it is due.
    pub(super) fn next_due(&self, last_persisted: Option<Moment>) -> Option<Moment> {
        match (self.held.iter().map(|(at, _)| *at).min(), last_persisted) {
            (Some(at), Some(p)) => Some(at.max(p + crate::state::PERSIST_EVERY)),
            (Some(at), None) => Some(at),
            _ => None,
        }
    }
}

impl Shared {
    /// A catalog change held to the write that records it as emitted (a `converged` one
    /// [`CONFIRM_CONVERGED_AFTER`] longer); a newer verdict of the session replaces one held.
    pub(super) fn hold_change(&mut self, t: &mut Tables, now: Moment, ch: CatalogChange, out: &mut Vec<Decided>) {
        // A newer verdict of the session replaces one held.
        self.catalog.held.retain(|(_, p)| p.session_key != ch.session_key);
        let after = if ch.verdict.convergence == Convergence::Converged { CONFIRM_CONVERGED_AFTER } else { Duration::ZERO };
        if self.catalog.held.len() >= MAX_PENDING_CATALOG {
            // Bounded: the oldest held change is emitted now (it may be emitted twice).
            let (_, old) = self.catalog.held.remove(0);
            t.emit_catalog(old, out);
        }
        self.catalog.held.push((now + after, ch));
    }

    /// Catalog changes held for emission whose time has come: their sessions are read and
    /// written with this round, so the write decides who emits them.
    pub(super) fn mark_catalog_due(&mut self, t: &mut Tables, now: Moment, force: bool) {
        for (_, ch) in self.catalog.held.iter().filter(|(at, _)| force || *at <= now) {
            t.sessions.restore(SessionBack::WriteAgain(&ch.session_key));
        }
    }

    /// The round read the sessions: the changes due are to be recorded as emitted by this
    /// round's write (returned); one already recorded by another instance is dropped, one whose
    /// session was forgotten here is emitted now.
    pub(super) fn choose_catalog(
        &mut self,
        t: &mut Tables,
        now: Moment,
        force: bool,
        stored_emitted: &FxHashMap<String, Option<Convergence>>,
        out: &mut Vec<Decided>,
    ) -> Vec<CatalogChange> {
        let mut emitting = Vec::new();
        // A change is emitted by the instance whose write records it as emitted: one
        // already recorded by another instance is dropped here.
        let mut keep = Vec::new();
        for (at, ch) in std::mem::take(&mut self.catalog.held) {
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
            t.sessions.restore(SessionBack::Emitted(&ch.session_key, v));
            emitting.push(ch);
        }
        self.catalog.held = keep;
        emitting
    }

    /// The round's write answered: the changes it recorded as emitted are emitted; where its
    /// session record was refused, or the write failed, the change is held again (and the
    /// session's mark put back as the store had it).
    pub(super) fn catalog_written(
        &mut self,
        t: &mut Tables,
        now: Moment,
        emitting: Vec<CatalogChange>,
        stored_emitted: &FxHashMap<String, Option<Convergence>>,
        refused: Option<&[(Table, String)]>,
        out: &mut Vec<Decided>,
    ) {
        for ch in emitting {
            if refused.is_none() || is_refused(refused, Table::Sessions, &ch.session_key) {
                let was = stored_emitted.get(&ch.session_key).copied().flatten();
                t.sessions.restore(SessionBack::Emitted(&ch.session_key, was));
                self.catalog.held.push((now, ch));
            } else {
                t.emit_catalog(ch, out);
            }
        }
    }

    /// At the end, catalog changes the store did not take are emitted here rather than never.
    pub(super) fn emit_pending_catalog(&mut self, t: &mut Tables, out: &mut Vec<Decided>) {
        for (_, ch) in std::mem::take(&mut self.catalog.held) {
            t.emit_catalog(ch, out);
        }
    }
}
