//! A runner's everyday life, step by step, and what each step carries.

use super::*;

impl Case {
    /// The API server refused the pod this reconcile asked for.
    fn refused(mut self, why: &str) -> Self {
        self.refused_pod = Some(why.into());
        self
    }
}

#[test]
fn the_lifecycle_table() {
    let rows: Vec<(&str, Case, Vec<&str>)> = vec![
        (
            "a new runner gets the finalizer first",
            case(Runner::new().no_finalizer()),
            vec!["add-finalizer"],
        ),
        (
            "then a registration, recorded by its Secret alone, and its pod",
            case(Runner::new()),
            vec!["register", "create-pod"],
        ),
        (
            "then its pod, if the first pass could not make it",
            case(Runner::new().registered(7)).secret(7),
            vec!["create-pod"],
        ),
        (
            "a first registration's Secret is its record until the next status write",
            case(Runner::new()).secret(7),
            vec!["create-pod"],
        ),
        (
            "a later registration whose status write was lost is adopted at once",
            case(Runner::new().registered(5).gone(RegisteredReason::Removed)).secret(7),
            vec![
                "status runnerId=7 Registered=JitConfigCreated",
                "create-pod",
            ],
        ),
        (
            "a running pod is mirrored, as the host's budget allows",
            case(Runner::new().registered(7).phase(Pending))
                .secret(7)
                .pod(pod(RunnerContainer::Running)),
            vec!["inform phase=Running ready=true"],
        ),
        (
            "nothing changes, nothing is done",
            case(
                Runner::new()
                    .registered(7)
                    .phase(Running)
                    .status(|s| s.ready = true),
            )
            .secret(7)
            .pod(pod(RunnerContainer::Running)),
            vec![],
        ),
        (
            "exit 0 is Succeeded, and in the same pass, the runner having \
             removed its registration itself, its pod goes (its Secret \
             waits for a renewal to be written over, or the runner's end)",
            case(Runner::new().registered(7).phase(Running))
                .secret(7)
                .pod(exited(0)),
            vec![
                "status phase=Succeeded reason=Completed exit=0 Registered=SelfDeregistered",
                "count self-deregistered skipped",
                "delete-pod pod-1",
            ],
        ),
        (
            "exit 7 is Outdated, and its registration is handed to the pool at once",
            case(Runner::new().registered(7).phase(Running))
                .secret(7)
                .pod(exited(7)),
            vec![
                "status phase=Outdated reason=Outdated exit=7 Registered=RemoveNow",
                "event Warning RunnerOutdated",
                "deregister 7",
                "event Normal Deregistering",
            ],
        ),
        (
            "a pod that failed before a job is a failed start: counted, and its \
             registration handed to the pool before the pod goes",
            case(Runner::new().registered(7).phase(Running))
                .secret(7)
                .pod(exited(1)),
            vec![
                "status phase=Pending exit=1 failures=1 Registered=RemoveNow",
                "event Warning RunnerPodFailed",
                "deregister 7",
                "event Normal Deregistering",
            ],
        ),
        (
            "once the pool removed it, the failed pod and its Secret go",
            case(
                Runner::new()
                    .registered(7)
                    .registration(RegisteredReason::RemoveNow)
                    .phase(Pending)
                    .status(|s| {
                        s.failures.insert("pod-1".into(), Time(at(0)));
                        s.exit_code = Some(1);
                        s.termination_reason = Some("Error".into());
                    }),
            )
            .secret(7)
            .pod(exited(1))
            .pool(PoolView::Removed),
            REMOVED_THEN_CLEANED_UP.to_vec(),
        ),
        (
            "a template without a runner container fails the runner",
            case(Runner::new().without_runner_container()),
            vec![
                "status phase=Failed reason=InvalidTemplate",
                "event Warning InvalidTemplate",
            ],
        ),
        (
            "a pod the API server refused fails the runner",
            case(Runner::new()).refused("spec.containers[0].image: Required value"),
            vec![
                "status phase=Failed reason=InvalidPod",
                "event Warning InvalidPod",
            ],
        ),
        (
            "deleted, with its registration, pod and Secret gone: the finalizer goes",
            case(
                Runner::new()
                    .registered(7)
                    .gone(RegisteredReason::NotFound)
                    .deleting(),
            ),
            vec!["remove-finalizer"],
        ),
    ];
    for (name, case, expected) in rows {
        assert_eq!(describe(&case.steps()), expected, "{name}");
    }
    // What the people reading the runner are told, where it fails.
    let steps = case(Runner::new().without_runner_container()).steps();
    assert_eq!(
        message_of(&steps).as_deref(),
        Some("the pod template has no container named \"runner\"")
    );
}

#[test]
fn a_refused_pod_fails_the_runner_and_nothing_else() {
    // The plan made again after the refusal is made on a reading that does
    // not show the registration the first one made: it decides nothing
    // about that registration (no NeverRegistered, no copy of a Secret it
    // saw before), leaving the ending to the next reconcile.
    let why = "spec.containers[0].image: Required value";
    for seen in [case(Runner::new()), case(Runner::new()).secret(7)] {
        let steps = seen.refused(why).steps();
        assert_eq!(kinds(&steps), ["status", "event"]);
        let Step::PatchStatus(change) = &steps[0] else {
            unreachable!()
        };
        assert_eq!(
            change.status,
            StatusFields {
                phase: Some(Failed),
                reason: Some(Some(PhaseReason::InvalidPod)),
                message: Some(Some(format!("the runner pod is invalid: {why}"))),
                ..StatusFields::default()
            }
        );
        assert_eq!(change.metadata, None);
    }
}

#[test]
fn a_first_registration_is_copied_into_the_status_with_the_next_write() {
    // The pod runs: the Running write carries the registration.
    let steps = case(Runner::new())
        .secret(7)
        .pod(pod(RunnerContainer::Running))
        .steps();
    assert_eq!(
        describe(&steps),
        ["status phase=Running ready=true runnerId=7 Registered=JitConfigCreated"]
    );
    assert_eq!(status_of(&steps).runner_name.as_deref(), Some("r"));
    assert_eq!(
        registered_condition(&steps),
        Some((true, RegisteredReason::JitConfigCreated))
    );
    // Still starting: nothing to write, nothing written.
    assert_eq!(
        case(Runner::new())
            .secret(7)
            .pod(pod(RunnerContainer::Waiting))
            .steps(),
        vec![]
    );
    // Ended before any write: the ending names the registration, and
    // what became of it is not overwritten by the copy.
    let steps = case(Runner::new()).secret(7).pod(exited(0)).steps();
    assert_eq!(status_of(&steps).runner_id, Some(7));
    assert_eq!(
        registered_condition(&steps),
        Some((false, RegisteredReason::SelfDeregistered))
    );
    // A pod that failed to start: its registration (the Secret's) is
    // the one handed to the pool.
    let steps = case(Runner::new()).secret(7).pod(exited(1)).steps();
    assert!(
        steps.contains(&Step::Deregister { runner_id: 7 }),
        "{steps:?}"
    );
    assert_eq!(status_of(&steps).runner_id, Some(7));
}

#[test]
fn a_later_registration_is_recorded_with_the_registration_step() {
    // The first: the Secret is its record.
    let steps = case(Runner::new()).steps();
    assert_eq!(
        steps[0],
        Step::Register {
            replacing: None,
            record: None
        }
    );
    // A later one, its registration before gone: recorded in the status
    // by the registration step itself, Pending and not online.
    let before = Runner::new()
        .registered(7)
        .gone(RegisteredReason::Removed)
        .status(|s| {
            s.conditions.push(cond(OnlineReason::Online));
            s.conditions.push(cond(HeldReason::MaxHeld));
        });
    let steps = case(before).steps();
    let [
        Step::Register {
            replacing: None,
            record: Some(record),
        },
        Step::CreatePod,
    ] = steps.as_slice()
    else {
        panic!("{steps:?}")
    };
    let change = record.change(8, "r");
    assert_eq!(change.metadata, None);
    let status = change.status;
    assert_eq!(
        (
            status.runner_id,
            status.runner_name.as_deref(),
            status.phase,
            status.ready
        ),
        (Some(8), Some("r"), Some(Pending), Some(false))
    );
    let conditions = status.conditions.unwrap();
    let summary: Vec<(&str, &str, &str)> = conditions
        .iter()
        .map(|c| (c.type_.as_str(), c.reason.as_str(), c.message.as_str()))
        .collect();
    assert_eq!(
        summary,
        [
            ("HeldForDebugging", "MaxHeld", ""),
            ("Registered", "JitConfigCreated", "registered as runner 8"),
        ],
        "the registration before's Registered and RunnerOnline are gone"
    );
    assert_eq!(conditions[1].status, "True");
    assert_eq!(conditions[1].last_transition_time, Time(at(10)));
}

#[test]
fn a_busy_runner_of_a_set_that_protects_them_is_marked_once_and_only_while_busy() {
    let protecting = || {
        let mut runner = Runner::new()
            .registered(7)
            .phase(Running)
            .status(|s| s.ready = true);
        runner.0.spec.protect_busy_runners = Some(true);
        runner
    };
    let running = || PodView {
        ready: true,
        ..pod(RunnerContainer::Running)
    };
    // Idle: nothing to write.
    let steps = case(protecting()).secret(7).pod(running()).steps();
    assert_eq!(kinds(&steps), Vec::<&str>::new());
    // Busy: marked, the pod named by its uid.
    let steps = case(protecting().with_job())
        .secret(7)
        .pod(running())
        .steps();
    assert_eq!(
        steps,
        vec![Step::ProtectFromEviction {
            uid: "pod-1".into()
        }]
    );
    // Marked already: no second write.
    let marked = PodView {
        eviction_protected: true,
        ..running()
    };
    let steps = case(protecting().with_job()).secret(7).pod(marked).steps();
    assert_eq!(kinds(&steps), Vec::<&str>::new());
    // A set that does not ask never marks.
    let steps = case(
        Runner::new()
            .registered(7)
            .phase(Running)
            .status(|s| s.ready = true)
            .with_job(),
    )
    .secret(7)
    .pod(running())
    .steps();
    assert!(
        !kinds(&steps).contains(&"protect-from-eviction"),
        "{steps:?}"
    );
}

#[test]
fn a_restarting_native_sidecar_is_no_failed_start() {
    let with_sidecar = || {
        let mut runner = Runner::new()
            .registered(7)
            .phase(Running)
            .status(|s| s.ready = true);
        runner.0.spec.spec.init_containers = Some(vec![
            Container {
                name: "dind".into(),
                restart_policy: Some("Always".into()),
                ..Container::default()
            },
            Container {
                name: "setup".into(),
                ..Container::default()
            },
        ]);
        runner
    };
    let crashed = |name: &str| PodView {
        ready: true,
        failed_init_containers: vec![name.into()],
        ..pod(RunnerContainer::Running)
    };
    let steps = case(with_sidecar()).secret(7).pod(crashed("dind")).steps();
    assert!(!kinds(&steps).contains(&"delete-pod"), "{steps:?}");
    assert!(!kinds(&steps).contains(&"deregister"), "{steps:?}");
    // An ordinary init container that failed is one.
    let plan = case(with_sidecar())
        .secret(7)
        .pod(crashed("setup"))
        .verdict(Verdict::RemoveNow)
        .run();
    let steps = plan.unwrap().steps;
    assert!(kinds(&steps).contains(&"deregister"), "{steps:?}");
    assert!(
        steps.iter().any(|s| matches!(s, Step::Event { note, .. } if note.starts_with("an init container failed"))),
        "{steps:?}"
    );
}

#[test]
fn what_a_young_pod_does_is_written_only_once_it_has_held() {
    // A pod made a second ago runs: under a burst its job may be over
    // before anyone reads a write saying so. The write waits until the pod
    // is two seconds old, and the pass looks again then.
    let young = case(Runner::new().registered(7).phase(Pending))
        .secret(7)
        .pod(pod(RunnerContainer::Running))
        .now(1);
    let plan = young.run().unwrap();
    assert_eq!(describe(&plan.steps), Vec::<String>::new());
    assert_eq!(plan.requeue, Some(Duration::from_secs(1)));
    let settled = young.now(2).run().unwrap();
    assert_eq!(
        describe(&settled.steps),
        ["inform phase=Running ready=true"]
    );
    // A write a decision rests on is never held: the pod exited at once.
    let exited_young = case(Runner::new().registered(7).phase(Pending))
        .secret(7)
        .pod(exited(0))
        .verdict(Verdict::SelfDeregistered)
        .now(1);
    let steps = describe(&exited_young.run().unwrap().steps);
    assert!(steps[0].starts_with("status phase=Succeeded"), "{steps:?}");
}

#[test]
fn a_runner_is_admitted_before_its_pod() {
    // Asked before the first registration, with the set's ownership to
    // prove; before a later pod, only the template.
    let unasked = case(Runner::new()).admission(None);
    assert_eq!(unasked.run().unwrap_err(), Need::Admission { first: true });
    let registered = case(Runner::new().registered(7)).secret(7).admission(None);
    assert_eq!(
        registered.run().unwrap_err(),
        Need::Admission { first: false }
    );
    // A pod that runs is not asked about again.
    let running = case(Runner::new().registered(7))
        .secret(7)
        .pod(pod(RunnerContainer::Running))
        .admission(None);
    assert!(running.run().is_ok());

    // Refused: Failed, said in an event, and nothing registered or made.
    for (refusal, reason, event) in [
        (
            Refusal::NotOwned,
            PhaseReason::NotOwned,
            EventReason::NotOwned,
        ),
        (
            Refusal::PodRefused,
            PhaseReason::PodRefused,
            EventReason::PodRefused,
        ),
    ] {
        let refused = case(Runner::new()).admission(Some(Admission::Refused {
            refusal,
            message: "why".into(),
        }));
        let steps = refused.steps();
        assert!(
            !kinds(&steps)
                .iter()
                .any(|k| ["register", "create-pod"].contains(k)),
            "{steps:?}"
        );
        let status = status_of(&steps);
        assert_eq!(status.phase, Some(Failed));
        assert_eq!(status.reason, Some(Some(reason)));
        assert_eq!(message_of(&steps).as_deref(), Some("why"));
        assert_eq!(event_reasons(&steps), [event]);
    }
    // A registered runner refused a later pod ends like any Failed runner:
    // its registration goes before anything else.
    let steps = case(Runner::new().registered(7))
        .secret(7)
        .admission(Some(Admission::Refused {
            refusal: Refusal::PodRefused,
            message: "privileged".into(),
        }))
        .steps();
    assert!(kinds(&steps).contains(&"deregister"), "{steps:?}");
    assert!(!kinds(&steps).contains(&"create-pod"), "{steps:?}");

    // The policy cannot judge: nothing made, said, looked at again.
    let plan = case(Runner::new())
        .admission(Some(Admission::Waiting("loading".into())))
        .run()
        .unwrap();
    assert_eq!(kinds(&plan.steps), ["event"]);
    assert_eq!(
        event_reasons(&plan.steps),
        [EventReason::PodValidationUnavailable]
    );
    assert_eq!(plan.requeue, Some(ADMISSION_RETRY));
}
