//! The one bounded queue of the service: a name, a capacity, what happens to an item that finds
//! it full, and its depth for the gauges and the status page. The engine's input and both export
//! queues are this type, so what "full" means is decided where the queue is made, not at each
//! place that sends into it.

use tokio::sync::mpsc;

use super::outgoing::Outgoing;
use crate::telemetry::meters::FlowMeters;

/// What a queue does with an item that finds it full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnFull {
    /// The sender is told and keeps the item: a receiver reserves a place before it accepts a
    /// request and answers a retryable refusal when there is none, so its client keeps the data.
    Refuse,
    /// The item is dropped and counted: what mcp-health makes itself must never hold the engine
    /// up, and the next one supersedes it (health spans, incident records, cumulative metrics).
    DropCounted,
}

/// The sending side of a bounded queue (cloned by every producer; the queue closes when the last
/// one is dropped and the receiver has drained it).
#[derive(Debug)]
pub struct Queue<T> {
    name: &'static str,
    on_full: OnFull,
    tx: mpsc::Sender<T>,
}

impl<T> Clone for Queue<T> {
    fn clone(&self) -> Self {
        Queue { name: self.name, on_full: self.on_full, tx: self.tx.clone() }
    }
}

/// A queue of `capacity` places (at least one), named for the gauges, logs and status page.
pub(crate) fn bounded<T>(name: &'static str, capacity: usize, on_full: OnFull) -> (Queue<T>, mpsc::Receiver<T>) {
    let (tx, rx) = mpsc::channel(capacity.max(1));
    (Queue { name, on_full, tx }, rx)
}

/// The queue had no place (or its consumer is gone).
#[derive(Debug, PartialEq, Eq)]
pub struct Full;

impl<T> Queue<T> {
    pub fn name(&self) -> &'static str {
        self.name
    }

    pub fn on_full(&self) -> OnFull {
        self.on_full
    }

    /// Places in all.
    pub fn capacity(&self) -> usize {
        self.tx.max_capacity()
    }

    /// Places taken now (items queued and places reserved).
    pub fn depth(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }

    pub fn is_full(&self) -> bool {
        self.tx.capacity() == 0
    }

    /// Hold a place for an item not made yet (a [`OnFull::Refuse`] queue: take the request
    /// only once every place it needs is held, else refuse it whole).
    pub fn reserve(&self) -> Result<mpsc::Permit<'_, T>, Full> {
        debug_assert_eq!(self.on_full, OnFull::Refuse, "{}: only a refusing queue hands out places", self.name);
        self.tx.try_reserve().map_err(|_| Full)
    }

    /// A handle that reads the depth without keeping the queue open (gauges, the status page).
    pub fn gauge(&self) -> DepthGauge<T> {
        DepthGauge { name: self.name, capacity: self.tx.max_capacity(), weak: self.tx.downgrade() }
    }
}

impl Queue<Outgoing> {
    /// Hand an item of a [`OnFull::DropCounted`] queue on without waiting; when the queue is
    /// full (or closed) the item is dropped and its items counted in
    /// `mcp_health.exporter.enqueue_failed_*` under its signal. `Err` carries how many items
    /// were dropped, for the caller's own count of what it lost.
    pub fn offer(&self, item: Outgoing, meters: Option<&FlowMeters>) -> Result<(), u64> {
        debug_assert_eq!(self.on_full, OnFull::DropCounted, "{}: a refusing queue is reserved, not offered to", self.name);
        let signal = item.signal();
        let (kind, n) = item.items();
        self.tx.try_send(item).map_err(|_| {
            if let Some(m) = meters {
                m.enqueue_failed(signal, kind, n);
            }
            n
        })
    }
}

/// A queue's depth, read without holding it open.
pub struct DepthGauge<T> {
    name: &'static str,
    capacity: usize,
    weak: mpsc::WeakSender<T>,
}

impl<T> DepthGauge<T> {
    pub fn name(&self) -> &'static str {
        self.name
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Places taken now; `None` once the queue is closed.
    pub fn depth(&self) -> Option<usize> {
        self.weak.upgrade().map(|q| q.max_capacity() - q.capacity())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusing_queue_hands_out_places_until_full() {
        let (q, mut rx) = bounded::<u8>("test", 2, OnFull::Refuse);
        let g = q.gauge();
        let a = q.reserve().unwrap();
        assert_eq!((q.depth(), g.depth()), (1, Some(1)));
        let b = q.reserve().unwrap();
        assert!(q.is_full());
        assert_eq!(q.reserve().err(), Some(Full));
        a.send(7);
        assert_eq!(rx.try_recv(), Ok(7));
        drop(b);
        drop(q);
        assert_eq!(g.depth(), None, "the gauge does not keep the queue open");
    }

    #[test]
    fn a_dropping_queue_counts_what_it_drops() {
        let (q, _rx) = bounded::<Outgoing>("otlp", 1, OnFull::DropCounted);
        assert_eq!(q.offer(Outgoing::HealthRaw(bytes::Bytes::new(), 3, None), None), Ok(()));
        assert_eq!(q.offer(Outgoing::HealthRaw(bytes::Bytes::new(), 5, None), None), Err(5));
        assert_eq!((q.name(), q.capacity(), q.on_full()), ("otlp", 1, OnFull::DropCounted));
    }
}
