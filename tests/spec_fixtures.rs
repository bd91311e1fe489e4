//! SPEC's reference fixtures, replayed through the library and through the built binary.
//!
//! What each trace must be classified as is read from the `*.expected.json` files at test time;
//! those files come from SPEC's text (see tests/fixtures/make_fixtures.py), not from running
//! mcp-health.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output};

use mcp_health::testing::cli::replay::{replay_files, Summary};
use mcp_health::verdict::{HealthState, Layer, LayerStatus, Verdict};
use serde_json::Value;

fn fixture(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name).to_string_lossy().into_owned()
}

fn expected(name: &str) -> Value {
    let text = std::fs::read_to_string(fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn replay(files: &[String]) -> Vec<Verdict> {
    let mut errors = Vec::new();
    let verdicts = replay_files(files, &mut errors);
    assert!(errors.is_empty(), "replay errors: {errors:?}");
    verdicts
}

/// Verdicts per hex trace id.
fn by_trace(verdicts: &[Verdict]) -> BTreeMap<String, Vec<&Verdict>> {
    let mut m: BTreeMap<String, Vec<&Verdict>> = BTreeMap::new();
    for v in verdicts {
        m.entry(hex::encode(v.trace_id)).or_default().push(v);
    }
    m
}

fn layer_named(s: &str) -> Layer {
    *Layer::ALL.iter().find(|l| l.as_str() == s).unwrap_or_else(|| panic!("unknown layer {s:?}"))
}

fn state_named(s: &str) -> HealthState {
    *HealthState::ALL.iter().find(|x| x.as_str() == s).unwrap_or_else(|| panic!("unknown state {s:?}"))
}

// --- eight calls (SPEC section 2) ---------------------------------------------------------------

#[test]
fn eight_calls_each_trace_fails_at_its_expected_layer_and_nothing_after_it_is_observed() {
    let exp = expected("eight_calls.expected.json");
    let calls = exp["calls"].as_object().expect("calls");
    let verdicts = replay(&[fixture("eight_calls.jsonl")]);
    let traces = by_trace(&verdicts);
    assert_eq!(traces.len(), calls.len(), "one verdict per fixture trace, no others: {:?}", traces.keys());
    for (trace, want) in calls {
        let vs = traces.get(trace).unwrap_or_else(|| panic!("no verdict for trace {trace}"));
        assert_eq!(vs.len(), 1, "trace {trace}: exactly one call");
        let v = vs[0];
        let want_layer = want["first_failed_layer"].as_str().map(layer_named);
        assert_eq!(v.first_failed_layer, want_layer, "trace {trace}: first failed layer (state {}, reason {:?})", v.state, v.reason);
        match want_layer {
            Some(first) => {
                assert_eq!(v.layers.get(first), LayerStatus::Failed, "trace {trace}");
                for l in Layer::ALL {
                    if l < first {
                        assert_ne!(v.layers.get(l), LayerStatus::Failed, "trace {trace}: {l:?} before the first failure");
                    } else if l > first {
                        assert_eq!(
                            v.layers.get(l),
                            LayerStatus::Unobserved,
                            "trace {trace}: {l:?} after the first failure must be unobserved"
                        );
                    }
                }
            }
            None => assert!(Layer::ALL.iter().all(|l| v.layers.get(*l) != LayerStatus::Failed), "trace {trace}"),
        }
    }
}

#[test]
fn eight_calls_protocol_success_rate_is_exactly_three_eighths_and_verified_one_eighth() {
    let exp = expected("eight_calls.expected.json");
    let verdicts = replay(&[fixture("eight_calls.jsonl")]);
    let s = Summary::of(&verdicts);
    let want_protocol = exp["protocol_success_rate"].as_f64().expect("protocol_success_rate");
    let want_verified = exp["verified_success_rate"].as_f64().expect("verified_success_rate");
    assert_eq!(want_protocol, 0.375, "the fixture file still says what SPEC says");
    assert_eq!(want_verified, 0.125, "the fixture file still says what SPEC says");
    assert_eq!(s.calls, 8);
    assert_eq!(s.protocol_success_rate, Some(want_protocol), "{s:?}");
    assert_eq!(s.verified_success_rate, Some(want_verified), "{s:?}");
    assert_eq!((s.protocol_successes, s.verified_successes), (3, 1));
}

#[test]
fn eight_calls_verified_delivery_is_the_only_healthy_call() {
    let exp = expected("eight_calls.expected.json");
    let verdicts = replay(&[fixture("eight_calls.jsonl")]);
    for v in &verdicts {
        let trace = hex::encode(v.trace_id);
        let clean = exp["calls"][&trace]["first_failed_layer"].is_null();
        assert_eq!(v.state == HealthState::Healthy, clean, "trace {trace}: {}", v.state);
        assert_eq!(v.verified_success, clean, "trace {trace}");
    }
}

// --- nine states (SPEC section 3) --------------------------------------------------------------

#[test]
fn nine_states_each_trace_is_exactly_its_state() {
    let exp = expected("nine_states.expected.json");
    let states = exp["states"].as_object().expect("states");
    let verdicts = replay(&[fixture("nine_states.jsonl")]);
    let traces = by_trace(&verdicts);
    assert_eq!(traces.len(), states.len(), "one verdict per fixture trace, no others: {:?}", traces.keys());
    for (trace, want) in states {
        let want = state_named(want.as_str().expect("state name"));
        let vs = traces.get(trace).unwrap_or_else(|| panic!("no verdict for trace {trace}"));
        assert_eq!(vs.len(), 1, "trace {trace}: exactly one call");
        let v = vs[0];
        assert_eq!(v.state, want, "trace {trace}: first failed {:?}, reason {:?}", v.first_failed_layer, v.reason);
        if let Some(first) = v.first_failed_layer {
            for l in Layer::ALL.into_iter().filter(|l| *l > first) {
                assert_eq!(v.layers.get(l), LayerStatus::Unobserved, "trace {trace}: {l:?}");
            }
        }
    }
}

#[test]
fn nine_states_fixture_covers_the_nine_spec_states() {
    let exp = expected("nine_states.expected.json");
    let mut named: Vec<HealthState> =
        exp["states"].as_object().expect("states").values().map(|v| state_named(v.as_str().expect("name"))).collect();
    named.extend(exp["pending"].as_object().expect("pending").keys().map(|k| state_named(k)));
    named.sort();
    // SPEC section 3 lists nine states; `transport_failed`, `contract_drift` (issue 3's pinning),
    // `unverified` and `waiting` (SPEC's "waiting" of a `working` call, a state of its own here)
    // are this project's additions and have no reference case in that fixture.
    let spec: Vec<HealthState> = HealthState::ALL
        .into_iter()
        .filter(|s| {
            !matches!(s, HealthState::TransportFailed | HealthState::ContractDrift | HealthState::Unverified | HealthState::Waiting)
        })
        .collect();
    assert_eq!(named, spec);
    assert!(exp["pending"].as_object().expect("pending").is_empty(), "no state is pending any more");
}

/// One OTLP/JSON line with the given spans of one resource.
fn export_line(service: &str, spans: Vec<Value>) -> String {
    serde_json::json!({
        "resourceSpans": [{
            "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": service}}]},
            "scopeSpans": [{"scope": {"name": "pending-case"}, "spans": spans}]
        }]
    })
    .to_string()
}

fn attrs(pairs: &[(&str, Value)]) -> Vec<Value> {
    pairs
        .iter()
        .map(|(k, v)| {
            let value = match v {
                Value::Bool(b) => serde_json::json!({"boolValue": b}),
                Value::Number(n) => serde_json::json!({"intValue": n.to_string()}),
                Value::String(s) => serde_json::json!({"stringValue": s}),
                other => panic!("unsupported attribute value {other:?}"),
            };
            serde_json::json!({"key": k, "value": value})
        })
        .collect()
}

#[allow(clippy::too_many_arguments)] // one argument per OTLP span field the fixtures vary
fn otlp_span(
    trace: &str,
    span: &str,
    parent: Option<&str>,
    name: &str,
    kind: &str,
    start_ms: u64,
    end_ms: u64,
    a: &[(&str, Value)],
) -> Value {
    const T0: u64 = 1_764_000_000_000_000_000;
    let mut s = serde_json::json!({
        "traceId": trace, "spanId": span, "name": name, "kind": kind,
        "startTimeUnixNano": (T0 + start_ms * 1_000_000).to_string(),
        "endTimeUnixNano": (T0 + end_ms * 1_000_000).to_string(),
        "attributes": attrs(a),
    });
    if let Some(p) = parent {
        s["parentSpanId"] = Value::from(p);
    }
    s
}

fn replay_lines(lines: &[String]) -> Vec<Verdict> {
    let mut f = tempfile::NamedTempFile::new().expect("temp file");
    for l in lines {
        writeln!(f, "{l}").expect("write");
    }
    replay(&[f.path().to_string_lossy().into_owned()])
}

#[test]
fn nine_states_stale_catalog_list_changed_without_rediscovery() {
    // A complete discovery, then a list-changed notification, then a tools/call with no new
    // tools/list in between: the catalog the call was chosen from predates the signal (SPEC
    // section 4, reference case 3), so the call is stale_catalog, even though it was confirmed.
    let t = "09000000000000000000000000000008";
    let call = |rid: &str| {
        vec![
            ("mcp.method.name", Value::from("tools/call")),
            ("gen_ai.tool.name", Value::from("read_ticket")),
            ("jsonrpc.request.id", Value::from(rid)),
            ("mcp.session.id", Value::from("sess-stale")),
        ]
    };
    let lines = vec![
        export_line(
            "agent",
            vec![
                otlp_span(
                    t,
                    "0100000000000001",
                    None,
                    "tools/list",
                    "SPAN_KIND_CLIENT",
                    0,
                    10,
                    &[
                        ("mcp.method.name", Value::from("tools/list")),
                        ("jsonrpc.request.id", Value::from("1")),
                        ("mcp.session.id", Value::from("sess-stale")),
                        ("mcp_health.catalog.next_cursor_present", Value::from(false)),
                    ],
                ),
                otlp_span(
                    t,
                    "0100000000000002",
                    None,
                    "notifications/tools/list_changed",
                    "SPAN_KIND_SERVER",
                    20,
                    21,
                    &[("mcp.method.name", Value::from("notifications/tools/list_changed")), ("mcp.session.id", Value::from("sess-stale"))],
                ),
                otlp_span(t, "0100000000000003", None, "tools/call read_ticket", "SPAN_KIND_CLIENT", 30, 60, &call("2")),
            ],
        ),
        export_line(
            "tickets-mcp",
            vec![otlp_span(
                t,
                "0200000000000003",
                Some("0100000000000003"),
                "tools/call read_ticket",
                "SPAN_KIND_SERVER",
                35,
                55,
                &call("2"),
            )],
        ),
        export_line(
            "verifier",
            vec![otlp_span(
                t,
                "0300000000000003",
                Some("0100000000000003"),
                "verify",
                "SPAN_KIND_INTERNAL",
                70,
                80,
                &[("mcp_health.outcome.result", Value::from("confirmed")), ("mcp_health.outcome.method", Value::from("receipt"))],
            )],
        ),
    ];
    let verdicts = replay_lines(&lines);
    let call = verdicts.iter().find(|v| v.method.as_deref() == Some("tools/call")).expect("a verdict for the tools/call");
    assert_eq!(call.state, HealthState::StaleCatalog, "{call:?}");
}

#[test]
fn nine_states_working_long_call_with_valid_progress() {
    // A tools/call still in flight: its client and server spans have not ended (so are not
    // exported), but the request's start was reported (`mcp_health.call.phase=request_sent`, with
    // the progress token it supplied), the server sent progress notifications for that token whose
    // values strictly increase, and the absolute deadline has not passed. SPEC section 5: working.
    let t = "09000000000000000000000000000009";
    let progress = |span: &str, at: u64, value: i64| {
        otlp_span(
            t,
            span,
            Some("0200000000000001"),
            "notifications/progress",
            "SPAN_KIND_SERVER",
            at,
            at + 1,
            &[
                ("mcp.method.name", Value::from("notifications/progress")),
                ("mcp.session.id", Value::from("sess-long")),
                ("mcp_health.progress.token", Value::from("tok-1")),
                ("mcp_health.progress.value", Value::from(value)),
                ("mcp_health.progress.total", Value::from(100)),
            ],
        )
    };
    let sent = otlp_span(
        t,
        "0100000000000001",
        None,
        "tools/call export_report",
        "SPAN_KIND_CLIENT",
        0,
        0,
        &[
            ("mcp.method.name", Value::from("tools/call")),
            ("gen_ai.tool.name", Value::from("export_report")),
            ("jsonrpc.request.id", Value::from("9")),
            ("mcp.session.id", Value::from("sess-long")),
            ("mcp_health.progress.token", Value::from("tok-1")),
            ("mcp_health.call.phase", Value::from("request_sent")),
        ],
    );
    let mut lines = vec![export_line("agent", vec![sent.clone()])];
    lines.push(export_line(
        "reports-mcp",
        vec![progress("0200000000000002", 1_000, 10), progress("0200000000000003", 2_000, 20), progress("0200000000000004", 3_000, 35)],
    ));
    let verdicts = replay_lines(&lines);
    assert_eq!(verdicts.len(), 1, "{verdicts:?}");
    assert_eq!(verdicts[0].state, HealthState::Working, "{:?}", verdicts[0]);
    assert_eq!(verdicts[0].progress.as_ref().map(|p| p.valid_updates), Some(3));

    // The same notifications without the request's token are not valid evidence: never working.
    let mut unsupplied = lines.clone();
    unsupplied[0] = export_line(
        "agent",
        vec![otlp_span(
            t,
            "0100000000000001",
            None,
            "tools/call export_report",
            "SPAN_KIND_CLIENT",
            0,
            0,
            &[
                ("mcp.method.name", Value::from("tools/call")),
                ("jsonrpc.request.id", Value::from("9")),
                ("mcp_health.call.phase", Value::from("request_sent")),
            ],
        )],
    );
    let v = replay_lines(&unsupplied);
    assert_ne!(v[0].state, HealthState::Working, "{:?}", v[0]);
}

// --- the binary -----------------------------------------------------------------------------

fn run_binary(args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_mcp-health")).args(args).output().expect("run mcp-health");
    assert!(out.status.success(), "mcp-health {args:?} failed: {}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    out
}

const VERDICT_KEYS: [&str; 8] = ["trace_id", "method", "tool", "first_failed_layer", "layers", "state", "confidence", "next_action"];

/// Parse `replay --format json` output: every line JSON, verdicts then one summary.
fn json_lines(path: &str) -> (Vec<Value>, Value) {
    let out = run_binary(&["replay", "--format", "json", path]);
    let stdout = String::from_utf8(out.stdout).expect("utf-8 stdout");
    let mut lines: Vec<Value> = stdout
        .lines()
        .enumerate()
        .map(|(i, l)| serde_json::from_str(l).unwrap_or_else(|e| panic!("{path}: line {} is not JSON ({e}): {l}", i + 1)))
        .collect();
    let summary = lines.pop().expect("a summary line");
    // Catalog (`"catalog": true`), incident (`"incident": true`) and drift lines are checked in
    // tests/catalog_fixtures.rs, tests/incidents.rs and tests/pinning_cli.rs.
    lines.retain(|v| v.get("catalog").is_none() && v.get("incident").is_none() && v.get("drift").is_none());
    assert_eq!(summary["summary"], Value::Bool(true), "the last line is the summary: {summary}");
    for v in &lines {
        assert!(v.get("summary").is_none(), "only the last line is a summary: {v}");
        for k in VERDICT_KEYS {
            assert!(v.get(k).is_some(), "{path}: verdict lacks {k}: {v}");
        }
        let layers = v["layers"].as_object().unwrap_or_else(|| panic!("layers is an object: {v}"));
        assert_eq!(layers.len(), 5, "{v}");
        for l in Layer::ALL {
            let s = layers.get(l.as_str()).and_then(Value::as_str).unwrap_or_else(|| panic!("layers.{} missing: {v}", l.as_str()));
            assert!(["passed", "failed", "unobserved"].contains(&s), "layers.{} = {s}", l.as_str());
        }
        assert!(v["trace_id"].as_str().is_some_and(|t| t.len() == 32), "{v}");
        assert!(HealthState::ALL.iter().any(|s| v["state"] == s.as_str()), "{v}");
        assert!(["low", "medium", "high"].iter().any(|c| v["confidence"] == *c), "{v}");
        assert!(v["next_action"].as_str().is_some_and(|a| !a.is_empty()), "{v}");
        assert!(v["first_failed_layer"].is_null() || Layer::ALL.iter().any(|l| v["first_failed_layer"] == l.as_str()), "{v}");
    }
    for k in ["protocol_success_rate", "verified_success_rate"] {
        assert!(summary[k].as_f64().is_some(), "summary lacks {k}: {summary}");
    }
    (lines, summary)
}

#[test]
fn binary_replay_json_eight_calls_lines_parse_with_required_keys_and_rates() {
    let exp = expected("eight_calls.expected.json");
    let (verdicts, summary) = json_lines(&fixture("eight_calls.jsonl"));
    assert_eq!(verdicts.len(), exp["calls"].as_object().expect("calls").len());
    for v in &verdicts {
        let trace = v["trace_id"].as_str().expect("trace id");
        assert_eq!(v["first_failed_layer"], exp["calls"][trace]["first_failed_layer"], "trace {trace}");
    }
    assert_eq!(summary["protocol_success_rate"].as_f64(), exp["protocol_success_rate"].as_f64());
    assert_eq!(summary["verified_success_rate"].as_f64(), exp["verified_success_rate"].as_f64());
}

#[test]
fn binary_replay_json_nine_states_lines_parse_with_required_keys_and_rates() {
    let exp = expected("nine_states.expected.json");
    let (verdicts, _summary) = json_lines(&fixture("nine_states.jsonl"));
    assert_eq!(verdicts.len(), exp["states"].as_object().expect("states").len());
    for v in &verdicts {
        let trace = v["trace_id"].as_str().expect("trace id");
        assert_eq!(v["state"], exp["states"][trace], "trace {trace}");
    }
}

#[test]
fn binary_replay_json_planted_secrets_lines_parse_with_required_keys_and_rates() {
    let (verdicts, _summary) = json_lines(&fixture("planted_secrets.jsonl"));
    assert_eq!(verdicts.len(), 1);
}

#[test]
fn binary_replay_table_prints_both_rates() {
    let out = run_binary(&["replay", &fixture("eight_calls.jsonl")]);
    let stdout = String::from_utf8(out.stdout).expect("utf-8");
    assert!(stdout.contains("protocol success: 3 of 8 (37.5 %)"), "{stdout}");
    assert!(stdout.contains("verified success: 1 of 8 (12.5 %)"), "{stdout}");
}

// --- telemetry hygiene ----------------------------------------------------------------------

fn planted() -> Vec<String> {
    let exp = expected("planted_secrets.expected.json");
    let list: Vec<String> = exp["planted"].as_array().expect("planted").iter().map(|v| v.as_str().expect("string").to_string()).collect();
    assert!(!list.is_empty());
    list
}

#[test]
fn planted_secrets_never_appear_in_replay_output_json_or_table() {
    let planted = planted();
    let input = std::fs::read_to_string(fixture("planted_secrets.jsonl")).expect("fixture");
    for p in &planted {
        assert!(input.contains(p.as_str()), "the fixture really carries {p}");
    }
    for args in [vec!["replay", "--format", "json"], vec!["replay", "--format", "table"], vec!["replay"]] {
        let mut args = args;
        let path = fixture("planted_secrets.jsonl");
        args.push(&path);
        let out = run_binary(&args);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stdout.trim().is_empty(), "{args:?} printed nothing");
        for p in &planted {
            assert!(!stdout.contains(p.as_str()), "{args:?}: stdout leaks {p}:\n{stdout}");
            assert!(!stderr.contains(p.as_str()), "{args:?}: stderr leaks {p}:\n{stderr}");
        }
    }
}

#[test]
fn planted_secrets_never_reach_a_verdict() {
    let planted = planted();
    let verdicts = replay(&[fixture("planted_secrets.jsonl")]);
    assert_eq!(verdicts.len(), 1);
    let debug = format!("{verdicts:?}");
    let json = serde_json::to_string(&verdicts).expect("serialize");
    for p in &planted {
        assert!(!debug.contains(p.as_str()), "Debug of the verdict leaks {p}");
        assert!(!json.contains(p.as_str()), "JSON of the verdict leaks {p}");
    }
    // The safe parts of the challenge survive: the scope token, not the quoted token after it.
    assert_eq!(verdicts[0].state, HealthState::NeedsAuth);
    assert_eq!(verdicts[0].required_scope.as_deref(), Some("tickets:write"));
}
