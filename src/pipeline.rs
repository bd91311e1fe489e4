//! Wiring: the correlator task between the receivers and the emitters.
//!
//! One task owns the chain table (no locks on the hot path); receivers normalize in their own
//! tasks and hand over compact evidence through a bounded channel. Decided chains are classified
//! here and every verdict goes to every configured emitter.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use opentelemetry::KeyValue;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use tokio::sync::{mpsc, oneshot};

use crate::classify::{classify_call, SessionContext};
use crate::correlate::{ChainStats, Chains, DecidedCalls};
use crate::emit::health_spans;
use crate::emit::metrics::{HealthMeters, VerdictTally};
use crate::emit::otlp_traces::Outgoing;
use crate::emit::verdict_log::VerdictLog;
use crate::normalize::NormalizedBatch;
use crate::verdict::{DecidedBy, Verdict};

/// Where verdicts go.
pub struct Emitters {
    pub meters: HealthMeters,
    pub health_spans: Option<mpsc::Sender<Outgoing>>,
    pub service_name: String,
    pub verdict_log: Option<VerdictLog>,
    pub tally: VerdictTally,
}

impl Emitters {
    fn emit(&mut self, verdicts: &[Verdict]) {
        if verdicts.is_empty() {
            return;
        }
        let now_ns = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        for v in verdicts {
            self.tally.add(v);
            if let Some(log) = &mut self.verdict_log {
                log.write(v);
            }
        }
        if let Some(log) = &mut self.verdict_log {
            log.flush();
        }
        if let Some(tx) = &self.health_spans {
            let spans = verdicts.iter().map(|v| health_spans::health_span(v, now_ns)).collect();
            let req = ExportTraceServiceRequest { resource_spans: vec![health_spans::resource_spans(&self.service_name, spans)] };
            if tx.try_send(Outgoing::Health(req)).is_err() {
                self.meters.exporter_dropped.add(verdicts.len() as u64, &[KeyValue::new("signal", "health_spans"), KeyValue::new("reason", "queue_full")]);
            }
        }
    }
}

/// Classify a decided chain.
pub fn verdicts_of(d: &DecidedCalls, ctx: &SessionContext) -> Vec<Verdict> {
    d.calls.iter().map(|c| classify_call(c, ctx, d.decision)).collect()
}

/// Run the correlator until `stop` fires, then take what is queued, decide everything still in
/// flight (marked `shutdown`) and emit it.
pub async fn run_correlator(mut rx: mpsc::Receiver<NormalizedBatch>, mut chains: Chains, mut emitters: Emitters, tick: Duration, stop: oneshot::Receiver<()>) {
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut decided = Vec::new();
    let mut verdicts = Vec::new();
    let mut last = ChainStats::default();
    let ctx = SessionContext::default();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            biased;
            _ = &mut stop => break,
            b = rx.recv() => match b {
                Some(batch) => {
                    chains.ingest(batch, Instant::now(), &mut decided);
                    // Take whatever else is already queued before deciding, to amortize.
                    while let Ok(batch) = rx.try_recv() {
                        chains.ingest(batch, Instant::now(), &mut decided);
                        if decided.len() > 64 { break; }
                    }
                }
                None => break,
            },
            _ = interval.tick() => {
                chains.tick(Instant::now(), &mut decided);
                report(&chains, &emitters.meters, &mut last);
                emitters.tally.flush(&emitters.meters);
            }
        }
        flush(&mut decided, &mut verdicts, &ctx, &mut emitters);
    }
    rx.close();
    while let Some(batch) = rx.recv().await {
        chains.ingest(batch, Instant::now(), &mut decided);
    }
    chains.drain(DecidedBy::Shutdown, Instant::now(), &mut decided);
    flush(&mut decided, &mut verdicts, &ctx, &mut emitters);
    report(&chains, &emitters.meters, &mut last);
    emitters.tally.flush(&emitters.meters);
    tracing::info!(decided = chains.stats.chains_decided, "correlator stopped; chains in flight were decided at shutdown");
}

fn flush(decided: &mut Vec<DecidedCalls>, verdicts: &mut Vec<Verdict>, ctx: &SessionContext, emitters: &mut Emitters) {
    if decided.is_empty() {
        return;
    }
    verdicts.clear();
    for d in decided.drain(..) {
        verdicts.extend(verdicts_of(&d, ctx));
    }
    emitters.emit(verdicts);
}

/// Publish the correlator's counters as metric deltas.
fn report(chains: &Chains, m: &HealthMeters, last: &mut ChainStats) {
    let s = &chains.stats;
    m.spans_late.add(s.late_spans - last.late_spans, &[]);
    m.spans_truncated.add(s.truncated_spans - last.truncated_spans, &[]);
    m.chains_evicted.add(s.chains_evicted - last.chains_evicted, &[]);
    m.chains_in_flight.record(chains.in_flight() as u64, &[]);
    m.evidence_bytes.record(chains.bytes() as u64, &[]);
    *last = s.clone();
}
