//! The memory limiter, with the collector's `memory_limiter` semantics: a hard limit and a spike
//! allowance; above the soft limit (`limit - spike`) every receiver refuses whole requests with
//! the retryable answer (`UNAVAILABLE`, 503 + `Retry-After`), so senders keep their data and retry
//! once memory is back under the limit. Memory is sampled every `check_interval` (the process's
//! resident set, from `/proc/self/statm`); the refusal itself is one atomic load per request.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Where the process stands against its memory limit.
#[derive(Debug)]
pub struct MemoryLimiter {
    soft: u64,
    hard: u64,
    over: AtomicBool,
    rss: AtomicU64,
    /// What requests admitted since the last sample are estimated to hold: between two samples a
    /// burst of large requests is counted before the resident set shows it.
    pending: AtomicU64,
}

/// What an admitted span is estimated to hold until its request is exported and its chain
/// decided (measured: a 4.2 MB request of 11,400 MCP spans raised the resident set by ~45 MB —
/// decoded, re-encoded for pass-through, and kept as evidence). Issue 11 keeps wire bytes instead.
pub const BYTES_PER_ADMITTED_SPAN: u64 = 4096;

impl MemoryLimiter {
    /// `limit_mib` the hard limit; `spike_limit_mib` the allowance above the soft limit (the
    /// collector's default: a fifth of the limit).
    pub fn new(limit_mib: u64, spike_limit_mib: Option<u64>) -> MemoryLimiter {
        let hard = limit_mib << 20;
        let spike = spike_limit_mib.map_or(hard / 5, |s| s << 20).min(hard);
        MemoryLimiter { soft: hard - spike, hard, over: AtomicBool::new(false), rss: AtomicU64::new(0), pending: AtomicU64::new(0) }
    }

    /// Take a sample; returns `Some(now_over)` when the state changed.
    pub fn sample(&self, rss_bytes: u64) -> Option<bool> {
        self.rss.store(rss_bytes, Ordering::Relaxed);
        // The resident set now shows what was admitted before it.
        self.pending.store(0, Ordering::Relaxed);
        let over = rss_bytes > self.soft;
        (self.over.swap(over, Ordering::Relaxed) != over).then_some(over)
    }

    /// Refuse new data now: over at the last sample, or over with what was admitted since.
    pub fn over(&self) -> bool {
        self.over.load(Ordering::Relaxed)
            || self.rss.load(Ordering::Relaxed).saturating_add(self.pending.load(Ordering::Relaxed)) > self.soft
    }

    /// Count what an admitted request is estimated to hold until the next sample.
    pub fn charge(&self, bytes: u64) {
        self.pending.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn rss(&self) -> u64 {
        self.rss.load(Ordering::Relaxed)
    }

    pub fn limits(&self) -> (u64, u64) {
        (self.soft, self.hard)
    }
}

/// The process's resident set in bytes (Linux), if it can be read.
pub fn process_rss() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok().filter(|p| *p > 0).unwrap_or(4096))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_above_the_soft_limit_and_recovers_below_it() {
        let m = MemoryLimiter::new(100, Some(20));
        assert_eq!(m.limits(), (80 << 20, 100 << 20));
        assert_eq!(m.sample(50 << 20), None, "under: no change");
        assert!(!m.over());
        assert_eq!(m.sample(81 << 20), Some(true), "over the soft limit");
        assert!(m.over());
        assert_eq!(m.sample(90 << 20), None);
        assert_eq!(m.sample(79 << 20), Some(false), "back under");
        assert!(!m.over());
        // A burst admitted between two samples counts before the resident set shows it.
        m.charge(2 << 20);
        assert!(m.over(), "79 MiB + 2 MiB admitted since the sample is over the 80 MiB soft limit");
        assert_eq!(m.sample(70 << 20), None);
        assert!(!m.over(), "a new sample replaces the estimate");
        // The collector's default spike allowance is a fifth of the limit.
        assert_eq!(MemoryLimiter::new(256, None).limits().0, (256 << 20) - ((256 << 20) / 5));
        assert!(process_rss().is_some_and(|r| r > 0));
    }
}
