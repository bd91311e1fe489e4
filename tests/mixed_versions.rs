//! A rolling upgrade on one Redis: an instance of this build next to one that speaks the
//! previous state protocol (0, release 0.1.0's: bare records, every client half published, no
//! split marks — `storage.state_protocol: 0`). Calls split between them, the client half on one
//! and the server half (a trace of its own) on the other, in both directions, get the verdicts
//! one process gives; while the old protocol is spoken, every record in the store is one 0.1.0
//! reads (no frame, no split mark).
//!
//! Without the announcement the new instance would hold its client halves back until a server
//! is marked, which the old one never does: the call would stay `unverified` where one process
//! says `tool_failed`.
//!
//! Prints `SKIPPED: …` without `redis-server`, except under `CI`.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use mcp_health::engine::{Decided, Engine, EngineConfig};
use mcp_health::evidence::time::Moment;
use mcp_health::normalize::normalize_request;
use mcp_health::testing::correlate::{ChainLimits, SessionLimits};
use mcp_health::testing::state::format::MAGIC;
use mcp_health::testing::state::redis::RedisSettings;
use mcp_health::testing::state::StoreHandle;
use mcp_health::verdict::{HealthState, SpanKind as EvidenceKind, Verdict};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{span::SpanKind, status::StatusCode, ResourceSpans, ScopeSpans, Span, Status};
use support::redis_server::{available, RedisServer};

const T0_MS: u64 = 1_780_000_000_000;
const SERVER: &str = "shared-server";

fn kv(k: &str, v: &str) -> KeyValue {
    KeyValue { key: k.into(), value: Some(AnyValue { value: Some(any_value::Value::StringValue(v.into())) }), ..Default::default() }
}

fn kv_int(k: &str, v: i64) -> KeyValue {
    KeyValue { key: k.into(), value: Some(AnyValue { value: Some(any_value::Value::IntValue(v)) }), ..Default::default() }
}

fn request(service: &str, span: Span) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource { attributes: vec![kv("service.name", service)], ..Default::default() }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope { name: "mcp-conventions".into(), ..Default::default() }),
                spans: vec![span],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

/// Which instance a half goes to.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum To {
    New,
    Old,
}

/// One split call: its client half and its server half (a trace of its own, a tool error when
/// `fails`), each sent to one instance, arriving at `at_ms`.
struct SplitCall {
    n: u8,
    at_ms: u64,
    fails: bool,
    client_to: To,
    server_to: To,
}

impl SplitCall {
    fn ids(&self, side: u8) -> ([u8; 16], [u8; 8]) {
        ([side, self.n, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, self.n], [side, self.n, 1, 2, 3, 4, 5, self.n])
    }

    /// (instance, arrival ms, request) for each half.
    fn halves(&self) -> Vec<(To, u64, ExportTraceServiceRequest)> {
        let rid = format!("{}", self.n);
        let (s0, s1) = (self.at_ms, self.at_ms + 40);
        let at = |ms: u64| (T0_MS + ms) * 1_000_000;
        let mk = |ids: ([u8; 16], [u8; 8]), kind: SpanKind, (a, b): (u64, u64), attrs: Vec<KeyValue>, error: bool| Span {
            trace_id: ids.0.to_vec(),
            span_id: ids.1.to_vec(),
            name: "tools/call create".into(),
            kind: kind as i32,
            start_time_unix_nano: at(a),
            end_time_unix_nano: at(b),
            attributes: attrs,
            status: error.then(|| Status { code: StatusCode::Error as i32, ..Default::default() }),
            ..Default::default()
        };
        let client = mk(
            self.ids(0xc0),
            SpanKind::Client,
            (s0, s1),
            vec![
                kv("mcp.method.name", "tools/call"),
                kv("jsonrpc.request.id", &rid),
                kv("gen_ai.tool.name", "create"),
                kv("server.address", SERVER),
                kv_int("server.port", 8080),
            ],
            false,
        );
        let mut attrs = vec![
            kv("mcp.method.name", "tools/call"),
            kv("jsonrpc.request.id", &rid),
            kv("gen_ai.tool.name", "create"),
            kv("gen_ai.operation.name", "execute_tool"),
            kv("mcp.protocol.version", "2026-07-28"),
        ];
        if self.fails {
            attrs.push(kv("error.type", "tool_error"));
        }
        let server = mk(self.ids(0x5e), SpanKind::Server, (s0 + 3, s1 - 3), attrs, self.fails);
        vec![(self.client_to, s1 + 5, request(&format!("agent-{}", self.n), client)), (self.server_to, s1 + 5, request(SERVER, server))]
    }
}

fn calls() -> Vec<SplitCall> {
    vec![
        // Client half on the new instance, server half on the old one.
        SplitCall { n: 1, at_ms: 1_000, fails: true, client_to: To::New, server_to: To::Old },
        // And the other way round.
        SplitCall { n: 2, at_ms: 12_000, fails: true, client_to: To::Old, server_to: To::New },
        SplitCall { n: 3, at_ms: 24_000, fails: false, client_to: To::New, server_to: To::Old },
        SplitCall { n: 4, at_ms: 36_000, fails: false, client_to: To::Old, server_to: To::New },
    ]
}

fn config(store: Option<StoreHandle>) -> EngineConfig {
    let mut cfg = EngineConfig::new(ChainLimits::default(), SessionLimits::default());
    cfg.store = store;
    cfg
}

fn redis_store(r: &RedisServer, protocol: Option<u32>) -> StoreHandle {
    let s = StoreHandle::open_redis(RedisSettings {
        endpoint: r.url(),
        timeout: Duration::from_secs(2),
        retry_after: Duration::from_millis(200),
        tombstone_ttl: Duration::from_secs(60),
        remember_for: Duration::from_secs(3600),
        record_life: Duration::from_secs(360),
    })
    .unwrap();
    if let Some(p) = protocol {
        s.speak(p);
    }
    s
}

/// Step `engines` every 50 ms from the first arrival to two minutes past the last, each request
/// ingested by its instance at its arrival.
fn run(engines: &mut [(To, Engine)], reqs: &mut [(To, u64, ExportTraceServiceRequest)]) -> Vec<Verdict> {
    reqs.sort_by_key(|(_, at, _)| *at);
    let at = |ms: u64| Moment::from_nanos((T0_MS + ms) * 1_000_000);
    let end = reqs.last().map_or(0, |r| r.1) + 120_000;
    let mut out = Vec::new();
    let mut next = 0;
    let mut ms = reqs.first().map_or(0, |r| r.1);
    while ms <= end {
        while next < reqs.len() && reqs[next].1 <= ms {
            let (to, _, req) = &reqs[next];
            for (who, e) in engines.iter_mut() {
                if who == to {
                    e.ingest(normalize_request(req), at(ms), &mut out);
                }
            }
            next += 1;
        }
        for (_, e) in engines.iter_mut() {
            e.tick(at(ms), &mut out);
        }
        ms += 50;
    }
    for (_, e) in engines.iter_mut() {
        e.flush_store(at(end), &mut out);
    }
    out.into_iter().filter_map(|d| if let Decided::Call(v) = d { Some(std::sync::Arc::unwrap_or_clone(v)) } else { None }).collect()
}

/// Each call's last word, by its client span: a server half decided alone and later joined by
/// its client half is superseded by the joined verdict (it rests on the same server span).
fn finals(verdicts: &[Verdict]) -> BTreeMap<[u8; 8], (HealthState, bool)> {
    let joined: Vec<[u8; 8]> = verdicts.iter().filter(|v| v.chain.has(EvidenceKind::Client)).filter_map(|v| v.server_span_id).collect();
    let mut out = BTreeMap::new();
    for v in verdicts {
        if !v.chain.has(EvidenceKind::Client) && v.server_span_id.is_some_and(|s| joined.contains(&s)) {
            continue;
        }
        out.insert(v.span_id, (v.state, v.chain.has(EvidenceKind::Server)));
    }
    out
}

/// One engine with no store, given every half.
fn one_process() -> BTreeMap<[u8; 8], (HealthState, bool)> {
    let mut reqs: Vec<_> = calls().iter().flat_map(SplitCall::halves).map(|(_, at, r)| (To::New, at, r)).collect();
    let mut engines = [(To::New, Engine::new(config(None)))];
    finals(&run(&mut engines, &mut reqs))
}

/// Every record's bytes in the store, by key, and whether it is the hash releases 0.1.0 and 0.2.0
/// write (`v`, `ver`) rather than one string (its version, `:`, its bytes).
fn records_with_layout(r: &RedisServer) -> Vec<(String, Vec<u8>, bool)> {
    let mut conn = r.conn();
    let keys: Vec<String> = redis::cmd("KEYS").arg("mcp-health:*").query(&mut conn).unwrap();
    let mut out = Vec::new();
    for k in keys {
        if k.ends_with(":protocols") || k.ends_with(":version") || k.contains(":lease:") || k.contains(":index:") {
            continue;
        }
        let kind: String = redis::cmd("TYPE").arg(&k).query(&mut conn).unwrap();
        match kind.as_str() {
            "hash" => {
                if let Some(v) = redis::cmd("HGET").arg(&k).arg("v").query::<Option<Vec<u8>>>(&mut conn).unwrap() {
                    out.push((k, v, true));
                }
            }
            "string" => {
                let v: Vec<u8> = redis::cmd("GET").arg(&k).query(&mut conn).unwrap();
                // A tombstone is the version alone.
                if let Some(at) = v.iter().position(|b| *b == b':') {
                    out.push((k, v[at + 1..].to_vec(), false));
                }
            }
            other => panic!("{k} is a {other}"),
        }
    }
    out
}

fn records(r: &RedisServer) -> Vec<(String, Vec<u8>)> {
    records_with_layout(r).into_iter().map(|(k, v, _)| (k, v)).collect()
}

#[test]
fn split_calls_between_an_instance_of_the_previous_protocol_and_this_one_join_both_ways() {
    if !available("split_calls_between_an_instance_of_the_previous_protocol_and_this_one_join_both_ways") {
        return;
    }
    let reference = one_process();
    assert_eq!(reference.len(), 4, "one process: one verdict per call: {reference:#?}");
    assert!(reference.values().all(|(_, server)| *server), "one process joins every call: {reference:#?}");

    let r = RedisServer::start();
    let old = Engine::new(config(Some(redis_store(&r, Some(0)))));
    let new = Engine::new(config(Some(redis_store(&r, None))));
    let mut engines = [(To::New, new), (To::Old, old)];
    let mut reqs: Vec<_> = calls().iter().flat_map(SplitCall::halves).collect();
    let verdicts = run(&mut engines, &mut reqs);
    let got = finals(&verdicts);
    assert_eq!(got, reference, "the mixed cluster says what one process says: {verdicts:#?}");

    // What the store holds is what 0.1.0 reads: bare records, no split mark.
    let recs = records(&r);
    assert!(!recs.is_empty());
    for (k, v) in &recs {
        assert!(!v.starts_with(&MAGIC), "{k} is framed: 0.1.0 could not read it");
        assert!(!k.starts_with("mcp-health:split_servers:"), "{k}: 0.1.0 knows no split marks");
    }
}

/// An instance of release 0.2.0 (state protocol 1, which it announces) next to this build: the
/// calls join as in one process, and every record is a hash of framed bytes, what 0.2.0 reads —
/// none of this build's one-string records, which 0.2.0 would fail to read (`WRONGTYPE`).
#[test]
fn split_calls_between_an_instance_of_0_2_0_and_this_one_join_and_every_record_is_one_it_reads() {
    if !available("split_calls_between_an_instance_of_0_2_0_and_this_one_join_and_every_record_is_one_it_reads") {
        return;
    }
    let reference = one_process();
    let r = RedisServer::start();
    let old = Engine::new(config(Some(redis_store(&r, Some(1)))));
    let new = Engine::new(config(Some(redis_store(&r, None))));
    let mut engines = [(To::New, new), (To::Old, old)];
    let mut reqs: Vec<_> = calls().iter().flat_map(SplitCall::halves).collect();
    let verdicts = run(&mut engines, &mut reqs);
    assert_eq!(finals(&verdicts), reference, "the mixed cluster says what one process says: {verdicts:#?}");
    let recs = records_with_layout(&r);
    assert!(!recs.is_empty());
    for (k, v, hash) in &recs {
        assert!(*hash, "{k} is one string: 0.2.0 could not read it");
        assert!(v.starts_with(&MAGIC), "{k} is not framed");
    }
}

/// Two instances of this build: records are framed and split marks are used (the cluster speaks
/// this build's protocol), each record one string, and split calls still join.
#[test]
fn two_instances_of_this_build_use_the_current_protocol() {
    if !available("two_instances_of_this_build_use_the_current_protocol") {
        return;
    }
    let reference = one_process();
    let r = RedisServer::start();
    let a = Engine::new(config(Some(redis_store(&r, None))));
    let b = Engine::new(config(Some(redis_store(&r, None))));
    let mut engines = [(To::New, a), (To::Old, b)];
    let mut reqs: Vec<_> = calls().iter().flat_map(SplitCall::halves).collect();
    let verdicts = run(&mut engines, &mut reqs);
    let got = finals(&verdicts);
    let keys: Vec<String> = records(&r).into_iter().map(|(k, _)| k).collect();
    assert_eq!(got, reference, "{got:?} {keys:?}");
    let recs = records(&r);
    assert!(recs.iter().any(|(k, _)| k.starts_with("mcp-health:split_servers:")), "the server was marked");
    assert!(recs.iter().all(|(_, v)| v.starts_with(&MAGIC)), "every record framed with its format version");
    assert!(records_with_layout(&r).iter().all(|(_, _, hash)| !hash), "every record one string");
}

/// A call in flight when its instance stops is decided there at the drain (partial: its server
/// span had not come); its server span then reaches another instance on the same store. That
/// instance finds the call among the store's decided chains and revises it: one attempt,
/// `revision` 1, `tool_failed` — what one process says — not a second verdict of its own.
#[test]
fn a_call_decided_at_one_instances_drain_is_revised_by_another() {
    if !available("a_call_decided_at_one_instances_drain_is_revised_by_another") {
        return;
    }
    let r = RedisServer::start();
    let mut stopping = Engine::new(config(Some(redis_store(&r, None))));
    let mut other = Engine::new(config(Some(redis_store(&r, None))));
    let trace = [0x7a; 16];
    let (client, server) = ([0xc1; 8], [0x5e; 8]);
    let at = |ms: u64| (T0_MS + ms) * 1_000_000;
    let span = |id: [u8; 8], parent: Option<[u8; 8]>, kind: SpanKind, error: bool| {
        let mut attrs = vec![kv("mcp.method.name", "tools/call"), kv("jsonrpc.request.id", "9"), kv("gen_ai.tool.name", "create")];
        if error {
            attrs.push(kv("error.type", "tool_error"));
        }
        Span {
            trace_id: trace.to_vec(),
            span_id: id.to_vec(),
            parent_span_id: parent.map(|p| p.to_vec()).unwrap_or_default(),
            name: "tools/call create".into(),
            kind: kind as i32,
            start_time_unix_nano: at(1_000),
            end_time_unix_nano: at(1_040),
            attributes: attrs,
            status: error.then(|| Status { code: StatusCode::Error as i32, ..Default::default() }),
            ..Default::default()
        }
    };
    let now = |ms: u64| Moment::from_nanos(at(ms));
    let mut out = Vec::new();
    stopping.ingest(normalize_request(&request("agent", span(client, None, SpanKind::Client, false))), now(1_050), &mut out);
    stopping.tick(now(1_100), &mut out);
    // SIGTERM: the drain decides it (partial) and writes it.
    stopping.drain(mcp_health::verdict::DecidedBy::Shutdown, now(1_200), &mut out);
    stopping.flush_store(now(1_200), &mut out);
    let first: Vec<Verdict> =
        out.drain(..).filter_map(|d| if let Decided::Call(v) = d { Some(std::sync::Arc::unwrap_or_clone(v)) } else { None }).collect();
    assert_eq!(first.len(), 1);
    assert_eq!((first[0].revision, first[0].state), (0, HealthState::Unverified), "{:#?}", first[0]);
    // The server span reaches the other instance.
    other.ingest(normalize_request(&request(SERVER, span(server, Some(client), SpanKind::Server, true))), now(3_000), &mut out);
    let mut ms = 3_000;
    while ms < 60_000 {
        ms += 50;
        other.tick(now(ms), &mut out);
    }
    let later: Vec<Verdict> =
        out.into_iter().filter_map(|d| if let Decided::Call(v) = d { Some(std::sync::Arc::unwrap_or_clone(v)) } else { None }).collect();
    assert_eq!(later.len(), 1, "one verdict for the rest of the call: {later:#?}");
    let v = &later[0];
    assert_eq!(v.state, HealthState::ToolFailed, "{v:#?}");
    assert!(v.revision >= 1 && v.supersedes.is_some(), "a revision of the verdict decided at the drain: {v:#?}");
    assert_eq!(other.taken_over(), 1);
}
