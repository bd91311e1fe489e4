//! Issue 10: TLS on the receivers, with the collector's `tls` keys. A real OpenTelemetry Python
//! exporter (opentelemetry-exporter-otlp-proto-grpc, configured by its standard variables) and the
//! Rust SDK's (`opentelemetry-otlp`, tonic + rustls) send over TLS and mutual TLS to the gRPC
//! receiver; a Rust hyper-rustls client posts OTLP/HTTP over
//! TLS; `validate` and the start name a certificate file that is missing. Certificates are made
//! in each test (rcgen); everything runs on loopback.
//!
//! The Python environment is .venv-mcp (scripts/install-test-deps); without it the Python test
//! skips, except under CI (`CI` set) or with MCP_HEALTH_REQUIRE_DIALECTS=1.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use prost::Message;
use support::pki::{self, Pki};
use support::*;

/// One CLIENT `tools/call` span made with the Python SDK and exported once with
/// `OTLPSpanExporter` (TLS from the OTEL_EXPORTER_OTLP_* variables). Prints `RESULT SUCCESS` or
/// `RESULT FAILURE`.
const EXPORT_ONE: &str = r#"
import sys
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.trace import SpanKind

endpoint, tool, request_id = sys.argv[1], sys.argv[2], sys.argv[3]
memory = InMemorySpanExporter()
provider = TracerProvider(resource=Resource.create({"service.name": "py-tls-client"}))
provider.add_span_processor(SimpleSpanProcessor(memory))
attrs = {
    "mcp.method.name": "tools/call",
    "gen_ai.tool.name": tool,
    "gen_ai.operation.name": "execute_tool",
    "jsonrpc.request.id": request_id,
    "mcp.session.id": "sess-tls-1",
    "mcp.protocol.version": "2025-11-25",
    "network.transport": "tcp",
    "server.address": "tickets.example.test",
    "server.port": 8443,
}
with provider.get_tracer("e2e-tls").start_as_current_span("tools/call " + tool, kind=SpanKind.CLIENT, attributes=attrs):
    pass
result = OTLPSpanExporter(endpoint=endpoint, timeout=3).export(memory.get_finished_spans())
print("RESULT", result.name, flush=True)
"#;

/// Run [`EXPORT_ONE`]; true when the exporter reported success.
async fn python_export(py: &Path, endpoint: String, tool: &str, env: Vec<(&'static str, PathBuf)>) -> (bool, String) {
    let (py, tool) = (py.to_path_buf(), tool.to_string());
    tokio::task::spawn_blocking(move || {
        let mut c = Command::new(py);
        c.arg("-c").arg(EXPORT_ONE).arg(endpoint).arg(&tool).arg(format!("req-{tool}"));
        for k in [
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_CLIENT_KEY",
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_INSECURE",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        ] {
            c.env_remove(k);
        }
        c.envs(env).stdin(Stdio::null());
        let out = c.output().expect("run the Python exporter");
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (String::from_utf8_lossy(&out.stdout).contains("RESULT SUCCESS"), text)
    })
    .await
    .unwrap()
}

fn verdict_for<'a>(vs: &'a [serde_json::Value], tool: &str) -> Option<&'a serde_json::Value> {
    vs.iter().find(|v| v["tool"] == tool && v["method"] == "tools/call")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_otlp_exporter_over_tls_and_mutual_tls_to_the_grpc_receiver() {
    let Some(py) = venv_python(".venv-mcp") else { return };
    let pki = Pki::generate();

    // Server TLS only: an exporter trusting the CA is accepted and its call gets a verdict.
    let svc = Service::start(Cfg { listener_extra: vec![("grpc", pki.server_tls_yaml(false))], ..Cfg::default() }).await;
    let endpoint = format!("https://127.0.0.1:{}", svc.ports.grpc);
    let (ok, out) = python_export(&py, endpoint.clone(), "tls_probe", vec![("OTEL_EXPORTER_OTLP_CERTIFICATE", pki.ca.clone())]).await;
    assert!(ok, "the exporter could not send over TLS:\n{out}");
    let vs = eventually(Duration::from_secs(20), "the verdict of the call sent over TLS", || {
        let vs = svc.verdicts();
        verdict_for(&vs, "tls_probe").is_some().then_some(vs)
    })
    .await;
    let v = verdict_for(&vs, "tls_probe").unwrap();
    assert_eq!(v["request_id"], "req-tls_probe", "{v}");
    // A plaintext exporter is refused: its "handshake" fails, and that is counted.
    let (ok, out) = python_export(&py, format!("http://127.0.0.1:{}", svc.ports.grpc), "plain_probe", vec![]).await;
    assert!(!ok, "a plaintext exporter was accepted by the TLS receiver:\n{out}");
    svc.wait_metric("mcp_health_connections_refused_total", Duration::from_secs(10), |v| v >= 1.0).await;
    let t = svc.metrics_text().await;
    assert!(connection_count(&t, "mcp_health_connections_refused_total", "otlp_grpc", "tls_handshake") >= 1.0, "{t}");
    drop(svc);

    // Mutual TLS: without a client certificate, or with one from another CA, refused; with one
    // signed by client_ca_file, accepted.
    let svc = Service::start(Cfg { listener_extra: vec![("grpc", pki.server_tls_yaml(true))], ..Cfg::default() }).await;
    let endpoint = format!("https://127.0.0.1:{}", svc.ports.grpc);
    let (ok, out) = python_export(&py, endpoint.clone(), "no_cert", vec![("OTEL_EXPORTER_OTLP_CERTIFICATE", pki.ca.clone())]).await;
    assert!(!ok, "a client without a certificate was accepted under mutual TLS:\n{out}");
    let stranger = vec![
        ("OTEL_EXPORTER_OTLP_CERTIFICATE", pki.ca.clone()),
        ("OTEL_EXPORTER_OTLP_CLIENT_KEY", pki.stranger_key.clone()),
        ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", pki.stranger_cert.clone()),
    ];
    let (ok, out) = python_export(&py, endpoint.clone(), "stranger", stranger).await;
    assert!(!ok, "a client certificate from another CA was accepted:\n{out}");
    let trusted = vec![
        ("OTEL_EXPORTER_OTLP_CERTIFICATE", pki.ca.clone()),
        ("OTEL_EXPORTER_OTLP_CLIENT_KEY", pki.client_key.clone()),
        ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", pki.client_cert.clone()),
    ];
    let (ok, out) = python_export(&py, endpoint, "mtls_probe", trusted).await;
    assert!(ok, "a client certificate signed by client_ca_file was refused:\n{out}");
    eventually(Duration::from_secs(20), "the verdict of the call sent over mutual TLS", || {
        verdict_for(&svc.verdicts(), "mtls_probe").cloned()
    })
    .await;
    let vs = svc.verdicts();
    assert!(verdict_for(&vs, "no_cert").is_none() && verdict_for(&vs, "stranger").is_none(), "a refused client's span was read: {vs:?}");
    let t = svc.metrics_text().await;
    assert!(connection_count(&t, "mcp_health_connections_refused_total", "otlp_grpc", "tls_handshake") >= 2.0, "{t}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_http_over_tls_and_mutual_tls() {
    let pki = Pki::generate();
    let mut yaml = pki.server_tls_yaml(true);
    yaml.push_str("  min_version: \"1.3\"\n");
    let svc = Service::start(Cfg { listener_extra: vec![("http", yaml)], ..Cfg::default() }).await;
    let url = format!("https://127.0.0.1:{}/v1/traces", svc.ports.http);
    let body = |tool: &str| {
        request("http-tls-client", vec![call_span([7; 16], [1; 8], None, tool, &format!("req-{tool}"), vec![])]).encode_to_vec()
    };

    let with_cert = pki::client_config(&pki.ca, Some((&pki.client_cert, &pki.client_key)));
    let (status, _) = pki::https_post(with_cert, &url, "application/x-protobuf", body("https_probe")).await.expect("POST over mutual TLS");
    assert_eq!(status, 200);
    eventually(Duration::from_secs(20), "the verdict of the call posted over TLS", || verdict_for(&svc.verdicts(), "https_probe").cloned())
        .await;

    // No client certificate: the handshake is refused, nothing is read.
    let without = pki::client_config(&pki.ca, None);
    let r = pki::https_post(without, &url, "application/x-protobuf", body("https_no_cert")).await;
    assert!(r.is_err(), "a client without a certificate got an answer: {r:?}");
    // A server the client does not trust (its own roots do not sign the server): refused by the client.
    let other = Pki::generate();
    let r = pki::https_post(
        pki::client_config(&other.ca, Some((&pki.client_cert, &pki.client_key))),
        &url,
        "application/x-protobuf",
        body("x"),
    )
    .await;
    assert!(r.is_err(), "the client trusted a server its CA did not sign: {r:?}");
    // Plain HTTP to the TLS port gets no HTTP answer.
    let r = http_request(svc.http_addr(), "POST", "/v1/traces", &[("Content-Type", "application/x-protobuf")], &body("plain")).await;
    assert!(r.is_err() || r.as_ref().is_ok_and(|r| r.status == 0), "plain HTTP was answered on the TLS port: {r:?}");
    svc.wait_metric("mcp_health_connections_refused_total", Duration::from_secs(10), |v| v >= 2.0).await;
    let t = svc.metrics_text().await;
    assert!(connection_count(&t, "mcp_health_connections_refused_total", "otlp_http", "tls_handshake") >= 2.0, "{t}");
    assert!(verdict_for(&svc.verdicts(), "https_no_cert").is_none());
}

fn write_config(dir: &Path, tls: &str) -> PathBuf {
    let p = dir.join("c.yaml");
    let indented: String = tls.lines().map(|l| format!("        {l}\n")).collect();
    std::fs::write(&p, format!("receivers:\n  otlp:\n    protocols:\n      grpc:\n        endpoint: 127.0.0.1:0\n{indented}")).unwrap();
    p
}

#[test]
fn validate_and_start_name_a_missing_certificate_or_key_file() {
    let pki = Pki::generate();
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-server.pem");
    let cases = [
        (
            format!("tls:\n  cert_file: {}\n  key_file: {}\n", missing.display(), pki.server_key.display()),
            "receivers.otlp.protocols.grpc.tls.cert_file",
            missing.display().to_string(),
        ),
        (
            format!("tls:\n  cert_file: {}\n  key_file: {}\n", pki.server_cert.display(), dir.path().join("gone.key").display()),
            "receivers.otlp.protocols.grpc.tls.key_file",
            dir.path().join("gone.key").display().to_string(),
        ),
        (
            format!("tls:\n  cert_file: {}\n  key_file: {}\n", pki.server_cert.display(), pki.client_key.display()),
            "receivers.otlp.protocols.grpc.tls.key_file",
            "cannot be used".to_string(),
        ),
        (
            format!(
                "tls:\n  cert_file: {}\n  key_file: {}\n  client_ca_file: {}\n",
                pki.server_cert.display(),
                pki.server_key.display(),
                pki.server_key.display()
            ),
            "receivers.otlp.protocols.grpc.tls.client_ca_file",
            pki.server_key.display().to_string(),
        ),
    ];
    for (tls, key, names) in cases {
        let cfg = write_config(dir.path(), &tls);
        for sub in ["validate", "serve"] {
            let mut c = Command::new(env!("CARGO_BIN_EXE_mcp-health"));
            if sub == "validate" {
                c.arg("validate").arg(&cfg);
            } else {
                c.arg("serve").arg("--config").arg(&cfg);
            }
            let out = c.stdin(Stdio::null()).output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{sub} with {tls}: {err}");
            assert!(err.contains(key) && err.contains(&names), "{sub} does not name {key} and {names}: {err}");
        }
    }
    // The same files, all present and matching: valid.
    let cfg = write_config(dir.path(), &pki.server_tls_yaml(true));
    let out = Command::new(env!("CARGO_BIN_EXE_mcp-health")).arg("validate").arg(&cfg).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// The Rust OpenTelemetry SDK's OTLP exporter (`opentelemetry-otlp`, tonic with rustls) over
/// mutual TLS: with a client certificate from the configured CA its span is judged; without
/// one the export fails (the receiver asks for a certificate).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_sdk_otlp_exporter_over_mutual_tls() {
    use opentelemetry::trace::SpanKind;
    use opentelemetry::KeyValue;
    use opentelemetry_otlp::{WithExportConfig, WithTonicConfig};
    use opentelemetry_sdk::trace::SpanExporter as _;
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};

    let pki = Pki::generate();
    let svc = Service::start(Cfg { listener_extra: vec![("grpc", pki.server_tls_yaml(true))], ..Cfg::default() }).await;
    let read = |p: &Path| std::fs::read_to_string(p).unwrap();
    let tls = |with_identity: bool| {
        let c = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(&pki.ca))).domain_name("localhost");
        if with_identity {
            c.identity(Identity::from_pem(read(&pki.client_cert), read(&pki.client_key)))
        } else {
            c
        }
    };
    let export = |with_identity: bool, tool: &'static str| {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(format!("https://localhost:{}", svc.ports.grpc))
            .with_tls_config(tls(with_identity))
            .with_timeout(Duration::from_secs(5))
            .build()
            .expect("build the exporter");
        async move {
            use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};
            let now = std::time::SystemTime::now();
            let mut id = [0u8; 16];
            id[..tool.len().min(16)].copy_from_slice(&tool.as_bytes()[..tool.len().min(16)]);
            let span = opentelemetry_sdk::trace::SpanData {
                span_context: SpanContext::new(
                    TraceId::from_bytes(id),
                    SpanId::from_bytes([7; 8]),
                    TraceFlags::SAMPLED,
                    false,
                    TraceState::default(),
                ),
                parent_span_id: SpanId::INVALID,
                parent_span_is_remote: false,
                span_kind: SpanKind::Client,
                name: format!("tools/call {tool}").into(),
                start_time: now - Duration::from_millis(20),
                end_time: now,
                attributes: vec![
                    KeyValue::new("mcp.method.name", "tools/call"),
                    KeyValue::new("gen_ai.tool.name", tool),
                    KeyValue::new("jsonrpc.request.id", format!("req-{tool}")),
                    KeyValue::new("server.address", "tickets.example.test"),
                ],
                dropped_attributes_count: 0,
                events: Default::default(),
                links: Default::default(),
                status: opentelemetry::trace::Status::Unset,
                instrumentation_scope: opentelemetry::InstrumentationScope::builder("e2e-tls-rust").build(),
            };
            exporter.export(vec![span]).await
        }
    };
    assert!(export(true, "rust_mtls_probe").await.is_ok(), "the Rust exporter with a client certificate is accepted");
    eventually(Duration::from_secs(20), "the Rust SDK's call over mutual TLS", || {
        let vs = svc.verdicts();
        verdict_for(&vs, "rust_mtls_probe").is_some().then_some(())
    })
    .await;
    assert!(export(false, "rust_no_cert_probe").await.is_err(), "without a client certificate the export fails");
}

/// The gate over mutual TLS (`extensions.gate.tls`): a client with a certificate from the
/// configured CA gets its answer; one without is refused at the handshake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gate_answers_over_mutual_tls_only_to_a_client_with_a_certificate() {
    use mcp_health::testing::gate::service::pb::gate_client::GateClient;
    use mcp_health::testing::gate::service::pb::CheckToolRequest;
    use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

    let pki = Pki::generate();
    let svc = Service::start(Cfg { gate: true, listener_extra: vec![("gate", pki.server_tls_yaml(true))], ..Cfg::default() }).await;
    let read = |p: &Path| std::fs::read_to_string(p).unwrap();
    let connect = |identity: bool| {
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(&pki.ca))).domain_name("localhost");
        if identity {
            tls = tls.identity(Identity::from_pem(read(&pki.client_cert), read(&pki.client_key)));
        }
        let ep = Channel::from_shared(format!("https://localhost:{}", svc.ports.gate)).unwrap().tls_config(tls).unwrap();
        async move { ep.connect().await }
    };
    let req = CheckToolRequest {
        server: "tickets.example.test:8443".into(),
        tool: "create_ticket".into(),
        digest: format!("sha256:{}", "0".repeat(64)),
    };
    let ch = connect(true).await.expect("a client with a certificate connects");
    let answer = GateClient::new(ch).check_tool(req.clone()).await.expect("the gate answers over mutual TLS").into_inner();
    assert!(answer.allow, "unpinned: allow, as configured: {answer:?}");
    let refused = match connect(false).await {
        Err(_) => true,
        Ok(ch) => GateClient::new(ch).check_tool(req).await.is_err(),
    };
    assert!(refused, "a client without a certificate gets no answer");
}
