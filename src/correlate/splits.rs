//! Which servers split traces, as far as this instance knows: on a shared store, only their
//! calls' client halves are published.
//!
//! A split call's server half (a trace of its own) finds its client half, decided on another
//! instance, among the halves published to the store. Publishing every client-only call's half
//! cost a list record per call, though most servers never split (the server is not instrumented,
//! or it propagates the trace). So an instance that defers a server half (it waited
//! `decision_wait` alone: the server is *seen* to split) marks its server in the store; every
//! instance reads the marks of the servers whose halves it held back (each write round), and
//! publishes a marked server's halves — those decided since it held them back at once, and every
//! later one as it is decided.
//!
//! The first split calls of a server are the ones at risk: the mark must reach the client
//! half's instance, and its half the store, before the server half's one look. So the look for
//! a half of a server marked less than the settle time ago waits until then; a held half can be
//! published for as long as its chain is kept (`late_span_window`); at the drain the held halves
//! a look may still come for (decided within a server half's waits) are published, since the
//! look may come after this instance is gone. A half with no server name may be any server's
//! and is always published; a mark with no server name (a server half that names none) marks
//! every server.
//!
//! Instances of state protocol 0 (release 0.1.0) know no marks: they publish every client half
//! and look for a server half's client half without waiting for a mark to settle. While one of
//! them shares the store (the cluster's protocol, the lowest any live instance announces, is
//! below [`MARKS_SINCE`]) this instance does the same ([`Splits::every_half`]), so a call split
//! between an old and a new instance joins either way.

use std::sync::Arc;
use std::time::Duration;

use rustc_hash::FxHashMap;

use crate::bounded::BoundedMap;
use crate::evidence::time::Moment;

/// A server as a half names it (`None`: unnamed).
pub(crate) type Server = Option<Arc<str>>;

/// How long after a server is marked here its server halves' look waits, at least: the mark's
/// write round, the client instances' read of it (with a write round, at most [`ASK_EVERY`]
/// apart) and their publication (the next round), with room for a loaded store thread. A store
/// whose answers may take longer waits longer ([`Splits::set_settle`]).
pub(crate) const SETTLE: Duration = Duration::from_secs(1);

/// How often the mark of a server whose halves are held back is asked for: well inside
/// [`SETTLE`], and a key per held server at most four times a second however fast the rounds.
pub(crate) const ASK_EVERY: Duration = Duration::from_millis(250);

/// Servers remembered as splitting, and servers whose halves are held back: past it the oldest
/// mark is forgotten here (it is still in the store, and read again when a half of that server
/// is held back), and a half of one more unmarked server is published at once.
pub(crate) const MAX_SERVERS: usize = 4096;

/// The first state protocol whose instances write and read split marks.
pub(crate) const MARKS_SINCE: u32 = 1;

pub(crate) struct Splits {
    /// Servers known to split, and since when this instance knows it (engine time); the oldest
    /// forgotten past [`MAX_SERVERS`], counted in `mcp_health.state.evicted{table="split_servers"}`.
    known: BoundedMap<Server, Moment>,
    /// Marks made here, still to be written to the store.
    to_write: Vec<Server>,
    /// Servers whose client halves were held back here: the last time one was, and the last
    /// time the store was asked for the server's mark.
    held: FxHashMap<Server, (Moment, Option<Moment>)>,
    settle: Duration,
    /// An instance that knows no marks shares the store: every half is published, no mark is
    /// made or waited for.
    every_half: bool,
}

impl Default for Splits {
    fn default() -> Self {
        Splits {
            known: BoundedMap::with_capacity("split_servers", MAX_SERVERS),
            to_write: Vec::new(),
            held: FxHashMap::default(),
            settle: SETTLE,
            every_half: false,
        }
    }
}

impl Splits {
    /// Whether a client half of `server` is published when it is decided.
    pub(crate) fn publishes(&self, server: &Server) -> bool {
        self.every_half || server.is_none() || self.known.contains(server) || self.known.contains(&None)
    }

    /// Hold back a client half of `server` decided at `now`; false when it cannot be (as many
    /// servers are held as asked for): it is published then, as without marks.
    pub(crate) fn hold(&mut self, server: &Server, now: Moment) -> bool {
        if let Some((at, _)) = self.held.get_mut(server) {
            *at = now;
            return true;
        }
        if self.held.len() >= MAX_SERVERS {
            return false;
        }
        self.held.insert(server.clone(), (now, None));
        true
    }

    /// A server half of `server` was seen to split at `now`: marked here (written at the next
    /// round). True when the mark is new (the halves held back for it are to be published).
    pub(crate) fn mark(&mut self, server: &Server, now: Moment) -> bool {
        if self.every_half || !self.learn(server, now) {
            return false;
        }
        self.to_write.push(server.clone());
        true
    }

    /// The store says `server` splits (or this instance marked it): true when new here.
    pub(crate) fn learn(&mut self, server: &Server, now: Moment) -> bool {
        if self.known.contains(server) {
            return false;
        }
        self.known.insert(server.clone(), now);
        self.held.remove(server);
        if server.is_none() {
            self.held.clear();
        }
        true
    }

    /// The time a mark is given to reach the other instances: [`SETTLE`], or more.
    pub(crate) fn set_settle(&mut self, settle: Duration) {
        self.settle = settle.max(SETTLE);
    }

    /// The time a mark is given to reach the other instances.
    pub(crate) fn settle(&self) -> Duration {
        self.settle
    }

    /// When the server halves of `server` may look for their client half: once its mark had the
    /// settle time to reach the other instances.
    pub(crate) fn settled_at(&self, server: &Server) -> Option<Moment> {
        if self.every_half {
            return None;
        }
        let at = [self.known.get(server), self.known.get(&None)].into_iter().flatten().max()?;
        Some(*at + self.settle)
    }

    /// The marks made here since the last call, to write.
    pub(crate) fn take_marks(&mut self) -> Vec<Server> {
        std::mem::take(&mut self.to_write)
    }

    /// Marks that could not be written: written at the next round.
    pub(crate) fn marks_again(&mut self, marks: Vec<Server>) {
        self.to_write.extend(marks);
    }

    /// The servers whose marks to read from the store: those with halves held back within
    /// `window` of `now` and not known to split (the older ones are forgotten), each at most
    /// every [`ASK_EVERY`].
    pub(crate) fn servers_to_ask(&mut self, now: Moment, window: Duration) -> Vec<Server> {
        self.held.retain(|_, (at, _)| now.saturating_duration_since(*at) <= window);
        let mut out = Vec::new();
        for (server, (_, asked)) in self.held.iter_mut() {
            if asked.is_none_or(|a| now.saturating_duration_since(a) >= ASK_EVERY) {
                *asked = Some(now);
                out.push(server.clone());
            }
        }
        // A server half that names no server marks every server (`-`): asked for with the
        // servers it may be, or the first split calls of a server whose spans name none (the
        // SDKs' server spans) would wait for the drain.
        if !out.is_empty() && !out.contains(&None) && !self.known.contains(&None) {
            out.push(None);
        }
        out.sort();
        out
    }

    /// Publish every half (an instance that knows no marks shares the store), or go back to
    /// marks. The servers whose halves were held back here, to publish now, when it turns on.
    pub(crate) fn every_half(&mut self, on: bool) -> Vec<Server> {
        let was = std::mem::replace(&mut self.every_half, on);
        if on && !was {
            self.to_write.clear();
            return self.held_servers();
        }
        Vec::new()
    }

    /// The servers with halves held back (the drain publishes their recent ones).
    pub(crate) fn held_servers(&mut self) -> Vec<Server> {
        let mut out: Vec<Server> = self.held.drain().map(|(s, _)| s).collect();
        out.sort();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(name: &str) -> Server {
        Some(Arc::from(name))
    }

    #[test]
    fn a_mark_publishes_its_server_and_an_unnamed_mark_every_server() {
        let t0 = Moment::from_nanos(1_000_000_000);
        let mut sp = Splits::default();
        assert!(sp.publishes(&None), "a half with no server name may be any server's");
        assert!(!sp.publishes(&s("a")));
        assert!(sp.hold(&s("a"), t0) && sp.hold(&s("b"), t0));
        // With them, the mark of a server half that names no server (it may be either).
        assert_eq!(sp.servers_to_ask(t0, Duration::from_secs(5)), vec![None, s("a"), s("b")]);
        assert!(sp.mark(&s("a"), t0));
        assert!(!sp.mark(&s("a"), t0), "marked once");
        assert_eq!(sp.take_marks(), vec![s("a")]);
        assert!(sp.publishes(&s("a")) && !sp.publishes(&s("b")));
        assert!(sp.servers_to_ask(t0, Duration::from_secs(5)).is_empty(), "asked a moment ago");
        let t1 = t0 + ASK_EVERY;
        assert_eq!(sp.servers_to_ask(t1, Duration::from_secs(5)), vec![None, s("b")], "a known server is not asked for");
        assert_eq!(sp.settled_at(&s("a")), Some(t0 + SETTLE));
        assert_eq!(sp.settled_at(&s("b")), None);
        assert!(sp.learn(&None, t0 + Duration::from_secs(2)));
        assert!(sp.publishes(&s("b")), "an unnamed mark marks every server");
        assert_eq!(sp.settled_at(&s("a")), Some(t0 + Duration::from_secs(2) + SETTLE), "the later mark decides");
        assert!(sp.servers_to_ask(t1 + ASK_EVERY, Duration::from_secs(5)).is_empty());
        sp.set_settle(Duration::from_millis(10));
        assert_eq!(sp.settled_at(&s("b")), Some(t0 + Duration::from_secs(2) + SETTLE), "never less than SETTLE");
        sp.set_settle(Duration::from_secs(5));
        assert_eq!(sp.settled_at(&s("b")), Some(t0 + Duration::from_secs(7)));
    }

    /// While an instance that knows no marks shares the store: every half is published (those
    /// held back until then are handed back to publish), no mark is made, nothing waits for one.
    #[test]
    fn with_an_instance_that_knows_no_marks_every_half_is_published() {
        let t0 = Moment::from_nanos(1_000_000_000);
        let mut sp = Splits::default();
        assert!(sp.hold(&s("a"), t0));
        assert!(sp.mark(&s("b"), t0));
        assert_eq!(sp.every_half(true), vec![s("a")], "the held server's halves are published now");
        assert!(sp.take_marks().is_empty(), "a mark not written yet is not written");
        assert!(sp.publishes(&s("c")));
        assert!(!sp.mark(&s("c"), t0), "no mark");
        assert_eq!(sp.settled_at(&s("b")), None, "no wait for a mark to settle");
        assert!(sp.servers_to_ask(t0 + ASK_EVERY, Duration::from_secs(5)).is_empty());
        assert!(sp.every_half(true).is_empty());
        assert!(sp.every_half(false).is_empty());
        assert!(!sp.publishes(&s("c")), "back to marks once every instance knows them");
        assert!(sp.mark(&s("c"), t0));
    }

    #[test]
    fn held_servers_are_forgotten_past_the_window_and_marks_past_the_bound() {
        let t0 = Moment::from_nanos(1_000_000_000);
        let mut sp = Splits::default();
        sp.hold(&s("old"), t0);
        sp.hold(&s("new"), t0 + Duration::from_secs(9));
        for i in 0..MAX_SERVERS - 2 {
            assert!(sp.hold(&s(&format!("held-{i}")), t0 + Duration::from_secs(9)));
        }
        assert!(!sp.hold(&s("one-too-many"), t0), "past the bound a half is published, not held");
        assert!(sp.hold(&s("new"), t0 + Duration::from_secs(9)), "a held server is held again");
        let asked = sp.servers_to_ask(t0 + Duration::from_secs(10), Duration::from_secs(5));
        assert!(!asked.contains(&s("old")) && asked.contains(&s("new")) && asked.len() == MAX_SERVERS);
        let before = crate::bounded::evicted("split_servers");
        for i in 0..MAX_SERVERS + 3 {
            sp.learn(&s(&format!("srv-{i}")), t0 + Duration::from_millis(i as u64));
        }
        assert_eq!(sp.known.len(), MAX_SERVERS);
        assert!(crate::bounded::evicted("split_servers") >= before + 3, "the marks forgotten are counted");
        assert!(!sp.publishes(&s("srv-0")) && sp.publishes(&s(&format!("srv-{}", MAX_SERVERS + 2))));
    }
}
