//! What the chains keep for a store and what a store tells them back: the whole vocabulary
//! between this room and the replica (`engine/shared`), in this room's own types. The store's
//! records (the `state` room) and the conversions to and from them are the replica's business:
//! this room names nothing of the store, so the stored format can change without touching the
//! rules here, and the rules without touching the format.
//!
//! - [`Outbox`]: which decided chains and operation keys changed, the chains decided at shutdown,
//!   and (with a shared store) what is to be published for the other instances and the rootless
//!   chains to look for. The chains fill it as they decide; the replica drains it at its own pace
//!   (a write round, a step's look), so the chains never wait for a store.
//! - [`Restore`]: what the store keeps, taken back; [`FromStore`]: what another instance published
//!   or decided, taken in as if it had come here.
//! - [`KeptChain`], [`KeptSession`]: a decided chain and a session as kept for a store.
//! - [`SessionBack`]: what a store tells the sessions back; [`ReadBack`]: which sessions a
//!   shared store's copies are wanted of. The sessions' changes go out as [`KeptSession`]s, like
//!   the chains'.

use std::sync::Arc;
use std::time::Duration;

use rustc_hash::FxHashSet;

use super::crossjoin;
use super::splits::Server;
use crate::classify::catalog::{CatalogEvent, Convergence};
use crate::evidence::{SpanEvidence, TraceId};

/// The chains' outbox (see the module).
#[derive(Default)]
pub(crate) struct Outbox {
    /// Record which decided chains and operation keys changed (a store is attached).
    pub(super) track: bool,
    pub(super) dirty: FxHashSet<TraceId>,
    pub(super) dirty_ops: FxHashSet<Box<str>>,
    /// Chains decided at shutdown (not kept for revision here), still to be put in the store.
    pub(super) shutdown_decided: Vec<KeptChain>,
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

/// A decided chain as a store keeps it: what is needed to take it back for revision.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct KeptChain {
    pub trace_id: TraceId,
    /// Shared with the decided chain held here: a write hands the chain's spans to the store's
    /// thread without copying them.
    pub spans: Arc<Vec<SpanEvidence>>,
    pub root_seen: bool,
    pub truncated: bool,
    pub revision: u32,
    /// Engine time of the decision (the late-span window runs from it).
    pub decided_at_ns: u64,
}

/// One change of the chains for the store, in the order they are to be written.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum ChainChange {
    /// A decided chain kept for revision (or decided at shutdown): put.
    Decided(KeptChain),
    /// A decided chain forgotten: deleted.
    Forgotten(TraceId),
    /// An operation key and the trace of its call: put while that chain is kept.
    Operation(Box<str>, TraceId),
    /// An operation key whose call's chain is gone: deleted.
    OperationGone(Box<str>),
}

/// A session as a store keeps it (see `sessions`): its catalog timeline and what was emitted.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct KeptSession {
    pub events: Vec<CatalogEvent>,
    pub page_requests: Vec<Box<str>>,
    /// Engine time the session was last seen (for idle expiry).
    pub last_seen_ns: u64,
    pub last: Option<Convergence>,
    pub last_activity_ns: u64,
    pub server: Option<Arc<str>>,
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub has_ttl: bool,
    /// The convergence last emitted for it, by whichever instance.
    pub emitted: Option<Convergence>,
}

/// What a write round takes from the chains at its start: what to publish for the other
/// instances, and the split marks to write and to read.
#[derive(Default)]
pub(crate) struct Published {
    pub orphans: Vec<SpanEvidence>,
    pub halves: Vec<(TraceId, crossjoin::Half)>,
    pub parked: Vec<(Box<str>, SpanEvidence)>,
    /// Servers seen to split here since the last round: their marks to write.
    pub marks: Vec<Server>,
    /// Servers whose client halves are held back here: their marks to read (another instance
    /// may have marked them).
    pub ask_marks: Vec<Server>,
}

/// What the chains want looked for in a shared store before due chains are decided.
#[derive(Default)]
pub(crate) struct Looks {
    /// Server halves about to be decided alone: their client half may be listed by another
    /// instance (each returned once).
    pub server_halves: Vec<(TraceId, crossjoin::Half)>,
    /// Chains whose root never came, gone quiet: another instance may have decided their call.
    pub rootless: Vec<TraceId>,
    /// The seconds whose published refusals to read (when [`Paced::refusals`] asked): a refused
    /// client request here may have been answered by an HTTP span another instance received.
    pub refusal_seconds: Vec<u64>,
    /// Operation keys verifiers are parked under here, sorted (when [`Paced::parked`] asked):
    /// their call's instance may have written it to the store's operation index since.
    pub parked_keys: Vec<Box<str>>,
}

/// The looks whose store reads the replica paces (they are not wanted at every step): each is
/// asked for only when due.
#[derive(Default)]
pub(crate) struct Paced {
    /// Refusals: for the refused requests in flight and those decided within this long, at
    /// most this many seconds.
    pub refusals: Option<(Duration, usize)>,
    /// Parked verifiers' calls: at most this many operation keys.
    pub parked: Option<usize>,
}

/// What a store keeps, taken back into the chains (loaded at start, or taken from the store
/// for evidence that came here).
#[derive(Debug)]
pub(crate) enum Restore {
    /// A decided chain to keep for revision (at start oldest first).
    Decided(KeptChain),
    /// A chain forgotten here under a bound, back from the store (`None`: the store no longer
    /// has it).
    Spilled(TraceId, Option<KeptChain>),
    /// A stored decided chain a start-up load left in the store (older than the `max_decided`
    /// it kept): known as forgotten under that bound (at start oldest first, before those kept).
    Forgotten { trace_id: TraceId, decided_at_ns: u64, operation_keys: Vec<Box<str>> },
    /// An operation key and the trace of its call.
    Operation(Box<str>, TraceId),
    /// A stored decided chain a start-up load held neither whole nor by trace (past both of its
    /// bounds), in a store only this process writes: deleted with the next write round.
    LetGo(TraceId),
    /// The operation key of such a chain's call: deleted with it.
    OperationGone(Box<str>),
    /// A split mark the store held at start (the halves it concerns were decided before:
    /// nothing is published for them).
    Mark(Server),
    /// Marks a write round did not write: written at the next.
    MarksAgain(Vec<Server>),
}

/// What another instance published or decided, taken in by the chains as if it had come here:
/// it may join a chain in flight, revise a decided one, or publish what was held back.
#[derive(Debug)]
pub(crate) enum FromStore {
    /// A decided chain for a trace in flight here without its root: the two are one call, the
    /// spans held here join it as late spans (a revision, not a second attempt).
    Adopt(KeptChain),
    /// A call naming this operation key is known now: the verifiers parked under it join it.
    Unpark(Box<str>),
    /// A split mark read in a write round: the halves held back for its server are published.
    Split(Server),
    /// The cluster's state protocol (the lowest any instance sharing the store announces).
    Protocol(u32),
    /// A refused-looking HTTP span another instance published.
    Orphan(SpanEvidence),
    /// A verifier another instance parked under an operation key a call here names.
    Verifier(SpanEvidence),
    /// A decided chain as another instance wrote it, where this instance's write of the same
    /// chain was refused (both revised it at once: a late span here, a verifier there): the
    /// spans it holds that the chain here lacks join as late spans, a revision holding both.
    Rival(KeptChain),
}

/// What a store tells the sessions back (see `sessions`). One way in, whatever the store says,
/// so what the replica may do to the session table is read off these variants.
#[derive(Debug)]
pub(crate) enum SessionBack<'a> {
    /// A session the store keeps, taken back at start (within the table's bound).
    Loaded(String, KeptSession),
    /// A session as another instance wrote it to a shared store: merged with the one here (the
    /// evidence of the traces that went elsewhere), written back as the union when it brought
    /// anything new.
    Merged(&'a str, KeptSession),
    /// Written again at the next write: its last write was refused, or a catalog change held for
    /// it is due (that write decides which instance emits it).
    WriteAgain(&'a str),
    /// The convergence recorded as emitted for it (written with it at the next write), or put
    /// back as the store had it when that write did not go through.
    Emitted(&'a str, Option<Convergence>),
}

/// Which sessions to read back from a shared store, where other instances write them too.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ReadBack {
    /// Those to be written (changed since the last write): merged with the store's copy first,
    /// so the write is the union.
    ToWrite,
    /// Up to `limit` of those whose verdict here is `converged`, in key order from the `from`-th
    /// (taken in turn): only a green verdict can be wrong for want of evidence another instance
    /// holds, with nothing more of the session coming here to make this instance look again.
    Converged { limit: usize, from: usize },
}

impl Outbox {
    /// What is to be published since the last call.
    pub(super) fn take_published(&mut self) -> Published {
        Published {
            orphans: std::mem::take(&mut self.orphans),
            halves: std::mem::take(&mut self.halves),
            parked: std::mem::take(&mut self.parked),
            ..Published::default()
        }
    }
}
