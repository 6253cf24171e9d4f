//! The objects an EphemeralRunner owns, built from it: the JIT config Secret
//! and the runner pod. Pure functions, so what a pod looks like is tested
//! without a server.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, Container, EnvVar, EnvVarSource, KeyToPath, Pod, PodSpec, Secret,
    SecretKeySelector, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;

use super::plan::{RUNNER_CONTAINER, SecretView};
use crate::api::annotations::{self, RENEWAL as RENEWAL_ANNOTATION};
use crate::api::{EphemeralRunner, labels};

/// The Secret key holding the encoded JIT config (ARC's).
pub const JIT_TOKEN_KEY: &str = "jitToken";
/// The Secret key holding the registration id; not secret, read back to
/// recover from a crash between writing the Secret and the status.
pub const RUNNER_ID_KEY: &str = "runnerId";
/// The Secret key holding the registration name.
pub const RUNNER_NAME_KEY: &str = "runnerName";
/// The Secret key holding the scale set id.
pub const SCALE_SET_ID_KEY: &str = "scaleSetId";

/// The variable the runner reads its JIT config from.
pub const JIT_CONFIG_ENV: &str = "ACTIONS_RUNNER_INPUT_JITCONFIG";

/// The owner reference that makes the runner own (and garbage-collect) an
/// object.
pub fn owner_reference(runner: &EphemeralRunner) -> OwnerReference {
    OwnerReference {
        api_version: EphemeralRunner::api_version(&()).into_owned(),
        kind: EphemeralRunner::kind(&()).into_owned(),
        name: runner.metadata.name.clone().unwrap_or_default(),
        uid: runner.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// The labels every object of a runner carries: the runner's own name (to
/// find them), its scale set's labels, and who manages it.
pub fn owned_labels(runner: &EphemeralRunner) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if let Some(runner_labels) = &runner.metadata.labels {
        for key in [labels::SCALE_SET_NAME, labels::SCALE_SET_NAMESPACE] {
            if let Some(value) = runner_labels.get(key) {
                out.insert(key.to_string(), value.clone());
            }
        }
    }
    out.insert(
        labels::EPHEMERAL_RUNNER.to_string(),
        runner.metadata.name.clone().unwrap_or_default(),
    );
    out.insert(
        labels::MANAGED_BY.to_string(),
        labels::ARCWRIGHT.to_string(),
    );
    out
}

/// ARC's labels of a runner pod ([`labels::arc`]): `actions-ephemeral-runner`,
/// the scale set's name and namespace, and the enterprise, organisation and
/// repository of its configuration URL, each cut to a label value as ARC
/// cuts it (63 characters at most, ending `-trim` when cut).
pub fn arc_labels(runner: &EphemeralRunner) -> BTreeMap<String, String> {
    use crate::actions::{ConfigUrl, Scope};
    use labels::arc;
    let mut out = BTreeMap::from([(
        arc::EPHEMERAL_RUNNER.to_owned(),
        arc::EPHEMERAL_RUNNER_VALUE.to_owned(),
    )]);
    if let Some(runner_labels) = &runner.metadata.labels {
        for (ours, theirs) in [
            (labels::SCALE_SET_NAME, arc::SCALE_SET_NAME),
            (labels::SCALE_SET_NAMESPACE, arc::SCALE_SET_NAMESPACE),
        ] {
            if let Some(value) = runner_labels.get(ours) {
                out.insert(theirs.to_owned(), value.clone());
            }
        }
    }
    // A URL that does not parse has no scope to say; the runner fails on
    // its registration, with the reason, not here.
    if let Ok(url) = ConfigUrl::parse(&runner.spec.github_config_url) {
        let scope: &[(&str, &str)] = match url.scope() {
            Scope::Enterprise { enterprise } => &[(arc::ENTERPRISE, enterprise)],
            Scope::Organization { organization } => &[(arc::ORGANIZATION, organization)],
            Scope::Repository { owner, repository } => {
                &[(arc::ORGANIZATION, owner), (arc::REPOSITORY, repository)]
            }
        };
        for (key, value) in scope {
            out.insert((*key).to_owned(), arc_label_value(value));
        }
    }
    out
}

/// `value` as ARC writes it into a label: cut to 63 characters, the last
/// five `-trim`, when longer.
fn arc_label_value(value: &str) -> String {
    const MAX: usize = 63;
    if value.len() <= MAX {
        return value.to_owned();
    }
    let mut cut = MAX - "-trim".len();
    while !value.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}-trim", &value[..cut])
}

/// The JIT config Secret: named after the runner, owned by it.
pub fn jit_secret(
    runner: &EphemeralRunner,
    runner_id: i64,
    runner_name: &str,
    encoded_jit_config: &str,
) -> Secret {
    let meta = runner.spec.ephemeral_runner_config_secret_metadata.as_ref();
    let mut labels = meta.and_then(|m| m.labels.clone()).unwrap_or_default();
    labels.extend(owned_labels(runner));
    labels.insert(
        labels::COMPONENT.to_string(),
        "runner-jit-config".to_string(),
    );
    let data = [
        (JIT_TOKEN_KEY, encoded_jit_config.to_string()),
        (RUNNER_ID_KEY, runner_id.to_string()),
        (RUNNER_NAME_KEY, runner_name.to_string()),
        (
            SCALE_SET_ID_KEY,
            runner.spec.runner_scale_set_id.to_string(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), ByteString(v.into_bytes())))
    .collect();
    let mut annotations = meta.and_then(|m| m.annotations.clone());
    mark_renewal(runner, &mut annotations);
    let written = annotations.get_or_insert_with(BTreeMap::new);
    written.insert(annotations::RUNNER_ID.to_string(), runner_id.to_string());
    written.insert(
        annotations::RUNNER_NAME.to_string(),
        runner_name.to_string(),
    );
    Secret {
        metadata: ObjectMeta {
            name: runner.metadata.name.clone(),
            namespace: runner.metadata.namespace.clone(),
            labels: Some(labels),
            annotations,
            owner_references: Some(vec![owner_reference(runner)]),
            ..ObjectMeta::default()
        },
        data: Some(data),
        type_: Some("Opaque".to_string()),
        ..Secret::default()
    }
}

/// The non-secret half of a JIT config Secret, if it is one arcwright wrote
/// completely (all keys present, ids parse). A Secret missing its config is
/// treated as absent by the caller.
pub fn read_jit_secret(secret: &Secret) -> Option<SecretView> {
    let data = secret.data.as_ref()?;
    let text = |key: &str| {
        data.get(key)
            .and_then(|b| std::str::from_utf8(&b.0).ok())
            .map(str::to_string)
    };
    if text(JIT_TOKEN_KEY).is_none_or(|t| t.is_empty()) {
        return None;
    }
    Some(SecretView {
        runner_id: text(RUNNER_ID_KEY)?.parse().ok()?,
        runner_name: text(RUNNER_NAME_KEY)?,
        renewal: renewal_of(&secret.metadata),
        resource_version: secret.metadata.resource_version.clone().unwrap_or_default(),
    })
}

/// Records on an owned object which renewal of the runner it is made for;
/// nothing for the first job, so objects of runners never renewed look as
/// they always did.
fn mark_renewal(runner: &EphemeralRunner, annotations: &mut Option<BTreeMap<String, String>>) {
    let renewals = runner.status.as_ref().map_or(0, |s| s.renewals());
    if renewals > 0 {
        annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(RENEWAL_ANNOTATION.to_string(), renewals.to_string());
    }
}

/// Which renewal of its runner an owned object was made for (see
/// [`mark_renewal`]); an annotation someone broke reads as the first job's,
/// which only a runner never renewed takes for its own.
pub fn renewal_of(meta: &ObjectMeta) -> u32 {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(RENEWAL_ANNOTATION))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The non-secret half of a JIT config Secret from its metadata alone, as
/// the watch cache holds it: the registration its annotations name, if
/// arcwright wrote them. They are written in the same request as the config,
/// so a Secret that carries them carries a complete config. A Secret written
/// before they were (or with them removed) reads as absent here, and the
/// runner's pass reads it whole from the API server ([`read_jit_secret`])
/// before acting: the cache only ever decides that nothing is to be done.
pub fn read_jit_secret_meta(meta: &ObjectMeta) -> Option<SecretView> {
    let annotations = meta.annotations.as_ref()?;
    Some(SecretView {
        runner_id: annotations.get(annotations::RUNNER_ID)?.parse().ok()?,
        runner_name: annotations.get(annotations::RUNNER_NAME)?.clone(),
        renewal: renewal_of(meta),
        resource_version: meta.resource_version.clone().unwrap_or_default(),
    })
}

/// What the watch cache keeps of a runner pod: what [`super::observe`]
/// reads (metadata and status), not the spec, which is most of a pod's size.
pub fn slim_pod(pod: &mut Pod) {
    pod.spec = None;
    pod.metadata.managed_fields = None;
}

/// The runner pod: the template, named after the runner, owned by it, with
/// the JIT config injected from the Secret (never written into the spec)
/// and the variables ARC sets.
pub fn runner_pod(runner: &EphemeralRunner, user_agent: &str) -> Pod {
    let name = runner.metadata.name.clone().unwrap_or_default();
    let template_meta = runner.spec.metadata.clone().unwrap_or_default();
    let mut labels = template_meta.labels.unwrap_or_default();
    labels.extend(arc_labels(runner));
    labels.extend(owned_labels(runner));
    labels.insert(labels::COMPONENT.to_string(), "runner".to_string());
    let mut spec: PodSpec = runner.spec.spec.clone();
    for container in spec
        .containers
        .iter_mut()
        .filter(|c| c.name == RUNNER_CONTAINER)
    {
        let env = container.env.get_or_insert_with(Vec::new);
        let injected = [
            JIT_CONFIG_ENV,
            "GITHUB_ACTIONS_RUNNER_EXTRA_USER_AGENT",
            "ACTIONS_RUNNER_RETURN_VERSION_DEPRECATED_EXIT_CODE",
        ];
        env.retain(|e| !injected.contains(&e.name.as_str()));
        env.push(from_secret(JIT_CONFIG_ENV, &name, JIT_TOKEN_KEY));
        env.push(EnvVar {
            name: "GITHUB_ACTIONS_RUNNER_EXTRA_USER_AGENT".to_string(),
            value: Some(user_agent.to_string()),
            ..EnvVar::default()
        });
        // Exit 7 instead of self-updating when the service refuses the
        // runner's version, so the controller can report Outdated.
        env.push(EnvVar {
            name: "ACTIONS_RUNNER_RETURN_VERSION_DEPRECATED_EXIT_CODE".to_string(),
            value: Some("1".to_string()),
            ..EnvVar::default()
        });
    }
    add_proxy(runner, &mut spec);
    add_server_ca(runner, &mut spec);
    let mut annotations = template_meta.annotations;
    mark_renewal(runner, &mut annotations);
    if runner.spec.protect_busy_runners == Some(true) {
        // Idle, its node may go: the autoscaler would otherwise keep a pod
        // with local storage (dind's volumes). Marked "false" once busy.
        annotations
            .get_or_insert_with(BTreeMap::new)
            .entry(crate::api::annotations::SAFE_TO_EVICT.to_owned())
            .or_insert_with(|| "true".to_owned());
    }
    Pod {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: runner.metadata.namespace.clone(),
            labels: Some(labels),
            annotations,
            owner_references: Some(vec![owner_reference(runner)]),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    }
}

/// The keys of the runner proxy Secret (ARC's), one per variable the
/// runner container gets from it.
pub mod proxy_keys {
    /// The proxy for `http://` URLs, credentials included.
    pub const HTTP: &str = "http_proxy";
    /// The proxy for `https://` URLs, credentials included.
    pub const HTTPS: &str = "https_proxy";
    /// The hosts reached directly, comma-separated.
    pub const NO_PROXY: &str = "no_proxy";
}

/// The runner container of `spec`, if it has one.
fn runner_container(spec: &mut PodSpec) -> Option<&mut Container> {
    spec.containers
        .iter_mut()
        .find(|c| c.name == RUNNER_CONTAINER)
}

/// Appends `var` to `env` unless the template already sets a variable of
/// that name: what the template says is kept, as ARC's chart keeps it.
fn add_env(env: &mut Vec<EnvVar>, var: EnvVar) {
    if !env.iter().any(|e| e.name == var.name) {
        env.push(var);
    }
}

/// The variable `name`, read from the key `key` of the Secret `secret`,
/// which must exist (the kubelet holds the container until it does).
fn from_secret(name: &str, secret: &str, key: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.to_owned(),
                key: key.to_owned(),
                optional: Some(false),
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

/// The proxy variables, as ARC sets them: each read from the runner proxy
/// Secret the set's controller keeps (`spec.proxySecretRef`), since a proxy
/// URL carries its credentials and the pod spec is readable by anyone who
/// can list pods. Only the variables the spec's proxy has are set.
fn add_proxy(runner: &EphemeralRunner, spec: &mut PodSpec) {
    let (Some(proxy), Some(secret)) = (&runner.spec.proxy, &runner.spec.proxy_secret_ref) else {
        return;
    };
    let Some(container) = runner_container(spec) else {
        return;
    };
    let env = container.env.get_or_insert_with(Vec::new);
    let wanted = [
        (proxy_keys::HTTP, proxy.http.is_some()),
        (proxy_keys::HTTPS, proxy.https.is_some()),
        (proxy_keys::NO_PROXY, !proxy.no_proxy.is_empty()),
    ];
    for (key, _) in wanted.into_iter().filter(|(_, wanted)| *wanted) {
        add_env(env, from_secret(key, secret, key));
    }
}

/// The volume the server's CA bundle is mounted from (ARC's name).
pub const SERVER_CA_VOLUME: &str = "github-server-tls-cert";

/// The CA bundle of `githubServerTLS`, mounted into the runner container at
/// `runnerMountPath` as ARC's chart mounts it: the ConfigMap's key as a file
/// of that name, `NODE_EXTRA_CA_CERTS` naming it (the runner and Node
/// actions read it), `RUNNER_UPDATE_CA_CERTS=1` (the runner adds it to the
/// system store). A volume, mount or variable the template already has is
/// kept as it is.
fn add_server_ca(runner: &EphemeralRunner, spec: &mut PodSpec) {
    let Some(tls) = &runner.spec.github_server_tls else {
        return;
    };
    let (Some(dir), Some(source)) = (
        &tls.runner_mount_path,
        tls.certificate_from
            .as_ref()
            .and_then(|from| from.config_map_key_ref.as_ref()),
    ) else {
        return;
    };
    let path = format!("{}/{}", dir.trim_end_matches('/'), source.key);
    let volumes = spec.volumes.get_or_insert_with(Vec::new);
    if !volumes.iter().any(|v| v.name == SERVER_CA_VOLUME) {
        volumes.push(Volume {
            name: SERVER_CA_VOLUME.to_owned(),
            config_map: Some(ConfigMapVolumeSource {
                name: source.name.clone(),
                items: Some(vec![KeyToPath {
                    key: source.key.clone(),
                    path: source.key.clone(),
                    ..KeyToPath::default()
                }]),
                ..ConfigMapVolumeSource::default()
            }),
            ..Volume::default()
        });
    }
    let Some(container) = runner_container(spec) else {
        return;
    };
    let mounts = container.volume_mounts.get_or_insert_with(Vec::new);
    if !mounts.iter().any(|m| m.name == SERVER_CA_VOLUME) {
        mounts.push(VolumeMount {
            name: SERVER_CA_VOLUME.to_owned(),
            mount_path: path.clone(),
            sub_path: Some(source.key.clone()),
            ..VolumeMount::default()
        });
    }
    let env = container.env.get_or_insert_with(Vec::new);
    for (name, value) in [
        ("NODE_EXTRA_CA_CERTS", path),
        ("RUNNER_UPDATE_CA_CERTS", "1".to_owned()),
    ] {
        add_env(
            env,
            EnvVar {
                name: name.to_owned(),
                value: Some(value),
                ..EnvVar::default()
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::EphemeralRunnerSpec;

    fn runner() -> EphemeralRunner {
        let mut runner = EphemeralRunner::new(
            "set-runner-abc",
            EphemeralRunnerSpec {
                github_config_url: "https://github.com/o".into(),
                github_config_secret: "auth".into(),
                runner_scale_set_id: 3,
                metadata: Some(ObjectMeta {
                    labels: Some([("team".to_string(), "ci".to_string())].into()),
                    ..ObjectMeta::default()
                }),
                spec: PodSpec {
                    containers: vec![
                        Container {
                            name: "runner".into(),
                            env: Some(vec![EnvVar {
                                name: JIT_CONFIG_ENV.into(),
                                value: Some("literal".into()),
                                ..EnvVar::default()
                            }]),
                            ..Container::default()
                        },
                        Container {
                            name: "sidecar".into(),
                            ..Container::default()
                        },
                    ],
                    ..PodSpec::default()
                },
                ..EphemeralRunnerSpec::default()
            },
        );
        runner.metadata.namespace = Some("ns".into());
        runner.metadata.uid = Some("uid-1".into());
        runner.metadata.labels =
            Some([(labels::SCALE_SET_NAME.to_string(), "set".to_string())].into());
        runner
    }

    #[test]
    fn the_pod_reads_its_jit_config_from_the_secret_never_literally() {
        let pod = runner_pod(&runner(), "arcwright/0.1.0");
        let spec = pod.spec.unwrap();
        let env = spec.containers[0].env.clone().unwrap();
        let jit: Vec<_> = env.iter().filter(|e| e.name == JIT_CONFIG_ENV).collect();
        assert_eq!(jit.len(), 1, "the template's literal is replaced");
        assert_eq!(jit[0].value, None);
        let from = jit[0]
            .value_from
            .as_ref()
            .unwrap()
            .secret_key_ref
            .as_ref()
            .unwrap();
        assert_eq!(
            (from.name.as_str(), from.key.as_str()),
            ("set-runner-abc", JIT_TOKEN_KEY)
        );
        assert!(env.iter().any(
            |e| e.name == "ACTIONS_RUNNER_RETURN_VERSION_DEPRECATED_EXIT_CODE"
                && e.value.as_deref() == Some("1")
        ));
        assert_eq!(
            spec.containers[1].env, None,
            "only the runner container is changed"
        );
    }

    fn env_of(pod: &Pod) -> Vec<EnvVar> {
        pod.spec.as_ref().unwrap().containers[0]
            .env
            .clone()
            .unwrap_or_default()
    }

    #[test]
    fn proxy_variables_come_from_the_proxy_secret_never_literally() {
        use crate::api::shared::{ProxyServer, ProxySpec};
        let mut runner = runner();
        runner.spec.proxy = Some(ProxySpec {
            https: Some(ProxyServer {
                url: "http://proxy:3128".into(),
                credential_secret_ref: Some("proxy-auth".into()),
            }),
            no_proxy: vec!["internal".into()],
            ..ProxySpec::default()
        });
        // No Secret made for it yet: nothing to point at.
        assert!(
            !env_of(&runner_pod(&runner, "ua"))
                .iter()
                .any(|e| e.name.ends_with("_proxy"))
        );
        runner.spec.proxy_secret_ref = Some("set-runner-proxy".into());
        let env = env_of(&runner_pod(&runner, "ua"));
        let proxies: Vec<_> = env.iter().filter(|e| e.name.ends_with("_proxy")).collect();
        assert_eq!(
            proxies.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(),
            ["https_proxy", "no_proxy"],
            "only what the spec has"
        );
        for var in proxies {
            assert_eq!(var.value, None, "{var:?}");
            let from = var
                .value_from
                .as_ref()
                .unwrap()
                .secret_key_ref
                .as_ref()
                .unwrap();
            assert_eq!(
                (from.name.as_str(), from.key.as_str()),
                ("set-runner-proxy", var.name.as_str())
            );
        }
        // The template's own setting stays.
        runner.spec.spec.containers[0].env = Some(vec![EnvVar {
            name: "https_proxy".into(),
            value: Some("http://mine:8080".into()),
            ..EnvVar::default()
        }]);
        let env = env_of(&runner_pod(&runner, "ua"));
        let https: Vec<_> = env.iter().filter(|e| e.name == "https_proxy").collect();
        assert_eq!(https.len(), 1);
        assert_eq!(https[0].value.as_deref(), Some("http://mine:8080"));
    }

    #[test]
    fn the_server_ca_is_mounted_where_runner_mount_path_says_as_arc_mounts_it() {
        use crate::api::shared::{GitHubServerTls, TlsCertificateSource};
        use k8s_openapi::api::core::v1::ConfigMapKeySelector;
        let mut runner = runner();
        let tls = |mount: Option<&str>| GitHubServerTls {
            certificate_from: Some(TlsCertificateSource {
                config_map_key_ref: Some(ConfigMapKeySelector {
                    name: "ghes-ca".into(),
                    key: "ca.crt".into(),
                    optional: None,
                }),
            }),
            runner_mount_path: mount.map(str::to_owned),
        };
        runner.spec.github_server_tls = Some(tls(None));
        let pod = runner_pod(&runner, "ua");
        assert_eq!(
            pod.spec.as_ref().unwrap().volumes,
            None,
            "the controller's only"
        );
        runner.spec.github_server_tls = Some(tls(Some("/usr/local/share/ca-certificates/")));
        let pod = runner_pod(&runner, "ua");
        let spec = pod.spec.as_ref().unwrap();
        let volume = &spec.volumes.as_ref().unwrap()[0];
        assert_eq!(volume.name, SERVER_CA_VOLUME);
        let map = volume.config_map.as_ref().unwrap();
        assert_eq!(map.name, "ghes-ca");
        assert_eq!(map.items.as_ref().unwrap()[0].path, "ca.crt");
        let mount = &spec.containers[0].volume_mounts.as_ref().unwrap()[0];
        assert_eq!(mount.mount_path, "/usr/local/share/ca-certificates/ca.crt");
        assert_eq!(mount.sub_path.as_deref(), Some("ca.crt"));
        let env = env_of(&pod);
        let value = |name: &str| {
            env.iter()
                .find(|e| e.name == name)
                .and_then(|e| e.value.clone())
        };
        assert_eq!(
            value("NODE_EXTRA_CA_CERTS").as_deref(),
            Some("/usr/local/share/ca-certificates/ca.crt")
        );
        assert_eq!(value("RUNNER_UPDATE_CA_CERTS").as_deref(), Some("1"));
        assert_eq!(
            spec.containers[1].volume_mounts, None,
            "only the runner container"
        );
    }

    #[test]
    fn the_secrets_metadata_alone_names_its_registration_and_the_cache_keeps_no_pod_spec() {
        let mut runner = runner();
        let secret = jit_secret(&runner, 7, "set-runner-abc", "the-config");
        let from_meta = read_jit_secret_meta(&secret.metadata);
        assert_eq!(
            from_meta,
            Some(SecretView {
                runner_id: 7,
                runner_name: "set-runner-abc".into(),
                renewal: 0,
                resource_version: String::new(),
            }),
        );
        assert_eq!(
            from_meta,
            read_jit_secret(&secret),
            "metadata and data agree"
        );
        // The template's own annotations cannot pass for ours.
        runner.spec.ephemeral_runner_config_secret_metadata =
            Some(crate::api::shared::ResourceMeta {
                annotations: Some([(annotations::RUNNER_ID.to_string(), "99".to_string())].into()),
                ..Default::default()
            });
        let secret = jit_secret(&runner, 7, "set-runner-abc", "the-config");
        assert_eq!(
            read_jit_secret_meta(&secret.metadata).map(|s| s.runner_id),
            Some(7)
        );
        let mut older = secret.metadata.clone();
        older.annotations = None;
        assert_eq!(
            read_jit_secret_meta(&older),
            None,
            "a Secret written before the annotations is read whole"
        );
        let mut pod = runner_pod(&runner, "ua");
        pod.status = Some(Default::default());
        slim_pod(&mut pod);
        assert!(pod.spec.is_none());
        assert!(pod.status.is_some());
        assert!(!pod.metadata.owner_references.unwrap_or_default().is_empty());
    }

    #[test]
    fn arc_labels_name_the_scope_of_the_configuration_url_cut_as_arc_cuts_them() {
        let mut runner = runner();
        runner.spec.github_config_url = "https://github.com/octo/hello.world".into();
        let labels = arc_labels(&runner);
        assert_eq!(labels["actions.github.com/organization"], "octo");
        assert_eq!(labels["actions.github.com/repository"], "hello.world");
        runner.spec.github_config_url = "https://ghes.example/enterprises/acme".into();
        let labels = arc_labels(&runner);
        assert_eq!(labels["actions.github.com/enterprise"], "acme");
        assert!(!labels.contains_key("actions.github.com/organization"));
        let long = "r".repeat(80);
        runner.spec.github_config_url = format!("https://github.com/octo/{long}");
        let cut = &arc_labels(&runner)["actions.github.com/repository"];
        assert_eq!(cut.len(), 63);
        assert!(cut.ends_with("-trim"), "{cut}");
    }

    #[test]
    fn owned_objects_carry_owner_and_labels() {
        let runner = runner();
        let pod = runner_pod(&runner, "ua");
        let labels = pod.metadata.labels.unwrap();
        assert_eq!(labels["team"], "ci");
        assert_eq!(labels[labels::EPHEMERAL_RUNNER], "set-runner-abc");
        assert_eq!(labels[labels::SCALE_SET_NAME], "set");
        // ARC's, beside: what ARC users' NetworkPolicies select on.
        assert_eq!(labels["actions-ephemeral-runner"], "True");
        assert_eq!(labels["actions.github.com/scale-set-name"], "set");
        assert_eq!(labels["actions.github.com/organization"], "o");
        assert!(!labels.contains_key("actions.github.com/repository"));
        let owner = &pod.metadata.owner_references.unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("EphemeralRunner", "uid-1", Some(true))
        );

        let secret = jit_secret(&runner, 42, "set-runner-abc", "c2VjcmV0");
        assert_eq!(secret.metadata.name.as_deref(), Some("set-runner-abc"));
        assert_eq!(
            read_jit_secret(&secret),
            Some(SecretView {
                runner_id: 42,
                runner_name: "set-runner-abc".into(),
                renewal: 0,
                resource_version: String::new(),
            })
        );
        let pod = runner_pod(&runner, "ua");
        assert!(
            !pod.metadata
                .annotations
                .unwrap_or_default()
                .contains_key(RENEWAL_ANNOTATION),
            "a runner never renewed marks nothing"
        );
    }

    #[test]
    fn a_renewed_runners_pod_and_secret_say_which_renewal_they_are_for() {
        let mut runner = runner();
        runner.status = Some(crate::api::EphemeralRunnerStatus {
            renewal: Some(crate::api::RunnerRenewal {
                count: 3,
                patch_id: 1,
                set_generation: 1,
                renewed_at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    jiff::Timestamp::UNIX_EPOCH,
                ),
                previous: None,
            }),
            ..Default::default()
        });
        let pod = runner_pod(&runner, "ua");
        assert_eq!(renewal_of(&pod.metadata), 3);
        let secret = jit_secret(&runner, 42, "set-runner-abc", "c2VjcmV0");
        assert_eq!(read_jit_secret(&secret).map(|s| s.renewal), Some(3));

        let mut broken = pod.metadata.clone();
        broken
            .annotations
            .as_mut()
            .unwrap()
            .insert(RENEWAL_ANNOTATION.into(), "x".into());
        assert_eq!(
            renewal_of(&broken),
            0,
            "a broken mark reads as the first job's"
        );
    }

    #[test]
    fn an_incomplete_secret_reads_as_absent() {
        let runner = runner();
        let mut secret = jit_secret(&runner, 42, "n", "");
        assert_eq!(read_jit_secret(&secret), None, "no config");
        secret = jit_secret(&runner, 42, "n", "cfg");
        secret.data.as_mut().unwrap().remove(RUNNER_ID_KEY);
        assert_eq!(read_jit_secret(&secret), None, "no id");
    }
}
