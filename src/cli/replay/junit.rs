//! `replay --format junit`: one JUnit `<testcase>` per call, one `<testsuite>` per server, so a CI
//! system's test report shows which tool calls of a test run were not healthy and why.
//!
//! Only the verdict's fields are written, and those were redacted when the evidence was read
//! (`normalize::redact`): server addresses without scheme, userinfo, path or query; tool names of
//! the specification's alphabet or a hash; reasons from a fixed vocabulary. Still, names come from
//! the wire, so every string is escaped for XML and characters XML cannot carry are replaced.

use std::collections::BTreeMap;
use std::io::Write;

use crate::engine::DriftEvent;
use crate::verdict::{HealthState, Verdict};

use super::{call_identity, reported};

/// Escape `s` for an XML attribute or text node. Characters XML 1.0 cannot hold at all (most C0
/// controls, U+FFFE, U+FFFF) become U+FFFD, so no server name can make the document unparseable.
pub(crate) fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' => out.push_str("&#9;"),
            '\n' => out.push_str("&#10;"),
            '\r' => out.push_str("&#13;"),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

/// The `<failure message>` of a call that is not healthy: first failed layer, reason, next action.
fn failure_message(v: &Verdict) -> String {
    format!(
        "{}: first failed layer {}, reason {}; next: {}",
        v.state.as_str(),
        v.first_failed_layer.map_or("none", |l| l.as_str()),
        v.reason.as_deref().unwrap_or("none"),
        v.next_action
    )
}

fn seconds(v: &Verdict) -> String {
    format!("{:.3}", v.end_ns.saturating_sub(v.start_ns) as f64 / 1e9)
}

/// Write the JUnit document: a suite per server (in name order), a case per reported call, and a
/// suite `contract drift` with a failed case per drifted definition when there is any.
pub(crate) fn write(out: &mut impl Write, verdicts: &[Verdict], drift: &[DriftEvent]) -> std::io::Result<()> {
    let mut suites: BTreeMap<&str, Vec<&Verdict>> = BTreeMap::new();
    for v in verdicts.iter().filter(|v| reported(v)) {
        suites.entry(v.server.as_deref().unwrap_or("unknown server")).or_default().push(v);
    }
    let failed = |v: &&&Verdict| v.state != HealthState::Healthy;
    let tests: usize = suites.values().map(Vec::len).sum::<usize>() + drift.len();
    let failures: usize = suites.values().map(|s| s.iter().filter(failed).count()).sum::<usize>() + drift.len();
    writeln!(out, r#"<?xml version="1.0" encoding="UTF-8"?>"#)?;
    writeln!(out, r#"<testsuites name="mcp-health" tests="{tests}" failures="{failures}" errors="0">"#)?;
    for (server, calls) in &suites {
        let server = xml_escape(server);
        writeln!(
            out,
            r#"  <testsuite name="{server}" tests="{}" failures="{}" errors="0" skipped="0">"#,
            calls.len(),
            calls.iter().filter(failed).count()
        )?;
        for v in calls {
            let name = xml_escape(&call_identity(v));
            write!(out, r#"    <testcase name="{name}" classname="{server}" time="{}""#, seconds(v))?;
            if v.state == HealthState::Healthy {
                writeln!(out, "/>")?;
                continue;
            }
            let message = xml_escape(&failure_message(v));
            writeln!(out, ">")?;
            writeln!(out, r#"      <failure type="{}" message="{message}">{message}</failure>"#, v.state.as_str())?;
            writeln!(out, "    </testcase>")?;
        }
        writeln!(out, "  </testsuite>")?;
    }
    if !drift.is_empty() {
        writeln!(out, r#"  <testsuite name="contract drift" tests="{0}" failures="{0}" errors="0" skipped="0">"#, drift.len())?;
        for d in drift {
            let changes: Vec<String> = d.changes.iter().map(|c| c.describe()).collect();
            let message = if changes.is_empty() { "definition differs from its pin".to_string() } else { changes.join("; ") };
            writeln!(out, r#"    <testcase name="{}" classname="{}">"#, xml_escape(&d.tool), xml_escape(&d.server))?;
            writeln!(out, r#"      <failure type="contract_drift" message="{0}">{0}</failure>"#, xml_escape(&message))?;
            writeln!(out, "    </testcase>")?;
        }
        writeln!(out, "  </testsuite>")?;
    }
    writeln!(out, "</testsuites>")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_names_are_escaped_and_unholdable_characters_replaced() {
        let cases = [
            ("a<b>&\"c'", "a&lt;b&gt;&amp;&quot;c&apos;"),
            ("x\u{1}y\u{FFFF}", "x\u{FFFD}y\u{FFFD}"),
            ("line\nbreak\ttab", "line&#10;break&#9;tab"),
            ("plain:8443", "plain:8443"),
        ];
        for (raw, want) in cases {
            assert_eq!(xml_escape(raw), want, "{raw:?}");
        }
    }

    #[test]
    fn a_server_named_like_markup_stays_an_attribute() {
        let mut v = crate::verdict::sample("tools/call", true, false);
        v.server = Some("evil\"><testcase name=\"x".into());
        let mut out = Vec::new();
        write(&mut out, &[v], &[]).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.matches("<testcase ").count(), 1, "{text}");
        assert!(text.contains("evil&quot;&gt;&lt;testcase"), "{text}");
    }
}
