//! `mcp-health replay FILE…`: the offline way to ask "what would it say about this?".
//!
//! Reads OTLP/JSON, one `ExportTraceServiceRequest` per line (what the collector's file exporter
//! writes), joins spans by trace across all lines and files, and prints a verdict per call and the
//! protocol and verified success rates side by side.

use std::io::{BufRead, BufReader, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use serde::Serialize;

use crate::classify::catalog::CatalogVerdict;
use crate::classify::pinning::Lockfile;
use crate::correlate::{ChainLimits, Chains, SessionLimits, Sessions};
use crate::normalize::normalize_request;
use crate::receive::otlp_json;
use crate::verdict::{DecidedBy, Verdict};

#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// OTLP/JSON files, one ExportTraceServiceRequest per line; `-` reads standard input.
    #[arg(required = true)]
    pub files: Vec<String>,
    /// Check discovered tool definitions against this lockfile (see `mcp-health lock`).
    #[arg(long)]
    pub lockfile: Option<String>,
    /// `table` for people, `json` for one JSON object per verdict followed by a summary object.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum Format {
    Table,
    Json,
}

/// The two rates of SPEC section 2, reported side by side.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    pub summary: bool,
    pub calls: u64,
    pub protocol_successes: u64,
    pub verified_successes: u64,
    pub protocol_success_rate: f64,
    pub verified_success_rate: f64,
}

impl Summary {
    pub fn of(verdicts: &[Verdict]) -> Summary {
        let calls = verdicts.len() as u64;
        let p = verdicts.iter().filter(|v| v.protocol_success).count() as u64;
        let v = verdicts.iter().filter(|v| v.verified_success).count() as u64;
        let rate = |n: u64| if calls == 0 { 0.0 } else { n as f64 / calls as f64 };
        Summary {
            summary: true,
            calls,
            protocol_successes: p,
            verified_successes: v,
            protocol_success_rate: rate(p),
            verified_success_rate: rate(v),
        }
    }
}

/// Why a replay input was refused.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("{file}: {source}")]
    Read { file: String, source: std::io::Error },
    #[error("{file}:{line}: {source}")]
    Decode { file: String, line: usize, source: otlp_json::JsonError },
}

/// One session's catalog verdict, as `replay` reports it.
#[derive(Clone, Debug, Serialize)]
pub struct CatalogRow {
    /// Always true: tells catalog lines from verdict lines in `--format json`.
    pub catalog: bool,
    /// SHA-256 of the session key (`session:<mcp.session.id>` or `client:<service>|server:<address>`).
    pub session_hash: String,
    pub server: Option<std::sync::Arc<str>>,
    #[serde(flatten)]
    pub verdict: CatalogVerdict,
}

/// Everything a replay decided.
pub struct Replayed {
    pub verdicts: Vec<Verdict>,
    pub catalog: Vec<CatalogRow>,
    /// Every tool definition discovered, in (server, tool, time) order (for `lock`).
    pub discoveries: Vec<crate::correlate::Discovery>,
    /// Definitions that differ from their pins (when replayed with a lockfile).
    pub drift: Vec<crate::pipeline::DriftEvent>,
    /// Incident transitions, in the order of the verdicts' evidence times.
    pub incidents: Vec<IncidentLine>,
}

/// One incident transition, as `replay` reports it.
#[derive(Clone, Debug, Serialize)]
pub struct IncidentLine {
    pub incident: bool,
    pub transition: crate::classify::incidents::Transition,
    pub row: crate::classify::incidents::Incident,
}

/// Classify everything in `files`. Bad lines are reported and skipped, not fatal.
pub fn replay_files(files: &[String], errors: &mut Vec<ReplayError>) -> Vec<Verdict> {
    replay(files, None, errors).verdicts
}

/// Classify calls and catalog sessions in `files`, checking tool definitions against `pins`.
pub fn replay(files: &[String], pins: Option<&Lockfile>, errors: &mut Vec<ReplayError>) -> Replayed {
    let mut chains = Chains::new(ChainLimits {
        max_chains: usize::MAX,
        max_bytes: usize::MAX,
        max_spans_per_chain: 100_000,
        max_decided: 0,
        ..ChainLimits::default()
    });
    let mut sessions = Sessions::new(SessionLimits {
        max_sessions: usize::MAX,
        max_events_per_session: 100_000,
        track_call_activity: true,
        ..SessionLimits::default()
    });
    let now = Instant::now();
    // The clocks of calls still in flight at the end of the input are read at the latest span time.
    let mut latest_ns = 0u64;
    let mut sink = Vec::new();
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
                    let batch = normalize_request(&req);
                    latest_ns = batch.evidence.iter().map(|e| e.end_ns.max(e.start_ns)).fold(latest_ns, u64::max);
                    sessions.observe(&batch.evidence, now);
                    chains.ingest(batch, now, &mut sink)
                }
                Err(source) => errors.push(ReplayError::Decode { file: file.clone(), line: n + 1, source }),
            }
            lines_read += 1;
            if last_progress.elapsed() > Duration::from_secs(2) {
                eprintln!("replay: {lines_read} lines read, {} chains, {:.0?} elapsed", chains.in_flight(), started.elapsed());
                last_progress = Instant::now();
            }
        }
    }
    chains.drain(DecidedBy::Replay, now, &mut sink);
    let mut verdicts: Vec<Verdict> = sink
        .iter()
        .flat_map(|d| crate::pipeline::verdicts_of(d, &sessions, pins, &crate::classify::progress::ProgressPolicy::default(), latest_ns))
        .collect();
    verdicts.sort_by(|a, b| (a.start_ns, a.trace_id).cmp(&(b.start_ns, b.trace_id)));
    let catalog = sessions
        .all_current()
        .into_iter()
        .map(|(session, server, verdict)| CatalogRow {
            catalog: true,
            session_hash: crate::normalize::redact::hash_hex(session.as_bytes()),
            server,
            verdict,
        })
        .collect();
    let mut seen = Default::default();
    let drift = match pins {
        Some(p) => {
            // Every discovery, in time order, against the pins.
            let mut all = Vec::new();
            for d in sessions.discoveries() {
                let check = p.check(&d.server, &d.tool, &d.digest, crate::normalize::definitions::lookup(&d.digest).as_ref());
                if let crate::classify::pinning::PinCheck::Drift { pinned_digest, changes } = check {
                    if seen_insert(&mut seen, &d) {
                        all.push(crate::pipeline::DriftEvent {
                            drift: true,
                            server: d.server.to_string(),
                            tool: d.tool.to_string(),
                            pinned_digest,
                            digest: d.digest.to_string(),
                            changes,
                            trace_id: [0; 16],
                            span_id: [0; 8],
                        });
                    }
                }
            }
            all
        }
        None => Vec::new(),
    };
    let mut book = crate::classify::incidents::IncidentBook::default();
    let mut by_time: Vec<&Verdict> = verdicts.iter().collect();
    by_time.sort_by_key(|v| (v.end_ns, v.start_ns));
    let incidents = by_time
        .into_iter()
        .flat_map(|v| book.observe(v))
        .map(|(transition, row)| IncidentLine { incident: true, transition, row })
        .collect();
    Replayed { verdicts, catalog, discoveries: sessions.discoveries(), drift, incidents }
}

fn seen_insert(seen: &mut std::collections::HashSet<(String, String, String)>, d: &crate::correlate::Discovery) -> bool {
    seen.insert((d.server.to_string(), d.tool.to_string(), d.digest.to_string()))
}

pub fn run(a: ReplayArgs) -> ExitCode {
    let mut errors = Vec::new();
    let pins = match a.lockfile.as_deref().map(super::lock::load_lockfile) {
        Some(Ok(l)) => Some(l),
        Some(Err(e)) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
        None => None,
    };
    let Replayed { verdicts, catalog, drift, incidents, .. } = replay(&a.files, pins.as_ref(), &mut errors);
    for e in &errors {
        eprintln!("error: {e}");
    }
    let summary = Summary::of(&verdicts);
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let res = match a.format {
        Format::Json => drift
            .iter()
            .map(|d| serde_json::to_value(d))
            .chain(incidents.iter().map(serde_json::to_value))
            .try_for_each(|v| {
                v.map_err(std::io::Error::other)
                    .and_then(|v| serde_json::to_writer(&mut out, &v).map_err(std::io::Error::other))
                    .and_then(|_| writeln!(out))
            })
            .and_then(|_| write_json(&mut out, &verdicts, &catalog, &summary)),
        Format::Table => write_table(&mut out, &verdicts, &catalog, &summary).and_then(|_| write_incidents(&mut out, &incidents)),
    };
    if res.is_err() {
        return ExitCode::from(1);
    }
    if errors.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

fn write_json(out: &mut impl Write, verdicts: &[Verdict], catalog: &[CatalogRow], summary: &Summary) -> std::io::Result<()> {
    for v in verdicts {
        serde_json::to_writer(&mut *out, v)?;
        writeln!(out)?;
    }
    for c in catalog {
        serde_json::to_writer(&mut *out, c)?;
        writeln!(out)?;
    }
    serde_json::to_writer(&mut *out, summary)?;
    writeln!(out)
}

fn write_incidents(out: &mut impl Write, incidents: &[IncidentLine]) -> std::io::Result<()> {
    // The final state of each incident.
    let mut last: Vec<&IncidentLine> = Vec::new();
    for l in incidents {
        match last.iter_mut().find(|x| x.row.id == l.row.id) {
            Some(x) => *x = l,
            None => last.push(l),
        }
    }
    if last.is_empty() {
        return Ok(());
    }
    writeln!(out)?;
    writeln!(
        out,
        "{:<16} {:<9} {:<14} {:<21} {:<28} {:>5} {:>7}",
        "INCIDENT", "STATE", "FIRST FAILED", "HEALTH STATE", "SERVER", "CALLS", "RETRIES"
    )?;
    for l in last {
        let r = &l.row;
        writeln!(
            out,
            "{:<16} {:<9} {:<14} {:<21} {:<28} {:>5} {:>7}",
            r.id,
            r.state.as_str(),
            r.cause.first_failed_layer.map_or("-", |x| x.as_str()),
            r.cause.state.as_str(),
            r.cause.server.as_deref().unwrap_or("-"),
            r.calls,
            r.retry_count
        )?;
    }
    Ok(())
}

fn write_table(out: &mut impl Write, verdicts: &[Verdict], catalog: &[CatalogRow], s: &Summary) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<32} {:<12} {:<18} {:<14} {:<21} {:<10} {:<26}",
        "TRACE", "METHOD", "TOOL", "FIRST FAILED", "STATE", "CONFIDENCE", "REASON"
    )?;
    for v in verdicts {
        writeln!(
            out,
            "{:<32} {:<12} {:<18} {:<14} {:<21} {:<10} {:<26}",
            hex::encode(v.trace_id),
            v.method.as_deref().unwrap_or("-"),
            v.tool.as_deref().unwrap_or("-"),
            v.first_failed_layer.map_or("-", |l| l.as_str()),
            v.state.as_str(),
            v.confidence.as_str(),
            v.reason.as_deref().unwrap_or("-"),
        )?;
    }
    if !catalog.is_empty() {
        writeln!(out)?;
        writeln!(out, "{:<16} {:<32} {:<13} {}", "CATALOG SESSION", "SERVER", "CONVERGENCE", "REASON")?;
        for c in catalog {
            writeln!(
                out,
                "{:<16} {:<32} {:<13} {}",
                &c.session_hash[..16],
                c.server.as_deref().unwrap_or("-"),
                c.verdict.convergence.as_str(),
                c.verdict.reason
            )?;
        }
    }
    writeln!(out)?;
    writeln!(out, "calls: {}", s.calls)?;
    writeln!(out, "protocol success: {} of {} ({:.1} %)", s.protocol_successes, s.calls, s.protocol_success_rate * 100.0)?;
    writeln!(out, "verified success: {} of {} ({:.1} %)", s.verified_successes, s.calls, s.verified_success_rate * 100.0)
}
