//! `mcp-health replay FILE…`: the offline way to ask "what would it say about this?".
//!
//! Reads OTLP/JSON, one `ExportTraceServiceRequest` per line (what the collector's file exporter
//! writes), joins spans by trace across all lines and files, and prints a verdict per call and the
//! protocol and verified success rates side by side.
//!
//! As a CI gate (`--fail-on`), its exit code is the answer, stable across releases: 0 the gate
//! passed, 1 findings, 2 bad input or configuration (an unparseable condition, an unreadable or
//! undecodable file, a bad lockfile or configuration). `--format junit|sarif` writes the same
//! verdicts for a CI system's test report or a code-scanning dashboard.

mod fail_on;
mod junit;
mod sarif;

use std::io::Write;
use std::process::ExitCode;

use clap::{Args, ValueEnum};
use serde::Serialize;

use crate::classify::pinning::Lockfile;
use crate::config::Config;
use crate::correlate::CatalogChange;
use crate::emit::sink::Collect;
use crate::engine::{CatalogLine, Decided, DriftEvent, Engine, EngineConfig, IncidentChange};
pub use crate::service::replay::{engine_config, ReplayError};
use crate::verdict::Verdict;

#[derive(Args, Debug)]
#[command(after_help = "\
Exit codes (stable, for CI): 0 passed (no --fail-on finding), 1 findings, 2 bad input or
configuration (an unparseable --fail-on SPEC, an unknown state or layer name, an unreadable or
undecodable file, a bad lockfile or configuration).

Examples:
  mcp-health replay evidence.jsonl --fail-on state=false_success,effect_unknown --fail-on layer=authorization
  mcp-health replay evidence.jsonl --fail-on 'verified_rate<0.9' --format sarif > mcp-health.sarif
  mcp-health replay evidence.jsonl --lockfile mcp-health.lock.json --fail-on drift --format junit > junit.xml")]
pub(crate) struct ReplayArgs {
    /// OTLP/JSON files, one ExportTraceServiceRequest per line; `-` reads standard input.
    #[arg(required = true)]
    pub files: Vec<String>,
    /// The service's configuration (its `processors.mcp_health` settings decide as the service
    /// would); the embedded default when absent.
    #[arg(long, short)]
    pub config: Option<String>,
    /// Check discovered tool definitions against this lockfile (see `mcp-health lock`); overrides
    /// the configuration's `lockfile`.
    #[arg(long)]
    pub lockfile: Option<String>,
    /// `table` for people, `json` for one JSON object per record followed by a summary object,
    /// `junit` for a CI test report (a test case per call), `sarif` for code scanning (SARIF 2.1.0).
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Fail (exit 1) when the replayed evidence shows this: `state=NAME[,NAME…]` (a verdict in one
    /// of these health states), `layer=NAME[,NAME…]` (a call whose first failed layer is one of
    /// these), `verified_rate<0.9` or `protocol_rate<0.9` (also `<=`, `>`, `>=`; `90%` works; no
    /// tool calls at all fails too), `drift` (a tool definition differs from its pin). Repeat it,
    /// or join conditions with commas. Exit codes: 0 passed, 1 findings, 2 bad input or condition.
    #[arg(long = "fail-on", value_name = "CONDITION")]
    pub fail_on: Vec<String>,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub(crate) enum Format {
    Table,
    Json,
    Junit,
    Sarif,
}

/// Exit code: the gate passed (no findings, no bad input).
const EXIT_PASS: u8 = 0;
/// Exit code: `--fail-on` found something.
const EXIT_FINDINGS: u8 = 1;
/// Exit code: bad input or configuration (SPEC, file, lockfile, configuration, output).
const EXIT_BAD_INPUT: u8 = 2;

/// Whether a verdict is a call of its own in the CI reports: every attempt (SPEC section 2), and
/// any other exchange that failed (a `tools/list` refused for authorization, say).
pub(crate) fn reported(v: &Verdict) -> bool {
    v.attempt || v.first_failed_layer.is_some() || v.state.is_failure()
}

/// A call's name in the CI reports: method, tool and the trace and span it is in. Nothing of the
/// arguments, the session or any URL: the trace id is the join key to the tracing backend.
pub(crate) fn call_identity(v: &Verdict) -> String {
    let method = v.method.as_deref().unwrap_or("call");
    match v.tool.as_deref() {
        Some(t) => format!("{method} {t} [{}/{}]", hex::encode(v.trace_id), hex::encode(v.span_id)),
        None => format!("{method} [{}/{}]", hex::encode(v.trace_id), hex::encode(v.span_id)),
    }
}

/// The two rates of SPEC section 2, reported side by side. Both count `tools/call` attempts
/// only: an `initialize` or a `ping` is no tool call.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    pub summary: bool,
    pub calls: u64,
    pub protocol_successes: u64,
    pub verified_successes: u64,
    /// `None` when there were no calls: "no calls", not 0 %.
    pub protocol_success_rate: Option<f64>,
    pub verified_success_rate: Option<f64>,
}

impl Summary {
    pub fn of(verdicts: &[Verdict]) -> Summary {
        let attempts: Vec<&Verdict> = verdicts.iter().filter(|v| v.attempt).collect();
        let calls = attempts.len() as u64;
        let p = attempts.iter().filter(|v| v.protocol_success).count() as u64;
        let v = attempts.iter().filter(|v| v.verified_success).count() as u64;
        let rate = |n: u64| (calls > 0).then(|| n as f64 / calls as f64);
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

/// Everything a replay decided.
pub struct Replayed {
    /// The final verdict of every call (its latest revision), in (start, trace) order.
    pub verdicts: Vec<Verdict>,
    /// Every record in the order the engine decided it (revisions and interim reports included).
    pub records: Vec<Decided>,
    /// Each session's catalog verdict at the end of the input.
    pub catalog: Vec<CatalogChange>,
    /// Every tool definition discovered, in (server, tool, time) order (for `lock`).
    pub discoveries: Vec<crate::correlate::Discovery>,
    /// The definitions seen, by digest (for `lock`'s pins).
    pub definitions: std::sync::Arc<crate::normalize::definitions::Definitions>,
    /// Definitions that differ from their pins (when replayed with a lockfile).
    pub drift: Vec<DriftEvent>,
    /// Incident transitions, in the order the engine decided them.
    pub incidents: Vec<IncidentChange>,
}

/// Classify everything in `files` with the embedded default configuration. Bad lines are
/// reported and skipped, not fatal.
pub fn replay_files(files: &[String], errors: &mut Vec<ReplayError>) -> Vec<Verdict> {
    replay(files, None, errors).verdicts
}

/// Classify calls and catalog sessions in `files` with the embedded default configuration,
/// checking tool definitions against `pins`.
pub(crate) fn replay(files: &[String], pins: Option<&Lockfile>, errors: &mut Vec<ReplayError>) -> Replayed {
    let cfg = Config::load(None).unwrap_or_else(|e| unreachable!("the embedded default parses: {e}"));
    let mut ec = engine_config(&cfg);
    ec.pins = pins.cloned().map(std::sync::Arc::new);
    replay_with(files, ec, errors)
}

/// Replay `files` through an engine configured with `cfg`.
pub(crate) fn replay_with(files: &[String], cfg: EngineConfig, errors: &mut Vec<ReplayError>) -> Replayed {
    replay_until(files, cfg, None, errors)
}

/// Replay `files` through an engine configured with `cfg`, its clock moved on to `until` after
/// the last line (see [`crate::service::replay::replay_until`]).
pub fn replay_until(
    files: &[String],
    cfg: EngineConfig,
    until: Option<crate::evidence::time::Moment>,
    errors: &mut Vec<ReplayError>,
) -> Replayed {
    let mut engine = Engine::new(cfg);
    let mut sink = Collect::default();
    let end = crate::service::replay::replay_until(files, &mut engine, &mut sink, errors, until);
    let records = sink.0;
    let verdicts = final_verdicts(&records);
    let mut drift = Vec::new();
    let mut incidents = Vec::new();
    for r in &records {
        match r {
            Decided::Drift(d) => drift.push(DriftEvent::clone(d)),
            Decided::Incident(i) => incidents.push(IncidentChange::clone(i)),
            _ => {}
        }
    }
    Replayed {
        verdicts,
        catalog: engine.catalog_rows(end),
        discoveries: engine.discoveries(),
        definitions: engine.definitions(),
        drift,
        incidents,
        records,
    }
}

/// The latest revision of each call's verdict, in (start, trace, span) order.
pub(crate) fn final_verdicts(records: &[Decided]) -> Vec<Verdict> {
    let mut last: rustc_hash::FxHashMap<([u8; 16], [u8; 8]), &Verdict> = Default::default();
    for r in records {
        if let Decided::Call(v) = r {
            last.insert((v.trace_id, v.span_id), v);
        }
    }
    let mut out: Vec<Verdict> = last.into_values().cloned().collect();
    out.sort_by_key(|a| (a.start_ns, a.trace_id, a.span_id));
    out
}

pub(crate) fn run(a: ReplayArgs) -> ExitCode {
    let conditions = match fail_on::parse_all(&a.fail_on) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    let mut errors = Vec::new();
    let cfg = match Config::load(a.config.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    let lockfile = a.lockfile.as_deref().or(cfg.processors.mcp_health.lockfile.as_deref());
    let pins = match lockfile.map(crate::config::lockfile::load_lockfile) {
        Some(Ok(l)) => Some(std::sync::Arc::new(l)),
        Some(Err(e)) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_BAD_INPUT);
        }
        None => None,
    };
    let mut ec = engine_config(&cfg);
    ec.pins = pins;
    let Replayed { verdicts, catalog, drift, incidents, .. } = replay_with(&a.files, ec, &mut errors);
    for e in &errors {
        eprintln!("error: {e}");
    }
    let summary = Summary::of(&verdicts);
    let evidence = fail_on::Evidence { verdicts: &verdicts, drift: &drift, summary: &summary };
    let findings = fail_on::evaluate(&conditions, &evidence);
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let res = match a.format {
        Format::Json => write_json(&mut out, &drift, &incidents, &verdicts, &catalog, &summary),
        Format::Table => write_table(&mut out, &verdicts, &catalog, &summary).and_then(|_| write_incidents(&mut out, &incidents)),
        Format::Junit => junit::write(&mut out, &verdicts, &drift),
        Format::Sarif => {
            let artifacts = sarif::Artifacts {
                evidence: a.files.first().map(String::as_str).filter(|f| *f != "-"),
                lockfile: lockfile.and_then(|p| std::fs::read_to_string(p).ok().map(|t| (p, t))),
            };
            sarif::write(&mut out, &evidence, &findings, &artifacts)
        }
    };
    if let Err(e) = res.and_then(|_| out.flush()) {
        // A closed pipe (`| head`) is the reader's choice; anything else is worth a line.
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("error: writing the output: {e}");
        }
        return ExitCode::from(EXIT_BAD_INPUT);
    }
    for f in &findings {
        eprintln!("{}", f.describe(&evidence));
    }
    if !errors.is_empty() {
        // Evidence that could not be read is no pass, whatever the rest says.
        return ExitCode::from(EXIT_BAD_INPUT);
    }
    if !conditions.is_empty() {
        let list: Vec<String> = conditions.iter().map(|c| c.to_string()).collect();
        eprintln!("fail-on {}: {} finding(s)", list.join(" "), findings.len());
    }
    ExitCode::from(if findings.is_empty() { EXIT_PASS } else { EXIT_FINDINGS })
}

/// Drift, incident transitions, final verdicts and catalog verdicts, each in the shape of the
/// service's verdict lines, then the summary.
fn write_json(
    out: &mut impl Write,
    drift: &[DriftEvent],
    incidents: &[IncidentChange],
    verdicts: &[Verdict],
    catalog: &[CatalogChange],
    summary: &Summary,
) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let records = drift
        .iter()
        .cloned()
        .map(|d| Decided::Drift(Box::new(d)))
        .chain(incidents.iter().cloned().map(|i| Decided::Incident(Box::new(i))))
        .chain(verdicts.iter().map(|v| Decided::Call(std::sync::Arc::new(v.clone()))))
        .chain(catalog.iter().cloned().map(|c| Decided::Catalog(Box::new(c))));
    for r in records {
        r.write_line(&mut buf).map_err(std::io::Error::other)?;
    }
    out.write_all(&buf)?;
    serde_json::to_writer(&mut *out, summary)?;
    writeln!(out)
}

fn write_incidents(out: &mut impl Write, incidents: &[IncidentChange]) -> std::io::Result<()> {
    // The final state of each incident.
    let mut last: Vec<&IncidentChange> = Vec::new();
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

fn write_table(out: &mut impl Write, verdicts: &[Verdict], catalog: &[CatalogChange], s: &Summary) -> std::io::Result<()> {
    // The server column is the one the incidents below and the alerts group by: which server a
    // failing call went to is the first thing an operator asks.
    writeln!(
        out,
        "{:<32} {:<12} {:<18} {:<28} {:<14} {:<21} {:<10} {:<26}",
        "TRACE", "METHOD", "TOOL", "SERVER", "FIRST FAILED", "STATE", "CONFIDENCE", "REASON"
    )?;
    for v in verdicts {
        writeln!(
            out,
            "{:<32} {:<12} {:<18} {:<28} {:<14} {:<21} {:<10} {:<26}",
            hex::encode(v.trace_id),
            v.method.as_deref().unwrap_or("-"),
            v.tool.as_deref().unwrap_or("-"),
            v.server.as_deref().unwrap_or("-"),
            v.first_failed_layer.map_or("-", |l| l.as_str()),
            v.state.as_str(),
            v.confidence.as_str(),
            v.reason.as_deref().unwrap_or("-"),
        )?;
    }
    if !catalog.is_empty() {
        writeln!(out)?;
        writeln!(out, "{:<16} {:<32} {:<13} REASON", "CATALOG SESSION", "SERVER", "CONVERGENCE")?;
        for c in catalog {
            let line = CatalogLine::of(c);
            writeln!(
                out,
                "{:<16} {:<32} {:<13} {}",
                &line.session_hash[..16],
                c.server.as_deref().unwrap_or("-"),
                c.verdict.convergence.as_str(),
                c.verdict.reason
            )?;
        }
    }
    writeln!(out)?;
    writeln!(out, "tool calls: {}", s.calls)?;
    let rate = |r: Option<f64>| r.map_or_else(|| "no calls".to_string(), |r| format!("{:.1} %", r * 100.0));
    writeln!(out, "protocol success: {} of {} ({})", s.protocol_successes, s.calls, rate(s.protocol_success_rate))?;
    writeln!(out, "verified success: {} of {} ({})", s.verified_successes, s.calls, rate(s.verified_success_rate))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::sample as verdict;

    /// Issue 8, defect 11: the two rates count `tools/call` attempts only (an `initialize` or a
    /// `ping` verdict is not a tool call), and with no calls they are "no calls", not 0 %.
    #[test]
    fn the_rates_count_tool_calls_only_and_none_is_not_zero() {
        let s = Summary::of(&[verdict("tools/call", true, false), verdict("initialize", false, false), verdict("ping", false, false)]);
        assert_eq!((s.calls, s.protocol_success_rate, s.verified_success_rate), (1, Some(1.0), Some(0.0)));
        let none = Summary::of(&[verdict("initialize", false, false)]);
        assert_eq!((none.calls, none.protocol_success_rate), (0, None));
        let mut out = Vec::new();
        write_table(&mut out, &[], &[], &none).unwrap();
        assert!(String::from_utf8(out).unwrap().contains("0 of 0 (no calls)"));
    }

    /// The table names each call's server between the tool and the first failed layer; a call
    /// with no server says `-`.
    #[test]
    fn the_table_has_a_server_column() {
        let mut with = verdict("tools/call", true, false);
        with.server = Some("tickets.example.test:8443".into());
        let without = verdict("tools/call", true, false);
        let mut out = Vec::new();
        write_table(&mut out, &[with, without], &[], &Summary::of(&[])).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<Vec<&str>> = text.lines().take(3).map(|l| l.split_whitespace().collect()).collect();
        assert_eq!(lines[0][..5], ["TRACE", "METHOD", "TOOL", "SERVER", "FIRST"], "{text}");
        assert_eq!(lines[1][3], "tickets.example.test:8443", "{text}");
        assert_eq!(lines[2][3], "-", "{text}");
    }
}
