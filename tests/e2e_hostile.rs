//! Issue 22: verified must mean verified — the server being checked cannot verify itself.
//!
//! A hostile MCP server (tests/hostile/hostile_server.py) says `transfer_funds` succeeded, did
//! nothing, and POSTs an unsigned OTLP receipt saying `confirmed` into the call's trace (it learns
//! the trace id from `_meta.traceparent`). The tap's own verifier for the tool finds the transfer
//! absent (`failed`) and signs its finding with the tap's key (`mcp-health keygen`, `tap
//! --signing-key`). Two services see the same traffic:
//! - one that trusts the tap's public key: the forged receipt is `untrusted`, never evidence, and
//!   the call is `false_success` on the tap's signed finding (`outcome_trust: signed`);
//! - one with no trusted key (the embedded default's policy): receipts are taken as they come,
//!   but the forgery's date five seconds ahead (to be "the latest receipt") is capped at its
//!   arrival and counted (`mcp_health.receipts.capped`), so the tap's finding, which came after
//!   it, decides: `false_success`, `outcome_trust: unsigned`. Before the cap this half read
//!   `healthy`: the attack worked there.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use support::*;

fn python() -> Option<std::path::PathBuf> {
    let p = std::path::PathBuf::from("/usr/bin/python3");
    p.exists().then_some(p).or_else(|| which("python3"))
}

fn which(name: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join(name)).find(|p| p.exists())
}

/// Run `mcp-health tap TAP_ARGS -- python3 SERVER SERVER_ARGS` (stdio) and speak JSON-RPC to it:
/// each message is written, and a request's response read before the next; then, after `linger`
/// (verifiers run, the exporter sends), stdin is closed (the tap flushes on EOF). The responses to
/// the requests, and what the tap wrote on stderr.
fn drive_stdio_tap(
    tap_args: &[std::ffi::OsString],
    server: &str,
    server_args: &[&str],
    msgs: &[Value],
    linger: Duration,
) -> (Vec<Value>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mcp-health"))
        .arg("tap")
        .args(tap_args)
        .arg("--")
        .arg(python().expect("python3"))
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join(server))
        .args(server_args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the tap");
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut responses = Vec::new();
    for m in msgs {
        writeln!(stdin, "{m}").unwrap();
        stdin.flush().unwrap();
        if m.get("id").is_some() {
            let line = lines.next().expect("a response").unwrap();
            responses.push(serde_json::from_str::<Value>(&line).unwrap());
        }
    }
    std::thread::sleep(linger);
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    (responses, String::from_utf8_lossy(&out.stderr).to_string())
}

fn os_args(args: &[&str]) -> Vec<std::ffi::OsString> {
    args.iter().map(std::ffi::OsString::from).collect()
}

/// One `tools/call transfer_funds` through `mcp-health tap` (stdio) in front of the hostile
/// server, whose forged receipt goes to `forge_to`; the tap's spans go to `endpoint`.
fn call_through_tap(dir: &Path, endpoint: &str, forge_to: &str, key: &Path, trace: &str) {
    let rules = dir.join("rules.yaml");
    std::fs::write(&rules, "verifiers:\n  - name: transfer_done\n    tool: transfer_funds\n    command: {argv: [\"false\"]}\n").unwrap();
    let mut args = os_args(&["--otlp-endpoint", endpoint, "--service-name", "victim-agent", "--server-address", "hostile", "--verifiers"]);
    args.extend([rules.into_os_string(), "--signing-key".into(), key.as_os_str().to_owned()]);
    let msgs = [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "victim", "version": "1"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "transfer_funds", "arguments": {"amount": 100}, "_meta": {"traceparent": format!("00-{trace}-00f067aa0ba902b7-01")}}}),
    ];
    // The linger lets the verifier run and the tap export before the session ends.
    let (responses, _) = drive_stdio_tap(&args, "tests/hostile/hostile_server.py", &[forge_to], &msgs, Duration::from_millis(800));
    let r = &responses[1];
    assert_eq!(r["result"]["structuredContent"]["status"], "transferred", "{r}");
}

fn final_call(svc: &Service, trace: &str) -> Option<Value> {
    svc.verdicts().into_iter().filter(|v| v["trace_id"] == trace && v["method"] == "tools/call").max_by_key(|v| v["revision"].as_u64())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_receipt_does_not_verify_a_lying_call_when_keys_are_trusted() {
    if python().is_none() {
        eprintln!("SKIPPED: no python3");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("tap.key");
    let out = Command::new(env!("CARGO_BIN_EXE_mcp-health")).arg("keygen").arg("--out").arg(&key).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let public = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(public.starts_with("ed25519:") && public.len() == 8 + 64, "{public}");
    let seed = std::fs::read_to_string(&key).unwrap();
    assert!(!String::from_utf8_lossy(&out.stdout).contains(seed.trim()), "the private key is never printed");

    let trusting = Service::start(Cfg {
        decision_wait: "1500ms",
        listener_extra: vec![("mcp_health", format!("receipts:\n  trusted_keys: [\"{public}\"]"))],
        ..Cfg::default()
    })
    .await;
    let open = Service::start(Cfg { decision_wait: "1500ms", ..Cfg::default() }).await;

    for (svc, trace) in [(&trusting, "4bf92f3577b34da6a3ce929d0e0e4736"), (&open, "5bf92f3577b34da6a3ce929d0e0e4737")] {
        let (endpoint, forge_to) = (format!("http://{}", svc.grpc_addr()), format!("http://{}", svc.http_addr()));
        let (d, k) = (dir.path().to_path_buf(), key.clone());
        let t = trace.to_string();
        tokio::task::spawn_blocking(move || call_through_tap(&d, &endpoint, &forge_to, &k, &t)).await.unwrap();
    }

    let decided = |svc: &Service, trace: &str| {
        let t = trace.to_string();
        let svc_verdict = final_call(svc, &t);
        svc_verdict.filter(|v| v["outcome_method"].is_string())
    };
    let v =
        eventually(Duration::from_secs(20), "the trusting service's verdict", || decided(&trusting, "4bf92f3577b34da6a3ce929d0e0e4736"))
            .await;
    assert_eq!(v["state"], "false_success", "the forged receipt is no evidence: {v}");
    assert_eq!(v["verified_success"], false);
    assert_eq!(v["outcome_trust"], "signed", "the tap's signed finding decided: {v}");

    // Without trusted keys a receipt is taken as it came, but the forgery's date five seconds
    // ahead (to be "the latest receipt") is capped at its arrival: the tap's finding, which came
    // after it, decides. The verdict says on what.
    // What the open service decided is named if it is not this.
    let v = eventually_showing(
        Duration::from_secs(20),
        "the open service's verdict",
        || decided(&open, "5bf92f3577b34da6a3ce929d0e0e4737").filter(|v| v["state"] == "false_success"),
        || format!("; it decided {:?}\nall its verdicts: {:?}", final_call(&open, "5bf92f3577b34da6a3ce929d0e0e4737"), open.verdicts()),
    )
    .await;
    assert_eq!(v["outcome_trust"], "unsigned", "without trusted keys receipts are unsigned evidence: {v}");
    let capped = prom_sum(&open.metrics_text().await, "mcp_health_receipts_capped_total").unwrap_or(0.0);
    assert!(capped >= 1.0, "the forged date was capped and counted");
}

/// A receipt that names a call but was signed for another (a copied signature) is no evidence.
#[test]
fn a_copied_signature_does_not_transfer_to_another_call() {
    use mcp_health::evidence::receipt::{message, ReceiptTrust, SigningKey, TrustedKeys};
    let (_, key) = SigningKey::generate().unwrap();
    let keys = TrustedKeys::parse(&[key.public()]).unwrap();
    let signed = message(&[1; 16], &[2; 8], "7", "transfer_funds", "transfer_done", "confirmed", "http_status", 5);
    let sig = key.sign(&signed);
    let other_call = message(&[1; 16], &[3; 8], "8", "transfer_funds", "transfer_done", "confirmed", "http_status", 5);
    assert_eq!(keys.judge(Some((key.id(), &sig)), || other_call), ReceiptTrust::Untrusted);
    assert_eq!(keys.judge(Some((key.id(), &sig)), || signed.clone()), ReceiptTrust::Signed);
}

/// One `tools/call echo` through the stdio tap in front of tests/tap/fake_mcp_server.py, the
/// tap's spans sent with `extra` tap flags.
fn echo_through_tap(endpoint: &str, agent: &str, extra: &[&str]) {
    let mut args = os_args(&["--otlp-endpoint", endpoint, "--service-name", agent, "--server-address", "fake"]);
    args.extend(os_args(extra));
    let msgs = [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "c", "version": "1"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "echo", "arguments": {"text": "hi"}}}),
    ];
    drive_stdio_tap(&args, "tests/tap/fake_mcp_server.py", &[], &msgs, Duration::ZERO);
}

/// Issue 22: a receiver can require a bearer token of its senders, and the tap's exporter (the
/// service's own) can send one: spans without it are refused and counted, never judged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_requires_a_token_takes_only_the_taps_that_send_it() {
    if python().is_none() {
        eprintln!("SKIPPED: no python3");
        return;
    }
    let svc = Service::start(Cfg {
        decision_wait: "300ms",
        listener_extra: vec![("grpc", "auth: {bearer_token: tap-PLANTED_RECEIVER_TOKEN}".into())],
        ..Cfg::default()
    })
    .await;
    let endpoint = format!("http://{}", svc.grpc_addr());
    let e2 = endpoint.clone();
    tokio::task::spawn_blocking(move || {
        echo_through_tap(&e2, "with-token", &["--otlp-header", "authorization=Bearer tap-PLANTED_RECEIVER_TOKEN"]);
        echo_through_tap(&e2, "without-token", &[]);
    })
    .await
    .unwrap();
    eventually(Duration::from_secs(15), "the call of the tap that sent the token", || {
        svc.verdicts().into_iter().find(|v| v["agent"] == "with-token" && v["tool"] == "echo")
    })
    .await;
    let text = svc.wait_metric("mcp_health_requests_refused_total", Duration::from_secs(10), |n| n >= 1.0).await;
    assert!(text.lines().any(|l| l.starts_with("mcp_health_requests_refused_total") && l.contains("reason=\"unauthenticated\"")), "{text}");
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(svc.verdicts().iter().all(|v| v["agent"] != "without-token"), "spans without the token were judged");
    assert!(!svc.stdout().contains("PLANTED_RECEIVER_TOKEN") && !svc.stderr().contains("PLANTED_RECEIVER_TOKEN"));
}

/// Issue 22: planted secrets in every field a hostile server and a client control — tool names
/// shaped like provider keys, descriptions, cursors, error messages and data, results, request ids,
/// progress tokens, `requestState`, a task id, arguments — through the tap into the service: none
/// in the tap's spans (passed through to a collector), the verdict lines, `/metrics` or the logs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canaries_in_every_field_leave_through_no_output() {
    if python().is_none() {
        eprintln!("SKIPPED: no python3");
        return;
    }
    let sink = Sink::start().await;
    let svc = Service::start(Cfg { decision_wait: "300ms", ..Cfg::with_sink(&sink) }).await;
    let endpoint = format!("http://{}", svc.grpc_addr());
    let ep = endpoint.clone();
    let tap_err = tokio::task::spawn_blocking(move || {
        let meta = json!({"progressToken": "ghp_PLANTEDPROGRESS0123456789"});
        let msgs = [
            json!({"jsonrpc": "2.0", "id": "xoxb-PLANTED-REQ-1", "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "c", "version": "1"}}}),
            json!({"jsonrpc": "2.0", "id": "api_key=PLANTEDREQ2", "method": "tools/list", "params": {}}),
            json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": {"cursor": "api_key=PLANTED_CURSOR"}}),
            json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "xoxb-1234-PLANTED_TOOL", "arguments": {"a": "PLANTED_ARGUMENT"}, "_meta": meta}}),
            json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "plain_tool", "arguments": {"a": "PLANTED_ARGUMENT"}}}),
            json!({"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": {"name": "plain_tool", "arguments": {"a": "PLANTED_ARGUMENT"}, "requestState": "v1.PLANTED_REQUEST_STATE_xoxp-99", "inputResponses": {"q": {"action": "accept", "content": {"x": "PLANTED_INPUT"}}}}}),
            json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "AKIAIOSFODNN7EXAMPLE", "arguments": {"a": "PLANTED_ARGUMENT"}}}),
            json!({"jsonrpc": "2.0", "id": 8, "method": "tasks/get", "params": {"taskId": "task-PLANTED_TASK_ID"}}),
        ];
        let args = os_args(&["--otlp-endpoint", &ep, "--service-name", "canary-agent", "--server-address", "canary"]);
        drive_stdio_tap(&args, "tests/hostile/hostile_server.py", &["--canaries"], &msgs, Duration::from_millis(400)).1
    })
    .await
    .unwrap();
    // The calls were judged, under hashed names where a name looked like a key.
    let vs = eventually(Duration::from_secs(20), "verdicts of the canary calls", || {
        let vs = svc.verdicts();
        (vs.iter().filter(|v| v["tool"].as_str().is_some_and(|t| t.starts_with("sha256:"))).count() >= 2).then_some(vs)
    })
    .await;
    assert!(vs.iter().any(|v| v["tool"] == "plain_tool" && v["rounds"] == 2), "{vs:#?}");
    sink.wait_for(Duration::from_secs(20), "the tap's spans passed through", |s| {
        (s.spans().iter().filter(|x| !x.is_health_span()).count() >= 8).then_some(())
    })
    .await;
    let mut all = format!("{:?}\n{:?}\n{:?}\n", sink.trace_requests(), sink.metric_requests(), sink.log_requests());
    all.push_str(&svc.stdout());
    all.push_str(&svc.stderr());
    all.push_str(&svc.metrics_text().await);
    all.push_str(&tap_err);
    for planted in [
        "AKIAIOSFODNN7EXAMPLE",
        "xoxb-",
        "xoxp-",
        "api_key=",
        "ghp_PLANTED",
        "sk_live_",
        "PLANTED_DESCRIPTION",
        "PLANTED_CURSOR",
        "PLANTED_ERROR",
        "PLANTED_RESULT",
        "PLANTED_STRUCTURED",
        "PLANTED_REQUEST_STATE",
        "PLANTED_TASK",
        "PLANTED_ARGUMENT",
        "PLANTED_INPUT",
        "PLANTED_ELICIT",
        "PLANTED_SERVER_NAME",
        "hunter2",
    ] {
        assert!(!all.contains(planted), "{planted:?} left mcp-health or the tap");
    }
}

/// The peak resident memory of a process (VmHWM), in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

/// Issue 22: a hostile server's bytes do not become the tap's memory. Three 14 MB results that a
/// verifier rule checks (the jobs wait in the queue), and an event stream of 200 MB of empty
/// `data:` lines, through the HTTP tap: its peak RSS stays under 256 MiB (it once reached 1.33 GB
/// and 646 MB), every response reaches the client whole, and the server's JWT session id never
/// leaves the tap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_servers_bytes_do_not_become_the_taps_memory() {
    if python().is_none() {
        eprintln!("SKIPPED: no python3");
        return;
    }
    const LIMIT: u64 = 256 << 20;
    let dir = tempfile::tempdir().unwrap();
    let sink = Sink::start().await;
    let port_file = dir.path().join("port");
    let mut server = Command::new(python().unwrap())
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hostile/big_server.py"))
        .arg(&port_file)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let port: u16 =
        eventually(Duration::from_secs(20), "the big server's port", || std::fs::read_to_string(&port_file).ok()?.trim().parse().ok())
            .await;
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(
        &rules,
        format!("verifiers:\n  - {{name: big_done, tool: big, delay: 3s, http: {{url: \"http://127.0.0.1:{dead}/records/{{/result/structuredContent/id}}\"}}}}\nlimits: {{queue_size: 16, concurrency: 1}}\n"),
    )
    .unwrap();
    let err = dir.path().join("tap.err");
    let mut tap = Command::new(env!("CARGO_BIN_EXE_mcp-health"))
        .args(["tap", "--listen", "127.0.0.1:0", "--upstream", &format!("http://127.0.0.1:{port}"), "--otlp-endpoint", &sink.endpoint()])
        .arg("--verifiers")
        .arg(&rules)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let addr: std::net::SocketAddr = eventually(Duration::from_secs(20), "the tap's address", || {
        let e = std::fs::read_to_string(&err).ok()?;
        let i = e.find("listening on http://")? + "listening on http://".len();
        e[i..].split_once(',')?.0.trim().parse().ok()
    })
    .await;
    let post = |body: Value| async move {
        let b = body.to_string();
        http_request(
            addr,
            "POST",
            "/mcp",
            &[("Content-Type", "application/json"), ("Accept", "application/json, text/event-stream")],
            b.as_bytes(),
        )
        .await
        .expect("an answer through the tap")
    };
    let r = post(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "c", "version": "1"}}})).await;
    assert_eq!(r.status, 200);
    for id in 2..5 {
        let r = post(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "big", "arguments": {}}})).await;
        assert!(r.body.len() > 28 << 20, "the client got the whole 14 MB result: {}", r.body.len());
    }
    let r = post(json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "flood", "arguments": {}}})).await;
    assert!(r.body.len() > 200 << 20, "the client got the whole stream: {}", r.body.len());
    let peak = peak_rss(tap.id());
    eprintln!("tap peak RSS: {} MiB", peak >> 20);
    let _ = tap.kill();
    let _ = tap.wait();
    let _ = server.kill();
    let _ = server.wait();
    assert!(peak > 0 && peak < LIMIT, "the tap's peak RSS was {} MiB (limit {} MiB)", peak >> 20, LIMIT >> 20);
    let all = format!("{:?}", sink.trace_requests());
    assert!(!all.contains("PLANTEDSIG") && !all.contains("eyJhbGciOiJIUzI1NiJ9"), "the server's session id left the tap");
}
