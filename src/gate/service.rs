//! The gRPC gate service (`proto/mcp_health/v1/gate.proto`, compiled by `build.rs`): `CheckTool`
//! answers allow or deny for a tool definition about to be used, with the drift explained;
//! `CatalogVerdict` answers the catalog verdict of a session, or of every session of a server.
//!
//! Both answers come from [`GateState`]; nothing here decides anything the correlator and the
//! lockfile did not already decide. A session mcp-health knows nothing about is `found: false`,
//! never a default verdict.

use std::future::Future;

use tonic::{Request, Response, Status};

use super::{GateState, ToolDecision};
use crate::classify::catalog::CatalogVerdict;
use crate::classify::drift::ContractChange;

/// The generated messages, server trait ([`pb::gate_server::Gate`]) and client
/// ([`pb::gate_client::GateClient`]) of package `mcp_health.v1`.
pub mod pb {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("mcp_health.v1");
}

use pb::gate_server::{Gate, GateServer};

/// The gate service over a [`GateState`].
#[derive(Clone)]
pub(crate) struct GateService {
    state: GateState,
}

impl GateService {
    pub(crate) fn new(state: GateState) -> Self {
        GateService { state }
    }

    /// The tonic service, ready for `Server::add_service`.
    pub(crate) fn into_server(self) -> GateServer<GateService> {
        GateServer::new(self)
    }
}

/// Serve the gate on `listener` (its limits, timeouts and TLS: `crate::receive::listen`) until
/// `shutdown` resolves.
pub(crate) async fn serve(
    listener: crate::receive::listen::Listener,
    state: GateState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    let (incoming, accepting) = listener.incoming();
    let r = tonic::transport::Server::builder()
        .layer(crate::receive::listen::TrackLayer)
        .add_service(GateService::new(state).into_server())
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await;
    // The port is free when this returns (see `Listener::incoming`).
    let _ = accepting.await;
    r
}

/// `sha256:` and 64 hex digits, by the same rule the lockfile is read with.
fn parse_digest(d: &str) -> Result<String, Status> {
    crate::classify::pinning::parse_digest(d).map_err(|e| Status::invalid_argument(e.to_string()))
}

fn required<'a>(field: &str, v: &'a str) -> Result<&'a str, Status> {
    if v.trim().is_empty() {
        Err(Status::invalid_argument(format!("{field} is required")))
    } else {
        Ok(v)
    }
}

/// The serde tag of a change (`parameter_renamed`, `enum_narrowed`, …).
fn change_kind(c: &ContractChange) -> String {
    serde_json::to_value(c).ok().and_then(|v| v.get("kind").and_then(|k| k.as_str()).map(str::to_string)).unwrap_or_default()
}

impl From<&ToolDecision> for pb::CheckToolResponse {
    fn from(d: &ToolDecision) -> Self {
        pb::CheckToolResponse {
            allow: d.allow,
            reason: d.reason.to_string(),
            pinned_digest: d.pinned_digest.clone().unwrap_or_default(),
            changes: d.changes.iter().map(|c| pb::Change { kind: change_kind(c), description: c.describe() }).collect(),
        }
    }
}

impl From<&CatalogVerdict> for pb::Verdict {
    fn from(v: &CatalogVerdict) -> Self {
        pb::Verdict {
            convergence: v.convergence.as_str().to_string(),
            reason: v.reason.to_string(),
            next_step: v.next_step.to_string(),
            signal_at_unix_nano: v.signal_at_ns.unwrap_or(0),
            traversal_start_unix_nano: v.traversal_start_ns.unwrap_or(0),
            traversal_end_unix_nano: v.traversal_end_ns.unwrap_or(0),
            cursor_chain: v.cursor_chain.clone(),
            discovered_digest: v.discovered_digest.clone().unwrap_or_default(),
            installed_digest: v.installed_digest.clone().unwrap_or_default(),
            projection_version: v.projection_version.to_string(),
        }
    }
}

impl GateService {
    /// `CheckTool` without the transport (also what the unit tests call).
    pub(crate) fn check_tool_inner(&self, r: &pb::CheckToolRequest) -> Result<pb::CheckToolResponse, Status> {
        let server = required("server", &r.server)?;
        let tool = required("tool", &r.tool)?;
        let digest = parse_digest(required("digest", &r.digest)?)?;
        Ok((&self.state.check_tool(server, tool, &digest)).into())
    }

    /// `CatalogVerdict` without the transport.
    pub(crate) fn catalog_verdict_inner(&self, r: &pb::CatalogVerdictRequest) -> Result<pb::CatalogVerdictResponse, Status> {
        // With a shared store down, another instance may hold a newer verdict: never a guess.
        if self.state.store_down.as_ref().is_some_and(|down| down()) {
            return Err(Status::unavailable("the state store is unavailable: catalog verdicts of other instances are unknown; retry"));
        }
        let nonempty = |s: &str| Some(s.to_string()).filter(|s| !s.trim().is_empty());
        let (session_id, client, server) = (nonempty(&r.session_id), nonempty(&r.client), nonempty(&r.server));
        let one = |v: Option<CatalogVerdict>| pb::CatalogVerdictResponse {
            found: v.is_some(),
            verdict: v.as_ref().map(Into::into),
            sessions: Vec::new(),
        };
        match (session_id, client, server) {
            // A session id names the session whatever else is given.
            (Some(sid), _, _) => Ok(one(self.state.catalog_of(Some(&sid), None, None))),
            (None, Some(c), Some(s)) => Ok(one(self.state.catalog_of(None, Some(&c), Some(&s)))),
            (None, None, Some(s)) => {
                let sessions: Vec<pb::SessionVerdict> = self
                    .state
                    .board
                    .for_server(&s)
                    .iter()
                    .map(|(hash, v)| pb::SessionVerdict { session_hash: hash.clone(), verdict: Some(v.into()) })
                    .collect();
                Ok(pb::CatalogVerdictResponse { found: !sessions.is_empty(), verdict: None, sessions })
            }
            (None, Some(_), None) => {
                Err(Status::invalid_argument("client needs server: a session without an id is named by client and server"))
            }
            (None, None, None) => Err(Status::invalid_argument("name a session (session_id, or client and server) or a server")),
        }
    }
}

#[tonic::async_trait]
impl Gate for GateService {
    async fn check_tool(&self, request: Request<pb::CheckToolRequest>) -> Result<Response<pb::CheckToolResponse>, Status> {
        self.check_tool_inner(request.get_ref()).map(Response::new)
    }

    async fn catalog_verdict(&self, request: Request<pb::CatalogVerdictRequest>) -> Result<Response<pb::CatalogVerdictResponse>, Status> {
        self.catalog_verdict_inner(request.get_ref()).map(Response::new)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;
    use crate::classify::catalog::{convergence, RefreshPolicy};
    use crate::classify::digest::{project, tool_digest, PROJECTION_VERSION};
    use crate::classify::pinning::{Lockfile, Pin};
    use crate::gate::UnpinnedPolicy;

    const SERVER: &str = "docs.example.test:443";

    fn req(server: &str, tool: &str, digest: &str) -> pb::CheckToolRequest {
        pb::CheckToolRequest { server: server.into(), tool: tool.into(), digest: digest.into() }
    }

    fn digest_of(def: &serde_json::Value) -> String {
        tool_digest(def).unwrap().digest
    }

    #[test]
    fn without_a_lockfile_the_unpinned_policy_answers() {
        let d = digest_of(&json!({"name":"search"}));
        let allow = GateService::new(GateState::default());
        let r = allow.check_tool_inner(&req(SERVER, "search", &d)).unwrap();
        assert!(r.allow);
        assert_eq!(r.reason, "no_lockfile");
        assert!(r.pinned_digest.is_empty() && r.changes.is_empty());

        let deny = GateService::new(GateState { unpinned: UnpinnedPolicy::Deny, ..GateState::default() });
        // While the store is down, catalog verdicts are UNAVAILABLE, not this instance's guess.
        let down = GateService::new(GateState { store_down: Some(Arc::new(|| true)), ..GateState::default() });
        let err = down.catalog_verdict_inner(&pb::CatalogVerdictRequest { server: "s".into(), ..Default::default() }).unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unavailable);
        let up = GateService::new(GateState { store_down: Some(Arc::new(|| false)), ..GateState::default() });
        assert!(up.catalog_verdict_inner(&pb::CatalogVerdictRequest { server: "s".into(), ..Default::default() }).is_ok());
        let r = deny.check_tool_inner(&req(SERVER, "search", &d)).unwrap();
        assert!(!r.allow);
        assert_eq!(r.reason, "no_lockfile");
    }

    #[test]
    fn invalid_requests_are_invalid_argument() {
        let g = GateService::new(GateState::default());
        let good = digest_of(&json!({"name":"search"}));
        for (r, names) in [
            (req("", "search", &good), "server"),
            (req(SERVER, " ", &good), "tool"),
            (req(SERVER, "search", ""), "digest"),
            (req(SERVER, "search", "sha256:abc"), "64 hex"),
            (req(SERVER, "search", &good.replace("sha256:", "md5:")), "sha256:"),
            (req(SERVER, "search", &format!("{}g", &good[..good.len() - 1])), "64 hex"),
        ] {
            let e = g.check_tool_inner(&r).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{r:?}");
            assert!(e.message().contains(names), "{r:?}: {}", e.message());
        }
        // Upper-case hex is the same digest.
        assert!(g.check_tool_inner(&req(SERVER, "search", &format!("sha256:{}", good["sha256:".len()..].to_ascii_uppercase()))).is_ok());
        // The message says what is wrong, never the value (a key pasted by mistake stays out).
        for planted in ["sk_live_4eC39HqLyjWDarjtT1zdp7dc9aZ0", "sha256:sk_live_4eC39HqLyjWDarjtT1zdp7dc9aZ0", "sha256:PLANTED-SECRET-99"] {
            let e = g.check_tool_inner(&req(SERVER, "search", planted)).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert!(!e.message().contains("sk_live") && !e.message().contains("PLANTED"), "{}", e.message());
        }
        for r in [pb::CatalogVerdictRequest::default(), pb::CatalogVerdictRequest { client: "agent".into(), ..Default::default() }] {
            assert_eq!(g.catalog_verdict_inner(&r).unwrap_err().code(), tonic::Code::InvalidArgument, "{r:?}");
        }
    }

    #[test]
    fn pins_allow_and_drift_denies_with_the_changes() {
        let old = json!({"name":"search","inputSchema":{"type":"object","properties":{"query":{"type":"string"}},"required":["query"]}});
        let new = json!({"name":"search","inputSchema":{"type":"object","properties":{"q":{"type":"string"}},"required":["q"]}});
        let mut l = Lockfile::new();
        let pin = Pin {
            digest: digest_of(&old),
            projection_version: PROJECTION_VERSION.into(),
            first_seen: "2026-11-29T00:00:00Z".into(),
            definition: Some(project(&old).unwrap()),
        };
        l.add(SERVER, "search", pin, false);
        let state = GateState { pins: Some(Arc::new(l)), ..GateState::default() };
        let definitions = state.definitions.clone();
        let g = GateService::new(state);

        let r = g.check_tool_inner(&req(SERVER, "search", &digest_of(&old))).unwrap();
        assert!(r.allow && r.reason == "matches_pin" && r.pinned_digest == digest_of(&old), "{r:?}");

        definitions.remember(&digest_of(&new), project(&new).unwrap());
        let r = g.check_tool_inner(&req(SERVER, "search", &digest_of(&new))).unwrap();
        assert!(!r.allow && r.reason == "contract_drift" && r.pinned_digest == digest_of(&old), "{r:?}");
        assert_eq!(
            r.changes,
            vec![pb::Change { kind: "parameter_renamed".into(), description: "parameter `query` renamed to `q`".into() }]
        );

        let r = g.check_tool_inner(&req(SERVER, "other", &digest_of(&old))).unwrap();
        assert!(r.allow && r.reason == "unpinned", "{r:?}");
    }

    #[test]
    fn catalog_verdicts_by_session_client_and_server() {
        let state = GateState::default();
        let v = convergence(&[], RefreshPolicy::None, 0);
        state.board.publish("session:s-1", Some(Arc::from(SERVER)), v.clone());
        state.board.publish("client:agent|server:docs.example.test:443", Some(Arc::from(SERVER)), v.clone());
        let g = GateService::new(state);

        let r = g.catalog_verdict_inner(&pb::CatalogVerdictRequest { session_id: "s-1".into(), ..Default::default() }).unwrap();
        assert!(r.found);
        assert_eq!(r.verdict.unwrap().convergence, "unverifiable");

        let r = g
            .catalog_verdict_inner(&pb::CatalogVerdictRequest { client: "agent".into(), server: SERVER.into(), ..Default::default() })
            .unwrap();
        assert!(r.found && r.verdict.is_some());

        let r = g.catalog_verdict_inner(&pb::CatalogVerdictRequest { session_id: "nobody".into(), ..Default::default() }).unwrap();
        assert!(!r.found && r.verdict.is_none(), "unknown is not found, never a default verdict");

        let r = g.catalog_verdict_inner(&pb::CatalogVerdictRequest { server: SERVER.into(), ..Default::default() }).unwrap();
        assert!(r.found && r.verdict.is_none());
        let hashes: Vec<&str> = r.sessions.iter().map(|s| s.session_hash.as_str()).collect();
        assert!(hashes.contains(&crate::normalize::redact::hash_hex(b"session:s-1").as_str()), "{hashes:?}");
        assert_eq!(r.sessions.len(), 2);

        let r = g.catalog_verdict_inner(&pb::CatalogVerdictRequest { server: "elsewhere:1".into(), ..Default::default() }).unwrap();
        assert!(!r.found && r.sessions.is_empty());
    }
}
