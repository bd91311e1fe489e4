//! A call's evidence chain: how many spans of each kind and instrumentation its verdict rests
//! on. Counted as the call absorbs spans ([`super::call::CallEvidence::absorb`]) and carried in
//! the verdict (re-exported by `verdict`), so the evidence model needs nothing above it.

use serde::Serialize;

use super::Instrumentation;

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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EvidenceChain {
    counts: [[u8; Instrumentation::ALL.len()]; SpanKind::ALL.len()],
}

impl EvidenceChain {
    /// Count one span.
    pub fn add(&mut self, kind: SpanKind, by: Instrumentation) {
        let c = &mut self.counts[kind as usize][by as usize];
        *c = c.saturating_add(1);
    }
    /// Count every span of `other` too (a call whose rounds are joined).
    pub fn merge(&mut self, other: &EvidenceChain) {
        for (a, b) in self.counts.iter_mut().flatten().zip(other.counts.iter().flatten()) {
            *a = a.saturating_add(*b);
        }
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
