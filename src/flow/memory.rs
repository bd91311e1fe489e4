//! The memory limiter, with the collector's `memory_limiter` semantics: a hard limit and a spike
//! allowance; above the soft limit (`limit - spike`) every receiver refuses whole requests with
//! the retryable answer (`UNAVAILABLE`, 503 + `Retry-After`), so senders keep their data and retry
//! once memory is back under the limit.
//!
//! Sampling the resident set alone cannot hold the bound: between two samples, concurrent large
//! requests are read, decoded and queued before any sample shows them (64 requests of 4 MiB took
//! the process to 406 MB under a 256 MiB limit). So memory is also *reserved*: a request takes a
//! [`Reservation`] before its body is read, grows it before each step that allocates (read,
//! decompress, decode) and trims it to what it really holds afterwards; the reservation travels
//! with what it pays for (the pass-through copy in the export queue, the normalized batch in the
//! engine queue) and is released when that is freed: exported, dropped or refused. A step that
//! would take the reservations past the soft limit is refused instead, before it allocates.
//!
//! The budget is `soft limit − untracked − engine evidence`, where `untracked` is what the last
//! sample of the resident set shows beyond the reservations (the runtime, the binary, caches,
//! allocator slack; at least the resident set at start). A reservation that underestimates its
//! request is therefore corrected at the next sample: the excess shows up as untracked. The
//! resident-set sample stays the collector's backstop: above the soft limit everything is refused.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value::Value, AnyValue, KeyValue};
use serde::Deserialize;

/// What a decoded request holds, per byte of its protobuf encoding, on top of the wire bytes
/// themselves. Measured on realistic MCP spans (the load generator's; the test
/// `decoded_requests_cost_what_the_reservation_says`): the decoded structs of a trace request
/// hold 3.85× its wire size (every id, name, key and value its own allocation, every attribute
/// 80 bytes inline); 5 leaves room for the allocator's size classes.
pub(crate) const DECODED_PER_WIRE_BYTE: u64 = 5;

/// Where the process stands against its memory limit.
#[derive(Debug)]
pub(crate) struct MemoryLimiter {
    soft: u64,
    hard: u64,
    over: AtomicBool,
    rss: AtomicU64,
    /// Bytes of every live [`Reservation`].
    held: AtomicU64,
    /// What the resident set holds beyond reservations and evidence, at the last sample.
    untracked: AtomicU64,
    /// The resident set when the limiter was made: the least `untracked` can be.
    floor: u64,
    /// Evidence bytes the engine holds (chains in flight and decided chains kept for revision),
    /// published by the engine after each step: it outlives the requests that brought it.
    engine: AtomicU64,
    /// Whether freed memory goes back to the OS at once: while what the process holds (at the
    /// last sample, or reserved since) is above [`MemoryLimiter::prompt_above`].
    prompt: AtomicBool,
}

/// Set by the binary, which owns the global allocator: whether the allocator returns freed memory
/// to the OS at once (`true`) or keeps it for reuse (`false`). A limit on the resident set needs
/// freed memory to leave it near the limit, or what refused requests held stays counted; far
/// below the limit, returning freed pages costs a system call per page returned and a page fault
/// (and a zeroed page) per page allocated again, as chains come and go (measured: about 9 % of
/// the CPU per span on mixed traffic at once against a 10 ms delay, and a fifth of it on the
/// MCP-only line with a 10 ms delay against none; `benches/throughput.rs`).
static ALLOCATOR_HOOK: std::sync::OnceLock<fn(bool)> = std::sync::OnceLock::new();

/// See [`ALLOCATOR_HOOK`]; the first call wins.
pub(crate) fn set_allocator_hook(f: fn(bool)) {
    let _ = ALLOCATOR_HOOK.set(f);
}

/// Set by the binary, which owns the global allocator: called on a runtime thread about to go
/// idle (tokio's `on_thread_park`), to hand what that thread freed back to the OS. The allocator
/// returns a thread's freed pages only on that thread's later activity: a thread that freed
/// a burst of requests and chains and then idles keeps them resident until it is busy again.
static IDLE_HOOK: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();

/// See [`IDLE_HOOK`]; the first call wins.
pub(crate) fn set_idle_hook(f: fn()) {
    let _ = IDLE_HOOK.set(f);
}

/// See [`IDLE_HOOK`]: for the runtime's `on_thread_park`.
pub(crate) fn on_thread_idle() {
    if let Some(f) = IDLE_HOOK.get() {
        f();
    }
}

impl MemoryLimiter {
    /// `limit_mib` the hard limit; `spike_limit_mib` the allowance above the soft limit (the
    /// collector's default: a fifth of the limit). The current resident set is the floor of what
    /// is not reserved.
    #[cfg(test)]
    pub(crate) fn new(limit_mib: u64, spike_limit_mib: Option<u64>) -> MemoryLimiter {
        let hard = limit_mib << 20;
        Self::from_limit(EffectiveLimit {
            hard,
            spike: spike_limit_mib.map_or(hard / 5, |s| s << 20).min(hard),
            basis: LimitBasis::LimitMib,
        })
    }

    /// A limiter holding `limit` (see [`effective_limit`]).
    pub(crate) fn from_limit(limit: EffectiveLimit) -> MemoryLimiter {
        let m = Self::with_bytes(limit.hard, limit.spike, process_rss().unwrap_or(0));
        // The allocator's delay until the first sample says where the process stands.
        if let Some(f) = ALLOCATOR_HOOK.get() {
            f(false);
        }
        m.follow(m.floor);
        m
    }

    #[cfg(test)]
    pub(crate) fn with_floor(limit_mib: u64, spike_limit_mib: Option<u64>, floor: u64) -> MemoryLimiter {
        let hard = limit_mib << 20;
        Self::with_bytes(hard, spike_limit_mib.map_or(hard / 5, |s| s << 20), floor)
    }

    fn with_bytes(hard: u64, spike: u64, floor: u64) -> MemoryLimiter {
        let spike = spike.min(hard);
        MemoryLimiter {
            soft: hard - spike,
            hard,
            over: AtomicBool::new(false),
            rss: AtomicU64::new(floor),
            held: AtomicU64::new(0),
            untracked: AtomicU64::new(floor),
            floor,
            engine: AtomicU64::new(0),
            prompt: AtomicBool::new(false),
        }
    }

    /// Above this many bytes held, freed memory goes back to the OS at once: a quarter of the soft
    /// limit. Below it, what the allocator keeps (at most about this much) cannot bring the
    /// process near the limit. At half, it did: 64 requests of 4 MiB under a 256 MiB limit
    /// (`e2e_memory`) peaked some 30 MiB higher than with every page returned at once, at the
    /// test's margin.
    fn prompt_above(&self) -> u64 {
        self.soft / 4
    }

    /// Set the allocator's return of freed memory for `used` bytes held (see [`ALLOCATOR_HOOK`]).
    fn follow(&self, used: u64) {
        let prompt = used > self.prompt_above();
        if self.prompt.swap(prompt, Ordering::Relaxed) != prompt {
            if let Some(f) = ALLOCATOR_HOOK.get() {
                f(prompt);
            }
        }
    }

    /// Whether freed memory goes back to the OS at once now.
    #[cfg(test)]
    pub(crate) fn returns_freed_memory_at_once(&self) -> bool {
        self.prompt.load(Ordering::Relaxed)
    }

    /// Take a sample; returns `Some(now_over)` when the state changed.
    pub(crate) fn sample(&self, rss_bytes: u64) -> Option<bool> {
        self.rss.store(rss_bytes, Ordering::Relaxed);
        let tracked = self.held.load(Ordering::Relaxed).saturating_add(self.engine.load(Ordering::Relaxed));
        self.untracked.store(rss_bytes.saturating_sub(tracked).max(self.floor), Ordering::Relaxed);
        self.follow(rss_bytes.max(tracked));
        let over = rss_bytes > self.soft;
        (self.over.swap(over, Ordering::Relaxed) != over).then_some(over)
    }

    /// Refuse new data now: over at the last sample, or no room left for even one more byte.
    pub(crate) fn over(&self) -> bool {
        self.over.load(Ordering::Relaxed) || self.room() == 0
    }

    /// Bytes that may still be reserved.
    pub(crate) fn room(&self) -> u64 {
        let used = self.untracked.load(Ordering::Relaxed).saturating_add(self.engine.load(Ordering::Relaxed));
        self.soft.saturating_sub(used).saturating_sub(self.held.load(Ordering::Relaxed))
    }

    /// The engine's evidence bytes, after each of its steps.
    pub(crate) fn set_engine_bytes(&self, bytes: u64) {
        self.engine.store(bytes, Ordering::Relaxed);
    }

    /// Reserve `bytes`, or `None` (refuse the request) when that would pass the soft limit.
    pub(crate) fn reserve(self: &Arc<Self>, bytes: u64) -> Option<Reservation> {
        self.grow(bytes).then(|| Reservation { limiter: self.clone(), bytes })
    }

    /// Hold `bytes` whatever the limit: for what must not be dropped and is already allocated.
    /// It still counts, so the receivers refuse sooner.
    pub(crate) fn hold(self: &Arc<Self>, bytes: u64) -> Reservation {
        self.held.fetch_add(bytes, Ordering::Relaxed);
        Reservation { limiter: self.clone(), bytes }
    }

    fn grow(&self, by: u64) -> bool {
        if self.over.load(Ordering::Relaxed) {
            return false;
        }
        let base = self.untracked.load(Ordering::Relaxed).saturating_add(self.engine.load(Ordering::Relaxed));
        let mut held = self.held.load(Ordering::Relaxed);
        loop {
            if base.saturating_add(held).saturating_add(by) > self.soft {
                return false;
            }
            match self.held.compare_exchange_weak(held, held + by, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => {
                    // A burst between two samples turns prompt return on as it reserves; only a
                    // sample turns it off.
                    if !self.prompt.load(Ordering::Relaxed) && base.saturating_add(held + by) > self.prompt_above() {
                        self.follow(base.saturating_add(held + by));
                    }
                    return true;
                }
                Err(now) => held = now,
            }
        }
    }

    /// The engine's evidence bytes, as last published.
    pub(crate) fn engine_bytes(&self) -> u64 {
        self.engine.load(Ordering::Relaxed)
    }

    /// Bytes reserved now.
    pub(crate) fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    pub(crate) fn limits(&self) -> (u64, u64) {
        (self.soft, self.hard)
    }
}

/// The memory limit when `processors.memory_limiter` is absent: this share of the cgroup's limit
/// (a container's), as the collector's `limit_percentage`.
pub(crate) const DEFAULT_LIMIT_PERCENTAGE: u64 = 80;

/// The memory limit when `processors.memory_limiter` is absent and no cgroup limit is set: an
/// unbounded default let a dead backend take the process to 2 GB (3.4 MiB requests queued).
pub(crate) const DEFAULT_LIMIT_MIB: u64 = 512;

/// A cgroup "limit" at or above this is no limit (cgroup v1 writes `9223372036854771712`).
const NO_CGROUP_LIMIT: u64 = 1 << 60;

/// The limits the service runs with, and where they came from (logged at start).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct EffectiveLimit {
    /// The hard limit, in bytes.
    pub hard: u64,
    /// The spike allowance, in bytes (the soft limit is `hard - spike`).
    pub spike: u64,
    pub basis: LimitBasis,
}

/// Why the limit is what it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LimitBasis {
    /// `limit_mib` in the configuration.
    LimitMib,
    /// `limit_percentage` of this many bytes (the cgroup's limit, else the host's memory).
    Percentage { of: u64, cgroup: bool },
    /// No `memory_limiter` configured: [`DEFAULT_LIMIT_PERCENTAGE`] of the cgroup's limit.
    DefaultCgroup { of: u64 },
    /// No `memory_limiter` configured and no cgroup limit: [`DEFAULT_LIMIT_MIB`].
    DefaultFixed,
}

impl LimitBasis {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            LimitBasis::LimitMib => "limit_mib",
            LimitBasis::Percentage { .. } => "limit_percentage",
            LimitBasis::DefaultCgroup { .. } => "default: 80% of the cgroup memory limit",
            LimitBasis::DefaultFixed => "default: 512 MiB (no cgroup memory limit)",
        }
    }
}

/// The memory this process may use, as the collector's `memory_limiter` reads it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SystemMemory {
    /// The cgroup's limit (v2 `memory.max`, v1 `memory.limit_in_bytes`), if one is set.
    pub cgroup: Option<u64>,
    /// The host's `MemTotal`.
    pub host: Option<u64>,
}

impl SystemMemory {
    /// Read from `/proc` and `/sys/fs/cgroup` (Linux; elsewhere nothing is known).
    pub(crate) fn read() -> SystemMemory {
        let cgroup =
            std::fs::read_to_string("/proc/self/cgroup").ok().and_then(|c| cgroup_limit(std::path::Path::new("/sys/fs/cgroup"), &c));
        let host = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
            let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kb| kb * 1024)
        });
        SystemMemory { cgroup: cgroup.filter(|c| host.is_none_or(|h| *c < h)), host }
    }
}

/// The memory limit of the cgroup `proc_self_cgroup` (the text of `/proc/self/cgroup`) names,
/// under the cgroup file system at `root`: v2 (`0::/path` → `memory.max`) first, then v1
/// (`N:memory:/path` → `memory/…/memory.limit_in_bytes`). In a container the cgroup is often
/// mounted as its own root, so the root's file is read when the named path is not there.
/// `max` or a huge value: no limit.
pub(crate) fn cgroup_limit(root: &std::path::Path, proc_self_cgroup: &str) -> Option<u64> {
    let read = |p: std::path::PathBuf| -> Option<Option<u64>> {
        let t = std::fs::read_to_string(p).ok()?;
        let t = t.trim();
        Some(if t == "max" { None } else { t.parse::<u64>().ok().filter(|v| *v > 0 && *v < NO_CGROUP_LIMIT) })
    };
    let rel = |path: &str| path.trim_start_matches('/').to_string();
    for line in proc_self_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else { continue };
        let found = if id == "0" && controllers.is_empty() {
            read(root.join(rel(path)).join("memory.max")).or_else(|| read(root.join("memory.max")))
        } else if controllers.split(',').any(|c| c == "memory") {
            let v1 = root.join("memory");
            read(v1.join(rel(path)).join("memory.limit_in_bytes")).or_else(|| read(v1.join("memory.limit_in_bytes")))
        } else {
            None
        };
        if let Some(Some(limit)) = found {
            return Some(limit);
        }
    }
    None
}

/// `processors.memory_limiter`, with the collector's keys and defaults. Absent, the service still
/// runs one (see [`effective_limit`]): 80 % of the cgroup's memory limit, or
/// 512 MiB where none is set. `limit_mib: 0` switches it off.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MemoryLimiterConfig {
    /// How often memory is sampled.
    #[serde(default = "one_second", with = "humantime_serde")]
    pub check_interval: Duration,
    /// The hard limit (the process's resident set), in MiB; `0` switches the limiter off.
    #[serde(default)]
    pub limit_mib: Option<u64>,
    /// The allowance above the soft limit, in MiB (default: a fifth of the limit).
    #[serde(default)]
    pub spike_limit_mib: Option<u64>,
    /// The hard limit as a percentage of the memory available: the cgroup's limit, else the
    /// host's total (as the collector's). Exclusive with `limit_mib`.
    #[serde(default)]
    pub limit_percentage: Option<u64>,
    /// The spike allowance as a percentage of the same total (default: a fifth of the limit).
    #[serde(default)]
    pub spike_limit_percentage: Option<u64>,
}

impl MemoryLimiterConfig {
    /// The keys of `processors.memory_limiter` that do not go together: `Err((key, why))`.
    pub fn check(&self) -> Result<(), (&'static str, &'static str)> {
        let m = self;
        if m.check_interval.is_zero() {
            return Err(("check_interval", "must be greater than zero"));
        }
        match (m.limit_mib, m.limit_percentage) {
            (Some(_), Some(_)) => return Err(("limit_percentage", "must not be set together with limit_mib (choose one)")),
            (None, None) => {
                return Err(("limit_mib", "must be set (MiB, greater than zero; 0 switches the limiter off), or limit_percentage"))
            }
            _ => {}
        }
        if m.spike_limit_mib.is_some() && m.spike_limit_percentage.is_some() {
            return Err(("spike_limit_percentage", "must not be set together with spike_limit_mib (choose one)"));
        }
        if let Some(l) = m.limit_mib {
            if m.spike_limit_percentage.is_some() {
                return Err(("spike_limit_percentage", "goes with limit_percentage; with limit_mib use spike_limit_mib"));
            }
            if l > 0 && m.spike_limit_mib.is_some_and(|s| s >= l) {
                return Err(("spike_limit_mib", "must be smaller than limit_mib"));
            }
        }
        if let Some(p) = m.limit_percentage {
            if !(1..=100).contains(&p) {
                return Err(("limit_percentage", "must be from 1 to 100"));
            }
            if m.spike_limit_mib.is_some() {
                return Err(("spike_limit_mib", "goes with limit_mib; with limit_percentage use spike_limit_percentage"));
            }
            if m.spike_limit_percentage.is_some_and(|s| s >= p) {
                return Err(("spike_limit_percentage", "must be smaller than limit_percentage"));
            }
        }
        Ok(())
    }
}

fn one_second() -> Duration {
    Duration::from_secs(1)
}

/// The limits to run with: the configured ones, or the default when none is configured; `None`
/// when `limit_mib: 0` switches the limiter off (or a percentage has nothing to be taken of).
pub(crate) fn effective_limit(cfg: Option<&MemoryLimiterConfig>, sys: SystemMemory) -> Option<EffectiveLimit> {
    // The collector's default spike allowance: a fifth of the limit.
    let with_spike = |hard: u64, spike: Option<u64>, basis| EffectiveLimit { hard, spike: spike.unwrap_or(hard / 5).min(hard), basis };
    let Some(m) = cfg else {
        return Some(match sys.cgroup {
            Some(of) => with_spike(of.saturating_mul(DEFAULT_LIMIT_PERCENTAGE) / 100, None, LimitBasis::DefaultCgroup { of }),
            None => with_spike(DEFAULT_LIMIT_MIB << 20, None, LimitBasis::DefaultFixed),
        });
    };
    match (m.limit_mib, m.limit_percentage) {
        (Some(0), _) => None,
        (Some(l), _) => Some(with_spike(l << 20, m.spike_limit_mib.map(|s| s << 20), LimitBasis::LimitMib)),
        (None, Some(p)) => {
            let (of, cgroup) = match (sys.cgroup, sys.host) {
                (Some(c), _) => (c, true),
                (None, Some(h)) => (h, false),
                (None, None) => return None,
            };
            Some(with_spike(
                of.saturating_mul(p) / 100,
                m.spike_limit_percentage.map(|s| of.saturating_mul(s) / 100),
                LimitBasis::Percentage { of, cgroup },
            ))
        }
        (None, None) => None,
    }
}

/// Memory a request holds, counted against the limit until dropped. Moves with what it pays for.
pub struct Reservation {
    limiter: Arc<MemoryLimiter>,
    bytes: u64,
}

impl std::fmt::Debug for Reservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Reservation({} bytes)", self.bytes)
    }
}

impl Reservation {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Hold `bytes` from now on: shrinking always succeeds; growing fails (and keeps the old
    /// size) when it would pass the soft limit — then the step that needed it must not run.
    #[must_use]
    pub fn resize(&mut self, bytes: u64) -> bool {
        if bytes > self.bytes {
            if !self.limiter.grow(bytes - self.bytes) {
                return false;
            }
        } else {
            self.limiter.held.fetch_sub(self.bytes - bytes, Ordering::Relaxed);
        }
        self.bytes = bytes;
        true
    }

    /// Hold `bytes` whatever the limit: for memory that is already allocated (an encoding that
    /// came out larger than estimated), which refusing would not free.
    pub fn set(&mut self, bytes: u64) {
        if bytes > self.bytes {
            self.limiter.held.fetch_add(bytes - self.bytes, Ordering::Relaxed);
        } else {
            self.limiter.held.fetch_sub(self.bytes - bytes, Ordering::Relaxed);
        }
        self.bytes = bytes;
    }

    /// Move `bytes` of this reservation into a new one (for a part that is freed separately).
    pub fn split(&mut self, bytes: u64) -> Reservation {
        let bytes = bytes.min(self.bytes);
        self.bytes -= bytes;
        Reservation { limiter: self.limiter.clone(), bytes }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.limiter.held.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// The heap a decoded trace request holds: every `Vec` and `String` by capacity, with the inline
/// size of their elements. This is what a request queued for pass-through really costs.
pub(crate) fn trace_request_heap_bytes(req: &ExportTraceServiceRequest) -> u64 {
    fn vec<T>(v: &Vec<T>) -> usize {
        v.capacity() * std::mem::size_of::<T>()
    }
    fn kvs(attrs: &Vec<KeyValue>) -> usize {
        vec(attrs) + attrs.iter().map(|kv| kv.key.capacity() + kv.value.as_ref().map_or(0, any)).sum::<usize>()
    }
    fn any(v: &AnyValue) -> usize {
        match &v.value {
            Some(Value::StringValue(s)) => s.capacity(),
            Some(Value::BytesValue(b)) => b.capacity(),
            Some(Value::ArrayValue(a)) => vec(&a.values) + a.values.iter().map(any).sum::<usize>(),
            Some(Value::KvlistValue(l)) => kvs(&l.values),
            _ => 0,
        }
    }
    let mut n = vec(&req.resource_spans);
    for rs in &req.resource_spans {
        n += rs.schema_url.capacity() + vec(&rs.scope_spans);
        if let Some(r) = &rs.resource {
            n += kvs(&r.attributes) + vec(&r.entity_refs);
            for e in &r.entity_refs {
                n += e.schema_url.capacity() + e.r#type.capacity() + vec(&e.id_keys) + vec(&e.description_keys);
                n += e.id_keys.iter().chain(&e.description_keys).map(String::capacity).sum::<usize>();
            }
        }
        for ss in &rs.scope_spans {
            n += ss.schema_url.capacity() + vec(&ss.spans);
            if let Some(sc) = &ss.scope {
                n += sc.name.capacity() + sc.version.capacity() + kvs(&sc.attributes);
            }
            for sp in &ss.spans {
                n += sp.trace_id.capacity() + sp.span_id.capacity() + sp.parent_span_id.capacity();
                n += sp.trace_state.capacity() + sp.name.capacity() + kvs(&sp.attributes);
                n += sp.status.as_ref().map_or(0, |s| s.message.capacity());
                n += vec(&sp.events) + sp.events.iter().map(|e| e.name.capacity() + kvs(&e.attributes)).sum::<usize>();
                n += vec(&sp.links);
                n += sp
                    .links
                    .iter()
                    .map(|l| l.trace_id.capacity() + l.span_id.capacity() + l.trace_state.capacity() + kvs(&l.attributes))
                    .sum::<usize>();
            }
        }
    }
    n as u64
}

/// The process's resident set in bytes (Linux), if it can be read.
pub(crate) fn process_rss() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok().filter(|p| *p > 0).unwrap_or(4096))
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    #[test]
    fn refuses_above_the_soft_limit_and_recovers_below_it() {
        let m = MemoryLimiter::with_floor(100, Some(20), 10 << 20);
        assert_eq!(m.limits(), (80 << 20, 100 << 20));
        assert_eq!(m.sample(50 << 20), None, "under: no change");
        assert!(!m.over());
        assert_eq!(m.sample(81 << 20), Some(true), "over the soft limit");
        assert!(m.over());
        assert_eq!(m.sample(90 << 20), None);
        assert_eq!(m.sample(79 << 20), Some(false), "back under");
        assert!(!m.over());
        // The collector's default spike allowance is a fifth of the limit.
        assert_eq!(MemoryLimiter::new(256, None).limits().0, (256 << 20) - ((256 << 20) / 5));
        assert!(process_rss().is_some_and(|r| r > 0));
    }

    /// Reservations bound what concurrent requests may take between two samples: the sum of live
    /// reservations never passes the soft limit less what the last sample showed beyond them.
    #[test]
    fn reservations_hold_the_soft_limit_between_samples() {
        let m = Arc::new(MemoryLimiter::with_floor(100, Some(20), 10 << 20));
        assert_eq!(m.room(), 70 << 20, "80 MiB soft limit less the 10 MiB floor");
        // Seven requests of 10 MiB fit; the eighth does not, whatever the (stale) sample says.
        let mut held: Vec<Reservation> = (0..7).map(|_| m.reserve(10 << 20).expect("fits")).collect();
        assert!(m.reserve(10 << 20).is_none(), "the eighth would pass the soft limit");
        assert!(m.over(), "no room: even the cheap check refuses");
        // Released when what it paid for is freed.
        held.pop();
        assert!(m.reserve(10 << 20).is_some(), "room again once one is freed");
        // Growing is checked; shrinking always succeeds.
        let mut r = held.pop().unwrap();
        assert!(!r.resize(30 << 20), "cannot grow past the limit");
        assert_eq!(r.bytes(), 10 << 20, "a refused growth keeps the old size");
        assert!(r.resize(1 << 20));
        let part = r.split(1 << 19);
        assert_eq!((r.bytes(), part.bytes()), (1 << 19, 1 << 19));
        drop((r, part));
        assert_eq!(m.held(), 5 * (10 << 20));
        // A sample showing more than is reserved (an estimate that was too low) shrinks the room.
        m.sample((5 * (10 << 20)) + (30 << 20));
        assert_eq!(m.room(), 0, "30 MiB untracked + 50 MiB reserved = the 80 MiB soft limit");
        drop(held);
        assert_eq!(m.room(), 50 << 20);
        // Evidence the engine holds counts too.
        m.set_engine_bytes(40 << 20);
        assert_eq!(m.room(), 10 << 20);
        assert!(m.reserve(11 << 20).is_none());
    }

    /// Freed memory goes back to the OS at once above a quarter of the soft limit: when a sample
    /// shows the process there, or as soon as reservations take it there between two samples;
    /// only a sample below turns it off (a released reservation does not: its memory may still
    /// be resident).
    #[test]
    fn freed_memory_goes_back_at_once_above_a_quarter_of_the_soft_limit() {
        let m = Arc::new(MemoryLimiter::with_floor(100, Some(20), 10 << 20));
        assert!(!m.returns_freed_memory_at_once(), "10 MiB of an 80 MiB soft limit");
        m.sample(21 << 20);
        assert!(m.returns_freed_memory_at_once(), "a sample above 20 MiB");
        m.sample(19 << 20);
        assert!(!m.returns_freed_memory_at_once(), "a sample below");
        m.sample(12 << 20);
        // Reservations between two samples: 12 MiB resident + 5 MiB is under a quarter, + 5 more
        // is not.
        let a = m.reserve(5 << 20).expect("fits");
        assert!(!m.returns_freed_memory_at_once());
        let b = m.reserve(5 << 20).expect("fits");
        assert!(m.returns_freed_memory_at_once(), "reserved past a quarter of the soft limit");
        drop((a, b));
        assert!(m.returns_freed_memory_at_once(), "released is not yet returned: the next sample says");
        m.sample(12 << 20);
        assert!(!m.returns_freed_memory_at_once());
        // Evidence the engine holds counts as held.
        m.set_engine_bytes(25 << 20);
        m.sample(20 << 20);
        assert!(m.returns_freed_memory_at_once(), "25 MiB of evidence, whatever the resident set says");
    }

    /// The figure behind [`DECODED_PER_WIRE_BYTE`]: what a decoded request of realistic MCP spans
    /// holds, per byte of its encoding (JSON: see `otlp_json::decoded_bound`).
    #[test]
    fn decoded_requests_cost_what_the_reservation_says() {
        let req = crate::loadgen::build_request(1, 3000);
        let wire = req.encode_to_vec();
        let decoded = ExportTraceServiceRequest::decode(&wire[..]).unwrap();
        let heap = trace_request_heap_bytes(&decoded);
        let ratio = heap as f64 / wire.len() as f64;
        eprintln!("decoded heap {heap} B / protobuf wire {} B = {ratio:.2}", wire.len());
        assert!(ratio > 1.0 && ratio < DECODED_PER_WIRE_BYTE as f64, "{ratio}");
    }

    fn limiter(yaml: &str) -> MemoryLimiterConfig {
        serde_yaml_ng::from_str(yaml).unwrap()
    }

    /// Bounded by default: 80 % of a cgroup limit, 512 MiB without one; the collector's keys
    /// otherwise, `limit_mib: 0` off.
    #[test]
    fn memory_limit_defaults_to_the_cgroup_or_512_mib_and_takes_percentages() {
        let gib = 1u64 << 30;
        let in_cgroup = SystemMemory { cgroup: Some(2 * gib), host: Some(16 * gib) };
        let bare = SystemMemory { cgroup: None, host: Some(16 * gib) };
        let d = effective_limit(None, in_cgroup).unwrap();
        assert_eq!((d.hard, d.spike, d.basis), (2 * gib * 80 / 100, 2 * gib * 80 / 100 / 5, LimitBasis::DefaultCgroup { of: 2 * gib }));
        let d = effective_limit(None, bare).unwrap();
        assert_eq!((d.hard, d.spike, d.basis), (512 << 20, (512 << 20) / 5, LimitBasis::DefaultFixed));
        let p = effective_limit(
            Some(&limiter(
                "limit_percentage: 50
spike_limit_percentage: 10",
            )),
            in_cgroup,
        )
        .unwrap();
        assert_eq!((p.hard, p.spike), (gib, 2 * gib * 10 / 100));
        let p = effective_limit(Some(&limiter("limit_percentage: 25")), bare).unwrap();
        assert_eq!((p.hard, p.spike, p.basis), (4 * gib, 4 * gib / 5, LimitBasis::Percentage { of: 16 * gib, cgroup: false }));
        let m = effective_limit(
            Some(&limiter(
                "limit_mib: 300
spike_limit_mib: 50",
            )),
            in_cgroup,
        )
        .unwrap();
        assert_eq!((m.hard, m.spike), (300 << 20, 50 << 20));
        assert_eq!(effective_limit(Some(&limiter("limit_mib: 0")), in_cgroup), None, "limit_mib: 0 is off");
        for (yaml, key) in [
            ("{}", "limit_mib"),
            (
                "limit_mib: 100
limit_percentage: 50",
                "limit_percentage",
            ),
            ("limit_percentage: 0", "limit_percentage"),
            ("limit_percentage: 101", "limit_percentage"),
            (
                "limit_percentage: 50
spike_limit_percentage: 50",
                "spike_limit_percentage",
            ),
            (
                "limit_percentage: 50
spike_limit_mib: 5",
                "spike_limit_mib",
            ),
            (
                "limit_mib: 100
spike_limit_percentage: 5",
                "spike_limit_percentage",
            ),
            (
                "limit_mib: 100
spike_limit_mib: 100",
                "spike_limit_mib",
            ),
            (
                "limit_mib: 100
check_interval: 0s",
                "check_interval",
            ),
        ] {
            assert_eq!(limiter(yaml).check().map_err(|e| e.0), Err(key), "{yaml}");
        }
        for ok in [
            "limit_mib: 0",
            "limit_mib: 10",
            "limit_percentage: 80
spike_limit_percentage: 20",
        ] {
            assert_eq!(limiter(ok).check(), Ok(()), "{ok}");
        }
    }

    /// cgroup v2 and v1, at the named path or the namespace's root; `max` and v1's huge number
    /// are no limit.
    #[test]
    fn memory_cgroup_limits_are_read_v2_and_v1() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let write = |p: &str, v: &str| {
            let p = root.join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, v).unwrap();
        };
        assert_eq!(cgroup_limit(root, "0::/app\n"), None, "nothing mounted");
        write("app/memory.max", "1073741824\n");
        assert_eq!(cgroup_limit(root, "0::/app\n"), Some(1 << 30));
        write("app/memory.max", "max\n");
        assert_eq!(cgroup_limit(root, "0::/app\n"), None);
        write("memory.max", "536870912\n");
        assert_eq!(cgroup_limit(root, "0::/elsewhere\n"), Some(512 << 20), "the namespace's root");
        let v1 = "4:memory:/docker/abc\n0::/\n";
        write("memory/docker/abc/memory.limit_in_bytes", "9223372036854771712\n");
        assert_eq!(cgroup_limit(root, v1), Some(512 << 20), "v1 unlimited; then v2's root");
        write("memory/docker/abc/memory.limit_in_bytes", "268435456\n");
        assert_eq!(cgroup_limit(root, v1), Some(256 << 20));
    }
}
