//! `mcp-health lock` and `mcp-health verify`: pin tool contracts from observed discoveries, and
//! check later discoveries against the pins.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, UNIX_EPOCH};

use clap::Args;

use super::replay::{replay, ReplayError};
use crate::classify::digest::PROJECTION_VERSION;
use crate::classify::pinning::{Lockfile, Pin};
use crate::correlate::Discovery;

pub use crate::config::lockfile::{load_lockfile, save_lockfile};

#[derive(Args, Debug)]
pub(crate) struct LockArgs {
    /// OTLP/JSON files with `tools/list` spans (one ExportTraceServiceRequest per line).
    #[arg(required = true)]
    pub files: Vec<String>,
    /// The lockfile to write (existing pins are kept: pins are taken at first contact).
    #[arg(long, default_value = "mcp-health.lock.json")]
    pub lockfile: String,
    /// Re-pin tools whose definition changed, to their latest observed definition.
    #[arg(long)]
    pub update: bool,
}

#[derive(Args, Debug)]
pub(crate) struct VerifyArgs {
    /// OTLP/JSON files with `tools/list` spans.
    #[arg(required = true)]
    pub files: Vec<String>,
    /// The lockfile to check against.
    #[arg(long, default_value = "mcp-health.lock.json")]
    pub lockfile: String,
    /// Fail on tools that have no pin too.
    #[arg(long)]
    pub strict: bool,
}

fn rfc3339(ns: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_nanos(ns)).to_string()
}

/// The first 19 characters of a digest (`sha256:` and 12 hex digits), for display; never panics.
fn short(d: &str) -> &str {
    d.char_indices().nth(19).map_or(d, |(i, _)| &d[..i])
}

fn report_errors(errors: &[ReplayError]) {
    for e in errors {
        eprintln!("error: {e}");
    }
}

/// First and latest discovery of each (server, tool).
fn by_tool(discoveries: &[Discovery]) -> BTreeMap<(String, String), (&Discovery, &Discovery)> {
    let mut m: BTreeMap<(String, String), (&Discovery, &Discovery)> = BTreeMap::new();
    for d in discoveries {
        let e = m.entry((d.server.to_string(), d.tool.to_string())).or_insert((d, d));
        if d.at_ns < e.0.at_ns {
            e.0 = d;
        }
        if d.at_ns >= e.1.at_ns {
            e.1 = d;
        }
    }
    m
}

pub(crate) fn run_lock(a: LockArgs) -> ExitCode {
    let mut errors = Vec::new();
    let r = replay(&a.files, None, &mut errors);
    report_errors(&errors);
    let mut lock = if std::path::Path::new(&a.lockfile).exists() {
        match load_lockfile(&a.lockfile) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        }
    } else {
        Lockfile::new()
    };
    let (mut added, mut updated) = (0, 0);
    for ((server, tool), (first, latest)) in by_tool(&r.discoveries) {
        let d = if a.update { latest } else { first };
        let pin = Pin {
            digest: d.digest.to_string(),
            projection_version: PROJECTION_VERSION.into(),
            first_seen: rfc3339(d.at_ns),
            definition: r.definitions.lookup(&d.digest),
        };
        let existed = lock.pin(&server, &tool).is_some();
        if lock.add(&server, &tool, pin, a.update) {
            if existed {
                updated += 1;
            } else {
                added += 1;
            }
        }
    }
    if let Err(e) = save_lockfile(&lock, &a.lockfile) {
        eprintln!("error: {e}");
        return ExitCode::from(1);
    }
    let total: usize = lock.servers.values().map(|t| t.len()).sum();
    println!("{}: {total} tool(s) pinned across {} server(s); {added} new, {updated} re-pinned", a.lockfile, lock.servers.len());
    if errors.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

pub(crate) fn run_verify(a: VerifyArgs) -> ExitCode {
    let pins = match load_lockfile(&a.lockfile) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let mut errors = Vec::new();
    let r = replay(&a.files, Some(&pins), &mut errors);
    report_errors(&errors);
    for d in &r.drift {
        println!("DRIFT {} {}: pinned {} now {}", d.server, d.tool, short(&d.pinned_digest), short(&d.digest));
        if d.changes.is_empty() {
            println!("  - definition changed (no definition observed to diff; send raw definitions in mcp_health.catalog.tools)");
        }
        for c in &d.changes {
            println!("  - {}", c.describe());
        }
    }
    let unpinned: Vec<_> = by_tool(&r.discoveries).into_keys().filter(|(s, t)| pins.pin(s, t).is_none()).collect();
    for (s, t) in &unpinned {
        println!("UNPINNED {s} {t}");
    }
    let checked = by_tool(&r.discoveries).len();
    println!("{checked} tool(s) checked: {} drifted, {} unpinned", r.drift.len(), unpinned.len());
    if !r.drift.is_empty() || (a.strict && !unpinned.is_empty()) || !errors.is_empty() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
