//! Trace-keyed evidence chains: bounded, decided on quiet or at a maximum wait, revised by late
//! spans. The correlator owns all state; it hands out decided chains, never half-built ones.
//!
//! Time is passed in (`now`) rather than read, so every rule here is testable without sleeping.

use crate::evidence::time::Moment;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use rustc_hash::FxHashMap;

use super::assemble::{assemble_calls, assemble_calls_into};
use super::crossjoin::{self, CrossJoin};
use super::due::DueQueue;
use super::outbox::{ChainChange, FromStore, KeptChain, Looks, Outbox, Paced, Published, Restore};
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
    /// Most operation keys remembered (a verifier in another trace finds its call by one).
    pub max_operation_keys: usize,
    /// Most operation keys under which verifiers wait for their call.
    pub max_parked_verifiers: usize,
    /// How much longer than `decision_wait` a server half in a trace of its own (and a refused
    /// HTTP request) waits before it is joined or decided alone: a client half, or a rival of the
    /// one already here, exported later by another process still arrives within it. Covers the
    /// OpenTelemetry SDKs' default batch delay (5 s); a client half later than that is joined
    /// through the late path.
    pub server_half_wait: Duration,
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
            max_operation_keys: 100_000,
            max_parked_verifiers: 10_000,
            server_half_wait: DEFAULT_SERVER_HALF_WAIT,
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
    /// Evidence spans of a trace whose decided chain was already forgotten (past the late-span
    /// window or `max_decided`): they cannot revise its verdict.
    pub late_evidence_dropped: u64,
    /// Verifiers that arrived before the call naming their operation key, parked until it does.
    pub verifiers_parked: u64,
    /// Parked verifiers dropped: a key over its bound, or the call never came within the window.
    pub parked_dropped: u64,
    /// Evidence spans equal to one their chain holds already (an exporter's retry, a journal
    /// replayed after a restart): taken once, so a duplicate never revises a verdict.
    pub duplicate_spans: u64,
    /// HTTP spans on an MCP endpoint that arrived before any MCP span of their trace, parked
    /// until one does (see [`Chains::park_http`]).
    pub http_parked: u64,
    /// Parked HTTP spans whose trace started no chain within `decision_wait` +
    /// `server_half_wait`, or past a trace's bound: let go.
    pub http_parked_dropped: u64,
}

/// Most traces with HTTP spans parked (see [`Chains::park_http`]); past it the oldest trace's
/// spans are let go, counted under the table's evictions.
const MAX_PARKED_HTTP_TRACES: usize = 10_000;
/// Most HTTP spans parked per trace: a call's MCP span ends right after its HTTP spans, so an
/// export cut between them leaves one call's few ahead, not many. With the trace bound, at most
/// 40 000 spans (some 10 MB) wait.
const MAX_PARKED_HTTP_PER_TRACE: usize = 4;

/// Most verifiers parked under one operation key.
const MAX_PARKED_PER_KEY: usize = 16;

/// One chain in flight: the correlator holds one per trace for `decision_wait`, so it is kept
/// small (issue 11: at most 1 KB of RSS per chain in flight, its spans included); what few chains
/// need is in [`ChainExtra`].
struct Chain {
    /// Grown one span at a time while short (see `add_span_inner`): most chains hold a few.
    spans: Vec<SpanEvidence>,
    first_seen: Moment,
    last_seen: Moment,
    root_seen: bool,
    truncated: bool,
    bytes: usize,
    revision: u32,
    /// Progress notifications, or interim rounds (`input_required`, a task), arrived: a call may
    /// be a long one in flight, and the engine watches its clocks.
    has_progress: bool,
    /// Held open past `max_wait` because a call in it is `working` (valid progress, clocks hold).
    held: bool,
    /// Request spans of either side seen: a chain with server requests only may be the server half
    /// of a call whose client half is in another trace (`crossjoin`).
    has_client_req: bool,
    has_server_req: bool,
    /// A server half already waited one extra `decision_wait` for its client half.
    deferred: bool,
    /// The trace's root is a server-side span (an HTTP server span, or an MCP server span with no
    /// parent): the server started a trace of its own, so the client half is elsewhere.
    server_rooted: bool,
    /// A revision's previous calls and the chain's cross-trace join keys: absent for most chains.
    extra: Option<Box<ChainExtra>>,
}

/// What a chain in flight holds only when revised or indexed for the cross-trace join.
#[derive(Default)]
struct ChainExtra {
    /// The calls as the previous revision saw them (empty for revision 0), so the emitters can
    /// count what a revision changed instead of counting the call twice.
    previous: Vec<CallEvidence>,
    /// The keys this chain is indexed under in the cross-trace join (see `crossjoin::half_keys`).
    index_keys: Vec<u64>,
    /// The spans that came from another trace (a half joined into this chain): their requests
    /// are still halves to a rival that fits them (see `crossjoin::client_halves_with`).
    moved: Vec<crate::evidence::SpanId>,
}

impl Chain {
    fn index_keys(&self) -> &[u64] {
        self.extra.as_ref().map_or(&[], |e| &e.index_keys)
    }
    fn moved(&self) -> &[crate::evidence::SpanId] {
        self.extra.as_ref().map_or(&[], |e| &e.moved)
    }
}

struct DecidedChain {
    index_keys: Box<[u64]>,
    /// See `ChainExtra::moved`.
    moved: Box<[crate::evidence::SpanId]>,
    /// Shared with the store's write of this decided chain (see [`KeptChain`]).
    spans: Arc<Vec<SpanEvidence>>,
    root_seen: bool,
    truncated: bool,
    bytes: usize,
    revision: u32,
    decided_at: Moment,
}

impl DecidedChain {
    /// What is kept of a chain decided at `at`.
    fn of(c: Chain, at: Moment) -> DecidedChain {
        let (index_keys, moved) = c.extra.map(|e| (e.index_keys.into_boxed_slice(), e.moved.into_boxed_slice())).unwrap_or_default();
        DecidedChain {
            index_keys,
            moved,
            spans: Arc::new(c.spans),
            root_seen: c.root_seen,
            truncated: c.truncated,
            bytes: c.bytes,
            revision: c.revision,
            decided_at: at,
        }
    }
}

/// Decided chains forgotten under `max_decided` whose trace and operation keys are remembered
/// (with a store, late evidence for one reads it back).
pub(crate) const MAX_SPILLED: usize = 100_000;

/// A server half's extra wait for its client half and its rivals by default (see `crossjoin`):
/// the OpenTelemetry SDKs' default batch export delay (`OTEL_BSP_SCHEDULE_DELAY`, 5 s).
pub(crate) const DEFAULT_SERVER_HALF_WAIT: Duration = Duration::from_secs(5);

/// Whether a chain's spans hold client / server request spans.
fn sides(spans: &[SpanEvidence]) -> (bool, bool) {
    let req = |side| spans.iter().any(|s| s.side == side && s.method.as_ref().is_some_and(|m| !m.is_notification()));
    (req(crate::evidence::Side::Client), req(crate::evidence::Side::Server))
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
    due: DueQueue,
    /// Entries taken from `due`, in `(moment, trace id)` order; those from `due_next` on are
    /// still to be looked at (a step with a budget leaves them to the next, before anything
    /// `due` still holds: they fell due earlier).
    due_now: Vec<(Moment, TraceId)>,
    due_next: usize,
    decided: FxHashMap<TraceId, DecidedChain>,
    decided_order: VecDeque<(Moment, TraceId, u32)>,
    /// The latest step's time: a decided chain older than `late_span_window` before it has been
    /// forgotten here, and one taken from a store is not revised either (see
    /// [`Chains::past_window`]).
    stepped: Moment,
    bytes: usize,
    /// Operation keys of calls, so a verifier reporting in another trace joins its call.
    operations: crate::bounded::BoundedMap<Box<str>, TraceId>,
    /// Verifiers that named an operation key before any call did, waiting for their call (for
    /// `late_span_window`, bounded in keys and per key).
    parked: crate::bounded::BoundedMap<Box<str>, Vec<(Moment, SpanEvidence)>>,
    /// HTTP spans on an MCP endpoint whose trace no chain holds yet, by trace, with the moment
    /// the first of them came (see [`Chains::park_http`]).
    parked_http: crate::bounded::BoundedMap<TraceId, (Moment, Vec<SpanEvidence>)>,
    pub stats: ChainStats,
    /// The cross-trace join of split calls (see `crossjoin`).
    pub cross: CrossJoin,
    /// Traces whose decided chain was forgotten, so evidence arriving for them is counted as
    /// evidence that came too late, not mistaken for a new trace.
    forgotten: crate::bounded::BoundedSet<TraceId>,
    /// Chains decided but not kept for revision (`max_decided: 0`, or decided at shutdown). They
    /// stay in the join index until the end of the step that decided them — the whole drain at
    /// shutdown — so a client half decided first still counts as a rival of one decided later:
    /// "an ambiguous match is no match" must not depend on the order of decisions.
    limbo: FxHashMap<TraceId, DecidedChain>,
    /// Chains that took a request span in this batch: indexed once, at the end of the batch.
    pending_index: Vec<TraceId>,
    /// Spans per trace in the batch being taken in: a new chain is made with room for all of
    /// its spans in the batch at once (growing it one span at a time moved each span twice).
    batch_spans: FxHashMap<TraceId, u32>,
    /// What is kept for the store until the replica takes it (see `outbox`).
    outbox: Outbox,
    /// Decided chains forgotten here under a bound (`max_decided`, `max_bytes`) before their
    /// late-span window passed, still in the store: a late span takes one back from there
    /// (decision time and operation keys, so the window still ends it and its keys go with it).
    spilled: crate::bounded::BoundedMap<TraceId, (Moment, Vec<Box<str>>)>,
    /// With a shared store: what is published for the other instances goes through the outbox
    /// (`take_for_round`); the orphans already known here (kept or published) are remembered in
    /// `known_orphans`, so one pulled back is not taken twice.
    share_orphans: bool,
    /// With a shared store: the servers seen to split traces (only their halves are published;
    /// see `splits`), and whether the chains are being drained (every half is published then).
    splits: super::splits::Splits,
    draining: bool,
    /// With a shared store: the verifiers taken from the store already (each is taken once), and
    /// the server halves already looked for.
    known_verifiers: crate::bounded::BoundedSet<(TraceId, crate::evidence::SpanId)>,
    looked_for: crate::bounded::BoundedSet<TraceId>,
    /// With a shared store: chains whose root never came looked for already in the store's
    /// decided chains (another instance may have decided the call, its client span included, and
    /// stopped; each is looked for once).
    rootless_looked: crate::bounded::BoundedSet<TraceId>,
    /// When each chain deferred as a server half (see `tick_due`: the only chains a timed look
    /// for a client half can find, [`Chains::server_halves_to_look_for`]) may first be looked
    /// for: its wait past its last span, or its server's mark settled. The timed look takes only
    /// the entries due, so a step costs what falls due, not a walk of every deferred half (flat
    /// out on a shared store, tens of thousands wait their `server_half_wait` at once). An entry
    /// due is checked again and pushed later when its chain is not ready yet; one whose chain
    /// left (or is no longer deferred) is dropped when it falls due. Entries: one per deferred
    /// half, and those of chains that left within the wait.
    half_looks: DueQueue,
    /// Entries taken from `half_looks` in one look, kept for their room.
    half_looks_due: Vec<(Moment, TraceId)>,
    known_orphans: crate::bounded::BoundedSet<(TraceId, crate::evidence::SpanId)>,
    /// Emptied call vectors handed back by the engine once a decided chain is classified (see
    /// [`Chains::recycle_calls`]), at most [`MAX_SPARE_CALLS`].
    spare_calls: Vec<Vec<CallEvidence>>,
}

/// Most emptied call vectors kept for the next decisions: a step's worth and more (an engine
/// step decides at most 1024 chains), some 4 MiB at most.
const MAX_SPARE_CALLS: usize = 4096;

/// Due entries whose chains are looked up together before they are decided (see
/// `Chains::warm`): enough lookups for the processor to overlap, few enough that the entries
/// are still in the cache when their turn comes.
const WARM_AHEAD: usize = 32;

/// Chains in flight and decided below which nothing is looked up ahead: a table this small
/// stays in the cache, and the lookups ahead would only be repeated.
const WARM_FROM_CHAINS: usize = 16_384;

/// A chain's spans asked for by [`prefetch_spans`], at most: a chain of a few calls.
const WARM_SPAN_BYTES: usize = 1024;

/// Ask for the cache lines of `spans` (up to [`WARM_SPAN_BYTES`]): a decision reads every span,
/// and a span's fields lie on more than one line.
#[inline(always)]
fn prefetch_spans(spans: &[SpanEvidence]) {
    let p = spans.as_ptr().cast::<u8>();
    for offset in (0..std::mem::size_of_val(spans).min(WARM_SPAN_BYTES)).step_by(64) {
        prefetch(p.wrapping_add(offset));
    }
}

/// Ask the processor to bring `p`'s cache line in, without waiting for it. Nothing is read: a
/// dangling or empty vector's pointer is as good as any.
#[inline(always)]
fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint; it reads nothing and cannot fault, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

impl Chains {
    pub fn new(limits: ChainLimits) -> Self {
        let (max_operation_keys, max_parked_verifiers) = (limits.max_operation_keys, limits.max_parked_verifiers);
        Chains {
            limits,
            active: FxHashMap::default(),
            due: DueQueue::default(),
            due_now: Vec::new(),
            due_next: 0,
            decided: FxHashMap::default(),
            decided_order: VecDeque::new(),
            stepped: Moment::from_nanos(0),
            bytes: 0,
            operations: crate::bounded::BoundedMap::with_capacity("operation_keys", max_operation_keys),
            parked: crate::bounded::BoundedMap::with_capacity("parked_verifiers", max_parked_verifiers),
            parked_http: crate::bounded::BoundedMap::with_capacity("parked_http_spans", MAX_PARKED_HTTP_TRACES),
            stats: ChainStats::default(),
            cross: CrossJoin::default(),
            forgotten: crate::bounded::BoundedSet::with_capacity("forgotten_traces", 100_000),
            limbo: FxHashMap::default(),
            pending_index: Vec::new(),
            batch_spans: FxHashMap::default(),
            spilled: crate::bounded::BoundedMap::with_capacity("spilled_decided", MAX_SPILLED),
            outbox: Outbox::default(),
            share_orphans: false,
            splits: Default::default(),
            draining: false,
            known_verifiers: crate::bounded::BoundedSet::with_capacity("known_verifiers", 100_000),
            looked_for: crate::bounded::BoundedSet::with_capacity("halves_looked_for", 100_000),
            rootless_looked: crate::bounded::BoundedSet::with_capacity("rootless_looked_for", 100_000),
            half_looks: DueQueue::default(),
            half_looks_due: Vec::new(),
            known_orphans: crate::bounded::BoundedSet::with_capacity("known_orphans", crossjoin::MAX_ORPHANS * 4),
            spare_calls: Vec::new(),
        }
    }

    /// A store is attached: from now on the outbox records which decided chains and operation
    /// keys change. With a shared store (`shared`: the time a server's split mark is given to
    /// reach the other instances, see `splits`), the orphans, client halves and parked verifiers
    /// this instance holds are kept for publishing too.
    pub(crate) fn keep_for_store(&mut self, shared: Option<std::time::Duration>) {
        self.outbox.track = true;
        if let Some(settle) = shared {
            self.share_orphans = true;
            self.splits.set_settle(settle);
        }
    }

    /// What a write round publishes, taken at its start: the orphans kept, the client halves of
    /// chains decided and the verifiers parked (at most [`crossjoin::MAX_ORPHANS`] orphans and
    /// halves and `max_parked_verifiers` verifiers are held; past that the oldest go
    /// unpublished), the split marks made here since the last round, and the servers whose
    /// marks to read (those whose client halves were held back here within the late-span window).
    pub(crate) fn take_for_round(&mut self, now: Moment) -> Published {
        let mut p = self.outbox.take_published();
        p.marks = self.splits.take_marks();
        p.ask_marks = self.splits.servers_to_ask(now, self.limits.late_span_window);
        p
    }

    /// What to look for in a shared store before due chains are decided: the server halves about
    /// to be decided alone (see [`Chains::server_halves_to_look_for`]), the chains in flight
    /// whose root never came, gone quiet since the last call, and the paced looks that are due.
    pub(crate) fn take_looks(&mut self, now: Moment, all: bool, paced: Paced) -> Looks {
        Looks {
            server_halves: self.server_halves_to_look_for(now, all),
            rootless: std::mem::take(&mut self.outbox.rootless),
            refusal_seconds: paced.refusals.map(|(recent, max)| self.wanted_refusal_seconds(now, recent, max)).unwrap_or_default(),
            parked_keys: paced.parked.map(|max| self.parked_keys(max)).unwrap_or_default(),
        }
    }

    /// What the store keeps, taken back (see [`Restore`]).
    pub(crate) fn restore(&mut self, kept: Restore) {
        match kept {
            Restore::Decided(c) => self.restore_decided(c),
            Restore::Spilled(id, c) => self.unspill(id, c),
            Restore::Forgotten { trace_id, decided_at_ns, operation_keys } => {
                self.restore_forgotten(trace_id, decided_at_ns, operation_keys)
            }
            Restore::Operation(key, trace) => self.restore_operation(&key, trace),
            // Marked changed: the next write round deletes what no table here holds (see
            // `take_changes`).
            Restore::LetGo(id) => {
                if self.outbox.track {
                    self.outbox.dirty.insert(id);
                }
            }
            Restore::OperationGone(key) => {
                if self.outbox.track {
                    self.outbox.dirty_ops.insert(key);
                }
            }
            Restore::Mark(server) => {
                self.splits.learn(&server, Moment::from_nanos(0));
            }
            Restore::MarksAgain(marks) => self.splits.marks_again(marks),
        }
    }

    /// What another instance published or decided, taken in as if it had come here (see
    /// [`FromStore`]); the chains it revises are appended to `out`.
    pub(crate) fn take_in(&mut self, news: FromStore, now: Moment, out: &mut Vec<DecidedCalls>) {
        match news {
            FromStore::Adopt(c) => self.adopt_decided(c, now, out),
            FromStore::Unpark(key) => self.unpark(&key, now, out),
            FromStore::Split(server) => self.learn_split(&server, now),
            FromStore::Protocol(p) => self.set_cluster_protocol(p, now),
            FromStore::Orphan(ev) => self.take_remote_orphan(ev, now),
            FromStore::Verifier(ev) => self.take_remote_verifier(ev, now, out),
            FromStore::Rival(c) => self.take_rival(c, now, out),
        }
    }

    /// The spans of a rival revision of a chain held here that this chain lacks, taken as late
    /// spans (see [`FromStore::Rival`]). A chain no longer held here (forgotten since) takes
    /// nothing: its window has passed.
    fn take_rival(&mut self, r: KeptChain, now: Moment, out: &mut Vec<DecidedCalls>) {
        if !self.holds_chain(&r.trace_id) {
            return;
        }
        let spans: Vec<SpanEvidence> = r.spans.iter().filter(|s| !self.holds(s)).cloned().collect();
        for ev in spans {
            self.add_span(ev, now, out);
        }
    }

    fn publish_half(&mut self, id: TraceId, h: crossjoin::Half) {
        if self.outbox.halves.len() >= crossjoin::MAX_ORPHANS {
            self.outbox.halves.remove(0);
        }
        self.outbox.halves.push((id, h));
    }

    /// A server seen to split, here or (read from the store) by another instance: the client
    /// halves of it decided here within the late-span window and held back are published now,
    /// and later ones as they are decided.
    fn learn_split(&mut self, server: &super::splits::Server, now: Moment) {
        if self.splits.learn(server, now) {
            self.publish_held(std::slice::from_ref(server), now, self.limits.late_span_window);
        }
    }

    /// The cluster's state protocol (the lowest any instance sharing the store announces): below
    /// [`MARKS_SINCE`](super::splits::MARKS_SINCE) every client half is published, as the
    /// instances that know no split marks do, the held-back ones at once.
    fn set_cluster_protocol(&mut self, protocol: u32, now: Moment) {
        let held = self.splits.every_half(protocol < super::splits::MARKS_SINCE);
        if !held.is_empty() {
            self.publish_held(&held, now, self.limits.late_span_window);
        }
    }

    /// A chain another instance decided (from a shared store) for a trace in flight here without
    /// its root: the two are one call. The decided chain is restored and the spans held here join
    /// it as late spans — a revision of the verdict it had, not a second attempt.
    fn adopt_decided(&mut self, r: KeptChain, now: Moment, out: &mut Vec<DecidedCalls>) {
        let id = r.trace_id;
        if self.decided.contains_key(&id) {
            return;
        }
        let Some(c) = self.active.remove(&id) else { return };
        self.bytes -= c.bytes;
        self.restore_decided(r);
        for ev in c.spans {
            self.add_span(ev, now, out);
        }
    }

    /// Publish the held-back client halves of `servers` (`None` among them: of every server) of
    /// the chains decided within `window` of `now`. Past [`crossjoin::MAX_ORPHANS`] a round, the
    /// oldest go unpublished (the newest are the ones a look is about to come for).
    fn publish_held(&mut self, servers: &[super::splits::Server], now: Moment, window: std::time::Duration) {
        let every = servers.iter().any(Option::is_none);
        let mut found = Vec::new();
        for &(at, id, rev) in self.decided_order.iter().rev() {
            if now.saturating_duration_since(at) > window || found.len() >= crossjoin::MAX_ORPHANS {
                break;
            }
            let Some(d) = self.decided.get(&id).filter(|d| d.revision == rev) else { continue };
            for h in crossjoin::client_halves(&d.spans) {
                if h.server.is_some() && (every || servers.contains(&h.server)) {
                    found.push((id, h));
                }
            }
        }
        found.reverse();
        self.outbox.halves.extend(found);
        let over = self.outbox.halves.len().saturating_sub(crossjoin::MAX_ORPHANS);
        self.outbox.halves.drain(..over);
    }

    /// A verifier another instance parked under an operation key a call here names: taken as
    /// if it had come here (it joins the call, revising it when decided), once.
    fn take_remote_verifier(&mut self, ev: SpanEvidence, now: Moment, out: &mut Vec<DecidedCalls>) {
        if ev.method.is_some() || ev.outcomes.is_empty() || !self.known_verifiers.insert((ev.trace_id, ev.span_id)) {
            return;
        }
        let joins = ev.operation_key.as_deref().and_then(|k| self.operations.get(k)).is_some();
        if joins {
            self.add_span(ev, now, out);
        }
    }

    /// How long past its last span a deferred server half waits before its client half is
    /// looked for in a shared store: half its extra wait.
    fn half_look_wait(&self) -> std::time::Duration {
        self.limits.decision_wait + self.limits.server_half_wait / 2
    }

    /// Chain `id`, last seen at `last_seen`, is deferred as a server half: its look is due a
    /// wait after that (see `half_looks`).
    fn defer_half(&mut self, id: TraceId, last_seen: Moment) {
        self.half_looks.push(last_seen + self.half_look_wait(), id);
    }

    /// For a deferred server half whose server's mark has not settled yet: when it will have.
    fn split_settles_after(&self, c: &Chain, now: Moment) -> Option<Moment> {
        if !self.share_orphans || !c.deferred {
            return None;
        }
        let h = crossjoin::server_half(&c.spans)?;
        self.splits.settled_at(&h.server).filter(|at| *at > now)
    }

    /// Server halves in flight about to be decided alone (they have waited for their client
    /// half past half the extra wait, or `all` of them at the drain), each returned once: a
    /// shared store may list their client half, decided on another instance.
    fn server_halves_to_look_for(&mut self, now: Moment, all: bool) -> Vec<(TraceId, crossjoin::Half)> {
        let wait = self.half_look_wait();
        let mut out = Vec::new();
        if all {
            for (id, c) in &self.active {
                if !c.has_server_req || c.has_client_req || self.looked_for.contains(id) {
                    continue;
                }
                if let Some(h) = crossjoin::server_half(&c.spans) {
                    out.push((*id, h));
                }
            }
        } else {
            // Outside the drain only deferred chains qualify, each once its look falls due.
            let mut due = std::mem::take(&mut self.half_looks_due);
            due.clear();
            self.half_looks.due(now, &mut due);
            for &(_, id) in &due {
                let Some(c) = self.active.get(&id).filter(|c| c.deferred) else { continue };
                if self.looked_for.contains(&id) {
                    continue;
                }
                if !c.has_server_req || c.has_client_req {
                    // Not a lone server half now: checked again a wait later.
                    self.half_looks.push(now + wait, id);
                    continue;
                }
                let waited_from = c.last_seen + wait;
                if waited_from > now {
                    self.half_looks.push(waited_from, id);
                    continue;
                }
                if let Some(at) = self.split_settles_after(c, now) {
                    self.half_looks.push(at, id);
                    continue;
                }
                if let Some(h) = crossjoin::server_half(&c.spans) {
                    out.push((id, h));
                }
            }
            if due.capacity() <= MAX_BATCH_TRACES_KEPT {
                self.half_looks_due = due;
            }
        }
        out.sort_by_key(|a| a.0);
        for (id, _) in &out {
            self.looked_for.insert(*id);
        }
        out
    }

    /// The seconds a shared store's refusals should be read for (see `CrossJoin::wanted_seconds`).
    fn wanted_refusal_seconds(&self, now: Moment, recent: std::time::Duration, max: usize) -> Vec<u64> {
        let active = &self.active;
        self.cross.wanted_seconds(now, recent, |t| active.contains_key(t), max)
    }

    /// A refused-looking HTTP span another instance published: taken as if it had come here
    /// (joined to a refused client request in flight or lately decided, or kept as an orphan),
    /// once.
    fn take_remote_orphan(&mut self, ev: SpanEvidence, now: Moment) {
        if !crossjoin::is_orphan_candidate(&ev) || self.active.contains_key(&ev.trace_id) || self.decided.contains_key(&ev.trace_id) {
            return;
        }
        if !self.known_orphans.insert((ev.trace_id, ev.span_id)) {
            return;
        }
        self.take_orphan(ev, now, false);
    }

    /// An HTTP span that may be a refused MCP request, alone in its trace: kept until its client
    /// request takes it, or until its wait is over and it is matched against the requests
    /// decided before it came (`settle_orphans`); on a shared store, published when it came here.
    fn take_orphan(&mut self, ev: SpanEvidence, now: Moment, local: bool) {
        if local && self.share_orphans {
            self.known_orphans.insert((ev.trace_id, ev.span_id));
            if self.outbox.orphans.len() >= crossjoin::MAX_ORPHANS {
                self.outbox.orphans.remove(0);
            }
            self.outbox.orphans.push(ev.clone());
        }
        self.cross.push_orphan(now, ev, self.limits.late_span_window)
    }

    /// The orphans whose wait is over (every one, with `all`) are matched once against the client
    /// requests decided before they came: one that exactly one decided request fits revises that
    /// chain; one that several fit is contested, and the chains it fits are revised to say so.
    fn settle_orphans(&mut self, now: Moment, all: bool, out: &mut Vec<DecidedCalls>) {
        let wait = self.limits.decision_wait + self.limits.server_half_wait;
        let due: Vec<usize> = (0..self.cross.orphans.len())
            .filter(|i| {
                let o = &self.cross.orphans[*i];
                !o.settled && (all || o.at + wait <= now)
            })
            .collect();
        let mut taken = Vec::new();
        for i in due {
            self.cross.orphans[i].settled = true;
            let span = self.cross.orphans[i].span.clone();
            let active = &self.active;
            match self.cross.late_http(&span, |t| active.contains_key(t)) {
                crossjoin::LateHttp::One(t, parent) if self.decided.contains_key(&t) || self.limbo.contains_key(&t) => {
                    taken.push((i, crossjoin::rehome(span, t, parent)));
                }
                crossjoin::LateHttp::Ambiguous(traces) => {
                    self.cross.orphans[i].contested = true;
                    for t in traces {
                        self.reopen(t, now);
                    }
                }
                _ => {}
            }
        }
        for (i, _) in taken.iter().rev() {
            self.cross.orphans.remove(*i);
        }
        for (_, ev) in taken {
            self.add_span(ev, now, out);
        }
    }

    fn mark(&mut self, id: TraceId, spans: &[SpanEvidence]) {
        if self.outbox.track {
            self.outbox.dirty.insert(id);
            for s in spans {
                if let (Some(k), Some(_)) = (s.operation_key.as_deref(), &s.method) {
                    self.outbox.dirty_ops.insert(k.into());
                }
            }
        }
    }

    /// The decided chains and operation keys changed since the last call, in the order to write
    /// them: a decided chain kept for revision is put, one forgotten is deleted; an operation key
    /// is kept while the chain of its call is (so a verifier after a restart still finds it).
    pub(crate) fn take_changes(&mut self) -> Vec<ChainChange> {
        let shutdown = std::mem::take(&mut self.outbox.shutdown_decided);
        let mut out = Vec::with_capacity(shutdown.len() + self.outbox.dirty.len() + self.outbox.dirty_ops.len());
        for r in shutdown {
            self.outbox.dirty.remove(&r.trace_id);
            for s in r.spans.iter() {
                if let (Some(k), Some(_)) = (s.operation_key.as_deref(), &s.method) {
                    if self.operations.get(k) == Some(&r.trace_id) {
                        self.outbox.dirty_ops.remove(k);
                        out.push(ChainChange::Operation(k.into(), r.trace_id));
                    }
                }
            }
            out.push(ChainChange::Decided(r));
        }
        // The sets are given back emptied, their room kept up to a bound (they fill again each
        // round).
        let mut dirty = std::mem::take(&mut self.outbox.dirty);
        for id in dirty.drain() {
            match self.decided.get(&id) {
                Some(d) => out.push(ChainChange::Decided(KeptChain {
                    trace_id: id,
                    spans: Arc::clone(&d.spans),
                    root_seen: d.root_seen,
                    truncated: d.truncated,
                    revision: d.revision,
                    decided_at_ns: d.decided_at.as_nanos(),
                })),
                // Reopened by a late span: the stored revision stays until the new one is decided.
                // Spilled under a bound: it stays in the store until its window passes.
                None if self.active.contains_key(&id) || self.spilled.contains(&id) => {}
                None => out.push(ChainChange::Forgotten(id)),
            }
        }
        let mut dirty_ops = std::mem::take(&mut self.outbox.dirty_ops);
        for k in dirty_ops.drain() {
            match self.operations.get(&k) {
                Some(t) if self.decided.contains_key(t) || self.active.contains_key(t) || self.spilled.contains(t) => {
                    let t = *t;
                    out.push(ChainChange::Operation(k, t))
                }
                _ => out.push(ChainChange::OperationGone(k)),
            }
        }
        if dirty.capacity() <= MAX_BATCH_TRACES_KEPT {
            self.outbox.dirty = dirty;
        }
        if dirty_ops.capacity() <= MAX_BATCH_TRACES_KEPT {
            self.outbox.dirty_ops = dirty_ops;
        }
        out
    }

    /// Whether a chain decided at `decided_at_ns` is past its late-span window at the latest
    /// step: forgotten here, and not to be revised when a store still holds it (a shared store
    /// lets its writer's chains expire a margin after the window rather than delete them, and
    /// another instance's may lag): evidence for it is late, as in one process.
    pub(crate) fn past_window(&self, decided_at_ns: u64) -> bool {
        self.stepped.saturating_duration_since(Moment::from_nanos(decided_at_ns)) >= self.limits.late_span_window
    }

    /// Take back a decided chain from the store (at start-up, oldest first). It is kept for
    /// revision until `late_span_window` after its decision, like any decided chain; one already
    /// past it is not taken.
    fn restore_decided(&mut self, r: KeptChain) {
        if self.active.contains_key(&r.trace_id) || self.decided.contains_key(&r.trace_id) || self.past_window(r.decided_at_ns) {
            return;
        }
        let bytes: usize = r.spans.iter().map(|s| s.approx_bytes()).sum();
        let index_keys = crossjoin::half_keys(&r.spans);
        self.cross.insert_keys(r.trace_id, &index_keys);
        let at = Moment::from_nanos(r.decided_at_ns);
        // Its refused-looking requests wait for a late HTTP span here as they did where it was
        // decided (an instance restarted, or the chain was taken from a shared store).
        self.cross.remember_refused(at, crossjoin::refused_requests(&r.spans), self.limits.late_span_window);
        self.bytes += bytes;
        self.decided_order.push_back((at, r.trace_id, r.revision));
        self.decided.insert(
            r.trace_id,
            DecidedChain {
                index_keys: index_keys.into_boxed_slice(),
                moved: Box::default(),
                spans: r.spans,
                root_seen: r.root_seen,
                truncated: r.truncated,
                bytes,
                revision: r.revision,
                decided_at: at,
            },
        );
        while self.decided.len() > self.limits.max_decided {
            self.expire_oldest_decided(false);
        }
    }

    /// A decided chain the store holds that a start-up load did not read whole (past
    /// `max_decided`): remembered as one forgotten here under that bound would be.
    fn restore_forgotten(&mut self, id: TraceId, decided_at_ns: u64, keys: Vec<Box<str>>) {
        if self.active.contains_key(&id) || self.decided.contains_key(&id) {
            return;
        }
        if self.outbox.track {
            self.spilled.insert(id, (Moment::from_nanos(decided_at_ns), keys));
        }
        self.forgotten.insert(id);
    }

    /// Decided chains kept whole for revision.
    pub fn decided_len(&self) -> usize {
        self.decided.len()
    }

    /// How many decided chains this table keeps whole (`max_decided`) and how many more it
    /// remembers as forgotten under that bound: all a start-up load needs of a store's.
    pub(crate) fn decided_bounds(&self) -> (usize, usize) {
        (self.limits.max_decided, MAX_SPILLED)
    }

    /// The decided chain a span would revise, when it is one forgotten here under a bound but
    /// still in the store (its own trace, or its call's by operation key for a verifier).
    pub(super) fn spilled_target(&self, ev: &SpanEvidence) -> Option<TraceId> {
        if self.spilled.is_empty() {
            return None;
        }
        let own = ev.trace_id;
        let target = match ev.operation_key.as_deref() {
            Some(k) if ev.method.is_none() && !ev.outcomes.is_empty() => self.operations.get(k).copied().unwrap_or(own),
            _ => own,
        };
        (self.spilled.contains(&target) && !self.active.contains_key(&target) && !self.decided.contains_key(&target)).then_some(target)
    }

    /// A spilled chain came back from the store (`Some`), or the store no longer has it.
    fn unspill(&mut self, id: TraceId, record: Option<KeptChain>) {
        self.spilled.remove(&id);
        if let Some(r) = record {
            self.restore_decided(r);
        }
    }

    /// Whether this table knows the trace at all: in flight, decided (kept, in limbo or spilled
    /// to the store) or forgotten. Evidence for a trace it does not know may belong to a chain
    /// another instance decided (see `takeback`).
    pub fn knows(&self, id: &TraceId) -> bool {
        self.active.contains_key(id)
            || self.decided.contains_key(id)
            || self.limbo.contains_key(id)
            || self.spilled.contains(id)
            || self.forgotten.contains(id)
    }

    /// Whether a call naming this operation key is known here.
    pub(super) fn has_operation(&self, key: &str) -> bool {
        self.operations.get(key).is_some()
    }

    /// Operation keys verifiers are parked under here, at most `max` (sorted).
    fn parked_keys(&self, max: usize) -> Vec<Box<str>> {
        let mut keys: Vec<Box<str>> = self.parked.iter().map(|(k, _)| k.clone()).collect();
        keys.sort();
        keys.truncate(max);
        keys
    }

    /// A call naming `key` is known now (taken from a shared store): the verifiers parked under
    /// it join it.
    fn unpark(&mut self, key: &str, now: Moment, out: &mut Vec<DecidedCalls>) {
        if self.operations.get(key).is_none() {
            return;
        }
        if let Some(waiting) = self.parked.remove(key) {
            for (_, v) in waiting {
                self.add_span(v, now, out);
            }
        }
    }

    /// Take back an operation key from the store.
    fn restore_operation(&mut self, key: &str, trace: TraceId) {
        self.operations.insert(key.into(), trace);
    }

    pub fn in_flight(&self) -> usize {
        self.active.len()
    }

    /// The room the limbo table keeps between steps (see [`Chains::release_limbo`]).
    #[cfg(test)]
    pub(super) fn limbo_room(&self) -> (usize, usize) {
        (self.limbo.len(), self.limbo.capacity())
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Take in one normalized batch. Chains decided early to stay within bounds are appended to `out`.
    pub fn ingest(&mut self, batch: NormalizedBatch, now: Moment, out: &mut Vec<DecidedCalls>) {
        // Spans that may start a chain first, so that HTTP-only spans and activity of the same
        // batch find the chain their trace starts in this batch, whatever the order in the export.
        let mut enrich_only = Vec::new();
        self.batch_spans.clear();
        if batch.evidence.len() > 1 {
            for ev in &batch.evidence {
                *self.batch_spans.entry(ev.trace_id).or_insert(0) += 1;
            }
            // The batch's chains looked up together first, once each, as due chains are (see
            // `warm`): in flight, or else decided (a new trace's first span looks in both).
            if self.is_large() {
                for id in self.batch_spans.keys() {
                    match self.active.get(id) {
                        Some(c) => prefetch_spans(&c.spans),
                        None => prefetch(self.decided.get(id).map_or(std::ptr::null(), std::ptr::from_ref)),
                    }
                }
            }
        }
        for ev in batch.evidence {
            if ev.starts_chain() {
                self.add_span(ev, now, out);
            } else {
                enrich_only.push(ev);
            }
        }
        for ev in enrich_only {
            // Most of a shared pipeline's spans that reach here are HTTP spans of traces that hold
            // no call: let them go after one look at each table, not the several an added span
            // takes (the chain's duplicates, a reopen).
            if self.holds_chain(&ev.trace_id) {
                self.add_span(ev, now, out);
            } else {
                self.let_go(ev, now);
            }
        }
        // Scratch for the next batch; its room stays bounded by the largest batch's trace count.
        if self.batch_spans.capacity() > 4 * MAX_BATCH_TRACES_KEPT {
            self.batch_spans = FxHashMap::default();
        }
        for a in &batch.activity {
            if let Some(c) = self.active.get_mut(&a.trace_id) {
                c.last_seen = now;
                c.root_seen |= a.is_root;
            }
        }
        self.index_pending();
        self.release_limbo();
    }

    /// Index, once per batch, the chains that took request spans in it: under the keys of their
    /// spans that may be one half of a split call (none, for a chain holding both halves).
    fn index_pending(&mut self) {
        let mut pending = std::mem::take(&mut self.pending_index);
        pending.sort_unstable();
        pending.dedup();
        for id in pending.drain(..) {
            let Some(c) = self.active.get_mut(&id) else { continue };
            let keys = crossjoin::half_keys(&c.spans);
            let new: Vec<u64> = keys.into_iter().filter(|k| !c.index_keys().contains(k)).collect();
            if new.is_empty() {
                continue;
            }
            self.cross.insert_keys(id, &new);
            c.extra.get_or_insert_with(Default::default).index_keys.extend(new);
        }
        self.pending_index = pending;
    }

    /// Forget the chains decided in this step that are not kept for revision (see `limbo`).
    fn release_limbo(&mut self) {
        // Drained, not replaced: the table keeps its room for the next step, where a new one
        // would grow from nothing every step, rehashing into freshly faulted pages. Its room is
        // bounded by the largest step, and given back past MAX_LIMBO_KEPT.
        for (id, d) in self.limbo.drain() {
            self.bytes -= d.bytes;
            self.cross.remove_keys(id, &d.index_keys);
        }
        if self.limbo.capacity() > MAX_LIMBO_KEPT {
            self.limbo = FxHashMap::default();
        }
    }

    fn add_span(&mut self, mut ev: SpanEvidence, now: Moment, out: &mut Vec<DecidedCalls>) {
        let mut unparked = Vec::new();
        if let Some(key) = ev.operation_key.as_deref() {
            if ev.method.is_some() {
                // A call names its operation: remember where it lives, and take in the verifiers
                // that reported before it.
                self.operations.insert(key.into(), ev.trace_id);
                if let Some(waiting) = self.parked.remove(key) {
                    unparked = waiting;
                }
            } else if !ev.outcomes.is_empty() {
                // A verifier in another trace that names the operation joins the call's chain
                // (reopening it as a late span when it was decided already).
                match self.operations.get(key) {
                    Some(&t) if t != ev.trace_id => {
                        ev.trace_id = t;
                        ev.parent_span_id = None;
                        self.stats.joined_by_operation_key += 1;
                    }
                    Some(_) => {}
                    None if !self.active.contains_key(&ev.trace_id) && !self.decided.contains_key(&ev.trace_id) => {
                        // Its call has not arrived yet: park it (bounded, counted) instead of
                        // judging a verifier alone.
                        self.stats.verifiers_parked += 1;
                        let key: Box<str> = key.into();
                        if self.share_orphans {
                            self.known_verifiers.insert((ev.trace_id, ev.span_id));
                            if self.outbox.parked.len() >= self.limits.max_parked_verifiers.max(1) {
                                self.outbox.parked.remove(0);
                            }
                            self.outbox.parked.push((key.clone(), ev.clone()));
                        }
                        match self.parked.get_or_insert_with(key, Vec::new) {
                            Some(v) if v.len() < MAX_PARKED_PER_KEY => v.push((now, ev)),
                            _ => self.stats.parked_dropped += 1,
                        }
                        return;
                    }
                    None => {}
                }
            }
        }
        let trace_id = ev.trace_id;
        self.add_span_inner(ev, now, out);
        for (_, v) in unparked {
            self.add_span(v, now, out);
        }
        if !self.parked_http.is_empty() && self.active.contains_key(&trace_id) {
            if let Some((_, waiting)) = self.parked_http.remove(&trace_id) {
                if waiting.iter().any(crossjoin::is_orphan_candidate) {
                    self.cross.forget_orphans_of(trace_id);
                }
                for h in waiting {
                    self.add_span_inner(h, now, out);
                }
            }
        }
    }

    /// An HTTP span on an MCP endpoint (the client's POST to `/mcp`, the server's handling of
    /// it) that came before any MCP span of its trace waits for one, bounded and counted: a child
    /// span ends first and often leaves in an earlier export than its MCP parent, and a 401 or a
    /// 500 it carries must not be lost to that order (the call would read greener than the same
    /// spans in one export). It waits `decision_wait` + `server_half_wait`, the SDKs' export
    /// delay; a chain started for its trace takes it in. Other HTTP spans are let go at once:
    /// most traffic is ordinary HTTP, and nothing ties it to a call before a call arrives.
    fn park_http(&mut self, ev: SpanEvidence, now: Moment) {
        self.stats.http_parked += 1;
        match self.parked_http.get_or_insert_with(ev.trace_id, || (now, Vec::new())) {
            Some((_, v)) if v.len() < MAX_PARKED_HTTP_PER_TRACE => v.push(ev),
            _ => self.stats.http_parked_dropped += 1,
        }
    }

    /// Whether a chain of `trace` is in flight, decided and kept for revision, or decided in this
    /// step.
    fn holds_chain(&self, trace: &TraceId) -> bool {
        self.active.contains_key(trace) || self.limbo.contains_key(trace) || self.decided.contains_key(trace)
    }

    /// A span that cannot start a chain, of a trace no chain holds: counted when its chain was
    /// forgotten; a refused MCP request's HTTP span, alone in its trace, may belong to a client
    /// request in another trace. HTTP-only spans enrich a chain; they never start one.
    fn let_go(&mut self, ev: SpanEvidence, now: Moment) {
        if self.forgotten.contains(&ev.trace_id) {
            self.stats.late_evidence_dropped += 1;
        }
        if crossjoin::is_orphan_candidate(&ev) {
            // A server's refusal may answer a client request in another trace (`crossjoin`), or
            // its own trace's MCP spans may come yet: whichever comes first takes it (see
            // `add_span`; both wait the same time).
            self.park_http(ev.clone(), now);
            self.take_orphan(ev, now, true);
        } else if ev.http_mcp_endpoint && ev.http_status.is_some() && ev.method.is_none() {
            self.park_http(ev, now);
        }
    }

    fn add_span_inner(&mut self, ev: SpanEvidence, now: Moment, out: &mut Vec<DecidedCalls>) {
        let trace_id = ev.trace_id;
        if self.holds(&ev) {
            self.stats.duplicate_spans += 1;
            return;
        }
        // A `request_sent` marker has no parent but is not the ended root: the call still runs.
        let is_root = ev.parent_span_id.is_none() && !ev.request_sent_marker;
        if !self.active.contains_key(&trace_id) && !self.reopen(trace_id, now) {
            if !ev.starts_chain() {
                self.let_go(ev, now);
                return;
            }
            if self.forgotten.contains(&trace_id) {
                self.stats.late_evidence_dropped += 1;
            }
            self.make_room(now, out);
            self.stats.chains_created += 1;
            self.active.insert(
                trace_id,
                Chain {
                    spans: Vec::with_capacity(
                        self.batch_spans.get(&trace_id).map_or(1, |n| *n as usize).min(self.limits.max_spans_per_chain),
                    ),
                    first_seen: now,
                    last_seen: now,
                    root_seen: false,
                    truncated: false,
                    bytes: 0,
                    revision: 0,
                    has_progress: false,
                    held: false,
                    has_client_req: false,
                    has_server_req: false,
                    deferred: false,
                    server_rooted: false,
                    extra: None,
                },
            );
            self.due.push(now + self.limits.decision_wait, trace_id);
        }
        let Some(chain) = self.active.get_mut(&trace_id) else { return };
        chain.last_seen = now;
        chain.root_seen |= is_root;
        chain.server_rooted |= is_root && ev.side == crate::evidence::Side::Server;
        chain.has_progress |= ev.progress.is_some() || ev.round.is_some();
        if chain.spans.len() >= self.limits.max_spans_per_chain {
            chain.truncated = true;
            self.stats.truncated_spans += 1;
            return;
        }
        if ev.method.as_ref().is_some_and(|m| !m.is_notification()) {
            match ev.side {
                crate::evidence::Side::Client => chain.has_client_req = true,
                crate::evidence::Side::Server => chain.has_server_req = true,
                crate::evidence::Side::Internal => {}
            }
        }
        self.cross.note_request(trace_id, &ev);
        if ev.method.as_ref().is_some_and(|m| !m.is_notification()) && ev.request_id.is_some() {
            self.pending_index.push(trace_id);
        }
        let b = ev.approx_bytes();
        chain.bytes += b;
        self.bytes += b;
        if chain.spans.len() == chain.spans.capacity() {
            // Exactly one more slot while the chain is short (a call is a few spans, each some
            // 200 bytes: doubling would hold up to twice that per chain), amortized past it.
            let len = chain.spans.len();
            chain.spans.reserve_exact(if len < 8 { 1 } else { len / 2 });
        }
        chain.spans.push(ev);
        if self.bytes > self.limits.max_bytes {
            self.make_room(now, out);
        }
    }

    /// A decided chain's calls, classified: their vector is kept for a next decision. Under
    /// steady load chains are decided and dropped by the thousand a second; a vector made anew
    /// for each came from pages the allocator had just returned near the memory limit, a page
    /// fault each (a third of the faults on the MCP-only line). Only a one- or two-call vector is
    /// kept, so the spares stay small whatever a rare wide chain held.
    pub(crate) fn recycle_calls(&mut self, mut calls: Vec<CallEvidence>) {
        if self.spare_calls.len() < MAX_SPARE_CALLS && calls.capacity() <= 2 {
            calls.clear();
            self.spare_calls.push(calls);
        }
    }

    /// Reopen a decided chain under its next revision (a late span, or a joined half).
    fn reopen(&mut self, trace_id: TraceId, now: Moment) -> bool {
        let Some(d) = self.decided.remove(&trace_id).or_else(|| self.limbo.remove(&trace_id)) else { return false };
        self.stats.late_spans += 1;
        let previous = assemble_calls(&d.spans);
        let (has_client_req, has_server_req) = sides(&d.spans);
        self.active.insert(
            trace_id,
            Chain {
                extra: Some(Box::new(ChainExtra { previous, index_keys: d.index_keys.into_vec(), moved: d.moved.into_vec() })),
                spans: Arc::try_unwrap(d.spans).unwrap_or_else(|shared| (*shared).clone()),
                first_seen: now,
                last_seen: now,
                root_seen: d.root_seen,
                truncated: d.truncated,
                bytes: d.bytes,
                revision: d.revision + 1,
                has_progress: false,
                held: false,
                has_client_req,
                has_server_req,
                deferred: true,
                server_rooted: false,
            },
        );
        self.defer_half(trace_id, now);
        self.due.push(now + self.limits.decision_wait, trace_id);
        true
    }

    /// The earliest engine time whose evidence only this table holds (it is in no store yet): the
    /// first span of the oldest chain in flight, of the oldest parked verifier or HTTP span, of
    /// the oldest orphan not matched yet. What came before it is decided (and written with the next
    /// store round) or was let go; the evidence journal keeps what came since.
    pub fn oldest_needed(&self) -> Option<Moment> {
        let active = self.active.values().map(|c| c.first_seen).min();
        let parked = self.parked.iter().flat_map(|(_, v)| v.iter().map(|(t, _)| *t)).min();
        let http = self.parked_http.iter().map(|(_, (t, _))| *t).min();
        let orphans = self.cross.orphans.iter().filter(|o| !o.settled).map(|o| o.at).min();
        [active, parked, http, orphans].into_iter().flatten().min()
    }

    /// Take out of a batch the spans equal to one their chain holds (counted), before anything
    /// else sees them: the catalog sessions as well as the chains, so that a journal replayed
    /// after a restart changes nothing the store already had.
    pub fn drop_duplicates(&mut self, evidence: &mut Vec<SpanEvidence>) {
        let before = evidence.len();
        evidence.retain(|ev| !self.holds(ev));
        self.stats.duplicate_spans += (before - evidence.len()) as u64;
    }

    /// Whether the chain of `ev`'s trace (in flight or decided) holds a span equal to it.
    fn holds(&self, ev: &SpanEvidence) -> bool {
        let spans: &[SpanEvidence] = match self.active.get(&ev.trace_id) {
            Some(c) => &c.spans,
            None => match self.decided.get(&ev.trace_id).or_else(|| self.limbo.get(&ev.trace_id)) {
                Some(d) => &d.spans,
                None => return false,
            },
        };
        spans.iter().any(|s| s.span_id == ev.span_id && s == ev)
    }

    /// Keep within `max_chains` and `max_bytes`: forget revisable decided chains first (they are
    /// already reported), then decide the in-flight chains nearest their decision early.
    fn make_room(&mut self, now: Moment, out: &mut Vec<DecidedCalls>) {
        loop {
            // An evicted chain is kept for revision like any decided chain, so its bytes are only
            // released by forgetting it: do that before evicting the next live chain.
            while self.bytes > self.limits.max_bytes && !self.decided.is_empty() {
                self.expire_oldest_decided(false);
            }
            if !(self.active.len() >= self.limits.max_chains || self.bytes > self.limits.max_bytes) || self.active.is_empty() {
                break;
            }
            let Some((_, id)) = self.pop_due() else { break };
            if self.active.contains_key(&id) {
                self.stats.chains_evicted += 1;
                self.decide(id, DecidedBy::Evicted, now, out);
            }
        }
    }

    /// Forget the oldest decided chain: its window passed (`by_window`), or a bound needs room.
    /// With a store, one forgotten under a bound stays in the store until its window passes.
    fn expire_oldest_decided(&mut self, by_window: bool) {
        while let Some((_, id, rev)) = self.decided_order.pop_front() {
            if self.decided.get(&id).is_some_and(|d| d.revision == rev) {
                if let Some(d) = self.decided.remove(&id) {
                    if self.outbox.track && !by_window {
                        self.spilled.insert(id, (d.decided_at, crate::evidence::operation_keys(&d.spans)));
                    } else {
                        self.mark(id, &d.spans);
                    }
                    self.bytes -= d.bytes;
                    self.stats.decided_expired += 1;
                    self.cross.remove_keys(id, &d.index_keys);
                    self.forgotten.insert(id);
                }
                return;
            }
        }
    }

    /// The earliest entry due: one a budgeted step left, else the queue's.
    fn pop_due(&mut self) -> Option<(Moment, TraceId)> {
        match self.due_now.get(self.due_next) {
            Some(&e) => {
                self.due_next += 1;
                Some(e)
            }
            None => self.due.pop(),
        }
    }

    /// When the next chain falls due (its decision may then move it later): the driver sleeps
    /// until then instead of checking on a fixed tick, so a verdict comes at `decision_wait`, not
    /// up to a tick after it. Entries a budgeted step left are due already.
    pub fn next_due(&self) -> Option<Moment> {
        self.due_now.get(self.due_next).map(|(at, _)| *at).or_else(|| self.due.peek().map(|(at, _)| at))
    }

    /// Decide every chain that is due at `now`.
    pub fn tick(&mut self, now: Moment, out: &mut Vec<DecidedCalls>) {
        self.tick_within(now, usize::MAX, out);
    }

    /// [`tick`](Self::tick), deciding at most about `budget` calls: the chains still due then
    /// wait for the next step (which takes them first, in the same order). What one step decides
    /// is held at once — the decided calls, their verdicts, what the sinks make of them — so a
    /// driver under a memory limit decides a burst in bounded steps. The step that passes the
    /// budget finishes its chain: at most one chain over it.
    pub fn tick_within(&mut self, now: Moment, budget: usize, out: &mut Vec<DecidedCalls>) {
        self.stepped = self.stepped.max(now);
        // Everything due now, in (moment, trace id) order. What a decision pushes falls due later,
        // except with a zero `decision_wait`: then go round again.
        self.settle_orphans(now, false, out);
        let mut spent = 0usize;
        loop {
            if self.due_next >= self.due_now.len() {
                if self.due.peek().is_none_or(|(at, _)| at > now) {
                    break;
                }
                self.due_now.clear();
                self.due_next = 0;
                self.due.due(now, &mut self.due_now);
            }
            while spent < budget {
                let Some(&e) = self.due_now.get(self.due_next) else { break };
                if self.due_next.is_multiple_of(WARM_AHEAD) && self.is_large() {
                    let ahead = self.due_now.len().min(self.due_next + WARM_AHEAD);
                    self.warm(self.due_next..ahead);
                }
                self.due_next += 1;
                let before = out.len();
                self.tick_due(&[e], now, out);
                spent += out[before..].iter().map(|d| (d.calls.len() + d.previous.len()).max(1)).sum::<usize>();
            }
            if spent >= budget {
                break;
            }
        }
        // Forget decided chains past the late-span window or over the count bound.
        while let Some(&(at, id, rev)) = self.decided_order.front() {
            if self.decided.get(&id).is_none_or(|d| d.revision != rev) {
                // A chain reopened by a late span since: its old entry says nothing about the window.
                self.decided_order.pop_front();
                continue;
            }
            let past = now.saturating_duration_since(at) >= self.limits.late_span_window;
            if !past && self.decided.len() <= self.limits.max_decided {
                break;
            }
            self.expire_oldest_decided(past);
        }
        if !self.spilled.is_empty() {
            // Spilled chains past their window leave the store too. They are spilled in the order
            // decided (the oldest decided chain is the one a bound forgets), so the oldest is the
            // first due: a walk of every spilled chain at every step was the engine's largest
            // cost once a bound spilled (100 000 of them at the default).
            let window = self.limits.late_span_window;
            let gone = self.spilled.take_oldest_while(|_, (at, _)| now.saturating_duration_since(*at) >= window);
            for (id, (_, keys)) in gone {
                self.outbox.dirty.insert(id);
                self.outbox.dirty_ops.extend(keys);
            }
        }
        if !self.parked.is_empty() {
            let window = self.limits.late_span_window;
            let mut dropped = 0;
            self.parked.retain(|_, v| {
                let before = v.len();
                v.retain(|(at, _)| now.saturating_duration_since(*at) < window);
                dropped += (before - v.len()) as u64;
                !v.is_empty()
            });
            self.stats.parked_dropped += dropped;
        }
        if !self.parked_http.is_empty() {
            let wait = self.limits.decision_wait + self.limits.server_half_wait;
            for (_, (_, spans)) in self.parked_http.take_oldest_while(|_, (at, _)| now.saturating_duration_since(*at) >= wait) {
                self.stats.http_parked_dropped += spans.len() as u64;
            }
        }
        self.release_limbo();
    }

    /// Whether the chains in flight and decided are too many for the cache (see `warm`).
    fn is_large(&self) -> bool {
        self.active.len() + self.decided.len() >= WARM_FROM_CHAINS
    }

    /// Look up the chains of the due entries `range` before deciding them, and ask for their
    /// spans. In a table of hundreds of thousands of chains each lookup misses the cache twice
    /// (the control bytes, then the entry), and a decision between two lookups is too long for
    /// the processor to overlap them: in a loop of lookups alone it overlaps several.
    fn warm(&self, range: std::ops::Range<usize>) {
        for (_, id) in &self.due_now[range] {
            if let Some(c) = self.active.get(id) {
                prefetch_spans(&c.spans);
            }
        }
    }

    /// Decide, or put back for later, each chain of `due` (entries due at `now`).
    fn tick_due(&mut self, due: &[(Moment, TraceId)], now: Moment, out: &mut Vec<DecidedCalls>) {
        for &(_, id) in due {
            let Some(c) = self.active.get(&id) else { continue };
            let quiet = now.saturating_duration_since(c.last_seen) >= self.limits.decision_wait;
            let expired = now.saturating_duration_since(c.first_seen) >= self.limits.max_wait;
            // A call the server answered that goes on (waiting for input, a task) is decided by
            // its own clocks (the engine's `check_progress`), its last round, or a drain: not by
            // the trace going quiet, nor by `max_wait`.
            if (quiet || expired) && c.has_progress && assemble_calls(&c.spans).iter().any(|c| c.awaiting().is_some()) {
                self.due.push(now + self.limits.decision_wait, id);
                continue;
            }
            if c.root_seen && quiet && c.server_rooted && c.has_server_req && !c.has_client_req && !c.deferred && !expired {
                // A server half waits once more for a client half exported a little later (another
                // process, another exporter schedule): at least 2 s. With a shared store, its
                // server is seen to split: marked, so that other instances publish its halves.
                let server = self.share_orphans.then(|| crossjoin::server_half(&c.spans).map(|h| h.server)).flatten();
                if let Some(c) = self.active.get_mut(&id) {
                    c.deferred = true;
                    let last_seen = c.last_seen;
                    self.defer_half(id, last_seen);
                }
                if let Some(server) = server {
                    if self.splits.mark(&server, now) {
                        self.publish_held(std::slice::from_ref(&server), now, self.limits.late_span_window);
                    }
                }
                self.due.push(now + self.limits.server_half_wait.max(Duration::from_millis(1)), id);
            } else if let Some(at) = self.split_settles_after(c, now).filter(|_| c.root_seen && quiet && !expired) {
                // A server half of a server marked a moment ago: its look (and so its decision)
                // waits until the other instances had time to publish their halves of it.
                self.due.push(at, id);
            } else if c.root_seen && quiet {
                // A client half some server half in flight may belong to waits for it: the join is
                // made over the closed set of candidates at the end of that half's wait.
                let awaited = if c.has_client_req && !expired { self.awaited_half(id, now) } else { None };
                match awaited {
                    Some(at) => self.due.push(at, id),
                    None => self.decide(id, DecidedBy::Quiet, now, out),
                }
            } else if expired && !c.held {
                self.decide(id, DecidedBy::MaxWait, now, out);
            } else {
                if !c.root_seen && quiet && self.share_orphans && !self.rootless_looked.contains(&id) {
                    // Its root (the client's span) may be in a chain another instance decided and
                    // wrote (it stopped, or the collector's ring moved the trace): looked for once.
                    self.rootless_looked.insert(id);
                    if self.outbox.rootless.len() < crossjoin::MAX_ORPHANS {
                        self.outbox.rootless.push(id);
                    }
                }
                let next = if c.root_seen { c.last_seen + self.limits.decision_wait } else { now + self.limits.decision_wait };
                let next = if c.held { next } else { next.min(c.first_seen + self.limits.max_wait) };
                let next = next.max(now + Duration::from_millis(1));
                self.due.push(next, id);
            }
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
    pub fn decide_now(&mut self, id: TraceId, by: DecidedBy, now: Moment, out: &mut Vec<DecidedCalls>) {
        self.decide(id, by, now, out);
    }

    /// Decide everything in flight (shutdown).
    pub fn drain(&mut self, by: DecidedBy, now: Moment, out: &mut Vec<DecidedCalls>) {
        // A look for a client half may come after this instance is gone: what was held back is
        // published, and so is every half decided from here on.
        if self.share_orphans {
            self.draining = true;
            let held = self.splits.held_servers();
            if !held.is_empty() {
                // Only a server half still waiting can look after the drain: one whose client
                // half was decided within its waits (its own, the extra one, the mark's settling).
                let extra = self.limits.server_half_wait;
                let window = self.limits.decision_wait + extra * 2 + self.splits.settle();
                self.publish_held(&held, now, window);
            }
        }
        self.settle_orphans(now, true, out);
        // Deciding a server half can reopen its client's chain (the cross-trace join): go round
        // again until nothing is left; each round removes at least the half that was joined.
        // In trace-id order, so the outcome does not depend on the table's history.
        for _ in 0..8 {
            let mut ids: Vec<TraceId> = self.active.keys().copied().collect();
            if ids.is_empty() {
                break;
            }
            ids.sort_unstable();
            for id in ids {
                self.decide(id, by, now, out);
            }
        }
        self.due.clear();
        self.due_now.clear();
        self.due_next = 0;
        self.release_limbo();
    }

    /// Move the spans of chain `src` into chain `dst` (active, or decided and then revised). The
    /// moved spans are remembered as such, and `dst` is indexed under `src`'s keys: its halves
    /// stay visible to a rival that comes later (see `client_fits`, `server_fits`).
    fn merge_into(&mut self, src: TraceId, dst: TraceId, now: Moment) -> bool {
        if !self.active.contains_key(&src) || (!self.active.contains_key(&dst) && !self.reopen(dst, now)) {
            return false;
        }
        let Some(s) = self.active.remove(&src) else { return false };
        let keys = s.index_keys().to_vec();
        self.cross.remove_keys(src, &keys);
        self.cross.insert_keys(dst, &keys);
        let Some(d) = self.active.get_mut(&dst) else { return false };
        let extra = d.extra.get_or_insert_with(Default::default);
        for k in keys {
            if !extra.index_keys.contains(&k) {
                extra.index_keys.push(k);
            }
        }
        extra.moved.extend(s.spans.iter().map(|ev| ev.span_id));
        // The moved spans now belong to the call's chain: one trace per chain, so the verdict and
        // its health span land in the trace the call is decided in.
        d.spans.extend(s.spans.into_iter().map(|mut ev| {
            ev.trace_id = dst;
            ev
        }));
        d.bytes += s.bytes;
        d.has_server_req |= s.has_server_req;
        d.has_client_req |= s.has_client_req;
        d.has_progress |= s.has_progress;
        d.truncated |= s.truncated;
        true
    }

    /// The spans of a chain in flight, decided or in limbo, and those of them that moved in from
    /// another trace.
    fn view(&self, t: &TraceId) -> Option<(&[SpanEvidence], &[crate::evidence::SpanId])> {
        if let Some(c) = self.active.get(t) {
            return Some((&c.spans, c.moved()));
        }
        self.decided.get(t).or_else(|| self.limbo.get(t)).map(|d| (&d.spans[..], &d.moved[..]))
    }

    /// The client halves (of chains other than `not`) that server half `h` fits: each chain with
    /// the slack its fit used, and whether that half already holds a server half from another
    /// trace. `None` when too many chains share the half's key to tell.
    fn client_fits(&mut self, h: &crossjoin::Half, not: TraceId) -> Option<Vec<(TraceId, u64, bool)>> {
        let candidates = self.cross.client_candidates(h, not)?;
        let mut out = Vec::new();
        for t in candidates {
            let Some((spans, moved)) = self.view(&t) else { continue };
            for (c, joined) in crossjoin::client_halves_with(spans, |id| moved.contains(id)) {
                if crossjoin::client_matches(&c, h) {
                    out.push((t, crossjoin::misfit(&c, h), joined));
                }
            }
        }
        Some(out)
    }

    /// The server halves (of chains other than `not`) that fit client half `c`: each chain with
    /// the slack its fit used. A chain alone (in flight or decided alone) and a half joined into
    /// another chain both count. `None` when too many chains share the half's key to tell.
    fn server_fits(&mut self, c: &crossjoin::Half, not: TraceId) -> Option<Vec<(TraceId, u64)>> {
        let candidates = self.cross.server_candidates(c, not)?;
        let mut out = Vec::new();
        for t in candidates {
            let Some((spans, moved)) = self.view(&t) else { continue };
            let halves = if moved.is_empty() {
                crossjoin::server_half(spans).into_iter().collect()
            } else {
                crossjoin::joined_server_halves(spans, |id| moved.contains(id))
            };
            for sh in halves {
                if crossjoin::client_matches(c, &sh) {
                    out.push((t, crossjoin::misfit(c, &sh)));
                }
            }
        }
        Some(out)
    }

    /// Whether chain `t` is a server half alone (in flight, or decided alone): nothing joined into it.
    fn is_lone_server_half(&self, t: &TraceId) -> bool {
        self.view(t).is_some_and(|(spans, moved)| moved.is_empty() && crossjoin::server_half(spans).is_some())
    }

    /// For a client chain about to be decided: when a server half in flight that one of its client
    /// halves fits (or a refused HTTP request it may have sent) will have waited its time, if any
    /// does. The chain waits until then, so the join is made over the closed set of candidates.
    fn awaited_half(&mut self, id: TraceId, now: Moment) -> Option<Moment> {
        let (halves, refused) = {
            let c = self.active.get(&id)?;
            (crossjoin::client_halves_with(&c.spans, |s| c.moved().contains(s)), crossjoin::refused_requests(&c.spans))
        };
        let wait = self.limits.decision_wait + self.limits.server_half_wait;
        let mut until: Option<Moment> = None;
        for (h, joined) in halves {
            if joined {
                continue;
            }
            for (t, _) in self.server_fits(&h, id).unwrap_or_default() {
                if let Some(sc) = self.active.get(&t).filter(|sc| !sc.has_client_req) {
                    let at = sc.last_seen + wait;
                    until = Some(until.map_or(at, |u| u.max(at)));
                }
            }
        }
        if let Some(at) = self.cross.orphans_waiting(&refused, now, wait) {
            until = Some(until.map_or(at, |u| u.max(at)));
        }
        // Past its estimate, a half still in flight (settling a split mark) is asked after again
        // a little later; never past the chain's own `max_wait`.
        let latest = self.active.get(&id).map(|c| c.first_seen + self.limits.max_wait)?;
        until.map(|u| u.max(now + (self.limits.decision_wait / 4).max(Duration::from_millis(1))).min(latest))
    }

    /// The cross-trace joins of a chain about to be decided (see `crossjoin`).
    fn cross_join(&mut self, id: TraceId, now: Moment) -> Joined {
        let Some(c) = self.active.get(&id) else { return Joined::Away };
        // 1. A server half goes to its client half, when each fits only the other.
        if c.has_server_req && !c.has_client_req {
            let Some(h) = crossjoin::server_half(&c.spans) else { return Joined::Alone(Vec::new()) };
            let fits = self.client_fits(&h, id);
            // Client chains held for this half decide now that its candidates are known.
            for (t, _, _) in fits.iter().flatten() {
                if self.active.contains_key(t) {
                    self.due.push(now, *t);
                }
            }
            let Some(fits) = fits else {
                self.cross.stats.ambiguous += 1;
                return Joined::AmbiguousHalf;
            };
            match pick_client(&fits) {
                crossjoin::HalfMatch::None => return Joined::Alone(Vec::new()),
                crossjoin::HalfMatch::One(t) => {
                    let unjoined = fits.iter().any(|(x, _, joined)| *x == t && !joined);
                    if unjoined && self.fits_only(t, &h, id) && self.merge_into(id, t, now) {
                        self.cross.stats.halves_joined += 1;
                        return Joined::Away;
                    }
                }
                crossjoin::HalfMatch::Ambiguous => {}
            }
            // Several client halves (or one that fits several server halves): no join. The client
            // chains already decided are revised, so their verdicts say that their server half
            // could not be told.
            self.cross.stats.ambiguous += 1;
            // Those decided after this half came saw it and said so then.
            let came = self.active.get(&id).map_or(now, |c| c.first_seen);
            let before = |t: &TraceId| self.decided.get(t).or_else(|| self.limbo.get(t)).is_some_and(|d| d.decided_at <= came);
            let mut revisit: Vec<TraceId> = fits.iter().map(|(t, _, _)| *t).filter(|t| before(t)).collect();
            revisit.sort_unstable();
            revisit.dedup();
            for t in revisit {
                self.reopen(t, now);
            }
            return Joined::AmbiguousHalf;
        }
        // 2. A client half takes its server half: one in flight (at a decision that could not wait
        // for it: the drain, an eviction, `max_wait`), or one decided alone before this client
        // half came (the late path: this chain then joins that one, which is revised).
        let mut flagged = Vec::new();
        if c.has_client_req {
            let (halves, revision) = (crossjoin::client_halves_with(&c.spans, |s| c.moved().contains(s)), c.revision);
            let mut late: Vec<TraceId> = Vec::new();
            let mut others = false;
            for (h, joined) in halves {
                let mut fits = self.server_fits(&h, id);
                if joined {
                    // Its own server half (joined before) is a candidate too: rivals that fit only
                    // with clock slack leave it the clear fit.
                    let own = self.view(&id).and_then(|(spans, moved)| {
                        crossjoin::joined_server_halves(spans, |s| moved.contains(s))
                            .into_iter()
                            .find(|sh| sh.method == h.method && sh.request_id == h.request_id)
                    });
                    if let (Some(f), Some(own)) = (fits.as_mut(), own) {
                        f.push((id, crossjoin::misfit(&h, &own)));
                    }
                }
                let pick = fits.as_deref().map_or(crossjoin::HalfMatch::Ambiguous, crossjoin::pick);
                match pick {
                    crossjoin::HalfMatch::One(t) if joined && t == id => continue,
                    crossjoin::HalfMatch::None => continue,
                    crossjoin::HalfMatch::One(t) if !joined && self.active.contains_key(&t) => {
                        let sh = self.active.get(&t).and_then(|sc| crossjoin::server_half(&sc.spans));
                        if sh.is_some_and(|sh| self.fits_only_client(id, &sh, t)) && self.merge_into(t, id, now) {
                            self.cross.stats.halves_joined += 1;
                            continue;
                        }
                    }
                    crossjoin::HalfMatch::One(t) if !joined && self.is_lone_server_half(&t) => {
                        let sh = self.view(&t).and_then(|(spans, _)| crossjoin::server_half(spans));
                        if sh.is_some_and(|sh| self.fits_only_client(id, &sh, t)) {
                            late.push(t);
                            continue;
                        }
                    }
                    _ => {}
                }
                // A server half fits, and it cannot be joined: the call says so.
                self.cross.stats.ambiguous += u64::from(!joined);
                others = true;
                flagged.push((h.method, h.request_id));
            }
            // The late path, for a chain never decided before whose one fitting server half was
            // decided alone: this chain goes into that one (whose verdict is revised), so the
            // call keeps one verdict and one attempt.
            if let [t] = late[..] {
                if revision == 0 && !others && self.merge_into(id, t, now) {
                    self.cross.stats.late_joined += 1;
                    return Joined::Away;
                }
            }
            for t in late {
                if let Some(sh) = self.view(&t).and_then(|(spans, _)| crossjoin::server_half(spans)) {
                    flagged.push((sh.method, sh.request_id));
                }
            }
        }
        // 3. Refused HTTP requests kept as orphans.
        let refused = self.active.get(&id).map(|c| crossjoin::refused_requests(&c.spans)).unwrap_or_default();
        let active = &self.active;
        let (joined, unjoined) = self.cross.take_orphans(&refused, |t| *t != id && active.contains_key(t));
        if let Some(c) = self.active.get_mut(&id) {
            for span in unjoined {
                if let Some(r) = c.spans.iter().find(|s| s.span_id == span) {
                    if let (Some(m), Some(rid)) = (r.method.clone(), r.request_id.clone()) {
                        flagged.push((m, rid));
                    }
                }
            }
            for ev in joined {
                let b = ev.approx_bytes();
                c.bytes += b;
                self.bytes += b;
                c.spans.push(ev);
            }
        }
        Joined::Alone(flagged)
    }

    /// Whether the client half of chain `t` that server half `h` (chain `s`) fits fits no other
    /// server half.
    fn fits_only(&mut self, t: TraceId, h: &crossjoin::Half, s: TraceId) -> bool {
        let Some(c) = self.view(&t).and_then(|(spans, moved)| {
            crossjoin::client_halves_with(spans, |id| moved.contains(id)).into_iter().find(|(c, _)| crossjoin::client_matches(c, h))
        }) else {
            return false;
        };
        self.server_fits(&c.0, t).is_some_and(|f| crossjoin::pick(&f) == crossjoin::HalfMatch::One(s))
    }

    /// Whether server half `h` (chain `s`) fits the client halves of chain `id` and no other.
    fn fits_only_client(&mut self, id: TraceId, h: &crossjoin::Half, s: TraceId) -> bool {
        self.client_fits(h, s).is_some_and(|f| pick_client(&f) == crossjoin::HalfMatch::One(id))
    }

    fn decide(&mut self, id: TraceId, by: DecidedBy, now: Moment, out: &mut Vec<DecidedCalls>) {
        let joined = self.cross_join(id, now);
        if joined == Joined::Away {
            return;
        }
        let Some(mut c) = self.active.remove(&id) else { return };
        self.stats.chains_decided += 1;
        if self.share_orphans {
            // Chains not kept for revision (`max_decided: 0`, the drain) cannot be found again
            // when a mark comes: theirs are published at once.
            let kept = self.limits.max_decided > 0 && !self.draining;
            for s in crossjoin::unanswered_client_requests(&c.spans) {
                if kept && !self.splits.publishes(&s.server) && self.splits.hold(&s.server, now) {
                    continue;
                }
                if let Some(h) = crossjoin::client_half(&c.spans, s) {
                    self.publish_half(id, h);
                }
            }
        }
        let mut calls = self.spare_calls.pop().unwrap_or_default();
        assemble_calls_into(&c.spans, &mut calls);
        match &joined {
            Joined::AmbiguousHalf => {
                for call in calls.iter_mut().filter(|c| c.server_seen && !c.client_seen) {
                    call.unjoined_half = true;
                }
            }
            Joined::Alone(flagged) => {
                for call in calls.iter_mut().filter(|c| c.client_seen) {
                    let named = |(m, rid): &(crate::evidence::Method, Box<str>)| {
                        call.method.as_ref() == Some(m) && call.request_id.as_deref() == Some(&**rid)
                    };
                    if flagged.iter().any(named) {
                        call.server_half_unjoined = true;
                    }
                }
            }
            Joined::Away => {}
        }
        out.push(DecidedCalls {
            trace_id: id,
            calls,
            decision: Decision { revision: c.revision, decided_by: by, root_seen: c.root_seen, truncated: c.truncated },
            previous: c.extra.as_mut().map(|e| std::mem::take(&mut e.previous)).unwrap_or_default(),
        });
        if self.limits.max_decided == 0 || by == DecidedBy::Shutdown {
            if self.outbox.track && self.limits.max_decided > 0 {
                // Decided at shutdown: not kept here, but kept in the store, so that a late span
                // after the restart still revises it.
                self.mark(id, &c.spans);
                self.outbox.shutdown_decided.push(KeptChain {
                    trace_id: id,
                    spans: Arc::new(c.spans.clone()),
                    root_seen: c.root_seen,
                    truncated: c.truncated,
                    revision: c.revision,
                    decided_at_ns: now.as_nanos(),
                });
            }
            self.limbo.insert(id, DecidedChain::of(c, now));
            return;
        }
        self.cross.remember_refused(now, crossjoin::refused_requests(&c.spans), self.limits.late_span_window);
        self.decided_order.push_back((now, id, c.revision));
        self.mark(id, &c.spans);
        self.decided.insert(id, DecidedChain::of(c, now));
        while self.decided.len() > self.limits.max_decided {
            self.expire_oldest_decided(false);
        }
    }
}

/// [`crossjoin::pick`] among client fits (chain, slack, already joined).
fn pick_client(fits: &[(TraceId, u64, bool)]) -> crossjoin::HalfMatch {
    crossjoin::pick(&fits.iter().map(|(t, m, _)| (*t, *m)).collect::<Vec<_>>())
}

/// What the cross-trace join did with a chain about to be decided.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Joined {
    /// It went into another chain (a server half into its client's, or a late client half into
    /// its server half's): no verdict of its own.
    Away,
    /// It is decided on its own; the client requests (method, request id) a server half fits that
    /// could not be joined (several fit, or it came too late) are named.
    Alone(Vec<(crate::evidence::Method, Box<str>)>),
    /// A server half that several client halves fit: decided alone, no attempt of its own.
    AmbiguousHalf,
}

/// Room the per-batch span counts keep between batches (in traces); a larger batch's table is
/// let go after it.
const MAX_BATCH_TRACES_KEPT: usize = 4096;

/// Room the limbo table keeps between steps (in chains): a step decides at most about
/// `DECIDE_PER_STEP` calls, so this holds any step but a drain's.
const MAX_LIMBO_KEPT: usize = 16_384;

#[cfg(test)]
mod size_tests {
    /// Issue 11: the chain table holds one entry per chain in flight (hash tables run at half
    /// load or more, so each byte here costs up to two): what few chains need stays boxed.
    #[test]
    fn a_chain_in_flight_stays_small() {
        assert!(std::mem::size_of::<super::Chain>() <= 72, "{} bytes", std::mem::size_of::<super::Chain>());
    }
}
