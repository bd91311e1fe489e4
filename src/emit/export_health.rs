//! What an exporter's attempts tell about its backend: the last attempt that went through, the
//! last that failed, and since when every attempt has failed. Read by the component health
//! (`/status/health`): a backend that refuses or cannot be reached for longer than
//! `extensions.health_check.exporter_failure_threshold` makes its exporter unhealthy, while `/`
//! stays green unless asked otherwise (a dead backend is no reason to restart this process).
//!
//! Times only, never the target or the error text: the endpoint may carry credentials.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::evidence::time::Moment;

/// One exporter's record of its attempts (wall-clock nanoseconds; 0 is "never").
#[derive(Debug, Default)]
pub(crate) struct ExportHealth {
    last_success_ns: AtomicU64,
    last_failure_ns: AtomicU64,
    /// The first failed attempt after the last one that went through; 0 while not failing.
    failing_since_ns: AtomicU64,
}

/// A reading of [`ExportHealth`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ExportState {
    pub last_success: Option<Moment>,
    pub last_failure: Option<Moment>,
    /// Every attempt since this moment failed; `None` when the last attempt went through (or
    /// none was made).
    pub failing_since: Option<Moment>,
}

fn moment(ns: u64) -> Option<Moment> {
    (ns != 0).then(|| Moment::from_nanos(ns))
}

impl ExportHealth {
    /// An attempt the backend accepted (a partial success included: the backend answered).
    pub(crate) fn succeeded(&self, now: Moment) {
        self.last_success_ns.store(now.as_nanos().max(1), Ordering::Relaxed);
        self.failing_since_ns.store(0, Ordering::Relaxed);
    }

    /// An attempt that did not reach the backend or that it refused.
    pub(crate) fn failed(&self, now: Moment) {
        let ns = now.as_nanos().max(1);
        self.last_failure_ns.store(ns, Ordering::Relaxed);
        let _ = self.failing_since_ns.compare_exchange(0, ns, Ordering::Relaxed, Ordering::Relaxed);
    }

    pub(crate) fn state(&self) -> ExportState {
        ExportState {
            last_success: moment(self.last_success_ns.load(Ordering::Relaxed)),
            last_failure: moment(self.last_failure_ns.load(Ordering::Relaxed)),
            failing_since: moment(self.failing_since_ns.load(Ordering::Relaxed)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn failing_since_is_the_first_failure_after_the_last_success() {
        let h = ExportHealth::default();
        let t0 = Moment::from_nanos(1_000_000_000);
        assert_eq!(h.state(), ExportState::default(), "nothing tried: nothing known");
        h.succeeded(t0);
        h.failed(t0 + Duration::from_secs(1));
        h.failed(t0 + Duration::from_secs(5));
        let s = h.state();
        assert_eq!(s.failing_since, Some(t0 + Duration::from_secs(1)), "the first failure, not the latest");
        assert_eq!(s.last_failure, Some(t0 + Duration::from_secs(5)));
        assert_eq!(s.last_success, Some(t0));
        h.succeeded(t0 + Duration::from_secs(6));
        assert_eq!(h.state().failing_since, None, "a success ends the failure");
        h.failed(t0 + Duration::from_secs(7));
        assert_eq!(h.state().failing_since, Some(t0 + Duration::from_secs(7)));
    }
}
