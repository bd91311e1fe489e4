//! Issue 10, "an export loop from one variable": mcp-health's exporter pointed at the collector
//! that feeds it turned one span into 44,919 in 6 s and revised one verdict five times. Here the
//! collector is an in-test forwarder that sends everything it receives straight back to
//! mcp-health: one span in must be one span out (and one health span), the verdict decided once.

mod support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use support::*;
use tonic::{Request, Response, Status};

const WAIT: Duration = Duration::from_secs(30);

/// A collector that sends every trace request it receives back to mcp-health (once it is known).
#[derive(Clone, Default)]
struct Forwarder {
    to: Arc<Mutex<Option<SocketAddr>>>,
    seen: Arc<Mutex<Vec<ExportTraceServiceRequest>>>,
}

#[tonic::async_trait]
impl TraceService for Forwarder {
    async fn export(&self, r: Request<ExportTraceServiceRequest>) -> Result<Response<ExportTraceServiceResponse>, Status> {
        let req = r.into_inner();
        self.seen.lock().unwrap().push(req.clone());
        let to = *self.to.lock().unwrap();
        if let Some(addr) = to {
            grpc_export(addr, req).await?;
        }
        Ok(Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_loop_passes_one_span_in_as_one_span_out() {
    let fwd = Forwarder::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let fwd_addr = listener.local_addr().unwrap();
    let svc_fwd = fwd.clone();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(svc_fwd))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
            .await
    });
    let svc = Service::start(Cfg {
        exporter: Some(format!("http://{fwd_addr}")),
        passthrough: true,
        health_spans: true,
        otlp_metrics: false,
        ..Cfg::default()
    })
    .await;
    *fwd.to.lock().unwrap() = Some(svc.grpc_addr());

    let call = call_span([0x42; 16], [0x24; 8], None, "read_ticket", "7", vec![]);
    svc.grpc_export(request("agent", vec![call.clone()])).await.expect("accepted");

    // The span and its health span went out, came back, and were recognized: once everything the
    // forwarder received has come back and been dropped, nothing more is in flight.
    let seen = |fwd: &Forwarder| flatten(&fwd.seen.lock().unwrap());
    let text = eventually_async(WAIT, "everything forwarded back to be counted as looped", || {
        let (svc, fwd) = (&svc, &fwd);
        async move {
            let out = seen(fwd);
            let text = svc.metrics_text().await;
            let looped = prom_sum(&text, "mcp_health_spans_looped_total").unwrap_or(0.0) as usize;
            // The forwarder sends back before it answers: the exporter counts a span as sent
            // only after that answer, so wait for the counts to settle too.
            let sent = prom_sum(&text, "mcp_health_exporter_sent_spans_total").unwrap_or(0.0) as usize;
            (out.iter().any(ReceivedSpan::is_health_span) && looped == out.len() && sent == out.len()).then_some(text)
        }
    })
    .await;
    let out = seen(&fwd);
    let passed: Vec<_> = out.iter().filter(|s| !s.is_health_span()).collect();
    assert_eq!(passed.len(), 1, "one span in, one span out: {out:#?}");
    assert_eq!(passed[0].span, call, "the span itself, unchanged");
    let health = out.iter().filter(|s| s.is_health_span()).count();
    assert_eq!(health, 1, "one health span: the verdict was not revised by its own echo: {out:#?}");
    assert_eq!(prom_sum(&text, "mcp_health_exporter_sent_spans_total"), Some(2.0), "{text}");
    let verdicts = svc.verdicts();
    assert_eq!(verdicts.len(), 1, "decided once: {verdicts:#?}");
    assert_eq!(verdicts[0]["revision"], 0);
    // Received: the span, then both echoes; all accounted for.
    assert_eq!(prom_sum(&text, "mcp_health_spans_received_total"), Some(3.0), "{text}");
    assert_eq!(prom_sum(&text, "mcp_health_spans_looped_total"), Some(2.0), "{text}");
}

/// `validate` refuses an exporter pointed at the service's own receiver, and so does the start.
#[test]
fn an_exporter_pointed_at_the_own_receiver_is_refused_by_validate_and_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("loop.yaml");
    std::fs::write(
        &path,
        "receivers:\n  otlp:\n    protocols:\n      grpc:\n        endpoint: 0.0.0.0:43170\nexporters:\n  otlp:\n    endpoint: http://localhost:43170\n",
    )
    .unwrap();
    for cmd in [vec!["validate", path.to_str().unwrap()], vec!["serve", "--config", path.to_str().unwrap()]] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_mcp-health")).args(&cmd).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{cmd:?} must fail");
        assert!(err.contains("exporters.otlp.endpoint") && err.contains("own receiver"), "{cmd:?}: {err}");
    }
    // Through the environment (which `validate` does not read), refused at start.
    std::fs::write(&path, "receivers:\n  otlp:\n    protocols:\n      grpc:\n        endpoint: 127.0.0.1:43171\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mcp-health"))
        .args(["serve", "--config", path.to_str().unwrap()])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:43171")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("own receiver"), "{err}");
}
