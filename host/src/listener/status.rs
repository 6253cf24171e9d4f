//! The status sink: what a listener tells the scale set's status, and only
//! when it changes.
//!
//! A listener decides after every long poll, which is about once a minute
//! per scale set when nothing happens and many times a minute when jobs
//! flow. Writing a status or an event for each would cost an API server
//! write per poll per scale set for nothing a reader needs, so
//! [`StatusTracker`] passes an update on only when what it says differs from
//! the last one: the health changes cause, the decision changes its answer
//! or its reason, or the policy has something new to say.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::backoff::Cause;
use crate::policy::{PolicyEvent, PolicyKind, PolicyReporter};

/// How a listener is doing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Health {
    /// It holds its message session and its last decision was applied.
    Listening,
    /// Something failed; it is waiting before trying again.
    Retrying {
        /// Why.
        cause: Cause,
        /// The error, for a condition message or an event (no secrets: the
        /// Actions client scrubs them from its errors).
        message: String,
        /// How long until the next attempt.
        retry_in: Duration,
    },
    /// It stopped on shutdown and deleted its message session.
    Stopped,
}

impl Health {
    /// What makes two reports the same condition: the state and the cause,
    /// not the message or the wait, which change on every retry.
    fn condition(&self) -> (u8, Option<Cause>) {
        match self {
            Self::Listening => (0, None),
            Self::Retrying { cause, .. } => (1, Some(*cause)),
            Self::Stopped => (2, None),
        }
    }
}

/// A scaling decision as the status shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecisionReport {
    /// The desired number of runners.
    pub desired: u32,
    /// The policy's reason.
    pub reason: String,
    /// The label of the policy that decided (`builtin:default`,
    /// `configmap:ns/name`).
    pub policy: String,
    /// Why the configured policy did not decide, when the bundled default
    /// did.
    pub fallback_reason: Option<String>,
    /// The shadow policy's answer to the same input, if there is one.
    pub shadow: Option<crate::policy::shadow::ShadowReport>,
}

/// One thing to tell the status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StatusUpdate {
    /// The listener's health changed.
    Health(Health),
    /// The decision changed.
    Decision(DecisionReport),
    /// The scaling policy was loaded, failed to load, failed a decision or
    /// was clamped.
    Policy {
        /// The policy's label.
        policy: String,
        /// What happened.
        event: PolicyEvent,
    },
}

/// Where a listener reports its status.
///
/// Called on the listener's task and on the policy runtime's threads;
/// implementations must be cheap and must not block (hand the update to a
/// channel or a status writer). Updates arrive only when something changed.
pub trait StatusSink: Send + Sync + 'static {
    /// Takes one update.
    fn update(&self, update: StatusUpdate);
}

/// Remembers what was last reported and lets through only what differs.
#[derive(Debug, Default)]
pub struct StatusTracker {
    health: Option<Health>,
    decision: Option<DecisionReport>,
    policy: Option<(String, &'static str, Option<String>)>,
}

impl StatusTracker {
    /// The update to send for `health`, if it is news.
    pub fn health(&mut self, health: Health) -> Option<StatusUpdate> {
        if self
            .health
            .as_ref()
            .is_some_and(|last| last.condition() == health.condition())
        {
            return None;
        }
        self.health = Some(health.clone());
        Some(StatusUpdate::Health(health))
    }

    /// The update to send for a decision, if it is news.
    pub fn decision(&mut self, decision: DecisionReport) -> Option<StatusUpdate> {
        if self.decision.as_ref() == Some(&decision) {
            return None;
        }
        self.decision = Some(decision.clone());
        Some(StatusUpdate::Decision(decision))
    }

    /// The update to send for a policy event, if it is news. The same
    /// failure repeating (a policy that traps on every decision) is one
    /// report, not one per poll; a different failure, or a recovery, is news.
    pub fn policy(&mut self, policy: &str, event: PolicyEvent) -> Option<StatusUpdate> {
        let kind = match &event {
            PolicyEvent::Loaded { .. } => "loaded",
            PolicyEvent::LoadFailed { .. } => "load-failed",
            PolicyEvent::Fallback { .. } => "fallback",
            PolicyEvent::Clamped { .. } => "clamped",
        };
        let key = (
            policy.to_string(),
            kind,
            event.failure_reason().map(str::to_string),
        );
        if matches!(event, PolicyEvent::Loaded { .. }) {
            // Every loaded version is news, even an identical reload after
            // a failure.
            self.policy = Some(key);
            return Some(StatusUpdate::Policy {
                policy: policy.to_string(),
                event,
            });
        }
        if self.policy.as_ref() == Some(&key) {
            return None;
        }
        self.policy = Some(key);
        Some(StatusUpdate::Policy {
            policy: policy.to_string(),
            event,
        })
    }
}

/// A [`StatusSink`] behind a [`StatusTracker`], also serving as the
/// scaling policy's [`PolicyReporter`], so policy events reach the same
/// status with the same rule.
pub(crate) struct Reporting<S> {
    sink: S,
    tracker: Mutex<StatusTracker>,
    scale_set: String,
    /// The log line and the failure metric, as for every policy kind.
    policy: crate::policy::reporter::TracingReporter,
}

impl<S: StatusSink> Reporting<S> {
    pub(crate) fn new(
        sink: S,
        scale_set: String,
        policy: crate::policy::reporter::TracingReporter,
    ) -> Arc<Self> {
        Arc::new(Self {
            sink,
            tracker: Mutex::new(StatusTracker::default()),
            scale_set,
            policy,
        })
    }

    fn send(&self, pick: impl FnOnce(&mut StatusTracker) -> Option<StatusUpdate>) {
        let update = pick(&mut self.tracker.lock().unwrap_or_else(|e| e.into_inner()));
        if let Some(update) = update {
            self.log(&update);
            self.sink.update(update);
        }
    }

    fn log(&self, update: &StatusUpdate) {
        let scale_set = self.scale_set.as_str();
        match update {
            StatusUpdate::Health(Health::Retrying {
                cause,
                message,
                retry_in,
            }) => {
                tracing::warn!(scale_set, cause = %cause, ?retry_in, "listener retrying: {message}")
            }
            StatusUpdate::Health(health) => tracing::info!(scale_set, ?health, "listener health"),
            StatusUpdate::Decision(d) => tracing::info!(
                scale_set,
                desired = d.desired,
                policy = %d.policy,
                "scaling decision: {}",
                d.reason
            ),
            StatusUpdate::Policy { .. } => {}
        }
    }

    pub(crate) fn health(&self, health: Health) {
        self.send(|t| t.health(health));
    }

    pub(crate) fn decision(&self, decision: DecisionReport) {
        self.send(|t| t.decision(decision));
    }
}

impl<S: StatusSink> PolicyReporter for Reporting<S> {
    fn report(&self, kind: PolicyKind, policy: &str, event: PolicyEvent) {
        if kind != PolicyKind::Scaling {
            return;
        }
        // The log line and the failure metric stay the policy layer's.
        self.policy.report(kind, policy, event.clone());
        self.send(|t| t.policy(policy, event));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn retrying(cause: Cause, message: &str, secs: u64) -> Health {
        Health::Retrying {
            cause,
            message: message.into(),
            retry_in: Duration::from_secs(secs),
        }
    }

    #[test]
    fn health_is_news_only_when_the_condition_changes() {
        let mut tracker = StatusTracker::default();
        let steps: Vec<(Health, bool)> = vec![
            (retrying(Cause::SessionConflict, "a", 1), true),
            (retrying(Cause::SessionConflict, "b", 2), false),
            (retrying(Cause::SessionConflict, "c", 60), false),
            (Health::Listening, true),
            (Health::Listening, false),
            (retrying(Cause::ServiceUnavailable, "503", 1), true),
            (retrying(Cause::ScaleSetNotFound, "gone", 1), true),
            (Health::Listening, true),
            (Health::Stopped, true),
        ];
        for (i, (health, news)) in steps.into_iter().enumerate() {
            assert_eq!(
                tracker.health(health.clone()).is_some(),
                news,
                "step {i}: {health:?}"
            );
        }
    }

    fn decision(desired: u32, reason: &str, fallback: Option<&str>) -> DecisionReport {
        DecisionReport {
            desired,
            reason: reason.into(),
            policy: "builtin:default".into(),
            fallback_reason: fallback.map(str::to_string),
            shadow: None,
        }
    }

    #[test]
    fn decisions_are_news_when_answer_reason_or_fallback_change() {
        let mut tracker = StatusTracker::default();
        let steps = [
            (decision(0, "0 assigned", None), true),
            (decision(0, "0 assigned", None), false),
            (decision(3, "3 assigned", None), true),
            (decision(3, "3 assigned, capped", None), true),
            (decision(3, "3 assigned, capped", Some("trap")), true),
            (decision(3, "3 assigned, capped", Some("trap")), false),
        ];
        for (i, (d, news)) in steps.into_iter().enumerate() {
            assert_eq!(tracker.decision(d).is_some(), news, "step {i}");
        }
    }

    /// A scaling policy's failure is counted where every policy kind's is,
    /// so `arcwright_policy_failures_total` (and the alert on it) sees the
    /// scaling policies too, not only the log.
    #[test]
    fn a_scaling_policy_failure_is_counted_in_the_policy_metrics() {
        use crate::listener::{ListenerMetrics, MemoryStatusSink};
        use crate::policy::metrics::{FailureLabels, PolicyMetrics};
        let policy = PolicyMetrics::default();
        let metrics = ListenerMetrics::default().with_policy_metrics(policy.clone());
        let sink = MemoryStatusSink::new();
        let reporting = Reporting::new(sink.clone(), "linux".into(), metrics.policy_reporter());
        reporting.report(
            PolicyKind::Scaling,
            "configmap:ci/mine",
            PolicyEvent::Fallback {
                reason: "trap".into(),
                message: "unreachable executed".into(),
                fallback: "builtin:default".into(),
            },
        );
        let counted = policy
            .failures
            .get_or_create(&FailureLabels {
                kind: "scaling".into(),
                policy: "configmap:ci/mine".into(),
                reason: "trap".into(),
            })
            .get();
        assert_eq!(counted, 1);
        assert_eq!(sink.updates().all().len(), 1, "and the status hears of it");
    }

    #[test]
    fn a_repeating_policy_failure_is_one_report() {
        let fallback = |reason: &str| PolicyEvent::Fallback {
            reason: reason.into(),
            message: format!("{reason} at some address"),
            fallback: "builtin:default".into(),
        };
        let loaded = PolicyEvent::Loaded {
            sha256: "ab".into(),
        };
        let mut tracker = StatusTracker::default();
        let steps = [
            ("p", loaded.clone(), true),
            ("p", fallback("trap"), true),
            ("p", fallback("trap"), false),
            ("p", fallback("timeout"), true),
            ("q", fallback("timeout"), true),
            ("q", loaded.clone(), true),
            ("q", loaded, true),
            (
                "q",
                PolicyEvent::LoadFailed {
                    reason: "settings".into(),
                    message: "m".into(),
                },
                true,
            ),
        ];
        for (i, (policy, event, news)) in steps.into_iter().enumerate() {
            assert_eq!(tracker.policy(policy, event).is_some(), news, "step {i}");
        }
    }
}
