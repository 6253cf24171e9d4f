//! The AutoscalingRunnerSet controller: one scale set registered in the
//! Actions service, one EphemeralRunnerSet carrying its runner spec, one
//! listener acquiring its jobs.
//!
//! The shape is observe, [`plan`](plan::plan), apply: the reconcile reads
//! the object, its EphemeralRunnerSet, its listener and the pod-validation
//! verdict; the pure planner decides (seed 004's rules live there, in
//! tables); [`reconcile`] applies the answer with one field manager.
//!
//! What it deliberately does not do: it never deletes its
//! EphemeralRunnerSet to recover from Outdated (that churned the scale set
//! in ARC, seed 004), never cancels a job (deletion waits for busy runners),
//! and never registers anything for a template the pod-validation policy
//! refused.

pub mod plan;
pub mod reconcile;
pub mod watch;

use crate::actions::ActionsError;
use crate::api::AutoscalingRunnerSet;
use crate::credentials::{CredentialsError, GitHubTarget};

pub use crate::listener::control::{
    InMemoryListeners, ListenerConfig, ListenerControl, ListenerEvent, StartError,
};
pub use reconcile::{Context, reconcile, run};

/// The finalizer that holds the object until its listener, runners and
/// scale set are gone.
pub const FINALIZER: &str = "autoscalingrunnerset.arcwright.dev/finalizer";

/// The controller's name in metrics.
pub const CONTROLLER: &str = "autoscaling-runner-set";

/// The field manager of every write this controller makes.
pub const FIELD_MANAGER: &str = "arcwright-autoscaling-runner-set";

/// The scale set's id, also kept in an annotation as ARC does: the status
/// is lost when objects are restored from a backup, the annotation is not,
/// and a lost id would register a second scale set.
pub const SCALE_SET_ID_ANNOTATION: &str = "arcwright.dev/runner-scale-set-id";

/// Set to `"true"` to let a deletion finish without deleting the scale set
/// in the Actions service when its credentials Secret is gone.
pub const FORCE_DELETE_ANNOTATION: &str = "arcwright.dev/force-delete";

/// The condition saying whether the pod-validation policy accepts the
/// template.
pub const TEMPLATE_CONDITION: &str = "PodTemplateAccepted";

/// The condition saying why a deletion does not finish.
pub const DELETION_CONDITION: &str = "DeletionBlocked";

/// What can go wrong in a reconcile; every variant is retried.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Kubernetes API refused a call.
    #[error("Kubernetes API, {action}: {source}")]
    Kube {
        /// What was being done.
        action: &'static str,
        /// The error.
        #[source]
        source: kube::Error,
    },
    /// The Actions service refused a call.
    #[error("Actions service, {action}: {source}")]
    Actions {
        /// What was being done.
        action: &'static str,
        /// The error.
        #[source]
        source: ActionsError,
    },
    /// No Actions client could be had for the set's credentials.
    #[error(transparent)]
    Credentials(#[from] CredentialsError),
    /// The pod-validation policy could not decide.
    #[error("pod validation: {0}")]
    Policy(#[from] crate::policy::PolicyError),
    /// The listener could not be started.
    #[error(transparent)]
    Listener(#[from] StartError),
    /// The object lacks a field the API server always sets.
    #[error("the object has no {0}")]
    Incomplete(&'static str),
}

impl Error {
    /// A short label for metrics and logs.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Kube { .. } => "kube",
            Self::Actions { .. } => "actions",
            Self::Credentials(_) => "credentials",
            Self::Policy(_) => "policy",
            Self::Listener(_) => "listener",
            Self::Incomplete(_) => "incomplete",
        }
    }
}

/// Where `set`'s GitHub configuration lives, for the shared credentials
/// cache.
pub fn github_target(set: &AutoscalingRunnerSet) -> GitHubTarget {
    use kube::ResourceExt;
    let spec = &set.spec;
    super::github_target(
        &set.namespace().unwrap_or_default(),
        &spec.github_config_url,
        &spec.github_config_secret,
        spec.proxy.as_ref(),
        spec.github_server_tls.as_ref(),
    )
}
