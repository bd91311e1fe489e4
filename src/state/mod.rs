//! The state store: where the engine's cross-trace state goes so that it outlives the process.
//!
//! The engine owns its state in memory and stays the only writer of it; a [`StateStore`] is told,
//! at most every [`PERSIST_EVERY`] of engine time and always at the end of a drain, which records
//! changed since the last write ([`Changes`]), and hands back every record at start-up
//! ([`Snapshot`]). The unit is a **record in a table**, keyed by a string:
//!
//! | table | key | record |
//! | --- | --- | --- |
//! | `sessions` | session key | [`SessionRecord`]: the session's catalog timeline |
//! | `incidents` | [`server_key`] of the server | [`ServerIncidents`]: a server's open incidents and its recent healthy calls |
//! | `decided` | trace id (hex) | [`DecidedRecord`]: a decided chain kept for revision |
//! | `operations` | operation key | the trace id of the call that named it |
//! | `drift_reported` | server, tool, digest | [`DriftRecord`] (reported once) |
//! | `client_halves` | method, request id, start second ([`crate::correlate::crossjoin::shared_half_key`]) | [`HalvesRecord`]: client halves of split calls decided by some instance (shared stores only) |
//! | `parked_verifiers` | operation key | [`ParkedRecord`]: verifiers that reported before their call, as the instances that parked them published them (shared stores only) |
//! | `split_servers` | [`server_key`] of the server | [`SplitRecord`]: a server some instance saw split its calls' traces: only its client halves are published (shared stores only) |
//! | `refusals` | the second an HTTP request started (`start_ns / 1 s`, decimal) | [`RefusalsRecord`]: refused-looking HTTP spans alone in their trace (shared stores only) |
//!
//! The gate's view is not a table of its own: it is re-published from the sessions at load.
//!
//! Records are plain serde data, encoded by [`encode`] / [`decode`] with postcard: a decided
//! chain of two spans is 521 bytes against 2771 in JSON, a session 125 against 557, an incident
//! 114 against 440 (`state::tests::postcard_is_smaller_than_json_for_the_records`).
//!
//! A server's incidents and the healthy calls that resolve them are **one record**: the incident
//! fold needs both, and with several instances each folds its own verdicts into the stored record
//! by compare-and-set (`engine`, "incidents on a shared store"), so the record must change as
//! one.
//!
//! # A shared store
//! [`redis::RedisStore`] (`storage: {kind: redis, endpoint: …}`) implements the trait for
//! several instances: every change is a put or a delete of one key, so `apply` is one Lua script
//! over `mcp-health:<table>:<key>` hashes. Each record carries the number of the transaction that
//! wrote it; `apply` writes only if every key is still at the version this instance last read or
//! wrote (a key never seen must be absent, a deleted one leaves a tombstone for a while); a record
//! another instance changed is refused, the rest written, and the refusal reported as
//! [`StoreError::Conflict`]. The engine logs and counts it
//! like any other store error and keeps its own in-memory record, which is never greener than
//! what either instance saw. `load` is a `SCAN` per table. A store is called from one thread at
//! a time: the engine's (in-process stores), or its store thread (network stores,
//! `engine::shared::worker`), with the gate's reads under the handle's lock.

pub(crate) mod config;
pub(crate) mod embedded;
pub(crate) mod format;
pub(crate) mod journal;
pub(crate) mod memory;
pub(crate) mod redis;
mod v0;
mod versions;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{de::DeserializeOwned, Deserialize, Serialize};

use crate::classify::catalog::{CatalogEvent, Convergence};

use crate::evidence::{SpanEvidence, TraceId};

pub use self::redis::RedisSettings;
pub(crate) use self::redis::RedisStore;
pub(crate) use embedded::EmbeddedStore;
pub use memory::{MemoryStore, SharedMemory};

/// How often (engine time) the engine writes its changes, at most.
pub(crate) const PERSIST_EVERY: Duration = Duration::from_millis(100);

/// What went wrong in a store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("state store I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("state store backend: {0}")]
    Backend(String),
    #[error("state record {table}/{key}: {message}")]
    Decode { table: &'static str, key: String, message: String },
    /// A record of a format version this build does not know (a newer build wrote it): left as
    /// it is, never read as something it is not.
    #[error("state record {table}/{key} has format version {version}, newer than this build reads ({current})", current = format::CURRENT)]
    Newer { table: &'static str, key: String, version: u32 },
    #[error("state record {table}/{key} was changed by another writer")]
    Conflict {
        table: &'static str,
        key: String,
        /// Every change refused (the first is `table`/`key`); the others were written.
        refused: Vec<(Table, String)>,
    },
}

/// The tables of the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Table {
    Sessions,
    Incidents,
    Decided,
    Operations,
    DriftReported,
    Refusals,
    Halves,
    Parked,
    Splits,
}

impl Table {
    pub const ALL: [Table; 9] = [
        Table::Sessions,
        Table::Incidents,
        Table::Decided,
        Table::Operations,
        Table::DriftReported,
        Table::Refusals,
        Table::Halves,
        Table::Parked,
        Table::Splits,
    ];

    /// Records every instance adds to and the writer deletes after `late_span_window` (refused
    /// HTTP spans, client halves, parked verifiers): a shared store also lets them expire
    /// (`storage.tombstone_ttl` after their last write), so an instance that stopped before
    /// deleting its own leaves nothing behind for good. Read absent, such a record is expected
    /// absent (not a conflict).
    pub fn expires(self) -> bool {
        matches!(self, Table::Refusals | Table::Halves | Table::Parked)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Table::Sessions => "sessions",
            Table::Incidents => "incidents",
            Table::Decided => "decided",
            Table::Operations => "operations",
            Table::DriftReported => "drift_reported",
            Table::Refusals => "refusals",
            Table::Halves => "client_halves",
            Table::Parked => "parked_verifiers",
            Table::Splits => "split_servers",
        }
    }
}

/// One session's catalog state (see `correlate::sessions`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SessionRecord {
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
    /// The convergence last emitted for the session, by whichever instance (on a shared store the
    /// one whose write sets it emits the change: see `engine`, "catalog changes").
    pub emitted: Option<Convergence>,
}

/// A decided chain kept so that a late span can revise it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DecidedRecord {
    pub trace_id: TraceId,
    /// Shared with the decided chain the engine keeps: a write hands the store's thread the
    /// chain's spans without copying them (encoded the same as a plain list).
    pub spans: std::sync::Arc<Vec<SpanEvidence>>,
    pub root_seen: bool,
    pub truncated: bool,
    pub revision: u32,
    /// Engine time of the decision (the late-span window runs from it).
    pub decided_at_ns: u64,
}

/// A server's incidents record is the incident book's own part of that server (plain data,
/// defined with the book so that `classify` imports nothing from here).
pub use crate::classify::incidents::ServerIncidents;

/// The incident book's changed servers as store changes: one [`ServerIncidents`] record per
/// server, deleted when the server has neither open incidents nor recent healthy calls.
pub(crate) fn incident_changes(book: &mut crate::classify::incidents::IncidentBook, out: &mut Changes) {
    let servers = book.take_dirty_servers();
    for part in book.parts(&servers) {
        let key = server_key(part.server.as_deref());
        if part.is_empty() {
            out.delete(Table::Incidents, key);
        } else {
            out.put(key, Record::Incidents(Box::new(part)));
        }
    }
}

/// The refused-looking HTTP spans (an MCP endpoint answered >= 400, no MCP span in the trace)
/// that started in one second, as the instances that received them published them: the client
/// request they answered may be in a trace routed to another instance (`correlate::crossjoin`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RefusalsRecord {
    pub orphans: Vec<SpanEvidence>,
}

/// Client halves of split calls (a client request span with no server span in its trace), by
/// (method, request id, start second), as the instances that decided them published them: the
/// instance holding the server half takes the client's decided chain from the store and joins
/// them (`correlate::crossjoin`). `overflow`: more than fit were published, so no unique match
/// can be shown (an ambiguous match is no match).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HalvesRecord {
    pub halves: Vec<ClientHalf>,
    pub overflow: bool,
}

/// One client half as a shared store lists it: the chain's trace and its request's interval.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClientHalf {
    pub trace_id: TraceId,
    pub method: crate::evidence::Method,
    pub request_id: Box<str>,
    pub start_ns: u64,
    pub end_ns: u64,
    pub server: Option<Arc<str>>,
    pub session: Option<Arc<str>>,
}

/// A server some instance saw split its calls' traces (a server half waited alone for its client
/// half): every instance publishes the client halves of its calls (see `correlate::splits`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitRecord {
    pub server: Option<Arc<str>>,
}

/// Verifier spans that named an operation key before any call did, parked where they came: the
/// instance whose call names the key reads them when it decides the call.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ParkedRecord {
    pub verifiers: Vec<SpanEvidence>,
}

/// The key of the refusals that started in second `sec`.
pub(crate) fn refusal_key(sec: u64) -> String {
    sec.to_string()
}

/// A drift already reported.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriftRecord {
    pub server: Arc<str>,
    pub tool: Arc<str>,
    pub digest: Arc<str>,
}

impl DriftRecord {
    pub fn key(&self) -> String {
        format!("{}\n{}\n{}", self.server, self.tool, self.digest)
    }
}

/// The key of a server's incidents (`None` is a server nobody named).
pub(crate) fn server_key(server: Option<&str>) -> String {
    match server {
        Some(s) => format!("={s}"),
        None => "-".to_string(),
    }
}

/// The key of a decided chain.
pub(crate) fn trace_key(t: &TraceId) -> String {
    crate::evidence::hash::to_hex(t)
}

/// The trace of a decided chain's key ([`trace_key`]'s inverse); `None` for any other key.
pub(crate) fn trace_of_key(k: &str) -> Option<TraceId> {
    hex::decode(k).ok()?.try_into().ok()
}

/// How a store reads the records 0.1.0 wrote: their receipts were never signed, so they read as
/// `unsigned` where this service trusts no receipt key and `untrusted` where it trusts some — a
/// stored receipt is never more evidence than a new one (`TrustedKeys::judge`). The service sets
/// it from its configuration when it opens the store (`processors.mcp_health.receipts`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadPolicy {
    pub receipt_keys_trusted: bool,
}

/// A record, as a change carries it.
#[derive(Clone, Debug)]
pub enum Record {
    Session(Box<SessionRecord>),
    Incidents(Box<ServerIncidents>),
    Decided(Box<DecidedRecord>),
    Operation(TraceId),
    DriftReported(DriftRecord),
    Refusals(Box<RefusalsRecord>),
    Halves(Box<HalvesRecord>),
    Parked(Box<ParkedRecord>),
    Split(SplitRecord),
}

impl Record {
    pub fn table(&self) -> Table {
        match self {
            Record::Session(_) => Table::Sessions,
            Record::Incidents(_) => Table::Incidents,
            Record::Decided(_) => Table::Decided,
            Record::Operation(_) => Table::Operations,
            Record::DriftReported(_) => Table::DriftReported,
            Record::Refusals(_) => Table::Refusals,
            Record::Halves(_) => Table::Halves,
            Record::Parked(_) => Table::Parked,
            Record::Split(_) => Table::Splits,
        }
    }

    /// [`Record::decode_with`] the default [`ReadPolicy`] (no receipt key trusted).
    pub fn decode(table: Table, key: &str, bytes: &[u8]) -> Result<Record, StoreError> {
        Record::decode_with(table, key, bytes, ReadPolicy::default())
    }

    /// A record of `table` from its stored bytes, whatever format version since 0.1.0 wrote them
    /// (see [`format`]); a newer one is [`StoreError::Newer`].
    pub fn decode_with(table: Table, key: &str, bytes: &[u8], read: ReadPolicy) -> Result<Record, StoreError> {
        match format::framed(bytes) {
            format::Framed::Version(format::CURRENT, payload) => match Record::decode_current(table, key, payload) {
                Ok(r) => Ok(r),
                // A bare 0.1.0 record may start with the magic by chance.
                Err(e) => v0::decode(table, key, bytes, read).map_err(|_| e),
            },
            format::Framed::Version(version, _) if version > format::CURRENT => {
                Err(StoreError::Newer { table: table.as_str(), key: key.to_string(), version })
            }
            format::Framed::Version(version, _) => Err(StoreError::Decode {
                table: table.as_str(),
                key: key.to_string(),
                message: format!("no build wrote format version {version}"),
            }),
            format::Framed::Bare(bytes) => v0::decode(table, key, bytes, read),
        }
    }

    /// A record of `table` in this build's layout (the payload of its frame).
    fn decode_current(table: Table, key: &str, bytes: &[u8]) -> Result<Record, StoreError> {
        Ok(match table {
            Table::Sessions => Record::Session(Box::new(decode(table, key, bytes)?)),
            Table::Incidents => Record::Incidents(Box::new(decode(table, key, bytes)?)),
            Table::Decided => Record::Decided(Box::new(decode(table, key, bytes)?)),
            Table::Operations => Record::Operation(decode(table, key, bytes)?),
            Table::DriftReported => Record::DriftReported(decode(table, key, bytes)?),
            Table::Refusals => Record::Refusals(Box::new(decode(table, key, bytes)?)),
            Table::Halves => Record::Halves(Box::new(decode(table, key, bytes)?)),
            Table::Parked => Record::Parked(Box::new(decode(table, key, bytes)?)),
            Table::Splits => Record::Split(decode(table, key, bytes)?),
        })
    }

    /// The record's bytes as stored: framed with this build's format version.
    pub fn encode(&self) -> Result<Vec<u8>, StoreError> {
        let mut out = Vec::new();
        self.encode_into(format::CURRENT, &mut out)?;
        Ok(out)
    }

    /// The record's bytes in format `version`: 0 is 0.1.0's bare layout (written while a 0.1.0
    /// instance shares the store, see [`StateStore::announce`]); any other, this build's.
    pub fn encode_as(&self, version: u32) -> Result<Vec<u8>, StoreError> {
        if version == 0 {
            v0::encode(self)
        } else {
            self.encode()
        }
    }

    /// [`Record::encode_as`] appended to `out`: a writer that reuses one buffer for every record
    /// of a transaction allocates nothing per record (a `Vec` grown from empty to a decided
    /// chain's half kilobyte is reallocated about eight times).
    pub(crate) fn encode_into(&self, version: u32, out: &mut Vec<u8>) -> Result<(), StoreError> {
        if version == 0 {
            out.extend_from_slice(&v0::encode(self)?);
            return Ok(());
        }
        match self {
            Record::Session(r) => encode_into(r, out),
            Record::Incidents(r) => encode_into(r, out),
            Record::Decided(r) => encode_into(r, out),
            Record::Operation(r) => encode_into(r, out),
            Record::DriftReported(r) => encode_into(r, out),
            Record::Refusals(r) => encode_into(r, out),
            Record::Halves(r) => encode_into(r, out),
            Record::Parked(r) => encode_into(r, out),
            Record::Split(r) => encode_into(r, out),
        }
    }

    /// Put the record into `s`.
    fn into_snapshot(self, key: &str, s: &mut Snapshot) {
        match self {
            Record::Session(r) => s.sessions.push((key.to_string(), *r)),
            Record::Incidents(r) => s.incidents.push(*r),
            Record::Decided(r) => s.push_decided(*r),
            Record::Operation(t) => s.operations.push((key.to_string(), t)),
            Record::DriftReported(r) => s.drift_reported.push(r),
            Record::Refusals(r) => s.refusals.push((key.to_string(), *r)),
            Record::Halves(r) => s.halves.push((key.to_string(), *r)),
            Record::Parked(r) => s.parked.push((key.to_string(), *r)),
            Record::Split(r) => s.splits.push(r),
        }
    }
}

/// One change: put (`Some`) or delete (`None`) a key of a table.
#[derive(Clone, Debug)]
pub struct Change {
    pub table: Table,
    pub key: String,
    pub value: Option<Record>,
}

/// The changes of one write, applied as one transaction.
#[derive(Clone, Debug, Default)]
pub struct Changes {
    pub changes: Vec<Change>,
}

impl Changes {
    pub fn put(&mut self, key: String, value: Record) {
        self.changes.push(Change { table: value.table(), key, value: Some(value) });
    }

    pub fn delete(&mut self, table: Table, key: String) {
        self.changes.push(Change { table, key, value: None });
    }

    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    pub fn len(&self) -> usize {
        self.changes.len()
    }
}

/// Every record of the store, as loaded at start-up.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub sessions: Vec<(String, SessionRecord)>,
    pub incidents: Vec<ServerIncidents>,
    pub decided: Vec<DecidedRecord>,
    pub operations: Vec<(String, TraceId)>,
    pub drift_reported: Vec<DriftRecord>,
    /// Not restored (the engine reads the seconds it needs while it runs), kept for `scan`.
    pub refusals: Vec<(String, RefusalsRecord)>,
    pub halves: Vec<(String, HalvesRecord)>,
    pub parked: Vec<(String, ParkedRecord)>,
    pub splits: Vec<SplitRecord>,
    /// Records that could not be read (damaged, or of a newer format version): skipped, each
    /// named here, the rest loaded.
    pub skipped: Vec<Skipped>,
    /// Under a [`DecidedBound`]: the decided chains past `keep`, newest first, as much of them
    /// as the engine remembers of a chain it forgot under its bound.
    pub forgotten: Vec<ForgottenDecided>,
    /// Under a [`DecidedBound`]: the decided chains past `forgotten` too, by trace. The engine
    /// will not know them; a store only this process writes deletes them (see `Link::load`).
    pub let_go: Vec<TraceId>,
    /// Decided chains read, kept or not.
    pub decided_read: u64,
    /// The bound of a load that keeps the newest decided chains only (`None`: every record).
    bound: Option<DecidedBound>,
}

/// How much of the decided chains a start-up load holds: the engine keeps at most `keep` for
/// revision (`max_decided`) and remembers `forgotten` more only by trace and operation keys
/// (late evidence for one reads it back from the store). The newest by decision time are
/// taken; what is older stays in the store, and is never all in memory at once: a shared store
/// holds every instance's chains of the late-span window, and reading all of them made a new
/// instance on a busy store hold several times its memory limit before it listened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecidedBound {
    pub keep: usize,
    pub forgotten: usize,
    /// Name the chains past both in [`Snapshot::let_go`] (16 bytes each): for a store only this
    /// process writes, which deletes them. A shared store's are its writers' to delete.
    pub name_let_go: bool,
}

/// A decided chain a bounded load did not hold whole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForgottenDecided {
    pub trace_id: TraceId,
    pub decided_at_ns: u64,
    /// The operation keys its calls named (a verifier naming one revises the chain).
    pub operation_keys: Vec<Box<str>>,
}

/// Records a bounded load holds before it drops the oldest: its bound and a quarter more, and
/// at least this many, so that a small bound does not sort at every record.
const BOUND_SLACK: usize = 1024;

/// A stored record the load left out, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    pub table: Table,
    pub key: String,
    pub why: SkipReason,
}

/// Why a stored record was not read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SkipReason {
    /// Its bytes do not decode in any layout this build knows.
    Damaged,
    /// It has a format version newer than this build reads: left as it is.
    Newer(u32),
}

impl SkipReason {
    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::Damaged => "damaged",
            SkipReason::Newer(_) => "newer_version",
        }
    }
}

impl Snapshot {
    /// An empty snapshot that keeps only the newest decided chains (see [`DecidedBound`]).
    pub fn bounded(bound: DecidedBound) -> Snapshot {
        Snapshot { bound: Some(bound), ..Default::default() }
    }

    fn push_decided(&mut self, r: DecidedRecord) {
        self.decided_read += 1;
        self.decided.push(r);
        if let Some(b) = self.bound {
            if self.decided.len() >= b.keep.saturating_add(b.keep / 4).max(BOUND_SLACK) {
                self.settle();
            }
        }
    }

    /// Under a bound: the decided chains newest first (one per trace and decision time), `keep`
    /// of them whole and `forgotten` more by trace and operation keys; the rest let go. Within
    /// one decision time the greater trace id counts as the newer, so what is kept does not
    /// depend on the order the store answered in. Without a bound: every chain once, by trace
    /// (a store's scan may return a key twice).
    pub fn settle(&mut self) {
        let Some(b) = self.bound else {
            self.decided.sort_by_key(|d| d.trace_id);
            self.decided.dedup_by_key(|d| d.trace_id);
            return;
        };
        let newest_first = |at: u64, t: &TraceId| std::cmp::Reverse((at, *t));
        self.decided.sort_unstable_by_key(|d| newest_first(d.decided_at_ns, &d.trace_id));
        self.decided.dedup_by(|a, b| a.trace_id == b.trace_id && a.decided_at_ns == b.decided_at_ns);
        if self.decided.len() > b.keep {
            let past = self.decided.drain(b.keep..).map(|d| ForgottenDecided {
                trace_id: d.trace_id,
                decided_at_ns: d.decided_at_ns,
                operation_keys: crate::evidence::operation_keys(&d.spans),
            });
            self.forgotten.extend(past);
        }
        self.forgotten.sort_unstable_by_key(|d| newest_first(d.decided_at_ns, &d.trace_id));
        self.forgotten.dedup_by(|a, b| a.trace_id == b.trace_id && a.decided_at_ns == b.decided_at_ns);
        // What falls past the bound now stays past it: each settle keeps the newest.
        let past = self.forgotten.len().min(b.forgotten);
        let gone = self.forgotten.drain(past..);
        if b.name_let_go {
            self.let_go.extend(gone.map(|d| d.trace_id));
        }
    }

    /// Add one stored record (`bytes` as [`Record::encode`], or 0.1.0, wrote them) to the
    /// snapshot. One that cannot be read is skipped and named ([`Snapshot::skipped`]): one record
    /// is never the reason to forget the rest. Whether it was read.
    pub fn push_encoded(&mut self, table: Table, key: &str, bytes: &[u8], read: ReadPolicy) -> bool {
        match Record::decode_with(table, key, bytes, read) {
            Ok(r) => {
                r.into_snapshot(key, self);
                true
            }
            Err(StoreError::Newer { version, .. }) => {
                self.skipped.push(Skipped { table, key: key.to_string(), why: SkipReason::Newer(version) });
                false
            }
            Err(_) => {
                self.skipped.push(Skipped { table, key: key.to_string(), why: SkipReason::Damaged });
                false
            }
        }
    }

    /// Add one record as it was put.
    pub fn push_record(&mut self, key: &str, r: &Record) {
        match r {
            Record::Session(r) => self.sessions.push((key.to_string(), (**r).clone())),
            Record::Incidents(r) => self.incidents.push((**r).clone()),
            Record::Decided(r) => self.push_decided((**r).clone()),
            Record::Operation(t) => self.operations.push((key.to_string(), *t)),
            Record::DriftReported(r) => self.drift_reported.push(r.clone()),
            Record::Refusals(r) => self.refusals.push((key.to_string(), (**r).clone())),
            Record::Halves(r) => self.halves.push((key.to_string(), (**r).clone())),
            Record::Parked(r) => self.parked.push((key.to_string(), (**r).clone())),
            Record::Split(r) => self.splits.push(r.clone()),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
            && self.incidents.is_empty()
            && self.decided.is_empty()
            && self.operations.is_empty()
            && self.drift_reported.is_empty()
            && self.refusals.is_empty()
            && self.halves.is_empty()
            && self.parked.is_empty()
            && self.splits.is_empty()
    }
}

/// A store of the engine's state. Object-safe; the engine is its only caller.
pub trait StateStore: Send {
    /// Every record stored.
    fn load(&mut self) -> Result<Snapshot, StoreError> {
        self.load_into(Snapshot::default())
    }
    /// Every record stored, into `into` (a [`Snapshot::bounded`] one keeps the newest decided
    /// chains only, and holds no more than its bound while it reads), settled.
    fn load_into(&mut self, into: Snapshot) -> Result<Snapshot, StoreError>;
    /// Apply the changes as one transaction: all of them or none. A shared store checks each
    /// record's version and refuses only the records another writer changed
    /// ([`StoreError::Conflict`]), writing the rest in the same transaction (see [`redis`](self::redis)).
    fn apply(&mut self, changes: &Changes) -> Result<(), StoreError>;
    /// One record, by table and key (a decided chain the engine forgot under its bounds, wanted
    /// back by a late span).
    fn get(&mut self, table: Table, key: &str) -> Result<Option<Record>, StoreError>;
    /// One record, read without becoming this store's view of it (a shared store's
    /// compare-and-set expects the version its writer last merged, not one a reader saw: the
    /// gate reads this way).
    fn peek(&mut self, table: Table, key: &str) -> Result<Option<Record>, StoreError> {
        self.get(table, key)
    }
    /// Several records of one table, in the order of `keys` (one round trip where the store can).
    fn get_many(&mut self, table: Table, keys: &[String]) -> Result<Vec<Option<Record>>, StoreError> {
        keys.iter().map(|k| self.get(table, k)).collect()
    }
    /// Whether the store answers at all (a network store: one round trip); used to notice that a
    /// store that failed is back when nothing else would touch it. `None`: this store cannot
    /// tell without an operation (only its next successful one says it is back).
    fn probe(&mut self) -> Option<Result<(), StoreError>> {
        None
    }
    /// Whether other instances write this store too (then the engine reads what they wrote
    /// while it runs, not only at start).
    fn is_shared(&self) -> bool {
        false
    }
    /// Several tables' records at once, `asks[i]` ↔ the answer's `[i]` (one round trip where
    /// the store can: a network store pipelines them).
    fn get_tables(&mut self, asks: &[(Table, Vec<String>)]) -> Result<Vec<Vec<Option<Record>>>, StoreError> {
        asks.iter().map(|(t, keys)| self.get_many(*t, keys)).collect()
    }
    /// Whether a call is a network round trip (then the engine's calls run on a thread of
    /// their own, `engine::shared::worker`); an in-process store answers inline.
    fn over_network(&self) -> bool {
        false
    }
    /// Every record of one table (a shared store's gauge leader counts them; see `lease`).
    fn scan(&mut self, table: Table) -> Result<Vec<(String, Record)>, StoreError> {
        let snap = self.load()?;
        let mut out = Vec::new();
        match table {
            Table::Sessions => out.extend(snap.sessions.into_iter().map(|(k, r)| (k, Record::Session(Box::new(r))))),
            Table::Incidents => {
                out.extend(snap.incidents.into_iter().map(|r| (server_key(r.server.as_deref()), Record::Incidents(Box::new(r)))))
            }
            Table::Decided => out.extend(snap.decided.into_iter().map(|r| (trace_key(&r.trace_id), Record::Decided(Box::new(r))))),
            Table::Operations => out.extend(snap.operations.into_iter().map(|(k, t)| (k, Record::Operation(t)))),
            Table::DriftReported => out.extend(snap.drift_reported.into_iter().map(|r| (r.key(), Record::DriftReported(r)))),
            Table::Refusals => out.extend(snap.refusals.into_iter().map(|(k, r)| (k, Record::Refusals(Box::new(r))))),
            Table::Halves => out.extend(snap.halves.into_iter().map(|(k, r)| (k, Record::Halves(Box::new(r))))),
            Table::Parked => out.extend(snap.parked.into_iter().map(|(k, r)| (k, Record::Parked(Box::new(r))))),
            Table::Splits => out.extend(snap.splits.into_iter().map(|r| (server_key(r.server.as_deref()), Record::Split(r)))),
        }
        Ok(out)
    }
    /// Take or renew, for `ttl`, the lease that makes this instance the one that reports the
    /// global gauges (open incidents, convergence) of all instances on a shared store; `false`:
    /// another instance holds it. A store with one writer always grants it.
    fn lease(&mut self, _ttl: Duration) -> Result<bool, StoreError> {
        Ok(true)
    }
    /// Speak state protocol `protocol` (at most [`format::PROTOCOL`]) from now on: announce it,
    /// and write records no newer than it. 0 is exactly 0.1.0's: bare records, and every client
    /// half of a split call published (no split marks). A store of one process ignores it.
    fn speak(&mut self, _protocol: u32) {}
    /// How records 0.1.0 wrote are to be read from now on (a store that decodes bytes keeps it).
    fn set_read_policy(&mut self, _read: ReadPolicy) {}
    /// Announce the protocol this instance speaks for `ttl` (renewed with the gauge lease), and
    /// answer the cluster's: the lowest protocol any live instance announced. Records are
    /// written in the cluster's format from then on, so that every live instance reads them. A
    /// store of one process is a cluster of one.
    fn announce(&mut self, _ttl: Duration) -> Result<u32, StoreError> {
        Ok(format::PROTOCOL)
    }
    /// Bytes the store holds on disk, where it knows (for the benchmark).
    fn bytes_on_disk(&self) -> Option<u64> {
        None
    }
    /// Round trips and bytes so far, where the store counts them (a network store).
    fn stats(&self) -> Option<StoreStats> {
        None
    }
}

/// What a network store has cost so far. Bytes are payload (keys, versions and record bytes),
/// not wire bytes: the protocol's framing adds a few bytes per argument.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Requests sent (a pipeline of many commands is one).
    pub round_trips: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Transactions refused because a record was changed by another writer.
    pub conflicts: u64,
    /// Record versions remembered for compare-and-set now, and how many were forgotten
    /// untouched (a shared store; see `state::versions`).
    pub versions_held: u64,
    pub versions_forgotten: u64,
    /// Deletes of decided chains and operation keys this store wrote with a lifetime, not sent:
    /// the lifetime ends them (a shared store; see `state::redis`).
    pub deletes_left_to_expire: u64,
    /// Records read while running (not at load) that could not be read, by table and reason:
    /// read as absent (see [`Snapshot::skipped`] for the load).
    pub skipped: SkipCounts,
}

/// Records skipped, by table and [`SkipReason`] (damaged, newer).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SkipCounts(pub [[u64; 2]; Table::ALL.len()]);

impl SkipCounts {
    pub fn add(&mut self, table: Table, why: SkipReason) {
        let t = Table::ALL.iter().position(|x| *x == table).unwrap_or(0);
        self.0[t][usize::from(matches!(why, SkipReason::Newer(_)))] += 1;
    }

    /// Each (table, reason) counted, with its count.
    pub fn entries(&self) -> impl Iterator<Item = (Table, &'static str, u64)> + '_ {
        Table::ALL.into_iter().enumerate().flat_map(move |(i, t)| {
            [("damaged", self.0[i][0]), ("newer_version", self.0[i][1])].into_iter().map(move |(why, n)| (t, why, n))
        })
    }

    pub fn total(&self) -> u64 {
        self.0.iter().flatten().sum()
    }
}

/// How a skipped record is named in the log: its table and key, the key of a session hashed (a
/// session key holds the session id, which can be a credential) and any other key through
/// `redact::ident` (an operation key is whatever a client chose).
pub(crate) fn shown_key(table: Table, key: &str) -> String {
    match table {
        Table::Sessions => crate::evidence::hash::session_hash(key).to_string(),
        _ => crate::normalize::redact::ident(key).into_string(),
    }
}

/// A store shared between the engine and whoever made it (tests, the benchmark, the gate): locked
/// for each call, by the engine's thread or its store thread (`engine::shared::worker`).
#[derive(Clone)]
pub struct StoreHandle(pub Arc<Mutex<Box<dyn StateStore>>>);

impl StoreHandle {
    pub fn new(store: impl StateStore + 'static) -> Self {
        StoreHandle(Arc::new(Mutex::new(Box::new(store))))
    }

    /// Open the embedded store in `directory` (created if missing).
    pub fn open_directory(directory: &std::path::Path) -> Result<Self, StoreError> {
        Ok(StoreHandle::new(EmbeddedStore::open(directory)?))
    }

    pub fn load(&self) -> Result<Snapshot, StoreError> {
        self.lock().load()
    }

    pub fn apply(&self, changes: &Changes) -> Result<(), StoreError> {
        self.lock().apply(changes)
    }

    pub fn bytes_on_disk(&self) -> Option<u64> {
        self.lock().bytes_on_disk()
    }

    pub fn stats(&self) -> Option<StoreStats> {
        self.lock().stats()
    }

    pub fn get_many(&self, table: Table, keys: &[String]) -> Result<Vec<Option<Record>>, StoreError> {
        self.lock().get_many(table, keys)
    }

    pub fn is_shared(&self) -> bool {
        self.lock().is_shared()
    }

    pub fn over_network(&self) -> bool {
        self.lock().over_network()
    }

    pub fn probe(&self) -> Option<Result<(), StoreError>> {
        self.lock().probe()
    }

    /// Open the shared Redis store (see [`redis`](self::redis)).
    pub fn open_redis(settings: RedisSettings) -> Result<Self, StoreError> {
        Ok(StoreHandle::new(RedisStore::open(settings)?))
    }

    pub fn get(&self, table: Table, key: &str) -> Result<Option<Record>, StoreError> {
        self.lock().get(table, key)
    }

    /// How records 0.1.0 wrote are read from now on (set once, when the store is opened).
    pub fn set_read_policy(&self, read: ReadPolicy) {
        self.lock().set_read_policy(read)
    }

    pub fn peek(&self, table: Table, key: &str) -> Result<Option<Record>, StoreError> {
        self.lock().peek(table, key)
    }

    pub fn scan(&self, table: Table) -> Result<Vec<(String, Record)>, StoreError> {
        self.lock().scan(table)
    }

    pub fn lease(&self, ttl: Duration) -> Result<bool, StoreError> {
        self.lock().lease(ttl)
    }

    pub fn speak(&self, protocol: u32) {
        self.lock().speak(protocol)
    }

    pub fn announce(&self, ttl: Duration) -> Result<u32, StoreError> {
        self.lock().announce(ttl)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Box<dyn StateStore>> {
        // A panic while holding the lock leaves the store as its last transaction left it.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl std::fmt::Debug for StoreHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StoreHandle")
    }
}

/// [`encode_into`] a new buffer (the tests' measure of a record's size).
#[cfg(test)]
pub(crate) fn encode<T: Serialize + ?Sized>(v: &T) -> Result<Vec<u8>, StoreError> {
    let mut out = Vec::new();
    encode_into(v, &mut out)?;
    Ok(out)
}

/// Encode a record (postcard), framed with this build's format version, appended to `out` (which
/// holds part of it if the record cannot be encoded).
pub(crate) fn encode_into<T: Serialize + ?Sized>(v: &T, out: &mut Vec<u8>) -> Result<(), StoreError> {
    format::frame_into(out);
    postcard::serialize_with_flavor(v, Append(out)).map_err(|e| StoreError::Backend(format!("encode: {e}")))
}

/// postcard's output appended to a `Vec` by its own `push` and `extend_from_slice` (the same
/// bytes as `postcard::to_extend`, for fewer instructions a byte: a record's identifiers are
/// written a byte at a time).
struct Append<'a>(&'a mut Vec<u8>);

impl postcard::ser_flavors::Flavor for Append<'_> {
    type Output = ();

    #[inline]
    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.0.push(data);
        Ok(())
    }

    #[inline]
    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        self.0.extend_from_slice(data);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

/// Decode a record of `table` stored under `key`.
pub(crate) fn decode<T: DeserializeOwned>(table: Table, key: &str, bytes: &[u8]) -> Result<T, StoreError> {
    postcard::from_bytes(bytes).map_err(|e| StoreError::Decode { table: table.as_str(), key: key.to_string(), message: e.to_string() })
}

#[cfg(test)]
mod redis_tests;
#[cfg(test)]
mod tests;
