//! Catalog convergence (SPEC section 4): from a session's timeline of signals, `tools/list` pages
//! and installs, decide `converged`, `stale`, `incomplete` or `unverifiable` at a moment in time.
//!
//! A pure function of timestamped evidence: the same timeline asked about the same moment gives the
//! same answer, whatever order the spans arrived in. `converged` needs positive evidence of all
//! three events — a signal-free or refreshed window, a complete traversal, and an install equal to
//! what was discovered; anything missing is `unverifiable`, never `converged`.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use super::digest::{registry_digest, ToolDigest, PROJECTION_VERSION};
use crate::evidence::catalog::{ListPage, ListenState, SignalSource};

/// One timestamped catalog event of a session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub enum CatalogEventKind {
    Signal(SignalSource),
    /// A `tools/list` page; `start_ns` is when its request started.
    Page {
        start_ns: u64,
        page: ListPage,
    },
    Installed(Arc<str>),
    Capability(bool),
    /// A new connection / `initialize` (for the on-reconnect refresh policy).
    Reconnect,
    /// A `subscriptions/listen` stream (2026-07-28) opened, was acknowledged, or closed.
    Listen(crate::evidence::catalog::ListenFacts),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct CatalogEvent {
    /// When it happened (a page: when its response arrived).
    pub at_ns: u64,
    pub kind: CatalogEventKind,
}

/// What counts as bounded refresh evidence for a server that does not advertise `listChanged`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case", tag = "mode")]
pub enum RefreshPolicy {
    /// No policy: without `listChanged` (or a TTL), convergence is `unverifiable`.
    #[default]
    None,
    /// A complete discovery after the latest (re)connection.
    OnReconnect,
    /// A complete discovery no older than `max_age` (before a high-impact call, or an interval).
    #[serde(rename = "max_age")]
    MaxAge {
        #[serde(with = "humantime_serde")]
        max_age: Duration,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Convergence {
    Converged,
    Stale,
    Incomplete,
    Unverifiable,
}

impl Convergence {
    pub fn as_str(self) -> &'static str {
        match self {
            Convergence::Converged => "converged",
            Convergence::Stale => "stale",
            Convergence::Incomplete => "incomplete",
            Convergence::Unverifiable => "unverifiable",
        }
    }
}

/// The convergence verdict with the evidence behind it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CatalogVerdict {
    pub convergence: Convergence,
    pub reason: &'static str,
    pub next_step: &'static str,
    /// Latest change signal (ns).
    pub signal_at_ns: Option<u64>,
    pub traversal_start_ns: Option<u64>,
    pub traversal_end_ns: Option<u64>,
    /// Cursors sent, in order, in the latest traversal (`""` for the first page).
    pub cursor_chain: Vec<String>,
    pub discovered_digest: Option<String>,
    pub installed_digest: Option<String>,
    pub tool_digests: Vec<ToolDigest>,
    pub projection_version: &'static str,
}

impl CatalogVerdict {
    /// Whether `tool` is in this catalog, answered only for a converged one (a complete traversal
    /// after the latest signal, installed as discovered); `None` otherwise: an incomplete, stale
    /// or unverifiable catalog is no evidence that a tool is unknown.
    pub fn knows_tool(&self, tool: &str) -> Option<bool> {
        (self.convergence == Convergence::Converged).then(|| self.tool_digests.iter().any(|t| t.name == tool))
    }
}

struct Traversal {
    start_ns: u64,
    end_ns: u64,
    cursors: Vec<String>,
    tools: Vec<ToolDigest>,
    ttl_ms: Option<u64>,
    complete: bool,
}

/// What the events up to a moment say: the latest change signal, the installed registry, the
/// capability, the latest reconnect, the listen stream, and the traversals.
#[derive(Default)]
struct Seen {
    signal_at: Option<u64>,
    installed: Option<Arc<str>>,
    capability: Option<bool>,
    reconnect_at: Option<u64>,
    /// Since when an acknowledged listen stream carrying tool-list changes has been open.
    listening_since: Option<u64>,
    /// A traversal still waiting for pages (a nextCursor remains).
    current: Option<Traversal>,
    last_complete: Option<Traversal>,
}

impl Seen {
    /// Every event up to `at_ns`, in time order.
    fn of(events: &[CatalogEvent], at_ns: u64) -> Seen {
        let mut evs: Vec<&CatalogEvent> = events.iter().filter(|e| e.at_ns <= at_ns).collect();
        evs.sort_by_key(|e| e.at_ns);
        let mut seen = Seen::default();
        for e in evs {
            match &e.kind {
                CatalogEventKind::Signal(_) => seen.signal_at = Some(e.at_ns),
                CatalogEventKind::Installed(d) => seen.installed = Some(d.clone()),
                CatalogEventKind::Capability(c) => seen.capability = Some(*c),
                CatalogEventKind::Reconnect => seen.reconnect_at = Some(e.at_ns),
                CatalogEventKind::Listen(l) => match l.state {
                    ListenState::Acknowledged if l.tools_list_changed => {
                        seen.listening_since.get_or_insert(e.at_ns);
                    }
                    ListenState::Closed => seen.listening_since = None,
                    _ => {}
                },
                CatalogEventKind::Page { start_ns, page } => seen.page(*start_ns, e.at_ns, page),
            }
        }
        seen
    }

    /// A `tools/list` page (its response arrived at `at_ns`): it starts or continues a traversal.
    fn page(&mut self, start_ns: u64, at_ns: u64, page: &ListPage) {
        let continues = page.cursor.is_some() && self.current.as_ref().is_some_and(|t| !t.complete);
        if !continues {
            // A first page starts a traversal; an orphan continuation page starts an
            // incomplete one (its beginning was never seen).
            self.current =
                Some(Traversal { start_ns, end_ns: at_ns, cursors: Vec::new(), tools: Vec::new(), ttl_ms: None, complete: false });
        }
        if let Some(t) = self.current.as_mut() {
            t.cursors.push(page.cursor.as_deref().unwrap_or("").to_string());
            t.end_ns = at_ns;
            t.ttl_ms = page.ttl_ms.or(t.ttl_ms);
            t.tools.extend(page.tools.iter().map(|(n, d)| ToolDigest {
                name: n.to_string(),
                digest: d.to_string(),
                projection_version: PROJECTION_VERSION.into(),
            }));
            let orphan = !continues && page.cursor.is_some();
            if !page.next_cursor_present && !orphan {
                t.complete = true;
            }
        }
        if self.current.as_ref().is_some_and(|t| t.complete) {
            self.last_complete = self.current.take();
        }
    }
}

/// Decide convergence at `at_ns` from every event up to that moment.
pub(crate) fn convergence(events: &[CatalogEvent], policy: RefreshPolicy, at_ns: u64) -> CatalogVerdict {
    let seen = Seen::of(events, at_ns);
    let discovered = seen.last_complete.as_ref().map(|t| registry_digest(&t.tools));
    let (convergence, reason, next_step) = judge(&seen, discovered.as_deref(), policy, at_ns);
    let shown = seen.current.as_ref().or(seen.last_complete.as_ref());
    CatalogVerdict {
        convergence,
        reason,
        next_step,
        signal_at_ns: seen.signal_at,
        traversal_start_ns: shown.map(|t| t.start_ns),
        traversal_end_ns: shown.map(|t| t.end_ns),
        cursor_chain: shown.map(|t| t.cursors.clone()).unwrap_or_default(),
        discovered_digest: discovered,
        installed_digest: seen.installed.as_deref().map(str::to_string),
        tool_digests: seen.last_complete.as_ref().map(|t| t.tools.clone()).unwrap_or_default(),
        projection_version: PROJECTION_VERSION,
    }
}

/// The convergence rules, in order: the first that holds decides (state, reason, next step).
fn judge(seen: &Seen, discovered: Option<&str>, policy: RefreshPolicy, at_ns: u64) -> (Convergence, &'static str, &'static str) {
    const REFRESH: &str = "suspend the affected definitions; ask for one bounded refresh";
    let signal_at = seen.signal_at;
    // A change signal that no complete traversal has answered keeps the catalog stale whatever
    // partial traversal follows it (issue 8: the TypeScript SDK's `listChanged.autoRefresh`
    // re-lists page one only). The verdict says `stale`, not `incomplete`: both hold, but what
    // the client holds is known to predate a change, and `stale` is what keeps the calls chosen
    // from it `stale_catalog` (SPEC §3: a signal not followed by a complete rediscovery) — an
    // `incomplete` verdict would let them through as `unverified`. The partial traversal stays
    // visible in `traversal_*` and `cursor_chain`, and the next step names both remedies.
    let unanswered_signal = signal_at.is_some_and(|s| seen.last_complete.as_ref().is_none_or(|d| s > d.start_ns));
    if seen.current.is_some() && unanswered_signal {
        return (
            Convergence::Stale,
            "a list-change signal followed only by a partial rediscovery (a nextCursor remains)",
            "suspend the affected definitions; resume from the expected cursor if supported, else restart discovery once",
        );
    }
    if seen.current.is_some() {
        return (
            Convergence::Incomplete,
            "a traversal started but a nextCursor remains",
            "resume from the expected cursor if supported, else restart discovery once",
        );
    }
    let Some(d) = &seen.last_complete else {
        if signal_at.is_some() {
            // Whatever the client holds came from before a change signal it never followed up.
            return (Convergence::Stale, "a list-change signal with no complete rediscovery after it", REFRESH);
        }
        return (
            Convergence::Unverifiable,
            "no complete tools/list traversal observed",
            "refresh on reconnect, before a high-impact run, or at a measured interval",
        );
    };
    if signal_at.is_some_and(|s| s > d.start_ns) {
        return (Convergence::Stale, "the latest complete discovery predates the latest list-change signal", REFRESH);
    }
    // 2026-07-28 caching: a ttlMs of 0 ("immediately stale") and an absent one both give no
    // freshness window; freshness then rests on change signals or the refresh policy, never
    // `stale` on that ground alone. Only a positive TTL that has passed makes the catalog stale.
    let ttl_fresh = d.ttl_ms.filter(|ttl| *ttl > 0).map(|ttl| at_ns <= d.end_ns.saturating_add(ttl.saturating_mul(1_000_000)));
    if ttl_fresh == Some(false) {
        return (Convergence::Stale, "the discovered catalog's ttlMs has expired", REFRESH);
    }
    match (&seen.installed, &discovered) {
        (Some(i), Some(dd)) if **i != **dd => {
            return (Convergence::Stale, "the installed registry differs from the last complete discovery", REFRESH);
        }
        (None, _) => {
            return (
                Convergence::Unverifiable,
                "the client's installed registry was not observed",
                "report the installed registry digest (mcp_health.catalog.installed_digest)",
            );
        }
        _ => {}
    }
    // Is there bounded evidence that changes would have been seen? listChanged, a listen stream
    // opted into tool-list changes that was open (acknowledged) before the discovery started and
    // still is, a TTL, or a policy.
    let bounded = seen.capability == Some(true)
        || seen.listening_since.is_some_and(|t| t <= d.start_ns)
        || ttl_fresh == Some(true)
        || match policy {
            RefreshPolicy::None => false,
            RefreshPolicy::OnReconnect => seen.reconnect_at.is_some_and(|r| d.start_ns >= r),
            RefreshPolicy::MaxAge { max_age } => at_ns.saturating_sub(d.end_ns) <= max_age.as_nanos() as u64,
        };
    if !bounded {
        return (
            Convergence::Unverifiable,
            "no change signal can be relied on: the server does not advertise tools.listChanged, no listen stream opted into tool-list changes is open, the catalog has no positive ttlMs, and no refresh policy evidence holds",
            "record the signal as unavailable; refresh on reconnect, before a high-impact run, or at a measured interval",
        );
    }
    (
        Convergence::Converged,
        "complete traversal after the latest signal, installed registry equals the discovered one",
        "continue; call, effect and outcome checks still apply",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::digest::tool_digest;
    use serde_json::json;

    const MS: u64 = 1_000_000;

    fn tools(defs: &[serde_json::Value]) -> Vec<(Arc<str>, Arc<str>)> {
        defs.iter().map(|d| tool_digest(d).unwrap()).map(|t| (Arc::from(t.name.as_str()), Arc::from(t.digest.as_str()))).collect()
    }
    fn page(at: u64, cursor: Option<&str>, next: bool, t: Vec<(Arc<str>, Arc<str>)>) -> CatalogEvent {
        CatalogEvent {
            at_ns: at * MS,
            kind: CatalogEventKind::Page {
                start_ns: at * MS - MS,
                page: ListPage { cursor: cursor.map(Into::into), next_cursor_present: next, tools: t, ttl_ms: None, cache_scope: None },
            },
        }
    }
    fn ev(at: u64, kind: CatalogEventKind) -> CatalogEvent {
        CatalogEvent { at_ns: at * MS, kind }
    }
    fn installed(of: &[(Arc<str>, Arc<str>)]) -> CatalogEventKind {
        let tds: Vec<ToolDigest> = of
            .iter()
            .map(|(n, d)| ToolDigest { name: n.to_string(), digest: d.to_string(), projection_version: PROJECTION_VERSION.into() })
            .collect();
        CatalogEventKind::Installed(Arc::from(registry_digest(&tds).as_str()))
    }

    /// SPEC section 4's six reference cases, plus the 2026-07-28 forms.
    #[test]
    fn six_case_fixture_and_2026_forms() {
        let a = json!({"name":"create_ticket","inputSchema":{"type":"object","properties":{"title":{"type":"string"}}}});
        let b = json!({"name":"read_ticket","inputSchema":{"type":"object","properties":{"ticketId":{"type":"string"}},"required":["ticketId"]}});
        let b2 = json!({"name":"read_ticket","inputSchema":{"type":"object","properties":{"projectId":{"type":"string"},"ticketId":{"type":"string"}},"required":["projectId","ticketId"]}});
        let (p1, p2) = (tools(std::slice::from_ref(&a)), tools(std::slice::from_ref(&b)));
        let all = [p1.clone(), p2.clone()].concat();
        let cap = ev(1, CatalogEventKind::Capability(true));
        let baseline =
            vec![cap.clone(), page(10, None, true, p1.clone()), page(20, Some("c1"), false, p2.clone()), ev(21, installed(&all))];

        // 1. a complete two-page baseline
        let v = convergence(&baseline, RefreshPolicy::None, 30 * MS);
        assert_eq!(v.convergence, Convergence::Converged, "{v:?}");
        assert_eq!(v.cursor_chain, vec!["".to_string(), "c1".to_string()]);
        assert_eq!(v.discovered_digest, v.installed_digest);

        // 2. a tool removal, then a complete refresh and install
        let mut c2 = baseline.clone();
        c2.extend([
            ev(40, CatalogEventKind::Signal(SignalSource::Notification)),
            page(50, None, false, p1.clone()),
            ev(51, installed(&p1)),
        ]);
        assert_eq!(convergence(&c2, RefreshPolicy::None, 60 * MS).convergence, Convergence::Converged);

        // 3. a change notification with no new discovery: stale although the digests match
        let mut c3 = baseline.clone();
        c3.push(ev(40, CatalogEventKind::Signal(SignalSource::Notification)));
        let v = convergence(&c3, RefreshPolicy::None, 60 * MS);
        assert_eq!(v.convergence, Convergence::Stale);
        assert_eq!(v.discovered_digest, v.installed_digest, "digests match, the snapshot is still older than the signal");

        // 4. page one with a remaining nextCursor
        let c4 = vec![cap.clone(), page(10, None, true, p1.clone())];
        assert_eq!(convergence(&c4, RefreshPolicy::None, 30 * MS).convergence, Convergence::Incomplete);

        // 5. same name, changed required input: re-discovered, but the client kept the old one
        let p2b = tools(std::slice::from_ref(&b2));
        assert_ne!(p2[0].1, p2b[0].1, "per-tool digests differ");
        let mut c5 = baseline.clone();
        c5.extend([
            ev(40, CatalogEventKind::Signal(SignalSource::Notification)),
            page(50, None, true, p1.clone()),
            page(55, Some("c1"), false, p2b.clone()),
        ]);
        let v = convergence(&c5, RefreshPolicy::None, 60 * MS);
        assert_eq!(v.convergence, Convergence::Stale, "{v:?}");
        assert_ne!(v.discovered_digest, v.installed_digest);

        // 6. no listChanged and no refresh policy evidence
        let c6 = vec![ev(1, CatalogEventKind::Capability(false)), page(10, None, false, all.clone()), ev(11, installed(&all))];
        assert_eq!(convergence(&c6, RefreshPolicy::None, 30 * MS).convergence, Convergence::Unverifiable);
        // ... which a configured policy with evidence turns into converged, and its absence does not.
        assert_eq!(
            convergence(&c6, RefreshPolicy::MaxAge { max_age: Duration::from_secs(60) }, 30 * MS).convergence,
            Convergence::Converged
        );
        assert_eq!(convergence(&c6, RefreshPolicy::OnReconnect, 30 * MS).convergence, Convergence::Unverifiable);
        let mut c6r = c6.clone();
        c6r.insert(0, ev(5, CatalogEventKind::Reconnect));
        assert_eq!(convergence(&c6r, RefreshPolicy::OnReconnect, 30 * MS).convergence, Convergence::Converged);

        // 2026-07-28: a subscription event instead of a notification, and TTL freshness.
        let mut s3 = baseline.clone();
        s3.push(ev(40, CatalogEventKind::Signal(SignalSource::Subscription)));
        assert_eq!(convergence(&s3, RefreshPolicy::None, 60 * MS).convergence, Convergence::Stale);
        let ttl_page = |at: u64| CatalogEvent {
            at_ns: at * MS,
            kind: CatalogEventKind::Page {
                start_ns: at * MS - MS,
                page: ListPage {
                    cursor: None,
                    next_cursor_present: false,
                    tools: all.clone(),
                    ttl_ms: Some(1000),
                    cache_scope: Some("session".into()),
                },
            },
        };
        let t = vec![ttl_page(10), ev(11, installed(&all))];
        assert_eq!(
            convergence(&t, RefreshPolicy::None, 500 * MS).convergence,
            Convergence::Converged,
            "fresh by ttl, no listChanged needed"
        );
        assert_eq!(convergence(&t, RefreshPolicy::None, 2000 * MS).convergence, Convergence::Stale, "ttl expired");
    }

    /// Issue 8 defect 7: a partial re-list after a change signal (the TypeScript SDK's
    /// `listChanged.autoRefresh` fetches page one only) does not clear the staleness; a complete
    /// one does; a partial traversal with no signal before it is still `incomplete`.
    #[test]
    fn a_partial_relist_after_a_signal_stays_stale() {
        let p1 = tools(&[json!({"name":"a"})]);
        let p2 = tools(&[json!({"name":"b"})]);
        let all = [p1.clone(), p2.clone()].concat();
        let mut evs = vec![
            ev(1, CatalogEventKind::Capability(true)),
            page(10, None, true, p1.clone()),
            page(20, Some("c1"), false, p2.clone()),
            ev(21, installed(&all)),
            ev(40, CatalogEventKind::Signal(SignalSource::Notification)),
        ];
        assert_eq!(convergence(&evs, RefreshPolicy::None, 45 * MS).convergence, Convergence::Stale, "no re-list");
        evs.push(page(50, None, true, p1.clone()));
        let v = convergence(&evs, RefreshPolicy::None, 60 * MS);
        assert_eq!(v.convergence, Convergence::Stale, "page one only after the signal: {v:?}");
        assert_eq!(v.cursor_chain, vec!["".to_string()], "the partial traversal is still shown");
        evs.push(page(55, Some("c1"), false, p2.clone()));
        evs.push(ev(56, installed(&all)));
        assert_eq!(convergence(&evs, RefreshPolicy::None, 60 * MS).convergence, Convergence::Converged, "completed");
        // A signal only before the last complete traversal: a later partial one is just incomplete.
        evs.push(page(70, None, true, p1.clone()));
        assert_eq!(convergence(&evs, RefreshPolicy::None, 80 * MS).convergence, Convergence::Incomplete);
        // No complete traversal at all, a signal, then page one: stale as well.
        let only = vec![ev(5, CatalogEventKind::Signal(SignalSource::Notification)), page(10, None, true, p1.clone())];
        assert_eq!(convergence(&only, RefreshPolicy::None, 20 * MS).convergence, Convergence::Stale);
    }

    /// The 2026-07-28 catalog rule as a table: ttlMs absent / 0 / positive and fresh / positive
    /// and expired, × a change signal before or after the discovery, × what bounds the catalog
    /// (listChanged, a listen stream, a refresh policy, nothing). A TTL of 0 and an absent one
    /// are the same: no freshness window, never `stale` on that ground alone.
    #[test]
    fn ttl_signal_and_bound_table() {
        use crate::evidence::catalog::{ListenFacts, ListenState};
        use Convergence::*;
        let all = tools(&[json!({"name":"x"})]);
        #[derive(Clone, Copy, Debug)]
        enum Ttl {
            Absent,
            Zero,
            Fresh,
            Expired,
        }
        #[derive(Clone, Copy, Debug)]
        enum Bound {
            ListChanged,
            Listen,
            Policy,
            Nothing,
        }
        let listen = |state| CatalogEventKind::Listen(ListenFacts { state, tools_list_changed: true });
        for ttl in [Ttl::Absent, Ttl::Zero, Ttl::Fresh, Ttl::Expired] {
            for signal_after in [false, true] {
                for bound in [Bound::ListChanged, Bound::Listen, Bound::Policy, Bound::Nothing] {
                    let ttl_ms = match ttl {
                        Ttl::Absent => None,
                        Ttl::Zero => Some(0),
                        Ttl::Fresh => Some(1000),
                        Ttl::Expired => Some(5),
                    };
                    let mut evs = vec![
                        CatalogEvent {
                            at_ns: 10 * MS,
                            kind: CatalogEventKind::Page {
                                start_ns: 9 * MS,
                                page: ListPage { cursor: None, next_cursor_present: false, tools: all.clone(), ttl_ms, cache_scope: None },
                            },
                        },
                        ev(11, installed(&all)),
                        ev(if signal_after { 20 } else { 5 }, CatalogEventKind::Signal(SignalSource::Subscription)),
                    ];
                    let policy = match bound {
                        Bound::ListChanged => {
                            evs.push(ev(1, CatalogEventKind::Capability(true)));
                            RefreshPolicy::None
                        }
                        Bound::Listen => {
                            evs.push(ev(1, listen(ListenState::Opened)));
                            evs.push(ev(2, listen(ListenState::Acknowledged)));
                            RefreshPolicy::None
                        }
                        Bound::Policy => RefreshPolicy::MaxAge { max_age: Duration::from_secs(60) },
                        Bound::Nothing => RefreshPolicy::None,
                    };
                    let want = match (signal_after, ttl, bound) {
                        (true, _, _) => Stale,
                        (false, Ttl::Expired, _) => Stale,
                        (false, _, Bound::ListChanged | Bound::Listen | Bound::Policy) => Converged,
                        (false, Ttl::Fresh, Bound::Nothing) => Converged,
                        (false, Ttl::Absent | Ttl::Zero, Bound::Nothing) => Unverifiable,
                    };
                    let v = convergence(&evs, policy, 30 * MS);
                    assert_eq!(v.convergence, want, "ttl {ttl:?}, signal after: {signal_after}, bound {bound:?}: {}", v.reason);
                }
            }
        }
        // A listen stream bounds the catalog only while it is open, and only from its
        // acknowledgment: one acknowledged after the discovery started could have missed a change.
        let base = vec![page(10, None, false, all.clone()), ev(11, installed(&all))];
        let with = |extra: Vec<CatalogEvent>| [base.clone(), extra].concat();
        let v = convergence(
            &with(vec![ev(2, listen(ListenState::Acknowledged)), ev(20, listen(ListenState::Closed))]),
            RefreshPolicy::None,
            30 * MS,
        );
        assert_eq!(v.convergence, Unverifiable, "closed: the bound ended");
        let v = convergence(&with(vec![ev(12, listen(ListenState::Acknowledged))]), RefreshPolicy::None, 30 * MS);
        assert_eq!(v.convergence, Unverifiable, "acknowledged after the discovery");
        let v = convergence(&with(vec![ev(2, listen(ListenState::Opened))]), RefreshPolicy::None, 30 * MS);
        assert_eq!(v.convergence, Unverifiable, "opened but never acknowledged");
    }

    #[test]
    fn evaluation_is_as_of_a_moment_and_order_free() {
        let p = tools(&[json!({"name":"x"})]);
        let mut evs = vec![
            ev(1, CatalogEventKind::Capability(true)),
            page(10, None, false, p.clone()),
            ev(11, installed(&p)),
            ev(40, CatalogEventKind::Signal(SignalSource::Notification)),
        ];
        assert_eq!(convergence(&evs, RefreshPolicy::None, 20 * MS).convergence, Convergence::Converged, "before the signal");
        assert_eq!(convergence(&evs, RefreshPolicy::None, 41 * MS).convergence, Convergence::Stale, "after it");
        evs.reverse();
        assert_eq!(convergence(&evs, RefreshPolicy::None, 41 * MS).convergence, Convergence::Stale);
        assert_eq!(convergence(&[], RefreshPolicy::None, 41 * MS).convergence, Convergence::Unverifiable);
        let only_signal = [ev(40, CatalogEventKind::Signal(SignalSource::Notification))];
        assert_eq!(convergence(&only_signal, RefreshPolicy::None, 41 * MS).convergence, Convergence::Stale, "a signal nobody followed");
    }
}
