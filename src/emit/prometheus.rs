//! Prometheus text exposition (format 0.0.4) of what the SDK's manual reader collects.
//!
//! Names follow the OpenTelemetry → Prometheus compatibility rules: `.` becomes `_`, monotonic sums
//! get `_total`, attribute keys are sanitized the same way. Only the instrument kinds this service
//! creates (sums, gauges and explicit-bucket histograms) are rendered.

use std::fmt::Write;

use opentelemetry::{KeyValue, Value};
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData, ResourceMetrics};
use opentelemetry_sdk::metrics::reader::MetricReader;

use super::metrics::ManualReaderHandle;

/// Collect now and render every metric.
pub fn render(reader: &ManualReaderHandle) -> String {
    let mut rm = ResourceMetrics::default();
    if reader.0.collect(&mut rm).is_err() {
        return String::new();
    }
    render_metrics(&rm)
}

/// Render collected metrics.
pub fn render_metrics(rm: &ResourceMetrics) -> String {
    let mut out = String::with_capacity(4096);
    for sm in rm.scope_metrics() {
        for m in sm.metrics() {
            let base = sanitize_name(m.name());
            match m.data() {
                AggregatedMetrics::U64(d) => write_data(&mut out, &base, m.description(), d, |v| v.to_string()),
                AggregatedMetrics::I64(d) => write_data(&mut out, &base, m.description(), d, |v| v.to_string()),
                AggregatedMetrics::F64(d) => write_data(&mut out, &base, m.description(), d, fmt_f64),
            }
        }
    }
    out
}

fn write_data<T: Copy>(out: &mut String, base: &str, desc: &str, d: &MetricData<T>, fmt: impl Fn(T) -> String) {
    match d {
        MetricData::Sum(sum) => {
            let (name, kind) = if sum.is_monotonic() { (format!("{base}_total"), "counter") } else { (base.to_string(), "gauge") };
            header(out, &name, desc, kind);
            for p in sum.data_points() {
                sample(out, &name, p.attributes(), &fmt(p.value()));
            }
        }
        MetricData::Gauge(g) => {
            header(out, base, desc, "gauge");
            for p in g.data_points() {
                sample(out, base, p.attributes(), &fmt(p.value()));
            }
        }
        MetricData::Histogram(h) => {
            header(out, base, desc, "histogram");
            let (bucket, sum, count) = (format!("{base}_bucket"), format!("{base}_sum"), format!("{base}_count"));
            for p in h.data_points() {
                // Prometheus buckets are cumulative, with a last `+Inf` bucket equal to the count.
                let mut cumulative = 0u64;
                let bounds = p.bounds().map(fmt_f64).chain(std::iter::once("+Inf".to_string()));
                for (le, n) in bounds.zip(p.bucket_counts()) {
                    cumulative += n;
                    let le = KeyValue::new("le", le);
                    sample(out, &bucket, p.attributes().chain(std::iter::once(&le)), &cumulative.to_string());
                }
                sample(out, &sum, p.attributes(), &fmt(p.sum()));
                sample(out, &count, p.attributes(), &p.count().to_string());
            }
        }
        // Exponential histograms are not created by this service.
        _ => {}
    }
}

fn header(out: &mut String, name: &str, desc: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {}", desc.replace('\\', "\\\\").replace('\n', "\\n"));
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn sample<'a>(out: &mut String, name: &str, attrs: impl Iterator<Item = &'a KeyValue>, value: &str) {
    out.push_str(name);
    let mut first = true;
    for kv in attrs {
        out.push(if first { '{' } else { ',' });
        first = false;
        out.push_str(&sanitize_name(kv.key.as_str()));
        out.push_str("=\"");
        let v = match &kv.value {
            Value::String(s) => s.as_str().to_string(),
            other => other.as_str().to_string(),
        };
        for ch in v.chars() {
            match ch {
                '\\' => out.push_str("\\\\"),
                '"' => out.push_str("\\\""),
                '\n' => out.push_str("\\n"),
                c => out.push(c),
            }
        }
        out.push('"');
    }
    if !first {
        out.push('}');
    }
    out.push(' ');
    out.push_str(value);
    out.push('\n');
}

fn fmt_f64(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        }
    } else {
        v.to_string()
    }
}

/// `[a-zA-Z_:][a-zA-Z0-9_:]*` for names; every other character becomes `_`.
pub fn sanitize_name(n: &str) -> String {
    let mut s: String = n.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == ':' { c } else { '_' }).collect();
    if s.starts_with(|c: char| c.is_ascii_digit()) || s.is_empty() {
        s.insert(0, '_');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_sanitized() {
        assert_eq!(sanitize_name("mcp_health.calls.protocol_success"), "mcp_health_calls_protocol_success");
        assert_eq!(sanitize_name("otel.metric.overflow"), "otel_metric_overflow");
        assert_eq!(sanitize_name("9x"), "_9x");
    }
}
