//! The one error type of the listener layer.

use crate::actions::ActionsError;
use crate::policy::PolicyError;

/// What can go wrong in a listener.
///
/// Almost nothing here ends a listener: the Actions service failing is
/// retried with backoff and reported ([`super::Health`]), a target or a job
/// record that cannot be written is reported and tried again on the next
/// decision. The only error a listener task returns is
/// [`ListenerError::Policy`], when even the bundled default scaling policy
/// cannot be loaded, which means the binary itself is broken.
#[derive(Debug, thiserror::Error)]
pub enum ListenerError {
    /// The Actions service refused or failed a call.
    #[error(transparent)]
    Actions(#[from] ActionsError),

    /// No scaling decision could be made, not even by the bundled default.
    #[error("no scaling decision could be made: {0}")]
    Policy(#[from] PolicyError),

    /// The scale target (the EphemeralRunnerSet) could not be read or patched.
    #[error("the scale target could not be updated: {0}")]
    Target(String),

    /// A job could not be recorded on its runner.
    #[error("the job could not be recorded on runner {runner}: {message}")]
    JobRecord {
        /// The runner (EphemeralRunner) name.
        runner: String,
        /// What went wrong.
        message: String,
    },
}

impl ListenerError {
    /// A short, stable name for this kind of error, for metric labels and
    /// event reasons.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Actions(error) => error.metric_label(),
            Self::Policy(error) => error.reason(),
            Self::Target(_) => "target",
            Self::JobRecord { .. } => "job_record",
        }
    }
}
