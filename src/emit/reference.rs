//! The metrics reference, docs/metrics.md: generated from the instruments' one declaration
//! ([`crate::telemetry::instruments`]) under the Prometheus names [`super::prometheus`] gives them,
//! so that the page a person reads and the names a scrape serves cannot disagree. It lives here,
//! above the declarations, because the naming rules belong to the exporter.

use crate::telemetry::instruments::ALL;

/// The metrics reference (docs/metrics.md), generated from [`ALL`].
pub(crate) fn reference() -> String {
    use std::fmt::Write;
    let mut out = String::from(
        "# Metrics reference\n\n\
         <!-- Generated from src/telemetry/instruments.rs by `MCP_HEALTH_WRITE_DOCS=1 cargo test --lib metrics_reference`; \
         a test fails when this file and the code disagree. Edit the table in the code, not this file. -->\n\n\
         mcp-health serves its metrics on the Prometheus endpoint (`exporters.prometheus`) and sends \
         them over OTLP (`exporters.otlp.metrics`). Both carry the same instruments; the Prometheus \
         names below follow the OpenTelemetry rules for Prometheus compatibility, so a collector that \
         turns the OTLP metrics into Prometheus series gives the very same names:\n\n\
         - `.` in a name or attribute key becomes `_` (`server.address` is the label `server_address`);\n\
         - the unit becomes a suffix: `s` → `_seconds`, `By` → `_bytes`, `1` on a gauge → `_ratio`; \
         an annotation such as `{call}` is dropped; a name that already ends with its unit gets no second one;\n\
         - counters end in `_total`; histograms are served as `_bucket`, `_sum` and `_count`.\n\n\
         Every series also carries `otel_scope_name=\"mcp-health\"` and `otel_scope_version` (the \
         version of mcp-health), as the collector's Prometheus exporter writes them. The resource \
         (`service.name`, the SDK's attributes, `OTEL_RESOURCE_ATTRIBUTES`, mcp-health's instance id \
         `mcp_health.emitter`) is one `target_info` series rather than labels on every series. \
         A series past `exporters.prometheus.cardinality_limit` is folded into one series labelled \
         `otel_metric_overflow=\"true\"`.\n\n\
         Scrapers that ask for OpenMetrics (`Accept: application/openmetrics-text`, as Prometheus \
         does) get it, with `# UNIT` lines, counter families named without `_total` (their samples \
         keep it), `target_info` as an `info` family, and exemplars (trace ids) on the buckets of \
         `mcp_health_call_duration_seconds` and `mcp_health_verdict_delay_seconds`. Anyone else gets \
         the text format 0.0.4.\n\n\
         ## Levels\n\n\
         `service.telemetry.metrics.level` takes the collector's levels and chooses how much of the \
         service's own telemetry is served; the verdict, incident, catalog and verifier metrics \
         (level *always*) are what the service is for and are served at every level.\n\n\
         | level | serves |\n|---|---|\n\
         | `none` | the *always* metrics only |\n\
         | `basic` | also intake, export, queues and the process: is the service working |\n\
         | `normal` (default) | also the engine's bounds and losses, connections refused or timed out, memory |\n\
         | `detailed` | also request counts beside item counts, split requests, open connections |\n\n\
         ## Instruments\n\n\
         | Prometheus name | type | unit | labels | level | description | OpenTelemetry name |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for i in ALL {
        let n = super::prometheus::names(i.name, i.unit, i.kind);
        let labels: Vec<String> = i.labels.iter().map(|l| format!("`{}`", super::prometheus::sanitize_name(l))).collect();
        let labels = if labels.is_empty() { "—".to_string() } else { labels.join(", ") };
        let _ = writeln!(
            out,
            "| `{}` | {} | `{}` | {} | {} | {} | `{}` |",
            n.sample,
            i.kind.as_str(),
            i.unit,
            labels,
            i.tier.as_str(),
            i.description.replace('|', "\\|"),
            i.name
        );
    }
    out.push_str(
        "\n`target_info` (gauge; `info` in OpenMetrics) is always served, with one label per \
         resource attribute.\n",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/metrics.md is this table; `MCP_HEALTH_WRITE_DOCS=1` writes it.
    #[test]
    fn metrics_reference_matches_the_code() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/metrics.md");
        let want = reference();
        if std::env::var("MCP_HEALTH_WRITE_DOCS").is_ok_and(|v| v == "1") {
            std::fs::write(&path, &want).unwrap();
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            have == want,
            "docs/metrics.md differs from the instruments declared in src/telemetry/instruments.rs; \
             regenerate it with `MCP_HEALTH_WRITE_DOCS=1 cargo test --lib metrics_reference`"
        );
    }
}
