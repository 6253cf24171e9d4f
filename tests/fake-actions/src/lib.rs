//! A fake of the GitHub Actions service, faithful to the protocol a scale-set
//! controller speaks, with the knobs tests need to make it misbehave.
//!
//! ```no_run
//! # async fn demo() -> Result<(), fake_actions::StartError> {
//! use fake_actions::{FakeActions, FakeConfig, JobSpec};
//! let fake = FakeActions::start(FakeConfig::default()).await?;
//! let config_url = fake.org_url("octo-org"); // {url}/octo-org
//! // ... point the client at config_url with fake.pat() or fake.app_credentials()
//! fake.control().enqueue_jobs(JobSpec::new(3, &["linux"]));
//! # Ok(()) }
//! ```
//!
//! What it serves (paths relative to [`FakeActions::url`]):
//!
//! * GitHub API, GHES style under `/api/v3`: App installation tokens (the JWT
//!   is verified against the App's public key), registration tokens for an
//!   org, repo or enterprise (PAT or installation token), and
//!   runner-registration, which answers the Actions service base
//!   `{url}/tenant/{n}/` and an RS256 admin JWT with `exp`.
//! * The Actions service under `/tenant/{n}/_apis/...`: runner groups, scale
//!   sets, JIT configs, agents, sessions and acquirejobs. The admin token is
//!   checked on every call (401 when expired or invalid); `api-version` is
//!   accepted and ignored.
//! * The message queue under `/broker/{session}/messages`, with its own token.
//!   The `X-ScaleSetMaxCapacity` header of each poll bounds how many jobs
//!   the service assigns to the scale set at once (no header: unbounded).
//!   Acquired jobs are assigned to the set with a `JobAssigned` that carries
//!   the new `totalAssignedJobs`, so a listener scaling on statistics alone
//!   sees them; a job no runner of the set takes within
//!   [`FakeConfig::assignment_timeout`] is cancelled and offered again, up to
//!   [`MAX_REQUEUES`] times (the rules are in the `state` module).
//! * The runner side under `/_runner/...`: what a runner does with its JIT
//!   config (connect, take its job, complete it, or vanish). The runner
//!   simulator plays it; tests may too.
//! * The control API under `/_fake/...` (see [`control`](crate::Control)).
//!
//! Faithfulness is the point: a client that passes against this fake should
//! fail against the real service only where the real service is undocumented.
//! Where the real service's behaviour is known only from observation, the
//! choice made is named in the doc of the state rule that implements it.

mod auth;
mod control;
mod endpoint;
mod error;
mod jit;
mod model;
mod server;
mod state;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use control::{Control, Snapshot};
pub use endpoint::{Endpoint, UnknownEndpoint};
pub use error::{ServiceError, StartError};
pub use jit::{JitConfig, JitConfigError};
pub use model::{
    Acquisition, Counters, EndpointCount, Fault, FaultKind, HISTORY_LIMIT, JobHistory, JobOutcome,
    JobPhase, JobSnapshot, JobSpec, Ledger, MAX_REQUEUES, PostedMessage, RunnerSnapshot,
    RuntimeSettings, ScaleSetSnapshot, SessionConflict, SessionHistory, SessionRecord,
    SettingsPatch, VanishedJobPolicy,
};
pub use state::{RunnerJob, Statistics};

/// The GitHub App private key the default configuration trusts (PKCS#1, as
/// GitHub hands them out). A test credential: it protects nothing.
pub const TEST_APP_PRIVATE_KEY: &str = include_str!("../keys/app-private.pem");
/// The public half of [`TEST_APP_PRIVATE_KEY`].
pub const TEST_APP_PUBLIC_KEY: &str = include_str!("../keys/app-public.pem");
/// The key the fake signs admin tokens with.
const TEST_SERVICE_KEY: &str = include_str!("../keys/service-private.pem");
/// The public half of the service key.
const TEST_SERVICE_PUBLIC_KEY: &str = include_str!("../keys/service-public.pem");

/// The PAT the default configuration accepts.
pub const TEST_PAT: &str = "ghp_fakeActionsTestToken0000000000000000";

/// How the fake behaves.
#[derive(Clone)]
pub struct FakeConfig {
    /// Where to listen; port 0 picks a free one.
    pub listen: SocketAddr,
    /// How long an empty long poll (GetMessage, and a runner waiting for its
    /// job) waits before answering 202/204. The real service waits about 50 s;
    /// tests want about a second so that a poll in flight never slows them.
    pub long_poll: Duration,
    /// Lifetime of the admin token from runner-registration; short values
    /// exercise the client's renewal (it renews within 60 s of expiry).
    pub admin_token_lifetime: Duration,
    /// Lifetime of App installation tokens.
    pub installation_token_lifetime: Duration,
    /// Lifetime of registration tokens.
    pub registration_token_lifetime: Duration,
    /// The PAT the GitHub API accepts.
    pub pat: String,
    /// The App whose JWTs the fake accepts.
    pub app: AppCredentials,
    /// The PEM public key that verifies the App's JWTs.
    pub app_public_key_pem: String,
    /// Prefix Actions-service and message-queue JSON bodies with a UTF-8 BOM,
    /// as the real service sometimes does.
    pub utf8_bom: bool,
    /// What happens to a job whose runner vanished.
    pub vanished_jobs: VanishedJobPolicy,
    /// How long a job assigned to a scale set waits for a runner of the set
    /// to take it before the service cancels it and offers it again (see
    /// [`RuntimeSettings`]; changeable while running). The real service's
    /// figure is not published, and it grows the wait on each requeue; the
    /// fake keeps one figure so a test's timing is predictable. A minute is
    /// long enough for any runner a test starts to come online, and short
    /// enough that a listener which never scales sees its jobs come back;
    /// tests of the timeout itself set it to a fraction of a second.
    pub assignment_timeout: Duration,
    /// At most this many job messages per queue message (the service's 50).
    pub max_batch: usize,
    /// Runner groups besides `Default` (id 1), given ids 2, 3, ... in order.
    pub extra_runner_groups: Vec<String>,
    /// How long a message session may go without a poll before the service
    /// expires it, so that a new session for its scale set can be created.
    /// A listener that died (or whose session-creation answer was lost)
    /// leaves its session behind; the real service expires it after
    /// minutes of silence, and until then every new session conflicts.
    pub session_idle_expiry: Duration,
}

impl Default for FakeConfig {
    fn default() -> Self {
        FakeConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            long_poll: Duration::from_secs(1),
            admin_token_lifetime: Duration::from_secs(600),
            installation_token_lifetime: Duration::from_secs(3600),
            registration_token_lifetime: Duration::from_secs(3600),
            pat: TEST_PAT.to_owned(),
            app: AppCredentials {
                app_id: 424_242,
                client_id: "Iv1.fakeactions0001".to_owned(),
                installation_id: 4_242_424,
                private_key_pem: TEST_APP_PRIVATE_KEY.to_owned(),
            },
            app_public_key_pem: TEST_APP_PUBLIC_KEY.to_owned(),
            utf8_bom: false,
            vanished_jobs: VanishedJobPolicy::Requeue,
            assignment_timeout: Duration::from_secs(60),
            max_batch: 50,
            extra_runner_groups: Vec::new(),
            session_idle_expiry: Duration::from_secs(120),
        }
    }
}

/// Keeps the PAT and the App key out of logs.
impl std::fmt::Debug for FakeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeConfig")
            .field("listen", &self.listen)
            .field("long_poll", &self.long_poll)
            .field("admin_token_lifetime", &self.admin_token_lifetime)
            .field("app", &self.app)
            .field("utf8_bom", &self.utf8_bom)
            .field("vanished_jobs", &self.vanished_jobs)
            .field("assignment_timeout", &self.assignment_timeout)
            .field("max_batch", &self.max_batch)
            .field("session_idle_expiry", &self.session_idle_expiry)
            .finish_non_exhaustive()
    }
}

/// A GitHub App installation as a client needs it.
#[derive(Clone, PartialEq, Eq)]
pub struct AppCredentials {
    /// The App id (the JWT's `iss`).
    pub app_id: u64,
    /// The App's client id, also accepted as `iss`.
    pub client_id: String,
    /// The installation to ask tokens for.
    pub installation_id: u64,
    /// The App's private key, PEM.
    pub private_key_pem: String,
}

impl std::fmt::Debug for AppCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppCredentials")
            .field("app_id", &self.app_id)
            .field("client_id", &self.client_id)
            .field("installation_id", &self.installation_id)
            .field("private_key_pem", &"<redacted>")
            .finish()
    }
}

/// A running fake; stops when dropped.
pub struct FakeActions {
    url: String,
    addr: SocketAddr,
    control: Control,
    config: FakeConfig,
    shutdown: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl FakeActions {
    /// Binds and starts serving in the background of the current runtime.
    pub async fn start(config: FakeConfig) -> Result<FakeActions, StartError> {
        let keys = auth::Keys::new(
            TEST_SERVICE_KEY,
            TEST_SERVICE_PUBLIC_KEY,
            &config.app_public_key_pem,
        )?;
        let listener =
            TcpListener::bind(config.listen)
                .await
                .map_err(|source| StartError::Bind {
                    addr: config.listen,
                    source,
                })?;
        let addr = listener.local_addr().map_err(|source| StartError::Bind {
            addr: config.listen,
            source,
        })?;
        let url = server::local_url(addr);
        let state = state::State::new(state::StateSettings {
            base_url: url.clone(),
            vanished_jobs: config.vanished_jobs,
            max_batch: config.max_batch,
            extra_runner_groups: config.extra_runner_groups.clone(),
            runtime: RuntimeSettings {
                assignment_timeout: config.assignment_timeout,
            },
            pat: config.pat.clone(),
            session_idle_expiry: config.session_idle_expiry,
        });
        let settings = server::Settings {
            long_poll: config.long_poll,
            admin_token_lifetime: config.admin_token_lifetime,
            installation_token_lifetime: config.installation_token_lifetime,
            registration_token_lifetime: config.registration_token_lifetime,
            app_id: config.app.app_id,
            client_id: config.app.client_id.clone(),
            installation_id: config.app.installation_id,
            app_private_key_pem: Arc::from(config.app.private_key_pem.as_str()),
            utf8_bom: config.utf8_bom,
        };
        let shared = Arc::new(server::Shared::new(state, keys, settings));
        let router = server::router(shared.clone());
        let shutdown = CancellationToken::new();
        let task = tokio::spawn({
            let serving = server::serve(listener, router, shutdown.clone());
            let expiring = server::expire_unclaimed_jobs(shared.clone(), shutdown.clone());
            async move {
                tokio::join!(serving, expiring);
            }
        });
        tracing::info!(%url, "fake Actions service listening");
        Ok(FakeActions {
            url,
            addr,
            control: Control::new(shared),
            config,
            shutdown,
            task: Some(task),
        })
    }

    /// The root URL, `http://127.0.0.1:PORT`, without a trailing slash.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The GitHub configuration URL of an organisation: `{url}/{org}`.
    pub fn org_url(&self, org: &str) -> String {
        format!("{}/{org}", self.url)
    }

    /// The GitHub configuration URL of a repository: `{url}/{owner}/{repo}`.
    pub fn repo_url(&self, owner: &str, repo: &str) -> String {
        format!("{}/{owner}/{repo}", self.url)
    }

    /// The GitHub configuration URL of an enterprise: `{url}/enterprises/{ent}`.
    pub fn enterprise_url(&self, enterprise: &str) -> String {
        format!("{}/enterprises/{enterprise}", self.url)
    }

    /// The PAT the fake started with (accepted until
    /// [`Control::rotate_pat`] replaces it).
    pub fn pat(&self) -> &str {
        &self.config.pat
    }

    /// App credentials whose JWTs the fake accepts.
    pub fn app_credentials(&self) -> AppCredentials {
        self.config.app.clone()
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &FakeConfig {
        &self.config
    }

    /// The in-process control handle.
    pub fn control(&self) -> Control {
        self.control.clone()
    }

    /// Stops serving and waits for the accept loop to end; connections in
    /// flight are cut.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for FakeActions {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl std::fmt::Debug for FakeActions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeActions")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}
