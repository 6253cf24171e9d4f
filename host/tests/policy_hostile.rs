//! Hostile and malformed modules: each gives a clear error, the host
//! survives, and the next call to a good policy works.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arcwright::policy::bundled;
use arcwright::policy::metrics::PolicyMetrics;
use arcwright::policy::reporter::{RecordingReporter, TracingReporter};
use arcwright::policy::types::{ScaleSet, ScalingInput};
use arcwright::policy::{
    CallLimits, Decider, EngineConfig, Policy, PolicyEngine, PolicyError, PolicyEvent, PolicyKind,
    PolicyModule, PolicyReporter,
};

fn engine() -> PolicyEngine {
    PolicyEngine::new(EngineConfig::default()).unwrap()
}

use arcwright_test_guests::wasm as artifact;

fn hostile(engine: &PolicyEngine) -> Arc<PolicyModule> {
    Arc::new(
        engine
            .load(&artifact("policy-test-hostile"), Some(PolicyKind::Scaling))
            .unwrap(),
    )
}

fn misbehaving(module: &Arc<PolicyModule>, how: &str) -> Policy {
    let settings = serde_json::json!({ "misbehave": how });
    Policy::new(
        Arc::clone(module),
        format!("hostile:{how}"),
        Some(&settings),
        CallLimits::default(),
    )
    .unwrap()
}

fn input() -> ScalingInput {
    let mut input = ScalingInput {
        scale_set: ScaleSet {
            name: "linux".into(),
            namespace: "ci".into(),
            min_runners: 1,
            max_runners: 10,
            labels: vec!["linux".into()],
        },
        ..ScalingInput::default()
    };
    input.statistics.assigned_jobs = 3;
    input
}

/// The bundled default answers correctly: the engine is still healthy.
fn assert_good_policy_works(engine: &PolicyEngine) {
    let module = Arc::new(engine.load_builtin(PolicyKind::Scaling, "default").unwrap());
    let policy = Policy::new(module, "builtin:default", None, CallLimits::default()).unwrap();
    assert_eq!(policy.scaling(&input()).unwrap().desired, 4);
}

/// Far above any deadline: a call still running this long was not stopped
/// by its deadline at all. How close to the deadline the stop comes is a
/// figure for the benchmark (`cargo bench -p arcwright --bench policy`),
/// where a loaded machine is noise rather than a failed test.
const NEVER_STOPPED: Duration = Duration::from_secs(5);

#[test]
fn an_infinite_loop_is_stopped_by_its_deadline() {
    let engine = engine();
    let policy = misbehaving(&hostile(&engine), "spin");
    let started = Instant::now();
    let err = policy.scaling(&input()).unwrap_err();
    let elapsed = started.elapsed();
    assert!(matches!(err, PolicyError::Timeout { .. }), "{err}");
    assert!(err.to_string().contains("50 ms"), "{err}");
    // The epoch deadline counts from the call's start, so it cannot fire
    // early; it firing at all is what the upper bound checks.
    assert!(
        elapsed >= Duration::from_millis(50),
        "stopped early: {elapsed:?}"
    );
    assert!(elapsed < NEVER_STOPPED, "not stopped: {elapsed:?}");
    assert_good_policy_works(&engine);
}

#[test]
fn a_per_policy_deadline_is_honoured() {
    let engine = engine();
    let settings = serde_json::json!({ "misbehave": "spin" });
    let limits = CallLimits {
        deadline: Duration::from_millis(20),
        ..CallLimits::default()
    };
    let policy = Policy::new(hostile(&engine), "hostile:spin", Some(&settings), limits).unwrap();
    let started = Instant::now();
    let err = policy.scaling(&input()).unwrap_err();
    assert!(matches!(err, PolicyError::Timeout { .. }), "{err}");
    assert!(err.to_string().contains("20 ms"), "{err}");
    assert!(started.elapsed() >= Duration::from_millis(20));
    assert!(started.elapsed() < NEVER_STOPPED);
}

#[test]
fn a_memory_bomb_hits_the_cap() {
    let engine = engine();
    // Touching 16 MiB page by page can outlast the default 50 ms deadline on
    // a loaded machine; the deadline is lifted so this test sees the memory
    // cap, which is what it is about.
    let policy = Policy::new(
        hostile(&engine),
        "hostile:memory-bomb",
        Some(&serde_json::json!({ "misbehave": "memory-bomb" })),
        CallLimits {
            deadline: Duration::from_secs(1),
            ..CallLimits::default()
        },
    )
    .unwrap();
    let err = policy.scaling(&input()).unwrap_err();
    match &err {
        PolicyError::MemoryLimit { limit, requested } => {
            assert_eq!(*limit, 16 * 1024 * 1024);
            assert!(requested > limit);
        }
        other => panic!("expected a memory error, got {other}"),
    }
    assert_eq!(err.reason(), "memory");
    assert_good_policy_works(&engine);
}

#[test]
fn a_panic_is_a_trap() {
    let engine = engine();
    let err = misbehaving(&hostile(&engine), "panic")
        .scaling(&input())
        .unwrap_err();
    assert!(matches!(err, PolicyError::Trap(_)), "{err}");
    assert!(err.to_string().contains("unreachable"), "{err}");
    assert_good_policy_works(&engine);
}

#[test]
fn huge_output_and_state_are_refused() {
    let engine = engine();
    let module = hostile(&engine);
    let err = misbehaving(&module, "huge-output")
        .scaling(&input())
        .unwrap_err();
    // The 4 MiB reason is stopped while it is copied out, by the
    // per-crossing budget, before the host holds all of it.
    assert!(matches!(err, PolicyError::CrossingTooLarge { .. }), "{err}");
    assert_eq!(err.reason(), "output-too-large");
    let err = misbehaving(&module, "huge-state")
        .scaling(&input())
        .unwrap_err();
    assert!(
        matches!(err, PolicyError::OutputTooLarge { what: "state", .. }),
        "{err}"
    );
    assert_good_policy_works(&engine);
}

#[test]
fn an_answer_above_max_is_clamped() {
    let engine = engine();
    let decision = misbehaving(&hostile(&engine), "bad-desired")
        .scaling(&input())
        .unwrap();
    assert_eq!(decision.desired, 10);
    assert!(decision.clamped_from.is_some_and(|d| d > 10));
}

#[test]
fn the_hostile_module_behaves_with_empty_settings() {
    let engine = engine();
    let policy = Policy::new(hostile(&engine), "hostile", None, CallLimits::default()).unwrap();
    let decision = policy.scaling(&input()).unwrap();
    assert_eq!(decision.desired, 4);
    assert_eq!(decision.reason, "minRunners 1 + assignedJobs 3 = 4");
    assert_eq!(decision.clamped_from, None);
}

/// Collects what the `tracing` subscriber of a test writes.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

/// The per-call log budget of the host (`MAX_LOG_LINES_PER_CALL`), as an
/// operator sees it: a policy writes at most this many lines per decision.
const LOG_LINES_PER_CALL: usize = 16;

#[test]
fn a_log_flood_is_cut_to_the_per_call_budget() {
    let engine = engine();
    let settings = serde_json::json!({ "misbehave": "log-flood" });
    // Every line is a call into the host, dropped or not: the longest
    // deadline, so that a loaded machine cannot turn this into a timeout.
    let limits = CallLimits {
        deadline: Duration::from_millis(1000),
        ..CallLimits::default()
    };
    let policy = Policy::new(
        hostile(&engine),
        "hostile:log-flood",
        Some(&settings),
        limits,
    )
    .unwrap();
    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer({
            let captured = captured.clone();
            move || captured.clone()
        })
        .with_ansi(false)
        .with_max_level(tracing::Level::DEBUG)
        .finish();
    // The guest runs on the calling thread, so a thread-local subscriber
    // sees everything the host logs for it. Two decisions: the budget is
    // per call, and a flood in one does not silence the next.
    let decisions = tracing::subscriber::with_default(subscriber, || {
        [policy.scaling(&input()), policy.scaling(&input())]
    });
    for decision in decisions {
        // 10 000 lines logged, and the answer is still the normal one.
        assert_eq!(decision.unwrap().desired, 4);
    }

    let log = captured.text();
    let flood: Vec<&str> = log.lines().filter(|l| l.contains("flood line")).collect();
    assert_eq!(flood.len(), 2 * LOG_LINES_PER_CALL, "{log}");
    for (i, line) in flood.iter().enumerate() {
        let n = i % LOG_LINES_PER_CALL;
        assert!(line.contains(&format!("flood line {n}")), "{line}");
        assert!(line.contains("WARN"), "{line}");
        // Attributed to the policy.
        assert!(line.contains("hostile:log-flood"), "{line}");
    }
    // The first line of each flood is 8 KiB long; it arrives cut short.
    assert!(flood[0].len() < 1200, "{} bytes", flood[0].len());
    assert!(flood[0].contains("xxx..."), "{}", flood[0]);
    assert_eq!(
        log.matches("policy logged more than 16 lines in one call; the rest are dropped")
            .count(),
        2,
        "{log}"
    );
}

/// A decider over `policy` that falls back to the bundled default and
/// records what it reports.
fn deciding(engine: &PolicyEngine, policy: Policy) -> (Decider, Arc<RecordingReporter>) {
    let default = Policy::new(
        Arc::new(engine.load_builtin(PolicyKind::Scaling, "default").unwrap()),
        "builtin:default",
        None,
        CallLimits::default(),
    )
    .unwrap();
    let recording = Arc::new(RecordingReporter::new());
    let decider = Decider::new(Arc::new(policy), Arc::new(default), recording.clone());
    (decider, recording)
}

#[test]
fn failures_fall_back_to_the_default_and_are_reported() {
    let engine = engine();
    let module = hostile(&engine);
    let (decider, recording) = deciding(&engine, misbehaving(&module, "panic"));
    let decided = decider.scaling_blocking(&input()).unwrap();
    assert_eq!(decided.decision.desired, 4);
    assert_eq!(decided.policy, "builtin:default");
    assert!(decided.fallback_reason.unwrap().contains("trapped"));
    for how in ["spin", "memory-bomb", "huge-output", "error"] {
        decider.swap(Arc::new(misbehaving(&module, how)));
        assert_eq!(
            decider.scaling_blocking(&input()).unwrap().decision.desired,
            4,
            "{how}"
        );
    }
    decider.swap(Arc::new(misbehaving(&module, "bad-desired")));
    let decided = decider.scaling_blocking(&input()).unwrap();
    assert_eq!(decided.decision.desired, 10);
    assert_eq!(decided.policy, "hostile:bad-desired");

    let reasons: Vec<(String, String)> = recording
        .events()
        .into_iter()
        .map(|r| {
            let reason = r.event.failure_reason().unwrap_or_default().to_string();
            (r.policy, reason)
        })
        .collect();
    assert_eq!(
        reasons,
        [
            ("hostile:panic", "trap"),
            ("hostile:spin", "timeout"),
            ("hostile:memory-bomb", "memory"),
            ("hostile:huge-output", "output-too-large"),
            ("hostile:error", "decision-error"),
            ("hostile:bad-desired", "out-of-range"),
        ]
        .map(|(p, r)| (p.to_string(), r.to_string()))
    );
    assert!(matches!(
        &recording.events()[0].event,
        PolicyEvent::Fallback { fallback, .. } if fallback == "builtin:default"
    ));
}

#[test]
fn a_policy_error_falls_back_and_says_why() {
    let engine = engine();
    let (decider, recording) = deciding(&engine, misbehaving(&hostile(&engine), "error"));
    let decided = decider.scaling_blocking(&input()).unwrap();
    assert_eq!(decided.decision.desired, 4);
    assert_eq!(decided.policy, "builtin:default");
    let why = decided.fallback_reason.unwrap();
    assert!(why.contains("asked to fail"), "{why}");
    let events = recording.events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].policy, "hostile:error");
    assert_eq!(events[0].event.failure_reason(), Some("decision-error"));
}

#[tokio::test]
async fn async_decisions_fall_back_off_the_worker_threads() {
    let engine = engine();
    let module = hostile(&engine);
    let default = Arc::new(
        Policy::configure(
            Arc::new(engine.load_builtin(PolicyKind::Scaling, "default").unwrap()),
            "builtin:default",
            None,
            CallLimits::default(),
        )
        .await
        .unwrap(),
    );
    let metrics = PolicyMetrics::default();
    let reporter: Arc<dyn PolicyReporter> = Arc::new(TracingReporter::new(metrics.clone()));
    let decider = Decider::new(Arc::new(misbehaving(&module, "spin")), default, reporter)
        .with_metrics(metrics.clone());
    let calls: Vec<_> = (0..8)
        .map(|_| {
            let decider = decider.clone();
            tokio::spawn(async move { decider.scaling(input()).await })
        })
        .collect();
    for call in calls {
        assert_eq!(call.await.unwrap().unwrap().decision.desired, 4);
    }
    let failures = metrics
        .failures
        .get_or_create(&arcwright::policy::metrics::FailureLabels {
            kind: "scaling".into(),
            policy: "hostile:spin".into(),
            reason: "timeout".into(),
        })
        .get();
    assert_eq!(failures, 8);
}

#[test]
fn malformed_modules_are_refused_with_clear_errors() {
    let engine = engine();
    let refuse = |bytes: &[u8]| engine.load(bytes, None).unwrap_err();

    let err = refuse(b"\x7fELF\x02\x01\x01 random bytes, not a module at all");
    assert!(matches!(err, PolicyError::NotWebAssembly), "{err}");

    // The smallest valid core module.
    let err = refuse(b"\0asm\x01\0\0\0");
    assert!(matches!(err, PolicyError::CoreModule), "{err}");
    assert!(err.to_string().contains("not a component"));

    // The smallest valid component: it exports nothing, so it is no policy.
    let err = refuse(b"\0asm\x0d\0\x01\0");
    assert!(matches!(err, PolicyError::NotAPolicy { .. }), "{err}");
    assert!(err.to_string().contains("exports: nothing"), "{err}");

    // A component header followed by garbage.
    let err = refuse(b"\0asm\x0d\0\x01\0\xff\xff\xff\xff garbage");
    assert!(matches!(err, PolicyError::Compile(_)), "{err}");

    let big = EngineConfig {
        max_module_size: 16,
        ..EngineConfig::default()
    };
    let err = PolicyEngine::new(big)
        .unwrap()
        .load(&[b"\0asm\x0d\0\x01\0".as_slice(), &[0; 32]].concat(), None);
    assert!(matches!(
        err,
        Err(PolicyError::TooLarge {
            size: 40,
            limit: 16
        })
    ));

    assert_good_policy_works(&engine);
}

#[test]
fn a_module_for_another_world_is_refused() {
    let engine = engine();
    let err = engine
        .load(
            &artifact("policy-test-hostile"),
            Some(PolicyKind::Deregistration),
        )
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "the component is a scaling policy, but a deregistration policy is required here"
    );
    let exit_code = bundled::find(PolicyKind::Deregistration, "exit-code").unwrap();
    let err = engine
        .load(exit_code.wasm, Some(PolicyKind::PodValidation))
        .unwrap_err();
    assert_eq!(err.reason(), "wrong-world");
    assert_good_policy_works(&engine);
}

#[test]
fn a_module_importing_wasi_is_refused_with_the_imports_listed() {
    let engine = engine();
    let err = engine
        .load(&artifact("policy-test-wasi"), None)
        .unwrap_err();
    let message = err.to_string();
    assert!(
        matches!(err, PolicyError::ForbiddenImports { .. }),
        "{message}"
    );
    assert!(message.contains("wasi:filesystem/"), "{message}");
    assert!(message.contains("wasi:cli/environment@"), "{message}");
    assert!(
        message.contains("may import nothing but arcwright:policy/host@0.1.0"),
        "{message}"
    );
    assert_good_policy_works(&engine);
}

#[test]
fn settings_are_validated_before_use() {
    let engine = engine();
    let buffered = Arc::new(
        engine
            .load_builtin(PolicyKind::Scaling, "buffered")
            .unwrap(),
    );
    let settings = serde_json::json!({ "idle": -1 });
    let err = Policy::new(
        Arc::clone(&buffered),
        "builtin:buffered",
        Some(&settings),
        CallLimits::default(),
    )
    .unwrap_err();
    assert!(matches!(err, PolicyError::SettingsRejected(_)), "{err}");
    assert!(err.to_string().contains("`idle`"), "{err}");
    // Settings that pass are the ones it decides with: min 1 + 3 assigned
    // + 2 idle.
    let settings = serde_json::json!({ "idle": 2 });
    let policy = Policy::new(
        buffered,
        "builtin:buffered",
        Some(&settings),
        CallLimits::default(),
    )
    .expect("idle 2 is accepted");
    assert_eq!(policy.scaling(&input()).unwrap().desired, 6);
    let limits = CallLimits {
        memory: 1024,
        ..CallLimits::default()
    };
    let err = Policy::new(hostile(&engine), "hostile", None, limits).unwrap_err();
    assert!(matches!(err, PolicyError::LimitOutOfRange { .. }), "{err}");
}

#[test]
fn compiled_modules_are_cached_on_disk_and_reused() {
    let dir = tempfile::tempdir().unwrap();
    let config = EngineConfig {
        cache_dir: Some(dir.path().to_path_buf()),
        ..EngineConfig::default()
    };
    let builtin = bundled::find(PolicyKind::Scaling, "default").unwrap();
    let first = PolicyEngine::new(config.clone()).unwrap();
    let module = first.load(builtin.wasm, None).unwrap();
    let files: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(Result::ok)
        .collect();
    assert_eq!(files.len(), 1);
    let name = files[0].file_name().into_string().unwrap();
    assert!(
        name.starts_with(module.sha256()) && name.ends_with(".cwasm"),
        "{name}"
    );

    // A second engine (a restart) loads the compiled file and it decides.
    let second = PolicyEngine::new(config.clone()).unwrap();
    let module = Arc::new(second.load(builtin.wasm, None).unwrap());
    let policy = Policy::new(module, "builtin:default", None, CallLimits::default()).unwrap();
    assert_eq!(policy.scaling(&input()).unwrap().desired, 4);

    // A corrupted cache file is recompiled, not trusted.
    std::fs::write(files[0].path(), b"corrupt").unwrap();
    let third = PolicyEngine::new(config).unwrap();
    let module = Arc::new(third.load(builtin.wasm, None).unwrap());
    let policy = Policy::new(module, "builtin:default", None, CallLimits::default()).unwrap();
    assert_eq!(policy.scaling(&input()).unwrap().desired, 4);
}

#[test]
fn one_module_loaded_at_once_from_many_threads_is_compiled_once() {
    let engine = engine();
    let wasm = Arc::new(artifact("policy-test-hostile"));
    let loads: Vec<_> = (0..8)
        .map(|_| {
            let engine = engine.clone();
            let wasm = Arc::clone(&wasm);
            std::thread::spawn(move || engine.load(&wasm, Some(PolicyKind::Scaling)).map(|_| ()))
        })
        .collect();
    for load in loads {
        load.join().unwrap().unwrap();
    }
    assert_eq!(engine.compilations(), 1);
}
