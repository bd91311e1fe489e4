//! `mcp-health validate FILE` through the binary (issue 10): a bad value found after parsing is
//! named with its key, line and column, like a YAML error; substitution happens per value.

use std::process::{Command, Output};

fn validate(yaml: &str, env: &[(&str, &str)]) -> Output {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("c.yaml");
    std::fs::write(&path, yaml).expect("write config");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mcp-health"));
    cmd.arg("validate").arg(&path).env_remove("TOK").env_remove("UNSET_IN_COMMENT");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run mcp-health")
}

#[test]
fn validate_names_key_line_and_column_of_a_bad_value() {
    let out = validate("processors:\n  mcp_health:\n    decision_wait: 0s\n", &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("line 3, column 5: processors.mcp_health.decision_wait: must be greater than zero"), "{err}");
}

#[test]
fn validate_substitutes_values_not_text() {
    // A `#` in a value is not a comment, a newline is not a key, a reference in a comment is not read.
    let yaml = "# ${env:UNSET_IN_COMMENT}\nexporters:\n  otlp:\n    endpoint: http://127.0.0.1:4317\n    headers:\n      authorization: ${env:TOK}\n";
    let out = validate(yaml, &[("TOK", "Bearer abc #def\ncompression: bogus")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}
