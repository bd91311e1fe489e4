//! A bound is counted (issue 8): the interner and the session-hash cache filled past the limits a
//! configuration gives them evict their oldest entries, the registry counts each one under the
//! table's name, and the Prometheus endpoint serves the count as
//! `mcp_health_state_evicted_total{table=...}`.
//!
//! Its own test binary: the limits are process-wide.

use mcp_health::config::Config;
use mcp_health::normalize::redact::session_hash;
use mcp_health::testing::bounded;
use mcp_health::testing::emit::metrics::{MetricsPipeline, MetricsSettings};
use mcp_health::testing::normalize::intern::{intern, Kind};

#[test]
fn filling_a_table_past_its_configured_limit_is_counted_and_served() {
    let yaml = "processors:\n  mcp_health:\n    limits:\n      interner: 8\n      redaction_cache: 3\n";
    let cfg = Config::parse("limits.yaml", yaml, &|_| None).unwrap();
    // The receiving threads' caches are sized by the settings a walk is given; this thread is
    // sized the same way.
    cfg.processors.mcp_health.normalize_settings().fit_thread();

    let (interner_before, redaction_before) = (bounded::evicted("interner"), bounded::evicted("redaction_cache"));
    for i in 0..20 {
        let name = format!("tool_{i}");
        assert_eq!(&*intern(Kind::Tool, &name, None, || name.clone()), name);
    }
    for i in 0..10 {
        session_hash(&format!("session-{i}"));
    }
    // Again the newest: still cached, so nothing more is evicted.
    intern(Kind::Tool, "tool_19", None, || unreachable!("tool_19 is among the 8 newest"));
    assert_eq!(bounded::evicted("interner") - interner_before, 20 - 8);
    assert_eq!(bounded::evicted("redaction_cache") - redaction_before, 10 - 3);
    let listed: Vec<_> = bounded::evictions();
    assert!(listed.iter().any(|(t, n)| *t == "interner" && *n >= 12), "{listed:?}");

    let metrics = MetricsPipeline::build(MetricsSettings {
        resource: opentelemetry_sdk::Resource::builder().with_service_name("test").build(),
        prometheus: true,
        otlp: None,
        cardinality_limit: 100,
        level: mcp_health::config::MetricsLevel::default(),
    })
    .unwrap();
    let text = mcp_health::testing::emit::prometheus::render(metrics.prometheus.as_ref().unwrap());
    // Every series carries the instrumentation scope after its own labels.
    let scope = format!("otel_scope_name=\"mcp-health\",otel_scope_version=\"{}\"", env!("CARGO_PKG_VERSION"));
    let want = format!("mcp_health_state_evicted_total{{table=\"interner\",{scope}}} {}", bounded::evicted("interner"));
    assert!(text.contains("# TYPE mcp_health_state_evicted_total counter"), "{text}");
    assert!(text.contains(&want), "want {want} in:\n{text}");
    assert!(text.contains(&format!("mcp_health_state_evicted_total{{table=\"redaction_cache\",{scope}}} 7")), "{text}");
}
