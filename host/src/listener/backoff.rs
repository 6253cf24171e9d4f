//! What a listener does when the Actions service fails it: which failures
//! need a new message session, and how long to wait before trying again.
//!
//! ARC's listener exits on any error and lets Kubernetes restart its pod,
//! so a scale set deleted in the service becomes a crash loop. Here a
//! listener is a task among thousands in one process: it never exits on a
//! service failure, it waits with capped exponential backoff (jittered, so a
//! GitHub outage does not end with every listener of the host calling back
//! in the same instant), and it says why in the scale set's status.

use std::time::Duration;

use crate::actions::ActionsError;

/// Capped exponential backoff.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// The wait before the first retry.
    pub initial: Duration,
    /// The longest wait. A session conflict resolves when the other
    /// holder's session expires, which takes minutes, so waiting a minute
    /// between tries costs little and keeps a conflicted scale set from
    /// calling the service every few seconds.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(60),
        }
    }
}

impl Backoff {
    /// The wait before retry number `attempt` (0 for the first), given a
    /// `jitter` drawn uniformly from `[0, 1]`: `initial * 2^attempt`, capped
    /// at `max`, then scaled into its upper half ("equal jitter"), so a wait
    /// never collapses to nothing and retries of many listeners spread out.
    pub fn delay(&self, attempt: u32, jitter: f64) -> Duration {
        let factor = 2u32.saturating_pow(attempt.min(31));
        let full = self.initial.saturating_mul(factor).min(self.max);
        let jitter = if jitter.is_finite() {
            jitter.clamp(0.0, 1.0)
        } else {
            0.0
        };
        full.mul_f64(0.5 + jitter / 2.0)
    }
}

/// Why a listener is not listening, as its status says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cause {
    /// Another listener holds the scale set's message session; it is
    /// retried until that session ends or expires.
    SessionConflict,
    /// The scale set no longer exists in the Actions service.
    ScaleSetNotFound,
    /// The message session expired or was dropped by the service.
    SessionLost,
    /// The message queue token was refused even after a refresh.
    QueueTokenExpired,
    /// The credentials or the admin token were refused.
    Unauthorized,
    /// The service did not answer, or answered with a server error.
    ServiceUnavailable,
    /// The service answered with something the client cannot use.
    BadResponse,
    /// The scale target could not be read or patched.
    TargetUnavailable,
    /// No scaling decision could be made.
    PolicyUnavailable,
}

impl Cause {
    /// A short, stable name: a condition reason, an event reason, a label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SessionConflict => "SessionConflict",
            Self::ScaleSetNotFound => "ScaleSetNotFound",
            Self::SessionLost => "SessionLost",
            Self::QueueTokenExpired => "QueueTokenExpired",
            Self::Unauthorized => "Unauthorized",
            Self::ServiceUnavailable => "ServiceUnavailable",
            Self::BadResponse => "BadResponse",
            Self::TargetUnavailable => "TargetUnavailable",
            Self::PolicyUnavailable => "PolicyUnavailable",
        }
    }
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What to do about a failed Actions service call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recovery {
    /// What the status says.
    pub cause: Cause,
    /// Whether the current session is beyond use, so the next attempt must
    /// create a new one. An outage does not end a session: polling it again
    /// afterwards keeps the messages the service holds for it.
    pub new_session: bool,
}

/// Classifies a failed call.
pub fn recovery(error: &ActionsError) -> Recovery {
    use ActionsError as E;
    let (cause, new_session) = match error {
        E::SessionConflict { .. } => (Cause::SessionConflict, true),
        E::ScaleSetNotFound { .. } => (Cause::ScaleSetNotFound, true),
        E::SessionExpired { .. } => (Cause::SessionLost, true),
        E::QueueTokenExpired { .. } => (Cause::QueueTokenExpired, true),
        E::AdminTokenExpired { .. }
        | E::InvalidCredentials(_)
        | E::InvalidAdminToken(_)
        | E::BootstrapFailed { .. } => (Cause::Unauthorized, false),
        E::Status { status, .. } if matches!(*status, 401 | 403) => (Cause::Unauthorized, false),
        E::Status { status, .. } if *status == 429 || *status >= 500 => {
            (Cause::ServiceUnavailable, false)
        }
        E::Transport { .. } | E::Timeout { .. } => (Cause::ServiceUnavailable, false),
        E::Status { .. }
        | E::Decode { .. }
        | E::BodyTooLarge { .. }
        | E::PlainHttpRefused { .. }
        | E::HostRefused { .. }
        | E::InvalidConfigUrl { .. }
        | E::ClientSetup(_)
        | E::RunnerExists { .. }
        | E::RunnerNotFound { .. }
        | E::JobStillRunning { .. }
        | E::RunnerGroupNotFound { .. }
        | E::AmbiguousResult { .. } => (Cause::BadResponse, false),
    };
    Recovery { cause, new_session }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actions::Operation;

    #[test]
    fn delays_double_up_to_the_cap_and_jitter_keeps_the_upper_half() {
        let backoff = Backoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(60),
        };
        let ms = |d: Duration| d.as_millis();
        let cases: &[(u32, f64, u128)] = &[
            (0, 1.0, 1_000),
            (0, 0.0, 500),
            (0, 0.5, 750),
            (1, 1.0, 2_000),
            (3, 1.0, 8_000),
            (5, 1.0, 32_000),
            (6, 1.0, 60_000),
            (6, 0.0, 30_000),
            (40, 1.0, 60_000),
            (u32::MAX, 1.0, 60_000),
            (2, 7.0, 4_000),
            (2, -3.0, 2_000),
            (2, f64::NAN, 2_000),
        ];
        for &(attempt, jitter, expected) in cases {
            assert_eq!(
                ms(backoff.delay(attempt, jitter)),
                expected,
                "attempt {attempt}, jitter {jitter}"
            );
        }
    }

    fn status(code: u16) -> ActionsError {
        ActionsError::Status {
            operation: Operation::GetMessage,
            status: code,
            type_name: None,
            message: "m".into(),
            request_id: None,
            retries: 4,
        }
    }

    #[test]
    fn failures_are_classified_by_what_they_mean_for_the_session() {
        let op = Operation::CreateSession;
        let message = || "m".to_string();
        let cases: Vec<(ActionsError, Cause, bool)> = vec![
            (
                ActionsError::SessionConflict {
                    operation: op,
                    message: message(),
                },
                Cause::SessionConflict,
                true,
            ),
            (
                ActionsError::ScaleSetNotFound {
                    operation: op,
                    message: message(),
                },
                Cause::ScaleSetNotFound,
                true,
            ),
            (
                ActionsError::SessionExpired {
                    operation: Operation::GetMessage,
                    message: message(),
                },
                Cause::SessionLost,
                true,
            ),
            (
                ActionsError::QueueTokenExpired {
                    operation: Operation::GetMessage,
                },
                Cause::QueueTokenExpired,
                true,
            ),
            (
                ActionsError::AdminTokenExpired { operation: op },
                Cause::Unauthorized,
                false,
            ),
            (status(403), Cause::Unauthorized, false),
            (status(500), Cause::ServiceUnavailable, false),
            (status(503), Cause::ServiceUnavailable, false),
            (status(429), Cause::ServiceUnavailable, false),
            (
                ActionsError::Timeout {
                    operation: Operation::GetMessage,
                    after: Duration::from_secs(90),
                    retries: 4,
                },
                Cause::ServiceUnavailable,
                false,
            ),
            (status(400), Cause::BadResponse, false),
            (
                ActionsError::Decode {
                    operation: Operation::GetMessage,
                    reason: "r".into(),
                },
                Cause::BadResponse,
                false,
            ),
        ];
        for (error, cause, new_session) in cases {
            assert_eq!(recovery(&error), Recovery { cause, new_session }, "{error}");
        }
    }
}
