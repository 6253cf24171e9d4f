//! The decision point's memory: a scaling policy's state is handed back on
//! the next call, and never to another module.

use std::sync::Arc;

use arcwright::policy::reporter::RecordingReporter;
use arcwright::policy::types::{ScaleSet, ScalingInput};
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
