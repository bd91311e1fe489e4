//! The tap with the MCP software people run: the `mcp` SDK 2.x client and server of the dialect
//! scenarios (tests/dialects/stack_sdk.py), their own tracing off, `mcp-health tap` in the path
//! (tests/tap/sdk_through_tap.py), the real mcp-health deciding from the tap's spans alone. Issue
//! 5's full set: success, isError, raised exception, unknown tool, progress, catalog convergence
//! after a list change and re-list, and over streamable HTTP with bearer auth no token, a bad token
//! (401) and a token without the required scope (403, `needs_auth` with the scope).
//!
//! Needs .venv-mcp (scripts/install-test-deps). Without it the test skips, except under CI (`CI`
//! set) or with MCP_HEALTH_REQUIRE_DIALECTS=1, where a missing environment fails.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_client_and_server_through_the_tap_give_the_full_set() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let py = root.join(".venv-mcp/bin/python");
    if !py.exists() {
        let required = std::env::var_os("CI").is_some() || std::env::var("MCP_HEALTH_REQUIRE_DIALECTS").as_deref() == Ok("1");
        assert!(!required, "{} is missing: run scripts/install-test-deps", py.display());
        eprintln!("{} is missing (scripts/install-test-deps makes it): skipping", py.display());
        return;
    }
    let svc = Service::start(Cfg::default()).await;
    let endpoint = format!("http://{}", svc.grpc_addr());
    let script = root.join("tests/tap/sdk_through_tap.py");
    let out = tokio::task::spawn_blocking(move || {
        Command::new(py)
            .arg(script)
            .arg(env!("CARGO_BIN_EXE_mcp-health"))
            .arg(endpoint)
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("OTEL_SERVICE_NAME")
            .stdin(Stdio::null())
            .output()
            .expect("run sdk_through_tap.py")
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "sdk_through_tap.py failed:\n{stderr}");
    let manifest: Value =
        String::from_utf8_lossy(&out.stdout).lines().rev().find_map(|l| serde_json::from_str(l).ok()).expect("the manifest");
    let stdio = manifest["tap-sdk-stdio"].as_array().unwrap();
    assert_eq!(
        stdio.iter().find(|s| s["step"] == "tools/call slow").unwrap()["progress"],
        3,
        "the client got its progress through the tap: {manifest}"
    );
    assert_eq!(stdio.last().unwrap()["pages"], 3, "the re-list saw the added tool: {manifest}");

    // The final verdict of each call (an in-flight `working` report may come first).
    let find = |vs: &[Value], agent: &str, method: &str, tool: Option<&str>| {
        vs.iter()
            .rfind(|v| {
                v["agent"] == agent && v["method"] == method && tool.is_none_or(|t| v["tool"] == t) && v["decided_by"] != "in_flight"
            })
            .cloned()
    };
    let wanted: [(&str, &str, Option<&str>); 9] = [
        ("tap-sdk-stdio", "tools/call", Some("echo")),
        ("tap-sdk-stdio", "tools/call", Some("fails")),
        ("tap-sdk-stdio", "tools/call", Some("explodes")),
        ("tap-sdk-stdio", "tools/call", Some("missing")),
        ("tap-sdk-stdio", "tools/call", Some("slow")),
        ("tap-sdk-http-ok", "tools/call", Some("echo")),
        ("tap-sdk-http-none", "initialize", None),
        ("tap-sdk-http-bad", "initialize", None),
        ("tap-sdk-http-noscope", "initialize", None),
    ];
    let deadline = Instant::now() + Duration::from_secs(30);
    let vs = loop {
        let vs = svc.verdicts();
        if wanted.iter().all(|(a, m, t)| find(&vs, a, m, *t).is_some()) {
            break vs;
        }
        assert!(Instant::now() < deadline, "verdicts missing; have {vs:#?}\nscript stderr:\n{stderr}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let v = |a: &str, m: &str, t: Option<&str>| find(&vs, a, m, t).unwrap();

    let echo = v("tap-sdk-stdio", "tools/call", Some("echo"));
    assert_eq!(echo["state"], "unverified", "{echo}");
    assert_eq!(echo["protocol_success"], true);
    let fails = v("tap-sdk-stdio", "tools/call", Some("fails"));
    assert_eq!(fails["state"], "tool_failed", "{fails}");
    // The SDK in legacy mode sends an uncaught exception as JSON-RPC code 0: the tap reports the
    // code as it was sent, and the service reads it as an error response.
    let explodes = v("tap-sdk-stdio", "tools/call", Some("explodes"));
    assert_eq!(explodes["state"], "protocol_error", "{explodes}");
    let missing = v("tap-sdk-stdio", "tools/call", Some("missing"));
    assert_eq!(missing["state"], "protocol_error", "{missing}");
    assert_eq!(missing["reason"], "jsonrpc_-32602");
    let slow = v("tap-sdk-stdio", "tools/call", Some("slow"));
    assert_eq!(slow["state"], "unverified", "{slow}");
    assert_eq!(slow["progress"]["valid_updates"], 3, "{slow}");

    let ok = v("tap-sdk-http-ok", "tools/call", Some("echo"));
    assert_eq!(ok["state"], "unverified", "{ok}");
    let none = v("tap-sdk-http-none", "initialize", None);
    assert_eq!(none["state"], "needs_auth", "{none}");
    assert_eq!(none["reason"], "missing_token");
    let bad = v("tap-sdk-http-bad", "initialize", None);
    assert_eq!(bad["state"], "needs_auth", "{bad}");
    assert_eq!(bad["reason"], "invalid_token");
    let noscope = v("tap-sdk-http-noscope", "initialize", None);
    assert_eq!(noscope["state"], "needs_auth", "{noscope}");
    assert_eq!(noscope["reason"], "insufficient_scope");
    assert_eq!(noscope["required_scope"], "tools:call", "the scope the 403 named");

    // The stdio session's catalog: converged after the list change and the re-list, with the
    // added tool.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let last = svc.json_lines().into_iter().rfind(|l| l["catalog"] == true && l["server"] == "sdk-server");
        if let Some(l) = &last {
            let names: Vec<&str> =
                l["tool_digests"].as_array().map(|a| a.iter().filter_map(|t| t["name"].as_str()).collect()).unwrap_or_default();
            if l["convergence"] == "converged" && names.contains(&"extra") {
                assert!(l["signal_at_ns"].as_u64().unwrap() < l["traversal_start_ns"].as_u64().unwrap(), "{l}");
                assert_eq!(names.len(), 7);
                break;
            }
        }
        assert!(Instant::now() < deadline, "no converged catalog with the added tool; last catalog line: {last:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let all = svc.stdout();
    assert!(
        !all.contains("SECRET-SDK-ARGUMENT") && !all.contains("tok-good") && !all.contains("tok-noscope"),
        "no argument or token in verdicts"
    );
}
