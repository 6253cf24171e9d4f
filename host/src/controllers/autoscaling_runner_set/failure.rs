//! What a failed reconcile tells the admin: the `Stalled` condition's
//! reason for an [`Error`], and its message, the error with its causes.
//!
//! A scale set whose Secret is missing, whose service refuses its
//! credentials or cannot be reached, used to stay `Pending` with nothing on
//! it, and the log said `error sending request`. Now every failure the
//! admin can act on, or has to know of, is on the status and in one event.
//! The API server's own transient answers are not reported: a 409 is the
//! optimistic concurrency every write lives with, and 429, 5xx or a broken
//! connection are the cluster's, retried here and seen by the cluster's
//! own monitoring; a condition that flapped on each would be noise (and a
//! status write the server may not be able to take).

use crate::actions::ActionsError;
use crate::api::autoscaling_runner_set::StalledReason;
use crate::credentials::CredentialsError;
use crate::events::note;

use super::Error;

/// One failure as the status says it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The condition's reason.
    pub reason: StalledReason,
    /// The error and its causes, cut to what an event note holds.
    pub message: String,
}

/// The failure to report for `error`, or `None` for one that is the
/// cluster's and only retried.
pub fn of(error: &Error) -> Option<Failure> {
    let reason = match error {
        Error::Kube { source, .. } => kube_reason(source)?,
        Error::Actions { source, .. } => actions_reason(source),
        Error::Credentials(source) => credentials_reason(source)?,
        Error::Policy(_) | Error::PolicyNotLoaded { .. } => StalledReason::PolicyUnavailable,
        Error::PolicyLoading(_) => return None,
        Error::Listener(_) => StalledReason::ListenerNotStarted,
        Error::Incomplete(_) => return None,
    };
    Some(Failure {
        reason,
        message: note(crate::causes::of(error)),
    })
}

/// A refusal the admin can mend (RBAC, an object the server will not
/// store); `None` for concurrency, throttling, the server's own failures
/// and an object gone between the look and the call.
fn kube_reason(error: &kube::Error) -> Option<StalledReason> {
    match error {
        kube::Error::Api(status) => match status.code {
            404 | 409 | 429 => None,
            code if code >= 500 => None,
            _ => Some(StalledReason::KubernetesRefused),
        },
        _ => None,
    }
}

fn credentials_reason(error: &CredentialsError) -> Option<StalledReason> {
    match error {
        CredentialsError::Kube { source, .. } => kube_reason(source),
        CredentialsError::Actions { source, .. } => Some(actions_reason(source)),
        CredentialsError::SecretNotFound { .. }
        | CredentialsError::MissingKey { .. }
        | CredentialsError::Invalid { .. } => Some(StalledReason::CredentialsUnusable),
        CredentialsError::ConfigMapNotFound { .. } | CredentialsError::ProxyUrl { .. } => {
            Some(StalledReason::ConnectionSettingsInvalid)
        }
    }
}

fn actions_reason(error: &ActionsError) -> StalledReason {
    use ActionsError as E;
    match error {
        E::InvalidConfigUrl { .. }
        | E::ClientSetup(_)
        | E::PlainHttpRefused { .. }
        | E::HostRefused { .. } => StalledReason::ConnectionSettingsInvalid,
        E::InvalidCredentials(_) | E::AdminTokenExpired { .. } | E::InvalidAdminToken(_) => {
            StalledReason::CredentialsUnusable
        }
        E::Status { status, .. } => match *status {
            401 | 403 => StalledReason::CredentialsUnusable,
            429 => StalledReason::ActionsUnavailable,
            code if code >= 500 => StalledReason::ActionsUnavailable,
            _ => StalledReason::ActionsRefused,
        },
        E::Transport { .. }
        | E::Timeout { .. }
        | E::Decode { .. }
        | E::BodyTooLarge { .. }
        | E::BootstrapFailed { .. } => StalledReason::ActionsUnavailable,
        E::RunnerExists { .. }
        | E::RunnerNotFound { .. }
        | E::JobStillRunning { .. }
        | E::SessionConflict { .. }
        | E::SessionExpired { .. }
        | E::ScaleSetNotFound { .. }
        | E::RunnerGroupNotFound { .. }
        | E::AmbiguousResult { .. }
        | E::QueueTokenExpired { .. } => StalledReason::ActionsRefused,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actions::Operation;

    fn api(code: u16) -> Error {
        Error::Kube {
            action: "publishing the EphemeralRunnerSet",
            source: kube::Error::Api(
                kube::core::Status::failure(&format!("refused with {code}"), "Invalid")
                    .with_code(code)
                    .boxed(),
            ),
        }
    }

    fn status(code: u16) -> Error {
        Error::Actions {
            action: "finding the scale set",
            source: ActionsError::Status {
                operation: Operation::GetScaleSet,
                status: code,
                type_name: None,
                message: "no".into(),
                request_id: None,
                retries: 0,
            },
        }
    }

    #[test]
    fn the_clusters_transient_answers_are_only_retried() {
        for code in [404, 409, 429, 500, 503] {
            assert_eq!(of(&api(code)), None, "{code}");
        }
        assert_eq!(of(&Error::Incomplete("namespace")), None);
        // A ConfigMap's first version on its way: looked at again, unsaid.
        assert_eq!(
            of(&Error::PolicyLoading("configmap:ns/checks".into())),
            None
        );
    }

    #[test]
    fn a_pod_validation_policy_that_never_loaded_is_unavailable() {
        let failure = of(&Error::PolicyNotLoaded {
            policy: "builtin:no-such".into(),
            reason: "unknown-builtin".into(),
            message: "no builtin no-such".into(),
        })
        .unwrap();
        assert_eq!(failure.reason, StalledReason::PolicyUnavailable);
        assert!(
            failure.message.contains("builtin:no-such"),
            "{}",
            failure.message
        );
    }

    #[test]
    fn what_an_admin_can_mend_is_reported_with_its_reason() {
        assert_eq!(
            of(&api(422)).unwrap().reason,
            StalledReason::KubernetesRefused
        );
        assert_eq!(
            of(&api(403)).unwrap().reason,
            StalledReason::KubernetesRefused
        );
        let missing = Error::Credentials(CredentialsError::SecretNotFound {
            namespace: "ci".into(),
            name: "creds".into(),
        });
        let failure = of(&missing).unwrap();
        assert_eq!(failure.reason, StalledReason::CredentialsUnusable);
        assert_eq!(failure.message, "secret ci/creds does not exist");
        let cases = [
            (401, StalledReason::CredentialsUnusable),
            (403, StalledReason::CredentialsUnusable),
            (404, StalledReason::ActionsRefused),
            (422, StalledReason::ActionsRefused),
            (429, StalledReason::ActionsUnavailable),
            (502, StalledReason::ActionsUnavailable),
        ];
        for (code, reason) in cases {
            assert_eq!(of(&status(code)).unwrap().reason, reason, "{code}");
        }
    }

    #[test]
    fn a_long_failure_is_cut_to_an_event_note() {
        let long = Error::Actions {
            action: "finding the scale set",
            source: ActionsError::Decode {
                operation: Operation::GetScaleSet,
                reason: "x".repeat(5000),
            },
        };
        let failure = of(&long).unwrap();
        assert_eq!(failure.reason, StalledReason::ActionsUnavailable);
        assert!(failure.message.len() <= crate::events::MAX_NOTE);
    }
}
