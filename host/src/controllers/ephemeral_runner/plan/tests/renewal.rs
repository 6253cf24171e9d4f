//! A runner renewed by its set for another job (`RunnerRenewal`): the pod
//! and Secret of the job before told apart from its own, and a late record
//! of the job before not taken for its job.

use super::*;

#[test]
fn a_renewed_runner_registers_anew_over_the_secret_of_the_job_before() {
    // The job before's pod went when it ended; its Secret stayed.
    let steps = case(Runner::new().renewed(1)).secret(7).made_for(0).steps();
    assert_eq!(
        steps,
        vec![
            Step::Register {
                replacing: Some("1".into()),
                record: None,
            },
            Step::CreatePod
        ],
        "no status write: the reset status is the renewal's own"
    );
    // Its registration 7 is gone with that job: nothing asks about it.
    assert_eq!(
        registration_id(
            &Runner::new().renewed(1).0.status.unwrap(),
            secret(7).as_ref()
        ),
        0
    );

    // The job before's pod, still going: waited out (the next pod has
    // its name), nothing registered meanwhile.
    let mut going = exited(0);
    going.deleting_since = Some(at(9));
    let steps = case(Runner::new().renewed(1))
        .secret(7)
        .pod(going)
        .made_for(0)
        .steps();
    assert_eq!(kinds(&steps), Vec::<&str>::new());
    let steps = case(Runner::new().renewed(1))
        .secret(7)
        .pod(exited(0))
        .made_for(0)
        .steps();
    assert_eq!(
        describe(&steps),
        vec!["delete-pod pod-1"],
        "not taken for this job's exit"
    );

    // Registered and running: the Running write carries the new
    // registration, as a first one's does.
    let steps = case(Runner::new().renewed(1))
        .secret(9)
        .pod(pod(RunnerContainer::Running))
        .made_for(1)
        .steps();
    assert_eq!(
        describe(&steps),
        ["status phase=Running ready=true runnerId=9 Registered=JitConfigCreated"]
    );
}

#[test]
fn a_late_record_of_the_job_before_a_renewal_is_not_the_runners_job() {
    let late = |r: Runner| {
        r.status(|s| {
            s.job_id = Some("old-job".into());
            s.job_request_id = 3;
            s.job_runner_id = 7;
            s.job_result = Some("failed".into());
        })
    };
    // Its pod, made for the renewal, runs registration 9.
    let running_on_9 = |r: Runner| {
        case(r)
            .secret(9)
            .pod(pod(RunnerContainer::Running))
            .made_for(1)
            .steps()
    };
    // Running on registration 9, it reads as idle; the record is no
    // reason for a write of its own.
    let runner = late(Runner::new().renewed(1).registered(9).phase(Running));
    assert!(!runner.0.status.as_ref().unwrap().has_job());
    let ready = runner.clone().status(|s| s.ready = true);
    let steps = running_on_9(ready);
    assert_eq!(steps, vec![]);
    // It goes with the next write (the pod turning ready, here), on the
    // condition that the runner is as read: a record of this
    // registration's job written since is not cleared blind.
    let mut runner = runner;
    runner.0.metadata.resource_version = Some("41".into());
    let steps = running_on_9(runner);
    assert_eq!(describe(&steps), ["status ready=true job-record-cleared"]);
    let Step::PatchStatus(change) = &steps[0] else {
        unreachable!()
    };
    // As written: the fields the record holds, null.
    let patch = serde_json::to_value(change).unwrap();
    assert_eq!(patch["metadata"]["resourceVersion"], "41");
    let status = &patch["status"];
    assert_eq!(status["ready"], true);
    for key in ["jobId", "jobRequestId", "jobRunnerId", "jobResult"] {
        assert!(
            status[key].is_null() && status.get(key).is_some(),
            "{key} cleared: {status}"
        );
    }
    // Its job is, and stays.
    let own = late(Runner::new().renewed(1).registered(9).phase(Running)).status(|s| {
        s.ready = true;
        s.job_runner_id = 9;
        s.job_result = None;
    });
    assert!(own.0.status.as_ref().unwrap().has_job());
    let steps = running_on_9(own);
    assert_eq!(steps, vec![]);
    // Before the runner registered again, any record is of the job
    // before: it registers, and the record goes with its Running write.
    let steps = case(late(Runner::new().renewed(1)))
        .secret(7)
        .made_for(0)
        .steps();
    assert_eq!(kinds(&steps), vec!["register", "create-pod"]);
    let steps = running_on_9(late(Runner::new().renewed(1)));
    assert_eq!(
        describe(&steps),
        [
            "status phase=Running ready=true runnerId=9 Registered=JitConfigCreated job-record-cleared"
        ]
    );
    let Step::PatchStatus(change) = &steps[0] else {
        unreachable!()
    };
    let status = &serde_json::to_value(change).unwrap()["status"];
    assert!(
        status["jobId"].is_null() && status.get("jobId").is_some(),
        "{status}"
    );
}

#[test]
fn a_renewed_runner_deleted_cleans_up_the_job_befores_objects() {
    let steps = case(Runner::new().renewed(1).deleting())
        .secret(7)
        .pod(exited(0))
        .made_for(0)
        .steps();
    assert_eq!(
        describe(&steps),
        [
            "status Registered=NeverRegistered",
            "delete-pod pod-1",
            "delete-secret"
        ]
    );
}

#[test]
fn a_runner_finishing_while_a_job_waits_is_renewed_in_one_status_write() {
    let finishing = || {
        case(Runner::new().registered(7).phase(Running).with_job())
            .secret(7)
            .pod(exited(0))
    };
    // The set is asked only once the runner's registration is proven
    // gone (the runner exited 0: it removed it itself).
    assert_eq!(
        finishing().renewal(None).steps_or_need(),
        Err(Need::Renewal)
    );
    // No job waits: it ends as before, its Secret kept for the set.
    let ended = finishing().steps();
    assert_eq!(
        kinds(&ended),
        ["status", "count", "delete-pod"],
        "{ended:?}"
    );
    assert_eq!(status_of(&ended).phase, Some(Succeeded));
    // A job waits: registered anew over its Secret, the whole status
    // written once with the renewal and how the job before went, the pod
    // of the job before deleted and the next created. No Succeeded write.
    let grant = RenewalGrant {
        set_generation: 3,
        job_id: None,
    };
    let steps = finishing().renewal(Some(Some(grant))).steps();
    assert_eq!(
        describe(&steps),
        [
            "count self-deregistered skipped",
            "renew 1 previous=7/0 over secret@1",
            "delete-pod pod-1",
            "create-pod",
        ]
    );
    let Some(Step::Renew { renewal, .. }) = steps.iter().find(|s| matches!(s, Step::Renew { .. }))
    else {
        unreachable!()
    };
    assert_eq!((renewal.patch_id, renewal.set_generation), (0, 3));
    let previous = renewal.previous.as_ref().expect("the job before's outcome");
    assert_eq!(previous.job_id.as_deref(), Some("job"));
    // The job the listener heard start on the registration is the job
    // before, whether or not its record reached the status.
    let heard = RenewalGrant {
        set_generation: 3,
        job_id: Some("heard".to_owned()),
    };
    let steps = finishing().renewal(Some(Some(heard))).steps();
    let previous = steps.iter().find_map(|s| match s {
        Step::Renew { renewal, .. } => renewal.previous.clone(),
        _ => None,
    });
    assert_eq!(previous.and_then(|p| p.job_id).as_deref(), Some("heard"));

    // A runner that failed, or whose registration is not proven gone, is
    // never renewed in place: the set is not even asked.
    let failed = case(Runner::new().registered(7).phase(Running).with_job())
        .secret(7)
        .pod(exited(1))
        .renewal(None);
    assert_ne!(failed.steps_or_need(), Err(Need::Renewal));
    let removal_asked = case(Runner::new().registered(7).phase(Running).with_job())
        .secret(7)
        .pod(exited(0))
        .verdict(Verdict::RemoveNow)
        .renewal(None);
    assert_ne!(removal_asked.steps_or_need(), Err(Need::Renewal));
}

#[test]
fn a_renewal_whose_status_write_failed_is_completed_from_its_secret() {
    // The Secret was written for renewal 1, the status still says the job
    // before: the Secret's registration 9 is live and recorded nowhere
    // else. Completed first, whatever else holds, deletion included.
    for runner in [
        Runner::new().registered(7).phase(Running).with_job(),
        Runner::new().registered(7).phase(Running).deleting(),
    ] {
        let steps = case(runner.clone())
            .secret(9)
            .made_for(1)
            .pod(exited(0))
            .steps();
        assert_eq!(
            describe(&steps),
            ["renew 1 previous=7/0 with 9", "delete-pod pod-1"],
            "{steps:?}"
        );
        // A pod made for the renewal already is its own, not deleted.
        let steps = case(runner).secret(9).pod(exited(0)).made_for(1).steps();
        assert_eq!(describe(&steps), ["renew 1 previous=7/- with 9"]);
    }
}
