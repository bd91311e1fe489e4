//! The receive path's per-span cost in steady state, in this process, on one core: the wire walk
//! and the engine (ingest, then time passing: chains fall due and are decided and classified),
//! with chains arriving and leaving at a fixed rate on a manual clock.
//!
//!     cargo bench --bench steady                        (3 rounds of 5 s)
//!     MCP_HEALTH_STEADY_RATE=300000 MCP_HEALTH_STEADY_SECS=5 cargo bench --bench steady
//!
//! This is what the service's one runtime thread does per span (`service.runtime.worker_threads`,
//! 1 by default), less the network and the sinks: unlike `throughput` (the service over loopback
//! gRPC, beside its load generator on the same two cores), nothing here waits on the network.
//! Unlike `scaling`, chains are decided as they fall due (`decision_wait` 1 s of span time, so the
//! table holds rate × 1 s chains), as in the service. On a shared machine the figures still move
//! by a fifth from run to run: compare two builds over several rounds in turns, by their least
//! figures. Numbers, not assertions.

use std::time::{Duration, Instant};

use mcp_health::engine::{Decided, Engine, EngineConfig};
use mcp_health::evidence::time::Moment;
use mcp_health::testing::loadgen;

#[global_allocator]
static GLOBAL: mcp_health::Mimalloc = mcp_health::Mimalloc;

fn main() {
    let is_bench = std::env::args().any(|a| a == "--bench");
    let env = |k: &str, d: u64| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    let rate = env("MCP_HEALTH_STEADY_RATE", 300_000).max(1);
    let secs = env("MCP_HEALTH_STEADY_SECS", 5);
    let base = loadgen::encode(&loadgen::build_request(0, 171));
    if !is_bench {
        let (b, _) = mcp_health::normalize::wire::walk(&base.bytes, "0000000000000000").expect("walk");
        assert_eq!(b.evidence.len() as u64, base.spans);
        println!("steady bench: batches build; run `cargo bench --bench steady` to measure");
        return;
    }
    // One batch's span time on the simulated clock.
    let step = Duration::from_nanos(base.spans * 1_000_000_000 / rate);
    for round in 1..=3 {
        let decision_wait = Duration::from_secs(1);
        let mut cfg = EngineConfig::default();
        cfg.chains.decision_wait = decision_wait;
        cfg.chains.max_wait = Duration::from_secs(5);
        cfg.chains.max_chains = 2_000_000;
        cfg.chains.max_bytes = 4 << 30;
        let mut engine = Engine::new(cfg);
        let mut out: Vec<Decided> = Vec::new();
        let mut now = Moment::from_nanos(1_764_000_000_000_000_000);
        let mut stamp = 0u32;
        // Batches until `done(batches so far, wall time so far)`.
        let mut run = |engine: &mut Engine, now: &mut Moment, out: &mut Vec<Decided>, done: &dyn Fn(u64, Duration) -> bool| {
            let (mut spans, mut verdicts, mut batches) = (0u64, 0u64, 0u64);
            let t = Instant::now();
            while !done(batches, t.elapsed()) {
                batches += 1;
                let bytes = loadgen::stamp(&base, stamp);
                stamp += 1;
                let (batch, _) = mcp_health::normalize::wire::walk(&bytes, "0000000000000000").expect("walk");
                spans += batch.spans;
                engine.ingest(batch, *now, out);
                *now += step;
                engine.tick(*now, out);
                verdicts += out.iter().filter(|d| matches!(d, Decided::Call(_))).count() as u64;
                out.clear();
            }
            (spans, verdicts, t.elapsed())
        };
        // Fill to the steady level (two decision waits of span time: chains fall due as fast as
        // they come), then measure for `secs` of wall time.
        let fill = 2 * decision_wait.as_nanos() as u64 / step.as_nanos().max(1) as u64;
        run(&mut engine, &mut now, &mut out, &|batches, _| batches >= fill);
        let wall = Duration::from_secs(secs);
        let (spans, verdicts, spent) = run(&mut engine, &mut now, &mut out, &|_, elapsed| elapsed >= wall);
        println!(
            "round {round}: {:>7.0} ns/span ({:.0} spans/s on one core; {} spans, {} verdicts, {} chains in flight)",
            spent.as_nanos() as f64 / spans.max(1) as f64,
            spans as f64 / spent.as_secs_f64(),
            spans,
            verdicts,
            engine.gauges().chains_in_flight
        );
    }
}
