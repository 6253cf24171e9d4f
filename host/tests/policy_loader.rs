//! The ConfigMap loader against a real API server: create, update to a good
//! version, update to a bad one, delete.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arcwright::policy::bundled;
use arcwright::policy::loader::{ConfigMapPolicyRef, PolicyLoader, PolicyRef};
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
    let spec = PolicyRef {
        config_map_ref: Some(ConfigMapPolicyRef {
            name: "scaler".into(),
            key: "policy.wasm".into(),
        }),
        ..PolicyRef::default()
    };
    let policy = loader
        .load(
            PolicyKind::Scaling,
            env.namespace(),
            Some(&spec),
            reporter.clone(),
        )
        .await
        .expect("a reference always loads, falling back to the default");
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
    let before = reporter.events().len();
    replace(&api, "scaler", cooldown).await;
    assert!(reporter.wait_for(2, WAIT, loaded(&digest(cooldown))).await);
    let mut cm = api.get("scaler").await.unwrap();
    cm.metadata.labels = Some(BTreeMap::from([("touched".to_string(), "yes".to_string())]));
    api.replace("scaler", &PostParams::default(), &cm)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        reporter.events().len(),
        before + 1,
        "{:?}",
        reporter.events()
    );

    // Delete: reported, and the last good version keeps deciding.
    api.delete("scaler", &DeleteParams::default())
        .await
        .unwrap();
    expect_events(&reporter, 1, load_failed("configmap-missing")).await;
    assert_eq!(decider.current().module().sha256(), digest(cooldown));
    assert!(decider.scaling(ScalingInput::default()).await.is_ok());
}

#[tokio::test]
async fn a_missing_configmap_decides_with_the_default_until_it_appears() {
    let env = TestEnv::new("policy-loader-late").await;
    let api: Api<ConfigMap> = Api::namespaced(env.client(), env.namespace());
    let engine = PolicyEngine::new(EngineConfig::default()).unwrap();
    let loader = PolicyLoader::new(engine, Some(env.client()));
    let reporter = Arc::new(RecordingReporter::new());
    let spec = PolicyRef {
        config_map_ref: Some(ConfigMapPolicyRef {
            name: "later".into(),
            key: "module".into(),
        }),
        settings: Some(serde_json::json!({})),
        ..PolicyRef::default()
    };
    let policy = loader
        .load(
            PolicyKind::Scaling,
            env.namespace(),
            Some(&spec),
            reporter.clone(),
        )
        .await
        .expect("a reference always loads, falling back to the default");
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
        config_map_ref: Some(ConfigMapPolicyRef {
            name: "pinned".into(),
            key: "policy.wasm".into(),
        }),
        sha256: Some(digest(wasm("buffered"))),
        ..PolicyRef::default()
    };
    let policy = loader
        .load(
            PolicyKind::Scaling,
            env.namespace(),
            Some(&spec),
            reporter.clone(),
        )
        .await
        .expect("a reference always loads, falling back to the default");
    expect_events(&reporter, 1, load_failed("digest-mismatch")).await;
    assert_eq!(policy.decider().current().label(), "builtin:default");

    replace(&api, "pinned", wasm("buffered")).await;
    expect_events(&reporter, 1, loaded(&digest(wasm("buffered")))).await;
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
        config_map_ref: Some(ConfigMapPolicyRef {
            name: "warm".into(),
            key: "policy.wasm".into(),
        }),
        settings: Some(serde_json::json!({ "idle": 3 })),
        ..PolicyRef::default()
    };
    let policy = loader
        .load(
            PolicyKind::Scaling,
            env.namespace(),
            Some(&spec),
            reporter.clone(),
        )
        .await
        .expect("a reference always loads, falling back to the default");
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
