//! The health-contract state (SPEC section 3): the first state in precedence order whose
//! condition holds. `unverified` sits just before `healthy`, so a call nobody checked is never green.

use std::borrow::Cow;

use super::layers::{self, LayerFindings, SessionContext};
use crate::evidence::call::CallEvidence;
use crate::evidence::{AuthError, EffectBoundary, Method, OutcomeResult};
use crate::verdict::{HealthState, Layer, LayerStatus};

/// Could this call's failure have committed a side effect before the response was lost?
pub(crate) fn effect_may_be_committed(c: &CallEvidence, f: &LayerFindings) -> bool {
    if c.method == Some(Method::ToolsCall) && c.task_lost() {
        // The task may have run to the end where nobody saw it.
        return c.effect_boundary != Some(EffectBoundary::None);
    }
    if f.get(Layer::Transport) != LayerStatus::Failed || c.method != Some(Method::ToolsCall) {
        return false;
    }
    let may_deliver = match layers::transport_failure(c) {
        Some((Some(kind), _)) => kind.may_have_delivered(),
        // A 5xx came from a server that received the request.
        Some((None, _)) => false,
        None => false,
    };
    may_deliver && c.request_sent != Some(false) && c.effect_boundary != Some(EffectBoundary::None)
}

/// A lost response at a side-effect boundary whose latest receipt says the effect is `missing`:
/// proven not committed (SPEC §2: retry only after proving the first attempt did not commit).
/// The call is a transport failure, safe to retry — not a false success, because nothing was
/// claimed: the tool never answered.
pub(crate) fn reconciled_not_committed(c: &CallEvidence, f: &LayerFindings) -> bool {
    effect_may_be_committed(c, f) && c.latest_outcome().is_some_and(|o| o.result == OutcomeResult::Missing)
}

/// Decide the state from the layer findings and the session context.
pub(crate) fn state(c: &CallEvidence, f: &LayerFindings, ctx: &SessionContext) -> HealthState {
    use HealthState::*;
    let failed = |l: Layer| f.get(l) == LayerStatus::Failed;
    let effect_unknown = effect_may_be_committed(c, f);
    if failed(Layer::Authorization) {
        return NeedsAuth;
    }
    if failed(Layer::Transport) && (!effect_unknown || reconciled_not_committed(c, f)) {
        return TransportFailed;
    }
    if layers::incompatibility(c).is_some() {
        return IncompatibleSession;
    }
    if ctx.contract_drift.is_some() {
        return ContractDrift;
    }
    if ctx.catalog_stale == Some(true) {
        return StaleCatalog;
    }
    if failed(Layer::Protocol) {
        return ProtocolError;
    }
    if ctx.working {
        return Working;
    }
    if ctx.waiting {
        return Waiting;
    }
    if failed(Layer::Execution) {
        return ToolFailed;
    }
    // A lost response at a side-effect boundary stays unknown until a receipt speaks.
    match (effect_unknown, f.get(Layer::Outcome)) {
        (true, LayerStatus::Unobserved) => EffectUnknown,
        (_, LayerStatus::Failed) => FalseSuccess,
        (_, LayerStatus::Unobserved) => Unverified,
        (_, LayerStatus::Passed) => {
            // Healthy needs every earlier layer positively passed (or the effect reconciled).
            let earlier_ok = [Layer::Transport, Layer::Protocol, Layer::Authorization, Layer::Execution]
                .iter()
                .all(|l| f.get(*l) == LayerStatus::Passed);
            if earlier_ok || effect_unknown {
                Healthy
            } else {
                Unverified
            }
        }
    }
}

/// What a person or agent should do next, per SPEC's routing of each state.
pub(crate) fn next_action(state: HealthState, c: &CallEvidence, f: &LayerFindings) -> Cow<'static, str> {
    use HealthState::*;
    let server = c.server.as_deref().unwrap_or("the server");
    match state {
        NeedsAuth => {
            let scope = c.required_scope.as_deref();
            if c.auth_error == Some(AuthError::InsufficientScope) || c.auth_status == Some(403) || c.http_status == Some(403) {
                match scope {
                    Some(s) => format!("ask the credential owner for scope '{s}'; never loop, never switch to a stronger credential").into(),
                    None => "ask the credential owner for the required scope; never loop, never switch to a stronger credential".into(),
                }
            } else {
                "refresh the credential once, then surface it to the credential owner".into()
            }
        }
        TransportFailed if reconciled_not_committed(c, f) => {
            "the lost attempt was proven not committed (reconciled): retry once with the same operation key".into()
        }
        TransportFailed => format!("check reachability of {server}; retry only within a fixed budget").into(),
        IncompatibleSession => "route to the integration owner with the requested and accepted versions and the missing capabilities".into(),
        ContractDrift => "stop the call: the tool's contract changed since it was pinned; review the change and re-pin (mcp-health lock --update) or roll the server back".into(),
        StaleCatalog => "suspend the affected definitions and run one bounded rediscovery".into(),
        ProtocolError => match f.reason(Layer::Protocol) {
            Some("jsonrpc_-32601") | Some("unknown_tool") => "refresh discovery: the method or tool is unknown to the server".into(),
            Some("jsonrpc_-32602") => "fix the request contract: the server rejected the parameters".into(),
            _ => "route to the client implementer with method, request id and error class".into(),
        },
        Working => "stay silent while progress is valid and the absolute deadline holds".into(),
        Waiting => "stay silent: the call waits for the client's input; it fails only when its own deadline passes".into(),
        ToolFailed => "inspect the tool or its input; retry only where the failure is known to be reversible".into(),
        EffectUnknown => "block automatic retry; reconcile by operation key or destination query first".into(),
        FalseSuccess => "open an outcome incident: the tool reported success but the outcome failed; do not declare completion".into(),
        Unverified if c.method.as_ref().is_some_and(Method::is_setup) && !c.response_seen && !c.interim_seen => format!(
            "the session could not be shown to start and no span says why: check reachability of {server} and the agent's credential; HTTP server tracing or mcp-health tap tells which"
        ).into(),
        Unverified if !c.response_seen && !c.interim_seen && c.request_spans > 0 && c.http_status.is_none() => {
            "no span shows the call was answered: verify the destination before declaring completion; server spans or mcp-health tap show the answer".into()
        }
        Unverified => "verify the destination before declaring completion".into(),
        Healthy => "continue".into(),
    }
}
