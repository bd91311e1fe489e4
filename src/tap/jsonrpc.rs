//! The observer: reads JSON-RPC messages beside the stream and builds OTLP spans.
//!
//! Transport-agnostic: the stdio and HTTP pumps feed it parsed messages with a [`Ctx`] (when the
//! bytes passed, which session, which HTTP exchange) and HTTP facts (status, challenge, transport
//! failure); it keeps the requests in flight and each session's catalog traversal, and produces:
//!
//! - one CLIENT span per request/response pair, named `<method>` (`tools/call <tool>` for calls),
//!   with the OpenTelemetry MCP attributes and this project's evidence attributes;
//! - for `tools/call`, a zero-length `mcp_health.call.phase=request_sent` CLIENT span when the
//!   request passes (a child of the call's span, so an in-flight call is visible and its trace is
//!   not decided before the response);
//! - INTERNAL spans for `notifications/tools/list_changed` and `notifications/progress` (progress
//!   goes in the trace of the call that supplied its token, under the call's span);
//! - after a complete `tools/list` traversal, a small INTERNAL span with the registry digest as
//!   `mcp_health.catalog.installed_digest`. Assumption, stated in the README: the tap sees what the
//!   client received and takes it as what the client installed — a client that filters or ignores
//!   the catalog it received is not visible on the wire.
//!
//! Trace context: a request whose `params._meta.traceparent` is a valid W3C traceparent gets its
//! trace id and becomes a child of its span id (so the tap's spans join the agent's trace); else a
//! fresh trace per request.
//!
//! Never emitted: arguments, results, error messages, progress messages, raw tool definitions,
//! tokens, headers other than the session id and protocol version, bodies. Identifiers that could
//! carry a pasted secret (request ids, progress tokens, cursors, tool names) go through
//! `redact::ident`.

use std::borrow::Cow;

use rustc_hash::FxHashMap;

use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, ArrayValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::{span::SpanKind, status::StatusCode, Span, Status};

use super::reader::{Document, Kind, Node, Unread};
use super::verify::{CallPart, Kept, RuleSet, VerifyJob};
use super::{new_span_id, new_trace_id, Challenge};
use crate::bounded::BoundedMap;
use crate::classify::digest::{registry_digest, ToolDigest};
use crate::evidence::attributes as a;
use crate::evidence::{ResultType, TaskStatus};
use crate::normalize::digest_cache::DigestCache;
use crate::normalize::redact;
use std::sync::Arc;

/// How the tap reaches the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Transport {
    /// stdio: `network.transport=pipe`.
    Pipe,
    /// streamable HTTP: `network.transport=tcp`.
    Tcp,
}

/// Who the server is, as the spans name it.
#[derive(Clone, Debug)]
pub(crate) struct ServerIdentity {
    /// `server.address`: the host, or for stdio the command name.
    pub address: String,
    pub port: Option<u16>,
    pub transport: Transport,
}

/// Where and when a message passed.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Ctx<'a> {
    pub at_ns: u64,
    /// The session the message travelled in (`Mcp-Session-Id` of the HTTP request; none on stdio).
    pub session_id: Option<&'a str>,
    /// A session id the server assigned in this response (`Mcp-Session-Id` on an `initialize`
    /// response): the span names it.
    pub assigned_session_id: Option<&'a str>,
    /// `MCP-Protocol-Version` of the HTTP request.
    pub protocol_version: Option<&'a str>,
    /// The HTTP exchange (one request/response) the message belongs to.
    pub exchange: Option<u64>,
    /// HTTP status of the response carrying the message.
    pub http_status: Option<u16>,
    /// The HTTP request carried an `Authorization` header (its presence only).
    pub had_authorization: bool,
    /// The tap's end of the upstream connection the exchange went over: the client the server
    /// sees (`network.local.*` on the span, a join key against the server's `client.address`).
    pub local_addr: Option<std::net::SocketAddr>,
    /// The `User-Agent` the request carried.
    pub user_agent: Option<&'a str>,
    /// The trace context the tap put in this request's `_meta` ([`inject_trace_context`]): the
    /// request's span is that span, the root of that trace.
    pub injected: Option<TraceContext>,
}

/// Counters, for the exit summary and the tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ObserverStats {
    pub messages: u64,
    pub parse_errors: u64,
    pub spans: u64,
    pub unmatched_responses: u64,
    pub expired_requests: u64,
    /// What was forwarded but not read whole, whatever the reason (the sum of `oversize_by`).
    pub oversize: u64,
    /// `oversize` by reason.
    pub oversize_by: OversizeCounts,
}

/// Why something the tap forwarded was not read (whole).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Oversize {
    /// A line, body or event-stream event past the parse limit: not read at all.
    Message,
    /// A message nested deeper than the reader follows (`reader::MAX_DEPTH`): what is down there
    /// is not read, and a response read so is no evidence of success.
    Depth,
    /// A value the tap would keep past its budget: a verifier rule's value (`MAX_JOB_BYTES`), the
    /// text content a rule reads as JSON, an id or cursor.
    Value,
    /// A `tools/list` page past the catalog's budget (a definition past `MAX_TOOL_DEFINITION`,
    /// more tools than `MAX_CATALOG_TOOLS`): its catalog is not reported.
    Catalog,
}

/// [`ObserverStats::oversize`] by [`Oversize`] reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct OversizeCounts {
    pub message: u64,
    pub depth: u64,
    pub value: u64,
    pub catalog: u64,
}

impl ObserverStats {
    /// Count one thing not read, for `why`.
    pub(crate) fn count(&mut self, why: Oversize) {
        self.oversize += 1;
        let c = &mut self.oversize_by;
        *match why {
            Oversize::Message => &mut c.message,
            Oversize::Depth => &mut c.depth,
            Oversize::Value => &mut c.value,
            Oversize::Catalog => &mut c.catalog,
        } += 1;
    }

    /// The exit summary's line about what was not read, if anything was not.
    pub(crate) fn unread_summary(&self) -> Option<String> {
        let c = &self.oversize_by;
        (self.oversize > 0).then(|| {
            format!(
                "mcp-health tap: not read whole: {} messages past the parse limit, {} nested past the depth limit, {} values past their budget, {} tools/list pages past the catalog budget",
                c.message, c.depth, c.value, c.catalog
            )
        })
    }
}

/// A request waiting for its response.
#[derive(Clone, Debug)]
struct Pending {
    method: String,
    tool: Option<Box<str>>,
    /// The id as the span writes it.
    id_display: Box<str>,
    session_id: Option<String>,
    protocol_version: Option<String>,
    trace_id: [u8; 16],
    span_id: [u8; 8],
    parent: Option<[u8; 8]>,
    start_ns: u64,
    /// `tools/list`: the cursor sent, hashed (`redact::cursor`, as the span writes it; compared
    /// with the hash of the previous page's `nextCursor`: a cursor can be megabytes).
    cursor: Option<Box<str>>,
    progress_token: Option<AnyValue>,
    /// The raw progress token, to find the call a notification is about.
    progress_key: Option<String>,
    requested_version: Option<Box<str>>,
    exchange: Option<u64>,
    had_authorization: bool,
    /// A `tools/call` a verifier rule applies to: the rule and what it reads of the call's
    /// arguments (kept only for these calls, until the response, within `MAX_JOB_BYTES`).
    verify: Option<Kept>,
    /// Hash of the `requestState` this request echoed (the next round of a multi-round call).
    state_echoed: Option<Box<str>>,
    /// Hash of the task id a `tasks/*` request is about.
    task_id: Option<Box<str>>,
    /// What tells the client apart, as the request showed it: its `User-Agent`, through
    /// `redact::ident` (its `clientInfo` is never written: a name can carry anything).
    user_agent: Option<Box<str>>,
}

/// Where the later rounds of a logical call go: the trace and parent of its first round, and the
/// call's span (the parent of task polls).
#[derive(Clone, Debug)]
struct Logical {
    trace_id: [u8; 16],
    parent: Option<[u8; 8]>,
    call_span: [u8; 8],
    /// A task's call: the request id and start of the `tools/call`, and its verifier rule with
    /// the call's arguments, for the verifier run on the completed task's result.
    request_id: Box<str>,
    tool: Box<str>,
    start_ns: u64,
    verify: Option<Kept>,
}

/// A `subscriptions/listen` stream the client opened.
#[derive(Clone, Debug)]
struct Listen {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    /// Hash of the listen request's id (the subscription id).
    id_hash: Box<str>,
    tools: bool,
}

/// The `_meta` key of the 2026-07-28 per-request protocol version.
const META_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
/// The `_meta` key that tags every frame of a listen stream with its subscription id.
const META_SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";
/// How long after a refused `server/discover` an `initialize` is taken as the same setup retried
/// in the older revision (the `mcp` SDK's `auto` mode does it at once).
const SETUP_RETRY_NS: u64 = 10_000_000_000;
/// Most multi-round calls, tasks and listen streams remembered; past it the oldest is forgotten.
const MAX_LOGICAL: usize = 4096;
/// Longest tool definition digested, as sent: the digest builds the definition's tree (tens of
/// times its bytes for a definition made of small values), and real definitions are a few KiB.
pub(crate) const MAX_TOOL_DEFINITION: usize = 256 << 10;
/// Most tools a `tools/list` page or traversal is digested for (their digests are kept until the
/// traversal ends).
pub(crate) const MAX_CATALOG_TOOLS: usize = 16_384;

/// A `tools/list` traversal in progress.
#[derive(Debug, Default)]
struct Traversal {
    tools: Vec<ToolDigest>,
    /// The `nextCursor` the next page must send, hashed as `Pending::cursor`.
    expect: Option<Box<str>>,
}

#[derive(Debug, Default)]
struct SessionState {
    protocol_version: Option<String>,
    traversal: Option<Traversal>,
}

/// See the module documentation.
pub(crate) struct Observer {
    server: ServerIdentity,
    pending: FxHashMap<(String, String), Pending>,
    sessions: BoundedMap<String, SessionState>,
    /// Where a session goes when `sessions` can hold none (capacity 0): forgotten at once.
    no_session: SessionState,
    digests: DigestCache,
    spans: Vec<Span>,
    /// The verifier rules (`tap --verifiers`), and the calls waiting to be handed to the pool.
    verifiers: Option<Arc<RuleSet>>,
    jobs: Vec<VerifyJob>,
    /// Multi-round calls by the hash of the `requestState` they were handed, and tasks by the
    /// hash of their id: where their next rounds and polls go.
    rounds: BoundedMap<Box<str>, Logical>,
    tasks: BoundedMap<Box<str>, Logical>,
    /// Open listen streams by (session, request id key).
    listens: BoundedMap<(String, String), Listen>,
    /// The latest refused `server/discover`: its trace, parent and time.
    failed_discover: Option<([u8; 16], Option<[u8; 8]>, u64)>,
    pub stats: ObserverStats,
}

/// Most requests kept in flight; past it the oldest is forgotten (counted as expired).
const MAX_PENDING: usize = 65_536;

/// The limits of an [`Observer`]'s tables (`processors.mcp_health.limits.tap_sessions` and
/// `digest_cache`); past them the oldest entry is forgotten and counted (`tap_sessions`,
/// `digest_cache`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ObserverLimits {
    pub sessions: usize,
    pub digests: usize,
}

impl Default for ObserverLimits {
    fn default() -> Self {
        let l = crate::config::StateLimits::default();
        ObserverLimits { sessions: l.tap_sessions, digests: l.digest_cache }
    }
}

fn kv(key: &str, v: any_value::Value) -> KeyValue {
    KeyValue { key: key.to_string(), value: Some(AnyValue { value: Some(v) }), ..Default::default() }
}
fn s(key: &str, v: impl Into<String>) -> KeyValue {
    kv(key, any_value::Value::StringValue(v.into()))
}
fn int(key: &str, v: i64) -> KeyValue {
    kv(key, any_value::Value::IntValue(v))
}
fn boolean(key: &str, v: bool) -> KeyValue {
    kv(key, any_value::Value::BoolValue(v))
}

/// Longest id or progress token kept as sent in a map key; a longer one is keyed by its hash (type
/// exact all the same), so a megabyte id costs what a short one does.
const MAX_KEY_TEXT: usize = 256;

/// `x` under `tag` as a map key (see [`MAX_KEY_TEXT`]).
fn keyed(tag: char, x: &str) -> String {
    if x.len() <= MAX_KEY_TEXT {
        format!("{tag}:{x}")
    } else {
        format!("{tag}#{}", redact::cursor(x))
    }
}

/// A number as `Value` writes an integer, else as it was sent.
fn number_text<'a>(n: Node<'a>) -> Option<Cow<'a, str>> {
    match n.as_i64() {
        Some(i) => Some(i.to_string().into()),
        None => n.number_text().map(Cow::Borrowed),
    }
}

/// A JSON-RPC id as a map key (type-exact: `1` and `"1"` differ) and as the span writes it.
fn id_key(id: Node<'_>) -> Option<(String, Box<str>)> {
    match id.kind() {
        Kind::String => id.as_str().map(|x| (keyed('s', &x), redact::ident(&x))),
        Kind::Number => number_text(id).map(|n| (keyed('n', &n), redact::ident(&n))),
        _ => None,
    }
}

/// A progress token (string or integer) as an attribute value, and its key.
fn progress_token(v: Node<'_>) -> Option<(AnyValue, String)> {
    let (value, key) = match v.kind() {
        Kind::String => {
            let x = v.as_str()?;
            (any_value::Value::StringValue(redact::ident(&x).into()), keyed('s', &x))
        }
        Kind::Number => {
            let n = number_text(v)?;
            let value = match v.as_i64() {
                Some(i) => any_value::Value::IntValue(i),
                None => any_value::Value::StringValue(redact::ident(&n).into()),
            };
            (value, keyed('n', &n))
        }
        _ => return None,
    };
    Some((AnyValue { value: Some(value) }, key))
}

/// A W3C trace context: trace id and span id.
pub(crate) type TraceContext = ([u8; 16], [u8; 8]);

/// Put a W3C `traceparent` into the `_meta` of a 2026-07-28 request that carries none, naming a new
/// trace and the span the tap reports the request under, so that a server honouring `_meta`
/// (SEP-414; the `mcp` SDK 2.x does) continues the trace: its spans and the tap's are then one
/// trace, and nothing is left to join across traces. `header_version` is the HTTP request's
/// `MCP-Protocol-Version`. The new body and the (trace, span) it names, or `None`: a notification,
/// a batch, an earlier revision, a request that has a traceparent, a body that is not JSON or not
/// read whole.
///
/// The member is written into the body as sent (after the `{` of `_meta`, of `params`, or of the
/// message when they are missing): every other byte goes to the server as the client wrote it,
/// and no tree of the body is built (it can be 16 MiB of any shape).
pub(crate) fn inject_trace_context(body: &[u8], header_version: Option<&str>) -> Option<(Vec<u8>, TraceContext)> {
    let doc = Document::parse(body).ok().filter(Document::whole)?;
    let m = doc.root();
    let [method, id, params] = m.pick(["method", "id", "params"]);
    method?.as_str()?;
    id.filter(|i| !i.is_null())?;
    if params.is_some_and(|p| p.kind() != Kind::Object) {
        return None;
    }
    let meta = params.and_then(|p| p.get("_meta"));
    if meta.is_some_and(|x| x.kind() != Kind::Object) {
        return None;
    }
    let [meta_version, traceparent] = meta.map_or([None, None], |x| x.pick([META_PROTOCOL_VERSION, "traceparent"]));
    let version = match meta_version.and_then(|v| v.as_str()) {
        Some(v) => v,
        None => Cow::Borrowed(header_version?),
    };
    if crate::evidence::ProtocolRevision::of_version(&version) != crate::evidence::ProtocolRevision::Stateless || traceparent.is_some() {
        return None;
    }
    let ids = (new_trace_id(), new_span_id());
    let tp = format!("\"traceparent\":\"00-{}-{}-01\"", hex::encode(ids.0), hex::encode(ids.1));
    let (into, member) = match (params, meta) {
        (Some(_), Some(meta)) => (meta, tp),
        (Some(params), None) => (params, format!("\"_meta\":{{{tp}}}")),
        (None, _) => (m, format!("\"params\":{{\"_meta\":{{{tp}}}}}")),
    };
    let at = into.offset_in(body)? + 1;
    let comma = if into.members().next().is_some() { "," } else { "" };
    let mut out = Vec::with_capacity(body.len() + member.len() + 1);
    out.extend_from_slice(body.get(..at)?);
    out.extend_from_slice(member.as_bytes());
    out.extend_from_slice(comma.as_bytes());
    out.extend_from_slice(body.get(at..)?);
    Some((out, ids))
}

/// Parse a W3C `traceparent` (version 00 format; later versions read by the same prefix).
pub(crate) fn parse_traceparent(tp: &str) -> Option<([u8; 16], [u8; 8])> {
    let parts: Vec<&str> = tp.trim().split('-').collect();
    if parts.len() < 4 || parts[0].len() != 2 || parts[0] == "ff" || parts[1].len() != 32 || parts[2].len() != 16 || parts[3].len() != 2 {
        return None;
    }
    if parts[0] == "00" && parts.len() != 4 {
        return None;
    }
    let lower_hex = |x: &str| x.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if !parts[..4].iter().all(|p| lower_hex(p)) {
        return None;
    }
    let t: [u8; 16] = hex::decode(parts[1]).ok()?.try_into().ok()?;
    let sp: [u8; 8] = hex::decode(parts[2]).ok()?.try_into().ok()?;
    if t.iter().all(|b| *b == 0) || sp.iter().all(|b| *b == 0) {
        return None;
    }
    Some((t, sp))
}

/// Method names of the specification are kept; anything else is `other` (a method name is
/// client-chosen text), as the receiver does.
fn method_name(m: &str) -> Box<str> {
    redact::method(m).into()
}

/// `capabilities.tools.listChanged` of an `initialize` or `server/discover` result.
fn list_changed_capability(r: Node<'_>) -> bool {
    r.pointer("/capabilities/tools/listChanged").and_then(|b| b.as_bool()).unwrap_or(false)
}

/// A value the tap must not emit (a `requestState`, a task id), as a join key: a hash.
fn hash_of(v: &str) -> Box<str> {
    redact::cursor(v)
}

/// A task id (string or integer) as its hash.
fn task_id_hash(t: Node<'_>) -> Option<Box<str>> {
    match t.kind() {
        Kind::String => t.as_str().map(|x| hash_of(&x)),
        _ => t.as_i64().map(|i| hash_of(&i.to_string())),
    }
}

/// A task object's status and timing hints.
fn task_attrs(task: Node<'_>, attrs: &mut Vec<KeyValue>) {
    let [status, poll, ttl] = task.pick(["status", "pollIntervalMs", "ttlMs"]);
    if let Some(st) = status.and_then(|x| x.as_str()).and_then(|x| TaskStatus::parse(&x)) {
        attrs.push(s(a::TASK_STATUS, st.as_str()));
    }
    if let Some(ms) = poll.and_then(|x| x.as_i64()).filter(|x| *x >= 0) {
        attrs.push(int(a::TASK_POLL_INTERVAL_MS, ms));
    }
    if let Some(ms) = ttl.and_then(|x| x.as_i64()).filter(|x| *x >= 0) {
        attrs.push(int(a::TASK_TTL_MS, ms));
    }
}

/// Most capability names a -32021 refusal is read for, and how deep its paths are followed (a
/// path deeper is named where it was cut: each level is one more pass over what is under it).
const MAX_MISSING_CAPABILITIES: usize = 16;
const MAX_CAPABILITY_DEPTH: usize = 8;

/// The `n` smallest keys of an object (as `Value`'s sorted map iterates them: the last of a key
/// sent twice), kept in a list of `n` while the object is read once.
fn smallest_members<'a>(o: Node<'a>, n: usize) -> Vec<(Cow<'a, str>, Node<'a>)> {
    let mut out: Vec<(Cow<'a, str>, Node<'a>)> = Vec::with_capacity(n + 1);
    for (k, v) in o.members() {
        let Some(k) = k.decode() else { continue };
        if let Some(e) = out.iter_mut().find(|(e, _)| *e == k) {
            e.1 = v;
            continue;
        }
        let at = out.partition_point(|(e, _)| *e < k);
        if at < n {
            out.insert(at, (k, v));
            out.truncate(n);
        }
    }
    out
}

/// The negotiation a 2026-07-28 refusal reports in `error.data`: -32022 names the version asked
/// for (not accepted), -32021 the capabilities the request needed. Only names from a bounded
/// vocabulary leave (versions and capability paths through `redact::ident`).
fn negotiation_refusal(code: i64, data: Option<Node<'_>>, attrs: &mut Vec<KeyValue>) {
    match code {
        -32022 => {
            if let Some(v) = data.and_then(|d| d.get("requested")).and_then(|v| v.as_str()) {
                attrs.push(s(a::SESSION_REQUESTED_VERSION, redact::ident(&v).to_string()));
            }
            attrs.push(boolean(a::SESSION_VERSION_ACCEPTED, false));
        }
        -32021 => {
            let mut names = Vec::new();
            fn walk(prefix: &str, v: Node<'_>, depth: usize, out: &mut Vec<String>) {
                let members = if depth < MAX_CAPABILITY_DEPTH && out.len() < MAX_MISSING_CAPABILITIES {
                    smallest_members(v, MAX_MISSING_CAPABILITIES)
                } else {
                    Vec::new()
                };
                if members.is_empty() {
                    if !prefix.is_empty() {
                        out.push(prefix.to_string());
                    }
                    return;
                }
                for (k, x) in members {
                    let p = if prefix.is_empty() { k.into_owned() } else { format!("{prefix}.{k}") };
                    walk(&p, x, depth + 1, out);
                }
            }
            if let Some(req) = data.and_then(|d| d.get("requiredCapabilities")) {
                walk("", req, 0, &mut names);
            }
            if names.is_empty() {
                names.push("unknown".into());
            }
            let list =
                names.iter().map(|n| AnyValue { value: Some(any_value::Value::StringValue(redact::ident(n).to_string())) }).collect();
            attrs.push(kv(a::SESSION_MISSING_CAPABILITIES, any_value::Value::ArrayValue(ArrayValue { values: list })));
        }
        _ => {}
    }
}

impl Observer {
    /// An observer with the default limits.
    pub(crate) fn new(server: ServerIdentity) -> Self {
        Observer::with_limits(server, ObserverLimits::default())
    }

    pub(crate) fn with_limits(server: ServerIdentity, limits: ObserverLimits) -> Self {
        Observer {
            server,
            pending: FxHashMap::default(),
            sessions: BoundedMap::with_capacity("tap_sessions", limits.sessions),
            no_session: SessionState::default(),
            digests: DigestCache::with_capacity(limits.digests),
            spans: Vec::new(),
            verifiers: None,
            jobs: Vec::new(),
            rounds: BoundedMap::with_capacity("tap_rounds", MAX_LOGICAL),
            tasks: BoundedMap::with_capacity("tap_tasks", MAX_LOGICAL),
            listens: BoundedMap::with_capacity("tap_listens", MAX_LOGICAL),
            failed_discover: None,
            stats: ObserverStats::default(),
        }
    }

    /// Verify the calls that `rules` name (see `crate::tap::verify`).
    pub(crate) fn with_verifiers(mut self, rules: Option<Arc<RuleSet>>) -> Self {
        self.verifiers = rules.filter(|r| !r.rules.is_empty());
        self
    }

    /// The calls to verify found since the last call.
    pub(crate) fn take_jobs(&mut self) -> Vec<VerifyJob> {
        std::mem::take(&mut self.jobs)
    }

    /// The spans built since the last call.
    pub(crate) fn take_spans(&mut self) -> Vec<Span> {
        std::mem::take(&mut self.spans)
    }

    /// Requests still waiting for a response.
    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// Read one line / body / SSE event: a JSON-RPC message or a batch (array). Unparseable input
    /// is counted and otherwise ignored. No tree of the message is built (see `super::reader`):
    /// what the tap reads is read from the bytes, and a message nested too deep to read whole is
    /// read around the part it skipped and counted (`Oversize::Depth`).
    pub(crate) fn client_bytes(&mut self, bytes: &[u8], ctx: &Ctx<'_>) {
        self.bytes(bytes, ctx, true)
    }

    /// See [`Self::client_bytes`]; messages from the server.
    pub(crate) fn server_bytes(&mut self, bytes: &[u8], ctx: &Ctx<'_>) {
        self.bytes(bytes, ctx, false)
    }

    fn bytes(&mut self, bytes: &[u8], ctx: &Ctx<'_>, from_client: bool) {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        let Ok(doc) = Document::parse(bytes) else {
            self.stats.parse_errors += 1;
            return;
        };
        if !doc.whole() {
            self.stats.count(Oversize::Depth);
            tracing::debug!(bytes = bytes.len(), from_client, "a message nested past the depth limit: read around what was skipped");
        }
        let root = doc.root();
        match root.kind() {
            Kind::Array => {
                for m in root.elements() {
                    let whole = doc.whole() || m.is_whole();
                    self.message(m, whole, ctx, from_client);
                }
            }
            Kind::Object => self.message(root, doc.whole(), ctx, from_client),
            _ => self.stats.parse_errors += 1,
        }
    }

    fn message(&mut self, m: Node<'_>, whole: bool, ctx: &Ctx<'_>, from_client: bool) {
        self.stats.messages += 1;
        if from_client {
            self.client_message(m, ctx)
        } else {
            self.server_message(m, whole, ctx)
        }
    }

    /// Count what a verifier rule's value could not be kept for.
    fn note_unread(&mut self, why: &[Unread]) {
        for u in why {
            match u {
                Unread::Budget => self.stats.count(Oversize::Value),
                Unread::Depth => self.stats.count(Oversize::Depth),
                // A value that is no text (a lone surrogate): missing, as a value not sent is.
                Unread::Syntax => {}
            }
        }
    }

    /// A message from the client. Read whole or not, a request is what it says it is: nothing is
    /// decided from a request, and what could not be read of it (a verifier rule's value) is
    /// missing.
    pub(crate) fn client_message(&mut self, m: Node<'_>, ctx: &Ctx<'_>) {
        let [method, id, params] = m.pick(["method", "id", "params"]);
        let Some(method) = method.and_then(|x| x.as_str()) else {
            return; // a response to a server request (sampling, elicitation, roots): not evidence here
        };
        let method: &str = &method;
        let Some((key, id_display)) = id.and_then(id_key) else {
            // A client notification (initialized, cancelled, roots changed): a cancel may close a
            // listen stream.
            if method == "notifications/cancelled" {
                if let Some((k, _)) = params.and_then(|p| p.get("requestId")).and_then(id_key) {
                    self.listen_closed(&(ctx.session_id.unwrap_or("").to_string(), k), ctx);
                }
            }
            return;
        };
        let [meta, request_state, task, name, arguments, cursor, protocol_version, notifications] = params.map_or([None; 8], |p| {
            p.pick(["_meta", "requestState", "taskId", "name", "arguments", "cursor", "protocolVersion", "notifications"])
        });
        let [meta_version, traceparent, token] =
            meta.map_or([None; 3], |x| x.pick([META_PROTOCOL_VERSION, "traceparent", "progressToken"]));
        let meta_version = meta_version.and_then(|v| v.as_str());
        // Later rounds of a multi-round call, polls of a task, and a setup retried in the older
        // revision go in the trace of the request they continue (so the service joins them).
        let state_echoed = request_state.and_then(|x| x.as_str()).map(|x| hash_of(&x));
        let task_id = method.starts_with("tasks/").then_some(task).flatten().and_then(task_id_hash);
        let continues = match (&state_echoed, &task_id) {
            (Some(h), _) => self.rounds.get(h).map(|l| (l.trace_id, l.parent)),
            (None, Some(t)) => self.tasks.get(t).map(|l| (l.trace_id, Some(l.call_span))),
            _ if method == "initialize" => {
                self.failed_discover.take().filter(|(_, _, at)| ctx.at_ns.saturating_sub(*at) <= SETUP_RETRY_NS).map(|(t, p, _)| (t, p))
            }
            _ => None,
        };
        let traceparent = traceparent.and_then(|x| x.as_str()).and_then(|x| parse_traceparent(&x));
        // The trace context the tap injected names the request's own span (the trace's root).
        let own = traceparent.filter(|tp| continues.is_none() && ctx.injected == Some(*tp));
        let (trace_id, parent) = match (continues, own) {
            (Some(c), _) => c,
            (None, Some((t, _))) => (t, None),
            (None, None) => match traceparent {
                Some((t, p)) => (t, Some(p)),
                None => (new_trace_id(), None),
            },
        };

        let (progress_token, progress_key) = match token.and_then(progress_token) {
            Some((v, k)) => (Some(v), Some(k)),
            None => (None, None),
        };
        let raw_tool = (method == "tools/call").then(|| name.and_then(|n| n.as_str())).flatten();
        let tool = raw_tool.as_deref().map(redact::ident);
        // Only what the rule reads of the arguments is kept until the response.
        let mut unread = Vec::new();
        let verify = match (&self.verifiers, raw_tool.as_deref()) {
            (Some(rules), Some(name)) => rules.find(name, &self.server.address).map(|i| {
                let mut kept = Kept::new(i);
                if let (Some(args), Some(rule)) = (arguments, rules.rules.get(i)) {
                    unread = kept.keep(&rule.check.pointers(), CallPart::Arguments, args);
                }
                kept
            }),
            _ => None,
        };
        self.note_unread(&unread);
        let p = Pending {
            method: method_name(method).into(),
            tool,
            id_display,
            session_id: ctx.session_id.map(str::to_string),
            protocol_version: ctx.protocol_version.map(str::to_string).or_else(|| meta_version.map(Cow::into_owned)),
            trace_id,
            span_id: own.map_or_else(new_span_id, |(_, s)| s),
            parent,
            start_ns: ctx.at_ns,
            cursor: (method == "tools/list").then(|| cursor.and_then(|c| c.as_str()).map(|c| redact::cursor(&c))).flatten(),
            progress_token,
            progress_key,
            requested_version: (method == "initialize")
                .then(|| protocol_version.and_then(|v| v.as_str()).map(|v| redact::ident(&v)))
                .flatten(),
            exchange: ctx.exchange,
            had_authorization: ctx.had_authorization,
            verify,
            state_echoed,
            task_id,
            user_agent: ctx.user_agent.map(redact::ident),
        };
        if method == "tools/call" {
            self.request_sent_span(&p);
        }
        if method == "subscriptions/listen" {
            // The stream is the response: it is reported as it opens, is acknowledged and closes,
            // never kept as a request in flight.
            let tools = notifications.and_then(|n| n.get("toolsListChanged")).and_then(|b| b.as_bool()) == Some(true);
            let listen = Listen { trace_id: p.trace_id, span_id: p.span_id, id_hash: hash_of(&key), tools };
            self.listen_span(&listen, "opened", tools, ctx, Some(&p));
            self.listens.insert((ctx.session_id.unwrap_or("").to_string(), key), listen);
            return;
        }
        if self.pending.len() >= MAX_PENDING {
            if let Some(oldest) = self.pending.iter().min_by_key(|(_, p)| p.start_ns).map(|(k, _)| k.clone()) {
                self.pending.remove(&oldest);
                self.stats.expired_requests += 1;
            }
        }
        self.pending.insert((ctx.session_id.unwrap_or("").to_string(), key), p);
    }

    /// A message from the server. `whole`: it was read whole (see [`Self::client_bytes`]); a
    /// message that was not is no evidence of how anything ended (it may not even be JSON the
    /// client could read).
    pub(crate) fn server_message(&mut self, m: Node<'_>, whole: bool, ctx: &Ctx<'_>) {
        let [method, id, params, result, error] = m.pick(["method", "id", "params", "result", "error"]);
        if let Some(method) = method.and_then(|x| x.as_str()) {
            if id.is_some_and(|i| !i.is_null()) {
                return; // a server request (sampling, elicitation, ping): not evidence here
            }
            if !whole {
                return; // a notification not read whole says nothing the tap can vouch for
            }
            let subscription = params.and_then(|p| p.get("_meta")).and_then(|m| m.get(META_SUBSCRIPTION_ID)).is_some();
            match &*method {
                "notifications/tools/list_changed" => self.list_changed(ctx, subscription),
                "notifications/progress" => self.progress(params, ctx),
                "notifications/subscriptions/acknowledged" => self.listen_acknowledged(params, ctx),
                _ => {}
            }
            return;
        }
        let Some((key, _)) = id.and_then(id_key) else { return };
        if result.is_none() && error.is_none() {
            return;
        }
        let session_key = ctx.session_id.unwrap_or("").to_string();
        if self.listens.contains(&(session_key.clone(), key.clone())) {
            // A listen stream answered: it has ended.
            self.listen_closed(&(session_key, key), ctx);
            return;
        }
        let Some(p) = self.pending.remove(&(session_key, key)) else {
            self.stats.unmatched_responses += 1;
            return;
        };
        if whole {
            self.response(p, result, error, ctx);
        } else {
            self.unread_response(&p, result, error);
        }
    }

    /// The answer to `p` could not be read whole: it gets no span — the call stays as its
    /// `request_sent` marker left it, its response unobserved, never a success — but a call that
    /// looked done is still handed to its verifier rule with what could be read (the rule checks
    /// the destination, not the answer; what it needs from the part not read is missing, and its
    /// check says `pointer_unresolved`).
    fn unread_response(&mut self, p: &Pending, result: Option<Node<'_>>, error: Option<Node<'_>>) {
        let Some(r) = result.filter(|_| error.is_none() && p.method == "tools/call") else { return };
        let [is_error, result_type] = r.pick(["isError", "resultType"]);
        let interim = matches!(
            result_type.and_then(|t| t.as_str()).and_then(|t| ResultType::parse(&t)),
            Some(ResultType::InputRequired | ResultType::Task)
        );
        if is_error.and_then(|b| b.as_bool()) != Some(true) && !interim {
            self.job(p, Some(r));
        }
    }

    /// An HTTP 401 or 403 answered the requests of `exchange`: each becomes a span with the
    /// status and the sanitized challenge.
    /// The challenge comes already sanitized ([`super::parse_www_authenticate`]): the raw header
    /// never reaches the observer.
    pub(crate) fn http_auth_failure(&mut self, exchange: u64, status: u16, c: &Challenge, ctx: &Ctx<'_>) {
        for p in self.take_exchange(exchange) {
            // A 401 to a request that carried no credential is a missing token, whatever word the
            // server chose (the `mcp` SDK says invalid_token for both).
            let error = if status == 401 && !p.had_authorization { Some("missing_token") } else { c.error };
            let mut attrs = self.common_attrs(&p, ctx.assigned_session_id.or(p.session_id.as_deref()));
            attrs.push(int(a::HTTP_RESPONSE_STATUS_CODE, i64::from(status)));
            attrs.push(int(a::AUTH_STATUS, i64::from(status)));
            if let Some(e) = error {
                attrs.push(s(a::AUTH_ERROR, e));
            }
            if let Some(sc) = &c.scope {
                attrs.push(s(a::AUTH_REQUIRED_SCOPE, sc.to_string()));
            }
            self.push_call_span(&p, ctx.at_ns, attrs, true);
            self.note_setup_failure(&p, ctx);
        }
    }

    /// A refused `server/discover`: an `initialize` right after it is the same setup retried in
    /// the older revision.
    fn note_setup_failure(&mut self, p: &Pending, ctx: &Ctx<'_>) {
        if p.method == "server/discover" {
            self.failed_discover = Some((p.trace_id, p.parent, ctx.at_ns));
        }
    }

    /// The response of `exchange` ended: requests of it that got no JSON-RPC response and whose
    /// HTTP status was an error are reported with that status. Requests answered by a 2xx without
    /// a response stay in flight (the answer may come on another stream).
    pub(crate) fn exchange_end(&mut self, exchange: u64, status: u16, ctx: &Ctx<'_>) {
        if (200..300).contains(&status) {
            return;
        }
        for p in self.take_exchange(exchange) {
            let mut attrs = self.common_attrs(&p, ctx.assigned_session_id.or(p.session_id.as_deref()));
            attrs.push(int(a::HTTP_RESPONSE_STATUS_CODE, i64::from(status)));
            self.push_call_span(&p, ctx.at_ns, attrs, status >= 400);
            if status >= 400 {
                self.note_setup_failure(&p, ctx);
            }
        }
    }

    /// The requests of `exchange` met a transport failure (`connection_refused`, `timeout`,
    /// `dns_failure`, `connection_reset`). `request_sent`: whether the request bytes may have
    /// reached the server (false when the connection was never made).
    pub(crate) fn transport_failure(&mut self, exchange: u64, outcome: &'static str, request_sent: bool, ctx: &Ctx<'_>) {
        for p in self.take_exchange(exchange) {
            let mut attrs = self.common_attrs(&p, p.session_id.as_deref());
            attrs.push(s(a::TRANSPORT_OUTCOME, outcome));
            attrs.push(boolean(a::REQUEST_SENT, request_sent));
            attrs.push(s(a::ERROR_TYPE, outcome));
            self.push_call_span(&p, ctx.at_ns, attrs, true);
            self.note_setup_failure(&p, ctx);
            // A lost response after the request went out: the effect may have committed. The
            // rule reconciles it (only from the arguments: there is no result).
            if request_sent && matches!(outcome, "timeout" | "connection_reset") {
                self.job(&p, None);
            }
        }
    }

    /// Forget requests older than `before_ns` (their response never came); returns how many.
    pub(crate) fn expire(&mut self, before_ns: u64) -> usize {
        let n = self.pending.len();
        self.pending.retain(|_, p| p.start_ns >= before_ns);
        let gone = n - self.pending.len();
        self.stats.expired_requests += gone as u64;
        gone
    }

    fn take_exchange(&mut self, exchange: u64) -> Vec<Pending> {
        let keys: Vec<(String, String)> =
            self.pending.iter().filter(|(_, p)| p.exchange == Some(exchange)).map(|(k, _)| k.clone()).collect();
        let mut out: Vec<Pending> = keys.into_iter().filter_map(|k| self.pending.remove(&k)).collect();
        out.sort_by_key(|p| p.start_ns);
        out
    }

    fn session(&mut self, key: &str) -> &mut SessionState {
        if !self.sessions.contains(key) {
            self.sessions.insert(key.to_string(), SessionState::default());
        }
        match self.sessions.get_mut(key) {
            Some(st) => st,
            None => {
                self.no_session = SessionState::default();
                &mut self.no_session
            }
        }
    }

    /// The attributes every span of a request carries.
    fn common_attrs(&self, p: &Pending, session_id: Option<&str>) -> Vec<KeyValue> {
        let mut attrs = vec![s(a::MCP_METHOD_NAME, p.method.clone()), s(a::JSONRPC_REQUEST_ID, p.id_display.to_string())];
        self.identity_attrs(&mut attrs, session_id, p.protocol_version.as_deref());
        if let Some(t) = &p.tool {
            attrs.push(s(a::GEN_AI_TOOL_NAME, t.to_string()));
            attrs.push(s(a::GEN_AI_OPERATION_NAME, "execute_tool"));
        }
        if let Some(tok) = &p.progress_token {
            attrs.push(KeyValue { key: a::PROGRESS_TOKEN.into(), value: Some(tok.clone()), ..Default::default() });
        }
        if let Some(h) = &p.state_echoed {
            attrs.push(s(a::CALL_REQUEST_STATE_ECHOED, h.to_string()));
        }
        if let Some(t) = &p.task_id {
            attrs.push(s(a::TASK_ID, t.to_string()));
        }
        if let Some(u) = &p.user_agent {
            attrs.push(s(a::USER_AGENT, u.to_string()));
        }
        attrs
    }

    /// Session, protocol version and server identity.
    fn identity_attrs(&self, attrs: &mut Vec<KeyValue>, session_id: Option<&str>, version: Option<&str>) {
        if let Some(sid) = session_id {
            // Hashed as the service hashes it: a server-assigned session id can be a credential
            // (a JWT), and joins need only equality.
            attrs.push(s(a::MCP_SESSION_ID, redact::session_hash(sid).to_string()));
        }
        let negotiated = self.sessions.get(session_id.unwrap_or("")).and_then(|st| st.protocol_version.as_deref());
        if let Some(v) = version.or(negotiated) {
            attrs.push(s(a::MCP_PROTOCOL_VERSION, redact::ident(v).to_string()));
        }
        attrs.push(s(
            a::NETWORK_TRANSPORT,
            match self.server.transport {
                Transport::Pipe => "pipe",
                Transport::Tcp => "tcp",
            },
        ));
        attrs.push(s(a::SERVER_ADDRESS, self.server.address.clone()));
        if let Some(port) = self.server.port {
            attrs.push(int(a::SERVER_PORT, i64::from(port)));
        }
    }

    fn span_name(p: &Pending) -> String {
        match &p.tool {
            Some(t) => format!("{} {t}", p.method),
            None => p.method.clone(),
        }
    }

    fn push_call_span(&mut self, p: &Pending, end_ns: u64, attrs: Vec<KeyValue>, error: bool) {
        let span = Span {
            trace_id: p.trace_id.to_vec(),
            span_id: p.span_id.to_vec(),
            parent_span_id: p.parent.map(|x| x.to_vec()).unwrap_or_default(),
            name: Self::span_name(p),
            kind: SpanKind::Client as i32,
            start_time_unix_nano: p.start_ns,
            end_time_unix_nano: end_ns.max(p.start_ns),
            attributes: attrs,
            status: Some(Status { code: if error { StatusCode::Error } else { StatusCode::Unset } as i32, message: String::new() }),
            ..Default::default()
        };
        self.push(span);
    }

    /// Queue the call's verifier job, keeping only what its rule reads (`result`: the call's
    /// result, `None` for a lost response).
    fn job(&mut self, p: &Pending, result: Option<Node<'_>>) {
        let Some(kept) = &p.verify else { return };
        let Some(rules) = &self.verifiers else { return };
        let mut kept = kept.clone();
        let unread = match (result, rules.rules.get(kept.rule)) {
            (Some(r), Some(rule)) => kept.keep(&rule.check.pointers(), CallPart::Result, r),
            _ => Vec::new(),
        };
        self.note_unread(&unread);
        self.jobs.push(VerifyJob {
            rule: kept.rule,
            call: kept.into_call(),
            trace_id: p.trace_id,
            call_span_id: p.span_id,
            request_id: p.id_display.clone(),
            tool: p.tool.clone().unwrap_or_default(),
            call_start_ns: p.start_ns,
        });
    }

    fn push(&mut self, span: Span) {
        self.stats.spans += 1;
        self.spans.push(span);
    }

    fn request_sent_span(&mut self, p: &Pending) {
        let mut attrs = self.common_attrs(p, p.session_id.as_deref());
        attrs.push(s(a::CALL_PHASE, "request_sent"));
        let span = Span {
            trace_id: p.trace_id.to_vec(),
            span_id: new_span_id().to_vec(),
            parent_span_id: p.span_id.to_vec(),
            name: Self::span_name(p),
            kind: SpanKind::Client as i32,
            start_time_unix_nano: p.start_ns,
            end_time_unix_nano: p.start_ns,
            attributes: attrs,
            ..Default::default()
        };
        self.push(span);
    }

    fn response(&mut self, p: Pending, result: Option<Node<'_>>, error_reply: Option<Node<'_>>, ctx: &Ctx<'_>) {
        let session_id = ctx.assigned_session_id.or(p.session_id.as_deref()).map(str::to_string);
        let [protocol_version, result_type, is_error, request_state, task, supported] =
            result.map_or([None; 6], |r| r.pick(["protocolVersion", "resultType", "isError", "requestState", "task", "supportedVersions"]));
        // initialize: remember the negotiated version for the session's later spans.
        let mut negotiated: Option<String> = None;
        if p.method == "initialize" {
            negotiated = protocol_version.and_then(|v| v.as_str()).map(Cow::into_owned);
            if let Some(v) = &negotiated {
                let key = session_id.clone().unwrap_or_default();
                self.session(&key).protocol_version = Some(v.clone());
            }
        }
        let mut p = p;
        if negotiated.is_some() {
            p.protocol_version = negotiated.clone();
        }
        let mut attrs = self.common_attrs(&p, session_id.as_deref());
        if let Some(h) = ctx.http_status {
            attrs.push(int(a::HTTP_RESPONSE_STATUS_CODE, i64::from(h)));
        }
        if let Some(l) = ctx.local_addr {
            // The tap's end of the connection the request went over: the client the server saw.
            attrs.push(s(a::NETWORK_LOCAL_ADDRESS, l.ip().to_string()));
            attrs.push(int(a::NETWORK_LOCAL_PORT, i64::from(l.port())));
        }
        let mut error = false;
        let result_type = result_type.and_then(|t| t.as_str()).and_then(|t| ResultType::parse(&t));
        if let Some(t) = result_type {
            attrs.push(s(a::CALL_RESULT_TYPE, t.as_str()));
        }
        if p.task_id.is_some() && p.method.starts_with("tasks/") {
            // A task poll (or cancel): what it says about the task, not a call of its own.
            error = self.task_answer(&p, result, error_reply.is_some(), &mut attrs);
        } else if let Some(e) = error_reply {
            error = true;
            let [code, data] = e.pick(["code", "data"]);
            let code = code.and_then(|c| c.as_i64());
            match code {
                Some(code) => {
                    attrs.push(s(a::ERROR_TYPE, code.to_string()));
                    attrs.push(s(a::RPC_RESPONSE_STATUS_CODE, code.to_string()));
                    negotiation_refusal(code, data, &mut attrs);
                }
                None => attrs.push(s(a::ERROR_TYPE, "_OTHER")),
            }
            if p.method == "server/discover" && code != Some(-32601) {
                self.note_setup_failure(&p, ctx);
            }
        } else if is_error.and_then(|b| b.as_bool()) == Some(true) {
            error = true;
            attrs.push(s(a::ERROR_TYPE, "tool_error"));
        } else if result_type == Some(ResultType::InputRequired) {
            // An interim round: no verifier runs on it (nothing is done yet); its requestState
            // (by hash) leads the retry into this call's trace.
            if let Some(h) = request_state.and_then(|x| x.as_str()).map(|x| hash_of(&x)) {
                attrs.push(s(a::CALL_REQUEST_STATE_ISSUED, h.to_string()));
                self.rounds.insert(h, self.logical(&p));
            }
        } else if result_type == Some(ResultType::Task) {
            // The call goes on as a task: its polls join this call; the verifier runs on the
            // completed task's result.
            if let Some(h) = task.and_then(|t| t.get("taskId")).and_then(task_id_hash) {
                attrs.push(s(a::TASK_ID, h.to_string()));
                let mut l = self.logical(&p);
                l.verify = p.verify.clone();
                self.tasks.insert(h, l);
            }
            if let Some(t) = task {
                task_attrs(t, &mut attrs);
            }
        } else if let Some(r) = result {
            // A tool that says it succeeded: the rule checks whether it did.
            self.job(&p, Some(r));
        }
        let mut installed: Option<Span> = None;
        match p.method.as_str() {
            "initialize" => {
                if let Some(v) = &p.requested_version {
                    attrs.push(s(a::SESSION_REQUESTED_VERSION, v.to_string()));
                }
                if let Some(r) = result {
                    attrs.push(boolean(a::SESSION_LIST_CHANGED_CAPABILITY, list_changed_capability(r)));
                }
            }
            "server/discover" => {
                // Read as an `initialize` result is: the version asked for, whether the server
                // speaks it, and the tool-list capability (delivered on a listen stream).
                if let Some(v) = &p.protocol_version {
                    attrs.push(s(a::SESSION_REQUESTED_VERSION, redact::ident(v).to_string()));
                    if let Some(list) = supported.filter(|l| l.kind() == Kind::Array) {
                        attrs
                            .push(boolean(a::SESSION_VERSION_ACCEPTED, list.elements().any(|x| x.as_str().as_deref() == Some(v.as_str()))));
                    }
                }
                if let Some(r) = result {
                    attrs.push(boolean(a::SESSION_LIST_CHANGED_CAPABILITY, list_changed_capability(r)));
                }
            }
            "tools/list" => {
                if let Some(r) = result {
                    installed = self.list_page(&p, r, &mut attrs, session_id.as_deref(), ctx);
                }
            }
            _ => {}
        }
        self.push_call_span(&p, ctx.at_ns, attrs, error);
        if let Some(span) = installed {
            self.push(span);
        }
    }

    /// A `tools/list` page: cursor, nextCursor, digests; a complete traversal is installed.
    /// Returns the installed-registry span when the page completed a traversal.
    ///
    /// Each definition is digested from the bytes it was sent as (the digest builds its tree, so
    /// a definition longer than [`MAX_TOOL_DEFINITION`] is not digested), and a page or traversal
    /// holds at most [`MAX_CATALOG_TOOLS`] digests. A page past either is counted
    /// (`Oversize::Catalog`) and reported without its catalog (no `next_cursor_present`, no
    /// digests: the service does not take it for a page), and the traversal it is part of ends
    /// uninstalled: a catalog the tap could not read whole is never reported as installed.
    fn list_page(&mut self, p: &Pending, r: Node<'_>, attrs: &mut Vec<KeyValue>, session_id: Option<&str>, ctx: &Ctx<'_>) -> Option<Span> {
        let [next, tools, ttl, cache_scope] = r.pick(["nextCursor", "tools", "ttlMs", "cacheScope"]);
        // The empty string is a cursor, not the end of the list (2026-07-28): only an absent or
        // null nextCursor ends it.
        let next = next.and_then(|n| n.as_str()).map(|n| redact::cursor(&n));
        let mut digests = Vec::new();
        let (mut count, mut over) = (0usize, false);
        for t in tools.filter(|t| t.kind() == Kind::Array).iter().flat_map(|t| t.elements()) {
            count += 1;
            if over {
                continue;
            }
            if count > MAX_CATALOG_TOOLS || t.bytes().len() > MAX_TOOL_DEFINITION {
                over = true;
                digests = Vec::new();
                continue;
            }
            if let Ok(d) = self.digests.digest_raw(t.bytes()) {
                digests.push(d);
            }
        }
        if let Some(c) = p.cursor.as_deref() {
            attrs.push(s(a::CATALOG_CURSOR, c.to_string()));
        }
        if !over {
            attrs.push(boolean(a::CATALOG_NEXT_CURSOR_PRESENT, next.is_some()));
        }
        attrs.push(int(a::CATALOG_TOOL_COUNT, count as i64));
        if !over {
            let list: Vec<AnyValue> = digests
                .iter()
                .map(|d| AnyValue { value: Some(any_value::Value::StringValue(format!("{}={}", redact::ident(&d.name), d.digest))) })
                .collect();
            attrs.push(kv(a::CATALOG_TOOL_DIGESTS, any_value::Value::ArrayValue(ArrayValue { values: list })));
        }
        if let Some(ttl) = ttl.and_then(|t| t.as_i64()).filter(|t| *t >= 0) {
            attrs.push(int(a::CATALOG_TTL_MS, ttl));
        }
        if let Some(cs) = cache_scope.and_then(|c| c.as_str()) {
            attrs.push(s(a::CATALOG_CACHE_SCOPE, redact::ident(&cs).to_string()));
        }

        // The traversal: a first page starts one; a page continues it only when it sent the
        // cursor the previous page returned; the page without nextCursor completes it.
        let key = session_id.unwrap_or("").to_string();
        let st = self.session(&key);
        let first = p.cursor.is_none();
        let mut trav = if first {
            Some(Traversal::default())
        } else {
            match st.traversal.take() {
                Some(t) if t.expect.as_deref() == p.cursor.as_deref() => Some(t),
                _ => None, // a page whose beginning the tap did not see: no complete registry
            }
        };
        if trav.as_ref().is_some_and(|t| over || t.tools.len() + digests.len() > MAX_CATALOG_TOOLS) {
            trav = None;
            over = true;
        }
        let mut installed: Option<String> = None;
        if let Some(t) = trav.as_mut() {
            t.tools.extend(digests);
            match &next {
                Some(n) => t.expect = Some(n.clone()),
                None => installed = Some(registry_digest(&t.tools)),
            }
        }
        st.traversal = if installed.is_some() { None } else { trav };
        if over {
            self.stats.count(Oversize::Catalog);
        }
        installed.map(|d| {
            let mut iattrs =
                vec![s(a::CATALOG_INSTALLED_DIGEST, d), s(a::CATALOG_PROJECTION_VERSION, crate::classify::digest::PROJECTION_VERSION)];
            self.identity_attrs(&mut iattrs, session_id, p.protocol_version.as_deref());
            Span {
                trace_id: p.trace_id.to_vec(),
                span_id: new_span_id().to_vec(),
                parent_span_id: p.span_id.to_vec(),
                name: "mcp_health catalog installed".into(),
                kind: SpanKind::Internal as i32,
                start_time_unix_nano: ctx.at_ns,
                end_time_unix_nano: ctx.at_ns,
                attributes: iattrs,
                ..Default::default()
            }
        })
    }

    fn notification_span(&mut self, method: &str, trace: [u8; 16], parent: Option<[u8; 8]>, mut attrs: Vec<KeyValue>, ctx: &Ctx<'_>) {
        let mut all = vec![s(a::MCP_METHOD_NAME, method)];
        let sid = ctx.assigned_session_id.or(ctx.session_id);
        self.identity_attrs(&mut all, sid, ctx.protocol_version);
        all.append(&mut attrs);
        let span = Span {
            trace_id: trace.to_vec(),
            span_id: new_span_id().to_vec(),
            parent_span_id: parent.map(|p| p.to_vec()).unwrap_or_default(),
            name: method.to_string(),
            kind: SpanKind::Internal as i32,
            start_time_unix_nano: ctx.at_ns,
            end_time_unix_nano: ctx.at_ns,
            attributes: all,
            ..Default::default()
        };
        self.push(span);
    }

    fn list_changed(&mut self, ctx: &Ctx<'_>, subscription: bool) {
        // A traversal under way when the list changed is no longer a snapshot of one catalog.
        let key = ctx.session_id.unwrap_or("").to_string();
        if let Some(st) = self.sessions.get_mut(&key) {
            st.traversal = None;
        }
        self.notification_span(
            "notifications/tools/list_changed",
            new_trace_id(),
            None,
            vec![s(a::CATALOG_SIGNAL_SOURCE, if subscription { "subscription" } else { "notification" })],
            ctx,
        );
    }

    /// Where the next rounds (or the polls) of `p`'s logical call go.
    fn logical(&self, p: &Pending) -> Logical {
        Logical {
            trace_id: p.trace_id,
            parent: p.parent,
            call_span: p.span_id,
            request_id: p.id_display.clone(),
            tool: p.tool.clone().unwrap_or_default(),
            start_ns: p.start_ns,
            verify: None,
        }
    }

    /// A `tasks/get` / `tasks/cancel` answer: the task's status (`gone` when the server answers
    /// with an error: it no longer knows the task), and for a completed task its result, which
    /// the call's verifier rule then checks. Returns whether the span is an error.
    fn task_answer(&mut self, p: &Pending, r: Option<Node<'_>>, refused: bool, attrs: &mut Vec<KeyValue>) -> bool {
        if refused {
            if p.method == "tasks/get" || p.method == "tasks/result" {
                attrs.push(s(a::TASK_STATUS, TaskStatus::Gone.as_str()));
            }
            return true;
        }
        let task = r.and_then(|r| r.get("task")).or(r);
        if let Some(t) = task {
            task_attrs(t, attrs);
        }
        let status = task.and_then(|t| t.get("status"));
        if p.method == "tasks/cancel" && status.is_none() {
            return false;
        }
        match status.and_then(|x| x.as_str()).and_then(|x| TaskStatus::parse(&x)) {
            Some(TaskStatus::Completed) => {
                let result = r.and_then(|r| r.get("result")).or_else(|| task.and_then(|t| t.get("result")));
                if result.and_then(|x| x.get("isError")).and_then(|b| b.as_bool()) == Some(true) {
                    attrs.push(s(a::ERROR_TYPE, "tool_error"));
                    return true;
                }
                if let (Some(result), Some(l)) = (result, p.task_id.as_ref().and_then(|t| self.tasks.get(t)).cloned()) {
                    if let (Some(mut kept), Some(rules)) = (l.verify, &self.verifiers) {
                        let unread = match rules.rules.get(kept.rule) {
                            Some(rule) => kept.keep(&rule.check.pointers(), CallPart::Result, result),
                            None => Vec::new(),
                        };
                        self.note_unread(&unread);
                        self.jobs.push(VerifyJob {
                            rule: kept.rule,
                            call: kept.into_call(),
                            trace_id: l.trace_id,
                            call_span_id: l.call_span,
                            request_id: l.request_id.clone(),
                            tool: l.tool.clone(),
                            call_start_ns: l.start_ns,
                        });
                    }
                }
                false
            }
            Some(TaskStatus::Failed) => true,
            _ => false,
        }
    }

    /// A listen stream's event as a span in the stream's trace.
    fn listen_span(&mut self, l: &Listen, state: &str, tools: bool, ctx: &Ctx<'_>, p: Option<&Pending>) {
        let mut attrs = vec![
            s(a::MCP_METHOD_NAME, "subscriptions/listen"),
            s(a::SUBSCRIPTION_STATE, state),
            boolean(a::SUBSCRIPTION_TOOLS_LIST_CHANGED, tools),
            s(a::SUBSCRIPTION_ID, l.id_hash.to_string()),
        ];
        let version = p.and_then(|p| p.protocol_version.as_deref()).or(ctx.protocol_version);
        self.identity_attrs(&mut attrs, ctx.session_id, version);
        let span = Span {
            trace_id: l.trace_id.to_vec(),
            span_id: new_span_id().to_vec(),
            parent_span_id: l.span_id.to_vec(),
            name: format!("subscriptions/listen {state}"),
            kind: SpanKind::Internal as i32,
            start_time_unix_nano: ctx.at_ns,
            end_time_unix_nano: ctx.at_ns,
            attributes: attrs,
            ..Default::default()
        };
        self.push(span);
    }

    fn listen_acknowledged(&mut self, params: Option<Node<'_>>, ctx: &Ctx<'_>) {
        let [meta, notifications] = params.map_or([None; 2], |p| p.pick(["_meta", "notifications"]));
        let Some((k, _)) = meta.and_then(|m| m.get(META_SUBSCRIPTION_ID)).and_then(id_key) else { return };
        let key = (ctx.session_id.unwrap_or("").to_string(), k);
        let Some(l) = self.listens.get(&key).cloned() else { return };
        // What the server honoured.
        let honoured = notifications.and_then(|n| n.get("toolsListChanged")).and_then(|b| b.as_bool());
        self.listen_span(&l, "acknowledged", l.tools && honoured != Some(false), ctx, None);
    }

    fn listen_closed(&mut self, key: &(String, String), ctx: &Ctx<'_>) {
        if let Some(l) = self.listens.remove(key) {
            self.listen_span(&l, "closed", l.tools, ctx, None);
        }
    }

    fn progress(&mut self, params: Option<Node<'_>>, ctx: &Ctx<'_>) {
        let Some(params) = params else { return };
        let [token, progress, total] = params.pick(["progressToken", "progress", "total"]);
        let Some((tok, key)) = token.and_then(progress_token) else { return };
        let Some(value) = progress.and_then(|x| x.as_f64()) else { return };
        let session_key = ctx.session_id.unwrap_or("");
        // The call that supplied the token, in this session (on HTTP a notification may come on
        // the POST's stream or the session's GET stream).
        let call = self
            .pending
            .iter()
            .find(|((sk, _), p)| sk == session_key && p.progress_key.as_deref() == Some(key.as_str()))
            .map(|(_, p)| (p.trace_id, p.span_id));
        let (trace, parent) = match call {
            Some((t, p)) => (t, Some(p)),
            None => (new_trace_id(), None),
        };
        let mut attrs = vec![
            KeyValue { key: a::PROGRESS_TOKEN.into(), value: Some(tok), ..Default::default() },
            kv(a::PROGRESS_VALUE, any_value::Value::DoubleValue(value)),
        ];
        if let Some(total) = total.and_then(|x| x.as_f64()) {
            attrs.push(kv(a::PROGRESS_TOTAL, any_value::Value::DoubleValue(total)));
        }
        self.notification_span("notifications/progress", trace, parent, attrs, ctx);
    }
}

#[cfg(test)]
mod tests;
