//! End to end with the MCP software people run: for each instrumentation dialect (the `mcp` SDK
//! 2.x's built-in tracing, FastMCP's native tracing, traceloop's opentelemetry-instrumentation-mcp,
//! logfire's instrument_mcp), real client and server processes run every scenario of
//! tests/dialects/run.py, over stdio and over streamable HTTP with bearer auth, exporting OTLP to
//! the real `mcp-health`. Each test asserts the verdicts that instrumentation can support, and that
//! what it cannot see is never reported green: a call nobody verified is `unverified`, a refused
//! request seen only as the client's `-32603` is never a protocol error or a failed negotiation,
//! and without HTTP server spans no authorization verdict is invented.
//!
//! The Python environments come from scripts/install-test-deps (.venv-mcp, .venv-mcp1). Without
//! them the tests skip, except under CI (`CI` set) or with MCP_HEALTH_REQUIRE_DIALECTS=1, where a
//! missing environment fails.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::*;

/// What one stack's run produced: the client-side manifest and the service's verdicts.
struct Run {
    stack: &'static str,
    manifest: Value,
    verdicts: Vec<Value>,
    lines: Vec<Value>,
}

impl Run {
    fn of(&self, agent: &str) -> Vec<&Value> {
        let agent = format!("{}-{agent}", self.stack);
        self.verdicts.iter().filter(|v| v["agent"] == agent.as_str()).collect()
    }
    fn call(&self, agent: &str, tool: &str) -> &Value {
        let calls: Vec<&Value> = self.of(agent).into_iter().filter(|v| v["method"] == "tools/call" && v["tool"] == tool).collect();
        assert_eq!(calls.len(), 1, "{}: one verdict for tools/call {tool} of {agent}, have {calls:#?}", self.stack);
        calls[0]
    }
    fn steps(&self, agent: &str) -> &Vec<Value> {
        self.manifest[format!("{}-{agent}", self.stack)].as_array().unwrap_or_else(|| panic!("no manifest for {agent}: {}", self.manifest))
    }
}

fn layer(v: &Value, l: &str) -> String {
    v["layers"][l].as_str().unwrap_or("?").to_string()
}

/// Run tests/dialects/run.py STACK against a fresh service and collect the verdicts.
async fn run_stack(stack: &'static str, venv: &str, expected: impl Fn(&[Value]) -> bool) -> Option<Run> {
    let py = venv_python(venv)?;
    let svc = Service::start(Cfg::default()).await;
    let endpoint = format!("http://{}", svc.grpc_addr());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/dialects/run.py");
    let started = Instant::now();
    let out = tokio::task::spawn_blocking(move || {
        let mut cmd = Command::new(py);
        cmd.arg(script).arg(stack).arg(endpoint);
        without_ambient_otel(&mut cmd).output()
    })
    .await
    .unwrap()
    .expect("run tests/dialects/run.py");
    assert!(out.status.success(), "{stack} scenarios failed: {}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let manifest: Value = serde_json::from_str(stdout.lines().last().unwrap_or("")).unwrap_or_else(|e| panic!("manifest: {e}: {stdout}"));
    eprintln!("{stack}: scenarios ran in {:.1?}", started.elapsed());
    let verdicts = eventually(Duration::from_secs(30), &format!("{stack} verdicts"), || Some(svc.verdicts()).filter(|v| expected(v))).await;
    // Anything still in flight (a late half, a revision) gets its chance before absences are checked.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let _ = verdicts;
    Some(Run { stack, manifest, verdicts: svc.verdicts(), lines: svc.json_lines() })
}

fn has(vs: &[Value], agent: &str, method: &str, tool: Option<&str>) -> bool {
    vs.iter().any(|v| v["agent"] == agent && v["method"] == method && tool.is_none_or(|t| v["tool"] == t))
}

/// Assertions every instrumentation must satisfy.
fn common(r: &Run, auth_methods: &[&str]) {
    let s = r.stack;
    // The scenarios really ran as designed.
    let stdio = r.steps("stdio");
    let pages: Vec<i64> = stdio.iter().filter(|x| x["step"] == "tools/list").map(|x| x["pages"].as_i64().unwrap()).collect();
    assert_eq!(pages, vec![2, 3], "{s}: two-page list, then three pages after the list change");
    assert!(stdio.iter().any(|x| x["step"] == "tools/call slow" && x["progress"] == 3), "{s}: the client got 3 progress notifications");
    for label in ["none", "bad", "noscope"] {
        for traced in ["", "-traced"] {
            let steps = r.steps(&format!("http-{label}{traced}"));
            assert!(
                steps.iter().any(|x| x["step"] == "initialize" && x.get("exception").is_some()),
                "{s}: http-{label}{traced} refused: {steps:?}"
            );
        }
    }

    // Never green without a verifier: no instrumentation reports an outcome.
    for v in &r.verdicts {
        assert_ne!(v["state"], "healthy", "{s}: {v}");
        assert_eq!(v["verified_success"], false, "{s}: {v}");
    }
    // A successful call: every observed layer passed, the outcome unobserved.
    for agent in ["stdio", "http-ok", "http-ok-traced"] {
        let echo = r.call(agent, "echo");
        assert_eq!(echo["state"], "unverified", "{s} {agent}: {echo}");
        assert_eq!(echo["protocol_success"], true, "{s} {agent}: {echo}");
        assert_eq!(layer(echo, "outcome"), "unobserved");
        assert_eq!(layer(echo, "execution"), "passed");
    }
    // An isError result.
    let fails = r.call("stdio", "fails");
    assert_eq!(
        (fails["state"].as_str(), fails["first_failed_layer"].as_str(), fails["reason"].as_str()),
        (Some("tool_failed"), Some("execution"), Some("tool_error")),
        "{s}"
    );
    // No instrumentation records progress notifications: a long call is just a call.
    let slow = r.call("stdio", "slow");
    assert_eq!(slow["state"], "unverified", "{s}: {slow}");
    assert!(slow.get("progress").is_none(), "{s}: no progress evidence exists: {slow}");
    // Nor list-changed notifications or cursors: no catalog verdict can be claimed.
    assert_eq!(r.call("stdio", "mutate")["state"], "unverified");
    assert!(!r.lines.iter().any(|l| l["catalog"] == true && l["convergence"] == "converged"), "{s}: no catalog evidence, no convergence");

    // Refused HTTP requests. With HTTP server tracing, the `POST /mcp` span (another trace) gives
    // the status: needs_auth, the protocol layer unobserved (the client's -32603 is its rendering).
    for (label, reason) in [("none", "invalid_token"), ("bad", "invalid_token"), ("noscope", "insufficient_scope")] {
        let agent = format!("http-{label}-traced");
        let vs = r.of(&agent);
        for m in auth_methods {
            let v = vs.iter().find(|v| v["method"] == *m).unwrap_or_else(|| panic!("{s} {agent}: a verdict for {m}: {vs:#?}"));
            assert_eq!(v["state"], "needs_auth", "{s} {agent} {m}: {v}");
            assert_eq!(v["first_failed_layer"], "authorization", "{s} {agent}: {v}");
            assert_eq!(v["reason"], reason, "{s} {agent}: {v}");
            assert_eq!(layer(v, "protocol"), "unobserved", "{s} {agent}: {v}");
            assert_eq!(layer(v, "transport"), "passed", "{s} {agent}: {v}");
        }
        // Without HTTP server tracing nothing says why: never a protocol error, a failed
        // negotiation, an outage or an invented authorization verdict.
        for v in r.of(&format!("http-{label}")) {
            let st = v["state"].as_str().unwrap();
            assert!(
                !["protocol_error", "incompatible_session", "transport_failed", "needs_auth", "healthy"].contains(&st),
                "{s} http-{label}: {v}"
            );
        }
    }
    // One call, one verdict: the halves of a call split over two traces are joined.
    assert_eq!(r.of("http-ok-traced").iter().filter(|v| v["method"] == "tools/call").count(), 1, "{s}");
    assert!(
        !r.verdicts.iter().any(|v| v["agent"].is_null() && v["method"] == "tools/call"),
        "{s}: a server half decided alone: {:#?}",
        r.verdicts
    );
}

fn expected_common(stack: &str, vs: &[Value], auth_methods: &[&str]) -> bool {
    let a = |x: &str| format!("{stack}-{x}");
    ["echo", "fails", "explodes", "missing", "slow", "mutate"].iter().all(|t| has(vs, &a("stdio"), "tools/call", Some(t)))
        && ["http-ok", "http-ok-traced"].iter().all(|x| has(vs, &a(x), "tools/call", Some("echo")))
        && ["none", "bad", "noscope"].iter().all(|l| auth_methods.iter().all(|m| has(vs, &a(&format!("http-{l}-traced")), m, None)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_sdk_2_builtin_tracing() {
    let methods = ["initialize"];
    let Some(r) = run_stack("sdk", ".venv-mcp", |vs| expected_common("sdk", vs, &methods)).await else { return };
    common(&r, &methods);
    // Both sides are seen (server spans continue the client's trace through `_meta`).
    assert_eq!(r.call("stdio", "echo")["confidence"], "high");
    // An uncaught exception reaches the client as code 0 (legacy handshake): an internal error.
    let ex = r.call("stdio", "explodes");
    assert_eq!((ex["state"].as_str(), ex["reason"].as_str()), (Some("protocol_error"), Some("jsonrpc_-32603")), "{ex}");
    // An unknown tool is the server's -32602.
    let missing = r.call("stdio", "missing");
    assert_eq!((missing["state"].as_str(), missing["reason"].as_str()), (Some("protocol_error"), Some("jsonrpc_-32602")), "{missing}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fastmcp_native_tracing() {
    // FastMCP's client negotiates 2026-07-28 (server/discover), then falls back to initialize.
    let methods = ["server/discover", "initialize"];
    let Some(r) = run_stack("fastmcp", ".venv-mcp", |vs| expected_common("fastmcp", vs, &methods)).await else { return };
    common(&r, &methods);
    // Two CLIENT spans per request (FastMCP's over the SDK's) are one call.
    assert_eq!(r.call("stdio", "echo")["confidence"], "high");
    // FastMCP turns an exception into an isError result.
    assert_eq!(r.call("stdio", "explodes")["state"], "tool_failed");
    // An unknown tool (isError, error.type=NotFoundError) is a protocol failure: refresh discovery.
    let missing = r.call("stdio", "missing");
    assert_eq!((missing["state"].as_str(), missing["reason"].as_str()), (Some("protocol_error"), Some("unknown_tool")), "{missing}");
    assert!(missing["next_action"].as_str().unwrap().starts_with("refresh discovery"), "{missing}");
    // The traced call's server half (parented on the HTTP span in another trace) joined the client's.
    assert_eq!(r.call("http-ok-traced", "echo")["confidence"], "high");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traceloop_opentelemetry_instrumentation_mcp() {
    let methods = ["initialize"];
    let Some(r) = run_stack("traceloop", ".venv-mcp1", |vs| expected_common("traceloop", vs, &methods)).await else { return };
    common(&r, &methods);
    // Client spans only (INTERNAL, no server span of its own on the SDK 1.x server): one side.
    assert_eq!(r.call("stdio", "echo")["confidence"], "medium");
    // mcp 1.x turns exceptions and unknown tools into isError results; nothing says which.
    assert_eq!(r.call("stdio", "explodes")["state"], "tool_failed");
    assert_eq!(r.call("stdio", "missing")["state"], "tool_failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logfire_instrument_mcp() {
    let methods = ["initialize"];
    let Some(r) = run_stack("logfire", ".venv-mcp1", |vs| expected_common("logfire", vs, &methods)).await else { return };
    common(&r, &methods);
    assert_eq!(r.call("stdio", "echo")["confidence"], "high");
    assert_eq!(r.call("stdio", "explodes")["state"], "tool_failed");
    assert_eq!(r.call("stdio", "missing")["state"], "tool_failed");
    // Only `isError` and an error code are read from logfire's request/response attributes: no
    // argument or result text reaches a verdict.
    for v in &r.lines {
        let t = v.to_string();
        assert!(!t.contains("the tool failed") && !t.contains("\"hi\""), "{t}");
    }
}
