//! The closed sets the receivers and the exporter count and log by: which signal, counted in
//! which items, over which transport, refused or dropped why. One enum each, so every label value is spelled in one place
//! and a caller cannot hand a counter free text; `as_str` is the label value the dashboards and
//! alerts match on.

/// What an export request carries, in the collector's units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ItemKind {
    Spans,
    MetricPoints,
    LogRecords,
}

/// An OTLP signal, as a receiver takes it in (`signal` label and log field).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Signal {
    Traces,
    Metrics,
    Logs,
}

impl Signal {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Signal::Traces => "traces",
            Signal::Metrics => "metrics",
            Signal::Logs => "logs",
        }
    }

    /// The unit its items are counted in.
    pub(crate) fn item_kind(self) -> ItemKind {
        match self {
            Signal::Traces => ItemKind::Spans,
            Signal::Metrics => ItemKind::MetricPoints,
            Signal::Logs => ItemKind::LogRecords,
        }
    }

    /// What the exporter counts this signal's pass-through copies under.
    pub(crate) fn passthrough(self) -> ExportSignal {
        match self {
            Signal::Traces => ExportSignal::Passthrough,
            Signal::Metrics => ExportSignal::PassthroughMetrics,
            Signal::Logs => ExportSignal::PassthroughLogs,
        }
    }
}

/// What the exporter sends (`signal` label of its counters): the data passed through, per signal,
/// and mcp-health's own output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExportSignal {
    /// Spans passed through.
    Passthrough,
    HealthSpans,
    IncidentLogs,
    PassthroughMetrics,
    PassthroughLogs,
    /// mcp-health's own metrics, when pushed over OTLP.
    OwnMetrics,
}

impl ExportSignal {
    pub fn as_str(self) -> &'static str {
        match self {
            ExportSignal::Passthrough => "passthrough",
            ExportSignal::HealthSpans => "health_spans",
            ExportSignal::IncidentLogs => "incident_logs",
            ExportSignal::PassthroughMetrics => "passthrough_metrics",
            ExportSignal::PassthroughLogs => "passthrough_logs",
            ExportSignal::OwnMetrics => "own_metrics",
        }
    }
}

/// The protocol OTLP data came in or went out by (`transport` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    Grpc,
    Http,
}

impl Transport {
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Grpc => "grpc",
            Transport::Http => "http",
        }
    }
}

/// Why a receiver refused a request, or items inside one (`reason` label and log field).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RefusalReason {
    /// Not an OTLP request of its signal, or a body that could not be decompressed.
    Undecodable,
    /// Without the configured bearer token.
    Unauthenticated,
    /// Above the memory limiter's soft limit, or its reservation could not grow.
    MemoryLimit,
    /// The correlator's input queue is full.
    CorrelatorBusy,
    /// The pass-through export queue is full.
    ExporterBusy,
    /// Over the size limit, as sent or decompressed, or too large to decode under the memory limit.
    TooLarge,
    /// A `Content-Type` other than protobuf or JSON.
    UnsupportedMediaType,
    /// A `Content-Encoding` or `grpc-encoding` that is not supported.
    UnsupportedEncoding,
    /// Spans inside an accepted request with invalid ids (partial success).
    InvalidSpan,
    /// The evidence journal (`storage.directory`) is full or could not be written: the spans
    /// are not acknowledged (retryable).
    JournalFull,
}

impl RefusalReason {
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalReason::Undecodable => "undecodable",
            RefusalReason::Unauthenticated => "unauthenticated",
            RefusalReason::MemoryLimit => "memory_limit",
            RefusalReason::CorrelatorBusy => "correlator_busy",
            RefusalReason::ExporterBusy => "exporter_busy",
            RefusalReason::TooLarge => "too_large",
            RefusalReason::UnsupportedMediaType => "unsupported_media_type",
            RefusalReason::UnsupportedEncoding => "unsupported_encoding",
            RefusalReason::InvalidSpan => "invalid_span",
            RefusalReason::JournalFull => "journal_full",
        }
    }
}

impl std::fmt::Display for RefusalReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why the exporter dropped a request of its own output or gave one up (`reason` label of
/// `mcp_health.exporter.dropped`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// Its queue was full.
    QueueFull,
    /// Over the memory limiter's soft limit.
    MemoryLimit,
    /// A permanent error, or retries exhausted.
    SendFailed,
}

impl DropReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::QueueFull => "queue_full",
            DropReason::MemoryLimit => "memory_limit",
            DropReason::SendFailed => "send_failed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The label values are what dashboards, alerts and the collector's own counters match on:
    /// renaming a variant must not rename a series.
    #[test]
    fn label_values_are_the_published_ones() {
        let signals = [Signal::Traces, Signal::Metrics, Signal::Logs].map(Signal::as_str);
        assert_eq!(signals, ["traces", "metrics", "logs"]);
        assert_eq!([Transport::Grpc, Transport::Http].map(Transport::as_str), ["grpc", "http"]);
        let reasons = [
            RefusalReason::Undecodable,
            RefusalReason::Unauthenticated,
            RefusalReason::MemoryLimit,
            RefusalReason::CorrelatorBusy,
            RefusalReason::ExporterBusy,
            RefusalReason::TooLarge,
            RefusalReason::UnsupportedMediaType,
            RefusalReason::UnsupportedEncoding,
            RefusalReason::InvalidSpan,
        ]
        .map(RefusalReason::as_str);
        assert_eq!(
            reasons,
            [
                "undecodable",
                "unauthenticated",
                "memory_limit",
                "correlator_busy",
                "exporter_busy",
                "too_large",
                "unsupported_media_type",
                "unsupported_encoding",
                "invalid_span"
            ]
        );
        let passthrough = [Signal::Traces, Signal::Metrics, Signal::Logs].map(|s| s.passthrough().as_str());
        assert_eq!(passthrough, ["passthrough", "passthrough_metrics", "passthrough_logs"]);
        let own = [ExportSignal::HealthSpans, ExportSignal::IncidentLogs, ExportSignal::OwnMetrics].map(ExportSignal::as_str);
        assert_eq!(own, ["health_spans", "incident_logs", "own_metrics"]);
        let drops = [DropReason::QueueFull, DropReason::MemoryLimit, DropReason::SendFailed].map(DropReason::as_str);
        assert_eq!(drops, ["queue_full", "memory_limit", "send_failed"]);
    }
}
