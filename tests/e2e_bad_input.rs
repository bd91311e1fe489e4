//! End to end: what the receivers answer to bad, big, odd and hostile input, and that the
//! service keeps working after each. Plus: no planted secret comes out anywhere.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message;
use support::*;

const WAIT: Duration = Duration::from_secs(30);

fn rpc_status(body: &[u8]) -> tonic_types::Status {
    tonic_types::Status::decode(body)
        .unwrap_or_else(|e| panic!("body is not a google.rpc.Status ({e}): {:?}", String::from_utf8_lossy(body)))
}

/// A field-1 length prefix that runs past the end of the buffer.
const UNDECODABLE: &[u8] = &[0x0a, 0x05, 0x01];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_input_is_refused_as_invalid() {
    let svc = Service::start(Cfg::default()).await;

    let err = grpc_export_raw(svc.grpc_addr(), Bytes::from_static(UNDECODABLE)).await.expect_err("garbage must be refused");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");

    let r = svc.post_traces("application/x-protobuf", false, UNDECODABLE).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(rpc_status(&r.body).code, tonic::Code::InvalidArgument as i32);

    let r = svc.post_traces("application/json", false, b"{\"resourceSpans\": [").await;
    assert_eq!(r.status, 400, "{}", r.text());
    let body: serde_json::Value = serde_json::from_slice(&r.body).expect("JSON error body");
    assert_eq!(body["code"], 3, "{body}");
    assert!(body["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");

    // gzip that is not gzip.
    let r = svc.post_traces("application/x-protobuf", false, b"not gzip at all").await;
    assert_eq!(r.status, 400);
    let r = http_request(
        svc.http_addr(),
        "POST",
        "/v1/traces",
        &[("Content-Type", "application/x-protobuf"), ("Content-Encoding", "gzip")],
        b"not gzip at all",
    )
    .await
    .unwrap();
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(rpc_status(&r.body).code, 3);

    let text = svc.wait_metric("mcp_health_requests_refused_total", WAIT, |v| v >= 4.0).await;
    assert!(text.contains("reason=\"undecodable\""), "{text}");
    svc.assert_alive(WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_requests_and_gzip_bombs_are_refused() {
    let max_body = 64 * 1024;
    let svc = Service::start(Cfg { grpc_max_mib: 1, http_max_body: max_body, ..Cfg::default() }).await;

    // gRPC: a 1.5 MiB message against a 1 MiB limit.
    let big = "x".repeat(3 << 19);
    let req = request("agent", vec![call_span(new_trace_id(), new_span_id(), None, "big", "1", vec![kv_str("blob", &big)])]);
    let err = svc.grpc_export(req.clone()).await.expect_err("oversize gRPC message must be refused");
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");

    // HTTP: a body over max_request_body_size.
    let mid = "y".repeat(max_body * 2);
    let req = request("agent", vec![call_span(new_trace_id(), new_span_id(), None, "big", "1", vec![kv_str("blob", &mid)])]);
    let r = svc.post_proto(&req).await;
    assert_eq!(r.status, 413, "{}", r.text());

    // A gzip bomb: about 16 KiB on the wire, 16 MiB inflated.
    let inflated = {
        let mut spans = Vec::new();
        let pad = "z".repeat(16 << 20);
        spans.push(call_span(new_trace_id(), new_span_id(), None, "bomb", "1", vec![kv_str("pad", &pad)]));
        request("agent", spans).encode_to_vec()
    };
    let bomb = gzip(&inflated);
    assert!(bomb.len() < max_body, "the bomb itself is small ({} bytes)", bomb.len());
    let r = svc.post_traces("application/x-protobuf", true, &inflated).await;
    assert_eq!(r.status, 413, "{}", r.text());
    assert_eq!(rpc_status(&r.body).code, tonic::Code::ResourceExhausted as i32);

    let text = svc.wait_metric("mcp_health_requests_refused_total", WAIT, |v| v >= 3.0).await;
    assert!(text.contains("reason=\"too_large\""), "{text}");
    svc.assert_alive(WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_attribute_types_are_accepted_and_counted() {
    let svc = Service::start(Cfg::default()).await;
    let trace = new_trace_id();
    let mut span = call_span(trace, new_span_id(), None, "create_ticket", "7", vec![]);
    span.attributes.retain(|kv| kv.key != "mcp.method.name");
    span.attributes.push(kv_int("mcp.method.name", 42));
    span.attributes.push(kv_bool("http.response.status_code", true));
    let r = svc.grpc_export(request("agent", vec![span.clone()])).await.expect("accepted over gRPC");
    assert!(r.partial_success.as_ref().is_none_or(|p| p.rejected_spans == 0), "{r:?}");

    // The same over HTTP/JSON, with the values typed wrong in JSON.
    let json = serde_json::json!({"resourceSpans": [{"scopeSpans": [{"spans": [{
        "traceId": hex(&new_trace_id()), "spanId": hex(&new_span_id()), "name": "tools/call x", "kind": 3,
        "attributes": [
            {"key": "mcp.method.name", "value": {"intValue": "7"}},
            {"key": "http.response.status_code", "value": {"boolValue": true}},
            {"key": "jsonrpc.request.id", "value": {"stringValue": "1"}}
        ]
    }]}]}]});
    let r = svc.post_json(json.to_string().as_bytes()).await;
    assert_eq!(r.status, 200, "{}", r.text());

    svc.wait_metric("mcp_health_attributes_invalid_total", WAIT, |v| v >= 4.0).await;
    svc.assert_alive(WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_with_bad_ids_are_rejected_and_the_rest_accepted() {
    let svc = Service::start(Cfg::default()).await;
    let trace = new_trace_id();
    let root = new_span_id();
    let good = vec![
        call_span(trace, root, None, "create_ticket", "9", vec![]),
        call_span(trace, new_span_id(), Some(root), "create_ticket", "9", vec![]),
        call_span(trace, new_span_id(), Some(root), "create_ticket", "9", vec![]),
    ];
    let mut empty = call_span(trace, new_span_id(), None, "create_ticket", "10", vec![]);
    empty.trace_id = vec![];
    let mut short = call_span(trace, new_span_id(), None, "create_ticket", "11", vec![]);
    short.trace_id = trace[..8].to_vec();
    let mut zero_span = call_span(trace, new_span_id(), None, "create_ticket", "12", vec![]);
    zero_span.span_id = vec![0; 8];
    let mut spans = good.clone();
    spans.insert(1, empty);
    spans.push(short);
    spans.push(zero_span);

    let r = svc.grpc_export(request("agent", spans.clone())).await.expect("accepted with partial success");
    let ps = r.partial_success.expect("partial success");
    assert_eq!(ps.rejected_spans, 3, "{ps:?}");
    assert!(!ps.error_message.is_empty());

    let mut again = spans.clone();
    let t2 = new_trace_id();
    for s in again.iter_mut().filter(|s| s.trace_id.len() == 16) {
        s.trace_id = t2.to_vec();
    }
    let r = svc.post_proto(&request("agent", again)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let resp = ExportTraceServiceResponse::decode(&r.body[..]).unwrap();
    assert_eq!(resp.partial_success.map(|p| p.rejected_spans), Some(3));

    let json = serde_json::json!({"resourceSpans": [{"scopeSpans": [{"spans": [
        {"traceId": hex(&new_trace_id()), "spanId": hex(&new_span_id()), "name": "ok", "kind": 3,
         "attributes": [{"key": "mcp.method.name", "value": {"stringValue": "tools/call"}}]},
        {"traceId": "", "spanId": hex(&new_span_id()), "name": "empty trace id", "kind": 3},
        {"traceId": "0102030405060708", "spanId": hex(&new_span_id()), "name": "short trace id", "kind": 3}
    ]}]}]});
    let r = svc.post_json(json.to_string().as_bytes()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    let rejected = body.pointer("/partialSuccess/rejectedSpans").map(|v| v.as_i64().or_else(|| v.as_str()?.parse().ok()));
    assert_eq!(rejected, Some(Some(2)), "{body}");

    // The valid spans were taken: the first trace is decided as one call.
    let verdicts = svc.wait_verdicts(1, WAIT).await;
    assert!(verdicts.iter().any(|v| v["trace_id"] == hex(&trace)), "{verdicts:#?}");
    let text = svc.wait_metric("mcp_health_spans_rejected_total", WAIT, |v| v >= 8.0).await;
    assert!(prom_sum(&text, "mcp_health_spans_rejected_total") == Some(8.0), "{text}");
    svc.assert_alive(WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_spans_in_one_trace_are_truncated_not_fatal() {
    let svc = Service::start(Cfg::default()).await;
    let trace = new_trace_id();
    let root = new_span_id();
    let mut spans = Vec::with_capacity(10_000);
    spans.push(call_span(trace, root, None, "bulk", "1", vec![]));
    for _ in 1..10_000 {
        let mut s = call_span(trace, new_span_id(), Some(root), "bulk", "1", vec![]);
        s.kind = SpanKind::Server as i32;
        spans.push(s);
    }
    let req = request("agent", spans);
    assert!(req.encoded_len() < 4 << 20, "fits the default 4 MiB limit ({} bytes)", req.encoded_len());
    let r = svc.grpc_export(req).await.expect("10,000 spans accepted");
    assert!(r.partial_success.as_ref().is_none_or(|p| p.rejected_spans == 0), "{r:?}");

    let verdicts = svc.wait_verdicts(1, WAIT).await;
    let v = verdicts.iter().find(|v| v["trace_id"] == hex(&trace)).expect("a verdict for the big trace");
    assert_eq!(v["span_id"], hex(&root));
    let text = svc.wait_metric("mcp_health_spans_truncated_total", WAIT, |v| v > 0.0).await;
    assert!(prom_sum(&text, "mcp_health_spans_received_total").is_some_and(|v| v >= 10_000.0), "{text}");
    svc.assert_alive(WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_past_the_queues_gets_retryable_refusals() {
    let dead = dead_port();
    let svc = Service::start(Cfg {
        exporter: Some(format!("http://127.0.0.1:{}", dead.port)),
        queue_size: 1,
        sending_queue_size: 1,
        exporter_timeout: "1s",
        otlp_metrics: false,
        // Workers give a request up after ~1.5 s, so the queue drains once the flood stops.
        retry_on_failure: Some(
            "      enabled: true\n      initial_interval: 200ms\n      max_interval: 500ms\n      max_elapsed_time: 1500ms",
        ),
        ..Cfg::default()
    })
    .await;

    let mut set = tokio::task::JoinSet::new();
    for i in 0..48 {
        let addr = svc.grpc_addr();
        set.spawn(async move {
            let req = request("flood", vec![call_span(new_trace_id(), new_span_id(), None, "flood", &i.to_string(), vec![])]);
            grpc_export(addr, req).await
        });
    }
    let (mut ok, mut unavailable) = (0, 0);
    while let Some(r) = set.join_next().await {
        match r.unwrap() {
            Ok(_) => ok += 1,
            Err(s) if is_busy(&s) => unavailable += 1,
            Err(s) => panic!("unexpected answer to a flood request: {s:?}"),
        }
    }
    assert!(unavailable >= 1, "no RESOURCE_EXHAUSTED with RetryInfo among {ok} accepted requests");

    let mut set = tokio::task::JoinSet::new();
    for i in 0..48 {
        let addr = svc.http_addr();
        set.spawn(async move {
            let req = request("flood", vec![call_span(new_trace_id(), new_span_id(), None, "flood", &i.to_string(), vec![])]);
            http_request(addr, "POST", "/v1/traces", &[("Content-Type", "application/x-protobuf")], &req.encode_to_vec()).await.unwrap()
        });
    }
    let mut busy = 0;
    while let Some(r) = set.join_next().await {
        let r = r.unwrap();
        match r.status {
            200 => {}
            503 => {
                let ra = r.header("retry-after").unwrap_or_else(|| panic!("503 without Retry-After: {:?}", r.headers));
                assert!(ra.parse::<u64>().is_ok(), "Retry-After {ra:?}");
                assert_eq!(rpc_status(&r.body).code, tonic::Code::Unavailable as i32);
                busy += 1;
            }
            s => panic!("unexpected HTTP {s} to a flood request: {}", r.text()),
        }
    }
    assert!(busy >= 1, "no 503 among 48 HTTP requests");

    let text = svc.wait_metric("mcp_health_requests_refused_total", WAIT, |v| v > 0.0).await;
    assert!(text.contains("reason=\"exporter_busy\"") || text.contains("reason=\"correlator_busy\""), "{text}");
    svc.assert_alive(WAIT).await;
    drop(svc);
    drop(dead);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planted_secrets_never_come_out() {
    let planted: Vec<String> = fixture_json("planted_secrets.expected.json")["planted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    assert!(!planted.is_empty());
    let sink = Sink::start().await;
    // Pass-through forwards spans unchanged by design; what mcp-health itself makes is checked.
    let svc = Service::start(Cfg { passthrough: false, log_level: "debug", ..Cfg::with_sink(&sink) }).await;

    let lines = fixture_lines("planted_secrets.jsonl");
    for (i, line) in lines.iter().enumerate() {
        let r = svc.post_traces("application/json", i % 2 == 1, line.as_bytes()).await;
        assert_eq!(r.status, 200, "{}", r.text());
        let proto = mcp_health::testing::receive::otlp_json::decode_traces(line.as_bytes()).unwrap();
        // The same spans over gRPC and HTTP/protobuf too (same trace: a revision at most).
        svc.grpc_export(proto.clone()).await.expect("gRPC accepted");
        let r = svc.post_proto(&proto).await;
        assert_eq!(r.status, 200);
    }
    let verdicts = svc.wait_verdicts(1, WAIT).await;
    assert_eq!(verdicts[0]["state"], "needs_auth", "{verdicts:#?}");
    sink.wait_for(WAIT, "a health span", |s| (!s.health_spans().is_empty()).then_some(())).await;
    sink.wait_for(WAIT, "OTLP metrics with the call", |s| s.metric_sum("mcp_health.calls", |_| true).filter(|v| *v >= 1)).await;
    let prom = svc.wait_metric("mcp_health_calls_total", WAIT, |v| v >= 1.0).await;

    let spans = sink.spans();
    assert!(spans.iter().all(ReceivedSpan::is_health_span), "pass-through is off: only health spans go out");
    let outputs =
        [("sink (health spans, metrics)", sink.dump()), ("Prometheus text", prom), ("stdout", svc.stdout()), ("stderr", svc.stderr())];
    for (where_, text) in &outputs {
        for p in &planted {
            assert!(!text.contains(p.as_str()), "planted secret {p} appears in {where_}");
        }
        for needle in ["Bearer", "Authorization: "] {
            assert!(!text.contains(needle), "{needle:?} appears in {where_}");
        }
    }
    // The sanitized scope survives; the token planted next to it does not.
    let h = &sink.health_spans()[0];
    assert_eq!(h.attr_str("mcp_health.auth.required_scope"), Some("tickets:write"), "{h:#?}");
}

/// Issue 10: identifiers were copied verbatim into health spans, verdict lines, Prometheus labels
/// and the gate — a request id, a tool name, a method name, `server.address` with `user:secret@`,
/// a tools/list cursor, `service.name`, a token inside `required_scope`, and base64-shaped keys
/// with `/`, `+` or `=`. Labels and identifiers come only from safe vocabularies now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planted_identifiers_never_come_out() {
    let key = |tag: &str| format!("{tag}AbC123dEf456gHi789/Key+==");
    let (rid, svc_name, scope_tok) = (key("PLANTEDrid"), key("PLANTEDsvc"), key("PLANTEDscope"));
    let attr = |k: &str, v: &str| serde_json::json!({"key": k, "value": {"stringValue": v}});
    let span = |trace: &str, span: &str, method: &str, extra: Vec<serde_json::Value>| {
        let mut attrs = vec![
            attr("mcp.method.name", method),
            attr("jsonrpc.request.id", &rid),
            attr("mcp.session.id", "PLANTEDsession"),
            attr("server.address", "admin:PLANTEDPASS@tickets.example.test"),
        ];
        attrs.extend(extra);
        serde_json::json!({"traceId": trace, "spanId": span, "name": method, "kind": 3,
            "startTimeUnixNano": "1764000000000000000", "endTimeUnixNano": "1764000000010000000",
            "attributes": attrs, "status": {"code": 2}})
    };
    let spans = vec![
        span(
            "0a000000000000000000000000000001",
            "0100000000000001",
            "tools/call",
            vec![
                attr("gen_ai.tool.name", "PLANTED tool name"),
                attr("http.response.status_code", "403"),
                attr("mcp_health.auth.error", "insufficient_scope"),
                attr("mcp_health.auth.required_scope", &format!("tickets:write {scope_tok}")),
            ],
        ),
        span("0a000000000000000000000000000002", "0100000000000002", "x/PLANTEDMETHOD", vec![]),
        span(
            "0a000000000000000000000000000003",
            "0100000000000003",
            "tools/list",
            vec![
                attr("mcp_health.catalog.cursor", "PLANTEDCURSOR"),
                serde_json::json!({"key": "mcp_health.catalog.next_cursor_present", "value": {"boolValue": false}}),
            ],
        ),
    ];
    let line = serde_json::json!({"resourceSpans": [{"resource": {"attributes": [attr("service.name", &svc_name)]},
        "scopeSpans": [{"scope": {"name": "fixture"}, "spans": spans}]}]})
    .to_string();
    let sink = Sink::start().await;
    let svc = Service::start(Cfg { passthrough: false, log_level: "debug", ..Cfg::with_sink(&sink) }).await;
    let r = svc.post_json(line.as_bytes()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let verdicts = svc.wait_verdicts(1, WAIT).await;
    assert!(verdicts.iter().any(|v| v["state"] == "needs_auth"), "{verdicts:#?}");
    sink.wait_for(WAIT, "health spans", |s| (!s.health_spans().is_empty()).then_some(())).await;
    let prom = svc.wait_metric("mcp_health_verdicts_total", WAIT, |v| v >= 1.0).await;
    // Give the other two spans time to be decided (a verdict, a catalog line or nothing).
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let outputs = [
        ("sink (health spans, metrics, logs)", sink.dump()),
        ("Prometheus text", prom),
        ("stdout", svc.stdout()),
        ("stderr", svc.stderr()),
    ];
    for (where_, text) in &outputs {
        assert!(
            !text.contains("PLANTED"),
            "a planted identifier appears in {where_}: {}",
            &text[text.find("PLANTED").unwrap().saturating_sub(80)..]
                [..200.min(text.len() - text.find("PLANTED").unwrap().saturating_sub(80))]
        );
    }
    // What stays readable stays: the host without its userinfo, the scope token that is one.
    assert!(svc.stdout().contains("tickets.example.test") && svc.stdout().contains("tickets:write"));
}

/// Issue 10: memory was not bounded. With the collector's `memory_limiter` semantics, above the
/// soft limit every receiver refuses whole requests retryably (503 + `Retry-After`, gRPC
/// `UNAVAILABLE`), counted, while the service stays healthy; under it, data is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn above_the_memory_limit_requests_are_refused_retryably_and_counted() {
    let line = fixture_lines("eight_calls.jsonl").remove(0);
    // A limit the process is always above.
    let svc = Service::start(Cfg { exporter: None, memory_limit_mib: Some(1), ..Cfg::default() }).await;
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    let r = svc.post_json(line.as_bytes()).await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.header("retry-after").is_some(), "retryable: Retry-After is set");
    let proto = mcp_health::testing::receive::otlp_json::decode_traces(line.as_bytes()).unwrap();
    let g = svc.grpc_export(proto).await.expect_err("refused");
    assert!(is_busy(&g), "{g:?}");
    let text = svc.metrics_text().await;
    assert!(
        text.lines().any(|l| l.starts_with("mcp_health_requests_refused_total") && l.contains("reason=\"memory_limit\"")),
        "refusals counted by reason: {text}"
    );
    assert_eq!(svc.health_status().await, Some(200), "refusing data is not being unhealthy");
    drop(svc);
    // A limit far above: accepted.
    let svc = Service::start(Cfg { exporter: None, memory_limit_mib: Some(1 << 20), ..Cfg::default() }).await;
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    assert_eq!(svc.post_json(line.as_bytes()).await.status, 200);
}

/// One raw gRPC request over HTTP/2 (prior knowledge): the grpc-status it gets (headers of a
/// trailers-only answer, else the trailers) and whether it carried RetryInfo.
async fn raw_grpc(addr: SocketAddr, headers: &[(&str, &str)], body: Vec<u8>) -> (String, bool) {
    use http_body_util::BodyExt;
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), hyper_util::rt::TokioIo::new(tcp)).await.expect("h2");
    tokio::spawn(conn);
    let mut req = hyper::Request::post(format!("http://{addr}/opentelemetry.proto.collector.trace.v1.TraceService/Export"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = send.send_request(req.body(http_body_util::Full::new(Bytes::from(body))).unwrap()).await.expect("response");
    let (parts, body) = resp.into_parts();
    let collected = body.collect().await.expect("body");
    let trailers = collected.trailers().cloned().unwrap_or_default();
    let all = [parts.headers, trailers];
    let status = all.iter().find_map(|h| h.get("grpc-status")).map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
    let retry_info = all.iter().any(|h| h.contains_key("grpc-status-details-bin"));
    (status, retry_info)
}

fn frame(compressed: bool, declared: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![u8::from(compressed)];
    f.extend_from_slice(&declared.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// Malformed gRPC frames get the OTLP answers, chosen by the error's type, and are counted: a
/// compressed flag without an encoding, a truncated frame, two messages in a unary call and
/// corrupt gzip are INVALID_ARGUMENT; an unknown encoding UNIMPLEMENTED; a gzip bomb and a frame
/// declaring more than the limit RESOURCE_EXHAUSTED without RetryInfo (tonic's own decoding
/// answered INTERNAL or OUT_OF_RANGE, which OTLP clients retry, and counted nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_grpc_frames_get_the_otlp_answers_and_are_counted() {
    let svc = Service::start(Cfg { grpc_max_mib: 1, ..Cfg::default() }).await;
    let addr = svc.grpc_addr();
    let valid = request("agent", vec![call_span(new_trace_id(), new_span_id(), None, "ok", "1", vec![])]).encode_to_vec();
    let n = valid.len() as u32;
    // (what, headers, body, the grpc-status wanted)
    type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, Vec<u8>, &'a str);
    let cases: Vec<Case> = vec![
        ("a compressed flag without grpc-encoding", vec![], frame(true, n, &valid), "3"),
        ("a truncated frame", vec![], frame(false, n + 100, &valid), "3"),
        ("two messages in a unary call", vec![], [frame(false, n, &valid), frame(false, n, &valid)].concat(), "3"),
        ("corrupt gzip", vec![("grpc-encoding", "gzip")], frame(true, 9, b"not gzip!"), "3"),
        ("an unknown encoding", vec![("grpc-encoding", "snappy")], frame(true, n, &valid), "12"),
        ("a frame declaring more than the limit", vec![], frame(false, 2 << 20, &valid), "8"),
        (
            "a gzip bomb",
            vec![("grpc-encoding", "gzip")],
            {
                let bomb = gzip(&vec![0u8; 8 << 20]);
                frame(true, bomb.len() as u32, &bomb)
            },
            "8",
        ),
        ("undecodable protobuf", vec![], frame(false, UNDECODABLE.len() as u32, UNDECODABLE), "3"),
        ("a valid request", vec![], frame(false, n, &valid), "0"),
    ];
    for (what, headers, body, want) in cases {
        let (got, retry_info) = raw_grpc(addr, &headers, body).await;
        assert_eq!(got, want, "{what}");
        assert!(!retry_info || want == "0", "{what}: a permanent refusal carries no RetryInfo");
    }
    let text = svc.wait_metric("mcp_health_requests_refused_total", WAIT, |v| v >= 8.0).await;
    let count = |reason: &str| -> f64 {
        text.lines()
            .filter(|l| {
                l.starts_with("mcp_health_requests_refused_total") && l.contains(&format!("reason=\"{reason}\"")) && l.contains("grpc")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    assert_eq!(count("undecodable"), 5.0, "{text}");
    assert_eq!(count("too_large"), 2.0, "{text}");
    assert_eq!(count("unsupported_encoding"), 1.0, "{text}");
    svc.assert_alive(WAIT).await;
}
