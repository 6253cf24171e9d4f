//! The rules of [`super::plan`], one table row per case, each asserting the
//! whole plan: every step with its content, then what comes next.

use super::*;
use crate::actions::RunnerScaleSet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::json;

fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap()
}

fn runner_spec(env: Value) -> EphemeralRunnerSpec {
    runner_spec_for(7, env)
}

fn runner_spec_for(id: i64, env: Value) -> EphemeralRunnerSpec {
    serde_json::from_value(json!({
        "githubConfigUrl": "https://github.com/octo-org",
        "githubConfigSecret": "github-auth",
        "runnerScaleSetId": id,
        "spec": {"containers": [{"name": "runner", "image": "runner:1", "env": env}]}
    }))
    .unwrap()
}

fn env_a(value: &str) -> Value {
    json!([{"name": "A", "value": value}])
}

fn listener(labels: &[(&str, &str)]) -> ListenerConfig {
    listener_for(7, labels)
}

fn listener_for(id: i64, labels: &[(&str, &str)]) -> ListenerConfig {
    ListenerConfig {
        namespace: "ns".into(),
        name: "linux".into(),
        uid: Some("u1".into()),
        runner_set_name: "linux".into(),
        scale_set_id: id,
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
        shadow_scaling_policy: None,
        job_metrics: Default::default(),
    }
}

fn set(revision: i64, applied: i64, phase: EphemeralRunnerSetPhase) -> RunnerSetObserved {
    RunnerSetObserved {
        labels: BTreeMap::new(),
        spec: EphemeralRunnerSetSpec {
            replicas: 3,
            patch_id: 5,
            actionable_revision: revision,
            ephemeral_runner_spec: runner_spec(env_a("1")),
            ephemeral_runner_metadata: None,
        },
        phase,
        applied_revision: applied,
    }
}

/// A set at revision 1 pinned at zero replicas and patch id 0.
fn parked_set(phase: EphemeralRunnerSetPhase) -> RunnerSetObserved {
    let mut parked = set(1, 1, phase);
    parked.spec.replicas = 0;
    parked.spec.patch_id = 0;
    parked
}

fn accepted(generation: i64, since: Timestamp) -> Condition {
    Condition {
        type_: "PodTemplateAccepted".into(),
        status: "True".into(),
        reason: "Accepted".into(),
        message: "the pod-validation policy accepts the template".into(),
        observed_generation: Some(generation),
        last_transition_time: Time(since),
    }
}

fn refused(generation: i64, since: Timestamp) -> Condition {
    Condition {
        type_: "PodTemplateAccepted".into(),
        status: "False".into(),
        reason: "PolicyViolation".into(),
        message: VIOLATION.into(),
        observed_generation: Some(generation),
        last_transition_time: Time(since),
    }
}

/// The status of a running scale set 7 that applied `generation`.
fn running(generation: i64, since: Timestamp) -> AutoscalingRunnerSetStatus {
    AutoscalingRunnerSetStatus {
        phase: Some(AutoscalingRunnerSetPhase::Running),
        observed_generation: Some(generation),
        runner_scale_set_id: Some(7),
        conditions: vec![accepted(generation, since)],
        ..AutoscalingRunnerSetStatus::default()
    }
}

/// A settled, running scale set at generation 2, its listener running and
/// its EphemeralRunnerSet at revision 1, seen from the watch.
fn settled() -> Observed {
    Observed {
        generation: 2,
        status: running(2, at(0)),
        has_finalizer: true,
        template: TemplateVerdict::Accepted,
        shadow_template: None,
        scale_set_id: Some(7),
        scale_set_name: "linux".into(),
        scale_set_labels: Vec::new(),
        desired_runner_spec: runner_spec(env_a("1")),
        desired_runner_metadata: None,
        desired_runner_set_labels: BTreeMap::new(),
        desired_runner_set_annotations: BTreeMap::new(),
        runner_set: Some(set(1, 1, EphemeralRunnerSetPhase::Running)),
        runner_counts: Some(RunnerCounts::default()),
        listener: Some(listener(&[])),
        desired_listener: listener(&[]),
        from_api_server: false,
        service: None,
        counts_moved_ago: None,
        capped: None,
        scale_set_lost: false,
        credentials_held: Some(true),
        credentials_recorded: true,
        former_credentials: None,
        runner_proxy: None,
        now: at(100),
    }
}

/// A set just created: nothing of it exists anywhere yet.
fn created(o: &mut Observed) {
    o.has_finalizer = false;
    o.status = AutoscalingRunnerSetStatus::default();
    o.scale_set_id = None;
    o.desired_runner_spec = runner_spec_for(0, env_a("1"));
    o.desired_listener = listener_for(0, &[]);
    o.runner_set = None;
    o.runner_counts = None;
    o.listener = None;
}

/// The spec edited to generation 3, read again from the API server.
fn spec_changed(o: &mut Observed) {
    o.generation = 3;
    o.from_api_server = true;
}

/// The service holds scale set `id` as the spec asks.
fn found(id: i64) -> Option<ServiceScaleSet> {
    Some(ServiceScaleSet::Found {
        group_id: 1,
        scale_set: Box::new(RunnerScaleSet {
            id,
            ..RunnerScaleSet::new("linux", 1, &[])
        }),
    })
}

const VIOLATION: &str =
    "spec.containers[0].securityContext.privileged: privileged containers are refused";

fn violation() -> Violation {
    Violation {
        path: "spec.containers[0].securityContext.privileged".into(),
        message: "privileged containers are refused".into(),
    }
}

fn publish(revision: i64, runner_spec: EphemeralRunnerSpec) -> Step {
    Step::PublishRunnerSet(Box::new(RunnerSetPublication {
        revision,
        runner_spec,
        runner_metadata: None,
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
    }))
}

fn start(config: ListenerConfig) -> Step {
    Step::StartListener(Box::new(config))
}

fn write(status: AutoscalingRunnerSetStatus) -> Step {
    Step::WriteStatus(StatusChange::Settled(Box::new(status)))
}

const PENDING: Step = Step::WriteStatus(StatusChange::Pending);

fn done(steps: Vec<Step>) -> Plan {
    Plan {
        steps,
        then: Then::LookAgainIn(RESYNC),
    }
}

fn ask(steps: Vec<Step>, need: Need) -> Plan {
    Plan {
        steps,
        then: Then::Ask(need),
    }
}

type Case = (&'static str, Box<dyn Fn(&mut Observed)>, Plan);

fn check(cases: Vec<Case>) {
    for (name, change, expected) in cases {
        let mut observed = settled();
        change(&mut observed);
        assert_eq!(plan(&observed), expected, "{name}");
    }
}

#[test]
fn a_new_set_takes_the_finalizer_shows_pending_registers_then_builds() {
    // Registered or adopted, the set is built alike with the id.
    let built = done(vec![
        Step::AnnotateScaleSetId(7),
        Step::WriteStatus(StatusChange::ScaleSetId(7)),
        publish(1, runner_spec(env_a("1"))),
        start(listener(&[])),
        write(running(2, at(100))),
    ]);
    check(vec![
        (
            "a new object reads the API server's copy before anything",
            Box::new(created),
            ask(vec![], Need::FreshCopy),
        ),
        (
            "from that copy, the finalizer and Pending come before the service is asked",
            Box::new(|o| {
                created(o);
                o.from_api_server = true;
            }),
            ask(vec![Step::AddFinalizer, PENDING], Need::ScaleSet),
        ),
        (
            "a scale set the service does not hold is registered",
            Box::new(|o| {
                created(o);
                o.from_api_server = true;
                o.service = Some(ServiceScaleSet::Absent { group_id: 1 });
            }),
            ask(
                vec![],
                Need::Registration(Box::new(RunnerScaleSet::new("linux", 1, &[]))),
            ),
        ),
        (
            "once registered: the id recorded, the set created, the listener started, the generation observed",
            Box::new(|o| {
                created(o);
                o.from_api_server = true;
                o.service = Some(ServiceScaleSet::Registered { id: 7 });
            }),
            built.clone(),
        ),
        (
            "a name already registered is adopted, not registered twice",
            Box::new(|o| {
                created(o);
                o.from_api_server = true;
                o.service = found(7);
            }),
            built.clone(),
        ),
        (
            "a rejected template on a new object takes the finalizer and registers nothing",
            Box::new(|o| {
                created(o);
                o.template = TemplateVerdict::Rejected(vec![violation()]);
            }),
            done(vec![
                Step::AddFinalizer,
                Step::Publish(
                    Notice::warning(
                        "PodTemplateRejected",
                        format!("the pod-validation policy refused the template: {VIOLATION}"),
                    )
                    .during("ValidatePodTemplate"),
                ),
                write(AutoscalingRunnerSetStatus {
                    phase: Some(AutoscalingRunnerSetPhase::Pending),
                    conditions: vec![refused(2, at(100))],
                    ..AutoscalingRunnerSetStatus::default()
                }),
            ]),
        ),
    ]);
}

#[test]
fn a_spec_change_shows_pending_and_catches_up_once_applied() {
    let caught_up = running(3, at(0));
    check(vec![
        (
            "a settled set does nothing and looks again in five minutes",
            Box::new(|_| {}),
            done(vec![]),
        ),
        (
            "a spec change reads the API server's copy first",
            Box::new(|o| o.generation = 3),
            ask(vec![], Need::FreshCopy),
        ),
        (
            "a stale copy (Pending, generation unobserved) is not acted on either",
            Box::new(|o| {
                o.status.phase = Some(AutoscalingRunnerSetPhase::Pending);
                o.status.observed_generation = None;
            }),
            ask(vec![], Need::FreshCopy),
        ),
        (
            "from the API server's copy, Pending is written and the service asked",
            Box::new(spec_changed),
            ask(vec![PENDING], Need::ScaleSet),
        ),
        (
            "a scale set as it should be is left alone; the same runner spec keeps its revision",
            Box::new(|o| {
                spec_changed(o);
                o.service = found(7);
            }),
            done(vec![write(caught_up.clone())]),
        ),
        (
            "a scale set with other labels is updated",
            Box::new(|o| {
                spec_changed(o);
                o.scale_set_labels = vec!["gpu".into()];
                o.service = found(7);
            }),
            done(vec![
                Step::UpdateScaleSet {
                    id: 7,
                    to: Box::new(RunnerScaleSet::new("linux", 1, &["gpu".to_string()])),
                },
                write(caught_up.clone()),
            ]),
        ),
        (
            "labels in another order are the same labels",
            Box::new(|o| {
                spec_changed(o);
                o.scale_set_labels = vec!["gpu".into()];
                let mut reordered = RunnerScaleSet::new("linux", 1, &["gpu".to_string()]);
                reordered.labels.reverse();
                reordered.id = 7;
                o.service = Some(ServiceScaleSet::Found {
                    group_id: 1,
                    scale_set: Box::new(reordered),
                });
            }),
            done(vec![write(caught_up.clone())]),
        ),
        (
            "a scale set adopted under another id is recorded and everything rebuilt with it",
            Box::new(|o| {
                spec_changed(o);
                o.service = found(9);
            }),
            done(vec![
                Step::AnnotateScaleSetId(9),
                Step::WriteStatus(StatusChange::ScaleSetId(9)),
                publish(2, runner_spec_for(9, env_a("1"))),
                Step::StopListener,
                start(listener_for(9, &[])),
                write(AutoscalingRunnerSetStatus {
                    runner_scale_set_id: Some(9),
                    ..caught_up.clone()
                }),
            ]),
        ),
        (
            "runner spec drift publishes the next revision",
            Box::new(|o| {
                spec_changed(o);
                o.service = found(7);
                o.desired_runner_spec = runner_spec(env_a("2"));
            }),
            done(vec![
                publish(2, runner_spec(env_a("2"))),
                write(caught_up.clone()),
            ]),
        ),
        (
            "an explicitly empty env that reads back absent is no drift",
            Box::new(|o| {
                o.desired_runner_spec = runner_spec(json!([]));
                o.runner_set.as_mut().unwrap().spec.ephemeral_runner_spec =
                    runner_spec(Value::Null);
            }),
            done(vec![]),
        ),
        (
            "a new label for the set is published at the same revision",
            Box::new(|o| {
                o.desired_runner_set_labels
                    .insert("team".into(), "ci".into());
            }),
            done(vec![Step::PublishRunnerSet(Box::new(
                RunnerSetPublication {
                    revision: 1,
                    runner_spec: runner_spec(env_a("1")),
                    runner_metadata: None,
                    labels: [("team".to_string(), "ci".to_string())].into(),
                    annotations: BTreeMap::new(),
                },
            ))]),
        ),
    ]);
}

#[test]
fn a_label_only_change_shows_pending_at_the_listeners_teardown() {
    let team = [("team", "ci")];
    check(vec![
        (
            "a label-only change reads the API server's copy first",
            Box::new(move |o| o.desired_listener = listener(&team)),
            ask(vec![], Need::FreshCopy),
        ),
        (
            "then writes Pending, restarts the listener and writes Running again",
            Box::new(move |o| {
                o.desired_listener = listener(&team);
                o.from_api_server = true;
            }),
            done(vec![
                PENDING,
                Step::StopListener,
                start(listener(&team)),
                write(running(2, at(0))),
            ]),
        ),
        (
            "a stopped listener is started without showing Pending",
            Box::new(|o| o.listener = None),
            done(vec![start(listener(&[]))]),
        ),
    ]);
}

#[test]
fn outdated_parks_the_scale_set_until_the_spec_changes() {
    let outdated = AutoscalingRunnerSetStatus {
        phase: Some(AutoscalingRunnerSetPhase::Outdated),
        ..running(2, at(0))
    };
    check(vec![
        (
            "the set reporting Outdated for the applied revision parks the scale set",
            Box::new(|o| o.runner_set = Some(set(1, 1, EphemeralRunnerSetPhase::Outdated))),
            done(vec![
                Step::PinRunnerSet,
                Step::StopListener,
                write(outdated.clone()),
            ]),
        ),
        (
            "an Outdated verdict about a revision already replaced does not park",
            Box::new(|o| o.runner_set = Some(set(2, 1, EphemeralRunnerSetPhase::Outdated))),
            done(vec![]),
        ),
        (
            "a parked scale set stays parked and does not rebuild the listener",
            Box::new({
                let outdated = outdated.clone();
                move |o| {
                    o.status = outdated.clone();
                    o.runner_set = Some(parked_set(EphemeralRunnerSetPhase::Running));
                    o.listener = None;
                }
            }),
            done(vec![]),
        ),
        (
            "a parked scale set the listener scaled again is pinned again",
            Box::new({
                let outdated = outdated.clone();
                move |o| {
                    o.status = outdated.clone();
                    o.listener = None;
                }
            }),
            done(vec![Step::PinRunnerSet]),
        ),
        (
            "a spec change recovers from Outdated with a new revision of the same runner spec",
            Box::new({
                let outdated = outdated.clone();
                move |o| {
                    spec_changed(o);
                    o.service = found(7);
                    o.status = outdated.clone();
                    o.runner_set = Some(parked_set(EphemeralRunnerSetPhase::Outdated));
                    o.listener = None;
                }
            }),
            done(vec![
                publish(2, runner_spec(env_a("1"))),
                start(listener(&[])),
                write(running(3, at(0))),
            ]),
        ),
    ]);
}

#[test]
fn a_rejected_template_builds_nothing_and_says_why_once() {
    let announcement = Step::Publish(
        Notice::warning(
            "PodTemplateRejected",
            format!("the pod-validation policy refused the template: {VIOLATION}"),
        )
        .during("ValidatePodTemplate"),
    );
    let refused_status = AutoscalingRunnerSetStatus {
        phase: Some(AutoscalingRunnerSetPhase::Pending),
        conditions: vec![refused(3, at(100))],
        ..running(2, at(0))
    };
    check(vec![
        (
            "a rejected template builds nothing and leaves the generation unobserved",
            Box::new(|o| {
                o.generation = 3;
                o.template = TemplateVerdict::Rejected(vec![violation()]);
                o.desired_runner_spec = runner_spec(json!([{"name": "B", "value": "1"}]));
            }),
            done(vec![announcement.clone(), write(refused_status.clone())]),
        ),
        (
            "a rejection already announced is not announced or written again",
            Box::new({
                let refused_status = refused_status.clone();
                move |o| {
                    o.generation = 3;
                    o.template = TemplateVerdict::Rejected(vec![violation()]);
                    o.status = refused_status.clone();
                }
            }),
            done(vec![]),
        ),
    ]);
}

#[test]
fn moving_runner_counts_are_copied_and_looked_at_on_a_short_beat() {
    let soon = |steps| Plan {
        steps,
        then: Then::LookAgainIn(COUNTS_RESYNC),
    };
    check(vec![
        (
            "moved counts are copied, remembered, and looked at again soon",
            Box::new(|o| {
                o.runner_counts = Some(RunnerCounts {
                    current: 3,
                    pending: 1,
                    running: 2,
                    failed: 0,
                })
            }),
            soon(vec![
                write(AutoscalingRunnerSetStatus {
                    current_runners: 3,
                    pending_ephemeral_runners: 1,
                    running_ephemeral_runners: 2,
                    ..running(2, at(0))
                }),
                Step::NoteCountsMoved,
            ]),
        ),
        (
            "counts that moved a moment ago keep the short beat",
            Box::new(|o| o.counts_moved_ago = Some(Duration::from_secs(30))),
            soon(vec![]),
        ),
        (
            "counts settled for a minute go back to the long beat",
            Box::new(|o| o.counts_moved_ago = Some(Duration::from_secs(61))),
            done(vec![]),
        ),
        (
            "a set without a status yet changes no count",
            Box::new(|o| o.runner_counts = None),
            done(vec![]),
        ),
    ]);
}

const CAPPED: &str = "minRunners 5000 above this host's limit of 1000 runners per scale set \
                      (--max-runners-per-scale-set): at most 1000 run";

fn capped_condition(since: Timestamp) -> Condition {
    Condition {
        type_: AutoscalingRunnerSetCondition::RunnersCapped.as_str().into(),
        status: "True".into(),
        reason: RunnersCappedReason::AboveHostLimit.as_str().into(),
        message: CAPPED.into(),
        observed_generation: Some(2),
        last_transition_time: Time(since),
    }
}

#[test]
fn a_spec_above_the_hosts_runner_cap_says_so_until_it_is_within() {
    let mut with_condition = running(2, at(0));
    with_condition.conditions.push(capped_condition(at(100)));
    check(vec![
        (
            "a spec above the cap gets the condition",
            Box::new(|o| o.capped = Some(CAPPED.into())),
            done(vec![write(with_condition.clone())]),
        ),
        (
            "said once, it is not written again",
            Box::new(|o| {
                o.capped = Some(CAPPED.into());
                o.status.conditions.push(capped_condition(at(50)));
            }),
            done(vec![]),
        ),
        (
            "back within the cap, the condition goes",
            Box::new(|o| o.status.conditions.push(capped_condition(at(50)))),
            done(vec![write(running(2, at(0)))]),
        ),
    ]);
}

#[test]
fn the_runners_proxy_secret_is_written_before_the_spec_naming_it_and_only_when_it_differs() {
    let data = || {
        ProxySecretData(BTreeMap::from([(
            "https_proxy".to_owned(),
            "http://user:p%40ss@proxy:3128/".to_owned(),
        )]))
    };
    check(vec![
        (
            "a stale Secret is written",
            Box::new(move |o| o.runner_proxy = Some(RunnerProxy::Stale(data()))),
            done(vec![Step::WriteRunnerProxy(data())]),
        ),
        (
            "a current one is left alone",
            Box::new(|o| o.runner_proxy = Some(RunnerProxy::Current)),
            done(vec![]),
        ),
        (
            "before a new revision that names it",
            Box::new(move |o| {
                o.runner_proxy = Some(RunnerProxy::Stale(data()));
                o.desired_runner_spec.proxy_secret_ref = Some("linux-runner-proxy".into());
            }),
            done(vec![
                Step::WriteRunnerProxy(data()),
                publish(2, {
                    let mut spec = runner_spec(env_a("1"));
                    spec.proxy_secret_ref = Some("linux-runner-proxy".into());
                    spec
                }),
            ]),
        ),
    ]);
    // Its credentials never reach a log line through the plan.
    let printed = format!("{:?}", Step::WriteRunnerProxy(data()));
    assert!(!printed.contains("p%40ss"), "{printed}");
}

#[test]
fn the_credentials_secret_is_held_once_and_only_when_there_is_one() {
    check(vec![
        (
            "an unheld Secret is held",
            Box::new(|o| o.credentials_held = Some(false)),
            done(vec![Step::HoldCredentials]),
        ),
        (
            "a held one is left alone",
            Box::new(|o| o.credentials_held = Some(true)),
            done(vec![]),
        ),
        (
            "no Secret (or one being deleted): nothing to hold",
            Box::new(|o| o.credentials_held = None),
            done(vec![]),
        ),
    ]);
}

#[test]
fn a_scale_set_another_set_holds_is_not_adopted_and_the_set_says_why() {
    let mut o = settled();
    spec_changed(&mut o);
    o.listener = None;
    o.service = Some(ServiceScaleSet::HeldByAnother {
        id: 9,
        holder: "team-b/linux".into(),
    });
    let plan = plan(&o);
    assert_eq!(plan.then, Then::LookAgainIn(CONFLICT_POLL));
    let [
        Step::Publish(notice),
        Step::WriteStatus(StatusChange::Settled(status)),
    ] = plan.steps.as_slice()
    else {
        panic!("{:?}", plan.steps);
    };
    assert_eq!(notice.reason, "ScaleSetConflict");
    assert!(notice.note.contains("team-b/linux"), "{}", notice.note);
    assert_eq!(status.phase, Some(AutoscalingRunnerSetPhase::Pending));
    assert_eq!(
        status.observed_generation,
        Some(2),
        "the spec stays unapplied"
    );
    let condition = status
        .conditions
        .iter()
        .find(|c| c.type_ == "ScaleSetConflict")
        .expect("the condition");
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_str()),
        ("True", "HeldByAnotherSet")
    );
    assert!(
        condition.message.contains("(id 9)"),
        "{}",
        condition.message
    );

    // Said once: the next look publishes nothing new, and a running
    // listener is stopped.
    o.status.conditions.push(condition.clone());
    o.listener = Some(listener(&[]));
    let plan = super::plan(&o);
    assert!(
        !plan.steps.iter().any(|s| matches!(s, Step::Publish(_))),
        "{:?}",
        plan.steps
    );
    assert!(plan.steps.contains(&Step::StopListener), "{:?}", plan.steps);
}

#[test]
fn a_scale_set_lost_in_the_service_is_found_again_or_registered_anew() {
    let lost = |o: &mut Observed| {
        o.scale_set_lost = true;
        o.from_api_server = true;
    };
    let registered_anew = done(vec![
        Step::Publish(
            Notice::warning(
                "ScaleSetLost",
                "the scale set 7 is gone from the Actions service; the set now drives scale set 12",
            )
            .during("Register"),
        ),
        Step::AnnotateScaleSetId(12),
        Step::WriteStatus(StatusChange::ScaleSetId(12)),
        // Pending while the listener is rebuilt (rule 5).
        PENDING,
        publish(2, runner_spec_for(12, env_a("1"))),
        Step::StopListener,
        start(listener_for(12, &[])),
        write(AutoscalingRunnerSetStatus {
            runner_scale_set_id: Some(12),
            ..running(2, at(0))
        }),
    ]);
    check(vec![
        (
            "the listener's ScaleSetNotFound sends the set to the service",
            Box::new(lost),
            ask(vec![], Need::ScaleSet),
        ),
        (
            "gone by id and by name: registered again",
            Box::new(move |o| {
                lost(o);
                o.service = Some(ServiceScaleSet::Absent { group_id: 1 });
            }),
            ask(
                vec![],
                Need::Registration(Box::new(RunnerScaleSet::new("linux", 1, &[]))),
            ),
        ),
        (
            "the new id is recorded and the listener restarted with it",
            Box::new(move |o| {
                lost(o);
                o.service = Some(ServiceScaleSet::Registered { id: 12 });
            }),
            registered_anew,
        ),
        (
            "found by its id after all (the listener's report is stale): nothing changes",
            Box::new(move |o| {
                lost(o);
                o.service = found(7);
            }),
            done(vec![]),
        ),
    ]);
}

#[test]
fn semantic_equality_ignores_only_what_the_server_drops() {
    let cases = [
        (json!([]), Value::Null, true),
        (env_a("1"), Value::Null, false),
        (env_a("1"), env_a("2"), false),
        (env_a(""), json!([{"name": "A"}]), false),
    ];
    for (left, right, equal) in cases {
        assert_eq!(
            semantically_equal(&runner_spec(left.clone()), &runner_spec(right.clone())),
            equal,
            "{left} vs {right}"
        );
    }
}

fn stalled_condition(message: &str, since: Timestamp) -> Condition {
    use crate::api::autoscaling_runner_set::StalledReason;
    Condition {
        type_: AutoscalingRunnerSetCondition::Stalled.as_str().into(),
        status: "True".into(),
        reason: StalledReason::CredentialsUnusable.as_str().into(),
        message: message.into(),
        observed_generation: None,
        last_transition_time: Time(since),
    }
}

#[test]
fn a_stalled_reconcile_says_why_once_and_a_settled_one_clears_it() {
    use crate::api::autoscaling_runner_set::StalledReason;
    let missing = Failure {
        reason: StalledReason::CredentialsUnusable,
        message: "secret ns/github-auth does not exist".into(),
    };
    let status = running(2, at(0));
    let mut stalled_status = status.clone();
    stalled_status
        .conditions
        .push(stalled_condition(&missing.message, at(100)));
    let note = "CredentialsUnusable: secret ns/github-auth does not exist";
    assert_eq!(
        stalled(&status, &missing, at(100)),
        vec![
            Step::WriteStatus(StatusChange::Conditions(stalled_status.conditions.clone())),
            Step::Publish(Notice::warning(
                AutoscalingRunnerSetEvent::Stalled.as_str(),
                note,
            )),
        ],
        "the first failure is written and announced"
    );
    assert_eq!(
        stalled(&stalled_status, &missing, at(200)),
        vec![],
        "the same failure again changes nothing"
    );
    let other = Failure {
        message: "secret ns/github-auth has no github_token".into(),
        ..missing.clone()
    };
    let mut changed = stalled_status.conditions.clone();
    changed[1].message = other.message.clone();
    assert_eq!(
        stalled(&stalled_status, &other, at(200)),
        vec![
            Step::WriteStatus(StatusChange::Conditions(changed)),
            Step::Publish(Notice::warning(
                AutoscalingRunnerSetEvent::Stalled.as_str(),
                "CredentialsUnusable: secret ns/github-auth has no github_token",
            )),
        ],
        "a different failure is said, its transition time kept"
    );
    check(vec![(
        "the next reconcile that settles removes the condition",
        Box::new(move |o| {
            o.status.conditions.push(stalled_condition(
                "secret ns/github-auth does not exist",
                at(50),
            ))
        }),
        done(vec![write(running(2, at(0)))]),
    )]);
}

#[test]
fn a_secret_the_spec_no_longer_names_is_let_go_unless_another_set_names_it() {
    let former = |held, shared| FormerCredentials {
        name: "old-auth".into(),
        held,
        shared,
    };
    check(vec![
        (
            "a set that never recorded its Secret records it",
            Box::new(|o| o.credentials_recorded = false),
            done(vec![Step::RecordCredentials]),
        ),
        (
            "the spec names a new Secret: the old one let go, the new one recorded, then held",
            Box::new(move |o| {
                o.credentials_held = Some(false);
                o.credentials_recorded = false;
                o.former_credentials = Some(former(true, false));
            }),
            done(vec![
                Step::ReleaseFormerCredentials("old-auth".into()),
                Step::RecordCredentials,
                Step::HoldCredentials,
            ]),
        ),
        (
            "another set names the old Secret: it stays held",
            Box::new(move |o| {
                o.credentials_recorded = false;
                o.former_credentials = Some(former(true, true));
            }),
            done(vec![Step::RecordCredentials]),
        ),
        (
            "the old Secret no longer carries the finalizer: nothing to release",
            Box::new(move |o| {
                o.credentials_recorded = false;
                o.former_credentials = Some(former(false, false));
            }),
            done(vec![Step::RecordCredentials]),
        ),
        (
            "no Secret to hold yet: nothing is recorded or let go",
            Box::new(move |o| {
                o.credentials_held = None;
                o.credentials_recorded = false;
                o.former_credentials = Some(former(true, false));
            }),
            done(vec![]),
        ),
    ]);
}

#[test]
fn a_shadow_that_would_reject_says_so_and_blocks_nothing() {
    let mut o = settled();
    o.shadow_template = Some(ShadowTemplateVerdict {
        policy: "configmap:ci/strict".into(),
        verdict: Ok(TemplateVerdict::Rejected(vec![violation()])),
    });
    let first = plan(&o);
    let status = first
        .steps
        .iter()
        .find_map(|step| match step {
            Step::WriteStatus(StatusChange::Settled(status)) => Some(status),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{:?}", first.steps));
    assert_eq!(
        (status.phase, status.observed_generation),
        (Some(AutoscalingRunnerSetPhase::Running), Some(2)),
        "the active policy accepted the template: the set runs on"
    );
    let condition = |type_: &str| {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
            .cloned()
            .unwrap_or_else(|| panic!("no {type_}: {:?}", status.conditions))
    };
    assert_eq!(condition("PodTemplateAccepted").status, "True");
    let shadow = condition("ShadowPodTemplateAccepted");
    assert_eq!(
        (shadow.status.as_str(), shadow.reason.as_str()),
        ("False", "WouldReject")
    );
    assert!(
        shadow
            .message
            .starts_with("the shadow policy configmap:ci/strict would reject: "),
        "{}",
        shadow.message
    );
    assert!(
        !first
            .steps
            .iter()
            .any(|s| matches!(s, Step::Publish(n) if n.reason == "PodTemplateRejected")),
        "{:?}",
        first.steps
    );

    // Without a shadow policy the condition goes.
    o.status.conditions.push(shadow);
    o.shadow_template = None;
    let second = plan(&o);
    let gone = second.steps.iter().all(|step| match step {
        Step::WriteStatus(StatusChange::Settled(status)) => !status
            .conditions
            .iter()
            .any(|c| c.type_ == "ShadowPodTemplateAccepted"),
        _ => true,
    });
    assert!(gone, "{:?}", second.steps);
}
