//! What `arcwright run` runs: the list of components, in start order.
//!
//! Adding a controller is one line here:
//! `Component::new("ephemeral-runner", controllers::ephemeral_runner::run)`,
//! where `run(ctx: Context)` is an async function returning
//! `Result<(), its own error>`.

use std::time::Duration;

use super::{BoxError, Component, Context};
use crate::policy::PolicyKind;
use crate::policy::metrics::DecisionLabels;

/// Every component of the process.
pub fn components() -> Vec<Component> {
    vec![
        Component::new("kubernetes", kubernetes),
        Component::new("policy", policy),
    ]
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

/// Compiles the bundled default of every kind before saying ready: the
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
