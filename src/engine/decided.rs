//! What the engine decides: the one record type every sink reads, in serve and in replay alike.

use std::sync::Arc;

use serde::Serialize;

use crate::classify::catalog::CatalogVerdict;
use crate::classify::drift::ContractChange;
use crate::classify::incidents::{Incident, Transition};
use crate::correlate::CatalogChange;
use crate::evidence::{SpanId, TraceId};
use crate::verdict::Verdict;

/// One thing the engine decided. Sinks format these; they never re-derive them. A verdict is
/// shared: it is most of a kilobyte, a step's records move through several vectors on their way
/// to the sinks, and the status page keeps some of them (recent calls, an incident's evidence).
#[derive(Clone, Debug)]
pub enum Decided {
    /// A call's verdict: its first decision, or a revision (`revision > 0`, `supersedes` set).
    Call(Arc<Verdict>),
    /// An interim report on a call still in flight (`working`); the final verdict follows.
    Interim(Arc<Verdict>),
    /// A session's catalog verdict changed (new evidence, or time passed a TTL or `max_age`).
    Catalog(Box<CatalogChange>),
    /// A discovered tool definition differs from its pin.
    Drift(Box<DriftEvent>),
    /// An incident opened, was updated or resolved.
    Incident(Box<IncidentChange>),
    /// A verifier span arrived: how the verifier ran (rule, finding or error, duration). For the
    /// verifier metrics only; it is no verdict and no line (the call's verdict, or its revision,
    /// carries the finding).
    Finding(Box<crate::evidence::FindingMeta>),
}
// Every variant a pointer: a decision is moved into and through the engine's output once per
// verdict, and a catalog change inline (296 bytes) made each of them that large.
const _: () = assert!(std::mem::size_of::<Decided>() == 16);

/// A discovered definition that differs from its pin.
#[derive(Clone, Debug, Serialize)]
pub struct DriftEvent {
    pub drift: bool,
    pub server: String,
    pub tool: String,
    pub pinned_digest: String,
    pub digest: String,
    pub changes: Vec<ContractChange>,
    #[serde(skip)]
    pub trace_id: TraceId,
    #[serde(skip)]
    pub span_id: SpanId,
}

/// An incident transition, as every sink reports it.
#[derive(Clone, Debug, Serialize)]
pub struct IncidentChange {
    /// Always true: tells incident lines from verdict lines.
    pub incident: bool,
    pub transition: Transition,
    pub row: Incident,
}

/// One session's catalog verdict, as a JSON line (`"catalog": true`), the same in serve and replay.
#[derive(Clone, Debug, Serialize)]
pub struct CatalogLine<'a> {
    /// Always true: tells catalog lines from verdict lines.
    pub catalog: bool,
    /// SHA-256 of the session key (`session:<mcp.session.id>` or `client:<service>|server:<address>`).
    pub session_hash: String,
    pub server: Option<&'a str>,
    /// The client's identity where the protocol has no session (2026-07-28): the catalog's
    /// state is keyed by client and server identity (`service.name` of the client and the
    /// server's address). Absent for a session-keyed catalog.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<&'a str>,
    /// The protocol revision the session's evidence spoke.
    pub protocol_revision: crate::evidence::ProtocolRevision,
    /// The exact dated version it last named (`2026-12-15` beside the family `2026-07-28`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol_version: Option<&'a str>,
    #[serde(flatten)]
    pub verdict: &'a CatalogVerdict,
}

impl<'a> CatalogLine<'a> {
    pub fn of(c: &'a CatalogChange) -> Self {
        CatalogLine {
            catalog: true,
            session_hash: crate::normalize::redact::hash_hex(c.session_key.as_bytes()),
            server: c.server.as_deref(),
            agent: c.session_key.strip_prefix("client:").and_then(|r| r.split_once("|server:")).map(|(a, _)| a),
            protocol_revision: c.revision,
            protocol_version: c.version.as_deref(),
            verdict: &c.verdict,
        }
    }
}

impl Decided {
    /// Each incident transition as the record emitted for it.
    pub(crate) fn incidents(changes: impl IntoIterator<Item = (Transition, Incident)>) -> impl Iterator<Item = Decided> {
        changes.into_iter().map(|(transition, row)| Decided::Incident(Box::new(IncidentChange { incident: true, transition, row })))
    }

    /// The record as one JSON value: the shape of a verdict line.
    pub fn to_json(&self) -> serde_json::Result<serde_json::Value> {
        match self {
            Decided::Call(v) | Decided::Interim(v) => serde_json::to_value(v),
            Decided::Catalog(c) => serde_json::to_value(CatalogLine::of(c)),
            Decided::Drift(d) => serde_json::to_value(d),
            Decided::Incident(i) => serde_json::to_value(i),
            Decided::Finding(_) => Ok(serde_json::Value::Null),
        }
    }

    /// Whether the record is a line of the verdict log and of `replay --format json`.
    pub fn is_line(&self) -> bool {
        !matches!(self, Decided::Finding(_))
    }

    /// Write the record as one JSON line into `buf` (nothing is written on error).
    pub fn write_line(&self, buf: &mut Vec<u8>) -> serde_json::Result<()> {
        let start = buf.len();
        let r = match self {
            Decided::Call(v) | Decided::Interim(v) => serde_json::to_writer(&mut *buf, v),
            Decided::Catalog(c) => serde_json::to_writer(&mut *buf, &CatalogLine::of(c)),
            Decided::Drift(d) => serde_json::to_writer(&mut *buf, d),
            Decided::Incident(i) => serde_json::to_writer(&mut *buf, i),
            Decided::Finding(_) => return Ok(()),
        };
        match r {
            Ok(()) => {
                buf.push(b'\n');
                Ok(())
            }
            Err(e) => {
                buf.truncate(start);
                Err(e)
            }
        }
    }
}
