//! The one `Verdict` type every emitter reads. Emitters format it; they never re-derive it.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use serde::Serialize;

use crate::evidence::{Method, SpanId, TraceId};

/// The five ordered layers of a tool-call attempt (SPEC section 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Layer {
    Transport,
    Protocol,
    Authorization,
    Execution,
    Outcome,
}

impl Layer {
    pub const ALL: [Layer; 5] = [Layer::Transport, Layer::Protocol, Layer::Authorization, Layer::Execution, Layer::Outcome];
    pub fn as_str(self) -> &'static str {
        match self {
            Layer::Transport => "transport",
            Layer::Protocol => "protocol",
            Layer::Authorization => "authorization",
            Layer::Execution => "execution",
            Layer::Outcome => "outcome",
        }
    }
}

impl Layer {
    /// Who must act when this layer fails first: the receiver the alert rules route an incident
    /// to (otel-config/alertmanager.yml, one route per `first_failed_layer`). The status page's
    /// owner column reads the same mapping, so the page and the pager never name different people.
    pub fn owner(self) -> Owner {
        match self {
            Layer::Transport => Owner::ServerOncall,
            Layer::Protocol => Owner::ClientImplementer,
            Layer::Authorization => Owner::CredentialOwner,
            Layer::Execution => Owner::ToolOwner,
            Layer::Outcome => Owner::OutcomeOwner,
        }
    }
}

/// Who acts on an incident (SPEC section 3's owners), named as the Alertmanager receivers are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Owner {
    /// Whoever runs the MCP server's endpoint (DNS, refused, 5xx, timeouts before a response).
    ServerOncall,
    /// The client's implementer (JSON-RPC errors: the request was wrong).
    ClientImplementer,
    /// The owner of the credential (401/403: a token, a scope).
    CredentialOwner,
    /// The tool's owner (`isError`, tool timeouts, output schema violations).
    ToolOwner,
    /// The owner of the destination the agent writes to (`false_success`, `effect_unknown`).
    OutcomeOwner,
    /// The integration's owner: no call layer failed (a stale catalog, contract drift, an
    /// incompatible session).
    IntegrationOwner,
}

impl Owner {
    pub const ALL: [Owner; 6] = [
        Owner::ServerOncall,
        Owner::ClientImplementer,
        Owner::CredentialOwner,
        Owner::ToolOwner,
        Owner::OutcomeOwner,
        Owner::IntegrationOwner,
    ];

    /// The owner of an incident or verdict by its first failed layer; none failed: the
    /// integration (the alert rules label that `first_failed_layer="none"`).
    pub fn of(first_failed_layer: Option<Layer>) -> Owner {
        first_failed_layer.map_or(Owner::IntegrationOwner, Layer::owner)
    }

    /// The Alertmanager receiver's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Owner::ServerOncall => "server-oncall",
            Owner::ClientImplementer => "client-implementer",
            Owner::CredentialOwner => "credential-owner",
            Owner::ToolOwner => "tool-owner",
            Owner::OutcomeOwner => "outcome-owner",
            Owner::IntegrationOwner => "integration-owner",
        }
    }

    /// In words, for people.
    pub fn describe(self) -> &'static str {
        match self {
            Owner::ServerOncall => "server on-call",
            Owner::ClientImplementer => "client implementer",
            Owner::CredentialOwner => "credential owner",
            Owner::ToolOwner => "tool owner",
            Owner::OutcomeOwner => "outcome owner",
            Owner::IntegrationOwner => "integration owner",
        }
    }
}

/// What a JSON-RPC error code means, in words: the JSON-RPC 2.0 codes, MCP's own, and the codes
/// client SDKs make up for their side of the wire ([`crate::evidence::client_local_code`]). A
/// code nobody defined says so rather than guessing.
pub fn jsonrpc_meaning(code: i64) -> &'static str {
    match code {
        -32700 => "parse error",
        -32600 => "invalid request",
        -32601 => "method not found",
        -32602 => "invalid params",
        -32603 => "internal error",
        -32002 => "resource not found",
        -32042 => "URL elicitation required",
        -32021 => "missing required client capability",
        -32022 => "unsupported protocol version",
        -32000 => "connection closed (client SDK)",
        -32001 => "request timeout (client SDK)",
        -32003 | -32004 => "connection closing (client SDK)",
        -32005 => "request rejected by the transport (client SDK)",
        -32099..=-32006 => "server error (implementation-defined)",
        _ => "not a defined code",
    }
}

/// A sanitized failure class (a verdict's `reason`, an incident's error class) in words, where
/// it is a code: `jsonrpc_-32601` is "method not found". `None` when the class is already words
/// (`insufficient_scope`, `connection_refused`).
pub fn reason_meaning(reason: &str) -> Option<&'static str> {
    let code = reason.rsplit_once("jsonrpc_").map(|(_, c)| c)?;
    code.parse::<i64>().ok().map(jsonrpc_meaning)
}

/// What the evidence says about one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerStatus {
    Passed,
    Failed,
    /// No evidence either way, or a layer after the first failed one.
    Unobserved,
}

impl LayerStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            LayerStatus::Passed => "passed",
            LayerStatus::Failed => "failed",
            LayerStatus::Unobserved => "unobserved",
        }
    }
}

/// The status of every layer, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layers(pub [LayerStatus; 5]);

impl Layers {
    pub fn get(&self, l: Layer) -> LayerStatus {
        self.0[l as usize]
    }
    pub fn first_failed(&self) -> Option<Layer> {
        Layer::ALL.into_iter().find(|l| self.get(*l) == LayerStatus::Failed)
    }
}

impl Serialize for Layers {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(5))?;
        for l in Layer::ALL {
            m.serialize_entry(l.as_str(), self.get(l).as_str())?;
        }
        m.end()
    }
}

/// The health-contract state of SPEC section 3, in precedence order (earlier wins).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum HealthState {
    NeedsAuth,
    /// A transport failure that cannot have committed anything (refused, DNS, TLS, 5xx), or a
    /// timeout at a boundary declared free of side effects. Not in SPEC's list, which names no
    /// state for "never reached the server"; see the README.
    TransportFailed,
    IncompatibleSession,
    /// The tool definition in use differs from its pin (issue 3's contract pinning).
    ContractDrift,
    StaleCatalog,
    ProtocolError,
    Working,
    /// Waiting for input (a 2026-07-28 `input_required` round, or a task in `input_required`):
    /// the server answered and the call goes on once the client answers. Not progress, not a
    /// loop, and not a failure while its own deadline holds (SPEC §3, §6).
    Waiting,
    ToolFailed,
    EffectUnknown,
    FalseSuccess,
    Unverified,
    Healthy,
}

impl HealthState {
    /// How green a state is, the one order "never greener" is judged by (SPEC's rule: missing
    /// evidence is never turned into a green result): `healthy` (2) above `unverified` and
    /// `working` (1) — nothing failed, nothing proved — above every failure (0). A verdict from
    /// less evidence may move down this order, never up.
    pub fn greenness(self) -> u8 {
        match self {
            HealthState::Healthy => 2,
            HealthState::Unverified | HealthState::Working | HealthState::Waiting => 1,
            _ => 0,
        }
    }

    /// Whether something failed, so the verdict belongs to an incident: not a call still going
    /// (`working`, `waiting`), nor one where nothing failed (`unverified`, `healthy`).
    pub(crate) fn is_failure(self) -> bool {
        !matches!(self, HealthState::Working | HealthState::Waiting | HealthState::Unverified | HealthState::Healthy)
    }

    pub const ALL: [HealthState; 13] = [
        HealthState::NeedsAuth,
        HealthState::TransportFailed,
        HealthState::IncompatibleSession,
        HealthState::ContractDrift,
        HealthState::StaleCatalog,
        HealthState::ProtocolError,
        HealthState::Working,
        HealthState::Waiting,
        HealthState::ToolFailed,
        HealthState::EffectUnknown,
        HealthState::FalseSuccess,
        HealthState::Unverified,
        HealthState::Healthy,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            HealthState::NeedsAuth => "needs_auth",
            HealthState::TransportFailed => "transport_failed",
            HealthState::IncompatibleSession => "incompatible_session",
            HealthState::ContractDrift => "contract_drift",
            HealthState::StaleCatalog => "stale_catalog",
            HealthState::ProtocolError => "protocol_error",
            HealthState::Working => "working",
            HealthState::Waiting => "waiting",
            HealthState::ToolFailed => "tool_failed",
            HealthState::EffectUnknown => "effect_unknown",
            HealthState::FalseSuccess => "false_success",
            HealthState::Unverified => "unverified",
            HealthState::Healthy => "healthy",
        }
    }
}

impl fmt::Display for HealthState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How much the verdict can be leaned on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Confidence {
    Low,
    Medium,
    High,
}

impl Confidence {
    pub fn as_str(self) -> &'static str {
        match self {
            Confidence::Low => "low",
            Confidence::Medium => "medium",
            Confidence::High => "high",
        }
    }
}

/// Why a chain was decided when it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DecidedBy {
    /// Its root span ended and the trace went quiet for `decision_wait`.
    Quiet,
    /// `max_wait` passed without the trace completing.
    MaxWait,
    /// Pushed out by the correlator's bounds before it completed.
    Evicted,
    /// The service was shutting down.
    Shutdown,
    /// Read from a file (replay): everything there is, is there.
    Replay,
    /// An in-flight call outlived its inactivity window or absolute deadline.
    Clock,
    /// An interim report on a call still in flight (`working`); the final verdict follows.
    InFlight,
}

impl DecidedBy {
    pub fn as_str(self) -> &'static str {
        match self {
            DecidedBy::Quiet => "quiet",
            DecidedBy::MaxWait => "max_wait",
            DecidedBy::Evicted => "evicted",
            DecidedBy::Shutdown => "shutdown",
            DecidedBy::Replay => "replay",
            DecidedBy::Clock => "clock",
            DecidedBy::InFlight => "in_flight",
        }
    }
    /// Decided before the evidence was known to be complete.
    pub fn is_early(self) -> bool {
        matches!(self, DecidedBy::Evicted | DecidedBy::Shutdown)
    }
}

/// Why a verdict's evidence may be incomplete; which chains are partial is `classify::partial`'s rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Partial {
    /// The chain's earliest call predates this engine's start (less the grace).
    PredatesStart,
    /// Decided at shutdown (or a drain), with spans possibly still on their way.
    DecidedAtShutdown,
    /// Pushed out of the chain table by its bounds before it completed.
    Evicted,
    /// Decided while the state store was unavailable.
    StoreUnavailable,
    /// A server half in another trace fits the call but could not be told to be its own (another
    /// client's call reused the request id at the same time, or it came too late to join): the
    /// server's evidence of this call may exist and is not in the verdict.
    AmbiguousServerHalf,
}

impl Partial {
    pub fn as_str(self) -> &'static str {
        match self {
            Partial::PredatesStart => "predates_start",
            Partial::DecidedAtShutdown => "decided_at_shutdown",
            Partial::Evicted => "evicted",
            Partial::StoreUnavailable => "store_unavailable",
            Partial::AmbiguousServerHalf => "ambiguous_server_half",
        }
    }

    /// The verdict's `reason` when the cap is what decided it.
    pub fn reason(self) -> &'static str {
        match self {
            Partial::PredatesStart => "partial_predates_start",
            Partial::DecidedAtShutdown => "partial_decided_at_shutdown",
            Partial::Evicted => "partial_evicted",
            Partial::StoreUnavailable => "partial_store_unavailable",
            Partial::AmbiguousServerHalf => "ambiguous_server_half",
        }
    }
}

/// The classifier's answer for one call attempt.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Verdict {
    #[serde(serialize_with = "ser_hex")]
    pub trace_id: TraceId,
    #[serde(serialize_with = "ser_hex")]
    pub span_id: SpanId,
    pub method: Option<String>,
    pub tool: Option<Arc<str>>,
    pub server: Option<Arc<str>>,
    pub request_id: Option<Box<str>>,
    /// SHA-256 of the session key `session:<mcp.session.id>`: joinable with catalog verdicts and
    /// the gate's answers, not reusable as a session id.
    pub session_id_hash: Option<Arc<str>>,
    pub first_failed_layer: Option<Layer>,
    pub layers: Layers,
    pub state: HealthState,
    /// The sanitized failure class (`connection_refused`, `jsonrpc_-32601`, `insufficient_scope`).
    pub reason: Option<String>,
    pub confidence: Confidence,
    /// What to do next; most are fixed texts, so a verdict borrows them.
    pub next_action: Cow<'static, str>,
    /// False when an automatic retry could repeat a side effect.
    pub retry_safe: bool,
    pub protocol_success: bool,
    pub verified_success: bool,
    pub required_scope: Option<Box<str>>,
    /// Hash of the credential the call used (`mcp_health.auth.credential_id`), for grouping.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credential_hash: Option<Box<str>>,
    /// An approved authorization flow is pending: waiting, not stuck.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub auth_flow_pending: bool,
    /// The client's `service.name`: the affected agent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<Arc<str>>,
    /// Progress evidence of a long call (SPEC section 5), when there was any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<ProgressFindings>,
    /// What changed against the pin, for `contract_drift`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub contract_changes: Vec<ContractChange>,
    pub outcome_method: Option<&'static str>,
    /// The provenance of the receipt the outcome rests on (`unsigned` when no trusted key is
    /// configured, `signed` by a trusted key); absent when no receipt decided the outcome.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome_trust: Option<crate::evidence::receipt::ReceiptTrust>,
    pub revision: u32,
    /// For a revision: what the previous verdict of this call said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub supersedes: Option<Superseded>,
    pub decided_by: DecidedBy,
    /// Set when the call's evidence may be split (started before this engine, decided at
    /// shutdown or by eviction): then never `healthy` (see `classify::partial`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partial: Option<Partial>,
    pub start_ns: u64,
    pub end_ns: u64,
    /// The protocol revision the call's evidence spoke (`2025-11-25`, `2026-07-28`, `unknown`).
    pub protocol_revision: crate::evidence::ProtocolRevision,
    /// The exact protocol version the call spoke (`2026-12-15` beside its family `2026-07-28`),
    /// when a span named a dated one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol_version: Option<Arc<str>>,
    /// Whether this verdict is an attempt in the success rates (SPEC section 2): a logical
    /// `tools/call` (all its rounds are one), or a session setup (`initialize`,
    /// `server/discover`) that failed; never a `ping`, a successful setup, a list, or a server
    /// half that could not be joined to exactly one client half.
    pub attempt: bool,
    /// Rounds of a multi-round-trip call (2026-07-28 `input_required`), when more than one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rounds: Option<u32>,
    /// The status of the task the call ran as (the tasks extension), when it ran as one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task_status: Option<crate::evidence::TaskStatus>,
    /// Which spans the verdict rests on, by kind and instrumentation: for the status page, which
    /// explains a verdict. Never in a verdict line (replay output stays as it was).
    #[serde(skip)]
    pub chain: EvidenceChain,
    /// The server's request span the verdict rests on, when it has one (see
    /// `CallEvidence::server_span`). Never in a verdict line.
    #[serde(skip)]
    pub server_span_id: Option<SpanId>,
}

impl Verdict {
    /// Whether the call was a `tools/call`, the calls with an outcome to verify (the method is
    /// kept by the evidence model's vocabulary, so its spelling there is the one to compare).
    pub(crate) fn is_tools_call(&self) -> bool {
        self.method.as_deref() == Some(Method::ToolsCall.as_str())
    }

    /// An attempt no span shows answered, and none shows failed (the `mcp` SDK's client span
    /// alone, a setup nobody answered): neither a protocol success nor a failure. Counted beside
    /// the success rates, so a rate over unconfirmed attempts is not read as an outage or a success.
    pub fn unconfirmed(&self) -> bool {
        self.attempt && !self.protocol_success && self.first_failed_layer.is_none() && !self.state.is_failure()
    }
}

// What kind of evidence a span was and the chain of them are the evidence model's (a call
// counts them as it absorbs spans); a verdict carries them.
pub use crate::evidence::chain::{EvidenceChain, SpanKind};

/// The verdict a revision replaces: enough to count the change, not the call twice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Superseded {
    pub state: HealthState,
    pub protocol_success: bool,
    pub verified_success: bool,
    /// It was [`Verdict::unconfirmed`]. Not in a verdict line.
    #[serde(skip)]
    pub unconfirmed: bool,
}

fn ser_hex<S: serde::Serializer, const N: usize>(b: &[u8; N], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&hex::encode(b))
}

// What the classifier found, carried in a verdict: plain data, so the verdict type depends on
// nothing above it (classify/ re-exports these where they are made).

/// One semantic change of a tool contract.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ContractChange {
    ParameterAdded {
        parameter: String,
    },
    ParameterRemoved {
        parameter: String,
    },
    /// One parameter removed and one added with the same schema otherwise.
    ParameterRenamed {
        from: String,
        to: String,
    },
    RequiredChanged {
        now_required: Vec<String>,
        no_longer_required: Vec<String>,
    },
    TypeChanged {
        parameter: String,
        from: String,
        to: String,
    },
    EnumNarrowed {
        parameter: String,
        removed: Vec<String>,
    },
    EnumWidened {
        parameter: String,
        added: Vec<String>,
    },
    /// The tool's description (`parameter: None`) or a parameter's changed: semantic drift.
    DescriptionChanged {
        parameter: Option<String>,
    },
    AnnotationFlipped {
        annotation: String,
        from: String,
        to: String,
    },
    OutputSchemaChanged,
    TitleChanged,
    ExecutionChanged,
    /// A schema change none of the above names (e.g. a `minimum`).
    ParameterSchemaChanged {
        parameter: String,
    },
}

impl ContractChange {
    /// Every kind, as `kind` names it (the `kind` of a drift line): one SARIF rule each.
    pub const KINDS: [&'static str; 13] = [
        "parameter_added",
        "parameter_removed",
        "parameter_renamed",
        "required_changed",
        "type_changed",
        "enum_narrowed",
        "enum_widened",
        "description_changed",
        "annotation_flipped",
        "output_schema_changed",
        "title_changed",
        "execution_changed",
        "parameter_schema_changed",
    ];

    /// The kind of change, as it is serialized (`"kind": "parameter_renamed"`).
    pub fn kind(&self) -> &'static str {
        use ContractChange::*;
        match self {
            ParameterAdded { .. } => "parameter_added",
            ParameterRemoved { .. } => "parameter_removed",
            ParameterRenamed { .. } => "parameter_renamed",
            RequiredChanged { .. } => "required_changed",
            TypeChanged { .. } => "type_changed",
            EnumNarrowed { .. } => "enum_narrowed",
            EnumWidened { .. } => "enum_widened",
            DescriptionChanged { .. } => "description_changed",
            AnnotationFlipped { .. } => "annotation_flipped",
            OutputSchemaChanged => "output_schema_changed",
            TitleChanged => "title_changed",
            ExecutionChanged => "execution_changed",
            ParameterSchemaChanged { .. } => "parameter_schema_changed",
        }
    }

    /// A short human sentence.
    pub fn describe(&self) -> String {
        use ContractChange::*;
        match self {
            ParameterAdded { parameter } => format!("parameter `{parameter}` added"),
            ParameterRemoved { parameter } => format!("parameter `{parameter}` removed"),
            ParameterRenamed { from, to } => format!("parameter `{from}` renamed to `{to}`"),
            RequiredChanged { now_required, no_longer_required } => {
                format!("required changed: now required {now_required:?}, no longer required {no_longer_required:?}")
            }
            TypeChanged { parameter, from, to } => format!("parameter `{parameter}` type changed from {from} to {to}"),
            EnumNarrowed { parameter, removed } => format!("enum of `{parameter}` narrowed: {removed:?} removed"),
            EnumWidened { parameter, added } => format!("enum of `{parameter}` widened: {added:?} added"),
            DescriptionChanged { parameter: None } => "tool description changed".into(),
            DescriptionChanged { parameter: Some(p) } => format!("description of `{p}` changed"),
            AnnotationFlipped { annotation, from, to } => format!("annotation `{annotation}` changed from {from} to {to}"),
            OutputSchemaChanged => "output schema changed".into(),
            TitleChanged => "title changed".into(),
            ExecutionChanged => "execution settings changed".into(),
            ParameterSchemaChanged { parameter } => format!("schema of `{parameter}` changed"),
        }
    }
}

/// Why a progress notification was not valid evidence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProgressIssue {
    /// The request supplied no progress token (or it was not observed): nothing can be validated.
    TokenNotSupplied,
    /// A token other than the one the request supplied.
    WrongToken,
    /// A value not greater than the previous valid one.
    NoIncrease,
    /// After the terminal response.
    AfterCompletion,
}

/// What the progress evidence of a call says.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ProgressFindings {
    pub valid_updates: u32,
    pub issues: Vec<ProgressIssue>,
    pub last_valid_ns: Option<u64>,
    pub last_value: Option<f64>,
    pub total: Option<f64>,
}

/// A plain verdict for tests of the code that reads verdicts (tallies, summaries): passed
/// layers, `healthy` when verified else `unverified`.
#[cfg(test)]
pub(crate) fn sample(method: &str, protocol_success: bool, verified_success: bool) -> Verdict {
    Verdict {
        trace_id: [1; 16],
        span_id: [2; 8],
        method: Some(method.into()),
        tool: Some(Arc::from("t")),
        server: None,
        request_id: None,
        session_id_hash: None,
        first_failed_layer: None,
        layers: Layers([LayerStatus::Passed; 5]),
        state: if verified_success { HealthState::Healthy } else { HealthState::Unverified },
        reason: None,
        confidence: Confidence::High,
        next_action: Cow::Borrowed(""),
        retry_safe: true,
        protocol_success,
        verified_success,
        required_scope: None,
        progress: None,
        credential_hash: None,
        auth_flow_pending: false,
        agent: None,
        contract_changes: vec![],
        outcome_method: None,
        outcome_trust: None,
        revision: 0,
        supersedes: None,
        decided_by: DecidedBy::Quiet,
        partial: None,
        start_ns: 0,
        end_ns: 0,
        protocol_revision: crate::evidence::ProtocolRevision::Unknown,
        protocol_version: None,
        attempt: Method::parse(method) == Method::ToolsCall,
        rounds: None,
        task_status: None,
        chain: EvidenceChain::default(),
        server_span_id: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_of_each_first_failed_layer() {
        let table = [
            (Some(Layer::Transport), Owner::ServerOncall, "server-oncall"),
            (Some(Layer::Protocol), Owner::ClientImplementer, "client-implementer"),
            (Some(Layer::Authorization), Owner::CredentialOwner, "credential-owner"),
            (Some(Layer::Execution), Owner::ToolOwner, "tool-owner"),
            (Some(Layer::Outcome), Owner::OutcomeOwner, "outcome-owner"),
            (None, Owner::IntegrationOwner, "integration-owner"),
        ];
        for (layer, owner, name) in table {
            assert_eq!(Owner::of(layer), owner, "{layer:?}");
            assert_eq!(owner.as_str(), name);
            assert_eq!(serde_json::to_value(owner).unwrap(), name, "serialized as the receiver's name");
        }
        let mut names: Vec<&str> = Owner::ALL.iter().map(|o| o.as_str()).collect();
        names.dedup();
        assert_eq!(names.len(), Owner::ALL.len(), "every owner has its own name");
    }

    /// The alert rules and the status page name the same owner: every route of
    /// otel-config/alertmanager.yml that matches a `first_failed_layer` goes to the receiver
    /// [`Owner::of`] names, and every layer (and `none`) has such a route.
    #[test]
    fn alertmanager_routes_each_first_failed_layer_to_its_owner() {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/otel-config/alertmanager.yml")).unwrap();
        let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
        let receivers: Vec<&str> = doc["receivers"].as_sequence().unwrap().iter().filter_map(|r| r["name"].as_str()).collect();
        let mut routed = Vec::new();
        for route in doc["route"]["routes"].as_sequence().expect("route.routes") {
            let receiver = route["receiver"].as_str().expect("a route names its receiver");
            assert!(receivers.contains(&receiver), "{receiver} is a receiver");
            for m in route["matchers"].as_sequence().into_iter().flatten().filter_map(|m| m.as_str()) {
                let Some(value) = m.strip_prefix("first_failed_layer=\"").and_then(|v| v.strip_suffix('"')) else { continue };
                let layer = match value {
                    "none" => None,
                    l => Some(Layer::ALL.into_iter().find(|x| x.as_str() == l).unwrap_or_else(|| panic!("unknown layer {l}"))),
                };
                assert_eq!(receiver, Owner::of(layer).as_str(), "the route of first_failed_layer={value}");
                routed.push(layer);
            }
        }
        for layer in Layer::ALL.into_iter().map(Some).chain([None]) {
            assert!(routed.contains(&layer), "no route for first_failed_layer {layer:?}");
        }
    }

    #[test]
    fn jsonrpc_codes_in_words() {
        let table = [
            (-32700, "parse error"),
            (-32600, "invalid request"),
            (-32601, "method not found"),
            (-32602, "invalid params"),
            (-32603, "internal error"),
            (-32002, "resource not found"),
            (-32022, "unsupported protocol version"),
            (-32021, "missing required client capability"),
            (-32000, "connection closed (client SDK)"),
            (-32001, "request timeout (client SDK)"),
            (-32050, "server error (implementation-defined)"),
            (42, "not a defined code"),
        ];
        for (code, words) in table {
            assert_eq!(jsonrpc_meaning(code), words, "{code}");
        }
        let reasons = [
            ("jsonrpc_-32601", Some("method not found")),
            ("initialize_failed_jsonrpc_-32602", Some("invalid params")),
            ("insufficient_scope", None),
            ("jsonrpc_x", None),
        ];
        for (reason, words) in reasons {
            assert_eq!(reason_meaning(reason), words, "{reason}");
        }
    }
}
