//! Issue 10: the evidence tap in front of an `https://` upstream (most remote MCP servers). The
//! fake MCP server (tests/tap/fake_mcp_server.py, Python's own `ssl`) serves over TLS with a
//! certificate made in the test; the tap verifies it with `--upstream-ca-file`, forwards the
//! exchanges and emits their spans. Without the CA the handshake fails: 502 and a span saying
//! `tls_failure`; `--upstream-insecure-skip-verify` accepts the certificate unverified.
//!
//! Needs `python3` (the tests say so and pass trivially when it is missing).

mod support;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use opentelemetry_proto::tonic::common::v1::any_value;
use serde_json::json;
use support::pki::Pki;
use support::*;

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

/// The fake MCP server over TLS on a free port.
fn start_fake_https(py: &str, pki: &Pki) -> (Proc, u16) {
    let dir = tempfile::tempdir().unwrap();
    let err_path = dir.path().join("stderr");
    let mut child = Command::new(py)
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/tap/fake_mcp_server.py"))
        .args(["--http", "0", "--tls"])
        .arg(&pki.server_cert)
        .arg(&pki.server_key)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .expect("spawn the fake server");
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    let port: u16 = line.trim().strip_prefix("PORT ").and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("fake server said {line:?}"));
    (Proc { child, _dir: dir, err_path }, port)
}

/// The tap in HTTP mode in front of `upstream`, with extra flags.
async fn start_tap(upstream: &str, endpoint: &str, flags: &[&str]) -> (Proc, SocketAddr) {
    let dir = tempfile::tempdir().unwrap();
    let err_path = dir.path().join("stderr");
    let child = Command::new(env!("CARGO_BIN_EXE_mcp-health"))
        .args(["tap", "--listen", "127.0.0.1:0", "--upstream", upstream, "--otlp-endpoint", endpoint, "--connect-timeout", "2s"])
        .args(flags)
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
        // Up to its comma: a half-written line ("127.0.0.1:43" of "…:43211,") parses too.
        err[at + "listening on http://".len()..].split_once(',')?.0.trim().parse::<SocketAddr>().ok()
    })
    .await;
    (p, addr)
}

async fn post(addr: SocketAddr, session: Option<&str>, body: serde_json::Value) -> HttpResponse {
    let mut h = vec![
        ("Content-Type", "application/json".to_string()),
        ("Accept", "application/json, text/event-stream".to_string()),
        ("Authorization", "Bearer full-token".to_string()),
    ];
    if let Some(s) = session {
        h.push(("Mcp-Session-Id", s.to_string()));
        h.push(("MCP-Protocol-Version", "2025-11-25".to_string()));
    }
    let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
    http_request(addr, "POST", "/mcp", &h, body.to_string().as_bytes()).await.expect("HTTP exchange with the tap")
}

fn initialize(id: i64) -> serde_json::Value {
    json!({"jsonrpc":"2.0","id":id,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"tls-e2e","version":"1"}}})
}

fn str_attr<'a>(s: &'a ReceivedSpan, k: &str) -> Option<&'a str> {
    s.attr_str(k)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tap_forwards_to_an_https_upstream_and_emits_the_spans() {
    let Some(py) = python() else {
        eprintln!("python3 not found: skipping");
        return;
    };
    let pki = Pki::generate();
    let sink = Sink::start().await;
    let (_server, port) = start_fake_https(py, &pki);
    let upstream = format!("https://127.0.0.1:{port}");
    let ca = pki.ca.display().to_string();
    let (tap_proc, tap) = start_tap(&upstream, &sink.endpoint(), &["--upstream-ca-file", &ca]).await;

    let init = post(tap, None, initialize(0)).await;
    assert_eq!(
        init.status,
        200,
        "initialize through the tap: {}\n{}",
        init.text(),
        std::fs::read_to_string(&tap_proc.err_path).unwrap_or_default()
    );
    let sid = init.header("mcp-session-id").expect("a session id").to_string();
    let call = post(
        tap,
        Some(&sid),
        json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"over tls"}}}),
    )
    .await;
    assert_eq!(call.status, 200);
    assert!(call.text().contains("over tls"), "{}", call.text());

    let spans = sink
        .wait_for(Duration::from_secs(15), "the tap's spans of the TLS exchanges", |s| {
            let v = s.spans();
            (v.iter().any(|x| x.span.name == "initialize") && v.iter().any(|x| x.span.name.starts_with("tools/call"))).then_some(v)
        })
        .await;
    let call_span = spans.iter().find(|s| s.span.name.starts_with("tools/call")).unwrap();
    assert_eq!(str_attr(call_span, "server.address"), Some("127.0.0.1"));
    assert!(matches!(call_span.attr("server.port"), Some(any_value::Value::IntValue(p)) if *p == i64::from(port)), "{call_span:?}");
    assert_ne!(str_attr(call_span, "mcp_health.transport.outcome"), Some("tls_failure"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_https_upstream_is_a_tls_failure_unless_verification_is_skipped() {
    let Some(py) = python() else {
        eprintln!("python3 not found: skipping");
        return;
    };
    let pki = Pki::generate();
    let sink = Sink::start().await;
    let (_server, port) = start_fake_https(py, &pki);
    let upstream = format!("https://127.0.0.1:{port}");

    // The upstream's CA is not among the ones trusted (another test CA): 502, and the span says why.
    let other = Pki::generate();
    let (tap_proc, tap) = start_tap(&upstream, &sink.endpoint(), &["--upstream-ca-file", &other.ca.display().to_string()]).await;
    let r = post(tap, None, initialize(7)).await;
    let tap_err = || std::fs::read_to_string(&tap_proc.err_path).unwrap_or_default();
    assert_eq!(r.status, 502, "{}\n{}", r.text(), tap_err());
    assert!(r.text().contains("tls_failure"), "{}\n{}", r.text(), tap_err());
    let failed = sink
        .wait_for(Duration::from_secs(15), "a span of the failed handshake", |s| {
            s.spans().into_iter().find(|x| str_attr(x, "mcp_health.transport.outcome").is_some())
        })
        .await;
    assert_eq!(str_attr(&failed, "mcp_health.transport.outcome"), Some("tls_failure"), "{failed:?}");
    assert!(matches!(failed.attr("mcp_health.request.sent"), Some(any_value::Value::BoolValue(false))), "{failed:?}");

    // --upstream-insecure-skip-verify: the same upstream is reached (unauthenticated).
    let (_tap2, tap2) = start_tap(&upstream, &sink.endpoint(), &["--upstream-insecure-skip-verify"]).await;
    let r = post(tap2, None, initialize(8)).await;
    assert_eq!(r.status, 200, "{}", r.text());

    // A CA file that cannot be read is a usage error naming it, before anything listens.
    let missing = Path::new(env!("CARGO_MANIFEST_DIR")).join("no-such-ca.pem");
    let out = Command::new(env!("CARGO_BIN_EXE_mcp-health"))
        .args(["tap", "--listen", "127.0.0.1:0", "--upstream", &upstream, "--upstream-ca-file"])
        .arg(&missing)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--upstream-ca-file") && err.contains("no-such-ca.pem"), "{err}");
}
