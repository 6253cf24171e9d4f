//! The endpoints the fake serves, by stable name.
//!
//! One enum names every protocol endpoint so that fault injection and call
//! counters speak the same language, in Rust and over the control API
//! (`"remove-runner"`, `"get-message"`, ...). The names are part of the fake's
//! contract with tests and the demo: renaming one breaks their scripts, so
//! add variants rather than rename them.
//!
//! The control API itself (`/_fake/...`) is deliberately not an endpoint: it is
//! never counted and cannot be faulted, so a test can always reach it.

use std::fmt;
use std::str::FromStr;

use http::Method;
use serde::{Deserialize, Serialize};

/// A protocol endpoint of the fake: GitHub API, Actions service, message
/// queue, or the runner-facing side that the runner simulator plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Endpoint {
    /// `POST /api/v3/app/installations/{id}/access_tokens` (GitHub App auth).
    AppInstallationToken,
    /// `POST /api/v3/{orgs|repos|enterprises}/.../actions/runners/registration-token`.
    RegistrationToken,
    /// `POST /api/v3/actions/runner-registration`: the Actions service URL and admin token.
    RunnerRegistration,
    /// `GET _apis/runtime/runnergroups/?groupName=`.
    GetRunnerGroupByName,
    /// `GET _apis/runtime/runnerscalesets?runnerGroupId=&name=`.
    GetScaleSetByName,
    /// `GET _apis/runtime/runnerscalesets/{id}`.
    GetScaleSet,
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
    /// `GET <messageQueueUrl>`: the long poll.
    GetMessage,
    /// `DELETE <messageQueueUrl>/{messageId}`: the acknowledgement.
    DeleteMessage,
    /// `POST _apis/runtime/runnerscalesets/{id}/acquirejobs`.
    AcquireJobs,
    /// `POST /_runner/connect`: a runner presents its JIT config and goes online.
    RunnerConnect,
    /// `POST /_runner/job`: a runner long-polls for its assigned job.
    RunnerJob,
    /// `POST /_runner/complete`: a runner reports its job done and deregisters.
    RunnerComplete,
    /// `POST /_runner/vanished`: the runner's pod was killed; its runner went away.
    RunnerVanished,
}

/// Where the Actions service lives under the fake's root; `{tenant}` is the
/// number handed out by runner-registration.
const SERVICE: &str = "/tenant/{tenant}/_apis";
/// Where each session's message queue lives. A separate prefix, like the real
/// broker host, so a client that mixes up the two base URLs fails loudly.
const QUEUE: &str = "/broker/{session}/messages";

impl Endpoint {
    /// Every endpoint, in declaration order.
    pub const ALL: [Endpoint; 23] = [
        Endpoint::AppInstallationToken,
        Endpoint::RegistrationToken,
        Endpoint::RunnerRegistration,
        Endpoint::GetRunnerGroupByName,
        Endpoint::GetScaleSetByName,
        Endpoint::GetScaleSet,
        Endpoint::CreateScaleSet,
        Endpoint::UpdateScaleSet,
        Endpoint::DeleteScaleSet,
        Endpoint::GenerateJitConfig,
        Endpoint::GetRunner,
        Endpoint::GetRunnerByName,
        Endpoint::RemoveRunner,
        Endpoint::CreateSession,
        Endpoint::RefreshSession,
        Endpoint::DeleteSession,
        Endpoint::GetMessage,
        Endpoint::DeleteMessage,
        Endpoint::AcquireJobs,
        Endpoint::RunnerConnect,
        Endpoint::RunnerJob,
        Endpoint::RunnerComplete,
        Endpoint::RunnerVanished,
    ];

    /// The stable name used by the control API and in counters.
    pub fn name(self) -> &'static str {
        match self {
            Endpoint::AppInstallationToken => "app-installation-token",
            Endpoint::RegistrationToken => "registration-token",
            Endpoint::RunnerRegistration => "runner-registration",
            Endpoint::GetRunnerGroupByName => "get-runner-group-by-name",
            Endpoint::GetScaleSetByName => "get-scale-set-by-name",
            Endpoint::GetScaleSet => "get-scale-set",
            Endpoint::CreateScaleSet => "create-scale-set",
            Endpoint::UpdateScaleSet => "update-scale-set",
            Endpoint::DeleteScaleSet => "delete-scale-set",
            Endpoint::GenerateJitConfig => "generate-jit-config",
            Endpoint::GetRunner => "get-runner",
            Endpoint::GetRunnerByName => "get-runner-by-name",
            Endpoint::RemoveRunner => "remove-runner",
            Endpoint::CreateSession => "create-session",
            Endpoint::RefreshSession => "refresh-session",
            Endpoint::DeleteSession => "delete-session",
            Endpoint::GetMessage => "get-message",
            Endpoint::DeleteMessage => "delete-message",
            Endpoint::AcquireJobs => "acquire-jobs",
            Endpoint::RunnerConnect => "runner-connect",
            Endpoint::RunnerJob => "runner-job",
            Endpoint::RunnerComplete => "runner-complete",
            Endpoint::RunnerVanished => "runner-vanished",
        }
    }

    /// The HTTP method and the axum route pattern the endpoint is served on.
    ///
    /// The router is built from these, and the counting/fault layer maps a
    /// matched route back to its endpoint with [`Endpoint::from_route`], so
    /// the two cannot drift apart.
    pub(crate) fn route(self) -> (Method, String) {
        let (method, path) = match self {
            Endpoint::AppInstallationToken => (
                Method::POST,
                "/api/v3/app/installations/{installation}/access_tokens".to_owned(),
            ),
            // Served on three patterns (org, repo, enterprise); this is the
            // org one, the others map to the same endpoint.
            Endpoint::RegistrationToken => (
                Method::POST,
                "/api/v3/orgs/{org}/actions/runners/registration-token".to_owned(),
            ),
            Endpoint::RunnerRegistration => (
                Method::POST,
                "/api/v3/actions/runner-registration".to_owned(),
            ),
            Endpoint::GetRunnerGroupByName => {
                (Method::GET, format!("{SERVICE}/runtime/runnergroups"))
            }
            Endpoint::GetScaleSetByName => {
                (Method::GET, format!("{SERVICE}/runtime/runnerscalesets"))
            }
            Endpoint::GetScaleSet => (
                Method::GET,
                format!("{SERVICE}/runtime/runnerscalesets/{{scale_set}}"),
            ),
            Endpoint::CreateScaleSet => {
                (Method::POST, format!("{SERVICE}/runtime/runnerscalesets"))
            }
            Endpoint::UpdateScaleSet => (
                Method::PATCH,
                format!("{SERVICE}/runtime/runnerscalesets/{{scale_set}}"),
            ),
            Endpoint::DeleteScaleSet => (
                Method::DELETE,
                format!("{SERVICE}/runtime/runnerscalesets/{{scale_set}}"),
            ),
            Endpoint::GenerateJitConfig => (
                Method::POST,
                format!("{SERVICE}/runtime/runnerscalesets/{{scale_set}}/generatejitconfig"),
            ),
            Endpoint::GetRunner => (
                Method::GET,
                format!("{SERVICE}/distributedtask/pools/{{pool}}/agents/{{runner}}"),
            ),
            Endpoint::GetRunnerByName => (
                Method::GET,
                format!("{SERVICE}/distributedtask/pools/{{pool}}/agents"),
            ),
            Endpoint::RemoveRunner => (
                Method::DELETE,
                format!("{SERVICE}/distributedtask/pools/{{pool}}/agents/{{runner}}"),
            ),
            Endpoint::CreateSession => (
                Method::POST,
                format!("{SERVICE}/runtime/runnerscalesets/{{scale_set}}/sessions"),
            ),
            Endpoint::RefreshSession => (
                Method::PATCH,
                format!("{SERVICE}/runtime/runnerscalesets/{{scale_set}}/sessions/{{session}}"),
            ),
            Endpoint::DeleteSession => (
                Method::DELETE,
                format!("{SERVICE}/runtime/runnerscalesets/{{scale_set}}/sessions/{{session}}"),
            ),
            Endpoint::GetMessage => (Method::GET, QUEUE.to_owned()),
            Endpoint::DeleteMessage => (Method::DELETE, format!("{QUEUE}/{{message}}")),
            Endpoint::AcquireJobs => (
                Method::POST,
                format!("{SERVICE}/runtime/runnerscalesets/{{scale_set}}/acquirejobs"),
            ),
            Endpoint::RunnerConnect => (Method::POST, "/_runner/connect".to_owned()),
            Endpoint::RunnerJob => (Method::POST, "/_runner/job".to_owned()),
            Endpoint::RunnerComplete => (Method::POST, "/_runner/complete".to_owned()),
            Endpoint::RunnerVanished => (Method::POST, "/_runner/vanished".to_owned()),
        };
        (method, path)
    }

    /// Extra route patterns served by the same endpoint.
    pub(crate) fn alias_routes(self) -> Vec<String> {
        match self {
            Endpoint::RegistrationToken => vec![
                "/api/v3/repos/{owner}/{repo}/actions/runners/registration-token".to_owned(),
                "/api/v3/enterprises/{enterprise}/actions/runners/registration-token".to_owned(),
            ],
            // The client asks for `runnergroups/?groupName=`, with the slash.
            Endpoint::GetRunnerGroupByName => {
                vec![format!("{SERVICE}/runtime/runnergroups/")]
            }
            Endpoint::GetScaleSetByName | Endpoint::CreateScaleSet => {
                vec![format!("{SERVICE}/runtime/runnerscalesets/")]
            }
            _ => Vec::new(),
        }
    }

    /// The endpoint served on `path` (an axum route pattern) for `method`.
    pub(crate) fn from_route(method: &Method, path: &str) -> Option<Endpoint> {
        Endpoint::ALL.into_iter().find(|endpoint| {
            let (m, p) = endpoint.route();
            m == method && (p == path || endpoint.alias_routes().iter().any(|a| a == path))
        })
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The name given is not one of [`Endpoint::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an endpoint of the fake Actions service")]
pub struct UnknownEndpoint(pub String);

impl FromStr for Endpoint {
    type Err = UnknownEndpoint;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Endpoint::ALL
            .into_iter()
            .find(|e| e.name() == s)
            .ok_or_else(|| UnknownEndpoint(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for endpoint in Endpoint::ALL {
            assert!(seen.insert(endpoint.name()), "duplicate name {endpoint}");
            assert_eq!(endpoint.name().parse::<Endpoint>(), Ok(endpoint));
            let json = serde_json::to_string(&endpoint).unwrap();
            assert_eq!(json, format!("\"{}\"", endpoint.name()));
        }
        assert!("no-such-endpoint".parse::<Endpoint>().is_err());
    }

    #[test]
    fn every_route_maps_back_to_its_endpoint() {
        let mut routes = std::collections::HashSet::new();
        for endpoint in Endpoint::ALL {
            let (method, path) = endpoint.route();
            assert!(
                routes.insert((method.clone(), path.clone())),
                "{endpoint} route reused"
            );
            assert_eq!(Endpoint::from_route(&method, &path), Some(endpoint));
            for alias in endpoint.alias_routes() {
                assert_eq!(Endpoint::from_route(&method, &alias), Some(endpoint));
            }
        }
    }
}
