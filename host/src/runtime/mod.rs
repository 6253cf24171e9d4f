//! `arcwright run`: the process the controllers run in.
//!
//! The runtime owns what every controller shares and none should build for
//! itself: the Kubernetes client, the one metrics registry, the policy
//! loader, the Actions client options, the probes and the shutdown. A
//! controller, the listener or the unregistration pool is a [`Component`]:
//! a name and a function from a [`Context`] to a future. Wiring one is one
//! line in [`wiring::components`].
//!
//! # The life of the process
//!
//! 1. The flags ([`options::RunOptions`]) are parsed and the client built;
//!    a bad kubeconfig stops the process before anything is served.
//! 2. The HTTP endpoints come up (`/healthz`, `/readyz`, `/metrics`,
//!    [`server`]), then every component is started on its own task with a
//!    closed [`ReadinessGate`]; `/readyz` is 200 once all are open.
//! 3. On SIGTERM or SIGINT the root [`CancellationToken`] is cancelled,
//!    `/readyz` turns 503 and the runtime waits, at most
//!    `--shutdown-timeout`, for every component to return: this is when
//!    listeners delete their message sessions (a session left behind blocks
//!    the next holder until the service expires it). `/metrics` keeps
//!    answering meanwhile. The process exits 0 when all returned in time.
//!
//! A component that fails (returns an error or panics) before shutdown
//! takes the process down the same way, and the process exits non-zero:
//! a controller missing one of its parts would look healthy while jobs
//! wait, so the kubelet restarting it is the better outcome. A component
//! that returns `Ok` early has simply finished (a warm-up), and the rest
//! go on.
//!
//! With `--leader-elect`, components that must run on one replica only
//! (the controllers and the listeners, [`Component::leader_only`]) start
//! once this replica holds the Lease; losing it stops the process
//! ([`leader`]).

pub mod debug_endpoint;
pub mod leader;
pub mod metrics;
pub mod options;
pub mod rate_limit;
pub mod readiness;
pub mod server;
pub mod shards;
pub mod wiring;

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use kube::Client;
use prometheus_client::metrics::counter::Counter;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::actions::{ActionsMetrics, ClientOptions, Secret};
use crate::controllers::ephemeral_runner::SlackConfig;
use crate::controllers::ephemeral_runner_set::SetMetrics;
use crate::controllers::metrics::ControllerMetrics;
use crate::credentials::ActionsClients;
use crate::listener::ListenerMetrics;
use crate::policy::defaults::{DefaultPolicies, DefaultPoliciesError};
use crate::policy::loader::PolicyLoader;
use crate::policy::metrics::PolicyMetrics;
use crate::policy::reporter::TracingReporter;
use crate::policy::{EngineConfig, PolicyEngine, PolicyError, PolicyReporter};
use crate::slack::InteractionsConfig;
use crate::unregistration::UnregistrationMetrics;
pub use metrics::MetricsRegistry;
use options::{DebugOptions, KubeSource, RunOptions, WatchScope};
pub use readiness::{Readiness, ReadinessGate};

/// Any component's error: each layer keeps its own error enum, and the
/// runtime only reports it.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why `arcwright run` stopped other than by a clean shutdown.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The kubeconfig file named by `--kubeconfig` is unusable.
    #[error("the kubeconfig {path} cannot be used: {source}")]
    Kubeconfig {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// Neither a kubeconfig nor the in-cluster service account was found.
    #[error("no Kubernetes configuration found (give --kubeconfig, or run in a pod): {0}")]
    Infer(#[source] kube::config::InferConfigError),
    /// `--in-cluster` outside a pod, or a service account that is unusable.
    #[error("the in-cluster configuration cannot be used: {0}")]
    InCluster(#[source] kube::config::InClusterError),
    /// The client could not be built from the configuration.
    #[error("the Kubernetes client cannot be built: {0}")]
    Client(#[source] kube::Error),
    /// The policy engine could not be created.
    #[error("the policy engine cannot start: {0}")]
    Policy(#[source] PolicyError),
    /// The async runtime or the signal handlers could not be set up.
    #[error("the process cannot be set up: {0}")]
    Setup(#[source] std::io::Error),
    /// The endpoints' address cannot be bound.
    #[error("cannot listen on {address}: {source}")]
    Bind {
        /// `--listen-address`.
        address: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The hold API's TLS certificate or key cannot be used.
    #[error("the debug endpoint's TLS: {0}")]
    DebugTls(String),
    /// The endpoints' server stopped.
    #[error("the HTTP server stopped: {0}")]
    Serve(#[source] std::io::Error),
    /// A component returned an error.
    #[error("{name} failed: {source}")]
    ComponentFailed {
        /// The component.
        name: &'static str,
        /// Its error.
        #[source]
        source: BoxError,
    },
    /// A component panicked.
    #[error("{name} panicked")]
    ComponentPanicked {
        /// The component.
        name: &'static str,
    },
    /// Leader election could not start (the Lease cannot be read or
    /// created).
    #[error("leader election cannot start: {0}")]
    Election(#[source] leader::ElectionError),
    /// The Slack signing secret's file is unreadable or empty.
    #[error("the Slack signing secret cannot be read from {path}: {reason}")]
    SigningSecret {
        /// `--slack-signing-secret-file`.
        path: String,
        /// Why.
        reason: String,
    },
    /// The default policies' file cannot be read.
    #[error("the default policies cannot be read from {path}: {source}")]
    DefaultPoliciesFile {
        /// `--default-policies`.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The default policies are refused.
    #[error("{0}")]
    DefaultPolicies(#[from] DefaultPoliciesError),
    /// Another replica took the Lease while this one led.
    #[error("leadership was lost; restarting as a standby")]
    LeadershipLost,
    /// Components were still running when the shutdown bound ran out; they
    /// were abandoned.
    #[error("still running {timeout:?} after shutdown began: {}", .still_running.join(", "))]
    ShutdownTimeout {
        /// `--shutdown-timeout`.
        timeout: Duration,
        /// The components that had not returned.
        still_running: Vec<&'static str>,
    },
}

/// The policy machinery, created once per process and shared by every
/// component that makes policy decisions.
#[derive(Clone)]
pub struct PolicyServices {
    /// Resolves policy references (bundled or ConfigMap) into deciders;
    /// one loader, so one ConfigMap watch however many objects follow it.
    pub loader: PolicyLoader,
    /// `arcwright_policy_*`, registered in the shared registry; handed to
    /// deciders (`Decider::with_metrics`).
    pub metrics: PolicyMetrics,
    /// Logs and counts policy failures; a controller wraps it to add its
    /// conditions and events.
    pub reporter: Arc<dyn PolicyReporter>,
}

/// What every component is given: the parts shared by the process, and
/// its own shutdown signal and readiness gate.
#[derive(Clone)]
pub struct Context {
    /// The component's name, as given to [`Component::new`].
    pub name: &'static str,
    /// The client, the registry, the policy loader and the options.
    pub shared: Shared,
    /// Cancelled when the process shuts down: return soon after, having
    /// released what others would wait for (message sessions, leases).
    pub shutdown: CancellationToken,
    /// This component's say in `/readyz`: open it once caches are synced.
    pub ready: ReadinessGate,
}

type Start = Box<dyn FnOnce(Context) -> BoxFuture<'static, Result<(), BoxError>> + Send>;

/// A named part of the process, started once with its [`Context`].
///
/// The future runs on a task of its own until it returns. It must watch
/// `ctx.shutdown` and return when it is cancelled; it should open
/// `ctx.ready` once it can do its work.
pub struct Component {
    name: &'static str,
    start: Start,
    leader_only: bool,
}

impl Component {
    /// A component called `name` (used in logs, `/readyz` and errors) that
    /// runs `start(ctx)`.
    pub fn new<F, Fut, E>(name: &'static str, start: F) -> Self
    where
        F: FnOnce(Context) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<BoxError>,
    {
        Self {
            name,
            start: Box::new(move |ctx| {
                let future = start(ctx);
                Box::pin(async move { future.await.map_err(Into::into) })
            }),
            leader_only: false,
        }
    }

    /// Runs only on the elected leader when leader election is on: started
    /// once this replica holds the Lease. Its readiness gate is open while
    /// it waits (a standby is healthy), closed from when it starts until it
    /// opens it again.
    pub fn leader_only(mut self) -> Self {
        self.leader_only = true;
        self
    }

    /// The component's name.
    pub fn name(&self) -> &'static str {
        self.name
    }
}

/// What the process shares among its components, created once.
#[derive(Clone)]
pub struct Shared {
    /// The Kubernetes client: the controllers', the listeners' and the
    /// pool's, held to `--kube-qps` when it is set.
    pub client: Client,
    /// The client of the Leases (the leader's, the shards'). Not held to
    /// `--kube-qps`: the limit is one first-come queue, and a burst of
    /// runner writes in it would hold renewals past the renew deadline, so
    /// a busy leader would step down and again and again hand its scale
    /// sets to a standby exactly when it has the most work. A renewal is a
    /// request or two every few seconds, far below any limit.
    pub coordination: Client,
    /// The client of the token and access reviews of the hold and
    /// recording APIs: a budget of its own at the same rate, so callers of
    /// those APIs neither wait behind the controllers nor take their
    /// share (each client address is held to its own budget besides,
    /// [`crate::access::Throttle`]).
    pub reviews: Client,
    /// The namespaces to watch.
    pub scope: WatchScope,
    /// Where components register their metrics.
    pub metrics: MetricsRegistry,
    /// The policy loader and its metrics and reporter.
    pub policy: PolicyServices,
    /// The options every Actions client is built with (the user agent
    /// names this arcwright release).
    pub actions: ClientOptions,
    /// How many objects a controller reconciles at once.
    pub reconcile_concurrency: u16,
    /// How many workers the unregistration pool runs.
    pub unregistration_workers: u16,
    /// Failed starts before a runner is given up.
    pub runner_failure_limit: u16,
    /// The first wait between a runner's failed starts.
    pub runner_failure_backoff: Duration,
    /// How long a started runner may take to come online.
    pub registration_timeout: Duration,
    /// The most runners one scale set has.
    pub max_runners_per_scale_set: u32,
    /// The least time from a message to a listener's next poll.
    pub message_batch_window: Duration,
    /// One Actions client per GitHub credential, shared by the
    /// controllers, the unregistration pool and the listeners.
    pub clients: ActionsClients,
    /// The reconcilers' metrics, one set of series for all three.
    pub controllers: ControllerMetrics,
    /// The EphemeralRunnerSets' metrics.
    pub runner_sets: SetMetrics,
    /// The name this host holds message sessions under, as the Actions
    /// service shows it: the pod's name in a cluster.
    pub owner: String,
    /// Held failed runners' Slack settings.
    pub debug: DebugSettings,
    /// The unregistration pools' metrics.
    pub unregistration: UnregistrationMetrics,
    /// The listeners' metrics (`gha_*`, scaling decisions).
    pub listeners: ListenerMetrics,
    /// Every scale set's recording, written by its listener, served by
    /// the recording API.
    pub recordings: crate::recording::Recordings,
    /// The scale sets this replica serves: all of them unless the fleet is
    /// split across replicas ([`shards`]).
    pub shards: crate::sharding::Shards,
    /// What the listeners heard of jobs waiting and the runner sets' terms
    /// of renewal, for the runners finishing their jobs
    /// ([`crate::backlog`]).
    pub backlogs: crate::backlog::Backlogs,
    /// Whether the listeners say what they heard there
    /// (`--renew-in-place`): if not, no runner is renewed in place.
    pub renew_in_place: bool,
    /// Status writes that only inform, for the whole host
    /// (`--status-budget` a second): the runners' and the listeners' job
    /// starts draw on the one budget.
    pub status_budget: crate::controllers::kit::budget::WriteBudget,
    /// The runners the set controller made, for the runner controller's
    /// admission ([`crate::controllers::kit::made`]).
    pub made_runners: crate::controllers::kit::made::MadeRunners,
}

/// What held failed runners need from the flags.
#[derive(Clone, Debug)]
pub struct DebugSettings {
    /// Where failures are posted and what Extend adds.
    pub slack: SlackConfig,
    /// The Slack app's signing secret; without it the interactivity
    /// endpoint is not served.
    pub signing_secret: Option<Secret>,
}

impl DebugSettings {
    /// The settings `options` name, the signing secret read from its file.
    pub fn read(options: &DebugOptions) -> Result<Self, RuntimeError> {
        let signing_secret = match &options.slack_signing_secret_file {
            None => None,
            Some(path) => {
                let failed = |reason: String| RuntimeError::SigningSecret {
                    path: path.display().to_string(),
                    reason,
                };
                let text = std::fs::read_to_string(path).map_err(|e| failed(e.to_string()))?;
                // A mounted Secret often ends in a newline its author never
                // meant as part of the secret.
                let secret = text.trim();
                if secret.is_empty() {
                    return Err(failed("the file is empty".into()));
                }
                Some(Secret::new(secret))
            }
        };
        Ok(Self {
            slack: SlackConfig {
                api_url: options.slack_api_url.clone(),
                extend_by: options.slack_extend_by,
            },
            signing_secret,
        })
    }

    /// The routes of the debug endpoint: the hold API and the recording
    /// API always (one review budget per client for both), Slack's
    /// interactivity endpoint with a signing secret.
    fn router(&self, client: &Client, recordings: &crate::recording::Recordings) -> axum::Router {
        let throttle = Arc::new(crate::debug::api::Throttle::default());
        let hold = crate::debug::api::router_with(client.clone(), throttle.clone()).merge(
            crate::recording::api::router_with(client.clone(), recordings.clone(), throttle),
        );
        match &self.signing_secret {
            Some(secret) => hold.merge(crate::slack::router(
                client.clone(),
                InteractionsConfig {
                    signing_secret: secret.clone(),
                    extend_by: self.slack.extend_by,
                },
            )),
            None => hold,
        }
    }
}

/// Reads and parses `--default-policies`; no file is no defaults.
fn read_default_policies(path: Option<&Path>) -> Result<DefaultPolicies, RuntimeError> {
    let Some(path) = path else {
        return Ok(DefaultPolicies::default());
    };
    let text =
        std::fs::read_to_string(path).map_err(|source| RuntimeError::DefaultPoliciesFile {
            path: path.display().to_string(),
            source,
        })?;
    Ok(DefaultPolicies::from_yaml(&text)?)
}

impl Shared {
    /// The shared parts for `options` around `client`: the registry, the
    /// policy engine and loader (their metrics registered), the Actions
    /// client options.
    pub fn new(client: Client, options: &RunOptions) -> Result<Self, RuntimeError> {
        let metrics = MetricsRegistry::new();
        let policy_metrics = metrics.register(PolicyMetrics::register);
        let engine = PolicyEngine::new(EngineConfig::default()).map_err(RuntimeError::Policy)?;
        let actions = ClientOptions {
            metrics: metrics.register(ActionsMetrics::register),
            allow_plain_http: options.actions.allow_plain_http,
            hosts: options.actions.host_policy(),
            timeout: options.actions.actions_call_timeout,
            message_timeout: options.actions.actions_message_timeout,
            ..ClientOptions::default()
        };
        let defaults = read_default_policies(options.policies.default_policies.as_deref())?;
        Ok(Self {
            debug: DebugSettings::read(&options.debug)?,
            clients: ActionsClients::new(client.clone(), actions.clone()),
            controllers: metrics.register(ControllerMetrics::register),
            unregistration: metrics.register(UnregistrationMetrics::register),
            listeners: metrics
                .register(ListenerMetrics::register)
                .with_policy_metrics(policy_metrics.clone()),
            runner_sets: metrics.register(SetMetrics::register),
            owner: std::env::var("HOSTNAME")
                .ok()
                .filter(|name| !name.is_empty())
                .unwrap_or_else(|| "arcwright".to_owned()),
            policy: PolicyServices {
                loader: PolicyLoader::new(engine, Some(client.clone()))
                    .with_defaults(defaults)
                    .with_metrics(policy_metrics.clone()),
                reporter: Arc::new(TracingReporter::new(policy_metrics.clone())),
                metrics: policy_metrics,
            },
            coordination: client.clone(),
            reviews: client.clone(),
            client,
            scope: options.watch.scope(),
            metrics,
            actions,
            reconcile_concurrency: options.controllers.reconcile_concurrency,
            unregistration_workers: options.controllers.unregistration_workers,
            runner_failure_limit: options.controllers.runner_failure_limit,
            runner_failure_backoff: options.controllers.runner_failure_backoff,
            registration_timeout: options.controllers.registration_timeout,
            max_runners_per_scale_set: options.controllers.max_runners_per_scale_set,
            message_batch_window: options.controllers.message_batch_window,
            recordings: options.policies.recordings(),
            shards: crate::sharding::Shards::single(),
            backlogs: crate::backlog::Backlogs::new(),
            renew_in_place: options.controllers.renew_in_place,
            status_budget: crate::controllers::kit::budget::WriteBudget::new(
                options.controllers.status_budget,
            ),
            made_runners: crate::controllers::kit::made::MadeRunners::default(),
        })
    }
}

/// Builds the Kubernetes client the options describe: from `source`, its
/// requests held to `rate` when there is one, those that waited for it
/// counted in `waited`.
pub async fn client(
    source: &KubeSource,
    rate: Option<(rate_limit::Rate, &Counter)>,
) -> Result<Client, RuntimeError> {
    // kube and the Actions client both use rustls with ring; install it as
    // the process default unless something already did.
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    let mut config = match source {
        KubeSource::Infer => kube::Config::infer().await.map_err(RuntimeError::Infer)?,
        KubeSource::InCluster => kube::Config::incluster().map_err(RuntimeError::InCluster)?,
        KubeSource::File(path) => {
            let kubeconfig_error = |source| RuntimeError::Kubeconfig {
                path: path.display().to_string(),
                source,
            };
            let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(kubeconfig_error)?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .map_err(kubeconfig_error)?
        }
    };
    config.read_timeout = Some(crate::watch::READ_TIMEOUT);
    let builder = kube::client::ClientBuilder::try_from(config).map_err(RuntimeError::Client)?;
    Ok(match rate {
        Some((rate, waited)) => builder
            .with_layer(&rate_limit::RateLimitLayer::new(rate, waited.clone()))
            .build(),
        None => builder.build(),
    })
}

/// Runs `arcwright run` to the end: builds the async runtime, the client
/// and the shared parts, and runs [`wiring::components`] until SIGTERM or
/// SIGINT.
pub fn run(options: RunOptions) -> Result<(), RuntimeError> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(RuntimeError::Setup)?
        .block_on(async {
            let signal = shutdown_signal()?;
            let source = options.kube.source();
            let rate = options.kube.rate();
            let waited = Counter::default();
            let limited = rate.map(|rate| (rate, &waited));
            let kube = client(&source, limited).await?;
            let mut shared = Shared::new(kube.clone(), &options)?;
            if rate.is_some() {
                shared.coordination = client(&source, None).await?;
                shared.reviews = client(&source, limited).await?;
                shared.metrics.register(|registry| {
                    registry.register(
                        "arcwright_kube_client_rate_limited",
                        "API server requests that waited for a token of --kube-qps",
                        waited.clone(),
                    );
                });
            }
            let address = options.http.listen_address;
            let listener = TcpListener::bind(address)
                .await
                .map_err(|source| RuntimeError::Bind { address, source })?;
            let namespace = options
                .election
                .leader_election_namespace
                .clone()
                .or_else(|| std::env::var("POD_NAMESPACE").ok())
                .unwrap_or_else(|| "default".to_owned());
            let identity = format!("{}-{:08x}", shared.owner, rand::random::<u32>());
            // Shards replace the single leader: every replica serves a part.
            let sharded = options.election.shards > 1;
            let shards = sharded.then(|| shards::ShardElection {
                namespace: namespace.clone(),
                count: options.election.shards,
                identity: identity.clone(),
                duration: options.election.lease_duration,
            });
            let election = (options.election.leader_elect && !sharded).then(|| leader::Election {
                namespace,
                lease: options.election.leader_election_lease.clone(),
                identity,
                duration: options.election.lease_duration,
            });
            let debug = debug_endpoint::DebugEndpoint::bind(&options.http).await?;
            Runtime::new(shared, listener, options.shutdown.shutdown_timeout)
                .with_debug_endpoint(debug)
                .with_election(election)
                .with_shards(shards)
                .components(wiring::components())
                .run_until(signal)
                .await
        })
}

/// Resolves on the first SIGTERM (what the kubelet sends) or SIGINT
/// (Ctrl-C). The handlers are installed before it is awaited, so a signal
/// that arrives during start-up is not lost.
pub fn shutdown_signal() -> Result<impl Future<Output = ()> + Send + 'static, RuntimeError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate()).map_err(RuntimeError::Setup)?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(RuntimeError::Setup)?;
    Ok(async move {
        let name = tokio::select! {
            _ = terminate.recv() => "SIGTERM",
            _ = interrupt.recv() => "SIGINT",
        };
        tracing::info!(signal = name, "shutting down");
    })
}

/// The shared parts, the endpoints and the components, ready to run.
pub struct Runtime {
    shared: Shared,
    listener: TcpListener,
    debug: Option<debug_endpoint::DebugEndpoint>,
    shutdown_timeout: Duration,
    components: Vec<Component>,
    election: Option<leader::Election>,
    shards: Option<shards::ShardElection>,
}

impl Runtime {
    /// A runtime serving its endpoints on `listener` (bound by the caller,
    /// so a bad address fails before anything starts and a test knows the
    /// port) and giving components `shutdown_timeout` to return once
    /// shutdown begins.
    pub fn new(shared: Shared, listener: TcpListener, shutdown_timeout: Duration) -> Self {
        Self {
            shared,
            listener,
            debug: None,
            shutdown_timeout,
            components: Vec::new(),
            election: None,
            shards: None,
        }
    }

    /// Serves the hold API and Slack's endpoint on `debug` instead of the
    /// main listener (see [`debug_endpoint`]); `None` keeps them there.
    pub fn with_debug_endpoint(mut self, debug: Option<debug_endpoint::DebugEndpoint>) -> Self {
        self.debug = debug;
        self
    }

    /// Campaigns for `election`'s Lease; leader-only components wait for it.
    /// `None` (the default) leads alone.
    pub fn with_election(mut self, election: Option<leader::Election>) -> Self {
        self.election = election;
        self
    }

    /// Campaigns for `shards`' Leases; the controllers and the listeners
    /// serve the scale sets of the shards held ([`shards`]). `None` (the
    /// default) serves every scale set.
    pub fn with_shards(mut self, shards: Option<shards::ShardElection>) -> Self {
        self.shards = shards;
        self
    }

    /// Adds components, started in this order.
    pub fn components(mut self, components: impl IntoIterator<Item = Component>) -> Self {
        self.components.extend(components);
        self
    }

    /// Serves the endpoints and runs every component until `signal`
    /// resolves or a component fails, then shuts down within the bound.
    pub async fn run_until(self, signal: impl Future<Output = ()>) -> Result<(), RuntimeError> {
        let Self {
            mut shared,
            listener,
            debug,
            shutdown_timeout,
            components,
            election,
            shards,
        } = self;
        let holdings = match shards {
            Some(shards) => Some(
                shards
                    .start(shared.coordination.clone())
                    .await
                    .map_err(RuntimeError::Election)?,
            ),
            None => None,
        };
        if let Some(holdings) = &holdings {
            shared.shards = holdings.shards();
        }
        // Once leadership is lost, a standby may lead as soon as the Lease
        // expires for it: the margin left between the renew deadline (when
        // this replica stepped down) and the lease duration. What still
        // runs then is aborted, so no write of this replica's lands after
        // the next leader's first, as controller-runtime, which exits the
        // process, makes sure too.
        let lost_margin = election.as_ref().map(|election| {
            let timing = leader::Timing::of(election.duration);
            timing.lease_duration.saturating_sub(timing.renew_deadline)
        });
        let mut leadership = match election {
            Some(election) => Some(
                election
                    .start(shared.coordination.clone())
                    .await
                    .map_err(RuntimeError::Election)?,
            ),
            None => None,
        };
        let readiness = Readiness::default();
        let address = listener.local_addr().map_err(RuntimeError::Serve)?;
        let stop_serving = CancellationToken::new();
        let probes = server::router(shared.metrics.clone(), readiness.clone());
        let held = shared.debug.router(&shared.reviews, &shared.recordings);
        let (main, separate) = match debug {
            Some(endpoint) => (probes, Some((endpoint, held))),
            None => (probes.merge(held), None),
        };
        if let Some((endpoint, held)) = separate {
            let debug_address = endpoint.local_addr().map_err(RuntimeError::Serve)?;
            let tls = endpoint.tls.is_some();
            // The hold API's review budget is per client address.
            let held = held.into_make_service_with_connect_info::<crate::debug::api::ClientAddr>();
            let stop = stop_serving.clone().cancelled_owned();
            match endpoint.tls {
                Some(config) => {
                    let listener = debug_endpoint::TlsListener::new(endpoint.listener, config);
                    tokio::spawn(
                        axum::serve(listener, held)
                            .with_graceful_shutdown(stop)
                            .into_future(),
                    );
                }
                None => {
                    tokio::spawn(
                        axum::serve(endpoint.listener, held)
                            .with_graceful_shutdown(stop)
                            .into_future(),
                    );
                }
            }
            tracing::info!(
                address = %debug_address,
                tls,
                "serving the hold API and Slack interactions"
            );
        }
        let mut server = tokio::spawn(
            axum::serve(
                listener,
                main.into_make_service_with_connect_info::<crate::debug::api::ClientAddr>(),
            )
            .with_graceful_shutdown(stop_serving.clone().cancelled_owned())
            .into_future(),
        );
        tracing::info!(
            %address,
            slack_interactions = shared.debug.signing_secret.is_some(),
            "serving /healthz, /readyz, /metrics and the hold API"
        );

        let root = CancellationToken::new();
        let mut tasks = JoinSet::new();
        let mut names = HashMap::new();
        for Component {
            name,
            start,
            leader_only,
        } in components
        {
            let ctx = Context {
                name,
                shared: shared.clone(),
                shutdown: root.clone(),
                ready: readiness.gate(name),
            };
            let future = match (&leadership, leader_only) {
                (Some(leadership), true) => on_leadership(leadership.subscribe(), ctx, start),
                _ => start(ctx),
            };
            let handle = tasks.spawn(future);
            names.insert(handle.id(), name);
            tracing::info!(component = name, "started");
        }

        // Until the signal, a failure, or the server stopping.
        let mut failure = None;
        let mut server_done = false;
        tokio::pin!(signal);
        loop {
            tokio::select! {
                () = &mut signal => break,
                () = async {
                    match leadership.as_mut() {
                        Some(leadership) => leadership.lost().await,
                        None => std::future::pending().await,
                    }
                } => {
                    let error = RuntimeError::LeadershipLost;
                    tracing::error!("{error}; shutting down");
                    failure = Some(error);
                    break;
                }
                Some(joined) = tasks.join_next_with_id() => {
                    if let Some(error) = finished(&mut names, joined) {
                        tracing::error!("{error}; shutting down");
                        failure = Some(error);
                        break;
                    }
                }
                served = &mut server => {
                    server_done = true;
                    let error = match served {
                        Ok(Ok(())) => RuntimeError::Serve(std::io::ErrorKind::UnexpectedEof.into()),
                        Ok(Err(error)) => RuntimeError::Serve(error),
                        Err(_) => RuntimeError::ComponentPanicked { name: "http-server" },
                    };
                    tracing::error!("{error}; shutting down");
                    failure = Some(error);
                    break;
                }
            }
        }

        // Shutdown: every component told at once, each given the same bound
        // (after a lost leadership, no more than the margin left).
        readiness.shutting_down();
        root.cancel();
        let bound = match (&failure, lost_margin) {
            (Some(RuntimeError::LeadershipLost), Some(margin)) => shutdown_timeout.min(margin),
            _ => shutdown_timeout,
        };
        let drained = tokio::time::timeout(bound, async {
            while let Some(joined) = tasks.join_next_with_id().await {
                if let Some(error) = finished(&mut names, joined) {
                    tracing::error!("{error} while shutting down");
                    failure.get_or_insert(error);
                }
            }
        })
        .await;
        if drained.is_err() {
            let mut still_running: Vec<_> = names.into_values().collect();
            still_running.sort_unstable();
            tasks.abort_all();
            let error = RuntimeError::ShutdownTimeout {
                timeout: bound,
                still_running,
            };
            tracing::error!("{error}");
            failure.get_or_insert(error);
        }
        if let Some(leadership) = leadership {
            leadership.release().await;
        }
        if let Some(holdings) = holdings {
            holdings.release().await;
        }
        stop_serving.cancel();
        if !server_done {
            // The server only finishes open requests; a scrape in flight is
            // short, and a stuck one is no reason to hang the exit.
            let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
        }
        match failure {
            None => {
                tracing::info!("shut down cleanly");
                Ok(())
            }
            Some(error) => Err(error),
        }
    }
}

/// A leader-only component's future: ready while it waits, started once
/// this replica leads, or returned at once when shutdown comes first.
fn on_leadership(
    mut leading: tokio::sync::watch::Receiver<bool>,
    ctx: Context,
    start: Start,
) -> BoxFuture<'static, Result<(), BoxError>> {
    Box::pin(async move {
        ctx.ready.ready();
        tokio::select! {
            () = ctx.shutdown.cancelled() => return Ok(()),
            led = async { leading.wait_for(|leading| *leading).await.is_ok() } => if !led {
                // The campaign ended without leading: the runtime is
                // shutting down or failing; nothing to start.
                ctx.shutdown.cancelled().await;
                return Ok(());
            },
        }
        drop(leading);
        tracing::info!(component = ctx.name, "leading: started");
        ctx.ready.not_ready();
        start(ctx).await
    })
}

/// Accounts for a component that returned; the error, if it ended badly.
fn finished(
    names: &mut HashMap<tokio::task::Id, &'static str>,
    joined: Result<(tokio::task::Id, Result<(), BoxError>), tokio::task::JoinError>,
) -> Option<RuntimeError> {
    let (id, outcome) = match joined {
        Ok((id, result)) => (id, result.map_err(Some)),
        Err(error) => (error.id(), Err(None)),
    };
    let name = names.remove(&id).unwrap_or("component");
    match outcome {
        Ok(()) => {
            tracing::info!(component = name, "finished");
            None
        }
        Err(Some(source)) => Some(RuntimeError::ComponentFailed { name, source }),
        Err(None) => Some(RuntimeError::ComponentPanicked { name }),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;
    use crate::runtime::options::{
        ActionsOptions, ControllerOptions, ElectionOptions, HttpOptions, KubeOptions,
        PolicyOptions, ShutdownOptions, WatchOptions,
    };
    use crate::telemetry::{LogFormat, LogOptions};

    /// Shared parts around a client of an address nothing listens on: the
    /// components of these tests never call the API server.
    fn shared() -> Shared {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let options = RunOptions {
            kube: KubeOptions {
                kubeconfig: None,
                in_cluster: false,
                kube_qps: 0,
                kube_burst: 0,
            },
            watch: WatchOptions {
                namespaces: vec!["ci".into()],
            },
            http: HttpOptions {
                listen_address: "127.0.0.1:0".parse().unwrap(),
                debug_listen_address: None,
                debug_tls_cert_file: None,
                debug_tls_key_file: None,
            },
            log: LogOptions {
                log_format: LogFormat::Text,
                log_level: "info".into(),
            },
            controllers: ControllerOptions {
                reconcile_concurrency: 3,
                unregistration_workers: 5,
                runner_failure_limit: 5,
                runner_failure_backoff: Duration::from_secs(5),
                registration_timeout: Duration::from_secs(600),
                max_runners_per_scale_set: 1000,
                message_batch_window: Duration::from_secs(2),
                renew_in_place: false,
                status_budget: 5,
            },
            actions: ActionsOptions {
                allow_plain_http: false,
                actions_call_timeout: Duration::from_secs(30),
                actions_message_timeout: Duration::from_secs(90),
                actions_hosts: vec!["github.com".into()],
            },
            shutdown: ShutdownOptions {
                shutdown_timeout: Duration::from_secs(10),
            },
            election: ElectionOptions {
                leader_elect: false,
                leader_election_namespace: None,
                leader_election_lease: "arcwright-controller".into(),
                lease_duration: Duration::from_secs(15),
                shards: 1,
            },
            policies: PolicyOptions {
                default_policies: None,
                recording_entries: 10_000,
                recording_bytes: 4 << 20,
                recording_total_bytes: 64 << 20,
            },
            debug: DebugOptions {
                slack_api_url: crate::slack::DEFAULT_API_URL.parse().unwrap(),
                slack_signing_secret_file: None,
                slack_extend_by: crate::slack::DEFAULT_EXTEND_BY,
            },
        };
        Shared::new(Client::try_from(config).unwrap(), &options).unwrap()
    }

    async fn runtime(timeout: Duration) -> (Runtime, String) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        (Runtime::new(shared(), listener, timeout), base)
    }

    #[tokio::test]
    async fn readyz_waits_for_a_component_whose_cache_is_not_synced() {
        let (runtime, base) = runtime(Duration::from_secs(10)).await;
        let (synced_tx, synced_rx) = tokio::sync::oneshot::channel::<()>();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn(
            runtime
                .components([
                    Component::new("at-once", |ctx: Context| async move {
                        ctx.ready.ready();
                        ctx.shutdown.cancelled().await;
                        Ok::<_, BoxError>(())
                    }),
                    Component::new("slow-cache", |ctx: Context| async move {
                        let _ = synced_rx.await;
                        ctx.ready.ready();
                        ctx.shutdown.cancelled().await;
                        Ok::<_, BoxError>(())
                    }),
                ])
                .run_until(async {
                    let _ = stop_rx.await;
                }),
        );
        let readyz = format!("{base}/readyz");
        let (status, body) = get_when(&readyz, |_| true).await;
        assert_eq!((status, body.as_str()), (503, "waiting for: slow-cache\n"));

        synced_tx.send(()).unwrap();
        get_when(&readyz, |status| status == 200).await;

        stop_tx.send(()).unwrap();
        running.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn shutdown_waits_for_components_to_release_what_they_hold() {
        let (runtime, _) = runtime(Duration::from_secs(10)).await;
        let released = Arc::new(AtomicBool::new(false));
        let seen = Arc::clone(&released);
        runtime
            .components([Component::new("listener", move |ctx: Context| async move {
                ctx.ready.ready();
                ctx.shutdown.cancelled().await;
                // Deleting a message session is a round trip or two.
                tokio::time::sleep(Duration::from_millis(50)).await;
                seen.store(true, Ordering::SeqCst);
                Ok::<_, BoxError>(())
            })])
            .run_until(std::future::ready(()))
            .await
            .unwrap();
        assert!(released.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn a_component_that_ignores_shutdown_is_abandoned_after_the_bound() {
        let (runtime, _) = runtime(Duration::from_millis(100)).await;
        let error = runtime
            .components([
                Component::new("stubborn", |_ctx: Context| async move {
                    std::future::pending::<()>().await;
                    Ok::<_, BoxError>(())
                }),
                Component::new("polite", |ctx: Context| async move {
                    ctx.shutdown.cancelled().await;
                    Ok::<_, BoxError>(())
                }),
            ])
            .run_until(std::future::ready(()))
            .await
            .unwrap_err();
        match error {
            RuntimeError::ShutdownTimeout { still_running, .. } => {
                assert_eq!(still_running, ["stubborn"]);
            }
            other => panic!("{other}"),
        }
    }

    #[tokio::test]
    async fn a_failing_component_shuts_the_others_down() {
        let (runtime, _) = runtime(Duration::from_secs(10)).await;
        let cancelled = Arc::new(AtomicBool::new(false));
        let seen = Arc::clone(&cancelled);
        let error = runtime
            .components([
                Component::new("watcher", move |ctx: Context| async move {
                    ctx.shutdown.cancelled().await;
                    seen.store(true, Ordering::SeqCst);
                    Ok::<_, BoxError>(())
                }),
                Component::new("broken", |_ctx: Context| async move {
                    Err::<(), _>(std::io::Error::other("the watch was refused"))
                }),
                Component::new("warm-up", |ctx: Context| async move {
                    ctx.ready.ready();
                    Ok::<_, BoxError>(())
                }),
            ])
            .run_until(std::future::pending())
            .await
            .unwrap_err();
        assert_eq!(error.to_string(), "broken failed: the watch was refused");
        assert!(cancelled.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn a_panicking_component_is_named() {
        let (runtime, _) = runtime(Duration::from_secs(10)).await;
        let error = runtime
            .components([Component::new("fragile", |_ctx: Context| async move {
                if true {
                    panic!("a bug");
                }
                Ok::<_, BoxError>(())
            })])
            .run_until(std::future::pending())
            .await
            .unwrap_err();
        assert_eq!(error.to_string(), "fragile panicked");
    }

    #[tokio::test]
    async fn components_share_one_registry_and_get_the_options() {
        let (runtime, base) = runtime(Duration::from_secs(10)).await;
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn(
            runtime
                .components([Component::new("counter", |ctx: Context| async move {
                    assert_eq!(ctx.name, "counter");
                    assert_eq!(
                        ctx.shared.scope,
                        WatchScope::Namespaces(["ci".into()].into())
                    );
                    assert_eq!(
                        (
                            ctx.shared.reconcile_concurrency,
                            ctx.shared.unregistration_workers
                        ),
                        (3, 5)
                    );
                    let counter = ctx.shared.metrics.register(|registry| {
                        let counter =
                            prometheus_client::metrics::counter::Counter::<u64>::default();
                        registry.register("component_ticks", "Ticks", counter.clone());
                        counter
                    });
                    counter.inc();
                    ctx.ready.ready();
                    ctx.shutdown.cancelled().await;
                    Ok::<_, BoxError>(())
                })])
                .run_until(async {
                    let _ = stop_rx.await;
                }),
        );
        get_when(&format!("{base}/readyz"), |status| status == 200).await;
        let (_, text) = get_when(&format!("{base}/metrics"), |_| true).await;
        assert!(text.contains("\ncomponent_ticks_total 1\n"), "{text}");
        assert!(text.contains("arcwright_build_info{"), "{text}");
        stop_tx.send(()).unwrap();
        running.await.unwrap().unwrap();
    }

    /// GETs `url` until `accept` takes the status (the server may not have
    /// its first answer ready the instant the runtime starts).
    async fn get_when(url: &str, accept: impl Fn(u16) -> bool) -> (u16, String) {
        let client = reqwest::Client::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(response) = client.get(url).send().await {
                let status = response.status().as_u16();
                if accept(status) {
                    return (status, response.text().await.unwrap());
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{url} never answered as expected"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
