//! What a shared store's client remembers of each record's version, for compare-and-set, bounded
//! in time.
//!
//! Compare-and-set needs, per key, the version this instance last read or wrote. Remembered
//! forever, that map grew with every key an instance ever touched: records other instances
//! deleted (a session that ended elsewhere, a list record of a past second) were never seen to
//! go, and each delete of its own was kept for twice the tombstone's life — at 1 000 calls/s
//! with the default hour, millions of entries for decided chains that are never written again.
//!
//! So what is remembered is forgotten once it has not been touched for a while, in two
//! generations: an entry untouched for one period moves to the older generation, and one
//! untouched for two is dropped (counted). Forgetting a version is always safe, never silent:
//! the next write of that key expects it absent, the store refuses it as a conflict, and the
//! engine reads the record again, merges and writes (the path every conflict takes). The period
//! is chosen so that this does not happen to records the instance still writes: at least the
//! longest gap between two writes of one record (a decided chain's delete, `late_span_window`
//! after its write; a session's delete, its idle expiry after its last change). Records that
//! expire in the store on their own (the shared lists) are forgotten after their time to live,
//! since the store has forgotten them by then too.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::Table;

/// One key of the store: its table and its key in that table.
pub(crate) type Key = (Table, String);

/// Two generations of remembered values: touched recently, and touched one period before.
#[derive(Debug)]
struct Generations<V> {
    current: HashMap<Key, V>,
    older: HashMap<Key, V>,
    period: Duration,
    next_turn: Option<Instant>,
}

impl<V: Copy> Generations<V> {
    fn new(period: Duration) -> Self {
        Generations { current: HashMap::new(), older: HashMap::new(), period: period.max(Duration::from_millis(1)), next_turn: None }
    }

    /// The value of `k`, kept for another period (moved to the current generation).
    fn get(&mut self, k: &Key) -> Option<V> {
        if let Some(v) = self.current.get(k) {
            return Some(*v);
        }
        let v = self.older.remove(k)?;
        self.current.insert(k.clone(), v);
        Some(v)
    }

    fn insert(&mut self, k: Key, v: V) {
        self.older.remove(&k);
        self.current.insert(k, v);
    }

    fn remove(&mut self, k: &Key) {
        self.current.remove(k);
        self.older.remove(k);
    }

    /// Turn the generations when a period has passed since the last turn: what the older one
    /// still holds (untouched for a whole period since) is dropped; its count is returned.
    fn turn(&mut self, now: Instant) -> u64 {
        let Some(at) = self.next_turn else {
            self.next_turn = Some(now + self.period);
            return 0;
        };
        if now < at {
            return 0;
        }
        let dropped = self.older.len() as u64;
        self.older = std::mem::take(&mut self.current);
        // Two periods passed without a turn (nothing touched the store): drop both.
        let dropped = if now >= at + self.period { dropped + std::mem::take(&mut self.older).len() as u64 } else { dropped };
        self.next_turn = Some(now + self.period);
        dropped
    }

    fn len(&self) -> usize {
        self.current.len() + self.older.len()
    }
}

/// Versions by key, bounded in time (see the module documentation).
#[derive(Debug)]
pub(crate) struct Versions<V> {
    /// Records that stay until a writer deletes them.
    kept: Generations<V>,
    /// Records of the tables that expire in the store ([`Table::expires`]).
    expiring: Generations<V>,
    /// Entries dropped because they were not touched for two periods.
    pub forgotten: u64,
}

impl<V: Copy> Versions<V> {
    /// `remember_for`: the period for records that stay; `expire_after`: for those that expire.
    pub(super) fn new(remember_for: Duration, expire_after: Duration) -> Self {
        Versions { kept: Generations::new(remember_for), expiring: Generations::new(expire_after), forgotten: 0 }
    }

    fn of(&mut self, table: Table) -> &mut Generations<V> {
        if table.expires() {
            &mut self.expiring
        } else {
            &mut self.kept
        }
    }

    pub(super) fn get(&mut self, k: &Key) -> Option<V> {
        self.of(k.0).get(k)
    }

    pub(super) fn insert(&mut self, k: Key, v: V) {
        self.of(k.0).insert(k, v);
    }

    pub(super) fn remove(&mut self, k: &Key) {
        self.of(k.0).remove(k);
    }

    /// Drop what has not been touched for two periods (at most once a period, so a call per
    /// store operation costs a comparison); how many were dropped.
    pub(super) fn turn(&mut self, now: Instant) -> u64 {
        let dropped = self.kept.turn(now) + self.expiring.turn(now);
        self.forgotten += dropped;
        dropped
    }

    pub(super) fn len(&self) -> usize {
        self.kept.len() + self.expiring.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(t: Table, k: &str) -> Key {
        (t, k.to_string())
    }

    /// A key touched within a period is kept; one untouched for two periods is dropped and
    /// counted; the tables that expire in the store turn on their own period.
    #[test]
    fn untouched_keys_are_forgotten_after_two_periods_and_counted() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut v: Versions<u64> = Versions::new(10 * s, 2 * s);
        v.turn(t0);
        v.insert(key(Table::Decided, "kept-by-touch"), 1);
        v.insert(key(Table::Decided, "untouched"), 2);
        v.insert(key(Table::Halves, "list-of-second-7"), 3);
        // 2 s: the expiring table turns (its key is now older); the others not yet.
        v.turn(t0 + 2 * s);
        assert_eq!(v.len(), 3);
        // 4 s: the list record, untouched for two of its periods, is forgotten.
        v.turn(t0 + 4 * s);
        assert_eq!(v.get(&key(Table::Halves, "list-of-second-7")), None);
        assert_eq!(v.forgotten, 1);
        // 10 s: a turn of the kept records; one is touched after it (moved back to current).
        v.turn(t0 + 10 * s);
        assert_eq!(v.get(&key(Table::Decided, "kept-by-touch")), Some(1));
        // 20 s: the untouched one is dropped, the touched one kept.
        v.turn(t0 + 20 * s);
        assert_eq!(v.get(&key(Table::Decided, "untouched")), None);
        assert_eq!(v.get(&key(Table::Decided, "kept-by-touch")), Some(1));
        assert_eq!(v.forgotten, 2);
        // A long pause (no store operation for two periods) drops everything untouched.
        v.turn(t0 + 60 * s);
        assert_eq!(v.len(), 0);
        assert_eq!(v.forgotten, 3);
    }

    /// Written again or removed, a key is in one generation only.
    #[test]
    fn insert_and_remove_reach_both_generations() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut v: Versions<u64> = Versions::new(s, s);
        v.turn(t0);
        v.insert(key(Table::Sessions, "a"), 1);
        v.turn(t0 + s);
        v.insert(key(Table::Sessions, "a"), 2);
        assert_eq!((v.len(), v.get(&key(Table::Sessions, "a"))), (1, Some(2)));
        v.turn(t0 + 2 * s);
        v.remove(&key(Table::Sessions, "a"));
        assert_eq!(v.len(), 0);
        v.turn(t0 + 3 * s);
        assert_eq!(v.forgotten, 0, "a removed key is not counted as forgotten");
    }
}
