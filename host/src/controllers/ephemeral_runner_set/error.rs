//! Why a pass over a set failed.

use crate::controllers::kit::ErrorLabel;

/// Why a reconcile failed. Each variant names the step, so the message says
/// what the controller was doing.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The set lacks a name, namespace or uid (never true of a stored object).
    #[error("the EphemeralRunnerSet has no {0}")]
    MissingMetadata(&'static str),
    /// Listing the set's runners failed.
    #[error("listing the runners: {0}")]
    List(#[source] kube::Error),
    /// Creating a runner failed.
    #[error("creating a runner: {0}")]
    Create(#[source] kube::Error),
    /// Deleting a runner failed.
    #[error("deleting runner {name}: {source}")]
    Delete {
        /// The runner.
        name: String,
        /// The error.
        source: kube::Error,
    },
    /// A runner the pass took for idle was heard to start a job since the
    /// pass read it (see [`crate::backlog`]): not deleted.
    #[error("runner {0} started a job since the pass read it; the next pass decides again")]
    Busy(String),
    /// Renewing a runner failed.
    #[error("renewing runner {name}: {source}")]
    Renew {
        /// The runner.
        name: String,
        /// The error.
        source: kube::Error,
    },
    /// Writing the set's finalizer or status failed.
    #[error("updating the set: {0}")]
    Update(#[source] kube::Error),
}

impl ErrorLabel for Error {
    fn label(&self) -> &'static str {
        match self {
            Self::MissingMetadata(_) => "missing_metadata",
            Self::List(_) => "list",
            Self::Create(_) => "create",
            Self::Delete { .. } => "delete",
            Self::Busy(_) => "busy",
            Self::Renew { .. } => "renew",
            Self::Update(_) => "update",
        }
    }
}
