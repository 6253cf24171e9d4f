//! The calls the client makes, named once.

use std::fmt;

/// One kind of call to GitHub or the Actions service.
///
/// Errors name the call that failed, and the same names serve as metric
/// labels, so a dashboard and an error message agree on what "create_session"
/// means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// `POST /app/installations/{id}/access_tokens` on the GitHub API.
    InstallationToken,
    /// `POST …/actions/runners/registration-token` on the GitHub API.
    RegistrationToken,
    /// `POST /actions/runner-registration` on the GitHub API.
    RunnerRegistration,
    /// `GET _apis/runtime/runnergroups/?groupName=`.
    GetRunnerGroup,
    /// `GET _apis/runtime/runnerscalesets?runnerGroupId=&name=`.
    GetScaleSet,
    /// `GET _apis/runtime/runnerscalesets/{id}`.
    GetScaleSetById,
    /// `POST _apis/runtime/runnerscalesets`.
    CreateScaleSet,
    /// `PATCH _apis/runtime/runnerscalesets/{id}`.
    UpdateScaleSet,
    /// `DELETE _apis/runtime/runnerscalesets/{id}`.
    DeleteScaleSet,
    /// `POST _apis/runtime/runnerscalesets/{id}/generatejitconfig`.
    GenerateJitConfig,
    /// `GET _apis/distributedtask/pools/0/agents/{id}`.
    GetRunner,
    /// `GET _apis/distributedtask/pools/0/agents?agentName=`.
    GetRunnerByName,
    /// `DELETE _apis/distributedtask/pools/0/agents/{id}`.
    RemoveRunner,
    /// `POST _apis/runtime/runnerscalesets/{id}/sessions`.
    CreateSession,
    /// `PATCH _apis/runtime/runnerscalesets/{id}/sessions/{session}`.
    RefreshSession,
    /// `DELETE _apis/runtime/runnerscalesets/{id}/sessions/{session}`.
    DeleteSession,
    /// `GET <messageQueueUrl>`, the long poll.
    GetMessage,
    /// `DELETE <messageQueueUrl>/{messageId}`.
    DeleteMessage,
    /// `POST _apis/runtime/runnerscalesets/{id}/acquirejobs`.
    AcquireJobs,
}

impl Operation {
    /// Whether the call creates an object the service names uniquely (a
    /// scale set by name, a runner by name, the one session of a scale set),
    /// so a second attempt after a first that may have acted could meet the
    /// first one's result.
    pub fn creates_something(self) -> bool {
        matches!(
            self,
            Self::CreateScaleSet | Self::GenerateJitConfig | Self::CreateSession
        )
    }

    /// Whether the call removes something, so that "it is not there" is the
    /// state the call was after: a 404 on a retry whose first attempt may
    /// have acted means the first attempt did the work.
    pub fn deletes_something(self) -> bool {
        matches!(
            self,
            Self::RemoveRunner | Self::DeleteScaleSet | Self::DeleteSession | Self::DeleteMessage
        )
    }

    /// The snake-case name used in errors, logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InstallationToken => "installation_token",
            Self::RegistrationToken => "registration_token",
            Self::RunnerRegistration => "runner_registration",
            Self::GetRunnerGroup => "get_runner_group",
            Self::GetScaleSet => "get_scale_set",
            Self::GetScaleSetById => "get_scale_set_by_id",
            Self::CreateScaleSet => "create_scale_set",
            Self::UpdateScaleSet => "update_scale_set",
            Self::DeleteScaleSet => "delete_scale_set",
            Self::GenerateJitConfig => "generate_jit_config",
            Self::GetRunner => "get_runner",
            Self::GetRunnerByName => "get_runner_by_name",
            Self::RemoveRunner => "remove_runner",
            Self::CreateSession => "create_session",
            Self::RefreshSession => "refresh_session",
            Self::DeleteSession => "delete_session",
            Self::GetMessage => "get_message",
            Self::DeleteMessage => "delete_message",
            Self::AcquireJobs => "acquire_jobs",
        }
    }

    /// Calls on an existing message session, whose bare 404 means the
    /// session is gone.
    pub(crate) fn is_session_call(self) -> bool {
        matches!(self, Self::RefreshSession | Self::DeleteSession)
    }

    /// Calls addressed to one scale set by id, whose bare 404 means the scale
    /// set is gone.
    pub(crate) fn addresses_scale_set(self) -> bool {
        matches!(
            self,
            Self::GetScaleSetById
                | Self::UpdateScaleSet
                | Self::DeleteScaleSet
                | Self::GenerateJitConfig
                | Self::CreateSession
        )
    }

    /// Calls whose successful response holds a credential (a token, or a
    /// JIT configuration), so its decode errors must not quote the body.
    pub(crate) fn response_carries_secret(self) -> bool {
        matches!(
            self,
            Self::InstallationToken
                | Self::RegistrationToken
                | Self::RunnerRegistration
                | Self::GenerateJitConfig
                | Self::CreateSession
                | Self::RefreshSession
        )
    }

    /// The most bytes a successful response of this call is read to.
    ///
    /// Generous for what the protocol sends (a message batch of a few
    /// hundred jobs is well under a MiB, everything else a few KiB) and far
    /// below what would hurt a host serving hundreds of scale sets at once.
    pub(crate) fn body_limit(self) -> usize {
        match self {
            Self::GetMessage => 4 * 1024 * 1024,
            _ => 1024 * 1024,
        }
    }

    /// Calls authorised by the message queue token rather than the admin
    /// token; a 401 on them means the queue token expired.
    pub(crate) fn uses_queue_token(self) -> bool {
        matches!(
            self,
            Self::GetMessage | Self::DeleteMessage | Self::AcquireJobs
        )
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
