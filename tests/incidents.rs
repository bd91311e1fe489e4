//! Incidents through the binary (issue 4): five failures on one expired credential are one
//! incident with retry count 5; a retry that passes without outcome evidence leaves it open; a
//! call whose outcome was confirmed resolves it. Expectations come from the fixtures'
//! `expected.json` files, written from SPEC section 6.

use std::process::Command;

use serde_json::Value;

fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn expected(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture(name)).expect("expected file")).expect("JSON")
}

fn incident_lines(files: &[&str]) -> Vec<Value> {
    let mut args = vec!["replay".to_string(), "--format".into(), "json".into()];
    args.extend(files.iter().map(|f| fixture(f)));
    let out = Command::new(env!("CARGO_BIN_EXE_mcp-health")).args(&args).output().expect("run replay");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("JSON line"))
        .filter(|l| l["incident"] == true)
        .collect()
}

#[test]
fn five_failures_on_one_expired_credential_are_one_incident_that_a_bare_retry_does_not_resolve() {
    let exp = expected("incidents_five_expired.expected.json");
    let lines = incident_lines(&["incidents_five_expired.jsonl"]);
    let transitions: Vec<&str> = lines.iter().map(|l| l["transition"].as_str().unwrap()).collect();
    let want: Vec<&str> = exp["transitions"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(transitions, want);
    let ids: std::collections::BTreeSet<&str> = lines.iter().map(|l| l["row"]["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len() as u64, exp["incidents"].as_u64().unwrap(), "one cause, one incident");
    let last = &lines.last().unwrap()["row"];
    assert_eq!(last["retry_count"], exp["retry_count"]);
    assert_eq!(last["state"], exp["state_after_unverified_retry"]);
    assert_eq!(last["cause"]["first_failed_layer"], "authorization");
    assert!(last["cause"]["credential_hash"].as_str().is_some_and(|h| !h.contains("key-7731")), "the credential is hashed");
    assert_eq!(last["agents"], serde_json::json!(["agent"]));
}

#[test]
fn an_observed_outcome_resolves_it() {
    let exp = expected("incidents_resolved.expected.json");
    let lines = incident_lines(&["incidents_five_expired.jsonl", "incidents_resolved.jsonl"]);
    let transitions: Vec<&str> = lines.iter().map(|l| l["transition"].as_str().unwrap()).collect();
    let want: Vec<&str> = exp["transitions_with_first_file"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(transitions, want);
    assert_eq!(lines.last().unwrap()["row"]["state"], "resolved");
    assert_eq!(lines.last().unwrap()["row"]["verifier_result"], "confirmed");
}

#[test]
fn the_credential_id_never_appears_in_any_output() {
    let out = Command::new(env!("CARGO_BIN_EXE_mcp-health"))
        .args(["replay", "--format", "json", &fixture("incidents_five_expired.jsonl")])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&out.stdout).contains("key-7731"));
    let out = Command::new(env!("CARGO_BIN_EXE_mcp-health")).args(["replay", &fixture("incidents_five_expired.jsonl")]).output().unwrap();
    assert!(!String::from_utf8_lossy(&out.stdout).contains("key-7731"));
}
