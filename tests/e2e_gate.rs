//! End to end: the gate gRPC API (proto/mcp_health/v1/gate.proto) of a running `mcp-health serve`,
//! called with the generated tonic client. The lockfile pins tests/fixtures/drift_before.jsonl; the
//! service then receives drift_after.jsonl over OTLP/HTTP, and the gate answers from what it saw:
//! the pinned close_ticket is allowed, the drifted search_tickets is denied with the changes named,
//! and the catalog verdict of session `drift-2` is the one SPEC section 4 gives for its evidence.
//!
//! Digests are computed from the fixture's raw definitions and read from the lockfile, never
//! written here.

mod support;

use std::net::{SocketAddr, TcpListener as StdListener};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use mcp_health::testing::gate::service::pb::gate_client::GateClient;
use mcp_health::testing::gate::service::pb::{CatalogVerdictRequest, CatalogVerdictResponse, CheckToolRequest, CheckToolResponse};
use serde_json::Value;
use support::*;

const WAIT: Duration = Duration::from_secs(30);
const SERVER: &str = "tickets.example.test:8443";

/// A running `mcp-health serve` with a lockfile and the gate on. The shared `Service` guard renders
/// a fixed set of keys, so this one takes its YAML (ports, receivers, exporters, health check) and
/// adds `processors.mcp_health.lockfile` and `extensions.gate`. Killed on drop.
struct GateService {
    ports: Ports,
    gate: u16,
    child: Mutex<Option<Child>>,
    dir: tempfile::TempDir,
}

impl GateService {
    async fn start(lockfile: &str, unpinned: &str) -> GateService {
        let mut last_err = String::new();
        for _attempt in 0..5 {
            let (ports, gate) = {
                let extra = StdListener::bind("127.0.0.1:0").expect("bind port 0");
                let ports = Ports::pick();
                (ports, extra.local_addr().unwrap().port())
            };
            let dir = tempfile::tempdir().expect("tempdir");
            let yaml = Cfg::default()
                .yaml(&ports)
                .replacen(
                    "processors:\n  mcp_health:\n",
                    &format!("processors:\n  mcp_health:\n    lockfile: {}\n", serde_json::to_string(lockfile).unwrap()),
                    1,
                )
                .replacen("extensions:\n", &format!("extensions:\n  gate:\n    endpoint: 127.0.0.1:{gate}\n    unpinned: {unpinned}\n"), 1);
            assert!(yaml.contains("lockfile:") && yaml.contains("gate:"), "the shared YAML changed shape:\n{yaml}");
            let config = dir.path().join("mcp-health.yaml");
            std::fs::write(&config, &yaml).unwrap();
            let child = Command::new(env!("CARGO_BIN_EXE_mcp-health"))
                .arg("serve")
                .arg("--config")
                .arg(&config)
                .env_remove("RUST_LOG")
                .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
                .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                .env_remove("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
                .stdin(Stdio::null())
                .stdout(std::fs::File::create(dir.path().join("stdout")).unwrap())
                .stderr(std::fs::File::create(dir.path().join("stderr")).unwrap())
                .spawn()
                .expect("spawn mcp-health");
            let svc = GateService { ports, gate, child: Mutex::new(Some(child)), dir };
            // The health endpoint answers only once every listener, the gate's included, is bound.
            let deadline = Instant::now() + WAIT;
            loop {
                if !svc.running() {
                    let err = svc.stderr();
                    if err.contains("cannot listen") {
                        last_err = err;
                        break; // a port race with a parallel test: other ports
                    }
                    panic!("mcp-health exited:\n--- config ---\n{yaml}\n--- stderr ---\n{err}");
                }
                if http_get(SocketAddr::from(([127, 0, 0, 1], ports.health)), "/").await.is_ok_and(|r| r.status == 200) {
                    return svc;
                }
                assert!(Instant::now() < deadline, "mcp-health not healthy within {WAIT:?}:\n{}", svc.stderr());
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        }
        panic!("mcp-health could not bind free ports after 5 attempts:\n{last_err}");
    }

    fn running(&self) -> bool {
        self.child.lock().unwrap().as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr")).unwrap_or_default()
    }

    async fn client(&self) -> GateClient<tonic::transport::Channel> {
        GateClient::connect(format!("http://127.0.0.1:{}", self.gate)).await.expect("connect to the gate")
    }

    /// Post every line of a JSONL fixture to /v1/traces as OTLP/JSON.
    async fn post_fixture(&self, name: &str) {
        let addr = SocketAddr::from(([127, 0, 0, 1], self.ports.http));
        for line in fixture_lines(name) {
            let r = http_request(addr, "POST", "/v1/traces", &[("Content-Type", "application/json")], line.as_bytes())
                .await
                .expect("POST /v1/traces");
            assert_eq!(r.status, 200, "{}", r.text());
        }
    }
}

impl Drop for GateService {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            eprintln!("--- mcp-health stderr ---\n{}\n---", self.stderr());
        }
    }
}

/// `mcp-health lock tests/fixtures/drift_before.jsonl --lockfile <tmp>`, with the parsed lockfile.
fn lock_before() -> (tempfile::TempDir, String, Value) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("mcp-health.lock.json").to_string_lossy().into_owned();
    let out = Command::new(env!("CARGO_BIN_EXE_mcp-health"))
        .args(["lock", fixture_path("drift_before.jsonl").to_str().unwrap(), "--lockfile", &path])
        .output()
        .expect("run mcp-health lock");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let l: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    (dir, path, l)
}

/// Every span of a JSONL fixture.
fn fixture_spans(name: &str) -> Vec<Value> {
    fixture_lines(name)
        .iter()
        .flat_map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            let mut out = Vec::new();
            for rs in v["resourceSpans"].as_array().unwrap() {
                for ss in rs["scopeSpans"].as_array().unwrap() {
                    out.extend(ss["spans"].as_array().unwrap().iter().cloned());
                }
            }
            out
        })
        .collect()
}

fn span_attr<'a>(span: &'a Value, key: &str) -> Option<&'a Value> {
    span["attributes"].as_array()?.iter().find(|a| a["key"] == key).map(|a| &a["value"])
}

/// The contract digest of `tool` as defined in the fixture's raw `mcp_health.catalog.tools`.
fn fixture_digest(name: &str, tool: &str) -> String {
    for s in fixture_spans(name) {
        if let Some(raw) = span_attr(&s, "mcp_health.catalog.tools").and_then(|v| v["stringValue"].as_str()) {
            let defs: Vec<Value> = serde_json::from_str(raw).unwrap();
            if let Some(d) = defs.iter().find(|d| d["name"] == tool) {
                return mcp_health::testing::classify::digest::tool_digest(d).unwrap().digest;
            }
        }
    }
    panic!("{tool} has no raw definition in {name}");
}

async fn check(c: &mut GateClient<tonic::transport::Channel>, tool: &str, digest: &str) -> CheckToolResponse {
    c.check_tool(CheckToolRequest { server: SERVER.into(), tool: tool.into(), digest: digest.into() })
        .await
        .expect("CheckTool")
        .into_inner()
}

async fn verdict(c: &mut GateClient<tonic::transport::Channel>, req: CatalogVerdictRequest) -> CatalogVerdictResponse {
    c.catalog_verdict(req).await.expect("CatalogVerdict").into_inner()
}

fn session(id: &str) -> CatalogVerdictRequest {
    CatalogVerdictRequest { session_id: id.into(), ..Default::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gate_allows_pins_denies_drift_and_answers_catalog_verdicts() {
    let (_d, lockfile, lock) = lock_before();
    let svc = GateService::start(&lockfile, "allow").await;
    let mut c = svc.client().await;

    // Before any span: nothing is known about the session, and that is what the gate says.
    let r = verdict(&mut c, session("drift-2")).await;
    assert!(!r.found && r.verdict.is_none(), "{r:?}");

    svc.post_fixture("drift_after.jsonl").await;
    // The correlator publishes catalog verdicts asynchronously, as each of the session's traces is
    // decided: `unverifiable` until its tools/list traversal is (under load that can be read
    // first). Wait for the verdict the whole fixture gives.
    let r = eventually_async(WAIT, "drift-2's catalog verdict after its traversal", || {
        let mut c = c.clone();
        async move {
            Some(verdict(&mut c, session("drift-2")).await)
                .filter(|r| r.found && r.verdict.as_ref().is_some_and(|v| !v.cursor_chain.is_empty()))
        }
    })
    .await;

    // drift-2: listChanged advertised, one complete page (no nextCursor), no change signal, and an
    // install equal to that discovery: converged by SPEC section 4 (even though it drifted from the
    // pins — convergence is about the catalog the client holds, pinning is about the contract).
    let v = r.verdict.expect("verdict");
    assert_eq!(v.convergence, "converged", "{v:?}");
    assert_eq!(v.signal_at_unix_nano, 0, "no change signal in drift-2");
    assert_eq!(v.cursor_chain, vec![String::new()], "one first page");
    assert!(v.discovered_digest.starts_with("sha256:"), "{v:?}");
    let spans = fixture_spans("drift_after.jsonl");
    let installed =
        spans.iter().find_map(|s| span_attr(s, "mcp_health.catalog.installed_digest")).and_then(|v| v["stringValue"].as_str()).unwrap();
    assert_eq!(v.installed_digest, installed);
    assert_eq!(v.discovered_digest, v.installed_digest);
    let list = spans.iter().find(|s| s["name"] == "tools/list").unwrap();
    let ns = |k: &str| list[k].as_str().unwrap().parse::<u64>().unwrap();
    assert_eq!((v.traversal_start_unix_nano, v.traversal_end_unix_nano), (ns("startTimeUnixNano"), ns("endTimeUnixNano")));
    assert_eq!(v.projection_version, "mcp-tool-v1");
    assert!(!v.reason.is_empty() && !v.next_step.is_empty());

    // A session nobody reported: not found, never a default verdict.
    let r = verdict(&mut c, session("no-such-session")).await;
    assert!(!r.found && r.verdict.is_none(), "{r:?}");
    // The same session named by client + server has no session-less entry either.
    let r = verdict(&mut c, CatalogVerdictRequest { client: "agent".into(), server: SERVER.into(), ..Default::default() }).await;
    assert!(!r.found, "drift-2 has a session id, so it is not keyed by client and server: {r:?}");

    // Server only: every session of the server, keyed by the hash of the session key.
    let r = verdict(&mut c, CatalogVerdictRequest { server: SERVER.into(), ..Default::default() }).await;
    assert!(r.found && r.verdict.is_none(), "{r:?}");
    let key = mcp_health::evidence::session_key(Some("drift-2"), None, None, mcp_health::evidence::Side::Client).unwrap();
    let hash = mcp_health::normalize::redact::hash_hex(key.as_bytes());
    let mine = r.sessions.iter().find(|s| s.session_hash == hash).unwrap_or_else(|| panic!("no drift-2 in {r:?}"));
    assert_eq!(mine.verdict.as_ref().unwrap().convergence, "converged");
    assert!(!r.sessions.iter().any(|s| s.session_hash.contains("drift-2")), "session ids are never returned");
    let r = verdict(&mut c, CatalogVerdictRequest { server: "elsewhere.example.test:443".into(), ..Default::default() }).await;
    assert!(!r.found && r.sessions.is_empty(), "{r:?}");

    // close_ticket: the pinned digest is allowed, and so is the after-definition (icons only).
    let pinned_close = lock["servers"][SERVER]["close_ticket"]["digest"].as_str().unwrap().to_string();
    let r = check(&mut c, "close_ticket", &pinned_close).await;
    assert!(r.allow, "{r:?}");
    assert_eq!(r.reason, "matches_pin");
    assert_eq!(r.pinned_digest, pinned_close);
    assert!(r.changes.is_empty());
    assert_eq!(fixture_digest("drift_after.jsonl", "close_ticket"), pinned_close, "an icon change is not a contract change");

    // search_tickets as drift_after defines it: denied, with each change named.
    let pinned_search = lock["servers"][SERVER]["search_tickets"]["digest"].as_str().unwrap().to_string();
    let drifted = fixture_digest("drift_after.jsonl", "search_tickets");
    assert_ne!(drifted, pinned_search);
    let r = check(&mut c, "search_tickets", &drifted).await;
    assert!(!r.allow, "{r:?}");
    assert_eq!(r.reason, "contract_drift");
    assert_eq!(r.pinned_digest, pinned_search);
    let mut kinds: Vec<&str> = r.changes.iter().map(|c| c.kind.as_str()).collect();
    kinds.sort();
    assert_eq!(kinds, vec!["description_changed", "enum_narrowed", "parameter_renamed"], "{r:?}");
    let has = |kind: &str, words: &[&str]| r.changes.iter().any(|c| c.kind == kind && words.iter().all(|w| c.description.contains(w)));
    assert!(has("parameter_renamed", &["`query`", "`q`"]), "{r:?}");
    assert!(has("description_changed", &["`limit`"]), "{r:?}");
    assert!(has("enum_narrowed", &["`status`", "any"]), "the narrowed enum lost \"any\": {r:?}");
    let exp = fixture_json("drift_after.expected.json");
    for want in exp["drifted"]["search_tickets"].as_array().unwrap() {
        assert!(r.changes.iter().any(|c| c.description.contains(want.as_str().unwrap())), "missing {want} in {r:?}");
    }

    // A tool with no pin: allowed under the default policy.
    let r = check(&mut c, "reopen_ticket", &drifted).await;
    assert!(r.allow && r.reason == "unpinned" && r.pinned_digest.is_empty(), "{r:?}");

    // Malformed requests: INVALID_ARGUMENT with a message that says what is wrong.
    for (req, says) in [
        (CheckToolRequest { server: SERVER.into(), tool: "search_tickets".into(), digest: "sha256:1234".into() }, "64 hex"),
        (
            CheckToolRequest { server: SERVER.into(), tool: "search_tickets".into(), digest: drifted.trim_start_matches("sha256:").into() },
            "sha256:",
        ),
        (CheckToolRequest { server: SERVER.into(), tool: String::new(), digest: drifted.clone() }, "tool"),
        (CheckToolRequest { server: String::new(), tool: "search_tickets".into(), digest: drifted.clone() }, "server"),
    ] {
        let e = c.check_tool(req.clone()).await.expect_err("malformed request must fail");
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{req:?}: {e:?}");
        assert!(e.message().contains(says), "{req:?}: {}", e.message());
    }
    let e = c.catalog_verdict(CatalogVerdictRequest::default()).await.expect_err("empty CatalogVerdict must fail");
    assert_eq!(e.code(), tonic::Code::InvalidArgument);

    assert!(svc.running(), "{}", svc.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unpinned_deny_policy_denies_tools_without_a_pin() {
    let (_d, lockfile, lock) = lock_before();
    let svc = GateService::start(&lockfile, "deny").await;
    let mut c = svc.client().await;
    let any = fixture_digest("drift_after.jsonl", "search_tickets");
    let r = check(&mut c, "reopen_ticket", &any).await;
    assert!(!r.allow && r.reason == "unpinned", "{r:?}");
    // Another server's tool of the same name is not pinned either.
    let r = c
        .check_tool(CheckToolRequest { server: "other.example.test:443".into(), tool: "search_tickets".into(), digest: any.clone() })
        .await
        .unwrap()
        .into_inner();
    assert!(!r.allow && r.reason == "unpinned", "{r:?}");
    // Pinned tools are unaffected by the policy.
    let pinned = lock["servers"][SERVER]["search_tickets"]["digest"].as_str().unwrap();
    let r = check(&mut c, "search_tickets", pinned).await;
    assert!(r.allow && r.reason == "matches_pin", "{r:?}");
    // The README's two-line client, verbatim but for the port.
    assert!(readme_client(&format!("http://127.0.0.1:{}", svc.gate), pinned.to_string()).await.unwrap());
    assert!(!readme_client(&format!("http://127.0.0.1:{}", svc.gate), any).await.unwrap());

    // SIGTERM with a gate client still connected: the gate shuts down with the other listeners.
    let pid = svc.child.lock().unwrap().as_ref().unwrap().id();
    assert!(Command::new("kill").arg("-TERM").arg(pid.to_string()).status().unwrap().success());
    let status = eventually(WAIT, "mcp-health to exit after SIGTERM", || {
        svc.child.lock().unwrap().as_mut().and_then(|c| c.try_wait().ok().flatten())
    })
    .await;
    assert!(status.success(), "{status:?}\n{}", svc.stderr());
    drop(c);
}

/// README "Gate API": the two-line client.
async fn readme_client(endpoint: &str, digest: String) -> Result<bool, Box<dyn std::error::Error>> {
    use mcp_health::testing::gate::service::pb::{gate_client::GateClient, CheckToolRequest};
    let mut gate = GateClient::connect(endpoint.to_string()).await?;
    let ok = gate
        .check_tool(CheckToolRequest { server: "tickets.example.test:8443".into(), tool: "search_tickets".into(), digest })
        .await?
        .into_inner()
        .allow;
    Ok(ok)
}
