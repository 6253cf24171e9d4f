//! How the policy layer tells the rest of the controller what happened.
//!
//! The policy runtime does not know which object a policy serves, so it
//! reports through [`PolicyReporter`]; the reconcilers implement it for
//! their objects (a condition, an event) and the runtime never talks to the
//! API server about status itself. Two implementations live here:
//! [`TracingReporter`] (log lines and metrics, what runs when nothing more
//! specific is wired) and [`RecordingReporter`], which keeps the events in
//! memory for code that wants to look at them afterwards, tests included.

use std::sync::{Arc, Mutex};
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

/// Whether a reference's own policy decides, as far as what was reported
/// while it loaded tells.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Loading {
    /// Nothing reported yet: a ConfigMap's first version is still on its
    /// way (or the reference names nothing, and the default decides).
    #[default]
    Pending,
    /// A version loaded, and it (or a later good one) decides; a version
    /// that failed after it leaves it deciding.
    Loaded,
    /// No version ever loaded: the bundled default stands in.
    Failed {
        /// The short reason label.
        reason: String,
        /// The full error.
        message: String,
    },
}

/// Remembers [`Loading`] for one loaded reference and forwards every
/// event to `inner`.
///
/// For a controller that must not let the bundled default stand in
/// silently: the pod-validation policy is a gate an admin chose, and a
/// typo in a ConfigMap's name must not let the default accept a template
/// the admin's policy refuses. Scaling keeps the fallback: a default
/// deciding is better than no runners.
pub struct LoadState {
    inner: Arc<dyn PolicyReporter>,
    state: tokio::sync::watch::Sender<Loading>,
}

impl LoadState {
    /// A state with nothing reported yet, forwarding to `inner`.
    pub fn new(inner: Arc<dyn PolicyReporter>) -> Self {
        Self {
            inner,
            state: tokio::sync::watch::Sender::new(Loading::Pending),
        }
    }

    /// What was reported so far.
    pub fn current(&self) -> Loading {
        self.state.borrow().clone()
    }

    /// Waits up to `within` for something other than [`Loading::Pending`];
    /// what there is then.
    pub async fn settled(&self, within: Duration) -> Loading {
        let mut state = self.state.subscribe();
        let _ = tokio::time::timeout(
            within,
            state.wait_for(|loading| *loading != Loading::Pending),
        )
        .await;
        self.current()
    }
}

impl PolicyReporter for LoadState {
    fn report(&self, kind: PolicyKind, policy: &str, event: PolicyEvent) {
        match &event {
            PolicyEvent::Loaded { .. } => {
                self.state.send_replace(Loading::Loaded);
            }
            PolicyEvent::LoadFailed { reason, message } => {
                self.state.send_if_modified(|loading| {
                    if *loading == Loading::Loaded {
                        return false;
                    }
                    *loading = Loading::Failed {
                        reason: reason.clone(),
                        message: message.clone(),
                    };
                    true
                });
            }
            PolicyEvent::Fallback { .. } | PolicyEvent::Clamped { .. } => {}
        }
        self.inner.report(kind, policy, event);
    }
}

impl<R: PolicyReporter + ?Sized> PolicyReporter for std::sync::Arc<R> {
    fn report(&self, kind: PolicyKind, policy: &str, event: PolicyEvent) {
        (**self).report(kind, policy, event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed() -> PolicyEvent {
        PolicyEvent::LoadFailed {
            reason: "configmap-missing".into(),
            message: "gone".into(),
        }
    }

    #[tokio::test]
    async fn a_load_state_tells_a_policy_that_never_loaded_from_one_that_did() {
        let inner = Arc::new(RecordingReporter::new());
        let state = LoadState::new(inner.clone());
        assert_eq!(state.current(), Loading::Pending);
        state.report(PolicyKind::PodValidation, "p", failed());
        assert_eq!(
            state.settled(Duration::ZERO).await,
            Loading::Failed {
                reason: "configmap-missing".into(),
                message: "gone".into()
            }
        );
        state.report(
            PolicyKind::PodValidation,
            "p",
            PolicyEvent::Loaded {
                sha256: "ab".into(),
            },
        );
        // A version failing after a good one leaves the good one deciding.
        state.report(PolicyKind::PodValidation, "p", failed());
        assert_eq!(state.current(), Loading::Loaded);
        // Everything reached the reporter underneath.
        assert_eq!(inner.events().len(), 3);
    }

    #[tokio::test]
    async fn settled_waits_for_the_first_report() {
        let state = Arc::new(LoadState::new(Arc::new(RecordingReporter::new())));
        let reporting = state.clone();
        let waiting = tokio::spawn(async move { state.settled(Duration::from_secs(60)).await });
        reporting.report(
            PolicyKind::PodValidation,
            "p",
            PolicyEvent::Loaded {
                sha256: "ab".into(),
            },
        );
        assert_eq!(waiting.await.unwrap(), Loading::Loaded);
    }
}
