//! The engine with a state store: what it kept outlives the engine (a restart), on a manual clock.
use super::*;
use crate::classify::incidents::Transition;
use crate::correlate::{ChainLimits, SessionLimits};
use crate::evidence::catalog::{CatalogFacts, ListPage, SignalSource};
use crate::evidence::{OutcomeReceipt, OutcomeResult, Side, SpanEvidence, TransportOutcome, VerifierMethod};
use crate::normalize::NormalizedBatch;
use crate::state::{MemoryStore, StoreHandle};
use std::time::Duration;

const T0: u64 = 1_000_000_000_000;

fn engine_with(store: &StoreHandle) -> Engine {
    let mut cfg =
        EngineConfig::new(ChainLimits { decision_wait: Duration::from_millis(10), ..ChainLimits::default() }, SessionLimits::default());
    cfg.store = Some(store.clone());
    Engine::new(cfg)
}

fn at(ms: u64) -> Moment {
    Moment::from_nanos(T0) + Duration::from_millis(ms)
}

fn batch(evidence: Vec<SpanEvidence>) -> NormalizedBatch {
    NormalizedBatch { evidence, ..Default::default() }
}

/// A session whose catalog went stale: capability, page, install, then a list-change signal.
fn stale_session() -> Vec<SpanEvidence> {
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
    vec![
        fact(1, 1, CatalogFacts { list_changed_capability: Some(true), ..Default::default() }),
        listed,
        fact(3, 11, CatalogFacts { installed_digest: Some(Arc::from(installed.as_str())), ..Default::default() }),
        fact(4, 20, CatalogFacts { signal: Some(SignalSource::Notification), ..Default::default() }),
    ]
}

fn call(trace: u8, start_ns: u64) -> SpanEvidence {
    let mut s = SpanEvidence::new([trace; 16], [1; 8]);
    s.method = Some(Method::ToolsCall);
    s.side = Side::Client;
    s.tool = Some(Arc::from("t"));
    s.server = Some(Arc::from("srv:1"));
    s.request_id = Some("1".into());
    s.start_ns = start_ns;
    s.end_ns = start_ns + 10;
    s
}

fn refused(trace: u8, start_ns: u64) -> SpanEvidence {
    let mut s = call(trace, start_ns);
    s.transport = Some(TransportOutcome::ConnectionRefused);
    s
}

/// A verifier in a trace of its own that names the operation key of the call it confirmed.
fn verifier_by_key(key: &str) -> SpanEvidence {
    let mut v = SpanEvidence::new([6; 16], [6; 8]);
    v.operation_key = Some(key.into());
    v.outcomes.push(OutcomeReceipt {
        result: OutcomeResult::Confirmed,
        method: VerifierMethod::RowVersion,
        checked_at_ns: 260,
        request_id: None,
        trust: Default::default(),
    });
    v
}

fn calls(out: &[Decided]) -> Vec<&Verdict> {
    out.iter()
        .filter_map(|d| match d {
            Decided::Call(v) => Some(&**v),
            _ => None,
        })
        .collect()
}

fn incidents(out: &[Decided]) -> Vec<(Transition, String, u64)> {
    out.iter()
        .filter_map(|d| match d {
            Decided::Incident(i) => Some((i.transition, i.row.id.clone(), i.row.retry_count)),
            _ => None,
        })
        .collect()
}

/// Ingest, persist, drop the engine with no drain (a SIGKILL), start a new one from the store.
fn restart_keeps_state(open: &dyn Fn() -> StoreHandle) {
    let mut out = Vec::new();
    let store = open();
    let mut e = engine_with(&store);
    e.ingest(batch(stale_session()), at(0), &mut out);
    e.ingest(batch(vec![refused(1, 100), call(2, 200)]), at(1), &mut out);
    e.tick(at(20), &mut out);
    e.tick(at(200), &mut out);
    let before = e.board().get("session:s-1").expect("the gate knows the session").1;
    assert_eq!(before.convergence, Convergence::Stale);
    assert_eq!(calls(&out).iter().find(|v| v.trace_id == [2; 16]).map(|v| v.state), Some(HealthState::Unverified));
    let opened = incidents(&out);
    assert_eq!(opened.len(), 1, "{opened:?}");
    assert_eq!((opened[0].0, opened[0].2), (Transition::Opened, 1));
    drop(e);
    drop(store);

    let mut e = engine_with(&open());
    out.clear();
    // The gate finds the session with the same verdict, before any new evidence.
    assert_eq!(e.board().get("session:s-1").map(|(_, v)| v), Some(before));
    // The same failure again: the incident goes on.
    e.ingest(batch(vec![refused(3, 300)]), at(1_000), &mut out);
    // A late receipt for the call decided before the restart revises it.
    let mut receipt = SpanEvidence::new([2; 16], [5; 8]);
    receipt.parent_span_id = Some([1; 8]);
    receipt.outcomes.push(OutcomeReceipt {
        result: OutcomeResult::Confirmed,
        method: VerifierMethod::Receipt,
        checked_at_ns: 250,
        request_id: None,
        trust: Default::default(),
    });
    // A call on the stale session is still `stale_catalog`.
    let mut on_stale = call(4, 400);
    on_stale.session_id = Some("s-1".into());
    e.ingest(batch(vec![receipt, on_stale]), at(1_001), &mut out);
    e.tick(at(1_100), &mut out);
    let inc: Vec<_> = incidents(&out).into_iter().filter(|i| i.1 == opened[0].1).collect();
    assert_eq!(inc, vec![(Transition::Updated, opened[0].1.clone(), 2)], "no second `opened`");
    let got = calls(&out);
    let revised = got.iter().find(|v| v.trace_id == [2; 16]).expect("the late receipt revises the call");
    assert_eq!((revised.revision, revised.state), (1, HealthState::Healthy));
    assert_eq!(revised.supersedes.map(|p| p.state), Some(HealthState::Unverified));
    assert_eq!(got.iter().find(|v| v.trace_id == [4; 16]).map(|v| v.state), Some(HealthState::StaleCatalog));
    assert_eq!(e.store_errors(), 0);
}

#[test]
fn a_restart_from_the_memory_store_keeps_sessions_incidents_and_revisable_calls() {
    let store = StoreHandle::new(MemoryStore::new());
    restart_keeps_state(&|| store.clone());
}

#[test]
fn a_restart_from_the_embedded_store_keeps_sessions_incidents_and_revisable_calls() {
    let dir = tempfile::tempdir().unwrap();
    // The second engine opens the file again (the first one's handle is closed by then).
    restart_keeps_state(&|| StoreHandle::open_directory(dir.path()).unwrap());
}

/// A decided chain past the late-span window is forgotten on load like in memory: no revision.
#[test]
fn a_decided_chain_past_the_window_is_forgotten_after_a_restart() {
    let store = StoreHandle::new(MemoryStore::new());
    let mut out = Vec::new();
    let mut e = engine_with(&store);
    e.ingest(batch(vec![call(2, 200)]), at(0), &mut out);
    e.tick(at(20), &mut out);
    e.drain(DecidedBy::Shutdown, at(30), &mut out);
    drop(e);
    let mut e = engine_with(&store);
    out.clear();
    e.tick(at(301_000), &mut out);
    let mut receipt = SpanEvidence::new([2; 16], [5; 8]);
    receipt.parent_span_id = Some([1; 8]);
    receipt.outcomes.push(OutcomeReceipt {
        result: OutcomeResult::Confirmed,
        method: VerifierMethod::Receipt,
        checked_at_ns: 250,
        request_id: None,
        trust: Default::default(),
    });
    e.ingest(batch(vec![receipt]), at(301_001), &mut out);
    e.tick(at(301_100), &mut out);
    assert!(calls(&out).iter().all(|v| v.revision == 0), "{out:?}");
    // The store forgot it too.
    let snap = store.load().unwrap();
    assert!(snap.decided.is_empty(), "{:?}", snap.decided.len());
}

/// A store that fails is counted and the engine goes on with the same verdicts, except that those
/// decided while it is down are marked partial (`store_unavailable`, low confidence, never
/// greener: issue 12's "store down" rule).
#[test]
fn a_failing_store_is_counted_and_marks_verdicts_partial_never_greener() {
    struct Broken;
    impl crate::state::StateStore for Broken {
        fn load_into(&mut self, _: crate::state::Snapshot) -> Result<crate::state::Snapshot, crate::state::StoreError> {
            Err(crate::state::StoreError::Backend("down".into()))
        }
        fn apply(&mut self, _: &crate::state::Changes) -> Result<(), crate::state::StoreError> {
            Err(crate::state::StoreError::Backend("down".into()))
        }
        fn get(&mut self, _: crate::state::Table, _: &str) -> Result<Option<crate::state::Record>, crate::state::StoreError> {
            Err(crate::state::StoreError::Backend("down".into()))
        }
    }
    let run = |store: Option<StoreHandle>| {
        let mut cfg =
            EngineConfig::new(ChainLimits { decision_wait: Duration::from_millis(10), ..ChainLimits::default() }, SessionLimits::default());
        cfg.store = store;
        let mut e = Engine::new(cfg);
        let mut out = Vec::new();
        e.ingest(batch(stale_session()), at(0), &mut out);
        e.ingest(batch(vec![refused(1, 100), call(2, 200)]), at(1), &mut out);
        e.tick(at(200), &mut out);
        e.drain(DecidedBy::Shutdown, at(300), &mut out);
        let lines: Vec<String> = out.iter().map(|d| d.to_json().unwrap().to_string()).collect();
        (lines, e.gauges().store_errors)
    };
    let (plain, errs0) = run(None);
    let (broken, errs) = run(Some(StoreHandle::new(Broken)));
    assert_eq!(plain.len(), broken.len());
    let mut marked = 0;
    for (p, b) in plain.iter().zip(&broken) {
        let (p, mut b): (serde_json::Value, serde_json::Value) = (serde_json::from_str(p).unwrap(), serde_json::from_str(b).unwrap());
        if p.get("state").is_some() {
            // A call verdict: the same state (none of these is healthy, so none is capped), marked.
            assert_eq!(p["state"], b["state"], "{p} / {b}");
            assert!(p.get("partial").is_none(), "{p}");
            assert_eq!((b["partial"].as_str(), b["confidence"].as_str()), (Some("store_unavailable"), Some("low")), "{b}");
            marked += 1;
            let o = b.as_object_mut().unwrap();
            o.remove("partial");
            for k in ["confidence", "reason", "next_action"] {
                o.insert(k.to_string(), p[k].clone());
            }
        } else if p["incident"] == true {
            // The incident's confidence is its verdicts'.
            assert_eq!(b["row"]["confidence"], "low", "{b}");
            b["row"]["confidence"] = p["row"]["confidence"].clone();
        }
        // Everything else is as without a store.
        assert_eq!(p, b);
    }
    assert!(marked >= 2, "{marked}");
    assert_eq!(errs0, 0);
    assert!(errs >= 2, "the load and the writes are counted: {errs}");
}

/// Issue 8, defect 5: a decided chain forgotten under `max_decided` before its late-span window
/// passed is revised from the store by a late receipt; without a store the receipt is dropped.
#[test]
fn late_evidence_for_a_chain_forgotten_under_a_bound_revises_it_from_the_store() {
    let run = |store: Option<StoreHandle>| {
        let mut cfg = EngineConfig::new(
            ChainLimits { decision_wait: Duration::from_millis(10), max_decided: 1, ..ChainLimits::default() },
            SessionLimits::default(),
        );
        cfg.store = store;
        let mut e = Engine::new(cfg);
        let mut out = Vec::new();
        let mut first = call(2, 200);
        first.operation_key = Some("op-2".into());
        e.ingest(batch(vec![first]), at(0), &mut out);
        e.tick(at(20), &mut out);
        // A second decided chain pushes the first out of memory (max_decided: 1).
        e.ingest(batch(vec![call(5, 300)]), at(200), &mut out);
        e.tick(at(400), &mut out);
        out.clear();
        // A verifier in its own trace, by operation key, and a receipt under the call.
        let by_key = verifier_by_key("op-2");
        e.ingest(batch(vec![by_key]), at(10_000), &mut out);
        e.tick(at(10_100), &mut out);
        (calls(&out).into_iter().map(|v| (v.trace_id, v.revision, v.state)).collect::<Vec<_>>(), e)
    };
    let (plain, e) = run(None);
    assert!(plain.is_empty(), "{plain:?}");
    assert_eq!(e.chains().stats.late_evidence_dropped, 1, "in memory only, it comes too late: {:?}", e.chains().stats);
    let store = StoreHandle::new(MemoryStore::new());
    let (with_store, mut e) = run(Some(store.clone()));
    assert_eq!(with_store, vec![([2; 16], 1, HealthState::Healthy)]);
    // Once the window passes, the store forgets the chains too.
    let mut out = Vec::new();
    e.tick(at(400_000), &mut out);
    e.drain(DecidedBy::Shutdown, at(400_001), &mut out);
    let snap = store.load().unwrap();
    assert!(snap.decided.is_empty() && snap.operations.is_empty(), "{} {:?}", snap.decided.len(), snap.operations);
}

/// A restart on a store that holds more decided chains than `max_decided`: the engine takes the
/// newest whole and knows the older ones as forgotten under its bound (not read into memory);
/// late evidence for an older one still revises it from the store, as it would had this engine
/// forgotten the chain itself — a verifier by operation key, and a late HTTP span, which only a
/// chain known as forgotten brings back (alone it starts no chain).
#[test]
fn a_restart_keeps_the_newest_decided_chains_and_revises_an_older_one_from_the_store() {
    let store = StoreHandle::new(MemoryStore::new());
    let mut out = Vec::new();
    let mut e = engine_with(&store);
    for (k, t) in [(2u8, 0u64), (5, 100), (7, 200), (9, 300)] {
        let mut c = call(k, 200 + t);
        c.operation_key = Some(format!("op-{k}").into());
        e.ingest(batch(vec![c]), at(t), &mut out);
        e.tick(at(t + 20), &mut out);
    }
    e.drain(DecidedBy::Shutdown, at(400), &mut out);
    drop(e);
    assert_eq!(store.load().unwrap().decided.len(), 4);
    let mut cfg = EngineConfig::new(
        ChainLimits { decision_wait: Duration::from_millis(10), max_decided: 2, ..ChainLimits::default() },
        SessionLimits::default(),
    );
    cfg.store = Some(store.clone());
    let mut e = Engine::new(cfg);
    out.clear();
    e.tick(at(1_000), &mut out);
    assert_eq!(e.chains().decided_len(), 2, "the newest chains whole, no more");
    let by_key = verifier_by_key("op-2");
    let mut http = SpanEvidence::new([5; 16], [8; 8]);
    http.parent_span_id = Some([1; 8]);
    http.side = Side::Client;
    http.http_status = Some(200);
    http.start_ns = 301;
    http.end_ns = 305;
    e.ingest(batch(vec![by_key, http]), at(10_000), &mut out);
    e.tick(at(10_100), &mut out);
    let mut revised: Vec<_> = calls(&out).into_iter().map(|v| (v.trace_id, v.revision)).collect();
    revised.sort();
    assert_eq!(revised, vec![([2; 16], 1), ([5; 16], 1)]);
}

/// A start on an embedded store that holds more decided chains than the load's two bounds
/// (`max_decided` whole, `MAX_SPILLED` more by trace) deletes the rest and their operation keys
/// with its first write round: nothing else would (the engine never knew them), and a store a
/// killed process left under heavy load kept them for every start after to read again.
#[test]
fn a_start_deletes_the_decided_chains_past_both_load_bounds_from_its_own_store() {
    use crate::state::{trace_key, Changes, DecidedRecord, Record, Table};
    let dir = tempfile::tempdir().unwrap();
    let store = StoreHandle::open_directory(dir.path()).unwrap();
    let keep = 2usize;
    let past = 5u32;
    let n = (keep + crate::correlate::chains::MAX_SPILLED) as u32 + past;
    let trace = |i: u32| {
        let mut t = [0u8; 16];
        t[..4].copy_from_slice(&(i + 1).to_be_bytes());
        t
    };
    let mut c = Changes::default();
    for i in 0..n {
        let mut call = SpanEvidence::new(trace(i), [1; 8]);
        call.method = Some(Method::ToolsCall);
        call.operation_key = Some(format!("op-{i}").into());
        // Trace `i` decided at `i` ms: the oldest are the first ones.
        let r = DecidedRecord {
            trace_id: trace(i),
            spans: Arc::new(vec![call]),
            root_seen: true,
            truncated: false,
            revision: 0,
            decided_at_ns: T0 + u64::from(i) * 1_000_000,
        };
        c.put(trace_key(&trace(i)), Record::Decided(Box::new(r)));
        c.put(format!("op-{i}"), Record::Operation(trace(i)));
    }
    store.apply(&c).unwrap();
    drop(c);

    let mut cfg = EngineConfig::new(ChainLimits { max_decided: keep, ..ChainLimits::default() }, SessionLimits::default());
    cfg.store = Some(store.clone());
    let mut e = Engine::new(cfg);
    let mut out = Vec::new();
    e.tick(Moment::from_nanos(T0 + u64::from(n) * 1_000_000), &mut out);
    e.persist(Moment::from_nanos(T0 + u64::from(n) * 1_000_000), true, &mut out);
    assert_eq!(e.store_errors(), 0);

    let gone = |i: u32| {
        (
            store.get(Table::Decided, &trace_key(&trace(i))).unwrap().is_none(),
            store.get(Table::Operations, &format!("op-{i}")).unwrap().is_none(),
        )
    };
    for i in 0..past {
        assert_eq!(gone(i), (true, true), "chain {i}, past both bounds, and its operation key are deleted");
    }
    // The oldest one the load remembers by trace, and the newest it kept whole, stay.
    assert_eq!(gone(past), (false, false));
    assert_eq!(gone(n - 1), (false, false));
}
