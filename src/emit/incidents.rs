//! Incidents out: one OTLP log record per lifecycle transition (event name `mcp_health.incident`),
//! and the attributes of the incident row. Built as OTLP protobuf directly, like health spans.

use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, ArrayValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs, SeverityNumber};
use opentelemetry_proto::tonic::resource::v1::Resource;

use crate::classify::incidents::{Incident, IncidentState, Transition};

fn kv(key: &str, v: any_value::Value) -> KeyValue {
    KeyValue { key: key.to_string(), value: Some(AnyValue { value: Some(v) }), ..Default::default() }
}
fn s(key: &str, v: impl Into<String>) -> KeyValue {
    kv(key, any_value::Value::StringValue(v.into()))
}
fn i(key: &str, v: u64) -> KeyValue {
    kv(key, any_value::Value::IntValue(v.min(i64::MAX as u64) as i64))
}

/// The attributes of an incident row.
pub(crate) fn attributes(t: Transition, inc: &Incident) -> Vec<KeyValue> {
    let c = &inc.cause;
    let mut a = vec![
        s("event.name", "mcp_health.incident"),
        s("mcp_health.incident.id", inc.id.clone()),
        s("mcp_health.incident.transition", t.as_str()),
        s("mcp_health.incident.state", inc.state.as_str()),
        s("mcp_health.verdict.state", c.state.as_str()),
        s("mcp_health.verdict.first_failed_layer", c.first_failed_layer.map_or("none", |l| l.as_str())),
        i("mcp_health.incident.calls", inc.calls),
        i("mcp_health.incident.sessions", inc.sessions.len() as u64),
        i("mcp_health.incident.retry_count", inc.retry_count),
        i("mcp_health.incident.first_evidence", inc.first_evidence_ns),
        i("mcp_health.incident.last_evidence", inc.last_evidence_ns),
        s("mcp_health.verdict.confidence", inc.confidence.as_str()),
        s("mcp_health.verdict.next_action", inc.next_action.clone()),
        kv(
            "mcp_health.incident.agents",
            any_value::Value::ArrayValue(ArrayValue {
                values: inc.agents.iter().map(|a| AnyValue { value: Some(any_value::Value::StringValue(a.to_string())) }).collect(),
            }),
        ),
    ];
    if let Some(sv) = &c.server {
        a.push(s("server.address", sv.to_string()));
    }
    if let Some(t) = &c.tool {
        a.push(s("gen_ai.tool.name", t.to_string()));
    }
    if let Some(r) = &c.error_class {
        a.push(s("mcp_health.verdict.reason", r.clone()));
    }
    if let Some(h) = &c.credential_hash {
        a.push(s("mcp_health.incident.credential_owner_hash", h.to_string()));
    }
    if let Some(sc) = &inc.required_authority {
        a.push(s("mcp_health.incident.required_authority", sc.to_string()));
    }
    if let Some(vr) = inc.verifier_result {
        a.push(s("mcp_health.incident.verifier_result", vr.as_str()));
    }
    a
}

/// WARN for an incident that opens or is updated open, INFO for one resolved or waiting.
fn severity(t: Transition, inc: &Incident) -> (SeverityNumber, &'static str) {
    match (t, inc.state) {
        (Transition::Resolved, _) => (SeverityNumber::Info, "INFO"),
        (_, IncidentState::Waiting) => (SeverityNumber::Info, "INFO"),
        _ => (SeverityNumber::Warn, "WARN"),
    }
}

/// The record's body: one line a reader can take in at a glance.
fn body(t: Transition, inc: &Incident) -> String {
    format!(
        "incident {} {}: {} at {} ({} calls)",
        inc.id,
        t.as_str(),
        inc.cause.state.as_str(),
        inc.cause.server.as_deref().unwrap_or("unknown server"),
        inc.calls
    )
}

/// One log record per transition.
pub(crate) fn log_records(service_name: &str, items: &[(Transition, Incident)], now_ns: u64) -> ExportLogsServiceRequest {
    let records = items
        .iter()
        .map(|(t, inc)| {
            let (sev, text) = severity(*t, inc);
            LogRecord {
                time_unix_nano: now_ns,
                observed_time_unix_nano: now_ns,
                severity_number: sev as i32,
                severity_text: text.into(),
                event_name: "mcp_health.incident".into(),
                body: Some(AnyValue { value: Some(any_value::Value::StringValue(body(*t, inc))) }),
                attributes: attributes(*t, inc),
                ..Default::default()
            }
        })
        .collect();
    ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            resource: Some(Resource {
                attributes: vec![s("service.name", service_name), crate::flow::loops::emitter_attribute()],
                ..Default::default()
            }),
            scope_logs: vec![ScopeLogs {
                scope: Some(InstrumentationScope {
                    name: "mcp-health".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..Default::default()
                }),
                log_records: records,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

/// [`log_records`] written straight as protobuf (see `emit::pb`), in requests of at most
/// `max_bytes`: each request's bytes and record count.
pub(crate) fn encode_log_requests(
    service_name: &str,
    items: &[(Transition, &Incident)],
    now_ns: u64,
    max_bytes: usize,
) -> Vec<(bytes::Bytes, u64)> {
    use crate::emit::pb::{varint_len as vl, Val, Writer};
    use prost::Message;
    let frame = log_records(service_name, &[], now_ns);
    let rl = &frame.resource_logs[0];
    let resource = rl.resource.as_ref().map(|r| r.encode_to_vec()).unwrap_or_default();
    let scope = rl.scope_logs[0].scope.as_ref().map(|s| s.encode_to_vec()).unwrap_or_default();
    let mut packer = crate::emit::pb::Packer::new(resource, scope, max_bytes, items.len().saturating_mul(900));
    for (t, inc) in items {
        packer.push_with(|rec| {
            let (sev, text) = severity(*t, inc);
            rec.fixed64(1, now_ns);
            rec.int(2, sev as u64);
            rec.bytes(3, text.as_bytes());
            let body = body(*t, inc);
            rec.key(5, 2);
            rec.varint((1 + vl(body.len() as u64) + body.len()) as u64);
            rec.bytes(1, body.as_bytes());
            let c = &inc.cause;
            let int = |v: u64| Val::Int(v.min(i64::MAX as u64) as i64);
            rec.attribute(6, "event.name", Val::Str("mcp_health.incident"));
            rec.attribute(6, "mcp_health.incident.id", Val::Str(&inc.id));
            rec.attribute(6, "mcp_health.incident.transition", Val::Str(t.as_str()));
            rec.attribute(6, "mcp_health.incident.state", Val::Str(inc.state.as_str()));
            rec.attribute(6, "mcp_health.verdict.state", Val::Str(c.state.as_str()));
            rec.attribute(6, "mcp_health.verdict.first_failed_layer", Val::Str(c.first_failed_layer.map_or("none", |l| l.as_str())));
            rec.attribute(6, "mcp_health.incident.calls", int(inc.calls));
            rec.attribute(6, "mcp_health.incident.sessions", int(inc.sessions.len() as u64));
            rec.attribute(6, "mcp_health.incident.retry_count", int(inc.retry_count));
            rec.attribute(6, "mcp_health.incident.first_evidence", int(inc.first_evidence_ns));
            rec.attribute(6, "mcp_health.incident.last_evidence", int(inc.last_evidence_ns));
            rec.attribute(6, "mcp_health.verdict.confidence", Val::Str(inc.confidence.as_str()));
            rec.attribute(6, "mcp_health.verdict.next_action", Val::Str(&inc.next_action));
            let agents: Vec<&str> = inc.agents.iter().map(|a| &**a).collect();
            rec.attribute_strs(6, "mcp_health.incident.agents", &agents);
            let opt = |rec: &mut Writer, k: &str, v: Option<&str>| {
                if let Some(v) = v {
                    rec.attribute(6, k, Val::Str(v));
                }
            };
            opt(rec, "server.address", c.server.as_deref());
            opt(rec, "gen_ai.tool.name", c.tool.as_deref());
            opt(rec, "mcp_health.verdict.reason", c.error_class.as_deref());
            opt(rec, "mcp_health.incident.credential_owner_hash", c.credential_hash.as_deref());
            opt(rec, "mcp_health.incident.required_authority", inc.required_authority.as_deref());
            opt(rec, "mcp_health.incident.verifier_result", inc.verifier_result.map(|v| v.as_str()));
            rec.fixed64(11, now_ns);
            rec.bytes(12, b"mcp_health.incident");
        });
    }
    packer.finish()
}

#[cfg(test)]
mod direct_tests {
    use super::*;
    use crate::engine::Decided;
    use prost::Message;

    #[test]
    fn records_written_directly_are_the_generated_records() {
        let cfg = crate::config::Config::load(None).unwrap();
        let mut engine = crate::engine::Engine::new(crate::cli::replay::engine_config(&cfg));
        let mut sink = crate::emit::sink::Collect::default();
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
        let files = vec![
            format!("{dir}/incidents_five_expired.jsonl"),
            format!("{dir}/incidents_resolved.jsonl"),
            format!("{dir}/planted_secrets.jsonl"),
        ];
        crate::service::replay::replay(&files, &mut engine, &mut sink, &mut Vec::new());
        let items: Vec<(Transition, Incident)> = sink
            .0
            .iter()
            .filter_map(|r| match r {
                Decided::Incident(t) => Some((t.transition, t.row.clone())),
                _ => None,
            })
            .collect();
        assert!(items.len() >= 3 && items.iter().any(|(_, i)| !i.agents.is_empty()), "{}", items.len());
        let now = 1_764_000_000_000_000_000;
        let want = log_records("mcp-health", &items, now);
        let refs: Vec<(Transition, &Incident)> = items.iter().map(|(t, i)| (*t, i)).collect();
        let one = encode_log_requests("mcp-health", &refs, now, 4 << 20);
        assert_eq!(one.len(), 1);
        assert!(ExportLogsServiceRequest::decode(&one[0].0[..]).unwrap() == want, "same request");
        let many = encode_log_requests("mcp-health", &refs, now, 1500);
        assert!(many.len() > 1 && many.iter().all(|(b, _)| b.len() <= 1500));
        let recs: Vec<LogRecord> = many
            .iter()
            .flat_map(|(b, _)| ExportLogsServiceRequest::decode(&b[..]).unwrap().resource_logs)
            .flat_map(|r| r.scope_logs)
            .flat_map(|s| s.log_records)
            .collect();
        assert!(recs == want.resource_logs[0].scope_logs[0].log_records, "every record once, in order");
    }
}
