//! Normalize: OTLP spans in, [`SpanEvidence`] out.
//!
//! Each instrumentation dialect has one file and one line in [`DIALECTS`]; [`normalize_request`]
//! walks a decoded `ExportTraceServiceRequest` once, picks the dialect of each span (by its
//! instrumentation scope name, once per scope, else by a cheap look at the span's name and
//! attribute keys), lets it read the span, and keeps only typed facts. Spans that carry no MCP evidence cost one attribute scan and no allocation: they
//! only report that their trace was active (and whether they were its root), which the correlator
//! needs to know when a trace has gone quiet.

pub(crate) mod definitions;
pub(crate) mod digest_cache;
pub(crate) mod fastmcp;
pub(crate) mod intern;
pub(crate) mod logfire;
pub(crate) mod mcp_sdk;
pub mod redact;
pub(crate) mod semconv;
pub(crate) mod traceloop;
pub(crate) mod value;
pub(crate) mod view;
pub mod wire;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::trace::v1::Span;
pub use view::SpanView;

use crate::evidence::receipt::TrustedKeys;
use crate::evidence::{SpanEvidence, SpanId, TraceId};
use std::sync::Arc;

/// Reads one span of a dialect: `None` when it carries no MCP evidence. The arguments are the
/// span's validated ids, the span, the resource's `service.name`, the normalizer's [`Settings`]
/// (the receipt keys trusted, the registry of tool definitions), and a counter of attribute values
/// with an unusable type.
pub type ReadSpan = fn(TraceId, SpanId, &SpanView<'_>, Option<&Arc<str>>, &Settings, &mut u64) -> Option<SpanEvidence>;

/// What the normalizer is configured with (`processors.mcp_health`): the receipt keys it trusts,
/// the registry the tool definitions it sees go to, and the size of each receiving thread's
/// caches. Held by the component that normalizes (the receivers' admission, replay) and handed to
/// every walk, which sizes the caches of the thread it runs on before it reads: the limits are
/// values, not process-wide settings.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Keys whose signed receipts are trusted; `None`: every receipt is taken as it comes.
    pub trusted: Option<Arc<TrustedKeys>>,
    /// The tool definitions seen (`limits.tool_definitions`), shared with their readers (the
    /// engine's drift reports, the gate, `lock`).
    pub definitions: Arc<definitions::Definitions>,
    /// Contract digests by raw-definition hash, per thread (`limits.digest_cache`).
    pub digest_cache: usize,
    /// Interned names, per thread (`limits.interner`).
    pub interner: usize,
    /// Hashed session ids, per thread (`limits.redaction_cache`).
    pub redaction_cache: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            trusted: None,
            definitions: Arc::default(),
            digest_cache: digest_cache::DEFAULT_CAPACITY,
            interner: intern::DEFAULT_CAPACITY,
            redaction_cache: crate::evidence::hash::DEFAULT_SESSION_CACHE_CAPACITY,
        }
    }
}

impl Settings {
    /// Size the caches of the thread this runs on (before a walk; nothing changes when the sizes
    /// are the same).
    pub fn fit_thread(&self) {
        digest_cache::fit_thread_cache(self.digest_cache);
        intern::fit(self.interner);
        redact::fit_session_cache(self.redaction_cache);
    }
}

/// One instrumentation dialect.
pub struct Dialect {
    pub name: &'static str,
    /// Instrumentation scope names that are this dialect's (exact match).
    pub scopes: &'static [&'static str],
    /// For a span under a scope no dialect names: whether it is this dialect's by its name (and
    /// other fields, never its attributes: the wire walk asks before it has kept them). It must be
    /// cheap, it runs on every such span.
    pub sniff: fn(&SpanView<'_>) -> bool,
    /// For a span under a scope no dialect names: attribute key prefixes that make it this
    /// dialect's. Keys, not a function, so that the wire walk can ask as it reads each attribute.
    pub sniff_keys: &'static [&'static str],
    pub read: ReadSpan,
}

/// The registry. Adding a dialect is one file and one line here; the semantic conventions come
/// last, as the fallback for every span no other dialect claims (they also read this project's
/// `mcp_health.*` attributes, which any emitter may add).
pub static DIALECTS: &[Dialect] = &DIALECT_LIST;

const DIALECT_LIST: [Dialect; 5] = [mcp_sdk::DIALECT, fastmcp::DIALECT, traceloop::DIALECT, logfire::DIALECT, semconv::DIALECT];

/// The instrumentation scope of `mcp-health tap`'s spans.
pub const TAP_SCOPE: &str = "mcp-health-tap";

/// The dialect that owns a scope name, if one names it.
pub fn dialect_of_scope(scope: &str) -> Option<&'static Dialect> {
    DIALECTS.iter().find(|d| d.scopes.contains(&scope))
}

/// The dialect of one span: its scope's, else the first whose sniff claims it, else semconv.
pub fn dialect_of_span(by_scope: Option<&'static Dialect>, span: &SpanView<'_>) -> &'static Dialect {
    by_scope.or_else(|| DIALECTS.iter().find(|d| (d.sniff)(span) || d.claims_any_key(&span.attributes))).unwrap_or(&semconv::DIALECT)
}

impl Dialect {
    fn claims_key(&self, key: &str) -> bool {
        self.sniff_keys.iter().any(|p| key.starts_with(p))
    }

    /// Whether one of the attributes' keys makes the span this dialect's: no look at them for a
    /// dialect that claims no keys (three of five; an MCP span has a dozen attributes).
    fn claims_any_key(&self, attributes: &[view::KeyValue<'_>]) -> bool {
        !self.sniff_keys.is_empty() && attributes.iter().any(|kv| self.claims_key(kv.key))
    }
}

/// Whether a span's attributes could matter to any dialect, asked one attribute at a time as
/// the wire walk reads them (a span under a scope no dialect names). Spans for which it never
/// says yes, and that no dialect claims by name ([`claimed_by_name`]) and that carry no event,
/// give no evidence whatever their attributes say: the walk does not keep those, and the span
/// is only activity of its trace. In a shared pipeline that is nearly every span.
#[derive(Default)]
pub(crate) struct KeyInterest(semconv::Worth);

impl KeyInterest {
    /// Take in one attribute: `true` once the span's attributes are wanted.
    #[inline]
    pub(crate) fn see(&mut self, kv: &view::KeyValue<'_>) -> bool {
        self.0.see(kv)
            || (SNIFF_KEY_FIRST_BYTES[usize::from(kv.key.as_bytes().first().copied().unwrap_or(0))]
                && DIALECTS.iter().any(|d| d.claims_key(kv.key)))
    }
}

/// Whether some dialect claims a span by its name (its `sniff`), before its attributes are read.
pub(crate) fn claimed_by_name(span: &SpanView<'_>) -> bool {
    DIALECTS.iter().any(|d| (d.sniff)(span))
}

/// The first bytes of every dialect's `sniff_keys` (an empty prefix: every byte), so that a key
/// no dialect can claim is passed over on its first byte.
static SNIFF_KEY_FIRST_BYTES: [bool; 256] = {
    let mut t = [false; 256];
    let mut d = 0;
    while d < DIALECT_LIST.len() {
        let keys = DIALECT_LIST[d].sniff_keys;
        let mut k = 0;
        while k < keys.len() {
            match keys[k].as_bytes().first() {
                Some(&b) => t[b as usize] = true,
                None => t = [true; 256],
            }
            k += 1;
        }
        d += 1;
    }
    t
};

/// One span that was not MCP evidence, seen only so the correlator knows its trace is active.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Activity {
    pub trace_id: TraceId,
    pub is_root: bool,
}

/// The result of normalizing one export request.
#[derive(Debug, Default)]
pub struct NormalizedBatch {
    pub evidence: Vec<SpanEvidence>,
    /// Non-evidence spans, de-duplicated per consecutive trace id.
    pub activity: Vec<Activity>,
    /// Spans whose trace or span id was not a valid W3C id; they are rejected.
    pub rejected_spans: u64,
    /// Known attributes whose value had a type we could not use; the span is kept, the value is not.
    pub attribute_type_errors: u64,
    pub spans: u64,
    /// Some span carried raw tool definitions, which must be stripped before passing it on.
    pub raw_definitions_seen: bool,
    /// The memory this batch holds under `processors.memory_limiter`, released when the engine
    /// has taken it in (from then on its evidence is counted as the engine's).
    pub memory: Option<crate::flow::memory::Reservation>,
    /// Told whether the batch was written to the evidence journal (`true`) or could not be
    /// (`false`, refused): the receiver's answer waits for it (`receive::admit::Durable`).
    pub answered: Option<tokio::sync::oneshot::Sender<bool>>,
    /// When a receiver took the request in (`None` where no receiver did: a replay, a test).
    /// A receipt dated later than this is dated at it: at its arrival, not at the later moment
    /// the engine got to it, when a real receipt checked in between would already be older.
    pub received: Option<crate::evidence::time::Moment>,
}

/// Why a span was refused by [`span_ids`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NormalizeError {
    #[error("trace_id must be 16 bytes and not all zero (got {0} bytes)")]
    BadTraceId(usize),
    #[error("span_id must be 8 bytes and not all zero (got {0} bytes)")]
    BadSpanId(usize),
}

/// The ids of a span, validated as the OTLP specification requires.
pub fn span_ids(span: &Span) -> Result<(TraceId, [u8; 8]), NormalizeError> {
    ids(&span.trace_id, &span.span_id)
}

/// [`span_ids`] of raw id bytes.
pub fn ids(trace_id: &[u8], span_id: &[u8]) -> Result<(TraceId, [u8; 8]), NormalizeError> {
    let trace_id: TraceId =
        trace_id.try_into().ok().filter(|t: &TraceId| t.iter().any(|b| *b != 0)).ok_or(NormalizeError::BadTraceId(trace_id.len()))?;
    let span_len = span_id.len();
    let span_id: [u8; 8] =
        span_id.try_into().ok().filter(|s: &[u8; 8]| s.iter().any(|b| *b != 0)).ok_or(NormalizeError::BadSpanId(span_len))?;
    Ok((trace_id, span_id))
}

/// [`normalize_request_with`] the default [`Settings`] (no receipt key trusted; tests, tools).
pub fn normalize_request(req: &ExportTraceServiceRequest) -> NormalizedBatch {
    normalize_request_with(req, &Settings::default())
}

/// Walk every span of a decoded request once and produce evidence (OTLP/JSON, replay and tests;
/// the protobuf receivers walk the wire bytes instead: [`wire::walk_with`], same result).
pub fn normalize_request_with(req: &ExportTraceServiceRequest, settings: &Settings) -> NormalizedBatch {
    settings.fit_thread();
    let mut out = NormalizedBatch::default();
    let total: usize = req.resource_spans.iter().flat_map(|r| &r.scope_spans).map(|s| s.spans.len()).sum();
    out.evidence.reserve(total);
    for rs in &req.resource_spans {
        let attrs = rs.resource.as_ref().map(|r| view::attributes_from_proto(&r.attributes)).unwrap_or_default();
        // Health spans of an mcp-health (this one's own never get here: see `flow::loops`)
        // are verdicts, not calls: never judged. They are passed on like any span.
        let judge = !resource_is_emitted(&attrs);
        let service = resource_service(&attrs);
        for ss in &rs.scope_spans {
            let by_scope = ss.scope.as_ref().and_then(|sc| dialect_of_scope(&sc.name));
            let tap = ss.scope.as_ref().is_some_and(|sc| sc.name == TAP_SCOPE);
            for span in &ss.spans {
                if judge {
                    out.spans += 1;
                    read_view(&SpanView::from_proto(span), by_scope, tap, service.as_ref(), settings, &mut out);
                }
            }
        }
    }
    out
}

/// The resource is what some mcp-health made itself (see `flow::loops::is_emitted`).
pub(crate) fn resource_is_emitted(attrs: &[view::KeyValue<'_>]) -> bool {
    attrs.iter().any(|kv| kv.key == crate::flow::loops::EMITTER)
}

/// The resource came back through this process's own export loop: `flow::loops::is_looped` over
/// a borrowed resource's attributes.
pub(crate) fn resource_is_looped(attrs: &[view::KeyValue<'_>], me: &str) -> bool {
    use crate::flow::loops::{EMITTER, VIA};
    use view::Value as V;
    attrs.iter().any(|kv| match kv.key {
        EMITTER => matches!(kv.value.as_ref().and_then(|v| v.value.as_ref()), Some(V::StringValue(s)) if *s == me),
        VIA => match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
            Some(V::ArrayValue(a)) => a.values.iter().any(|v| matches!(&v.value, Some(V::StringValue(s)) if *s == me)),
            Some(V::StringValue(s)) => *s == me,
            _ => false,
        },
        _ => false,
    })
}

/// The resource's `service.name`, interned.
pub(crate) fn resource_service(attrs: &[view::KeyValue<'_>]) -> Option<Arc<str>> {
    attrs
        .iter()
        .find(|kv| kv.key == "service.name")
        .and_then(|kv| value::as_str(&kv.value))
        .map(|s| intern::intern(intern::Kind::Service, s, None, || s.to_string()))
}

/// Read one span into `out`: evidence when its dialect finds some, else activity of its trace.
/// `tap`: the span's scope is [`TAP_SCOPE`].
pub(crate) fn read_view(
    span: &SpanView<'_>,
    by_scope: Option<&'static Dialect>,
    tap: bool,
    service: Option<&Arc<str>>,
    settings: &Settings,
    out: &mut NormalizedBatch,
) {
    let (trace_id, span_id) = match ids(span.trace_id, span.span_id) {
        Ok(ids) => ids,
        Err(_) => {
            out.rejected_spans += 1;
            return;
        }
    };
    let dialect = dialect_of_span(by_scope, span);
    match (dialect.read)(trace_id, span_id, span, service, settings, &mut out.attribute_type_errors) {
        Some(mut ev) => {
            ev.instrumentation =
                if tap { crate::evidence::Instrumentation::Tap } else { crate::evidence::Instrumentation::of_dialect(dialect.name) };
            out.raw_definitions_seen |= ev.catalog.as_ref().is_some_and(|c| c.raw_definitions_seen);
            out.evidence.push(ev)
        }
        None => note_activity(trace_id, span, out),
    }
}

/// A span the walk found no dialect could read (no attributes kept, no event, no claimed
/// name): what [`read_view`] makes of it, without asking each dialect again.
pub(crate) fn read_activity(span: &SpanView<'_>, out: &mut NormalizedBatch) {
    match ids(span.trace_id, span.span_id) {
        Ok((trace_id, _)) => note_activity(trace_id, span, out),
        Err(_) => out.rejected_spans += 1,
    }
}

/// The span's trace was active (and had its root here, if this span is one).
#[inline]
fn note_activity(trace_id: TraceId, span: &SpanView<'_>, out: &mut NormalizedBatch) {
    let is_root = span.parent_span_id.is_empty();
    match out.activity.last_mut() {
        Some(last) if last.trace_id == trace_id => last.is_root |= is_root,
        _ => out.activity.push(Activity { trace_id, is_root }),
    }
}

/// Remove spans with invalid ids from a request, so what is passed on is what was accepted.
pub fn drop_invalid_spans(req: &mut ExportTraceServiceRequest) {
    for rs in &mut req.resource_spans {
        for ss in &mut rs.scope_spans {
            ss.spans.retain(|s| span_ids(s).is_ok());
        }
    }
}

/// Remove raw tool definitions (`mcp_health.catalog.tools`) from a request: mcp-health has digested
/// them, and they are not to travel further. Every place an attribute can sit is stripped — the
/// resource, the scope, spans, span events and links — whatever the value's type (string, array,
/// map) and whatever the instrumentation scope, so a form no dialect reads does not slip through.
/// Returns how many attributes were removed.
pub fn strip_raw_definitions(req: &mut ExportTraceServiceRequest) -> usize {
    use opentelemetry_proto::tonic::common::v1::KeyValue;
    fn strip(attrs: &mut Vec<KeyValue>) -> usize {
        let before = attrs.len();
        attrs.retain(|kv| kv.key != crate::evidence::attributes::CATALOG_TOOLS);
        before - attrs.len()
    }
    let mut removed = 0;
    for rs in &mut req.resource_spans {
        if let Some(r) = &mut rs.resource {
            removed += strip(&mut r.attributes);
        }
        for ss in &mut rs.scope_spans {
            if let Some(scope) = &mut ss.scope {
                removed += strip(&mut scope.attributes);
            }
            for span in &mut ss.spans {
                removed += strip(&mut span.attributes);
                for ev in &mut span.events {
                    removed += strip(&mut ev.attributes);
                }
                for link in &mut span.links {
                    removed += strip(&mut link.attributes);
                }
            }
        }
    }
    removed
}

#[cfg(test)]
mod dialect_tests {
    use super::*;

    fn span<'a>(name: &'a str, keys: &[&'a str]) -> SpanView<'a> {
        SpanView { name, attributes: keys.iter().map(|k| view::KeyValue { key: k, value: None }).collect(), ..Default::default() }
    }

    #[test]
    fn the_registry_picks_by_scope_then_by_sniffing_then_semconv() {
        let pick = |scope: &str, s: &SpanView<'_>| dialect_of_span(dialect_of_scope(scope), s).name;
        assert_eq!(pick("mcp-python-sdk", &span("x", &[])), "mcp_sdk");
        assert_eq!(pick("fastmcp", &span("x", &[])), "fastmcp");
        assert_eq!(pick("opentelemetry.instrumentation.mcp.instrumentation", &span("x", &[])), "traceloop");
        assert_eq!(pick("logfire.mcp", &span("x", &[])), "logfire");
        // Renamed or wrapped scopes: the span itself tells.
        assert_eq!(pick("custom", &span("MCP send tools/call a", &[])), "mcp_sdk");
        assert_eq!(pick("custom", &span("tools/call a", &["fastmcp.component.key"])), "fastmcp");
        assert_eq!(pick("custom", &span("a.tool", &["traceloop.span.kind"])), "traceloop");
        assert_eq!(pick("custom", &span("MCP request: tools/call a", &[])), "logfire");
        assert_eq!(pick("opentelemetry.instrumentation.asgi", &span("POST /mcp", &["http.status_code"])), "semconv");
    }
}
