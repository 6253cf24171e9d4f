//! Holding a failed job's runner for debugging: entering the hold, what
//! keeps a failure from being held, telling Slack, and ending the hold.

use super::*;
use crate::api::ephemeral_runner::HoldCause;

#[test]
fn a_failed_job_holds_the_runner_and_removes_its_registration() {
    // The listener recorded the failure while the pod still runs.
    let failed = || holding().job_failed_at(4);
    let need = case(failed())
        .secret(7)
        .pod(pod(RunnerContainer::Running))
        .run()
        .unwrap_err();
    assert_eq!(need, Need::HeldCount, "maxHeld is checked first");
    let plan = case(failed())
        .secret(7)
        .pod(pod(RunnerContainer::Running))
        .held(0)
        .run()
        .unwrap();
    assert_eq!(
        describe(&plan.steps),
        [
            format!(
                "status phase=Debugging reason=HeldForDebugging heldSince={} holdUntil={} \
                 holdCause=JobFailed Registered=RemoveNow HeldForDebugging=HeldForDebugging",
                at(4),
                at(604)
            )
            .as_str(),
            "event Warning HeldForDebugging",
            "deregister 7",
            "event Normal Deregistering"
        ],
        "10m after the job's end"
    );
    assert_eq!(
        message_of(&plan.steps),
        Some(format!(
            "the job failed; held for debugging until {}",
            at(604)
        ))
    );
    assert_eq!(
        plan.requeue,
        Some(Duration::from_secs(30)),
        "the removal recheck"
    );
    // The runner crashing mid-job holds it too, counted from when it was seen.
    let steps = case(holding().with_job())
        .secret(7)
        .pod(exited(1))
        .held(0)
        .steps();
    let status = status_of(&steps);
    assert_eq!(status.phase, Some(Debugging));
    assert_eq!(status.exit_code, Some(1));
    assert_eq!(status.held_since, Some(Time(at(10))));
    assert_eq!(status.hold_cause, Some(HoldCause::RunnerExited));
    assert!(
        message_of(&steps)
            .unwrap()
            .starts_with("the runner exited 1 (Error) while running a job; held"),
        "{steps:?}"
    );
    assert!(kinds(&steps).contains(&"deregister"));
    assert!(!kinds(&steps).contains(&"delete-pod"));
}

#[test]
fn a_failure_is_not_held_without_a_hold_beyond_max_held_or_with_a_bad_spec() {
    // No debug spec: a failed job's runner ends as usual, nothing asked.
    let steps = case(Runner::new().registered(7).phase(Running).job_failed_at(4))
        .secret(7)
        .pod(exited(0))
        .steps();
    assert_eq!(status_of(&steps).phase, Some(Succeeded));
    // maxHeld reached: it ends as usual, and says why once.
    let steps = case(holding().job_failed_at(4))
        .secret(7)
        .pod(exited(0))
        .held(1)
        .steps();
    assert_eq!(status_of(&steps).phase, Some(Succeeded));
    assert_eq!(
        condition_of::<HeldReason>(&steps),
        Some((false, HeldReason::MaxHeld))
    );
    assert!(event_reasons(&steps).contains(&EventReason::NotHeld));
    let told = holding()
        .job_failed_at(4)
        .status(|s| s.conditions.push(cond(HeldReason::MaxHeld)));
    let steps = case(told).secret(7).pod(exited(0)).held(1).steps();
    assert!(!event_reasons(&steps).contains(&EventReason::NotHeld));
    // An invalid spec is reported and not followed.
    let mut bad = holding().job_failed_at(4);
    bad.0.spec.debug.as_mut().unwrap().max_hold = Some("5m".into());
    let steps = case(bad).secret(7).pod(exited(0)).steps();
    assert_eq!(status_of(&steps).phase, Some(Succeeded));
    assert!(event_reasons(&steps).contains(&EventReason::InvalidDebugSpec));
    assert_eq!(
        condition_of::<HeldReason>(&steps),
        Some((false, HeldReason::InvalidDebugSpec))
    );
    // A failure learnt after its hold would have ended is not held.
    let steps = case(holding().job_failed_at(4))
        .secret(7)
        .pod(exited(0))
        .held(0)
        .now(604)
        .steps();
    assert_eq!(status_of(&steps).phase, Some(Succeeded));
    // A job that succeeded is never held.
    let ok = holding()
        .with_job()
        .status(|s| s.job_result = Some("succeeded".into()));
    let steps = case(ok).secret(7).pod(exited(0)).steps();
    assert_eq!(status_of(&steps).phase, Some(Succeeded));
}

#[test]
fn a_clean_exit_after_a_job_waits_a_little_for_the_jobs_result() {
    // Exited 0 at 5 with no result recorded yet: wait until 20.
    let plan = case(holding().with_job())
        .secret(7)
        .pod(exited(0))
        .now(10)
        .run()
        .unwrap();
    assert_eq!(plan.steps, vec![]);
    assert_eq!(plan.requeue, Some(Duration::from_secs(10)));
    // No result by then: Succeeded, as without a hold.
    let steps = case(holding().with_job())
        .secret(7)
        .pod(exited(0))
        .now(20)
        .steps();
    assert_eq!(status_of(&steps).phase, Some(Succeeded));
    // Without a hold there is nothing to wait for.
    let steps = case(Runner::new().registered(7).phase(Running).with_job())
        .secret(7)
        .pod(exited(0))
        .now(10)
        .steps();
    assert_eq!(status_of(&steps).phase, Some(Succeeded));
}

fn with_slack(mut runner: Runner) -> Runner {
    runner.0.spec.debug.as_mut().unwrap().slack = Some(crate::api::SlackSpec {
        channel: "#ci".into(),
        token_secret_ref: crate::api::SecretKeyRef {
            name: "slack".into(),
            key: None,
        },
    });
    runner
}

fn slack_posts(steps: &[Step]) -> Vec<HeldFailure> {
    steps
        .iter()
        .filter_map(|s| match s {
            Step::NotifySlack(failure) => Some(failure.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_hold_is_told_to_slack_until_slack_accepted_it() {
    // The hold begins: the post is asked for with the status write.
    let steps = case(with_slack(holding().job_failed_at(4)))
        .secret(7)
        .pod(pod(RunnerContainer::Running))
        .held(0)
        .steps();
    let posts = slack_posts(&steps);
    assert_eq!(posts.len(), 1);
    assert_eq!(posts[0].why, "the job failed");
    assert_eq!(posts[0].hold_until, at(604));
    // A later pass of the hold, with no post accepted (the host stopped
    // before it, or Slack refused it): asked again, saying the same.
    let held = || {
        with_slack(holding().job_failed_at(4).held(4, 604)).status(|s| {
            s.hold_cause = Some(HoldCause::JobFailed);
            s.conditions.push(Condition {
                message: format!("the job failed; held for debugging until {}", at(604)),
                ..cond(HeldReason::HeldForDebugging)
            });
        })
    };
    // Later passes: 100 s in, the registration removed.
    let later = |runner: Runner| {
        case(runner.gone(RegisteredReason::Removed))
            .secret(7)
            .pod(pod(RunnerContainer::Running))
            .now(100)
            .run()
            .unwrap()
    };
    let plan = later(held());
    let posts = slack_posts(&plan.steps);
    assert_eq!(posts.len(), 1);
    assert_eq!(posts[0].why, "the job failed");
    assert_eq!(posts[0].hold_until, at(604));
    assert_eq!(plan.requeue, Some(Duration::from_secs(504)));
    let refused = held().status(|s| s.conditions.push(cond(SlackNotifiedReason::PostFailed)));
    assert_eq!(slack_posts(&later(refused).steps).len(), 1);
    // Accepted: never again.
    let told = held().status(|s| s.conditions.push(cond(SlackNotifiedReason::Posted)));
    let steps = later(told).steps;
    assert!(slack_posts(&steps).is_empty(), "{steps:?}");
    // Without a Slack channel there is nothing to tell.
    let steps = later(holding().job_failed_at(4).held(4, 604)).steps;
    assert!(slack_posts(&steps).is_empty(), "{steps:?}");
    // Why it is held is read from the status, never from a message: a
    // runner held for its exit says so again, whatever its messages say.
    let crashed = held().status(|s| {
        s.hold_cause = Some(HoldCause::RunnerExited);
        s.exit_code = Some(137);
        s.termination_reason = Some("OOMKilled".into());
    });
    let posts = slack_posts(&later(crashed).steps);
    assert_eq!(
        posts[0].why,
        "the runner exited 137 (OOMKilled) while running a job"
    );
}

#[test]
fn a_held_runner_keeps_its_pod_until_the_hold_ends() {
    let held = || holding().job_failed_at(0).held(0, 600);
    // Its registration being removed: the pod stays.
    let plan = case(held().registration(RegisteredReason::RemoveNow))
        .secret(7)
        .pod(exited(0))
        .pool(PoolView::Claimed)
        .now(100)
        .run()
        .unwrap();
    assert_eq!(plan.steps, vec![]);
    assert_eq!(plan.requeue, Some(Duration::from_secs(30)));
    // Removed: recorded; the pod stays until the deadline.
    let plan = case(held())
        .secret(7)
        .pod(exited(0))
        .pool(PoolView::Removed)
        .now(100)
        .run()
        .unwrap();
    assert_eq!(
        registered_condition(&plan.steps),
        Some((false, RegisteredReason::Removed))
    );
    assert!(!kinds(&plan.steps).contains(&"delete-pod"));
    assert_eq!(plan.requeue, Some(Duration::from_secs(500)));
    // Gone, before the deadline: nothing to do but wait.
    let gone = || held().gone(RegisteredReason::Removed);
    let plan = case(gone())
        .secret(7)
        .pod(exited(0))
        .now(100)
        .run()
        .unwrap();
    assert_eq!(plan.steps, vec![]);
    assert_eq!(plan.requeue, Some(Duration::from_secs(500)));
    // At the deadline: Failed, and the pod and Secret go.
    let steps = case(gone()).secret(7).pod(exited(0)).now(600).steps();
    assert_eq!(
        describe(&steps),
        [
            "status phase=Failed reason=HoldEnded Registered=Removed HeldForDebugging=HoldEnded",
            "event Normal HoldEnded",
            "delete-pod pod-1",
            "delete-secret"
        ]
    );
    // At the deadline with the removal still under way: Failed, the pod
    // still waits for the registration to go.
    let steps = case(held())
        .secret(7)
        .pod(exited(0))
        .pool(PoolView::Claimed)
        .now(600)
        .steps();
    assert_eq!(status_of(&steps).phase, Some(Failed));
    assert!(!kinds(&steps).contains(&"delete-pod"));
    // A pod someone deleted ends the hold.
    let steps = case(gone()).secret(7).now(100).steps();
    assert_eq!(status_of(&steps).reason, Some(Some(PhaseReason::HoldEnded)));
    assert_eq!(
        message_of(&steps).as_deref(),
        Some("the runner pod is gone")
    );
    assert_eq!(kinds(&steps), vec!["status", "event", "delete-secret"]);
}

#[test]
fn the_annotation_extends_or_releases_within_the_cap() {
    let held = || {
        holding()
            .job_failed_at(0)
            .held(0, 600)
            .gone(RegisteredReason::Removed)
    };
    let rows: Vec<(&str, String, i64, Option<&str>)> = vec![
        ("extended", at(1800).to_string(), 1800, None),
        (
            "capped at an hour after the job",
            at(99_999).to_string(),
            3600,
            Some("past the cap"),
        ),
        (
            "unreadable: the default",
            "soon".into(),
            600,
            Some("not an RFC 3339 time"),
        ),
    ];
    for (name, value, until, note) in rows {
        let plan = case(held().hold_until(&value))
            .secret(7)
            .pod(exited(0))
            .now(100)
            .run()
            .unwrap();
        let status = status_of(&plan.steps);
        if until == 600 {
            assert!(status.hold_until.is_none(), "{name}: unchanged");
        } else {
            assert_eq!(status.hold_until, Some(Time(at(until))), "{name}");
        }
        assert_eq!(
            plan.requeue,
            Some(Duration::from_secs((until - 100) as u64)),
            "{name}"
        );
        match note {
            Some(note) => assert!(
                message_of(&plan.steps).unwrap().contains(note),
                "{name}: {status:?}"
            ),
            None => assert!(status.message.is_none(), "{name}"),
        }
        // Past the effective end, the hold ends.
        let steps = case(held().hold_until(&value))
            .secret(7)
            .pod(exited(0))
            .now(until)
            .steps();
        assert_eq!(status_of(&steps).phase, Some(Failed), "{name}");
    }
    // A time in the past releases now.
    let steps = case(held().hold_until(&at(50).to_string()))
        .secret(7)
        .pod(exited(0))
        .now(100)
        .steps();
    assert_eq!(status_of(&steps).reason, Some(Some(PhaseReason::HoldEnded)));
    assert!(kinds(&steps).contains(&"delete-pod"));
}

#[test]
fn a_held_runner_being_deleted_is_cleaned_up_as_usual() {
    let deleting = holding()
        .job_failed_at(0)
        .held(0, 600)
        .gone(RegisteredReason::Removed)
        .deleting();
    let steps = case(deleting).secret(7).pod(exited(0)).now(100).steps();
    assert_eq!(describe(&steps), vec!["delete-pod pod-1", "delete-secret"]);
}
