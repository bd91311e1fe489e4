//! Tool-contract digests (SPEC section 4): a versioned projection of each tool definition,
//! canonicalized with RFC 8785 (JCS, by `serde_json_canonicalizer`) and hashed with SHA-256.
//!
//! The projection keeps what an agent acts on — `name`, `title`, `description`, `inputSchema`,
//! `outputSchema`, `annotations`, `execution` — and drops what is decorative (`icons`) or
//! transport-level (`_meta`). Hashing the description is deliberate: "max results" becoming "page
//! index" on the same integer is drift that structural validation misses.

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// Recorded beside every digest: a digest is only comparable to one of the same projection.
pub const PROJECTION_VERSION: &str = "mcp-tool-v1";

/// The projected fields, in no particular order (JCS sorts them).
pub const PROJECTED_FIELDS: [&str; 7] = ["name", "title", "description", "inputSchema", "outputSchema", "annotations", "execution"];

/// Why a definition could not be digested.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DigestError {
    #[error("tool definition is not a JSON object")]
    NotAnObject,
    #[error("tool definition has no string `name`")]
    NoName,
    #[error("tool definition is not JSON: {0}")]
    Json(String),
}

/// A tool's contract digest.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ToolDigest {
    pub name: String,
    /// `sha256:<hex>` of the JCS form of the projection.
    pub digest: String,
    pub projection_version: String,
}

/// The projection of a tool definition: the contract fields only.
pub fn project(tool: &Value) -> Result<Value, DigestError> {
    let obj = tool.as_object().ok_or(DigestError::NotAnObject)?;
    if !obj.get("name").is_some_and(Value::is_string) {
        return Err(DigestError::NoName);
    }
    let mut out = Map::new();
    for f in PROJECTED_FIELDS {
        if let Some(v) = obj.get(f) {
            if !v.is_null() {
                out.insert(f.to_string(), v.clone());
            }
        }
    }
    Ok(Value::Object(out))
}

/// RFC 8785 bytes of a value.
pub fn canonical(v: &Value) -> Vec<u8> {
    // Serializing a `serde_json::Value` cannot fail: its keys are strings and its numbers finite.
    serde_json_canonicalizer::to_vec(v).unwrap_or_default()
}

fn sha256_tag(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// The digest of one tool definition.
pub fn tool_digest(tool: &Value) -> Result<ToolDigest, DigestError> {
    let p = project(tool)?;
    let name = p.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
    Ok(ToolDigest { name, digest: sha256_tag(&canonical(&p)), projection_version: PROJECTION_VERSION.into() })
}

/// The registry digest: SHA-256 of the JCS array of `{name, digest}` sorted by name. Independent of
/// list order and page boundaries; equal registries give equal digests.
pub fn registry_digest(tools: &[ToolDigest]) -> String {
    let mut sorted: Vec<&ToolDigest> = tools.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name).then(a.digest.cmp(&b.digest)));
    let arr = Value::Array(sorted.iter().map(|t| serde_json::json!({"name": t.name, "digest": t.digest})).collect());
    sha256_tag(&canonical(&arr))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// RFC 8785 appendix vectors and number edge cases, through the maintained library.
    #[test]
    fn rfc8785_golden_vectors() {
        let cases: &[(&str, &str)] = &[
            // Key sorting by UTF-16 code units, with a supplementary-plane key (RFC 8785 §3.2.3).
            (
                r#"{"\u20ac":"Euro Sign","\r":"Carriage Return","\ufb33":"Hebrew Letter Dalet With Dagesh","1":"One","\ud83d\ude00":"Emoji: Grinning Face","\u0080":"Control","\u00f6":"Latin Small Letter O With Diaeresis"}"#,
                "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u{80}\":\"Control\",\"\u{f6}\":\"Latin Small Letter O With Diaeresis\",\"\u{20ac}\":\"Euro Sign\",\"\u{1f600}\":\"Emoji: Grinning Face\",\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}",
            ),
            // Numbers (RFC 8785 §3.2.2.3 / appendix B).
            (r#"[1E30, 4.50, 2e-3, 0.000001, 1e-7, -0, 333333333.33333329, 1e+21, 9007199254740992]"#, "[1e+30,4.5,0.002,0.000001,1e-7,0,333333333.3333333,1e+21,9007199254740992]"),
            // Literals, escapes, nesting (RFC 8785 §3.2.2).
            (r#"{"numbers":[333333333.33333329,1E30,4.50,2e-3,0.000000000000000000000000001],"string":"\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/","literals":[null,true,false]}"#,
             r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#),
        ];
        for (input, want) in cases {
            let v: Value = serde_json::from_str(input).unwrap();
            assert_eq!(String::from_utf8(canonical(&v)).unwrap(), *want, "input {input}");
        }
    }

    #[test]
    fn changed_required_input_changes_the_digest() {
        // SPEC fixture case 5: read_ticket from ticketId to projectId + ticketId.
        let old = json!({"name":"read_ticket","inputSchema":{"type":"object","properties":{"ticketId":{"type":"string"}},"required":["ticketId"]}});
        let new = json!({"name":"read_ticket","inputSchema":{"type":"object","properties":{"projectId":{"type":"string"},"ticketId":{"type":"string"}},"required":["projectId","ticketId"]}});
        assert_ne!(tool_digest(&old).unwrap().digest, tool_digest(&new).unwrap().digest);
    }

    #[test]
    fn registry_digest_is_order_independent() {
        let t1 = tool_digest(&json!({"name":"a"})).unwrap();
        let t2 = tool_digest(&json!({"name":"b","description":"x"})).unwrap();
        assert_eq!(registry_digest(&[t1.clone(), t2.clone()]), registry_digest(&[t2.clone(), t1.clone()]));
        assert_ne!(registry_digest(std::slice::from_ref(&t1)), registry_digest(&[t1, t2]));
    }

    #[test]
    fn bad_definitions_are_errors() {
        assert_eq!(tool_digest(&json!([1])), Err(DigestError::NotAnObject));
        assert_eq!(tool_digest(&json!({"description":"x"})), Err(DigestError::NoName));
    }
}
