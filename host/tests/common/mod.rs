//! What the cluster tests share: installing the committed CRDs.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};

/// Applies every file in `crds/` with server-side apply (idempotent, so
/// every test of a binary may call it) and waits until each CRD is
/// established. Returns how many were applied.
pub async fn install_crds(client: kube::Client) -> usize {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../crds");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("crds/ exists") {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let crd: CustomResourceDefinition = serde_yaml::from_str(&text)
            .unwrap_or_else(|e| panic!("{} is a CRD: {e}", path.display()));
        names.push(apply_crd(client.clone(), &crd).await);
    }
    let crds: Api<CustomResourceDefinition> = Api::all(client);
    for name in &names {
        established(&crds, name).await;
    }
    names.len()
}

/// Applies one CRD with server-side apply, without waiting; returns its name.
pub async fn apply_crd(client: kube::Client, crd: &CustomResourceDefinition) -> String {
    let crds: Api<CustomResourceDefinition> = Api::all(client);
    let name = crd.metadata.name.clone().unwrap();
    crds.patch(
        &name,
        &PatchParams::apply("arcwright-tests").force(),
        &Patch::Apply(crd),
    )
    .await
    .unwrap_or_else(|e| panic!("the API server accepts the CRD {name}: {e}"));
    name
}

/// Waits until the CRD `name` is established.
pub async fn established(crds: &Api<CustomResourceDefinition>, name: &str) {
    tokio::time::timeout(
        Duration::from_secs(30),
        await_condition(crds.clone(), name, conditions::is_crd_established()),
    )
    .await
    .expect("established within 30 s")
    .expect("waiting for the CRD");
}

#[allow(dead_code)] // not every test binary calls the Actions service
pub fn fast_client_options() -> arcwright::actions::ClientOptions {
    arcwright::actions::ClientOptions {
        timeout: Duration::from_secs(5),
        retry: arcwright::actions::RetryPolicy {
            max_retries: 3,
            base_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(100),
            max_retry_after: Duration::from_secs(2),
        },
        allow_plain_http: true,
        ..arcwright::actions::ClientOptions::default()
    }
}

/// Creates the ServiceAccount `name` in `namespace`, with no permissions,
/// and returns a token for it made for arcwright's APIs (a TokenRequest
/// for the audience [`arcwright::access::AUDIENCE`], ten minutes).
#[allow(dead_code)] // the binaries that call an authenticated endpoint
pub async fn service_account_token(client: kube::Client, namespace: &str, name: &str) -> String {
    use k8s_openapi::api::core::v1::ServiceAccount;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap(),
        )
        .await
        .unwrap();
    token_for(client, namespace, name, &[arcwright::access::AUDIENCE]).await
}

/// A token of the existing ServiceAccount `namespace/name` for
/// `audiences` (none: the API server's own, what a kubeconfig holds).
#[allow(dead_code)] // the binaries that call an authenticated endpoint
pub async fn token_for(
    client: kube::Client,
    namespace: &str,
    name: &str,
    audiences: &[&str],
) -> String {
    use k8s_openapi::api::authentication::v1::TokenRequest;
    use k8s_openapi::api::core::v1::ServiceAccount;
    let accounts: Api<ServiceAccount> = Api::namespaced(client, namespace);
    let request = serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 600, "audiences": audiences},
    });
    let issued: TokenRequest = accounts
        .create_subresource("token", name, &PostParams::default(), &request)
        .await
        .unwrap();
    issued.status.unwrap().token.expect("a token was issued")
}

/// [`service_account_token`], with the account bound to a Role of `rules`
/// in `namespace` (an empty list: no Role).
#[allow(dead_code)] // the binaries that call an authenticated endpoint
pub async fn service_account_with_rules(
    client: kube::Client,
    namespace: &str,
    name: &str,
    rules: serde_json::Value,
) -> String {
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    let token = service_account_token(client.clone(), namespace, name).await;
    if rules.as_array().is_none_or(|r| r.is_empty()) {
        return token;
    }
    let post = PostParams::default();
    let role = serde_json::json!({"metadata": {"name": name}, "rules": rules});
    Api::<Role>::namespaced(client.clone(), namespace)
        .create(&post, &serde_json::from_value(role).unwrap())
        .await
        .unwrap();
    let binding = serde_json::json!({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
    });
    Api::<RoleBinding>::namespaced(client, namespace)
        .create(&post, &serde_json::from_value(binding).unwrap())
        .await
        .unwrap();
    token
}

/// Creates the Secret `github-auth` holding `token` under the key ARC's
/// Secret uses, in `namespace`.
#[allow(dead_code)] // not every test binary has a scale set
pub async fn github_secret(client: kube::Client, namespace: &str, token: &str) {
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "github-auth"},
        "stringData": {"github_token": token},
    }))
    .unwrap();
    Api::<Secret>::namespaced(client, namespace)
        .create(&PostParams::default(), &secret)
        .await
        .expect("the GitHub Secret is created");
}

/// One sample of the text format: name, labels, value.
#[derive(Debug, PartialEq)]
#[allow(dead_code)] // not every test binary scrapes /metrics
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Parses the OpenMetrics text format strictly enough to catch a malformed
/// exposition: `# HELP`/`# TYPE`/`# UNIT` lines, samples
/// `name{label="value",...} number`, and a final `# EOF`. Returns the
/// declared types by family and the samples.
#[allow(dead_code)]
pub fn parse_exposition(text: &str) -> (BTreeMap<String, String>, Vec<Sample>) {
    let mut types = BTreeMap::new();
    let mut samples = Vec::new();
    let mut lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.pop(), Some("# EOF"), "the exposition ends with # EOF");
    for line in lines {
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            let (keyword, family) = (parts.next().unwrap(), parts.next().unwrap());
            match keyword {
                "TYPE" => {
                    types.insert(family.to_owned(), parts.next().unwrap().to_owned());
                }
                "HELP" | "UNIT" => {}
                other => panic!("unknown comment {other:?} in {line:?}"),
            }
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("a sample has a value");
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("not a number in {line:?}"));
        let (name, labels) = match series.split_once('{') {
            None => (series, BTreeMap::new()),
            Some((name, labels)) => {
                let labels = labels.strip_suffix('}').expect("labels end with }");
                let labels = labels
                    .split(',')
                    .filter(|pair| !pair.is_empty())
                    .map(|pair| {
                        let (key, value) = pair.split_once('=').expect("label=value");
                        let value = value
                            .strip_prefix('"')
                            .and_then(|v| v.strip_suffix('"'))
                            .expect("quoted label value");
                        (key.to_owned(), value.to_owned())
                    })
                    .collect();
                (name, labels)
            }
        };
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "bad metric name in {line:?}"
        );
        samples.push(Sample {
            name: name.to_owned(),
            labels,
            value,
        });
    }
    (types, samples)
}

/// Waits until the credentials Secret `github-auth` in `namespace` carries
/// the finalizer a scale set holds it with.
#[allow(dead_code)] // the binaries whose scale sets are deleted with their Secret
pub async fn wait_credentials_held(client: kube::Client, namespace: &str) {
    use kube::ResourceExt;
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(client, namespace);
    arcwright_harness::eventually(
        "the credentials Secret is held",
        std::time::Duration::from_secs(60),
        || async {
            let secret = secrets.get("github-auth").await.ok()?;
            secret
                .finalizers()
                .iter()
                .any(|f| f == arcwright::api::finalizers::CREDENTIALS_IN_USE.name)
                .then_some(())
        },
    )
    .await;
}

/// Creates an EphemeralRunnerSet `name` in `namespace` (no controller
/// serves it) and returns `runner` made its set's, as the set controller
/// builds runners: labelled with the set and controlled by it. The runner
/// controller registers only a runner its set owns.
#[allow(dead_code)] // the binaries that write runners by hand
pub async fn owned_by_a_set(
    client: kube::Client,
    namespace: &str,
    name: &str,
    mut runner: arcwright::api::EphemeralRunner,
) -> arcwright::api::EphemeralRunner {
    use arcwright::api::{EphemeralRunnerSet, EphemeralRunnerSetSpec, labels};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use kube::Resource;
    let sets: Api<EphemeralRunnerSet> = Api::namespaced(client, namespace);
    let set = match sets.get_opt(name).await.unwrap() {
        Some(set) => set,
        None => sets
            .create(
                &PostParams::default(),
                &EphemeralRunnerSet::new(
                    name,
                    EphemeralRunnerSetSpec {
                        ephemeral_runner_spec: runner.spec.clone(),
                        ..EphemeralRunnerSetSpec::default()
                    },
                ),
            )
            .await
            .unwrap(),
    };
    runner
        .metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert(labels::EPHEMERAL_RUNNER_SET.into(), name.into());
    runner.metadata.owner_references = Some(vec![OwnerReference {
        api_version: EphemeralRunnerSet::api_version(&()).into(),
        kind: EphemeralRunnerSet::kind(&()).into(),
        name: name.into(),
        uid: set.metadata.uid.clone().unwrap(),
        controller: Some(true),
        block_owner_deletion: None,
    }]);
    runner
}
