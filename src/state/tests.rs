//! Every record kind through the embedded store and back; the encoding's size.
use super::*;
use crate::classify::catalog::{CatalogEvent, CatalogEventKind, Convergence};
use crate::classify::incidents::{Cause, Incident, IncidentState, Recovery, VerifierResult};
use crate::evidence::catalog::{CatalogFacts, ListPage, SignalSource};
use crate::evidence::{
    CallError, Method, Negotiation, OutcomeReceipt, OutcomeResult, ProgressMark, Side, SpanEvidence, TransportOutcome, VerifierMethod,
};
use crate::verdict::{Confidence, HealthState, Layer};

fn page() -> ListPage {
    ListPage {
        cursor: Some("c1".into()),
        next_cursor_present: false,
        tools: vec![(Arc::from("search"), Arc::from("sha256:aa")), (Arc::from("write"), Arc::from("sha256:bb"))],
        ttl_ms: Some(60_000),
        cache_scope: Some(Arc::from("session")),
    }
}

fn rich_span(n: u8) -> SpanEvidence {
    let mut s = SpanEvidence::new([n; 16], [n; 8]);
    s.parent_span_id = Some([9; 8]);
    s.side = Side::Client;
    s.start_ns = 1_700_000_000_000_000_000;
    s.end_ns = 1_700_000_000_250_000_000;
    s.method = Some(Method::ToolsCall);
    s.tool = Some(Arc::from("search"));
    s.request_id = Some("42".into());
    s.session_id = Some("sess-1".into());
    s.protocol_version = Some(Arc::from("2025-11-25"));
    s.server = Some(Arc::from("api.example:443"));
    s.error = Some(CallError::JsonRpc(-32603));
    s.http_status = Some(200);
    s.transport = Some(TransportOutcome::Ok);
    s.credential_hash = Some("abcd".into());
    s.negotiation =
        Some(Negotiation { requested_version: Some("2025-11-25".into()), version_accepted: Some(true), missing_capabilities: vec![] });
    s.outcomes.push(OutcomeReceipt {
        result: OutcomeResult::Confirmed,
        method: VerifierMethod::Receipt,
        checked_at_ns: 5,
        request_id: None,
        trust: Default::default(),
    });
    s.operation_key = Some("op-1".into());
    s.progress = Some(Box::new(ProgressMark { token: "p".into(), value: 0.5, total: Some(1.0), at_ns: 7 }));
    s.catalog = Some(Box::new(CatalogFacts { signal: Some(SignalSource::Notification), page: Some(page()), ..Default::default() }));
    s.service = Some(Arc::from("agent-a"));
    s
}

pub(super) fn session() -> SessionRecord {
    SessionRecord {
        events: vec![
            CatalogEvent { at_ns: 1, kind: CatalogEventKind::Capability(true) },
            CatalogEvent { at_ns: 10, kind: CatalogEventKind::Page { start_ns: 9, page: page() } },
            CatalogEvent { at_ns: 11, kind: CatalogEventKind::Installed(Arc::from("sha256:cc")) },
            CatalogEvent { at_ns: 20, kind: CatalogEventKind::Signal(SignalSource::Subscription) },
            CatalogEvent { at_ns: 30, kind: CatalogEventKind::Reconnect },
        ],
        page_requests: vec!["7".into()],
        last_seen_ns: 123,
        last: Some(Convergence::Stale),
        last_activity_ns: 30,
        server: Some(Arc::from("api.example:443")),
        trace_id: [1; 16],
        span_id: [2; 8],
        emitted: Some(Convergence::Stale),
        has_ttl: true,
    }
}

pub(super) fn incident() -> Incident {
    Incident {
        id: "0123456789abcdef".into(),
        cause: Cause {
            first_failed_layer: Some(Layer::Authorization),
            state: HealthState::NeedsAuth,
            server: Some(Arc::from("api.example:443")),
            error_class: Some("invalid_token".into()),
            credential_hash: Some("abcd".into()),
            tool: None,
        },
        state: IncidentState::Open,
        agents: Arc::new([Arc::from("agent-a")].into_iter().collect()),
        calls: 3,
        sessions: Arc::new(["h1".to_string()].into_iter().collect()),
        retry_count: 3,
        first_evidence_ns: 1,
        last_evidence_ns: 9,
        confidence: Confidence::High,
        required_authority: Some("repo:read".into()),
        verifier_result: Some(VerifierResult::FailedOrMissing),
        next_action: "refresh the credential".into(),
    }
}

fn decided() -> DecidedRecord {
    DecidedRecord {
        trace_id: [3; 16],
        spans: std::sync::Arc::new(vec![rich_span(3), rich_span(4)]),
        root_seen: true,
        truncated: false,
        revision: 2,
        decided_at_ns: 77,
    }
}

/// A server's part of the incident book: one open incident and one recent healthy call.
pub(super) fn server_incidents() -> ServerIncidents {
    let rec = Recovery { scope: crate::classify::incidents::Scope::Session(Some(Arc::from("search")), None, "h1".into()), end_ns: 5 };
    let mut resolved = incident();
    resolved.state = crate::classify::incidents::IncidentState::Resolved;
    resolved.cause.tool = Some(Arc::from("search"));
    ServerIncidents { server: Some(Arc::from("api.example:443")), open: vec![incident()], recent: vec![rec], resolved: vec![resolved] }
}

pub(super) fn all_changes() -> Changes {
    let mut c = Changes::default();
    c.put("session:sess-1".into(), Record::Session(Box::new(session())));
    c.put(server_key(Some("api.example:443")), Record::Incidents(Box::new(server_incidents())));
    c.put(trace_key(&[3; 16]), Record::Decided(Box::new(decided())));
    c.put("op-1".into(), Record::Operation([3; 16]));
    let d = DriftRecord { server: Arc::from("s"), tool: Arc::from("t"), digest: Arc::from("sha256:dd") };
    c.put(d.key(), Record::DriftReported(d));
    c.put(server_key(Some("api.example:443")), Record::Split(SplitRecord { server: Some(Arc::from("api.example:443")) }));
    c
}

pub(super) fn check(s: &Snapshot) {
    assert_eq!(s.sessions, vec![("session:sess-1".to_string(), session())]);
    assert_eq!(s.incidents, vec![server_incidents()]);
    assert_eq!(s.incidents[0].recent[0].scope, crate::classify::incidents::Scope::Session(Some(Arc::from("search")), None, "h1".into()));
    assert_eq!(s.decided, vec![decided()]);
    assert_eq!(s.operations, vec![("op-1".to_string(), [3; 16])]);
    assert_eq!(s.drift_reported, vec![DriftRecord { server: Arc::from("s"), tool: Arc::from("t"), digest: Arc::from("sha256:dd") }]);
    assert_eq!(s.splits, vec![SplitRecord { server: Some(Arc::from("api.example:443")) }]);
}

#[test]
fn every_record_kind_round_trips_through_the_embedded_store_and_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut st = EmbeddedStore::open(dir.path()).unwrap();
        assert!(st.load().unwrap().is_empty());
        st.apply(&all_changes()).unwrap();
        check(&st.load().unwrap());
    }
    // Another process (here: another open) finds the same records.
    let mut st = EmbeddedStore::open(dir.path()).unwrap();
    check(&st.load().unwrap());
    // Deletes remove them.
    let mut del = Changes::default();
    for c in all_changes().changes {
        del.delete(c.table, c.key);
    }
    st.apply(&del).unwrap();
    assert!(st.load().unwrap().is_empty());
}

#[test]
fn the_memory_store_keeps_the_same_records() {
    let mut st = MemoryStore::new();
    st.apply(&all_changes()).unwrap();
    check(&st.load().unwrap());
}

/// Clients of one shared memory store refuse, as Redis's compare-and-set does, a write of a
/// record another client changed since this one saw it, and write the rest of the apply.
#[test]
fn a_shared_memory_client_is_refused_a_record_another_changed_since_it_saw_it() {
    let memory = SharedMemory::default();
    let (mut a, mut b) = (memory.instance(), memory.instance());
    let one = |key: &str| {
        let mut c = Changes::default();
        c.put(key.to_string(), Record::Operation([1; 16]));
        c
    };
    let refused = |r: Result<(), StoreError>| match r {
        Err(StoreError::Conflict { refused, .. }) => refused.into_iter().map(|(_, k)| k).collect::<Vec<_>>(),
        other => panic!("{other:?}"),
    };
    a.apply(&one("k")).unwrap();
    // b never saw `k`: it expects it absent.
    assert_eq!(refused(b.apply(&one("k"))), vec!["k"]);
    // Read, then written; a's view is now stale, for writes and deletes alike.
    assert!(b.get(Table::Operations, "k").unwrap().is_some());
    b.apply(&one("k")).unwrap();
    assert_eq!(refused(a.apply(&one("k"))), vec!["k"]);
    let mut del = Changes::default();
    del.delete(Table::Operations, "k".to_string());
    assert_eq!(refused(a.apply(&del)), vec!["k"]);
    // Refused keys alone: the other changes of the apply are written.
    let mut both = one("k");
    both.put("other".to_string(), Record::Operation([2; 16]));
    assert_eq!(refused(a.apply(&both)), vec!["k"]);
    assert!(b.peek(Table::Operations, "other").unwrap().is_some());
    // A delete leaves a tombstone: a client that saw it may create the key again, one that
    // never saw the key may not.
    b.apply(&del).unwrap();
    assert_eq!(refused(a.apply(&one("k"))), vec!["k"]);
    b.apply(&one("k")).unwrap();
}

/// Issue 35: one record that cannot be read is skipped and named, never the reason to forget
/// the rest. A damaged record in each table (its bytes flipped), and one marked with a future
/// format version: every other record loads, each bad one is named with its reason, and the
/// future one is left in the file as it was (not rewritten by the load).
#[test]
fn a_damaged_or_newer_record_is_skipped_and_named_and_the_rest_loads() {
    let dir = tempfile::tempdir().unwrap();
    let mut st = EmbeddedStore::open(dir.path()).unwrap();
    st.apply(&all_changes()).unwrap();
    let good = all_changes();
    // Every table gets a damaged record beside the good ones (a frame, then bytes that decode
    // as nothing: flipped).
    let mut bad = Vec::new();
    for c in &good.changes {
        let Some(r) = &c.value else { continue };
        let mut bytes = r.encode().unwrap();
        let n = bytes.len();
        for b in bytes[format::MAGIC.len() + 1..].iter_mut().take(n / 2) {
            *b ^= 0xff;
        }
        bytes.truncate(format::MAGIC.len() + 1 + (n - format::MAGIC.len() - 1) / 3);
        bad.push((c.table, format!("damaged-{}", c.table.as_str()), bytes));
    }
    // And one record a newer build wrote: format version CURRENT + 1.
    let mut newer = format::MAGIC.to_vec();
    newer.push((format::CURRENT + 1) as u8);
    newer.extend_from_slice(b"whatever a newer build writes");
    bad.push((Table::Incidents, "=newer.example".to_string(), newer.clone()));
    st.put_raw(&bad).unwrap();
    let loaded = st.load().unwrap();
    check(&loaded);
    let mut named: Vec<(Table, String, SkipReason)> = loaded.skipped.iter().map(|s| (s.table, s.key.clone(), s.why)).collect();
    named.sort_by(|a, b| a.1.cmp(&b.1));
    let mut want: Vec<(Table, String, SkipReason)> = bad
        .iter()
        .map(|(t, k, _)| (*t, k.clone(), if k.starts_with('=') { SkipReason::Newer(format::CURRENT + 1) } else { SkipReason::Damaged }))
        .collect();
    want.sort_by(|a, b| a.1.cmp(&b.1));
    assert_eq!(named, want);
    // The newer record is still there, byte for byte.
    assert_eq!(st.get_raw(Table::Incidents, "=newer.example").unwrap(), Some(newer));
    // Reading it alone is no record, never a misread one.
    assert!(st.get(Table::Incidents, "=newer.example").unwrap().is_none());
    let mut counts = SkipCounts::default();
    for s in &loaded.skipped {
        counts.add(s.table, s.why);
    }
    assert_eq!(counts.total(), bad.len() as u64);
    assert!(counts.entries().any(|(t, why, n)| t == Table::Incidents && why == "newer_version" && n == 1));
}

/// What this build writes is framed with its format version; a record without a frame reads as
/// 0.1.0's layout (version 0).
#[test]
fn records_are_written_framed_with_the_current_version() {
    for c in all_changes().changes {
        let bytes = c.value.unwrap().encode().unwrap();
        assert!(matches!(format::framed(&bytes), format::Framed::Version(format::CURRENT, _)));
    }
}

/// The stored bytes are postcard's own, byte for byte, after the frame: a record is appended to a
/// command by the store's own writer, and every other instance reads it with postcard.
#[test]
fn a_record_is_written_as_postcard_writes_it_after_its_frame() {
    for c in all_changes().changes {
        let r = c.value.unwrap();
        let bare = match &r {
            Record::Session(x) => postcard::to_stdvec(x),
            Record::Incidents(x) => postcard::to_stdvec(x),
            Record::Decided(x) => postcard::to_stdvec(x),
            Record::Operation(x) => postcard::to_stdvec(x),
            Record::DriftReported(x) => postcard::to_stdvec(x),
            Record::Refusals(x) => postcard::to_stdvec(x),
            Record::Halves(x) => postcard::to_stdvec(x),
            Record::Parked(x) => postcard::to_stdvec(x),
            Record::Split(x) => postcard::to_stdvec(x),
        };
        let mut out = b"before".to_vec();
        r.encode_into(format::CURRENT, &mut out).unwrap();
        assert_eq!(out, [&b"before"[..], &format::frame(&bare.unwrap())].concat(), "{:?}", c.table);
    }
}

/// Why postcard: the same records, measured in both encodings.
#[test]
fn postcard_is_smaller_than_json_for_the_records() {
    let d = decided();
    let (pc, js) = (encode(&d).unwrap().len(), serde_json::to_vec(&d).unwrap().len());
    let (spc, sjs) = (encode(&session()).unwrap().len(), serde_json::to_vec(&session()).unwrap().len());
    let (ipc, ijs) = (encode(&incident()).unwrap().len(), serde_json::to_vec(&incident()).unwrap().len());
    println!("decided chain: postcard {pc} B, json {js} B; session: {spc} B vs {sjs} B; incident: {ipc} B vs {ijs} B");
    assert!(pc * 2 < js && spc * 2 < sjs && ipc < ijs);
}

/// While a 0.1.0 instance shares the store, records are written in its layout: bare, and read
/// back (by 0.1.0's layout, as 0.1.0 reads them) to what they held, less only what 0.1.0 could
/// not hold: a `Waiting` incident cause reads as `Working`, an `untrusted` receipt is left out.
#[test]
fn records_written_for_protocol_0_are_bare_and_read_back_as_0_1_0_reads_them() {
    for c in all_changes().changes {
        let r = c.value.unwrap();
        let bytes = r.encode_as(0).unwrap();
        if c.table == Table::Splits {
            // 0.1.0 has no such table and never reads it.
            continue;
        }
        assert!(matches!(format::framed(&bytes), format::Framed::Bare(_)), "{:?} is bare", c.table);
        let back = super::v0::decode(c.table, &c.key, &bytes, Default::default()).unwrap();
        assert_eq!(back.encode().unwrap(), r.encode().unwrap(), "{:?} reads back as it was", c.table);
    }
    // A waiting call's incident is a working one to 0.1.0; an untrusted receipt is not kept.
    let mut inc = server_incidents();
    inc.open[0].cause.state = crate::verdict::HealthState::Waiting;
    let back =
        super::v0::decode(Table::Incidents, "k", &Record::Incidents(Box::new(inc)).encode_as(0).unwrap(), Default::default()).unwrap();
    let Record::Incidents(back) = back else { panic!() };
    assert_eq!(back.open[0].cause.state, crate::verdict::HealthState::Working);
    let mut d = decided();
    let mut span = d.spans[0].clone();
    span.outcomes = vec![crate::evidence::OutcomeReceipt {
        result: crate::evidence::OutcomeResult::Confirmed,
        method: crate::evidence::VerifierMethod::Receipt,
        checked_at_ns: 5,
        request_id: None,
        trust: crate::evidence::receipt::ReceiptTrust::Untrusted,
    }]
    .into();
    d.spans = Arc::new(vec![span]);
    let back = super::v0::decode(Table::Decided, "k", &Record::Decided(Box::new(d)).encode_as(0).unwrap(), Default::default()).unwrap();
    let Record::Decided(back) = back else { panic!() };
    assert!(back.spans[0].outcomes.is_empty(), "an untrusted receipt would be evidence to 0.1.0");
}

/// A receipt 0.1.0 stored was never signed: it reads as `unsigned` where the service trusts no
/// receipt key, and as `untrusted` where it trusts some (the store's read policy, set from the
/// configuration when the store is opened) — never more evidence than a new unsigned receipt.
#[test]
fn a_receipt_0_1_0_stored_reads_by_the_receipt_policy() {
    use crate::evidence::receipt::ReceiptTrust;
    let mut d = decided();
    let mut span = d.spans[0].clone();
    span.outcomes = vec![crate::evidence::OutcomeReceipt {
        result: crate::evidence::OutcomeResult::Confirmed,
        method: crate::evidence::VerifierMethod::Receipt,
        checked_at_ns: 5,
        request_id: None,
        trust: ReceiptTrust::Unsigned,
    }]
    .into();
    d.spans = Arc::new(vec![span]);
    let bytes = Record::Decided(Box::new(d)).encode_as(0).unwrap();
    let trust = |read: ReadPolicy| {
        let Record::Decided(back) = Record::decode_with(Table::Decided, "k", &bytes, read).unwrap() else { panic!() };
        back.spans[0].outcomes.iter().map(|o| o.trust).collect::<Vec<_>>()
    };
    assert_eq!(trust(ReadPolicy::default()), [ReceiptTrust::Unsigned]);
    assert_eq!(trust(ReadPolicy { receipt_keys_trusted: true }), [ReceiptTrust::Untrusted]);
}

/// `n` decided chains, trace `i` decided at `(i / 2) * 10` (two chains to each decision time,
/// so that ties are decided by trace id), each with a call naming the operation key `op-<i>`.
pub(super) fn many_decided(n: u16) -> Changes {
    let mut c = Changes::default();
    for i in 0..n {
        let mut trace = [0u8; 16];
        trace[..2].copy_from_slice(&(i + 1).to_be_bytes());
        let mut call = SpanEvidence::new(trace, [1; 8]);
        call.method = Some(crate::evidence::Method::ToolsCall);
        call.operation_key = Some(format!("op-{i}").into());
        let verifier = SpanEvidence::new(trace, [2; 8]);
        let r = DecidedRecord {
            trace_id: trace,
            spans: Arc::new(vec![call, verifier]),
            root_seen: true,
            truncated: false,
            revision: 0,
            decided_at_ns: u64::from(i / 2) * 10,
        };
        c.put(trace_key(&trace), Record::Decided(Box::new(r)));
    }
    c
}

/// What a start-up load of [`many_decided`] holds under a bound: the `keep` newest chains whole,
/// the next `forgotten` by trace and operation keys, newest first (by decision time, then trace
/// id, whatever order the store answers in), and a count of every chain read. A load without a
/// bound holds every chain whole.
pub(super) fn check_bounded_load(st: &mut dyn StateStore, n: u16) {
    let trace = |i: u16| {
        let mut t = [0u8; 16];
        t[..2].copy_from_slice(&(i + 1).to_be_bytes());
        t
    };
    let bound = DecidedBound { keep: 3, forgotten: 4, name_let_go: true };
    let snap = st.load_into(Snapshot::bounded(bound)).unwrap();
    let newest: Vec<TraceId> = (0..n).rev().map(trace).collect();
    assert_eq!(snap.decided_read, u64::from(n));
    assert_eq!(snap.decided.iter().map(|d| d.trace_id).collect::<Vec<_>>(), newest[..3]);
    assert_eq!(snap.forgotten.iter().map(|d| d.trace_id).collect::<Vec<_>>(), newest[3..7]);
    let i = n - 4;
    assert_eq!(snap.forgotten[0].operation_keys, vec![Box::<str>::from(format!("op-{i}"))]);
    assert_eq!(snap.forgotten[0].decided_at_ns, u64::from(i / 2) * 10);
    // The rest, by trace: each once.
    let mut let_go = snap.let_go.clone();
    let_go.sort_unstable();
    let mut older = newest[7.min(newest.len())..].to_vec();
    older.sort_unstable();
    assert_eq!(let_go, older);
    let all = st.load().unwrap();
    assert_eq!((all.decided.len(), all.forgotten.len(), all.let_go.len()), (usize::from(n), 0, 0));
}

#[test]
fn a_bounded_load_keeps_the_newest_decided_chains_from_every_store() {
    // Past the bound's slack, so that the load drops the oldest while it reads.
    let n = 2 * BOUND_SLACK as u16 + 7;
    let mut st = MemoryStore::new();
    st.apply(&many_decided(n)).unwrap();
    check_bounded_load(&mut st, n);
    let dir = tempfile::tempdir().unwrap();
    let mut st = EmbeddedStore::open(dir.path()).unwrap();
    st.apply(&many_decided(n)).unwrap();
    check_bounded_load(&mut st, n);
    // A few only: nothing is dropped before the end.
    let mut st = MemoryStore::new();
    st.apply(&many_decided(9)).unwrap();
    check_bounded_load(&mut st, 9);
}
