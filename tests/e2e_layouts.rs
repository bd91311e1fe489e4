//! The shipped layouts do what their headers say: each mcp-health configuration of `otel-config/`
//! (and the embedded default) runs beside the collector configuration its header names, and a
//! real OTLP backend (a gRPC sink) counts what arrives — every span the applications sent exactly
//! once (none lost, none twice), and mcp-health's own health spans, counted separately, each once.
//!
//! Who plays the collector. No OpenTelemetry Collector is installable here, and `rotel-agent`
//! (`.venv-rotel`: PyPI `rotel` 0.0.1a15, pinned by scripts/install-test-deps) takes one exporter
//! per signal ("Only one exporter supported for ROTEL_EXPORTERS_TRACES"), so it cannot fan one
//! receiver out to two exporters. So:
//! - the collector's receiver and its pipelines for the applications' traces are the test: it
//!   decodes each OTLP/JSON request as the collector's `otlp` receiver does and exports the same
//!   request over OTLP/gRPC to every exporter that the collector file's `traces*` pipelines on
//!   receiver `otlp` name — `otlp/traces_backend` (the sink) and/or `otlp/mcp_health` (mcp-health),
//!   exactly as the collector's pipelines would. The routing is read from the file, not written
//!   here, so a collector file that sends a span twice or nowhere fails;
//! - the collector's second receiver (`otlp/from_mcp_health`) and its `traces/out` pipeline to the
//!   backend are a real `rotel-agent`, forwarding to the same sink.
//!
//! Also checked without running anything: both files parse as YAML, name the same ports (the
//! collector's `otlp/mcp_health` endpoint is mcp-health's gRPC receiver; mcp-health's upstream is
//! the collector's `otlp/from_mcp_health`), each header names its layout and its collector file,
//! and docker-compose.yml wires the same ports. And `scripts/send_fixture.py` (the compose stack's
//! traffic) moves a fixture to now.

mod support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use serde_yaml_ng::Value;
use support::*;

const WAIT: Duration = Duration::from_secs(60);
const FIXTURE: &str = "eight_calls.jsonl";
/// Health spans the fixture's calls produce (one per decided call).
const HEALTH_SPANS: usize = 8;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
}

fn yaml(rel: &str) -> Value {
    serde_yaml_ng::from_str(&read(rel)).unwrap_or_else(|e| panic!("{rel} is not YAML: {e}"))
}

fn at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, k| v.get(*k))
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    at(v, path).and_then(Value::as_str)
}

/// The port an address names, as a configuration writes it: `host:port`, `scheme://host:port`, or
/// `${env:VAR:-default}` (its default).
fn port_of(s: &str) -> Option<u16> {
    let s = s.trim();
    let s = match s.strip_prefix("${env:") {
        Some(rest) => rest.split_once(":-")?.1.strip_suffix('}')?,
        None => s,
    };
    let s = s.rsplit("://").next()?;
    s.trim_end_matches('/').rsplit(':').next()?.parse().ok()
}

/// The text of the leading comment block of a configuration file, its lines joined by spaces.
fn header(rel: &str) -> String {
    read(rel).lines().map_while(|l| l.strip_prefix('#')).map(str::trim).collect::<Vec<_>>().join(" ")
}

// ---------------------------------------------------------------------------------------------
// The collector's side, as its file says
// ---------------------------------------------------------------------------------------------

const BACKEND: &str = "otlp/traces_backend";
const TO_MCP_HEALTH: &str = "otlp/mcp_health";
const FROM_MCP_HEALTH: &str = "otlp/from_mcp_health";

/// What a collector configuration does with traces.
#[derive(Debug)]
struct Collector {
    /// The exporters the applications' traces go to (`traces*` pipelines on receiver `otlp`).
    app_traces_to: BTreeSet<String>,
    /// The exporters what mcp-health sends back goes to (`traces*` pipelines on `otlp/from_mcp_health`).
    returned_traces_to: BTreeSet<String>,
    /// The port of `otlp/mcp_health`'s endpoint (mcp-health's gRPC receiver).
    to_mcp_health_port: u16,
    /// The gRPC port of `otlp/from_mcp_health` (mcp-health's upstream).
    from_mcp_health_port: u16,
}

fn collector(rel: &str) -> Collector {
    let c = yaml(rel);
    let pipelines = at(&c, &["service", "pipelines"]).and_then(Value::as_mapping).unwrap_or_else(|| panic!("{rel}: no pipelines"));
    let names = |v: Option<&Value>| -> BTreeSet<String> {
        v.and_then(Value::as_sequence).into_iter().flatten().filter_map(|x| x.as_str().map(str::to_string)).collect()
    };
    let (mut app, mut returned) = (BTreeSet::new(), BTreeSet::new());
    for (name, p) in pipelines {
        let name = name.as_str().unwrap_or_default();
        if name.split('/').next() != Some("traces") {
            continue;
        }
        let receivers = names(p.get("receivers"));
        let exporters = names(p.get("exporters"));
        for e in &exporters {
            assert!(c.get("exporters").and_then(|x| x.get(e.as_str())).is_some(), "{rel}: pipeline {name} names no such exporter {e}");
        }
        if receivers.contains("otlp") {
            app.extend(exporters.iter().cloned());
        }
        if receivers.contains(FROM_MCP_HEALTH) {
            returned.extend(exporters);
        }
    }
    let to = str_at(&c, &["exporters", TO_MCP_HEALTH, "endpoint"]).unwrap_or_else(|| panic!("{rel}: no {TO_MCP_HEALTH} endpoint"));
    let from = str_at(&c, &["receivers", FROM_MCP_HEALTH, "protocols", "grpc", "endpoint"])
        .unwrap_or_else(|| panic!("{rel}: no {FROM_MCP_HEALTH} gRPC endpoint"));
    Collector {
        app_traces_to: app,
        returned_traces_to: returned,
        to_mcp_health_port: port_of(to).unwrap_or_else(|| panic!("{rel}: {TO_MCP_HEALTH} endpoint {to} names no port")),
        from_mcp_health_port: port_of(from).unwrap_or_else(|| panic!("{rel}: {FROM_MCP_HEALTH} endpoint {from} names no port")),
    }
}

// ---------------------------------------------------------------------------------------------
// The shipped pairs
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq)]
enum Layout {
    /// The collector sends every span to the backend and a copy to mcp-health; mcp-health sends
    /// back only what it adds.
    FanOut,
    /// The traces go through mcp-health (`passthrough: true`).
    Inline,
}

/// How mcp-health is given its upstream (the collector's `otlp/from_mcp_health`).
#[derive(Clone, Copy, Debug)]
enum Upstream {
    /// `--set exporters.otlp.endpoint=…` (over the file's own, or into the embedded default).
    Set,
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`, as the image documents.
    Env,
}

#[derive(Clone, Copy, Debug)]
struct Pair {
    /// The mcp-health configuration (`None`: the embedded default, otel-config/default.yaml).
    config: Option<&'static str>,
    collector: &'static str,
    layout: Layout,
    upstream: Upstream,
}

impl Pair {
    fn file(&self) -> &'static str {
        self.config.unwrap_or("otel-config/default.yaml")
    }
}

const PAIRS: &[Pair] = &[
    Pair {
        config: Some("otel-config/mcp-health.yaml"),
        collector: "otel-config/collector.yaml",
        layout: Layout::FanOut,
        upstream: Upstream::Set,
    },
    Pair {
        config: Some("otel-config/mcp-health.compose.yaml"),
        collector: "otel-config/collector.yaml",
        layout: Layout::FanOut,
        upstream: Upstream::Set,
    },
    Pair {
        config: Some("otel-config/container.yaml"),
        collector: "otel-config/collector.yaml",
        layout: Layout::FanOut,
        upstream: Upstream::Env,
    },
    Pair { config: None, collector: "otel-config/collector.yaml", layout: Layout::FanOut, upstream: Upstream::Set },
    Pair {
        config: Some("otel-config/mcp-health.inline.yaml"),
        collector: "otel-config/collector.inline.yaml",
        layout: Layout::Inline,
        upstream: Upstream::Set,
    },
];

/// Every mcp-health configuration shipped in otel-config/ is in [`PAIRS`] (a new one must say
/// which layout it is for, and be run).
#[test]
fn every_shipped_mcp_health_config_is_paired() {
    let paired: BTreeSet<&str> = PAIRS.iter().map(Pair::file).collect();
    for e in std::fs::read_dir(root().join("otel-config")).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let rel = format!("otel-config/{name}");
        let Some(ext) = name.rsplit_once('.').map(|(_, x)| x) else { continue };
        if !matches!(ext, "yaml" | "yml") || name.starts_with("collector") {
            continue;
        }
        let v = yaml(&rel);
        if v.get("receivers").is_some() && v.get("processors").is_some() {
            assert!(paired.contains(rel.as_str()), "{rel} is an mcp-health configuration that tests/e2e_layouts.rs does not run");
        }
    }
}

/// The collector files route as their layout says, both files name the same ports, and each
/// header names its layout and its partner.
#[test]
fn each_pair_parses_names_the_same_ports_and_says_its_layout() {
    for pair in PAIRS {
        let c = collector(pair.collector);
        let want_app: BTreeSet<String> = match pair.layout {
            Layout::FanOut => [BACKEND, TO_MCP_HEALTH].map(String::from).into(),
            Layout::Inline => [TO_MCP_HEALTH].map(String::from).into(),
        };
        assert_eq!(c.app_traces_to, want_app, "{}: where the applications' traces go ({:?} layout)", pair.collector, pair.layout);
        assert_eq!(c.returned_traces_to, [BACKEND.to_string()].into(), "{}: where mcp-health's traces go", pair.collector);

        let file = pair.file();
        let m = yaml(file);
        let passthrough = at(&m, &["exporters", "otlp", "passthrough"]).and_then(Value::as_bool);
        match pair.layout {
            Layout::FanOut => assert_ne!(passthrough, Some(true), "{file}: pass-through on in the fan-out layout"),
            Layout::Inline => assert_eq!(passthrough, Some(true), "{file}: pass-through off in the inline layout"),
        }
        // The embedded default listens on the quickstart's loopback ports; the others on the ports
        // their collector file sends to.
        if pair.config.is_some() {
            let grpc = str_at(&m, &["receivers", "otlp", "protocols", "grpc", "endpoint"]).expect("a gRPC receiver");
            assert_eq!(port_of(grpc), Some(c.to_mcp_health_port), "{file}: gRPC receiver {grpc} vs {}'s {TO_MCP_HEALTH}", pair.collector);
        }
        if let Some(up) = str_at(&m, &["exporters", "otlp", "endpoint"]) {
            assert_eq!(port_of(up), Some(c.from_mcp_health_port), "{file}: upstream {up} vs {}'s {FROM_MCP_HEALTH}", pair.collector);
        }

        let (word, other) = match pair.layout {
            Layout::FanOut => ("fan-out", "inline"),
            Layout::Inline => ("inline", "fan-out"),
        };
        for (f, partner) in [(file, pair.collector), (pair.collector, file)] {
            let h = header(f);
            assert!(h.contains(&format!("{word} layout")), "{f}: the header does not say it is for the {word} layout:\n{h}");
            assert!(h.contains(partner), "{f}: the header does not name {partner}:\n{h}");
            // Naming the other layout is fine (where to find it), claiming it is not.
            assert!(!h.contains(&format!("in the {other} layout, with")), "{f}: the header claims the {other} layout:\n{h}");
        }
    }
}

/// docker-compose.yml mounts the fan-out pair and wires the ports both files name.
#[test]
fn compose_wires_the_fan_out_pair() {
    let compose = yaml("docker-compose.yml");
    let svc = |name: &str| at(&compose, &["services", name]).unwrap_or_else(|| panic!("docker-compose.yml: no {name} service")).clone();
    let (col, mcp) = (svc("collector"), svc("mcp-health"));
    let mounts = |s: &Value| -> Vec<String> {
        s.get("volumes").and_then(Value::as_sequence).into_iter().flatten().filter_map(|v| v.as_str().map(str::to_string)).collect()
    };
    assert!(mounts(&col).iter().any(|m| m.starts_with("./otel-config/collector.yaml:")), "the collector does not run collector.yaml");
    assert!(
        mounts(&mcp).iter().any(|m| m.starts_with("./otel-config/mcp-health.compose.yaml:")),
        "mcp-health does not run mcp-health.compose.yaml"
    );
    let c = collector("otel-config/collector.yaml");
    let env = |s: &Value, k: &str| str_at(s, &["environment", k]).unwrap_or_else(|| panic!("docker-compose.yml: no {k}")).to_string();
    let to = env(&col, "MCP_HEALTH_ENDPOINT");
    assert!(to.starts_with("mcp-health:"), "MCP_HEALTH_ENDPOINT {to}");
    assert_eq!(port_of(&to), port_of(&env(&mcp, "MCP_HEALTH_GRPC_ENDPOINT")), "the collector sends to mcp-health's gRPC receiver");
    let up = env(&mcp, "MCP_HEALTH_UPSTREAM");
    assert!(up.contains("collector:"), "MCP_HEALTH_UPSTREAM {up}");
    assert_eq!(port_of(&up), Some(c.from_mcp_health_port), "mcp-health sends to the collector's {FROM_MCP_HEALTH}");
    // The drain gets its time: Docker's stop waits longer than the configured shutdown_timeout.
    let grace = str_at(&mcp, &["stop_grace_period"]).expect("mcp-health has a stop_grace_period");
    let compose_cfg = yaml("otel-config/mcp-health.compose.yaml");
    let drain = str_at(&compose_cfg, &["service", "telemetry", "shutdown_timeout"]).unwrap_or("10s");
    let secs = |s: &str| s.trim_end_matches('s').parse::<u64>().unwrap_or_else(|_| panic!("{s}: whole seconds"));
    assert!(secs(grace) > secs(drain), "stop_grace_period {grace} is not above shutdown_timeout {drain}");
    // No host port of the stack is one of the quickstart's (a local `mcp-health serve`).
    for (name, s) in compose["services"].as_mapping().unwrap() {
        for p in s.get("ports").and_then(Value::as_sequence).into_iter().flatten() {
            let host = p.as_str().and_then(|p| p.split(':').nth(1)).unwrap_or_default();
            assert!(!["4317", "4318", "9464", "13133"].contains(&host), "{name:?} publishes the quickstart's port {host}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Running a pair
// ---------------------------------------------------------------------------------------------

/// rotel's agent binary, from the venv scripts/install-test-deps makes; `None` with a skip line
/// (a failure under CI).
fn rotel_agent() -> Option<PathBuf> {
    let lib = root().join(".venv-rotel/lib");
    let found = std::fs::read_dir(lib)
        .ok()
        .and_then(|d| d.flatten().map(|d| d.path().join("site-packages/rotel/rotel-agent")).find(|p| p.is_file()));
    if found.is_none() {
        assert!(std::env::var_os("CI").is_none(), ".venv-rotel is missing under CI: scripts/install-test-deps makes it");
        println!("SKIPPED: .venv-rotel is missing (scripts/install-test-deps makes it)");
    }
    found
}

/// A child process, killed on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// rotel as the collector's `otlp/from_mcp_health` receiver with `traces/out` to the backend:
/// OTLP/gRPC in, OTLP/gRPC out to `backend`. Returns it and its gRPC port.
async fn start_rotel(agent: &Path, dir: &Path, backend: &str) -> (Proc, u16) {
    let mut last = String::new();
    // rotel binds the ports it is given; one taken in the meantime by a parallel test: try others.
    for _ in 0..5 {
        let (grpc, http) = (free_port(), free_port());
        let out = std::fs::File::create(dir.join("rotel.out")).unwrap();
        let child = Command::new(agent)
            .args(["start", "--otlp-grpc-endpoint", &format!("127.0.0.1:{grpc}"), "--otlp-http-endpoint", &format!("127.0.0.1:{http}")])
            .args(["--exporter", "otlp", "--otlp-exporter-protocol", "grpc", "--otlp-exporter-endpoint", backend])
            .arg("--pid-file")
            .arg(dir.join("rotel.pid"))
            .arg("--log-file")
            .arg(dir.join("rotel.log"))
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("start rotel");
        let p = std::sync::Mutex::new(Proc(child));
        let up = eventually_async(Duration::from_secs(10), "rotel to listen or exit", || async {
            if let Ok(Some(_)) = p.lock().unwrap().0.try_wait() {
                return Some(false);
            }
            tokio::net::TcpStream::connect(("127.0.0.1", grpc)).await.ok().map(|_| true)
        })
        .await;
        if up {
            return (p.into_inner().unwrap(), grpc);
        }
        last = std::fs::read_to_string(dir.join("rotel.out")).unwrap_or_default();
    }
    panic!("rotel did not start:\n{last}");
}

/// A running `mcp-health serve` on a shipped configuration, its listeners moved to free loopback
/// ports with `--set` (nothing else of the file changed).
struct McpHealth {
    proc: Proc,
    ports: Ports,
    dir: tempfile::TempDir,
}

impl McpHealth {
    async fn start(pair: &Pair, upstream: &str) -> McpHealth {
        let mut last = String::new();
        for _ in 0..5 {
            let ports = Ports::pick();
            let dir = tempfile::tempdir().unwrap();
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_mcp-health"));
            cmd.current_dir(root()).arg("serve");
            if let Some(c) = pair.config {
                cmd.args(["--config", c]);
            }
            for set in [
                format!("receivers.otlp.protocols.grpc.endpoint=127.0.0.1:{}", ports.grpc),
                format!("receivers.otlp.protocols.http.endpoint=127.0.0.1:{}", ports.http),
                format!("exporters.prometheus.endpoint=127.0.0.1:{}", ports.prometheus),
                format!("extensions.health_check.endpoint=127.0.0.1:{}", ports.health),
            ] {
                cmd.args(["--set", &set]);
            }
            // Nothing from the developer's shell: only what the pair says.
            for (k, _) in std::env::vars() {
                if k.starts_with("OTEL_") || k.starts_with("MCP_HEALTH_") || k == "RUST_LOG" {
                    cmd.env_remove(k);
                }
            }
            match pair.upstream {
                Upstream::Set => cmd.args(["--set", &format!("exporters.otlp.endpoint={upstream}")]),
                Upstream::Env => cmd.env("OTEL_EXPORTER_OTLP_ENDPOINT", upstream),
            };
            let child = cmd
                .stdin(Stdio::null())
                .stdout(std::fs::File::create(dir.path().join("stdout")).unwrap())
                .stderr(std::fs::File::create(dir.path().join("stderr")).unwrap())
                .spawn()
                .expect("spawn mcp-health");
            let mut m = McpHealth { proc: Proc(child), ports, dir };
            let health = std::net::SocketAddr::from(([127, 0, 0, 1], ports.health));
            let up = eventually_async(Duration::from_secs(30), "mcp-health to answer its health check or exit", || {
                let exited = matches!(m.proc.0.try_wait(), Ok(Some(_)));
                async move {
                    if exited {
                        return Some(false);
                    }
                    http_get(health, "/").await.ok().filter(|r| r.status == 200).map(|_| true)
                }
            })
            .await;
            if up && matches!(m.proc.0.try_wait(), Ok(None)) {
                return m;
            }
            last = m.stderr();
            if !(last.contains("cannot listen") || last.contains("Address already in use")) {
                panic!("mcp-health on {} did not start:\n{last}", pair.file());
            }
            m.proc.0.kill().ok();
        }
        panic!("mcp-health could not bind free ports after 5 attempts:\n{last}");
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr")).unwrap_or_default()
    }

    fn grpc(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.ports.grpc))
    }

    async fn metrics(&self) -> String {
        let r = http_get(std::net::SocketAddr::from(([127, 0, 0, 1], self.ports.prometheus)), "/metrics").await.expect("GET /metrics");
        r.text()
    }
}

/// The sum of the series of `name` that carry every `labels` pair.
fn prom_value(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.strip_prefix(name).map(|rest| (l, rest)))
        .filter(|(_, rest)| rest.starts_with('{') || rest.starts_with(' '))
        .filter(|(l, _)| labels.iter().all(|(k, v)| l.contains(&format!("{k}=\"{v}\""))))
        .filter_map(|(l, _)| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum()
}

/// Export one request as a collector's OTLP exporter would: retried while the receiver answers
/// with a retryable code.
async fn export(to: std::net::SocketAddr, what: &str, req: &ExportTraceServiceRequest) {
    eventually_async(WAIT, what, || async {
        match grpc_export(to, req.clone()).await {
            Ok(_) => Some(()),
            Err(s) if matches!(s.code(), tonic::Code::Unavailable | tonic::Code::ResourceExhausted) => None,
            Err(s) => panic!("{what}: {s}"),
        }
    })
    .await;
}

type SpanKey = (Vec<u8>, Vec<u8>);

/// Run one pair with the fixture and count at the backend.
async fn run_pair(agent: &Path, pair: Pair) {
    let file = pair.file();
    let c = collector(pair.collector);
    let backend = Sink::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (_rotel, from_mcp_health) = start_rotel(agent, dir.path(), &backend.endpoint()).await;
    let mcp = McpHealth::start(&pair, &format!("http://127.0.0.1:{from_mcp_health}")).await;

    // The applications' requests, decoded as the collector's receiver decodes them, and exported
    // to each exporter of the collector's pipelines on that receiver.
    let requests: Vec<ExportTraceServiceRequest> = fixture_lines(FIXTURE)
        .iter()
        .map(|l| mcp_health::testing::receive::otlp_json::decode_traces(l.as_bytes()).expect("the fixture is OTLP/JSON"))
        .collect();
    let mut sent: HashMap<SpanKey, usize> = HashMap::new();
    for s in flatten(&requests) {
        *sent.entry((s.span.trace_id.clone(), s.span.span_id.clone())).or_default() += 1;
    }
    assert!(sent.values().all(|n| *n == 1), "the fixture repeats a span");
    for req in &requests {
        for e in &c.app_traces_to {
            match e.as_str() {
                BACKEND => export(backend.addr, "the traces pipeline's export to the backend", req).await,
                TO_MCP_HEALTH => export(mcp.grpc(), "the export to mcp-health", req).await,
                other => panic!("{}: a traces pipeline exports to {other}, which this test cannot play", pair.collector),
            }
        }
    }

    // Everything mcp-health sent has reached the backend (through rotel), and the health spans
    // are there: then nothing more is on its way.
    let what = format!("{file}: the fixture's spans and {HEALTH_SPANS} health spans at the backend, all mcp-health sent delivered");
    eventually_async(WAIT, &what, || async {
        let t = mcp.metrics().await;
        let spans = backend.spans();
        let health = spans.iter().filter(|s| s.is_health_span()).count();
        let received = spans.len() - health;
        let out_health = prom_value(&t, "mcp_health_exporter_sent_spans_total", &[("signal", "health_spans")]) as usize;
        let out_pass = prom_value(&t, "mcp_health_exporter_sent_spans_total", &[("signal", "passthrough")]) as usize;
        let direct = if c.app_traces_to.contains(BACKEND) { sent.len() } else { 0 };
        (health >= HEALTH_SPANS && health == out_health && received >= sent.len() && received == direct + out_pass).then_some(())
    })
    .await;

    let spans = backend.spans();
    let mut received: BTreeMap<SpanKey, usize> = BTreeMap::new();
    let mut health: BTreeMap<SpanKey, usize> = BTreeMap::new();
    for s in &spans {
        let key = (s.span.trace_id.clone(), s.span.span_id.clone());
        *if s.is_health_span() { &mut health } else { &mut received }.entry(key).or_default() += 1;
    }
    let twice: Vec<_> = received.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "{file} with {}: spans reached the backend more than once: {twice:?}", pair.collector);
    let lost: Vec<_> = sent.keys().filter(|k| !received.contains_key(*k)).collect();
    assert!(lost.is_empty(), "{file} with {}: spans never reached the backend: {lost:?}", pair.collector);
    assert_eq!(received.len(), sent.len(), "{file}: the backend got spans nobody sent");
    assert!(health.values().all(|n| *n == 1), "{file}: a health span reached the backend twice: {health:?}");
    assert_eq!(health.len(), HEALTH_SPANS, "{file}: one health span per call");
    // And mcp-health itself counted what it passed on as the layout says.
    let t = mcp.metrics().await;
    let passed_on = prom_value(&t, "mcp_health_exporter_sent_spans_total", &[("signal", "passthrough")]) as usize;
    match pair.layout {
        Layout::FanOut => assert_eq!(passed_on, 0, "{file}: mcp-health passed received spans on in the fan-out layout"),
        Layout::Inline => assert_eq!(passed_on, sent.len(), "{file}: mcp-health passed on {passed_on} of {} spans", sent.len()),
    }
    // Health spans sit in the calls' traces.
    let traces: BTreeSet<&Vec<u8>> = sent.keys().map(|(t, _)| t).collect();
    assert!(health.keys().all(|(t, _)| traces.contains(t)), "{file}: a health span outside the calls' traces");
    drop(mcp);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fan_out_pairs_deliver_every_span_once_with_health_spans_beside() {
    let Some(agent) = rotel_agent() else { return };
    for pair in PAIRS.iter().filter(|p| p.layout == Layout::FanOut) {
        run_pair(&agent, *pair).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_pair_delivers_every_span_once_through_mcp_health() {
    let Some(agent) = rotel_agent() else { return };
    for pair in PAIRS.iter().filter(|p| p.layout == Layout::Inline) {
        run_pair(&agent, *pair).await;
    }
}

// ---------------------------------------------------------------------------------------------
// The compose stack's traffic
// ---------------------------------------------------------------------------------------------

/// `scripts/send_fixture.py` (docker-compose.yml's `traffic`) sends every span of the fixture to a
/// real OTLP/HTTP receiver (mcp-health's), moved so the latest end is now, durations kept, trace
/// ids fresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_compose_traffic_arrives_dated_now() {
    let Some(python) = venv_python(".venv-rotel") else { return };
    let sink = Sink::start().await;
    let svc = Service::start(Cfg { passthrough: true, ..Cfg::with_sink(&sink) }).await;
    let started = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64;
    let out = Command::new(python)
        .arg(root().join("scripts/send_fixture.py"))
        .args(["--endpoint", &format!("http://{}", svc.http_addr()), "--wait", "30"])
        .arg(fixture_path(FIXTURE))
        .stdin(Stdio::null())
        .output()
        .expect("run scripts/send_fixture.py");
    assert!(out.status.success(), "send_fixture.py: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let done = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64;

    let requests: Vec<ExportTraceServiceRequest> =
        fixture_lines(FIXTURE).iter().map(|l| mcp_health::testing::receive::otlp_json::decode_traces(l.as_bytes()).unwrap()).collect();
    let recorded = flatten(&requests);
    let passed = sink
        .wait_for(WAIT, "every fixture span passed on", |s| {
            let got: Vec<ReceivedSpan> = s.spans().into_iter().filter(|x| !x.is_health_span()).collect();
            (got.len() >= recorded.len()).then_some(got)
        })
        .await;
    assert_eq!(passed.len(), recorded.len());
    let by_id: HashMap<&[u8], &ReceivedSpan> = passed.iter().map(|s| (s.span.span_id.as_slice(), s)).collect();
    let old_traces: BTreeSet<&Vec<u8>> = recorded.iter().map(|s| &s.span.trace_id).collect();
    let latest = passed.iter().map(|s| s.span.end_time_unix_nano).max().unwrap();
    assert!((started..=done).contains(&latest), "the latest end {latest} is not the moment it was sent ({started}..{done})");
    for r in &recorded {
        let s = by_id.get(r.span.span_id.as_slice()).unwrap_or_else(|| panic!("span {:?} not sent", r.span.span_id));
        assert_eq!(
            s.span.end_time_unix_nano - s.span.start_time_unix_nano,
            r.span.end_time_unix_nano - r.span.start_time_unix_nano,
            "a duration changed"
        );
        assert!(!old_traces.contains(&s.span.trace_id), "the recorded trace id was kept");
        assert_eq!(s.span.name, r.span.name);
    }
    // One fresh id per recorded trace: the calls' spans stay together.
    let pairs: BTreeSet<(&Vec<u8>, &Vec<u8>)> =
        recorded.iter().map(|r| (&r.span.trace_id, &by_id[r.span.span_id.as_slice()].span.trace_id)).collect();
    assert_eq!(pairs.len(), old_traces.len(), "a recorded trace was split or merged");
    // mcp-health decided the moved calls as it decides the recorded ones.
    let verdicts = svc.wait_verdicts(HEALTH_SPANS, WAIT).await;
    assert!(verdicts.len() >= HEALTH_SPANS);
}
