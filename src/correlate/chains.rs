//! Trace-keyed evidence chains: bounded, decided on quiet or at a maximum wait, revised by late
//! spans. The correlator owns all state; it hands out decided chains, never half-built ones.
//!
//! Time is passed in (`now`) rather than read, so every rule here is testable without sleeping.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

use super::assemble::assemble_calls;
use crate::classify::Decision;
use crate::evidence::call::CallEvidence;
use crate::evidence::{SpanEvidence, TraceId};
use crate::normalize::NormalizedBatch;
use crate::verdict::DecidedBy;

/// The correlator's bounds and clocks.
#[derive(Clone, Debug, PartialEq)]
pub struct ChainLimits {
    /// A chain whose root has ended is decided once no span arrived for this long.
    pub decision_wait: Duration,
    /// A chain is decided this long after its first span, root or not.
    pub max_wait: Duration,
    /// Most chains in flight; past it the chain closest to its decision is decided early.
    pub max_chains: usize,
    /// Most evidence bytes held (in flight and decided-but-revisable).
    pub max_bytes: usize,
    /// Most spans of evidence kept per chain; more are counted and dropped.
    pub max_spans_per_chain: usize,
    /// How long a decided chain is kept so a late span can revise it.
    pub late_span_window: Duration,
    /// Most decided chains kept for revision.
    pub max_decided: usize,
}

impl Default for ChainLimits {
    fn default() -> Self {
        ChainLimits {
            decision_wait: Duration::from_secs(2),
            max_wait: Duration::from_secs(30),
            max_chains: 100_000,
            max_bytes: 256 << 20,
            max_spans_per_chain: 1_000,
            late_span_window: Duration::from_secs(300),
            max_decided: 100_000,
        }
    }
}

/// Counters the correlator keeps; the pipeline turns them into metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChainStats {
    pub chains_created: u64,
    pub chains_decided: u64,
    /// Chains decided early because a bound was hit.
    pub chains_evicted: u64,
    /// Evidence spans that arrived after their chain was decided (each causes a revision).
    pub late_spans: u64,
    /// Evidence spans dropped because their chain hit `max_spans_per_chain`.
    pub truncated_spans: u64,
    /// Decided chains forgotten (window passed or bound hit); a later span starts afresh.
    pub decided_expired: u64,
    /// Verifier spans from another trace joined to their call by operation key.
    pub joined_by_operation_key: u64,
}

struct Chain {
    spans: Vec<SpanEvidence>,
    first_seen: Instant,
    last_seen: Instant,
    root_seen: bool,
    truncated: bool,
    bytes: usize,
    revision: u32,
    /// The calls as the previous revision saw them (empty for revision 0), so the emitters can
    /// count what a revision changed instead of counting the call twice.
    previous: Vec<CallEvidence>,
    /// Progress notifications arrived: the call may be a long one in flight.
    has_progress: bool,
    /// Held open past `max_wait` because a call in it is `working` (valid progress, clocks hold).
    held: bool,
}

struct DecidedChain {
    spans: Vec<SpanEvidence>,
    root_seen: bool,
    truncated: bool,
    bytes: usize,
    revision: u32,
}

/// A decided chain, ready for the classifier.
#[derive(Debug)]
pub struct DecidedCalls {
    pub trace_id: TraceId,
    pub calls: Vec<CallEvidence>,
    pub decision: Decision,
    /// For a revision: the calls as the previous decision saw them.
    pub previous: Vec<CallEvidence>,
}

/// The table of chains.
pub struct Chains {
    limits: ChainLimits,
    active: FxHashMap<TraceId, Chain>,
    due: BinaryHeap<Reverse<(Instant, TraceId)>>,
    decided: FxHashMap<TraceId, DecidedChain>,
    decided_order: VecDeque<(Instant, TraceId, u32)>,
    bytes: usize,
    /// Operation keys of calls, so a verifier reporting in another trace joins its call.
    operations: FxHashMap<Box<str>, TraceId>,
    pub stats: ChainStats,
}

impl Chains {
    pub fn new(limits: ChainLimits) -> Self {
        Chains {
            limits,
            active: FxHashMap::default(),
            due: BinaryHeap::new(),
            decided: FxHashMap::default(),
            decided_order: VecDeque::new(),
            bytes: 0,
            operations: FxHashMap::default(),
            stats: ChainStats::default(),
        }
    }

    pub fn in_flight(&self) -> usize {
        self.active.len()
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Take in one normalized batch. Chains decided early to stay within bounds are appended to `out`.
    pub fn ingest(&mut self, batch: NormalizedBatch, now: Instant, out: &mut Vec<DecidedCalls>) {
        // Spans that may start a chain first, so that HTTP-only spans and activity of the same
        // batch find the chain their trace starts in this batch, whatever the order in the export.
        let mut enrich_only = Vec::new();
        for ev in batch.evidence {
            if ev.starts_chain() {
                self.add_span(ev, now, out);
            } else {
                enrich_only.push(ev);
            }
        }
        for ev in enrich_only {
            self.add_span(ev, now, out);
        }
        for a in &batch.activity {
            if let Some(c) = self.active.get_mut(&a.trace_id) {
                c.last_seen = now;
                c.root_seen |= a.is_root;
            }
        }
    }

    fn add_span(&mut self, mut ev: SpanEvidence, now: Instant, out: &mut Vec<DecidedCalls>) {
        if let Some(key) = ev.operation_key.as_deref() {
            if ev.method.is_some() {
                // A call names its operation: remember where it lives.
                if self.operations.len() >= 100_000 {
                    self.operations.clear();
                }
                self.operations.insert(key.into(), ev.trace_id);
            } else if !ev.outcomes.is_empty() {
                // A verifier in another trace that names the operation joins the call's chain
                // (reopening it as a late span when it was decided already).
                if let Some(&t) = self.operations.get(key) {
                    if t != ev.trace_id {
                        ev.trace_id = t;
                        ev.parent_span_id = None;
                        self.stats.joined_by_operation_key += 1;
                    }
                }
            }
        }
        let trace_id = ev.trace_id;
        // A `request_sent` marker has no parent but is not the ended root: the call still runs.
        let is_root = ev.parent_span_id.is_none() && !ev.request_sent_marker;
        if !self.active.contains_key(&trace_id) {
            if let Some(d) = self.decided.remove(&trace_id) {
                // A late span: reopen the chain under its next revision.
                self.stats.late_spans += 1;
                let previous = assemble_calls(&d.spans);
                self.active.insert(trace_id, Chain {
                    previous,
                    spans: d.spans,
                    first_seen: now,
                    last_seen: now,
                    root_seen: d.root_seen,
                    truncated: d.truncated,
                    bytes: d.bytes,
                    revision: d.revision + 1,
                    has_progress: false,
                    held: false,
                });
                self.due.push(Reverse((now + self.limits.decision_wait, trace_id)));
            } else {
                // HTTP-only spans enrich a chain; they never start one.
                if !ev.starts_chain() {
                    return;
                }
                self.make_room(now, out);
                self.stats.chains_created += 1;
                self.active.insert(trace_id, Chain {
                    spans: Vec::with_capacity(4),
                    first_seen: now,
                    last_seen: now,
                    root_seen: false,
                    truncated: false,
                    bytes: 0,
                    revision: 0,
                    previous: Vec::new(),
                    has_progress: false,
                    held: false,
                });
                self.due.push(Reverse((now + self.limits.decision_wait, trace_id)));
            }
        }
        let Some(chain) = self.active.get_mut(&trace_id) else { return };
        chain.last_seen = now;
        chain.root_seen |= is_root;
        chain.has_progress |= ev.progress.is_some();
        if chain.spans.len() >= self.limits.max_spans_per_chain {
            chain.truncated = true;
            self.stats.truncated_spans += 1;
            return;
        }
        let b = ev.approx_bytes();
        chain.bytes += b;
        self.bytes += b;
        chain.spans.push(ev);
        if self.bytes > self.limits.max_bytes {
            self.make_room(now, out);
        }
    }

    /// Keep within `max_chains` and `max_bytes`: forget revisable decided chains first (they are
    /// already reported), then decide the in-flight chains nearest their decision early.
    fn make_room(&mut self, now: Instant, out: &mut Vec<DecidedCalls>) {
        loop {
            // An evicted chain is kept for revision like any decided chain, so its bytes are only
            // released by forgetting it: do that before evicting the next live chain.
            while self.bytes > self.limits.max_bytes && !self.decided.is_empty() {
                self.expire_oldest_decided();
            }
            if !(self.active.len() >= self.limits.max_chains || self.bytes > self.limits.max_bytes) || self.active.is_empty() {
                break;
            }
            let Some(Reverse((_, id))) = self.due.pop() else { break };
            if self.active.contains_key(&id) {
                self.stats.chains_evicted += 1;
                self.decide(id, DecidedBy::Evicted, now, out);
            }
        }
    }

    fn expire_oldest_decided(&mut self) {
        while let Some((_, id, rev)) = self.decided_order.pop_front() {
            if self.decided.get(&id).is_some_and(|d| d.revision == rev) {
                if let Some(d) = self.decided.remove(&id) {
                    self.bytes -= d.bytes;
                    self.stats.decided_expired += 1;
                }
                return;
            }
        }
    }

    /// Decide every chain that is due at `now`.
    pub fn tick(&mut self, now: Instant, out: &mut Vec<DecidedCalls>) {
        while let Some(Reverse((at, id))) = self.due.peek().copied() {
            if at > now {
                break;
            }
            self.due.pop();
            let Some(c) = self.active.get(&id) else { continue };
            let quiet = now.saturating_duration_since(c.last_seen) >= self.limits.decision_wait;
            let expired = now.saturating_duration_since(c.first_seen) >= self.limits.max_wait;
            if c.root_seen && quiet {
                self.decide(id, DecidedBy::Quiet, now, out);
            } else if expired && !c.held {
                self.decide(id, DecidedBy::MaxWait, now, out);
            } else {
                let next = if c.root_seen { c.last_seen + self.limits.decision_wait } else { now + self.limits.decision_wait };
                let next = if c.held { next } else { next.min(c.first_seen + self.limits.max_wait) };
                let next = next.max(now + Duration::from_millis(1));
                self.due.push(Reverse((next, id)));
            }
        }
        // Forget decided chains past the late-span window or over the count bound.
        while let Some(&(at, id, rev)) = self.decided_order.front() {
            if !self.decided.get(&id).is_some_and(|d| d.revision == rev) {
                // A chain reopened by a late span since: its old entry says nothing about the window.
                self.decided_order.pop_front();
                continue;
            }
            if now.saturating_duration_since(at) < self.limits.late_span_window && self.decided.len() <= self.limits.max_decided {
                break;
            }
            self.expire_oldest_decided();
        }
    }

    /// Chains in flight that carry progress notifications: the pipeline checks their clocks.
    pub fn progress_chains(&self) -> Vec<TraceId> {
        self.active.iter().filter(|(_, c)| c.has_progress).map(|(id, _)| *id).collect()
    }

    /// The calls of an in-flight chain as they stand, without deciding it.
    pub fn peek_calls(&self, id: &TraceId) -> Option<Vec<CallEvidence>> {
        self.active.get(id).map(|c| assemble_calls(&c.spans))
    }

    /// Hold a chain open past `max_wait` (a call in it is working), or release it.
    pub fn set_hold(&mut self, id: &TraceId, hold: bool) {
        if let Some(c) = self.active.get_mut(id) {
            c.held = hold;
        }
    }

    /// Decide a chain now (a clock expired).
    pub fn decide_now(&mut self, id: TraceId, by: DecidedBy, now: Instant, out: &mut Vec<DecidedCalls>) {
        self.decide(id, by, now, out);
    }

    /// Decide everything in flight (shutdown).
    pub fn drain(&mut self, by: DecidedBy, now: Instant, out: &mut Vec<DecidedCalls>) {
        let ids: Vec<TraceId> = self.active.keys().copied().collect();
        for id in ids {
            self.decide(id, by, now, out);
        }
        self.due.clear();
    }

    fn decide(&mut self, id: TraceId, by: DecidedBy, now: Instant, out: &mut Vec<DecidedCalls>) {
        let Some(c) = self.active.remove(&id) else { return };
        self.stats.chains_decided += 1;
        let calls = assemble_calls(&c.spans);
        out.push(DecidedCalls {
            trace_id: id,
            calls,
            decision: Decision { revision: c.revision, decided_by: by, root_seen: c.root_seen, truncated: c.truncated },
            previous: c.previous,
        });
        if self.limits.max_decided == 0 || by == DecidedBy::Shutdown {
            self.bytes -= c.bytes;
            return;
        }
        self.decided_order.push_back((now, id, c.revision));
        self.decided.insert(id, DecidedChain { spans: c.spans, root_seen: c.root_seen, truncated: c.truncated, bytes: c.bytes, revision: c.revision });
        while self.decided.len() > self.limits.max_decided {
            self.expire_oldest_decided();
        }
    }
}
