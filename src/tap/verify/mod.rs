//! Outcome verifiers in the tap (issue 9): checks chosen before the call, run where the evidence
//! is, reported without leaking what they checked.
//!
//! A rule ([`rules`]) names a tool (exact or glob, optionally a server) and one check ([`check`]):
//! `http`, `file`, `command` or `sql`, with values taken from the call through JSON pointers
//! ([`template`]). After a `tools/call` response has been forwarded — never before, so the
//! client's bytes and timing do not change — the observer hands the call to the [`VerifierPool`]:
//! a bounded queue and a concurrency limit. It waits `delay`, tries up to `attempts` times with
//! backoff (a `missing` may only be not visible yet; an error may be transient), and emits one
//! INTERNAL span per finding in the call's trace, under the call's span:
//!
//! - `mcp_health.outcome.result` (`confirmed`, `missing`, `failed`), `.method` (`http_status`,
//!   `file_digest`, `test_result`, `row_version`), `.checked_at` (the last attempt's start,
//!   after the call started), `.request_id`, `.verifier` (the rule's name);
//! - or, when the check could not decide, no result and `mcp_health.outcome.error` (the error
//!   class): the call stays `unverified` with reason `verifier_error`, never green.
//!
//! A lost response at a possible side-effect boundary (`timeout` or `connection_reset` after the
//! request was sent) runs the same rule (reconciliation, SPEC §2): `confirmed` → `healthy`,
//! `missing` → `transport_failed` with `retry_safe`, `failed` → `false_success`. A rule that
//! reads the result cannot check a call that has none: `pointer_unresolved`.
//!
//! Never emitted: argument or result values, URLs, paths, queries, command lines, response
//! bodies, credentials. Only the rule's name (validated by the MCP tool-name rule) and fixed
//! vocabularies leave.

pub(crate) mod check;
pub(crate) mod client;
pub(crate) mod rules;
pub(crate) mod template;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::{span::SpanKind, Span};
use serde_json::Value;
use tokio::sync::{mpsc, Semaphore};

use super::export::SpanSink;
use super::reader::{Budget, Document, Kind, Node, Unread};
use super::{new_span_id, now_ns};
use crate::evidence::attributes as a;
pub use check::{Finding, VerifyError};
pub use rules::RuleSet;
use std::borrow::Cow;

use crate::evidence::receipt::SigningKey;

/// One call to verify.
#[derive(Clone, Debug)]
pub struct VerifyJob {
    /// Index of the rule in the [`RuleSet`].
    pub rule: usize,
    /// `{"arguments": …, "result": …}` (`result` is null for a lost response).
    pub call: Value,
    pub trace_id: [u8; 16],
    /// The call's span: the finding's parent.
    pub call_span_id: [u8; 8],
    /// The request id as the call's span writes it.
    pub request_id: Box<str>,
    /// The tool as the call's span writes it (covered by the finding's signature).
    pub tool: Box<str>,
    pub call_start_ns: u64,
}

/// Most bytes (an estimate of the heap its `Value`s take, see `reader::Budget`) of call values one
/// verifier job keeps; a value past what is left is not kept (counted as `Oversize::Value`), and
/// a check that needs it reports `pointer_unresolved` (no finding, counted as a verifier error).
pub(crate) const MAX_JOB_BYTES: usize = 64 * 1024;

/// Longest first text content read as the `structuredContent` of a result that has none (it is
/// decoded to be read): past it the rule's values from it are not kept.
pub(crate) const MAX_TEXT_JSON: usize = 1 << 20;

/// Which part of a call a pointer reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CallPart {
    /// `/arguments…`: the request's `params.arguments`.
    Arguments,
    /// `/result…`: the `CallToolResult`.
    Result,
}

impl CallPart {
    fn prefix(self) -> &'static str {
        match self {
            CallPart::Arguments => "/arguments",
            CallPart::Result => "/result",
        }
    }
}

/// What a verifier job keeps of a call: only the values its rule's holes read, at their pointers
/// (`{"arguments": {…}, "result": {…}}` with just those paths), read from the message's bytes
/// (`tap::reader`) within [`MAX_JOB_BYTES`], never the whole result: a 14 MB result whose rule
/// reads one id is kept as that id, and a value past the budget is refused before it is built.
#[derive(Clone, Debug)]
pub(crate) struct Kept {
    /// Index of the rule in the [`RuleSet`].
    pub(crate) rule: usize,
    call: Value,
    budget: Budget,
}

impl Kept {
    pub(crate) fn new(rule: usize) -> Self {
        Kept { rule, call: Value::Object(Default::default()), budget: Budget::new(MAX_JOB_BYTES) }
    }

    /// Keep the values at `pointers` that read `part` of the call, from `value` (the arguments,
    /// or the `CallToolResult`: its `structuredContent` is read from its first text content when
    /// the server gave none, as the rule's documentation says). Returns why values that are there
    /// could not be kept; a value not there is simply missing.
    pub(crate) fn keep(&mut self, pointers: &[String], part: CallPart, value: Node<'_>) -> Vec<Unread> {
        let mut unread = Vec::new();
        let structured_missing = part == CallPart::Result && value.get("structuredContent").is_none_or(|n| n.is_null());
        let mut text: Option<Result<String, Unread>> = None;
        for ptr in pointers {
            let Some(rest) = ptr.strip_prefix(part.prefix()).filter(|r| r.is_empty() || r.starts_with('/')) else { continue };
            let inner = rest.strip_prefix("/structuredContent").filter(|r| r.is_empty() || r.starts_with('/'));
            let before = self.budget;
            let found = match inner {
                Some(inner) if structured_missing => match text.get_or_insert_with(|| first_text(value)) {
                    Ok(t) => match Document::parse(t.as_bytes()) {
                        Ok(doc) => doc.root().pointer(inner).map(|n| n.to_value(&mut self.budget)),
                        Err(_) => None, // no JSON: no structuredContent
                    },
                    Err(e) => Some(Err(*e)),
                },
                _ => value.pointer(rest).map(|n| n.to_value(&mut self.budget)),
            };
            match found {
                Some(Ok(v)) => insert_at(&mut self.call, ptr, v),
                Some(Err(e)) => {
                    // What did not fit costs nothing: the values after it may still fit.
                    self.budget = before;
                    unread.push(e);
                }
                None => {}
            }
        }
        unread
    }

    /// `{"arguments": …, "result": …}` with the values kept.
    pub(crate) fn into_call(self) -> Value {
        self.call
    }
}

/// The text of the first text content of a `CallToolResult`, decoded when it is no longer than
/// [`MAX_TEXT_JSON`] (`Err(Unread::Budget)` past it; `Err(Unread::Syntax)` when there is none).
fn first_text(result: Node<'_>) -> Result<String, Unread> {
    let text = result
        .get("content")
        .into_iter()
        .flat_map(|c| c.elements())
        .find(|c| c.get("type").and_then(|t| t.as_str()).as_deref() == Some("text"))
        .and_then(|c| c.get("text"))
        .filter(|t| t.kind() == Kind::String)
        .ok_or(Unread::Syntax)?;
    if text.bytes().len() > MAX_TEXT_JSON + 2 {
        return Err(Unread::Budget);
    }
    text.as_str().map(Cow::into_owned).ok_or(Unread::Syntax)
}

/// Put `v` at `ptr` in `root`, making objects on the way (an array index becomes an object key,
/// which a JSON pointer reads the same).
fn insert_at(root: &mut Value, ptr: &str, v: Value) {
    let tokens: Vec<String> = ptr.split('/').skip(1).map(|t| t.replace("~1", "/").replace("~0", "~")).collect();
    let mut at = root;
    for (i, t) in tokens.iter().enumerate() {
        if !at.is_object() {
            *at = Value::Object(Default::default());
        }
        let Value::Object(map) = at else { return };
        if i + 1 == tokens.len() {
            map.insert(t.clone(), v);
            return;
        }
        at = map.entry(t.clone()).or_insert_with(|| Value::Object(Default::default()));
    }
}

/// Counters of the verifier pool (the tap's exit summary and the tests; the service counts the
/// same from the spans it receives: `mcp_health.verifier.*`).
#[derive(Debug, Default)]
pub struct VerifierStats {
    pub submitted: AtomicU64,
    pub confirmed: AtomicU64,
    pub missing: AtomicU64,
    pub failed: AtomicU64,
    pub errors: AtomicU64,
    pub queue_full: AtomicU64,
}

impl VerifierStats {
    pub fn get(&self, c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
    fn count(&self, r: &Result<Finding, VerifyError>) {
        let c = match r {
            Ok(Finding::Confirmed) => &self.confirmed,
            Ok(Finding::Missing) => &self.missing,
            Ok(Finding::Failed) => &self.failed,
            Err(VerifyError::QueueFull) => &self.queue_full,
            Err(_) => &self.errors,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// Where the observer hands calls to verify. Never blocks: a full queue is counted and reported
/// as a `queue_full` verifier error on the call.
#[derive(Clone)]
pub struct VerifierPool {
    rules: Arc<RuleSet>,
    tx: mpsc::Sender<VerifyJob>,
    sink: SpanSink,
    signer: Option<Arc<SigningKey>>,
    pub stats: Arc<VerifierStats>,
}

impl std::fmt::Debug for VerifierPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerifierPool").field("rules", &self.rules.rules.len()).finish_non_exhaustive()
    }
}

impl VerifierPool {
    /// Start the pool on its own thread, with its own single-threaded runtime, at a lower
    /// scheduling priority (nice +10): checks must never take CPU from the pumps that carry the
    /// client's bytes (`cargo bench --bench tap_latency`). The [`VerifierRunner`] waits for the
    /// checks still running once every pool handle is dropped.
    pub fn spawn(rules: Arc<RuleSet>, sink: SpanSink, signer: Option<Arc<SigningKey>>) -> (Self, VerifierRunner) {
        let (tx, rx) = mpsc::channel(rules.limits.queue_size.max(1));
        let stats = Arc::new(VerifierStats::default());
        let pool = VerifierPool { rules: rules.clone(), tx, sink: sink.clone(), signer: signer.clone(), stats: stats.clone() };
        let (done_tx, done) = tokio::sync::oneshot::channel();
        let st = stats.clone();
        let started = std::thread::Builder::new().name("tap-verifiers".into()).spawn(move || {
            lower_priority();
            match tokio::runtime::Builder::new_current_thread().enable_all().thread_name("tap-verifiers").build() {
                Ok(rt) => rt.block_on(dispatch(rx, rules, sink, st, signer)),
                Err(e) => eprintln!("mcp-health tap: cannot start the verifier runtime ({e}); calls stay unverified"),
            }
            let _ = done_tx.send(());
        });
        if let Err(e) = started {
            eprintln!("mcp-health tap: cannot start the verifier thread ({e}); calls stay unverified");
        }
        (pool, VerifierRunner { done, stats })
    }

    pub fn rules(&self) -> &Arc<RuleSet> {
        &self.rules
    }

    /// Queue a call for verification.
    pub fn submit(&self, job: VerifyJob) {
        self.stats.submitted.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self.tx.try_send(job) {
            let job = match e {
                mpsc::error::TrySendError::Full(j) | mpsc::error::TrySendError::Closed(j) => j,
            };
            let r = Err(VerifyError::QueueFull);
            self.stats.count(&r);
            let at = now_ns();
            self.sink.emit(finding_span(&self.rules.rules[job.rule], &job, at, at, at, &r, self.signer.as_deref()));
        }
    }
}

/// The pool's thread.
pub struct VerifierRunner {
    done: tokio::sync::oneshot::Receiver<()>,
    pub stats: Arc<VerifierStats>,
}

/// nice +10 for the calling thread (Linux: the nice value is per thread, and threads it starts —
/// the runtime's blocking pool — inherit it). Best effort: on failure checks run at normal priority.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: gettid and setpriority take plain integers and touch no memory of ours.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        let _ = libc::setpriority(libc::PRIO_PROCESS, tid, 10);
    }
}

impl VerifierRunner {
    /// Wait until the queue is empty and every check has reported (all [`VerifierPool`] handles
    /// must be dropped first), at most `grace`; checks still running then are abandoned (their
    /// calls stay `unverified`).
    pub async fn finish(self, grace: Duration) -> Arc<VerifierStats> {
        let _ = tokio::time::timeout(grace, self.done).await;
        self.stats
    }
}

async fn dispatch(
    mut rx: mpsc::Receiver<VerifyJob>,
    rules: Arc<RuleSet>,
    sink: SpanSink,
    stats: Arc<VerifierStats>,
    signer: Option<Arc<SigningKey>>,
) {
    let concurrency = rules.limits.concurrency.max(1);
    let permits = Arc::new(Semaphore::new(concurrency));
    let http = client::http_client(Duration::from_secs(5));
    while let Some(job) = rx.recv().await {
        let Ok(permit) = permits.clone().acquire_owned().await else { break };
        let (rules, sink, stats, http, signer) = (rules.clone(), sink.clone(), stats.clone(), http.clone(), signer.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let Some(rule) = rules.rules.get(job.rule) else { return };
            let started = now_ns();
            let (checked_at, r) = verify(rule, &job.call, &http).await;
            stats.count(&r);
            tracing::debug!(verifier = %rule.name, result = r.map_or_else(|e| e.as_str(), |f| f.as_str()), "verifier ran");
            sink.emit(finding_span(rule, &job, started, now_ns(), checked_at, &r, signer.as_deref()));
        });
    }
    // Every check holds a permit until it reported.
    let _ = permits.acquire_many(concurrency as u32).await;
}

/// Run a rule: `delay`, then up to `attempts` tries with doubling backoff, stopping at the first
/// `confirmed` or `failed`. Returns when the last attempt started and what it found.
pub async fn verify(rule: &rules::Rule, call: &Value, http: &client::HttpClient) -> (u64, Result<Finding, VerifyError>) {
    tokio::time::sleep(rule.delay).await;
    let mut backoff = rule.backoff;
    let mut last = (now_ns(), Err(VerifyError::Other));
    for n in 0..rule.attempts {
        if n > 0 {
            tokio::time::sleep(backoff).await;
            backoff = backoff.saturating_mul(2).min(Duration::from_secs(60));
        }
        let at = now_ns();
        let r = check::run(&rule.check, call, http, rule.timeout).await;
        let done = match r {
            Ok(Finding::Confirmed | Finding::Failed) => true,
            // A template that cannot be filled will not be fillable on the next attempt.
            Err(VerifyError::PointerUnresolved | VerifyError::TemplateError) => true,
            _ => false,
        };
        last = (at, r);
        if done {
            break;
        }
    }
    last
}

fn kv(key: &str, v: any_value::Value) -> KeyValue {
    KeyValue { key: key.to_string(), value: Some(AnyValue { value: Some(v) }), ..Default::default() }
}

/// The span of one finding (or verifier error), in the call's trace under the call's span.
pub(crate) fn finding_span(
    rule: &rules::Rule,
    job: &VerifyJob,
    start_ns: u64,
    end_ns: u64,
    checked_at: u64,
    r: &Result<Finding, VerifyError>,
    signer: Option<&SigningKey>,
) -> Span {
    let s = |k: &str, v: &str| kv(k, any_value::Value::StringValue(v.to_string()));
    // After the call started, whatever the clocks say: a receipt checked before its call says
    // nothing about it.
    let checked_at = checked_at.max(job.call_start_ns);
    let mut attrs = vec![
        s(a::OUTCOME_VERIFIER, &rule.name),
        s(a::OUTCOME_METHOD, rule.check.method()),
        kv(a::OUTCOME_CHECKED_AT, any_value::Value::IntValue(checked_at as i64)),
        s(a::OUTCOME_REQUEST_ID, &job.request_id),
        s(a::OUTCOME_TOOL, &job.tool),
    ];
    let result = match r {
        Ok(f) => {
            attrs.push(s(a::OUTCOME_RESULT, f.as_str()));
            f.as_str()
        }
        Err(e) => {
            attrs.push(s(a::OUTCOME_ERROR, e.as_str()));
            crate::evidence::OutcomeResult::VerifierError.as_str()
        }
    };
    if let Some(key) = signer {
        let msg = crate::evidence::receipt::message(
            &job.trace_id,
            &job.call_span_id,
            &job.request_id,
            &job.tool,
            &rule.name,
            result,
            rule.check.method(),
            checked_at,
        );
        attrs.push(s(a::OUTCOME_KEY_ID, key.id()));
        attrs.push(s(a::OUTCOME_SIGNATURE, &key.sign(&msg)));
    }
    Span {
        trace_id: job.trace_id.to_vec(),
        span_id: new_span_id().to_vec(),
        parent_span_id: job.call_span_id.to_vec(),
        name: format!("mcp_health verify {}", rule.name),
        kind: SpanKind::Internal as i32,
        start_time_unix_nano: start_ns,
        end_time_unix_nano: end_ns.max(start_ns),
        attributes: attrs,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests;
