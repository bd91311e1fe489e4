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

    /// A template from the process environment.
    pub fn parse_env(src: &str) -> Result<Self, TemplateError> {
        Template::parse(src, &|k| std::env::var(k).ok())
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
pub fn same(found: &Value, expected: &Value) -> bool {
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

    #[test]
    fn same_compares_values_and_text() {
        assert!(same(&json!(42), &json!("42")));
        assert!(same(&json!({"a": 1}), &json!({"a": 1})));
        assert!(!same(&json!(42), &json!(43)));
        assert!(!same(&json!(true), &json!(1)));
    }
}
