//! The status writes as the API server receives them: the typed change
//! serialises into the merge patch the controller has always written.

use serde_json::json;

use super::*;

fn written(steps: &[Step]) -> serde_json::Value {
    let Some(Step::PatchStatus(change) | Step::InformStatus(change)) = steps.first() else {
        panic!("no status write first: {steps:?}")
    };
    serde_json::to_value(change).unwrap()
}

#[test]
fn a_phase_change_clears_the_reason_and_message_it_leaves_behind() {
    let runner = Runner::new().registered(7).phase(Pending).status(|s| {
        s.reason = Some("Left".into());
        s.message = Some("by an older version".into());
    });
    let steps = case(runner)
        .secret(7)
        .pod(pod(RunnerContainer::Running))
        .steps();
    assert_eq!(
        written(&steps),
        json!({"status": {"phase": "Running", "reason": null, "message": null, "ready": true}})
    );
}

#[test]
fn a_hold_is_written_with_its_times_cause_and_conditions() {
    let steps = case(holding().job_failed_at(4))
        .secret(7)
        .pod(exited(1))
        .held(0)
        .steps();
    let message = format!("the job failed; held for debugging until {}", at(604));
    assert_eq!(
        written(&steps),
        json!({"status": {
            "phase": "Debugging",
            "reason": "HeldForDebugging",
            "message": message,
            "exitCode": 1,
            "terminationReason": "Error",
            "heldSince": "2027-01-15T08:00:04Z",
            "holdUntil": "2027-01-15T08:10:04Z",
            "holdCause": "JobFailed",
            "conditions": [
                {"type": "Registered", "status": "True", "reason": "RemoveNow",
                 "message": "removal of registration 7 requested (remove-now)",
                 "lastTransitionTime": "2027-01-15T07:43:20Z"},
                {"type": "HeldForDebugging", "status": "True", "reason": "HeldForDebugging",
                 "message": message, "lastTransitionTime": "2027-01-15T08:00:10Z"},
            ],
        }})
    );
}

#[test]
fn clearing_a_late_job_record_is_conditional_on_the_runner_as_read() {
    let mut runner = Runner::new()
        .renewed(1)
        .registered(9)
        .phase(Running)
        .status(|s| {
            s.job_id = Some("old-job".into());
            s.job_request_id = 3;
            s.job_runner_id = 7;
            s.job_result = Some("failed".into());
        });
    runner.0.metadata.resource_version = Some("41".into());
    let steps = case(runner)
        .secret(9)
        .pod(pod(RunnerContainer::Running))
        .made_for(1)
        .steps();
    assert_eq!(
        written(&steps),
        json!({
            "metadata": {"resourceVersion": "41"},
            "status": {
                "ready": true,
                "jobRequestId": null, "jobRunnerId": null, "jobId": null,
                "workflowRunId": null, "jobResult": null,
            },
        })
    );
}

#[test]
fn a_later_registration_is_written_as_pending_and_registered() {
    let record = RegistrationRecord::new(
        &Runner::new()
            .registered(7)
            .gone(RegisteredReason::Removed)
            .0
            .status
            .unwrap(),
        at(10),
    );
    assert_eq!(
        serde_json::to_value(record.change(8, "r")).unwrap(),
        json!({"status": {
            "runnerId": 8, "runnerName": "r", "phase": "Pending", "ready": false,
            "conditions": [{"type": "Registered", "status": "True", "reason": "JitConfigCreated",
                            "message": "registered as runner 8",
                            "lastTransitionTime": "2027-01-15T08:00:10Z"}],
        }})
    );
}

#[test]
fn a_time_that_differs_below_the_second_is_no_change() {
    // The hold ends half a second after what the status says: written to
    // the second, that is what it says already.
    let until = at(600)
        .checked_add(jiff::SignedDuration::from_millis(500))
        .unwrap();
    let held = holding()
        .job_failed_at(0)
        .held(0, 600)
        .gone(RegisteredReason::Removed)
        .hold_until(&until.to_string());
    let plan = case(held).secret(7).pod(exited(0)).now(100).run().unwrap();
    assert_eq!(plan.steps, vec![]);
    assert_eq!(plan.requeue, Some(Duration::from_millis(500_500)));
}

#[test]
fn the_cleared_job_record_names_only_job_fields() {
    let all = EphemeralRunnerStatus {
        job_runner_id: 7,
        job_id: Some("j".into()),
        job_repository_name: Some("o/r".into()),
        job_workflow_ref: Some("w".into()),
        job_display_name: Some("d".into()),
        job_started_at: Some(Time(at(0))),
        job_result: Some("failed".into()),
        job_finished_at: Some(Time(at(1))),
        ..EphemeralRunnerStatus::default()
    };
    let cleared = serde_json::to_value(ClearedJobRecord::of(&all)).unwrap();
    let mut keys: Vec<&str> = cleared
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let mut fields = crate::api::JOB_FIELDS.to_vec();
    keys.sort_unstable();
    fields.sort_unstable();
    assert_eq!(keys, fields);
    assert!(cleared.as_object().unwrap().values().all(|v| v.is_null()));
}
