//! Templates of verifier rules: literal text with `{/json/pointer}` holes filled from the call,
//! and `${env:VAR}` holes filled from the tap's environment when the rules are loaded.
//!
//! A pointer (RFC 6901, `serde_json::Value::pointer`) is read over `{"arguments": …, "result": …}`.
//! A hole whose pointer resolves to nothing is an error, never an empty string: a check against
//! `GET /records/` would look for the wrong thing and could report `missing` for an effect that is
//! there. `{{` and `}}` write literal braces.

use serde_json::Value;

/// Why a template could not be read or filled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    #[error("unclosed `{{` at byte {0}")]
    Unclosed(usize),
    #[error("a hole must be a JSON pointer starting with `/arguments` or `/result` (at byte {0})")]
    BadPointer(usize),
    #[error("environment variable {0} is not set")]
    MissingEnv(String),
    /// The call has nothing at this pointer (named by its root only: the rest may be data).
    #[error("the pointer resolves to nothing in the call's {0}")]
    Unresolved(&'static str),
    /// A hole where the call could change what the rule means (load time).
    #[error("{0}")]
    Unsafe(&'static str),
    /// A value the call filled in that would change what the rule checks (a `..` path segment, a
    /// leading `-` in a command argument): refused, never sent.
    #[error("a value from the call was refused: {0}")]
    Refused(&'static str),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Part {
    Text(String),
    Pointer(String),
}

/// A parsed template. Environment holes are already filled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template {
    parts: Vec<Part>,
}

impl Template {
    /// Parse `src`, filling `${env:VAR}` from `env`.
    pub fn parse(src: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Self, TemplateError> {
        let mut parts = Vec::new();
        let mut text = String::new();
        let b = src.as_bytes();
        let mut i = 0;
        while i < b.len() {
            if src[i..].starts_with("${env:") {
                let end = src[i..].find('}').ok_or(TemplateError::Unclosed(i))? + i;
                let name = &src[i + 6..end];
                text.push_str(&env(name).ok_or_else(|| TemplateError::MissingEnv(name.to_string()))?);
                i = end + 1;
            } else if src[i..].starts_with("{{") {
                text.push('{');
                i += 2;
            } else if src[i..].starts_with("}}") {
                text.push('}');
                i += 2;
            } else if b[i] == b'{' {
                let end = src[i..].find('}').ok_or(TemplateError::Unclosed(i))? + i;
                let ptr = &src[i + 1..end];
                if !(ptr == "/arguments" || ptr == "/result" || ptr.starts_with("/arguments/") || ptr.starts_with("/result/")) {
                    return Err(TemplateError::BadPointer(i));
                }
                if !text.is_empty() {
                    parts.push(Part::Text(std::mem::take(&mut text)));
                }
                parts.push(Part::Pointer(ptr.to_string()));
                i = end + 1;
            } else {
                let ch = src[i..].chars().next().unwrap_or('\u{fffd}');
                text.push(ch);
                i += ch.len_utf8().max(1);
            }
        }
        if !text.is_empty() || parts.is_empty() {
            parts.push(Part::Text(text));
        }
        Ok(Template { parts })
    }

    /// Whether the template reads the call's result (a lost response has none).
    pub fn reads_result(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, Part::Pointer(x) if x.starts_with("/result")))
    }

    /// Fill the holes from `call` (`{"arguments": …, "result": …}`). A template that is one hole
    /// and nothing else gives the value itself (so `equals` can compare numbers and objects).
    pub fn value(&self, call: &Value) -> Result<Value, TemplateError> {
        if let [Part::Pointer(p)] = self.parts.as_slice() {
            return resolve(call, p).cloned();
        }
        self.render(call).map(Value::String)
    }

    /// Fill the holes and give text: strings as they are, other values as JSON.
    pub fn render(&self, call: &Value) -> Result<String, TemplateError> {
        let mut out = String::new();
        for p in &self.parts {
            match p {
                Part::Text(t) => out.push_str(t),
                Part::Pointer(ptr) => match resolve(call, ptr)? {
                    Value::String(s) => out.push_str(s),
                    other => out.push_str(&other.to_string()),
                },
            }
        }
        Ok(out)
    }
}

impl Template {
    /// The JSON pointers of the template's holes.
    pub fn pointers(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().filter_map(|p| match p {
            Part::Pointer(x) => Some(x.as_str()),
            Part::Text(_) => None,
        })
    }

    /// Whether the template has any hole.
    pub fn has_holes(&self) -> bool {
        self.pointers().next().is_some()
    }

    /// The literal text before the first hole (the whole text when there is none).
    fn literal_prefix(&self) -> String {
        let mut out = String::new();
        for p in &self.parts {
            match p {
                Part::Text(t) => out.push_str(t),
                Part::Pointer(_) => break,
            }
        }
        out
    }

    /// Fill the holes, each value through `encode` (the text of the rule passes as written).
    fn render_with(
        &self,
        call: &Value,
        mut encode: impl FnMut(usize, &str) -> Result<String, TemplateError>,
    ) -> Result<String, TemplateError> {
        let mut out = String::new();
        let mut hole = 0;
        for p in &self.parts {
            match p {
                Part::Text(t) => out.push_str(t),
                Part::Pointer(ptr) => {
                    let v = match resolve(call, ptr)? {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    out.push_str(&encode(hole, &v)?);
                    hole += 1;
                }
            }
        }
        Ok(out)
    }
}

/// Where a hole of a URL template sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum UrlSlot {
    /// In the path: encoded as one path segment.
    Path,
    /// In the query: encoded as one query value.
    Query,
}

/// A URL template that the call cannot steer: holes only in the path or the query (never in the
/// scheme, the authority or the fragment), each value percent-encoded for where it sits, `.` and
/// `..` refused as path segments; and, after rendering, the scheme, host and port checked to be
/// the rule's own. So a result that says `../../admin/delete?all=1#` is looked up as one odd
/// record id under the rule's path, and `@attacker:port/steal` right after the authority is
/// refused when the rules are loaded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UrlTemplate {
    template: Template,
    slots: Vec<UrlSlot>,
    /// `scheme://authority` as the rule wrote it.
    origin: String,
}

impl UrlTemplate {
    pub fn parse(src: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Self, TemplateError> {
        let template = Template::parse(src, env)?;
        let prefix = template.literal_prefix();
        let Some((scheme, rest)) = prefix.split_once("://") else {
            return Err(TemplateError::Unsafe("the URL's scheme and host must be written in the rule, before any hole"));
        };
        let Some(authority_end) = rest.find(['/', '?']) else {
            return Err(TemplateError::Unsafe("a hole may not be in the URL's host or port: write the path's first `/` before it"));
        };
        let authority = &rest[..authority_end];
        if authority.is_empty() || authority.contains('@') {
            return Err(TemplateError::Unsafe("the URL needs a host, without user information"));
        }
        let origin = format!("{}://{}", scheme.to_ascii_lowercase(), authority.to_ascii_lowercase());
        // Each hole's slot, from the literal text before it.
        let mut slots = Vec::new();
        let mut seen = String::new();
        for p in &template.parts {
            match p {
                Part::Text(t) => seen.push_str(t),
                Part::Pointer(_) => {
                    if seen.contains('#') {
                        return Err(TemplateError::Unsafe("a hole may not be in the URL's fragment"));
                    }
                    slots.push(if seen.contains('?') { UrlSlot::Query } else { UrlSlot::Path });
                }
            }
        }
        Ok(UrlTemplate { template, slots, origin })
    }

    pub fn template(&self) -> &Template {
        &self.template
    }

    /// The URL for `call`: every value encoded for its slot; then the scheme, host and port must
    /// still be the rule's.
    pub fn render(&self, call: &Value) -> Result<String, TemplateError> {
        let url = self.template.render_with(call, |i, v| match self.slots.get(i) {
            Some(UrlSlot::Path) => {
                if v == "." || v == ".." || v.is_empty() {
                    return Err(TemplateError::Refused("a path segment may not be empty, `.` or `..`"));
                }
                Ok(percent_encode(v))
            }
            Some(UrlSlot::Query) => Ok(percent_encode(v)),
            None => Err(TemplateError::Refused("a hole the rule did not place")),
        })?;
        let lower = url.to_ascii_lowercase();
        let same_origin = lower.strip_prefix(&self.origin).is_some_and(|rest| rest.is_empty() || rest.starts_with(['/', '?']));
        if !same_origin {
            return Err(TemplateError::Refused("the URL would leave the rule's host"));
        }
        Ok(url)
    }
}

/// Percent-encode everything but RFC 3986's unreserved characters: a value is one path segment
/// or one query value, whatever it holds (`/ ? # % @ & = +` included).
pub(crate) fn percent_encode(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn resolve<'a>(call: &'a Value, ptr: &str) -> Result<&'a Value, TemplateError> {
    let root = if ptr.starts_with("/arguments") { "arguments" } else { "result" };
    match call.pointer(ptr) {
        Some(Value::Null) | None => Err(TemplateError::Unresolved(root)),
        Some(v) => Ok(v),
    }
}

/// Whether a value read from a destination equals what the template expects: the same JSON
/// value, or the same text when one side is a string (`"42"` equals `42`: query strings and
/// path segments are text).
pub(crate) fn same(found: &Value, expected: &Value) -> bool {
    if found == expected {
        return true;
    }
    let text = |v: &Value| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    (found.is_string() || expected.is_string()) && text(found) == text(expected)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn env(k: &str) -> Option<String> {
        (k == "TOK").then(|| "s3cr#t value".to_string())
    }

    #[test]
    fn holes_are_filled_from_arguments_and_result() {
        let call = json!({"arguments": {"title": "a b", "n": 7}, "result": {"structuredContent": {"id": "r-1"}}});
        let t = Template::parse("http://h/records/{/result/structuredContent/id}?n={/arguments/n}", &env).unwrap();
        assert_eq!(t.render(&call).unwrap(), "http://h/records/r-1?n=7");
        assert!(t.reads_result());
        let whole = Template::parse("{/arguments/n}", &env).unwrap();
        assert_eq!(whole.value(&call).unwrap(), json!(7));
        assert!(!whole.reads_result());
    }

    #[test]
    fn env_is_filled_at_parse_and_must_exist() {
        assert_eq!(Template::parse("Bearer ${env:TOK}", &env).unwrap().render(&json!({})).unwrap(), "Bearer s3cr#t value");
        assert_eq!(Template::parse("${env:NOPE}", &env), Err(TemplateError::MissingEnv("NOPE".into())));
    }

    #[test]
    fn errors_are_errors_never_empty_text() {
        let call = json!({"arguments": {"a": null}, "result": null});
        for (src, want) in [
            ("{/result/structuredContent/id}", TemplateError::Unresolved("result")),
            ("x{/arguments/a}", TemplateError::Unresolved("arguments")),
            ("x{/arguments/missing}", TemplateError::Unresolved("arguments")),
        ] {
            assert_eq!(Template::parse(src, &env).unwrap().render(&call), Err(want), "{src}");
        }
        assert_eq!(Template::parse("{/etc/passwd}", &env), Err(TemplateError::BadPointer(0)));
        assert_eq!(Template::parse("a{/arguments", &env), Err(TemplateError::Unclosed(1)));
        assert_eq!(Template::parse("{{literal}}", &env).unwrap().render(&call).unwrap(), "{literal}");
    }

    /// Issue 22: the call fills the holes, the rule keeps its meaning.
    #[test]
    fn url_holes_cannot_steer_the_request() {
        let url = |src: &str| UrlTemplate::parse(src, &env);
        let t = url("http://127.0.0.1:9000/api/tickets/{/result/id}?by={/arguments/who}").unwrap();
        let call = |id: &str, who: &str| json!({"arguments": {"who": who}, "result": {"id": id}});
        assert_eq!(t.render(&call("r-1", "me")).unwrap(), "http://127.0.0.1:9000/api/tickets/r-1?by=me");
        // A traversal, a query and a fragment from the result stay one path segment.
        assert_eq!(
            t.render(&call("../../admin/delete?all=1#", "me")).unwrap(),
            "http://127.0.0.1:9000/api/tickets/..%2F..%2Fadmin%2Fdelete%3Fall%3D1%23?by=me"
        );
        // `&`, `=`, `+` and `#` stay in the query value.
        assert_eq!(t.render(&call("r", "a&admin=1+x#f")).unwrap(), "http://127.0.0.1:9000/api/tickets/r?by=a%26admin%3D1%2Bx%23f");
        for bad in [".", "..", ""] {
            assert!(matches!(t.render(&call(bad, "me")), Err(TemplateError::Refused(_))), "{bad:?}");
        }
        // Holes in the scheme, the authority (right after it, or in the port) or the fragment
        // are refused when the rules load.
        for src in [
            "{/result/u}",
            "http://{/result/host}/x",
            "http://host{/result/x}",
            "http://host:{/result/port}/x",
            "http://h/x#{/result/f}",
            "http://user@h/{/result/x}",
        ] {
            assert!(matches!(url(src), Err(TemplateError::Unsafe(_))), "{src}");
        }
        // A rule without holes is its own origin.
        assert_eq!(url("https://h.example/x").unwrap().render(&json!({})).unwrap(), "https://h.example/x");
    }

    #[test]
    fn same_compares_values_and_text() {
        assert!(same(&json!(42), &json!("42")));
        assert!(same(&json!({"a": 1}), &json!({"a": 1})));
        assert!(!same(&json!(42), &json!(43)));
        assert!(!same(&json!(true), &json!(1)));
    }
}
