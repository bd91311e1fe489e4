//! SPEC section 4's catalog fixture (six cases in 2025-11-25 form, and the same scenarios in
//! 2026-07-28 form) replayed end to end: OTLP/JSON in, one convergence verdict per session out.
//! Expected verdicts come from tests/fixtures/catalog_cases.expected.json (written from SPEC's text
//! by tests/fixtures/make_fixtures.py, not by running mcp-health).

use std::process::Command;

use serde_json::Value;
use sha2::{Digest, Sha256};

fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn expected() -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture("catalog_cases.expected.json")).expect("expected file")).expect("expected JSON")
}

fn replay_json() -> Vec<Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_mcp-health"))
        .args(["replay", "--format", "json", &fixture("catalog_cases.jsonl")])
        .output()
        .expect("run replay");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8").lines().map(|l| serde_json::from_str(l).expect("JSON line")).collect()
}

fn hash(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

#[test]
fn every_session_gets_exactly_its_convergence_verdict() {
    let exp = expected();
    let lines = replay_json();
    let rows: Vec<&Value> = lines.iter().filter(|l| l["catalog"] == Value::Bool(true)).collect();
    let sessions = exp["sessions"].as_object().expect("sessions");
    assert_eq!(rows.len(), sessions.len(), "one catalog verdict per session: {rows:#?}");
    for (key, want) in sessions {
        let row = rows.iter().find(|r| r["session_hash"] == hash(key)).unwrap_or_else(|| panic!("no verdict for {key}"));
        assert_eq!(row["convergence"], want["convergence"], "case {}: {row}", want["case"]);
        // Every verdict carries its evidence and a next step.
        assert!(row["reason"].as_str().is_some_and(|r| !r.is_empty()), "{row}");
        assert!(row["next_step"].as_str().is_some_and(|r| !r.is_empty()), "{row}");
        assert_eq!(row["projection_version"], "mcp-tool-v1");
    }
}

#[test]
fn case_3_is_stale_with_matching_digests_and_case_5_has_different_tool_digests() {
    let exp = expected();
    let lines = replay_json();
    let row = |key: &str| lines.iter().find(|r| r["session_hash"] == hash(key)).cloned().unwrap_or_else(|| panic!("{key}"));
    let c3 = row("session:cat-3");
    assert_eq!(c3["convergence"], "stale");
    assert_eq!(c3["discovered_digest"], c3["installed_digest"], "the digests match; the snapshot predates the signal");
    assert!(c3["signal_at_ns"].as_u64().unwrap() > c3["traversal_start_ns"].as_u64().unwrap());

    let c5 = row("session:cat-5");
    assert_eq!(c5["convergence"], "stale");
    assert_ne!(c5["discovered_digest"], c5["installed_digest"]);
    let before = exp["tool_digests"]["read_ticket_before"].as_str().unwrap();
    let after = exp["tool_digests"]["read_ticket_after"].as_str().unwrap();
    assert_ne!(before, after, "same name, different contract: a name-only inventory would miss it");
    let tools = c5["tool_digests"].as_array().unwrap();
    let read = tools.iter().find(|t| t["name"] == "read_ticket").expect("read_ticket discovered");
    assert_eq!(read["digest"], after, "the service's digest (from raw definitions) equals the fixture's independent JCS digest");
}

#[test]
fn case_1_converges_across_pages_with_the_cursor_chain_recorded() {
    let lines = replay_json();
    let c1 = lines.iter().find(|r| r["session_hash"] == hash("session:cat-1")).expect("case 1");
    assert_eq!(c1["convergence"], "converged");
    // Cursors are opaque server text: kept as hashes, so the chain still reads in order.
    assert_eq!(c1["cursor_chain"], serde_json::json!(["", &*mcp_health::normalize::redact::cursor("c1")]));
    // Page 2 carried raw definitions: converged means the service's registry digest, computed from
    // them, equals the installed digest the fixture computed independently.
    assert_eq!(c1["discovered_digest"], c1["installed_digest"]);
}

#[test]
fn a_call_after_ttl_expiry_is_stale_catalog() {
    let exp = expected();
    let lines = replay_json();
    let calls: Vec<&Value> = lines.iter().filter(|l| l["method"] == "tools/call").collect();
    assert_eq!(calls.len(), 1, "{calls:#?}");
    assert_eq!(calls[0]["state"], exp["stale_catalog_call"]["state"]);
    // Catalog traffic (pages, installs, notifications) produces no call verdicts of its own.
    let summary = lines.last().unwrap();
    assert_eq!(summary["calls"], 1);
}

#[test]
fn raw_definitions_never_reach_the_output() {
    let out = Command::new(env!("CARGO_BIN_EXE_mcp-health"))
        .args(["replay", "--format", "json", &fixture("catalog_cases.jsonl")])
        .output()
        .expect("run replay");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("inputSchema") && !text.contains("Read a ticket"), "tool definitions leaked: {text}");
}
