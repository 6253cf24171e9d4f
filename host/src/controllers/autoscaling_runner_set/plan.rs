//! What an AutoscalingRunnerSet reconcile does, decided from a snapshot with
//! no I/O.
//!
//! The reconciler observes (the set, its EphemeralRunnerSet, its listener,
//! the pod-validation verdict), calls [`plan`] or [`plan_deletion`], and
//! applies the answer. Keeping the decision pure is what lets every rule of
//! seed 004 be pinned in a table: observedGeneration that catches up only
//! when a change was applied, the Outdated parking that must not churn, the
//! forced revision bump that recovers from it, and the deletion order that
//! never cancels a job.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::api::{
    AutoscalingRunnerSetPhase, EphemeralRunnerSetPhase, EphemeralRunnerSetSpec,
    EphemeralRunnerSpec, ResourceMeta,
};
use crate::policy::types::Violation;

use crate::listener::control::ListenerConfig;

/// The pod-validation policy's verdict on the runner pod template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TemplateVerdict {
    /// The template may be built.
    Accepted,
    /// The template is refused, with every violation the policy found.
    Rejected(Vec<Violation>),
}

/// The EphemeralRunnerSet as the AutoscalingRunnerSet reads it: exactly the
/// projection its owned watch compares (seed 004), so a field read here and
/// not compared there cannot be missed.
#[derive(Clone, Debug, PartialEq)]
pub struct RunnerSetObserved {
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its spec.
    pub spec: EphemeralRunnerSetSpec,
    /// Its phase.
    pub phase: EphemeralRunnerSetPhase,
    /// `status.appliedActionableRevision`.
    pub applied_revision: i64,
}

/// Everything [`plan`] decides from.
#[derive(Clone, Debug, PartialEq)]
pub struct Observed {
    /// `metadata.generation`.
    pub generation: i64,
    /// `status.observedGeneration`.
    pub observed_generation: Option<i64>,
    /// `status.phase`.
    pub phase: Option<AutoscalingRunnerSetPhase>,
    /// Whether the finalizer is on the object.
    pub has_finalizer: bool,
    /// The verdict on `spec.template`.
    pub template: TemplateVerdict,
    /// The scale set's id in the Actions service, when known.
    pub scale_set_id: Option<i64>,
    /// Whether the scale set was brought in line with the spec in this
    /// reconcile already.
    pub scale_set_synced: bool,
    /// The runner spec the set should publish (with the scale set id).
    pub desired_runner_spec: EphemeralRunnerSpec,
    /// The metadata new runners should get.
    pub desired_runner_metadata: Option<ResourceMeta>,
    /// The labels the EphemeralRunnerSet should carry.
    pub desired_runner_set_labels: BTreeMap<String, String>,
    /// The EphemeralRunnerSet, when it exists.
    pub runner_set: Option<RunnerSetObserved>,
    /// The configuration of the running listener, when one runs.
    pub listener: Option<ListenerConfig>,
    /// The configuration the listener should have (known once the scale
    /// set id is).
    pub desired_listener: Option<ListenerConfig>,
}

/// What to do with the EphemeralRunnerSet.
#[derive(Clone, Debug, PartialEq)]
pub enum RunnerSetStep {
    /// Nothing.
    Keep,
    /// Create it with this revision of the runner spec (replicas 0; the
    /// listener scales it).
    Create {
        /// `spec.actionableRevision`.
        revision: i64,
    },
    /// Publish the desired runner spec and metadata at this revision. The
    /// revision equals the current one when only the labels or the runner
    /// metadata moved: runners are rebuilt only for a new revision.
    Publish {
        /// `spec.actionableRevision`.
        revision: i64,
    },
    /// Pin it at zero replicas and patch id 0 (Outdated): every runner not
    /// executing a job is released and the revision bookkeeping is kept.
    Park,
}

/// What to do with the listener.
#[derive(Clone, Debug, PartialEq)]
pub enum ListenerStep {
    /// Nothing.
    Keep,
    /// Start it.
    Start(ListenerConfig),
    /// Stop it and start it again with a new configuration (a label edit
    /// propagates to the listener, so it is a restart).
    Restart(ListenerConfig),
    /// Stop it.
    Stop,
}

/// The status a reconcile ends with.
#[derive(Clone, Debug, PartialEq)]
pub struct StatusOutcome {
    /// The phase.
    pub phase: AutoscalingRunnerSetPhase,
    /// The observed generation: the object's generation when this reconcile
    /// applied it, else the previous value.
    pub observed_generation: Option<i64>,
    /// The template's violations, when it was refused.
    pub violations: Option<Vec<Violation>>,
}

/// One reconcile's decisions, applied in field order.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// Add the finalizer first.
    pub add_finalizer: bool,
    /// Bring the scale set in the Actions service in line with the spec,
    /// then plan again with its id; nothing below is filled in.
    pub sync_scale_set: bool,
    /// Write phase Pending (observedGeneration unchanged) before anything
    /// else is applied, so a reconcile that fails part-way leaves the set
    /// visibly pending.
    pub mark_pending: bool,
    /// The EphemeralRunnerSet.
    pub runner_set: RunnerSetStep,
    /// The listener.
    pub listener: ListenerStep,
    /// The final status.
    pub status: StatusOutcome,
}

/// Decides one reconcile of a live (not deleting) AutoscalingRunnerSet.
pub fn plan(observed: &Observed) -> Plan {
    let spec_changed = observed.observed_generation != Some(observed.generation);
    let was_outdated = observed.phase == Some(AutoscalingRunnerSetPhase::Outdated);
    let mut plan = Plan {
        add_finalizer: !observed.has_finalizer,
        sync_scale_set: false,
        mark_pending: false,
        runner_set: RunnerSetStep::Keep,
        listener: ListenerStep::Keep,
        status: StatusOutcome {
            phase: observed.phase.unwrap_or_default(),
            observed_generation: observed.observed_generation,
            violations: None,
        },
    };

    // A refused template builds nothing and changes nothing in the service:
    // what runs keeps running on the last accepted spec, and the generation
    // stays unapplied so the fix is picked up as a change.
    if let TemplateVerdict::Rejected(violations) = &observed.template {
        plan.status.phase = AutoscalingRunnerSetPhase::Pending;
        plan.status.violations = Some(violations.clone());
        return plan;
    }

    // Parked: the runners rejected the current spec. Nothing but a spec
    // change may switch the scale set back on.
    let set_outdated_for_applied = observed.runner_set.as_ref().is_some_and(|set| {
        set.phase == EphemeralRunnerSetPhase::Outdated
            && set.applied_revision >= set.spec.actionable_revision
    });
    if !spec_changed && (was_outdated || set_outdated_for_applied) {
        if let Some(set) = &observed.runner_set
            && (set.spec.replicas != 0 || set.spec.patch_id != 0)
        {
            plan.runner_set = RunnerSetStep::Park;
        }
        if observed.listener.is_some() {
            plan.listener = ListenerStep::Stop;
        }
        plan.status.phase = AutoscalingRunnerSetPhase::Outdated;
        plan.status.observed_generation = Some(observed.generation);
        return plan;
    }

    if (spec_changed || observed.scale_set_id.is_none()) && !observed.scale_set_synced {
        plan.sync_scale_set = true;
        plan.mark_pending = spec_changed;
        plan.status.phase = AutoscalingRunnerSetPhase::Pending;
        return plan;
    }
    plan.mark_pending = spec_changed;

    plan.runner_set = match &observed.runner_set {
        None => RunnerSetStep::Create { revision: 1 },
        Some(set) => {
            let drift = !semantically_equal(
                &set.spec.ephemeral_runner_spec,
                &observed.desired_runner_spec,
            );
            // Recovering from Outdated republishes at a new revision even
            // when the runner spec did not change: the revision is what
            // tells the set to stop judging itself by the runners that
            // rejected the old one.
            if drift || (spec_changed && was_outdated) {
                RunnerSetStep::Publish {
                    revision: set.spec.actionable_revision + 1,
                }
            } else if !semantically_equal(
                &set.spec.ephemeral_runner_metadata,
                &observed.desired_runner_metadata,
            ) || !observed
                .desired_runner_set_labels
                .iter()
                .all(|(key, value)| set.labels.get(key) == Some(value))
            {
                RunnerSetStep::Publish {
                    revision: set.spec.actionable_revision,
                }
            } else {
                RunnerSetStep::Keep
            }
        }
    };

    plan.listener = match (&observed.listener, &observed.desired_listener) {
        (_, None) => ListenerStep::Keep,
        (None, Some(desired)) => ListenerStep::Start(desired.clone()),
        (Some(running), Some(desired)) if running == desired => ListenerStep::Keep,
        (Some(_), Some(desired)) => {
            // Pending at the point the listener is torn down: that is what
            // the phase means, whatever triggered the rebuild (seed 004).
            plan.mark_pending = true;
            ListenerStep::Restart(desired.clone())
        }
    };
    plan.status.phase = AutoscalingRunnerSetPhase::Running;
    plan.status.observed_generation = Some(observed.generation);
    plan
}

/// Whether two values are the same once what Kubernetes does not preserve
/// is set aside: nulls, empty lists and empty maps.
///
/// The runner spec is written into the EphemeralRunnerSet and read back;
/// a template with an explicitly empty field (`env: []`) may read back
/// with the field absent. A strict comparison would call that drift on
/// every reconcile, bump the revision each time and have the set delete
/// every idle runner forever (seed 004). Quantities are compared as
/// written: the API server stores a custom resource's `500m` as `500m`.
pub fn semantically_equal<T: serde::Serialize>(left: &T, right: &T) -> bool {
    let normal = |value: &T| serde_json::to_value(value).ok().map(normalize);
    normal(left) == normal(right)
}

fn normalize(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(key, value)| (key, normalize(value)))
                .filter(|(_, value)| !is_empty(value))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(normalize).collect()),
        other => other,
    }
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Array(items) => items.is_empty(),
        Value::Object(map) => map.is_empty(),
        _ => false,
    }
}

/// A runner of the set, as deletion sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunnerObserved {
    /// Its name.
    pub name: String,
    /// Whether it runs a job (the listener recorded JobStarted).
    pub busy: bool,
    /// Whether its deletion has begun.
    pub deleting: bool,
}

/// Everything [`plan_deletion`] decides from.
#[derive(Clone, Debug, PartialEq)]
pub struct DeletionObserved {
    /// Whether a listener runs.
    pub listener_running: bool,
    /// The EphemeralRunnerSet, when it exists: whether it is pinned at zero
    /// replicas and patch id 0, and whether its deletion has begun.
    pub runner_set: Option<(bool, bool)>,
    /// The set's runners.
    pub runners: Vec<RunnerObserved>,
    /// The scale set's id in the Actions service, when it was registered.
    pub scale_set_id: Option<i64>,
    /// Whether the credentials Secret exists.
    pub secret_present: bool,
    /// The name of the credentials Secret (for the message).
    pub secret_name: String,
    /// Whether an admin asked to force the deletion.
    pub force: bool,
}

/// One step of a deletion, in the order they must happen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeletionStep {
    /// Stop the listener, so no job is acquired for runners about to go.
    StopListener,
    /// Pin the set at zero replicas and patch id 0: idle runners are
    /// released, busy ones finish their job.
    PinRunnerSet,
    /// Delete these idle runners.
    DeleteRunners(Vec<String>),
    /// Delete the EphemeralRunnerSet.
    DeleteRunnerSet,
    /// Runners or the set are still going; come back later.
    Wait(String),
    /// Delete the scale set in the Actions service.
    DeleteScaleSet(i64),
    /// The deletion cannot go on by itself; the message says why and what
    /// an admin can do.
    Blocked(String),
    /// Remove the finalizer: the object goes.
    RemoveFinalizer,
}

/// Decides what a deleting AutoscalingRunnerSet does now: the steps to
/// apply in order, ending with a [`DeletionStep::Wait`],
/// [`DeletionStep::Blocked`] or [`DeletionStep::RemoveFinalizer`].
///
/// Busy runners are never deleted here: the scale set waits for their jobs
/// to end, because cancelling a job is not ours to do.
pub fn plan_deletion(observed: &DeletionObserved) -> Vec<DeletionStep> {
    let mut steps = Vec::new();
    if observed.listener_running {
        steps.push(DeletionStep::StopListener);
    }
    if let Some((pinned, deleting)) = observed.runner_set
        && !pinned
        && !deleting
    {
        steps.push(DeletionStep::PinRunnerSet);
    }
    let busy = observed.runners.iter().filter(|r| r.busy).count();
    let idle: Vec<String> = observed
        .runners
        .iter()
        .filter(|r| !r.busy && !r.deleting)
        .map(|r| r.name.clone())
        .collect();
    if !idle.is_empty() {
        steps.push(DeletionStep::DeleteRunners(idle));
    }
    if busy > 0 {
        steps.push(DeletionStep::Wait(format!(
            "waiting for {busy} runner(s) to finish their job"
        )));
        return steps;
    }
    if !observed.runners.is_empty() {
        steps.push(DeletionStep::Wait(format!(
            "waiting for {} runner(s) to go",
            observed.runners.len()
        )));
        return steps;
    }
    if let Some((_, deleting)) = observed.runner_set {
        if !deleting {
            steps.push(DeletionStep::DeleteRunnerSet);
        }
        steps.push(DeletionStep::Wait(
            "waiting for the EphemeralRunnerSet to go".into(),
        ));
        return steps;
    }
    match observed.scale_set_id {
        Some(_) if !observed.secret_present && !observed.force => {
            steps.push(DeletionStep::Blocked(format!(
                "the Secret {:?} is gone, so the scale set cannot be deleted in the Actions \
                 service; restore the Secret, or annotate {}=\"true\" to remove the object and \
                 leave the scale set registered",
                observed.secret_name,
                super::FORCE_DELETE_ANNOTATION
            )));
            return steps;
        }
        Some(id) if observed.secret_present => steps.push(DeletionStep::DeleteScaleSet(id)),
        _ => {}
    }
    steps.push(DeletionStep::RemoveFinalizer);
    steps
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn runner_spec(env: Value) -> EphemeralRunnerSpec {
        serde_json::from_value(json!({
            "githubConfigUrl": "https://github.com/octo-org",
            "githubConfigSecret": "github-auth",
            "runnerScaleSetId": 7,
            "spec": {"containers": [{"name": "runner", "image": "runner:1", "env": env}]}
        }))
        .unwrap()
    }

    fn listener(labels: &[(&str, &str)]) -> ListenerConfig {
        ListenerConfig {
            namespace: "ns".into(),
            name: "linux".into(),
            uid: Some("u1".into()),
            runner_set_name: "linux".into(),
            scale_set_id: 7,
            github: crate::controllers::github_target(
                "ns",
                "https://github.com/octo-org",
                "github-auth",
                None,
                None,
            ),
            min_runners: 0,
            max_runners: None,
            holds_failures: false,
            scale_set_labels: Vec::new(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            scaling_policy: None,
        }
    }

    fn set(revision: i64, applied: i64, phase: EphemeralRunnerSetPhase) -> RunnerSetObserved {
        RunnerSetObserved {
            labels: BTreeMap::new(),
            spec: EphemeralRunnerSetSpec {
                replicas: 3,
                patch_id: 5,
                actionable_revision: revision,
                ephemeral_runner_spec: runner_spec(json!([{"name": "A", "value": "1"}])),
                ephemeral_runner_metadata: None,
            },
            phase,
            applied_revision: applied,
        }
    }

    /// A set at revision 1 pinned at zero replicas and patch id 0.
    fn parked(phase: EphemeralRunnerSetPhase) -> RunnerSetObserved {
        let mut parked = set(1, 1, phase);
        parked.spec.replicas = 0;
        parked.spec.patch_id = 0;
        parked
    }

    /// A settled, running scale set at generation 2.
    fn settled() -> Observed {
        Observed {
            generation: 2,
            observed_generation: Some(2),
            phase: Some(AutoscalingRunnerSetPhase::Running),
            has_finalizer: true,
            template: TemplateVerdict::Accepted,
            scale_set_id: Some(7),
            scale_set_synced: false,
            desired_runner_spec: runner_spec(json!([{"name": "A", "value": "1"}])),
            desired_runner_metadata: None,
            desired_runner_set_labels: BTreeMap::new(),
            runner_set: Some(set(1, 1, EphemeralRunnerSetPhase::Running)),
            listener: Some(listener(&[])),
            desired_listener: Some(listener(&[])),
        }
    }

    fn violation() -> Violation {
        Violation {
            path: "spec.containers[0].securityContext.privileged".into(),
            message: "privileged containers are refused".into(),
        }
    }

    #[test]
    fn plans_follow_the_rules_of_seed_004() {
        use AutoscalingRunnerSetPhase::{Outdated, Pending, Running};
        let running = AutoscalingRunnerSetPhase::Running;
        type Case = (&'static str, Box<dyn Fn(&mut Observed)>, Plan);
        // A plan that applies nothing and leaves the set Pending.
        let unapplied = |add_finalizer, sync_scale_set, mark_pending, og, violations| Plan {
            add_finalizer,
            sync_scale_set,
            mark_pending,
            runner_set: RunnerSetStep::Keep,
            listener: ListenerStep::Keep,
            status: StatusOutcome {
                phase: Pending,
                observed_generation: og,
                violations,
            },
        };
        let base = |runner_set, listener, phase, og: i64, mark_pending| Plan {
            add_finalizer: false,
            sync_scale_set: false,
            mark_pending,
            runner_set,
            listener,
            status: StatusOutcome {
                phase,
                observed_generation: Some(og),
                violations: None,
            },
        };
        let cases: Vec<Case> = vec![
            (
                "a settled set does nothing",
                Box::new(|_| {}),
                base(RunnerSetStep::Keep, ListenerStep::Keep, running, 2, false),
            ),
            (
                "a new object gets the finalizer and registers its scale set first",
                Box::new(|o| {
                    o.has_finalizer = false;
                    o.observed_generation = None;
                    o.phase = None;
                    o.scale_set_id = None;
                    o.runner_set = None;
                    o.listener = None;
                    o.desired_listener = None;
                }),
                unapplied(true, true, true, None, None),
            ),
            (
                "once registered, the set is created, the listener started, the generation observed",
                Box::new(|o| {
                    o.observed_generation = None;
                    o.phase = None;
                    o.scale_set_synced = true;
                    o.runner_set = None;
                    o.listener = None;
                }),
                base(
                    RunnerSetStep::Create { revision: 1 },
                    ListenerStep::Start(listener(&[])),
                    Running,
                    2,
                    true,
                ),
            ),
            (
                "a spec change syncs the scale set first and shows Pending, generation not yet observed",
                Box::new(|o| o.generation = 3),
                unapplied(false, true, true, Some(2), None),
            ),
            (
                "a spec change that leaves the runner spec alone keeps the revision and catches up",
                Box::new(|o| {
                    o.generation = 3;
                    o.scale_set_synced = true;
                }),
                base(RunnerSetStep::Keep, ListenerStep::Keep, Running, 3, true),
            ),
            (
                "runner spec drift publishes the next revision",
                Box::new(|o| {
                    o.generation = 3;
                    o.scale_set_synced = true;
                    o.desired_runner_spec = runner_spec(json!([{"name": "A", "value": "2"}]));
                }),
                base(
                    RunnerSetStep::Publish { revision: 2 },
                    ListenerStep::Keep,
                    Running,
                    3,
                    true,
                ),
            ),
            (
                "an explicitly empty env that reads back absent is no drift",
                Box::new(|o| {
                    o.desired_runner_spec = runner_spec(json!([]));
                    o.runner_set.as_mut().unwrap().spec.ephemeral_runner_spec =
                        runner_spec(Value::Null);
                }),
                base(RunnerSetStep::Keep, ListenerStep::Keep, running, 2, false),
            ),
            (
                "a new label for the set is published at the same revision",
                Box::new(|o| {
                    o.desired_runner_set_labels
                        .insert("team".into(), "ci".into());
                }),
                base(
                    RunnerSetStep::Publish { revision: 1 },
                    ListenerStep::Keep,
                    running,
                    2,
                    false,
                ),
            ),
            (
                "a label-only change restarts the listener and shows Pending at the teardown",
                Box::new(|o| o.desired_listener = Some(listener(&[("team", "ci")]))),
                base(
                    RunnerSetStep::Keep,
                    ListenerStep::Restart(listener(&[("team", "ci")])),
                    Running,
                    2,
                    true,
                ),
            ),
            (
                "the set reporting Outdated for the applied revision parks the scale set",
                Box::new(|o| {
                    o.runner_set = Some(set(1, 1, EphemeralRunnerSetPhase::Outdated));
                }),
                base(RunnerSetStep::Park, ListenerStep::Stop, Outdated, 2, false),
            ),
            (
                "an Outdated verdict about a revision already replaced does not park",
                Box::new(|o| {
                    o.runner_set = Some(set(2, 1, EphemeralRunnerSetPhase::Outdated));
                }),
                base(RunnerSetStep::Keep, ListenerStep::Keep, running, 2, false),
            ),
            (
                "a parked scale set stays parked and does not rebuild the listener",
                Box::new(|o| {
                    o.phase = Some(Outdated);
                    o.runner_set = Some(parked(EphemeralRunnerSetPhase::Running));
                    o.listener = None;
                }),
                base(RunnerSetStep::Keep, ListenerStep::Keep, Outdated, 2, false),
            ),
            (
                "a spec change recovers from Outdated with a new revision of the same runner spec",
                Box::new(|o| {
                    o.generation = 3;
                    o.scale_set_synced = true;
                    o.phase = Some(Outdated);
                    o.runner_set = Some(parked(EphemeralRunnerSetPhase::Outdated));
                    o.listener = None;
                }),
                base(
                    RunnerSetStep::Publish { revision: 2 },
                    ListenerStep::Start(listener(&[])),
                    Running,
                    3,
                    true,
                ),
            ),
            (
                "a rejected template builds nothing and leaves the generation unobserved",
                Box::new(|o| {
                    o.generation = 3;
                    o.template = TemplateVerdict::Rejected(vec![violation()]);
                    o.desired_runner_spec = runner_spec(json!([{"name": "B", "value": "1"}]));
                }),
                unapplied(false, false, false, Some(2), Some(vec![violation()])),
            ),
            (
                "a rejected template on a new object registers nothing",
                Box::new(|o| {
                    o.observed_generation = None;
                    o.scale_set_id = None;
                    o.runner_set = None;
                    o.listener = None;
                    o.desired_listener = None;
                    o.template = TemplateVerdict::Rejected(vec![violation()]);
                }),
                unapplied(false, false, false, None, Some(vec![violation()])),
            ),
        ];
        for (name, change, expected) in cases {
            let mut observed = settled();
            change(&mut observed);
            assert_eq!(plan(&observed), expected, "{name}");
        }
    }

    fn deleting() -> DeletionObserved {
        DeletionObserved {
            listener_running: true,
            runner_set: Some((false, false)),
            runners: vec![
                RunnerObserved {
                    name: "idle".into(),
                    busy: false,
                    deleting: false,
                },
                RunnerObserved {
                    name: "busy".into(),
                    busy: true,
                    deleting: false,
                },
            ],
            scale_set_id: Some(7),
            secret_present: true,
            secret_name: "github-auth".into(),
            force: false,
        }
    }

    #[test]
    fn deletion_goes_listener_runners_scale_set_finalizer() {
        use DeletionStep::*;
        type Case = (
            &'static str,
            Box<dyn Fn(&mut DeletionObserved)>,
            Vec<DeletionStep>,
        );
        let cases: Vec<Case> = vec![
            (
                "first the listener stops, the set is pinned, idle runners go, busy ones are waited for",
                Box::new(|_| {}),
                vec![
                    StopListener,
                    PinRunnerSet,
                    DeleteRunners(vec!["idle".into()]),
                    Wait("waiting for 1 runner(s) to finish their job".into()),
                ],
            ),
            (
                "a runner being deleted is waited for, not deleted again",
                Box::new(|o| {
                    o.listener_running = false;
                    o.runner_set = Some((true, false));
                    o.runners = vec![RunnerObserved {
                        name: "idle".into(),
                        busy: false,
                        deleting: true,
                    }];
                }),
                vec![Wait("waiting for 1 runner(s) to go".into())],
            ),
            (
                "with the runners gone the set is deleted",
                Box::new(|o| {
                    o.listener_running = false;
                    o.runner_set = Some((true, false));
                    o.runners.clear();
                }),
                vec![
                    DeleteRunnerSet,
                    Wait("waiting for the EphemeralRunnerSet to go".into()),
                ],
            ),
            (
                "with the set gone the scale set is deleted in the service, then the finalizer",
                Box::new(|o| {
                    o.listener_running = false;
                    o.runner_set = None;
                    o.runners.clear();
                }),
                vec![DeleteScaleSet(7), RemoveFinalizer],
            ),
            (
                "a scale set never registered only drops the finalizer",
                Box::new(|o| {
                    o.listener_running = false;
                    o.runner_set = None;
                    o.runners.clear();
                    o.scale_set_id = None;
                    o.secret_present = false;
                }),
                vec![RemoveFinalizer],
            ),
            (
                "a gone Secret blocks with a reason instead of hanging silently",
                Box::new(|o| {
                    o.listener_running = false;
                    o.runner_set = None;
                    o.runners.clear();
                    o.secret_present = false;
                }),
                vec![Blocked(
                    "the Secret \"github-auth\" is gone, so the scale set cannot be deleted in \
                     the Actions service; restore the Secret, or annotate \
                     arcwright.dev/force-delete=\"true\" to remove the object and leave the \
                     scale set registered"
                        .into(),
                )],
            ),
            (
                "the force annotation removes the object without the service",
                Box::new(|o| {
                    o.listener_running = false;
                    o.runner_set = None;
                    o.runners.clear();
                    o.secret_present = false;
                    o.force = true;
                }),
                vec![RemoveFinalizer],
            ),
            (
                "force never cancels a job",
                Box::new(|o| o.force = true),
                vec![
                    StopListener,
                    PinRunnerSet,
                    DeleteRunners(vec!["idle".into()]),
                    Wait("waiting for 1 runner(s) to finish their job".into()),
                ],
            ),
        ];
        for (name, change, expected) in cases {
            let mut observed = deleting();
            change(&mut observed);
            assert_eq!(plan_deletion(&observed), expected, "{name}");
        }
    }

    #[test]
    fn semantic_equality_ignores_only_what_the_server_drops() {
        let cases = [
            (json!([]), Value::Null, true),
            (json!([{"name": "A", "value": "1"}]), Value::Null, false),
            (
                json!([{"name": "A", "value": "1"}]),
                json!([{"name": "A", "value": "2"}]),
                false,
            ),
            (
                json!([{"name": "A", "value": ""}]),
                json!([{"name": "A"}]),
                false,
            ),
        ];
        for (left, right, equal) in cases {
            assert_eq!(
                semantically_equal(&runner_spec(left.clone()), &runner_spec(right.clone())),
                equal,
                "{left} vs {right}"
            );
        }
    }
}
