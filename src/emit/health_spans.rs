//! One health span per decided call, in the same trace as the call and under its client span, so a
//! trace view shows the verdict beside the evidence. Built directly as OTLP protobuf so the trace
//! and parent ids are the call's own.

use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{span::SpanKind, status::StatusCode, ResourceSpans, ScopeSpans, Span, Status};
use sha2::{Digest, Sha256};

use crate::evidence::attributes as a;
use crate::verdict::{HealthState, Layer, Verdict};

fn kv(key: &str, v: any_value::Value) -> KeyValue {
    KeyValue { key: key.to_string(), value: Some(AnyValue { value: Some(v) }), ..Default::default() }
}
fn s(key: &str, v: impl Into<String>) -> KeyValue {
    kv(key, any_value::Value::StringValue(v.into()))
}

/// The health span of a verdict. `decided_ns` is when it was decided (the span's end).
pub fn health_span(v: &Verdict, decided_ns: u64) -> Span {
    let mut attrs = vec![
        s(a::VERDICT_STATE, v.state.as_str()),
        s(a::VERDICT_FIRST_FAILED_LAYER, v.first_failed_layer.map_or("none", |l| l.as_str())),
        s(a::VERDICT_CONFIDENCE, v.confidence.as_str()),
        s(a::VERDICT_NEXT_ACTION, v.next_action.clone()),
        kv(a::VERDICT_REVISION, any_value::Value::IntValue(i64::from(v.revision))),
        s(a::VERDICT_DECIDED_BY, v.decided_by.as_str()),
        kv(a::VERDICT_RETRY_SAFE, any_value::Value::BoolValue(v.retry_safe)),
        kv(a::VERDICT_PROTOCOL_SUCCESS, any_value::Value::BoolValue(v.protocol_success)),
        kv(a::VERDICT_VERIFIED_SUCCESS, any_value::Value::BoolValue(v.verified_success)),
    ];
    for l in Layer::ALL {
        attrs.push(s(&format!("{}{}", a::LAYER_PREFIX, l.as_str()), v.layers.get(l).as_str()));
    }
    if let Some(r) = &v.reason {
        attrs.push(s(a::VERDICT_REASON, r.clone()));
    }
    if let Some(p) = v.partial {
        attrs.push(s(a::VERDICT_PARTIAL, p.as_str()));
    }
    if let Some(m) = &v.method {
        attrs.push(s(a::MCP_METHOD_NAME, m.clone()));
    }
    if let Some(t) = &v.tool {
        attrs.push(s(a::GEN_AI_TOOL_NAME, t.to_string()));
    }
    if let Some(sv) = &v.server {
        attrs.push(s(a::SERVER_ADDRESS, sv.to_string()));
    }
    if let Some(r) = &v.request_id {
        attrs.push(s(a::JSONRPC_REQUEST_ID, r.to_string()));
    }
    if let Some(h) = &v.session_id_hash {
        attrs.push(s(a::SESSION_ID_HASH, h.clone()));
    }
    if let Some(sc) = &v.required_scope {
        attrs.push(s(a::AUTH_REQUIRED_SCOPE, sc.to_string()));
    }
    if let Some(m) = v.outcome_method {
        attrs.push(s(a::OUTCOME_METHOD_WRITTEN, m));
    }
    let status = match (v.state, v.first_failed_layer) {
        (HealthState::Healthy, _) => StatusCode::Ok,
        (_, Some(_)) => StatusCode::Error,
        _ => StatusCode::Unset,
    };
    Span {
        trace_id: v.trace_id.to_vec(),
        span_id: health_span_id(v),
        parent_span_id: v.span_id.to_vec(),
        name: format!("mcp_health verdict {}", v.method.as_deref().unwrap_or("unknown")),
        kind: SpanKind::Internal as i32,
        start_time_unix_nano: v.start_ns.min(decided_ns),
        end_time_unix_nano: decided_ns,
        attributes: attrs,
        status: Some(Status { code: status as i32, message: String::new() }),
        ..Default::default()
    }
}

/// A catalog verdict change as a health span, in the trace of the span that caused it.
pub fn catalog_span(c: &crate::correlate::CatalogChange, decided_ns: u64) -> Span {
    let v = &c.verdict;
    let mut attrs = vec![
        s(a::CATALOG_CONVERGENCE, v.convergence.as_str()),
        s(a::CATALOG_REASON, v.reason),
        s(a::CATALOG_NEXT_STEP, v.next_step),
        s(a::CATALOG_PROJECTION_VERSION, v.projection_version),
        s(
            a::CATALOG_CURSOR_CHAIN,
            v.cursor_chain.iter().map(|c| if c.is_empty() { "<first>" } else { c.as_str() }).collect::<Vec<_>>().join(" > "),
        ),
    ];
    for (k, t) in [
        (a::CATALOG_SIGNAL_AT, v.signal_at_ns),
        (a::CATALOG_TRAVERSAL_START, v.traversal_start_ns),
        (a::CATALOG_TRAVERSAL_END, v.traversal_end_ns),
    ] {
        if let Some(t) = t {
            attrs.push(kv(k, any_value::Value::IntValue(t as i64)));
        }
    }
    if let Some(d) = &v.discovered_digest {
        attrs.push(s(a::CATALOG_DISCOVERED_DIGEST, d.clone()));
    }
    if let Some(d) = &v.installed_digest {
        attrs.push(s(a::CATALOG_INSTALLED_DIGEST, d.clone()));
    }
    if let Some(sv) = &c.server {
        attrs.push(s(a::SERVER_ADDRESS, sv.to_string()));
    }
    attrs.push(s(a::SESSION_ID_HASH, crate::normalize::redact::hash_hex(c.session_key.as_bytes())));
    let mut h = Sha256::new();
    h.update(c.trace_id);
    h.update(c.span_id);
    h.update(v.convergence.as_str());
    let id = h.finalize()[..8].to_vec();
    Span {
        trace_id: c.trace_id.to_vec(),
        span_id: id,
        parent_span_id: c.span_id.to_vec(),
        name: "mcp_health catalog".into(),
        kind: SpanKind::Internal as i32,
        start_time_unix_nano: c.at_ns.min(decided_ns),
        end_time_unix_nano: decided_ns,
        attributes: attrs,
        status: Some(Status {
            code: if v.convergence == crate::classify::catalog::Convergence::Converged { StatusCode::Ok } else { StatusCode::Unset } as i32,
            message: String::new(),
        }),
        ..Default::default()
    }
}

/// A drift event as a health span under the `tools/list` span that showed the new definition.
pub fn drift_span(e: &crate::engine::DriftEvent, decided_ns: u64) -> Span {
    let mut attrs = vec![
        s(a::SERVER_ADDRESS, e.server.clone()),
        s(a::GEN_AI_TOOL_NAME, e.tool.clone()),
        s("mcp_health.drift.pinned_digest", e.pinned_digest.clone()),
        s("mcp_health.drift.digest", e.digest.clone()),
    ];
    let changes: Vec<AnyValue> = e.changes.iter().map(|c| AnyValue { value: Some(any_value::Value::StringValue(c.describe())) }).collect();
    attrs.push(kv(
        "mcp_health.drift.changes",
        any_value::Value::ArrayValue(opentelemetry_proto::tonic::common::v1::ArrayValue { values: changes }),
    ));
    let mut h = Sha256::new();
    h.update(e.trace_id);
    h.update(e.span_id);
    h.update(e.tool.as_bytes());
    h.update(b"drift");
    Span {
        trace_id: e.trace_id.to_vec(),
        span_id: h.finalize()[..8].to_vec(),
        parent_span_id: e.span_id.to_vec(),
        name: "mcp_health contract_drift".into(),
        kind: SpanKind::Internal as i32,
        start_time_unix_nano: decided_ns,
        end_time_unix_nano: decided_ns,
        attributes: attrs,
        status: Some(Status { code: StatusCode::Error as i32, message: String::new() }),
        ..Default::default()
    }
}

/// Deterministic per (trace, call, revision): a re-sent verdict has the same id, a revision a new one.
fn health_span_id(v: &Verdict) -> Vec<u8> {
    let mut h = Sha256::new();
    h.update(v.trace_id);
    h.update(v.span_id);
    h.update(v.revision.to_le_bytes());
    let d = h.finalize();
    let mut id = d[..8].to_vec();
    if id.iter().all(|b| *b == 0) {
        id[7] = 1;
    }
    id
}

/// Wrap health spans in one `ResourceSpans` of the service's resource. The resource carries
/// `mcp_health.emitter` (this process's id; the scope name `mcp-health` alone could be anyone's)
/// so a health span that comes back through a loop is recognized ([`crate::receive::loops`]).
pub fn resource_spans(service_name: &str, spans: Vec<Span>) -> ResourceSpans {
    ResourceSpans {
        resource: Some(Resource {
            attributes: vec![s("service.name", service_name), crate::receive::loops::emitter_attribute()],
            ..Default::default()
        }),
        scope_spans: vec![ScopeSpans {
            scope: Some(InstrumentationScope {
                name: "mcp-health".into(),
                version: env!("CARGO_PKG_VERSION").into(),
                ..Default::default()
            }),
            spans,
            ..Default::default()
        }],
        ..Default::default()
    }
}
