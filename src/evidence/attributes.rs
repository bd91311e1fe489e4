//! Attribute names read and written by mcp-health.
//!
//! Two groups: the OpenTelemetry MCP semantic conventions (read), and this project's own evidence
//! attributes under the `mcp_health.` namespace for what the conventions lack (read), plus the
//! verdict attributes put on health spans (written). The README's attribute reference mirrors this
//! file; a change here is a change to the product's wire contract.

// --- OpenTelemetry semantic conventions (read) ---
pub const MCP_METHOD_NAME: &str = "mcp.method.name";
pub const MCP_SESSION_ID: &str = "mcp.session.id";
pub const MCP_PROTOCOL_VERSION: &str = "mcp.protocol.version";
pub const JSONRPC_REQUEST_ID: &str = "jsonrpc.request.id";
pub const RPC_RESPONSE_STATUS_CODE: &str = "rpc.response.status_code";
pub const ERROR_TYPE: &str = "error.type";
pub const GEN_AI_TOOL_NAME: &str = "gen_ai.tool.name";
pub const GEN_AI_OPERATION_NAME: &str = "gen_ai.operation.name";
pub const NETWORK_TRANSPORT: &str = "network.transport";
pub const SERVER_ADDRESS: &str = "server.address";
pub const SERVER_PORT: &str = "server.port";
pub const HTTP_RESPONSE_STATUS_CODE: &str = "http.response.status_code";
/// Older HTTP conventions, still emitted by many HTTP server instrumentations.
pub const HTTP_STATUS_CODE_OLD: &str = "http.status_code";
/// The request path of an HTTP server span (read only to tell an MCP endpoint, `…/mcp`).
pub const URL_PATH: &str = "url.path";
pub const HTTP_TARGET_OLD: &str = "http.target";
pub const HTTP_ROUTE: &str = "http.route";
/// The URL an HTTP client span requested (stable and older conventions): read only to tell an
/// MCP endpoint, never kept (a URL may carry credentials).
pub const URL_FULL: &str = "url.full";
pub const HTTP_URL_OLD: &str = "http.url";
/// The client's end of the connection, as an HTTP server span records it (stable conventions).
pub const CLIENT_ADDRESS: &str = "client.address";
pub const CLIENT_PORT: &str = "client.port";
/// The same, as the OpenTelemetry Python ASGI instrumentation records it by default (the older
/// conventions).
pub const NET_PEER_IP_OLD: &str = "net.peer.ip";
pub const NET_PEER_PORT_OLD: &str = "net.peer.port";
/// The other end of the connection: on a SERVER span the client.
pub const NETWORK_PEER_ADDRESS: &str = "network.peer.address";
pub const NETWORK_PEER_PORT: &str = "network.peer.port";
/// This end of the connection: on a CLIENT span (the tap's upstream connection) the client.
pub const NETWORK_LOCAL_ADDRESS: &str = "network.local.address";
pub const NETWORK_LOCAL_PORT: &str = "network.local.port";
pub const USER_AGENT: &str = "user_agent.original";
pub const USER_AGENT_OLD: &str = "http.user_agent";
/// The client's name as it told the server (`clientInfo.name`; the tap records it).
pub const MCP_CLIENT_NAME: &str = "mcp.client.name";

// --- mcp-health evidence attributes (read) ---
/// Connection result of the attempt: `ok`, `dns_failure`, `connection_refused`,
/// `connection_reset`, `tls_failure`, `timeout`.
pub const TRANSPORT_OUTCOME: &str = "mcp_health.transport.outcome";
/// Whether the request bytes were written before a transport failure (bool). Absent = unknown,
/// which counts as "may have been delivered".
pub const REQUEST_SENT: &str = "mcp_health.request.sent";
/// HTTP status of an authorization challenge (401 or 403).
pub const AUTH_STATUS: &str = "mcp_health.auth.status";
/// The `error` parameter of `WWW-Authenticate`, sanitized to a fixed vocabulary.
pub const AUTH_ERROR: &str = "mcp_health.auth.error";
/// The `scope` parameter of `WWW-Authenticate`: the authority the call needs.
pub const AUTH_REQUIRED_SCOPE: &str = "mcp_health.auth.required_scope";
/// An identifier of the credential the call used (key id, client id, token hash — never the
/// token). mcp-health stores and emits only its SHA-256, to group failures by credential owner.
pub const AUTH_CREDENTIAL_ID: &str = "mcp_health.auth.credential_id";
/// The state of an authorization flow the failure started: `pending` (approved, awaiting
/// completion: the incident is waiting, not stuck), `completed`, `denied`.
pub const AUTH_FLOW: &str = "mcp_health.auth.flow";
/// The protocol version the client asked for in `initialize` (or `_meta` on 2026-07-28).
pub const SESSION_REQUESTED_VERSION: &str = "mcp_health.session.requested_version";
/// Whether the client accepted the negotiated version (bool).
pub const SESSION_VERSION_ACCEPTED: &str = "mcp_health.session.version_accepted";
/// Capabilities the run needs that were not negotiated (string array or comma list).
pub const SESSION_MISSING_CAPABILITIES: &str = "mcp_health.session.missing_capabilities";
/// The tool did not finish in its time budget (bool).
pub const EXECUTION_TIMEOUT: &str = "mcp_health.execution.timeout";
/// Structured output checked against `outputSchema`: `valid`, `violated`.
pub const EXECUTION_OUTPUT_SCHEMA: &str = "mcp_health.execution.output_schema";
/// Whether the tool may commit a side effect: `side_effect` or `none`. Absent = unknown, which
/// counts as a possible side effect.
pub const EFFECT_BOUNDARY: &str = "mcp_health.effect.boundary";
/// Outcome verifier result: `confirmed`, `missing`, `failed`, `stale`.
pub const OUTCOME_RESULT: &str = "mcp_health.outcome.result";
/// How the verifier checked: `file_digest`, `row_version`, `http_status`, `test_result`,
/// `receipt`, `llm_judge` (weak).
pub const OUTCOME_METHOD: &str = "mcp_health.outcome.method";
/// When the destination was checked (Unix nanoseconds); defaults to the span's end time.
pub const OUTCOME_CHECKED_AT: &str = "mcp_health.outcome.checked_at";
/// The `jsonrpc.request.id` of the call a verifier checked, where a trace holds several calls.
pub const OUTCOME_REQUEST_ID: &str = "mcp_health.outcome.request_id";
/// The name of the verifier rule that produced a finding (the tap's `--verifiers` rules).
pub const OUTCOME_VERIFIER: &str = "mcp_health.outcome.verifier";
/// Why a verifier could not run (`unreachable`, `timeout`, `pointer_unresolved`,
/// `template_error`, `queue_full`, `bad_response`, `other`): a span with this and no
/// `mcp_health.outcome.result` is no finding; the outcome stays unobserved (`verifier_error`).
pub const OUTCOME_ERROR: &str = "mcp_health.outcome.error";
/// The tool of the call a verifier checked (covered by the receipt's signature).
pub const OUTCOME_TOOL: &str = "mcp_health.outcome.tool";
/// The id of the Ed25519 key that signed the receipt (first 16 hex digits of the SHA-256 of the
/// public key).
pub const OUTCOME_KEY_ID: &str = "mcp_health.outcome.key_id";
/// The receipt's Ed25519 signature (hex) over the call it checked and what it found (see
/// `evidence::receipt::message`).
pub const OUTCOME_SIGNATURE: &str = "mcp_health.outcome.signature";
/// A caller-chosen key that names one intended operation across attempts.
pub const OPERATION_KEY: &str = "mcp_health.operation.key";
/// Span event name for a verifier result carried as an event instead of a span.
pub const OUTCOME_EVENT: &str = "mcp_health.outcome";

/// `tools/list` page: the cursor the request sent (absent or empty: the first page).
pub const CATALOG_CURSOR: &str = "mcp_health.catalog.cursor";
/// `tools/list` page: the result carried a non-null `nextCursor` (bool). Required for a page to count.
pub const CATALOG_NEXT_CURSOR_PRESENT: &str = "mcp_health.catalog.next_cursor_present";
/// `tools/list` page: number of tools on the page.
pub const CATALOG_TOOL_COUNT: &str = "mcp_health.catalog.tool_count";
/// `tools/list` page: per-tool digests, `name=sha256:<hex>` (string array).
pub const CATALOG_TOOL_DIGESTS: &str = "mcp_health.catalog.tool_digests";
/// `tools/list` page: the raw tool definitions (a JSON array as a string). Digested by mcp-health,
/// then stripped before anything is passed on.
pub const CATALOG_TOOLS: &str = "mcp_health.catalog.tools";
/// 2026-07-28 `tools/list` result `ttlMs`.
pub const CATALOG_TTL_MS: &str = "mcp_health.catalog.ttl_ms";
/// 2026-07-28 `tools/list` result `cacheScope`.
pub const CATALOG_CACHE_SCOPE: &str = "mcp_health.catalog.cache_scope";
/// The registry digest the client installed and now chooses tools from.
pub const CATALOG_INSTALLED_DIGEST: &str = "mcp_health.catalog.installed_digest";
/// A list-change signal on a span that is not itself `notifications/tools/list_changed`: `list_changed`.
pub const CATALOG_SIGNAL: &str = "mcp_health.catalog.signal";
/// Where the signal came from: `notification` (2025-11-25) or `subscription` (2026-07-28 `subscriptions/listen`).
pub const CATALOG_SIGNAL_SOURCE: &str = "mcp_health.catalog.signal_source";
/// The digest of the tool definition a call used (for pin checks), `sha256:<hex>`.
pub const CATALOG_TOOL_DIGEST: &str = "mcp_health.catalog.tool_digest";
/// The server's `tools.listChanged` capability (bool), from `initialize` or `server/discover`.
pub const SESSION_LIST_CHANGED_CAPABILITY: &str = "mcp_health.session.list_changed_capability";

/// The progress token: on a `tools/call` request span, the `_meta.progressToken` the request
/// supplied; on a `notifications/progress` span, the token it carries.
pub const PROGRESS_TOKEN: &str = "mcp_health.progress.token";
/// `notifications/progress`: the progress value (number).
pub const PROGRESS_VALUE: &str = "mcp_health.progress.value";
/// `notifications/progress`: the total, when known (number).
pub const PROGRESS_TOTAL: &str = "mcp_health.progress.total";
/// On a `tools/call` span: `request_sent` marks a span emitted when the request left (the call is in
/// flight; no response is implied), as a wire tap or an instrumentation that reports starts emits.
pub const CALL_PHASE: &str = "mcp_health.call.phase";

/// 2026-07-28: the result type of a request's response (`complete`, `input_required`, `task`).
/// An `input_required` or `task` result is interim: the logical call goes on.
pub const CALL_RESULT_TYPE: &str = "mcp_health.call.result_type";
/// Hash of the `requestState` an `input_required` result handed the client (never the value).
pub const CALL_REQUEST_STATE_ISSUED: &str = "mcp_health.call.request_state_issued";
/// Hash of the `requestState` a retried request echoed: it is the next round of the call whose
/// result issued it.
pub const CALL_REQUEST_STATE_ECHOED: &str = "mcp_health.call.request_state_echoed";
/// Tasks extension: hash of the task id a span is about (never the id).
pub const TASK_ID: &str = "mcp_health.task.id";
/// Tasks extension: the task's status (`working`, `input_required`, `completed`, `failed`,
/// `cancelled`; `gone` when a poll was answered with an error: the server no longer knows it).
pub const TASK_STATUS: &str = "mcp_health.task.status";
/// Tasks extension: the task's `pollIntervalMs`.
pub const TASK_POLL_INTERVAL_MS: &str = "mcp_health.task.poll_interval_ms";
/// Tasks extension: the task's `ttlMs`.
pub const TASK_TTL_MS: &str = "mcp_health.task.ttl_ms";
/// 2026-07-28 `subscriptions/listen`: `opened`, `acknowledged`, `closed`.
pub const SUBSCRIPTION_STATE: &str = "mcp_health.subscription.state";
/// 2026-07-28 `subscriptions/listen`: whether the stream carries tool-list changes (bool; on the
/// acknowledgment, what the server honoured).
pub const SUBSCRIPTION_TOOLS_LIST_CHANGED: &str = "mcp_health.subscription.tools_list_changed";
/// 2026-07-28 `subscriptions/listen`: hash of the subscription id (the listen request's id).
pub const SUBSCRIPTION_ID: &str = "mcp_health.subscription.id";

// --- health span attributes (written) ---
/// The protocol revision a verdict's evidence spoke: `2025-11-25`, `2026-07-28` or `unknown`.
pub const PROTOCOL_REVISION: &str = "mcp_health.protocol.revision";
pub const VERDICT_STATE: &str = "mcp_health.verdict.state";
pub const VERDICT_FIRST_FAILED_LAYER: &str = "mcp_health.verdict.first_failed_layer";
pub const VERDICT_REASON: &str = "mcp_health.verdict.reason";
pub const VERDICT_CONFIDENCE: &str = "mcp_health.verdict.confidence";
pub const VERDICT_NEXT_ACTION: &str = "mcp_health.verdict.next_action";
pub const VERDICT_REVISION: &str = "mcp_health.verdict.revision";
pub const VERDICT_DECIDED_BY: &str = "mcp_health.verdict.decided_by";
/// Why a verdict's evidence may be split (`classify::partial`); absent when it is whole.
pub const VERDICT_PARTIAL: &str = "mcp_health.verdict.partial";
pub const VERDICT_RETRY_SAFE: &str = "mcp_health.verdict.retry_safe";
pub const VERDICT_PROTOCOL_SUCCESS: &str = "mcp_health.verdict.protocol_success";
pub const VERDICT_VERIFIED_SUCCESS: &str = "mcp_health.verdict.verified_success";
pub const LAYER_PREFIX: &str = "mcp_health.layer.";
pub const SESSION_ID_HASH: &str = "mcp_health.session.id_hash";
pub const OUTCOME_METHOD_WRITTEN: &str = OUTCOME_METHOD;
/// The provenance of the receipt a verdict rests on: `unsigned`, `signed` (written).
pub const OUTCOME_TRUST: &str = "mcp_health.outcome.trust";
pub const CATALOG_CONVERGENCE: &str = "mcp_health.catalog.convergence";
pub const CATALOG_REASON: &str = "mcp_health.catalog.reason";
pub const CATALOG_DISCOVERED_DIGEST: &str = "mcp_health.catalog.discovered_digest";
pub const CATALOG_PROJECTION_VERSION: &str = "mcp_health.catalog.projection_version";
pub const CATALOG_SIGNAL_AT: &str = "mcp_health.catalog.signal_at";
pub const CATALOG_TRAVERSAL_START: &str = "mcp_health.catalog.traversal_start";
pub const CATALOG_TRAVERSAL_END: &str = "mcp_health.catalog.traversal_end";
pub const CATALOG_CURSOR_CHAIN: &str = "mcp_health.catalog.cursor_chain";
pub const CATALOG_NEXT_STEP: &str = "mcp_health.catalog.next_step";
