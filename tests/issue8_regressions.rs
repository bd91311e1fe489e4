//! Issue 8's defects 7, 8 and 12, each from its minimal reproduction, through the library's own
//! session table and the engine's `session_context` (the calls are classified exactly as the
//! service and `replay` classify them).

use mcp_health::evidence::time::Moment;
use std::sync::Arc;

use mcp_health::engine::session_context;
use mcp_health::evidence::call::CallEvidence;
use mcp_health::evidence::catalog::{CatalogFacts, ListPage, SignalSource};
use mcp_health::evidence::{Method, Side, SpanEvidence};
use mcp_health::testing::classify::digest::{registry_digest, ToolDigest, PROJECTION_VERSION};
use mcp_health::testing::classify::{classify_call, Decision};
use mcp_health::testing::correlate::{SessionLimits, Sessions};
use mcp_health::verdict::{DecidedBy, HealthState, Layer};

const SERVER: &str = "127.0.0.1:8931";
const D: Decision = Decision { revision: 0, decided_by: DecidedBy::Quiet, root_seen: true, truncated: false };

fn fact(id: u8, at: u64, session: Option<&str>, service: &str, f: CatalogFacts) -> SpanEvidence {
    let mut s = SpanEvidence::new([9; 16], [id; 8]);
    s.session_id = session.map(Into::into);
    s.service = Some(Arc::from(service));
    s.server = Some(Arc::from(SERVER));
    s.side = Side::Client;
    s.start_ns = at;
    s.end_ns = at;
    s.catalog = Some(Box::new(f));
    s
}

fn page(id: u8, at: u64, session: Option<&str>, service: &str, cursor: Option<&str>, next: bool, tools: &[&str]) -> SpanEvidence {
    let mut s = fact(
        id,
        at,
        session,
        service,
        CatalogFacts {
            page: Some(ListPage {
                cursor: cursor.map(Into::into),
                next_cursor_present: next,
                tools: tools.iter().map(|t| (Arc::from(*t), Arc::from(digest_of(t).as_str()))).collect(),
                ttl_ms: None,
                cache_scope: None,
            }),
            ..Default::default()
        },
    );
    s.method = Some(Method::ToolsList);
    s.request_id = Some(format!("list-{id}").into());
    s
}

fn digest_of(tool: &str) -> String {
    format!("sha256:{:0>64}", tool.len())
}

fn installed(tools: &[&str]) -> CatalogFacts {
    let tds: Vec<ToolDigest> = tools
        .iter()
        .map(|t| ToolDigest { name: t.to_string(), digest: digest_of(t), projection_version: PROJECTION_VERSION.into() })
        .collect();
    CatalogFacts { installed_digest: Some(Arc::from(registry_digest(&tds).as_str())), ..Default::default() }
}

/// A two-page baseline (`echo` on page one, `add` on page two), installed, with `listChanged`.
fn baseline(session: Option<&str>, service: &str) -> Vec<SpanEvidence> {
    vec![
        fact(1, 1, session, service, CatalogFacts { list_changed_capability: Some(true), ..Default::default() }),
        page(2, 10, session, service, None, true, &["echo"]),
        page(3, 20, session, service, Some("c1"), false, &["add"]),
        fact(4, 21, session, service, installed(&["echo", "add"])),
    ]
}

fn call(session: Option<&str>, tool: &str, at: u64) -> CallEvidence {
    CallEvidence {
        method: Some(Method::ToolsCall),
        tool: Some(Arc::from(tool)),
        session_id: session.map(Into::into),
        server: Some(Arc::from(SERVER)),
        client_seen: true,
        server_seen: true,
        response_seen: true,
        start_ns: at,
        end_ns: at + 5,
        ..Default::default()
    }
}

fn state_of(sessions: &Sessions, c: &CallEvidence) -> HealthState {
    classify_call(c, &session_context(sessions, None, c), D).state
}

/// Defect 7: the TypeScript SDK's `listChanged.autoRefresh` re-lists page one only after a change
/// signal; a call after that partial re-list is still `stale_catalog`, as it is with no re-list.
#[test]
fn a_partial_relist_after_a_change_signal_keeps_calls_stale_catalog() {
    let s = Some("ts-1");
    let mut sessions = Sessions::new(SessionLimits::default());
    let mut spans = baseline(s, "agent");
    spans.push(fact(5, 40, s, "agent", CatalogFacts { signal: Some(SignalSource::Notification), ..Default::default() }));
    sessions.observe(&spans, Moment::from_nanos(1_000_000_000_000));
    assert_eq!(state_of(&sessions, &call(s, "echo", 45)), HealthState::StaleCatalog, "no re-list");
    sessions.observe(&[page(6, 50, s, "agent", None, true, &["echo"])], Moment::from_nanos(1_000_000_000_000));
    assert_eq!(state_of(&sessions, &call(s, "echo", 60)), HealthState::StaleCatalog, "page one only: still stale");
    assert_eq!(state_of(&sessions, &call(s, "echo", 45)), HealthState::StaleCatalog, "before the re-list, as before");
    // Completing the traversal (and installing it) clears it.
    sessions.observe(
        &[page(7, 70, s, "agent", Some("c1"), false, &["add"]), fact(8, 71, s, "agent", installed(&["echo", "add"]))],
        Moment::from_nanos(1_000_000_000_000),
    );
    assert_eq!(state_of(&sessions, &call(s, "echo", 80)), HealthState::Unverified, "moves on to its own layers");
}

/// Defect 8: the TypeScript SDK's `McpServer` (and server-everything) answer a call of an unknown
/// tool with an `isError` result ("MCP error -32602: Tool X not found"). With a converged catalog
/// that lacks the tool, the call is `protocol_error` / `unknown_tool`, read from the catalog alone.
#[test]
fn a_tool_absent_from_the_converged_catalog_is_an_unknown_tool() {
    let sid = "ts-2";
    let mut sessions = Sessions::new(SessionLimits::default());
    sessions.observe(&baseline(Some(sid), "agent"), Moment::from_nanos(1_000_000_000_000));
    let key = format!("session:{sid}");
    assert_eq!(sessions.tool_in_catalog_at(&key, "nope", 30), Some(false));
    assert_eq!(sessions.tool_in_catalog_at(&key, "add", 30), Some(true));
    assert_eq!(sessions.tool_in_catalog_at(&key, "add", 15), None, "mid-traversal: no converged catalog yet");
    let mut c = call(Some(sid), "nope", 30);
    c.tool_error = true;
    let v = classify_call(&c, &session_context(&sessions, None, &c), D);
    assert_eq!(
        (v.state, v.first_failed_layer, v.reason.as_deref()),
        (HealthState::ProtocolError, Some(Layer::Protocol), Some("unknown_tool"))
    );
    // A known tool's isError stays a tool failure.
    let mut known = call(Some(sid), "add", 30);
    known.tool_error = true;
    assert_eq!(state_of(&sessions, &known), HealthState::ToolFailed);
    // No converged catalog (an unknown session): the rule does not apply.
    let mut elsewhere = call(Some("other"), "nope", 30);
    elsewhere.tool_error = true;
    assert_eq!(state_of(&sessions, &elsewhere), HealthState::ToolFailed);
}

/// Defect 12: a tap with its own `--service-name` beside an agent that reports another
/// `service.name`, on a session-less protocol. The catalog is the tap's (it sees the pages); the
/// call has both client spans. The same spans absorbed in either order give the same key and the
/// same verdict.
#[test]
fn the_session_key_does_not_depend_on_absorption_order() {
    let mut sessions = Sessions::new(SessionLimits::default());
    let mut spans = baseline(None, "tap");
    spans.push(fact(5, 40, None, "tap", CatalogFacts { signal: Some(SignalSource::Notification), ..Default::default() }));
    sessions.observe(&spans, Moment::from_nanos(1_000_000_000_000));
    let request = |id: u8, start: u64, service: &str| {
        let mut s = SpanEvidence::new([7; 16], [id; 8]);
        s.method = Some(Method::ToolsCall);
        s.tool = Some(Arc::from("echo"));
        s.side = Side::Client;
        s.start_ns = start;
        s.end_ns = start + 100;
        s.service = Some(Arc::from(service));
        s.server = Some(Arc::from(SERVER));
        s
    };
    let agent = request(1, 50, "agent");
    let mut tap = request(2, 51, "tap");
    tap.parent_span_id = Some([1; 8]);
    tap.request_id = Some("5".into());
    let verdict = |order: &[&SpanEvidence]| {
        let mut c = CallEvidence::default();
        order.iter().for_each(|s| c.absorb(s));
        c.settle();
        let key = mcp_health::evidence::session_key(c.session_id.as_deref(), c.service.as_deref(), c.server.as_deref(), Side::Client);
        (key, state_of(&sessions, &c))
    };
    let tap_first = verdict(&[&tap, &agent]);
    let agent_first = verdict(&[&agent, &tap]);
    assert_eq!(tap_first, agent_first);
    assert_eq!(tap_first, (Some(format!("client:tap|server:{SERVER}")), HealthState::StaleCatalog));
    // In flight, only the tap's span is seen: the same key, so the same verdict as at the end.
    assert_eq!(verdict(&[&tap]), tap_first);
}
