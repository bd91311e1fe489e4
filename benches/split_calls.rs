//! The split-call join under its worst realistic pattern (issue 8, defect 1): FastMCP behind HTTP
//! server tracing, where every session's first call is request id 1 and each server half is a
//! trace of its own. N such calls arrive within a few seconds; how much CPU does deciding them
//! all take? (Before the fix the candidate search was roughly cubic: 1,000 calls never finished.)
//!
//!     cargo bench --bench split_calls           (MCP_HEALTH_SPLIT_CALLS=10000 by default)
//!
//! Numbers, not assertions. In test mode (`cargo test --all-targets`) it runs 200 calls once.

use std::sync::Arc;
use std::time::Duration;

use mcp_health::engine::{Decided, Engine, EngineConfig};
use mcp_health::evidence::time::Moment;
use mcp_health::evidence::{Method, Side, SpanEvidence};
use mcp_health::normalize::NormalizedBatch;
use mcp_health::testing::correlate::{ChainLimits, SessionLimits};
use mcp_health::verdict::DecidedBy;

#[global_allocator]
static GLOBAL: mcp_health::Mimalloc = mcp_health::Mimalloc;

fn thread_cpu_secs() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

fn trace(side: u8, i: u32) -> [u8; 16] {
    let mut t = [side; 16];
    t[..4].copy_from_slice(&i.to_be_bytes());
    t
}

/// One split call: the client's span in its trace; the server's HTTP root and MCP span in another.
fn split_call(i: u32, sessions: bool) -> [SpanEvidence; 3] {
    let t0 = 1_700_000_000_000_000_000u64 + u64::from(i) * 300_000; // ~3,300 calls a second
    let span = |t: [u8; 16], id: u8, parent: Option<u8>, side: Side, method: Option<Method>, at: (u64, u64)| {
        let mut s = SpanEvidence::new(t, [id; 8]);
        s.parent_span_id = parent.map(|p| [p; 8]);
        s.side = side;
        s.method = method;
        s.request_id = s.method.as_ref().map(|_| "1".into());
        s.tool = Some(Arc::from("echo"));
        s.start_ns = at.0;
        s.end_ns = at.1;
        if sessions && s.method.is_some() {
            s.session_id = Some(format!("s-{i}").into());
        }
        s
    };
    let client = span(trace(1, i), 1, None, Side::Client, Some(Method::ToolsCall), (t0, t0 + 20_000_000));
    let mut root = span(trace(2, i), 7, None, Side::Server, None, (t0 + 1_000_000, t0 + 19_000_000));
    root.http_status = Some(200);
    root.http_mcp_endpoint = true;
    let server = span(trace(2, i), 8, Some(7), Side::Server, Some(Method::ToolsCall), (t0 + 2_000_000, t0 + 18_000_000));
    [server, root, client]
}

fn run(n: u32, sessions: bool) -> (f64, usize, u64, u64) {
    let mut e = Engine::new(EngineConfig::new(
        ChainLimits { max_chains: 10_000_000, max_bytes: usize::MAX, ..ChainLimits::default() },
        SessionLimits::default(),
    ));
    let mut out = Vec::new();
    let cpu0 = thread_cpu_secs();
    let mut now = Moment::from_nanos(1_700_000_000_000_000_000);
    for chunk in (0..n).collect::<Vec<_>>().chunks(512) {
        let evidence = chunk.iter().flat_map(|i| split_call(*i, sessions)).collect();
        e.ingest(NormalizedBatch { evidence, ..Default::default() }, now, &mut out);
        now += Duration::from_millis(150);
        e.tick(now, &mut out);
    }
    e.tick(now + Duration::from_secs(5), &mut out);
    e.drain(DecidedBy::Shutdown, now + Duration::from_secs(6), &mut out);
    let cpu = thread_cpu_secs() - cpu0;
    let verdicts = out.iter().filter(|d| matches!(d, Decided::Call(_))).count();
    let st = &e.chains().cross.stats;
    (cpu, verdicts, st.halves_joined, st.candidates_capped)
}

fn main() {
    let is_bench = std::env::args().any(|a| a == "--bench");
    let n: u32 = if is_bench { std::env::var("MCP_HEALTH_SPLIT_CALLS").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000) } else { 200 };
    for sessions in [true, false] {
        let (cpu, verdicts, joined, capped) = run(n, sessions);
        println!(
            "split calls sharing request id 1, {}: {n} calls decided in {cpu:.2} CPU-s ({:.1} µs/call); {verdicts} verdicts, {joined} joined, {capped} lookups capped",
            if sessions { "with session ids" } else { "without session ids" },
            cpu * 1e6 / f64::from(n)
        );
    }
}
