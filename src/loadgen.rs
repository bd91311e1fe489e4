//! A load generator: pre-encoded batches of MCP spans sent over OTLP/gRPC.
//!
//! Batches are encoded once; every send copies a batch and stamps fresh trace ids into it at known
//! byte offsets, so the receiver sees an endless stream of new chains without the generator paying
//! for protobuf encoding on the hot path.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{span::SpanKind, ResourceSpans, ScopeSpans, Span, Status};
use prost::Message;

use crate::emit::otlp_traces::PreEncoded;

/// One pre-encoded batch and where its trace ids sit.
#[derive(Clone)]
pub struct EncodedBatch {
    pub bytes: Bytes,
    pub spans: u64,
    /// Byte offsets of every trace id (16 bytes each) in `bytes`.
    pub trace_id_offsets: Vec<usize>,
}

const MAGIC: [u8; 4] = [0x6d, 0x63, 0x70, 0x68];

fn s(k: &str, v: &str) -> KeyValue {
    KeyValue { key: k.into(), value: Some(AnyValue { value: Some(any_value::Value::StringValue(v.into())) }), ..Default::default() }
}
fn i(k: &str, v: i64) -> KeyValue {
    KeyValue { key: k.into(), value: Some(AnyValue { value: Some(any_value::Value::IntValue(v)) }), ..Default::default() }
}

/// Build one request of `calls` tool calls, three spans each (client, server, verifier), with the
/// attribute sets real MCP instrumentations send. Trace ids carry a marker for later stamping.
pub fn build_request(batch_no: u32, calls: u32) -> ExportTraceServiceRequest {
    let mut client = Vec::new();
    let mut server = Vec::new();
    for c in 0..calls {
        let mut trace_id = [0u8; 16];
        trace_id[..4].copy_from_slice(&MAGIC);
        trace_id[4..8].copy_from_slice(&batch_no.to_be_bytes());
        trace_id[8..12].copy_from_slice(&c.to_be_bytes());
        let cid = [1, 0, 0, 0, (c >> 16) as u8, (c >> 8) as u8, c as u8, 1];
        let sid = [2, 0, 0, 0, (c >> 16) as u8, (c >> 8) as u8, c as u8, 2];
        let vid = [3, 0, 0, 0, (c >> 16) as u8, (c >> 8) as u8, c as u8, 3];
        let tool = ["create_ticket", "read_ticket", "search_docs", "send_email"][c as usize % 4];
        let rid = format!("{}", 1000 + c);
        let common = |extra: Vec<KeyValue>| {
            let mut a = vec![
                s("mcp.method.name", "tools/call"),
                s("gen_ai.tool.name", tool),
                s("gen_ai.operation.name", "execute_tool"),
                s("jsonrpc.request.id", &rid),
                s("mcp.session.id", "3f2b8c1e-5d4a-4e9b-8a7c-2d1e0f9b8a7c"),
                s("mcp.protocol.version", "2025-11-25"),
                s("network.transport", "tcp"),
                s("network.protocol.name", "http"),
                s("server.address", "tickets.example.test"),
                i("server.port", 8443),
            ];
            a.extend(extra);
            a
        };
        let failing = c % 10 == 7;
        let base = 1_764_000_000_000_000_000u64 + u64::from(c) * 1_000_000;
        client.push(Span {
            trace_id: trace_id.to_vec(),
            span_id: cid.to_vec(),
            name: format!("tools/call {tool}"),
            kind: SpanKind::Client as i32,
            start_time_unix_nano: base,
            end_time_unix_nano: base + 40_000_000,
            attributes: common(if failing { vec![s("error.type", "tool_error")] } else { vec![] }),
            status: Some(Status { code: if failing { 2 } else { 0 }, ..Default::default() }),
            ..Default::default()
        });
        server.push(Span {
            trace_id: trace_id.to_vec(),
            span_id: sid.to_vec(),
            parent_span_id: cid.to_vec(),
            name: format!("tools/call {tool}"),
            kind: SpanKind::Server as i32,
            start_time_unix_nano: base + 5_000_000,
            end_time_unix_nano: base + 35_000_000,
            attributes: common(vec![s("client.address", "10.0.0.12"), i("client.port", 53122)]),
            ..Default::default()
        });
        client.push(Span {
            trace_id: trace_id.to_vec(),
            span_id: vid.to_vec(),
            parent_span_id: cid.to_vec(),
            name: "verify destination".into(),
            kind: SpanKind::Internal as i32,
            start_time_unix_nano: base + 50_000_000,
            end_time_unix_nano: base + 60_000_000,
            attributes: vec![
                s("mcp_health.outcome.result", if c % 5 == 3 { "missing" } else { "confirmed" }),
                s("mcp_health.outcome.method", "receipt"),
            ],
            ..Default::default()
        });
    }
    let rs = |svc: &str, spans: Vec<Span>| ResourceSpans {
        resource: Some(Resource { attributes: vec![s("service.name", svc), s("telemetry.sdk.language", "python")], ..Default::default() }),
        scope_spans: vec![ScopeSpans { spans, ..Default::default() }],
        ..Default::default()
    };
    ExportTraceServiceRequest { resource_spans: vec![rs("agent", client), rs("tickets-mcp", server)] }
}

/// Build one request of traffic as a shared pipeline carries it: `traces` ordinary traces (an
/// HTTP server span, two database spans, an outgoing HTTP call and an internal span, with the
/// attributes the HTTP and database instrumentations send) and, in every 12th trace's place, an
/// MCP `tools/call` (client span, the server's HTTP span on `/mcp`, the server's MCP span), so
/// about 95 % of the spans are ones mcp-health does not judge (105 traces: 507 spans, 27 MCP). Trace ids carry the stamping
/// marker, as in [`build_request`].
pub fn build_mixed_request(batch_no: u32, traces: u32) -> ExportTraceServiceRequest {
    let (mut front, mut back, mut mcp_client, mut mcp_server) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for t in 0..traces {
        let mut trace_id = [0u8; 16];
        trace_id[..4].copy_from_slice(&MAGIC);
        trace_id[4..8].copy_from_slice(&batch_no.to_be_bytes());
        trace_id[8..12].copy_from_slice(&t.to_be_bytes());
        let id = |k: u8| [k, 0, 0, 0, (t >> 16) as u8, (t >> 8) as u8, t as u8, k].to_vec();
        let base = 1_764_000_000_000_000_000u64 + u64::from(t) * 1_000_000;
        let span = |sid: Vec<u8>, parent: Vec<u8>, name: &str, kind: SpanKind, attributes: Vec<KeyValue>| Span {
            trace_id: trace_id.to_vec(),
            span_id: sid,
            parent_span_id: parent,
            name: name.into(),
            kind: kind as i32,
            start_time_unix_nano: base,
            end_time_unix_nano: base + 20_000_000,
            attributes,
            ..Default::default()
        };
        if t % 12 == 6 {
            // An MCP call over streamable HTTP: three spans.
            let tool = ["create_ticket", "read_ticket"][(t / 12) as usize % 2];
            let rid = format!("{}", 1000 + t);
            let mcp = |extra: Vec<KeyValue>| {
                let mut a = vec![
                    s("mcp.method.name", "tools/call"),
                    s("gen_ai.tool.name", tool),
                    s("jsonrpc.request.id", &rid),
                    s("mcp.session.id", "3f2b8c1e-5d4a-4e9b-8a7c-2d1e0f9b8a7c"),
                    s("server.address", "tickets.example.test"),
                    i("server.port", 8443),
                ];
                a.extend(extra);
                a
            };
            mcp_client.push(span(id(1), vec![], &format!("tools/call {tool}"), SpanKind::Client, mcp(vec![])));
            mcp_server.push(span(
                id(2),
                id(1),
                "POST /mcp",
                SpanKind::Server,
                vec![
                    s("http.request.method", "POST"),
                    s("url.path", "/mcp"),
                    s("http.route", "/mcp"),
                    s("url.scheme", "https"),
                    i("http.response.status_code", 200),
                    s("network.protocol.version", "1.1"),
                    s("client.address", "10.0.0.12"),
                    s("user_agent.original", "python-httpx/0.28.1"),
                ],
            ));
            mcp_server.push(span(id(3), id(2), &format!("tools/call {tool}"), SpanKind::Server, mcp(vec![])));
            continue;
        }
        let order = format!("/api/orders/{}", 40_000 + t);
        front.push(span(
            id(1),
            vec![],
            "GET /api/orders/{id}",
            SpanKind::Server,
            vec![
                s("http.request.method", "GET"),
                s("url.path", &order),
                s("http.route", "/api/orders/{id}"),
                s("url.scheme", "https"),
                i("http.response.status_code", 200),
                s("network.protocol.version", "1.1"),
                s("server.address", "shop.example.test"),
                i("server.port", 443),
                s("client.address", "10.0.3.7"),
                s("user_agent.original", "Mozilla/5.0 (X11; Linux x86_64)"),
            ],
        ));
        for (k, q) in
            [(2u8, "SELECT id, status, total FROM orders WHERE id = $1"), (3, "SELECT sku, qty FROM order_lines WHERE order_id = $1")]
        {
            back.push(span(
                id(k),
                id(1),
                "SELECT shop",
                SpanKind::Client,
                vec![
                    s("db.system.name", "postgresql"),
                    s("db.namespace", "shop"),
                    s("db.operation.name", "SELECT"),
                    s("db.query.text", q),
                    s("server.address", "db.example.test"),
                    i("server.port", 5432),
                ],
            ));
        }
        back.push(span(
            id(4),
            id(1),
            "GET",
            SpanKind::Client,
            vec![
                s("http.request.method", "GET"),
                s("url.full", "https://inventory.example.test/v1/stock?sku=A-1"),
                s("server.address", "inventory.example.test"),
                i("server.port", 443),
                i("http.response.status_code", 200),
                s("network.protocol.version", "1.1"),
            ],
        ));
        front.push(span(id(5), id(1), "render order", SpanKind::Internal, vec![s("code.function.name", "render_order"), i("items", 3)]));
    }
    let rs = |svc: &str, spans: Vec<Span>| ResourceSpans {
        resource: Some(Resource { attributes: vec![s("service.name", svc), s("telemetry.sdk.language", "python")], ..Default::default() }),
        scope_spans: vec![ScopeSpans { spans, ..Default::default() }],
        ..Default::default()
    };
    ExportTraceServiceRequest {
        resource_spans: vec![rs("shop-frontend", front), rs("shop-backend", back), rs("agent", mcp_client), rs("tickets-mcp", mcp_server)],
    }
}

/// Encode a request and find its trace ids.
pub fn encode(req: &ExportTraceServiceRequest) -> EncodedBatch {
    let bytes = req.encode_to_vec();
    let spans = req.resource_spans.iter().flat_map(|r| &r.scope_spans).map(|s| s.spans.len() as u64).sum();
    let mut offsets = Vec::new();
    let mut at = 0;
    while let Some(p) = bytes[at..].windows(4).position(|w| w == MAGIC) {
        let off = at + p;
        if off >= 2 && bytes[off - 2] == 0x0a && bytes[off - 1] == 16 {
            offsets.push(off);
        }
        at = off + 4;
    }
    EncodedBatch { bytes: Bytes::from(bytes), spans, trace_id_offsets: offsets }
}

/// A copy of `b` whose trace ids are unique to `round`.
pub fn stamp(b: &EncodedBatch, round: u32) -> Bytes {
    let mut v = b.bytes.to_vec();
    for &off in &b.trace_id_offsets {
        v[off + 12..off + 16].copy_from_slice(&round.to_be_bytes());
    }
    Bytes::from(v)
}

/// What a load run achieved.
#[derive(Clone, Debug, Default)]
pub struct LoadReport {
    pub requests_ok: u64,
    pub requests_refused: u64,
    pub spans_accepted: u64,
    pub elapsed: Duration,
}

/// How the load is sent: plaintext or TLS, compressed or not (what TLS and zstd cost per span).
#[derive(Clone, Debug, Default)]
pub struct SendOptions {
    /// TLS to a server whose certificate this CA (PEM) signed, for the name `localhost`.
    pub tls_ca_pem: Option<String>,
    /// zstd request bodies (`grpc-encoding: zstd`).
    pub zstd: bool,
    /// Spans per second to send at, at most (`None`: as fast as the service accepts). Paced,
    /// two builds or layouts are compared at the same intake: flat out, one that takes in more
    /// also holds more and may meet its memory limit sooner.
    pub rate: Option<f64>,
}

/// When request `n` (counting from 0, `spans` spans each) is due, sent at `rate` spans per
/// second from `start`. A sender behind its schedule sends at once, and catches up.
fn send_at(start: Instant, n: u64, spans: u64, rate: f64) -> Instant {
    let secs = if rate > 0.0 { (n.saturating_mul(spans)) as f64 / rate } else { 0.0 };
    start + Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX / 2)
}

/// Send batches round-robin to `endpoint` for `duration`, `in_flight` requests at a time.
pub async fn run(
    endpoint: &str,
    batches: Arc<Vec<EncodedBatch>>,
    duration: Duration,
    in_flight: usize,
) -> Result<LoadReport, tonic::transport::Error> {
    run_with(endpoint, batches, duration, in_flight, &SendOptions::default()).await
}

/// [`run`] with TLS and compression options.
pub async fn run_with(
    endpoint: &str,
    batches: Arc<Vec<EncodedBatch>>,
    duration: Duration,
    in_flight: usize,
    opts: &SendOptions,
) -> Result<LoadReport, tonic::transport::Error> {
    let uri = crate::emit::otlp_traces::endpoint_uri(endpoint);
    let mut ep = match &opts.tls_ca_pem {
        Some(_) => tonic::transport::Endpoint::from_shared(uri.replacen("http://", "https://", 1))?,
        None => tonic::transport::Endpoint::from_shared(uri)?,
    };
    if let Some(ca) = &opts.tls_ca_pem {
        ep = ep.tls_config(
            tonic::transport::ClientTlsConfig::new().ca_certificate(tonic::transport::Certificate::from_pem(ca)).domain_name("localhost"),
        )?;
    }
    let channel = ep.connect().await?;
    let (zstd, rate) = (opts.zstd, opts.rate);
    let ok = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let spans = Arc::new(AtomicU64::new(0));
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..in_flight.max(1) {
        let (channel, batches, ok, refused, spans, next) =
            (channel.clone(), batches.clone(), ok.clone(), refused.clone(), spans.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let path = tonic::codegen::http::uri::PathAndQuery::from_static("/opentelemetry.proto.collector.trace.v1.TraceService/Export");
            while start.elapsed() < duration {
                let n = next.fetch_add(1, Ordering::Relaxed);
                let b = &batches[(n % batches.len() as u64) as usize];
                if let Some(rate) = rate {
                    let at = send_at(start, n, b.spans, rate);
                    if at.saturating_duration_since(start) >= duration {
                        break;
                    }
                    tokio::time::sleep_until(at.into()).await;
                }
                let body = stamp(b, (n / batches.len() as u64) as u32 + 1);
                let mut grpc = tonic::client::Grpc::new(channel.clone());
                if zstd {
                    grpc = grpc.send_compressed(tonic::codec::CompressionEncoding::Zstd);
                }
                if grpc.ready().await.is_err() {
                    break;
                }
                match grpc
                    .unary(
                        tonic::Request::new(body),
                        path.clone(),
                        PreEncoded::<opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse>::default(),
                    )
                    .await
                {
                    Ok(_) => {
                        ok.fetch_add(1, Ordering::Relaxed);
                        spans.fetch_add(b.spans, Ordering::Relaxed);
                    }
                    Err(_) => {
                        refused.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    Ok(LoadReport {
        requests_ok: ok.load(Ordering::Relaxed),
        requests_refused: refused.load(Ordering::Relaxed),
        spans_accepted: spans.load(Ordering::Relaxed),
        elapsed: start.elapsed(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest as Req;

    /// Paced: request n is due when the spans before it, at the rate, have taken their time.
    #[test]
    fn a_paced_request_is_due_when_the_spans_before_it_were_sent_at_the_rate() {
        let t0 = Instant::now();
        for (n, spans, rate, after) in [
            (0, 513, 100_000.0, Duration::ZERO),
            (1, 500, 100_000.0, Duration::from_millis(5)),
            (200, 500, 100_000.0, Duration::from_secs(1)),
            (10, 1000, 1_000.0, Duration::from_secs(10)),
            (3, 100, 0.0, Duration::ZERO),
        ] {
            assert_eq!(send_at(t0, n, spans, rate).duration_since(t0), after, "request {n} of {spans} spans at {rate}/s");
        }
    }

    #[test]
    fn stamping_changes_only_trace_ids() {
        let b = encode(&build_request(7, 20));
        assert_eq!(b.trace_id_offsets.len(), 60, "three spans per call");
        let a = Req::decode(stamp(&b, 1)).unwrap();
        let c = Req::decode(stamp(&b, 2)).unwrap();
        let ids = |r: &Req| {
            r.resource_spans.iter().flat_map(|x| &x.scope_spans).flat_map(|x| &x.spans).map(|s| s.trace_id.clone()).collect::<Vec<_>>()
        };
        assert_ne!(ids(&a), ids(&c));
        let mut a2 = a.clone();
        for (x, y) in a2
            .resource_spans
            .iter_mut()
            .flat_map(|r| &mut r.scope_spans)
            .flat_map(|s| &mut s.spans)
            .zip(c.resource_spans.iter().flat_map(|r| &r.scope_spans).flat_map(|s| &s.spans))
        {
            x.trace_id = y.trace_id.clone();
        }
        assert_eq!(a2, c, "nothing but trace ids differs");
    }
}
