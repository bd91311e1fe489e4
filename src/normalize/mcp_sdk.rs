//! Dialect `mcp_sdk`: the built-in OpenTelemetry tracing of the `mcp` Python SDK 2.x
//! (instrumentation scope `mcp-python-sdk`).
//!
//! Observed with mcp 2.3.0 (tests/dialects/stack_sdk.py):
//! - client: one CLIENT span per request, `MCP send <method>[ <tool>]`, with `mcp.method.name` and
//!   `jsonrpc.request.id` only (no `gen_ai.tool.name`, no `server.address`, no session id); on a
//!   JSON-RPC error `error.type` and `rpc.response.status_code` as strings. Any HTTP status >= 400
//!   (401, 403, 404, 5xx) is reported as `-32603` ("Server returned an error response"), and an
//!   uncaught server exception arrives as code `0` on the legacy (initialize) handshake;
//! - server: one SERVER span per request, `<method>[ <tool>]`, child of the client span through
//!   `_meta` trace context (over streamable HTTP too: the SDK's extracted context wins over an HTTP
//!   server span, which then sits alone in its own trace), with `mcp.protocol.version`,
//!   `gen_ai.tool.name`, `error.type=tool_error` for `isError`, the code for an `MCPError`, or the
//!   exception class for anything else (answered to the client as `0` / `-32603`);
//!   `notifications/initialized` gets a SERVER span in a trace of its own;
//! - nothing about cursors, progress or list-changed notifications, no session id, no metrics.
//!
//! Mapping: the conventions reader ([`super::semconv`]) plus four corrections: the tool name from
//! the span name when the attribute is missing; code `0` is read as `-32603` (internal error, by the shared `CallError::jsonrpc`);
//! an exception class on a server request span is read as the `-32603` the SDK answered with;
//! a client's `-32603` is marked as possibly the client's own rendering of a refused HTTP request
//! (see `CallEvidence::settle`).

use super::view::SpanView as Span;

use super::intern::{intern, Kind};
use super::Dialect;
use crate::evidence::*;
use std::sync::Arc;

pub(crate) const SCOPE: &str = "mcp-python-sdk";

pub(crate) const DIALECT: Dialect =
    Dialect { name: "mcp_sdk", scopes: &[SCOPE], sniff: |s| s.name.starts_with("MCP send "), sniff_keys: &[], read };

fn read(
    trace_id: TraceId,
    span_id: SpanId,
    span: &Span<'_>,
    service: Option<&Arc<str>>,
    settings: &super::Settings,
    type_errors: &mut u64,
) -> Option<SpanEvidence> {
    let mut ev = super::semconv::read_span(trace_id, span_id, span, service, settings, type_errors)?;
    correct_sdk_family(&mut ev, span);
    let is_request = ev.method.as_ref().is_some_and(|m| !m.is_notification());
    if ev.side == Side::Client && is_request && ev.error.is_none() && !ev.status_error {
        // The SDK never sets status OK, and a request whose connection died ends this span the
        // same way an answered one does (the "connection closed" error is raised after the span
        // ended): no error here is no sign of an answer. The call's answer is evidenced by its
        // server span, the tap, or another client span that records errors (FastMCP's).
        ev.response_unobserved = true;
    }
    Some(ev)
}

/// The corrections shared by everything built on the SDK 2.x (the SDK's own spans, FastMCP's).
pub(crate) fn correct_sdk_family(ev: &mut SpanEvidence, span: &Span<'_>) {
    if ev.tool.is_none() && ev.method == Some(Method::ToolsCall) {
        if let Some(t) = tool_from_name(span.name) {
            ev.tool = Some(intern(Kind::Tool, t, None, || t.to_string()));
        }
    }
    let is_request = ev.method.as_ref().is_some_and(|m| !m.is_notification());
    // Code 0 (an uncaught server exception on the legacy handshake) is already read as -32603 by
    // the conventions reader (`CallError::jsonrpc`, the one normalization of every source).
    if ev.error == Some(CallError::Unclassified) && ev.side == Side::Server && is_request {
        // The server span names the exception class; the client was answered with an internal error.
        ev.error = Some(CallError::jsonrpc(-32603));
    }
    if ev.side == Side::Client && ev.error == Some(CallError::JsonRpc(-32603)) {
        ev.error_maybe_client_rendered = true;
    }
}

/// `MCP send tools/call x` (client) or `tools/call x` (server) → `x`.
pub(crate) fn tool_from_name(name: &str) -> Option<&str> {
    let rest = name.strip_prefix("MCP send ").unwrap_or(name);
    let tool = rest.strip_prefix("tools/call ")?.trim();
    (!tool.is_empty() && tool.len() <= 256).then_some(tool)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_names_from_span_names() {
        assert_eq!(tool_from_name("MCP send tools/call echo"), Some("echo"));
        assert_eq!(tool_from_name("tools/call echo"), Some("echo"));
        assert_eq!(tool_from_name("MCP send tools/list"), None);
        assert_eq!(tool_from_name("tools/call "), None);
    }
}
