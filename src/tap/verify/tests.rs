//! What a queued verifier job keeps of a call.

use super::*;
use serde_json::json;

/// Issue 22: a job keeps only the values its rule reads, not the whole result: three 14 MB
/// results once took the tap from 24 MB to 1.33 GB while they waited in the queue.
#[test]
fn a_job_keeps_only_what_its_rule_reads() {
    let big = "x".repeat(2 << 20);
    let result = json!({"content": [{"type": "text", "text": big}], "structuredContent": {"id": "r-1", "blob": big}});
    let args = json!({"title": "t", "attachment": big});
    let ptrs = vec!["/arguments/title".to_string(), "/result/structuredContent/id".to_string()];
    let kept = project(&ptrs, &args, Some(&result));
    assert_eq!(kept, json!({"arguments": {"title": "t"}, "result": {"structuredContent": {"id": "r-1"}}}));
    assert!(serde_json::to_vec(&kept).unwrap().len() < 200);
    // structuredContent from the first text content when the server gave none.
    let text_only = json!({"content": [{"type": "text", "text": "{\"id\": \"r-2\", \"n\": [1, 2]}"}]});
    let ptrs = vec!["/result/structuredContent/id".to_string(), "/result/structuredContent/n/1".to_string()];
    let kept = project(&ptrs, &json!({}), Some(&text_only));
    assert_eq!(kept.pointer("/result/structuredContent/id"), Some(&json!("r-2")));
    assert_eq!(kept.pointer("/result/structuredContent/n/1"), Some(&json!(2)), "an index reads back through the pointer");
    // A rule that reads a huge value keeps nothing: its check cannot resolve, no finding.
    let kept = project(&["/result/structuredContent/blob".to_string()], &json!({}), Some(&result));
    assert_eq!(kept, Value::Null);
}
