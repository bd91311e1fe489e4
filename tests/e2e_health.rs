//! The health check of the real binary: 200 while the engine steps, 503 from the start of a
//! drain until the process exits (issue 8's supervision, issue 10's "503 while draining").

mod support;

use std::time::{Duration, Instant};

use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_health_check_says_503_from_the_start_of_the_drain_until_exit() {
    // An exporter that never answers keeps the drain busy (exports pending) for a few seconds.
    let dead = dead_port();
    let cfg = Cfg {
        exporter: Some(format!("http://127.0.0.1:{}", dead.port)),
        passthrough: true,
        health_spans: true,
        otlp_metrics: false,
        shutdown_timeout: "4s",
        exporter_timeout: "2s",
        ..Cfg::default()
    };
    let svc = Service::start(cfg).await;
    assert_eq!(svc.health_status().await, Some(200));
    let line = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/eight_calls.jsonl")).unwrap();
    let first = line.lines().next().unwrap();
    assert_eq!(svc.post_json(first.as_bytes()).await.status, 200);
    // SIGTERM, without waiting for the exit.
    // SAFETY: kill(2) on the child's pid.
    unsafe { libc::kill(svc.pid() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    while svc.running() && Instant::now() < deadline {
        if let Some(code) = svc.health_status().await {
            seen.push(code);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!svc.running(), "the service exits within its shutdown timeout");
    assert!(seen.contains(&503), "503 while draining: {seen:?}");
    assert!(!seen.iter().skip_while(|c| **c != 503).any(|c| *c == 200), "never green again once draining: {seen:?}");
}

/// The container's health check (`HEALTHCHECK`): `mcp-health health` exits 0 while the service
/// answers 200, and 1 when nothing answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_health_subcommand_exits_0_on_200_and_1_otherwise() {
    let svc = Service::start(Cfg { exporter: None, ..Cfg::default() }).await;
    let run = |addr: String| {
        std::process::Command::new(env!("CARGO_BIN_EXE_mcp-health"))
            .args(["health", "--endpoint", &addr, "--timeout", "2s"])
            .output()
            .unwrap()
    };
    let ok = tokio::task::spawn_blocking({
        let addr = svc.health_addr().to_string();
        move || run(addr)
    })
    .await
    .unwrap();
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    let dead = dead_port();
    let down = tokio::task::spawn_blocking(move || run(format!("127.0.0.1:{}", dead.port))).await.unwrap();
    assert_eq!(down.status.code(), Some(1));
}

/// The image's configuration is valid as shipped, and with its addresses moved by environment.
#[test]
fn the_container_configuration_validates() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/otel-config/container.yaml");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mcp-health")).args(["validate", path]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let cfg = mcp_health::config::Config::load(Some(path)).unwrap();
    let grpc = cfg.receivers.otlp.protocols.grpc.unwrap().endpoint;
    assert!(grpc.starts_with("0.0.0.0:") || std::env::var("MCP_HEALTH_GRPC_ENDPOINT").is_ok(), "reachable in a container: {grpc}");
    assert!(cfg.exporters.otlp.is_none(), "no pass-through unless switched on");
}
