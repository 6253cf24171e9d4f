//! Starts that fail: counted, backed off, recreated registration first,
//! and stopped at the limit; a runner that never comes online.

use super::*;

#[test]
fn failed_starts_back_off_and_stop_at_the_limit() {
    let running = || Runner::new().registered(7).phase(Running);
    // First failure: recorded, the registration removed before the pod goes.
    let steps = case(running()).secret(7).pod(exited(1)).steps();
    assert_eq!(
        kinds(&steps),
        vec!["status", "event", "deregister", "event"]
    );
    let status = status_of(&steps);
    assert!(
        status.failures.as_ref().unwrap().contains_key("pod-1"),
        "{status:?}"
    );
    assert_eq!(status.phase, Some(Pending));
    // The policy is not asked for a start that failed: the registration surely exists.
    // Once gone: pod and Secret deleted.
    // (as the first pass left it: failure recorded, exit code seen)
    let recorded = running()
        .gone(RegisteredReason::Removed)
        .phase(Pending)
        .status(|s| {
            s.failures.insert("pod-1".into(), Time(at(0)));
            s.exit_code = Some(1);
            s.termination_reason = Some("Error".into());
        });
    let steps = case(recorded).secret(7).pod(exited(1)).steps();
    assert_eq!(describe(&steps), vec!["delete-pod pod-1", "delete-secret"]);
    // Then the backoff: 5 s after the first failure, 10 s after the second.
    let backing_off = |failures| {
        Runner::new()
            .registered(7)
            .gone(RegisteredReason::Removed)
            .failures(failures, 8)
    };
    let plan = case(backing_off(1)).now(10).run().unwrap();
    assert_eq!(plan.steps, vec![]);
    assert_eq!(plan.requeue, Some(Duration::from_secs(3)));
    let plan = case(backing_off(2)).now(10).run().unwrap();
    assert_eq!(plan.requeue, Some(Duration::from_secs(8)));
    // After it: registered again, and recorded at once (not the first).
    assert_eq!(
        describe(
            &case(
                Runner::new()
                    .registered(7)
                    .gone(RegisteredReason::Removed)
                    .failures(1, 0)
            )
            .now(10)
            .steps()
        ),
        vec!["register recorded", "create-pod"]
    );
    // The fifth failure marks it Failed.
    let steps = case(running().failures(4, 0))
        .secret(7)
        .pod(exited(1))
        .steps();
    let status = status_of(&steps);
    assert_eq!(status.phase, Some(Failed));
    assert_eq!(status.reason, Some(Some(PhaseReason::TooManyFailures)));
    assert!(!kinds(&steps).contains(&"delete-pod"));
    // A failure with a job is not retried: the job is lost.
    let steps = case(running().with_job()).secret(7).pod(exited(1)).steps();
    let status = status_of(&steps);
    assert_eq!(status.phase, Some(Failed));
    assert_eq!(status.reason, Some(Some(PhaseReason::JobFailed)));
    assert_eq!(
        message_of(&steps).as_deref(),
        Some("the runner exited 1 (Error) while running a job")
    );
}

#[test]
fn backoff_doubles_up_to_its_cap() {
    let s = settings();
    let waits: Vec<u64> = (0..8).map(|n| s.backoff(n).as_secs()).collect();
    assert_eq!(waits, vec![0, 5, 10, 20, 40, 80, 80, 80]);
}

#[test]
fn the_registration_timeout_counts_from_the_runner_containers_start() {
    let waiting = || Runner::new().registered(7).phase(Pending);
    // Init containers still running an hour after the pod was made: a
    // warm-up, not a runner failing to register. Nothing is asked, nothing
    // counted, and no timer is set (the pod's next status wakes the runner).
    let initialising = PodView {
        registration_clock: None,
        ..pod(RunnerContainer::Waiting)
    };
    let plan = case(waiting())
        .secret(7)
        .pod(initialising)
        .now(3600)
        .run()
        .expect("nothing asked");
    assert_eq!(plan, Plan::default());
    // The runner container started 50 minutes after its pod was made: the
    // ten minutes run from there.
    let started_late = PodView {
        registration_clock: Some(at(3000)),
        ..pod(RunnerContainer::Running)
    };
    let running = || {
        Runner::new()
            .registered(7)
            .phase(Running)
            .status(|s| s.ready = true)
    };
    let plan = case(running())
        .secret(7)
        .pod(started_late.clone())
        .now(3300)
        .run()
        .unwrap();
    assert_eq!(plan.requeue, Some(Duration::from_secs(300)));
    let need = case(running())
        .secret(7)
        .pod(started_late)
        .now(3600)
        .run()
        .unwrap_err();
    assert_eq!(need, Need::Presence(7));
}

#[test]
fn a_runners_own_registration_timeout_wins_over_the_hosts() {
    let runner = |timeout: &str| {
        Runner::new()
            .registered(7)
            .phase(Running)
            .status(|s| s.ready = true)
            .registration_timeout(timeout)
    };
    let need = case(runner("1m"))
        .secret(7)
        .pod(pod(RunnerContainer::Running))
        .now(60)
        .run()
        .unwrap_err();
    assert_eq!(need, Need::Presence(7));
    // `0s` is no setting: the host's ten minutes.
    let plan = case(runner("0s"))
        .secret(7)
        .pod(pod(RunnerContainer::Running))
        .now(60)
        .run()
        .unwrap();
    assert_eq!(plan.requeue, Some(Duration::from_secs(540)));
}

#[test]
fn a_runner_that_never_comes_online_is_recreated() {
    let running = || {
        Runner::new()
            .registered(7)
            .phase(Running)
            .status(|s| s.ready = true)
    };
    // Before the timeout: look again when it passes, ask nothing.
    let plan = case(running())
        .secret(7)
        .pod(pod(RunnerContainer::Running))
        .now(100)
        .run()
        .unwrap();
    assert_eq!(plan.requeue, Some(Duration::from_secs(500)));
    // At the timeout: ask the service.
    let need = case(running())
        .secret(7)
        .pod(pod(RunnerContainer::Running))
        .now(600)
        .run()
        .unwrap_err();
    assert_eq!(need, Need::Presence(7));
    // Online: remembered, never asked again.
    let steps = case(running())
        .secret(7)
        .pod(pod(RunnerContainer::Running))
        .now(600)
        .presence(Presence::Online)
        .steps();
    assert_eq!(
        describe(&steps),
        ["status Registered=JitConfigCreated RunnerOnline=Online"]
    );
    let online = running().status(|s| s.conditions.push(cond(OnlineReason::Online)));
    let plan = case(online)
        .secret(7)
        .pod(pod(RunnerContainer::Running))
        .now(6000)
        .run()
        .expect("nothing asked");
    assert_eq!(plan, Plan::default());
    // Offline: a failed start; the registration is removed before the pod goes.
    let steps = case(running())
        .secret(7)
        .pod(pod(RunnerContainer::Running))
        .now(600)
        .presence(Presence::Offline)
        .steps();
    assert_eq!(
        describe(&steps),
        [
            "status phase=Pending ready=false failures=1 Registered=RemoveNow",
            "event Warning RegistrationTimeout",
            "deregister 7",
            "event Normal Deregistering"
        ]
    );
}
