//! Moving a scale set from ARC: an ARC `AutoscalingRunnerSet`
//! (`actions.github.com/v1alpha1`) turned into arcwright's, as a manifest or
//! as the scale-set chart's values, with every field that does not carry
//! over named and why (`arcwright migrate`).
//!
//! Pure: the command reads the objects (files, or the cluster) and prints
//! what this returns. The conversion keeps the scale set's name and runner
//! group, which is what the cut-over rests on: arcwright finds the scale
//! set ARC registered by that name and adopts it, so runners keep their
//! `runs-on` and the service keeps its queue (docs/migrating.md).
//!
//! ARC's chart has already expanded its container mode into the template,
//! so the template carries over as it is. For chart values the mode is
//! named again (`containerMode`), which makes the chart create what ARC's
//! chart made beside the template (the hooks' ServiceAccount and Role, the
//! pod-validation setting for dind), and the chart's merge adds nothing
//! the template already has: an init container or volume of the mode's
//! that the template names stays where ARC's chart put it.

use serde_json::{Map, Value, json};

/// ARC's group and version.
pub const ARC_API_VERSION: &str = "actions.github.com/v1alpha1";

/// One ARC set, converted.
#[derive(Clone, Debug, PartialEq)]
pub struct Migrated {
    /// The set's namespace, when the ARC object had one.
    pub namespace: Option<String>,
    /// Its name.
    pub name: String,
    /// The arcwright AutoscalingRunnerSet.
    pub manifest: Value,
    /// The arcwright-scale-set chart's values for the same set.
    pub values: Value,
    /// What did not carry over, or was set on the way, one sentence each.
    pub notes: Vec<String>,
}

/// Why an object is not converted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MigrateError {
    /// Not an ARC AutoscalingRunnerSet.
    #[error(
        "not an ARC AutoscalingRunnerSet ({ARC_API_VERSION}): apiVersion {api_version:?}, kind {kind:?}"
    )]
    NotArc {
        /// What the object says.
        api_version: String,
        /// Its kind.
        kind: String,
    },
    /// A field it needs is missing.
    #[error("the AutoscalingRunnerSet {name:?} has no {field}")]
    Missing {
        /// The object's name.
        name: String,
        /// The field.
        field: &'static str,
    },
}

/// Spec fields that mean the same in arcwright, copied as they are.
const CARRIED: &[&str] = &[
    "githubConfigUrl",
    "githubConfigSecret",
    "runnerGroup",
    "runnerScaleSetName",
    "runnerScaleSetLabels",
    "proxy",
    "githubServerTLS",
    "template",
    "minRunners",
    "maxRunners",
    "listenerMetrics",
    "ephemeralRunnerSetMetadata",
    "ephemeralRunnerMetadata",
    "ephemeralRunnerConfigSecretMetadata",
];

/// Spec fields with no meaning in arcwright, and what to do instead.
const DROPPED: &[(&str, &str)] = &[
    (
        "listenerTemplate",
        "arcwright runs no listener pod (listeners run in the controller); set the controller's resources and placement in the arcwright chart",
    ),
    (
        "vaultConfig",
        "Azure Key Vault is not supported: put the credentials in a Secret and name it in githubConfigSecret (the External Secrets Operator or the Secrets Store CSI driver can sync one from Key Vault)",
    ),
    (
        "autoscalingListener",
        "arcwright makes no AutoscalingListener",
    ),
    (
        "listenerServiceAccountMetadata",
        "arcwright makes no listener ServiceAccount",
    ),
    ("listenerRoleMetadata", "arcwright makes no listener Role"),
    (
        "listenerRoleBindingMetadata",
        "arcwright makes no listener RoleBinding",
    ),
    (
        "listenerConfigSecretMetadata",
        "arcwright makes no listener config Secret",
    ),
];

/// Label and annotation prefixes of ARC's and Helm's own, not the user's.
const FOREIGN_PREFIXES: &[&str] = &[
    "actions.github.com/",
    "app.kubernetes.io/",
    "helm.sh/",
    "meta.helm.sh/",
    "kubectl.kubernetes.io/",
];

/// ARC's chart's runner ServiceAccounts: `<fullname>-gha-rs-no-permission`
/// and `-gha-rs-kube-mode`, deleted with ARC's release.
const ARC_ACCOUNT_SUFFIXES: &[&str] = &["-gha-rs-no-permission", "-gha-rs-kube-mode"];

/// Converts one ARC AutoscalingRunnerSet.
pub fn migrate(arc: &Value) -> Result<Migrated, MigrateError> {
    let api_version = arc["apiVersion"].as_str().unwrap_or_default();
    let kind = arc["kind"].as_str().unwrap_or_default();
    if api_version != ARC_API_VERSION || kind != "AutoscalingRunnerSet" {
        return Err(MigrateError::NotArc {
            api_version: api_version.to_owned(),
            kind: kind.to_owned(),
        });
    }
    let name = arc["metadata"]["name"]
        .as_str()
        .ok_or(MigrateError::Missing {
            name: String::new(),
            field: "metadata.name",
        })?
        .to_owned();
    let missing = |field| MigrateError::Missing {
        name: name.clone(),
        field,
    };
    let namespace = arc["metadata"]["namespace"].as_str().map(str::to_owned);
    let empty = Map::new();
    let arc_spec = arc["spec"].as_object().unwrap_or(&empty);
    for (key, field) in [
        ("githubConfigUrl", "spec.githubConfigUrl"),
        ("githubConfigSecret", "spec.githubConfigSecret"),
        ("template", "spec.template"),
    ] {
        if !arc_spec.contains_key(key) {
            return Err(missing(field));
        }
    }
    let mut notes = Vec::new();
    let mut spec = Map::new();
    for (key, value) in arc_spec {
        if CARRIED.contains(&key.as_str()) {
            spec.insert(key.clone(), value.clone());
        } else if let Some((_, why)) = DROPPED.iter().find(|(field, _)| field == key) {
            notes.push(format!("spec.{key} is not carried over: {why}"));
        } else {
            notes.push(format!(
                "spec.{key} is not carried over: arcwright has no such field"
            ));
        }
    }
    if arc_spec.contains_key("vaultConfig") {
        notes.push(
            "githubConfigSecret names a Key Vault entry under ARC's vaultConfig: it must name a Kubernetes Secret before the set can work".to_owned(),
        );
    }

    if let Some(secret) = spec
        .get("githubConfigSecret")
        .and_then(Value::as_str)
        .filter(|secret| secret.ends_with("-gha-rs-github-secret"))
    {
        notes.push(format!(
            "githubConfigSecret {secret} is made by ARC's chart and goes with its release: copy it under a name of your own and name that (arcwright holds the Secret it names with a finalizer, so an uninstall of ARC's release would leave it terminating until the set lets go)"
        ));
    }
    // The runner pod's account, if ARC's chart made it.
    let mut template = spec["template"].clone();
    let arc_account = template["spec"]["serviceAccountName"]
        .as_str()
        .filter(|account| ARC_ACCOUNT_SUFFIXES.iter().any(|s| account.ends_with(s)))
        .map(str::to_owned);
    if let Some(account) = &arc_account {
        notes.push(format!(
            "template.spec.serviceAccountName {account} is made by ARC's chart and goes with its release: the manifest keeps it, so create it (or one of your own) before uninstalling ARC; the chart values leave it out, and the chart makes its own"
        ));
    }
    let mode = container_mode(&template);
    if privileged(&template) && !spec.contains_key("podValidationPolicy") {
        let policy = json!({"builtin": "default", "settings": {"allowPrivileged": true}});
        spec.insert("podValidationPolicy".to_owned(), policy);
        notes.push(
            "the template runs a privileged container (dind's sidecar): podValidationPolicy is set to the bundled default with allowPrivileged: true, which arcwright otherwise refuses".to_owned(),
        );
    }

    let mut metadata = Map::new();
    metadata.insert("name".to_owned(), json!(name));
    if let Some(namespace) = &namespace {
        metadata.insert("namespace".to_owned(), json!(namespace));
    }
    let labels = own(&arc["metadata"]["labels"]);
    if !labels.is_empty() {
        metadata.insert("labels".to_owned(), Value::Object(labels.clone()));
    }
    let annotations = own(&arc["metadata"]["annotations"]);
    if !annotations.is_empty() {
        metadata.insert("annotations".to_owned(), Value::Object(annotations.clone()));
    }
    if arc["metadata"]["annotations"]["runner-scale-set-id"].is_string() {
        notes.push(format!(
            "the runner-scale-set-id annotation is not carried over: arcwright finds the scale set by its name ({}) in its runner group and adopts it",
            spec.get("runnerScaleSetName").and_then(Value::as_str).unwrap_or(&name)
        ));
    }
    let manifest = json!({
        "apiVersion": "arcwright.dev/v1alpha1",
        "kind": "AutoscalingRunnerSet",
        "metadata": metadata,
        "spec": spec,
    });

    // The chart's values: its own names for the same things.
    if arc_account.is_some()
        && let Some(pod) = template["spec"].as_object_mut()
    {
        pod.remove("serviceAccountName");
    }
    let mut values = Map::new();
    let scale_set_name = spec
        .get("runnerScaleSetName")
        .cloned()
        .unwrap_or_else(|| json!(name));
    values.insert("runnerScaleSetName".to_owned(), scale_set_name);
    for (ours, theirs) in [
        ("githubConfigUrl", "githubConfigUrl"),
        ("githubConfigSecret", "githubConfigSecret"),
        ("runnerGroup", "runnerGroup"),
        ("scaleSetLabels", "runnerScaleSetLabels"),
        ("minRunners", "minRunners"),
        ("maxRunners", "maxRunners"),
        ("proxy", "proxy"),
        ("githubServerTLS", "githubServerTLS"),
        ("listenerMetrics", "listenerMetrics"),
        ("podValidationPolicy", "podValidationPolicy"),
    ] {
        if let Some(value) = spec.get(theirs) {
            values.insert(ours.to_owned(), value.clone());
        }
    }
    if mode == Some("dind") && sidecar_to_init_container(&mut template) {
        notes.push(
            "the template runs dind as a container (ARC's chart before Kubernetes 1.29): the chart values make it an init container with restartPolicy: Always (a native sidecar), where the chart's dind mode runs it, its settings kept".to_owned(),
        );
    }
    values.insert("template".to_owned(), template);
    if let Some(mode) = mode {
        values.insert("containerMode".to_owned(), json!({"type": mode}));
    }
    let mut resource_meta = Map::new();
    for (ours, theirs) in [
        ("ephemeralRunnerSet", "ephemeralRunnerSetMetadata"),
        ("ephemeralRunner", "ephemeralRunnerMetadata"),
        (
            "ephemeralRunnerConfigSecret",
            "ephemeralRunnerConfigSecretMetadata",
        ),
    ] {
        if let Some(value) = spec.get(theirs) {
            resource_meta.insert(ours.to_owned(), value.clone());
        }
    }
    if !resource_meta.is_empty() {
        values.insert("resourceMeta".to_owned(), Value::Object(resource_meta));
    }
    if !labels.is_empty() {
        values.insert("labels".to_owned(), Value::Object(labels));
    }
    if !annotations.is_empty() {
        values.insert("annotations".to_owned(), Value::Object(annotations));
    }
    Ok(Migrated {
        namespace,
        name,
        manifest,
        values: Value::Object(values),
        notes,
    })
}

/// The labels or annotations that are the user's, not ARC's or Helm's.
fn own(map: &Value) -> Map<String, Value> {
    map.as_object()
        .map(|map| {
            map.iter()
                .filter(|(key, _)| {
                    key.as_str() != "runner-scale-set-id"
                        && !FOREIGN_PREFIXES.iter().any(|p| key.starts_with(p))
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// The container mode ARC's chart expanded into `template`, told from what
/// it left: the hooks' variable on the runner container (kubernetes, or
/// kubernetes-novolume by the hooks' path), or a container named `dind`.
fn container_mode(template: &Value) -> Option<&'static str> {
    let spec = &template["spec"];
    let containers = |key: &str| spec[key].as_array().cloned().unwrap_or_default();
    let all: Vec<Value> = [containers("initContainers"), containers("containers")].concat();
    let runner = all.iter().find(|c| c["name"] == "runner");
    let hooks = runner
        .and_then(|r| r["env"].as_array())
        .and_then(|env| {
            env.iter()
                .find(|e| e["name"] == "ACTIONS_RUNNER_CONTAINER_HOOKS")
        })
        .map(|e| e["value"].as_str().unwrap_or_default().to_owned());
    match hooks {
        Some(path) if path.contains("k8s-novolume") => Some("kubernetes-novolume"),
        Some(_) => Some("kubernetes"),
        None if all.iter().any(|c| c["name"] == "dind") => Some("dind"),
        None => None,
    }
}

/// Moves the `dind` container of `template` (where ARC's chart ran the
/// sidecar before Kubernetes 1.29) to its init containers as a native
/// sidecar, since the chart's dind mode drops a `dind` container as ARC's
/// does and runs the template's `dind` init container in its sidecar's
/// place. Whether there was one.
fn sidecar_to_init_container(template: &mut Value) -> bool {
    let Some(spec) = template["spec"].as_object_mut() else {
        return false;
    };
    let Some(containers) = spec.get_mut("containers").and_then(Value::as_array_mut) else {
        return false;
    };
    let Some(at) = containers.iter().position(|c| c["name"] == "dind") else {
        return false;
    };
    let mut dind = containers.remove(at);
    dind["restartPolicy"] = json!("Always");
    let init = spec.entry("initContainers").or_insert_with(|| json!([]));
    if let Some(init) = init.as_array_mut() {
        init.push(dind);
    }
    true
}

/// Whether any container of `template` is privileged.
fn privileged(template: &Value) -> bool {
    ["initContainers", "containers"].iter().any(|key| {
        template["spec"][key]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["securityContext"]["privileged"] == true)
    })
}

/// `migrated` as YAML: a comment naming what did not carry over, then the
/// document (the manifest, or the chart's values with how to install them).
pub fn render(migrated: &Migrated, values: bool) -> String {
    let mut out = String::new();
    let namespace = migrated.namespace.as_deref().unwrap_or("default");
    out.push_str(&format!(
        "# From ARC's AutoscalingRunnerSet {namespace}/{}.\n",
        migrated.name
    ));
    if values {
        out.push_str(&format!(
            "# helm install {}-arcwright charts/arcwright-scale-set --namespace {namespace} -f <this file>\n\
             # (a release name of its own, since ARC's stays installed until the cut-over; \
             runnerScaleSetName keeps the scale set's name and the objects' names)\n",
            migrated.name
        ));
    }
    for note in &migrated.notes {
        out.push_str(&format!("# - {note}\n"));
    }
    let document = if values {
        &migrated.values
    } else {
        &migrated.manifest
    };
    out.push_str(&serde_yaml::to_string(document).unwrap_or_default());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arc(spec: Value) -> Value {
        json!({
            "apiVersion": ARC_API_VERSION,
            "kind": "AutoscalingRunnerSet",
            "metadata": {
                "name": "arc-runner-set",
                "namespace": "arc-runners",
                "labels": {"app.kubernetes.io/component": "autoscaling-runner-set", "team": "ci"},
                "annotations": {"runner-scale-set-id": "7", "actions.github.com/values-hash": "x"},
            },
            "spec": spec,
        })
    }

    fn basic() -> Value {
        json!({
            "githubConfigUrl": "https://github.com/octo",
            "githubConfigSecret": "arc-runner-set-gha-rs-github-secret",
            "minRunners": 1,
            "maxRunners": 5,
            "template": {"spec": {
                "serviceAccountName": "arc-runner-set-gha-rs-no-permission",
                "containers": [{"name": "runner", "image": "ghcr.io/actions/actions-runner:latest"}],
            }},
        })
    }

    #[test]
    fn what_means_the_same_carries_over_and_the_rest_is_named() {
        let mut spec = basic();
        spec["listenerTemplate"] = json!({"spec": {"containers": []}});
        spec["somethingNew"] = json!(1);
        let migrated = migrate(&arc(spec)).unwrap();
        let manifest = &migrated.manifest;
        assert_eq!(manifest["apiVersion"], "arcwright.dev/v1alpha1");
        assert_eq!(manifest["metadata"]["labels"], json!({"team": "ci"}));
        assert!(manifest["metadata"].get("annotations").is_none());
        assert_eq!(manifest["spec"]["maxRunners"], 5);
        assert!(manifest["spec"].get("listenerTemplate").is_none());
        let notes = migrated.notes.join("\n");
        for says in [
            "spec.listenerTemplate is not carried over: arcwright runs no listener pod",
            "spec.somethingNew is not carried over",
            "runner-scale-set-id annotation is not carried over",
            "arc-runner-set-gha-rs-no-permission is made by ARC's chart",
        ] {
            assert!(notes.contains(says), "{says} in {notes}");
        }
        // The manifest keeps ARC's account (it still exists); the values
        // leave it to the chart.
        assert_eq!(
            manifest["spec"]["template"]["spec"]["serviceAccountName"],
            "arc-runner-set-gha-rs-no-permission"
        );
        let values = &migrated.values;
        assert!(
            values["template"]["spec"]
                .get("serviceAccountName")
                .is_none()
        );
        assert_eq!(values["runnerScaleSetName"], "arc-runner-set");
        assert_eq!(
            values["githubConfigSecret"],
            "arc-runner-set-gha-rs-github-secret"
        );
        assert!(values.get("containerMode").is_none());
    }

    #[test]
    fn container_modes_are_told_from_the_template_arc_expanded() {
        let mut dind = basic();
        dind["template"]["spec"]["initContainers"] = json!([
            {"name": "init-dind-externals", "image": "ghcr.io/actions/actions-runner:latest"},
            {"name": "dind", "image": "docker:dind", "restartPolicy": "Always", "securityContext": {"privileged": true}},
        ]);
        let migrated = migrate(&arc(dind)).unwrap();
        assert_eq!(migrated.values["containerMode"], json!({"type": "dind"}));
        assert_eq!(
            migrated.manifest["spec"]["podValidationPolicy"],
            json!({"builtin": "default", "settings": {"allowPrivileged": true}})
        );
        for (path, mode) in [
            ("/home/runner/k8s/index.js", "kubernetes"),
            ("/home/runner/k8s-novolume/index.js", "kubernetes-novolume"),
        ] {
            let mut kube = basic();
            kube["template"]["spec"]["containers"][0]["env"] =
                json!([{"name": "ACTIONS_RUNNER_CONTAINER_HOOKS", "value": path}]);
            let migrated = migrate(&arc(kube)).unwrap();
            assert_eq!(migrated.values["containerMode"]["type"], mode);
            assert!(
                migrated.manifest["spec"]
                    .get("podValidationPolicy")
                    .is_none()
            );
        }
    }

    #[test]
    fn a_dind_container_of_arc_before_kubernetes_1_29_becomes_the_sidecar_the_chart_keeps() {
        let mut dind = basic();
        let sidecar = json!({"name": "dind", "image": "docker:24-dind", "args": ["dockerd", "--mtu=1400"], "securityContext": {"privileged": true}});
        dind["template"]["spec"]["containers"]
            .as_array_mut()
            .unwrap()
            .push(sidecar.clone());
        dind["template"]["spec"]["initContainers"] = json!([{"name": "init-dind-externals", "image": "ghcr.io/actions/actions-runner:latest"}]);
        let migrated = migrate(&arc(dind)).unwrap();
        assert_eq!(migrated.values["containerMode"], json!({"type": "dind"}));
        let pod = &migrated.values["template"]["spec"];
        let names = |key: &str| -> Vec<String> {
            pod[key]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["name"].as_str().unwrap().to_owned())
                .collect()
        };
        assert_eq!(names("containers"), ["runner"]);
        assert_eq!(names("initContainers"), ["init-dind-externals", "dind"]);
        let mut native = sidecar;
        native["restartPolicy"] = json!("Always");
        assert_eq!(pod["initContainers"][1], native, "its settings kept");
        assert!(migrated.notes.join("\n").contains("native sidecar"));
        // The manifest is ARC's pod as it ran.
        assert_eq!(
            migrated.manifest["spec"]["template"]["spec"]["containers"][1]["name"],
            "dind"
        );
    }

    #[test]
    fn anything_but_an_arc_set_is_refused_saying_what_it_is() {
        let error = migrate(&json!({"apiVersion": "v1", "kind": "Pod"})).unwrap_err();
        assert!(error.to_string().contains("kind \"Pod\""), "{error}");
        let mut no_url = arc(basic());
        no_url["spec"]
            .as_object_mut()
            .unwrap()
            .remove("githubConfigUrl");
        assert_eq!(
            migrate(&no_url).unwrap_err(),
            MigrateError::Missing {
                name: "arc-runner-set".into(),
                field: "spec.githubConfigUrl"
            }
        );
    }
}
