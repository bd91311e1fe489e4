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
use std::sync::Arc;

use crate::classify::catalog::Convergence;
use crate::classify::incidents::IncidentBook;
use crate::classify::pinning::{Lockfile, PinCheck};
use crate::classify::progress::{InFlight, ProgressPolicy};
use crate::correlate::{CatalogChange, ChainStats, Chains, DecidedCalls, Sessions};
use crate::emit::health_spans;
use crate::emit::metrics::{HealthMeters, VerdictTally};
use crate::emit::otlp_traces::Outgoing;
use crate::emit::verdict_log::VerdictLog;
use crate::evidence::call::CallEvidence;
use crate::evidence::{Method, Side};
use crate::normalize::NormalizedBatch;
use crate::verdict::{DecidedBy, HealthState, Verdict};

/// Where verdicts go.
pub struct Emitters {
    pub meters: HealthMeters,
    pub health_spans: Option<mpsc::Sender<Outgoing>>,
    pub service_name: String,
    pub verdict_log: Option<VerdictLog>,
    pub tally: VerdictTally,
    pub incidents: IncidentBook,
    /// Attribute sets of the open-incident gauge last reported, so a group that closed reads 0.
    pub incident_groups: rustc_hash::FxHashSet<[String; 4]>,
}

impl Emitters {
    pub fn new(
        meters: HealthMeters,
        health_spans: Option<mpsc::Sender<Outgoing>>,
        service_name: String,
        verdict_log: Option<VerdictLog>,
    ) -> Self {
        Emitters {
            meters,
            health_spans,
            service_name,
            verdict_log,
            tally: VerdictTally::default(),
            incidents: IncidentBook::default(),
            incident_groups: Default::default(),
        }
    }

    /// Fold verdicts into incidents and emit each transition (log record, metric, verdict line).
    fn emit_incidents(&mut self, verdicts: &[Verdict], now_ns: u64) {
        let mut changed = Vec::new();
        for v in verdicts {
            changed.extend(self.incidents.observe(v));
        }
        if changed.is_empty() {
            return;
        }
        for (t, inc) in &changed {
            let layer = inc.cause.first_failed_layer.map_or("none", |l| l.as_str());
            self.meters
                .incidents_transitions
                .add(1, &[KeyValue::new("transition", t.as_str()), KeyValue::new("first_failed_layer", layer)]);
            if let Some(log) = &mut self.verdict_log {
                log.write_json(&serde_json::json!({"incident": true, "transition": t.as_str(), "row": inc}));
            }
        }
        if let Some(tx) = &self.health_spans {
            let req = crate::emit::incidents::log_records(&self.service_name, &changed, now_ns);
            if tx.try_send(Outgoing::Logs(req)).is_err() {
                self.meters
                    .exporter_dropped
                    .add(changed.len() as u64, &[KeyValue::new("signal", "incident_logs"), KeyValue::new("reason", "queue_full")]);
            }
        }
    }

    /// Queue health spans upstream (built only when an exporter is configured); a full queue
    /// drops them, counted — health spans never block the correlator.
    fn send_health_spans(&self, build: impl FnOnce() -> Vec<opentelemetry_proto::tonic::trace::v1::Span>) {
        let Some(tx) = &self.health_spans else { return };
        let spans = build();
        let n = spans.len() as u64;
        let req = ExportTraceServiceRequest { resource_spans: vec![health_spans::resource_spans(&self.service_name, spans)] };
        if tx.try_send(Outgoing::Health(req)).is_err() {
            self.meters.exporter_dropped.add(n, &[KeyValue::new("signal", "health_spans"), KeyValue::new("reason", "queue_full")]);
        }
    }

    /// Report the open-incident gauge (groups that closed are set to 0).
    fn report_incidents(&mut self) {
        let mut counts: rustc_hash::FxHashMap<[String; 4], u64> = Default::default();
        for inc in self.incidents.open_incidents() {
            let c = &inc.cause;
            let key = [
                c.first_failed_layer.map_or("none", |l| l.as_str()).to_string(),
                c.state.as_str().to_string(),
                c.server.as_deref().unwrap_or("").to_string(),
                inc.state.as_str().to_string(),
            ];
            *counts.entry(key).or_default() += 1;
        }
        for gone in self.incident_groups.iter().filter(|k| !counts.contains_key(*k)) {
            self.meters.incidents_open.record(0, &incident_attrs(gone));
        }
        for (k, n) in &counts {
            self.meters.incidents_open.record(*n, &incident_attrs(k));
        }
        self.incident_groups = counts.into_keys().collect();
    }
}

fn incident_attrs(k: &[String; 4]) -> [KeyValue; 4] {
    [
        KeyValue::new("first_failed_layer", k[0].clone()),
        KeyValue::new("state", k[1].clone()),
        KeyValue::new("server.address", k[2].clone()),
        KeyValue::new("incident_state", k[3].clone()),
    ]
}

impl Emitters {
    /// Catalog verdict changes: a health span in the trace of the span that caused the change,
    /// a metric point, and a verdict line.
    fn emit_catalog(&mut self, changes: &[CatalogChange]) {
        let now_ns = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        for ch in changes {
            self.meters.record_catalog(ch.server.as_deref(), ch.verdict.convergence);
            if let Some(log) = &mut self.verdict_log {
                log.write_catalog(ch);
            }
        }
        if let Some(log) = &mut self.verdict_log {
            log.flush();
        }
        self.send_health_spans(|| changes.iter().map(|c| health_spans::catalog_span(c, now_ns)).collect());
    }

    /// Drift events: metric, verdict line, health span in the trace of the `tools/list` span.
    fn emit_drift(&mut self, events: &[DriftEvent]) {
        let now_ns = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        for e in events {
            tracing::warn!(server = %e.server, tool = %e.tool, changes = e.changes.len(), "tool contract differs from its pin");
            self.meters.record_drift(&e.server, &e.tool);
            if let Some(log) = &mut self.verdict_log {
                log.write_json(e);
            }
        }
        if let Some(log) = &mut self.verdict_log {
            log.flush();
        }
        self.send_health_spans(|| events.iter().map(|e| health_spans::drift_span(e, now_ns)).collect());
    }

    /// Interim `working` reports: a verdict line and a health span, not counted as decided calls.
    fn emit_interim(&mut self, verdicts: &[Verdict]) {
        let now_ns = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        if let Some(log) = &mut self.verdict_log {
            for v in verdicts {
                log.write(v);
            }
            log.flush();
        }
        self.send_health_spans(|| verdicts.iter().map(|v| health_spans::health_span(v, now_ns)).collect());
    }

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
        self.emit_incidents(verdicts, now_ns);
        if let Some(log) = &mut self.verdict_log {
            log.flush();
        }
        self.send_health_spans(|| verdicts.iter().map(|v| health_spans::health_span(v, now_ns)).collect());
    }
}

/// The session facts a call is classified with: its catalog's convergence when the call started,
/// and whether the tool definition it used differs from its pin.
pub fn session_context(sessions: &Sessions, pins: Option<&Lockfile>, c: &CallEvidence) -> SessionContext {
    // Catalog staleness and drift are about choosing a tool; a `tools/list` is the remedy, not a victim.
    if c.method != Some(Method::ToolsCall) {
        return SessionContext::default();
    }
    let key = crate::evidence::session_key(
        c.session_id.as_deref(),
        c.service.as_deref(),
        c.server.as_deref(),
        if c.client_seen { Side::Client } else { Side::Server },
    );
    let catalog = key.as_ref().and_then(|k| sessions.verdict_at(k, c.start_ns));
    let mut ctx = SessionContext {
        catalog_stale: catalog.as_ref().map(|v| v.convergence == Convergence::Stale),
        tool_in_catalog: catalog.as_ref().zip(c.tool.as_deref()).and_then(|(v, t)| v.knows_tool(t)),
        ..SessionContext::default()
    };
    if let (Some(pins), Some(server), Some(tool)) = (pins, c.server.as_deref(), c.tool.as_deref()) {
        let in_use = c.tool_digest.clone().or_else(|| key.as_ref().and_then(|k| sessions.tool_digest_at(k, tool, c.start_ns)));
        if let Some(d) = in_use {
            if let PinCheck::Drift { changes, .. } = pins.check(server, tool, &d, crate::normalize::definitions::lookup(&d).as_ref()) {
                ctx.contract_drift = Some(changes);
            }
        }
    }
    ctx
}

/// Whether a verdict is worth reporting: every `tools/call`, and any other request that failed
/// somewhere. A successful `tools/list` or `initialize` has no outcome to verify; reporting it as
/// `unverified` would be noise, and it is covered by the catalog verdict.
pub fn reportable(v: &Verdict) -> bool {
    v.method.as_deref() == Some("tools/call")
        || v.first_failed_layer.is_some()
        || !matches!(v.state, HealthState::Unverified | HealthState::Healthy)
}

/// Classify a decided chain.
pub fn verdicts_of(d: &DecidedCalls, sessions: &Sessions, pins: Option<&Lockfile>, progress: &ProgressPolicy, now_ns: u64) -> Vec<Verdict> {
    let classify = |c: &CallEvidence| classify_with_clocks(c, sessions, pins, progress, now_ns, d.decision);
    let previous: Vec<Verdict> = d.previous.iter().map(classify).filter(reportable).collect();
    d.calls
        .iter()
        .map(classify)
        .map(|mut v| {
            // A revision names what it replaces: the same call is the one under the same span.
            v.supersedes = previous.iter().find(|p| p.span_id == v.span_id).map(|p| crate::verdict::Superseded {
                state: p.state,
                protocol_success: p.protocol_success,
                verified_success: p.verified_success,
            });
            v
        })
        .filter(reportable)
        .collect()
}

/// Classify a call with its session context and its progress clocks at `now_ns`.
pub fn classify_with_clocks(
    c: &CallEvidence,
    sessions: &Sessions,
    pins: Option<&Lockfile>,
    progress: &ProgressPolicy,
    now_ns: u64,
    d: crate::classify::Decision,
) -> Verdict {
    let mut ctx = session_context(sessions, pins, c);
    if c.progress.is_empty() {
        return classify_call(c, &ctx, d);
    }
    let f = crate::classify::progress::check(c);
    match crate::classify::progress::in_flight(c, &f, progress.clocks(c.tool.as_deref()), now_ns) {
        InFlight::Working => {
            ctx.working = true;
            classify_call(c, &ctx, d)
        }
        expired @ (InFlight::InactivityExceeded | InFlight::DeadlineExceeded) => {
            let mut c = c.clone();
            c.clock_expired = Some(if expired == InFlight::DeadlineExceeded { "deadline_exceeded" } else { "inactivity_exceeded" });
            classify_call(&c, &ctx, d)
        }
        _ => classify_call(c, &ctx, d),
    }
}

/// A discovered definition that differs from its pin.
#[derive(Clone, Debug, serde::Serialize)]
pub struct DriftEvent {
    pub drift: bool,
    pub server: String,
    pub tool: String,
    pub pinned_digest: String,
    pub digest: String,
    pub changes: Vec<crate::classify::drift::ContractChange>,
    #[serde(skip)]
    pub trace_id: [u8; 16],
    #[serde(skip)]
    pub span_id: [u8; 8],
}

/// Check the tools of every `tools/list` page in `spans` against the pins; each drifted
/// (server, tool, digest) is reported once.
pub fn detect_drift(
    spans: &[crate::evidence::SpanEvidence],
    pins: &Lockfile,
    seen: &mut rustc_hash::FxHashSet<(Arc<str>, Arc<str>, Arc<str>)>,
) -> Vec<DriftEvent> {
    let mut out = Vec::new();
    for s in spans {
        let (Some(server), Some(page)) = (&s.server, s.catalog.as_ref().and_then(|c| c.page.as_ref())) else { continue };
        for (tool, digest) in &page.tools {
            let key = (server.clone(), tool.clone(), digest.clone());
            if seen.contains(&key) {
                continue;
            }
            if let PinCheck::Drift { pinned_digest, changes } =
                pins.check(server, tool, digest, crate::normalize::definitions::lookup(digest).as_ref())
            {
                if seen.len() > 100_000 {
                    seen.clear();
                }
                seen.insert(key);
                out.push(DriftEvent {
                    drift: true,
                    server: server.to_string(),
                    tool: tool.to_string(),
                    pinned_digest,
                    digest: digest.to_string(),
                    changes,
                    trace_id: s.trace_id,
                    span_id: s.span_id,
                });
            }
        }
    }
    out
}

/// The correlator's state: call chains, session (catalog) state and the contract pins.
pub struct Correlator {
    pub chains: Chains,
    pub sessions: Sessions,
    pub pins: Option<Arc<Lockfile>>,
    pub drift_seen: rustc_hash::FxHashSet<(Arc<str>, Arc<str>, Arc<str>)>,
    /// Where catalog verdicts are published for the gate API.
    pub board: Arc<crate::gate::CatalogBoard>,
    convergence_groups: rustc_hash::FxHashSet<(String, Convergence)>,
    pub progress: ProgressPolicy,
    /// In-flight calls already reported `working` (reported once; the final verdict follows).
    working_reported: rustc_hash::FxHashSet<([u8; 16], [u8; 8])>,
    working_groups: rustc_hash::FxHashSet<(String, String)>,
}

impl Correlator {
    pub fn new(chains: Chains, sessions: Sessions, pins: Option<Arc<Lockfile>>) -> Self {
        Correlator {
            chains,
            sessions,
            pins,
            drift_seen: Default::default(),
            board: Default::default(),
            convergence_groups: Default::default(),
            progress: ProgressPolicy::default(),
            working_reported: Default::default(),
            working_groups: Default::default(),
        }
    }

    /// Check the clocks of in-flight calls with progress: report `working` ones while they run
    /// (once each), hold their chains open past `max_wait`, and decide the ones whose clock expired.
    fn check_progress(&mut self, now: Instant, decided: &mut Vec<DecidedCalls>, emitters: &mut Emitters) {
        let now_ns = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        let mut working: rustc_hash::FxHashMap<(String, String), u64> = Default::default();
        let mut interim = Vec::new();
        for id in self.chains.progress_chains() {
            let Some(calls) = self.chains.peek_calls(&id) else { continue };
            let (mut hold, mut expired) = (false, false);
            for c in &calls {
                let f = crate::classify::progress::check(c);
                match crate::classify::progress::in_flight(c, &f, self.progress.clocks(c.tool.as_deref()), now_ns) {
                    InFlight::Working => {
                        hold = true;
                        *working
                            .entry((c.tool.as_deref().unwrap_or("").to_string(), c.server.as_deref().unwrap_or("").to_string()))
                            .or_default() += 1;
                        if self.working_reported.insert((c.trace_id, c.anchor_span_id)) {
                            let d = crate::classify::Decision {
                                revision: 0,
                                decided_by: DecidedBy::InFlight,
                                root_seen: false,
                                truncated: false,
                            };
                            interim.push(classify_with_clocks(c, &self.sessions, self.pins.as_deref(), &self.progress, now_ns, d));
                        }
                    }
                    InFlight::InactivityExceeded | InFlight::DeadlineExceeded => expired = true,
                    _ => {}
                }
            }
            self.chains.set_hold(&id, hold);
            if expired && !hold {
                self.chains.decide_now(id, DecidedBy::Clock, now, decided);
            }
        }
        if !interim.is_empty() {
            emitters.emit_interim(&interim);
        }
        for (tool, server) in self.working_groups.iter().filter(|k| !working.contains_key(*k)) {
            emitters
                .meters
                .calls_working
                .record(0, &[KeyValue::new("gen_ai.tool.name", tool.clone()), KeyValue::new("server.address", server.clone())]);
        }
        for ((tool, server), n) in &working {
            emitters
                .meters
                .calls_working
                .record(*n, &[KeyValue::new("gen_ai.tool.name", tool.clone()), KeyValue::new("server.address", server.clone())]);
        }
        self.working_groups = working.into_keys().collect();
        if self.working_reported.len() > 100_000 {
            self.working_reported.clear();
        }
    }

    /// Sessions per current convergence verdict, by server (groups that emptied read 0).
    fn report_convergence(&mut self, m: &HealthMeters) {
        let counts = self.sessions.convergence_counts();
        for (server, conv) in self.convergence_groups.iter().filter(|k| !counts.contains_key(*k)) {
            m.catalog_convergence
                .record(0, &[KeyValue::new("server.address", server.clone()), KeyValue::new("convergence", conv.as_str())]);
        }
        for ((server, conv), n) in &counts {
            m.catalog_convergence
                .record(*n, &[KeyValue::new("server.address", server.clone()), KeyValue::new("convergence", conv.as_str())]);
        }
        self.convergence_groups = counts.into_keys().collect();
    }

    fn ingest(&mut self, batch: NormalizedBatch, decided: &mut Vec<DecidedCalls>, emitters: &mut Emitters) {
        let now = Instant::now();
        let changes = self.sessions.observe(&batch.evidence, now);
        if !changes.is_empty() {
            for ch in &changes {
                self.board.publish(&ch.session_key, ch.server.clone(), ch.verdict.clone());
            }
            emitters.emit_catalog(&changes);
        }
        if let Some(pins) = &self.pins {
            let drift = detect_drift(&batch.evidence, pins, &mut self.drift_seen);
            if !drift.is_empty() {
                emitters.emit_drift(&drift);
            }
        }
        self.chains.ingest(batch, now, decided);
    }
}

/// Run the correlator until `stop` fires, then take what is queued, decide everything still in
/// flight (marked `shutdown`) and emit it.
pub async fn run_correlator(
    mut rx: mpsc::Receiver<NormalizedBatch>,
    mut c: Correlator,
    mut emitters: Emitters,
    tick: Duration,
    stop: oneshot::Receiver<()>,
) {
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut decided = Vec::new();
    let mut verdicts = Vec::new();
    let mut last = ChainStats::default();
    let mut last_expiry = Instant::now();
    let mut last_convergence = Instant::now();
    let mut last_progress = Instant::now();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            biased;
            _ = &mut stop => break,
            b = rx.recv() => match b {
                Some(batch) => {
                    c.ingest(batch, &mut decided, &mut emitters);
                    // Take whatever else is already queued before deciding, to amortize.
                    while let Ok(batch) = rx.try_recv() {
                        c.ingest(batch, &mut decided, &mut emitters);
                        if decided.len() > 64 { break; }
                    }
                }
                None => break,
            },
            _ = interval.tick() => {
                let now = Instant::now();
                c.chains.tick(now, &mut decided);
                if now.saturating_duration_since(last_expiry) > Duration::from_secs(10) {
                    let gone = c.sessions.expire(now);
                    c.board.forget(&gone);
                    last_expiry = now;
                }
                report(&c.chains, &emitters.meters, &mut last);
                emitters.tally.flush(&emitters.meters);
                emitters.report_incidents();
                if now.saturating_duration_since(last_progress) >= Duration::from_secs(1) {
                    c.check_progress(now, &mut decided, &mut emitters);
                    last_progress = now;
                }
                if now.saturating_duration_since(last_convergence) > Duration::from_secs(5) {
                    c.report_convergence(&emitters.meters);
                    last_convergence = now;
                }
            }
        }
        flush(&mut decided, &mut verdicts, &c, &mut emitters);
    }
    rx.close();
    while let Some(batch) = rx.recv().await {
        c.ingest(batch, &mut decided, &mut emitters);
    }
    c.chains.drain(DecidedBy::Shutdown, Instant::now(), &mut decided);
    flush(&mut decided, &mut verdicts, &c, &mut emitters);
    report(&c.chains, &emitters.meters, &mut last);
    emitters.tally.flush(&emitters.meters);
    emitters.report_incidents();
    c.report_convergence(&emitters.meters);
    tracing::info!(decided = c.chains.stats.chains_decided, "correlator stopped; chains in flight were decided at shutdown");
}

fn flush(decided: &mut Vec<DecidedCalls>, verdicts: &mut Vec<Verdict>, c: &Correlator, emitters: &mut Emitters) {
    if decided.is_empty() {
        return;
    }
    verdicts.clear();
    let now_ns = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    for d in decided.drain(..) {
        verdicts.extend(verdicts_of(&d, &c.sessions, c.pins.as_deref(), &c.progress, now_ns));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::correlate::{ChainLimits, SessionLimits};
    use crate::evidence::{OutcomeReceipt, OutcomeResult, SpanEvidence, VerifierMethod};
    use crate::normalize::NormalizedBatch;
    use crate::verdict::DecidedBy;

    fn call_span() -> SpanEvidence {
        let mut s = SpanEvidence::new([7; 16], [1; 8]);
        s.method = Some(Method::ToolsCall);
        s.side = Side::Client;
        s.request_id = Some("1".into());
        s.start_ns = 10;
        s.end_ns = 20;
        s
    }

    /// SPEC section 3's falsifiable transition: a timed-out call at a side-effect boundary is
    /// `effect_unknown` (retry blocked); a later receipt whose deliverable check fails moves it to
    /// `false_success`.
    #[test]
    fn effect_unknown_moves_to_false_success_when_a_failing_receipt_arrives() {
        let mut chains = Chains::new(ChainLimits { decision_wait: Duration::from_millis(10), ..ChainLimits::default() });
        let sessions = Sessions::new(SessionLimits::default());
        let t0 = Instant::now();
        let mut out = Vec::new();
        let mut timed_out = call_span();
        timed_out.transport = Some(crate::evidence::TransportOutcome::Timeout);
        timed_out.effect_boundary = Some(crate::evidence::EffectBoundary::SideEffect);
        chains.ingest(NormalizedBatch { evidence: vec![timed_out], ..Default::default() }, t0, &mut out);
        chains.tick(t0 + Duration::from_millis(20), &mut out);
        let first = verdicts_of(&out.remove(0), &sessions, None, &ProgressPolicy::default(), 0);
        assert_eq!(first[0].state, HealthState::EffectUnknown);
        assert!(!first[0].retry_safe, "automatic retry is blocked until reconciliation");

        let mut receipt = SpanEvidence::new([7; 16], [4; 8]);
        receipt.parent_span_id = Some([1; 8]);
        receipt.outcomes.push(OutcomeReceipt {
            result: OutcomeResult::Failed,
            method: VerifierMethod::TestResult,
            checked_at_ns: 40,
            request_id: None,
        });
        chains.ingest(NormalizedBatch { evidence: vec![receipt], ..Default::default() }, t0 + Duration::from_millis(30), &mut out);
        chains.tick(t0 + Duration::from_millis(50), &mut out);
        let second = verdicts_of(&out.remove(0), &sessions, None, &ProgressPolicy::default(), 0);
        assert_eq!(second[0].state, HealthState::FalseSuccess);
        assert_eq!(second[0].supersedes.map(|p| p.state), Some(HealthState::EffectUnknown));
    }

    /// SPEC section 3's other transition: a call on a stale catalog is `stale_catalog`; after a
    /// complete refresh (and install) the next call moves on to its own layers' state.
    #[test]
    fn a_stale_catalog_followed_by_a_complete_refresh_moves_on() {
        use crate::evidence::catalog::{CatalogFacts, ListPage, SignalSource};
        let mut sessions = Sessions::new(SessionLimits::default());
        let fact = |at: u64, f: CatalogFacts| {
            let mut s = SpanEvidence::new([9; 16], [at as u8; 8]);
            s.session_id = Some("s-1".into());
            s.side = Side::Client;
            s.start_ns = at;
            s.end_ns = at;
            s.catalog = Some(Box::new(f));
            s
        };
        let page = |at: u64| {
            let mut s = fact(
                at,
                CatalogFacts {
                    page: Some(ListPage {
                        cursor: None,
                        next_cursor_present: false,
                        tools: vec![(Arc::from("t"), Arc::from("sha256:aa"))],
                        ttl_ms: None,
                        cache_scope: None,
                    }),
                    ..Default::default()
                },
            );
            s.method = Some(Method::ToolsList);
            s
        };
        let installed = crate::classify::digest::registry_digest(&[crate::classify::digest::ToolDigest {
            name: "t".into(),
            digest: "sha256:aa".into(),
            projection_version: crate::classify::digest::PROJECTION_VERSION.into(),
        }]);
        let timeline = vec![
            fact(1, CatalogFacts { list_changed_capability: Some(true), ..Default::default() }),
            page(10),
            fact(11, CatalogFacts { installed_digest: Some(Arc::from(installed.as_str())), ..Default::default() }),
            fact(20, CatalogFacts { signal: Some(SignalSource::Notification), ..Default::default() }),
            page(40),
            fact(41, CatalogFacts { installed_digest: Some(Arc::from(installed.as_str())), ..Default::default() }),
        ];
        sessions.observe(&timeline, Instant::now());
        let call_at = |at: u64| {
            let mut c = CallEvidence {
                method: Some(Method::ToolsCall),
                session_id: Some("s-1".into()),
                client_seen: true,
                response_seen: true,
                start_ns: at,
                ..Default::default()
            };
            c.outcomes.push(OutcomeReceipt {
                result: OutcomeResult::Confirmed,
                method: VerifierMethod::Receipt,
                checked_at_ns: at + 5,
                request_id: None,
            });
            c
        };
        let d = crate::classify::Decision { revision: 0, decided_by: DecidedBy::Quiet, root_seen: true, truncated: false };
        let p = ProgressPolicy::default();
        assert_eq!(
            classify_with_clocks(&call_at(30), &sessions, None, &p, 0, d).state,
            HealthState::StaleCatalog,
            "between the signal and the refresh"
        );
        assert_eq!(
            classify_with_clocks(&call_at(50), &sessions, None, &p, 0, d).state,
            HealthState::Healthy,
            "after the complete refresh it moves on"
        );
    }

    /// Issue 4: a verifier that reports in its own trace joins its call by operation key.
    #[test]
    fn a_verifier_in_another_trace_joins_by_operation_key() {
        let mut chains = Chains::new(ChainLimits { decision_wait: Duration::from_millis(10), ..ChainLimits::default() });
        let sessions = Sessions::new(SessionLimits::default());
        let t0 = Instant::now();
        let mut out = Vec::new();
        let mut call = call_span();
        call.operation_key = Some("op-77".into());
        chains.ingest(NormalizedBatch { evidence: vec![call], ..Default::default() }, t0, &mut out);
        chains.tick(t0 + Duration::from_millis(20), &mut out);
        assert_eq!(verdicts_of(&out.remove(0), &sessions, None, &ProgressPolicy::default(), 0)[0].state, HealthState::Unverified);

        let mut v = SpanEvidence::new([8; 16], [5; 8]);
        v.operation_key = Some("op-77".into());
        v.outcomes.push(OutcomeReceipt {
            result: OutcomeResult::Confirmed,
            method: VerifierMethod::RowVersion,
            checked_at_ns: 50,
            request_id: None,
        });
        chains.ingest(NormalizedBatch { evidence: vec![v], ..Default::default() }, t0 + Duration::from_millis(30), &mut out);
        chains.tick(t0 + Duration::from_millis(50), &mut out);
        let d = out.remove(0);
        assert_eq!(d.trace_id, [7; 16], "the receipt joined the call's trace");
        let v = verdicts_of(&d, &sessions, None, &ProgressPolicy::default(), 0);
        assert_eq!((v[0].state, v[0].revision), (HealthState::Healthy, 1));
        assert_eq!(chains.stats.joined_by_operation_key, 1);
    }

    /// A receipt checked before the call started is stale evidence about something else.
    #[test]
    fn a_receipt_older_than_the_call_is_ignored() {
        let mut c =
            CallEvidence { method: Some(Method::ToolsCall), response_seen: true, client_seen: true, start_ns: 100, ..Default::default() };
        c.outcomes.push(OutcomeReceipt {
            result: OutcomeResult::Confirmed,
            method: VerifierMethod::Receipt,
            checked_at_ns: 50,
            request_id: None,
        });
        let d = crate::classify::Decision { revision: 0, decided_by: DecidedBy::Quiet, root_seen: true, truncated: false };
        let sessions = Sessions::new(SessionLimits::default());
        assert_eq!(classify_with_clocks(&c, &sessions, None, &ProgressPolicy::default(), 0, d).state, HealthState::Unverified);
    }

    #[test]
    fn a_late_receipt_revises_and_names_what_it_supersedes() {
        let mut chains = Chains::new(ChainLimits { decision_wait: Duration::from_millis(10), ..ChainLimits::default() });
        let sessions = Sessions::new(SessionLimits::default());
        let t0 = Instant::now();
        let mut out = Vec::new();
        chains.ingest(NormalizedBatch { evidence: vec![call_span()], ..Default::default() }, t0, &mut out);
        chains.tick(t0 + Duration::from_millis(20), &mut out);
        let first = verdicts_of(&out.remove(0), &sessions, None, &ProgressPolicy::default(), 0);
        assert_eq!(first[0].state, HealthState::Unverified);
        assert_eq!(first[0].supersedes, None);

        let mut v = SpanEvidence::new([7; 16], [3; 8]);
        v.parent_span_id = Some([1; 8]);
        v.outcomes.push(OutcomeReceipt {
            result: OutcomeResult::Confirmed,
            method: VerifierMethod::Receipt,
            checked_at_ns: 30,
            request_id: None,
        });
        chains.ingest(NormalizedBatch { evidence: vec![v], ..Default::default() }, t0 + Duration::from_millis(30), &mut out);
        chains.tick(t0 + Duration::from_millis(50), &mut out);
        let second = verdicts_of(&out.remove(0), &sessions, None, &ProgressPolicy::default(), 0);
        assert_eq!(second[0].revision, 1);
        assert_eq!(second[0].state, HealthState::Healthy);
        let p = second[0].supersedes.expect("a revision names what it replaces");
        assert_eq!((p.state, p.protocol_success, p.verified_success), (HealthState::Unverified, true, false));
    }
}
