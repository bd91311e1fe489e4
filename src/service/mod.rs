//! Drivers: what runs the [`Engine`](crate::engine::Engine). The service feeds it from the
//! receivers' queue on the wall clock ([`run_engine`]); `replay` feeds it from files on the
//! span-time clock ([`replay`]). Both hand every decided record to the same [`Sinks`].

pub mod health;
pub mod listeners;
pub mod reload;
pub mod replay;
pub mod status;
pub(crate) mod tasks;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::emit::sink::{Sink, Sinks};
use crate::engine::Engine;
use crate::evidence::time::Moment;
use crate::normalize::NormalizedBatch;
use crate::verdict::DecidedBy;
pub use health::Heartbeat;

/// Most queued batches taken in one engine step before its records go to the sinks.
const BATCHES_PER_STEP: usize = 64;
/// How often the engine's gauges are computed and reported: they walk the session and incident
/// tables, which is not work for every tick.
const REPORT_EVERY: Duration = Duration::from_secs(1);
/// The shortest gap between two engine steps woken by the timer (a verdict is at most this late).
const MIN_STEP: Duration = Duration::from_millis(2);

/// Run the engine on the wall clock until `stop` fires (or every sender is gone), then take
/// what is queued, decide everything still in flight (marked `shutdown`) and flush the sinks.
/// The heartbeat is beaten on every step, so a stuck engine shows on the health check. Under
/// `processors.memory_limiter` the engine's evidence bytes are published to the limiter after
/// every step: evidence outlives the requests that brought it, so it counts against the limit
/// apart from them.
pub async fn run_engine(
    mut rx: mpsc::Receiver<NormalizedBatch>,
    mut engine: Engine,
    mut sinks: Sinks,
    tick: Duration,
    stop: oneshot::Receiver<()>,
    heartbeat: Arc<Heartbeat>,
    memory: Option<Arc<crate::flow::memory::MemoryLimiter>>,
) {
    let _stopped = heartbeat.guard();
    // The engine is woken at the earlier of its regular tick (time-based catalog and progress
    // checks, gauges) and the moment its next chain falls due, so a verdict comes at
    // `decision_wait`, not up to a tick later. Never more often than MIN_STEP.
    let mut next_tick = tokio::time::Instant::now() + tick;
    let mut last_step = tokio::time::Instant::now();
    let timer = tokio::time::sleep_until(next_tick);
    tokio::pin!(timer);
    let mut out = Vec::new();
    let mut last_report: Option<Moment> = None;
    tokio::pin!(stop);
    loop {
        heartbeat.beat(Moment::wall_now());
        let due = engine.next_due().map(|d| tokio::time::Instant::now() + d.saturating_duration_since(Moment::wall_now()));
        let wake = due.map_or(next_tick, |d| d.min(next_tick)).max(last_step + MIN_STEP);
        if timer.deadline() != wake {
            timer.as_mut().reset(wake);
        }
        tokio::select! {
            biased;
            _ = &mut stop => break,
            b = rx.recv() => match b {
                Some(batch) => {
                    let now = Moment::wall_now();
                    engine.ingest(batch, now, &mut out);
                    // Take whatever else is already queued before handing records on, to amortize.
                    for _ in 0..BATCHES_PER_STEP {
                        let Ok(batch) = rx.try_recv() else { break };
                        engine.ingest(batch, now, &mut out);
                    }
                }
                None => break,
            },
            _ = &mut timer => {
                let now = Moment::wall_now();
                last_step = tokio::time::Instant::now();
                if last_step >= next_tick {
                    next_tick = last_step + tick;
                }
                engine.tick(now, &mut out);
                if last_report.is_none_or(|t| now.saturating_duration_since(t) >= REPORT_EVERY) {
                    last_report = Some(now);
                    sinks.report(&engine.gauges());
                }
            }
        }
        if let Some(m) = &memory {
            m.set_engine_bytes(engine.evidence_bytes());
        }
        heartbeat.set_store_down(engine.store_down());
        sinks.accept(&out, Moment::wall_now());
        out.clear();
    }
    rx.close();
    while let Some(batch) = rx.recv().await {
        engine.ingest(batch, Moment::wall_now(), &mut out);
    }
    let in_flight = engine.in_flight();
    let now = Moment::wall_now();
    engine.drain(DecidedBy::Shutdown, now, &mut out);
    sinks.accept(&out, now);
    sinks.report(&engine.gauges());
    sinks.flush();
    tracing::info!(in_flight, "engine stopped; the chains in flight were decided at shutdown");
}
