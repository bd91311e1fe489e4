//! A call's evidence chain: how many spans of each kind and instrumentation its verdict rests
//! on, and a short summary of the first few of them. Counted as the call absorbs spans
//! ([`super::call::CallEvidence::absorb`]) and carried in the verdict (re-exported by
//! `verdict`), so the evidence model needs nothing above it.
//!
//! A summary holds only what the vocabulary already fixes — the side, the instrumentation, the
//! method from the specification's list, the status, the HTTP status, the error class and code,
//! the transport outcome, the verifier's result and the duration — never a span's own name (it
//! may hold a URL or a path), arguments, results, session ids or headers.

use serde::Serialize;

use super::{CallError, Instrumentation, Method, OutcomeResult, SpanEvidence, TransportOutcome};

/// Spans summarized per call; the rest are only counted ([`EvidenceChain::more_spans`]). Six:
/// a call with client, server, HTTP and verifier spans has four, a multi-round call a few more.
pub const MAX_SPAN_SUMMARIES: usize = 6;

/// One span of a chain, as the status page shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpanSummary {
    pub kind: SpanKind,
    pub by: Instrumentation,
    /// The span's MCP method, from the specification's list (`other` for anything else); none
    /// for a span without one (HTTP, transport).
    pub method: Option<&'static str>,
    /// The span's status was ERROR.
    pub status_error: bool,
    pub http_status: Option<u16>,
    pub error: Option<CallError>,
    pub transport: Option<TransportOutcome>,
    /// The first verifier receipt's result, for a verifier span.
    pub outcome: Option<OutcomeResult>,
    /// The span only marked that the request was sent.
    pub request_sent_marker: bool,
    pub start_ns: u64,
    pub end_ns: u64,
}

impl SpanSummary {
    fn of(kind: SpanKind, s: &SpanEvidence) -> SpanSummary {
        SpanSummary {
            kind,
            by: s.instrumentation,
            method: s.method.as_ref().map(Method::static_name),
            status_error: s.status_error,
            http_status: s.http_status,
            error: s.error,
            transport: s.transport,
            outcome: s.outcomes.first().map(|o| o.result),
            request_sent_marker: s.request_sent_marker,
            start_ns: s.start_ns,
            end_ns: s.end_ns,
        }
    }

    /// How long the span took.
    pub fn duration_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }
}

/// What kind of evidence a span was, for an evidence chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SpanKind {
    Client,
    Server,
    /// A span that carried a verifier receipt.
    Verifier,
    /// HTTP, transport or other evidence without a side.
    Other,
}

impl SpanKind {
    pub const ALL: [SpanKind; 4] = [SpanKind::Client, SpanKind::Server, SpanKind::Verifier, SpanKind::Other];
    pub fn as_str(self) -> &'static str {
        match self {
            SpanKind::Client => "client",
            SpanKind::Server => "server",
            SpanKind::Verifier => "verifier",
            SpanKind::Other => "other",
        }
    }
}

/// How many spans of each kind and instrumentation a call's verdict rests on (saturating at
/// 255 each): fixed-size, so assembling a call allocates nothing for it.
/// With at most [`MAX_SPAN_SUMMARIES`] summaries, in the order the spans were absorbed.
#[derive(Clone, Copy, Debug, Default)]
pub struct EvidenceChain {
    counts: [[u8; Instrumentation::ALL.len()]; SpanKind::ALL.len()],
    summaries: [Option<SpanSummary>; MAX_SPAN_SUMMARIES],
    /// Spans past the summaries' bound (saturating).
    more: u8,
}

/// Two chains are equal when they count the same spans: the summaries are what the page shows of
/// them, kept in the order the spans arrived, which differs between two engines (or a replay and
/// a live run) that decided the same call from the same spans.
impl PartialEq for EvidenceChain {
    fn eq(&self, other: &Self) -> bool {
        self.counts == other.counts
    }
}

impl Eq for EvidenceChain {}

impl EvidenceChain {
    /// Count one span.
    pub fn add(&mut self, kind: SpanKind, by: Instrumentation) {
        let c = &mut self.counts[kind as usize][by as usize];
        *c = c.saturating_add(1);
    }
    /// Count one span and keep its summary while there is room.
    pub fn add_span(&mut self, kind: SpanKind, s: &SpanEvidence) {
        self.add(kind, s.instrumentation);
        self.keep(SpanSummary::of(kind, s));
    }
    fn keep(&mut self, summary: SpanSummary) {
        match self.summaries.iter_mut().find(|x| x.is_none()) {
            Some(slot) => *slot = Some(summary),
            None => self.more = self.more.saturating_add(1),
        }
    }
    /// Count every span of `other` too (a call whose rounds are joined).
    pub fn merge(&mut self, other: &EvidenceChain) {
        for (a, b) in self.counts.iter_mut().flatten().zip(other.counts.iter().flatten()) {
            *a = a.saturating_add(*b);
        }
        for s in other.spans() {
            self.keep(*s);
        }
        self.more = self.more.saturating_add(other.more);
    }
    /// The summarized spans, in the order they were absorbed.
    pub fn spans(&self) -> impl Iterator<Item = &SpanSummary> {
        self.summaries.iter().flatten()
    }
    /// Spans counted but not summarized (past [`MAX_SPAN_SUMMARIES`]).
    pub fn more_spans(&self) -> u8 {
        self.more
    }
    /// Each (kind, instrumentation) seen and its span count, in kind order.
    pub fn entries(&self) -> impl Iterator<Item = (SpanKind, Instrumentation, u8)> + '_ {
        SpanKind::ALL.into_iter().flat_map(move |k| {
            Instrumentation::ALL.into_iter().filter_map(move |i| Some((k, i, self.counts[k as usize][i as usize])).filter(|e| e.2 > 0))
        })
    }
    /// Whether any span of `kind` is in the chain.
    pub fn has(&self, kind: SpanKind) -> bool {
        self.counts[kind as usize].iter().any(|n| *n > 0)
    }
}
