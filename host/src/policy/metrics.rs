//! Prometheus metrics of the policy runtime, as one registered struct.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of `arcwright_policy_failures_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabels {
    /// `scaling`, `deregistration` or `pod-validation`.
    pub kind: String,
    /// The policy's label (`builtin:default`, `configmap:ns/name`).
    pub policy: String,
    /// [`super::PolicyError::reason`], or `out-of-range` for a clamped answer.
    pub reason: String,
}

/// Labels of the decision counter and duration histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    /// The kind of decision.
    pub kind: String,
    /// The policy that answered (the fallback when one was used).
    pub policy: String,
}

/// How histogram buckets are built; a function pointer keeps the family's
/// type nameable.
type HistogramBuilder = fn() -> Histogram;

fn decision_buckets() -> Histogram {
    // 10 µs .. ~0.16 s: a fresh-instance decision is tens of microseconds;
    // the top buckets catch calls that ran into their deadline.
    Histogram::new(exponential_buckets(0.000_01, 4.0, 8))
}

/// The policy runtime's metrics. Clones share the same series.
#[derive(Clone, Debug)]
pub struct PolicyMetrics {
    /// `arcwright_policy_failures_total{kind,policy,reason}`: loads that
    /// failed, decisions that fell back, answers that were clamped.
    pub failures: Family<FailureLabels, Counter>,
    /// `arcwright_policy_decisions_total{kind,policy}`.
    pub decisions: Family<DecisionLabels, Counter>,
    /// `arcwright_policy_decision_duration_seconds{kind,policy}`.
    pub duration: Family<DecisionLabels, Histogram, HistogramBuilder>,
}

impl Default for PolicyMetrics {
    fn default() -> Self {
        Self {
            failures: Family::default(),
            decisions: Family::default(),
            duration: Family::new_with_constructor(decision_buckets),
        }
    }
}

impl PolicyMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "arcwright_policy_failures",
            "Policy loads that failed, decisions that fell back to the bundled default, and clamped answers",
            metrics.failures.clone(),
        );
        registry.register(
            "arcwright_policy_decisions",
            "Policy decisions made",
            metrics.decisions.clone(),
        );
        registry.register(
            "arcwright_policy_decision_duration_seconds",
            "Time of one policy decision, instantiation included",
            metrics.duration.clone(),
        );
        metrics
    }

    /// Counts one failure.
    pub fn failure(&self, kind: &str, policy: &str, reason: &str) {
        self.failures
            .get_or_create(&FailureLabels {
                kind: kind.to_string(),
                policy: policy.to_string(),
                reason: reason.to_string(),
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_exposed_under_their_documented_name() {
        let mut registry = Registry::default();
        let metrics = PolicyMetrics::register(&mut registry);
        metrics.failure("scaling", "configmap:ns/p", "timeout");
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(r#"arcwright_policy_failures_total{kind="scaling",policy="configmap:ns/p",reason="timeout"} 1"#),
            "{text}"
        );
    }
}
