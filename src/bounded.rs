//! Bounded tables: every queue, table and cache of the service has a limit, and what hits a limit is
//! counted (issue 8). [`BoundedMap`] is the one map type for that: when an insert of a new key finds
//! it full, it evicts the oldest entry and counts the eviction under the table's name in a
//! process-wide registry ([`evictions`]), which the `mcp_health.state.evicted` metric reports.
//! [`BoundedSet`] is the same thing without values.
//!
//! "Oldest" is insertion order, where an [`insert`](BoundedMap::insert) of a key already present
//! **refreshes** it (it becomes the newest); lookups ([`get`](BoundedMap::get),
//! [`get_mut`](BoundedMap::get_mut), [`contains`](BoundedMap::contains)) do not. So the entry
//! evicted is the one least recently written.
//!
//! Implementation: a hash map of `key → (value, generation)` plus a `VecDeque` of `(key,
//! generation)` in insertion order, with lazy deletion: a removal or a refresh leaves a stale
//! queue entry (its generation no longer matches), skipped when it reaches the front. The queue is
//! compacted when stale entries outnumber live ones, so it stays under about twice the map and
//! every operation is O(1) amortized. (No crate for this: `lru`/`hashlink` would do, but they
//! reorder on reads or need unsafe linked lists, and this is sixty lines.)
//!
//! Capacity 0 keeps nothing: an insert of a new key is counted as evicted at once. The
//! configuration refuses 0 for every table (see `processors.mcp_health.limits`).

use std::borrow::Borrow;
use std::collections::VecDeque;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use rustc_hash::FxHashMap;

/// The eviction counter of a table, created on first use. Tables of the same name (one per thread,
/// or one per tap observer) share it.
pub(crate) fn counter(table: &'static str) -> &'static AtomicU64 {
    let mut r = registry().lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, c)) = r.iter().find(|(t, _)| *t == table) {
        return c;
    }
    // One leaked counter per distinct table name: the names are `&'static str` constants, a
    // handful in all.
    let c: &'static AtomicU64 = Box::leak(Box::new(AtomicU64::new(0)));
    r.push((table, c));
    c
}

fn registry() -> &'static Mutex<Vec<(&'static str, &'static AtomicU64)>> {
    static REGISTRY: Mutex<Vec<(&'static str, &'static AtomicU64)>> = Mutex::new(Vec::new());
    &REGISTRY
}

/// Every table that has a counter, with the entries it evicted so far, sorted by table name.
pub fn evictions() -> Vec<(&'static str, u64)> {
    let r = registry().lock().unwrap_or_else(|p| p.into_inner());
    let mut out: Vec<_> = r.iter().map(|(t, c)| (*t, c.load(Ordering::Relaxed))).collect();
    out.sort_unstable_by_key(|(t, _)| *t);
    out
}

/// Entries a table evicted so far (0 for a table never created).
pub fn evicted(table: &'static str) -> u64 {
    counter(table).load(Ordering::Relaxed)
}

/// A hash map with a capacity that evicts its oldest entry (see the module documentation) and
/// counts each eviction under its table name.
pub(crate) struct BoundedMap<K, V> {
    table: &'static str,
    cap: usize,
    map: FxHashMap<K, (V, u64)>,
    order: VecDeque<(K, u64)>,
    next_gen: u64,
    evicted: &'static AtomicU64,
}

impl<K: Hash + Eq + Clone, V> BoundedMap<K, V> {
    /// An empty map that holds at most `cap` entries; evictions count under `table`.
    pub(crate) fn with_capacity(table: &'static str, cap: usize) -> Self {
        let pre = cap.min(1024);
        BoundedMap {
            table,
            cap,
            map: FxHashMap::with_capacity_and_hasher(pre, Default::default()),
            order: VecDeque::with_capacity(pre),
            next_gen: 0,
            evicted: counter(table),
        }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.cap
    }

    /// Change the capacity; shrinking evicts (and counts) the oldest entries past it.
    pub(crate) fn set_capacity(&mut self, cap: usize) {
        self.cap = cap;
        while self.map.len() > cap {
            self.evict_oldest();
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Insert or replace `k`; returns the value it replaced. A new key in a full map evicts the
    /// oldest entry first (counted); a replaced key becomes the newest.
    pub(crate) fn insert(&mut self, k: K, v: V) -> Option<V> {
        let generation = self.next_gen;
        self.next_gen += 1;
        if let Some(e) = self.map.get_mut(&k) {
            e.1 = generation;
            let old = std::mem::replace(&mut e.0, v);
            self.order.push_back((k, generation));
            self.compact_if_stale();
            return Some(old);
        }
        if self.cap == 0 {
            self.evicted.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        while self.map.len() >= self.cap {
            self.evict_oldest();
        }
        self.order.push_back((k.clone(), generation));
        self.map.insert(k, (v, generation));
        self.compact_if_stale();
        None
    }

    /// The value of `k`, inserting `make()` first if absent (an insert as [`insert`](Self::insert)
    /// does; a present key is not refreshed).
    pub(crate) fn get_or_insert_with(&mut self, k: K, make: impl FnOnce() -> V) -> Option<&mut V> {
        if !self.map.contains_key(&k) {
            self.insert(k.clone(), make());
        }
        self.get_mut(&k)
    }

    pub(crate) fn get<Q>(&self, k: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.map.get(k).map(|e| &e.0)
    }

    pub(crate) fn get_mut<Q>(&mut self, k: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.map.get_mut(k).map(|e| &mut e.0)
    }

    pub(crate) fn contains<Q>(&self, k: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.map.contains_key(k)
    }

    /// Remove `k` (not an eviction: not counted).
    pub(crate) fn remove<Q>(&mut self, k: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let v = self.map.remove(k).map(|e| e.0);
        self.compact_if_stale();
        v
    }

    /// Keep the entries for which `keep` is true (removals, not counted).
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&K, &mut V) -> bool) {
        self.map.retain(|k, e| keep(k, &mut e.0));
        self.compact_if_stale();
    }

    /// Remove and return the oldest entries (by insertion or last replacement) while `due` says
    /// so, stopping at the first that is not: for a map whose entries fall due in the order they
    /// were put in (a time window), expiry costs what it removes, not a walk of every entry.
    pub(crate) fn take_oldest_while(&mut self, mut due: impl FnMut(&K, &V) -> bool) -> Vec<(K, V)> {
        let mut out = Vec::new();
        while let Some((k, generation)) = self.order.front() {
            match self.map.get(k) {
                Some(e) if e.1 == *generation => {
                    if !due(k, &e.0) {
                        break;
                    }
                    let Some((k, _)) = self.order.pop_front() else { break };
                    if let Some((v, _)) = self.map.remove(&k) {
                        out.push((k, v));
                    }
                }
                // Stale: removed or replaced since.
                _ => {
                    self.order.pop_front();
                }
            }
        }
        out
    }

    /// Every entry, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.map.iter().map(|(k, e)| (k, &e.0))
    }

    /// Remove the oldest entry and count it as evicted.
    fn evict_oldest(&mut self) {
        while let Some((k, generation)) = self.order.pop_front() {
            if self.map.get(&k).is_some_and(|e| e.1 == generation) {
                self.map.remove(&k);
                self.evicted.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
    }

    /// Drop stale queue entries once they outnumber the live ones (amortized O(1): at least
    /// `len + 16` pushes or removals happen between two compactions).
    fn compact_if_stale(&mut self) {
        if self.order.len() > 2 * self.map.len() + 16 {
            let map = &self.map;
            self.order.retain(|(k, g)| map.get(k).is_some_and(|e| e.1 == *g));
        }
    }
}

impl<K, V> std::fmt::Debug for BoundedMap<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoundedMap").field("table", &self.table).field("cap", &self.cap).field("len", &self.map.len()).finish()
    }
}

/// A [`BoundedMap`] without values.
#[derive(Debug)]
pub(crate) struct BoundedSet<K>(BoundedMap<K, ()>);

impl<K: Hash + Eq + Clone> BoundedSet<K> {
    pub(crate) fn with_capacity(table: &'static str, cap: usize) -> Self {
        BoundedSet(BoundedMap::with_capacity(table, cap))
    }

    /// Add `k`; true if it was not there (a present key is refreshed, as in [`BoundedMap::insert`]).
    pub(crate) fn insert(&mut self, k: K) -> bool {
        self.0.insert(k, ()).is_none()
    }

    pub(crate) fn contains<Q>(&self, k: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.0.contains(k)
    }

    /// Remove `k` (not counted); true if it was there.
    #[cfg(test)]
    pub(crate) fn remove<Q>(&mut self, k: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.0.remove(k).is_some()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // Each test uses its own table name: the registry is process-wide and tests run in parallel.

    #[test]
    fn evicts_the_oldest_and_counts_it() {
        let mut m = BoundedMap::with_capacity("test_bounded_order", 3);
        for i in 0..3 {
            assert_eq!(m.insert(i, i * 10), None);
        }
        assert_eq!(evicted("test_bounded_order"), 0);
        m.insert(3, 30);
        assert_eq!(m.len(), 3);
        assert!(!m.contains(&0), "the oldest went first");
        assert_eq!(m.get(&3), Some(&30));
        m.insert(4, 40);
        assert!(!m.contains(&1));
        assert_eq!(evicted("test_bounded_order"), 2);
        assert!(evictions().contains(&("test_bounded_order", 2)));
        let mut keys: Vec<_> = m.iter().map(|(k, _)| *k).collect();
        keys.sort_unstable();
        assert_eq!(keys, vec![2, 3, 4]);
    }

    #[test]
    fn an_update_refreshes_and_is_not_an_eviction() {
        let mut m = BoundedMap::with_capacity("test_bounded_update", 2);
        m.insert("a", 1);
        m.insert("b", 2);
        assert_eq!(m.insert("a", 3), Some(1), "the old value comes back");
        assert_eq!(m.len(), 2);
        assert_eq!(evicted("test_bounded_update"), 0);
        m.insert("c", 4);
        assert!(m.contains("a"), "a was refreshed by its update");
        assert!(!m.contains("b"), "b is now the oldest");
        assert_eq!(m.get("a"), Some(&3));
        *m.get_mut("a").unwrap() += 1;
        assert_eq!(m.get("a"), Some(&4));
        assert_eq!(evicted("test_bounded_update"), 1);
    }

    /// The oldest entries leave while due, in order, past removed and replaced ones, and the
    /// first not due stops the walk (those behind it stay, due or not).
    #[test]
    fn the_oldest_leave_while_due() {
        let mut m = BoundedMap::with_capacity("test_bounded_take_oldest", 10);
        for (k, at) in [("a", 1), ("b", 2), ("c", 3), ("d", 9), ("e", 4)] {
            m.insert(k, at);
        }
        m.remove(&"b");
        m.insert("a", 5); // replaced: now the newest
        let due = |_: &&str, at: &i32| *at <= 4;
        assert_eq!(m.take_oldest_while(due), vec![("c", 3)]);
        assert_eq!(m.len(), 3, "d (not due) stops the walk; e behind it stays");
        m.remove(&"d");
        assert_eq!(m.take_oldest_while(due), vec![("e", 4)]);
        assert_eq!(m.take_oldest_while(|_, _| true), vec![("a", 5)]);
        assert!(m.is_empty() && m.take_oldest_while(|_, _| true).is_empty());
        assert_eq!(counter("test_bounded_take_oldest").load(Ordering::Relaxed), 0, "not evictions");
    }

    #[test]
    fn removal_is_not_counted_and_frees_a_place() {
        let mut m = BoundedMap::with_capacity("test_bounded_remove", 2);
        m.insert(1, ());
        m.insert(2, ());
        assert_eq!(m.remove(&1), Some(()));
        m.insert(3, ());
        assert_eq!(m.len(), 2);
        assert_eq!(evicted("test_bounded_remove"), 0);
        m.insert(4, ());
        assert!(!m.contains(&2) && m.contains(&3) && m.contains(&4), "the stale place of 1 is skipped");
        assert_eq!(evicted("test_bounded_remove"), 1);
    }

    #[test]
    fn capacity_zero_keeps_nothing_and_one_keeps_the_last() {
        let mut z = BoundedMap::with_capacity("test_bounded_zero", 0);
        assert_eq!(z.insert(1, 1), None);
        assert!(z.is_empty() && z.get(&1).is_none());
        assert_eq!(evicted("test_bounded_zero"), 1);
        let mut one = BoundedMap::with_capacity("test_bounded_one", 1);
        one.insert(1, 1);
        one.insert(1, 2);
        assert_eq!(evicted("test_bounded_one"), 0, "an update is no eviction");
        one.insert(2, 3);
        assert_eq!(one.len(), 1);
        assert_eq!(one.get(&2), Some(&3));
        assert_eq!(evicted("test_bounded_one"), 1);
    }

    #[test]
    fn shrinking_evicts_the_oldest() {
        let mut m = BoundedMap::with_capacity("test_bounded_shrink", 4);
        for i in 0..4 {
            m.insert(i, ());
        }
        m.set_capacity(2);
        assert_eq!(m.len(), 2);
        assert!(m.contains(&2) && m.contains(&3));
        assert_eq!(evicted("test_bounded_shrink"), 2);
    }

    #[test]
    fn set_and_get_or_insert() {
        let mut s = BoundedSet::with_capacity("test_bounded_set", 2);
        assert!(s.insert("x"));
        assert!(!s.insert("x"));
        s.insert("y");
        s.insert("z");
        assert!(!s.contains("x") && s.len() == 2);
        assert!(s.remove("y") && !s.remove("y"));
        assert_eq!(evicted("test_bounded_set"), 1);
        let mut m: BoundedMap<String, Vec<u8>> = BoundedMap::with_capacity("test_bounded_entry", 1);
        m.get_or_insert_with("k".into(), Vec::new).unwrap().push(1);
        m.get_or_insert_with("k".into(), || unreachable!("present")).unwrap().push(2);
        assert_eq!(m.get("k"), Some(&vec![1, 2]));
    }

    #[test]
    fn churn_keeps_the_queue_small() {
        let mut m = BoundedMap::with_capacity("test_bounded_churn", 8);
        for i in 0..10_000u32 {
            m.insert(i % 4, i);
            m.remove(&((i + 1) % 4));
        }
        assert!(m.order.len() <= 2 * m.len() + 17, "stale entries are compacted: {}", m.order.len());
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u8),
        Remove(u8),
    }

    proptest! {
        /// Size never exceeds the capacity; evictions = inserts of new keys − removals − len; the
        /// survivors are the most recently written keys (checked against a model).
        #[test]
        fn bounded_never_exceeds_its_capacity(cap in 0usize..8, ops in proptest::collection::vec(
            prop_oneof![4 => any::<u8>().prop_map(|k| Op::Insert(k % 16)), 1 => any::<u8>().prop_map(|k| Op::Remove(k % 16))], 0..200)) {
            let mut m = BoundedMap::with_capacity("test_bounded_prop", cap);
            // Only this test uses the table, and proptest runs its cases one after the other.
            let start = evicted("test_bounded_prop");
            let (mut new_inserts, mut removed) = (0u64, 0u64);
            let mut model: Vec<u8> = Vec::new(); // oldest first
            for op in ops {
                match op {
                    Op::Insert(k) => {
                        if !m.contains(&k) { new_inserts += 1; }
                        m.insert(k, ());
                        model.retain(|x| *x != k);
                        model.push(k);
                        if model.len() > cap { model.remove(0); }
                    }
                    Op::Remove(k) => {
                        if m.remove(&k).is_some() { removed += 1; }
                        model.retain(|x| *x != k);
                    }
                }
                prop_assert!(m.len() <= cap);
            }
            prop_assert_eq!(evicted("test_bounded_prop") - start, new_inserts - removed - m.len() as u64);
            let mut got: Vec<u8> = m.iter().map(|(k, _)| *k).collect();
            got.sort_unstable();
            let mut want = model.clone();
            want.sort_unstable();
            prop_assert_eq!(got, want);
        }
    }
}
