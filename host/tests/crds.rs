//! The generated CRDs against the real API server: the committed YAML is
//! accepted, an object of each kind round-trips unchanged (the full pod
//! template included, with the forms Kubernetes accepts for quantities and
//! ports), and the validation the server enforces refuses what it should.

mod common;

use arcwright::api::autoscaling_runner_set::MAX_NAME;
use arcwright::api::{
    AutoscalingRunnerSet, AutoscalingRunnerSetPhase, AutoscalingRunnerSetSpec,
    AutoscalingRunnerSetStatus, EphemeralRunner, EphemeralRunnerPhase, EphemeralRunnerSet,
    EphemeralRunnerSetSpec, EphemeralRunnerSpec, EphemeralRunnerStatus,
};
use arcwright_harness::TestEnv;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

async fn install_crds(client: kube::Client) {
    assert_eq!(common::install_crds(client).await, 3, "one file per kind");
}

/// A runner pod template using what real templates use: int and string
/// quantities, a named and a numbered port in probes, volumes, security
/// context.
fn template() -> serde_json::Value {
    json!({
        "metadata": {"labels": {"team": "ci"}, "annotations": {"a": "b"}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{
                "name": "runner",
                "image": "ghcr.io/actions/actions-runner:latest",
                "command": ["/home/runner/run.sh"],
                "env": [{"name": "X", "value": "1"}],
                "resources": {
                    "limits": {"cpu": 2, "memory": "4Gi"},
                    "requests": {"cpu": "500m", "memory": 1073741824}
                },
                "ports": [{"containerPort": 8080, "name": "http"}],
                "livenessProbe": {"httpGet": {"path": "/", "port": "http"}},
                "readinessProbe": {"tcpSocket": {"port": 8080}},
                "volumeMounts": [{"name": "work", "mountPath": "/home/runner/_work"}],
                "securityContext": {"runAsNonRoot": true, "runAsUser": 1001}
            }],
            "volumes": [{"name": "work", "emptyDir": {"sizeLimit": "10Gi"}}],
            "tolerations": [{"key": "ci", "operator": "Exists", "effect": "NoSchedule"}]
        }
    })
}

fn ars_spec(min: Option<i32>, max: Option<i32>, url: &str) -> serde_json::Value {
    let mut spec = json!({
        "githubConfigUrl": url,
        "githubConfigSecret": "github-auth",
        "runnerGroup": "linux",
        "runnerScaleSetName": "linux-x64",
        "proxy": {"https": {"url": "http://proxy:3128", "credentialSecretRef": "proxy-auth"}, "noProxy": ["example.com"]},
        "githubServerTLS": {"certificateFrom": {"configMapKeyRef": {"name": "ca", "key": "ca.crt"}}},
        "template": template(),
        "scalingPolicy": {"builtin": "buffered", "settings": {"idle": 2}},
        "deregistrationPolicy": {"configMapRef": {"name": "dereg", "key": "policy.wasm"}, "sha256": "ab", "timeoutMillis": 100},
        "podValidationPolicy": {"builtin": "default", "memoryLimitMib": 8},
    });
    if let Some(min) = min {
        spec["minRunners"] = min.into();
    }
    if let Some(max) = max {
        spec["maxRunners"] = max.into();
    }
    spec
}

#[tokio::test]
async fn every_kind_round_trips_through_the_api_server() {
    let env = TestEnv::new("crd-round-trip").await;
    install_crds(env.client()).await;
    let ns = env.namespace();

    let ars_api: Api<AutoscalingRunnerSet> = Api::namespaced(env.client(), ns);
    let spec: AutoscalingRunnerSetSpec =
        serde_json::from_value(ars_spec(Some(1), Some(5), "https://github.com/octo-org")).unwrap();
    // Sent as raw JSON, so the server sees `cpu: 2` and `memory: 1073741824`
    // as numbers, as a user's manifest would have them.
    let object = json!({
        "apiVersion": "arcwright.dev/v1alpha1",
        "kind": "AutoscalingRunnerSet",
        "metadata": {"name": "linux"},
        "spec": ars_spec(Some(1), Some(5), "https://github.com/octo-org"),
    });
    let created = ars_api
        .patch(
            "linux",
            &PatchParams::apply("arcwright-crd-test"),
            &Patch::Apply(object),
        )
        .await
        .expect("numeric quantities and named ports are accepted");
    assert_eq!(
        created.spec, spec,
        "the server keeps every field, the template included"
    );
    let status = AutoscalingRunnerSetStatus {
        current_runners: 3,
        phase: Some(AutoscalingRunnerSetPhase::Running),
        pending_ephemeral_runners: 1,
        running_ephemeral_runners: 2,
        ..Default::default()
    };
    let patched = ars_api
        .patch_status(
            "linux",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        )
        .await
        .unwrap();
    assert_eq!(patched.status, Some(status));

    let runner_spec: EphemeralRunnerSpec = serde_json::from_value(json!({
        "githubConfigUrl": "https://github.com/octo-org/app",
        "githubConfigSecret": "github-auth",
        "runnerScaleSetId": 7,
        "deregistrationPolicy": {"builtin": "exit-code"},
        "metadata": template()["metadata"].clone(),
        "spec": template()["spec"].clone(),
    }))
    .unwrap();

    let ers_api: Api<EphemeralRunnerSet> = Api::namespaced(env.client(), ns);
    let ers_spec = EphemeralRunnerSetSpec {
        replicas: 3,
        patch_id: 12,
        actionable_revision: 2,
        ephemeral_runner_spec: runner_spec.clone(),
        ephemeral_runner_metadata: None,
    };
    let created = ers_api
        .create(
            &PostParams::default(),
            &EphemeralRunnerSet::new("linux", ers_spec.clone()),
        )
        .await
        .unwrap();
    assert_eq!(created.spec, ers_spec);
    let patched = ers_api
        .patch_status(
            "linux",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"appliedActionableRevision": 2, "phase": "Outdated"}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.status.unwrap().applied_actionable_revision, 2);

    let er_api: Api<EphemeralRunner> = Api::namespaced(env.client(), ns);
    let created = er_api
        .create(
            &PostParams::default(),
            &EphemeralRunner::new("linux-runner-abcde", runner_spec.clone()),
        )
        .await
        .unwrap();
    assert_eq!(created.spec, runner_spec);
    let status: EphemeralRunnerStatus = serde_json::from_value(json!({
        "phase": "Running", "ready": true, "runnerId": 42, "runnerName": "linux-runner-abcde",
        "failures": {"uid-1": "2026-01-01T00:00:00Z"},
        "jobRequestId": 9, "jobId": "j-1", "jobRepositoryName": "octo-org/app",
        "jobWorkflowRef": "octo-org/app/.github/workflows/ci.yml@refs/heads/main",
        "workflowRunId": 77, "jobDisplayName": "build",
        "conditions": [{"type": "Registered", "status": "True", "reason": "JitConfigCreated",
                        "message": "registered", "lastTransitionTime": "2026-01-01T00:00:00Z"}]
    }))
    .unwrap();
    let patched = er_api
        .patch_status(
            "linux-runner-abcde",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        )
        .await
        .unwrap();
    let back = patched.status.unwrap();
    assert_eq!(back, status);
    assert_eq!(back.phase, Some(EphemeralRunnerPhase::Running));
    assert!(back.has_job());
}

#[tokio::test]
async fn the_api_server_refuses_what_the_schema_forbids() {
    let env = TestEnv::new("crd-validation").await;
    install_crds(env.client()).await;
    let api: Api<AutoscalingRunnerSet> = Api::namespaced(env.client(), env.namespace());
    // Sent as raw JSON: some of these cannot even be built with the types.
    let refused = |spec: serde_json::Value| {
        let api = api.clone();
        async move {
            let object = json!({
                "apiVersion": "arcwright.dev/v1alpha1",
                "kind": "AutoscalingRunnerSet",
                "metadata": {"name": "bad"},
                "spec": spec,
            });
            match api
                .patch(
                    "bad",
                    &PatchParams::apply("arcwright-crd-test"),
                    &Patch::Apply(object),
                )
                .await
            {
                Err(kube::Error::Api(e)) => {
                    assert_eq!(e.code, 422, "{e:?}");
                    e.message
                }
                other => panic!("expected a refusal, got {other:?}"),
            }
        }
    };
    let message = refused(ars_spec(Some(5), Some(2), "https://github.com/octo-org")).await;
    assert!(
        message.contains("minRunners must not be greater than maxRunners"),
        "{message}"
    );
    let message = refused(ars_spec(None, Some(-1), "https://github.com/octo-org")).await;
    assert!(message.contains("maxRunners"), "{message}");
    let message = refused(ars_spec(None, None, "github.com/octo-org")).await;
    assert!(message.contains("githubConfigUrl"), "{message}");
    let message = refused(ars_spec(None, None, "https://github.com/a/b/c/d")).await;
    assert!(message.contains("githubConfigUrl"), "{message}");
    let mut bad_template = ars_spec(None, None, "https://github.com/octo-org");
    bad_template["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] =
        json!({"not": "a quantity"});
    let message = refused(bad_template).await;
    assert!(message.contains("cpu"), "{message}");

    // Equal bounds and omitted bounds are fine.
    let bounds = [
        (Some(2), Some(2)),
        (None, Some(3)),
        (Some(1), None),
        (None, None),
    ];
    for (i, (min, max)) in bounds.into_iter().enumerate() {
        let spec: AutoscalingRunnerSetSpec =
            serde_json::from_value(ars_spec(min, max, "https://ghes.example.com/enterprises/e"))
                .unwrap();
        let name = format!("ok-{i}");
        api.create(
            &PostParams::default(),
            &AutoscalingRunnerSet::new(&name, spec),
        )
        .await
        .unwrap_or_else(|e| panic!("{min:?}..{max:?} accepted: {e}"));
    }

    // A name whose runners' names would not fit a label value is refused;
    // the longest that fits is accepted.
    let spec: AutoscalingRunnerSetSpec =
        serde_json::from_value(ars_spec(None, None, "https://github.com/octo-org")).unwrap();
    let too_long = "a".repeat(MAX_NAME + 1);
    match api
        .create(
            &PostParams::default(),
            &AutoscalingRunnerSet::new(&too_long, spec.clone()),
        )
        .await
    {
        Err(kube::Error::Api(e)) => {
            assert_eq!(e.code, 422, "{e:?}");
            assert!(
                e.message
                    .contains(&format!("at most {MAX_NAME} characters")),
                "{}",
                e.message
            );
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let longest = "b".repeat(MAX_NAME);
    api.create(
        &PostParams::default(),
        &AutoscalingRunnerSet::new(&longest, spec),
    )
    .await
    .expect("the longest name that fits is accepted");
}

/// `crds/` is exactly what the Rust types generate: no file stale, missing or
/// left over. `cargo xtask crds --check` runs this test, so the check shares
/// the workspace's test build instead of compiling the controller once more
/// with another feature set.
#[test]
fn the_committed_crds_are_the_ones_the_types_generate() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../crds");
    let files = arcwright::api::crd_files().expect("the CRDs render");
    let mut problems = Vec::new();
    for (name, body) in &files {
        match std::fs::read_to_string(dir.join(name)) {
            Ok(current) if current == *body => {}
            Ok(_) => problems.push(format!("crds/{name} is stale")),
            Err(_) => problems.push(format!("crds/{name} is missing")),
        }
    }
    for entry in std::fs::read_dir(&dir).expect("crds/ exists").flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".yaml") && !files.iter().any(|(generated, _)| *generated == name) {
            problems.push(format!(
                "crds/{name} is not generated from the types any more"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "{}; run `cargo xtask crds` and commit crds/",
        problems.join("; ")
    );
}
