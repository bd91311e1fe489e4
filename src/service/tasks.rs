//! The service's long-lived tasks as one supervised set, in the manner of Rotel's
//! `wait_for_any_task`: the export queues' workers and disk writers and the memory sampler run
//! as long as the service, so one that ends before the drain — returned or panicked — is a
//! failure, and the supervisor ends the process naming it ([`Tasks::ended`]). Otherwise a
//! service whose exporter died would stay up, answer its health check, accept data and send
//! nothing, which is the kind of green this product exists to refuse.
//!
//! Nothing here is restarted. An export worker that ended held a request whose fate is unknown
//! (sent or not), and a disk queue's writer owns the order of its files: a restart could send a
//! request twice or break that order, and a panic is a bug to be seen. The orchestrator restarts
//! the process, which replays the disk queue from a known state. (The engine and the listeners
//! are watched by the supervisor itself: the engine also for stalls, the listeners through
//! [`Listeners::ended`](super::listeners::Listeners::ended).)

use std::future::Future as _;
use std::task::Poll;

use tokio::task::JoinHandle;

/// How a supervised task ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ended {
    Returned,
    Panicked,
    Cancelled,
}

impl Ended {
    fn of(r: Result<(), tokio::task::JoinError>) -> Ended {
        match r {
            Ok(()) => Ended::Returned,
            Err(e) if e.is_panic() => Ended::Panicked,
            Err(_) => Ended::Cancelled,
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Ended::Returned => "stopped",
            Ended::Panicked => "panicked",
            Ended::Cancelled => "was cancelled",
        }
    }
}

/// Named tasks that must outlive the service's running phase.
#[derive(Default)]
pub(crate) struct Tasks {
    running: Vec<(String, JoinHandle<()>)>,
}

impl Tasks {
    pub(crate) fn add(&mut self, name: impl Into<String>, task: JoinHandle<()>) {
        self.running.push((name.into(), task));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.running.len()
    }

    /// The first task to end, taken out of the set: its name and how. Never resolves while
    /// every task runs (nor for an empty set), so it can sit in a `select!` beside the signals.
    pub(crate) async fn ended(&mut self) -> (String, Ended) {
        std::future::poll_fn(|cx| {
            for i in 0..self.running.len() {
                if let Poll::Ready(r) = std::pin::Pin::new(&mut self.running[i].1).poll(cx) {
                    let (name, _) = self.running.swap_remove(i);
                    return Poll::Ready((name, Ended::of(r)));
                }
            }
            Poll::Pending
        })
        .await
    }

    /// Wait for every task (the drain: the export workers end once their queues are empty).
    pub(crate) async fn join(self) {
        for (_, t) in self.running {
            let _ = t.await;
        }
    }

    /// Stop every task (the samplers, which run until told).
    pub(crate) fn abort(self) {
        for (_, t) in self.running {
            t.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_first_task_to_end_is_named_with_how_it_ended() {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let mut tasks = Tasks::default();
        tasks.add("sampler", tokio::spawn(std::future::pending()));
        tasks.add(
            "otlp worker 0",
            tokio::spawn(async move {
                let _ = rx.await;
                panic!("a bug in the worker");
            }),
        );
        tasks.add("otlp worker 1", tokio::spawn(std::future::pending()));
        tokio::task::yield_now().await;
        assert!(polled_once(&mut tasks).is_pending(), "no task ended yet");
        tx.send(()).expect("the worker waits");
        assert_eq!(tasks.ended().await, ("otlp worker 0".to_string(), Ended::Panicked));
        assert_eq!(tasks.len(), 2, "the ended task is taken out; the others are still watched");
        tasks.add("otlp writer", tokio::spawn(async {}));
        assert_eq!(tasks.ended().await, ("otlp writer".to_string(), Ended::Returned));
        tasks.abort();
    }

    #[tokio::test]
    async fn an_empty_set_never_ends() {
        let mut tasks = Tasks::default();
        assert!(polled_once(&mut tasks).is_pending());
    }

    /// `ended` polled once, without waiting.
    fn polled_once(tasks: &mut Tasks) -> Poll<(String, Ended)> {
        let fut = std::pin::pin!(tasks.ended());
        fut.poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
    }
}
