//! The running service and the drivers of the [`Engine`](crate::engine::Engine). `serve` is a
//! [`supervisor`] over the [`pipeline`] (exporters, sinks, store, engine) and the [`listeners`];
//! the checks it runs before it binds are shared with `validate` ([`preflight`]). The service
//! feeds the engine from the receivers' queue on the wall clock ([`run_engine`]); `replay` feeds
//! it from files on the span-time clock ([`replay`]). Both hand every decided record to the same
//! [`Sinks`].

pub(crate) mod components;
pub(crate) mod error;
pub(crate) mod health;
pub(crate) mod listeners;
pub(crate) mod pipeline;
pub(crate) mod preflight;
pub(crate) mod reload;
pub(crate) mod replay;
pub(crate) mod signals;
pub(crate) mod status;
pub(crate) mod supervisor;
pub(crate) mod tasks;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::emit::sink::{Sink, Sinks};
use crate::engine::Engine;
use crate::evidence::time::Moment;
use crate::normalize::NormalizedBatch;
use crate::state::journal::Journal;
use crate::verdict::DecidedBy;
pub(crate) use error::ServeError;
pub(crate) use health::Heartbeat;
pub(crate) use supervisor::run;
pub(crate) use supervisor::ConfigSource;

/// Most queued batches taken in one engine step before its records go to the sinks.
const BATCHES_PER_STEP: usize = 64;
/// Most calls decided in one engine step ([`Engine::tick_within`]); the chains due beyond it are
/// decided by the steps right after. What a step decides is held all at once — the decided
/// calls, their verdicts, the verdict log's lines, the health spans' encodings — beside the
/// evidence it came from, and the memory limiter sees none of it before its next sample. A
/// flood's requests, taken in together, fall due together: decided in one step, ~100 k calls
/// took the embedded default 60–160 MiB past its 512 MiB limit (`tests/e2e_memory.rs`).
///
/// The receivers share the engine's thread (one worker by default) and run only between steps,
/// so a step is also the longest they wait. At 4096 calls (some 8 ms) the two took turns by the
/// second under steady load: a second of intake with hardly a decision, then a second of
/// deciding with hardly a request read (chains fall due together a `decision_wait` after they
/// came together), the resident set swinging with them. At 1024 (some 2 ms) they interleave,
/// and the MCP-only line did ×1.14–1.15 the spans per CPU-second in the same run
/// (`benches/throughput.rs`, 4 rounds; 512 did as well). With [`MIN_STEP`] between steps that
/// still decides up to half a million calls a second, more than one core takes in.
const DECIDE_PER_STEP: usize = 1024;
/// How often the engine's gauges are computed and reported: they walk the session and incident
/// tables, which is not work for every tick.
const REPORT_EVERY: Duration = Duration::from_secs(1);
/// The shortest gap between two engine steps that decide (woken by the timer, or deciding after
/// taking batches in): a verdict is at most this late.
const MIN_STEP: Duration = Duration::from_millis(2);

/// Run the engine on the wall clock until `stop` fires (or every sender is gone), then take
/// what is queued, decide everything still in flight (marked `shutdown`) and flush the sinks.
/// The heartbeat is beaten on every step, so a stuck engine shows on the health check. Under
/// `processors.memory_limiter` the engine's evidence bytes are published to the limiter after
/// every step: evidence outlives the requests that brought it, so it counts against the limit
/// apart from them.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run_engine(
    mut rx: mpsc::Receiver<NormalizedBatch>,
    mut engine: Engine,
    mut sinks: Sinks,
    tick: Duration,
    stop: oneshot::Receiver<()>,
    heartbeat: Arc<Heartbeat>,
    memory: Option<Arc<crate::flow::memory::MemoryLimiter>>,
    mut journal: Option<Journal>,
) {
    let _stopped = heartbeat.guard();
    let mut out = Vec::new();
    // With the journal, what is decided is handed to the sinks once the store holds it (see
    // `Held`): a crash between the two would otherwise decide it again from the journal.
    let mut held = Held::default();
    if let Some(j) = journal.as_mut() {
        replay_journal(j, &mut engine, &mut out);
        held.take(&mut out, Moment::wall_now());
    }
    // Receivers waiting for their batch to be in the journal (answered after the write).
    let mut written: Vec<oneshot::Sender<bool>> = Vec::new();
    // The engine is woken at the earlier of its regular tick (time-based catalog and progress
    // checks, gauges) and the moment its next chain falls due, so a verdict comes at
    // `decision_wait`, not up to a tick later. Never more often than MIN_STEP.
    let mut next_tick = tokio::time::Instant::now() + tick;
    let mut last_step = tokio::time::Instant::now();
    let timer = tokio::time::sleep_until(next_tick);
    tokio::pin!(timer);
    let mut last_report: Option<Moment> = None;
    tokio::pin!(stop);
    loop {
        heartbeat.beat(Moment::wall_now());
        let due = engine.next_due().map(|d| tokio::time::Instant::now() + d.saturating_duration_since(Moment::wall_now()));
        let wake = due.map_or(next_tick, |d| d.min(next_tick)).max(last_step + MIN_STEP);
        if timer.deadline() != wake {
            timer.as_mut().reset(wake);
        }
        // Whether this round runs the timed step: its deadline has come. Under steady load the
        // queue is never empty when the loop comes round, so the timer branch would never be
        // chosen: the step then runs after the batches are taken in, or chains would pile up
        // behind the receivers (verdicts seconds late, the table and the resident set growing
        // with the backlog) and the gauges would not be reported.
        let timed = tokio::select! {
            biased;
            _ = &mut stop => break,
            b = rx.recv() => match b {
                Some(batch) => {
                    let now = Moment::wall_now();
                    take_in(&mut engine, journal.as_mut(), batch, now, &mut out, &mut written);
                    // Take whatever else is already queued before handing records on, to amortize.
                    for _ in 0..BATCHES_PER_STEP {
                        let Ok(batch) = rx.try_recv() else { break };
                        take_in(&mut engine, journal.as_mut(), batch, now, &mut out, &mut written);
                    }
                    answer_written(journal.as_mut(), &mut written);
                    tokio::time::Instant::now() >= wake
                }
                None => break,
            },
            _ = &mut timer => true,
        };
        if timed {
            let now = Moment::wall_now();
            last_step = tokio::time::Instant::now();
            if last_step >= next_tick {
                next_tick = last_step + tick;
            }
            engine.tick_within(now, DECIDE_PER_STEP, &mut out);
            if last_report.is_none_or(|t| now.saturating_duration_since(t) >= REPORT_EVERY) {
                last_report = Some(now);
                sinks.report(&engine.gauges());
                release_journal(journal.as_mut(), &engine);
            }
        }
        if let Some(m) = &memory {
            m.set_engine_bytes(engine.evidence_bytes());
        }
        heartbeat.set_store_down(engine.store_down());
        let now = Moment::wall_now();
        if journal.is_some() {
            held.take(&mut out, now);
            held.release(&mut engine, &mut sinks, now, false);
        } else {
            sinks.accept(&out, now);
            engine.recycle(&mut out);
        }
    }
    rx.close();
    while let Some(batch) = rx.recv().await {
        take_in(&mut engine, journal.as_mut(), batch, Moment::wall_now(), &mut out, &mut written);
    }
    answer_written(journal.as_mut(), &mut written);
    let in_flight = engine.in_flight();
    let now = Moment::wall_now();
    engine.drain(DecidedBy::Shutdown, now, &mut out);
    held.take(&mut out, now);
    held.release(&mut engine, &mut sinks, now, true);
    sinks.report(&engine.gauges());
    sinks.flush();
    // Everything was decided and written: the journal keeps nothing (unless the store's last
    // write failed: then the next start replays it).
    release_journal(journal.as_mut(), &engine);
    tracing::info!(in_flight, "engine stopped; the chains in flight were decided at shutdown");
}

/// Records decided but not handed to the sinks yet: with the evidence journal, a verdict goes out
/// once the store holds its decision (at most `PERSIST_EVERY` later). Emitted first and killed
/// before the write, a call would be decided and reported again from the journal after the
/// restart; written first, it is not (the journal's spans are then duplicates of the stored
/// chain's). Let go at once while the store is down (its verdicts say so) and past a bound.
#[derive(Default)]
struct Held {
    records: Vec<crate::engine::Decided>,
    /// The engine time of the latest step whose records are held.
    until: Option<Moment>,
}

/// Most records held for the store's write; past it they go out (a store slower than the
/// engine must not hold verdicts in memory without bound).
const MAX_HELD: usize = 100_000;

impl Held {
    fn take(&mut self, out: &mut Vec<crate::engine::Decided>, now: Moment) {
        if out.is_empty() {
            return;
        }
        self.records.append(out);
        self.until = Some(now);
    }

    fn release(&mut self, engine: &mut Engine, sinks: &mut Sinks, now: Moment, all: bool) {
        let Some(until) = self.until else { return };
        let written = engine.written_through().is_some_and(|w| w >= until);
        if all || written || engine.store_down() || self.records.len() > MAX_HELD {
            sinks.accept(&self.records, now);
            engine.recycle(&mut self.records);
            self.until = None;
        }
    }
}

/// Take one batch in: written to the journal first (when there is one) — a batch the journal
/// cannot take is not taken at all, and its receiver answers a retryable refusal.
fn take_in(
    engine: &mut Engine,
    journal: Option<&mut Journal>,
    mut batch: NormalizedBatch,
    now: Moment,
    out: &mut Vec<crate::engine::Decided>,
    written: &mut Vec<oneshot::Sender<bool>>,
) {
    let answered = batch.answered.take();
    // Dated before the journal has it, so that a restart decides on the same dates.
    let dated = Engine::date_receipts(&mut batch, now);
    if let Some(j) = journal {
        if let Err(e) = j.append(now.as_nanos(), &batch.evidence, &batch.activity) {
            tracing::warn!(error = %e, "a batch was not written to the evidence journal: refused to its sender (retryable)");
            if let Some(a) = answered {
                let _ = a.send(false);
            }
            return;
        }
    }
    engine.ingest(batch, now, out);
    engine.count_dated_receipts(dated);
    written.extend(answered);
}

/// Write what the step appended to the journal, then answer its receivers: acknowledged once
/// written, refused (retryably) when the write failed. A refused batch the engine took in
/// already is sent again by its sender: the engine takes a span it holds once.
fn answer_written(journal: Option<&mut Journal>, written: &mut Vec<oneshot::Sender<bool>>) {
    let ok = match journal {
        Some(j) => match j.flush() {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, "the evidence journal could not be written: the step's requests are refused (retryable)");
                false
            }
        },
        None => true,
    };
    for w in written.drain(..) {
        let _ = w.send(ok);
    }
}

/// Let go of the journal's segments the engine no longer needs.
fn release_journal(journal: Option<&mut Journal>, engine: &Engine) {
    if let (Some(j), Some(h)) = (journal, engine.journal_horizon()) {
        j.release_before(h.as_nanos());
    }
}

/// After a start that did not follow a drain (a crash): the batches the journal kept, into the
/// engine at the engine times they were first taken in at (stepping its clocks between them),
/// then time brought to now, so every call that was in flight is decided — partial where
/// evidence is missing — and none is silently lost. Logged and counted.
fn replay_journal(journal: &mut Journal, engine: &mut Engine, out: &mut Vec<crate::engine::Decided>) {
    let r = journal.replay(|e| {
        let at = Moment::from_nanos(e.at_ns);
        while let Some(d) = engine.next_due().filter(|d| *d <= at) {
            engine.tick(d, out);
        }
        let batch = NormalizedBatch { evidence: e.evidence, activity: e.activity, ..Default::default() };
        engine.ingest(batch, at, out);
    });
    let now = Moment::wall_now();
    while let Some(d) = engine.next_due().filter(|d| *d <= now) {
        engine.tick(d, out);
    }
    engine.tick(now, out);
    let verdicts = out.iter().filter(|d| matches!(d, crate::engine::Decided::Call(_))).count();
    if r.batches > 0 || r.damaged > 0 {
        tracing::warn!(
            batches = r.batches,
            spans = r.spans,
            damaged = r.damaged,
            verdicts,
            in_flight = engine.in_flight(),
            directory = %journal.dir().display(),
            "the evidence journal held acknowledged evidence from a run that did not drain: replayed ({} batch(es), {} span(s); {} record(s) could not be read and are lost)",
            r.batches,
            r.spans,
            r.damaged
        );
    } else {
        tracing::info!(directory = %journal.dir().display(), "evidence journal empty: the last run drained");
    }
    engine.note_journal_replay(r.batches, r.damaged);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::EngineConfig;
    use std::sync::Mutex;

    /// Records, for every step that brought call verdicts, how many batches were still queued.
    struct QueuedAtVerdicts {
        tx: mpsc::Sender<NormalizedBatch>,
        seen: Arc<Mutex<Vec<usize>>>,
    }

    impl crate::emit::sink::Sink for QueuedAtVerdicts {
        fn accept(&mut self, records: &[crate::engine::Decided], _now: Moment) {
            if records.iter().any(|d| matches!(d, crate::engine::Decided::Call(_))) {
                let queued = self.tx.max_capacity() - self.tx.capacity();
                self.seen.lock().unwrap_or_else(|p| p.into_inner()).push(queued);
            }
        }
    }

    /// Under steady load the engine's queue is never empty when its loop comes round: chains
    /// that have fallen due are still decided then, at their `decision_wait`, not only once the
    /// receivers pause (which under a flood was seconds later, the chain table and the resident
    /// set growing all that while).
    #[tokio::test(flavor = "current_thread")]
    async fn chains_are_decided_when_due_while_batches_keep_coming() {
        let mut cfg = EngineConfig::default();
        cfg.chains.decision_wait = Duration::from_millis(5);
        let engine = Engine::new(cfg);
        let (tx, rx) = mpsc::channel(4096);
        let base = crate::loadgen::encode(&crate::loadgen::build_request(0, 20));
        for round in 0..600u32 {
            let (batch, _) = crate::normalize::wire::walk(&crate::loadgen::stamp(&base, round), "0000000000000000").expect("walk");
            tx.try_send(batch).expect("room for every batch");
        }
        let seen = Arc::new(Mutex::new(Vec::new()));
        let mut sinks = Sinks::default();
        sinks.push(QueuedAtVerdicts { tx: tx.clone(), seen: seen.clone() });
        let (stop_tx, stop_rx) = oneshot::channel();
        let heartbeat = Arc::new(Heartbeat::default());
        let task = tokio::spawn(run_engine(rx, engine, sinks, Duration::from_secs(60), stop_rx, heartbeat, None, None));
        let emptied = async {
            while tx.capacity() < tx.max_capacity() {
                tokio::task::yield_now().await;
            }
        };
        tokio::time::timeout(Duration::from_secs(120), emptied).await.expect("the engine takes every batch");
        let _ = stop_tx.send(());
        task.await.expect("the engine ends");
        let seen = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
        assert!(seen.first().is_some_and(|q| *q > 0), "the first verdicts came with batches still queued: {seen:?}");
    }
}
