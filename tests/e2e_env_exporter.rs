//! Issue 10: `OTEL_EXPORTER_OTLP_ENDPOINT` alone used to switch on pass-through of every received
//! span; pointed at the collector that feeds mcp-health, one span became 44,919 in 6 s. The
//! variable configures mcp-health's own telemetry (health spans, metrics) only.

mod support;

use std::time::Duration;

use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoint_variable_alone_sends_health_spans_but_never_the_received_spans() {
    let sink = Sink::start().await;
    let cfg = Cfg { exporter: None, env: vec![("OTEL_EXPORTER_OTLP_ENDPOINT", sink.endpoint())], ..Cfg::default() };
    let svc = Service::start(cfg).await;
    let lines = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/eight_calls.jsonl")).unwrap();
    for l in lines.lines().filter(|l| !l.trim().is_empty()) {
        assert_eq!(svc.post_json(l.as_bytes()).await.status, 200);
    }
    sink.wait_for(Duration::from_secs(30), "health spans from the variable's endpoint", |s| (s.health_spans().len() >= 8).then_some(()))
        .await;
    // Give a pass-through (if any) time to arrive, then check nothing but health spans came.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let passed: Vec<String> = sink.spans().into_iter().filter(|s| !s.is_health_span()).map(|s| s.span.name.clone()).collect();
    assert!(passed.is_empty(), "received spans were passed through: {passed:?}");
}
