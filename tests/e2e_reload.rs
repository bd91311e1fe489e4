//! SIGHUP reloads without an outage, and SIGTERM is never lost to a reload.
//!
//! - While several SIGHUPs apply changed configurations (engine and exporter settings, which
//!   apply at a restart, and listener settings, which apply live) with the exporter's backend
//!   down, the health check and the OTLP/HTTP receiver never refuse a connection: the health
//!   check answers 200 throughout, every POST 200 or a retryable 429/503.
//! - The engine survives a reload: a call whose client half came before the SIGHUP and whose
//!   server half after it gets one whole verdict, not a partial one decided at the reload.
//! - SIGTERM right after (or during) a reload drains and exits 0 within the shutdown timeout.

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message;
use support::*;

fn signal(svc: &Service, sig: libc::c_int) {
    // SAFETY: kill(2) on the pid of our running, unreaped child.
    let rc = unsafe { libc::kill(svc.pid() as libc::pid_t, sig) };
    assert_eq!(rc, 0, "kill({sig})");
}

fn applied(svc: &Service) -> usize {
    svc.stderr().matches("new configuration is applied").count()
}

/// Give the reload after SIGHUP `n` (from 1) time to be applied: until its log line, at most 5 s.
/// Not an assertion: what the reload did to the service is what the tests check.
async fn settle(svc: &Service, n: usize) {
    for _ in 0..100 {
        if applied(svc) >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What the probers saw.
#[derive(Default)]
struct Probes {
    health_ok: AtomicU64,
    posts_ok: AtomicU64,
    posts_busy: AtomicU64,
    failures: Mutex<Vec<String>>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_under_load_with_a_dead_backend_never_refuses_a_connection() {
    let dead = dead_port();
    let base = Cfg {
        exporter: Some(format!("http://127.0.0.1:{}", dead.port)),
        exporter_timeout: "1s",
        sending_queue_size: 8,
        shutdown_timeout: "3s",
        ..Cfg::default()
    };
    let svc = Arc::new(Service::start(base.clone()).await);
    let probes = Arc::new(Probes::default());
    let stop = Arc::new(AtomicBool::new(false));

    let health = {
        let (svc, probes, stop) = (svc.clone(), probes.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                match http_get(svc.health_addr(), "/").await {
                    Ok(r) if r.status == 200 => {
                        probes.health_ok.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(r) => probes.failures.lock().unwrap().push(format!("health answered {}: {}", r.status, r.text())),
                    Err(e) => probes.failures.lock().unwrap().push(format!("health: {e}")),
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let posts = {
        let (svc, probes, stop) = (svc.clone(), probes.clone(), stop.clone());
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let req = request("agent", vec![call_span(new_trace_id(), new_span_id(), None, "probe", &n.to_string(), vec![])]);
                let r = http_request(
                    svc.http_addr(),
                    "POST",
                    "/v1/traces",
                    &[("Content-Type", "application/x-protobuf")],
                    &req.encode_to_vec(),
                )
                .await;
                match r {
                    Ok(r) if r.status == 200 => {
                        probes.posts_ok.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(r) if r.status == 429 || r.status == 503 => {
                        probes.posts_busy.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(r) => probes.failures.lock().unwrap().push(format!("POST answered {}: {}", r.status, r.text())),
                    Err(e) => probes.failures.lock().unwrap().push(format!("POST: {e}")),
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };

    // Each reload changes something else: an engine setting, an exporter header, and the
    // listeners' own settings (the health check and the HTTP receiver are then replaced on
    // their sockets, under the probes).
    let changes: [(&str, Option<&str>, &str); 4] = [
        ("700ms", None, ""),
        ("700ms", Some("    headers:\n      x-tenant: tenant-secret-1"), ""),
        ("700ms", Some("    headers:\n      x-tenant: tenant-secret-2"), "idle_timeout: 61s"),
        ("900ms", Some("    headers:\n      x-tenant: tenant-secret-2"), "idle_timeout: 62s"),
    ];
    for (i, (wait, header, listener)) in changes.into_iter().enumerate() {
        let mut cfg = Cfg { decision_wait: wait, exporter_lines: header.map(str::to_string), ..base.clone() };
        if !listener.is_empty() {
            cfg.listener_extra = vec![("health_check", listener.to_string()), ("http", listener.to_string())];
        }
        std::fs::write(&svc.config_path, cfg.yaml(&svc.ports)).unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        signal(&svc, libc::SIGHUP);
        settle(&svc, i + 1).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    health.await.unwrap();
    posts.await.unwrap();

    let (h, ok, busy) =
        (probes.health_ok.load(Ordering::Relaxed), probes.posts_ok.load(Ordering::Relaxed), probes.posts_busy.load(Ordering::Relaxed));
    println!("probes over 4 reloads: health 200 × {h}; POST 200 × {ok}, 429/503 × {busy}");
    let failures = probes.failures.lock().unwrap().clone();
    assert!(
        failures.is_empty(),
        "{} failed probes, first: {:?}\n--- stderr ---\n{}",
        failures.len(),
        &failures[..failures.len().min(5)],
        svc.stderr()
    );
    assert!(h >= 20 && ok + busy >= 20, "the probers ran throughout: {h} health, {} POST", ok + busy);

    let err = svc.stderr();
    assert_eq!(applied(&svc), 4, "every reload applied: {err}");
    assert!(err.contains("apply only at a restart"), "the settings that need a restart are named: {err}");
    for key in ["processors.mcp_health.decision_wait", "exporters.otlp.headers"] {
        assert!(err.contains(key), "{key} named: {err}");
    }
    assert!(!err.contains("tenant-secret"), "header values never logged: {err}");
    assert!(err.contains("listeners_replaced=health_check, otlp_http"), "the changed listeners were replaced: {err}");
    assert!(!err.contains("shutting down"), "a reload never drains: {err}");
    assert!(svc.running());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_in_flight_across_a_reload_is_decided_whole_and_once() {
    let base = Cfg { decision_wait: "2s", ..Cfg::default() };
    let svc = Service::start(base.clone()).await;
    let trace = new_trace_id();
    let client = new_span_id();
    let req = request("agent", vec![call_span(trace, client, None, "create_ticket", "7", vec![])]);
    assert_eq!(svc.post_proto(&req).await.status, 200);

    // A changed configuration (a listener setting, which applies live, and an engine setting,
    // which waits for a restart).
    let cfg = Cfg {
        decision_wait: "3s",
        listener_extra: vec![("http", "idle_timeout: 61s".into()), ("grpc", "idle_timeout: 61s".into())],
        ..base
    };
    std::fs::write(&svc.config_path, cfg.yaml(&svc.ports)).unwrap();
    signal(&svc, libc::SIGHUP);
    settle(&svc, 1).await;

    let mut server = call_span(trace, new_span_id(), Some(client), "create_ticket", "7", vec![]);
    server.kind = SpanKind::Server as i32;
    assert_eq!(svc.post_proto(&request("tickets", vec![server])).await.status, 200);

    let v = svc.wait_verdicts(1, Duration::from_secs(20)).await;
    // Longer than decision_wait: a second (revised) verdict would have come by now.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let v2 = svc.verdicts();
    assert_eq!(v2.len(), 1, "one verdict: {v2:#?}");
    let v = &v[0];
    assert_eq!(v["trace_id"], hex(&trace));
    assert_eq!(v["decided_by"], "quiet", "decided by the quiet period, not by the reload: {v}");
    assert!(v["partial"].is_null(), "a whole verdict: {v}");
    assert!(!svc.stderr().contains("shutting down"));
    assert_eq!(applied(&svc), 1, "{}", svc.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_a_reload_drains_and_exits_zero() {
    // The backend is down: the drain's flush waits for it until the shutdown timeout.
    let dead = dead_port();
    for gap_ms in [0u64, 5, 50] {
        let base = Cfg {
            exporter: Some(format!("http://127.0.0.1:{}", dead.port)),
            exporter_timeout: "1s",
            decision_wait: "1m",
            max_wait: "2m",
            shutdown_timeout: "3s",
            ..Cfg::default()
        };
        let svc = Service::start(base.clone()).await;
        let req = request("agent", vec![call_span(new_trace_id(), new_span_id(), None, "create_ticket", "1", vec![])]);
        assert_eq!(svc.post_proto(&req).await.status, 200);
        // A reload that replaces listeners on their sockets (the longest kind).
        let cfg = Cfg { listener_extra: vec![("health_check", "idle_timeout: 61s".into()), ("http", "idle_timeout: 61s".into())], ..base };
        std::fs::write(&svc.config_path, cfg.yaml(&svc.ports)).unwrap();
        signal(&svc, libc::SIGHUP);
        tokio::time::sleep(Duration::from_millis(gap_ms)).await;
        // shutdown_timeout (3 s) plus a margin for a loaded machine.
        let st = svc.signal_and_wait("TERM", Duration::from_secs(3 + 7)).await;
        let st = st.unwrap_or_else(|| panic!("gap {gap_ms} ms: still running after SIGTERM\n{}", svc.stderr()));
        assert!(st.success(), "gap {gap_ms} ms: {st:?}\n{}", svc.stderr());
        let v = svc.verdicts();
        assert_eq!(v.len(), 1, "gap {gap_ms} ms: the call in flight was decided at shutdown: {v:?}\n{}", svc.stderr());
        assert_eq!(v[0]["decided_by"], "shutdown");
    }
}
