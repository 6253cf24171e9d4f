//! The owned watch: which EphemeralRunner events wake their set.
//!
//! A runner's status is written often by others: readiness, failure
//! bookkeeping, the job details the listener records, messages. Little of it
//! is input to the set, yet every such write would enqueue a reconcile of
//! the set, which lists all its runners. So an update is dropped when what
//! the plan reads of the runner is unchanged (seed 004): the projection is
//! made by the function that makes the plan's view of a runner
//! ([`Reading`](super::observe::Reading), which [`runner_view`] is built
//! from), so the two cannot drift apart. What the view computes from the
//! clock and the set's template (how long a runner has been renewable) is
//! projected as its inputs: when its registration went, its phase, and its
//! spec, labels and annotations.
//!
//! Two parts of the view are projected as far as the plan reads them:
//! - the job's end is read only of a runner that succeeded (rule 5 of the
//!   plan: a record that lands after the runner succeeded can free its
//!   place under a decision already applied), so it is projected only
//!   there;
//! - a job recorded on a runner (the busy signal) gives the set nothing to
//!   do: it only takes the runner out of what scale-down, a revision's
//!   cleanup or the set's deletion may remove, and every such removal
//!   deletes with the resourceVersion the pass read as a precondition, so a
//!   job recorded after the read makes the deletion fail (and the pass
//!   retried) rather than cancel the job. So a job recorded, with nothing
//!   else changed, is dropped; a record that goes away is delivered.
//!
//! A predicate may only ever be an optimisation, so everything else is
//! delivered: a runner seen for the first time, and a deletion, including
//! that of a runner that vanished while the watch was re-listing (the
//! watch comes through [`with_vanished`](crate::controllers::kit::relist::with_vanished)).
//!
//! [`runner_view`]: super::observe::runner_view

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use kube::Resource;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

use super::observe::Reading;
use super::plan::RunnerView;
use crate::api::{EphemeralRunner, EphemeralRunnerPhase, EphemeralRunnerSet};

/// What the set reconciler reads of a runner, as the filter keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Projection {
    /// Everything the plan's view is made from but the busy signal, hashed.
    read: u64,
    /// Whether a job is recorded on it ([`RunnerView::has_job`]).
    has_job: bool,
}

impl Projection {
    /// Whether a runner that was `self` and is now `now` can give its set
    /// something to do.
    fn wakes(self, now: Self) -> bool {
        self.read != now.read || (self.has_job && !now.has_job)
    }
}

/// What the set reconciler reads of a runner: its [`Reading`], and which
/// set's runner it is (the pass keeps only the runners its set owns).
pub fn projection(runner: &EphemeralRunner) -> Projection {
    let reading = Reading::of(runner);
    // Every field of the view, by name: a field added to it does not
    // compile until it is placed here.
    let RunnerView {
        name,
        created,
        deleting,
        phase,
        runner_id,
        has_job,
        job_ended,
        patch_id,
        revision,
        set_generation,
        // Always `None` in a reading: its inputs are projected below.
        renewable_for: _,
    } = &reading.view;
    let succeeded = *phase == Some(EphemeralRunnerPhase::Succeeded);
    let read = (
        (
            name,
            created.as_ref().map(|t| t.0),
            deleting,
            phase,
            runner_id,
        ),
        (*job_ended && succeeded, patch_id, revision, set_generation),
        reading.registration_gone,
        bytes(reading.spec),
        reading.labels,
        reading.annotations,
        bytes(&runner.metadata.owner_references),
    );
    let mut hasher = DefaultHasher::new();
    read.hash(&mut hasher);
    Projection {
        read: hasher.finish(),
        has_job: *has_job,
    }
}

/// A stable byte form of a k8s-openapi type, which has no `Hash`; the types
/// are ours and k8s-openapi's, so this cannot fail short of a bug.
fn bytes(value: &impl serde::Serialize) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_default()
}

/// The set that controls a runner, if any.
pub fn owner(runner: &EphemeralRunner) -> Option<ObjectRef<EphemeralRunnerSet>> {
    let namespace = runner.metadata.namespace.as_deref()?;
    runner
        .metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| {
            o.controller == Some(true)
                && o.kind == EphemeralRunnerSet::kind(&())
                && o.api_version == EphemeralRunnerSet::api_version(&())
        })
        .map(|o| ObjectRef::new(&o.name).within(namespace))
}

/// One runner event, judged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Judged {
    /// The set to wake.
    pub owner: ObjectRef<EphemeralRunnerSet>,
    /// Whether it is delivered (false: dropped as unchanged).
    pub delivered: bool,
}

/// The projection of every runner last delivered, by uid.
#[derive(Debug, Default)]
pub struct RunnerFilter {
    seen: HashMap<String, Projection>,
}

impl RunnerFilter {
    /// Judges one watch event: the owners to wake, or the update dropped.
    pub fn judge(&mut self, event: watcher::Event<EphemeralRunner>) -> Vec<Judged> {
        match event {
            watcher::Event::Apply(runner) | watcher::Event::InitApply(runner) => {
                self.apply(&runner).into_iter().collect()
            }
            watcher::Event::Delete(runner) => {
                if let Some(uid) = &runner.metadata.uid {
                    self.seen.remove(uid);
                }
                owner(&runner)
                    .map(|owner| Judged {
                        owner,
                        delivered: true,
                    })
                    .into_iter()
                    .collect()
            }
            watcher::Event::Init | watcher::Event::InitDone => Vec::new(),
        }
    }

    fn apply(&mut self, runner: &EphemeralRunner) -> Option<Judged> {
        let owner = owner(runner);
        let projection = projection(runner);
        let changed = match &runner.metadata.uid {
            Some(uid) => {
                let previous = self.seen.insert(uid.clone(), projection);
                previous.is_none_or(|p| p.wakes(projection))
            }
            None => true,
        };
        owner.map(|owner| Judged {
            owner,
            delivered: changed,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{EphemeralRunnerPhase, EphemeralRunnerStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn runner(uid: &str) -> EphemeralRunner {
        let mut r = EphemeralRunner::new(uid, Default::default());
        r.metadata.namespace = Some("ns".into());
        r.metadata.uid = Some(uid.into());
        r.metadata.resource_version = Some("1".into());
        r.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "arcwright.dev/v1alpha1".into(),
            kind: "EphemeralRunnerSet".into(),
            name: "set".into(),
            uid: "set-uid".into(),
            controller: Some(true),
            ..Default::default()
        }]);
        r.status = Some(EphemeralRunnerStatus::default());
        r
    }

    fn status(r: &mut EphemeralRunner) -> &mut EphemeralRunnerStatus {
        r.metadata.resource_version = Some(format!(
            "{}",
            r.metadata
                .resource_version
                .as_deref()
                .unwrap()
                .parse::<u64>()
                .unwrap()
                + 1
        ));
        r.status.as_mut().unwrap()
    }

    fn delivered(filter: &mut RunnerFilter, r: &EphemeralRunner) -> bool {
        let judged = filter.judge(watcher::Event::Apply(r.clone()));
        assert_eq!(judged.len(), 1);
        assert_eq!(judged[0].owner, ObjectRef::new("set").within("ns"));
        judged[0].delivered
    }

    #[test]
    fn updates_outside_the_projection_are_dropped_and_inside_delivered() {
        let mut filter = RunnerFilter::default();
        let mut r = runner("a");
        assert!(delivered(&mut filter, &r), "first sight");
        status(&mut r).message = Some("pulling".into());
        assert!(!delivered(&mut filter, &r), "message");
        status(&mut r).ready = true;
        status(&mut r).job_display_name = Some("build".into());
        status(&mut r).failures.insert(
            "pod".into(),
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                "2026-01-01T00:00:00Z".parse().unwrap(),
            ),
        );
        assert!(
            !delivered(&mut filter, &r),
            "readiness, job details, failures"
        );
        status(&mut r).phase = Some(EphemeralRunnerPhase::Running);
        assert!(delivered(&mut filter, &r), "phase");
        status(&mut r).runner_id = 7;
        assert!(delivered(&mut filter, &r), "runner id");
        r.metadata.labels = Some([("x".to_string(), "y".to_string())].into());
        assert!(delivered(&mut filter, &r), "metadata");
        r.spec.runner_scale_set_id = 3;
        assert!(delivered(&mut filter, &r), "spec");
    }

    #[test]
    fn deletions_and_runners_gone_during_a_relist_are_always_delivered() {
        let mut filter = RunnerFilter::default();
        let mut relist = crate::controllers::kit::relist::Relist::default();
        let mut judge = |event| -> Vec<Judged> {
            relist
                .observe(event)
                .into_iter()
                .flat_map(|event| filter.judge(event))
                .collect()
        };
        let (a, b) = (runner("a"), runner("b"));
        judge(watcher::Event::Apply(a.clone()));
        judge(watcher::Event::Apply(b.clone()));
        let judged = judge(watcher::Event::Delete(a.clone()));
        assert!(
            judged[0].delivered,
            "an unchanged deleted object still wakes"
        );
        judge(watcher::Event::Apply(a.clone()));

        assert!(judge(watcher::Event::Init).is_empty());
        let relisted = judge(watcher::Event::InitApply(a.clone()));
        assert!(!relisted[0].delivered, "unchanged across the relist");
        let gone = judge(watcher::Event::InitDone);
        assert_eq!(gone.len(), 1, "b vanished while the watch was down");
        assert!(gone[0].delivered);
        assert_eq!(gone[0].owner.name, "set");
        assert!(judge(watcher::Event::InitDone).is_empty());
    }

    #[test]
    fn runners_without_a_controlling_set_wake_nothing() {
        let mut filter = RunnerFilter::default();
        let mut r = runner("a");
        r.metadata.owner_references = None;
        assert!(filter.judge(watcher::Event::Apply(r)).is_empty());
    }

    #[test]
    fn a_change_the_plan_reads_is_delivered_and_one_it_does_not_is_dropped() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
        let mut filter = RunnerFilter::default();
        let mut r = runner("a");
        status(&mut r).phase = Some(EphemeralRunnerPhase::Running);
        status(&mut r).runner_id = 7;
        assert!(delivered(&mut filter, &r), "first sight");
        // Read by nothing in the plan.
        status(&mut r).job_request_id = 9;
        status(&mut r).job_id = Some("job-9".into());
        assert!(!delivered(&mut filter, &r), "a job recorded");
        status(&mut r).job_result = Some("succeeded".into());
        assert!(!delivered(&mut filter, &r), "its end, while it runs");
        r.metadata.finalizers = Some(vec!["test.arcwright.dev/hold".into()]);
        assert!(!delivered(&mut filter, &r), "a finalizer");
        // Read by the plan.
        status(&mut r).job_request_id = 0;
        status(&mut r).job_id = None;
        assert!(delivered(&mut filter, &r), "a job record gone");
        status(&mut r).phase = Some(EphemeralRunnerPhase::Succeeded);
        status(&mut r).job_result = None;
        assert!(delivered(&mut filter, &r), "succeeded");
        status(&mut r).conditions = vec![Condition {
            type_: "Registered".into(),
            status: "False".into(),
            reason: "SelfDeregistered".into(),
            message: String::new(),
            last_transition_time: Time("2026-12-01T00:00:07Z".parse().unwrap()),
            observed_generation: None,
        }];
        assert!(
            delivered(&mut filter, &r),
            "its registration gone: renewable"
        );
        status(&mut r).job_result = Some("succeeded".into());
        assert!(
            delivered(&mut filter, &r),
            "its job's end, once it succeeded"
        );
    }

    /// The projection against the view it stands for: for each change of a
    /// runner, if the plan's view of it changes (against the set's template
    /// now or another, at any time), so does the projection, but for a job
    /// recorded, which the module's doc says why the set ignores.
    #[test]
    fn every_change_the_plan_can_see_changes_the_projection() {
        use super::super::apply::new_runner;
        use super::super::observe::runner_view;
        use super::super::plan::Creation;
        use crate::api::{EphemeralRunnerSetSpec, RunnerRenewal};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
        use kube::ResourceExt;

        let set = |image: &str| {
            let mut spec = EphemeralRunnerSetSpec::default();
            spec.ephemeral_runner_spec.spec.containers = vec![Default::default()];
            spec.ephemeral_runner_spec.spec.containers[0].image = Some(image.into());
            let mut set = EphemeralRunnerSet::new("set", spec);
            set.metadata.namespace = Some("ns".into());
            set.metadata.uid = Some("set-uid".into());
            set
        };
        let templates = [
            new_runner(&set("runner:1"), Creation::default()),
            new_runner(&set("runner:2"), Creation::default()),
        ];
        let times = ["2026-12-01T00:00:10Z", "2026-12-01T01:00:00Z"]
            .map(|t| t.parse::<jiff::Timestamp>().unwrap());
        fn registered(status: &str, at: &str) -> Condition {
            Condition {
                type_: "Registered".into(),
                status: status.into(),
                reason: String::new(),
                message: String::new(),
                last_transition_time: Time(at.parse().unwrap()),
                observed_generation: None,
            }
        }
        let mut base = new_runner(&set("runner:1"), Creation::default());
        base.metadata.name = Some("set-runner-a".into());
        base.metadata.uid = Some("a".into());
        base.status = Some(EphemeralRunnerStatus {
            phase: Some(EphemeralRunnerPhase::Succeeded),
            runner_id: 7,
            conditions: vec![registered("False", "2026-12-01T00:00:07Z")],
            ..EphemeralRunnerStatus::default()
        });
        fn st(r: &mut EphemeralRunner) -> &mut EphemeralRunnerStatus {
            r.status.get_or_insert_with(Default::default)
        }
        /// One change of a runner, named.
        type Change = (&'static str, fn(&mut EphemeralRunner));
        let changes: Vec<Change> = vec![
            ("phase", |r| {
                st(r).phase = Some(EphemeralRunnerPhase::Running)
            }),
            ("no phase", |r| st(r).phase = None),
            ("runner id", |r| st(r).runner_id = 8),
            ("job id", |r| st(r).job_id = Some("j".into())),
            ("job request", |r| st(r).job_request_id = 3),
            ("job result", |r| st(r).job_result = Some("failed".into())),
            ("job runner", |r| {
                st(r).job_id = Some("j".into());
                st(r).job_runner_id = 6;
            }),
            ("registered again", |r| {
                st(r).conditions = vec![registered("True", "2026-12-01T00:00:08Z")];
            }),
            ("registration gone later", |r| {
                st(r).conditions = vec![registered("False", "2026-12-01T00:00:09Z")];
            }),
            ("renewed", |r| {
                st(r).renewal = Some(RunnerRenewal {
                    count: 1,
                    patch_id: 4,
                    set_generation: 2,
                    renewed_at: Time("2026-12-01T00:00:09Z".parse().unwrap()),
                    previous: None,
                });
            }),
            ("deleted", |r| {
                r.metadata.deletion_timestamp = Some(Time("2026-12-01T00:00:09Z".parse().unwrap()));
            }),
            ("created", |r| {
                r.metadata.creation_timestamp = Some(Time("2026-12-01T00:00:01Z".parse().unwrap()));
            }),
            ("patch id", |r| {
                r.annotations_mut()
                    .insert(crate::api::annotations::PATCH_ID.into(), "5".into());
            }),
            ("revision", |r| {
                r.annotations_mut()
                    .insert(crate::api::annotations::REVISION.into(), "2".into());
            }),
            ("set generation", |r| {
                r.annotations_mut()
                    .insert(crate::api::annotations::SET_GENERATION.into(), "9".into());
            }),
            ("a label gone", |r| {
                r.labels_mut().remove(crate::api::labels::COMPONENT);
            }),
            ("spec", |r| {
                r.spec.spec.containers[0].image = Some("runner:2".into())
            }),
            ("message", |r| st(r).message = Some("hi".into())),
            ("ready", |r| st(r).ready = true),
        ];
        let before = projection(&base);
        let mut dropped = Vec::new();
        for (what, change) in &changes {
            let mut after = base.clone();
            change(&mut after);
            let seen = templates.iter().any(|template| {
                times.iter().any(|&now| {
                    runner_view(&base, template, now) != runner_view(&after, template, now)
                })
            });
            let view = |r: &EphemeralRunner| runner_view(r, &templates[0], times[0]);
            let only_a_job_recorded = view(&after).has_job
                && RunnerView {
                    has_job: false,
                    ..view(&after)
                } == view(&base);
            let wakes = before.wakes(projection(&after));
            assert!(
                wakes || !seen || only_a_job_recorded,
                "{what}: the plan sees it, the watch would drop it"
            );
            if !wakes {
                dropped.push(*what);
            }
        }
        assert_eq!(
            dropped,
            ["job id", "job request", "job runner", "message", "ready"],
            "what the set does not read of a succeeded runner"
        );
    }
}
