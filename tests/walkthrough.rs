//! The README's five-minute walkthrough tells the truth: every number and claim of its section is
//! read from README.md and checked against a run of the same steps — the real service, the real
//! `mcp-health send` of the same fixture, `/status`, `/status.json` and `mcp-health replay`.
//! Editing a number in the section without changing what the service does fails this test, and
//! so does a change of behaviour the section does not follow.

mod support;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use support::*;

/// The section, whitespace-normalized (its sentences wrap at any word).
fn section() -> String {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let start = readme.find("## Five minutes").expect("the README's five-minute section");
    let rest = &readme[start + 3..];
    let end = rest.find("\n## ").unwrap_or(rest.len());
    rest[..end].split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The word right before `phrase`, which the section must contain exactly once.
fn word_before<'a>(text: &'a str, phrase: &str) -> &'a str {
    assert_eq!(text.matches(phrase).count(), 1, "the walkthrough says {phrase:?} once: {text}");
    let at = text.find(phrase).unwrap();
    text[..at].trim_end().rsplit(' ').next().unwrap_or("").trim_start_matches(['(', ','])
}

/// The word right after `phrase` (exactly once in the section).
fn word_after<'a>(text: &'a str, phrase: &str) -> &'a str {
    assert_eq!(text.matches(phrase).count(), 1, "the walkthrough says {phrase:?} once: {text}");
    let at = text.find(phrase).unwrap() + phrase.len();
    text[at..].trim_start().split(' ').next().unwrap_or("")
}

/// A count as the prose writes it: a number word or digits.
fn count(word: &str) -> u64 {
    const WORDS: [&str; 21] = [
        "no",
        "one",
        "two",
        "three",
        "four",
        "five",
        "six",
        "seven",
        "eight",
        "nine",
        "ten",
        "eleven",
        "twelve",
        "thirteen",
        "fourteen",
        "fifteen",
        "sixteen",
        "seventeen",
        "eighteen",
        "nineteen",
        "twenty",
    ];
    let w = word.to_ascii_lowercase();
    WORDS.iter().position(|x| *x == w).map(|n| n as u64).or_else(|| w.parse().ok()).unwrap_or_else(|| panic!("not a count: {word:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_number_and_claim_of_the_five_minute_walkthrough_holds() {
    let text = section();
    // Step 1: the service, with the embedded default's decision_wait ("about two seconds later").
    let default = std::process::Command::new(env!("CARGO_BIN_EXE_mcp-health")).arg("print-default-config").output().unwrap();
    let default: serde_yaml_ng::Value = serde_yaml_ng::from_slice(&default.stdout).unwrap();
    let wait = default["processors"]["mcp_health"]["decision_wait"].as_str().unwrap().to_string();
    assert_eq!(format!("{}s", count(word_before(&text, "seconds later (`decision_wait`"))), wait, "decision_wait of the default");
    let decision_wait: &'static str = Box::leak(wait.into_boxed_str());
    let svc = Service::start(Cfg { decision_wait, ..Cfg::default() }).await;

    // Step 2: send the recording; count the lines by kind.
    let lines = svc.walkthrough_send(Duration::from_secs(30)).await;
    let verdicts: Vec<&Value> = lines.iter().filter(|l| l.get("trace_id").is_some() && l.get("state").is_some()).collect();
    let incidents: Vec<&Value> = lines.iter().filter(|l| l["incident"] == true).collect();
    let catalogs = lines.iter().filter(|l| l["catalog"] == true).count() as u64;
    let transitions = |t: &str| incidents.iter().filter(|l| l["transition"] == t).count() as u64;
    let claims: [(&str, u64, u64); 7] = [
        ("calls of an agent", count(word_before(&text, "calls of an agent")), verdicts.len() as u64),
        ("JSON lines", count(word_before(&text, "JSON lines:")), lines.len() as u64),
        ("call verdicts", count(word_before(&text, "call verdicts")), verdicts.len() as u64),
        ("incident lines", count(word_before(&text, "incident lines")), incidents.len() as u64),
        ("incidents opened", count(word_before(&text, "incidents opened")), transitions("opened")),
        ("of them resolved", count(word_before(&text, "of them resolved")), transitions("resolved")),
        ("catalog lines", count(word_before(&text, "catalog lines")), catalogs),
    ];
    for (claim, said, seen) in claims {
        assert_eq!(said, seen, "the walkthrough says {said} for {claim:?}; the run printed {seen}: {lines:#?}");
    }
    assert_eq!(count(word_before(&text, "resolved: an incident resolves")), transitions("resolved"), "\"Why N resolved\"");

    // The healthy call is the last one, a `create_ticket` call, and it resolved exactly the
    // failures the README names; the two it names as open stay open.
    let healthy: Vec<&&Value> = verdicts.iter().filter(|v| v["state"] == "healthy").collect();
    assert_eq!(healthy.len(), 1, "one healthy call");
    let tool = word_after(&text, "The healthy").trim_matches('`');
    assert_eq!(healthy[0]["tool"], tool);
    let last = verdicts.iter().filter_map(|v| v["end_ns"].as_u64()).max().unwrap();
    assert_eq!(healthy[0]["end_ns"].as_u64(), Some(last), "the healthy call is the last");
    let named = |phrases: &[(&str, &str)]| -> BTreeSet<String> {
        phrases
            .iter()
            .map(|(phrase, class)| {
                assert!(text.contains(phrase), "the walkthrough names {phrase:?}");
                class.to_string()
            })
            .collect()
    };
    let resolved_named = named(&[
        ("for the 503", "http_503"),
        ("the expired token", "invalid_token"),
        ("the missing scope", "insufficient_scope"),
        ("the tool error and", "tool_error"),
        ("the false success", "outcome_missing"),
    ]);
    let open_named =
        named(&[("the misspelled tool (another tool)", "jsonrpc_-32601"), ("does not resolve (another server)", "dns_failure")]);
    let class = |l: &&Value| l["row"]["cause"]["error_class"].as_str().unwrap_or("").to_string();
    let resolved: BTreeSet<String> = incidents.iter().filter(|l| l["transition"] == "resolved").map(class).collect();
    assert_eq!(resolved, resolved_named, "the incidents the healthy call resolved");

    // Step 3: the page and /status.json.
    let health = svc.health_addr();
    let status: Value = serde_json::from_slice(&http_get(health, "/status.json").await.unwrap().body).unwrap();
    let open: Vec<&Value> = status["incidents"].as_array().unwrap().iter().collect();
    let open_classes: BTreeSet<String> = open.iter().map(|i| i["error_class"].as_str().unwrap_or("").to_string()).collect();
    assert_eq!(open_classes, open_named, "the open incidents");
    let servers: BTreeSet<&str> = open.iter().filter_map(|i| i["server"].as_str()).collect();
    assert_eq!(count(word_before(&text, "open incidents on")), open.len() as u64);
    assert_eq!(count(word_before(&text, "servers remain")), servers.len() as u64);
    assert_eq!(count(word_before(&text, "open incidents by server")), open.len() as u64);
    assert!(open.iter().all(|i| i["owner"].is_string()), "each open incident names its owner: {open:#?}");
    let shown_resolved = status["resolved_incidents"].as_array().unwrap();
    assert_eq!(count(word_before(&text, "resolved ones with the call")), shown_resolved.len() as u64);
    for r in shown_resolved {
        assert_eq!(r["resolved_by"]["trace_id"], healthy[0]["trace_id"], "resolved by the healthy call: {r:#}");
    }
    let every = word_after(&text, "reloads itself every");
    let page = http_get(health, "/status").await.unwrap().text();
    assert!(page.contains(&format!("<meta http-equiv=\"refresh\" content=\"{every}\">")), "reloads every {every} s");
    let off = http_get(health, "/status?refresh=0").await.unwrap().text();
    assert!(text.contains("`?refresh=0` stops that") && !off.contains("http-equiv=\"refresh\""), "?refresh=0 stops the reloads");

    // Step 4: replay's two rates.
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/eight_calls.jsonl");
    let replay = std::process::Command::new(env!("CARGO_BIN_EXE_mcp-health")).arg("replay").arg(&fixture).output().unwrap();
    let replay = String::from_utf8_lossy(&replay.stdout);
    for rate in ["protocol success", "verified success"] {
        let said = word_before(&text, &format!("% {rate}"));
        let line = replay.lines().find(|l| l.starts_with(&format!("{rate}:"))).unwrap_or_else(|| panic!("{rate} in {replay}"));
        assert!(line.ends_with(&format!("({said} %)")), "the walkthrough says {said} % {rate}; replay: {line}");
    }
}
