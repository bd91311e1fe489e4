//! The OpenTelemetry MCP semantic conventions dialect, plus this project's `mcp_health.*` evidence
//! attributes (which any dialect may carry, so they are read here for all).
//!
//! Only typed facts are kept. `error.type` is read as a class (a JSON-RPC code, `tool_error`, a
//! timeout or connection exception name), never as a message.

use opentelemetry_proto::tonic::trace::v1::{span::SpanKind, status::StatusCode};

use super::view::{KeyValue, SpanView as Span};

use super::intern::{intern, Kind};
use super::{redact, value};
use crate::evidence::attributes as a;
use crate::evidence::catalog::{CatalogFacts, ListPage, SignalSource};
use crate::evidence::*;
use std::sync::Arc;

/// Read one span. `None` when the span carries no MCP evidence at all.
pub(crate) fn read_span(
    trace_id: TraceId,
    span_id: SpanId,
    span: &Span<'_>,
    service: Option<&Arc<str>>,
    settings: &super::Settings,
    type_errors: &mut u64,
) -> Option<SpanEvidence> {
    let trusted = settings.trusted.as_deref();
    // Fast reject: most spans in a shared pipeline are not MCP. Look at keys (and the path of an
    // HTTP span) only.
    if !worth_reading(span) {
        return None;
    }
    let mut ev = SpanEvidence::new(trace_id, span_id);
    ev.parent_span_id = span.parent_span_id.try_into().ok().filter(|p: &SpanId| p.iter().any(|b| *b != 0));
    ev.side = match SpanKind::try_from(span.kind) {
        Ok(SpanKind::Client) | Ok(SpanKind::Producer) => Side::Client,
        Ok(SpanKind::Server) | Ok(SpanKind::Consumer) => Side::Server,
        _ => Side::Internal,
    };
    ev.start_ns = span.start_time_unix_nano;
    ev.end_ns = span.end_time_unix_nano.max(span.start_time_unix_nano);
    ev.status_error = span.status.as_ref().is_some_and(|s| s.code == StatusCode::Error as i32);

    let mut cat = CatalogAcc::default();
    let mut f = Fields::default();

    for kv in &span.attributes {
        let ours = kv.key.starts_with("mcp_health.");
        if ours
            && (kv.key.starts_with("mcp_health.catalog.")
                || kv.key.starts_with("mcp_health.subscription.")
                || kv.key == a::SESSION_LIST_CHANGED_CAPABILITY)
        {
            cat.read(kv, type_errors);
            continue;
        }
        read_attribute(kv, ours, &mut ev, &mut f);
    }
    let Fields {
        server_address,
        server_port,
        error_type,
        rpc_code,
        outcome,
        negotiation,
        has_negotiation,
        progress_token,
        progress_value,
        progress_total,
        peer,
        type_errors: wrong_types,
    } = f;
    *type_errors += wrong_types;

    if let Some(addr) = server_address {
        ev.server = Some(intern(Kind::Server, addr, server_port, || match server_port {
            Some(p) => format!("{addr}:{p}"),
            None => addr.to_string(),
        }));
    }
    ev.error = classify_error(rpc_code, error_type);
    // Only where a half of a call split over two traces can use them: the client span (whose
    // own connection only the tap records), and on the server side an HTTP span or a request
    // span that starts its trace. A server span under its client's span (the common case, whose
    // trace holds both halves) keeps none, so it allocates nothing for them.
    let split_side = match ev.side {
        Side::Client => true,
        Side::Server => ev.method.is_none() || ev.parent_span_id.is_none(),
        Side::Internal => false,
    };
    let keys = if split_side { peer.keys(ev.side) } else { JoinKeys::NONE };
    if !keys.is_empty() {
        ev.join_keys = Some(Box::new(keys));
    }
    if has_negotiation {
        ev.negotiation = Some(negotiation);
    }
    ev.service = service.cloned();
    let is_progress = matches!(&ev.method, Some(Method::Other(m)) if &**m == "notifications/progress");
    match (is_progress, progress_token, progress_value) {
        (true, Some(token), Some(value)) => {
            ev.progress = Some(Box::new(ProgressMark { token, value, total: progress_total, at_ns: ev.end_ns.max(ev.start_ns) }));
        }
        (false, Some(token), _) => ev.progress_token = Some(token),
        _ => {}
    }
    for (digest, projection) in std::mem::take(&mut cat.definitions) {
        settings.definitions.remember(&digest, projection);
    }
    let facts = cat.finish(ev.method.as_ref());
    if !facts.is_empty() || facts.raw_definitions_seen {
        ev.catalog = Some(Box::new(facts));
    }
    if let Some(mut r) = outcome.receipt(ev.end_ns) {
        // Provenance: a signature over the call the receipt names (this span's trace and parent)
        // and what it found, by a key the operator trusts.
        if let Some(keys) = trusted {
            let call_span = ev.parent_span_id.unwrap_or_default();
            let signed_by = outcome.key_id.as_deref().zip(outcome.signature.as_deref());
            r.trust = keys.judge(signed_by, || {
                crate::evidence::receipt::message(
                    &trace_id,
                    &call_span,
                    outcome.request_id.as_deref().unwrap_or(""),
                    outcome.tool.as_deref().unwrap_or(""),
                    outcome.verifier.as_deref().unwrap_or(""),
                    r.result.as_str(),
                    r.method.as_str(),
                    r.checked_at_ns,
                )
            });
        }
        if outcome.verifier.is_some() || outcome.error.is_some() {
            ev.finding = Some(Box::new(crate::evidence::FindingMeta {
                verifier: outcome.verifier.clone(),
                result: Some(r.result.as_str()),
                error: outcome.error,
                duration_ns: ev.end_ns.saturating_sub(ev.start_ns),
            }));
        }
        ev.outcomes.push(r);
    }
    // Verifier results carried as span events.
    for event in span.events.iter().filter(|e| e.name == a::OUTCOME_EVENT) {
        let mut f = OutcomeFields::default();
        for kv in &event.attributes {
            read_outcome_attribute(kv, &mut f, type_errors);
        }
        if let Some(mut r) = f.receipt(event.time_unix_nano) {
            // A receipt carried as an event has no signature: evidence only where no key is trusted.
            if let Some(keys) = trusted {
                r.trust = keys.judge(None, Vec::new);
            }
            ev.outcomes.push(r);
        }
    }
    if ev.is_mcp_evidence() || (ev.http_status.is_some() && ev.http_mcp_endpoint) {
        Some(ev)
    } else {
        None
    }
}

/// Catalog attributes gathered over one span's attributes.
#[derive(Default)]
struct CatalogAcc {
    cursor: Option<Box<str>>,
    next_cursor_present: Option<bool>,
    tools: Vec<(Arc<str>, Arc<str>)>,
    raw_seen: bool,
    ttl_ms: Option<u64>,
    cache_scope: Option<Arc<str>>,
    installed: Option<Arc<str>>,
    signal: bool,
    source: Option<SignalSource>,
    capability: Option<bool>,
    tool_digest: Option<Arc<str>>,
    listen_state: Option<crate::evidence::catalog::ListenState>,
    listen_tools: Option<bool>,
    /// The projections of the raw definitions digested (by digest), for the registry of tool
    /// definitions.
    definitions: Vec<(String, serde_json::Value)>,
}

fn digest_str(s: &str) -> Option<Arc<str>> {
    let ok = s.len() == 7 + 64 && s.starts_with("sha256:") && s[7..].bytes().all(|b| b.is_ascii_hexdigit());
    ok.then(|| Arc::from(s.to_ascii_lowercase()))
}

impl CatalogAcc {
    fn read(&mut self, kv: &KeyValue<'_>, type_errors: &mut u64) {
        let v = &kv.value;
        let ok = match kv.key {
            a::CATALOG_CURSOR => value::as_str(v).map(|c| self.cursor = (!c.is_empty()).then(|| redact::cursor(c))).is_some(),
            a::CATALOG_NEXT_CURSOR_PRESENT => value::as_bool(v).map(|b| self.next_cursor_present = Some(b)).is_some(),
            a::CATALOG_TOOL_COUNT => value::as_i64(v).is_some(),
            a::CATALOG_TOOL_DIGESTS => match value::as_str_list(v) {
                Some(list) => {
                    for item in list {
                        if let Some((name, d)) = item.split_once('=').and_then(|(n, d)| Some((n, digest_str(d)?))) {
                            self.tools.push((intern(Kind::Tool, name, None, || name.to_string()), d));
                        }
                    }
                    true
                }
                None => false,
            },
            a::CATALOG_TOOLS => match value::as_str(v) {
                Some(raw) => {
                    self.raw_seen = true;
                    self.tools.extend(digest_definitions(raw, &mut self.definitions));
                    true
                }
                None => false,
            },
            a::CATALOG_TTL_MS => value::as_i64(v).filter(|t| *t >= 0).map(|t| self.ttl_ms = Some(t as u64)).is_some(),
            a::CATALOG_CACHE_SCOPE => {
                value::as_str(v).map(|c| self.cache_scope = Some(intern(Kind::Version, c, Some(1), || c.to_string()))).is_some()
            }
            a::CATALOG_INSTALLED_DIGEST => value::as_str(v).and_then(digest_str).map(|d| self.installed = Some(d)).is_some(),
            a::CATALOG_TOOL_DIGEST => value::as_str(v).and_then(digest_str).map(|d| self.tool_digest = Some(d)).is_some(),
            a::CATALOG_SIGNAL => value::as_str(v).filter(|s| *s == "list_changed").map(|_| self.signal = true).is_some(),
            a::CATALOG_SIGNAL_SOURCE => match value::as_str(v) {
                Some("notification") => {
                    self.source = Some(SignalSource::Notification);
                    true
                }
                Some("subscription") => {
                    self.source = Some(SignalSource::Subscription);
                    true
                }
                _ => false,
            },
            a::SESSION_LIST_CHANGED_CAPABILITY => value::as_bool(v).map(|b| self.capability = Some(b)).is_some(),
            a::SUBSCRIPTION_STATE => {
                value::as_str(v).and_then(crate::evidence::catalog::ListenState::parse).map(|st| self.listen_state = Some(st)).is_some()
            }
            a::SUBSCRIPTION_TOOLS_LIST_CHANGED => value::as_bool(v).map(|b| self.listen_tools = Some(b)).is_some(),
            _ => true,
        };
        if !ok {
            *type_errors += 1;
        }
    }

    fn finish(self, method: Option<&Method>) -> CatalogFacts {
        let is_notification = matches!(method, Some(Method::Other(m)) if &**m == "notifications/tools/list_changed");
        let signal = (is_notification || self.signal).then(|| self.source.unwrap_or(SignalSource::Notification));
        // A page counts only when it says whether more pages follow.
        let page = match (method, self.next_cursor_present) {
            (Some(Method::ToolsList), Some(next)) => Some(ListPage {
                cursor: self.cursor,
                next_cursor_present: next,
                tools: self.tools,
                ttl_ms: self.ttl_ms,
                cache_scope: self.cache_scope,
            }),
            _ => None,
        };
        CatalogFacts {
            signal,
            page,
            installed_digest: self.installed,
            list_changed_capability: self.capability,
            raw_definitions_seen: self.raw_seen,
            tool_digest: self.tool_digest,
            listen: self
                .listen_state
                .map(|state| crate::evidence::catalog::ListenFacts { state, tools_list_changed: self.listen_tools.unwrap_or(false) }),
        }
    }
}

/// Digest each definition of a raw JSON array of tools (a `tools/list` result's `tools`); their
/// projections go to `projections`.
fn digest_definitions(raw: &str, projections: &mut Vec<(String, serde_json::Value)>) -> Vec<(Arc<str>, Arc<str>)> {
    let Ok(serde_json::Value::Array(defs)) = serde_json::from_str::<serde_json::Value>(raw) else { return Vec::new() };
    super::digest_cache::with_thread_cache(|c| {
        defs.iter()
            .filter_map(|d| {
                let raw = serde_json::to_vec(d).ok()?;
                let t = c.digest_raw(&raw).ok()?;
                if let Ok(p) = crate::evidence::digest::project(d) {
                    projections.push((t.digest.clone(), p));
                }
                Some((intern(Kind::Tool, &t.name, None, || t.name.clone()), Arc::from(t.digest.as_str())))
            })
            .collect()
    })
}

/// Whether a full URL (an HTTP client span's `url.full`) names an MCP endpoint: its path, after
/// the scheme and authority, as [`is_mcp_path`] reads it.
fn is_mcp_url(u: &str) -> bool {
    // Every HTTP client span of a shared pipeline comes here, and most server spans through
    // `is_mcp_path`: byte loops, no `str` pattern searcher set up per call.
    let b = u.as_bytes();
    match b.windows(3).position(|w| w == b"://") {
        Some(at) => {
            let rest = &b[at + 3..];
            rest.iter().position(|c| matches!(c, b'/' | b'?' | b'#')).is_some_and(|i| mcp_path_bytes(&rest[i..]))
        }
        None => mcp_path_bytes(b),
    }
}

/// Whether an HTTP path is an MCP endpoint: the streamable-HTTP path every SDK defaults to,
/// `/mcp` (query string ignored, one trailing slash allowed). Other mount points are not guessed.
pub(crate) fn is_mcp_path(p: &str) -> bool {
    mcp_path_bytes(p.as_bytes())
}

fn mcp_path_bytes(p: &[u8]) -> bool {
    let p = &p[..p.iter().position(|c| matches!(c, b'?' | b'#')).unwrap_or(p.len())];
    let p = p.strip_suffix(b"/").unwrap_or(p);
    p.ends_with(b"/mcp")
}

/// The semantic-conventions dialect, the fallback of the registry (see `normalize::DIALECTS`).
pub(crate) const DIALECT: super::Dialect =
    super::Dialect { name: "semconv", scopes: &[], sniff: |_| false, sniff_keys: &[], read: read_span };

/// Whether a span is worth reading in full: it has an MCP or `mcp_health.` key, a JSON-RPC
/// request id or a verifier's outcome event, or it is an HTTP span with a status on an MCP
/// endpoint. An HTTP span anywhere else — the agent's own API, a tool's call to a database or a
/// downstream service — says nothing about an MCP request's transport or authorization: a
/// downstream 401 is not the agent's credential refused. Such a span is only activity of its
/// trace, whichever export it comes in, and the shipped collector filter, which drops it,
/// changes no verdict.
fn worth_reading(span: &Span<'_>) -> bool {
    let mut worth = Worth::default();
    span.attributes.iter().any(|kv| worth.see(kv)) || span.events.iter().any(|e| e.name == a::OUTCOME_EVENT)
}

/// [`worth_reading`] one attribute at a time, as the wire walk meets them: it asks before it
/// keeps a span's attributes, so that the spans of a shared pipeline that say nothing about MCP
/// are not kept only to be looked at and dropped.
#[derive(Default, Clone, Copy)]
pub(crate) struct Worth {
    status: bool,
    endpoint: bool,
}

impl Worth {
    /// Take in one attribute: `true` once the span is worth reading whatever else it carries
    /// (events aside: the caller looks at those).
    #[inline(always)]
    pub(crate) fn see(&mut self, kv: &KeyValue<'_>) -> bool {
        // Every key asked about below starts with one of these bytes; most keys of a shared
        // pipeline (`db.*`, `server.*`, `net.*`, `code.*`...) are passed over on the first,
        // without a call.
        matches!(kv.key.as_bytes().first(), Some(b'm' | b'j' | b'h' | b'u')) && self.see_key(kv)
    }

    #[inline(never)]
    fn see_key(&mut self, kv: &KeyValue<'_>) -> bool {
        let k = kv.key;
        if k.starts_with("mcp.") || k.starts_with("mcp_health.") || k == a::JSONRPC_REQUEST_ID {
            return true;
        }
        match k {
            a::HTTP_RESPONSE_STATUS_CODE | a::HTTP_STATUS_CODE_OLD => self.status = true,
            _ => self.endpoint |= names_mcp_endpoint(kv) == Some(true),
        }
        self.status && self.endpoint
    }
}

/// Whether an attribute names an MCP endpoint: `Some` for the keys of an HTTP span's request path
/// (the server's) or URL (the client's POST), one test wherever it is asked; `None` for any other
/// key. Of the path or URL only this bit is ever kept.
fn names_mcp_endpoint(kv: &KeyValue<'_>) -> Option<bool> {
    let test: fn(&str) -> bool = match kv.key {
        a::HTTP_TARGET_OLD | a::URL_PATH | a::HTTP_ROUTE => is_mcp_path,
        a::URL_FULL | a::HTTP_URL_OLD => is_mcp_url,
        _ => return None,
    };
    Some(value::as_str(&kv.value).is_some_and(test))
}

#[derive(Default)]
struct OutcomeFields {
    result: Option<OutcomeResult>,
    method: Option<VerifierMethod>,
    checked_at: Option<u64>,
    request_id: Option<Box<str>>,
    verifier: Option<Box<str>>,
    error: Option<&'static str>,
    tool: Option<Box<str>>,
    key_id: Option<Box<str>>,
    signature: Option<Box<str>>,
}

impl OutcomeFields {
    /// The receipt these fields make: a finding, or a verifier error (no finding).
    fn receipt(&self, default_at: u64) -> Option<OutcomeReceipt> {
        let result = match (self.result, self.error) {
            (Some(r), _) => r,
            (None, Some(_)) => OutcomeResult::VerifierError,
            (None, None) => return None,
        };
        Some(OutcomeReceipt {
            result,
            method: self.method.unwrap_or(VerifierMethod::Unspecified),
            checked_at_ns: self.checked_at.unwrap_or(default_at),
            request_id: self.request_id.clone(),
            trust: Default::default(),
        })
    }
}

/// What the attributes of one span said, gathered as they are read; the span's evidence is made
/// of it once every attribute is read.
#[derive(Default)]
struct Fields<'e> {
    server_address: Option<&'e str>,
    server_port: Option<i64>,
    error_type: Option<&'e str>,
    rpc_code: Option<i64>,
    outcome: OutcomeFields,
    negotiation: Negotiation,
    has_negotiation: bool,
    progress_token: Option<Box<str>>,
    progress_value: Option<f64>,
    progress_total: Option<f64>,
    /// The connection's ends, as the span records them (see [`JoinKeys`]).
    peer: Endpoints<'e>,
    /// Values of the wrong type.
    type_errors: u64,
}

/// What a span says of its connection and its client: the join keys of a call split over two
/// traces (`correlate::crossjoin`). Kept as hashes, only when the span names a whole endpoint.
#[derive(Default)]
struct Endpoints<'e> {
    peer_address: Option<&'e str>,
    peer_port: Option<i64>,
    local_address: Option<&'e str>,
    local_port: Option<i64>,
    user_agent: Option<&'e str>,
    client_name: Option<&'e str>,
}

impl Endpoints<'_> {
    /// The join keys of a span of this side: a server span's client is its peer, a client span's
    /// is its own local end.
    fn keys(&self, side: Side) -> JoinKeys {
        let endpoint = |a: Option<&str>, p: Option<i64>| {
            a.zip(p).map(|(a, p)| {
                use std::hash::{Hash, Hasher};
                let mut h = rustc_hash::FxHasher::default();
                (a, p).hash(&mut h);
                h.finish()
            })
        };
        JoinKeys {
            peer: match side {
                Side::Server => endpoint(self.peer_address, self.peer_port),
                Side::Client => endpoint(self.local_address, self.local_port),
                Side::Internal => None,
            },
            user_agent: self.user_agent.map(JoinKeys::hash),
            client_name: self.client_name.map(JoinKeys::hash),
            arguments: None,
        }
    }
}

/// One attribute into the span's evidence, by family; a key no family knows may be outcome
/// evidence. A value of the wrong type is counted, never taken.
/// `ours`: the key is in the `mcp_health.` namespace. Only those can be authorization, round,
/// session or outcome keys; the others (most of an HTTP span's) skip those tables.
fn read_attribute<'e>(kv: &KeyValue<'e>, ours: bool, ev: &mut SpanEvidence, f: &mut Fields<'e>) {
    let read = read_call_attribute(kv, ev, f).or_else(|| read_network_attribute(kv, ev, f));
    if !ours {
        if read == Some(true) {
            f.type_errors += 1;
        }
        return;
    }
    let read = read
        .or_else(|| read_auth_attribute(kv, ev))
        .or_else(|| read_round_attribute(kv, ev, f))
        .or_else(|| read_session_attribute(kv, ev, f));
    match read {
        Some(true) => f.type_errors += 1,
        Some(false) => {}
        None => read_outcome_attribute(kv, &mut f.outcome, &mut f.type_errors),
    }
}

/// The request itself: method, session, protocol version, request id, its error code or type,
/// the tool, the request-sent marker and the operation key.
/// `None`: not one of these keys; `Some(true)`: a value of the wrong type.
fn read_call_attribute<'e>(kv: &KeyValue<'e>, ev: &mut SpanEvidence, f: &mut Fields<'e>) -> Option<bool> {
    let v = &kv.value;
    let mut bad = false;
    match kv.key {
        a::MCP_METHOD_NAME => match value::as_str(v) {
            Some(m) => ev.method = Some(Method::parse(m)),
            None => bad = true,
        },
        a::MCP_SESSION_ID => {
            match value::as_str(v).map(super::intern::session).or_else(|| value::as_id(v).map(|s| super::intern::session(&s))) {
                Some(s) => ev.session_id = Some(s),
                None => bad = true,
            }
        }
        a::MCP_PROTOCOL_VERSION => match value::as_str(v) {
            Some(s) => ev.protocol_version = Some(intern(Kind::Version, s, None, || s.to_string())),
            None => bad = true,
        },
        a::JSONRPC_REQUEST_ID => match value::id_with(v, redact::ident) {
            Some(s) => ev.request_id = Some(s),
            None => bad = true,
        },
        a::RPC_RESPONSE_STATUS_CODE => match value::as_i64(v) {
            Some(c) => f.rpc_code = Some(c),
            None => bad = true,
        },
        a::ERROR_TYPE => match value::as_str(v) {
            Some(s) => f.error_type = Some(s),
            None => match value::as_i64(v) {
                Some(c) => f.rpc_code = Some(c),
                None => bad = true,
            },
        },
        a::GEN_AI_TOOL_NAME => match value::as_str(v) {
            Some(s) => ev.tool = Some(intern(Kind::Tool, s, None, || s.to_string())),
            None => bad = true,
        },
        a::CALL_PHASE => match value::as_str(v) {
            Some("request_sent") => ev.request_sent_marker = true,
            Some(_) => {}
            None => bad = true,
        },
        a::OPERATION_KEY => match value::id_with(v, redact::ident) {
            Some(s) => ev.operation_key = Some(s),
            None => bad = true,
        },
        _ => return None,
    }
    Some(bad)
}

/// Where the call went and how the wire answered: server and peer endpoints, user agent and
/// client name (the cross-trace join's keys), HTTP status and path, transport outcome.
/// `None`: not one of these keys; `Some(true)`: a value of the wrong type.
fn read_network_attribute<'e>(kv: &KeyValue<'e>, ev: &mut SpanEvidence, f: &mut Fields<'e>) -> Option<bool> {
    if let Some(endpoint) = names_mcp_endpoint(kv) {
        ev.http_mcp_endpoint |= endpoint;
        return Some(false);
    }
    let v = &kv.value;
    let mut bad = false;
    match kv.key {
        a::SERVER_ADDRESS => match value::as_str(v) {
            Some(s) => f.server_address = Some(s),
            None => bad = true,
        },
        a::SERVER_PORT => match value::as_i64(v) {
            Some(p) => f.server_port = Some(p),
            None => bad = true,
        },
        a::CLIENT_ADDRESS | a::NET_PEER_IP_OLD | a::NETWORK_PEER_ADDRESS => f.peer.peer_address = value::as_str(v),
        a::CLIENT_PORT | a::NET_PEER_PORT_OLD | a::NETWORK_PEER_PORT => f.peer.peer_port = value::as_i64(v),
        a::NETWORK_LOCAL_ADDRESS => f.peer.local_address = value::as_str(v),
        a::NETWORK_LOCAL_PORT => f.peer.local_port = value::as_i64(v),
        a::USER_AGENT | a::USER_AGENT_OLD => f.peer.user_agent = value::as_str(v),
        a::MCP_CLIENT_NAME => f.peer.client_name = value::as_str(v),
        a::HTTP_RESPONSE_STATUS_CODE | a::HTTP_STATUS_CODE_OLD => match value::as_i64(v) {
            Some(c) if (100..=599).contains(&c) => ev.http_status = Some(c as u16),
            _ => bad = true,
        },
        a::TRANSPORT_OUTCOME => match value::as_str(v).and_then(TransportOutcome::parse) {
            Some(t) => ev.transport = Some(t),
            None => bad = true,
        },
        a::REQUEST_SENT => match value::as_bool(v) {
            Some(b) => ev.request_sent = Some(b),
            None => bad = true,
        },
        _ => return None,
    }
    Some(bad)
}

/// Authorization: the 401/403, the error word, the credential (hashed), the flow, the scope.
/// `None`: not one of these keys; `Some(true)`: a value of the wrong type.
fn read_auth_attribute(kv: &KeyValue<'_>, ev: &mut SpanEvidence) -> Option<bool> {
    let v = &kv.value;
    let mut bad = false;
    match kv.key {
        a::AUTH_STATUS => match value::as_i64(v) {
            Some(c @ (401 | 403)) => ev.auth_status = Some(c as u16),
            _ => bad = true,
        },
        a::AUTH_ERROR => match value::as_str(v) {
            Some(s) => ev.auth_error = Some(AuthError::parse(s)),
            None => bad = true,
        },
        a::AUTH_CREDENTIAL_ID => match value::as_id(v) {
            Some(c) => ev.credential_hash = Some(redact::hash_hex(c.as_bytes())[..32].into()),
            None => bad = true,
        },
        a::AUTH_FLOW => match value::as_str(v) {
            Some("pending") => ev.auth_flow_pending = Some(true),
            Some("completed" | "denied") => ev.auth_flow_pending = Some(false),
            _ => bad = true,
        },
        a::AUTH_REQUIRED_SCOPE => match value::as_str(v) {
            Some(s) => ev.required_scope = redact::scope(s),
            None => bad = true,
        },
        _ => return None,
    }
    Some(bad)
}

/// Progress and the round (2026-07-28): progress token and values, result type, request
/// states, the task and its clocks.
/// `None`: not one of these keys; `Some(true)`: a value of the wrong type.
fn read_round_attribute<'e>(kv: &KeyValue<'e>, ev: &mut SpanEvidence, f: &mut Fields<'e>) -> Option<bool> {
    let v = &kv.value;
    let mut bad = false;
    match kv.key {
        a::PROGRESS_TOKEN => match value::as_id(v) {
            Some(t) => f.progress_token = Some(redact::ident(&t)),
            None => bad = true,
        },
        a::PROGRESS_VALUE => match value::as_f64(v) {
            Some(x) => f.progress_value = Some(x),
            None => bad = true,
        },
        a::PROGRESS_TOTAL => match value::as_f64(v) {
            Some(x) => f.progress_total = Some(x),
            None => bad = true,
        },
        a::CALL_RESULT_TYPE => match value::as_str(v).and_then(ResultType::parse) {
            Some(t) => round(ev).result_type = Some(t),
            None => bad = true,
        },
        a::CALL_REQUEST_STATE_ISSUED => match value::as_str(v) {
            Some(h) => round(ev).state_issued = Some(redact::cursor(h)),
            None => bad = true,
        },
        a::CALL_REQUEST_STATE_ECHOED => match value::as_str(v) {
            Some(h) => round(ev).state_echoed = Some(redact::cursor(h)),
            None => bad = true,
        },
        a::TASK_ID => match value::as_id(v) {
            Some(t) => round(ev).task_id = Some(redact::cursor(&t)),
            None => bad = true,
        },
        a::TASK_STATUS => match value::as_str(v).and_then(TaskStatus::parse) {
            Some(t) => round(ev).task_status = Some(t),
            None => bad = true,
        },
        a::TASK_POLL_INTERVAL_MS => match value::as_i64(v).filter(|t| *t >= 0) {
            Some(t) => round(ev).task_poll_interval_ms = Some(t as u64),
            None => bad = true,
        },
        a::TASK_TTL_MS => match value::as_i64(v).filter(|t| *t >= 0) {
            Some(t) => round(ev).task_ttl_ms = Some(t as u64),
            None => bad = true,
        },
        _ => return None,
    }
    Some(bad)
}

/// Negotiation and execution: the versions asked and accepted, missing capabilities, the
/// execution timeout, the output schema, the side-effect boundary.
/// `None`: not one of these keys; `Some(true)`: a value of the wrong type.
fn read_session_attribute<'e>(kv: &KeyValue<'e>, ev: &mut SpanEvidence, f: &mut Fields<'e>) -> Option<bool> {
    let v = &kv.value;
    let mut bad = false;
    match kv.key {
        a::SESSION_REQUESTED_VERSION => match value::as_str(v) {
            Some(s) => {
                f.negotiation.requested_version = Some(redact::ident(s));
                f.has_negotiation = true;
            }
            None => bad = true,
        },
        a::SESSION_VERSION_ACCEPTED => match value::as_bool(v) {
            Some(b) => {
                f.negotiation.version_accepted = Some(b);
                f.has_negotiation = true;
            }
            None => bad = true,
        },
        a::SESSION_MISSING_CAPABILITIES => match value::as_str_list(v) {
            Some(list) => {
                f.negotiation.missing_capabilities = list.iter().map(|c| redact::ident(c)).collect();
                f.has_negotiation = true;
            }
            None => bad = true,
        },
        a::EXECUTION_TIMEOUT => match value::as_bool(v) {
            Some(b) => ev.exec_timeout = b,
            None => bad = true,
        },
        a::EXECUTION_OUTPUT_SCHEMA => match value::as_str(v) {
            Some("valid") => ev.output_schema_violated = Some(false),
            Some("violated") => ev.output_schema_violated = Some(true),
            _ => bad = true,
        },
        a::EFFECT_BOUNDARY => match value::as_str(v) {
            Some("side_effect") => ev.effect_boundary = Some(EffectBoundary::SideEffect),
            Some("none") => ev.effect_boundary = Some(EffectBoundary::None),
            _ => bad = true,
        },
        _ => return None,
    }
    Some(bad)
}

/// The span's round facts, made on first write.
fn round(ev: &mut SpanEvidence) -> &mut RoundFacts {
    ev.round.get_or_insert_with(Default::default)
}

fn read_outcome_attribute(kv: &KeyValue<'_>, f: &mut OutcomeFields, type_errors: &mut u64) {
    let v = &kv.value;
    let ok = match kv.key {
        a::OUTCOME_RESULT => value::as_str(v).and_then(OutcomeResult::parse).map(|r| f.result = Some(r)).is_some(),
        a::OUTCOME_METHOD => value::as_str(v).map(|m| f.method = Some(VerifierMethod::parse(m))).is_some(),
        a::OUTCOME_CHECKED_AT => value::as_i64(v).filter(|t| *t >= 0).map(|t| f.checked_at = Some(t as u64)).is_some(),
        a::OUTCOME_REQUEST_ID => value::id_with(v, redact::ident).map(|r| f.request_id = Some(r)).is_some(),
        a::OUTCOME_VERIFIER => value::as_str(v).map(|r| f.verifier = Some(redact::tool_name(r))).is_some(),
        a::OUTCOME_TOOL => value::as_str(v).map(|t| f.tool = Some(t.into())).is_some(),
        a::OUTCOME_KEY_ID => value::as_str(v).map(|t| f.key_id = Some(t.into())).is_some(),
        a::OUTCOME_SIGNATURE => value::as_str(v).filter(|t| t.len() <= 256).map(|t| f.signature = Some(t.into())).is_some(),
        a::OUTCOME_ERROR => value::as_str(v)
            .map(|e| f.error = Some(crate::evidence::VERIFIER_ERRORS.iter().copied().find(|k| *k == e).unwrap_or("other")))
            .is_some(),
        _ => true,
    };
    if !ok {
        *type_errors += 1;
    }
}

/// Reduce `rpc.response.status_code` / `error.type` to an error class.
pub(crate) fn classify_error(rpc_code: Option<i64>, error_type: Option<&str>) -> Option<CallError> {
    if error_type == Some("tool_error") {
        return Some(CallError::ToolError);
    }
    if let Some(code) = rpc_code {
        return Some(CallError::jsonrpc(code));
    }
    let et = error_type?;
    if let Ok(code) = et.trim().parse::<i64>() {
        return Some(CallError::jsonrpc(code));
    }
    let lower = et.to_ascii_lowercase();
    Some(if lower.contains("timeout") || lower.contains("timedout") {
        CallError::Timeout
    } else if lower.contains("refused") || lower == "connecterror" || lower.ends_with(".connecterror") {
        CallError::Connection(TransportOutcome::ConnectionRefused)
    } else if lower.contains("gaierror") || lower.contains("dns") || lower.contains("nameresolution") {
        CallError::Connection(TransportOutcome::DnsFailure)
    } else if lower.contains("reset") || lower.contains("remoteprotocolerror") {
        CallError::Connection(TransportOutcome::ConnectionReset)
    } else {
        CallError::Unclassified
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::normalize::view::{AnyValue, Value};

    /// What reading one attribute leaves behind, through [`read_attribute`] with `ours` as given.
    fn read_one(key: &str, value: Value<'_>, ours: bool) -> String {
        let kv = KeyValue { key, value: Some(AnyValue { value: Some(value) }) };
        let mut ev = SpanEvidence::new([1; 16], [2; 8]);
        let mut f = Fields::default();
        read_attribute(&kv, ours, &mut ev, &mut f);
        let (o, p) = (&f.outcome, &f.peer);
        format!(
            "{ev:?} {:?} {:?} {:?} {:?} {:?} {}",
            (f.server_address, f.server_port, f.error_type, f.rpc_code),
            (o.result, o.method, o.checked_at, &o.request_id, &o.verifier, o.error, &o.tool, &o.key_id, &o.signature),
            (&f.negotiation, f.has_negotiation),
            (&f.progress_token, f.progress_value, f.progress_total),
            (p.peer_address, p.peer_port, p.local_address, p.local_port, p.user_agent, p.client_name),
            f.type_errors,
        )
    }

    /// A key outside the `mcp_health.` namespace skips the authorization, round, session and
    /// outcome tables: every attribute name this project reads, of every value type, reads the same
    /// with them as without (a new key outside the namespace in one of those tables fails here).
    #[test]
    fn keys_outside_the_namespace_read_the_same_without_the_namespaced_tables() {
        let source = include_str!("../evidence/attributes.rs");
        let keys: Vec<&str> = source
            .lines()
            .filter(|l| l.trim_start().starts_with("pub const ") && l.contains(": &str = \""))
            .filter_map(|l| l.split('"').nth(1))
            .collect();
        assert!(keys.len() > 60, "the attribute names were found: {}", keys.len());
        let mut outside = 0;
        for key in keys.iter().filter(|k| !k.starts_with("mcp_health.")) {
            outside += 1;
            for value in
                [Value::StringValue("x"), Value::StringValue("200"), Value::IntValue(500), Value::BoolValue(true), Value::DoubleValue(1.5)]
            {
                assert_eq!(read_one(key, value.clone(), false), read_one(key, value.clone(), true), "{key} = {value:?}");
            }
        }
        assert!(outside > 20, "{outside} names outside the namespace");
    }

    /// An HTTP span names an MCP endpoint by its server path or its client URL; only that bit is
    /// kept, never the URL (planted credentials in it appear nowhere in the evidence).
    #[test]
    fn an_mcp_endpoint_is_told_by_path_or_full_url_and_only_that_is_kept() {
        let cases: &[(&str, &str, bool)] = &[
            (a::URL_PATH, "/mcp", true),
            (a::HTTP_ROUTE, "/tenant/{id}/mcp/", true),
            (a::URL_PATH, "/api/orders", false),
            (a::URL_FULL, "https://tools.example:8443/mcp?token=PLANTED-SECRET-1", true),
            (a::URL_FULL, "http://127.0.0.1:9000/v1/mcp/", true),
            (a::HTTP_URL_OLD, "http://user:PLANTED-SECRET-2@host/mcp#frag", true),
            (a::URL_FULL, "https://host/api/mcp-docs", false),
            (a::URL_FULL, "https://mcp.example/", false),
            (a::URL_FULL, "https://host?next=/mcp", false),
            (a::URL_FULL, "not a url", false),
        ];
        for (key, value, want) in cases {
            let kv = KeyValue { key, value: Some(AnyValue { value: Some(Value::StringValue(value)) }) };
            let mut ev = SpanEvidence::new([1; 16], [2; 8]);
            read_attribute(&kv, false, &mut ev, &mut Fields::default());
            assert_eq!(ev.http_mcp_endpoint, *want, "{key} = {value}");
            let read = read_one(key, Value::StringValue(value), false);
            assert!(!read.contains("PLANTED") && !read.contains("example") && !read.contains("host"), "{key}: {read}");
        }
    }

    proptest::proptest! {
        /// The byte loops read a path and a URL as the `str` searches they replaced did.
        #[test]
        fn endpoints_read_as_the_str_searches_read_them(u in "(https?://[a-z:@.]{0,8})?[/a-zé?#m]{0,12}(mcp)?/?([?#][a-z/]{0,4})?") {
            let path = |p: &str| {
                let p = p.split(['?', '#']).next().unwrap_or("");
                p.strip_suffix('/').unwrap_or(p).ends_with("/mcp")
            };
            let url = match u.find("://") {
                Some(at) => u[at + 3..].find(['/', '?', '#']).is_some_and(|i| path(&u[at + 3 + i..])),
                None => path(&u),
            };
            proptest::prop_assert_eq!(is_mcp_path(&u), path(&u), "{}", u);
            proptest::prop_assert_eq!(is_mcp_url(&u), url, "{}", u);
        }
    }

    /// An HTTP span is evidence only on an MCP endpoint: the agent's own API, a tool's downstream
    /// call and ASGI's internal `http send` span (status, no path) are activity, so a tool's
    /// downstream 401 or an outer 500 never becomes the call's transport or authorization layer.
    #[test]
    fn an_http_span_is_evidence_only_on_an_mcp_endpoint() {
        let s = |k: &'static str, v: &'static str| KeyValue { key: k, value: Some(AnyValue { value: Some(Value::StringValue(v)) }) };
        let i = |k: &'static str, v: i64| KeyValue { key: k, value: Some(AnyValue { value: Some(Value::IntValue(v)) }) };
        let cases: Vec<(&str, Vec<KeyValue<'static>>, bool)> = vec![
            ("server span on /mcp", vec![s(a::URL_PATH, "/mcp"), i(a::HTTP_RESPONSE_STATUS_CODE, 401)], true),
            ("old names, status first", vec![i(a::HTTP_STATUS_CODE_OLD, 503), s(a::HTTP_TARGET_OLD, "/mcp?x=1")], true),
            ("client POST to /mcp", vec![s(a::URL_FULL, "https://tools.example/mcp"), i(a::HTTP_RESPONSE_STATUS_CODE, 403)], true),
            ("the agent's own API", vec![s(a::URL_PATH, "/api/chat"), i(a::HTTP_RESPONSE_STATUS_CODE, 500)], false),
            (
                "a tool's downstream call",
                vec![s(a::URL_FULL, "https://crm.example/v1/tickets"), i(a::HTTP_RESPONSE_STATUS_CODE, 401)],
                false,
            ),
            ("status, no path (asgi http send)", vec![s("asgi.event.type", "http.response.start"), i(a::HTTP_STATUS_CODE_OLD, 401)], false),
            ("/mcp, no status", vec![s(a::URL_PATH, "/mcp"), s("http.request.method", "POST")], false),
            ("an MCP span with a status", vec![s(a::MCP_METHOD_NAME, "tools/call"), i(a::HTTP_RESPONSE_STATUS_CODE, 500)], true),
            ("a route, old status", vec![s(a::HTTP_ROUTE, "/v1/mcp/"), i(a::HTTP_STATUS_CODE_OLD, 502)], true),
            ("an old URL, status", vec![i(a::HTTP_RESPONSE_STATUS_CODE, 401), s(a::HTTP_URL_OLD, "http://h:1/mcp")], true),
        ];
        for (what, attributes, want) in cases {
            let span = Span { trace_id: &[1; 16], span_id: &[2; 8], kind: 2, attributes, ..Default::default() };
            let ev = read_span([1; 16], [2; 8], &span, None, &Default::default(), &mut 0);
            assert_eq!(ev.is_some(), want, "{what}");
            if let Some(ev) = ev.filter(|e| e.method.is_none()) {
                assert!(ev.http_mcp_endpoint && ev.http_status.is_some(), "{what}: {ev:?}");
            }
        }
        // Not HTTP, found after other keys (each key is looked at from its first byte on).
        for (what, attributes) in [
            ("a JSON-RPC id after noise", vec![s("db.system.name", "x"), s(a::JSONRPC_REQUEST_ID, "7")]),
            ("a verifier's outcome after noise", vec![s("code.function.name", "x"), s(a::OUTCOME_RESULT, "confirmed")]),
        ] {
            let span = Span { trace_id: &[1; 16], span_id: &[2; 8], kind: 2, attributes, ..Default::default() };
            assert!(read_span([1; 16], [2; 8], &span, None, &Default::default(), &mut 0).is_some(), "{what}");
        }
    }

    #[test]
    fn error_classes() {
        let cases: &[(Option<i64>, Option<&str>, Option<CallError>)] = &[
            (None, Some("tool_error"), Some(CallError::ToolError)),
            (Some(-32601), None, Some(CallError::JsonRpc(-32601))),
            (None, Some("-32602"), Some(CallError::JsonRpc(-32602))),
            // Code 0 (an uncaught server exception, as the tap reports what the wire said) is read
            // as -32603 like every dialect reads it.
            (Some(0), Some("0"), Some(CallError::JsonRpc(-32603))),
            (None, Some("0"), Some(CallError::JsonRpc(-32603))),
            (Some(-32601), Some("tool_error"), Some(CallError::ToolError)),
            (None, Some("TimeoutError"), Some(CallError::Timeout)),
            (None, Some("httpx.ConnectError"), Some(CallError::Connection(TransportOutcome::ConnectionRefused))),
            (None, Some("socket.gaierror"), Some(CallError::Connection(TransportOutcome::DnsFailure))),
            (None, Some("ValueError"), Some(CallError::Unclassified)),
            (None, None, None),
        ];
        for (code, et, want) in cases {
            assert_eq!(classify_error(*code, *et), *want, "{code:?} {et:?}");
        }
    }
}
