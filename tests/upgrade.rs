//! An upgrade from release 0.1.0 or 0.2.0 forgets nothing and reads nothing greener: today's
//! engine loads what each release's binary stored (`tests/fixtures/upgrade/` for 0.1.0,
//! `tests/fixtures/upgrade-0.2.0/` for 0.2.0; each README says how it was made) from
//! `storage.directory` and from Redis, and the traffic after the upgrade gets the verdicts one
//! process that never stopped gives:
//!
//! - every record is read (`mcp_health.state.undecodable` stays 0);
//! - the open incidents stay open with their ids: the next -32601 is `updated`, `retry_count` 2;
//! - the session whose catalog was stale stays stale: its next call is `stale_catalog`;
//! - the call in flight at the stop (decided partial at shutdown) gets one verdict, a revision of
//!   the one the release decided, and counts as one attempt;
//! - a healthy call resolves what it resolves in one process.
//!
//! Every release's fixture goes through the same code, named by its [`Release`]. The engine runs on
//! a manual clock from the moment each store's release was stopped. The Redis half prints
//! `SKIPPED: …` without `redis-server`, except under `CI`.

mod support;

use std::collections::BTreeMap;
use std::io::Read;
use std::time::Duration;

use mcp_health::engine::{Decided, Engine, EngineConfig};
use mcp_health::evidence::time::Moment;
use mcp_health::normalize::normalize_request;
use mcp_health::testing::classify::incidents::{IncidentState, Transition};
use mcp_health::testing::correlate::{ChainLimits, SessionLimits};
use mcp_health::testing::receive::otlp_json::decode_traces;
use mcp_health::testing::state::redis::RedisSettings;
use mcp_health::testing::state::StoreHandle;
use mcp_health::verdict::{HealthState, Verdict};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use support::redis_server::{available, RedisServer};

/// A release whose stored state the upgrade must keep, and the fixture its binary made.
struct Release {
    /// As in `--version`, for the messages.
    name: &'static str,
    /// Its fixture directory.
    dir: &'static str,
}

const V0_1_0: Release = Release { name: "0.1.0", dir: concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/upgrade") };
const V0_2_0: Release = Release { name: "0.2.0", dir: concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/upgrade-0.2.0") };

struct Meta {
    pending_trace: String,
    redb_stopped_ns: u64,
    redis_stopped_ns: u64,
}

fn meta(rel: &Release) -> Meta {
    let m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(format!("{}/meta.json", rel.dir)).unwrap()).unwrap();
    assert!(m["made_by"].as_str().unwrap().starts_with(&format!("mcp-health {} ", rel.name)), "{}: made by {}", rel.dir, m["made_by"]);
    Meta {
        pending_trace: m["pending_trace"].as_str().unwrap().to_string(),
        redb_stopped_ns: m["redb_stopped_ns"].as_u64().unwrap(),
        redis_stopped_ns: m["redis_stopped_ns"].as_u64().unwrap(),
    }
}

fn requests(rel: &Release, name: &str) -> Vec<ExportTraceServiceRequest> {
    let text = std::fs::read_to_string(format!("{}/{name}", rel.dir)).unwrap();
    text.lines().filter(|l| !l.trim().is_empty()).map(|l| decode_traces(l.as_bytes()).unwrap()).collect()
}

/// The limits every release ran with (make.py's config): `decision_wait` 2 s, `max_wait` 30 s,
/// `late_span_window` 5 min.
fn config() -> EngineConfig {
    let chains = ChainLimits {
        decision_wait: Duration::from_secs(2),
        max_wait: Duration::from_secs(30),
        late_span_window: Duration::from_secs(300),
        ..ChainLimits::default()
    };
    EngineConfig::new(chains, SessionLimits::default())
}

/// Step the engine at every moment it falls due up to `now`, then at `now`.
fn step_to(e: &mut Engine, now: Moment, out: &mut Vec<Decided>) {
    while let Some(d) = e.next_due().filter(|d| *d <= now) {
        e.tick(d, out);
    }
    e.tick(now, out);
}

/// Send `reqs` 10 ms apart from `from_ns`, then let two minutes pass.
fn send(e: &mut Engine, reqs: &[ExportTraceServiceRequest], from_ns: u64, out: &mut Vec<Decided>) -> u64 {
    let mut at = from_ns;
    for r in reqs {
        step_to(e, Moment::from_nanos(at), out);
        e.ingest(normalize_request(r), Moment::from_nanos(at), out);
        at += 10_000_000;
    }
    at
}

fn settle(e: &mut Engine, from_ns: u64, out: &mut Vec<Decided>) {
    step_to(e, Moment::from_nanos(from_ns + 120_000_000_000), out);
}

/// What the engine said after the upgrade, and its undecodable records.
struct After {
    out: Vec<Decided>,
    undecodable: u64,
    open_at_load: usize,
}

/// Today's engine on `store`, from a second after the release stopped: `after.jsonl`, then two
/// minutes.
fn after_upgrade(rel: &Release, store: StoreHandle, stopped_ns: u64) -> After {
    let mut e = Engine::new(EngineConfig { store: Some(store), ..config() });
    let mut out = Vec::new();
    // On Redis the open-incident gauge is the gauge lease holder's, taken at the first step.
    step_to(&mut e, Moment::from_nanos(stopped_ns + 500_000_000), &mut out);
    let undecodable = e.gauges().state_skipped.total();
    let open_at_load = e.gauges().incidents_open.values().sum::<u64>() as usize;
    let end = send(&mut e, &requests(rel, "after.jsonl"), stopped_ns + 1_000_000_000, &mut out);
    settle(&mut e, end, &mut out);
    e.flush_store(Moment::from_nanos(end + 120_000_000_000), &mut out);
    After { out, undecodable, open_at_load }
}

/// One process that never stopped: `before.jsonl` as the release got it (the last line 0.3 s
/// before the stop, the rest 3.5 s earlier), `after.jsonl` a second after the stop.
fn one_process(rel: &Release, stopped_ns: u64) -> (Vec<Decided>, Vec<Decided>) {
    let mut e = Engine::new(config());
    let before = requests(rel, "before.jsonl");
    let (last, first) = before.split_last().unwrap();
    let mut out = Vec::new();
    send(&mut e, first, stopped_ns - 3_800_000_000 - 10_000_000 * first.len() as u64, &mut out);
    send(&mut e, std::slice::from_ref(last), stopped_ns - 300_000_000, &mut out);
    step_to(&mut e, Moment::from_nanos(stopped_ns + 1_000_000_000), &mut out);
    let mut after = Vec::new();
    let end = send(&mut e, &requests(rel, "after.jsonl"), stopped_ns + 1_000_000_000, &mut after);
    settle(&mut e, end, &mut after);
    (out, after)
}

fn calls(out: &[Decided]) -> Vec<&Verdict> {
    out.iter().filter_map(|d| if let Decided::Call(v) = d { Some(&**v) } else { None }).collect()
}

/// Each incident's transitions, by id, in order, and its retry count at the last one.
fn incidents(out: &[Decided]) -> BTreeMap<String, (Vec<Transition>, u64, IncidentState)> {
    let mut m: BTreeMap<String, (Vec<Transition>, u64, IncidentState)> = BTreeMap::new();
    for d in out {
        if let Decided::Incident(c) = d {
            let e = m.entry(c.row.id.clone()).or_insert_with(|| (Vec::new(), 0, c.row.state));
            e.0.push(c.transition);
            e.1 = c.row.retry_count;
            e.2 = c.row.state;
        }
    }
    m
}

/// What every release's fixture must meet after the upgrade to `store`: the same expectations for
/// each, none specific to one release (0.2.0's story is 0.1.0's, and it meets them as they are).
fn check(rel: &Release, store: &str, after: After, stopped_ns: u64) {
    let meta = meta(rel);
    let release = rel.name;
    let name = format!("{release} on {store}");
    assert_eq!(after.undecodable, 0, "{name}: every record {release} wrote is read");
    assert!(after.open_at_load >= 2, "{name}: {release}'s open incidents are loaded ({} open)", after.open_at_load);
    let (_, reference) = one_process(rel, stopped_ns);
    let ours = calls(&after.out);
    let theirs = calls(&reference);

    // The call in flight at the stop: one verdict, revising the one the release decided at shutdown.
    let pending: Vec<_> = ours.iter().filter(|v| hex::encode(v.trace_id) == meta.pending_trace).collect();
    assert_eq!(pending.len(), 1, "{name}: the pending call gets one verdict after the upgrade: {pending:#?}");
    let p = pending[0];
    assert_eq!(p.state, HealthState::ToolFailed, "{name}: its server span said a tool error");
    assert!(p.revision >= 1 && p.supersedes.is_some(), "{name}: a revision of the verdict {release} decided: {p:#?}");
    assert!(p.supersedes.is_some(), "{name}: a revision replaces the attempt {release} counted, it adds none");

    // The stale session's next call.
    let stale: Vec<_> = ours.iter().filter(|v| v.request_id.as_deref() == Some("205")).collect();
    assert_eq!(stale.len(), 1, "{name}: {stale:#?}");
    assert_eq!(stale[0].state, HealthState::StaleCatalog, "{name}: the stale session stays stale");

    // Every call of the after phase, as one process says it (the pending one aside: one process
    // joined it whole, not as a revision).
    let by_id = |vs: &[&Verdict]| -> BTreeMap<String, HealthState> {
        vs.iter()
            .filter(|v| hex::encode(v.trace_id) != meta.pending_trace)
            .filter_map(|v| Some((v.request_id.as_deref()?.to_string(), v.state)))
            .collect()
    };
    assert_eq!(by_id(&ours), by_id(&theirs), "{name}: the after phase's verdicts are one process's");

    // Incidents: the -32601 updates the one the release opened; what one process resolves is
    // resolved.
    let ours_inc = incidents(&after.out);
    let theirs_inc = incidents(&reference);
    let opened: Vec<_> = ours_inc.iter().filter(|(_, (t, _, _))| t.first() == Some(&Transition::Opened)).map(|(id, _)| id).collect();
    let theirs_opened: Vec<_> =
        theirs_inc.iter().filter(|(_, (t, _, _))| t.first() == Some(&Transition::Opened)).map(|(id, _)| id).collect();
    assert_eq!(opened, theirs_opened, "{name}: no incident {release} had open is opened again");
    let updated = ours_inc.values().find(|(t, n, _)| t.contains(&Transition::Updated) && *n == 2);
    assert!(updated.is_some(), "{name}: the next -32601 is `updated` with retry_count 2: {ours_inc:#?}");
    let fin = |m: &BTreeMap<String, (Vec<Transition>, u64, IncidentState)>| -> BTreeMap<String, (IncidentState, u64)> {
        m.iter().map(|(id, (_, n, s))| (id.clone(), (*s, *n))).collect()
    };
    assert_eq!(fin(&ours_inc), fin(&theirs_inc), "{name}: every incident ends as in one process");
    assert!(ours_inc.values().any(|(t, _, _)| t.contains(&Transition::Resolved)), "{name}: the healthy call resolves: {ours_inc:#?}");
}

/// Today's engine on the `state.redb` the release left in `storage.directory`.
fn on_a_directory(rel: &Release) {
    let dir = tempfile::tempdir().unwrap();
    let mut gz = flate2::read::GzDecoder::new(std::fs::File::open(format!("{}/state.redb.gz", rel.dir)).unwrap());
    let mut bytes = Vec::new();
    gz.read_to_end(&mut bytes).unwrap();
    std::fs::write(dir.path().join("state.redb"), bytes).unwrap();
    let store = StoreHandle::open_directory(dir.path()).unwrap();
    let stopped = meta(rel).redb_stopped_ns;
    check(rel, "storage.directory", after_upgrade(rel, store, stopped), stopped);
}

/// Write `redis.txt` into `r` as the release left it, without expiries. That includes 0.2.0's
/// announcement of its protocol (`mcp-health:protocols`): its expiry, in the value, is long past,
/// so today's first announcement removes it, as it removes a stopped instance's.
fn restore_redis(rel: &Release, r: &RedisServer) {
    let mut conn = r.conn();
    let text = std::fs::read_to_string(format!("{}/redis.txt", rel.dir)).unwrap();
    for line in text.lines().filter(|l| !l.is_empty()) {
        let mut parts = line.split(' ');
        let kind = parts.next().unwrap();
        let key = hex::decode(parts.next().unwrap()).unwrap();
        match kind {
            "hash" => {
                for f in parts {
                    let (field, value) = f.split_once('=').unwrap();
                    redis::cmd("HSET").arg(&key).arg(field).arg(hex::decode(value).unwrap()).query::<()>(&mut conn).unwrap();
                }
            }
            "string" => redis::cmd("SET").arg(&key).arg(hex::decode(parts.next().unwrap()).unwrap()).query::<()>(&mut conn).unwrap(),
            "set" => {
                for m in parts {
                    redis::cmd("SADD").arg(&key).arg(hex::decode(m).unwrap()).query::<()>(&mut conn).unwrap();
                }
            }
            other => panic!("unknown kind {other} in {}/redis.txt", rel.dir),
        }
    }
}

/// Today's engine on a Redis holding every key the release left (`test` names the skip).
fn on_redis(rel: &Release, test: &str) {
    if !available(test) {
        return;
    }
    let r = RedisServer::start();
    restore_redis(rel, &r);
    let settings = RedisSettings {
        endpoint: r.url(),
        timeout: Duration::from_secs(2),
        retry_after: Duration::from_millis(200),
        tombstone_ttl: Duration::from_secs(60),
        remember_for: Duration::from_secs(3600),
        record_life: Duration::from_secs(360),
    };
    let store = StoreHandle::open_redis(settings).unwrap();
    let stopped = meta(rel).redis_stopped_ns;
    check(rel, "redis", after_upgrade(rel, store, stopped), stopped);
    // The server's incident record, a hash the old release wrote, was read, compared-and-set and
    // rewritten in this build's layout: one string, its version then its bytes.
    let mut conn = r.conn();
    let keys: Vec<String> = redis::cmd("KEYS").arg("mcp-health:incidents:*").query(&mut conn).unwrap();
    assert!(!keys.is_empty(), "{}: no incident record", rel.name);
    for k in keys {
        let kind: String = redis::cmd("TYPE").arg(&k).query(&mut conn).unwrap();
        assert_eq!(kind, "string", "{}: {k} was not rewritten in this build's layout", rel.name);
    }
}

#[test]
fn an_upgrade_from_0_1_0_on_a_directory_keeps_everything() {
    on_a_directory(&V0_1_0);
}

#[test]
fn an_upgrade_from_0_1_0_on_redis_keeps_everything() {
    on_redis(&V0_1_0, "an_upgrade_from_0_1_0_on_redis_keeps_everything");
}

#[test]
fn an_upgrade_from_0_2_0_on_a_directory_keeps_everything() {
    on_a_directory(&V0_2_0);
}

#[test]
fn an_upgrade_from_0_2_0_on_redis_keeps_everything() {
    on_redis(&V0_2_0, "an_upgrade_from_0_2_0_on_redis_keeps_everything");
}
