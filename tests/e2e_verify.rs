//! Issue 9, live: outcome verifiers in the evidence tap make "verified success" reachable.
//!
//! A real MCP server (`mcp` SDK 2.x, streamable HTTP, bearer auth; tests/verify/seeds.py) whose
//! tools really create a record in a local HTTP service, write a file and insert a row in SQLite;
//! the real `mcp` client drives the calls through `mcp-health tap --verifiers`; the running
//! service decides, and a real Prometheus scrapes it. Also: reconciliation of lost responses, a
//! verifier that cannot run, and no planted secret anywhere in what the tap or the service emits.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use support::prometheus::{prometheus_available, Prometheus};
use support::*;

const RECORDS_TOKEN: &str = "rec-PLANTED_RECORDS_TOKEN-abcdef0123456789";

fn seeds() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/verify/seeds.py")
}

/// A child process killed on drop.
struct Proc {
    child: Child,
    stderr: PathBuf,
    name: &'static str,
}

impl Proc {
    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- {} stderr ---\n{}", self.name, self.stderr());
        }
    }
}

/// The seeds' servers; their ports.
struct Seeds {
    _proc: Proc,
    records: u16,
    mcp: u16,
    legacy: u16,
    down: u16,
}

async fn start_seeds(py: &Path, dir: &Path) -> Seeds {
    let out = dir.join("seeds.out");
    let err = dir.join("seeds.err");
    let child = Command::new(py)
        .arg(seeds())
        .arg("serve")
        .arg(dir)
        .env("RECORDS_TOKEN", RECORDS_TOKEN)
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .expect("start seeds.py");
    let proc = Proc { child, stderr: err, name: "seeds.py" };
    let ports: Value = eventually(Duration::from_secs(60), "the seeds' servers", || {
        std::fs::read_to_string(&out).ok()?.lines().next().and_then(|l| serde_json::from_str(l).ok())
    })
    .await;
    let p = |k: &str| ports[k].as_u64().unwrap() as u16;
    Seeds { records: p("records"), mcp: p("mcp"), legacy: p("legacy"), down: p("down"), _proc: proc }
}

/// `mcp-health tap` in HTTP mode; its listen address.
async fn start_tap(dir: &Path, name: &'static str, upstream: &str, svc: &Service, extra: &[&str]) -> (Proc, String) {
    let err = dir.join(format!("tap-{name}.err"));
    let child = Command::new(env!("CARGO_BIN_EXE_mcp-health"))
        .args(["tap", "--listen", "127.0.0.1:0", "--upstream", upstream, "--service-name", "seeds-agent", "--otlp-endpoint"])
        .arg(format!("http://{}", svc.grpc_addr()))
        .args(extra)
        .env("RECORDS_TOKEN", RECORDS_TOKEN)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .expect("start the tap");
    let p = Proc { child, stderr: err, name };
    let addr = eventually(Duration::from_secs(20), "the tap's listen address", || {
        let e = p.stderr();
        // Up to the comma that follows it, and a socket address: stderr is unbuffered, so the
        // line can be read while half written (once in CI: an empty address).
        let i = e.find("listening on http://")? + "listening on http://".len();
        let (addr, _) = e[i..].split_once(',')?;
        addr.trim().parse::<std::net::SocketAddr>().ok().map(|a| a.to_string())
    })
    .await;
    (p, format!("http://{addr}/mcp"))
}

fn write_rules(dir: &Path, records: u16) -> PathBuf {
    let f = dir.join("verifiers.yaml");
    let db = dir.join("items.db");
    std::fs::write(
        &f,
        format!(
            r#"verifiers:
  - name: ticket_created
    tool: create_ticket
    attempts: 2
    backoff: 100ms
    http:
      url: "http://127.0.0.1:{records}/records/{{/result/structuredContent/id}}"
      headers: {{Authorization: "Bearer ${{env:RECORDS_TOKEN}}"}}
      body_pointer: /title
      equals: "{{/arguments/title}}"
  - name: ticket_reconciled
    tool: slow_commit
    delay: 300ms
    http:
      url: "http://127.0.0.1:{records}/records/{{/arguments/id}}"
      headers: {{Authorization: "Bearer ${{env:RECORDS_TOKEN}}"}}
      body_pointer: /title
      equals: "{{/arguments/title}}"
  - name: report_written
    tool: write_report
    file:
      base_dir: "{dir}"
      path: "{{/arguments/name}}.txt"
      min_size: 1
  - name: row_inserted
    tool: insert_row
    sql:
      sqlite: "{db}"
      query: "select version from items where id = ?1 and name = ?2"
      params: ["{{/result/structuredContent/id}}", "{{/arguments/name}}"]
      min_version: "{{/arguments/version}}"
"#,
            db = db.display(),
            dir = dir.display()
        ),
    )
    .unwrap();
    f
}

fn run_client(py: &Path, args: &[&str]) -> Value {
    let out = Command::new(py).arg(seeds()).args(args).stderr(Stdio::inherit()).output().expect("run the seeds client");
    assert!(out.status.success(), "client failed: {}", String::from_utf8_lossy(&out.stdout));
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.lines().last().unwrap_or("null")).unwrap_or(Value::Null)
}

/// The latest revision of each attempt's verdict (a logical `tools/call`, or a failed session
/// setup), keyed by (trace, span); interim reports excluded.
fn final_calls(svc: &Service) -> Vec<Value> {
    let mut by: std::collections::BTreeMap<(String, String), Value> = Default::default();
    for v in svc.verdicts().into_iter().filter(|v| v["attempt"] == true && v["decided_by"] != "in_flight") {
        let k = (v["trace_id"].as_str().unwrap_or("").to_string(), v["span_id"].as_str().unwrap_or("").to_string());
        let newer = by.get(&k).is_none_or(|old| old["revision"].as_u64() <= v["revision"].as_u64());
        if newer {
            by.insert(k, v);
        }
    }
    by.into_values().collect()
}

fn layer_state(v: &Value) -> (String, String) {
    (v["first_failed_layer"].as_str().unwrap_or("none").to_string(), v["state"].as_str().unwrap_or("").to_string())
}

/// Everything the tap and the service emitted or printed, as one text to search.
async fn everything(svc: &Service, sink: &Sink, taps: &[&Proc]) -> String {
    let mut all = format!("{:?}\n{:?}\n{:?}\n", sink.trace_requests(), sink.metric_requests(), sink.log_requests());
    all.push_str(&svc.stdout());
    all.push_str(&svc.stderr());
    all.push_str(&svc.metrics_text().await);
    for t in taps {
        all.push_str(&t.stderr());
    }
    all
}

fn assert_no_secrets(all: &str, dir: &Path) {
    for planted in ["PLANTED", "/records/", RECORDS_TOKEN, "tok-good", "tok-revoked", "tok-noscope", "items.db", "quarterly"] {
        assert!(!all.contains(planted), "{planted:?} leaked into what the tap or the service emitted");
    }
    let d = dir.display().to_string();
    assert!(!all.contains(&d), "the work directory's path leaked");
}

/// The seeds' eight calls made live as an agent makes them (issue 21): each through a fresh
/// `mcp` SDK client that sets up its session first, so the three calls that cannot start fail at
/// session setup (`initialize` on 2025-11-25; `server/discover`, then the SDK's retry with
/// `initialize`, on 2026-07-28), and count as one failed attempt each. Every first failed layer,
/// and 37.5 % / 12.5 % from the running service through a real Prometheus.
async fn eight_calls_live(revision: &str) {
    let Some(py) = venv_python(".venv-mcp") else { return };
    if !prometheus_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sink = Sink::start().await;
    let svc = Service::start(Cfg { decision_wait: "500ms", ..Cfg::with_sink(&sink) }).await;
    let prom = Prometheus::start(svc.prom_addr()).await;
    let s = start_seeds(&py, dir.path()).await;
    let rules = write_rules(dir.path(), s.records);
    let v = ["--verifiers", rules.to_str().unwrap()];
    let (ta, ok) = start_tap(dir.path(), "mcp", &format!("http://127.0.0.1:{}", s.mcp), &svc, &v).await;
    let (tl, legacy) = start_tap(dir.path(), "legacy", &format!("http://127.0.0.1:{}", s.legacy), &svc, &v).await;
    let (td, down) = start_tap(dir.path(), "down", &format!("http://127.0.0.1:{}", s.down), &svc, &v).await;
    let (tu, unresolved) = start_tap(dir.path(), "unresolved", "http://mcp-upstream.invalid:8000", &svc, &v).await;

    let urls = json!({"mcp": ok, "legacy": legacy, "down": down, "unresolved": unresolved}).to_string();
    let rev = revision.to_string();
    let log = tokio::task::spawn_blocking(move || run_client(&py, &["eight-live", &rev, &urls])).await.unwrap();
    assert_eq!(log.as_array().map(Vec::len), Some(8), "the client made eight calls: {log}");
    let setup = log.as_array().unwrap().iter().filter(|e| e["phase"] == "setup").count();
    assert_eq!(setup, 4, "unresolved, down, revoked and noscope fail at session setup: {log}");

    let mut want = [
        ("transport", "transport_failed"),
        ("transport", "transport_failed"),
        ("protocol", "protocol_error"),
        ("authorization", "needs_auth"),
        ("authorization", "needs_auth"),
        ("execution", "tool_failed"),
        ("outcome", "false_success"),
        ("none", "healthy"),
    ];
    want.sort();
    let calls = eventually(Duration::from_secs(30), "eight attempts with their findings", || {
        let c = final_calls(&svc);
        let mut got: Vec<(String, String)> = c.iter().map(layer_state).collect();
        got.sort();
        let w: Vec<(String, String)> = want.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
        (got == w).then_some(c)
    })
    .await;
    let setups: Vec<&Value> = calls.iter().filter(|v| v["method"] != "tools/call").collect();
    assert_eq!(setups.len(), 4, "four attempts are failed setups: {calls:#?}");
    let setup_method = if revision == "2025-11-25" { "initialize" } else { "server/discover" };
    assert!(setups.iter().all(|v| v["method"] == setup_method), "{setups:#?}");
    let reasons: Vec<&str> = calls.iter().filter_map(|v| v["reason"].as_str()).collect();
    assert!(reasons.contains(&"invalid_token") && reasons.contains(&"insufficient_scope"), "{reasons:?}");
    assert!(reasons.contains(&"jsonrpc_-32601"), "{reasons:?}");
    assert!(calls.iter().filter(|v| v["method"] == "tools/call").all(|v| v["protocol_revision"] == revision), "{calls:#?}");
    let verified: Vec<&Value> = calls.iter().filter(|v| v["verified_success"] == true).collect();
    assert_eq!(verified.len(), 1);
    assert_eq!(verified[0]["outcome_method"], "http_status");

    // The same rates from the running service, through a real Prometheus.
    for (q, want) in [
        ("sum(mcp_health_calls_total)", "8"),
        ("sum(mcp_health_calls_protocol_success_total) / sum(mcp_health_calls_total)", "0.375"),
        ("sum(mcp_health_calls_verified_success_total) / sum(mcp_health_calls_total)", "0.125"),
        ("sum(mcp_health_verifier_runs_total{verifier=\"ticket_created\"})", "2"),
    ] {
        eventually_async(Duration::from_secs(30), q, || async { prom.query(q).await.filter(|g| g == want) }).await;
    }
    assert_no_secrets(&everything(&svc, &sink, &[&ta, &tl, &td, &tu]).await, dir.path());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_eight_calls_live_on_2025_11_25_give_37_5_and_12_5_percent() {
    eight_calls_live("2025-11-25").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_eight_calls_live_on_2026_07_28_give_37_5_and_12_5_percent() {
    eight_calls_live("2026-07-28").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_responses_are_reconciled_by_the_same_rule() {
    let Some(py) = venv_python(".venv-mcp") else { return };
    let dir = tempfile::tempdir().unwrap();
    let sink = Sink::start().await;
    let svc = Service::start(Cfg { decision_wait: "300ms", ..Cfg::with_sink(&sink) }).await;
    let s = start_seeds(&py, dir.path()).await;
    let rules = write_rules(dir.path(), s.records);
    let (tap, url) = start_tap(
        dir.path(),
        "reconcile",
        &format!("http://127.0.0.1:{}", s.mcp),
        &svc,
        &["--verifiers", rules.to_str().unwrap(), "--upstream-timeout", "1s"],
    )
    .await;
    let log = tokio::task::spawn_blocking(move || run_client(&py, &["reconcile", &url])).await.unwrap();
    assert_eq!(log.as_array().map(Vec::len), Some(3), "{log}");
    let calls = eventually(Duration::from_secs(30), "three reconciled verdicts", || {
        let c = final_calls(&svc);
        (c.len() == 3 && c.iter().all(|v| v["state"] != "effect_unknown")).then_some(c)
    })
    .await;
    let mut got: Vec<(String, String, bool, Option<String>)> = calls
        .iter()
        .map(|v| {
            let (l, s) = layer_state(v);
            (l, s, v["retry_safe"] == true, v["reason"].as_str().map(str::to_string))
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        vec![
            ("transport".into(), "false_success".into(), true, Some("timeout".into())),
            ("transport".into(), "healthy".into(), true, Some("timeout".into())),
            ("transport".into(), "transport_failed".into(), true, Some("reconciled_not_committed".into())),
        ],
        "{calls:#?}"
    );
    assert_no_secrets(&everything(&svc, &sink, &[&tap]).await, dir.path());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_and_sql_verifiers_and_a_verifier_that_cannot_run() {
    let Some(py) = venv_python(".venv-mcp") else { return };
    let dir = tempfile::tempdir().unwrap();
    let sink = Sink::start().await;
    let svc = Service::start(Cfg { decision_wait: "300ms", ..Cfg::with_sink(&sink) }).await;
    let s = start_seeds(&py, dir.path()).await;
    let rules = write_rules(dir.path(), s.records);
    let (tap, url) =
        start_tap(dir.path(), "kinds", &format!("http://127.0.0.1:{}", s.mcp), &svc, &["--verifiers", rules.to_str().unwrap()]).await;
    // A second tap whose ticket rule points at a destination that is not there.
    let dead = dead_port();
    let broken = dir.path().join("broken.yaml");
    std::fs::write(
        &broken,
        format!("- {{name: ticket_created, tool: create_ticket, timeout: 1s, http: {{url: \"http://127.0.0.1:{}/records/{{/result/structuredContent/id}}\"}}}}\n", dead.port),
    )
    .unwrap();
    let (tap2, url2) =
        start_tap(dir.path(), "broken", &format!("http://127.0.0.1:{}", s.mcp), &svc, &["--verifiers", broken.to_str().unwrap()]).await;
    let py2 = py.clone();
    let log = tokio::task::spawn_blocking(move || run_client(&py, &["kinds", &url])).await.unwrap();
    assert_eq!(log.as_array().map(Vec::len), Some(2), "{log}");
    let log2 = tokio::task::spawn_blocking(move || run_client(&py2, &["one", &url2])).await.unwrap();
    assert_eq!(log2["is_error"], false, "{log2}");
    let calls = eventually(Duration::from_secs(30), "three verdicts with their findings", || {
        let c = final_calls(&svc);
        let healthy = c.iter().filter(|v| v["state"] == "healthy").count();
        let errored = c.iter().filter(|v| v["reason"] == "verifier_error").count();
        (c.len() == 3 && healthy == 2 && errored == 1).then_some(c)
    })
    .await;
    let mut methods: Vec<&str> = calls.iter().filter_map(|v| v["outcome_method"].as_str()).collect();
    methods.sort();
    assert_eq!(methods, vec!["file_digest", "row_version"]);
    let err = calls.iter().find(|v| v["reason"] == "verifier_error").unwrap();
    assert_eq!((err["state"].as_str(), err["verified_success"].as_bool()), (Some("unverified"), Some(false)), "{err}");
    let text = svc.wait_metric("mcp_health_verifier_errors_total", Duration::from_secs(10), |v| v >= 1.0).await;
    assert!(text.contains("error=\"unreachable\""), "{text}");
    assert_no_secrets(&everything(&svc, &sink, &[&tap, &tap2]).await, dir.path());
}

/// The README's receipt example (examples/receipt.py, the plain OpenTelemetry API): a receipt in
/// the call's trace makes it `healthy`; one recorded after the call was decided revises it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receipts_from_the_agents_own_code_join_and_revise() {
    agents_receipts(false).await;
}

/// The same example signing its receipts (MCP_HEALTH_SIGNING_KEY_FILE, a key from `mcp-health
/// keygen`) for a service that trusts only that key: the calls are `healthy` on `signed` receipts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_receipts_from_the_agents_own_code_are_trusted() {
    agents_receipts(true).await;
}

async fn agents_receipts(signed: bool) {
    let Some(py) = venv_python(".venv-mcp") else { return };
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("agent.key");
    let mut cfg = Cfg { decision_wait: "300ms", ..Cfg::default() };
    if signed {
        let out = Command::new(env!("CARGO_BIN_EXE_mcp-health")).arg("keygen").arg("--out").arg(&key).output().unwrap();
        assert!(out.status.success());
        let public = String::from_utf8_lossy(&out.stdout).trim().to_string();
        cfg.listener_extra = vec![("mcp_health", format!("receipts:\n  trusted_keys: [\"{public}\"]"))];
    }
    let svc = Service::start(cfg).await;
    let s = start_seeds(&py, dir.path()).await;
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/receipt.py");
    let url = format!("http://127.0.0.1:{}/mcp", s.mcp);
    let endpoint = format!("http://{}", svc.grpc_addr());
    let out = tokio::task::spawn_blocking(move || {
        Command::new(&py)
            .arg(example)
            .args([url.as_str(), "tok-good-PLANTED_BEARER_0123456789", "2"])
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
            .envs(signed.then(|| ("MCP_HEALTH_SIGNING_KEY_FILE", key.clone())))
            .output()
            .expect("run examples/receipt.py")
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let calls = eventually(Duration::from_secs(30), "two healthy calls", || {
        // The session's setup is seen through the `mcp` SDK's span alone (the seeds server
        // exports nothing): an unconfirmed attempt, reported beside the calls.
        let c: Vec<Value> = final_calls(&svc).into_iter().filter(|v| v["method"] == "tools/call").collect();
        (c.len() == 2 && c.iter().all(|v| v["state"] == "healthy")).then_some(c)
    })
    .await;
    assert!(calls.iter().all(|v| v["outcome_method"] == "receipt"), "{calls:#?}");
    let trust = if signed { "signed" } else { "unsigned" };
    assert!(calls.iter().all(|v| v["outcome_trust"] == trust), "{calls:#?}");
    let late = calls.iter().find(|v| v["revision"].as_u64() >= Some(1)).expect("the late receipt revised its call");
    assert_eq!(late["supersedes"]["state"], "unverified", "{late}");
}
