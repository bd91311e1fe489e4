//! End to end: OTLP metrics and logs (issue 10). Received over gRPC and OTLP/HTTP (protobuf and
//! JSON), they reach the upstream sink unchanged when pass-through is on; with it off they are
//! accepted, counted and not forwarded.

mod support;

use std::time::Duration;

use opentelemetry_proto::tonic::collector::logs::v1::logs_service_client::LogsServiceClient;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_client::MetricsServiceClient;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use opentelemetry_proto::tonic::metrics::v1::{
    metric, number_data_point, Gauge, Histogram, HistogramDataPoint, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;
use support::*;
use tonic::codec::CompressionEncoding;

const WAIT: Duration = Duration::from_secs(30);

fn resource(service: &str) -> Option<Resource> {
    Some(Resource { attributes: vec![kv_str("service.name", service)], ..Default::default() })
}

/// A sum, a gauge and a histogram: 2 + 1 + 1 data points.
fn metrics_request(tag: &str) -> ExportMetricsServiceRequest {
    let t = now_ns();
    let point = |v: i64, who: &str| NumberDataPoint {
        attributes: vec![kv_str("route", who)],
        start_time_unix_nano: t - 1_000_000_000,
        time_unix_nano: t,
        value: Some(number_data_point::Value::AsInt(v)),
        ..Default::default()
    };
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: resource("metrics-client"),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(InstrumentationScope { name: "e2e".into(), version: "1".into(), ..Default::default() }),
                metrics: vec![
                    Metric {
                        name: format!("requests.{tag}"),
                        unit: "{request}".into(),
                        description: "requests".into(),
                        data: Some(metric::Data::Sum(Sum {
                            data_points: vec![point(5, "a"), point(7, "b")],
                            aggregation_temporality: 2,
                            is_monotonic: true,
                        })),
                        ..Default::default()
                    },
                    Metric {
                        name: format!("queue.depth.{tag}"),
                        data: Some(metric::Data::Gauge(Gauge {
                            data_points: vec![NumberDataPoint {
                                time_unix_nano: t,
                                value: Some(number_data_point::Value::AsDouble(1.5)),
                                ..Default::default()
                            }],
                        })),
                        ..Default::default()
                    },
                    Metric {
                        name: format!("latency.{tag}"),
                        unit: "ms".into(),
                        data: Some(metric::Data::Histogram(Histogram {
                            data_points: vec![HistogramDataPoint {
                                start_time_unix_nano: t - 1_000_000_000,
                                time_unix_nano: t,
                                count: 3,
                                sum: Some(12.5),
                                bucket_counts: vec![1, 2, 0],
                                explicit_bounds: vec![5.0, 10.0],
                                ..Default::default()
                            }],
                            aggregation_temporality: 2,
                        })),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

/// Two log records.
fn logs_request(tag: &str) -> ExportLogsServiceRequest {
    let t = now_ns();
    let record = |i: i64| LogRecord {
        time_unix_nano: t,
        observed_time_unix_nano: t + 1,
        severity_number: 9,
        severity_text: "INFO".into(),
        body: Some(AnyValue { value: Some(any_value::Value::StringValue(format!("hello {tag} {i}"))) }),
        attributes: vec![kv_int("n", i), kv_str("tag", tag)],
        trace_id: new_trace_id().to_vec(),
        span_id: new_span_id().to_vec(),
        ..Default::default()
    };
    ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            resource: resource("logs-client"),
            scope_logs: vec![ScopeLogs {
                scope: Some(InstrumentationScope { name: "e2e".into(), ..Default::default() }),
                log_records: vec![record(1), record(2)],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

async fn channel(svc: &Service) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{}", svc.grpc_addr()))
        .unwrap()
        .timeout(Duration::from_secs(30))
        .connect()
        .await
        .expect("connect to the gRPC receiver")
}

async fn post(svc: &Service, path: &str, content_type: &str, body: &[u8]) -> HttpResponse {
    http_request(svc.http_addr(), "POST", path, &[("Content-Type", content_type)], body).await.expect("POST")
}

/// Send metrics and logs three ways each: gRPC (zstd), HTTP protobuf, HTTP JSON.
async fn send_all(svc: &Service, metrics: &[ExportMetricsServiceRequest; 3], logs: &[ExportLogsServiceRequest; 3]) {
    let ch = channel(svc).await;
    MetricsServiceClient::new(ch.clone())
        .send_compressed(CompressionEncoding::Zstd)
        .export(metrics[0].clone())
        .await
        .expect("gRPC metrics export accepted");
    LogsServiceClient::new(ch).export(logs[0].clone()).await.expect("gRPC logs export accepted");

    let r = post(svc, "/v1/metrics", "application/x-protobuf", &metrics[1].encode_to_vec()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/x-protobuf"));
    let r = post(svc, "/v1/logs", "application/x-protobuf", &logs[1].encode_to_vec()).await;
    assert_eq!(r.status, 200, "{}", r.text());

    let r = post(svc, "/v1/metrics", "application/json", &serde_json::to_vec(&metrics[2]).unwrap()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    let r = post(svc, "/v1/logs", "application/json", &serde_json::to_vec(&logs[2]).unwrap()).await;
    assert_eq!(r.status, 200, "{}", r.text());
}

fn requests() -> ([ExportMetricsServiceRequest; 3], [ExportLogsServiceRequest; 3]) {
    (
        [metrics_request("grpc"), metrics_request("http_proto"), metrics_request("http_json")],
        [logs_request("grpc"), logs_request("http_proto"), logs_request("http_json")],
    )
}

/// A resource without `mcp_health.via`; an empty one is no resource.
fn unmark(r: &mut Option<opentelemetry_proto::tonic::resource::v1::Resource>) {
    if let Some(res) = r.as_mut() {
        res.attributes.retain(|kv| kv.key != "mcp_health.via");
    }
    if r.as_ref().is_some_and(|res| *res == Default::default()) {
        *r = None;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_logs_pass_through_unchanged() {
    let sink = Sink::start().await;
    // mcp-health's own metrics off, so every metrics request at the sink is a passed-on one.
    // `mcp_health.exporter.sent` (requests) is a `detailed` instrument.
    let svc = Service::start(Cfg { otlp_metrics: false, metrics_level: Some("detailed"), ..Cfg::with_sink(&sink) }).await;
    let (metrics, logs) = requests();
    send_all(&svc, &metrics, &logs).await;

    // Unchanged but for the loop marker on each resource (`mcp_health.via`: this instance's id).
    let unmark_metrics = |mut r: ExportMetricsServiceRequest| {
        for rm in &mut r.resource_metrics {
            unmark(&mut rm.resource);
        }
        r
    };
    let unmark_logs = |mut r: ExportLogsServiceRequest| {
        for rl in &mut r.resource_logs {
            unmark(&mut rl.resource);
        }
        r
    };
    for (i, m) in metrics.iter().enumerate() {
        let m = unmark_metrics(m.clone());
        sink.wait_for(WAIT, &format!("metrics request {i} at the sink, unchanged"), |s| {
            s.metric_requests().into_iter().map(unmark_metrics).any(|r| r == m).then_some(())
        })
        .await;
    }
    for (i, l) in logs.iter().enumerate() {
        let l = unmark_logs(l.clone());
        sink.wait_for(WAIT, &format!("logs request {i} at the sink, unchanged"), |s| {
            s.log_requests().into_iter().map(unmark_logs).any(|r| r == l).then_some(())
        })
        .await;
    }
    for r in sink.metric_requests().iter().flat_map(|r| &r.resource_metrics) {
        let via = r.resource.as_ref().map(|r| r.attributes.iter().filter(|kv| kv.key == "mcp_health.via").count());
        assert_eq!(via, Some(1), "every resource passed on names this instance once: {r:?}");
    }
    assert_eq!(sink.metric_requests().len(), 3, "each metrics request is passed on once");

    // 4 data points and 2 log records per request, by transport.
    let text = svc.wait_metric("mcp_health_signals_received_total", WAIT, |v| v >= 18.0).await;
    assert!(text.contains("signal=\"metrics\"") && text.contains("signal=\"logs\""), "{text}");
    svc.wait_metric("mcp_health_exporter_sent_total", WAIT, |v| v >= 6.0).await;
    assert_eq!(prom_sum(&svc.metrics_text().await, "mcp_health_signals_dropped_total").unwrap_or(0.0), 0.0);
    svc.assert_alive(WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_logs_are_counted_and_dropped_when_pass_through_is_off() {
    let sink = Sink::start().await;
    let svc = Service::start(Cfg { otlp_metrics: false, passthrough: false, ..Cfg::with_sink(&sink) }).await;
    let (metrics, logs) = requests();
    send_all(&svc, &metrics, &logs).await;

    let text = svc.wait_metric("mcp_health_signals_dropped_total", WAIT, |v| v >= 18.0).await;
    assert!(text.contains("reason=\"passthrough_off\""), "{text}");
    svc.wait_metric("mcp_health_signals_received_total", WAIT, |v| v >= 18.0).await;
    // Spans still reach the sink as health spans; nothing of the metrics and logs does.
    let trace = new_trace_id();
    svc.grpc_export(request("agent", vec![call_span(trace, new_span_id(), None, "t", "1", vec![])])).await.expect("accepted");
    sink.wait_for(WAIT, "a health span (the exporter works)", |s| {
        s.health_spans().iter().any(|h| h.span.trace_id == trace.to_vec()).then_some(())
    })
    .await;
    assert!(sink.metric_requests().is_empty(), "metrics were forwarded: {:?}", sink.metric_requests());
    let ours = |l: &ExportLogsServiceRequest| logs.contains(l);
    assert!(!sink.log_requests().iter().any(ours), "logs were forwarded");
    svc.assert_alive(WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_metrics_and_logs_are_refused_permanently() {
    let svc = Service::start(Cfg::default()).await;
    for path in ["/v1/metrics", "/v1/logs"] {
        let r = post(&svc, path, "application/x-protobuf", b"\xff\xff\xff not protobuf").await;
        assert_eq!(r.status, 400, "{path}: {}", r.text());
        let r = post(&svc, path, "application/json", b"{nope").await;
        assert_eq!(r.status, 400, "{path}: {}", r.text());
        let r = post(&svc, path, "text/plain", b"x").await;
        assert_eq!(r.status, 415, "{path}: {}", r.text());
    }
    let text = svc.wait_metric("mcp_health_signals_refused_total", WAIT, |v| v >= 6.0).await;
    assert!(text.contains("reason=\"undecodable\""), "{text}");
    svc.assert_alive(WAIT).await;
}

/// Metrics and logs reserve a place in the export queue before they are accepted, as spans do:
/// with the upstream down and the queue full they get UNAVAILABLE / 503 + Retry-After (retryable),
/// never an acceptance that is then lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_export_queue_refuses_metrics_and_logs_retryably() {
    let dead = dead_port();
    let svc = Service::start(Cfg {
        exporter: Some(format!("http://127.0.0.1:{}", dead.port)),
        sending_queue_size: 1,
        exporter_timeout: "1s",
        otlp_metrics: false,
        health_spans: false,
        // Workers hold a request for ~5 s, so the queue stays full during the flood.
        retry_on_failure: Some("      enabled: true\n      initial_interval: 500ms\n      max_interval: 1s\n      max_elapsed_time: 5s"),
        ..Cfg::default()
    })
    .await;

    let mut set = tokio::task::JoinSet::new();
    for i in 0..16 {
        let ch = channel(&svc).await;
        set.spawn(async move {
            if i % 2 == 0 {
                MetricsServiceClient::new(ch).export(metrics_request("flood")).await.map(|_| ())
            } else {
                LogsServiceClient::new(ch).export(logs_request("flood")).await.map(|_| ())
            }
        });
    }
    let mut unavailable = 0;
    while let Some(r) = set.join_next().await {
        match r.unwrap() {
            Ok(()) => {}
            Err(s) if is_busy(&s) => unavailable += 1,
            Err(s) => panic!("unexpected answer to a flood request: {s:?}"),
        }
    }
    assert!(unavailable >= 1, "no RESOURCE_EXHAUSTED with RetryInfo among 16 gRPC metrics/logs requests");

    // Concurrent, like the gRPC flood: sent one after another, each request could find the place
    // the one before it left (a worker that gave up on its request frees one), which made this
    // test fail about once in many runs.
    let mut busy = 0;
    let mut set = tokio::task::JoinSet::new();
    for (i, path) in ["/v1/metrics", "/v1/logs"].iter().cycle().take(16).enumerate() {
        let body = if i % 2 == 0 { metrics_request("flood").encode_to_vec() } else { logs_request("flood").encode_to_vec() };
        let addr = svc.http_addr();
        let path = path.to_string();
        set.spawn(async move {
            let r = http_request(addr, "POST", &path, &[("Content-Type", "application/x-protobuf")], &body).await.expect("POST");
            (path, r)
        });
    }
    while let Some(done) = set.join_next().await {
        let (path, r) = done.unwrap();
        match r.status {
            200 => {}
            503 => {
                assert!(r.header("retry-after").is_some_and(|v| v.parse::<u64>().is_ok()), "{:?}", r.headers);
                busy += 1;
            }
            s => panic!("unexpected HTTP {s} on {path}: {}", r.text()),
        }
    }
    assert!(busy >= 1, "no 503 among 16 HTTP metrics/logs requests");

    let text = svc.wait_metric("mcp_health_signals_refused_total", WAIT, |v| v > 0.0).await;
    assert!(text.contains("reason=\"exporter_busy\""), "{text}");
    svc.assert_alive(WAIT).await;
    drop(svc);
    drop(dead);
}
