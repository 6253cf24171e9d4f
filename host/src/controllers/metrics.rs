//! Prometheus metrics of the reconcilers, as registered structs (the policy
//! runtime's pattern). Names follow ARC's `gha_*` where they mean the same
//! thing, under arcwright's prefix.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels naming a controller.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    /// `ephemeral-runner`, ...
    pub controller: String,
}

/// Labels of `arcwright_reconcile_errors_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// The controller.
    pub controller: String,
    /// The error's stable label.
    pub error: String,
}

/// Labels of `arcwright_owned_updates_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OwnedUpdateLabels {
    /// The owner's controller.
    pub controller: String,
    /// `delivered` (woke the owner) or `dropped` (nothing it reads changed).
    pub outcome: String,
}

/// Labels of `arcwright_ephemeral_runners` (ARC's `gha_*_ephemeral_runners`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RunnerLabels {
    /// The runner's namespace.
    pub namespace: String,
    /// Its scale set ("" for a runner made by hand).
    pub scale_set: String,
    /// Its phase.
    pub phase: String,
}

/// Labels of `arcwright_deregistrations_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeregistrationLabels {
    /// `self-deregistered`, `remove-now`, `remove-after-job`.
    pub verdict: String,
    /// `skipped`, `removed`, `not-found`, `failed`.
    pub outcome: String,
}

/// Labels of `arcwright_shadow_verdicts_total`: the active deregistration
/// policy's verdict and the shadow's (`failed` when it gave none), a
/// bounded set (three verdicts each).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShadowVerdictLabels {
    /// The runner's namespace.
    pub namespace: String,
    /// What the active policy answered.
    pub active: String,
    /// What the shadow answered.
    pub shadow: String,
    /// `same` or `different`.
    pub agreement: &'static str,
}

type HistogramBuilder = fn() -> Histogram;

fn reconcile_buckets() -> Histogram {
    // 1 ms .. ~16 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// The reconcilers' metrics. Clones share the same series.
#[derive(Clone, Debug)]
pub struct ControllerMetrics {
    /// `arcwright_reconcile_duration_seconds{controller}`.
    pub duration: Family<ControllerLabels, Histogram, HistogramBuilder>,
    /// `arcwright_reconciles_total{controller}`: what the duration histogram
    /// counts too, kept as a counter a test or a dashboard reads directly.
    pub reconciles: Family<ControllerLabels, Counter>,
    /// `arcwright_reconcile_errors_total{controller,error}`.
    pub errors: Family<ErrorLabels, Counter>,
    /// `arcwright_owned_updates_total{controller,outcome}`: what the owned
    /// watches' projections let through, so the saving (and a projection
    /// that drops too much) can be seen.
    pub owned_updates: Family<OwnedUpdateLabels, Counter>,
    /// `arcwright_ephemeral_runners{namespace,scale_set,phase}`.
    pub runners: Family<RunnerLabels, Gauge>,
    /// `arcwright_deregistrations_total{verdict,outcome}`.
    pub deregistrations: Family<DeregistrationLabels, Counter>,
    /// `arcwright_shadow_verdicts_total{namespace,active,shadow,agreement}`.
    pub shadow_verdicts: Family<ShadowVerdictLabels, Counter>,
    /// Where each runner was last counted, so a phase change moves it
    /// between series instead of recounting every runner on each change.
    counted: Arc<Mutex<HashMap<(String, String), RunnerLabels>>>,
}

impl Default for ControllerMetrics {
    fn default() -> Self {
        Self {
            duration: Family::new_with_constructor(reconcile_buckets),
            reconciles: Family::default(),
            errors: Family::default(),
            owned_updates: Family::default(),
            runners: Family::default(),
            deregistrations: Family::default(),
            shadow_verdicts: Family::default(),
            counted: Arc::default(),
        }
    }
}

impl ControllerMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "arcwright_reconcile_duration_seconds",
            "Time of one reconcile, by controller",
            metrics.duration.clone(),
        );
        registry.register(
            "arcwright_reconciles",
            "Reconciles started, by controller",
            metrics.reconciles.clone(),
        );
        registry.register(
            "arcwright_reconcile_errors",
            "Reconciles that failed, by controller and error",
            metrics.errors.clone(),
        );
        registry.register(
            "arcwright_owned_updates",
            "Updates of owned objects, by the owner's controller and whether they woke it",
            metrics.owned_updates.clone(),
        );
        registry.register(
            "arcwright_ephemeral_runners",
            "EphemeralRunners by namespace, scale set and phase",
            metrics.runners.clone(),
        );
        registry.register(
            "arcwright_deregistrations",
            "Runner registrations dealt with when a runner finished, by the policy's verdict and how it ended",
            metrics.deregistrations.clone(),
        );
        registry.register(
            "arcwright_shadow_verdicts",
            "Finished runners judged by the shadow deregistration policy beside the active one, by both verdicts",
            metrics.shadow_verdicts.clone(),
        );
        metrics
    }

    /// Times a reconcile of `controller` until the guard is dropped.
    pub fn time(&self, controller: &str) -> ReconcileTimer {
        let labels = ControllerLabels {
            controller: controller.to_string(),
        };
        self.reconciles.get_or_create(&labels).inc();
        ReconcileTimer {
            histogram: self.duration.get_or_create(&labels).clone(),
            started: Instant::now(),
        }
    }

    /// Creates `controller`'s reconcile series at zero, so the first scrape
    /// shows them and `rate()` sees the first reconcile (a family with no
    /// series is left out of the exposition).
    pub fn prime(&self, controller: &str) {
        let labels = ControllerLabels {
            controller: controller.to_string(),
        };
        let _ = self.reconciles.get_or_create(&labels);
        let _ = self.duration.get_or_create(&labels);
    }

    /// How many reconciles of `controller` started.
    pub fn reconciles_of(&self, controller: &str) -> u64 {
        self.reconciles
            .get(&ControllerLabels {
                controller: controller.to_string(),
            })
            .map_or(0, |counter| counter.get())
    }

    /// Counts an update of an owned object that woke its owner (`delivered`)
    /// or was dropped.
    pub fn owned_update(&self, controller: &str, delivered: bool) {
        self.owned_updates
            .get_or_create(&Self::owned_labels(controller, delivered))
            .inc();
    }

    /// How many owned updates of `controller` were delivered or dropped.
    pub fn owned_updates_of(&self, controller: &str, delivered: bool) -> u64 {
        self.owned_updates
            .get(&Self::owned_labels(controller, delivered))
            .map_or(0, |counter| counter.get())
    }

    fn owned_labels(controller: &str, delivered: bool) -> OwnedUpdateLabels {
        OwnedUpdateLabels {
            controller: controller.to_string(),
            outcome: if delivered { "delivered" } else { "dropped" }.to_string(),
        }
    }

    /// Counts a failed reconcile.
    pub fn error(&self, controller: &str, error: &str) {
        self.errors
            .get_or_create(&ErrorLabels {
                controller: controller.to_string(),
                error: error.to_string(),
            })
            .inc();
    }

    /// Counts a deregistration.
    pub fn deregistration(&self, verdict: &str, outcome: &str) {
        self.deregistrations
            .get_or_create(&DeregistrationLabels {
                verdict: verdict.to_string(),
                outcome: outcome.to_string(),
            })
            .inc();
    }

    /// Records the runner `namespace/name` as being in `labels`, or as gone
    /// when `None`.
    pub fn runner(&self, namespace: &str, name: &str, labels: Option<RunnerLabels>) {
        let key = (namespace.to_string(), name.to_string());
        let mut counted = self.counted.lock().unwrap_or_else(|e| e.into_inner());
        let previous = match labels {
            Some(labels) => {
                if counted.get(&key) == Some(&labels) {
                    return;
                }
                self.runners.get_or_create(&labels).inc();
                counted.insert(key, labels)
            }
            None => counted.remove(&key),
        };
        if let Some(previous) = previous {
            self.runners.get_or_create(&previous).dec();
        }
    }
}

impl ControllerMetrics {
    /// Removes the runner series of a deleted scale set. Until then a phase
    /// no runner is in reads 0 rather than vanishing, so a dashboard sees a
    /// drained scale set, not a gap.
    pub fn forget_scale_set(&self, namespace: &str, scale_set: &str) {
        let _counted = self.counted.lock().unwrap_or_else(|e| e.into_inner());
        use crate::api::EphemeralRunnerPhase as Phase;
        for phase in [
            Phase::Pending,
            Phase::Running,
            Phase::Succeeded,
            Phase::Failed,
            Phase::Outdated,
            Phase::Debugging,
        ] {
            self.runners.remove(&RunnerLabels {
                namespace: namespace.to_owned(),
                scale_set: scale_set.to_owned(),
                phase: phase.as_str().to_owned(),
            });
        }
    }
}

/// Observes a reconcile's duration when dropped.
pub struct ReconcileTimer {
    histogram: Histogram,
    started: Instant,
}

impl Drop for ReconcileTimer {
    fn drop(&mut self) {
        self.histogram.observe(self.started.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(phase: &str) -> RunnerLabels {
        RunnerLabels {
            namespace: "ns".into(),
            scale_set: "set".into(),
            phase: phase.into(),
        }
    }

    #[test]
    fn a_runner_moves_between_phases_and_leaves() {
        let mut registry = Registry::default();
        let metrics = ControllerMetrics::register(&mut registry);
        metrics.runner("ns", "a", Some(labels("Pending")));
        metrics.runner("ns", "b", Some(labels("Pending")));
        metrics.runner("ns", "a", Some(labels("Running")));
        metrics.runner("ns", "a", Some(labels("Running")));
        metrics.runner("ns", "b", None);
        assert_eq!(
            metrics.runners.get(&labels("Pending")).map(|g| g.get()),
            Some(0)
        );
        assert_eq!(
            metrics.runners.get(&labels("Running")).map(|g| g.get()),
            Some(1)
        );
        metrics.deregistration("self-deregistered", "skipped");
        drop(metrics.time("ephemeral-runner"));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(
                r#"arcwright_ephemeral_runners{namespace="ns",scale_set="set",phase="Running"} 1"#
            ),
            "{text}"
        );
        assert!(text.contains(r#"arcwright_deregistrations_total{verdict="self-deregistered",outcome="skipped"} 1"#), "{text}");
        assert!(
            text.contains(
                r#"arcwright_reconcile_duration_seconds_count{controller="ephemeral-runner"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"arcwright_reconciles_total{controller="ephemeral-runner"} 1"#),
            "{text}"
        );
        assert_eq!(metrics.reconciles_of("ephemeral-runner"), 1);
        // Errors have no series until one happens (a healthy burst may
        // have none); the name the dashboard and alerts query:
        metrics.error("ephemeral-runner", "kube");
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(
                r#"arcwright_reconcile_errors_total{controller="ephemeral-runner",error="kube"} 1"#
            ),
            "{text}"
        );

        // The scale set deleted: its runner series go, whatever the phase.
        metrics.forget_scale_set("ns", "set");
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(!text.contains(r#"scale_set="set""#), "{text}");
    }
}
