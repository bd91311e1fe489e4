//! Long calls (SPEC section 5): progress evidence and two clocks.
//!
//! Progress is valid only if its token was supplied by the request, its values strictly increase,
//! and it stops at the terminal response. A repeat without increase, a token the request did not
//! supply, or progress after the response is inconsistent evidence: flagged, and it extends
//! nothing. Two clocks: an inactivity window that valid progress resets, and an absolute deadline
//! from the request's start that nothing resets.

use std::time::Duration;

use serde::Serialize;

pub use crate::verdict::{ProgressFindings, ProgressIssue};

use crate::evidence::call::CallEvidence;

/// The two clocks of a tool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Clocks {
    #[serde(with = "humantime_serde")]
    pub inactivity: Duration,
    #[serde(with = "humantime_serde")]
    pub deadline: Duration,
}

impl Default for Clocks {
    fn default() -> Self {
        Clocks { inactivity: Duration::from_secs(30), deadline: Duration::from_secs(600) }
    }
}

/// Clocks per tool, with a default; and the clocks of calls that wait (for input, or on a task).
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProgressPolicy {
    #[serde(default)]
    pub default: Clocks,
    #[serde(default)]
    pub tools: std::collections::BTreeMap<String, Clocks>,
    /// A call waiting for input (`input_required`): inactivity since the server asked, and an
    /// absolute deadline from the call's start. A person may take a while: longer than progress.
    #[serde(default = "default_waiting")]
    pub waiting: Clocks,
    /// A task: how many poll intervals may pass without an answer before it is silent (never
    /// less than one second), and the absolute deadline from its creation when its own TTL is
    /// longer (or absent).
    #[serde(default)]
    pub tasks: TaskClocks,
}

impl Default for ProgressPolicy {
    fn default() -> Self {
        ProgressPolicy { default: Clocks::default(), tools: Default::default(), waiting: default_waiting(), tasks: TaskClocks::default() }
    }
}

fn default_waiting() -> Clocks {
    Clocks { inactivity: Duration::from_secs(300), deadline: Duration::from_secs(3600) }
}

/// See [`ProgressPolicy::tasks`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskClocks {
    #[serde(default = "default_poll_multiple")]
    pub inactivity_polls: u32,
    #[serde(default = "default_task_deadline", with = "humantime_serde")]
    pub deadline: Duration,
}

fn default_poll_multiple() -> u32 {
    3
}
fn default_task_deadline() -> Duration {
    Duration::from_secs(3600)
}

impl Default for TaskClocks {
    fn default() -> Self {
        TaskClocks { inactivity_polls: default_poll_multiple(), deadline: default_task_deadline() }
    }
}

/// Where a call that the server answered but that has not finished stands against its clocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Standing {
    /// A task answering `working` within its poll interval.
    Working,
    /// Waiting for input within its own clocks.
    Waiting,
    /// A clock ran out: the reason the execution layer reports.
    Expired(&'static str),
}

/// The standing of an awaiting call at `now_ns` (`None`: the call is not awaiting anything).
///
/// - Waiting for input: inactivity from the latest `input_required` answer, deadline from the
///   call's start (`waiting`).
/// - A working task: inactivity from the server's latest answer about it, `inactivity_polls`
///   poll intervals (at least 1 s); absolute: its TTL from its creation or the configured
///   deadline, whichever comes first. Nothing resets the absolute clock.
pub(crate) fn standing(c: &CallEvidence, policy: &ProgressPolicy, now_ns: u64) -> Option<Standing> {
    use crate::evidence::call::Awaiting;
    let ns = |d: Duration| d.as_nanos() as u64;
    match c.awaiting()? {
        Awaiting::Input => {
            let since = c.task.as_ref().map(|t| t.status_at_ns).or(c.last_interim_ns).unwrap_or(c.start_ns);
            Some(if now_ns > c.start_ns.saturating_add(ns(policy.waiting.deadline)) {
                Standing::Expired("wait_deadline_exceeded")
            } else if now_ns > since.saturating_add(ns(policy.waiting.inactivity)) {
                Standing::Expired("wait_inactivity_exceeded")
            } else {
                Standing::Waiting
            })
        }
        Awaiting::Task => {
            let t = c.task.as_ref()?;
            let created = t.created_ns.unwrap_or(c.start_ns);
            let ttl_end = t.ttl_ms.filter(|t| *t > 0).map(|ms| created.saturating_add(ms.saturating_mul(1_000_000)));
            let deadline_end = created.saturating_add(ns(policy.tasks.deadline));
            let quiet = t
                .poll_interval_ms
                .map_or(Duration::from_secs(30), |ms| {
                    Duration::from_millis(ms.saturating_mul(u64::from(policy.tasks.inactivity_polls.max(1))))
                })
                .max(Duration::from_secs(1));
            Some(if ttl_end.is_some_and(|e| now_ns > e) {
                Standing::Expired("task_ttl_exceeded")
            } else if now_ns > deadline_end {
                Standing::Expired("deadline_exceeded")
            } else if now_ns > t.last_answer_ns.saturating_add(ns(quiet)) {
                Standing::Expired("task_inactivity_exceeded")
            } else {
                Standing::Working
            })
        }
    }
}

impl ProgressPolicy {
    pub fn clocks(&self, tool: Option<&str>) -> Clocks {
        tool.and_then(|t| self.tools.get(t)).copied().unwrap_or(self.default)
    }
}

/// Where an in-flight call stands against its clocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum InFlight {
    /// The response arrived (or an error did): not in flight.
    Completed,
    /// In flight, valid progress, both clocks hold.
    Working,
    /// In flight without valid progress: nothing justifies `working`.
    NoValidProgress,
    InactivityExceeded,
    DeadlineExceeded,
}

/// Check every progress notification of a call, in time order.
pub(crate) fn check(c: &CallEvidence) -> ProgressFindings {
    let mut f = ProgressFindings::default();
    let mut marks: Vec<_> = c.progress.iter().collect();
    marks.sort_by_key(|m| m.at_ns);
    let mut prev: Option<f64> = None;
    for m in marks {
        let issue = match (&c.progress_token, c.response_end_ns) {
            (None, _) => Some(ProgressIssue::TokenNotSupplied),
            (Some(t), _) if *t != m.token => Some(ProgressIssue::WrongToken),
            (_, Some(end)) if m.at_ns > end => Some(ProgressIssue::AfterCompletion),
            _ if prev.is_some_and(|p| m.value <= p) => Some(ProgressIssue::NoIncrease),
            _ => None,
        };
        match issue {
            Some(i) => {
                if !f.issues.contains(&i) {
                    f.issues.push(i);
                }
            }
            None => {
                f.valid_updates += 1;
                prev = Some(m.value);
                f.last_valid_ns = Some(m.at_ns);
                f.last_value = Some(m.value);
                f.total = m.total.or(f.total);
            }
        }
    }
    f
}

/// The call's standing at `now_ns` against its clocks.
pub(crate) fn in_flight(c: &CallEvidence, f: &ProgressFindings, clocks: Clocks, now_ns: u64) -> InFlight {
    let done = c.response_end_ns.is_some()
        || c.response_seen
        || c.jsonrpc_error.is_some()
        || c.transport.is_some_and(|t| t != crate::evidence::TransportOutcome::Ok);
    if done {
        return InFlight::Completed;
    }
    if now_ns > c.start_ns.saturating_add(clocks.deadline.as_nanos() as u64) {
        return InFlight::DeadlineExceeded;
    }
    let Some(last) = f.last_valid_ns else { return InFlight::NoValidProgress };
    if now_ns > last.saturating_add(clocks.inactivity.as_nanos() as u64) {
        return InFlight::InactivityExceeded;
    }
    InFlight::Working
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evidence::{Method, ProgressMark};

    const S: u64 = 1_000_000_000;

    fn call(token: Option<&str>, marks: &[(&str, f64, u64)]) -> CallEvidence {
        CallEvidence {
            method: Some(Method::ToolsCall),
            start_ns: 100 * S,
            progress_token: token.map(Into::into),
            progress: marks
                .iter()
                .map(|(t, v, at)| ProgressMark { token: (*t).into(), value: *v, total: Some(100.0), at_ns: *at * S })
                .collect(),
            ..Default::default()
        }
    }

    const CLOCKS: Clocks = Clocks { inactivity: Duration::from_secs(30), deadline: Duration::from_secs(300) };

    #[test]
    fn valid_monotonic_progress_keeps_working_past_the_inactivity_window_but_not_past_the_deadline() {
        // Updates every 20 s: each resets the 30 s inactivity window.
        let marks: Vec<(&str, f64, u64)> = (1..=12).map(|k| ("tok", k as f64 * 5.0, 100 + 20 * k)).collect();
        let c = call(Some("tok"), &marks);
        let f = check(&c);
        assert_eq!(f.valid_updates, 12);
        assert!(f.issues.is_empty());
        assert_eq!(in_flight(&c, &f, CLOCKS, 345 * S), InFlight::Working, "245 s in: far past 30 s of inactivity since the start");
        assert_eq!(in_flight(&c, &f, CLOCKS, 401 * S), InFlight::DeadlineExceeded, "the absolute deadline is never reset");
        assert_eq!(in_flight(&c, &f, CLOCKS, 380 * S), InFlight::InactivityExceeded, "40 s after the last update");
    }

    #[test]
    fn inconsistent_progress_is_flagged_and_extends_nothing() {
        // A repeated value.
        let c = call(Some("tok"), &[("tok", 10.0, 110), ("tok", 10.0, 130)]);
        let f = check(&c);
        assert_eq!((f.valid_updates, f.issues.clone()), (1, vec![ProgressIssue::NoIncrease]));
        assert_eq!(f.last_valid_ns, Some(110 * S), "the repeat did not reset the inactivity clock");
        assert_eq!(in_flight(&c, &f, CLOCKS, 145 * S), InFlight::InactivityExceeded);
        // A token from another request.
        let c = call(Some("tok"), &[("other", 10.0, 110)]);
        let f = check(&c);
        assert_eq!(f.issues, vec![ProgressIssue::WrongToken]);
        assert_eq!(in_flight(&c, &f, CLOCKS, 115 * S), InFlight::NoValidProgress);
        // Progress after the response.
        let mut c = call(Some("tok"), &[("tok", 10.0, 110), ("tok", 20.0, 150)]);
        c.response_end_ns = Some(140 * S);
        c.response_seen = true;
        let f = check(&c);
        assert_eq!((f.valid_updates, f.issues.clone()), (1, vec![ProgressIssue::AfterCompletion]));
        assert_eq!(in_flight(&c, &f, CLOCKS, 145 * S), InFlight::Completed);
        // No token supplied by the request: nothing can be validated.
        let c = call(None, &[("tok", 10.0, 110)]);
        assert_eq!(check(&c).issues, vec![ProgressIssue::TokenNotSupplied]);
    }
}
