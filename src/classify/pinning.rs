//! Contract pinning (SPEC section 4): a lockfile pins each tool's contract digest per server at
//! first contact; a definition in use that differs from its pin is `contract_drift`.
//!
//! The lockfile is JSON, pretty-printed with sorted keys so a change reads as a small diff in
//! review. Each entry keeps the projected definition (when it was observed) so drift can be
//! explained ("parameter `query` renamed to `q`"), not only detected.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::digest::PROJECTION_VERSION;
use super::drift::{contract_diff, ContractChange};

pub(crate) const LOCKFILE_VERSION: u32 = 1;

/// One pinned tool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Pin {
    pub digest: String,
    pub projection_version: String,
    /// RFC 3339 time of the discovery the pin was taken from.
    pub first_seen: String,
    /// The projected definition, when it was observed (raw definitions on a `tools/list` span).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub definition: Option<Value>,
}

/// The lockfile: server → tool → pin.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Lockfile {
    pub version: u32,
    pub servers: BTreeMap<String, BTreeMap<String, Pin>>,
}

/// Why a lockfile text could not be used (reading and writing files is the CLI's job).
#[derive(Debug, thiserror::Error)]
pub enum LockfileError {
    #[error("not a valid lockfile: {0}")]
    Parse(serde_json::Error),
    #[error("lockfile version {0}; this mcp-health reads version {LOCKFILE_VERSION}")]
    Version(u32),
    #[error("server {server:?}, tool {tool:?}: {error}")]
    BadDigest { server: String, tool: String, error: DigestFormatError },
}

/// A contract digest that is not `sha256:` followed by 64 hex digits. It says what is wrong, never
/// the value: a gate client may send anything there (a provider key pasted by mistake).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("digest must be \"sha256:\" followed by 64 hex digits (a {PROJECTION_VERSION} contract digest): {problem}")]
pub struct DigestFormatError {
    pub problem: DigestProblem,
}

/// What is wrong with a digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DigestProblem {
    /// It does not start with `sha256:`.
    Prefix,
    /// So many characters follow the prefix.
    Length(usize),
    /// The character at this position (after the prefix) is no hex digit.
    NotHex(usize),
}

impl std::fmt::Display for DigestProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DigestProblem::Prefix => f.write_str("it does not start with \"sha256:\""),
            DigestProblem::Length(n) => write!(f, "{n} characters follow the prefix"),
            DigestProblem::NotHex(i) => write!(f, "character {} after the prefix is no hex digit", i + 1),
        }
    }
}

/// The one validation of a contract digest, for the lockfile and the gate alike: `sha256:` and 64
/// hex digits. Returned lowercased (digests are written in lowercase hex).
pub(crate) fn parse_digest(d: &str) -> Result<String, DigestFormatError> {
    let problem = match d.strip_prefix("sha256:") {
        None => DigestProblem::Prefix,
        Some(h) => match h.chars().position(|c| !c.is_ascii_hexdigit()) {
            Some(i) if i < 64 => DigestProblem::NotHex(i),
            _ if h.len() != 64 => DigestProblem::Length(h.chars().count()),
            _ => return Ok(d.to_ascii_lowercase()),
        },
    };
    Err(DigestFormatError { problem })
}

/// The answer of a pin check.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum PinCheck {
    /// The digest equals the pin.
    Matches,
    /// No pin for this server and tool.
    Unpinned,
    /// Pinned under another projection version: digests are not comparable.
    ProjectionMismatch { pinned: String },
    /// The contract drifted; `changes` is empty when a definition was missing on either side.
    Drift { pinned_digest: String, changes: Vec<ContractChange> },
}

impl Lockfile {
    pub fn new() -> Self {
        Lockfile { version: LOCKFILE_VERSION, servers: BTreeMap::new() }
    }

    pub fn parse(text: &str) -> Result<Lockfile, LockfileError> {
        let l: Lockfile = serde_json::from_str(text).map_err(LockfileError::Parse)?;
        if l.version != LOCKFILE_VERSION {
            return Err(LockfileError::Version(l.version));
        }
        // Every pin's digest is validated here, once, so no later reader meets a malformed one.
        for (server, tools) in &l.servers {
            for (tool, pin) in tools {
                parse_digest(&pin.digest).map_err(|error| LockfileError::BadDigest {
                    server: server.clone(),
                    tool: tool.clone(),
                    error,
                })?;
            }
        }
        Ok(l)
    }

    pub fn to_pretty(&self) -> String {
        // BTreeMaps and `serde_json::Value` (no `preserve_order`) serialize with sorted keys.
        let mut s = serde_json::to_string_pretty(self).unwrap_or_default();
        s.push('\n');
        s
    }

    pub fn pin(&self, server: &str, tool: &str) -> Option<&Pin> {
        self.servers.get(server)?.get(tool)
    }

    /// Pin a discovery unless the tool is pinned already (pins are taken at first contact);
    /// `replace` re-pins. Returns whether the lockfile changed.
    pub fn add(&mut self, server: &str, tool: &str, pin: Pin, replace: bool) -> bool {
        let tools = self.servers.entry(server.to_string()).or_default();
        match tools.get(tool) {
            Some(old) if !replace || old.digest == pin.digest => false,
            _ => {
                tools.insert(tool.to_string(), pin);
                true
            }
        }
    }

    /// Check the definition in use against its pin.
    pub fn check(&self, server: &str, tool: &str, digest: &str, definition: Option<&Value>) -> PinCheck {
        let Some(p) = self.pin(server, tool) else { return PinCheck::Unpinned };
        if p.projection_version != PROJECTION_VERSION {
            return PinCheck::ProjectionMismatch { pinned: p.projection_version.clone() };
        }
        if p.digest == digest {
            return PinCheck::Matches;
        }
        let changes = match (&p.definition, definition) {
            (Some(old), Some(new)) => contract_diff(old, new),
            _ => Vec::new(),
        };
        PinCheck::Drift { pinned_digest: p.digest.clone(), changes }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::digest::{project, tool_digest};
    use serde_json::json;

    fn pin_of(def: &Value) -> Pin {
        Pin {
            digest: tool_digest(def).unwrap().digest,
            projection_version: PROJECTION_VERSION.into(),
            first_seen: "2026-11-29T00:00:00Z".into(),
            definition: Some(project(def).unwrap()),
        }
    }

    #[test]
    fn check_matches_drifts_and_explains() {
        let old = json!({"name":"search","inputSchema":{"type":"object","properties":{"query":{"type":"string"}},"required":["query"]}});
        let new = json!({"name":"search","inputSchema":{"type":"object","properties":{"q":{"type":"string"}},"required":["q"]}});
        let mut l = Lockfile::new();
        assert!(l.add("docs:443", "search", pin_of(&old), false));
        assert!(!l.add("docs:443", "search", pin_of(&new), false), "first contact wins");
        let d_old = tool_digest(&old).unwrap().digest;
        let d_new = tool_digest(&new).unwrap().digest;
        assert_eq!(l.check("docs:443", "search", &d_old, None), PinCheck::Matches);
        assert_eq!(l.check("other:443", "search", &d_old, None), PinCheck::Unpinned);
        match l.check("docs:443", "search", &d_new, Some(&project(&new).unwrap())) {
            PinCheck::Drift { changes, .. } => {
                assert_eq!(changes, vec![ContractChange::ParameterRenamed { from: "query".into(), to: "q".into() }])
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(l.check("docs:443", "search", &d_new, None), PinCheck::Drift { ref changes, .. } if changes.is_empty()));
        assert!(l.add("docs:443", "search", pin_of(&new), true), "replace re-pins");
    }

    #[test]
    fn lockfile_round_trips_sorted_and_rejects_other_versions() {
        let mut l = Lockfile::new();
        l.add("b:1", "z", pin_of(&json!({"name":"z"})), false);
        l.add("a:1", "y", pin_of(&json!({"name":"y","description":"d"})), false);
        let text = l.to_pretty();
        assert!(text.find("\"a:1\"").unwrap() < text.find("\"b:1\"").unwrap(), "servers sorted");
        assert_eq!(Lockfile::parse(&text).unwrap(), l);
        assert!(matches!(Lockfile::parse(&text.replace("\"version\": 1", "\"version\": 9")), Err(LockfileError::Version(9))));
        assert!(matches!(Lockfile::parse("{"), Err(LockfileError::Parse(..))));
    }

    /// Issue 8 defect 13: a pin whose digest is not a full contract digest is refused at parse
    /// time, naming the server and tool.
    #[test]
    fn lockfile_with_a_short_digest_is_refused_naming_the_tool() {
        let mut l = Lockfile::new();
        l.add("a:1", "y", pin_of(&json!({"name":"y"})), false);
        let good = l.pin("a:1", "y").unwrap().digest.clone();
        let text = l.to_pretty().replace(&good, "sha256:abc");
        match Lockfile::parse(&text) {
            Err(e @ LockfileError::BadDigest { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains("\"y\"") && msg.contains("\"a:1\"") && msg.contains("64 hex"), "{msg}");
            }
            other => panic!("{other:?}"),
        }
        assert!(parse_digest(&good).is_ok());
        assert_eq!(parse_digest(&good.to_ascii_uppercase().replace("SHA256:", "sha256:")).unwrap(), good);
        assert!(parse_digest(&good.replace("sha256:", "md5:")).is_err());
    }
}
