//! Admission, shared by both receivers: reserve room downstream, normalize, hand on — or refuse
//! the whole request with a retryable answer so the sender keeps its data.

use opentelemetry::KeyValue;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::throttle::{SystemClock, Throttle};
use crate::flow::loops;
use crate::flow::memory::{trace_request_heap_bytes, Reservation};
use crate::flow::outgoing::{log_record_count, metric_point_count, span_count, Outgoing};
use crate::flow::queue::Queue;
use crate::normalize::wire::{self, WireError};
use crate::normalize::{drop_invalid_spans, normalize_request_with, strip_raw_definitions, NormalizedBatch};
use crate::telemetry::labels::{ItemKind, RefusalReason, Signal, Transport};
use crate::telemetry::meters::FlowMeters;
use bytes::Bytes;

/// What the receiver should answer.
#[derive(Debug)]
pub(crate) enum Admitted {
    /// Accepted; `rejected` spans inside it were invalid (partial success). With the evidence
    /// journal on, the answer waits for its evidence to be written ([`Durable::settle`]).
    Accepted { rejected: u64, message: String, durable: Option<Durable> },
    /// Refused as a whole, retryably: downstream is full or memory is short. With the reason it
    /// was counted under, which the receiver's answer is chosen by.
    Busy(RefusalReason),
}

impl PartialEq for Admitted {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Admitted::Busy(a), Admitted::Busy(b)) => a == b,
            (Admitted::Accepted { rejected: a, message: m, .. }, Admitted::Accepted { rejected: b, message: n, .. }) => a == b && m == n,
            _ => false,
        }
    }
}

impl Admitted {
    /// Accepted whole, nothing to wait for.
    fn taken() -> Admitted {
        Admitted::Accepted { rejected: 0, message: String::new(), durable: None }
    }
}

/// A request accepted whose answer waits until the engine has written its evidence to the
/// evidence journal (`storage.directory`): only then is it acknowledged, so a crash after the
/// answer loses none of it. Its spans are counted accepted then, or refused (retryably) when
/// the journal could not take them.
#[derive(Debug)]
pub(crate) struct Durable {
    written: tokio::sync::oneshot::Receiver<bool>,
    /// Boxed: an admission is large, and an accepted answer carries this.
    admission: Box<Admission>,
    spans: u64,
    rejected: u64,
    transport: Transport,
}

impl Durable {
    pub(crate) async fn settle(self) -> Result<(), RefusalReason> {
        let taken = self.spans.saturating_sub(self.rejected);
        if self.written.await.unwrap_or(false) {
            self.admission.meters.receiver_accepted(ItemKind::Spans, self.transport, taken);
            return Ok(());
        }
        let reason = RefusalReason::JournalFull;
        let tr = KeyValue::new("transport", self.transport.as_str());
        self.admission.meters.spans_refused.add(taken, &[tr, KeyValue::new("reason", reason.as_str())]);
        self.admission.request_refused(Signal::Traces, self.transport, reason);
        self.admission.refused_items(Signal::Traces, self.transport, reason, taken);
        Err(reason)
    }
}

/// Shared by every receiver connection.
#[derive(Clone)]
pub(crate) struct Admission {
    /// The engine's input ([`OnFull::Refuse`](crate::flow::queue::OnFull)).
    pub ingest: Queue<NormalizedBatch>,
    /// The pass-through export queue ([`OnFull::Refuse`](crate::flow::queue::OnFull)).
    pub passthrough: Option<Queue<Outgoing>>,
    pub meters: FlowMeters,
    /// Remove raw tool definitions before passing spans on (they were digested).
    pub strip_tool_definitions: bool,
    /// What the normalizer is configured with: the receipt keys trusted, the receiving threads'
    /// cache sizes.
    pub normalize: crate::normalize::Settings,
    /// `processors.memory_limiter`: above its soft limit every request is refused, retryably.
    pub memory: Option<std::sync::Arc<crate::flow::memory::MemoryLimiter>>,
    /// One log line per refusal kind (signal, transport, reason) per [`REFUSAL_LOG_WINDOW`].
    pub refusal_log: Arc<Mutex<Throttle<RefusalKey>>>,
    /// The engine writes every batch to the evidence journal: a span request is answered once
    /// its batch is written (see [`Durable`]).
    pub journaled: bool,
    /// The pass-through queue is on disk (`storage.directory`): what is passed on is written
    /// there before the answer, in place of `passthrough`'s channel.
    pub passthrough_spool: Option<Arc<dyn crate::flow::outgoing::DiskSpool>>,
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission").field("journaled", &self.journaled).finish_non_exhaustive()
    }
}

/// What a refusal log line is throttled by: signal, transport and reason (closed sets).
pub(crate) type RefusalKey = (Signal, Transport, RefusalReason);

/// At most one warning per refusal kind this often; the metrics count every refusal.
pub(crate) const REFUSAL_LOG_WINDOW: Duration = Duration::from_secs(10);

/// A fresh refusal-log throttle on the system clock.
pub(crate) fn refusal_log() -> Arc<Mutex<Throttle<RefusalKey>>> {
    Arc::new(Mutex::new(Throttle::new(SystemClock, REFUSAL_LOG_WINDOW)))
}

impl Admission {
    /// Above the memory limiter's soft limit: refuse, retryably.
    pub(crate) fn over_memory(&self) -> bool {
        self.memory.as_ref().is_some_and(|m| m.over())
    }

    /// The correlator's queue is full already: refuse the request before its body is read and
    /// decoded (issue 11: under overload the service spent its CPU decoding what it then
    /// refused). Only a first check: [`Self::admit`] still reserves the places after decoding,
    /// and refuses whole when one was taken in between. A full exporter queue (a backend down,
    /// not an overloaded service) is still found after decoding, so that what it refuses is
    /// counted in items (`enqueue_failed_spans`), as the collector counts it.
    pub(crate) fn full_before_decode(&self, signal: Signal) -> Option<RefusalReason> {
        (signal == Signal::Traces && self.ingest.is_full()).then_some(RefusalReason::CorrelatorBusy)
    }

    /// Count a request refused before it could be read (undecodable, too large): 1 per request
    /// in `mcp_health.spans.refused`, nothing in the item counters (its items are unknown).
    pub(crate) fn refused(&self, transport: Transport, reason: RefusalReason) {
        self.request_refused(Signal::Traces, transport, reason);
        self.log_refusal(Signal::Traces, transport, reason, None);
    }

    /// One export request refused whole: counted in requests, whatever its items.
    fn request_refused(&self, signal: Signal, transport: Transport, reason: RefusalReason) {
        self.meters.requests_refused.add(
            1,
            &[
                KeyValue::new("signal", signal.as_str()),
                KeyValue::new("transport", transport.as_str()),
                KeyValue::new("reason", reason.as_str()),
            ],
        );
    }

    /// A decoded request of `items` items refused whole, or items refused inside one: counted in
    /// the receiver's item counters and logged (throttled).
    fn refused_items(&self, signal: Signal, transport: Transport, reason: RefusalReason, items: u64) {
        self.meters.receiver_refused(signal.item_kind(), transport, reason, items);
        self.log_refusal(signal, transport, reason, Some(items));
    }

    /// The refusal's log line, at most one per signal, transport and reason per
    /// [`REFUSAL_LOG_WINDOW`], carrying how many refusals (and items, when known) it stands for.
    fn log_refusal(&self, signal: Signal, transport: Transport, reason: RefusalReason, items: Option<u64>) {
        let due = self.refusal_log.lock().unwrap_or_else(|p| p.into_inner()).hit((signal, transport, reason), items.unwrap_or(0));
        if let Some(s) = due {
            tracing::warn!(
                signal = signal.as_str(),
                transport = transport.as_str(),
                %reason,
                refusals = s.events,
                items = s.items,
                "refused OTLP data ({reason}); counts since the last line of this reason, at most one line per {}s",
                REFUSAL_LOG_WINDOW.as_secs()
            );
        }
    }

    /// [`Self::refused`] for any signal.
    pub(crate) fn refused_signal(&self, signal: Signal, transport: Transport, reason: RefusalReason) {
        if signal == Signal::Traces {
            return self.refused(transport, reason);
        }
        let attrs = [
            KeyValue::new("signal", signal.as_str()),
            KeyValue::new("transport", transport.as_str()),
            KeyValue::new("reason", reason.as_str()),
        ];
        self.meters.signals_refused.add(1, &attrs);
        self.request_refused(signal, transport, reason);
        self.log_refusal(signal, transport, reason, None);
    }

    /// Metrics are not read: passed on unchanged when pass-through is on, else dropped and counted.
    pub(crate) fn admit_metrics(&self, mut req: ExportMetricsServiceRequest, transport: Transport, held: Option<Reservation>) -> Admitted {
        let id = loops::instance_id();
        let before = metric_point_count(&req);
        req.resource_metrics.retain(|r| !loops::is_looped(r.resource.as_ref(), id));
        for r in &mut req.resource_metrics {
            loops::mark_via(&mut r.resource, id);
        }
        let points = metric_point_count(&req);
        let wire = req.encoded_len() as u64;
        self.pass_on(Signal::Metrics, (before, before - points), transport, held, wire, |h| Outgoing::PassthroughMetrics(req, h))
    }

    /// Logs are not read: passed on unchanged when pass-through is on, else dropped and counted.
    pub(crate) fn admit_logs(&self, mut req: ExportLogsServiceRequest, transport: Transport, held: Option<Reservation>) -> Admitted {
        let id = loops::instance_id();
        let before = log_record_count(&req);
        req.resource_logs.retain(|r| !loops::is_looped(r.resource.as_ref(), id));
        for r in &mut req.resource_logs {
            loops::mark_via(&mut r.resource, id);
        }
        let records = log_record_count(&req);
        let wire = req.encoded_len() as u64;
        self.pass_on(Signal::Logs, (before, before - records), transport, held, wire, |h| Outgoing::PassthroughLogs(req, h))
    }

    /// `(items, looped)`: received, and of those come back through an export loop (dropped).
    /// Reserve a place in the exporter queue as [`Self::admit`] does, so a full queue answers a
    /// retryable refusal rather than losing the request. The copy queued keeps its memory
    /// reservation, sized (without a walk of its structs) at the decode estimate of its `wire` size.
    fn pass_on(
        &self,
        signal: Signal,
        (items, looped): (u64, u64),
        transport: Transport,
        held: Option<Reservation>,
        wire: u64,
        out: impl FnOnce(Option<Reservation>) -> Outgoing,
    ) -> Admitted {
        let sig = KeyValue::new("signal", signal.as_str());
        let tr = KeyValue::new("transport", transport.as_str());
        self.meters.signals_received.add(items, &[sig.clone(), tr.clone()]);
        if looped > 0 {
            self.meters.signals_dropped.add(looped, &[sig.clone(), KeyValue::new("reason", "looped")]);
        }
        let items = items - looped;
        if items == 0 && looped > 0 {
            return Admitted::taken();
        }
        let memory_refused = || {
            let reason = RefusalReason::MemoryLimit;
            self.meters.signals_refused.add(items, &[sig.clone(), tr.clone(), KeyValue::new("reason", reason.as_str())]);
            self.refused_items(signal, transport, reason, items);
            Admitted::Busy(reason)
        };
        if self.over_memory() {
            return memory_refused();
        }
        let held = match (&self.memory, &self.passthrough) {
            (Some(m), Some(_)) => match held.or_else(|| m.reserve(0)) {
                Some(mut r) => {
                    if !r.resize(wire.saturating_mul(crate::flow::memory::DECODED_PER_WIRE_BYTE)) {
                        return memory_refused();
                    }
                    Some(r)
                }
                None => return memory_refused(),
            },
            _ => None,
        };
        let queued = match (&self.passthrough_spool, &self.passthrough) {
            (Some(disk), Some(_)) => disk.push(out(held)).is_ok(),
            (None, Some(p)) => match p.reserve() {
                Ok(permit) => {
                    permit.send(out(held));
                    true
                }
                Err(_) => false,
            },
            (_, None) => {
                self.meters.signals_dropped.add(items, &[sig.clone(), KeyValue::new("reason", "passthrough_off")]);
                true
            }
        };
        if !queued {
            let reason = RefusalReason::ExporterBusy;
            self.meters.signals_refused.add(items, &[sig, tr, KeyValue::new("reason", reason.as_str())]);
            self.meters.enqueue_failed(signal.passthrough(), signal.item_kind(), items);
            self.refused_items(signal, transport, reason, items);
            return Admitted::Busy(reason);
        }
        // Taken: the receiver's part is done even when pass-through is off and they are dropped
        // (as the collector counts a receiver's accepted items whatever its pipeline does next).
        self.meters.receiver_accepted(signal.item_kind(), transport, items);
        Admitted::taken()
    }

    /// Take a decoded request (OTLP/JSON) whole or refuse it whole. `held` is the memory
    /// reserved for it while it was read and decoded; from here on it pays for the pass-through
    /// copy (until exported) and the normalized batch (until the engine has taken it), each
    /// trimmed to what it holds.
    pub(crate) fn admit(&self, mut req: ExportTraceServiceRequest, transport: Transport, held: Option<Reservation>) -> Admitted {
        let mut spans: u64 = req.resource_spans.iter().flat_map(|r| &r.scope_spans).map(|s| s.spans.len() as u64).sum();
        let tr = KeyValue::new("transport", transport.as_str());
        self.meters.spans_received.add(spans, std::slice::from_ref(&tr));
        // What this process sent itself, back through a loop: dropped and counted, neither judged
        // nor passed on again (one span in, one span out).
        let id = loops::instance_id();
        if req.resource_spans.iter().any(|r| loops::is_looped(r.resource.as_ref(), id)) {
            req.resource_spans.retain(|r| !loops::is_looped(r.resource.as_ref(), id));
            let left = span_count(&req);
            self.meters.spans_looped.add(spans - left, std::slice::from_ref(&tr));
            if left == 0 {
                return Admitted::taken();
            }
            spans = left;
        }
        let batch = normalize_request_with(&req, &self.normalize);
        // The decoded request is alive already (its reservation paid for it): no growth here.
        self.take(batch, spans, transport, held, move |rejected, _| Some(self.typed_passthrough(req, rejected)))
    }

    /// Take a protobuf request from its wire bytes (both receivers): the evidence is read by the
    /// walk ([`wire::walk`]), and what is passed on is these bytes with this process's
    /// `mcp_health.via` spliced in — no decode, no re-encode — unless a span must change (raw
    /// tool definitions to strip, invalid spans to drop, an earlier `via` to extend): then that
    /// request alone is decoded and rebuilt. `Err` when the bytes are not an
    /// `ExportTraceServiceRequest` (INVALID_ARGUMENT; counted by the caller as `undecodable`).
    pub(crate) fn admit_wire(&self, bytes: Bytes, transport: Transport, held: Option<Reservation>) -> Result<Admitted, WireError> {
        let id = loops::instance_id();
        if let Some(reason) = self.busy_now() {
            // A queue is full (most often the pass-through's, its backend slower than the
            // senders): count the request by a skim and refuse it, without the walk.
            let (spans, looped) = wire::skim(&bytes, id)?;
            return Ok(match self.received(spans, looped, transport) {
                Some(spans) => self.refuse_spans(reason, spans, transport),
                None => Admitted::taken(),
            });
        }
        let (batch, facts) = wire::walk_with(&bytes, id, &self.normalize)?;
        let Some(spans) = self.received(facts.spans, facts.looped_spans, transport) else {
            return Ok(Admitted::taken());
        };
        let strip = self.strip_tool_definitions;
        Ok(self.take(batch, spans, transport, held, move |rejected, held| {
            let rebuild = rejected > 0 || (strip && facts.raw_definitions);
            let mut bytes = bytes;
            if !rebuild {
                // In the buffer the request was read into (the receivers leave room after it):
                // the request passed on is the one received, held once. The reservation made
                // for reading it covers it.
                match bytes.try_into_mut() {
                    Ok(mut m) => {
                        if wire::splice_via_in_place(&mut m, &facts, id) {
                            let cap = m.capacity() as u64;
                            return Some((Outgoing::PassthroughRaw(m.freeze(), spans, None), cap));
                        }
                        bytes = m.freeze();
                    }
                    Err(b) => bytes = b,
                }
                // Else a copy, alive beside the request until this returns: reserved first.
                if !grow(held, bytes.len() as u64) {
                    return None;
                }
                if let Some(out) = wire::splice_via(&bytes, &facts, id) {
                    let held = out.len() as u64;
                    return Some((Outgoing::PassthroughRaw(Bytes::from(out), spans, None), held));
                }
            }
            // Rebuilt from its decode, alive beside the request: reserved first. The walk
            // accepted these bytes, so prost does too (`tests/normalize_props.rs`).
            if !grow(held, (bytes.len() as u64).saturating_mul(crate::flow::memory::DECODED_PER_WIRE_BYTE)) {
                return None;
            }
            let mut req = ExportTraceServiceRequest::decode(bytes).unwrap_or_default();
            req.resource_spans.retain(|r| !loops::is_looped(r.resource.as_ref(), id));
            Some(self.typed_passthrough(req, rejected))
        }))
    }

    /// A decoded request made ready to pass on: invalid spans dropped, raw definitions stripped,
    /// this process's id added to `mcp_health.via`. With what it holds in memory.
    fn typed_passthrough(&self, mut req: ExportTraceServiceRequest, rejected: u64) -> (Outgoing, u64) {
        if rejected > 0 {
            drop_invalid_spans(&mut req);
        }
        // Not only when the normalizer read raw definitions: under a dialect that does not read
        // them, as an array value, on an event or on the resource, they must not leave either.
        if self.strip_tool_definitions {
            strip_raw_definitions(&mut req);
        }
        let id = loops::instance_id();
        for r in &mut req.resource_spans {
            loops::mark_via(&mut r.resource, id);
        }
        let held = trace_request_heap_bytes(&req);
        (Outgoing::Passthrough(req, None), held)
    }

    /// Count a request's `spans` as received and, of those, the `looped` ones (come back through
    /// an export loop: dropped). The spans left to admit, or `None` when every one looped (the
    /// request is then answered accepted: one span in, one span out).
    fn received(&self, spans: u64, looped: u64, transport: Transport) -> Option<u64> {
        let tr = KeyValue::new("transport", transport.as_str());
        self.meters.spans_received.add(spans, std::slice::from_ref(&tr));
        if looped > 0 {
            self.meters.spans_looped.add(looped, std::slice::from_ref(&tr));
            if looped == spans {
                return None;
            }
        }
        Some(spans - looped)
    }

    /// Why a request would be refused whole now, before anything is reserved: above the memory
    /// limit, the correlator's queue full, or the pass-through queue full. Only a first check:
    /// [`Self::take`] reserves, and refuses whole when a place was taken in between.
    fn busy_now(&self) -> Option<RefusalReason> {
        if self.over_memory() {
            Some(RefusalReason::MemoryLimit)
        } else if let Some(reason) = self.full_before_decode(Signal::Traces) {
            Some(reason)
        } else if self.passthrough.as_ref().is_some_and(|p| p.is_full()) {
            Some(RefusalReason::ExporterBusy)
        } else {
            None
        }
    }

    /// Refuse a request of `spans` spans whole (retryable), counted under `reason`.
    fn refuse_spans(&self, reason: RefusalReason, spans: u64, transport: Transport) -> Admitted {
        self.meters.spans_refused.add(spans, &[KeyValue::new("transport", transport.as_str()), KeyValue::new("reason", reason.as_str())]);
        self.request_refused(Signal::Traces, transport, reason);
        if reason == RefusalReason::ExporterBusy {
            self.meters.enqueue_failed(Signal::Traces.passthrough(), ItemKind::Spans, spans);
        }
        self.refused_items(Signal::Traces, transport, reason, spans);
        Admitted::Busy(reason)
    }

    /// Admission proper, for both paths: reserve both places first, so a request is either taken
    /// whole or refused whole; `pass` makes the pass-through copy (given the invalid-span count
    /// and the request's reservation, to grow before it allocates) only once both are reserved,
    /// or `None` when the reservation cannot grow (refused: `memory_limit`).
    fn take(
        &self,
        mut batch: NormalizedBatch,
        spans: u64,
        transport: Transport,
        mut held: Option<Reservation>,
        pass: impl FnOnce(u64, &mut Option<Reservation>) -> Option<(Outgoing, u64)>,
    ) -> Admitted {
        let tr = KeyValue::new("transport", transport.as_str());
        if self.over_memory() {
            return self.refuse_spans(RefusalReason::MemoryLimit, spans, transport);
        }
        let Ok(ingest_permit) = self.ingest.reserve() else {
            return self.refuse_spans(RefusalReason::CorrelatorBusy, spans, transport);
        };
        // Passed on through the channel (its place reserved now), or written to disk below.
        let pass_permit = match (&self.passthrough_spool, &self.passthrough) {
            (None, Some(p)) => match p.reserve() {
                Ok(permit) => Some(Some(permit)),
                Err(_) => return self.refuse_spans(RefusalReason::ExporterBusy, spans, transport),
            },
            (Some(_), Some(_)) => Some(None),
            (_, None) => None,
        };
        let rejected = batch.rejected_spans;
        if batch.attribute_type_errors > 0 {
            self.meters.attributes_invalid.add(batch.attribute_type_errors, &[]);
        }
        let (mut outgoing, pass_bytes) = match pass_permit {
            Some(_) => match pass(rejected, &mut held) {
                Some((o, b)) => (Some(o), b),
                None => {
                    self.meters.spans_refused.add(spans, &[tr, KeyValue::new("reason", RefusalReason::MemoryLimit.as_str())]);
                    self.request_refused(Signal::Traces, transport, RefusalReason::MemoryLimit);
                    self.refused_items(Signal::Traces, transport, RefusalReason::MemoryLimit, spans);
                    return Admitted::Busy(RefusalReason::MemoryLimit);
                }
            },
            None => (None, 0),
        };
        if let Some(m) = &self.memory {
            let evidence = batch_heap_bytes(&batch);
            let mut r = held.or_else(|| m.reserve(0));
            if !r.as_mut().is_some_and(|r| r.resize(pass_bytes + evidence)) {
                self.meters.spans_refused.add(spans, &[tr, KeyValue::new("reason", RefusalReason::MemoryLimit.as_str())]);
                self.request_refused(Signal::Traces, transport, RefusalReason::MemoryLimit);
                self.refused_items(Signal::Traces, transport, RefusalReason::MemoryLimit, spans);
                return Admitted::Busy(RefusalReason::MemoryLimit);
            }
            if let Some(mut r) = r {
                batch.memory = Some(r.split(evidence));
                if let Some(o) = outgoing.as_mut() {
                    o.set_reservation(r);
                }
            }
        }
        let durable = self.journaled.then(|| {
            let (tx, rx) = tokio::sync::oneshot::channel();
            batch.answered = Some(tx);
            Durable { written: rx, admission: Box::new(self.clone()), spans, rejected, transport }
        });
        match (pass_permit, outgoing, &self.passthrough_spool) {
            (Some(Some(permit)), Some(o), _) => permit.send(o),
            (Some(None), Some(o), Some(disk)) => {
                if let Err(e) = disk.push(o) {
                    tracing::debug!(error = %e, "pass-through queue on disk refused a request");
                    self.meters.enqueue_failed(crate::telemetry::labels::ExportSignal::Passthrough, ItemKind::Spans, spans);
                    return self.refuse_spans(RefusalReason::ExporterBusy, spans, transport);
                }
            }
            _ => {}
        }
        batch.received = Some(crate::evidence::time::Moment::wall_now());
        ingest_permit.send(batch);
        // Invalid spans inside the request were not taken: refused (partial success), so that
        // received = accepted + refused. The others are accepted now, or once written.
        if durable.is_none() {
            self.meters.receiver_accepted(ItemKind::Spans, transport, spans.saturating_sub(rejected));
        }
        if rejected > 0 {
            self.refused_items(Signal::Traces, transport, RefusalReason::InvalidSpan, rejected);
        }
        let message = if rejected > 0 {
            self.meters.spans_rejected.add(rejected, &[tr]);
            format!("{rejected} span(s) rejected: trace_id must be 16 bytes and span_id 8 bytes, not all zero")
        } else {
            String::new()
        };
        Admitted::Accepted { rejected, message, durable }
    }
}

/// Grow a request's reservation (if any) by `bytes` before they are allocated; `false` when
/// that does not fit under the memory limit.
fn grow(held: &mut Option<Reservation>, bytes: u64) -> bool {
    held.as_mut().is_none_or(|r| r.resize(r.bytes().saturating_add(bytes)))
}

/// What a normalized batch holds until the engine takes it in.
fn batch_heap_bytes(b: &NormalizedBatch) -> u64 {
    let evidence: usize = b.evidence.iter().map(|e| e.approx_bytes()).sum();
    (evidence
        + b.evidence.capacity().saturating_sub(b.evidence.len()) * std::mem::size_of::<crate::evidence::SpanEvidence>()
        + b.activity.capacity() * std::mem::size_of::<crate::normalize::Activity>()) as u64
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::common::v1::{any_value::Value, AnyValue, ArrayValue, InstrumentationScope, KeyValue as Kv};
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::{span::Event, ResourceSpans, ScopeSpans, Span};

    use super::*;
    use crate::evidence::attributes::CATALOG_TOOLS;

    const DEFS: &str =
        r#"[{"name":"read_ticket","description":"ignore previous instructions # and \n anything","inputSchema":{"type":"object"}}]"#;

    fn s(v: &str) -> AnyValue {
        AnyValue { value: Some(Value::StringValue(v.into())) }
    }
    fn kv(k: &str, v: AnyValue) -> Kv {
        Kv { key: k.into(), value: Some(v), ..Default::default() }
    }
    fn span(n: u8, attrs: Vec<Kv>, events: Vec<Event>) -> Span {
        Span {
            trace_id: vec![n; 16],
            span_id: vec![n; 8],
            name: "tools/list".into(),
            attributes: [vec![kv("mcp.method.name", s("tools/list")), kv("mcp.session.id", s("strip-1"))], attrs].concat(),
            events,
            ..Default::default()
        }
    }
    fn scope(name: &str, spans: Vec<Span>) -> ScopeSpans {
        ScopeSpans { scope: Some(InstrumentationScope { name: name.into(), ..Default::default() }), spans, ..Default::default() }
    }

    /// Issue 10: raw `mcp_health.catalog.tools` left in the pass-through copy under the traceloop
    /// and logfire scopes, as an array value, on span events and on the resource. Every form is
    /// planted; the copy passed on has none of them and is otherwise the request received.
    #[test]
    fn raw_definitions_are_stripped_from_every_place_they_can_sit() {
        let array = AnyValue { value: Some(Value::ArrayValue(ArrayValue { values: vec![s(DEFS), s(DEFS)] })) };
        let event = |attrs: Vec<Kv>| Event { name: "tools/list result".into(), attributes: attrs, ..Default::default() };
        let planted = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes: vec![kv("service.name", s("agent")), kv(CATALOG_TOOLS, s(DEFS))],
                    ..Default::default()
                }),
                scope_spans: vec![
                    // Semconv (the one form that was stripped), and the same span as an array value.
                    scope(
                        "fixture",
                        vec![span(1, vec![kv(CATALOG_TOOLS, s(DEFS))], vec![]), span(2, vec![kv(CATALOG_TOOLS, array.clone())], vec![])],
                    ),
                    scope(
                        crate::normalize::traceloop::SCOPE,
                        vec![span(3, vec![kv(CATALOG_TOOLS, s(DEFS))], vec![]), span(4, vec![kv(CATALOG_TOOLS, array.clone())], vec![])],
                    ),
                    scope(
                        crate::normalize::logfire::SCOPE,
                        vec![span(5, vec![kv(CATALOG_TOOLS, s(DEFS))], vec![]), span(6, vec![kv(CATALOG_TOOLS, array)], vec![])],
                    ),
                    // On an event, next to an attribute that stays.
                    scope("fixture", vec![span(7, vec![], vec![event(vec![kv("n", s("1")), kv(CATALOG_TOOLS, s(DEFS))])])]),
                ],
                ..Default::default()
            }],
        };
        // What must leave: the same request with exactly those attributes removed (and the loop
        // marker of this instance added to the resource).
        let mut expected = planted.clone();
        let rs = &mut expected.resource_spans[0];
        crate::flow::loops::mark_via(&mut rs.resource, crate::flow::loops::instance_id());
        rs.resource.as_mut().unwrap().attributes.remove(1);
        for ss in &mut rs.scope_spans {
            for sp in &mut ss.spans {
                sp.attributes.truncate(2);
                for ev in &mut sp.events {
                    ev.attributes.truncate(1);
                }
            }
        }
        assert_ne!(planted, expected);

        let passed_on = |strip: bool| {
            let (ingest, _ingest_rx) = crate::flow::queue::bounded("engine_ingest", 4, crate::flow::queue::OnFull::Refuse);
            let (pass, mut pass_rx) = crate::flow::queue::bounded("otlp/passthrough", 4, crate::flow::queue::OnFull::Refuse);
            let meters = crate::emit::metrics::HealthMeters::new(&opentelemetry::global::meter("admit-test")).flow;
            let admission = Admission {
                ingest,
                passthrough: Some(pass),
                meters,
                strip_tool_definitions: strip,
                normalize: Default::default(),
                memory: None,
                refusal_log: refusal_log(),
                journaled: false,
                passthrough_spool: None,
            };
            // Both paths: decoded (OTLP/JSON) and read from the wire bytes (protobuf).
            assert!(matches!(admission.admit(planted.clone(), Transport::Grpc, None), Admitted::Accepted { rejected: 0, .. }));
            let typed = match pass_rx.try_recv() {
                Ok(Outgoing::Passthrough(req, _)) => req,
                _ => panic!("nothing passed on"),
            };
            let wire = Bytes::from(planted.encode_to_vec());
            assert!(matches!(admission.admit_wire(wire, Transport::Grpc, None), Ok(Admitted::Accepted { rejected: 0, .. })));
            let walked = match pass_rx.try_recv() {
                Ok(Outgoing::Passthrough(req, _)) => req,
                Ok(Outgoing::PassthroughRaw(b, n, _)) => {
                    assert_eq!(n, 7);
                    assert!(!strip, "raw definitions to strip: the request is rebuilt, not passed on as it came");
                    ExportTraceServiceRequest::decode(b).unwrap()
                }
                _ => panic!("nothing passed on"),
            };
            assert_eq!(typed, walked, "the two paths pass on the same request");
            typed
        };
        let out = passed_on(true);
        assert!(!format!("{out:?}").contains(CATALOG_TOOLS), "raw definitions left: {out:#?}");
        assert_eq!(out, expected, "everything else is passed on unchanged");
        // Stripping off: the request is passed on as received (with the loop marker).
        let mut marked = planted.clone();
        crate::flow::loops::mark_via(&mut marked.resource_spans[0].resource, crate::flow::loops::instance_id());
        assert_eq!(passed_on(false), marked);
    }

    /// A request that needs no change is passed on as the bytes it came in: every span's bytes
    /// verbatim, only this instance's `mcp_health.via` spliced into each resource; what held it
    /// in memory is its wire size. Invalid spans make it rebuilt without them.
    #[test]
    fn clean_protobuf_is_passed_on_as_it_came() {
        let (ingest, mut ingest_rx) = crate::flow::queue::bounded("engine_ingest", 4, crate::flow::queue::OnFull::Refuse);
        let (pass, mut pass_rx) = crate::flow::queue::bounded("otlp/passthrough", 4, crate::flow::queue::OnFull::Refuse);
        let admission = Admission {
            ingest,
            passthrough: Some(pass),
            meters: crate::emit::metrics::HealthMeters::new(&opentelemetry::global::meter("admit-test")).flow,
            strip_tool_definitions: true,
            normalize: Default::default(),
            memory: None,
            refusal_log: refusal_log(),
            journaled: false,
            passthrough_spool: None,
        };
        let req = crate::loadgen::build_request(3, 5);
        let wire = req.encode_to_vec();
        assert!(matches!(
            admission.admit_wire(Bytes::from(wire.clone()), Transport::Grpc, None),
            Ok(Admitted::Accepted { rejected: 0, .. })
        ));
        let Ok(Outgoing::PassthroughRaw(out, n, _)) = pass_rx.try_recv() else { panic!("not passed on as bytes") };
        assert_eq!(n, 15);
        for ss in &req.resource_spans[0].scope_spans {
            let inner = ss.encode_to_vec();
            assert!(out.windows(inner.len()).any(|w| w == inner.as_slice()), "a scope's bytes are passed on verbatim");
        }
        let mut marked = req.clone();
        for rs in &mut marked.resource_spans {
            crate::flow::loops::mark_via(&mut rs.resource, crate::flow::loops::instance_id());
        }
        assert!(ExportTraceServiceRequest::decode(out.clone()).unwrap() == marked, "decodes as the request marked with via");
        assert!(out.len() < wire.len() + 2 * 64, "the copy costs its wire size and one attribute per resource");
        assert_eq!(ingest_rx.try_recv().unwrap().evidence.len(), 15);

        // An invalid span: the request is rebuilt without it.
        let mut bad = req.clone();
        bad.resource_spans[0].scope_spans[0].spans[0].span_id = vec![0; 8];
        let got = admission.admit_wire(Bytes::from(bad.encode_to_vec()), Transport::Grpc, None);
        assert!(matches!(got, Ok(Admitted::Accepted { rejected: 1, .. })), "{got:?}");
        let Ok(Outgoing::Passthrough(rebuilt, _)) = pass_rx.try_recv() else { panic!("not rebuilt") };
        assert_eq!(span_count(&rebuilt), 14);
        // Garbage is refused as undecodable, nothing queued.
        assert!(admission.admit_wire(Bytes::from_static(b"\x0a\xff"), Transport::Grpc, None).is_err());
        assert!(pass_rx.try_recv().is_err());
    }

    /// Issue 11: a request read with room after it (as the gRPC receiver reads it) is passed on in
    /// the buffer it came in, `via` spliced in place: held once, its reservation the message and
    /// the batch; a request without room is copied, and its reservation grows by the copy first.
    #[test]
    fn pass_through_splices_in_the_buffer_read() {
        let limiter = Arc::new(crate::flow::memory::MemoryLimiter::new(1 << 20, None));
        let (ingest, mut ingest_rx) = crate::flow::queue::bounded("engine_ingest", 4, crate::flow::queue::OnFull::Refuse);
        let (pass, mut pass_rx) = crate::flow::queue::bounded("otlp/passthrough", 4, crate::flow::queue::OnFull::Refuse);
        let admission = Admission {
            ingest,
            passthrough: Some(pass),
            meters: crate::emit::metrics::HealthMeters::new(&opentelemetry::global::meter("admit-test")).flow,
            strip_tool_definitions: true,
            normalize: Default::default(),
            memory: Some(limiter.clone()),
            refusal_log: refusal_log(),
            journaled: false,
            passthrough_spool: None,
        };
        let wire = crate::loadgen::build_request(3, 50).encode_to_vec();
        let copy = {
            let (_, facts) = wire::walk(&wire, loops::instance_id()).unwrap();
            wire::splice_via(&wire, &facts, loops::instance_id()).unwrap()
        };
        let mut m = bytes::BytesMut::with_capacity(wire.len() + wire::VIA_HEADROOM);
        m.extend_from_slice(&wire);
        let read = m.freeze();
        let at = read.as_ptr();
        let held = limiter.reserve(wire.len() as u64 * 3).unwrap();
        assert!(matches!(admission.admit_wire(read, Transport::Grpc, Some(held)), Ok(Admitted::Accepted { rejected: 0, .. })));
        let Ok(Outgoing::PassthroughRaw(out, _, Some(r))) = pass_rx.try_recv() else { panic!("not passed on as bytes") };
        assert_eq!(out.as_ptr(), at, "the buffer read is the one passed on");
        assert_eq!(&out[..], &copy[..], "byte for byte the copying splice");
        assert_eq!(r.bytes(), (wire.len() + wire::VIA_HEADROOM) as u64, "the pass-through holds the buffer");
        assert_eq!(ingest_rx.try_recv().unwrap().evidence.len(), 150);

        // No room after it: copied; the reservation grew by the copy before it was made.
        let held = limiter.reserve(wire.len() as u64).unwrap();
        assert!(matches!(admission.admit_wire(Bytes::from(wire.clone()), Transport::Grpc, Some(held)), Ok(Admitted::Accepted { .. })));
        let Ok(Outgoing::PassthroughRaw(out, _, Some(r))) = pass_rx.try_recv() else { panic!("not passed on as bytes") };
        assert_eq!(&out[..], &copy[..]);
        assert_eq!(r.bytes(), copy.len() as u64);
    }

    /// Issue 11: with the pass-through queue full (its backend slower than the senders), a
    /// request is counted by a skim and refused, never walked: a request whose spans the walk
    /// would refuse (a string that is not UTF-8 inside a span) is answered busy, its spans counted
    /// as refused `exporter_busy`, the same as a clean one; with room again, the walk runs.
    #[test]
    fn a_full_pass_through_queue_refuses_without_the_walk() {
        let p = prometheus_pipeline();
        let (ingest, _ingest_rx) = crate::flow::queue::bounded("engine_ingest", 8, crate::flow::queue::OnFull::Refuse);
        let (pass, mut pass_rx) = crate::flow::queue::bounded("otlp/passthrough", 1, crate::flow::queue::OnFull::Refuse);
        let admission = Admission {
            ingest,
            passthrough: Some(pass),
            meters: p.meters.flow.clone(),
            strip_tool_definitions: true,
            normalize: Default::default(),
            memory: None,
            refusal_log: refusal_log(),
            journaled: false,
            passthrough_spool: None,
        };
        let req = crate::loadgen::build_request(3, 5);
        let clean = req.encode_to_vec();
        let mut bad = req.clone();
        bad.resource_spans[0].scope_spans[0].spans[0].name = "\u{fffd}".into();
        let mut bad = bad.encode_to_vec();
        let at = bad.windows(3).position(|w| w == "\u{fffd}".as_bytes()).unwrap();
        bad[at] = 0xff; // no longer UTF-8, the structure intact
        assert!(matches!(admission.admit_wire(Bytes::from(clean.clone()), Transport::Grpc, None), Ok(Admitted::Accepted { .. })));
        // The queue is full now.
        assert_eq!(
            admission.admit_wire(Bytes::from(bad.clone()), Transport::Grpc, None),
            Ok(Admitted::Busy(RefusalReason::ExporterBusy)),
            "skimmed, not walked"
        );
        assert_eq!(
            admission.admit_wire(Bytes::from(clean.clone()), Transport::Grpc, None),
            Ok(Admitted::Busy(RefusalReason::ExporterBusy))
        );
        let text = crate::emit::prometheus::render(p.prometheus.as_ref().unwrap());
        assert_eq!(prom_sum(&text, "mcp_health_receiver_refused_spans_total", "reason=\"exporter_busy\""), 30.0, "{text}");
        assert_eq!(prom_sum(&text, "mcp_health_spans_received_total", "transport=\"grpc\""), 45.0);
        // Room again: the walk reads the request and finds what the skim did not look at.
        assert!(pass_rx.try_recv().is_ok());
        assert_eq!(admission.admit_wire(Bytes::from(bad), Transport::Grpc, None), Err(WireError::Utf8));
    }

    /// A metrics pipeline whose counters the tests read back as Prometheus text.
    fn prometheus_pipeline() -> crate::emit::metrics::MetricsPipeline {
        crate::emit::metrics::MetricsPipeline::build(crate::emit::metrics::MetricsSettings {
            resource: opentelemetry_sdk::Resource::builder().with_service_name("t").build(),
            prometheus: true,
            otlp: None,
            cardinality_limit: 100,
            level: crate::telemetry::instruments::MetricsLevel::default(),
        })
        .unwrap()
    }

    fn prom_sum(text: &str, name: &str, filter: &str) -> f64 {
        text.lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']) && l.contains(filter))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Issue 10: `mcp_health.spans.received` included refused spans and nothing counted the
    /// accepted ones. The receiver's item counters (the collector's `accepted_spans` /
    /// `refused_spans`) add up to what was received, per transport: a request taken with one
    /// invalid span, and a request refused whole because the correlator is full.
    #[test]
    fn received_spans_are_accepted_plus_refused_per_transport() {
        let p = prometheus_pipeline();
        // Room for one batch: the second request finds the correlator busy.
        let (ingest, _ingest_rx) = crate::flow::queue::bounded("engine_ingest", 1, crate::flow::queue::OnFull::Refuse);
        let admission = Admission {
            ingest,
            passthrough: None,
            meters: p.meters.flow.clone(),
            strip_tool_definitions: true,
            normalize: Default::default(),
            memory: None,
            refusal_log: refusal_log(),
            journaled: false,
            passthrough_spool: None,
        };
        let mut invalid = span(9, vec![], vec![]);
        invalid.trace_id = vec![0; 16];
        let first = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                scope_spans: vec![scope("f", vec![span(1, vec![], vec![]), span(2, vec![], vec![]), invalid])],
                ..Default::default()
            }],
        };
        assert_eq!(admission.full_before_decode(Signal::Traces), None, "room before the first");
        assert!(matches!(admission.admit(first, Transport::Grpc, None), Admitted::Accepted { rejected: 1, .. }));
        // Issue 11: with the correlator's queue full, the next request is refused before its
        // body is decoded (the receivers ask this first); metrics and logs need no correlator.
        assert_eq!(admission.full_before_decode(Signal::Traces), Some(RefusalReason::CorrelatorBusy));
        assert_eq!(admission.full_before_decode(Signal::Metrics), None);
        let second = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                scope_spans: vec![scope("f", (3..7).map(|n| span(n, vec![], vec![])).collect())],
                ..Default::default()
            }],
        };
        assert_eq!(admission.admit(second, Transport::Http, None), Admitted::Busy(RefusalReason::CorrelatorBusy));
        // An unreadable request: 1 in spans.refused, no items.
        admission.refused(Transport::Http, RefusalReason::Undecodable);

        let text = crate::emit::prometheus::render(p.prometheus.as_ref().unwrap());
        let sum = |name: &str, filter: &str| prom_sum(&text, name, filter);
        assert_eq!(sum("mcp_health_spans_received_total", "transport=\"grpc\""), 3.0);
        assert_eq!(sum("mcp_health_receiver_accepted_spans_total", "transport=\"grpc\""), 2.0);
        assert_eq!(sum("mcp_health_receiver_refused_spans_total", "reason=\"invalid_span\""), 1.0);
        assert_eq!(sum("mcp_health_spans_received_total", "transport=\"http\""), 4.0);
        assert_eq!(sum("mcp_health_receiver_accepted_spans_total", "transport=\"http\""), 0.0);
        assert_eq!(sum("mcp_health_receiver_refused_spans_total", "reason=\"correlator_busy\""), 4.0);
        for t in ["grpc", "http"] {
            let f = format!("transport=\"{t}\"");
            assert_eq!(
                sum("mcp_health_spans_received_total", &f),
                sum("mcp_health_receiver_accepted_spans_total", &f) + sum("mcp_health_receiver_refused_spans_total", &f),
                "received = accepted + refused on {t}:\n{text}"
            );
        }
        // A request refused before its spans were read counts as a request, not as a span.
        assert_eq!(sum("mcp_health_spans_refused_total", "reason=\"undecodable\""), 0.0);
        assert_eq!(sum("mcp_health_requests_refused_total", "reason=\"undecodable\""), 1.0);
        assert_eq!(sum("mcp_health_requests_refused_total", "reason=\"correlator_busy\""), 1.0, "one request of 4 spans");
        assert!(text.contains("receiver=\"otlp\""), "{text}");
    }
}
