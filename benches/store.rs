//! The durable state store's cost: the same decided calls through the engine with no store, with
//! the in-memory store and with the embedded (redb) store in a temporary directory.
//!
//!     cargo bench --bench store            (MCP_HEALTH_BENCH_CALLS=20000 by default)
//!
//! Prints, per store: µs of engine time (wall clock, this thread) per verdict and the ratio to no
//! store; for the embedded store, the file's growth per verdict and the bytes handed to write(2)
//! per verdict (`wchar` of /proc/self/io); for the shared Redis store (a redis-server of its own on
//! loopback, skipped when not installed), round trips, payload bytes and Redis's own count of the
//! bytes it received and sent, per verdict. Calls arrive 10 per 10 ms of engine time, so the engine
//! writes a transaction of about 100 calls every 100 ms, as in the service at 1000 calls/s.
//! The Redis runs take the store's answers as the service does (`store_answer_within` =
//! `SHARED_STORE_ANSWER_WITHIN`: the round trips run on the store's thread); a last run puts Redis behind a
//! proxy of this bench's own that adds 0.5 ms each way to every chunk it forwards (1 ms of round
//! trip, a Redis in another zone). Numbers, not assertions.

use std::sync::Arc;
use std::time::{Duration, Instant};

use mcp_health::correlate::{ChainLimits, SessionLimits};
use mcp_health::engine::{Decided, Engine, EngineConfig};
use mcp_health::evidence::time::Moment;
use mcp_health::evidence::{Method, OutcomeReceipt, OutcomeResult, Side, SpanEvidence, VerifierMethod};
use mcp_health::normalize::NormalizedBatch;
use mcp_health::state::{MemoryStore, RedisSettings, StoreHandle};

#[path = "../tests/support/redis_server.rs"]
mod redis_server;
use mcp_health::verdict::DecidedBy;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const PER_STEP: usize = 10;
const STEP: Duration = Duration::from_millis(10);

fn call(n: u64) -> Vec<SpanEvidence> {
    let mut trace = [0u8; 16];
    trace[..8].copy_from_slice(&n.to_be_bytes());
    trace[15] = 1;
    let t = 1_764_000_000_000_000_000 + n * 1_000_000;
    let mut c = SpanEvidence::new(trace, [1; 8]);
    c.method = Some(Method::ToolsCall);
    c.side = Side::Client;
    c.tool = Some(Arc::from("create_ticket"));
    c.server = Some(Arc::from("tickets.example.test:8443"));
    c.session_id = Some(format!("sess-{}", n % 64).into());
    c.request_id = Some(n.to_string().into());
    c.protocol_version = Some(Arc::from("2025-11-25"));
    c.operation_key = Some(format!("op-{n}").into());
    c.start_ns = t;
    c.end_ns = t + 20_000_000;
    let mut v = SpanEvidence::new(trace, [2; 8]);
    v.parent_span_id = Some([1; 8]);
    v.outcomes.push(OutcomeReceipt {
        result: OutcomeResult::Confirmed,
        method: VerifierMethod::Receipt,
        checked_at_ns: t + 30_000_000,
        request_id: None,
        trust: Default::default(),
    });
    vec![c, v]
}

/// A TCP proxy on 127.0.0.1 in front of `upstream` that sleeps `delay` before forwarding each
/// chunk, in each direction (one thread per direction per connection); its address.
fn delaying_proxy(upstream: std::net::SocketAddr, delay: Duration) -> std::net::SocketAddr {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
    let addr = listener.local_addr().expect("proxy address");
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let Ok(server) = std::net::TcpStream::connect(upstream) else { continue };
            let _ = (client.set_nodelay(true), server.set_nodelay(true));
            let pump = move |mut from: std::net::TcpStream, mut to: std::net::TcpStream| {
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(n) = from.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        std::thread::sleep(delay);
                        if to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = to.shutdown(std::net::Shutdown::Write);
                });
            };
            let (c2, s2) = (client.try_clone().expect("clone"), server.try_clone().expect("clone"));
            pump(client, server);
            pump(s2, c2);
        }
    });
    addr
}

fn on_cpu_ns() -> u64 {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    s.split_whitespace().next().and_then(|v| v.parse().ok()).unwrap_or(0)
}

fn wchar() -> u64 {
    let s = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
    s.lines().find_map(|l| l.strip_prefix("wchar: ")).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

struct Run {
    secs: f64,
    /// Time this thread was on a CPU (`/proc/thread-self/schedstat`): the engine's own work,
    /// without its waits for the store and without being preempted.
    cpu_secs: f64,
    verdicts: u64,
    wchar: u64,
}

fn run(calls: u64, store: Option<StoreHandle>) -> Run {
    let mut cfg =
        EngineConfig::new(ChainLimits { decision_wait: Duration::from_millis(20), ..ChainLimits::default() }, SessionLimits::default());
    if store.as_ref().is_some_and(|s| s.is_shared()) {
        cfg.store_answer_within = mcp_health::engine::SHARED_STORE_ANSWER_WITHIN;
    }
    cfg.store = store;
    let mut e = Engine::new(cfg);
    let mut out: Vec<Decided> = Vec::new();
    let mut now = Moment::from_nanos(1_764_000_000_000_000_000);
    let mut verdicts = 0;
    let (w0, c0, start) = (wchar(), on_cpu_ns(), Instant::now());
    let mut n = 0;
    while n < calls {
        let evidence: Vec<SpanEvidence> = (n..(n + PER_STEP as u64).min(calls)).flat_map(call).collect();
        n += PER_STEP as u64;
        e.ingest(NormalizedBatch { evidence, ..Default::default() }, now, &mut out);
        now += STEP;
        e.tick(now, &mut out);
        verdicts += out.iter().filter(|d| matches!(d, Decided::Call(_))).count() as u64;
        out.clear();
    }
    now += Duration::from_secs(1);
    e.tick(now, &mut out);
    e.drain(DecidedBy::Shutdown, now, &mut out);
    verdicts += out.iter().filter(|d| matches!(d, Decided::Call(_))).count() as u64;
    let secs = start.elapsed().as_secs_f64();
    let cpu_secs = on_cpu_ns().saturating_sub(c0) as f64 / 1e9;
    assert_eq!(e.store_errors(), 0);
    Run { secs, cpu_secs, verdicts, wchar: wchar().saturating_sub(w0) }
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` runs benches as tests with no flag:
    // then only a smoke run.
    let is_bench = std::env::args().any(|a| a == "--bench");
    let calls: u64 =
        if is_bench { std::env::var("MCP_HEALTH_BENCH_CALLS").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000) } else { 200 };

    // Warm the allocator and the code paths first.
    run(calls.min(2_000), None);
    let none = run(calls, None);
    let mem = run(calls, Some(StoreHandle::new(MemoryStore::new())));
    let dir = tempfile::tempdir().expect("tempdir");
    let store = StoreHandle::open_directory(dir.path()).expect("open the embedded store");
    let size0 = store.bytes_on_disk().unwrap_or(0);
    let emb = run(calls, Some(store.clone()));
    let size = store.bytes_on_disk().unwrap_or(0).saturating_sub(size0);

    let us = |r: &Run| r.secs * 1e6 / r.verdicts.max(1) as f64;
    let cpu = |r: &Run| r.cpu_secs * 1e6 / r.verdicts.max(1) as f64;
    println!("store bench: {calls} calls, {} per {:?} of engine time (one write at most every 100 ms)", PER_STEP, STEP);
    println!("  no store:       {:8.2} µs/verdict ({} verdicts; engine thread on CPU {:.2})", us(&none), none.verdicts, cpu(&none));
    println!("  memory store:   {:8.2} µs/verdict  x{:.2}", us(&mem), us(&mem) / us(&none));
    println!("  embedded redb:  {:8.2} µs/verdict  x{:.2}", us(&emb), us(&emb) / us(&none));
    println!(
        "  embedded redb:  {:8.0} bytes/verdict file growth, {:8.0} bytes/verdict written (write(2)); file {} KiB (was {} KiB)",
        size as f64 / emb.verdicts.max(1) as f64,
        emb.wchar as f64 / emb.verdicts.max(1) as f64,
        (size0 + size) / 1024,
        size0 / 1024
    );
    assert_eq!((none.verdicts, mem.verdicts, emb.verdicts), (calls, calls, calls));

    if !redis_server::available("store bench: redis") {
        return;
    }
    let r = redis_server::RedisServer::start();
    let net = |r: &redis_server::RedisServer| -> (u64, u64) {
        let info: String = redis::cmd("INFO").arg("stats").query(&mut r.conn()).unwrap_or_default();
        let field = |k: &str| info.lines().find_map(|l| l.strip_prefix(k)).and_then(|v| v.trim().parse().ok()).unwrap_or(0);
        (field("total_net_input_bytes:"), field("total_net_output_bytes:"))
    };
    let settings = RedisSettings {
        endpoint: r.url(),
        timeout: Duration::from_secs(2),
        retry_after: Duration::from_secs(1),
        tombstone_ttl: Duration::from_secs(3600),
    };
    let store = StoreHandle::open_redis(settings.clone()).expect("open the redis store");
    let before = net(&r);
    let red = run(calls, Some(store.clone()));
    let after = net(&r);
    let st = store.stats().unwrap_or_default();
    let per = |x: u64| x as f64 / red.verdicts.max(1) as f64;
    println!(
        "  redis (shared): {:8.2} µs/verdict  x{:.2} (engine thread on CPU {:.2}: the rest is waiting for the store thread, or preempted)",
        us(&red),
        us(&red) / us(&none),
        cpu(&red)
    );
    println!(
        "  redis (shared): {:.4} round trips/verdict ({} in all), {:.0} payload bytes/verdict sent, Redis counted {:.0} B in / {:.0} B out per verdict",
        per(st.round_trips),
        st.round_trips,
        per(st.bytes_sent),
        per(after.0.saturating_sub(before.0)),
        per(after.1.saturating_sub(before.1))
    );
    assert_eq!(red.verdicts, calls);

    // The same behind 1 ms of added round trip, on an empty Redis.
    let _: () = redis::cmd("FLUSHALL").query(&mut r.conn()).expect("flush redis");
    let upstream: std::net::SocketAddr = format!("127.0.0.1:{}", r.port).parse().expect("redis address");
    let proxy = delaying_proxy(upstream, Duration::from_micros(500));
    let settings = RedisSettings { endpoint: format!("redis://{proxy}"), ..settings };
    let far = run(calls, Some(StoreHandle::open_redis(settings).expect("open the redis store through the proxy")));
    println!("  redis +1 ms RTT: {:8.2} µs/verdict  x{:.2} (engine thread on CPU {:.2})", us(&far), us(&far) / us(&none), cpu(&far));
    assert_eq!(far.verdicts, calls);
}
