//! Dialect `fastmcp`: FastMCP 3/4 native tracing (instrumentation scope `fastmcp`).
//!
//! Observed with fastmcp 4.2.3 on mcp 2.3.0 (tests/dialects/stack_fastmcp.py):
//! - client: a CLIENT span `tools/call <tool>` / `tools/list` with `mcp.method.name`,
//!   `gen_ai.tool.name`, `fastmcp.component.key`, `error.type=tool_error` for `isError`, and no
//!   request id, wrapping the SDK's own CLIENT span `MCP send …` that has the request id (two
//!   CLIENT spans per request: the correlator joins them as one request); the client negotiates
//!   2026-07-28 by default (`server/discover`, no `initialize`);
//! - server: one SERVER span per request (the "seam" span, `fastmcp.span.seam=true`) with
//!   `mcp.protocol.version`, `jsonrpc.request.id`, `mcp.session.id`, `enduser.*`; an exception in a
//!   tool and a `ToolError` both become `isError` results (`error.type=tool_error`), an unknown tool
//!   too but with `error.type=NotFoundError`; nested calls get INTERNAL spans;
//! - over streamable HTTP with HTTP server tracing on, the seam span is parented on the HTTP
//!   server span (`POST /mcp`) in a trace of its own, with no link to the client's trace (the
//!   correlator joins the halves: `correlate::crossjoin`); a refused request (401/403) leaves only
//!   the HTTP span on the server side and `-32603` on the SDK's client span;
//! - on 2026-07-28 the `mcp.session.id` is new on every request;
//! - nothing about cursors, progress or list-changed notifications, no metrics.
//!
//! Mapping: the conventions reader and the SDK-family corrections ([`super::mcp_sdk`]), plus:
//! `error.type=NotFoundError` on a `tools/call` is an unknown tool — a protocol failure by SPEC §3
//! (`protocol_error`, refresh discovery), even though FastMCP sends it as an `isError` result (this
//! reads the exception *type* FastMCP records, never message text; the rule for every dialect and
//! the tap is the catalog's, `classify::layers::evaluate_in`: a tool absent from the session's
//! converged catalog is unknown); a
//! `mcp.session.id` on a 2026-07-28 span is dropped (a per-request id is no session: catalog state
//! is then keyed by client and server, as SPEC §1 says for sessionless protocols).

use super::view::SpanView as Span;

use super::{value, Dialect};
use crate::evidence::attributes as a;
use crate::evidence::*;
use std::sync::Arc;

pub(crate) const SCOPE: &str = "fastmcp";

pub(crate) const DIALECT: Dialect = Dialect { name: "fastmcp", scopes: &[SCOPE], sniff: |_| false, sniff_keys: &["fastmcp."], read };

fn read(
    trace_id: TraceId,
    span_id: SpanId,
    span: &Span<'_>,
    service: Option<&Arc<str>>,
    settings: &super::Settings,
    type_errors: &mut u64,
) -> Option<SpanEvidence> {
    let mut ev = super::semconv::read_span(trace_id, span_id, span, service, settings, type_errors)?;
    super::mcp_sdk::correct_sdk_family(&mut ev, span);
    let error_type = span.attributes.iter().find(|kv| kv.key == a::ERROR_TYPE).and_then(|kv| value::as_str(&kv.value));
    if ev.method == Some(Method::ToolsCall) && error_type.is_some_and(|t| t == "NotFoundError" || t.ends_with(".NotFoundError")) {
        ev.error = Some(CallError::UnknownTool);
    }
    // A revision without sessions (2026-07-28 or later): the `mcp.session.id` FastMCP reports
    // there is per request.
    if ev.protocol_version.as_deref().is_some_and(|v| ProtocolRevision::of_version(v) == ProtocolRevision::Stateless) {
        ev.session_id = None;
    }
    Some(ev)
}
