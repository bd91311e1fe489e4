//! The engine's notion of "now": a point on a nanosecond time line, passed in, never read.
//!
//! In the service the time line is the wall clock (nanoseconds since the Unix epoch); in `replay`
//! it is span time (the latest span end seen so far); in tests it is whatever the test says. The
//! correlator and the classifier only ever compare moments they were given, so every rule that
//! depends on time is testable without sleeping and gives the same answer offline as online.

use std::ops::{Add, AddAssign, Sub};
use std::time::Duration;

/// A moment on the engine's time line, in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Moment(u64);

impl Moment {
    pub const ZERO: Moment = Moment(0);

    pub const fn from_nanos(ns: u64) -> Moment {
        Moment(ns)
    }

    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// How long after `earlier` this moment is; zero when it is not after it.
    pub fn saturating_duration_since(self, earlier: Moment) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }

    /// The wall clock now (for drivers only: the engine never calls this).
    pub fn wall_now() -> Moment {
        let ns = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        Moment(u64::try_from(ns).unwrap_or(u64::MAX))
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Add<Duration> for Moment {
    type Output = Moment;
    fn add(self, d: Duration) -> Moment {
        Moment(self.0.saturating_add(nanos(d)))
    }
}

impl AddAssign<Duration> for Moment {
    fn add_assign(&mut self, d: Duration) {
        *self = *self + d;
    }
}

impl Sub<Duration> for Moment {
    type Output = Moment;
    fn sub(self, d: Duration) -> Moment {
        Moment(self.0.saturating_sub(nanos(d)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates_instead_of_panicking() {
        let m = Moment::from_nanos(10);
        assert_eq!((m + Duration::from_nanos(5)).as_nanos(), 15);
        assert_eq!((m - Duration::from_secs(1)).as_nanos(), 0);
        assert_eq!(m.saturating_duration_since(Moment::from_nanos(20)), Duration::ZERO);
        assert_eq!((Moment::from_nanos(u64::MAX) + Duration::from_secs(1)).as_nanos(), u64::MAX);
    }
}
