//! What the receivers and the queues count: data received, refused, dropped, and the items that
//! found a queue full, and the verdict-log records lost to failed writes. Declared here, under both the receivers and the exporter, so that each
//! records into the same counters without importing the other; the instruments themselves are
//! made by `emit::metrics` from their declarations ([`super::instruments`]), because the exporter
//! is the one place that knows how a metric is exported.

use std::sync::atomic::AtomicU64;

use opentelemetry::metrics::Counter;
use opentelemetry::KeyValue;

use super::labels::{ExportSignal, ItemKind, RefusalReason, Transport};

/// Verdict-log records lost to failed writes, process-wide
/// (`mcp_health.verdict_log.write_errors`): the verdict log adds to it and the metrics read it, so
/// it lives under both and neither imports the other.
pub(crate) static VERDICT_LOG_WRITE_ERRORS: AtomicU64 = AtomicU64::new(0);

/// One counter per item kind, in the collector's units: the `_spans`, `_metric_points` and
/// `_log_records` triple every item counter of the collector comes in.
#[derive(Clone)]
pub struct ItemCounters {
    pub spans: Counter<u64>,
    pub metric_points: Counter<u64>,
    pub log_records: Counter<u64>,
}

impl ItemCounters {
    /// The counter of items of `kind`.
    pub fn of(&self, kind: ItemKind) -> &Counter<u64> {
        match kind {
            ItemKind::Spans => &self.spans,
            ItemKind::MetricPoints => &self.metric_points,
            ItemKind::LogRecords => &self.log_records,
        }
    }
}

/// The counters of data on its way through: the receivers' and the queues'.
#[derive(Clone)]
pub struct FlowMeters {
    pub spans_received: Counter<u64>,
    pub spans_refused: Counter<u64>,
    pub spans_rejected: Counter<u64>,
    /// Spans that came back from this process's own exporter (an export loop): dropped.
    pub spans_looped: Counter<u64>,
    /// Metric data points and log records received (pass-through only; never judged).
    pub signals_received: Counter<u64>,
    pub signals_refused: Counter<u64>,
    pub requests_refused: Counter<u64>,
    pub signals_dropped: Counter<u64>,
    pub attributes_invalid: Counter<u64>,
    /// The collector's receiver counters (`otelcol_receiver_accepted_spans`, …), counted in items
    /// of decoded requests, so that `received = accepted + refused` holds per transport.
    /// `mcp_health.spans.received` and `mcp_health.spans.refused` stay for the dashboards and
    /// alerts that use them; a request that could not be decoded has no item count and is only in
    /// those (1 per request).
    pub receiver_accepted: ItemCounters,
    pub receiver_refused: ItemCounters,
    /// The collector's `otelcol_exporter_enqueue_failed_*`: items that found an export queue full
    /// (refused to their sender, or dropped when they are mcp-health's own).
    pub enqueue_failed: ItemCounters,
    /// Batches read back from the evidence journal at a start, by result.
    pub journal_replayed: Counter<u64>,
}

impl FlowMeters {
    /// Items of a decoded request handed on (accepted) by a receiver.
    pub fn receiver_accepted(&self, kind: ItemKind, transport: Transport, n: u64) {
        self.receiver_accepted.of(kind).add(n, &[KeyValue::new("receiver", "otlp"), KeyValue::new("transport", transport.as_str())]);
    }

    /// Items of a decoded request a receiver did not take, with why.
    pub fn receiver_refused(&self, kind: ItemKind, transport: Transport, reason: RefusalReason, n: u64) {
        let attrs =
            [KeyValue::new("receiver", "otlp"), KeyValue::new("transport", transport.as_str()), KeyValue::new("reason", reason.as_str())];
        self.receiver_refused.of(kind).add(n, &attrs);
    }

    /// Items that found the exporter queue full (refused to the sender, or dropped when they are
    /// our own), labelled like the exporter's other item counters.
    pub fn enqueue_failed(&self, signal: ExportSignal, kind: ItemKind, n: u64) {
        self.enqueue_failed.of(kind).add(n, &[KeyValue::new("exporter", "otlp"), KeyValue::new("signal", signal.as_str())]);
    }
}
