//! What the listeners report to Prometheus: the service's statistics per
//! scale set under the names actions-runner-controller's listener uses
//! (`gha_*`, labelled `namespace` and `name`), so dashboards and alerts
//! written for ARC read arcwright's too, and the scaling decisions.
//!
//! A decision is counted by its direction (`up`, `down`, `steady`) and the
//! policy that made it, not by the policy's reason: reasons are free text
//! with numbers in them ("3 jobs assigned, 1 idle runner"), and a label per
//! distinct text would grow the series without bound. The reason is on the
//! AutoscalingRunnerSet's `status.scaling` and in its events.
//!
//! A scale set's series are removed when its listener stops, so a deleted
//! scale set does not go on reporting its last figures.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::actions::RunnerScaleSetStatistic;

/// A scale set, as ARC labels its listener's series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ScaleSetLabels {
    /// The AutoscalingRunnerSet's namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

/// A decision's labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    /// The AutoscalingRunnerSet's namespace.
    pub namespace: String,
    /// Its name.
    pub scale_set: String,
    /// The policy that decided (`builtin:default`, `configmap:ns/name`).
    pub policy: String,
    /// `up`, `down` or `steady`, against the previous decision.
    pub direction: &'static str,
}

/// The listeners' metrics; clones share the series.
#[derive(Clone, Debug, Default)]
pub struct ListenerMetrics {
    available_jobs: Family<ScaleSetLabels, Gauge>,
    acquired_jobs: Family<ScaleSetLabels, Gauge>,
    assigned_jobs: Family<ScaleSetLabels, Gauge>,
    running_jobs: Family<ScaleSetLabels, Gauge>,
    registered_runners: Family<ScaleSetLabels, Gauge>,
    busy_runners: Family<ScaleSetLabels, Gauge>,
    idle_runners: Family<ScaleSetLabels, Gauge>,
    desired_runners: Family<ScaleSetLabels, Gauge>,
    decisions: Family<DecisionLabels, Counter>,
    /// Where the scaling policies' failures are counted
    /// (`arcwright_policy_failures_total`), beside the other policy kinds'.
    policy: Option<crate::policy::metrics::PolicyMetrics>,
    /// The policies each scale set's decisions were counted under, so its
    /// decision series can go with it (a family cannot be searched by part
    /// of a label set).
    deciders: Arc<Mutex<HashMap<ScaleSetLabels, BTreeSet<String>>>>,
}

impl ListenerMetrics {
    /// The same metrics, counting scaling policy failures in `policy`.
    pub fn with_policy_metrics(self, policy: crate::policy::metrics::PolicyMetrics) -> Self {
        Self {
            policy: Some(policy),
            ..self
        }
    }

    /// What a listener's scaling policy reports through besides its status:
    /// the log line, and the failure counted where metrics are kept.
    pub(crate) fn policy_reporter(&self) -> crate::policy::reporter::TracingReporter {
        match &self.policy {
            Some(metrics) => crate::policy::reporter::TracingReporter::new(metrics.clone()),
            None => crate::policy::reporter::TracingReporter::default(),
        }
    }

    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        let gauges: [(&str, &str, &Family<ScaleSetLabels, Gauge>); 8] = [
            (
                "gha_available_jobs",
                "Jobs offered to the scale set and not acquired yet",
                &metrics.available_jobs,
            ),
            (
                "gha_acquired_jobs",
                "Jobs the scale set acquired",
                &metrics.acquired_jobs,
            ),
            (
                "gha_assigned_jobs",
                "Jobs assigned to the scale set, waiting for or running on a runner",
                &metrics.assigned_jobs,
            ),
            (
                "gha_running_jobs",
                "Jobs running on the scale set's runners",
                &metrics.running_jobs,
            ),
            (
                "gha_registered_runners",
                "Runners of the scale set registered with the service",
                &metrics.registered_runners,
            ),
            (
                "gha_busy_runners",
                "Registered runners running a job",
                &metrics.busy_runners,
            ),
            (
                "gha_idle_runners",
                "Registered runners waiting for a job",
                &metrics.idle_runners,
            ),
            (
                "gha_desired_runners",
                "Runners the scaling policy last asked for",
                &metrics.desired_runners,
            ),
        ];
        for (name, help, family) in gauges {
            registry.register(name, help, family.clone());
        }
        registry.register(
            "arcwright_scale_decisions",
            "Scaling decisions, by the policy that made them and their direction",
            metrics.decisions.clone(),
        );
        metrics
    }

    /// Records the service's latest statistics for a scale set.
    pub fn statistics(&self, scale_set: &ScaleSetLabels, statistics: &RunnerScaleSetStatistic) {
        let set = |family: &Family<ScaleSetLabels, Gauge>, value: i64| {
            family.get_or_create(scale_set).set(value);
        };
        set(&self.available_jobs, statistics.total_available_jobs);
        set(&self.acquired_jobs, statistics.total_acquired_jobs);
        set(&self.assigned_jobs, statistics.total_assigned_jobs);
        set(&self.running_jobs, statistics.total_running_jobs);
        set(
            &self.registered_runners,
            statistics.total_registered_runners,
        );
        set(&self.busy_runners, statistics.total_busy_runners);
        set(&self.idle_runners, statistics.total_idle_runners);
    }

    /// Records a decision for `desired` runners, after `previous` (none
    /// for the first since the listener started).
    pub fn decision(
        &self,
        scale_set: &ScaleSetLabels,
        policy: &str,
        previous: Option<u32>,
        desired: u32,
    ) {
        let direction = match previous {
            Some(previous) if desired > previous => "up",
            Some(previous) if desired < previous => "down",
            Some(_) => "steady",
            None if desired > 0 => "up",
            None => "steady",
        };
        self.desired_runners
            .get_or_create(scale_set)
            .set(i64::from(desired));
        self.deciders
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(scale_set.clone())
            .or_default()
            .insert(policy.to_owned());
        self.decisions
            .get_or_create(&DecisionLabels {
                namespace: scale_set.namespace.clone(),
                scale_set: scale_set.name.clone(),
                policy: policy.to_owned(),
                direction,
            })
            .inc();
    }

    /// Removes a scale set's series (its listener stopped): a deleted scale
    /// set leaves nothing behind, and a restarted listener starts its
    /// counters over, which rate() reads as a reset.
    pub fn forget(&self, scale_set: &ScaleSetLabels) {
        let policies = self
            .deciders
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(scale_set)
            .unwrap_or_default();
        for policy in policies {
            for direction in ["up", "down", "steady"] {
                self.decisions.remove(&DecisionLabels {
                    namespace: scale_set.namespace.clone(),
                    scale_set: scale_set.name.clone(),
                    policy: policy.clone(),
                    direction,
                });
            }
        }
        for family in [
            &self.available_jobs,
            &self.acquired_jobs,
            &self.assigned_jobs,
            &self.running_jobs,
            &self.registered_runners,
            &self.busy_runners,
            &self.idle_runners,
            &self.desired_runners,
        ] {
            family.remove(scale_set);
        }
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
    fn statistics_and_decisions_are_series_per_scale_set_and_go_with_it() {
        let mut registry = Registry::default();
        let metrics = ListenerMetrics::register(&mut registry);
        let set = ScaleSetLabels {
            namespace: "ci".into(),
            name: "linux".into(),
        };
        metrics.statistics(
            &set,
            &RunnerScaleSetStatistic {
                total_assigned_jobs: 4,
                total_running_jobs: 3,
                total_registered_runners: 5,
                ..RunnerScaleSetStatistic::default()
            },
        );
        metrics.decision(&set, "builtin:default", None, 5);
        metrics.decision(&set, "builtin:default", Some(5), 5);
        metrics.decision(&set, "builtin:default", Some(5), 2);
        let text = encode(&registry);
        for line in [
            r#"gha_assigned_jobs{namespace="ci",name="linux"} 4"#,
            r#"gha_running_jobs{namespace="ci",name="linux"} 3"#,
            r#"gha_registered_runners{namespace="ci",name="linux"} 5"#,
            r#"gha_desired_runners{namespace="ci",name="linux"} 2"#,
            r#"arcwright_scale_decisions_total{namespace="ci",scale_set="linux",policy="builtin:default",direction="up"} 1"#,
            r#"arcwright_scale_decisions_total{namespace="ci",scale_set="linux",policy="builtin:default",direction="steady"} 1"#,
            r#"arcwright_scale_decisions_total{namespace="ci",scale_set="linux",policy="builtin:default",direction="down"} 1"#,
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }

        metrics.forget(&set);
        let text = encode(&registry);
        assert!(!text.contains("gha_assigned_jobs{"), "{text}");
        assert!(!text.contains("gha_desired_runners{"), "{text}");
        assert!(!text.contains(r#"scale_set="linux""#), "{text}");
    }
}
