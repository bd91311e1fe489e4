//! The status page in a real browser.
//!
//! The README's five-minute walkthrough (the same fixture, sent by the same `mcp-health send`):
//! headless Chromium renders `/status` and must show the owner column, the spans of a chain, trace
//! links from `status.trace_url`, the call that resolved each resolved incident and a filter by
//! server, and the page must fit one 1400 × 900 screen. Its screenshot is the README's image
//! (`docs/status.png`, written when `MCP_HEALTH_UPDATE_SCREENSHOT=1`, else to a temporary
//! directory).
//!
//! Hostile input: the real binary gets the nine-states fixture, the planted-secrets fixture and a
//! call to a hostile server whose name and tool name are markup. What Chromium rendered must
//! explain the verdicts — incident rows by server and first failed layer, owner, required
//! authority, next action, the spans of an evidence chain, both rates — with the hostile names
//! escaped by the template and no planted secret anywhere. `/status.json` has the same model.
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
    assert!(
        dom.contains("<td class=\"side\">server</td><td>tap</td>") && dom.contains("<td class=\"side\">client</td><td>semconv</td>"),
        "spans by side and instrumentation"
    );
    assert!(dom.contains("credential owner"), "the owner of an authorization incident");
    assert!(dom.contains("authorization failed (insufficient_scope)"), "the layer that decided");
    assert!(dom.contains("Missing: "), "what was missing");
    assert!(dom.contains("Protocol success") && dom.contains("Verified success") && dom.contains(" %"), "both rates");
    assert!(dom.contains("engine_ingest"), "queue fills");
    assert!(dom.contains("Catalog state per session"));
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
}

/// Where the walkthrough page's trace links point (a Jaeger on loopback, as in the compose stack).
const TRACE_URL: &str = "http://127.0.0.1:16686/trace/{trace_id}";

/// The page's document size in a 1400 × 900 window: the page as served, with a script added that
/// writes `scrollWidth x scrollHeight` into the DOM, dumped by Chromium (the page itself has no
/// script; it has no external asset either, so a copy on disk renders the same).
fn scroll_size(html: &str) -> (u64, u64) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("status.html");
    let probe = "<script>document.body.setAttribute('data-scroll', document.documentElement.scrollWidth + 'x' + \
                 document.documentElement.scrollHeight)</script></body>";
    std::fs::write(&path, html.replacen("</body>", probe, 1)).unwrap();
    let dom = chromium(
        &["--dump-dom".into(), "--window-size=1400,900".into(), "--hide-scrollbars".into()],
        &format!("file://{}", path.display()),
    );
    let at = dom.find("data-scroll=\"").unwrap_or_else(|| panic!("the probe ran: {dom}")) + "data-scroll=\"".len();
    let size = &dom[at..at + dom[at..].find('"').unwrap()];
    let (w, h) = size.split_once('x').unwrap();
    (w.parse().unwrap(), h.parse().unwrap())
}

/// Step 2 and 3 of the README's walkthrough in a browser; the README's image.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_walkthrough_page_names_owners_shows_spans_links_traces_and_fits_one_screen() {
    if !have_chromium() {
        assert!(std::env::var_os("CI").is_none(), "chromium is missing in CI (scripts/install-test-deps installs it)");
        println!("SKIPPED: chromium is not installed (scripts/install-test-deps installs it)");
        return;
    }
    let cfg = Cfg { listener_extra: vec![("health_check", format!("status:\n  trace_url: {TRACE_URL}"))], ..Cfg::default() };
    let svc = Service::start(cfg).await;
    let lines = svc.walkthrough_send(Duration::from_secs(30)).await;
    let healthy = lines.iter().find(|l| l["state"] == "healthy").expect("the healthy call");
    let healthy_trace = healthy["trace_id"].as_str().unwrap().to_string();
    let link = |trace: &str| format!("href=\"{}\"", TRACE_URL.replace("{trace_id}", trace));
    let health = svc.health_addr();
    let status: Value = serde_json::from_slice(&http_get(health, "/status.json").await.unwrap().body).unwrap();

    let dom =
        tokio::task::spawn_blocking(move || chromium(&["--dump-dom".into()], &format!("http://{health}/status?refresh=0"))).await.unwrap();
    // The owner column: each open incident's owner, as the alert routes name it.
    let open = status["incidents"].as_array().unwrap();
    assert_eq!(open.len(), 2, "{status:#}");
    for (owner, words) in [("client-implementer", "client implementer"), ("server-oncall", "server on-call")] {
        assert!(open.iter().any(|i| i["owner"] == owner), "{owner} in {open:#?}");
        assert!(dom.contains(&format!("<td class=\"owner\" title=\"{owner}\">{words}</td>")), "the owner column names {words}");
    }
    // The spans of a chain: the misspelled tool's server span with its code in words and the
    // layer it decided.
    assert!(dom.contains("<tr class=\"span\">"), "span rows");
    assert!(dom.contains("<code>-32601</code> method not found"), "the JSON-RPC code and its meaning");
    assert!(dom.contains("<td class=\"span-layer\">protocol failed</td>"), "the layer a span decided");
    assert!(dom.contains("<td class=\"http\">503</td>"), "a span's HTTP status");
    assert!(dom.contains("Decided by <code class=\"clock\">quiet</code>"), "which clock decided");
    assert!(dom.contains("Missing: "), "what was missing");
    // Trace links on every trace id: the healthy call's among them.
    assert!(dom.contains(&link(&healthy_trace)), "a trace link to the healthy call");
    for v in lines.iter().filter(|l| l.get("trace_id").is_some() && l.get("state").is_some()) {
        assert!(dom.contains(&link(v["trace_id"].as_str().unwrap())), "a trace link for every call: {v}");
    }
    assert!(!dom.contains("<code class=\"trace\""), "no trace id without its link");
    // Resolved incidents name the call that resolved them.
    let resolved_rows = dom.matches("<tr class=\"resolved-incident\">").count();
    assert_eq!(resolved_rows, 5, "five resolved incidents");
    let by = dom.split("<td class=\"resolved-by nowrap\">").skip(1).map(|c| &c[..c.find("</td>").unwrap()]).collect::<Vec<_>>();
    assert_eq!(by.len(), 5);
    for cell in by {
        assert!(cell.starts_with("healthy tools/call <code>create_ticket</code>") && cell.contains(&link(&healthy_trace)), "{cell}");
    }
    // A filter by server: only that server's incidents and calls.
    let dom_filtered = tokio::task::spawn_blocking(move || {
        chromium(&["--dump-dom".into()], &format!("http://{health}/status?server=tickets.invalid%3A8443&refresh=0"))
    })
    .await
    .unwrap();
    assert_eq!(dom_filtered.matches("<tr class=\"incident\">").count(), 1, "one open incident on tickets.invalid");
    assert_eq!(dom_filtered.matches("<tr class=\"call\">").count(), 1, "one call to tickets.invalid");
    assert!(dom_filtered.contains("<option value=\"tickets.invalid:8443\" selected=\"\">"), "the form shows the filter");
    assert!(!dom_filtered.contains("http-equiv=\"refresh\""), "refresh=0 is kept");
    assert!(dom.contains("href=\"/status?server=tickets.invalid:8443&amp;refresh=0\""), "server names link to their filter");

    // One screen at 1400 × 900.
    let html = http_get(health, "/status").await.unwrap().text();
    assert!(html.contains("<meta http-equiv=\"refresh\""), "the page reloads itself by default");
    let (w, h) = tokio::task::spawn_blocking(move || scroll_size(&html)).await.unwrap();
    assert!(w <= 1400 && h <= 900, "the eight-call page is {w} × {h} px; it must fit 1400 × 900");

    // The screenshot: the README's image.
    let shot_dir = tempfile::tempdir().unwrap();
    let update = std::env::var("MCP_HEALTH_UPDATE_SCREENSHOT").is_ok_and(|v| v == "1");
    let shot: PathBuf =
        if update { Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/status.png") } else { shot_dir.path().join("status.png") };
    let args = vec![format!("--screenshot={}", shot.display()), "--window-size=1400,900".to_string(), "--hide-scrollbars".to_string()];
    // The URL the README's step 3 opens (a screenshot is taken before the first reload).
    let url = format!("http://{health}/status");
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
