//! The replay driver: OTLP/JSON files through the engine on the span-time clock.
//!
//! "Now" is the latest span end seen so far, so a recording is decided as the service would have
//! decided it while it ran: a chain goes quiet when later spans show `decision_wait` has passed, a
//! TTL expires when span time passes it, a late verifier revises. At the end of the input the
//! engine drains (`decided_by: replay`).

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use crate::emit::sink::Sink;
use crate::engine::Engine;
use crate::evidence::time::Moment;
use crate::normalize::normalize_request_with;
use crate::receive::otlp_json;
use crate::verdict::DecidedBy;

/// Why a replay input was refused.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("{file}: {source}")]
    Read { file: String, source: std::io::Error },
    #[error("{file}:{line}: {source}")]
    Decode { file: String, line: usize, source: otlp_json::JsonError },
}

/// The engine configuration of a configuration file ([`Config::engine_config`](crate::config::Config::engine_config)).
pub fn engine_config(cfg: &crate::config::Config) -> crate::engine::EngineConfig {
    cfg.engine_config()
}

/// Feed every line of `files` (one `ExportTraceServiceRequest` per line, `-` for stdin),
/// normalized with the engine's settings, to the engine and its records to `sink`; bad lines are reported in `errors` and skipped. Returns the
/// span-time clock at the end (the moment the final state is for). (The sinks' unit tests;
/// `cli::replay` runs [`replay_until`].)
#[cfg(test)]
pub(crate) fn replay(files: &[String], engine: &mut Engine, sink: &mut dyn Sink, errors: &mut Vec<ReplayError>) -> Moment {
    replay_until(files, engine, sink, errors, None)
}

/// [`replay`], with the clock moved on to `until` after the last line (when it is later) before
/// what is still in flight is drained: "what would the service say at `until`, had it received
/// these spans as they were made".
pub(crate) fn replay_until(
    files: &[String],
    engine: &mut Engine,
    sink: &mut dyn Sink,
    errors: &mut Vec<ReplayError>,
    until: Option<Moment>,
) -> Moment {
    // The engine's settings: the definitions its drift reports diff against are the ones read here.
    let normalize = engine.normalize_settings().clone();
    let mut now = Moment::ZERO;
    let mut out = Vec::new();
    let started = Instant::now();
    let mut last_progress = Instant::now();
    let mut lines_read = 0usize;
    for file in files {
        let reader: Box<dyn BufRead> = if file == "-" {
            Box::new(BufReader::new(std::io::stdin()))
        } else {
            match std::fs::File::open(file) {
                Ok(f) => Box::new(BufReader::new(f)),
                Err(source) => {
                    errors.push(ReplayError::Read { file: file.clone(), source });
                    continue;
                }
            }
        };
        for (n, line) in reader.lines().enumerate() {
            let line = match line {
                Ok(l) => l,
                Err(source) => {
                    errors.push(ReplayError::Read { file: file.clone(), source });
                    break;
                }
            };
            if line.trim().is_empty() {
                continue;
            }
            match otlp_json::decode_traces(line.as_bytes()) {
                Ok(req) => {
                    let batch = normalize_request_with(&req, &normalize);
                    let latest = batch.evidence.iter().map(|e| e.end_ns.max(e.start_ns)).max().unwrap_or(0);
                    now = now.max(Moment::from_nanos(latest));
                    engine.ingest(batch, now, &mut out);
                    engine.tick(now, &mut out);
                    sink.accept(&out, now);
                    out.clear();
                }
                Err(source) => errors.push(ReplayError::Decode { file: file.clone(), line: n + 1, source }),
            }
            lines_read += 1;
            if last_progress.elapsed() > Duration::from_secs(2) {
                eprintln!("replay: {lines_read} lines read, {} chains, {:.0?} elapsed", engine.in_flight(), started.elapsed());
                last_progress = Instant::now();
            }
        }
    }
    if let Some(t) = until.filter(|t| *t > now) {
        now = t;
        engine.tick(now, &mut out);
    }
    engine.drain(DecidedBy::Replay, now, &mut out);
    // Time-based verdicts as of the end of the input.
    engine.tick(now, &mut out);
    sink.accept(&out, now);
    sink.flush();
    now
}
