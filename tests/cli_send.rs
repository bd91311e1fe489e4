//! The commands a newcomer runs first: `send` (the quickstart's second step) against the real
//! service over both transports, `--version` with its commit, and the completion scripts.

mod support;

use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use support::*;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_mcp-health"))
}

fn fixture() -> String {
    format!("{}/tests/fixtures/eight_calls.jsonl", env!("CARGO_MANIFEST_DIR"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_moves_a_recording_to_now_and_the_service_decides_it_as_replay_does() {
    for (protocol, http) in [("grpc", false), ("http/json", true), ("http/protobuf", true)] {
        let svc = Service::start(Cfg::default()).await;
        let endpoint = if http { format!("http://{}", svc.http_addr()) } else { format!("http://{}", svc.grpc_addr()) };
        let before = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64;
        let out = tokio::task::spawn_blocking(move || {
            bin().args(["send", "--protocol", protocol, "--endpoint", &endpoint]).arg(fixture()).output().unwrap()
        })
        .await
        .unwrap();
        assert!(out.status.success(), "{protocol}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stdout).contains("sent 15 spans in 15 requests"), "{}", String::from_utf8_lossy(&out.stdout));
        let deadline = Instant::now() + Duration::from_secs(20);
        let vs = loop {
            let vs = svc.verdicts();
            if vs.len() >= 8 {
                break vs;
            }
            assert!(Instant::now() < deadline, "{protocol}: eight verdicts, have {vs:#?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let mut states: Vec<String> = vs.iter().map(|v| v["state"].as_str().unwrap().to_string()).collect();
        states.sort();
        let mut expected = vec![
            "transport_failed",
            "transport_failed",
            "protocol_error",
            "needs_auth",
            "needs_auth",
            "tool_failed",
            "false_success",
            "healthy",
        ];
        expected.sort();
        assert_eq!(states, expected, "{protocol}: the fixture's verdicts, as replay gives them");
        // Moved to now: a year-old recording would end long before the send.
        let latest = vs.iter().filter_map(|v| v["end_ns"].as_u64()).max().unwrap();
        assert!(latest + 60_000_000_000 > before, "{protocol}: the newest call ended within a minute of the send ({latest} vs {before})");
    }
}

#[test]
fn send_says_what_failed_and_exits_non_zero() {
    let out = bin().args(["send", "--endpoint", "http://127.0.0.1:9"]).arg(fixture()).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("request 1 was refused"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let out = bin().args(["send", "/no/such/file.jsonl"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/no/such/file.jsonl"));
}

#[test]
fn version_names_the_commit() {
    let out = bin().arg("--version").output().unwrap();
    let v = String::from_utf8_lossy(&out.stdout);
    assert!(v.starts_with(&format!("mcp-health {} (commit ", env!("CARGO_PKG_VERSION"))), "{v}");
    let commit = v.split("(commit ").nth(1).unwrap().trim_end().trim_end_matches(')');
    let hex = commit.trim_end_matches("-dirty");
    assert!(commit == "unknown" || (hex.len() == 12 && hex.chars().all(|c| c.is_ascii_hexdigit())), "{commit}");
    // In a git checkout (CI clones one) the commit is known.
    if std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.git")).exists() {
        assert_ne!(commit, "unknown");
    }
}

#[test]
fn completions_cover_every_command() {
    for shell in ["bash", "zsh", "fish"] {
        let out = bin().args(["completions", shell]).output().unwrap();
        assert!(out.status.success(), "{shell}");
        let script = String::from_utf8_lossy(&out.stdout);
        for cmd in ["serve", "replay", "validate", "send", "tap", "completions", "print-default-config"] {
            assert!(script.contains(cmd), "{shell} completes {cmd}");
        }
    }
    assert!(!bin().args(["completions", "cmd.exe"]).output().unwrap().status.success());
}
