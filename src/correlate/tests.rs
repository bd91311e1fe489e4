//! Tests for the correlator: the chain table's clocks and bounds (with explicit `Moment`s, never
//! sleeping) and the assembly of one trace's spans into call attempts.

use crate::evidence::time::Moment;
use std::sync::Arc;
use std::time::Duration;

use super::outbox::FromStore;
use super::*;
use crate::classify::{classify_call, Decision, SessionContext};
use crate::evidence::call::CallEvidence;
use crate::evidence::*;
use crate::normalize::{Activity, NormalizedBatch};
use crate::verdict::{Confidence, DecidedBy, HealthState, Verdict};

// --- builders -------------------------------------------------------------------------------

fn tid(n: u8) -> TraceId {
    [n; 16]
}

fn sid(n: u8) -> SpanId {
    [n; 8]
}

/// A span with evidence nobody can mistake for HTTP-only: a tools/call request span.
fn call_span(trace: u8, span: u8, parent: Option<u8>, side: Side, rid: &str) -> SpanEvidence {
    let mut s = SpanEvidence::new(tid(trace), sid(span));
    s.parent_span_id = parent.map(sid);
    s.side = side;
    s.method = Some(Method::ToolsCall);
    s.tool = Some(Arc::from("create_ticket"));
    s.request_id = Some(rid.into());
    s.start_ns = span as u64 * 100;
    s.end_ns = span as u64 * 100 + 50;
    s
}

fn client(trace: u8, span: u8, rid: &str) -> SpanEvidence {
    call_span(trace, span, None, Side::Client, rid)
}

fn server(trace: u8, span: u8, parent: u8, rid: &str) -> SpanEvidence {
    call_span(trace, span, Some(parent), Side::Server, rid)
}

fn method_span(trace: u8, span: u8, parent: Option<u8>, side: Side, method: &str, rid: Option<&str>) -> SpanEvidence {
    let mut s = call_span(trace, span, parent, side, rid.unwrap_or(""));
    s.method = Some(Method::parse(method));
    s.request_id = rid.map(Into::into);
    if s.method != Some(Method::ToolsCall) {
        s.tool = None;
    }
    s
}

fn verifier(trace: u8, span: u8, parent: Option<u8>, result: OutcomeResult, rid: Option<&str>) -> SpanEvidence {
    let mut s = SpanEvidence::new(tid(trace), sid(span));
    s.parent_span_id = parent.map(sid);
    s.start_ns = span as u64 * 100;
    s.end_ns = span as u64 * 100 + 50;
    s.outcomes.push(OutcomeReceipt {
        result,
        method: VerifierMethod::RowVersion,
        checked_at_ns: s.end_ns,
        request_id: rid.map(Into::into),
        trust: Default::default(),
    });
    s
}

/// An HTTP span on an MCP endpoint (the only HTTP spans the walk takes as evidence).
fn http_span(trace: u8, span: u8, parent: Option<u8>, status: u16) -> SpanEvidence {
    let mut s = SpanEvidence::new(tid(trace), sid(span));
    s.parent_span_id = parent.map(sid);
    s.side = Side::Server;
    s.http_status = Some(status);
    s.http_mcp_endpoint = true;
    s.start_ns = span as u64 * 100;
    s.end_ns = span as u64 * 100 + 50;
    s
}

fn batch(evidence: Vec<SpanEvidence>) -> NormalizedBatch {
    NormalizedBatch { spans: evidence.len() as u64, evidence, ..Default::default() }
}

fn activity(trace: u8, is_root: bool) -> NormalizedBatch {
    NormalizedBatch { activity: vec![Activity { trace_id: tid(trace), is_root }], spans: 1, ..Default::default() }
}

fn limits() -> ChainLimits {
    ChainLimits {
        decision_wait: Duration::from_secs(2),
        max_wait: Duration::from_secs(30),
        max_chains: 1_000,
        max_bytes: 1 << 30,
        max_spans_per_chain: 100,
        late_span_window: Duration::from_secs(300),
        max_decided: 1_000,
        ..ChainLimits::default()
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn ingest(c: &mut Chains, b: NormalizedBatch, now: Moment) -> Vec<DecidedCalls> {
    let mut out = Vec::new();
    c.ingest(b, now, &mut out);
    out
}

fn tick(c: &mut Chains, now: Moment) -> Vec<DecidedCalls> {
    let mut out = Vec::new();
    c.tick(now, &mut out);
    out
}

fn verdicts(d: &DecidedCalls) -> Vec<Verdict> {
    d.calls.iter().map(|c| classify_call(c, &SessionContext::default(), d.decision)).collect()
}

fn one_call(calls: &[CallEvidence], rid: &str) -> CallEvidence {
    let found: Vec<&CallEvidence> = calls.iter().filter(|c| c.request_id.as_deref() == Some(rid)).collect();
    assert_eq!(found.len(), 1, "exactly one call with request id {rid}: {calls:#?}");
    found[0].clone()
}

// --- Chains: clocks -------------------------------------------------------------------------

#[test]
fn chain_with_root_is_decided_only_after_decision_wait_of_quiet() {
    let t0 = Moment::from_nanos(1_000_000_000_000);
    let mut c = Chains::new(limits());
    assert!(ingest(&mut c, batch(vec![client(1, 1, "1")]), t0).is_empty());
    assert_eq!(c.in_flight(), 1);
    assert!(tick(&mut c, t0 + ms(1_999)).is_empty(), "not quiet long enough");
    let out = tick(&mut c, t0 + secs(2));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].trace_id, tid(1));
    assert_eq!(out[0].decision.decided_by, DecidedBy::Quiet);
    assert!(out[0].decision.root_seen);
    assert_eq!(out[0].decision.revision, 0);
    assert!(!out[0].decision.truncated);
    assert_eq!(out[0].calls.len(), 1);
    assert_eq!(c.in_flight(), 0);
    assert_eq!(c.stats.chains_created, 1);
    assert_eq!(c.stats.chains_decided, 1);
    assert!(tick(&mut c, t0 + secs(60)).is_empty(), "decided once");
}

/// Chains not kept for revision pass through limbo for one step. The table keeps its room from
/// step to step (a new one each step would grow from nothing and rehash into fresh pages every
/// time), and gives back the room of a step larger than any the engine takes (a drain's).
#[test]
fn the_limbo_table_keeps_its_room_between_steps_but_not_a_drains() {
    let t0 = Moment::from_nanos(1_000_000_000_000);
    let mut c = Chains::new(ChainLimits { max_decided: 0, max_chains: 100_000, ..limits() });
    let id = |n: u32| {
        let mut t = [7u8; 16];
        t[..4].copy_from_slice(&n.to_be_bytes());
        t
    };
    let span = |n: u32| {
        let mut s = client(1, 1, "1");
        s.trace_id = id(n);
        s
    };
    ingest(&mut c, batch((0..100).map(span).collect()), t0);
    assert_eq!(tick(&mut c, t0 + secs(2)).len(), 100);
    let (held, room) = c.limbo_room();
    assert_eq!(held, 0, "limbo is emptied at the end of the step");
    assert!(room >= 100, "the step's room is kept: {room}");
    ingest(&mut c, batch((100..20_100).map(span).collect()), t0 + secs(3));
    let mut out = Vec::new();
    c.drain(DecidedBy::Shutdown, t0 + secs(3), &mut out);
    assert_eq!(out.len(), 20_000);
    assert_eq!(c.limbo_room(), (0, 0), "a drain's room is given back");
}

#[test]
fn every_new_span_restarts_the_quiet_clock() {
    let t0 = Moment::from_nanos(1_000_000_000_000);
    let mut c = Chains::new(limits());
    ingest(&mut c, batch(vec![client(1, 1, "1")]), t0);
    // A span every second: never two seconds of quiet.
    for i in 1..=10u8 {
        assert!(tick(&mut c, t0 + secs(i as u64)).is_empty(), "decided while spans still arrive ({i}s)");
        ingest(&mut c, batch(vec![server(1, 10 + i, 1, "1")]), t0 + secs(i as u64));
    }
    assert!(tick(&mut c, t0 + ms(11_999)).is_empty());
    let out = tick(&mut c, t0 + secs(12));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].decision.decided_by, DecidedBy::Quiet);
    assert_eq!(out[0].calls[0].span_count, 11);
}

#[test]
fn chain_whose_root_arrives_late_waits_for_quiet_after_the_root() {
    let t0 = Moment::from_nanos(1_000_000_000_000);
    let mut c = Chains::new(limits());
    ingest(&mut c, batch(vec![server(1, 2, 1, "1")]), t0);
    ingest(&mut c, batch(vec![client(1, 1, "1")]), t0 + secs(1));
    assert!(tick(&mut c, t0 + secs(2)).is_empty(), "only one second of quiet since the root");
    let out = tick(&mut c, t0 + secs(3));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].decision.decided_by, DecidedBy::Quiet);
    assert!(out[0].decision.root_seen);
}

#[test]
fn chain_without_root_is_decided_at_max_wait() {
    let t0 = Moment::from_nanos(1_000_000_000_000);
    let mut c = Chains::new(limits());
    ingest(&mut c, batch(vec![server(1, 2, 1, "1")]), t0);
    for at in [secs(2), secs(4), secs(10), secs(29), ms(29_999)] {
        assert!(tick(&mut c, t0 + at).is_empty(), "decided at {at:?} without a root");
    }
    let out = tick(&mut c, t0 + secs(30));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].decision.decided_by, DecidedBy::MaxWait);
    assert!(!out[0].decision.root_seen);
    // Without a root, a max-wait verdict is never high confidence.
    let v = verdicts(&out[0]);
    assert!(v[0].confidence <= Confidence::Medium);
}

#[test]
fn chain_without_root_is_decided_at_max_wait_even_when_ticked_late() {
    let t0 = Moment::from_nanos(1_000_000_000_000);
    let mut c = Chains::new(limits());
    ingest(&mut c, batch(vec![server(1, 2, 1, "1")]), t0);
    let out = tick(&mut c, t0 + secs(45));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].decision.decided_by, DecidedBy::MaxWait);
}

#[test]
fn max_wait_decides_a_chain_that_never_goes_quiet() {
    let t0 = Moment::from_nanos(1_000_000_000_000);
    let mut c = Chains::new(limits());
    ingest(&mut c, batch(vec![client(1, 1, "1")]), t0);
    let mut decided = Vec::new();
    for i in 1..=30u64 {
        decided.extend(tick(&mut c, t0 + secs(i)));
        if c.in_flight() == 0 {
            break;
        }
        ingest(&mut c, batch(vec![server(1, 10 + i as u8, 1, "1")]), t0 + secs(i));
    }
    assert_eq!(decided.len(), 1);
    assert_eq!(decided[0].decision.decided_by, DecidedBy::MaxWait);
    assert!(decided[0].decision.root_seen);
}

#[test]
fn root_reported_as_activity_lets_the_chain_decide_on_quiet() {
    let t0 = Moment::from_nanos(1_000_000_000_000);
    let mut c = Chains::new(limits());
    ingest(&mut c, batch(vec![server(1, 2, 1, "1")]), t0);
    ingest(&mut c, activity(1, true), t0 + ms(500));
    assert!(tick(&mut c, t0 + secs(2)).is_empty(), "activity restarted the quiet clock");
    let out = tick(&mut c, t0 + ms(2_500));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].decision.decided_by, DecidedBy::Quiet);
    assert!(out[0].decision.root_seen);
}

#[test]
fn non_root_activity_keeps_the_chain_open_without_marking_a_root() {
    let t0 = Moment::from_nanos(1_000_000_000_000);
    let mut c = Chains::new(limits());
    ingest(&mut c, batch(vec![server(1, 2, 1, "1")]), t0);
    ingest(&mut c, activity(1, false), t0 + secs(1));
    assert!(tick(&mut c, t0 + secs(5)).is_empty(), "no root: only max_wait decides");
    assert_eq!(tick(&mut c, t0 + secs(30))[0].decision.decided_by, DecidedBy::MaxWait);
}

#[test]
fn activity_of_an_unknown_trace_starts_nothing() {
    let t0 = Moment::from_nanos(1_000_000_000_000);
    let mut c = Chains::new(limits());
    ingest(&mut c, activity(7, true), t0);
    assert_eq!(c.in_flight(), 0);
    assert_eq!(c.stats.chains_created, 0);
}

#[test]
fn root_activity_in_the_same_batch_as_the_first_evidence_counts() {
    // One export holding the agent's (non-MCP) root span and the MCP client span under it.
    let t0 = Moment::from_nanos(1_000_000_000_000);
    let mut c = Chains::new(limits());
    let mut b = batch(vec![call_span(1, 2, Some(1), Side::Client, "1")]);
    b.activity.push(Activity { trace_id: tid(1), is_root: true });
    ingest(&mut c, b, t0);
    let out = tick(&mut c, t0 + secs(2));
    assert_eq!(out.len(), 1, "the root was seen, so two seconds of quiet decide");
    assert_eq!(out[0].decision.decided_by, DecidedBy::Quiet);
    assert!(out[0].decision.root_seen);
}

// --- Chains: revisions ----------------------------------------------------------------------

#[test]
fn late_span_after_decision_yields_the_next_revision() {
    let t0 = Moment::from_nanos(1_000_000_000_000);
    let mut c = Chains::new(limits());
    ingest(&mut c, batch(vec![client(1, 1, "1"), server(1, 2, 1, "1")]), t0);
    let first = tick(&mut c, t0 + secs(2));
    assert_eq!(first.len(), 1);
    assert_eq!(verdicts(&first[0])[0].state, HealthState::Unverified);
    assert_eq!(first[0].decision.revision, 0);

    // The verifier reports three seconds later.
    ingest(&mut c, batch(vec![verifier(1, 3, Some(1), OutcomeResult::Confirmed, None)]), t0 + secs(5));
    assert_eq!(c.stats.late_spans, 1);
    assert_eq!(c.stats.chains_created, 1, "a revision is not a new chain");
    assert!(tick(&mut c, t0 + ms(6_999)).is_empty());
    let second = tick(&mut c, t0 + secs(7));
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].decision.revision, 1);
    assert_eq!(second[0].decision.decided_by, DecidedBy::Quiet, "the root was seen in revision 0");
    assert_eq!(second[0].calls.len(), 1);
    assert_eq!(second[0].calls[0].span_count, 3, "the revision holds the earlier spans too");
    let v = verdicts(&second[0]);
    assert_eq!(v[0].state, HealthState::Healthy);
    assert_eq!(v[0].revision, 1);

    // And again: each late span moves the revision on.
    ingest(&mut c, batch(vec![verifier(1, 4, Some(1), OutcomeResult::Missing, None)]), t0 + secs(8));
    let third = tick(&mut c, t0 + secs(10));
    assert_eq!(third[0].decision.revision, 2);
    assert_eq!(verdicts(&third[0])[0].state, HealthState::FalseSuccess);
    assert_eq!(c.stats.late_spans, 2);
    assert_eq!(c.stats.chains_decided, 3);
}

#[test]
fn late_span_after_the_late_span_window_starts_afresh() {
    let t0 = Moment::from_nanos(1_000_000_000_000);
    let mut c = Chains::new(ChainLimits { late_span_window: secs(10), ..limits() });
    ingest(&mut c, batch(vec![client(1, 1, "1")]), t0);
    assert_eq!(tick(&mut c, t0 + secs(2)).len(), 1);
    let held = c.bytes();
    assert!(held > 0, "a decided chain is held for revision");
    assert!(tick(&mut c, t0 + secs(11)).is_empty());
    assert_eq!(c.stats.decided_expired, 0, "still within the window");
    tick(&mut c, t0 + secs(12));
    assert_eq!(c.stats.decided_expired, 1);
    assert_eq!(c.bytes(), 0, "a forgotten chain frees its bytes");
    ingest(&mut c, batch(vec![verifier(1, 3, Some(1), OutcomeResult::Confirmed, None)]), t0 + secs(13));
    assert_eq!(c.stats.late_spans, 0);
    assert_eq!(c.stats.chains_created, 2);
    let out = tick(&mut c, t0 + secs(43));
    assert_eq!(out[0].decision.revision, 0);
    assert_eq!(out[0].calls[0].span_count, 1);
}

#[test]
fn max_decided_bounds_the_chains_kept_for_revision() {
    let t0 = Moment::from_nanos(1_000_000_000_000);
    let mut c = Chains::new(ChainLimits { max_decided: 2, ..limits() });
    for t in 1..=3u8 {
        ingest(&mut c, batch(vec![client(t, 1, "1")]), t0 + ms(t as u64));
    }
    assert_eq!(tick(&mut c, t0 + secs(3)).len(), 3);
    assert_eq!(c.stats.decided_expired, 1, "the oldest decided chain is forgotten");
    // The forgotten one starts afresh, the others are revised.
    ingest(&mut c, batch(vec![verifier(1, 3, Some(1), OutcomeResult::Confirmed, None)]), t0 + secs(4));
    ingest(&mut c, batch(vec![verifier(3, 3, Some(1), OutcomeResult::Confirmed, None)]), t0 + secs(4));
    assert_eq!(c.stats.late_spans, 1);
    assert_eq!(c.stats.chains_created, 4);
}

#[test]
fn a_reopened_chain_does_not_cut_short_the_window_of_a_younger_chain() {
    let t0 = Moment::from_nanos(1_000_000_000_000);
    let mut c = Chains::new(ChainLimits { late_span_window: secs(10), ..limits() });
    ingest(&mut c, batch(vec![client(1, 1, "1")]), t0);
    assert_eq!(tick(&mut c, t0 + secs(2)).len(), 1); // trace 1 decided at 2 s
    ingest(&mut c, batch(vec![verifier(1, 3, Some(1), OutcomeResult::Confirmed, None)]), t0 + secs(3)); // reopened
    ingest(&mut c, batch(vec![client(2, 1, "1")]), t0 + secs(3));
    assert_eq!(tick(&mut c, t0 + secs(5)).len(), 2); // both decided at 5 s
                                                     // At 12.5 s only trace 1's first decision (at 2 s) is older than the window; the chains
                                                     // decided at 5 s are 7.5 s old and must still be revisable.
    tick(&mut c, t0 + ms(12_500));
    assert_eq!(c.stats.decided_expired, 0);
    ingest(&mut c, batch(vec![verifier(1, 4, Some(1), OutcomeResult::Confirmed, None)]), t0 + secs(13));
    ingest(&mut c, batch(vec![verifier(2, 4, Some(1), OutcomeResult::Confirmed, None)]), t0 + secs(13));
    assert_eq!(c.stats.late_spans, 3);
    let out = tick(&mut c, t0 + secs(15));
    let mut revisions: Vec<(TraceId, u32)> = out.iter().map(|d| (d.trace_id, d.decision.revision)).collect();
    revisions.sort();
    assert_eq!(revisions, vec![(tid(1), 2), (tid(2), 1)]);
}

// --- Chains: bounds -------------------------------------------------------------------------

#[test]
fn max_chains_evicts_the_chain_nearest_its_decision() {
    let t0 = Moment::from_nanos(1_000_000_000_000);
    let mut c = Chains::new(ChainLimits { max_chains: 2, ..limits() });
    assert!(ingest(&mut c, batch(vec![client(1, 1, "1")]), t0).is_empty());
    assert!(ingest(&mut c, batch(vec![client(2, 1, "1")]), t0 + ms(1)).is_empty());
    let out = ingest(&mut c, batch(vec![client(3, 1, "1")]), t0 + ms(2));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].trace_id, tid(1), "the oldest is nearest its decision");
    assert_eq!(out[0].decision.decided_by, DecidedBy::Evicted);
    assert_eq!(c.stats.chains_evicted, 1);
    assert_eq!(c.stats.chains_decided, 1);
    assert_eq!(c.in_flight(), 2);
    // An evicted verdict is never confident.
    assert_eq!(verdicts(&out[0])[0].confidence, Confidence::Low);
    // The survivors are decided normally.
    let rest = tick(&mut c, t0 + secs(3));
    assert_eq!(rest.len(), 2);
    assert!(rest.iter().all(|d| d.decision.decided_by == DecidedBy::Quiet));
}

#[test]
fn max_bytes_evicts_only_as_many_chains_as_needed() {
    let t0 = Moment::from_nanos(1_000_000_000_000);
    let b = client(1, 1, "1").approx_bytes();
    let mut c = Chains::new(ChainLimits { max_bytes: 2 * b + b / 2, ..limits() });
    assert!(ingest(&mut c, batch(vec![client(1, 1, "1")]), t0).is_empty());
    assert!(ingest(&mut c, batch(vec![client(2, 1, "1")]), t0 + ms(1)).is_empty());
    let out = ingest(&mut c, batch(vec![client(3, 1, "1")]), t0 + ms(2));
    assert_eq!(out.len(), 1, "one eviction makes room: {:?}", out.iter().map(|d| d.trace_id).collect::<Vec<_>>());
    assert_eq!(out[0].trace_id, tid(1));
    assert_eq!(out[0].decision.decided_by, DecidedBy::Evicted);
    assert_eq!(c.stats.chains_evicted, 1);
    assert_eq!(c.in_flight(), 2);
    assert!(c.bytes() <= 2 * b + b / 2, "held {} of {}", c.bytes(), 2 * b + b / 2);
}

#[test]
fn max_bytes_forgets_decided_chains_before_evicting_live_ones() {
    let t0 = Moment::from_nanos(1_000_000_000_000);
    let b = client(1, 1, "1").approx_bytes();
    let mut c = Chains::new(ChainLimits { max_bytes: 2 * b + b / 2, ..limits() });
    ingest(&mut c, batch(vec![client(1, 1, "1")]), t0);
    assert_eq!(tick(&mut c, t0 + secs(2)).len(), 1); // decided, held for revision
    ingest(&mut c, batch(vec![client(2, 1, "1")]), t0 + secs(3));
    let out = ingest(&mut c, batch(vec![client(3, 1, "1")]), t0 + secs(3));
    assert!(out.is_empty(), "no live chain evicted while a decided one can be forgotten");
    assert_eq!(c.stats.decided_expired, 1);
    assert_eq!(c.stats.chains_evicted, 0);
    assert_eq!(c.in_flight(), 2);
}

#[test]
fn max_spans_per_chain_truncates_and_counts() {
    let t0 = Moment::from_nanos(1_000_000_000_000);
    let mut c = Chains::new(ChainLimits { max_spans_per_chain: 2, ..limits() });
    ingest(&mut c, batch(vec![client(1, 1, "1"), server(1, 2, 1, "1"), verifier(1, 3, Some(1), OutcomeResult::Confirmed, None)]), t0);
    ingest(&mut c, batch(vec![verifier(1, 4, Some(1), OutcomeResult::Confirmed, None)]), t0);
    assert_eq!(c.stats.truncated_spans, 2);
    let out = tick(&mut c, t0 + secs(2));
    assert_eq!(out.len(), 1);
    assert!(out[0].decision.truncated);
    assert_eq!(out[0].calls[0].span_count, 2);
    assert!(out[0].calls[0].outcomes.is_empty(), "the dropped verifier spans are not in the call");
    // A truncated chain is never confident.
    assert_eq!(verdicts(&out[0])[0].confidence, Confidence::Low);
}

#[test]
fn drain_at_shutdown_decides_everything_and_frees_memory() {
    let t0 = Moment::from_nanos(1_000_000_000_000);
    let mut c = Chains::new(limits());
    for t in 1..=3u8 {
        ingest(&mut c, batch(vec![client(t, 1, "1")]), t0);
    }
    assert!(c.bytes() > 0);
    let mut out = Vec::new();
    c.drain(DecidedBy::Shutdown, t0 + ms(10), &mut out);
    assert_eq!(out.len(), 3);
    assert!(out.iter().all(|d| d.decision.decided_by == DecidedBy::Shutdown));
    assert_eq!(c.in_flight(), 0);
    assert_eq!(c.bytes(), 0, "nothing is kept for revision at shutdown");
    assert_eq!(c.stats.chains_decided, 3);
    assert_eq!(c.stats.chains_evicted, 0, "draining is not evicting");
    assert!(verdicts(&out[0]).iter().all(|v| v.confidence == Confidence::Low));
    assert!(tick(&mut c, t0 + secs(60)).is_empty());
}

#[test]
fn drain_for_replay_keeps_nothing_when_max_decided_is_zero() {
    let t0 = Moment::from_nanos(1_000_000_000_000);
    let mut c = Chains::new(ChainLimits { max_decided: 0, ..limits() });
    ingest(&mut c, batch(vec![client(1, 1, "1"), server(1, 2, 1, "1")]), t0);
    let mut out = Vec::new();
    c.drain(DecidedBy::Replay, t0, &mut out);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].decision.decided_by, DecidedBy::Replay);
    assert_eq!(c.bytes(), 0);
}

#[test]
fn http_only_span_never_starts_a_chain_but_enriches_one() {
    let t0 = Moment::from_nanos(1_000_000_000_000);
    let mut c = Chains::new(limits());
    ingest(&mut c, batch(vec![http_span(1, 9, None, 200)]), t0);
    assert_eq!(c.in_flight(), 0);
    assert_eq!(c.stats.chains_created, 0);
    assert_eq!(c.bytes(), 0);
    ingest(&mut c, batch(vec![client(2, 1, "1")]), t0);
    ingest(&mut c, batch(vec![http_span(2, 2, Some(1), 401)]), t0 + ms(1));
    let out = tick(&mut c, t0 + secs(3));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].calls[0].http_status, Some(401));
    assert_eq!(verdicts(&out[0])[0].state, HealthState::NeedsAuth);
}

#[test]
fn http_span_ahead_of_the_mcp_span_in_one_batch_is_kept() {
    // One export from the server: the HTTP span that refused the request (401, semantic
    // conventions only) comes first, the MCP client span of the same trace after it.
    let t0 = Moment::from_nanos(1_000_000_000_000);
    let mut c = Chains::new(limits());
    ingest(&mut c, batch(vec![http_span(1, 2, Some(1), 401), client(1, 1, "1")]), t0);
    let out = tick(&mut c, t0 + secs(2));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].calls[0].http_status, Some(401));
    assert_eq!(verdicts(&out[0])[0].state, HealthState::NeedsAuth);
}

/// The same 401, one export earlier than its call (a child span ends first): on an MCP endpoint
/// it waits for a chain of its trace and the call reads as in one export, not greener. Off an
/// MCP endpoint nothing ties it to a call, and it is let go at once (ordinary HTTP traffic).
#[test]
fn an_http_span_on_an_mcp_endpoint_exported_before_its_call_waits_for_it() {
    let t0 = Moment::from_nanos(1_000_000_000_000);
    let mut c = Chains::new(limits());
    // The client's POST (a server's refusal alone in its trace is an orphan: `crossjoin`).
    let post = |trace: u8, endpoint: bool| {
        let mut h = http_span(trace, 2, Some(1), 401);
        (h.side, h.http_mcp_endpoint) = (Side::Client, endpoint);
        h
    };
    ingest(&mut c, batch(vec![post(1, true), post(2, false)]), t0);
    assert_eq!((c.in_flight(), c.stats.http_parked), (0, 1), "parked, no chain started");
    assert_eq!(c.oldest_needed(), Some(t0), "a parked span is evidence only this table holds");
    assert!(tick(&mut c, t0 + secs(3)).is_empty());
    ingest(&mut c, batch(vec![client(1, 1, "1"), client(2, 1, "1")]), t0 + secs(4));
    let out = tick(&mut c, t0 + secs(7));
    assert_eq!(out.len(), 2);
    let state = |t: u8| verdicts(out.iter().find(|d| d.trace_id == tid(t)).unwrap())[0].state;
    assert_eq!(state(1), HealthState::NeedsAuth, "the parked 401 joined its call");
    assert_ne!(state(2), HealthState::NeedsAuth, "off the endpoint: let go");
    assert_eq!(c.stats.http_parked_dropped, 0);
}

/// An HTTP span off any MCP endpoint (a tool's downstream 401, the agent's outer 500) in a
/// call's trace — the walk never takes one, but a chain release 0.2.0 stored may hold one —
/// changes nothing: not the call's layers, not whether a refused request is looked for in
/// another trace. The verdict is the one of the same chain without it, in whichever order.
#[test]
fn an_http_span_off_the_mcp_endpoints_in_a_stored_chain_changes_no_verdict() {
    let t0 = Moment::from_nanos(1_000_000_000_000);
    let stray = |trace: u8, span: u8, parent: Option<u8>, status: u16| {
        let mut h = http_span(trace, span, parent, status);
        h.http_mcp_endpoint = false;
        assert!(h.is_stray_http());
        h
    };
    let decide = |spans: Vec<SpanEvidence>| {
        let mut c = Chains::new(limits());
        ingest(&mut c, batch(spans), t0);
        let out = tick(&mut c, t0 + secs(3));
        assert_eq!(out.len(), 1);
        (verdicts(&out[0])[0].state, out[0].calls[0].http_status, out[0].calls[0].span_count)
    };
    let (plain, calls) = (decide(vec![client(1, 1, "1"), server(1, 2, 1, "1")]), vec![client(1, 1, "1"), server(1, 2, 1, "1")]);
    for status in [401, 403, 500, 503] {
        for extra in [stray(1, 3, Some(2), status), stray(1, 3, None, status)] {
            let mut spans = calls.clone();
            spans.push(extra.clone());
            assert_eq!(decide(spans.clone()), plain, "{status}, after");
            spans.rotate_right(1);
            assert_eq!(decide(spans), plain, "{status}, first");
        }
    }
    // A client request that failed with no server span is looked for in another trace even
    // beside a stray HTTP span (any HTTP status on the MCP endpoint would say it was served).
    let mut failed = client(2, 1, "1");
    failed.status_error = true;
    let with = crossjoin::refused_requests(&[failed.clone(), stray(2, 3, None, 200)]);
    assert_eq!(with.len(), crossjoin::refused_requests(&[failed.clone()]).len());
    assert!(!with.is_empty());
    assert!(crossjoin::refused_requests(&[failed, http_span(2, 3, None, 200)]).is_empty());
}

/// A parked HTTP span whose trace never starts a chain leaves after `decision_wait` +
/// `server_half_wait`, counted; a trace's spans past its bound are counted too.
#[test]
fn a_parked_http_span_whose_call_never_comes_is_let_go_and_counted() {
    let t0 = Moment::from_nanos(1_000_000_000_000);
    let mut c = Chains::new(ChainLimits { server_half_wait: secs(5), ..limits() });
    let spans: Vec<SpanEvidence> = (0..20u8)
        .map(|i| {
            let mut h = http_span(1, 10 + i, Some(1), 500);
            (h.side, h.http_mcp_endpoint) = (Side::Client, true);
            h
        })
        .collect();
    ingest(&mut c, batch(spans), t0);
    assert_eq!((c.stats.http_parked, c.stats.http_parked_dropped), (20, 16), "4 kept per trace");
    tick(&mut c, t0 + ms(6_999));
    assert_eq!(c.stats.http_parked_dropped, 16, "still waiting at 2 s + 5 s less a moment");
    tick(&mut c, t0 + secs(7));
    assert_eq!(c.stats.http_parked_dropped, 20);
    assert_eq!(c.oldest_needed(), None);
    // Its call, later still, starts a chain of its own without them.
    ingest(&mut c, batch(vec![client(1, 1, "1")]), t0 + secs(8));
    let out = tick(&mut c, t0 + secs(11));
    assert_eq!(out[0].calls[0].http_status, None);
}

#[test]
fn bytes_return_to_zero_once_everything_is_decided_and_forgotten() {
    let t0 = Moment::from_nanos(1_000_000_000_000);
    let mut c = Chains::new(ChainLimits { late_span_window: secs(10), ..limits() });
    for t in 1..=5u8 {
        ingest(&mut c, batch(vec![client(t, 1, "1"), server(t, 2, 1, "1")]), t0);
    }
    tick(&mut c, t0 + secs(2));
    ingest(&mut c, batch(vec![verifier(2, 3, Some(1), OutcomeResult::Confirmed, None)]), t0 + secs(3));
    tick(&mut c, t0 + secs(5));
    tick(&mut c, t0 + secs(100));
    assert_eq!(c.in_flight(), 0);
    assert_eq!(c.bytes(), 0);
    assert_eq!(c.stats.decided_expired, 5);
}

// --- assemble_calls -------------------------------------------------------------------------

#[test]
fn client_and_server_spans_of_one_request_join() {
    let calls = assemble_calls(&[server(1, 2, 1, "1"), client(1, 1, "1")]);
    assert_eq!(calls.len(), 1);
    let call = &calls[0];
    assert!(call.client_seen && call.server_seen);
    assert_eq!(call.span_count, 2);
    assert_eq!(call.anchor_span_id, sid(1), "the client span anchors the verdict");
    assert_eq!(call.request_id.as_deref(), Some("1"));
}

#[test]
fn two_tools_calls_in_one_trace_stay_two_calls() {
    let mut s2 = server(1, 4, 3, "2");
    s2.error = Some(CallError::ToolError);
    let calls = assemble_calls(&[client(1, 1, "1"), server(1, 2, 1, "1"), client(1, 3, "2"), s2]);
    assert_eq!(calls.len(), 2);
    let c1 = one_call(&calls, "1");
    let c2 = one_call(&calls, "2");
    assert_eq!((c1.span_count, c2.span_count), (2, 2));
    assert_eq!((c1.anchor_span_id, c2.anchor_span_id), (sid(1), sid(3)));
    assert!(!c1.tool_error && c2.tool_error, "the tool error stays on its own call");
    let d = Decision { revision: 0, decided_by: DecidedBy::Replay, root_seen: true, truncated: false };
    assert_eq!(classify_call(&c1, &SessionContext::default(), d).state, HealthState::Unverified);
    assert_eq!(classify_call(&c2, &SessionContext::default(), d).state, HealthState::ToolFailed);
}

#[test]
fn verifier_naming_the_request_id_joins_the_right_call() {
    for (named, other) in [("1", "2"), ("2", "1")] {
        // The verifier hangs under neither call (its parent is the agent's root span).
        let v = verifier(1, 9, Some(0x77), OutcomeResult::Confirmed, Some(named));
        let calls = assemble_calls(&[client(1, 1, "1"), server(1, 2, 1, "1"), client(1, 3, "2"), server(1, 4, 3, "2"), v]);
        assert_eq!(calls.len(), 2);
        assert_eq!(one_call(&calls, named).outcomes.len(), 1, "verifier naming {named}");
        assert!(one_call(&calls, other).outcomes.is_empty(), "verifier naming {named} must not touch {other}");
    }
}

#[test]
fn verifier_naming_the_request_id_wins_over_its_ancestry() {
    // Parented under call 1's client span, but it says it checked call 2.
    let v = verifier(1, 9, Some(1), OutcomeResult::Missing, Some("2"));
    let calls = assemble_calls(&[client(1, 1, "1"), client(1, 3, "2"), v]);
    assert!(one_call(&calls, "1").outcomes.is_empty());
    assert_eq!(one_call(&calls, "2").outcomes.len(), 1);
}

#[test]
fn verifier_naming_an_absent_request_id_confirms_nothing() {
    // The only call in the trace is request 1; the verifier checked request 9, whose spans are
    // not here. Its confirmation must not turn request 1 green.
    let v = verifier(1, 9, None, OutcomeResult::Confirmed, Some("9"));
    let calls = assemble_calls(&[client(1, 1, "1"), server(1, 2, 1, "1"), v]);
    assert_eq!(calls.len(), 1);
    assert!(calls[0].outcomes.is_empty());
    let d = Decision { revision: 0, decided_by: DecidedBy::Replay, root_seen: true, truncated: false };
    assert_eq!(classify_call(&calls[0], &SessionContext::default(), d).state, HealthState::Unverified);
}

#[test]
fn verifier_with_an_operation_key_joins_the_call_with_that_key() {
    let mut c2 = client(1, 3, "2");
    c2.operation_key = Some("op-2".into());
    let mut v = verifier(1, 9, None, OutcomeResult::Confirmed, None);
    v.operation_key = Some("op-2".into());
    let calls = assemble_calls(&[client(1, 1, "1"), c2, v]);
    assert!(one_call(&calls, "1").outcomes.is_empty());
    assert_eq!(one_call(&calls, "2").outcomes.len(), 1);
}

#[test]
fn verifier_under_a_call_joins_it_by_ancestry() {
    let v = verifier(1, 9, Some(3), OutcomeResult::Confirmed, None);
    let calls = assemble_calls(&[client(1, 1, "1"), client(1, 3, "2"), v]);
    assert!(one_call(&calls, "1").outcomes.is_empty());
    assert_eq!(one_call(&calls, "2").outcomes.len(), 1);
}

#[test]
fn unattributable_verifier_in_a_trace_with_two_calls_joins_neither() {
    let v = verifier(1, 9, None, OutcomeResult::Confirmed, None);
    let calls = assemble_calls(&[client(1, 1, "1"), client(1, 3, "2"), v]);
    assert_eq!(calls.len(), 2);
    assert!(calls.iter().all(|c| c.outcomes.is_empty()));
}

#[test]
fn verifier_in_a_trace_with_one_call_joins_it() {
    let v = verifier(1, 9, None, OutcomeResult::Confirmed, None);
    let calls = assemble_calls(&[client(1, 1, "1"), server(1, 2, 1, "1"), v]);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].outcomes.len(), 1);
}

#[test]
fn verifier_joins_the_only_tools_call_even_beside_an_initialize() {
    let init = method_span(1, 7, None, Side::Client, "initialize", Some("0"));
    let v = verifier(1, 9, None, OutcomeResult::Confirmed, None);
    let calls = assemble_calls(&[init, client(1, 1, "1"), server(1, 2, 1, "1"), v]);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].method, Some(Method::ToolsCall));
    assert_eq!(calls[0].outcomes.len(), 1);
}

#[test]
fn evidence_without_ancestry_joins_the_only_request_of_a_trace_without_tools_call() {
    // An initialize refused by the HTTP layer, whose span is not linked to the client span.
    let init = method_span(1, 1, None, Side::Client, "initialize", Some("0"));
    let mut http = http_span(1, 5, None, 401);
    http.auth_status = Some(401);
    let calls = assemble_calls(&[init, http]);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].method, Some(Method::Initialize));
    assert_eq!(calls[0].auth_status, Some(401));
    let d = Decision { revision: 0, decided_by: DecidedBy::Replay, root_seen: true, truncated: false };
    assert_eq!(classify_call(&calls[0], &SessionContext::default(), d).state, HealthState::NeedsAuth);
}

#[test]
fn http_span_wrapping_two_calls_joins_neither() {
    // One HTTP POST carrying a JSON-RPC batch: both MCP server spans sit under it, so it cannot
    // be attributed to one of them.
    let h = http_span(1, 5, Some(0x66), 503);
    let calls = assemble_calls(&[client(1, 1, "1"), client(1, 3, "2"), h, server(1, 2, 5, "1"), server(1, 4, 5, "2")]);
    assert_eq!(calls.len(), 2);
    assert!(calls.iter().all(|c| c.http_status.is_none() && c.span_count == 2), "{calls:#?}");
}

#[test]
fn http_server_span_that_parents_the_mcp_server_span_joins_that_call() {
    // h1 wraps call 1's MCP server span; its own parent is a proxy span that was not exported.
    let h1 = http_span(1, 5, Some(0x66), 200);
    let calls = assemble_calls(&[client(1, 1, "1"), h1, server(1, 2, 5, "1"), client(1, 3, "2"), server(1, 4, 3, "2")]);
    assert_eq!(calls.len(), 2);
    let c1 = one_call(&calls, "1");
    let c2 = one_call(&calls, "2");
    assert_eq!(c1.http_status, Some(200));
    assert_eq!(c1.span_count, 3);
    assert_eq!(c2.http_status, None);
    assert_eq!(c2.span_count, 2);
}

#[test]
fn http_server_span_under_the_client_span_joins_that_call() {
    let h = http_span(1, 5, Some(3), 401);
    let calls = assemble_calls(&[client(1, 1, "1"), client(1, 3, "2"), h]);
    assert_eq!(one_call(&calls, "1").http_status, None);
    assert_eq!(one_call(&calls, "2").http_status, Some(401));
}

#[test]
fn trace_with_only_initialize_yields_one_verdict() {
    let mut init = method_span(1, 1, None, Side::Client, "initialize", Some("0"));
    init.negotiation =
        Some(Negotiation { requested_version: Some("2025-11-25".into()), version_accepted: Some(false), missing_capabilities: vec![] });
    init.status_error = true;
    let srv = method_span(1, 2, Some(1), Side::Server, "initialize", Some("0"));
    let calls = assemble_calls(&[init, srv]);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].method, Some(Method::Initialize));
    let d = Decision { revision: 0, decided_by: DecidedBy::Replay, root_seen: true, truncated: false };
    assert_eq!(classify_call(&calls[0], &SessionContext::default(), d).state, HealthState::IncompatibleSession);
}

#[test]
fn trace_without_tools_call_yields_one_verdict_per_request() {
    let calls = assemble_calls(&[
        method_span(1, 1, None, Side::Client, "initialize", Some("0")),
        method_span(1, 2, None, Side::Client, "tools/list", Some("1")),
        method_span(1, 3, Some(2), Side::Server, "tools/list", Some("1")),
    ]);
    assert_eq!(calls.len(), 2);
    assert!(calls.iter().any(|c| c.method == Some(Method::Initialize) && c.span_count == 1));
    assert!(calls.iter().any(|c| c.method == Some(Method::ToolsList) && c.span_count == 2));
}

#[test]
fn initialize_and_tools_call_in_one_trace_give_one_verdict_for_the_call() {
    let mut init = method_span(1, 1, None, Side::Client, "initialize", Some("0"));
    init.session_id = Some("sess-1".into());
    let calls = assemble_calls(&[init, client(1, 3, "1")]);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].method, Some(Method::ToolsCall));
    assert_eq!(calls[0].session_id.as_deref(), Some("sess-1"), "the session id is inherited");
}

#[test]
fn session_negotiation_from_initialize_is_inherited_by_a_tools_call() {
    let mut init = method_span(1, 1, None, Side::Client, "initialize", Some("0"));
    init.negotiation = Some(Negotiation {
        requested_version: Some("2025-11-25".into()),
        version_accepted: Some(true),
        missing_capabilities: vec!["tools.listChanged".into()],
    });
    let calls = assemble_calls(&[init, client(1, 3, "1"), server(1, 4, 3, "1")]);
    assert_eq!(calls.len(), 1);
    let n = calls[0].negotiation.as_ref().expect("negotiation inherited");
    assert_eq!(n.requested_version.as_deref(), Some("2025-11-25"));
    assert_eq!(n.missing_capabilities, vec![Box::<str>::from("tools.listChanged")]);
    let d = Decision { revision: 0, decided_by: DecidedBy::Replay, root_seen: true, truncated: false };
    assert_eq!(classify_call(&calls[0], &SessionContext::default(), d).state, HealthState::IncompatibleSession);
}

#[test]
fn a_failed_initialize_marks_the_inherited_version_not_accepted() {
    let mut init = method_span(1, 1, None, Side::Client, "initialize", Some("0"));
    init.error = Some(CallError::JsonRpc(-32602));
    let calls = assemble_calls(&[init, client(1, 3, "1"), server(1, 4, 3, "1")]);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].negotiation.as_ref().and_then(|n| n.version_accepted), Some(false));
}

#[test]
fn a_lone_transport_failure_without_method_is_one_attempt() {
    let mut s = SpanEvidence::new(tid(1), sid(1));
    s.transport = Some(TransportOutcome::ConnectionRefused);
    let calls = assemble_calls(&[s]);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].transport, Some(TransportOutcome::ConnectionRefused));
    let d = Decision { revision: 0, decided_by: DecidedBy::Replay, root_seen: true, truncated: false };
    assert_eq!(classify_call(&calls[0], &SessionContext::default(), d).state, HealthState::TransportFailed);
}

#[test]
fn a_lone_http_span_is_no_attempt() {
    assert!(assemble_calls(&[http_span(1, 1, None, 200)]).is_empty());
    assert!(assemble_calls(&[]).is_empty());
}

#[test]
fn nested_client_spans_of_one_request_join() {
    // `MCP send tools/call x` around `tools/call x`: only the outer carries the request id.
    let inner = method_span(1, 2, Some(1), Side::Client, "tools/call", None);
    let calls = assemble_calls(&[client(1, 1, "1"), inner, server(1, 3, 2, "1")]);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].span_count, 3);
    assert_eq!(calls[0].anchor_span_id, sid(1), "the outermost client span anchors");
}

#[test]
fn client_span_without_request_id_joins_the_server_span_under_it() {
    // Client instrumentations often do not record `jsonrpc.request.id`; the server's span does.
    let outer = method_span(1, 1, None, Side::Client, "tools/call", None);
    let calls = assemble_calls(&[outer, server(1, 2, 1, "1")]);
    assert_eq!(calls.len(), 1, "one request, one verdict: {calls:#?}");
    assert!(calls[0].client_seen && calls[0].server_seen);
    assert_eq!(calls[0].request_id.as_deref(), Some("1"));
}

#[test]
fn a_nested_call_with_another_request_id_stays_its_own_call() {
    // The tool of call 1 itself calls another tool (request 1 on its own session): the nested
    // client span sits under call 1's server span but is a different request.
    let calls = assemble_calls(&[client(1, 1, "5"), server(1, 2, 1, "5"), call_span(1, 3, Some(2), Side::Client, "1")]);
    assert_eq!(calls.len(), 2);
    assert_eq!(one_call(&calls, "5").span_count, 2);
    assert_eq!(one_call(&calls, "1").span_count, 1);
}

#[test]
fn a_notification_inside_a_call_is_evidence_not_a_call_or_a_response() {
    let mut c = client(1, 1, "1");
    c.error = Some(CallError::Timeout);
    c.status_error = true;
    c.effect_boundary = Some(EffectBoundary::SideEffect);
    let progress = method_span(1, 2, Some(1), Side::Server, "notifications/progress", None);
    let calls = assemble_calls(&[c, progress]);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].span_count, 2);
    assert!(!calls[0].response_seen);
    let d = Decision { revision: 0, decided_by: DecidedBy::Replay, root_seen: true, truncated: false };
    let v = classify_call(&calls[0], &SessionContext::default(), d);
    assert_eq!(v.state, HealthState::EffectUnknown);
    assert!(!v.retry_safe);
}

#[test]
fn a_parent_cycle_does_not_hang_assembly() {
    let mut a = verifier(1, 1, Some(2), OutcomeResult::Confirmed, None);
    a.start_ns = 1;
    let mut b = verifier(1, 2, Some(1), OutcomeResult::Missing, None);
    b.start_ns = 2;
    let calls = assemble_calls(&[a, b, client(1, 3, "1"), client(1, 4, "2")]);
    assert_eq!(calls.len(), 2);
}

/// Issue 12: a session as another instance wrote it merges into this table: the events of both
/// (shared ones once), the later activity; new evidence marks it for writing back and for a
/// verdict check, evidence already here changes nothing; the converged read-back turns through the
/// converged sessions.
#[test]
fn a_session_from_another_instance_merges_its_evidence() {
    use crate::classify::catalog::{CatalogEvent, CatalogEventKind, Convergence};
    use crate::correlate::outbox::{KeptSession, ReadBack, SessionBack};
    use crate::evidence::catalog::SignalSource;
    let mut s = Sessions::new(SessionLimits { max_events_per_session: 3, ..SessionLimits::default() });
    s.keep_for_store();
    let ev = |at: u64, kind: CatalogEventKind| CatalogEvent { at_ns: at, kind };
    let rec = |events: Vec<CatalogEvent>, activity: u64| KeptSession {
        events,
        page_requests: vec!["1".into()],
        last_seen_ns: 0,
        last: None,
        last_activity_ns: activity,
        server: Some(Arc::from("srv")),
        trace_id: [1; 16],
        span_id: [1; 8],
        has_ttl: false,
        emitted: None,
    };
    // Unknown here: taken as it is.
    s.restore(SessionBack::Merged("k", rec(vec![ev(1, CatalogEventKind::Capability(true))], 5)));
    assert_eq!(s.merges, 1);
    // The same evidence again: nothing new.
    s.restore(SessionBack::Merged("k", rec(vec![ev(1, CatalogEventKind::Capability(true))], 5)));
    assert_eq!(s.merges, 1);
    let out = s.take_changes();
    assert!(out.is_empty(), "nothing to write back: {out:?}");
    // A signal another instance saw: merged, written back, checked.
    s.restore(SessionBack::Merged(
        "k",
        rec(vec![ev(1, CatalogEventKind::Capability(true)), ev(9, CatalogEventKind::Signal(SignalSource::Notification))], 12),
    ));
    assert_eq!(s.merges, 2);
    let out = s.take_changes();
    assert_eq!(out.len(), 1);
    let Some(r) = out[0].1.clone() else { panic!() };
    assert_eq!(r.events.len(), 2, "shared events once: {:?}", r.events);
    assert_eq!(r.last_activity_ns, 12);
    let _ = s.take_merged_changes();
    // Bounded like observed evidence: the oldest go.
    s.restore(SessionBack::Merged("k", rec(vec![ev(20, CatalogEventKind::Reconnect), ev(21, CatalogEventKind::Reconnect)], 21)));
    let out = s.take_changes();
    let Some(r) = out[0].1.clone() else { panic!() };
    assert_eq!(r.events.iter().map(|e| e.at_ns).collect::<Vec<_>>(), vec![9, 20, 21]);
    // No session is converged here: nothing to read back.
    assert!(s.all_current().iter().all(|(_, _, v)| v.convergence != Convergence::Converged));
    assert!(s.to_read_back(ReadBack::Converged { limit: 10, from: 0 }).is_empty());
}

/// With a shared store, a client half of a server nobody saw split is held back, not published;
/// a mark publishes the halves held for its server; the drain publishes the held halves a look
/// may still come for (decided within a server half's waits), not older ones.
#[test]
fn held_client_halves_are_published_by_a_mark_and_the_recent_ones_at_the_drain() {
    let mut c = Chains::new(limits());
    c.keep_for_store(Some(secs(1)));
    let to = |trace: u8, server: &str| {
        let mut s = client(trace, 1, &format!("r{trace}"));
        s.server = Some(Arc::from(server));
        s
    };
    let t0 = Moment::from_nanos(1_000_000_000_000);
    ingest(&mut c, batch(vec![to(1, "old:1")]), t0);
    tick(&mut c, t0 + secs(3));
    ingest(&mut c, batch(vec![to(2, "marked:1")]), t0 + secs(3));
    tick(&mut c, t0 + secs(6));
    assert_eq!(c.take_for_round(t0 + secs(6)).halves.len(), 0, "no server seen to split: nothing published");
    c.take_in(FromStore::Split(Some(Arc::from("marked:1"))), t0 + secs(7), &mut Vec::new());
    assert_eq!(c.take_for_round(t0 + secs(7)).halves.into_iter().map(|(id, _)| id).collect::<Vec<_>>(), vec![tid(2)]);
    ingest(&mut c, batch(vec![to(3, "recent:1")]), t0 + secs(60));
    tick(&mut c, t0 + secs(63));
    assert_eq!(c.take_for_round(t0 + secs(63)).halves.len(), 0);
    c.drain(DecidedBy::Shutdown, t0 + secs(64), &mut Vec::new());
    assert_eq!(
        c.take_for_round(t0 + secs(64)).halves.into_iter().map(|(id, _)| id).collect::<Vec<_>>(),
        vec![tid(3)],
        "the old half is not published at the drain"
    );
}

/// With a shared store, a server half in a trace of its own, deferred, is looked for in the store
/// once: at the first look past half its extra wait after its last span, or once its server's
/// split mark has settled when that is later — not before, and not again; each half at its own
/// time.
#[test]
fn a_deferred_server_half_is_looked_for_once_when_its_wait_and_its_mark_allow() {
    let t0 = Moment::from_nanos(1_000_000_000_000);
    let half = |trace: u8, server: &str| {
        let mut s = call_span(trace, 1, None, Side::Server, &format!("r{trace}"));
        s.server = Some(Arc::from(server));
        s
    };
    let looked = |c: &mut Chains, at: Moment| -> Vec<TraceId> {
        let looks = c.take_looks(at, false, super::outbox::Paced::default());
        tick(c, at);
        looks.server_halves.into_iter().map(|(id, _)| id).collect()
    };
    // Marks settle within a second: each half waits 2 s + 5 s / 2 past its last span.
    let mut c = Chains::new(limits());
    c.keep_for_store(Some(secs(1)));
    ingest(&mut c, batch(vec![half(1, "a:1")]), t0);
    ingest(&mut c, batch(vec![half(2, "a:1")]), t0 + secs(1));
    tick(&mut c, t0 + secs(2));
    tick(&mut c, t0 + secs(3));
    assert!(looked(&mut c, t0 + secs(4)).is_empty(), "deferred, not waited yet");
    assert!(looked(&mut c, t0 + ms(4499)).is_empty());
    assert_eq!(looked(&mut c, t0 + ms(4500)), vec![tid(1)]);
    assert!(looked(&mut c, t0 + secs(5)).is_empty(), "once");
    assert_eq!(looked(&mut c, t0 + ms(5600)), vec![tid(2)], "the second at its own time");
    assert!(looked(&mut c, t0 + secs(6)).is_empty());
    // Marks that take 10 s to settle: the look waits for the mark made when the half was deferred.
    let mut c = Chains::new(limits());
    c.keep_for_store(Some(secs(10)));
    ingest(&mut c, batch(vec![half(3, "b:1")]), t0);
    tick(&mut c, t0 + secs(2));
    assert!(looked(&mut c, t0 + secs(5)).is_empty(), "its server's mark has not settled");
    assert!(looked(&mut c, t0 + ms(11_999)).is_empty());
    assert_eq!(looked(&mut c, t0 + secs(12)), vec![tid(3)]);
    assert!(looked(&mut c, t0 + secs(13)).is_empty());
}

/// A span equal to one its chain holds (an exporter's retry, the journal replayed after a
/// restart) is taken once: it neither adds to a chain in flight nor revises a decided one. A
/// span with the same id that says something else still does.
#[test]
fn a_duplicate_span_is_taken_once_and_never_revises() {
    let t0 = Moment::from_nanos(1_000_000_000_000);
    let mut c = Chains::new(limits());
    let spans = vec![client(1, 1, "1"), server(1, 2, 1, "1")];
    ingest(&mut c, batch(spans.clone()), t0);
    ingest(&mut c, batch(spans.clone()), t0 + ms(100));
    assert_eq!(c.stats.duplicate_spans, 2);
    let first = tick(&mut c, t0 + secs(3));
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].calls[0].span_count, 2, "each span once");
    // Sent again after the decision: no revision.
    ingest(&mut c, batch(spans), t0 + secs(4));
    assert_eq!(c.stats.duplicate_spans, 4);
    assert_eq!(c.stats.late_spans, 0);
    assert!(tick(&mut c, t0 + secs(10)).is_empty(), "nothing to revise");
    // The same span id saying more (an error now) is new evidence: a revision.
    let mut changed = server(1, 2, 1, "1");
    changed.status_error = true;
    ingest(&mut c, batch(vec![changed]), t0 + secs(11));
    assert_eq!(c.stats.late_spans, 1);
    assert_eq!(tick(&mut c, t0 + secs(14))[0].decision.revision, 1);
}

/// A decided chain's call vector, handed back once classified, is the next decision's: no
/// allocation per decided chain (see `Chains::recycle_calls`). A wide one is not kept.
#[test]
fn a_classified_chains_call_vector_is_reused_by_the_next_decision() {
    let t0 = Moment::from_nanos(1_000_000_000_000);
    let mut c = Chains::new(limits());
    ingest(&mut c, batch(vec![client(1, 1, "1")]), t0);
    let mut first = tick(&mut c, t0 + secs(3));
    let calls = std::mem::take(&mut first[0].calls);
    assert_eq!(calls.capacity(), 1, "exactly the room of its one call");
    let at = calls.as_ptr();
    c.recycle_calls(calls);
    ingest(&mut c, batch(vec![client(2, 1, "1")]), t0 + secs(4));
    let second = tick(&mut c, t0 + secs(7));
    assert_eq!(second[0].calls.as_ptr(), at, "the same vector");
    assert_eq!(second[0].calls.len(), 1);
    assert_eq!(second[0].calls[0].request_id.as_deref(), Some("1"));
    assert_eq!(verdicts(&second[0]).len(), 1);
    // A vector with room for many calls is let go, not kept.
    c.recycle_calls(Vec::with_capacity(16));
    ingest(&mut c, batch(vec![client(3, 1, "1")]), t0 + secs(8));
    assert_eq!(tick(&mut c, t0 + secs(11))[0].calls.capacity(), 1);
}
