//! Contract drift: what changed between a pinned tool definition and the one in use, in words an
//! integrator acts on (SPEC section 4). Works on projections (see `digest`), so a change that does
//! not change the digest (icons, `_meta`, key order) is never reported.

use std::collections::BTreeSet;

pub use crate::verdict::ContractChange;
use serde_json::{Map, Value};

fn props(schema: Option<&Value>) -> Map<String, Value> {
    schema.and_then(|s| s.get("properties")).and_then(Value::as_object).cloned().unwrap_or_default()
}

fn required(schema: Option<&Value>) -> BTreeSet<String> {
    schema
        .and_then(|s| s.get("required"))
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

fn type_name(v: &Value) -> String {
    match v.get("type") {
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => "unspecified".into(),
    }
}

fn enum_values(v: &Value) -> Option<BTreeSet<String>> {
    v.get("enum").and_then(Value::as_array).map(|a| a.iter().map(|x| x.to_string()).collect())
}

fn without(v: &Value, keys: &[&str]) -> Value {
    match v {
        Value::Object(m) => {
            Value::Object(m.iter().filter(|(k, _)| !keys.contains(&k.as_str())).map(|(k, v)| (k.clone(), v.clone())).collect())
        }
        other => other.clone(),
    }
}

/// Every change from `old` to `new` (both tool definitions or projections).
pub(crate) fn contract_diff(old: &Value, new: &Value) -> Vec<ContractChange> {
    use ContractChange::*;
    let mut out = Vec::new();
    if old.get("title") != new.get("title") {
        out.push(TitleChanged);
    }
    if old.get("description") != new.get("description") {
        out.push(DescriptionChanged { parameter: None });
    }
    let (os, ns) = (old.get("inputSchema"), new.get("inputSchema"));
    let (op, np) = (props(os), props(ns));
    let removed: Vec<&String> = op.keys().filter(|k| !np.contains_key(*k)).collect();
    let added: Vec<&String> = np.keys().filter(|k| !op.contains_key(*k)).collect();
    let mut renamed_from = BTreeSet::new();
    let mut renamed_to = BTreeSet::new();
    // A rename: exactly the same schema under a new name.
    for r in &removed {
        if let Some(a) = added.iter().find(|a| !renamed_to.contains(**a) && op[r.as_str()] == np[a.as_str()]) {
            out.push(ParameterRenamed { from: (*r).clone(), to: (*a).clone() });
            renamed_from.insert((*r).clone());
            renamed_to.insert((*a).clone());
        }
    }
    out.extend(removed.iter().filter(|r| !renamed_from.contains(**r)).map(|r| ParameterRemoved { parameter: (*r).clone() }));
    out.extend(added.iter().filter(|a| !renamed_to.contains(**a)).map(|a| ParameterAdded { parameter: (*a).clone() }));
    for (name, o) in &op {
        let Some(n) = np.get(name) else { continue };
        if o == n {
            continue;
        }
        let mut named = false;
        if type_name(o) != type_name(n) {
            out.push(TypeChanged { parameter: name.clone(), from: type_name(o), to: type_name(n) });
            named = true;
        }
        match (enum_values(o), enum_values(n)) {
            (Some(a), Some(b)) => {
                let gone: Vec<String> = a.difference(&b).cloned().collect();
                let new_vals: Vec<String> = b.difference(&a).cloned().collect();
                if !gone.is_empty() {
                    out.push(EnumNarrowed { parameter: name.clone(), removed: gone });
                    named = true;
                }
                if !new_vals.is_empty() {
                    out.push(EnumWidened { parameter: name.clone(), added: new_vals });
                    named = true;
                }
            }
            (None, Some(b)) => {
                out.push(EnumNarrowed { parameter: name.clone(), removed: vec![format!("any value outside {b:?}")] });
                named = true;
            }
            (Some(a), None) => {
                out.push(EnumWidened { parameter: name.clone(), added: vec![format!("any value outside {a:?}")] });
                named = true;
            }
            (None, None) => {}
        }
        if o.get("description") != n.get("description") {
            out.push(DescriptionChanged { parameter: Some(name.clone()) });
            named = true;
        }
        if !named || without(o, &["type", "enum", "description"]) != without(n, &["type", "enum", "description"]) {
            out.push(ParameterSchemaChanged { parameter: name.clone() });
        }
    }
    let (or, nr) = (required(os), required(ns));
    if or != nr {
        // A pure rename carries its required flag along; report only real changes.
        let now: Vec<String> = nr.difference(&or).filter(|p| !renamed_to.contains(*p)).cloned().collect();
        let no_longer: Vec<String> = or.difference(&nr).filter(|p| !renamed_from.contains(*p)).cloned().collect();
        if !now.is_empty() || !no_longer.is_empty() {
            out.push(RequiredChanged { now_required: now, no_longer_required: no_longer });
        }
    }
    let (oa, na) = (old.get("annotations").and_then(Value::as_object), new.get("annotations").and_then(Value::as_object));
    let keys: BTreeSet<&String> = oa.iter().flat_map(|m| m.keys()).chain(na.iter().flat_map(|m| m.keys())).collect();
    for k in keys {
        let a = oa.and_then(|m| m.get(k));
        let b = na.and_then(|m| m.get(k));
        if a != b {
            let show = |v: Option<&Value>| v.map_or("unset".to_string(), |v| v.to_string());
            out.push(AnnotationFlipped { annotation: k.clone(), from: show(a), to: show(b) });
        }
    }
    if old.get("outputSchema") != new.get("outputSchema") {
        out.push(OutputSchemaChanged);
    }
    if old.get("execution") != new.get("execution") {
        out.push(ExecutionChanged);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::digest::tool_digest;
    use serde_json::json;
    use ContractChange::*;

    fn search(props: Value, required: Value) -> Value {
        json!({"name":"search","description":"Search tickets","inputSchema":{"type":"object","properties":props,"required":required},"annotations":{"readOnlyHint":true}})
    }

    #[test]
    fn drift_table() {
        let base = search(
            json!({"query":{"type":"string"},"limit":{"type":"integer","description":"max results"},"sort":{"type":"string","enum":["asc","desc","relevance"]}}),
            json!(["query"]),
        );
        let cases: Vec<(&str, Value, Vec<ContractChange>)> = vec![
            (
                "rename query -> q",
                search(
                    json!({"q":{"type":"string"},"limit":{"type":"integer","description":"max results"},"sort":{"type":"string","enum":["asc","desc","relevance"]}}),
                    json!(["q"]),
                ),
                vec![ParameterRenamed { from: "query".into(), to: "q".into() }],
            ),
            (
                "meaning change on the same integer",
                search(
                    json!({"query":{"type":"string"},"limit":{"type":"integer","description":"page index"},"sort":{"type":"string","enum":["asc","desc","relevance"]}}),
                    json!(["query"]),
                ),
                vec![DescriptionChanged { parameter: Some("limit".into()) }],
            ),
            (
                "enum narrowed",
                search(
                    json!({"query":{"type":"string"},"limit":{"type":"integer","description":"max results"},"sort":{"type":"string","enum":["asc","desc"]}}),
                    json!(["query"]),
                ),
                vec![EnumNarrowed { parameter: "sort".into(), removed: vec!["\"relevance\"".into()] }],
            ),
            (
                "type changed",
                search(
                    json!({"query":{"type":"string"},"limit":{"type":"string","description":"max results"},"sort":{"type":"string","enum":["asc","desc","relevance"]}}),
                    json!(["query"]),
                ),
                vec![TypeChanged { parameter: "limit".into(), from: "integer".into(), to: "string".into() }],
            ),
            (
                "required added",
                search(
                    json!({"query":{"type":"string"},"limit":{"type":"integer","description":"max results"},"sort":{"type":"string","enum":["asc","desc","relevance"]}}),
                    json!(["query", "limit"]),
                ),
                vec![RequiredChanged { now_required: vec!["limit".into()], no_longer_required: vec![] }],
            ),
            (
                "parameter removed",
                search(json!({"query":{"type":"string"},"sort":{"type":"string","enum":["asc","desc","relevance"]}}), json!(["query"])),
                vec![ParameterRemoved { parameter: "limit".into() }],
            ),
        ];
        for (what, new, want) in cases {
            assert_eq!(contract_diff(&base, &new), want, "{what}");
            assert_ne!(tool_digest(&base).unwrap().digest, tool_digest(&new).unwrap().digest, "{what}: digest must change");
        }
    }

    #[test]
    fn annotation_flip_and_tool_level_changes_are_named() {
        let a = json!({"name":"delete","description":"Delete","annotations":{"destructiveHint":false}});
        let b =
            json!({"name":"delete","description":"Delete forever","annotations":{"destructiveHint":true},"outputSchema":{"type":"object"}});
        let d = contract_diff(&a, &b);
        assert!(d.contains(&AnnotationFlipped { annotation: "destructiveHint".into(), from: "false".into(), to: "true".into() }));
        assert!(d.contains(&DescriptionChanged { parameter: None }));
        assert!(d.contains(&OutputSchemaChanged));
    }

    #[test]
    fn cosmetic_icon_change_is_no_drift() {
        let a = json!({"name":"x","description":"d","icons":[{"src":"a.png"}]});
        let b = json!({"name":"x","description":"d","icons":[{"src":"b.png","sizes":["48x48"]}]});
        let pa = crate::classify::digest::project(&a).unwrap();
        let pb = crate::classify::digest::project(&b).unwrap();
        assert!(contract_diff(&pa, &pb).is_empty());
        assert_eq!(tool_digest(&a).unwrap(), tool_digest(&b).unwrap());
    }
}
