//! The Redis store against a real `redis-server` of each test's own (loopback, temporary
//! directory): every table round trips; two stores writing one record give the loser a conflict
//! and leave the winner's record; a store that is down answers errors (counted by the engine),
//! never a panic or a stall; a Redis restart with persistence keeps every record and the store
//! reconnects, one without persistence makes the lost records conflicts, never silent re-creations;
//! a planted password never shows in an error.
//!
//! Each test prints `SKIPPED: …` and passes when `redis-server` is not installed, except under
//! `CI` (scripts/install-test-deps installs it there).

use std::time::{Duration, Instant};

use super::tests::{all_changes, check, check_bounded_load, incident, many_decided, session};
use super::*;

#[path = "../../tests/support/redis_server.rs"]
pub(super) mod redis_server;
use redis_server::{available, RedisServer};

fn settings(url: &str) -> RedisSettings {
    RedisSettings {
        endpoint: url.to_string(),
        timeout: Duration::from_millis(500),
        retry_after: Duration::from_millis(200),
        tombstone_ttl: Duration::from_secs(60),
        remember_for: Duration::from_secs(3600),
        record_life: Duration::from_secs(360),
    }
}

/// An engine's configuration on the test's Redis: chains decided 10 ms after their last span.
fn engine_config(r: &RedisServer) -> crate::engine::EngineConfig {
    use crate::correlate::{ChainLimits, SessionLimits};
    let chains =
        ChainLimits { decision_wait: Duration::from_millis(10), server_half_wait: Duration::from_secs(2), ..ChainLimits::default() };
    let mut cfg = crate::engine::EngineConfig::new(chains, SessionLimits::default());
    cfg.store = Some(StoreHandle::open_redis(settings(&r.url())).unwrap());
    cfg
}

/// A store that has heard the cluster's protocol, as an engine's has before its first write (an
/// announcement of a millisecond: it leaves no trace for the test's other stores).
fn open(r: &RedisServer) -> RedisStore {
    let mut s = unheard(r);
    s.announce(Duration::from_millis(1)).expect("announce");
    s
}

/// A store that has not announced yet.
fn unheard(r: &RedisServer) -> RedisStore {
    RedisStore::open(settings(&r.url())).expect("open the redis store")
}

fn one_incident(calls: u64) -> Changes {
    let mut inc = incident();
    inc.calls = calls;
    let mut c = Changes::default();
    let part = ServerIncidents { server: inc.cause.server.clone(), open: vec![inc], recent: vec![], resolved: vec![] };
    c.put(incident_key(), Record::Incidents(Box::new(part)));
    c
}

/// The key of the test incident's server record.
fn incident_key() -> String {
    server_key(incident().cause.server.as_deref())
}

#[test]
fn redis_every_table_round_trips_through_a_second_store() {
    if !available("redis_every_table_round_trips_through_a_second_store") {
        return;
    }
    let r = RedisServer::start();
    let mut a = open(&r);
    assert!(a.load().unwrap().is_empty());
    a.apply(&all_changes()).unwrap();
    check(&a.load().unwrap());
    // Another instance (another store on the same Redis) finds the same records.
    let mut b = open(&r);
    check(&b.load().unwrap());
    // The layout: one string per record under mcp-health:<table>:<key>, its version, `:`, its
    // bytes.
    let mut conn = r.conn();
    let raw: Vec<u8> = ::redis::cmd("GET").arg("mcp-health:operations:op-1").query(&mut conn).unwrap();
    let v = raw.strip_prefix(b"1:").expect("version 1, then the bytes");
    assert_eq!(Record::decode(Table::Operations, "op-1", v).unwrap().table(), Table::Operations);
    // `get` by table and key.
    assert!(matches!(b.get(Table::Operations, "op-1").unwrap(), Some(Record::Operation(t)) if t == [3; 16]));
    assert!(b.get(Table::Decided, "nope").unwrap().is_none());
    // Deletes remove them (b read them all, so its versions are current).
    let mut del = Changes::default();
    for c in all_changes().changes {
        del.delete(c.table, c.key);
    }
    b.apply(&del).unwrap();
    assert!(open(&r).load().unwrap().is_empty());
    // What is left: the version counter, one tombstone per record (a version, no bytes, a TTL)
    // and the index sets of the counted tables (sessions, incidents).
    let mut keys: Vec<String> = ::redis::cmd("KEYS").arg("mcp-health:*").query(&mut conn).unwrap();
    // The last store opened announced itself for a millisecond: its announcement may be there.
    keys.retain(|k| k != "mcp-health:protocols");
    keys.sort();
    let (index, records): (Vec<&String>, Vec<&String>) = keys.iter().partition(|k| k.starts_with("mcp-health:index:"));
    assert_eq!(index, ["mcp-health:index:incidents", "mcp-health:index:sessions"], "{keys:?}");
    assert_eq!(records.len(), all_changes().len() + 1, "{keys:?}");
    let (v, ttl): (Vec<u8>, i64) = ::redis::pipe()
        .cmd("GET")
        .arg("mcp-health:operations:op-1")
        .cmd("PTTL")
        .arg("mcp-health:operations:op-1")
        .query(&mut conn)
        .unwrap();
    assert!(
        !v.is_empty() && v.iter().all(u8::is_ascii_digit) && v != b"1" && ttl > 0 && ttl <= 60_000,
        "a later version, no bytes: {v:?} {ttl}"
    );
    // The deleter may write the record again on top of its own tombstone.
    let mut again = Changes::default();
    again.put("op-1".into(), Record::Operation([5; 16]));
    b.apply(&again).unwrap();
    let ttl: i64 = ::redis::cmd("PTTL").arg("mcp-health:operations:op-1").query(&mut conn).unwrap();
    assert!(ttl > 60_000, "a live record lives its record_life, not its tombstone's: {ttl}");
    let st = b.stats().unwrap();
    assert!(st.round_trips >= 3 && st.bytes_sent > 0 && st.bytes_received > 0 && st.conflicts == 0, "{st:?}");
}

/// The gauges' count (`scan` of sessions and incidents) reads those tables' index sets, never a
/// `SCAN` of the keyspace (which holds every decided chain); records written before the index
/// existed are indexed by the next `load`; a member whose record expired leaves the index.
#[test]
fn redis_the_counted_tables_are_read_by_their_index_not_by_scanning_every_key() {
    if !available("redis_the_counted_tables_are_read_by_their_index_not_by_scanning_every_key") {
        return;
    }
    let r = RedisServer::start();
    let mut a = open(&r);
    a.apply(&all_changes()).unwrap();
    let mut conn = r.conn();
    let scans = |conn: &mut ::redis::Connection| -> u64 {
        let info: String = ::redis::cmd("INFO").arg("commandstats").query(conn).unwrap();
        info.lines().find_map(|l| l.strip_prefix("cmdstat_scan:calls=")).and_then(|v| v.split(',').next()?.parse().ok()).unwrap_or(0)
    };
    let want_sessions = a.scan(Table::Sessions).unwrap().len();
    let want_incidents = a.scan(Table::Incidents).unwrap().len();
    assert!(want_sessions > 0 && want_incidents > 0, "all_changes writes both tables");
    let before = scans(&mut conn);
    for _ in 0..3 {
        assert_eq!(a.scan(Table::Sessions).unwrap().len(), want_sessions);
        assert_eq!(a.scan(Table::Incidents).unwrap().len(), want_incidents);
    }
    assert_eq!(scans(&mut conn), before, "no SCAN for a count");
    // An older version's records: no index. The next load indexes them.
    let _: () = ::redis::cmd("DEL").arg("mcp-health:index:sessions").arg("mcp-health:index:incidents").query(&mut conn).unwrap();
    let mut b = open(&r);
    assert_eq!(b.scan(Table::Sessions).unwrap().len(), 0, "without the index a count sees nothing");
    check(&b.load().unwrap());
    assert_eq!(b.scan(Table::Sessions).unwrap().len(), want_sessions);
    assert_eq!(b.scan(Table::Incidents).unwrap().len(), want_incidents);
    // A member whose record is gone (expired) is dropped from the index by the count.
    let _: () = ::redis::cmd("SADD").arg("mcp-health:index:sessions").arg("mcp-health:sessions:expired-one").query(&mut conn).unwrap();
    assert_eq!(b.scan(Table::Sessions).unwrap().len(), want_sessions);
    let member: bool =
        ::redis::cmd("SISMEMBER").arg("mcp-health:index:sessions").arg("mcp-health:sessions:expired-one").query(&mut conn).unwrap();
    assert!(!member, "the expired member left the index");
}

/// How many times Redis ran `cmd` (a script's `redis.call`s included).
fn calls_of(conn: &mut ::redis::Connection, cmd: &str) -> u64 {
    let info: String = ::redis::cmd("INFO").arg("commandstats").query(conn).unwrap();
    let prefix = format!("cmdstat_{cmd}:calls=");
    info.lines().find_map(|l| l.strip_prefix(prefix.as_str())).and_then(|v| v.split(',').next()?.parse().ok()).unwrap_or(0)
}

/// A record joins its table's index when it is created; rewriting it (every session, every
/// round) does not `SADD` again, and it stays counted. While the cluster speaks protocol 0 (a
/// 0.1.0 instance, which indexes nothing, shares the store) every write joins the index, so
/// what such an instance created is counted once this one writes it. An apply after Redis lost
/// its scripts loads the script again.
#[test]
fn redis_a_record_joins_its_index_when_created_not_at_every_rewrite() {
    if !available("redis_a_record_joins_its_index_when_created_not_at_every_rewrite") {
        return;
    }
    let r = RedisServer::start();
    let mut conn = r.conn();
    let mut a = open(&r);
    a.load().unwrap();
    let session = |n: u64| {
        let mut c = Changes::default();
        let mut rec = match all_changes().changes.into_iter().find(|c| c.table == Table::Sessions).and_then(|c| c.value) {
            Some(Record::Session(s)) => s,
            _ => unreachable!("all_changes writes a session"),
        };
        rec.last_seen_ns = n;
        c.put("session:s".into(), Record::Session(rec));
        c
    };
    a.apply(&session(1)).unwrap();
    let added = calls_of(&mut conn, "sadd");
    assert_eq!(added, 1, "created: indexed");
    for n in 2..5 {
        a.apply(&session(n)).unwrap();
    }
    assert_eq!(calls_of(&mut conn, "sadd"), added, "rewrites add nothing to the index");
    assert_eq!(a.scan(Table::Sessions).unwrap().len(), 1, "and the record is counted");
    // A 0.1.0 instance's record (no index): joined at this instance's next write while the
    // cluster speaks protocol 0.
    let _: () = ::redis::cmd("DEL").arg("mcp-health:index:sessions").query(&mut conn).unwrap();
    assert_eq!(a.scan(Table::Sessions).unwrap().len(), 0);
    a.speak(0);
    a.apply(&session(6)).unwrap();
    assert_eq!(a.scan(Table::Sessions).unwrap().len(), 1, "indexed again by a protocol-0 write");
    // Redis forgot its scripts (a restart): the apply loads it again and writes.
    let _: () = ::redis::cmd("SCRIPT").arg("FLUSH").query(&mut conn).unwrap();
    a.apply(&session(7)).unwrap();
    match a.get(Table::Sessions, "session:s").unwrap() {
        Some(Record::Session(s)) => assert_eq!(s.last_seen_ns, 7),
        other => panic!("{other:?}"),
    }
}

#[test]
fn redis_two_stores_writing_one_record_the_loser_gets_a_conflict_and_writes_nothing() {
    if !available("redis_two_stores_writing_one_record_the_loser_gets_a_conflict_and_writes_nothing") {
        return;
    }
    let r = RedisServer::start();
    let (mut a, mut b) = (open(&r), open(&r));
    a.load().unwrap();
    b.load().unwrap();
    // Both saw no such incident; a creates it first.
    a.apply(&one_incident(1)).unwrap();
    // b's transaction names the same incident and another record: the incident is refused, the
    // other record (which nobody else wrote) goes through.
    let mut bc = one_incident(7);
    bc.put("op-b".into(), Record::Operation([7; 16]));
    match b.apply(&bc) {
        Err(StoreError::Conflict { table, key, refused }) => {
            assert_eq!((table, key.as_str()), ("incidents", incident_key().as_str()));
            assert_eq!(refused, vec![(Table::Incidents, incident_key())], "only the incident record is refused");
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
    let snap = open(&r).load().unwrap();
    assert_eq!(
        snap.incidents.iter().flat_map(|p| p.open.iter().map(|i| i.calls)).collect::<Vec<_>>(),
        vec![1],
        "the winner's record stays"
    );
    assert_eq!(snap.operations, vec![("op-b".to_string(), [7; 16])], "b's record nobody else wrote is written");
    // b goes on writing records of its own on top of what it wrote.
    let mut again = Changes::default();
    again.put("op-b".into(), Record::Operation([8; 16]));
    b.apply(&again).unwrap();
    // The loser stays refused for that record (it never overwrites what it did not see) ...
    assert!(matches!(b.apply(&one_incident(8)), Err(StoreError::Conflict { .. })));
    assert_eq!(b.stats().unwrap().conflicts, 2);
    // ... while the winner goes on updating it, and a delete by the winner makes a later write by
    // the loser a conflict as well (no resurrection).
    a.apply(&one_incident(2)).unwrap();
    let mut del = Changes::default();
    del.delete(Table::Incidents, incident_key());
    a.apply(&del).unwrap();
    assert!(matches!(b.apply(&one_incident(9)), Err(StoreError::Conflict { .. })));
    assert!(open(&r).load().unwrap().incidents.is_empty());
    // Once the loser reads the record again, it may write on top of what it read.
    a.apply(&one_incident(3)).unwrap();
    assert!(b.get(Table::Incidents, &incident_key()).unwrap().is_some());
    b.apply(&one_incident(4)).unwrap();
    assert!(matches!(a.apply(&one_incident(5)), Err(StoreError::Conflict { .. })), "now a is behind");

    // Two instances racing on one fresh key from threads: exactly one wins each round.
    for round in 0..20u8 {
        let key = format!("race-{round}");
        let url = r.url();
        let results: Vec<bool> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2u8)
                .map(|n| {
                    let (url, key) = (url.clone(), key.clone());
                    s.spawn(move || {
                        let mut st = RedisStore::open(settings(&url)).unwrap();
                        let mut c = Changes::default();
                        c.put(key, Record::Operation([n; 16]));
                        match st.apply(&c) {
                            Ok(()) => true,
                            Err(StoreError::Conflict { .. }) => false,
                            Err(e) => panic!("{e}"),
                        }
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(results.iter().filter(|w| **w).count(), 1, "round {round}: {results:?}");
    }
}

#[test]
fn redis_down_is_an_error_never_a_panic_or_a_stall_and_the_engine_counts_it() {
    if !available("redis_down_is_an_error_never_a_panic_or_a_stall_and_the_engine_counts_it") {
        return;
    }
    let mut r = RedisServer::start_with(false, Some("planted-pw-81"));
    let mut st = open(&r);
    st.apply(&one_incident(1)).unwrap();
    r.kill();
    let t0 = Instant::now();
    for _ in 0..50 {
        let e = st.apply(&one_incident(2)).unwrap_err();
        assert!(matches!(e, StoreError::Backend(_)), "{e}");
        assert!(!e.to_string().contains("planted-pw-81"), "{e}");
        assert!(st.load().is_err() && st.get(Table::Incidents, "x").is_err());
    }
    // Held off for retry_after after the first failure: 150 calls cost far less than 150 timeouts.
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    // Opening against a Redis that is down is an error at start, named without the password.
    let e = RedisStore::open(settings(&r.url())).err().expect("open must fail").to_string();
    assert!(e.contains("redis://:***@127.0.0.1") && !e.contains("planted-pw-81"), "{e}");
    // A wrong password as well.
    r.restart();
    let wrong = format!("redis://:wrong-planted-pw@127.0.0.1:{}", r.port);
    let e = RedisStore::open(settings(&wrong)).err().expect("wrong password must fail").to_string();
    assert!(!e.contains("wrong-planted-pw") && !e.contains("planted-pw-81"), "{e}");

    // The engine on a store that goes down: verdicts still come, store errors are counted.
    use crate::correlate::{ChainLimits, SessionLimits};
    use crate::engine::{Decided, Engine, EngineConfig};
    use crate::evidence::time::Moment;
    use crate::evidence::{Method, Side, SpanEvidence};
    let store = StoreHandle::open_redis(settings(&r.url())).unwrap();
    let mut cfg =
        EngineConfig::new(ChainLimits { decision_wait: Duration::from_millis(10), ..ChainLimits::default() }, SessionLimits::default());
    cfg.store = Some(store);
    let mut engine = Engine::new(cfg);
    r.kill();
    let mut out = Vec::new();
    for n in 0..5u8 {
        let mut s = SpanEvidence::new([n + 1; 16], [1; 8]);
        s.method = Some(Method::ToolsCall);
        s.side = Side::Client;
        s.tool = Some(Arc::from("t"));
        s.server = Some(Arc::from("srv:1"));
        s.request_id = Some("1".into());
        s.start_ns = 1_000 + u64::from(n);
        s.end_ns = 2_000;
        let now = Moment::from_nanos(1_000_000_000) + Duration::from_millis(200 * u64::from(n));
        engine.ingest(crate::normalize::NormalizedBatch { evidence: vec![s], ..Default::default() }, now, &mut out);
        engine.tick(now + Duration::from_millis(50), &mut out);
    }
    // A shared store down: once it is known down (its first failed write, after the first
    // call's decision), the calls wait for it (their sessions' evidence from other instances is
    // there), up to the hold ...
    assert_eq!(out.iter().filter(|d| matches!(d, Decided::Call(_))).count(), 1, "held while the store is known down");
    // ... past which they are decided without it, partial.
    engine.tick(Moment::from_nanos(1_000_000_000) + Duration::from_secs(7), &mut out);
    engine.drain(crate::verdict::DecidedBy::Shutdown, Moment::from_nanos(9_000_000_000), &mut out);
    let calls = out.iter().filter(|d| matches!(d, Decided::Call(_))).count();
    assert_eq!(calls, 5, "every call still gets its verdict");
    let capped =
        out.iter().filter(|d| matches!(d, Decided::Call(v) if v.partial == Some(crate::verdict::Partial::StoreUnavailable))).count();
    assert!(capped >= 4, "calls decided while the store is known down are partial: {capped}");
    assert!(engine.store_down());
    // Redis is back and nothing is written: the next re-evaluation's probe ends the mark.
    r.restart();
    std::thread::sleep(Duration::from_millis(250)); // past retry_after
    let mut out = Vec::new();
    engine.tick(Moment::from_nanos(10_000_000_000), &mut out);
    assert!(!engine.store_down(), "the store answers again");
    assert!(engine.store_errors() >= 1 && engine.gauges().store_errors == engine.store_errors(), "{}", engine.store_errors());
}

#[test]
fn redis_restart_with_persistence_keeps_every_record_and_the_store_reconnects() {
    if !available("redis_restart_with_persistence_keeps_every_record_and_the_store_reconnects") {
        return;
    }
    let mut r = RedisServer::start_with(true, None);
    let mut st = open(&r);
    st.apply(&all_changes()).unwrap();
    r.restart();
    // The first call after the restart may find the old connection dead; within retry_after and a
    // few attempts, writes go through again.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut errors = 0;
    loop {
        match st.apply(&one_incident(5)) {
            Ok(()) => break,
            Err(StoreError::Backend(_)) if Instant::now() < deadline => {
                errors += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("after {errors} errors: {e}"),
        }
    }
    let snap = open(&r).load().unwrap();
    assert_eq!(snap.incidents.iter().flat_map(|p| p.open.iter().map(|i| i.calls)).collect::<Vec<_>>(), vec![5]);
    assert_eq!((snap.sessions.len(), snap.decided.len(), snap.operations.len(), snap.drift_reported.len()), (1, 1, 1, 1));
    println!("errors before the store reconnected after a Redis restart: {errors}");
}

#[test]
fn redis_restart_without_persistence_makes_lost_records_conflicts_not_silent_recreations() {
    if !available("redis_restart_without_persistence_makes_lost_records_conflicts_not_silent_recreations") {
        return;
    }
    let mut r = RedisServer::start();
    let mut st = open(&r);
    st.apply(&one_incident(1)).unwrap();
    r.restart();
    let deadline = Instant::now() + Duration::from_secs(5);
    let e = loop {
        match st.apply(&one_incident(2)) {
            Err(StoreError::Backend(_)) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            other => break other,
        }
    };
    assert!(matches!(e, Err(StoreError::Conflict { table: "incidents", .. })), "{e:?}");
    // A record this store never had is written as usual.
    let mut c = Changes::default();
    c.put("op-new".into(), Record::Operation([1; 16]));
    st.apply(&c).unwrap();
    assert_eq!(open(&r).load().unwrap().operations.len(), 1);
}

/// Two engines on one Redis, each seeing a refusal of the same server and tool: one incident (the
/// same cause, the same id) with both retries, `opened` by exactly one engine and `updated` by the
/// other; a healthy call of its scope on either engine resolves it, `resolved` by that engine
/// only; both engines' decided chains are written.
#[test]
fn redis_two_engines_one_shared_incident_one_emitter_per_transition() {
    if !available("redis_two_engines_one_shared_incident_one_emitter_per_transition") {
        return;
    }
    use crate::classify::incidents::Transition;
    use crate::engine::{Decided, Engine};
    use crate::evidence::time::Moment;
    use crate::evidence::{Method, OutcomeReceipt, OutcomeResult, Side, SpanEvidence, TransportOutcome, VerifierMethod};
    let r = RedisServer::start();
    let engine = || Engine::new(engine_config(&r));
    let (mut a, mut b) = (engine(), engine());
    let call = |n: u8, start: u64| {
        let mut s = SpanEvidence::new([n; 16], [1; 8]);
        s.method = Some(Method::ToolsCall);
        s.side = Side::Client;
        s.tool = Some(Arc::from("t"));
        s.server = Some(Arc::from("srv:1"));
        s.request_id = Some("1".into());
        s.start_ns = start;
        s.end_ns = start + 1_000;
        s
    };
    let refused = |n: u8, start: u64| {
        let mut s = call(n, start);
        s.transport = Some(TransportOutcome::ConnectionRefused);
        s
    };
    let transitions = |out: &[Decided]| -> Vec<Transition> {
        out.iter().filter_map(|d| if let Decided::Incident(i) = d { Some(i.transition) } else { None }).collect()
    };
    let t = Moment::from_nanos(1_000_000_000);
    let step = |e: &mut Engine, spans: Vec<SpanEvidence>, at: Moment| {
        let mut out = Vec::new();
        e.ingest(crate::normalize::NormalizedBatch { evidence: spans, ..Default::default() }, at, &mut out);
        e.tick(at + Duration::from_millis(50), &mut out);
        e.flush_store(at + Duration::from_millis(60), &mut out);
        out
    };
    let out_a = step(&mut a, vec![refused(1, 1_000)], t);
    let out_b = step(&mut b, vec![refused(2, 2_000)], t);
    assert_eq!((transitions(&out_a), transitions(&out_b)), (vec![Transition::Opened], vec![Transition::Updated]), "one `opened`");
    assert_eq!((a.store_errors(), b.store_errors()), (0, 0));
    let snap = open(&r).load().unwrap();
    assert_eq!(snap.incidents.len(), 1);
    let inc = &snap.incidents[0].open[0];
    assert_eq!((inc.calls, inc.retry_count), (2, 2), "both engines' failures are in the one incident");
    let mut traces: Vec<_> = snap.decided.iter().map(|d| d.trace_id[0]).collect();
    traces.sort();
    assert_eq!(traces, vec![1, 2], "both engines' decided chains are written");

    // The global gauges: a took the gauge lease at its first re-evaluation, so a reports the one
    // open incident (counted in the store, both engines' part) and b reports none: the sum over
    // instances is one.
    let open_sum = |e: &Engine| e.gauges().incidents_open.values().sum::<u64>();
    let mut out = Vec::new();
    a.tick(t + Duration::from_secs(11), &mut out);
    b.tick(t + Duration::from_secs(11), &mut out);
    assert_eq!((a.gauges().gauge_leader, b.gauges().gauge_leader), (true, false));
    assert_eq!((open_sum(&a), open_sum(&b)), (1, 0), "one open incident across instances");
    // The lease gone (a stopped: here, its key deleted), the next instance to look takes it.
    let _: () = ::redis::cmd("DEL").arg("mcp-health:lease:gauges").query(&mut r.conn()).unwrap();
    b.tick(t + Duration::from_secs(12), &mut out);
    a.tick(t + Duration::from_secs(12), &mut out);
    assert_eq!((a.gauges().gauge_leader, b.gauges().gauge_leader), (false, true));
    assert_eq!((open_sum(&a), open_sum(&b)), (0, 1));
    assert!(transitions(&out).is_empty(), "ticks emit no transition of their own");

    // A healthy call of the same scope, later, on a: resolved once, by a.
    let ok = call(3, 5_000);
    let mut receipt = SpanEvidence::new([3; 16], [4; 8]);
    receipt.parent_span_id = Some([1; 8]);
    receipt.outcomes.push(OutcomeReceipt {
        result: OutcomeResult::Confirmed,
        method: VerifierMethod::Receipt,
        checked_at_ns: 6_500,
        request_id: None,
        trust: Default::default(),
    });
    let out_a = step(&mut a, vec![ok, receipt], t + Duration::from_secs(13));
    let states: Vec<_> = out_a.iter().filter_map(|d| if let Decided::Call(v) = d { Some(v.state) } else { None }).collect();
    assert_eq!(states, vec![crate::verdict::HealthState::Healthy]);
    assert_eq!(transitions(&out_a), vec![Transition::Resolved]);
    assert!(open(&r).load().unwrap().incidents.iter().all(|p| p.open.is_empty()), "no open incident left in the store");
    // A failure that ended before that healthy call, decided later on b: one more failure of
    // the resolved incident (as one process folds it), never a new open one.
    let out_b = step(&mut b, vec![refused(4, 3_000)], t + Duration::from_secs(14));
    assert_eq!(transitions(&out_b), vec![Transition::Updated]);
    let last = out_b.iter().find_map(|d| if let Decided::Incident(i) = d { Some(i.row.clone()) } else { None }).unwrap();
    assert_eq!((last.retry_count, last.state), (3, crate::classify::incidents::IncidentState::Resolved));
    assert!(open(&r).load().unwrap().incidents.iter().all(|p| p.open.is_empty()));
}

/// A client's `tools/call` of trace 7 (span 1) on `srv:1`, for the receipt tests.
fn receipt_call() -> crate::evidence::SpanEvidence {
    use crate::evidence::{Method, Side, SpanEvidence};
    let mut call = SpanEvidence::new([7; 16], [1; 8]);
    call.method = Some(Method::ToolsCall);
    call.side = Side::Client;
    call.tool = Some(Arc::from("t"));
    call.server = Some(Arc::from("srv:1"));
    call.request_id = Some("1".into());
    call.start_ns = 1_000;
    call.end_ns = 2_000;
    call
}

/// A receipt (span `span`, under [`receipt_call`]) saying the call's outcome is missing.
fn missing_receipt(span: u8) -> crate::evidence::SpanEvidence {
    use crate::evidence::{OutcomeReceipt, OutcomeResult, SpanEvidence, VerifierMethod};
    let mut receipt = SpanEvidence::new([7; 16], [span; 8]);
    receipt.parent_span_id = Some([1; 8]);
    receipt.outcomes.push(OutcomeReceipt {
        result: OutcomeResult::Missing,
        method: VerifierMethod::Receipt,
        checked_at_ns: 3_000,
        request_id: None,
        trust: Default::default(),
    });
    receipt
}

/// A ring change between a call and its receipt: the call decided (and written) by one engine,
/// its `missing` receipt routed to another engine on the same Redis, which takes the decided
/// chain from the store and revises it to `false_success` (one process's verdict), never leaving
/// the call at the greener `unverified`.
#[test]
fn redis_a_receipt_on_another_engine_revises_the_call_through_the_store() {
    if !available("redis_a_receipt_on_another_engine_revises_the_call_through_the_store") {
        return;
    }
    use crate::engine::{Decided, Engine};
    use crate::evidence::time::Moment;
    use crate::verdict::HealthState;
    let r = RedisServer::start();
    let engine = || Engine::new(engine_config(&r));
    let (mut a, mut b) = (engine(), engine());
    let (call, receipt) = (receipt_call(), missing_receipt(2));
    let t = Moment::from_nanos(1_000_000_000);
    let (mut out_a, mut out_b) = (Vec::new(), Vec::new());
    a.ingest(crate::normalize::NormalizedBatch { evidence: vec![call], ..Default::default() }, t, &mut out_a);
    a.tick(t + Duration::from_millis(50), &mut out_a);
    a.flush_store(t + Duration::from_millis(60), &mut Vec::new());
    b.ingest(
        crate::normalize::NormalizedBatch { evidence: vec![receipt], ..Default::default() },
        t + Duration::from_millis(100),
        &mut out_b,
    );
    b.tick(t + Duration::from_millis(200), &mut out_b);
    b.flush_store(t + Duration::from_millis(210), &mut Vec::new());
    let states = |out: &[Decided]| -> Vec<(u32, HealthState)> {
        out.iter().filter_map(|d| if let Decided::Call(v) = d { Some((v.revision, v.state)) } else { None }).collect()
    };
    assert_eq!(states(&out_a), vec![(0, HealthState::Unverified)]);
    assert_eq!(states(&out_b), vec![(1, HealthState::FalseSuccess)], "revised where the receipt landed");
    assert_eq!((b.taken_over(), b.store_errors()), (1, 0));
    // The revision is what the store holds now.
    let snap = open(&r).load().unwrap();
    assert_eq!(snap.decided.iter().map(|d| (d.revision, d.spans.len())).collect::<Vec<_>>(), vec![(1, 2)]);
}

/// Two engines revise one decided call at once: a late server span reaches the engine that
/// decided it, the call's `missing` receipt reaches another, which takes the chain from the
/// store. Both write revision 1; the second write is refused. The refused engine reads the
/// other's revision and takes the spans it lacks as late spans: its revision 2 holds the late
/// span and the receipt, `false_success` as one process says — not its own `unverified`, which
/// would otherwise stand beside the other's.
#[test]
fn redis_two_engines_revising_one_call_at_once_end_with_a_revision_of_both() {
    if !available("redis_two_engines_revising_one_call_at_once_end_with_a_revision_of_both") {
        return;
    }
    use crate::engine::{Decided, Engine};
    use crate::evidence::time::Moment;
    use crate::evidence::{Method, Side, SpanEvidence};
    use crate::verdict::HealthState;
    let r = RedisServer::start();
    let engine = || Engine::new(engine_config(&r));
    let (mut a, mut b) = (engine(), engine());
    let mut server = SpanEvidence::new([7; 16], [3; 8]);
    server.parent_span_id = Some([1; 8]);
    server.method = Some(Method::ToolsCall);
    server.side = Side::Server;
    server.tool = Some(Arc::from("t"));
    server.request_id = Some("1".into());
    server.start_ns = 1_100;
    server.end_ns = 1_900;
    let batch = |s: SpanEvidence| crate::normalize::NormalizedBatch { evidence: vec![s], ..Default::default() };
    let t = Moment::from_nanos(1_000_000_000);
    let ms = Duration::from_millis;
    let (mut out_a, mut out_b) = (Vec::new(), Vec::new());
    a.ingest(batch(receipt_call()), t, &mut out_a);
    a.tick(t + ms(50), &mut out_a);
    a.flush_store(t + ms(60), &mut Vec::new());
    a.ingest(batch(server), t + ms(100), &mut out_a);
    b.ingest(batch(missing_receipt(2)), t + ms(100), &mut out_b);
    b.tick(t + ms(200), &mut out_b);
    b.flush_store(t + ms(210), &mut Vec::new());
    a.tick(t + ms(200), &mut out_a);
    a.flush_store(t + ms(210), &mut Vec::new());
    a.tick(t + ms(300), &mut out_a);
    a.tick(t + ms(400), &mut out_a);
    a.flush_store(t + ms(410), &mut Vec::new());
    let states = |out: &[Decided]| -> Vec<(u32, HealthState)> {
        out.iter().filter_map(|d| if let Decided::Call(v) = d { Some((v.revision, v.state)) } else { None }).collect()
    };
    assert_eq!(states(&out_b), vec![(1, HealthState::FalseSuccess)], "revised where the receipt landed");
    assert_eq!(
        states(&out_a),
        vec![(0, HealthState::Unverified), (1, HealthState::Unverified), (2, HealthState::FalseSuccess)],
        "the refused revision is followed by one of both"
    );
    let snap = open(&r).load().unwrap();
    assert_eq!(snap.decided.iter().map(|d| (d.revision, d.spans.len())).collect::<Vec<_>>(), vec![(2, 3)], "the store holds it");
}

/// The same receipt after the call's late-span window (on the engine that decided it: its
/// chain is forgotten; its record stays in Redis until its lifetime ends, the writer's delete
/// left to it): neither engine takes the chain from the store, so the receipt is late and the
/// verdict stands, as in one process — whether the record is there decides nothing.
#[test]
fn redis_a_receipt_after_the_window_does_not_revise_a_call_the_store_still_holds() {
    if !available("redis_a_receipt_after_the_window_does_not_revise_a_call_the_store_still_holds") {
        return;
    }
    use crate::engine::{Decided, Engine};
    use crate::evidence::time::Moment;
    let r = RedisServer::start();
    let engine = || Engine::new(engine_config(&r));
    let (mut a, mut b) = (engine(), engine());
    let window = crate::correlate::ChainLimits::default().late_span_window;
    let t = Moment::from_nanos(1_000_000_000);
    let mut out = Vec::new();
    a.ingest(crate::normalize::NormalizedBatch { evidence: vec![receipt_call()], ..Default::default() }, t, &mut out);
    a.tick(t + Duration::from_millis(50), &mut out);
    a.flush_store(t + Duration::from_millis(60), &mut Vec::new());
    let late = t + window + Duration::from_secs(1);
    a.tick(late, &mut out);
    a.flush_store(late, &mut Vec::new());
    assert!(open(&r).get(Table::Decided, &trace_key(&[7; 16])).unwrap().is_some(), "the record outlives its writer's window");
    let st = a.gauges().store.expect("a network store's figures");
    assert!(st.deletes_left_to_expire == 1 && st.round_trips > 0 && st.bytes_sent > 0, "{st:?}");
    b.tick(late, &mut Vec::new());
    for (e, span) in [(&mut a, 2), (&mut b, 3)] {
        let mut got = Vec::new();
        e.ingest(crate::normalize::NormalizedBatch { evidence: vec![missing_receipt(span)], ..Default::default() }, late, &mut got);
        e.tick(late + Duration::from_millis(200), &mut got);
        e.flush_store(late + Duration::from_millis(210), &mut Vec::new());
        assert!(!got.iter().any(|d| matches!(d, Decided::Call(_))), "no revision past the window: {got:?}");
        assert_eq!((e.taken_over(), e.store_errors()), (0, 0));
    }
}

/// A session's catalog evidence on one engine (capability, a complete page, the install, then a
/// list-change signal: stale), a tool call of that session on another engine on the same Redis:
/// the second reads the session from the store before judging the call, so the call is
/// `stale_catalog` as in one process, not the greener `unverified` of an engine that never saw
/// the signal.
#[test]
fn redis_a_call_is_judged_with_its_session_as_other_engines_wrote_it() {
    if !available("redis_a_call_is_judged_with_its_session_as_other_engines_wrote_it") {
        return;
    }
    judged_with_its_session(Duration::ZERO);
}

/// The same with the store's answers taken when they come, as the service takes them
/// (`store_answer_within`): the round trips run on the store's thread, the call is classified
/// at a later step than it was decided, and the verdict is the same.
#[test]
fn redis_answers_taken_when_they_come_give_the_same_verdict() {
    if !available("redis_answers_taken_when_they_come_give_the_same_verdict") {
        return;
    }
    judged_with_its_session(crate::engine::SHARED_STORE_ANSWER_WITHIN);
}

fn judged_with_its_session(answer_within: Duration) {
    use crate::correlate::{ChainLimits, SessionLimits};
    use crate::engine::{Decided, Engine, EngineConfig};
    use crate::evidence::catalog::{CatalogFacts, ListPage, SignalSource};
    use crate::evidence::time::Moment;
    use crate::evidence::{Method, Side, SpanEvidence};
    use crate::verdict::HealthState;
    let r = RedisServer::start();
    let engine = || {
        let mut cfg = engine_config(&r);
        cfg.store_answer_within = answer_within;
        Engine::new(cfg)
    };
    let fact = |n: u8, at: u64, f: CatalogFacts| {
        let mut s = SpanEvidence::new([9; 16], [n; 8]);
        s.session_id = Some("s-1".into());
        s.side = Side::Client;
        s.server = Some(Arc::from("srv:1"));
        s.start_ns = at;
        s.end_ns = at;
        s.catalog = Some(Box::new(f));
        s
    };
    let page = ListPage {
        cursor: None,
        next_cursor_present: false,
        tools: vec![(Arc::from("t"), Arc::from("sha256:aa"))],
        ttl_ms: None,
        cache_scope: None,
    };
    let installed = crate::classify::digest::registry_digest(&[crate::classify::digest::ToolDigest {
        name: "t".into(),
        digest: "sha256:aa".into(),
        projection_version: crate::classify::digest::PROJECTION_VERSION.into(),
    }]);
    let mut listed = fact(2, 10, CatalogFacts { page: Some(page), ..Default::default() });
    listed.method = Some(Method::ToolsList);
    let session = vec![
        fact(1, 1, CatalogFacts { list_changed_capability: Some(true), ..Default::default() }),
        listed,
        fact(3, 11, CatalogFacts { installed_digest: Some(Arc::from(installed.as_str())), ..Default::default() }),
        fact(4, 20, CatalogFacts { signal: Some(SignalSource::Notification), ..Default::default() }),
    ];
    let mut call = SpanEvidence::new([5; 16], [1; 8]);
    call.method = Some(Method::ToolsCall);
    call.side = Side::Client;
    call.tool = Some(Arc::from("t"));
    call.server = Some(Arc::from("srv:1"));
    call.session_id = Some("s-1".into());
    call.request_id = Some("7".into());
    call.start_ns = 30;
    call.end_ns = 40;
    let t = Moment::from_nanos(1_000_000_000);
    let states = |e: &mut Engine, spans: Vec<SpanEvidence>, at: Moment| -> Vec<HealthState> {
        let mut out = Vec::new();
        e.ingest(crate::normalize::NormalizedBatch { evidence: spans, ..Default::default() }, at, &mut out);
        e.tick(at + Duration::from_millis(50), &mut out);
        // The step's answers, taken at the latest here.
        e.flush_store(at + Duration::from_millis(60), &mut out);
        out.iter().filter_map(|d| if let Decided::Call(v) = d { Some(v.state) } else { None }).collect()
    };
    // One process, for the reference.
    let mut one = Engine::new(EngineConfig::new(
        ChainLimits { decision_wait: Duration::from_millis(10), ..ChainLimits::default() },
        SessionLimits::default(),
    ));
    let mut all = session.clone();
    all.push(call.clone());
    assert_eq!(states(&mut one, all, t), vec![HealthState::StaleCatalog]);
    // Two engines on one Redis: the session on a, the call on b.
    let (mut a, mut b) = (engine(), engine());
    states(&mut a, session, t);
    assert_eq!(states(&mut b, vec![call], t + Duration::from_millis(100)), vec![HealthState::StaleCatalog]);
    assert_eq!((b.sessions_merged(), b.store_errors()), (1, 0));
    // The gate of a third instance, which received nothing of this session, answers its verdict
    // from the store (every instance's evidence): stale, not unknown.
    let gate = crate::gate::GateState {
        shared: Some((StoreHandle::open_redis(settings(&r.url())).unwrap(), SessionLimits::default())),
        ..crate::gate::GateState::default()
    };
    let v = gate.catalog_of(Some("s-1"), None, None).expect("the session is found in the store");
    assert_eq!(v.convergence, crate::classify::catalog::Convergence::Stale);
    assert!(crate::gate::GateState::default().catalog_of(Some("s-1"), None, None).is_none(), "without the store: unknown here");
}

/// A session converged on one engine while another engine holds the signal that makes it stale:
/// on a shared store the first engine holds its `converged` verdict until a read of the store
/// confirms it, so it never says `converged` where one process (which has both) says `stale`.
#[test]
fn redis_a_converged_verdict_waits_for_the_store_to_confirm_it() {
    if !available("redis_a_converged_verdict_waits_for_the_store_to_confirm_it") {
        return;
    }
    use crate::classify::catalog::Convergence;
    use crate::engine::{Decided, Engine};
    use crate::evidence::catalog::{CatalogFacts, ListPage, SignalSource};
    use crate::evidence::time::Moment;
    use crate::evidence::{Method, Side, SpanEvidence};
    let r = RedisServer::start();
    let engine = || Engine::new(engine_config(&r));
    let fact = |n: u8, at: u64, f: CatalogFacts| {
        let mut s = SpanEvidence::new([9; 16], [n; 8]);
        s.session_id = Some("s-1".into());
        s.side = Side::Client;
        s.server = Some(Arc::from("srv:1"));
        s.start_ns = at;
        s.end_ns = at;
        s.catalog = Some(Box::new(f));
        s
    };
    let page = ListPage {
        cursor: None,
        next_cursor_present: false,
        tools: vec![(Arc::from("t"), Arc::from("sha256:aa"))],
        ttl_ms: None,
        cache_scope: None,
    };
    let installed = crate::classify::digest::registry_digest(&[crate::classify::digest::ToolDigest {
        name: "t".into(),
        digest: "sha256:aa".into(),
        projection_version: crate::classify::digest::PROJECTION_VERSION.into(),
    }]);
    let mut listed = fact(2, 10, CatalogFacts { page: Some(page), ..Default::default() });
    listed.method = Some(Method::ToolsList);
    let converged = vec![
        fact(1, 1, CatalogFacts { list_changed_capability: Some(true), ..Default::default() }),
        listed,
        fact(3, 11, CatalogFacts { installed_digest: Some(Arc::from(installed.as_str())), ..Default::default() }),
    ];
    let signal = vec![fact(4, 20, CatalogFacts { signal: Some(SignalSource::Notification), ..Default::default() })];
    let catalog = |out: &[Decided]| -> Vec<Convergence> {
        out.iter().filter_map(|d| if let Decided::Catalog(c) = d { Some(c.verdict.convergence) } else { None }).collect()
    };
    let t = Moment::from_nanos(1_000_000_000);
    let (mut a, mut b) = (engine(), engine());
    let mut out_a = Vec::new();
    a.ingest(crate::normalize::NormalizedBatch { evidence: converged, ..Default::default() }, t, &mut out_a);
    assert!(!catalog(&out_a).contains(&Convergence::Converged), "held, not published: {:?}", catalog(&out_a));
    assert!(a.next_due().is_some_and(|d| d <= t + Duration::from_millis(250)), "the engine wakes to confirm it");
    // b gets the signal and writes it.
    let mut out_b = Vec::new();
    b.ingest(crate::normalize::NormalizedBatch { evidence: signal, ..Default::default() }, t + Duration::from_millis(10), &mut out_b);
    b.flush_store(t + Duration::from_millis(20), &mut out_b);
    // a confirms: the store's session (both engines' evidence) is stale, never converged.
    a.tick(t + Duration::from_millis(300), &mut out_a);
    a.drain(crate::verdict::DecidedBy::Shutdown, t + Duration::from_millis(400), &mut out_a);
    let seen = catalog(&out_a);
    assert!(!seen.contains(&Convergence::Converged), "{seen:?}");
    // Each change is emitted by one engine: `stale` by whichever recorded it first (b, which
    // holds the signal), not again by a.
    let mut all = catalog(&out_b);
    all.extend(seen);
    assert_eq!(all, vec![Convergence::Stale], "one stale across the engines, no converged");

    // Alone (nothing else on the store), the held verdict is confirmed and published.
    let mut c = engine();
    let mut out_c = Vec::new();
    let mut again = fact(1, 1, CatalogFacts { list_changed_capability: Some(true), ..Default::default() });
    again.session_id = Some("s-2".into());
    let mut l2 = fact(
        2,
        10,
        CatalogFacts {
            page: Some(ListPage {
                cursor: None,
                next_cursor_present: false,
                tools: vec![(Arc::from("t"), Arc::from("sha256:aa"))],
                ttl_ms: None,
                cache_scope: None,
            }),
            ..Default::default()
        },
    );
    l2.method = Some(Method::ToolsList);
    l2.session_id = Some("s-2".into());
    let mut i2 = fact(3, 11, CatalogFacts { installed_digest: Some(Arc::from(installed.as_str())), ..Default::default() });
    i2.session_id = Some("s-2".into());
    c.ingest(crate::normalize::NormalizedBatch { evidence: vec![again, l2, i2], ..Default::default() }, t, &mut out_c);
    c.tick(t + Duration::from_millis(300), &mut out_c);
    assert_eq!(catalog(&out_c).last(), Some(&Convergence::Converged), "{:?}", catalog(&out_c));
}

/// Two engines on one Redis see the same drifted `tools/list` page (two sessions, two traces):
/// the drift is reported once, by the engine whose write created its record.
#[test]
fn redis_a_drift_seen_by_two_engines_is_reported_once() {
    if !available("redis_a_drift_seen_by_two_engines_is_reported_once") {
        return;
    }
    use crate::classify::digest::PROJECTION_VERSION;
    use crate::classify::pinning::{Lockfile, Pin};
    use crate::engine::{Decided, Engine};
    use crate::evidence::catalog::{CatalogFacts, ListPage};
    use crate::evidence::time::Moment;
    use crate::evidence::{Method, Side, SpanEvidence};
    let r = RedisServer::start();
    let mut pins = Lockfile::new();
    let pin = Pin {
        digest: format!("sha256:{}", "a".repeat(64)),
        projection_version: PROJECTION_VERSION.to_string(),
        first_seen: "2026-01-01T00:00:00Z".into(),
        definition: None,
    };
    pins.add("srv:1", "t", pin, false);
    let pins = Arc::new(pins);
    let engine = || {
        let mut cfg = engine_config(&r);
        cfg.pins = Some(pins.clone());
        Engine::new(cfg)
    };
    let page = |n: u8| {
        let mut s = SpanEvidence::new([n; 16], [1; 8]);
        s.session_id = Some(format!("s-{n}").into());
        s.side = Side::Client;
        s.method = Some(Method::ToolsList);
        s.server = Some(Arc::from("srv:1"));
        s.request_id = Some("1".into());
        s.start_ns = 10;
        s.end_ns = 20;
        let tools = vec![(Arc::from("t"), Arc::from(format!("sha256:{}", "b".repeat(64)).as_str()))];
        s.catalog = Some(Box::new(CatalogFacts {
            page: Some(ListPage { cursor: None, next_cursor_present: false, tools, ttl_ms: None, cache_scope: None }),
            ..Default::default()
        }));
        s
    };
    let drifts = |out: &[Decided]| out.iter().filter(|d| matches!(d, Decided::Drift(_))).count();
    let t = Moment::from_nanos(1_000_000_000);
    let (mut a, mut b) = (engine(), engine());
    let (mut out_a, mut out_b) = (Vec::new(), Vec::new());
    a.ingest(crate::normalize::NormalizedBatch { evidence: vec![page(1)], ..Default::default() }, t, &mut out_a);
    b.ingest(crate::normalize::NormalizedBatch { evidence: vec![page(2)], ..Default::default() }, t, &mut out_b);
    // Each engine writes at the end of its step: a created the record and reported it.
    assert_eq!((drifts(&out_a), drifts(&out_b)), (1, 0));
    a.flush_store(t + Duration::from_millis(100), &mut out_a);
    b.flush_store(t + Duration::from_millis(100), &mut out_b);
    assert_eq!((drifts(&out_a), drifts(&out_b)), (1, 0), "reported once, by the engine that created the record");
}

/// The shared lists (refused HTTP spans, client halves, parked verifiers) expire
/// `tombstone_ttl` after their last write, so an instance that stopped before deleting its own
/// leaves nothing behind for good; other records never expire. An expired list record is
/// expected absent afterwards: writing it again is no conflict.
#[test]
fn redis_shared_lists_expire_and_other_records_do_not() {
    if !available("redis_shared_lists_expire_and_other_records_do_not") {
        return;
    }
    let r = RedisServer::start();
    let mut st = RedisStore::open(RedisSettings { tombstone_ttl: Duration::from_millis(300), ..settings(&r.url()) }).unwrap();
    let mut c = Changes::default();
    c.put(refusal_key(7), Record::Refusals(Box::default()));
    c.put("op-1".into(), Record::Operation([1; 16]));
    st.apply(&c).unwrap();
    let mut conn = r.conn();
    let ttl = |conn: &mut ::redis::Connection, k: &str| -> i64 { ::redis::cmd("PTTL").arg(k).query(conn).unwrap() };
    assert!(ttl(&mut conn, "mcp-health:refusals:7") > 0, "a list record expires");
    assert!(ttl(&mut conn, "mcp-health:operations:op-1") > 300, "an operation key lives its record_life, not a tombstone's");
    std::thread::sleep(Duration::from_millis(450));
    assert_eq!(ttl(&mut conn, "mcp-health:refusals:7"), -2, "gone");
    assert!(st.get_many(Table::Refusals, &[refusal_key(7)]).unwrap()[0].is_none());
    let mut again = Changes::default();
    again.put(refusal_key(7), Record::Refusals(Box::default()));
    st.apply(&again).expect("an expired list record is written again without a conflict");
}

/// Decided chains and their operation keys live `record_life` after their last write, in both
/// layouts and on every path a write takes — a new key (`SET … NX`), one another store created
/// first (refused through the script: the winner's life is kept), a rewrite (through the
/// script) — so those no instance deletes leave Redis; sessions and incidents do not expire.
#[test]
fn redis_decided_chains_and_operation_keys_live_a_bounded_time() {
    if !available("redis_decided_chains_and_operation_keys_live_a_bounded_time") {
        return;
    }
    let r = RedisServer::start();
    let life = Duration::from_millis(1500);
    let with_life = |s: RedisSettings| RedisSettings { record_life: life, ..s };
    let mut st = RedisStore::open(with_life(settings(&r.url()))).unwrap();
    st.announce(Duration::from_millis(1)).unwrap();
    let mut first = many_decided(3);
    first.put("session:sess-1".into(), Record::Session(Box::new(session())));
    first.changes.extend(one_incident(1).changes);
    for i in 0..3u8 {
        first.put(format!("op-{i}"), Record::Operation([i; 16]));
    }
    st.apply(&first).unwrap();
    let written = Instant::now();
    let mut conn = r.conn();
    let ttl = |conn: &mut ::redis::Connection, k: String| -> i64 { ::redis::cmd("PTTL").arg(k).query(conn).unwrap() };
    let decided = |i: u16| {
        let mut trace = [0u8; 16];
        trace[..2].copy_from_slice(&(i + 1).to_be_bytes());
        record_key(Table::Decided, &trace_key(&trace))
    };
    let lives = |t: i64| t > 0 && t <= 1500;
    for i in 0..3 {
        assert!(lives(ttl(&mut conn, decided(i))), "a new decided chain (SET … NX) lives record_life");
        assert!(lives(ttl(&mut conn, record_key(Table::Operations, &format!("op-{i}")))), "a new operation key too");
    }
    assert_eq!(ttl(&mut conn, record_key(Table::Sessions, "session:sess-1")), -1, "a session does not expire");
    assert_eq!(ttl(&mut conn, record_key(Table::Incidents, &incident_key())), -1, "an incident does not expire");
    // A rewrite goes through the script: its life starts again.
    std::thread::sleep((written + Duration::from_millis(900)).saturating_duration_since(Instant::now()));
    let mut again = Changes::default();
    again.changes.push(many_decided(1).changes.remove(0));
    st.apply(&again).unwrap();
    assert!(ttl(&mut conn, decided(0)) > 1000, "a rewritten chain lives record_life from its rewrite");
    let rewritten = Instant::now();
    // Another store creates one first: the loser's new key is refused through the script.
    let mut other = RedisStore::open(with_life(settings(&r.url()))).unwrap();
    other.announce(Duration::from_millis(1)).unwrap();
    let mut taken = Changes::default();
    taken.put("op-taken".into(), Record::Operation([7; 16]));
    other.apply(&taken).unwrap();
    assert!(matches!(st.apply(&taken), Err(StoreError::Conflict { .. })));
    assert!(lives(ttl(&mut conn, record_key(Table::Operations, "op-taken"))), "the winner's record keeps its life");
    // The hash layout (an older instance announced): through the script, with the same life.
    let mut hashes = RedisStore::open(with_life(settings(&r.url()))).unwrap();
    let mut old = Changes::default();
    old.put("op-hash".into(), Record::Operation([8; 16]));
    hashes.apply(&old).unwrap();
    assert_eq!(key_type(&r, &record_key(Table::Operations, "op-hash")), "hash");
    assert!(lives(ttl(&mut conn, record_key(Table::Operations, "op-hash"))), "a hash record lives record_life too");
    // Past the first writes' life, within the rewrite's.
    std::thread::sleep((written + life + Duration::from_millis(200)).saturating_duration_since(Instant::now()));
    assert!(rewritten.elapsed() < life, "the test ran too slowly to tell the two lives apart");
    for i in 1..3 {
        assert_eq!(ttl(&mut conn, decided(i)), -2, "gone after its life");
    }
    assert_eq!(ttl(&mut conn, record_key(Table::Operations, "op-0")), -2);
    assert!(ttl(&mut conn, decided(0)) > 0, "the rewritten chain is still there");
    assert_eq!(ttl(&mut conn, record_key(Table::Sessions, "session:sess-1")), -1, "the session is still there");
}

/// A decided chain's delete by the store that wrote it (so with its lifetime) is left to that
/// lifetime: no tombstone is written, nothing is refused. One this store only read (another
/// store's, or one an earlier release wrote without a lifetime) is deleted as before.
#[test]
fn redis_a_decided_chain_its_store_wrote_is_left_to_expire_one_it_read_is_deleted() {
    if !available("redis_a_decided_chain_its_store_wrote_is_left_to_expire_one_it_read_is_deleted") {
        return;
    }
    let r = RedisServer::start();
    let (mut a, mut b) = (open(&r), open(&r));
    a.apply(&many_decided(2)).unwrap();
    let keys: Vec<String> = many_decided(2).changes.iter().map(|c| c.key.clone()).collect();
    let mut conn = r.conn();
    let raw = |conn: &mut ::redis::Connection, k: &str| -> (Option<Vec<u8>>, i64) {
        ::redis::pipe().cmd("GET").arg(record_key(Table::Decided, k)).cmd("PTTL").arg(record_key(Table::Decided, k)).query(conn).unwrap()
    };
    let mut gone = Changes::default();
    gone.delete(Table::Decided, keys[0].clone());
    a.apply(&gone).unwrap();
    let (v, ttl) = raw(&mut conn, &keys[0]);
    assert!(v.is_some_and(|v| v.contains(&b':')) && ttl > 0, "still the record, with its lifetime: no tombstone");
    assert_eq!(a.stats().unwrap().deletes_left_to_expire, 1);
    // Another store read the second chain: its delete writes a tombstone.
    assert!(b.get(Table::Decided, &keys[1]).unwrap().is_some());
    let mut gone = Changes::default();
    gone.delete(Table::Decided, keys[1].clone());
    b.apply(&gone).unwrap();
    let (v, _) = raw(&mut conn, &keys[1]);
    assert!(v.is_some_and(|v| v.iter().all(u8::is_ascii_digit)), "a tombstone");
    assert_eq!(b.stats().unwrap().deletes_left_to_expire, 0);
    // A record without a lifetime (as an earlier release wrote it), loaded: deleted.
    let plain = "mcp-health:decided:plain";
    let rec = many_decided(1).changes.remove(0).value.unwrap();
    let mut bytes = b"7:".to_vec();
    rec.encode_into(format::format_of(format::PROTOCOL), &mut bytes).unwrap();
    let _: () = ::redis::cmd("SET").arg(plain).arg(&bytes).query(&mut conn).unwrap();
    let mut c = open(&r);
    assert!(c.get(Table::Decided, "plain").unwrap().is_some());
    let mut gone = Changes::default();
    gone.delete(Table::Decided, "plain".into());
    c.apply(&gone).unwrap();
    let v: Vec<u8> = ::redis::cmd("GET").arg(plain).query(&mut conn).unwrap();
    assert!(v.iter().all(u8::is_ascii_digit), "a tombstone: {v:?}");
}

/// An operation key's delete by the store that wrote it is left to its lifetime too: no
/// tombstone, nothing refused. Its writer may name the key again (an operation used again): that
/// write passes whether the record is still there or its lifetime ended, and is refused when
/// another store wrote the key in between; a store that never saw the key is refused while the
/// record is there. While an older release shares the store (records written as hashes: it takes
/// any chain it finds, past its window too) a delete is sent, a tombstone, as before.
#[test]
fn redis_an_operation_key_its_store_wrote_is_left_to_expire_and_may_be_named_again() {
    if !available("redis_an_operation_key_its_store_wrote_is_left_to_expire_and_may_be_named_again") {
        return;
    }
    let r = RedisServer::start();
    let put = |k: &str, t: u8| {
        let mut c = Changes::default();
        c.put(k.into(), Record::Operation([t; 16]));
        c
    };
    let del = |table: Table, k: &str| {
        let mut c = Changes::default();
        c.delete(table, k.into());
        c
    };
    let mut conn = r.conn();
    let raw = |conn: &mut ::redis::Connection, k: &str| -> (Option<Vec<u8>>, i64) {
        let k = record_key(Table::Operations, k);
        ::redis::pipe().cmd("GET").arg(&k).cmd("PTTL").arg(&k).query(conn).unwrap()
    };
    let names = |s: &mut RedisStore, k: &str| match s.get(Table::Operations, k).unwrap() {
        Some(Record::Operation(t)) => Some(t[0]),
        _ => None,
    };
    let conflict = |r: Result<(), StoreError>| matches!(r, Err(StoreError::Conflict { .. }));
    let mut a = open(&r);
    a.apply(&put("op-a", 1)).unwrap();
    a.apply(&del(Table::Operations, "op-a")).unwrap();
    let (v, ttl) = raw(&mut conn, "op-a");
    assert!(v.is_some_and(|v| v.contains(&b':')) && ttl > 0, "still the record, with its lifetime: no tombstone");
    assert_eq!(a.stats().unwrap().deletes_left_to_expire, 1);
    // A store that never saw the key: refused while the record is there.
    let mut b = open(&r);
    assert!(conflict(b.apply(&put("op-a", 2))));
    // Its writer names it again: written, over the record it left.
    a.apply(&put("op-a", 3)).unwrap();
    assert_eq!(names(&mut open(&r), "op-a"), Some(3));
    // Left again, and its lifetime ends (`DEL` stands for the expiry): named again, written.
    a.apply(&del(Table::Operations, "op-a")).unwrap();
    let _: () = ::redis::cmd("DEL").arg(record_key(Table::Operations, "op-a")).query(&mut conn).unwrap();
    a.apply(&put("op-a", 4)).unwrap();
    assert_eq!(names(&mut open(&r), "op-a"), Some(4));
    // Left again, then another store reads it and writes it: the writer's next write is refused.
    a.apply(&del(Table::Operations, "op-a")).unwrap();
    let mut c = open(&r);
    assert_eq!(names(&mut c, "op-a"), Some(4));
    c.apply(&put("op-a", 6)).unwrap();
    assert!(conflict(a.apply(&put("op-a", 7))), "not over what another store wrote since");
    assert_eq!(names(&mut open(&r), "op-a"), Some(6));
    assert_eq!(a.stats().unwrap().deletes_left_to_expire, 3);
    // An older release shares the store: deletes are sent, tombstones (an operation key and a
    // decided chain alike).
    let mut h = open(&r);
    h.speak(1);
    h.apply(&put("op-h", 1)).unwrap();
    let chain = many_decided(1);
    let chain_key = chain.changes[0].key.clone();
    h.apply(&chain).unwrap();
    h.apply(&del(Table::Operations, "op-h")).unwrap();
    h.apply(&del(Table::Decided, &chain_key)).unwrap();
    for key in [record_key(Table::Operations, "op-h"), record_key(Table::Decided, &chain_key)] {
        let fields: Vec<String> = ::redis::cmd("HKEYS").arg(&key).query(&mut conn).unwrap();
        assert_eq!(fields, vec!["ver".to_string()], "a tombstone (its version alone) at {key}");
    }
    assert_eq!(h.stats().unwrap().deletes_left_to_expire, 0);
}

/// What a store remembers for compare-and-set is bounded: its own deletes of keys never written
/// again (decided chains, list records) are not kept, the others' tombstones are (a server's next
/// incident is written over its tombstone without a conflict); and a version forgotten untouched
/// makes the next write a conflict, written once the record is read again — never a write over
/// what the store did not see.
#[test]
fn redis_remembered_versions_are_bounded_and_a_forgotten_one_is_a_conflict_then_read() {
    if !available("redis_remembered_versions_are_bounded_and_a_forgotten_one_is_a_conflict_then_read") {
        return;
    }
    let r = RedisServer::start();
    let mut st = open(&r);
    let held = |st: &RedisStore| st.stats().unwrap().versions_held;
    let all = all_changes();
    st.apply(&all).unwrap();
    assert_eq!(held(&st), all.len() as u64);
    let mut del = Changes::default();
    for c in &all.changes {
        del.delete(c.table, c.key.clone());
    }
    st.apply(&del).unwrap();
    let kept = all.changes.iter().filter(|c| c.table != Table::Decided && !c.table.expires()).count();
    assert!(kept < all.len() && all.changes.iter().any(|c| c.table == Table::Decided));
    assert_eq!(held(&st), kept as u64, "the decided chains' and lists' deletes are forgotten, the others' tombstones kept");
    st.apply(&one_incident(2)).expect("a server's next incident is written over its tombstone");

    // Remembered for 200 ms: a pause of two periods forgets every version.
    let mut quick = RedisStore::open(RedisSettings { remember_for: Duration::from_millis(200), ..settings(&r.url()) }).unwrap();
    quick.load().unwrap();
    quick.apply(&one_incident(3)).unwrap();
    std::thread::sleep(Duration::from_millis(450));
    let mut other = Changes::default();
    other.put("op-2".into(), Record::Operation([2; 16]));
    quick.apply(&other).unwrap();
    let stats = quick.stats().unwrap();
    assert!(stats.versions_forgotten >= 1 && stats.versions_held == 1, "{stats:?}");
    assert!(crate::bounded::evicted("store_versions") >= stats.versions_forgotten, "counted with the bounded tables");
    assert!(matches!(quick.apply(&one_incident(4)), Err(StoreError::Conflict { .. })), "expected absent, found: a conflict");
    quick.get(Table::Incidents, &incident_key()).unwrap();
    quick.apply(&one_incident(4)).expect("written once read again");
    let snap = open(&r).load().unwrap();
    assert_eq!(snap.incidents.iter().flat_map(|p| p.open.iter().map(|i| i.calls)).collect::<Vec<_>>(), vec![4]);
}

/// Client halves are published only for servers seen to split. A client-only call to a server
/// no instance saw split publishes nothing; a split call to a server nobody marked yet — client
/// half decided on one engine before the other engine's server half marked its server — is still
/// one call: the mark reaches the client's engine, which publishes the half it held back, and the
/// server half's look (which waits for the mark to settle) joins it, revising the client's
/// verdict instead of giving one of its own.
#[test]
fn redis_only_split_servers_publish_halves_and_the_first_split_call_still_joins() {
    if !available("redis_only_split_servers_publish_halves_and_the_first_split_call_still_joins") {
        return;
    }
    use crate::engine::{Decided, Engine};
    use crate::evidence::time::Moment;
    use crate::evidence::{Method, Side, SpanEvidence};
    let r = RedisServer::start();
    let engine = || Engine::new(engine_config(&r));
    let span = |trace: u8, side: Side, server: &str, rid: &str, start: u64, end: u64| {
        let mut s = SpanEvidence::new([trace; 16], [trace; 8]);
        s.method = Some(Method::ToolsCall);
        s.side = side;
        s.tool = Some(Arc::from("t"));
        s.server = Some(Arc::from(server));
        s.request_id = Some(rid.into());
        s.start_ns = start;
        s.end_ns = end;
        s
    };
    let batch = |spans: Vec<SpanEvidence>| crate::normalize::NormalizedBatch { evidence: spans, ..Default::default() };
    let (mut a, mut b) = (engine(), engine());
    let t = Moment::from_nanos(1_000_000_000);
    let ms = Duration::from_millis;
    let (mut out_a, mut out_b) = (Vec::new(), Vec::new());
    // Engine a: a client-only call to a quiet server, and the client half of a split call.
    a.ingest(
        batch(vec![span(1, Side::Client, "quiet:1", "q1", 1_000, 9_000), span(2, Side::Client, "split:1", "s1", 1_000, 9_000)]),
        t,
        &mut out_a,
    );
    // Engine b: the split call's server half, a trace of its own.
    b.ingest(batch(vec![span(3, Side::Server, "split:1", "s1", 2_000, 8_000)]), t, &mut out_b);
    a.tick(t + ms(50), &mut out_a);
    a.flush_store(t + ms(60), &mut out_a);
    assert!(open(&r).load().unwrap().halves.is_empty(), "no server seen to split yet: no half published");
    // b defers its server half (it waited alone): split:1 is marked.
    b.tick(t + ms(50), &mut out_b);
    b.flush_store(t + ms(60), &mut out_b);
    assert_eq!(open(&r).load().unwrap().splits, vec![SplitRecord { server: Some(Arc::from("split:1")) }]);
    // a reads the mark (a round), then publishes the half it held back (the next round).
    a.tick(t + ms(400), &mut out_a);
    a.flush_store(t + ms(400), &mut out_a);
    a.flush_store(t + ms(500), &mut out_a);
    let halves: Vec<Option<Arc<str>>> = open(&r).load().unwrap().halves.into_iter().flat_map(|(_, h)| h.halves).map(|h| h.server).collect();
    assert_eq!(halves, vec![Some(Arc::from("split:1"))], "the quiet server's half is never published");
    // The look waits for the mark to settle; then b joins the half and decides nothing alone.
    b.tick(t + ms(1_020), &mut out_b);
    assert_eq!(b.taken_over(), 0, "before the mark settled, no look");
    for step in 1..=30 {
        b.tick(t + ms(1_000 + 100 * step), &mut out_b);
    }
    b.flush_store(t + ms(4_100), &mut out_b);
    let calls = |out: &[Decided]| -> Vec<([u8; 16], u32)> {
        out.iter().filter_map(|d| if let Decided::Call(v) = d { Some((v.trace_id, v.revision)) } else { None }).collect()
    };
    assert_eq!(b.taken_over(), 1, "the client's chain taken from the store");
    assert_eq!(calls(&out_b), vec![([2; 16], 1)], "one call: the client's, revised with its server half; none of the server half's own");
    assert_eq!(calls(&out_a), vec![([1; 16], 0), ([2; 16], 0)]);
}

/// Each instance announces its state protocol; the cluster's is the lowest announced while it
/// lives, and records are written in it (bare for protocol 0, as 0.1.0 reads them); once the
/// old instance's announcement expires the cluster speaks this build's protocol again.
#[test]
fn redis_the_cluster_speaks_the_lowest_protocol_announced_while_it_lives() {
    if !available("redis_the_cluster_speaks_the_lowest_protocol_announced_while_it_lives") {
        return;
    }
    let r = RedisServer::start();
    let (mut old, mut new) = (open(&r), open(&r));
    old.speak(0);
    assert_eq!(new.announce(Duration::from_secs(60)).unwrap(), format::PROTOCOL, "alone: its own");
    assert_eq!(old.announce(Duration::from_millis(300)).unwrap(), 0);
    assert_eq!(new.announce(Duration::from_secs(60)).unwrap(), 0, "the lowest live announcement");
    let mut c = Changes::default();
    c.put("op-1".into(), Record::Operation([1; 16]));
    new.apply(&c).unwrap();
    let raw: Vec<u8> = ::redis::cmd("HGET").arg("mcp-health:operations:op-1").arg("v").query(&mut r.conn()).unwrap();
    assert_eq!(raw, [1; 16], "written bare, as 0.1.0 reads it");
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(new.announce(Duration::from_secs(60)).unwrap(), format::PROTOCOL, "the old announcement expired");
    let mut c = Changes::default();
    c.put("op-2".into(), Record::Operation([2; 16]));
    new.apply(&c).unwrap();
    let raw: Vec<u8> = ::redis::cmd("GET").arg("mcp-health:operations:op-2").query(&mut r.conn()).unwrap();
    let at = raw.iter().position(|b| *b == b':').unwrap();
    assert!(raw[at + 1..].starts_with(&format::MAGIC), "framed again");
    // A field that does not parse (nothing this build writes) is dropped, never taken as a version.
    ::redis::cmd("HSET").arg("mcp-health:protocols").arg("junk").arg("zero").query::<()>(&mut r.conn()).unwrap();
    assert_eq!(new.announce(Duration::from_secs(60)).unwrap(), format::PROTOCOL);
    let n: u64 = ::redis::cmd("HLEN").arg("mcp-health:protocols").query(&mut r.conn()).unwrap();
    assert_eq!(n, 1);
}

fn record_key(table: Table, key: &str) -> String {
    format!("mcp-health:{}:{key}", table.as_str())
}

/// New keys are written many to one `MSETNX`; one such key that another instance created first
/// (one in the first of the apply's sends, one in a later: see `SEND_EVERY`) is refused alone and
/// the rest of its batch is still written, each under the apply's version,
/// and no two applies write under one version (the next apply's is taken by the last; one whose
/// connection failed is not reused).
#[test]
fn redis_new_keys_written_together_one_taken_first_is_refused_alone_and_versions_are_never_reused() {
    if !available("redis_new_keys_written_together_one_taken_first_is_refused_alone_and_versions_are_never_reused") {
        return;
    }
    let r = RedisServer::start();
    let (mut a, mut b) = (open(&r), open(&r));
    let mut first = Changes::default();
    first.put("op-3".into(), Record::Operation([9; 16]));
    first.put("op-2900".into(), Record::Operation([9; 16]));
    b.apply(&first).unwrap();
    let mut c = Changes::default();
    // Some 300 KiB of commands: several sends.
    const KEYS: usize = 3000;
    for i in 0..KEYS {
        c.put(format!("op-{i}"), Record::Operation([1; 16]));
    }
    match a.apply(&c) {
        Err(StoreError::Conflict { refused, .. }) => {
            assert_eq!(refused, vec![(Table::Operations, "op-3".to_string()), (Table::Operations, "op-2900".to_string())])
        }
        other => panic!("{other:?}"),
    }
    let mut conn = r.conn();
    let version = |conn: &mut ::redis::Connection, key: &str| -> String {
        let raw: Vec<u8> = ::redis::cmd("GET").arg(record_key(Table::Operations, key)).query(conn).unwrap();
        let at = raw.iter().position(|b| *b == b':').expect("a record");
        String::from_utf8(raw[..at].to_vec()).unwrap()
    };
    assert!(matches!(open(&r).get(Table::Operations, "op-3").unwrap(), Some(Record::Operation(t)) if t == [9; 16]), "not overwritten");
    let mine = version(&mut conn, "op-0");
    for i in (0..KEYS).filter(|i| *i != 3 && *i != 2900) {
        assert_eq!(version(&mut conn, &format!("op-{i}")), mine, "op-{i}: written, under the apply's version");
    }
    assert_ne!(version(&mut conn, "op-3"), mine);
    // A new key twice in one write: no conflict, the last change stands.
    let mut twice = Changes::default();
    twice.put("new-twice".into(), Record::Operation([4; 16]));
    twice.put("new-twice".into(), Record::Operation([5; 16]));
    a.apply(&twice).unwrap();
    assert!(matches!(open(&r).get(Table::Operations, "new-twice").unwrap(), Some(Record::Operation(t)) if t == [5; 16]));
    // Further applies, one after a dropped connection: a new version each time.
    let mut seen = vec![version(&mut conn, "op-3"), mine];
    for round in 0..3 {
        if round == 1 {
            let _: () = ::redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("normal").arg("SKIPME").arg("yes").query(&mut conn).unwrap();
            let mut lost = Changes::default();
            lost.put("lost".into(), Record::Operation([2; 16]));
            assert!(a.apply(&lost).is_err(), "the dropped connection fails this apply");
            std::thread::sleep(Duration::from_millis(300));
        }
        let mut again = Changes::default();
        again.put(format!("next-{round}"), Record::Operation([3; 16]));
        a.apply(&again).unwrap();
        let v = version(&mut conn, &format!("next-{round}"));
        assert!(!seen.contains(&v), "version {v} used twice ({seen:?})");
        seen.push(v);
    }
}

fn key_type(r: &RedisServer, key: &str) -> String {
    ::redis::cmd("TYPE").arg(key).query(&mut r.conn()).unwrap()
}

/// While an instance of release 0.2.0 (protocol 1) shares the store, records are the hashes it
/// reads and writes (`v`, `ver`); once the cluster speaks 2 each is one string, its version then
/// its bytes; and a key in either layout is read, compare-and-set and rewritten in the other,
/// whichever way the cluster's protocol moves (instances learn a change within a second of each
/// other, so both layouts meet on one key). A key twice in one write is written once, as the
/// last change says.
#[test]
fn redis_records_change_layout_with_the_cluster_protocol_and_compare_and_set_holds_across() {
    if !available("redis_records_change_layout_with_the_cluster_protocol_and_compare_and_set_holds_across") {
        return;
    }
    let r = RedisServer::start();
    // Before it hears the cluster's protocol a store writes what an announcing 0.2.0 reads.
    let mut fresh = unheard(&r);
    let mut c = Changes::default();
    c.put("op-0".into(), Record::Operation([0; 16]));
    fresh.apply(&c).unwrap();
    assert_eq!(key_type(&r, &record_key(Table::Operations, "op-0")), "hash");
    let (mut old, mut new, mut third) = (open(&r), open(&r), open(&r));
    old.speak(1);
    assert_eq!(old.announce(Duration::from_millis(300)).unwrap(), 1);
    assert_eq!(new.announce(Duration::from_secs(60)).unwrap(), 1, "a 0.2.0 instance is announced");
    let key = record_key(Table::Operations, "op-1");
    let put = |b: u8| {
        let mut c = Changes::default();
        c.put("op-1".into(), Record::Operation([b; 16]));
        c
    };
    // Protocol 1: a hash, exactly as 0.2.0 writes it.
    new.apply(&put(1)).unwrap();
    assert_eq!(key_type(&r, &key), "hash");
    let (v, ver): (Vec<u8>, u64) = ::redis::cmd("HMGET").arg(&key).arg("v").arg("ver").query(&mut r.conn()).unwrap();
    assert!(v.starts_with(&format::MAGIC) && ver > 0);
    assert!(matches!(third.get(Table::Operations, "op-1").unwrap(), Some(Record::Operation(t)) if t == [1; 16]));
    // The old instance is gone: protocol 2, and the next write makes it one string.
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(new.announce(Duration::from_secs(60)).unwrap(), format::PROTOCOL);
    assert_eq!(third.announce(Duration::from_secs(60)).unwrap(), format::PROTOCOL);
    new.apply(&put(2)).unwrap();
    assert_eq!(key_type(&r, &key), "string");
    // `third` expects the hash's version: refused, the string untouched, then read and written.
    assert!(matches!(third.apply(&put(9)), Err(StoreError::Conflict { .. })));
    assert!(matches!(open(&r).get(Table::Operations, "op-1").unwrap(), Some(Record::Operation(t)) if t == [2; 16]));
    assert!(matches!(third.get(Table::Operations, "op-1").unwrap(), Some(Record::Operation(t)) if t == [2; 16]));
    // The same key twice in one write, in both layouts: no conflict, the last change stands.
    for protocol in [1, format::PROTOCOL] {
        let mut s = open(&r);
        if protocol == 1 {
            s.speak(1);
        } else {
            assert_eq!(s.announce(Duration::from_secs(60)).unwrap(), format::PROTOCOL);
        }
        let _ = s.get(Table::Operations, "op-1").unwrap();
        let mut twice = put(6);
        twice.put("op-1".into(), Record::Operation([7; 16]));
        s.apply(&twice).unwrap();
        assert!(matches!(s.get(Table::Operations, "op-1").unwrap(), Some(Record::Operation(t)) if t == [7; 16]), "{protocol}");
        assert_eq!(key_type(&r, &key), if protocol == 1 { "hash" } else { "string" });
        let ttl: i64 = ::redis::cmd("PTTL").arg(&key).query(&mut r.conn()).unwrap();
        assert!(ttl > 60_000, "a live record lives its record_life, not a tombstone's ({protocol}): {ttl}");
    }
    let _ = third.get(Table::Operations, "op-1").unwrap();
    third.apply(&put(3)).unwrap();
    // Back to protocol 1 (an old instance came back): `new`'s write, expecting what it wrote, is
    // refused, and after a read turns the string back into a hash.
    old.speak(1);
    assert_eq!(old.announce(Duration::from_secs(60)).unwrap(), 1);
    assert_eq!(new.announce(Duration::from_secs(60)).unwrap(), 1);
    assert!(matches!(new.apply(&put(4)), Err(StoreError::Conflict { .. })));
    assert!(matches!(new.get(Table::Operations, "op-1").unwrap(), Some(Record::Operation(t)) if t == [3; 16]));
    new.apply(&put(4)).unwrap();
    assert_eq!(key_type(&r, &key), "hash");
    assert!(matches!(old.get(Table::Operations, "op-1").unwrap(), Some(Record::Operation(t)) if t == [4; 16]));
    // A delete in each layout leaves a tombstone both read; a put on it brings the record back.
    let mut del = Changes::default();
    del.delete(Table::Operations, "op-1".into());
    new.apply(&del).unwrap();
    assert!(open(&r).get(Table::Operations, "op-1").unwrap().is_none());
    let ttl: i64 = ::redis::cmd("PTTL").arg(&key).query(&mut r.conn()).unwrap();
    assert!(ttl > 0, "a tombstone expires");
    new.apply(&put(5)).unwrap();
    // A short announcement does not take the longer ones with it.
    open(&r).announce(Duration::from_millis(1)).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(new.announce(Duration::from_secs(60)).unwrap(), 1, "the old instance's announcement lives on");
}

/// The same on Redis as in the embedded store: a damaged record in each table and one a newer
/// build wrote are skipped and named, everything else loads; the newer one is left as it is and
/// this build's write to its key is refused as a conflict, never over it.
#[test]
fn redis_a_damaged_or_newer_record_is_skipped_named_and_never_overwritten() {
    if !available("redis_a_damaged_or_newer_record_is_skipped_named_and_never_overwritten") {
        return;
    }
    let r = RedisServer::start();
    let mut st = open(&r);
    st.apply(&all_changes()).unwrap();
    let mut conn = r.conn();
    let mut bad = Vec::new();
    for c in &all_changes().changes {
        let key = format!("damaged-{}", c.table.as_str());
        let mut bytes = format::MAGIC.to_vec();
        bytes.push(format::CURRENT as u8);
        bytes.extend_from_slice(&[0xff; 7]);
        ::redis::cmd("HSET").arg(record_key(c.table, &key)).arg("v").arg(bytes).arg("ver").arg(1).query::<()>(&mut conn).unwrap();
        bad.push((c.table, key, SkipReason::Damaged));
    }
    let mut newer = format::MAGIC.to_vec();
    newer.push((format::CURRENT + 1) as u8);
    newer.extend_from_slice(b"a newer build's record");
    let newer_key = record_key(Table::Incidents, "=newer.example");
    ::redis::cmd("HSET").arg(&newer_key).arg("v").arg(&newer).arg("ver").arg(1).query::<()>(&mut conn).unwrap();
    bad.push((Table::Incidents, "=newer.example".to_string(), SkipReason::Newer(format::CURRENT + 1)));

    let mut fresh = open(&r);
    let loaded = fresh.load().unwrap();
    check(&loaded);
    let mut named: Vec<(Table, String, SkipReason)> = loaded.skipped.iter().map(|s| (s.table, s.key.clone(), s.why)).collect();
    named.sort_by(|a, b| a.1.cmp(&b.1));
    bad.sort_by(|a, b| a.1.cmp(&b.1));
    assert_eq!(named, bad);
    // This build's write to the newer record's key is refused, and the bytes stay.
    let mut c = Changes::default();
    c.put("=newer.example".into(), Record::Incidents(Box::default()));
    assert!(matches!(fresh.apply(&c), Err(StoreError::Conflict { .. })), "a newer build's record is never written over");
    let raw: Vec<u8> = ::redis::cmd("HGET").arg(&newer_key).arg("v").query(&mut conn).unwrap();
    assert_eq!(raw, newer);
}

/// A start-up load reads the decided chains a page at a time and holds only the newest (see
/// `DecidedBound`); a key the scan returns twice is one chain; a load without a bound reads all.
#[test]
fn redis_a_bounded_load_keeps_the_newest_decided_chains() {
    if !available("redis_a_bounded_load_keeps_the_newest_decided_chains") {
        return;
    }
    let r = RedisServer::start();
    let n = 2500;
    open(&r).apply(&many_decided(n)).unwrap();
    check_bounded_load(&mut open(&r), n);
}

/// A write round goes over a connection of its own (see `round_socket`): made as the endpoint says, with
/// an ACL user's name and password and the database, so a record written lands in that database
/// and is read back, and a change through the apply script as well.
#[test]
fn redis_write_rounds_connect_as_the_endpoint_says_user_password_and_database() {
    if !available("redis_write_rounds_connect_as_the_endpoint_says_user_password_and_database") {
        return;
    }
    let r = RedisServer::start_with(false, Some("planted-admin-pw-5"));
    let mut admin = r.conn();
    let _: () = ::redis::cmd("ACL")
        .arg("SETUSER")
        .arg("writer")
        .arg("on")
        .arg(">planted-writer-pw-6")
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .query(&mut admin)
        .unwrap();
    let url = format!("redis://writer:planted-writer-pw-6@127.0.0.1:{}/3", r.port);
    let mut st = RedisStore::open(settings(&url)).expect("open as the ACL user");
    st.announce(Duration::from_millis(1)).expect("announce");
    let mut c = Changes::default();
    // A new key (a `SET … NX` on the round's connection) and one through the apply script.
    c.put("op-wire".into(), Record::Operation([7; 16]));
    c.put(incident_key(), one_incident(1).changes.remove(0).value.unwrap());
    st.apply(&c).unwrap();
    let mut in_db = |db: i64, key: &str| -> bool {
        let _: () = ::redis::cmd("SELECT").arg(db).query(&mut admin).unwrap();
        ::redis::cmd("EXISTS").arg(key).query::<u64>(&mut admin).unwrap() == 1
    };
    for key in [record_key(Table::Operations, "op-wire"), record_key(Table::Incidents, &incident_key())] {
        assert!(in_db(3, &key) && !in_db(0, &key), "{key}: written into database 3 alone");
    }
    assert!(matches!(st.get(Table::Operations, "op-wire").unwrap(), Some(Record::Operation(t)) if t == [7; 16]));
    assert!(st.get(Table::Incidents, &incident_key()).unwrap().is_some());
}
