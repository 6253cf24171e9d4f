//! Fresh-instance decision latency of every bundled policy, beside a native
//! Rust implementation of the same logic and beside an empty component that
//! exports the same function (the floor: what instantiation and the call
//! boundary cost with no logic at all).
//!
//! `cargo bench -p arcwright --bench policy`. After criterion's report, a
//! table of p50/p99 over individually timed calls is printed, with each
//! policy's p50 as a multiple of the floor.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arcwright::policy::bundled::{self, BUILTINS};
use arcwright::policy::types::{
    PodValidationInput, RunnerEnding, RunnerPhase, ScaleSet, ScalingInput, Verdict, Violation,
};
use arcwright::policy::{CallLimits, EngineConfig, Policy, PolicyEngine, PolicyKind};
use criterion::Criterion;

fn scaling_input() -> ScalingInput {
    let mut input = ScalingInput {
        scale_set: ScaleSet {
            name: "linux-x64".into(),
            namespace: "ci".into(),
            min_runners: 2,
            max_runners: 50,
            labels: vec!["self-hosted".into(), "linux".into()],
        },
        current_desired: 5,
        now: Some("2026-11-29T10:00:00Z".into()),
        ..ScalingInput::default()
    };
    input.statistics.assigned_jobs = 7;
    input.statistics.running_jobs = 4;
    input.statistics.idle_runners = 1;
    input.runners.running = 5;
    input.runners.busy = 4;
    input
}

fn ending() -> RunnerEnding {
    RunnerEnding {
        name: "linux-x64-abcde".into(),
        namespace: "ci".into(),
        phase: RunnerPhase::Failed,
        exit_code: Some(1),
        reason: "Error".into(),
        had_job: true,
        registered: true,
    }
}

fn pod_input() -> PodValidationInput {
    PodValidationInput {
        template: serde_json::json!({
            "spec": {
                "restartPolicy": "Never",
                "containers": [{
                    "name": "runner",
                    "image": "ghcr.io/actions/actions-runner:2.330.0",
                    "command": ["/home/runner/run.sh"],
                    "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "4Gi"}}
                }]
            }
        }),
    }
}

/// ARC's formula, as the bundled `default` scaling policy computes it.
fn native_scaling(input: &ScalingInput) -> u32 {
    (input.scale_set.min_runners + input.statistics.assigned_jobs).min(input.scale_set.max_runners)
}

/// Seed 000's rule, as `exit-code` starts from.
fn native_deregistration(input: &RunnerEnding) -> Verdict {
    if input.phase == RunnerPhase::Succeeded && input.exit_code == Some(0) {
        Verdict::SelfDeregistered
    } else if input.had_job {
        Verdict::RemoveAfterJob
    } else {
        Verdict::RemoveNow
    }
}

/// The core of the default pod checks: the template arrives as JSON text,
/// as it does for the guest, and is parsed and walked.
fn native_pod_validation(template: &str) -> Vec<Violation> {
    let value: serde_json::Value = serde_json::from_str(template).unwrap_or_default();
    let mut violations = Vec::new();
    let spec = &value["spec"];
    if spec["restartPolicy"].as_str() != Some("Never") {
        violations.push(Violation {
            path: "spec.restartPolicy".into(),
            message: "must be Never".into(),
        });
    }
    let containers = spec["containers"].as_array().cloned().unwrap_or_default();
    match containers.iter().position(|c| c["name"] == "runner") {
        None => violations.push(Violation {
            path: "spec.containers".into(),
            message: "has no runner container".into(),
        }),
        Some(i)
            if containers[i]["image"]
                .as_str()
                .unwrap_or_default()
                .is_empty() =>
        {
            violations.push(Violation {
                path: format!("spec.containers[{i}].image"),
                message: "is missing".into(),
            })
        }
        Some(_) => {}
    }
    if spec["hostNetwork"].as_bool() == Some(true) {
        violations.push(Violation {
            path: "spec.hostNetwork".into(),
            message: "host access is not allowed".into(),
        });
    }
    violations
}

/// A policy ready to call, by kind.
fn configured(engine: &PolicyEngine, wasm: &[u8], label: &str) -> Option<Arc<Policy>> {
    let module = match engine.load(wasm, None) {
        Ok(module) => Arc::new(module),
        Err(err) => {
            eprintln!("skipping {label}: {err}");
            return None;
        }
    };
    Policy::new(module, label, None, CallLimits::default())
        .ok()
        .map(Arc::new)
}

fn call(policy: &Policy) {
    match policy.kind() {
        PolicyKind::Scaling => {
            black_box(
                policy
                    .scaling(black_box(&scaling_input()))
                    .expect("scaling decision"),
            );
        }
        PolicyKind::Deregistration => {
            black_box(
                policy
                    .deregistration(black_box(&ending()))
                    .expect("deregistration decision"),
            );
        }
        PolicyKind::PodValidation => {
            black_box(
                policy
                    .pod_validation(black_box(&pod_input()))
                    .expect("pod-validation decision"),
            );
        }
    }
}

/// The empty component (a scaling policy answering a constant): the floor
/// of instantiation plus the call boundary, for every kind.
fn floor(engine: &PolicyEngine) -> Option<Arc<Policy>> {
    let path = arcwright_test_guests::path("policy-test-empty")?;
    let wasm = std::fs::read(path).expect("the built artifact is readable");
    configured(engine, &wasm, "policy-test-empty")
}

fn benches(c: &mut Criterion, engine: &PolicyEngine) {
    let mut group = c.benchmark_group("policy");
    group
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    if let Some(floor) = floor(engine) {
        group.bench_function("empty-component", |b| b.iter(|| call(&floor)));
    }
    for builtin in BUILTINS {
        let label = format!("{}/{}", builtin.kind, builtin.name);
        if let Some(policy) = configured(engine, builtin.wasm, &label) {
            group.bench_function(format!("{label}/wasm-fresh-instance"), |b| {
                b.iter(|| call(&policy))
            });
        }
    }
    let scaling = scaling_input();
    group.bench_function("scaling/default/native", |b| {
        b.iter(|| native_scaling(black_box(&scaling)))
    });
    let ending = ending();
    group.bench_function("deregistration/exit-code/native", |b| {
        b.iter(|| native_deregistration(black_box(&ending)))
    });
    let template = serde_json::to_string(&pod_input().template).expect("serialisable");
    group.bench_function("pod-validation/default/native", |b| {
        b.iter(|| native_pod_validation(black_box(&template)))
    });
    group.finish();
}

/// p50 and p99 of `n` individually timed calls.
fn percentiles(n: usize, mut f: impl FnMut()) -> (Duration, Duration) {
    for _ in 0..n / 10 {
        f();
    }
    let mut times: Vec<Duration> = (0..n)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        })
        .collect();
    times.sort_unstable();
    (times[n / 2], times[n * 99 / 100])
}

fn table(engine: &PolicyEngine) {
    const N: usize = 5_000;
    println!(
        "\n{:<48} {:>10} {:>10} {:>12}",
        "fresh-instance decision", "p50", "p99", "p50 / floor"
    );
    let floor_p50 = floor(engine).map(|floor| {
        let (p50, p99) = percentiles(N, || call(&floor));
        println!(
            "{:<48} {p50:>10.1?} {p99:>10.1?} {:>12}",
            "empty component (floor)", "1.00"
        );
        p50
    });
    for builtin in BUILTINS {
        let label = format!("{}/{}", builtin.kind, builtin.name);
        let Some(policy) = configured(engine, builtin.wasm, &label) else {
            continue;
        };
        let (p50, p99) = percentiles(N, || call(&policy));
        let ratio = floor_p50.map_or("-".to_string(), |f| {
            format!("{:.2}", p50.as_secs_f64() / f.as_secs_f64())
        });
        println!("{label:<48} {p50:>10.1?} {p99:>10.1?} {ratio:>12}");
    }
    let scaling = scaling_input();
    let (p50, p99) = percentiles(N, || {
        black_box(native_scaling(black_box(&scaling)));
    });
    println!(
        "{:<48} {p50:>10.1?} {p99:>10.1?}",
        "scaling/default native Rust"
    );
    let template = serde_json::to_string(&pod_input().template).expect("serialisable");
    let (p50, p99) = percentiles(N, || {
        black_box(native_pod_validation(black_box(&template)));
    });
    println!(
        "{:<48} {p50:>10.1?} {p99:>10.1?}",
        "pod-validation/default native Rust"
    );
}

/// The same floor and default policy under other pool settings, to show
/// what the defaults were chosen against.
fn tuning() {
    const N: usize = 5_000;
    println!(
        "\n{:<48} {:>10} {:>10}",
        "pool tuning (p50)", "floor", "default"
    );
    let default_wasm = bundled::find(PolicyKind::Scaling, "default")
        .expect("bundled")
        .wasm;
    for (name, keep_resident) in [
        ("linear_memory_keep_resident = 0", 0),
        ("linear_memory_keep_resident = 64 KiB", 64 * 1024),
        ("linear_memory_keep_resident = 256 KiB", 256 * 1024),
        ("linear_memory_keep_resident = 1 MiB (default)", 1024 * 1024),
        ("linear_memory_keep_resident = 4 MiB", 4 * 1024 * 1024),
    ] {
        let engine = PolicyEngine::new(EngineConfig {
            memory_keep_resident: keep_resident,
            ..EngineConfig::default()
        })
        .expect("the policy engine starts");
        let floor = floor(&engine).map(|floor| percentiles(N, || call(&floor)).0);
        let default = configured(&engine, default_wasm, "scaling/default")
            .map(|p| percentiles(N, || call(&p)).0);
        println!(
            "{name:<48} {:>10.1?} {:>10.1?}",
            floor.unwrap_or_default(),
            default.unwrap_or_default()
        );
    }
}

/// How long an infinite loop runs before the epoch deadline stops it, as a
/// multiple of the deadline. The tests only check that it *is* stopped, by
/// the deadline and not by anything else: wall-clock bounds belong here,
/// where a loaded machine shows up as noise instead of a failed test.
fn interruption(engine: &PolicyEngine) {
    const RUNS: usize = 20;
    let Some(path) = arcwright_test_guests::path("policy-test-hostile") else {
        return;
    };
    let wasm = std::fs::read(path).expect("the hostile test component is readable");
    let module = Arc::new(
        engine
            .load(&wasm, Some(PolicyKind::Scaling))
            .expect("the hostile component loads"),
    );
    println!(
        "\n{:<48} {:>10} {:>10} {:>12}",
        "infinite loop stopped after", "p50", "max", "max / limit"
    );
    let settings = serde_json::json!({ "misbehave": "spin" });
    for deadline in [Duration::from_millis(20), Duration::from_millis(50)] {
        let limits = CallLimits {
            deadline,
            ..CallLimits::default()
        };
        let policy = Policy::new(Arc::clone(&module), "hostile:spin", Some(&settings), limits)
            .expect("the hostile policy accepts its settings");
        let mut times: Vec<Duration> = (0..RUNS)
            .map(|_| {
                let start = Instant::now();
                let outcome = policy.scaling(&scaling_input());
                assert!(outcome.is_err(), "the loop must be stopped");
                start.elapsed()
            })
            .collect();
        times.sort_unstable();
        let max = times[RUNS - 1];
        println!(
            "{:<48} {:>10.1?} {max:>10.1?} {:>12.2}",
            format!("deadline {deadline:?}"),
            times[RUNS / 2],
            max.as_secs_f64() / deadline.as_secs_f64()
        );
    }
}

fn main() {
    let engine = PolicyEngine::new(EngineConfig::default()).expect("the policy engine starts");
    let mut criterion = Criterion::default().configure_from_args();
    benches(&mut criterion, &engine);
    criterion.final_summary();
    // `cargo test --benches` runs each benchmark once as a smoke test; the
    // tables are only worth their seconds under `cargo bench`.
    if std::env::args().any(|arg| arg == "--bench") {
        table(&engine);
        interruption(&engine);
        tuning();
    }
}
