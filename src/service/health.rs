//! The engine's heartbeat: what the health check reads, so a dead or stuck engine answers 503
//! instead of a green "available" while nothing is decided.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::evidence::time::Moment;

/// Beaten by the engine task on every step; read by the health check.
#[derive(Debug, Default)]
pub(crate) struct Heartbeat {
    last_beat_ns: AtomicU64,
    stopped: AtomicBool,
    draining: AtomicBool,
    store_down: AtomicBool,
    /// When the store went down (wall-clock nanoseconds; 0 while it is up).
    store_down_since_ns: AtomicU64,
}

/// What the health check answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Health {
    Available,
    /// The engine has not stepped for longer than the stall limit.
    Stuck,
    /// The engine task ended (it panicked, or it finished).
    Stopped,
    /// The service is shutting down.
    Draining,
    /// Deciding, but the state store is unavailable: verdicts are capped at `unverified`
    /// (`partial: store_unavailable`). Still 200: the instance must keep its place behind the
    /// load balancer (moving its traces elsewhere would split more chains), and nothing it says
    /// is greener for it.
    Degraded,
}

impl Health {
    pub(crate) fn is_ok(self) -> bool {
        matches!(self, Health::Available | Health::Degraded)
    }
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Health::Available => "Server available",
            Health::Stuck => "Engine stuck",
            Health::Stopped => "Engine stopped",
            Health::Draining => "Server is shutting down",
            Health::Degraded => "Server available, degraded: state store unavailable",
        }
    }
}

/// Sets `stopped` when dropped: at the end of the engine task, and when it unwinds from a panic.
pub(crate) struct StoppedGuard(Arc<Heartbeat>);

impl Drop for StoppedGuard {
    fn drop(&mut self) {
        self.0.stopped.store(true, Ordering::SeqCst);
    }
}

impl Heartbeat {
    pub(crate) fn new(now: Moment) -> Arc<Heartbeat> {
        let h = Arc::new(Heartbeat::default());
        h.beat(now);
        h
    }

    pub(crate) fn beat(&self, now: Moment) {
        self.last_beat_ns.store(now.as_nanos(), Ordering::Relaxed);
    }

    /// A guard the engine task holds for its lifetime.
    pub(crate) fn guard(self: &Arc<Self>) -> StoppedGuard {
        StoppedGuard(self.clone())
    }

    /// Whether the state store's last operation failed (see [`Self::set_store_down`]).
    pub(crate) fn is_store_down(&self) -> bool {
        self.store_down.load(Ordering::Relaxed)
    }

    /// Told by the engine task after every step.
    pub(crate) fn set_store_down(&self, down: bool) {
        self.set_store_down_at(down, Moment::wall_now());
    }

    /// [`Self::set_store_down`] at `now`: a store going down remembers since when.
    pub(crate) fn set_store_down_at(&self, down: bool, now: Moment) {
        let was = self.store_down.swap(down, Ordering::Relaxed);
        if down && !was {
            self.store_down_since_ns.store(now.as_nanos().max(1), Ordering::Relaxed);
        } else if !down {
            self.store_down_since_ns.store(0, Ordering::Relaxed);
        }
    }

    /// Since when the store has been down (`None` while it is up).
    pub(crate) fn store_down_since(&self) -> Option<Moment> {
        let ns = self.store_down_since_ns.load(Ordering::Relaxed);
        (ns != 0 && self.is_store_down()).then(|| Moment::from_nanos(ns))
    }

    /// The engine's last step.
    pub(crate) fn last_beat(&self) -> Moment {
        Moment::from_nanos(self.last_beat_ns.load(Ordering::Relaxed))
    }

    pub(crate) fn set_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// The health at `now`: stuck when the engine has not stepped for `stall_after`.
    pub(crate) fn health(&self, now: Moment, stall_after: Duration) -> Health {
        if self.draining.load(Ordering::SeqCst) {
            Health::Draining
        } else if self.stopped.load(Ordering::SeqCst) {
            Health::Stopped
        } else if now.saturating_duration_since(Moment::from_nanos(self.last_beat_ns.load(Ordering::Relaxed))) > stall_after {
            Health::Stuck
        } else if self.store_down.load(Ordering::Relaxed) {
            Health::Degraded
        } else {
            Health::Available
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stopped_or_silent_engine_is_not_available() {
        let t0 = Moment::from_nanos(1_000_000_000);
        let h = Heartbeat::new(t0);
        let stall = Duration::from_secs(5);
        assert_eq!(h.health(t0 + Duration::from_secs(4), stall), Health::Available);
        assert_eq!(h.health(t0 + Duration::from_secs(6), stall), Health::Stuck, "no step for longer than the stall limit");
        h.beat(t0 + Duration::from_secs(6));
        assert_eq!(h.health(t0 + Duration::from_secs(7), stall), Health::Available);
        // The engine task panics: its guard unwinds and the health says so for good.
        let hb = h.clone();
        let r = std::thread::spawn(move || {
            let _g = hb.guard();
            panic!("engine panicked");
        })
        .join();
        assert!(r.is_err());
        assert_eq!(h.health(t0 + Duration::from_secs(7), stall), Health::Stopped);
        h.set_draining();
        assert_eq!(h.health(t0 + Duration::from_secs(7), stall), Health::Draining);
    }

    #[test]
    fn a_store_that_is_down_makes_the_health_degraded_but_still_ok() {
        let t0 = Moment::from_nanos(1_000_000_000);
        let h = Heartbeat::new(t0);
        h.set_store_down(true);
        let now = h.health(t0, Duration::from_secs(5));
        assert_eq!((now, now.is_ok()), (Health::Degraded, true));
        assert!(now.as_str().contains("state store unavailable"));
        h.set_store_down(false);
        assert_eq!(h.health(t0, Duration::from_secs(5)), Health::Available);
    }
}
