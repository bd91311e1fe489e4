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
//!
//! Time alone does not bound it under load: flat out an instance writes some 80 000 keys a second
//! (decided chains and operation keys), so a period of six minutes would hold tens of millions. A
//! generation therefore also turns when it holds [`MAX_PER_GENERATION`] keys, forgetting (and
//! counting) what the older one held: the same safe forgetting, sooner.

use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

use super::Table;

/// Keys one generation holds before it turns early (see the module documentation): with two
/// generations and the expiring tables' pair, at most four times this many are remembered.
pub(crate) const MAX_PER_GENERATION: usize = 250_000;

/// One key of the store: its table and its key in that table.
#[cfg(test)]
pub(crate) type Key = (Table, String);

/// One map per table, so that a key is looked up by `&str` (the store's `apply` looks up every
/// record it writes; a `(Table, String)` key would be a `String` allocated per lookup), hashed
/// with FxHash: the keys are this instance's own (trace ids, session and server keys), and the
/// map is bounded in time, so a flood of colliding keys costs at most that period's lookups.
type ByTable<V> = [FxHashMap<String, Stamped<V>>; Table::ALL.len()];

/// A remembered value and the generation that last touched it.
#[derive(Clone, Copy, Debug)]
struct Stamped<V> {
    value: V,
    generation: u64,
}

/// Two generations of remembered values: touched recently (stamped with the current
/// generation), and touched one period before (the one before it). Both live in one map, each
/// entry stamped: a lookup, a write or a removal is one probe of one table, and the table keeps
/// its room from one generation to the next (two maps, the older dropped and the current
/// taken at each turn, cost two probes per miss and a table grown again by doubling each
/// period). A turn drops what the older generation still holds by one pass over the map.
#[derive(Debug)]
struct Generations<V> {
    maps: ByTable<V>,
    /// The current generation's stamp.
    generation: u64,
    /// Keys stamped with the current generation.
    current: usize,
    period: Duration,
    next_turn: Option<Instant>,
    /// Keys the current generation holds before it turns early.
    cap: usize,
    /// Dropped by early turns since the last [`Self::turn`] (which reports them).
    dropped_early: u64,
}

impl<V: Copy> Generations<V> {
    fn new(period: Duration, cap: usize) -> Self {
        Generations {
            maps: std::array::from_fn(|_| FxHashMap::default()),
            generation: 0,
            current: 0,
            period: period.max(Duration::from_millis(1)),
            next_turn: None,
            cap: cap.max(1),
            dropped_early: 0,
        }
    }

    /// The value of `k`, kept for another period (stamped with the current generation).
    fn get(&mut self, t: Table, k: &str) -> Option<V> {
        let e = self.maps[t as usize].get_mut(k)?;
        if e.generation != self.generation {
            e.generation = self.generation;
            self.current += 1;
        }
        Some(e.value)
    }

    fn insert(&mut self, t: Table, k: String, v: V) {
        let was = self.maps[t as usize].insert(k, Stamped { value: v, generation: self.generation });
        self.stamped(was);
    }

    /// [`Self::insert`] for a key likely remembered already: its entry is updated in place,
    /// without a new copy of the key.
    fn set(&mut self, t: Table, k: &str, v: V) {
        let generation = self.generation;
        let Some(e) = self.maps[t as usize].get_mut(k) else {
            return self.insert(t, k.to_string(), v);
        };
        let was = std::mem::replace(e, Stamped { value: v, generation });
        self.stamped(Some(was));
    }

    /// An entry was written with the current generation's stamp (`was`: what it held before):
    /// counted in the current generation unless it was already, which turns early when full.
    fn stamped(&mut self, was: Option<Stamped<V>>) {
        match was {
            Some(was) if was.generation == self.generation => {}
            _ => self.current += 1,
        }
        if self.current >= self.cap {
            // Full before its period ended: what the older generation still holds goes now.
            self.dropped_early += self.advance();
        }
    }

    fn remove(&mut self, t: Table, k: &str) {
        if let Some(was) = self.maps[t as usize].remove(k) {
            if was.generation == self.generation {
                self.current -= 1;
            }
        }
    }

    /// The current generation becomes the older one: what the older one held is dropped; how
    /// many.
    fn advance(&mut self) -> u64 {
        let generation = self.generation;
        let mut dropped = 0;
        for m in &mut self.maps {
            let before = m.len();
            m.retain(|_, e| e.generation == generation);
            dropped += (before - m.len()) as u64;
            // The room a burst grew goes back once the keys are far fewer.
            if m.capacity() > 1024 && m.len() * 4 < m.capacity() {
                m.shrink_to(m.len() * 2);
            }
        }
        self.generation += 1;
        self.current = 0;
        dropped
    }

    /// Turn the generations when a period has passed since the last turn: what the older one
    /// still holds (untouched for a whole period since) is dropped; its count is returned.
    fn turn(&mut self, now: Instant) -> u64 {
        let early = std::mem::take(&mut self.dropped_early);
        let Some(at) = self.next_turn else {
            self.next_turn = Some(now + self.period);
            return early;
        };
        if now < at {
            return early;
        }
        let mut dropped = self.advance();
        if now >= at + self.period {
            // Two periods passed without a turn (nothing touched the store): drop both.
            dropped += self.advance();
        }
        self.next_turn = Some(now + self.period);
        dropped + early
    }

    fn len(&self) -> usize {
        self.maps.iter().map(FxHashMap::len).sum()
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
        Self::with_cap(remember_for, expire_after, MAX_PER_GENERATION)
    }

    /// [`Self::new`] with generations of at most `cap` keys.
    pub(super) fn with_cap(remember_for: Duration, expire_after: Duration, cap: usize) -> Self {
        Versions { kept: Generations::new(remember_for, cap), expiring: Generations::new(expire_after, cap), forgotten: 0 }
    }

    fn of(&mut self, table: Table) -> &mut Generations<V> {
        if table.expires() {
            &mut self.expiring
        } else {
            &mut self.kept
        }
    }

    pub(super) fn get(&mut self, table: Table, k: &str) -> Option<V> {
        self.of(table).get(table, k)
    }

    pub(super) fn insert(&mut self, table: Table, k: String, v: V) {
        self.of(table).insert(table, k, v);
    }

    /// [`Self::insert`] for a key likely remembered already (updated in place, the key not
    /// copied again).
    pub(super) fn set(&mut self, table: Table, k: &str, v: V) {
        self.of(table).set(table, k, v);
    }

    pub(super) fn remove(&mut self, table: Table, k: &str) {
        self.of(table).remove(table, k);
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
    use proptest::prelude::*;

    fn key(t: Table, k: &str) -> Key {
        (t, k.to_string())
    }

    impl<V: Copy> Versions<V> {
        fn get_key(&mut self, k: &Key) -> Option<V> {
            self.get(k.0, &k.1)
        }

        fn insert_key(&mut self, k: Key, v: V) {
            self.insert(k.0, k.1, v)
        }

        fn remove_key(&mut self, k: &Key) {
            self.remove(k.0, &k.1)
        }
    }

    /// A key touched within a period is kept; one untouched for two periods is dropped and
    /// counted; the tables that expire in the store turn on their own period.
    #[test]
    fn untouched_keys_are_forgotten_after_two_periods_and_counted() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut v: Versions<u64> = Versions::new(10 * s, 2 * s);
        v.turn(t0);
        v.insert_key(key(Table::Decided, "kept-by-touch"), 1);
        v.insert_key(key(Table::Decided, "untouched"), 2);
        v.insert_key(key(Table::Halves, "list-of-second-7"), 3);
        // 2 s: the expiring table turns (its key is now older); the others not yet.
        v.turn(t0 + 2 * s);
        assert_eq!(v.len(), 3);
        // 4 s: the list record, untouched for two of its periods, is forgotten.
        v.turn(t0 + 4 * s);
        assert_eq!(v.get_key(&key(Table::Halves, "list-of-second-7")), None);
        assert_eq!(v.forgotten, 1);
        // 10 s: a turn of the kept records; one is touched after it (moved back to current).
        v.turn(t0 + 10 * s);
        assert_eq!(v.get_key(&key(Table::Decided, "kept-by-touch")), Some(1));
        // 20 s: the untouched one is dropped, the touched one kept.
        v.turn(t0 + 20 * s);
        assert_eq!(v.get_key(&key(Table::Decided, "untouched")), None);
        assert_eq!(v.get_key(&key(Table::Decided, "kept-by-touch")), Some(1));
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
        v.insert_key(key(Table::Sessions, "a"), 1);
        v.turn(t0 + s);
        v.insert_key(key(Table::Sessions, "a"), 2);
        assert_eq!((v.len(), v.get_key(&key(Table::Sessions, "a"))), (1, Some(2)));
        v.turn(t0 + 2 * s);
        v.remove_key(&key(Table::Sessions, "a"));
        assert_eq!(v.len(), 0);
        v.turn(t0 + 3 * s);
        assert_eq!(v.forgotten, 0, "a removed key is not counted as forgotten");
    }

    /// Under load a generation turns when it is full, not only when its period ends: the keys
    /// remembered stay within twice the bound, the ones touched since the last turn are kept,
    /// and what is dropped is counted at the next turn.
    #[test]
    fn a_full_generation_turns_early_and_counts_what_it_drops() {
        let t0 = Instant::now();
        let mut v: Versions<u64> = Versions::with_cap(Duration::from_secs(3600), Duration::from_secs(3600), 4);
        v.turn(t0);
        for i in 0..10u64 {
            v.insert_key(key(Table::Decided, &format!("k{i}")), i);
            assert!(v.len() <= 8, "{} keys after {i}", v.len());
        }
        // k0–k3 filled the first generation, k4–k7 the second (k0–k3 then dropped), k8, k9 since.
        assert_eq!(v.turn(t0 + Duration::from_secs(1)), 4);
        assert_eq!(v.forgotten, 4);
        assert_eq!(v.get_key(&key(Table::Decided, "k0")), None);
        assert_eq!(v.get_key(&key(Table::Decided, "k5")), Some(5));
        assert_eq!(v.get_key(&key(Table::Decided, "k9")), Some(9));
    }

    /// The two generations as two maps: the older dropped and the current taken at each turn.
    /// What the stamped map must behave as.
    #[derive(Default)]
    struct TwoMaps {
        current: std::collections::HashMap<Key, u64>,
        older: std::collections::HashMap<Key, u64>,
        dropped: u64,
    }

    impl TwoMaps {
        fn get(&mut self, k: &Key) -> Option<u64> {
            if let Some(v) = self.current.get(k) {
                return Some(*v);
            }
            let v = self.older.remove(k)?;
            self.current.insert(k.clone(), v);
            Some(v)
        }

        fn insert(&mut self, k: Key, v: u64, cap: usize) {
            self.older.remove(&k);
            self.current.insert(k, v);
            if self.current.len() >= cap {
                self.advance();
            }
        }

        fn remove(&mut self, k: &Key) {
            self.current.remove(k);
            self.older.remove(k);
        }

        fn advance(&mut self) {
            self.dropped += self.older.len() as u64;
            self.older = std::mem::take(&mut self.current);
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u8, u64),
        Set(u8, u64),
        Get(u8),
        Remove(u8),
        /// Seconds since the last step.
        Wait(u8),
    }

    proptest::proptest! {
        /// Any sequence of writes, reads, removals and pauses leaves the stamped generations
        /// remembering what two maps would (the same values, the same keys forgotten, the same
        /// count), with turns on time and on a full generation.
        #[test]
        fn stamped_generations_remember_what_two_maps_would(cap in 1usize..6, ops in proptest::collection::vec(
            proptest::prop_oneof![
                4 => (0u8..12, 0u64..100).prop_map(|(k, v)| Op::Insert(k, v)),
                2 => (0u8..12, 0u64..100).prop_map(|(k, v)| Op::Set(k, v)),
                3 => (0u8..12).prop_map(Op::Get),
                1 => (0u8..12).prop_map(Op::Remove),
                1 => (0u8..5).prop_map(Op::Wait),
            ], 0..120)) {
            let period = Duration::from_secs(2);
            let t0 = Instant::now();
            let mut now = t0;
            let mut g: Generations<u64> = Generations::new(period, cap);
            let mut m = TwoMaps::default();
            let mut next_turn = now + period;
            g.turn(now);
            // The key's table alternates, so that a table's keys turn with the others'.
            let k = |i: u8| if i.is_multiple_of(2) { key(Table::Decided, &format!("k{i}")) } else { key(Table::Operations, &format!("k{i}")) };
            let mut reported = 0;
            for op in ops {
                match op {
                    Op::Insert(i, v) => {
                        let k = k(i);
                        g.insert(k.0, k.1.clone(), v);
                        m.insert(k, v, cap);
                    }
                    Op::Set(i, v) => {
                        let k = k(i);
                        g.set(k.0, &k.1, v);
                        m.insert(k, v, cap);
                    }
                    Op::Get(i) => {
                        let k = k(i);
                        prop_assert_eq!(g.get(k.0, &k.1), m.get(&k));
                    }
                    Op::Remove(i) => {
                        let k = k(i);
                        g.remove(k.0, &k.1);
                        m.remove(&k);
                    }
                    Op::Wait(s) => {
                        now += Duration::from_secs(u64::from(s));
                        if now >= next_turn {
                            m.advance();
                            if now >= next_turn + period {
                                m.advance();
                            }
                            next_turn = now + period;
                        }
                        reported += g.turn(now);
                    }
                }
                prop_assert_eq!(g.len(), m.current.len() + m.older.len());
                prop_assert_eq!(g.current, m.current.len());
            }
            reported += std::mem::take(&mut g.dropped_early);
            prop_assert_eq!(reported, m.dropped);
            for i in 0..12 {
                let k = k(i);
                prop_assert_eq!(g.get(k.0, &k.1), m.get(&k));
            }
        }
    }
}
