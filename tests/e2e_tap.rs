//! The evidence tap end to end: the built binary in stdio mode around a fake MCP server
//! (tests/tap/fake_mcp_server.py, standard-library Python) and in HTTP mode in front of the same
//! server's streamable-HTTP endpoint. Checks that the client sees exactly the bytes a direct run
//! gives, that the expected spans reach an OTLP sink with no planted secret in them, and that the
//! real mcp-health, fed by the tap, decides the expected verdicts.
//!
//! Needs `python3` (the tests say so and pass trivially when it is missing).

#[path = "tap/driver.rs"]
mod driver;
mod support;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use driver::{drive_stdio, req, Step, Wait};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::common::v1::any_value;
use serde_json::{json, Value};
use support::*;

const TRACEPARENT: &str = "00-5a1f0e2d3c4b5a69788796a5b4c3d2e1-1122334455667788-01";
const SECRETS: [&str; 8] = [
    "SECRET-ARGUMENT-e2e",
    "SECRET-TOOL-FAILURE-TEXT",
    "SECRET-PROGRESS-TEXT",
    "SECRET-CLIENT-NAME",
    "SECRET-CHALLENGE-TEXT",
    "full-token",
    "read-token",
    "bad-token",
];

fn fake_server() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/tap/fake_mcp_server.py")
}

fn tap_bin() -> &'static str {
    env!("CARGO_BIN_EXE_mcp-health")
}

// ------------------------------------------------------------------------------------------------
// stdio
// ------------------------------------------------------------------------------------------------

fn the_script() -> Vec<Step> {
    vec![
        req(
            0,
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "SECRET-CLIENT-NAME", "version": "1"}}),
        ),
        Step { line: json!({"jsonrpc": "2.0", "method": "notifications/initialized"}), wait_for: Wait::Nothing },
        req(1, "tools/list", json!({})),
        req(2, "tools/list", json!({"cursor": "page-1"})),
        req(3, "tools/call", json!({"name": "echo", "arguments": {"text": "SECRET-ARGUMENT-e2e"}, "_meta": {"traceparent": TRACEPARENT}})),
        req(4, "tools/call", json!({"name": "fail", "arguments": {}})),
        req(5, "tools/call", json!({"name": "nope", "arguments": {"x": "SECRET-ARGUMENT-e2e"}})),
        req(6, "tools/call", json!({"name": "slow", "arguments": {}, "_meta": {"progressToken": "prog-6"}})),
        req(7, "tools/call", json!({"name": "change_catalog", "arguments": {}})),
        req(8, "tools/list", json!({})),
        req(9, "tools/list", json!({"cursor": "page-1"})),
    ]
}

fn direct_cmd(py: &str) -> Command {
    let mut c = Command::new(py);
    c.arg(fake_server()).arg("--exit-code").arg("3");
    c
}

fn tap_cmd(py: &str, endpoint: &str) -> Command {
    tap_cmd_with(py, endpoint, &[])
}

/// [`tap_cmd`] with more tap flags (before the `--`).
fn tap_cmd_with(py: &str, endpoint: &str, flags: &[&str]) -> Command {
    let mut c = Command::new(tap_bin());
    c.args(["tap", "--otlp-endpoint", endpoint, "--server-address", "fake-mcp"])
        .args(flags)
        .arg("--")
        .arg(py)
        .arg(fake_server())
        .arg("--exit-code")
        .arg("3");
    c.env_remove("OTEL_SERVICE_NAME").env_remove("OTEL_EXPORTER_OTLP_ENDPOINT").env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    c
}

fn str_attr<'a>(s: &'a ReceivedSpan, k: &str) -> Option<&'a str> {
    s.attr_str(k)
}
fn int_attr(s: &ReceivedSpan, k: &str) -> Option<i64> {
    match s.attr(k) {
        Some(any_value::Value::IntValue(i)) => Some(*i),
        _ => None,
    }
}
fn bool_attr(s: &ReceivedSpan, k: &str) -> Option<bool> {
    match s.attr(k) {
        Some(any_value::Value::BoolValue(b)) => Some(*b),
        _ => None,
    }
}
fn call_spans<'a>(spans: &'a [ReceivedSpan], tool: &str) -> Vec<&'a ReceivedSpan> {
    spans.iter().filter(|s| str_attr(s, "gen_ai.tool.name") == Some(tool) && str_attr(s, "mcp_health.call.phase").is_none()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_forwards_bytes_unchanged_and_emits_the_evidence() {
    let Some(py) = python() else {
        eprintln!("python3 not found: skipping the stdio tap test");
        return;
    };
    let sink = Sink::start().await;
    let endpoint = sink.endpoint();
    let (direct, tapped) = tokio::task::spawn_blocking(move || {
        let direct = drive_stdio(direct_cmd(py), &the_script());
        let tapped = drive_stdio(tap_cmd(py, &endpoint), &the_script());
        (direct, tapped)
    })
    .await
    .unwrap();

    // Transparent: the client sees the same bytes, the same exit code, the server's stderr.
    assert!(!direct.stdout.is_empty());
    assert_eq!(
        String::from_utf8_lossy(&tapped.stdout),
        String::from_utf8_lossy(&direct.stdout),
        "the client sees exactly the direct run's bytes"
    );
    assert_eq!(tapped.stdout, direct.stdout);
    assert_eq!(direct.code, Some(3));
    assert_eq!(tapped.code, Some(3), "the tap exits with the server's code; stderr: {}", tapped.stderr);
    assert!(tapped.stderr.contains("fake-mcp-server: ready on stdio"), "stderr passes through: {}", tapped.stderr);

    // The tap flushed before exiting: everything is in the sink.
    let spans = sink
        .wait_for(Duration::from_secs(10), "the tap's spans", |s| {
            Some(s.spans()).filter(|v| v.iter().filter(|x| x.attr("mcp_health.catalog.installed_digest").is_some()).count() >= 2)
        })
        .await;
    for s in &spans {
        assert_eq!(
            s.resource.as_ref().and_then(|r| attr(&r.attributes, "service.name")),
            Some(&any_value::Value::StringValue("mcp-health-tap".into()))
        );
        assert_eq!(str_attr(s, "server.address"), Some("fake-mcp"));
        assert_eq!(str_attr(s, "network.transport"), Some("pipe"));
        assert!(str_attr(s, "mcp.session.id").is_none(), "stdio has no session id");
    }
    let init = spans.iter().find(|s| s.span.name == "initialize").expect("initialize span");
    assert_eq!(str_attr(init, "mcp_health.session.requested_version"), Some("2025-11-25"));
    assert_eq!(str_attr(init, "mcp.protocol.version"), Some("2025-11-25"));
    assert_eq!(bool_attr(init, "mcp_health.session.list_changed_capability"), Some(true));

    let lists: Vec<&ReceivedSpan> = spans.iter().filter(|s| s.span.name == "tools/list").collect();
    assert_eq!(lists.len(), 4);
    assert_eq!(
        lists.iter().map(|s| str_attr(s, "mcp_health.catalog.cursor")).collect::<Vec<_>>(),
        vec![None, Some(&*mcp_health::normalize::redact::cursor("page-1")), None, Some(&*mcp_health::normalize::redact::cursor("page-1"))]
    );
    assert_eq!(
        lists.iter().map(|s| bool_attr(s, "mcp_health.catalog.next_cursor_present")).collect::<Vec<_>>(),
        vec![Some(true), Some(false), Some(true), Some(false)]
    );
    let installed: Vec<&str> = spans.iter().filter_map(|s| str_attr(s, "mcp_health.catalog.installed_digest")).collect();
    assert_eq!(installed.len(), 2);
    assert_ne!(installed[0], installed[1], "the registry changed between the two traversals");

    let echo = call_spans(&spans, "echo");
    assert_eq!(echo.len(), 1, "{echo:#?}\nnames: {:?}", spans.iter().map(|s| &s.span.name).collect::<Vec<_>>());
    assert_eq!(hex(&echo[0].span.trace_id), "5a1f0e2d3c4b5a69788796a5b4c3d2e1", "traceparent joins the agent's trace");
    assert_eq!(hex(&echo[0].span.parent_span_id), "1122334455667788");
    assert_eq!(str_attr(echo[0], "gen_ai.operation.name"), Some("execute_tool"));
    assert!(spans
        .iter()
        .any(|s| str_attr(s, "mcp_health.call.phase") == Some("request_sent") && str_attr(s, "gen_ai.tool.name") == Some("echo")));
    assert_eq!(str_attr(call_spans(&spans, "fail")[0], "error.type"), Some("tool_error"));
    let nope = call_spans(&spans, "nope")[0];
    assert_eq!(str_attr(nope, "error.type"), Some("-32602"));
    assert_eq!(str_attr(nope, "rpc.response.status_code"), Some("-32602"));
    let slow = call_spans(&spans, "slow")[0];
    assert_eq!(str_attr(slow, "mcp_health.progress.token"), Some("prog-6"));
    let progress: Vec<&ReceivedSpan> = spans.iter().filter(|s| s.span.name == "notifications/progress").collect();
    assert_eq!(progress.len(), 3);
    assert!(progress.iter().all(|p| p.span.trace_id == slow.span.trace_id && p.span.parent_span_id == slow.span.span_id));
    assert!(spans.iter().any(|s| s.span.name == "notifications/tools/list_changed"));

    let dump = sink.dump();
    for secret in SECRETS {
        assert!(!dump.contains(secret), "{secret} reached the sink");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_with_the_collector_down_still_forwards_and_says_so_once() {
    let Some(py) = python() else {
        eprintln!("python3 not found: skipping");
        return;
    };
    let dead = dead_port();
    let endpoint = format!("http://127.0.0.1:{}", dead.port);
    let (direct, tapped) = tokio::task::spawn_blocking(move || {
        (drive_stdio(direct_cmd(py), &the_script()), drive_stdio(tap_cmd(py, &endpoint), &the_script()))
    })
    .await
    .unwrap();
    assert_eq!(tapped.stdout, direct.stdout, "nothing changes for the client");
    assert_eq!(tapped.code, Some(3));
    assert_eq!(tapped.stderr.matches("spans are dropped").count(), 1, "one warning within the minute: {}", tapped.stderr);
    assert!(tapped.stderr.contains("spans could not be exported"), "{}", tapped.stderr);
}

#[test]
fn stdio_forwards_sigterm_and_exits_with_the_servers_status() {
    let Some(py) = python() else {
        eprintln!("python3 not found: skipping");
        return;
    };
    let dead = dead_port();
    let mut child = tap_cmd(py, &format!("http://127.0.0.1:{}", dead.port))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    use std::io::Write;
    writeln!(stdin, "{}", json!({"jsonrpc":"2.0","id":1,"method":"ping"})).unwrap();
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(line.contains("\"id\":1"), "{line}");
    // SIGTERM to the tap reaches the server (whose default action is to die of it): the tap exits
    // as the server did, 128 + 15, although its stdin is still open.
    let st = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status().unwrap();
    assert!(st.success());
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "the tap did not exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(128 + 15));
    drop(stdin);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_tap_feeds_mcp_health_verdicts_and_catalog_convergence() {
    let Some(py) = python() else {
        eprintln!("python3 not found: skipping");
        return;
    };
    // The echo call joins an agent trace whose root span never comes: decide it at max_wait.
    let svc = Service::start(Cfg { max_wait: "3s", ..Cfg::default() }).await;
    let endpoint = format!("http://{}", svc.grpc_addr());
    let run = tokio::task::spawn_blocking(move || drive_stdio(tap_cmd(py, &endpoint), &the_script())).await.unwrap();
    assert_eq!(run.code, Some(3), "{}", run.stderr);

    let by_tool = |vs: &[Value], tool: &str| {
        vs.iter().rfind(|v| v["tool"] == tool && v["method"] == "tools/call" && v["decided_by"] != "in_flight").cloned()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let verdicts = loop {
        let vs = svc.verdicts();
        if ["echo", "fail", "nope", "slow", "change_catalog"].iter().all(|t| by_tool(&vs, t).is_some()) {
            break vs;
        }
        assert!(Instant::now() < deadline, "verdicts of the five calls; have {:#?}\ntap stderr: {}", vs, run.stderr);
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let echo = by_tool(&verdicts, "echo").unwrap();
    assert_eq!(echo["state"], "unverified", "a successful call nobody verified: {echo}");
    assert_eq!(echo["protocol_success"], true);
    assert_eq!(echo["trace_id"], "5a1f0e2d3c4b5a69788796a5b4c3d2e1");
    let fail = by_tool(&verdicts, "fail").unwrap();
    assert_eq!(fail["state"], "tool_failed", "{fail}");
    assert_eq!(fail["first_failed_layer"], "execution");
    let nope = by_tool(&verdicts, "nope").unwrap();
    assert_eq!(nope["state"], "protocol_error", "{nope}");
    assert_eq!(nope["reason"], "jsonrpc_-32602");
    let slow = by_tool(&verdicts, "slow").unwrap();
    assert_eq!(slow["state"], "unverified", "valid progress, then a result: {slow}");

    // The catalog: converged after the list change and the re-list, on the new tool set.
    let last = eventually(Duration::from_secs(20), "a converged catalog with the changed tool set", || {
        let lines: Vec<Value> = svc.json_lines().into_iter().filter(|l| l["catalog"] == true).collect();
        let last = lines.last()?.clone();
        let names: Vec<&str> = last["tool_digests"].as_array()?.iter().filter_map(|t| t["name"].as_str()).collect();
        (last["convergence"] == "converged" && names.contains(&"search")).then_some(last)
    })
    .await;
    let v = &last;
    let names: Vec<&str> = v["tool_digests"].as_array().unwrap().iter().filter_map(|t| t["name"].as_str()).collect();
    assert!(!names.contains(&"add"), "the removed tool is gone: {names:?}");
    assert_eq!(names.len(), 6);
    let signal = v["signal_at_ns"].as_u64().expect("the list-changed signal was seen");
    assert!(v["traversal_start_ns"].as_u64().unwrap() > signal, "the re-list started after the signal: {v}");
    assert_eq!(v["installed_digest"], v["discovered_digest"]);
    // The tap keeps cursors as hashes (and mcp-health keeps a hash as it is).
    assert_eq!(v["cursor_chain"], json!(["", &*mcp_health::normalize::redact::cursor("page-1")]));
    assert_eq!(last["server"], "fake-mcp");
}

// ------------------------------------------------------------------------------------------------
// streamable HTTP
// ------------------------------------------------------------------------------------------------

struct Proc {
    child: Child,
    _dir: tempfile::TempDir,
    err_path: PathBuf,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The fake server in HTTP mode on a free port.
fn start_fake_http(py: &str) -> (Proc, SocketAddr) {
    let dir = tempfile::tempdir().unwrap();
    let err_path = dir.path().join("stderr");
    let mut child = Command::new(py)
        .arg(fake_server())
        .arg("--http")
        .arg("0")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .expect("spawn the fake server");
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    let port: u16 = line.trim().strip_prefix("PORT ").and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("fake server said {line:?}"));
    (Proc { child, _dir: dir, err_path }, SocketAddr::from(([127, 0, 0, 1], port)))
}

/// The tap in HTTP mode on a free port in front of `upstream`.
async fn start_tap_http(upstream: &str, endpoint: &str) -> (Proc, SocketAddr) {
    let dir = tempfile::tempdir().unwrap();
    let err_path = dir.path().join("stderr");
    let child = Command::new(tap_bin())
        .args(["tap", "--listen", "127.0.0.1:0", "--upstream", upstream, "--otlp-endpoint", endpoint, "--connect-timeout", "2s"])
        .env_remove("OTEL_SERVICE_NAME")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .expect("spawn the tap");
    let p = Proc { child, _dir: dir, err_path };
    let addr = eventually(Duration::from_secs(10), "the tap's listening line", || {
        let err = std::fs::read_to_string(&p.err_path).unwrap_or_default();
        let at = err.find("listening on http://")?;
        let rest = &err[at + "listening on http://".len()..];
        // Up to its comma: a half-written line ("127.0.0.1:43" of "…:43211,") parses too.
        rest.split_once(',')?.0.trim().parse::<SocketAddr>().ok()
    })
    .await;
    (p, addr)
}

struct Exchange {
    method: &'static str,
    path: &'static str,
    headers: Vec<(&'static str, String)>,
    body: Value,
}

fn post(token: Option<&str>, session: Option<&str>, body: Value) -> Exchange {
    let mut headers = vec![("Content-Type", "application/json".to_string()), ("Accept", "application/json, text/event-stream".to_string())];
    if let Some(t) = token {
        headers.push(("Authorization", format!("Bearer {t}")));
    }
    if let Some(s) = session {
        headers.push(("Mcp-Session-Id", s.to_string()));
        headers.push(("MCP-Protocol-Version", "2025-11-25".to_string()));
    }
    Exchange { method: "POST", path: "/mcp", headers, body }
}

fn call(id: i64, tool: &str, extra: Value) -> Value {
    let mut params = json!({"name": tool, "arguments": {"text": "SECRET-ARGUMENT-e2e"}});
    if let Value::Object(m) = extra {
        for (k, v) in m {
            params[k] = v;
        }
    }
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
}

async fn send(addr: SocketAddr, e: &Exchange) -> HttpResponse {
    let headers: Vec<(&str, &str)> = e.headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let body = if e.body.is_null() { Vec::new() } else { e.body.to_string().into_bytes() };
    http_request(addr, e.method, e.path, &headers, &body).await.expect("HTTP exchange")
}

/// The session an `initialize` gets from the fake server (deterministic).
async fn initialize(addr: SocketAddr, token: &str) -> (HttpResponse, String) {
    let r = send(addr, &post(Some(token), None, json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"SECRET-CLIENT-NAME","version":"1"}}}))).await;
    let sid = r.header("mcp-session-id").expect("a session id").to_string();
    (r, sid)
}

fn http_script(sid: &str) -> Vec<Exchange> {
    vec![
        post(Some("full-token"), Some(sid), json!({"jsonrpc":"2.0","method":"notifications/initialized"})),
        post(Some("full-token"), Some(sid), json!({"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}})),
        post(Some("full-token"), Some(sid), json!({"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"cursor":"page-1"}})),
        post(Some("full-token"), Some(sid), call(3, "echo", json!({"_meta": {"traceparent": TRACEPARENT}}))),
        post(Some("full-token"), Some(sid), call(4, "fail", json!({}))),
        post(Some("full-token"), Some(sid), call(5, "slow", json!({"_meta": {"progressToken": "prog-http"}}))),
        post(Some("read-token"), Some(sid), call(6, "write_file", json!({}))),
        post(Some("bad-token"), Some(sid), call(7, "echo", json!({}))),
        post(None, None, json!({"jsonrpc":"2.0","id":8,"method":"initialize","params":{"protocolVersion":"2025-11-25"}})),
        Exchange {
            method: "GET",
            path: "/mcp",
            headers: vec![("Authorization", "Bearer full-token".into()), ("Mcp-Session-Id", sid.into())],
            body: Value::Null,
        },
    ]
}

fn assert_same_response(what: &str, direct: &HttpResponse, tapped: &HttpResponse) {
    assert_eq!(tapped.status, direct.status, "{what}: status");
    assert_eq!(tapped.text(), direct.text(), "{what}: body");
    assert_eq!(tapped.body, direct.body, "{what}: body bytes");
    for h in ["content-type", "mcp-session-id", "www-authenticate", "cache-control", "allow"] {
        assert_eq!(tapped.header(h), direct.header(h), "{what}: header {h}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_forwards_exchanges_unchanged_and_emits_the_evidence() {
    let Some(py) = python() else {
        eprintln!("python3 not found: skipping");
        return;
    };
    let sink = Sink::start().await;
    let (_server, up) = start_fake_http(py);
    let (_tap, tap) = start_tap_http(&format!("http://{up}"), &sink.endpoint()).await;

    let (d_init, sid) = initialize(up, "full-token").await;
    let (t_init, t_sid) = initialize(tap, "full-token").await;
    assert_same_response("initialize", &d_init, &t_init);
    assert_eq!(sid, t_sid);
    for (i, e) in http_script(&sid).iter().enumerate() {
        let d = send(up, e).await;
        let t = send(tap, e).await;
        assert_same_response(&format!("exchange {i} ({} {})", e.method, e.body), &d, &t);
    }
    let slow = send(tap, &post(Some("full-token"), Some(&sid), call(55, "slow", json!({"_meta": {"progressToken": 9}})))).await;
    assert_eq!(slow.header("content-type"), Some("text/event-stream"));
    assert_eq!(slow.text().matches("notifications/progress").count(), 3, "the SSE stream comes through whole");

    let spans = sink
        .wait_for(Duration::from_secs(15), "the HTTP tap's spans", |s| {
            let v = s.spans();
            let calls = v.iter().filter(|x| x.span.name.starts_with("tools/call") && x.attr("mcp_health.call.phase").is_none()).count();
            let progress = v.iter().filter(|x| x.span.name == "notifications/progress").count();
            (calls >= 6 && progress >= 6 && v.iter().filter(|x| x.span.name == "initialize").count() >= 2).then_some(v)
        })
        .await;
    for s in &spans {
        assert_eq!(str_attr(s, "server.address"), Some("127.0.0.1"));
        assert_eq!(int_attr(s, "server.port"), Some(i64::from(up.port())));
        assert_eq!(str_attr(s, "network.transport"), Some("tcp"));
    }
    let inits: Vec<&ReceivedSpan> = spans.iter().filter(|s| s.span.name == "initialize").collect();
    let ok_init = inits.iter().find(|s| int_attr(s, "http.response.status_code") == Some(200)).expect("the initialize that succeeded");
    // Hashed as the service hashes it (issue 22): a server-assigned id may be a credential.
    let hashed = mcp_health::evidence::hash::session_hash(&sid);
    assert_eq!(str_attr(ok_init, "mcp.session.id"), Some(&*hashed), "the session id the server assigned, hashed");
    assert!(!format!("{spans:?}").contains(sid.as_str()), "the raw session id left the tap");
    assert_eq!(bool_attr(ok_init, "mcp_health.session.list_changed_capability"), Some(true));
    let refused_init =
        inits.iter().find(|s| int_attr(s, "http.response.status_code") == Some(401)).expect("the initialize without a token");
    assert_eq!(str_attr(refused_init, "mcp_health.auth.error"), Some("missing_token"));
    assert_eq!(int_attr(refused_init, "mcp_health.auth.status"), Some(401));

    let echo: Vec<&ReceivedSpan> = call_spans(&spans, "echo");
    let echo_ok = echo.iter().find(|s| int_attr(s, "http.response.status_code") == Some(200)).unwrap();
    assert_eq!(str_attr(echo_ok, "mcp.session.id"), Some(&*hashed));
    assert_eq!(str_attr(echo_ok, "mcp.protocol.version"), Some("2025-11-25"));
    assert_eq!(hex(&echo_ok.span.trace_id), "5a1f0e2d3c4b5a69788796a5b4c3d2e1");
    let echo_401 = echo.iter().find(|s| int_attr(s, "http.response.status_code") == Some(401)).unwrap();
    assert_eq!(str_attr(echo_401, "mcp_health.auth.error"), Some("invalid_token"));
    let w = call_spans(&spans, "write_file")[0];
    assert_eq!(int_attr(w, "http.response.status_code"), Some(403));
    assert_eq!(int_attr(w, "mcp_health.auth.status"), Some(403));
    assert_eq!(str_attr(w, "mcp_health.auth.error"), Some("insufficient_scope"));
    assert_eq!(str_attr(w, "mcp_health.auth.required_scope"), Some("files:write"));
    assert_eq!(str_attr(call_spans(&spans, "fail")[0], "error.type"), Some("tool_error"));
    let slow_str = call_spans(&spans, "slow").into_iter().find(|s| str_attr(s, "mcp_health.progress.token") == Some("prog-http")).unwrap();
    let p: Vec<&ReceivedSpan> =
        spans.iter().filter(|s| s.span.name == "notifications/progress" && s.span.trace_id == slow_str.span.trace_id).collect();
    assert_eq!(p.len(), 3, "progress from the POST's SSE stream joins its call");
    assert_eq!(str_attr(p[0], "mcp.session.id"), Some(&*hashed));
    let slow_int = call_spans(&spans, "slow").into_iter().find(|s| int_attr(s, "mcp_health.progress.token") == Some(9)).unwrap();
    assert_eq!(spans.iter().filter(|s| s.span.name == "notifications/progress" && s.span.trace_id == slow_int.span.trace_id).count(), 3);
    let lists: Vec<&ReceivedSpan> = spans.iter().filter(|s| s.span.name == "tools/list").collect();
    assert_eq!(lists.len(), 2);
    assert!(spans
        .iter()
        .any(|s| s.attr("mcp_health.catalog.installed_digest").is_some() && str_attr(s, "mcp.session.id") == Some(&*hashed)));

    let dump = sink.dump();
    for secret in SECRETS {
        assert!(!dump.contains(secret), "{secret} reached the sink");
    }
    assert!(!dump.contains("Bearer"), "no Authorization or challenge header text");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_upstream_refused_is_502_and_a_transport_span() {
    let sink = Sink::start().await;
    let dead = dead_port();
    let (_tap, tap) = start_tap_http(&format!("http://127.0.0.1:{}", dead.port), &sink.endpoint()).await;
    let r = send(tap, &post(Some("full-token"), Some("sess-x"), call(1, "echo", json!({})))).await;
    assert_eq!(r.status, 502);
    let spans = sink
        .wait_for(Duration::from_secs(10), "the transport failure span", |s| {
            Some(s.spans()).filter(|v| v.iter().any(|x| x.attr("mcp_health.transport.outcome").is_some()))
        })
        .await;
    let s = spans.iter().find(|x| x.attr("mcp_health.transport.outcome").is_some()).unwrap();
    assert_eq!(str_attr(s, "mcp_health.transport.outcome"), Some("connection_refused"));
    assert_eq!(bool_attr(s, "mcp_health.request.sent"), Some(false));
    assert_eq!(str_attr(s, "gen_ai.tool.name"), Some("echo"));
    assert_eq!(str_attr(s, "mcp.session.id"), Some(&*mcp_health::evidence::hash::session_hash("sess-x")));
}

/// HTTP mode ends on the signals that drain `serve` (SIGQUIT and SIGUSR1 as well as SIGTERM and
/// SIGINT): the tap stops listening, flushes the spans of what it forwarded and exits 0 rather
/// than being killed by the signal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_tap_drains_on_the_services_signals() {
    let Some(py) = python() else {
        eprintln!("SKIPPED: python3 not found");
        return;
    };
    for sig in ["QUIT", "USR1", "TERM"] {
        let sink = Sink::start().await;
        let (_server, up) = start_fake_http(py);
        let (mut tap, addr) = start_tap_http(&format!("http://{up}"), &sink.endpoint()).await;
        let (init, _) = initialize(addr, "full-token").await;
        assert_eq!(init.status, 200, "initialize through the tap");
        let killed = Command::new("kill").arg(format!("-{sig}")).arg(tap.child.id().to_string()).status().unwrap();
        assert!(killed.success());
        let status = eventually(Duration::from_secs(30), "the tap's exit", || tap.child.try_wait().ok().flatten()).await;
        let stderr = std::fs::read_to_string(&tap.err_path).unwrap_or_default();
        assert_eq!(status.code(), Some(0), "SIG{sig}: the tap drains and exits 0, not killed ({status:?}); stderr: {stderr}");
        sink.wait_for(Duration::from_secs(15), "the initialize span, flushed at exit", |s| {
            s.spans().iter().any(|x| x.span.name == "initialize").then_some(())
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_tap_feeds_mcp_health_auth_and_execution_verdicts() {
    let Some(py) = python() else {
        eprintln!("python3 not found: skipping");
        return;
    };
    let svc = Service::start(Cfg::default()).await;
    let endpoint = format!("http://{}", svc.grpc_addr());
    let (_server, up) = start_fake_http(py);
    let (_tap, tap) = start_tap_http(&format!("http://{up}"), &endpoint).await;
    let dead = dead_port();
    let (_tap2, tap2) = start_tap_http(&format!("http://127.0.0.1:{}", dead.port), &endpoint).await;

    let (_, sid) = initialize(tap, "full-token").await;
    for e in [
        post(Some("full-token"), Some(&sid), call(1, "echo", json!({}))),
        post(Some("full-token"), Some(&sid), call(2, "fail", json!({}))),
        post(Some("read-token"), Some(&sid), call(3, "write_file", json!({}))),
        post(Some("bad-token"), Some(&sid), call(4, "add", json!({}))),
    ] {
        send(tap, &e).await;
    }
    send(tap2, &post(Some("full-token"), Some(&sid), call(5, "slow", json!({})))).await;

    let by_tool = |vs: &[Value], tool: &str| vs.iter().rfind(|v| v["tool"] == tool && v["decided_by"] != "in_flight").cloned();
    let vs = eventually(Duration::from_secs(20), "five call verdicts", || {
        let vs = svc.verdicts();
        ["echo", "fail", "write_file", "add", "slow"].iter().all(|t| by_tool(&vs, t).is_some()).then_some(vs)
    })
    .await;
    let echo = by_tool(&vs, "echo").unwrap();
    assert_eq!(echo["state"], "unverified", "{echo}");
    assert_eq!(echo["protocol_success"], true);
    let fail = by_tool(&vs, "fail").unwrap();
    assert_eq!(fail["state"], "tool_failed", "{fail}");
    let w = by_tool(&vs, "write_file").unwrap();
    assert_eq!(w["state"], "needs_auth", "{w}");
    assert_eq!(w["first_failed_layer"], "authorization");
    assert_eq!(w["required_scope"], "files:write");
    assert_eq!(w["reason"], "insufficient_scope");
    let add = by_tool(&vs, "add").unwrap();
    assert_eq!(add["state"], "needs_auth", "{add}");
    assert_eq!(add["reason"], "invalid_token");
    let slow = by_tool(&vs, "slow").unwrap();
    assert_eq!(slow["state"], "transport_failed", "{slow}");
    assert_eq!(slow["reason"], "connection_refused");
    let out = svc.stdout();
    for secret in SECRETS {
        assert!(!out.contains(secret), "{secret} in a verdict line");
    }
}

/// Issue 9 in stdio mode: the tap's verifiers check calls from a stdio server too. A `command`
/// rule that passes makes `echo` healthy (`test_result`); one that fails makes `slow` a false
/// success; the other calls are not checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_tap_runs_verifiers_after_the_responses() {
    let Some(py) = python() else {
        eprintln!("python3 not found: skipping");
        return;
    };
    let svc = Service::start(Cfg { max_wait: "3s", ..Cfg::default() }).await;
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("verifiers.yaml");
    std::fs::write(
        &rules,
        "- {name: echo_said_something, tool: echo, command: {argv: [test, -n, \"{/arguments/text}\"]}}\n- {name: slow_never_delivers, tool: slow, command: {argv: [\"false\"]}}\n",
    )
    .unwrap();
    let endpoint = format!("http://{}", svc.grpc_addr());
    let rules_arg = rules.display().to_string();
    let run = tokio::task::spawn_blocking(move || drive_stdio(tap_cmd_with(py, &endpoint, &["--verifiers", &rules_arg]), &the_script()))
        .await
        .unwrap();
    assert_eq!(run.code, Some(3), "{}", run.stderr);
    assert!(run.stderr.contains("verifiers: 1 confirmed, 0 missing, 1 failed, 0 errors"), "the exit summary: {}", run.stderr);
    let latest = |vs: &[Value], tool: &str| {
        vs.iter().filter(|v| v["tool"] == tool && v["method"] == "tools/call").max_by_key(|v| v["revision"].as_u64().unwrap_or(0)).cloned()
    };
    let (echo, slow) = eventually(Duration::from_secs(30), "the checked calls' verdicts", || {
        let vs = svc.verdicts();
        let (e, s) = (latest(&vs, "echo")?, latest(&vs, "slow")?);
        (e["state"] == "healthy" && s["state"] == "false_success").then_some((e, s))
    })
    .await;
    assert_eq!((echo["outcome_method"].as_str(), echo["verified_success"].as_bool()), (Some("test_result"), Some(true)), "{echo}");
    assert_eq!(slow["first_failed_layer"], "outcome", "{slow}");
    let fail = latest(&svc.verdicts(), "fail").unwrap();
    assert_eq!(fail["state"], "tool_failed", "a failed call is not verified: {fail}");
}
