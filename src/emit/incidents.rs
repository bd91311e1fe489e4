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
pub fn attributes(t: Transition, inc: &Incident) -> Vec<KeyValue> {
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

/// One log record per transition.
pub fn log_records(service_name: &str, items: &[(Transition, Incident)], now_ns: u64) -> ExportLogsServiceRequest {
    let records = items
        .iter()
        .map(|(t, inc)| {
            let (sev, text) = match (t, inc.state) {
                (Transition::Resolved, _) => (SeverityNumber::Info, "INFO"),
                (_, IncidentState::Waiting) => (SeverityNumber::Info, "INFO"),
                _ => (SeverityNumber::Warn, "WARN"),
            };
            LogRecord {
                time_unix_nano: now_ns,
                observed_time_unix_nano: now_ns,
                severity_number: sev as i32,
                severity_text: text.into(),
                event_name: "mcp_health.incident".into(),
                body: Some(AnyValue {
                    value: Some(any_value::Value::StringValue(format!(
                        "incident {} {}: {} at {} ({} calls)",
                        inc.id,
                        t.as_str(),
                        inc.cause.state.as_str(),
                        inc.cause.server.as_deref().unwrap_or("unknown server"),
                        inc.calls
                    ))),
                }),
                attributes: attributes(*t, inc),
                ..Default::default()
            }
        })
        .collect();
    ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            resource: Some(Resource {
                attributes: vec![s("service.name", service_name), crate::receive::loops::emitter_attribute()],
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
