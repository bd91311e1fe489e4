//! The store's own thread: it owns the calls to a network store, so that a round trip is never
//! on the engine's thread.
//!
//! The engine submits a job (a closure over the [`StateStore`]) and gets a [`Ticket`]; the worker
//! runs jobs in the order submitted (so a read submitted after a write sees it) and sends each
//! answer back; the engine takes answers when it next looks ([`Worker::poll`]) or waits for one
//! it needs now ([`Worker::wait`]). Bounded: at most [`MAX_IN_FLIGHT`] jobs are submitted and
//! not yet answered-and-taken; a submit past it first waits for the oldest answer, counted in
//! [`Worker::queue_waits`] (`mcp_health.state.store_queue_waits`): the engine slows to the
//! store's pace rather than dropping a write or holding an unbounded backlog.
//!
//! An in-process store (memory, or the embedded store) needs no thread: its jobs run at once on
//! the caller's thread ([`Worker::inline`]), through the same tickets, so the protocol is one code
//! path and tests of several engines on one in-memory store stay deterministic.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::{mpsc, Arc, Mutex};

use crate::flow::blocking::off_the_runtime;
use crate::state::{StateStore, StoreHandle, StoreStats};

/// Jobs submitted and not yet taken, at most.
pub(crate) const MAX_IN_FLIGHT: usize = 64;

/// How long the engine waits for an answer on the runtime's thread before the runtime's other
/// tasks (the receivers) are handed to another thread ([`off_the_runtime`]). A hand-over moves
/// the receivers to another core and back, a cost per wait: with one at every wait, one
/// instance on Redis still ran on two threads (each engine wait for a round or a read, some
/// 200 a second flat out, handed the core over).
const HAND_OVER_AFTER: std::time::Duration = std::time::Duration::from_millis(5);

type Answer = Box<dyn Any + Send>;
type Job = Box<dyn FnOnce(&mut dyn StateStore) -> Answer + Send>;

/// A job submitted; its answer is of type `T`.
#[must_use]
pub(crate) struct Ticket<T> {
    id: u64,
    _answer: std::marker::PhantomData<fn() -> T>,
}

enum Via {
    /// Run each job at once on the caller's thread.
    Inline(StoreHandle),
    /// The worker thread; its answers come back on `answers`, and after each job what the
    /// store has cost so far in `stats` (read by the engine's report without waiting for the
    /// store's lock, which the thread holds through a round trip).
    Thread { jobs: mpsc::SyncSender<(u64, Job)>, answers: mpsc::Receiver<(u64, Answer)>, stats: Arc<Mutex<Option<StoreStats>>> },
}

/// The engine's end of the store's thread.
pub(crate) struct Worker {
    via: Via,
    next: u64,
    /// Answers come back and not yet taken, by ticket.
    taken: BTreeMap<u64, Answer>,
    /// Submitted, answer not yet come back.
    in_flight: usize,
    queue_waits: u64,
    /// Wall-clock time the engine's thread spent blocked on an answer (a full queue, an answer
    /// due, a read the step needs now): what the store costs the engine beyond its own work.
    waited: std::time::Duration,
}

impl Worker {
    /// A worker for `store`: a thread of its own for a network store, inline otherwise.
    pub(crate) fn for_store(store: StoreHandle) -> Self {
        if store.over_network() {
            Worker::thread(store)
        } else {
            Worker::inline(store)
        }
    }

    pub(crate) fn inline(store: StoreHandle) -> Self {
        Worker { via: Via::Inline(store), next: 0, taken: BTreeMap::new(), in_flight: 0, queue_waits: 0, waited: std::time::Duration::ZERO }
    }

    pub(crate) fn thread(store: StoreHandle) -> Self {
        let (jobs, job_rx) = mpsc::sync_channel::<(u64, Job)>(MAX_IN_FLIGHT);
        // Unbounded in type, bounded by `MAX_IN_FLIGHT` in use: one answer per job in flight.
        let (answer_tx, answers) = mpsc::channel::<(u64, Answer)>();
        let stats = Arc::new(Mutex::new(None));
        let published = stats.clone();
        let spawned = std::thread::Builder::new().name("mcp-health-store".into()).spawn(move || {
            loop {
                let next = match job_rx.try_recv() {
                    Ok(next) => Ok(next),
                    Err(_) => {
                        // Going idle: what this thread allocated and the engine's thread has
                        // freed since (records read, a start-up load's chains) goes back to the
                        // OS now. Frees from another thread wait for the owner's next
                        // collection, and an idle thread makes none: a load's records stayed
                        // resident, and the memory limiter then refused data on their account.
                        crate::flow::memory::on_thread_idle();
                        job_rx.recv()
                    }
                };
                let Ok((id, job)) = next else { break };
                let answer = {
                    let mut s = store.0.lock().unwrap_or_else(|e| e.into_inner());
                    let answer = job(&mut **s);
                    *published.lock().unwrap_or_else(|e| e.into_inner()) = s.stats();
                    answer
                };
                if answer_tx.send((id, answer)).is_err() {
                    break;
                }
            }
        });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "could not start the store's thread; its calls run on the engine's");
        }
        Worker {
            via: Via::Thread { jobs, answers, stats },
            next: 0,
            taken: BTreeMap::new(),
            in_flight: 0,
            queue_waits: 0,
            waited: std::time::Duration::ZERO,
        }
    }

    /// Submit `job`; its answer is taken with [`Worker::take`] once [`Worker::poll`] or
    /// [`Worker::wait`] has it.
    pub(crate) fn submit<T: Send + 'static>(&mut self, job: impl FnOnce(&mut dyn StateStore) -> T + Send + 'static) -> Ticket<T> {
        let id = self.next;
        self.next += 1;
        let job: Job = Box::new(move |s| Box::new(job(s)) as Answer);
        match &self.via {
            Via::Inline(store) => {
                let answer = off_the_runtime(|| {
                    let mut s = store.0.lock().unwrap_or_else(|e| e.into_inner());
                    job(&mut **s)
                });
                self.taken.insert(id, answer);
            }
            Via::Thread { .. } => {
                if self.in_flight + self.taken.len() >= MAX_IN_FLIGHT {
                    self.queue_waits += 1;
                    self.recv_one();
                }
                let Via::Thread { jobs, .. } = &self.via else { unreachable!() };
                if jobs.send((id, job)).is_err() {
                    tracing::error!("the store's thread has ended; the store call is lost");
                } else {
                    self.in_flight += 1;
                }
            }
        }
        Ticket { id, _answer: std::marker::PhantomData }
    }

    /// Take every answer that has come back, without waiting.
    pub(crate) fn poll(&mut self) {
        let Via::Thread { answers, .. } = &self.via else { return };
        while let Ok((id, a)) = answers.try_recv() {
            self.in_flight -= 1;
            self.taken.insert(id, a);
        }
    }

    fn recv_one(&mut self) -> bool {
        let Via::Thread { answers, .. } = &self.via else { return false };
        let answer = match answers.try_recv() {
            Ok(a) => Ok(a),
            Err(mpsc::TryRecvError::Disconnected) => Err(mpsc::RecvError),
            Err(mpsc::TryRecvError::Empty) => {
                let since = std::time::Instant::now();
                // Most answers come within a round trip: the runtime's other tasks wait that
                // long. A longer wait (a slow or unreachable store) hands them to another thread.
                let answer = match answers.recv_timeout(HAND_OVER_AFTER) {
                    Ok(a) => Ok(a),
                    Err(mpsc::RecvTimeoutError::Disconnected) => Err(mpsc::RecvError),
                    Err(mpsc::RecvTimeoutError::Timeout) => off_the_runtime(|| answers.recv()),
                };
                self.waited += since.elapsed();
                answer
            }
        };
        match answer {
            Ok((id, a)) => {
                self.in_flight -= 1;
                self.taken.insert(id, a);
                true
            }
            Err(_) => {
                self.in_flight = 0;
                false
            }
        }
    }

    /// Whether the answer of `ticket` has come back.
    pub(crate) fn has<T>(&self, ticket: &Ticket<T>) -> bool {
        self.taken.contains_key(&ticket.id)
    }

    /// Wait until the answer of `ticket` has come back (the jobs before it have run too).
    pub(crate) fn wait<T>(&mut self, ticket: &Ticket<T>) {
        while !self.taken.contains_key(&ticket.id) {
            if !self.recv_one() {
                return;
            }
        }
    }

    /// The answer of `ticket`, if it has come back (`None` also when the thread ended without it).
    pub(crate) fn take<T: 'static>(&mut self, ticket: Ticket<T>) -> Option<T> {
        self.taken.remove(&ticket.id).and_then(|a| a.downcast::<T>().ok()).map(|b| *b)
    }

    /// Run `job` and wait for its answer (for rare calls whose answer the step needs now).
    pub(crate) fn call<T: Send + 'static>(&mut self, job: impl FnOnce(&mut dyn StateStore) -> T + Send + 'static) -> Option<T> {
        let t = self.submit(job);
        self.wait(&t);
        self.take(t)
    }

    /// What the store has cost so far (a network store's round trips and bytes; `None` for
    /// the others), as of its last job.
    pub(crate) fn store_stats(&self) -> Option<StoreStats> {
        match &self.via {
            Via::Inline(store) => store.stats(),
            Via::Thread { stats, .. } => stats.lock().unwrap_or_else(|e| e.into_inner()).clone(),
        }
    }

    /// Submit calls that waited for room.
    pub(crate) fn queue_waits(&self) -> u64 {
        self.queue_waits
    }

    /// Time the caller's thread spent blocked on the store's thread.
    pub(crate) fn waited(&self) -> std::time::Duration {
        self.waited
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::atomic::{AtomicU64, Ordering};

    static IDLE: AtomicU64 = AtomicU64::new(0);

    fn count_idle() {
        IDLE.fetch_add(1, Ordering::SeqCst);
    }

    /// The store's thread hands what it freed back to the allocator each time it goes idle: the
    /// process's hook (in the binary, a collection of the thread's heap) runs before it waits.
    #[test]
    fn the_store_thread_runs_the_idle_hook_before_it_waits() {
        crate::flow::memory::set_idle_hook(count_idle);
        let mut w = Worker::thread(StoreHandle::new(crate::state::MemoryStore::new()));
        let before = IDLE.load(Ordering::SeqCst);
        assert_eq!(w.call(|s| s.is_shared()), Some(false));
        assert_eq!(w.call(|s| s.is_shared()), Some(false));
        // Each call found the queue empty after its job: idle again before the next.
        // The lib's tests run side by side on two cores: the thread may wait its turn (a spin
        // here would take the core it waits for).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while IDLE.load(Ordering::SeqCst) < before + 2 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(IDLE.load(Ordering::SeqCst) >= before + 2, "the hook ran {} times", IDLE.load(Ordering::SeqCst) - before);
    }
}
