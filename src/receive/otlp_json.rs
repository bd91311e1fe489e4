//! OTLP/JSON decoding, shared by the HTTP receiver and `replay`.
//!
//! The protobuf JSON mapping lets enums be written by name (`"SPAN_KIND_CLIENT"`) as well as by
//! number; `opentelemetry-proto`'s serde types only take numbers, so names are rewritten to numbers
//! first. Everything else (hex ids, int64 as strings) the generated types already handle.

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
pub fn decode_traces(bytes: &[u8]) -> Result<ExportTraceServiceRequest, JsonError> {
    if let Ok(req) = serde_json::from_slice::<ExportTraceServiceRequest>(bytes) {
        return Ok(req);
    }
    let mut v: Value = serde_json::from_slice(bytes).map_err(JsonError::Syntax)?;
    rewrite_enum_names(&mut v);
    serde_json::from_value(v).map_err(JsonError::Shape)
}

/// Decode one `ExportMetricsServiceRequest` from OTLP/JSON bytes (passed on, never read); enums
/// may be written by name here too.
pub fn decode_metrics(bytes: &[u8]) -> Result<ExportMetricsServiceRequest, String> {
    decode_other(bytes, "ExportMetricsServiceRequest")
}

/// Decode one `ExportLogsServiceRequest` from OTLP/JSON bytes (passed on, never read).
pub fn decode_logs(bytes: &[u8]) -> Result<ExportLogsServiceRequest, String> {
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
}
