//! What the listeners report to Prometheus, under the names and labels
//! actions-runner-controller's listener and controller use (`gha_*`), so
//! dashboards and alerts written for ARC read arcwright's unchanged: the
//! service's statistics per scale set, the scale set's bounds, whether its
//! listener runs, and per job its start and completion with the startup
//! and execution durations; beside them arcwright's own, the scaling
//! decisions.
//!
//! A decision is counted by its direction (`up`, `down`, `steady`) and the
//! policy that made it, not by the policy's reason: reasons are free text
//! with numbers in them ("3 jobs assigned, 1 idle runner"), and a label per
//! distinct text would grow the series without bound. The reason is on the
//! AutoscalingRunnerSet's `status.scaling` and in its events. The per-job
//! metrics carry what `listenerMetrics` chooses ([`JobMetricLabels`]); the
//! default leaves out the job's name, which would be a series per job name.
//! Chosen labels are still values anyone opening a pull request writes (a
//! job's name, a branch), so a scale set keeps at most
//! [`JOB_SERIES_PER_SCALE_SET`] per-job series: a job whose series would be
//! one more is not recorded, and `arcwright_job_series_dropped_total` counts
//! it, so the cap shows instead of skewing the figures unseen.
//!
//! A scale set's series are removed when its listener stops, so a deleted
//! scale set does not go on reporting its last figures.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::actions::{ConfigUrl, JobInfo, RunnerScaleSetStatistic, Scope};
use crate::api::shared::{JobLabel, MetricsConfig};

/// A scale set, as ARC labels its listener's and controller's series: the
/// AutoscalingRunnerSet's name and namespace, and the enterprise,
/// organisation and repository of its configuration URL (empty where the
/// URL has none, as in ARC).
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ScaleSetLabels {
    /// The AutoscalingRunnerSet's name.
    pub name: String,
    /// Its namespace.
    pub namespace: String,
    /// The enterprise of an enterprise URL.
    pub enterprise: String,
    /// The organisation, or the repository's owner.
    pub organization: String,
    /// The repository of a repository URL.
    pub repository: String,
}

impl ScaleSetLabels {
    /// The labels of the set `namespace/name` registering at `config_url`.
    pub fn new(namespace: &str, name: &str, config_url: &str) -> Self {
        let mut labels = Self {
            name: name.to_owned(),
            namespace: namespace.to_owned(),
            ..Self::default()
        };
        // A URL that does not parse has no scope to say; the set reports
        // the URL's error on its status.
        if let Ok(url) = ConfigUrl::parse(config_url) {
            match url.scope() {
                Scope::Enterprise { enterprise } => labels.enterprise = enterprise.clone(),
                Scope::Organization { organization } => {
                    labels.organization = organization.clone();
                }
                Scope::Repository { owner, repository } => {
                    labels.organization = owner.clone();
                    labels.repository = repository.clone();
                }
            }
        }
        labels
    }

    fn key(&self) -> (String, String) {
        (self.namespace.clone(), self.name.clone())
    }
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

/// A shadow decision's labels: how its answer compared with the active
/// policy's, `same`, `higher` or `lower`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShadowLabels {
    /// The AutoscalingRunnerSet's namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// `same`, `higher`, `lower`, or `failed` when the shadow gave no
    /// answer.
    pub agreement: &'static str,
}

/// A scale set by its name alone: for its shadow's desired runners and its
/// dropped job series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SetNameLabels {
    /// The AutoscalingRunnerSet's namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

/// The most per-job series one scale set has, over the four per-job
/// families: a few hundred repositories or job names with their results
/// fit; past it a cardinality a tenant chose fills the host's memory and
/// the Prometheus server's.
pub const JOB_SERIES_PER_SCALE_SET: usize = 512;

/// The per-job metrics' names, as ARC's.
pub mod job_metrics {
    /// Jobs a runner of the scale set started.
    pub const STARTED: &str = "gha_started_jobs_total";
    /// Jobs of the scale set that completed.
    pub const COMPLETED: &str = "gha_completed_jobs_total";
    /// From the job's assignment to the scale set to a runner's.
    pub const STARTUP: &str = "gha_job_startup_duration_seconds";
    /// From the runner's assignment to the job's end.
    pub const EXECUTION: &str = "gha_job_execution_duration_seconds";
}

/// The labels each per-job metric of a scale set carries, beside `name` and
/// `namespace` (always): ARC's `listenerMetrics` for the four job metrics,
/// or the low-cardinality default for those it does not name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobMetricLabels {
    /// `gha_started_jobs_total`'s.
    pub started: Vec<JobLabel>,
    /// `gha_completed_jobs_total`'s.
    pub completed: Vec<JobLabel>,
    /// `gha_job_startup_duration_seconds`'.
    pub startup: Vec<JobLabel>,
    /// `gha_job_execution_duration_seconds`'.
    pub execution: Vec<JobLabel>,
}

impl Default for JobMetricLabels {
    fn default() -> Self {
        use JobLabel::{Enterprise, EventName, JobResult, Organization, Repository};
        let job = vec![Enterprise, Organization, Repository, EventName];
        let ended = [job.as_slice(), &[JobResult]].concat();
        Self {
            started: job.clone(),
            completed: ended.clone(),
            startup: job,
            execution: ended,
        }
    }
}

impl JobMetricLabels {
    /// The choice `config` makes, the default for what it does not name.
    pub fn from_config(config: Option<&MetricsConfig>) -> Self {
        let mut labels = Self::default();
        let Some(config) = config else { return labels };
        let chosen = |found: Option<&Vec<JobLabel>>, into: &mut Vec<JobLabel>| {
            if let Some(found) = found {
                into.clone_from(found);
            }
        };
        chosen(
            config.counters.get(job_metrics::STARTED).map(|m| &m.labels),
            &mut labels.started,
        );
        chosen(
            config
                .counters
                .get(job_metrics::COMPLETED)
                .map(|m| &m.labels),
            &mut labels.completed,
        );
        chosen(
            config
                .histograms
                .get(job_metrics::STARTUP)
                .map(|m| &m.labels),
            &mut labels.startup,
        );
        chosen(
            config
                .histograms
                .get(job_metrics::EXECUTION)
                .map(|m| &m.labels),
            &mut labels.execution,
        );
        labels
    }
}

/// A per-job series' labels, in the order chosen.
type JobSeries = Vec<(String, String)>;

/// The per-job series one scale set has made.
type JobSeriesSet = HashSet<JobSeries>;

/// The workflow file's name without extension, and the ref it ran on
/// without `refs/` (a pull request's as `pull/N`), from a job's
/// `owner/repo/.github/workflows/file.yml@ref`, as ARC's parser reads it.
fn workflow_parts(job_workflow_ref: &str) -> (String, String) {
    let (path, target) = job_workflow_ref
        .split_once('@')
        .unwrap_or((job_workflow_ref, ""));
    let file = path.rsplit('/').next().unwrap_or_default();
    let name = file
        .strip_suffix(".yml")
        .or_else(|| file.strip_suffix(".yaml"))
        .unwrap_or(file);
    let target = target.strip_prefix("refs/").unwrap_or(target);
    let target = match target.strip_prefix("pull/") {
        Some(rest) => format!("pull/{}", rest.split('/').next().unwrap_or_default()),
        None => target.to_owned(),
    };
    (name.to_owned(), target)
}

/// The series of `job` under `chosen`, for the scale set `scale_set`.
fn job_series(
    scale_set: &ScaleSetLabels,
    chosen: &[JobLabel],
    job: &JobInfo,
    result: Option<&str>,
) -> JobSeries {
    let mut series = vec![
        ("name".to_owned(), scale_set.name.clone()),
        ("namespace".to_owned(), scale_set.namespace.clone()),
    ];
    let (workflow_name, workflow_target) = workflow_parts(&job.job_workflow_ref);
    for label in chosen {
        let (key, value) = match label {
            JobLabel::Name | JobLabel::Namespace => continue,
            JobLabel::Enterprise => ("enterprise", scale_set.enterprise.clone()),
            // The job's, as ARC labels it: the owner and repository the job
            // ran for (an organisation or enterprise scale set serves many).
            JobLabel::Organization => ("organization", job.owner_name.clone()),
            JobLabel::Repository => ("repository", job.repository_name.clone()),
            JobLabel::JobName => ("job_name", job.job_display_name.clone()),
            JobLabel::EventName => ("event_name", job.event_name.clone()),
            JobLabel::JobWorkflowRef => ("job_workflow_ref", job.job_workflow_ref.clone()),
            JobLabel::JobWorkflowName => ("job_workflow_name", workflow_name.clone()),
            JobLabel::JobWorkflowTarget => ("job_workflow_target", workflow_target.clone()),
            JobLabel::JobResult => match result {
                Some(result) => ("job_result", result.to_owned()),
                None => continue,
            },
        };
        if !series.iter().any(|(k, _)| k == key) {
            series.push((key.to_owned(), value));
        }
    }
    series
}

/// ARC's buckets of the job durations, in seconds: 10 ms to an hour.
const DURATION_BUCKETS: [f64; 45] = [
    0.01, 0.05, 0.1, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 12.0, 15.0, 18.0,
    20.0, 25.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0, 110.0, 120.0, 150.0, 180.0, 210.0,
    240.0, 300.0, 360.0, 420.0, 480.0, 540.0, 600.0, 900.0, 1200.0, 1800.0, 2400.0, 3000.0, 3600.0,
];

type HistogramBuilder = fn() -> Histogram;

fn duration_histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS)
}

/// The per-job families.
#[derive(Clone, Debug)]
struct JobFamilies {
    started: Family<JobSeries, Counter>,
    completed: Family<JobSeries, Counter>,
    startup: Family<JobSeries, Histogram, HistogramBuilder>,
    execution: Family<JobSeries, Histogram, HistogramBuilder>,
}

impl Default for JobFamilies {
    fn default() -> Self {
        Self {
            started: Family::default(),
            completed: Family::default(),
            startup: Family::new_with_constructor(duration_histogram),
            execution: Family::new_with_constructor(duration_histogram),
        }
    }
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
    min_runners: Family<ScaleSetLabels, Gauge>,
    max_runners: Family<ScaleSetLabels, Gauge>,
    running_listeners: Family<ScaleSetLabels, Gauge>,
    jobs: JobFamilies,
    decisions: Family<DecisionLabels, Counter>,
    shadow_decisions: Family<ShadowLabels, Counter>,
    shadow_desired: Family<SetNameLabels, Gauge>,
    /// Job observations not recorded because their scale set had its
    /// [`JOB_SERIES_PER_SCALE_SET`].
    job_series_dropped: Family<SetNameLabels, Counter>,
    /// Where the scaling policies' failures are counted
    /// (`arcwright_policy_failures_total`), beside the other policy kinds'.
    policy: Option<crate::policy::metrics::PolicyMetrics>,
    /// The policies each scale set's decisions were counted under, so its
    /// decision series can go with it (a family cannot be searched by part
    /// of a label set).
    deciders: Arc<Mutex<HashMap<ScaleSetLabels, BTreeSet<String>>>>,
    /// The per-job series of each scale set (by namespace and name), for
    /// the same reason.
    job_series: Arc<Mutex<HashMap<(String, String), JobSeriesSet>>>,
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
        let gauges: [(&str, &str, &Family<ScaleSetLabels, Gauge>); 11] = [
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
            (
                "gha_min_runners",
                "The scale set's minRunners",
                &metrics.min_runners,
            ),
            (
                "gha_max_runners",
                "The scale set's maxRunners (the host's runner cap when it has none)",
                &metrics.max_runners,
            ),
            (
                "gha_controller_running_listeners",
                "Listeners running, one per scale set",
                &metrics.running_listeners,
            ),
        ];
        for (name, help, family) in gauges {
            registry.register(name, help, family.clone());
        }
        // prometheus-client adds `_total` to counters itself.
        registry.register(
            job_metrics::STARTED.trim_end_matches("_total"),
            "Jobs a runner of the scale set started",
            metrics.jobs.started.clone(),
        );
        registry.register(
            job_metrics::COMPLETED.trim_end_matches("_total"),
            "Jobs of the scale set that completed, by result",
            metrics.jobs.completed.clone(),
        );
        registry.register(
            job_metrics::STARTUP,
            "From a job's assignment to the scale set to a runner's (runnerAssignTime - scaleSetAssignTime)",
            metrics.jobs.startup.clone(),
        );
        registry.register(
            job_metrics::EXECUTION,
            "From a runner's assignment to the job's end (finishTime - runnerAssignTime)",
            metrics.jobs.execution.clone(),
        );
        registry.register(
            "arcwright_scale_decisions",
            "Scaling decisions, by the policy that made them and their direction",
            metrics.decisions.clone(),
        );
        registry.register(
            "arcwright_shadow_decisions",
            "Shadow scaling decisions, by how they compared with the active policy's",
            metrics.shadow_decisions.clone(),
        );
        registry.register(
            "arcwright_shadow_desired_runners",
            "The runners the shadow scaling policy last asked for (never applied)",
            metrics.shadow_desired.clone(),
        );
        registry.register(
            "arcwright_job_series_dropped",
            "Job observations not recorded because the scale set had as many per-job series as it may keep",
            metrics.job_series_dropped.clone(),
        );
        metrics
    }

    /// A shadow decision: `desired` when the shadow answered, compared as
    /// `agreement` (`failed` when it did not).
    pub fn shadow(
        &self,
        scale_set: &ScaleSetLabels,
        agreement: &'static str,
        desired: Option<u32>,
    ) {
        self.shadow_decisions
            .get_or_create(&ShadowLabels {
                namespace: scale_set.namespace.clone(),
                name: scale_set.name.clone(),
                agreement,
            })
            .inc();
        if let Some(desired) = desired {
            self.shadow_desired
                .get_or_create(&SetNameLabels {
                    namespace: scale_set.namespace.clone(),
                    name: scale_set.name.clone(),
                })
                .set(i64::from(desired));
        }
    }

    /// A listener of `scale_set` started with these bounds.
    pub fn started(&self, scale_set: &ScaleSetLabels, min_runners: u32, max_runners: u32) {
        self.min_runners
            .get_or_create(scale_set)
            .set(i64::from(min_runners));
        self.max_runners
            .get_or_create(scale_set)
            .set(i64::from(max_runners));
        self.running_listeners.get_or_create(scale_set).set(1);
    }

    /// A runner of `scale_set` started `job`.
    pub fn job_started(&self, scale_set: &ScaleSetLabels, labels: &JobMetricLabels, job: &JobInfo) {
        let series = job_series(scale_set, &labels.started, job, None);
        if self.admit(scale_set, series.clone()) {
            self.jobs.started.get_or_create(&series).inc();
        }
        // ARC's startup: from the scale set's assignment to the runner's.
        if let (Some(assigned), Some(runner)) = (job.scale_set_assign_time, job.runner_assign_time)
        {
            let startup = job_series(scale_set, &labels.startup, job, None);
            if self.admit(scale_set, startup.clone()) {
                let seconds = runner.duration_since(assigned).as_secs_f64().max(0.0);
                self.jobs.startup.get_or_create(&startup).observe(seconds);
            }
        }
    }

    /// `job` of `scale_set` completed with `result`.
    pub fn job_completed(
        &self,
        scale_set: &ScaleSetLabels,
        labels: &JobMetricLabels,
        job: &JobInfo,
        result: &str,
    ) {
        let series = job_series(scale_set, &labels.completed, job, Some(result));
        if self.admit(scale_set, series.clone()) {
            self.jobs.completed.get_or_create(&series).inc();
        }
        // ARC's execution: from the runner's assignment to the end; none
        // for a job no runner took (canceled while queued).
        if let (Some(runner), Some(finished)) = (job.runner_assign_time, job.finish_time) {
            let execution = job_series(scale_set, &labels.execution, job, Some(result));
            if self.admit(scale_set, execution.clone()) {
                let seconds = finished.duration_since(runner).as_secs_f64().max(0.0);
                self.jobs
                    .execution
                    .get_or_create(&execution)
                    .observe(seconds);
            }
        }
    }

    /// Whether `series` may be recorded for `scale_set`: one it has, or a
    /// new one within [`JOB_SERIES_PER_SCALE_SET`] (remembered, so it goes
    /// with the set). A refusal is counted.
    fn admit(&self, scale_set: &ScaleSetLabels, series: JobSeries) -> bool {
        let admitted = {
            let mut sets = self.job_series.lock().unwrap_or_else(|e| e.into_inner());
            let known = sets.entry(scale_set.key()).or_default();
            known.contains(&series)
                || (known.len() < JOB_SERIES_PER_SCALE_SET && known.insert(series))
        };
        if !admitted {
            self.job_series_dropped
                .get_or_create(&SetNameLabels {
                    namespace: scale_set.namespace.clone(),
                    name: scale_set.name.clone(),
                })
                .inc();
        }
        admitted
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
            &self.min_runners,
            &self.max_runners,
            &self.running_listeners,
        ] {
            family.remove(scale_set);
        }
        for agreement in ["same", "higher", "lower", "failed"] {
            self.shadow_decisions.remove(&ShadowLabels {
                namespace: scale_set.namespace.clone(),
                name: scale_set.name.clone(),
                agreement,
            });
        }
        let set_name = SetNameLabels {
            namespace: scale_set.namespace.clone(),
            name: scale_set.name.clone(),
        };
        self.shadow_desired.remove(&set_name);
        self.job_series_dropped.remove(&set_name);
        let series = self
            .job_series
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&scale_set.key())
            .unwrap_or_default();
        for series in &series {
            self.jobs.started.remove(series);
            self.jobs.completed.remove(series);
            self.jobs.startup.remove(series);
            self.jobs.execution.remove(series);
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
        let set = ScaleSetLabels::new("ci", "linux", "https://github.com/octo");
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
            r#"gha_assigned_jobs{name="linux",namespace="ci",enterprise="",organization="octo",repository=""} 4"#,
            r#"gha_running_jobs{name="linux",namespace="ci",enterprise="",organization="octo",repository=""} 3"#,
            r#"gha_registered_runners{name="linux",namespace="ci",enterprise="",organization="octo",repository=""} 5"#,
            r#"gha_desired_runners{name="linux",namespace="ci",enterprise="",organization="octo",repository=""} 2"#,
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

    fn job(display: &str) -> JobInfo {
        let at = |secs: i64| Some(jiff::Timestamp::from_second(1_700_000_000 + secs).unwrap());
        JobInfo {
            repository_name: "hello".into(),
            owner_name: "octo".into(),
            job_display_name: display.into(),
            event_name: "push".into(),
            job_workflow_ref: "octo/hello/.github/workflows/ci.yaml@refs/pull/42/merge".into(),
            scale_set_assign_time: at(0),
            runner_assign_time: at(3),
            finish_time: at(63),
            ..JobInfo::default()
        }
    }

    #[test]
    fn jobs_are_counted_and_timed_as_arc_does_with_the_labels_chosen() {
        let mut registry = Registry::default();
        let metrics = ListenerMetrics::register(&mut registry);
        let set = ScaleSetLabels::new("ci", "linux", "https://github.com/octo");
        metrics.started(&set, 1, 10);
        let default = JobMetricLabels::default();
        metrics.job_started(&set, &default, &job("build"));
        metrics.job_completed(&set, &default, &job("build"), "succeeded");
        metrics.job_completed(&set, &default, &job("test"), "failed");
        let text = encode(&registry);
        let labels = r#"name="linux",namespace="ci",enterprise="",organization="octo",repository="hello",event_name="push""#;
        for line in [
            r#"gha_min_runners{name="linux",namespace="ci",enterprise="",organization="octo",repository=""} 1"#.to_owned(),
            r#"gha_max_runners{name="linux",namespace="ci",enterprise="",organization="octo",repository=""} 10"#.to_owned(),
            r#"gha_controller_running_listeners{name="linux",namespace="ci",enterprise="",organization="octo",repository=""} 1"#.to_owned(),
            format!("gha_started_jobs_total{{{labels}}} 1"),
            // The two jobs' names are not labels by default: one series.
            format!(r#"gha_completed_jobs_total{{{labels},job_result="succeeded"}} 1"#),
            format!(r#"gha_completed_jobs_total{{{labels},job_result="failed"}} 1"#),
            format!("gha_job_startup_duration_seconds_sum{{{labels}}} 3.0"),
            format!(r#"gha_job_execution_duration_seconds_sum{{{labels},job_result="succeeded"}} 60.0"#),
            format!(r#"gha_job_execution_duration_seconds_bucket{{le="60.0",{labels},job_result="succeeded"}} 1"#),
        ] {
            assert!(text.contains(&line), "{line} in {text}");
        }

        // listenerMetrics chooses: the job's name and workflow, no result.
        let config: MetricsConfig = serde_json::from_value(serde_json::json!({
            "counters": {"gha_completed_jobs_total": {"labels": ["job_name", "job_workflow_name", "job_workflow_target"]}}
        }))
        .unwrap();
        let chosen = JobMetricLabels::from_config(Some(&config));
        assert_eq!(chosen.started, default.started, "the rest keep the default");
        metrics.job_completed(&set, &chosen, &job("lint"), "succeeded");
        let text = encode(&registry);
        let line = r#"gha_completed_jobs_total{name="linux",namespace="ci",job_name="lint",job_workflow_name="ci",job_workflow_target="pull/42"} 1"#;
        assert!(text.contains(line), "{line} in {text}");

        metrics.forget(&set);
        let text = encode(&registry);
        assert!(!text.contains(r#"name="linux""#), "{text}");
    }

    #[test]
    fn a_scale_set_keeps_at_most_its_job_series_and_counts_what_it_dropped() {
        let mut registry = Registry::default();
        let metrics = ListenerMetrics::register(&mut registry);
        let set = ScaleSetLabels::new("ci", "linux", "https://github.com/octo");
        let other = ScaleSetLabels::new("ci", "arm", "https://github.com/octo");
        // Every pull request names its job anew.
        let config: MetricsConfig = serde_json::from_value(serde_json::json!({
            "counters": {"gha_completed_jobs_total": {"labels": ["job_name"]}}
        }))
        .unwrap();
        let chosen = JobMetricLabels::from_config(Some(&config));
        let extra = 20;
        for n in 0..JOB_SERIES_PER_SCALE_SET + extra {
            metrics.job_completed(&set, &chosen, &job(&format!("pr-{n}")), "succeeded");
        }
        // A series the set has is still counted past the cap.
        metrics.job_completed(&set, &chosen, &job("pr-0"), "succeeded");
        metrics.job_completed(&other, &chosen, &job("lint"), "succeeded");
        let text = encode(&registry);
        let series = |family: &str, set: &str| {
            text.lines()
                .filter(|line| {
                    line.starts_with(&format!("{family}{{"))
                        && line.contains(&format!(r#"name="{set}""#))
                })
                .count()
        };
        // The execution histograms of the same jobs share the budget.
        let kept = series("gha_completed_jobs_total", "linux")
            + series("gha_job_execution_duration_seconds_count", "linux");
        assert_eq!(kept, JOB_SERIES_PER_SCALE_SET, "{text}");
        assert!(
            text.contains(
                r#"gha_completed_jobs_total{name="linux",namespace="ci",job_name="pr-0"} 2"#
            ),
            "{text}"
        );
        // The execution series (default labels) is one for every job, so
        // 511 names fit beside it and the other 21 jobs' counts dropped.
        let dropped = format!(
            r#"arcwright_job_series_dropped_total{{namespace="ci",name="linux"}} {}"#,
            extra + 1
        );
        assert!(text.contains(&dropped), "{dropped} in {text}");
        // Another set has a budget of its own.
        assert_eq!(series("gha_completed_jobs_total", "arm"), 1);
        metrics.forget(&set);
        assert!(!encode(&registry).contains("arcwright_job_series_dropped_total{"));
    }
}
