//! What a queued verifier job keeps of a call.

use super::*;
use serde_json::json;

fn keep(ptrs: &[&str], arguments: &Value, result: Option<&Value>) -> (Value, Vec<Unread>) {
    let ptrs: Vec<String> = ptrs.iter().map(|p| p.to_string()).collect();
    let mut kept = Kept::new(0);
    let (a, r) = (arguments.to_string(), result.map(Value::to_string));
    let mut unread = kept.keep(&ptrs, CallPart::Arguments, Document::parse(a.as_bytes()).unwrap().root());
    if let Some(r) = &r {
        unread.extend(kept.keep(&ptrs, CallPart::Result, Document::parse(r.as_bytes()).unwrap().root()));
    }
    (kept.into_call(), unread)
}

/// Issue 22: a job keeps only the values its rule reads, not the whole result: three 14 MB
/// results once took the tap from 24 MB to 1.33 GB while they waited in the queue.
#[test]
fn a_job_keeps_only_what_its_rule_reads() {
    let big = "x".repeat(2 << 20);
    let result = json!({"content": [{"type": "text", "text": big}], "structuredContent": {"id": "r-1", "blob": big}});
    let args = json!({"title": "t", "attachment": big});
    let (kept, unread) = keep(&["/arguments/title", "/result/structuredContent/id"], &args, Some(&result));
    assert_eq!(kept, json!({"arguments": {"title": "t"}, "result": {"structuredContent": {"id": "r-1"}}}));
    assert!(unread.is_empty());
    assert!(serde_json::to_vec(&kept).unwrap().len() < 200);
    // structuredContent from the first text content when the server gave none.
    let text_only = json!({"content": [{"type": "image", "data": "x"}, {"type": "text", "text": "{\"id\": \"r-2\", \"n\": [1, 2]}"}]});
    let (kept, _) = keep(&["/result/structuredContent/id", "/result/structuredContent/n/1"], &json!({}), Some(&text_only));
    assert_eq!(kept.pointer("/result/structuredContent/id"), Some(&json!("r-2")));
    assert_eq!(kept.pointer("/result/structuredContent/n/1"), Some(&json!(2)), "an index reads back through the pointer");
    // A value past the budget is not kept, and says so; the values that fit still are.
    let (kept, unread) = keep(&["/result/structuredContent/blob", "/result/structuredContent/id"], &json!({}), Some(&result));
    assert_eq!(kept, json!({"result": {"structuredContent": {"id": "r-1"}}}));
    assert_eq!(unread, [Unread::Budget]);
    // So is a text content too long to be read as JSON.
    let long_text =
        json!({"content": [{"type": "text", "text": format!("{{\"id\": \"r-3\", \"pad\": \"{}\"}}", "y".repeat(MAX_TEXT_JSON))}]});
    let (kept, unread) = keep(&["/result/structuredContent/id"], &json!({}), Some(&long_text));
    assert_eq!((kept, unread), (json!({}), vec![Unread::Budget]));
}

/// Issue 35: the budget counts what the tree costs, not the bytes: 64 KiB of zeros is a tree of
/// a megabyte, and is not built.
#[test]
fn the_budget_is_the_trees_not_the_texts() {
    let zeros = json!({"pad": vec![0; 20_000], "id": "1"});
    assert!(zeros.to_string().len() < MAX_JOB_BYTES);
    let (kept, unread) = keep(&["/arguments/id", "/arguments/pad"], &zeros, None);
    assert_eq!((kept, unread), (json!({"arguments": {"id": "1"}}), vec![Unread::Budget]));
}
