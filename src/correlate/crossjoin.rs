//! The cross-trace join: the two halves of one call that landed in different traces.
//!
//! A chain is one trace, but real instrumentations split a call over two traces when the server
//! side does not continue the client's trace:
//! - FastMCP behind HTTP server tracing parents its MCP SERVER span on the HTTP server span
//!   (`POST /mcp`), which started a trace of its own, with no link to the client's;
//! - a request refused before MCP handling (401, 403) leaves only an HTTP server span on the server
//!   side, alone in its trace, while the client's span (if it says anything) says `-32603`.
//!
//! Two joins, both decided when a chain is decided, both bounded:
//! 1. **Halves by request.** A *server half* is a chain whose request spans are all SERVER spans
//!    of one request (one method and `jsonrpc.request.id`). Its *client half* is a chain with a
//!    CLIENT request span of the same method and request id and no server span of it, whose
//!    interval contains the server span's (± [`SLACK_NS`] of clock skew), with the same server
//!    address and session id where both sides name one. The join is made only when exactly one
//!    client half qualifies (request ids are small per-session counters, so a busy pipeline has
//!    many candidates: an ambiguous match is no match, and is counted). Candidates are found
//!    through an index of request spans by (method, request id), kept for the chains the
//!    correlator holds and dropped with them. The server half's spans move into the client's chain
//!    (a decided client chain is revised, as for a late span); the server half gives no verdict of
//!    its own. A server half (a trace whose root is a server span) waits one more `decision_wait`, at
//!    least 2 s, before it is decided alone, so a client half exported a little later still finds it.
//! 2. **Refused HTTP requests.** An HTTP SERVER span on an MCP endpoint (`…/mcp`) with a status
//!    >= 400 whose trace holds no MCP span is kept (at most [`MAX_ORPHANS`], for `late_span_window`: its client may export much later, at exit). A client
//!    > request that failed or never completed, with no server span of its own, whose interval
//!    > contains exactly one such HTTP span (same server where both name one) takes it in: the HTTP
//!    > status then decides the authorization layer (401/403 → `needs_auth`), and the client's
//!    > `-32603` is read as the rendering of that refusal, not as a protocol error. An HTTP span
//!    > arriving after its client chain was decided finds it through a ring of recent refused client
//!    > requests ([`MAX_REFUSED`]) and revises it.

use crate::evidence::time::Moment;
use std::collections::VecDeque;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::evidence::{CallError, JoinKeys, Method, Side, SpanEvidence, SpanId, TraceId};

/// How a server half's client half was looked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HalfMatch {
    One(TraceId),
    None,
    /// Several client halves fit (or too many to tell).
    Ambiguous,
}

/// Clock skew tolerated between the two processes' clocks when one interval must contain the other.
pub(crate) const SLACK_NS: u64 = 500_000_000;
/// Refused-looking HTTP server spans kept while their client half may still arrive.
pub(crate) const MAX_ORPHANS: usize = 4096;
/// Recently decided client requests that failed without a server side, for late HTTP spans.
pub(crate) const MAX_REFUSED: usize = 4096;

/// Most candidate chains one lookup examines. Request ids are small per-session counters (every
/// FastMCP session's first call is id 1), so a busy second can hold thousands of chains under one
/// key; past this many, a unique match cannot be shown cheaply and none is made (counted).
pub(crate) const MAX_CANDIDATES: usize = 32;

/// The index's time bucket.
const BUCKET_NS: u64 = 1_000_000_000;
/// Most buckets probed for one lookup (a client request open longer finds no server half started
/// after this many seconds).
const MAX_BUCKETS: u64 = 120;
/// How long before its server half a client request may have started (the server half of a
/// longer call is not joined).
const CLIENT_LOOKBACK_NS: u64 = 60 * BUCKET_NS;

/// The index's three kinds of key: every request span by start second; spans that name a
/// session by that session (a half that names one is looked up there, exactly, whatever the
/// traffic of other sessions); spans that name none by start second (the rest a half that names
/// a session is compatible with).
#[derive(Clone, Copy, Hash)]
enum Kind {
    Bucket,
    Session,
    Sessionless,
}

fn key(kind: Kind, side: Side, m: &Method, rid: &str, discriminator: impl std::hash::Hash) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = rustc_hash::FxHasher::default();
    kind.hash(&mut h);
    (side as u8).hash(&mut h);
    m.as_str().hash(&mut h);
    rid.hash(&mut h);
    discriminator.hash(&mut h);
    h.finish()
}

/// The index keys of a request span: its bucket key, and its session key or sessionless key.
fn span_keys(s: &SpanEvidence) -> Option<[u64; 2]> {
    let m = s.method.as_ref().filter(|m| !m.is_notification())?;
    (s.side != Side::Internal).then_some(())?;
    let rid = s.request_id.as_deref()?;
    let bucket = s.start_ns / BUCKET_NS;
    let second = match s.session_id.as_deref() {
        Some(sid) => key(Kind::Session, s.side, m, rid, &*join_session(sid)),
        None => key(Kind::Sessionless, s.side, m, rid, bucket),
    };
    Some([key(Kind::Bucket, s.side, m, rid, bucket), second])
}

/// The index keys of the spans of a chain that may be one half of a split call: client requests
/// without a server span of the same request in the chain, and the server requests of a chain
/// with no client request. A chain holding both halves of its calls (the common case) needs no
/// entry at all, so it costs the index nothing.
pub(crate) fn half_keys(spans: &[SpanEvidence]) -> Vec<u64> {
    let has_client_req = spans.iter().any(|s| is_request(s) && s.side == Side::Client);
    // The served requests: a list while few (a chain holds a call or two; a hash set built per
    // chain and batch was most of this function's cost), a set past that.
    let served_list: smallvec::SmallVec<[(&str, &str); 4]> = spans
        .iter()
        .filter(|s| is_request(s) && s.side == Side::Server)
        .filter_map(|s| Some((s.method.as_ref()?.as_str(), s.request_id.as_deref()?)))
        .collect();
    let served_set: Option<rustc_hash::FxHashSet<(&str, &str)>> = (served_list.len() > 16).then(|| served_list.iter().copied().collect());
    let served = |k: (&str, &str)| match &served_set {
        Some(set) => set.contains(&k),
        None => served_list.contains(&k),
    };
    let mut out = Vec::new();
    for s in spans.iter().filter(|s| is_request(s)) {
        let half = match s.side {
            Side::Client => match (&s.method, s.request_id.as_deref()) {
                (Some(m), Some(r)) => !served((m.as_str(), r)),
                _ => false,
            },
            Side::Server => !has_client_req,
            Side::Internal => false,
        };
        if half {
            out.extend(span_keys(s).into_iter().flatten());
        }
    }
    out
}

/// Counters of the joins.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CrossJoinStats {
    pub halves_joined: u64,
    /// Client halves that came after their server half was decided alone, joined to it (the
    /// late path: the server half's verdict is revised).
    pub late_joined: u64,
    pub http_joined: u64,
    /// Server halves not joined because more than one candidate qualified (counted at each
    /// decision that found it so: the server half's, and each client call's it fits).
    pub ambiguous: u64,
    /// Refused HTTP requests not joined because more than one client request could have sent them.
    pub http_ambiguous: u64,
    /// Lookups that found more than [`MAX_CANDIDATES`] chains under one request key: no join is
    /// made (uniqueness cannot be shown within the bound), and the lookup costs no more.
    pub candidates_capped: u64,
    /// Candidate chains examined, over all lookups (what the bound keeps linear).
    pub candidates_examined: u64,
}

/// One request's span interval, as the join compares them.
#[derive(Clone, Debug, PartialEq)]
pub struct Half {
    pub method: Method,
    pub request_id: Box<str>,
    pub start_ns: u64,
    pub end_ns: u64,
    pub server: Option<Arc<str>>,
    pub session: Option<std::sync::Arc<str>>,
    /// The tool a `tools/call` named (both sides name the one the client asked for).
    pub tool: Option<Arc<str>>,
    /// What tells the request's client apart, as this side recorded it.
    pub keys: JoinKeys,
}

impl Half {
    /// A client half as a shared store lists it (method, request id, interval, server and
    /// session as published), its session id hashed (see [`join_session`]). The tool and the
    /// keys are not listed (the record keeps its layout): a listed half is compatible with every
    /// tool and key, which can only make a join rarer.
    pub(crate) fn listed(
        method: Method,
        request_id: Box<str>,
        start_ns: u64,
        end_ns: u64,
        server: Option<Arc<str>>,
        session: Option<&str>,
    ) -> Half {
        Half { method, request_id, start_ns, end_ns, server, session: session.map(join_session), tool: None, keys: JoinKeys::NONE }
    }

    /// The half one request span of `(m, rid)` describes.
    fn of(s: &SpanEvidence, m: Method, rid: &str) -> Half {
        Half {
            method: m,
            request_id: rid.into(),
            start_ns: s.start_ns,
            end_ns: s.end_ns,
            server: s.server.clone(),
            session: s.session_id.as_deref().map(join_session),
            tool: s.tool.clone(),
            keys: s.keys(),
        }
    }
}

/// A session id as the join compares it: the hash the tap writes (`evidence::hash::session_hash`,
/// 64 hex digits: a session id can be a credential) for what a server span records raw, so the
/// tap's half and the server's name one session alike. A raw id that is itself 64 hex digits is
/// taken as written (it then never equals a tap's hash of it: no join, never a wrong one).
pub(crate) fn join_session(sid: &str) -> Arc<str> {
    if sid.len() == 64 && sid.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return Arc::from(sid);
    }
    crate::evidence::hash::session_hash(sid)
}

/// A client request that failed or never completed without any server-side evidence.
#[derive(Clone, Debug)]
pub struct Refused {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    pub start_ns: u64,
    pub end_ns: u64,
    pub server: Option<Arc<str>>,
}

/// A refused-looking HTTP span alone in its trace, kept until its client half takes it.
#[derive(Clone, Debug)]
pub struct Orphan {
    /// When it came here: it is matched once it has waited `decision_wait` + `server_half_wait`
    /// since (a client request that may have sent it, or a rival of the one here, still comes).
    pub at: Moment,
    pub span: SpanEvidence,
    /// Found to fit more than one client request: it never joins anything.
    pub contested: bool,
    /// Its wait is over and it was matched against the decided requests once.
    pub settled: bool,
}

/// What a refused HTTP span whose wait is over finds among the refused client requests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LateHttp {
    /// Exactly one decided chain's request fits it (the chain, and the request's span).
    One(TraceId, SpanId),
    /// A request still in flight fits it: that chain's decision takes it.
    InFlight,
    /// Several chains' requests fit it (those decided are named).
    Ambiguous(Vec<TraceId>),
    None,
}

/// The chains under one index key: almost always one, kept inline (no allocation).
enum Slot {
    One(TraceId),
    /// A set, not a list: a busy key (request id "1" of every new session in one second) must not
    /// make indexing and unindexing linear in the number of chains sharing it.
    Many(rustc_hash::FxHashSet<TraceId>),
}

impl Slot {
    fn iter(&self) -> Box<dyn Iterator<Item = &TraceId> + '_> {
        match self {
            Slot::One(t) => Box::new(std::iter::once(t)),
            Slot::Many(v) => Box::new(v.iter()),
        }
    }
}

#[derive(Default)]
pub struct CrossJoin {
    /// Request spans by (side, method, request id, start second): request ids are small
    /// per-session counters, so the start time keeps each bucket small however many sessions run.
    by_request: FxHashMap<u64, Slot>,
    /// Refused-looking HTTP spans waiting for their client half (see [`Orphan`]).
    pub orphans: VecDeque<Orphan>,
    pub refused: VecDeque<(Moment, Refused)>,
    /// Refused-looking client requests of chains still in flight, so an HTTP span that two of
    /// them could have answered is known to be ambiguous whichever is decided first.
    open_refused: VecDeque<Refused>,
    pub stats: CrossJoinStats,
}

fn is_request(s: &SpanEvidence) -> bool {
    s.method.as_ref().is_some_and(|m| !m.is_notification())
}

/// `outer` contains `inner`, give or take the clock skew.
pub(crate) fn contains(outer: (u64, u64), inner: (u64, u64)) -> bool {
    outer.0 <= inner.0.saturating_add(SLACK_NS) && inner.1 <= outer.1.saturating_add(SLACK_NS)
}

/// The HTTP request started while the client request was open (give or take `slack`).
fn started_within(r: &Refused, start_ns: u64, slack: u64) -> bool {
    r.start_ns <= start_ns.saturating_add(slack) && start_ns <= r.end_ns.saturating_add(slack)
}

fn compatible<T: PartialEq + ?Sized>(a: Option<&T>, b: Option<&T>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a == b,
        _ => true,
    }
}

/// The server half a chain is, if it is one: SERVER request spans of exactly one request, and no
/// CLIENT request span. Its keys are what every server-side span of the trace recorded of the
/// client (the HTTP server span that parents the MCP span names the connection's peer).
pub(crate) fn server_half(spans: &[SpanEvidence]) -> Option<Half> {
    let mut half: Option<Half> = None;
    for s in spans.iter().filter(|s| is_request(s)) {
        match s.side {
            Side::Client => return None,
            Side::Internal => continue,
            Side::Server => {}
        }
        let (m, rid) = (s.method.clone()?, s.request_id.as_deref()?);
        match &mut half {
            None => half = Some(Half::of(s, m, rid)),
            Some(h) if h.method == m && &*h.request_id == rid => {
                h.start_ns = h.start_ns.min(s.start_ns);
                h.end_ns = h.end_ns.max(s.end_ns);
                if h.server.is_none() {
                    h.server = s.server.clone();
                }
                if h.session.is_none() {
                    h.session = s.session_id.as_deref().map(join_session);
                }
                if h.tool.is_none() {
                    h.tool = s.tool.clone();
                }
            }
            Some(_) => return None,
        }
    }
    // An internal request span of another request (another method, or another request id) means
    // this trace is more than one request's server half: no join.
    let mut h = half?;
    let foreign = spans
        .iter()
        .filter(|s| is_request(s) && s.side == Side::Internal)
        .any(|s| s.method.as_ref() != Some(&h.method) || s.request_id.as_deref().is_some_and(|r| r != &*h.request_id));
    if foreign {
        return None;
    }
    for s in spans.iter().filter(|s| s.side == Side::Server && s.has_rare()) {
        h.keys.fill_from(&s.keys());
    }
    Some(h)
}

/// The client request spans of a chain that name a request id and have no server span of that
/// request in the chain: the client halves waiting for a server half. A half's keys are its
/// request span's and those of the spans directly under it (an HTTP client span).
pub(crate) fn client_halves(spans: &[SpanEvidence]) -> Vec<Half> {
    unanswered_client_requests(spans).filter_map(|s| client_half(spans, s)).collect()
}

/// The request spans [`client_halves`] describes, not yet described: a decision asks a split
/// server's halves only whether they are held back, and describing one (its keys, its
/// session's hash) costs more than asking.
pub(crate) fn unanswered_client_requests(spans: &[SpanEvidence]) -> impl Iterator<Item = &SpanEvidence> {
    spans.iter().filter(|s| is_request(s) && s.side == Side::Client).filter(|s| match (&s.method, s.request_id.as_deref()) {
        (Some(m), Some(rid)) => !spans.iter().any(|o| answers(o, m, rid)),
        _ => false,
    })
}

/// Whether span `o` is the server side of request `(m, rid)`.
fn answers(o: &SpanEvidence, m: &Method, rid: &str) -> bool {
    o.side == Side::Server && o.method.as_ref() == Some(m) && o.request_id.as_deref() == Some(rid)
}

/// The client half request span `s` of `spans` describes (one of
/// [`unanswered_client_requests`]; `None` for a span without a method or request id).
pub(crate) fn client_half(spans: &[SpanEvidence], s: &SpanEvidence) -> Option<Half> {
    Some(describe(spans, s, s.method.clone()?, s.request_id.as_deref()?))
}

/// The half of request span `s` of `(m, rid)`, with the keys of the client spans directly
/// under it.
fn describe(spans: &[SpanEvidence], s: &SpanEvidence, m: Method, rid: &str) -> Half {
    let mut h = Half::of(s, m, rid);
    for child in spans.iter().filter(|c| c.parent_span_id == Some(s.span_id) && c.side == Side::Client && c.has_rare()) {
        h.keys.fill_from(&child.keys());
    }
    h
}

/// [`client_halves`], where the spans `moved` names came from another trace (a join): a request
/// whose server span came from another trace than its client span (one of the two moved) is still
/// a client half as far as rivals are concerned, returned with `true` (joined).
pub(crate) fn client_halves_with(spans: &[SpanEvidence], moved: impl Fn(&SpanId) -> bool) -> Vec<(Half, bool)> {
    let served = |m: &Method, rid: &str, origin: Option<bool>| {
        spans.iter().any(|s| answers(s, m, rid) && origin.is_none_or(|o| moved(&s.span_id) == o))
    };
    spans
        .iter()
        .filter(|s| is_request(s) && s.side == Side::Client)
        .filter_map(|s| {
            let (m, rid) = (s.method.clone()?, s.request_id.as_deref()?);
            if served(&m, rid, Some(moved(&s.span_id))) {
                return None;
            }
            let joined = served(&m, rid, None);
            Some((describe(spans, s, m, rid), joined))
        })
        .collect()
}

/// The server halves a chain holds that came from another trace than their client (one side
/// moved in by a join): each a rival of any other client half it fits, as if it were alone.
pub(crate) fn joined_server_halves(spans: &[SpanEvidence], moved: impl Fn(&SpanId) -> bool) -> Vec<Half> {
    let mut out: Vec<Half> = Vec::new();
    for s in spans.iter().filter(|s| is_request(s) && s.side == Side::Server) {
        let (Some(m), Some(rid)) = (s.method.clone(), s.request_id.as_deref()) else { continue };
        let origin = moved(&s.span_id);
        let native = spans.iter().any(|c| {
            c.side == Side::Client && c.method.as_ref() == Some(&m) && c.request_id.as_deref() == Some(rid) && moved(&c.span_id) == origin
        });
        if native {
            continue;
        }
        match out.iter_mut().find(|h| h.method == m && &*h.request_id == rid) {
            Some(h) => {
                h.start_ns = h.start_ns.min(s.start_ns);
                h.end_ns = h.end_ns.max(s.end_ns);
            }
            None => {
                let mut h = Half::of(s, m, rid);
                for k in spans.iter().filter(|k| k.side == Side::Server && moved(&k.span_id) == origin && k.has_rare()) {
                    h.keys.fill_from(&k.keys());
                }
                out.push(h);
            }
        }
    }
    out
}

/// Whether client half `c` (a request span's) may be the client of server half `h`: the same
/// method and request id, its interval containing the server's, and the same server, session,
/// tool and client keys where both name one.
pub(crate) fn client_matches(c: &Half, h: &Half) -> bool {
    c.method == h.method
        && c.request_id == h.request_id
        && contains((c.start_ns, c.end_ns), (h.start_ns, h.end_ns))
        && compatible(c.server.as_deref(), h.server.as_deref())
        && compatible(c.session.as_deref(), h.session.as_deref())
        && compatible(c.tool.as_deref(), h.tool.as_deref())
        && c.keys.compatible(&h.keys)
}

/// How much clock slack the fit of server half `h` in client half `c` used: how far the server's
/// interval sticks out of the client's (0 when it lies within, as it does on one clock).
pub(crate) fn misfit(c: &Half, h: &Half) -> u64 {
    c.start_ns.saturating_sub(h.start_ns) + h.end_ns.saturating_sub(c.end_ns)
}

/// A fit within this much slack is exact (clocks that agree, give or take their precision).
pub(crate) const EXACT_FIT_NS: u64 = 1_000_000;
/// How much more slack every other candidate must need than an exact fit for the exact fit to be
/// taken: two agents reusing a request id one after the other (the second 50 ms after the first
/// ended) are told apart, two overlapping calls are not.
pub(crate) const CLEAR_MARGIN_NS: u64 = 25_000_000;

/// The one candidate among `cands` (chain, slack its fit used), if one is clearly it: the only
/// one, or the only exact fit where every other needs [`CLEAR_MARGIN_NS`] more slack. A chain
/// listed twice (nested spans of one request) counts once, at its tightest fit.
pub(crate) fn pick(cands: &[(TraceId, u64)]) -> HalfMatch {
    let mut best: smallvec::SmallVec<[(TraceId, u64); 4]> = smallvec::SmallVec::new();
    for &(t, m) in cands {
        match best.iter_mut().find(|(b, _)| *b == t) {
            Some(b) => b.1 = b.1.min(m),
            None => best.push((t, m)),
        }
    }
    match best.len() {
        0 => HalfMatch::None,
        1 => HalfMatch::One(best[0].0),
        _ => {
            let exact: smallvec::SmallVec<[&(TraceId, u64); 2]> = best.iter().filter(|(_, m)| *m <= EXACT_FIT_NS).collect();
            match exact.as_slice() {
                [one] if best.iter().all(|(t, m)| *t == one.0 || *m > one.1 + CLEAR_MARGIN_NS) => HalfMatch::One(one.0),
                _ => HalfMatch::Ambiguous,
            }
        }
    }
}

/// The key under which a shared store lists the client halves of `(method, request id)` that
/// started in second `sec` (see `engine`, "split calls on a shared store").
pub(crate) fn shared_half_key(m: &Method, rid: &str, sec: u64) -> String {
    // Built by hand in one allocation, without the formatting machinery: one is made per
    // published half.
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut n = sec;
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let m = m.as_str();
    let mut k = String::with_capacity(m.len() + rid.len() + (digits.len() - at) + 2);
    k.push_str(m);
    k.push('\n');
    k.push_str(rid);
    k.push('\n');
    k.extend(digits[at..].iter().map(|&d| char::from(d)));
    k
}

/// How far before its server half a client half is looked for in a shared store.
pub(crate) const SHARED_LOOKBACK_NS: u64 = 5 * BUCKET_NS;

/// The keys a server half's client half may be listed under in a shared store.
pub(crate) fn shared_half_keys(h: &Half) -> Vec<String> {
    let (a, b) = (h.start_ns.saturating_sub(SHARED_LOOKBACK_NS) / BUCKET_NS, h.start_ns.saturating_add(SLACK_NS) / BUCKET_NS);
    (a..=b).map(|sec| shared_half_key(&h.method, &h.request_id, sec)).collect()
}

/// Client requests of a chain that failed or never completed and have no server-side evidence
/// in the chain (no server span of the same method, no HTTP status): candidates for a refused
/// HTTP request.
pub(crate) fn refused_requests(spans: &[SpanEvidence]) -> Vec<Refused> {
    if spans.iter().any(|s| (s.http_status.is_some() && !s.is_stray_http()) || s.auth_status.is_some()) {
        return Vec::new();
    }
    let served = |m: &Method| spans.iter().any(|s| s.side == Side::Server && s.method.as_ref() == Some(m));
    spans
        .iter()
        .filter(|s| is_request(s) && s.side == Side::Client)
        .filter(|s| {
            matches!(s.error, Some(CallError::JsonRpc(_)) | Some(CallError::Unclassified))
                || s.status_error
                || s.request_sent_marker
                || s.response_unobserved
        })
        .filter(|s| !served(s.method.as_ref().unwrap()))
        .map(|s| Refused { trace_id: s.trace_id, span_id: s.span_id, start_ns: s.start_ns, end_ns: s.end_ns, server: s.server.clone() })
        .collect()
}

/// Whether an HTTP span may be a refused MCP request waiting for its client half.
pub(crate) fn is_orphan_candidate(s: &SpanEvidence) -> bool {
    s.side == Side::Server && s.http_mcp_endpoint && s.http_status.is_some_and(|h| h >= 400) && s.method.is_none()
}

/// Re-home an HTTP span into the trace of the client request it answered, under that request's
/// span, so the correlator joins it to that call by ancestry.
pub(crate) fn rehome(mut s: SpanEvidence, trace_id: TraceId, parent: SpanId) -> SpanEvidence {
    s.trace_id = trace_id;
    s.parent_span_id = Some(parent);
    s
}

/// The seconds (of [`BUCKET_NS`]) in which an HTTP request that answered `r` could have started:
/// its own, within the clock slack, at most five.
fn seconds(r: &Refused) -> std::ops::RangeInclusive<u64> {
    let (a, b) = (r.start_ns.saturating_sub(SLACK_NS) / BUCKET_NS, r.end_ns.saturating_add(SLACK_NS) / BUCKET_NS);
    a..=b.min(a + 4)
}

impl CrossJoin {
    /// Note a request span of a chain: a client request that failed or never completed may be
    /// the one a refused HTTP request answered (see `take_orphans`).
    pub fn note_request(&mut self, trace: TraceId, s: &SpanEvidence) {
        if is_request(s)
            && s.side == Side::Client
            && (matches!(s.error, Some(CallError::JsonRpc(_)) | Some(CallError::Unclassified))
                || s.status_error
                || s.request_sent_marker
                || s.response_unobserved)
        {
            if self.open_refused.len() >= MAX_REFUSED {
                self.open_refused.pop_front();
            }
            self.open_refused.push_back(Refused {
                trace_id: trace,
                span_id: s.span_id,
                start_ns: s.start_ns,
                end_ns: s.end_ns,
                server: s.server.clone(),
            });
        }
    }

    /// Index a chain under `keys` (see [`half_keys`]).
    pub fn insert_keys(&mut self, trace: TraceId, keys: &[u64]) {
        for &k in keys {
            match self.by_request.entry(k) {
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(Slot::One(trace));
                }
                std::collections::hash_map::Entry::Occupied(mut e) => match e.get_mut() {
                    Slot::One(t) if *t == trace => {}
                    Slot::One(t) => {
                        let first = *t;
                        e.insert(Slot::Many([first, trace].into_iter().collect()));
                    }
                    Slot::Many(v) => {
                        v.insert(trace);
                    }
                },
            }
        }
    }

    /// Drop a chain's entries (it was forgotten, or merged into another chain).
    pub fn remove_keys(&mut self, trace: TraceId, keys: &[u64]) {
        for k in keys {
            let gone = match self.by_request.get_mut(k) {
                Some(Slot::One(t)) => *t == trace,
                Some(Slot::Many(v)) => {
                    v.remove(&trace);
                    v.is_empty()
                }
                None => false,
            };
            if gone {
                self.by_request.remove(k);
            }
        }
    }

    /// Other chains holding a `side` request span of (method, request id) that started in
    /// `[from_ns, to_ns]` (at most [`MAX_BUCKETS`] seconds are probed). `None` when more than
    /// [`MAX_CANDIDATES`] chains qualify: the caller makes no join.
    fn candidates(&mut self, side: Side, h: &Half, from_ns: u64, to_ns: u64, not: TraceId) -> Option<Vec<TraceId>> {
        let (a, b) = (from_ns / BUCKET_NS, to_ns / BUCKET_NS);
        let (m, rid) = (&h.method, &*h.request_id);
        // A half that names its session looks there, and among the spans that name none; a half
        // that names none is compatible with every span of its key and time.
        // On the stack for the usual few buckets: a client-only chain looks here twice as it is
        // decided, and the vector's allocation was half of the look.
        let keys: smallvec::SmallVec<[u64; 8]> = match h.session.as_deref() {
            Some(sid) => std::iter::once(key(Kind::Session, side, m, rid, sid))
                .chain((a..=b.min(a + MAX_BUCKETS)).map(|bucket| key(Kind::Sessionless, side, m, rid, bucket)))
                .collect(),
            None => (a..=b.min(a + MAX_BUCKETS)).map(|bucket| key(Kind::Bucket, side, m, rid, bucket)).collect(),
        };
        let mut out: Vec<TraceId> = Vec::new();
        for k in keys {
            let Some(v) = self.by_request.get(&k) else { continue };
            for t in v.iter() {
                // A chain indexed in two buckets is found twice; `out` is at most MAX_CANDIDATES long.
                if *t != not && !out.contains(t) {
                    if out.len() == MAX_CANDIDATES {
                        self.stats.candidates_capped += 1;
                        self.stats.candidates_examined += out.len() as u64;
                        return None;
                    }
                    out.push(*t);
                }
            }
        }
        self.stats.candidates_examined += out.len() as u64;
        Some(out)
    }

    /// Chains that may hold the server half of client half `h` (`None`: too many to tell).
    pub fn server_candidates(&mut self, h: &Half, not: TraceId) -> Option<Vec<TraceId>> {
        self.candidates(Side::Server, h, h.start_ns.saturating_sub(SLACK_NS), h.end_ns.saturating_add(SLACK_NS), not)
    }

    /// Chains that may hold a client half of server half `h` (`None`: too many to tell): client
    /// requests that started up to [`CLIENT_LOOKBACK_NS`] before it.
    pub fn client_candidates(&mut self, h: &Half, not: TraceId) -> Option<Vec<TraceId>> {
        let from = h.start_ns.saturating_sub(CLIENT_LOOKBACK_NS);
        self.candidates(Side::Client, h, from, h.start_ns.saturating_add(SLACK_NS), not)
    }

    /// When the last refused-looking HTTP span that one of `refused` (a chain's refused requests)
    /// may have sent will have waited `wait` since it came, if one still waits: the chain's
    /// decision waits for it, so its rivals are known.
    pub fn orphans_waiting(&self, refused: &[Refused], now: Moment, wait: std::time::Duration) -> Option<Moment> {
        if refused.is_empty() {
            return None;
        }
        self.orphans
            .iter()
            .filter(|o| {
                o.at + wait > now
                    && refused
                        .iter()
                        .any(|r| started_within(r, o.span.start_ns, SLACK_NS) && compatible(r.server.as_deref(), o.span.server.as_deref()))
            })
            .map(|o| o.at + wait)
            .max()
    }

    /// The orphans of `trace` not matched yet leave: a chain of their own trace took them in.
    pub(crate) fn forget_orphans_of(&mut self, trace: TraceId) {
        self.orphans.retain(|o| o.settled || o.span.trace_id != trace);
    }

    /// Keep a refused-looking HTTP span until its client half is decided.
    pub fn push_orphan(&mut self, now: Moment, s: SpanEvidence, keep_for: std::time::Duration) {
        while self.orphans.front().is_some_and(|o| now.saturating_duration_since(o.at) > keep_for) || self.orphans.len() >= MAX_ORPHANS {
            self.orphans.pop_front();
        }
        self.orphans.push_back(Orphan { at: now, span: s, contested: false, settled: false });
    }

    /// Take the orphan HTTP spans that answered the `refused` requests (all of one chain). An HTTP
    /// request answers a client request when it started while the client request was open: first
    /// without any clock slack, and only when no orphan fits that way, within [`SLACK_NS`]. A
    /// client request takes an orphan only when exactly one fits and no other client request
    /// could have sent it, whether in flight or decided (the chain waited for the orphan's wait
    /// to end, so the rivals that were coming came). Nested client spans of one request (FastMCP's
    /// over the SDK's) are one request: the innermost takes it. Returns the orphans taken,
    /// re-homed under their request, and the requests an orphan fits that could not take it.
    pub fn take_orphans(&mut self, refused: &[Refused], is_active: impl Fn(&TraceId) -> bool) -> (Vec<SpanEvidence>, Vec<SpanId>) {
        let Some(trace) = refused.first().map(|r| r.trace_id) else { return (Vec::new(), Vec::new()) };
        if self.orphans.is_empty() {
            return (Vec::new(), Vec::new());
        }
        // Innermost first, so a nested outer span of the same request finds its orphan taken.
        let mut order: Vec<&Refused> = refused.iter().collect();
        order.sort_by_key(|r| r.end_ns.saturating_sub(r.start_ns));
        let (mut out, mut unjoined) = (Vec::new(), Vec::new());
        for r in order {
            let fits = |slack: u64| -> Vec<usize> {
                self.orphans
                    .iter()
                    .enumerate()
                    .filter(|(_, o)| started_within(r, o.span.start_ns, slack) && compatible(r.server.as_deref(), o.span.server.as_deref()))
                    .map(|(i, _)| i)
                    .collect()
            };
            let (mut hits, mut slack) = (fits(0), 0);
            if hits.is_empty() {
                (hits, slack) = (fits(SLACK_NS), SLACK_NS);
            }
            if hits.len() > 1 {
                self.stats.http_ambiguous += 1;
                unjoined.push(r.span_id);
                continue;
            }
            let Some(&i) = hits.first() else { continue };
            let o = &self.orphans[i].span;
            let rival_at = |s: u64| {
                let other = |x: &Refused| {
                    x.trace_id != trace && started_within(x, o.start_ns, s) && compatible(x.server.as_deref(), o.server.as_deref())
                };
                self.open_refused.iter().any(|x| is_active(&x.trace_id) && other(x)) || self.refused.iter().any(|(_, x)| other(x))
            };
            if slack > 0 && rival_at(0) {
                // It fits here only within the clock slack, and exactly another request: that
                // one takes it (an exact fit wins, whichever is decided first).
                continue;
            }
            // Another request could have sent it too, as well as this one: contested for good.
            if rival_at(slack) || self.orphans[i].contested {
                if !self.orphans[i].contested {
                    self.stats.http_ambiguous += 1;
                }
                self.orphans[i].contested = true;
                unjoined.push(r.span_id);
                continue;
            }
            if let Some(o) = self.orphans.remove(i) {
                self.stats.http_joined += 1;
                out.push(rehome(o.span, trace, r.span_id));
            }
        }
        // This chain's own entries in `open_refused` age out of the ring; a decided chain is not
        // active, so they no longer count as rivals.
        (out, unjoined)
    }

    /// The seconds (start second of an HTTP request, `start_ns / 1 s`) in which a refused HTTP
    /// request could answer a refused-looking client request of a chain in flight or of one
    /// decided less than `recent` ago: where a shared store's refusals are looked up (see
    /// `engine`, "refusals on a shared store"). At most `max` seconds, the latest requests first.
    pub fn wanted_seconds(&self, now: Moment, recent: std::time::Duration, is_active: impl Fn(&TraceId) -> bool, max: usize) -> Vec<u64> {
        let open = self.open_refused.iter().rev().map(|r| (r, true));
        let decided = self.refused.iter().rev().take_while(|(t, _)| now.saturating_duration_since(*t) <= recent).map(|(_, r)| (r, false));
        let mut out: Vec<u64> = Vec::new();
        for (r, in_flight) in open.chain(decided) {
            // Most requests fall in seconds already wanted: those are passed over before the
            // look into the chains in flight, which over a ring of thousands, every pull, was
            // the cost of the call (what is wanted is the same either way).
            if seconds(r).all(|s| out.contains(&s)) || (in_flight && !is_active(&r.trace_id)) {
                continue;
            }
            for sec in seconds(r) {
                if !out.contains(&sec) {
                    if out.len() >= max {
                        return out;
                    }
                    out.push(sec);
                }
            }
        }
        out.sort_unstable();
        out
    }

    /// Remember the refused requests of a decided chain, for HTTP spans arriving after it.
    pub fn remember_refused(&mut self, now: Moment, refused: Vec<Refused>, keep_for: std::time::Duration) {
        for r in refused {
            while self.refused.front().is_some_and(|(t, _)| now.saturating_duration_since(*t) > keep_for)
                || self.refused.len() >= MAX_REFUSED
            {
                self.refused.pop_front();
            }
            self.refused.push_back((now, r));
        }
    }

    /// What a refused HTTP span whose wait is over answered: the decided chain whose refused
    /// request it fits, if exactly one chain's does (without clock slack first, then within
    /// [`SLACK_NS`]; nested client spans of one chain count once) and no request in flight fits
    /// it as well. The chain's entries are consumed when it is taken.
    pub fn late_http(&mut self, o: &SpanEvidence, is_active: impl Fn(&TraceId) -> bool) -> LateHttp {
        let in_flight = |slack: u64| {
            self.open_refused.iter().any(|x| {
                is_active(&x.trace_id) && started_within(x, o.start_ns, slack) && compatible(x.server.as_deref(), o.server.as_deref())
            })
        };
        let fits = |slack: u64| -> Vec<usize> {
            self.refused
                .iter()
                .enumerate()
                .filter(|(_, (_, r))| started_within(r, o.start_ns, slack) && compatible(r.server.as_deref(), o.server.as_deref()))
                .map(|(i, _)| i)
                .collect()
        };
        // Exact fits first, as at a decision (`take_orphans`): a decided request the HTTP span
        // started within is its match unless one still in flight fits as exactly; only when none
        // fits exactly does a request in flight within the clock slack take precedence (leave it
        // to that decision), and then the decided ones within the slack.
        let mut hits = fits(0);
        if hits.is_empty() {
            if in_flight(SLACK_NS) {
                return LateHttp::InFlight;
            }
            hits = fits(SLACK_NS);
        } else if in_flight(0) {
            return LateHttp::InFlight;
        }
        let Some(&first) = hits.first() else { return LateHttp::None };
        let trace = self.refused[first].1.trace_id;
        if hits.iter().any(|i| self.refused[*i].1.trace_id != trace) {
            self.stats.http_ambiguous += 1;
            let mut traces: Vec<TraceId> = hits.iter().map(|i| self.refused[*i].1.trace_id).collect();
            traces.sort_unstable();
            traces.dedup();
            return LateHttp::Ambiguous(traces);
        }
        let inner =
            hits.iter().copied().min_by_key(|i| self.refused[*i].1.end_ns.saturating_sub(self.refused[*i].1.start_ns)).unwrap_or(first);
        let span = self.refused[inner].1.span_id;
        self.refused.retain(|(_, r)| r.trace_id != trace);
        self.stats.http_joined += 1;
        LateHttp::One(trace, span)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::correlate::{ChainLimits, Chains};
    use crate::normalize::NormalizedBatch;
    use crate::verdict::DecidedBy;

    const MS: u64 = 1_000_000;

    /// The seconds wanted are the same whether requests in seconds already wanted are passed
    /// over before the look into the chains in flight or not: the plain reading, over rings of
    /// requests in flight and decided ones, some active, with and without the cap.
    #[test]
    fn wanted_seconds_pass_over_known_seconds_and_want_the_same() {
        let plain = |j: &CrossJoin, now: Moment, recent: Duration, active: &dyn Fn(&TraceId) -> bool, max: usize| {
            let open = j.open_refused.iter().rev().filter(|r| active(&r.trace_id));
            let decided = j.refused.iter().rev().take_while(|(t, _)| now.saturating_duration_since(*t) <= recent).map(|(_, r)| r);
            let mut out: Vec<u64> = Vec::new();
            for r in open.chain(decided) {
                for sec in seconds(r) {
                    if !out.contains(&sec) {
                        if out.len() >= max {
                            return out;
                        }
                        out.push(sec);
                    }
                }
            }
            out.sort_unstable();
            out
        };
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let t0 = Moment::from_nanos(1_764_000_000_000_000_000);
        for case in 0..200 {
            let mut j = CrossJoin::default();
            let refused = |n: u64, next: &mut dyn FnMut() -> u64| Refused {
                trace_id: [(n % 251) as u8 + 1; 16],
                span_id: [1; 8],
                start_ns: 1_764_000_000_000_000_000 + (next() % 20) * BUCKET_NS + next() % BUCKET_NS,
                end_ns: 1_764_000_000_000_000_000 + (next() % 26) * BUCKET_NS,
                server: None,
            };
            for n in 0..next() % 300 {
                let r = refused(n, &mut next);
                j.open_refused.push_back(r);
            }
            for n in 0..next() % 100 {
                let r = refused(n + 1000, &mut next);
                j.refused.push_back((t0 + Duration::from_millis(next() % 4000), r));
            }
            let modulus = 1 + next() % 5;
            let active = move |t: &TraceId| u64::from(t[0]) % modulus == 0;
            let (now, recent, max) = (t0 + Duration::from_secs(3), Duration::from_millis(next() % 4000), 1 + (next() % 40) as usize);
            assert_eq!(j.wanted_seconds(now, recent, active, max), plain(&j, now, recent, &active, max), "case {case}");
        }
    }

    fn limits() -> ChainLimits {
        ChainLimits {
            decision_wait: Duration::from_millis(100),
            max_wait: Duration::from_secs(5),
            server_half_wait: Duration::from_secs(2),
            ..ChainLimits::default()
        }
    }

    fn span(trace: u8, id: u8, parent: Option<u8>, side: Side, method: Option<Method>, rid: Option<&str>, at: (u64, u64)) -> SpanEvidence {
        let mut s = SpanEvidence::new([trace; 16], [id; 8]);
        s.parent_span_id = parent.map(|p| [p; 8]);
        s.side = side;
        s.method = method;
        s.request_id = rid.map(Into::into);
        s.start_ns = at.0 * MS;
        s.end_ns = at.1 * MS;
        s
    }

    /// The key is a store format other instances (and older builds) read: built by hand, it
    /// must stay what the formatted form was.
    #[test]
    fn shared_half_keys_keep_their_format() {
        for (m, rid, sec) in [
            (Method::ToolsCall, "7", 0u64),
            (Method::Initialize, "", 9),
            (Method::ToolsList, "a\nb", 10),
            (Method::ToolsCall, "é-ü", 1_733_300_000),
            (Method::ToolsCall, "x", u64::MAX),
        ] {
            assert_eq!(shared_half_key(&m, rid, sec), format!("{}\n{rid}\n{sec}", m.as_str()));
        }
    }

    fn refused_client(trace: u8, at: (u64, u64)) -> SpanEvidence {
        let mut c = span(trace, 1, None, Side::Client, Some(Method::Initialize), Some("1"), at);
        c.error = Some(CallError::JsonRpc(-32603));
        c.error_maybe_client_rendered = true;
        c
    }

    fn http(trace: u8, status: u16, at: (u64, u64)) -> SpanEvidence {
        let mut h = span(trace, 9, None, Side::Server, None, None, at);
        h.http_status = Some(status);
        h.http_mcp_endpoint = true;
        h
    }

    fn feed(c: &mut Chains, spans: Vec<SpanEvidence>, now: Moment, out: &mut Vec<crate::correlate::DecidedCalls>) {
        c.ingest(NormalizedBatch { evidence: spans, ..Default::default() }, now, out);
    }

    #[test]
    fn a_refused_request_takes_the_http_status_from_another_trace_before_or_after_its_decision() {
        for late in [false, true] {
            let mut c = Chains::new(limits());
            let t0 = Moment::from_nanos(1_000_000_000_000);
            let mut out = Vec::new();
            feed(&mut c, vec![refused_client(1, (100, 110))], t0, &mut out);
            if !late {
                feed(&mut c, vec![http(2, 403, (102, 104))], t0, &mut out);
                // The client request waits for the HTTP span's wait (decision_wait + the half's
                // wait): another request that may have sent it could still come.
                c.tick(t0 + Duration::from_millis(200), &mut out);
                assert!(out.is_empty(), "held for the refusal's wait: {out:#?}");
            }
            c.tick(t0 + Duration::from_millis(2_200), &mut out);
            if late {
                assert_eq!(out.len(), 1);
                assert_eq!(out[0].calls[0].http_status, None, "decided before the HTTP span came");
                feed(&mut c, vec![http(2, 403, (102, 104))], t0 + Duration::from_millis(2_300), &mut out);
                c.tick(t0 + Duration::from_millis(2_500), &mut out);
                assert_eq!(out.len(), 1, "the late HTTP span waits too before it joins");
                c.tick(t0 + Duration::from_millis(4_400), &mut out);
                c.tick(t0 + Duration::from_millis(4_600), &mut out);
            }
            let last = out.last().unwrap();
            assert_eq!(last.trace_id, [1; 16]);
            assert_eq!(last.calls[0].http_status, Some(403), "late={late}");
            assert_eq!(last.calls[0].jsonrpc_error, Some(-32603), "kept, but the auth failure explains it");
            assert_eq!(last.decision.revision, late as u32);
            assert_eq!(c.cross.stats.http_joined, 1);
        }
    }

    #[test]
    fn an_http_span_two_refused_requests_could_have_answered_joins_neither() {
        let mut c = Chains::new(limits());
        let t0 = Moment::from_nanos(1_000_000_000_000);
        let mut out = Vec::new();
        feed(&mut c, vec![refused_client(1, (100, 110)), refused_client(3, (101, 111)), http(2, 401, (102, 104))], t0, &mut out);
        c.tick(t0 + Duration::from_millis(2_200), &mut out);
        assert_eq!(out.len(), 2);
        assert!(out.iter().all(|d| d.calls[0].http_status.is_none()), "whichever is decided first");
        assert!(out.iter().all(|d| d.calls[0].server_half_unjoined), "each says its refusal could not be told");
        assert_eq!(c.cross.stats.http_joined, 0);
        assert!(c.cross.stats.http_ambiguous > 0);
    }

    #[test]
    fn a_server_half_in_another_trace_joins_its_client_half_and_gives_no_verdict_of_its_own() {
        let mut c = Chains::new(limits());
        let t0 = Moment::from_nanos(1_000_000_000_000);
        let mut out = Vec::new();
        let client = span(1, 1, None, Side::Client, Some(Method::ToolsCall), Some("4"), (100, 120));
        let mut http_root = http(2, 200, (101, 119));
        http_root.span_id = [7; 8];
        let server = span(2, 8, Some(7), Side::Server, Some(Method::ToolsCall), Some("4"), (102, 118));
        feed(&mut c, vec![server, http_root], t0, &mut out);
        feed(&mut c, vec![client], t0 + Duration::from_millis(150), &mut out);
        c.tick(t0 + Duration::from_millis(400), &mut out);
        assert!(out.is_empty(), "the client waits for the server half's wait: its rivals may still come");
        // Deferred at the tick that found it quiet (400 ms), the half decides 2 s later.
        c.tick(t0 + Duration::from_millis(2_500), &mut out);
        let calls: Vec<_> = out.iter().flat_map(|d| d.calls.iter()).collect();
        assert_eq!(calls.len(), 1, "{out:#?}");
        assert!(calls[0].client_seen && calls[0].server_seen);
        assert_eq!(out.last().unwrap().trace_id, [1; 16], "the verdict is the client's trace's");
        assert_eq!(c.cross.stats.halves_joined, 1);
    }

    /// Issue 8, defect 1: FastMCP behind HTTP server tracing, where every session's first call is
    /// id 1 and each server half is a trace of its own. Many such calls at once are decided with
    /// bounded work per decision (the engine froze on 1,000), and joined where the session says
    /// which client half is whose.
    #[test]
    fn a_thousand_split_calls_sharing_request_id_one_are_decided_with_bounded_work() {
        for with_sessions in [true, false] {
            let n: u32 = 1_000;
            let mut c = Chains::new(ChainLimits { max_wait: Duration::from_secs(30), ..limits() });
            let t0 = Moment::from_nanos(1_000_000_000_000);
            let mut out = Vec::new();
            let id = |side: u8, i: u32| {
                let mut t = [side; 16];
                t[..4].copy_from_slice(&i.to_be_bytes());
                t
            };
            let mut batch = Vec::new();
            for i in 0..n {
                let at = (100 + u64::from(i % 50), 150 + u64::from(i % 50));
                let mut client = span(0, 1, None, Side::Client, Some(Method::ToolsCall), Some("1"), at);
                client.trace_id = id(1, i);
                let mut root = http(0, 200, (at.0 + 1, at.1 - 1));
                root.trace_id = id(2, i);
                root.span_id = [7; 8];
                let mut server = span(0, 8, Some(7), Side::Server, Some(Method::ToolsCall), Some("1"), (at.0 + 2, at.1 - 2));
                server.trace_id = id(2, i);
                if with_sessions {
                    client.session_id = Some(format!("s-{i}").into());
                    server.session_id = Some(format!("s-{i}").into());
                }
                batch.extend([server, root, client]);
            }
            feed(&mut c, batch, t0, &mut out);
            c.tick(t0 + Duration::from_millis(400), &mut out);
            c.tick(t0 + Duration::from_secs(3), &mut out);
            c.drain(DecidedBy::Shutdown, t0 + Duration::from_secs(4), &mut out);
            let calls: usize = out.iter().map(|d| d.calls.len()).sum();
            let decisions = out.len() as u64;
            let st = &c.cross.stats;
            if with_sessions {
                assert_eq!(st.halves_joined, u64::from(n), "the session names each client half");
                assert_eq!(calls, n as usize, "one verdict per call");
                assert!(st.candidates_examined <= 4 * u64::from(n), "an exact lookup per half: {st:?}");
            } else {
                assert_eq!(st.halves_joined, 0, "a thousand candidates: no unique match can be shown");
                assert_eq!(calls, 2 * n as usize, "each half alone");
                assert!(st.candidates_capped > 0, "{st:?}");
            }
            let per_decision = (MAX_CANDIDATES * (MAX_CANDIDATES + 1)) as u64;
            assert!(st.candidates_examined <= per_decision * decisions.max(1) * 2, "bounded per decision: {st:?}");
        }
    }

    #[test]
    fn the_same_request_id_in_two_client_traces_is_ambiguous() {
        let mut c = Chains::new(limits());
        let t0 = Moment::from_nanos(1_000_000_000_000);
        let mut out = Vec::new();
        let a = span(1, 1, None, Side::Client, Some(Method::ToolsCall), Some("4"), (100, 120));
        let b = span(3, 3, None, Side::Client, Some(Method::ToolsCall), Some("4"), (99, 121));
        let server = span(2, 8, None, Side::Server, Some(Method::ToolsCall), Some("4"), (102, 118));
        feed(&mut c, vec![a, b, server], t0, &mut out);
        c.tick(t0 + Duration::from_millis(400), &mut out);
        // The server half (its root is a server span) waits 2 s more for a client half.
        c.tick(t0 + Duration::from_millis(2_600), &mut out);
        assert_eq!(out.iter().flat_map(|d| d.calls.iter()).count(), 3, "no join: three verdicts");
        assert_eq!(c.cross.stats.halves_joined, 0);
        assert!(c.cross.stats.ambiguous > 0);
        // Issue 21: the server half that either client call could own adds no attempt of its
        // own (each client half is one); the two client halves are attempts.
        let attempts: Vec<bool> = out.iter().flat_map(|d| d.calls.iter()).map(|call| crate::classify::is_attempt(call, false)).collect();
        assert_eq!(attempts.iter().filter(|a| **a).count(), 2, "{attempts:?}");
        assert!(out.iter().flat_map(|d| d.calls.iter()).any(|call| call.unjoined_half && call.server_seen && !call.client_seen));
    }

    /// Issue 8, defect 3: at shutdown, and with `max_decided: 0`, a decided client half used to
    /// leave the index at once, so the client half decided second looked unique and took the
    /// server half. Whatever the order of decisions, two client halves for one server half is no join.
    #[test]
    fn an_ambiguous_match_stays_no_match_through_a_drain_in_either_order() {
        for max_decided in [0, 100_000] {
            for order in [[1u8, 3], [3, 1]] {
                let mut c = Chains::new(ChainLimits { max_decided, ..limits() });
                let t0 = Moment::from_nanos(1_000_000_000_000);
                let mut out = Vec::new();
                let client = |t: u8, at| span(t, t, None, Side::Client, Some(Method::ToolsCall), Some("4"), at);
                let server = span(2, 8, None, Side::Server, Some(Method::ToolsCall), Some("4"), (102, 118));
                feed(&mut c, vec![client(order[0], (100, 120)), client(order[1], (99, 121)), server], t0, &mut out);
                c.drain(DecidedBy::Shutdown, t0 + Duration::from_millis(10), &mut out);
                assert_eq!(c.cross.stats.halves_joined, 0, "max_decided={max_decided} order={order:?}: {:?}", c.cross.stats);
                assert_eq!(out.iter().flat_map(|d| d.calls.iter()).count(), 3, "no join: three verdicts");
                assert_eq!(c.bytes(), 0, "chains decided at shutdown are released once the drain is complete");
            }
        }
    }

    /// The tap writes a session id hashed (it can be a credential); a server span records it raw.
    /// Their halves still name one session, and another session's half is no rival.
    #[test]
    fn a_taps_hashed_session_and_the_servers_raw_one_are_one_session() {
        let mut c = Chains::new(limits());
        let t0 = Moment::from_nanos(1_000_000_000_000);
        let mut out = Vec::new();
        let mut tap = span(1, 1, None, Side::Client, Some(Method::ToolsCall), Some("1"), (100, 120));
        tap.session_id = Some(crate::evidence::hash::session_hash("sess-a"));
        let mut other = span(3, 3, None, Side::Client, Some(Method::ToolsCall), Some("1"), (100, 121));
        other.session_id = Some(crate::evidence::hash::session_hash("sess-b"));
        let mut server = span(2, 8, None, Side::Server, Some(Method::ToolsCall), Some("1"), (102, 118));
        server.session_id = Some(Arc::from("sess-a"));
        feed(&mut c, vec![tap, other, server], t0, &mut out);
        c.tick(t0 + Duration::from_millis(200), &mut out);
        c.tick(t0 + Duration::from_millis(2_400), &mut out);
        c.tick(t0 + Duration::from_millis(2_600), &mut out);
        assert_eq!(c.cross.stats.halves_joined, 1, "{:?}", c.cross.stats);
        let joined = out.iter().find(|d| d.trace_id == [1; 16]).unwrap();
        assert!(joined.calls[0].server_seen && !joined.calls[0].server_half_unjoined);
        let other = out.iter().find(|d| d.trace_id == [3; 16]).unwrap();
        assert!(!other.calls[0].server_seen && !other.calls[0].server_half_unjoined, "another session's call: no rival");
    }

    #[test]
    fn a_client_rendered_error_alone_is_unattributed() {
        let mut call = crate::evidence::call::CallEvidence::default();
        call.absorb(&refused_client(1, (100, 110)));
        call.settle();
        assert_eq!(call.jsonrpc_error, None);
        assert!(call.unexplained_error && !call.response_seen);
        // With the server's own code, the code stands.
        let mut call = crate::evidence::call::CallEvidence::default();
        call.absorb(&refused_client(1, (100, 110)));
        let mut srv = span(1, 2, Some(1), Side::Server, Some(Method::Initialize), Some("1"), (101, 109));
        srv.error = Some(CallError::JsonRpc(-32603));
        call.absorb(&srv);
        call.settle();
        assert_eq!(call.jsonrpc_error, Some(-32603));
    }
}
