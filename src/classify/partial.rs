//! Partial evidence (SPEC section 7, issue 12): a chain whose evidence may be split between this
//! engine and another one — another instance behind the collector's `load_balancing` exporter, or
//! this service before a restart — is judged on what it has, but never green.
//!
//! A chain is partial when
//! - it was decided early: at shutdown (`decided_by: shutdown`) or pushed out by the chain table's
//!   bounds (`evicted`): spans still on their way were never seen; or
//! - it was decided while the state store was unavailable (its last load, read or write
//!   failed): evidence and state that other instances keep there could not be seen; or
//! - its earliest call started before this engine began taking evidence (the engine time of its
//!   first ingest) less a grace of `decision_wait`: its first spans may have gone to an instance
//!   that is gone, or to this one before it restarted. A chain restored from the state store is
//!   not: its earlier evidence came back with it. This rule is on only where asked
//!   (`processors.mcp_health.partial_before_start`): a replay, and tests that post recorded
//!   fixtures with their original timestamps, have every span "before the start".
//!
//! A partial verdict is never `healthy`: it is capped at `unverified`, its confidence is `low`, and
//! it says why in `partial` (and in `reason` when the verdict is no failure: a failure's reason
//! is its error class, which groups it into its incident). A verdict that found a failure keeps
//! it: a failure seen is evidence, only the green is in doubt.

use crate::verdict::{Confidence, DecidedBy, HealthState, Partial, Verdict};

/// Since when this engine sees every span of a chain: its start, and the grace before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Since {
    /// Engine time (ns) of the first ingest.
    pub start_ns: u64,
    /// `decision_wait`: spans that started this much before the start are still whole.
    pub grace_ns: u64,
}

/// Whether a decided chain is partial, and why (the early decision first: it is certain; then
/// the store; then the start). `since` is `None` where the start rule is off; `restored` chains
/// came back from the store with their earlier evidence; `earliest_start_ns` is the earliest
/// call's start (0: unknown); `store_down`: the engine's state store is configured and its last
/// operation failed.
pub(crate) fn partial_reason(
    decided_by: DecidedBy,
    earliest_start_ns: Option<u64>,
    since: Option<Since>,
    restored: bool,
    store_down: bool,
) -> Option<Partial> {
    match decided_by {
        DecidedBy::Shutdown => return Some(Partial::DecidedAtShutdown),
        DecidedBy::Evicted => return Some(Partial::Evicted),
        // An interim report is not a verdict of the chain; a replay has every span there is.
        DecidedBy::InFlight | DecidedBy::Replay => return None,
        DecidedBy::Quiet | DecidedBy::MaxWait | DecidedBy::Clock => {}
    }
    if store_down {
        return Some(Partial::StoreUnavailable);
    }
    let (Some(since), Some(earliest)) = (since, earliest_start_ns.filter(|t| *t > 0)) else { return None };
    (!restored && earliest < since.start_ns.saturating_sub(since.grace_ns)).then_some(Partial::PredatesStart)
}

/// Mark a verdict partial: capped at `unverified`, low confidence, the reason said.
pub(crate) fn mark(v: &mut Verdict, why: Partial) {
    v.partial = Some(why);
    v.confidence = Confidence::Low;
    if v.state == HealthState::Healthy {
        v.state = HealthState::Unverified;
        v.verified_success = false;
        v.reason = Some(why.reason().to_string());
        v.next_action =
            format!("the call's evidence may be incomplete ({}); verify the destination before declaring completion", why.as_str()).into();
    } else if v.reason.is_none() && !v.state.is_failure() {
        // A failure's reason is its error class, part of its incident's cause: left as it is,
        // so a partial failure still joins the incident of the same cause.
        v.reason = Some(why.reason().to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `mark` does to each kind of verdict: a green one is capped with a reason; a failure
    /// keeps its state and its reason (its incident's error class), so it joins the same incident.
    #[test]
    fn marking_caps_green_and_keeps_a_failure_and_its_incident() {
        use crate::classify::incidents::cause_of;
        let healthy = crate::verdict::sample("tools/call", true, true);
        let mut failed = crate::verdict::sample("tools/call", true, false);
        failed.state = HealthState::ToolFailed;
        failed.reason = None;
        let unverified = crate::verdict::sample("tools/call", true, false);
        assert_eq!((healthy.state, unverified.state), (HealthState::Healthy, HealthState::Unverified));
        let cases = [
            (healthy, HealthState::Unverified, Some("partial_evicted"), false),
            (failed.clone(), HealthState::ToolFailed, None, false),
            (unverified, HealthState::Unverified, Some("partial_evicted"), false),
        ];
        for (mut v, state, reason, verified) in cases {
            mark(&mut v, Partial::Evicted);
            assert_eq!(
                (v.state, v.reason.as_deref(), v.verified_success, v.confidence, v.partial),
                (state, reason, verified, Confidence::Low, Some(Partial::Evicted))
            );
        }
        let mut marked = failed.clone();
        mark(&mut marked, Partial::DecidedAtShutdown);
        assert_eq!(cause_of(&marked), cause_of(&failed), "the same cause, the same incident");
    }

    /// (name, decided by, earliest call start, since, restored, store down, partial?)
    type Case = (&'static str, DecidedBy, Option<u64>, Option<Since>, bool, bool, Option<Partial>);

    #[test]
    fn which_chains_are_partial() {
        let since = Some(Since { start_ns: 1_000, grace_ns: 100 });
        #[rustfmt::skip]
        let cases: [Case; 16] = [
            ("quiet, after the start", DecidedBy::Quiet, Some(1_500), since, false, false, None),
            ("quiet, within the grace", DecidedBy::Quiet, Some(901), since, false, false, None),
            ("quiet, at the grace's edge", DecidedBy::Quiet, Some(900), since, false, false, None),
            ("quiet, before the grace", DecidedBy::Quiet, Some(899), since, false, false, Some(Partial::PredatesStart)),
            ("max_wait, before the grace", DecidedBy::MaxWait, Some(1), since, false, false, Some(Partial::PredatesStart)),
            ("clock, before the grace", DecidedBy::Clock, Some(1), since, false, false, Some(Partial::PredatesStart)),
            ("restored from the store", DecidedBy::Quiet, Some(1), since, true, false, None),
            ("rule off", DecidedBy::Quiet, Some(1), None, false, false, None),
            ("start unknown", DecidedBy::Quiet, None, since, false, false, None),
            ("shutdown, even after the start", DecidedBy::Shutdown, Some(1_500), None, false, false, Some(Partial::DecidedAtShutdown)),
            ("evicted, even restored", DecidedBy::Evicted, Some(1_500), since, true, false, Some(Partial::Evicted)),
            ("replay has every span", DecidedBy::Replay, Some(1), since, false, false, None),
            ("an interim report is not judged here", DecidedBy::InFlight, Some(1), since, false, false, None),
            ("store down", DecidedBy::Quiet, Some(1_500), since, false, true, Some(Partial::StoreUnavailable)),
            ("store down beats the start", DecidedBy::Quiet, Some(1), since, false, true, Some(Partial::StoreUnavailable)),
            ("shutdown beats the store", DecidedBy::Shutdown, Some(1_500), since, false, true, Some(Partial::DecidedAtShutdown)),
        ];
        for (name, by, earliest, since, restored, store_down, want) in cases {
            assert_eq!(partial_reason(by, earliest, since, restored, store_down), want, "{name}");
        }
    }
}
