//! The status snapshot: what the status page (`service::status`) shows, kept up to date from the
//! engine's [`Decided`] records by a [`Sink`]. Bounded everywhere: open incidents, sessions, drift
//! reports, servers and recent calls each have a limit, and what a limit pushes out is counted
//! (`status_*` tables of [`crate::bounded`]).
//!
//! Nothing secret gets in: calls are kept as their verdict says them (session ids as hashes, no
//! arguments or results); catalog sessions by the hash of their key. Everything is plain data for
//! the page to escape.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use serde::Serialize;

use super::sink::Sink;
use crate::bounded::BoundedMap;
use crate::classify::incidents::{self, Incident, Transition};
use crate::engine::{CatalogLine, Decided};
use crate::evidence::chain::SpanSummary;
use crate::evidence::time::Moment;
use crate::evidence::{CallError, OutcomeResult, TransportOutcome};
use crate::verdict::{jsonrpc_meaning, reason_meaning, DecidedBy, HealthState, Layer, LayerStatus, Owner, SpanKind, Verdict};

/// Open incidents shown (past it the least recently changed goes, counted).
pub(crate) const MAX_INCIDENTS: usize = 500;
/// Recently resolved incidents shown.
pub(crate) const MAX_RESOLVED: usize = 20;
/// Sessions (or client/server pairs) whose catalog state is shown.
pub(crate) const MAX_SESSIONS: usize = 1000;
/// Drift reports shown, one per (server, tool).
pub(crate) const MAX_DRIFT: usize = 200;
/// Servers whose rates are kept.
pub(crate) const MAX_SERVERS: usize = 500;
/// Recent calls shown, newest first.
pub(crate) const MAX_RECENT_CALLS: usize = 50;
/// Healthy calls remembered to name the call that resolved an incident.
pub(crate) const MAX_RESOLVING_CALLS: usize = 200;

/// The snapshot the sink writes and the page reads, behind one lock.
pub(crate) type SharedStatus = Arc<Mutex<StatusSnapshot>>;

/// One span group of an evidence chain: how many spans of a kind one instrumentation wrote.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct ChainLink {
    pub kind: &'static str,
    pub instrumentation: &'static str,
    pub spans: u8,
}

/// One span of an evidence chain, from its bounded summary: nothing a span's own name, its
/// attributes or its payload said beyond the fixed vocabulary.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct SpanView {
    /// `client`, `server`, `verifier` or `other`.
    pub side: &'static str,
    pub instrumentation: &'static str,
    /// The span's MCP method (the specification's names; `other` for anything else), or `—`.
    pub name: &'static str,
    /// `error` when the span's status was ERROR, else `ok`.
    pub status: &'static str,
    pub http_status: Option<u16>,
    /// The JSON-RPC error code the span reported.
    pub error_code: Option<i32>,
    /// What the span's error was: the code's meaning, or its class in words.
    pub error: Option<&'static str>,
    pub transport: Option<&'static str>,
    /// A verifier span's result (`confirmed`, `missing`, …).
    pub outcome: Option<&'static str>,
    pub duration_ns: u64,
    /// The layer this span's evidence decided, when it spoke about one.
    pub layer: Option<&'static str>,
    /// What the span said about that layer, in words.
    pub finding: &'static str,
}

impl SpanView {
    fn of(s: &SpanSummary) -> SpanView {
        let (layer, finding) = span_finding(s);
        let (error_code, error) = match s.error {
            Some(CallError::JsonRpc(c)) => (Some(c), Some(jsonrpc_meaning(i64::from(c)))),
            Some(CallError::ToolError) => (None, Some("tool error (isError)")),
            Some(CallError::Timeout) => (None, Some("timeout")),
            Some(CallError::Connection(t)) => (None, Some(t.as_str())),
            Some(CallError::UnknownTool) => (None, Some("unknown tool")),
            Some(CallError::Unclassified) => (None, Some("unclassified error")),
            None => (None, None),
        };
        SpanView {
            side: s.kind.as_str(),
            instrumentation: s.by.as_str(),
            name: s.method.unwrap_or("—"),
            status: if s.status_error { "error" } else { "ok" },
            http_status: s.http_status,
            error_code,
            error,
            transport: s.transport.map(TransportOutcome::as_str),
            outcome: s.outcome.map(OutcomeResult::as_str),
            duration_ns: s.duration_ns(),
            layer: layer.map(Layer::as_str),
            finding,
        }
    }
}

/// Which layer one span's evidence decided, and how, in the classifier's order of reading: a
/// connection failure is transport, 401/403 authorization, a 5xx or 429 transport, a JSON-RPC
/// error protocol (unless a client SDK made the code up for its own side of the wire), an
/// `isError` result execution, a verifier's receipt the outcome.
pub(crate) fn span_finding(s: &SpanSummary) -> (Option<Layer>, &'static str) {
    let failed_transport =
        s.transport.is_some_and(|t| t != TransportOutcome::Ok) || matches!(s.error, Some(CallError::Connection(_) | CallError::Timeout));
    if failed_transport {
        return (Some(Layer::Transport), "transport failed");
    }
    match s.http_status {
        Some(401 | 403) => return (Some(Layer::Authorization), "authorization failed"),
        Some(429) | Some(500..=599) => return (Some(Layer::Transport), "transport failed"),
        _ => {}
    }
    match s.error {
        Some(CallError::JsonRpc(c)) if crate::evidence::client_local_code(i64::from(c)).is_some() => {
            return (Some(Layer::Transport), "transport failed (the client SDK's own code)")
        }
        Some(CallError::JsonRpc(_) | CallError::UnknownTool) => return (Some(Layer::Protocol), "protocol failed"),
        Some(CallError::ToolError) => return (Some(Layer::Execution), "execution failed"),
        _ => {}
    }
    match (s.kind, s.outcome) {
        (_, Some(OutcomeResult::Confirmed)) => return (Some(Layer::Outcome), "outcome confirmed"),
        (_, Some(OutcomeResult::VerifierError)) => return (Some(Layer::Outcome), "the verifier could not run"),
        (_, Some(_)) => return (Some(Layer::Outcome), "outcome failed"),
        (SpanKind::Verifier, None) => return (Some(Layer::Outcome), "verifier finding"),
        _ => {}
    }
    if s.request_sent_marker {
        (None, "request sent, no answer on this span")
    } else if s.status_error || s.error.is_some() {
        (None, "error without a named cause")
    } else {
        (None, "no failure")
    }
}

/// Why a chain was decided when it was, in words: which clock (or event) decided.
pub(crate) fn decided_by_meaning(d: DecidedBy) -> &'static str {
    match d {
        DecidedBy::Quiet => "the trace went quiet for decision_wait",
        DecidedBy::MaxWait => "max_wait passed before the trace completed",
        DecidedBy::Evicted => "pushed out by the correlator's bounds (early)",
        DecidedBy::Shutdown => "the service was shutting down (early)",
        DecidedBy::Replay => "read from a file",
        DecidedBy::Clock => "an in-flight call outlived its inactivity window or deadline",
        DecidedBy::InFlight => "an interim report on a call still in flight",
    }
}

/// A call as the page explains it: the verdict's own words, its evidence chain, the layer that
/// decided and what was missing.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct CallView {
    pub trace_id: String,
    pub span_id: String,
    pub method: Option<String>,
    pub tool: Option<String>,
    pub server: Option<String>,
    pub agent: Option<String>,
    pub session_id_hash: Option<String>,
    pub state: &'static str,
    pub first_failed_layer: Option<&'static str>,
    /// Every layer's status, in order.
    pub layers: Vec<(&'static str, &'static str)>,
    pub reason: Option<String>,
    pub next_action: String,
    pub required_scope: Option<String>,
    pub confidence: &'static str,
    pub decided_by: &'static str,
    pub revision: u32,
    pub protocol_success: bool,
    pub verified_success: bool,
    pub attempt: bool,
    pub outcome_method: Option<&'static str>,
    pub chain: Vec<ChainLink>,
    /// Who must act, for a call that failed (the alert routes' owner of its first failed layer).
    pub owner: Option<Owner>,
    /// The failure class (`reason`) in words, when it is a code (`jsonrpc_-32601`).
    pub reason_meaning: Option<&'static str>,
    /// The chain's spans (at most [`crate::evidence::chain::MAX_SPAN_SUMMARIES`]).
    pub spans: Vec<SpanView>,
    /// Spans counted in the chain but not summarized.
    pub more_spans: u8,
    /// Which clock (or event) decided the chain, in words.
    pub decided_by_meaning: &'static str,
    pub duration_ns: u64,
    /// Which layer decided the verdict, in a sentence.
    pub decided_layer: String,
    /// What the evidence lacked (short phrases); empty when nothing was.
    pub missing: Vec<String>,
    pub end_ns: u64,
}

impl CallView {
    pub(crate) fn of(v: &Verdict) -> CallView {
        let chain: Vec<ChainLink> =
            v.chain.entries().map(|(k, i, n)| ChainLink { kind: k.as_str(), instrumentation: i.as_str(), spans: n }).collect();
        CallView {
            trace_id: crate::evidence::hash::to_hex(&v.trace_id),
            span_id: crate::evidence::hash::to_hex(&v.span_id),
            method: v.method.clone(),
            tool: v.tool.as_deref().map(str::to_string),
            server: v.server.as_deref().map(str::to_string),
            agent: v.agent.as_deref().map(str::to_string),
            session_id_hash: v.session_id_hash.as_deref().map(str::to_string),
            state: v.state.as_str(),
            first_failed_layer: v.first_failed_layer.map(Layer::as_str),
            layers: Layer::ALL.iter().map(|l| (l.as_str(), v.layers.get(*l).as_str())).collect(),
            reason: v.reason.clone(),
            next_action: v.next_action.to_string(),
            required_scope: v.required_scope.as_deref().map(str::to_string),
            confidence: v.confidence.as_str(),
            decided_by: v.decided_by.as_str(),
            revision: v.revision,
            protocol_success: v.protocol_success,
            verified_success: v.verified_success,
            attempt: v.attempt,
            outcome_method: v.outcome_method,
            chain,
            owner: v.state.is_failure().then(|| Owner::of(v.first_failed_layer)),
            reason_meaning: v.reason.as_deref().and_then(reason_meaning),
            spans: v.chain.spans().map(SpanView::of).collect(),
            more_spans: v.chain.more_spans(),
            decided_by_meaning: decided_by_meaning(v.decided_by),
            duration_ns: v.end_ns.saturating_sub(v.start_ns),
            decided_layer: decided_layer(v),
            missing: missing(v),
            end_ns: v.end_ns,
        }
    }
}

/// Which layer decided a verdict: the first failed one, else the outcome when it was verified,
/// else none (nothing failed, nothing proved).
fn decided_layer(v: &Verdict) -> String {
    match (v.first_failed_layer, v.outcome_method) {
        (Some(l), _) => format!("{} failed{}", l.as_str(), v.reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default()),
        (None, Some(m)) if v.verified_success => format!("outcome passed, verified by {m}"),
        (None, Some(m)) => format!("outcome checked by {m}; state {}", v.state.as_str()),
        (None, None) => format!("no layer failed; state {} from the protocol evidence", v.state.as_str()),
    }
}

/// What the evidence of a verdict lacked: the reason it may be partial, the sides and verifier
/// not seen, and the layers left unobserved before any failure.
fn missing(v: &Verdict) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(p) = v.partial {
        out.push(format!("partial evidence: {}", p.as_str()));
    }
    if !v.chain.has(SpanKind::Client) {
        out.push("no client span".into());
    }
    if !v.chain.has(SpanKind::Server) {
        out.push("no server span".into());
    }
    // A verifier matters where nothing failed before the outcome: it is what turns `unverified`
    // into `healthy` (or `false_success`).
    if !v.chain.has(SpanKind::Verifier) && v.first_failed_layer.is_none() && !v.verified_success {
        out.push("no verifier span (the outcome was not checked)".into());
    }
    let before_failure = v.first_failed_layer.map_or(Layer::ALL.len(), |l| l as usize);
    let unobserved: Vec<&str> =
        Layer::ALL[..before_failure].iter().filter(|l| v.layers.get(**l) == LayerStatus::Unobserved).map(|l| l.as_str()).collect();
    if !unobserved.is_empty() {
        out.push(format!("unobserved: {}", unobserved.join(", ")));
    }
    out
}

/// An open (or lately resolved) incident, with the latest call that failed with its cause.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct IncidentView {
    pub id: String,
    pub incident_state: &'static str,
    pub server: Option<String>,
    pub tool: Option<String>,
    pub first_failed_layer: Option<&'static str>,
    pub state: &'static str,
    pub error_class: Option<String>,
    pub required_authority: Option<String>,
    pub next_action: String,
    pub calls: u64,
    pub sessions: usize,
    pub agents: Vec<String>,
    pub retry_count: u64,
    pub confidence: &'static str,
    pub verifier_result: Option<&'static str>,
    pub first_evidence_ns: u64,
    pub last_evidence_ns: u64,
    /// The latest failing call of this cause seen by this instance, when there is one.
    pub evidence: Option<CallView>,
    /// Who must act: the alert routes' owner of the first failed layer.
    pub owner: Owner,
    /// The error class in words, when it is a code (`jsonrpc_-32601`: "method not found").
    pub error_meaning: Option<&'static str>,
    /// For a resolved incident: what resolved it, when this instance saw it.
    pub resolved_by: Option<Resolution>,
}

/// What resolved an incident: a healthy call of its scope (SPEC: an incident resolves only when
/// a later call passed the failed layer and its outcome was observed), or for a stale catalog
/// the session's complete re-list.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct Resolution {
    /// `healthy_call` or `catalog_converged`.
    pub by: &'static str,
    pub trace_id: Option<String>,
    pub span_id: Option<String>,
    pub method: Option<String>,
    pub tool: Option<String>,
    pub agent: Option<String>,
    pub at_ns: u64,
}

impl IncidentView {
    fn of(row: &Incident, evidence: Option<CallView>) -> IncidentView {
        IncidentView {
            owner: Owner::of(row.cause.first_failed_layer),
            error_meaning: row.cause.error_class.as_deref().and_then(reason_meaning),
            resolved_by: None,
            id: row.id.clone(),
            incident_state: row.state.as_str(),
            server: row.cause.server.as_deref().map(str::to_string),
            tool: row.cause.tool.as_deref().map(str::to_string),
            first_failed_layer: row.cause.first_failed_layer.map(Layer::as_str),
            state: row.cause.state.as_str(),
            error_class: row.cause.error_class.clone(),
            required_authority: row.required_authority.as_deref().map(str::to_string),
            next_action: row.next_action.clone(),
            calls: row.calls,
            sessions: row.sessions.len(),
            agents: row.agents.iter().map(|a| a.to_string()).collect(),
            retry_count: row.retry_count,
            confidence: row.confidence.as_str(),
            verifier_result: row.verifier_result.map(|r| r.as_str()),
            first_evidence_ns: row.first_evidence_ns,
            last_evidence_ns: row.last_evidence_ns,
            evidence,
        }
    }
}

/// Attempts and successes of one server since the start (SPEC's two rates).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub(crate) struct Rates {
    pub attempts: u64,
    pub protocol_successes: u64,
    pub verified_successes: u64,
    /// Attempts no span shows answered or failed ([`Verdict::unconfirmed`]): shown beside the
    /// rates, which do not count them as successes.
    pub unconfirmed: u64,
}

impl Rates {
    /// Count an attempt's verdict; a revision moves its successes, never the attempt again.
    fn add(&mut self, v: &Verdict) {
        if !v.attempt {
            return;
        }
        let (p, ver) = (u64::from(v.protocol_success), u64::from(v.verified_success));
        match v.supersedes {
            Some(was) => {
                self.protocol_successes = (self.protocol_successes + p).saturating_sub(u64::from(was.protocol_success));
                self.verified_successes = (self.verified_successes + ver).saturating_sub(u64::from(was.verified_success));
                self.unconfirmed = (self.unconfirmed + u64::from(v.unconfirmed())).saturating_sub(u64::from(was.unconfirmed));
            }
            None => {
                self.attempts += 1;
                self.protocol_successes += p;
                self.verified_successes += ver;
                self.unconfirmed += u64::from(v.unconfirmed());
            }
        }
    }
    fn rate(n: u64, of: u64) -> Option<f64> {
        (of > 0).then(|| n as f64 / of as f64)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct ServerRates {
    pub server: String,
    #[serde(flatten)]
    pub rates: Rates,
    pub protocol_success_rate: Option<f64>,
    pub verified_success_rate: Option<f64>,
}

/// One session's (or client/server pair's) catalog state, by the hash of its key.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct CatalogView {
    pub session_hash: String,
    pub server: Option<String>,
    pub agent: Option<String>,
    pub convergence: &'static str,
    pub reason: &'static str,
    pub next_step: &'static str,
    pub protocol_revision: &'static str,
    pub at_ns: u64,
}

/// A tool definition that differs from its pin.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct DriftView {
    pub server: String,
    pub tool: String,
    pub pinned_digest: String,
    pub digest: String,
    pub changes: Vec<String>,
    pub trace_id: String,
}

/// One queue's fill when the page was drawn.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct QueueFill {
    pub name: &'static str,
    pub depth: usize,
    pub capacity: usize,
}

/// Everything the page shows, as `/status.json` serves it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct StatusView {
    pub generated_at_ns: u64,
    pub incidents: Vec<IncidentView>,
    pub resolved_incidents: Vec<IncidentView>,
    pub servers: Vec<ServerRates>,
    pub catalogs: Vec<CatalogView>,
    pub drift: Vec<DriftView>,
    pub queues: Vec<QueueFill>,
    pub recent_calls: Vec<CallView>,
    /// Entries each of the page's bounded tables pushed out so far.
    pub evicted: Vec<(&'static str, u64)>,
}

/// The page's bounded memory of what the engine decided.
pub(crate) struct StatusSnapshot {
    incidents: BoundedMap<String, Incident>,
    resolved: VecDeque<IncidentView>,
    /// The latest failing call of each incident cause (the id is computed when the page is drawn:
    /// it is a hash, not work for every failing call).
    incident_calls: BoundedMap<incidents::Cause, Arc<Verdict>>,
    servers: BoundedMap<String, Rates>,
    catalogs: BoundedMap<String, CatalogView>,
    drift: BoundedMap<(String, String), DriftView>,
    /// Kept as verdicts (a clone is a few reference counts); explained when the page is drawn.
    recent: VecDeque<Arc<Verdict>>,
    /// The latest healthy calls (any server), newest first: which call resolved an incident.
    healthy: VecDeque<Arc<Verdict>>,
    /// The latest catalog convergences (server, session hash, time), for stale-catalog incidents.
    converged: VecDeque<(Option<String>, String, u64)>,
}

/// The names the tables' evictions are counted under.
const TABLES: [&str; 8] = [
    "status_incidents",
    "status_incident_calls",
    "status_servers",
    "status_sessions",
    "status_drift",
    "status_recent_calls",
    "status_resolving_calls",
    "status_convergences",
];

impl Default for StatusSnapshot {
    fn default() -> Self {
        StatusSnapshot {
            incidents: BoundedMap::with_capacity(TABLES[0], MAX_INCIDENTS),
            resolved: VecDeque::with_capacity(MAX_RESOLVED),
            incident_calls: BoundedMap::with_capacity(TABLES[1], MAX_INCIDENTS),
            servers: BoundedMap::with_capacity(TABLES[2], MAX_SERVERS),
            catalogs: BoundedMap::with_capacity(TABLES[3], MAX_SESSIONS),
            drift: BoundedMap::with_capacity(TABLES[4], MAX_DRIFT),
            recent: VecDeque::with_capacity(MAX_RECENT_CALLS),
            healthy: VecDeque::with_capacity(MAX_RESOLVING_CALLS),
            converged: VecDeque::with_capacity(MAX_RESOLVING_CALLS),
        }
    }
}

/// The key a server's figures are kept under (calls that named none share one row).
const NO_SERVER: &str = "(unknown server)";

impl StatusSnapshot {
    pub(crate) fn shared() -> SharedStatus {
        Arc::new(Mutex::new(StatusSnapshot::default()))
    }

    /// Fold one engine step's records in.
    pub(crate) fn accept(&mut self, records: &[Decided]) {
        // Only the newest calls of a step can stay among the recent ones; the others are counted
        // as pushed out without being copied.
        let calls = records.iter().filter(|r| matches!(r, Decided::Call(_))).count();
        let mut skip_recent = calls.saturating_sub(MAX_RECENT_CALLS);
        if skip_recent > 0 {
            crate::bounded::counter(TABLES[5]).fetch_add(skip_recent as u64, std::sync::atomic::Ordering::Relaxed);
        }
        // Likewise the healthy calls: of a step's, only the newest MAX_RESOLVING_CALLS can stay,
        // and nothing reads the list before the step's last one is in. A step decides up to
        // thousands of calls, and the page's copies of verdicts were 8 % of the service's CPU
        // (the stage breakdown in docs/benchmarks.md), most of them healthy calls pushed out
        // again within the step. Counted as pushed out, as they were.
        let healthy = records.iter().filter(|r| matches!(r, Decided::Call(v) if v.state == HealthState::Healthy)).count();
        let mut skip_healthy = healthy.saturating_sub(MAX_RESOLVING_CALLS);
        if skip_healthy > 0 {
            crate::bounded::counter(TABLES[6]).fetch_add(skip_healthy as u64, std::sync::atomic::Ordering::Relaxed);
        }
        // The step's healthy calls and convergences first: an incident they resolve may come
        // before them among the records.
        for r in records {
            match r {
                Decided::Call(v) if v.state == HealthState::Healthy && skip_healthy > 0 => skip_healthy -= 1,
                Decided::Call(v) if v.state == HealthState::Healthy => {
                    if self.healthy.len() == MAX_RESOLVING_CALLS {
                        self.healthy.pop_back();
                        crate::bounded::counter(TABLES[6]).fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    self.healthy.push_front(v.clone());
                }
                Decided::Catalog(c) if c.verdict.convergence == crate::classify::catalog::Convergence::Converged => {
                    let line = CatalogLine::of(c);
                    if self.converged.len() == MAX_RESOLVING_CALLS {
                        self.converged.pop_back();
                        crate::bounded::counter(TABLES[7]).fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    self.converged.push_front((line.server.map(str::to_string), line.session_hash, c.at_ns));
                }
                _ => {}
            }
        }
        for r in records {
            match r {
                Decided::Call(v) if skip_recent > 0 => {
                    skip_recent -= 1;
                    self.call(v, false);
                }
                Decided::Call(v) => self.call(v, true),
                Decided::Incident(i) => match i.transition {
                    Transition::Opened | Transition::Updated => {
                        self.incidents.insert(i.row.id.clone(), i.row.clone());
                    }
                    Transition::Resolved => {
                        self.incidents.remove(i.row.id.as_str());
                        let evidence = self.incident_calls.remove(&i.row.cause).map(|v| CallView::of(&v));
                        if self.resolved.len() == MAX_RESOLVED {
                            self.resolved.pop_back();
                        }
                        let mut view = IncidentView::of(&i.row, evidence);
                        view.resolved_by = self.resolution(&i.row);
                        self.resolved.push_front(view);
                    }
                },
                Decided::Catalog(c) => {
                    let line = CatalogLine::of(c);
                    let view = CatalogView {
                        session_hash: line.session_hash.clone(),
                        server: line.server.map(str::to_string),
                        agent: line.agent.map(str::to_string),
                        convergence: c.verdict.convergence.as_str(),
                        reason: c.verdict.reason,
                        next_step: c.verdict.next_step,
                        protocol_revision: c.revision.as_str(),
                        at_ns: c.at_ns,
                    };
                    self.catalogs.insert(line.session_hash, view);
                }
                Decided::Drift(d) => {
                    let view = DriftView {
                        server: d.server.clone(),
                        tool: d.tool.clone(),
                        pinned_digest: d.pinned_digest.clone(),
                        digest: d.digest.clone(),
                        changes: d.changes.iter().map(|c| c.describe()).collect(),
                        trace_id: hex::encode(d.trace_id),
                    };
                    self.drift.insert((d.server.clone(), d.tool.clone()), view);
                }
                // Interim reports are no attempts and change on every step; findings are no verdicts.
                Decided::Interim(_) | Decided::Finding(_) => {}
            }
        }
    }

    /// What resolved `row`: the healthy call of its server that ended when the incident's
    /// evidence did (the resolution moves its last evidence to the resolving call's end), else
    /// the latest one that ended no earlier; for a stale catalog, the convergence at that time.
    fn resolution(&self, row: &Incident) -> Option<Resolution> {
        let server = row.cause.server.as_deref();
        let at = row.last_evidence_ns;
        if row.cause.state == HealthState::StaleCatalog {
            if let Some((_, hash, t)) = self.converged.iter().find(|(s, _, t)| s.as_deref() == server && *t == at) {
                return Some(Resolution {
                    by: "catalog_converged",
                    trace_id: None,
                    span_id: None,
                    method: Some("tools/list".into()),
                    tool: None,
                    agent: Some(format!("session {}", hash.get(..16).unwrap_or(hash))),
                    at_ns: *t,
                });
            }
        }
        let mine = |v: &&Arc<Verdict>| v.server.as_deref() == server;
        let call = self
            .healthy
            .iter()
            .filter(mine)
            .find(|v| v.end_ns == at)
            .or_else(|| self.healthy.iter().filter(mine).filter(|v| v.end_ns >= at).min_by_key(|v| v.end_ns))?;
        Some(Resolution {
            by: "healthy_call",
            trace_id: Some(hex::encode(call.trace_id)),
            span_id: Some(hex::encode(call.span_id)),
            method: call.method.clone(),
            tool: call.tool.as_deref().map(str::to_string),
            agent: call.agent.as_deref().map(str::to_string),
            at_ns: call.end_ns,
        })
    }

    fn call(&mut self, v: &Arc<Verdict>, recent: bool) {
        let server = v.server.as_deref().unwrap_or(NO_SERVER);
        if v.attempt {
            match self.servers.get_mut(server) {
                Some(r) => r.add(v),
                None => {
                    let mut r = Rates::default();
                    r.add(v);
                    self.servers.insert(server.to_string(), r);
                }
            }
        }
        if let Some(cause) = incidents::cause_of(v) {
            self.incident_calls.insert(cause, v.clone());
        }
        if recent {
            if self.recent.len() == MAX_RECENT_CALLS {
                self.recent.pop_back();
                crate::bounded::counter(TABLES[5]).fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            self.recent.push_front(v.clone());
        }
    }

    /// What the page shows now; `queues` are read by the caller (they are not the engine's).
    pub(crate) fn view(&self, now: Moment, queues: Vec<QueueFill>) -> StatusView {
        let mut incidents: Vec<IncidentView> = self
            .incidents
            .iter()
            .map(|(_, row)| IncidentView::of(row, self.incident_calls.get(&row.cause).map(|v| CallView::of(v))))
            .collect();
        // Grouped by server, then by layer (SPEC's order), newest evidence first within.
        incidents.sort_by(|a, b| {
            (a.server.as_deref(), layer_rank(a.first_failed_layer), std::cmp::Reverse(a.last_evidence_ns)).cmp(&(
                b.server.as_deref(),
                layer_rank(b.first_failed_layer),
                std::cmp::Reverse(b.last_evidence_ns),
            ))
        });
        let mut servers: Vec<ServerRates> = self
            .servers
            .iter()
            .map(|(s, r)| ServerRates {
                server: s.clone(),
                rates: *r,
                protocol_success_rate: Rates::rate(r.protocol_successes, r.attempts),
                verified_success_rate: Rates::rate(r.verified_successes, r.attempts),
            })
            .collect();
        servers.sort_by(|a, b| a.server.cmp(&b.server));
        let mut catalogs: Vec<CatalogView> = self.catalogs.iter().map(|(_, c)| c.clone()).collect();
        catalogs.sort_by(|a, b| {
            (a.convergence == "converged", &a.server, &a.session_hash).cmp(&(b.convergence == "converged", &b.server, &b.session_hash))
        });
        let mut drift: Vec<DriftView> = self.drift.iter().map(|(_, d)| d.clone()).collect();
        drift.sort_by(|a, b| (&a.server, &a.tool).cmp(&(&b.server, &b.tool)));
        StatusView {
            generated_at_ns: now.as_nanos(),
            incidents,
            resolved_incidents: self.resolved.iter().cloned().collect(),
            servers,
            catalogs,
            drift,
            queues,
            recent_calls: self.recent.iter().map(|v| CallView::of(v)).collect(),
            evicted: TABLES.iter().map(|t| (*t, crate::bounded::evicted(t))).collect(),
        }
    }
}

fn layer_rank(l: Option<&str>) -> usize {
    l.and_then(|l| Layer::ALL.iter().position(|x| x.as_str() == l)).unwrap_or(Layer::ALL.len())
}

/// Feeds the snapshot from the engine's records (serve only).
pub(crate) struct StatusSink(pub SharedStatus);

impl Sink for StatusSink {
    fn accept(&mut self, records: &[Decided], _now: Moment) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).accept(records);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::{sample, HealthState, Layers, SpanKind};

    fn failing(server: &str) -> Verdict {
        let mut layers = [LayerStatus::Passed; 5];
        layers[2] = LayerStatus::Failed;
        layers[3] = LayerStatus::Unobserved;
        layers[4] = LayerStatus::Unobserved;
        let mut v = Verdict {
            server: Some(Arc::from(server)),
            state: HealthState::NeedsAuth,
            first_failed_layer: Some(Layer::Authorization),
            layers: Layers(layers),
            reason: Some("insufficient_scope".into()),
            required_scope: Some("tickets:write".into()),
            next_action: "grant the scope".into(),
            ..sample("tools/call", false, false)
        };
        v.chain.add(SpanKind::Client, crate::evidence::Instrumentation::McpSdk);
        v
    }

    #[test]
    fn status_rates_count_attempts_once_and_revisions_move_successes() {
        let mut s = StatusSnapshot::default();
        let ok = Verdict { server: Some(Arc::from("a")), ..sample("tools/call", true, false) };
        s.accept(&[Decided::Call(Arc::new(ok.clone())), Decided::Call(Arc::new(failing("a")))]);
        let was = crate::verdict::Superseded {
            state: HealthState::Unverified,
            protocol_success: true,
            verified_success: false,
            unconfirmed: false,
        };
        let revised =
            Verdict { revision: 1, supersedes: Some(was), ..Verdict { server: Some(Arc::from("a")), ..sample("tools/call", true, true) } };
        s.accept(&[
            Decided::Call(Arc::new(revised)),
            Decided::Call(Arc::new(Verdict { server: Some(Arc::from("a")), ..sample("ping", true, false) })),
        ]);
        let v = s.view(Moment::from_nanos(1), vec![]);
        let a = &v.servers[0];
        assert_eq!(a.rates, Rates { attempts: 2, protocol_successes: 1, verified_successes: 1, unconfirmed: 0 });
        assert_eq!((a.protocol_success_rate, a.verified_success_rate), (Some(0.5), Some(0.5)));
        assert_eq!(v.recent_calls.len(), 4);
    }

    #[test]
    fn a_step_of_more_healthy_calls_than_are_kept_keeps_its_newest_as_one_at_a_time_did() {
        let healthy = |end_ns: u64| Verdict { end_ns, ..sample("tools/call", true, true) };
        let steps: Vec<Vec<u64>> = vec![(0..150).collect(), (150..700).collect(), (700..720).collect()];
        let (mut whole, mut one_by_one) = (StatusSnapshot::default(), StatusSnapshot::default());
        for step in &steps {
            whole.accept(&step.iter().map(|e| Decided::Call(Arc::new(healthy(*e)))).collect::<Vec<_>>());
            for e in step {
                one_by_one.accept(&[Decided::Call(Arc::new(healthy(*e)))]);
            }
        }
        let ends = |s: &StatusSnapshot| s.healthy.iter().map(|v| v.end_ns).collect::<Vec<_>>();
        assert_eq!(ends(&whole), ends(&one_by_one));
        assert_eq!(ends(&whole).len(), MAX_RESOLVING_CALLS);
        assert_eq!(ends(&whole)[0], 719, "newest first");
    }

    #[test]
    fn status_explains_a_call_its_layer_chain_and_what_was_missing() {
        let c = CallView::of(&failing("a"));
        assert_eq!(c.decided_layer, "authorization failed (insufficient_scope)");
        assert_eq!(c.chain, vec![ChainLink { kind: "client", instrumentation: "mcp_sdk", spans: 1 }]);
        assert!(c.missing.contains(&"no server span".to_string()), "{:?}", c.missing);
        assert!(!c.missing.iter().any(|m| m.starts_with("unobserved")), "layers after the failure are not missing: {:?}", c.missing);
        assert!(!c.missing.iter().any(|m| m.contains("verifier")), "a failed call needs no verifier: {:?}", c.missing);
        let unchecked = CallView::of(&sample("tools/call", true, false));
        assert!(unchecked.missing.iter().any(|m| m.starts_with("no verifier span")), "{:?}", unchecked.missing);
        let healthy = CallView::of(&Verdict { outcome_method: Some("receipt"), ..sample("tools/call", true, true) });
        assert_eq!(healthy.decided_layer, "outcome passed, verified by receipt");
    }

    /// A span's layer as the classifier reads it, table-driven over the facts a summary keeps.
    #[test]
    fn status_span_findings_name_the_layer_each_span_decided() {
        use crate::evidence::Instrumentation;
        let base = SpanSummary {
            kind: SpanKind::Client,
            by: Instrumentation::Semconv,
            method: Some("tools/call"),
            status_error: false,
            http_status: None,
            error: None,
            transport: None,
            outcome: None,
            request_sent_marker: false,
            start_ns: 0,
            end_ns: 5_000_000,
        };
        let table = [
            (SpanSummary { transport: Some(TransportOutcome::DnsFailure), ..base }, Some(Layer::Transport)),
            (SpanSummary { http_status: Some(503), status_error: true, ..base }, Some(Layer::Transport)),
            (SpanSummary { http_status: Some(401), ..base }, Some(Layer::Authorization)),
            (SpanSummary { error: Some(CallError::JsonRpc(-32601)), ..base }, Some(Layer::Protocol)),
            (SpanSummary { error: Some(CallError::JsonRpc(-32001)), ..base }, Some(Layer::Transport)),
            (SpanSummary { error: Some(CallError::ToolError), ..base }, Some(Layer::Execution)),
            (SpanSummary { kind: SpanKind::Verifier, outcome: Some(OutcomeResult::Missing), ..base }, Some(Layer::Outcome)),
            (base, None),
        ];
        for (s, layer) in table {
            assert_eq!(span_finding(&s).0, layer, "{s:?}");
        }
        let v = SpanView::of(&SpanSummary { error: Some(CallError::JsonRpc(-32601)), ..base });
        assert_eq!(
            (v.error_code, v.error, v.finding, v.duration_ns),
            (Some(-32601), Some("method not found"), "protocol failed", 5_000_000)
        );
    }

    #[test]
    fn status_drift_keeps_the_latest_report_per_server_and_tool_in_words() {
        let mut s = StatusSnapshot::default();
        let drift = |digest: &str, changes| {
            Decided::Drift(Box::new(crate::engine::DriftEvent {
                drift: true,
                server: "files:443".into(),
                tool: "write_file".into(),
                pinned_digest: "sha256:aaaa".into(),
                digest: digest.into(),
                changes,
                trace_id: [7; 16],
                span_id: [8; 8],
            }))
        };
        s.accept(&[
            drift("sha256:bbbb", vec![]),
            drift("sha256:cccc", vec![crate::verdict::ContractChange::ParameterRemoved { parameter: "path".into() }]),
        ]);
        let v = s.view(Moment::from_nanos(1), vec![]);
        assert_eq!(v.drift.len(), 1, "one report per (server, tool)");
        assert_eq!(v.drift[0].digest, "sha256:cccc");
        assert_eq!(v.drift[0].changes, vec!["parameter `path` removed".to_string()]);
    }

    #[test]
    fn status_tables_are_bounded_and_count_what_they_push_out() {
        let mut s = StatusSnapshot::default();
        let before = crate::bounded::evicted("status_recent_calls");
        let calls: Vec<Decided> = (0..MAX_RECENT_CALLS + 5).map(|_| Decided::Call(Arc::new(sample("tools/call", true, true)))).collect();
        s.accept(&calls);
        assert_eq!(s.recent.len(), MAX_RECENT_CALLS);
        assert!(crate::bounded::evicted("status_recent_calls") >= before + 5);
        let before = crate::bounded::evicted("status_servers");
        let calls: Vec<Decided> = (0..MAX_SERVERS + 3)
            .map(|i| Decided::Call(Arc::new(Verdict { server: Some(Arc::from(format!("s{i}"))), ..sample("tools/call", true, true) })))
            .collect();
        s.accept(&calls);
        assert_eq!(s.view(Moment::from_nanos(1), vec![]).servers.len(), MAX_SERVERS);
        assert!(crate::bounded::evicted("status_servers") >= before + 3);
    }

    #[test]
    fn status_incidents_come_from_the_engine_with_their_latest_call() {
        let cfg = crate::config::Config::load(None).unwrap();
        let mut engine = crate::engine::Engine::new(crate::cli::replay::engine_config(&cfg));
        let mut sink = crate::emit::sink::Collect::default();
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
        crate::service::replay::replay(&[format!("{dir}/nine_states.jsonl")], &mut engine, &mut sink, &mut Vec::new());
        let mut s = StatusSnapshot::default();
        s.accept(&sink.0);
        let v = s.view(Moment::from_nanos(1), vec![]);
        assert!(!v.incidents.is_empty());
        let open = v.incidents.iter().find(|i| i.state == "protocol_error").unwrap_or_else(|| panic!("{:#?}", v.incidents));
        assert_eq!(open.first_failed_layer, Some("protocol"));
        let ev = open.evidence.as_ref().expect("its latest call");
        assert_eq!((ev.state, ev.first_failed_layer), ("protocol_error", Some("protocol")));
        assert!(!ev.chain.is_empty(), "the chain names its spans");
        assert!(ev.chain.iter().all(|l| l.instrumentation == "semconv"), "{:?}", ev.chain);
        // The authorization failure was resolved by a later healthy call of its server: shown as
        // resolved, with the call that failed.
        let auth = v.resolved_incidents.iter().find(|i| i.state == "needs_auth").unwrap_or_else(|| panic!("{:#?}", v.resolved_incidents));
        assert_eq!(auth.evidence.as_ref().map(|e| e.state), Some("needs_auth"));
        assert_eq!(auth.owner, Owner::CredentialOwner);
        let by = auth.resolved_by.as_ref().unwrap_or_else(|| panic!("the resolving call: {auth:#?}"));
        assert_eq!(by.by, "healthy_call");
        let healthy = v.recent_calls.iter().find(|c| c.state == "healthy").expect("the healthy call");
        assert_eq!(by.trace_id.as_deref(), Some(healthy.trace_id.as_str()), "the healthy call of its server resolved it");
        // The spans of the chain, each with its side, instrumentation and the layer it decided.
        assert_eq!(open.owner, Owner::ClientImplementer);
        assert!(!ev.spans.is_empty(), "{ev:#?}");
        assert!(ev.spans.iter().all(|s| s.instrumentation == "semconv" && s.name == "tools/call"), "{:#?}", ev.spans);
        let failed = ev.spans.iter().find(|s| s.layer == Some("protocol")).unwrap_or_else(|| panic!("{:#?}", ev.spans));
        assert!(failed.error_code.is_some() && failed.error.is_some_and(|e| !e.contains("jsonrpc")), "{failed:#?}");
        assert_eq!(ev.reason_meaning, ev.reason.as_deref().and_then(reason_meaning));
        assert!(!v.catalogs.is_empty(), "the stale catalog session is shown");
    }
}
