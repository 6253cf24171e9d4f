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

use std::future::Future;

use crate::actions::{ActionsClient, ActionsError};
use crate::api::AutoscalingRunnerSet;
use crate::credentials::{ActionsClients, CredentialsError, GitHubTarget};

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

/// Why no Actions client could be had for a scale set.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    /// The referenced Secret does not exist.
    #[error("the Secret {name:?} does not exist")]
    SecretNotFound {
        /// The Secret's name.
        name: String,
    },
    /// Anything else (a missing key, a malformed key, the API); the message
    /// carries no secret.
    #[error("credentials from the Secret {name:?}: {message}")]
    Unusable {
        /// The Secret's name.
        name: String,
        /// What is wrong.
        message: String,
    },
}

/// Where the controller gets the Actions client of a scale set, from the
/// Secret its spec references. Production: the shared
/// `credentials::ActionsClients` cache (one client per credential,
/// rebuilt when the Secret rotates); the trait keeps this controller
/// independent of how that cache is built.
pub trait ActionsClientSource: Send + Sync + 'static {
    /// The client for `set`.
    fn client(
        &self,
        set: &AutoscalingRunnerSet,
    ) -> impl Future<Output = Result<ActionsClient, CredentialError>> + Send;
}

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
    /// No client could be had.
    #[error(transparent)]
    Credentials(#[from] CredentialError),
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

/// The production source: the shared cache, keyed by target and the
/// Secret's version.
impl ActionsClientSource for ActionsClients {
    async fn client(&self, set: &AutoscalingRunnerSet) -> Result<ActionsClient, CredentialError> {
        let name = set.spec.github_config_secret.clone();
        self.get(&github_target(set))
            .await
            .map_err(|error| match error {
                CredentialsError::SecretNotFound { .. } => CredentialError::SecretNotFound { name },
                other => CredentialError::Unusable {
                    name,
                    message: other.to_string(),
                },
            })
    }
}
