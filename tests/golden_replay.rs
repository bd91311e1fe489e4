//! Golden files of what `replay --format json` (tests/golden/replay.txt) and the default table
//! (tests/golden/replay_table.txt) print for every recording under tests/fixtures (the reference
//! fixtures and the dialect recordings): any change of a verdict, a catalog line, an incident, a
//! column or the summary — a refactor that should change nothing, a new field on a line — shows
//! up here as a diff. A change that is meant: regenerate with
//! `MCP_HEALTH_UPDATE_GOLDEN=1 cargo test --test golden_replay` and review the diff.

use std::path::{Path, PathBuf};
use std::process::Command;

fn recordings() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    for dir in ["tests/fixtures", "tests/fixtures/dialects"] {
        for e in std::fs::read_dir(root.join(dir)).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "jsonl") {
                out.push(p.strip_prefix(root).unwrap().to_path_buf());
            }
        }
    }
    out.sort();
    out
}

#[test]
fn replay_output_is_unchanged() {
    compare_with_golden(&["replay", "--format", "json"], "tests/golden/replay.txt");
}

#[test]
fn replay_table_is_unchanged() {
    compare_with_golden(&["replay"], "tests/golden/replay_table.txt");
}

/// `mcp-health <args> <recording>` for every recording, against the golden file `golden`.
fn compare_with_golden(args: &[&str], golden: &str) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut got = String::new();
    for f in recordings() {
        let out = Command::new(env!("CARGO_BIN_EXE_mcp-health")).current_dir(root).args(args).arg(&f).output().unwrap();
        assert!(out.status.success(), "{}: {}", f.display(), String::from_utf8_lossy(&out.stderr));
        got.push_str(&format!("== {}\n", f.display()));
        got.push_str(&String::from_utf8_lossy(&out.stdout));
    }
    let golden = root.join(golden);
    if std::env::var("MCP_HEALTH_UPDATE_GOLDEN").as_deref() == Ok("1") {
        std::fs::write(&golden, &got).unwrap();
        println!("UPDATED: {}", golden.display());
        return;
    }
    let want = std::fs::read_to_string(&golden).unwrap();
    if got != want {
        let diff: Vec<String> = want
            .lines()
            .zip(got.lines())
            .enumerate()
            .filter(|(_, (w, g))| w != g)
            .take(5)
            .map(|(i, (w, g))| format!("line {}:\n  golden: {w}\n  now:    {g}", i + 1))
            .collect();
        panic!(
            "replay output changed ({} lines golden, {} now); first differences:\n{}\n(meant? MCP_HEALTH_UPDATE_GOLDEN=1 cargo test --test golden_replay)",
            want.lines().count(),
            got.lines().count(),
            diff.join("\n")
        );
    }
}
