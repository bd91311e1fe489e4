//! Issue 10: 500 half-open connections were held for 65 s, and with a low open-file limit they made
//! OTLP, the metrics and the health check unavailable. Every listener now has `max_connections`,
//! `read_header_timeout` and `idle_timeout`; what they refuse or close is counted in
//! `mcp_health.connections.refused` and `…timed_out`, per listener.
//!
//! No timed assertion: each wait is a poll against a generous deadline.

mod support;

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use support::*;

/// True when the peer closed (EOF or reset) within `within`; false if it is still open then.
async fn closed_by_peer(s: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 256];
    loop {
        match tokio::time::timeout(within, s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue, // an HTTP/2 server preface or a response: keep reading
        }
    }
}

/// Still open right now (nothing to read, no EOF), without waiting.
fn open_now(s: &TcpStream) -> bool {
    let mut buf = [0u8; 256];
    loop {
        match s.try_read(&mut buf) {
            Ok(0) => return false,
            Ok(_) => continue, // the server's HTTP/2 preface
            Err(e) => return e.kind() == std::io::ErrorKind::WouldBlock,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_limit_refuses_the_extra_connections_and_counts_them() {
    const MAX: usize = 4;
    const EXTRA: usize = 3;
    let svc = Service::start(Cfg {
        // `mcp_health.connections.open` is a `detailed` instrument.
        metrics_level: Some("detailed"),
        // A long header timeout: the held connections must outlive the test's extra ones.
        listener_extra: vec![("grpc", format!("max_connections: {MAX}\nread_header_timeout: 120s\nidle_timeout: 120s\n"))],
        ..Cfg::default()
    })
    .await;
    let mut held = Vec::new();
    for _ in 0..MAX {
        held.push(TcpStream::connect(svc.grpc_addr()).await.unwrap());
    }
    // The listener has taken all of them (they count as open) before the extra ones come.
    eventually_async(Duration::from_secs(10), "the held connections counted open", || async {
        let t = svc.metrics_text().await;
        t.lines()
            .any(|l| l.starts_with("mcp_health_connections_open{") && l.contains("otlp_grpc") && l.ends_with(&format!(" {MAX}")))
            .then_some(())
    })
    .await;
    for i in 0..EXTRA {
        let mut s = TcpStream::connect(svc.grpc_addr()).await.unwrap();
        assert!(closed_by_peer(&mut s, Duration::from_secs(10)).await, "extra connection {i} was held past the limit");
    }
    assert!(held.iter().all(open_now), "a connection under the limit was closed");
    let t = svc.wait_metric("mcp_health_connections_refused_total", Duration::from_secs(10), |v| v >= EXTRA as f64).await;
    assert_eq!(connection_count(&t, "mcp_health_connections_refused_total", "otlp_grpc", "max_connections"), EXTRA as f64, "{t}");
    // The other listeners have their own limits: the health check and OTLP/HTTP still answer.
    assert_eq!(svc.health_status().await, Some(200));
    assert_eq!(svc.post_proto(&request("c", vec![call_span([3; 16], [1; 8], None, "t", "1", vec![])])).await.status, 200);
    // Once the held connections go, the listener takes new ones again.
    drop(held);
    let ok = eventually_async(Duration::from_secs(20), "a gRPC export after the held connections closed", || async {
        grpc_export(svc.grpc_addr(), request("c", vec![call_span([4; 16], [1; 8], None, "t", "2", vec![])])).await.ok()
    })
    .await;
    assert!(ok.partial_success.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_and_idle_timeouts_close_idle_connections_and_the_health_check_still_answers() {
    const HALF_OPEN: usize = 12;
    let short = "read_header_timeout: 1s\nidle_timeout: 1s\n".to_string();
    let svc = Service::start(Cfg {
        listener_extra: vec![
            ("http", format!("{short}max_connections: {HALF_OPEN}\n")),
            ("grpc", short.clone()),
            ("health_check", short.clone()),
            ("prometheus", "read_header_timeout: 1s\nidle_timeout: 1s\n".into()),
        ],
        ..Cfg::default()
    })
    .await;
    // Half-open connections as in the issue: connected, nothing (or half a request head) sent.
    let mut idle = Vec::new();
    for i in 0..HALF_OPEN {
        let mut s = TcpStream::connect(svc.http_addr()).await.unwrap();
        if i % 2 == 1 {
            s.write_all(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\n").await.unwrap();
        }
        idle.push(s);
    }
    let mut grpc_idle = TcpStream::connect(svc.grpc_addr()).await.unwrap();
    let mut health_idle = TcpStream::connect(svc.health_addr()).await.unwrap();
    for (i, s) in idle.iter_mut().enumerate() {
        assert!(closed_by_peer(s, Duration::from_secs(20)).await, "half-open connection {i} was not closed");
    }
    assert!(closed_by_peer(&mut grpc_idle, Duration::from_secs(20)).await, "an idle gRPC connection was not closed");
    assert!(closed_by_peer(&mut health_idle, Duration::from_secs(20)).await, "an idle health-check connection was not closed");
    // The OTLP/HTTP listener is usable again (its limit was reached by the half-open ones) and the health check answers.
    assert_eq!(svc.health_status().await, Some(200));
    assert_eq!(svc.post_proto(&request("c", vec![call_span([5; 16], [1; 8], None, "t", "1", vec![])])).await.status, 200);

    // Idle after a request: a keep-alive connection that got its answer and then says nothing.
    let mut keep = TcpStream::connect(svc.prom_addr()).await.unwrap();
    keep.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let mut first = [0u8; 12];
    keep.read_exact(&mut first).await.unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    assert!(closed_by_peer(&mut keep, Duration::from_secs(20)).await, "an idle keep-alive connection was not closed");

    let t = eventually_async(Duration::from_secs(10), "the timeouts counted", || async {
        let t = svc.metrics_text().await;
        let n = |l, r| connection_count(&t, "mcp_health_connections_timed_out_total", l, r);
        (n("otlp_http", "read_header") >= HALF_OPEN as f64
            && n("otlp_grpc", "read_header") >= 1.0
            && n("health_check", "read_header") >= 1.0
            && n("prometheus", "idle") >= 1.0)
            .then_some(t)
    })
    .await;
    assert_eq!(connection_count(&t, "mcp_health_connections_refused_total", "otlp_http", "max_connections"), 0.0, "{t}");
}
