//! Emit: pass-through spans, health spans, metrics (OTLP and Prometheus) and verdict lines. Every
//! emitter reads the same [`crate::verdict::Verdict`]; none re-derives it.

pub(crate) mod config;
pub(crate) mod disk_queue;
pub mod export_health;
pub mod health_spans;
pub mod incidents;
pub mod metrics;
pub mod otlp_http;
pub mod otlp_target;
pub mod otlp_traces;
pub(crate) mod otlp_transport;
pub(crate) mod pb;
pub mod prometheus;
#[cfg(test)]
pub mod reference;
pub mod sink;
pub mod status;
pub mod tls_client;
pub mod verdict_log;
