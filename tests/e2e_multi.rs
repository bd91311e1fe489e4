//! End to end (issue 12): mcp-health processes (the test build, see `instance_binary`)
//! sharing one Debian `redis-server` (`storage: {kind: redis}`), fed by a test router that splits
//! each OTLP request by trace id over the collector's `load_balancing` ring
//! (tests/support/ring.rs), against one process fed the same requests whole, over every fixture
//! and dialect recording under tests/fixtures.
//!
//! `three_instances_on_one_redis_…`: three instances. Each call's latest revision across
//! instances is one process's verdict (state, protocol and verified success: the same rates); no
//! instance's final verdict is greener than one process's, none judges a call one process does
//! not, none is lost; every incident is one process's (id, highest retry count, one `opened` and
//! one `resolved` across instances); no session is `converged` where one process's is not.
//!
//! `a_ring_change_a_restart_and_a_redis_restart_…`: the ring grows 3 → 4, then one instance is
//! stopped (SIGTERM) and started again while Redis restarts, in mid-stream: no verdict greener
//! than one process's, every difference marked partial, nothing lost.
//!
//! What makes them hold crosses traces through the store: sessions read back and merged, incidents
//! folded by compare-and-set, refused HTTP spans, client halves of split calls and parked verifiers
//! published and read where the other part of their call is (src/engine, docs/multi-instance.md).

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

#[path = "support/ring.rs"]
mod ring;

use serde_json::Value;
use support::*;

const WAIT: Duration = Duration::from_secs(20);

/// The binary the instances run: the test build of mcp-health (`CARGO_BIN_EXE_mcp-health`), or
/// another build named in `MCP_HEALTH_RELEASE_BIN` (a release binary, to run the instances as a
/// deployment does), said on stderr.
fn instance_binary() -> Option<std::path::PathBuf> {
    let p = std::env::var_os("MCP_HEALTH_RELEASE_BIN").map(std::path::PathBuf::from)?;
    assert!(p.exists(), "MCP_HEALTH_RELEASE_BIN={} does not exist", p.display());
    eprintln!("NOTE: the instances run {}", p.display());
    Some(p)
}

fn greenness(state: &str) -> u8 {
    match state {
        "healthy" => 2,
        "unverified" | "working" => 1,
        _ => 0,
    }
}

/// One OTLP/JSON request split by trace id: (trace id bytes, the request with that trace's spans).
fn split_by_trace(line: &str) -> Vec<([u8; 16], String)> {
    let v: Value = serde_json::from_str(line).unwrap();
    let mut parts: BTreeMap<String, Value> = BTreeMap::new();
    for rs in v["resourceSpans"].as_array().unwrap() {
        for ss in rs["scopeSpans"].as_array().unwrap() {
            for sp in ss["spans"].as_array().unwrap() {
                let t = sp["traceId"].as_str().unwrap().to_string();
                let req = parts.entry(t).or_insert_with(|| serde_json::json!({"resourceSpans": []}));
                let rss = req["resourceSpans"].as_array_mut().unwrap();
                let mut r = rs.clone();
                let mut s = ss.clone();
                s["spans"] = Value::Array(vec![sp.clone()]);
                r["scopeSpans"] = Value::Array(vec![s]);
                rss.push(r);
            }
        }
    }
    parts
        .into_iter()
        .map(|(t, req)| {
            let mut id = [0u8; 16];
            hex::decode_to_slice(&t, &mut id).unwrap_or_else(|e| panic!("trace id {t}: {e}"));
            (id, req.to_string())
        })
        .collect()
}

/// The final verdict of each call (its latest revision) and of each catalog session.
type Calls = BTreeMap<(String, String), (String, String)>;

/// (state, reason) of each call's final verdict, and each session's final convergence.
fn finals(svc: &Service) -> (Calls, BTreeMap<String, String>) {
    let mut calls = BTreeMap::new();
    let mut catalogs = BTreeMap::new();
    for l in svc.json_lines() {
        if l["catalog"] == true {
            if let (Some(s), Some(c)) = (l["session_hash"].as_str(), l["convergence"].as_str()) {
                catalogs.insert(s.to_string(), c.to_string());
            }
        } else if let (Some(t), Some(s), Some(st)) = (l["trace_id"].as_str(), l["span_id"].as_str(), l["state"].as_str()) {
            calls.insert((t.to_string(), s.to_string()), (st.to_string(), l["reason"].as_str().unwrap_or("").to_string()));
        }
    }
    (calls, catalogs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_on_one_redis_are_never_greener_than_one_process() {
    if !redis_server::available("three_instances_on_one_redis_are_never_greener_than_one_process") {
        return;
    }
    let r = redis_server::RedisServer::start();
    let cfg = Cfg { storage_redis: Some(r.url()), decision_wait: "500ms", exporter: None, binary: instance_binary(), ..Cfg::default() };
    let mut instances = Vec::new();
    for _ in 0..3 {
        instances.push(Service::start(cfg.clone()).await);
    }
    let single = Service::start(Cfg { decision_wait: "500ms", exporter: None, ..Cfg::default() }).await;
    let names: Vec<String> = (0..3).map(|i| format!("mcp-health-{i}.mcp-health:4317")).collect();
    let ring = ring::Ring::new(&names);

    let lines = recorded_lines();
    let mut routed = [0usize; 3];
    for (file, line) in &lines {
        assert_eq!(single.post_json(line.as_bytes()).await.status, 200);
        for (trace, part) in split_by_trace(line) {
            let k = ring.index_for(&trace).unwrap();
            routed[k] += 1;
            assert_eq!(instances[k].post_json(part.as_bytes()).await.status, 200, "{file}");
        }
    }
    // Let every chain be decided by the clock, then drain. Catalog sessions converge across
    // instances eventually (each re-reads the sessions it calls converged from the store every
    // second, docs/multi-instance.md): wait, within a bound, until no instance's latest catalog
    // verdict is greener than one process's — on a loaded machine one pass of that re-read may
    // not have come yet after 1.5 s. What the instances say after the drain is checked below.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let (_, one_now) = finals(&single);
    let all: Vec<&Service> = instances.iter().collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !converged_beyond(&latest_catalogs(&all), &one_now).is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for svc in instances.iter().chain(std::iter::once(&single)) {
        let st = svc.terminate(WAIT).await.expect("exits on SIGTERM");
        assert!(st.success(), "{st:?}\n{}", svc.stderr());
    }

    let (one_calls, one_catalogs) = finals(&single);
    let mut bad = Vec::new();
    let (mut same, mut less_green, mut other) = (0, 0, 0);
    let mut judged: BTreeMap<(String, String), usize> = BTreeMap::new();
    for (k, svc) in instances.iter().enumerate() {
        let (calls, _) = finals(svc);
        for (call, (state, _)) in &calls {
            *judged.entry(call.clone()).or_default() += 1;
            match one_calls.get(call) {
                None => bad.push(format!("instance {k}: {state} for {call:?}, which one process does not judge")),
                Some((want, reason)) if greenness(state) > greenness(want) => {
                    bad.push(format!("instance {k}: {state} for {call:?}, one process: {want} ({reason})"));
                }
                Some((want, _)) if want == state => same += 1,
                Some((want, _)) if greenness(state) < greenness(want) => less_green += 1,
                Some(_) => other += 1,
            }
        }
    }
    bad.extend(converged_beyond(&latest_catalogs(&instances.iter().collect::<Vec<_>>()), &one_catalogs));
    let lost: Vec<_> = one_calls.keys().filter(|c| !judged.contains_key(*c)).collect();
    println!(
        "{} request lines of the fixtures and dialect recordings, trace parts routed {routed:?}; {} calls judged by one process: {same} the same on the instances, {less_green} less green, {other} another state as green; {} lost",
        lines.len(),
        one_calls.len(),
        lost.len()
    );
    // Incidents, for the figures: one process's (id → highest retry count, transitions) against
    // the instances'.
    let incidents = |svc: &Service| {
        let mut m: BTreeMap<String, (u64, Vec<String>)> = BTreeMap::new();
        for l in svc.json_lines().into_iter().filter(|l| l["incident"] == true) {
            let e = m.entry(l["row"]["id"].as_str().unwrap_or("").to_string()).or_default();
            e.0 = e.0.max(l["row"]["retry_count"].as_u64().unwrap_or(0));
            e.1.push(l["transition"].as_str().unwrap_or("").to_string());
        }
        m
    };
    let one = incidents(&single);
    println!("incidents, one process: {one:?}");
    // Across instances: each incident one process has, with the same number of `opened` and
    // `resolved` transitions (each emitted by one instance only) and its highest retry count.
    let mut union: BTreeMap<String, (u64, Vec<String>)> = BTreeMap::new();
    for (k, svc) in instances.iter().enumerate() {
        let mine = incidents(svc);
        println!("incidents, instance {k}: {mine:?}");
        for (id, (retries, ts)) in mine {
            let e = union.entry(id).or_default();
            e.0 = e.0.max(retries);
            e.1.extend(ts);
        }
    }
    let summary = |m: &BTreeMap<String, (u64, Vec<String>)>| -> BTreeMap<String, (u64, usize, usize)> {
        m.iter()
            .map(|(id, (r, ts))| {
                let n = |w: &str| ts.iter().filter(|t| *t == w).count();
                (id.clone(), (*r, n("opened"), n("resolved")))
            })
            .collect()
    };
    assert_eq!(
        summary(&union),
        summary(&one),
        "incidents (id → highest retry count, opened, resolved) across instances against one process"
    );
    assert!(bad.is_empty(), "false greens or phantom verdicts:\n{}", bad.join("\n"));
    assert!(lost.is_empty(), "calls no instance judged: {lost:?}");
    assert!(routed.iter().all(|n| *n > 0), "the ring used every instance: {routed:?}");
    // The same verdicts and rates: each call's latest revision across instances (a call revised
    // on another instance than the one that first decided it, as a split call's) is one
    // process's, in state, protocol success and verified success.
    let one_latest = latest(std::slice::from_ref(&single));
    let many_latest = latest(&instances);
    let differ: Vec<_> =
        one_latest.iter().filter(|(c, v)| many_latest.get(*c) != Some(*v)).map(|(c, v)| (c, v, many_latest.get(c))).collect();
    assert!(differ.is_empty(), "calls whose latest verdict across instances is not one process's: {differ:?}");
    let rate = |m: &BTreeMap<(String, String), (String, bool, bool)>| {
        (m.len(), m.values().filter(|v| v.1).count(), m.values().filter(|v| v.2).count())
    };
    assert_eq!(rate(&many_latest), rate(&one_latest), "(calls, protocol successes, verified successes)");
}

/// Each call's latest revision over the logs of `svcs`: (state, protocol success, verified
/// success); of two lines of one revision, the less green.
fn latest(svcs: &[Service]) -> BTreeMap<(String, String), (String, bool, bool)> {
    let mut m: BTreeMap<(String, String), (u64, String, bool, bool)> = BTreeMap::new();
    for svc in svcs {
        for l in svc.json_lines() {
            if l["catalog"] == true || l["incident"] == true {
                continue;
            }
            let (Some(t), Some(sp), Some(st)) = (l["trace_id"].as_str(), l["span_id"].as_str(), l["state"].as_str()) else { continue };
            let rev = l["revision"].as_u64().unwrap_or(0);
            let v = (rev, st.to_string(), l["protocol_success"] == true, l["verified_success"] == true);
            let e = m.entry((t.to_string(), sp.to_string())).or_insert_with(|| v.clone());
            if v.0 > e.0 || (v.0 == e.0 && greenness(&v.1) < greenness(&e.1)) {
                *e = v;
            }
        }
    }
    m.into_iter().map(|(k, (_, st, p, vs))| (k, (st, p, vs))).collect()
}

/// Each session's latest catalog verdict across the logs of `svcs`: on a shared store each
/// change is emitted by one instance, so a session's history is spread over them. "Latest" is by
/// the evidence the verdict stands on (its latest signal or traversal end); of two verdicts on
/// the same evidence, the one that is not `converged`.
fn latest_catalogs(svcs: &[&Service]) -> BTreeMap<String, String> {
    let mut m: BTreeMap<String, (u64, String)> = BTreeMap::new();
    for svc in svcs {
        for l in svc.json_lines().into_iter().filter(|l| l["catalog"] == true) {
            let (Some(sess), Some(conv)) = (l["session_hash"].as_str(), l["convergence"].as_str()) else { continue };
            let at = l["signal_at_ns"].as_u64().unwrap_or(0).max(l["traversal_end_ns"].as_u64().unwrap_or(0));
            let e = m.entry(sess.to_string()).or_insert((at, conv.to_string()));
            if at > e.0 || (at == e.0 && e.1 == "converged") {
                *e = (at, conv.to_string());
            }
        }
    }
    m.into_iter().map(|(k, (_, c))| (k, c)).collect()
}

/// Sessions `converged` in `many` where one process's verdict is not.
fn converged_beyond(many: &BTreeMap<String, String>, one: &BTreeMap<String, String>) -> Vec<String> {
    many.iter()
        .filter(|(s, c)| *c == "converged" && one.get(*s).map(String::as_str) != Some("converged"))
        .map(|(s, _)| format!("session {s} converged, one process: {:?}", one.get(s)))
        .collect()
}

/// Every OTLP/JSON request line of the fixtures and the dialect recordings, in file order.
fn recorded_lines() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for sub in ["tests/fixtures", "tests/fixtures/dialects"] {
        let dir = format!("{}/{sub}", env!("CARGO_MANIFEST_DIR"));
        let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().filter_map(|e| e.ok()).map(|e| e.path()).collect();
        files.retain(|p| p.extension().is_some_and(|x| x == "jsonl"));
        files.sort();
        for f in files {
            let name = f.file_name().unwrap().to_string_lossy().into_owned();
            for line in std::fs::read_to_string(&f).unwrap().lines().filter(|l| !l.trim().is_empty()) {
                out.push((name.clone(), line.to_string()));
            }
        }
    }
    out
}

/// Each call's final verdict in one process's log: (state, partial).
fn final_calls(svc: &Service) -> BTreeMap<(String, String), (String, Value)> {
    let mut calls = BTreeMap::new();
    for l in svc.json_lines() {
        if l["catalog"] == true || l["incident"] == true {
            continue;
        }
        if let (Some(t), Some(s), Some(st)) = (l["trace_id"].as_str(), l["span_id"].as_str(), l["state"].as_str()) {
            calls.insert((t.to_string(), s.to_string()), (st.to_string(), l["partial"].clone()));
        }
    }
    calls
}

/// Issue 12: the ring changes 3 → 4 in mid-stream, then one instance is stopped (SIGTERM) and
/// started again and Redis restarts (with its append-only file) in between, over every fixture
/// and dialect recording. No verdict on any instance is greener than one process's, none is
/// made up, and every verdict that differs from one process's is marked partial (decided at
/// shutdown, started before its instance, taken from the store, or judged while the store was
/// down). No session is `converged` where one process's is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ring_change_a_restart_and_a_redis_restart_are_never_greener_and_differences_are_partial() {
    if !redis_server::available("a_ring_change_a_restart_and_a_redis_restart_are_never_greener_and_differences_are_partial") {
        return;
    }
    let mut r = redis_server::RedisServer::start_with(true, None);
    let cfg = Cfg {
        storage_redis: Some(r.url()),
        decision_wait: "500ms",
        exporter: None,
        listener_extra: vec![("mcp_health", "partial_before_start: true".to_string())],
        binary: instance_binary(),
        ..Cfg::default()
    };
    let mut instances: Vec<Service> = Vec::new();
    for _ in 0..3 {
        instances.push(Service::start(cfg.clone()).await);
    }
    let mut retired: Vec<Service> = Vec::new();
    let single = Service::start(Cfg { decision_wait: "500ms", exporter: None, ..Cfg::default() }).await;
    let names = |n: usize| -> Vec<String> { (0..n).map(|i| format!("mcp-health-{i}.mcp-health:4317")).collect() };
    let mut ring = ring::Ring::new(&names(3));

    let lines = recorded_lines();
    let (p1, p2) = (lines.len() / 3, 2 * lines.len() / 3);
    let mut routed = [0usize; 4];
    for (i, (file, line)) in lines.iter().enumerate() {
        if i == p1 {
            // The ring grows: the collector's resolver finds a fourth instance.
            instances.push(Service::start(cfg.clone()).await);
            ring = ring::Ring::new(&names(4));
        }
        if i == p2 {
            // Instance 1 is stopped and started again (a rolling restart keeps its place on the
            // ring: hostnames), and Redis restarts meanwhile.
            let old = instances.remove(1);
            let st = old.terminate(WAIT).await.expect("exits on SIGTERM");
            assert!(st.success(), "{st:?}\n{}", old.stderr());
            retired.push(old);
            r.restart();
            instances.insert(1, Service::start(cfg.clone()).await);
        }
        assert_eq!(single.post_json(line.as_bytes()).await.status, 200);
        for (trace, part) in split_by_trace(line) {
            let k = ring.index_for(&trace).unwrap();
            routed[k] += 1;
            assert_eq!(instances[k].post_json(part.as_bytes()).await.status, 200, "{file}");
        }
    }
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let (_, one_now) = finals(&single);
    let all: Vec<&Service> = instances.iter().chain(retired.iter()).collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !converged_beyond(&latest_catalogs(&all), &one_now).is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for svc in instances.iter().chain(std::iter::once(&single)) {
        let st = svc.terminate(WAIT).await.expect("exits on SIGTERM");
        assert!(st.success(), "{st:?}\n{}", svc.stderr());
    }

    let one = final_calls(&single);
    let (_, one_catalogs) = finals(&single);
    let (mut bad, mut same, mut partial, mut judged) = (Vec::new(), 0, 0, std::collections::BTreeSet::new());
    // The traces of a failure: their verdict lines are printed below, from every process.
    let mut bad_traces = std::collections::BTreeSet::new();
    for (k, svc) in instances.iter().chain(retired.iter()).enumerate() {
        for (call, (state, why)) in final_calls(svc) {
            judged.insert(call.clone());
            let bad_before = bad.len();
            // A call one process does not judge as such is a part of one it does: the server
            // half of a split call (a trace of its own, joined to its client's in one process),
            // or a server span of a trace one process anchors on the client span — decided at
            // shutdown before the other part came. It must be partial, and never `healthy`; where
            // one process judges its trace, no greener than that.
            let of_trace: Vec<&String> = one.iter().filter(|((t, _), _)| *t == call.0).map(|(_, (st, _))| st).collect();
            match one.get(&call) {
                None if why.is_null() || state == "healthy" || of_trace.iter().any(|w| greenness(&state) > greenness(w)) => bad
                    .push(format!("process {k}: {state} ({why}) for {call:?}, which one process does not judge (its trace: {of_trace:?})")),
                None => partial += 1,
                Some((want, _)) if greenness(&state) > greenness(want) => {
                    bad.push(format!("process {k}: {state} for {call:?}, one process: {want}"))
                }
                Some((want, _)) if *want == state => same += 1,
                Some((want, _)) if why.is_null() => {
                    bad.push(format!("process {k}: {state} for {call:?}, one process: {want}, and not marked partial"))
                }
                Some(_) => partial += 1,
            }
            if bad.len() > bad_before {
                bad_traces.insert(call.0.clone());
            }
        }
    }
    bad.extend(converged_beyond(&latest_catalogs(&all), &one_catalogs));
    let lost: Vec<_> = one.keys().filter(|c| !judged.contains(*c)).collect();
    println!(
        "{} request lines, ring 3 → 4 at {p1}, restart of instance 1 and of Redis at {p2}; parts routed {routed:?}; {} calls by one process: {same} the same, {partial} different and marked partial; {} lost",
        lines.len(),
        one.len(),
        lost.len()
    );
    // Traces asked for by hand (`E2E_MULTI_DEBUG=<trace id prefixes, comma-separated>`), and
    // those of any failure: every process's verdict lines for them.
    let asked = std::env::var("E2E_MULTI_DEBUG").unwrap_or_default();
    let want: Vec<&str> = asked.split(',').filter(|w| !w.is_empty()).chain(bad_traces.iter().map(String::as_str)).collect();
    if !want.is_empty() {
        for svc in instances.iter().chain(retired.iter()).chain(std::iter::once(&single)) {
            for l in svc.json_lines() {
                if l["trace_id"].as_str().is_some_and(|t| want.iter().any(|w| t.starts_with(w))) {
                    println!(
                        "DEBUG {} {} {} layer={} reason={} rev={} by={} partial={} sup={}",
                        l["trace_id"],
                        l["span_id"],
                        l["state"],
                        l["first_failed_layer"],
                        l["reason"],
                        l["revision"],
                        l["decided_by"],
                        l["partial"],
                        l["supersedes"]
                    );
                }
            }
            println!("DEBUG ----");
        }
    }
    for c in &lost {
        let trace = c.0.clone();
        let mut id = [0u8; 16];
        hex::decode_to_slice(&trace, &mut id).unwrap();
        let files: Vec<_> =
            lines.iter().enumerate().filter(|(_, (_, l))| l.contains(&trace)).map(|(i, (f, _))| format!("{f}@{i}")).collect();
        println!("lost {c:?} {:?} ring4 → {:?} in {files:?}", one.get(*c), ring.index_for(&id));
    }
    assert!(bad.is_empty(), "false greens, phantom verdicts or unmarked differences:\n{}", bad.join("\n"));
    assert!(lost.is_empty(), "calls no instance judged: {lost:?}");
}
