//! Shadow policies: a candidate asked beside the active policy, on the same
//! input, and never acted on. What an admin learns from one is how often,
//! and since when, it agrees with the policy that decides.
//!
//! The comparison and its bookkeeping are here, pure, for every place a
//! shadow runs (the listener's scaling decisions, the runners'
//! deregistration verdicts) and for `arcwright policy replay`, so
//! "agreement" means one thing everywhere.

use jiff::Timestamp;
use serde::Serialize;

/// How a candidate's number compares with the active one's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Agreement {
    /// The same answer.
    Same,
    /// The candidate wanted more.
    Higher,
    /// The candidate wanted fewer.
    Lower,
}

impl Agreement {
    /// `candidate` compared with `active`.
    pub fn of(active: u32, candidate: u32) -> Agreement {
        match candidate.cmp(&active) {
            std::cmp::Ordering::Equal => Agreement::Same,
            std::cmp::Ordering::Greater => Agreement::Higher,
            std::cmp::Ordering::Less => Agreement::Lower,
        }
    }

    /// Its name in metrics and status: `same`, `higher`, `lower`.
    pub fn as_str(self) -> &'static str {
        match self {
            Agreement::Same => "same",
            Agreement::Higher => "higher",
            Agreement::Lower => "lower",
        }
    }
}

/// A shadow scaling decision as the status shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShadowReport {
    /// The shadow policy's label.
    pub policy: String,
    /// What it asked for; `None` when it gave no answer.
    pub desired: Option<u32>,
    /// Its reason, or why it gave no answer.
    pub reason: String,
    /// Its answer against the active one's; `None` when it gave none.
    pub agreement: Option<Agreement>,
    /// Why it gave no answer (a trap, its deadline, not loaded).
    pub error: Option<String>,
    /// Since when it has agreed, or disagreed (failures count as
    /// disagreeing): the start of the current run.
    pub since: Timestamp,
}

impl ShadowReport {
    /// Whether it gave the active policy's answer.
    pub fn agrees(&self) -> bool {
        self.agreement == Some(Agreement::Same)
    }
}

/// Follows one shadow's agreement from decision to decision.
#[derive(Debug, Default)]
pub struct ShadowTracker {
    run: Option<(bool, Timestamp)>,
}

impl ShadowTracker {
    /// The report of a shadow decision made at `now`: the shadow's
    /// `answer` (desired and reason, or why there is none) against the
    /// active policy's `active` desired runners.
    pub fn observe(
        &mut self,
        policy: &str,
        active: u32,
        answer: Result<(u32, String), String>,
        now: Timestamp,
    ) -> ShadowReport {
        let (desired, reason, agreement, error) = match answer {
            Ok((desired, reason)) => (
                Some(desired),
                reason,
                Some(Agreement::of(active, desired)),
                None,
            ),
            Err(error) => (None, String::new(), None, Some(error)),
        };
        let agrees = agreement == Some(Agreement::Same);
        let since = match self.run {
            Some((was, since)) if was == agrees => since,
            _ => now,
        };
        self.run = Some((agrees, since));
        ShadowReport {
            policy: policy.to_owned(),
            desired,
            reason,
            agreement,
            error,
            since,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(1_796_000_000 + second).unwrap()
    }

    #[test]
    fn agreement_runs_from_the_first_decision_of_the_run() {
        let mut tracker = ShadowTracker::default();
        let answer = |n: u32| Ok((n, format!("{n} wanted")));
        let first = tracker.observe("builtin:buffered", 3, answer(3), at(0));
        assert!(first.agrees());
        assert_eq!(first.since, at(0));
        let still = tracker.observe("builtin:buffered", 4, answer(4), at(10));
        assert_eq!(still.since, at(0), "still agreeing: the run goes on");
        let higher = tracker.observe("builtin:buffered", 4, answer(6), at(20));
        assert_eq!(higher.agreement, Some(Agreement::Higher));
        assert_eq!(higher.since, at(20));
        let lower = tracker.observe("builtin:buffered", 4, answer(1), at(30));
        assert_eq!(lower.agreement, Some(Agreement::Lower));
        assert_eq!(lower.since, at(20), "disagreeing either way is one run");
    }

    #[test]
    fn a_failed_shadow_disagrees_and_says_why() {
        let mut tracker = ShadowTracker::default();
        tracker.observe("configmap:ci/next", 2, Ok((2, String::new())), at(0));
        let failed = tracker.observe("configmap:ci/next", 2, Err("trapped".into()), at(5));
        assert!(!failed.agrees());
        assert_eq!(failed.desired, None);
        assert_eq!(failed.error.as_deref(), Some("trapped"));
        assert_eq!(failed.since, at(5));
    }
}
