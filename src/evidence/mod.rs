//! The evidence model: what one span told us, in one vocabulary whatever instrumentation wrote it.
//!
//! Plain data, no I/O. Every field is optional because every instrumentation is partial: a field
//! that no span set stays `None`, and the classifier treats `None` as "not observed", never as
//! "fine". Free text from the wire (messages, arguments, results, headers) has no field here, so it
//! cannot leak out of the service by construction.

pub mod attributes;
pub mod call;
pub mod catalog;
pub mod chain;
pub mod digest;
pub mod hash;
pub mod receipt;
pub mod time;

use std::sync::Arc;

/// A W3C trace id.
pub type TraceId = [u8; 16];
/// A W3C span id.
pub type SpanId = [u8; 8];

/// Which side of the exchange a span describes, from its span kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Side {
    Client,
    Server,
    Internal,
}

/// Which instrumentation wrote a span: the dialect that read it, or the wire tap. Kept so an
/// evidence chain can say where each of its spans came from (the status page), nothing more.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Instrumentation {
    #[default]
    Unknown,
    McpSdk,
    Fastmcp,
    Traceloop,
    Logfire,
    Semconv,
    /// `mcp-health tap` (scope `mcp-health-tap`), whatever dialect read it.
    Tap,
}

impl Instrumentation {
    pub const ALL: [Instrumentation; 7] = [
        Instrumentation::Unknown,
        Instrumentation::McpSdk,
        Instrumentation::Fastmcp,
        Instrumentation::Traceloop,
        Instrumentation::Logfire,
        Instrumentation::Semconv,
        Instrumentation::Tap,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            Instrumentation::Unknown => "unknown",
            Instrumentation::McpSdk => "mcp_sdk",
            Instrumentation::Fastmcp => "fastmcp",
            Instrumentation::Traceloop => "traceloop",
            Instrumentation::Logfire => "logfire",
            Instrumentation::Semconv => "semconv",
            Instrumentation::Tap => "tap",
        }
    }
    /// The instrumentation of a dialect's name (`normalize::Dialect::name`).
    pub fn of_dialect(name: &str) -> Instrumentation {
        Instrumentation::ALL.into_iter().find(|i| i.as_str() == name).unwrap_or_default()
    }
}

/// The MCP method. A method outside the specification's list is client-chosen text, kept as
/// `other` or `notifications/other` (see [`MethodName`]); nothing the client wrote is stored.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Method {
    ToolsCall,
    ToolsList,
    Initialize,
    Other(MethodName),
}

/// The MCP method names of the specification (2025-11-25 and 2026-07-28), the one list every
/// method name is kept by. A method outside it is client-chosen text: it becomes `other` (or
/// `notifications/other`), never a label.
pub(crate) const MCP_METHODS: &[&str] = &[
    "initialize",
    "ping",
    "server/discover",
    "subscriptions/listen",
    "tools/list",
    "tools/call",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "prompts/list",
    "prompts/get",
    "completion/complete",
    "logging/setLevel",
    "sampling/createMessage",
    "elicitation/create",
    "roots/list",
    "tasks/get",
    "tasks/list",
    "tasks/result",
    "tasks/cancel",
    "notifications/initialized",
    "notifications/cancelled",
    "notifications/progress",
    "notifications/message",
    "notifications/resources/updated",
    "notifications/resources/list_changed",
    "notifications/tools/list_changed",
    "notifications/prompts/list_changed",
    "notifications/roots/list_changed",
    "notifications/elicitation/complete",
    "notifications/tasks/status",
];

/// A method name of the fixed vocabulary (`MCP_METHODS`, else `other` / `notifications/other`):
/// a pointer to a static name, 8 bytes, so that a `Option<Method>` is 16 (every span holds one).
/// Reads as the name (`&*m`); stored as the name.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct MethodName(&'static &'static str);

static OTHER_METHOD: &str = "other";
static OTHER_NOTIFICATION: &str = "notifications/other";

impl MethodName {
    /// The name as the vocabulary keeps it.
    pub fn of(s: &str) -> MethodName {
        match MCP_METHODS.iter().find(|m| **m == s) {
            Some(m) => MethodName(m),
            None if s.starts_with("notifications/") => MethodName(&OTHER_NOTIFICATION),
            None => MethodName(&OTHER_METHOD),
        }
    }

    /// The name itself, which outlives any one `MethodName`.
    pub(crate) fn as_str(self) -> &'static str {
        self.0
    }
}

impl std::ops::Deref for MethodName {
    type Target = str;
    fn deref(&self) -> &str {
        self.0
    }
}

impl std::fmt::Debug for MethodName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(*self.0, f)
    }
}

impl serde::Serialize for MethodName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.0)
    }
}

impl<'de> serde::Deserialize<'de> for MethodName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<MethodName, D::Error> {
        let s = std::borrow::Cow::<'de, str>::deserialize(d)?;
        Ok(MethodName::of(&s))
    }
}

impl Method {
    pub fn parse(s: &str) -> Method {
        match s {
            "tools/call" => Method::ToolsCall,
            "tools/list" => Method::ToolsList,
            "initialize" => Method::Initialize,
            other => Method::Other(MethodName::of(other)),
        }
    }
    pub fn as_str(&self) -> &str {
        match self {
            Method::ToolsCall => "tools/call",
            Method::ToolsList => "tools/list",
            Method::Initialize => "initialize",
            Method::Other(s) => s,
        }
    }
    /// The name, as the vocabulary keeps it (a method outside it is `other`).
    pub fn static_name(&self) -> &'static str {
        match self {
            Method::ToolsCall => "tools/call",
            Method::ToolsList => "tools/list",
            Method::Initialize => "initialize",
            Method::Other(s) => s.as_str(),
        }
    }
    /// A session setup request: `initialize` (2025-11-25) or `server/discover` (2026-07-28). One
    /// that fails is a failed attempt (SPEC section 2): the agent could not start its work.
    pub fn is_setup(&self) -> bool {
        matches!(self, Method::Initialize) || matches!(self, Method::Other(n) if &**n == "server/discover")
    }

    /// Whether this is `name` (for methods without a variant of their own).
    pub fn is(&self, name: &str) -> bool {
        self.as_str() == name
    }

    /// Notifications have no response, so no layer beyond transport can be observed for them.
    pub fn is_notification(&self) -> bool {
        matches!(self, Method::Other(s) if s.starts_with("notifications/"))
    }
}

/// A connection-level result, as the project's `mcp_health.transport.outcome` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum TransportOutcome {
    Ok,
    DnsFailure,
    ConnectionRefused,
    ConnectionReset,
    TlsFailure,
    Timeout,
}

impl TransportOutcome {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "ok" => Self::Ok,
            "dns_failure" => Self::DnsFailure,
            "connection_refused" => Self::ConnectionRefused,
            "connection_reset" => Self::ConnectionReset,
            "tls_failure" => Self::TlsFailure,
            "timeout" => Self::Timeout,
            _ => return None,
        })
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::DnsFailure => "dns_failure",
            Self::ConnectionRefused => "connection_refused",
            Self::ConnectionReset => "connection_reset",
            Self::TlsFailure => "tls_failure",
            Self::Timeout => "timeout",
        }
    }
    /// Failures after which the request may have reached the server (and committed an effect).
    pub fn may_have_delivered(self) -> bool {
        matches!(self, Self::Timeout | Self::ConnectionReset)
    }
}

/// The `error` parameter of a `WWW-Authenticate` challenge, reduced to a fixed vocabulary so
/// nothing the server wrote verbatim is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum AuthError {
    InvalidToken,
    InsufficientScope,
    InvalidRequest,
    MissingToken,
    Other,
}

impl AuthError {
    pub fn parse(s: &str) -> Self {
        match s {
            "invalid_token" => Self::InvalidToken,
            "insufficient_scope" => Self::InsufficientScope,
            "invalid_request" => Self::InvalidRequest,
            "missing_token" => Self::MissingToken,
            _ => Self::Other,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidToken => "invalid_token",
            Self::InsufficientScope => "insufficient_scope",
            Self::InvalidRequest => "invalid_request",
            Self::MissingToken => "missing_token",
            Self::Other => "other",
        }
    }
}

/// What an outcome verifier found at the destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum OutcomeResult {
    Confirmed,
    Missing,
    Failed,
    Stale,
    /// The verifier could not run (unreachable, timed out, a pointer that resolved to nothing, a
    /// template error, a full queue): no finding. Never read from `mcp_health.outcome.result`
    /// (only from `mcp_health.outcome.error`), never a pass, and never the latest outcome: the
    /// outcome layer stays unobserved, with reason `verifier_error`. Last in the enum so that
    /// records stored before it was added still decode.
    VerifierError,
}

impl OutcomeResult {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "confirmed" => Self::Confirmed,
            "missing" => Self::Missing,
            "failed" => Self::Failed,
            "stale" => Self::Stale,
            _ => return None,
        })
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Confirmed => "confirmed",
            Self::Missing => "missing",
            Self::Failed => "failed",
            Self::Stale => "stale",
            Self::VerifierError => "verifier_error",
        }
    }
}

/// How a verifier checked. An LLM judge is weak evidence: it lowers confidence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum VerifierMethod {
    FileDigest,
    RowVersion,
    HttpStatus,
    TestResult,
    Receipt,
    LlmJudge,
    Unspecified,
}

impl VerifierMethod {
    pub fn parse(s: &str) -> Self {
        match s {
            "file_digest" => Self::FileDigest,
            "row_version" => Self::RowVersion,
            "http_status" => Self::HttpStatus,
            "test_result" => Self::TestResult,
            "receipt" => Self::Receipt,
            "llm_judge" => Self::LlmJudge,
            _ => Self::Unspecified,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Self::FileDigest => "file_digest",
            Self::RowVersion => "row_version",
            Self::HttpStatus => "http_status",
            Self::TestResult => "test_result",
            Self::Receipt => "receipt",
            Self::LlmJudge => "llm_judge",
            Self::Unspecified => "unspecified",
        }
    }
    pub fn is_weak(self) -> bool {
        matches!(self, Self::LlmJudge | Self::Unspecified)
    }
}

/// One verifier's finding about a destination.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OutcomeReceipt {
    pub result: OutcomeResult,
    pub method: VerifierMethod,
    pub checked_at_ns: u64,
    /// The request id of the call it checked, when the verifier names one.
    pub request_id: Option<Box<str>>,
    /// Its provenance (see [`receipt`]): an `untrusted` receipt is never evidence.
    pub trust: receipt::ReceiptTrust,
}

/// One progress notification (SPEC section 5).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ProgressMark {
    pub token: Box<str>,
    pub value: f64,
    pub total: Option<f64>,
    pub at_ns: u64,
}

/// What the version/capability negotiation of a session showed.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Negotiation {
    pub requested_version: Option<Box<str>>,
    pub version_accepted: Option<bool>,
    pub missing_capabilities: Vec<Box<str>>,
}

/// Whether a tool may commit a side effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum EffectBoundary {
    SideEffect,
    None,
}

/// The JSON-RPC / tool error a span reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum CallError {
    /// A JSON-RPC error response with this code. 32 bits, as every JSON-RPC and MCP error code
    /// is (the reserved range is -32768..-32000; the SDKs' codes are ints): a code outside it is
    /// kept as the nearest `i32` by [`CallError::jsonrpc`] (still a JSON-RPC error, and still
    /// outside every range the classifier reads). 8 bytes with its tag: every span holds one.
    JsonRpc(i32),
    /// A result with `isError: true`.
    ToolError,
    /// The instrumentation reported a timeout (`error.type` of a timeout class).
    Timeout,
    /// The instrumentation reported a connection failure by exception class.
    Connection(TransportOutcome),
    /// The server does not know the tool it was asked to run (FastMCP reports it as an `isError`
    /// result with `error.type=NotFoundError`; SPEC §3 puts an unknown tool in `protocol_error`).
    UnknownTool,
    /// Some other error class that says nothing about the layer.
    Unclassified,
}

impl CallError {
    /// A JSON-RPC error response with `code`, normalized the one way every source (each dialect and
    /// the tap's spans) is read: code `0`, which no JSON-RPC error defines, is what the `mcp` SDKs
    /// answer for an uncaught server exception, so it is read as `-32603` (internal error). One
    /// failure then has one reason, and one incident, whoever reported it.
    pub fn jsonrpc(code: i64) -> CallError {
        let code = normalize_jsonrpc_code(code).clamp(i64::from(i32::MIN), i64::from(i32::MAX));
        CallError::JsonRpc(code as i32)
    }
}

/// The JSON-RPC codes MCP client SDKs make up themselves for what happened on their side of the
/// wire, read on a CLIENT span as the client's transport failure (docs/attributes.md has the
/// table, with the sources): never the server's protocol error. Servers send some of them too
/// (-32000 for HTTP-level rejections in the TypeScript, C# and Kotlin SDKs, -32001 for "session
/// not found"): where a server span of the call reports the code, the server's code stands.
/// Either way the exchange did not complete, so nothing is read greener than it was.
pub fn client_local_code(code: i64) -> Option<TransportOutcome> {
    Some(match code {
        // Python `mcp` CONNECTION_CLOSED (also FastMCP, the TypeScript SDK 1.x, Kotlin): the
        // connection closed before the response. The request may have been delivered.
        -32000 => TransportOutcome::ConnectionReset,
        // Python `mcp` 2.x REQUEST_TIMEOUT (also the TypeScript SDK 1.x, Kotlin); 408: the Python
        // `mcp` 1.x and FastMCP's connect timeout.
        -32001 | 408 => TransportOutcome::Timeout,
        // Go: jsonrpc2 ErrClientClosing and ErrServerClosing (the connection is going away).
        -32003 | -32004 => TransportOutcome::ConnectionReset,
        // Go: ErrRejected (HTTP 429, 502, 503, 504: the transport refused this one request).
        -32005 => TransportOutcome::ConnectionRefused,
        // Python `mcp` 1.x "Session terminated" (an HTTP 404 on the session, a positive code).
        32600 => TransportOutcome::ConnectionReset,
        _ => return None,
    })
}

/// See [`CallError::jsonrpc`]: the single mapping of a reported JSON-RPC error code.
pub fn normalize_jsonrpc_code(code: i64) -> i64 {
    if code == 0 {
        -32603
    } else {
        code
    }
}

/// The MCP protocol revision a request spoke. 2025-11-25 and earlier share the `initialize`
/// handshake and sessions; 2026-07-28 and later have neither (per-request `_meta`,
/// `server/discover`, `subscriptions/listen`, multi-round-trip requests, the new error codes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum ProtocolRevision {
    /// The handshake era: `2025-11-25` or an earlier dated revision, or a request that only that
    /// era has (`initialize`).
    #[serde(rename = "2025-11-25")]
    Handshake,
    /// `2026-07-28` or a later dated revision, or a method only it has (`server/discover`,
    /// `subscriptions/listen`).
    #[serde(rename = "2026-07-28")]
    Stateless,
    /// Nothing said which.
    #[default]
    #[serde(rename = "unknown")]
    Unknown,
}

/// Whether `v` is a protocol version as the specification writes them (`YYYY-MM-DD`): only such a
/// version is reported as spoken (anything else a client sent is not echoed).
pub fn is_dated_version(v: &str) -> bool {
    let b = v.as_bytes();
    b.len() == 10 && b.iter().enumerate().all(|(i, c)| if i == 4 || i == 7 { *c == b'-' } else { c.is_ascii_digit() })
}

/// The first revision without the `initialize` handshake.
pub const STATELESS_REVISION: &str = "2026-07-28";

impl ProtocolRevision {
    /// From a dated version string (`YYYY-MM-DD`); anything else says nothing. The one answer
    /// to "this revision or later": a version after 2026-07-28 (2026-12-15, announced) is of the
    /// stateless family until one is known to differ.
    pub fn of_version(v: &str) -> ProtocolRevision {
        match is_dated_version(v) {
            true if v >= STATELESS_REVISION => ProtocolRevision::Stateless,
            true => ProtocolRevision::Handshake,
            false => ProtocolRevision::Unknown,
        }
    }

    /// From a method only one era has.
    pub fn of_method(m: &Method) -> ProtocolRevision {
        match m {
            Method::Initialize => ProtocolRevision::Handshake,
            Method::Other(n) if matches!(&**n, "server/discover" | "subscriptions/listen") => ProtocolRevision::Stateless,
            _ => ProtocolRevision::Unknown,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ProtocolRevision::Handshake => "2025-11-25",
            ProtocolRevision::Stateless => STATELESS_REVISION,
            ProtocolRevision::Unknown => "unknown",
        }
    }
}

/// What kind of result a request got (2026-07-28 `resultType`): a final one, a request for more
/// input (the call goes on in another round), or a task handle (the call goes on as a task).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResultType {
    Complete,
    InputRequired,
    Task,
}

impl ResultType {
    pub fn parse(s: &str) -> Option<ResultType> {
        Some(match s {
            "complete" => ResultType::Complete,
            "input_required" => ResultType::InputRequired,
            "task" => ResultType::Task,
            _ => return None,
        })
    }
    pub fn as_str(self) -> &'static str {
        match self {
            ResultType::Complete => "complete",
            ResultType::InputRequired => "input_required",
            ResultType::Task => "task",
        }
    }
}

/// A task's status (the 2026-07-28 tasks extension).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskStatus {
    Working,
    InputRequired,
    Completed,
    Failed,
    Cancelled,
    /// The server no longer knows the task (a `tasks/get` answered with an error): it expired or
    /// was never there. No terminal status was seen.
    Gone,
}

impl TaskStatus {
    pub fn parse(s: &str) -> Option<TaskStatus> {
        Some(match s {
            "working" => TaskStatus::Working,
            "input_required" => TaskStatus::InputRequired,
            "completed" => TaskStatus::Completed,
            "failed" => TaskStatus::Failed,
            "cancelled" => TaskStatus::Cancelled,
            "gone" => TaskStatus::Gone,
            _ => return None,
        })
    }
    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Working => "working",
            TaskStatus::InputRequired => "input_required",
            TaskStatus::Completed => "completed",
            TaskStatus::Failed => "failed",
            TaskStatus::Cancelled => "cancelled",
            TaskStatus::Gone => "gone",
        }
    }
    /// `completed`, `failed` and `cancelled` never change again.
    pub fn is_terminal(self) -> bool {
        matches!(self, TaskStatus::Completed | TaskStatus::Failed | TaskStatus::Cancelled)
    }
}

/// What one span said about the rounds of a logical call: its result type, the hashes of the
/// `requestState` it was handed (an `input_required` result) or echoed (a retry), and a task's
/// status with its timing hints. Hashes only: a `requestState` may carry anything.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RoundFacts {
    pub result_type: Option<ResultType>,
    /// Hash of the `requestState` an `input_required` result carried.
    pub state_issued: Option<Box<str>>,
    /// Hash of the `requestState` this request echoed (it continues the round that issued it).
    pub state_echoed: Option<Box<str>>,
    /// Hash of the task id this span is about (a `tools/call` answered with a task, a
    /// `tasks/get` poll, a `tasks/cancel`).
    pub task_id: Option<Box<str>>,
    pub task_status: Option<TaskStatus>,
    pub task_poll_interval_ms: Option<u64>,
    pub task_ttl_ms: Option<u64>,
}

/// Everything one span said, in this project's vocabulary.
///
/// What ordinary client and server spans of a call carry (ids, times, method, tool, request and
/// session ids, server, errors, HTTP status, transport, verifier receipts) is held inline; what
/// few spans carry (authorization, negotiation, progress, catalog facts, execution and effect
/// facts, operation keys) is in one [`RareEvidence`] box, allocated when the first of its fields
/// is written. The struct derefs to that box, so every field reads and writes as its own
/// (`ev.auth_status`, `ev.catalog = ...`); a span that sets none of them reads them from one
/// shared empty [`RareEvidence`]. An in-flight chain holds its spans for `decision_wait`, so
/// their size is the correlator's memory per chain (issue 11: at most 1 KB of RSS per chain;
/// `span_evidence_stays_small` pins the size).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SpanEvidence {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    pub parent_span_id: Option<SpanId>,
    pub side: Side,
    pub start_ns: u64,
    pub end_ns: u64,
    pub method: Option<Method>,
    pub tool: Option<Arc<str>>,
    pub request_id: Option<Box<str>>,
    pub session_id: Option<Arc<str>>,
    pub protocol_version: Option<Arc<str>>,
    /// `server.address[:server.port]`.
    pub server: Option<Arc<str>>,
    pub error: Option<CallError>,
    /// The span's status was ERROR (without saying why).
    pub status_error: bool,
    pub http_status: Option<u16>,
    pub transport: Option<TransportOutcome>,
    pub request_sent: Option<bool>,
    pub outcomes: Outcomes,
    /// The span only marks that the request was sent (`mcp_health.call.phase=request_sent`).
    pub request_sent_marker: bool,
    /// The JSON-RPC error on this client span may be the client's own rendering of a refused
    /// HTTP request (the `mcp` SDK 2.x client answers any HTTP status >= 400 with `-32603`), not
    /// a response from the server. Set by the dialects that know it.
    pub error_maybe_client_rendered: bool,
    /// An HTTP server span on an MCP endpoint (a path ending in `/mcp`): eligible for the
    /// cross-trace join of refused requests (see `correlate::crossjoin`).
    pub http_mcp_endpoint: bool,
    /// The request span ended without any response observed (cancelled: traceloop's UNSET status,
    /// logfire's span with neither a response nor an error). Unlike `request_sent_marker` it is
    /// no sign of a call still in flight.
    pub response_unobserved: bool,
    /// `service.name` of the resource that emitted the span (the client's identity where the
    /// protocol has no session).
    pub service: Option<Arc<str>>,
    /// Who wrote the span (for the evidence chain the status page shows). Not stored: the state
    /// store's records keep their layout, and a chain restored from it shows `unknown`.
    #[serde(skip)]
    pub instrumentation: Instrumentation,
    /// The fields few spans set (see the type's documentation); read and written through
    /// `Deref`/`DerefMut`.
    rare: Rare,
}

/// A span's verifier receipts (most spans have none, a verifier span one): a boxed slice exactly
/// as long as it is, 16 bytes inline, with the `Vec` methods the dialects use; reads as a slice.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcomes(Box<[OutcomeReceipt]>);

impl Outcomes {
    pub fn new() -> Outcomes {
        Outcomes(Box::default())
    }

    /// Add one receipt (the slice grows by exactly one).
    pub fn push(&mut self, r: OutcomeReceipt) {
        let mut v = std::mem::take(&mut self.0).into_vec();
        v.reserve_exact(1);
        v.push(r);
        self.0 = v.into_boxed_slice();
    }
}

impl std::ops::Deref for Outcomes {
    type Target = [OutcomeReceipt];
    fn deref(&self) -> &[OutcomeReceipt] {
        &self.0
    }
}

impl From<Vec<OutcomeReceipt>> for Outcomes {
    fn from(v: Vec<OutcomeReceipt>) -> Outcomes {
        Outcomes(v.into_boxed_slice())
    }
}

impl<'a> IntoIterator for &'a Outcomes {
    type Item = &'a OutcomeReceipt;
    type IntoIter = std::slice::Iter<'a, OutcomeReceipt>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

/// Stored as a sequence, as the `Vec` it replaced.
impl serde::Serialize for Outcomes {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> serde::Deserialize<'de> for Outcomes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Outcomes, D::Error> {
        Vec::<OutcomeReceipt>::deserialize(d).map(Outcomes::from)
    }
}

/// What few spans carry: boxed once per span that sets any of it (see [`SpanEvidence`]).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RareEvidence {
    pub auth_error: Option<AuthError>,
    pub auth_status: Option<u16>,
    pub required_scope: Option<Box<str>>,
    /// SHA-256 (hex, first 32 chars) of `mcp_health.auth.credential_id`.
    pub credential_hash: Option<Box<str>>,
    /// `mcp_health.auth.flow` = `pending`.
    pub auth_flow_pending: Option<bool>,
    pub negotiation: Option<Negotiation>,
    pub exec_timeout: bool,
    pub output_schema_violated: Option<bool>,
    pub effect_boundary: Option<EffectBoundary>,
    pub operation_key: Option<Box<str>>,
    /// A `notifications/progress` span's progress.
    pub progress: Option<Box<ProgressMark>>,
    /// The progress token a request span says the request supplied.
    pub progress_token: Option<Box<str>>,
    /// Catalog facts (signals, `tools/list` pages, installs).
    pub catalog: Option<Box<catalog::CatalogFacts>>,
    /// What the verifier span said about itself (rule name, error class, duration), for the
    /// verifier metrics only. Not stored: a decided chain is re-read for its receipts, not for
    /// how its verifiers ran.
    #[serde(skip)]
    pub finding: Option<Box<FindingMeta>>,
    /// Multi-round and task facts (2026-07-28), see [`RoundFacts`].
    pub round: Option<Box<RoundFacts>>,
    /// What tells this request's client apart from other clients (see [`JoinKeys`]). Not stored:
    /// a chain restored from the store joins on method, request id and time alone, which can
    /// only make a join rarer, never a wrong one likelier.
    #[serde(skip)]
    pub join_keys: Option<Box<JoinKeys>>,
}

impl RareEvidence {
    /// Every field unset: what a span without rare evidence reads.
    pub const NONE: RareEvidence = RareEvidence {
        auth_error: None,
        auth_status: None,
        required_scope: None,
        credential_hash: None,
        auth_flow_pending: None,
        negotiation: None,
        exec_timeout: false,
        output_schema_violated: None,
        effect_boundary: None,
        operation_key: None,
        progress: None,
        progress_token: None,
        catalog: None,
        finding: None,
        round: None,
        join_keys: None,
    };
}

/// What tells the client of a request apart from other clients, as either side of the wire
/// records it: the two halves of a call split over two traces are joined only where every key
/// both sides name agrees (see `correlate::crossjoin`). Hashes only (64 bits): a collision makes
/// two clients look alike, which can only make a join rarer (more rivals), never a wrong one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JoinKeys {
    /// The client's end of the connection, address and port: the server's `client.address` /
    /// `client.port` (or `network.peer.*`), the client's `network.local.*` (the tap records it).
    pub peer: Option<u64>,
    /// `user_agent.original` of the request, as the client sent it and the server received it.
    pub user_agent: Option<u64>,
    /// The client's name (`clientInfo.name`) as the request carried it (`mcp.client.name`).
    pub client_name: Option<u64>,
    /// A digest of the call's arguments (`mcp_health.request.arguments_digest`) where both sides
    /// record one.
    pub arguments: Option<u64>,
}

impl JoinKeys {
    pub const NONE: JoinKeys = JoinKeys { peer: None, user_agent: None, client_name: None, arguments: None };

    /// The hash a key is kept as.
    pub fn hash(s: &str) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = rustc_hash::FxHasher::default();
        s.hash(&mut h);
        h.finish()
    }

    fn fields(&self) -> [Option<u64>; 4] {
        [self.peer, self.user_agent, self.client_name, self.arguments]
    }

    pub fn is_empty(&self) -> bool {
        self.fields().iter().all(Option::is_none)
    }

    /// No key both name differs.
    pub fn compatible(&self, other: &JoinKeys) -> bool {
        self.fields().iter().zip(other.fields()).all(|(a, b)| match (a, b) {
            (Some(a), Some(b)) => *a == b,
            _ => true,
        })
    }

    /// Take the keys `other` names and this does not.
    pub fn fill_from(&mut self, other: &JoinKeys) {
        self.peer = self.peer.or(other.peer);
        self.user_agent = self.user_agent.or(other.user_agent);
        self.client_name = self.client_name.or(other.client_name);
        self.arguments = self.arguments.or(other.arguments);
    }
}

/// The one empty [`RareEvidence`] every span without one reads.
static NO_RARE: RareEvidence = RareEvidence::NONE;

/// A span's [`RareEvidence`], absent until written. Compared and stored by what it reads, so
/// a box written back to all-unset equals no box.
#[derive(Clone, Debug, Default)]
struct Rare(Option<Box<RareEvidence>>);

impl Rare {
    fn get(&self) -> &RareEvidence {
        self.0.as_deref().unwrap_or(&NO_RARE)
    }
}

impl PartialEq for Rare {
    fn eq(&self, other: &Rare) -> bool {
        self.get() == other.get()
    }
}

impl serde::Serialize for Rare {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.as_deref().filter(|r| **r != NO_RARE).serialize(s)
    }
}

impl<'de> serde::Deserialize<'de> for Rare {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Rare, D::Error> {
        Option::<Box<RareEvidence>>::deserialize(d).map(Rare)
    }
}

impl std::ops::Deref for SpanEvidence {
    type Target = RareEvidence;
    fn deref(&self) -> &RareEvidence {
        self.rare.get()
    }
}

/// Writing any rare field allocates the box (once per span).
impl std::ops::DerefMut for SpanEvidence {
    fn deref_mut(&mut self) -> &mut RareEvidence {
        self.rare.0.get_or_insert_with(Default::default)
    }
}

/// How a verifier run went, as its span reports it (`mcp_health.outcome.verifier`,
/// `mcp_health.outcome.error`, the span's duration).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FindingMeta {
    /// The rule's name (the tool-name rule of the MCP specification, else hashed).
    pub verifier: Option<Box<str>>,
    /// `confirmed`, `missing`, `failed`, `stale`, or `verifier_error`.
    pub result: Option<&'static str>,
    /// Why the verifier could not run, from a fixed vocabulary ([`VERIFIER_ERRORS`]).
    pub error: Option<&'static str>,
    pub duration_ns: u64,
}

/// The error classes a verifier span may report; anything else reads as `other`.
pub const VERIFIER_ERRORS: &[&str] =
    &["unreachable", "timeout", "pointer_unresolved", "template_error", "queue_full", "bad_response", "other"];

impl SpanEvidence {
    pub fn new(trace_id: TraceId, span_id: SpanId) -> Self {
        SpanEvidence {
            trace_id,
            span_id,
            parent_span_id: None,
            side: Side::Internal,
            start_ns: 0,
            end_ns: 0,
            method: None,
            tool: None,
            request_id: None,
            session_id: None,
            protocol_version: None,
            server: None,
            error: None,
            status_error: false,
            http_status: None,
            transport: None,
            request_sent: None,
            outcomes: Outcomes::new(),
            request_sent_marker: false,
            service: None,
            error_maybe_client_rendered: false,
            http_mcp_endpoint: false,
            response_unobserved: false,
            instrumentation: Instrumentation::Unknown,
            rare: Rare(None),
        }
    }

    /// What tells this span's client apart (see [`JoinKeys`]); none named: every key unset.
    pub fn keys(&self) -> JoinKeys {
        self.join_keys.as_deref().copied().unwrap_or_default()
    }

    /// Whether this span holds a [`RareEvidence`] box (a rare field was written).
    pub fn has_rare(&self) -> bool {
        self.rare.0.is_some()
    }

    /// Approximate heap + inline bytes, for the correlator's memory bound.
    pub fn approx_bytes(&self) -> usize {
        fn s(o: &Option<Box<str>>) -> usize {
            o.as_ref().map_or(0, |v| v.len())
        }
        let rare = self.rare.0.as_deref().map_or(0, |r| {
            std::mem::size_of::<RareEvidence>()
                + s(&r.required_scope)
                + s(&r.credential_hash)
                + s(&r.operation_key)
                + s(&r.progress_token)
                + r.progress.as_ref().map_or(0, |p| std::mem::size_of::<ProgressMark>() + p.token.len())
                + r.round
                    .as_ref()
                    .map_or(0, |x| std::mem::size_of::<RoundFacts>() + s(&x.state_issued) + s(&x.state_echoed) + s(&x.task_id))
                + r.negotiation
                    .as_ref()
                    .map_or(0, |n| s(&n.requested_version) + n.missing_capabilities.iter().map(|c| c.len() + 16).sum::<usize>())
        });
        std::mem::size_of::<Self>()
            + s(&self.request_id)
            + self.session_id.as_ref().map_or(0, |v| v.len())
            + self.outcomes.len() * std::mem::size_of::<OutcomeReceipt>()
            + rare
    }

    /// Whether this span says anything a classifier can use about an MCP call.
    pub fn is_mcp_evidence(&self) -> bool {
        self.method.is_some()
            || self.transport.is_some()
            || self.auth_error.is_some()
            || self.auth_status.is_some()
            || !self.outcomes.is_empty()
            || self.negotiation.is_some()
            || self.catalog.is_some()
            || self.progress.is_some()
            // A span that only names the JSON-RPC request id (traceloop's `ResponseStreamWriter`
            // under its request span) enriches the call it belongs to; it never starts a chain.
            || self.request_id.is_some()
    }

    /// An HTTP span off any MCP endpoint that says nothing else: the walk never takes one as
    /// evidence (`normalize::semconv`), but a chain stored by release 0.2.0 may hold one.
    /// The calls are assembled without it, so a revision after an upgrade gives the verdict one
    /// process of this release gives for the same spans.
    pub fn is_stray_http(&self) -> bool {
        self.http_status.is_some() && !self.http_mcp_endpoint && !self.is_mcp_evidence()
    }

    /// Whether this span can start a call chain: a request, or call-level evidence. Catalog facts
    /// and notifications feed the session table instead; they only enrich an existing chain.
    pub fn starts_chain(&self) -> bool {
        self.method.as_ref().is_some_and(|m| !m.is_notification())
            || self.progress.is_some()
            || self.transport.is_some()
            || self.auth_error.is_some()
            || self.auth_status.is_some()
            || !self.outcomes.is_empty()
            || self.negotiation.is_some()
    }

    /// The key of the session this span belongs to: `mcp.session.id` where the protocol has
    /// sessions, else the client's identity and the server's (2026-07-28 has no session id).
    pub fn session_key(&self) -> Option<String> {
        session_key(self.session_id.as_deref(), self.service.as_deref(), self.server.as_deref(), self.side)
    }
}

/// The operation keys the calls of a chain named (what a verifier in a trace of its own names to
/// find the call it checked).
pub(crate) fn operation_keys(spans: &[SpanEvidence]) -> Vec<Box<str>> {
    spans.iter().filter(|s| s.method.is_some()).filter_map(|s| s.operation_key.clone()).collect()
}

/// See [`SpanEvidence::session_key`]. Server-side spans without a session id do not know the
/// client, so they key by server alone only when nothing better exists.
pub fn session_key(session_id: Option<&str>, service: Option<&str>, server: Option<&str>, side: Side) -> Option<String> {
    SessionName::of(session_id, service, server, side).map(SessionName::key)
}

/// What names a session's key: its id, or else (a client's span) the client's service and the
/// server. Two calls with the same name have the same key, so a caller with many calls can
/// compare names (borrowed) and build each key once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum SessionName<'a> {
    Session(&'a str),
    Client { service: &'a str, server: &'a str },
}

impl<'a> SessionName<'a> {
    /// The name [`session_key`] keys by; `None` for a server's span without a session id.
    pub(crate) fn of(session_id: Option<&'a str>, service: Option<&'a str>, server: Option<&'a str>, side: Side) -> Option<Self> {
        if let Some(sid) = session_id {
            return Some(SessionName::Session(sid));
        }
        let server = server?;
        match side {
            Side::Server => None,
            _ => Some(SessionName::Client { service: service.unwrap_or("?"), server }),
        }
    }

    /// The key.
    pub(crate) fn key(self) -> String {
        // Pieces joined into one allocation of the right size (no formatting machinery: this
        // runs for every call decided and every span with catalog facts).
        match self {
            SessionName::Session(sid) => ["session:", sid].concat(),
            SessionName::Client { service, server } => ["client:", service, "|server:", server].concat(),
        }
    }
}

/// The most bytes a [`SpanEvidence`] may take inline (208: three spans fit one 640-byte
/// allocator size class; pinned by `span_evidence_stays_small`).
#[cfg(test)]
const SPAN_EVIDENCE_MAX: usize = 208;

#[cfg(test)]
mod tests {
    use super::*;

    /// Versions as a set with an order: every dated version up to 2025-11-25 is of the
    /// handshake family, 2026-07-28 and every later date (2026-12-15, announced; any future
    /// date) of the stateless one; a string that is not a date says nothing, and is never
    /// reported as a version spoken.
    #[test]
    fn a_version_is_of_its_family_by_date_and_only_a_date_is_a_version() {
        use ProtocolRevision::{Handshake, Stateless, Unknown};
        let table = [
            ("2024-11-05", Handshake, true),
            ("2025-03-26", Handshake, true),
            ("2025-06-18", Handshake, true),
            ("2025-11-25", Handshake, true),
            ("2026-07-28", Stateless, true),
            ("2026-07-29", Stateless, true),
            ("2026-12-15", Stateless, true),
            ("2031-01-01", Stateless, true),
            ("9999-12-31", Stateless, true),
            ("2026-7-28", Unknown, false),
            ("2026-07-28 ", Unknown, false),
            ("2026/07/28", Unknown, false),
            ("2026-07-28-draft", Unknown, false),
            ("draft", Unknown, false),
            ("DRAFT-2026-v1", Unknown, false),
            ("", Unknown, false),
            ("２０２６-07-28", Unknown, false),
            ("sk-live-2026-07-28", Unknown, false),
        ];
        for (v, family, dated) in table {
            assert_eq!(ProtocolRevision::of_version(v), family, "{v:?}");
            assert_eq!(is_dated_version(v), dated, "{v:?}");
        }
    }

    /// Issue 11: an in-flight chain holds its spans for `decision_wait`; at most 1 KB of RSS per
    /// chain of three spans needs each span small. Rare fields live in one box, allocated only
    /// when one of them is written; a regression in the layout fails here.
    #[test]
    fn span_evidence_stays_small() {
        assert!(std::mem::size_of::<SpanEvidence>() <= SPAN_EVIDENCE_MAX, "{} bytes", std::mem::size_of::<SpanEvidence>());
        assert!(std::mem::size_of::<Outcomes>() <= 16);
        let mut s = SpanEvidence::new([1; 16], [2; 8]);
        s.method = Some(Method::ToolsCall);
        s.tool = Some(Arc::from("search"));
        s.outcomes.push(OutcomeReceipt {
            result: OutcomeResult::Confirmed,
            method: VerifierMethod::Receipt,
            checked_at_ns: 1,
            request_id: None,
            trust: Default::default(),
        });
        // Reading a rare field allocates nothing; writing one allocates the box once.
        assert!(s.auth_status.is_none() && s.catalog.is_none() && !s.has_rare());
        let plain = s.clone();
        s.auth_status = Some(401);
        assert!(s.has_rare() && s.auth_status == Some(401));
        assert_ne!(s, plain);
        // A box written back to all-unset equals no box, and is stored as none.
        s.auth_status = None;
        assert_eq!(s, plain);
        assert_eq!(postcard::to_allocvec(&s).unwrap(), postcard::to_allocvec(&plain).unwrap());
        // Round trip of rare fields and receipts through the store's encoding.
        s.operation_key = Some("op-1".into());
        s.negotiation = Some(Negotiation {
            requested_version: Some("2025-11-25".into()),
            version_accepted: Some(false),
            missing_capabilities: vec!["tools".into()],
        });
        let back: SpanEvidence = postcard::from_bytes(&postcard::to_allocvec(&s).unwrap()).unwrap();
        assert_eq!(back, s);
        assert_eq!(back.outcomes.len(), 1);
        assert!(s.approx_bytes() > plain.approx_bytes() + std::mem::size_of::<RareEvidence>());
    }
}
