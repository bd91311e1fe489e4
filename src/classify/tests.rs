//! Table-driven tests for every rule of the classifier: the five layers (`layers.rs`), the state
//! precedence and routing (`contract.rs`) and the confidence function (`mod.rs`).
//!
//! Each row builds a `CallEvidence` directly (or folds `SpanEvidence`s with `absorb`) and states
//! the whole expected answer, so that breaking any single rule makes at least one row fail.

use std::sync::Arc;

use super::contract::{effect_may_be_committed, next_action, state};
use super::layers::{self, LayerFindings};
use super::*;
use crate::evidence::call::CallEvidence;
use crate::evidence::*;
use crate::verdict::{Confidence, DecidedBy, HealthState, Layer, LayerStatus, Layers};

use LayerStatus::{Failed as F, Passed as P, Unobserved as U};

// --- builders -------------------------------------------------------------------------------

const QUIET: Decision = Decision { revision: 0, decided_by: DecidedBy::Quiet, root_seen: true, truncated: false };
const NO_CTX: SessionContext =
    SessionContext { catalog_stale: None, working: false, waiting: false, contract_drift: None, tool_in_catalog: None };
const STALE: SessionContext =
    SessionContext { catalog_stale: Some(true), working: false, waiting: false, contract_drift: None, tool_in_catalog: None };
const DRIFT: SessionContext =
    SessionContext { catalog_stale: None, working: false, waiting: false, contract_drift: Some(vec![]), tool_in_catalog: None };
const UNKNOWN_TOOL: SessionContext =
    SessionContext { catalog_stale: Some(false), working: false, waiting: false, contract_drift: None, tool_in_catalog: Some(false) };
const WORKING: SessionContext =
    SessionContext { catalog_stale: None, working: true, waiting: false, contract_drift: None, tool_in_catalog: None };
const WAITING: SessionContext =
    SessionContext { catalog_stale: None, working: false, waiting: true, contract_drift: None, tool_in_catalog: None };

/// A call answered with an interim result (an `input_required` round, or a task handle).
fn interim() -> CallEvidence {
    CallEvidence { interim_seen: true, server_seen: true, span_count: 2, ..sent() }
}

fn task(status: crate::evidence::TaskStatus) -> CallEvidence {
    with(interim(), |c| {
        c.task = Some(crate::evidence::call::TaskEvidence {
            status,
            status_at_ns: 10,
            created_ns: Some(5),
            last_answer_ns: 10,
            poll_interval_ms: Some(300),
            ttl_ms: Some(60_000),
        });
        if status == crate::evidence::TaskStatus::Completed {
            c.response_seen = true;
        }
    })
}

/// A `tools/call` the client sent; nothing is known about what came back.
fn sent() -> CallEvidence {
    CallEvidence {
        trace_id: [0xab; 16],
        anchor_span_id: [0xcd; 8],
        method: Some(Method::ToolsCall),
        tool: Some(Arc::from("create_ticket")),
        request_id: Some("7".into()),
        server: Some(Arc::from("tickets.example.test:8443")),
        client_seen: true,
        span_count: 1,
        ..Default::default()
    }
}

/// A `tools/call` whose result came back without error, seen by client and server.
fn answered() -> CallEvidence {
    CallEvidence { response_seen: true, server_seen: true, span_count: 2, ..sent() }
}

fn with(mut c: CallEvidence, f: impl FnOnce(&mut CallEvidence)) -> CallEvidence {
    f(&mut c);
    c
}

fn receipt(result: OutcomeResult, method: VerifierMethod, at: u64) -> OutcomeReceipt {
    OutcomeReceipt { result, method, checked_at_ns: at, request_id: None, trust: Default::default() }
}

fn confirmed() -> OutcomeReceipt {
    receipt(OutcomeResult::Confirmed, VerifierMethod::Receipt, 100)
}

/// A transport timeout at a declared side-effect boundary, no response.
fn timed_out_at_side_effect() -> CallEvidence {
    with(sent(), |c| {
        c.transport = Some(TransportOutcome::Timeout);
        c.effect_boundary = Some(EffectBoundary::SideEffect);
    })
}

fn refused_version() -> Negotiation {
    Negotiation { requested_version: Some("2025-11-25".into()), version_accepted: Some(false), missing_capabilities: vec![] }
}

fn missing_capability() -> Negotiation {
    Negotiation { requested_version: None, version_accepted: Some(true), missing_capabilities: vec!["tools.listChanged".into()] }
}

fn classify(c: &CallEvidence) -> crate::verdict::Verdict {
    classify_call(c, &NO_CTX, QUIET)
}

/// SPEC: every layer after the first failed one is `unobserved`.
fn assert_masked_after_first_failure(name: &str, l: &Layers) {
    if let Some(first) = l.first_failed() {
        for later in Layer::ALL.iter().filter(|x| **x > first) {
            assert_eq!(l.get(*later), U, "{name}: layer {later:?} after first failed {first:?} must be unobserved");
        }
    }
}

// --- layers ---------------------------------------------------------------------------------

struct LayerCase {
    name: &'static str,
    ev: CallEvidence,
    layers: [LayerStatus; 5],
    first: Option<Layer>,
    reason: Option<&'static str>,
}

fn layer_cases() -> Vec<LayerCase> {
    use Layer::*;
    let row = |name, ev, layers, first, reason| LayerCase { name, ev, layers, first, reason };
    vec![
        // Nothing is passed on the absence of errors.
        row("a request span alone proves no layer", sent(), [U, U, U, U, U], None, None),
        row("a result without error passes the first four layers, not the outcome", answered(), [P, P, P, P, U], None, None),
        // Transport failures, each kind with its own reason.
        row(
            "transport dns_failure",
            with(sent(), |c| c.transport = Some(TransportOutcome::DnsFailure)),
            [F, U, U, U, U],
            Some(Transport),
            Some("dns_failure"),
        ),
        row(
            "transport connection_refused",
            with(sent(), |c| c.transport = Some(TransportOutcome::ConnectionRefused)),
            [F, U, U, U, U],
            Some(Transport),
            Some("connection_refused"),
        ),
        row(
            "transport connection_reset",
            with(sent(), |c| c.transport = Some(TransportOutcome::ConnectionReset)),
            [F, U, U, U, U],
            Some(Transport),
            Some("connection_reset"),
        ),
        row(
            "transport tls_failure",
            with(sent(), |c| c.transport = Some(TransportOutcome::TlsFailure)),
            [F, U, U, U, U],
            Some(Transport),
            Some("tls_failure"),
        ),
        row(
            "transport timeout",
            with(sent(), |c| c.transport = Some(TransportOutcome::Timeout)),
            [F, U, U, U, U],
            Some(Transport),
            Some("timeout"),
        ),
        row(
            "connection failure named only by the exception class",
            with(sent(), |c| c.connection_error = Some(TransportOutcome::ConnectionRefused)),
            [F, U, U, U, U],
            Some(Transport),
            Some("connection_refused"),
        ),
        row(
            "the transport attribute names the failure before the exception class",
            with(sent(), |c| {
                c.transport = Some(TransportOutcome::DnsFailure);
                c.connection_error = Some(TransportOutcome::ConnectionRefused);
            }),
            [F, U, U, U, U],
            Some(Transport),
            Some("dns_failure"),
        ),
        row(
            "timeout exception with no response is a transport timeout",
            with(sent(), |c| c.timeout_error = true),
            [F, U, U, U, U],
            Some(Transport),
            Some("timeout"),
        ),
        row(
            "timeout exception after a response is not a transport failure",
            with(answered(), |c| c.timeout_error = true),
            [P, P, P, P, U],
            None,
            None,
        ),
        row("http 503 fails transport", with(sent(), |c| c.http_status = Some(503)), [F, U, U, U, U], Some(Transport), Some("http_503")),
        row("http 500 fails transport", with(sent(), |c| c.http_status = Some(500)), [F, U, U, U, U], Some(Transport), Some("http_500")),
        row(
            "http 503 fails transport even after a response",
            with(answered(), |c| c.http_status = Some(503)),
            [F, U, U, U, U],
            Some(Transport),
            Some("http_503"),
        ),
        // Transport passes on positive evidence only, and nothing else follows from it.
        row(
            "an explicit transport ok passes transport only",
            with(sent(), |c| c.transport = Some(TransportOutcome::Ok)),
            [P, U, U, U, U],
            None,
            None,
        ),
        row("an http 200 passes transport only", with(sent(), |c| c.http_status = Some(200)), [P, U, U, U, U], None, None),
        row(
            "an http 404 passes transport and proves nothing more",
            with(sent(), |c| c.http_status = Some(404)),
            [P, U, U, U, U],
            None,
            None,
        ),
        // Protocol.
        row(
            "a JSON-RPC error is a response: transport passed, protocol failed",
            with(sent(), |c| c.jsonrpc_error = Some(-32601)),
            [P, F, U, U, U],
            Some(Protocol),
            Some("jsonrpc_-32601"),
        ),
        row(
            "jsonrpc -32700 parse error",
            with(answered(), |c| c.jsonrpc_error = Some(-32700)),
            [P, F, U, U, U],
            Some(Protocol),
            Some("jsonrpc_-32700"),
        ),
        row(
            "jsonrpc -32600 invalid request",
            with(answered(), |c| c.jsonrpc_error = Some(-32600)),
            [P, F, U, U, U],
            Some(Protocol),
            Some("jsonrpc_-32600"),
        ),
        row(
            "jsonrpc -32602 invalid params",
            with(answered(), |c| c.jsonrpc_error = Some(-32602)),
            [P, F, U, U, U],
            Some(Protocol),
            Some("jsonrpc_-32602"),
        ),
        row("http 400 fails protocol", with(sent(), |c| c.http_status = Some(400)), [P, F, U, U, U], Some(Protocol), Some("http_400")),
        row(
            "a refused protocol version fails protocol",
            with(answered(), |c| {
                c.method = Some(Method::Initialize);
                c.negotiation = Some(refused_version());
            }),
            [P, F, U, U, U],
            Some(Protocol),
            Some("unsupported_protocol_version"),
        ),
        row(
            "a capability the run needs was not negotiated",
            with(answered(), |c| c.negotiation = Some(missing_capability())),
            [P, F, U, U, U],
            Some(Protocol),
            Some("missing_capability"),
        ),
        row(
            "a refused version is named before a missing capability",
            with(answered(), |c| c.negotiation = Some(Negotiation { missing_capabilities: vec!["sampling".into()], ..refused_version() })),
            [P, F, U, U, U],
            Some(Protocol),
            Some("unsupported_protocol_version"),
        ),
        row(
            "initialize answered with a JSON-RPC error",
            with(sent(), |c| {
                c.method = Some(Method::Initialize);
                c.jsonrpc_error = Some(-32602);
            }),
            [P, F, U, U, U],
            Some(Protocol),
            Some("initialize_failed_jsonrpc_-32602"),
        ),
        row(
            "a negotiation failure is named before the JSON-RPC code",
            with(answered(), |c| {
                c.negotiation = Some(refused_version());
                c.jsonrpc_error = Some(-32602);
            }),
            [P, F, U, U, U],
            Some(Protocol),
            Some("unsupported_protocol_version"),
        ),
        row(
            "an accepted negotiation with nothing missing is no failure",
            with(answered(), |c| c.negotiation = Some(Negotiation { version_accepted: Some(true), ..Default::default() })),
            [P, P, P, P, U],
            None,
            None,
        ),
        // Authorization.
        row("auth challenge 401", with(sent(), |c| c.auth_status = Some(401)), [P, U, F, U, U], Some(Authorization), Some("invalid_token")),
        row(
            "auth challenge 403",
            with(sent(), |c| c.auth_status = Some(403)),
            [P, U, F, U, U],
            Some(Authorization),
            Some("insufficient_scope"),
        ),
        row("plain http 401", with(sent(), |c| c.http_status = Some(401)), [P, U, F, U, U], Some(Authorization), Some("invalid_token")),
        row(
            "plain http 403",
            with(sent(), |c| c.http_status = Some(403)),
            [P, U, F, U, U],
            Some(Authorization),
            Some("insufficient_scope"),
        ),
        row(
            "a missing token with no status",
            with(sent(), |c| c.auth_error = Some(AuthError::MissingToken)),
            [P, U, F, U, U],
            Some(Authorization),
            Some("missing_token"),
        ),
        row(
            "the challenge's error is named before the status",
            with(sent(), |c| {
                c.auth_error = Some(AuthError::InvalidRequest);
                c.auth_status = Some(403);
            }),
            [P, U, F, U, U],
            Some(Authorization),
            Some("invalid_request"),
        ),
        row(
            "the auth status is read before the http status",
            with(sent(), |c| {
                c.auth_status = Some(403);
                c.http_status = Some(401);
            }),
            [P, U, F, U, U],
            Some(Authorization),
            Some("insufficient_scope"),
        ),
        row(
            "an unexpected challenge status is still unauthorized",
            with(sent(), |c| c.auth_status = Some(407)),
            [P, U, F, U, U],
            Some(Authorization),
            Some("unauthorized"),
        ),
        row(
            "auth failure rendered by the client as -32603: protocol was never reached",
            with(sent(), |c| {
                c.jsonrpc_error = Some(-32603);
                c.response_seen = true;
                c.http_status = Some(401);
                c.auth_error = Some(AuthError::InvalidToken);
            }),
            [P, U, F, U, U],
            Some(Authorization),
            Some("invalid_token"),
        ),
        row(
            "auth failure outranks a negotiation failure at the protocol layer",
            with(answered(), |c| {
                c.negotiation = Some(refused_version());
                c.auth_status = Some(401);
            }),
            [P, U, F, U, U],
            Some(Authorization),
            Some("invalid_token"),
        ),
        row(
            "auth failure masks a tool error and a confirmed outcome",
            with(answered(), |c| {
                c.auth_status = Some(403);
                c.tool_error = true;
                c.outcomes.push(confirmed());
            }),
            [P, U, F, U, U],
            Some(Authorization),
            Some("insufficient_scope"),
        ),
        // Execution.
        row("isError: true", with(answered(), |c| c.tool_error = true), [P, P, P, F, U], Some(Execution), Some("tool_error")),
        row("tool timeout", with(answered(), |c| c.exec_timeout = true), [P, P, P, F, U], Some(Execution), Some("tool_timeout")),
        row(
            "structured output violates outputSchema",
            with(answered(), |c| c.output_schema_violated = Some(true)),
            [P, P, P, F, U],
            Some(Execution),
            Some("output_schema_violated"),
        ),
        row(
            "a tool error is named before a tool timeout",
            with(answered(), |c| {
                c.tool_error = true;
                c.exec_timeout = true;
                c.output_schema_violated = Some(true);
            }),
            [P, P, P, F, U],
            Some(Execution),
            Some("tool_error"),
        ),
        row(
            "a tool timeout is named before a schema violation",
            with(answered(), |c| {
                c.exec_timeout = true;
                c.output_schema_violated = Some(true);
            }),
            [P, P, P, F, U],
            Some(Execution),
            Some("tool_timeout"),
        ),
        row(
            "valid structured output passes execution",
            with(answered(), |c| c.output_schema_violated = Some(false)),
            [P, P, P, P, U],
            None,
            None,
        ),
        // Outcome.
        row("verifier confirmed", with(answered(), |c| c.outcomes.push(confirmed())), [P, P, P, P, P], None, None),
        row(
            "verifier found the artifact missing",
            with(answered(), |c| c.outcomes.push(receipt(OutcomeResult::Missing, VerifierMethod::RowVersion, 1))),
            [P, P, P, P, F],
            Some(Outcome),
            Some("outcome_missing"),
        ),
        row(
            "verifier found the deliverable failed",
            with(answered(), |c| c.outcomes.push(receipt(OutcomeResult::Failed, VerifierMethod::TestResult, 1))),
            [P, P, P, P, F],
            Some(Outcome),
            Some("outcome_failed"),
        ),
        row(
            "verifier found the destination stale",
            with(answered(), |c| c.outcomes.push(receipt(OutcomeResult::Stale, VerifierMethod::FileDigest, 1))),
            [P, P, P, P, F],
            Some(Outcome),
            Some("outcome_stale"),
        ),
        row(
            "the latest check decides: confirmed, then missing",
            with(answered(), |c| {
                c.outcomes.push(receipt(OutcomeResult::Confirmed, VerifierMethod::Receipt, 10));
                c.outcomes.push(receipt(OutcomeResult::Missing, VerifierMethod::Receipt, 20));
            }),
            [P, P, P, P, F],
            Some(Outcome),
            Some("outcome_missing"),
        ),
        row(
            "the latest check decides: missing, then confirmed (listed out of order)",
            with(answered(), |c| {
                c.outcomes.push(receipt(OutcomeResult::Confirmed, VerifierMethod::Receipt, 20));
                c.outcomes.push(receipt(OutcomeResult::Missing, VerifierMethod::Receipt, 10));
            }),
            [P, P, P, P, P],
            None,
            None,
        ),
        row(
            "a confirmed outcome does not pass the unobserved earlier layers",
            with(sent(), |c| c.outcomes.push(confirmed())),
            [U, U, U, U, P],
            None,
            None,
        ),
        // Masking: one early break is one failure, not five.
        row(
            "a transport failure masks a tool error and a failed outcome",
            with(sent(), |c| {
                c.transport = Some(TransportOutcome::ConnectionRefused);
                c.tool_error = true;
                c.outcomes.push(receipt(OutcomeResult::Missing, VerifierMethod::Receipt, 1));
            }),
            [F, U, U, U, U],
            Some(Transport),
            Some("connection_refused"),
        ),
        row(
            "a protocol failure masks a confirmed outcome",
            with(answered(), |c| {
                c.jsonrpc_error = Some(-32601);
                c.outcomes.push(confirmed());
            }),
            [P, F, U, U, U],
            Some(Protocol),
            Some("jsonrpc_-32601"),
        ),
        row(
            "an execution failure masks a confirmed outcome",
            with(answered(), |c| {
                c.tool_error = true;
                c.outcomes.push(confirmed());
            }),
            [P, P, P, F, U],
            Some(Execution),
            Some("tool_error"),
        ),
    ]
}

#[test]
fn layer_table_first_failed_layer_masking_and_reason() {
    for case in layer_cases() {
        let findings = layers::evaluate(&case.ev);
        let masked = findings.masked();
        assert_eq!(masked, Layers(case.layers), "{}: layers", case.name);
        assert_eq!(masked.first_failed(), case.first, "{}: first failed layer", case.name);
        assert_eq!(case.first.and_then(|l| findings.reason(l)), case.reason, "{}: reason", case.name);
        assert_masked_after_first_failure(case.name, &masked);
        // The verdict reports exactly what the layer evaluation found.
        let v = classify(&case.ev);
        assert_eq!(v.layers, masked, "{}: verdict layers", case.name);
        assert_eq!(v.first_failed_layer, case.first, "{}: verdict first failed layer", case.name);
        assert_eq!(v.reason.as_deref(), case.reason, "{}: verdict reason", case.name);
    }
}

#[test]
fn masking_keeps_everything_up_to_the_first_failure_for_all_243_combinations() {
    let all = [P, F, U];
    for n in 0..243usize {
        let mut status = [U; 5];
        let mut k = n;
        for s in status.iter_mut() {
            *s = all[k % 3];
            k /= 3;
        }
        let findings = LayerFindings { status, reasons: Default::default() };
        let masked = findings.masked();
        let first = status.iter().position(|s| *s == F);
        for i in 0..5 {
            let want = match first {
                Some(f) if i > f => U,
                _ => status[i],
            };
            assert_eq!(masked.0[i], want, "{status:?} at {i}");
        }
        assert_eq!(masked.first_failed().map(|l| l as usize), first, "{status:?}");
    }
}

#[test]
fn failed_layers_before_masking_are_still_evaluated_independently() {
    // The unmasked findings keep what each layer said; only the verdict masks.
    let c = with(sent(), |c| {
        c.transport = Some(TransportOutcome::ConnectionRefused);
        c.tool_error = true;
        c.outcomes.push(receipt(OutcomeResult::Missing, VerifierMethod::Receipt, 1));
    });
    let f = layers::evaluate(&c);
    assert_eq!(f.get(Layer::Transport), F);
    assert_eq!(f.get(Layer::Execution), F);
    assert_eq!(f.get(Layer::Outcome), F);
    assert_eq!(f.reason(Layer::Execution), Some("tool_error"));
    assert_eq!(f.masked().0, [F, U, U, U, U]);
}

#[test]
fn a_json_rpc_error_response_is_no_tool_result_even_before_masking() {
    // The response came back, but as a JSON-RPC error: the tool never produced a result, so
    // execution is unobserved, not passed, whether or not a later stage masks it.
    for c in [
        with(answered(), |c| c.jsonrpc_error = Some(-32601)),
        with(answered(), |c| {
            c.jsonrpc_error = Some(-32603);
            c.auth_status = Some(401);
        }),
    ] {
        let f = layers::evaluate(&c);
        assert_eq!(f.get(Layer::Execution), U, "{c:?}");
        assert_eq!(f.get(Layer::Authorization), if c.auth_status.is_some() { F } else { P });
    }
}

// --- state precedence -----------------------------------------------------------------------

struct StateCase {
    name: &'static str,
    ev: CallEvidence,
    ctx: SessionContext,
    state: HealthState,
    retry_safe: bool,
    protocol_success: bool,
    verified_success: bool,
}

fn state_cases() -> Vec<StateCase> {
    use HealthState::*;
    let row = |name, ev, ctx, state, retry_safe, protocol_success, verified_success| StateCase {
        name,
        ev,
        ctx,
        state,
        retry_safe,
        protocol_success,
        verified_success,
    };
    let side_effect = |c: CallEvidence| with(c, |c| c.effect_boundary = Some(EffectBoundary::SideEffect));
    vec![
        // needs_auth, and what it outranks.
        row(
            "401 invalid_token",
            with(sent(), |c| {
                c.http_status = Some(401);
                c.auth_error = Some(AuthError::InvalidToken);
            }),
            NO_CTX,
            NeedsAuth,
            true,
            false,
            false,
        ),
        row(
            "403 insufficient_scope",
            with(sent(), |c| {
                c.http_status = Some(403);
                c.auth_error = Some(AuthError::InsufficientScope);
                c.required_scope = Some("tickets:write".into());
            }),
            NO_CTX,
            NeedsAuth,
            true,
            false,
            false,
        ),
        row(
            "missing token without any status",
            with(sent(), |c| c.auth_error = Some(AuthError::MissingToken)),
            NO_CTX,
            NeedsAuth,
            true,
            false,
            false,
        ),
        row(
            "auth failure + JSON-RPC -32603 is needs_auth, not protocol_error",
            with(sent(), |c| {
                c.jsonrpc_error = Some(-32603);
                c.response_seen = true;
                c.auth_status = Some(401);
            }),
            NO_CTX,
            NeedsAuth,
            true,
            false,
            false,
        ),
        row(
            "auth failure outranks an incompatible session",
            with(answered(), |c| {
                c.negotiation = Some(refused_version());
                c.auth_status = Some(401);
            }),
            NO_CTX,
            NeedsAuth,
            true,
            false,
            false,
        ),
        row("auth failure outranks a stale catalog", with(sent(), |c| c.auth_status = Some(403)), STALE, NeedsAuth, true, false, false),
        row("auth failure outranks working", with(sent(), |c| c.auth_status = Some(403)), WORKING, NeedsAuth, true, false, false),
        row(
            "an undiscoverable authorization server is needs_auth, never a transport outage",
            with(sent(), |c| {
                c.auth_error = Some(AuthError::MissingToken);
                c.transport = Some(TransportOutcome::DnsFailure);
            }),
            NO_CTX,
            NeedsAuth,
            true,
            false,
            false,
        ),
        row(
            "auth failure outranks a tool error",
            with(answered(), |c| {
                c.auth_status = Some(403);
                c.tool_error = true;
            }),
            NO_CTX,
            NeedsAuth,
            true,
            false,
            false,
        ),
        // transport_failed: failures that cannot have committed anything.
        row(
            "connection refused at a side-effect boundary is transport_failed",
            side_effect(with(sent(), |c| c.transport = Some(TransportOutcome::ConnectionRefused))),
            NO_CTX,
            TransportFailed,
            true,
            false,
            false,
        ),
        row(
            "connection refused from the exception class",
            side_effect(with(sent(), |c| c.connection_error = Some(TransportOutcome::ConnectionRefused))),
            NO_CTX,
            TransportFailed,
            true,
            false,
            false,
        ),
        row(
            "dns failure",
            side_effect(with(sent(), |c| c.transport = Some(TransportOutcome::DnsFailure))),
            NO_CTX,
            TransportFailed,
            true,
            false,
            false,
        ),
        row(
            "tls failure",
            side_effect(with(sent(), |c| c.transport = Some(TransportOutcome::TlsFailure))),
            NO_CTX,
            TransportFailed,
            true,
            false,
            false,
        ),
        row(
            "http 503 at a side-effect boundary",
            side_effect(with(sent(), |c| c.http_status = Some(503))),
            NO_CTX,
            TransportFailed,
            true,
            false,
            false,
        ),
        row(
            "timeout at a boundary declared free of side effects",
            with(sent(), |c| {
                c.transport = Some(TransportOutcome::Timeout);
                c.effect_boundary = Some(EffectBoundary::None);
            }),
            NO_CTX,
            TransportFailed,
            true,
            false,
            false,
        ),
        row(
            "timeout at a side-effect boundary with the request known unsent",
            with(timed_out_at_side_effect(), |c| c.request_sent = Some(false)),
            NO_CTX,
            TransportFailed,
            true,
            false,
            false,
        ),
        row(
            "timeout of a tools/list commits nothing",
            with(timed_out_at_side_effect(), |c| c.method = Some(Method::ToolsList)),
            NO_CTX,
            TransportFailed,
            true,
            false,
            false,
        ),
        row(
            "timeout of an initialize commits nothing",
            with(timed_out_at_side_effect(), |c| c.method = Some(Method::Initialize)),
            NO_CTX,
            TransportFailed,
            true,
            false,
            false,
        ),
        row(
            "transport failure outranks a stale catalog",
            with(sent(), |c| c.transport = Some(TransportOutcome::ConnectionRefused)),
            STALE,
            TransportFailed,
            true,
            false,
            false,
        ),
        row(
            "transport failure outranks an incompatible session",
            with(sent(), |c| {
                c.transport = Some(TransportOutcome::ConnectionRefused);
                c.negotiation = Some(refused_version());
            }),
            NO_CTX,
            TransportFailed,
            true,
            false,
            false,
        ),
        // effect_unknown: the response was lost where a side effect may have committed.
        row("timeout at a side-effect boundary", timed_out_at_side_effect(), NO_CTX, EffectUnknown, false, false, false),
        row(
            "timeout with the request known sent",
            with(timed_out_at_side_effect(), |c| c.request_sent = Some(true)),
            NO_CTX,
            EffectUnknown,
            false,
            false,
            false,
        ),
        row(
            "timeout with an undeclared boundary counts as a possible side effect",
            with(sent(), |c| c.transport = Some(TransportOutcome::Timeout)),
            NO_CTX,
            EffectUnknown,
            false,
            false,
            false,
        ),
        row(
            "connection reset at a side-effect boundary",
            side_effect(with(sent(), |c| c.transport = Some(TransportOutcome::ConnectionReset))),
            NO_CTX,
            EffectUnknown,
            false,
            false,
            false,
        ),
        row(
            "connection reset from the exception class",
            side_effect(with(sent(), |c| c.connection_error = Some(TransportOutcome::ConnectionReset))),
            NO_CTX,
            EffectUnknown,
            false,
            false,
            false,
        ),
        row(
            "timeout exception class with no response",
            side_effect(with(sent(), |c| c.timeout_error = true)),
            NO_CTX,
            EffectUnknown,
            false,
            false,
            false,
        ),
        row(
            "effect_unknown + a later failed receipt is false_success",
            with(timed_out_at_side_effect(), |c| {
                c.outcomes.push(receipt(OutcomeResult::Failed, VerifierMethod::RowVersion, 50));
            }),
            NO_CTX,
            FalseSuccess,
            true,
            false,
            false,
        ),
        row(
            "effect_unknown + a later missing receipt: proven not committed, a transport failure safe to retry",
            with(timed_out_at_side_effect(), |c| {
                c.outcomes.push(receipt(OutcomeResult::Missing, VerifierMethod::RowVersion, 50));
            }),
            NO_CTX,
            TransportFailed,
            true,
            false,
            false,
        ),
        row(
            "effect_unknown + a confirmed receipt is healthy",
            with(timed_out_at_side_effect(), |c| c.outcomes.push(confirmed())),
            NO_CTX,
            Healthy,
            true,
            false,
            true,
        ),
        // incompatible_session.
        row(
            "initialize: the client refused the negotiated version",
            with(answered(), |c| {
                c.method = Some(Method::Initialize);
                c.negotiation = Some(refused_version());
            }),
            NO_CTX,
            IncompatibleSession,
            true,
            false,
            false,
        ),
        row(
            "initialize answered with a JSON-RPC error",
            with(sent(), |c| {
                c.method = Some(Method::Initialize);
                c.jsonrpc_error = Some(-32602);
            }),
            NO_CTX,
            IncompatibleSession,
            true,
            false,
            false,
        ),
        row(
            "a tools/call in a session missing a needed capability",
            with(answered(), |c| c.negotiation = Some(missing_capability())),
            NO_CTX,
            IncompatibleSession,
            true,
            false,
            false,
        ),
        row(
            "incompatible session outranks a stale catalog",
            with(answered(), |c| c.negotiation = Some(refused_version())),
            STALE,
            IncompatibleSession,
            true,
            false,
            false,
        ),
        row(
            "incompatible session outranks a JSON-RPC error",
            with(answered(), |c| {
                c.negotiation = Some(missing_capability());
                c.jsonrpc_error = Some(-32601);
            }),
            NO_CTX,
            IncompatibleSession,
            true,
            false,
            false,
        ),
        // stale_catalog (only from the session context today).
        row(
            "stale catalog on an otherwise confirmed call",
            with(answered(), |c| c.outcomes.push(confirmed())),
            STALE,
            StaleCatalog,
            true,
            true,
            false,
        ),
        row(
            "stale catalog outranks a protocol error",
            with(answered(), |c| c.jsonrpc_error = Some(-32601)),
            STALE,
            StaleCatalog,
            true,
            false,
            false,
        ),
        row(
            "stale catalog outranks working",
            answered(),
            SessionContext { catalog_stale: Some(true), working: true, waiting: false, contract_drift: None, tool_in_catalog: None },
            StaleCatalog,
            true,
            true,
            false,
        ),
        row("a definition that differs from its pin is contract drift", answered(), DRIFT, ContractDrift, true, true, false),
        row(
            "contract drift outranks a stale catalog",
            answered(),
            SessionContext {
                catalog_stale: Some(true),
                working: false,
                waiting: false,
                contract_drift: Some(vec![]),
                tool_in_catalog: None,
            },
            ContractDrift,
            true,
            true,
            false,
        ),
        row(
            "an incompatible session outranks contract drift",
            with(answered(), |c| c.negotiation = Some(refused_version())),
            DRIFT,
            IncompatibleSession,
            true,
            false,
            false,
        ),
        row("authorization outranks contract drift", with(sent(), |c| c.http_status = Some(401)), DRIFT, NeedsAuth, true, false, false),
        row(
            "a catalog known fresh is not stale",
            with(answered(), |c| c.outcomes.push(confirmed())),
            SessionContext { catalog_stale: Some(false), working: false, waiting: false, contract_drift: None, tool_in_catalog: None },
            Healthy,
            true,
            true,
            true,
        ),
        // protocol_error.
        row("-32601 method not found", with(answered(), |c| c.jsonrpc_error = Some(-32601)), NO_CTX, ProtocolError, true, false, false),
        row("-32602 invalid params", with(answered(), |c| c.jsonrpc_error = Some(-32602)), NO_CTX, ProtocolError, true, false, false),
        row("http 400", with(sent(), |c| c.http_status = Some(400)), NO_CTX, ProtocolError, true, false, false),
        // Issue 8 defect 8: an unknown tool, by the session's converged catalog, whatever the
        // server answered (the TypeScript SDK's and server-everything's `isError` result).
        row(
            "a tool absent from the converged catalog answered as isError is an unknown tool",
            with(answered(), |c| c.tool_error = true),
            UNKNOWN_TOOL,
            ProtocolError,
            true,
            false,
            false,
        ),
        row(
            "a tool absent from the converged catalog, answered without error",
            answered(),
            UNKNOWN_TOOL,
            ProtocolError,
            true,
            false,
            false,
        ),
        row(
            "a tool in the converged catalog answered as isError stays tool_failed",
            with(answered(), |c| c.tool_error = true),
            SessionContext { tool_in_catalog: Some(true), ..NO_CTX },
            ToolFailed,
            true,
            true,
            false,
        ),
        row(
            "no converged catalog: the unknown-tool rule does not apply",
            with(answered(), |c| c.tool_error = true),
            NO_CTX,
            ToolFailed,
            true,
            true,
            false,
        ),
        row(
            "authorization outranks an unknown tool",
            with(sent(), |c| c.http_status = Some(401)),
            UNKNOWN_TOOL,
            NeedsAuth,
            true,
            false,
            false,
        ),
        row(
            "a stale catalog outranks an unknown tool",
            with(answered(), |c| c.tool_error = true),
            SessionContext { catalog_stale: Some(true), tool_in_catalog: Some(false), ..NO_CTX },
            StaleCatalog,
            true,
            false,
            false,
        ),
        row(
            "protocol error outranks working",
            with(answered(), |c| c.jsonrpc_error = Some(-32602)),
            WORKING,
            ProtocolError,
            true,
            false,
            false,
        ),
        row(
            "protocol error outranks a failed outcome",
            with(answered(), |c| {
                c.jsonrpc_error = Some(-32602);
                c.outcomes.push(receipt(OutcomeResult::Missing, VerifierMethod::Receipt, 1));
            }),
            NO_CTX,
            ProtocolError,
            true,
            false,
            false,
        ),
        // working (only from the session context today).
        row("a call in flight with valid progress", sent(), WORKING, Working, true, false, false),
        row("working outranks tool_failed (SPEC order)", with(answered(), |c| c.tool_error = true), WORKING, Working, true, true, false),
        // waiting (from the session context: the engine's clocks say the wait holds).
        row("an input_required round within its clocks", interim(), WAITING, Waiting, true, true, false),
        row(
            "waiting outranks a missing outcome: nothing is done yet",
            with(interim(), |c| c.outcomes.push(receipt(OutcomeResult::Missing, VerifierMethod::Receipt, 1))),
            WAITING,
            Waiting,
            true,
            true,
            false,
        ),
        // 2026-07-28 refusals of any request.
        row(
            "-32022 unsupported protocol version",
            with(answered(), |c| c.jsonrpc_error = Some(-32022)),
            NO_CTX,
            IncompatibleSession,
            true,
            false,
            false,
        ),
        row(
            "-32021 missing required client capability",
            with(answered(), |c| c.jsonrpc_error = Some(-32021)),
            NO_CTX,
            IncompatibleSession,
            true,
            false,
            false,
        ),
        row(
            "-32020 header mismatch is the client's protocol error",
            with(answered(), |c| c.jsonrpc_error = Some(-32020)),
            NO_CTX,
            ProtocolError,
            true,
            false,
            false,
        ),
        // Tasks.
        row(
            "a completed task gives the call's result",
            task(crate::evidence::TaskStatus::Completed),
            NO_CTX,
            Unverified,
            true,
            true,
            false,
        ),
        row(
            "a completed task whose result is isError",
            with(task(crate::evidence::TaskStatus::Completed), |c| c.tool_error = true),
            NO_CTX,
            ToolFailed,
            true,
            true,
            false,
        ),
        row("a failed task", task(crate::evidence::TaskStatus::Failed), NO_CTX, ToolFailed, true, true, false),
        row("a cancelled task", task(crate::evidence::TaskStatus::Cancelled), NO_CTX, ToolFailed, true, true, false),
        row(
            "a task the server forgot, side effect possible",
            task(crate::evidence::TaskStatus::Gone),
            NO_CTX,
            EffectUnknown,
            false,
            true,
            false,
        ),
        row(
            "a task the server forgot, no side effect",
            with(task(crate::evidence::TaskStatus::Gone), |c| c.effect_boundary = Some(EffectBoundary::None)),
            NO_CTX,
            ToolFailed,
            true,
            true,
            false,
        ),
        row(
            "a task past its TTL with no terminal status, then a receipt that finds nothing",
            with(task(crate::evidence::TaskStatus::Working), |c| {
                c.clock_expired = Some("task_ttl_exceeded");
                c.outcomes.push(receipt(OutcomeResult::Missing, VerifierMethod::Receipt, 100));
            }),
            NO_CTX,
            FalseSuccess,
            true,
            true,
            false,
        ),
        row(
            "a silent task past its inactivity window",
            with(task(crate::evidence::TaskStatus::Working), |c| c.clock_expired = Some("task_inactivity_exceeded")),
            NO_CTX,
            ToolFailed,
            true,
            true,
            false,
        ),
        // tool_failed.
        row("isError: true", with(answered(), |c| c.tool_error = true), NO_CTX, ToolFailed, true, true, false),
        row("tool timeout", with(answered(), |c| c.exec_timeout = true), NO_CTX, ToolFailed, true, true, false),
        row("output schema violated", with(answered(), |c| c.output_schema_violated = Some(true)), NO_CTX, ToolFailed, true, true, false),
        row(
            "tool_failed outranks false_success",
            with(answered(), |c| {
                c.tool_error = true;
                c.outcomes.push(receipt(OutcomeResult::Missing, VerifierMethod::Receipt, 1));
            }),
            NO_CTX,
            ToolFailed,
            true,
            true,
            false,
        ),
        row(
            "tool_failed outranks a confirmed outcome",
            with(answered(), |c| {
                c.tool_error = true;
                c.outcomes.push(confirmed());
            }),
            NO_CTX,
            ToolFailed,
            true,
            true,
            false,
        ),
        // false_success.
        row(
            "success but the artifact is missing",
            with(answered(), |c| c.outcomes.push(receipt(OutcomeResult::Missing, VerifierMethod::RowVersion, 1))),
            NO_CTX,
            FalseSuccess,
            true,
            true,
            false,
        ),
        row(
            "success but the destination is stale",
            with(answered(), |c| c.outcomes.push(receipt(OutcomeResult::Stale, VerifierMethod::FileDigest, 1))),
            NO_CTX,
            FalseSuccess,
            true,
            true,
            false,
        ),
        row(
            "a later failed check overrides an earlier confirmation",
            with(answered(), |c| {
                c.outcomes.push(receipt(OutcomeResult::Confirmed, VerifierMethod::Receipt, 1));
                c.outcomes.push(receipt(OutcomeResult::Failed, VerifierMethod::TestResult, 2));
            }),
            NO_CTX,
            FalseSuccess,
            true,
            true,
            false,
        ),
        // unverified: never green without a verifier.
        row("success without a verifier is unverified", answered(), NO_CTX, Unverified, true, true, false),
        row(
            "success at a side-effect boundary without a verifier is unverified",
            side_effect(answered()),
            NO_CTX,
            Unverified,
            true,
            true,
            false,
        ),
        row(
            "a successful initialize is unverified (nothing checks it)",
            with(answered(), |c| c.method = Some(Method::Initialize)),
            NO_CTX,
            Unverified,
            true,
            true,
            false,
        ),
        row("nothing observed at all is unverified", sent(), NO_CTX, Unverified, true, false, false),
        row(
            "a confirmed outcome with no observed response is unverified",
            with(sent(), |c| c.outcomes.push(confirmed())),
            NO_CTX,
            Unverified,
            true,
            false,
            false,
        ),
        row(
            "a confirmed outcome with only transport ok is unverified",
            with(sent(), |c| {
                c.transport = Some(TransportOutcome::Ok);
                c.outcomes.push(confirmed());
            }),
            NO_CTX,
            Unverified,
            true,
            false,
            false,
        ),
        // healthy.
        row("success confirmed by a receipt", with(answered(), |c| c.outcomes.push(confirmed())), NO_CTX, Healthy, true, true, true),
        row(
            "success confirmed by a weak llm judge is still healthy",
            with(answered(), |c| {
                c.outcomes.push(receipt(OutcomeResult::Confirmed, VerifierMethod::LlmJudge, 1));
            }),
            NO_CTX,
            Healthy,
            true,
            true,
            true,
        ),
        row(
            "a later confirmation overrides an earlier missing check",
            with(answered(), |c| {
                c.outcomes.push(receipt(OutcomeResult::Missing, VerifierMethod::Receipt, 1));
                c.outcomes.push(receipt(OutcomeResult::Confirmed, VerifierMethod::Receipt, 2));
            }),
            NO_CTX,
            Healthy,
            true,
            true,
            true,
        ),
    ]
}

#[test]
fn state_table_precedence_retry_safety_and_success_flags() {
    for case in state_cases() {
        let v = classify_call(&case.ev, &case.ctx, QUIET);
        assert_eq!(v.state, case.state, "{}: state", case.name);
        assert_eq!(v.retry_safe, case.retry_safe, "{}: retry_safe", case.name);
        assert_eq!(v.protocol_success, case.protocol_success, "{}: protocol_success", case.name);
        assert_eq!(v.verified_success, case.verified_success, "{}: verified_success", case.name);
        assert_masked_after_first_failure(case.name, &v.layers);
        // The state function agrees with the verdict.
        assert_eq!(state(&case.ev, &layers::evaluate_in(&case.ev, &case.ctx), &case.ctx), case.state, "{}: contract::state", case.name);
    }
}

#[test]
fn state_table_covers_every_health_state() {
    let cases = state_cases();
    for s in HealthState::ALL {
        assert!(cases.iter().any(|c| c.state == s), "no row reaches {s}");
    }
    // Every state but the two that need session context is reached from call evidence alone.
    for s in HealthState::ALL
        .into_iter()
        .filter(|s| !matches!(s, HealthState::StaleCatalog | HealthState::Working | HealthState::Waiting | HealthState::ContractDrift))
    {
        assert!(cases.iter().any(|c| c.state == s && c.ctx == NO_CTX), "no evidence-only row reaches {s}");
    }
}

#[test]
fn healthy_requires_a_confirmed_receipt_in_every_row() {
    for case in layer_cases().into_iter().map(|c| (c.name, c.ev, NO_CTX)).chain(state_cases().into_iter().map(|c| (c.name, c.ev, c.ctx))) {
        let (name, ev, ctx) = case;
        let v = classify_call(&ev, &ctx, QUIET);
        if v.state == HealthState::Healthy {
            assert!(ev.outcomes.iter().any(|o| o.result == OutcomeResult::Confirmed), "{name}: healthy without a confirmed receipt");
            assert_eq!(ev.latest_outcome().map(|o| o.result), Some(OutcomeResult::Confirmed), "{name}");
        }
        if v.verified_success {
            assert_eq!(v.state, HealthState::Healthy, "{name}: verified success must be healthy");
        }
    }
}

#[test]
fn retry_is_blocked_only_while_a_possibly_committed_effect_has_no_receipt() {
    let lost = timed_out_at_side_effect();
    assert!(effect_may_be_committed(&lost, &layers::evaluate(&lost)));
    assert!(!classify(&lost).retry_safe);
    for r in [OutcomeResult::Confirmed, OutcomeResult::Missing, OutcomeResult::Failed, OutcomeResult::Stale] {
        let reconciled = with(timed_out_at_side_effect(), |c| c.outcomes.push(receipt(r, VerifierMethod::Receipt, 9)));
        assert!(classify(&reconciled).retry_safe, "a {r:?} receipt reconciles the effect");
    }
    // A failure that never delivered the request is safe to retry within budget.
    for t in [TransportOutcome::DnsFailure, TransportOutcome::ConnectionRefused, TransportOutcome::TlsFailure] {
        let c = with(sent(), |c| {
            c.transport = Some(t);
            c.effect_boundary = Some(EffectBoundary::SideEffect);
        });
        assert!(!effect_may_be_committed(&c, &layers::evaluate(&c)), "{t:?}");
        assert!(classify(&c).retry_safe, "{t:?}");
    }
}

#[test]
fn effect_may_be_committed_only_for_a_failed_tools_call_that_may_have_delivered() {
    let f = |c: &CallEvidence| effect_may_be_committed(c, &layers::evaluate(c));
    assert!(f(&timed_out_at_side_effect()));
    assert!(f(&with(sent(), |c| c.transport = Some(TransportOutcome::ConnectionReset))));
    // A 5xx came from a server that received the request and answered.
    assert!(!f(&with(sent(), |c| c.http_status = Some(502))));
    assert!(!f(&with(timed_out_at_side_effect(), |c| c.request_sent = Some(false))));
    assert!(!f(&with(timed_out_at_side_effect(), |c| c.effect_boundary = Some(EffectBoundary::None))));
    assert!(!f(&with(timed_out_at_side_effect(), |c| c.method = Some(Method::ToolsList))));
    assert!(!f(&with(timed_out_at_side_effect(), |c| c.method = None)));
    // No transport failure, nothing lost.
    assert!(!f(&with(answered(), |c| c.effect_boundary = Some(EffectBoundary::SideEffect))));
    assert!(!f(&with(answered(), |c| c.timeout_error = true)));
}

// --- folded from spans ----------------------------------------------------------------------

fn span(n: u8, side: Side, method: Option<Method>) -> SpanEvidence {
    let mut s = SpanEvidence::new([9; 16], [n; 8]);
    s.side = side;
    s.method = method;
    s.start_ns = n as u64 * 10;
    s.end_ns = n as u64 * 10 + 5;
    if s.method.is_some() {
        s.tool = Some(Arc::from("create_ticket"));
        s.request_id = Some("4".into());
    }
    s
}

fn fold(spans: &[SpanEvidence]) -> CallEvidence {
    let mut c = CallEvidence::default();
    for s in spans {
        c.absorb(s);
    }
    c
}

#[test]
fn folded_client_32603_and_http_401_span_is_needs_auth_with_protocol_unobserved() {
    let mut client = span(1, Side::Client, Some(Method::ToolsCall));
    client.error = Some(CallError::JsonRpc(-32603));
    client.status_error = true;
    let mut http = span(2, Side::Server, None);
    http.parent_span_id = Some(client.span_id);
    http.http_status = Some(401);
    http.auth_status = Some(401);
    http.auth_error = Some(AuthError::InvalidToken);
    let v = classify(&fold(&[client, http]));
    assert_eq!(v.state, HealthState::NeedsAuth);
    assert_eq!(v.first_failed_layer, Some(Layer::Authorization));
    assert_eq!(v.layers.0, [P, U, F, U, U]);
    assert_eq!(v.reason.as_deref(), Some("invalid_token"));
    assert_eq!(v.span_id, [1; 8], "the verdict hangs under the client span");
}

#[test]
fn folded_client_and_server_success_with_verifier_span_is_healthy() {
    let client = span(1, Side::Client, Some(Method::ToolsCall));
    let mut server = span(2, Side::Server, Some(Method::ToolsCall));
    server.parent_span_id = Some(client.span_id);
    let mut verifier = span(3, Side::Internal, None);
    verifier.outcomes.push(receipt(OutcomeResult::Confirmed, VerifierMethod::FileDigest, 99));
    let c = fold(&[server, client, verifier]);
    assert!(c.client_seen && c.server_seen && c.response_seen);
    let v = classify(&c);
    assert_eq!(v.state, HealthState::Healthy);
    assert_eq!(v.confidence, Confidence::High);
    assert!(v.verified_success && v.protocol_success);
    assert_eq!(v.span_id, [1; 8], "the client span anchors the verdict even when the server span came first");
}

#[test]
fn folded_transport_failure_outcome_wins_over_ok_from_another_span() {
    let mut ok = span(1, Side::Client, Some(Method::ToolsCall));
    ok.transport = Some(TransportOutcome::Ok);
    ok.status_error = true;
    let mut timeout = span(2, Side::Internal, None);
    timeout.transport = Some(TransportOutcome::Timeout);
    timeout.effect_boundary = Some(EffectBoundary::SideEffect);
    for order in [[ok.clone(), timeout.clone()], [timeout, ok]] {
        let c = fold(&order);
        assert_eq!(c.transport, Some(TransportOutcome::Timeout));
        assert_eq!(classify(&c).state, HealthState::EffectUnknown);
    }
}

#[test]
fn folded_progress_notification_is_not_the_response_of_a_timed_out_call() {
    // A tools/call that timed out on the client (timeout exception class, no transport
    // attribute), while the server had sent a progress notification inside the call.
    let mut client = span(1, Side::Client, Some(Method::ToolsCall));
    client.error = Some(CallError::Timeout);
    client.status_error = true;
    client.effect_boundary = Some(EffectBoundary::SideEffect);
    let mut progress = span(2, Side::Server, Some(Method::parse("notifications/progress")));
    progress.request_id = None;
    progress.parent_span_id = Some(client.span_id);
    let c = fold(&[client, progress]);
    assert!(!c.response_seen, "a notification carries no response");
    let v = classify(&c);
    assert_eq!(v.state, HealthState::EffectUnknown);
    assert!(!v.retry_safe);
    assert_eq!(v.first_failed_layer, Some(Layer::Transport));
}

// --- confidence -----------------------------------------------------------------------------

#[test]
fn confidence_table() {
    use Confidence::*;
    let d = |decided_by, root_seen, truncated| Decision { revision: 0, decided_by, root_seen, truncated };
    let client_only = |c: CallEvidence| CallEvidence { server_seen: false, ..c };
    let weak = |m| with(answered(), |c| c.outcomes.push(receipt(OutcomeResult::Confirmed, m, 1)));
    let cases: Vec<(&str, CallEvidence, Decision, HealthState, Confidence)> = vec![
        (
            "healthy on a strong receipt, client only",
            client_only(with(answered(), |c| c.outcomes.push(confirmed()))),
            QUIET,
            HealthState::Healthy,
            High,
        ),
        ("healthy on an llm judge is low", weak(VerifierMethod::LlmJudge), QUIET, HealthState::Healthy, Low),
        ("healthy on an unspecified verifier method is low", weak(VerifierMethod::Unspecified), QUIET, HealthState::Healthy, Low),
        (
            "false success on an llm judge is low",
            with(answered(), |c| c.outcomes.push(receipt(OutcomeResult::Missing, VerifierMethod::LlmJudge, 1))),
            QUIET,
            HealthState::FalseSuccess,
            Low,
        ),
        (
            "a weak verifier does not lower a verdict it did not decide",
            with(weak(VerifierMethod::LlmJudge), |c| c.tool_error = true),
            QUIET,
            HealthState::ToolFailed,
            High,
        ),
        ("evicted chains are low", answered(), d(DecidedBy::Evicted, true, false), HealthState::Unverified, Low),
        ("chains cut by shutdown are low", answered(), d(DecidedBy::Shutdown, true, false), HealthState::Unverified, Low),
        (
            "truncated chains are low",
            with(answered(), |c| c.tool_error = true),
            d(DecidedBy::Quiet, true, true),
            HealthState::ToolFailed,
            Low,
        ),
        (
            "an unexplained error weakens an unverified call",
            with(answered(), |c| c.unexplained_error = true),
            QUIET,
            HealthState::Unverified,
            Low,
        ),
        (
            "an unexplained error weakens a healthy call",
            with(answered(), |c| {
                c.unexplained_error = true;
                c.outcomes.push(confirmed());
            }),
            QUIET,
            HealthState::Healthy,
            Low,
        ),
        (
            "an unexplained error does not weaken a failure it sits beside",
            with(answered(), |c| {
                c.unexplained_error = true;
                c.tool_error = true;
            }),
            QUIET,
            HealthState::ToolFailed,
            High,
        ),
        ("both sides seen is high", with(answered(), |c| c.jsonrpc_error = Some(-32601)), QUIET, HealthState::ProtocolError, High),
        (
            "one side only is medium",
            client_only(with(answered(), |c| c.jsonrpc_error = Some(-32601))),
            QUIET,
            HealthState::ProtocolError,
            Medium,
        ),
        (
            "transport failure named by the transport attribute is high",
            with(sent(), |c| c.transport = Some(TransportOutcome::DnsFailure)),
            QUIET,
            HealthState::TransportFailed,
            High,
        ),
        (
            "transport failure read from an http 503 on one side is medium",
            with(sent(), |c| c.http_status = Some(503)),
            QUIET,
            HealthState::TransportFailed,
            Medium,
        ),
        ("effect unknown named by the transport attribute is high", timed_out_at_side_effect(), QUIET, HealthState::EffectUnknown, High),
        (
            "effect unknown from an exception class on one side is medium",
            with(sent(), |c| c.timeout_error = true),
            QUIET,
            HealthState::EffectUnknown,
            Medium,
        ),
        (
            "needs_auth from a challenge attribute is high",
            with(sent(), |c| c.auth_error = Some(AuthError::InvalidToken)),
            QUIET,
            HealthState::NeedsAuth,
            High,
        ),
        (
            "needs_auth from the auth status attribute is high",
            with(sent(), |c| c.auth_status = Some(401)),
            QUIET,
            HealthState::NeedsAuth,
            High,
        ),
        (
            "needs_auth from a plain http 401 on one side is medium",
            with(sent(), |c| c.http_status = Some(401)),
            QUIET,
            HealthState::NeedsAuth,
            Medium,
        ),
        (
            "incompatible session from negotiation evidence is high",
            client_only(with(answered(), |c| c.negotiation = Some(refused_version()))),
            QUIET,
            HealthState::IncompatibleSession,
            High,
        ),
        (
            "max wait without a root caps high at medium",
            with(answered(), |c| c.outcomes.push(confirmed())),
            d(DecidedBy::MaxWait, false, false),
            HealthState::Healthy,
            Medium,
        ),
        (
            "max wait with the root seen keeps high",
            with(answered(), |c| c.outcomes.push(confirmed())),
            d(DecidedBy::MaxWait, true, false),
            HealthState::Healthy,
            High,
        ),
        (
            "max wait without a root leaves medium at medium",
            client_only(with(answered(), |c| c.tool_error = true)),
            d(DecidedBy::MaxWait, false, false),
            HealthState::ToolFailed,
            Medium,
        ),
        (
            "replay is complete evidence",
            with(answered(), |c| c.outcomes.push(confirmed())),
            d(DecidedBy::Replay, true, false),
            HealthState::Healthy,
            High,
        ),
    ];
    for (name, ev, decision, want_state, want) in cases {
        let v = classify_call(&ev, &NO_CTX, decision);
        assert_eq!(v.state, want_state, "{name}: state");
        assert_eq!(v.confidence, want, "{name}: confidence");
        assert_eq!(confidence(&ev, want_state, decision), want, "{name}: confidence()");
        assert_eq!(v.decided_by, decision.decided_by, "{name}");
    }
}

#[test]
fn llm_judge_confirmation_is_healthy_with_low_confidence_and_names_its_method() {
    let c = with(answered(), |c| c.outcomes.push(receipt(OutcomeResult::Confirmed, VerifierMethod::LlmJudge, 1)));
    let v = classify(&c);
    assert_eq!(v.state, HealthState::Healthy);
    assert_eq!(v.confidence, Confidence::Low);
    assert_eq!(v.outcome_method, Some("llm_judge"));
}

// --- routing: reason fallbacks and next actions ----------------------------------------------

#[test]
fn next_action_names_the_required_scope_for_a_403() {
    let c = with(sent(), |c| {
        c.http_status = Some(403);
        c.auth_error = Some(AuthError::InsufficientScope);
        c.required_scope = Some("tickets:write".into());
    });
    let v = classify(&c);
    assert_eq!(v.state, HealthState::NeedsAuth);
    assert!(v.next_action.contains("'tickets:write'"), "{}", v.next_action);
    assert!(v.next_action.contains("never loop"), "{}", v.next_action);
    assert!(v.next_action.contains("never switch to a stronger credential"), "{}", v.next_action);
    assert_eq!(v.required_scope.as_deref(), Some("tickets:write"));
    // A 403 with the scope but only as a status (no challenge error) is routed the same way.
    for c in [
        with(sent(), |c| {
            c.auth_status = Some(403);
            c.required_scope = Some("repo".into());
        }),
        with(sent(), |c| {
            c.http_status = Some(403);
            c.required_scope = Some("repo".into());
        }),
    ] {
        assert!(classify(&c).next_action.contains("'repo'"), "{c:?}");
    }
}

#[test]
fn next_action_per_state() {
    let f = |c: &CallEvidence, ctx: &SessionContext| {
        let v = classify_call(c, ctx, QUIET);
        (v.state, v.next_action)
    };
    let cases: Vec<(CallEvidence, SessionContext, HealthState, &str)> = vec![
        (with(sent(), |c| c.auth_status = Some(403)), NO_CTX, HealthState::NeedsAuth, "ask the credential owner for the required scope"),
        (with(sent(), |c| c.auth_status = Some(401)), NO_CTX, HealthState::NeedsAuth, "refresh the credential once"),
        (with(sent(), |c| c.auth_error = Some(AuthError::InsufficientScope)), NO_CTX, HealthState::NeedsAuth, "required scope"),
        (
            with(sent(), |c| c.transport = Some(TransportOutcome::ConnectionRefused)),
            NO_CTX,
            HealthState::TransportFailed,
            "check reachability of tickets.example.test:8443",
        ),
        (
            with(sent(), |c| {
                c.transport = Some(TransportOutcome::ConnectionRefused);
                c.server = None;
            }),
            NO_CTX,
            HealthState::TransportFailed,
            "check reachability of the server",
        ),
        (with(answered(), |c| c.negotiation = Some(refused_version())), NO_CTX, HealthState::IncompatibleSession, "integration owner"),
        (answered(), STALE, HealthState::StaleCatalog, "one bounded rediscovery"),
        (with(answered(), |c| c.jsonrpc_error = Some(-32601)), NO_CTX, HealthState::ProtocolError, "refresh discovery"),
        (with(answered(), |c| c.jsonrpc_error = Some(-32602)), NO_CTX, HealthState::ProtocolError, "fix the request contract"),
        (with(answered(), |c| c.jsonrpc_error = Some(-32600)), NO_CTX, HealthState::ProtocolError, "client implementer"),
        (sent(), WORKING, HealthState::Working, "stay silent"),
        (with(answered(), |c| c.tool_error = true), NO_CTX, HealthState::ToolFailed, "known to be reversible"),
        (timed_out_at_side_effect(), NO_CTX, HealthState::EffectUnknown, "block automatic retry"),
        (
            with(answered(), |c| c.outcomes.push(receipt(OutcomeResult::Missing, VerifierMethod::Receipt, 1))),
            NO_CTX,
            HealthState::FalseSuccess,
            "outcome incident",
        ),
        (answered(), NO_CTX, HealthState::Unverified, "verify the destination"),
        (with(answered(), |c| c.outcomes.push(confirmed())), NO_CTX, HealthState::Healthy, "continue"),
    ];
    for (c, ctx, want_state, needle) in cases {
        let (s, action) = f(&c, &ctx);
        assert_eq!(s, want_state, "{needle}");
        assert!(action.contains(needle), "{want_state}: {action:?} should mention {needle:?}");
        // next_action is a function of the state and the evidence alone.
        assert_eq!(action, next_action(s, &c, &layers::evaluate(&c)));
    }
}

#[test]
fn required_scope_is_reported_only_for_needs_auth() {
    let c = with(answered(), |c| {
        c.required_scope = Some("tickets:write".into());
        c.tool_error = true;
    });
    let v = classify(&c);
    assert_eq!(v.state, HealthState::ToolFailed);
    assert_eq!(v.required_scope, None);
}

#[test]
fn reason_falls_back_to_unclassified_error_when_no_layer_failed() {
    let v = classify(&with(answered(), |c| c.unexplained_error = true));
    assert_eq!(v.state, HealthState::Unverified);
    assert_eq!(v.first_failed_layer, None);
    assert_eq!(v.reason.as_deref(), Some("unclassified_error"));
    // A failed layer names its own reason instead.
    let v = classify(&with(answered(), |c| {
        c.unexplained_error = true;
        c.tool_error = true;
    }));
    assert_eq!(v.reason.as_deref(), Some("tool_error"));
}

#[test]
fn verdict_carries_identity_but_hashes_the_session_id() {
    let c = with(answered(), |c| c.session_id = Some("sess-secret-1".into()));
    let v = classify(&c);
    assert_eq!(v.trace_id, [0xab; 16]);
    assert_eq!(v.span_id, [0xcd; 8]);
    assert_eq!(v.method.as_deref(), Some("tools/call"));
    assert_eq!(v.tool.as_deref(), Some("create_ticket"));
    assert_eq!(v.request_id.as_deref(), Some("7"));
    let hash = v.session_id_hash.expect("session hash");
    assert_eq!(hash.len(), 64);
    assert!(!hash.contains("sess-secret-1"));
    assert_eq!(
        &*hash,
        crate::evidence::hash::hash_hex(b"session:sess-secret-1").as_str(),
        "the hash of the session key, as catalog verdicts report it"
    );
    let d = Decision { revision: 3, decided_by: DecidedBy::MaxWait, root_seen: true, truncated: false };
    let v = classify_call(&c, &NO_CTX, d);
    assert_eq!((v.revision, v.decided_by), (3, DecidedBy::MaxWait));
}

/// Issue 8 defect 8: the unknown-tool verdict names `unknown_tool` at the protocol layer, routes
/// to a rediscovery, and does not depend on how (or whether) the server reported an error.
#[test]
fn an_unknown_tool_by_the_converged_catalog_is_a_protocol_error_named_unknown_tool() {
    let ctx = SessionContext { tool_in_catalog: Some(false), ..NO_CTX };
    for ev in [with(answered(), |c| c.tool_error = true), answered(), with(answered(), |c| c.unknown_tool = true)] {
        let v = classify_call(&ev, &ctx, QUIET);
        assert_eq!(v.state, HealthState::ProtocolError, "{ev:?}");
        assert_eq!(v.first_failed_layer, Some(Layer::Protocol));
        assert_eq!(v.reason.as_deref(), Some("unknown_tool"));
        assert_eq!(v.layers.get(Layer::Execution), LayerStatus::Unobserved);
        assert!(v.next_action.contains("refresh discovery"), "{}", v.next_action);
    }
    // A JSON-RPC code already names the protocol failure: it is kept.
    let v = classify_call(&with(answered(), |c| c.jsonrpc_error = Some(-32602)), &ctx, QUIET);
    assert_eq!(v.reason.as_deref(), Some("jsonrpc_-32602"));
    // Not a tools/call: the rule does not apply.
    let list = with(answered(), |c| c.method = Some(Method::ToolsList));
    assert_eq!(classify_call(&list, &ctx, QUIET).state, HealthState::Unverified);
}

/// Issue 9: a verifier that could not run is no finding — never green, never a failure: the
/// call stays `unverified`, reason `verifier_error`; a real finding (before or after) decides.
#[test]
fn a_verifier_error_is_no_finding() {
    let err = || receipt(OutcomeResult::VerifierError, VerifierMethod::HttpStatus, 50);
    let v = classify(&with(answered(), |c| c.outcomes.push(err())));
    assert_eq!((v.state, v.reason.as_deref(), v.verified_success), (HealthState::Unverified, Some("verifier_error"), false));
    assert_eq!(v.layers.get(Layer::Outcome), LayerStatus::Unobserved);
    for (first, second) in [(err(), confirmed()), (confirmed(), receipt(OutcomeResult::VerifierError, VerifierMethod::HttpStatus, 500))] {
        let v = classify(&with(answered(), |c| c.outcomes.extend([first.clone(), second.clone()])));
        assert_eq!(v.state, HealthState::Healthy, "a confirmed finding decides whatever errors came with it");
    }
    // On a lost response, an error leaves the effect unknown and retry blocked.
    let v = classify(&with(timed_out_at_side_effect(), |c| c.outcomes.push(err())));
    assert_eq!((v.state, v.retry_safe), (HealthState::EffectUnknown, false));
}

/// Issue 9: reconciliation of a lost response, each finding.
#[test]
fn reconciliation_of_a_lost_response_by_finding() {
    for (result, state, reason) in [
        (OutcomeResult::Confirmed, HealthState::Healthy, "timeout"),
        (OutcomeResult::Missing, HealthState::TransportFailed, "reconciled_not_committed"),
        (OutcomeResult::Failed, HealthState::FalseSuccess, "timeout"),
    ] {
        let v = classify(&with(timed_out_at_side_effect(), |c| c.outcomes.push(receipt(result, VerifierMethod::HttpStatus, 50))));
        assert_eq!(
            (v.state, v.first_failed_layer, v.reason.as_deref(), v.retry_safe),
            (state, Some(Layer::Transport), Some(reason), true),
            "{result:?}"
        );
    }
}

/// Issue 34: what the SDKs' own client spans can and cannot claim, folded as the correlator
/// folds them. A table: the spans of a call, then the state, first failed layer, reason, protocol
/// success and attempt of its verdict.
#[test]
fn sdk_client_spans_claim_only_what_they_show() {
    // The `mcp` SDK's client span: no error, and no sign of an answer either.
    let sdk = |n: u8, m: Method| {
        let mut s = span(n, Side::Client, Some(m));
        s.response_unobserved = true;
        s
    };
    let coded = |n: u8, m: Method, code: i32| {
        let mut s = span(n, Side::Client, Some(m));
        s.error = Some(CallError::JsonRpc(code));
        s.status_error = true;
        s
    };
    let server = |n: u8, m: Method, code: Option<i32>| {
        let mut s = span(n, Side::Server, Some(m));
        s.error = code.map(CallError::JsonRpc);
        s
    };
    let rendered = |n: u8, m: Method| {
        let mut s = coded(n, m, -32603);
        s.error_maybe_client_rendered = true;
        s
    };
    let discover = || Method::parse("server/discover");
    type Row = (&'static str, Vec<SpanEvidence>, HealthState, Option<Layer>, Option<&'static str>, bool, bool);
    let rows: Vec<Row> = vec![
        // A dead server, seen by the SDK's span alone: not a protocol success.
        ("sdk call alone", vec![sdk(1, Method::ToolsCall)], HealthState::Unverified, None, Some("response_unobserved"), false, true),
        // With its server span, the same call was answered.
        (
            "sdk call + server span",
            vec![sdk(1, Method::ToolsCall), server(2, Method::ToolsCall, None)],
            HealthState::Unverified,
            None,
            None,
            true,
            true,
        ),
        // The Python SDK's CONNECTION_CLOSED and REQUEST_TIMEOUT (FastMCP's span carries them):
        // the request may have been delivered, the response was lost.
        (
            "-32000 on the client",
            vec![coded(1, Method::ToolsCall, -32000), sdk(2, Method::ToolsCall)],
            HealthState::EffectUnknown,
            Some(Layer::Transport),
            Some("connection_reset"),
            false,
            true,
        ),
        (
            "-32001 on the client",
            vec![coded(1, Method::ToolsCall, -32001)],
            HealthState::EffectUnknown,
            Some(Layer::Transport),
            Some("timeout"),
            false,
            true,
        ),
        (
            "408 (mcp 1.x timeout)",
            vec![coded(1, Method::ToolsCall, 408)],
            HealthState::EffectUnknown,
            Some(Layer::Transport),
            Some("timeout"),
            false,
            true,
        ),
        (
            "Go ErrRejected",
            vec![coded(1, Method::ToolsCall, -32005)],
            HealthState::TransportFailed,
            Some(Layer::Transport),
            Some("connection_refused"),
            false,
            true,
        ),
        // A server that itself answered -32000 (TypeScript and C# servers do, for HTTP-level
        // rejections): the server's code stands.
        (
            "-32000 from the server",
            vec![coded(1, Method::ToolsCall, -32000), server(2, Method::ToolsCall, Some(-32000))],
            HealthState::ProtocolError,
            Some(Layer::Protocol),
            Some("jsonrpc_-32000"),
            false,
            true,
        ),
        // A setup lost to a dead connection, a setup refused 401 (rendered -32603), a setup
        // nobody shows answered: failed attempts whose layer is not observed.
        (
            "setup, -32000",
            vec![coded(1, Method::Initialize, -32000)],
            HealthState::TransportFailed,
            Some(Layer::Transport),
            Some("connection_reset"),
            false,
            true,
        ),
        (
            "setup, rendered -32603",
            vec![rendered(1, Method::Initialize)],
            HealthState::Unverified,
            None,
            Some("transport_or_authorization_unobserved"),
            false,
            true,
        ),
        ("discover alone", vec![sdk(1, discover())], HealthState::Unverified, None, Some("response_unobserved"), false, true),
        // A setup the server answered is no attempt; a discover answered "method not found" is
        // the negotiation falling back, not a failure.
        (
            "setup answered",
            vec![sdk(1, Method::Initialize), server(2, Method::Initialize, None)],
            HealthState::Unverified,
            None,
            None,
            true,
            false,
        ),
        ("discover fell back", vec![coded(1, discover(), -32601)], HealthState::Unverified, None, None, true, false),
    ];
    for (name, spans, state, layer, reason, protocol_success, attempt) in rows {
        let mut c = fold(&spans);
        c.settle();
        let v = classify(&c);
        assert_eq!(
            (v.state, v.first_failed_layer, v.reason.as_deref(), v.protocol_success, v.attempt),
            (state, layer, reason, protocol_success, attempt),
            "{name}: {v:?}"
        );
        assert!(crate::engine::reportable(&v) || !attempt, "{name}: an attempt is always reported");
    }
}

/// A verdict carries the exact version spoken beside its family: a version newer than any this
/// build knows is reported as spoken (its family `2026-07-28`); a version that is no date is not
/// echoed (it says nothing, and may be anything a client sent).
#[test]
fn a_verdict_names_the_exact_version_spoken_and_never_echoes_a_non_date() {
    for (said, family, shown) in [
        ("2026-12-15", ProtocolRevision::Stateless, Some("2026-12-15")),
        ("2026-07-28", ProtocolRevision::Stateless, Some("2026-07-28")),
        ("2025-06-18", ProtocolRevision::Handshake, Some("2025-06-18")),
        ("Bearer sk-live-planted-77", ProtocolRevision::Unknown, None),
    ] {
        let mut client = span(1, Side::Client, Some(Method::ToolsCall));
        client.protocol_version = Some(Arc::from(said));
        let mut server = span(2, Side::Server, Some(Method::ToolsCall));
        server.parent_span_id = Some(client.span_id);
        let v = classify(&fold(&[client, server]));
        assert_eq!((v.protocol_revision, v.protocol_version.as_deref()), (family, shown), "{said}");
        let line = serde_json::to_string(&v).unwrap();
        assert!(!line.contains("planted"), "{line}");
    }
}
