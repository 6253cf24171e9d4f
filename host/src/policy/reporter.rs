//! How the policy layer tells the rest of the controller what happened.
//!
//! The policy runtime does not know which object a policy serves, so it
//! reports through [`PolicyReporter`]; the reconcilers implement it for
//! their objects (a condition, an event) and the runtime never talks to the
//! API server about status itself. Two implementations live here:
//! [`TracingReporter`] (log lines and metrics, what runs when nothing more
//! specific is wired) and [`RecordingReporter`], which keeps the events in
//! memory for code that wants to look at them afterwards, tests included.

use std::sync::Mutex;
use std::time::Duration;

use super::PolicyKind;
use super::metrics::PolicyMetrics;

/// Something that happened to a policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PolicyEvent {
    /// A version was compiled, its settings validated, and it now decides.
    Loaded {
        /// sha256 of the module.
        sha256: String,
    },
    /// A version could not be loaded; the previous good version (or the
    /// bundled default, if there never was one) keeps deciding.
    LoadFailed {
        /// The short reason label (`settings`, `digest-mismatch`...).
        reason: String,
        /// The full error, for a condition message or an event.
        message: String,
    },
    /// A decision failed and the bundled default answered instead.
    Fallback {
        /// The short reason label (`timeout`, `trap`, `memory`...).
        reason: String,
        /// The full error.
        message: String,
        /// The policy that answered instead.
        fallback: String,
    },
    /// The answer was above the scale set's maximum and was clamped.
    Clamped {
        /// What the policy asked for.
        requested: u32,
        /// What it got.
        max: u32,
    },
}

impl PolicyEvent {
    /// The label used for this event in `arcwright_policy_failures_total`,
    /// or `None` for events that are not failures.
    pub fn failure_reason(&self) -> Option<&str> {
        match self {
            Self::Loaded { .. } => None,
            Self::LoadFailed { reason, .. } | Self::Fallback { reason, .. } => Some(reason),
            Self::Clamped { .. } => Some("out-of-range"),
        }
    }
}

/// Receives what happens to a policy. Implementations must be cheap and
/// must not block: they are called on the decision path.
pub trait PolicyReporter: Send + Sync {
    /// Reports `event` for the policy labelled `policy` of `kind`.
    fn report(&self, kind: PolicyKind, policy: &str, event: PolicyEvent);
}

/// Reports to the log and to `arcwright_policy_failures_total`.
#[derive(Clone, Debug, Default)]
pub struct TracingReporter {
    metrics: Option<PolicyMetrics>,
}

impl TracingReporter {
    /// A reporter that also counts failures in `metrics`.
    pub fn new(metrics: PolicyMetrics) -> Self {
        Self {
            metrics: Some(metrics),
        }
    }
}

impl PolicyReporter for TracingReporter {
    fn report(&self, kind: PolicyKind, policy: &str, event: PolicyEvent) {
        if let (Some(metrics), Some(reason)) = (&self.metrics, event.failure_reason()) {
            metrics.failure(kind.as_str(), policy, reason);
        }
        let kind = kind.as_str();
        match event {
            PolicyEvent::Loaded { sha256 } => tracing::info!(kind, policy, sha256, "policy loaded"),
            PolicyEvent::LoadFailed { reason, message } => {
                tracing::warn!(
                    kind,
                    policy,
                    reason,
                    "policy not loaded, the previous version stays: {message}"
                )
            }
            PolicyEvent::Fallback {
                reason,
                message,
                fallback,
            } => tracing::warn!(
                kind,
                policy,
                reason,
                fallback,
                "policy failed, {fallback} decided instead: {message}"
            ),
            PolicyEvent::Clamped { requested, max } => {
                tracing::warn!(
                    kind,
                    policy,
                    requested,
                    max,
                    "policy asked for more runners than maxRunners; clamped"
                )
            }
        }
    }
}

/// One event as [`RecordingReporter`] keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    /// The kind of the policy.
    pub kind: PolicyKind,
    /// The policy's label.
    pub policy: String,
    /// What happened.
    pub event: PolicyEvent,
}

/// Keeps every event in memory, in order.
#[derive(Debug, Default)]
pub struct RecordingReporter {
    events: Mutex<Vec<Recorded>>,
}

impl RecordingReporter {
    /// A reporter with no events yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every event so far.
    pub fn events(&self) -> Vec<Recorded> {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Waits until `count` events match `predicate`, or `timeout` passes;
    /// returns whether they did.
    pub async fn wait_for(
        &self,
        count: usize,
        timeout: Duration,
        predicate: impl Fn(&PolicyEvent) -> bool,
    ) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let matching = self.events().iter().filter(|r| predicate(&r.event)).count();
            if matching >= count {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl PolicyReporter for RecordingReporter {
    fn report(&self, kind: PolicyKind, policy: &str, event: PolicyEvent) {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Recorded {
                kind,
                policy: policy.to_string(),
                event,
            });
    }
}

impl<R: PolicyReporter + ?Sized> PolicyReporter for std::sync::Arc<R> {
    fn report(&self, kind: PolicyKind, policy: &str, event: PolicyEvent) {
        (**self).report(kind, policy, event);
    }
}
