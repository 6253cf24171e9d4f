//! An idle runner past `maxIdleAge` recycled: a new registration and pod,
//! the old registration removed first, and no failed start counted.

use super::*;

#[test]
fn an_idle_runner_past_max_idle_age_gets_a_new_registration_and_pod() {
    // Pod created at 0, maxIdleAge 60 s.
    let idle = || {
        Runner::new()
            .registered(7)
            .phase(Running)
            .status(|s| s.ready = true)
            .max_idle_age("1m")
    };
    let rows: Vec<(&str, Case, Vec<&str>, Option<u64>)> = vec![
        (
            "younger: looked at again when it comes of age",
            case(idle())
                .secret(7)
                .pod(pod(RunnerContainer::Running))
                .now(45),
            vec![],
            Some(15),
        ),
        (
            "of age: the registration goes first",
            case(idle())
                .secret(7)
                .pod(pod(RunnerContainer::Running))
                .now(60),
            vec![
                "status Registered=RemoveNow",
                "deregister 7",
                "event Normal Deregistering",
                "event Normal MaxIdleAge",
            ],
            Some(30),
        ),
        (
            "while the removal is under way, the pod stays",
            case(idle())
                .secret(7)
                .pod(pod(RunnerContainer::Running))
                .pool(PoolView::Claimed)
                .now(70),
            vec![],
            Some(30),
        ),
        (
            "removed: then the pod and the Secret",
            case(idle())
                .secret(7)
                .pod(pod(RunnerContainer::Running))
                .pool(PoolView::Removed)
                .now(70),
            REMOVED_THEN_CLEANED_UP.to_vec(),
            None,
        ),
        (
            "exited 0 while its removal is under way: the recycling goes on",
            case(idle().registration(RegisteredReason::RemoveNow))
                .secret(7)
                .pod(exited(0))
                .pool(PoolView::Claimed)
                .now(70),
            vec![],
            Some(30),
        ),
        (
            "exited 0 after its removal: pod and Secret go, not Succeeded",
            case(idle().gone(RegisteredReason::Removed))
                .secret(7)
                .pod(exited(0))
                .now(70),
            vec!["delete-pod pod-1", "delete-secret"],
            None,
        ),
        (
            "with a job it is not idle",
            case(idle().with_job())
                .secret(7)
                .pod(pod(RunnerContainer::Running))
                .now(600),
            vec![],
            None,
        ),
        (
            "a pod still starting is not idle",
            case(idle())
                .secret(7)
                .pod(pod(RunnerContainer::Waiting))
                .now(100),
            vec!["inform phase=Pending ready=false"],
            Some(500),
        ),
        (
            "without maxIdleAge nothing happens",
            case(idle().max_idle_age("0s"))
                .secret(7)
                .pod(pod(RunnerContainer::Running))
                .now(100),
            vec![],
            Some(500),
        ),
    ];
    for (name, case, want, requeue) in rows {
        let plan = case.run().unwrap();
        assert_eq!(describe(&plan.steps), want, "{name}");
        assert_eq!(plan.requeue.map(|d| d.as_secs()), requeue, "{name}");
        assert!(
            status_of(&plan.steps).failures.is_none(),
            "{name}: not a failed start"
        );
    }
    // Once the pod is gone, a new registration, with no backoff, recorded
    // at once (the status names the one before).
    let recycled = idle().gone(RegisteredReason::Removed);
    assert_eq!(
        describe(&case(recycled).now(75).steps()),
        vec!["register recorded", "create-pod"]
    );
}

#[test]
fn a_new_registration_whose_status_write_failed_is_the_one_removed() {
    // Recycled: registration 7 removed, the pod and Secret deleted, and 8
    // registered (its Secret written); the status write that would record
    // 8 failed, so the status still names 7, gone.
    let recycled = || {
        Runner::new()
            .registered(7)
            .phase(Running)
            .max_idle_age("1m")
            .gone(RegisteredReason::Removed)
    };
    // Deleted now: 8 is handed to the pool, and recorded with it; the
    // Secret holding it goes once the service confirms 8 gone (and the
    // finalizer once the Secret is).
    let deleted = || case(recycled().deleting()).secret(8).now(80);
    assert_eq!(
        describe(&deleted().steps()),
        vec![
            "status runnerId=8 Registered=RemoveNow",
            "deregister 8",
            "event Normal Deregistering",
        ]
    );
    let steps = deleted().pool(PoolView::Removed).steps();
    assert_eq!(
        kinds(&steps),
        vec!["status", "event", "count", "delete-secret"],
        "{steps:?}"
    );
    // Not deleted: 8 is recorded and its pod made from the Secret; no
    // registration is made over it.
    assert_eq!(
        describe(&case(recycled()).secret(8).now(80).steps()),
        vec![
            "status runnerId=8 Registered=JitConfigCreated",
            "create-pod"
        ]
    );
}
