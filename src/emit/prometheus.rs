//! Prometheus text exposition of what the SDK's manual reader collects: the text format 0.0.4,
//! or OpenMetrics 1.0 when the scraper asks for it (`Accept: application/openmetrics-text`, as
//! Prometheus does), because only OpenMetrics carries exemplars — the trace ids that let Grafana
//! go from a latency panel to the trace.
//!
//! Names follow the OpenTelemetry → Prometheus compatibility rules ([`names`]), the same ones a
//! collector applies when it turns the OTLP output into Prometheus series, so both roads give one
//! name: `.` becomes `_`, the unit becomes a suffix (`s` → `_seconds`, `By` → `_bytes`, `1` on a
//! gauge → `_ratio`, annotations such as `{call}` dropped, never twice), monotonic sums get
//! `_total`. Every sample carries `otel_scope_name`/`otel_scope_version`, as the collector's
//! Prometheus exporter writes them, and the resource is one `target_info` series. Only the
//! instrument kinds this service creates (sums, gauges and explicit-bucket histograms) are
//! rendered. In OpenMetrics a counter's family is named without `_total` (its sample keeps it),
//! a family whose name ends in its unit has a `# UNIT` line, `target_info` is an `info` family,
//! and `# EOF` ends it.

use std::fmt::Write;

use opentelemetry::{KeyValue, Value};
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData, ResourceMetrics};
use opentelemetry_sdk::metrics::reader::MetricReader;

use super::metrics::{Exemplars, ManualReaderHandle};
use crate::telemetry::instruments::Kind;

/// The Prometheus names of one instrument.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Names {
    /// The family: what OpenMetrics names in `# TYPE`; a counter's without `_total`.
    pub family: String,
    /// The sample name (a histogram's before `_bucket`, `_sum`, `_count`): a counter's ends `_total`.
    pub sample: String,
    /// The unit as a word (`seconds`, `bytes`, `ratio`), which `family` ends with; `None` for
    /// units that are only annotations.
    pub unit: Option<String>,
}

/// The OpenTelemetry → Prometheus name of an instrument of `kind` named `name` with `unit`.
/// A non-monotonic sum is a gauge to Prometheus but not to the `_ratio` rule, which (as in the
/// collector's translator) applies to gauges proper; this service has no such sum.
pub fn names(name: &str, unit: &str, kind: Kind) -> Names {
    let mut base = sanitize_name(name);
    while base.contains("__") {
        base = base.replace("__", "_");
    }
    if kind == Kind::Counter {
        if let Some(b) = base.strip_suffix("_total") {
            base = b.to_string();
        }
    }
    // Annotations (`{call}`, `By{request}`) carry no unit.
    let mut plain = String::with_capacity(unit.len());
    let mut depth = 0usize;
    for c in unit.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            c if depth == 0 => plain.push(c),
            _ => {}
        }
    }
    let plain = plain.trim();
    let (main, per) = match plain.split_once('/') {
        Some((m, p)) => (m.trim(), Some(p.trim())),
        None => (plain, None),
    };
    let mut word = unit_word(main).unwrap_or_else(|| sanitize_unit(main));
    if let Some(per) = per.filter(|p| !p.is_empty()) {
        let per = per_unit_word(per).unwrap_or_else(|| sanitize_unit(per));
        word = if word.is_empty() { format!("per_{per}") } else { format!("{word}_per_{per}") };
    }
    if word.is_empty() && kind == Kind::Gauge && main == "1" && per.is_none() {
        word = "ratio".into();
    }
    let unit = (!word.is_empty()).then_some(word);
    if let Some(w) = &unit {
        if base != *w && !base.ends_with(&format!("_{w}")) {
            base = format!("{base}_{w}");
        }
    }
    let sample = if kind == Kind::Counter { format!("{base}_total") } else { base.clone() };
    Names { family: base, sample, unit }
}

/// UCUM units as the compatibility rules spell them; `1` is no word (a gauge's becomes `ratio`).
fn unit_word(u: &str) -> Option<String> {
    let w = match u {
        "" | "1" => "",
        "d" => "days",
        "h" => "hours",
        "min" => "minutes",
        "s" => "seconds",
        "ms" => "milliseconds",
        "us" => "microseconds",
        "ns" => "nanoseconds",
        "By" => "bytes",
        "KiBy" => "kibibytes",
        "MiBy" => "mebibytes",
        "GiBy" => "gibibytes",
        "TiBy" => "tibibytes",
        "KBy" => "kilobytes",
        "MBy" => "megabytes",
        "GBy" => "gigabytes",
        "TBy" => "terabytes",
        "m" => "meters",
        "V" => "volts",
        "A" => "amperes",
        "J" => "joules",
        "W" => "watts",
        "g" => "grams",
        "Cel" => "celsius",
        "Hz" => "hertz",
        "%" => "percent",
        _ => return None,
    };
    Some(w.to_string())
}

/// The denominator of a `x/y` unit.
fn per_unit_word(u: &str) -> Option<String> {
    let w = match u {
        "s" => "second",
        "m" => "minute",
        "h" => "hour",
        "d" => "day",
        "w" => "week",
        "mo" => "month",
        "y" => "year",
        _ => return None,
    };
    Some(w.to_string())
}

/// An unknown unit kept as a name part: `[a-zA-Z0-9_]`, without leading or trailing `_`.
fn sanitize_unit(u: &str) -> String {
    let s: String = u.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    s.trim_matches('_').to_string()
}

/// Which exposition format to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    /// `text/plain; version=0.0.4`.
    Text,
    /// `application/openmetrics-text; version=1.0.0`, with exemplars.
    OpenMetrics,
}

impl Format {
    /// OpenMetrics when the `Accept` header lists it with a non-zero quality, else the text
    /// format (what every Prometheus understands, and what a browser or curl gets).
    pub(crate) fn negotiate(accept: Option<&str>) -> Format {
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

    pub(crate) fn content_type(self) -> &'static str {
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
pub(crate) fn render_as(reader: &ManualReaderHandle, format: Format, exemplars: Option<&Exemplars>) -> String {
    let mut rm = ResourceMetrics::default();
    if reader.0.collect(&mut rm).is_err() {
        return if format == Format::OpenMetrics { "# EOF\n".into() } else { String::new() };
    }
    render_metrics_as(&rm, format, exemplars)
}

/// Render collected metrics.
pub(crate) fn render_metrics_as(rm: &ResourceMetrics, format: Format, exemplars: Option<&Exemplars>) -> String {
    let mut out = String::with_capacity(4096);
    let ex = if format == Format::OpenMetrics { exemplars } else { None };
    target_info(&mut out, rm, format);
    for sm in rm.scope_metrics() {
        let scope = sm.scope();
        let mut scope_labels = vec![KeyValue::new("otel_scope_name", scope.name().to_string())];
        if let Some(v) = scope.version().filter(|v| !v.is_empty()) {
            scope_labels.push(KeyValue::new("otel_scope_version", v.to_string()));
        }
        for m in sm.metrics() {
            let w = Family { otlp: m.name(), unit: m.unit(), desc: m.description(), format, exemplars: ex, scope: &scope_labels };
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

/// The resource as one `target_info` series, as the compatibility rules ask of a pull exporter:
/// its attributes as labels (keys that sanitize alike have their values joined by `;`).
fn target_info(out: &mut String, rm: &ResourceMetrics, format: Format) {
    let mut labels: std::collections::BTreeMap<String, String> = std::collections::BTreeMap::new();
    let mut attrs: Vec<(String, String)> = rm.resource().iter().map(|(k, v)| (k.as_str().to_string(), v.as_str().into_owned())).collect();
    attrs.sort();
    for (k, v) in attrs {
        labels.entry(sanitize_name(&k)).and_modify(|have| *have = format!("{have};{v}")).or_insert(v);
    }
    if labels.is_empty() {
        return;
    }
    let kvs: Vec<KeyValue> = labels.into_iter().map(|(k, v)| KeyValue::new(k, v)).collect();
    let help = "Target metadata";
    if format == Format::OpenMetrics {
        let _ = writeln!(out, "# TYPE target info\n# HELP target {help}");
    } else {
        let _ = writeln!(out, "# HELP target_info {help}\n# TYPE target_info gauge");
    }
    sample(out, "target_info", kvs.iter(), "1");
    out.push('\n');
}

/// One metric family being written.
struct Family<'a> {
    otlp: &'a str,
    unit: &'a str,
    desc: &'a str,
    format: Format,
    exemplars: Option<&'a Exemplars>,
    /// `otel_scope_name` and `otel_scope_version`, on every sample.
    scope: &'a [KeyValue],
}

impl Family<'_> {
    fn write<T: Copy>(&self, out: &mut String, d: &MetricData<T>, fmt: impl Fn(T) -> String) {
        let desc = self.desc;
        let om = self.format == Format::OpenMetrics;
        let scope = self.scope;
        match d {
            MetricData::Sum(sum) => {
                if sum.data_points().next().is_none() {
                    return;
                }
                let kind = if sum.is_monotonic() { Kind::Counter } else { Kind::Gauge };
                let n = names(self.otlp, self.unit, kind);
                let type_name = if sum.is_monotonic() { "counter" } else { "gauge" };
                // OpenMetrics names the counter family without `_total`; 0.0.4 with it.
                header(out, if om { &n.family } else { &n.sample }, desc, type_name, om, n.unit.as_deref());
                for p in sum.data_points() {
                    sample(out, &n.sample, p.attributes().chain(scope), &fmt(p.value()));
                    out.push('\n');
                }
            }
            MetricData::Gauge(g) => {
                if g.data_points().next().is_none() {
                    return;
                }
                let n = names(self.otlp, self.unit, Kind::Gauge);
                header(out, &n.family, desc, "gauge", om, n.unit.as_deref());
                for p in g.data_points() {
                    sample(out, &n.sample, p.attributes().chain(scope), &fmt(p.value()));
                    out.push('\n');
                }
            }
            MetricData::Histogram(h) => {
                if h.data_points().next().is_none() {
                    return;
                }
                let n = names(self.otlp, self.unit, Kind::Histogram);
                let base = n.family.as_str();
                header(out, base, desc, "histogram", om, n.unit.as_deref());
                let (bucket, sum, count) = (format!("{base}_bucket"), format!("{base}_sum"), format!("{base}_count"));
                for p in h.data_points() {
                    let series = self.exemplars.map(|_| Exemplars::series_key(self.otlp, p.attributes()));
                    // Prometheus buckets are cumulative, with a last `+Inf` bucket equal to the count.
                    let mut cumulative = 0u64;
                    let bounds = p.bounds().map(fmt_f64).chain(std::iter::once("+Inf".to_string()));
                    for (i, (le, n)) in bounds.zip(p.bucket_counts()).enumerate() {
                        cumulative += n;
                        let le = KeyValue::new("le", le);
                        sample(out, &bucket, p.attributes().chain(scope).chain(std::iter::once(&le)), &cumulative.to_string());
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
                    sample(out, &sum, p.attributes().chain(scope), &fmt(p.sum()));
                    out.push('\n');
                    sample(out, &count, p.attributes().chain(scope), &p.count().to_string());
                    out.push('\n');
                }
            }
            // Exponential histograms are not created by this service.
            _ => {}
        }
    }
}

/// `# HELP` and `# TYPE`, and in OpenMetrics `# UNIT` when the family ends with its unit.
fn header(out: &mut String, name: &str, desc: &str, kind: &str, om: bool, unit: Option<&str>) {
    let mut help = desc.replace('\\', "\\\\").replace('\n', "\\n");
    if om {
        // OpenMetrics escapes the double quote in HELP too.
        help = help.replace('"', "\\\"");
    }
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    if let Some(u) = unit.filter(|_| om) {
        let _ = writeln!(out, "# UNIT {name} {u}");
    }
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

    /// The OpenTelemetry → Prometheus compatibility rules, as a collector applies them to OTLP.
    #[test]
    fn names_follow_the_compatibility_rules() {
        let n = |name: &str, unit: &str, kind: Kind| {
            let n = names(name, unit, kind);
            (n.sample, n.unit)
        };
        let some = |s: &str| Some(s.to_string());
        assert_eq!(n("mcp_health.call.duration", "s", Kind::Histogram), ("mcp_health_call_duration_seconds".into(), some("seconds")));
        assert_eq!(n("mcp_health.process.uptime", "s", Kind::Counter), ("mcp_health_process_uptime_seconds_total".into(), some("seconds")));
        assert_eq!(n("mcp_health.process.memory.rss", "By", Kind::Gauge), ("mcp_health_process_memory_rss_bytes".into(), some("bytes")));
        // No double suffixes: the unit, or `_total`, already there.
        assert_eq!(n("mcp_health.evidence.bytes", "By", Kind::Gauge), ("mcp_health_evidence_bytes".into(), some("bytes")));
        assert_eq!(n("requests.total", "{request}", Kind::Counter), ("requests_total".into(), None));
        assert_eq!(n("busy.seconds.total", "s", Kind::Counter), ("busy_seconds_total".into(), some("seconds")));
        // Annotations dropped; `1` is `_ratio` on a gauge only.
        assert_eq!(n("mcp_health.calls", "{call}", Kind::Counter), ("mcp_health_calls_total".into(), None));
        assert_eq!(n("cpu.utilization", "1", Kind::Gauge), ("cpu_utilization_ratio".into(), some("ratio")));
        assert_eq!(n("events", "1", Kind::Counter), ("events_total".into(), None));
        assert_eq!(n("queue.wait", "ms", Kind::Histogram), ("queue_wait_milliseconds".into(), some("milliseconds")));
        assert_eq!(n("net.io", "By/s", Kind::Gauge), ("net_io_bytes_per_second".into(), some("bytes_per_second")));
        assert_eq!(n("sent", "By{request}", Kind::Counter), ("sent_bytes_total".into(), some("bytes")));
        assert_eq!(n("a..b", "{x}", Kind::Gauge), ("a_b".into(), None));
        // OpenMetrics names a counter's family without `_total`.
        assert_eq!(names("mcp_health.process.uptime", "s", Kind::Counter).family, "mcp_health_process_uptime_seconds");
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
