//! Dialect `traceloop`: traceloop's `opentelemetry-instrumentation-mcp` (`McpInstrumentor`;
//! instrumentation scope `opentelemetry.instrumentation.mcp.instrumentation`). It supports the
//! `mcp` SDK 1.x only.
//!
//! Observed with opentelemetry-instrumentation-mcp 0.62.4 on mcp 1.30.0 (tests/dialects/stack_v1.py):
//! - client: one INTERNAL span per request, `<tool>.tool` for `tools/call`
//!   (`traceloop.span.kind=tool`, `traceloop.entity.name=<tool>`) and `<method>.mcp` for the rest;
//!   status OK on a result, ERROR with `error.type=tool_error` for `isError`, ERROR with
//!   `error.type=<exception class>` when the call raised; a call cut short by cancellation (how the
//!   SDK 1.x client ends a refused HTTP request, 401/403) ends with status UNSET and no output. By
//!   default it records arguments and results (`traceloop.entity.input` / `.output`,
//!   `mcp.response.value`): never read here;
//! - a `ResponseStreamWriter` INTERNAL span under each request, on the client's write and again on
//!   the server's, carrying `mcp.request.id` (the JSON-RPC id); notifications get one with no
//!   attributes. With standalone FastMCP 2.x servers it adds `mcp.server` / `<tool>.tool` spans with
//!   `traceloop.workflow.name` (the server side);
//! - no `mcp.method.name`, no session, server address, protocol version, HTTP status, cursor,
//!   progress or list-changed evidence, no span kinds (all INTERNAL).
//!
//! Mapping: `<tool>.tool` → a `tools/call` of `traceloop.entity.name`, `<method>.mcp` → that
//! method; the side is the client's, or the server's when `traceloop.workflow.name` is present;
//! status OK → a response was observed; UNSET → the request was sent, no response observed (never
//! read as success); `error.type` as in the conventions. `ResponseStreamWriter` contributes only its
//! request id (it joins its request by ancestry).

use opentelemetry_proto::tonic::trace::v1::status::StatusCode;

use super::view::SpanView as Span;

use super::intern::{intern, Kind};
use super::{redact, semconv, value, Dialect};
use crate::evidence::attributes as a;
use crate::evidence::*;
use std::sync::Arc;

pub(crate) const SCOPE: &str = "opentelemetry.instrumentation.mcp.instrumentation";
const SPAN_KIND: &str = "traceloop.span.kind";
const ENTITY_NAME: &str = "traceloop.entity.name";
const WORKFLOW_NAME: &str = "traceloop.workflow.name";
const REQUEST_ID: &str = "mcp.request.id";

pub(crate) const DIALECT: Dialect = Dialect { name: "traceloop", scopes: &[SCOPE], sniff: |_| false, sniff_keys: &["traceloop."], read };

fn attr<'s>(span: &Span<'s>, key: &str) -> Option<&'s str> {
    span.attributes.iter().find(|kv| kv.key == key).and_then(|kv| value::as_str(&kv.value))
}

fn read(
    trace_id: TraceId,
    span_id: SpanId,
    span: &Span<'_>,
    service: Option<&Arc<str>>,
    _settings: &super::Settings,
    _type_errors: &mut u64,
) -> Option<SpanEvidence> {
    let name = span.name;
    let (method, tool): (Option<Method>, Option<&str>) = if name == "ResponseStreamWriter" {
        (None, None)
    } else if let Some(t) = name.strip_suffix(".tool").filter(|_| attr(span, SPAN_KIND) == Some("tool")) {
        (Some(Method::ToolsCall), Some(attr(span, ENTITY_NAME).unwrap_or(t)))
    } else if let Some(m) = name.strip_suffix(".mcp").filter(|m| m.contains('/') || *m == "initialize" || *m == "ping") {
        (Some(Method::parse(m)), None)
    } else {
        return None;
    };
    let request_id = span.attributes.iter().find(|kv| kv.key == REQUEST_ID).and_then(|kv| value::as_id(&kv.value));
    if method.is_none() && request_id.is_none() {
        return None;
    }
    let mut ev = SpanEvidence::new(trace_id, span_id);
    ev.parent_span_id = span.parent_span_id.try_into().ok().filter(|p: &SpanId| p.iter().any(|b| *b != 0));
    ev.start_ns = span.start_time_unix_nano;
    ev.end_ns = span.end_time_unix_nano.max(span.start_time_unix_nano);
    ev.service = service.cloned();
    ev.request_id = request_id.map(|r| redact::ident(&r));
    let Some(method) = method else {
        // `ResponseStreamWriter`: the request id only.
        ev.side = Side::Internal;
        return Some(ev);
    };
    ev.method = Some(method);
    ev.tool = tool.map(|t| intern(Kind::Tool, t, None, || t.to_string()));
    ev.side = if attr(span, WORKFLOW_NAME).is_some() { Side::Server } else { Side::Client };
    let status = span.status.as_ref().map_or(StatusCode::Unset as i32, |s| s.code);
    ev.status_error = status == StatusCode::Error as i32;
    ev.error = semconv::classify_error(None, attr(span, a::ERROR_TYPE));
    if status == StatusCode::Unset as i32 && ev.error.is_none() {
        // The instrumentation sets OK on every result; UNSET means the call never completed.
        ev.response_unobserved = true;
    }
    Some(ev)
}
