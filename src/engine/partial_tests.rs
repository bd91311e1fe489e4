//! Partial marking in the engine, on a manual clock: chains that may be split (started before the
//! engine's first ingest, less `decision_wait`; decided at shutdown) are capped at `unverified`.
use super::*;
use crate::correlate::{ChainLimits, SessionLimits};
use crate::evidence::{OutcomeReceipt, OutcomeResult, Side, SpanEvidence, TransportOutcome, VerifierMethod};
use crate::normalize::NormalizedBatch;
use crate::verdict::Partial;
use crate::verdict::{Confidence, DecidedBy};
use std::time::Duration;

/// Engine time of the first ingest (1000 s), in the span-time frame of the calls below.
const T0: u64 = 1_000_000_000_000;
const MS: u64 = 1_000_000;

fn engine(rule: bool) -> Engine {
    let mut cfg =
        EngineConfig::new(ChainLimits { decision_wait: Duration::from_millis(10), ..ChainLimits::default() }, SessionLimits::default());
    cfg.partial_before_start = rule;
    Engine::new(cfg)
}

fn at(ns: u64) -> Moment {
    Moment::from_nanos(ns)
}

/// A verified call (client span + confirmed receipt): `healthy` when its evidence is whole.
fn verified(trace: u8, start_ns: u64) -> Vec<SpanEvidence> {
    let mut c = SpanEvidence::new([trace; 16], [1; 8]);
    c.method = Some(Method::ToolsCall);
    c.side = Side::Client;
    c.tool = Some(Arc::from("create_ticket"));
    c.server = Some(Arc::from("tickets:443"));
    c.request_id = Some("1".into());
    c.start_ns = start_ns;
    c.end_ns = start_ns + MS;
    let mut v = SpanEvidence::new([trace; 16], [2; 8]);
    v.parent_span_id = Some([1; 8]);
    v.outcomes.push(OutcomeReceipt {
        result: OutcomeResult::Confirmed,
        method: VerifierMethod::Receipt,
        checked_at_ns: start_ns + 2 * MS,
        request_id: None,
        trust: Default::default(),
    });
    vec![c, v]
}

fn refused(trace: u8, start_ns: u64) -> Vec<SpanEvidence> {
    let mut s = verified(trace, start_ns).remove(0);
    s.transport = Some(TransportOutcome::ConnectionRefused);
    vec![s]
}

fn run(e: &mut Engine, batches: Vec<Vec<SpanEvidence>>) -> Vec<Verdict> {
    let mut out = Vec::new();
    for (n, b) in batches.into_iter().enumerate() {
        e.ingest(NormalizedBatch { evidence: b, ..Default::default() }, at(T0 + n as u64 * MS), &mut out);
    }
    e.tick(at(T0 + 500 * MS), &mut out);
    out.into_iter()
        .filter_map(|d| match d {
            Decided::Call(v) => Some(Arc::unwrap_or_clone(v)),
            _ => None,
        })
        .collect()
}

fn of(vs: &[Verdict], trace: u8) -> &Verdict {
    vs.iter().find(|v| v.trace_id == [trace; 16]).unwrap_or_else(|| panic!("no verdict for trace {trace}: {vs:?}"))
}

#[test]
fn a_chain_that_started_before_the_engine_is_capped_at_unverified_with_the_reason() {
    let mut e = engine(true);
    let vs = run(
        &mut e,
        vec![
            verified(1, T0 - 1_000 * MS), // a second before the first ingest: may be split
            verified(2, T0 - 5 * MS),     // within decision_wait of it: whole
            verified(3, T0 + 100 * MS),   // after it
            refused(4, T0 - 1_000 * MS),  // a failure before the start keeps its state
        ],
    );
    let v = of(&vs, 1);
    assert_eq!(
        (v.state, v.confidence, v.partial, v.verified_success),
        (HealthState::Unverified, Confidence::Low, Some(Partial::PredatesStart), false)
    );
    assert_eq!(v.reason.as_deref(), Some("partial_predates_start"));
    for t in [2, 3] {
        assert_eq!((of(&vs, t).state, of(&vs, t).partial), (HealthState::Healthy, None), "trace {t}");
    }
    let v = of(&vs, 4);
    assert_eq!(
        (v.state, v.partial, v.confidence, v.reason.as_deref()),
        (HealthState::TransportFailed, Some(Partial::PredatesStart), Confidence::Low, Some("connection_refused"))
    );
    // The JSON is additive: `partial` appears only where it applies.
    let j = serde_json::to_value(of(&vs, 1)).unwrap();
    assert_eq!(j["partial"], "predates_start");
    assert!(serde_json::to_value(of(&vs, 3)).unwrap().get("partial").is_none());
}

#[test]
fn without_the_rule_an_old_chain_is_judged_as_before() {
    let mut e = engine(false);
    let vs = run(&mut e, vec![verified(1, T0 - 1_000 * MS)]);
    assert_eq!((of(&vs, 1).state, of(&vs, 1).partial), (HealthState::Healthy, None));
}

#[test]
fn a_chain_decided_at_shutdown_is_partial_whatever_the_rule() {
    for rule in [false, true] {
        let mut e = engine(rule);
        let mut out = Vec::new();
        // The receipt is in, the root is not: the chain is still in flight when the drain comes.
        let mut spans = verified(1, T0 + MS);
        spans[0].parent_span_id = Some([9; 8]);
        e.ingest(NormalizedBatch { evidence: spans, ..Default::default() }, at(T0 + MS), &mut out);
        e.drain(DecidedBy::Shutdown, at(T0 + 2 * MS), &mut out);
        let vs: Vec<Verdict> =
            out.into_iter().filter_map(|d| if let Decided::Call(v) = d { Some(Arc::unwrap_or_clone(v)) } else { None }).collect();
        let v = of(&vs, 1);
        assert_eq!(
            (v.state, v.partial, v.confidence),
            (HealthState::Unverified, Some(Partial::DecidedAtShutdown), Confidence::Low),
            "rule {rule}"
        );
        assert_eq!(v.reason.as_deref(), Some("partial_decided_at_shutdown"));
    }
}

/// A store that answers errors while `down` is set.
struct Flaky(Arc<std::sync::atomic::AtomicBool>);

impl crate::state::StateStore for Flaky {
    fn load_into(&mut self, into: crate::state::Snapshot) -> Result<crate::state::Snapshot, crate::state::StoreError> {
        Ok(into)
    }
    fn apply(&mut self, _: &crate::state::Changes) -> Result<(), crate::state::StoreError> {
        if self.0.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(crate::state::StoreError::Backend("down".into()));
        }
        Ok(())
    }
    fn get(&mut self, _: crate::state::Table, _: &str) -> Result<Option<crate::state::Record>, crate::state::StoreError> {
        Ok(None)
    }
}

#[test]
fn while_the_store_is_down_verdicts_are_capped_and_it_says_so() {
    let down = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut cfg =
        EngineConfig::new(ChainLimits { decision_wait: Duration::from_millis(10), ..ChainLimits::default() }, SessionLimits::default());
    cfg.store = Some(crate::state::StoreHandle::new(Flaky(down.clone())));
    let mut e = Engine::new(cfg);
    let mut out = Vec::new();
    let step = |e: &mut Engine, out: &mut Vec<Decided>, trace: u8, at_ms: u64| {
        let t = T0 + at_ms * MS;
        e.ingest(NormalizedBatch { evidence: verified(trace, t), ..Default::default() }, at(t), out);
        e.tick(at(t + 200 * MS), out);
        e.flush_store(at(t + 300 * MS), &mut Vec::new());
    };
    step(&mut e, &mut out, 1, 0);
    assert!(!e.store_down());
    down.store(true, std::sync::atomic::Ordering::SeqCst);
    step(&mut e, &mut out, 2, 1_000); // decided, then the write fails: the store is down
    step(&mut e, &mut out, 3, 2_000); // decided while it is down
    assert!(e.store_down() && e.store_errors() >= 1);
    down.store(false, std::sync::atomic::Ordering::SeqCst);
    step(&mut e, &mut out, 4, 3_000); // decided while still marked down; the write succeeds
    assert!(!e.store_down());
    step(&mut e, &mut out, 5, 4_000);
    let vs: Vec<Verdict> =
        out.into_iter().filter_map(|d| if let Decided::Call(v) = d { Some(Arc::unwrap_or_clone(v)) } else { None }).collect();
    let got: Vec<(u8, HealthState, Option<Partial>)> = vs.iter().map(|v| (v.trace_id[0], v.state, v.partial)).collect();
    assert_eq!(
        got,
        vec![
            (1, HealthState::Healthy, None),
            (2, HealthState::Healthy, None),
            (3, HealthState::Unverified, Some(Partial::StoreUnavailable)),
            (4, HealthState::Unverified, Some(Partial::StoreUnavailable)),
            (5, HealthState::Healthy, None),
        ]
    );
}

/// A revision of a chain whose last decision was partial supersedes the verdict as reported
/// (capped), so success counts are undone only where they were added.
#[test]
fn a_revision_supersedes_the_capped_verdict_as_reported() {
    let down = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let mut cfg =
        EngineConfig::new(ChainLimits { decision_wait: Duration::from_millis(10), ..ChainLimits::default() }, SessionLimits::default());
    cfg.store = Some(crate::state::StoreHandle::new(Flaky(down.clone())));
    let mut e = Engine::new(cfg);
    let mut out = Vec::new();
    // A write fails: the store is down.
    e.ingest(NormalizedBatch { evidence: refused(9, T0), ..Default::default() }, at(T0), &mut out);
    e.tick(at(T0 + 5 * MS), &mut out);
    e.tick(at(T0 + 50 * MS), &mut out);
    e.flush_store(at(T0 + 60 * MS), &mut Vec::new());
    assert!(e.store_down());
    // A verified call decided meanwhile: capped.
    e.ingest(NormalizedBatch { evidence: verified(1, T0 + 70 * MS), ..Default::default() }, at(T0 + 70 * MS), &mut out);
    e.tick(at(T0 + 150 * MS), &mut out);
    // The store is back; a second receipt revises the call.
    down.store(false, std::sync::atomic::Ordering::SeqCst);
    e.ingest(NormalizedBatch { evidence: refused(8, T0 + 200 * MS), ..Default::default() }, at(T0 + 200 * MS), &mut out);
    e.tick(at(T0 + 250 * MS), &mut out);
    e.flush_store(at(T0 + 260 * MS), &mut Vec::new());
    assert!(!e.store_down(), "a write went through");
    let mut late = verified(1, T0 + 70 * MS).remove(1);
    late.span_id = [3; 8];
    e.ingest(NormalizedBatch { evidence: vec![late], ..Default::default() }, at(T0 + 300 * MS), &mut out);
    e.tick(at(T0 + 400 * MS), &mut out);
    assert!(!e.store_down());
    let vs: Vec<Verdict> = out
        .into_iter()
        .filter_map(|d| if let Decided::Call(v) = d { Some(Arc::unwrap_or_clone(v)) } else { None })
        .filter(|v| v.trace_id == [1; 16])
        .collect();
    assert_eq!(vs.len(), 2, "{vs:?}");
    assert_eq!((vs[0].state, vs[0].partial, vs[0].verified_success), (HealthState::Unverified, Some(Partial::StoreUnavailable), false));
    assert_eq!((vs[1].revision, vs[1].state, vs[1].partial), (1, HealthState::Healthy, None));
    let was = vs[1].supersedes.expect("a revision names what it replaces");
    assert_eq!((was.state, was.verified_success), (HealthState::Unverified, false), "as it was reported, capped");
}
