//! What the host reads from outside, fuzzed: every Actions answer it
//! decodes (message bodies, JIT configs, error bodies, `Retry-After`, the
//! admin token), the configuration URL a tenant writes, and the bundled
//! scaling policies' answers to any input, through the real wasmtime.
//!
//! Each target holds properties, not just "does not panic": a decoded
//! message survives its own encoding, a JIT config is never accepted
//! without a registration id (one recorded as `0` is a registration nobody
//! removes), no decode error quotes the secret it failed on, a service's
//! error text stays bounded, no wait the service asks for exceeds the
//! client's caps, and a bundled policy answers every valid input within
//! the scale set's bounds.
//!
//! Inputs come three ways: the seeds in `host/fuzz/corpus/<target>/`
//! (real shapes from the protocol), those seeds mutated (bytes flipped,
//! inserted, removed, duplicated, truncated), and random bytes; the message
//! target also builds bodies from JSON trees over the protocol's field
//! names. `cargo test` runs [`CASES`] cases per target (a few seconds);
//! `ARCWRIGHT_FUZZ_CASES=200000 cargo test -p arcwright --lib fuzz` is the
//! long run. A failing case is shrunk and kept by proptest under
//! `host/proptest-regressions/`, and a seed worth keeping goes in the
//! corpus.
//!
//! Chosen over `cargo fuzz`, which needs a nightly toolchain and
//! libFuzzer: proptest runs on stable, in the ordinary test build, so the
//! short run costs CI no extra compile.

use std::path::Path;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

use crate::actions::client::Response;
use crate::actions::error::classify_response;
use crate::actions::retry::{backoff, parse_retry_after};
use crate::actions::types::MessageEnvelope;
use crate::actions::{ConfigUrl, Operation, RetryPolicy, auth};

/// Cases per target in an ordinary test run.
pub const CASES: u32 = 512;

/// The secret the JIT config seeds carry; no error may quote it.
const SECRET: &str = "SECRETSECRETSECRET";

fn cases() -> u32 {
    std::env::var("ARCWRIGHT_FUZZ_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(CASES)
}

fn runner() -> TestRunner {
    TestRunner::new(Config {
        cases: cases(),
        ..Config::default()
    })
}

/// The seeds of `target`, in name order.
fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("the corpus {}: {e}", dir.display()))
        .map(|entry| entry.expect("a corpus entry").path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "the corpus {} is empty", dir.display());
    files
        .iter()
        .map(|f| std::fs::read(f).expect("a corpus file reads"))
        .collect()
}

/// One change to a seed; positions are taken modulo its length.
#[derive(Clone, Debug)]
enum Mutation {
    Flip { at: usize, bit: u8 },
    Insert { at: usize, byte: u8 },
    Remove { at: usize, len: usize },
    Duplicate { at: usize, len: usize, to: usize },
    Truncate { at: usize },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 0u8..8).prop_map(|(at, bit)| Mutation::Flip { at, bit }),
        (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Mutation::Insert { at, byte }),
        (any::<usize>(), 1usize..16).prop_map(|(at, len)| Mutation::Remove { at, len }),
        (any::<usize>(), 1usize..64, any::<usize>())
            .prop_map(|(at, len, to)| Mutation::Duplicate { at, len, to }),
        any::<usize>().prop_map(|at| Mutation::Truncate { at }),
    ]
}

fn mutate(mut bytes: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for m in mutations {
        let n = bytes.len().max(1);
        match *m {
            Mutation::Flip { at, bit } => {
                if let Some(b) = bytes.get_mut(at % n) {
                    *b ^= 1 << bit;
                }
            }
            Mutation::Insert { at, byte } => bytes.insert((at % n).min(bytes.len()), byte),
            Mutation::Remove { at, len } => {
                let start = (at % n).min(bytes.len());
                let end = (start + len).min(bytes.len());
                bytes.drain(start..end);
            }
            Mutation::Duplicate { at, len, to } => {
                let start = (at % n).min(bytes.len());
                let end = (start + len).min(bytes.len());
                let piece = bytes[start..end].to_vec();
                let to = (to % n).min(bytes.len());
                bytes.splice(to..to, piece);
            }
            Mutation::Truncate { at } => bytes.truncate(at % n),
        }
    }
    bytes
}

/// Seeds, seeds mutated, and random bytes.
fn inputs(target: &str) -> impl Strategy<Value = Vec<u8>> {
    let seeds = corpus(target);
    prop_oneof![
        3 => (proptest::sample::select(seeds), proptest::collection::vec(mutation(), 0..8))
            .prop_map(|(seed, mutations)| mutate(seed, &mutations)),
        1 => proptest::collection::vec(any::<u8>(), 0..512),
    ]
}

fn text(target: &str) -> impl Strategy<Value = String> {
    prop_oneof![
        3 => inputs(target).prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
        1 => any::<String>(),
    ]
}

/// A JSON tree over the protocol's field names, so decoding meets the
/// right keys with the wrong values.
fn json_tree() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    const KEYS: &[&str] = &[
        "messageType",
        "runnerRequestId",
        "acquireJobUrl",
        "repositoryName",
        "ownerName",
        "jobId",
        "jobWorkflowRef",
        "jobDisplayName",
        "workflowRunId",
        "eventName",
        "requestLabels",
        "queueTime",
        "scaleSetAssignTime",
        "runnerAssignTime",
        "finishTime",
        "runnerId",
        "runnerName",
        "result",
    ];
    const TYPES: &[&str] = &["JobAvailable", "JobAssigned", "JobStarted", "JobCompleted"];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        proptest::sample::select(TYPES).prop_map(Value::from),
        Just(Value::from("2026-01-01T00:00:00Z")),
        ".{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map(proptest::sample::select(KEYS), inner, 0..10).prop_map(
                |m| Value::Object(m.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
            ),
        ]
    })
}

/// A decoded message is what its own encoding decodes to.
fn check_message(bytes: &[u8]) -> Result<(), TestCaseError> {
    let Ok(envelope) = serde_json::from_slice::<MessageEnvelope>(bytes) else {
        return Ok(());
    };
    if let Ok(message) = envelope.decode() {
        let again = message.to_envelope().decode();
        prop_assert_eq!(again.as_ref(), Ok(&message));
    }
    Ok(())
}

#[test]
fn message_bodies() {
    runner()
        .run(&inputs("message"), |bytes| check_message(&bytes))
        .unwrap();
    let bodies = proptest::collection::vec(json_tree(), 0..6).prop_map(|items| {
        serde_json::to_vec(&serde_json::json!({
            "messageId": 1,
            "messageType": "RunnerScaleSetJobMessages",
            "body": serde_json::to_string(&items).unwrap(),
        }))
        .unwrap()
    });
    runner()
        .run(&bodies, |bytes| check_message(&bytes))
        .unwrap();
}

#[test]
fn jit_config_answers() {
    runner()
        .run(&inputs("jit_config"), |body| {
            let quoted = String::from_utf8_lossy(&body).contains(SECRET);
            let response = Response { status: 200, body };
            match crate::actions::client::jit_config(&response) {
                Ok(jit) => {
                    prop_assert!(jit.runner.id > 0, "accepted without a registration id");
                    prop_assert!(!jit.encoded_jit_config.expose().is_empty());
                }
                Err(error) => {
                    if quoted {
                        prop_assert!(!error.to_string().contains(SECRET), "{}", error);
                    }
                }
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn error_bodies() {
    let content_types = proptest::sample::select(vec![
        None,
        Some("application/json"),
        Some("text/plain; charset=utf-8"),
        Some("text/html"),
    ]);
    let operations = proptest::sample::select(vec![
        Operation::GetScaleSet,
        Operation::CreateSession,
        Operation::GetMessage,
        Operation::GenerateJitConfig,
        Operation::RemoveRunner,
    ]);
    let cases = (inputs("error_body"), 400u16..600, content_types, operations);
    runner()
        .run(&cases, |(body, status, content_type, operation)| {
            let error = classify_response(operation, status, content_type, &body, None, 0);
            // The service's text is cut; what surrounds it is short.
            let shown = error.to_string().chars().count();
            prop_assert!(
                shown <= crate::actions::error::MAX_MESSAGE_CHARS + 512,
                "{shown}"
            );
            Ok(())
        })
        .unwrap();
}

#[test]
fn config_urls() {
    runner()
        .run(&text("config_url"), |input| {
            if let Ok(url) = ConfigUrl::parse(&input) {
                let again = ConfigUrl::parse(url.url().as_str());
                prop_assert!(again.is_ok(), "{input:?} parsed, its own URL did not");
                let again = again.unwrap();
                prop_assert_eq!(again.scope(), url.scope());
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn retry_after_headers() {
    let policy = RetryPolicy::default();
    let cap = policy.max_delay.max(policy.max_retry_after);
    let now = jiff::Timestamp::from_second(1_800_000_000).unwrap();
    runner()
        .run(
            &(text("retry_after"), 0u32..20, 0.0f64..1.0),
            |(header, retry, jitter)| {
                let asked = parse_retry_after(&header, now);
                let wait = backoff(&policy, retry, asked, jitter);
                prop_assert!(wait <= cap, "{header:?} made the client wait {wait:?}");
                Ok(())
            },
        )
        .unwrap();
    // The caps are what the client documents, not unbounded.
    assert!(cap <= Duration::from_secs(600), "{cap:?}");
}

#[test]
fn admin_tokens() {
    runner()
        .run(&text("admin_token"), |token| {
            if let Err(error) = auth::jwt_expiry(&token)
                && token.len() >= 8
            {
                prop_assert!(
                    !error.to_string().contains(&token),
                    "the error quotes the token"
                );
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn bundled_scaling_policies_answer_every_input_within_bounds() {
    use crate::policy::types::{JobStatistics, RunnerCounts, ScaleSet, ScalingInput};
    use crate::policy::{CallLimits, EngineConfig, Policy, PolicyEngine, PolicyKind};

    let engine = PolicyEngine::new(EngineConfig::default()).unwrap();
    let policies: Vec<(&str, Policy)> = crate::policy::bundled::BUILTINS
        .iter()
        .filter(|b| b.kind == PolicyKind::Scaling)
        .filter_map(|b| {
            let module =
                std::sync::Arc::new(engine.load_builtin(PolicyKind::Scaling, b.name).ok()?);
            // A policy that needs settings is fuzzed by its own suite.
            let policy = Policy::new(module, b.name, None, CallLimits::default()).ok()?;
            Some((b.name, policy))
        })
        .collect();
    assert!(
        policies.iter().any(|(name, _)| *name == "default"),
        "the default scaling policy is fuzzed"
    );
    let small = || prop_oneof![0u32..50, any::<u32>()];
    let inputs = (
        (small(), small(), small(), small()),
        (small(), small(), small()),
        (small(), small(), small(), small(), small()),
        (0u32..100, 0u32..2000, small()),
        proptest::option::of(".{0,40}"),
    )
        .prop_map(|(jobs, runners, counts, bounds, state)| {
            let (available_jobs, acquired_jobs, assigned_jobs, running_jobs) = jobs;
            let (registered_runners, busy_runners, idle_runners) = runners;
            let (pending, running, busy, failed, deleting) = counts;
            let (min_runners, max_runners, current_desired) = bounds;
            ScalingInput {
                scale_set: ScaleSet {
                    name: "linux".into(),
                    namespace: "ci".into(),
                    min_runners: min_runners.min(max_runners),
                    max_runners,
                    labels: vec!["linux".into()],
                },
                statistics: JobStatistics {
                    available_jobs,
                    acquired_jobs,
                    assigned_jobs,
                    running_jobs,
                    registered_runners,
                    busy_runners,
                    idle_runners,
                },
                runners: RunnerCounts {
                    pending,
                    running,
                    busy,
                    failed,
                    deleting,
                    ..RunnerCounts::default()
                },
                current_desired,
                now: Some("2026-06-01T12:00:00Z".into()),
                state,
            }
        });
    let mut runner = TestRunner::new(Config {
        // Each case is a wasm call per policy; fewer cases, still seconds.
        cases: cases() / 4,
        ..Config::default()
    });
    runner
        .run(&inputs, |input| {
            for (name, policy) in &policies {
                let decision = policy.scaling(&input);
                prop_assert!(decision.is_ok(), "{name} failed on {input:?}: {decision:?}");
                let decision = decision.unwrap();
                prop_assert!(
                    decision.desired <= input.scale_set.max_runners,
                    "{name} answered {} above maxRunners {}",
                    decision.desired,
                    input.scale_set.max_runners
                );
                prop_assert!(!decision.reason.is_empty(), "{name} gave no reason");
            }
            Ok(())
        })
        .unwrap();
}
