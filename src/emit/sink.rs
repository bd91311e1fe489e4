//! Sinks: where the engine's [`Decided`] records go. One trait, several implementations, the same
//! records in serve and in replay — a sink formats, it never re-derives.

use opentelemetry::KeyValue;
use rustc_hash::{FxHashMap, FxHashSet};

use super::health_spans;
use super::metrics::{HealthMeters, VerdictTally};
use crate::classify::catalog::Convergence;
use crate::classify::incidents::Transition;
use crate::engine::{Decided, Gauges};
use crate::evidence::time::Moment;
use crate::flow::outgoing::Outgoing;
use crate::flow::queue::Queue;
use crate::telemetry::labels::{DropReason, ExportSignal, ItemKind};

/// A destination of decided records.
pub(crate) trait Sink: Send {
    /// Take the records decided at `now` (one engine step's worth).
    fn accept(&mut self, records: &[Decided], now: Moment);
    /// Report the engine's point-in-time figures (metric sinks only).
    fn report(&mut self, _gauges: &Gauges) {}
    /// Push out whatever is buffered.
    fn flush(&mut self) {}
}

/// Every configured sink, fed the same records in the same order.
#[derive(Default)]
pub(crate) struct Sinks(pub Vec<Box<dyn Sink>>);

impl Sinks {
    pub(crate) fn push(&mut self, s: impl Sink + 'static) {
        self.0.push(Box::new(s));
    }
}

impl Sink for Sinks {
    fn accept(&mut self, records: &[Decided], now: Moment) {
        if records.is_empty() {
            return;
        }
        for s in &mut self.0 {
            s.accept(records, now);
        }
    }
    fn report(&mut self, gauges: &Gauges) {
        for s in &mut self.0 {
            s.report(gauges);
        }
    }
    fn flush(&mut self) {
        for s in &mut self.0 {
            s.flush();
        }
    }
}

/// Collects records (replay, tests).
#[derive(Default)]
pub(crate) struct Collect(pub Vec<Decided>);

impl Sink for Collect {
    fn accept(&mut self, records: &[Decided], _now: Moment) {
        self.0.extend_from_slice(records);
    }
}

/// Health spans (and incident log records) for the OTLP exporter's queue. A full queue drops
/// them, counted: health spans never block the engine.
pub(crate) struct HealthSpanSink {
    /// The own-output export queue ([`OnFull::DropCounted`](crate::flow::queue::OnFull)).
    pub queue: Queue<Outgoing>,
    pub service_name: String,
    pub meters: HealthMeters,
    /// `exporters.otlp.max_request_bytes`: health spans are packed into requests this large at most.
    pub max_request_bytes: usize,
    /// `processors.memory_limiter`: every encoded request holds its bytes against the limit while
    /// it waits for the backend. With the backend down the queue would otherwise hold up to
    /// `queue_size` requests of `max_request_bytes` (1 GiB at the defaults) that the limiter never
    /// sees; one that does not fit is dropped and counted (`reason: memory_limit`), as a full
    /// queue's is.
    pub memory: Option<std::sync::Arc<crate::flow::memory::MemoryLimiter>>,
    /// When the last record of each open incident went out (bounded by the open incidents: an
    /// entry leaves with its `resolved`, or when more than `MAX_TRACKED_INCIDENTS` are open).
    pub updates_sent: crate::bounded::BoundedMap<String, Moment>,
    /// The own-output queue's directory, when it is on disk: health spans that do not fit in
    /// memory, or find the channel to its writer full, are written there directly while it has
    /// room (a flood's verdicts wait on disk, not dropped for memory the disk does not need).
    pub spool: Option<std::sync::Arc<dyn crate::flow::outgoing::DiskSpool>>,
    /// Health spans dropped this run, for the exit log: for memory, for a full queue.
    dropped_total: [u64; 2],
    /// The buffers of health span requests, used again once their export is done.
    buffers: crate::emit::pb::Buffers,
}

/// What one health span is reserved at before it is encoded (they are about 1 KB; a request's
/// worth of records is reserved at once).
const HEALTH_SPAN_ESTIMATE: usize = 1200;

/// An incident updated by every failing call sends one `updated` record this often at most.
pub(crate) const INCIDENT_UPDATE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Open incidents whose last record time is remembered (past it the oldest is forgotten, so its
/// next update goes out at once: never a record lost, only one sent early).
pub(crate) const MAX_TRACKED_INCIDENTS: usize = 10_000;

impl HealthSpanSink {
    pub(crate) fn new(queue: Queue<Outgoing>, service_name: String, meters: HealthMeters, max_request_bytes: usize) -> Self {
        HealthSpanSink {
            queue,
            service_name,
            meters,
            max_request_bytes,
            memory: None,
            updates_sent: crate::bounded::BoundedMap::with_capacity("incident_updates", MAX_TRACKED_INCIDENTS),
            spool: None,
            dropped_total: [0; 2],
            buffers: crate::emit::pb::Buffers::default(),
        }
    }
}

impl HealthSpanSink {
    /// The memory `spans` health spans will hold while queued (`bytes`, estimated before they are
    /// encoded); `Err` (dropped, counted as `memory_limit`) when that would take the process past
    /// the memory limiter's soft limit.
    fn reserve(&self, bytes: u64) -> Result<Option<crate::flow::memory::Reservation>, ()> {
        let Some(m) = &self.memory else { return Ok(None) };
        m.reserve(bytes).map(Some).ok_or(())
    }

    /// Health spans that could not be queued in memory (`why`): written to the queue's
    /// directory when it has one with room, else dropped and counted.
    fn overflow(&mut self, bytes: bytes::Bytes, n: u64, why: DropReason) {
        if let Some(spool) = &self.spool {
            if spool.push(Outgoing::HealthRaw(bytes, n, None)).is_ok() {
                return;
            }
        }
        self.dropped_total[usize::from(why == DropReason::QueueFull)] += n;
        match why {
            // Without a directory the queue counted it as it refused it.
            DropReason::QueueFull if self.spool.is_none() => self.meters.export_dropped(ExportSignal::HealthSpans, why, n),
            _ => self.dropped(ExportSignal::HealthSpans, why, ItemKind::Spans, n),
        }
    }

    fn dropped(&self, signal: ExportSignal, reason: DropReason, kind: ItemKind, n: u64) {
        self.meters.export_dropped(signal, reason, n);
        self.meters.flow.enqueue_failed(signal, kind, n);
    }
}

impl Sink for HealthSpanSink {
    /// At exit: how many health spans this run dropped, and why (the running warning is
    /// throttled; this is the total).
    fn flush(&mut self) {
        let [memory, full] = self.dropped_total;
        if memory + full > 0 {
            tracing::warn!(
                memory_limit = memory,
                queue_full = full,
                "health spans dropped this run: {} for the memory limit, {} for a full sending queue (mcp_health.exporter.dropped)",
                memory,
                full
            );
        }
    }

    fn accept(&mut self, records: &[Decided], now: Moment) {
        let now_ns = now.as_nanos();
        // Written straight as protobuf, in requests within the exporter's size limit.
        // A request's worth of records at a time, its memory reserved before it is encoded: one
        // flush of a large burst of verdicts is many requests, and encoding them all before any
        // is reserved put the whole burst in memory at once, past the limit.
        let per_request = (self.max_request_bytes / HEALTH_SPAN_ESTIMATE).max(1);
        for chunk in records.chunks(per_request) {
            let spans = chunk.iter().filter(|r| health_spans::makes_span(r)).count() as u64;
            if spans == 0 {
                continue;
            }
            let Ok(mut held) = self.reserve(spans * HEALTH_SPAN_ESTIMATE as u64) else {
                if self.spool.is_none() {
                    self.overflow(bytes::Bytes::new(), spans, DropReason::MemoryLimit);
                    continue;
                }
                // A request at a time, straight to disk: only its own bytes are in memory.
                for (bytes, n) in health_spans::encode_requests(&self.service_name, chunk, now_ns, self.max_request_bytes, &self.buffers) {
                    self.overflow(bytes, n, DropReason::MemoryLimit);
                }
                continue;
            };
            for (bytes, n) in health_spans::encode_requests(&self.service_name, chunk, now_ns, self.max_request_bytes, &self.buffers) {
                // What the request really holds, whatever the estimate was: it exists already.
                let h = held.as_mut().map(|r| {
                    let mut part = r.split(bytes.len() as u64);
                    part.set(bytes.len() as u64);
                    part
                });
                let item = Outgoing::HealthRaw(bytes.clone(), n, h);
                let offered = match &self.spool {
                    // With a directory, a full channel to its writer is no reason to drop.
                    Some(_) => self.queue.offer(item, None),
                    None => self.queue.offer(item, Some(&self.meters.flow)),
                };
                if let Err(n) = offered {
                    self.overflow(bytes, n, DropReason::QueueFull);
                }
            }
        }
        let mut incidents = coalesce_incidents(records);
        // At most one `updated` record per incident per INCIDENT_UPDATE_EVERY (each carries the
        // counts so far; `opened` and `resolved` always go out).
        incidents.retain(|(t, row)| match t {
            Transition::Updated => match self.updates_sent.get(row.id.as_str()) {
                Some(at) if now.saturating_duration_since(*at) < INCIDENT_UPDATE_EVERY => false,
                _ => {
                    self.updates_sent.insert(row.id.clone(), now);
                    true
                }
            },
            Transition::Resolved => {
                self.updates_sent.remove(row.id.as_str());
                true
            }
            Transition::Opened => {
                self.updates_sent.insert(row.id.clone(), now);
                true
            }
        });
        for (bytes, n) in super::incidents::encode_log_requests(&self.service_name, &incidents, now_ns, self.max_request_bytes) {
            // Incident records are few (coalesced per flush) and what alerts are read from: held
            // whatever the limit, never dropped for it.
            let held = self.memory.as_ref().map(|m| m.hold(bytes.len() as u64));
            if let Err(n) = self.queue.offer(Outgoing::LogsRaw(bytes, n, held), Some(&self.meters.flow)) {
                self.meters.export_dropped(ExportSignal::IncidentLogs, DropReason::QueueFull, n);
            }
        }
    }
}

/// The incident transitions of one flush as log records: every `opened` and `resolved`, and of
/// the `updated`s of an incident only the last (it carries the counts of all before it). An
/// incident updated by every failing call made one record per call — at 50 k calls/s most of
/// the exporter's work — while what a reader needs is its state as of this flush.
fn coalesce_incidents(records: &[Decided]) -> Vec<(Transition, &crate::classify::incidents::Incident)> {
    let mut last_update: FxHashMap<&str, usize> = FxHashMap::default();
    for (i, r) in records.iter().enumerate() {
        if let Decided::Incident(t) = r {
            if t.transition == Transition::Updated {
                last_update.insert(t.row.id.as_str(), i);
            }
        }
    }
    records
        .iter()
        .enumerate()
        .filter_map(|(i, r)| match r {
            Decided::Incident(t) if t.transition != Transition::Updated || last_update.get(t.row.id.as_str()) == Some(&i) => {
                Some((t.transition, &t.row))
            }
            _ => None,
        })
        .collect()
}

/// Metrics: verdict and call counters (a revision counts the call once), the latency histograms
/// (with their exemplars), catalog and drift counters, incident transitions, and the engine's
/// gauges. Gauge groups that emptied read 0.
pub(crate) struct MetricsSink {
    meters: HealthMeters,
    tally: VerdictTally,
    last_stats: crate::correlate::ChainStats,
    last_joins: crate::correlate::crossjoin::CrossJoinStats,
    last_skipped: crate::state::SkipCounts,
    last_receipts_capped: u64,
    last_journal_replayed: (u64, u64),
    last_callless: u64,
    last_store_errors: u64,
    last_store_conflicts: u64,
    last_store: crate::state::StoreStats,
    last_store_queue_waits: u64,
    last_incidents_unshared: u64,
    incident_groups: FxHashSet<[String; 4]>,
    convergence_groups: FxHashSet<(String, Convergence)>,
    working_groups: FxHashSet<(String, String)>,
    /// Reused from batch to batch.
    exemplars: crate::emit::metrics::BatchExemplars,
}

impl MetricsSink {
    pub(crate) fn new(meters: HealthMeters) -> Self {
        MetricsSink {
            meters,
            tally: VerdictTally::default(),
            last_stats: Default::default(),
            last_joins: Default::default(),
            last_skipped: Default::default(),
            last_receipts_capped: 0,
            last_journal_replayed: (0, 0),
            last_callless: 0,
            last_store_errors: 0,
            last_store_conflicts: 0,
            last_store: Default::default(),
            last_store_queue_waits: 0,
            last_incidents_unshared: 0,
            incident_groups: Default::default(),
            convergence_groups: Default::default(),
            working_groups: Default::default(),
            exemplars: Default::default(),
        }
    }
}

impl Sink for MetricsSink {
    /// `now` is the decision moment: the latency histograms measure a verdict's delay against it.
    fn accept(&mut self, records: &[Decided], now: Moment) {
        for r in records {
            match r {
                Decided::Call(v) => {
                    self.tally.add(v);
                    self.meters.record_latency_into(v, now, &mut self.exemplars);
                }
                Decided::Interim(_) => {}
                Decided::Catalog(c) => self.meters.record_catalog(c.server.as_deref(), c.verdict.convergence),
                Decided::Drift(d) => {
                    tracing::warn!(server = %d.server, tool = %d.tool, changes = d.changes.len(), "tool contract differs from its pin");
                    self.meters.record_drift(&d.server, &d.tool);
                }
                Decided::Incident(i) => {
                    let layer = i.row.cause.first_failed_layer.map_or("none", |l| l.as_str());
                    self.meters
                        .incidents_transitions
                        .add(1, &[KeyValue::new("transition", i.transition.as_str()), KeyValue::new("first_failed_layer", layer)]);
                }
                Decided::Finding(f) => self.meters.record_finding(f),
            }
        }
        self.meters.flush_exemplars(&mut self.exemplars, now);
    }

    fn report(&mut self, g: &Gauges) {
        let m = &self.meters;
        let (s, last) = (&g.chain_stats, &self.last_stats);
        m.spans_late.add(s.late_spans.saturating_sub(last.late_spans), &[]);
        m.spans_truncated.add(s.truncated_spans.saturating_sub(last.truncated_spans), &[]);
        m.chains_evicted.add(s.chains_evicted.saturating_sub(last.chains_evicted), &[]);
        m.late_evidence_dropped.add(s.late_evidence_dropped.saturating_sub(last.late_evidence_dropped), &[]);
        m.spans_duplicate.add(s.duplicate_spans.saturating_sub(last.duplicate_spans), &[]);
        m.verifiers_parked.add(s.verifiers_parked.saturating_sub(last.verifiers_parked), &[]);
        m.verifiers_parked_dropped.add(s.parked_dropped.saturating_sub(last.parked_dropped), &[]);
        m.http_spans_parked.add(s.http_parked.saturating_sub(last.http_parked), &[]);
        m.http_spans_parked_dropped.add(s.http_parked_dropped.saturating_sub(last.http_parked_dropped), &[]);
        m.chains_callless.add(g.callless_chains.saturating_sub(self.last_callless), &[]);
        let (j, lj) = (&g.join_stats, &self.last_joins);
        for (kind, result, now, before) in [
            ("server_half", "joined", j.halves_joined, lj.halves_joined),
            ("server_half", "late", j.late_joined, lj.late_joined),
            ("server_half", "ambiguous", j.ambiguous, lj.ambiguous),
            ("refused_request", "joined", j.http_joined, lj.http_joined),
            ("refused_request", "ambiguous", j.http_ambiguous, lj.http_ambiguous),
        ] {
            if now > before {
                m.joins.add(now - before, &[KeyValue::new("kind", kind), KeyValue::new("result", result)]);
            }
        }
        self.last_joins = j.clone();
        for ((table, why, now), (_, _, before)) in g.state_skipped.entries().zip(self.last_skipped.entries()) {
            if now > before {
                m.state_undecodable.add(now - before, &[KeyValue::new("table", table.as_str()), KeyValue::new("reason", why)]);
            }
        }
        self.last_skipped = g.state_skipped;
        m.receipts_capped.add(g.receipts_capped.saturating_sub(self.last_receipts_capped), &[]);
        self.last_receipts_capped = g.receipts_capped;
        let (j, lj) = (g.journal_replayed, self.last_journal_replayed);
        m.flow.journal_replayed.add(j.0.saturating_sub(lj.0), &[KeyValue::new("result", "replayed")]);
        m.flow.journal_replayed.add(j.1.saturating_sub(lj.1), &[KeyValue::new("result", "damaged")]);
        self.last_journal_replayed = j;
        m.chains_in_flight.record(g.chains_in_flight, &[]);
        m.gauge_leader.record(u64::from(g.gauge_leader), &[]);
        m.evidence_bytes.record(g.evidence_bytes, &[]);
        self.last_stats = s.clone();
        self.last_callless = g.callless_chains;
        m.store_errors.add(g.store_errors.saturating_sub(self.last_store_errors), &[]);
        self.last_store_errors = g.store_errors;
        m.store_conflicts.add(g.store_conflicts.saturating_sub(self.last_store_conflicts), &[]);
        self.last_store_conflicts = g.store_conflicts;
        m.store_queue_waits.add(g.store_queue_waits.saturating_sub(self.last_store_queue_waits), &[]);
        self.last_store_queue_waits = g.store_queue_waits;
        if let Some(st) = &g.store {
            m.store.report(st, &self.last_store);
            self.last_store = st.clone();
        }
        m.incidents_unshared.add(g.incidents_unshared.saturating_sub(self.last_incidents_unshared), &[]);
        self.last_incidents_unshared = g.incidents_unshared;
        self.tally.flush(m);

        report_groups(&m.incidents_open, &mut self.incident_groups, &g.incidents_open, |k| {
            vec![
                KeyValue::new("first_failed_layer", k[0].clone()),
                KeyValue::new("state", k[1].clone()),
                KeyValue::new("server.address", k[2].clone()),
                KeyValue::new("incident_state", k[3].clone()),
            ]
        });
        report_groups(&m.catalog_convergence, &mut self.convergence_groups, &g.convergence, |(server, conv)| {
            vec![KeyValue::new("server.address", server.clone()), KeyValue::new("convergence", conv.as_str())]
        });
        report_groups(&m.calls_working, &mut self.working_groups, &g.working, |(tool, server)| {
            vec![KeyValue::new("gen_ai.tool.name", tool.clone()), KeyValue::new("server.address", server.clone())]
        });
    }

    fn flush(&mut self) {
        self.tally.flush(&self.meters);
    }
}

/// Record a gauge per group, and 0 for the groups reported last time that are gone now (a gauge
/// that stops being recorded keeps its last value).
fn report_groups<K: std::hash::Hash + Eq + Clone>(
    gauge: &opentelemetry::metrics::Gauge<u64>,
    last: &mut FxHashSet<K>,
    now: &rustc_hash::FxHashMap<K, u64>,
    attrs: impl Fn(&K) -> Vec<KeyValue>,
) {
    for gone in last.iter().filter(|k| !now.contains_key(*k)) {
        gauge.record(0, &attrs(gone));
    }
    for (k, n) in now {
        gauge.record(*n, &attrs(k));
    }
    *last = now.keys().cloned().collect();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Health spans waiting for a down backend hold their bytes against the memory limit: under a
    /// limit with room for a few requests, the queue holds what fits (each request reserved at
    /// its size), and the rest is dropped and counted, not queued unseen.
    #[test]
    fn queued_health_spans_hold_memory_and_what_does_not_fit_is_dropped() {
        let cfg = crate::config::Config::load(None).unwrap();
        let mut engine = crate::engine::Engine::new(crate::cli::replay::engine_config(&cfg));
        let mut records = Collect::default();
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
        crate::service::replay::replay(&[format!("{dir}/incidents_five_expired.jsonl")], &mut engine, &mut records, &mut Vec::new());
        let spans = records.0.iter().filter(|r| health_spans::makes_span(r)).count();
        assert!(spans >= 4, "{spans} health spans");
        // Requests of two spans; room for about one of them.
        let limiter = std::sync::Arc::new(crate::flow::memory::MemoryLimiter::with_floor(1, Some(0), (1 << 20) - 3000));
        let (tx, mut rx) = crate::flow::queue::bounded("otlp", 1024, crate::flow::queue::OnFull::DropCounted);
        let mut hs = HealthSpanSink::new(
            tx,
            "mcp-health".into(),
            HealthMeters::new(&opentelemetry::global::meter("sink-test")),
            2 * HEALTH_SPAN_ESTIMATE,
        );
        hs.accept(&records.0, Moment::from_nanos(1_000_000_000_000));
        assert_eq!(limiter.held(), 0, "a sink without the limiter reserves nothing");
        hs.memory = Some(limiter.clone());
        let room = limiter.room();
        let mut queued = Vec::new();
        while let Ok(o) = rx.try_recv() {
            queued.push(o);
        }
        let unlimited = queued.len();
        queued.clear();
        hs.accept(&records.0, Moment::from_nanos(1_000_000_000_000));
        while let Ok(o) = rx.try_recv() {
            queued.push(o);
        }
        let held: u64 = queued
            .iter_mut()
            .map(|o| {
                let bytes = match &*o {
                    Outgoing::HealthRaw(b, ..) | Outgoing::LogsRaw(b, ..) => b.len() as u64,
                    _ => 0,
                };
                let r = o.take_reservation().expect("each queued request holds its memory");
                assert_eq!(r.bytes(), bytes, "reserved at its encoded size");
                o.set_reservation(r);
                bytes
            })
            .sum();
        assert_eq!(limiter.held(), held);
        let spans_held: u64 = queued.iter().map(|o| if let Outgoing::HealthRaw(b, ..) = o { b.len() as u64 } else { 0 }).sum();
        assert!(spans_held > 0 && spans_held <= room, "health spans held {spans_held} within the room {room}");
        assert!(queued.len() < unlimited, "{} of {unlimited} requests queued under the limit", queued.len());
        drop(queued);
        assert_eq!(limiter.held(), 0, "released when sent or dropped");
    }

    #[test]
    fn incident_records_keep_every_open_and_resolve_and_the_last_update_of_each() {
        let cfg = crate::config::Config::load(None).unwrap();
        let mut engine = crate::engine::Engine::new(crate::cli::replay::engine_config(&cfg));
        let mut sink = Collect::default();
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
        let files = vec![format!("{dir}/incidents_five_expired.jsonl"), format!("{dir}/incidents_resolved.jsonl")];
        crate::service::replay::replay(&files, &mut engine, &mut sink, &mut Vec::new());
        let all: Vec<(Transition, String, u64)> = sink
            .0
            .iter()
            .filter_map(|r| match r {
                Decided::Incident(t) => Some((t.transition, t.row.id.clone(), t.row.calls)),
                _ => None,
            })
            .collect();
        let updates = all.iter().filter(|t| t.0 == Transition::Updated).count();
        assert!(updates >= 2 && all.iter().any(|t| t.0 == Transition::Opened), "{all:?}");
        let kept: Vec<(Transition, String, u64)> =
            coalesce_incidents(&sink.0).into_iter().map(|(t, row)| (t, row.id.clone(), row.calls)).collect();
        // Opened and resolved: all of them, in order.
        let key = |v: &[(Transition, String, u64)]| v.iter().filter(|t| t.0 != Transition::Updated).cloned().collect::<Vec<_>>();
        assert_eq!(key(&kept), key(&all));
        // Updates: one per incident, the one with the most calls (the last).
        for id in all.iter().map(|t| &t.1).collect::<FxHashSet<_>>() {
            let last = all.iter().rev().find(|t| t.0 == Transition::Updated && &t.1 == id);
            let got: Vec<_> = kept.iter().filter(|t| t.0 == Transition::Updated && &t.1 == id).collect();
            assert_eq!(got.len(), usize::from(last.is_some()), "{id}");
            assert_eq!(got.first().copied(), last);
        }
        assert!(kept.len() < all.len());

        // Across flushes: one `updated` per incident per INCIDENT_UPDATE_EVERY.
        let updates: Vec<Decided> =
            sink.0.iter().filter(|r| matches!(r, Decided::Incident(t) if t.transition == Transition::Updated)).cloned().collect();
        let ids = updates
            .iter()
            .filter_map(|r| if let Decided::Incident(t) = r { Some(t.row.id.clone()) } else { None })
            .collect::<FxHashSet<_>>();
        let (tx, mut rx) = crate::flow::queue::bounded("otlp", 64, crate::flow::queue::OnFull::DropCounted);
        let mut hs = HealthSpanSink::new(tx, "mcp-health".into(), HealthMeters::new(&opentelemetry::global::meter("sink-test")), 1 << 20);
        let t0 = Moment::from_nanos(1_000_000_000_000);
        let mut sent = |at: Moment, rx: &mut tokio::sync::mpsc::Receiver<Outgoing>| {
            hs.accept(&updates, at);
            let mut n = 0;
            while let Ok(o) = rx.try_recv() {
                if let Outgoing::LogsRaw(_, k, _) = o {
                    n += k as usize;
                }
            }
            n
        };
        assert_eq!(sent(t0, &mut rx), ids.len());
        assert_eq!(sent(t0 + std::time::Duration::from_millis(500), &mut rx), 0, "within the interval: none");
        assert_eq!(sent(t0 + INCIDENT_UPDATE_EVERY + std::time::Duration::from_millis(1), &mut rx), ids.len());
    }
}
