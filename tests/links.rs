//! Links between the views (issue 37): every alert rule links its runbook section and the Grafana
//! dashboard; the dashboard links the status page and the trace backend; the provisioned
//! Prometheus data source turns an exemplar's trace id into a link to the trace. And the metrics
//! reference documents every family the service serves.
//!
//! The rules go through `promtool` (Debian's `prometheus`), the links are resolved against the
//! files they name (the runbook's headings, the dashboard's uid and variables, the provisioned data
//! sources, the ports docker-compose.yml publishes), and the exemplar link is rendered with a trace
//! id scraped from the real service after the eight-call fixture. Without promtool the promtool
//! check says SKIPPED (a failure under CI).

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use support::*;

const WAIT: Duration = Duration::from_secs(60);

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
}

fn yaml(rel: &str) -> Value {
    serde_yaml_ng::from_str(&read(rel)).unwrap_or_else(|e| panic!("{rel} is not YAML: {e}"))
}

fn dashboard() -> Value {
    let rel = "otel-config/grafana/dashboards/mcp-health.json";
    serde_json::from_str(&read(rel)).unwrap_or_else(|e| panic!("{rel} is not JSON: {e}"))
}

/// Every rule of the shipped rule file, as (name, rule).
fn rules() -> Vec<(String, Value)> {
    let doc = yaml("otel-config/alerts.yml");
    let mut out = Vec::new();
    for g in doc["groups"].as_array().expect("groups") {
        for (i, r) in g["rules"].as_array().expect("rules").iter().enumerate() {
            let name = r["alert"].as_str().or(r["record"].as_str()).map_or_else(|| format!("rule {i}"), str::to_string);
            out.push((format!("{} / {name} (#{i})", g["name"].as_str().unwrap_or("?")), r.clone()));
        }
    }
    assert!(out.len() >= 6, "only {} rules in otel-config/alerts.yml", out.len());
    out
}

/// The anchors GitHub (and most Markdown renderers) give the headings of `markdown`: lowercased,
/// punctuation other than `-` and `_` dropped, spaces as `-`, a repeated one suffixed `-1`, `-2`.
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let Some(text) = line.strip_prefix('#').filter(|_| !fenced) else { continue };
        let text = text.trim_start_matches('#');
        if !text.starts_with(' ') {
            continue;
        }
        let slug: String = text
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let n = seen.entry(slug.clone()).or_insert(0);
        out.insert(if *n == 0 { slug.clone() } else { format!("{slug}-{n}") });
        *n += 1;
    }
    out
}

#[test]
fn anchors_follow_the_github_rules() {
    let got = anchors("# Runbooks\n## MCPIncidentOpen, transport\n```\n# not a heading\n```\n### A: b (c)\n## A: b (c)\n#nospace\n");
    let want: BTreeSet<String> = ["runbooks", "mcpincidentopen-transport", "a-b-c", "a-b-c-1"].into_iter().map(str::to_string).collect();
    assert_eq!(got, want);
}

// ---------------------------------------------------------------------------------------------
// Alert rules → runbook and dashboard
// ---------------------------------------------------------------------------------------------

#[test]
fn promtool_checks_the_rules_with_their_link_annotations() {
    let Some(promtool) = on_path("promtool") else {
        assert!(std::env::var_os("CI").is_none(), "promtool is missing under CI (apt-get install prometheus)");
        println!("SKIPPED: promtool not found (apt-get install prometheus)");
        return;
    };
    // check rules parses every annotation as a template: a broken `{{ … }}` in a link fails here.
    let out = Command::new(&promtool)
        .current_dir(root())
        .args(["check", "rules", "otel-config/alerts.yml"])
        .stdin(Stdio::null())
        .output()
        .expect("run promtool");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "promtool check rules otel-config/alerts.yml:\n{text}");
    assert!(text.contains(&format!("SUCCESS: {} rules found", rules().len())), "{text}");
    // test rules renders them: alerts_test.yml expects each alert's runbook_url and the
    // dashboard_url with its server filled in.
    let tests = read("otel-config/alerts_test.yml");
    assert!(
        tests.contains("runbook_url:") && tests.contains("dashboard_url: \"/d/mcp-health/mcp-health?var-server="),
        "alerts_test.yml does not check the links"
    );
    let out = Command::new(&promtool)
        .current_dir(root())
        .args(["test", "rules", "otel-config/alerts_test.yml"])
        .stdin(Stdio::null())
        .output()
        .expect("run promtool");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("SUCCESS"), "promtool test rules otel-config/alerts_test.yml:\n{text}");
}

/// Every rule — including ones added later — has a `runbook_url` whose section exists in
/// docs/runbooks.md and a `dashboard_url` on the shipped dashboard's uid path whose variables the
/// dashboard defines; a rule that keeps `server_address` selects that server.
#[test]
fn every_rule_links_an_existing_runbook_section_and_the_dashboard() {
    let runbook = "docs/runbooks.md";
    let sections = anchors(&read(runbook));
    let dash = dashboard();
    let uid = dash["uid"].as_str().expect("the dashboard has a uid");
    let variables: BTreeSet<&str> = dash["templating"]["list"].as_array().unwrap().iter().filter_map(|v| v["name"].as_str()).collect();
    let mut problems = Vec::new();
    for (name, r) in rules() {
        let a = &r["annotations"];
        match a["runbook_url"].as_str() {
            None => problems.push(format!("{name}: no runbook_url annotation")),
            Some(url) => match url.split_once('#') {
                Some((path, fragment)) if path == runbook => {
                    if !sections.contains(fragment) {
                        problems.push(format!("{name}: runbook_url {url}: {runbook} has no heading #{fragment}"));
                    }
                }
                _ => problems.push(format!("{name}: runbook_url {url} is not {runbook}#<section>")),
            },
        }
        match a["dashboard_url"].as_str() {
            None => problems.push(format!("{name}: no dashboard_url annotation")),
            Some(url) => {
                if !url.starts_with(&format!("/d/{uid}/")) {
                    problems.push(format!("{name}: dashboard_url {url} is not the dashboard's path /d/{uid}/…"));
                }
                for var in url.split(['?', '&']).skip(1).filter_map(|kv| kv.split_once('=')).filter_map(|(k, _)| k.strip_prefix("var-")) {
                    if !variables.contains(var) {
                        problems.push(format!("{name}: dashboard_url sets var-{var}, which the dashboard does not define"));
                    }
                }
                let expr = r["expr"].as_str().unwrap_or("");
                let keeps_server = expr.split("by (").skip(1).any(|s| s.split(')').next().is_some_and(|l| l.contains("server_address")));
                if keeps_server && variables.contains("server") && !url.contains("var-server={{") {
                    problems.push(format!("{name}: keeps server_address but dashboard_url does not select it: {url}"));
                }
            }
        }
    }
    assert!(problems.is_empty(), "alert rules without working links (docs/runbooks.md explains the scheme):\n  {}", problems.join("\n  "));
}

/// The runbook says, per first failed layer, who acts: the receiver Alertmanager routes it to.
#[test]
fn the_runbook_names_the_owner_alertmanager_routes_each_layer_to() {
    let page = read("docs/runbooks.md");
    let am = yaml("otel-config/alertmanager.yml");
    for route in am["route"]["routes"].as_array().unwrap() {
        let receiver = route["receiver"].as_str().unwrap();
        let layer = route["matchers"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|m| m.as_str())
            .find_map(|m| m.strip_prefix("first_failed_layer=\"").and_then(|l| l.strip_suffix('"')).filter(|l| *l != "none"));
        let Some(layer) = layer else { continue };
        let section = page
            .split("\n### ")
            .find(|s| s.starts_with(&format!("MCPIncidentOpen, {layer}")))
            .unwrap_or_else(|| panic!("docs/runbooks.md has no section for first_failed_layer={layer}"));
        assert!(section.contains(&format!("**Who acts:** `{receiver}`")), "the {layer} section does not name {receiver}:\n{section}");
        assert!(section.contains("\n1. ") && section.contains("\n3. "), "the {layer} section has no first three steps");
    }
}

// ---------------------------------------------------------------------------------------------
// Grafana: data sources and dashboard links
// ---------------------------------------------------------------------------------------------

/// Every provisioned data source (all files of the folder docker-compose.yml mounts).
fn datasources() -> Vec<Value> {
    let dir = root().join("otel-config/grafana/provisioning/datasources");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let rel = f.strip_prefix(root()).unwrap().to_string_lossy().into_owned();
        let doc = yaml(&rel);
        assert_eq!(doc["apiVersion"], 1, "{rel}");
        out.extend(doc["datasources"].as_array().unwrap_or_else(|| panic!("{rel}: no datasources")).iter().cloned());
    }
    out
}

/// What Grafana makes of a provisioned value: `$$` is a literal `$`; any other `$NAME` /
/// `${NAME}` is an environment variable (none is set in the compose file's Grafana, so it would
/// become empty — which is what broke a `${__value.raw}` written with one `$`).
fn grafana_provisioned(value: &str) -> Result<String, String> {
    let unescaped = value.replace("$$", "\u{0}");
    if unescaped.contains('$') {
        return Err(format!("{value:?} has an unescaped `$`: Grafana would expand it from the environment"));
    }
    Ok(unescaped.replace('\u{0}', "$"))
}

/// Grafana's data-link templating of an exemplar: `${__value.raw}` is the exemplar label's value.
fn render_exemplar_link(template: &str, trace_id: &str) -> String {
    template.replace("${__value.raw}", trace_id)
}

/// The host port docker-compose.yml publishes for `service`'s container port `container`.
fn compose_host_port(service: &str, container: u16) -> u16 {
    let compose = yaml("docker-compose.yml");
    let ports =
        compose["services"][service]["ports"].as_array().unwrap_or_else(|| panic!("docker-compose.yml: {service} publishes no port"));
    ports
        .iter()
        .filter_map(|p| p.as_str())
        .find_map(|p| {
            let parts: Vec<&str> = p.split(':').collect();
            (parts.len() == 3 && parts[0] == "127.0.0.1" && parts[2] == container.to_string()).then(|| parts[1].parse().unwrap())
        })
        .unwrap_or_else(|| panic!("docker-compose.yml: {service} does not publish {container} on 127.0.0.1"))
}

/// The Prometheus data source sends exemplar trace ids to a Jaeger data source that is provisioned
/// (by uid), and to the Jaeger UI the compose file publishes; every provisioned value survives
/// Grafana's environment expansion.
#[test]
fn the_prometheus_data_source_links_exemplars_to_the_jaeger_data_source() {
    let all = datasources();
    let uids: BTreeMap<&str, &str> =
        all.iter().map(|d| (d["uid"].as_str().expect("every data source has a uid"), d["type"].as_str().unwrap())).collect();
    let prom = all.iter().find(|d| d["type"] == "prometheus").expect("a Prometheus data source");
    let dests =
        prom["jsonData"]["exemplarTraceIdDestinations"].as_array().expect("exemplarTraceIdDestinations on the Prometheus data source");
    assert!(!dests.is_empty());
    let mut internal = 0;
    let mut external = 0;
    for d in dests {
        assert_eq!(d["name"], "trace_id", "the exemplar label mcp-health writes is trace_id: {d}");
        if let Some(uid) = d["datasourceUid"].as_str() {
            assert_eq!(uids.get(uid), Some(&"jaeger"), "{d} names data source {uid}; provisioned: {uids:?}");
            internal += 1;
        }
        if let Some(url) = d["url"].as_str() {
            let url = grafana_provisioned(url).unwrap();
            assert!(url.contains("${__value.raw}"), "{url}: no ${{__value.raw}}");
            external += 1;
        }
    }
    assert!(internal >= 1 && external >= 1, "want a link through the Jaeger data source and one to the Jaeger UI: {dests:?}");

    // The Jaeger data source reaches the compose file's jaeger service on its UI/API port.
    let jaeger = all.iter().find(|d| d["type"] == "jaeger").unwrap();
    assert_eq!(jaeger["url"], "http://jaeger:16686");
    compose_host_port("jaeger", 16686);
    for d in &all {
        walk_strings(d, &mut |s| {
            grafana_provisioned(s).unwrap();
        });
    }
}

fn walk_strings(v: &Value, f: &mut impl FnMut(&str)) {
    match v {
        Value::String(s) => f(s),
        Value::Array(a) => a.iter().for_each(|x| walk_strings(x, f)),
        Value::Object(m) => m.values().for_each(|x| walk_strings(x, f)),
        _ => {}
    }
}

/// The dashboard links the status page and the trace backend, through variables whose defaults
/// are the ports docker-compose.yml publishes (the status page on mcp-health's health check port,
/// Jaeger's UI).
#[test]
fn the_dashboard_links_the_status_page_and_the_trace_backend() {
    let dash = dashboard();
    let vars: BTreeMap<&str, &Value> =
        dash["templating"]["list"].as_array().unwrap().iter().map(|v| (v["name"].as_str().unwrap(), v)).collect();
    let links = dash["links"].as_array().expect("links");
    let resolve = |url: &str| -> String {
        let mut out = url.to_string();
        for (name, v) in &vars {
            let default = v["current"]["value"].as_str().or(v["query"].as_str()).unwrap_or("");
            out = out.replace(&format!("${{{name}}}"), default);
        }
        assert!(!out.contains('$'), "{url}: a variable the dashboard does not define");
        out
    };
    let mcp = yaml("otel-config/mcp-health.compose.yaml");
    let health_port: u16 = mcp["extensions"]["health_check"]["endpoint"].as_str().unwrap().rsplit(':').next().unwrap().parse().unwrap();
    let status = format!("http://127.0.0.1:{}/status", compose_host_port("mcp-health", health_port));
    let jaeger = format!("http://127.0.0.1:{}/", compose_host_port("jaeger", 16686));
    let urls: Vec<String> = links.iter().map(|l| resolve(l["url"].as_str().expect("a link with a url"))).collect();
    assert!(urls.contains(&status), "no dashboard link to {status}: {urls:?}");
    assert!(urls.iter().any(|u| u.starts_with(&jaeger)), "no dashboard link to Jaeger at {jaeger}: {urls:?}");
    assert!(links.iter().all(|l| l["type"] == "link" && l["targetBlank"] == true), "{links:?}");
}

// ---------------------------------------------------------------------------------------------
// The real service: an exemplar opens a trace of the fixture; the reference documents every family
// ---------------------------------------------------------------------------------------------

fn fixture_trace_ids(name: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in fixture_lines(name) {
        let v: Value = serde_json::from_str(&line).unwrap();
        walk_key(&v, "traceId", &mut |s| {
            out.insert(s.to_ascii_lowercase());
        });
    }
    out
}

fn walk_key(v: &Value, key: &str, f: &mut impl FnMut(&str)) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                match (k == key, x) {
                    (true, Value::String(s)) => f(s),
                    _ => walk_key(x, key, f),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| walk_key(x, key, f)),
        _ => {}
    }
}

/// The exemplar's trace id, scraped as Prometheus scrapes (OpenMetrics), put through the provisioned
/// link templates, is a trace of the fixture: the external link is Jaeger's trace page of it, the
/// internal one queries the Jaeger data source with it. The status page the dashboard links is
/// the service's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exemplar_link_renders_to_a_trace_of_the_fixture() {
    let traces = fixture_trace_ids("eight_calls.jsonl");
    assert!(!traces.is_empty());
    let svc = Service::start(Cfg { decision_wait: "300ms", exporter: None, ..Cfg::default() }).await;
    for line in fixture_lines("eight_calls.jsonl") {
        assert_eq!(svc.post_json(line.as_bytes()).await.status, 200);
    }
    svc.wait_metric("mcp_health_call_duration_seconds_count", WAIT, |v| v == 8.0).await;
    let om = http_request(svc.prom_addr(), "GET", "/metrics", &[("Accept", "application/openmetrics-text")], &[]).await.unwrap();
    assert_eq!(om.status, 200);
    let om = om.text();
    let scraped: Vec<String> = om
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(" # {trace_id=\"").map(|(_, rest)| rest.split('"').next().unwrap().to_string()))
        .collect();
    assert!(!scraped.is_empty(), "no exemplar with a trace_id in the OpenMetrics scrape:\n{om}");

    let prom = datasources().into_iter().find(|d| d["type"] == "prometheus").unwrap();
    let dests = prom["jsonData"]["exemplarTraceIdDestinations"].as_array().unwrap().clone();
    let jaeger_ui = format!("http://127.0.0.1:{}", compose_host_port("jaeger", 16686));
    for trace_id in &scraped {
        assert!(traces.contains(trace_id), "exemplar trace id {trace_id} is not one of the fixture's {traces:?}");
        for d in &dests {
            if let Some(url) = d["url"].as_str() {
                let rendered = render_exemplar_link(&grafana_provisioned(url).unwrap(), trace_id);
                assert_eq!(rendered, format!("{jaeger_ui}/trace/{trace_id}"), "the link of {d}");
            }
            if d["datasourceUid"].is_string() {
                // Grafana's internal exemplar link queries the data source with `${__value.raw}`.
                assert_eq!(render_exemplar_link("${__value.raw}", trace_id), *trace_id);
            }
        }
    }

    let status = http_get(svc.health_addr(), "/status").await.expect("GET /status");
    assert_eq!(status.status, 200, "the status page the dashboard links: {}", status.text());
}

/// Prometheus family or sample names → the names docs/metrics.md may document them under: the
/// name itself, with `_total` (OpenMetrics names counter families without it) or `_info` (and
/// info families without that), without a
/// histogram's `_bucket`/`_sum`/`_count` (or a counter's `_created`), and the OpenTelemetry name
/// with dots as underscores and the unit suffix dropped.
fn doc_names(served: &str) -> Vec<String> {
    let mut base = vec![served.to_string()];
    for suffix in ["_bucket", "_sum", "_count", "_created"] {
        if let Some(b) = served.strip_suffix(suffix) {
            base.push(b.to_string());
        }
    }
    let mut out = Vec::new();
    for b in base {
        out.push(format!("{b}_total"));
        out.push(format!("{b}_info")); // an OpenMetrics info family (target_info is `target`)
        let mut core = b.strip_suffix("_total").unwrap_or(&b).to_string();
        out.push(core.clone());
        for unit in ["_seconds", "_bytes", "_ratio"] {
            if let Some(c) = core.strip_suffix(unit) {
                core = c.to_string();
            }
        }
        out.push(core);
        out.push(b);
    }
    out
}

/// What docs/metrics.md documents: every backticked metric name (Prometheus names, and the
/// OpenTelemetry names with dots as underscores).
fn documented() -> BTreeSet<String> {
    let page = read("docs/metrics.md");
    page.split('`')
        .skip(1)
        .step_by(2)
        .filter(|t| t.starts_with("mcp_health") || *t == "target_info")
        .filter(|t| t.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.'))
        .map(|t| t.replace('.', "_"))
        .collect()
}

fn served_families(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for l in text.lines() {
        if let Some(rest) = l.strip_prefix("# TYPE ") {
            out.insert(rest.split(' ').next().unwrap().to_string());
        } else if !l.starts_with('#') && !l.is_empty() {
            out.insert(l.split(['{', ' ']).next().unwrap().to_string());
        }
    }
    out
}

#[test]
fn the_name_mapping_is_the_documented_one() {
    let doc: BTreeSet<String> = ["mcp_health_verdicts_total", "mcp_health_call_duration_seconds", "mcp_health_exporter_queue_stored_bytes"]
        .into_iter()
        .map(str::to_string)
        .collect();
    let ok = |s: &str| doc_names(s).iter().any(|n| doc.contains(n));
    for s in ["mcp_health_verdicts", "mcp_health_verdicts_total", "mcp_health_verdicts_created", "mcp_health_call_duration_seconds_bucket"]
    {
        assert!(ok(s), "{s}");
    }
    assert!(ok("mcp_health_exporter_queue_stored_bytes"));
    assert!(doc_names("target").contains(&"target_info".to_string()));
    assert!(!ok("mcp_health_verdict") && !ok("mcp_health_call_duration_seconds_total_bucket_x"));
}

/// Every family the service serves — after the fixtures, with the exporter, the on-disk sending
/// queue and the state store on, at the most detailed level — is documented in docs/metrics.md.
/// A family someone adds without documenting it is named in the failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_served_metric_family_is_documented() {
    let sink = Sink::start().await;
    let state = tempfile::tempdir().unwrap();
    let svc = Service::start(Cfg {
        storage: Some(state.path().to_path_buf()),
        metrics_level: Some("detailed"),
        gate: true,
        ..Cfg::with_sink(&sink)
    })
    .await;
    let mut sent = 0usize;
    for f in [
        "eight_calls.jsonl",
        "nine_states.jsonl",
        "catalog_cases.jsonl",
        "drift_before.jsonl",
        "drift_after.jsonl",
        "incidents_five_expired.jsonl",
        "incidents_resolved.jsonl",
    ] {
        for line in fixture_lines(f) {
            let r = svc.post_json(line.as_bytes()).await;
            assert_eq!(r.status, 200, "{f}: {}", r.text());
            sent += 1;
        }
    }
    // A request refused for good, so the refusal families are served too.
    assert_ne!(svc.post_json(b"{not json").await.status, 200);
    assert!(sent > 20);
    svc.wait_metric("mcp_health_calls_total", WAIT, |v| v >= 8.0).await;
    let text = svc.wait_metric("mcp_health_exporter_sent_spans_total", WAIT, |v| v >= 1.0).await;
    let om = http_request(svc.prom_addr(), "GET", "/metrics", &[("Accept", "application/openmetrics-text")], &[]).await.unwrap().text();

    let mut served = served_families(&text);
    served.extend(served_families(&om));
    let documented = documented();
    let undocumented: Vec<&String> = served.iter().filter(|s| !doc_names(s).iter().any(|n| documented.contains(n))).collect();
    assert!(
        undocumented.is_empty(),
        "served on /metrics but not documented in docs/metrics.md (declare them in src/telemetry/instruments.rs and regenerate with \
         MCP_HEALTH_WRITE_DOCS=1 cargo test --lib metrics_reference):\n  {}",
        undocumented.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n  ")
    );
    // The check saw what it is about: the on-disk queue's five and the families of the fixtures.
    for want in [
        "mcp_health_exporter_queue_stored_requests",
        "mcp_health_exporter_queue_stored_items",
        "mcp_health_exporter_queue_stored_bytes",
        "mcp_health_exporter_queue_stored_capacity_bytes",
        "mcp_health_exporter_queue_damaged_files_total",
        "mcp_health_verdicts_total",
        "mcp_health_call_duration_seconds_bucket",
        "mcp_health_catalog_convergence",
        "mcp_health_incidents_open",
        "target_info",
    ] {
        assert!(served.contains(want), "{want} not served; the check would miss it:\n{text}");
    }
    assert!(served.len() > 40, "only {} families served:\n{text}", served.len());
}

fn on_path(bin: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(bin)).find(|p| p.is_file())
}
