//! OTLP/JSON decoding, shared by the HTTP receiver and `replay`.
//!
//! The protobuf JSON mapping lets enums be written by name (`"SPAN_KIND_CLIENT"`) as well as by
//! number; `opentelemetry-proto`'s serde types only take numbers, so names are rewritten to numbers
//! first. Everything else (hex ids, int64 as strings) the generated types already handle.
//!
//! JSON expands when decoded, and by how much depends on its shape, not its size: a span written
//! `{}` is 3 bytes of text and a 200-byte struct, an attribute read into a `serde_json::Value` tree
//! a 700-byte map node. So the memory limiter is not asked for a multiple of the body but for
//! [`decoded_bound`]: one pass over the text (no allocation) that adds up, per array, object,
//! string and element, what the decoder can allocate for it at most.

use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use serde_json::Value;

/// Why a JSON body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum JsonError {
    #[error("not JSON: {0}")]
    Syntax(serde_json::Error),
    #[error("not an OTLP ExportTraceServiceRequest: {0}")]
    Shape(serde_json::Error),
}

/// Decode one `ExportTraceServiceRequest` from OTLP/JSON bytes.
///
/// Straight into the generated types first: most senders write enums as numbers, and going
/// through a `serde_json::Value` tree made JSON ten times as slow as protobuf (issue 11). Only
/// when that fails is the body read as a tree, its enum names rewritten, and decoded again.
///
/// The enum names are rewritten in the text, not in a tree: a tree costs many times the text
/// (see [`decoded_bound`]), the rewritten text at most the text.
pub fn decode_traces(bytes: &[u8]) -> Result<ExportTraceServiceRequest, JsonError> {
    let first = match serde_json::from_slice::<ExportTraceServiceRequest>(bytes) {
        Ok(req) => return Ok(req),
        Err(e) => e,
    };
    let classify = |e: serde_json::Error| match e.classify() {
        serde_json::error::Category::Data => JsonError::Shape(e),
        _ => JsonError::Syntax(e),
    };
    match rewrite_trace_enum_names(bytes) {
        Some(text) => serde_json::from_slice(&text).map_err(classify),
        None => Err(classify(first)),
    }
}

/// The text with `"kind"` and `"code"` members whose value is an enum name given the enum's
/// number (`"kind":"SPAN_KIND_CLIENT"` → `"kind":3`); `None` when there is none to rewrite or the
/// text is not JSON. In an OTLP trace request these keys are only the span's kind and the
/// status's code (attribute keys are values, `{"key":"kind"}`, and are left alone).
fn rewrite_trace_enum_names(bytes: &[u8]) -> Option<Vec<u8>> {
    let mut out: Option<Vec<u8>> = None;
    let mut copied = 0;
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'"' {
            i += 1;
            continue;
        }
        let end = string_end(bytes, i)?;
        let key = &bytes[i + 1..end];
        i = end + 1;
        let is_enum_key = key == b"kind" || key == b"code";
        let mut j = skip_ws(bytes, i);
        if !is_enum_key || bytes.get(j) != Some(&b':') {
            continue;
        }
        j = skip_ws(bytes, j + 1);
        if bytes.get(j) != Some(&b'"') {
            continue;
        }
        let vend = string_end(bytes, j)?;
        let name = std::str::from_utf8(&bytes[j + 1..vend]).ok();
        let number = name.and_then(|n| if key == b"kind" { span_kind_number(n) } else { status_code_number(n) });
        if let Some(n) = number {
            let o = out.get_or_insert_with(|| Vec::with_capacity(bytes.len()));
            o.extend_from_slice(&bytes[copied..j]);
            o.extend_from_slice(n.to_string().as_bytes());
            copied = vend + 1;
        }
        i = vend + 1;
    }
    let mut o = out?;
    o.extend_from_slice(&bytes[copied..]);
    Some(o)
}

/// The index of the quote closing the string that opens at `start`, past escapes.
fn string_end(bytes: &[u8], start: usize) -> Option<usize> {
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => return Some(i),
            _ => i += 1,
        }
    }
    None
}

fn skip_ws(bytes: &[u8], mut i: usize) -> usize {
    while bytes.get(i).is_some_and(|b| b.is_ascii_whitespace()) {
        i += 1;
    }
    i
}

/// Which decoder a body goes through: straight into the generated types (traces), or through a
/// `serde_json::Value` tree first (metrics and logs, see [`decode_other`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum JsonDecoder {
    Direct,
    Tree,
}

/// What a `serde_json::Value` costs inline (in its parent's vector or map node).
const VALUE_SIZE: u64 = std::mem::size_of::<Value>() as u64;

/// A `BTreeMap<String, Value>` node, internal (the larger kind): 11 keys, 11 values, 12 edges and
/// a header. Not public in std; computed from its layout.
const TREE_NODE: u64 = 11 * (24 + VALUE_SIZE) + 12 * 8 + 16;

/// A map node holds at least 5 entries (but the root): a share of a node per member.
const TREE_PER_MEMBER: u64 = TREE_NODE / 5 + 1;

/// An allocation of `len` bytes, rounded up to the allocator's size class (at most an eighth more,
/// and the smallest class).
fn alloc(len: u64) -> u64 {
    len + len / 8 + 16
}

/// The inline size of an element of the array under `key` in a decoded OTLP request; unknown
/// keys take the largest.
fn element_size(key: &[u8]) -> u64 {
    use opentelemetry_proto::tonic::{common::v1 as c, logs::v1 as l, metrics::v1 as m, trace::v1 as t};
    use std::mem::size_of;
    let z = |n: usize| n as u64;
    match key {
        b"resourceSpans" => z(size_of::<t::ResourceSpans>()),
        b"scopeSpans" => z(size_of::<t::ScopeSpans>()),
        b"spans" => z(size_of::<t::Span>()),
        b"events" => z(size_of::<t::span::Event>()),
        b"links" => z(size_of::<t::span::Link>()),
        b"attributes" => z(size_of::<c::KeyValue>()),
        b"values" => z(size_of::<c::KeyValue>().max(size_of::<c::AnyValue>())),
        b"entityRefs" => z(size_of::<c::EntityRef>()),
        b"idKeys" | b"descriptionKeys" => z(size_of::<String>()),
        b"resourceMetrics" => z(size_of::<m::ResourceMetrics>()),
        b"scopeMetrics" => z(size_of::<m::ScopeMetrics>()),
        b"metrics" => z(size_of::<m::Metric>()),
        b"exemplars" => z(size_of::<m::Exemplar>()),
        b"bucketCounts" | b"explicitBounds" => 8,
        b"quantileValues" => z(size_of::<m::summary_data_point::ValueAtQuantile>()),
        b"resourceLogs" => z(size_of::<l::ResourceLogs>()),
        b"scopeLogs" => z(size_of::<l::ScopeLogs>()),
        b"logRecords" => z(size_of::<l::LogRecord>()),
        _ => largest_element(),
    }
}

fn largest_element() -> u64 {
    use opentelemetry_proto::tonic::{common::v1 as c, logs::v1 as l, metrics::v1 as m, trace::v1 as t};
    use std::mem::size_of;
    [
        size_of::<t::ResourceSpans>(),
        size_of::<t::ScopeSpans>(),
        size_of::<t::Span>(),
        size_of::<t::span::Event>(),
        size_of::<t::span::Link>(),
        size_of::<c::KeyValue>(),
        size_of::<c::AnyValue>(),
        size_of::<c::EntityRef>(),
        size_of::<m::ResourceMetrics>(),
        size_of::<m::ScopeMetrics>(),
        size_of::<m::Metric>(),
        size_of::<m::NumberDataPoint>(),
        size_of::<m::HistogramDataPoint>(),
        size_of::<m::ExponentialHistogramDataPoint>(),
        size_of::<m::SummaryDataPoint>(),
        size_of::<m::Exemplar>(),
        size_of::<l::ResourceLogs>(),
        size_of::<l::ScopeLogs>(),
        size_of::<l::LogRecord>(),
    ]
    .into_iter()
    .max()
    .unwrap_or(0) as u64
}

/// One open array or object while [`decoded_bound`] walks the text.
struct Frame<'a> {
    array: bool,
    /// Arrays: the inline size of one element, decoded; objects: the current member's key.
    elem: u64,
    key: &'a [u8],
    /// Elements (arrays) or members (objects) so far.
    n: u64,
    expect_key: bool,
}

/// The most a decoder can hold at its peak while decoding `bytes` (beyond the text itself), in
/// bytes: every vector at twice its elements (growth by doubling; at least 4), every string and
/// key its own allocation rounded up to a size class, the largest vector once more (old and new
/// buffer while it grows), serde's scratch buffer, and for [`JsonDecoder::Tree`] the tree as
/// well (tree and structs are alive together). [`JsonDecoder::Direct`] adds one copy of the text
/// (enum names rewritten). Not a validation: whatever is not JSON costs no more than it reads as.
pub(crate) fn decoded_bound(bytes: &[u8], decoder: JsonDecoder) -> u64 {
    let (mut typed, mut tree, mut largest, mut longest) = (0u64, 0u64, 0u64, 0u64);
    let mut stack: Vec<Frame> = Vec::new();
    // An element added to the innermost array, if that is where the value at `i` sits.
    fn element(stack: &mut [Frame], typed: &mut u64, tree: &mut u64, largest: &mut u64) {
        if let Some(f) = stack.last_mut().filter(|f| f.array) {
            f.n += 1;
            *typed += 2 * f.elem;
            *tree += 2 * VALUE_SIZE;
            *largest = (*largest).max(f.n * f.elem.max(VALUE_SIZE));
        }
    }
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'{' | b'[' => {
                element(&mut stack, &mut typed, &mut tree, &mut largest);
                let array = bytes[i] == b'[';
                let elem = if array {
                    let under = stack.last().filter(|f| !f.array).map_or(&b""[..], |f| f.key);
                    let e = element_size(under);
                    typed += 4 * e;
                    tree += 4 * VALUE_SIZE;
                    e
                } else {
                    0
                };
                // Deeper than serde_json's recursion limit (128) is refused by the decoder at
                // that depth: what comes after is never decoded.
                if stack.len() > 128 {
                    break;
                }
                stack.push(Frame { array, elem, key: b"", n: 0, expect_key: !array });
                i += 1;
            }
            b'}' | b']' => {
                stack.pop();
                i += 1;
            }
            b',' => {
                if let Some(f) = stack.last_mut().filter(|f| !f.array) {
                    f.expect_key = true;
                }
                i += 1;
            }
            b':' => {
                if let Some(f) = stack.last_mut() {
                    f.expect_key = false;
                }
                i += 1;
            }
            b'"' => {
                let end = string_end(bytes, i).unwrap_or(bytes.len());
                let s = &bytes[(i + 1).min(end)..end];
                let len = s.len() as u64;
                longest = longest.max(len);
                match stack.last_mut() {
                    Some(f) if !f.array && f.expect_key => {
                        // A key: in the tree a `String` and a share of a map node (the first
                        // member the node itself); straight into structs, nothing.
                        tree += alloc(len) + TREE_PER_MEMBER + if f.n == 0 { TREE_NODE } else { 0 };
                        f.n += 1;
                        f.key = s;
                    }
                    _ => {
                        element(&mut stack, &mut typed, &mut tree, &mut largest);
                        typed += alloc(len);
                        tree += alloc(len);
                    }
                }
                i = end + 1;
            }
            b if b.is_ascii_whitespace() => i += 1,
            _ => {
                // A number, `true`, `false` or `null`: inline, but an element if in an array.
                element(&mut stack, &mut typed, &mut tree, &mut largest);
                while i < bytes.len()
                    && !matches!(bytes[i], b',' | b']' | b'}' | b':' | b'"' | b'{' | b'[')
                    && !bytes[i].is_ascii_whitespace()
                {
                    i += 1;
                }
            }
        }
    }
    let common = largest + longest;
    match decoder {
        JsonDecoder::Direct => typed + common + bytes.len() as u64,
        JsonDecoder::Tree => typed + tree + common,
    }
}

/// Decode one `ExportMetricsServiceRequest` from OTLP/JSON bytes (passed on, never read); enums
/// may be written by name here too.
pub(crate) fn decode_metrics(bytes: &[u8]) -> Result<ExportMetricsServiceRequest, String> {
    decode_other(bytes, "ExportMetricsServiceRequest")
}

/// Decode one `ExportLogsServiceRequest` from OTLP/JSON bytes (passed on, never read).
pub(crate) fn decode_logs(bytes: &[u8]) -> Result<ExportLogsServiceRequest, String> {
    decode_other(bytes, "ExportLogsServiceRequest")
}

/// No fast path here: `opentelemetry-proto`'s metric `data` oneof decodes straight from bytes as
/// absent (no error), only through a tree as written (`metrics_and_logs_decode_from_otlp_json`).
fn decode_other<T: serde::de::DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T, String> {
    let mut v: Value = serde_json::from_slice(bytes).map_err(|e| JsonError::Syntax(e).to_string())?;
    rewrite_other_enum_names(&mut v);
    serde_json::from_value(v).map_err(|e| format!("not an OTLP {what}: {e}"))
}

/// The enums of metrics and logs written by name: `severityNumber` and `aggregationTemporality`,
/// wherever they are (the field names occur nowhere else in the two requests).
fn rewrite_other_enum_names(v: &mut Value) {
    match v {
        Value::Object(m) => {
            for (k, x) in m.iter_mut() {
                let n = match (k.as_str(), x.as_str()) {
                    ("severityNumber", Some(s)) => severity_number(s),
                    ("aggregationTemporality", Some(s)) => match s {
                        "AGGREGATION_TEMPORALITY_UNSPECIFIED" => Some(0),
                        "AGGREGATION_TEMPORALITY_DELTA" => Some(1),
                        "AGGREGATION_TEMPORALITY_CUMULATIVE" => Some(2),
                        _ => None,
                    },
                    _ => None,
                };
                match n {
                    Some(n) => *x = Value::from(n),
                    None => rewrite_other_enum_names(x),
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(rewrite_other_enum_names),
        _ => {}
    }
}

/// `SEVERITY_NUMBER_TRACE` = 1 … `SEVERITY_NUMBER_FATAL4` = 24, four per level.
fn severity_number(s: &str) -> Option<i32> {
    let rest = s.strip_prefix("SEVERITY_NUMBER_")?;
    if rest == "UNSPECIFIED" {
        return Some(0);
    }
    let levels = ["TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL"];
    let (i, level) = levels.iter().enumerate().find(|(_, l)| rest.starts_with(**l))?;
    let sub = match &rest[level.len()..] {
        "" => 1,
        "2" => 2,
        "3" => 3,
        "4" => 4,
        _ => return None,
    };
    Some(i as i32 * 4 + sub)
}

#[cfg(test)]
fn rewrite_enum_names(v: &mut Value) {
    let Some(rss) = v.get_mut("resourceSpans").and_then(Value::as_array_mut) else { return };
    for rs in rss {
        let Some(sss) = rs.get_mut("scopeSpans").and_then(Value::as_array_mut) else { continue };
        for ss in sss {
            let Some(spans) = ss.get_mut("spans").and_then(Value::as_array_mut) else { continue };
            for span in spans {
                if let Some(k) = span.get_mut("kind") {
                    if let Some(n) = k.as_str().and_then(span_kind_number) {
                        *k = Value::from(n);
                    }
                }
                if let Some(c) = span.get_mut("status").and_then(|s| s.get_mut("code")) {
                    if let Some(n) = c.as_str().and_then(status_code_number) {
                        *c = Value::from(n);
                    }
                }
            }
        }
    }
}

fn span_kind_number(s: &str) -> Option<i32> {
    Some(match s {
        "SPAN_KIND_UNSPECIFIED" => 0,
        "SPAN_KIND_INTERNAL" => 1,
        "SPAN_KIND_SERVER" => 2,
        "SPAN_KIND_CLIENT" => 3,
        "SPAN_KIND_PRODUCER" => 4,
        "SPAN_KIND_CONSUMER" => 5,
        _ => return None,
    })
}

fn status_code_number(s: &str) -> Option<i32> {
    Some(match s {
        "STATUS_CODE_UNSET" => 0,
        "STATUS_CODE_OK" => 1,
        "STATUS_CODE_ERROR" => 2,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enum_names_and_numbers_decode_alike() {
        let by_name = br#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"0102030405060708090a0b0c0d0e0f10","spanId":"0102030405060708","name":"x","kind":"SPAN_KIND_CLIENT","status":{"code":"STATUS_CODE_ERROR"},"attributes":[{"key":"n","value":{"intValue":"42"}}]}]}]}]}"#;
        let by_num = br#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"0102030405060708090a0b0c0d0e0f10","spanId":"0102030405060708","name":"x","kind":3,"status":{"code":2},"attributes":[{"key":"n","value":{"intValue":42}}]}]}]}]}"#;
        let a = decode_traces(by_name).unwrap();
        let b = decode_traces(by_num).unwrap();
        assert_eq!(a, b);
        let span = &a.resource_spans[0].scope_spans[0].spans[0];
        assert_eq!(span.kind, 3);
        assert_eq!(span.trace_id.len(), 16);
    }

    #[test]
    fn metrics_and_logs_decode_from_otlp_json() {
        let m = br#"{"resourceMetrics":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"s"}}]},"scopeMetrics":[{"metrics":[{"name":"m","unit":"1","sum":{"aggregationTemporality":2,"isMonotonic":true,"dataPoints":[{"asInt":"5","timeUnixNano":"1700000000000000000"}]}}]}]}]}"#;
        let m = decode_metrics(m).unwrap();
        let metric = &m.resource_metrics[0].scope_metrics[0].metrics[0];
        assert_eq!(metric.name, "m");
        assert!(matches!(metric.data, Some(opentelemetry_proto::tonic::metrics::v1::metric::Data::Sum(_))));
        let l = br#"{"resourceLogs":[{"scopeLogs":[{"logRecords":[{"timeUnixNano":"1700000000000000000","severityNumber":9,"body":{"stringValue":"hi"},"traceId":"0102030405060708090a0b0c0d0e0f10","spanId":"0102030405060708"}]}]}]}"#;
        let l = decode_logs(l).unwrap();
        let rec = &l.resource_logs[0].scope_logs[0].log_records[0];
        assert_eq!(rec.severity_number, 9);
        assert_eq!(rec.trace_id.len(), 16);
        // Enums by name decode as by number.
        let by_name = br#"{"resourceLogs":[{"scopeLogs":[{"logRecords":[{"severityNumber":"SEVERITY_NUMBER_WARN3"},{"severityNumber":"SEVERITY_NUMBER_FATAL4"},{"severityNumber":"SEVERITY_NUMBER_TRACE"}]}]}]}"#;
        let recs = &decode_logs(by_name).unwrap().resource_logs[0].scope_logs[0].log_records;
        assert_eq!(recs.iter().map(|r| r.severity_number).collect::<Vec<_>>(), vec![15, 24, 1]);
        let by_name = br#"{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"m","sum":{"aggregationTemporality":"AGGREGATION_TEMPORALITY_DELTA","dataPoints":[]}}]}]}]}"#;
        let m = decode_metrics(by_name).unwrap();
        match &m.resource_metrics[0].scope_metrics[0].metrics[0].data {
            Some(opentelemetry_proto::tonic::metrics::v1::metric::Data::Sum(s)) => assert_eq!(s.aggregation_temporality, 1),
            other => panic!("{other:?}"),
        }
        assert!(decode_logs(b"{nope").is_err());
        assert!(decode_metrics(br#"{"resourceMetrics":7}"#).is_err());
    }

    /// The fast path (straight into the types) reads every recording of the repository as the
    /// tree does.
    #[test]
    fn the_direct_decode_reads_every_recording_as_the_tree_does() {
        let mut n = 0;
        for dir in ["tests/fixtures", "tests/fixtures/dialects"] {
            for e in std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/").to_string() + dir).unwrap() {
                let p = e.unwrap().path();
                if p.extension().is_none_or(|x| x != "jsonl") {
                    continue;
                }
                for line in std::fs::read_to_string(&p).unwrap().lines().filter(|l| !l.trim().is_empty()) {
                    let mut v: Value = serde_json::from_str(line).unwrap();
                    rewrite_enum_names(&mut v);
                    let Ok(tree) = serde_json::from_value::<ExportTraceServiceRequest>(v.clone()) else { continue };
                    assert!(decode_traces(line.as_bytes()).unwrap() == tree, "{}", p.display());
                    // The same request with enums as numbers (as most SDKs write them) takes the
                    // fast path, and reads the same.
                    let numbers = serde_json::to_vec(&v).unwrap();
                    let direct = serde_json::from_slice::<ExportTraceServiceRequest>(&numbers).expect("direct decode");
                    assert!(direct == tree, "{}", p.display());
                    n += 1;
                }
            }
        }
        assert!(n >= 50, "the fast path read {n} requests");
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(decode_traces(b"{not json").is_err());
        assert!(decode_traces(br#"{"resourceSpans":"nope"}"#).is_err());
    }

    /// The bound holds what decoding really holds, whatever the shape: realistic MCP spans, spans
    /// written `{}` (3 bytes of text each), enum names, deep attribute values.
    #[test]
    fn the_json_bound_covers_what_decoding_holds_for_every_shape() {
        use crate::flow::memory::trace_request_heap_bytes;
        let realistic = serde_json::to_vec(&crate::loadgen::build_request(1, 300)).unwrap();
        let spans = |one: &str, n: usize| {
            let list = vec![one; n].join(",");
            format!(r#"{{"resourceSpans":[{{"scopeSpans":[{{"spans":[{list}]}}]}}]}}"#).into_bytes()
        };
        let deep = br#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"attributes":[{"key":"a","value":{"arrayValue":{"values":[{"intValue":1},{"kvlistValue":{"values":[{"key":"b","value":{"boolValue":true}}]}}]}}}]}]}]}]}"#;
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("realistic", realistic),
            ("empty spans", spans("{}", 20_000)),
            ("tiny spans", spans(r#"{"traceId":"0102030405060708090a0b0c0d0e0f10","spanId":"0102030405060708","name":"x"}"#, 5_000)),
            ("enum names", spans(r#"{"name":"x","kind":"SPAN_KIND_CLIENT","status":{"code":"STATUS_CODE_ERROR"}}"#, 5_000)),
            ("tiny attributes", spans(&format!(r#"{{"attributes":[{}]}}"#, vec![r#"{"key":"k"}"#; 50].join(",")), 200)),
            ("deep values", deep.to_vec()),
        ];
        for (what, text) in cases {
            let req = decode_traces(&text).unwrap_or_else(|e| panic!("{what}: {e}"));
            let heap = trace_request_heap_bytes(&req);
            let bound = decoded_bound(&text, JsonDecoder::Direct);
            eprintln!(
                "{what}: text {} B, decoded heap {heap} B ({:.1}x), bound {bound} B ({:.1}x text)",
                text.len(),
                heap as f64 / text.len() as f64,
                bound as f64 / text.len() as f64
            );
            assert!(bound >= heap, "{what}: bound {bound} < decoded {heap}");
            assert!(decoded_bound(&text, JsonDecoder::Tree) > bound, "{what}: the tree costs more");
        }
    }

    /// Enum names are rewritten in the text only where they are a span's kind or a status's code.
    #[test]
    fn enum_names_are_rewritten_in_the_text_only_as_members() {
        let t = br#"{"kind" : "SPAN_KIND_SERVER","attributes":[{"key":"kind","value":{"stringValue":"SPAN_KIND_CLIENT"}}],"s":"\"kind\":\"SPAN_KIND_CLIENT\"","status":{"code":"STATUS_CODE_OK"}}"#;
        let out = String::from_utf8(rewrite_trace_enum_names(t).unwrap()).unwrap();
        assert_eq!(
            out,
            r#"{"kind" : 2,"attributes":[{"key":"kind","value":{"stringValue":"SPAN_KIND_CLIENT"}}],"s":"\"kind\":\"SPAN_KIND_CLIENT\"","status":{"code":1}}"#
        );
        assert_eq!(rewrite_trace_enum_names(br#"{"kind":3}"#), None);
        assert_eq!(rewrite_trace_enum_names(br#"{"kind":"SPAN_KIND_CLIENT"#), None, "unterminated: not JSON");
    }
}
