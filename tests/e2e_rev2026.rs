//! Issue 21, live: the MCP that agents run today. The PyPI `mcp` SDK 2.3 client and server on
//! protocol revision 2026-07-28 (tests/tap/rev2026_through_tap.py: no `initialize`, no session,
//! `ttlMs` on every list result, `subscriptions/listen`, multi-round-trip calls, the new error
//! codes) and a server that follows the tasks extension (tests/tap/tasks_server.py), every span
//! from `mcp-health tap`, the real service deciding. One test per feature group, each asserting
//! the verdicts, the catalog lines and the incident transitions.
//!
//! Needs .venv-mcp (scripts/install-test-deps). Without it the tests skip, except under CI (`CI`
//! set) or with MCP_HEALTH_REQUIRE_DIALECTS=1, where a missing environment fails.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::*;

/// Run one of the scenario scripts through the tap into `svc`; its manifest.
async fn run_script(script: &str, svc: &Service) -> Option<Value> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let py = venv_python(".venv-mcp")?;
    let endpoint = format!("http://{}", svc.grpc_addr());
    let script = root.join(script);
    let out = tokio::task::spawn_blocking(move || {
        Command::new(py)
            .arg(script)
            .arg(env!("CARGO_BIN_EXE_mcp-health"))
            .arg(endpoint)
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("OTEL_SERVICE_NAME")
            .stdin(Stdio::null())
            .output()
            .expect("run the scenario script")
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the scenario script failed:\n{stderr}");
    Some(String::from_utf8_lossy(&out.stdout).lines().rev().find_map(|l| serde_json::from_str(l).ok()).expect("the manifest"))
}

/// Final verdicts (no in-flight reports) of one agent, in the order printed.
fn finals(svc: &Service, agent: &str) -> Vec<Value> {
    svc.verdicts().into_iter().filter(|v| v["agent"] == agent && v["decided_by"] != "in_flight").collect()
}

/// The states of `tool`'s calls in the order they were made (decisions may print in another).
fn states(vs: &[Value], tool: &str) -> Vec<String> {
    let mut calls: Vec<&Value> = vs.iter().filter(|v| v["tool"] == tool).collect();
    calls.sort_by_key(|v| v["start_ns"].as_u64());
    calls.iter().map(|v| v["state"].as_str().unwrap_or("").to_string()).collect()
}

/// Catalog lines of one agent (keyed by client and server identity: 2026-07-28 has no session).
fn catalog(svc: &Service, agent: &str) -> Vec<Value> {
    svc.json_lines().into_iter().filter(|l| l["catalog"] == true && l["agent"] == agent).collect()
}

/// Incident transitions of one agent's incidents: (transition, state, tool).
fn incidents(svc: &Service, agent: &str) -> Vec<(String, String, String)> {
    svc.json_lines()
        .into_iter()
        .filter(|l| l["incident"] == true && l["row"]["agents"].as_array().is_some_and(|a| a.iter().any(|x| x == agent)))
        .map(|l| {
            let s = |v: &Value| v.as_str().unwrap_or("").to_string();
            (s(&l["transition"]), s(&l["row"]["cause"]["state"]), s(&l["row"]["cause"]["tool"]))
        })
        .collect()
}

async fn wait_until(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_2026_07_28_revision_live_through_the_tap() {
    let svc = Service::start(Cfg { decision_wait: "500ms", ..Cfg::default() }).await;
    let Some(manifest) = run_script("tests/tap/rev2026_through_tap.py", &svc).await else { return };
    let listen_log = manifest["rev26-listen"].as_array().unwrap();
    assert!(listen_log.iter().any(|s| s["step"] == "event" && s["arrived"] == true), "the client got the list change: {manifest}");
    wait_until("every scenario's final verdicts", 30, || {
        finals(&svc, "rev26-default-auto").len() == 2
            && finals(&svc, "rev26-ttl").len() == 3
            && finals(&svc, "rev26-listen").len() == 5
            && finals(&svc, "rev26-confirm").len() == 2
            && finals(&svc, "rev26-refused-version").len() == 3
    })
    .await;

    // Item 2. A server on the SDK's defaults (ttlMs 0): no freshness window, never stale on that
    // ground alone. The catalog is unverifiable (nothing bounds it), the calls are unverified.
    for agent in ["rev26-default-auto", "rev26-default-pinned"] {
        let vs = finals(&svc, agent);
        assert!(vs.iter().all(|v| v["state"] == "unverified" && v["protocol_revision"] == "2026-07-28"), "{agent}: {vs:#?}");
        assert!(vs.iter().all(|v| v["attempt"] == true && v["session_id_hash"].is_null()), "{vs:#?}");
        let cat = catalog(&svc, agent);
        assert!(!cat.is_empty() && cat.iter().all(|l| l["convergence"] == "unverifiable"), "{agent}: {cat:#?}");
        assert_eq!(cat[0]["protocol_revision"], "2026-07-28");
        assert!(incidents(&svc, agent).is_empty(), "no incident for a ttlMs-0 server: {:?}", incidents(&svc, agent));
    }

    // Item 2. A positive ttlMs: fresh, then a call made after it passed is `stale_catalog`; the
    // re-list converges the catalog, which resolves the stale-catalog incident.
    assert_eq!(states(&finals(&svc, "rev26-ttl"), "echo"), ["unverified", "stale_catalog", "unverified"]);
    let cat: Vec<String> = catalog(&svc, "rev26-ttl").iter().map(|l| l["convergence"].as_str().unwrap().to_string()).collect();
    let (fresh, stale, again) =
        (cat.iter().position(|c| c == "converged"), cat.iter().position(|c| c == "stale"), cat.iter().rposition(|c| c == "converged"));
    assert!(fresh < stale && stale < again, "converged, stale by TTL, converged after the re-list: {cat:?}");
    assert_eq!(
        incidents(&svc, "rev26-ttl"),
        [
            ("opened".to_string(), "stale_catalog".to_string(), "echo".to_string()),
            ("resolved".into(), "stale_catalog".into(), "echo".into())
        ],
        "the stale-catalog incident resolves when the catalog converges"
    );

    // Item 3. A listen stream opted into tool-list changes bounds the catalog while it is open: a
    // change on it makes the catalog stale (a call then is `stale_catalog`), the re-list while
    // listening converges it (and resolves the incident), the close ends the bound.
    let vs = finals(&svc, "rev26-listen");
    assert_eq!(states(&vs, "echo"), ["unverified", "stale_catalog", "unverified", "unverified"], "{vs:#?}");
    let cat = catalog(&svc, "rev26-listen");
    let conv: Vec<&str> = cat.iter().filter_map(|l| l["convergence"].as_str()).collect();
    let converged = cat.iter().position(|l| l["convergence"] == "converged").unwrap_or_else(|| panic!("never converged: {conv:?}"));
    let names: Vec<&str> = cat[converged]["tool_digests"].as_array().unwrap().iter().filter_map(|t| t["name"].as_str()).collect();
    assert!(names.contains(&"extra"), "converged on the changed catalog: {names:?}");
    assert!(cat[converged]["signal_at_ns"].as_u64() < cat[converged]["traversal_start_ns"].as_u64());
    assert_eq!(conv.last(), Some(&"unverifiable"), "the bound ended with the stream: {conv:?}");
    assert!(conv[..converged].contains(&"stale"), "the change on the stream made it stale first: {conv:?}");
    assert_eq!(
        incidents(&svc, "rev26-listen"),
        [
            ("opened".to_string(), "stale_catalog".to_string(), "echo".to_string()),
            ("resolved".into(), "stale_catalog".into(), "echo".into())
        ]
    );

    // Item 4. A multi-round call (input_required, then the retry under a new id echoing
    // requestState) is one logical call: one final verdict, two rounds, no false_success. A slow
    // answer is reported `waiting` while it waits (an in-flight report, no attempt of its own).
    let vs = finals(&svc, "rev26-confirm");
    for tool in ["confirm", "confirm_slow"] {
        let v: Vec<&Value> = vs.iter().filter(|v| v["tool"] == tool).collect();
        assert_eq!(v.len(), 1, "{tool}: one verdict for the logical call: {vs:#?}");
        assert_eq!((v[0]["state"].as_str(), v[0]["rounds"].as_u64()), (Some("unverified"), Some(2)), "{tool}: {:#?}", v[0]);
    }
    let waiting: Vec<Value> =
        svc.verdicts().into_iter().filter(|v| v["agent"] == "rev26-confirm" && v["decided_by"] == "in_flight").collect();
    assert!(waiting.iter().any(|v| v["tool"] == "confirm_slow" && v["state"] == "waiting"), "{waiting:#?}");
    assert!(incidents(&svc, "rev26-confirm").is_empty());

    // Item 5. -32022 and -32021 (HTTP 400) are incompatible_session with the versions and the
    // missing capability; GET and DELETE answered 405 are no failure of any call.
    let vs = finals(&svc, "rev26-refused-version");
    let refused = |reason: &str| vs.iter().find(|v| v["reason"] == reason).unwrap_or_else(|| panic!("no {reason}: {vs:#?}")).clone();
    assert_eq!(refused("unsupported_protocol_version")["state"], "incompatible_session");
    assert_eq!(refused("unsupported_protocol_version")["first_failed_layer"], "protocol");
    assert_eq!(refused("missing_capability")["state"], "incompatible_session");
    assert_eq!(vs.iter().filter(|v| v["state"] == "unverified").count(), 1, "the control call; nothing for GET or DELETE: {vs:#?}");
    let steps = manifest["rev26-refused-version"].as_array().unwrap();
    assert!(steps.iter().filter(|s| s["status"] == 405).count() >= 2, "GET and DELETE were answered 405: {steps:?}");

    // Attempts: every logical call once. confirm and confirm_slow of the stdio server are two
    // attempts though they were four requests.
    // The counters are tallied per engine report (every second), so they may trail the verdict
    // log by that much: wait until both calls are counted, then check they are counted once.
    let attempts_of = |text: &str, tool: &str| {
        text.lines()
            .filter(|l| l.starts_with("mcp_health_calls_total{") && l.contains(&format!("=\"{tool}\"")) && l.contains("rev26-server"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    let text = eventually_async(Duration::from_secs(10), "both confirm calls counted in mcp_health_calls_total", || async {
        let t = svc.metrics_text().await;
        (attempts_of(&t, "confirm") > 0.0 && attempts_of(&t, "confirm_slow") > 0.0).then_some(t)
    })
    .await;
    assert_eq!((attempts_of(&text, "confirm"), attempts_of(&text, "confirm_slow")), (1.0, 1.0), "{text}");

    let all = svc.stdout();
    assert!(!all.contains("SECRET-REV26-ARGUMENT") && !all.contains("v1."), "no argument or requestState leaked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_through_the_tap() {
    let svc = Service::start(Cfg { decision_wait: "500ms", ..Cfg::default() }).await;
    let Some(manifest) = run_script("tests/tap/tasks_through_tap.py", &svc).await else { return };
    assert_eq!(manifest["build_ok"], "completed", "{manifest}");
    let tools = ["build_ok", "build_fails", "build_cancel", "build_silent", "build_expires", "build_tool_error"];
    // The final verdict of each call (the latest revision).
    let last = |tool: &str| finals(&svc, "tasks-stdio").into_iter().rfind(|v| v["tool"] == tool);
    wait_until("a verdict for every task", 40, || tools.iter().all(|t| last(t).is_some())).await;
    let v = |tool: &str| last(tool).unwrap();

    // A task answering `working` within its poll interval is reported working in flight.
    let in_flight: Vec<Value> =
        svc.verdicts().into_iter().filter(|v| v["agent"] == "tasks-stdio" && v["decided_by"] == "in_flight").collect();
    assert!(in_flight.iter().any(|v| v["tool"] == "build_ok" && v["state"] == "working"), "{in_flight:#?}");
    // completed: the task's result is the call's result.
    assert_eq!((v("build_ok")["state"].as_str(), v("build_ok")["task_status"].as_str()), (Some("unverified"), Some("completed")));
    assert_eq!(v("build_ok")["protocol_success"], true);
    // failed, cancelled, and a completed result that is isError: tool_failed.
    assert_eq!((v("build_fails")["state"].as_str(), v("build_fails")["reason"].as_str()), (Some("tool_failed"), Some("task_failed")));
    assert_eq!((v("build_cancel")["state"].as_str(), v("build_cancel")["reason"].as_str()), (Some("tool_failed"), Some("task_cancelled")));
    assert_eq!(v("build_tool_error")["state"], "tool_failed");
    // A silent task past its inactivity window (3 poll intervals without an answer).
    assert_eq!(
        (v("build_silent")["state"].as_str(), v("build_silent")["reason"].as_str(), v("build_silent")["decided_by"].as_str()),
        (Some("tool_failed"), Some("task_inactivity_exceeded"), Some("clock"))
    );
    // A task past its TTL with no terminal status, for a tool that may have a side effect.
    assert_eq!(v("build_expires")["state"], "effect_unknown", "{:#?}", v("build_expires"));
    assert_eq!(v("build_expires")["retry_safe"], false);
    // One attempt per call, polls are no attempts of their own.
    let text = svc.wait_metric("mcp_health_calls_total", Duration::from_secs(10), |n| n >= 6.0).await;
    assert_eq!(prom_sum(&text, "mcp_health_calls_total"), Some(6.0), "{text}");
    assert!(!svc.stdout().contains("task-"), "task ids are hashed");
}
