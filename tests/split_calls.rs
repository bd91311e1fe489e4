//! Issue 34: many agents on one server never swap evidence.
//!
//! Recordings shaped like a busy 2026-07-28 deployment: 2–5 agents (each its own `service.name`)
//! call one tool on one MCP server, each numbering its requests from 1 as the SDKs do (and
//! sometimes starting again at 1 on a second connection); the server does not continue their
//! traces, so every call's server half is a trace of its own (an HTTP `POST /mcp` root span over
//! the MCP SERVER span, or the MCP span alone, plus the `tools/list` the 2026-07-28 server runs
//! under the call's request id); a tool error is recorded on the server span only, as the SDKs
//! record it. Each exporter (every agent's and the server's) flushes 0–6 s after a span ends.
//!
//! Every recording is run twice through the same engine: as the service meets it (each span
//! arrives at its end plus its exporter's delay; the engine steps at every moment it is due in
//! between, as the service's driver does) and as `mcp-health replay` reads it (the export
//! requests in a random line order, span time as the clock, drained at the end — the loop of
//! `service::replay::replay_until`). Properties:
//! - no verdict, of any revision, rests on another call's server half;
//! - a call's final verdict either rests on its own server half, or is partial
//!   (`ambiguous_server_half`) and the join that was not made is counted (`mcp_health.joins`);
//! - a server half decided alone is no attempt of its own (its client half is the attempt);
//! - the final verdicts of serve and replay are the same.
//!
//! Then the four cases the issue names, as fixed tests with their expected verdicts.

use std::collections::BTreeMap;

use mcp_health::engine::{Decided, Engine, EngineConfig};
use mcp_health::evidence::time::Moment;
use mcp_health::normalize::normalize_request;
use mcp_health::testing::correlate::{ChainLimits, SessionLimits};
use mcp_health::verdict::{DecidedBy, HealthState, Partial, SpanKind as EvidenceKind, Verdict};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{span::SpanKind, status::StatusCode, ResourceSpans, ScopeSpans, Span, Status};
use proptest::prelude::*;

/// Span time of the recordings' start (any fixed epoch: the engine runs on the span clock).
const T0_MS: u64 = 1_780_000_000_000;
const SERVER: &str = "shared-server";

/// How the spans are written: the `mcp` SDK 2.x's built-in tracing (client spans name neither
/// tool attribute nor server, server spans have no session), or the OpenTelemetry MCP
/// conventions (tool, server address and, on 2025-11-25, the session id on both sides).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Style {
    Sdk,
    Semconv,
}

/// One generated call and the ids of its spans.
#[derive(Clone, Debug)]
struct Call {
    agent: usize,
    /// The agent's connection (its request ids start again at 1 on a new one).
    conn: usize,
    rid: u32,
    start_ms: u64,
    dur_ms: u64,
    /// The tool answered `isError` (seen on the server span only).
    fails: bool,
    /// The server half is an HTTP root span over the MCP span (else the MCP span alone).
    http_root: bool,
    client: ([u8; 16], [u8; 8]),
    server: ([u8; 16], [u8; 8]),
}

/// A generated recording: its calls, how they are written, and when each exporter flushes.
#[derive(Clone, Debug)]
struct Recording {
    calls: Vec<Call>,
    style: Style,
    sessions: bool,
    /// Each agent's exporter delay, then the server's (ms after a span ends).
    delays: Vec<u64>,
}

/// One span as an exporter sends it: who, with which scope, when it arrives.
struct Sent {
    exporter: usize,
    service: String,
    scope: &'static str,
    arrival_ms: u64,
    span: Span,
}

fn kv(k: &str, v: &str) -> KeyValue {
    KeyValue { key: k.into(), value: Some(AnyValue { value: Some(any_value::Value::StringValue(v.into())) }), ..Default::default() }
}

fn kv_int(k: &str, v: i64) -> KeyValue {
    KeyValue { key: k.into(), value: Some(AnyValue { value: Some(any_value::Value::IntValue(v)) }), ..Default::default() }
}

#[allow(clippy::too_many_arguments)]
fn span(
    ids: ([u8; 16], [u8; 8]),
    parent: Option<[u8; 8]>,
    name: &str,
    kind: SpanKind,
    at: (u64, u64),
    attrs: Vec<KeyValue>,
    error: bool,
) -> Span {
    Span {
        trace_id: ids.0.to_vec(),
        span_id: ids.1.to_vec(),
        parent_span_id: parent.map(|p| p.to_vec()).unwrap_or_default(),
        name: name.into(),
        kind: kind as i32,
        start_time_unix_nano: (T0_MS + at.0) * 1_000_000,
        end_time_unix_nano: (T0_MS + at.1) * 1_000_000,
        attributes: attrs,
        status: error.then(|| Status { code: StatusCode::Error as i32, ..Default::default() }),
        ..Default::default()
    }
}

fn ids(kind: u8, n: usize) -> ([u8; 16], [u8; 8]) {
    let mut t = [kind; 16];
    t[8..16].copy_from_slice(&(n as u64).to_be_bytes());
    let mut s = [kind; 8];
    s[4..8].copy_from_slice(&(n as u32).to_be_bytes());
    (t, s)
}

impl Recording {
    fn session(&self, c: &Call) -> Option<String> {
        (self.sessions && self.style == Style::Semconv).then(|| format!("sess-{}-{}", c.agent, c.conn))
    }

    /// Every span of the recording, with the moment it reaches the service.
    fn sent(&self) -> Vec<Sent> {
        let server_exporter = self.delays.len() - 1;
        let mut out = Vec::new();
        for (n, c) in self.calls.iter().enumerate() {
            let (s0, s1) = (c.start_ms, c.start_ms + c.dur_ms);
            let rid = c.rid.to_string();
            let session = self.session(c);
            // The client's span.
            let mut attrs = vec![kv("mcp.method.name", "tools/call"), kv("jsonrpc.request.id", &rid)];
            let (name, scope) = match self.style {
                Style::Sdk => ("MCP send tools/call create", "mcp-python-sdk"),
                Style::Semconv => {
                    attrs.extend([kv("gen_ai.tool.name", "create"), kv("server.address", SERVER), kv_int("server.port", 8080)]);
                    ("tools/call create", "mcp-conventions")
                }
            };
            if let Some(sid) = &session {
                attrs.push(kv("mcp.session.id", sid));
            }
            out.push(Sent {
                exporter: c.agent,
                service: format!("agent-{}", c.agent),
                scope,
                arrival_ms: s1 + self.delays[c.agent],
                span: span(c.client, None, name, SpanKind::Client, (s0, s1), attrs, false),
            });
            // The server's half, a trace of its own.
            let (m0, m1) = (s0 + 2 + (n as u64 % 3), s1 - 2 - (n as u64 % 2));
            let server_arrival = m1 + 1 + self.delays[server_exporter];
            let mut attrs = vec![
                kv("mcp.method.name", "tools/call"),
                kv("jsonrpc.request.id", &rid),
                kv("gen_ai.tool.name", "create"),
                kv("gen_ai.operation.name", "execute_tool"),
            ];
            if c.fails {
                attrs.push(kv("error.type", "tool_error"));
            }
            if let Some(sid) = &session {
                attrs.push(kv("mcp.session.id", sid));
            } else {
                attrs.push(kv("mcp.protocol.version", "2026-07-28"));
            }
            let scope = if self.style == Style::Sdk { "mcp-python-sdk" } else { "mcp-conventions" };
            let parent = c.http_root.then(|| {
                let http = (
                    c.server.0,
                    [0xee, c.server.1[1], c.server.1[2], c.server.1[3], c.server.1[4], c.server.1[5], c.server.1[6], c.server.1[7]],
                );
                out.push(Sent {
                    exporter: server_exporter,
                    service: SERVER.into(),
                    scope: "opentelemetry.instrumentation.asgi",
                    arrival_ms: server_arrival,
                    span: span(
                        http,
                        None,
                        "POST /mcp",
                        SpanKind::Server,
                        (m0 - 1, m1 + 1),
                        vec![kv("http.method", "POST"), kv("http.target", "/mcp"), kv_int("http.status_code", 200)],
                        false,
                    ),
                });
                http.1
            });
            out.push(Sent {
                exporter: server_exporter,
                service: SERVER.into(),
                scope,
                arrival_ms: server_arrival,
                span: span(c.server, parent, "tools/call create", SpanKind::Server, (m0, m1), attrs, c.fails),
            });
            if self.style == Style::Sdk && !self.sessions {
                // The 2026-07-28 server lists its tools under the call's request id (to check the
                // call's headers against the tool's schema): a server span of `tools/list`, a
                // trace of its own, no client half anywhere.
                let list = ([0x1f; 16], [0x1f, n as u8, (n >> 8) as u8, 1, 2, 3, 4, 5]);
                let mut list_trace = list.0;
                list_trace[0..8].copy_from_slice(&(n as u64).to_be_bytes());
                out.push(Sent {
                    exporter: server_exporter,
                    service: SERVER.into(),
                    scope,
                    arrival_ms: server_arrival,
                    span: span(
                        (list_trace, list.1),
                        None,
                        "tools/list",
                        SpanKind::Server,
                        (m0 - 1, m0),
                        vec![kv("mcp.method.name", "tools/list"), kv("jsonrpc.request.id", &rid)],
                        false,
                    ),
                });
            }
        }
        out
    }

    /// The export requests each exporter sends: its spans that arrive together, in one request.
    fn requests(&self) -> Vec<(u64, ExportTraceServiceRequest)> {
        let mut groups: BTreeMap<(u64, usize), Vec<Sent>> = BTreeMap::new();
        for s in self.sent() {
            groups.entry((s.arrival_ms, s.exporter)).or_default().push(s);
        }
        groups
            .into_iter()
            .map(|((at, _), spans)| {
                let service = spans[0].service.clone();
                let mut scopes: BTreeMap<&'static str, Vec<Span>> = BTreeMap::new();
                for s in spans {
                    scopes.entry(s.scope).or_default().push(s.span);
                }
                let req = ExportTraceServiceRequest {
                    resource_spans: vec![ResourceSpans {
                        resource: Some(Resource { attributes: vec![kv("service.name", &service)], ..Default::default() }),
                        scope_spans: scopes
                            .into_iter()
                            .map(|(scope, spans)| ScopeSpans {
                                scope: Some(InstrumentationScope { name: scope.into(), ..Default::default() }),
                                spans,
                                ..Default::default()
                            })
                            .collect(),
                        ..Default::default()
                    }],
                };
                (at, req)
            })
            .collect()
    }
}

fn engine() -> Engine {
    // The defaults: `decision_wait` 2 s, `server_half_wait` 5 s.
    Engine::new(EngineConfig::new(ChainLimits::default(), SessionLimits::default()))
}

/// What the engine said, and its join counters at the end.
struct Run {
    verdicts: Vec<Verdict>,
    ambiguous: u64,
}

impl Run {
    /// The latest verdict of each call (by the span it hangs under).
    fn finals(&self) -> BTreeMap<[u8; 8], &Verdict> {
        let mut out: BTreeMap<[u8; 8], &Verdict> = BTreeMap::new();
        for v in &self.verdicts {
            out.insert(v.span_id, v);
        }
        // A server half first decided alone and later joined by its client half: the joined
        // verdict supersedes it (it rests on the same server span).
        let joined: Vec<[u8; 8]> =
            self.verdicts.iter().filter(|v| v.chain.has(EvidenceKind::Client)).filter_map(|v| v.server_span_id).collect();
        out.retain(|_, v| v.chain.has(EvidenceKind::Client) || !v.server_span_id.is_some_and(|s| joined.contains(&s)));
        out
    }
}

fn collect(out: Vec<Decided>, e: &Engine) -> Run {
    let verdicts =
        out.into_iter().filter_map(|d| if let Decided::Call(v) = d { Some(std::sync::Arc::unwrap_or_clone(v)) } else { None }).collect();
    let st = &e.chains().cross.stats;
    Run { verdicts, ambiguous: st.ambiguous + st.http_ambiguous }
}

/// As the service meets the recording: each request at its arrival, the engine stepped at every
/// moment it falls due in between (the driver sleeps until `next_due`), to the end.
fn serve(rec: &Recording) -> Run {
    let (out, e) = serve_requests(&rec.requests());
    collect(out, &e)
}

/// [`serve`] for export requests and their arrival (ms), in arrival order: what the engine said,
/// and the engine.
fn serve_requests(reqs: &[(u64, ExportTraceServiceRequest)]) -> (Vec<Decided>, Engine) {
    let mut e = engine();
    let mut out = Vec::new();
    let at = |ms: u64| Moment::from_nanos((T0_MS + ms) * 1_000_000);
    let mut last = 0;
    for (ms, req) in reqs {
        while let Some(d) = e.next_due().filter(|d| *d <= at(*ms)) {
            e.tick(d, &mut out);
        }
        e.ingest(normalize_request(req), at(*ms), &mut out);
        e.tick(at(*ms), &mut out);
        last = *ms;
    }
    let end = at(last + 120_000);
    while let Some(d) = e.next_due().filter(|d| *d <= end) {
        e.tick(d, &mut out);
    }
    e.tick(end, &mut out);
    (out, e)
}

/// As `mcp-health replay` reads the recording: the requests in the order `seed` shuffles them,
/// the clock the latest span end seen, a drain at the end.
fn replay(rec: &Recording, seed: u64) -> Run {
    let mut reqs: Vec<ExportTraceServiceRequest> = rec.requests().into_iter().map(|(_, r)| r).collect();
    let mut x = seed | 1;
    for i in (1..reqs.len()).rev() {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        reqs.swap(i, (x >> 33) as usize % (i + 1));
    }
    let mut e = engine();
    let mut out = Vec::new();
    let mut now = Moment::ZERO;
    for req in &reqs {
        let batch = normalize_request(req);
        let latest = batch.evidence.iter().map(|e| e.end_ns.max(e.start_ns)).max().unwrap_or(0);
        now = now.max(Moment::from_nanos(latest));
        e.ingest(batch, now, &mut out);
        e.tick(now, &mut out);
    }
    e.drain(DecidedBy::Replay, now, &mut out);
    e.tick(now, &mut out);
    collect(out, &e)
}

/// Every violation of the properties in the module documentation, for one run.
fn violations(rec: &Recording, run: &Run) -> Vec<String> {
    let mut bad = Vec::new();
    let call_of_client: BTreeMap<[u8; 8], &Call> = rec.calls.iter().map(|c| (c.client.1, c)).collect();
    let call_of_server: BTreeMap<[u8; 8], &Call> = rec.calls.iter().map(|c| (c.server.1, c)).collect();
    for v in &run.verdicts {
        if let (Some(c), Some(s)) = (call_of_client.get(&v.span_id), v.server_span_id) {
            if s != c.server.1 {
                bad.push(format!("agent {} call {} (rid {}) rests on another call's server half: {v:?}", c.agent, c.start_ms, c.rid));
            }
        }
    }
    let finals = run.finals();
    let mut unjoined = 0;
    for c in &rec.calls {
        let Some(v) = finals.get(&c.client.1) else {
            bad.push(format!("agent {} call at {} ms has no verdict", c.agent, c.start_ms));
            continue;
        };
        match v.server_span_id {
            Some(_) => {
                let want = if c.fails { HealthState::ToolFailed } else { HealthState::Unverified };
                if v.state != want {
                    bad.push(format!("agent {} call at {} ms joined but {:?}, want {want:?}", c.agent, c.start_ms, v.state));
                }
            }
            None => {
                unjoined += 1;
                if v.partial != Some(Partial::AmbiguousServerHalf) || v.state == HealthState::Healthy {
                    bad.push(format!("agent {} call at {} ms has no server half and does not say so: {v:?}", c.agent, c.start_ms));
                }
            }
        }
    }
    if unjoined > 0 && run.ambiguous == 0 {
        bad.push(format!("{unjoined} calls without their server half, no ambiguous join counted"));
    }
    for v in finals.values().filter(|v| !v.chain.has(EvidenceKind::Client)) {
        if v.server_span_id.is_some_and(|s| call_of_server.contains_key(&s)) && v.attempt {
            bad.push(format!("a server half decided alone counts as an attempt: {v:?}"));
        }
    }
    bad
}

/// What a final verdict says, as serve and replay must agree on it: state, partial, the server
/// span it rests on, attempt.
type Said = (HealthState, Option<Partial>, Option<[u8; 8]>, bool);

/// What each call's final verdict says.
fn said(run: &Run) -> BTreeMap<[u8; 8], Said> {
    run.finals().into_iter().map(|(k, v)| (k, (v.state, v.partial, v.server_span_id, v.attempt))).collect()
}

prop_compose! {
    /// One agent's calls: ids from 1, sometimes again from 1 on a second connection.
    fn agent_calls(agent: usize)(
        first in 0u64..1_500,
        calls in proptest::collection::vec((0u64..1_200, 20u64..400, any::<bool>(), any::<bool>(), proptest::bool::weighted(0.2)), 1..=3),
    ) -> Vec<Call> {
        let (mut at, mut rid, mut conn) = (first, 0u32, 0usize);
        let mut out = Vec::new();
        for (i, (gap, dur, fails, http_root, reconnect)) in calls.into_iter().enumerate() {
            if i > 0 {
                at += gap;
            }
            if reconnect && i > 0 {
                conn += 1;
                rid = 0;
            }
            rid += 1;
            let n = agent * 16 + i;
            out.push(Call { agent, conn, rid, start_ms: at, dur_ms: dur, fails, http_root, client: ids(0xc0, n), server: ids(0x5e, n) });
            at += dur;
        }
        out
    }
}

fn recording() -> impl Strategy<Value = Recording> {
    (2usize..=5)
        .prop_flat_map(|n| {
            (
                (0..n).map(agent_calls).collect::<Vec<_>>(),
                proptest::collection::vec(0u64..=6_000, n + 1),
                prop_oneof![Just(Style::Sdk), Just(Style::Semconv)],
                any::<bool>(),
            )
        })
        .prop_map(|(calls, delays, style, sessions)| Recording { calls: calls.into_iter().flatten().collect(), style, sessions, delays })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]
    #[test]
    fn no_call_uses_another_calls_server_half_and_serve_equals_replay(rec in recording(), seed in any::<u64>()) {
        let served = serve(&rec);
        let replayed = replay(&rec, seed);
        let bad_serve = violations(&rec, &served);
        prop_assert!(bad_serve.is_empty(), "serve: {bad_serve:#?}\n{rec:#?}");
        let bad_replay = violations(&rec, &replayed);
        prop_assert!(bad_replay.is_empty(), "replay: {bad_replay:#?}\n{rec:#?}");
        prop_assert_eq!(said(&served), said(&replayed), "serve and replay differ:\n{:#?}", rec);
    }
}

// ---- The four cases of the issue --------------------------------------------------------------

/// Two agents' overlapping calls with request id 1 (a tool error on A's, seen by the server span
/// only), the server starting traces of its own, A's exporter a second ahead of B's.
fn two_overlapping(style: Style, sessions: bool, a_first: bool) -> Recording {
    let delays = if a_first { vec![200, 1_200, 300] } else { vec![1_200, 200, 300] };
    Recording { calls: two_calls(110, 320), style, sessions, delays }
}

/// Agent A's call with request id 1 (a tool error on the server) at 100 ms, agent B's with id 1
/// (a success) at `b_start` ms, each `dur` ms long.
fn two_calls(b_start: u64, dur: u64) -> Vec<Call> {
    let call = |agent: usize, start_ms: u64, fails: bool| Call {
        agent,
        conn: 0,
        rid: 1,
        start_ms,
        dur_ms: dur,
        fails,
        http_root: true,
        client: ids(0xc0, agent),
        server: ids(0x5e, agent),
    };
    vec![call(0, 100, true), call(1, b_start, false)]
}

/// The swap the issue found: A's failed call read protocol success from B's server half and B's
/// success read A's tool error, when one exporter flushed a second after the other. Now neither
/// rests on the other's half, in either flush order and either dialect: both calls are partial
/// (`ambiguous_server_half`), A is never greener than unverified, and neither server half counts
/// as an attempt; replay of the same spans says the same.
#[test]
fn two_agents_reusing_a_request_id_never_swap_server_halves() {
    for style in [Style::Sdk, Style::Semconv] {
        for a_first in [true, false] {
            let rec = two_overlapping(style, false, a_first);
            let run = serve(&rec);
            assert_eq!(violations(&rec, &run), Vec::<String>::new(), "{style:?} a_first={a_first}");
            let finals = run.finals();
            for c in &rec.calls {
                let v = finals[&c.client.1];
                assert_eq!(v.server_span_id, None, "{style:?}: overlapping calls cannot be told apart: {v:?}");
                assert_eq!(v.partial, Some(Partial::AmbiguousServerHalf), "{v:?}");
                assert_eq!(v.reason.as_deref(), Some("ambiguous_server_half"), "{v:?}");
                assert!(v.attempt, "the client call is the attempt");
            }
            assert!(run.ambiguous > 0);
            assert_eq!(said(&run), said(&replay(&rec, 7)), "{style:?} a_first={a_first}");
        }
    }
}

/// The same with three calls per agent, and with one agent starting its ids again at 1 on a
/// second connection: every verdict rests on its own server half or on none.
#[test]
fn three_calls_per_agent_and_a_restarted_counter_never_swap_server_halves() {
    for style in [Style::Sdk, Style::Semconv] {
        let mut calls = Vec::new();
        for agent in 0..2 {
            for i in 0..3 {
                let n = agent * 16 + i;
                // Agent 1's third call is on a second connection: id 1 again.
                let rid = if agent == 1 && i == 2 { 1 } else { i as u32 + 1 };
                let start = 100 + i as u64 * 400 + agent as u64 * 15;
                calls.push(Call {
                    agent,
                    conn: usize::from(agent == 1 && i == 2),
                    rid,
                    start_ms: start,
                    dur_ms: 300,
                    fails: (agent + i) % 2 == 0,
                    http_root: i != 1,
                    client: ids(0xc0, n),
                    server: ids(0x5e, n),
                });
            }
        }
        let rec = Recording { calls, style, sessions: false, delays: vec![100, 1_300, 600] };
        let run = serve(&rec);
        assert_eq!(violations(&rec, &run), Vec::<String>::new(), "{style:?}");
        assert_eq!(said(&run), said(&replay(&rec, 11)), "{style:?}");
    }
}

/// Sequential reuse: B's call with id 1 starts 50 ms after A's with id 1 ended. Each server half
/// fits its own client exactly and the other only with clock slack: joined right, in either
/// flush order (before, every half was decided alone).
#[test]
fn sequential_reuse_of_a_request_id_is_joined_right() {
    for style in [Style::Sdk, Style::Semconv] {
        for delays in [vec![200, 1_200, 300], vec![1_200, 200, 300], vec![0, 0, 6_000]] {
            let calls = two_calls(250, 100);
            let rec = Recording { calls, style, sessions: false, delays: delays.clone() };
            let run = serve(&rec);
            assert_eq!(violations(&rec, &run), Vec::<String>::new(), "{style:?} {delays:?}");
            let finals = run.finals();
            let (a, b) = (finals[&rec.calls[0].client.1], finals[&rec.calls[1].client.1]);
            assert_eq!((a.state, a.server_span_id), (HealthState::ToolFailed, Some(rec.calls[0].server.1)), "{style:?} {delays:?}");
            assert_eq!((b.state, b.server_span_id), (HealthState::Unverified, Some(rec.calls[1].server.1)), "{style:?} {delays:?}");
            assert_eq!((a.partial, b.partial), (None, None));
            assert_eq!(said(&run), said(&replay(&rec, 3)));
        }
    }
}

/// With session ids on both sides (2025-11-25), overlapping calls with the same request id are
/// joined right whatever the order of the exports.
#[test]
fn with_session_ids_overlapping_calls_are_joined_right_in_every_order() {
    for a_first in [true, false] {
        let rec = two_overlapping(Style::Semconv, true, a_first);
        for seed in 0..8 {
            for run in [serve(&rec), replay(&rec, seed)] {
                assert_eq!(violations(&rec, &run), Vec::<String>::new());
                let finals = run.finals();
                let (a, b) = (finals[&rec.calls[0].client.1], finals[&rec.calls[1].client.1]);
                assert_eq!((a.state, a.server_span_id), (HealthState::ToolFailed, Some(rec.calls[0].server.1)));
                assert_eq!((b.state, b.server_span_id), (HealthState::Unverified, Some(rec.calls[1].server.1)));
            }
        }
    }
}

/// Two agents' `initialize` refused 401 by the server's HTTP layer (an HTTP server span alone in
/// its trace, no MCP span) while both were in flight; the SDK's client spans say `-32603`. Before,
/// the first client half that fitted took the refusal, so agent B became `needs_auth` with A's
/// 401 (and an authorization incident opened for B). Now neither takes a refusal the other could
/// have sent: both are partial (`ambiguous_server_half`), neither `needs_auth`. Refusals that do
/// not overlap each go to their own request.
#[test]
fn a_refused_request_is_never_given_to_the_wrong_agent() {
    for (b_start, overlapping) in [(110u64, true), (400, false)] {
        for a_delay in [1_200u64, 0] {
            let mut reqs: Vec<(u64, ExportTraceServiceRequest)> = Vec::new();
            for (agent, start) in [(0usize, 100u64), (1, b_start)] {
                let (client, http) = (ids(0xc0, agent), ids(0x4e, agent));
                let attrs = vec![
                    kv("mcp.method.name", "initialize"),
                    kv("jsonrpc.request.id", "1"),
                    kv("error.type", "-32603"),
                    kv("rpc.response.status_code", "-32603"),
                ];
                let c = span(client, None, "MCP send initialize", SpanKind::Client, (start, start + 60), attrs, true);
                let h = span(
                    http,
                    None,
                    "POST /mcp",
                    SpanKind::Server,
                    (start + 5, start + 8),
                    vec![kv("http.method", "POST"), kv("http.target", "/mcp"), kv_int("http.status_code", 401)],
                    false,
                );
                let delay = if agent == 0 { a_delay } else { 1_200 - a_delay };
                reqs.push((start + 60 + delay, one(&format!("agent-{agent}"), "mcp-python-sdk", c)));
                reqs.push((start + 300, one(SERVER, "opentelemetry.instrumentation.asgi", h)));
            }
            reqs.sort_by_key(|(at, _)| *at);
            let (out, e) = serve_requests(&reqs);
            let incidents = out.iter().filter(|d| matches!(d, Decided::Incident(_))).count();
            let run = collect(out, &e);
            let finals = run.finals();
            for agent in 0..2 {
                let v = finals[&ids(0xc0, agent).1];
                if overlapping {
                    assert_ne!(v.state, HealthState::NeedsAuth, "agent {agent} a_delay={a_delay}: another's 401 taken: {v:?}");
                    assert_eq!(v.partial, Some(Partial::AmbiguousServerHalf), "agent {agent}: {v:?}");
                } else {
                    assert_eq!(v.state, HealthState::NeedsAuth, "agent {agent} a_delay={a_delay}: its own 401: {v:?}");
                    assert_eq!(v.partial, None, "{v:?}");
                }
            }
            if overlapping {
                assert!(run.ambiguous > 0, "the refusal not joined is counted");
                assert_eq!(incidents, 0, "no authorization incident from a refusal nobody can place");
            }
        }
    }
}

fn one(service: &str, scope: &str, span: Span) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource { attributes: vec![kv("service.name", service)], ..Default::default() }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope { name: scope.into(), ..Default::default() }),
                spans: vec![span],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}
