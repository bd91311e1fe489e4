//! Blocking work on the service's runtime: the engine shares the runtime's thread with the
//! receivers and the health check (one worker by default, so that a request is walked and judged
//! on one core), so what blocks it must not block them.

/// Run `f`, which may block its thread (an answer from the store's thread, an embedded store's
/// write, a verdict log's pipe whose reader stopped reading), so that it blocks only its caller:
/// on a multi-thread runtime the worker's other tasks are handed to another thread first
/// (`block_in_place`). Otherwise a task queued behind the engine on its worker — a receiver's,
/// the health check's — would wait with it, and a stalled engine would silence the probe that
/// should report it. Elsewhere (a replay, a test's engine, a single-threaded runtime, which
/// cannot hand its tasks over) `f` just runs.
pub(crate) fn off_the_runtime<T>(f: impl FnOnce() -> T) -> T {
    let multi = tokio::runtime::Handle::try_current().is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if multi {
        tokio::task::block_in_place(f)
    } else {
        f()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;

    /// On a runtime of one worker, a task that waits off the runtime does not stop the others:
    /// the answer it waits for comes from a task spawned after it (on one worker without the
    /// hand-over, that task never runs and the wait times out). On a single-threaded runtime
    /// and outside any, the wait just runs.
    #[test]
    fn a_wait_off_the_runtime_leaves_the_other_tasks_running() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let got = rt.block_on(async {
            let (tx, rx) = mpsc::channel::<u32>();
            let (started, on_worker) = tokio::sync::oneshot::channel();
            let waiting = tokio::spawn(async move {
                let _ = started.send(());
                off_the_runtime(|| rx.recv_timeout(std::time::Duration::from_secs(10)))
            });
            on_worker.await.unwrap();
            tokio::spawn(async move { tx.send(7) }).await.unwrap().unwrap();
            waiting.await.unwrap()
        });
        assert_eq!(got, Ok(7));
        let single = tokio::runtime::Builder::new_current_thread().build().unwrap();
        assert_eq!(single.block_on(async { off_the_runtime(|| 3) }), 3);
        assert_eq!(off_the_runtime(|| 4), 4);
    }
}
