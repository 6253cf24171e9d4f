//! The custom resources, `arcwright.dev/v1alpha1`: ARC's three kinds under
//! arcwright's group, plus the policy references and the revision
//! bookkeeping arcwright adds.
//!
//! The Rust types are the source of truth: `cargo xtask crds` writes
//! `crds/*.yaml` from them ([`crd_files`]) and CI fails when the files are
//! stale. One module per kind; what they share is in [`shared`]; the labels,
//! annotations, finalizers and field managers written beside them are in
//! [`labels`], [`annotations`], [`finalizers`] and [`field_managers`].

pub mod autoscaling_runner_set;
pub mod ephemeral_runner;
pub mod ephemeral_runner_set;
pub mod shared;
mod wire;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

pub use autoscaling_runner_set::{
    AutoscalingRunnerSet, AutoscalingRunnerSetPhase, AutoscalingRunnerSetSpec,
    AutoscalingRunnerSetStatus, ListenerStatus, ScalingStatus, ShadowScalingStatus,
};
pub use ephemeral_runner::{
    EphemeralRunner, EphemeralRunnerPhase, EphemeralRunnerSpec, EphemeralRunnerStatus, JOB_FIELDS,
    PreviousJob, RunnerRenewal,
};
pub use ephemeral_runner_set::{
    EphemeralRunnerSet, EphemeralRunnerSetPhase, EphemeralRunnerSetSpec, EphemeralRunnerSetStatus,
};
pub use shared::{
    DebugSpec, GitHubServerTls, PolicyRefs, ProxyServer, ProxySpec, ResourceMeta, SecretKeyRef,
    SlackSpec, TlsCertificateSource,
};
pub use wire::{Finalizer, annotations, field_managers, finalizers, labels};

/// The API group.
pub const GROUP: &str = "arcwright.dev";
/// The API version.
pub const VERSION: &str = "v1alpha1";

/// Every CRD, in a stable order.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        AutoscalingRunnerSet::crd(),
        EphemeralRunnerSet::crd(),
        EphemeralRunner::crd(),
    ]
}

/// The files `crds/` holds: one YAML document per CRD, named after it
/// (`ephemeralrunners.arcwright.dev.yaml`).
pub fn crd_files() -> Result<Vec<(String, String)>, serde_yaml::Error> {
    crds()
        .into_iter()
        .map(|crd| {
            let name = format!("{}.yaml", crd.metadata.name.clone().unwrap_or_default());
            let body = serde_yaml::to_string(&crd)?;
            Ok((
                name,
                format!(
                    "# Generated from host/src/api by `cargo xtask crds`; do not edit.\n{body}"
                ),
            ))
        })
        .collect()
}
