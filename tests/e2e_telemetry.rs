//! End to end: mcp-health's own telemetry (issue 10) — the refusal log line, JSON logs, and the
//! latency histograms' trace-id exemplars as a real Prometheus stores them.
//!
//! The Prometheus test needs `prometheus` on PATH (Debian: `apt-get install prometheus`); without
//! it the test fails, unless `MCP_HEALTH_SKIP_PROMETHEUS=1` is set.

mod support;

use std::time::Duration;

use support::prometheus::*;
use support::*;

const WAIT: Duration = Duration::from_secs(30);

/// A field-1 length prefix that runs past the end of the buffer.
const UNDECODABLE: &[u8] = &[0x0a, 0x05, 0x01];

/// Issue 10: a refusal is named in the log with its reason (throttled: one line per reason per
/// 10 s, carrying the count); before, only a counter knew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_request_logs_its_reason() {
    let svc = Service::start(Cfg::default()).await;
    let started = std::time::Instant::now();
    let r = svc.post_traces("application/x-protobuf", false, UNDECODABLE).await;
    assert_eq!(r.status, 400, "{}", r.text());
    let line =
        eventually(WAIT, "a refusal line on stderr", || svc.stderr().lines().find(|l| l.contains("refused OTLP data")).map(str::to_string))
            .await;
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains("reason=undecodable") && line.contains("transport=\"http\""), "{line}");
    // Within the window the same reason is counted, not logged again.
    for _ in 0..5 {
        assert_eq!(svc.post_traces("application/x-protobuf", false, UNDECODABLE).await.status, 400);
    }
    let text = svc.wait_metric("mcp_health_requests_refused_total", WAIT, |v| v >= 6.0).await;
    assert!(text.contains("reason=\"undecodable\""), "{text}");
    // However slow this machine is: at most one line per started 10 s for the six refusals.
    let lines = svc.stderr().lines().filter(|l| l.contains("refused OTLP data")).count();
    let allowed = 1 + started.elapsed().as_secs() as usize / 10;
    assert!(lines <= allowed.min(5), "{lines} lines, at most {allowed}:\n{}", svc.stderr());
}

/// Issue 10: `mcp_health.spans.received` included refused spans. Over both transports, with
/// invalid spans inside accepted requests (a partial success), the collector-style receiver
/// counters add up: received = accepted + refused, per transport. (Requests refused whole are
/// covered by the unit test in `receive::admit`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn received_spans_are_accepted_plus_refused_on_both_transports() {
    let svc = Service::start(Cfg::default()).await;
    let spans = |n: usize, bad: usize| {
        let trace = new_trace_id();
        let mut v: Vec<_> = (0..n).map(|i| call_span(trace, new_span_id(), None, "create_ticket", &i.to_string(), vec![])).collect();
        for s in v.iter_mut().take(bad) {
            s.span_id = vec![0; 8];
        }
        v
    };
    let r = svc.grpc_export(request("agent", spans(5, 2))).await.expect("accepted with partial success");
    assert_eq!(r.partial_success.map(|p| p.rejected_spans), Some(2));
    assert_eq!(svc.post_proto(&request("agent", spans(3, 1))).await.status, 200);
    let text = svc.wait_metric("mcp_health_receiver_accepted_spans_total", WAIT, |v| v == 5.0).await;
    let sum = |name: &str, transport: &str| {
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(&format!("transport=\"{transport}\"")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    for (t, received, accepted) in [("grpc", 5.0, 3.0), ("http", 3.0, 2.0)] {
        assert_eq!(sum("mcp_health_spans_received_total", t), received, "{t}:\n{text}");
        assert_eq!(sum("mcp_health_receiver_accepted_spans_total", t), accepted, "{t}:\n{text}");
        assert_eq!(sum("mcp_health_receiver_refused_spans_total", t), received - accepted, "{t}:\n{text}");
    }
    assert!(text.contains("reason=\"invalid_span\""), "{text}");
}

/// Issue 10: `service.telemetry.logs.encoding: json` writes one JSON object per stderr line with
/// `level`, `message` and `target` at the top level (and the event's fields beside them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_are_one_object_per_line_with_level_message_and_target() {
    let svc = Service::start(Cfg { log_encoding: Some("json"), ..Cfg::default() }).await;
    assert_eq!(svc.post_traces("application/x-protobuf", false, UNDECODABLE).await.status, 400);
    eventually(WAIT, "the refusal on stderr", || Some(()).filter(|_| svc.stderr().contains("refused OTLP data"))).await;
    let stderr = svc.stderr();
    let mut lines = 0;
    for l in stderr.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}\n{stderr}"));
        for k in ["level", "message", "target", "timestamp"] {
            assert!(v[k].is_string(), "{k} missing in {l}");
        }
        lines += 1;
    }
    assert!(lines >= 3, "the start-up lines and the refusal:\n{stderr}");
    let refusal: serde_json::Value =
        stderr.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()).find(|v| v["reason"] == "undecodable").unwrap();
    assert_eq!(refusal["level"], "WARN");
    assert_eq!(refusal["transport"], "http");
    assert_eq!(refusal["refusals"], 1);
    assert!(!stderr.contains('\u{1b}'), "no ANSI escapes in JSON logs");
}

/// Issue 10: call duration and verdict delay as histograms whose buckets carry the trace id of
/// their last call, served as OpenMetrics when asked for (Prometheus asks), stored by a real
/// Prometheus with exemplar storage, and scraped without errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_stores_the_trace_id_exemplars_of_the_latency_histograms() {
    if !prometheus_available() {
        return;
    }
    let svc = Service::start(Cfg { decision_wait: "300ms", exporter: None, ..Cfg::default() }).await;
    let mut traces = Vec::new();
    for line in fixture_lines("eight_calls.jsonl") {
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        for rs in v["resourceSpans"].as_array().unwrap() {
            for ss in rs["scopeSpans"].as_array().unwrap() {
                for s in ss["spans"].as_array().unwrap() {
                    traces.push(s["traceId"].as_str().unwrap().to_ascii_lowercase());
                }
            }
        }
        assert_eq!(svc.post_json(line.as_bytes()).await.status, 200);
    }
    svc.wait_metric("mcp_health_call_duration_seconds_count", WAIT, |v| v == 8.0).await;

    // What the service serves to each: exemplars only in OpenMetrics.
    let om =
        http_request(svc.prom_addr(), "GET", "/metrics", &[("Accept", "application/openmetrics-text;version=1.0.0")], &[]).await.unwrap();
    assert_eq!(om.status, 200);
    assert!(om.header("content-type").unwrap().starts_with("application/openmetrics-text; version=1.0.0"), "{:?}", om.headers);
    let om = om.text();
    assert!(om.ends_with("# EOF\n"), "{om}");
    let with_exemplar: Vec<&str> =
        om.lines().filter(|l| l.starts_with("mcp_health_call_duration_seconds_bucket{") && l.contains(" # {")).collect();
    assert!(!with_exemplar.is_empty(), "{om}");
    assert!(with_exemplar.iter().all(|l| traces.iter().any(|t| l.contains(&format!("# {{trace_id=\"{t}\"}} ")))), "{with_exemplar:?}");
    let text = svc.metrics_text().await;
    assert!(!text.contains(" # {") && !text.contains("# EOF"), "the text format has no exemplars");
    // Issue 37: gzip when asked (Prometheus asks on every scrape, and its scrape below reads it).
    let z = http_request(svc.prom_addr(), "GET", "/metrics", &[("Accept-Encoding", "gzip")], &[]).await.unwrap();
    assert_eq!(z.header("content-encoding"), Some("gzip"), "{:?}", z.headers);
    let mut plain = String::new();
    std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&z.body[..]), &mut plain).expect("a gzip body");
    assert!(plain.contains("mcp_health_call_duration_seconds_count") && z.body.len() * 3 < plain.len(), "{} gzip bytes", z.body.len());
    let plain_asked = http_request(svc.prom_addr(), "GET", "/metrics", &[("Accept-Encoding", "gzip;q=0")], &[]).await.unwrap();
    assert_eq!(plain_asked.header("content-encoding"), None, "gzip;q=0 refuses gzip");

    let prom = Prometheus::start_with(svc.prom_addr(), None, &["--enable-feature=exemplar-storage"]).await;
    eventually_async(Duration::from_secs(60), "Prometheus to store the call-duration histogram", || async {
        prom.query("sum(mcp_health_call_duration_seconds_count)").await.filter(|v| v == "8").map(|_| ())
    })
    .await;
    let q = urlencode("mcp_health_call_duration_seconds_bucket");
    let end = now_ns() / 1_000_000_000 + 60;
    let stored = eventually_async(Duration::from_secs(60), "exemplars from /api/v1/query_exemplars", || async {
        let v = prom.api(&format!("/api/v1/query_exemplars?query={q}&start={}&end={end}", end - 3600)).await?;
        let ids: Vec<String> = v["data"]
            .as_array()?
            .iter()
            .flat_map(|s| s["exemplars"].as_array().cloned().unwrap_or_default())
            .filter_map(|e| e["labels"]["trace_id"].as_str().map(str::to_string))
            .collect();
        Some(ids).filter(|i| !i.is_empty())
    })
    .await;
    assert!(stored.iter().all(|id| traces.contains(id)), "exemplars name the fixture's traces: {stored:?} vs {traces:?}");
    let delay = urlencode("mcp_health_verdict_delay_seconds_bucket");
    let v = prom.api(&format!("/api/v1/query_exemplars?query={delay}&start={}&end={end}", end - 3600)).await.unwrap();
    assert!(v["data"].as_array().is_some_and(|a| !a.is_empty()), "verdict-delay exemplars: {v}");

    // The OpenMetrics scrape itself: the target is up and its last scrape had no error.
    let targets = prom.api("/api/v1/targets").await.unwrap();
    let t = &targets["data"]["activeTargets"][0];
    assert_eq!(t["health"], "up", "{t}");
    assert_eq!(t["lastError"], "", "{t}");
    let log = prom.log();
    assert!(!log.lines().any(|l| l.contains("level=error") && (l.contains("scrape") || l.contains("xemplar"))), "{log}");
}

/// A clean start, a scrape and a stop log no error: an error line at start (the metrics SDK's
/// `InstrumentCreationFailed` for an instrument the telemetry level does not serve) teaches
/// operators to ignore error lines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_start_and_stop_logs_no_error() {
    let svc = Service::start(Cfg::default()).await;
    assert!(svc.metrics_text().await.contains("target_info"), "a scrape answers");
    let st = svc.terminate(WAIT).await.expect("exits on SIGTERM");
    assert!(st.success(), "{st:?}");
    let log = svc.stderr();
    let errors: Vec<&str> = log.lines().filter(|l| l.contains("ERROR")).collect();
    assert!(errors.is_empty(), "error lines on a clean start and stop:\n{}", errors.join("\n"));
}
