//! The evidence tap around npm's `@modelcontextprotocol/server-everything` (stdio), with the real
//! mcp-health deciding from the tap's spans — started with the arguments of docs/tutorial.md's
//! `mcpServers` configuration, so the tutorial is what is tested.
//!
//! Optional: runs when `tests/tap/everything/node_modules` holds the package (`scripts/install-test-deps`
//! installs it with `npm ci` when npm is present); otherwise it says so and passes.

#[path = "tap/driver.rs"]
mod driver;
mod support;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use driver::{drive_stdio, req, Step, Wait};
use serde_json::{json, Value};
use support::*;

/// The `command` and `args` of each JSON configuration block in docs/tutorial.md (Claude Desktop,
/// Cursor: `mcpServers`; VS Code: `servers`).
fn tutorial_configs() -> Vec<(String, Vec<String>)> {
    let text = std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/tutorial.md")).unwrap();
    let mut out = Vec::new();
    for block in text.split("```json").skip(1) {
        let json_text = block.split("```").next().unwrap();
        let v: Value = serde_json::from_str(json_text).unwrap_or_else(|e| panic!("a tutorial JSON block parses: {e}\n{json_text}"));
        let servers = v.get("mcpServers").or_else(|| v.get("servers")).expect("mcpServers or servers");
        let s = &servers["everything"];
        let args = s["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_string()).collect();
        out.push((s["command"].as_str().unwrap().to_string(), args));
    }
    out
}

#[test]
fn the_tutorial_configurations_start_the_same_tap() {
    let configs = tutorial_configs();
    assert_eq!(configs.len(), 3, "Claude Desktop, Cursor, VS Code");
    let strip = |args: &[String]| {
        let mut a = args.to_vec();
        let i = a.iter().position(|x| x == "--service-name").expect("each names its client");
        a.drain(i..i + 2);
        a
    };
    for (command, args) in &configs {
        assert_eq!(command, "mcp-health");
        assert_eq!(args[0], "tap");
        assert_eq!(strip(args), strip(&configs[0].1), "only the client's name differs");
        let server = &args[args.iter().position(|x| x == "--").unwrap() + 1..];
        assert_eq!(server, ["npx", "-y", "@modelcontextprotocol/server-everything", "stdio"]);
    }
}

fn everything_bin() -> Option<PathBuf> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/tap/everything/node_modules/.bin/mcp-server-everything");
    let node = Command::new("node").arg("--version").output().is_ok_and(|o| o.status.success());
    (p.exists() && node).then_some(p)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_everything_through_the_tap() {
    let Some(bin) = everything_bin() else {
        eprintln!("server-everything is not installed (scripts/install-test-deps): skipping");
        return;
    };
    // Generous decision_wait: the long-running operation's progress arrives over ~1.5 s.
    let svc = Service::start(Cfg { decision_wait: "500ms", max_wait: "10s", ..Cfg::default() }).await;
    let endpoint = format!("http://{}", svc.grpc_addr());
    let script = vec![
        req(0, "initialize", json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "e2e", "version": "1"}})),
        // The server registers its tools after `initialized` and says so: wait for the signal,
        // then discover, as a well-behaved client does.
        Step {
            line: json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            wait_for: Wait::Notification("notifications/tools/list_changed"),
        },
        req(1, "tools/list", json!({})),
        req(2, "tools/call", json!({"name": "echo", "arguments": {"message": "SECRET-EVERYTHING-ARG"}})),
        req(3, "tools/call", json!({"name": "get-sum", "arguments": {"a": 2, "b": 3}})),
        req(
            4,
            "tools/call",
            json!({"name": "trigger-long-running-operation", "arguments": {"duration": 1, "steps": 3}, "_meta": {"progressToken": "long-1"}}),
        ),
        req(5, "tools/call", json!({"name": "no-such-tool", "arguments": {}})),
    ];
    // The tutorial's Claude Desktop configuration, with this build for `mcp-health`, this test's
    // service for the OTLP endpoint, and the installed package for `npx -y <package>` (no network).
    let (_, args) = tutorial_configs().remove(0);
    let sep = args.iter().position(|a| a == "--").unwrap();
    let mut tap_args: Vec<String> = args[..sep].to_vec();
    let at = tap_args.iter().position(|a| a == "--otlp-endpoint").unwrap();
    tap_args[at + 1] = endpoint.clone();
    let server_args: Vec<String> = args[sep + 4..].to_vec();
    let run = tokio::task::spawn_blocking(move || {
        let mut c = Command::new(env!("CARGO_BIN_EXE_mcp-health"));
        c.args(&tap_args).arg("--").arg(bin).args(&server_args);
        c.env_remove("OTEL_SERVICE_NAME");
        drive_stdio(c, &script)
    })
    .await
    .unwrap();
    let out = String::from_utf8_lossy(&run.stdout);
    assert!(out.contains("SECRET-EVERYTHING-ARG"), "the echo came back through the tap: {out}");
    assert_eq!(out.matches("notifications/progress").count(), 3, "three progress notifications passed through: {out}");

    let by_tool = |vs: &[Value], tool: &str| vs.iter().rfind(|v| v["tool"] == tool && v["decided_by"] != "in_flight").cloned();
    let deadline = Instant::now() + Duration::from_secs(30);
    let vs = loop {
        let vs = svc.verdicts();
        if ["echo", "get-sum", "trigger-long-running-operation", "no-such-tool"].iter().all(|t| by_tool(&vs, t).is_some()) {
            break vs;
        }
        assert!(Instant::now() < deadline, "verdicts of the four calls; have {vs:#?}\ntap stderr: {}", run.stderr);
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for t in ["echo", "get-sum"] {
        let v = by_tool(&vs, t).unwrap();
        assert_eq!(v["state"], "unverified", "{v}");
        assert_eq!(v["protocol_success"], true);
    }
    // While it ran, the service may have reported it `working` (an interim verdict): never anything else.
    for interim in vs.iter().filter(|v| v["decided_by"] == "in_flight") {
        assert_eq!(interim["state"], "working", "{interim}");
    }
    let long = by_tool(&vs, "trigger-long-running-operation").unwrap();
    assert_eq!(long["state"], "unverified", "{long}");
    assert_eq!(long["progress"]["valid_updates"], 3, "{long}");
    let unknown = by_tool(&vs, "no-such-tool").unwrap();
    assert!(
        unknown["state"] == "protocol_error" || unknown["state"] == "tool_failed",
        "an unknown tool is a JSON-RPC error or an isError result: {unknown}"
    );

    let deadline = Instant::now() + Duration::from_secs(10);
    let last = loop {
        let last = svc.json_lines().into_iter().rfind(|l| l["catalog"] == true);
        if last.as_ref().is_some_and(|l| l["convergence"] == "converged") {
            break last.unwrap();
        }
        assert!(Instant::now() < deadline, "a converged catalog after the signal and the discovery; last catalog line: {last:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(last["signal_at_ns"].as_u64() < last["traversal_start_ns"].as_u64(), "the discovery followed the signal: {last}");
    assert_eq!(last["server"], "server-everything");
    assert!(!svc.stdout().contains("SECRET-EVERYTHING-ARG"));
}
