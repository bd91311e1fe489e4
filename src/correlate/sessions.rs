//! Session state that outlives one trace: each session's catalog timeline (signals, `tools/list`
//! pages, installs, capability, reconnects), keyed by `mcp.session.id` or, where the protocol has
//! no session, by client identity + server identity. Bounded in sessions and in events per session,
//! and expired when idle.

use crate::evidence::time::Moment;
use std::sync::Arc;
use std::time::Duration;

use rustc_hash::FxHashMap;

use crate::classify::catalog::{convergence, CatalogEvent, CatalogEventKind, CatalogVerdict, Convergence, RefreshPolicy};
use crate::evidence::{Method, SpanEvidence};

use super::outbox::{KeptSession, ReadBack, SessionBack};

/// Bounds of the session table.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionLimits {
    pub max_sessions: usize,
    pub max_events_per_session: usize,
    pub idle_expiry: Duration,
    pub refresh_policy: RefreshPolicy,
}

impl Default for SessionLimits {
    fn default() -> Self {
        SessionLimits {
            max_sessions: 100_000,
            max_events_per_session: 512,
            idle_expiry: Duration::from_secs(3600),
            refresh_policy: RefreshPolicy::None,
        }
    }
}

struct SessionState {
    events: Vec<CatalogEvent>,
    /// Request ids of pages already recorded (client and server report the same page).
    page_requests: Vec<Box<str>>,
    last_seen: Moment,
    last: Option<Convergence>,
    /// Latest span time of the session (calls included): the moment its current verdict is for.
    last_activity_ns: u64,
    server: Option<Arc<str>>,
    trace_id: [u8; 16],
    span_id: [u8; 8],
    /// A page of this session carried a TTL: its verdict can change with time alone.
    has_ttl: bool,
    /// The convergence last emitted for it (on a shared store, by any instance).
    emitted: Option<Convergence>,
    /// The protocol revision its spans spoke (the latest that said); not stored: a session taken
    /// back from the store reads it from its events.
    revision: crate::evidence::ProtocolRevision,
    /// The exact dated version its spans last named (`2026-12-15`), not stored either.
    version: Option<Arc<str>>,
    /// The discovered digest of the last catalog line emitted from new evidence (not stored).
    last_discovered: Option<String>,
}

/// What a stored session's events say of its revision: only 2026-07-28 has listen streams and
/// TTLs on list results.
fn revision_of_events(events: &[CatalogEvent]) -> crate::evidence::ProtocolRevision {
    let stateless = events.iter().any(|e| match &e.kind {
        CatalogEventKind::Listen(_) => true,
        CatalogEventKind::Page { page, .. } => page.ttl_ms.is_some(),
        _ => false,
    });
    if stateless {
        crate::evidence::ProtocolRevision::Stateless
    } else {
        crate::evidence::ProtocolRevision::Unknown
    }
}

impl SessionState {
    /// A session seen only through `initialize` has no catalog to judge yet.
    fn has_catalog_evidence(&self) -> bool {
        self.events.iter().any(|e| !matches!(e.kind, CatalogEventKind::Reconnect))
    }
}

/// A tool definition seen on a `tools/list` page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Discovery {
    pub server: Arc<str>,
    pub tool: Arc<str>,
    pub digest: Arc<str>,
    pub at_ns: u64,
}

/// A session whose catalog verdict changed.
#[derive(Clone, Debug)]
pub struct CatalogChange {
    pub session_key: String,
    pub server: Option<Arc<str>>,
    /// The protocol revision the session's evidence spoke.
    pub revision: crate::evidence::ProtocolRevision,
    /// The exact dated version it last named, when one did (beside its family, `revision`).
    pub version: Option<Arc<str>>,
    pub verdict: CatalogVerdict,
    /// The span that caused the change (the health span goes in its trace).
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub at_ns: u64,
}

/// The session table.
pub struct Sessions {
    limits: SessionLimits,
    map: FxHashMap<String, SessionState>,
    pub expired: u64,
    /// Sessions another instance's evidence (read from a shared store) added to.
    pub merges: u64,
    /// Record which sessions change, for the state store.
    track: bool,
    dirty: rustc_hash::FxHashSet<String>,
    /// Sessions another instance's evidence added to since their verdict was last checked.
    merged: rustc_hash::FxHashSet<String>,
}

impl Sessions {
    pub fn new(limits: SessionLimits) -> Self {
        Sessions {
            limits,
            map: FxHashMap::default(),
            expired: 0,
            merges: 0,
            track: false,
            dirty: Default::default(),
            merged: Default::default(),
        }
    }

    /// A store is attached: from now on the table records which sessions change, for
    /// [`Sessions::take_changes`].
    pub(crate) fn keep_for_store(&mut self) {
        self.track = true;
    }

    fn mark(&mut self, key: &str) {
        if self.track && !self.dirty.contains(key) {
            self.dirty.insert(key.to_string());
        }
    }

    /// What a store tells the table back (see [`SessionBack`]).
    pub(crate) fn restore(&mut self, back: SessionBack) {
        match back {
            SessionBack::Loaded(key, kept) => self.put_back(key, kept),
            SessionBack::Merged(key, kept) => {
                if self.merge(key, kept) {
                    self.merges += 1;
                }
            }
            SessionBack::WriteAgain(key) => {
                if self.map.contains_key(key) {
                    self.mark(key);
                }
            }
            SessionBack::Emitted(key, c) => {
                if let Some(st) = self.map.get_mut(key) {
                    st.emitted = c;
                    self.mark(key);
                }
            }
        }
    }

    /// The sessions changed since the last call, as the store is to keep them (`None`: forgotten
    /// here, to delete).
    pub(crate) fn take_changes(&mut self) -> Vec<(String, Option<KeptSession>)> {
        let mut out = Vec::with_capacity(self.dirty.len());
        for key in std::mem::take(&mut self.dirty) {
            match self.map.get(&key) {
                Some(st) => {
                    let kept = KeptSession {
                        events: st.events.clone(),
                        page_requests: st.page_requests.clone(),
                        last_seen_ns: st.last_seen.as_nanos(),
                        last: st.last,
                        last_activity_ns: st.last_activity_ns,
                        server: st.server.clone(),
                        trace_id: st.trace_id,
                        span_id: st.span_id,
                        has_ttl: st.has_ttl,
                        emitted: st.emitted,
                    };
                    out.push((key, Some(kept)));
                }
                None => out.push((key, None)),
            }
        }
        out
    }

    /// Take back a session from the store, within the same bound.
    fn put_back(&mut self, key: String, r: KeptSession) {
        if !self.map.contains_key(&key) && self.map.len() >= self.limits.max_sessions {
            return;
        }
        let revision = revision_of_events(&r.events);
        let st = SessionState {
            events: r.events,
            page_requests: r.page_requests,
            last_seen: Moment::from_nanos(r.last_seen_ns),
            last: r.last,
            last_activity_ns: r.last_activity_ns,
            server: r.server,
            trace_id: r.trace_id,
            span_id: r.span_id,
            has_ttl: r.has_ttl,
            emitted: r.emitted,
            revision,
            version: None,
            last_discovered: None,
        };
        self.map.insert(key, st);
    }

    /// Merge a session as another instance wrote it to a shared store: the events and page
    /// requests of both (the evidence of the traces that went elsewhere), the later activity.
    /// True if it brought anything this table lacked (then the union is written back).
    fn merge(&mut self, key: &str, r: KeptSession) -> bool {
        let Some(st) = self.map.get_mut(key) else {
            if self.map.len() >= self.limits.max_sessions {
                return false;
            }
            self.put_back(key.to_string(), r);
            return true;
        };
        let before = st.events.len();
        st.events.extend(r.events);
        // Sorted by time, then equal neighbours dropped: both sides hold the events they shared.
        st.events.sort_by_key(|e| e.at_ns);
        st.events.dedup();
        let new = st.events.len() > before;
        for p in r.page_requests {
            if !st.page_requests.contains(&p) {
                st.page_requests.push(p);
            }
        }
        let cap = self.limits.max_events_per_session;
        if st.events.len() > cap {
            let drop = st.events.len() - cap;
            st.events.drain(..drop);
        }
        if st.page_requests.len() > cap {
            st.page_requests.drain(..cap / 2);
        }
        st.last_activity_ns = st.last_activity_ns.max(r.last_activity_ns);
        st.has_ttl |= r.has_ttl;
        // What was emitted is the store's to say (the instance that emitted wrote it).
        st.emitted = r.emitted;
        if st.server.is_none() {
            st.server = r.server;
        }
        if new {
            self.mark(key);
            self.merged.insert(key.to_string());
        }
        new
    }

    /// The verdicts that merged evidence changed (see [`SessionBack::Merged`]), as catalog changes.
    pub fn take_merged_changes(&mut self) -> Vec<CatalogChange> {
        let policy = self.limits.refresh_policy;
        let mut changes = Vec::new();
        for key in std::mem::take(&mut self.merged) {
            let Some(st) = self.map.get_mut(&key) else { continue };
            if !st.has_catalog_evidence() {
                continue;
            }
            let latest = st.events.iter().map(|e| e.at_ns).max().unwrap_or(0).max(st.last_activity_ns);
            let v = convergence(&st.events, policy, latest);
            if st.last != Some(v.convergence) {
                st.last = Some(v.convergence);
                changes.push(CatalogChange {
                    session_key: key,
                    server: st.server.clone(),
                    revision: st.revision,
                    version: st.version.clone(),
                    verdict: v,
                    trace_id: st.trace_id,
                    span_id: st.span_id,
                    at_ns: latest,
                });
            }
        }
        changes
    }

    /// Whether the table holds the session.
    pub fn contains(&self, key: &str) -> bool {
        self.map.contains_key(key)
    }

    /// The sessions to read back from a shared store (see [`ReadBack`]).
    pub(crate) fn to_read_back(&self, which: ReadBack) -> Vec<String> {
        match which {
            ReadBack::ToWrite => self.dirty.iter().filter(|k| self.map.contains_key(*k)).cloned().collect(),
            ReadBack::Converged { limit, from } => {
                let mut keys: Vec<&String> =
                    self.map.iter().filter(|(_, st)| st.last == Some(Convergence::Converged)).map(|(k, _)| k).collect();
                if keys.is_empty() {
                    return Vec::new();
                }
                keys.sort();
                let start = from % keys.len();
                keys.iter().cycle().skip(start).take(limit.min(keys.len())).map(|k| (*k).clone()).collect()
            }
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Record the catalog facts of a batch of spans; returns the sessions whose verdict changed.
    pub fn observe<'a>(&mut self, spans: impl IntoIterator<Item = &'a SpanEvidence>, now: Moment) -> Vec<CatalogChange> {
        let mut touched: Vec<(String, u64)> = Vec::new();
        for s in spans {
            let reconnect = s.method.as_ref().is_some_and(Method::is_setup);
            // A call moves no session's clock: time passes on the engine's clock (`reevaluate`),
            // and each call is judged at its own start.
            if s.catalog.is_none() && !reconnect {
                continue;
            }
            let Some(key) = s.session_key() else { continue };
            if !self.map.contains_key(&key) && self.map.len() >= self.limits.max_sessions {
                self.evict_idlest();
            }
            let st = self.map.entry(key.clone()).or_insert_with(|| SessionState {
                events: Vec::new(),
                page_requests: Vec::new(),
                last_seen: now,
                last: None,
                last_activity_ns: 0,
                server: s.server.clone(),
                trace_id: s.trace_id,
                span_id: s.span_id,
                has_ttl: false,
                emitted: None,
                revision: crate::evidence::ProtocolRevision::Unknown,
                version: None,
                last_discovered: None,
            });
            st.last_seen = now;
            let said = match s.protocol_version.as_deref().map(crate::evidence::ProtocolRevision::of_version) {
                Some(r) if r != crate::evidence::ProtocolRevision::Unknown => r,
                _ => s.method.as_ref().map_or(crate::evidence::ProtocolRevision::Unknown, crate::evidence::ProtocolRevision::of_method),
            };
            if said != crate::evidence::ProtocolRevision::Unknown {
                st.revision = said;
            }
            if let Some(v) = s.protocol_version.as_ref().filter(|v| crate::evidence::is_dated_version(v)) {
                st.version = Some(v.clone());
            }
            st.last_activity_ns = st.last_activity_ns.max(s.end_ns.max(s.start_ns));
            st.trace_id = s.trace_id;
            st.span_id = s.span_id;
            if st.server.is_none() {
                st.server = s.server.clone();
            }
            let mut push = |kind: CatalogEventKind, at_ns: u64| st.events.push(CatalogEvent { at_ns, kind });
            if reconnect {
                push(CatalogEventKind::Reconnect, s.start_ns);
            }
            if let Some(c) = &s.catalog {
                // On 2026-07-28 the capability (from `server/discover`) only says the server can
                // deliver list changes: it delivers them on a `subscriptions/listen` stream the
                // client opened, and that stream is the bound (`CatalogEventKind::Listen`).
                let discover = s.method.as_ref().is_some_and(|m| m.is("server/discover"));
                if let Some(cap) = c.list_changed_capability.filter(|_| !discover) {
                    push(CatalogEventKind::Capability(cap), s.start_ns);
                }
                if let Some(sig) = c.signal {
                    push(CatalogEventKind::Signal(sig), s.end_ns);
                }
                if let Some(d) = &c.installed_digest {
                    push(CatalogEventKind::Installed(d.clone()), s.end_ns);
                }
                if let Some(l) = c.listen {
                    push(CatalogEventKind::Listen(l), s.end_ns);
                }
                if let Some(p) = &c.page {
                    // A ttlMs of 0 is no freshness window (2026-07-28 caching): nothing to expire.
                    st.has_ttl |= p.ttl_ms.is_some_and(|t| t > 0);
                    let dup = s.request_id.as_ref().is_some_and(|r| st.page_requests.contains(r));
                    if !dup {
                        if let Some(r) = &s.request_id {
                            st.page_requests.push(r.clone());
                        }
                        push(CatalogEventKind::Page { start_ns: s.start_ns, page: p.clone() }, s.end_ns);
                    }
                }
            }
            // Bounded: the oldest events go first; the verdict needs the latest ones.
            let cap = self.limits.max_events_per_session;
            if st.events.len() > cap {
                st.events.sort_by_key(|e| e.at_ns);
                let drop = st.events.len() - cap;
                st.events.drain(..drop);
            }
            if st.page_requests.len() > cap {
                st.page_requests.drain(..cap / 2);
            }
            let at = s.end_ns.max(s.start_ns);
            match touched.iter_mut().find(|(k, _)| *k == key) {
                Some((_, t)) => *t = (*t).max(at),
                None => touched.push((key, at)),
            }
        }
        let mut changes = Vec::new();
        for (key, _) in &touched {
            self.mark(key);
        }
        for (key, at) in touched {
            let policy = self.limits.refresh_policy;
            let Some(st) = self.map.get_mut(&key) else { continue };
            if !st.has_catalog_evidence() {
                continue;
            }
            let latest = st.events.iter().map(|e| e.at_ns).max().unwrap_or(at).max(st.last_activity_ns);
            let v = convergence(&st.events, policy, latest.max(at));
            // A new verdict, or the same verdict about another catalog (a change signal and the
            // complete re-list that answered it, seen in one batch, leave a `converged` catalog
            // `converged` — with other tools: that is news too).
            let moved = st.last != Some(v.convergence) || st.last_discovered != v.discovered_digest;
            st.last_discovered.clone_from(&v.discovered_digest);
            if moved {
                st.last = Some(v.convergence);
                changes.push(CatalogChange {
                    session_key: key,
                    server: st.server.clone(),
                    revision: st.revision,
                    version: st.version.clone(),
                    verdict: v,
                    trace_id: st.trace_id,
                    span_id: st.span_id,
                    at_ns: latest.max(at),
                });
            }
        }
        changes
    }

    /// The catalog verdict of a session at a moment (a call's start), if the session is known.
    pub fn verdict_at(&self, key: &str, at_ns: u64) -> Option<CatalogVerdict> {
        let st = self.map.get(key)?;
        Some(convergence(&st.events, self.limits.refresh_policy, at_ns))
    }

    /// Re-evaluate, at `now`, the sessions whose verdict can change with time alone (a page with a
    /// TTL, or a `max_age` policy): a TTL that expires with no new span is a transition when it
    /// happens, not at the next evidence. Returns the sessions whose verdict changed.
    pub fn reevaluate(&mut self, now: Moment) -> Vec<CatalogChange> {
        let policy = self.limits.refresh_policy;
        let by_age = matches!(policy, RefreshPolicy::MaxAge { .. });
        let at = now.as_nanos();
        let mut changes = Vec::new();
        for (key, st) in self.map.iter_mut() {
            if !(by_age || st.has_ttl) || !st.has_catalog_evidence() {
                continue;
            }
            // Never judge a session before its own latest evidence (clocks of two processes differ).
            let latest = st.events.iter().map(|e| e.at_ns).max().unwrap_or(0);
            let v = convergence(&st.events, policy, at.max(latest));
            if st.last != Some(v.convergence) {
                st.last = Some(v.convergence);
                changes.push(CatalogChange {
                    session_key: key.clone(),
                    server: st.server.clone(),
                    revision: st.revision,
                    version: st.version.clone(),
                    verdict: v,
                    trace_id: st.trace_id,
                    span_id: st.span_id,
                    at_ns: at.max(latest),
                });
            }
        }
        changes.sort_by(|a, b| a.session_key.cmp(&b.session_key));
        for c in &changes {
            self.mark(&c.session_key);
        }
        changes
    }

    /// The verdict of every session with catalog evidence, evaluated at `now` (never before the
    /// session's own latest evidence), in session-key order.
    pub fn all_at(&self, now: Moment) -> Vec<CatalogChange> {
        let mut out: Vec<CatalogChange> = self
            .map
            .iter()
            .filter(|(_, st)| st.has_catalog_evidence())
            .map(|(k, st)| {
                let latest = st.events.iter().map(|e| e.at_ns).max().unwrap_or(0).max(st.last_activity_ns);
                let at = now.as_nanos().max(latest);
                CatalogChange {
                    session_key: k.clone(),
                    server: st.server.clone(),
                    revision: st.revision,
                    version: st.version.clone(),
                    verdict: convergence(&st.events, self.limits.refresh_policy, at),
                    trace_id: st.trace_id,
                    span_id: st.span_id,
                    at_ns: at,
                }
            })
            .collect();
        out.sort_by(|a, b| a.session_key.cmp(&b.session_key));
        out
    }

    /// Whether `tool` is in the session's converged catalog at a moment (a call's start); `None`
    /// when the session is unknown or its catalog was not converged then (see
    /// [`CatalogVerdict::knows_tool`]).
    pub fn tool_in_catalog_at(&self, key: &str, tool: &str, at_ns: u64) -> Option<bool> {
        self.verdict_at(key, at_ns)?.knows_tool(tool)
    }

    /// The current verdict of every session (for `replay` and the gate API).
    pub fn all_current(&self) -> Vec<(String, Option<Arc<str>>, CatalogVerdict)> {
        let mut out: Vec<_> = self
            .map
            .iter()
            .filter(|(_, st)| st.has_catalog_evidence())
            .map(|(k, st)| {
                let at = st.events.iter().map(|e| e.at_ns).max().unwrap_or(0).max(st.last_activity_ns);
                (k.clone(), st.server.clone(), convergence(&st.events, self.limits.refresh_policy, at))
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// The digest of `tool` in the latest page of the session at or before `at_ns`: the definition
    /// the client most plausibly acted on.
    pub fn tool_digest_at(&self, key: &str, tool: &str, at_ns: u64) -> Option<Arc<str>> {
        let st = self.map.get(key)?;
        st.events
            .iter()
            .filter(|e| e.at_ns <= at_ns)
            .filter_map(|e| match &e.kind {
                CatalogEventKind::Page { page, .. } => page.tools.iter().find(|(n, _)| &**n == tool).map(|(_, d)| (e.at_ns, d.clone())),
                _ => None,
            })
            .max_by_key(|(at, _)| *at)
            .map(|(_, d)| d)
    }

    /// Every (server, tool, digest) discovered, with the time of the page it was on.
    pub fn discoveries(&self) -> Vec<Discovery> {
        let mut out = Vec::new();
        for st in self.map.values() {
            let Some(server) = &st.server else { continue };
            for e in &st.events {
                if let CatalogEventKind::Page { page, .. } = &e.kind {
                    for (name, digest) in &page.tools {
                        out.push(Discovery { server: server.clone(), tool: name.clone(), digest: digest.clone(), at_ns: e.at_ns });
                    }
                }
            }
        }
        out.sort_by(|a, b| (&a.server, &a.tool, a.at_ns).cmp(&(&b.server, &b.tool, b.at_ns)));
        out
    }

    /// Sessions per (server, last convergence verdict).
    pub fn convergence_counts(&self) -> FxHashMap<(String, Convergence), u64> {
        let mut m: FxHashMap<(String, Convergence), u64> = FxHashMap::default();
        for st in self.map.values() {
            if let Some(c) = st.last {
                *m.entry((st.server.as_deref().unwrap_or("").to_string(), c)).or_default() += 1;
            }
        }
        m
    }

    /// Forget sessions idle past the expiry.
    /// Returns the keys forgotten, so whoever mirrors sessions (the gate's board) forgets them too.
    pub fn expire(&mut self, now: Moment) -> Vec<String> {
        let idle = self.limits.idle_expiry;
        let gone: Vec<String> =
            self.map.iter().filter(|(_, st)| now.saturating_duration_since(st.last_seen) >= idle).map(|(k, _)| k.clone()).collect();
        for k in &gone {
            self.map.remove(k);
            self.mark(k);
        }
        self.expired += gone.len() as u64;
        gone
    }

    fn evict_idlest(&mut self) {
        if let Some(k) = self.map.iter().min_by_key(|(_, st)| st.last_seen).map(|(k, _)| k.clone()) {
            self.map.remove(&k);
            self.mark(&k);
            self.expired += 1;
        }
    }
}
