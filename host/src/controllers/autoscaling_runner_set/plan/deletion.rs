//! Rule 7: the order a deleting AutoscalingRunnerSet goes in.
//!
//! Listener first, so no job is acquired for runners about to go; then the
//! runners, idle ones deleted and busy ones waited for, because cancelling
//! a job is not ours to do; then the EphemeralRunnerSet; then the scale set
//! in the Actions service, which needs the credentials Secret (when it is
//! gone the deletion says why and waits, unless an admin forces it); then
//! the credentials Secret is released, unless another set uses it; the
//! finalizer last.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use super::{StatusChange, Step};
use crate::api::annotations;
use crate::api::autoscaling_runner_set::{
    AutoscalingRunnerSetCondition, AutoscalingRunnerSetEvent, DeletionBlockedReason,
};
use crate::controllers::kit::{Notice, conditions};

/// How soon a deletion waiting for runners looks again.
pub const DELETION_POLL: Duration = Duration::from_secs(1);

/// How soon a blocked deletion looks again (an annotation or a restored
/// Secret wakes it sooner through the watch).
pub const BLOCKED_POLL: Duration = Duration::from_secs(30);

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

/// The EphemeralRunnerSet, as deletion sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunnerSetState {
    /// Whether it is pinned at zero replicas and patch id 0.
    pub pinned: bool,
    /// Whether its deletion has begun.
    pub deleting: bool,
}

/// Everything [`plan_deletion`] decides from.
#[derive(Clone, Debug, PartialEq)]
pub struct DeletionObserved {
    /// Whether a listener runs.
    pub listener_running: bool,
    /// The EphemeralRunnerSet, when it exists.
    pub runner_set: Option<RunnerSetState>,
    /// The set's runners.
    pub runners: Vec<RunnerObserved>,
    /// The scale set's id in the Actions service, when it was registered.
    pub scale_set_id: Option<i64>,
    /// Whether the credentials Secret exists.
    pub secret_present: bool,
    /// Whether it holds our `credentials-in-use` finalizer.
    pub credentials_held: bool,
    /// Whether another set in the namespace names the same Secret, even one
    /// being deleted (it then keeps the Secret held for its own teardown).
    pub credentials_shared: bool,
    /// The name of the credentials Secret (for the message).
    pub secret_name: String,
    /// The Secret the set records holding, when its spec now names another
    /// (changed and deleted before a reconcile let go of the former).
    pub former_credentials: Option<super::FormerCredentials>,
    /// Whether an admin asked to force the deletion
    /// ([`annotations::FORCE_DELETE`]).
    pub force: bool,
    /// Whether an admin asked that the scale set stay registered
    /// ([`annotations::KEEP_SCALE_SET`]): handed to another controller.
    pub keep_scale_set: bool,
    /// The set's conditions.
    pub conditions: Vec<Condition>,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// Now, for the conditions' transition times.
    pub now: Timestamp,
}

/// Where a deletion stands after its steps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Deletion {
    /// Runners or the EphemeralRunnerSet are still going; the reason says
    /// which.
    Waits(String),
    /// It cannot go on by itself; the message says why and what an admin
    /// can do.
    Blocked(String),
    /// The finalizer is removed: the object goes.
    Done,
}

impl Deletion {
    /// When to look again: never once done (nothing is left to release).
    pub fn look_again(&self) -> Option<Duration> {
        match self {
            Self::Waits(_) => Some(DELETION_POLL),
            Self::Blocked(_) => Some(BLOCKED_POLL),
            Self::Done => None,
        }
    }
}

/// One pass of a deletion.
#[derive(Clone, Debug, PartialEq)]
pub struct DeletionPlan {
    /// The steps, in order.
    pub steps: Vec<Step>,
    /// Where the deletion stands after them.
    pub then: Deletion,
}

/// Decides what a deleting AutoscalingRunnerSet does now.
///
/// Busy runners are never deleted here: the scale set waits for their jobs
/// to end, because cancelling a job is not ours to do. Not even the force
/// annotation changes that: it only lets the object go without the
/// service.
pub fn plan_deletion(observed: &DeletionObserved) -> DeletionPlan {
    let mut steps = Vec::new();
    let waits = |steps, why: String| DeletionPlan {
        steps,
        then: Deletion::Waits(why),
    };
    if observed.listener_running {
        steps.push(Step::StopListener);
    }
    if let Some(set) = observed.runner_set
        && !set.pinned
        && !set.deleting
    {
        steps.push(Step::PinRunnerSet);
    }
    let busy = observed.runners.iter().filter(|r| r.busy).count();
    steps.extend(
        observed
            .runners
            .iter()
            .filter(|r| !r.busy && !r.deleting)
            .map(|r| Step::DeleteRunner(r.name.clone())),
    );
    if busy > 0 {
        return waits(
            steps,
            format!("waiting for {busy} runner(s) to finish their job"),
        );
    }
    if !observed.runners.is_empty() {
        let going = observed.runners.len();
        return waits(steps, format!("waiting for {going} runner(s) to go"));
    }
    if let Some(set) = observed.runner_set {
        if !set.deleting {
            steps.push(Step::DeleteRunnerSet);
        }
        return waits(steps, "waiting for the EphemeralRunnerSet to go".into());
    }
    match observed.scale_set_id {
        Some(_) if observed.keep_scale_set => {}
        Some(_) if !observed.secret_present && !observed.force => return blocked(observed, steps),
        Some(id) if observed.secret_present => steps.push(Step::DeleteScaleSet(id)),
        _ => {}
    }
    if observed.credentials_held && !observed.credentials_shared {
        steps.push(Step::ReleaseCredentials);
    }
    if let Some(former) = observed
        .former_credentials
        .as_ref()
        .filter(|f| f.to_release())
    {
        steps.push(Step::ReleaseFormerCredentials(former.name.clone()));
    }
    steps.push(Step::RemoveFinalizer);
    DeletionPlan {
        steps,
        then: Deletion::Done,
    }
}

/// The scale set cannot be deleted in the service without credentials:
/// the condition and an event say so (once per new reason) instead of the
/// deletion hanging silently.
fn blocked(observed: &DeletionObserved, mut steps: Vec<Step>) -> DeletionPlan {
    let why = format!(
        "the Secret {:?} is gone, so the scale set cannot be deleted in the Actions service; \
         restore the Secret, or annotate {}=\"true\" to remove the object and leave the scale \
         set registered",
        observed.secret_name,
        annotations::FORCE_DELETE
    );
    let mut conditions = observed.conditions.clone();
    let changed = conditions::set(
        &mut conditions,
        conditions::Setting {
            type_: AutoscalingRunnerSetCondition::DeletionBlocked.as_str(),
            status: true,
            reason: DeletionBlockedReason::SecretMissing.as_str(),
            message: &why,
            observed_generation: observed.generation,
        },
        observed.now,
    );
    if changed {
        steps.push(Step::WriteStatus(StatusChange::Conditions(conditions)));
        steps.push(Step::Publish(
            Notice::warning(
                AutoscalingRunnerSetEvent::DeletionBlocked.as_str(),
                why.clone(),
            )
            .during("Delete"),
        ));
    }
    DeletionPlan {
        steps,
        then: Deletion::Blocked(why),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn runner(name: &str, busy: bool, deleting: bool) -> RunnerObserved {
        RunnerObserved {
            name: name.into(),
            busy,
            deleting,
        }
    }

    /// A set deleted while its listener runs, its EphemeralRunnerSet
    /// scaled, one runner idle and one running a job.
    fn deleting() -> DeletionObserved {
        DeletionObserved {
            listener_running: true,
            runner_set: Some(RunnerSetState {
                pinned: false,
                deleting: false,
            }),
            runners: vec![runner("idle", false, false), runner("busy", true, false)],
            scale_set_id: Some(7),
            secret_present: true,
            credentials_held: false,
            credentials_shared: false,
            secret_name: "github-auth".into(),
            former_credentials: None,
            force: false,
            keep_scale_set: false,
            conditions: Vec::new(),
            generation: Some(2),
            now: at(0),
        }
    }

    /// The listener stopped and the set pinned by an earlier pass.
    fn stopped_and_pinned(o: &mut DeletionObserved) {
        o.listener_running = false;
        o.runner_set = Some(RunnerSetState {
            pinned: true,
            deleting: false,
        });
    }

    /// What is left once the listener, the runners and the set are gone.
    fn only_the_scale_set_left(o: &mut DeletionObserved) {
        o.listener_running = false;
        o.runner_set = None;
        o.runners.clear();
    }

    const BLOCKED: &str = "the Secret \"github-auth\" is gone, so the scale set cannot be deleted \
                           in the Actions service; restore the Secret, or annotate \
                           arcwright.dev/force-delete=\"true\" to remove the object and leave \
                           the scale set registered";

    fn blocked_condition(at_: Timestamp) -> Condition {
        Condition {
            type_: "DeletionBlocked".into(),
            status: "True".into(),
            reason: "SecretMissing".into(),
            message: BLOCKED.into(),
            observed_generation: Some(2),
            last_transition_time: Time(at_),
        }
    }

    #[test]
    fn deletion_goes_listener_runners_scale_set_finalizer() {
        use Step::*;
        let wait = |why: &str| Deletion::Waits(why.into());
        type Case = (
            &'static str,
            Box<dyn Fn(&mut DeletionObserved)>,
            Vec<Step>,
            Deletion,
        );
        let cases: Vec<Case> = vec![
            (
                "first the listener stops, the set is pinned, idle runners go, busy ones are waited for",
                Box::new(|_| {}),
                vec![StopListener, PinRunnerSet, DeleteRunner("idle".into())],
                wait("waiting for 1 runner(s) to finish their job"),
            ),
            (
                "with the listener stopped and the set pinned, only the busy runner is waited for",
                Box::new(|o| {
                    stopped_and_pinned(o);
                    o.runners = vec![runner("busy", true, false)];
                }),
                vec![],
                wait("waiting for 1 runner(s) to finish their job"),
            ),
            (
                "a runner being deleted is waited for, not deleted again",
                Box::new(|o| {
                    stopped_and_pinned(o);
                    o.runners = vec![runner("idle", false, true)];
                }),
                vec![],
                wait("waiting for 1 runner(s) to go"),
            ),
            (
                "with the runners gone the set is deleted",
                Box::new(|o| {
                    stopped_and_pinned(o);
                    o.runners.clear();
                }),
                vec![DeleteRunnerSet],
                wait("waiting for the EphemeralRunnerSet to go"),
            ),
            (
                "a set being deleted is waited for, neither pinned nor deleted again",
                Box::new(|o| {
                    o.listener_running = false;
                    o.runner_set = Some(RunnerSetState {
                        pinned: false,
                        deleting: true,
                    });
                    o.runners.clear();
                }),
                vec![],
                wait("waiting for the EphemeralRunnerSet to go"),
            ),
            (
                "with the set gone the scale set is deleted in the service, then the finalizer",
                Box::new(only_the_scale_set_left),
                vec![DeleteScaleSet(7), RemoveFinalizer],
                Deletion::Done,
            ),
            (
                "held credentials are released once the scale set is gone",
                Box::new(|o| {
                    only_the_scale_set_left(o);
                    o.credentials_held = true;
                }),
                vec![DeleteScaleSet(7), ReleaseCredentials, RemoveFinalizer],
                Deletion::Done,
            ),
            (
                "credentials another set names stay held",
                Box::new(|o| {
                    only_the_scale_set_left(o);
                    o.credentials_held = true;
                    o.credentials_shared = true;
                }),
                vec![DeleteScaleSet(7), RemoveFinalizer],
                Deletion::Done,
            ),
            (
                "credentials are kept while runners still need them",
                Box::new(|o| {
                    stopped_and_pinned(o);
                    o.credentials_held = true;
                    o.runners = vec![runner("idle", false, true)];
                }),
                vec![],
                wait("waiting for 1 runner(s) to go"),
            ),
            (
                "a scale set never registered only drops the finalizer",
                Box::new(|o| {
                    only_the_scale_set_left(o);
                    o.scale_set_id = None;
                    o.secret_present = false;
                }),
                vec![RemoveFinalizer],
                Deletion::Done,
            ),
            (
                "a gone Secret blocks with a reason and an event instead of hanging silently",
                Box::new(|o| {
                    only_the_scale_set_left(o);
                    o.secret_present = false;
                }),
                vec![
                    WriteStatus(StatusChange::Conditions(vec![blocked_condition(at(0))])),
                    Publish(Notice::warning("DeletionBlocked", BLOCKED).during("Delete")),
                ],
                Deletion::Blocked(BLOCKED.into()),
            ),
            (
                "a block already reported is not reported again",
                Box::new(|o| {
                    only_the_scale_set_left(o);
                    o.secret_present = false;
                    o.conditions = vec![blocked_condition(at(-60))];
                    o.now = at(30);
                }),
                vec![],
                Deletion::Blocked(BLOCKED.into()),
            ),
            (
                "the force annotation removes the object without the service",
                Box::new(|o| {
                    only_the_scale_set_left(o);
                    o.secret_present = false;
                    o.force = true;
                }),
                vec![RemoveFinalizer],
                Deletion::Done,
            ),
            (
                "force with the Secret present still deletes the scale set",
                Box::new(|o| {
                    only_the_scale_set_left(o);
                    o.force = true;
                }),
                vec![DeleteScaleSet(7), RemoveFinalizer],
                Deletion::Done,
            ),
            (
                "a scale set handed on stays registered",
                Box::new(|o| {
                    only_the_scale_set_left(o);
                    o.keep_scale_set = true;
                }),
                vec![RemoveFinalizer],
                Deletion::Done,
            ),
            (
                "a scale set handed on has its runners removed first, busy ones waited for",
                Box::new(|o| o.keep_scale_set = true),
                vec![StopListener, PinRunnerSet, DeleteRunner("idle".into())],
                wait("waiting for 1 runner(s) to finish their job"),
            ),
            (
                "force never cancels a job",
                Box::new(|o| o.force = true),
                vec![StopListener, PinRunnerSet, DeleteRunner("idle".into())],
                wait("waiting for 1 runner(s) to finish their job"),
            ),
        ];
        for (name, change, steps, then) in cases {
            let mut observed = deleting();
            change(&mut observed);
            assert_eq!(
                plan_deletion(&observed),
                DeletionPlan { steps, then },
                "{name}"
            );
        }
    }

    #[test]
    fn a_deletion_looks_again_soon_while_waiting_slowly_while_blocked_and_never_when_done() {
        assert_eq!(
            Deletion::Waits(String::new()).look_again(),
            Some(DELETION_POLL)
        );
        assert_eq!(
            Deletion::Blocked(String::new()).look_again(),
            Some(BLOCKED_POLL)
        );
        assert_eq!(Deletion::Done.look_again(), None);
    }
}
