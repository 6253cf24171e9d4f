//! Leader election: with several replicas of the host, only the holder of a
//! `coordination.k8s.io` Lease runs the controllers and the listeners.
//!
//! Two leaders would each hold message sessions and each scale the same
//! sets; the Actions service refuses a second session for a scale set, so
//! the second listener would retry forever, but two EphemeralRunnerSet
//! controllers would race on the same runners. One leader is the simple
//! answer, and the standbys cost only a Lease watch.
//!
//! What the runtime does with it:
//! - components marked [`Component::leader_only`](super::Component::leader_only)
//!   start once this replica holds the Lease (the policy warm-up and the API
//!   check run on every replica, so a standby is ready to take over);
//! - a standby is *ready* (`/readyz` 200): a rollout must not wait for a
//!   replica that is healthy but not leading;
//! - losing the Lease after holding it stops the process with an error, as
//!   controller-runtime does: the controllers' caches and the listeners'
//!   state are not built to pause, and a restart makes the replica a clean
//!   standby;
//! - shutdown releases the Lease after the components returned (message
//!   sessions deleted), so the next leader takes over at once instead of
//!   waiting for the Lease to expire.
//!
//! The Lease itself is `kube-lease-manager`'s: acquire, renew a grace
//! period before expiry, take over an expired one, release.

use std::time::Duration;

use kube::Client;
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder, LeaseManagerError};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Which Lease, and who this replica is.
#[derive(Clone, Debug)]
pub struct Election {
    /// The Lease's namespace.
    pub namespace: String,
    /// The Lease's name.
    pub lease: String,
    /// This replica's identity (its pod name and a random suffix, so two
    /// processes of one pod, old and new, are told apart).
    pub identity: String,
    /// How long an unrenewed Lease stays with its holder.
    pub duration: Duration,
}

/// A campaign under way: whether this replica leads, as it changes.
pub struct Leadership {
    leading: watch::Receiver<bool>,
    task: JoinHandle<Result<LeaseManager, LeaseManagerError>>,
}

impl Election {
    /// Creates the Lease if missing and starts campaigning for it.
    pub async fn start(self, client: Client) -> Result<Leadership, LeaseManagerError> {
        let seconds = self.duration.as_secs().max(2);
        // Renew a third of the way before expiry: time for two attempts
        // before another replica may take the Lease.
        let grace = (seconds / 3).max(1);
        let manager = LeaseManagerBuilder::new(client, &self.lease)
            .with_namespace(&self.namespace)
            .with_identity(&self.identity)
            .with_duration(seconds)
            .with_grace(grace)
            .with_field_manager("arcwright-leader-election")
            .build()
            .await?;
        tracing::info!(
            lease = %self.lease,
            namespace = %self.namespace,
            identity = %self.identity,
            "campaigning for leadership"
        );
        let (leading, task) = manager.watch().await;
        Ok(Leadership { leading, task })
    }
}

impl Leadership {
    /// A receiver of whether this replica leads now.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.leading.clone()
    }

    /// Resolves when leadership, once held, is lost (or the campaign ended
    /// while leading). Never resolves for a standby that never led.
    pub async fn lost(&mut self) {
        if self.leading.wait_for(|leading| *leading).await.is_err() {
            return std::future::pending().await;
        }
        let _ = self.leading.wait_for(|leading| !*leading).await;
    }

    /// Ends the campaign and releases the Lease if this replica holds it.
    /// Every receiver from [`Leadership::subscribe`] must be dropped first:
    /// the campaign releases once nobody listens.
    pub async fn release(self) {
        let Self { leading, task } = self;
        drop(leading);
        match tokio::time::timeout(Duration::from_secs(5), task).await {
            Ok(Ok(Ok(_))) => tracing::info!("leadership released"),
            Ok(Ok(Err(error))) => tracing::warn!("the Lease was not released: {error}"),
            Ok(Err(_)) | Err(_) => tracing::warn!("the Lease was not released in time"),
        }
    }
}
