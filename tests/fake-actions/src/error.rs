//! Errors of the fake, as the protocol shows them to clients, and errors
//! starting the fake.

use axum::Json;
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode};

/// A request the fake refuses, rendered the way the Actions service renders
/// it: a status and `{"typeName": "...", "message": "..."}`.
///
/// Clients match errors on a substring of `typeName` (`AgentExistsException`,
/// `JobStillRunningException`, ...), so the names below are the real ones
/// where the real service has one; the message is for humans only.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServiceError {
    /// No `Authorization` header, or one of the wrong scheme.
    #[error("the request carries no credentials the service accepts")]
    MissingCredentials,
    /// A token that the fake never issued, or signed by the wrong key.
    #[error("the credentials presented are not valid")]
    InvalidCredentials,
    /// A token past its expiry, or expired through the control API.
    #[error("the token presented has expired")]
    TokenExpired,
    /// A GitHub API resource that does not exist.
    #[error("{0}")]
    NotFound(String),
    /// `generatejitconfig` for a name that is already registered.
    #[error("a runner named {name:?} already exists")]
    AgentExists {
        /// The taken name.
        name: String,
    },
    /// A runner id with no registration.
    #[error("runner {id} does not exist")]
    AgentNotFound {
        /// The runner id asked for.
        id: u64,
    },
    /// `DELETE agents/{id}` while the runner runs a job.
    #[error("runner {id} is still running job {job}")]
    JobStillRunning {
        /// The runner id.
        id: u64,
        /// The job's `runnerRequestId`.
        job: u64,
    },
    /// A second message session for one scale set.
    #[error("scale set {id} already has an active message session")]
    SessionConflict {
        /// The scale set id.
        id: u64,
    },
    /// A scale set id that does not exist (or was deleted).
    #[error("scale set {id} does not exist")]
    ScaleSetNotFound {
        /// The scale set id.
        id: u64,
    },
    /// A scale set name already used in that runner group.
    #[error("a scale set named {name:?} already exists in runner group {group}")]
    ScaleSetExists {
        /// The name.
        name: String,
        /// The runner group id.
        group: u64,
    },
    /// Deleting a scale set whose runners hold jobs.
    #[error("scale set {id} has jobs assigned to its runners")]
    ScaleSetHasAssignedJobs {
        /// The scale set id.
        id: u64,
    },
    /// A session id the fake does not know.
    #[error("message session {0} does not exist")]
    SessionNotFound(String),
    /// A session dropped through the control API.
    #[error("message session {0} has expired")]
    SessionExpired(String),
    /// A malformed request.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// An injected error status.
    #[error("injected fault: HTTP {status}")]
    Injected {
        /// The status to answer with.
        status: u16,
        /// The `Retry-After` header, in seconds.
        retry_after_secs: Option<u64>,
    },
    /// An injected connection reset.
    #[error("injected fault: connection reset")]
    Reset,
}

/// Marks a response that must not be sent: the connection is closed instead.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ResetConnection;

impl ServiceError {
    /// The HTTP status the service answers with.
    pub fn status(&self) -> StatusCode {
        match self {
            ServiceError::MissingCredentials
            | ServiceError::InvalidCredentials
            | ServiceError::TokenExpired => StatusCode::UNAUTHORIZED,
            ServiceError::NotFound(_)
            | ServiceError::AgentNotFound { .. }
            | ServiceError::ScaleSetNotFound { .. }
            | ServiceError::SessionNotFound(_) => StatusCode::NOT_FOUND,
            ServiceError::AgentExists { .. }
            | ServiceError::SessionConflict { .. }
            | ServiceError::ScaleSetExists { .. } => StatusCode::CONFLICT,
            ServiceError::JobStillRunning { .. }
            | ServiceError::ScaleSetHasAssignedJobs { .. }
            | ServiceError::SessionExpired(_)
            | ServiceError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ServiceError::Injected { status, .. } => {
                StatusCode::from_u16(*status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
            }
            ServiceError::Reset => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The short exception name; the full `typeName` wraps it in the
    /// service's namespace.
    pub fn exception(&self) -> &'static str {
        match self {
            ServiceError::MissingCredentials | ServiceError::InvalidCredentials => {
                "UnauthorizedRequestException"
            }
            ServiceError::TokenExpired => "TokenExpiredException",
            ServiceError::NotFound(_) => "NotFoundException",
            ServiceError::AgentExists { .. } => "AgentExistsException",
            ServiceError::AgentNotFound { .. } => "AgentNotFoundException",
            ServiceError::JobStillRunning { .. } => "JobStillRunningException",
            ServiceError::SessionConflict { .. } => "RunnerScaleSetSessionConflictException",
            ServiceError::ScaleSetNotFound { .. } => "RunnerScaleSetNotFoundException",
            ServiceError::ScaleSetExists { .. } => "RunnerScaleSetExistsException",
            ServiceError::ScaleSetHasAssignedJobs { .. } => {
                "RunnerScaleSetHasAssignedJobsException"
            }
            ServiceError::SessionNotFound(_) => "RunnerScaleSetSessionNotFoundException",
            ServiceError::SessionExpired(_) => "RunnerScaleSetSessionExpiredException",
            ServiceError::BadRequest(_) => "ArgumentException",
            ServiceError::Injected { .. } | ServiceError::Reset => "InjectedFaultException",
        }
    }

    /// The fully qualified `typeName`, as the real service writes it.
    pub fn type_name(&self) -> String {
        format!(
            "GitHub.Actions.Runtime.WebApi.{}, GitHub.Actions.Runtime.WebApi",
            self.exception()
        )
    }
}

impl IntoResponse for ServiceError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({
            "typeName": self.type_name(),
            "message": self.to_string(),
        });
        let mut response = (self.status(), Json(body)).into_response();
        match self {
            ServiceError::Injected {
                retry_after_secs: Some(secs),
                ..
            } => {
                response
                    .headers_mut()
                    .insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
            }
            ServiceError::Reset => {
                response.extensions_mut().insert(ResetConnection);
            }
            _ => {}
        }
        response
    }
}

/// The fake could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: std::net::SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A configured RSA key is not a usable PEM key.
    #[error("the {which} is not a usable RSA PEM key: {source}")]
    BadKey {
        /// Which key.
        which: &'static str,
        /// Why.
        #[source]
        source: jsonwebtoken::errors::Error,
    },
}
