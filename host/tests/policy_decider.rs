//! The decision point's memory: a scaling policy's state is handed back on
//! the next call, and never to another module.

use std::sync::Arc;

use arcwright::policy::reporter::RecordingReporter;
use arcwright::policy::types::{Decision, ScaleSet, ScalingDecision, ScalingInput};
use arcwright::policy::{CallLimits, Decider, EngineConfig, Policy, PolicyEngine, PolicyKind};

fn policy(engine: &PolicyEngine, name: &str) -> Arc<Policy> {
    let module = Arc::new(engine.load_builtin(PolicyKind::Scaling, name).unwrap());
    Arc::new(
        Policy::new(
            module,
            format!("builtin:{name}"),
            None,
            CallLimits::default(),
        )
        .unwrap(),
    )
}

fn input(assigned: u32, now: &str) -> ScalingInput {
    let mut input = ScalingInput {
        scale_set: ScaleSet {
            name: "linux".into(),
            namespace: "ci".into(),
            min_runners: 0,
            max_runners: 20,
            labels: vec![],
        },
        current_desired: 5,
        now: Some(now.into()),
        ..ScalingInput::default()
    };
    input.statistics.assigned_jobs = assigned;
    input
}

#[test]
fn state_is_handed_back_to_the_module_that_wrote_it() {
    let engine = PolicyEngine::new(EngineConfig::default()).unwrap();
    let cooldown = policy(&engine, "cooldown");
    let decider = Decider::new(
        Arc::clone(&cooldown),
        policy(&engine, "default"),
        Arc::new(RecordingReporter::new()),
    );

    let first = decider
        .scaling_blocking(&input(2, "2026-11-30T09:00:00Z"))
        .unwrap();
    assert_eq!(first.decision.desired, 5);
    assert!(first.decision.state.is_some());

    // The kept state says when the lull began: 299 s later it is still held.
    let second = decider
        .scaling_blocking(&input(3, "2026-11-30T09:04:59Z"))
        .unwrap();
    assert!(
        second.decision.reason.contains("lower for 299s"),
        "{}",
        second.decision.reason
    );

    // Another module never sees it, and coming back starts afresh.
    decider.swap(policy(&engine, "buffered"));
    decider
        .scaling_blocking(&input(1, "2026-11-30T09:05:00Z"))
        .unwrap();
    decider.swap(cooldown);
    let again = decider
        .scaling_blocking(&input(1, "2026-11-30T09:05:00Z"))
        .unwrap();
    assert_eq!(again.decision.desired, 5);
    assert!(
        again.decision.reason.contains("for 0s"),
        "{}",
        again.decision.reason
    );
}

/// A cooldown sequence: a lull, a decision inside the cooldown, the
/// cooldown running out, a burst and a long quiet.
const SEQUENCE: [(u32, &str); 6] = [
    (2, "2026-11-30T09:00:00Z"),
    (3, "2026-11-30T09:02:00Z"),
    (1, "2026-11-30T09:04:59Z"),
    (1, "2026-11-30T09:05:00Z"),
    (6, "2026-11-30T09:06:00Z"),
    (0, "2026-11-30T09:20:00Z"),
];

/// What a decision is compared on: the answer, the reason and the state.
fn answer(decision: &ScalingDecision) -> (u32, String, Option<String>) {
    (
        decision.desired,
        decision.reason.clone(),
        decision
            .state
            .as_ref()
            .map(|s| String::from_utf8(s.clone()).unwrap()),
    )
}

#[test]
fn a_stateful_policy_answers_alike_through_the_decider_and_through_eval() {
    let engine = PolicyEngine::new(EngineConfig::default()).unwrap();
    let cooldown = policy(&engine, "cooldown");

    // The suites' and `policy eval`'s way: the JSON input carries the state
    // the previous answer returned.
    let mut state: Option<String> = None;
    let mut by_eval = Vec::new();
    for (assigned, now) in SEQUENCE {
        let mut json = serde_json::to_value(input(assigned, now)).unwrap();
        json["state"] = serde_json::json!(state);
        let Decision::Scaling(decision) = cooldown.decide_json(&json).unwrap() else {
            panic!("a scaling policy answers with a scaling decision");
        };
        let seen = answer(&decision);
        state = seen.2.clone();
        by_eval.push(seen);
    }
    assert!(by_eval.iter().any(|(_, _, state)| state.is_some()));
    assert_ne!(
        by_eval[2].0, by_eval[3].0,
        "the cooldown ran out: {by_eval:?}"
    );

    // The decider keeping the state itself.
    let decider = Decider::new(
        Arc::clone(&cooldown),
        policy(&engine, "default"),
        Arc::new(RecordingReporter::new()),
    );
    let kept: Vec<_> = SEQUENCE
        .iter()
        .map(|&(assigned, now)| {
            answer(
                &decider
                    .scaling_blocking(&input(assigned, now))
                    .unwrap()
                    .decision,
            )
        })
        .collect();
    assert_eq!(kept, by_eval);

    // A caller handing the state in: the decider honours it over what it
    // kept from its own earlier calls (here, a lull that began a day before).
    let caller = Decider::new(
        Arc::clone(&cooldown),
        policy(&engine, "default"),
        Arc::new(RecordingReporter::new()),
    );
    caller
        .scaling_blocking(&input(0, "2026-11-29T09:00:00Z"))
        .unwrap();
    let given: Vec<_> = SEQUENCE
        .iter()
        .enumerate()
        .skip(1)
        .map(|(step, &(assigned, now))| {
            let mut input = input(assigned, now);
            input.state = by_eval[step - 1].2.clone();
            answer(&caller.scaling_blocking(&input).unwrap().decision)
        })
        .collect();
    assert_eq!(given, by_eval[1..]);
}

#[test]
fn more_callers_than_pool_slots_all_get_answers() {
    // Two slots, sixteen threads: the semaphore, not the pool, makes them wait.
    let engine = PolicyEngine::new(EngineConfig {
        max_concurrency: 2,
        ..EngineConfig::default()
    })
    .unwrap();
    let default = policy(&engine, "default");
    let threads: Vec<_> = (0..16)
        .map(|i| {
            let default = Arc::clone(&default);
            std::thread::spawn(move || {
                (0..20)
                    .map(|_| {
                        default
                            .scaling(&input(i, "2026-11-30T09:00:00Z"))
                            .unwrap()
                            .desired
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for (i, thread) in threads.into_iter().enumerate() {
        assert!(thread.join().unwrap().iter().all(|&d| d == i as u32));
    }
}

#[tokio::test]
async fn deregistration_and_pod_validation_decide_off_the_workers() {
    use arcwright::policy::types::{PodValidationInput, RunnerEnding, RunnerPhase, Verdict};
    let engine = PolicyEngine::new(EngineConfig::default()).unwrap();
    let builtin = |kind, name: &str| {
        let module = Arc::new(engine.load_builtin(kind, name).unwrap());
        Arc::new(
            Policy::new(
                module,
                format!("builtin:{name}"),
                None,
                CallLimits::default(),
            )
            .unwrap(),
        )
    };
    let exit_code = builtin(PolicyKind::Deregistration, "exit-code");
    let decider = Decider::new(
        Arc::clone(&exit_code),
        exit_code,
        Arc::new(RecordingReporter::new()),
    );
    let decided = decider
        .deregistration(RunnerEnding {
            phase: RunnerPhase::Succeeded,
            exit_code: Some(0),
            registered: true,
            ..RunnerEnding::default()
        })
        .await
        .unwrap();
    assert_eq!(decided.decision.verdict, Verdict::SelfDeregistered);
    assert_eq!(decided.policy, "builtin:exit-code");

    let pods = builtin(PolicyKind::PodValidation, "default");
    let decider = Decider::new(Arc::clone(&pods), pods, Arc::new(RecordingReporter::new()));
    let decided = decider
        .pod_validation(PodValidationInput {
            template: serde_json::json!({"spec": {"restartPolicy": "Always", "containers": []}}),
        })
        .await
        .unwrap();
    let paths: Vec<&str> = decided
        .decision
        .violations
        .iter()
        .map(|v| v.path.as_str())
        .collect();
    assert!(paths.contains(&"spec.restartPolicy"), "{paths:?}");
}
