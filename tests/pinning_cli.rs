//! Contract pinning through the binary: `lock` pins the `before` discovery, `verify` names the
//! drift in `after`, and a replay with the lockfile marks the drifted tool's call `contract_drift`.
//! Expectations come from tests/fixtures/drift_after.expected.json.

use std::process::{Command, Output};

use serde_json::Value;

fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mcp-health")).args(args).output().expect("run mcp-health")
}

fn locked() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("mcp-health.lock.json").to_string_lossy().into_owned();
    let out = run(&["lock", &fixture("drift_before.jsonl"), "--lockfile", &path]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    (dir, path)
}

#[test]
fn lock_writes_a_sorted_lockfile_with_digests_and_definitions() {
    let (_d, path) = locked();
    let l: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let tools = &l["servers"]["tickets.example.test:8443"];
    for t in ["search_tickets", "close_ticket"] {
        assert!(tools[t]["digest"].as_str().is_some_and(|d| d.starts_with("sha256:")), "{t}: {l}");
        assert_eq!(tools[t]["projection_version"], "mcp-tool-v1");
        assert!(tools[t]["definition"].is_object(), "definition kept for explaining drift");
        assert!(tools[t]["definition"].get("icons").is_none(), "icons are not part of the contract");
    }
    // Locking the same discovery again changes nothing.
    let before = std::fs::read_to_string(&path).unwrap();
    assert!(run(&["lock", &fixture("drift_before.jsonl"), "--lockfile", &path]).status.success());
    assert_eq!(before, std::fs::read_to_string(&path).unwrap());
    // Pins are taken at first contact: a later discovery does not move them without --update.
    assert!(run(&["lock", &fixture("drift_after.jsonl"), "--lockfile", &path]).status.success());
    assert_eq!(before, std::fs::read_to_string(&path).unwrap());
}

#[test]
fn verify_names_each_drift_and_not_the_cosmetic_change() {
    let (_d, path) = locked();
    let exp: Value = serde_json::from_str(&std::fs::read_to_string(fixture("drift_after.expected.json")).unwrap()).unwrap();
    let out = run(&["verify", &fixture("drift_after.jsonl"), "--lockfile", &path]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "drift fails verify: {text}");
    for change in exp["drifted"]["search_tickets"].as_array().unwrap() {
        assert!(text.contains(change.as_str().unwrap()), "missing {change} in:\n{text}");
    }
    for t in exp["not_drifted"].as_array().unwrap() {
        assert!(!text.contains(&format!("DRIFT tickets.example.test:8443 {}", t.as_str().unwrap())), "{t} only changed icons:\n{text}");
    }
    // The pinned discovery itself verifies clean.
    let ok = run(&["verify", &fixture("drift_before.jsonl"), "--lockfile", &path]);
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stdout));
}

#[test]
fn a_call_on_a_drifted_tool_is_contract_drift() {
    let (_d, path) = locked();
    let exp: Value = serde_json::from_str(&std::fs::read_to_string(fixture("drift_after.expected.json")).unwrap()).unwrap();
    let out = run(&["replay", "--format", "json", "--lockfile", &path, &fixture("drift_after.jsonl")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    for (tool, state) in exp["call_states"].as_object().unwrap() {
        let v = lines.iter().find(|l| l["tool"] == *tool && l["method"] == "tools/call").unwrap_or_else(|| panic!("no verdict for {tool}"));
        assert_eq!(v["state"], *state, "{v}");
    }
    let drifted = lines.iter().find(|l| l["tool"] == "search_tickets" && l["method"] == "tools/call").unwrap();
    let mut kinds: Vec<&str> = drifted["contract_changes"].as_array().unwrap().iter().filter_map(|c| c["kind"].as_str()).collect();
    kinds.sort();
    assert_eq!(kinds, vec!["description_changed", "enum_narrowed", "parameter_renamed"], "{drifted}");
    // Without a lockfile nothing is pinned, so nothing drifts.
    let out = run(&["replay", "--format", "json", &fixture("drift_after.jsonl")]);
    assert!(!String::from_utf8_lossy(&out.stdout).contains("contract_drift"));
}

#[test]
fn a_broken_lockfile_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.json");
    std::fs::write(&path, "{ not json").unwrap();
    let out = run(&["verify", &fixture("drift_after.jsonl"), "--lockfile", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("bad.json"));
}

/// Issue 8 defect 13: a lockfile whose digest is shorter than a contract digest used to panic
/// `verify` (slicing the digest for display); it is refused when the lockfile is read, naming the
/// tool, with exit code 2 — in `verify`, `lock` and `replay --lockfile` alike.
#[test]
fn a_lockfile_with_a_short_digest_is_an_error_naming_the_tool_not_a_panic() {
    let (_d, path) = locked();
    let text = std::fs::read_to_string(&path).unwrap();
    let l: Value = serde_json::from_str(&text).unwrap();
    let good = l["servers"]["tickets.example.test:8443"]["search_tickets"]["digest"].as_str().unwrap().to_string();
    std::fs::write(&path, text.replace(&good, "sha256:abc")).unwrap();
    for args in [
        vec!["verify", &fixture("drift_after.jsonl"), "--lockfile", &path],
        vec!["lock", &fixture("drift_after.jsonl"), "--lockfile", &path],
    ] {
        let args: Vec<&str> = args.iter().map(|s| s.as_ref()).collect();
        let out = run(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(err.contains("search_tickets") && err.contains("64 hex"), "{args:?}: {err}");
    }
}
