//! The durable state store's cost: the same decided calls through the engine with no store, with
//! the in-memory store and with the embedded (redb) store in a temporary directory.
//!
//!     cargo bench --bench store            (MCP_HEALTH_BENCH_CALLS=20000 by default)
//!
//! `MCP_HEALTH_BENCH_ROUNDS` sets the paced rounds (5; 0 runs the flat lines alone, to profile them).
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
//! trip, a Redis in another zone). Each run is on a thread of its own, named (`flat-redis`,
//! `paced-redis`, …: `perf report --comm <name>` profiles one run), and prints the engine
//! thread's time on a CPU and blocked on the store's thread (`Engine::store_waited`), and the
//! store thread's own time on a CPU.
//!
//! The flat runs feed calls as fast as the engine takes them, engine time running far ahead of
//! the wall clock: a capacity figure, where a store slower than the engine paces it. The paced
//! runs feed 10 000 calls/s with engine time the wall clock's, as the service runs: their
//! figure is the engine thread's own time per verdict (on CPU + blocked), the cost a shared
//! store adds to the thread that decides every verdict. Numbers, not assertions.

use std::sync::Arc;
use std::time::{Duration, Instant};

use mcp_health::engine::{Decided, Engine, EngineConfig};
use mcp_health::evidence::time::Moment;
use mcp_health::evidence::{Method, OutcomeReceipt, OutcomeResult, Side, SpanEvidence, VerifierMethod};
use mcp_health::normalize::NormalizedBatch;
use mcp_health::testing::correlate::{ChainLimits, SessionLimits};
use mcp_health::testing::state::{MemoryStore, RedisSettings, StoreHandle};

#[path = "../tests/support/redis_server.rs"]
mod redis_server;
use mcp_health::verdict::DecidedBy;

#[global_allocator]
static GLOBAL: mcp_health::Mimalloc = mcp_health::Mimalloc;

const PER_STEP: usize = 10;
const STEP: Duration = Duration::from_millis(10);
/// The paced runs' arrival rate: ten times the 1000 calls/s the flat runs' engine time stands for.
const PACED_PER_SECOND: u64 = 10_000;

const BASE_NS: u64 = 1_764_000_000_000_000_000;

/// Call `n`, started at `t` (ns since the epoch).
fn call(n: u64, t: u64) -> Vec<SpanEvidence> {
    let mut trace = [0u8; 16];
    trace[..8].copy_from_slice(&n.to_be_bytes());
    trace[15] = 1;
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

/// Time on a CPU of each live store thread (`mcp-health-store`, named by the engine's worker),
/// by thread id: the store's own work, which the engine's thread waits for when it is behind.
fn store_threads_cpu_ns() -> Vec<(String, u64)> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return Vec::new() };
    tasks
        .filter_map(|t| t.ok())
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == "mcp-health-stor"))
        .filter_map(|t| {
            let s = std::fs::read_to_string(t.path().join("schedstat")).ok()?;
            Some((t.file_name().to_string_lossy().into_owned(), s.split_whitespace().next()?.parse().ok()?))
        })
        .collect()
}

/// The store threads' time on a CPU since `before` (threads that ended since are not counted:
/// each run's engine has one of its own, alive until the run ends).
fn store_cpu_since(before: &[(String, u64)]) -> u64 {
    store_threads_cpu_ns()
        .into_iter()
        .map(|(tid, ns)| ns.saturating_sub(before.iter().find(|(t, _)| *t == tid).map_or(0, |(_, b)| *b)))
        .sum()
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
    /// Time the engine's thread was blocked on the store's thread (`Engine::store_waited`).
    waited_secs: f64,
    verdicts: u64,
    wchar: u64,
    /// Time the store's thread was on a CPU (a network store's; 0 for the others).
    store_cpu_secs: f64,
    /// The same three up to the last arrival: the steady state, without the drain at the end
    /// (which decides what is left and waits for the last writes, once per process lifetime,
    /// but a large share of a two-second run).
    steady: Steady,
}

#[derive(Clone, Copy, Default)]
struct Steady {
    cpu_secs: f64,
    waited_secs: f64,
    verdicts: u64,
}

impl Run {
    /// The engine thread's time per verdict in the steady state: its own work and its waits for
    /// the store (not its idle time between paced arrivals, nor time it was preempted).
    fn engine_us(&self) -> f64 {
        (self.steady.cpu_secs + self.steady.waited_secs) * 1e6 / self.steady.verdicts.max(1) as f64
    }

    /// Blocked on the store's thread, µs per verdict in the steady state.
    fn waited_us(&self) -> f64 {
        self.steady.waited_secs * 1e6 / self.steady.verdicts.max(1) as f64
    }
}

/// How calls arrive: as fast as the engine takes them, engine time running ahead of the wall
/// clock (a capacity figure: a store slower than the engine paces it), or at a fixed rate with
/// engine time the wall clock's (the service: the engine's cost per verdict at that rate).
#[derive(Clone, Copy)]
enum Pace {
    Flat,
    PerSecond(u64),
}

fn run(name: &str, calls: u64, store: Option<StoreHandle>) -> Run {
    run_paced(name, calls, store, Pace::Flat)
}

/// One run on a thread of its own named `name` (`perf report --comm name` profiles that run
/// alone; `/proc/thread-self` counts that thread only).
fn run_paced(name: &str, calls: u64, store: Option<StoreHandle>, pace: Pace) -> Run {
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .name(name.to_string())
            .spawn_scoped(s, move || engine_run(calls, store, pace))
            .expect("spawn the run's thread")
            .join()
            .expect("the run's thread")
    })
}

fn engine_run(calls: u64, store: Option<StoreHandle>, pace: Pace) -> Run {
    // A late-span window of two seconds of engine time (the flat run covers 20 s of it): the
    // steady state then holds what a service's does, each chain written when decided and
    // forgotten (deleted from the store) when its window ends.
    let late =
        std::env::var("MCP_HEALTH_BENCH_LATE_MS").ok().and_then(|v| v.parse().ok()).map_or(Duration::from_secs(2), Duration::from_millis);
    let mut cfg = EngineConfig::new(
        ChainLimits { decision_wait: Duration::from_millis(20), late_span_window: late, ..ChainLimits::default() },
        SessionLimits::default(),
    );
    if store.as_ref().is_some_and(|s| s.is_shared()) {
        cfg.store_answer_within = mcp_health::engine::SHARED_STORE_ANSWER_WITHIN;
    }
    cfg.store = store;
    let mut e = Engine::new(cfg);
    let mut out: Vec<Decided> = Vec::new();
    let mut now = Moment::from_nanos(BASE_NS);
    let mut verdicts = 0;
    // What the start-up waited for (the store's load) is not the steady state's.
    let waited0 = e.store_waited();
    let store0 = store_threads_cpu_ns();
    let (w0, c0, start) = (wchar(), on_cpu_ns(), Instant::now());
    let step = match pace {
        Pace::Flat => STEP,
        Pace::PerSecond(rate) => Duration::from_nanos(1_000_000_000 * PER_STEP as u64 / rate.max(1)),
    };
    let mut n = 0;
    while n < calls {
        let at = now.as_nanos();
        let evidence: Vec<SpanEvidence> = (n..(n + PER_STEP as u64).min(calls))
            .flat_map(|i| call(i, at + (i - n) * (step.as_nanos() as u64 / PER_STEP as u64)))
            .collect();
        n += PER_STEP as u64;
        e.ingest(NormalizedBatch { evidence, ..Default::default() }, now, &mut out);
        now += step;
        if let Pace::PerSecond(_) = pace {
            // Engine time is the wall clock's: wait for the next arrival.
            let due = start + Duration::from_nanos(now.as_nanos() - BASE_NS);
            if let Some(rest) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(rest);
            }
            now = Moment::from_nanos(BASE_NS + start.elapsed().as_nanos() as u64);
        }
        e.tick(now, &mut out);
        verdicts += out.iter().filter(|d| matches!(d, Decided::Call(_))).count() as u64;
        out.clear();
    }
    let steady = Steady {
        cpu_secs: on_cpu_ns().saturating_sub(c0) as f64 / 1e9,
        waited_secs: e.store_waited().saturating_sub(waited0).as_secs_f64(),
        verdicts,
    };
    now += Duration::from_secs(1);
    e.tick(now, &mut out);
    e.drain(DecidedBy::Shutdown, now, &mut out);
    verdicts += out.iter().filter(|d| matches!(d, Decided::Call(_))).count() as u64;
    let secs = start.elapsed().as_secs_f64();
    let cpu_secs = on_cpu_ns().saturating_sub(c0) as f64 / 1e9;
    let store_cpu_secs = store_cpu_since(&store0) as f64 / 1e9;
    assert_eq!(e.store_errors(), 0);
    Run { secs, cpu_secs, waited_secs: e.store_waited().as_secs_f64(), verdicts, wchar: wchar().saturating_sub(w0), store_cpu_secs, steady }
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` runs benches as tests with no flag:
    // then only a smoke run.
    let is_bench = std::env::args().any(|a| a == "--bench");
    let calls: u64 =
        if is_bench { std::env::var("MCP_HEALTH_BENCH_CALLS").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000) } else { 200 };

    // Warm the allocator and the code paths first.
    run("warm", calls.min(2_000), None);
    let none = run("flat-none", calls, None);
    let mem = run("flat-memory", calls, Some(StoreHandle::new(MemoryStore::new())));
    let dir = tempfile::tempdir().expect("tempdir");
    let store = StoreHandle::open_directory(dir.path()).expect("open the embedded store");
    let size0 = store.bytes_on_disk().unwrap_or(0);
    let emb = run("flat-redb", calls, Some(store.clone()));
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
        remember_for: Duration::from_secs(3660),
        record_life: Duration::from_secs(360),
    };
    let store = StoreHandle::open_redis(settings.clone()).expect("open the redis store");
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(&mut r.conn()).expect("reset redis's statistics");
    let before = net(&r);
    let red = run("flat-redis", calls, Some(store.clone()));
    let after = net(&r);
    // Where Redis spent its time: the commands' own microseconds per verdict, largest first.
    let stats: String = redis::cmd("INFO").arg("commandstats").query(&mut r.conn()).unwrap_or_default();
    let mut by_cmd: Vec<(String, u64, f64)> = stats
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |k: &str| rest.split(',').find_map(|f| f.strip_prefix(k)).and_then(|v| v.parse::<f64>().ok());
            Some((name.to_string(), field("calls=")? as u64, field("usec=")?))
        })
        .collect();
    by_cmd.sort_by(|a, b| b.2.total_cmp(&a.2));
    let shown: Vec<String> = by_cmd
        .iter()
        .take(6)
        .map(|(n, c, us)| format!("{n} {:.2} µs ({:.2} calls)", us / red.verdicts.max(1) as f64, *c as f64 / red.verdicts.max(1) as f64))
        .collect();
    println!("  redis (shared): Redis's time per verdict by command: {}", shown.join(", "));
    let st = store.stats().unwrap_or_default();
    let per = |x: u64| x as f64 / red.verdicts.max(1) as f64;
    println!(
        "  redis (shared): {:8.2} µs/verdict  x{:.2} (engine thread on CPU {:.2}, blocked on the store thread {:.2}: a store slower than the engine paces it; the store thread on CPU {:.2})",
        us(&red),
        us(&red) / us(&none),
        cpu(&red),
        red.waited_secs * 1e6 / red.verdicts.max(1) as f64,
        red.store_cpu_secs * 1e6 / red.verdicts.max(1) as f64
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
    let settings_far = RedisSettings { endpoint: format!("redis://{proxy}"), ..settings.clone() };
    let far =
        run("flat-redis-far", calls, Some(StoreHandle::open_redis(settings_far.clone()).expect("open the redis store through the proxy")));
    println!(
        "  redis +1 ms RTT: {:8.2} µs/verdict  x{:.2} (engine thread on CPU {:.2}, blocked on the store thread {:.2}; the store thread on CPU {:.2})",
        us(&far),
        us(&far) / us(&none),
        cpu(&far),
        far.waited_secs * 1e6 / far.verdicts.max(1) as f64,
        far.store_cpu_secs * 1e6 / far.verdicts.max(1) as f64
    );
    assert_eq!(far.verdicts, calls);

    // Paced: calls at a fixed rate, engine time the wall clock's, as in the service. The figure
    // is the engine thread's own time per verdict (on CPU + blocked on the store), not the wall
    // clock (mostly idle between arrivals).
    // Five rounds of the three, interleaved (the machine is shared and noisy): each round's
    // ratios, then their medians.
    let rate = if is_bench { PACED_PER_SECOND } else { 20_000 };
    let rounds = if is_bench { std::env::var("MCP_HEALTH_BENCH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(5) } else { 1 };
    if rounds == 0 {
        return;
    }
    println!("paced at {rate} calls/s, engine time = wall clock; the engine thread's time per verdict in the steady state, the drain at the end excluded (on CPU + blocked on the store):");
    let (mut red_ratios, mut far_ratios) = (Vec::new(), Vec::new());
    for round in 1..=rounds {
        let _: () = redis::cmd("FLUSHALL").query(&mut r.conn()).expect("flush redis");
        let p_none = run_paced("paced-none", calls, None, Pace::PerSecond(rate));
        let p_red = run_paced(
            "paced-redis",
            calls,
            Some(StoreHandle::open_redis(RedisSettings { endpoint: r.url(), ..settings.clone() }).expect("open")),
            Pace::PerSecond(rate),
        );
        let _: () = redis::cmd("FLUSHALL").query(&mut r.conn()).expect("flush redis");
        let p_far = run_paced(
            "paced-far",
            calls,
            Some(StoreHandle::open_redis(settings_far.clone()).expect("open through the proxy")),
            Pace::PerSecond(rate),
        );
        assert_eq!((p_none.verdicts, p_red.verdicts, p_far.verdicts), (calls, calls, calls));
        println!(
            "  round {round}: no store {:6.2}; redis {:6.2} x{:.2} (blocked {:.2}); redis +1 ms RTT {:6.2} x{:.2} (blocked {:.2})",
            p_none.engine_us(),
            p_red.engine_us(),
            p_red.engine_us() / p_none.engine_us(),
            p_red.waited_us(),
            p_far.engine_us(),
            p_far.engine_us() / p_none.engine_us(),
            p_far.waited_us(),
        );
        red_ratios.push(p_red.engine_us() / p_none.engine_us());
        far_ratios.push(p_far.engine_us() / p_none.engine_us());
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!("  median of {rounds}: redis x{:.2}, redis +1 ms RTT x{:.2}", median(&mut red_ratios), median(&mut far_ratios));
}
