//! The AutoscalingRunnerSet controller: one scale set registered in the
//! Actions service, one EphemeralRunnerSet carrying its runner spec, one
//! listener acquiring its jobs.
//!
//! The shape is [`observe`], [`plan`](plan::plan), [`apply`]: the reconcile
//! reads the object, its EphemeralRunnerSet, its listener and the
//! pod-validation verdict; the pure planner decides (seed 004's rules live
//! there, in tables), asking for what costs a call to know with a
//! [`plan::Need`] that is answered before it plans again; the steps are
//! applied with one field manager. A deletion goes the same way through
//! [`plan::plan_deletion`].
//!
//! What it deliberately does not do: it never deletes its
//! EphemeralRunnerSet to recover from Outdated (that churned the scale set
//! in ARC, seed 004), never cancels a job (deletion waits for busy runners),
//! and never registers anything for a template the pod-validation policy
//! refused.

mod apply;
pub mod credentials_hold;
pub mod failure;
mod observe;
pub mod plan;
pub mod watch;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Resource, ResourceExt};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::actions::ActionsError;
use crate::api::{AutoscalingRunnerSet, EphemeralRunnerSet, finalizers};
use crate::controllers::kit::{self, ErrorLabel, Publisher, finalizer};
use crate::controllers::metrics::ControllerMetrics;
use crate::credentials::{ActionsClientSource, CredentialsError, GitHubTarget};
use crate::policy::PolicyReporter;
use crate::policy::loader::PolicyLoader;
use crate::sharding::Shards;

pub use crate::listener::control::{
    InMemoryListeners, ListenerConfig, ListenerControl, ListenerEvent, StartError,
};

use apply::Applied;
use observe::{Apis, Observation};
use plan::{Then, plan_deletion};

/// The controller's name in metrics.
pub const CONTROLLER: &str = "autoscaling-runner-set";

/// How soon a failed reconcile is retried.
const RETRY: Duration = Duration::from_secs(5);

/// What can go wrong in a reconcile; every variant is retried.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Kubernetes API refused a call.
    #[error("Kubernetes API, {action}: {source}")]
    Kube {
        /// What was being done.
        action: &'static str,
        /// The error.
        #[source]
        source: kube::Error,
    },
    /// The Actions service refused a call.
    #[error("Actions service, {action}: {source}")]
    Actions {
        /// What was being done.
        action: &'static str,
        /// The error.
        #[source]
        source: ActionsError,
    },
    /// No Actions client could be had for the set's credentials.
    #[error(transparent)]
    Credentials(#[from] CredentialsError),
    /// The pod-validation policy could not decide.
    #[error("pod validation: {0}")]
    Policy(#[from] crate::policy::PolicyError),
    /// The pod-validation policy the set names never loaded: the bundled
    /// default, which would stand in, is not the gate the admin chose.
    #[error("pod validation: the policy {policy} is not loaded ({reason}): {message}")]
    PolicyNotLoaded {
        /// The policy's label.
        policy: String,
        /// The short reason label.
        reason: String,
        /// Why.
        message: String,
    },
    /// The first version of the ConfigMap the pod-validation policy is read
    /// from has not loaded yet; looked at again shortly.
    #[error("pod validation: the policy {0} is still loading")]
    PolicyLoading(String),
    /// The listener could not be started.
    #[error(transparent)]
    Listener(#[from] StartError),
    /// The object lacks a field the API server always sets.
    #[error("the object has no {0}")]
    Incomplete(&'static str),
}

impl From<crate::policy::gate::GateError> for Error {
    fn from(error: crate::policy::gate::GateError) -> Self {
        use crate::policy::gate::GateError;
        match error {
            GateError::Policy(error) => Self::Policy(error),
            GateError::NotLoaded {
                policy,
                reason,
                message,
            } => Self::PolicyNotLoaded {
                policy,
                reason,
                message,
            },
            GateError::Loading(policy) => Self::PolicyLoading(policy),
        }
    }
}

impl ErrorLabel for Error {
    fn label(&self) -> &'static str {
        match self {
            Self::Kube { source, .. } => kit::kube_label(source),
            Self::Actions { source, .. } => source.metric_label(),
            Self::Credentials(_) => "credentials",
            Self::Policy(_) | Self::PolicyNotLoaded { .. } | Self::PolicyLoading(_) => "policy",
            Self::Listener(_) => "listener",
            Self::Incomplete(_) => "incomplete",
        }
    }
}

/// What the reconciler needs: the API client, the listeners, the Actions
/// clients and the pod-validation policies.
pub struct Context<L, S> {
    client: kube::Client,
    listeners: L,
    actions: S,
    policies: PolicyLoader,
    reporter: Arc<dyn PolicyReporter>,
    events: Publisher,
    metrics: ControllerMetrics,
    /// One loaded pod-validation policy per scale set, kept while its
    /// reference is unchanged, so a ConfigMap-backed policy is watched once
    /// and not reloaded on every reconcile.
    validators: Mutex<HashMap<(String, String), Validator>>,
    /// When each scale set's copied runner counts last changed.
    counts_changed: Mutex<HashMap<(String, String), Instant>>,
    /// The most runners one scale set has (`--max-runners-per-scale-set`).
    runner_cap: u32,
    /// The caches of every watch this context's controllers run (one per
    /// namespace, or one for all), so a set can tell whether another holds
    /// the scale set it would adopt.
    stores: Mutex<Vec<reflector::Store<AutoscalingRunnerSet>>>,
    /// The EphemeralRunnerSets as the watch of each scope last saw them:
    /// a pass reads its runner set here rather than from the API server
    /// when the copy shows at least what the controller itself last wrote
    /// or read of it (`known_runner_sets`). Its writes are the only ones to
    /// the runner set's spec a pass decides on; what others write (the
    /// listener's replicas, the set controller's counts) only makes the
    /// copy newer, and its delivery wakes the set again.
    runner_set_stores: Mutex<Vec<reflector::Store<EphemeralRunnerSet>>>,
    /// What the API server last said of each runner set, to this
    /// controller ([`kit::expectations`]).
    known_runner_sets: kit::expectations::Expectations,
    /// The scale sets this replica serves ([`crate::sharding`]).
    shards: Shards,
    /// The credentials Secrets seen held, so a pass need not read them.
    held_credentials: credentials_hold::KnownHeld,
}

/// A set's loaded pod-validation policy ([`crate::policy::gate`]).
type Validator = Arc<crate::policy::gate::Gate>;

impl<L: ListenerControl, S: ActionsClientSource> Context<L, S> {
    /// A context; `reporter` hears about policies that fail to load.
    pub fn new(
        client: kube::Client,
        listeners: L,
        actions: S,
        policies: PolicyLoader,
        reporter: Arc<dyn PolicyReporter>,
    ) -> Self {
        Self {
            events: Publisher::new(client.clone(), CONTROLLER),
            client,
            listeners,
            actions,
            policies,
            reporter,
            metrics: ControllerMetrics::default(),
            validators: Mutex::default(),
            counts_changed: Mutex::default(),
            runner_cap: crate::controllers::kit::DEFAULT_RUNNER_CAP,
            stores: Mutex::default(),
            runner_set_stores: Mutex::default(),
            known_runner_sets: kit::expectations::Expectations::new(&Shards::single()),
            shards: Shards::single(),
            held_credentials: credentials_hold::KnownHeld::default(),
        }
    }

    /// Serves only the scale sets of the shards `shards` holds (all of them
    /// unless told).
    pub fn with_shards(mut self, shards: Shards) -> Self {
        // What was known is forgotten whenever the holdings change: a
        // shard just taken may have been written by its former holder.
        self.known_runner_sets = kit::expectations::Expectations::new(&shards);
        self.shards = shards;
        self
    }

    /// Bounds every scale set at `cap` runners, whatever its spec says.
    pub fn with_runner_cap(mut self, cap: u32) -> Self {
        self.runner_cap = cap.max(1);
        self
    }

    /// Reports reconcile durations and errors in `metrics` (the process's
    /// registered ones) instead of unregistered ones.
    pub fn with_metrics(mut self, metrics: ControllerMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The metrics reconciles report to.
    pub fn metrics(&self) -> &ControllerMetrics {
        &self.metrics
    }

    /// The listeners this controller starts and stops.
    pub fn listeners(&self) -> &L {
        &self.listeners
    }
}

impl<L, S> Context<L, S> {
    /// The runner set `namespace/name` as a watch cache holds it, if the
    /// copy shows at least what the API server last told this controller
    /// of it; `None` when only a read can say.
    fn cached_runner_set(&self, namespace: &str, name: &str) -> Option<Option<EphemeralRunnerSet>> {
        let key = reflector::ObjectRef::new(name).within(namespace);
        let stores = self
            .runner_set_stores
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let cached = stores.iter().find_map(|store| store.get(&key));
        self.known_runner_sets
            .current(namespace, name, cached.as_ref().map(|c| &c.metadata))
            .then(|| cached.map(|c| (*c).clone()))
    }

    /// Records what a read of the runner set `namespace/name` found
    /// (`None`: nothing).
    fn read_runner_set(&self, namespace: &str, name: &str, found: Option<&kube::api::ObjectMeta>) {
        let known = kit::expectations::Known::read(found);
        self.known_runner_sets.record(namespace, name, known);
    }

    /// Records the answer to a write of the runner set `namespace/name`;
    /// a write that failed leaves its outcome unknown, so the next pass
    /// reads.
    fn wrote_runner_set<T>(
        &self,
        namespace: &str,
        name: &str,
        written: &Result<EphemeralRunnerSet, T>,
    ) {
        let known = written
            .as_ref()
            .ok()
            .and_then(|set| kit::expectations::Known::of(&set.metadata));
        self.known_runner_sets.record(namespace, name, known);
    }

    /// The set, other than `uid`, that records the scale set `id` of the
    /// service behind `config_url` as its own, as `namespace/name`. Only the
    /// watched namespaces are known.
    fn holder_of(&self, id: i64, config_url: &str, uid: Option<&str>) -> Option<String> {
        let host = |url: &str| url::Url::parse(url).ok().map(|u| u.origin());
        let stores = self.stores.lock().unwrap_or_else(|p| p.into_inner());
        stores
            .iter()
            .flat_map(|store| store.state())
            .find(|other| {
                // A set being deleted still holds it: it deletes it in the
                // service before it goes.
                other.uid().as_deref() != uid
                    && observe::scale_set_id(other) == Some(id)
                    && host(&other.spec.github_config_url) == host(config_url)
            })
            .map(|other| {
                format!(
                    "{}/{}",
                    other.namespace().unwrap_or_default(),
                    other.name_any()
                )
            })
    }

    /// Remembers that `namespace/name`'s runner counts moved now.
    fn note_counts_moved(&self, namespace: &str, name: &str) {
        self.counts_changed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert((namespace.to_owned(), name.to_owned()), Instant::now());
    }

    /// Forgets what is remembered of a scale set that is gone.
    fn forget(&self, namespace: &str, name: &str) {
        let key = (namespace.to_owned(), name.to_owned());
        {
            let mut validators = self
                .validators
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            validators.remove(&key);
            validators.remove(&(namespace.to_owned(), observe::shadow_key(name)));
        }
        self.counts_changed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(&key);
    }
}

/// Where `set`'s GitHub configuration lives, for the shared credentials
/// cache.
pub fn github_target(set: &AutoscalingRunnerSet) -> GitHubTarget {
    let spec = &set.spec;
    super::github_target(
        &set.namespace().unwrap_or_default(),
        &spec.github_config_url,
        &spec.github_config_secret,
        spec.proxy.as_ref(),
        spec.github_server_tls.as_ref(),
    )
}

/// Runs the controller until `shutdown` resolves: every
/// AutoscalingRunnerSet in `namespace` (all when `None`), woken by its own
/// updates and by the updates of its EphemeralRunnerSet that change what
/// it reads ([`watch`]). `synced` hears when the sets are listed.
pub async fn run<L: ListenerControl, S: ActionsClientSource>(
    context: Arc<Context<L, S>>,
    namespace: Option<&str>,
    shutdown: CancellationToken,
    synced: kit::Synced,
) {
    let client = context.client.clone();
    let (sets, runner_sets): (Api<AutoscalingRunnerSet>, Api<EphemeralRunnerSet>) = match namespace
    {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client, ns),
        ),
        None => (Api::all(client.clone()), Api::all(client)),
    };
    let metrics = context.metrics.clone();
    let (runner_set_reader, runner_set_writer) = reflector::store();
    context
        .runner_set_stores
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(runner_set_reader);
    let owned = watch::filtered(
        kit::relist::with_vanished(
            watcher::watcher(runner_sets, crate::watch::config())
                .backoff(crate::watch::WatchBackoff::default())
                .modify(crate::watch::without_managed_fields)
                .reflect(runner_set_writer),
        ),
        move |delivered| metrics.owned_update(CONTROLLER, delivered),
    );
    let (reader, writer) = reflector::store();
    context
        .stores
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(reader.clone());
    let (events, listed) = synced.on_listed(
        watcher::watcher(sets, crate::watch::config())
            .backoff(crate::watch::WatchBackoff::default())
            .modify(crate::watch::without_managed_fields)
            .reflect(writer),
    );
    let controller = Controller::for_stream(events.applied_objects(), reader)
        .owns_stream(owned)
        // The sets of a shard just taken were skipped until now.
        .reconcile_all_on(context.shards.gained())
        .trigger_backoff(crate::watch::Undelayed)
        .graceful_shutdown_on(shutdown.clone().cancelled_owned())
        .run(reconcile, error_policy, context)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::warn!(%error, "autoscaling runner set reconcile failed");
            }
        });
    kit::until_shutdown(controller, &shutdown, listed).await;
}

fn error_policy<L: ListenerControl, S: ActionsClientSource>(
    set: Arc<AutoscalingRunnerSet>,
    error: &Error,
    context: Arc<Context<L, S>>,
) -> Action {
    context.metrics.error(CONTROLLER, error.label());
    tracing::warn!(
        name = %set.name_any(),
        namespace = set.namespace().unwrap_or_default(),
        kind = error.label(),
        error = crate::causes::of(error),
        "reconcile failed; retrying"
    );
    Action::requeue(RETRY)
}

/// One reconcile of one AutoscalingRunnerSet.
pub async fn reconcile<L: ListenerControl, S: ActionsClientSource>(
    set: Arc<AutoscalingRunnerSet>,
    context: Arc<Context<L, S>>,
) -> Result<Action, Error> {
    let span = tracing::info_span!(
        "reconcile",
        namespace = set.namespace().unwrap_or_default(),
        name = set.name_any()
    );
    // Another replica's: it holds the set's shard, and acts on it alone.
    if !context.shards.owns_object(set.as_ref(), true) {
        return Ok(Action::await_change());
    }
    let _timer = context.metrics.time(CONTROLLER);
    async move {
        let namespace = set.namespace().ok_or(Error::Incomplete("namespace"))?;
        let apis = Apis::new(&context.client, &namespace);
        if set.meta().deletion_timestamp.is_some() {
            delete(&set, &context, &apis).await
        } else {
            let result = live(Arc::clone(&set), &context, &apis).await;
            if let Err(error) = &result {
                stalled(&set, error, &context, &apis).await;
            }
            result
        }
    }
    .instrument(span)
    .await
}

/// A live set: observe, plan, apply, and again while the plan asks.
async fn live<L: ListenerControl, S: ActionsClientSource>(
    set: Arc<AutoscalingRunnerSet>,
    context: &Context<L, S>,
    apis: &Apis,
) -> Result<Action, Error> {
    let mut observation = Observation::read(set, context, apis).await?;
    // Each need is asked once, so this ends after at most four rounds.
    for _ in 0..4 {
        let plan = plan::plan(&observation.observed);
        let applied = apply::apply(
            plan.steps,
            &observation.set,
            &mut observation.client,
            context,
            apis,
        )
        .await?;
        if applied == Applied::SecretGone {
            return Ok(Action::requeue(RETRY));
        }
        match plan.then {
            Then::LookAgainIn(after) => return Ok(Action::requeue(after)),
            Then::Ask(need) => {
                if !observation.answer(need).await? {
                    return Ok(Action::await_change());
                }
            }
        }
    }
    // Unreachable with a well-formed plan; answered as "look again".
    Ok(Action::requeue(RETRY))
}

/// A failed reconcile of a live set: what the admin can act on is said on
/// the status and in one event ([`plan::stalled`]); the error itself goes
/// on to be retried. A write that fails here is left to the retry.
async fn stalled<L: ListenerControl, S: ActionsClientSource>(
    set: &AutoscalingRunnerSet,
    error: &Error,
    context: &Context<L, S>,
    apis: &Apis,
) {
    let Some(failure) = failure::of(error) else {
        return;
    };
    let status = set.status.clone().unwrap_or_default();
    let steps = plan::stalled(&status, &failure, jiff::Timestamp::now());
    if let Err(error) = apply::apply(steps, set, &mut None, context, apis).await {
        tracing::debug!(%error, "the failure could not be reported");
    }
}

/// A deleting set: observe, [`plan_deletion`], apply; a set that no longer
/// holds the finalizer has nothing of ours left to release.
async fn delete<L: ListenerControl, S: ActionsClientSource>(
    set: &AutoscalingRunnerSet,
    context: &Context<L, S>,
    apis: &Apis,
) -> Result<Action, Error> {
    if !finalizer::held(set, &finalizers::AUTOSCALING_RUNNER_SET) {
        return Ok(Action::await_change());
    }
    let observed = observe::deletion(set, context, apis).await?;
    let plan = plan_deletion(&observed);
    if apply::apply(plan.steps, set, &mut None, context, apis).await? == Applied::SecretGone {
        return Ok(Action::requeue(plan::DELETION_POLL));
    }
    if let plan::Deletion::Waits(why) = &plan.then {
        tracing::debug!(%why, "deletion waits");
    }
    Ok(plan
        .then
        .look_again()
        .map_or_else(Action::await_change, Action::requeue))
}
