//! What `arcwright run` runs: the list of components, in start order.
//!
//! Adding a controller is one line in [`components`] and a function here
//! that builds it from the shared parts, runs it once per watched
//! namespace (or once for all), opens its readiness gate when every
//! instance has listed its objects, and returns when shutdown is asked for.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::future::join_all;

use super::options::WatchScope;
use super::{BoxError, Component, Context, ReadinessGate};
use crate::controllers::{self, kit::Synced};
use crate::listener::Supervisor;
use crate::listener::cluster::ClusterView;
use crate::policy::PolicyKind;
use crate::policy::metrics::DecisionLabels;
use crate::unregistration::PoolConfig;

/// Every component of the process.
pub fn components() -> Vec<Component> {
    vec![
        Component::new("kubernetes", kubernetes),
        Component::new("policy", policy),
        Component::new("ephemeral-runner", ephemeral_runners).leader_only(),
        Component::new("ephemeral-runner-set", ephemeral_runner_sets).leader_only(),
        Component::new("autoscaling-runner-set", autoscaling_runner_sets).leader_only(),
    ]
}

/// The namespaces a controller instance runs for: `None` is all of them.
fn namespaces(scope: &WatchScope) -> Vec<Option<String>> {
    match scope {
        WatchScope::All => vec![None],
        WatchScope::Namespaces(names) => names.iter().cloned().map(Some).collect(),
    }
}

/// One [`Synced`] per instance; the gate opens when all have synced.
fn synced_all(gate: &ReadinessGate, instances: usize) -> Synced {
    let remaining = Arc::new(AtomicUsize::new(instances));
    let gate = gate.clone();
    Synced::new(move || {
        if remaining.fetch_sub(1, Ordering::SeqCst) == 1 {
            gate.ready();
        }
    })
}

/// The EphemeralRunner controller and its unregistration pool (seed 000).
async fn ephemeral_runners(ctx: Context) -> Result<(), BoxError> {
    use controllers::ephemeral_runner::plan::Settings;
    use controllers::ephemeral_runner::{self, Config, Dependencies};
    let shared = &ctx.shared;
    let scopes = namespaces(&shared.scope);
    let synced = synced_all(&ctx.ready, scopes.len());
    shared.controllers.prime(ephemeral_runner::CONTROLLER);
    let deps = Dependencies {
        client: shared.client.clone(),
        clients: shared.clients.clone(),
        loader: shared.policy.loader.clone(),
        reporter: Arc::clone(&shared.policy.reporter),
        metrics: shared.controllers.clone(),
        unregistration: shared.unregistration.clone(),
        shards: shared.shards.clone(),
        backlogs: shared.backlogs.clone(),
        status_budget: shared.status_budget.clone(),
        made_runners: shared.made_runners.clone(),
    };
    let pool = PoolConfig {
        workers: usize::from(shared.unregistration_workers),
        ..PoolConfig::default()
    };
    join_all(scopes.into_iter().map(|namespace| {
        let config = Config {
            namespace,
            pool: pool.clone(),
            concurrency: shared.reconcile_concurrency,
            slack: shared.debug.slack.clone(),
            settings: Settings {
                failure_limit: usize::from(shared.runner_failure_limit),
                backoff_base: shared.runner_failure_backoff,
                registration_timeout: shared.registration_timeout,
                ..Settings::default()
            },
            ..Config::default()
        };
        ephemeral_runner::run(deps.clone(), config, ctx.shutdown.clone(), synced.clone())
    }))
    .await;
    Ok(())
}

/// The EphemeralRunnerSet controller.
async fn ephemeral_runner_sets(ctx: Context) -> Result<(), BoxError> {
    use controllers::ephemeral_runner_set::{self, Context as SetContext};
    let shared = &ctx.shared;
    let scopes = namespaces(&shared.scope);
    let synced = synced_all(&ctx.ready, scopes.len());
    shared
        .controllers
        .prime(ephemeral_runner_set::CONTROLLER_NAME);
    let mut context = SetContext::new(shared.client.clone(), shared.runner_sets.clone());
    context.controller_metrics = shared.controllers.clone();
    context.runner_cap = shared.max_runners_per_scale_set;
    context.shards = shared.shards.clone();
    context.backlogs = shared.backlogs.clone();
    context.status_budget = shared.status_budget.clone();
    context.made_runners = shared.made_runners.clone();
    let context = Arc::new(context);
    join_all(scopes.iter().map(|namespace| {
        ephemeral_runner_set::run(
            Arc::clone(&context),
            namespace.as_deref(),
            shared.reconcile_concurrency,
            ctx.shutdown.clone(),
            synced.clone(),
        )
    }))
    .await;
    Ok(())
}

/// The AutoscalingRunnerSet controller and the listeners it starts, one
/// task per scale set. On shutdown the controller stops first, then every
/// listener deletes its message session before this returns, so the next
/// holder (this host restarted, or another replica) need not wait for the
/// sessions to expire.
async fn autoscaling_runner_sets(ctx: Context) -> Result<(), BoxError> {
    use controllers::autoscaling_runner_set::{self, Context as SetContext};
    let shared = &ctx.shared;
    let scopes = namespaces(&shared.scope);
    shared.controllers.prime(autoscaling_runner_set::CONTROLLER);
    // Instances: the controller in each scope, and the listeners' cache.
    let synced = synced_all(&ctx.ready, scopes.len() + 1);
    let listeners_stop = ctx.shutdown.child_token();
    let view = ClusterView::watch(&shared.client, &scopes, &listeners_stop);
    {
        let view = view.clone();
        let synced = synced.clone();
        tokio::spawn(async move {
            view.wait_until_ready().await;
            synced.announce();
        });
    }
    let supervisor = Supervisor::new(
        shared.client.clone(),
        shared.clients.clone(),
        shared.policy.loader.clone(),
        view,
        shared.owner.clone(),
        listeners_stop.clone(),
    )
    .with_metrics(shared.listeners.clone())
    .with_batch_window(shared.message_batch_window)
    .with_recordings(shared.recordings.clone())
    .with_shards(shared.shards.clone());
    let supervisor = if shared.renew_in_place {
        supervisor.with_backlogs(shared.backlogs.clone(), shared.status_budget.clone())
    } else {
        supervisor
    };
    let context = Arc::new(
        SetContext::new(
            shared.client.clone(),
            supervisor,
            shared.clients.clone(),
            shared.policy.loader.clone(),
            Arc::clone(&shared.policy.reporter),
        )
        .with_metrics(shared.controllers.clone())
        .with_runner_cap(shared.max_runners_per_scale_set)
        .with_shards(shared.shards.clone()),
    );
    let controllers = join_all(scopes.iter().map(|namespace| {
        autoscaling_runner_set::run(
            Arc::clone(&context),
            namespace.as_deref(),
            ctx.shutdown.clone(),
            synced.clone(),
        )
    }));
    // A lost shard's listeners stop at once, not at the next reconcile.
    tokio::join!(
        controllers,
        context.listeners().follow_shards(&ctx.shutdown)
    );
    context.listeners().stop_all().await;
    listeners_stop.cancel();
    Ok(())
}

/// Ready once the API server has answered, so `/readyz` does not say ready
/// while every request would fail. An API server that does not answer yet
/// is waited for, not a reason to exit: at cluster start-up the controller
/// may well come up first.
async fn kubernetes(ctx: Context) -> Result<(), BoxError> {
    let mut delay = Duration::from_millis(500);
    loop {
        match ctx.shared.client.apiserver_version().await {
            Ok(version) => {
                tracing::info!(
                    version = version.git_version,
                    "the Kubernetes API server answers"
                );
                ctx.ready.ready();
                return Ok(());
            }
            Err(error) => {
                tracing::warn!(retry_in = ?delay, "the Kubernetes API server does not answer: {error}");
            }
        }
        tokio::select! {
            () = ctx.shutdown.cancelled() => return Ok(()),
            () = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(Duration::from_secs(30));
    }
}

/// Checks the configured default policies (a bad one stops the process
/// with its reason, [`crate::policy::defaults`]) and compiles the bundled
/// default of every kind before saying ready: the
/// first reconciles do not each wait for a compilation, and an engine that
/// cannot compile at all (a CPU cranelift does not support, a broken
/// build) stops the process at once with the reason, rather than failing
/// every decision later.
///
/// The defaults' decision series are created at zero meanwhile. Every
/// scale set falls back to them, so the series will exist; having them
/// from the first scrape lets `rate()` see the first decision and lets
/// dashboards and alerts find their metrics before any job ran.
async fn policy(ctx: Context) -> Result<(), BoxError> {
    ctx.shared.policy.loader.check_defaults().await?;
    for kind in PolicyKind::ALL {
        let default = ctx.shared.policy.loader.default_policy(kind).await?;
        let labels = DecisionLabels {
            kind: kind.as_str().to_owned(),
            policy: default.label().to_owned(),
        };
        let _ = ctx.shared.policy.metrics.decisions.get_or_create(&labels);
        let _ = ctx.shared.policy.metrics.duration.get_or_create(&labels);
    }
    tracing::info!("bundled policies compiled");
    ctx.ready.ready();
    Ok(())
}
