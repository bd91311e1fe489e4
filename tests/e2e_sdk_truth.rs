//! Issue 34, live: what mcp-health concludes from the spans the MCP SDKs emit themselves — no tap,
//! no HTTP server tracing — with real clients and servers exporting to the real service (its
//! default waits: `decision_wait` 2 s, `server_half_wait` 5 s).
//!
//! - Two `mcp` 2.x clients on 2026-07-28 (tests/dialects/two_agents.py) reuse request ids against
//!   one server whose spans start traces of their own, one flushing about a second after the other:
//!   overlapping calls are never joined to each other's server half (both partial,
//!   `ambiguous_server_half`), and calls one after the other are joined right.
//! - The SDKs' own telemetry alone (tests/dialects/failures.py: `mcp` 2.x, FastMCP, traceloop on
//!   mcp 1.x; 2026-07-28 and 2025-11-25): a server down at connect, a server that dies mid-call, a
//!   401 at setup — each an attempt that is no protocol success, never green, never an invented
//!   `needs_auth`; `/metrics` counts them as attempts, not successes, and the unconfirmed ones.
//!
//! The Python environments come from scripts/install-test-deps (.venv-mcp, .venv-mcp1); without
//! them the tests skip, except under CI (`CI` set) or with MCP_HEALTH_REQUIRE_DIALECTS=1.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use support::*;

/// Run a tests/dialects script with the service's OTLP endpoint; its JSON manifest.
async fn run_script(py: std::path::PathBuf, script: &str, args: Vec<String>) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/dialects").join(script);
    let out = tokio::task::spawn_blocking(move || {
        let mut cmd = Command::new(py);
        cmd.arg(script).args(args);
        without_ambient_otel(&mut cmd).output()
    })
    .await
    .unwrap()
    .expect("run the scenario script");
    assert!(out.status.success(), "scenario failed: {}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.lines().last().unwrap_or("")).unwrap_or_else(|e| panic!("manifest: {e}: {stdout}"))
}

/// The latest verdict of each call of `agent` for `method` (a revision replaces its call's verdict).
fn finals<'a>(vs: &'a [Value], agent: &str, method: &str) -> Vec<&'a Value> {
    let mut by_span: std::collections::BTreeMap<String, &Value> = std::collections::BTreeMap::new();
    for v in vs.iter().filter(|v| v["agent"] == agent && v["method"] == method) {
        by_span.insert(v["span_id"].as_str().unwrap_or("").to_string(), v);
    }
    by_span.into_values().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_real_sdk_clients_reusing_request_ids_never_swap_server_halves() {
    let Some(py) = venv_python(".venv-mcp") else { return };
    for mode in ["overlapping", "sequential"] {
        let svc = Service::start(Cfg::default()).await;
        let endpoint = format!("http://{}", svc.grpc_addr());
        let manifest = run_script(py.clone(), "two_agents.py", vec![endpoint, mode.into()]).await;
        let step = |agent: &str| manifest[agent].as_array().and_then(|s| s.iter().find(|x| x["step"] == "tools/call create")).cloned();
        assert_eq!(step("agent-a").map(|s| s["is_error"].clone()), Some(Value::Bool(true)), "{mode}: agent A's call failed: {manifest}");
        assert_eq!(step("agent-b").map(|s| s["is_error"].clone()), Some(Value::Bool(false)), "{mode}: agent B's succeeded: {manifest}");
        let both = eventually(Duration::from_secs(40), &format!("{mode}: both calls decided"), || {
            let vs = svc.verdicts();
            let (a, b) = (finals(&vs, "agent-a", "tools/call"), finals(&vs, "agent-b", "tools/call"));
            (a.len() == 1 && b.len() == 1).then(|| (a[0].clone(), b[0].clone()))
        })
        .await;
        // Anything still in flight (a revision) gets its chance.
        tokio::time::sleep(Duration::from_secs(8)).await;
        let vs = svc.verdicts();
        let (a, b) = (finals(&vs, "agent-a", "tools/call")[0].clone(), finals(&vs, "agent-b", "tools/call")[0].clone());
        let _ = both;
        // Never the swap: B's success never reads A's tool error, A's failure never reads B's
        // success as confirmed by a server.
        assert_ne!(b["state"], "tool_failed", "{mode}: agent B took agent A's server half: {b}");
        assert!(!(a["state"] == "unverified" && a["partial"].is_null() && a["protocol_success"] == true), "{mode}: A read B's half: {a}");
        match mode {
            "overlapping" => {
                // Overlapping calls of one tool with one request id: no evidence tells them apart.
                for v in [&a, &b] {
                    assert_eq!(v["partial"], "ambiguous_server_half", "{mode}: {v}");
                    assert_eq!(v["reason"], "ambiguous_server_half", "{mode}: {v}");
                    assert_ne!(v["state"], "healthy");
                    assert_eq!(v["attempt"], true);
                }
                let text = svc.wait_metric("mcp_health_joins_total", Duration::from_secs(10), |n| n >= 1.0).await;
                assert!(
                    text.lines().any(|l| l.starts_with("mcp_health_joins_total") && l.contains("result=\"ambiguous\"")),
                    "{mode}: the join not made is counted"
                );
            }
            _ => {
                // One after the other: each server half fits its own client exactly.
                assert_eq!((a["state"].as_str(), a["reason"].as_str()), (Some("tool_failed"), Some("tool_error")), "{mode}: {a}");
                assert_eq!((b["state"].as_str(), b["protocol_success"].as_bool()), (Some("unverified"), Some(true)), "{mode}: {b}");
                assert!(a["partial"].is_null() && b["partial"].is_null(), "{mode}: {a} {b}");
                assert_eq!((a["confidence"].as_str(), b["confidence"].as_str()), (Some("high"), Some("high")), "both sides seen");
            }
        }
        // A server half decided alone is no attempt of its own.
        for v in vs.iter().filter(|v| v["method"] == "tools/call" && v["agent"].is_null()) {
            assert_eq!(v["attempt"], false, "{mode}: a server half counted as an attempt: {v}");
        }
        svc.terminate(Duration::from_secs(15)).await;
    }
}

/// Which stacks run on which revision (traceloop instruments mcp 1.x, which speaks 2025-11-25 only).
const RUNS: [(&str, &str, &str); 5] = [
    ("sdk", "2026-07-28", ".venv-mcp"),
    ("sdk", "2025-11-25", ".venv-mcp"),
    ("fastmcp", "2026-07-28", ".venv-mcp"),
    ("fastmcp", "2025-11-25", ".venv-mcp"),
    ("traceloop", "2025-11-25", ".venv-mcp1"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_telemetry_alone_never_makes_a_dead_server_a_success() {
    let (Some(py2), Some(py1)) = (venv_python(".venv-mcp"), venv_python(".venv-mcp1")) else { return };
    let svc = Service::start(Cfg::default()).await;
    let endpoint = format!("http://{}", svc.grpc_addr());
    let mut manifests = Vec::new();
    for (stack, rev, venv) in RUNS {
        let py = if venv == ".venv-mcp" { py2.clone() } else { py1.clone() };
        let m = run_script(py, "failures.py", vec![stack.into(), rev.into(), endpoint.clone()]).await;
        manifests.push((stack, rev, m));
    }
    let agent = |stack: &str, rev: &str, scenario: &str| format!("{stack}-{rev}-{scenario}");
    // What is still missing: a setup attempt of every `down` and `refused` agent, the lost
    // call of every `dies-stdio` agent.
    let missing = |vs: &[Value]| -> Vec<String> {
        let mut out = Vec::new();
        for (stack, rev, _) in RUNS {
            for s in ["down", "refused"] {
                if !vs.iter().any(|v| v["agent"] == agent(stack, rev, s).as_str() && v["attempt"] == true) {
                    out.push(agent(stack, rev, s));
                }
            }
            if !vs.iter().any(|v| v["agent"] == agent(stack, rev, "dies-stdio").as_str() && v["tool"] == "die") {
                out.push(agent(stack, rev, "dies-stdio"));
            }
        }
        out
    };
    let started = std::time::Instant::now();
    while !missing(&svc.verdicts()).is_empty() && started.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::time::sleep(Duration::from_secs(8)).await;
    let vs = svc.verdicts();
    assert_eq!(missing(&vs), Vec::<String>::new(), "verdicts: {vs:#?}\nmanifests: {manifests:#?}");
    for (stack, rev, manifest) in &manifests {
        let name = |s: &str| agent(stack, rev, s);
        // The scenarios ran as designed: the client saw every failure.
        for s in ["down", "refused"] {
            let steps = manifest[name(s)].as_array().unwrap_or_else(|| panic!("{stack} {rev}: no manifest for {s}: {manifest}"));
            assert!(steps.iter().any(|x| x.get("exception").is_some()), "{stack} {rev} {s}: the client saw a failure: {steps:?}");
        }
        // Nothing is ever green, and nothing invents an authorization failure nobody saw.
        for v in vs.iter().filter(|v| v["agent"].as_str().is_some_and(|a| a.starts_with(&format!("{stack}-{rev}-")))) {
            assert_ne!(v["state"], "healthy", "{stack} {rev}: {v}");
            assert_ne!(v["state"], "needs_auth", "{stack} {rev}: no span says 401: {v}");
        }
        // A server down at connect, a 401 at setup: a failed (or unconfirmed) setup attempt.
        for s in ["down", "refused"] {
            let setups: Vec<&Value> = vs.iter().filter(|v| v["agent"] == name(s).as_str() && v["attempt"] == true).collect();
            assert!(!setups.is_empty(), "{stack} {rev} {s}: the setup is an attempt, reported");
            for v in setups {
                assert!(["initialize", "server/discover"].contains(&v["method"].as_str().unwrap_or("")), "{stack} {rev} {s}: {v}");
                assert_eq!(v["protocol_success"], false, "{stack} {rev} {s}: never a protocol success: {v}");
                let reason = v["reason"].as_str().unwrap_or("");
                assert!(
                    ["transport_or_authorization_unobserved", "response_unobserved", "connection_reset", "connection_refused"]
                        .contains(&reason),
                    "{stack} {rev} {s}: the layer is not invented: {v}"
                );
            }
        }
        // A server that dies mid-call: the lost call is no protocol success, over stdio and HTTP.
        for s in ["dies-stdio", "dies-http"] {
            let die: Vec<&Value> = finals(&vs, &name(s), "tools/call").into_iter().filter(|v| v["tool"] == "die").collect();
            if s == "dies-http" && die.is_empty() {
                // The SDK 2.x on 2026-07-28 HTTP cancels the call when the transport crashes:
                // whether its span is exported before the process ends is the SDK's business.
                continue;
            }
            assert_eq!(die.len(), 1, "{stack} {rev} {s}: one verdict for the lost call: {:#?}", finals(&vs, &name(s), "tools/call"));
            assert_eq!(die[0]["protocol_success"], false, "{stack} {rev} {s}: a dead server is no success: {}", die[0]);
            assert_eq!(die[0]["attempt"], true);
        }
    }
    // The rates, as documented (docs/health-model.md, "Protocol success only where an answer is
    // evidenced"): attempts counted, the unconfirmed ones beside them, fewer successes than attempts.
    let text = svc.wait_metric("mcp_health_calls_unconfirmed_total", Duration::from_secs(10), |n| n >= 1.0).await;
    let (calls, ok) = (
        prom_sum(&text, "mcp_health_calls_total").unwrap_or(0.0),
        prom_sum(&text, "mcp_health_calls_protocol_success_total").unwrap_or(0.0),
    );
    assert!(calls >= 20.0, "every scenario's attempts are counted: {calls}");
    assert!(ok < calls / 2.0, "dead servers and refusals are not successes: {ok} of {calls}");
    svc.terminate(Duration::from_secs(15)).await;
}
