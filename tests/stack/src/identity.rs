//! The host's own identity on the API server: a ServiceAccount and a token.
//!
//! In a cluster the host runs as its ServiceAccount; here it does too,
//! rather than sharing the admin certificate the stack and the simulator
//! use. That keeps its requests its own in the audit log (see
//! [`crate::audit`]): the figure "apiserver requests per job" is then the
//! host's, not the simulator playing kubelets. The ServiceAccount is bound
//! to `cluster-admin`: what the chart's narrower role grants is the chart
//! tests' business, not the stack's.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::api::{Api, Patch, PatchParams};

/// The ServiceAccount's name in the stack's namespace.
pub const SERVICE_ACCOUNT: &str = "arcwright";

/// How long the host's token lasts: longer than any run (`--keep` too).
const TOKEN_SECONDS: i64 = 7 * 24 * 3600;

/// The user name the API server gives the host.
pub fn username(namespace: &str) -> String {
    format!("system:serviceaccount:{namespace}:{SERVICE_ACCOUNT}")
}

/// The host's ServiceAccount token, and how to write kubeconfigs with it.
pub struct HostIdentity {
    token: String,
    ca: PathBuf,
    namespace: String,
}

/// Creates the ServiceAccount and its binding and asks for a token.
pub async fn host_identity(
    client: kube::Client,
    plane: &arcwright_harness::ControlPlane,
    namespace: &str,
) -> Result<HostIdentity> {
    let apply = PatchParams::apply("arcwright-stack").force();
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let account: ServiceAccount = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": SERVICE_ACCOUNT},
    }))?;
    accounts
        .patch(SERVICE_ACCOUNT, &apply, &Patch::Apply(&account))
        .await
        .context("creating the host's ServiceAccount")?;
    let binding_name = format!("arcwright-stack-{namespace}");
    let binding: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": binding_name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": namespace}],
    }))?;
    Api::<ClusterRoleBinding>::all(client)
        .patch(&binding_name, &apply, &Patch::Apply(&binding))
        .await
        .context("binding the host's ServiceAccount")?;
    let request: TokenRequest = serde_json::from_value(serde_json::json!({
        "spec": {"audiences": [], "expirationSeconds": TOKEN_SECONDS},
    }))?;
    let token = accounts
        .create_token_request(SERVICE_ACCOUNT, &Default::default(), &request)
        .await
        .context("asking for the host's token")?
        .status
        .context("the token request has a status")?
        .token
        .context("the token request returned a token")?;
    Ok(HostIdentity {
        token,
        ca: plane.data_dir().join("certs").join("ca.crt"),
        namespace: namespace.to_owned(),
    })
}

impl HostIdentity {
    /// Writes a kubeconfig that reaches the API server at `server` (the
    /// server itself, or a relay in front of it) to `path`, mode 0600: it
    /// holds a credential, and is never printed.
    pub fn write_kubeconfig(&self, server: &str, path: &Path) -> Result<()> {
        let kubeconfig = serde_json::json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "stack", "cluster": {"server": server, "certificate-authority": self.ca}}],
            "users": [{"name": "arcwright", "user": {"token": self.token}}],
            "contexts": [{"name": "stack", "context": {"cluster": "stack", "user": "arcwright", "namespace": self.namespace}}],
            "current-context": "stack",
        });
        write_private(path, &serde_yaml::to_string(&kubeconfig)?)
            .with_context(|| format!("writing {}", path.display()))
    }
}

fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(text.as_bytes())
}
