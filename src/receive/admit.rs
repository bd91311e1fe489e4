//! Admission, shared by both receivers: reserve room downstream, normalize, hand on — or refuse
//! the whole request with a retryable answer so the sender keeps its data.

use opentelemetry::KeyValue;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
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
