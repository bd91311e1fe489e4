//! The message every queue of the service carries towards the exporter: what was received and is
//! passed on, or what mcp-health made itself, with the memory it holds and how many items (in the
//! collector's units) it counts for. It lives under both the receivers (which make pass-through
//! items) and the exporter (which sends them), so neither has to reach into the other.

use bytes::Bytes;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;

use super::memory::Reservation;
use crate::telemetry::labels::{ExportSignal, ItemKind};

/// What travels to the workers.
#[derive(Debug)]
pub enum Outgoing {
    /// Spans received from a client, passed on unchanged, with the memory they hold under
    /// `processors.memory_limiter` (released once sent or given up on).
    Passthrough(ExportTraceServiceRequest, Option<Reservation>),
    /// Spans received from a client, passed on as the bytes they came in (`mcp_health.via`
    /// spliced in, see `normalize::wire::splice_via`): an encoded `ExportTraceServiceRequest`,
    /// its span count, its memory reservation (its wire size).
    PassthroughRaw(Bytes, u64, Option<Reservation>),
    /// Health spans made by this service.
    Health(ExportTraceServiceRequest),
    /// Health spans made by this service, encoded already (`health_spans::encode_requests`),
    /// their count, and the memory their bytes hold under `processors.memory_limiter` while they
    /// wait for the backend (none once read back from disk: one at a time, not queued).
    HealthRaw(Bytes, u64, Option<Reservation>),
    /// Incident log records made by this service.
    Logs(ExportLogsServiceRequest),
    /// Incident log records made by this service, encoded already
    /// (`incidents::encode_log_requests`), their count and their memory (as `HealthRaw`).
    LogsRaw(Bytes, u64, Option<Reservation>),
    /// Metrics received from a client, passed on unchanged (and their memory reservation).
    PassthroughMetrics(ExportMetricsServiceRequest, Option<Reservation>),
    /// Log records received from a client, passed on unchanged (and their memory reservation).
    PassthroughLogs(ExportLogsServiceRequest, Option<Reservation>),
    /// This service's own metrics (the SDK's periodic reader).
    OwnMetrics(ExportMetricsServiceRequest),
}

impl Outgoing {
    /// The `signal` label of the exporter's counters.
    pub fn signal(&self) -> ExportSignal {
        match self {
            Outgoing::Passthrough(..) | Outgoing::PassthroughRaw(..) => ExportSignal::Passthrough,
            Outgoing::Health(_) | Outgoing::HealthRaw(..) => ExportSignal::HealthSpans,
            Outgoing::Logs(_) | Outgoing::LogsRaw(..) => ExportSignal::IncidentLogs,
            Outgoing::PassthroughMetrics(..) => ExportSignal::PassthroughMetrics,
            Outgoing::PassthroughLogs(..) => ExportSignal::PassthroughLogs,
            Outgoing::OwnMetrics(_) => ExportSignal::OwnMetrics,
        }
    }

    /// Where an item keeps its memory reservation: pass-through items and encoded own output
    /// (decoded own output and own metrics hold none: they are small and short-lived).
    fn reservation_slot(&mut self) -> Option<&mut Option<Reservation>> {
        match self {
            Outgoing::Passthrough(_, r)
            | Outgoing::PassthroughRaw(_, _, r)
            | Outgoing::PassthroughMetrics(_, r)
            | Outgoing::PassthroughLogs(_, r)
            | Outgoing::HealthRaw(_, _, r)
            | Outgoing::LogsRaw(_, _, r) => Some(r),
            _ => None,
        }
    }

    /// The memory reservation, taken out so it can outlive the item (the encoded bytes it
    /// becomes are held until sent).
    pub fn take_reservation(&mut self) -> Option<Reservation> {
        self.reservation_slot().and_then(Option::take)
    }

    /// Give an item the memory it holds (an item that keeps none drops it).
    pub fn set_reservation(&mut self, held: Reservation) {
        if let Some(r) = self.reservation_slot() {
            *r = Some(held);
        }
    }

    /// How many items the request carries, and of which kind.
    pub fn items(&self) -> (ItemKind, u64) {
        match self {
            Outgoing::Passthrough(r, _) | Outgoing::Health(r) => (ItemKind::Spans, span_count(r)),
            Outgoing::PassthroughRaw(_, n, _) | Outgoing::HealthRaw(_, n, _) => (ItemKind::Spans, *n),
            Outgoing::Logs(r) | Outgoing::PassthroughLogs(r, _) => (ItemKind::LogRecords, log_record_count(r)),
            Outgoing::LogsRaw(_, n, _) => (ItemKind::LogRecords, *n),
            Outgoing::PassthroughMetrics(r, _) | Outgoing::OwnMetrics(r) => (ItemKind::MetricPoints, metric_point_count(r)),
        }
    }
}

pub(crate) fn span_count(r: &ExportTraceServiceRequest) -> u64 {
    r.resource_spans.iter().flat_map(|r| &r.scope_spans).map(|s| s.spans.len() as u64).sum()
}

pub(crate) fn log_record_count(r: &ExportLogsServiceRequest) -> u64 {
    r.resource_logs.iter().flat_map(|r| &r.scope_logs).map(|s| s.log_records.len() as u64).sum()
}

pub(crate) fn metric_point_count(r: &ExportMetricsServiceRequest) -> u64 {
    r.resource_metrics
        .iter()
        .flat_map(|r| &r.scope_metrics)
        .flat_map(|s| &s.metrics)
        .map(|m| match &m.data {
            Some(Data::Gauge(g)) => g.data_points.len(),
            Some(Data::Sum(s)) => s.data_points.len(),
            Some(Data::Histogram(h)) => h.data_points.len(),
            Some(Data::ExponentialHistogram(h)) => h.data_points.len(),
            Some(Data::Summary(s)) => s.data_points.len(),
            None => 0,
        } as u64)
        .sum()
}

/// A queue on disk a request can be written to directly (the exporter's, when its sending queue
/// has a directory): for the receivers, which answer only once what they pass on is on disk, and
/// for the health sink's overflow. Declared here, beside what it carries, so that neither side
/// reaches into the exporter.
pub(crate) trait DiskSpool: Send + Sync + std::fmt::Debug {
    /// Write `item` and wake a sender; `Err` when it cannot be written (the queue is at its byte
    /// bound, or the disk failed): nothing was written.
    fn push(&self, item: Outgoing) -> Result<(), String>;
}
