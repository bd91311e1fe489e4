//! Emit: pass-through spans, health spans, metrics (OTLP and Prometheus) and verdict lines. Every
//! emitter reads the same [`crate::verdict::Verdict`]; none re-derives it.

pub(crate) mod config;
pub(crate) mod disk_queue;
pub(crate) mod export_health;
pub(crate) mod health_spans;
pub(crate) mod incidents;
pub(crate) mod metrics;
pub(crate) mod otlp_http;
pub(crate) mod otlp_target;
pub(crate) mod otlp_traces;
pub(crate) mod otlp_transport;
pub(crate) mod pb;
pub(crate) mod prometheus;
#[cfg(test)]
pub(crate) mod reference;
pub(crate) mod sink;
pub(crate) mod status;
pub(crate) mod tls_client;
pub(crate) mod verdict_log;
