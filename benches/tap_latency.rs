//! Added latency of the evidence tap per message, stdio and streamable HTTP.
//!
//!     cargo bench --bench tap_latency          (MCP_HEALTH_TAP_BENCH_MESSAGES=5000 by default)
//!     MCP_HEALTH_BENCH_BASELINE=/path/to/older/mcp-health cargo bench --bench tap_latency
//!         (the tap of an older build measured too, in the same run, paths interleaved)
//!
//! A request/response round trip (`tools/call`, answered at once by an echo server) is timed from
//! the client's write to the end of the response, directly and through `mcp-health tap`, with an
//! OTLP receiver taking the tap's spans (so the observer and exporter do their full work). Prints
//! p50, p90, p99 and max per path and the difference at p50 and p99: the latency the tap adds per
//! message (both directions of one exchange). Numbers, not assertions.
//!
//! The stdio echo server is this executable itself (`TAP_BENCH_ECHO=1`), so no interpreter's
//! start-up or scheduling noise is measured; the HTTP echo server is an in-process axum server.
//! Under `cargo test --all-targets` (no `--bench` flag) it runs 50 round trips per path as a smoke
//! test.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};

const TOOL_RESULT: &str = r#"{"content":[{"type":"text","text":"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}]}"#;

fn request_line(id: u64) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"echo","arguments":{{"text":"hello"}},"_meta":{{"progressToken":"p{id}"}}}}}}"#
    )
}

/// The stdio echo MCP server: answers every request at once.
fn echo_server() -> ! {
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let v: serde_json::Value = match serde_json::from_str(&line) {
            Ok(v) => v,
            Err(_) => continue,
        };
        let Some(id) = v.get("id") else { continue };
        let resp = if v["method"] == "tools/list" {
            format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"tools":[{{"name":"echo","inputSchema":{{"type":"object"}}}}]}}}}"#)
        } else {
            format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{TOOL_RESULT}}}"#)
        };
        let _ = writeln!(out, "{resp}");
        let _ = out.flush();
    }
    std::process::exit(0)
}

struct Stats {
    p50: f64,
    p90: f64,
    p99: f64,
    max: f64,
}

fn stats(mut us: Vec<f64>) -> Stats {
    us.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let q = |p: f64| us[((us.len() as f64 - 1.0) * p).round() as usize];
    Stats { p50: q(0.50), p90: q(0.90), p99: q(0.99), max: *us.last().unwrap() }
}

fn print_row(name: &str, s: &Stats) {
    println!("{name:<22} p50 {:>8.1} µs   p90 {:>8.1} µs   p99 {:>8.1} µs   max {:>9.1} µs", s.p50, s.p90, s.p99, s.max);
}

fn print_added(name: &str, direct: &Stats, tapped: &Stats) {
    println!("{name:<22} p50 {:>+8.1} µs                     p99 {:>+8.1} µs", tapped.p50 - direct.p50, tapped.p99 - direct.p99);
}

/// Round trips over a child's stdin/stdout; returns µs per exchange (after a warm-up).
fn stdio_round_trips(mut cmd: Command, n: usize) -> Vec<f64> {
    let mut child: Child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().expect("spawn");
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let warm = 200.min(n);
    let mut out = Vec::with_capacity(n);
    let mut line = String::new();
    for i in 0..(n + warm) as u64 {
        let req = request_line(i);
        let t = Instant::now();
        stdin.write_all(req.as_bytes()).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
        line.clear();
        stdout.read_line(&mut line).unwrap();
        let el = t.elapsed();
        assert!(line.contains(&format!("\"id\":{i},")), "unexpected response {line:?}");
        if i as usize >= warm {
            out.push(el.as_secs_f64() * 1e6);
        }
    }
    drop(stdin);
    let _ = child.wait();
    out
}

/// Keep-alive HTTP/1.1 round trips with a hand-written client (no client library in the timing).
fn http_round_trips(addr: SocketAddr, n: usize) -> Vec<f64> {
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_nodelay(true).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let warm = 200.min(n);
    let mut out = Vec::with_capacity(n);
    for i in 0..(n + warm) as u64 {
        let body = request_line(i);
        let req = format!(
            "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMcp-Session-Id: bench\r\nAuthorization: Bearer bench-token\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let t = Instant::now();
        s.write_all(req.as_bytes()).unwrap();
        // Status line, headers, then Content-Length bytes.
        let mut len = 0usize;
        let mut line = String::new();
        loop {
            line.clear();
            r.read_line(&mut line).unwrap();
            if line == "\r\n" || line.is_empty() {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap();
            }
        }
        let mut buf = vec![0u8; len];
        r.read_exact(&mut buf).unwrap();
        let el = t.elapsed();
        assert!(buf.starts_with(b"{\"jsonrpc\""), "unexpected body {:?}", String::from_utf8_lossy(&buf));
        if i as usize >= warm {
            out.push(el.as_secs_f64() * 1e6);
        }
    }
    out
}

#[derive(Clone, Default)]
struct NullSink(std::sync::Arc<std::sync::atomic::AtomicU64>);

#[tonic::async_trait]
impl TraceService for NullSink {
    async fn export(
        &self,
        r: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let n: usize = r.get_ref().resource_spans.iter().flat_map(|x| &x.scope_spans).map(|x| x.spans.len()).sum();
        self.0.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

struct TapProc(Child);

impl Drop for TapProc {
    fn drop(&mut self) {
        // SIGTERM: the HTTP tap flushes and exits.
        let _ = Command::new("kill").arg("-TERM").arg(self.0.id().to_string()).status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn main() {
    if std::env::var_os("TAP_BENCH_ECHO").is_some() {
        echo_server();
    }
    let is_bench = std::env::args().any(|a| a == "--bench");
    let n: usize =
        if is_bench { std::env::var("MCP_HEALTH_TAP_BENCH_MESSAGES").ok().and_then(|v| v.parse().ok()).unwrap_or(5000) } else { 50 };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();

    // An OTLP receiver for the tap's spans.
    let spans = NullSink::default();
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let otlp = listener.local_addr().unwrap();
    let svc = spans.clone();
    rt.spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(svc))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
            .await;
    });

    // An HTTP echo MCP server.
    let http_listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let http_addr = http_listener.local_addr().unwrap();
    rt.spawn(async move {
        let app = axum::Router::new().route(
            "/mcp",
            axum::routing::post(|body: String| async move {
                let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
                let id = v.get("id").cloned().unwrap_or_default();
                ([("content-type", "application/json")], format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{TOOL_RESULT}}}"#))
            }),
        );
        let _ = axum::serve(http_listener, app).await;
    });

    let me = std::env::current_exe().expect("current exe");
    let tap = env!("CARGO_BIN_EXE_mcp-health");
    println!("tap latency: {n} tools/call round trips per path (echo server answers at once), spans to an OTLP receiver");

    // One rule for every call: a file check (cheap, local) that finds nothing, so each call is
    // checked once after its response. The client must not see it.
    let rules_dir = std::env::temp_dir().join(format!("mcp-health-tap-bench-{}", std::process::id()));
    std::fs::create_dir_all(&rules_dir).unwrap();
    let rules = rules_dir.join("verifiers.yaml");
    std::fs::write(&rules, "- {name: echo_effect, tool: echo, file: {base_dir: /nonexistent, path: \"{/arguments/text}\"}}\n").unwrap();
    let rules = rules.to_string_lossy().into_owned();

    // stdio
    let mut direct = Command::new(&me);
    direct.env("TAP_BENCH_ECHO", "1");
    let d = stats(stdio_round_trips(direct, n));
    let baseline = std::env::var("MCP_HEALTH_BENCH_BASELINE").ok();
    let stdio_tap_of = |bin: &str, extra: &[&str]| {
        let mut c = Command::new(bin);
        c.args(["tap", "--otlp-endpoint", &format!("http://{otlp}"), "--server-address", "bench-echo"])
            .args(extra)
            .arg("--")
            .arg(&me)
            .env("TAP_BENCH_ECHO", "1");
        c
    };
    let stdio_tap = |extra: &[&str]| stdio_tap_of(tap, extra);
    let b = baseline.as_deref().map(|base| stats(stdio_round_trips(stdio_tap_of(base, &[]), n)));
    let t = stats(stdio_round_trips(stdio_tap(&[]), n));
    let v = stats(stdio_round_trips(stdio_tap(&["--verifiers", &rules]), n));
    print_row("stdio direct", &d);
    if let Some(b) = &b {
        print_row("stdio through baseline", b);
    }
    print_row("stdio through tap", &t);
    print_row("stdio through tap + verifiers", &v);
    if let Some(b) = &b {
        print_added("stdio added (baseline)", &d, b);
    }
    print_added("stdio added", &d, &t);
    print_added("stdio added (verifiers)", &d, &v);

    // HTTP
    let http_tap_of = |bin: &str, extra: &[&str]| {
        let mut child = Command::new(bin)
            .args([
                "tap",
                "--listen",
                "127.0.0.1:0",
                "--upstream",
                &format!("http://{http_addr}"),
                "--otlp-endpoint",
                &format!("http://{otlp}"),
            ])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the HTTP tap");
        let mut err = BufReader::new(child.stderr.take().unwrap());
        let mut first = String::new();
        err.read_line(&mut first).unwrap();
        let tap_addr: SocketAddr = first
            .split("listening on http://")
            .nth(1)
            .and_then(|r| r.split(',').next())
            .and_then(|a| a.trim().parse().ok())
            .unwrap_or_else(|| panic!("tap said {first:?}"));
        std::thread::spawn(move || {
            let mut sink = String::new();
            let _ = err.read_to_string(&mut sink);
        });
        (TapProc(child), tap_addr)
    };
    let http_tap = |extra: &[&str]| http_tap_of(tap, extra);
    let d = stats(http_round_trips(http_addr, n));
    let b = baseline.as_deref().map(|base| {
        let (guard, tap_addr) = http_tap_of(base, &[]);
        let b = stats(http_round_trips(tap_addr, n));
        drop(guard);
        b
    });
    let (guard, tap_addr) = http_tap(&[]);
    let t = stats(http_round_trips(tap_addr, n));
    drop(guard);
    let (guard, tap_addr) = http_tap(&["--verifiers", &rules]);
    let v = stats(http_round_trips(tap_addr, n));
    drop(guard);
    print_row("http direct", &d);
    if let Some(b) = &b {
        print_row("http through baseline", b);
    }
    print_row("http through tap", &t);
    print_row("http through tap + verifiers", &v);
    if let Some(b) = &b {
        print_added("http added (baseline)", &d, b);
    }
    print_added("http added", &d, &t);
    print_added("http added (verifiers)", &d, &v);
    let _ = std::fs::remove_dir_all(&rules_dir);
    std::thread::sleep(Duration::from_millis(300));
    println!("spans received by the OTLP receiver: {}", spans.0.load(std::sync::atomic::Ordering::Relaxed));
    if !is_bench {
        println!("(smoke run; `cargo bench --bench tap_latency` measures)");
    }
}
