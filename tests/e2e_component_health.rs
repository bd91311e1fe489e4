//! Component health (`/status/health`) of the real binary against real parts: a loopback OTLP
//! backend that goes away and comes back, a real `redis-server` that is killed and restarted, and
//! an engine stalled by a verdict log whose reader stopped reading. `/` stays 200 through a dead
//! backend unless `fail_on_component_error` asks otherwise; nothing secret is ever in the answer.

mod support;

use std::time::Duration;

use serde_json::Value;
use support::*;

const WAIT: Duration = Duration::from_secs(30);

/// Planted in the exporter's headers and in the Redis URL: never in an answer.
const EXPORTER_TOKEN: &str = "planted-exporter-token-5f1c";
const REDIS_PASSWORD: &str = "planted-redis-pw-9a7e";

/// `/status/health`: its status code and JSON.
async fn status_health(svc: &Service) -> Option<(u16, Value)> {
    let r = http_get(svc.health_addr(), "/status/health").await.ok()?;
    let body = r.text();
    for secret in [EXPORTER_TOKEN, REDIS_PASSWORD] {
        assert!(!body.contains(secret), "a secret in /status/health: {body}");
    }
    Some((r.status, serde_json::from_str(&body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))))
}

/// Wait until `/status/health` shows `component` with `status` and `healthy`; the report.
async fn wait_component(svc: &Service, component: &str, status: &str, healthy: bool) -> (u16, Value) {
    let what = format!("{component} to be {status} (healthy: {healthy}) on /status/health");
    eventually_async(WAIT, &what, || async {
        let (code, v) = status_health(svc).await?;
        let c = &v["components"][component];
        (c["status"] == status && c["healthy"] == healthy).then_some((code, v))
    })
    .await
}

/// The exporter's backend, with the planted token in its headers and a short failure threshold.
fn exporter_cfg(sink: &Sink, fail_on_component_error: bool) -> Cfg {
    Cfg {
        // Own metrics every second keep the exporter trying while nobody sends.
        otlp_metrics: true,
        metrics_interval: "500ms",
        exporter_timeout: "1s",
        retry_on_failure: Some("      initial_interval: 100ms\n      max_interval: 200ms\n      max_elapsed_time: 1s"),
        exporter_lines: Some(format!("    headers:\n      authorization: Bearer {EXPORTER_TOKEN}")),
        listener_extra: vec![(
            "health_check",
            format!("exporter_failure_threshold: 2s\nfail_on_component_error: {fail_on_component_error}"),
        )],
        ..Cfg::with_sink(sink)
    }
}

/// A dead backend turns its exporter unhealthy (503 on `/status/health`) within the threshold,
/// `/` stays 200 by default, and the backend back on its port makes everything healthy again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_backend_turns_its_exporter_unhealthy_and_healthy_again_while_root_stays_200() {
    let sink = Sink::start().await;
    let addr = sink.addr;
    let svc = Service::start(exporter_cfg(&sink, false)).await;
    // OK before any attempt too: wait for the first export the backend took.
    let (code, v) = eventually_async(WAIT, "a first export on /status/health", || async {
        let (code, v) = status_health(&svc).await?;
        v["components"]["exporter:otlp"]["last_success"].is_string().then_some((code, v))
    })
    .await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["healthy"], true, "{v}");
    assert_eq!(v["components"]["exporter:otlp"]["status"], "StatusOK", "{v}");
    for receiver in ["receiver:otlp/grpc", "receiver:otlp/http"] {
        assert_eq!(v["components"][receiver]["status"], "StatusOK", "{v}");
    }
    assert_eq!(v["components"]["processor:mcp_health"]["status"], "StatusOK", "{v}");
    let endpoint = sink.endpoint();

    drop(sink);
    let gone = std::time::Instant::now();
    let (code, v) = wait_component(&svc, "exporter:otlp", "StatusRecoverableError", false).await;
    assert_eq!(code, 503, "{v}");
    assert_eq!((v["healthy"].clone(), v["status"].clone()), (Value::Bool(false), Value::from("StatusRecoverableError")), "{v}");
    assert!(gone.elapsed() < WAIT, "unhealthy within the threshold (2s) and a few export intervals");
    let body = v.to_string();
    assert!(!body.contains(&endpoint) && !body.contains(&addr.port().to_string()), "no endpoint in the report: {body}");
    // Liveness is not about the backend: `/` stays 200 by default.
    assert_eq!(svc.health_status().await, Some(200));

    let _back = Sink::start_at(addr).await;
    let (code, v) = wait_component(&svc, "exporter:otlp", "StatusOK", true).await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["healthy"], true, "{v}");
}

/// With `fail_on_component_error`, `/` follows the components: 503 naming the dead exporter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_fail_on_component_error_root_turns_503_for_a_dead_exporter() {
    let sink = Sink::start().await;
    let addr = sink.addr;
    let svc = Service::start(exporter_cfg(&sink, true)).await;
    wait_component(&svc, "exporter:otlp", "StatusOK", true).await;
    assert_eq!(svc.health_status().await, Some(200));
    drop(sink);
    let body = eventually_async(WAIT, "/ to answer 503", || async {
        let r = http_get(svc.health_addr(), "/").await.ok()?;
        (r.status == 503).then(|| r.text())
    })
    .await;
    assert!(body.contains("exporter:otlp"), "{body}");
    assert!(!body.contains(EXPORTER_TOKEN), "{body}");
    let _back = Sink::start_at(addr).await;
    eventually_async(WAIT, "/ to answer 200 again", || async { (svc.health_status().await == Some(200)).then_some(()) }).await;
}

/// A Redis outage shows as `storage:redis` failing, and it is healthy again once the server is
/// back. The URL's password is never in the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_outage_shows_and_clears() {
    if !redis_server::available("a_store_outage_shows_and_clears") {
        return;
    }
    let mut redis = redis_server::RedisServer::start_with(false, Some(REDIS_PASSWORD));
    let svc = Service::start(Cfg { storage_redis: Some(redis.url()), exporter: None, ..Cfg::default() }).await;
    let (code, v) = wait_component(&svc, "storage:redis", "StatusOK", true).await;
    assert_eq!(code, 200, "{v}");
    redis.kill();
    // The store is found down by the engine's next operations on it: calls keep coming.
    let (code, v) = store_reaches(&svc, "StatusRecoverableError", "storage:redis to be down").await;
    assert_eq!(code, 503, "{v}");
    assert_eq!(v["components"]["storage:redis"]["healthy"], false, "{v}");
    assert!(!v.to_string().contains(&redis.port.to_string()), "no Redis address in the report: {v}");
    // Verdicts go on (capped), so `/` stays 200: the instance keeps its place.
    assert_eq!(svc.health_status().await, Some(200));

    redis.restart();
    let (code, _) = store_reaches(&svc, "StatusOK", "storage:redis to be back").await;
    assert_eq!(code, 200);
}

/// Sends the eight calls round and round (the store is judged by the engine's operations on it)
/// until `/status/health` shows `storage:redis` in `status`; that answer's code and body.
async fn store_reaches(svc: &Service, status: &str, what: &str) -> (u16, Value) {
    let calls = fixture_lines("eight_calls.jsonl");
    let mut i = 0;
    eventually_async(WAIT, what, || {
        i += 1;
        let line = calls[i % calls.len()].clone();
        async move {
            let _ = svc.post_json(line.as_bytes()).await;
            let (code, v) = status_health(svc).await?;
            (v["components"]["storage:redis"]["status"] == status).then_some((code, v))
        }
    })
    .await
}

/// A real stall: the verdict log is a named pipe whose reader stopped reading (as a verdict log
/// on stdout piped into a stuck consumer), so the engine blocks on its write. The engine shows
/// stalled (`processor:mcp_health`, 503) once it has not stepped for its limit (10s here), and
/// `/` answers 503 too (a stuck engine is what liveness is for).
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_blocked_on_its_verdict_log_shows_stalled() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("verdicts.fifo");
    let path = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
    // SAFETY: mkfifo and open on a NUL-terminated path; fcntl on the descriptor just opened.
    let reader = unsafe {
        assert_eq!(libc::mkfifo(path.as_ptr(), 0o600), 0, "mkfifo");
        let fd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_NONBLOCK);
        assert!(fd >= 0, "open the pipe's read end");
        // The smallest pipe: a few verdict lines fill it.
        let size = libc::fcntl(fd, libc::F_SETPIPE_SZ, 4096);
        assert!(size >= 4096, "F_SETPIPE_SZ: {size}");
        fd
    };
    // The default runtime (one worker thread): the blocked write hands the worker's other tasks
    // on, so the probes are still answered.
    let cfg = Cfg { exporter: None, verdict_log: Some(fifo.clone()), ..Cfg::default() };
    let svc = Service::start(cfg).await;
    let (code, _) = wait_component(&svc, "processor:mcp_health", "StatusOK", true).await;
    assert_eq!(code, 200);
    // Calls until the verdict log's pipe is full and the engine blocks in its write. A request
    // the blocked service does not answer ends the sending (the engine is blocked by then).
    let mut sent = 0;
    for _ in 0..256 {
        let req = request("agent", vec![call_span(new_trace_id(), new_span_id(), None, "create_ticket", "1", Vec::new())]);
        let body = prost::Message::encode_to_vec(&req);
        let post = http_request(svc.http_addr(), "POST", "/v1/traces", &[("Content-Type", "application/x-protobuf")], &body);
        match tokio::time::timeout(Duration::from_secs(3), post).await {
            Ok(Ok(r)) if r.status == 200 => sent += 1,
            _ => break,
        }
    }
    assert!(sent > 0, "no call was taken in");
    let (code, v) = eventually_async(WAIT, "processor:mcp_health to show stalled", || async {
        let got = tokio::time::timeout(Duration::from_secs(3), status_health(&svc)).await.ok().flatten();
        let (code, v) = got?;
        let c = &v["components"]["processor:mcp_health"];
        (c["status"] == "StatusRecoverableError" && c["healthy"] == false).then_some((code, v))
    })
    .await;
    assert_eq!(code, 503, "{v}");
    let e = v["components"]["processor:mcp_health"]["error"].as_str().unwrap_or_default().to_string();
    assert!(e.contains("has not stepped"), "{v}");
    assert_eq!(svc.health_status().await, Some(503), "a stuck engine fails liveness");
    // SAFETY: closing the descriptor opened above.
    unsafe { libc::close(reader) };
}
