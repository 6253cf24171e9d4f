//! The EphemeralRunner controller: registers a runner once, runs it in a pod
//! built from its template, follows the pod into the status, and removes the
//! registration before the pod whenever the pod has to go.
//!
//! Each reconcile reads the runner, its pod and its JIT config Secret
//! ([`observe`](self)), turns them into a [`plan::Plan`] with the pure
//! [`plan::plan`], and applies it step by step ([`apply`](self)). It reads
//! the watch caches, not the API server, once they show at least what the
//! API server last told the controller of the pod and the Secret (the
//! answers to its own writes, recorded as
//! [expectations](crate::controllers::kit::expectations)): a cache behind
//! those writes could say the Secret is missing right after it was
//! written, and the runner would be registered twice. Where nothing is
//! known yet (a host just started, a shard just taken), or a cache is
//! behind, a reconcile with nothing to do is still decided from the
//! caches, and any step on reads from the API server.
//!
//! Removals of a runner's registration go through the
//! [`UnregistrationPool`] (seed 000), never through the reconcile: a
//! reconcile never waits on the Actions service to remove a registration.
//! The pool wakes the runner's reconcile when it is done (`on_finished`),
//! which is when the pod may go. The one exception is inside the
//! registration step itself (`apply::register`): a registration nobody has
//! recorded yet (one an earlier attempt left under the runner's name
//! without its Secret, or the one just made whose Secret could not be
//! written) is removed there and then, since no record of it exists for
//! the pool's outcome to settle and the name must be free to register.

mod apply;
mod notify;
mod observe;
pub mod plan;
pub mod resources;

pub use observe::replay;

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{self, Action};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio_util::sync::CancellationToken;

use crate::actions::ActionsError;
use crate::api::{EphemeralRunner, labels};
use crate::controllers::kit::expectations::Expectations;
use crate::controllers::kit::{ErrorLabel, Publisher, relist};
use crate::controllers::metrics::{ControllerMetrics, RunnerLabels};
use crate::credentials::{ActionsClients, ActionsRemover, CredentialsError, GitHubTarget};
use crate::policy::gate::Gate;
use crate::policy::loader::{LoadedPolicy, PolicyLoader, PolicyRef};
use crate::policy::{PolicyError, PolicyKind, PolicyReporter};
use crate::slack::SlackClient;
use crate::tenant_cache::{Limits, TenantCache};
use crate::unregistration::{
    PoolConfig, UnregistrationKey, UnregistrationMetrics, UnregistrationPool,
};

/// The controller's name in metrics, events and field managers.
pub const CONTROLLER: &str = "ephemeral-runner";

/// Everything that can fail in a reconcile. Each variant is retried by the
/// controller with a delay; none carries a secret.
#[derive(Debug, thiserror::Error)]
pub enum EphemeralRunnerError {
    /// A Kubernetes API call failed.
    #[error("the Kubernetes API refused to {action}: {source}")]
    Kube {
        /// What was being done.
        action: &'static str,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// The GitHub credentials could not be resolved.
    #[error(transparent)]
    Credentials(#[from] CredentialsError),
    /// The Actions service refused or failed.
    #[error(transparent)]
    Actions(#[from] ActionsError),
    /// The deregistration policy could not decide, not even its default.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// The runner's name is registered in another scale set: removing that
    /// registration would take a runner away from someone else.
    #[error(
        "a runner named {name:?} is registered in scale set {other}, not {ours}; it is left alone"
    )]
    NameTakenElsewhere {
        /// The name.
        name: String,
        /// The scale set holding it.
        other: i64,
        /// The runner's scale set.
        ours: i64,
    },
    /// The service said the name was taken, but then did not find it.
    #[error("the service reported the runner name {0:?} taken but does not find it; retrying")]
    NameTakenButAbsent(String),
    /// The runner was renewed by someone else while this pass renewed it;
    /// the registration this pass made is in its Secret, and the next pass
    /// decides on it.
    #[error("the runner {0:?} was renewed while this pass renewed it; looking again")]
    RenewedMeanwhile(String),
}

impl ErrorLabel for EphemeralRunnerError {
    fn label(&self) -> &'static str {
        match self {
            Self::Kube { .. } => "kube",
            Self::Credentials(_) => "credentials",
            Self::Actions(e) => e.metric_label(),
            Self::Policy(_) => "policy",
            Self::NameTakenElsewhere { .. } => "name_taken_elsewhere",
            Self::NameTakenButAbsent(_) => "name_taken_but_absent",
            Self::RenewedMeanwhile(_) => "renewed_meanwhile",
        }
    }
}

fn kube_error(action: &'static str) -> impl FnOnce(kube::Error) -> EphemeralRunnerError {
    move |source| EphemeralRunnerError::Kube { action, source }
}

/// How the controller runs.
#[derive(Clone, Debug)]
pub struct Config {
    /// Watch one namespace, or all when `None`.
    pub namespace: Option<String>,
    /// The plan's knobs (backoff, timeouts).
    pub settings: plan::Settings,
    /// The unregistration pool's knobs.
    pub pool: PoolConfig,
    /// Reconciles running at once (ARC's default is 2; runners are
    /// independent, so more is safe).
    pub concurrency: u16,
    /// What runners send as `GITHUB_ACTIONS_RUNNER_EXTRA_USER_AGENT`.
    pub user_agent: String,
    /// The delay before a failed reconcile is retried.
    pub error_retry: Duration,
    /// Where held failures are posted, for scale sets that name a channel.
    pub slack: SlackConfig,
}

/// The Slack Web API held failures are posted to.
#[derive(Clone, Debug)]
pub struct SlackConfig {
    /// The Web API's base URL ([`crate::slack::DEFAULT_API_URL`]).
    pub api_url: url::Url,
    /// What the Extend button says it adds; the interaction endpoint must
    /// be configured with the same.
    pub extend_by: Duration,
}

impl Default for SlackConfig {
    fn default() -> Self {
        Self {
            api_url: url::Url::parse(crate::slack::DEFAULT_API_URL)
                .unwrap_or_else(|_| unreachable!("the default Slack URL parses")),
            extend_by: crate::slack::DEFAULT_EXTEND_BY,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            namespace: None,
            settings: plan::Settings::default(),
            pool: PoolConfig::default(),
            concurrency: 8,
            user_agent: format!("arcwright/{}", env!("CARGO_PKG_VERSION")),
            error_retry: Duration::from_secs(5),
            slack: SlackConfig::default(),
        }
    }
}

/// What the controller shares with the rest of the process.
#[derive(Clone)]
pub struct Dependencies {
    /// The Kubernetes client.
    pub client: Client,
    /// One Actions client per credential.
    pub clients: ActionsClients,
    /// Loads the deregistration policies.
    pub loader: PolicyLoader,
    /// Hears what happens to policies (logs, `arcwright_policy_failures_total`).
    pub reporter: Arc<dyn PolicyReporter>,
    /// The reconcilers' metrics.
    pub metrics: ControllerMetrics,
    /// The unregistration pools' metrics (one pool per namespace watched,
    /// summed).
    pub unregistration: UnregistrationMetrics,
    /// The scale sets this replica serves ([`crate::sharding`]): a runner
    /// is served, and unregistered, with its scale set.
    pub shards: crate::sharding::Shards,
    /// What the listeners heard of jobs waiting and the sets' terms of
    /// renewal: a runner finishing its job is renewed in place on them
    /// ([`crate::backlog`]).
    pub backlogs: crate::backlog::Backlogs,
    /// The host's budget of status writes that only inform
    /// ([`crate::controllers::kit::budget`]).
    pub status_budget: crate::controllers::kit::budget::WriteBudget,
    /// The runners this process's set controller made
    /// ([`crate::controllers::kit::made`]): their ownership is known
    /// without a read.
    pub made_runners: crate::controllers::kit::made::MadeRunners,
}

/// What every reconcile reads.
pub(crate) struct Context {
    deps: Dependencies,
    config: Config,
    pool: Arc<UnregistrationPool<ActionsRemover>>,
    publisher: Publisher,
    /// Loaded deregistration and pod-validation policies by kind, namespace
    /// and reference, so a reference shared by thousands of runners is
    /// compiled and watched once.
    /// A reference is what a tenant writes (its settings included), so the
    /// cache is bounded by [`POLICY_LIMITS`] and keeps only what some runner
    /// still names ([`Context::deregistration_policy`]).
    policies: Mutex<TenantCache<PolicyKey, Kept>>,
    /// The runners as the controller's watch last saw them: what says which
    /// loaded policies are still referred to.
    runners: reflector::Store<EphemeralRunner>,
    /// Taken while a runner counts the held runners of its scale set and
    /// records its own hold; see `observe::Planned`.
    hold_gate: Arc<tokio::sync::Mutex<()>>,
    /// Posts held failures; `None` if its HTTP client could not be built.
    slack: Option<SlackClient>,
    /// The Slack posts under way.
    outbox: notify::Outbox,
    /// The runner pods as the watch last saw them, without their specs.
    pods: reflector::Store<Pod>,
    /// The JIT config Secrets as the watch last saw them: their metadata
    /// only. Anyone who may write a Secret can label it as ours, and a
    /// whole Secret can be a mebibyte of someone's data (a proxy's password
    /// among it); the host keeps none of it. What the controller reads of a
    /// Secret it made is in its annotations
    /// ([`resources::read_jit_secret_meta`]); the data is read from the
    /// API server where a step depends on it.
    secrets: reflector::Store<PartialObjectMeta<Secret>>,
    /// What the API server last said of each runner's pod (an answer to a
    /// write of ours, or a read): the pod cache is decided on only where it
    /// shows at least that ([`crate::controllers::kit::expectations`]).
    known_pods: Expectations,
    /// The same of each runner's JIT config Secret.
    known_secrets: Expectations,
}

/// A policy reference as the cache keys it: the kind it is loaded as, the
/// runner's namespace and the reference as JSON (`null` for the default).
type PolicyKey = (PolicyKind, String, String);

/// A policy the controller keeps loaded: a deregistration policy, or the
/// pod-validation gate a runner's pods are judged by.
#[derive(Clone)]
enum Kept {
    Deregistration(Arc<LoadedPolicy>),
    PodValidation(Arc<Gate>),
}

/// How many policies a namespace keeps loaded: a scale set's
/// deregistration policy, its shadow and its pod-validation policy, for a
/// couple of dozen sets of settings each. Past that a reference is loaded
/// for the one decision it is asked for.
pub const POLICY_LIMITS: Limits = Limits {
    per_namespace: 64,
    idle: Duration::from_secs(15 * 60),
};

fn policy_key(kind: PolicyKind, namespace: &str, reference: Option<&PolicyRef>) -> PolicyKey {
    (
        kind,
        namespace.to_string(),
        serde_json::to_string(&reference).unwrap_or_default(),
    )
}

/// The keys of the policies `runners` name: deregistration, active and
/// shadow, and pod validation.
fn referenced_policies<'a>(
    runners: impl IntoIterator<Item = &'a EphemeralRunner>,
) -> HashSet<PolicyKey> {
    runners
        .into_iter()
        .flat_map(|runner| {
            let namespace = runner.namespace().unwrap_or_default();
            let policies = &runner.spec.policies;
            [
                Some(policy_key(
                    PolicyKind::Deregistration,
                    &namespace,
                    policies.deregistration_policy.as_ref(),
                )),
                policies
                    .shadow_deregistration_policy
                    .as_ref()
                    .map(|shadow| policy_key(PolicyKind::Deregistration, &namespace, Some(shadow))),
                Some(policy_key(
                    PolicyKind::PodValidation,
                    &namespace,
                    policies.pod_validation_policy.as_ref(),
                )),
            ]
        })
        .flatten()
        .collect()
}

impl Context {
    fn key(&self, runner: &EphemeralRunner, runner_id: i64) -> UnregistrationKey {
        UnregistrationKey {
            namespace: runner.namespace().unwrap_or_default(),
            name: runner.name_any(),
            runner_id,
        }
    }

    async fn deregistration_policy(
        &self,
        namespace: &str,
        reference: Option<&PolicyRef>,
    ) -> Result<Arc<LoadedPolicy>, PolicyError> {
        match self
            .kept(PolicyKind::Deregistration, namespace, reference)
            .await?
        {
            Kept::Deregistration(loaded) => Ok(loaded),
            Kept::PodValidation(_) => unreachable!("the key names the kind"),
        }
    }

    /// The pod-validation gate `reference` names in `namespace`.
    async fn pod_gate(
        &self,
        namespace: &str,
        reference: Option<&PolicyRef>,
    ) -> Result<Arc<Gate>, PolicyError> {
        match self
            .kept(PolicyKind::PodValidation, namespace, reference)
            .await?
        {
            Kept::PodValidation(gate) => Ok(gate),
            Kept::Deregistration(_) => unreachable!("the key names the kind"),
        }
    }

    /// The policy of `kind` that `reference` names in `namespace`, loaded
    /// once and kept while a runner names it (within [`POLICY_LIMITS`]).
    async fn kept(
        &self,
        kind: PolicyKind,
        namespace: &str,
        reference: Option<&PolicyRef>,
    ) -> Result<Kept, PolicyError> {
        let key = policy_key(kind, namespace, reference);
        if let Some(kept) = self.lock_policies().get(&key, tokio::time::Instant::now()) {
            return Ok(kept);
        }
        let (loader, reporter) = (&self.deps.loader, self.deps.reporter.clone());
        let loaded = match kind {
            PolicyKind::PodValidation => Kept::PodValidation(Arc::new(
                Gate::load(loader, namespace, reference.cloned(), reporter).await?,
            )),
            _ => Kept::Deregistration(Arc::new(
                loader.load(kind, namespace, reference, reporter).await?,
            )),
        };
        // A new reference: the ones no runner names any more (edited away,
        // or their runners gone) are dropped first, with their watches,
        // so the namespace's room is what is in use.
        let referenced = referenced_policies(self.runners.state().iter().map(|r| r.as_ref()));
        let mut policies = self.lock_policies();
        policies.retain(|key| referenced.contains(key));
        let now = tokio::time::Instant::now();
        if let Some(kept) = policies.get(&key, now) {
            // Another reconcile loaded it meanwhile.
            return Ok(kept);
        }
        if !policies.insert(key, namespace, loaded.clone(), now)
            && policies.refused().is_power_of_two()
        {
            tracing::warn!(
                %namespace,
                refused = policies.refused(),
                limit = POLICY_LIMITS.per_namespace,
                "the namespace's runners name more policies than are kept loaded; \
                 the others are loaded for each decision"
            );
        }
        Ok(loaded)
    }

    fn lock_policies(&self) -> MutexGuard<'_, TenantCache<PolicyKey, Kept>> {
        self.policies.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Where a runner's GitHub configuration lives, for the credentials and the
/// pool.
pub fn github_target(runner: &EphemeralRunner) -> GitHubTarget {
    let spec = &runner.spec;
    super::github_target(
        &runner.namespace().unwrap_or_default(),
        &spec.github_config_url,
        &spec.github_config_secret,
        spec.proxy.as_ref(),
        spec.github_server_tls.as_ref(),
    )
}

async fn reconcile(
    runner: Arc<EphemeralRunner>,
    ctx: Arc<Context>,
) -> Result<Action, EphemeralRunnerError> {
    // Another replica's: it holds the scale set's shard.
    if !ctx.deps.shards.owns_object(runner.as_ref(), false) {
        return Ok(Action::await_change());
    }
    let _timer = ctx.deps.metrics.time(CONTROLLER);
    let namespace = runner.namespace().unwrap_or_default();
    let name = runner.name_any();
    let planned = observe::observe_and_plan(&runner, &ctx).await?;
    let plan = &planned.plan;
    tracing::debug!(runner = %name, %namespace, ?plan, "reconciled");
    let mut applied = apply::apply(&runner, plan, &ctx).await?;
    if let Some(refusal) = applied.refused_pod.take() {
        // The API server's answer changes what the plan decides: it is
        // made again with the refusal recorded, and applied.
        let plan = planned.with_refused_pod(refusal, &ctx.config.settings);
        tracing::debug!(runner = %name, %namespace, ?plan, "the runner pod was refused");
        applied.finalized |= apply::apply(&runner, &plan, &ctx).await?.finalized;
    }
    let finalized = applied.finalized;
    if finalized {
        ctx.known_pods.forget(&namespace, &name);
        ctx.known_secrets.forget(&namespace, &name);
    }
    let requeue = if applied.put_off {
        // Looked at again to write it, unless a write of the runner's
        // own (its renewal, its ending) comes first and carries it.
        let retry = crate::controllers::kit::budget::RETRY;
        Some(plan.requeue.map_or(retry, |after| after.min(retry)))
    } else {
        plan.requeue
    };
    drop(planned);
    let scale_set = runner
        .labels()
        .get(labels::SCALE_SET_NAME)
        .cloned()
        .unwrap_or_default();
    let counted = (!finalized).then(|| RunnerLabels {
        namespace: namespace.clone(),
        scale_set,
        phase: runner
            .status
            .as_ref()
            .and_then(|s| s.phase)
            .unwrap_or_default()
            .as_str()
            .to_string(),
    });
    ctx.deps.metrics.runner(&namespace, &name, counted);
    Ok(match requeue {
        Some(after) => Action::requeue(after),
        // A periodic look even when nothing is expected: the pool's outcomes
        // are kept in memory only, and a missed wake-up must not strand a
        // runner.
        None => Action::requeue(Duration::from_secs(300)),
    })
}

fn error_policy(
    runner: Arc<EphemeralRunner>,
    error: &EphemeralRunnerError,
    ctx: Arc<Context>,
) -> Action {
    tracing::warn!(runner = %runner.name_any(), error = %error, "reconcile failed; retrying");
    ctx.deps.metrics.error(CONTROLLER, error.label());
    Action::requeue(ctx.config.error_retry)
}

/// Runs the controller and its unregistration pool until `shutdown` is
/// cancelled, telling `synced` once the runners are listed. Returns after
/// the reconciles in flight finished and the pool stopped.
pub async fn run(
    deps: Dependencies,
    config: Config,
    shutdown: CancellationToken,
    synced: super::kit::Synced,
) {
    let client = deps.client.clone();
    let shards = deps.shards.clone();
    let (wake, woken) = tokio::sync::mpsc::unbounded_channel();
    let pool = UnregistrationPool::with_metrics(
        ActionsRemover::new(deps.clients.clone()),
        config.pool.clone(),
        deps.unregistration.clone(),
        move |finished: crate::unregistration::Finished| {
            let key = finished.key;
            let _ = wake.send(ObjectRef::<EphemeralRunner>::new(&key.name).within(&key.namespace));
        },
    );
    let pool_task = tokio::spawn(pool.clone().run(shutdown.clone()));
    let (runners, pods, secrets): (
        Api<EphemeralRunner>,
        Api<Pod>,
        Api<PartialObjectMeta<Secret>>,
    ) = match &config.namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (
            Api::all(client.clone()),
            Api::all(client.clone()),
            Api::all(client.clone()),
        ),
    };
    let owned =
        crate::watch::config().labels(&format!("{}={}", labels::MANAGED_BY, labels::ARCWRIGHT));
    let (pod_cache, pod_writer) = reflector::store();
    let (secret_cache, secret_writer) = reflector::store();
    let (reader, writer) = reflector::store();
    let ctx = Arc::new(Context {
        runners: reader.clone(),
        pods: pod_cache,
        secrets: secret_cache,
        known_pods: Expectations::new(&shards),
        known_secrets: Expectations::new(&shards),
        publisher: Publisher::new(client.clone(), CONTROLLER),
        deps,
        pool,
        policies: Mutex::new(TenantCache::new(POLICY_LIMITS, tokio::time::Instant::now())),
        hold_gate: Arc::new(tokio::sync::Mutex::new(())),
        slack: match SlackClient::new(config.slack.api_url.clone()) {
            Ok(slack) => Some(slack),
            Err(error) => {
                tracing::error!(%error, "Slack notifications are off");
                None
            }
        },
        outbox: notify::Outbox::default(),
        config: config.clone(),
    });
    let woken = futures::stream::unfold(woken, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    let (events, listed) = synced.on_listed(
        watcher::watcher(runners, crate::watch::config())
            .backoff(crate::watch::WatchBackoff::default())
            .modify(crate::watch::without_managed_fields)
            .reflect(writer),
    );
    // A runner pod's status moves with every probe and pull; the runner is
    // woken only when what its plan reads of the pod changed (seed 004).
    let metrics = ctx.deps.metrics.clone();
    let pods = crate::controllers::kit::projection::filtered(
        relist::with_vanished(
            watcher::watcher(pods, owned.clone())
                .backoff(crate::watch::WatchBackoff::default())
                .modify(resources::slim_pod)
                .reflect(pod_writer),
        ),
        observe::pod_view,
        move |delivered| metrics.owned_update(CONTROLLER, delivered),
    );
    // A Secret deleted while the watch re-lists would otherwise never wake
    // the runner waiting on that deletion to let go of its finalizer.
    let secrets = relist::with_vanished(
        watcher::watcher(secrets, owned)
            .backoff(crate::watch::WatchBackoff::default())
            .modify(|secret| secret.metadata.managed_fields = None)
            .reflect(secret_writer),
    )
    .touched_objects();
    let controller = Controller::for_stream(events.applied_objects(), reader)
        .owns_stream(pods)
        .owns_stream(secrets)
        .reconcile_on(woken)
        // The runners of a shard just taken were skipped until now.
        .reconcile_all_on(shards.gained())
        .with_config(controller::Config::default().concurrency(config.concurrency))
        .trigger_backoff(crate::watch::Undelayed)
        .graceful_shutdown_on(shutdown.clone().cancelled_owned())
        .run(reconcile, error_policy, ctx)
        .for_each(|_| async {});
    super::kit::until_shutdown(controller, &shutdown, listed).await;
    shutdown.cancel();
    let _ = pool_task.await;
}
