//! Issue 11, "found while measuring, fix first": regression tests.

mod support;

use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use support::*;

/// Oversize health-span requests stalled every export: one flush of many verdicts became a
/// request above the receiver's limit, refused and retried for minutes. Requests are split below
/// `exporters.otlp.max_request_bytes`; every health span arrives, in requests that fit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_spans_of_one_flush_are_split_below_max_request_bytes() {
    let sink = Sink::start().await;
    let limit = 16 * 1024;
    let svc = Service::start(Cfg {
        passthrough: false,
        otlp_metrics: false,
        exporter_lines: Some(format!("    max_request_bytes: {limit}")),
        ..Cfg::with_sink(&sink)
    })
    .await;
    // 400 calls in one request: their verdicts are decided together and flushed together.
    let spans: Vec<_> =
        (0..400u32).map(|i| call_span(trace_id(i), [1; 8], None, "create_ticket", &i.to_string(), vec![kv_bool("x.ok", true)])).collect();
    svc.grpc_export(request("agent", spans)).await.expect("accepted");
    let n = sink.wait_for(Duration::from_secs(30), "400 health spans", |s| Some(s.health_spans().len()).filter(|n| *n >= 400)).await;
    assert_eq!(n, 400, "every health span arrived once");
    let reqs: Vec<ExportTraceServiceRequest> =
        sink.trace_requests().into_iter().filter(|r| flatten(std::slice::from_ref(r)).iter().any(|s| s.is_health_span())).collect();
    assert!(reqs.len() > 1, "one flush became several requests");
    for r in &reqs {
        assert!(r.encoded_len() <= limit, "a request of {} bytes passed max_request_bytes {limit}", r.encoded_len());
    }
    let text = svc.metrics_text().await;
    assert!(prom_sum(&text, "mcp_health_exporter_split_requests_total").is_some_and(|v| v >= 1.0), "splits are counted: {text}");
}

fn trace_id(i: u32) -> [u8; 16] {
    let mut t = [0x11; 16];
    t[12..].copy_from_slice(&i.to_be_bytes());
    t
}
