//! A shared store in Redis (or Valkey): `storage: {kind: redis, endpoint: redis://host:port}`.
//!
//! # Layout
//! Each record is one string at `mcp-health:<table>:<key>`: the number of the transaction that
//! last wrote it in decimal, `:`, then the record's bytes as [`Record::encode`] wrote them; a
//! tombstone is the number alone. Transaction numbers come from one counter,
//! `mcp-health:version` (`INCR`), so a version is never reused — not after a delete, not by
//! another instance — and compare-and-set on it cannot be fooled by a record deleted and written
//! again (ABA).
//!
//! Decided chains and their operation keys are written with a lifetime (`record_life`, past the
//! late-span window; see [`lives`]): their writer deletes them when it forgets them, but one it
//! stopped tracking first (pushed out of its bounds, older than its start read, or killed) would
//! otherwise stay for good, and they are most of what a cluster writes. Records written before
//! this lifetime existed keep none until they are written again or deleted. Their delete by the
//! store that wrote them is left to that lifetime while every instance speaks this protocol (no
//! tombstone: see `apply`).
//!
//! Releases 0.1.0 and 0.2.0 (state protocols 0 and 1) wrote each record as a hash of two fields,
//! `v` (the bytes) and `ver` (the number), which costs Redis two or three commands per write
//! where a string costs one (`SET … GET`, see [`scripts::APPLY`]). Records are written as hashes while the
//! cluster speaks protocol 1 or lower (an older instance is announced) and until this store has
//! heard the cluster's protocol at all; both layouts are read always, and a write turns a record
//! into the layout the cluster speaks. An instance of 0.2.0 that joins a store protocol 2 wrote
//! meets strings it cannot read (`WRONGTYPE`): its reads fail, so its verdicts are
//! `store_unavailable`, never greener, and the records return to hashes as they are rewritten.
//!
//! # Compare-and-set
//! The store remembers, per key, the version this instance last read (`load`, `get`) or wrote
//! (`apply`); a key it never saw is expected to be absent. [`StateStore::apply`] is one round
//! trip: the puts of keys expected absent that no index counts (new decided chains and operation
//! keys, most of what is written) each a `SET … NX`, pipelined, which writes it unless its key
//! is there (those are then sent again through the script); then one Lua script that checks
//! every other key's version against what this instance expects and writes every put and delete
//! whose key passed, all under one transaction number. Redis runs a command and a script alone,
//! so two instances writing the same record cannot both pass: the loser's change of that
//! record is refused and `apply` answers [`StoreError::Conflict`] naming it (and counts every
//! refused record in [`StoreStats::conflicts`]). The check is per record, not per transaction:
//! the records are independent (each is whole under its key) and some are written by every
//! instance (a server's recent healthy calls, an incident of a shared cause), so refusing the
//! whole write on one shared record would stop an instance persisting anything else. The loser
//! keeps its stale expectation, so it goes on being refused for that record rather than
//! overwriting the winner with what it alone saw (until it reads the record again); the engine
//! counts each refusal (`mcp_health.state.store_conflicts`), reads the record again, merges and
//! writes the union at its next write (sessions, a server's incidents, the shared lists), and
//! emits a transition only when its own write made it. A record that
//! disappeared from Redis (deleted by another instance, or lost in a Redis restart without
//! persistence) is a conflict too, never silently re-created; a delete leaves a tombstone (the
//! version, no bytes) for `tombstone_ttl`, so an instance that never saw the record cannot write
//! it back in that time.
//!
//! What an instance remembers of each key's version is forgotten once the key has not been
//! touched for a while (`remember_for`, or `tombstone_ttl` for the shared lists that expire
//! anyway; [`Versions`]), and its own deletes of keys never written again (decided chains, list
//! records) are not remembered at all: the map is bounded by what the
//! instance touches in that time, not by everything it ever saw. A version forgotten too early
//! costs one conflict and a read, never a wrong write.
//!
//! # Sync, on a thread of its own
//! The client is the `redis` crate (redis-rs, the maintained Rust client; 1.x) with its
//! synchronous connection, not its async one or `fred`: the store is called from one thread, the
//! engine's store thread (`engine::shared::worker`; [`StateStore::over_network`] says so), which
//! runs the engine's calls in order while the engine goes on, so a round trip is never on the
//! engine's path. An async client would need a runtime handle inside the engine's step or a
//! rewrite of the engine around `.await`, for no gain over that thread (the gate's reads share
//! the connection, under the store's lock). A write round's commands and answers go over a second
//! connection of the store's own ([`round_socket`]), whose reader takes the round's few kinds of
//! answer far more cheaply than the crate's. Every socket operation is bounded by `storage.timeout` (connect, read, write), and
//! after a failure the store does not try to reconnect for `storage.retry_after`, answering
//! [`StoreError::Backend`] at once, so a store that hangs or is down costs the engine at most one
//! timeout per `retry_after`, never a stall per step.
//!
//! # Secrets
//! The endpoint may carry a password (`redis://:password@host:port`). It is kept only inside the
//! client; everything this module logs or returns names [`redact`]'s form of it.
//!
//! Redis Cluster is not supported: one `apply` script touches the records of one write (decided
//! chains by trace, sessions, a server's incidents, list records by second or key) and the one
//! version counter, so keys of many hash slots. Hash tags cannot group them by server or session:
//! a reader finds a record from its lookup key alone (a trace id, an operation key, a second), so
//! the tag would have to be the record's own key, one slot per record; the script would then be
//! one per record (the check is per record already, so nothing is lost), but the version counter
//! must stay never reused per key across deletes (ABA), which one counter per slot cannot promise
//! once a tombstone expires. See docs/multi-instance.md.

use std::time::{Duration, Instant};

use ::redis::{Client, Connection, ConnectionLike};

use super::versions::Versions;
use super::{Changes, Record, Snapshot, StateStore, StoreError, StoreStats, Table};

mod resp;
mod round_socket;
mod scripts;

use scripts::{ANNOUNCE_SCRIPT, APPLY_SCRIPT, LEASE_SCRIPT, UNINDEX_SCRIPT};

/// Prefix of every key this store writes.
pub(crate) const PREFIX: &str = "mcp-health";
/// How many keys one `SCAN` step asks for.
const SCAN_COUNT: usize = 500;
/// The apply's buffer is kept between applies up to this capacity, or twice what the last apply
/// used.
const PACKED_KEEP: usize = 4 << 20;

/// Bytes of a round's `SET`s packed before they are written to the connection: Redis takes them
/// in while the store's thread encodes the next (one write of everything at the end left Redis
/// idle while a round was encoded, and the store's thread idle while Redis ran it).
const SEND_EVERY: usize = 64 << 10;

/// The length a round's first record is packed for (see [`resp::bulk_filled`]; each next one
/// for its predecessor's): three digits, as most records of a decided chain take.
const RECORD_GUESS: usize = 500;

/// One key of a table as `SCAN` found it: key, bytes (none for a tombstone), version.
type Scanned = (String, Option<Vec<u8>>, u64);

/// What this instance last knew of a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seen {
    /// A record at this version.
    Record(u64),
    /// A record at this version that this store wrote, so with its lifetime where its table
    /// [`lives`]: a delete of such a decided chain is left to that lifetime (see `apply`).
    Written(u64),
    /// Deleted at this version (a tombstone, or nothing once it expired).
    Deleted(u64),
    /// A record at this version that this store wrote with its lifetime and then deleted by
    /// leaving it to that lifetime (see `apply`): there at this version, or absent once it ended.
    Lapsing(u64),
}

/// How to reach Redis and how long to wait for it.
#[derive(Clone)]
pub struct RedisSettings {
    /// `redis://[user:password@]host:port[/db]`; may hold a secret.
    pub endpoint: String,
    /// Bound of each connect, read and write.
    pub timeout: Duration,
    /// After a failure, how long the store answers errors at once before it tries again.
    pub retry_after: Duration,
    /// How long a deleted record's tombstone (its version, without bytes) stays in Redis, so an
    /// instance that never saw the record cannot write it back within that time.
    pub tombstone_ttl: Duration,
    /// How long a record's version is remembered untouched before it is forgotten (between
    /// once and twice this; see [`Versions`]): at least the longest gap between two writes of
    /// one record by its instance — `late_span_window` for a decided chain, a session's idle
    /// expiry.
    pub remember_for: Duration,
    /// How long a decided chain's record and its operation keys live after their last write:
    /// past `late_span_window` (when their writer deletes them), so that the ones no instance
    /// tracks any longer — pushed out of an instance's bounds, older than a start reads, or
    /// left by an instance that was killed — do not stay in Redis for good.
    pub record_life: Duration,
}

impl std::fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSettings")
            .field("endpoint", &redact(&self.endpoint))
            .field("timeout", &self.timeout)
            .field("retry_after", &self.retry_after)
            .field("tombstone_ttl", &self.tombstone_ttl)
            .field("remember_for", &self.remember_for)
            .field("record_life", &self.record_life)
            .finish()
    }
}

/// The endpoint with any password replaced by `***` (user names are kept: they are not secret,
/// and they tell which ACL user is used).
pub(crate) fn redact(endpoint: &str) -> String {
    let Some((scheme, rest)) = endpoint.split_once("://") else {
        // Not a URL: nothing can be told apart from a secret.
        return "<endpoint>".to_string();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            let (user, pw) = if userinfo.contains(':') { (user, ":***") } else { ("", "***") };
            format!("{scheme}://{user}{pw}@{host}{path}")
        }
        None => format!("{scheme}://{authority}{path}"),
    }
}

/// The Redis store. See the module documentation.
pub(crate) struct RedisStore {
    client: Client,
    settings: RedisSettings,
    /// The endpoint as it may be shown.
    shown: String,
    conn: Option<Connection>,
    /// The write rounds' own connection (see [`round_socket`]).
    socket: Option<round_socket::RoundSocket>,
    /// No connection is tried before this (after a failure).
    down_until: Option<Instant>,
    /// What this instance last read or wrote, per (table, key), forgotten when untouched for
    /// long (see [`Versions`]).
    versions: Versions<Seen>,
    /// How records 0.1.0 wrote are read (see [`super::ReadPolicy`]).
    read: super::ReadPolicy,
    stats: StoreStats,
    /// Who this store is when it holds the gauge lease: the process id and a random number
    /// (two processes on one host differ by pid, two hosts by the number).
    holder: String,
    /// The state protocol this instance speaks (announced), and the one its records are written
    /// in: the cluster's protocol, as last announced (see [`StateStore::announce`]). Until an
    /// announcement is answered it is the last protocol before one-string records: an older
    /// instance that announces (0.2.0 does) may share the store, and records it cannot read are
    /// written only once the cluster is known to read them.
    speaks: u32,
    writes: u32,
    /// The transaction number the next apply writes under, taken (`INCR`) by the last one, so
    /// that the client writes it in front of each value and the script copies nothing: `None`
    /// at first and after any failure (an apply whose answer was lost may have written under
    /// it, so it is never used twice), when an `INCR` of its own takes one.
    reserved: Option<u64>,
    /// The apply's command as sent, kept from one apply to the next.
    packed: Vec<u8>,
}

fn backend(shown: &str, e: &impl std::fmt::Display) -> StoreError {
    // A RedisError's text names the failure (refused, timed out, NOAUTH, WRONGPASS), not the URL.
    StoreError::Backend(format!("redis at {shown}: {e}"))
}

/// `mcp-health:<table>:<key>`, the key of a record, in parts: the commands are packed from
/// them without building the key.
fn key_parts(table: Table, key: &str) -> [&str; 5] {
    [PREFIX, ":", table.as_str(), ":", key]
}

/// The key of a record, joined in one allocation: the read groups name thousands of keys a
/// second, and `format!`'s machinery was a tenth of the store thread's instructions.
fn record_key(table: Table, key: &str) -> String {
    key_parts(table, key).concat()
}

/// The tables the gauge lease's holder counts every few seconds ([`StateStore::scan`]): each
/// keeps an index set of its record keys, so the count reads that table's records and does not
/// walk the whole keyspace (every decided chain) with `SCAN`. The set is written by the apply
/// script with each record, rebuilt from a full `SCAN` at [`StateStore::load`] (records an older
/// version wrote without it), and a member whose record has expired is removed when a count
/// finds it gone.
fn indexed(table: Table) -> bool {
    matches!(table, Table::Sessions | Table::Incidents)
}

/// Tables whose keys a writer may create again after deleting them (see `apply`): all but the
/// decided chains (a trace's chain is not decided again once its late-span window has passed)
/// and the shared lists (keyed by a past second, or expiring anyway).
fn recreated(table: Table) -> bool {
    !(table == Table::Decided || table.expires())
}

/// Tables whose records are written with a lifetime (`record_life`): the decided chains and their
/// operation keys, most of what a cluster writes, and the records whose writer may stop
/// tracking them before it deletes them. The lifetime starts again at every write, and their
/// writer writes them only within `late_span_window` of their decision, so a record expires
/// before its writer is done with it only when a write comes more than the margin late (a store
/// that was down): that write is then a conflict, as for any record that disappeared, never a
/// silent re-creation. Unlike [`Table::expires`], absent is not what a reader expects of them.
fn lives(table: Table) -> bool {
    matches!(table, Table::Decided | Table::Operations)
}

/// A duration in whole milliseconds for Redis (`PX`, `PEXPIRE`): at least one.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

fn index_key(table: Table) -> String {
    format!("{PREFIX}:index:{}", table.as_str())
}

impl RedisStore {
    /// A store on `settings.endpoint`. The endpoint must parse, and Redis must answer a `PING`:
    /// asked for a shared store and not getting it is an error at start, not a silent downgrade.
    pub(crate) fn open(settings: RedisSettings) -> Result<Self, StoreError> {
        let shown = redact(&settings.endpoint);
        let client = Client::open(settings.endpoint.as_str()).map_err(|e| backend(&shown, &e))?;
        let versions = Versions::new(settings.remember_for, settings.tombstone_ttl);
        let mut s = RedisStore {
            client,
            settings,
            shown,
            conn: None,
            socket: None,
            down_until: None,
            versions,
            read: super::ReadPolicy::default(),
            stats: StoreStats::default(),
            holder: {
                use std::hash::{BuildHasher, Hasher};
                let mut h = std::collections::hash_map::RandomState::new().build_hasher();
                h.write_u32(std::process::id());
                format!("{}-{:016x}", std::process::id(), h.finish())
            },
            speaks: super::format::PROTOCOL,
            writes: super::format::STRING_RECORDS_SINCE - 1,
            reserved: None,
            packed: Vec::new(),
        };
        let pong: String = s.with_conn(|c| ::redis::cmd("PING").query(c))?;
        if pong != "PONG" {
            return Err(StoreError::Backend(format!("redis at {}: PING answered {pong:?}", s.shown)));
        }
        Ok(s)
    }

    /// Run `f` on the connection, connecting first if needed. A failure of the connection (I/O,
    /// timeout, dropped) forgets it and holds further attempts off for `retry_after`.
    fn with_conn<T>(&mut self, f: impl FnOnce(&mut Connection) -> ::redis::RedisResult<T>) -> Result<T, StoreError> {
        self.ensure_conn()?;
        let Some(conn) = self.conn.as_mut() else { unreachable!("connected above") };
        self.stats.round_trips += 1;
        match f(conn) {
            Ok(v) => {
                self.down_until = None;
                Ok(v)
            }
            Err(e) => Err(self.conn_failed(e)),
        }
    }

    /// Connect unless connected (not again before `retry_after` has passed since a failure).
    fn ensure_conn(&mut self) -> Result<(), StoreError> {
        if self.conn.is_none() {
            self.held_off()?;
            let conn = match self.connect() {
                Ok(c) => c,
                Err(e) => {
                    self.down_until = Some(Instant::now() + self.settings.retry_after);
                    return Err(backend(&self.shown, &e));
                }
            };
            self.conn = Some(conn);
        }
        Ok(())
    }

    /// An error at once while connecting is held off, `retry_after` from the last failure.
    fn held_off(&self) -> Result<(), StoreError> {
        match self.down_until {
            Some(t) if Instant::now() < t => Err(StoreError::Backend(format!("redis at {} is unavailable; retrying shortly", self.shown))),
            _ => Ok(()),
        }
    }

    /// Both connections forgotten (what broke one, Redis restarted, the clients killed, the
    /// network, most likely broke both), and connecting held off for `retry_after`.
    fn forget_connections(&mut self) {
        self.conn = None;
        self.socket = None;
        self.down_until = Some(Instant::now() + self.settings.retry_after);
    }

    /// An error of the connection: one that leaves it unusable (I/O, timeout, dropped) forgets
    /// it and holds further attempts off for `retry_after`.
    fn conn_failed(&mut self, e: ::redis::RedisError) -> StoreError {
        if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_unrecoverable_error() {
            self.forget_connections();
        }
        backend(&self.shown, &e)
    }

    /// Connect the rounds' own connection unless connected (not again before `retry_after` has
    /// passed since a failure of either connection).
    fn ensure_socket(&mut self) -> Result<(), StoreError> {
        if self.socket.is_none() {
            self.held_off()?;
            match round_socket::RoundSocket::connect(self.client.get_connection_info(), self.settings.timeout) {
                Ok(w) => self.socket = Some(w),
                Err(e) => return Err(self.socket_failed(e)),
            }
        }
        Ok(())
    }

    /// A failure of the rounds' connection: it is forgotten (its answers may be out of step), and
    /// so is the other (see [`Self::forget_connections`]).
    fn socket_failed(&mut self, e: round_socket::SocketError) -> StoreError {
        self.forget_connections();
        backend(&self.shown, &e)
    }

    /// The answers to a round's commands (`packed`: those not sent yet, which go now): the
    /// `SET … NX` changes that found their key taken, the number the script or the `INCR` took
    /// for the next apply, and the script's refusals (1-based, among `plan.scripted`). Every
    /// answer is read before an error is returned, so the connection stays in step.
    fn round_answers(
        &mut self,
        socket: &mut round_socket::RoundSocket,
        packed: &[u8],
        plan: &Plan,
    ) -> Result<(Vec<usize>, u64, Vec<usize>), RoundError> {
        use round_socket::Answer;
        socket.send(packed).map_err(RoundError::Socket)?;
        let (mut taken, mut refused) = (Vec::new(), None);
        for &i in &plan.direct {
            match socket.answer().map_err(RoundError::Socket)? {
                Answer::Nil => taken.push(i),
                Answer::Error(e) => {
                    refused.get_or_insert(e);
                }
                _ => {}
            }
        }
        let mut last = socket.answer().map_err(RoundError::Socket)?;
        if last.error_code() == Some("NOSCRIPT") {
            // Redis restarted (or its scripts were flushed) since the last apply: the script
            // alone again (the `SET`s before it have run).
            let _: String = self.with_conn(|c| APPLY_SCRIPT.load(c)).map_err(RoundError::Store)?;
            socket.send(&packed[plan.script_at..]).map_err(RoundError::Socket)?;
            last = socket.answer().map_err(RoundError::Socket)?;
        }
        let shown = &self.shown;
        if let Some(e) = refused {
            return Err(RoundError::Store(backend(shown, &e)));
        }
        let unexpected = || RoundError::Store(backend(shown, &"unexpected answer to a write"));
        let count = |n: &Answer| match n {
            Answer::Integer(n) => u64::try_from(*n).ok(),
            _ => None,
        };
        match last {
            Answer::Error(e) => Err(RoundError::Store(backend(shown, &e))),
            n @ Answer::Integer(_) if plan.scripted.is_empty() => Ok((taken, count(&n).ok_or_else(unexpected)?, Vec::new())),
            Answer::Array(parts) if !plan.scripted.is_empty() => match parts.as_slice() {
                [n, Answer::Array(bad)] => {
                    let next = count(n).ok_or_else(unexpected)?;
                    let bad = bad
                        .iter()
                        .map(|b| count(b).and_then(|b| usize::try_from(b).ok()))
                        .collect::<Option<Vec<_>>>()
                        .ok_or_else(unexpected)?;
                    Ok((taken, next, bad))
                }
                _ => Err(unexpected()),
            },
            _ => Err(unexpected()),
        }
    }

    fn connect(&self) -> ::redis::RedisResult<Connection> {
        let c = self.client.get_connection_with_timeout(self.settings.timeout)?;
        c.set_read_timeout(Some(self.settings.timeout))?;
        c.set_write_timeout(Some(self.settings.timeout))?;
        Ok(c)
    }

    fn saw_deleted(&mut self, table: Table, key: String, ver: u64) {
        self.versions.insert(table, key, Seen::Deleted(ver));
    }

    /// A record read at version `ver`. One that cannot be read is counted, named in the log, and
    /// read as absent: a damaged one is remembered at its version (this instance's write then
    /// replaces it), one of a newer format is not (this instance expects the key absent, so its
    /// writes are refused as conflicts and never overwrite what a newer build wrote).
    fn read_record(&mut self, table: Table, key: &str, bytes: &[u8], ver: u64) -> Option<Record> {
        self.stats.bytes_received += bytes.len() as u64;
        match Record::decode_with(table, key, bytes, self.read) {
            Ok(r) => {
                self.versions.insert(table, key.to_string(), Seen::Record(ver));
                Some(r)
            }
            Err(e) => {
                let why = match e {
                    StoreError::Newer { version, .. } => super::SkipReason::Newer(version),
                    _ => {
                        self.versions.insert(table, key.to_string(), Seen::Record(ver));
                        super::SkipReason::Damaged
                    }
                };
                self.stats.skipped.add(table, why);
                tracing::warn!(table = table.as_str(), key = %super::shown_key(table, key), reason = why.as_str(), "a state record could not be read; taken as absent");
                None
            }
        }
    }

    /// A record's bytes read without remembering its version (a peek, a count): one that cannot
    /// be read is counted as skipped, by why, and read as absent.
    fn decode_counted(&mut self, table: Table, key: &str, bytes: &[u8]) -> Option<Record> {
        match Record::decode_with(table, key, bytes, self.read) {
            Ok(r) => Some(r),
            Err(e) => {
                let why =
                    if let StoreError::Newer { version, .. } = e { super::SkipReason::Newer(version) } else { super::SkipReason::Damaged };
                self.stats.skipped.add(table, why);
                None
            }
        }
    }

    /// Every (key, bytes, version) of `table`, by `SCAN` (the whole keyspace, or with `by_index`
    /// the table's index set by `SSCAN`) and [`Self::fetch`] in batches; a tombstone has no bytes.
    fn scan_table(&mut self, table: Table, by_index: bool) -> Result<Vec<Scanned>, StoreError> {
        let mut out = Vec::new();
        self.scan_table_each(table, by_index, &mut |_, row| out.push(row))?;
        // A `SCAN` (or `SSCAN`) may return a key twice (the table rehashed meanwhile): once
        // each, so nothing is counted twice.
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out.dedup_by(|a, b| a.0 == b.0);
        Ok(out)
    }

    /// One row a load scanned, into `s`; its version remembered (a tombstone's as deleted).
    fn load_row(&mut self, s: &mut Snapshot, t: Table, (key, bytes, ver): Scanned) {
        match bytes {
            Some(bytes) => {
                // A record of a newer format is not remembered: this instance expects the key
                // absent, so its writes never overwrite it (a conflict instead).
                if s.push_encoded(t, &key, &bytes, self.read) || s.skipped.last().is_some_and(|k| k.why == super::SkipReason::Damaged) {
                    self.versions.insert(t, key, Seen::Record(ver));
                }
            }
            None => self.saw_deleted(t, key, ver),
        }
    }

    /// [`Self::scan_table`] a page at a time: each row handed to `each` as it is read, so that
    /// a caller that keeps a bounded part of a large table never holds all of it. A key may
    /// come twice.
    fn scan_table_each(&mut self, table: Table, by_index: bool, each: &mut dyn FnMut(&mut Self, Scanned)) -> Result<(), StoreError> {
        let prefix = format!("{PREFIX}:{}:", table.as_str());
        let pattern = format!("{prefix}*");
        let index = index_key(table);
        let mut cursor: u64 = 0;
        loop {
            let (next, keys): (u64, Vec<Vec<u8>>) = if by_index {
                self.with_conn(|c| ::redis::cmd("SSCAN").arg(&index).arg(cursor).arg("COUNT").arg(SCAN_COUNT).query(c))?
            } else {
                self.with_conn(|c| ::redis::cmd("SCAN").arg(cursor).arg("MATCH").arg(&pattern).arg("COUNT").arg(SCAN_COUNT).query(c))?
            };
            if !keys.is_empty() {
                let rows = self.fetch(&keys)?;
                let mut gone: Vec<Vec<u8>> = Vec::new();
                for (k, row) in keys.into_iter().zip(rows) {
                    // Gone between SCAN and the read (an expired tombstone): nothing to know. An
                    // index member whose record expired leaves the index.
                    let (v, ver) = match row {
                        Stored::Absent => {
                            if by_index {
                                gone.push(k);
                            }
                            continue;
                        }
                        Stored::Deleted(ver) => (None, ver),
                        Stored::Record(ver, v) => (Some(v), ver),
                    };
                    if by_index && !k.starts_with(prefix.as_bytes()) {
                        continue;
                    }
                    let key = String::from_utf8(k[prefix.len()..].to_vec()).map_err(|_| StoreError::Decode {
                        table: table.as_str(),
                        key: String::from_utf8_lossy(&k).into_owned(),
                        message: "key is not UTF-8".into(),
                    })?;
                    self.stats.bytes_received += (key.len() + v.as_ref().map_or(0, Vec::len)) as u64;
                    each(self, (key, v, ver));
                }
                if !gone.is_empty() {
                    let mut inv = UNINDEX_SCRIPT.prepare_invoke();
                    inv.key(&index);
                    for k in &gone {
                        inv.key(k.as_slice());
                    }
                    let _: u64 = self.with_conn(|c| inv.invoke(c))?;
                }
            }
            cursor = next;
            if cursor == 0 {
                return Ok(());
            }
        }
    }
}

impl RedisStore {
    /// One write's commands, in RESP, into `out`: the puts of new keys that no index counts, each
    /// a `SET … NX` (when `direct`; Redis takes them without a script, which is most of what a
    /// cluster writes; `PX` their lifetime where the table [`lives`]), then the script with the
    /// rest, or an `INCR` of the version counter when nothing is left for it (the next apply's
    /// number is taken either way). `seen`: what this store knew of each change's key, by the
    /// change's index. The payload bytes, and which changes went which way. `flush` is handed
    /// the `SET`s packed so far each time they reach [`SEND_EVERY`] bytes, and `out` starts
    /// again (`false`: they could not be sent, and the round stops).
    #[allow(clippy::too_many_arguments)]
    fn pack_round(
        &mut self,
        changes: &Changes,
        seen: &[Option<Seen>],
        which: &[usize],
        version: u64,
        direct: bool,
        out: &mut Vec<u8>,
        flush: &mut dyn FnMut(&[u8]) -> bool,
    ) -> Result<(usize, Plan), StoreError> {
        out.clear();
        let strings = self.writes >= super::format::STRING_RECORDS_SINCE;
        let mut plan = Plan::default();
        let quick = |c: &super::Change, seen: Option<Seen>| {
            direct && strings && c.value.is_some() && !c.table.expires() && !indexed(c.table) && seen.is_none()
        };
        // A key twice in one apply (nothing the engine writes, but nothing forbids it either)
        // goes to the script, which tracks keys only then: the table it takes costs every record
        // otherwise.
        let twice = {
            // Sized at once: grown from empty, its rehashes cost more than its inserts.
            let mut keys: rustc_hash::FxHashSet<(Table, &str)> =
                rustc_hash::FxHashSet::with_capacity_and_hasher(which.len(), Default::default());
            !which.iter().filter_map(|i| changes.changes.get(*i)).all(|c| keys.insert((c.table, c.key.as_str())))
        };
        for &i in which {
            let Some(c) = changes.changes.get(i) else { continue };
            if !twice && quick(c, seen.get(i).copied().flatten()) {
                plan.direct.push(i);
            } else {
                plan.scripted.push(i);
            }
        }
        let mut sent = 0;
        if !plan.direct.is_empty() {
            let mut ver = [0; 20];
            let ver = resp::digits(version, &mut ver);
            let format = super::format::format_of(self.writes);
            // What every `SET` of the round starts and ends with, packed once: `SET` with its
            // argument count, then `NX`, and `PX` the records' lifetime where the table lives.
            let packed_once = |count: Option<usize>, args: &[&[u8]]| {
                let mut b = Vec::with_capacity(32);
                if let Some(n) = count {
                    resp::array(&mut b, n);
                }
                for a in args {
                    resp::bulk(&mut b, &[a]);
                }
                b
            };
            let mut life = [0; 20];
            let life = resp::digits(millis(self.settings.record_life), &mut life);
            let (set_lived, set) = (packed_once(Some(6), &[b"SET"]), packed_once(Some(4), &[b"SET"]));
            let (lived_tail, nx) = (packed_once(None, &[b"NX", b"PX", life]), packed_once(None, &[b"NX"]));
            let mut guess = RECORD_GUESS;
            for c in plan.direct.iter().filter_map(|i| changes.changes.get(*i)) {
                let lived = lives(c.table);
                out.extend_from_slice(if lived { &set_lived } else { &set });
                let parts = key_parts(c.table, &c.key).map(str::as_bytes);
                sent += parts.iter().map(|x| x.len()).sum::<usize>();
                resp::bulk(out, &parts);
                guess = resp::bulk_filled(out, guess, |out| {
                    out.extend_from_slice(ver);
                    out.push(b':');
                    c.value.as_ref().map_or(Ok(()), |r| r.encode_into(format, out))
                })?;
                sent += guess - ver.len() - 1;
                out.extend_from_slice(if lived { &lived_tail } else { &nx });
                if out.len() >= SEND_EVERY {
                    if !flush(out) {
                        return Err(StoreError::Backend("the round could not be sent".into()));
                    }
                    out.clear();
                }
            }
        }
        plan.script_at = out.len();
        if plan.scripted.is_empty() {
            resp::array(out, 2);
            resp::bulk(out, &[b"INCR"]);
            resp::bulk(out, &[PREFIX.as_bytes(), b":version"]);
        } else {
            let scripted = std::mem::take(&mut plan.scripted);
            sent += self.pack_apply(changes, seen, &scripted, version, twice, out)?;
            plan.scripted = scripted;
        }
        Ok((sent, plan))
    }

    /// The apply script's `EVALSHA` for the changes `which` of `changes`, in RESP, appended to
    /// `out`; the payload bytes (keys, expectations, operations and records) it carries.
    /// `twice`: a key occurs twice among them (the script then tracks keys).
    fn pack_apply(
        &mut self,
        changes: &Changes,
        seen: &[Option<Seen>],
        which: &[usize],
        version: u64,
        twice: bool,
        out: &mut Vec<u8>,
    ) -> Result<usize, StoreError> {
        let n = which.len();
        let p = PREFIX.as_bytes();
        // EVALSHA, the script's SHA-1, the number of keys, the keys, then the arguments.
        resp::array(out, 3 + (1 + n) + (2 + 3 * n));
        resp::bulk(out, &[b"EVALSHA"]);
        resp::bulk(out, &[APPLY_SCRIPT.get_hash().as_bytes()]);
        resp::bulk_number(out, b"", 1 + n as u64);
        resp::bulk(out, &[p, b":version"]);
        let mut sent = 0;
        let picked = || which.iter().filter_map(|i| changes.changes.get(*i));
        for c in picked() {
            let parts = key_parts(c.table, &c.key).map(str::as_bytes);
            sent += parts.iter().map(|x| x.len()).sum::<usize>();
            resp::bulk(out, &parts);
        }
        let (mut tomb, mut life) = ([0; 20], [0; 20]);
        let tomb = resp::digits(millis(self.settings.tombstone_ttl), &mut tomb);
        let life = resp::digits(millis(self.settings.record_life), &mut life);
        resp::bulk(out, &[tomb, b":", life]);
        let strings = self.writes >= super::format::STRING_RECORDS_SINCE;
        let mode: &[u8] = match (strings, twice) {
            (true, false) => b"s",
            (true, true) => b"S",
            (false, false) => b"h",
            (false, true) => b"H",
        };
        let mut ver = [0; 20];
        let ver = resp::digits(version, &mut ver);
        resp::bulk(out, &[mode, ver]);
        // Index every write while a 0.1.0 instance (which indexes nothing) shares the store.
        let join = if self.writes == 0 { b'+' } else { b'=' };
        let format = super::format::format_of(self.writes);
        let mut guess = RECORD_GUESS;
        for (i, c) in which.iter().filter_map(|i| changes.changes.get(*i).map(|c| (*i, c))) {
            let op = match (&c.value, c.table.expires()) {
                (Some(_), false) if lives(c.table) => b'l',
                (Some(_), false) => b'p',
                (Some(_), true) => b'x',
                (None, false) => b'd',
                (None, true) => b'e',
            };
            let seen = seen.get(i).copied().flatten();
            let kind = match seen {
                None => b'a',
                Some(Seen::Record(_) | Seen::Written(_)) => b'r',
                Some(Seen::Deleted(_)) => b't',
                Some(Seen::Lapsing(_)) => b'w',
            };
            if indexed(c.table) {
                let parts: [&[u8]; 4] = [&[op, join, kind], p, b":index:", c.table.as_str().as_bytes()];
                sent += parts.iter().map(|x| x.len()).sum::<usize>();
                resp::bulk(out, &parts);
            } else {
                sent += 3;
                resp::bulk(out, &[&[op, b'-', kind]]);
            }
            let before = out.len();
            match seen {
                None => resp::bulk(out, &[]),
                Some(Seen::Record(v) | Seen::Written(v) | Seen::Lapsing(v)) if strings => resp::bulk_number_then(out, v, b":"),
                Some(Seen::Record(v) | Seen::Written(v) | Seen::Deleted(v) | Seen::Lapsing(v)) => resp::bulk_number(out, b"", v),
            }
            sent += out.len() - before;
            match &c.value {
                Some(r) => {
                    let framed = if strings { ver.len() + 1 } else { 0 };
                    guess = resp::bulk_filled(out, guess, |out| {
                        if strings {
                            out.extend_from_slice(ver);
                            out.push(b':');
                        }
                        r.encode_into(format, out)
                    })?;
                    sent += guess - framed;
                }
                None => resp::bulk(out, &[]),
            }
        }
        Ok(sent)
    }

    /// The records of `keys` from what [`Self::fetch`] found, remembering the versions seen.
    fn take_rows(&mut self, table: Table, keys: &[String], rows: Vec<Stored>) -> Vec<Option<Record>> {
        let mut out = Vec::with_capacity(keys.len());
        for (k, row) in keys.iter().zip(rows) {
            match row {
                Stored::Record(ver, v) => out.push(self.read_record(table, k, &v, ver)),
                Stored::Deleted(ver) => {
                    self.saw_deleted(table, k.clone(), ver);
                    out.push(None);
                }
                Stored::Absent => {
                    if table.expires() {
                        // Expired (see `Table::expires`): absent is what to expect now.
                        self.versions.remove(table, k);
                    }
                    out.push(None)
                }
            }
        }
        out
    }

    /// What each of `keys` (whole record keys) holds, in either layout, in one round trip as a
    /// rule: the layout this instance writes is asked for first (`GET`, or `HMGET v ver`), and
    /// the keys Redis answers `WRONGTYPE` for (written in the other layout) are asked again the
    /// other way.
    fn fetch<K: AsRef<[u8]>>(&mut self, keys: &[K]) -> Result<Vec<Stored>, StoreError> {
        Ok(self.fetch_probing(&[] as &[K], keys)?.1)
    }

    /// As [`Self::fetch`], and in the same round trip one `EXISTS` of the keys `probe`, which are
    /// read (in a second round trip) only when any of them is there: for records most keys do
    /// not have (the verifiers parked under each decided call's operation key), one lookup each
    /// inside one command instead of a command each.
    fn fetch_probing<K: AsRef<[u8]>>(&mut self, probe: &[K], keys: &[K]) -> Result<(Vec<Stored>, Vec<Stored>), StoreError> {
        let strings = self.writes >= super::format::STRING_RECORDS_SINCE;
        let (present, first) = self.fetch_as(probe, keys.iter().map(AsRef::as_ref), strings)?;
        let probed = if present == 0 { probe.iter().map(|_| Stored::Absent).collect() } else { self.fetch(probe)? };
        let mut out = Vec::with_capacity(keys.len());
        let mut again = Vec::new();
        for (i, row) in first.into_iter().enumerate() {
            match row {
                Some(s) => out.push(s),
                None => {
                    again.push(i);
                    out.push(Stored::Absent);
                }
            }
        }
        if !again.is_empty() {
            let (_, second) = self.fetch_as(&[] as &[K], again.iter().map(|&i| keys[i].as_ref()), !strings)?;
            for (i, row) in again.into_iter().zip(second) {
                // Neither layout: a key of another type, or one rewritten in between (read again
                // at the next conflict); nothing this store can read.
                out[i] = row.unwrap_or(Stored::Absent);
            }
        }
        Ok((probed, out))
    }

    /// One pipeline: how many of `probe` exist, then `keys` read in one layout (`None` for a key
    /// that holds the other).
    fn fetch_as<'a, K: AsRef<[u8]>>(
        &mut self,
        probe: &[K],
        keys: impl Iterator<Item = &'a [u8]>,
        strings: bool,
    ) -> Result<(u64, Vec<Option<Stored>>), StoreError> {
        // Packed here, not through `redis::pipe`, which builds each command in a buffer of its
        // own before copying it into the pipeline's.
        let mut packed = std::mem::take(&mut self.packed);
        packed.clear();
        let mut count = 0;
        if !probe.is_empty() {
            resp::array(&mut packed, 1 + probe.len());
            resp::bulk(&mut packed, &[b"EXISTS"]);
            for k in probe {
                resp::bulk(&mut packed, &[k.as_ref()]);
            }
            count += 1;
        }
        for k in keys {
            if strings {
                resp::array(&mut packed, 2);
                resp::bulk(&mut packed, &[b"GET"]);
                resp::bulk(&mut packed, &[k]);
            } else {
                resp::array(&mut packed, 4);
                resp::bulk(&mut packed, &[b"HMGET"]);
                resp::bulk(&mut packed, &[k]);
                resp::bulk(&mut packed, &[b"v"]);
                resp::bulk(&mut packed, &[b"ver"]);
            }
            count += 1;
        }
        let answer = if count == 0 { Ok(Vec::new()) } else { self.with_conn(|c| c.req_packed_commands(&packed, 0, count)) };
        self.keep_packed(packed);
        let mut values: Vec<::redis::Value> = answer?;
        let shown = &self.shown;
        let present = if probe.is_empty() || values.is_empty() {
            0
        } else {
            ::redis::from_redis_value::<u64>(values.remove(0).extract_error().map_err(|e| backend(shown, &e))?)
                .map_err(|e| backend(shown, &e))?
        };
        let rows = values
            .into_iter()
            .map(|v| match v {
                ::redis::Value::ServerError(e) if e.code() == "WRONGTYPE" => Ok(None),
                ::redis::Value::ServerError(e) => Err(backend(shown, &e)),
                ::redis::Value::Nil => Ok(Some(Stored::Absent)),
                v if strings => {
                    let bytes: Vec<u8> = ::redis::from_redis_value(v).map_err(|e| backend(shown, &e))?;
                    Ok(Some(Stored::parse(bytes)))
                }
                v => {
                    let (bytes, ver): (Option<Vec<u8>>, Option<u64>) = ::redis::from_redis_value(v).map_err(|e| backend(shown, &e))?;
                    Ok(Some(match (bytes, ver) {
                        (Some(b), Some(ver)) => Stored::Record(ver, b),
                        (None, Some(ver)) => Stored::Deleted(ver),
                        _ => Stored::Absent,
                    }))
                }
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        Ok((present, rows))
    }
}

/// How a round's answers could not be taken: its connection failed (and is out of step), or
/// Redis answered with an error (the connection is in step).
enum RoundError {
    Socket(round_socket::SocketError),
    Store(StoreError),
}

/// How one write's changes (indexes into its [`Changes`]) were sent.
#[derive(Default)]
struct Plan {
    /// Each a `SET … NX`.
    direct: Vec<usize>,
    /// Through the apply script.
    scripted: Vec<usize>,
    /// Where the script's command (or the `INCR` in its place) starts in the packed bytes.
    script_at: usize,
}

/// What a record key holds.
#[derive(Debug, PartialEq, Eq)]
enum Stored {
    Absent,
    /// A tombstone: deleted at this version.
    Deleted(u64),
    /// A record at this version, its bytes.
    Record(u64, Vec<u8>),
}

impl Stored {
    /// A value of the string layout: `<version>:<bytes>`, or `<version>` alone for a tombstone.
    /// One that is neither is read as a record at version 0 whose bytes do not decode: skipped as
    /// damaged, and (no write of this store ever expects version 0) never written over.
    fn parse(mut value: Vec<u8>) -> Stored {
        let digits = value.iter().position(|b| !b.is_ascii_digit()).unwrap_or(value.len());
        let ver = std::str::from_utf8(&value[..digits]).ok().and_then(|d| d.parse::<u64>().ok());
        match (ver, value.get(digits)) {
            (Some(ver), None) => Stored::Deleted(ver),
            (Some(ver), Some(b':')) => {
                value.drain(..=digits);
                Stored::Record(ver, value)
            }
            _ => Stored::Record(0, value),
        }
    }
}

/// How one round of an apply went.
struct Sent {
    /// The number taken for the next apply.
    next: u64,
    /// Changes sent as `SET … NX` (passed, unless in `retry`) and through the script.
    direct: Vec<usize>,
    scripted: Vec<usize>,
    /// Changes the script refused.
    refused: Vec<usize>,
    /// The `SET … NX` changes that wrote nothing (their key was there): to be sent again.
    retry: Vec<usize>,
}

impl RedisStore {
    /// The commands' buffer back, for the next round: kept while the rounds are as large as the
    /// one that grew it. Flat out each round is megabytes, and growing a new buffer by doubling
    /// for every round copied each record again and faulted in fresh pages. A buffer one huge
    /// round grew goes once the rounds are small again.
    fn keep_packed(&mut self, mut packed: Vec<u8>) {
        if packed.capacity() > PACKED_KEEP.max(2 * packed.len()) {
            packed = Vec::new();
        }
        packed.clear();
        self.packed = packed;
    }

    /// Send the changes `which` under `version` in one round trip (see [`Self::pack_round`]).
    fn send_round(
        &mut self,
        changes: &Changes,
        seen: &[Option<Seen>],
        which: &[usize],
        version: u64,
        direct: bool,
    ) -> Result<Sent, StoreError> {
        // The commands are written straight into one buffer kept from round to round: each
        // record's bytes are copied once, not through an invocation's and a command's own copies
        // (the store's thread is the cluster's other hot thread, after Redis).
        // The `SET`s go out as they are packed (see [`SEND_EVERY`]), so Redis runs the first
        // while the rest are encoded; their answers are read with the script's, on the rounds'
        // own connection (see [`round_socket`]).
        self.ensure_socket()?;
        let Some(mut socket) = self.socket.take() else { unreachable!("connected above") };
        let (mut failed, mut flushed) = (None, false);
        let mut packed = std::mem::take(&mut self.packed);
        let mut flush = |bytes: &[u8]| match socket.send(bytes) {
            Ok(()) => {
                flushed = true;
                true
            }
            Err(e) => {
                failed = Some(e);
                false
            }
        };
        let packing = self.pack_round(changes, seen, which, version, direct, &mut packed, &mut flush);
        if let Some(e) = failed {
            // A send that stopped part way leaves the connection's answers out of step: it is
            // not used again.
            self.keep_packed(packed);
            return Err(self.socket_failed(e));
        }
        let (sent, plan) = match packing {
            Ok(x) => x,
            Err(e) => {
                self.keep_packed(packed);
                if !flushed {
                    // Nothing went out: the connection is in step.
                    self.socket = Some(socket);
                }
                // Else commands went out whose answers nobody will read: the connection is not
                // used again (the apply failed; its `SET`s that ran are found at the next).
                return Err(e);
            }
        };
        self.stats.bytes_sent += sent as u64;
        self.stats.round_trips += 1;
        let answer = self.round_answers(&mut socket, &packed, &plan);
        self.keep_packed(packed);
        match &answer {
            Err(RoundError::Socket(_)) => {}
            // An answer that is an error leaves the connection in step.
            _ => self.socket = Some(socket),
        }
        let answer = answer.map_err(|e| match e {
            RoundError::Socket(e) => self.socket_failed(e),
            RoundError::Store(e) => e,
        });
        let (retry, next, bad) = answer?;
        let refused = bad.into_iter().filter_map(|i| i.checked_sub(1)).filter_map(|i| plan.scripted.get(i).copied()).collect();
        Ok(Sent { next, direct: plan.direct, scripted: plan.scripted, refused, retry })
    }
}

impl StateStore for RedisStore {
    fn set_read_policy(&mut self, read: super::ReadPolicy) {
        self.read = read;
    }

    fn load_into(&mut self, mut s: Snapshot) -> Result<Snapshot, StoreError> {
        for t in Table::ALL {
            if t == Table::Decided {
                // The largest table by far, and not indexed: read a page at a time into the
                // snapshot, which keeps what its bound says (a chain twice is one chain).
                let start = s.skipped.len();
                self.scan_table_each(t, false, &mut |store, row| store.load_row(&mut s, t, row))?;
                // Named once each, in key order (as the other tables, read whole).
                let mut mine = s.skipped.split_off(start);
                mine.sort_by(|a, b| a.key.cmp(&b.key));
                mine.dedup_by(|a, b| a.key == b.key);
                s.skipped.append(&mut mine);
                continue;
            }
            let scanned = self.scan_table(t, false)?;
            if indexed(t) && !scanned.is_empty() {
                // The index from what is there (records an older version wrote had none).
                let keys: Vec<String> = scanned.iter().map(|(k, ..)| record_key(t, k)).collect();
                let _: () = self.with_conn(|c| ::redis::cmd("SADD").arg(index_key(t)).arg(&keys).query(c))?;
            }
            for row in scanned {
                self.load_row(&mut s, t, row);
            }
        }
        s.settle();
        Ok(s)
    }

    fn get(&mut self, table: Table, key: &str) -> Result<Option<Record>, StoreError> {
        let rows = self.fetch(&[record_key(table, key)])?;
        Ok(self.take_rows(table, &[key.to_string()], rows).pop().flatten())
    }

    fn apply(&mut self, changes: &Changes) -> Result<(), StoreError> {
        if changes.is_empty() {
            return Ok(());
        }
        let forgotten = self.versions.turn(Instant::now());
        // Counted with the other bounded tables (`mcp_health.state.evicted{table="store_versions"}`).
        crate::bounded::counter("store_versions").fetch_add(forgotten, std::sync::atomic::Ordering::Relaxed);
        let version = match self.reserved.take() {
            Some(v) => v,
            None => self.with_conn(|c| ::redis::cmd("INCR").arg(format!("{PREFIX}:version")).query(c))?,
        };
        // A decided chain or an operation key this store wrote carries its lifetime: its delete
        // (a tombstone written through the script, dearer to Redis than the record's own write)
        // is left to that lifetime, which ends within a late-span window and the margin after
        // it. No instance of this protocol takes a chain past its late-span window from the
        // store, so a record left there (or an operation key naming it) revises nothing, and the
        // tombstone kept nothing out. A release before it (state protocol 1) takes any chain it
        // finds: while one shares the store (records written as hashes) deletes are sent. A
        // record this store only read may come from a release that set no lifetime: deleted as
        // before.
        let strings = self.writes >= super::format::STRING_RECORDS_SINCE;
        // What this store knows of each key, looked up once (the map is large: a lookup is a
        // cache miss or two).
        let seen: Vec<Option<Seen>> = changes.changes.iter().map(|c| self.versions.get(c.table, &c.key)).collect();
        let (mut all, mut expiring) = (Vec::with_capacity(changes.changes.len()), Vec::new());
        for ((i, c), seen) in changes.changes.iter().enumerate().zip(&seen) {
            match seen {
                Some(Seen::Written(v)) if c.value.is_none() && lives(c.table) && strings => expiring.push((i, *v)),
                _ => all.push(i),
            }
        }
        self.stats.deletes_left_to_expire += expiring.len() as u64;
        let first = self.send_round(changes, &seen, &all, version, true)?;
        // The version each change passed under (those left to their lifetime are done here).
        let mut passed: Vec<Option<u64>> = vec![None; changes.changes.len()];
        let mut left = vec![false; changes.changes.len()];
        for &(i, v) in &expiring {
            left[i] = true;
            let Some(c) = changes.changes.get(i) else { continue };
            // A key its writer may name again (an operation key used again) is expected at the
            // version it wrote, or absent once its lifetime ended; a decided chain's is not
            // remembered (see the deletes below).
            if recreated(c.table) {
                self.versions.set(c.table, &c.key, Seen::Lapsing(v));
            } else {
                self.versions.remove(c.table, &c.key);
            }
        }
        for &i in first.direct.iter().chain(&first.scripted) {
            passed[i] = Some(version);
        }
        for &i in &first.refused {
            passed[i] = None;
        }
        let mut next = first.next;
        if !first.retry.is_empty() {
            // A `SET … NX` found its key there and wrote nothing: those changes again, through
            // the script (which refuses them unless the key has expired since), under the number
            // the first round took.
            let again = self.send_round(changes, &seen, &first.retry, next, false)?;
            for &i in &first.retry {
                passed[i] = Some(next);
            }
            for &i in &again.refused {
                passed[i] = None;
            }
            next = again.next;
        }
        self.reserved = Some(next);
        let mut refused = Vec::new();
        for (i, c) in changes.changes.iter().enumerate() {
            if left[i] {
                continue;
            }
            let Some(n) = passed[i] else {
                refused.push(i);
                continue;
            };
            match c.value {
                Some(_) => {
                    self.versions.insert(c.table, c.key.clone(), Seen::Written(n));
                }
                // A key its writer may create again (a session that resumes, a server's next
                // incident, an operation key used again) keeps its tombstone's version, so that
                // write is expected; a decided chain's and a list record's are never written
                // again, and remembering each of those deletes (one per call) for twice the
                // tombstone's life was most of what this map held.
                None if recreated(c.table) => self.saw_deleted(c.table, c.key.clone(), n),
                None => self.versions.remove(c.table, &c.key),
            }
        }
        let refused: Vec<(Table, String)> =
            refused.iter().filter_map(|i| changes.changes.get(*i)).map(|c| (c.table, c.key.clone())).collect();
        if let Some((table, key)) = refused.first().cloned() {
            self.stats.conflicts += refused.len() as u64;
            return Err(StoreError::Conflict { table: table.as_str(), key, refused });
        }
        Ok(())
    }

    fn get_many(&mut self, table: Table, keys: &[String]) -> Result<Vec<Option<Record>>, StoreError> {
        Ok(self.get_tables(&[(table, keys.to_vec())])?.pop().unwrap_or_default())
    }

    fn get_tables(&mut self, asks: &[(Table, Vec<String>)]) -> Result<Vec<Vec<Option<Record>>>, StoreError> {
        let n: usize = asks.iter().map(|(_, k)| k.len()).sum();
        if n == 0 {
            return Ok(asks.iter().map(|_| Vec::new()).collect());
        }
        // A verifier is parked under an operation key only when it reported before its call
        // reached another instance: those keys are probed, not read.
        let keys_of = |parked: bool| -> Vec<String> {
            asks.iter()
                .filter(|(table, _)| (*table == Table::Parked) == parked)
                .flat_map(|(table, keys)| keys.iter().map(|k| record_key(*table, k)))
                .collect()
        };
        let (probed, rows) = self.fetch_probing(&keys_of(true), &keys_of(false))?;
        let (mut probed, mut rows) = (probed.into_iter(), rows.into_iter());
        let mut all = Vec::with_capacity(asks.len());
        for (table, keys) in asks {
            let from = if *table == Table::Parked { &mut probed } else { &mut rows };
            let taken: Vec<_> = from.by_ref().take(keys.len()).collect();
            all.push(self.take_rows(*table, keys, taken));
        }
        Ok(all)
    }

    fn over_network(&self) -> bool {
        true
    }

    fn is_shared(&self) -> bool {
        true
    }

    fn peek(&mut self, table: Table, key: &str) -> Result<Option<Record>, StoreError> {
        let Some(Stored::Record(_, v)) = self.fetch(&[record_key(table, key)])?.pop() else { return Ok(None) };
        self.stats.bytes_received += v.len() as u64;
        Ok(self.decode_counted(table, key, &v))
    }

    fn scan(&mut self, table: Table) -> Result<Vec<(String, Record)>, StoreError> {
        let mut out = Vec::new();
        for (key, bytes, _) in self.scan_table(table, indexed(table))? {
            if let Some(r) = bytes.and_then(|bytes| self.decode_counted(table, &key, &bytes)) {
                out.push((key, r));
            }
        }
        Ok(out)
    }

    fn lease(&mut self, ttl: Duration) -> Result<bool, StoreError> {
        let mut inv = LEASE_SCRIPT.prepare_invoke();
        inv.key(format!("{PREFIX}:lease:gauges")).arg(&self.holder).arg(millis(ttl));
        let held: u64 = self.with_conn(|c| inv.invoke(c))?;
        Ok(held == 1)
    }

    fn speak(&mut self, protocol: u32) {
        self.speaks = protocol.min(super::format::PROTOCOL);
        self.writes = self.writes.min(self.speaks);
    }

    fn announce(&mut self, ttl: Duration) -> Result<u32, StoreError> {
        let mut inv = ANNOUNCE_SCRIPT.prepare_invoke();
        inv.key(format!("{PREFIX}:protocols")).arg(&self.holder).arg(self.speaks).arg(millis(ttl));
        let cluster: u64 = self.with_conn(|c| inv.invoke(c))?;
        let cluster = u32::try_from(cluster).unwrap_or(self.speaks).min(self.speaks);
        self.writes = cluster;
        Ok(cluster)
    }

    fn probe(&mut self) -> Option<Result<(), StoreError>> {
        Some(match self.with_conn(|c| ::redis::cmd("PING").query::<String>(c)) {
            Ok(pong) if pong == "PONG" => Ok(()),
            Ok(pong) => Err(StoreError::Backend(format!("redis at {}: PING answered {pong:?}", self.shown))),
            Err(e) => Err(e),
        })
    }

    fn stats(&self) -> Option<StoreStats> {
        Some(StoreStats { versions_forgotten: self.versions.forgotten, versions_held: self.versions.len() as u64, ..self.stats.clone() })
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn redact_hides_passwords_and_keeps_the_rest() {
        let cases = [
            ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379"),
            ("redis://:s3cret@127.0.0.1:6379/2", "redis://:***@127.0.0.1:6379/2"),
            ("redis://alice:s3cret@h:1", "redis://alice:***@h:1"),
            ("redis://s3cret@h:1", "redis://***@h:1"),
            ("redis://:p@ss@h:1/0?x=1", "redis://:***@h:1/0?x=1"),
            ("not a url s3cret", "<endpoint>"),
        ];
        for (input, want) in cases {
            assert_eq!(redact(input), want, "{input}");
            assert!(!redact(input).contains("s3cret") && !redact(input).contains("p@ss"));
        }
    }
}
