//! The status page in a real browser: the real binary gets recorded calls (the nine-states
//! fixture, the planted-secrets fixture and a call to a hostile server whose name and tool name
//! are markup), then headless Chromium renders `/status`. What it rendered must explain the
//! verdicts — incident rows by server and first failed layer, required authority, next action,
//! an evidence chain, both rates — with the hostile names escaped and no planted secret anywhere.
//! `/status.json` has the same model. The screenshot goes to `docs/status.png` when
//! `MCP_HEALTH_UPDATE_SCREENSHOT=1`, else to a temporary directory.
//!
//! Chromium missing: SKIPPED outside CI, a failure in CI (`scripts/install-test-deps` installs it).

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use support::*;

const HOSTILE_SERVER: &str = "<script>alert('pwned')</script>";
const HOSTILE_TOOL: &str = "<img src=x onerror=alert(1)>";
const HOSTILE_AGENT: &str = "<svg onload=alert(3)>";
const PLANTED_TOKEN: &str = "PLANTED-TOKEN-5t4t";

fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64
}

const TIME_KEYS: [&str; 3] = ["startTimeUnixNano", "endTimeUnixNano", "timeUnixNano"];

fn walk_times(v: &mut Value, f: &mut impl FnMut(&mut Value)) {
    match v {
        Value::Object(m) => {
            let is_time_attr = m.get("key").and_then(Value::as_str).is_some_and(|k| k.ends_with("checked_at") || k.ends_with("signal_at"));
            for (k, x) in m.iter_mut() {
                if TIME_KEYS.contains(&k.as_str()) {
                    f(x);
                } else if is_time_attr && k == "value" {
                    if let Some(i) = x.get_mut("intValue") {
                        f(i);
                    }
                } else {
                    walk_times(x, f);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| walk_times(x, f)),
        _ => {}
    }
}

/// A fixture's requests with every timestamp moved so its latest is `end_ns`.
fn shifted(name: &str, end_ns: u64) -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    let mut docs: Vec<Value> =
        std::fs::read_to_string(path).unwrap().lines().filter(|l| !l.trim().is_empty()).map(|l| serde_json::from_str(l).unwrap()).collect();
    let as_ns = |v: &Value| v.as_str().and_then(|s| s.parse::<u64>().ok()).or_else(|| v.as_u64());
    let mut latest = 0u64;
    for d in &mut docs {
        walk_times(d, &mut |x| latest = latest.max(as_ns(x).unwrap_or(0)));
    }
    let delta = end_ns as i128 - latest as i128;
    for d in &mut docs {
        walk_times(d, &mut |x| {
            if let Some(t) = as_ns(x).filter(|t| *t > 0) {
                *x = Value::String(((t as i128 + delta).max(0) as u64).to_string());
            }
        });
    }
    docs.iter().map(|d| d.to_string()).collect()
}

fn s(k: &str, v: &str) -> Value {
    json!({"key": k, "value": {"stringValue": v}})
}

/// A refused call to a server whose name and tool name are markup: the client span (semconv) and
/// the tap's server span, with a token planted where an instrumentation might leak one.
fn hostile_call(end_ns: u64) -> String {
    let start = (end_ns - 20_000_000).to_string();
    let end = end_ns.to_string();
    let common = |side: &str| {
        vec![
            s("mcp.method.name", "tools/call"),
            s("gen_ai.tool.name", HOSTILE_TOOL),
            s("jsonrpc.request.id", "7"),
            s("mcp.session.id", &format!("session-{PLANTED_TOKEN}")),
            s("mcp.protocol.version", "2025-11-25"),
            s("server.address", HOSTILE_SERVER),
            s("http.request.header.authorization", &format!("Bearer {PLANTED_TOKEN}")),
            s("gen_ai.tool.call.arguments", &format!("{{\"secret\":\"{PLANTED_TOKEN}\"}}")),
            s("mcp_health.auth.required_scope", "files:write"),
            s("mcp_health.auth.error", "insufficient_scope"),
            json!({"key": "http.response.status_code", "value": {"intValue": "403"}}),
            s("x.side", side),
        ]
    };
    let span = |id: &str, parent: Option<&str>, kind: &str, side: &str| {
        let mut sp = json!({
            "traceId": "5a000000000000000000000000000077", "spanId": id, "name": "tools/call", "kind": kind,
            "startTimeUnixNano": start, "endTimeUnixNano": end, "attributes": common(side),
            "status": {"code": "STATUS_CODE_ERROR"}
        });
        if let Some(p) = parent {
            sp["parentSpanId"] = json!(p);
        }
        sp
    };
    json!({"resourceSpans": [
        {"resource": {"attributes": [s("service.name", HOSTILE_AGENT)]},
         "scopeSpans": [{"scope": {"name": "fixture"}, "spans": [span("0700000000000001", None, "SPAN_KIND_CLIENT", "client")]}]},
        {"resource": {"attributes": [s("service.name", "tap")]},
         "scopeSpans": [{"scope": {"name": "mcp-health-tap"}, "spans": [span("0700000000000002", Some("0700000000000001"), "SPAN_KIND_SERVER", "server")]}]}
    ]})
    .to_string()
}

/// Run headless Chromium with `args` on `url`; its stdout.
fn chromium(args: &[String], url: &str) -> String {
    let profile = tempfile::tempdir().unwrap();
    let out = std::process::Command::new("chromium")
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-dev-shm-usage"])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .arg(url)
        .output()
        .expect("run chromium");
    assert!(out.status.success(), "chromium failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What a browser's serialized DOM shows for `text` in an element.
fn escaped(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

fn have_chromium() -> bool {
    std::process::Command::new("chromium").arg("--version").output().is_ok_and(|o| o.status.success())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_explains_incidents_in_a_real_browser() {
    if !have_chromium() {
        assert!(std::env::var_os("CI").is_none(), "chromium is missing in CI (scripts/install-test-deps installs it)");
        println!("SKIPPED: chromium is not installed (scripts/install-test-deps installs it)");
        return;
    }
    let sink = Sink::start().await;
    let svc = Service::start(Cfg::with_sink(&sink)).await;
    let now = now_ns();
    // The nine states a little earlier, the planted secrets and the hostile call last, so the
    // healthy call of the fixture does not resolve their incidents.
    let mut lines = shifted("nine_states.jsonl", now - 5_000_000_000);
    lines.extend(shifted("planted_secrets.jsonl", now - 1_000_000_000));
    lines.push(hostile_call(now));
    for l in &lines {
        assert_eq!(svc.post_json(l.as_bytes()).await.status, 200);
    }
    let health = svc.health_addr();
    // The health check at `/` is what it was.
    let root = http_get(health, "/").await.unwrap();
    assert_eq!(root.status, 200);
    let root: Value = serde_json::from_slice(&root.body).unwrap();
    assert_eq!(root["status"], "Server available", "{root}");
    let status: Value = eventually_async(Duration::from_secs(20), "the hostile call's incident on /status.json", || async move {
        let r = http_get(health, "/status.json").await.ok().filter(|r| r.status == 200)?;
        let v: Value = serde_json::from_slice(&r.body).ok()?;
        let open = v["incidents"].as_array()?;
        let hostile = open.iter().any(|i| i["server"].as_str().is_some_and(|s| s.contains("script")));
        (hostile && open.len() >= 4).then_some(v)
    })
    .await;

    // /status.json: its shape.
    for key in ["incidents", "resolved_incidents", "servers", "catalogs", "drift", "queues", "recent_calls", "evicted"] {
        assert!(status[key].is_array(), "{key} in {status:#}");
    }
    let hostile =
        status["incidents"].as_array().unwrap().iter().find(|i| i["server"].as_str().is_some_and(|s| s.contains("script"))).unwrap();
    assert_eq!(hostile["first_failed_layer"], "authorization", "{hostile:#}");
    assert_eq!(hostile["state"], "needs_auth");
    assert_eq!(hostile["required_authority"], "files:write");
    assert!(hostile["next_action"].as_str().is_some_and(|a| !a.is_empty()));
    let chain = hostile["evidence"]["chain"].as_array().expect("the incident's evidence chain");
    let links: Vec<(&str, &str)> = chain.iter().map(|l| (l["kind"].as_str().unwrap(), l["instrumentation"].as_str().unwrap())).collect();
    assert!(links.contains(&("client", "semconv")) && links.contains(&("server", "tap")), "{links:?}");
    let servers = status["servers"].as_array().unwrap();
    assert!(servers
        .iter()
        .any(|s| s["attempts"].as_u64() > Some(0) && s["protocol_success_rate"].is_number() && s["verified_success_rate"].is_number()));
    let queues: Vec<&str> = status["queues"].as_array().unwrap().iter().filter_map(|q| q["name"].as_str()).collect();
    assert!(queues.contains(&"engine_ingest") && queues.contains(&"otlp") && queues.contains(&"otlp/passthrough"), "{queues:?}");
    assert!(status["queues"][0]["capacity"].as_u64() > Some(0));
    assert!(!status["catalogs"].as_array().unwrap().is_empty(), "the fixture's stale catalog");
    let json_text = status.to_string();

    // The page, as Chromium rendered it.
    let url = format!("http://{health}/status");
    let dom = tokio::task::spawn_blocking({
        let url = url.clone();
        move || chromium(&["--dump-dom".into()], &url)
    })
    .await
    .unwrap();
    assert!(dom.contains("Open incidents"), "{dom}");
    assert!(dom.contains("class=\"incident\""), "incident rows");
    assert!(dom.contains("needs_auth") && dom.contains("protocol_error"), "states");
    assert!(dom.contains("class=\"bad layer\">authorization<"), "the first failed layer");
    assert!(dom.contains("<code>files:write</code>"), "the required authority");
    assert!(dom.contains(hostile["next_action"].as_str().unwrap().split('`').next().unwrap()), "the next action");
    assert!(dom.contains("Evidence chain"), "an evidence chain");
    assert!(dom.contains("1 × server span (tap)") && dom.contains("1 × client span (semconv)"), "spans by kind and instrumentation");
    assert!(dom.contains("authorization failed (insufficient_scope)"), "the layer that decided");
    assert!(dom.contains("Missing: "), "what was missing");
    assert!(dom.contains("Protocol success") && dom.contains("Verified success") && dom.contains(" %"), "both rates");
    assert!(dom.contains("engine_ingest"), "queue fills");
    assert!(dom.contains("Catalog state per client/session"));
    // Escaped: the markup is text, never an element.
    // The server name reaches the page as markup (the address is cut at its first `/`); a tool
    // name outside the MCP name alphabet is replaced by its hash before anything sees it; the
    // client's service name is taken as it came.
    let server = hostile["server"].as_str().unwrap();
    assert!(server.starts_with("<script>"), "the server name reaches the page as markup: {server}");
    assert!(dom.contains(&escaped(server)), "the hostile server name, escaped: {server}");
    let agents: Vec<&str> = hostile["agents"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(agents.iter().any(|a| a.contains('<')), "{agents:?}");
    for a in agents {
        assert!(dom.contains(&escaped(a)), "the hostile agent name, escaped: {a}");
    }
    assert!(
        !dom.to_ascii_lowercase().contains("<script") && !dom.contains("<img") && !dom.contains("<svg"),
        "no element from a server's name"
    );
    // No secret: no planted value, no raw session id.
    for text in [&dom, &json_text] {
        for planted in [
            PLANTED_TOKEN,
            "PLANTED-TOKEN-77aa",
            "PLANTED-ARGUMENT-6f1d",
            "PLANTED-KEY-93ab",
            "PLANTED-RESULT-c2e8",
            "PLANTED-BODY-0b4c",
            "PLANTED-DESC-11ff",
            "sess-fixture-1",
        ] {
            assert!(!text.contains(planted), "{planted} leaked into the status page");
        }
    }

    // The screenshot.
    let shot_dir = tempfile::tempdir().unwrap();
    let update = std::env::var("MCP_HEALTH_UPDATE_SCREENSHOT").is_ok_and(|v| v == "1");
    let shot: PathBuf =
        if update { Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/status.png") } else { shot_dir.path().join("status.png") };
    let args = vec![format!("--screenshot={}", shot.display()), "--window-size=1280,1600".to_string(), "--hide-scrollbars".to_string()];
    tokio::task::spawn_blocking(move || chromium(&args, &url)).await.unwrap();
    let png = std::fs::read(&shot).expect("the screenshot");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000, "a real PNG ({} bytes)", png.len());
    if update {
        println!("wrote {}", shot.display());
    }
}

/// `status_page: false`: no page, the health check as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_can_be_switched_off() {
    let svc = Service::start(Cfg { listener_extra: vec![("health_check", "status_page: false".into())], ..Cfg::default() }).await;
    let health = svc.health_addr();
    assert_eq!(http_get(health, "/").await.unwrap().status, 200);
    assert_eq!(http_get(health, "/status").await.unwrap().status, 404);
    assert_eq!(http_get(health, "/status.json").await.unwrap().status, 404);
}
