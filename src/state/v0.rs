//! The record layouts of release 0.1.0 ("format version 0"): what `state.redb` and the Redis
//! hashes (`v` field) of a 0.1.0 store hold, bare postcard with no version tag.
//!
//! Only the types whose encoding differs from today's are here, with what they contain that
//! differs; everything else a record holds is today's type (its encoding did not change):
//! `SessionRecord` (a `CatalogEventKind` variant was appended, old indices keep their meaning),
//! `HalvesRecord`/`ClientHalf`, `DriftRecord`, an operation's `TraceId`, and, inside the types
//! below, `Method`, `Side`, `CallError`, `TransportOutcome`, `AuthError`, `OutcomeResult`,
//! `VerifierMethod`, `EffectBoundary`, `Negotiation`, `ProgressMark`, `ListPage`,
//! `SignalSource`, `Layer`, `Confidence`, `IncidentState`, `VerifierResult`, `Recovery`, `Scope`.
//!
//! postcard encodes a struct as its fields in order, with no names and no count, so a field added
//! anywhere (at the end too) makes old bytes fail to decode or, worse, decode shifted; it
//! encodes an enum variant by its index, so a variant inserted before others renumbers them
//! (`HealthState::Waiting`: old bytes decode, to the wrong state). `#[serde(skip)]` fields are
//! not in the bytes, so they are left out here.
//!
//! A store whose cluster still speaks state protocol 0 (a 0.1.0 instance shares it: see
//! `docs/multi-instance.md`) writes these layouts too, bare, so that 0.1.0 reads what this build
//! wrote ([`encode`]). What 0.1.0 could not hold is left out: multi-round and task facts, a
//! `subscriptions/listen` stream's facts (its catalog events), and receipts this process does not
//! take as evidence (`untrusted`: 0.1.0 knew no signatures and would take them).

use std::collections::BTreeSet;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::classify::incidents::{IncidentState, Recovery, VerifierResult};
use crate::evidence::catalog::{ListPage, SignalSource};
use crate::evidence::{
    AuthError, CallError, EffectBoundary, Method, Negotiation, OutcomeResult, ProgressMark, Side, SpanId, TraceId, TransportOutcome,
    VerifierMethod,
};
use crate::verdict::{Confidence, Layer};

// ---------------------------------------------------------------------------------------------
// Records of the tables whose layout changed: `decided`, `refusals`, `parked_verifiers`
// (through `SpanEvidence`) and `incidents` (through `HealthState`).
// ---------------------------------------------------------------------------------------------

/// `decided` in 0.1.0: `spans` was a plain `Vec` (today an `Arc<Vec<_>>`, encoded the same);
/// the spans' layout differs.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
pub struct DecidedRecord {
    pub trace_id: TraceId,
    pub spans: Vec<SpanEvidence>,
    pub root_seen: bool,
    pub truncated: bool,
    pub revision: u32,
    pub decided_at_ns: u64,
}

/// `refusals` in 0.1.0.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct RefusalsRecord {
    pub orphans: Vec<SpanEvidence>,
}

/// `parked_verifiers` in 0.1.0.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct ParkedRecord {
    pub verifiers: Vec<SpanEvidence>,
}

/// `incidents` in 0.1.0 (then `state::ServerIncidents`): the same fields, but its incidents'
/// causes hold a 0.1.0 [`HealthState`].
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct ServerIncidents {
    pub server: Option<Arc<str>>,
    pub open: Vec<Incident>,
    pub recent: Vec<Recovery>,
    pub resolved: Vec<Incident>,
}

// ---------------------------------------------------------------------------------------------
// Span evidence.
// ---------------------------------------------------------------------------------------------

/// `evidence::SpanEvidence` in 0.1.0: the same 24 encoded fields in the same order (today's
/// `instrumentation` is `#[serde(skip)]`, not in the bytes); its receipts and its rare box differ.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
pub struct SpanEvidence {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    pub parent_span_id: Option<SpanId>,
    pub side: Side,
    pub start_ns: u64,
    pub end_ns: u64,
    pub method: Option<Method>,
    pub tool: Option<Arc<str>>,
    pub request_id: Option<Box<str>>,
    pub session_id: Option<Arc<str>>,
    pub protocol_version: Option<Arc<str>>,
    pub server: Option<Arc<str>>,
    pub error: Option<CallError>,
    pub status_error: bool,
    pub http_status: Option<u16>,
    pub transport: Option<TransportOutcome>,
    pub request_sent: Option<bool>,
    /// `Outcomes` is encoded as a sequence of receipts, as this `Vec` is.
    pub outcomes: Vec<OutcomeReceipt>,
    pub request_sent_marker: bool,
    pub error_maybe_client_rendered: bool,
    pub http_mcp_endpoint: bool,
    pub response_unobserved: bool,
    pub service: Option<Arc<str>>,
    /// The private `Rare` wrapper was encoded as `Option<Box<RareEvidence>>` (`None` when unset).
    pub rare: Option<Box<RareEvidence>>,
}

/// `evidence::OutcomeReceipt` in 0.1.0: no `trust` (appended since).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct OutcomeReceipt {
    pub result: OutcomeResult,
    pub method: VerifierMethod,
    pub checked_at_ns: u64,
    pub request_id: Option<Box<str>>,
}

/// `evidence::RareEvidence` in 0.1.0: no `round` (appended since; `finding` and today's
/// `join_keys` are `#[serde(skip)]`, never in the bytes).
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct RareEvidence {
    pub auth_error: Option<AuthError>,
    pub auth_status: Option<u16>,
    pub required_scope: Option<Box<str>>,
    pub credential_hash: Option<Box<str>>,
    pub auth_flow_pending: Option<bool>,
    pub negotiation: Option<Negotiation>,
    pub exec_timeout: bool,
    pub output_schema_violated: Option<bool>,
    pub effect_boundary: Option<EffectBoundary>,
    pub operation_key: Option<Box<str>>,
    pub progress: Option<Box<ProgressMark>>,
    pub progress_token: Option<Box<str>>,
    pub catalog: Option<Box<CatalogFacts>>,
}

/// `evidence::catalog::CatalogFacts` in 0.1.0: no `listen` (appended since).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct CatalogFacts {
    pub signal: Option<SignalSource>,
    pub page: Option<ListPage>,
    pub installed_digest: Option<Arc<str>>,
    pub list_changed_capability: Option<bool>,
    pub raw_definitions_seen: bool,
    pub tool_digest: Option<Arc<str>>,
}

// ---------------------------------------------------------------------------------------------
// Incidents.
// ---------------------------------------------------------------------------------------------

/// `classify::incidents::Incident` in 0.1.0: the same fields; its cause's state is 0.1.0's.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
pub struct Incident {
    pub id: String,
    pub cause: Cause,
    pub state: IncidentState,
    pub agents: BTreeSet<Arc<str>>,
    pub calls: u64,
    pub sessions: BTreeSet<String>,
    pub retry_count: u64,
    pub first_evidence_ns: u64,
    pub last_evidence_ns: u64,
    pub confidence: Confidence,
    pub required_authority: Option<Box<str>>,
    pub verifier_result: Option<VerifierResult>,
    pub next_action: String,
}

/// `classify::incidents::Cause` in 0.1.0: the same fields; `state` is 0.1.0's enum.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct Cause {
    pub first_failed_layer: Option<Layer>,
    pub state: HealthState,
    pub server: Option<Arc<str>>,
    pub error_class: Option<String>,
    pub credential_hash: Option<Box<str>>,
    pub tool: Option<Arc<str>>,
}

/// `verdict::HealthState` in 0.1.0, in its order (postcard stores the index): today's `Waiting`
/// was inserted after `Working`, so `ToolFailed` (7) .. `Healthy` (11) are one higher today.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub enum HealthState {
    NeedsAuth,
    TransportFailed,
    IncompatibleSession,
    ContractDrift,
    StaleCatalog,
    ProtocolError,
    Working,
    ToolFailed,
    EffectUnknown,
    FalseSuccess,
    Unverified,
    Healthy,
}

// ---------------------------------------------------------------------------------------------
// Into today's types.
// ---------------------------------------------------------------------------------------------

impl From<HealthState> for crate::verdict::HealthState {
    fn from(s: HealthState) -> Self {
        use crate::verdict::HealthState as H;
        match s {
            HealthState::NeedsAuth => H::NeedsAuth,
            HealthState::TransportFailed => H::TransportFailed,
            HealthState::IncompatibleSession => H::IncompatibleSession,
            HealthState::ContractDrift => H::ContractDrift,
            HealthState::StaleCatalog => H::StaleCatalog,
            HealthState::ProtocolError => H::ProtocolError,
            HealthState::Working => H::Working,
            HealthState::ToolFailed => H::ToolFailed,
            HealthState::EffectUnknown => H::EffectUnknown,
            HealthState::FalseSuccess => H::FalseSuccess,
            HealthState::Unverified => H::Unverified,
            HealthState::Healthy => H::Healthy,
        }
    }
}

impl From<Cause> for crate::classify::incidents::Cause {
    fn from(c: Cause) -> Self {
        crate::classify::incidents::Cause {
            first_failed_layer: c.first_failed_layer,
            state: c.state.into(),
            server: c.server,
            error_class: c.error_class,
            credential_hash: c.credential_hash,
            tool: c.tool,
        }
    }
}

/// The id is kept as stored: `incident_id` hashes the cause's JSON, which names the state
/// (`"tool_failed"`), not its index, so today's id of the converted cause is the same.
impl From<Incident> for crate::classify::incidents::Incident {
    fn from(i: Incident) -> Self {
        crate::classify::incidents::Incident {
            id: i.id,
            cause: i.cause.into(),
            state: i.state,
            agents: Arc::new(i.agents),
            calls: i.calls,
            sessions: Arc::new(i.sessions),
            retry_count: i.retry_count,
            first_evidence_ns: i.first_evidence_ns,
            last_evidence_ns: i.last_evidence_ns,
            confidence: i.confidence,
            required_authority: i.required_authority,
            verifier_result: i.verifier_result,
            next_action: i.next_action,
        }
    }
}

impl From<ServerIncidents> for crate::classify::incidents::ServerIncidents {
    fn from(s: ServerIncidents) -> Self {
        crate::classify::incidents::ServerIncidents {
            server: s.server,
            open: s.open.into_iter().map(Into::into).collect(),
            recent: s.recent,
            resolved: s.resolved.into_iter().map(Into::into).collect(),
        }
    }
}

/// A 0.1.0 receipt was never signed (0.1.0 had no receipt signatures): `unsigned`, and
/// `untrusted` where the service trusts receipt keys ([`distrust_receipts`], by the store's
/// [`super::ReadPolicy`]) — what today's reader calls an unsigned receipt under trusted keys
/// (`TrustedKeys::judge`), so a stored receipt is never more evidence than a new one.
impl From<OutcomeReceipt> for crate::evidence::OutcomeReceipt {
    fn from(r: OutcomeReceipt) -> Self {
        crate::evidence::OutcomeReceipt {
            result: r.result,
            method: r.method,
            checked_at_ns: r.checked_at_ns,
            request_id: r.request_id,
            trust: crate::evidence::receipt::ReceiptTrust::Unsigned,
        }
    }
}

/// The receipts of a record 0.1.0 wrote, read where the service trusts receipt keys: every one
/// `untrusted` (none was signed).
fn distrust_receipts(r: &mut super::Record) {
    use super::Record;
    let spans: &mut Vec<crate::evidence::SpanEvidence> = match r {
        Record::Decided(d) => std::sync::Arc::make_mut(&mut d.spans),
        Record::Refusals(x) => &mut x.orphans,
        Record::Parked(x) => &mut x.verifiers,
        _ => return,
    };
    for ev in spans.iter_mut().filter(|ev| !ev.outcomes.is_empty()) {
        let distrusted: Vec<crate::evidence::OutcomeReceipt> = ev
            .outcomes
            .iter()
            .cloned()
            .map(|mut o| {
                o.trust = crate::evidence::receipt::ReceiptTrust::Untrusted;
                o
            })
            .collect();
        ev.outcomes = distrusted.into();
    }
}

impl From<CatalogFacts> for crate::evidence::catalog::CatalogFacts {
    fn from(c: CatalogFacts) -> Self {
        crate::evidence::catalog::CatalogFacts {
            signal: c.signal,
            page: c.page,
            installed_digest: c.installed_digest,
            list_changed_capability: c.list_changed_capability,
            raw_definitions_seen: c.raw_definitions_seen,
            tool_digest: c.tool_digest,
            // 0.1.0 did not read `subscriptions/listen` streams.
            listen: None,
        }
    }
}

impl From<RareEvidence> for crate::evidence::RareEvidence {
    fn from(r: RareEvidence) -> Self {
        crate::evidence::RareEvidence {
            auth_error: r.auth_error,
            auth_status: r.auth_status,
            required_scope: r.required_scope,
            credential_hash: r.credential_hash,
            auth_flow_pending: r.auth_flow_pending,
            negotiation: r.negotiation,
            exec_timeout: r.exec_timeout,
            output_schema_violated: r.output_schema_violated,
            effect_boundary: r.effect_boundary,
            operation_key: r.operation_key,
            progress: r.progress,
            progress_token: r.progress_token,
            catalog: r.catalog.map(|c| Box::new((*c).into())),
            // Never stored (skipped then and now).
            finding: None,
            // 0.1.0 did not read multi-round / task facts.
            round: None,
            // Never stored: a restored chain joins on method, request id and time alone.
            join_keys: None,
        }
    }
}

/// Built through `SpanEvidence::new` and the public fields: `rare` is private to `evidence`, and
/// is written through `DerefMut` (which allocates the box) only when 0.1.0 stored one.
impl From<SpanEvidence> for crate::evidence::SpanEvidence {
    fn from(v: SpanEvidence) -> Self {
        let mut s = crate::evidence::SpanEvidence::new(v.trace_id, v.span_id);
        s.parent_span_id = v.parent_span_id;
        s.side = v.side;
        s.start_ns = v.start_ns;
        s.end_ns = v.end_ns;
        s.method = v.method;
        s.tool = v.tool;
        s.request_id = v.request_id;
        s.session_id = v.session_id;
        s.protocol_version = v.protocol_version;
        s.server = v.server;
        s.error = v.error;
        s.status_error = v.status_error;
        s.http_status = v.http_status;
        s.transport = v.transport;
        s.request_sent = v.request_sent;
        s.outcomes = v.outcomes.into_iter().map(Into::into).collect::<Vec<_>>().into();
        s.request_sent_marker = v.request_sent_marker;
        s.error_maybe_client_rendered = v.error_maybe_client_rendered;
        s.http_mcp_endpoint = v.http_mcp_endpoint;
        s.response_unobserved = v.response_unobserved;
        s.service = v.service;
        // Not stored then or now: a restored span shows `unknown` (as today's own records do).
        s.instrumentation = crate::evidence::Instrumentation::Unknown;
        if let Some(rare) = v.rare {
            *std::ops::DerefMut::deref_mut(&mut s) = (*rare).into();
        }
        s
    }
}

fn spans(v: Vec<SpanEvidence>) -> Vec<crate::evidence::SpanEvidence> {
    v.into_iter().map(Into::into).collect()
}

impl From<DecidedRecord> for super::DecidedRecord {
    fn from(r: DecidedRecord) -> Self {
        super::DecidedRecord {
            trace_id: r.trace_id,
            spans: Arc::new(spans(r.spans)),
            root_seen: r.root_seen,
            truncated: r.truncated,
            revision: r.revision,
            decided_at_ns: r.decided_at_ns,
        }
    }
}

impl From<RefusalsRecord> for super::RefusalsRecord {
    fn from(r: RefusalsRecord) -> Self {
        super::RefusalsRecord { orphans: spans(r.orphans) }
    }
}

impl From<ParkedRecord> for super::ParkedRecord {
    fn from(r: ParkedRecord) -> Self {
        super::ParkedRecord { verifiers: spans(r.verifiers) }
    }
}

/// A record of `table` as 0.1.0 stored it, as today's [`super::Record`]. The tables whose
/// layout did not change decode with today's types.
pub(super) fn decode(table: super::Table, key: &str, bytes: &[u8], read: super::ReadPolicy) -> Result<super::Record, super::StoreError> {
    use super::{decode as pc, Record, Table};
    let mut r = match table {
        Table::Sessions => Record::Session(Box::new(pc(table, key, bytes)?)),
        Table::Operations => Record::Operation(pc(table, key, bytes)?),
        Table::DriftReported => Record::DriftReported(pc(table, key, bytes)?),
        Table::Halves => Record::Halves(Box::new(pc(table, key, bytes)?)),
        Table::Decided => Record::Decided(Box::new(pc::<DecidedRecord>(table, key, bytes)?.into())),
        Table::Incidents => Record::Incidents(Box::new(pc::<ServerIncidents>(table, key, bytes)?.into())),
        Table::Refusals => Record::Refusals(Box::new(pc::<RefusalsRecord>(table, key, bytes)?.into())),
        Table::Parked => Record::Parked(Box::new(pc::<ParkedRecord>(table, key, bytes)?.into())),
        // No such table in 0.1.0: a store it wrote has none.
        Table::Splits => Record::Split(pc(table, key, bytes)?),
    };
    if read.receipt_keys_trusted {
        distrust_receipts(&mut r);
    }
    Ok(r)
}

// ---------------------------------------------------------------------------------------------
// From today's types, for a cluster that still speaks protocol 0.
// ---------------------------------------------------------------------------------------------

/// `Waiting` (an input request or a task the call waits on) did not exist: 0.1.0 read such a call
/// as still `Working`, which is what it says.
impl From<crate::verdict::HealthState> for HealthState {
    fn from(s: crate::verdict::HealthState) -> Self {
        use crate::verdict::HealthState as H;
        match s {
            H::NeedsAuth => HealthState::NeedsAuth,
            H::TransportFailed => HealthState::TransportFailed,
            H::IncompatibleSession => HealthState::IncompatibleSession,
            H::ContractDrift => HealthState::ContractDrift,
            H::StaleCatalog => HealthState::StaleCatalog,
            H::ProtocolError => HealthState::ProtocolError,
            H::Working | H::Waiting => HealthState::Working,
            H::ToolFailed => HealthState::ToolFailed,
            H::EffectUnknown => HealthState::EffectUnknown,
            H::FalseSuccess => HealthState::FalseSuccess,
            H::Unverified => HealthState::Unverified,
            H::Healthy => HealthState::Healthy,
        }
    }
}

impl From<&crate::classify::incidents::Cause> for Cause {
    fn from(c: &crate::classify::incidents::Cause) -> Self {
        Cause {
            first_failed_layer: c.first_failed_layer,
            state: c.state.into(),
            server: c.server.clone(),
            error_class: c.error_class.clone(),
            credential_hash: c.credential_hash.clone(),
            tool: c.tool.clone(),
        }
    }
}

impl From<&crate::classify::incidents::Incident> for Incident {
    fn from(i: &crate::classify::incidents::Incident) -> Self {
        Incident {
            id: i.id.clone(),
            cause: (&i.cause).into(),
            state: i.state,
            agents: (*i.agents).clone(),
            calls: i.calls,
            sessions: (*i.sessions).clone(),
            retry_count: i.retry_count,
            first_evidence_ns: i.first_evidence_ns,
            last_evidence_ns: i.last_evidence_ns,
            confidence: i.confidence,
            required_authority: i.required_authority.clone(),
            verifier_result: i.verifier_result,
            next_action: i.next_action.clone(),
        }
    }
}

impl From<&crate::classify::incidents::ServerIncidents> for ServerIncidents {
    fn from(s: &crate::classify::incidents::ServerIncidents) -> Self {
        ServerIncidents {
            server: s.server.clone(),
            open: s.open.iter().map(Into::into).collect(),
            recent: s.recent.clone(),
            resolved: s.resolved.iter().map(Into::into).collect(),
        }
    }
}

impl From<&crate::evidence::catalog::CatalogFacts> for CatalogFacts {
    fn from(c: &crate::evidence::catalog::CatalogFacts) -> Self {
        CatalogFacts {
            signal: c.signal,
            page: c.page.clone(),
            installed_digest: c.installed_digest.clone(),
            list_changed_capability: c.list_changed_capability,
            raw_definitions_seen: c.raw_definitions_seen,
            tool_digest: c.tool_digest.clone(),
        }
    }
}

impl From<&crate::evidence::RareEvidence> for RareEvidence {
    fn from(r: &crate::evidence::RareEvidence) -> Self {
        RareEvidence {
            auth_error: r.auth_error,
            auth_status: r.auth_status,
            required_scope: r.required_scope.clone(),
            credential_hash: r.credential_hash.clone(),
            auth_flow_pending: r.auth_flow_pending,
            negotiation: r.negotiation.clone(),
            exec_timeout: r.exec_timeout,
            output_schema_violated: r.output_schema_violated,
            effect_boundary: r.effect_boundary,
            operation_key: r.operation_key.clone(),
            progress: r.progress.clone(),
            progress_token: r.progress_token.clone(),
            catalog: r.catalog.as_deref().map(|c| Box::new(c.into())),
        }
    }
}

impl From<&crate::evidence::SpanEvidence> for SpanEvidence {
    fn from(s: &crate::evidence::SpanEvidence) -> Self {
        let rare: &crate::evidence::RareEvidence = s;
        let rare = RareEvidence::from(rare);
        SpanEvidence {
            trace_id: s.trace_id,
            span_id: s.span_id,
            parent_span_id: s.parent_span_id,
            side: s.side,
            start_ns: s.start_ns,
            end_ns: s.end_ns,
            method: s.method.clone(),
            tool: s.tool.clone(),
            request_id: s.request_id.clone(),
            session_id: s.session_id.clone(),
            protocol_version: s.protocol_version.clone(),
            server: s.server.clone(),
            error: s.error,
            status_error: s.status_error,
            http_status: s.http_status,
            transport: s.transport,
            request_sent: s.request_sent,
            // 0.1.0 took every receipt as evidence: one this process does not is left out.
            outcomes: s
                .outcomes
                .iter()
                .filter(|r| r.trust != crate::evidence::receipt::ReceiptTrust::Untrusted)
                .map(|r| OutcomeReceipt {
                    result: r.result,
                    method: r.method,
                    checked_at_ns: r.checked_at_ns,
                    request_id: r.request_id.clone(),
                })
                .collect(),
            request_sent_marker: s.request_sent_marker,
            error_maybe_client_rendered: s.error_maybe_client_rendered,
            http_mcp_endpoint: s.http_mcp_endpoint,
            response_unobserved: s.response_unobserved,
            service: s.service.clone(),
            rare: (rare != RareEvidence::default()).then(|| Box::new(rare)),
        }
    }
}

fn spans_v0(v: &[crate::evidence::SpanEvidence]) -> Vec<SpanEvidence> {
    v.iter().map(Into::into).collect()
}

/// A record as 0.1.0 stored it: its layout, bare (no frame). Tables 0.1.0 did not have
/// (`split_servers`) are written framed as today: 0.1.0 never reads them.
pub(super) fn encode(r: &super::Record) -> Result<Vec<u8>, super::StoreError> {
    use super::Record;
    let bare = |bytes: Result<Vec<u8>, postcard::Error>| bytes.map_err(|e| super::StoreError::Backend(format!("encode: {e}")));
    match r {
        Record::Session(s) => {
            if s.events.iter().any(|e| matches!(e.kind, crate::classify::catalog::CatalogEventKind::Listen(_))) {
                let mut s = (**s).clone();
                s.events.retain(|e| !matches!(e.kind, crate::classify::catalog::CatalogEventKind::Listen(_)));
                bare(postcard::to_allocvec(&s))
            } else {
                bare(postcard::to_allocvec(s))
            }
        }
        Record::Incidents(i) => bare(postcard::to_allocvec(&ServerIncidents::from(&**i))),
        Record::Decided(d) => bare(postcard::to_allocvec(&DecidedRecord {
            trace_id: d.trace_id,
            spans: spans_v0(&d.spans),
            root_seen: d.root_seen,
            truncated: d.truncated,
            revision: d.revision,
            decided_at_ns: d.decided_at_ns,
        })),
        Record::Operation(t) => bare(postcard::to_allocvec(t)),
        Record::DriftReported(d) => bare(postcard::to_allocvec(d)),
        Record::Refusals(x) => bare(postcard::to_allocvec(&RefusalsRecord { orphans: spans_v0(&x.orphans) })),
        Record::Halves(h) => bare(postcard::to_allocvec(h)),
        Record::Parked(p) => bare(postcard::to_allocvec(&ParkedRecord { verifiers: spans_v0(&p.verifiers) })),
        Record::Split(_) => r.encode(),
    }
}
