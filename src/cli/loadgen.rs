//! `mcp-health loadgen`: send pre-encoded batches of MCP spans to an OTLP/gRPC endpoint and report
//! the accepted rate. For sizing a deployment, or benchmarking this service (see `benches/`).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use crate::loadgen;

#[derive(Args, Debug)]
pub(crate) struct LoadgenArgs {
    /// OTLP/gRPC endpoint to send to.
    #[arg(long, default_value = "127.0.0.1:4317")]
    pub endpoint: String,
    /// How long to send, in seconds.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Tool calls per request (three spans each: client, server, verifier).
    #[arg(long, default_value_t = 171)]
    pub calls_per_batch: u32,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 2)]
    pub in_flight: usize,
    /// Spans per second to send at, at most (default: as fast as the endpoint accepts).
    #[arg(long)]
    pub rate: Option<f64>,
}

pub(crate) fn run(a: LoadgenArgs) -> ExitCode {
    let batches: Vec<_> = (0..64).map(|b| loadgen::encode(&loadgen::build_request(b, a.calls_per_batch))).collect();
    eprintln!("loadgen: {} batches of {} spans prepared; sending to {} for {}s", batches.len(), batches[0].spans, a.endpoint, a.seconds);
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(1);
        }
    };
    let opts = loadgen::SendOptions { rate: a.rate, ..Default::default() };
    match rt.block_on(loadgen::run_with(&a.endpoint, Arc::new(batches), Duration::from_secs(a.seconds), a.in_flight, &opts)) {
        Ok(r) => {
            println!(
                "{} spans accepted in {:.1}s = {:.0} spans/s ({} requests ok, {} refused)",
                r.spans_accepted,
                r.elapsed.as_secs_f64(),
                r.spans_accepted as f64 / r.elapsed.as_secs_f64(),
                r.requests_ok,
                r.requests_refused
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: cannot connect to {}: {e}", a.endpoint);
            ExitCode::from(1)
        }
    }
}
