//! One health span per decided call, in the same trace as the call and under its client span, so a
//! trace view shows the verdict beside the evidence. Built directly as OTLP protobuf so the trace
//! and parent ids are the call's own.

use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{span::SpanKind, status::StatusCode, ResourceSpans, ScopeSpans, Span, Status};
use sha2::{Digest, Sha256};

use crate::emit::pb::Writer;
use crate::evidence::attributes as a;
use crate::verdict::{HealthState, Layer, Verdict};

fn kv(key: &str, v: any_value::Value) -> KeyValue {
    KeyValue { key: key.to_string(), value: Some(AnyValue { value: Some(v) }), ..Default::default() }
}
fn s(key: &str, v: impl Into<String>) -> KeyValue {
    kv(key, any_value::Value::StringValue(v.into()))
}

/// The health span of a verdict. `decided_ns` is when it was decided (the span's end).
#[cfg(test)]
pub(crate) fn health_span(v: &Verdict, decided_ns: u64) -> Span {
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
        s(a::PROTOCOL_REVISION, v.protocol_revision.as_str()),
    ];
    if let Some(pv) = &v.protocol_version {
        attrs.push(s(a::MCP_PROTOCOL_VERSION, pv.to_string()));
    }
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
        attrs.push(s(a::SESSION_ID_HASH, h.to_string()));
    }
    if let Some(sc) = &v.required_scope {
        attrs.push(s(a::AUTH_REQUIRED_SCOPE, sc.to_string()));
    }
    if let Some(m) = v.outcome_method {
        attrs.push(s(a::OUTCOME_METHOD_WRITTEN, m));
    }
    if let Some(t) = v.outcome_trust {
        attrs.push(s(a::OUTCOME_TRUST, t.as_str()));
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

/// `mcp_health.layer.<layer>`, once.
fn layer_key(l: Layer) -> &'static str {
    static KEYS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    let keys = KEYS.get_or_init(|| Layer::ALL.iter().map(|l| format!("{}{}", a::LAYER_PREFIX, l.as_str())).collect());
    let i = Layer::ALL.iter().position(|x| *x == l).unwrap_or(0);
    &keys[i]
}

/// [`health_span`], written straight as protobuf (a `Span` message's content) into `w`: the same
/// span, without a `String` per attribute (see `emit::pb`).
pub(crate) fn write_health_span(w: &mut Writer, v: &Verdict, decided_ns: u64) {
    use crate::emit::pb::Val::{Bool, Int, Str};
    w.bytes(1, &v.trace_id);
    w.bytes(2, &health_span_id(v));
    w.bytes(4, &v.span_id);
    let method = v.method.as_deref().unwrap_or("unknown");
    let name_len = "mcp_health verdict ".len() + method.len();
    w.key(5, 2);
    w.varint(name_len as u64);
    w.buf.extend_from_slice(b"mcp_health verdict ");
    w.buf.extend_from_slice(method.as_bytes());
    w.int(6, SpanKind::Internal as u64);
    w.fixed64(7, v.start_ns.min(decided_ns));
    w.fixed64(8, decided_ns);
    w.attribute(9, a::VERDICT_STATE, Str(v.state.as_str()));
    w.attribute(9, a::VERDICT_FIRST_FAILED_LAYER, Str(v.first_failed_layer.map_or("none", |l| l.as_str())));
    w.attribute(9, a::VERDICT_CONFIDENCE, Str(v.confidence.as_str()));
    w.attribute(9, a::VERDICT_NEXT_ACTION, Str(&v.next_action));
    w.attribute(9, a::VERDICT_REVISION, Int(i64::from(v.revision)));
    w.attribute(9, a::VERDICT_DECIDED_BY, Str(v.decided_by.as_str()));
    w.attribute(9, a::VERDICT_RETRY_SAFE, Bool(v.retry_safe));
    w.attribute(9, a::VERDICT_PROTOCOL_SUCCESS, Bool(v.protocol_success));
    w.attribute(9, a::VERDICT_VERIFIED_SUCCESS, Bool(v.verified_success));
    w.attribute(9, a::PROTOCOL_REVISION, Str(v.protocol_revision.as_str()));
    if let Some(pv) = &v.protocol_version {
        w.attribute(9, a::MCP_PROTOCOL_VERSION, Str(pv));
    }
    for l in Layer::ALL {
        w.attribute(9, layer_key(l), Str(v.layers.get(l).as_str()));
    }
    let opt = |w: &mut Writer, k: &str, x: Option<&str>| {
        if let Some(x) = x {
            w.attribute(9, k, Str(x));
        }
    };
    opt(w, a::VERDICT_REASON, v.reason.as_deref());
    opt(w, a::VERDICT_PARTIAL, v.partial.map(|p| p.as_str()));
    opt(w, a::MCP_METHOD_NAME, v.method.as_deref());
    opt(w, a::GEN_AI_TOOL_NAME, v.tool.as_deref());
    opt(w, a::SERVER_ADDRESS, v.server.as_deref());
    opt(w, a::JSONRPC_REQUEST_ID, v.request_id.as_deref());
    opt(w, a::SESSION_ID_HASH, v.session_id_hash.as_deref());
    opt(w, a::AUTH_REQUIRED_SCOPE, v.required_scope.as_deref());
    opt(w, a::OUTCOME_METHOD_WRITTEN, v.outcome_method);
    opt(w, a::OUTCOME_TRUST, v.outcome_trust.map(|t| t.as_str()));
    let status = match (v.state, v.first_failed_layer) {
        (HealthState::Healthy, _) => StatusCode::Ok,
        (_, Some(_)) => StatusCode::Error,
        _ => StatusCode::Unset,
    };
    // Status { code }: field 3 of a message that is field 15 (empty when the code is UNSET).
    if status as i32 == 0 {
        w.bytes(15, &[]);
    } else {
        w.bytes(15, &[0x18, status as u8]);
    }
}

/// Whether `encode_requests` makes a health span of the record.
pub(crate) fn makes_span(r: &crate::engine::Decided) -> bool {
    use crate::engine::Decided;
    !matches!(r, Decided::Incident(_) | Decided::Finding(_))
}

/// Health spans as encoded `ExportTraceServiceRequest`s of at most `max_bytes` each (a span
/// larger than that alone is one request): one `ResourceSpans` of the service's resource (see
/// [`resource_spans`]) per request. Returns each request's bytes and span count.
pub(crate) fn encode_requests(
    service_name: &str,
    records: &[crate::engine::Decided],
    now_ns: u64,
    max_bytes: usize,
    buffers: &crate::emit::pb::Buffers,
) -> Vec<(bytes::Bytes, u64)> {
    use crate::engine::Decided;
    use prost::Message;
    // The resource and the scope, as `resource_spans` makes them; a span is about 1 KB.
    let frame = resource_spans(service_name, Vec::new());
    let resource = frame.resource.map(|r| r.encode_to_vec()).unwrap_or_default();
    let scope = frame.scope_spans.first().and_then(|s| s.scope.as_ref()).map(|s| s.encode_to_vec()).unwrap_or_default();
    let mut packer = crate::emit::pb::Packer::new(resource, scope, max_bytes, records.len().saturating_mul(1200)).with_buffers(buffers);
    for r in records {
        match r {
            Decided::Call(v) | Decided::Interim(v) => packer.push_with(|w| write_health_span(w, v, now_ns)),
            Decided::Catalog(c) => packer.push_with(|w| catalog_span(c, now_ns).encode(&mut w.buf).unwrap_or(())),
            Decided::Drift(d) => packer.push_with(|w| drift_span(d, now_ns).encode(&mut w.buf).unwrap_or(())),
            Decided::Incident(_) | Decided::Finding(_) => continue,
        }
        debug_assert!(makes_span(r));
    }
    packer.finish()
}

/// A catalog verdict change as a health span, in the trace of the span that caused it.
pub(crate) fn catalog_span(c: &crate::correlate::CatalogChange, decided_ns: u64) -> Span {
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
pub(crate) fn drift_span(e: &crate::engine::DriftEvent, decided_ns: u64) -> Span {
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
/// so a health span that comes back through a loop is recognized ([`crate::flow::loops`]).
pub(crate) fn resource_spans(service_name: &str, spans: Vec<Span>) -> ResourceSpans {
    ResourceSpans {
        resource: Some(Resource {
            attributes: vec![s("service.name", service_name), crate::flow::loops::emitter_attribute()],
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Decided, Engine};
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use prost::Message;

    /// What the engine decides for the repository's fixtures (calls, catalog changes, drift).
    fn decided() -> Vec<Decided> {
        let cfg = crate::config::Config::load(None).unwrap();
        let mut engine = Engine::new(crate::cli::replay::engine_config(&cfg));
        let mut sink = crate::emit::sink::Collect::default();
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
        let files: Vec<String> =
            ["nine_states.jsonl", "catalog_cases.jsonl", "drift_before.jsonl", "drift_after.jsonl", "planted_secrets.jsonl"]
                .iter()
                .map(|f| format!("{dir}/{f}"))
                .collect();
        crate::service::replay::replay(&files, &mut engine, &mut sink, &mut Vec::new());
        sink.0
    }

    #[test]
    fn spans_written_directly_are_the_generated_spans_of_the_same_records() {
        let mut records = decided();
        // Every optional attribute: a partial verdict too.
        let partial = records.iter().find_map(|r| match r {
            Decided::Call(v) => Some(Verdict::clone(v)),
            _ => None,
        });
        if let Some(mut v) = partial {
            v.partial = Some(crate::verdict::Partial::DecidedAtShutdown);
            records.push(Decided::Call(std::sync::Arc::new(v)));
        }
        let calls = records.iter().filter(|r| matches!(r, Decided::Call(_))).count();
        let catalog = records.iter().filter(|r| matches!(r, Decided::Catalog(_))).count();
        assert!(calls >= 9 && catalog >= 1, "{calls} calls, {catalog} catalog changes");
        let now = 1_764_000_000_000_000_000;
        let want: Vec<Span> = records
            .iter()
            .filter_map(|r| match r {
                Decided::Call(v) | Decided::Interim(v) => Some(health_span(v, now)),
                Decided::Catalog(c) => Some(catalog_span(c, now)),
                Decided::Drift(d) => Some(drift_span(d, now)),
                _ => None,
            })
            .collect();
        let buffers = crate::emit::pb::Buffers::default();
        let one = encode_requests("mcp-health", &records, now, 4 << 20, &buffers);
        assert_eq!(one.len(), 1);
        let got = ExportTraceServiceRequest::decode(&one[0].0[..]).unwrap();
        assert!(got == ExportTraceServiceRequest { resource_spans: vec![resource_spans("mcp-health", want.clone())] }, "same request");
        assert_eq!(one[0].1, want.len() as u64);
        // A small limit: several requests, each within it (a span is about 1 KB), all spans kept in order.
        let many = encode_requests("mcp-health", &records, now, 3000, &buffers);
        assert!(many.len() > 3);
        assert!(many.iter().all(|(b, _)| b.len() <= 3000), "{:?}", many.iter().map(|(b, _)| b.len()).collect::<Vec<_>>());
        let spans: Vec<Span> = many
            .iter()
            .flat_map(|(b, _)| ExportTraceServiceRequest::decode(&b[..]).unwrap().resource_spans)
            .flat_map(|rs| rs.scope_spans)
            .flat_map(|ss| ss.spans)
            .collect();
        assert!(spans == want, "every span once, in order");
        assert_eq!(many.iter().map(|(_, n)| n).sum::<u64>(), want.len() as u64);
    }
}
