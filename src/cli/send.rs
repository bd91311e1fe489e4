//! `mcp-health send`: send OTLP/JSON recordings (one `ExportTraceServiceRequest` a line, as the
//! collector's file exporter writes and `replay` reads) to a running service, moved in time so the
//! newest span ends now.
//!
//! Why it exists: a recording's timestamps are those of the day it was made. Sent as they are, a
//! trace backend files them a year back (Jaeger's default window shows nothing) and the service's
//! freshness rules judge them against an old clock. Moving every timestamp by one offset keeps
//! what the engine decides (only differences of times matter to it) and puts the result where a
//! person looks. `--keep-timestamps` sends them unchanged.

use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;

#[derive(Args, Debug)]
pub(crate) struct SendArgs {
    /// OTLP/JSON files: one `ExportTraceServiceRequest` per line.
    #[arg(required = true)]
    pub files: Vec<String>,
    /// Where to send: a gRPC endpoint (`http://127.0.0.1:4317`, the default) or, with
    /// `--protocol http/protobuf|http/json`, an OTLP/HTTP base URL (`http://127.0.0.1:4318`).
    #[arg(long, default_value = "http://127.0.0.1:4317")]
    pub endpoint: String,
    /// `grpc`, `http/protobuf` or `http/json` (the OTLP specification's values).
    #[arg(long, default_value = "grpc")]
    pub protocol: String,
    /// Send the timestamps as recorded instead of moving the newest span's end to now.
    #[arg(long)]
    pub keep_timestamps: bool,
    /// Per-request timeout.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

/// What can go wrong, each with the file or request it concerns.
#[derive(Debug, thiserror::Error)]
enum SendError {
    #[error("{0}: {1}")]
    Read(String, std::io::Error),
    #[error("{file} line {line}: {source}")]
    Decode { file: String, line: usize, source: crate::receive::otlp_json::JsonError },
    #[error("exporter: {0}")]
    Exporter(String),
    #[error("request {0} was refused: {1}")]
    Refused(usize, String),
}

pub(crate) fn run(a: SendArgs) -> ExitCode {
    match send(&a) {
        Ok((requests, spans)) => {
            println!("sent {spans} spans in {requests} requests to {}", a.endpoint);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

fn send(a: &SendArgs) -> Result<(usize, u64), SendError> {
    let mut requests = Vec::new();
    for file in &a.files {
        let text = std::fs::read_to_string(file).map_err(|e| SendError::Read(file.clone(), e))?;
        for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let req = crate::receive::otlp_json::decode_traces(line.as_bytes()).map_err(|source| SendError::Decode {
                file: file.clone(),
                line: i + 1,
                source,
            })?;
            requests.push(req);
        }
    }
    if !a.keep_timestamps {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        shift_to(&mut requests, now);
    }
    let mut o: crate::config::OtlpExporter = serde_yaml_ng::from_str("{}").map_err(|e| SendError::Exporter(e.to_string()))?;
    o.endpoint = Some(crate::emit::otlp_traces::endpoint_uri(&a.endpoint));
    o.protocol = Some(a.protocol.clone());
    o.timeout = Some(a.timeout);
    let targets = crate::emit::otlp_target::resolve(&o, &|_| None).map_err(|e| SendError::Exporter(e.to_string()))?;
    let target = targets.traces.ok_or_else(|| SendError::Exporter("no traces endpoint".into()))?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| SendError::Exporter(e.to_string()))?;
    let count = requests.len();
    let mut spans = 0;
    rt.block_on(async {
        // Inside the runtime: the gRPC channel spawns its connection task at construction.
        let sender = crate::emit::otlp_traces::SpanSender::new(&target).map_err(|e| SendError::Exporter(e.to_string()))?;
        for (i, req) in requests.into_iter().enumerate() {
            spans += crate::flow::outgoing::span_count(&req);
            sender.send(req).await.map_err(|e| SendError::Refused(i + 1, e))?;
        }
        Ok::<_, SendError>(())
    })?;
    Ok((count, spans))
}

/// Move every timestamp (span start and end, event times) by one offset so that the latest span
/// end is `now`. Zero timestamps (unset) stay zero.
pub(crate) fn shift_to(requests: &mut [ExportTraceServiceRequest], now: u64) {
    let spans = || requests.iter().flat_map(|r| &r.resource_spans).flat_map(|rs| &rs.scope_spans).flat_map(|ss| &ss.spans);
    let Some(latest) = spans().map(|s| s.end_time_unix_nano.max(s.start_time_unix_nano)).max().filter(|t| *t > 0) else {
        return;
    };
    let delta = i128::from(now) - i128::from(latest);
    let moved = |t: &mut u64| {
        if *t != 0 {
            *t = u64::try_from((i128::from(*t) + delta).max(1)).unwrap_or(u64::MAX);
        }
    };
    for s in requests.iter_mut().flat_map(|r| &mut r.resource_spans).flat_map(|rs| &mut rs.scope_spans).flat_map(|ss| &mut ss.spans) {
        moved(&mut s.start_time_unix_nano);
        moved(&mut s.end_time_unix_nano);
        for e in &mut s.events {
            moved(&mut e.time_unix_nano);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_end_moves_to_now_and_differences_stay() {
        let line = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/eight_calls.jsonl")).unwrap();
        let mut reqs: Vec<_> = line
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| crate::receive::otlp_json::decode_traces(l.as_bytes()).unwrap())
            .collect();
        let before: Vec<(u64, u64)> = reqs
            .iter()
            .flat_map(|r| &r.resource_spans)
            .flat_map(|rs| &rs.scope_spans)
            .flat_map(|ss| &ss.spans)
            .map(|s| (s.start_time_unix_nano, s.end_time_unix_nano))
            .collect();
        let now = 1_900_000_000_000_000_000;
        shift_to(&mut reqs, now);
        let after: Vec<(u64, u64)> = reqs
            .iter()
            .flat_map(|r| &r.resource_spans)
            .flat_map(|rs| &rs.scope_spans)
            .flat_map(|ss| &ss.spans)
            .map(|s| (s.start_time_unix_nano, s.end_time_unix_nano))
            .collect();
        assert_eq!(after.iter().map(|(s, e)| *e.max(s)).max(), Some(now));
        let delta = after[0].0 - before[0].0;
        assert!(delta > 0);
        for (b, a) in before.iter().zip(&after) {
            assert_eq!((a.0 - b.0, a.1 - b.1), (delta, delta), "every timestamp moves by the same offset");
        }
    }
}
