//! The documentation is checked like code: a newcomer's README stays short, every link in README.md
//! and docs/ leads somewhere (file and heading), nothing cites a file outside the repository, and
//! the configuration reference and the configuration structs agree — every key docs/configuration.md
//! names is one the parser knows, and every key of the annotated full file
//! (otel-config/mcp-health.yaml, itself parsed with unknown keys refused) and of the embedded
//! default is documented.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// README.md and every Markdown file under docs/ (the lead's working notes in docs/_* excluded).
fn documents() -> Vec<PathBuf> {
    let mut out = vec![root().join("README.md"), root().join("CHANGELOG.md")];
    for e in std::fs::read_dir(root().join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// GitHub's anchor for a heading: lower case, punctuation other than `-` and `_` dropped, spaces
/// to hyphens.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    let mut in_code = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
        }
        if !in_code && line.starts_with('#') {
            out.insert(slug(line.trim_start_matches('#')));
        }
    }
    out
}

/// `(target)` of every inline Markdown link `[text](target)` outside code blocks.
fn links(text: &str) -> Vec<String> {
    let mut in_code = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        let mut rest = line;
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            out.push(after[..end].to_string());
            rest = &after[end..];
        }
    }
    out
}

#[test]
fn the_readme_is_read_in_five_minutes() {
    let lines = read(&root().join("README.md")).lines().count();
    assert!(lines <= 300, "README.md has {lines} lines; the reference belongs in docs/");
}

#[test]
fn every_link_leads_to_a_file_and_heading_that_exist() {
    let mut broken = Vec::new();
    for doc in documents() {
        let text = read(&doc);
        for link in links(&text) {
            if link.starts_with("http://") || link.starts_with("https://") || link.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = link.split_once('#').map_or((link.as_str(), None), |(f, a)| (f, Some(a)));
            let target = if file.is_empty() { doc.clone() } else { doc.parent().unwrap().join(file) };
            if !target.exists() {
                broken.push(format!("{}: {link} (no such file)", doc.display()));
                continue;
            }
            if let Some(a) = anchor {
                if target.extension().is_some_and(|x| x == "md") && !anchors(&read(&target)).contains(a) {
                    broken.push(format!("{}: {link} (no such heading)", doc.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn nothing_cites_files_outside_the_repository_or_the_tracker() {
    let issue = |l: &str| {
        let l = l.to_lowercase();
        ["issue ", "issues ", "issue #"]
            .iter()
            .any(|p| l.match_indices(p).any(|(i, _)| l[i + p.len()..].starts_with(|c: char| c.is_ascii_digit())))
    };
    let mut found = Vec::new();
    for doc in documents() {
        for (n, line) in read(&doc).lines().enumerate() {
            if line.contains("SPEC") || issue(line) {
                found.push(format!("{}:{}: {line}", doc.display(), n + 1));
            }
        }
    }
    assert!(found.is_empty(), "the documentation must stand on its own:\n{}", found.join("\n"));
}

/// Dotted configuration keys written in backticks in docs/configuration.md (complete paths only:
/// abbreviated ones, `….grpc.tls`, are skipped).
fn documented_keys() -> BTreeSet<String> {
    let text = read(&root().join("docs/configuration.md"));
    let roots = ["receivers.", "processors.", "exporters.", "extensions.", "service.", "storage."];
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|t| roots.iter().any(|r| t.starts_with(r)))
        .filter(|t| t.chars().all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '_'))
        .map(str::to_string)
        .collect()
}

/// `a.b.c` as nested YAML with `value` at the leaf.
fn nested(key: &str, value: &str) -> String {
    let mut out = String::new();
    let parts: Vec<&str> = key.split('.').collect();
    for (depth, p) in parts.iter().enumerate() {
        out.push_str(&"  ".repeat(depth));
        out.push_str(p);
        out.push(':');
        if depth + 1 == parts.len() {
            out.push(' ');
            out.push_str(value);
        }
        out.push('\n');
    }
    out
}

#[test]
fn every_documented_key_is_one_the_parser_knows() {
    let keys = documented_keys();
    assert!(keys.len() > 50, "the reference names its keys: found {}", keys.len());
    let mut unknown = Vec::new();
    for key in &keys {
        // A value of the wrong type is fine here: only "unknown field" says the key does not exist.
        let yaml = nested(key, "\"x\"");
        if let Err(e) = mcp_health::config::Config::parse("docs", &yaml, &|_| None) {
            let msg = e.to_string();
            if msg.contains("unknown field") {
                unknown.push(format!("{key}: {msg}"));
            }
        }
    }
    assert!(unknown.is_empty(), "docs/configuration.md names keys the configuration does not have:\n{}", unknown.join("\n"));
}

/// Leaf key paths of a YAML document (maps walked; a sequence or scalar is a leaf).
fn leaf_keys(v: &serde_yaml_ng::Value, prefix: &str, out: &mut BTreeSet<String>) {
    match v {
        serde_yaml_ng::Value::Mapping(m) if !m.is_empty() => {
            for (k, v) in m {
                let k = k.as_str().unwrap_or_default();
                let p = if prefix.is_empty() { k.to_string() } else { format!("{prefix}.{k}") };
                leaf_keys(v, &p, out);
            }
        }
        _ => {
            out.insert(prefix.to_string());
        }
    }
}

#[test]
fn every_key_of_the_shipped_configurations_is_documented() {
    let doc = read(&root().join("docs/configuration.md"));
    // Keys every listener has, documented once as "… on every listener".
    let per_listener = ["read_header_timeout", "idle_timeout", "max_connections", "tls", "auth"];
    let mut missing = BTreeSet::new();
    for file in ["otel-config/mcp-health.yaml", "otel-config/default.yaml"] {
        let text = read(&root().join(file));
        mcp_health::config::Config::parse(file, &text, &|_| None).unwrap_or_else(|e| panic!("{file} is a valid configuration: {e}"));
        let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
        let mut keys = BTreeSet::new();
        leaf_keys(&v, "", &mut keys);
        for k in keys {
            let last = k.rsplit('.').next().unwrap();
            // Per-tool, per-header maps: the map's own key is what is documented.
            let documented = doc.contains(&format!("`{k}`"))
                || per_listener.contains(&last) && doc.contains(&format!("`{last}` on every listener"))
                || k.split('.')
                    .scan(String::new(), |acc, p| {
                        if !acc.is_empty() {
                            acc.push('.');
                        }
                        acc.push_str(p);
                        Some(acc.clone())
                    })
                    .any(|prefix| prefix != k && doc.contains(&format!("`{prefix}.*`")))
                || doc.contains(&format!("`{}`", k.rsplit_once('.').map_or(k.as_str(), |(p, _)| p)))
                    && (k.starts_with("processors.mcp_health.limits.") || k.starts_with("exporters.otlp.headers"));
            if !documented {
                missing.insert(format!("{file}: {k}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "keys of the shipped configurations missing from docs/configuration.md:\n{}",
        missing.into_iter().collect::<Vec<_>>().join("\n")
    );
}
