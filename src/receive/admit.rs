//! Admission, shared by both receivers: reserve room downstream, normalize, hand on — or refuse
//! the whole request with a retryable answer so the sender keeps its data.

use opentelemetry::KeyValue;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use tokio::sync::mpsc;

use crate::emit::metrics::HealthMeters;
use crate::emit::otlp_traces::Outgoing;
use crate::normalize::{drop_invalid_spans, normalize_request, strip_raw_definitions, NormalizedBatch};

/// What the receiver should answer.
#[derive(Debug, PartialEq, Eq)]
pub enum Admitted {
    /// Accepted; `rejected` spans inside it were invalid (partial success).
    Accepted { rejected: u64, message: String },
    /// Refused as a whole: downstream is full. Retryable.
    Busy,
}

/// Shared by every receiver connection.
#[derive(Clone)]
pub struct Admission {
    pub ingest: mpsc::Sender<NormalizedBatch>,
    pub passthrough: Option<mpsc::Sender<Outgoing>>,
    pub meters: HealthMeters,
    /// Remove raw tool definitions before passing spans on (they were digested).
    pub strip_tool_definitions: bool,
}

impl Admission {
    /// Count a request refused before it could be read (undecodable, too large).
    pub fn refused(&self, transport: &'static str, reason: &'static str) {
        self.meters.spans_refused.add(1, &[KeyValue::new("transport", transport), KeyValue::new("reason", reason)]);
    }

    /// [`Self::refused`] for any signal: `"traces"`, `"metrics"` or `"logs"`.
    pub fn refused_signal(&self, signal: &'static str, transport: &'static str, reason: &'static str) {
        if signal == "traces" {
            return self.refused(transport, reason);
        }
        let attrs = [KeyValue::new("signal", signal), KeyValue::new("transport", transport), KeyValue::new("reason", reason)];
        self.meters.signals_refused.add(1, &attrs);
    }

    /// Metrics are not read: passed on unchanged when pass-through is on, else dropped and counted.
    pub fn admit_metrics(&self, req: ExportMetricsServiceRequest, transport: &'static str) -> Admitted {
        let points = req
            .resource_metrics
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
            .sum();
        self.pass_on("metrics", points, transport, || Outgoing::PassthroughMetrics(req))
    }

    /// Logs are not read: passed on unchanged when pass-through is on, else dropped and counted.
    pub fn admit_logs(&self, req: ExportLogsServiceRequest, transport: &'static str) -> Admitted {
        let records = req.resource_logs.iter().flat_map(|r| &r.scope_logs).map(|s| s.log_records.len() as u64).sum();
        self.pass_on("logs", records, transport, || Outgoing::PassthroughLogs(req))
    }

    /// Reserve a place in the exporter queue as [`Self::admit`] does, so a full queue answers a
    /// retryable refusal rather than losing the request.
    fn pass_on(&self, signal: &'static str, items: u64, transport: &'static str, out: impl FnOnce() -> Outgoing) -> Admitted {
        let sig = KeyValue::new("signal", signal);
        self.meters.signals_received.add(items, &[sig.clone(), KeyValue::new("transport", transport)]);
        match &self.passthrough {
            Some(p) => match p.try_reserve() {
                Ok(permit) => permit.send(out()),
                Err(_) => {
                    let attrs = [sig, KeyValue::new("transport", transport), KeyValue::new("reason", "exporter_busy")];
                    self.meters.signals_refused.add(items, &attrs);
                    return Admitted::Busy;
                }
            },
            None => self.meters.signals_dropped.add(items, &[sig, KeyValue::new("reason", "passthrough_off")]),
        }
        Admitted::Accepted { rejected: 0, message: String::new() }
    }

    pub fn admit(&self, mut req: ExportTraceServiceRequest, transport: &'static str) -> Admitted {
        let spans: u64 = req.resource_spans.iter().flat_map(|r| &r.scope_spans).map(|s| s.spans.len() as u64).sum();
        let tr = KeyValue::new("transport", transport);
        self.meters.spans_received.add(spans, std::slice::from_ref(&tr));
        // Reserve both places first, so a request is either taken whole or refused whole.
        let Ok(ingest_permit) = self.ingest.try_reserve() else {
            self.meters.spans_refused.add(spans, &[tr, KeyValue::new("reason", "correlator_busy")]);
            return Admitted::Busy;
        };
        let pass_permit = match &self.passthrough {
            Some(p) => match p.try_reserve() {
                Ok(permit) => Some(permit),
                Err(_) => {
                    self.meters.spans_refused.add(spans, &[tr, KeyValue::new("reason", "exporter_busy")]);
                    return Admitted::Busy;
                }
            },
            None => None,
        };
        let batch = normalize_request(&req);
        let rejected = batch.rejected_spans;
        let raw_defs = batch.raw_definitions_seen;
        if batch.attribute_type_errors > 0 {
            self.meters.attributes_invalid.add(batch.attribute_type_errors, &[]);
        }
        ingest_permit.send(batch);
        if let Some(permit) = pass_permit {
            if rejected > 0 {
                drop_invalid_spans(&mut req);
            }
            if raw_defs && self.strip_tool_definitions {
                strip_raw_definitions(&mut req);
            }
            permit.send(Outgoing::Passthrough(req));
        }
        let message = if rejected > 0 {
            self.meters.spans_rejected.add(rejected, &[tr]);
            format!("{rejected} span(s) rejected: trace_id must be 16 bytes and span_id 8 bytes, not all zero")
        } else {
            String::new()
        };
        Admitted::Accepted { rejected, message }
    }
}
