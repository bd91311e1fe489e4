//! End to end: compressed OTLP bodies (issue 10). zstd and deflate (zlib and raw) on OTLP/HTTP
//! and zstd on OTLP/gRPC all give verdicts; a zstd bomb is refused with 413 on HTTP and
//! RESOURCE_EXHAUSTED on gRPC, as the gzip bomb is.

mod support;

use std::io::Write;
use std::time::Duration;

use prost::Message;
use support::*;
use tonic::codec::CompressionEncoding;

const WAIT: Duration = Duration::from_secs(30);

fn zstd(data: &[u8]) -> Vec<u8> {
    zstd::encode_all(data, 3).unwrap()
}

fn zlib(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

fn raw_deflate(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

async fn post(svc: &Service, content_type: &str, encoding: &str, body: &[u8]) -> HttpResponse {
    let headers = [("Content-Type", content_type), ("Content-Encoding", encoding)];
    http_request(svc.http_addr(), "POST", "/v1/traces", &headers, body).await.expect("POST /v1/traces")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zstd_and_deflate_bodies_and_zstd_grpc_give_verdicts() {
    let svc = Service::start(Cfg::default()).await;
    let mut traces = Vec::new();
    let mut one = |tool: &str| {
        let t = new_trace_id();
        traces.push(t);
        request("agent", vec![call_span(t, new_span_id(), None, tool, "1", vec![])])
    };
    let (a, b, c, d) = (one("zstd_proto"), one("zstd_json"), one("deflate_zlib"), one("deflate_raw"));
    let grpc_req = one("zstd_grpc");

    let r = post(&svc, "application/x-protobuf", "zstd", &zstd(&a.encode_to_vec())).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let json = serde_json::to_vec(&b).unwrap();
    let r = post(&svc, "application/json", "zstd", &zstd(&json)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = post(&svc, "application/x-protobuf", "deflate", &zlib(&c.encode_to_vec())).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = post(&svc, "application/x-protobuf", "deflate", &raw_deflate(&d.encode_to_vec())).await;
    assert_eq!(r.status, 200, "{}", r.text());

    let resp = grpc_client(svc.grpc_addr())
        .await
        .send_compressed(CompressionEncoding::Zstd)
        .export(grpc_req)
        .await
        .expect("a zstd gRPC export is accepted")
        .into_inner();
    assert!(resp.partial_success.is_none_or(|p| p.rejected_spans == 0));

    let verdicts = svc.wait_verdicts(traces.len(), WAIT).await;
    for t in &traces {
        assert!(verdicts.iter().any(|v| v["trace_id"] == hex(t)), "no verdict for {}: {verdicts:#?}", hex(t));
    }
    // A corrupt zstd body is undecodable: 400, not retried.
    let r = post(&svc, "application/x-protobuf", "zstd", b"definitely not zstd").await;
    assert_eq!(r.status, 400, "{}", r.text());
    svc.assert_alive(WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zstd_bombs_are_refused() {
    let max_body = 64 * 1024;
    let svc = Service::start(Cfg { grpc_max_mib: 1, http_max_body: max_body, ..Cfg::default() }).await;
    // About 1 KiB on the wire, 16 MiB decompressed.
    let pad = "z".repeat(16 << 20);
    let inflated = request("agent", vec![call_span(new_trace_id(), new_span_id(), None, "bomb", "1", vec![kv_str("pad", &pad)])]);
    let bomb = zstd(&inflated.encode_to_vec());
    assert!(bomb.len() < max_body, "the bomb itself is small ({} bytes)", bomb.len());
    let r = post(&svc, "application/x-protobuf", "zstd", &bomb).await;
    assert_eq!(r.status, 413, "{}", r.text());
    let st = tonic_types::Status::decode(&r.body[..]).expect("a google.rpc.Status body");
    assert_eq!(st.code, tonic::Code::ResourceExhausted as i32);

    // gRPC: tonic's zstd codec holds max_recv_msg_size_mib after decompression.
    let err = grpc_client(svc.grpc_addr())
        .await
        .send_compressed(CompressionEncoding::Zstd)
        .export(inflated)
        .await
        .expect_err("a zstd message over the limit once decompressed is refused");
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");

    let text = svc.wait_metric("mcp_health_requests_refused_total", WAIT, |v| v >= 2.0).await;
    assert!(text.contains("reason=\"too_large\""), "{text}");
    svc.assert_alive(WAIT).await;
}
