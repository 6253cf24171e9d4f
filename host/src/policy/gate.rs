//! The pod-validation policy as a gate: a template is built only once the
//! policy its object names has judged it.
//!
//! Unlike the other kinds, a pod-validation policy that never loaded is not
//! stood in for by the bundled default: the default may accept what the
//! admin's policy refuses, and a typo in a ConfigMap's name must not let
//! privileged pods through. So a [`Gate`] remembers what its loading
//! reported ([`LoadState`]) and refuses to judge until its own policy
//! decides. A ConfigMap's first version is waited for, briefly, rather than
//! judged by the default meanwhile.
//!
//! Two controllers ask it: the AutoscalingRunnerSet controller, of the
//! set's template before anything is built from it, and the EphemeralRunner
//! controller, of the runner's pod before each pod is made, so a runner
//! created or edited past its set (or a set written past its
//! AutoscalingRunnerSet) is held to the same policy.

use std::sync::Arc;
use std::time::Duration;

use super::loader::{LoadedPolicy, PolicyLoader, PolicyRef};
use super::reporter::{LoadState, Loading, PolicyReporter};
use super::types::{PodValidationInput, Violation};
use super::{PolicyError, PolicyKind};

/// How long a pass waits for a ConfigMap's first version before it says
/// the policy is still loading and looks again.
pub const FIRST_VERSION: Duration = Duration::from_secs(10);

/// The pod-validation policy's verdict on a pod template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TemplateVerdict {
    /// The template may be built.
    Accepted,
    /// The template is refused, with every violation the policy found.
    Rejected(Vec<Violation>),
}

/// The violations as the condition's message: `path: message; ...`.
pub fn violations_message(violations: &[Violation]) -> String {
    violations
        .iter()
        .map(|v| format!("{}: {}", v.path, v.message))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Why a gate gave no verdict.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    /// The policy could not decide.
    #[error("pod validation: {0}")]
    Policy(#[from] PolicyError),
    /// The policy named never loaded: the bundled default, which would
    /// stand in, is not the gate the admin chose.
    #[error("pod validation: the policy {policy} is not loaded ({reason}): {message}")]
    NotLoaded {
        /// The policy's label.
        policy: String,
        /// The short reason label.
        reason: String,
        /// Why.
        message: String,
    },
    /// The first version of the ConfigMap the policy is read from has not
    /// loaded yet; looked at again shortly.
    #[error("pod validation: the policy {0} is still loading")]
    Loading(String),
}

/// One loaded pod-validation policy, the reference it was loaded for and
/// what its loading reported. Kept by the caller while the reference is
/// unchanged, so a ConfigMap-backed policy is watched once.
pub struct Gate {
    reference: Option<PolicyRef>,
    namespace: String,
    loaded: Arc<LoadedPolicy>,
    state: Arc<LoadState>,
}

impl Gate {
    /// Loads the policy `reference` names in `namespace` (`None`: the
    /// controller's default); `reporter` hears of its loading too.
    pub async fn load(
        loader: &PolicyLoader,
        namespace: &str,
        reference: Option<PolicyRef>,
        reporter: Arc<dyn PolicyReporter>,
    ) -> Result<Self, PolicyError> {
        let state = Arc::new(LoadState::new(reporter));
        let loaded = loader
            .load(
                PolicyKind::PodValidation,
                namespace,
                reference.as_ref(),
                Arc::clone(&state) as Arc<dyn PolicyReporter>,
            )
            .await?;
        Ok(Self {
            reference,
            namespace: namespace.to_owned(),
            loaded: Arc::new(loaded),
            state,
        })
    }

    /// The reference the policy was loaded for.
    pub fn reference(&self) -> Option<&PolicyRef> {
        self.reference.as_ref()
    }

    /// The policy's label, as events and conditions name it: `default`
    /// for the controller's default (`--default-policies`, else the
    /// bundled one).
    pub fn label(&self) -> String {
        self.reference.as_ref().map_or_else(
            || "default".to_owned(),
            |r| r.label(PolicyKind::PodValidation, &self.namespace),
        )
    }

    /// Judges `template` (a PodTemplateSpec as JSON), once the policy named
    /// decides: waits up to [`FIRST_VERSION`] for a ConfigMap's first
    /// version, and gives no verdict for a policy that never loaded.
    pub async fn judge(&self, template: serde_json::Value) -> Result<TemplateVerdict, GateError> {
        let following = self
            .reference
            .as_ref()
            .is_some_and(|r| r.config_map_ref.is_some());
        let loading = match self.state.current() {
            Loading::Pending if following => self.state.settled(FIRST_VERSION).await,
            loading => loading,
        };
        match loading {
            Loading::Failed { reason, message } => {
                return Err(GateError::NotLoaded {
                    policy: self.label(),
                    reason,
                    message,
                });
            }
            Loading::Pending if following => return Err(GateError::Loading(self.label())),
            Loading::Pending | Loading::Loaded => {}
        }
        let decided = self
            .loaded
            .decider()
            .pod_validation(PodValidationInput { template })
            .await?;
        Ok(if decided.decision.violations.is_empty() {
            TemplateVerdict::Accepted
        } else {
            TemplateVerdict::Rejected(decided.decision.violations)
        })
    }
}
