//! Issue 9: each verifier check kind against its real counterpart — an HTTP server, files, a
//! command, SQLite, and PostgreSQL (Debian's `postgresql`, started here on a unix socket) — and
//! the runner's rules: an error or a timeout is no finding, attempts retry a `missing`. The SQL
//! checks need the `sql` feature (on by default).

mod support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use mcp_health::testing::tap::verify::check::{Finding, VerifyError};
use mcp_health::testing::tap::verify::client;
use mcp_health::testing::tap::verify::rules::RuleSet;
use mcp_health::testing::tap::verify::verify;
use serde_json::{json, Value};

fn rules(yaml: &str) -> RuleSet {
    RuleSet::parse(yaml, Path::new("test.yaml"), &|k| (k == "DEST_TOKEN").then(|| "tok-123".to_string())).expect("rules compile")
}

async fn run_rule(rs: &RuleSet, i: usize, call: &Value) -> Result<Finding, VerifyError> {
    let http = client::http_client(Duration::from_secs(2));
    verify(&rs.rules[i], call, &http).await.1
}

/// A destination with records: `GET /records/{id}` answers the record or 404, `/boom` 500,
/// `/slow` after 3 s; the Authorization header must carry the token.
async fn destination() -> std::net::SocketAddr {
    use axum::extract::Path as P;
    use axum::http::{HeaderMap, StatusCode};
    use axum::routing::get;
    let app = axum::Router::new()
        .route(
            "/records/{id}",
            get(|P(id): P<String>, h: HeaderMap| async move {
                if h.get("authorization").and_then(|v| v.to_str().ok()) != Some("Bearer tok-123") {
                    return (StatusCode::UNAUTHORIZED, String::new());
                }
                match id.as_str() {
                    "r-1" => (StatusCode::OK, json!({"id": "r-1", "title": "printer on fire", "n": 7}).to_string()),
                    _ => (StatusCode::NOT_FOUND, String::new()),
                }
            }),
        )
        .route("/boom", get(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "") }))
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(3)).await;
                "late"
            }),
        );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    addr
}

#[tokio::test]
async fn http_checks_against_a_real_server() {
    let addr = destination().await;
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap(); // closed below
    let rs = rules(&format!(
        r#"
verifiers:
  - name: rec
    tool: create_ticket
    http:
      url: "http://{addr}/records/{{/result/structuredContent/id}}"
      headers: {{Authorization: "Bearer ${{env:DEST_TOKEN}}"}}
      body_pointer: /title
      equals: "{{/arguments/title}}"
  - name: noauth
    tool: x
    http: {{url: "http://{addr}/records/r-1"}}
  - name: boom
    tool: x
    http: {{url: "http://{addr}/boom"}}
  - name: slow
    tool: x
    timeout: 200ms
    http: {{url: "http://{addr}/slow"}}
  - name: dead
    tool: x
    http: {{url: "http://{dead}/records/r-1"}}
  - name: number
    tool: x
    http:
      url: "http://{addr}/records/r-1"
      headers: {{Authorization: "Bearer ${{env:DEST_TOKEN}}"}}
      body_pointer: /n
      equals: "{{/arguments/n}}"
"#
    ));
    let call = |id: &str, title: &str| json!({"arguments": {"title": title, "n": "7"}, "result": {"structuredContent": {"id": id}}});
    assert_eq!(run_rule(&rs, 0, &call("r-1", "printer on fire")).await, Ok(Finding::Confirmed));
    assert_eq!(run_rule(&rs, 0, &call("r-1", "printer fixed")).await, Ok(Finding::Failed), "the deliverable check fails");
    assert_eq!(run_rule(&rs, 0, &call("r-2", "printer on fire")).await, Ok(Finding::Missing), "404: no effect");
    assert_eq!(run_rule(&rs, 0, &json!({"arguments": {"title": "t"}, "result": null})).await, Err(VerifyError::PointerUnresolved));
    assert_eq!(run_rule(&rs, 1, &call("r-1", "")).await, Err(VerifyError::BadResponse), "a 401 from the destination proves nothing");
    assert_eq!(run_rule(&rs, 2, &call("r-1", "")).await, Err(VerifyError::BadResponse), "a 500 proves nothing");
    assert_eq!(run_rule(&rs, 3, &call("r-1", "")).await, Err(VerifyError::Timeout));
    assert_eq!(run_rule(&rs, 4, &call("r-1", "")).await, Err(VerifyError::Unreachable));
    assert_eq!(run_rule(&rs, 5, &call("r-1", "")).await, Ok(Finding::Confirmed), "\"7\" equals 7");
}

#[tokio::test]
async fn file_checks_against_real_files() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("report.txt"), b"quarterly numbers").unwrap();
    std::fs::write(dir.path().join("empty.txt"), b"").unwrap();
    let digest = "8b0b1f7a8d5e3b7c0b0f5a0d9c1e4b8a3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f"; // not the file's
    let real = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(b"quarterly numbers"))
    };
    let d = dir.path().display();
    let rs = rules(&format!(
        r#"
- {{name: f, tool: w, file: {{base_dir: "{d}", path: "{{/arguments/name}}", sha256: "{{/arguments/sha256}}", min_size: 1}}}}
- {{name: g, tool: w, file: {{base_dir: "{d}", path: "{{/arguments/name}}", min_size: 1}}}}
"#
    ));
    let call = |name: &str, sha: &str| json!({"arguments": {"name": name, "sha256": sha}, "result": {"structuredContent": {}}});
    assert_eq!(run_rule(&rs, 0, &call("report.txt", &real)).await, Ok(Finding::Confirmed));
    assert_eq!(run_rule(&rs, 0, &call("report.txt", digest)).await, Ok(Finding::Failed), "wrong digest");
    assert_eq!(run_rule(&rs, 0, &call("nothing.txt", &real)).await, Ok(Finding::Missing));
    assert_eq!(run_rule(&rs, 1, &call("empty.txt", "")).await, Ok(Finding::Failed), "below min_size");
    assert_eq!(run_rule(&rs, 1, &call("report.txt", "")).await, Ok(Finding::Confirmed));
}

#[tokio::test]
async fn command_checks_run_without_a_shell() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("present"), b"x").unwrap();
    let d = dir.path().display();
    // `test -f` with an argument that a shell would expand: no shell, so it is one literal path.
    let rs = rules(&format!(
        r#"
- {{name: t, tool: c, command: {{argv: [test, -f, "{d}/{{/arguments/file}}"]}}}}
- {{name: s, tool: c, timeout: 200ms, command: {{argv: [sleep, "5"]}}}}
- {{name: n, tool: c, command: {{argv: [/nonexistent/verifier-binary]}}}}
"#
    ));
    assert_eq!(run_rule(&rs, 0, &json!({"arguments": {"file": "present"}})).await, Ok(Finding::Confirmed));
    assert_eq!(run_rule(&rs, 0, &json!({"arguments": {"file": "absent"}})).await, Ok(Finding::Failed), "non-zero exit");
    assert_eq!(run_rule(&rs, 0, &json!({"arguments": {"file": "*"}})).await, Ok(Finding::Failed), "no glob expansion");
    assert_eq!(run_rule(&rs, 0, &json!({"arguments": {"file": "present; true"}})).await, Ok(Finding::Failed), "no shell");
    assert_eq!(run_rule(&rs, 1, &json!({})).await, Err(VerifyError::Timeout));
    assert_eq!(run_rule(&rs, 2, &json!({})).await, Err(VerifyError::Other), "a verifier that cannot start is no finding");
}

#[cfg(feature = "sql")]
#[tokio::test]
async fn sqlite_checks_bind_their_parameters() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("items.db");
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute_batch("create table items (id integer primary key, name text, version integer); insert into items values (1, 'a', 3);")
        .unwrap();
    drop(conn);
    let rs = rules(&format!(
        r#"
- {{name: q, tool: i, sql: {{sqlite: "{}", query: "select version from items where id = ?1 and name = ?2", params: ["{{/result/structuredContent/id}}", "{{/arguments/name}}"], min_version: "{{/arguments/version}}"}}}}
- {{name: missingdb, tool: i, sql: {{sqlite: "{}/nope.db", query: "select 1"}}}}
"#,
        db.display(),
        dir.path().display()
    ));
    let call =
        |id: i64, name: &str, v: i64| json!({"arguments": {"name": name, "version": v}, "result": {"structuredContent": {"id": id}}});
    assert_eq!(run_rule(&rs, 0, &call(1, "a", 3)).await, Ok(Finding::Confirmed));
    assert_eq!(run_rule(&rs, 0, &call(1, "a", 4)).await, Ok(Finding::Failed), "row there, version too old");
    assert_eq!(run_rule(&rs, 0, &call(2, "a", 1)).await, Ok(Finding::Missing));
    // An injection attempt is a value, not SQL.
    assert_eq!(run_rule(&rs, 0, &call(1, "a' or '1'='1", 0)).await, Ok(Finding::Missing));
    assert_eq!(run_rule(&rs, 1, &json!({})).await, Err(VerifyError::Unreachable));
}

/// `initdb` + `postgres` of Debian's `postgresql`, on a unix socket in a temporary directory.
#[cfg(feature = "sql")]
struct Postgres {
    dir: tempfile::TempDir,
    child: std::process::Child,
}

#[cfg(feature = "sql")]
impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(feature = "sql")]
fn postgres_bin() -> Option<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir("/usr/lib/postgresql").ok()?.filter_map(|e| e.ok()).map(|e| e.path().join("bin")).collect();
    v.sort();
    v.into_iter().rev().find(|b| b.join("initdb").exists())
}

#[cfg(feature = "sql")]
fn start_postgres() -> Option<Postgres> {
    let Some(bin) = postgres_bin() else {
        assert!(std::env::var_os("CI").is_none(), "Debian's postgresql is missing: run scripts/install-test-deps");
        println!("SKIPPED: PostgreSQL check (Debian's postgresql is not installed; scripts/install-test-deps installs it)");
        return None;
    };
    let dir = tempfile::Builder::new().prefix("mcp-health-pg").tempdir().unwrap();
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    // PostgreSQL refuses to run as root: as root, run it as the `postgres` user the package made.
    let wrap = |prog: &Path| {
        let mut c = if root {
            let mut c = std::process::Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(prog);
            c
        } else {
            std::process::Command::new(prog)
        };
        c.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
        c
    };
    let data = dir.path().join("data");
    if root {
        std::process::Command::new("chown").args(["-R", "postgres"]).arg(dir.path()).status().unwrap();
    }
    let ok = wrap(&bin.join("initdb")).args(["-A", "trust", "-U", "postgres", "-D"]).arg(&data).status().unwrap();
    assert!(ok.success(), "initdb failed");
    let child = wrap(&bin.join("postgres"))
        .arg("-D")
        .arg(&data)
        .args(["-c", "listen_addresses=", "-c"])
        .arg(format!("unix_socket_directories={}", dir.path().display()))
        .spawn()
        .unwrap();
    Some(Postgres { dir, child })
}

#[cfg(feature = "sql")]
#[tokio::test]
async fn postgres_checks_against_a_real_server() {
    let Some(pg) = start_postgres() else { return };
    let url = format!("host={} user=postgres dbname=postgres", pg.dir.path().display());
    // Wait until it accepts connections.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let client = loop {
        match tokio_postgres::connect(&url, tokio_postgres::NoTls).await {
            Ok((c, conn)) => {
                tokio::spawn(conn);
                break c;
            }
            Err(e) => {
                assert!(std::time::Instant::now() < deadline, "postgres did not start: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    client
        .batch_execute("create table orders (id bigint primary key, sku text, version int); insert into orders values (42, 'ab-1', 5);")
        .await
        .unwrap();
    let rs = Arc::new(rules(&format!(
        r#"
- {{name: o, tool: order, sql: {{postgres: "{url}", query: "select version from orders where id = $1 and sku = $2", params: ["{{/result/structuredContent/id}}", "{{/arguments/sku}}"], min_version: "{{/arguments/v}}"}}}}
- {{name: down, tool: order, timeout: 2s, sql: {{postgres: "host=/nonexistent-socket-dir user=postgres", query: "select 1"}}}}
"#
    )));
    let call = |id: i64, sku: &str, v: i64| json!({"arguments": {"sku": sku, "v": v}, "result": {"structuredContent": {"id": id}}});
    assert_eq!(run_rule(&rs, 0, &call(42, "ab-1", 5)).await, Ok(Finding::Confirmed));
    assert_eq!(run_rule(&rs, 0, &call(42, "ab-1", 6)).await, Ok(Finding::Failed));
    assert_eq!(run_rule(&rs, 0, &call(43, "ab-1", 1)).await, Ok(Finding::Missing));
    assert_eq!(run_rule(&rs, 0, &call(42, "ab-1' or 'x'='x", 0)).await, Ok(Finding::Missing), "bound, not spliced");
    assert_eq!(run_rule(&rs, 1, &json!({})).await, Err(VerifyError::Unreachable));
}

#[tokio::test]
async fn attempts_retry_a_missing_effect_until_it_appears() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("late.txt");
    let rs = rules(&format!("- {{name: late, tool: t, attempts: 10, backoff: 50ms, file: {{path: \"{}\"}}}}", path.display()));
    let p = path.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(150)).await;
        std::fs::write(p, b"x").unwrap();
    });
    assert_eq!(run_rule(&rs, 0, &json!({})).await, Ok(Finding::Confirmed), "a later attempt sees the effect");
    let rs1 = rules(&format!("- {{name: once, tool: t, file: {{path: \"{}/never\"}}}}", dir.path().display()));
    assert_eq!(run_rule(&rs1, 0, &json!({})).await, Ok(Finding::Missing));
}

/// A full queue is counted and reported on the call (`queue_full`: no finding, the call stays
/// unverified); the findings' spans carry the rule and fixed words only, never the call's values.
#[tokio::test]
async fn a_full_verifier_queue_is_counted_and_nothing_of_the_call_leaves() {
    use mcp_health::testing::tap::export::{spawn, ExportSettings};
    use mcp_health::testing::tap::verify::{VerifierPool, VerifyJob};
    let sink = support::Sink::start().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("PLANTED_FILE"), b"x").unwrap();
    let rs = Arc::new(rules(&format!(
        "verifiers:\n  - {{name: slowcheck, tool: t, delay: 200ms, file: {{base_dir: \"{}\", path: \"{{/arguments/name}}\"}}}}\nlimits: {{queue_size: 1, concurrency: 1}}\n",
        dir.path().display()
    )));
    let (spans, exporter) = spawn(ExportSettings::new(sink.endpoint(), "verify-test")).unwrap();
    let (pool, runner) = VerifierPool::spawn(rs, spans.clone(), None);
    // Five at once into one place of queue and one check at a time: at most two are taken (one
    // running, one waiting for its permit) and one queued, so at least two find the queue full.
    for i in 0..5u8 {
        pool.submit(VerifyJob {
            rule: 0,
            call: json!({"arguments": {"name": "PLANTED_FILE", "token": "PLANTED_TOKEN_abc"}, "result": {"structuredContent": {"secret": "PLANTED_RESULT"}}}),
            trace_id: [i + 1; 16],
            call_span_id: [9; 8],
            request_id: "7".into(),
            tool: "t".into(),
            call_start_ns: 1,
        });
    }
    let stats = pool.stats.clone();
    drop(pool);
    let st = runner.finish(Duration::from_secs(10)).await;
    drop(spans);
    exporter.finish(Duration::from_secs(5)).await;
    let (full, ran) = (st.get(&st.queue_full), st.get(&st.confirmed));
    assert!(full >= 2 && full + ran == 5, "queue_full {full}, confirmed {ran}");
    assert_eq!(stats.get(&stats.submitted), 5);
    let got = sink.spans();
    let errors = got.iter().filter(|s| s.attr_str("mcp_health.outcome.error") == Some("queue_full")).count() as u64;
    let findings: Vec<_> = got.iter().filter(|s| s.attr_str("mcp_health.outcome.result") == Some("confirmed")).collect();
    assert_eq!((errors, findings.len() as u64), (full, ran), "each is reported on its call: {}", sink.dump());
    let f = findings[0];
    assert_eq!(f.attr_str("mcp_health.outcome.verifier"), Some("slowcheck"));
    assert_eq!(f.attr_str("mcp_health.outcome.method"), Some("file_digest"));
    assert_eq!(f.attr_str("mcp_health.outcome.request_id"), Some("7"));
    assert_eq!(f.span.parent_span_id, vec![9; 8], "under the call's span");
    let all = format!("{:?}", sink.trace_requests());
    assert!(!all.contains("PLANTED") && !all.contains(&dir.path().display().to_string()), "{all}");
}

/// `https://` destinations: a rule's `ca_file` is trusted; without it the system's roots are, so
/// a destination they do not vouch for is `unreachable` — no finding, never `missing`.
#[tokio::test]
async fn http_checks_speak_tls_to_https_destinations() {
    use rustls::pki_types::pem::PemObject;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let pki = support::pki::Pki::generate();
    let certs = mcp_health::testing::config::tls::read_certificates("cert", pki.server_cert.to_str().unwrap()).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::from_pem_file(&pki.server_key).unwrap();
    let cfg = rustls::ServerConfig::builder_with_provider(mcp_health::testing::config::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = l.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else { return };
                let mut buf = vec![0u8; 4096];
                let _ = tls.read(&mut buf).await;
                let body = r#"{"id":"r-1","title":"printer on fire"}"#;
                let resp = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = tls.write_all(resp.as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    let rs = rules(&format!(
        r#"
- {{name: trusted, tool: t, http: {{url: "https://localhost:{port}/records/r-1", ca_file: "{}", body_pointer: /title, equals: "{{/arguments/title}}"}}}}
- {{name: system, tool: t, http: {{url: "https://localhost:{port}/records/r-1"}}}}
"#,
        pki.ca.display()
    ));
    let call = json!({"arguments": {"title": "printer on fire"}});
    assert_eq!(run_rule(&rs, 0, &call).await, Ok(Finding::Confirmed));
    assert_eq!(run_rule(&rs, 1, &call).await, Err(VerifyError::Unreachable), "an untrusted certificate is no finding");
    let bad = RuleSet::parse("- {name: x, tool: t, http: {url: 'https://h/', ca_file: /nonexistent/ca.pem}}", Path::new("v"), &|_| None);
    assert!(bad.unwrap_err().to_string().contains("ca_file"));
}

/// Issue 22: a hostile server (and the LLM-chosen arguments) cannot turn a verifier into its
/// tool: the file check stays beneath its base_dir (no `..`, no symbolic link to /etc/hostname).
#[tokio::test]
async fn file_checks_stay_beneath_their_base_dir() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("reports");
    std::fs::create_dir(&base).unwrap();
    std::fs::write(base.join("q3.txt"), b"numbers").unwrap();
    std::os::unix::fs::symlink("/etc/hostname", base.join("planted.txt")).unwrap();
    std::os::unix::fs::symlink("/etc", base.join("etc")).unwrap();
    let hostname_digest = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(std::fs::read("/etc/hostname").unwrap_or_default()))
    };
    let rs = rules(&format!(
        "- {{name: f, tool: w, file: {{base_dir: \"{}\", path: \"{{/arguments/name}}\", sha256: \"{{/arguments/sha256}}\"}}}}\n",
        base.display()
    ));
    let call = |name: &str| json!({"arguments": {"name": name, "sha256": hostname_digest}});
    assert_eq!(run_rule(&rs, 0, &call("../../../etc/hostname")).await, Err(VerifyError::TemplateError), "`..` is refused, never read");
    assert_eq!(run_rule(&rs, 0, &call("/etc/hostname")).await, Err(VerifyError::TemplateError), "an absolute path is refused");
    assert_eq!(run_rule(&rs, 0, &call("planted.txt")).await, Ok(Finding::Failed), "a symbolic link is not followed");
    assert_eq!(run_rule(&rs, 0, &call("etc/hostname")).await, Ok(Finding::Failed), "nor a linked directory on the way");
    // And a rule that takes the path and the digest from the result does not load at all.
    let e =
        RuleSet::parse("- {name: r, tool: w, file: {path: '{/result/path}', sha256: '{/result/sha256}'}}", Path::new("t.yaml"), &|_| None)
            .unwrap_err()
            .to_string();
    assert!(e.contains("base_dir"), "{e}");
}

/// Issue 22: a command verifier is a deputy, not a shell: a value that starts with `-` is no
/// option (`git diff --output=FILE` writes no file), the child gets only PATH and its rule's own
/// variables (never another rule's credentials), and a timeout kills its whole process group.
#[tokio::test]
async fn command_checks_take_no_options_and_no_secrets_from_the_call() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    std::fs::create_dir(&repo).unwrap();
    let git = |args: &[&str]| {
        std::process::Command::new("git").args(args).current_dir(&repo).output().map(|o| o.status.success()).unwrap_or(false)
    };
    let have_git = git(&["init", "-q"]);
    let pwned = dir.path().join("pwned");
    let envfile = dir.path().join("env.txt");
    let pidfile = dir.path().join("pid.txt");
    let env = |k: &str| match k {
        "PATH" => std::env::var("PATH").ok(),
        "RULE_TOKEN" => Some("rule-token-for-this-rule".to_string()),
        "OTHER_RULE_SECRET" => Some("PLANTED_OTHER_SECRET".to_string()),
        _ => None,
    };
    let yaml = format!(
        r#"
- {{name: diff, tool: d, command: {{argv: [git, diff, "{{/arguments/rev}}"], cwd: "{repo}"}}}}
- {{name: safe, tool: d, command: {{argv: [git, diff, "--", "{{/arguments/rev}}"], cwd: "{repo}"}}}}
- {{name: envdump, tool: e, command: {{argv: [sh, -c, "env > {envfile}"], env: [RULE_TOKEN]}}}}
- {{name: group, tool: g, timeout: 500ms, command: {{argv: [sh, -c, "sleep 30 & echo $! > {pidfile}; wait"]}}}}
- {{name: other, tool: o, command: {{argv: [sh, -c, "exit 0"], env: [OTHER_RULE_SECRET]}}}}
"#,
        repo = repo.display(),
        envfile = envfile.display(),
        pidfile = pidfile.display()
    );
    let rs = RuleSet::parse(&yaml, Path::new("t.yaml"), &env).expect("rules compile");
    let attack = json!({"arguments": {"rev": format!("--output={}", pwned.display())}});
    assert_eq!(run_rule(&rs, 0, &attack).await, Err(VerifyError::TemplateError), "a value starting with `-` is refused");
    if have_git {
        // After `--` it is a path, not an option: git looks for it and writes nothing.
        let _ = run_rule(&rs, 1, &attack).await;
    } else {
        eprintln!("SKIPPED (git absent): the `--` half of the option-injection check");
    }
    assert!(!pwned.exists(), "no file was written through an option");

    assert_eq!(run_rule(&rs, 2, &json!({})).await, Ok(Finding::Confirmed));
    let seen = std::fs::read_to_string(&envfile).unwrap();
    assert!(seen.contains("RULE_TOKEN=rule-token-for-this-rule") && seen.contains("PATH="), "{seen}");
    assert!(
        !seen.contains("PLANTED_OTHER_SECRET") && !seen.contains("OTHER_RULE_SECRET"),
        "another rule's secret reached the child: {seen}"
    );

    assert_eq!(run_rule(&rs, 3, &json!({})).await, Err(VerifyError::Timeout));
    let pid: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
    let mut gone = false;
    for _ in 0..50 {
        // Gone, or a zombie nobody reaped yet (killed: its parent, `sh`, died with it).
        gone = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|st| st.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')))
            .unwrap_or(true);
        if gone {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(gone, "the grandchild (pid {pid}) outlived the check's timeout");
}

/// Issue 22: URL holes cannot leave the rule's path or host: the destination sees one request,
/// under the rule's path, with the value as one segment; an attacker listener sees nothing.
#[tokio::test]
async fn http_holes_stay_under_the_rules_path_and_host() {
    use axum::http::Uri;
    use std::sync::Mutex;
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let s2 = seen.clone();
    let app = axum::Router::new().fallback(move |uri: Uri| {
        let s = s2.clone();
        async move {
            s.lock().unwrap().push(uri.to_string());
            (axum::http::StatusCode::NOT_FOUND, "")
        }
    });
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    let attacker = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    attacker.set_nonblocking(true).unwrap();
    let rs = rules(&format!("- {{name: t, tool: c, http: {{url: \"http://{addr}/api/tickets/{{/result/id}}\", headers: {{Authorization: \"Bearer ${{env:DEST_TOKEN}}\"}}}}}}\n"));
    for evil in ["../../admin/delete?all=1#".to_string(), format!("@{}/steal", attacker.local_addr().unwrap()), "x?admin=1&all=1".into()] {
        let r = run_rule(&rs, 0, &json!({"result": {"id": evil}})).await;
        assert_eq!(r, Ok(Finding::Missing), "{evil}");
    }
    let got = seen.lock().unwrap().clone();
    assert_eq!(got.len(), 3, "{got:?}");
    assert!(got.iter().all(|u| u.starts_with("/api/tickets/") && !u[13..].contains('/') && !u.contains('?')), "{got:?}");
    assert!(attacker.accept().is_err(), "the attacker's listener received a connection");
}
