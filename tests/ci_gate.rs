//! The CI gate (issue 36) through the binary: `replay --fail-on` exit codes for each kind of
//! condition, JUnit and SARIF output validated against their schemas (offline copies in
//! tests/fixtures/schemas), no planted secret in any output, `tap --record` and a command run under
//! an HTTP tap, and scripts/action/gate (what action.yml runs) end to end: on the eight-call
//! fixture, through a verified release download, and with npm's server-everything behind the tap.
//!
//! Validators: `xmllint` (Debian libxml2-utils) for JUnit, Python's `jsonschema` (.venv-schema,
//! else a python3 that has it) for SARIF; scripts/install-test-deps installs both. Missing: SKIPPED
//! outside CI, a failure under CI.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_mcp-health");

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn fixture(name: &str) -> String {
    root().join("tests/fixtures").join(name).to_string_lossy().into_owned()
}

fn mcp_health(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("run mcp-health")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A tool this test needs is missing: a failure under CI, else a skip line (and `None`).
fn skip_unless_ci(what: &str) {
    assert!(std::env::var_os("CI").is_none(), "{what} is missing under CI: scripts/install-test-deps installs it");
    println!("SKIPPED: {what} is missing (scripts/install-test-deps installs it)");
}

/// A lockfile pinning drift_before.jsonl's tools, in `dir`.
fn lockfile(dir: &Path) -> String {
    let path = dir.join("mcp-health.lock.json").to_string_lossy().into_owned();
    let out = mcp_health(&["lock", &fixture("drift_before.jsonl"), "--lockfile", &path]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    path
}

#[test]
fn fail_on_exits_0_without_findings_1_with_and_2_on_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let lock = lockfile(dir.path());
    let garbage = dir.path().join("garbage.jsonl");
    std::fs::write(&garbage, "{\"resourceSpans\": [\n").unwrap();
    let (eight, nine, after) = (fixture("eight_calls.jsonl"), fixture("nine_states.jsonl"), fixture("drift_after.jsonl"));
    let before = fixture("drift_before.jsonl");
    let garbage = garbage.to_string_lossy().into_owned();
    // (args after `replay`, expected exit code). eight_calls: two transport failures, a method
    // error, two authorization failures, a tool error, a false success, a verified delivery
    // (protocol 37.5 %, verified 12.5 %).
    let cases: Vec<(Vec<&str>, i32)> = vec![
        (vec![&eight], 0),
        (vec![&eight, "--fail-on", "state=false_success,effect_unknown"], 1),
        (vec![&eight, "--fail-on", "state=effect_unknown"], 0),
        (vec![&nine, "--fail-on", "state=effect_unknown"], 1),
        (vec![&eight, "--fail-on", "layer=authorization"], 1),
        (vec![&eight, "--fail-on", "layer=execution"], 1),
        (vec![&nine, "--fail-on", "layer=transport"], 1),
        (vec![&nine, "--fail-on", "state=transport_failed"], 0),
        (vec![&eight, "--fail-on", "verified_rate<0.9"], 1),
        (vec![&eight, "--fail-on", "verified_rate<0.125"], 0),
        (vec![&eight, "--fail-on", "verified_rate<=0.125"], 1),
        (vec![&eight, "--fail-on", "protocol_rate<37%"], 0),
        (vec![&eight, "--fail-on", "protocol_rate>0.3"], 1),
        (vec![&eight, "--fail-on", "protocol_rate>=0.5"], 0),
        (vec![&eight, "--fail-on", "drift"], 0),
        (vec![&after, "--fail-on", "drift"], 0),
        (vec![&after, "--lockfile", &lock, "--fail-on", "drift"], 1),
        (vec![&before, "--lockfile", &lock, "--fail-on", "drift"], 0),
        // Repeated and combined conditions: any one finding fails.
        (vec![&eight, "--fail-on", "state=effect_unknown", "--fail-on", "layer=authorization"], 1),
        (vec![&eight, "--fail-on", "state=effect_unknown,layer=outcome"], 1),
        (vec![&eight, "--fail-on", "state=effect_unknown", "--fail-on", "drift"], 0),
        // Bad SPECs and bad input: 2, whatever the evidence.
        (vec![&eight, "--fail-on", "state=falsesuccess"], 2),
        (vec![&eight, "--fail-on", "layer=auth"], 2),
        (vec![&eight, "--fail-on", "verified_rate<1.5"], 2),
        (vec![&eight, "--fail-on", "green"], 2),
        (vec![&eight, "--fail-on", ""], 2),
        (vec!["/nonexistent/evidence.jsonl", "--fail-on", "drift"], 2),
        (vec![&garbage, "--fail-on", "drift"], 2),
        (vec![&eight, &garbage, "--fail-on", "state=false_success"], 2),
        (vec![&eight, "--lockfile", "/nonexistent/lock.json", "--fail-on", "drift"], 2),
    ];
    for (args, want) in cases {
        let mut full = vec!["replay"];
        full.extend(&args);
        let out = mcp_health(&full);
        assert_eq!(out.status.code(), Some(want), "replay {args:?}\nstderr: {}", text(&out.stderr));
        if want == 1 {
            assert!(text(&out.stderr).contains("fail-on "), "findings are named on stderr: {}", text(&out.stderr));
        }
    }
}

#[test]
fn table_and_json_stay_as_they_were() {
    // The default is still the table; json is the golden file's format (tests/golden_replay.rs).
    let table = mcp_health(&["replay", &fixture("eight_calls.jsonl")]);
    assert!(text(&table.stdout).starts_with("TRACE "), "{}", text(&table.stdout));
    let json = mcp_health(&["replay", "--format", "json", &fixture("eight_calls.jsonl")]);
    let last: Value = serde_json::from_str(text(&json.stdout).lines().last().unwrap()).unwrap();
    assert_eq!(last["summary"], true);
    // The help names the exit codes, as the docs do.
    let help = text(&mcp_health(&["replay", "--help"]).stdout);
    assert!(help.contains("--fail-on") && help.contains("Exit codes: 0 passed, 1 findings, 2 bad input"), "{help}");
}

// ---- validators ---------------------------------------------------------------------------------

/// `Ok(())` when `xml` is valid against the JUnit XSD, `Err(why)` otherwise; `None` without xmllint.
fn junit_valid(xml: &str) -> Option<Result<(), String>> {
    Command::new("xmllint").arg("--version").output().ok()?;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("junit.xml");
    std::fs::write(&file, xml).unwrap();
    let out = Command::new("xmllint")
        .args(["--noout", "--schema"])
        .arg(root().join("tests/fixtures/schemas/junit-10.xsd"))
        .arg(&file)
        .output()
        .unwrap();
    Some(if out.status.success() { Ok(()) } else { Err(text(&out.stderr)) })
}

/// The Python that has `jsonschema`: .venv-schema's, else python3's if it has it.
fn jsonschema_python() -> Option<PathBuf> {
    let venv = root().join(".venv-schema/bin/python");
    let candidates = [venv, PathBuf::from("python3")];
    candidates.into_iter().find(|p| Command::new(p).args(["-c", "import jsonschema"]).output().is_ok_and(|o| o.status.success()))
}

/// `Ok(())` when `doc` is valid against the SARIF 2.1.0 schema; `None` without a validator.
fn sarif_valid(doc: &str) -> Option<Result<(), String>> {
    let python = jsonschema_python()?;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("out.sarif");
    std::fs::write(&file, doc).unwrap();
    let script = "import json, sys, jsonschema\n\
        schema = json.load(open(sys.argv[1]))\n\
        v = jsonschema.Draft4Validator(schema, format_checker=jsonschema.FormatChecker())\n\
        errors = list(v.iter_errors(json.load(open(sys.argv[2]))))\n\
        [print(e.json_path, e.message) for e in errors[:5]]\n\
        sys.exit(1 if errors else 0)\n";
    let out = Command::new(python)
        .args(["-c", script])
        .arg(root().join("tests/fixtures/schemas/sarif-schema-2.1.0.json"))
        .arg(&file)
        .output()
        .unwrap();
    Some(if out.status.success() { Ok(()) } else { Err(format!("{}{}", text(&out.stdout), text(&out.stderr))) })
}

/// Every fixture replay the output tests look at: (name, replay arguments).
fn outputs_of(dir: &Path) -> Vec<(String, Vec<String>)> {
    let lock = lockfile(dir);
    let mut out = Vec::new();
    for f in ["eight_calls.jsonl", "nine_states.jsonl", "planted_secrets.jsonl", "catalog_cases.jsonl", "incidents_resolved.jsonl"] {
        out.push((f.to_string(), vec![fixture(f)]));
    }
    out.push(("drift_after.jsonl with its lockfile".into(), vec![fixture("drift_after.jsonl"), "--lockfile".into(), lock]));
    out
}

fn replay_format(format: &str, args: &[String], extra: &[&str]) -> String {
    let mut full: Vec<String> = vec!["replay".into(), "--format".into(), format.into()];
    full.extend(args.iter().cloned());
    full.extend(extra.iter().map(|s| s.to_string()));
    let out = Command::new(BIN).args(&full).output().unwrap();
    assert!(matches!(out.status.code(), Some(0 | 1)), "{full:?}: {}", text(&out.stderr));
    text(&out.stdout)
}

#[test]
fn junit_is_valid_against_its_schema_with_a_case_per_call() {
    // The validator validates: a test case without its required name is refused.
    let Some(broken) =
        junit_valid(r#"<testsuites><testsuite name="s" tests="1" failures="0" errors="0"><testcase/></testsuite></testsuites>"#)
    else {
        return skip_unless_ci("xmllint (Debian libxml2-utils)");
    };
    assert!(broken.is_err(), "xmllint accepted a testcase without a name");
    let dir = tempfile::tempdir().unwrap();
    for (name, args) in outputs_of(dir.path()) {
        let xml = replay_format("junit", &args, &[]);
        if let Err(e) = junit_valid(&xml).unwrap() {
            panic!("{name}: JUnit not valid: {e}\n{xml}");
        }
    }
    let xml = replay_format("junit", &[fixture("eight_calls.jsonl")], &[]);
    assert_eq!(xml.matches("<testcase ").count(), 8, "{xml}");
    assert_eq!(xml.matches("<failure ").count(), 7, "all but the verified delivery: {xml}");
    for needle in
        ["first failed layer authorization, reason insufficient_scope", "reason outcome_missing", "next: ask the credential owner"]
    {
        assert!(xml.contains(needle), "{needle} in {xml}");
    }
    assert!(xml.contains(r#"<testsuite name="tickets.invalid:8443""#), "a suite per server: {xml}");
}

#[test]
fn sarif_is_valid_against_the_2_1_0_schema_with_rules_levels_and_pin_locations() {
    let Some(broken) = sarif_valid(
        r#"{"version": "2.1.0", "runs": [{"tool": {"driver": {"name": "x"}}, "results": [{"level": "fatal", "message": {"text": "m"}}]}]}"#,
    ) else {
        return skip_unless_ci("Python jsonschema (.venv-schema)");
    };
    assert!(broken.is_err(), "the validator accepted level `fatal`");
    let dir = tempfile::tempdir().unwrap();
    for (name, args) in outputs_of(dir.path()) {
        let doc = replay_format("sarif", &args, &["--fail-on", "verified_rate<0.9"]);
        if let Err(e) = sarif_valid(&doc).unwrap() {
            panic!("{name}: SARIF not valid: {e}\n{doc}");
        }
    }
    let doc: Value =
        serde_json::from_str(&replay_format("sarif", &[fixture("eight_calls.jsonl")], &["--fail-on", "verified_rate<0.9"])).unwrap();
    let run = &doc["runs"][0];
    let rules: Vec<&str> = run["tool"]["driver"]["rules"].as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap()).collect();
    for id in [
        "state/false_success",
        "state/needs_auth",
        "state/healthy",
        "drift/parameter_renamed",
        "drift/definition_changed",
        "rate/verified_rate",
    ] {
        assert!(rules.contains(&id), "rule {id} in {rules:?}");
    }
    let results = run["results"].as_array().unwrap();
    let level = |rule: &str| results.iter().find(|r| r["ruleId"] == rule).map(|r| r["level"].clone());
    assert_eq!(level("state/false_success"), Some(json!("error")));
    assert_eq!(level("rate/verified_rate"), Some(json!("error")));
    assert_eq!(level("state/healthy"), None, "a healthy call is no finding");
    assert_eq!(results.len(), 8, "seven calls and the rate: {results:#?}");
    for r in results {
        assert_eq!(rules[r["ruleIndex"].as_u64().unwrap() as usize], r["ruleId"].as_str().unwrap());
    }

    // Drift is located at the tool's pin in the lockfile.
    let lock = lockfile(dir.path());
    let doc: Value =
        serde_json::from_str(&replay_format("sarif", &[fixture("drift_after.jsonl"), "--lockfile".into(), lock.clone()], &[])).unwrap();
    let lock_text = std::fs::read_to_string(&lock).unwrap();
    let drift: Vec<&Value> =
        doc["runs"][0]["results"].as_array().unwrap().iter().filter(|r| r["ruleId"].as_str().unwrap().starts_with("drift/")).collect();
    assert!(drift.iter().any(|r| r["ruleId"] == "drift/parameter_renamed"), "{drift:#?}");
    for r in drift {
        let loc = &r["locations"][0]["physicalLocation"];
        assert!(lock.ends_with(loc["artifactLocation"]["uri"].as_str().unwrap().trim_start_matches('/')), "{loc}");
        let line = loc["region"]["startLine"].as_u64().expect("a line") as usize;
        assert!(lock_text.lines().nth(line - 1).unwrap().contains("\"search_tickets\": {"), "line {line} of\n{lock_text}");
    }
}

// ---- secrets --------------------------------------------------------------------------------------

/// eight_calls.jsonl with secrets planted where a careless emitter would pick them up: the session
/// id, a request id, tool arguments and results, an authorization header, URLs with credentials in
/// their userinfo and query. Every planted value contains `PLANTED`.
fn planted_eight_calls(dir: &Path) -> String {
    let s = |k: &str, v: &str| json!({"key": k, "value": {"stringValue": v}});
    let mut lines = Vec::new();
    for line in std::fs::read_to_string(fixture("eight_calls.jsonl")).unwrap().lines() {
        let mut req: Value = serde_json::from_str(line).unwrap();
        for rs in req["resourceSpans"].as_array_mut().unwrap() {
            for ss in rs["scopeSpans"].as_array_mut().unwrap() {
                for span in ss["spans"].as_array_mut().unwrap() {
                    let attrs = span["attributes"].as_array_mut().unwrap();
                    for a in attrs.iter_mut() {
                        match a["key"].as_str().unwrap() {
                            "mcp.session.id" => a["value"]["stringValue"] = json!("sk-PLANTED-SESSION-0123456789abcdefABCDEF"),
                            // Both halves of the fourth call, so they still join.
                            "jsonrpc.request.id" if a["value"]["stringValue"] == "4" => {
                                a["value"]["stringValue"] = json!("sk-PLANTED-REQUEST-ID-0123456789abcdef")
                            }
                            "server.address" => {
                                a["value"]["stringValue"] = json!(format!(
                                    "https://user:sk-PLANTED-USERINFO@{}/mcp?token=sk-PLANTED-QUERY",
                                    a["value"]["stringValue"].as_str().unwrap()
                                ))
                            }
                            _ => {}
                        }
                    }
                    attrs.push(s("gen_ai.tool.call.arguments", r#"{"api_key": "sk-PLANTED-ARGUMENT-0a1b2c3d4e5f"}"#));
                    attrs.push(s("gen_ai.tool.call.result", r#"{"content": [{"type": "text", "text": "sk-PLANTED-RESULT"}]}"#));
                    attrs.push(s("http.request.header.authorization", "Bearer sk-PLANTED-BEARER-0a1b2c3d4e5f6a7b"));
                    attrs.push(s("url.full", "https://tickets.example.test/mcp?api_key=sk-PLANTED-URL-QUERY"));
                    attrs.push(s("exception.message", "failed for token sk-PLANTED-EXCEPTION"));
                }
            }
        }
        lines.push(req.to_string());
    }
    let path = dir.join("planted.jsonl");
    std::fs::write(&path, lines.join("\n")).unwrap();
    path.to_string_lossy().into_owned()
}

#[test]
fn planted_secrets_appear_in_no_output_format() {
    let dir = tempfile::tempdir().unwrap();
    let planted = planted_eight_calls(dir.path());
    let given: Vec<String> = serde_json::from_str::<Value>(&std::fs::read_to_string(fixture("planted_secrets.expected.json")).unwrap())
        .unwrap()["planted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    for format in ["table", "json", "junit", "sarif"] {
        for (file, needles) in [(planted.clone(), vec!["PLANTED".to_string()]), (fixture("planted_secrets.jsonl"), given.clone())] {
            let out = mcp_health(&["replay", "--format", format, &file, "--fail-on", "state=needs_auth,false_success"]);
            let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
            assert!(out.status.code().is_some_and(|c| c < 2), "{format} {file}: {all}");
            for n in &needles {
                assert!(!all.contains(n.as_str()), "{format} output of {file} contains {n}:\n{all}");
            }
        }
    }
    // The planted file still gives the fixture's verdicts (the test plants, it does not break).
    let junit = text(&mcp_health(&["replay", "--format", "junit", &planted]).stdout);
    assert_eq!(junit.matches("<testcase ").count(), 8, "{junit}");
    assert!(junit.contains(r#"<testsuite name="tickets.example.test""#), "the server's name without its URL parts: {junit}");
}

// ---- the tap ------------------------------------------------------------------------------------

#[test]
fn an_http_tap_runs_the_command_under_test_and_exits_with_its_code() {
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("evidence.jsonl");
    let out = Command::new(BIN)
        .args(["tap", "--listen", "127.0.0.1:0", "--upstream", "http://127.0.0.1:9", "--record"])
        .arg(&record)
        .args(["--", "sh", "-c", r#"case "$MCP_HEALTH_TAP_URL" in http://127.0.0.1:*) exit 3;; *) exit 4;; esac"#])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "the command's code, with the tap's URL set: {}", text(&out.stderr));
    assert!(record.exists(), "the record file is made even when nothing was observed");
}

// ---- scripts/action/gate ----------------------------------------------------------------------------

fn gate(sub: &str, env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(root().join("scripts/action/gate"));
    c.arg(sub).env_remove("GITHUB_OUTPUT").env_remove("CI_GATE_UNUSED");
    for k in ["GATE_SERVER_COMMAND", "GATE_SERVER_URL", "GATE_TEST_COMMAND", "GATE_LOCKFILE", "GATE_JUNIT", "GATE_FAIL_ON"] {
        c.env_remove(k);
    }
    c.envs(env.iter().copied()).stdin(Stdio::null()).output().unwrap()
}

#[test]
fn the_gate_script_fails_the_eight_call_fixture_and_writes_sarif() {
    let dir = tempfile::tempdir().unwrap();
    let sarif = dir.path().join("gate.sarif").to_string_lossy().into_owned();
    let junit = dir.path().join("gate.xml").to_string_lossy().into_owned();
    let github_output = dir.path().join("github_output");
    let eight = fixture("eight_calls.jsonl");
    let env = [("GATE_BINARY", BIN), ("GATE_EVIDENCE", eight.as_str()), ("GATE_SARIF", sarif.as_str()), ("GATE_JUNIT", junit.as_str())];

    let mut fail = env.to_vec();
    fail.push(("GATE_FAIL_ON", "state=false_success,effect_unknown\nverified_rate<0.9"));
    let out = Command::new(root().join("scripts/action/gate"))
        .arg("run")
        .envs(fail.iter().copied())
        .env("GITHUB_OUTPUT", &github_output)
        .env_remove("GATE_TEST_COMMAND")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&sarif).unwrap()).unwrap();
    let results = doc["runs"][0]["results"].as_array().unwrap();
    assert!(results.iter().any(|r| r["ruleId"] == "state/false_success"), "{doc:#}");
    assert!(results.iter().any(|r| r["ruleId"] == "rate/verified_rate"), "{doc:#}");
    assert!(std::fs::read_to_string(&junit).unwrap().contains("<testsuites"));
    assert!(std::fs::read_to_string(&github_output).unwrap().contains(&format!("sarif={sarif}")));
    assert!(text(&out.stderr).contains("TRACE "), "the verdict table is in the log: {}", text(&out.stderr));
    assert!(std::path::Path::new(&eight).exists(), "replayed evidence is never truncated");

    let mut pass = env.to_vec();
    pass.push(("GATE_FAIL_ON", "state=effect_unknown"));
    let out = gate("run", &pass);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));

    let mut bad = env.to_vec();
    bad.push(("GATE_FAIL_ON", "state=nonsense"));
    assert_eq!(gate("run", &bad).status.code(), Some(2));
}

#[test]
fn the_gate_script_installs_a_release_only_when_its_checksum_matches() {
    let dir = tempfile::tempdir().unwrap();
    let version = "9.9.9";
    let name = format!("mcp-health-{version}-x86_64-unknown-linux-gnu");
    let stage = dir.path().join("stage");
    std::fs::create_dir_all(stage.join(&name)).unwrap();
    std::fs::copy(BIN, stage.join(&name).join("mcp-health")).unwrap();
    let release = dir.path().join("release");
    std::fs::create_dir_all(&release).unwrap();
    let tarball = release.join(format!("{name}.tar.gz"));
    let tar = Command::new("tar").arg("-czf").arg(&tarball).arg("-C").arg(&stage).arg(&name).status().unwrap();
    assert!(tar.success());
    let sum = Command::new("sha256sum").arg(format!("{name}.tar.gz")).current_dir(&release).output().unwrap();
    let sums = format!("{}{}", "0".repeat(64) + "  other.tar.gz\n", text(&sum.stdout));
    std::fs::write(release.join("SHA256SUMS"), &sums).unwrap();
    let base = format!("file://{}", release.display());
    let temp = dir.path().join("runner");
    std::fs::create_dir_all(&temp).unwrap();
    let temp = temp.to_string_lossy().into_owned();
    let env = [("GATE_VERSION", "v9.9.9"), ("GATE_DOWNLOAD_BASE", base.as_str()), ("RUNNER_TEMP", temp.as_str())];
    let out = gate("install", &env);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let bin = text(&out.stdout).trim().to_string();
    assert!(bin.ends_with(&format!("{name}/mcp-health")), "{bin}");
    assert!(Command::new(&bin).arg("--version").output().unwrap().status.success());

    // A tarball that is not the one summed is refused.
    std::fs::write(release.join("SHA256SUMS"), sums.replace(&text(&sum.stdout)[..8], "deadbeef")).unwrap();
    let out = gate("install", &env);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("does not match"), "{}", text(&out.stderr));
}

/// npm's server-everything (tests/tap/everything, `npm ci` by scripts/install-test-deps).
fn everything_bin() -> Option<PathBuf> {
    let p = root().join("tests/tap/everything/node_modules/.bin/mcp-server-everything");
    let node = Command::new("node").arg("--version").output().is_ok_and(|o| o.status.success());
    let python = Command::new("python3").arg("--version").output().is_ok_and(|o| o.status.success());
    (p.exists() && node && python).then_some(p)
}

#[test]
fn the_gate_script_records_a_real_server_through_the_tap_and_gates_on_it() {
    let Some(server) = everything_bin() else {
        return skip_unless_ci("server-everything (tests/tap/everything/node_modules), node or python3");
    };
    let dir = tempfile::tempdir().unwrap();
    let evidence = dir.path().join("evidence.jsonl").to_string_lossy().into_owned();
    let sarif = dir.path().join("gate.sarif").to_string_lossy().into_owned();
    let server_command = format!("{} stdio", server.display());
    let client = root().join("tests/tap/gate_client.py");
    let test_command = format!("python3 {} echo get-sum no-such-tool", client.display());
    let env = [
        ("GATE_BINARY", BIN),
        ("GATE_SERVER_COMMAND", server_command.as_str()),
        ("GATE_TEST_COMMAND", test_command.as_str()),
        ("GATE_EVIDENCE", evidence.as_str()),
        ("GATE_SARIF", sarif.as_str()),
        ("GATE_FAIL_ON", "state=false_success,effect_unknown layer=protocol"),
    ];
    let out = gate("run", &env);
    let log = format!("stdout:\n{}\nstderr:\n{}", text(&out.stdout), text(&out.stderr));
    assert!(text(&out.stdout).contains("Echo: sk-PLANTED"), "the calls went through the tap: {log}");
    assert_eq!(out.status.code(), Some(1), "the unknown tool fails layer=protocol: {log}");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&sarif).unwrap()).unwrap();
    let results = doc["runs"][0]["results"].as_array().unwrap();
    let tools: Vec<&str> = results.iter().map(|r| r["properties"]["tool"].as_str().unwrap_or("-")).collect();
    assert!(results.iter().any(|r| r["ruleId"] == "state/protocol_error" && r["properties"]["tool"] == "no-such-tool"), "{doc:#}");
    assert!(tools.contains(&"echo") && tools.contains(&"get-sum"), "unverified calls are warnings: {tools:?}");
    if let Some(Err(e)) = sarif_valid(&serde_json::to_string(&doc).unwrap()) {
        panic!("SARIF of the live run not valid: {e}");
    }
    let recorded = std::fs::read_to_string(&evidence).unwrap();
    assert!(!recorded.contains("PLANTED") && !text(&out.stderr).contains("PLANTED"), "the echo's argument is not evidence");
    assert!(!std::fs::read_to_string(&sarif).unwrap().contains("PLANTED"));

    // The same evidence passes a gate that only refuses false successes and unknown effects.
    let out = mcp_health(&["replay", &evidence, "--fail-on", "state=false_success,effect_unknown"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let json = text(&mcp_health(&["replay", "--format", "json", &evidence]).stdout);
    let calls = json.lines().filter(|l| l.contains("\"tools/call\"")).count();
    assert_eq!(calls, 3, "three tool calls recorded: {json}");
}

/// A free loopback port (bound and released: the server binds it next).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A child process killed when the test ends, however it ends.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_gate_script_puts_the_tap_in_front_of_an_http_server_during_the_test_command() {
    let Some(server) = everything_bin() else {
        return skip_unless_ci("server-everything (tests/tap/everything/node_modules), node or python3");
    };
    let port = free_port();
    let _server = Killed(
        Command::new(&server)
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(std::time::Instant::now() < deadline, "server-everything did not listen on {port}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let dir = tempfile::tempdir().unwrap();
    let evidence = dir.path().join("evidence.jsonl").to_string_lossy().into_owned();
    let sarif = dir.path().join("gate.sarif").to_string_lossy().into_owned();
    let url = format!("http://127.0.0.1:{port}");
    let test_command = format!("python3 {} echo get-sum", root().join("tests/tap/gate_client.py").display());
    let mut env = vec![
        ("GATE_BINARY", BIN),
        ("GATE_SERVER_URL", url.as_str()),
        ("GATE_TEST_COMMAND", test_command.as_str()),
        ("GATE_EVIDENCE", evidence.as_str()),
        ("GATE_SARIF", sarif.as_str()),
        ("GATE_FAIL_ON", "state=false_success,effect_unknown,protocol_error"),
    ];
    let out = gate("run", &env);
    let log = format!("stdout:\n{}\nstderr:\n{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "two good calls pass: {log}");
    assert!(text(&out.stdout).contains("The sum of 2 and 3 is 5."), "{log}");
    let json = text(&mcp_health(&["replay", "--format", "json", &evidence]).stdout);
    assert_eq!(json.lines().filter(|l| l.contains("\"tools/call\"")).count(), 2, "{json}");

    // The verified rate of calls nobody verified is 0: a rate condition fails the same run.
    env.retain(|(k, _)| *k != "GATE_FAIL_ON");
    env.push(("GATE_FAIL_ON", "verified_rate<0.5"));
    let out = gate("run", &env);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&sarif).unwrap()).unwrap();
    assert!(doc["runs"][0]["results"].as_array().unwrap().iter().any(|r| r["ruleId"] == "rate/verified_rate"), "{doc:#}");

    // A failing test command fails the gate with its own code when the evidence passes.
    env.retain(|(k, _)| *k != "GATE_FAIL_ON" && *k != "GATE_TEST_COMMAND");
    env.push(("GATE_TEST_COMMAND", "exit 7"));
    assert_eq!(gate("run", &env).status.code(), Some(7));
}
