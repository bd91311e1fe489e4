//! When each chain in flight falls due: an ordered queue, not a heap.
//!
//! Nearly every deadline is `now + decision_wait`, and `now` only moves forward, so deadlines
//! arrive in order: they go to the back of a FIFO, O(1) and in memory order. The few that do not
//! (a server half's longer wait, a chain re-checked at `first_seen + max_wait`, a clock moved
//! back in a replay) go to a small heap beside it. The earliest of the two fronts is next.
//!
//! Issue 11 measured the `BinaryHeap` alone at 4–5 % of the service's CPU: with a few hundred
//! thousand chains in flight every pop walks ~18 levels of a heap far larger than the cache.
//!
//! Deciding order is part of the engine's contract (the same input gives the same verdicts): the
//! heap decided entries due at the same moment in trace-id order, and so does [`DueQueue::due`],
//! which hands out everything due at once, sorted by `(moment, trace id)`.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use crate::evidence::time::Moment;
use crate::evidence::TraceId;

type Entry = (Moment, TraceId);

#[derive(Default)]
pub(crate) struct DueQueue {
    /// Deadlines that arrived in order (non-decreasing moments).
    fifo: VecDeque<Entry>,
    /// The others.
    heap: BinaryHeap<Reverse<Entry>>,
}

impl DueQueue {
    pub(crate) fn push(&mut self, at: Moment, id: TraceId) {
        if self.fifo.back().is_none_or(|&(last, _)| last <= at) {
            self.fifo.push_back((at, id));
        } else {
            self.heap.push(Reverse((at, id)));
        }
    }

    /// An entry of the earliest moment (among equal moments, not necessarily the least id).
    pub(crate) fn peek(&self) -> Option<Entry> {
        match (self.fifo.front(), self.heap.peek()) {
            (Some(&f), Some(&Reverse(h))) => Some(f.min(h)),
            (Some(&f), None) => Some(f),
            (None, Some(&Reverse(h))) => Some(h),
            (None, None) => None,
        }
    }

    /// Remove and return an entry of the earliest moment: among equal moments, the one pushed
    /// first (the heap took the least trace id). Only eviction pops one at a time, and which of
    /// several chains due at the same moment is evicted first depends on arrival anyway.
    pub(crate) fn pop(&mut self) -> Option<Entry> {
        let from_heap = match (self.fifo.front(), self.heap.peek()) {
            (Some(f), Some(Reverse(h))) => h < f,
            (None, Some(_)) => true,
            _ => false,
        };
        if from_heap {
            self.heap.pop().map(|Reverse(e)| e)
        } else {
            self.fifo.pop_front()
        }
    }

    /// Every entry due at `now` (moment ≤ `now`), removed, in `(moment, trace id)` order: the
    /// order the heap popped them in. Appended to `out`.
    pub(crate) fn due(&mut self, now: Moment, out: &mut Vec<Entry>) {
        let start = out.len();
        while self.fifo.front().is_some_and(|&(at, _)| at <= now) {
            if let Some(e) = self.fifo.pop_front() {
                out.push(e);
            }
        }
        while self.heap.peek().is_some_and(|&Reverse((at, _))| at <= now) {
            if let Some(Reverse(e)) = self.heap.pop() {
                out.push(e);
            }
        }
        out[start..].sort_unstable();
    }

    pub(crate) fn clear(&mut self) {
        self.fifo.clear();
        self.heap.clear();
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.fifo.len() + self.heap.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn id(n: u8) -> TraceId {
        let mut t = [0u8; 16];
        t[15] = n;
        t
    }

    proptest! {
        /// Whatever the order of pushes, `due` hands entries out exactly as a `BinaryHeap` of
        /// `Reverse((moment, id))` pops them, and `pop` and `peek` at the same moments.
        #[test]
        fn the_queue_orders_as_the_heap_did(ops in proptest::collection::vec((0u64..50, 0u8..20, 0u8..4), 0..200)) {
            let mut q = DueQueue::default();
            let mut h: BinaryHeap<Reverse<Entry>> = BinaryHeap::new();
            let mut clock = 0u64;
            for (t, n, op) in ops {
                match op {
                    // Mostly deadlines in order (clock + wait), sometimes out of order.
                    0 | 1 => {
                        clock += t % 3;
                        let e = (Moment::from_nanos(clock + 10), id(n));
                        q.push(e.0, e.1);
                        h.push(Reverse(e));
                    }
                    2 => {
                        let e = (Moment::from_nanos(t), id(n));
                        q.push(e.0, e.1);
                        h.push(Reverse(e));
                    }
                    _ => {
                        if n % 2 == 0 {
                            // The same moment; among equal moments, the first pushed.
                            let (got, want) = (q.pop(), h.pop().map(|Reverse(e)| e));
                            prop_assert_eq!(got.map(|e| e.0), want.map(|e| e.0));
                            if let (Some(g), Some(_)) = (got, want) {
                                // Keep the model in step: take out what the queue took.
                                h.push(Reverse(want.unwrap_or(g)));
                                let mut rest: Vec<Entry> = h.into_vec().into_iter().map(|Reverse(e)| e).collect();
                                let at = rest.iter().position(|e| *e == g);
                                prop_assert!(at.is_some(), "popped {:?}, which was never pushed", g);
                                rest.swap_remove(at.unwrap_or(0));
                                h = rest.into_iter().map(Reverse).collect();
                            }
                        } else {
                            let now = Moment::from_nanos(t);
                            let mut got = Vec::new();
                            q.due(now, &mut got);
                            let mut want = Vec::new();
                            while h.peek().is_some_and(|Reverse((at, _))| *at <= now) {
                                want.extend(h.pop().map(|Reverse(e)| e));
                            }
                            prop_assert_eq!(got, want);
                        }
                    }
                }
                prop_assert_eq!(q.peek().map(|e| e.0), h.peek().map(|Reverse(e)| e.0));
                prop_assert_eq!(q.len(), h.len());
            }
        }
    }

    #[test]
    fn in_order_deadlines_never_touch_the_heap() {
        let mut q = DueQueue::default();
        for n in 0..10u8 {
            q.push(Moment::from_nanos(u64::from(n / 3)), id(n));
        }
        assert!(q.heap.is_empty());
        q.push(Moment::from_nanos(0), id(99));
        assert_eq!(q.heap.len(), 1, "a deadline earlier than the last goes to the heap");
        assert_eq!(q.pop(), Some((Moment::from_nanos(0), id(0))));
    }
}
