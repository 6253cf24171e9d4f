//! Prometheus metrics of the EphemeralRunnerSet reconciler, as one
//! registered struct (the policy runtime's pattern).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::api::EphemeralRunnerSetStatus;
use crate::listener::metrics::ScaleSetLabels;

/// Labels naming one set.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SetLabels {
    /// The set's namespace.
    pub namespace: String,
    /// The set's name.
    pub name: String,
}

/// Labels of the runner-update counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RunnerUpdateLabels {
    /// The set's namespace.
    pub namespace: String,
    /// The set's name.
    pub name: String,
    /// `delivered` (woke the set) or `dropped` (nothing the set reads
    /// changed).
    pub outcome: String,
}

/// The set reconciler's metrics. Clones share the same series.
#[derive(Clone, Debug, Default)]
pub struct SetMetrics {
    /// `arcwright_ephemeral_runner_set_reconciles_total{namespace,name}`.
    pub reconciles: Family<SetLabels, Counter>,
    /// `arcwright_ephemeral_runner_set_runner_updates_total{namespace,name,outcome}`:
    /// what the owned watch did with each runner event. The ratio of
    /// dropped to delivered is what the predicate saves.
    pub runner_updates: Family<RunnerUpdateLabels, Counter>,
    /// `arcwright_ephemeral_runner_set_desired_runners{namespace,name}` (ARC's
    /// `gha_desired_runners`).
    pub desired: Family<SetLabels, Gauge>,
    /// `arcwright_ephemeral_runner_set_current_runners{namespace,name}`.
    pub current: Family<SetLabels, Gauge>,
    /// ARC's `gha_controller_pending_ephemeral_runners`,
    /// `..._running_...` and `..._failed_...`, labelled as ARC labels them.
    pub arc_pending: Family<ScaleSetLabels, Gauge>,
    /// See `arc_pending`.
    pub arc_running: Family<ScaleSetLabels, Gauge>,
    /// See `arc_pending`.
    pub arc_failed: Family<ScaleSetLabels, Gauge>,
    /// The ARC labels each set's counts were recorded under, so they go
    /// with it.
    arc_labels:
        std::sync::Arc<std::sync::Mutex<std::collections::HashMap<SetLabels, ScaleSetLabels>>>,
    /// The sets reconciled and not deleted since: a runner event is counted
    /// only for one of them, so a late event about a deleted set's runner
    /// does not bring the set's series back.
    live: std::sync::Arc<std::sync::Mutex<std::collections::HashSet<SetLabels>>>,
}

impl SetMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "arcwright_ephemeral_runner_set_reconciles",
            "Reconciles of an EphemeralRunnerSet",
            metrics.reconciles.clone(),
        );
        registry.register(
            "arcwright_ephemeral_runner_set_runner_updates",
            "EphemeralRunner watch events per owning set, delivered or dropped as unchanged",
            metrics.runner_updates.clone(),
        );
        registry.register(
            "arcwright_ephemeral_runner_set_desired_runners",
            "spec.replicas of an EphemeralRunnerSet",
            metrics.desired.clone(),
        );
        registry.register(
            "arcwright_ephemeral_runner_set_current_runners",
            "Pending, running and failed runners of an EphemeralRunnerSet",
            metrics.current.clone(),
        );
        for (name, help, family) in [
            (
                "gha_controller_pending_ephemeral_runners",
                "EphemeralRunners of the scale set that are pending",
                &metrics.arc_pending,
            ),
            (
                "gha_controller_running_ephemeral_runners",
                "EphemeralRunners of the scale set that are running",
                &metrics.arc_running,
            ),
            (
                "gha_controller_failed_ephemeral_runners",
                "EphemeralRunners of the scale set that failed",
                &metrics.arc_failed,
            ),
        ] {
            registry.register(name, help, family.clone());
        }
        metrics
    }

    /// Records the set's runner counts as its status has them, under
    /// arcwright's names and ARC's.
    pub fn counts(
        &self,
        labels: &SetLabels,
        arc: &ScaleSetLabels,
        status: &EphemeralRunnerSetStatus,
    ) {
        self.current
            .get_or_create(labels)
            .set(i64::from(status.current_replicas));
        self.arc_pending
            .get_or_create(arc)
            .set(i64::from(status.pending_ephemeral_runners));
        self.arc_running
            .get_or_create(arc)
            .set(i64::from(status.running_ephemeral_runners));
        self.arc_failed
            .get_or_create(arc)
            .set(i64::from(status.failed_ephemeral_runners));
        self.arc_labels
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(labels.clone(), arc.clone());
    }

    /// Removes every series of the set `labels` names: it is deleted.
    pub fn forget(&self, labels: &SetLabels) {
        self.live_sets().remove(labels);
        self.reconciles.remove(labels);
        self.desired.remove(labels);
        self.current.remove(labels);
        let arc = self
            .arc_labels
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(labels);
        if let Some(arc) = arc {
            self.arc_pending.remove(&arc);
            self.arc_running.remove(&arc);
            self.arc_failed.remove(&arc);
        }
        for outcome in ["delivered", "dropped"] {
            self.runner_updates.remove(&RunnerUpdateLabels {
                namespace: labels.namespace.clone(),
                name: labels.name.clone(),
                outcome: outcome.to_owned(),
            });
        }
    }

    /// Counts one reconcile of the set `labels` names.
    pub fn reconciled(&self, labels: &SetLabels) {
        self.live_sets().insert(labels.clone());
        self.reconciles.get_or_create(labels).inc();
    }

    fn live_sets(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<SetLabels>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts one runner event for the set `namespace/name`, if it lives.
    pub fn runner_update(&self, namespace: &str, name: &str, delivered: bool) {
        let set = SetLabels {
            namespace: namespace.to_string(),
            name: name.to_string(),
        };
        if !self.live_sets().contains(&set) {
            return;
        }
        self.runner_updates
            .get_or_create(&RunnerUpdateLabels {
                namespace: namespace.to_string(),
                name: name.to_string(),
                outcome: if delivered { "delivered" } else { "dropped" }.to_string(),
            })
            .inc();
    }

    /// How many runner events of the set `namespace/name` had `outcome`.
    pub fn runner_updates_of(&self, namespace: &str, name: &str, outcome: &str) -> u64 {
        self.runner_updates
            .get(&RunnerUpdateLabels {
                namespace: namespace.to_string(),
                name: name.to_string(),
                outcome: outcome.to_string(),
            })
            .map_or(0, |c| c.get())
    }

    /// How many times the set `namespace/name` was reconciled.
    pub fn reconciles_of(&self, namespace: &str, name: &str) -> u64 {
        self.reconciles
            .get(&SetLabels {
                namespace: namespace.to_string(),
                name: name.to_string(),
            })
            .map_or(0, |c| c.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(registry: &Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        text
    }

    #[test]
    fn series_are_exposed_under_their_documented_names_and_go_with_the_set() {
        let mut registry = Registry::default();
        let metrics = SetMetrics::register(&mut registry);
        let labels = SetLabels {
            namespace: "ns".into(),
            name: "set".into(),
        };
        metrics.reconciled(&labels);
        metrics.runner_update("ns", "set", false);
        metrics.desired.get_or_create(&labels).set(3);
        let arc = ScaleSetLabels::new("ns", "set", "https://github.com/octo/hello");
        metrics.counts(
            &labels,
            &arc,
            &EphemeralRunnerSetStatus {
                current_replicas: 3,
                pending_ephemeral_runners: 1,
                running_ephemeral_runners: 2,
                ..EphemeralRunnerSetStatus::default()
            },
        );
        let text = encode(&registry);
        for line in [
            r#"arcwright_ephemeral_runner_set_runner_updates_total{namespace="ns",name="set",outcome="dropped"} 1"#,
            r#"arcwright_ephemeral_runner_set_desired_runners{namespace="ns",name="set"} 3"#,
            r#"arcwright_ephemeral_runner_set_reconciles_total{namespace="ns",name="set"} 1"#,
            r#"arcwright_ephemeral_runner_set_current_runners{namespace="ns",name="set"} 3"#,
            r#"gha_controller_pending_ephemeral_runners{name="set",namespace="ns",enterprise="",organization="octo",repository="hello"} 1"#,
            r#"gha_controller_running_ephemeral_runners{name="set",namespace="ns",enterprise="",organization="octo",repository="hello"} 2"#,
            r#"gha_controller_failed_ephemeral_runners{name="set",namespace="ns",enterprise="",organization="octo",repository="hello"} 0"#,
        ] {
            assert!(text.contains(line), "{line}\n{text}");
        }
        assert_eq!(metrics.runner_updates_of("ns", "set", "dropped"), 1);
        assert_eq!(metrics.reconciles_of("ns", "set"), 1);

        metrics.forget(&labels);
        // A late event about one of its runners does not bring it back.
        metrics.runner_update("ns", "set", true);
        let text = encode(&registry);
        assert!(!text.contains(r#"name="set""#), "{text}");
    }
}
