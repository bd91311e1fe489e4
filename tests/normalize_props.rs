//! Property tests: arbitrary OTLP spans through normalize → correlate → classify.
//!
//! Spans carry attributes drawn from the keys mcp-health reads (src/evidence/attributes.rs) and
//! random ones, with values of every `AnyValue` type, the right one or not; ids are random, short,
//! empty or all-zero; kinds and status codes are any integer. Whatever comes in, nothing panics,
//! the invalid-id count is exact, and no verdict is `healthy` unless a confirmed outcome receipt was
//! part of that trace's input.

use mcp_health::evidence::time::Moment;
use std::collections::{BTreeSet, HashSet};
use std::time::Duration;

use mcp_health::evidence::attributes as a;
use mcp_health::normalize::normalize_request;
use mcp_health::testing::classify::{classify_call, SessionContext};
use mcp_health::testing::correlate::{ChainLimits, Chains, DecidedCalls};
use mcp_health::verdict::{DecidedBy, HealthState, Layer, LayerStatus};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value::Value, AnyValue, ArrayValue, KeyValue, KeyValueList};
use opentelemetry_proto::tonic::trace::v1::{span::Event, ResourceSpans, ScopeSpans, Span, Status};
use proptest::prelude::*;

/// Every key mcp-health reads, plus the keys it writes (which an upstream mcp-health may have set).
const KNOWN_KEYS: &[&str] = &[
    a::MCP_METHOD_NAME,
    a::MCP_SESSION_ID,
    a::MCP_PROTOCOL_VERSION,
    a::JSONRPC_REQUEST_ID,
    a::RPC_RESPONSE_STATUS_CODE,
    a::ERROR_TYPE,
    a::GEN_AI_TOOL_NAME,
    a::GEN_AI_OPERATION_NAME,
    a::NETWORK_TRANSPORT,
    a::SERVER_ADDRESS,
    a::SERVER_PORT,
    a::HTTP_RESPONSE_STATUS_CODE,
    a::HTTP_STATUS_CODE_OLD,
    a::TRANSPORT_OUTCOME,
    a::REQUEST_SENT,
    a::AUTH_STATUS,
    a::AUTH_ERROR,
    a::AUTH_REQUIRED_SCOPE,
    a::SESSION_REQUESTED_VERSION,
    a::SESSION_VERSION_ACCEPTED,
    a::SESSION_MISSING_CAPABILITIES,
    a::EXECUTION_TIMEOUT,
    a::EXECUTION_OUTPUT_SCHEMA,
    a::EFFECT_BOUNDARY,
    a::OUTCOME_RESULT,
    a::OUTCOME_METHOD,
    a::OUTCOME_CHECKED_AT,
    a::OUTCOME_REQUEST_ID,
    a::OPERATION_KEY,
    a::VERDICT_STATE,
    a::VERDICT_FIRST_FAILED_LAYER,
    a::VERDICT_PROTOCOL_SUCCESS,
    a::VERDICT_VERIFIED_SUCCESS,
    a::SESSION_ID_HASH,
];

/// String values that mean something to some reader, so the classifier's paths are reached.
const MEANINGFUL: &[&str] = &[
    "tools/call",
    "tools/list",
    "initialize",
    "notifications/progress",
    "notifications/tools/list_changed",
    "confirmed",
    "missing",
    "failed",
    "stale",
    "llm_judge",
    "receipt",
    "file_digest",
    "ok",
    "timeout",
    "dns_failure",
    "connection_refused",
    "connection_reset",
    "tls_failure",
    "side_effect",
    "none",
    "valid",
    "violated",
    "true",
    "false",
    "tool_error",
    "-32601",
    "-32602",
    "-32603",
    "-32700",
    "0",
    "401",
    "403",
    "503",
    "200",
    "invalid_token",
    "insufficient_scope",
    "missing_token",
    "TimeoutError",
    "httpx.ConnectError",
    "socket.gaierror",
    "1",
    "2",
    "7",
    "tickets:write",
    "Bearer abc",
    "",
    "2025-11-25",
    "a,b,,c",
];

fn any_value() -> impl Strategy<Value = Option<AnyValue>> {
    let leaf = prop_oneof![
        4 => prop::sample::select(MEANINGFUL).prop_map(|s| Value::StringValue(s.to_string())),
        2 => ".{0,40}".prop_map(Value::StringValue),
        3 => prop_oneof![Just(401i64), Just(403), Just(503), Just(200), Just(400), Just(-32601), Just(-1), Just(7), Just(0)].prop_map(Value::IntValue),
        1 => any::<i64>().prop_map(Value::IntValue),
        2 => any::<bool>().prop_map(Value::BoolValue),
        1 => prop_oneof![any::<f64>(), Just(401.0), Just(f64::NAN), Just(f64::INFINITY), Just(-32602.0), Just(1e300)].prop_map(Value::DoubleValue),
        1 => prop::collection::vec(any::<u8>(), 0..8).prop_map(Value::BytesValue),
        1 => any::<i32>().prop_map(Value::StringValueStrindex),
    ];
    let value = leaf.prop_recursive(2, 8, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone().prop_map(|v| AnyValue { value: Some(v) }), 0..4)
                .prop_map(|values| Value::ArrayValue(ArrayValue { values })),
            prop::collection::vec(("[a-z.]{0,8}", inner).prop_map(|(k, v)| kv(k, Some(AnyValue { value: Some(v) }))), 0..3)
                .prop_map(|values| Value::KvlistValue(KeyValueList { values })),
        ]
    });
    prop_oneof![
        10 => value.prop_map(|v| Some(AnyValue { value: Some(v) })),
        1 => Just(Some(AnyValue { value: None })),
        1 => Just(None),
    ]
}

fn kv(key: String, value: Option<AnyValue>) -> KeyValue {
    KeyValue { key, value, ..Default::default() }
}

fn attribute() -> impl Strategy<Value = KeyValue> {
    let key = prop_oneof![
        6 => prop::sample::select(KNOWN_KEYS).prop_map(str::to_string),
        1 => "(mcp|mcp_health|http|rpc)\\.[a-z_.]{0,12}",
        1 => ".{0,16}",
    ];
    (key, any_value()).prop_map(|(k, v)| kv(k, v))
}

/// A few valid trace and span ids, so that spans share traces and parents; and broken ones.
fn trace_id() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        6 => (1u8..=4).prop_map(|n| vec![n; 16]),
        1 => Just(vec![0u8; 16]),
        1 => prop::collection::vec(any::<u8>(), 0..20),
    ]
}

fn span_id() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        6 => (1u8..=12).prop_map(|n| vec![n; 8]),
        1 => Just(vec![0u8; 8]),
        1 => prop::collection::vec(any::<u8>(), 0..12),
    ]
}

fn parent_id() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => Just(Vec::new()),
        4 => (1u8..=12).prop_map(|n| vec![n; 8]),
        1 => prop::collection::vec(any::<u8>(), 0..12),
    ]
}

fn event() -> impl Strategy<Value = Event> {
    let name = prop_oneof![3 => Just(a::OUTCOME_EVENT.to_string()), 1 => Just("exception".to_string()), 1 => ".{0,8}"];
    (name, any::<u64>(), prop::collection::vec(attribute(), 0..4)).prop_map(|(name, time_unix_nano, attributes)| Event {
        name,
        time_unix_nano,
        attributes,
        ..Default::default()
    })
}

fn string_attr(key: &'static str, values: &'static [&'static str]) -> impl Strategy<Value = KeyValue> {
    prop::sample::select(values).prop_map(move |v| kv(key.to_string(), Some(AnyValue { value: Some(Value::StringValue(v.to_string())) })))
}

/// The attributes of a plausible MCP span (a request, a verifier), each one optional, so that
/// random noise on top of them still reaches every state and not only the failures.
fn core_attributes() -> impl Strategy<Value = Vec<KeyValue>> {
    (
        prop::option::weighted(
            0.7,
            string_attr(a::MCP_METHOD_NAME, &["tools/call", "tools/call", "tools/list", "initialize", "notifications/progress"]),
        ),
        prop::option::weighted(0.6, string_attr(a::JSONRPC_REQUEST_ID, &["1", "2"])),
        prop::option::weighted(0.3, string_attr(a::OUTCOME_RESULT, &["confirmed", "confirmed", "missing", "failed", "stale"])),
        prop::option::weighted(0.2, string_attr(a::TRANSPORT_OUTCOME, &["ok", "timeout", "connection_refused", "connection_reset"])),
        prop::option::weighted(0.2, string_attr(a::EFFECT_BOUNDARY, &["side_effect", "none"])),
    )
        .prop_map(|(m, r, o, t, e)| [m, r, o, t, e].into_iter().flatten().collect())
}

fn span() -> impl Strategy<Value = Span> {
    (
        trace_id(),
        span_id(),
        parent_id(),
        prop_oneof![3 => 0i32..4, 1 => -1i32..7, 1 => any::<i32>()],
        prop::option::weighted(0.3, prop_oneof![(-1i32..4), any::<i32>()]),
        (0u64..1_000, 0u64..1_000),
        (core_attributes(), prop::collection::vec(attribute(), 0..6)),
        prop::collection::vec(event(), 0..2),
    )
        .prop_map(|(trace_id, span_id, parent_span_id, kind, status, (start, len), (mut attributes, noise), events)| Span {
            trace_id,
            span_id,
            parent_span_id,
            kind,
            status: status.map(|code| Status { code, ..Default::default() }),
            start_time_unix_nano: start,
            end_time_unix_nano: if len % 7 == 0 { 0 } else { start + len },
            attributes: {
                attributes.extend(noise);
                attributes
            },
            events,
            name: "span".into(),
            ..Default::default()
        })
}

/// Spans split over resource and scope groups, as exporters do.
fn request() -> impl Strategy<Value = ExportTraceServiceRequest> {
    prop::collection::vec(prop::collection::vec(prop::collection::vec(span(), 0..6), 0..3), 0..3).prop_map(|rs| ExportTraceServiceRequest {
        resource_spans: rs
            .into_iter()
            .map(|ss| ResourceSpans {
                scope_spans: ss.into_iter().map(|spans| ScopeSpans { spans, ..Default::default() }).collect(),
                ..Default::default()
            })
            .collect(),
    })
}

/// Span names a dialect claims, and others.
const NAMES: &[&str] = &[
    "span",
    "MCP send tools/call",
    "MCP request: tools/call create_ticket",
    "MCP server handle request: tools/call",
    "tools/call create_ticket",
    "POST /mcp",
    "GET /api/orders/{id}",
    "create_ticket.tool",
    "tools/call.mcp",
    "ResponseStreamWriter",
];

/// Scope names a dialect owns, the tap's, and others.
const SCOPE_NAMES: &[&str] = &[
    "",
    "fastmcp",
    "logfire.mcp",
    "mcp-python-sdk",
    "opentelemetry.instrumentation.mcp.instrumentation",
    "mcp-health-tap",
    "io.opentelemetry.http",
];

/// An attribute a shared pipeline's spans carry: an HTTP span's path, URL and status, on an MCP
/// endpoint or not; a key a dialect claims a span by; raw tool definitions.
fn pipeline_attribute() -> impl Strategy<Value = KeyValue> {
    let string = |k: &'static str, v: &'static [&'static str]| string_attr(k, v).boxed();
    let int = |k: &'static str| {
        prop::sample::select(&[200i64, 401, 503][..])
            .prop_map(move |n| kv(k.to_string(), Some(AnyValue { value: Some(Value::IntValue(n)) })))
            .boxed()
    };
    let paths: &'static [&'static str] = &["/mcp", "/api/orders", "/v1/mcp/", "/x?next=/mcp", "/mcp#f"];
    let urls: &'static [&'static str] = &["https://h/mcp", "https://h/api", "http://u:p@h:1/mcp#f", "https://h?next=/mcp", "/mcp"];
    prop_oneof![
        string(a::URL_PATH, paths),
        string(a::HTTP_ROUTE, paths),
        string(a::HTTP_TARGET_OLD, paths),
        string(a::URL_FULL, urls),
        string(a::HTTP_URL_OLD, urls),
        int(a::HTTP_RESPONSE_STATUS_CODE),
        int(a::HTTP_STATUS_CODE_OLD),
        string("fastmcp.tool.name", &["create_ticket"]),
        string("traceloop.span.kind", &["tool", "task"]),
        string("traceloop.entity.name", &["tools/call"]),
        string(a::CATALOG_TOOLS, &["[]"]),
        string("rpc.method", &["tools/list", "initialize"]),
        string("response", &[r#"{"isError":true}"#, r#"{"code":-32602}"#]),
        string("mcp.request.id", &["7"]),
        string("db.system.name", &["postgresql"]),
    ]
}

/// Spans as a shared pipeline carries them, for the walk: the evidence keys anywhere among
/// the others (the walk keeps a span's attributes only from the first key that may matter),
/// names and keys that dialects claim, HTTP spans on MCP endpoints and off them.
fn pipeline_span() -> impl Strategy<Value = Span> {
    (span(), prop::collection::vec(pipeline_attribute(), 0..4), prop::sample::select(NAMES), any::<bool>())
        .prop_flat_map(|(s, extra, name, drop_core)| {
            let mut attributes = if drop_core { Vec::new() } else { s.attributes.clone() };
            attributes.extend(extra);
            (Just(s), Just(attributes).prop_shuffle(), Just(name))
        })
        .prop_map(|(mut s, attributes, name)| {
            s.attributes = attributes;
            s.name = name.to_string();
            s
        })
}

fn pipeline_request() -> impl Strategy<Value = ExportTraceServiceRequest> {
    let scope = (prop::sample::select(SCOPE_NAMES), any::<bool>()).prop_map(|(name, some)| {
        some.then(|| opentelemetry_proto::tonic::common::v1::InstrumentationScope { name: name.to_string(), ..Default::default() })
    });
    prop::collection::vec(prop::collection::vec((scope, prop::collection::vec(pipeline_span(), 0..6)), 0..3), 0..3).prop_map(|rs| {
        ExportTraceServiceRequest {
            resource_spans: rs
                .into_iter()
                .map(|ss| ResourceSpans {
                    scope_spans: ss.into_iter().map(|(scope, spans)| ScopeSpans { scope, spans, ..Default::default() }).collect(),
                    ..Default::default()
                })
                .collect(),
        }
    })
}

fn spans_of(req: &ExportTraceServiceRequest) -> impl Iterator<Item = &Span> {
    req.resource_spans.iter().flat_map(|rs| rs.scope_spans.iter()).flat_map(|ss| ss.spans.iter())
}

fn valid_id(id: &[u8], len: usize) -> bool {
    id.len() == len && id.iter().any(|b| *b != 0)
}

/// Independent of the normalizer: does this span say, anywhere, "confirmed"?
fn carries_confirmed_receipt(s: &Span) -> bool {
    let confirmed = |kvs: &[KeyValue]| {
        kvs.iter().any(|kv| {
            kv.key == a::OUTCOME_RESULT
                && matches!(kv.value.as_ref().and_then(|v| v.value.as_ref()), Some(Value::StringValue(x)) if x == "confirmed")
        })
    };
    confirmed(&s.attributes) || s.events.iter().any(|e| e.name == a::OUTCOME_EVENT && confirmed(&e.attributes))
}

fn limits() -> impl Strategy<Value = ChainLimits> {
    (1usize..6, 0usize..4, 1usize..6, prop::option::of(600usize..4_000)).prop_map(|(max_chains, max_decided, max_spans, max_bytes)| {
        ChainLimits {
            decision_wait: Duration::from_secs(2),
            max_wait: Duration::from_secs(30),
            max_chains,
            max_bytes: max_bytes.unwrap_or(usize::MAX),
            max_spans_per_chain: max_spans,
            late_span_window: Duration::from_secs(60),
            max_decided,
            ..ChainLimits::default()
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn normalize_counts_exactly_the_spans_with_invalid_ids(req in request()) {
        let batch = normalize_request(&req);
        let total = spans_of(&req).count() as u64;
        let invalid = spans_of(&req).filter(|s| !valid_id(&s.trace_id, 16) || !valid_id(&s.span_id, 8)).count() as u64;
        prop_assert_eq!(batch.spans, total);
        prop_assert_eq!(batch.rejected_spans, invalid);
        // Everything accepted is either evidence or activity of a valid trace.
        let valid_traces: HashSet<Vec<u8>> = spans_of(&req).filter(|s| valid_id(&s.trace_id, 16) && valid_id(&s.span_id, 8)).map(|s| s.trace_id.clone()).collect();
        prop_assert!(batch.evidence.len() as u64 <= total - invalid);
        for e in &batch.evidence {
            prop_assert!(valid_traces.contains(e.trace_id.as_slice()));
            prop_assert!(e.end_ns >= e.start_ns);
        }
        for act in &batch.activity {
            prop_assert!(valid_traces.contains(act.trace_id.as_slice()));
        }
    }

    #[test]
    fn no_verdict_is_healthy_without_a_confirmed_receipt_in_its_trace(
        batches in prop::collection::vec((request(), 0u64..5_000), 1..5),
        lim in limits(),
    ) {
        let t0 = Moment::from_nanos(1_000_000_000_000);
        let mut chains = Chains::new(lim);
        let mut decided: Vec<DecidedCalls> = Vec::new();
        let mut confirmed_traces: BTreeSet<Vec<u8>> = BTreeSet::new();
        let mut at = t0;
        for (req, step_ms) in &batches {
            for s in spans_of(req).filter(|s| carries_confirmed_receipt(s)) {
                confirmed_traces.insert(s.trace_id.clone());
            }
            at += Duration::from_millis(*step_ms);
            chains.tick(at, &mut decided);
            chains.ingest(normalize_request(req), at, &mut decided);
        }
        chains.tick(at + Duration::from_secs(3), &mut decided);
        chains.drain(DecidedBy::Shutdown, at + Duration::from_secs(4), &mut decided);
        prop_assert_eq!(chains.in_flight(), 0);
        // Forget everything kept for revision: the memory accounting must come back to zero.
        chains.tick(at + Duration::from_secs(3_600), &mut decided);
        prop_assert_eq!(chains.bytes(), 0);

        let ctx = SessionContext::default();
        for d in &decided {
            for call in &d.calls {
                let v = classify_call(call, &ctx, d.decision);
                if v.state == HealthState::Healthy {
                    // The receipt may come from another trace: the cross-trace join moves a server
                    // half (and a verifier under it) into the client's chain, and an operation key
                    // joins a verifier from anywhere. It must exist in the input, and be the call's.
                    prop_assert!(!confirmed_traces.is_empty(), "healthy without any confirmed receipt in the input: {:?}", v);
                    prop_assert!(call.outcomes.iter().any(|o| o.result == mcp_health::evidence::OutcomeResult::Confirmed));
                }
                if v.verified_success {
                    prop_assert_eq!(v.state, HealthState::Healthy);
                }
                if let Some(first) = v.first_failed_layer {
                    for l in Layer::ALL.into_iter().filter(|l| *l > first) {
                        prop_assert_eq!(v.layers.get(l), LayerStatus::Unobserved);
                    }
                }
                prop_assert_eq!(v.trace_id, d.trace_id);
            }
        }
    }

    #[test]
    fn decode_traces_never_panics_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = mcp_health::testing::receive::otlp_json::decode_traces(&bytes);
    }

    #[test]
    fn decode_traces_never_panics_on_json_shaped_text(text in "[\\[\\]{}\",:0-9a-zA-Z_ \\-]{0,200}") {
        let _ = mcp_health::testing::receive::otlp_json::decode_traces(text.as_bytes());
    }

    #[test]
    fn decode_traces_never_panics_on_mutated_otlp_json(cut in 0usize..600, flip in 0usize..600, byte in any::<u8>()) {
        let mut doc = br#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"0102030405060708090a0b0c0d0e0f10","spanId":"0102030405060708","name":"x","kind":"SPAN_KIND_CLIENT","status":{"code":"STATUS_CODE_ERROR"},"attributes":[{"key":"mcp.method.name","value":{"stringValue":"tools/call"}},{"key":"n","value":{"intValue":"42"}}]}]}]}]}"#.to_vec();
        if flip < doc.len() {
            doc[flip] = byte;
        }
        doc.truncate(cut.max(1));
        if let Ok(req) = mcp_health::testing::receive::otlp_json::decode_traces(&doc) {
            let _ = normalize_request(&req);
        }
    }
}

/// The walk over wire bytes and the decode-then-normalize path give the same batch.
fn same_batch(
    walked: &mcp_health::normalize::NormalizedBatch,
    typed: &mcp_health::normalize::NormalizedBatch,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(format!("{:?}", walked.evidence), format!("{:?}", typed.evidence));
    prop_assert_eq!(&walked.activity, &typed.activity);
    prop_assert_eq!(walked.spans, typed.spans);
    prop_assert_eq!(walked.rejected_spans, typed.rejected_spans);
    prop_assert_eq!(walked.attribute_type_errors, typed.attribute_type_errors);
    prop_assert_eq!(walked.raw_definitions_seen, typed.raw_definitions_seen);
    Ok(())
}

/// One mutation of an encoded request: overwrite, insert, delete or truncate at a position.
#[derive(Clone, Debug)]
enum Mutation {
    Set(usize, u8),
    Insert(usize, u8),
    Delete(usize),
    Truncate(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(p, b)| Mutation::Set(p, b)),
        (any::<usize>(), any::<u8>()).prop_map(|(p, b)| Mutation::Insert(p, b)),
        any::<usize>().prop_map(Mutation::Delete),
        any::<usize>().prop_map(Mutation::Truncate),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    if bytes.is_empty() {
        return;
    }
    let at = |p: usize| p % bytes.len();
    match *m {
        Mutation::Set(p, b) => {
            let i = at(p);
            bytes[i] = b;
        }
        Mutation::Insert(p, b) => {
            let i = at(p);
            bytes.insert(i, b);
        }
        Mutation::Delete(p) => {
            let i = at(p);
            bytes.remove(i);
        }
        Mutation::Truncate(p) => {
            let i = at(p);
            bytes.truncate(i);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    /// The protobuf receivers read evidence from the wire bytes (`normalize::wire`); it must be
    /// what decoding the request and reading the structs gives, for any request.
    #[test]
    fn the_wire_walk_reads_what_the_decode_reads(req in request()) {
        use prost::Message;
        let bytes = req.encode_to_vec();
        let (walked, facts) = mcp_health::normalize::wire::walk(&bytes, "0000000000000000").expect("a valid request walks");
        same_batch(&walked, &normalize_request(&req))?;
        prop_assert_eq!(facts.spans, spans_of(&req).count() as u64);
    }

    /// The same, on spans as a shared pipeline mixes them: most attributes are read but not
    /// kept, and what is kept must be exactly what a dialect reads.
    #[test]
    fn the_wire_walk_reads_what_the_decode_reads_in_a_shared_pipeline(req in pipeline_request()) {
        use prost::Message;
        let bytes = req.encode_to_vec();
        let (walked, facts) = mcp_health::normalize::wire::walk(&bytes, "0000000000000000").expect("a valid request walks");
        same_batch(&walked, &normalize_request(&req))?;
        // Raw tool definitions are found wherever they sit, kept or not (they must be stripped
        // before the request is passed on).
        let raw = |kvs: &[KeyValue]| kvs.iter().any(|kv| kv.key == a::CATALOG_TOOLS);
        prop_assert_eq!(facts.raw_definitions, spans_of(&req).any(|s| raw(&s.attributes) || s.events.iter().any(|e| raw(&e.attributes))));
    }

    /// Whatever bytes come in, the walk takes exactly what prost takes (so what it passes on
    /// unchanged is decodable, and what it refuses is undecodable), and reads the same from it.
    #[test]
    fn the_wire_walk_accepts_exactly_what_prost_accepts(req in request(), muts in prop::collection::vec(mutation(), 1..4)) {
        use prost::Message;
        let mut bytes = req.encode_to_vec();
        for m in &muts {
            apply(&mut bytes, m);
        }
        let walked = mcp_health::normalize::wire::walk(&bytes, "0000000000000000");
        let decoded = ExportTraceServiceRequest::decode(bytes.as_slice());
        prop_assert_eq!(walked.is_ok(), decoded.is_ok(), "walk {:?} vs prost {:?}", walked.as_ref().err(), decoded.as_ref().err());
        if let (Ok((w, _)), Ok(d)) = (walked, decoded) {
            same_batch(&w, &normalize_request(&d))?;
        }
    }

    /// Issue 11: `mcp_health.via` spliced in the request's own buffer is byte for byte the
    /// copying splice, for any request (resources with and without a resource field); with too
    /// little room it is refused and the buffer left as it was.
    #[test]
    fn splicing_in_place_is_splicing_a_copy(req in request(), resources in prop::collection::vec(any::<bool>(), 3), room in 0usize..400) {
        use prost::Message;
        let mut req = req;
        for (rs, with) in req.resource_spans.iter_mut().zip(resources) {
            if with {
                rs.resource = Some(opentelemetry_proto::tonic::resource::v1::Resource {
                    attributes: vec![kv("service.name".into(), Some(AnyValue { value: Some(Value::StringValue("agent".into())) }))],
                    ..Default::default()
                });
            }
        }
        let bytes = req.encode_to_vec();
        let (_, facts) = mcp_health::normalize::wire::walk(&bytes, "0000000000000000").expect("a valid request walks");
        let copy = mcp_health::normalize::wire::splice_via(&bytes, &facts, "0123456789abcdef").expect("spliceable");
        let mut m = bytes::BytesMut::with_capacity(bytes.len() + room);
        m.extend_from_slice(&bytes);
        let room = m.capacity() - m.len();
        let done = mcp_health::normalize::wire::splice_via_in_place(&mut m, &facts, "0123456789abcdef");
        prop_assert_eq!(done, copy.len() - bytes.len() <= room);
        prop_assert_eq!(&m[..], if done { &copy[..] } else { &bytes[..] });
    }

    #[test]
    fn the_wire_walk_never_panics_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        use prost::Message;
        let walked = mcp_health::normalize::wire::walk(&bytes, "0000000000000000");
        prop_assert_eq!(walked.is_ok(), ExportTraceServiceRequest::decode(bytes.as_slice()).is_ok());
    }
}

/// Arrays nested around prost's recursion limit: the walk and prost draw the line at the same depth.
#[test]
fn the_wire_walk_stops_at_prosts_recursion_limit() {
    use prost::Message;
    let mut seen = (false, false);
    // Span attributes and resource attributes sit at depths of different parity, and each array
    // adds two levels: together they hit the limit at every depth.
    for on_resource in [false, true] {
        for depth in 30..60 {
            let mut v = AnyValue { value: Some(Value::StringValue("x".into())) };
            for _ in 0..depth {
                v = AnyValue { value: Some(Value::ArrayValue(ArrayValue { values: vec![v] })) };
            }
            let attr = kv("mcp.method.name".into(), Some(v));
            let span = Span {
                trace_id: vec![1; 16],
                span_id: vec![2; 8],
                attributes: if on_resource { vec![] } else { vec![attr.clone()] },
                ..Default::default()
            };
            let resource =
                on_resource.then(|| opentelemetry_proto::tonic::resource::v1::Resource { attributes: vec![attr], ..Default::default() });
            let req = ExportTraceServiceRequest {
                resource_spans: vec![ResourceSpans {
                    resource,
                    scope_spans: vec![ScopeSpans { spans: vec![span], ..Default::default() }],
                    ..Default::default()
                }],
            };
            let bytes = req.encode_to_vec();
            let walked = mcp_health::normalize::wire::walk(&bytes, "0000000000000000");
            let decoded = ExportTraceServiceRequest::decode(bytes.as_slice());
            assert_eq!(walked.is_ok(), decoded.is_ok(), "depth {depth}: walk {:?} vs prost {:?}", walked.err(), decoded.err());
            if decoded.is_ok() {
                seen.0 = true
            } else {
                seen.1 = true
            }
        }
    }
    assert!(seen.0 && seen.1, "the limit lies inside the depths tried");
}

/// Every fixture and dialect recording of the repository reads the same through the walk.
#[test]
fn every_recording_reads_the_same_through_the_wire_walk() {
    use prost::Message;
    let mut files = Vec::new();
    for dir in ["tests/fixtures", "tests/fixtures/dialects"] {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "jsonl") {
                files.push(p);
            }
        }
    }
    assert!(files.len() >= 10, "found {} recordings", files.len());
    let mut requests = 0;
    for f in files {
        for line in std::fs::read_to_string(&f).unwrap().lines().filter(|l| !l.trim().is_empty()) {
            let Ok(req) = mcp_health::testing::receive::otlp_json::decode_traces(line.as_bytes()) else { continue };
            let bytes = req.encode_to_vec();
            let (walked, _) = mcp_health::normalize::wire::walk(&bytes, "0000000000000000").expect("walks");
            let typed = normalize_request(&req);
            assert_eq!(format!("{:?}", walked.evidence), format!("{:?}", typed.evidence), "{}", f.display());
            assert_eq!(walked.activity, typed.activity, "{}", f.display());
            requests += 1;
        }
    }
    assert!(requests >= 50, "only {requests} requests read");
}

/// The properties above mean little if the generator never reaches the states they guard: run the
/// same generators deterministically and check that a healthy verdict (and most other states) come
/// out of random spans.
#[test]
fn the_span_generator_reaches_healthy_and_most_other_states() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    let mut runner = TestRunner::new_with_rng(Config::default(), TestRng::deterministic_rng(RngAlgorithm::ChaCha));
    let strategy = request();
    let mut seen: BTreeSet<HealthState> = BTreeSet::new();
    let mut rejected = 0u64;
    let t0 = Moment::from_nanos(1_000_000_000_000);
    for _ in 0..3_000 {
        let req = strategy.new_tree(&mut runner).expect("value").current();
        let batch = normalize_request(&req);
        rejected += batch.rejected_spans;
        let mut chains = Chains::new(ChainLimits::default());
        let mut out = Vec::new();
        chains.ingest(batch, t0, &mut out);
        chains.drain(DecidedBy::Replay, t0, &mut out);
        for d in &out {
            for c in &d.calls {
                seen.insert(classify_call(c, &SessionContext::default(), d.decision).state);
            }
        }
    }
    eprintln!("states reached: {seen:?}, rejected spans: {rejected}");
    assert!(rejected > 0);
    assert!(seen.contains(&HealthState::Healthy), "{seen:?}");
    let evidence_states =
        HealthState::ALL.iter().filter(|s| !matches!(s, HealthState::StaleCatalog | HealthState::Working | HealthState::Waiting)).count();
    assert!(seen.len() + 1 >= evidence_states, "only {seen:?}");
}
