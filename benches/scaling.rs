//! Does the engine's cost per span and memory per chain stay flat as chains in flight grow?
//!
//!     cargo bench --bench scaling              (MCP_HEALTH_SCALING_MAX=1000000 by default)
//!
//! One engine in this process, chains held in flight (a long `decision_wait`), fed the load
//! generator's batches read by the wire walk, as the receivers read them. At 1 k, 10 k, 100 k
//! and 1 M chains in flight it prints the ingest cost per span of the next batches (walk and
//! engine, one core), the heap bytes per chain (a counting allocator: every byte the engine holds,
//! tables and allocator size classes included, not an estimate) and the RSS growth per chain.
//! Then it decides them all and prints the cost per decided span. Numbers, not assertions.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};

use mcp_health::engine::{Decided, Engine, EngineConfig};
use mcp_health::evidence::time::Moment;
use mcp_health::testing::loadgen;
use mcp_health::verdict::DecidedBy;

/// mimalloc, as the service, with a count of the bytes it holds.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        unsafe { mcp_health::Mimalloc.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        unsafe { mcp_health::Mimalloc.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as isize - l.size() as isize, Ordering::Relaxed);
        unsafe { mcp_health::Mimalloc.realloc(p, l, new) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn rss_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    s.split_whitespace().nth(1).and_then(|p| p.parse::<u64>().ok()).unwrap_or(0) * 4096
}

fn main() {
    let is_bench = std::env::args().any(|a| a == "--bench");
    let max: usize = std::env::var("MCP_HEALTH_SCALING_MAX").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000_000);
    let calls_per_batch = 171u32;
    let base = loadgen::encode(&loadgen::build_request(0, calls_per_batch));
    if !is_bench {
        let (b, _) = mcp_health::normalize::wire::walk(&base.bytes, "0000000000000000").expect("walk");
        assert_eq!(b.evidence.len() as u64, base.spans);
        println!("scaling bench: batches build; run `cargo bench --bench scaling` to measure");
        return;
    }
    let mut cfg = EngineConfig::default();
    cfg.chains.decision_wait = Duration::from_secs(3600);
    cfg.chains.max_wait = Duration::from_secs(7200);
    cfg.chains.max_chains = max * 2;
    cfg.chains.max_bytes = usize::MAX / 2;
    let mut engine = Engine::new(cfg);
    let mut out: Vec<Decided> = Vec::new();
    let now = Moment::from_nanos(1_764_000_000_000_000_000);
    let heap0 = LIVE.load(Ordering::Relaxed);
    let rss0 = rss_bytes();
    let mut chains = 0usize;
    let mut round = 0u32;
    // Every batch its own trace ids (the round stamped into them): each call a new chain.
    let mut feed = |engine: &mut Engine, out: &mut Vec<Decided>, n_calls: usize| -> (u64, Duration) {
        let mut spans = 0;
        let mut spent = Duration::ZERO;
        let mut fed = 0;
        while fed < n_calls {
            let bytes = loadgen::stamp(&base, round);
            round += 1;
            let t = Instant::now();
            let (batch, _) = mcp_health::normalize::wire::walk(&bytes, "0000000000000000").expect("walk");
            spans += batch.spans;
            engine.ingest(batch, now, out);
            spent += t.elapsed();
            out.clear();
            fed += calls_per_batch as usize;
        }
        (spans, spent)
    };
    println!("{:>12} {:>14} {:>16} {:>16}", "in flight", "ns/span", "heap B/chain", "RSS B/chain");
    for level in [1_000usize, 10_000, 100_000, 1_000_000].into_iter().filter(|l| *l <= max) {
        // Fill to the level, then measure the next 20 k calls' worth of batches at that level.
        let (_, _) = feed(&mut engine, &mut out, level.saturating_sub(chains));
        chains = chains.max(level);
        let heap = (LIVE.load(Ordering::Relaxed) - heap0) as f64;
        let rss = rss_bytes().saturating_sub(rss0) as f64;
        // Per chain held now (the 20 k of the level before are held too: at 10 k that is twice
        // the level, so dividing by the level overstated it 2x).
        let held = engine.gauges().chains_in_flight.max(1) as f64;
        let (spans, spent) = feed(&mut engine, &mut out, 20_000);
        chains += 20_000usize.div_ceil(calls_per_batch as usize) * calls_per_batch as usize;
        println!("{:>12} {:>14.0} {:>16.0} {:>16.0}", held, spent.as_nanos() as f64 / spans.max(1) as f64, heap / held, rss / held);
    }
    let in_flight = engine.gauges().chains_in_flight;
    let t = Instant::now();
    engine.drain(DecidedBy::Shutdown, now + Duration::from_secs(1), &mut out);
    let verdicts = out.iter().filter(|d| matches!(d, Decided::Call(_))).count();
    println!(
        "decide all:  {} chains in flight, {} verdicts, {:.0} ns per chain (classification and release)",
        in_flight,
        verdicts,
        t.elapsed().as_nanos() as f64 / in_flight.max(1) as f64
    );
}
