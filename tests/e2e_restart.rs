//! End to end (issue 8): the state outlives the process with `storage.directory`. Two runs of the
//! binary on the same directory, the first stopped by SIGKILL (after its state was written) or by
//! SIGTERM: the gate still finds the sessions with the same convergence, a call on a stale session
//! is still `stale_catalog`, the open incident goes on (`updated`, retry count + 1, no second
//! `opened`), and a late verifier revises a call decided before the restart. The same with the
//! shared store (`storage: {kind: redis}`, a redis-server of the test's own whose password is
//! planted in the endpoint): the password shows nowhere the service writes (logs at debug, verdict
//! lines, metrics), and a start with a wrong password or no Redis fails naming the endpoint
//! redacted.

mod support;

use std::time::Duration;

use mcp_health::testing::gate::service::pb::gate_client::GateClient;
use mcp_health::testing::gate::service::pb::CatalogVerdictRequest;
use opentelemetry_proto::tonic::trace::v1::{span::SpanKind, Span};
use serde_json::Value;
use support::*;

const WAIT: Duration = Duration::from_secs(20);

fn fixture_lines(name: &str) -> Vec<String> {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(path).unwrap().lines().filter(|l| !l.trim().is_empty()).map(str::to_string).collect()
}

/// A fixture line sent again as a new trace (same evidence, another attempt).
fn with_trace(line: &str, trace_hex: &str) -> String {
    let mut v: Value = serde_json::from_str(line).unwrap();
    for rs in v["resourceSpans"].as_array_mut().unwrap() {
        for ss in rs["scopeSpans"].as_array_mut().unwrap() {
            for sp in ss["spans"].as_array_mut().unwrap() {
                sp["traceId"] = Value::from(trace_hex);
            }
        }
    }
    v.to_string()
}

async fn convergence(svc: &Service, session: &str) -> Option<String> {
    let mut c = GateClient::connect(format!("http://{}", svc.gate_addr())).await.expect("connect to the gate");
    let r = c
        .catalog_verdict(CatalogVerdictRequest { session_id: session.into(), ..Default::default() })
        .await
        .expect("CatalogVerdict")
        .into_inner();
    r.found.then(|| r.verdict.map(|v| v.convergence).unwrap_or_default())
}

fn incident_lines(svc: &Service, id: Option<&str>) -> Vec<Value> {
    svc.json_lines().into_iter().filter(|l| l["incident"] == true && id.is_none_or(|id| l["row"]["id"] == id)).collect()
}

fn verdict_of(svc: &Service, trace_hex: &str) -> Vec<Value> {
    svc.verdicts().into_iter().filter(|v| v["trace_id"] == trace_hex).collect()
}

enum Stop {
    Kill,
    Term,
}

const PLANTED: &str = "planted-pw-e2e-5150";

/// What the service wrote anywhere a reader sees: no password.
async fn assert_no_password(svc: &Service) {
    let metrics = svc.metrics_text().await;
    for (what, text) in [("stdout", svc.stdout()), ("stderr", svc.stderr()), ("metrics", metrics)] {
        assert!(!text.contains(PLANTED), "the password shows in {what}:\n{text}");
    }
}

async fn restart_keeps_state(stop: Stop) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = Cfg { storage: Some(dir.path().join("state")), gate: true, decision_wait: "200ms", ..Cfg::default() };
    restart_keeps_state_with(stop, cfg, None).await;
}

async fn restart_keeps_state_with(stop: Stop, cfg: Cfg, redis: Option<&redis_server::RedisServer>) {
    let svc = Service::start(cfg.clone()).await;

    // Catalog sessions (the stale call of the fixture is held back for after the restart).
    let catalog = fixture_lines("catalog_cases.jsonl");
    let stale_call = catalog.iter().find(|l| l.contains("\"tools/call read_ticket\"")).unwrap().clone();
    for l in catalog.iter().filter(|l| **l != stale_call) {
        assert_eq!(svc.post_json(l.as_bytes()).await.status, 200);
    }
    // Five refusals for one expired token: one incident.
    let refusals = fixture_lines("incidents_five_expired.jsonl");
    for l in &refusals[..5] {
        assert_eq!(svc.post_json(l.as_bytes()).await.status, 200);
    }
    // A call with no verifier yet: `unverified`, decided before the restart.
    let (trace, span) = (new_trace_id(), new_span_id());
    let trace_hex = hex::encode(trace);
    let call = call_span(trace, span, None, "write_note", "77", vec![]);
    assert_eq!(svc.post_proto(&request("agent", vec![call])).await.status, 200);

    let first = eventually(WAIT, "the call's verdict, and the incident at retry 5", || {
        let v = verdict_of(&svc, &trace_hex);
        let inc = incident_lines(&svc, None);
        (v.len() == 1 && inc.iter().any(|l| l["row"]["retry_count"] == 5)).then_some((v, inc))
    })
    .await;
    assert_eq!(first.0[0]["state"], "unverified", "{:?}", first.0);
    let incident_id = first.1[0]["row"]["id"].as_str().unwrap().to_string();
    assert_eq!(first.1.iter().filter(|l| l["transition"] == "opened").count(), 1, "{:?}", first.1);
    let gate_before = [convergence(&svc, "cat-1").await, convergence(&svc, "cat-3").await];
    assert_eq!(gate_before, [Some("converged".to_string()), Some("stale".to_string())]);

    if redis.is_some() {
        assert_no_password(&svc).await;
        assert!(svc.stderr().contains("redis://:***@127.0.0.1"), "the store's endpoint is logged redacted:\n{}", svc.stderr());
    }
    match stop {
        Stop::Kill => {
            // The engine writes at most every 100 ms on its ticks: give it a few.
            tokio::time::sleep(Duration::from_millis(1_000)).await;
            svc.kill();
        }
        Stop::Term => {
            let st = svc.terminate(Duration::from_secs(15)).await.expect("exits on SIGTERM");
            assert!(st.success(), "{st:?}\n{}", svc.stderr());
        }
    }
    drop(svc);

    let svc = Service::start(cfg).await;
    // The gate knows the sessions again, with the same verdicts, before any new span.
    assert_eq!([convergence(&svc, "cat-1").await, convergence(&svc, "cat-3").await], gate_before);

    // A call on the stale session (sent again as a new trace) is still `stale_catalog`.
    let stale_trace = "ca0000000000000000000000000000f1";
    assert_eq!(svc.post_json(with_trace(&stale_call, stale_trace).as_bytes()).await.status, 200);
    // The same refusal again: the incident goes on.
    let again = with_trace(&refusals[0], "1c0000000000000000000000000000f1");
    assert_eq!(svc.post_json(again.as_bytes()).await.status, 200);
    // The late verifier of the call decided before the restart.
    let t = now_ns();
    let verifier = Span {
        trace_id: trace.to_vec(),
        span_id: new_span_id().to_vec(),
        parent_span_id: span.to_vec(),
        name: "verify destination".into(),
        kind: SpanKind::Internal as i32,
        start_time_unix_nano: t - 1_000_000,
        end_time_unix_nano: t,
        attributes: vec![kv_str("mcp_health.outcome.result", "confirmed"), kv_str("mcp_health.outcome.method", "receipt")],
        ..Default::default()
    };
    assert_eq!(svc.post_proto(&request("verifier", vec![verifier])).await.status, 200);

    let stale = eventually(WAIT, "the stale call's verdict", || verdict_of(&svc, stale_trace).pop()).await;
    assert_eq!(stale["state"], "stale_catalog", "{stale}");
    let updated = eventually(WAIT, "the incident to go on", || {
        incident_lines(&svc, Some(&incident_id)).into_iter().find(|l| l["transition"] == "updated")
    })
    .await;
    assert_eq!(updated["row"]["retry_count"], 6, "{updated}");
    let revised = eventually(WAIT, "the revision of the call decided before the restart", || verdict_of(&svc, &trace_hex).pop()).await;
    assert!(revised["revision"].as_u64().unwrap() >= 1, "{revised}");
    assert_eq!(revised["state"], "healthy", "{revised}");
    assert_eq!(revised["supersedes"]["state"], "unverified", "{revised}");
    let opened: Vec<Value> = incident_lines(&svc, Some(&incident_id)).into_iter().filter(|l| l["transition"] == "opened").collect();
    assert!(opened.is_empty(), "no second `opened` for {incident_id}: {opened:?}");
    let errs = prom_sum(&svc.metrics_text().await, "mcp_health_state_store_errors_total").unwrap_or(0.0);
    assert_eq!(errs, 0.0);
    if let Some(r) = redis {
        assert_no_password(&svc).await;
        // What the store costs is served: requests, bytes each way, versions remembered.
        for name in ["mcp_health_state_store_round_trips_total", "mcp_health_state_store_versions"] {
            svc.wait_metric(name, WAIT, |v| v > 0.0).await;
        }
        let bytes = |text: &str, direction: &str| -> f64 {
            let series = format!("direction=\"{direction}\"");
            let line = text.lines().find(|l| l.starts_with("mcp_health_state_store_bytes_total{") && l.contains(&series));
            line.and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
        };
        eventually_async(WAIT, "bytes sent to and received from the store", || async {
            let text = svc.metrics_text().await;
            (bytes(&text, "sent") > 0.0 && bytes(&text, "received") > 0.0).then_some(())
        })
        .await;
        // The records are in Redis, under the documented keys.
        let keys: Vec<String> = redis::cmd("KEYS").arg("mcp-health:*").query(&mut r.conn()).unwrap();
        for table in ["sessions", "incidents", "decided"] {
            assert!(keys.iter().any(|k| k.starts_with(&format!("mcp-health:{table}:"))), "no {table} in {keys:?}");
        }
    }
}

fn redis_cfg(r: &redis_server::RedisServer) -> Cfg {
    Cfg { storage_redis: Some(r.url()), gate: true, decision_wait: "200ms", log_level: "debug", ..Cfg::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_outlives_a_sigkill_in_redis_and_the_password_never_shows() {
    if !redis_server::available("state_outlives_a_sigkill_in_redis_and_the_password_never_shows") {
        return;
    }
    let r = redis_server::RedisServer::start_with(false, Some(PLANTED));
    restart_keeps_state_with(Stop::Kill, redis_cfg(&r), Some(&r)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_outlives_a_sigterm_in_redis() {
    if !redis_server::available("state_outlives_a_sigterm_in_redis") {
        return;
    }
    let r = redis_server::RedisServer::start_with(false, Some(PLANTED));
    restart_keeps_state_with(Stop::Term, redis_cfg(&r), Some(&r)).await;
}

/// A start that cannot reach its shared store fails (exit 1, not a silent in-memory start), and
/// says where with the password hidden.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_without_its_redis_fails_naming_the_endpoint_redacted() {
    if !redis_server::available("a_start_without_its_redis_fails_naming_the_endpoint_redacted") {
        return;
    }
    let mut r = redis_server::RedisServer::start_with(false, Some(PLANTED));
    let wrong = format!("redis://:{PLANTED}-wrong@127.0.0.1:{}", r.port);
    let down = {
        r.kill();
        r.url()
    };
    let wrong_cfg = Cfg { storage_redis: Some(wrong), ..redis_cfg(&r) };
    for (what, cfg) in [("no redis", Cfg { storage_redis: Some(down), ..redis_cfg(&r) }), ("wrong password", wrong_cfg)] {
        if what == "wrong password" {
            r.restart();
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.yaml");
        let (_, out) = serve_to_its_end(&path, None, |ports| {
            std::fs::write(&path, cfg.yaml(&ports)).unwrap();
            ports
        });
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(!out.status.success(), "{what}: started anyway\n{stderr}");
        assert!(stderr.contains("cannot open the state store at redis://:***@127.0.0.1"), "{what}: {stderr}");
        assert!(!stderr.contains(PLANTED) && !stdout.contains(PLANTED), "{what}: the password shows\n{stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_outlives_a_sigkill() {
    restart_keeps_state(Stop::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_outlives_a_sigterm() {
    restart_keeps_state(Stop::Term).await;
}

/// Redis goes away under a running service: it goes on deciding, counts the store errors, says
/// `degraded` on the health check (still 200: it keeps its place behind the load balancer), and
/// marks the calls it decides meanwhile partial (`store_unavailable`), never healthy; when Redis
/// is back the health check says available again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_under_a_running_service_is_counted_degraded_and_partial() {
    if !redis_server::available("redis_down_under_a_running_service_is_counted_degraded_and_partial") {
        return;
    }
    let mut r = redis_server::RedisServer::start_with(false, Some(PLANTED));
    let svc = Service::start(redis_cfg(&r)).await;
    r.kill();
    // Calls keep coming: each step's write fails.
    let mut traces = Vec::new();
    for i in 0..5 {
        let (trace, span) = (new_trace_id(), new_span_id());
        traces.push(hex::encode(trace));
        let call = call_span(trace, span, None, "write_note", &format!("9{i}"), vec![]);
        assert_eq!(svc.post_proto(&request("agent", vec![call])).await.status, 200);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let errs = eventually_async(WAIT, "store errors counted", || async {
        prom_sum(&svc.metrics_text().await, "mcp_health_state_store_errors_total").filter(|e| *e >= 1.0)
    })
    .await;
    let health = http_get(svc.health_addr(), "/").await.expect("health check");
    assert_eq!(health.status, 200, "degraded is still up");
    assert!(
        String::from_utf8_lossy(&health.body).contains("degraded: state store unavailable"),
        "{}",
        String::from_utf8_lossy(&health.body)
    );
    let last = eventually(WAIT, "the last call's verdict", || verdict_of(&svc, traces.last().unwrap()).pop()).await;
    assert_eq!((last["partial"].as_str(), last["confidence"].as_str()), (Some("store_unavailable"), Some("low")), "{last}");
    assert_ne!(last["state"], "healthy");
    assert_no_password(&svc).await;
    // Redis comes back; with nothing written, the probe ends `degraded`.
    r.restart();
    eventually_async(WAIT, "the health check to say available again", || async {
        let h = http_get(svc.health_addr(), "/").await.ok()?;
        let body = String::from_utf8_lossy(&h.body).to_string();
        (h.status == 200 && body.contains("Server available") && !body.contains("degraded")).then_some(())
    })
    .await;
    println!("store errors counted with Redis down: {errs}");
}
