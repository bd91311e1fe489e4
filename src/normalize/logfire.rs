//! Dialect `logfire`: `logfire.instrument_mcp()` (instrumentation scope `logfire.mcp`). It
//! instruments the `mcp` SDK 1.x only (with 2.x it does nothing: the SDK's own spans are then the
//! `mcp_sdk` dialect).
//!
//! Observed with logfire 5.4.0 on mcp 1.30.0 (tests/dialects/stack_v1.py):
//! - client: one INTERNAL span per request, `MCP request: <method>[ <tool>]`, with `rpc.system=
//!   jsonrpc`, `rpc.jsonrpc.version`, `rpc.method`, and the whole request and result as JSON
//!   attributes `request` / `response` (arguments and results included); status UNSET on a result,
//!   ERROR with an `exception` event on a raised error (a refused HTTP request ends as a
//!   `CancelledError`); no request id, session, server address or protocol version;
//! - server: `MCP server handle request: <method>` INTERNAL spans, child of the client span
//!   through `_meta`, with `request` / `response` JSON (the response is the result, or the
//!   JSON-RPC error object);
//! - with `logfire.instrument_asgi` the HTTP server span is named `POST` (message `POST /mcp`) with
//!   `http.target` and `http.status_code`, in a trace of its own;
//! - no cursors, progress or list-changed evidence, no metrics.
//!
//! Mapping: the method from `rpc.method` or the span name, the tool from the span name; the side
//! from the name (`MCP request` = client, `MCP server handle request` = server). Of the bodies only
//! two fields are read, and only from `response`: a top-level `isError` and a top-level JSON-RPC
//! error `code` — nothing else of a body is parsed into evidence or kept. A span with a `response`
//! had a response; ERROR with an exception class is read like `error.type`; neither → no response
//! observed.

use opentelemetry_proto::tonic::trace::v1::status::StatusCode;

use super::view::SpanView as Span;

use super::intern::{intern, Kind};
use super::{semconv, value, Dialect};
use crate::evidence::*;
use std::sync::Arc;

pub(crate) const SCOPE: &str = "logfire.mcp";
const CLIENT_PREFIX: &str = "MCP request: ";
const SERVER_PREFIX: &str = "MCP server handle request: ";
/// Bodies larger than this are not parsed at all (their `isError` / `code` stay unknown).
const MAX_BODY: usize = 1 << 20;

pub(crate) const DIALECT: Dialect = Dialect {
    name: "logfire",
    scopes: &[SCOPE],
    sniff: |s| s.name.starts_with(CLIENT_PREFIX) || s.name.starts_with(SERVER_PREFIX),
    sniff_keys: &[],
    read,
};

/// The two fields of a response body mcp-health reads.
#[derive(serde::Deserialize)]
struct ResponseFacts {
    #[serde(rename = "isError", default)]
    is_error: Option<bool>,
    #[serde(default)]
    code: Option<i64>,
}

fn read(
    trace_id: TraceId,
    span_id: SpanId,
    span: &Span<'_>,
    service: Option<&Arc<str>>,
    _settings: &super::Settings,
    _type_errors: &mut u64,
) -> Option<SpanEvidence> {
    let (side, rest) = if let Some(r) = span.name.strip_prefix(CLIENT_PREFIX) {
        (Side::Client, r)
    } else if let Some(r) = span.name.strip_prefix(SERVER_PREFIX) {
        (Side::Server, r)
    } else {
        return None;
    };
    let rpc_method = span.attributes.iter().find(|kv| kv.key == "rpc.method").and_then(|kv| value::as_str(&kv.value));
    let mut words = rest.splitn(2, ' ');
    let method = rpc_method.or(words.next()).filter(|m| !m.is_empty())?;
    let mut ev = SpanEvidence::new(trace_id, span_id);
    ev.parent_span_id = span.parent_span_id.try_into().ok().filter(|p: &SpanId| p.iter().any(|b| *b != 0));
    ev.start_ns = span.start_time_unix_nano;
    ev.end_ns = span.end_time_unix_nano.max(span.start_time_unix_nano);
    ev.service = service.cloned();
    ev.side = side;
    ev.method = Some(Method::parse(method));
    if ev.method == Some(Method::ToolsCall) {
        let tool = rest.strip_prefix("tools/call ").map(str::trim).filter(|t| !t.is_empty() && t.len() <= 256);
        ev.tool = tool.map(|t| intern(Kind::Tool, t, None, || t.to_string()));
    }
    ev.status_error = span.status.as_ref().is_some_and(|s| s.code == StatusCode::Error as i32);
    let response = span.attributes.iter().find(|kv| kv.key == "response").and_then(|kv| value::as_str(&kv.value));
    if let Some(body) = response {
        if let Some(f) = response_facts(body) {
            if f.is_error == Some(true) {
                ev.error = Some(CallError::ToolError);
            } else if let Some(code) = f.code {
                ev.error = Some(CallError::jsonrpc(code));
            }
        }
    } else if ev.status_error {
        let class = span
            .events
            .iter()
            .filter(|e| e.name == "exception")
            .flat_map(|e| &e.attributes)
            .find(|kv| kv.key == "exception.type")
            .and_then(|kv| value::as_str(&kv.value));
        ev.error = Some(semconv::classify_error(None, class).unwrap_or(CallError::Unclassified));
    } else {
        ev.response_unobserved = true;
    }
    Some(ev)
}

/// `isError` and `code` at the top level of a response body, without keeping anything else. A
/// body that mentions neither key is not parsed.
fn response_facts(body: &str) -> Option<ResponseFacts> {
    if body.len() > MAX_BODY || !(body.contains("\"isError\":true") || body.contains("\"isError\": true") || body.contains("\"code\"")) {
        return None;
    }
    serde_json::from_str::<ResponseFacts>(body).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_top_level_is_error_and_code_are_read() {
        let f = response_facts(r#"{"meta":null,"content":[{"type":"text","text":"{\"code\": 7}"}],"isError":true}"#).unwrap();
        assert_eq!((f.is_error, f.code), (Some(true), None));
        let f = response_facts(r#"{"code":-32602,"message":"bad","data":null}"#).unwrap();
        assert_eq!(f.code, Some(-32602));
        assert!(response_facts(r#"{"content":[],"isError":false}"#).is_none());
    }
}
