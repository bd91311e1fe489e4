//! The first failed layer (SPEC section 2): five ordered layers, each `passed`, `failed` or
//! `unobserved`. A layer passes only on positive evidence; absence of an error is not evidence.

use crate::evidence::call::CallEvidence;
use crate::evidence::{Method, OutcomeResult, TaskStatus, TransportOutcome};
use crate::verdict::{Layer, LayerStatus, Layers};

/// Evidence about the session and catalog that outlives one call (filled by later stages; the
/// call-level classifier treats `None` as not observed). It sits beside the findings because both
/// the layer rules and the contract state read it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SessionContext {
    /// The catalog the call was chosen from is known to be stale.
    pub catalog_stale: Option<bool>,
    /// The call is in flight with valid progress (or a task answering `working` within its poll
    /// interval) and its absolute deadline holds.
    pub working: bool,
    /// The call waits for input (`input_required`) within its own clocks.
    pub waiting: bool,
    /// The tool definition in use differs from its pin: what changed (empty when no definition
    /// was observed to diff).
    pub contract_drift: Option<Vec<super::drift::ContractChange>>,
    /// Whether the called tool is in the session's converged catalog (a complete traversal, at
    /// the call's start): `Some(false)` makes the call an unknown tool (SPEC §3, `protocol_error`)
    /// however the server worded its answer; `None` (no converged catalog known, or no tool name)
    /// and the rule does not apply.
    pub tool_in_catalog: Option<bool>,
}

/// The layer statuses before masking, with the failure class of each failed layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LayerFindings {
    pub status: [LayerStatus; 5],
    pub reasons: [Option<String>; 5],
}

impl LayerFindings {
    pub(crate) fn get(&self, l: Layer) -> LayerStatus {
        self.status[l as usize]
    }
    pub(crate) fn reason(&self, l: Layer) -> Option<&str> {
        self.reasons[l as usize].as_deref()
    }
    /// SPEC: the first failed layer is the verdict; every later layer is `unobserved`.
    pub(crate) fn masked(&self) -> Layers {
        let mut out = self.status;
        if let Some(first) = out.iter().position(|s| *s == LayerStatus::Failed) {
            for s in out.iter_mut().skip(first + 1) {
                *s = LayerStatus::Unobserved;
            }
        }
        Layers(out)
    }
}

/// The transport failure of a call, if any, as (kind, reason).
pub(crate) fn transport_failure(c: &CallEvidence) -> Option<(Option<TransportOutcome>, String)> {
    if let Some(t) = c.transport.filter(|t| *t != TransportOutcome::Ok) {
        return Some((Some(t), t.as_str().to_string()));
    }
    if let Some(t) = c.connection_error {
        return Some((Some(t), t.as_str().to_string()));
    }
    if c.timeout_error && !c.response_seen {
        return Some((Some(TransportOutcome::Timeout), "timeout".into()));
    }
    match c.http_status {
        Some(h) if h >= 500 => Some((None, format!("http_{h}"))),
        _ => None,
    }
}

/// Authorization failure evidence: a 401/403 anywhere on the call, or a challenge attribute.
pub(crate) fn authorization_failure(c: &CallEvidence) -> Option<String> {
    let status = c.auth_status.or(c.http_status.filter(|h| *h == 401 || *h == 403));
    if status.is_none() && c.auth_error.is_none() {
        return None;
    }
    Some(match (c.auth_error, status) {
        (Some(e), _) => e.as_str().to_string(),
        (None, Some(401)) => "invalid_token".into(),
        (None, Some(403)) => "insufficient_scope".into(),
        (None, _) => "unauthorized".into(),
    })
}

/// 2026-07-28 `UnsupportedProtocolVersion`: the server does not speak the requested revision.
pub(crate) const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;
/// 2026-07-28 `MissingRequiredClientCapability`: the request needs a capability the client did
/// not declare.
pub(crate) const MISSING_REQUIRED_CLIENT_CAPABILITY: i64 = -32021;
/// JSON-RPC "method not found".
const METHOD_NOT_FOUND: i64 = -32601;

/// A `server/discover` answered "method not found": the server predates 2026-07-28, and a client
/// in `auto` mode goes on with `initialize`. Negotiation, not a failure of anything.
pub(crate) fn discover_fell_back(c: &CallEvidence) -> bool {
    c.method.as_ref().is_some_and(|m| m.is("server/discover")) && c.jsonrpc_error == Some(METHOD_NOT_FOUND)
}

/// Whether the negotiation evidence says this session cannot work, with the reason. On
/// 2026-07-28 there is no `initialize`: any request may be refused for its version (-32022) or
/// for a capability the client did not declare (-32021), and that refusal is the negotiation.
pub(crate) fn incompatibility(c: &CallEvidence) -> Option<String> {
    if let Some(n) = &c.negotiation {
        if n.version_accepted == Some(false) {
            return Some("unsupported_protocol_version".into());
        }
        if !n.missing_capabilities.is_empty() {
            return Some("missing_capability".into());
        }
    }
    match c.jsonrpc_error {
        Some(UNSUPPORTED_PROTOCOL_VERSION) => return Some("unsupported_protocol_version".into()),
        Some(MISSING_REQUIRED_CLIENT_CAPABILITY) => return Some("missing_capability".into()),
        _ => {}
    }
    if c.method == Some(Method::Initialize) {
        if let Some(code) = c.jsonrpc_error {
            return Some(format!("initialize_failed_jsonrpc_{code}"));
        }
    }
    None
}

/// Evaluate every layer from the call's evidence and what its session knows. SPEC §3: an unknown
/// tool is a protocol error however the server words it (the TypeScript SDK's `McpServer` and
/// server-everything answer "Tool X not found" as an `isError` result, FastMCP raises
/// `NotFoundError`), and the evidence is the session's catalog: a `tools/call` of a tool absent
/// from the converged catalog fails the protocol layer with `unknown_tool` — the same rule for
/// every dialect and the tap, decided without reading any result text. A failure at an earlier
/// layer (transport, authorization) or a protocol failure already named (a JSON-RPC code) stays.
pub(crate) fn evaluate_in(c: &CallEvidence, ctx: &SessionContext) -> LayerFindings {
    use LayerStatus::*;
    let mut f = evaluate(c);
    let earlier_failed = [Layer::Transport, Layer::Protocol, Layer::Authorization].iter().any(|l| f.get(*l) == Failed);
    if c.method == Some(Method::ToolsCall) && ctx.tool_in_catalog == Some(false) && !earlier_failed {
        f.status[Layer::Protocol as usize] = Failed;
        f.reasons[Layer::Protocol as usize] = Some("unknown_tool".into());
        // The answer was the server's rendering of an unknown tool, not the tool's own result.
        f.status[Layer::Execution as usize] = Unobserved;
        f.reasons[Layer::Execution as usize] = None;
    }
    f
}

/// Evaluate every layer from the call's evidence alone.
pub(crate) fn evaluate(c: &CallEvidence) -> LayerFindings {
    use LayerStatus::*;
    let mut status = [Unobserved; 5];
    let mut reasons: [Option<String>; 5] = Default::default();
    let mut set = |l: Layer, s: LayerStatus, r: Option<String>| {
        status[l as usize] = s;
        reasons[l as usize] = r;
    };

    // Transport: any response, any HTTP status below 500, or an explicit `ok` is a pass.
    let auth_fail = authorization_failure(c);
    if let Some((_, reason)) = transport_failure(c) {
        set(Layer::Transport, Failed, Some(reason));
    } else if c.response_seen
        || c.interim_seen
        || !c.progress.is_empty()
        || c.http_status.is_some()
        || c.transport == Some(TransportOutcome::Ok)
        || c.jsonrpc_error.is_some()
        || auth_fail.is_some()
    {
        set(Layer::Transport, Passed, None);
    }

    // Protocol: a JSON-RPC error, a failed negotiation or a rejected request fails it. When the
    // request was refused for authorization, the client's JSON-RPC error (often -32603) is its
    // rendering of that refusal, so the protocol layer was never reached: unobserved.
    if auth_fail.is_none() {
        if let Some(r) = incompatibility(c) {
            set(Layer::Protocol, Failed, Some(r));
        } else if discover_fell_back(c) {
            set(Layer::Protocol, Passed, None);
        } else if let Some(code) = c.jsonrpc_error {
            set(Layer::Protocol, Failed, Some(format!("jsonrpc_{code}")));
        } else if c.unknown_tool {
            // An unknown tool is a protocol failure (SPEC §3) even when the server wrapped it in an
            // `isError` result, as FastMCP does.
            set(Layer::Protocol, Failed, Some("unknown_tool".into()));
        } else if c.http_status == Some(400) {
            set(Layer::Protocol, Failed, Some("http_400".into()));
        } else if c.response_seen || c.interim_seen {
            set(Layer::Protocol, Passed, None);
        }
    }

    // Authorization: processed requests were authorized.
    if let Some(r) = auth_fail {
        set(Layer::Authorization, Failed, Some(r));
    } else if c.response_seen || c.interim_seen || discover_fell_back(c) {
        set(Layer::Authorization, Passed, None);
    }

    // Execution: the tool's own result. A task that ended without a terminal status, where a side
    // effect is possible, says nothing about execution: its effect is unknown (see
    // `contract::effect_may_be_committed`).
    let task = c.task.as_ref().map(|t| t.status);
    let lost_with_effect = c.task_lost() && c.effect_boundary != Some(crate::evidence::EffectBoundary::None);
    if lost_with_effect {
    } else if let Some(why) = c.clock_expired {
        // In flight past its inactivity window or absolute deadline: the tool did not finish.
        set(Layer::Execution, Failed, Some(why.into()));
    } else if task == Some(TaskStatus::Failed) {
        set(Layer::Execution, Failed, Some("task_failed".into()));
    } else if task == Some(TaskStatus::Cancelled) {
        set(Layer::Execution, Failed, Some("task_cancelled".into()));
    } else if task == Some(TaskStatus::Gone) {
        set(Layer::Execution, Failed, Some("task_expired".into()));
    } else if c.tool_error {
        set(Layer::Execution, Failed, Some("tool_error".into()));
    } else if c.exec_timeout {
        set(Layer::Execution, Failed, Some("tool_timeout".into()));
    } else if c.output_schema_violated == Some(true) {
        set(Layer::Execution, Failed, Some("output_schema_violated".into()));
    } else if c.response_seen && c.jsonrpc_error.is_none() && !c.unknown_tool {
        set(Layer::Execution, Passed, None);
    }

    // Outcome: the most recent destination check decides.
    if let Some(o) = c.latest_outcome() {
        if o.result == OutcomeResult::Confirmed {
            set(Layer::Outcome, Passed, None);
        } else {
            set(Layer::Outcome, Failed, Some(format!("outcome_{}", o.result.as_str())));
        }
    }
    LayerFindings { status, reasons }
}
