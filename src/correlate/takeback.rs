//! Evidence for a decided chain this instance does not hold, though a store may: the chains say
//! which chains to ask the store for, the replica reads them ([`StoreReads`]), and the evidence
//! then revises them as one process would have.

use super::chains::Chains;
use super::outbox::{KeptChain, Restore};
use crate::evidence::{SpanEvidence, TraceId};

/// The store reads the chains make as a batch comes in: rare, so the replica waits for them.
/// `None`: the store does not have it, or could not be read (then the evidence is taken as
/// without a store).
pub(crate) trait StoreReads {
    /// A decided chain forgotten here under a bound (`max_decided`, `max_bytes`), still in the
    /// store.
    fn spilled(&mut self, trace: TraceId) -> Option<KeptChain>;
    /// A decided chain this table does not know: another instance may have decided it. One
    /// `past` says is beyond its late-span window is not taken (answered `None`).
    fn decided(&mut self, trace: TraceId, past: &dyn Fn(u64) -> bool) -> Option<KeptChain>;
    /// The trace of the call an operation key names, in the store's operation index.
    fn operation(&mut self, key: &str) -> Option<TraceId>;
}

impl Chains {
    /// Before a batch is taken in: the decided chains its evidence revises that the store holds
    /// and this table does not are taken from the store first, so the evidence revises them
    /// instead of being dropped as late or making a call-less chain.
    pub(crate) fn take_back(&mut self, spans: &[SpanEvidence], store: &mut impl StoreReads) {
        self.take_back_spilled(spans, store);
        self.take_over(spans, store);
    }

    /// Late evidence for a decided chain forgotten under a bound within its late-span window.
    fn take_back_spilled(&mut self, spans: &[SpanEvidence], store: &mut impl StoreReads) {
        for ev in spans {
            let Some(id) = self.spilled_target(ev) else { continue };
            let kept = store.spilled(id);
            self.restore(Restore::Spilled(id, kept));
        }
    }

    /// A receipt for a trace this table does not know (or naming an operation key no call here
    /// named), with no request of that trace (or key) in the same batch: the call may have been
    /// decided by another instance on the same shared store (the collector's ring changed
    /// between the call and its receipt, a verifier reported in a trace of its own, or an
    /// instance restarted). That decided chain (and its operation key) is taken from the store
    /// first, so the receipt revises it here — one process would have revised it too — instead
    /// of making a call-less chain that says nothing. At most two store reads (operation key,
    /// chain) per such receipt and batch.
    fn take_over(&mut self, spans: &[SpanEvidence], store: &mut impl StoreReads) {
        // A verifier's receipt: outcomes, no request. Most batches hold none: nothing to index.
        let is_receipt = |ev: &&SpanEvidence| !ev.outcomes.is_empty() && ev.method.is_none();
        if !spans.iter().any(|ev| is_receipt(&ev)) {
            return;
        }
        let with_request: rustc_hash::FxHashSet<TraceId> = spans.iter().filter(|s| s.method.is_some()).map(|s| s.trace_id).collect();
        let with_key: rustc_hash::FxHashSet<&str> =
            spans.iter().filter(|s| s.method.is_some()).filter_map(|s| s.operation_key.as_deref()).collect();
        let mut asked = rustc_hash::FxHashSet::default();
        for ev in spans.iter().filter(is_receipt) {
            let mut id = ev.trace_id;
            // A verifier in a trace of its own names its call's operation key: the call's trace
            // is in the store's operation index when another instance holds the call.
            let mut key = None;
            if let Some(k) = ev.operation_key.as_deref() {
                if self.has_operation(k) || with_key.contains(k) {
                    continue;
                }
                let Some(trace) = store.operation(k) else { continue };
                id = trace;
                key = Some(k);
            }
            if with_request.contains(&id) || self.knows(&id) || !asked.insert(id) {
                continue;
            }
            if let Some(kept) = store.decided(id, &|at| self.past_window(at)) {
                self.restore(Restore::Decided(kept));
                if let Some(k) = key {
                    self.restore(Restore::Operation(k.into(), id));
                }
            }
        }
    }
}
