//! The closed sets the receivers count and log by: which signal, over which transport, refused
//! why. One enum each, so every label value is spelled in one place and a caller cannot hand a
//! counter free text; `as_str` is the label value the dashboards and alerts match on.

use super::outgoing::ItemKind;

/// An OTLP signal, as a receiver takes it in (`signal` label and log field).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Signal {
    Traces,
    Metrics,
    Logs,
}

impl Signal {
    pub fn as_str(self) -> &'static str {
        match self {
            Signal::Traces => "traces",
            Signal::Metrics => "metrics",
            Signal::Logs => "logs",
        }
    }

    /// The unit its items are counted in.
    pub fn item_kind(self) -> ItemKind {
        match self {
            Signal::Traces => ItemKind::Spans,
            Signal::Metrics => ItemKind::MetricPoints,
            Signal::Logs => ItemKind::LogRecords,
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
        }
    }
}

impl std::fmt::Display for RefusalReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
