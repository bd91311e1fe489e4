//! Incidents (SPEC section 6): failures that share a cause are one incident, not one alert per
//! attempt. The [`IncidentBook`] is a deterministic fold over verdicts — no I/O, time passed in —
//! so every lifecycle rule is testable as a table.
//!
//! Cause = first failed layer (or the state's layer), server, sanitized error class, credential
//! owner (a hash) and tool; an authorization incident is per credential, not per tool, so five
//! tools refused for one expired token are one incident. An incident opens on the first failing
//! verdict, is updated by each further one, and resolves only when a later call of the same scope
//! passed the failed layer **and** its intended outcome was observed (`healthy`); a successful
//! retry without outcome evidence leaves it open. An incident whose authorization flow is pending
//! is `waiting`, not stuck.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::sync::Arc;

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use crate::verdict::{Confidence, HealthState, Layer, LayerStatus, Verdict};

/// What the incident fold reads of a verdict: borrowed from the verdict where the fold runs
/// beside it ([`IncidentBook::observe`]), owned where verdicts are held for a fold elsewhere
/// (a shared store's, on its own thread) — a few fields, not a copy of the whole verdict.
#[derive(Clone, Debug)]
pub(crate) struct IncidentFacts<'a> {
    pub state: HealthState,
    pub first_failed_layer: Option<Layer>,
    pub server: Option<Arc<str>>,
    pub tool: Option<Arc<str>>,
    pub agent: Option<Arc<str>>,
    /// Shared with the verdict's: a fold held for the store's round keeps it without a copy.
    pub session_id_hash: Option<Arc<str>>,
    pub credential_hash: Option<Cow<'a, str>>,
    /// Read of a failure only (the cause, the incident's authority and next action).
    pub reason: Option<Cow<'a, str>>,
    pub required_scope: Option<Cow<'a, str>>,
    pub next_action: Cow<'a, str>,
    pub auth_flow_pending: bool,
    pub confidence: Confidence,
    /// Whether a receipt or verifier decided the outcome, and the outcome layer's status.
    pub outcome_decided: bool,
    pub outcome: LayerStatus,
    pub start_ns: u64,
    pub end_ns: u64,
}

impl<'a> IncidentFacts<'a> {
    /// The facts of `v`, borrowed.
    pub(crate) fn of(v: &'a Verdict) -> IncidentFacts<'a> {
        IncidentFacts {
            state: v.state,
            first_failed_layer: v.first_failed_layer,
            server: v.server.clone(),
            tool: v.tool.clone(),
            agent: v.agent.clone(),
            session_id_hash: v.session_id_hash.clone(),
            credential_hash: v.credential_hash.as_deref().map(Cow::Borrowed),
            reason: v.reason.as_deref().map(Cow::Borrowed),
            required_scope: v.required_scope.as_deref().map(Cow::Borrowed),
            next_action: Cow::Borrowed(&v.next_action),
            auth_flow_pending: v.auth_flow_pending,
            confidence: v.confidence,
            outcome_decided: v.outcome_method.is_some(),
            outcome: v.layers.get(Layer::Outcome),
            start_ns: v.start_ns,
            end_ns: v.end_ns,
        }
    }

    /// The facts of `v` to hold for a later fold: what a fold reads of a verdict in its state
    /// (a passing verdict's failure fields are never read, so they are not copied).
    pub(crate) fn held(v: &Verdict) -> IncidentFacts<'static> {
        let f = IncidentFacts::of(v);
        let failure = f.state.is_failure();
        let own = |s: Option<Cow<'_, str>>| s.map(|s| Cow::Owned(s.into_owned()));
        IncidentFacts {
            session_id_hash: f.session_id_hash,
            credential_hash: own(f.credential_hash),
            reason: own(f.reason.filter(|_| failure)),
            required_scope: own(f.required_scope.filter(|_| failure)),
            next_action: if failure { Cow::Owned(f.next_action.into_owned()) } else { Cow::Borrowed("") },
            state: f.state,
            first_failed_layer: f.first_failed_layer,
            server: f.server,
            tool: f.tool,
            agent: f.agent,
            auth_flow_pending: f.auth_flow_pending,
            confidence: f.confidence,
            outcome_decided: f.outcome_decided,
            outcome: f.outcome,
            start_ns: f.start_ns,
            end_ns: f.end_ns,
        }
    }
}

/// What groups failures into one incident.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Cause {
    pub first_failed_layer: Option<Layer>,
    pub state: HealthState,
    pub server: Option<Arc<str>>,
    pub error_class: Option<String>,
    pub credential_hash: Option<Box<str>>,
    /// `None` for authorization incidents: the credential, not the tool, is the cause.
    pub tool: Option<Arc<str>>,
}

/// Where an incident stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IncidentState {
    Open,
    /// An approved authorization flow is pending: waiting, not stuck.
    Waiting,
    Resolved,
}

impl IncidentState {
    pub fn as_str(self) -> &'static str {
        match self {
            IncidentState::Open => "open",
            IncidentState::Waiting => "waiting",
            IncidentState::Resolved => "resolved",
        }
    }
}

/// A lifecycle step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Transition {
    Opened,
    Updated,
    Resolved,
}

impl Transition {
    pub fn as_str(self) -> &'static str {
        match self {
            Transition::Opened => "opened",
            Transition::Updated => "updated",
            Transition::Resolved => "resolved",
        }
    }
}

/// The latest verifier result seen on an incident's calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerifierResult {
    Confirmed,
    FailedOrMissing,
    Unobserved,
}

impl VerifierResult {
    pub fn as_str(self) -> &'static str {
        match self {
            VerifierResult::Confirmed => "confirmed",
            VerifierResult::FailedOrMissing => "failed_or_missing",
            VerifierResult::Unobserved => "unobserved",
        }
    }
}

/// One incident row (SPEC section 6).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Incident {
    /// Stable id: a hash of the cause.
    pub id: String,
    pub cause: Cause,
    pub state: IncidentState,
    /// Affected agents (`service.name` of the clients), bounded. Shared between the copies of
    /// the row: every failing call emits its incident's row (`updated`), and the status page
    /// keeps one; copying the two sets (up to [`MAX_SET`] strings each) per failing call was 2–4 %
    /// of the service's CPU under the benchmark's load. A set is copied only when a call adds a
    /// name to it.
    pub agents: Arc<BTreeSet<Arc<str>>>,
    /// Impact: failed calls, and distinct sessions (hashes, bounded).
    pub calls: u64,
    pub sessions: Arc<BTreeSet<String>>,
    /// Attempts that failed with this cause (the first one included).
    pub retry_count: u64,
    pub first_evidence_ns: u64,
    pub last_evidence_ns: u64,
    pub confidence: Confidence,
    /// The authority the calls need (an OAuth scope; never a token).
    pub required_authority: Option<Box<str>>,
    /// The latest verifier result seen on the incident's calls.
    pub verifier_result: Option<VerifierResult>,
    pub next_action: String,
}

/// The incidents of the service.
///
/// The fold goes by evidence time, not by the order verdicts are decided in: a healthy call
/// resolves the incidents of its scope whose failures ended before it did, and a failure decided
/// after a healthy call of its scope that ended later is opened and resolved at once. So the set
/// of open incidents is the same whichever chain is decided first (at shutdown, in replay, on two
/// instances). Recent healthy calls are kept per server for that, bounded.
#[derive(Default)]
pub(crate) struct IncidentBook {
    open: FxHashMap<Cause, Incident>,
    /// Incidents resolved lately, by cause (at most [`MAX_RESOLVED_PER_SERVER`] per server): a
    /// failure decided after the resolution that ended before it is counted in the resolved
    /// incident (an `updated` of it) instead of opening and resolving one of its own, so the
    /// incidents do not depend on which of the two was decided first (on two instances, say).
    resolved: FxHashMap<Cause, Incident>,
    recoveries: FxHashMap<Option<Arc<str>>, ServerRecoveries>,
    pub resolved_total: u64,
    /// Record which servers' incidents and recoveries change, for the state store.
    track: bool,
    dirty: std::collections::BTreeSet<Option<Arc<str>>>,
    /// When each session's (or, without sessions, agent's) catalog last converged, by server:
    /// a stale-catalog failure decided after its catalog converged is resolved at once (the
    /// re-list came after the call). Bounded by [`MAX_CONVERGED`]; the oldest goes first.
    converged: FxHashMap<(Option<Arc<str>>, String), u64>,
}

/// Catalog convergences remembered for stale-catalog incidents decided late.
const MAX_CONVERGED: usize = 10_000;

/// The catalog scopes of an incident: `session:<hash>` of each session, else `agent:<name>`.
fn catalog_scopes(inc: &Incident) -> Vec<String> {
    if inc.sessions.is_empty() {
        inc.agents.iter().map(|a| format!("agent:{a}")).collect()
    } else {
        inc.sessions.iter().map(|h| format!("session:{h}")).collect()
    }
}

/// What a healthy call shows works again, as the keys an incident's cause is looked up by (one
/// per way a cause can match: see [`wanted_scope`] and [`shows`]); the value kept is the latest evidence end.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Scope {
    /// Any call of the server (a cause that names neither tool nor credential).
    Server,
    Tool(Arc<str>),
    Credential(Box<str>),
    ToolCredential(Arc<str>, Box<str>),
    /// For a stale catalog: tool, credential (`None`: any) and the session (or, where the protocol
    /// has none, the agent).
    Session(Option<Arc<str>>, Option<Box<str>>, Arc<str>),
    Agent(Option<Arc<str>>, Option<Box<str>>, Arc<str>),
}

/// One remembered scope of healthy calls and the latest evidence end that showed it (the store's
/// record of a server's recoveries is a list of these).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Recovery {
    pub scope: Scope,
    pub end_ns: u64,
}

/// The scopes a healthy call shows, each with the call's evidence end.
fn scopes_of(v: &IncidentFacts<'_>) -> Vec<Scope> {
    let mut out = vec![Scope::Server];
    if let Some(t) = &v.tool {
        out.push(Scope::Tool(t.clone()));
    }
    let credential: Option<Box<str>> = v.credential_hash.as_deref().map(Box::from);
    if let Some(c) = &credential {
        out.push(Scope::Credential(c.clone()));
        if let Some(t) = &v.tool {
            out.push(Scope::ToolCredential(t.clone(), c.clone()));
        }
    }
    let creds = std::iter::once(None).chain(credential.map(Some));
    for c in creds {
        match (&v.session_id_hash, &v.agent) {
            (Some(s), _) => out.push(Scope::Session(v.tool.clone(), c, s.clone())),
            (None, Some(a)) => out.push(Scope::Agent(v.tool.clone(), c, a.clone())),
            _ => {}
        }
    }
    out
}

/// A server's remembered scopes of healthy calls, each with its latest evidence end, and the
/// same ordered by that end: making room is taking the first, not a scan of all of them (with
/// more than [`MAX_RECOVERIES`] sessions a server, every healthy call of a new session scanned
/// 4096 entries).
///
/// The order is kept lazily: a scope's entry holds the end it had when the entry was made, at
/// most its latest. A healthy call of a known scope only raises its latest end (it was a removal
/// and an insertion in the order, most of a healthy call's fold); the entry is brought up to
/// date when it comes first while room is made. Each scope has exactly one entry, never later
/// than its latest end, so the first entry that is up to date is the scope with the oldest
/// evidence, as an order kept at once would give.
struct ServerRecoveries {
    latest: FxHashMap<Scope, u64>,
    /// One `(end, scope)` of every scope but [`Scope::Server`] (which is never the one to make
    /// room): `end` at most the scope's latest.
    order: std::collections::BTreeSet<(u64, Scope)>,
    /// Scopes kept ([`MAX_RECOVERIES`]; smaller in tests).
    cap: usize,
}

impl Default for ServerRecoveries {
    fn default() -> Self {
        ServerRecoveries { latest: FxHashMap::default(), order: Default::default(), cap: MAX_RECOVERIES }
    }
}

impl std::ops::Deref for ServerRecoveries {
    type Target = FxHashMap<Scope, u64>;
    fn deref(&self) -> &Self::Target {
        &self.latest
    }
}

impl ServerRecoveries {
    /// Keep `scope` at `end_ns` at least; a new scope past [`MAX_RECOVERIES`] first forgets the
    /// scope with the oldest evidence (never the server's own).
    fn note(&mut self, scope: Scope, end_ns: u64) {
        if let Some(e) = self.latest.get_mut(&scope) {
            *e = (*e).max(end_ns);
            return;
        }
        if self.latest.len() >= self.cap {
            self.forget_oldest();
        }
        if scope != Scope::Server {
            self.order.insert((end_ns, scope.clone()));
        }
        self.latest.insert(scope, end_ns);
    }

    /// Forget the scope with the oldest latest end (entries behind their scope's end are moved
    /// up on the way).
    fn forget_oldest(&mut self) {
        while let Some((end, scope)) = self.order.pop_first() {
            match self.latest.get(&scope) {
                Some(latest) if *latest > end => {
                    let latest = *latest;
                    self.order.insert((latest, scope));
                }
                _ => {
                    self.latest.remove(&scope);
                    return;
                }
            }
        }
    }
}

impl FromIterator<(Scope, u64)> for ServerRecoveries {
    fn from_iter<I: IntoIterator<Item = (Scope, u64)>>(iter: I) -> Self {
        let mut r = ServerRecoveries::default();
        for (scope, end) in iter {
            r.note(scope, end);
        }
        r
    }
}

const MAX_SET: usize = 64;
/// Resolved incidents kept per server (the latest resolutions).
const MAX_RESOLVED_PER_SERVER: usize = 256;
const MAX_OPEN: usize = 10_000;
/// Scopes of healthy calls kept per server, and servers kept.
const MAX_RECOVERIES: usize = 4096;
const MAX_RECOVERY_SERVERS: usize = 10_000;

/// An incident's stable id: a hash of its cause's canonical JSON (field order fixed by the type,
/// not by `Debug`), the same on every instance and across versions that keep the cause's fields.
pub(crate) fn incident_id(cause: &Cause) -> String {
    let canonical = serde_json::to_vec(cause).unwrap_or_default();
    crate::evidence::hash::hash_hex(&canonical)[..16].to_string()
}

/// The cause of a failing verdict.
pub(crate) fn cause_of(v: &Verdict) -> Option<Cause> {
    cause_of_facts(&IncidentFacts::of(v))
}

fn cause_of_facts(v: &IncidentFacts<'_>) -> Option<Cause> {
    if !v.state.is_failure() {
        return None;
    }
    let auth = v.state == HealthState::NeedsAuth;
    Some(Cause {
        first_failed_layer: v.first_failed_layer,
        state: v.state,
        server: v.server.clone(),
        error_class: v.reason.as_deref().map(str::to_owned),
        credential_hash: v.credential_hash.as_deref().map(Box::from),
        tool: if auth { None } else { v.tool.clone() },
    })
}

/// One server's part of the incident book: its open incidents and its recent healthy calls
/// (they resolve incidents decided later): the unit a store keeps (`state::incident_changes`) and
/// several instances fold into by compare-and-set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerIncidents {
    pub server: Option<Arc<str>>,
    pub open: Vec<Incident>,
    pub recent: Vec<Recovery>,
    /// Incidents resolved lately (a failure that ended before the resolution, decided later,
    /// belongs to the resolved incident, not to a new one).
    pub resolved: Vec<Incident>,
}

impl ServerIncidents {
    pub fn is_empty(&self) -> bool {
        self.open.is_empty() && self.recent.is_empty() && self.resolved.is_empty()
    }
}

/// A server's part of the book as a store holds it, taken back into the book.
#[derive(Debug)]
pub(crate) enum IncidentsBack {
    /// As the store holds it (loaded at start, or read for a fold on the store's thread).
    Stored(ServerIncidents),
    /// As a shared store's fold left it, with how many incidents that fold resolved: the fold's
    /// transitions are emitted from this instance, so its resolutions are counted here too.
    Folded { part: ServerIncidents, resolved: u64 },
}

impl IncidentBook {
    /// A store is attached: from now on the book records which servers' incidents change, for
    /// `state::incident_changes`.
    pub(crate) fn keep_for_store(&mut self) {
        self.track = true;
    }

    /// The servers whose incidents or recoveries changed since the last call (see
    /// `keep_for_store`); the store maps their parts to records (`state::incident_changes`).
    pub(crate) fn take_dirty_servers(&mut self) -> Vec<Option<Arc<str>>> {
        std::mem::take(&mut self.dirty).into_iter().collect()
    }

    /// The parts of the book that belong to `servers` (one scan of the open incidents), in the
    /// order of `servers`; incidents in id order, recoveries latest first.
    pub(crate) fn parts(&self, servers: &[Option<Arc<str>>]) -> Vec<ServerIncidents> {
        let index: FxHashMap<&Option<Arc<str>>, usize> = servers.iter().enumerate().map(|(i, s)| (s, i)).collect();
        let mut out: Vec<ServerIncidents> = servers.iter().map(|s| ServerIncidents { server: s.clone(), ..Default::default() }).collect();
        for inc in self.open.values() {
            if let Some(&i) = index.get(&inc.cause.server) {
                out[i].open.push(inc.clone());
            }
        }
        for inc in self.resolved.values() {
            if let Some(&i) = index.get(&inc.cause.server) {
                out[i].resolved.push(inc.clone());
            }
        }
        for part in &mut out {
            part.open.sort_by(|a, b| a.id.cmp(&b.id));
            part.resolved.sort_by(|a, b| a.id.cmp(&b.id));
            if let Some(m) = self.recoveries.get(&part.server) {
                part.recent = m.iter().map(|(scope, end_ns)| Recovery { scope: scope.clone(), end_ns: *end_ns }).collect();
                part.recent.sort_by(|a, b| b.end_ns.cmp(&a.end_ns).then_with(|| a.scope.cmp(&b.scope)));
            }
        }
        out
    }

    /// Put a server's part of the book back (see [`IncidentsBack`]), replacing what this book
    /// held of that server; within the book's bounds.
    pub(crate) fn restore(&mut self, back: IncidentsBack) {
        let part = match back {
            IncidentsBack::Stored(part) => part,
            IncidentsBack::Folded { part, resolved } => {
                self.resolved_total += resolved;
                part
            }
        };
        let server = part.server;
        self.open.retain(|c, _| c.server != server);
        self.resolved.retain(|c, _| c.server != server);
        let mut resolved = part.resolved;
        resolved.sort_by_key(|i| std::cmp::Reverse(i.last_evidence_ns));
        for inc in resolved.into_iter().take(MAX_RESOLVED_PER_SERVER) {
            if inc.cause.server == server {
                self.resolved.insert(inc.cause.clone(), inc);
            }
        }
        for inc in part.open {
            if inc.cause.server == server && (self.open.len() < MAX_OPEN || self.open.contains_key(&inc.cause)) {
                self.open.insert(inc.cause.clone(), inc);
            }
        }
        self.recoveries.remove(&server);
        if !part.recent.is_empty() && self.recoveries.len() < MAX_RECOVERY_SERVERS {
            let mut recent = part.recent;
            // Within the bound, the latest first.
            recent.sort_by_key(|r| std::cmp::Reverse(r.end_ns));
            recent.truncate(MAX_RECOVERIES);
            self.recoveries.insert(server, recent.into_iter().map(|r| (r.scope, r.end_ns)).collect());
        }
    }

    fn mark_open(&mut self, c: &Cause) {
        if self.track {
            self.dirty.insert(c.server.clone());
        }
    }

    fn mark_server(&mut self, s: &Option<Arc<str>>) {
        if self.track {
            self.dirty.insert(s.clone());
        }
    }

    pub(crate) fn open_incidents(&self) -> impl Iterator<Item = &Incident> {
        self.open.values()
    }

    /// Fold one verdict in; returns the incidents that changed, with their transition.
    pub(crate) fn observe(&mut self, v: &Verdict) -> Vec<(Transition, Incident)> {
        self.fold(&IncidentFacts::of(v))
    }

    /// Fold one verdict's facts in (the same as [`IncidentBook::observe`] of that verdict).
    pub(crate) fn fold(&mut self, v: &IncidentFacts<'_>) -> Vec<(Transition, Incident)> {
        let mut out = Vec::new();
        self.fold_into(v, &mut out);
        out
    }

    /// [`IncidentBook::fold`], the changed incidents appended to `out` (a fold of many verdicts
    /// grows one list, not a list per verdict).
    pub(crate) fn fold_into(&mut self, v: &IncidentFacts<'_>, out: &mut Vec<(Transition, Incident)>) {
        if let Some(cause) = cause_of_facts(v) {
            if !self.open.contains_key(&cause) && self.resolved.get(&cause).is_some_and(|r| v.end_ns <= r.last_evidence_ns) {
                // Ended before the incident of its cause was resolved: one of its failures.
                self.mark_open(&cause);
                if let Some(inc) = self.resolved.get_mut(&cause) {
                    count_failure(inc, v);
                    out.push((Transition::Updated, inc.clone()));
                }
                return;
            }
            let waiting = v.auth_flow_pending;
            let state = if waiting { IncidentState::Waiting } else { IncidentState::Open };
            let transition = if self.open.contains_key(&cause) { Transition::Updated } else { Transition::Opened };
            if transition == Transition::Opened && self.open.len() >= MAX_OPEN {
                // Bounded: the stalest incident makes room (it stays counted as resolved-by-eviction).
                if let Some(k) = self.open.iter().min_by_key(|(_, i)| i.last_evidence_ns).map(|(k, _)| k.clone()) {
                    self.open.remove(&k);
                    self.mark_open(&k);
                }
            }
            self.mark_open(&cause);
            // The cause is copied (as the incident's key and its own) and the id (a hash of the
            // cause) made only for a new incident, not for every failing call.
            let inc = match self.open.entry(cause) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    let cause = e.key().clone();
                    e.insert(Incident {
                        id: incident_id(&cause),
                        cause,
                        state,
                        agents: Arc::default(),
                        calls: 0,
                        sessions: Arc::default(),
                        retry_count: 0,
                        first_evidence_ns: v.start_ns,
                        last_evidence_ns: v.end_ns,
                        confidence: v.confidence,
                        required_authority: None,
                        verifier_result: None,
                        next_action: v.next_action.to_string(),
                    })
                }
            };
            inc.state = state;
            count_failure(inc, v);
            inc.last_evidence_ns = inc.last_evidence_ns.max(v.end_ns);
            if inc.next_action != v.next_action {
                inc.next_action = v.next_action.to_string();
            }
            if v.outcome_decided {
                inc.verifier_result = Some(outcome_word(v));
            }
            out.push((transition, inc.clone()));
            // Decided after a healthy call of its scope that ended later: already recovered.
            let recovered =
                self.recoveries.get(&inc.cause.server).and_then(|rs| latest_recovery(inc, rs)).filter(|end| *end >= inc.last_evidence_ns);
            // A stale catalog that converged after this call: the re-list already answered it.
            let converged = (inc.cause.state == HealthState::StaleCatalog)
                .then(|| {
                    catalog_scopes(inc)
                        .into_iter()
                        .filter_map(|sc| self.converged.get(&(inc.cause.server.clone(), sc)).copied())
                        .max()
                        .filter(|end| *end >= inc.last_evidence_ns)
                })
                .flatten();
            if let Some(end_ns) = recovered.or(converged) {
                let key = inc.cause.clone();
                if let Some(inc) = self.open.remove(&key) {
                    out.push(self.resolve(inc, end_ns));
                }
            }
            return;
        }
        // A verdict that passed: it resolves incidents of its scope only when the outcome was
        // observed (healthy). An unverified success is not enough.
        if v.state != HealthState::Healthy {
            return;
        }
        let scopes = scopes_of(v);
        let resolved: Vec<Cause> = self
            .open
            .iter()
            .filter(|(c, inc)| c.server == v.server && inc.last_evidence_ns <= v.end_ns && shows(v, inc))
            .map(|(c, _)| c.clone())
            .collect();
        for c in resolved {
            if let Some(inc) = self.open.remove(&c) {
                out.push(self.resolve(inc, v.end_ns));
            }
        }
        self.remember(v.server.clone(), scopes, v.end_ns);
    }

    /// A session's catalog converged at `at_ns` (a complete re-list after the signal or the
    /// expired TTL, installed as discovered): the stale-catalog incidents of that session (or,
    /// where the protocol has no session, of that agent) on that server are resolved. Their
    /// failed layer was the catalog, and the catalog is now known fresh; a call on it is judged
    /// on its own.
    pub(crate) fn catalog_converged(
        &mut self,
        server: Option<&Arc<str>>,
        session_hash: Option<&str>,
        agent: Option<&str>,
        at_ns: u64,
    ) -> Vec<(Transition, Incident)> {
        let scope = match (session_hash, agent) {
            (Some(h), _) => format!("session:{h}"),
            (None, Some(a)) => format!("agent:{a}"),
            (None, None) => return Vec::new(),
        };
        if self.converged.len() >= MAX_CONVERGED && !self.converged.contains_key(&(server.cloned(), scope.clone())) {
            if let Some(k) = self.converged.iter().min_by(|a, b| a.1.cmp(b.1).then_with(|| a.0.cmp(b.0))).map(|(k, _)| k.clone()) {
                self.converged.remove(&k);
            }
        }
        let at = self.converged.entry((server.cloned(), scope.clone())).or_insert(at_ns);
        *at = (*at).max(at_ns);
        let mine = |inc: &Incident| catalog_scopes(inc).contains(&scope);
        let done: Vec<Cause> = self
            .open
            .iter()
            .filter(|(c, inc)| {
                c.state == HealthState::StaleCatalog && c.server.as_ref() == server && inc.last_evidence_ns <= at_ns && mine(inc)
            })
            .map(|(c, _)| c.clone())
            .collect();
        let mut out = Vec::new();
        for c in done {
            if let Some(inc) = self.open.remove(&c) {
                out.push(self.resolve(inc, at_ns));
            }
        }
        out
    }

    fn resolve(&mut self, mut inc: Incident, end_ns: u64) -> (Transition, Incident) {
        self.mark_open(&inc.cause);
        inc.state = IncidentState::Resolved;
        inc.last_evidence_ns = inc.last_evidence_ns.max(end_ns);
        inc.verifier_result = Some(VerifierResult::Confirmed);
        self.resolved_total += 1;
        self.keep_resolved(inc.clone());
        (Transition::Resolved, inc)
    }

    /// Keep a resolved incident, within [`MAX_RESOLVED_PER_SERVER`] of its server (the oldest
    /// resolution makes room).
    fn keep_resolved(&mut self, inc: Incident) {
        let server = inc.cause.server.clone();
        let same: Vec<(&Cause, u64)> =
            self.resolved.iter().filter(|(c, _)| c.server == server && **c != inc.cause).map(|(c, i)| (c, i.last_evidence_ns)).collect();
        if same.len() >= MAX_RESOLVED_PER_SERVER {
            if let Some(oldest) = same.iter().min_by_key(|(_, end)| *end).map(|(c, _)| (*c).clone()) {
                self.resolved.remove(&oldest);
            }
        }
        self.resolved.insert(inc.cause.clone(), inc);
    }

    /// Keep the scopes of a healthy call (bounded per server and in servers; what makes room is
    /// the oldest evidence).
    fn remember(&mut self, server: Option<Arc<str>>, scopes: Vec<Scope>, end_ns: u64) {
        self.mark_server(&server);
        if !self.recoveries.contains_key(&server) && self.recoveries.len() >= MAX_RECOVERY_SERVERS {
            let oldest = self.recoveries.iter().min_by_key(|(_, m)| m.get(&Scope::Server).copied().unwrap_or(0)).map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                self.recoveries.remove(&k);
                self.mark_server(&k);
            }
        }
        let m = self.recoveries.entry(server).or_default();
        for sc in scopes {
            m.note(sc, end_ns);
        }
    }
}

/// The scope a healthy call must show to resolve the incident (the server is matched apart).
/// Same tool, unless the incident is per credential. When the incident names a credential, the
/// call must name the same one: a call that names none shows nothing about it.
fn wanted_scope(inc: &Incident) -> Scope {
    let c = &inc.cause;
    match (&c.tool, &c.credential_hash) {
        (None, None) => Scope::Server,
        (Some(t), None) => Scope::Tool(t.clone()),
        (None, Some(k)) => Scope::Credential(k.clone()),
        (Some(t), Some(k)) => Scope::ToolCredential(t.clone(), k.clone()),
    }
}

/// Does healthy call `v` show the incident's failure is gone? (The server is matched apart.) The
/// same rule as [`wanted_scope`] plus, for a stale catalog, the session: a stale catalog is a
/// session's, so the call must be of one of the incident's sessions (or, where the protocol has
/// none, of one of its agents). Missing evidence never resolves.
fn shows(v: &IncidentFacts<'_>, inc: &Incident) -> bool {
    let c = &inc.cause;
    let tool = c.tool.is_none() || c.tool == v.tool;
    let credential = c.credential_hash.is_none() || c.credential_hash.as_deref() == v.credential_hash.as_deref();
    let session = c.state != HealthState::StaleCatalog
        || match (&v.session_id_hash, &v.agent) {
            (Some(s), _) => inc.sessions.contains(&**s),
            (None, Some(a)) => inc.sessions.is_empty() && inc.agents.contains(a),
            (None, None) => false,
        };
    tool && credential && session
}

/// The latest evidence end of a healthy call that resolves `inc`, among a server's scopes.
fn latest_recovery(inc: &Incident, m: &FxHashMap<Scope, u64>) -> Option<u64> {
    if inc.cause.state != HealthState::StaleCatalog {
        return m.get(&wanted_scope(inc)).copied();
    }
    // A session's scope holds its tool and credential too: one call showed all of it.
    let (tool, cred) = (&inc.cause.tool, &inc.cause.credential_hash);
    let by_session =
        inc.sessions.iter().filter_map(|s| m.get(&Scope::Session(tool.clone(), cred.clone(), Arc::from(s.as_str())))).max().copied();
    let by_agent = if inc.sessions.is_empty() {
        inc.agents.iter().filter_map(|a| m.get(&Scope::Agent(tool.clone(), cred.clone(), a.clone()))).max().copied()
    } else {
        None
    };
    by_session.or(by_agent)
}

/// Count one more failing call in `inc` (its impact, retries, first evidence, agents, sessions,
/// authority); the caller moves its state and last evidence.
fn count_failure(inc: &mut Incident, v: &IncidentFacts<'_>) {
    inc.calls += 1;
    inc.retry_count += 1;
    inc.first_evidence_ns = inc.first_evidence_ns.min(v.start_ns);
    inc.confidence = inc.confidence.max(v.confidence);
    // Looked up before `make_mut`, which copies a set other rows share.
    if let Some(a) = &v.agent {
        if inc.agents.len() < MAX_SET && !inc.agents.contains(a) {
            Arc::make_mut(&mut inc.agents).insert(a.clone());
        }
    }
    if let Some(s) = &v.session_id_hash {
        if inc.sessions.len() < MAX_SET && !inc.sessions.contains(&**s) {
            Arc::make_mut(&mut inc.sessions).insert(s.to_string());
        }
    }
    if let Some(scope) = &v.required_scope {
        inc.required_authority = Some(Box::from(&**scope));
    }
}

fn outcome_word(v: &IncidentFacts<'_>) -> VerifierResult {
    match (v.state, v.outcome) {
        (HealthState::FalseSuccess, _) => VerifierResult::FailedOrMissing,
        (_, LayerStatus::Passed) => VerifierResult::Confirmed,
        _ => VerifierResult::Unobserved,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::{DecidedBy, LayerStatus, Layers};

    /// A server's stored recoveries keep their form: a session scope written when its session
    /// was a `String` (0.2.0 before the session hash was shared) reads back, and is written the
    /// same, in both stored encodings.
    #[test]
    fn a_session_scope_is_stored_as_before_the_session_hash_was_shared() {
        #[derive(Serialize)]
        #[allow(dead_code)]
        enum Before {
            Server,
            Tool(Arc<str>),
            Credential(Box<str>),
            ToolCredential(Arc<str>, Box<str>),
            Session(Option<Arc<str>>, Option<Box<str>>, String),
            Agent(Option<Arc<str>>, Option<Box<str>>, Arc<str>),
        }
        let before = Before::Session(Some("read_ticket".into()), Some("cred".into()), "sess-hash".to_string());
        let now = Scope::Session(Some("read_ticket".into()), Some("cred".into()), "sess-hash".into());
        let bytes = postcard::to_stdvec(&before).expect("postcard");
        assert_eq!(postcard::from_bytes::<Scope>(&bytes).expect("reads"), now);
        assert_eq!(postcard::to_stdvec(&now).expect("postcard"), bytes);
        let json = serde_json::to_string(&before).expect("json");
        assert_eq!(serde_json::from_str::<Scope>(&json).expect("reads"), now);
        assert_eq!(serde_json::to_string(&now).expect("json"), json);
    }

    /// Past MAX_RECOVERIES scopes a server forgets the scope with the oldest evidence, never its
    /// own: the same rule as the scan it replaced, found in order instead.
    #[test]
    fn a_server_with_more_sessions_than_the_bound_forgets_the_oldest() {
        let mut r = ServerRecoveries::default();
        r.note(Scope::Server, 1);
        for n in 0..(MAX_RECOVERIES as u64 + 10) {
            r.note(Scope::Session(None, None, format!("s{n}").into()), 100 + n);
            r.note(Scope::Server, 100 + n);
        }
        assert_eq!(r.len(), MAX_RECOVERIES);
        assert_eq!(r.get(&Scope::Server), Some(&(100 + MAX_RECOVERIES as u64 + 9)), "the server's own is kept and latest");
        assert_eq!(r.get(&Scope::Session(None, None, "s10".into())), None, "the oldest sessions made room");
        assert!(r.get(&Scope::Session(None, None, "s11".into())).is_some());
        // A later call of a kept session moves it last: then it is not the next to go.
        r.note(Scope::Session(None, None, "s11".into()), 1_000_000);
        r.note(Scope::Session(None, None, "new".into()), 1_000_001);
        assert!(r.get(&Scope::Session(None, None, "s11".into())).is_some());
        assert_eq!(r.get(&Scope::Session(None, None, "s12".into())), None);
        assert_eq!(r.order.len() + 1, r.len(), "every scope but the server's is in the order");
    }

    proptest::proptest! {
        /// The order kept lazily forgets what an order kept at once would: the scope with the
        /// oldest latest end (ties by scope), never the server's own, for any sequence of
        /// healthy calls of known and new scopes.
        #[test]
        fn recoveries_kept_lazily_forget_what_an_eager_order_would(cap in 1usize..6, calls in proptest::collection::vec((0u8..10, 0u64..40), 0..150)) {
            let mut r = ServerRecoveries { cap, ..Default::default() };
            let mut latest: std::collections::HashMap<Scope, u64> = Default::default();
            let scope = |i: u8| if i == 0 { Scope::Server } else { Scope::Session(None, None, format!("s{i}").into()) };
            for (i, end) in calls {
                let sc = scope(i);
                r.note(sc.clone(), end);
                match latest.get_mut(&sc) {
                    Some(e) => *e = (*e).max(end),
                    None => {
                        if latest.len() >= cap {
                            let oldest = latest.iter().filter(|(s, _)| **s != Scope::Server).map(|(s, e)| (*e, s.clone())).min();
                            if let Some((_, s)) = oldest {
                                latest.remove(&s);
                            }
                        }
                        latest.insert(sc, end);
                    }
                }
                let mut got: Vec<(Scope, u64)> = r.latest.iter().map(|(s, e)| (s.clone(), *e)).collect();
                let mut want: Vec<(Scope, u64)> = latest.iter().map(|(s, e)| (s.clone(), *e)).collect();
                got.sort();
                want.sort();
                proptest::prop_assert_eq!(got, want);
                proptest::prop_assert_eq!(r.order.len() + usize::from(r.latest.contains_key(&Scope::Server)), r.latest.len());
            }
        }
    }

    fn verdict(state: HealthState, layer: Option<Layer>, tool: &str, reason: Option<&str>) -> Verdict {
        let mut layers = [LayerStatus::Passed; 5];
        if let Some(l) = layer {
            layers[l as usize] = LayerStatus::Failed;
            for s in layers.iter_mut().skip(l as usize + 1) {
                *s = LayerStatus::Unobserved;
            }
        }
        if state == HealthState::Unverified {
            layers[4] = LayerStatus::Unobserved;
        }
        Verdict {
            trace_id: [1; 16],
            span_id: [2; 8],
            method: Some("tools/call".into()),
            tool: Some(Arc::from(tool)),
            server: Some(Arc::from("tickets:443")),
            request_id: None,
            session_id_hash: Some("s1".into()),
            first_failed_layer: layer,
            layers: Layers(layers),
            state,
            reason: reason.map(str::to_string),
            confidence: Confidence::High,
            next_action: "x".into(),
            retry_safe: true,
            protocol_success: false,
            verified_success: state == HealthState::Healthy,
            required_scope: None,
            progress: None,
            credential_hash: Some("cred-a".into()),
            auth_flow_pending: false,
            agent: Some(Arc::from("agent")),
            contract_changes: vec![],
            outcome_method: (state == HealthState::Healthy).then_some("receipt"),
            revision: 0,
            supersedes: None,
            decided_by: DecidedBy::Quiet,
            partial: None,
            start_ns: 10,
            end_ns: 20,
            ..crate::verdict::sample("tools/call", false, false)
        }
    }

    fn expired() -> Verdict {
        verdict(HealthState::NeedsAuth, Some(Layer::Authorization), "create_ticket", Some("invalid_token"))
    }

    /// A shared store folds the facts held of each verdict (copied without a passing verdict's
    /// failure fields): the same transitions and the same book as observing the verdicts.
    #[test]
    fn held_facts_fold_as_the_verdicts_do() {
        let mut stale = verdict(HealthState::StaleCatalog, Some(Layer::Protocol), "read_ticket", Some("stale"));
        stale.required_scope = Some("tickets:read".into());
        let mut other_cred = at(verdict(HealthState::Healthy, None, "create_ticket", None), 55, 56);
        other_cred.credential_hash = Some("cred-b".into());
        let mut no_session = at(verdict(HealthState::Healthy, None, "read_ticket", None), 90, 95);
        no_session.session_id_hash = None;
        let mut pending = at(expired(), 100, 110);
        pending.auth_flow_pending = true;
        let unverified = at(verdict(HealthState::Unverified, None, "create_ticket", None), 45, 47);
        let all = [
            at(expired(), 10, 20),
            at(stale.clone(), 12, 22),
            at(verdict(HealthState::ToolFailed, Some(Layer::Execution), "create_ticket", Some("tool_error")), 30, 40),
            unverified,
            other_cred,
            at(verdict(HealthState::Healthy, None, "create_ticket", None), 60, 70),
            at(stale, 80, 85),
            no_session,
            pending,
            at(verdict(HealthState::Healthy, None, "read_ticket", None), 120, 130),
        ];
        let (mut seen, mut held) = (IncidentBook::default(), IncidentBook::default());
        for v in &all {
            let a = seen.observe(v);
            let b = held.fold(&IncidentFacts::held(v));
            assert_eq!(a, b, "{:?} {:?}", v.state, v.tool);
        }
        assert!(seen.resolved_total > 0, "the sequence opens and resolves incidents");
        let servers: Vec<Option<Arc<str>>> = vec![all[0].server.clone()];
        let parts = seen.parts(&servers);
        assert!(!parts[0].is_empty(), "the book holds the server's incidents and recoveries");
        assert_eq!(parts, held.parts(&servers));
    }

    #[test]
    fn five_failures_on_one_expired_credential_are_one_incident() {
        let mut book = IncidentBook::default();
        let mut transitions = Vec::new();
        for tool in ["create_ticket", "read_ticket", "create_ticket", "close_ticket", "read_ticket"] {
            let mut v = expired();
            v.tool = Some(Arc::from(tool));
            transitions.extend(book.observe(&v).into_iter().map(|(t, _)| t));
        }
        assert_eq!(
            transitions,
            vec![Transition::Opened, Transition::Updated, Transition::Updated, Transition::Updated, Transition::Updated]
        );
        let open: Vec<&Incident> = book.open_incidents().collect();
        assert_eq!(open.len(), 1);
        assert_eq!(open[0].retry_count, 5);
        assert_eq!(open[0].cause.first_failed_layer, Some(Layer::Authorization));
        assert_eq!(open[0].cause.tool, None, "per credential, not per tool");
    }

    #[test]
    fn a_successful_retry_alone_does_not_resolve_only_an_observed_outcome_does() {
        let mut book = IncidentBook::default();
        for _ in 0..5 {
            book.observe(&expired());
        }
        // The credential was refreshed: the call passes authorization, but nobody verified it.
        let retry = verdict(HealthState::Unverified, None, "create_ticket", None);
        assert!(book.observe(&retry).is_empty());
        assert_eq!(book.open_incidents().count(), 1, "still open: outcome not observed");
        // A healthy call (outcome confirmed) on another server resolves nothing here.
        let mut elsewhere = verdict(HealthState::Healthy, None, "create_ticket", None);
        elsewhere.server = Some(Arc::from("other:443"));
        assert!(book.observe(&elsewhere).is_empty());
        // A healthy call with another credential does not show this credential works.
        let mut other_cred = verdict(HealthState::Healthy, None, "create_ticket", None);
        other_cred.credential_hash = Some("cred-b".into());
        assert!(book.observe(&other_cred).is_empty());
        // The same server and credential, outcome confirmed: resolved.
        let ok = verdict(HealthState::Healthy, None, "create_ticket", None);
        let t = book.observe(&ok);
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].0, Transition::Resolved);
        assert_eq!(t[0].1.state, IncidentState::Resolved);
        assert_eq!(book.open_incidents().count(), 0);
    }

    #[test]
    fn causes_split_by_layer_class_and_tool_and_waiting_is_not_open() {
        let mut book = IncidentBook::default();
        book.observe(&verdict(HealthState::ToolFailed, Some(Layer::Execution), "a", Some("tool_error")));
        book.observe(&verdict(HealthState::ToolFailed, Some(Layer::Execution), "b", Some("tool_error")));
        book.observe(&verdict(HealthState::ToolFailed, Some(Layer::Execution), "a", Some("tool_timeout")));
        book.observe(&verdict(HealthState::TransportFailed, Some(Layer::Transport), "a", Some("connection_refused")));
        assert_eq!(book.open_incidents().count(), 4);
        let mut w = expired();
        w.auth_flow_pending = true;
        let t = book.observe(&w);
        assert_eq!(t[0].1.state, IncidentState::Waiting);
        // Working, unverified and healthy never open an incident.
        for s in [HealthState::Working, HealthState::Unverified] {
            assert!(book.observe(&verdict(s, None, "z", None)).is_empty());
        }
        assert_eq!(book.open_incidents().count(), 5);
    }

    fn open_ids(book: &IncidentBook) -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = book.open_incidents().map(|i| (i.id.clone(), i.last_evidence_ns)).collect();
        v.sort();
        v
    }

    fn at(mut v: Verdict, start: u64, end: u64) -> Verdict {
        v.start_ns = start;
        v.end_ns = end;
        v
    }

    /// Issue 8, defect 4: the open incidents do not depend on the order verdicts are decided in.
    /// A failure before a healthy call of its scope is resolved by it; one after it stays open.
    #[test]
    fn open_incidents_are_the_same_in_every_decision_order() {
        let healthy = at(verdict(HealthState::Healthy, None, "create_ticket", None), 40, 50);
        let early = at(expired(), 10, 20);
        let late = at(verdict(HealthState::ToolFailed, Some(Layer::Execution), "create_ticket", Some("tool_error")), 60, 70);
        let early_tool = at(verdict(HealthState::ToolFailed, Some(Layer::Execution), "create_ticket", Some("tool_error")), 5, 8);
        let all = [early, healthy, late, early_tool];
        let mut seen = None;
        // Every permutation of the four decisions.
        let mut idx = [0usize, 1, 2, 3];
        let mut perms = vec![idx];
        while next_permutation(&mut idx) {
            perms.push(idx);
        }
        assert_eq!(perms.len(), 24);
        for p in perms {
            let mut book = IncidentBook::default();
            for i in p {
                book.observe(&all[i]);
            }
            let open = open_ids(&book);
            assert_eq!(open.len(), 1, "only the failure after the healthy call stays open: {p:?}");
            assert_eq!(open[0].1, 70);
            match &seen {
                None => seen = Some(open),
                Some(s) => assert_eq!(s, &open, "order {p:?}"),
            }
        }
    }

    /// Issue 12: on several instances the healthy call that resolves an incident may be folded
    /// before failures that ended before it. Those failures count in the resolved incident
    /// (`updated`), so every decision order gives one incident, opened once, resolved once, with
    /// every failure counted — the one process's incident.
    #[test]
    fn failures_before_a_resolution_count_in_the_resolved_incident_in_every_order() {
        let tool_failed = || verdict(HealthState::ToolFailed, Some(Layer::Execution), "create_ticket", Some("tool_error"));
        let all =
            [at(tool_failed(), 10, 20), at(tool_failed(), 30, 40), at(verdict(HealthState::Healthy, None, "create_ticket", None), 50, 60)];
        let mut idx = [0usize, 1, 2];
        let mut perms = vec![idx];
        while next_permutation(&mut idx) {
            perms.push(idx);
        }
        assert_eq!(perms.len(), 6);
        for p in perms {
            let mut book = IncidentBook::default();
            let mut ts = Vec::new();
            for i in p {
                ts.extend(book.observe(&all[i]));
            }
            let count = |t: Transition| ts.iter().filter(|(x, _)| *x == t).count();
            assert_eq!((count(Transition::Opened), count(Transition::Resolved)), (1, 1), "order {p:?}: {ts:?}");
            assert_eq!(ts.iter().map(|(_, i)| i.retry_count).max(), Some(2), "order {p:?}: both failures counted");
            assert_eq!(book.open_incidents().count(), 0, "order {p:?}");
        }
        // A failure that ended after the resolution is a new incident of the same cause (same id).
        let mut book = IncidentBook::default();
        for v in &all {
            book.observe(v);
        }
        let t = book.observe(&at(tool_failed(), 70, 80));
        assert_eq!(t.iter().map(|(x, _)| *x).collect::<Vec<_>>(), vec![Transition::Opened]);
        assert_eq!(t[0].1.retry_count, 1);
    }

    fn next_permutation(a: &mut [usize]) -> bool {
        let Some(i) = (1..a.len()).rev().find(|&i| a[i - 1] < a[i]) else { return false };
        let j = (i..a.len()).rev().find(|&j| a[j] > a[i - 1]).unwrap_or(i);
        a.swap(i - 1, j);
        a[i..].reverse();
        true
    }

    /// Issue 8, defect 4: only matching evidence resolves. A healthy call that names no credential
    /// shows nothing about an expired one; another session's healthy call shows nothing about this
    /// session's stale catalog.
    #[test]
    fn only_matching_evidence_resolves() {
        let mut book = IncidentBook::default();
        book.observe(&expired());
        let mut anonymous = at(verdict(HealthState::Healthy, None, "create_ticket", None), 30, 40);
        anonymous.credential_hash = None;
        assert!(book.observe(&anonymous).is_empty(), "no credential named: nothing shown");
        assert_eq!(book.open_incidents().count(), 1);

        let mut book = IncidentBook::default();
        let stale = verdict(HealthState::StaleCatalog, None, "create_ticket", Some("catalog_stale"));
        book.observe(&stale);
        let mut other_session = at(verdict(HealthState::Healthy, None, "create_ticket", None), 30, 40);
        other_session.session_id_hash = Some("s2".into());
        assert!(book.observe(&other_session).is_empty(), "another session's catalog says nothing of s1's");
        let same_session = at(verdict(HealthState::Healthy, None, "create_ticket", None), 30, 40);
        assert_eq!(book.observe(&same_session).first().map(|t| t.0), Some(Transition::Resolved));
    }

    #[test]
    fn the_incident_id_is_a_hash_of_the_canonical_cause() {
        let c = cause_of(&expired()).unwrap();
        assert_eq!(incident_id(&c), incident_id(&c.clone()));
        assert_eq!(incident_id(&c).len(), 16);
        let mut other = c.clone();
        other.server = Some(Arc::from("x:1"));
        assert_ne!(incident_id(&c), incident_id(&other));
    }
}
