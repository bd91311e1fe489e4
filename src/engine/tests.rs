//! The engine's own rules, with a manual clock.
use super::*;
use crate::correlate::{ChainLimits, SessionLimits};
use crate::evidence::{OutcomeReceipt, OutcomeResult, Side, SpanEvidence, VerifierMethod};
use crate::normalize::NormalizedBatch;
use crate::verdict::DecidedBy;
use std::collections::BTreeMap;
use std::time::Duration;

fn call_span() -> SpanEvidence {
    let mut s = SpanEvidence::new([7; 16], [1; 8]);
    s.method = Some(Method::ToolsCall);
    s.side = Side::Client;
    s.request_id = Some("1".into());
    s.start_ns = 10;
    s.end_ns = 20;
    s
}

/// SPEC section 3's falsifiable transition: a timed-out call at a side-effect boundary is
/// `effect_unknown` (retry blocked); a later receipt whose deliverable check fails moves it to
/// `false_success`.
#[test]
fn effect_unknown_moves_to_false_success_when_a_failing_receipt_arrives() {
    let mut chains = Chains::new(ChainLimits { decision_wait: Duration::from_millis(10), ..ChainLimits::default() });
    let sessions = Sessions::new(SessionLimits::default());
    let t0 = Moment::from_nanos(1_000_000_000_000);
    let mut out = Vec::new();
    let mut timed_out = call_span();
    timed_out.transport = Some(crate::evidence::TransportOutcome::Timeout);
    timed_out.effect_boundary = Some(crate::evidence::EffectBoundary::SideEffect);
    chains.ingest(NormalizedBatch { evidence: vec![timed_out], ..Default::default() }, t0, &mut out);
    chains.tick(t0 + Duration::from_millis(20), &mut out);
    let first = verdicts_of(&out.remove(0), &sessions, None, &ProgressPolicy::default(), 0);
    assert_eq!(first[0].state, HealthState::EffectUnknown);
    assert!(!first[0].retry_safe, "automatic retry is blocked until reconciliation");

    let mut receipt = SpanEvidence::new([7; 16], [4; 8]);
    receipt.parent_span_id = Some([1; 8]);
    receipt.outcomes.push(OutcomeReceipt {
        result: OutcomeResult::Failed,
        method: VerifierMethod::TestResult,
        checked_at_ns: 40,
        request_id: None,
        trust: Default::default(),
    });
    chains.ingest(NormalizedBatch { evidence: vec![receipt], ..Default::default() }, t0 + Duration::from_millis(30), &mut out);
    chains.tick(t0 + Duration::from_millis(50), &mut out);
    let second = verdicts_of(&out.remove(0), &sessions, None, &ProgressPolicy::default(), 0);
    assert_eq!(second[0].state, HealthState::FalseSuccess);
    assert_eq!(second[0].supersedes.map(|p| p.state), Some(HealthState::EffectUnknown));
}

/// SPEC section 3's other transition: a call on a stale catalog is `stale_catalog`; after a
/// complete refresh (and install) the next call moves on to its own layers' state.
#[test]
fn a_stale_catalog_followed_by_a_complete_refresh_moves_on() {
    use crate::evidence::catalog::{CatalogFacts, ListPage, SignalSource};
    let mut sessions = Sessions::new(SessionLimits::default());
    let fact = |at: u64, f: CatalogFacts| {
        let mut s = SpanEvidence::new([9; 16], [at as u8; 8]);
        s.session_id = Some("s-1".into());
        s.side = Side::Client;
        s.start_ns = at;
        s.end_ns = at;
        s.catalog = Some(Box::new(f));
        s
    };
    let page = |at: u64| {
        let mut s = fact(
            at,
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
        s.method = Some(Method::ToolsList);
        s
    };
    let installed = crate::classify::digest::registry_digest(&[crate::classify::digest::ToolDigest {
        name: "t".into(),
        digest: "sha256:aa".into(),
        projection_version: crate::classify::digest::PROJECTION_VERSION.into(),
    }]);
    let timeline = vec![
        fact(1, CatalogFacts { list_changed_capability: Some(true), ..Default::default() }),
        page(10),
        fact(11, CatalogFacts { installed_digest: Some(Arc::from(installed.as_str())), ..Default::default() }),
        fact(20, CatalogFacts { signal: Some(SignalSource::Notification), ..Default::default() }),
        page(40),
        fact(41, CatalogFacts { installed_digest: Some(Arc::from(installed.as_str())), ..Default::default() }),
    ];
    sessions.observe(&timeline, Moment::from_nanos(1_000_000_000_000));
    let call_at = |at: u64| {
        let mut c = CallEvidence {
            method: Some(Method::ToolsCall),
            session_id: Some("s-1".into()),
            client_seen: true,
            response_seen: true,
            start_ns: at,
            ..Default::default()
        };
        c.outcomes.push(OutcomeReceipt {
            result: OutcomeResult::Confirmed,
            method: VerifierMethod::Receipt,
            checked_at_ns: at + 5,
            request_id: None,
            trust: Default::default(),
        });
        c
    };
    let d = crate::classify::Decision { revision: 0, decided_by: DecidedBy::Quiet, root_seen: true, truncated: false };
    let p = ProgressPolicy::default();
    assert_eq!(
        classify_with_clocks(&call_at(30), &sessions, None, &p, 0, d).state,
        HealthState::StaleCatalog,
        "between the signal and the refresh"
    );
    assert_eq!(
        classify_with_clocks(&call_at(50), &sessions, None, &p, 0, d).state,
        HealthState::Healthy,
        "after the complete refresh it moves on"
    );
}

/// Issue 4: a verifier that reports in its own trace joins its call by operation key.
#[test]
fn a_verifier_in_another_trace_joins_by_operation_key() {
    let mut chains = Chains::new(ChainLimits { decision_wait: Duration::from_millis(10), ..ChainLimits::default() });
    let sessions = Sessions::new(SessionLimits::default());
    let t0 = Moment::from_nanos(1_000_000_000_000);
    let mut out = Vec::new();
    let mut call = call_span();
    call.operation_key = Some("op-77".into());
    chains.ingest(NormalizedBatch { evidence: vec![call], ..Default::default() }, t0, &mut out);
    chains.tick(t0 + Duration::from_millis(20), &mut out);
    assert_eq!(verdicts_of(&out.remove(0), &sessions, None, &ProgressPolicy::default(), 0)[0].state, HealthState::Unverified);

    let mut v = SpanEvidence::new([8; 16], [5; 8]);
    v.operation_key = Some("op-77".into());
    v.outcomes.push(OutcomeReceipt {
        result: OutcomeResult::Confirmed,
        method: VerifierMethod::RowVersion,
        checked_at_ns: 50,
        request_id: None,
        trust: Default::default(),
    });
    chains.ingest(NormalizedBatch { evidence: vec![v], ..Default::default() }, t0 + Duration::from_millis(30), &mut out);
    chains.tick(t0 + Duration::from_millis(50), &mut out);
    let d = out.remove(0);
    assert_eq!(d.trace_id, [7; 16], "the receipt joined the call's trace");
    let v = verdicts_of(&d, &sessions, None, &ProgressPolicy::default(), 0);
    assert_eq!((v[0].state, v[0].revision), (HealthState::Healthy, 1));
    assert_eq!(chains.stats.joined_by_operation_key, 1);
}

/// A receipt checked before the call started is stale evidence about something else.
#[test]
fn a_receipt_older_than_the_call_is_ignored() {
    let mut c =
        CallEvidence { method: Some(Method::ToolsCall), response_seen: true, client_seen: true, start_ns: 100, ..Default::default() };
    c.outcomes.push(OutcomeReceipt {
        result: OutcomeResult::Confirmed,
        method: VerifierMethod::Receipt,
        checked_at_ns: 50,
        request_id: None,
        trust: Default::default(),
    });
    let d = crate::classify::Decision { revision: 0, decided_by: DecidedBy::Quiet, root_seen: true, truncated: false };
    let sessions = Sessions::new(SessionLimits::default());
    assert_eq!(classify_with_clocks(&c, &sessions, None, &ProgressPolicy::default(), 0, d).state, HealthState::Unverified);
}

#[test]
fn a_late_receipt_revises_and_names_what_it_supersedes() {
    let mut chains = Chains::new(ChainLimits { decision_wait: Duration::from_millis(10), ..ChainLimits::default() });
    let sessions = Sessions::new(SessionLimits::default());
    let t0 = Moment::from_nanos(1_000_000_000_000);
    let mut out = Vec::new();
    chains.ingest(NormalizedBatch { evidence: vec![call_span()], ..Default::default() }, t0, &mut out);
    chains.tick(t0 + Duration::from_millis(20), &mut out);
    let first = verdicts_of(&out.remove(0), &sessions, None, &ProgressPolicy::default(), 0);
    assert_eq!(first[0].state, HealthState::Unverified);
    assert_eq!(first[0].supersedes, None);

    let mut v = SpanEvidence::new([7; 16], [3; 8]);
    v.parent_span_id = Some([1; 8]);
    v.outcomes.push(OutcomeReceipt {
        result: OutcomeResult::Confirmed,
        method: VerifierMethod::Receipt,
        checked_at_ns: 30,
        request_id: None,
        trust: Default::default(),
    });
    chains.ingest(NormalizedBatch { evidence: vec![v], ..Default::default() }, t0 + Duration::from_millis(30), &mut out);
    chains.tick(t0 + Duration::from_millis(50), &mut out);
    let second = verdicts_of(&out.remove(0), &sessions, None, &ProgressPolicy::default(), 0);
    assert_eq!(second[0].revision, 1);
    assert_eq!(second[0].state, HealthState::Healthy);
    let p = second[0].supersedes.expect("a revision names what it replaces");
    assert_eq!((p.state, p.protocol_success, p.verified_success), (HealthState::Unverified, true, false));
}

fn engine(decision_wait_ms: u64) -> Engine {
    Engine::new(EngineConfig::new(
        ChainLimits { decision_wait: Duration::from_millis(decision_wait_ms), ..ChainLimits::default() },
        SessionLimits::default(),
    ))
}

fn calls(out: &[Decided]) -> Vec<&Verdict> {
    out.iter()
        .filter_map(|d| match d {
            Decided::Call(v) => Some(&**v),
            _ => None,
        })
        .collect()
}

/// Issue 8, defect 2: a verifier that reports (in its own trace, by operation key) before its
/// call arrives waits for the call instead of becoming a call-less `false_success` of its own.
#[test]
fn a_verifier_before_its_call_is_parked_and_joins_it() {
    let t0 = Moment::from_nanos(1_000_000_000_000);
    for result in [OutcomeResult::Confirmed, OutcomeResult::Missing] {
        let mut e = engine(10);
        let mut out = Vec::new();
        let mut v = SpanEvidence::new([8; 16], [5; 8]);
        v.operation_key = Some("op-9".into());
        v.outcomes.push(OutcomeReceipt {
            result,
            method: VerifierMethod::RowVersion,
            checked_at_ns: 50,
            request_id: None,
            trust: Default::default(),
        });
        e.ingest(NormalizedBatch { evidence: vec![v], ..Default::default() }, t0, &mut out);
        e.tick(t0 + Duration::from_millis(100), &mut out);
        assert!(calls(&out).is_empty(), "a verifier alone is judged nothing: {out:?}");
        assert!(!out.iter().any(|d| matches!(d, Decided::Incident(_))), "and opens no incident");
        let mut call = call_span();
        call.operation_key = Some("op-9".into());
        e.ingest(NormalizedBatch { evidence: vec![call], ..Default::default() }, t0 + Duration::from_millis(200), &mut out);
        e.tick(t0 + Duration::from_millis(300), &mut out);
        let got = calls(&out);
        assert_eq!(got.len(), 1, "{out:?}");
        let want = if result == OutcomeResult::Confirmed { HealthState::Healthy } else { HealthState::FalseSuccess };
        assert_eq!((got[0].state, got[0].method.as_deref(), got[0].trace_id), (want, Some("tools/call"), [7; 16]));
        assert_eq!((e.chains().stats.verifiers_parked, e.chains().stats.joined_by_operation_key), (1, 1));
    }
}

/// A verifier whose call never comes is dropped after the late-span window, counted; no verdict.
#[test]
fn a_parked_verifier_whose_call_never_comes_is_dropped_and_counted() {
    let t0 = Moment::from_nanos(1_000_000_000_000);
    let mut e = engine(10);
    let mut out = Vec::new();
    let mut v = SpanEvidence::new([8; 16], [5; 8]);
    v.operation_key = Some("op-lost".into());
    v.outcomes.push(OutcomeReceipt {
        result: OutcomeResult::Missing,
        method: VerifierMethod::RowVersion,
        checked_at_ns: 50,
        request_id: None,
        trust: Default::default(),
    });
    e.ingest(NormalizedBatch { evidence: vec![v], ..Default::default() }, t0, &mut out);
    e.tick(t0 + Duration::from_secs(301), &mut out);
    assert!(calls(&out).is_empty());
    assert_eq!(e.chains().stats.parked_dropped, 1);
}

/// A chain with no MCP request (an HTTP span with a verifier in its trace, no call) gives no
/// verdict, only a count.
#[test]
fn a_callless_chain_yields_no_verdict_only_a_count() {
    let t0 = Moment::from_nanos(1_000_000_000_000);
    let mut e = engine(10);
    let mut out = Vec::new();
    let mut v = SpanEvidence::new([8; 16], [5; 8]);
    v.outcomes.push(OutcomeReceipt {
        result: OutcomeResult::Failed,
        method: VerifierMethod::TestResult,
        checked_at_ns: 50,
        request_id: None,
        trust: Default::default(),
    });
    e.ingest(NormalizedBatch { evidence: vec![v], ..Default::default() }, t0, &mut out);
    e.tick(t0 + Duration::from_secs(40), &mut out);
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(e.gauges().callless_chains, 1);
}

/// Issue 8, defect 6: with `ttlMs: 0` (the mcp SDK 2.3 default on 2026-07-28) a discovery is
/// stale the moment after it ends. The engine moves the catalog verdict (line, gate) on its clock
/// when the TTL expires, with no new evidence, instead of saying `converged` until the next span.
#[test]
fn a_ttl_expiry_is_a_catalog_transition_at_the_expiry_with_no_new_evidence() {
    use crate::evidence::catalog::{CatalogFacts, ListPage};
    let t0 = 1_000_000_000_000u64;
    let mut e = engine(10);
    let mut out = Vec::new();
    let installed = crate::classify::digest::registry_digest(&[crate::classify::digest::ToolDigest {
        name: "t".into(),
        digest: "sha256:aa".into(),
        projection_version: crate::classify::digest::PROJECTION_VERSION.into(),
    }]);
    let mut page = SpanEvidence::new([9; 16], [1; 8]);
    page.session_id = Some("s-ttl".into());
    page.side = Side::Client;
    page.method = Some(Method::ToolsList);
    page.start_ns = t0;
    page.end_ns = t0 + 1_000;
    page.catalog = Some(Box::new(CatalogFacts {
        page: Some(ListPage {
            cursor: None,
            next_cursor_present: false,
            tools: vec![(Arc::from("t"), Arc::from("sha256:aa"))],
            ttl_ms: Some(2_000),
            cache_scope: None,
        }),
        installed_digest: Some(Arc::from(installed.as_str())),
        ..Default::default()
    }));
    e.ingest(NormalizedBatch { evidence: vec![page], ..Default::default() }, Moment::from_nanos(t0 + 1_000), &mut out);
    let conv = |out: &[Decided]| {
        out.iter()
            .filter_map(|d| match d {
                Decided::Catalog(c) => Some(c.verdict.convergence),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(conv(&out), vec![Convergence::Converged]);
    let gate = |e: &Engine| e.board().get("session:s-ttl").map(|(_, v)| v.convergence);
    assert_eq!(gate(&e), Some(Convergence::Converged));
    out.clear();
    // Time passes within the TTL: nothing changes.
    e.tick(Moment::from_nanos(t0 + 1_500_000_000), &mut out);
    assert!(conv(&out).is_empty());
    // Past the TTL, with no new span: one transition, and the gate says so.
    e.tick(Moment::from_nanos(t0 + 3_000_000_000), &mut out);
    assert_eq!(conv(&out), vec![Convergence::Stale], "{out:?}");
    assert_eq!(gate(&e), Some(Convergence::Stale));
    out.clear();
    e.tick(Moment::from_nanos(t0 + 5_000_000_000), &mut out);
    assert!(conv(&out).is_empty(), "a transition is reported once");
}

mod permutations {
    //! Issue 8: any permutation of the spans and batches of a generated set gives the same final
    //! verdicts (spans arriving within the late-span window), and none greener than in order.

    use super::*;
    use crate::evidence::{CallError, TransportOutcome};
    use proptest::prelude::*;

    /// One generated call: its client span, and what else may be known about it.
    #[derive(Clone, Debug)]
    struct Call {
        server_span: bool,
        error: u8,
        receipt: Option<(OutcomeResult, bool)>,
        /// The HTTP status of the client's HTTP span under the call (the request's POST), if one
        /// is exported: a child, so it ends first and often leaves in an earlier export.
        http: Option<u16>,
        /// The HTTP status of the server's HTTP span on `/mcp`, the parent of its MCP span (when
        /// the server exports one).
        http_server: Option<u16>,
    }

    fn call() -> impl Strategy<Value = Call> {
        (
            any::<bool>(),
            0u8..4,
            proptest::option::of((
                prop_oneof![Just(OutcomeResult::Confirmed), Just(OutcomeResult::Missing), Just(OutcomeResult::Failed)],
                any::<bool>(),
            )),
            proptest::option::of(prop_oneof![Just(200u16), Just(401), Just(403), Just(500), Just(400)]),
            proptest::option::of(prop_oneof![Just(200u16), Just(401), Just(500)]),
        )
            .prop_map(|(server_span, error, receipt, http, http_server)| Call { server_span, error, receipt, http, http_server })
    }

    fn spans(calls: &[Call]) -> Vec<SpanEvidence> {
        let mut out = Vec::new();
        for (i, c) in calls.iter().enumerate() {
            let i = i as u8 + 1;
            let t0 = 1_000_000_000_000u64 + u64::from(i) * 1_000_000;
            let mut client = SpanEvidence::new([i; 16], [i; 8]);
            client.method = Some(Method::ToolsCall);
            client.side = Side::Client;
            client.tool = Some(Arc::from("create"));
            client.server = Some(Arc::from("srv:1"));
            client.request_id = Some(i.to_string().into());
            client.operation_key = Some(format!("op-{i}").into());
            client.start_ns = t0;
            client.end_ns = t0 + 500_000;
            match c.error {
                1 => client.transport = Some(TransportOutcome::ConnectionRefused),
                2 => client.error = Some(CallError::JsonRpc(-32601)),
                3 => client.http_status = Some(503),
                _ => {}
            }
            out.push(client);
            // An HTTP span on `/mcp` under the client span.
            let http = |span: u8, side: Side, status: u16, from: u64, to: u64| {
                let mut h = SpanEvidence::new([i; 16], [span; 8]);
                (h.parent_span_id, h.side, h.http_status, h.http_mcp_endpoint) = (Some([i; 8]), side, Some(status), true);
                (h.start_ns, h.end_ns) = (t0 + from, t0 + to);
                h
            };
            if let Some(status) = c.http {
                out.push(http(i.wrapping_add(150), Side::Client, status, 50_000, 450_000));
            }
            if c.server_span {
                let mut s = SpanEvidence::new([i; 16], [i.wrapping_add(100); 8]);
                s.parent_span_id = Some([i; 8]);
                if let Some(status) = c.http_server {
                    let h = http(i.wrapping_add(180), Side::Server, status, 80_000, 420_000);
                    s.parent_span_id = Some(h.span_id);
                    out.push(h);
                }
                s.method = Some(Method::ToolsCall);
                s.side = Side::Server;
                s.tool = Some(Arc::from("create"));
                s.request_id = Some(i.to_string().into());
                s.start_ns = t0 + 100_000;
                s.end_ns = t0 + 400_000;
                out.push(s);
            }
            if let Some((result, own_trace)) = c.receipt {
                // A verifier under the call, or in a trace of its own joined by operation key.
                let mut v = SpanEvidence::new(if own_trace { [i.wrapping_add(200); 16] } else { [i; 16] }, [i.wrapping_add(50); 8]);
                if own_trace {
                    v.operation_key = Some(format!("op-{i}").into());
                } else {
                    v.parent_span_id = Some([i; 8]);
                }
                v.start_ns = t0 + 600_000;
                v.end_ns = t0 + 700_000;
                v.outcomes.push(OutcomeReceipt {
                    result,
                    method: VerifierMethod::RowVersion,
                    checked_at_ns: t0 + 700_000,
                    request_id: None,
                    trust: Default::default(),
                });
                out.push(v);
            }
        }
        out
    }

    /// Feed `batches` one per step of `steps_ms`, then let time pass and drain; the final verdict
    /// of each call (its latest revision).
    fn run(batches: Vec<Vec<SpanEvidence>>, steps_ms: &[u64]) -> BTreeMap<([u8; 16], [u8; 8]), (HealthState, String)> {
        let mut e = engine(100);
        let mut out = Vec::new();
        let mut now = Moment::from_nanos(2_000_000_000_000);
        for (i, b) in batches.into_iter().enumerate() {
            now += Duration::from_millis(steps_ms.get(i).copied().unwrap_or(0));
            e.ingest(NormalizedBatch { evidence: b, ..Default::default() }, now, &mut out);
            e.tick(now, &mut out);
        }
        e.tick(now + Duration::from_secs(40), &mut out);
        e.drain(DecidedBy::Replay, now + Duration::from_secs(41), &mut out);
        let mut last = BTreeMap::new();
        for d in &out {
            if let Decided::Call(v) = d {
                last.insert((v.trace_id, v.span_id), (v.state, format!("{:?}", v.layers)));
            }
        }
        last
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]
        #[test]
        fn any_arrival_order_gives_the_same_final_verdicts(
            calls in proptest::collection::vec(call(), 1..6),
            seed in any::<u64>(),
            cuts in proptest::collection::vec(0usize..20, 0..6),
            steps in proptest::collection::vec(0u64..400, 0..12),
        ) {
            let all = spans(&calls);
            let in_order = run(vec![all.clone()], &[]);
            let shuffled = run(shuffled_batches(&all, seed, &cuts), &steps);
            for (k, (state, _)) in &shuffled {
                let want = in_order.get(k).map(|v| v.0);
                prop_assert!(want.is_some_and(|w| state.greenness() <= w.greenness()), "{k:?}: {state:?} is greener than in order ({want:?})");
            }
            prop_assert_eq!(shuffled, in_order);
        }
    }
}

/// Issue 8, defect 5: with `max_decided: 1`, a receipt for a call whose chain was already
/// forgotten cannot revise it; it used to vanish without a trace. It is counted.
#[test]
fn late_evidence_for_a_forgotten_chain_is_counted() {
    let t0 = Moment::from_nanos(1_000_000_000_000);
    let mut e = Engine::new(EngineConfig::new(
        ChainLimits { decision_wait: Duration::from_millis(10), max_decided: 1, ..ChainLimits::default() },
        SessionLimits::default(),
    ));
    let mut out = Vec::new();
    let mut second = call_span();
    second.trace_id = [6; 16];
    e.ingest(NormalizedBatch { evidence: vec![call_span(), second], ..Default::default() }, t0, &mut out);
    e.tick(t0 + Duration::from_millis(20), &mut out);
    e.tick(t0 + Duration::from_millis(40), &mut out);
    assert_eq!(calls(&out).len(), 2);
    let mut receipt = SpanEvidence::new([7; 16], [4; 8]);
    receipt.parent_span_id = Some([1; 8]);
    receipt.outcomes.push(OutcomeReceipt {
        result: OutcomeResult::Missing,
        method: VerifierMethod::RowVersion,
        checked_at_ns: 40,
        request_id: None,
        trust: Default::default(),
    });
    let before = e.gauges().chain_stats.late_evidence_dropped;
    // Whichever of the two was forgotten to stay within max_decided, its receipt is counted.
    let mut receipt6 = receipt.clone();
    receipt6.trace_id = [6; 16];
    e.ingest(NormalizedBatch { evidence: vec![receipt, receipt6], ..Default::default() }, t0 + Duration::from_millis(50), &mut out);
    assert_eq!(e.gauges().chain_stats.late_evidence_dropped, before + 1, "one of the two chains was forgotten");
}

/// Issue 11: the engine says when its next chain falls due, so the driver decides at
/// `decision_wait` after the trace went quiet instead of on a fixed tick; deciding at exactly
/// that moment decides the chain.
#[test]
fn the_next_due_moment_is_the_decision_time() {
    let t0 = Moment::from_nanos(1_000_000_000_000);
    let mut e = engine(2000);
    let mut out = Vec::new();
    assert_eq!(e.next_due(), None, "nothing in flight, nothing due");
    e.ingest(NormalizedBatch { evidence: vec![call_span()], ..Default::default() }, t0, &mut out);
    let due = e.next_due().expect("a chain in flight is due");
    assert_eq!(due, t0 + Duration::from_millis(2000));
    e.tick(due - Duration::from_millis(1), &mut out);
    assert!(calls(&out).is_empty(), "not before");
    e.tick(due, &mut out);
    assert_eq!(calls(&out).len(), 1, "decided at the due moment");
    assert_eq!(e.next_due(), None);
}

/// A burst of chains falling due at once, decided a budget at a time (the service under a
/// memory limit): each step decides about the budget, the engine says the rest are due still,
/// and the verdicts are those of one unbounded step, in the same order.
#[test]
fn a_burst_decided_in_bounded_steps_gives_the_verdicts_of_one_step() {
    let t0 = Moment::from_nanos(1_000_000_000_000);
    let spans: Vec<SpanEvidence> = (0u16..300)
        .map(|i| {
            let mut trace = [0u8; 16];
            trace[..2].copy_from_slice(&i.to_be_bytes());
            let mut s = SpanEvidence::new(trace, [1; 8]);
            s.method = Some(Method::ToolsCall);
            s.side = Side::Client;
            s.request_id = Some(i.to_string().into());
            s.start_ns = 10;
            s.end_ns = 20;
            if i % 3 == 0 {
                s.transport = Some(crate::evidence::TransportOutcome::Timeout);
            }
            s
        })
        .collect();
    let key = |out: &[Decided]| -> Vec<(crate::evidence::TraceId, [u8; 8], HealthState, DecidedBy)> {
        calls(out).iter().map(|v| (v.trace_id, v.span_id, v.state, v.decided_by)).collect()
    };
    // Two batches, the second due later: the budget cuts across both.
    let feed = |e: &mut Engine, out: &mut Vec<Decided>| {
        e.ingest(NormalizedBatch { evidence: spans[..200].to_vec(), ..Default::default() }, t0, out);
        e.ingest(NormalizedBatch { evidence: spans[200..].to_vec(), ..Default::default() }, t0 + Duration::from_millis(5), out);
    };
    let due = t0 + Duration::from_millis(100);
    let mut one = engine(50);
    let mut all = Vec::new();
    feed(&mut one, &mut all);
    one.tick(due, &mut all);
    assert_eq!(calls(&all).len(), 300);

    let mut e = engine(50);
    let mut out = Vec::new();
    feed(&mut e, &mut out);
    let mut now = due;
    let mut steps = 0;
    while e.next_due().is_some_and(|d| d <= now) {
        let before = calls(&out).len();
        e.tick_within(now, 7, &mut out);
        let decided = calls(&out).len() - before;
        assert!((1..=7).contains(&decided), "a step decides up to its budget: {decided}");
        steps += 1;
        now += Duration::from_millis(1);
    }
    assert_eq!(steps, 300usize.div_ceil(7));
    assert_eq!(e.in_flight(), 0);
    assert_eq!(key(&out), key(&all), "the same verdicts, in the same order");
}

/// `spans` in a permutation from `seed` (Fisher-Yates with a small LCG), cut into batches at
/// `cuts` (each the length of the next batch, clamped to what is left).
fn shuffled_batches(spans: &[SpanEvidence], seed: u64, cuts: &[usize]) -> Vec<Vec<SpanEvidence>> {
    let mut perm = spans.to_vec();
    let mut x = seed | 1;
    for i in (1..perm.len()).rev() {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        perm.swap(i, (x >> 33) as usize % (i + 1));
    }
    let mut batches = Vec::new();
    let mut rest = perm.as_slice();
    for c in cuts {
        let (a, b) = rest.split_at((*c).min(rest.len()));
        batches.push(a.to_vec());
        rest = b;
    }
    batches.push(rest.to_vec());
    batches
}

/// Issue 21: one logical call's rounds (2026-07-28 `input_required`, each retry a new request id
/// echoing the `requestState` the previous round was handed), split over requests and batches in
/// any order with any pauses, give one call: one attempt in the rates, every round in it, and
/// the verdict of the in-order run.
mod rounds {
    use super::*;
    use crate::evidence::{OutcomeReceipt, OutcomeResult, ResultType, RoundFacts, VerifierMethod};
    use proptest::prelude::*;

    const T0: u64 = 2_000_000_000_000;

    /// A call of `rounds` rounds (the last one complete), with a verifier receipt when `receipt`.
    fn spans(rounds: u8, receipt: Option<OutcomeResult>) -> Vec<SpanEvidence> {
        let mut out = Vec::new();
        for r in 0..rounds {
            let mut s = SpanEvidence::new([3; 16], [r + 1; 8]);
            s.method = Some(Method::ToolsCall);
            s.side = Side::Client;
            s.tool = Some(Arc::from("confirm"));
            s.server = Some(Arc::from("srv:1"));
            s.request_id = Some((r + 1).to_string().into());
            s.protocol_version = Some(Arc::from("2026-07-28"));
            s.start_ns = T0 + u64::from(r) * 1_000_000;
            s.end_ns = s.start_ns + 500_000;
            let last = r + 1 == rounds;
            s.round = Some(Box::new(RoundFacts {
                result_type: Some(if last { ResultType::Complete } else { ResultType::InputRequired }),
                state_issued: (!last).then(|| format!("sha256:{r:016}").into()),
                state_echoed: (r > 0).then(|| format!("sha256:{:016}", r - 1).into()),
                ..RoundFacts::default()
            }));
            out.push(s);
        }
        if let Some(result) = receipt {
            let mut v = SpanEvidence::new([3; 16], [99; 8]);
            v.parent_span_id = Some([rounds; 8]);
            v.start_ns = T0 + u64::from(rounds) * 1_000_000;
            v.end_ns = v.start_ns + 100;
            v.outcomes.push(OutcomeReceipt {
                result,
                method: VerifierMethod::HttpStatus,
                checked_at_ns: v.end_ns,
                request_id: None,
                trust: Default::default(),
            });
            out.push(v);
        }
        out
    }

    /// The verdicts (not interim reports) the engine emitted, in order.
    fn run(batches: Vec<Vec<SpanEvidence>>, steps_ms: &[u64]) -> Vec<Verdict> {
        let mut e = engine(100);
        let mut out = Vec::new();
        let mut now = Moment::from_nanos(T0 + 10_000_000);
        for (i, b) in batches.into_iter().enumerate() {
            now += Duration::from_millis(steps_ms.get(i).copied().unwrap_or(0));
            e.ingest(NormalizedBatch { evidence: b, ..Default::default() }, now, &mut out);
            e.tick(now, &mut out);
        }
        e.tick(now + Duration::from_secs(5), &mut out);
        e.drain(DecidedBy::Replay, now + Duration::from_secs(6), &mut out);
        calls(&out).into_iter().cloned().collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]
        #[test]
        fn the_rounds_of_one_call_in_any_order_are_one_call(
            rounds in 1u8..5,
            receipt in proptest::option::of(prop_oneof![Just(OutcomeResult::Confirmed), Just(OutcomeResult::Missing)]),
            seed in any::<u64>(),
            cuts in proptest::collection::vec(0usize..6, 0..5),
            steps in proptest::collection::vec(0u64..400, 0..6),
        ) {
            let all = spans(rounds, receipt);
            let in_order = run(vec![all.clone()], &[]);
            prop_assert_eq!(in_order.len(), 1, "{:#?}", in_order);
            let want = &in_order[0];
            prop_assert_eq!(want.rounds, (rounds > 1).then_some(u32::from(rounds)));
            let got = run(shuffled_batches(&all, seed, &cuts), &steps);
            // One attempt: every verdict but the first is a revision of it.
            let firsts: Vec<&Verdict> = got.iter().filter(|v| v.attempt && v.supersedes.is_none()).collect();
            prop_assert_eq!(firsts.len(), 1, "one attempt: {:#?}", got);
            let last = got.last().unwrap();
            prop_assert_eq!((last.state, last.rounds, last.span_id), (want.state, want.rounds, want.span_id), "{:#?}", got);
            prop_assert!(got.iter().all(|v| v.state != HealthState::FalseSuccess || want.state == HealthState::FalseSuccess), "{:#?}", got);
        }
    }
}

/// Issue 35: a receipt dated in the future (an unsigned pipeline, or a clock far ahead) is dated
/// at its arrival, so it cannot outrank the real receipts after it; within the clock slack, and
/// in the past, receipts keep their dates.
#[test]
fn a_receipt_dated_after_its_arrival_is_dated_at_its_arrival() {
    use crate::evidence::{OutcomeReceipt, OutcomeResult, SpanEvidence, VerifierMethod};
    let now = Moment::from_nanos(1_000_000_000_000);
    let at = |offset_ms: i64| (now.as_nanos() as i64 + offset_ms * 1_000_000) as u64;
    let receipt = |checked_at_ns| OutcomeReceipt {
        result: OutcomeResult::Confirmed,
        method: VerifierMethod::Receipt,
        checked_at_ns,
        request_id: None,
        trust: Default::default(),
    };
    for (offset_ms, want_ms, capped) in [(-5_000, -5_000, 0), (0, 0, 0), (1_900, 1_900, 0), (2_100, 0, 1), (86_400_000, 0, 1)] {
        let mut ev = SpanEvidence::new([1; 16], [2; 8]);
        ev.outcomes.push(receipt(at(offset_ms)));
        let mut batch = vec![ev];
        assert_eq!(super::cap_future_receipts(&mut batch, now), capped, "{offset_ms} ms");
        assert_eq!(batch[0].outcomes[0].checked_at_ns, at(want_ms), "{offset_ms} ms");
    }
}

/// A future-dated receipt is dated at its request's arrival, not at the later moment the engine
/// took it in: a real receipt checked in between (the tap's finding, after a forgery the server
/// sent before it answered) stays the later one, however far the engine lags. Dating again
/// (as the engine does a batch dated before the journal had it) changes nothing.
#[test]
fn a_future_receipt_is_dated_at_its_arrival_not_when_the_engine_took_it_in() {
    use crate::evidence::{OutcomeReceipt, OutcomeResult, SpanEvidence, VerifierMethod};
    let arrived = Moment::from_nanos(1_000_000_000_000);
    let receipt = |result, checked_at_ns| OutcomeReceipt {
        result,
        method: VerifierMethod::Receipt,
        checked_at_ns,
        request_id: None,
        trust: Default::default(),
    };
    // Each receipt its own span under the call ([1; 16], [2; 8]).
    let with = |r: OutcomeReceipt, received: Option<Moment>| {
        let mut ev = SpanEvidence::new([1; 16], [r.checked_at_ns as u8 | 0x10; 8]);
        ev.parent_span_id = Some([2; 8]);
        ev.outcomes.push(r);
        NormalizedBatch { evidence: vec![ev], received, ..Default::default() }
    };
    let forged_at = arrived.as_nanos() + 5_000_000_000;
    let taken_in = arrived + std::time::Duration::from_millis(900);
    let mut forged = with(receipt(OutcomeResult::Confirmed, forged_at), Some(arrived));
    assert_eq!(Engine::date_receipts(&mut forged, taken_in), 1);
    assert_eq!(forged.evidence[0].outcomes[0].checked_at_ns, arrived.as_nanos(), "dated at its arrival");
    assert_eq!(Engine::date_receipts(&mut forged, taken_in), 0, "dated once");
    assert_eq!(forged.evidence[0].outcomes[0].checked_at_ns, arrived.as_nanos());
    // Without an arrival (a replay), at the moment it is taken in, as before.
    let mut replayed = with(receipt(OutcomeResult::Confirmed, forged_at), None);
    assert_eq!(Engine::date_receipts(&mut replayed, taken_in), 1);
    assert_eq!(replayed.evidence[0].outcomes[0].checked_at_ns, taken_in.as_nanos());

    // The real finding, checked 100 ms after the forgery arrived and taken in later still: it
    // is the latest receipt of the call, so it decides.
    let mut e = engine(100);
    let mut out = Vec::new();
    let mut call = call_span();
    call.trace_id = [1; 16];
    call.span_id = [2; 8];
    call.start_ns = arrived.as_nanos() - 1_000_000_000;
    call.end_ns = arrived.as_nanos() - 500_000_000;
    e.ingest(NormalizedBatch { evidence: vec![call], ..Default::default() }, arrived, &mut out);
    let mut forged = with(receipt(OutcomeResult::Confirmed, forged_at), Some(arrived));
    let dated = Engine::date_receipts(&mut forged, taken_in);
    e.ingest(forged, taken_in, &mut out);
    e.count_dated_receipts(dated);
    let finding = with(receipt(OutcomeResult::Failed, arrived.as_nanos() + 100_000_000), Some(taken_in));
    e.ingest(finding, taken_in + std::time::Duration::from_millis(10), &mut out);
    e.tick(taken_in + std::time::Duration::from_secs(60), &mut out);
    let v = out
        .iter()
        .rev()
        .find_map(|d| match d {
            Decided::Call(v) if v.trace_id == [1; 16] => Some(v.clone()),
            _ => None,
        })
        .expect("the call decided");
    assert_eq!(v.state, crate::verdict::HealthState::FalseSuccess, "{v:?}");
}

/// A verdict the sinks are done with is the next verdict's allocation; one a sink still holds
/// (the status page keeps some) is left to it. Each verdict is the new call's, whatever the
/// allocation held before.
#[test]
fn verdicts_the_sinks_let_go_are_reused_and_held_ones_are_not() {
    let mut e = engine(100);
    let t0 = Moment::from_nanos(1_000_000_000_000);
    let decide = |e: &mut Engine, trace: u8, at: Moment| {
        let mut s = call_span();
        s.trace_id = [trace; 16];
        s.tool = Some(Arc::from(format!("tool-{trace}")));
        let mut out = Vec::new();
        e.ingest(NormalizedBatch { evidence: vec![s], ..Default::default() }, at, &mut out);
        e.tick(at + Duration::from_millis(200), &mut out);
        out
    };
    let mut first = decide(&mut e, 1, t0);
    let Some(Decided::Call(v)) = first.iter().find(|d| matches!(d, Decided::Call(_))) else { panic!("a verdict") };
    let at = Arc::as_ptr(v);
    e.recycle(&mut first);
    assert!(first.is_empty());
    let mut second = decide(&mut e, 2, t0 + Duration::from_secs(1));
    let v2 = calls(&second)[0];
    assert_eq!(v2 as *const Verdict, at, "the same allocation");
    assert_eq!((v2.trace_id, v2.tool.as_deref()), ([2; 16], Some("tool-2")), "holding the new call's verdict");
    // Held by a sink: not kept, so the next verdict is a new allocation and the held one stays.
    let held: Vec<Arc<Verdict>> = second.iter().filter_map(|d| if let Decided::Call(v) = d { Some(v.clone()) } else { None }).collect();
    e.recycle(&mut second);
    let third = decide(&mut e, 3, t0 + Duration::from_secs(2));
    assert_ne!(calls(&third)[0] as *const Verdict, Arc::as_ptr(&held[0]));
    assert_eq!(held[0].tool.as_deref(), Some("tool-2"), "the held verdict is untouched");
}
