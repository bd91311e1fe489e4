//! A long call through the running service (issue 4, SPEC section 5): while it is in flight with
//! valid progress it is reported `working` (an interim verdict, `decided_by: in_flight`), its chain
//! is held open past `max_wait`, and when the response arrives the final verdict follows.

mod support;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use support::{Cfg, Service};

const TRACE: &str = "5a000000000000000000000000000001";
const CLIENT: &str = "0100000000000001";

fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64
}

fn attr(k: &str, v: Value) -> Value {
    let value = match v {
        Value::String(s) => json!({"stringValue": s}),
        Value::Number(n) if n.is_i64() => json!({"intValue": n.to_string()}),
        Value::Number(n) => json!({"doubleValue": n}),
        Value::Bool(b) => json!({"boolValue": b}),
        other => other,
    };
    json!({"key": k, "value": value})
}

fn line(service: &str, spans: Vec<Value>) -> Vec<u8> {
    json!({"resourceSpans": [{"resource": {"attributes": [attr("service.name", json!(service))]}, "scopeSpans": [{"spans": spans}]}]})
        .to_string()
        .into_bytes()
}

fn span(id: &str, parent: Option<&str>, name: &str, kind: u8, start: u64, end: u64, attrs: Vec<Value>) -> Value {
    let mut s = json!({"traceId": TRACE, "spanId": id, "name": name, "kind": kind, "startTimeUnixNano": start.to_string(), "endTimeUnixNano": end.to_string(), "attributes": attrs});
    if let Some(p) = parent {
        s["parentSpanId"] = json!(p);
    }
    s
}

fn call_attrs(extra: Vec<Value>) -> Vec<Value> {
    let mut a = vec![
        attr("mcp.method.name", json!("tools/call")),
        attr("gen_ai.tool.name", json!("export_report")),
        attr("jsonrpc.request.id", json!("42")),
        attr("server.address", json!("reports.example.test")),
        attr("mcp_health.progress.token", json!("tok-42")),
    ];
    a.extend(extra);
    a
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_flight_call_with_valid_progress_is_working_until_its_response_arrives() {
    let svc = Service::start(Cfg { decision_wait: "300ms", max_wait: "2s", ..Cfg::default() }).await;
    let t0 = now_ns();
    // The request left (a tap or a start-reporting instrumentation emits this marker)...
    let r = svc
        .post_json(&line(
            "agent",
            vec![span(
                CLIENT,
                None,
                "tools/call export_report",
                3,
                t0,
                t0,
                call_attrs(vec![attr("mcp_health.call.phase", json!("request_sent"))]),
            )],
        ))
        .await;
    assert_eq!(r.status, 200);
    // ...and the server reports progress, strictly increasing, for the request's token.
    let progress = |k: u64| {
        span(
            &format!("02000000000000{k:02}"),
            Some(CLIENT),
            "notifications/progress",
            2,
            t0 + k * 1_000_000,
            t0 + k * 1_000_000,
            vec![
                attr("mcp.method.name", json!("notifications/progress")),
                attr("mcp_health.progress.token", json!("tok-42")),
                attr("mcp_health.progress.value", json!(k * 10)),
                attr("mcp_health.progress.total", json!(100)),
            ],
        )
    };
    assert_eq!(svc.post_json(&line("reports-mcp", (1..=3).map(progress).collect())).await.status, 200);

    let v = svc.wait_verdicts(1, Duration::from_secs(20)).await;
    assert_eq!(v[0]["state"], "working", "{v:#?}");
    assert_eq!(v[0]["decided_by"], "in_flight");
    assert_eq!(v[0]["progress"]["valid_updates"], 3);

    // Past max_wait (2 s) the chain is still held: no final verdict while the call works. Keep the
    // progress coming so the inactivity window (30 s by default) is never the reason.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(svc.post_json(&line("reports-mcp", vec![progress(4)])).await.status, 200);
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(svc.verdicts().len(), 1, "held open past max_wait while working: {:#?}", svc.verdicts());

    // The response arrives: the final verdict follows, no longer working.
    let end = now_ns();
    assert_eq!(
        svc.post_json(&line("agent", vec![span("0100000000000009", None, "tools/call export_report", 3, t0, end, call_attrs(vec![]))]))
            .await
            .status,
        200
    );
    let v = svc.wait_verdicts(2, Duration::from_secs(20)).await;
    let last = v.last().unwrap();
    assert_ne!(last["state"], "working", "{last}");
    assert_eq!(last["state"], "unverified", "the call finished; nobody verified its outcome: {last}");
    assert_eq!(last["progress"]["valid_updates"], 4);
    let text = svc.metrics_text().await;
    assert!(text.contains("mcp_health_calls_working"), "{text}");
}
