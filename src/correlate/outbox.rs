//! What the chains keep for a store until the replica takes it: which decided chains and
//! operation keys changed, the chains decided at shutdown, and (with a shared store) what is to
//! be published for the other instances and the rootless chains to look for. The chains fill it
//! as they decide; the replica drains it at its own pace (a write round, a step's look), so the
//! chains never wait for a store and hold no more of the store's business than this.

use rustc_hash::FxHashSet;

use super::crossjoin;
use crate::evidence::{SpanEvidence, TraceId};

/// The chains' outbox (see the module).
#[derive(Default)]
pub(crate) struct Outbox {
    /// Record which decided chains and operation keys changed (a store is attached).
    pub(super) track: bool,
    pub(super) dirty: FxHashSet<TraceId>,
    pub(super) dirty_ops: FxHashSet<Box<str>>,
    /// Chains decided at shutdown (not kept for revision here), still to be put in the store.
    pub(super) shutdown_decided: Vec<crate::state::DecidedRecord>,
    /// With a shared store: refused-looking HTTP spans kept here as orphans, client halves of
    /// chains decided here and verifiers parked here, still to be published (each bounded; past
    /// the bound the oldest go unpublished).
    pub(super) orphans: Vec<SpanEvidence>,
    pub(super) halves: Vec<(TraceId, crossjoin::Half)>,
    pub(super) parked: Vec<(Box<str>, SpanEvidence)>,
    /// With a shared store: chains whose root never came, gone quiet, to look for in the store's
    /// decided chains (each once).
    pub(super) rootless: Vec<TraceId>,
}

/// What a write round publishes, taken from the outbox at once.
#[derive(Default)]
pub(crate) struct Published {
    pub orphans: Vec<SpanEvidence>,
    pub halves: Vec<(TraceId, crossjoin::Half)>,
    pub parked: Vec<(Box<str>, SpanEvidence)>,
}

impl Outbox {
    /// What is to be published since the last call.
    pub(super) fn take_published(&mut self) -> Published {
        Published {
            orphans: std::mem::take(&mut self.orphans),
            halves: std::mem::take(&mut self.halves),
            parked: std::mem::take(&mut self.parked),
        }
    }
}
