//! End to end: the sending queue of mcp-health's own output outlives the process when a
//! directory is configured (`storage.directory`). With the backend down, eight calls are decided
//! and their health spans wait on disk; the service is then killed (SIGKILL) or stopped
//! (SIGTERM, whose exit log says how many requests were left and where); a second run on the same
//! directory with the backend up sends every health span exactly once (counted by trace and span
//! id) and empties the queue. Without a directory, a SIGTERM with the backend down says how many
//! requests were lost.

mod support;

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::time::Duration;

use support::*;

const WAIT: Duration = Duration::from_secs(30);

/// The sum of the series of `name` that carry every `labels` pair (0 when there is none).
fn prom_value(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.strip_prefix(name).map(|rest| (l, rest)))
        .filter(|(_, rest)| rest.starts_with('{') || rest.starts_with(' '))
        .filter(|(l, _)| labels.iter().all(|(k, v)| l.contains(&format!("{k}=\"{v}\""))))
        .filter_map(|(l, _)| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum()
}

/// The service, exporting to `endpoint` with its own output queued in `storage` (if any):
/// no pass-through, no own metrics over OTLP (so the queue holds health spans and incident
/// records only), retried without a time limit.
fn cfg(endpoint: String, storage: Option<&Path>) -> Cfg {
    Cfg {
        exporter: Some(endpoint),
        passthrough: false,
        otlp_metrics: false,
        storage: storage.map(Path::to_path_buf),
        exporter_timeout: "1s",
        retry_on_failure: Some("      initial_interval: 100ms\n      max_interval: 300ms\n      max_elapsed_time: 0"),
        shutdown_timeout: "2s",
        ..Cfg::default()
    }
}

/// Send the eight calls of the fixture; the trace ids of their verdicts.
async fn decide_eight_calls(svc: &Service) -> BTreeSet<String> {
    for l in fixture_lines("eight_calls.jsonl") {
        let r = svc.post_json(l.as_bytes()).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let verdicts = svc.wait_verdicts(8, WAIT).await;
    verdicts.iter().map(|v| v["trace_id"].as_str().expect("trace_id").to_string()).collect()
}

/// Wait until the on-disk queue holds (at least) `n` spans.
async fn wait_stored_spans(svc: &Service, n: f64) {
    eventually_async(WAIT, "the health spans in the on-disk queue", || async {
        let t = svc.metrics_text().await;
        (prom_value(&t, "mcp_health_exporter_queue_stored_items", &[("kind", "spans")]) >= n).then_some(())
    })
    .await;
}

/// A second run on `state` with the backend up: every health span of `traces` arrives exactly
/// once, and the queue ends empty.
async fn restart_sends_each_once(state: &Path, traces: &BTreeSet<String>) -> Service {
    let sink = Sink::start().await;
    let svc = Service::start(cfg(sink.endpoint(), Some(state))).await;
    eventually(WAIT, "8 health spans after the restart", || (sink.health_spans().len() >= 8).then_some(())).await;
    eventually_async(WAIT, "the on-disk queue to empty", || async {
        let t = svc.metrics_text().await;
        (prom_value(&t, "mcp_health_exporter_queue_stored_requests", &[]) == 0.0
            && prom_value(&t, "mcp_health_exporter_sent_spans_total", &[("signal", "health_spans")]) >= 8.0)
            .then_some(())
    })
    .await;
    let mut seen: HashMap<(String, String), usize> = HashMap::new();
    for s in sink.health_spans() {
        *seen.entry((hex(&s.span.trace_id), hex(&s.span.span_id))).or_default() += 1;
    }
    let dups: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(dups.is_empty(), "health spans sent more than once: {dups:?}");
    let got: BTreeSet<String> = seen.keys().map(|(t, _)| t.clone()).collect();
    assert_eq!(&got, traces, "one health span per decided call, from the first run");
    assert_eq!(seen.len(), 8, "{seen:?}");
    let left: Vec<_> = std::fs::read_dir(state.join("sending_queue")).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "sent requests are removed from the directory: {left:?}");
    svc
}

/// A run on `state` with the backend down: eight calls decided, their health spans on disk,
/// nothing sent; then SIGKILL. The trace ids of the verdicts.
async fn queued_then_killed(state: &Path) -> BTreeSet<String> {
    let dead = dead_port();
    let svc = Service::start(cfg(format!("http://127.0.0.1:{}", dead.port), Some(state))).await;
    let traces = decide_eight_calls(&svc).await;
    wait_stored_spans(&svc, 8.0).await;
    let text = svc.metrics_text().await;
    assert_eq!(prom_value(&text, "mcp_health_exporter_sent_spans_total", &[]), 0.0, "the backend is down: {text}");
    svc.kill();
    traces
}

/// SIGKILL with health spans waiting for a down backend: nothing is lost, nothing sent twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_spans_queued_on_disk_survive_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let traces = queued_then_killed(&state).await;
    let queue_dir = state.join("sending_queue");
    let files = std::fs::read_dir(&queue_dir).unwrap().count();
    assert!(files >= 1, "requests on disk after the kill");
    // A damaged file (cut short) and a write a crash cut short: neither stops the restart.
    std::fs::write(queue_dir.join("00000000000999999990.req"), b"MHQ1\x01truncated").unwrap();
    std::fs::write(queue_dir.join("00000000000999999991.tmp"), b"MHQ1").unwrap();
    let svc = restart_sends_each_once(&state, &traces).await;
    let text = svc.metrics_text().await;
    assert_eq!(prom_value(&text, "mcp_health_exporter_queue_damaged_files_total", &[]), 1.0, "{text}");
    assert!(svc.stderr().contains("damaged sending-queue file skipped and removed"), "{}", svc.stderr());
}

/// SIGTERM with the backend down: the exit log says how many requests were left and where; the
/// next run sends them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_the_backend_down_names_what_was_left_and_where() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let dead = dead_port();
    let svc = Service::start(cfg(format!("http://127.0.0.1:{}", dead.port), Some(&state))).await;
    let traces = decide_eight_calls(&svc).await;
    wait_stored_spans(&svc, 8.0).await;
    let st = svc.terminate(WAIT).await.expect("exits after SIGTERM");
    assert!(st.success(), "{st:?}\n{}", svc.stderr());
    let err = svc.stderr();
    let queue_dir = state.join("sending_queue");
    let line = err
        .lines()
        .find(|l| l.contains("sending queue not empty at exit") && l.contains(&queue_dir.display().to_string()))
        .unwrap_or_else(|| panic!("no exit line naming the queue's directory:\n{err}"));
    let files = std::fs::read_dir(&queue_dir).unwrap().count();
    assert!(files >= 1, "requests left on disk");
    assert!(line.contains(&format!("{files} request(s)")), "the count of requests left ({files} files): {line}");
    assert!(!err.contains("lost"), "nothing is lost with a directory:\n{err}");
    drop(dead);
    restart_sends_each_once(&state, &traces).await;
}

/// Without a directory the queue is in memory: a SIGTERM with the backend down says how many
/// requests are lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_without_a_directory_counts_what_is_lost() {
    let dead = dead_port();
    let svc = Service::start(cfg(format!("http://127.0.0.1:{}", dead.port), None)).await;
    decide_eight_calls(&svc).await;
    let st = svc.terminate(WAIT).await.expect("exits after SIGTERM");
    assert!(st.success(), "{st:?}\n{}", svc.stderr());
    let err = svc.stderr();
    let line = err
        .lines()
        .find(|l| l.contains("sending queue not empty at exit") && l.contains("lost"))
        .unwrap_or_else(|| panic!("no exit line counting the lost requests:\n{err}"));
    assert!(line.split_whitespace().any(|w| w.parse::<u64>().is_ok_and(|n| n >= 1)), "a count of at least one: {line}");
    drop(dead);
}

/// A start that cannot bind its ports does nothing before it exits: with the backend up it
/// sends nothing from the queue the last run left on disk, and removes none of its files (a
/// start that sent them and then failed would leave the next start nothing to count, and a
/// journal it replayed would be decided twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_that_cannot_listen_sends_nothing_from_the_queue() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let traces = queued_then_killed(&state).await;
    let queue_dir = state.join("sending_queue");
    let files = |d: &Path| -> BTreeSet<String> {
        std::fs::read_dir(d).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect()
    };
    let before = files(&queue_dir);
    assert!(!before.is_empty(), "requests on disk after the kill");

    let sink = Sink::start().await;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let run = tempfile::tempdir().unwrap();
    let config = run.path().join("mcp-health.yaml");
    let taken_port = taken.local_addr().unwrap().port();
    let (ports, out) = serve_to_its_end(&config, Some(taken_port), |mut ports| {
        ports.http = taken_port;
        std::fs::write(&config, cfg(sink.endpoint(), Some(&state)).yaml(&ports)).unwrap();
        ports
    });
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a taken port ends the start: {err}");
    assert!(err.contains(&format!("127.0.0.1:{}", ports.http)), "the taken address is named: {err}");
    assert!(!err.contains("sending queue on disk"), "the queue is not opened before the ports are bound: {err}");
    assert!(sink.health_spans().is_empty(), "nothing sent by a start that failed");
    assert_eq!(files(&queue_dir), before, "the queue's files are untouched");
    drop(taken);
    restart_sends_each_once(&state, &traces).await;
}
