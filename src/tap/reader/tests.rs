//! The bounded reader: what it reads, what it skips, and that what it cannot read is never taken
//! for something it read.

use proptest::prelude::*;
use serde_json::{json, Value};

use super::*;

fn parse(s: &str) -> Result<Document<'_>, Unread> {
    Document::parse(s.as_bytes())
}

fn nested(depth: usize, inner: &str) -> String {
    format!("{}{inner}{}", "[".repeat(depth), "]".repeat(depth))
}

#[test]
fn json_is_checked_whole() {
    for ok in [
        "{}",
        "[]",
        " \t\r\n{ } ",
        "\"x\"",
        "0",
        "-0",
        "-0.5e+3",
        "12E-2",
        "true",
        "false",
        "null",
        r#"{"a" : [1, {"b": null, "c": [true, false, "é\u00e9\n\"\\\/"]}], "": {}}"#,
        "[[], {}, [[]], \"]\", \"}\", \"[\\\"\"]",
    ] {
        let d = parse(ok).unwrap_or_else(|e| panic!("{ok:?}: {e}"));
        assert!(d.whole(), "{ok:?}");
        assert_eq!(d.root().to_value(&mut Budget::new(1 << 20)).ok(), serde_json::from_str::<Value>(ok).ok(), "{ok:?}");
    }
    for bad in [
        "",
        "   ",
        "{",
        "}",
        "[1,]",
        "[,1]",
        "[1 2]",
        "{\"a\"}",
        "{\"a\":}",
        "{\"a\":1,}",
        "{\"a\":1 \"b\":2}",
        "{1:2}",
        "{'a':1}",
        "[}",
        "{]",
        "01",
        "1.",
        ".1",
        "-",
        "1e",
        "+1",
        "tru",
        "nul",
        "truex",
        "\"abc",
        "\"\\x\"",
        "\"\\u12\"",
        "\"a\tb\"",
        "1 2",
        "{} {}",
        "[\"a\"]]",
        "Content-Length: 12",
    ] {
        assert_eq!(parse(bad).err(), Some(Unread::Syntax), "{bad:?}");
    }
    assert_eq!(Document::parse(b"\"\xff\"").err(), Some(Unread::Syntax), "not UTF-8");
}

proptest! {
    /// Whatever the bytes, the reader and serde_json agree on whether they are JSON.
    #[test]
    fn agrees_with_serde_json_on_what_is_json(s in "[\\[\\]{}\":,0-9\\-+.eE tnrufals\\\\/u]{0,24}") {
        let ours = Document::parse(s.as_bytes()).is_ok();
        let theirs = serde_json::from_slice::<serde::de::IgnoredAny>(s.as_bytes()).is_ok();
        prop_assert_eq!(ours, theirs, "{:?}", s);
    }

    /// What it reads of JSON serde_json made is what serde_json reads.
    #[test]
    fn reads_what_serde_json_reads(v in arb_json()) {
        let text = v.to_string();
        let d = Document::parse(text.as_bytes()).unwrap();
        prop_assert_eq!(d.root().to_value(&mut Budget::new(1 << 20)).unwrap(), v);
    }
}

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        (-1e6f64..1e6).prop_map(|f| json!(f)),
        "[a-z\"\\\\\u{e9}\u{1F600}\n ]{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("[a-z\"]{0,4}", inner, 0..6).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Each field the observer reads, read right: members in one pass, the last of a key sent twice,
/// escaped keys, strings with escapes, numbers as `Value` reads them, pointers.
#[test]
fn fields_are_read_as_serde_json_reads_them() {
    let text = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"a\u002fb","\u0069d":"x","arguments":{"k":[10,{"~/":1}]}},
        "dup":1,"dup":2,"f":1.0,"e":1e3,"big":18446744073709551616,"t":true,"n":null}"#;
    let d = parse(text).unwrap();
    let m = d.root();
    let v: Value = serde_json::from_str(text).unwrap();
    let [method, id, params, missing] = m.pick(["method", "id", "params", "missing"]);
    assert_eq!(method.and_then(|x| x.as_str()).as_deref(), Some("tools/call"));
    assert_eq!(id.and_then(|x| x.as_i64()), Some(7));
    assert!(missing.is_none());
    let params = params.unwrap();
    assert_eq!(params.get("name").and_then(|x| x.as_str()).as_deref(), Some("a/b"), "an escaped string");
    assert_eq!(params.get("id").and_then(|x| x.as_str()).as_deref(), Some("x"), "an escaped key");
    assert_eq!(m.get("dup").and_then(|x| x.as_i64()), v["dup"].as_i64(), "the last of a key sent twice");
    for k in ["f", "e", "big"] {
        let n = m.get(k).unwrap();
        assert_eq!(n.as_i64(), v[k].as_i64(), "{k}");
        assert_eq!(n.as_f64(), v[k].as_f64(), "{k}");
    }
    assert_eq!(m.get("t").and_then(|x| x.as_bool()), Some(true));
    assert!(m.get("n").unwrap().is_null());
    assert_eq!(m.get("jsonrpc").and_then(|x| x.as_bool()), None, "a string is no bool");
    for ptr in
        ["", "/params/arguments/k/0", "/params/arguments/k/1/~0~1", "/params/arguments/k/01", "/params/arguments/k/2", "/nope", "/t/x"]
    {
        let ours = m.pointer(ptr).map(|n| n.to_value(&mut Budget::new(1 << 20)).unwrap());
        assert_eq!(ours.as_ref(), v.pointer(ptr), "{ptr}");
    }
    assert_eq!(m.get("params").unwrap().members().count(), 3);
    assert_eq!(m.pointer("/params/arguments/k").unwrap().elements().count(), 2);
    assert_eq!(m.get("method").unwrap().members().count(), 0, "a string has no members");
}

/// Issue 35: 7 million zeros are skipped, not built: the fields around them are read, and a value
/// past the budget is refused before it is built.
#[test]
fn a_shape_is_skipped_and_a_value_past_its_budget_is_refused() {
    let zeros = format!("{{\"structuredContent\":{{\"id\":\"1\",\"pad\":[{}0]}},\"isError\":false}}", "0,".repeat(7_000_000));
    let d = Document::parse(zeros.as_bytes()).unwrap();
    assert!(d.whole());
    let r = d.root();
    assert_eq!(r.pointer("/structuredContent/id").and_then(|n| n.as_str()).as_deref(), Some("1"));
    assert_eq!(r.get("isError").and_then(|n| n.as_bool()), Some(false));
    let mut budget = Budget::new(64 << 10);
    assert_eq!(r.pointer("/structuredContent/pad").unwrap().to_value(&mut budget), Err(Unread::Budget));
    let mut budget = Budget::new(64);
    assert_eq!(r.pointer("/structuredContent/id").unwrap().to_value(&mut budget), Ok(json!("1")));
    assert!(budget.left() < 64);
    let long = format!("\"{}\"", "x".repeat(1000));
    assert_eq!(parse(&long).unwrap().root().to_value(&mut Budget::new(999)), Err(Unread::Budget));
}

/// Issue 35: a million nested one-element arrays neither exhaust the stack nor memory; past
/// MAX_DEPTH nothing is read, and the document says it was not read whole.
#[test]
fn a_depth_bomb_is_skipped_unread_and_said_so() {
    let bomb = nested(1_000_000, "0");
    let text = format!("{{\"id\":\"1\",\"pad\":{bomb},\"isError\":true}}");
    let d = Document::parse(text.as_bytes()).unwrap();
    assert!(!d.whole(), "nesting past MAX_DEPTH is not read");
    let r = d.root();
    assert_eq!(r.get("id").and_then(|n| n.as_str()).as_deref(), Some("1"), "what is around it is read");
    assert_eq!(r.get("isError").and_then(|n| n.as_bool()), Some(true));
    let pad = r.get("pad").unwrap();
    assert!(!pad.is_whole() && !r.is_whole() && r.get("id").unwrap().is_whole());
    assert_eq!(pad.to_value(&mut Budget::new(usize::MAX)), Err(Unread::Depth));
    assert_eq!(pad.pointer(&"/0".repeat(MAX_DEPTH + 5)).map(|n| n.kind()), None, "no pointer goes where nothing was read");
    // One bracket short is no JSON at all.
    let cut = format!("{{\"pad\":{}{}}}", "[".repeat(1_000_000), "]".repeat(999_999));
    assert_eq!(Document::parse(cut.as_bytes()).err(), Some(Unread::Syntax));
    // Strings inside the skipped part are still strings: a bracket in one does not count.
    let quoted = format!("{}\"]]]\"{}", "[".repeat(MAX_DEPTH + 2), "]".repeat(MAX_DEPTH + 2));
    assert!(!Document::parse(quoted.as_bytes()).unwrap().whole());
    assert_eq!(Document::parse(format!("{quoted}]").as_bytes()).err(), Some(Unread::Syntax));
}

/// Read whole exactly where serde_json's recursion limit lets a `Value` be built.
#[test]
fn max_depth_is_serde_jsons_limit() {
    for depth in MAX_DEPTH - 3..MAX_DEPTH + 3 {
        for inner in ["0", "{\"a\":1}", ""] {
            let text = nested(depth, inner);
            let d = Document::parse(text.as_bytes()).unwrap();
            let serde = serde_json::from_str::<Value>(&text).is_ok();
            assert_eq!(d.whole(), serde, "depth {depth} around {inner:?}");
            assert_eq!(d.root().is_whole(), serde, "depth {depth} around {inner:?}");
            assert_eq!(d.root().to_value(&mut Budget::new(usize::MAX)).is_ok(), serde, "depth {depth} around {inner:?}");
        }
    }
}

#[test]
fn a_lone_surrogate_is_json_but_no_text() {
    let d = parse(r#"{"m":"\ud800"}"#).unwrap();
    let m = d.root().get("m").unwrap();
    assert_eq!(m.as_str(), None);
    assert_eq!(m.to_value(&mut Budget::new(1024)), Err(Unread::Syntax));
}

/// Numbers by the JSON grammar: a fraction and an exponent each need at least one digit.
#[test]
fn number_ends_follow_the_json_grammar() {
    let cases: &[(&str, Result<usize, Unread>)] = &[
        ("0", Ok(1)),
        ("01", Ok(1)),
        ("-12.5e+3,", Ok(8)),
        ("7E-0]", Ok(4)),
        ("3.25", Ok(4)),
        ("1.", Err(Unread::Syntax)),
        ("1.e5", Err(Unread::Syntax)),
        ("1e", Err(Unread::Syntax)),
        ("1e+", Err(Unread::Syntax)),
        ("-", Err(Unread::Syntax)),
        (".5", Err(Unread::Syntax)),
    ];
    for (text, want) in cases {
        assert_eq!(number_end(text.as_bytes(), 0), *want, "{text:?}");
    }
}
