//! End to end: real OTLP in (the Rust SDK's gRPC exporter, and OTLP/HTTP with every body
//! encoding), pass-through spans, health spans and metrics out to an OTLP sink, verdict lines on
//! stdout, Prometheus text, and a graceful SIGTERM.

mod support;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, SystemTime};

use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt, Tracer, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use prost::Message;
use support::*;

const WAIT: Duration = Duration::from_secs(30);

fn sdk_call_attrs(tool: &str, rid: &str) -> Vec<KeyValue> {
    vec![
        KeyValue::new("mcp.method.name", "tools/call"),
        KeyValue::new("gen_ai.tool.name", tool.to_string()),
        KeyValue::new("gen_ai.operation.name", "execute_tool"),
        KeyValue::new("jsonrpc.request.id", rid.to_string()),
        KeyValue::new("mcp.session.id", "sess-e2e-sdk"),
        KeyValue::new("mcp.protocol.version", "2025-11-25"),
        KeyValue::new("network.transport", "tcp"),
        KeyValue::new("server.address", "tickets.example.test"),
        KeyValue::new("server.port", 8443_i64),
    ]
}

fn exporter(endpoint: String) -> opentelemetry_otlp::SpanExporter {
    opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .with_timeout(Duration::from_secs(10))
        .build()
        .expect("build the OTLP span exporter")
}

/// What one SDK-made trace should come out as.
struct Expect {
    trace_id: [u8; 16],
    client_span_id: [u8; 8],
    state: &'static str,
    first_failed_layer: &'static str,
}

/// One call: a CLIENT span, optionally a SERVER span under it and a verifier span under it.
fn make_call(
    tracer: &opentelemetry_sdk::trace::SdkTracer,
    tool: &str,
    rid: &str,
    client_extra: Vec<KeyValue>,
    server: Option<Vec<KeyValue>>,
    verifier: Option<Vec<KeyValue>>,
    error: bool,
) -> ([u8; 16], [u8; 8]) {
    let t0 = SystemTime::now() - Duration::from_millis(500);
    let ms = |n: u64| t0 + Duration::from_millis(n);
    let mut attrs = sdk_call_attrs(tool, rid);
    attrs.extend(client_extra);
    let client = tracer
        .span_builder(format!("tools/call {tool}"))
        .with_kind(SpanKind::Client)
        .with_attributes(attrs)
        .with_start_time(ms(0))
        .start_with_context(tracer, &Context::new());
    let sc = client.span_context().clone();
    let cx = Context::new().with_span(client);
    if let Some(extra) = server {
        let mut attrs = sdk_call_attrs(tool, rid);
        attrs.extend(extra);
        let mut s = tracer
            .span_builder(format!("tools/call {tool}"))
            .with_kind(SpanKind::Server)
            .with_attributes(attrs)
            .with_start_time(ms(5))
            .start_with_context(tracer, &cx);
        if error {
            opentelemetry::trace::Span::set_status(&mut s, Status::error("tool error"));
        }
        opentelemetry::trace::Span::end_with_timestamp(&mut s, ms(35));
    }
    if error {
        cx.span().set_status(Status::error("call failed"));
    }
    cx.span().end_with_timestamp(ms(40));
    if let Some(attrs) = verifier {
        let mut v = tracer
            .span_builder("verify destination")
            .with_kind(SpanKind::Internal)
            .with_attributes(attrs)
            .with_start_time(ms(60))
            .start_with_context(tracer, &cx);
        opentelemetry::trace::Span::end_with_timestamp(&mut v, ms(95));
    }
    (sc.trace_id().to_bytes(), sc.span_id().to_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sdk_spans_pass_through_unchanged_and_each_call_gets_one_health_span_and_metrics() {
    let sink = Sink::start().await;
    // The same spans, exported by a second exporter straight to a reference sink: what the SDK
    // put on the wire, to compare the pass-through against.
    let reference = Sink::start().await;
    let svc = Service::start(Cfg::with_sink(&sink)).await;

    let provider = SdkTracerProvider::builder()
        .with_resource(Resource::builder().with_service_name("e2e-agent").build())
        .with_batch_exporter(exporter(format!("http://{}", svc.grpc_addr())))
        .with_batch_exporter(exporter(reference.endpoint()))
        .build();
    let tracer = provider.tracer("e2e-pipeline");

    let mut expect = Vec::new();
    let (t, c) = make_call(
        &tracer,
        "create_ticket",
        "1",
        vec![],
        Some(vec![]),
        Some(vec![KeyValue::new("mcp_health.outcome.result", "confirmed"), KeyValue::new("mcp_health.outcome.method", "receipt")]),
        false,
    );
    expect.push(Expect { trace_id: t, client_span_id: c, state: "healthy", first_failed_layer: "none" });
    let (t, c) = make_call(
        &tracer,
        "create_ticket",
        "2",
        vec![KeyValue::new("error.type", "tool_error")],
        Some(vec![KeyValue::new("error.type", "tool_error")]),
        None,
        true,
    );
    expect.push(Expect { trace_id: t, client_span_id: c, state: "tool_failed", first_failed_layer: "execution" });
    let (t, c) = make_call(
        &tracer,
        "create_ticket",
        "3",
        vec![
            KeyValue::new("http.response.status_code", 403_i64),
            KeyValue::new("mcp_health.auth.error", "insufficient_scope"),
            KeyValue::new("mcp_health.auth.required_scope", "tickets:write"),
        ],
        None,
        None,
        true,
    );
    expect.push(Expect { trace_id: t, client_span_id: c, state: "needs_auth", first_failed_layer: "authorization" });
    let sent_spans = 3 + 2 + 1;

    let p = provider.clone();
    tokio::task::spawn_blocking(move || p.force_flush()).await.unwrap().expect("force_flush");

    // Pass-through: every span the SDK sent arrives at the sink, byte for byte the same span,
    // under the same resource and scope.
    let sent =
        reference.wait_for(WAIT, "the reference sink to get every span", |s| Some(s.spans()).filter(|v| v.len() >= sent_spans)).await;
    assert_eq!(sent.len(), sent_spans, "the SDK exported each span once");
    let sent_ids: HashSet<Vec<u8>> = sent.iter().map(|s| s.span.span_id.clone()).collect();
    let passed = sink
        .wait_for(WAIT, "every sent span to be passed through", |s| {
            let got: Vec<ReceivedSpan> = s.spans().into_iter().filter(|r| !r.is_health_span()).collect();
            let ids: HashSet<Vec<u8>> = got.iter().map(|r| r.span.span_id.clone()).collect();
            sent_ids.is_subset(&ids).then_some(got)
        })
        .await;
    for want in &sent {
        let got: Vec<&ReceivedSpan> = passed.iter().filter(|r| r.span.span_id == want.span.span_id).collect();
        assert_eq!(got.len(), 1, "span {} passed through exactly once", hex(&want.span.span_id));
        // Unchanged but for the loop marker on the resource (`mcp_health.via`: this instance's id).
        let mut got = got[0].clone();
        let res = got.resource.as_mut().expect("resource");
        let before = res.attributes.len();
        res.attributes.retain(|kv| kv.key != "mcp_health.via");
        assert_eq!(before, res.attributes.len() + 1, "one loop marker on the resource");
        assert_eq!(&got, want, "span {} ({}) changed in pass-through", hex(&want.span.span_id), want.span.name);
    }
    // And the spans are what we made (names, ids and MCP attributes), not just equal to each other.
    for e in &expect {
        let client = sent.iter().find(|s| s.span.span_id == e.client_span_id).expect("client span sent");
        assert_eq!(client.span.trace_id, e.trace_id);
        assert_eq!(client.span.name, "tools/call create_ticket");
        assert_eq!(client.span.kind, opentelemetry_proto::tonic::trace::v1::span::SpanKind::Client as i32);
        assert!(attr_is(&client.span.attributes, "mcp.method.name", "tools/call"));
        assert!(attr_is(&client.span.attributes, "gen_ai.tool.name", "create_ticket"));
    }
    let verifier = sent.iter().find(|s| s.span.name == "verify destination").expect("verifier span");
    assert!(attr_is(&verifier.span.attributes, "mcp_health.outcome.result", "confirmed"));
    assert_eq!(verifier.span.parent_span_id, expect[0].client_span_id.to_vec());

    // One health span per call, in the call's trace, under its client span.
    let traces: HashSet<Vec<u8>> = expect.iter().map(|e| e.trace_id.to_vec()).collect();
    sink.wait_for(WAIT, "a health span for each of the three traces", |s| {
        let got: HashSet<Vec<u8>> = s.health_spans().into_iter().map(|h| h.span.trace_id).collect();
        traces.is_subset(&got).then_some(())
    })
    .await;

    // Metrics over OTLP: the verdict counter by state and the two success counters.
    let all = |_: &[opentelemetry_proto::tonic::common::v1::KeyValue]| true;
    sink.wait_for(WAIT, "OTLP metrics: 3 calls, 2 protocol successes, 1 verified success, 1 verdict per state", |s| {
        let ok = s.metric_sum("mcp_health.calls", all) == Some(3)
            && s.metric_sum("mcp_health.calls.protocol_success", all) == Some(2)
            && s.metric_sum("mcp_health.calls.verified_success", all) == Some(1)
            && s.metric_sum("mcp_health.verdicts", all) == Some(3)
            && ["healthy", "tool_failed", "needs_auth"]
                .iter()
                .all(|st| s.metric_sum("mcp_health.verdicts", |a| attr_is(a, "state", st)) == Some(1));
        ok.then_some(())
    })
    .await;
    assert_eq!(sink.metric_sum("mcp_health.verdicts", |a| attr_is(a, "first_failed_layer", "authorization")), Some(1));
    assert_eq!(sink.metric_sum("mcp_health.verdicts", |a| attr_is(a, "first_failed_layer", "execution")), Some(1));

    // By now (over a second of metric intervals later, several decision_waits) any second
    // verdict for a trace would have been sent too.
    let health = sink.health_spans();
    for e in &expect {
        let hs: Vec<&ReceivedSpan> = health.iter().filter(|h| h.span.trace_id == e.trace_id).collect();
        assert_eq!(hs.len(), 1, "exactly one health span for trace {}: {hs:#?}", hex(&e.trace_id));
        let h = hs[0];
        assert_eq!(h.span.parent_span_id, e.client_span_id.to_vec(), "health span's parent is the client span");
        assert!(!passed.iter().any(|p| p.span.span_id == h.span.span_id), "health span id is new");
        assert_eq!(h.attr_str("mcp_health.verdict.state"), Some(e.state), "state of trace {}", hex(&e.trace_id));
        assert_eq!(h.attr_str("mcp_health.verdict.first_failed_layer"), Some(e.first_failed_layer));
        assert_eq!(h.attr_str("mcp_health.verdict.decided_by"), Some("quiet"));
        for layer in ["transport", "protocol", "authorization", "execution", "outcome"] {
            let v = h.attr_str(&format!("mcp_health.layer.{layer}"));
            assert!(matches!(v, Some("passed" | "failed" | "unobserved")), "layer {layer}: {v:?}");
        }
        let resource = h.resource.as_ref().expect("health span resource");
        assert!(attr_is(&resource.attributes, "service.name", "mcp-health"));
    }
    let auth = health.iter().find(|h| h.span.trace_id == expect[2].trace_id).unwrap();
    assert_eq!(auth.attr_str("mcp_health.auth.required_scope"), Some("tickets:write"));
    assert_eq!(auth.attr_str("mcp_health.layer.authorization"), Some("failed"));
    assert_eq!(auth.attr_str("mcp_health.layer.execution"), Some("unobserved"), "layers after the first failed one are unobserved");

    // The same three verdicts were printed.
    let verdicts = svc.wait_verdicts(3, WAIT).await;
    assert_eq!(verdicts.len(), 3, "{verdicts:#?}");
    for e in &expect {
        let v = verdicts.iter().find(|v| v["trace_id"] == hex(&e.trace_id)).expect("verdict line for trace");
        assert_eq!(v["state"], e.state);
        assert_eq!(v["span_id"], hex(&e.client_span_id));
    }

    let p = provider.clone();
    tokio::task::spawn_blocking(move || p.shutdown()).await.unwrap().expect("provider shutdown");
    assert!(svc.running(), "service still running");
}

/// Every encoding the OTLP/HTTP receiver takes: JSON, protobuf, each plain and gzip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_http_fixture_in_every_encoding_gives_verdict_lines_and_prometheus_rates() {
    // Client, server and verifier spans of one call come in separate requests; a decision_wait
    // well above the gap between two local POSTs keeps each call decided once, even on a busy
    // machine (a later span would revise the verdict and count the call again).
    let svc = Service::start(Cfg { decision_wait: "1s", ..Cfg::default() }).await;
    let lines = fixture_lines("eight_calls.jsonl");
    for (i, line) in lines.iter().enumerate() {
        let proto = mcp_health::testing::receive::otlp_json::decode_traces(line.as_bytes()).expect("fixture line decodes").encode_to_vec();
        let (ct, gz, body, is_json) = match i % 4 {
            0 => ("application/json", false, line.as_bytes().to_vec(), true),
            1 => ("application/x-protobuf", false, proto, false),
            2 => ("application/x-protobuf", true, proto, false),
            _ => ("application/json", true, line.as_bytes().to_vec(), true),
        };
        let r = svc.post_traces(ct, gz, &body).await;
        assert_eq!(r.status, 200, "line {i} ({ct}, gzip={gz}): {}", r.text());
        if is_json {
            assert!(r.header("content-type").is_some_and(|c| c.starts_with("application/json")), "JSON answered in JSON");
            let body: serde_json::Value = serde_json::from_slice(&r.body).expect("JSON response");
            let rejected =
                body.pointer("/partialSuccess/rejectedSpans").and_then(|v| v.as_i64().or_else(|| v.as_str()?.parse().ok())).unwrap_or(0);
            assert_eq!(rejected, 0, "{body}");
        } else {
            let resp = opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse::decode(&r.body[..])
                .expect("protobuf response");
            assert!(resp.partial_success.as_ref().is_none_or(|p| p.rejected_spans == 0), "{resp:?}");
        }
    }

    let expected = fixture_json("eight_calls.expected.json");
    let calls = expected["calls"].as_object().unwrap();
    let verdicts = svc.wait_verdicts(calls.len(), WAIT).await;

    let text = svc.wait_metric("mcp_health_calls_total", WAIT, |v| v == 8.0).await;
    assert_eq!(prom_sum(&text, "mcp_health_calls_protocol_success_total"), Some(3.0), "{text}");
    assert_eq!(prom_sum(&text, "mcp_health_calls_verified_success_total"), Some(1.0), "{text}");
    assert_eq!(prom_sum(&text, "mcp_health_verdicts_total"), Some(8.0), "{text}");
    assert!(prom_sum(&text, "mcp_health_spans_received_total").is_some_and(|v| v >= 15.0), "{text}");

    let verdicts_now = svc.verdicts();
    assert_eq!(verdicts_now.len(), calls.len(), "one verdict per call, no revisions: {verdicts_now:#?}");
    let by_trace: HashMap<String, &serde_json::Value> = verdicts.iter().map(|v| (v["trace_id"].as_str().unwrap().to_string(), v)).collect();
    for (trace, want) in calls {
        let v = by_trace.get(trace).unwrap_or_else(|| panic!("no verdict for {trace}"));
        assert_eq!(v["first_failed_layer"], want["first_failed_layer"], "trace {trace}: {v}");
        assert_eq!(v["decided_by"], "quiet");
    }
    let protocol = verdicts.iter().filter(|v| v["protocol_success"] == true).count();
    let verified = verdicts.iter().filter(|v| v["verified_success"] == true).count();
    assert_eq!((protocol, verified), (3, 1), "SPEC: 37.5 % and 12.5 % of 8");
}

/// A chain whose root never arrives is decided at shutdown, reported everywhere, and the process
/// exits 0 within its bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_decides_chains_in_flight_and_exits_zero() {
    let sink = Sink::start().await;
    let svc = Service::start(Cfg { max_wait: "120s", shutdown_timeout: "10s", ..Cfg::with_sink(&sink) }).await;

    let trace = new_trace_id();
    let missing_root = new_span_id();
    let client = new_span_id();
    let req = request("agent", vec![call_span(trace, client, Some(missing_root), "create_ticket", "41", vec![])]);
    let r = svc.post_proto(&req).await;
    assert_eq!(r.status, 200, "{}", r.text());

    // The chain is held (its root is missing): in flight, and not decided.
    svc.wait_metric("mcp_health_chains_in_flight", WAIT, |v| v >= 1.0).await;
    sink.wait_for(WAIT, "the pass-through copy of the span", |s| s.spans().iter().any(|r| r.span.span_id == client.to_vec()).then_some(()))
        .await;
    assert!(svc.verdicts().is_empty(), "no verdict before shutdown: {}", svc.stdout());
    assert!(sink.health_spans().is_empty());

    let started = std::time::Instant::now();
    let status =
        svc.terminate(Duration::from_secs(20)).await.unwrap_or_else(|| panic!("did not exit within 20 s of SIGTERM\n{}", svc.stderr()));
    assert!(status.success(), "exit status {status}\n{}", svc.stderr());
    assert!(started.elapsed() < Duration::from_secs(15), "shutdown took {:?}", started.elapsed());

    let verdicts = svc.verdicts();
    let v = verdicts
        .iter()
        .find(|v| v["trace_id"] == hex(&trace))
        .unwrap_or_else(|| panic!("no verdict for the in-flight chain: {}", svc.stdout()));
    assert_eq!(v["decided_by"], "shutdown", "{v}");
    assert_eq!(v["span_id"], hex(&client));
    // Decided before its evidence was known to be complete: partial, never green.
    assert_eq!(v["partial"], "decided_at_shutdown", "{v}");
    assert_eq!(v["confidence"], "low", "{v}");
    assert_ne!(v["state"], "healthy", "{v}");

    let h = sink
        .wait_for(Duration::from_secs(5), "the shutdown health span", |s| {
            s.health_spans().into_iter().find(|h| h.span.trace_id == trace.to_vec())
        })
        .await;
    assert_eq!(h.attr_str("mcp_health.verdict.decided_by"), Some("shutdown"));
    assert_eq!(h.attr_str("mcp_health.verdict.partial"), Some("decided_at_shutdown"));
    assert_eq!(h.span.parent_span_id, client.to_vec());
}
