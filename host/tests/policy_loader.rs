//! The ConfigMap loader against a real API server: create, update to a good
//! version, update to a bad one, delete.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arcwright::policy::bundled;
use arcwright::policy::defaults::DefaultPolicies;
use arcwright::policy::loader::{
    ConfigMapPolicyRef, LoadedPolicy, PolicyLoader, PolicyRef, RetryBackoff,
};
use arcwright::policy::reporter::RecordingReporter;
use arcwright::policy::types::ScalingInput;
use arcwright::policy::{EngineConfig, PolicyEngine, PolicyEvent, PolicyKind};
use arcwright_harness::TestEnv;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use sha2::Digest as _;

const WAIT: Duration = Duration::from_secs(20);

fn configmap(name: &str, key: &str, wasm: &[u8]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        binary_data: Some(BTreeMap::from([(
            key.to_string(),
            ByteString(wasm.to_vec()),
        )])),
        ..ConfigMap::default()
    }
}

fn digest(wasm: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(wasm))
}

fn wasm(name: &str) -> &'static [u8] {
    bundled::find(PolicyKind::Scaling, name).unwrap().wasm
}

fn loaded(sha: &str) -> impl Fn(&PolicyEvent) -> bool + '_ {
    move |event| matches!(event, PolicyEvent::Loaded { sha256 } if sha256 == sha)
}

fn load_failed(reason: &'static str) -> impl Fn(&PolicyEvent) -> bool {
    move |event| matches!(event, PolicyEvent::LoadFailed { reason: r, .. } if r == reason)
}

/// Waits until `count` events match `predicate`, failing with every event
/// seen so far when they do not arrive in time.
async fn expect_events(
    reporter: &RecordingReporter,
    count: usize,
    predicate: impl Fn(&PolicyEvent) -> bool,
) {
    assert!(
        reporter.wait_for(count, WAIT, predicate).await,
        "{:?}",
        reporter.events()
    );
}

async fn replace(api: &Api<ConfigMap>, name: &str, wasm: &[u8]) {
    let mut cm = api.get(name).await.unwrap();
    cm.binary_data = Some(BTreeMap::from([(
        "policy.wasm".to_string(),
        ByteString(wasm.to_vec()),
    )]));
    api.replace(name, &PostParams::default(), &cm)
        .await
        .unwrap();
}

/// A reference to `key` of ConfigMap `name`.
fn configmap_ref(name: &str, key: &str) -> PolicyRef {
    PolicyRef {
        config_map_ref: Some(ConfigMapPolicyRef {
            name: name.into(),
            key: key.into(),
        }),
        ..PolicyRef::default()
    }
}

/// Loads a scaling `spec` for an object in the test's namespace.
async fn load(
    loader: &PolicyLoader,
    env: &TestEnv,
    spec: &PolicyRef,
    reporter: &Arc<RecordingReporter>,
) -> LoadedPolicy {
    loader
        .load(
            PolicyKind::Scaling,
            env.namespace(),
            Some(spec),
            reporter.clone(),
        )
        .await
        .expect("a reference always loads, falling back to the default")
}

/// Follows the module under `policy.wasm` of ConfigMap `name`.
async fn follow(
    loader: &PolicyLoader,
    env: &TestEnv,
    name: &str,
    reporter: &Arc<RecordingReporter>,
) -> LoadedPolicy {
    load(loader, env, &configmap_ref(name, "policy.wasm"), reporter).await
}

#[tokio::test]
async fn configmap_versions_are_swapped_in_and_bad_ones_are_kept_out() {
    let env = TestEnv::new("policy-loader").await;
    let api: Api<ConfigMap> = Api::namespaced(env.client(), env.namespace());
    let buffered = wasm("buffered");
    let cooldown = wasm("cooldown");
    api.create(
        &PostParams::default(),
        &configmap("scaler", "policy.wasm", buffered),
    )
    .await
    .unwrap();

    let engine = PolicyEngine::new(EngineConfig::default()).unwrap();
    let loader = PolicyLoader::new(engine, Some(env.client()));
    let reporter = Arc::new(RecordingReporter::new());
    let spec = configmap_ref("scaler", "policy.wasm");
    let policy = load(&loader, &env, &spec, &reporter).await;
    let decider = policy.decider();

    // Create: the first version decides.
    assert!(
        reporter.wait_for(1, WAIT, loaded(&digest(buffered))).await,
        "{:?}",
        reporter.events()
    );
    assert_eq!(decider.current().module().sha256(), digest(buffered));
    let label = format!("configmap:{}/scaler", env.namespace());
    assert_eq!(decider.current().label(), label);
    let decided = decider.scaling(ScalingInput::default()).await.unwrap();
    assert_eq!(decided.policy, label);

    // Update to another good version: swapped in.
    replace(&api, "scaler", cooldown).await;
    assert!(
        reporter.wait_for(1, WAIT, loaded(&digest(cooldown))).await,
        "{:?}",
        reporter.events()
    );
    assert_eq!(decider.current().module().sha256(), digest(cooldown));
    let cooldown_decided = decider.scaling(ScalingInput::default()).await.unwrap();
    assert_eq!(cooldown_decided.policy, label);

    // Update to a bad version: refused, the last good one stays.
    replace(&api, "scaler", b"\0asm\x0d\0\x01\0 but then garbage").await;
    expect_events(&reporter, 1, load_failed("invalid-module")).await;
    assert_eq!(decider.current().module().sha256(), digest(cooldown));

    // A policy of another kind is refused too, with the kinds named.
    let exit_code = bundled::find(PolicyKind::Deregistration, "exit-code")
        .unwrap()
        .wasm;
    replace(&api, "scaler", exit_code).await;
    assert!(
        reporter.wait_for(1, WAIT, load_failed("wrong-world")).await,
        "{:?}",
        reporter.events()
    );
    let message = reporter
        .events()
        .into_iter()
        .find_map(|r| match r.event {
            PolicyEvent::LoadFailed { reason, message } if reason == "wrong-world" => Some(message),
            _ => None,
        })
        .unwrap();
    assert!(
        message.contains("deregistration policy, but a scaling policy"),
        "{message}"
    );
    assert_eq!(decider.current().module().sha256(), digest(cooldown));

    // An update that does not touch the module is not reloaded or reported.
    // A reference sees the ConfigMap's versions in order, so once a later
    // version that is reported (a bad module) has been reported, the
    // label-only update before it has been seen, and said nothing.
    replace(&api, "scaler", cooldown).await;
    expect_events(&reporter, 2, loaded(&digest(cooldown))).await;
    let before = reporter.events().len();
    let mut cm = api.get("scaler").await.unwrap();
    cm.metadata.labels = Some(BTreeMap::from([("touched".to_string(), "yes".to_string())]));
    api.replace("scaler", &PostParams::default(), &cm)
        .await
        .unwrap();
    replace(&api, "scaler", b"\0asm\x0d\0\x01\0 and other garbage").await;
    expect_events(&reporter, 2, load_failed("invalid-module")).await;
    let events = reporter.events();
    assert_eq!(events.len(), before + 1, "{events:?}");
    assert_eq!(decider.current().module().sha256(), digest(cooldown));

    // Delete: reported, and the last good version keeps deciding.
    api.delete("scaler", &DeleteParams::default())
        .await
        .unwrap();
    expect_events(&reporter, 1, load_failed("configmap-missing")).await;
    assert_eq!(decider.current().module().sha256(), digest(cooldown));
    let decided = decider.scaling(ScalingInput::default()).await.unwrap();
    assert_eq!(
        (decided.policy, decided.fallback_reason, decided.decision),
        (label, None, cooldown_decided.decision),
        "the ConfigMap's last good version answers, not the default"
    );
}

#[tokio::test]
async fn a_missing_configmap_decides_with_the_default_until_it_appears() {
    let env = TestEnv::new("policy-loader-late").await;
    let api: Api<ConfigMap> = Api::namespaced(env.client(), env.namespace());
    let engine = PolicyEngine::new(EngineConfig::default()).unwrap();
    let loader = PolicyLoader::new(engine, Some(env.client()));
    let reporter = Arc::new(RecordingReporter::new());
    let spec = PolicyRef {
        settings: Some(serde_json::json!({})),
        ..configmap_ref("later", "module")
    };
    let policy = load(&loader, &env, &spec, &reporter).await;
    expect_events(&reporter, 1, load_failed("configmap-missing")).await;
    let decided = policy
        .decider()
        .scaling(ScalingInput::default())
        .await
        .unwrap();
    assert_eq!(decided.policy, "builtin:default");

    // The module under the wrong key is named in the error.
    api.create(
        &PostParams::default(),
        &configmap("later", "policy.wasm", wasm("buffered")),
    )
    .await
    .unwrap();
    expect_events(&reporter, 1, load_failed("configmap-key-missing")).await;
    let message = format!("{:?}", reporter.events().last().unwrap());
    assert!(message.contains("it holds policy.wasm"), "{message}");

    api.delete("later", &DeleteParams::default()).await.unwrap();
    api.create(
        &PostParams::default(),
        &configmap("later", "module", wasm("buffered")),
    )
    .await
    .unwrap();
    expect_events(&reporter, 1, loaded(&digest(wasm("buffered")))).await;
    let decided = policy
        .decider()
        .scaling(ScalingInput::default())
        .await
        .unwrap();
    assert_eq!(
        decided.policy,
        format!("configmap:{}/later/module", env.namespace())
    );
}

#[tokio::test]
async fn a_pinned_digest_refuses_other_versions() {
    let env = TestEnv::new("policy-loader-pin").await;
    let api: Api<ConfigMap> = Api::namespaced(env.client(), env.namespace());
    api.create(
        &PostParams::default(),
        &configmap("pinned", "policy.wasm", wasm("cooldown")),
    )
    .await
    .unwrap();
    let engine = PolicyEngine::new(EngineConfig::default()).unwrap();
    let loader = PolicyLoader::new(engine, Some(env.client()));
    let reporter = Arc::new(RecordingReporter::new());
    let spec = PolicyRef {
        sha256: Some(digest(wasm("buffered"))),
        ..configmap_ref("pinned", "policy.wasm")
    };
    let policy = load(&loader, &env, &spec, &reporter).await;
    expect_events(&reporter, 1, load_failed("digest-mismatch")).await;
    assert_eq!(policy.decider().current().label(), "builtin:default");

    replace(&api, "pinned", wasm("buffered")).await;
    expect_events(&reporter, 1, loaded(&digest(wasm("buffered")))).await;
}

/// A scale set that names no policy gets the configured cluster-wide
/// default; one that names a policy keeps its own; a default that cannot be
/// configured is found by the start-up check, with its kind named.
#[tokio::test]
async fn configured_defaults_apply_where_the_spec_names_none() {
    let engine = PolicyEngine::new(EngineConfig::default()).unwrap();
    let defaults = DefaultPolicies::from_yaml(
        "scaling:\n  builtin: buffered\n  settings:\n    idle: 2\n  timeoutMillis: 200\n",
    )
    .unwrap();
    let loader = PolicyLoader::new(engine.clone(), None).with_defaults(defaults);
    loader.check_defaults().await.unwrap();
    let reporter = Arc::new(RecordingReporter::new());

    let unnamed = loader
        .load(PolicyKind::Scaling, "ci", None, reporter.clone())
        .await
        .unwrap();
    let current = unnamed.decider().current();
    assert_eq!(current.label(), "builtin:buffered");
    assert_eq!(current.limits().deadline, Duration::from_millis(200));
    // Kinds the file leaves out keep the bundled default.
    let deregistration = loader
        .load(PolicyKind::Deregistration, "ci", None, reporter.clone())
        .await
        .unwrap();
    assert_eq!(
        deregistration.decider().current().label(),
        "builtin:exit-code"
    );
    let named = PolicyRef {
        builtin: Some("cooldown".into()),
        ..PolicyRef::default()
    };
    let own = loader
        .load(PolicyKind::Scaling, "ci", Some(&named), reporter.clone())
        .await
        .unwrap();
    assert_eq!(own.decider().current().label(), "builtin:cooldown");

    let refused =
        DefaultPolicies::from_yaml("podValidation:\n  builtin: default\n  memoryLimitMib: 4096\n")
            .unwrap();
    let error = PolicyLoader::new(engine, None)
        .with_defaults(refused)
        .check_defaults()
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("the default pod-validation policy cannot be used"),
        "{error}"
    );
}

#[tokio::test]
async fn builtin_references_validate_their_settings() {
    let engine = PolicyEngine::new(EngineConfig::default()).unwrap();
    let loader = PolicyLoader::new(engine, None);
    let reporter = Arc::new(RecordingReporter::new());
    let spec = PolicyRef {
        builtin: Some("no-such-policy".into()),
        ..PolicyRef::default()
    };
    let policy = loader
        .load(PolicyKind::Scaling, "ci", Some(&spec), reporter.clone())
        .await
        .unwrap();
    assert_eq!(policy.decider().current().label(), "builtin:default");
    let events = reporter.events();
    assert!(
        matches!(&events[0].event, PolicyEvent::LoadFailed { reason, message } if reason == "unknown-builtin" && message.contains("buffered")),
        "{events:?}"
    );

    let spec = PolicyRef {
        builtin: Some("buffered".into()),
        timeout_millis: Some(100),
        ..PolicyRef::default()
    };
    let policy = loader
        .load(PolicyKind::Scaling, "ci", Some(&spec), reporter.clone())
        .await
        .unwrap();
    assert_eq!(policy.decider().current().label(), "builtin:buffered");
    assert_eq!(
        policy.decider().current().limits().deadline,
        Duration::from_millis(100)
    );

    // Every object asking for the same thing gets the same configured
    // policy; other settings are another policy.
    let same = loader
        .load(PolicyKind::Scaling, "other", Some(&spec), reporter.clone())
        .await
        .unwrap();
    assert!(Arc::ptr_eq(
        &policy.decider().current(),
        &same.decider().current()
    ));
    assert!(Arc::ptr_eq(
        policy.decider().fallback(),
        same.decider().fallback()
    ));
    let other = PolicyRef {
        settings: Some(serde_json::json!({ "idle": 2 })),
        ..spec.clone()
    };
    let different = loader
        .load(PolicyKind::Scaling, "ci", Some(&other), reporter.clone())
        .await
        .unwrap();
    assert!(!Arc::ptr_eq(
        &policy.decider().current(),
        &different.decider().current()
    ));
    // The default, buffered with a 100 ms deadline, and with idle 2.
    assert_eq!(loader.configured_policies(), 3);
    drop(different);
    assert_eq!(loader.configured_policies(), 2);
}

#[tokio::test]
async fn a_version_that_rejects_the_settings_is_kept_out() {
    let env = TestEnv::new("policy-loader-settings").await;
    let api: Api<ConfigMap> = Api::namespaced(env.client(), env.namespace());
    api.create(
        &PostParams::default(),
        &configmap("warm", "policy.wasm", wasm("buffered")),
    )
    .await
    .unwrap();
    let engine = PolicyEngine::new(EngineConfig::default()).unwrap();
    let loader = PolicyLoader::new(engine, Some(env.client()));
    let reporter = Arc::new(RecordingReporter::new());
    let spec = PolicyRef {
        settings: Some(serde_json::json!({ "idle": 3 })),
        ..configmap_ref("warm", "policy.wasm")
    };
    let policy = load(&loader, &env, &spec, &reporter).await;
    assert!(
        reporter
            .wait_for(1, WAIT, loaded(&digest(wasm("buffered"))))
            .await
    );

    // cooldown does not take `idle`: validated beside the running version
    // and refused, so buffered keeps deciding with its settings.
    replace(&api, "warm", wasm("cooldown")).await;
    assert!(
        reporter.wait_for(1, WAIT, load_failed("settings")).await,
        "{:?}",
        reporter.events()
    );
    assert_eq!(
        policy.decider().current().module().sha256(),
        digest(wasm("buffered"))
    );
    let decided = policy
        .decider()
        .scaling(ScalingInput {
            scale_set: arcwright::policy::types::ScaleSet {
                max_runners: 10,
                ..Default::default()
            },
            ..ScalingInput::default()
        })
        .await
        .unwrap();
    assert_eq!(decided.decision.desired, 3, "{decided:?}");
}

#[tokio::test]
async fn references_to_one_configmap_share_one_watch() {
    let env = TestEnv::new("policy-loader-shared").await;
    let api: Api<ConfigMap> = Api::namespaced(env.client(), env.namespace());
    let (buffered, cooldown) = (wasm("buffered"), wasm("cooldown"));
    for name in ["org-wide", "other"] {
        api.create(
            &PostParams::default(),
            &configmap(name, "policy.wasm", buffered),
        )
        .await
        .unwrap();
    }
    let engine = PolicyEngine::new(EngineConfig::default()).unwrap();
    let loader = PolicyLoader::new(engine.clone(), Some(env.client()));
    let reporter = Arc::new(RecordingReporter::new());
    let mut policies = Vec::new();
    for _ in 0..50 {
        let policy = follow(&loader, &env, "org-wide", &reporter).await;
        policies.push(policy);
    }
    assert_eq!(loader.configmap_watches(), 1);
    expect_events(&reporter, 50, loaded(&digest(buffered))).await;
    // Configured once and shared: the fallback and the ConfigMap's version.
    assert_eq!(loader.configured_policies(), 2);
    assert!(
        policies
            .iter()
            .all(|p| Arc::ptr_eq(&p.decider().current(), &policies[0].decider().current()))
    );

    // Another ConfigMap is another watch, gone with its last reference.
    let other = follow(&loader, &env, "other", &reporter).await;
    assert_eq!(loader.configmap_watches(), 2);
    drop(other);
    assert_eq!(loader.configmap_watches(), 1);

    // One update reaches every reference, compiled once.
    let compiled = engine.compilations();
    replace(&api, "org-wide", cooldown).await;
    expect_events(&reporter, 50, loaded(&digest(cooldown))).await;
    for policy in &policies {
        assert_eq!(
            policy.decider().current().module().sha256(),
            digest(cooldown)
        );
    }
    assert_eq!(engine.compilations(), compiled + 1);

    // The watch lives as long as one reference does.
    let last = policies.pop().unwrap();
    drop(policies);
    assert_eq!(loader.configmap_watches(), 1);
    drop(last);
    assert_eq!(loader.configmap_watches(), 0);

    // A reference made afterwards starts a fresh watch and sees the
    // ConfigMap as it is.
    let again = follow(&loader, &env, "org-wide", &reporter).await;
    assert_eq!(loader.configmap_watches(), 1);
    expect_events(&reporter, 51, loaded(&digest(cooldown))).await;
    assert_eq!(
        again.decider().current().module().sha256(),
        digest(cooldown)
    );
}

/// Holds up, while closed, the log line the slow guest writes from inside
/// `validate-settings`, the way a loaded node holds up a guest: the call
/// then overruns its deadline. Opening it lets the same bytes load.
mod gate {
    use std::sync::Once;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use tracing::field::{Field, Visit};
    use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

    /// What the slow guest logs.
    pub const MARK: &str = "validating behind the gate";

    static CLOSED: AtomicBool = AtomicBool::new(false);

    pub fn close() {
        install();
        CLOSED.store(true, Ordering::SeqCst);
    }

    pub fn open() {
        CLOSED.store(false, Ordering::SeqCst);
    }

    fn install() {
        static ONCE: Once = Once::new();
        ONCE.call_once(|| {
            tracing::subscriber::set_global_default(tracing_subscriber::registry().with(Gate))
                .expect("no other subscriber in this test binary");
        });
    }

    struct Gate;

    struct Message(bool);

    impl Visit for Message {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            if field.name() == "message" && format!("{value:?}").contains(MARK) {
                self.0 = true;
            }
        }
    }

    impl<S: tracing::Subscriber> Layer<S> for Gate {
        fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
            let mut message = Message(false);
            event.record(&mut message);
            if message.0 && CLOSED.load(Ordering::SeqCst) {
                // Ten times the guest's deadline.
                std::thread::sleep(Duration::from_millis(500));
            }
        }
    }
}

/// A scaling policy whose `validate-settings` logs [`gate::MARK`], then runs
/// a short loop (where the engine checks the deadline) and accepts. Written
/// as a core module and made a component against `wit/policy.wit`, as
/// `cargo build --target wasm32-wasip2` does for a Rust guest.
fn slow_to_validate_component() -> Vec<u8> {
    let core = format!(
        r#"(module
            (import "arcwright:policy/host@0.1.0" "log" (func $log (param i32 i32 i32)))
            (memory (export "memory") 1)
            (global $heap (mut i32) (i32.const 4096))
            (data (i32.const 1024) "{mark}")
            (func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32)
                (local $at i32)
                (local.set $at (i32.and
                    (i32.add (global.get $heap) (i32.sub (local.get 2) (i32.const 1)))
                    (i32.sub (i32.const 0) (local.get 2))))
                (global.set $heap (i32.add (local.get $at) (local.get 3)))
                (local.get $at))
            (func (export "arcwright:policy/scaling@0.1.0#validate-settings")
                (param i32 i32) (result i32)
                (local $i i32)
                (call $log (i32.const 1) (i32.const 1024) (i32.const {len}))
                (local.set $i (i32.const 100))
                (loop $spin
                    (local.set $i (i32.sub (local.get $i) (i32.const 1)))
                    (br_if $spin (local.get $i)))
                (i32.store8 (i32.const 2048) (i32.const 0))
                (i32.const 2048))
            (func (export "arcwright:policy/scaling@0.1.0#decide") (param i32) (result i32)
                unreachable))"#,
        mark = gate::MARK,
        len = gate::MARK.len(),
    );
    let mut module = wat::parse_str(core).unwrap();
    let mut resolve = wit_parser::Resolve::new();
    let wit = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../wit");
    let (package, _) = resolve.push_path(wit).unwrap();
    let world = resolve
        .select_world(&[package], Some("scaling-policy"))
        .unwrap();
    wit_component::embed_component_metadata(
        &mut module,
        &resolve,
        world,
        wit_component::StringEncoding::UTF8,
    )
    .unwrap();
    wit_component::ComponentEncoder::default()
        .validate(true)
        .module(&module)
        .unwrap()
        .encode()
        .unwrap()
}

#[tokio::test]
async fn a_version_that_failed_for_a_transient_reason_loads_once_the_reason_passes() {
    let env = TestEnv::new("policy-loader-transient").await;
    let api: Api<ConfigMap> = Api::namespaced(env.client(), env.namespace());
    let slow = slow_to_validate_component();
    let engine = PolicyEngine::new(EngineConfig::default()).unwrap();
    // The component is sound: with the gate open it loads.
    engine.load(&slow, Some(PolicyKind::Scaling)).unwrap();

    gate::close();
    api.create(
        &PostParams::default(),
        &configmap("hiccup", "policy.wasm", &slow),
    )
    .await
    .unwrap();
    let loader = PolicyLoader::new(engine, Some(env.client())).with_retry_backoff(RetryBackoff {
        first: Duration::from_millis(50),
        max: Duration::from_millis(200),
    });
    let reporter = Arc::new(RecordingReporter::new());
    let policy = follow(&loader, &env, "hiccup", &reporter).await;
    // Refused while the node is "loaded", and tried again while it is.
    expect_events(&reporter, 3, load_failed("timeout")).await;
    assert_eq!(policy.decider().current().label(), "builtin:default");

    // The same bytes load once the cause is gone, with nobody touching
    // the ConfigMap.
    gate::open();
    expect_events(&reporter, 1, loaded(&digest(&slow))).await;
    assert_eq!(policy.decider().current().module().sha256(), digest(&slow));
}
