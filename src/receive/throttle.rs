//! Rate-limited log lines (in the style of Vector's internal-log rate limiting): a hostile or
//! overloaded sender can cause thousands of refusals a second, and one log line each would bury
//! everything else on stderr (and cost more than the refusal). The first refusal of a kind is
//! logged at once; later ones within the window are only counted, and the next refusal after the
//! window logs one line carrying the count since the last line. The metrics count every one.
//!
//! The clock is a parameter so the window is tested with a manual clock, never by sleeping.

use std::hash::Hash;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

/// Where the throttle reads the time.
pub(crate) trait Clock {
    fn now(&self) -> Instant;
}

/// The monotonic system clock (the service's).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// What a line reports: the events (and their items) since the previous line of the same key,
/// this one included.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Suppressed {
    pub events: u64,
    pub items: u64,
}

#[derive(Debug)]
struct Entry {
    last_line: Instant,
    pending: Suppressed,
}

/// At most one line per key per `window`. Keys are meant to come from small closed sets (a
/// signal, a transport and a reason, all `&'static str`), so the table stays small; past
/// `MAX_KEYS` distinct keys a new key is logged every time rather than remembered (a bound, not
/// a silence).
#[derive(Debug)]
pub(crate) struct Throttle<K, C: Clock = SystemClock> {
    clock: C,
    window: Duration,
    entries: FxHashMap<K, Entry>,
}

const MAX_KEYS: usize = 256;

impl<K: Hash + Eq, C: Clock> Throttle<K, C> {
    pub(crate) fn new(clock: C, window: Duration) -> Self {
        Throttle { clock, window, entries: FxHashMap::default() }
    }

    /// Count one event of `key` carrying `items`; `Some` when a line is due now, with what it
    /// reports (the events since the last line, this one included).
    pub(crate) fn hit(&mut self, key: K, items: u64) -> Option<Suppressed> {
        let now = self.clock.now();
        let window = self.window;
        if !self.entries.contains_key(&key) && self.entries.len() >= MAX_KEYS {
            return Some(Suppressed { events: 1, items });
        }
        let mut fresh = false;
        let e = self.entries.entry(key).or_insert_with(|| {
            fresh = true;
            Entry { last_line: now, pending: Suppressed::default() }
        });
        e.pending.events += 1;
        e.pending.items = e.pending.items.saturating_add(items);
        // The first event of a key is logged at once; later ones once the window has passed.
        if fresh || now.saturating_duration_since(e.last_line) >= window {
            e.last_line = now;
            return Some(std::mem::take(&mut e.pending));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;

    use super::*;

    #[derive(Clone)]
    struct ManualClock(Rc<Cell<Instant>>);

    impl ManualClock {
        fn advance(&self, d: Duration) {
            self.0.set(self.0.get() + d);
        }
    }

    impl Clock for ManualClock {
        fn now(&self) -> Instant {
            self.0.get()
        }
    }

    #[test]
    fn one_line_per_key_per_window_carrying_the_count_since_the_last_line() {
        let clock = ManualClock(Rc::new(Cell::new(Instant::now())));
        let mut t = Throttle::new(clock.clone(), Duration::from_secs(10));
        // The first refusal of a reason is logged at once.
        assert_eq!(t.hit("too_large", 5), Some(Suppressed { events: 1, items: 5 }));
        // Within the window: counted, not logged; another reason has its own window.
        for _ in 0..3 {
            clock.advance(Duration::from_secs(2));
            assert_eq!(t.hit("too_large", 2), None);
        }
        assert_eq!(t.hit("undecodable", 1), Some(Suppressed { events: 1, items: 1 }));
        // Just short of the window: still quiet.
        clock.advance(Duration::from_millis(3_999));
        assert_eq!(t.hit("too_large", 2), None);
        // At the window: one line with everything since the last one, this refusal included.
        clock.advance(Duration::from_millis(1));
        assert_eq!(t.hit("too_large", 2), Some(Suppressed { events: 5, items: 10 }));
        // And the window starts again from that line.
        clock.advance(Duration::from_secs(9));
        assert_eq!(t.hit("too_large", 1), None);
        clock.advance(Duration::from_secs(1));
        assert_eq!(t.hit("too_large", 1), Some(Suppressed { events: 2, items: 2 }));
    }

    #[test]
    fn past_the_key_bound_every_event_of_a_new_key_is_logged() {
        let clock = ManualClock(Rc::new(Cell::new(Instant::now())));
        let mut t = Throttle::new(clock, Duration::from_secs(10));
        for k in 0..MAX_KEYS {
            assert!(t.hit(k, 1).is_some());
        }
        assert_eq!(t.hit(MAX_KEYS, 1), Some(Suppressed { events: 1, items: 1 }));
        assert_eq!(t.hit(MAX_KEYS, 1), Some(Suppressed { events: 1, items: 1 }), "not remembered, never silenced");
        assert_eq!(t.hit(0, 1), None, "known keys keep their window");
    }
}
