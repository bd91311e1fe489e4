//! End to end with a real Prometheus: it scrapes the service's /metrics and answers PromQL over
//! what it stored; `promtool check metrics` accepts the exposition.
//!
//! Needs `prometheus` and `promtool` on PATH (Debian: `apt-get install prometheus`). Without them
//! the test fails, unless `MCP_HEALTH_SKIP_PROMETHEUS=1` is set.

mod support;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use support::*;

fn on_path(bin: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(bin)).find(|p| p.is_file())
}

/// Whether to run; panics with instructions when the binaries are missing and skipping was not asked for.
fn prometheus_available() -> bool {
    let missing: Vec<&str> = ["prometheus", "promtool"].into_iter().filter(|b| on_path(b).is_none()).collect();
    if missing.is_empty() {
        return true;
    }
    if std::env::var("MCP_HEALTH_SKIP_PROMETHEUS").is_ok_and(|v| v == "1") {
        eprintln!("skipping: {} not on PATH and MCP_HEALTH_SKIP_PROMETHEUS=1", missing.join(", "));
        return false;
    }
    panic!(
        "{} not found on PATH. Install Prometheus (Debian/Ubuntu: `apt-get install prometheus`, which provides \
         prometheus and promtool), or set MCP_HEALTH_SKIP_PROMETHEUS=1 to skip this test.",
        missing.join(" and ")
    );
}

/// A Prometheus server, killed on drop.
struct Prometheus {
    child: Child,
    addr: std::net::SocketAddr,
    _dir: tempfile::TempDir,
    log: PathBuf,
}

impl Prometheus {
    async fn start(target: std::net::SocketAddr) -> Prometheus {
        Prometheus::start_with_rules(target, None).await
    }

    /// Start with `rule_files` pointing at `rules` (the project's alert rules, unchanged).
    async fn start_with_rules(target: std::net::SocketAddr, rules: Option<&std::path::Path>) -> Prometheus {
        let mut last = String::new();
        for _ in 0..5 {
            let dir = tempfile::tempdir().unwrap();
            let cfg = dir.path().join("prometheus.yml");
            std::fs::write(
                &cfg,
                format!(
                    "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n{}scrape_configs:\n  - job_name: mcp-health\n    scrape_interval: 1s\n    static_configs:\n      - targets: ['{target}']\n",
                    rules.map_or(String::new(), |r| format!("rule_files:\n  - {}\n", r.display()))
                ),
            )
            .unwrap();
            let port = {
                let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
                l.local_addr().unwrap().port()
            };
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
            let log = dir.path().join("prometheus.log");
            let child = Command::new("prometheus")
                .arg(format!("--config.file={}", cfg.display()))
                .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
                .arg(format!("--web.listen-address={addr}"))
                .stdin(Stdio::null())
                .stdout(std::fs::File::create(dir.path().join("prometheus.out")).unwrap())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .expect("start prometheus");
            let mut p = Prometheus { child, addr, _dir: dir, log };
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            loop {
                if let Ok(Some(_)) = p.child.try_wait() {
                    last = std::fs::read_to_string(&p.log).unwrap_or_default();
                    break; // most likely the port was taken in between: try another
                }
                if http_get(addr, "/-/ready").await.is_ok_and(|r| r.status == 200) {
                    return p;
                }
                if std::time::Instant::now() >= deadline {
                    panic!("prometheus not ready within 60 s:\n{}", std::fs::read_to_string(&p.log).unwrap_or_default());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        panic!("prometheus did not start:\n{last}");
    }

    /// The value of an instant query with a single scalar-like result.
    async fn query(&self, q: &str) -> Option<String> {
        let r = http_get(self.addr, &format!("/api/v1/query?query={}", urlencode(q))).await.ok()?;
        if r.status != 200 {
            return None;
        }
        let v: serde_json::Value = serde_json::from_slice(&r.body).ok()?;
        if v["status"] != "success" {
            return None;
        }
        let result = v["data"]["result"].as_array()?;
        let first = result.first()?;
        first["value"][1].as_str().map(str::to_string)
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- prometheus log ---\n{}", std::fs::read_to_string(&self.log).unwrap_or_default());
        }
    }
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_the_service_and_promtool_accepts_the_exposition() {
    if !prometheus_available() {
        return;
    }
    // Spans of one call arrive in separate requests: decide only after a generous quiet time.
    let svc = Service::start(Cfg { decision_wait: "1s", ..Cfg::default() }).await;
    for line in fixture_lines("eight_calls.jsonl") {
        let r = svc.post_json(line.as_bytes()).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let text = svc.wait_metric("mcp_health_calls_total", Duration::from_secs(30), |v| v == 8.0).await;

    // promtool: the exposition parses and passes its lint.
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    promtool.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = promtool.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics failed ({}):\n{}{}\n--- exposition ---\n{text}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let prom = Prometheus::start(svc.prom_addr()).await;
    eventually_async(Duration::from_secs(60), "Prometheus to report sum(mcp_health_calls_total) = 8", || async {
        prom.query("sum(mcp_health_calls_total)").await.filter(|v| v == "8").map(|_| ())
    })
    .await;
    assert_eq!(prom.query("up{job=\"mcp-health\"}").await.as_deref(), Some("1"));
    assert_eq!(prom.query("sum(mcp_health_calls_protocol_success_total)").await.as_deref(), Some("3"));
    assert_eq!(prom.query("sum(mcp_health_calls_verified_success_total)").await.as_deref(), Some("1"));
    assert_eq!(prom.query("sum(mcp_health_verdicts_total{state=\"needs_auth\"})").await.as_deref(), Some("2"));
}

/// Issue 4: real Prometheus scrapes the service while a fixture replays, with the project's own
/// alert rules (otel-config/alerts.yml, unchanged, `for: 1m`), and the expected alert becomes
/// firing: five calls refused for one expired credential are one authorization incident.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_authorization_incident_alert_becomes_firing() {
    if !prometheus_available() {
        return;
    }
    let svc = Service::start(Cfg { decision_wait: "300ms", ..Cfg::default() }).await;
    for line in fixture_lines("incidents_five_expired.jsonl") {
        let r = svc.post_json(line.as_bytes()).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    svc.wait_metric("mcp_health_incidents_open", Duration::from_secs(30), |v| v == 1.0).await;
    let rules = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("otel-config/alerts.yml");
    let prom = Prometheus::start_with_rules(svc.prom_addr(), Some(&rules)).await;
    // `for: 1m` in the real rules: pending first, firing a minute later.
    eventually_async(Duration::from_secs(40), "MCPIncidentOpen{first_failed_layer=authorization} to be pending or firing", || async {
        prom.query("count(ALERTS{alertname=\"MCPIncidentOpen\", first_failed_layer=\"authorization\"})")
            .await
            .filter(|v| v == "1")
            .map(|_| ())
    })
    .await;
    eventually_async(Duration::from_secs(120), "MCPIncidentOpen{first_failed_layer=authorization} to be firing", || async {
        prom.query("count(ALERTS{alertname=\"MCPIncidentOpen\", first_failed_layer=\"authorization\", alertstate=\"firing\"})")
            .await
            .filter(|v| v == "1")
            .map(|_| ())
    })
    .await;
    // One incident, one alert: grouped by cause, not one per attempt; and no other layer alerts.
    assert_eq!(prom.query("count(ALERTS{alertname=\"MCPIncidentOpen\", alertstate=\"firing\"})").await.as_deref(), Some("1"));
    assert_eq!(prom.query("sum(mcp_health_incidents_open{first_failed_layer=\"authorization\"})").await.as_deref(), Some("1"));
}

fn collect_exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("expr", serde_json::Value::String(e)) => out.push(e.clone()),
                    _ => collect_exprs(x, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| collect_exprs(x, out)),
        _ => {}
    }
}

/// Issue 10: the dashboard's cardinality-overflow panel failed exactly when overflow happened
/// (`vector cannot contain metrics with the same labelset`). Every dashboard and alert-rule
/// expression is evaluated by the real Prometheus, with data — overflow series included (a
/// cardinality limit of 2) — and none may error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_and_rule_expression_evaluates_with_data() {
    if !prometheus_available() {
        return;
    }
    let svc = Service::start(Cfg { decision_wait: "300ms", cardinality_limit: Some(2), exporter: None, ..Cfg::default() }).await;
    for f in ["eight_calls.jsonl", "incidents_five_expired.jsonl", "nine_states.jsonl"] {
        for line in fixture_lines(f) {
            assert_eq!(svc.post_json(line.as_bytes()).await.status, 200);
        }
    }
    svc.wait_metric("mcp_health_verdicts_total", Duration::from_secs(30), |v| v >= 8.0).await;
    assert!(svc.metrics_text().await.contains("otel_metric_overflow=\"true\""), "overflow series exist");
    let prom = Prometheus::start(svc.prom_addr()).await;
    eventually_async(Duration::from_secs(60), "two scrapes with overflow series", || async {
        prom.query("count_over_time(up{job=\"mcp-health\"}[1m])").await.filter(|v| v.parse::<f64>().unwrap_or(0.0) >= 3.0).map(|_| ())
    })
    .await;

    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut exprs = Vec::new();
    for e in std::fs::read_dir(root.join("otel-config/grafana/dashboards")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "json") {
            collect_exprs(&serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap(), &mut exprs);
        }
    }
    let panels = exprs.len();
    let rules: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(root.join("otel-config/alerts.yml")).unwrap()).unwrap();
    for g in rules["groups"].as_sequence().into_iter().flatten() {
        for r in g["rules"].as_sequence().into_iter().flatten() {
            if let Some(e) = r["expr"].as_str() {
                exprs.push(e.to_string());
            }
        }
    }
    assert!(panels >= 10 && exprs.len() > panels, "expressions found: {panels} panels, {} in all", exprs.len());
    let mut errors = Vec::new();
    for e in &exprs {
        let q = e.replace("$__rate_interval", "1m").replace("$__range", "5m").replace("$server", ".*");
        let r = http_get(prom.addr, &format!("/api/v1/query?query={}", urlencode(&q))).await.expect("query");
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
        if v["status"] != "success" {
            errors.push(format!("{q}\n  -> {}", v["error"]));
        }
    }
    assert!(errors.is_empty(), "{} of {} expressions fail with data:\n{}", errors.len(), exprs.len(), errors.join("\n"));
}
