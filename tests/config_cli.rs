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

/// `--set`, as the collector's: a dotted key and a YAML scalar, applied over the file (or the
/// embedded default), checked like a value in the file, `${env:}` substituted.
#[test]
fn set_overrides_keys_and_is_checked_like_the_file() {
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.yaml");
        std::fs::write(&path, "receivers:\n  otlp:\n    protocols:\n      grpc:\n      http:\n").unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_mcp-health"));
        cmd.arg("validate").arg(&path).args(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    };
    let ok = run(
        &["--set", "processors.mcp_health.decision_wait=3s", "--set", "receivers.otlp.protocols.grpc.endpoint=${env:GRPC_AT}"],
        &[("GRPC_AT", "127.0.0.1:14317")],
    );
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    let bad = run(&["--set", "processors.mcp_health.decision_wait=0s"], &[]);
    let err = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(bad.status.code(), Some(2), "{err}");
    assert!(err.contains("processors.mcp_health.decision_wait: must be greater than zero"), "{err}");
    let unknown = run(&["--set", "processors.mcp_health.decison_wait=3s"], &[]);
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("decison_wait"), "an unknown key is refused");
    let malformed = run(&["--set", "processors.mcp_health"], &[]);
    assert!(String::from_utf8_lossy(&malformed.stderr).contains("give key=value"));
    let unset = run(&["--set", "receivers.otlp.protocols.grpc.endpoint=${env:NOT_SET_ANYWHERE}"], &[]);
    assert_eq!(unset.status.code(), Some(2), "an unset variable in a --set fails like one in the file");
}

/// `serve --set` moves a port without editing YAML: the embedded default, its gRPC receiver
/// moved to a free port, answers there.
#[test]
fn serve_set_moves_the_receiver_of_the_embedded_default() {
    let free = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let (grpc, http, prom, health) = (free(), free(), free(), free());
    let mut child = Command::new(env!("CARGO_BIN_EXE_mcp-health"))
        .arg("serve")
        .args(["--set", &format!("receivers.otlp.protocols.grpc.endpoint=127.0.0.1:{grpc}")])
        .args(["--set", &format!("receivers.otlp.protocols.http.endpoint=127.0.0.1:{http}")])
        .args(["--set", &format!("exporters.prometheus.endpoint=127.0.0.1:{prom}")])
        .args(["--set", &format!("extensions.health_check.endpoint=127.0.0.1:{health}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut listening = false;
    while std::time::Instant::now() < deadline && !listening {
        listening =
            std::net::TcpStream::connect(("127.0.0.1", grpc)).is_ok() && std::net::TcpStream::connect(("127.0.0.1", health)).is_ok();
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(listening, "the receiver and the health check moved to the --set ports");
}
