//! The observer, fed JSON-RPC lines and bodies as the pumps would.

use serde_json::{json, Value};

use super::*;
use crate::classify::digest::tool_digest;

fn stdio_observer() -> Observer {
    Observer::new(ServerIdentity { address: "fake-server".into(), port: None, transport: Transport::Pipe })
}

fn http_observer() -> Observer {
    Observer::new(ServerIdentity { address: "127.0.0.1".into(), port: Some(8931), transport: Transport::Tcp })
}

fn at(ns: u64) -> Ctx<'static> {
    Ctx { at_ns: ns, ..Default::default() }
}

fn attr<'a>(s: &'a Span, key: &str) -> Option<&'a any_value::Value> {
    s.attributes.iter().find(|k| k.key == key).and_then(|k| k.value.as_ref()).and_then(|v| v.value.as_ref())
}
fn astr<'a>(s: &'a Span, key: &str) -> Option<&'a str> {
    match attr(s, key) {
        Some(any_value::Value::StringValue(x)) => Some(x),
        _ => None,
    }
}
fn aint(s: &Span, key: &str) -> Option<i64> {
    match attr(s, key) {
        Some(any_value::Value::IntValue(x)) => Some(*x),
        _ => None,
    }
}
fn abool(s: &Span, key: &str) -> Option<bool> {
    match attr(s, key) {
        Some(any_value::Value::BoolValue(x)) => Some(*x),
        _ => None,
    }
}
fn adouble(s: &Span, key: &str) -> Option<f64> {
    match attr(s, key) {
        Some(any_value::Value::DoubleValue(x)) => Some(*x),
        _ => None,
    }
}
fn astrs(s: &Span, key: &str) -> Vec<String> {
    match attr(s, key) {
        Some(any_value::Value::ArrayValue(a)) => a
            .values
            .iter()
            .filter_map(|v| match v.value.as_ref() {
                Some(any_value::Value::StringValue(x)) => Some(x.clone()),
                _ => None,
            })
            .collect(),
        _ => vec![],
    }
}

fn client(o: &mut Observer, v: serde_json::Value, ns: u64) {
    o.client_bytes(v.to_string().as_bytes(), &at(ns));
}
fn server(o: &mut Observer, v: serde_json::Value, ns: u64) {
    o.server_bytes(v.to_string().as_bytes(), &at(ns));
}

fn tools_page_1() -> serde_json::Value {
    json!([
        {"name": "echo", "description": "Echo the input", "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}},
        {"name": "add", "description": "Add two numbers", "inputSchema": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}, "icons": [{"src": "x.png"}]}
    ])
}
fn tools_page_2() -> serde_json::Value {
    json!([{"name": "fail", "description": "Always fails", "inputSchema": {"type": "object"}, "annotations": {"destructiveHint": false}}])
}

#[test]
fn initialize_records_versions_and_list_changed_capability() {
    let mut o = stdio_observer();
    client(
        &mut o,
        json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"c","version":"1"}}}),
        1_000,
    );
    assert!(o.take_spans().is_empty(), "no span before the response");
    server(
        &mut o,
        json!({"jsonrpc":"2.0","id":0,"result":{"protocolVersion":"2025-06-18","capabilities":{"tools":{"listChanged":true}},"serverInfo":{"name":"s","version":"1"}}}),
        5_000,
    );
    let spans = o.take_spans();
    assert_eq!(spans.len(), 1);
    let s = &spans[0];
    assert_eq!(s.name, "initialize");
    assert_eq!(s.kind, SpanKind::Client as i32);
    assert_eq!((s.start_time_unix_nano, s.end_time_unix_nano), (1_000, 5_000));
    assert_eq!(astr(s, a::MCP_METHOD_NAME), Some("initialize"));
    assert_eq!(astr(s, a::JSONRPC_REQUEST_ID), Some("0"));
    assert_eq!(astr(s, a::SESSION_REQUESTED_VERSION), Some("2025-11-25"));
    assert_eq!(astr(s, a::MCP_PROTOCOL_VERSION), Some("2025-06-18"), "the negotiated version");
    assert_eq!(abool(s, a::SESSION_LIST_CHANGED_CAPABILITY), Some(true));
    assert_eq!(astr(s, a::NETWORK_TRANSPORT), Some("pipe"));
    assert_eq!(astr(s, a::SERVER_ADDRESS), Some("fake-server"));
    assert_eq!(aint(s, a::SERVER_PORT), None);
    assert_eq!(astr(s, a::MCP_SESSION_ID), None, "stdio has no session");
    assert!(astr(s, a::ERROR_TYPE).is_none());

    // Later spans of the session carry the negotiated version.
    client(&mut o, json!({"jsonrpc":"2.0","id":1,"method":"ping"}), 6_000);
    server(&mut o, json!({"jsonrpc":"2.0","id":1,"result":{}}), 7_000);
    let spans = o.take_spans();
    assert_eq!(astr(&spans[0], a::MCP_PROTOCOL_VERSION), Some("2025-06-18"));

    // A server without tools.listChanged.
    let mut o = stdio_observer();
    client(&mut o, json!({"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":"2025-11-25"}}), 1);
    server(&mut o, json!({"jsonrpc":"2.0","id":"init","result":{"protocolVersion":"2025-11-25","capabilities":{"tools":{}}}}), 2);
    assert_eq!(abool(&o.take_spans()[0], a::SESSION_LIST_CHANGED_CAPABILITY), Some(false));
}

#[test]
fn paginated_list_gives_cursors_digests_and_the_installed_registry() {
    let mut o = stdio_observer();
    client(&mut o, json!({"jsonrpc":"2.0","id":1,"method":"tools/list"}), 10);
    server(&mut o, json!({"jsonrpc":"2.0","id":1,"result":{"tools": tools_page_1(), "nextCursor": "page-2"}}), 20);
    client(&mut o, json!({"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"cursor":"page-2"}}), 30);
    server(&mut o, json!({"jsonrpc":"2.0","id":2,"result":{"tools": tools_page_2()}}), 40);
    let spans = o.take_spans();
    assert_eq!(spans.len(), 3, "two pages and the installed registry: {spans:#?}");
    let (p1, p2, inst) = (&spans[0], &spans[1], &spans[2]);

    assert_eq!(p1.name, "tools/list");
    assert_eq!(astr(p1, a::CATALOG_CURSOR), None, "the first page sends no cursor");
    assert_eq!(abool(p1, a::CATALOG_NEXT_CURSOR_PRESENT), Some(true));
    assert_eq!(aint(p1, a::CATALOG_TOOL_COUNT), Some(2));
    let want1: Vec<String> = tools_page_1()
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let d = tool_digest(t).unwrap();
            format!("{}={}", d.name, d.digest)
        })
        .collect();
    assert_eq!(astrs(p1, a::CATALOG_TOOL_DIGESTS), want1, "digests equal tool_digest of the definitions");

    let cursor = astr(p2, a::CATALOG_CURSOR).unwrap_or_default();
    assert!(cursor.starts_with("sha256:") && !cursor.contains("page-2"), "the cursor is opaque server text: kept as a hash ({cursor})");
    assert_eq!(cursor, &*crate::normalize::redact::cursor("page-2"));
    assert_eq!(abool(p2, a::CATALOG_NEXT_CURSOR_PRESENT), Some(false));
    assert_eq!(aint(p2, a::CATALOG_TOOL_COUNT), Some(1));

    let all: Vec<_> =
        tools_page_1().as_array().unwrap().iter().chain(tools_page_2().as_array().unwrap()).map(|t| tool_digest(t).unwrap()).collect();
    assert_eq!(inst.kind, SpanKind::Internal as i32);
    assert_eq!(astr(inst, a::CATALOG_INSTALLED_DIGEST), Some(registry_digest(&all).as_str()));
    assert_eq!(inst.trace_id, p2.trace_id, "in the trace of the page that completed the traversal");
    assert_eq!(inst.parent_span_id, p2.span_id);
    assert_eq!(astr(inst, a::SERVER_ADDRESS), Some("fake-server"));
    assert_eq!(inst.end_time_unix_nano, 40);

    // No raw definition leaves.
    let dump = format!("{spans:?}");
    assert!(!dump.contains("Echo the input") && !dump.contains("inputSchema") && !dump.contains("x.png"));
}

#[test]
fn an_orphan_or_interrupted_traversal_installs_nothing() {
    let mut o = stdio_observer();
    // A continuation page whose first page the tap never saw.
    client(&mut o, json!({"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"cursor":"page-2"}}), 10);
    server(&mut o, json!({"jsonrpc":"2.0","id":1,"result":{"tools": tools_page_2()}}), 20);
    assert_eq!(o.take_spans().len(), 1, "the page, no install");
    // A list change in the middle of a traversal.
    client(&mut o, json!({"jsonrpc":"2.0","id":2,"method":"tools/list"}), 30);
    server(&mut o, json!({"jsonrpc":"2.0","id":2,"result":{"tools": tools_page_1(), "nextCursor": "page-2"}}), 40);
    server(&mut o, json!({"jsonrpc":"2.0","method":"notifications/tools/list_changed"}), 45);
    client(&mut o, json!({"jsonrpc":"2.0","id":3,"method":"tools/list","params":{"cursor":"page-2"}}), 50);
    server(&mut o, json!({"jsonrpc":"2.0","id":3,"result":{"tools": tools_page_2()}}), 60);
    let spans = o.take_spans();
    assert_eq!(spans.len(), 3);
    assert!(spans.iter().all(|s| astr(s, a::CATALOG_INSTALLED_DIGEST).is_none()));
    // A fresh traversal after it installs.
    client(&mut o, json!({"jsonrpc":"2.0","id":4,"method":"tools/list"}), 70);
    server(&mut o, json!({"jsonrpc":"2.0","id":4,"result":{"tools": tools_page_2(), "nextCursor": null}}), 80);
    let spans = o.take_spans();
    assert_eq!(abool(&spans[0], a::CATALOG_NEXT_CURSOR_PRESENT), Some(false), "a null nextCursor is no next page");
    let d = registry_digest(&[tool_digest(&tools_page_2()[0]).unwrap()]);
    assert_eq!(astr(&spans[1], a::CATALOG_INSTALLED_DIGEST), Some(d.as_str()));
}

#[test]
fn list_changed_is_its_own_span() {
    let mut o = stdio_observer();
    server(&mut o, json!({"jsonrpc":"2.0","method":"notifications/tools/list_changed"}), 99);
    let spans = o.take_spans();
    assert_eq!(spans.len(), 1);
    assert_eq!(spans[0].name, "notifications/tools/list_changed");
    assert_eq!(astr(&spans[0], a::MCP_METHOD_NAME), Some("notifications/tools/list_changed"));
    assert_eq!(spans[0].kind, SpanKind::Internal as i32);
    assert_eq!(spans[0].end_time_unix_nano, 99);
    assert_eq!(astr(&spans[0], a::SERVER_ADDRESS), Some("fake-server"));
    // Other notifications and server requests are not evidence here.
    server(&mut o, json!({"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"x"}}), 100);
    server(&mut o, json!({"jsonrpc":"2.0","id":7,"method":"sampling/createMessage","params":{}}), 101);
    assert!(o.take_spans().is_empty());
}

#[test]
fn a_successful_call_has_a_request_sent_marker_and_a_client_span() {
    let mut o = stdio_observer();
    client(&mut o, json!({"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hi"}}}), 100);
    let marker = o.take_spans();
    assert_eq!(marker.len(), 1, "the marker is emitted when the request passes");
    let m = &marker[0];
    assert_eq!(astr(m, a::CALL_PHASE), Some("request_sent"));
    assert_eq!((m.start_time_unix_nano, m.end_time_unix_nano), (100, 100));
    assert_eq!(m.name, "tools/call echo");
    server(&mut o, json!({"jsonrpc":"2.0","id":5,"result":{"content":[{"type":"text","text":"hi"}]}}), 300);
    let spans = o.take_spans();
    assert_eq!(spans.len(), 1);
    let s = &spans[0];
    assert_eq!(s.name, "tools/call echo");
    assert_eq!(s.kind, SpanKind::Client as i32);
    assert_eq!(astr(s, a::GEN_AI_TOOL_NAME), Some("echo"));
    assert_eq!(astr(s, a::GEN_AI_OPERATION_NAME), Some("execute_tool"));
    assert_eq!(astr(s, a::JSONRPC_REQUEST_ID), Some("5"));
    assert_eq!(astr(s, a::CALL_PHASE), None);
    assert!(astr(s, a::ERROR_TYPE).is_none());
    assert_eq!(s.status.as_ref().unwrap().code, StatusCode::Unset as i32);
    assert_eq!(m.trace_id, s.trace_id);
    assert_eq!(m.parent_span_id, s.span_id, "the marker is a child of the call's span");
    assert!(s.parent_span_id.is_empty(), "no traceparent: a root span in a fresh trace");
    assert_eq!(o.in_flight(), 0);
}

#[test]
fn is_error_and_jsonrpc_errors() {
    let mut o = stdio_observer();
    client(&mut o, json!({"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"fail","arguments":{}}}), 1);
    server(&mut o, json!({"jsonrpc":"2.0","id":"a","result":{"isError":true,"content":[{"type":"text","text":"boom"}]}}), 2);
    client(&mut o, json!({"jsonrpc":"2.0","id":"b","method":"tools/call","params":{"name":"nope","arguments":{}}}), 3);
    server(&mut o, json!({"jsonrpc":"2.0","id":"b","error":{"code":-32602,"message":"Unknown tool: nope"}}), 4);
    client(&mut o, json!({"jsonrpc":"2.0","id":"c","method":"resources/lsit"}), 5);
    server(&mut o, json!({"jsonrpc":"2.0","id":"c","error":{"code":-32601,"message":"Method not found"}}), 6);
    let spans: Vec<Span> = o.take_spans().into_iter().filter(|s| astr(s, a::CALL_PHASE).is_none()).collect();
    assert_eq!(spans.len(), 3);
    assert_eq!(astr(&spans[0], a::ERROR_TYPE), Some("tool_error"));
    assert_eq!(astr(&spans[0], a::RPC_RESPONSE_STATUS_CODE), None);
    assert_eq!(spans[0].status.as_ref().unwrap().code, StatusCode::Error as i32);
    assert_eq!(astr(&spans[1], a::ERROR_TYPE), Some("-32602"));
    assert_eq!(astr(&spans[1], a::RPC_RESPONSE_STATUS_CODE), Some("-32602"));
    assert_eq!(astr(&spans[1], a::GEN_AI_TOOL_NAME), Some("nope"));
    assert_eq!(spans[2].name, "other", "a method outside the specification's list is not kept");
    assert_eq!(astr(&spans[2], a::ERROR_TYPE), Some("-32601"));
    let dump = format!("{spans:?}");
    assert!(!dump.contains("Unknown tool") && !dump.contains("boom") && !dump.contains("Method not found"), "no messages or results");
    for s in &spans {
        assert!(s.status.as_ref().unwrap().message.is_empty());
    }
}

#[test]
fn progress_notifications_join_the_call_they_belong_to() {
    let mut o = stdio_observer();
    client(
        &mut o,
        json!({"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"slow","arguments":{},"_meta":{"progressToken":"tok-1"}}}),
        1_000,
    );
    server(
        &mut o,
        json!({"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"tok-1","progress":1,"total":3,"message":"step one of SECRET-PROGRESS"}}),
        2_000,
    );
    server(&mut o, json!({"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"tok-1","progress":2.5}}), 3_000);
    server(&mut o, json!({"jsonrpc":"2.0","id":9,"result":{"content":[]}}), 4_000);
    let spans = o.take_spans();
    assert_eq!(spans.len(), 4, "{spans:#?}");
    let (marker, p1, p2, call) = (&spans[0], &spans[1], &spans[2], &spans[3]);
    assert_eq!(astr(marker, a::PROGRESS_TOKEN), Some("tok-1"), "the request's token is on the marker");
    assert_eq!(astr(call, a::PROGRESS_TOKEN), Some("tok-1"), "and on the call span");
    for p in [p1, p2] {
        assert_eq!(p.name, "notifications/progress");
        assert_eq!(astr(p, a::MCP_METHOD_NAME), Some("notifications/progress"));
        assert_eq!(astr(p, a::PROGRESS_TOKEN), Some("tok-1"));
        assert_eq!(p.trace_id, call.trace_id, "in the call's trace");
        assert_eq!(p.parent_span_id, call.span_id, "under the call's span");
    }
    assert_eq!(adouble(p1, a::PROGRESS_VALUE), Some(1.0));
    assert_eq!(adouble(p1, a::PROGRESS_TOTAL), Some(3.0));
    assert_eq!(adouble(p2, a::PROGRESS_VALUE), Some(2.5));
    assert_eq!(adouble(p2, a::PROGRESS_TOTAL), None);
    assert_eq!(p1.end_time_unix_nano, 2_000);
    assert!(!format!("{spans:?}").contains("SECRET-PROGRESS"), "progress messages never leave");

    // An integer token; a notification for a token nobody supplied goes in its own trace.
    client(&mut o, json!({"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":"slow","_meta":{"progressToken":42}}}), 5_000);
    server(&mut o, json!({"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":42,"progress":1}}), 6_000);
    server(&mut o, json!({"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"42","progress":1}}), 6_500);
    let spans = o.take_spans();
    assert_eq!(aint(&spans[0], a::PROGRESS_TOKEN), Some(42));
    assert_eq!(aint(&spans[1], a::PROGRESS_TOKEN), Some(42));
    assert_eq!(spans[1].trace_id, spans[0].trace_id);
    assert_ne!(spans[2].trace_id, spans[0].trace_id, "the string \"42\" is another token");
    assert!(spans[2].parent_span_id.is_empty());
}

#[test]
fn traceparent_in_meta_joins_the_agents_trace() {
    let mut o = stdio_observer();
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    client(
        &mut o,
        json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","_meta":{"traceparent":tp,"progressToken":"p"}}}),
        1,
    );
    server(&mut o, json!({"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"p","progress":1}}), 2);
    server(&mut o, json!({"jsonrpc":"2.0","id":1,"result":{}}), 3);
    let spans = o.take_spans();
    let want_trace = hex::decode("4bf92f3577b34da6a3ce929d0e0e4736").unwrap();
    assert!(spans.iter().all(|s| s.trace_id == want_trace), "every span of the call joins the agent's trace");
    let call = spans.last().unwrap();
    assert_eq!(call.parent_span_id, hex::decode("00f067aa0ba902b7").unwrap(), "a child of the agent's span");
    // Invalid traceparents are ignored: fresh trace, root span.
    for bad in [
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        "garbage",
    ] {
        client(&mut o, json!({"jsonrpc":"2.0","id":2,"method":"ping","params":{"_meta":{"traceparent":bad}}}), 4);
        server(&mut o, json!({"jsonrpc":"2.0","id":2,"result":{}}), 5);
        let s = o.take_spans();
        assert_ne!(s[0].trace_id, want_trace, "{bad}");
        assert!(s[0].parent_span_id.is_empty(), "{bad}");
    }
    assert_eq!(
        parse_traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future"),
        Some((want_trace.try_into().unwrap(), [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]))
    );
}

fn http_ctx<'a>(ns: u64, session: Option<&'a str>, exchange: u64, status: Option<u16>, auth: bool) -> Ctx<'a> {
    Ctx {
        at_ns: ns,
        session_id: session,
        exchange: Some(exchange),
        http_status: status,
        had_authorization: auth,
        protocol_version: session.map(|_| "2025-11-25"),
        ..Default::default()
    }
}

#[test]
fn http_session_ids_status_and_versions() {
    let mut o = http_observer();
    let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25"}}).to_string();
    o.client_bytes(init.as_bytes(), &Ctx { at_ns: 1, exchange: Some(1), ..Default::default() });
    let resp =
        json!({"jsonrpc":"2.0","id":0,"result":{"protocolVersion":"2025-11-25","capabilities":{"tools":{"listChanged":true}}}}).to_string();
    o.server_bytes(
        resp.as_bytes(),
        &Ctx { at_ns: 2, exchange: Some(1), http_status: Some(200), assigned_session_id: Some("sess-A"), ..Default::default() },
    );
    o.exchange_end(1, 200, &at(3));
    let s = o.take_spans();
    assert_eq!(astr(&s[0], a::MCP_SESSION_ID), Some(&*redact::session_hash("sess-A")), "the session the server assigned");
    assert_eq!(aint(&s[0], a::HTTP_RESPONSE_STATUS_CODE), Some(200));
    assert_eq!(astr(&s[0], a::NETWORK_TRANSPORT), Some("tcp"));
    assert_eq!(astr(&s[0], a::SERVER_ADDRESS), Some("127.0.0.1"));
    assert_eq!(aint(&s[0], a::SERVER_PORT), Some(8931));

    // A call in the session; its response on the POST's SSE stream.
    client_http(
        &mut o,
        json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo"}}),
        http_ctx(4, Some("sess-A"), 2, None, true),
    );
    o.server_bytes(json!({"jsonrpc":"2.0","id":1,"result":{}}).to_string().as_bytes(), &http_ctx(5, Some("sess-A"), 2, Some(200), true));
    let s = o.take_spans();
    let call = s.last().unwrap();
    assert_eq!(astr(call, a::MCP_SESSION_ID), Some(&*redact::session_hash("sess-A")));
    assert_eq!(astr(call, a::MCP_PROTOCOL_VERSION), Some("2025-11-25"));

    // Same request id in another session does not match.
    client_http(&mut o, json!({"jsonrpc":"2.0","id":7,"method":"ping"}), http_ctx(6, Some("sess-B"), 3, None, true));
    o.server_bytes(json!({"jsonrpc":"2.0","id":7,"result":{}}).to_string().as_bytes(), &http_ctx(7, Some("sess-A"), 9, Some(200), true));
    assert!(o.take_spans().is_empty());
    assert_eq!(o.stats.unmatched_responses, 1);
    // A 2xx without the response keeps the request in flight (it may come on the GET stream).
    o.exchange_end(3, 200, &at(8));
    assert_eq!(o.in_flight(), 1);
    // A 404 (expired session) ends it with the status.
    client_http(&mut o, json!({"jsonrpc":"2.0","id":8,"method":"tools/list"}), http_ctx(9, Some("sess-gone"), 4, None, true));
    o.exchange_end(4, 404, &at(10));
    let s = o.take_spans();
    assert_eq!(aint(&s[0], a::HTTP_RESPONSE_STATUS_CODE), Some(404));
    assert_eq!(s[0].status.as_ref().unwrap().code, StatusCode::Error as i32);
}

fn client_http(o: &mut Observer, v: serde_json::Value, ctx: Ctx<'_>) {
    o.client_bytes(v.to_string().as_bytes(), &ctx);
}

#[test]
fn auth_challenges_401_and_403() {
    let mut o = http_observer();
    let hdr_403 = r#"Bearer realm="mcp", error="insufficient_scope", scope="tools:write", error_description="SECRET-DESCRIPTION", resource_metadata="http://127.0.0.1/.well-known/oauth-protected-resource""#;
    client_http(
        &mut o,
        json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"write_file"}}),
        http_ctx(1, Some("s"), 1, None, true),
    );
    o.http_auth_failure(1, 403, &crate::tap::parse_www_authenticate(hdr_403), &http_ctx(2, Some("s"), 1, Some(403), true));
    client_http(&mut o, json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo"}}), http_ctx(3, None, 2, None, true));
    o.http_auth_failure(
        2,
        401,
        &crate::tap::parse_www_authenticate(r#"Bearer error="invalid_token""#),
        &http_ctx(4, None, 2, Some(401), true),
    );
    client_http(&mut o, json!({"jsonrpc":"2.0","id":3,"method":"initialize","params":{}}), http_ctx(5, None, 3, None, false));
    o.http_auth_failure(
        3,
        401,
        &crate::tap::parse_www_authenticate(r#"Bearer resource_metadata="x""#),
        &http_ctx(6, None, 3, Some(401), false),
    );
    o.exchange_end(1, 403, &at(7)); // nothing left: already reported
    let spans: Vec<Span> = o.take_spans().into_iter().filter(|s| astr(s, a::CALL_PHASE).is_none()).collect();
    assert_eq!(spans.len(), 3);
    let s403 = &spans[0];
    assert_eq!(aint(s403, a::HTTP_RESPONSE_STATUS_CODE), Some(403));
    assert_eq!(aint(s403, a::AUTH_STATUS), Some(403));
    assert_eq!(astr(s403, a::AUTH_ERROR), Some("insufficient_scope"));
    assert_eq!(astr(s403, a::AUTH_REQUIRED_SCOPE), Some("tools:write"));
    assert_eq!(astr(s403, a::GEN_AI_TOOL_NAME), Some("write_file"));
    assert_eq!(astr(&spans[1], a::AUTH_ERROR), Some("invalid_token"));
    assert_eq!(astr(&spans[1], a::AUTH_REQUIRED_SCOPE), None);
    assert_eq!(astr(&spans[2], a::AUTH_ERROR), Some("missing_token"), "401 to a request without Authorization");
    let dump = format!("{spans:?}");
    assert!(!dump.contains("SECRET-DESCRIPTION") && !dump.contains("realm") && !dump.contains("well-known"));
}

#[test]
fn transport_failures_name_the_outcome() {
    let mut o = http_observer();
    client_http(
        &mut o,
        json!([{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a"}},{"jsonrpc":"2.0","id":2,"method":"tools/list"},{"jsonrpc":"2.0","method":"notifications/initialized"}]),
        http_ctx(1, None, 5, None, false),
    );
    o.transport_failure(5, "connection_refused", false, &at(2));
    let spans: Vec<Span> = o.take_spans().into_iter().filter(|s| astr(s, a::CALL_PHASE).is_none()).collect();
    assert_eq!(spans.len(), 2, "both requests of the batch, not the notification");
    for s in &spans {
        assert_eq!(astr(s, a::TRANSPORT_OUTCOME), Some("connection_refused"));
        assert_eq!(abool(s, a::REQUEST_SENT), Some(false));
        assert_eq!(s.status.as_ref().unwrap().code, StatusCode::Error as i32);
    }
    assert_eq!(o.in_flight(), 0);
}

#[test]
fn junk_is_counted_not_fatal() {
    let mut o = stdio_observer();
    o.client_bytes(b"{not json", &at(1));
    o.server_bytes(b"Content-Length: 12", &at(2));
    o.server_bytes(b"   ", &at(3));
    o.client_bytes(b"42", &at(4));
    assert_eq!(o.stats.parse_errors, 3);
    assert!(o.take_spans().is_empty());
    // A response nobody asked for.
    server(&mut o, json!({"jsonrpc":"2.0","id":99,"result":{}}), 5);
    assert_eq!(o.stats.unmatched_responses, 1);
    // Expiry forgets requests whose response never came.
    client(&mut o, json!({"jsonrpc":"2.0","id":1,"method":"ping"}), 10);
    assert_eq!(o.expire(11), 1);
    assert_eq!(o.in_flight(), 0);
}

#[test]
fn planted_secrets_never_reach_a_span() {
    const SECRETS: [&str; 9] = [
        "SECRET-ARGUMENT-7f3a",
        "SECRET-RESULT-91bc",
        "SECRET-ERROR-MSG-44",
        "SECRET-STRUCTURED-55",
        "SECRET-DEFINITION-66",
        "SECRET-CLIENTINFO-77",
        "sk_live_4eC39HqLyjWDarjtT1zdp7dc9aZ0",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl",
        "SECRET-PROGRESS-MSG-88",
    ];
    let mut o = http_observer();
    let ctx = |ns| http_ctx(ns, Some("sess-p"), 1, Some(200), true);
    client_http(
        &mut o,
        json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","clientInfo":{"name":"SECRET-CLIENTINFO-77"},"capabilities":{}}}),
        ctx(1),
    );
    o.server_bytes(json!({"jsonrpc":"2.0","id":0,"result":{"protocolVersion":"2025-11-25","capabilities":{"tools":{"listChanged":true}},"instructions":"SECRET-RESULT-91bc"}}).to_string().as_bytes(), &ctx(2));
    client_http(&mut o, json!({"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"cursor":null}}), ctx(3));
    o.server_bytes(json!({"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"t","description":"SECRET-DEFINITION-66","inputSchema":{"type":"object","properties":{"SECRET-DEFINITION-66":{"type":"string"}}}}],"nextCursor":"sk_live_4eC39HqLyjWDarjtT1zdp7dc9aZ0"}}).to_string().as_bytes(), &ctx(4));
    client_http(
        &mut o,
        json!({"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"cursor":"sk_live_4eC39HqLyjWDarjtT1zdp7dc9aZ0"}}),
        ctx(5),
    );
    o.server_bytes(json!({"jsonrpc":"2.0","id":2,"result":{"tools":[]}}).to_string().as_bytes(), &ctx(6));
    // Arguments with a token, a result, structured content, an error message.
    client_http(
        &mut o,
        json!({"jsonrpc":"2.0","id":"eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl","method":"tools/call","params":{"name":"t","arguments":{"q":"SECRET-ARGUMENT-7f3a","token":"sk_live_4eC39HqLyjWDarjtT1zdp7dc9aZ0"},"_meta":{"progressToken":"eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl"}}}),
        ctx(7),
    );
    o.server_bytes(json!({"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl","progress":1,"message":"SECRET-PROGRESS-MSG-88"}}).to_string().as_bytes(), &ctx(8));
    o.server_bytes(json!({"jsonrpc":"2.0","id":"eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl","result":{"content":[{"type":"text","text":"SECRET-RESULT-91bc"}],"structuredContent":{"x":"SECRET-STRUCTURED-55"}}}).to_string().as_bytes(), &ctx(9));
    client_http(
        &mut o,
        json!({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"t","arguments":{"q":"SECRET-ARGUMENT-7f3a"}}}),
        ctx(10),
    );
    o.server_bytes(
        json!({"jsonrpc":"2.0","id":3,"error":{"code":-32000,"message":"SECRET-ERROR-MSG-44","data":{"SECRET-ERROR-MSG-44":1}}})
            .to_string()
            .as_bytes(),
        &ctx(11),
    );
    let spans = o.take_spans();
    assert!(spans.len() >= 8, "{}", spans.len());
    let dump = format!("{spans:?}");
    for secret in SECRETS {
        assert!(!dump.contains(secret), "{secret} leaked into a span");
    }
    // The joins still work on the hashed forms.
    let call = spans
        .iter()
        .find(|s| astr(s, a::JSONRPC_REQUEST_ID).is_some_and(|r| r.starts_with("sha256:")) && astr(s, a::CALL_PHASE).is_none())
        .expect("the call span");
    let progress = spans.iter().find(|s| s.name == "notifications/progress").unwrap();
    assert_eq!(progress.trace_id, call.trace_id);
    assert_eq!(astr(progress, a::PROGRESS_TOKEN), astr(call, a::PROGRESS_TOKEN));
    assert!(spans.iter().any(|s| astr(s, a::CATALOG_INSTALLED_DIGEST).is_some()), "the secret-looking cursor still chains the pages");
}

#[test]
fn sessions_past_the_limit_forget_the_oldest_and_are_counted() {
    let identity = ServerIdentity { address: "127.0.0.1".into(), port: Some(8931), transport: Transport::Tcp };
    let mut o = Observer::with_limits(identity, ObserverLimits { sessions: 1, digests: 4 });
    let before = crate::bounded::evicted("tap_sessions");
    for (n, sess) in [(0u64, "sess-A"), (10, "sess-B")] {
        let init = json!({"jsonrpc":"2.0","id":n,"method":"initialize","params":{"protocolVersion":"2025-11-25"}}).to_string();
        o.client_bytes(init.as_bytes(), &Ctx { at_ns: n + 1, exchange: Some(n), ..Default::default() });
        let resp = json!({"jsonrpc":"2.0","id":n,"result":{"protocolVersion":"2025-11-25","capabilities":{}}}).to_string();
        o.server_bytes(
            resp.as_bytes(),
            &Ctx { at_ns: n + 2, exchange: Some(n), http_status: Some(200), assigned_session_id: Some(sess), ..Default::default() },
        );
        o.exchange_end(n, 200, &at(n + 3));
    }
    o.take_spans();
    // Other tests' observers share the counter but never reach their (default) limit.
    assert!(crate::bounded::evicted("tap_sessions") > before, "sess-A was evicted and counted");
    assert_eq!(o.sessions.len(), 1);
    assert!(o.sessions.contains("sess-B") && !o.sessions.contains("sess-A"), "the newest session is kept");
}

/// Issue 8 defect 9: JSON-RPC code 0 (an uncaught server exception) is one failure with one
/// reason whoever reports it: the tap's span (which reports the code the wire carried) reads as
/// -32603 through every dialect that may claim it, as the SDK and logfire readers read it.
#[test]
fn jsonrpc_code_zero_reads_as_internal_error_through_the_tap_and_every_dialect() {
    use crate::evidence::CallError;
    let mut o = stdio_observer();
    client(&mut o, json!({"jsonrpc":"2.0","id":"z","method":"tools/call","params":{"name":"explodes","arguments":{}}}), 1);
    server(&mut o, json!({"jsonrpc":"2.0","id":"z","error":{"code":0,"message":"boom"}}), 2);
    let spans: Vec<Span> = o.take_spans().into_iter().filter(|s| astr(s, a::CALL_PHASE).is_none()).collect();
    assert_eq!(spans.len(), 1);
    assert_eq!(astr(&spans[0], a::RPC_RESPONSE_STATUS_CODE), Some("0"), "the tap reports what the wire said");
    let (t, s) = crate::normalize::span_ids(&spans[0]).unwrap();
    let want = Some(CallError::JsonRpc(-32603));
    for d in crate::normalize::DIALECTS.iter().filter(|d| ["semconv", "mcp_sdk", "fastmcp"].contains(&d.name)) {
        let ev = (d.read)(t, s, &crate::normalize::SpanView::from_proto(&spans[0]), None, &Default::default(), &mut 0).expect("evidence");
        assert_eq!(ev.error, want, "dialect {}", d.name);
    }
    // logfire reads the code from the response body; the same normalization applies.
    let mut lf = spans[0].clone();
    lf.name = "MCP server handle request: tools/call explodes".into();
    lf.attributes = vec![KeyValue {
        key: "response".into(),
        value: Some(AnyValue { value: Some(any_value::Value::StringValue(r#"{"code":0,"message":"boom"}"#.into())) }),
        ..Default::default()
    }];
    let ev =
        (crate::normalize::logfire::DIALECT.read)(t, s, &crate::normalize::SpanView::from_proto(&lf), None, &Default::default(), &mut 0)
            .expect("evidence");
    assert_eq!(ev.error, want, "logfire");
    assert_eq!(CallError::jsonrpc(0), CallError::JsonRpc(-32603));
    assert_eq!(CallError::jsonrpc(-32602), CallError::JsonRpc(-32602));
}

/// 2026-07-28: the version from `_meta`, a listen stream opened, acknowledged and cancelled, a
/// list change on it tagged `subscription`, and `server/discover` read as `initialize` is.
#[test]
fn revision_2026_listen_stream_and_discover() {
    let mut o = stdio_observer();
    let meta = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28"});
    client(&mut o, json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": meta}}), 10);
    server(
        &mut o,
        json!({"jsonrpc": "2.0", "id": 1, "result": {"capabilities": {"tools": {"listChanged": true}}, "supportedVersions": ["2026-07-28"], "resultType": "complete", "ttlMs": 0}}),
        11,
    );
    let d = o.take_spans();
    assert_eq!(d.len(), 1);
    assert_eq!(astr(&d[0], a::MCP_PROTOCOL_VERSION), Some("2026-07-28"));
    assert_eq!(abool(&d[0], a::SESSION_LIST_CHANGED_CAPABILITY), Some(true));
    assert_eq!(abool(&d[0], a::SESSION_VERSION_ACCEPTED), Some(true));
    client(
        &mut o,
        json!({"jsonrpc": "2.0", "id": "listen-1", "method": "subscriptions/listen", "params": {"notifications": {"toolsListChanged": true}, "_meta": meta}}),
        20,
    );
    server(
        &mut o,
        json!({"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged", "params": {"_meta": {"io.modelcontextprotocol/subscriptionId": "listen-1"}, "notifications": {"toolsListChanged": true}}}),
        21,
    );
    server(
        &mut o,
        json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed", "params": {"_meta": {"io.modelcontextprotocol/subscriptionId": "listen-1"}}}),
        30,
    );
    client(&mut o, json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "listen-1"}}), 40);
    let spans = o.take_spans();
    let states: Vec<&str> = spans.iter().filter_map(|s| astr(s, a::SUBSCRIPTION_STATE)).collect();
    assert_eq!(states, ["opened", "acknowledged", "closed"]);
    assert!(spans
        .iter()
        .filter(|s| astr(s, a::SUBSCRIPTION_STATE).is_some())
        .all(|s| abool(s, a::SUBSCRIPTION_TOOLS_LIST_CHANGED) == Some(true)));
    let change = spans.iter().find(|s| astr(s, a::MCP_METHOD_NAME) == Some("notifications/tools/list_changed")).unwrap();
    assert_eq!(astr(change, a::CATALOG_SIGNAL_SOURCE), Some("subscription"));
    assert!(spans.iter().all(|s| !format!("{s:?}").contains("listen-1")), "the subscription id is hashed");
    assert_eq!(o.in_flight(), 0, "a listen stream is no request in flight");
}

/// A multi-round call: the interim round runs no verifier and hands a hashed requestState; the
/// retry (a new id) echoes it and lands in the first round's trace.
#[test]
fn input_required_rounds_share_a_trace_and_hash_the_state() {
    let mut o = stdio_observer();
    let state = "v1.SECRET-REQUEST-STATE-0123456789";
    client(&mut o, json!({"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": {"name": "confirm", "arguments": {"x": "y"}}}), 10);
    server(
        &mut o,
        json!({"jsonrpc": "2.0", "id": 6, "result": {"resultType": "input_required", "inputRequests": {}, "requestState": state}}),
        11,
    );
    client(
        &mut o,
        json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "confirm", "arguments": {"x": "y"}, "requestState": state, "inputResponses": {}}}),
        20,
    );
    server(&mut o, json!({"jsonrpc": "2.0", "id": 7, "result": {"resultType": "complete", "content": []}}), 21);
    let spans: Vec<Span> = o.take_spans().into_iter().filter(|s| astr(s, a::CALL_PHASE).is_none()).collect();
    assert_eq!(spans.len(), 2);
    assert_eq!(spans[0].trace_id, spans[1].trace_id, "the retry joins the first round's trace");
    assert_eq!(astr(&spans[0], a::CALL_RESULT_TYPE), Some("input_required"));
    let issued = astr(&spans[0], a::CALL_REQUEST_STATE_ISSUED).unwrap();
    assert_eq!(astr(&spans[1], a::CALL_REQUEST_STATE_ECHOED), Some(issued));
    assert!(!format!("{spans:?}").contains("SECRET-REQUEST-STATE"));
}

/// A task: the call answered with a task handle, polls join its trace, a completed poll carries
/// the status; an error to a poll is `gone`.
#[test]
fn task_polls_join_the_call() {
    let mut o = stdio_observer();
    client(&mut o, json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "build", "arguments": {}}}), 10);
    server(
        &mut o,
        json!({"jsonrpc": "2.0", "id": 1, "result": {"resultType": "task", "task": {"taskId": "task-SECRET-1", "status": "working", "ttlMs": 60000, "pollIntervalMs": 300}}}),
        11,
    );
    client(&mut o, json!({"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {"taskId": "task-SECRET-1"}}), 20);
    server(
        &mut o,
        json!({"jsonrpc": "2.0", "id": 2, "result": {"taskId": "task-SECRET-1", "status": "completed", "result": {"content": []}}}),
        21,
    );
    client(&mut o, json!({"jsonrpc": "2.0", "id": 3, "method": "tasks/get", "params": {"taskId": "task-SECRET-1"}}), 30);
    server(&mut o, json!({"jsonrpc": "2.0", "id": 3, "error": {"code": -32602, "message": "task not found"}}), 31);
    let spans: Vec<Span> = o.take_spans().into_iter().filter(|s| astr(s, a::CALL_PHASE).is_none()).collect();
    assert_eq!(spans.len(), 3);
    assert!(spans.iter().all(|s| s.trace_id == spans[0].trace_id));
    assert_eq!(spans[1].parent_span_id, spans[0].span_id, "a poll is a child of the call");
    assert_eq!((astr(&spans[0], a::TASK_STATUS), aint(&spans[0], a::TASK_POLL_INTERVAL_MS)), (Some("working"), Some(300)));
    assert_eq!(astr(&spans[1], a::TASK_STATUS), Some("completed"));
    assert_eq!(astr(&spans[2], a::TASK_STATUS), Some("gone"));
    let id = astr(&spans[0], a::TASK_ID).unwrap();
    assert!(spans.iter().all(|s| astr(s, a::TASK_ID) == Some(id)));
    assert!(!format!("{spans:?}").contains("SECRET"));
}

/// -32022 and -32021 fill the negotiation from `error.data`; a refused `server/discover` puts
/// the `initialize` that retries it (auto mode) in its trace; the empty cursor is a cursor.
#[test]
fn refusals_fill_the_negotiation_and_a_retried_setup_joins_its_trace() {
    let mut o = stdio_observer();
    client(&mut o, json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "echo"}}), 10);
    server(
        &mut o,
        json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32022, "message": "x", "data": {"supported": ["2026-07-28"], "requested": "2099-01-01"}}}),
        11,
    );
    client(&mut o, json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "confirm"}}), 12);
    server(
        &mut o,
        json!({"jsonrpc": "2.0", "id": 2, "error": {"code": -32021, "message": "x", "data": {"requiredCapabilities": {"elicitation": {"form": {}}}}}}),
        13,
    );
    let spans: Vec<Span> = o.take_spans().into_iter().filter(|s| astr(s, a::CALL_PHASE).is_none()).collect();
    assert_eq!(astr(&spans[0], a::SESSION_REQUESTED_VERSION), Some("2099-01-01"));
    assert_eq!(abool(&spans[0], a::SESSION_VERSION_ACCEPTED), Some(false));
    assert_eq!(astrs(&spans[1], a::SESSION_MISSING_CAPABILITIES), ["elicitation.form"]);

    client(&mut o, json!({"jsonrpc": "2.0", "id": 3, "method": "server/discover", "params": {}}), 20);
    server(&mut o, json!({"jsonrpc": "2.0", "id": 3, "error": {"code": -32603, "message": "x"}}), 21);
    client(&mut o, json!({"jsonrpc": "2.0", "id": 4, "method": "initialize", "params": {"protocolVersion": "2025-11-25"}}), 22);
    server(&mut o, json!({"jsonrpc": "2.0", "id": 4, "error": {"code": -32603, "message": "x"}}), 23);
    let spans = o.take_spans();
    assert_eq!(spans.len(), 2);
    assert_eq!(spans[0].trace_id, spans[1].trace_id, "one setup, retried in the older revision");

    client(&mut o, json!({"jsonrpc": "2.0", "id": 5, "method": "tools/list", "params": {}}), 30);
    server(&mut o, json!({"jsonrpc": "2.0", "id": 5, "result": {"tools": [], "nextCursor": ""}}), 31);
    client(&mut o, json!({"jsonrpc": "2.0", "id": 6, "method": "tools/list", "params": {"cursor": ""}}), 32);
    server(&mut o, json!({"jsonrpc": "2.0", "id": 6, "result": {"tools": []}}), 33);
    let spans = o.take_spans();
    assert_eq!(abool(&spans[0], a::CATALOG_NEXT_CURSOR_PRESENT), Some(true), "an empty nextCursor is a cursor");
    assert!(astr(&spans[1], a::CATALOG_CURSOR).is_some(), "the empty cursor is sent as a cursor");
    assert!(spans.iter().any(|s| astr(s, a::CATALOG_INSTALLED_DIGEST).is_some()), "the two pages complete a traversal");
}

/// Issue 34: a 2026-07-28 request without trace context gets the tap's in `_meta`, naming the
/// span the tap reports the request under (the root of its trace), so a server that honours
/// `_meta` continues that trace; anything else passes untouched.
#[test]
fn the_tap_puts_its_trace_context_into_a_2026_07_28_request_that_has_none() {
    let stateless = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientInfo": {"name": "agent-a", "version": "1"}});
    let req =
        json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"q":"SECRET-ARG"},"_meta": stateless}});
    let (body, (trace, span)) = inject_trace_context(req.to_string().as_bytes(), None).expect("injected");
    let sent: Value = serde_json::from_slice(&body).unwrap();
    let tp = sent["params"]["_meta"]["traceparent"].as_str().unwrap().to_string();
    assert_eq!(parse_traceparent(&tp), Some((trace, span)));
    // The rest of the request is what the client sent.
    let mut back = sent.clone();
    back["params"]["_meta"].as_object_mut().unwrap().remove("traceparent");
    assert_eq!(back, req);
    // The observer reports the request under exactly that span, a root; the client's user agent
    // and the connection's local end are on the span, its `clientInfo` is not.
    let mut o = http_observer();
    let local: std::net::SocketAddr = "127.0.0.1:50123".parse().unwrap();
    let ctx =
        Ctx { at_ns: 1, injected: Some((trace, span)), user_agent: Some("python-httpx2/2.16"), exchange: Some(1), ..Default::default() };
    o.client_bytes(&body, &ctx);
    let ctx = Ctx {
        at_ns: 5,
        injected: Some((trace, span)),
        local_addr: Some(local),
        exchange: Some(1),
        http_status: Some(200),
        ..Default::default()
    };
    o.server_bytes(json!({"jsonrpc":"2.0","id":2,"result":{"content":[]}}).to_string().as_bytes(), &ctx);
    let spans = o.take_spans();
    assert!(spans.iter().all(|s| s.trace_id == trace), "every span of the call in the injected trace");
    let call = spans.iter().find(|s| s.span_id == span).expect("the call's span is the injected one");
    assert!(call.parent_span_id.is_empty(), "the root of the trace the server continues");
    assert!(spans.iter().filter(|s| s.span_id != span).all(|s| s.parent_span_id == span), "the request-sent marker under it");
    assert!(!spans.iter().any(|s| format!("{s:?}").contains("agent-a")), "clientInfo is never written");
    assert_eq!(astr(call, "user_agent.original"), Some("python-httpx2/2.16"));
    assert_eq!((astr(call, "network.local.address"), aint(call, "network.local.port")), (Some("127.0.0.1"), Some(50123)));
    // Untouched: a request that has trace context, an older revision, a notification, a batch.
    let with_tp = json!({"jsonrpc":"2.0","id":3,"method":"ping","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}});
    let older = json!({"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"echo"}});
    let note = json!({"jsonrpc":"2.0","method":"notifications/initialized","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}});
    for (body, header) in [
        (with_tp, None),
        (older.clone(), Some("2025-11-25")),
        (older, None),
        (note, Some("2026-07-28")),
        (json!([req]), Some("2026-07-28")),
    ] {
        assert!(inject_trace_context(body.to_string().as_bytes(), header).is_none(), "{body}");
    }
    // The HTTP header alone says the revision.
    let bare = json!({"jsonrpc":"2.0","id":5,"method":"tools/list"});
    assert!(inject_trace_context(bare.to_string().as_bytes(), Some("2026-07-28")).is_some());
    assert!(inject_trace_context(b"not json", Some("2026-07-28")).is_none());
}

/// An observer that verifies `tools/call shape` with a rule reading `/result/structuredContent/id`
/// and `/arguments/id`.
fn verifying_observer() -> Observer {
    let rules = crate::tap::verify::RuleSet::parse(
        "- {name: shape_done, tool: shape, command: {argv: [test, \"{/result/structuredContent/id}\", =, \"{/arguments/id}\"]}}",
        std::path::Path::new("v.yaml"),
        &|_| None,
    )
    .unwrap();
    stdio_observer().with_verifiers(Some(Arc::new(rules)))
}

fn nested(depth: usize, inner: &str) -> String {
    format!("{}{inner}{}", "[".repeat(depth), "]".repeat(depth))
}

/// The call spans (not the request-sent markers) among `spans`.
fn answers(spans: &[Span]) -> Vec<&Span> {
    spans.iter().filter(|s| astr(s, a::CALL_PHASE).is_none()).collect()
}

/// Issue 35, table-driven: responses of every shape through the observer. Whatever it could not
/// read is counted and never becomes a success; what it could read still reaches the verifier.
#[test]
fn responses_of_any_shape_are_read_by_budget_and_never_taken_for_success_unread() {
    let zeros = format!("[{}0]", "0,".repeat(2_000_000));
    let bomb = nested(1_000_000, "0");
    struct Case {
        what: &'static str,
        result: String,
        /// The call's span: `None` when there must be none, else whether it is an error.
        span: Option<bool>,
        /// The job's `/result/structuredContent/id`, when a job must be queued.
        job: Option<&'static str>,
        depth: u64,
        parse_errors: u64,
    }
    let cases = [
        Case {
            what: "zeros",
            result: format!("{{\"structuredContent\":{{\"id\":\"1\",\"pad\":{zeros}}}}}"),
            span: Some(false),
            job: Some("1"),
            depth: 0,
            parse_errors: 0,
        },
        Case {
            what: "depth bomb",
            result: format!("{{\"structuredContent\":{{\"id\":\"1\",\"pad\":{bomb}}}}}"),
            span: None,
            job: Some("1"),
            depth: 1,
            parse_errors: 0,
        },
        Case {
            what: "bomb before isError",
            result: format!("{{\"structuredContent\":{{\"id\":\"1\",\"pad\":{bomb}}},\"isError\":true}}"),
            span: None,
            job: None,
            depth: 1,
            parse_errors: 0,
        },
        Case {
            what: "isError",
            result: "{\"structuredContent\":{\"id\":\"1\"},\"isError\":true}".into(),
            span: Some(true),
            job: None,
            depth: 0,
            parse_errors: 0,
        },
        Case {
            what: "bomb as the id",
            result: format!("{{\"structuredContent\":{{\"id\":{bomb}}}}}"),
            span: None,
            job: Some(""),
            depth: 1,
            parse_errors: 0,
        },
        Case {
            what: "truncated",
            result: format!("{{\"structuredContent\":{{\"id\":\"1\",\"pad\":{}", &zeros[..1000]),
            span: None,
            job: None,
            depth: 0,
            parse_errors: 1,
        },
        Case {
            what: "bomb one bracket short",
            result: format!("{{\"structuredContent\":{{\"id\":\"1\",\"pad\":{}}}}}", &bomb[..bomb.len() - 1]),
            span: None,
            job: None,
            depth: 0,
            parse_errors: 1,
        },
        Case {
            what: "not JSON",
            result: "{\"structuredContent\": {\"id\": \"1\"}, isError: true}".into(),
            span: None,
            job: None,
            depth: 0,
            parse_errors: 1,
        },
    ];
    for c in cases {
        let mut o = verifying_observer();
        client(&mut o, json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"shape","arguments":{"id":"1"}}}), 1);
        let body = format!("{{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}}", c.result);
        o.server_bytes(body.as_bytes(), &at(2));
        let spans = o.take_spans();
        let calls = answers(&spans);
        match c.span {
            None => assert!(calls.is_empty(), "{}: no span for an answer not read whole", c.what),
            Some(err) => {
                assert_eq!(calls.len(), 1, "{}", c.what);
                let is_err = calls[0].status.as_ref().unwrap().code == StatusCode::Error as i32;
                assert_eq!(is_err, err, "{}", c.what);
            }
        }
        assert_eq!(spans.len() - calls.len(), 1, "{}: the request-sent marker stays", c.what);
        let jobs = o.take_jobs();
        match c.job {
            None => assert!(jobs.is_empty(), "{}: {jobs:?}", c.what),
            Some(id) => {
                assert_eq!(jobs.len(), 1, "{}", c.what);
                let got = jobs[0].call.pointer("/result/structuredContent/id").and_then(Value::as_str).unwrap_or("");
                assert_eq!(got, id, "{}", c.what);
                assert_eq!(jobs[0].call.pointer("/arguments/id"), Some(&json!("1")), "{}", c.what);
            }
        }
        assert_eq!((o.stats.oversize_by.depth, o.stats.parse_errors), (c.depth, c.parse_errors), "{}", c.what);
        if c.parse_errors == 0 {
            assert_eq!(o.in_flight(), 0, "{}: the answer matched its request", c.what);
        }
    }
}

/// Issue 35: the same shapes as a request's arguments: the request is what it says, the rule
/// keeps what fits, and what does not is counted.
#[test]
fn requests_of_any_shape_keep_only_what_fits() {
    let zeros = format!("[{}0]", "0,".repeat(2_000_000));
    let bomb = nested(1_000_000, "0");
    for (what, pad, depth) in [("zeros", zeros, 0), ("depth bomb", bomb, 1)] {
        let mut o = verifying_observer();
        let req = format!("{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{{\"name\":\"shape\",\"arguments\":{{\"id\":\"1\",\"pad\":{pad}}}}}}}");
        o.client_bytes(req.as_bytes(), &at(1));
        server(&mut o, json!({"jsonrpc":"2.0","id":1,"result":{"structuredContent":{"id":"1"}}}), 2);
        let spans = o.take_spans();
        assert_eq!(answers(&spans).len(), 1, "{what}: the call is answered");
        let jobs = o.take_jobs();
        assert_eq!(jobs.len(), 1, "{what}");
        assert_eq!(jobs[0].call, json!({"arguments": {"id": "1"}, "result": {"structuredContent": {"id": "1"}}}), "{what}");
        assert_eq!(o.stats.oversize_by.depth, depth, "{what}");
    }
    // A rule that reads the pad itself keeps nothing of it: counted, and its check will say
    // pointer_unresolved.
    let rules = crate::tap::verify::RuleSet::parse(
        "- {name: pad_done, tool: shape, command: {argv: [test, -n, \"{/arguments/pad}\"]}}",
        std::path::Path::new("v.yaml"),
        &|_| None,
    )
    .unwrap();
    let mut o = stdio_observer().with_verifiers(Some(Arc::new(rules)));
    let req = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{{\"name\":\"shape\",\"arguments\":{{\"pad\":[{}0]}}}}}}",
        "0,".repeat(100_000)
    );
    o.client_bytes(req.as_bytes(), &at(1));
    server(&mut o, json!({"jsonrpc":"2.0","id":1,"result":{"content":[]}}), 2);
    assert_eq!(o.take_jobs()[0].call, json!({}));
    assert_eq!(o.stats.oversize_by.value, 1);
    assert_eq!(o.stats.oversize, 1);
}

/// Issue 35: a `tools/list` page whose definition is past the catalog budget, or that lists more
/// tools than it, reports no catalog and installs nothing; a good page after it starts afresh.
#[test]
fn a_catalog_past_its_budget_is_not_reported_as_one() {
    let mut o = stdio_observer();
    let huge = json!({"name": "huge", "inputSchema": {"type": "object", "default": vec![0; MAX_TOOL_DEFINITION]}});
    let many: Vec<Value> = (0..=MAX_CATALOG_TOOLS).map(|i| json!({"name": format!("t{i}")})).collect();
    for (id, tools) in [(1, json!([huge])), (2, Value::Array(many))] {
        client(&mut o, json!({"jsonrpc":"2.0","id":id,"method":"tools/list"}), id * 10);
        server(&mut o, json!({"jsonrpc":"2.0","id":id,"result":{"tools": tools}}), id * 10 + 1);
        let spans = o.take_spans();
        assert_eq!(spans.len(), 1, "the list's span, no installed registry");
        assert_eq!(abool(&spans[0], a::CATALOG_NEXT_CURSOR_PRESENT), None, "not a page the service counts");
        assert!(attr(&spans[0], a::CATALOG_TOOL_DIGESTS).is_none());
        assert!(aint(&spans[0], a::CATALOG_TOOL_COUNT).is_some_and(|n| n >= 1));
    }
    assert_eq!(o.stats.oversize_by.catalog, 2);
    client(&mut o, json!({"jsonrpc":"2.0","id":3,"method":"tools/list"}), 30);
    server(&mut o, json!({"jsonrpc":"2.0","id":3,"result":{"tools": tools_page_2()}}), 31);
    let spans = o.take_spans();
    assert!(spans.iter().any(|s| astr(s, a::CATALOG_INSTALLED_DIGEST).is_some()));
    let page = spans.iter().find(|s| abool(s, a::CATALOG_NEXT_CURSOR_PRESENT).is_some()).unwrap();
    let digest = tool_digest(&tools_page_2()[0]).unwrap();
    assert_eq!(astrs(page, a::CATALOG_TOOL_DIGESTS), [format!("fail={}", digest.digest)], "digested from the bytes, as from the tree");
}

/// The trace context goes into the body as sent: every other byte is the client's, key order
/// and blanks included; a body not read whole is left alone.
#[test]
fn the_trace_context_is_written_into_the_body_as_sent() {
    let v = "\"io.modelcontextprotocol/protocolVersion\": \"2026-07-28\"";
    // (body, MCP-Protocol-Version, what goes upstream with TP for the traceparent member)
    for (body, header, want) in [
        (
            format!("{{\"method\": \"tools/call\", \"id\": 2, \"params\": {{\"z\": 1, \"_meta\": {{ {v} }}, \"a\": [1,  2]}}}}"),
            None,
            format!("{{\"method\": \"tools/call\", \"id\": 2, \"params\": {{\"z\": 1, \"_meta\": {{TP, {v} }}, \"a\": [1,  2]}}}}"),
        ),
        (
            "{ \"id\":\"x\",\"method\":\"ping\",\"params\":{ } }".to_string(),
            Some("2026-07-28"),
            "{ \"id\":\"x\",\"method\":\"ping\",\"params\":{\"_meta\":{TP} } }".to_string(),
        ),
        (
            "{\"id\":3,\"method\":\"ping\",\"params\":{\"_meta\":{}}}".to_string(),
            Some("2026-07-28"),
            "{\"id\":3,\"method\":\"ping\",\"params\":{\"_meta\":{TP}}}".to_string(),
        ),
        (
            "{\"id\":4,\"method\":\"ping\"}".to_string(),
            Some("2026-07-28"),
            "{\"params\":{\"_meta\":{TP}},\"id\":4,\"method\":\"ping\"}".to_string(),
        ),
    ] {
        let (sent, (trace, span)) = inject_trace_context(body.as_bytes(), header).unwrap_or_else(|| panic!("{body}"));
        let tp = format!("\"traceparent\":\"00-{}-{}-01\"", hex::encode(trace), hex::encode(span));
        assert_eq!(String::from_utf8(sent).unwrap(), want.replace("TP", &tp));
    }
    let deep =
        format!("{{\"id\":5,\"method\":\"tools/call\",\"params\":{{\"arguments\":{}}}}}", nested(crate::tap::reader::MAX_DEPTH + 1, ""));
    assert!(inject_trace_context(deep.as_bytes(), Some("2026-07-28")).is_none(), "not read whole: not touched");
}
