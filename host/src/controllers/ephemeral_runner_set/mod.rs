//! The EphemeralRunnerSet controller: keeps a scale set's runners at what the
//! listener asks for, without ever taking a runner that has a job.
//!
//! Observe, plan, apply: [`reconcile`] reads the set and its runners (listed
//! from the API server, not a cache, so a runner just created is never
//! missed and created twice), [`plan`] decides without I/O, and
//! [`reconcile`] applies the plan with a field manager. [`watch`] decides
//! which runner events wake a set.
//!
//! Every runner records what it was built from: the listener's patch id
//! (ARC's `patch-id` contract), the set's actionable revision, and the set's
//! generation. Those three annotations are what lets the plan tell a stale
//! decision, a stale view and a stale spec apart.

mod error;
pub mod metrics;
pub mod plan;
pub mod reconcile;
pub mod watch;

use std::sync::Arc;

use futures::{Stream, StreamExt, TryStreamExt};
use kube::api::Api;
use kube::runtime::controller::{self, ReconcileReason, ReconcileRequest};
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, applier, watcher};

use tokio_util::sync::CancellationToken;

use crate::api::{EphemeralRunner, EphemeralRunnerSet, labels};
use crate::controllers::metrics::ControllerMetrics;

pub use error::Error;
pub use metrics::SetMetrics;

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
    /// What the controller remembers of each set between passes, by uid.
    pub(crate) memory: std::sync::Mutex<std::collections::HashMap<String, SetMemory>>,
}

/// What the controller remembers of a set between passes. Nothing here is
/// needed for correctness after a restart: each is a saving that starts
/// over empty.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SetMemory {
    /// When its status was last written (see [`plan::counts_deferred`]).
    pub status_written: Option<std::time::Instant>,
    /// The generation whose decision a pass applied (see
    /// [`plan::SetView::decision_applied`]).
    pub decided: Option<i64>,
}

impl Context {
    /// A context reporting events as this controller.
    pub fn new(client: kube::Client, metrics: SetMetrics) -> Self {
        Self {
            publisher: super::kit::Publisher::new(client.clone(), CONTROLLER_NAME),
            client,
            metrics,
            controller_metrics: ControllerMetrics::default(),
            memory: std::sync::Mutex::default(),
        }
    }
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
    let (events, listed) = synced.on_listed(
        watcher(sets, watcher::Config::default())
            .default_backoff()
            .reflect(writer),
    );
    let own = controller::trigger_self(events.applied_objects(), ());
    let owned = owned_triggers(
        watcher(
            runners,
            watcher::Config::default().labels(labels::EPHEMERAL_RUNNER_SET),
        )
        .default_backoff(),
        ctx.metrics.clone(),
        ctx.controller_metrics.clone(),
    );
    let queue = futures::stream::select(own.boxed(), owned.boxed())
        .take_until(shutdown.clone().cancelled_owned());
    let controller = applier(
        |set, ctx| Box::pin(reconcile::reconcile(set, ctx)),
        reconcile::error_policy,
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
