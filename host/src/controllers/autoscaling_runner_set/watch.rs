//! The owned watch on EphemeralRunnerSets, which wakes the scale set only
//! when something it reads changed (seed 004).
//!
//! The listener rewrites a set's `replicas` and `patchID`, and the set's
//! own controller rewrites its counters and conditions all the time; the
//! AutoscalingRunnerSet reads only the set's metadata, spec, phase and
//! applied revision ([`super::plan::RunnerSetObserved`]). An update whose
//! projection of those fields is unchanged is dropped. A predicate may only
//! ever be an optimisation, so the projection is exactly what the
//! reconciler reads, deletions are always delivered, and the primary watch
//! on AutoscalingRunnerSets is not filtered at all.

use futures::Stream;
use kube::Resource;
use kube::runtime::watcher;
use serde_json::{Value, json};

use crate::api::{EphemeralRunnerSet, EphemeralRunnerSetPhase};

/// The fields of an EphemeralRunnerSet its owner reads: the metadata
/// (without `resourceVersion`, `generation` and `managedFields`, which move
/// on every write), the spec, the phase and the applied revision.
///
/// `replicas` and `patchID` are the listener's, rewritten on every scaling
/// decision; the owner reads them only to keep an Outdated set pinned at
/// zero, so they are part of the projection only while the set is
/// Outdated. Otherwise every decision would wake the AutoscalingRunnerSet
/// for a reconcile that can change nothing.
pub fn runner_set_projection(set: &EphemeralRunnerSet) -> Value {
    let mut metadata = set.meta().clone();
    metadata.resource_version = None;
    metadata.managed_fields = None;
    metadata.generation = None;
    // Read as the reconciler reads them: a set without a status yet is a
    // Running set at revision 0, so its first status write is no news.
    let status = set.status.as_ref();
    let phase = status
        .and_then(|s| s.phase)
        .unwrap_or(EphemeralRunnerSetPhase::Running);
    let applied = status.map_or(0, |s| s.applied_actionable_revision);
    let mut spec = set.spec.clone();
    if phase != EphemeralRunnerSetPhase::Outdated {
        spec.replicas = 0;
        spec.patch_id = 0;
    }
    json!({
        "metadata": metadata,
        "spec": spec,
        "phase": phase,
        "appliedActionableRevision": applied,
    })
}

/// The EphemeralRunnerSets that should wake their owner, from a watcher's
/// events; `judged` hears, for each update of an object, whether it passed.
pub fn filtered(
    events: impl Stream<Item = Result<watcher::Event<EphemeralRunnerSet>, watcher::Error>>,
    judged: impl Fn(bool) + Send + 'static,
) -> impl Stream<Item = Result<EphemeralRunnerSet, watcher::Error>> {
    crate::controllers::kit::projection::filtered(events, runner_set_projection, judged)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::EphemeralRunnerSetStatus;
    use crate::controllers::kit::projection::ProjectionFilter;

    fn set() -> EphemeralRunnerSet {
        let mut set: EphemeralRunnerSet = serde_json::from_value(json!({
            "apiVersion": "arcwright.dev/v1alpha1",
            "kind": "EphemeralRunnerSet",
            "metadata": {"name": "linux", "namespace": "ns", "uid": "u1", "resourceVersion": "1"},
            "spec": {"replicas": 1, "patchID": 1, "actionableRevision": 1,
                     "ephemeralRunnerSpec": {"githubConfigUrl": "https://github.com/o",
                                             "githubConfigSecret": "s", "spec": {"containers": []}}}
        }))
        .unwrap();
        set.status = Some(EphemeralRunnerSetStatus::default());
        set
    }

    #[test]
    fn only_updates_of_what_the_owner_reads_pass() {
        type Case = (&'static str, fn(&mut EphemeralRunnerSet), bool);
        let cases: [Case; 10] = [
            (
                "nothing but the resource version",
                |s| s.metadata.resource_version = Some("2".into()),
                false,
            ),
            (
                "the counters",
                |s| s.status.as_mut().unwrap().running_ephemeral_runners = 3,
                false,
            ),
            (
                "a first status with nothing in it",
                |s| s.status = None,
                false,
            ),
            (
                "the observed generation",
                |s| s.status.as_mut().unwrap().observed_generation = Some(4),
                false,
            ),
            (
                "a scaling decision (replicas, patch id, generation)",
                |s| {
                    s.spec.replicas = 2;
                    s.spec.patch_id = 2;
                    s.metadata.generation = Some(5);
                },
                false,
            ),
            (
                "the actionable revision",
                |s| s.spec.actionable_revision = 2,
                true,
            ),
            (
                "the runner spec",
                |s| s.spec.ephemeral_runner_spec.github_config_secret = "t".into(),
                true,
            ),
            (
                "the phase",
                |s| s.status.as_mut().unwrap().phase = Some(EphemeralRunnerSetPhase::Outdated),
                true,
            ),
            (
                "the applied revision",
                |s| s.status.as_mut().unwrap().applied_actionable_revision = 1,
                true,
            ),
            (
                "a label",
                |s| {
                    s.metadata.labels = Some([("a".to_string(), "b".to_string())].into());
                },
                true,
            ),
        ];
        for (name, change, admitted) in cases {
            let mut filter = ProjectionFilter::new(runner_set_projection);
            assert!(
                filter.admit(&watcher::Event::Apply(set())),
                "first sight passes"
            );
            let mut changed = set();
            change(&mut changed);
            assert_eq!(
                filter.admit(&watcher::Event::Apply(changed)),
                admitted,
                "{name}"
            );
        }
    }

    #[test]
    fn replicas_of_an_outdated_set_pass_because_the_owner_pins_them() {
        let mut outdated = set();
        outdated.status.as_mut().unwrap().phase = Some(EphemeralRunnerSetPhase::Outdated);
        let mut filter = ProjectionFilter::new(runner_set_projection);
        assert!(filter.admit(&watcher::Event::Apply(outdated.clone())));
        outdated.spec.replicas = 0;
        outdated.spec.patch_id = 0;
        assert!(filter.admit(&watcher::Event::Apply(outdated)));
    }

    #[test]
    fn deletions_always_pass() {
        let mut filter = ProjectionFilter::new(runner_set_projection);
        assert!(filter.admit(&watcher::Event::Apply(set())));
        assert!(filter.admit(&watcher::Event::Delete(set())));
        assert!(
            filter.admit(&watcher::Event::Apply(set())),
            "a re-created object is new"
        );
    }
}
