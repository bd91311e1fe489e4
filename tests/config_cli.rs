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
/// moved to a free port, answers there. The ports are found free and then released, so a test
/// running beside this one may take one first: a service that exits because a port was taken is
/// started again on new ports (at most three times); one that stays up must answer on them.
#[test]
fn serve_set_moves_the_receiver_of_the_embedded_default() {
    let free = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut listening = false;
    for _attempt in 0..3 {
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
        let mut exited = false;
        while std::time::Instant::now() < deadline && !listening && !exited {
            listening =
                std::net::TcpStream::connect(("127.0.0.1", grpc)).is_ok() && std::net::TcpStream::connect(("127.0.0.1", health)).is_ok();
            exited = !listening && child.try_wait().ok().flatten().is_some();
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        if listening || !exited {
            break;
        }
        eprintln!("NOTE: mcp-health exited before listening (a --set port taken meanwhile?); again on new ports");
    }
    assert!(listening, "the receiver and the health check moved to the --set ports");
}

/// (what, the YAML, environment variables, the key both messages must name)
type Case<'a> = (&'a str, String, Vec<(&'a str, &'a str)>, &'a str);

/// What `serve` refuses at start, `validate` refuses too, with the same message key: the checks
/// `serve` runs before binding are the ones `validate` runs (the `OTEL_EXPORTER_OTLP_*`
/// variables, endpoint schemes, config providers, the memory limiter's keys, certificates, the
/// lockfile, an exporter pointed at its own receiver).
#[test]
fn validate_refuses_what_serve_refuses_with_the_same_key() {
    let dir = tempfile::tempdir().unwrap();
    let free = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let own = free();
    let own_url = format!("http://127.0.0.1:{own}");
    let base = |grpc: u16, extra: &str| {
        format!("receivers:\n  otlp:\n    protocols:\n      grpc:\n        endpoint: 127.0.0.1:{grpc}\n      http:\n        endpoint: 127.0.0.1:0\n{extra}")
    };
    let exporter = |endpoint: &str| format!("exporters:\n  otlp:\n    endpoint: {endpoint}\n");
    let dead = "http://127.0.0.1:1";
    let cases: Vec<Case> = vec![
        (
            "unknown OTLP protocol",
            base(0, ""),
            vec![("OTEL_EXPORTER_OTLP_ENDPOINT", dead), ("OTEL_EXPORTER_OTLP_PROTOCOL", "thrift")],
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ),
        (
            "bad OTLP timeout",
            base(0, ""),
            vec![("OTEL_EXPORTER_OTLP_ENDPOINT", dead), ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "soon")],
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
        ),
        (
            "bad OTLP insecure",
            base(0, ""),
            vec![("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4317"), ("OTEL_EXPORTER_OTLP_INSECURE", "maybe")],
            "OTEL_EXPORTER_OTLP_INSECURE",
        ),
        ("unix endpoint in the file", base(0, &exporter("unix:///run/otel.sock")), vec![], "unix://"),
        ("unix endpoint in a variable", base(0, ""), vec![("OTEL_EXPORTER_OTLP_ENDPOINT", "unix:///run/otel.sock")], "unix://"),
        ("unreadable file reference", base(0, &exporter("${file:/nonexistent/endpoint}")), vec![], "config provider file"),
        ("unsupported provider", base(0, &exporter("${http://example.invalid/e}")), vec![], "config provider http"),
        ("unset variable", base(0, &exporter("${env:NOT_SET_ANYWHERE}")), vec![], "NOT_SET_ANYWHERE"),
        (
            "limit_mib and limit_percentage",
            base(0, "processors:\n  memory_limiter:\n    limit_mib: 100\n    limit_percentage: 50\n"),
            vec![],
            "processors.memory_limiter.limit_percentage",
        ),
        (
            "receiver certificate missing",
            base(0, "").replace(
                "      http:\n",
                "      http:\n        tls:\n          cert_file: /nonexistent/c.pem\n          key_file: /nonexistent/k.pem\n",
            ),
            vec![],
            "receivers.otlp.protocols.http.tls.cert_file",
        ),
        ("lockfile missing", base(0, "processors:\n  mcp_health:\n    lockfile: /nonexistent/mcp.lock\n"), vec![], "/nonexistent/mcp.lock"),
        (
            "exporter at its own receiver",
            base(own, ""),
            vec![("OTEL_EXPORTER_OTLP_ENDPOINT", own_url.as_str())],
            "receivers.otlp.protocols.grpc.endpoint",
        ),
    ];
    for (i, (what, yaml, env, key)) in cases.into_iter().enumerate() {
        let path = dir.path().join(format!("c{i}.yaml"));
        std::fs::write(&path, &yaml).unwrap();
        let command = |args: &[&str]| {
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_mcp-health"));
            cmd.env_clear().args(args).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped());
            for (k, v) in &env {
                cmd.env(k, v);
            }
            cmd
        };
        let v = command(&["validate", path.to_str().unwrap()]).output().unwrap();
        let v_err = String::from_utf8_lossy(&v.stderr);
        assert_eq!(v.status.code(), Some(2), "{what}: validate must refuse it\n{v_err}");
        assert!(v_err.contains(key), "{what}: validate names {key}\n{v_err}");
        // `serve` must refuse it before binding; one that starts instead is stopped and fails the case.
        let mut child = command(&["serve", "--config", path.to_str().unwrap()]).spawn().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break Some(s);
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let mut s_err = String::new();
        std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut s_err).unwrap();
        let status = status.unwrap_or_else(|| panic!("{what}: serve started although validate refused\n{s_err}"));
        assert!(!status.success(), "{what}: serve must refuse it\n{s_err}");
        assert!(s_err.contains(key), "{what}: serve names {key}\n{s_err}");
        let line = |t: &str| t.lines().find(|l| l.starts_with("error:")).map(str::to_string);
        assert_eq!(line(&v_err), line(&s_err), "{what}: the same message");
    }
}

/// `${file:PATH}` is the file's content less its final newline, in `validate` as in `serve`.
#[test]
fn file_references_are_read_by_validate() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("endpoint");
    std::fs::write(&f, "http://127.0.0.1:1\n").unwrap();
    let out = validate(&format!("exporters:\n  otlp:\n    endpoint: ${{file:{}}}\n", f.display()), &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}
