//! The one error type of the Actions client.
//!
//! Callers branch on what the service meant, not on status codes: the
//! unregistration pool retries [`ActionsError::JobStillRunning`] later and
//! counts [`ActionsError::RunnerNotFound`] as done, the EphemeralRunner
//! reconciler resolves [`ActionsError::RunnerExists`] by looking the runner up,
//! the listener recreates its session after [`ActionsError::SessionConflict`]
//! or [`ActionsError::SessionExpired`]. Everything the service says that has
//! no such meaning stays in [`ActionsError::Status`] with its status code,
//! `typeName` and message, so nothing is lost in translation.
//!
//! No variant carries a token, a private key or a JIT config. Service messages
//! are scrubbed of the credentials the request carried before they are stored
//! (see `client`), and transport errors are stored without their URL.

use std::time::Duration;

use super::Operation;

/// Everything that can go wrong talking to GitHub or the Actions service.
#[derive(Debug, thiserror::Error)]
pub enum ActionsError {
    /// The configuration URL does not name an enterprise, an organisation or
    /// a repository on a GitHub host.
    #[error("the GitHub configuration URL {url:?} is invalid: {reason}")]
    InvalidConfigUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },

    /// The credentials cannot be used as given (for example an App private
    /// key that is not an RSA key in PEM form).
    #[error("the GitHub credentials are invalid: {0}")]
    InvalidCredentials(String),

    /// The HTTP client could not be built from the TLS or proxy settings.
    #[error("the HTTP client could not be configured: {0}")]
    ClientSetup(String),

    /// The service already has a runner with the requested name.
    #[error("{operation}: a runner with this name already exists: {message}")]
    RunnerExists {
        /// The call that failed.
        operation: Operation,
        /// The service's message.
        message: String,
    },

    /// The service has no runner with the requested id.
    #[error("{operation}: the runner does not exist: {message}")]
    RunnerNotFound {
        /// The call that failed.
        operation: Operation,
        /// The service's message.
        message: String,
    },

    /// The runner cannot be removed while the job assigned to it is running.
    #[error("{operation}: the runner is still running a job: {message}")]
    JobStillRunning {
        /// The call that failed.
        operation: Operation,
        /// The service's message.
        message: String,
    },

    /// Another listener holds the message session of this scale set.
    #[error("{operation}: another message session is active for this scale set: {message}")]
    SessionConflict {
        /// The call that failed.
        operation: Operation,
        /// The service's message.
        message: String,
    },

    /// The message session is gone on the service side (expired, or dropped);
    /// a new one must be created.
    #[error("{operation}: the message session has expired or no longer exists: {message}")]
    SessionExpired {
        /// The call that failed.
        operation: Operation,
        /// The service's message.
        message: String,
    },

    /// The scale set does not exist (deleted by an admin, or by the service
    /// after seven dormant days).
    #[error("{operation}: the runner scale set does not exist: {message}")]
    ScaleSetNotFound {
        /// The call that failed.
        operation: Operation,
        /// The service's message.
        message: String,
    },

    /// No runner group has the requested name.
    #[error("no runner group is named {name:?}")]
    RunnerGroupNotFound {
        /// The group name that was looked up.
        name: String,
    },

    /// The service returned more than one item where at most one was expected.
    #[error("{operation}: expected at most one result, the service returned {count}")]
    AmbiguousResult {
        /// The call that failed.
        operation: Operation,
        /// How many items came back.
        count: usize,
    },

    /// The message queue token was rejected even after the session had been
    /// refreshed.
    #[error("{operation}: the message queue token has expired")]
    QueueTokenExpired {
        /// The call that failed.
        operation: Operation,
    },

    /// The Actions service admin token was rejected even after a fresh
    /// bootstrap.
    #[error("{operation}: the Actions service rejected the admin token")]
    AdminTokenExpired {
        /// The call that failed.
        operation: Operation,
    },

    /// A bootstrap that this call was waiting on failed; the reason is that
    /// bootstrap's error. The call did not try again itself (see the
    /// client's admin token handling for why).
    #[error("the Actions service bootstrap failed: {reason}")]
    BootstrapFailed {
        /// The failed bootstrap's error, as text.
        reason: String,
    },

    /// The admin token from `runner-registration` is not a JWT with an `exp`
    /// claim, so the client could not know when to renew it.
    #[error("the Actions service admin token cannot be read: {0}")]
    InvalidAdminToken(String),

    /// The service answered with a status and error the client has no more
    /// specific meaning for.
    #[error(
        "{operation}: the service answered {status}{}{}: {message}{}",
        type_name.as_deref().map(|t| format!(" ({t})")).unwrap_or_default(),
        if *retries > 0 { format!(" after {retries} retries") } else { String::new() },
        request_id.as_deref().map(|r| format!(" [request {r}]")).unwrap_or_default()
    )]
    Status {
        /// The call that failed.
        operation: Operation,
        /// The HTTP status code.
        status: u16,
        /// The exception `typeName`, when the body had one.
        type_name: Option<String>,
        /// The service's message, or the plain-text body.
        message: String,
        /// The `ActivityId` or `X-GitHub-Request-Id` header, for support
        /// requests.
        request_id: Option<String>,
        /// How many retries were spent before giving up.
        retries: u32,
    },

    /// The request could not be sent or its response not read.
    #[error("{operation}: the request failed after {retries} retries: {source}")]
    Transport {
        /// The call that failed.
        operation: Operation,
        /// How many retries were spent before giving up.
        retries: u32,
        /// The underlying error, stored without its URL.
        #[source]
        source: reqwest::Error,
    },

    /// No response arrived within the per-call timeout.
    #[error("{operation}: no response within {after:?} (after {retries} retries)")]
    Timeout {
        /// The call that failed.
        operation: Operation,
        /// The per-attempt timeout.
        after: Duration,
        /// How many retries were spent before giving up.
        retries: u32,
    },

    /// A response body was longer than the call allows. A service that
    /// streams without end (or a hostile server named in a tenant's
    /// `githubConfigUrl`) must not be able to fill the host's memory, so the
    /// read stops at the limit and the call fails; it is not retried, since
    /// the next answer is as likely to be as long.
    #[error("{operation}: the response body is longer than the {limit} bytes this call accepts")]
    BodyTooLarge {
        /// The call that failed.
        operation: Operation,
        /// The most bytes the call reads.
        limit: usize,
    },

    /// The call would have gone over plain `http`, carrying a token in clear
    /// text. Only a host run with `--allow-plain-http` (tests and labs) makes
    /// such calls.
    #[error(
        "{operation}: refusing to call {url} over plain http (an https URL is required; \
         --allow-plain-http permits it in tests and labs)"
    )]
    PlainHttpRefused {
        /// The call that was refused.
        operation: Operation,
        /// The URL, without its query.
        url: String,
    },

    /// The service handed out a URL on a host it does not use for itself
    /// and the operator did not allow ([`super::hosts`]): the call was not
    /// made, so a server a tenant pointed the controller at cannot send it
    /// on to the cluster's own addresses.
    #[error(
        "{operation}: refusing to call {host}, which is not one of the Actions service's hosts \
         (the operator's --actions-hosts allows more)"
    )]
    HostRefused {
        /// The call that was refused.
        operation: Operation,
        /// The host it would have gone to.
        host: String,
    },

    /// A successful response did not have the expected shape.
    #[error("{operation}: the response cannot be decoded: {reason}")]
    Decode {
        /// The call that failed.
        operation: Operation,
        /// What did not parse.
        reason: String,
    },
}

impl ActionsError {
    /// A short, stable name for this kind of error, for metric labels and
    /// Kubernetes event reasons.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::InvalidConfigUrl { .. } => "invalid_config_url",
            Self::InvalidCredentials(_) => "invalid_credentials",
            Self::ClientSetup(_) => "client_setup",
            Self::RunnerExists { .. } => "runner_exists",
            Self::RunnerNotFound { .. } => "runner_not_found",
            Self::JobStillRunning { .. } => "job_still_running",
            Self::SessionConflict { .. } => "session_conflict",
            Self::SessionExpired { .. } => "session_expired",
            Self::ScaleSetNotFound { .. } => "scale_set_not_found",
            Self::RunnerGroupNotFound { .. } => "runner_group_not_found",
            Self::AmbiguousResult { .. } => "ambiguous_result",
            Self::QueueTokenExpired { .. } => "queue_token_expired",
            Self::AdminTokenExpired { .. } => "admin_token_expired",
            Self::BootstrapFailed { .. } => "bootstrap_failed",
            Self::InvalidAdminToken(_) => "invalid_admin_token",
            Self::Status { .. } => "unexpected_status",
            Self::Transport { .. } => "transport",
            Self::Timeout { .. } => "timeout",
            Self::Decode { .. } => "decode",
            Self::BodyTooLarge { .. } => "body_too_large",
            Self::PlainHttpRefused { .. } => "plain_http_refused",
            Self::HostRefused { .. } => "host_refused",
        }
    }

    /// The HTTP status the service answered with, when the error came from a
    /// response that [`ActionsError::Status`] holds.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// Turns a non-success response into an error.
///
/// This is the Go client's `newRequestResponseError`, as a pure function so
/// every branch is unit-tested: a `text/plain` body is the message; otherwise
/// the body is read as `{typeName, message}` and the `typeName` is matched by
/// substring, because the service sends fully qualified names such as
/// `GitHub.Actions.Runtime.WebApi.RunnerScaleSetSessionExpiredException,
/// GitHub.Actions.Runtime.WebApi`. A body that is neither (an HTML page from
/// a proxy, JSON without a `message`) is described, never repeated: the
/// message ends up in a scale set's status and events, which a tenant reads,
/// and a body repeated there would carry whatever the server that answered
/// had to say back to the tenant who chose the URL.
///
/// A few statuses carry meaning without a `typeName`: 404 on a call addressed
/// to one scale set means the scale set is gone, and 404 on a session call
/// means the session is (the service answers a refresh of a session it lost
/// with a bare 404).
pub(crate) fn classify_response(
    operation: Operation,
    status: u16,
    content_type: Option<&str>,
    body: &[u8],
    request_id: Option<String>,
    retries: u32,
) -> ActionsError {
    let body = strip_bom(body);
    let described = || {
        if body.iter().all(u8::is_ascii_whitespace) {
            return String::new();
        }
        format!(
            "(an answer of {} bytes{} that is not the service's error)",
            body.len(),
            content_type
                .map(|c| format!(", {}", c.split(';').next().unwrap_or(c).trim()))
                .unwrap_or_default()
        )
    };
    let (type_name, message) = if content_type.is_some_and(|c| c.contains("text/plain")) {
        (None, String::from_utf8_lossy(body).trim().to_string())
    } else {
        match serde_json::from_slice::<ExceptionBody>(body) {
            Ok(ExceptionBody { type_name, message }) => {
                let message = message.filter(|m| !m.is_empty()).unwrap_or_else(described);
                (type_name.filter(|t| !t.is_empty()), message)
            }
            Err(_) => (None, described()),
        }
    };
    let message = readable(message);

    if status == 401 && operation.uses_queue_token() {
        return ActionsError::QueueTokenExpired { operation };
    }
    let typed = |needle: &str| type_name.as_deref().is_some_and(|t| t.contains(needle));
    if typed("AgentExistsException") {
        return ActionsError::RunnerExists { operation, message };
    }
    if typed("AgentNotFoundException") {
        return ActionsError::RunnerNotFound { operation, message };
    }
    if typed("JobStillRunningException") {
        return ActionsError::JobStillRunning { operation, message };
    }
    if typed("RunnerScaleSetSessionConflictException") {
        return ActionsError::SessionConflict { operation, message };
    }
    if typed("RunnerScaleSetSessionExpiredException") || typed("SessionNotFoundException") {
        return ActionsError::SessionExpired { operation, message };
    }
    if typed("RunnerScaleSetNotFoundException") {
        return ActionsError::ScaleSetNotFound { operation, message };
    }
    if status == 404 && type_name.is_none() {
        if operation.is_session_call() {
            return ActionsError::SessionExpired { operation, message };
        }
        if operation.addresses_scale_set() {
            return ActionsError::ScaleSetNotFound { operation, message };
        }
        if operation == Operation::GetRunner || operation == Operation::RemoveRunner {
            return ActionsError::RunnerNotFound { operation, message };
        }
    }
    if status == 409 && type_name.is_none() && operation == Operation::CreateSession {
        return ActionsError::SessionConflict { operation, message };
    }
    ActionsError::Status {
        operation,
        status,
        type_name,
        message,
        request_id,
        retries,
    }
}

/// The longest service message kept in an error. Error pages from proxies
/// and load balancers can be kilobytes of HTML; an event or a log line needs
/// the start of it, not all of it.
pub(crate) const MAX_MESSAGE_CHARS: usize = 512;

/// Bounds a service message and says so when there was none.
fn readable(message: String) -> String {
    if message.is_empty() {
        return "(the service gave no message)".to_string();
    }
    match message.char_indices().nth(MAX_MESSAGE_CHARS) {
        Some((cut, _)) => format!("{}…", &message[..cut]),
        None => message,
    }
}

/// The exception body the Actions service sends with an error status.
#[derive(serde::Deserialize)]
struct ExceptionBody {
    #[serde(rename = "typeName")]
    type_name: Option<String>,
    message: Option<String>,
}

/// Drops a leading UTF-8 byte order mark. The Actions service (a .NET
/// application) prefixes some bodies with one, and `serde_json` rejects it.
pub(crate) fn strip_bom(body: &[u8]) -> &[u8] {
    body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classify(op: Operation, status: u16, ct: Option<&str>, body: &str) -> ActionsError {
        classify_response(op, status, ct, body.as_bytes(), None, 0)
    }

    const JSON: Option<&str> = Some("application/json; charset=utf-8");

    #[test]
    fn type_names_are_matched_by_substring() {
        let cases: [(&str, &str); 6] = [
            (
                "GitHub.DistributedTask.WebApi.AgentExistsException, x",
                "runner_exists",
            ),
            (
                "GitHub.DistributedTask.WebApi.AgentNotFoundException",
                "runner_not_found",
            ),
            (
                "GitHub.DistributedTask.WebApi.JobStillRunningException",
                "job_still_running",
            ),
            (
                "GitHub.Actions.Runtime.WebApi.RunnerScaleSetSessionConflictException, GitHub.Actions.Runtime.WebApi",
                "session_conflict",
            ),
            (
                "GitHub.Actions.Runtime.WebApi.RunnerScaleSetSessionExpiredException, GitHub.Actions.Runtime.WebApi",
                "session_expired",
            ),
            (
                "GitHub.Actions.Runtime.WebApi.RunnerScaleSetNotFoundException",
                "scale_set_not_found",
            ),
        ];
        for (type_name, label) in cases {
            let body = serde_json::json!({"typeName": type_name, "message": "said the service"});
            let err = classify(Operation::GetRunner, 400, JSON, &body.to_string());
            assert_eq!(err.metric_label(), label, "{type_name}");
            assert!(err.to_string().contains("said the service"), "{err}");
        }
    }

    #[test]
    fn plain_text_body_is_the_message() {
        let err = classify(
            Operation::GetScaleSet,
            500,
            Some("text/plain; charset=utf-8"),
            "backend on fire\n",
        );
        match err {
            ActionsError::Status {
                status,
                type_name,
                message,
                ..
            } => {
                assert_eq!(status, 500);
                assert_eq!(type_name, None);
                assert_eq!(message, "backend on fire");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn bom_prefixed_json_is_parsed() {
        let body = "\u{feff}{\"typeName\":\"JobStillRunningException\",\"message\":\"busy\"}";
        let err = classify(Operation::RemoveRunner, 400, JSON, body);
        assert!(
            matches!(err, ActionsError::JobStillRunning { ref message, .. } if message == "busy"),
            "{err:?}"
        );
    }

    #[test]
    fn unknown_type_name_keeps_status_type_and_message() {
        let body = r#"{"typeName":"SomethingElseException","message":"nope"}"#;
        let err = classify_response(
            Operation::CreateScaleSet,
            400,
            JSON,
            body.as_bytes(),
            Some("act-1".into()),
            2,
        );
        let text = err.to_string();
        assert_eq!(err.status(), Some(400));
        assert!(
            text.contains("SomethingElseException") && text.contains("nope"),
            "{text}"
        );
        assert!(
            text.contains("act-1") && text.contains("2 retries"),
            "{text}"
        );
        assert_eq!(err.metric_label(), "unexpected_status");
    }

    #[test]
    fn empty_and_huge_messages_stay_readable() {
        let err = classify(Operation::DeleteScaleSet, 400, JSON, "");
        assert!(
            err.to_string().ends_with("(the service gave no message)"),
            "{err}"
        );
        // JSON without a message is described by its size, not repeated.
        let err = classify(Operation::DeleteScaleSet, 400, JSON, r#"{"error":"x"}"#);
        assert!(
            err.to_string()
                .contains("an answer of 13 bytes, application/json"),
            "{err}"
        );
        let page = "é".repeat(5000);
        let ActionsError::Status { message, .. } =
            classify(Operation::GetScaleSet, 502, Some("text/plain"), &page)
        else {
            panic!("expected Status")
        };
        assert_eq!(message.chars().count(), MAX_MESSAGE_CHARS + 1);
        assert!(message.ends_with('…'));
    }

    #[test]
    fn a_body_that_is_not_the_services_error_is_described_not_repeated() {
        let err = classify(
            Operation::GetRunnerGroup,
            502,
            Some("text/html; charset=utf-8"),
            "<html>internal: db-password=hunter2</html>",
        );
        let text = err.to_string();
        assert!(!text.contains("hunter2"), "{text}");
        assert!(
            text.contains("an answer of 42 bytes, text/html that is not the service's error"),
            "{text}"
        );
        // JSON without a message, as a metadata endpoint answers.
        let err = classify(
            Operation::GetRunnerGroup,
            200,
            JSON,
            r#"{"AccessKeyId": "AKIA", "SecretAccessKey": "s3cr3t"}"#,
        );
        assert!(!err.to_string().contains("s3cr3t"), "{err}");
    }

    #[test]
    fn bare_404_means_what_the_call_addressed() {
        assert_eq!(
            classify(Operation::RefreshSession, 404, None, "").metric_label(),
            "session_expired"
        );
        assert_eq!(
            classify(Operation::GetScaleSetById, 404, None, "").metric_label(),
            "scale_set_not_found"
        );
        assert_eq!(
            classify(Operation::CreateSession, 404, None, "").metric_label(),
            "scale_set_not_found"
        );
        assert_eq!(
            classify(Operation::GetRunner, 404, None, "").metric_label(),
            "runner_not_found"
        );
        assert_eq!(
            classify(Operation::RegistrationToken, 404, None, "").metric_label(),
            "unexpected_status"
        );
        assert_eq!(
            classify(Operation::CreateSession, 409, None, "").metric_label(),
            "session_conflict"
        );
    }

    #[test]
    fn unauthorized_queue_calls_mean_the_queue_token_expired() {
        for op in [
            Operation::GetMessage,
            Operation::DeleteMessage,
            Operation::AcquireJobs,
        ] {
            assert_eq!(
                classify(op, 401, None, "").metric_label(),
                "queue_token_expired"
            );
        }
        assert_eq!(
            classify(Operation::GetScaleSet, 401, None, "").metric_label(),
            "unexpected_status"
        );
    }
}
