//! Issue 11, "found while measuring, fix first": regression tests.

mod support;

use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use support::*;

/// Oversize health-span requests stalled every export: one flush of many verdicts became a
/// request above the receiver's limit, refused and retried for minutes. Health spans are now packed
/// into requests below `exporters.otlp.max_request_bytes` as they are written (no split needed);
/// a pass-through request above it is split (at its `ResourceSpans`, then its scopes), counted.
/// Every span arrives once, in requests that fit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_spans_of_one_flush_are_split_below_max_request_bytes() {
    let sink = Sink::start().await;
    let limit = 16 * 1024;
    // `mcp_health.exporter.split_requests` is a `detailed` instrument.
    let svc = Service::start(Cfg {
        metrics_level: Some("detailed"),
        passthrough: true,
        otlp_metrics: false,
        exporter_lines: Some(format!("    max_request_bytes: {limit}")),
        ..Cfg::with_sink(&sink)
    })
    .await;
    // 400 calls in one request of 8 resources: their verdicts are decided together and flushed together.
    let mut req = ExportTraceServiceRequest::default();
    for r in 0..8u32 {
        let spans: Vec<_> = (r * 50..(r + 1) * 50)
            .map(|i| call_span(trace_id(i), [1; 8], None, "create_ticket", &i.to_string(), vec![kv_bool("x.ok", true)]))
            .collect();
        req.resource_spans.extend(request(&format!("agent-{r}"), spans).resource_spans);
    }
    assert!(req.encoded_len() > 2 * limit);
    svc.grpc_export(req).await.expect("accepted");
    let n = sink.wait_for(Duration::from_secs(30), "400 health spans", |s| Some(s.health_spans().len()).filter(|n| *n >= 400)).await;
    assert_eq!(n, 400, "every health span arrived once");
    let passed = sink
        .wait_for(Duration::from_secs(30), "400 passed-on spans", |s| {
            Some(s.spans().into_iter().filter(|x| !x.is_health_span()).count()).filter(|n| *n >= 400)
        })
        .await;
    assert_eq!(passed, 400, "every passed-on span arrived once");
    let reqs = sink.trace_requests();
    let health: Vec<&ExportTraceServiceRequest> =
        reqs.iter().filter(|r| flatten(std::slice::from_ref(*r)).iter().any(|s| s.is_health_span())).collect();
    assert!(health.len() > 1, "one flush became several requests");
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
