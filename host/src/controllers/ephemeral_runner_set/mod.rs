//! The EphemeralRunnerSet controller: keeps a scale set's runners at what the
//! listener asks for, without ever taking a runner that has a job.
//!
//! Observe, plan, apply: `observe` reads the set and its runners (from the
//! watch where it shows every write of the set's own, listed from the API
//! server where it does not, so a runner just created is never missed and
//! created twice: see `RunnerCache`) and answers the plan's requests for more,
//! [`plan`] decides without I/O, and `apply` carries the plan out, one API
//! call per write. [`watch`] decides which runner events wake a set.
//!
//! Every runner records what it was built from: the listener's patch id
//! (ARC's `patch-id` contract), the set's actionable revision, and the set's
//! generation. Those three annotations are what lets the plan tell a stale
//! decision, a stale view and a stale spec apart.

mod apply;
mod error;
pub mod metrics;
mod observe;
pub mod plan;
pub mod watch;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt, TryStreamExt};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::{self, Action, ReconcileReason, ReconcileRequest};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, applier, watcher};

use tokio_util::sync::CancellationToken;

use crate::api::{EphemeralRunner, EphemeralRunnerSet, labels};
use crate::backlog::{SetKey, Terms};
use crate::controllers::kit::budget::{self, WriteBudget};
use crate::controllers::kit::expectations::{GroupExpectations, Known};
use crate::controllers::kit::{ErrorLabel, relist};
use crate::controllers::metrics::ControllerMetrics;
use apply::Apply;
use observe::Observed;
use plan::{Creation, Need, Plan, RenewalStep, Tried, Written};

pub use error::Error;
pub use metrics::SetMetrics;
pub use observe::replay;

/// The name events are reported under.
pub const CONTROLLER_NAME: &str = "ephemeral-runner-set";

/// What every reconcile shares.
pub struct Context {
    /// The client.
    pub client: kube::Client,
    /// Where events go.
    pub publisher: super::kit::Publisher,
    /// The metrics of the sets.
    pub metrics: SetMetrics,
    /// The metrics every controller reports (reconcile durations and
    /// errors); unregistered unless the process hands its own.
    pub controller_metrics: ControllerMetrics,
    /// The most runners a set has, whatever its `replicas` say
    /// (`--max-runners-per-scale-set`): the listener never asks for more,
    /// and a hand-edited `replicas` is held to it too.
    pub runner_cap: u32,
    /// The scale sets this replica serves ([`crate::sharding`]): a runner
    /// set is served with its scale set.
    pub shards: crate::sharding::Shards,
    /// Where each set says on what terms its runners are renewed in place
    /// by their own controller when they finish ([`crate::backlog`]).
    pub backlogs: crate::backlog::Backlogs,
    /// The host's budget of status writes that only inform
    /// ([`crate::controllers::kit::budget`]): a set's status that only
    /// moves its runner counts waits for it.
    pub status_budget: WriteBudget,
    /// The runners it made, handed to their controller's admission
    /// ([`crate::controllers::kit::made`]).
    pub made_runners: crate::controllers::kit::made::MadeRunners,
    /// What the controller remembers of each set between passes, by uid.
    memory: std::sync::Mutex<std::collections::HashMap<String, SetMemory>>,
    /// The runners as the controller's watch holds them, while it runs.
    runner_cache: std::sync::Mutex<Option<Arc<RunnerCache>>>,
}

/// The runners as the controller's watch holds them, and what the API
/// server last said of each set's runners, so a pass reads its runners
/// from the watch where the watch shows every write of the set's own
/// ([`GroupExpectations`]) and lists them from the API server only where
/// it does not: a cache behind the set's own creations would create a
/// runner twice, one behind its deletions would count a runner that is
/// going. Runners changed by others (the runner controller's status
/// writes) are as current in the cache as they need be: every write the
/// set makes on a runner is conditional on the version it read, and a
/// refusal makes it read again.
struct RunnerCache {
    store: reflector::Store<EphemeralRunner>,
    known: GroupExpectations,
}

impl RunnerCache {
    /// The runners of the set `set` (its namespace, name and uid) as the
    /// cache holds them, if it shows everything known of them.
    fn runners_of(&self, namespace: &str, name: &str, uid: &str) -> Option<Vec<EphemeralRunner>> {
        let mine: Vec<Arc<EphemeralRunner>> = self
            .store
            .state()
            .into_iter()
            .filter(|r| {
                r.namespace().as_deref() == Some(namespace)
                    && r.labels()
                        .get(labels::EPHEMERAL_RUNNER_SET)
                        .map(String::as_str)
                        == Some(name)
                    && r.owner_references().iter().any(|o| o.uid == uid)
            })
            .collect();
        let cached = |runner: &str| {
            mine.iter()
                .find(|r| r.metadata.name.as_deref() == Some(runner))
                .map(|r| &r.metadata)
        };
        self.known
            .current(uid, cached)
            .then(|| mine.iter().map(|r| EphemeralRunner::clone(r)).collect())
    }
}

/// What the controller remembers of a set between passes. Nothing here is
/// needed for correctness after a restart: each is a saving that starts
/// over empty.
#[derive(Clone, Copy, Debug, Default)]
struct SetMemory {
    /// When its status was last written (see [`plan::counts_deferred`]).
    pub status_written: Option<Instant>,
    /// The generation whose decision a pass applied (see
    /// [`plan::SetView::decision_applied`]).
    pub decided: Option<i64>,
    /// When its finalizer was removed: a pass queued behind that one reads
    /// the set from a cache that may not show the removal yet, and must
    /// neither act nor bring the set's metrics back.
    pub released: Option<Instant>,
}

/// How long a released set is remembered: far longer than a watch takes
/// to deliver its deletion.
const RELEASED_KEPT: Duration = Duration::from_secs(300);

impl Context {
    /// A context reporting events as this controller.
    pub fn new(client: kube::Client, metrics: SetMetrics) -> Self {
        Self {
            publisher: super::kit::Publisher::new(client.clone(), CONTROLLER_NAME),
            client,
            metrics,
            controller_metrics: ControllerMetrics::default(),
            runner_cap: super::kit::DEFAULT_RUNNER_CAP,
            shards: crate::sharding::Shards::single(),
            backlogs: crate::backlog::Backlogs::new(),
            status_budget: WriteBudget::default(),
            made_runners: crate::controllers::kit::made::MadeRunners::default(),
            memory: std::sync::Mutex::default(),
            runner_cache: std::sync::Mutex::default(),
        }
    }

    /// The runners' cache, while the controller runs.
    fn runner_cache(&self) -> Option<Arc<RunnerCache>> {
        self.runner_cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Records what the API server said of the runner `name` of the set
    /// whose uid is `set` (see [`GroupExpectations::record`]).
    fn record_runner(&self, set: &str, name: &str, known: Option<Known>) {
        if let Some(cache) = self.runner_cache() {
            cache.known.record(set, name, known);
        }
    }

    /// What the controller remembers of the set whose uid is `uid`.
    fn recall(&self, uid: &str) -> SetMemory {
        self.memories().get(uid).copied().unwrap_or_default()
    }

    /// Changes what the controller remembers of the set whose uid is `uid`.
    fn remember(&self, uid: &str, change: impl FnOnce(&mut SetMemory)) {
        change(self.memories().entry(uid.to_owned()).or_default());
    }

    /// The set `labels` names, whose uid is `uid`, is released (its
    /// finalizer removed) or gone (whoever deleted it): its series go, and
    /// what the controller remembers of it but that.
    fn release(&self, labels: &metrics::SetLabels, uid: &str) {
        self.backlogs
            .offer(&SetKey::new(&labels.namespace, &labels.name), None);
        self.metrics.forget(labels);
        self.forget(uid);
        if let Some(cache) = self.runner_cache() {
            cache.known.forget(uid);
        }
    }

    /// Forgets the set whose uid is `uid`, but that it was released: it is
    /// gone. Sets released long ago are forgotten whole.
    fn forget(&self, uid: &str) {
        let mut memories = self.memories();
        memories.retain(|_, m| m.released.is_none_or(|at| at.elapsed() < RELEASED_KEPT));
        memories.insert(
            uid.to_owned(),
            SetMemory {
                released: Some(Instant::now()),
                ..SetMemory::default()
            },
        );
    }

    fn memories(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, SetMemory>> {
        self.memory.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One pass: observe, plan, apply, in the plan's order: finalizer,
/// deletions, renewals, creations, then the status, last.
async fn reconcile(set: Arc<EphemeralRunnerSet>, ctx: Arc<Context>) -> Result<Action, Error> {
    // Another replica's: it holds the scale set's shard.
    if !ctx.shards.owns_object(set.as_ref(), false) {
        return Ok(Action::await_change());
    }
    let _timer = ctx.controller_metrics.time(CONTROLLER_NAME);
    // Released already and about to go: a pass queued behind the last one
    // has nothing to do, and must not bring the set's metrics back.
    // (The cache may even predate the deletion.)
    let released = (set.metadata.deletion_timestamp.is_some()
        && !super::kit::finalizer::held(
            set.as_ref(),
            &crate::api::finalizers::EPHEMERAL_RUNNER_SET,
        ))
        || set
            .uid()
            .is_some_and(|uid| ctx.recall(&uid).released.is_some());
    if released {
        return Ok(Action::await_change());
    }
    let observed = observe::observe(&set, &ctx).await?;
    let plan = plan::plan(&observed.set, &observed.views);
    tracing::debug!(set = %set.name_any(), ?plan, "planned");
    // Said before the writes: a runner finishing meanwhile is renewed on
    // what this pass found, as the pass's own renewals are.
    let terms = plan::renewal_terms(&observed.set, &plan).map(|applied_revision| {
        Arc::new(Terms {
            prototype: observed.template.clone(),
            applied_revision,
            generation: observed.set.generation,
        })
    });
    ctx.backlogs.offer(
        &SetKey::new(
            &observed.metric_labels.namespace,
            &observed.metric_labels.name,
        ),
        terms,
    );
    let apply = Apply::new(&ctx, &set);
    if plan.add_finalizer {
        apply.add_finalizer().await?;
        return Ok(Action::requeue(Duration::ZERO));
    }
    delete_runners(&apply, &observed, &plan).await?;
    for notice in plan.deletion_events.iter().cloned() {
        apply.publish(notice).await;
    }
    // No event for renewals and creations: runners are created and renewed
    // as jobs come and go, an event write per job for what the status
    // counts say.
    let not_renewed = renew_runners(&apply, &observed, &plan).await;
    if let Some(creation) = plan.creation(not_renewed.count) {
        // One after another: the last, the one that completes the decision,
        // carries its patch id only once all before it exist (rule 9).
        for index in 0..creation.count {
            apply
                .create(creation, creation.patch_id_of(index, creation.count))
                .await?;
        }
    }
    if let Some(error) = not_renewed.first {
        return Err(error);
    }
    if let Some(generation) = plan.decided {
        ctx.remember(&observed.uid, |m| m.decided = Some(generation));
    }
    // Counts alone wait for the host's status budget, and are written by a
    // later pass (the counts as they are then).
    let put_off = plan.status.is_some() && plan.status_informs_only && !ctx.status_budget.take();
    if let Some(status) = plan.status.as_ref().filter(|_| !put_off) {
        // Last: the applied revision it may carry must not be recorded
        // before the cleanup it stands for went through.
        apply.write_status(status).await?;
        ctx.remember(&observed.uid, |m| m.status_written = Some(Instant::now()));
        for notice in plan.status_events.iter().cloned() {
            apply.publish(notice).await;
        }
    }
    if plan.remove_finalizer {
        apply.remove_finalizer().await?;
        ctx.release(&observed.metric_labels, &observed.uid);
        return Ok(Action::await_change());
    }
    // Unless the set went while this pass ran (its series are gone then).
    // The counts are the status as written now, or as it stands: a host
    // that just started reports them before anything changes.
    if ctx.recall(&observed.uid).released.is_none() {
        ctx.metrics
            .desired
            .get_or_create(&observed.metric_labels)
            .set(i64::from(set.spec.replicas));
        if let Some(status) = plan.status.as_ref().or(set.status.as_ref()) {
            ctx.metrics
                .counts(&observed.metric_labels, &observed.arc_labels, status);
        }
    }
    if put_off {
        return Ok(Action::requeue(plan.requeue.min(budget::RETRY)));
    }
    Ok(Action::requeue(plan.requeue))
}

/// Deletes the runners the plan says, all of them even when one fails;
/// then fails with the first failure (typically a conflict: the runner
/// changed since the pass read it, and the next pass decides again).
async fn delete_runners(apply: &Apply<'_>, observed: &Observed, plan: &Plan) -> Result<(), Error> {
    let mut failures = Vec::new();
    for (name, _) in &plan.delete {
        let Some(runner) = observed.runner(name) else {
            continue;
        };
        if let Err(error) = apply.delete(runner).await {
            tracing::info!(%error, "runner not deleted; the next pass decides again");
            failures.push(error);
        }
    }
    failures.into_iter().next().map_or(Ok(()), Err)
}

/// The renewals of a pass that did not go through.
#[derive(Debug, Default)]
struct NotRenewed {
    /// How many.
    count: usize,
    /// The error that ended the first of them, which fails the pass once
    /// the creations made up for them.
    first: Option<Error>,
}

/// Carries each renewal of the plan to its end, the plan deciding each
/// next step ([`plan::renewal`]) and this reading the runner again when it
/// asks.
async fn renew_runners(apply: &Apply<'_>, observed: &Observed, plan: &Plan) -> NotRenewed {
    let mut not_renewed = NotRenewed::default();
    let Some(under) = plan.create else {
        return not_renewed;
    };
    // The renewals complete the decision only when no creation follows
    // them; a creation that makes up for one that failed then does.
    let under = Creation {
        patch_id: under.patch_id_of(0, 1 + under.count),
        ..under
    };
    for name in &plan.renew {
        let Some(mut runner) = observed.runner(name).cloned() else {
            continue;
        };
        let mut tried = Vec::new();
        let mut failure = None;
        loop {
            match plan::renewal(&tried) {
                Ok(RenewalStep::Write) => {
                    let result = apply.renew(&runner, under, observed.now).await;
                    tried.push(Tried::Written(match &result {
                        Ok(()) => Written::Renewed,
                        Err(kube::Error::Api(e)) if e.code == 409 => Written::Changed,
                        Err(_) => Written::Failed,
                    }));
                    failure = result.err().or(failure);
                }
                Ok(RenewalStep::Done { renewed: true }) => break,
                Ok(RenewalStep::Done { renewed: false }) => {
                    not_renewed.count += 1;
                    // Every renewal given up ends on a write refused or
                    // failed, or a read again after one: there is an error.
                    if let Some(source) = failure {
                        let error = Error::Renew {
                            name: name.clone(),
                            source,
                        };
                        tracing::info!(%error, "runner not renewed; a creation makes up for it");
                        not_renewed.first.get_or_insert(error);
                    }
                    break;
                }
                Err(Need::Reread) => {
                    let fresh = observe::reread(&apply.runners, name, observed).await;
                    tried.push(Tried::Reread(match fresh {
                        Ok(Some((fresh, view))) => {
                            runner = fresh;
                            Some(view)
                        }
                        Ok(None) => None,
                        Err(error) => {
                            failure = Some(error);
                            None
                        }
                    }));
                }
            }
        }
    }
    not_renewed
}

/// Retries a failed reconcile soon: everything it does is idempotent.
fn error_policy(set: Arc<EphemeralRunnerSet>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(set = %set.name_any(), error = %error, kind = error.label(), "reconcile failed");
    ctx.controller_metrics.error(CONTROLLER_NAME, error.label());
    Action::requeue(Duration::from_secs(5))
}

/// Runs the controller over the sets of `namespace` (all namespaces when
/// `None`) until `shutdown` is cancelled (then it finishes the reconciles
/// in flight and returns), telling `synced` once the sets are listed.
///
/// The set's own watch delivers every update (the reconciler hands work to
/// its next pass through status writes); the runners' watch goes through
/// [`watch::RunnerFilter`].
pub async fn run(
    ctx: Arc<Context>,
    namespace: Option<&str>,
    concurrency: u16,
    shutdown: CancellationToken,
    synced: super::kit::Synced,
) {
    let (sets, runners): (Api<EphemeralRunnerSet>, Api<EphemeralRunner>) = match namespace {
        Some(ns) => (
            Api::namespaced(ctx.client.clone(), ns),
            Api::namespaced(ctx.client.clone(), ns),
        ),
        None => (Api::all(ctx.client.clone()), Api::all(ctx.client.clone())),
    };
    let (reader, writer) = reflector::store();
    let (runner_store, runner_writer) = reflector::store();
    *ctx.runner_cache.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(RunnerCache {
        store: runner_store,
        known: GroupExpectations::new(&ctx.shards),
    }));
    let on_delete = Arc::clone(&ctx);
    let (events, listed) = synced.on_listed(
        watcher(sets, crate::watch::config())
            .backoff(crate::watch::WatchBackoff::default())
            .modify(crate::watch::without_managed_fields)
            .reflect(writer)
            // A set deleted without a pass of ours releasing it (it never
            // got the finalizer) still takes its series with it.
            .inspect_ok(move |event| {
                if let watcher::Event::Delete(set) = event
                    && let Some(uid) = set.uid()
                {
                    let labels = metrics::SetLabels {
                        namespace: set.namespace().unwrap_or_default(),
                        name: set.name_any(),
                    };
                    on_delete.release(&labels, &uid);
                }
            }),
    );
    let own = controller::trigger_self(events.applied_objects(), ());
    let owned = owned_triggers(
        relist::with_vanished(
            watcher(
                runners,
                crate::watch::config().labels(labels::EPHEMERAL_RUNNER_SET),
            )
            .backoff(crate::watch::WatchBackoff::default())
            .modify(crate::watch::without_managed_fields)
            .reflect(runner_writer),
        ),
        ctx.metrics.clone(),
        ctx.controller_metrics.clone(),
    );
    // The sets of a shard just taken were skipped until now: each is
    // queued once more.
    let gained = {
        let reader = reader.clone();
        ctx.shards.gained().flat_map(move |()| {
            futures::stream::iter(
                reader
                    .state()
                    .iter()
                    .map(|set| Ok(ReconcileRequest::from(ObjectRef::from_obj(set.as_ref()))))
                    .collect::<Vec<_>>(),
            )
        })
    };
    let queue = futures::stream::select_all([own.boxed(), owned.boxed(), gained.boxed()])
        .take_until(shutdown.clone().cancelled_owned());
    let controller = applier(
        |set, ctx| Box::pin(reconcile(set, ctx)),
        error_policy,
        ctx.clone(),
        reader,
        queue,
        controller::Config::default().concurrency(concurrency),
    )
    .for_each(|result| async move {
        if let Err(error) = result {
            tracing::warn!(%error, "ephemeral runner set reconcile failed");
        }
    });
    super::kit::until_shutdown(controller, &shutdown, listed).await;
    // A store no watch feeds any more is never read.
    *ctx.runner_cache.lock().unwrap_or_else(|e| e.into_inner()) = None;
}

/// Runner events turned into wake-ups of their sets, with what the filter
/// dropped counted.
fn owned_triggers(
    events: impl Stream<Item = Result<watcher::Event<EphemeralRunner>, watcher::Error>> + Send + 'static,
    metrics: SetMetrics,
    controller_metrics: ControllerMetrics,
) -> impl Stream<Item = Result<ReconcileRequest<EphemeralRunnerSet>, watcher::Error>> + Send {
    let mut filter = watch::RunnerFilter::default();
    events
        .map_ok(move |event| {
            let requests: Vec<_> = filter
                .judge(event)
                .into_iter()
                .filter_map(|judged| {
                    let namespace = judged.owner.namespace.clone().unwrap_or_default();
                    metrics.runner_update(&namespace, &judged.owner.name, judged.delivered);
                    controller_metrics.owned_update(CONTROLLER_NAME, judged.delivered);
                    judged.delivered.then(|| ReconcileRequest {
                        obj_ref: judged.owner,
                        reason: ReconcileReason::Custom {
                            reason: "an owned EphemeralRunner changed".into(),
                        },
                    })
                })
                .collect();
            futures::stream::iter(requests.into_iter().map(Ok))
        })
        .try_flatten()
}
