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

/// The names on /metrics follow the OpenTelemetry → Prometheus compatibility rules, in both
/// formats: every counter ends `_total`; every family whose unit is `s` or `By` ends `_seconds` or
/// `_bytes`, none twice; annotations add nothing; every family is a declared instrument (or
/// `target_info`) and carries only its declared labels (plus `le`, the scope and the overflow
/// marker); `target_info` carries the resource; OpenMetrics names each unit in `# UNIT`, under a
/// family that ends with it, and counter families without `_total`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_names_follow_the_compatibility_rules() {
    use mcp_health::testing::emit::prometheus::{names, sanitize_name};
    use mcp_health::testing::telemetry::instruments::{Kind, ALL};
    let svc = Service::start(Cfg { decision_wait: "300ms", ..Cfg::default() }).await;
    for line in fixture_lines("eight_calls.jsonl") {
        assert_eq!(svc.post_json(line.as_bytes()).await.status, 200);
    }
    svc.wait_metric("mcp_health_call_duration_seconds_count", Duration::from_secs(30), |v| v >= 1.0).await;
    let text = svc.wait_metric("mcp_health_calls_total", Duration::from_secs(30), |v| v >= 8.0).await;
    let om = http_request(svc.prom_addr(), "GET", "/metrics", &[("Accept", "application/openmetrics-text; version=1.0.0")], b"")
        .await
        .expect("GET /metrics (OpenMetrics)");
    assert!(om.text().ends_with("# EOF\n"), "not OpenMetrics: {}", om.text());
    let om = om.text();

    // What the declarations say each family is.
    let mut declared = std::collections::BTreeMap::new();
    for i in ALL {
        declared.insert(names(i.name, i.unit, i.kind).family, i);
    }
    let mut problems = Vec::new();
    let mut types = std::collections::BTreeMap::new();
    for l in text.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
        let (name, kind) = l.split_once(' ').unwrap();
        types.insert(name.to_string(), kind.to_string());
    }
    assert_eq!(types.get("target_info").map(String::as_str), Some("gauge"), "no target_info:\n{text}");
    let target = text.lines().find(|l| l.starts_with("target_info{")).unwrap_or("");
    assert!(target.contains("service_name=\"") && target.contains("telemetry_sdk_name=\"") && target.ends_with("} 1"), "{target}");
    for (name, kind) in &types {
        if name == "target_info" {
            continue;
        }
        let family = if kind == "counter" { name.strip_suffix("_total").unwrap_or(name) } else { name };
        if kind == "counter" && !name.ends_with("_total") {
            problems.push(format!("counter {name} does not end _total"));
        }
        for (unit, word) in [("s", "seconds"), ("By", "bytes")] {
            if family.matches(word).count() > 1 {
                problems.push(format!("{name}: {word} twice"));
            }
            if let Some(i) = declared.get(family) {
                if i.unit == unit && !family.ends_with(&format!("_{word}")) {
                    problems.push(format!("{name}: unit {unit} but no _{word}"));
                }
            }
        }
        let Some(i) = declared.get(family) else {
            problems.push(format!("{name} ({kind}) is not a declared instrument"));
            continue;
        };
        let want_kind = match i.kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        if kind != want_kind {
            problems.push(format!("{name} is a {kind}, declared {want_kind}"));
        }
        // Labels of every sample of the family.
        let allowed: Vec<String> = i
            .labels
            .iter()
            .map(|l| sanitize_name(l))
            .chain(["le", "otel_scope_name", "otel_scope_version", "otel_metric_overflow"].map(String::from))
            .collect();
        for sample in text.lines().filter(|l| !l.starts_with('#') && l.starts_with(family)) {
            let Some(labels) = sample.split_once('{').map(|(_, r)| &r[..r.rfind('}').unwrap_or(0)]) else { continue };
            for kv in labels.split("\",").filter(|kv| !kv.is_empty()) {
                let key = kv.split('=').next().unwrap().trim_start_matches(',');
                if !allowed.iter().any(|a| a == key) {
                    problems.push(format!("{name}: label {key} is not declared ({sample})"));
                }
            }
            if !labels.contains("otel_scope_name=\"mcp-health\"") {
                problems.push(format!("{name}: no otel_scope_name ({sample})"));
            }
        }
    }
    for must in [
        "mcp_health_call_duration_seconds",
        "mcp_health_verdict_delay_seconds",
        "mcp_health_process_uptime_seconds_total",
        "mcp_health_process_memory_rss_bytes",
    ] {
        if !types.contains_key(must) {
            problems.push(format!("{must} is not served"));
        }
    }
    // OpenMetrics: `# UNIT` for every family with a unit word, under a family that ends with it.
    let om_types: std::collections::BTreeMap<&str, &str> =
        om.lines().filter_map(|l| l.strip_prefix("# TYPE ")).filter_map(|l| l.split_once(' ')).collect();
    for (family, i) in &declared {
        let unit = names(i.name, i.unit, i.kind).unit;
        let line = om.lines().find(|l| l.strip_prefix("# UNIT ").is_some_and(|r| r.split(' ').next() == Some(family.as_str())));
        match (om_types.contains_key(family.as_str()), unit, line) {
            (false, _, _) => {}
            (true, Some(u), Some(l)) if l == format!("# UNIT {family} {u}") && family.ends_with(&format!("_{u}")) => {}
            (true, None, None) => {}
            (true, u, l) => problems.push(format!("OpenMetrics {family}: unit {u:?}, line {l:?}")),
        }
        if i.kind == Kind::Counter && om_types.get(family.as_str()).is_some_and(|k| *k != "counter") {
            problems.push(format!("OpenMetrics {family} is not a counter family"));
        }
    }
    assert_eq!(om_types.get("target"), Some(&"info"), "{om}");
    assert!(om.lines().any(|l| l.starts_with("mcp_health_calls_total{")) && om_types.get("mcp_health_calls") == Some(&"counter"), "{om}");
    assert!(problems.is_empty(), "{}\n--- exposition ---\n{text}", problems.join("\n"));
}

/// `service.telemetry.metrics.level: none` serves the verdict metrics and none of the service's
/// own; `basic` adds intake, export and the process, not the engine's internals; every level
/// serves what docs/metrics.md says it does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_level_chooses_what_is_served() {
    use mcp_health::config::MetricsLevel;
    use mcp_health::testing::emit::prometheus::names;
    use mcp_health::testing::telemetry::instruments::ALL;
    for (level, l) in [("none", MetricsLevel::None), ("basic", MetricsLevel::Basic)] {
        let svc = Service::start(Cfg { decision_wait: "300ms", metrics_level: Some(level), ..Cfg::default() }).await;
        for line in fixture_lines("eight_calls.jsonl") {
            assert_eq!(svc.post_json(line.as_bytes()).await.status, 200);
        }
        let text = svc.wait_metric("mcp_health_calls_total", Duration::from_secs(30), |v| v >= 8.0).await;
        let families: std::collections::BTreeSet<&str> =
            text.lines().filter_map(|l| l.strip_prefix("# TYPE ")).filter_map(|l| l.split(' ').next()).collect();
        assert!(families.contains("target_info"), "{level}: {families:?}");
        for i in ALL {
            let n = names(i.name, i.unit, i.kind);
            if families.contains(n.sample.as_str()) {
                assert!(i.tier.served_at(l), "{level} serves {} (level {})", n.sample, i.tier.as_str());
            }
        }
        // What each level must serve, with data from the fixture.
        for must in ["mcp_health_calls_total", "mcp_health_verdicts_total", "mcp_health_call_duration_seconds"] {
            assert!(families.contains(must), "{level}: {must} missing: {families:?}");
        }
        let internal = ["mcp_health_receiver_accepted_spans_total", "mcp_health_process_uptime_seconds_total"];
        for name in internal {
            assert_eq!(families.contains(name), l >= MetricsLevel::Basic, "{level}: {name}");
        }
        assert!(
            !families.contains("mcp_health_chains_in_flight") && !families.contains("mcp_health_verdict_delay_seconds"),
            "{level}: {families:?}"
        );
    }
}

/// The OTLP road and the scrape road give one name: every metric mcp-health sends over OTLP,
/// named by the compatibility rules from what OTLP carries (name, unit, type, monotonicity), is a
/// family on /metrics, and every family on /metrics is one of them. (A collector's Prometheus
/// exporters apply these rules to the OTLP metrics; the shipped dashboards then work on both.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_otlp_road_and_the_scrape_give_the_same_names() {
    use mcp_health::testing::emit::prometheus::names;
    use mcp_health::testing::telemetry::instruments::Kind;
    use opentelemetry_proto::tonic::metrics::v1::metric::Data;
    let sink = Sink::start().await;
    let svc = Service::start(Cfg { decision_wait: "300ms", ..Cfg::with_sink(&sink) }).await;
    for line in fixture_lines("eight_calls.jsonl") {
        assert_eq!(svc.post_json(line.as_bytes()).await.status, 200);
    }
    svc.wait_metric("mcp_health_call_duration_seconds_count", Duration::from_secs(30), |v| v >= 1.0).await;
    svc.wait_metric("mcp_health_calls_total", Duration::from_secs(30), |v| v >= 8.0).await;
    let families = |text: &str| -> std::collections::BTreeSet<String> {
        text.lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split(' ').next())
            .filter(|n| *n != "target_info")
            .map(String::from)
            .collect()
    };
    let before = families(&svc.metrics_text().await);
    let seen = sink.metric_requests().len();
    // The first export after that scrape, and a scrape after that export.
    let otlp = sink
        .wait_for(Duration::from_secs(30), "an OTLP metrics export after the scrape", |s| {
            let r = s.metric_requests();
            (r.len() > seen).then(|| r.last().cloned()).flatten()
        })
        .await;
    let after = families(&svc.metrics_text().await);
    let mut from_otlp = std::collections::BTreeSet::new();
    for rm in &otlp.resource_metrics {
        for sm in &rm.scope_metrics {
            assert_eq!(sm.scope.as_ref().map(|s| s.name.as_str()), Some("mcp-health"));
            assert_eq!(sm.scope.as_ref().map(|s| s.version.as_str()), Some(env!("CARGO_PKG_VERSION")));
            for m in &sm.metrics {
                let kind = match &m.data {
                    Some(Data::Sum(s)) if s.is_monotonic => Kind::Counter,
                    Some(Data::Sum(_)) | Some(Data::Gauge(_)) => Kind::Gauge,
                    Some(Data::Histogram(_)) => Kind::Histogram,
                    other => panic!("{}: unexpected data {other:?}", m.name),
                };
                assert!(!m.unit.is_empty(), "{} has no unit on OTLP", m.name);
                from_otlp.insert(names(&m.name, &m.unit, kind).sample);
            }
        }
    }
    let missing: Vec<&String> = before.iter().filter(|f| !from_otlp.contains(*f)).collect();
    let extra: Vec<&String> = from_otlp.iter().filter(|f| !after.contains(*f)).collect();
    assert!(missing.is_empty() && extra.is_empty(), "on /metrics, not from OTLP: {missing:?}\nfrom OTLP, not on /metrics: {extra:?}");
    for must in ["mcp_health_call_duration_seconds", "mcp_health_process_uptime_seconds_total", "mcp_health_process_memory_rss_bytes"] {
        assert!(from_otlp.contains(must), "{must} not from OTLP: {from_otlp:?}");
    }
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

/// The expressions of a rule or panel that must return data. A dashboard query is itself (a panel
/// that can never show anything is a broken panel). An alert rule's expression mostly fires only
/// on failure, and the fixtures are not all failing at once: its *inner vectors* are checked —
/// each operand of a top-level `and`, without the final threshold comparison (`> 0`, `< 0.5`,
/// `>= 10`). The inner vector still selects exactly the series the alert watches (same metric,
/// same matchers, same aggregation), so a renamed metric or label gives no data.
fn inner_vectors(expr: &str) -> Vec<String> {
    let e = expr.trim();
    // Top-level `and` (optionally `and on (...)`): split.
    let mut parts = Vec::new();
    let (mut depth, mut start, mut i) = (0i32, 0usize, 0usize);
    let b = e.as_bytes();
    while i < b.len() {
        match b[i] {
            b'(' | b'{' | b'[' => depth += 1,
            b')' | b'}' | b']' => depth -= 1,
            _ if depth == 0
                && e[i..].starts_with("and")
                && i > 0
                && b[i - 1].is_ascii_whitespace()
                && b.get(i + 3).is_some_and(|c| c.is_ascii_whitespace()) =>
            {
                parts.push(e[start..i].to_string());
                let mut rest = e[i + 3..].trim_start();
                if let Some(r) = rest.strip_prefix("on") {
                    let r = r.trim_start();
                    if let Some(close) = r.strip_prefix('(').and_then(|r| r.find(')').map(|c| c + 1)) {
                        rest = r[close + 1..].trim_start();
                    }
                }
                start = e.len() - rest.len();
                i = start;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    parts.push(e[start..].to_string());
    parts.into_iter().map(|p| strip_threshold(p.trim()).to_string()).collect()
}

/// `x > 0` → `x`: the last top-level comparison with a number literal on its right.
fn strip_threshold(e: &str) -> &str {
    let mut depth = 0i32;
    let mut cut = None;
    for (i, c) in e.char_indices() {
        match c {
            '(' | '{' | '[' => depth += 1,
            ')' | '}' | ']' => depth -= 1,
            '>' | '<' if depth == 0 => cut = Some(i),
            _ => {}
        }
    }
    match cut {
        Some(i) => {
            let rhs = e[i + 1..].trim_start_matches('=').trim();
            if rhs.parse::<f64>().is_ok() {
                e[..i].trim()
            } else {
                e
            }
        }
        None => e,
    }
}

/// Grafana's variables, as Grafana would fill them here: the rate interval at least four scrape
/// intervals (1 s here), the range the last 5 minutes, every dashboard variable "All" (`.*`).
fn grafana_substitute(e: &str) -> String {
    e.replace("${__rate_interval}", "15s")
        .replace("$__rate_interval", "15s")
        .replace("${__range}", "5m")
        .replace("$__range", "5m")
        .replace("${__interval}", "1s")
        .replace("$__interval", "1s")
        .replace("${server}", ".*")
        .replace("$server", ".*")
}

/// Every dashboard panel query and every alert rule returns data from a real Prometheus that
/// scraped the real service after the fixtures. Two instances, as a deployment would run them:
/// the first gets every fixture of calls, incidents and catalogs, the drift of a pinned tool, an
/// in-flight working call, verifier findings and a verifier that could not run, an undecodable
/// request (refused), and an upstream that never answers (exports fail, the pass-through queue
/// fills: back-pressure refusals and drops). The second runs at a cardinality limit of 1, so its
/// series fold into the overflow series (issue 10: the overflow panel failed exactly when
/// overflow happened). A panel or rule that errors, or comes back empty, fails the test with its
/// expression.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_panel_and_alert_expression_returns_data() {
    if !prometheus_available() {
        return;
    }
    // An upstream that accepts connections and never answers: every export waits out its timeout.
    let blackhole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let upstream = format!("http://{}", blackhole.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for c in blackhole.incoming().flatten() {
            held.push(c);
        }
    });
    // A lockfile pinning drift_before's definitions; drift_after changes one.
    let dir = tempfile::tempdir().unwrap();
    let lockfile = dir.path().join("mcp-health.lock.json");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mcp-health"))
        .args(["lock", &fixture_path("drift_before.jsonl").to_string_lossy(), "--lockfile", &lockfile.to_string_lossy()])
        .output()
        .expect("run mcp-health lock");
    assert!(out.status.success(), "mcp-health lock: {}", String::from_utf8_lossy(&out.stderr));
    // The same pins for a second server, whose drift is a second drift series (two series are
    // what it takes to overflow at a limit of 1).
    let mut lock: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&lockfile).unwrap()).unwrap();
    let pins = lock["servers"]["tickets.example.test:8443"].clone();
    assert!(pins.is_object(), "{lock}");
    lock["servers"]["tickets2.example.test:8443"] = pins;
    std::fs::write(&lockfile, serde_json::to_string_pretty(&lock).unwrap()).unwrap();
    let pinned = vec![("mcp_health", format!("lockfile: {}", serde_json::to_string(&lockfile).unwrap()))];

    let svc = Service::start(Cfg {
        decision_wait: "300ms",
        exporter: Some(upstream),
        exporter_timeout: "3s",
        retry_on_failure: Some("      enabled: false"),
        sending_queue_size: 200,
        listener_extra: pinned.clone(),
        ..Cfg::default()
    })
    .await;
    // Its gRPC receiver on TLS (the fixtures go over HTTP), with a certificate that expires in
    // two to three days: the certificate-expiry alerts have a gauge to read, within their window.
    let pki = support::pki::Pki::generate();
    let soon = humantime::format_rfc3339_seconds(std::time::SystemTime::now() + Duration::from_secs(3 * 86400)).to_string();
    pki.renew_server((soon[0..4].parse().unwrap(), soon[5..7].parse().unwrap(), soon[8..10].parse().unwrap()));
    let mut extra = pinned;
    extra.push(("grpc", pki.server_tls_yaml(false)));
    let overflowing =
        Service::start(Cfg { decision_wait: "300ms", cardinality_limit: Some(1), listener_extra: extra, ..Cfg::default() }).await;
    for f in ["eight_calls.jsonl", "incidents_five_expired.jsonl", "nine_states.jsonl", "catalog_cases.jsonl", "drift_after.jsonl"] {
        for line in fixture_lines(f) {
            for s in [&svc, &overflowing] {
                let r = s.post_json(line.as_bytes()).await;
                assert_eq!(r.status, 200, "{f}: {}", r.text());
            }
        }
    }
    // drift_after again, from the second server (new traces).
    for line in fixture_lines("drift_after.jsonl") {
        let mut v: serde_json::Value = serde_json::from_str(&line).unwrap();
        retrace(&mut v);
        let line = v.to_string().replace("\"tickets.example.test\"", "\"tickets2.example.test\"");
        assert_eq!(overflowing.post_json(line.as_bytes()).await.status, 200);
    }
    verifier_findings(&svc).await;
    working_call(&svc).await;
    // Undecodable: refused for good (what MCPHealthSpansLost watches).
    assert_eq!(svc.post_json(b"{not json").await.status, 400);
    // Back-pressure: the pass-through queue fills behind the silent upstream, and the receiver
    // refuses with a retryable answer (what MCPHealthBackpressure watches).
    let one = fixture_lines("eight_calls.jsonl").remove(0);
    let mut busy = false;
    for _ in 0..1000 {
        let r = svc.post_json(one.as_bytes()).await;
        if r.status != 200 {
            busy = true;
            break;
        }
    }
    assert!(busy, "the pass-through queue never filled");

    svc.wait_metric("mcp_health_verdicts_total", Duration::from_secs(30), |v| v >= 8.0).await;
    svc.wait_metric("mcp_health_catalog_drift_total", Duration::from_secs(30), |v| v >= 1.0).await;
    svc.wait_metric("mcp_health_exporter_dropped_total", Duration::from_secs(30), |v| v >= 1.0).await;
    overflowing.wait_metric("mcp_health_catalog_drift_total", Duration::from_secs(30), |v| v >= 2.0).await;
    assert!(overflowing.metrics_text().await.contains("otel_metric_overflow=\"true\""), "overflow series exist");
    let prom = Prometheus::start_with_targets(&[svc.prom_addr(), overflowing.prom_addr()], None, &[]).await;
    // Enough scrapes for every rate window (15 s) and for the working-time table's 30 s
    // subquery steps, while the working call goes on reporting progress.
    let keep_working = tokio::spawn(more_progress(svc.http_addr()));
    eventually_async(Duration::from_secs(120), "35 scrapes of each instance", || async {
        prom.query("min(count_over_time(up{job=\"mcp-health\"}[1m]))").await.filter(|v| v.parse::<f64>().unwrap_or(0.0) >= 35.0).map(|_| ())
    })
    .await;
    keep_working.abort();
    assert_eq!(prom.query("min(min_over_time(up{job=\"mcp-health\"}[1m]))").await.as_deref(), Some("1"), "every scrape succeeded");

    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut checks: Vec<(String, String)> = Vec::new();
    for e in std::fs::read_dir(root.join("otel-config/grafana/dashboards")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "json") {
            let mut exprs = Vec::new();
            collect_exprs(&serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap(), &mut exprs);
            for e in exprs {
                checks.push((format!("panel in {}", p.file_name().unwrap().to_string_lossy()), grafana_substitute(&e)));
            }
        }
    }
    // The dashboard's variables: `label_values(metric, label)` must list values.
    for e in std::fs::read_dir(root.join("otel-config/grafana/dashboards")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_none_or(|x| x != "json") {
            continue;
        }
        let dash: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        for v in dash["templating"]["list"].as_array().into_iter().flatten() {
            let q = v["query"]["query"].as_str().or(v["query"].as_str()).unwrap_or("");
            let Some(args) = q.strip_prefix("label_values(").and_then(|a| a.strip_suffix(')')) else { continue };
            let (metric, label) = args.rsplit_once(',').map(|(m, l)| (m.trim(), l.trim())).unwrap();
            let r =
                http_get(prom.addr, &format!("/api/v1/label/{label}/values?match[]={}", urlencode(metric))).await.expect("label values");
            let values: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
            assert!(
                values["data"].as_array().is_some_and(|a| !a.is_empty()),
                "dashboard variable ${} ({q}) lists nothing: {values}",
                v["name"].as_str().unwrap_or("?")
            );
        }
    }
    let panels = checks.len();
    let rules: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(root.join("otel-config/alerts.yml")).unwrap()).unwrap();
    let mut alerts = 0;
    for g in rules["groups"].as_sequence().into_iter().flatten() {
        for r in g["rules"].as_sequence().into_iter().flatten() {
            if let Some(e) = r["expr"].as_str() {
                alerts += 1;
                let name = r["alert"].as_str().or(r["record"].as_str()).unwrap_or("?");
                let layer = r["labels"]["first_failed_layer"].as_str().unwrap_or("other");
                for inner in inner_vectors(e) {
                    checks.push((format!("alert {name} ({layer}), inner vector"), inner));
                }
            }
        }
    }
    assert!(panels >= 20 && alerts >= 10, "expressions found: {panels} panel queries, {alerts} alert rules");
    let mut problems = Vec::new();
    for (what, q) in &checks {
        let r = http_get(prom.addr, &format!("/api/v1/query?query={}", urlencode(q))).await.expect("query");
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
        if v["status"] != "success" {
            problems.push(format!("{what}: error {}\n    {q}", v["error"]));
        } else if v["data"]["result"].as_array().is_none_or(|a| a.is_empty()) {
            problems.push(format!("{what}: no data\n    {q}"));
        }
    }
    if !problems.is_empty() {
        let text = svc.metrics_text().await;
        let served: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        panic!(
            "{} of {} expressions show nothing:\n{}\n--- what the first instance serves ---\n{}",
            problems.len(),
            checks.len(),
            problems.join("\n"),
            served.join("\n")
        );
    }
}

/// A `tools/call` with two verifier spans under it: a finding of rule `ticket_created`, and the
/// same rule failing to run (its destination unreachable).
async fn verifier_findings(svc: &Service) {
    use serde_json::json;
    let t0 = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    let attr = |k: &str, v: &str| json!({"key": k, "value": {"stringValue": v}});
    let trace = "5c000000000000000000000000000001";
    let span = move |id: &str, parent: Option<&str>, name: &str, kind: u8, start: u64, end: u64, attrs: Vec<serde_json::Value>| {
        let mut s = json!({"traceId": trace, "spanId": id, "name": name, "kind": kind, "startTimeUnixNano": start.to_string(),
            "endTimeUnixNano": end.to_string(), "attributes": attrs});
        if let Some(p) = parent {
            s["parentSpanId"] = json!(p);
        }
        s
    };
    let line = |service: &str, spans: Vec<serde_json::Value>| {
        json!({"resourceSpans": [{"resource": {"attributes": [attr("service.name", service)]}, "scopeSpans": [{"spans": spans}]}]})
            .to_string()
    };
    let ms = 1_000_000;
    let call = span(
        "0100000000000001",
        None,
        "tools/call create_ticket",
        3,
        t0,
        t0 + 50 * ms,
        vec![
            attr("mcp.method.name", "tools/call"),
            attr("gen_ai.tool.name", "create_ticket"),
            attr("jsonrpc.request.id", "7"),
            attr("server.address", "verify.example.test"),
        ],
    );
    let found = span(
        "0300000000000001",
        Some("0100000000000001"),
        "verify destination",
        1,
        t0 + 60 * ms,
        t0 + 95 * ms,
        vec![
            attr("mcp_health.outcome.result", "confirmed"),
            attr("mcp_health.outcome.method", "row_version"),
            attr("mcp_health.outcome.verifier", "ticket_created"),
        ],
    );
    let failed = span(
        "0300000000000002",
        Some("0100000000000001"),
        "verify destination",
        1,
        t0 + 60 * ms,
        t0 + 99 * ms,
        vec![attr("mcp_health.outcome.error", "unreachable"), attr("mcp_health.outcome.verifier", "ticket_created")],
    );
    // And a false success on a server nobody calls again: its outcome incident stays open.
    let trace2 = "5c000000000000000000000000000002";
    let mut call2 = span(
        "0100000000000002",
        None,
        "tools/call post_entry",
        3,
        t0,
        t0 + 50 * ms,
        vec![
            attr("mcp.method.name", "tools/call"),
            attr("gen_ai.tool.name", "post_entry"),
            attr("jsonrpc.request.id", "8"),
            attr("server.address", "ledger.example.test"),
        ],
    );
    call2["traceId"] = json!(trace2);
    let mut missing = span(
        "0300000000000003",
        Some("0100000000000002"),
        "verify destination",
        1,
        t0 + 60 * ms,
        t0 + 95 * ms,
        vec![
            attr("mcp_health.outcome.result", "missing"),
            attr("mcp_health.outcome.method", "row_version"),
            attr("mcp_health.outcome.verifier", "entry_posted"),
        ],
    );
    missing["traceId"] = json!(trace2);
    assert_eq!(svc.post_json(line("agent", vec![call, call2]).as_bytes()).await.status, 200);
    assert_eq!(svc.post_json(line("verifier", vec![found, failed, missing]).as_bytes()).await.status, 200);
    svc.wait_metric("mcp_health_verifier_errors_total", Duration::from_secs(20), |v| v >= 1.0).await;
}

/// Every `traceId` in an OTLP/JSON request made another one (its first hex digit `f`).
fn retrace(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m.iter_mut() {
                match (k.as_str(), x) {
                    ("traceId", serde_json::Value::String(t)) => t.replace_range(0..1, "f"),
                    (_, x) => retrace(x),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(retrace),
        _ => {}
    }
}

/// Progress on the working call every 2 s, so it stays in flight as long as the test needs.
async fn more_progress(http: std::net::SocketAddr) {
    for k in 4u64.. {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let _ = http_request(http, "POST", "/v1/traces", &[("Content-Type", "application/json")], progress_line(k).as_bytes()).await;
    }
}

const WORKING_TRACE: &str = "5b000000000000000000000000000001";

/// One `notifications/progress` span of the working call, at step `k` (value `k`, total 1000).
fn progress_line(k: u64) -> String {
    use serde_json::json;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    let attr = |k: &str, v: serde_json::Value| json!({"key": k, "value": v});
    let span = json!({"traceId": WORKING_TRACE, "spanId": format!("02000000{k:08x}"), "parentSpanId": "0100000000000001",
    "name": "notifications/progress", "kind": 2,
    "startTimeUnixNano": now.to_string(), "endTimeUnixNano": now.to_string(),
    "attributes": [
        attr("mcp.method.name", json!({"stringValue": "notifications/progress"})),
        attr("mcp_health.progress.token", json!({"stringValue": "tok-42"})),
        attr("mcp_health.progress.value", json!({"intValue": k.to_string()})),
        attr("mcp_health.progress.total", json!({"intValue": "1000"})),
    ]});
    json!({"resourceSpans": [{"resource": {"attributes": [attr("service.name", json!({"stringValue": "reports-mcp"}))]}, "scopeSpans": [{"spans": [span]}]}]})
        .to_string()
}

/// A `tools/call` in flight with valid progress (reported `working`), kept alive for the test.
async fn working_call(svc: &Service) {
    use serde_json::json;
    let t0 = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    let attr = |k: &str, v: serde_json::Value| json!({"key": k, "value": v});
    let line = |service: &str, spans: Vec<serde_json::Value>| {
        json!({"resourceSpans": [{"resource": {"attributes": [attr("service.name", json!({"stringValue": service}))]}, "scopeSpans": [{"spans": spans}]}]})
            .to_string()
    };
    let trace = WORKING_TRACE;
    let request = json!({"traceId": trace, "spanId": "0100000000000001", "name": "tools/call export_report", "kind": 3,
    "startTimeUnixNano": t0.to_string(), "endTimeUnixNano": t0.to_string(), "attributes": [
        attr("mcp.method.name", json!({"stringValue": "tools/call"})),
        attr("gen_ai.tool.name", json!({"stringValue": "export_report"})),
        attr("jsonrpc.request.id", json!({"stringValue": "42"})),
        attr("server.address", json!({"stringValue": "reports.example.test"})),
        attr("mcp_health.progress.token", json!({"stringValue": "tok-42"})),
        attr("mcp_health.call.phase", json!({"stringValue": "request_sent"})),
    ]});
    assert_eq!(svc.post_json(line("agent", vec![request]).as_bytes()).await.status, 200);
    for k in 1..=3 {
        assert_eq!(svc.post_json(progress_line(k).as_bytes()).await.status, 200);
    }
    svc.wait_metric("mcp_health_calls_working", Duration::from_secs(20), |v| v >= 1.0).await;
}
