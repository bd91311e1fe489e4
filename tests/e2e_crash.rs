//! End to end (issue 35): with `storage.directory`, a crash loses nothing that was acknowledged.
//!
//! The backend is down. Ten calls are decided and their health spans wait in the sending queue
//! on disk; then thirty more calls are sent — half a client span alone, half with the server's
//! tool error — and answered OK while still in flight (their `decision_wait` has not passed),
//! every span of both rounds passed on. The service is killed (SIGKILL) at once. A second run on
//! the same directory with the backend up: every call whose spans were answered OK has exactly
//! one verdict across both runs (partial where evidence is missing, never healthy; the calls the
//! server failed say `tool_failed`), every span passed on arrives at the backend exactly once,
//! every health span of the first round arrives, and the log and a metric say what the journal
//! gave back.

mod support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::time::Duration;

use opentelemetry_proto::tonic::trace::v1::{span::SpanKind, status::StatusCode, Span, Status};
use serde_json::Value;
use support::*;

const WAIT: Duration = Duration::from_secs(40);

fn cfg(endpoint: String, storage: &Path) -> Cfg {
    Cfg {
        exporter: Some(endpoint),
        otlp_metrics: false,
        storage: Some(storage.to_path_buf()),
        decision_wait: "3s",
        exporter_timeout: "1s",
        retry_on_failure: Some("      initial_interval: 100ms\n      max_interval: 300ms\n      max_elapsed_time: 0"),
        shutdown_timeout: "2s",
        ..Cfg::default()
    }
}

/// One call: its client span, and with `server_fails` the server's span under it (a tool error).
fn call(n: usize, server_fails: bool) -> (String, Vec<Span>) {
    let (trace, client) = (new_trace_id(), new_span_id());
    let mut spans = vec![call_span(trace, client, None, "create_ticket", &format!("{n}"), vec![])];
    if server_fails {
        let mut server =
            call_span(trace, new_span_id(), Some(client), "create_ticket", &format!("{n}"), vec![kv_str("error.type", "tool_error")]);
        server.kind = SpanKind::Server as i32;
        server.status = Some(Status { code: StatusCode::Error as i32, ..Default::default() });
        spans.push(server);
    }
    (hex::encode(trace), spans)
}

fn span_key(s: &Span) -> (String, String) {
    (hex::encode(&s.trace_id), hex::encode(&s.span_id))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_was_acknowledged_outlives_a_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let dead = dead_port();
    let svc = Service::start(cfg(format!("http://127.0.0.1:{}", dead.port), &state)).await;

    let mut sent: Vec<(String, bool)> = Vec::new();
    let mut passed: BTreeSet<(String, String)> = BTreeSet::new();
    // Round one: decided before the crash, health spans waiting on disk.
    for n in 0..10 {
        let (trace, spans) = call(n, n % 2 == 1);
        passed.extend(spans.iter().map(span_key));
        assert_eq!(svc.post_proto(&request("agent", spans)).await.status, 200);
        sent.push((trace, n % 2 == 1));
    }
    svc.wait_verdicts(10, WAIT).await;
    eventually_async(WAIT, "round one's health spans on disk", || async {
        let t = svc.metrics_text().await;
        (prom_sum(&t, "mcp_health_exporter_queue_stored_items").unwrap_or(0.0) >= 10.0).then_some(())
    })
    .await;
    // Round two: answered OK, still in flight at the kill.
    let started = std::time::Instant::now();
    for n in 10..40 {
        let (trace, spans) = call(n, n % 2 == 1);
        passed.extend(spans.iter().map(span_key));
        assert_eq!(svc.post_proto(&request("agent", spans)).await.status, 200);
        sent.push((trace, n % 2 == 1));
    }
    svc.kill();
    let took = started.elapsed();
    let first_run: Vec<Value> = svc.verdicts();
    drop(svc);
    drop(dead);
    assert!(std::fs::read_dir(state.join("journal")).unwrap().count() >= 1, "the journal holds round two");

    let sink = Sink::start().await;
    let svc = Service::start(cfg(sink.endpoint(), &state)).await;
    let traces: BTreeSet<&str> = sent.iter().map(|(t, _)| t.as_str()).collect();
    let all = eventually(WAIT, "a verdict for every call across both runs", || {
        let mut v = first_run.clone();
        v.extend(svc.verdicts());
        let got: BTreeSet<&str> = v.iter().filter_map(|v| v["trace_id"].as_str()).collect();
        traces.iter().all(|t| got.contains(t)).then_some(v)
    })
    .await;
    // Exactly one verdict per call: a call decided before the crash is not decided again.
    let mut by_trace: BTreeMap<&str, Vec<&Value>> = BTreeMap::new();
    for v in &all {
        by_trace.entry(v["trace_id"].as_str().unwrap()).or_default().push(v);
    }
    for (trace, fails) in &sent {
        let vs = &by_trace[trace.as_str()];
        assert_eq!(vs.len(), 1, "{trace}: one verdict across the restart: {vs:#?}");
        let state = vs[0]["state"].as_str().unwrap();
        if *fails {
            assert_eq!(state, "tool_failed", "{trace}: the server's error survives: {}", vs[0]);
        } else {
            assert_ne!(state, "healthy", "{trace}: missing evidence is never green: {}", vs[0]);
        }
    }
    // Every span passed on arrives once; every call's health span arrives.
    eventually(WAIT, "every span passed on, and a health span per call", || {
        let got: BTreeSet<(String, String)> = sink.spans().iter().filter(|s| !s.is_health_span()).map(|s| span_key(&s.span)).collect();
        let health: BTreeSet<String> = sink.health_spans().iter().map(|s| hex::encode(&s.span.trace_id)).collect();
        (passed.is_subset(&got) && traces.iter().all(|t| health.contains(*t))).then_some(())
    })
    .await;
    let mut seen: HashMap<(String, String), usize> = HashMap::new();
    for s in sink.spans().iter().filter(|s| !s.is_health_span()) {
        *seen.entry(span_key(&s.span)).or_default() += 1;
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "spans passed on more than once: {twice:?}");
    // Said in the log and counted.
    let err = svc.stderr();
    assert!(err.contains("the evidence journal held acknowledged evidence"), "{err}");
    let replayed = eventually_async(WAIT, "the replay counted", || async {
        prom_sum(&svc.metrics_text().await, "mcp_health_state_journal_replayed_total").filter(|n| *n >= 1.0)
    })
    .await;
    println!("round two sent in {took:?}; {replayed} journal batch(es) replayed; {} verdicts after the restart", svc.verdicts().len());
}
