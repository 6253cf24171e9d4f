//! The owned watch: which EphemeralRunner events wake their set.
//!
//! A runner's status is written often by others: readiness, failure
//! bookkeeping, the job details the listener records, messages. Little of it
//! is input to the set, yet every such write would enqueue a reconcile of
//! the set, which lists all its runners. So an update is dropped when the
//! projection the set reconciler actually reads is unchanged (seed 004):
//! object metadata (less `resourceVersion` and `managedFields`, which change
//! on every write), the spec, `status.phase`, `status.runnerId`,
//! `status.renewal`, and whether a runner that succeeded has its job's end
//! recorded (a record that lands after the runner succeeded can free its
//! place under a decision already applied: rule 5 of the plan).
//!
//! A predicate may only ever be an optimisation, so everything else is
//! delivered: a runner seen for the first time, a deletion, and a runner
//! that vanished while the watch was re-listing. The busy signal
//! (`jobRequestId`/`jobId`) is deliberately not in the projection: a runner
//! that takes a job gives the set nothing to do, and every decision that
//! could touch a runner re-reads it and deletes with its resourceVersion as a
//! precondition, so a job recorded after the read makes the deletion fail
//! rather than cancel the job.

use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};

use kube::Resource;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

use crate::api::{EphemeralRunner, EphemeralRunnerSet};

/// What the set reconciler reads of a runner, hashed.
pub fn projection(runner: &EphemeralRunner) -> u64 {
    let mut metadata = runner.metadata.clone();
    metadata.resource_version = None;
    metadata.managed_fields = None;
    let status = runner.status.as_ref();
    let value = (
        metadata,
        &runner.spec,
        status.and_then(|s| s.phase),
        status.map_or(0, |s| s.runner_id),
        status.and_then(|s| s.renewal.as_ref()),
        status.is_some_and(|s| {
            s.phase == Some(crate::api::EphemeralRunnerPhase::Succeeded) && s.job_ended()
        }),
    );
    let mut hasher = DefaultHasher::new();
    // Serialising gives every field a stable byte form; the types are ours
    // and k8s-openapi's, so this cannot fail short of a bug.
    serde_json::to_vec(&value)
        .unwrap_or_default()
        .hash(&mut hasher);
    hasher.finish()
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

#[derive(Clone, Debug)]
struct Seen {
    projection: u64,
    owner: Option<ObjectRef<EphemeralRunnerSet>>,
}

/// The projection of every runner last delivered, by uid.
#[derive(Debug, Default)]
pub struct RunnerFilter {
    seen: HashMap<String, Seen>,
    /// The uids listed since the watch restarted; `None` outside a re-list.
    listing: Option<HashSet<String>>,
}

impl RunnerFilter {
    /// Judges one watch event: the owners to wake, or the update dropped.
    pub fn judge(&mut self, event: watcher::Event<EphemeralRunner>) -> Vec<Judged> {
        match event {
            watcher::Event::Apply(runner) => self.apply(&runner).into_iter().collect(),
            watcher::Event::InitApply(runner) => {
                if let (Some(listing), Some(uid)) = (&mut self.listing, &runner.metadata.uid) {
                    listing.insert(uid.clone());
                }
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
            watcher::Event::Init => {
                self.listing = Some(HashSet::new());
                Vec::new()
            }
            watcher::Event::InitDone => {
                // Runners that went while the watch was down get no delete
                // event: wake their sets now.
                let Some(listed) = self.listing.take() else {
                    return Vec::new();
                };
                let gone: Vec<String> = self
                    .seen
                    .keys()
                    .filter(|uid| !listed.contains(*uid))
                    .cloned()
                    .collect();
                gone.into_iter()
                    .filter_map(|uid| self.seen.remove(&uid)?.owner)
                    .map(|owner| Judged {
                        owner,
                        delivered: true,
                    })
                    .collect()
            }
        }
    }

    fn apply(&mut self, runner: &EphemeralRunner) -> Option<Judged> {
        let owner = owner(runner);
        let projection = projection(runner);
        let changed = match &runner.metadata.uid {
            Some(uid) => {
                let previous = self.seen.insert(
                    uid.clone(),
                    Seen {
                        projection,
                        owner: owner.clone(),
                    },
                );
                previous.is_none_or(|p| p.projection != projection)
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
        let (a, b) = (runner("a"), runner("b"));
        filter.judge(watcher::Event::Apply(a.clone()));
        filter.judge(watcher::Event::Apply(b.clone()));
        let judged = filter.judge(watcher::Event::Delete(a.clone()));
        assert!(
            judged[0].delivered,
            "an unchanged deleted object still wakes"
        );
        filter.judge(watcher::Event::Apply(a.clone()));

        assert!(filter.judge(watcher::Event::Init).is_empty());
        let relisted = filter.judge(watcher::Event::InitApply(a.clone()));
        assert!(!relisted[0].delivered, "unchanged across the relist");
        let gone = filter.judge(watcher::Event::InitDone);
        assert_eq!(gone.len(), 1, "b vanished while the watch was down");
        assert!(gone[0].delivered);
        assert!(filter.judge(watcher::Event::InitDone).is_empty());
    }

    #[test]
    fn runners_without_a_controlling_set_wake_nothing() {
        let mut filter = RunnerFilter::default();
        let mut r = runner("a");
        r.metadata.owner_references = None;
        assert!(filter.judge(watcher::Event::Apply(r)).is_empty());
    }
}
