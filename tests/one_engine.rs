//! One engine (issue 8): every OTLP/JSON fixture and dialect recording under `tests/`, sent to the
//! real binary over OTLP/HTTP and replayed offline with the same configuration, gives the same
//! call verdicts (trace, method, request id, tool, state, first failed layer, layers), the same
//! catalog verdicts and the same incidents.
//!
//! The recordings' timestamps are moved to now (the service judges on the wall clock; replay on
//! span time), and replay's clock is moved on to the moment the service's output was read, so both
//! answer "what is the state now". The service is read before SIGTERM: a drain at shutdown marks
//! what it decides early by design, which replay's end of input does not.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mcp_health::config::Config;
use mcp_health::engine::CatalogLine;
use mcp_health::evidence::time::Moment;
use mcp_health::testing::cli::replay::{engine_config, replay_until};
use serde_json::Value;
use support::*;

/// Every recording under tests/ that is OTLP/JSON, one request per line.
fn recordings() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in ["tests/fixtures", "tests/fixtures/dialects"] {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
        for e in std::fs::read_dir(&dir).expect("fixtures dir") {
            let p = e.expect("entry").path();
            if p.extension().is_some_and(|x| x == "jsonl") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64
}

const TIME_KEYS: [&str; 3] = ["startTimeUnixNano", "endTimeUnixNano", "timeUnixNano"];
const TIME_ATTRS: [&str; 2] = ["mcp_health.outcome.checked_at", "mcp_health.catalog.signal_at"];

fn walk_times(v: &mut Value, f: &mut impl FnMut(&mut Value)) {
    match v {
        Value::Object(m) => {
            let is_time_attr = m.get("key").and_then(Value::as_str).is_some_and(|k| TIME_ATTRS.contains(&k));
            for (k, x) in m.iter_mut() {
                if TIME_KEYS.contains(&k.as_str()) {
                    f(x);
                } else if is_time_attr && k == "value" {
                    if let Some(i) = x.get_mut("intValue") {
                        f(i);
                    }
                } else {
                    walk_times(x, f);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| walk_times(x, f)),
        _ => {}
    }
}

fn as_ns(v: &Value) -> Option<u64> {
    v.as_str().and_then(|s| s.parse().ok()).or_else(|| v.as_u64())
}

/// The recording's lines with every timestamp moved so the latest is `end_ns`.
fn shifted(path: &Path, end_ns: u64) -> Vec<String> {
    let mut docs: Vec<Value> =
        std::fs::read_to_string(path).unwrap().lines().filter(|l| !l.trim().is_empty()).map(|l| serde_json::from_str(l).unwrap()).collect();
    let mut latest = 0u64;
    for d in &mut docs {
        walk_times(d, &mut |x| latest = latest.max(as_ns(x).unwrap_or(0)));
    }
    let delta = end_ns as i128 - latest as i128;
    for d in &mut docs {
        walk_times(d, &mut |x| {
            if let Some(t) = as_ns(x).filter(|t| *t > 0) {
                *x = Value::String(((t as i128 + delta).max(0) as u64).to_string());
            }
        });
    }
    docs.iter().map(|d| d.to_string()).collect()
}

type CallKey = (String, String, String, String, String, String, String);

fn call_key(v: &Value) -> CallKey {
    let s = |k: &str| match &v[k] {
        Value::Null => "-".to_string(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    (s("trace_id"), s("method"), s("request_id"), s("tool"), s("state"), s("first_failed_layer"), v["layers"].to_string())
}

/// What one run said, reduced to what must agree.
#[derive(Debug, PartialEq)]
struct Said {
    calls: Vec<CallKey>,
    catalog: BTreeMap<String, String>,
    incidents: BTreeMap<String, String>,
}

fn reduce<'a>(lines: impl IntoIterator<Item = &'a Value>) -> Said {
    let mut calls: BTreeMap<(String, String), CallKey> = BTreeMap::new();
    let mut catalog = BTreeMap::new();
    let mut incidents = BTreeMap::new();
    for l in lines {
        if l["catalog"] == true {
            catalog.insert(l["session_hash"].as_str().unwrap_or("").to_string(), l["convergence"].as_str().unwrap_or("").to_string());
        } else if l["incident"] == true {
            incidents.insert(l["row"]["id"].as_str().unwrap_or("").to_string(), l["row"]["state"].as_str().unwrap_or("").to_string());
        } else if l.get("method").is_some() {
            // The latest word on each call (a revision, or an interim `working` on one in flight).
            calls.insert((l["trace_id"].to_string(), l["span_id"].to_string()), call_key(l));
        }
    }
    let mut calls: Vec<CallKey> = calls.into_values().collect();
    calls.sort();
    Said { calls, catalog, incidents }
}

async fn serve_and_replay(path: PathBuf) -> Result<String, String> {
    let name = path.file_name().unwrap().to_string_lossy().to_string();
    let lines = shifted(&path, now_ns().saturating_sub(100_000_000));
    let svc = Service::start(Cfg { exporter: None, decision_wait: "300ms", max_wait: "2s", ..Cfg::default() }).await;
    for l in &lines {
        let r = svc.post_json(l.as_bytes()).await;
        if r.status != 200 {
            return Err(format!("{name}: the service answered {} to a recording line", r.status));
        }
    }
    // Until the output has been still for 3 s (chains decided on quiet, TTLs passed).
    let mut last = (usize::MAX, std::time::Instant::now());
    let started = std::time::Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let n = svc.json_lines().len();
        if n != last.0 {
            last = (n, std::time::Instant::now());
        } else if last.1.elapsed() >= Duration::from_secs(3) {
            break;
        }
        if started.elapsed() > Duration::from_secs(60) {
            return Err(format!("{name}: the service's output did not settle"));
        }
    }
    let at = now_ns();
    let served = svc.json_lines();
    let cfg = Config::load(Some(svc.config_path.to_str().unwrap())).map_err(|e| e.to_string())?;
    svc.terminate(Duration::from_secs(15)).await;

    let file = svc.dir().join("recording.jsonl");
    std::fs::write(&file, lines.join("\n")).unwrap();
    let mut errors = Vec::new();
    let r = replay_until(&[file.to_string_lossy().to_string()], engine_config(&cfg), Some(Moment::from_nanos(at)), &mut errors);
    if !errors.is_empty() {
        return Err(format!("{name}: replay errors {errors:?}"));
    }
    let mut replayed: Vec<Value> = r.verdicts.iter().map(|v| serde_json::to_value(v).unwrap()).collect();
    replayed.extend(r.catalog.iter().map(|c| serde_json::to_value(CatalogLine::of(c)).unwrap()));
    replayed.extend(r.incidents.iter().map(|i| serde_json::to_value(i).unwrap()));
    let (a, b) = (reduce(&served), reduce(&replayed));
    if a.calls.is_empty() && a.catalog.is_empty() {
        return Err(format!("{name}: the service said nothing, a vacuous comparison"));
    }
    if a != b {
        return Err(format!("{name}: serve and replay differ\n  serve:  {a:?}\n  replay: {b:?}"));
    }
    Ok(format!("{name}: {} calls, {} catalog sessions, {} incidents agree", a.calls.len(), a.catalog.len(), a.incidents.len()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_recording_gives_the_same_verdicts_served_and_replayed() {
    let files = recordings();
    assert!(files.len() >= 10, "the recordings are found: {files:?}");
    let runs: Vec<_> = files.into_iter().map(|f| tokio::spawn(serve_and_replay(f))).collect();
    let mut failures = Vec::new();
    for r in runs {
        match r.await.expect("run") {
            Ok(line) => eprintln!("{line}"),
            Err(e) => failures.push(e),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
