//! `replay --format sarif`: the verdicts as a SARIF 2.1.0 log, for code-scanning dashboards (GitHub's
//! `upload-sarif`): one rule per health state and per kind of contract drift, a result per call
//! that is not healthy and per drifted definition, located in the evidence file — or, for drift, at
//! the tool's pin in the lockfile, so the alert points at the line a reviewer would change.
//!
//! As with JUnit, only the verdict's redacted fields are written (see `junit`); JSON escaping is
//! serde_json's.

use std::io::Write;

use serde_json::{json, Value};

use crate::verdict::{ContractChange, HealthState};

use super::fail_on::{Evidence, FailOn, Finding};
use super::{call_identity, reported};

/// The SARIF severity of a result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Level {
    Error,
    Warning,
    Note,
}

impl Level {
    fn as_str(self) -> &'static str {
        match self {
            Level::Error => "error",
            Level::Warning => "warning",
            Level::Note => "note",
        }
    }
}

/// How bad a state is: a failure is an error; a call nobody verified, or a catalog that is not
/// known to be current, a warning (never green, not broken either); a call still going a note.
fn state_level(s: HealthState) -> Level {
    match s {
        HealthState::Unverified | HealthState::StaleCatalog => Level::Warning,
        HealthState::Working | HealthState::Waiting | HealthState::Healthy => Level::Note,
        _ => Level::Error,
    }
}

/// The rule's one-line description of a state (SPEC section 3).
fn state_description(s: HealthState) -> &'static str {
    match s {
        HealthState::NeedsAuth => "The call was refused for authorization (401, 403, missing token).",
        HealthState::TransportFailed => "The server was not reached (DNS, refused, TLS, HTTP 5xx), with no side effect possible.",
        HealthState::IncompatibleSession => "The protocol version or a needed capability was not negotiated.",
        HealthState::ContractDrift => "The tool definition in use differs from its pin.",
        HealthState::StaleCatalog => "The client's tool catalog is not the server's current one.",
        HealthState::ProtocolError => "A JSON-RPC error: malformed request, unknown tool or method.",
        HealthState::Working => "A long call with valid progress, within its deadline.",
        HealthState::Waiting => "A call waiting for input or an authorization flow, within its deadline.",
        HealthState::ToolFailed => "The tool returned an error result (isError) or timed out.",
        HealthState::EffectUnknown => "A timeout at a side-effect boundary: whether the effect happened is unknown.",
        HealthState::FalseSuccess => "The call succeeded at the protocol, but the expected outcome is missing or failed.",
        HealthState::Unverified => "Every observed layer passed, but no outcome evidence exists.",
        HealthState::Healthy => "Session, catalog, request, effect and outcome evidence all agree.",
    }
}

/// A drift that can break or mislead a caller is an error; one that widens or decorates, a warning.
fn drift_level(kind: &str) -> Level {
    match kind {
        "parameter_added"
        | "enum_widened"
        | "output_schema_changed"
        | "title_changed"
        | "execution_changed"
        | "parameter_schema_changed" => Level::Warning,
        _ => Level::Error,
    }
}

/// A drift whose definition was never observed, so what changed cannot be said.
const DEFINITION_CHANGED: &str = "definition_changed";

fn state_rule(s: HealthState) -> String {
    format!("state/{}", s.as_str())
}
fn drift_rule(kind: &str) -> String {
    format!("drift/{kind}")
}
fn rate_rule(f: &FailOn) -> String {
    match f {
        FailOn::Rate { rate, .. } => format!("rate/{}", rate.as_str()),
        _ => "rate/unknown".into(),
    }
}

/// Every rule, in a fixed order (results refer to them by index).
fn rules() -> Vec<Value> {
    let mut out = Vec::new();
    for s in HealthState::ALL {
        out.push(json!({
            "id": state_rule(s),
            "name": s.as_str(),
            "shortDescription": {"text": format!("Health state {}", s.as_str())},
            "fullDescription": {"text": state_description(s)},
            "defaultConfiguration": {"level": state_level(s).as_str()},
            "properties": {"tags": ["mcp", "health-state"]},
        }));
    }
    for kind in ContractChange::KINDS.into_iter().chain([DEFINITION_CHANGED]) {
        out.push(json!({
            "id": drift_rule(kind),
            "name": kind,
            "shortDescription": {"text": format!("Contract drift: {}", kind.replace('_', " "))},
            "fullDescription": {"text": "A tool definition differs from the contract pinned in the lockfile (mcp-health lock)."},
            "defaultConfiguration": {"level": drift_level(kind).as_str()},
            "properties": {"tags": ["mcp", "contract-drift"]},
        }));
    }
    for rate in ["protocol_rate", "verified_rate"] {
        out.push(json!({
            "id": format!("rate/{rate}"),
            "name": rate,
            "shortDescription": {"text": format!("The {} success rate crossed its --fail-on threshold", rate.trim_end_matches("_rate"))},
            "fullDescription": {"text": "A success rate over the tool-call attempts of the run, compared as `replay --fail-on` was told."},
            "defaultConfiguration": {"level": "error"},
            "properties": {"tags": ["mcp", "success-rate"]},
        }));
    }
    out
}

/// A relative or absolute path as a URI reference: bytes outside RFC 3986's unreserved set (and
/// `/`) percent-encoded.
fn path_uri(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The line (1-based) of `tool`'s pin under `server` in a lockfile as `mcp-health lock` writes it
/// (pretty JSON, one key per line); `None` when it is not found.
fn pin_line(lockfile_text: &str, server: &str, tool: &str) -> Option<usize> {
    let key = |k: &str| format!("{}:", serde_json::to_string(k).unwrap_or_default());
    let (server_key, tool_key) = (key(server), key(tool));
    let indent = |l: &str| l.len() - l.trim_start().len();
    let mut lines = lockfile_text.lines().enumerate();
    let (_, server_line) = lines.by_ref().find(|(_, l)| l.trim_start().starts_with(&server_key))?;
    let depth = indent(server_line);
    // Within the server's object: until a line back at (or above) the server key's indentation.
    lines
        .take_while(|(_, l)| l.trim().is_empty() || indent(l) > depth)
        .find(|(_, l)| l.trim_start().starts_with(&tool_key))
        .map(|(i, _)| i + 1)
}

/// Where the results point: the evidence file (the first replayed one) and the lockfile.
pub(crate) struct Artifacts<'a> {
    /// The first replayed file, unless it was standard input.
    pub evidence: Option<&'a str>,
    /// The lockfile the definitions were checked against, and its text.
    pub lockfile: Option<(&'a str, String)>,
}

fn physical(uri: &str, line: Option<usize>) -> Value {
    let mut loc = json!({"artifactLocation": {"uri": path_uri(uri)}});
    if let Some(l) = line {
        loc["region"] = json!({"startLine": l});
    }
    loc
}

fn location(physical_location: Option<Value>, server: &str, tool: &str) -> Value {
    let mut loc = json!({"logicalLocations": [{"name": tool, "fullyQualifiedName": format!("{server}/{tool}"), "kind": "function"}]});
    if let Some(p) = physical_location {
        loc["physicalLocation"] = p;
    }
    loc
}

/// A stable identity of a finding across runs (so a dashboard does not open a new alert each run):
/// the rule, server, tool and reason, hashed.
fn fingerprint(parts: &[&str]) -> Value {
    json!({"mcpHealthFinding/v1": crate::normalize::redact::hash_hex(parts.join("\u{1f}").as_bytes())})
}

/// The SARIF log of a replay.
pub(crate) fn log(evidence: &Evidence<'_>, findings: &[Finding], artifacts: &Artifacts<'_>) -> Value {
    let rules = rules();
    let index = |id: &str| rules.iter().position(|r| r["id"] == id).unwrap_or(0);
    let mut results = Vec::new();
    let at_evidence = || artifacts.evidence.map(|f| physical(f, None));
    for v in evidence.verdicts.iter().filter(|v| reported(v) && v.state != HealthState::Healthy) {
        let rule = state_rule(v.state);
        let (server, tool) = (v.server.as_deref().unwrap_or("-"), v.tool.as_deref().or(v.method.as_deref()).unwrap_or("-"));
        let reason = v.reason.as_deref().unwrap_or("none");
        let text = format!(
            "{}: {} — first failed layer {}, reason {}. Next: {}",
            call_identity(v),
            v.state.as_str(),
            v.first_failed_layer.map_or("none", |l| l.as_str()),
            reason,
            v.next_action
        );
        results.push(json!({
            "ruleId": rule,
            "ruleIndex": index(&rule),
            "level": state_level(v.state).as_str(),
            "message": {"text": text},
            "locations": [location(at_evidence(), server, tool)],
            "partialFingerprints": fingerprint(&[&rule, server, tool, reason]),
            "properties": {
                "server": server,
                "tool": tool,
                "firstFailedLayer": v.first_failed_layer.map(|l| l.as_str()),
                "reason": v.reason,
                "nextAction": v.next_action,
                "traceId": hex::encode(v.trace_id),
            },
        }));
    }
    for d in evidence.drift {
        let at_pin = artifacts.lockfile.as_ref().map(|(path, text)| physical(path, pin_line(text, &d.server, &d.tool)));
        let changes: Vec<(&str, String)> = if d.changes.is_empty() {
            vec![(DEFINITION_CHANGED, "definition changed (no definition observed to diff)".to_string())]
        } else {
            d.changes.iter().map(|c| (c.kind(), c.describe())).collect()
        };
        for (kind, what) in changes {
            let rule = drift_rule(kind);
            results.push(json!({
                "ruleId": rule,
                "ruleIndex": index(&rule),
                "level": drift_level(kind).as_str(),
                "message": {"text": format!("{} on {}: {what} (pinned {}, now {})", d.tool, d.server, d.pinned_digest, d.digest)},
                "locations": [location(at_pin.clone().or_else(at_evidence), &d.server, &d.tool)],
                "partialFingerprints": fingerprint(&[&rule, &d.server, &d.tool, &what]),
                "properties": {"server": d.server, "tool": d.tool, "pinnedDigest": d.pinned_digest, "digest": d.digest},
            }));
        }
    }
    for f in findings {
        if let Finding::Rate { condition, value } = f {
            let rule = rate_rule(condition);
            let text = match value {
                Some(v) => format!("fail-on {condition}: the rate is {v:.3}"),
                None => format!("fail-on {condition}: no tool calls, so no rate"),
            };
            let mut result = json!({
                "ruleId": rule,
                "ruleIndex": index(&rule),
                "level": "error",
                "message": {"text": text},
                "partialFingerprints": fingerprint(&[&rule, &condition.to_string()]),
            });
            if let Some(p) = at_evidence() {
                result["locations"] = json!([{"physicalLocation": p}]);
            }
            results.push(result);
        }
    }
    json!({
        "$schema": "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": "mcp-health",
                "semanticVersion": env!("CARGO_PKG_VERSION"),
                "rules": rules,
            }},
            "results": results,
            "columnKind": "unicodeCodePoints",
        }],
    })
}

/// Write the SARIF log, pretty-printed.
pub(crate) fn write(out: &mut impl Write, evidence: &Evidence<'_>, findings: &[Finding], artifacts: &Artifacts<'_>) -> std::io::Result<()> {
    serde_json::to_writer_pretty(&mut *out, &log(evidence, findings, artifacts))?;
    writeln!(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_change_kind_is_its_serialized_kind_and_has_a_rule() {
        let samples = [
            ContractChange::ParameterAdded { parameter: "p".into() },
            ContractChange::ParameterRemoved { parameter: "p".into() },
            ContractChange::ParameterRenamed { from: "a".into(), to: "b".into() },
            ContractChange::RequiredChanged { now_required: vec![], no_longer_required: vec![] },
            ContractChange::TypeChanged { parameter: "p".into(), from: "a".into(), to: "b".into() },
            ContractChange::EnumNarrowed { parameter: "p".into(), removed: vec![] },
            ContractChange::EnumWidened { parameter: "p".into(), added: vec![] },
            ContractChange::DescriptionChanged { parameter: None },
            ContractChange::AnnotationFlipped { annotation: "a".into(), from: "a".into(), to: "b".into() },
            ContractChange::OutputSchemaChanged,
            ContractChange::TitleChanged,
            ContractChange::ExecutionChanged,
            ContractChange::ParameterSchemaChanged { parameter: "p".into() },
        ];
        assert_eq!(samples.len(), ContractChange::KINDS.len());
        let rules = rules();
        for (c, kind) in samples.iter().zip(ContractChange::KINDS) {
            assert_eq!(serde_json::to_value(c).unwrap()["kind"], kind);
            assert_eq!(c.kind(), kind);
            assert!(rules.iter().any(|r| r["id"] == drift_rule(kind)), "{kind}");
        }
        for s in HealthState::ALL {
            assert!(rules.iter().any(|r| r["id"] == state_rule(s)), "{s}");
        }
    }

    #[test]
    fn a_pin_is_found_under_its_own_server() {
        let text = "{\n  \"servers\": {\n    \"a:1\": {\n      \"search\": {\n      }\n    },\n    \"b:2\": {\n      \"close\": {},\n      \"search\": {\n      }\n    }\n  }\n}\n";
        assert_eq!(pin_line(text, "a:1", "search"), Some(4));
        assert_eq!(pin_line(text, "b:2", "search"), Some(9));
        assert_eq!(pin_line(text, "c:3", "search"), None);
        assert_eq!(pin_line(text, "a:1", "close"), None, "not the next server's pin");
    }

    #[test]
    fn paths_become_uri_references() {
        assert_eq!(path_uri("tests/fixtures/mcp-health.lock.json"), "tests/fixtures/mcp-health.lock.json");
        assert_eq!(path_uri("dir with space/a#b?.json"), "dir%20with%20space/a%23b%3F.json");
    }
}
