//! A runner's registration going before its pod and Secret: when it ended,
//! when it is deleted, when its Secret is lost, when its pod is stuck.

use super::*;
use crate::api::ephemeral_runner::PolicyFallbackReason;
use crate::policy::types::RunnerPhase;

#[test]
fn a_finished_runner_keeps_its_pod_until_its_registration_is_gone() {
    let done = || Runner::new().registered(7).phase(Failed);
    // The policy is asked first.
    let need = case(done()).secret(7).pod(exited(1)).run().unwrap_err();
    assert!(
        matches!(need, Need::Verdict(ref e) if e.phase == RunnerPhase::Failed && e.registered),
        "{need:?}"
    );
    // remove-now: handed to the pool, the pod stays.
    let steps = case(done())
        .secret(7)
        .pod(exited(1))
        .verdict(Verdict::RemoveNow)
        .steps();
    assert_eq!(describe(&steps), HANDED_TO_THE_POOL);
    // While the pool works (also while it waits out JobStillRunning), the pod stays.
    let steps = case(done())
        .secret(7)
        .pod(exited(1))
        .pool(PoolView::Claimed)
        .steps();
    assert!(!kinds(&steps).contains(&"delete-pod"), "{steps:?}");
    // Removed: recorded, and only then the pod and Secret go.
    let steps = case(done())
        .secret(7)
        .pod(exited(1))
        .pool(PoolView::Removed)
        .steps();
    assert_eq!(describe(&steps), REMOVED_THEN_CLEANED_UP);
    // Not found counts as gone.
    let steps = case(done())
        .secret(7)
        .pod(exited(1))
        .pool(PoolView::NotFound)
        .steps();
    assert!(kinds(&steps).contains(&"delete-pod"));
    // The pool gave up: retried later, the pod stays.
    let plan = case(done())
        .secret(7)
        .pod(exited(1))
        .pool(PoolView::Failed("503".into()))
        .run()
        .unwrap();
    assert_eq!(
        describe(&plan.steps),
        [
            "event Warning DeregistrationFailed",
            "count remove-now failed"
        ]
    );
    assert_eq!(plan.requeue, Some(Duration::from_secs(15)));
    // Gone already: the rest is cleaned up, nothing asked.
    let steps = case(done().gone(RegisteredReason::Removed))
        .secret(7)
        .pod(exited(1))
        .steps();
    assert_eq!(kinds(&steps), vec!["delete-pod", "delete-secret"]);
}

#[test]
fn a_removal_asked_for_after_the_job_is_counted_as_it_was_asked() {
    let runner = Runner::new()
        .registered(7)
        .registration(RegisteredReason::RemoveAfterJob)
        .phase(Failed);
    let steps = case(runner)
        .secret(7)
        .pod(exited(1))
        .pool(PoolView::Removed)
        .steps();
    assert!(
        steps.contains(&Step::CountDeregistration {
            verdict: "remove-after-job",
            outcome: "removed"
        }),
        "{steps:?}"
    );
}

#[test]
fn a_self_deregistered_runner_costs_no_removal() {
    let runner = Runner::new()
        .registered(7)
        .phase(Succeeded)
        .status(|s| s.exit_code = Some(0));
    let steps = case(runner)
        .secret(7)
        .pod(exited(0))
        .verdict(Verdict::SelfDeregistered)
        .steps();
    assert_eq!(
        describe(&steps),
        [
            "status Registered=SelfDeregistered",
            "count self-deregistered skipped",
            "delete-pod pod-1"
        ]
    );
    assert_eq!(
        registered_condition(&steps),
        Some((false, RegisteredReason::SelfDeregistered))
    );
}

#[test]
fn a_policy_fallback_is_reported_on_the_runner() {
    let runner = Runner::new().registered(7).phase(Failed);
    let mut fell_back = case(runner).secret(7).pod(exited(1));
    fell_back.verdict = Some(VerdictView {
        verdict: Verdict::RemoveNow,
        fallback_reason: Some("timeout".into()),
    });
    let steps = fell_back.steps();
    assert_eq!(
        condition_of::<PolicyFallbackReason>(&steps),
        Some((true, PolicyFallbackReason::Fallback))
    );
    assert!(steps.iter().any(|s| matches!(
        s,
        Step::Event {
            reason: EventReason::PolicyFallback,
            severity: Severity::Warning,
            ..
        }
    )));
    // Told once: a runner already on the fallback is not told again, and
    // the configured policy answering again is recorded.
    let on_fallback = fell_back
        .clone()
        .runner
        .status(|s| s.conditions.push(cond(PolicyFallbackReason::Fallback)));
    let again = Case {
        runner: on_fallback.clone(),
        ..fell_back
    };
    assert!(!event_reasons(&again.steps()).contains(&EventReason::PolicyFallback));
    let steps = case(on_fallback)
        .secret(7)
        .pod(exited(1))
        .verdict(Verdict::RemoveNow)
        .steps();
    assert_eq!(
        condition_of::<PolicyFallbackReason>(&steps),
        Some((false, PolicyFallbackReason::PolicyAnswered))
    );
}

#[test]
fn a_pod_stuck_terminating_is_force_deleted_after_the_bound() {
    let terminating = |since| {
        let mut p = exited(1);
        p.deleting_since = Some(at(since));
        p
    };
    let done = || {
        Runner::new()
            .registered(7)
            .phase(Failed)
            .gone(RegisteredReason::Removed)
    };
    let plan = case(done()).pod(terminating(0)).now(30).run().unwrap();
    assert_eq!(plan.steps, vec![]);
    assert_eq!(plan.requeue, Some(Duration::from_secs(30)));
    let steps = case(done()).pod(terminating(0)).now(60).steps();
    assert_eq!(
        describe(&steps),
        ["force-delete-pod pod-1", "event Warning PodForceDeleted"]
    );
    // Also a pod someone else deleted while the runner was running.
    let steps = case(Runner::new().registered(7).phase(Running))
        .secret(7)
        .pod(terminating(0))
        .now(61)
        .steps();
    assert_eq!(kinds(&steps), vec!["force-delete-pod", "event"]);
}

#[test]
fn a_deleted_runner_using_container_hooks_deletes_their_objects_once_its_registration_is_gone() {
    let deleting = || {
        Runner::new()
            .with_container_hooks()
            .registered(7)
            .phase(Running)
            .deleting()
    };
    // While the registration may still take a job, the job's pods are not
    // even looked at: deleting them would kill the job.
    let steps = case(deleting())
        .secret(7)
        .pod(pod(RunnerContainer::Running))
        .pool(PoolView::Claimed)
        .steps();
    assert_eq!(kinds(&steps), Vec::<&str>::new());
    // Gone: the hooks' objects are asked about, with the pod and Secret.
    let gone = || deleting().gone(RegisteredReason::Removed);
    let need = case(gone()).secret(7).run().unwrap_err();
    assert_eq!(need, Need::HookObjects);
    let plan = case(gone()).secret(7).hook_objects(2).run().unwrap();
    assert_eq!(
        kinds(&plan.steps),
        vec!["delete-secret", "delete-hook-objects"]
    );
    assert!(plan.requeue.is_some(), "looked at again until they go");
    // All gone or going: the finalizer goes.
    let steps = case(gone()).hook_objects(0).steps();
    assert_eq!(kinds(&steps), vec!["remove-finalizer"]);
    // A runner without hooks never asks.
    let steps = case(Runner::new().deleting().gone(RegisteredReason::Removed)).steps();
    assert_eq!(kinds(&steps), vec!["remove-finalizer"]);
}

#[test]
fn deletion_holds_the_finalizer_until_everything_is_gone() {
    let deleting = || Runner::new().registered(7).phase(Running).deleting();
    assert!(matches!(
        case(deleting())
            .secret(7)
            .pod(pod(RunnerContainer::Running))
            .run(),
        Err(Need::Verdict(_))
    ));
    let steps = case(deleting())
        .secret(7)
        .pod(pod(RunnerContainer::Running))
        .verdict(Verdict::RemoveNow)
        .steps();
    assert_eq!(describe(&steps), HANDED_TO_THE_POOL);
    // Job still running: the pool keeps retrying; the pod stays.
    let steps = case(deleting())
        .secret(7)
        .pod(pod(RunnerContainer::Running))
        .pool(PoolView::Claimed)
        .steps();
    assert_eq!(kinds(&steps), Vec::<&str>::new());
    // Unknown to the service: does not hang.
    let steps = case(deleting())
        .secret(7)
        .pod(pod(RunnerContainer::Running))
        .pool(PoolView::NotFound)
        .steps();
    assert_eq!(
        describe(&steps),
        [
            "status Registered=NotFound",
            "event Normal RegistrationRemoved",
            "count remove-now not-found",
            "delete-pod pod-1",
            "delete-secret"
        ]
    );
    // Pod and Secret gone: the finalizer goes.
    let steps = case(deleting().gone(RegisteredReason::NotFound)).steps();
    assert_eq!(kinds(&steps), vec!["remove-finalizer"]);
    // Never registered: nothing to remove.
    let steps = case(Runner::new().deleting()).steps();
    assert_eq!(
        describe(&steps),
        ["status Registered=NeverRegistered", "remove-finalizer"]
    );
    // Without the finalizer, nothing is ours to do.
    assert_eq!(
        kinds(&case(Runner::new().deleting().no_finalizer()).steps()),
        Vec::<&str>::new()
    );
}

#[test]
fn a_registration_the_runner_never_recorded_is_found_by_name_and_removed() {
    // Nothing recorded: the service is asked before the finalizer goes.
    let need = case(Runner::new().deleting())
        .by_name(None)
        .run()
        .unwrap_err();
    assert_eq!(need, Need::RegistrationByName);
    // It has one (a host stopped between registering and storing the
    // config): recorded, and removed as any registration, policy unasked.
    let steps = case(Runner::new().deleting())
        .by_name(Some(Some(42)))
        .steps();
    assert_eq!(
        describe(&steps),
        [
            "status runnerId=42 Registered=RemoveNow",
            "deregister 42",
            "event Normal Deregistering"
        ]
    );
    let status = status_of(&steps);
    assert_eq!(
        status.runner_id,
        Some(42),
        "the next pass follows the removal by id"
    );
}

#[test]
fn a_lost_secret_means_a_new_registration_after_the_old_one_goes() {
    // Registered, the Secret is gone: the old registration is removed first.
    let steps = case(Runner::new().registered(7).phase(Pending)).steps();
    assert_eq!(describe(&steps), HANDED_TO_THE_POOL);
    // A Secret whose registration is gone is deleted, then a new one is made.
    let steps = case(Runner::new().registered(7).gone(RegisteredReason::Removed))
        .secret(7)
        .steps();
    assert_eq!(kinds(&steps), vec!["delete-secret"]);
    // A Secret newer than the status (a crash after writing it) is adopted.
    let steps = case(Runner::new().registered(7).gone(RegisteredReason::Removed))
        .secret(8)
        .steps();
    assert_eq!(
        describe(&steps),
        [
            "status runnerId=8 Registered=JitConfigCreated",
            "create-pod"
        ]
    );
    assert_eq!(
        registered_condition(&steps),
        Some((true, RegisteredReason::JitConfigCreated))
    );
}
