//! Classify: pure functions from joined evidence to a [`Verdict`]. No I/O, no clocks, no state.

pub(crate) mod catalog;
pub(crate) mod contract;
/// Tool-contract digests are evidence about a tool (the normalizer computes them from the spans'
/// definitions); the rules here compare them. Named here too, where the rules' readers look.
pub use crate::evidence::digest;
pub(crate) mod drift;
pub(crate) mod incidents;
pub(crate) mod layers;
pub(crate) mod partial;
pub(crate) mod pinning;
pub(crate) mod progress;

pub use layers::SessionContext;

use crate::evidence::call::CallEvidence;
use crate::evidence::hash;
use crate::evidence::{Method, TransportOutcome};
use crate::verdict::{Confidence, DecidedBy, HealthState, Layer, LayerStatus, Verdict};

/// What the correlator knows about how the chain was decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    pub revision: u32,
    pub decided_by: DecidedBy,
    /// The trace's root span was seen (the trace is complete as far as anyone can tell).
    pub root_seen: bool,
    /// Evidence was dropped from the chain (span limit), so the picture is partial.
    pub truncated: bool,
}

/// Classify one call attempt.
pub fn classify_call(c: &CallEvidence, ctx: &SessionContext, d: Decision) -> Verdict {
    let findings = layers::evaluate_in(c, ctx);
    let masked = findings.masked();
    let state = contract::state(c, &findings, ctx);
    let first = masked.first_failed();
    let reason = if contract::reconciled_not_committed(c, &findings) {
        Some("reconciled_not_committed".to_string())
    } else {
        first.and_then(|l| findings.reason(l).map(str::to_string)).or_else(|| match state {
            HealthState::IncompatibleSession => layers::incompatibility(c),
            // A task that ended with no terminal status: why it is lost.
            HealthState::EffectUnknown if c.task_lost() => Some(c.clock_expired.unwrap_or("task_expired").to_string()),
            // A session setup that failed with an error no layer explains (the `mcp` SDK renders
            // any refused HTTP request as -32603): the transport or the authorization stopped it.
            _ if c.unexplained_error && setup_unanswered(c) => Some(TRANSPORT_OR_AUTHORIZATION_UNOBSERVED.into()),
            _ if c.unexplained_error => Some("unclassified_error".into()),
            // No span shows an answer (the `mcp` SDK's client span ends alike for an answered call
            // and for one whose connection died; traceloop leaves an unanswered one unset).
            HealthState::Unverified if unanswered(c) => Some(RESPONSE_UNOBSERVED.into()),
            // A verifier was meant to check the call and could not run: say so, never green.
            HealthState::Unverified if c.verifier_error() => Some("verifier_error".into()),
            // Someone sent a receipt no trusted key signed (it may be the server checking itself).
            HealthState::Unverified if c.untrusted_receipt() => Some("untrusted_receipt".into()),
            _ => None,
        })
    };
    let protocol_success = [Layer::Transport, Layer::Protocol, Layer::Authorization].iter().all(|l| masked.get(*l) == LayerStatus::Passed);
    // The unmasked outcome: a lost response reconciled by a confirmed receipt (effect_unknown →
    // healthy) has a failed transport layer, which masks the outcome, yet its outcome was verified.
    let verified_success = state == HealthState::Healthy && findings.get(Layer::Outcome) == LayerStatus::Passed;
    let effect_unknown = contract::effect_may_be_committed(c, &findings);
    let latest = c.latest_outcome();
    let mut v = Verdict {
        trace_id: c.trace_id,
        span_id: c.anchor_span_id,
        method: c.method.as_ref().map(|m| m.as_str().to_string()),
        tool: c.tool.clone(),
        server: c.server.clone(),
        request_id: c.request_id.clone(),
        // The hash of the session key, as catalog verdicts and the gate report it, so the two join.
        session_id_hash: c.session_id.as_ref().map(|s| hash::session_hash(s)),
        first_failed_layer: first,
        layers: masked,
        state,
        reason,
        confidence: confidence(c, state, d),
        next_action: contract::next_action(state, c, &findings),
        retry_safe: !(effect_unknown && latest.is_none()),
        protocol_success,
        verified_success,
        required_scope: if state == HealthState::NeedsAuth { c.required_scope.clone() } else { None },
        progress: (!c.progress.is_empty()).then(|| progress::check(c)),
        credential_hash: c.credential_hash.clone(),
        auth_flow_pending: state == HealthState::NeedsAuth && c.auth_flow_pending == Some(true),
        agent: c.service.clone(),
        contract_changes: if state == HealthState::ContractDrift { ctx.contract_drift.clone().unwrap_or_default() } else { Vec::new() },
        outcome_method: latest.map(|o| o.method.as_str()),
        outcome_trust: latest.map(|o| o.trust),
        revision: d.revision,
        supersedes: None,
        decided_by: d.decided_by,
        partial: None,
        start_ns: c.start_ns,
        end_ns: c.end_ns,
        protocol_revision: c.revision,
        protocol_version: c.protocol_version.clone().filter(|v| crate::evidence::is_dated_version(v)),
        attempt: is_attempt(c, first.is_some() || state.is_failure()),
        rounds: (c.rounds() > 1).then(|| c.rounds()),
        task_status: c.task.as_ref().map(|t| t.status),
        chain: c.chain,
        server_span_id: c.server_span,
    };
    if c.server_half_unjoined {
        // Its server evidence may exist and cannot be told from another call's: judged on what
        // it has, never green.
        partial::mark(&mut v, crate::verdict::Partial::AmbiguousServerHalf);
        if !v.state.is_failure() {
            // Why nothing failed is less telling than why its server evidence is missing.
            v.reason = Some(crate::verdict::Partial::AmbiguousServerHalf.reason().to_string());
        }
    }
    v
}

/// Whether a call is an attempt in the success rates (SPEC section 2): one logical `tools/call`
/// (its rounds are one call), or a session setup that failed or that no span shows answered (the
/// agent could not start its work, or nothing shows it could: without it an unreachable or
/// unauthorized server shows no failed attempt at all). A server half that could not be joined
/// to exactly one client half adds none of its own.
pub(crate) fn is_attempt(c: &CallEvidence, failed: bool) -> bool {
    if c.unjoined_half {
        return false;
    }
    match &c.method {
        Some(Method::ToolsCall) => true,
        Some(m) if m.is_setup() => failed || setup_unanswered(c),
        _ => false,
    }
}

/// The reason of an unverified call whose answer no span shows.
pub(crate) const RESPONSE_UNOBSERVED: &str = "response_unobserved";
/// The reason of a session setup that failed with an error no layer explains.
pub(crate) const TRANSPORT_OR_AUTHORIZATION_UNOBSERVED: &str = "transport_or_authorization_unobserved";

/// A request span was seen and nothing shows the request was answered: no response, no interim
/// round, no error from the other side, no failure of the transport.
fn unanswered(c: &CallEvidence) -> bool {
    c.request_spans > 0 && !c.response_seen && !c.interim_seen && c.progress.is_empty() && c.task.is_none() && c.http_status.is_none()
}

/// A session setup (`initialize`, `server/discover`) no span shows answered, or that failed with
/// an error no layer explains: a failed attempt whose layer is not observed (transport or
/// authorization), never a success.
fn setup_unanswered(c: &CallEvidence) -> bool {
    c.method.as_ref().is_some_and(Method::is_setup)
        && !layers::discover_fell_back(c)
        && unanswered(c)
        && c.auth_status.is_none()
        && c.auth_error.is_none()
}

/// High when both sides of the exchange, or an explicit evidence attribute, back the verdict;
/// lowered when the chain was cut short or a weak verifier (an LLM judge) decided the outcome.
pub(crate) fn confidence(c: &CallEvidence, state: HealthState, d: Decision) -> Confidence {
    // An error nobody classified only weakens a verdict that found no failure to explain it.
    let unexplained = c.unexplained_error && matches!(state, HealthState::Unverified | HealthState::Healthy);
    if d.decided_by.is_early() || d.truncated || unexplained {
        return Confidence::Low;
    }
    let latest = c.latest_outcome();
    let outcome_decides = matches!(state, HealthState::Healthy | HealthState::FalseSuccess);
    if outcome_decides && latest.is_some_and(|o| o.method.is_weak()) {
        return Confidence::Low;
    }
    let explicit = match state {
        HealthState::TransportFailed | HealthState::EffectUnknown => c.transport.is_some_and(|t| t != TransportOutcome::Ok),
        HealthState::NeedsAuth => c.auth_error.is_some() || c.auth_status.is_some(),
        HealthState::IncompatibleSession => c.negotiation.is_some(),
        HealthState::Healthy | HealthState::FalseSuccess => latest.is_some(),
        _ => false,
    };
    let mut level = if (c.client_seen && c.server_seen) || explicit { Confidence::High } else { Confidence::Medium };
    if !d.root_seen && d.decided_by == DecidedBy::MaxWait {
        level = level.min(Confidence::Medium);
    }
    level
}

#[cfg(test)]
mod tests;
