//! `arcwright migrate` on AutoscalingRunnerSets as ARC's chart renders them
//! (one per container mode, under `tests/arc/sets`): the manifests it prints
//! are accepted by a real API server with arcwright's CRDs, the chart values
//! it prints render through the scale-set chart to ARC's very runner pod,
//! and what does not carry over is named.

mod common;
mod helm;

use std::path::PathBuf;
use std::process::Command;

use arcwright::api::AutoscalingRunnerSet;
use arcwright_harness::TestEnv;
use helm::{documents, helm, scale_set_chart};
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};

fn fixture(name: &str) -> PathBuf {
    helm::repo()
        .join("host/tests/arc/sets")
        .join(format!("{name}.yaml"))
}

/// `arcwright migrate ARGS`: (exit success, stdout, stderr).
fn migrate(args: &[&str]) -> (bool, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_arcwright"))
        .arg("migrate")
        .args(args)
        .output()
        .expect("running arcwright migrate");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn arc_template(name: &str) -> Value {
    let text = std::fs::read_to_string(fixture(name)).unwrap();
    let arc: Value = serde_yaml::from_str(&text).unwrap();
    arc["spec"]["template"].clone()
}

#[tokio::test]
async fn migrated_manifests_of_every_mode_are_accepted_by_the_api_server() {
    let env = TestEnv::new("migrate").await;
    common::install_crds(env.client()).await;
    let sets: Api<AutoscalingRunnerSet> = Api::namespaced(env.client(), env.namespace());
    for mode in ["default", "dind", "kubernetes", "kubernetes-novolume"] {
        let file = fixture(mode);
        let (ok, out, err) = migrate(&[file.to_str().unwrap()]);
        assert!(ok, "{mode}: {err}");
        let docs = documents(&out);
        assert_eq!(docs.len(), 1, "{mode}: {out}");
        let mut set: AutoscalingRunnerSet = serde_json::from_value(docs[0].clone())
            .unwrap_or_else(|e| panic!("{mode}: {e}\n{out}"));
        // As it would be applied: the CRD's schema and rules judge it.
        set.metadata.namespace = Some(env.namespace().to_owned());
        sets.create(
            &PostParams {
                dry_run: true,
                ..Default::default()
            },
            &set,
        )
        .await
        .unwrap_or_else(|e| panic!("{mode}: the API server refused the manifest: {e}\n{out}"));
        // The runner pod is ARC's, field for field.
        assert_eq!(
            serde_json::to_value(&set.spec.template).unwrap(),
            arc_template(mode),
            "{mode}"
        );
        // What did not carry over is named, in the output and on stderr.
        assert!(
            out.starts_with("# From ARC's AutoscalingRunnerSet arc-runners/"),
            "{out}"
        );
        assert!(err.contains("is made by ARC's chart"), "{mode}: {err}");
    }

    let (_, out, err) = migrate(&[fixture("default").to_str().unwrap()]);
    let set: Value = documents(&out).remove(0);
    assert_eq!(
        set["metadata"]["labels"],
        json!({"team": "platform"}),
        "ARC's and Helm's labels left"
    );
    assert!(set["metadata"].get("annotations").is_none(), "{set}");
    assert!(set["spec"].get("listenerTemplate").is_none(), "{set}");
    for says in [
        "spec.listenerTemplate is not carried over",
        "runner-scale-set-id annotation is not carried over: arcwright finds the scale set by its name (arc-runner-set)",
    ] {
        assert!(err.contains(says), "{says} in {err}");
    }
    // dind: the privileged sidecar is allowed explicitly.
    let (_, out, err) = migrate(&[fixture("dind").to_str().unwrap()]);
    let set: Value = documents(&out).remove(0);
    assert_eq!(
        set["spec"]["podValidationPolicy"],
        json!({"builtin": "default", "settings": {"allowPrivileged": true}})
    );
    assert!(err.contains("privileged container"), "{err}");
}

#[test]
fn migrated_values_render_through_the_chart_to_arcs_runner_pod() {
    for (mode, account) in [
        ("default", "arc-runner-set-no-permission"),
        ("dind", "dind-runners-no-permission"),
        ("kubernetes", "k8s-runners-kube-mode"),
        ("kubernetes-novolume", "novolume-runners-kube-mode"),
    ] {
        let file = fixture(mode);
        let (ok, out, err) = migrate(&["--values", file.to_str().unwrap()]);
        assert!(ok, "{mode}: {err}");
        assert!(out.contains("# helm install "), "{out}");
        let dir = tempfile::tempdir().unwrap();
        let values = dir.path().join("values.yaml");
        std::fs::write(&values, &out).unwrap();
        let rendered = helm(&[
            "template",
            "release",
            scale_set_chart().to_str().unwrap(),
            "--namespace",
            "arc-runners",
            "-f",
            values.to_str().unwrap(),
        ])
        .unwrap_or_else(|e| panic!("{mode}: the chart refused the values: {e}\n{out}"));
        let objects = documents(&rendered);
        let set = objects
            .iter()
            .find(|o| o["kind"] == "AutoscalingRunnerSet")
            .unwrap();
        let pod = &set["spec"]["template"]["spec"];
        let arc = arc_template(mode);
        // The mode is named again, and its merge adds nothing the template
        // ARC expanded already has.
        for key in ["containers", "initContainers", "volumes"] {
            assert_eq!(pod.get(key), arc["spec"].get(key), "{mode}: {key}");
        }
        // ARC's account goes with ARC's release; the chart makes its own.
        assert_eq!(pod["serviceAccountName"], account, "{mode}");
        assert!(
            objects
                .iter()
                .any(|o| o["kind"] == "ServiceAccount" && o["metadata"]["name"] == account),
            "{mode}"
        );
        let has_role = objects.iter().any(|o| o["kind"] == "Role");
        assert_eq!(has_role, mode.starts_with("kubernetes"), "{mode}");
    }
}

#[test]
fn other_kinds_are_skipped_and_nothing_to_migrate_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let mixed = dir.path().join("mixed.yaml");
    let default = std::fs::read_to_string(fixture("default")).unwrap();
    let dind = std::fs::read_to_string(fixture("dind")).unwrap();
    std::fs::write(
        &mixed,
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: x}}\n---\n{default}\n---\n{dind}"
        ),
    )
    .unwrap();
    let (ok, out, _) = migrate(&[mixed.to_str().unwrap()]);
    assert!(ok);
    let names: Vec<Value> = documents(&out)
        .iter()
        .map(|d| d["metadata"]["name"].clone())
        .collect();
    assert_eq!(names, [json!("arc-runner-set"), json!("dind-runners")]);

    let none = dir.path().join("none.yaml");
    std::fs::write(
        &none,
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
    )
    .unwrap();
    let (ok, _, err) = migrate(&[none.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("no ARC AutoscalingRunnerSet"), "{err}");
    let (ok, _, err) = migrate(&[]);
    assert!(!ok, "a file or --from-cluster is needed");
    assert!(
        err.contains("--from-cluster") || err.contains("FILES"),
        "{err}"
    );
}

/// `--from-cluster` reads ARC's objects where ARC keeps them. ARC's CRD is
/// not vendored here: a stand-in with the same group, version and names and
/// an open schema is enough to hold the fixtures as ARC's chart made them.
#[tokio::test]
async fn from_cluster_reads_arcs_sets_in_the_namespace_named() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};

    let env = TestEnv::new("migrate-cluster").await;
    let crds: Api<CustomResourceDefinition> = Api::all(env.client());
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "autoscalingrunnersets.actions.github.com"},
        "spec": {
            "group": "actions.github.com",
            "scope": "Namespaced",
            "names": {
                "kind": "AutoscalingRunnerSet",
                "plural": "autoscalingrunnersets",
                "singular": "autoscalingrunnerset",
                "listKind": "AutoscalingRunnerSetList"
            },
            "versions": [{
                "name": "v1alpha1",
                "served": true,
                "storage": true,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "x-kubernetes-preserve-unknown-fields": true
                }}
            }]
        }
    }))
    .unwrap();
    let name = common::apply_crd(env.client(), &crd).await;
    common::established(&crds, &name).await;

    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "actions.github.com",
        "v1alpha1",
        "AutoscalingRunnerSet",
    ));
    let arc: Api<DynamicObject> = Api::namespaced_with(env.client(), env.namespace(), &resource);
    for mode in ["default", "dind"] {
        let text = std::fs::read_to_string(fixture(mode)).unwrap();
        let mut object: DynamicObject = serde_yaml::from_str(&text).unwrap();
        object.metadata.namespace = Some(env.namespace().to_owned());
        arc.create(&PostParams::default(), &object).await.unwrap();
    }

    let output = Command::new(env!("CARGO_BIN_EXE_arcwright"))
        .args(["migrate", "--from-cluster", "-n", env.namespace()])
        .env("KUBECONFIG", env.control_plane().kubeconfig_path())
        .output()
        .unwrap();
    let (out, err) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert!(output.status.success(), "{err}");
    let docs = documents(&out);
    let mut names: Vec<&str> = docs
        .iter()
        .map(|d| d["metadata"]["name"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["arc-runner-set", "dind-runners"], "{out}");
    for doc in &docs {
        assert_eq!(doc["apiVersion"], "arcwright.dev/v1alpha1", "{doc}");
        assert!(
            doc["metadata"].get("managedFields").is_none()
                && doc["metadata"].get("uid").is_none()
                && doc["metadata"].get("resourceVersion").is_none(),
            "the server's bookkeeping is not carried over: {doc}"
        );
    }
    let dind = docs
        .iter()
        .find(|d| d["metadata"]["name"] == "dind-runners")
        .unwrap();
    assert_eq!(dind["spec"]["template"], arc_template("dind"));
}
