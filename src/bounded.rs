//! PLACEHOLDER (replaced by the bounded-table work): a set that forgets its oldest entry when full.

use std::collections::VecDeque;
use std::hash::Hash;

use rustc_hash::FxHashSet;

pub struct BoundedSet<K> {
    table: &'static str,
    cap: usize,
    set: FxHashSet<K>,
    order: VecDeque<K>,
    pub evicted: u64,
}

impl<K: Hash + Eq + Clone> BoundedSet<K> {
    pub fn with_capacity(table: &'static str, cap: usize) -> Self {
        BoundedSet { table, cap, set: FxHashSet::default(), order: VecDeque::new(), evicted: 0 }
    }
    pub fn insert(&mut self, k: K) -> bool {
        if self.set.contains(&k) {
            return false;
        }
        if self.cap == 0 {
            return true;
        }
        while self.set.len() >= self.cap {
            let Some(old) = self.order.pop_front() else { break };
            self.set.remove(&old);
            self.evicted += 1;
            let _ = self.table;
        }
        self.set.insert(k.clone());
        self.order.push_back(k);
        true
    }
    pub fn contains(&self, k: &K) -> bool {
        self.set.contains(k)
    }
    pub fn len(&self) -> usize {
        self.set.len()
    }
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }
}
