//! Prometheus text exposition of what the SDK's manual reader collects: the text format 0.0.4,
//! or OpenMetrics 1.0 when the scraper asks for it (`Accept: application/openmetrics-text`, as
//! Prometheus does), because only OpenMetrics carries exemplars — the trace ids that let Grafana
//! go from a latency panel to the trace.
//!
//! Names follow the OpenTelemetry → Prometheus compatibility rules: `.` becomes `_`, monotonic sums
//! get `_total`, attribute keys are sanitized the same way. Only the instrument kinds this service
//! creates (sums, gauges and explicit-bucket histograms) are rendered. In OpenMetrics a counter's
//! family is named without `_total` (its sample keeps it), no `# UNIT` is written (OpenMetrics
//! requires the unit as a name suffix, which these names do not have), and `# EOF` ends it.

use std::fmt::Write;

use opentelemetry::{KeyValue, Value};
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData, ResourceMetrics};
use opentelemetry_sdk::metrics::reader::MetricReader;

use super::metrics::{Exemplars, ManualReaderHandle};

/// Which exposition format to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `text/plain; version=0.0.4`.
    Text,
    /// `application/openmetrics-text; version=1.0.0`, with exemplars.
    OpenMetrics,
}

impl Format {
    /// OpenMetrics when the `Accept` header lists it with a non-zero quality, else the text
    /// format (what every Prometheus understands, and what a browser or curl gets).
    pub fn negotiate(accept: Option<&str>) -> Format {
        let wants = accept.is_some_and(|a| {
            a.split(',').any(|part| {
                let mut it = part.split(';').map(str::trim);
                let media = it.next().unwrap_or("");
                let q = it.filter_map(|p| p.strip_prefix("q=")).filter_map(|q| q.parse::<f64>().ok()).next().unwrap_or(1.0);
                media.eq_ignore_ascii_case("application/openmetrics-text") && q > 0.0
            })
        });
        if wants {
            Format::OpenMetrics
        } else {
            Format::Text
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Text => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// Collect now and render every metric in the text format.
pub fn render(reader: &ManualReaderHandle) -> String {
    render_as(reader, Format::Text, None)
}

/// Collect now and render every metric in `format`; OpenMetrics carries the exemplars of
/// `exemplars` on histogram buckets.
pub fn render_as(reader: &ManualReaderHandle, format: Format, exemplars: Option<&Exemplars>) -> String {
    let mut rm = ResourceMetrics::default();
    if reader.0.collect(&mut rm).is_err() {
        return if format == Format::OpenMetrics { "# EOF\n".into() } else { String::new() };
    }
    render_metrics_as(&rm, format, exemplars)
}

/// Render collected metrics in the text format.
pub fn render_metrics(rm: &ResourceMetrics) -> String {
    render_metrics_as(rm, Format::Text, None)
}

/// Render collected metrics.
pub fn render_metrics_as(rm: &ResourceMetrics, format: Format, exemplars: Option<&Exemplars>) -> String {
    let mut out = String::with_capacity(4096);
    let ex = if format == Format::OpenMetrics { exemplars } else { None };
    for sm in rm.scope_metrics() {
        for m in sm.metrics() {
            let w = Family { base: sanitize_name(m.name()), otlp: m.name(), desc: m.description(), format, exemplars: ex };
            match m.data() {
                AggregatedMetrics::U64(d) => w.write(&mut out, d, |v| v.to_string()),
                AggregatedMetrics::I64(d) => w.write(&mut out, d, |v| v.to_string()),
                AggregatedMetrics::F64(d) => w.write(&mut out, d, fmt_f64),
            }
        }
    }
    if format == Format::OpenMetrics {
        out.push_str("# EOF\n");
    }
    out
}

/// One metric family being written.
struct Family<'a> {
    base: String,
    otlp: &'a str,
    desc: &'a str,
    format: Format,
    exemplars: Option<&'a Exemplars>,
}

impl Family<'_> {
    fn write<T: Copy>(&self, out: &mut String, d: &MetricData<T>, fmt: impl Fn(T) -> String) {
        let (base, desc) = (self.base.as_str(), self.desc);
        let om = self.format == Format::OpenMetrics;
        match d {
            MetricData::Sum(sum) => {
                let name = if sum.is_monotonic() { format!("{base}_total") } else { base.to_string() };
                let kind = if sum.is_monotonic() { "counter" } else { "gauge" };
                // OpenMetrics names the counter family without `_total`; 0.0.4 with it.
                header(out, if om { base } else { &name }, desc, kind, om);
                for p in sum.data_points() {
                    sample(out, &name, p.attributes(), &fmt(p.value()));
                    out.push('\n');
                }
            }
            MetricData::Gauge(g) => {
                header(out, base, desc, "gauge", om);
                for p in g.data_points() {
                    sample(out, base, p.attributes(), &fmt(p.value()));
                    out.push('\n');
                }
            }
            MetricData::Histogram(h) => {
                header(out, base, desc, "histogram", om);
                let (bucket, sum, count) = (format!("{base}_bucket"), format!("{base}_sum"), format!("{base}_count"));
                for p in h.data_points() {
                    let series = self.exemplars.map(|_| Exemplars::series_key(self.otlp, p.attributes()));
                    // Prometheus buckets are cumulative, with a last `+Inf` bucket equal to the count.
                    let mut cumulative = 0u64;
                    let bounds = p.bounds().map(fmt_f64).chain(std::iter::once("+Inf".to_string()));
                    for (i, (le, n)) in bounds.zip(p.bucket_counts()).enumerate() {
                        cumulative += n;
                        let le = KeyValue::new("le", le);
                        sample(out, &bucket, p.attributes().chain(std::iter::once(&le)), &cumulative.to_string());
                        // The last observation that fell into this very bucket (not a lower one),
                        // so its value always lies within the bucket's bounds.
                        if let (Some(ex), Some(series)) = (self.exemplars, &series) {
                            if let Some(e) = ex.get(series, i) {
                                let _ = write!(
                                    out,
                                    " # {{trace_id=\"{}\"}} {} {}",
                                    e.trace_id,
                                    fmt_f64(e.value),
                                    fmt_f64(e.time_ns as f64 / 1e9)
                                );
                            }
                        }
                        out.push('\n');
                    }
                    sample(out, &sum, p.attributes(), &fmt(p.sum()));
                    out.push('\n');
                    sample(out, &count, p.attributes(), &p.count().to_string());
                    out.push('\n');
                }
            }
            // Exponential histograms are not created by this service.
            _ => {}
        }
    }
}

fn header(out: &mut String, name: &str, desc: &str, kind: &str, openmetrics: bool) {
    let mut help = desc.replace('\\', "\\\\").replace('\n', "\\n");
    if openmetrics {
        // OpenMetrics escapes the double quote in HELP too.
        help = help.replace('"', "\\\"");
    }
    let _ = writeln!(out, "# HELP {name} {help}");
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

    #[test]
    fn openmetrics_is_served_only_to_who_asks_for_it() {
        // What Prometheus 2.x sends.
        let prom = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(Format::negotiate(Some(prom)), Format::OpenMetrics);
        assert_eq!(Format::negotiate(Some("Application/OpenMetrics-Text; version=1.0.0")), Format::OpenMetrics);
        for text in [None, Some("*/*"), Some("text/plain;version=0.0.4"), Some("application/openmetrics-text;q=0, text/plain")] {
            assert_eq!(Format::negotiate(text), Format::Text, "{text:?}");
        }
    }
}
