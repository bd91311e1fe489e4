//! End to end with a real Prometheus: it scrapes the service's /metrics and answers PromQL over
//! what it stored; `promtool check metrics` accepts the exposition.
//!
//! Needs `prometheus` and `promtool` on PATH (Debian: `apt-get install prometheus`). Without them
//! the test fails, unless `MCP_HEALTH_SKIP_PROMETHEUS=1` is set.

mod support;

use std::io::Write;

use std::process::{Command, Stdio};
use std::time::Duration;

use support::prometheus::*;
use support::*;

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
