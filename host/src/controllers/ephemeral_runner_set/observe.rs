//! What a pass decides on: the set, its runners (from the watch where it
//! shows every write of the set's own, listed from the API server where it
//! does not, so a runner just created is never missed and created twice:
//! see `RunnerCache`), and what the controller remembers of the set; and
//! the answers to the plan's requests for more ([`Need`](super::plan::Need)).

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

use super::apply::new_runner;
use super::metrics::SetLabels;
use super::plan::{Creation, RunnerView, SetView};
use super::{Context, Error, SetMemory};
use crate::api::{
    EphemeralRunner, EphemeralRunnerPhase, EphemeralRunnerSet, EphemeralRunnerSpec, annotations,
    finalizers, labels,
};
use crate::backlog::{Backlogs, SetKey};
use crate::controllers::kit::finalizer;

/// A set and its runners, as one pass found them.
pub(super) struct Observed {
    /// The set's uid: what the controller remembers it under, so a set
    /// deleted and made again under its name starts afresh.
    pub uid: String,
    /// The set's namespace and name, as its metrics are labelled.
    pub metric_labels: SetLabels,
    /// Its labels on ARC's metrics.
    pub arc_labels: crate::listener::metrics::ScaleSetLabels,
    /// The set as the plan sees it, with what the controller remembers.
    pub set: SetView,
    /// Its runners as listed, for the writes that name the version read.
    pub runners: Vec<EphemeralRunner>,
    /// The same runners as the plan sees them, in the same order.
    pub views: Vec<RunnerView>,
    /// A runner as the set builds them now ([`new_runner`]), which a runner
    /// must match to be renewed.
    pub template: EphemeralRunner,
    /// The time the pass decides at.
    pub now: Timestamp,
}

impl Observed {
    /// The listed runner called `name`.
    pub fn runner(&self, name: &str) -> Option<&EphemeralRunner> {
        self.runners.iter().find(|r| r.name_any() == name)
    }
}

/// Reads the set's runners and what the controller remembers of the set.
pub(super) async fn observe(set: &EphemeralRunnerSet, ctx: &Context) -> Result<Observed, Error> {
    let namespace = set.namespace().ok_or(Error::MissingMetadata("namespace"))?;
    let name = set.name_any();
    let uid = set.uid().ok_or(Error::MissingMetadata("uid"))?;
    let set_labels = SetLabels {
        namespace: namespace.clone(),
        name: name.clone(),
    };
    ctx.metrics.reconciled(&set_labels);
    let cache = ctx.runner_cache();
    let runners = match cache
        .as_ref()
        .and_then(|c| c.runners_of(&namespace, &name, &uid))
    {
        Some(runners) => runners,
        None => {
            let api: Api<EphemeralRunner> = Api::namespaced(ctx.client.clone(), &namespace);
            let selector = format!("{}={name}", labels::EPHEMERAL_RUNNER_SET);
            let runners: Vec<EphemeralRunner> = api
                .list(&ListParams::default().labels(&selector))
                .await
                .map_err(Error::List)?
                .items
                .into_iter()
                .filter(|r| r.owner_references().iter().any(|o| o.uid == uid))
                .collect();
            if let Some(cache) = &cache {
                cache
                    .known
                    .listed(&uid, runners.iter().map(|r| &r.metadata));
            }
            runners
        }
    };
    let now = Timestamp::now();
    // What a runner built now looks like, once for the pass.
    let template = new_runner(set, Creation::default());
    let mut views: Vec<RunnerView> = runners
        .iter()
        .map(|r| runner_view(r, &template, now))
        .collect();
    heard_busy(&mut views, &ctx.backlogs, &SetKey::new(&namespace, &name));
    let memory = ctx.recall(&uid);
    Ok(Observed {
        set: set_view(set, &memory, ctx.runner_cap),
        uid,
        arc_labels: crate::listener::metrics::ScaleSetLabels::new(
            &namespace,
            &name,
            &set.spec.ephemeral_runner_spec.github_config_url,
        ),
        metric_labels: set_labels,
        runners,
        views,
        template,
        now,
    })
}

/// Marks busy the runners the listener heard start a job on the
/// registration they hold, whether or not the job's record is on their
/// status yet (with renewal in place it is written as the status budget
/// allows; see [`crate::backlog`]), and forgets the jobs heard of runners
/// the set no longer has.
fn heard_busy(views: &mut [RunnerView], backlogs: &Backlogs, set: &SetKey) {
    let present: HashSet<&str> = views.iter().map(|v| v.name.as_str()).collect();
    let jobs = backlogs.jobs_of(set, |runner| present.contains(runner));
    if jobs.is_empty() {
        return;
    }
    for view in views.iter_mut() {
        if view.runner_id != 0 && jobs.get(&view.name) == Some(&view.runner_id) {
            view.has_job = true;
        }
    }
}

/// What this controller plans for `set` as given (a copy that may be far
/// older than the cluster) with `runners` as they are now, as a host that
/// just started would (nothing remembered of the set) and with `cap` as its
/// runner cap. Nothing in the controller calls it: it is the seam the
/// stale-view check (`tests/stack/tests/stale_views.rs`) replays every
/// recorded version of every set through.
pub fn replay(
    set: &EphemeralRunnerSet,
    runners: &[EphemeralRunner],
    cap: u32,
    now: Timestamp,
) -> super::plan::Plan {
    let uid = set.uid().unwrap_or_default();
    let template = new_runner(set, Creation::default());
    let views: Vec<RunnerView> = runners
        .iter()
        .filter(|r| r.owner_references().iter().any(|o| o.uid == uid))
        .map(|r| runner_view(r, &template, now))
        .collect();
    super::plan::plan(&set_view(set, &SetMemory::default(), cap), &views)
}

/// Reads the runner `name` again, for a renewal refused because it changed
/// since the list ([`Need::Reread`](super::plan::Need::Reread)): the runner
/// and its view now, or `None` when it is gone.
pub(super) async fn reread(
    api: &Api<EphemeralRunner>,
    name: &str,
    observed: &Observed,
) -> Result<Option<(EphemeralRunner, RunnerView)>, kube::Error> {
    Ok(api.get_opt(name).await?.map(|fresh| {
        let view = runner_view(&fresh, &observed.template, observed.now);
        (fresh, view)
    }))
}

/// What the plan needs of the set, with what the controller remembers of
/// it; `replicas` is bounded by the host's runner cap, whoever wrote it.
pub(super) fn set_view(set: &EphemeralRunnerSet, memory: &SetMemory, cap: u32) -> SetView {
    SetView {
        generation: set.metadata.generation.unwrap_or_default(),
        deleting: set.metadata.deletion_timestamp.is_some(),
        has_finalizer: finalizer::held(set, &finalizers::EPHEMERAL_RUNNER_SET),
        replicas: set
            .spec
            .replicas
            .min(i32::try_from(cap).unwrap_or(i32::MAX)),
        patch_id: set.spec.patch_id,
        actionable_revision: set.spec.actionable_revision,
        status: set.status.clone().unwrap_or_default(),
        decision_applied: memory.decided.is_some() && memory.decided == set.metadata.generation,
        since_status_written: memory.status_written.map(|at| at.elapsed()),
    }
}

/// What the plan needs of a runner, at `now`; `template` is a runner its
/// set builds now ([`new_runner`]).
pub(super) fn runner_view(
    runner: &EphemeralRunner,
    template: &EphemeralRunner,
    now: Timestamp,
) -> RunnerView {
    Reading::of(runner).view(template, now)
}

/// What the plan reads of a runner, before it is set against the set's
/// template and the clock: everything [`runner_view`] is made from, and
/// nothing else. The owned watch filters on it (seed 004), so the watch
/// sees a change exactly when the view could change.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Reading<'a> {
    /// The view, but for [`RunnerView::renewable_for`], which depends on
    /// the set's template and the clock: `None` here.
    pub view: RunnerView,
    /// When its registration went (the `Registered` condition turned
    /// False), if it has: the runner's controller records it with the
    /// phase, in the same write, when the runner ends.
    pub registration_gone: Option<Timestamp>,
    /// What [`built_as`] compares with the set's template.
    pub spec: &'a EphemeralRunnerSpec,
    /// Likewise.
    pub labels: &'a BTreeMap<String, String>,
    /// Likewise.
    pub annotations: &'a BTreeMap<String, String>,
}

impl<'a> Reading<'a> {
    /// Reads `runner`. A renewed runner's patch id and set generation are
    /// its renewal's (see `RunnerRenewal`).
    pub fn of(runner: &'a EphemeralRunner) -> Self {
        let annotation = |key: &str| runner.annotations().get(key).and_then(|v| v.parse().ok());
        let status = runner.status.clone().unwrap_or_default();
        let registration_gone = status
            .condition(crate::api::ephemeral_runner::RunnerCondition::Registered.as_str())
            .filter(|c| c.status == "False")
            .map(|c| c.last_transition_time.0);
        let (patch_id, set_generation) = match &status.renewal {
            Some(renewal) => (Some(renewal.patch_id), Some(renewal.set_generation)),
            None => (
                annotation(annotations::PATCH_ID).and_then(|v: i64| i32::try_from(v).ok()),
                annotation(annotations::SET_GENERATION),
            ),
        };
        Self {
            view: RunnerView {
                name: runner.name_any(),
                created: runner.metadata.creation_timestamp.clone(),
                deleting: runner.metadata.deletion_timestamp.is_some(),
                phase: status.phase,
                runner_id: status.runner_id,
                has_job: status.has_job(),
                job_ended: status.job_ended(),
                patch_id,
                revision: annotation(annotations::REVISION).unwrap_or(0),
                set_generation,
                renewable_for: None,
            },
            registration_gone,
            spec: &runner.spec,
            labels: runner.labels(),
            annotations: runner.annotations(),
        }
    }

    /// The view at `now`, against `template`: a runner that succeeded with
    /// its registration gone, and is built as `template`, is renewable for
    /// as long as it has been so.
    pub fn view(&self, template: &EphemeralRunner, now: Timestamp) -> RunnerView {
        let renewable_for = self
            .registration_gone
            .filter(|_| self.view.phase == Some(EphemeralRunnerPhase::Succeeded))
            .filter(|_| self.built_as(template))
            .map(|since| Duration::try_from(now.duration_since(since)).unwrap_or(Duration::ZERO));
        RunnerView {
            renewable_for,
            ..self.view.clone()
        }
    }

    /// Whether the runner has the spec, labels and annotations of
    /// `template`, a runner the set creates now. A renewal keeps the object
    /// as it is, so a runner built from an older template (a metadata
    /// change does not move the revision) is not renewed: it ends, and a
    /// new one is built.
    fn built_as(&self, template: &EphemeralRunner) -> bool {
        crate::backlog::built_as(self.spec, self.labels, self.annotations, template)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{EphemeralRunnerSetSpec, EphemeralRunnerStatus, ResourceMeta};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    fn set(team: &str, image: &str) -> EphemeralRunnerSet {
        let mut spec = EphemeralRunnerSetSpec::default();
        spec.ephemeral_runner_spec.spec.containers = vec![k8s_openapi::api::core::v1::Container {
            name: "runner".into(),
            image: Some(image.into()),
            ..Default::default()
        }];
        spec.ephemeral_runner_metadata = Some(ResourceMeta {
            labels: Some([("team".to_string(), team.to_string())].into()),
            ..Default::default()
        });
        let mut set = EphemeralRunnerSet::new("linux", spec);
        set.metadata.namespace = Some("ns".into());
        set.metadata.uid = Some("uid".into());
        set
    }

    #[test]
    fn only_a_runner_built_as_the_set_builds_them_now_is_renewable() {
        let now: Timestamp = "2026-12-01T00:00:10Z".parse().unwrap();
        let current = set("ci", "runner:1");
        let mut runner = new_runner(&current, Creation::default());
        runner.metadata.name = Some("linux-runner-a".into());
        runner.status = Some(EphemeralRunnerStatus {
            phase: Some(EphemeralRunnerPhase::Succeeded),
            conditions: vec![Condition {
                type_: "Registered".into(),
                status: "False".into(),
                reason: "SelfDeregistered".into(),
                message: String::new(),
                last_transition_time: Time("2026-12-01T00:00:07Z".parse().unwrap()),
                observed_generation: None,
            }],
            ..Default::default()
        });
        let renewable = |set: &EphemeralRunnerSet| {
            runner_view(&runner, &new_runner(set, Creation::default()), now).renewable_for
        };
        assert_eq!(renewable(&current), Some(Duration::from_secs(3)));
        assert_eq!(
            renewable(&set("platform", "runner:1")),
            None,
            "metadata changed"
        );
        assert_eq!(renewable(&set("ci", "runner:2")), None, "spec changed");
    }

    #[test]
    fn a_set_holding_the_finalizer_under_its_former_name_holds_it() {
        let mut old = set("ci", "runner:1");
        old.metadata.finalizers = Some(vec!["ephemeralrunnerset.arcwright.dev/finalizer".into()]);
        assert!(set_view(&old, &SetMemory::default(), 1000).has_finalizer);
        let none = set("ci", "runner:1");
        assert!(!set_view(&none, &SetMemory::default(), 1000).has_finalizer);
    }

    #[test]
    fn replicas_are_held_to_the_hosts_cap_whoever_wrote_them() {
        let mut huge = set("ci", "runner:1");
        huge.spec.replicas = 2_000_000_000;
        assert_eq!(set_view(&huge, &SetMemory::default(), 1000).replicas, 1000);
        huge.spec.replicas = 12;
        assert_eq!(set_view(&huge, &SetMemory::default(), 1000).replicas, 12);
    }
}
