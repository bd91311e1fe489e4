//! One tool-call attempt's evidence, joined from every span that spoke about it (client, server,
//! HTTP, verifier). Built by the correlator, read by the classifier.

use std::sync::Arc;

use super::*;

/// The joined evidence of one call attempt.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CallEvidence {
    pub trace_id: TraceId,
    /// The span the verdict hangs under: the client span if any, else the earliest span.
    pub anchor_span_id: SpanId,
    pub method: Option<Method>,
    pub tool: Option<Arc<str>>,
    pub request_id: Option<Box<str>>,
    pub session_id: Option<Arc<str>>,
    pub protocol_version: Option<Arc<str>>,
    pub server: Option<Arc<str>>,
    /// `service.name` of the client side (the client's identity where there is no session).
    pub service: Option<Arc<str>>,
    /// The digest of the tool definition the client used, when reported.
    pub tool_digest: Option<Arc<str>>,
    pub start_ns: u64,
    pub end_ns: u64,
    pub client_seen: bool,
    pub server_seen: bool,
    /// JSON-RPC error codes reported (client and server may both report one).
    pub jsonrpc_error: Option<i64>,
    pub tool_error: bool,
    /// A timeout reported by exception class (no project attribute says which layer).
    pub timeout_error: bool,
    pub connection_error: Option<TransportOutcome>,
    /// A span of this call ended with ERROR status for a reason no attribute named.
    pub unexplained_error: bool,
    /// A response (result or JSON-RPC error) was observed for the request.
    pub response_seen: bool,
    pub transport: Option<TransportOutcome>,
    pub request_sent: Option<bool>,
    /// The most telling HTTP status seen (a failure status wins over a success status).
    pub http_status: Option<u16>,
    pub auth_status: Option<u16>,
    pub auth_error: Option<AuthError>,
    pub required_scope: Option<Box<str>>,
    pub credential_hash: Option<Box<str>>,
    pub auth_flow_pending: Option<bool>,
    pub negotiation: Option<Negotiation>,
    pub exec_timeout: bool,
    pub output_schema_violated: Option<bool>,
    pub effect_boundary: Option<EffectBoundary>,
    pub outcomes: Vec<OutcomeReceipt>,
    pub operation_key: Option<Box<str>>,
    pub span_count: u32,
    /// Request spans (client or server spans of the call's method) folded in so far.
    pub request_spans: u32,
    /// Progress notifications about this call (SPEC section 5).
    pub progress: Vec<ProgressMark>,
    /// The progress token the request supplied.
    pub progress_token: Option<Box<str>>,
    /// When the response arrived: the end of a request span that is not a `request_sent` marker.
    pub response_end_ns: Option<u64>,
    /// Set by the correlator when an in-flight call outlived its inactivity window or absolute
    /// deadline: `inactivity_exceeded` or `deadline_exceeded`.
    pub clock_expired: Option<&'static str>,
    /// The server said it does not know the tool (SPEC §3: `protocol_error`, refresh discovery).
    pub unknown_tool: bool,
    /// Every JSON-RPC error seen came from client spans that may have rendered a refused HTTP
    /// request as `-32603` (see [`SpanEvidence::error_maybe_client_rendered`]); [`Self::settle`]
    /// decides what it was.
    pub rendered_error_only: bool,
    /// A JSON-RPC error came from a span that is not such a client rendering.
    pub attributed_error: bool,
    /// The rank of the spans that gave `service` and `server` (see [`identity_rank`]): the
    /// call's session key is computed from them, so they must not depend on absorption order.
    pub service_rank: Option<IdentityRank>,
    pub server_rank: Option<IdentityRank>,
    /// The protocol revision the call's evidence spoke: the first span that says (by version,
    /// else by a method only one revision has).
    pub revision: ProtocolRevision,
    /// A round answered with an interim result (`input_required`, or a task handle): the server
    /// was reached and answered, but the call goes on. Never the call's result.
    pub interim_seen: bool,
    /// Hashes of the `requestState`s the call's interim rounds were handed, and of those its
    /// retries echoed: a handed one that no retry echoed means the call is waiting for input.
    pub states_issued: Vec<Box<str>>,
    pub states_echoed: Vec<Box<str>>,
    /// When the latest `input_required` result arrived.
    pub last_interim_ns: Option<u64>,
    /// The task the call was answered with (the tasks extension), as its polls report it.
    pub task: Option<TaskEvidence>,
    /// A server half whose client half could not be told (several client halves fit): decided
    /// alone, it is no attempt of its own (the client half counts the call).
    pub unjoined_half: bool,
    /// A client call that some server half in another trace fits but that could not be joined
    /// to it (another client half fits it too, or it fits several): its server evidence may
    /// exist and is not in this verdict, which is then partial (`ambiguous_server_half`).
    pub server_half_unjoined: bool,
    /// The server's request span of the call (the least span id, where several), when one was
    /// absorbed: which server half the verdict rests on, and the identity of a call first decided
    /// from its server half alone (a client half joined later revises that verdict).
    pub server_span: Option<SpanId>,
    /// A code a client SDK made up for its own side of the wire (see
    /// [`super::client_local_code`]), as the transport failure it stands for: the call's
    /// transport failure unless a server span of it reported a code ([`Self::settle`]).
    pub client_local_error: Option<TransportOutcome>,
    /// The client request spans of every round of a multi-round call (or of a task's call): a
    /// round that arrived before the others was decided under its own span, and the verdict of
    /// the whole call supersedes that one, not a second attempt.
    pub round_spans: Vec<SpanId>,
    /// Every span absorbed, by kind and instrumentation (the verdict's evidence chain).
    pub chain: super::chain::EvidenceChain,
}

/// Why a call has not finished although the server answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Awaiting {
    /// An `input_required` round (or a task in `input_required`) waits for the client's answer.
    Input,
    /// A task is `working`.
    Task,
}

/// A call's task as its `tools/call` response and its `tasks/get` / `tasks/cancel` answers report it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskEvidence {
    /// The latest status: a terminal one never changes again, whatever arrives later.
    pub status: TaskStatus,
    pub status_at_ns: u64,
    /// When the task was created (the `tools/call` response), and when the server last answered
    /// about it (any poll answer or status change).
    pub created_ns: Option<u64>,
    pub last_answer_ns: u64,
    pub poll_interval_ms: Option<u64>,
    pub ttl_ms: Option<u64>,
}

impl TaskEvidence {
    fn fold(&mut self, status: TaskStatus, at_ns: u64) {
        self.last_answer_ns = self.last_answer_ns.max(at_ns);
        let newer = at_ns >= self.status_at_ns;
        if (self.status.is_terminal() && !status.is_terminal()) || (!newer && !status.is_terminal()) {
            return;
        }
        if self.status.is_terminal() && status.is_terminal() && !newer {
            return;
        }
        self.status = status;
        self.status_at_ns = at_ns;
    }
}

/// A request that asks about a task (`tasks/get`, `tasks/cancel`, `tasks/result`).
fn is_task_request(m: &Method) -> bool {
    m.is("tasks/get") || m.is("tasks/cancel") || m.is("tasks/result")
}

/// Which span names a call's identity (its client's `service.name` and its server address, the
/// session key where the protocol has no session): a client-side request span over any other,
/// then the innermost one — the latest start, the span closest to the wire, such as a tap's span
/// under the agent's — then the greatest span id. A total order on spans, so the same spans give
/// the same identity whatever order they were absorbed in, and a call in flight (seen through the
/// wire-level span first) keeps the key it will have at the end.
pub type IdentityRank = (bool, u64, SpanId);

fn identity_rank(s: &SpanEvidence, is_request: bool) -> IdentityRank {
    (is_request && s.side == Side::Client, s.start_ns, s.span_id)
}

impl CallEvidence {
    /// The key of the session the call belongs to (see [`SpanEvidence::session_key`]): keyed as
    /// a client's when a client span of it was seen.
    pub fn session_key(&self) -> Option<String> {
        session_key(
            self.session_id.as_deref(),
            self.service.as_deref(),
            self.server.as_deref(),
            if self.client_seen { Side::Client } else { Side::Server },
        )
    }

    /// Whether the call has not finished: a round handed a `requestState` that no retry echoed
    /// (waiting for input), or its task has no terminal status yet (nor is gone).
    pub fn awaiting(&self) -> Option<Awaiting> {
        if let Some(t) = &self.task {
            return match t.status {
                TaskStatus::Working => Some(Awaiting::Task),
                TaskStatus::InputRequired => Some(Awaiting::Input),
                _ => None,
            };
        }
        let input = self.states_issued.iter().any(|h| !self.states_echoed.contains(h));
        // A final response or failure ends the wait whatever state is left unechoed.
        (input && !self.response_seen && self.jsonrpc_error.is_none() && self.transport.is_none_or(|t| t == TransportOutcome::Ok))
            .then_some(Awaiting::Input)
    }

    /// The call ran as a task that ended with no terminal status: the server no longer knows it,
    /// or its TTL or the absolute deadline passed while it was not finished.
    pub fn task_lost(&self) -> bool {
        self.task.as_ref().is_some_and(|t| {
            t.status == TaskStatus::Gone
                || (!t.status.is_terminal() && matches!(self.clock_expired, Some("task_ttl_exceeded" | "deadline_exceeded")))
        })
    }

    /// How many rounds the call took (1 for a plain call).
    pub fn rounds(&self) -> u32 {
        1 + self.states_echoed.len() as u32
    }

    /// Fold a task poll's answer (a `tasks/get`, `tasks/cancel` span about this call's task).
    fn absorb_task_poll(&mut self, s: &SpanEvidence, r: &RoundFacts) {
        self.span_count += 1;
        self.end_ns = self.end_ns.max(s.end_ns);
        let Some(status) = r.task_status else { return };
        let task = self.task.get_or_insert(TaskEvidence {
            status,
            status_at_ns: s.end_ns,
            created_ns: None,
            last_answer_ns: s.end_ns,
            poll_interval_ms: None,
            ttl_ms: None,
        });
        task.fold(status, s.end_ns);
        if r.task_poll_interval_ms.is_some() {
            task.poll_interval_ms = r.task_poll_interval_ms;
        }
        if r.task_ttl_ms.is_some() {
            task.ttl_ms = r.task_ttl_ms;
        }
        if task.status == TaskStatus::Completed {
            // The completed task's result is the call's result.
            self.response_seen = true;
            self.response_end_ns = Some(self.response_end_ns.map_or(task.status_at_ns, |e| e.min(task.status_at_ns)));
            if s.error == Some(CallError::ToolError) {
                self.tool_error = true;
            }
        }
    }

    /// Fold one span's evidence into the call.
    pub fn absorb(&mut self, s: &SpanEvidence) {
        use super::chain::SpanKind;
        let kind = if !s.outcomes.is_empty() || s.finding.is_some() {
            SpanKind::Verifier
        } else {
            match s.side {
                Side::Client => SpanKind::Client,
                Side::Server => SpanKind::Server,
                Side::Internal => SpanKind::Other,
            }
        };
        self.chain.add_span(kind, s);
        let round = s.round.as_deref();
        if let (Some(r), Some(m)) = (round, s.method.as_ref()) {
            if is_task_request(m) && self.span_count > 0 {
                self.absorb_task_poll(s, r);
                return;
            }
        }
        if self.revision == ProtocolRevision::Unknown {
            let by_version = s.protocol_version.as_deref().map_or(ProtocolRevision::Unknown, ProtocolRevision::of_version);
            self.revision = match (by_version, s.method.as_ref()) {
                (ProtocolRevision::Unknown, Some(m)) => ProtocolRevision::of_method(m),
                (v, _) => v,
            };
        }
        let interim = round.is_some_and(|r| matches!(r.result_type, Some(ResultType::InputRequired | ResultType::Task)));
        if let Some(r) = round {
            self.absorb_round(s, r);
        }
        // A notification (progress, list_changed) has no response: it is evidence about the call,
        // not a request span of it, and must never count as the call's result.
        let is_request = s.method.as_ref().is_some_and(|m| !m.is_notification());
        self.absorb_request(s, is_request, interim);
        self.absorb_identity(s, is_request);
        self.absorb_error(s, is_request, interim);
        self.absorb_wire(s);
    }

    /// The round's facts (2026-07-28): the request states issued and echoed, an
    /// `input_required` answer, a task the call became.
    fn absorb_round(&mut self, s: &SpanEvidence, r: &RoundFacts) {
        if let Some(h) = &r.state_issued {
            if !self.states_issued.contains(h) {
                self.states_issued.push(h.clone());
            }
        }
        if let Some(h) = &r.state_echoed {
            if !self.states_echoed.contains(h) {
                self.states_echoed.push(h.clone());
            }
        }
        if r.result_type == Some(ResultType::InputRequired) {
            self.last_interim_ns = Some(self.last_interim_ns.map_or(s.end_ns, |t| t.max(s.end_ns)));
        }
        if r.result_type == Some(ResultType::Task) {
            let status = r.task_status.unwrap_or(TaskStatus::Working);
            let task = self.task.get_or_insert(TaskEvidence {
                status,
                status_at_ns: s.end_ns,
                created_ns: Some(s.end_ns),
                last_answer_ns: s.end_ns,
                poll_interval_ms: r.task_poll_interval_ms,
                ttl_ms: r.task_ttl_ms,
            });
            task.created_ns = Some(s.end_ns);
            task.fold(status, s.end_ns);
            task.poll_interval_ms = r.task_poll_interval_ms.or(task.poll_interval_ms);
            task.ttl_ms = r.task_ttl_ms.or(task.ttl_ms);
        }
    }

    /// Where and when the call is: its first span, its start and end, its progress, and which of
    /// its spans are requests (the outermost client span carries the verdict).
    fn absorb_request(&mut self, s: &SpanEvidence, is_request: bool, interim: bool) {
        if self.span_count == 0 {
            self.trace_id = s.trace_id;
            self.anchor_span_id = s.span_id;
            self.start_ns = s.start_ns;
            self.end_ns = s.end_ns;
        }
        self.span_count += 1;
        self.end_ns = self.end_ns.max(s.end_ns);
        // The call starts when its request does: evidence around it (an earlier notification in
        // the trace, a verifier) must not move the moment its catalog is judged at.
        if let Some(p) = &s.progress {
            self.progress.push((**p).clone());
        }
        if is_request {
            fill(&mut self.progress_token, &s.progress_token);
            if !s.request_sent_marker && !s.response_unobserved && !interim {
                self.response_end_ns = Some(self.response_end_ns.map_or(s.end_ns, |e| e.min(s.end_ns)));
            }
        }
        if is_request {
            self.start_ns = if self.request_spans == 0 { s.start_ns } else { self.start_ns.min(s.start_ns) };
            self.request_spans += 1;
        } else if self.request_spans == 0 {
            self.start_ns = self.start_ns.min(s.start_ns);
        }
        if is_request && s.side == Side::Client && s.round.is_some() && !s.request_sent_marker && !self.round_spans.contains(&s.span_id) {
            self.round_spans.push(s.span_id);
        }
        if is_request && s.side == Side::Client && !self.client_seen {
            // The outermost client span carries the verdict.
            self.anchor_span_id = s.span_id;
        }
        if is_request {
            match s.side {
                Side::Client => self.client_seen = true,
                Side::Server => {
                    self.server_seen = true;
                    self.server_span = Some(self.server_span.map_or(s.span_id, |x| x.min(s.span_id)));
                }
                Side::Internal => {}
            }
        }
    }

    /// Who the call is: method, tool, ids, the server and client identities (the best-ranked
    /// span's), the tool's digest and the authorization facts.
    fn absorb_identity(&mut self, s: &SpanEvidence, is_request: bool) {
        fill(&mut self.method, &s.method);
        fill(&mut self.tool, &s.tool);
        fill(&mut self.request_id, &s.request_id);
        fill(&mut self.session_id, &s.session_id);
        fill(&mut self.protocol_version, &s.protocol_version);
        let rank = identity_rank(s, is_request);
        if s.server.is_some() && self.server_rank.is_none_or(|r| rank > r) {
            self.server.clone_from(&s.server);
            self.server_rank = Some(rank);
        }
        // Only a client-side span knows the client's identity.
        if s.side == Side::Client && s.service.is_some() && self.service_rank.is_none_or(|r| rank > r) {
            self.service.clone_from(&s.service);
            self.service_rank = Some(rank);
        }
        if let Some(d) = s.catalog.as_ref().and_then(|c| c.tool_digest.clone()) {
            self.tool_digest.get_or_insert(d);
        }
        fill(&mut self.required_scope, &s.required_scope);
        fill(&mut self.credential_hash, &s.credential_hash);
        if s.auth_flow_pending.is_some() {
            self.auth_flow_pending = s.auth_flow_pending;
        }
        fill(&mut self.operation_key, &s.operation_key);
    }

    /// The span's error, as the layers read it: whose code it is, and whether a response came.
    fn absorb_error(&mut self, s: &SpanEvidence, is_request: bool, interim: bool) {
        match s.error {
            Some(CallError::JsonRpc(c)) if s.side == Side::Client && client_local_code(i64::from(c)).is_some() => {
                // The client's own report of its side of the wire: no response came.
                if self.client_local_error.is_none() {
                    self.client_local_error = client_local_code(i64::from(c));
                }
            }
            Some(CallError::JsonRpc(c)) => {
                if s.error_maybe_client_rendered && s.side == Side::Client {
                    self.rendered_error_only = !self.attributed_error;
                } else {
                    // A server's (or an unambiguous) code outranks a client's rendering.
                    if self.rendered_error_only {
                        self.jsonrpc_error = None;
                    }
                    self.attributed_error = true;
                    self.rendered_error_only = false;
                }
                self.jsonrpc_error.get_or_insert(i64::from(c));
                if is_request {
                    self.response_seen = true;
                }
            }
            Some(CallError::UnknownTool) => {
                self.unknown_tool = true;
                self.response_seen = true;
            }
            Some(CallError::ToolError) => {
                self.tool_error = true;
                self.response_seen = true;
            }
            Some(CallError::Timeout) => self.timeout_error = true,
            Some(CallError::Connection(t)) => self.connection_error = Some(t),
            Some(CallError::Unclassified) => self.unexplained_error = true,
            None if interim => self.interim_seen = true,
            None => {
                if is_request
                    && !s.request_sent_marker
                    && !s.response_unobserved
                    && !s.status_error
                    && s.transport.is_none_or(|t| t == TransportOutcome::Ok)
                {
                    // A finished request span with no error: a result came back.
                    self.response_seen = true;
                }
                if s.status_error && is_request {
                    self.unexplained_error = true;
                }
            }
        }
    }

    /// What the wire and the checks said: transport outcome, HTTP and authorization statuses,
    /// negotiation, execution and schema facts, the side-effect boundary and outcome receipts.
    fn absorb_wire(&mut self, s: &SpanEvidence) {
        if let Some(t) = s.transport {
            // A failure outcome wins over `ok` from another span.
            if self.transport.is_none() || t != TransportOutcome::Ok {
                self.transport = Some(t);
            }
        }
        fill_copy(&mut self.request_sent, s.request_sent);
        if let Some(h) = s.http_status {
            if self.http_status.is_none_or(|old| h > old) {
                self.http_status = Some(h);
            }
        }
        fill_copy(&mut self.auth_status, s.auth_status);
        fill_copy(&mut self.auth_error, s.auth_error);
        if let Some(n) = &s.negotiation {
            let mine = self.negotiation.get_or_insert_with(Negotiation::default);
            fill(&mut mine.requested_version, &n.requested_version);
            fill_copy(&mut mine.version_accepted, n.version_accepted);
            for c in &n.missing_capabilities {
                if !mine.missing_capabilities.contains(c) {
                    mine.missing_capabilities.push(c.clone());
                }
            }
        }
        self.exec_timeout |= s.exec_timeout;
        if let Some(v) = s.output_schema_violated {
            self.output_schema_violated = Some(self.output_schema_violated.unwrap_or(false) || v);
        }
        fill_copy(&mut self.effect_boundary, s.effect_boundary);
        self.outcomes.extend(s.outcomes.iter().cloned());
    }

    /// Finish the call once every span is absorbed. A `-32603` that only a client rendered, with
    /// nothing from the server side (no server span, no HTTP status), cannot be attributed: it is
    /// what the `mcp` SDK 2.x client reports for any refused HTTP request (401, 403, 404, 5xx) as
    /// well as a server's internal error. It is then kept as an unexplained error (no layer fails
    /// or passes on it: the verdict is `unverified` with low confidence), never as a protocol error
    /// or a failed negotiation. The cross-trace join (`correlate::crossjoin`) brings in the HTTP
    /// server span where one exists, and with it the real status.
    pub fn settle(&mut self) {
        if let Some(t) = self.client_local_error {
            // A code the client made up: its transport failure, unless a server span of the call
            // answered with a code of its own (then that code is the call's error).
            if !self.attributed_error && self.connection_error.is_none() {
                self.connection_error = Some(t);
            }
        }
        if self.rendered_error_only
            && !self.server_seen
            && self.http_status.is_none()
            && self.auth_status.is_none()
            && self.auth_error.is_none()
        {
            self.jsonrpc_error = None;
            self.response_seen = false;
            self.unexplained_error = true;
        }
    }

    /// The receipt that speaks last: the most recent check decides.
    /// Receipts checked before the call started say nothing about its outcome (they are stale
    /// evidence) and are ignored.
    pub fn latest_outcome(&self) -> Option<&OutcomeReceipt> {
        self.outcomes
            .iter()
            .filter(|o| o.result != OutcomeResult::VerifierError && o.trust != receipt::ReceiptTrust::Untrusted)
            .filter(|o| self.start_ns == 0 || o.checked_at_ns >= self.start_ns)
            .max_by_key(|o| o.checked_at_ns)
    }

    /// A verifier was meant to check this call and could not run: the reason an unverified call
    /// gives (never a finding).
    pub fn verifier_error(&self) -> bool {
        self.outcomes.iter().any(|o| o.result == OutcomeResult::VerifierError && o.trust != receipt::ReceiptTrust::Untrusted)
    }

    /// Outcome evidence arrived that no trusted key signed (trusted keys are configured): it was
    /// not taken, and the verdict says so.
    pub fn untrusted_receipt(&self) -> bool {
        self.outcomes.iter().any(|o| o.trust == receipt::ReceiptTrust::Untrusted)
    }
}

fn fill<T: Clone>(dst: &mut Option<T>, src: &Option<T>) {
    if dst.is_none() {
        dst.clone_from(src);
    }
}

fn fill_copy<T: Copy>(dst: &mut Option<T>, src: Option<T>) {
    if dst.is_none() {
        *dst = src;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 8 defect 12: an agent's client span and a tap's client span (under it, later, with
    /// its own `--service-name`) give one identity, and so one session key, in either order.
    #[test]
    fn identity_does_not_depend_on_absorption_order() {
        let span = |id: u8, start: u64, service: &str, server: Option<&str>| {
            let mut s = SpanEvidence::new([1; 16], [id; 8]);
            s.method = Some(Method::ToolsCall);
            s.side = Side::Client;
            s.start_ns = start;
            s.end_ns = start + 100;
            s.service = Some(Arc::from(service));
            s.server = server.map(Arc::from);
            s
        };
        let agent = span(1, 10, "agent", Some("localhost:8931"));
        let mut tap = span(2, 12, "tap", Some("127.0.0.1:8931"));
        tap.parent_span_id = Some([1; 8]);
        let mut http = SpanEvidence::new([1; 16], [3; 8]);
        http.side = Side::Server;
        http.start_ns = 13;
        http.server = Some(Arc::from("server-side:8931"));
        let orders = [[&agent, &tap, &http], [&tap, &agent, &http], [&http, &tap, &agent], [&http, &agent, &tap]];
        let keys: Vec<_> = orders
            .iter()
            .map(|o| {
                let mut c = CallEvidence::default();
                o.iter().for_each(|s| c.absorb(s));
                (c.service.clone(), c.server.clone())
            })
            .collect();
        assert!(keys.windows(2).all(|w| w[0] == w[1]), "{keys:?}");
        assert_eq!(keys[0], (Some(Arc::from("tap")), Some(Arc::from("127.0.0.1:8931"))), "the innermost client span names the call");
    }
}
