//! The credentials Secret's finalizer: a scale set holds the Secret it
//! names so that its teardown can still reach the Actions service, and the
//! last set to go releases it.
//!
//! Every set of a Secret shares one finalizer, so a set that finds it held
//! does nothing, and a set going away releases it only when no other set
//! names the Secret. Those two reads race: a set created after the leaving
//! set listed its peers, and which reads the Secret before the release,
//! takes the finalizer for its own and is left with a Secret nobody holds
//! until something else wakes it. So the release lists the peers again
//! after its write, and a peer found then gets the finalizer back. A peer
//! created after that list reads the Secret after the release and holds it
//! itself. (A finalizer per set would need no second look, but would grow
//! a Secret shared by a thousand sets by a thousand names.)

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::api::ListParams;
use kube::core::PartialObjectMeta;
use kube::{Api, Client, ResourceExt};

use crate::api::{AutoscalingRunnerSet, field_managers, finalizers};
use crate::controllers::kit::finalizer;

const FIELD_MANAGER: &str = field_managers::AUTOSCALING_RUNNER_SET;

/// What a release came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Released {
    /// The finalizer is gone (or the Secret is).
    Released,
    /// A set that names the Secret appeared while it was released, and
    /// holds it now.
    HeldForAnother,
}

/// How long a Secret seen holding the finalizer is taken to hold it still
/// without a read. Only this controller removes the finalizer, and it
/// forgets what it saw when it does; the re-read after this long is for a
/// hand that removed it, which the next pass then puts back.
pub const RECHECK: Duration = Duration::from_secs(60);

/// The credentials Secrets this controller last saw held, and when: a pass
/// over a set whose Secret is known held reads nothing, where it read the
/// Secret's metadata on every pass (two a job under load). A set being
/// deleted reads anyway: what its release decides on is worth a read.
#[derive(Default)]
pub struct KnownHeld {
    seen: Mutex<HashMap<(String, String), Instant>>,
}

impl KnownHeld {
    /// Whether `namespace/secret` was seen held within [`RECHECK`].
    pub fn held(&self, namespace: &str, secret: &str) -> bool {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.get(&(namespace.to_owned(), secret.to_owned()))
            .is_some_and(|at| at.elapsed() < RECHECK)
    }

    /// Records what a read or a write showed of `namespace/secret`. The
    /// entries past [`RECHECK`] go whenever one is added, so a tenant
    /// naming Secrets by the thousand keeps a minute's worth at most.
    pub fn saw(&self, namespace: &str, secret: &str, held: bool) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let key = (namespace.to_owned(), secret.to_owned());
        if held {
            seen.retain(|_, at| at.elapsed() < RECHECK);
            seen.insert(key, Instant::now());
        } else {
            seen.remove(&key);
        }
    }
}

/// Puts the finalizer on the Secret `secret` in `namespace`, unless it is
/// there or the Secret is gone.
pub async fn hold(client: &Client, namespace: &str, secret: &str) -> Result<(), kube::Error> {
    let api: Api<PartialObjectMeta<Secret>> = Api::namespaced(client.clone(), namespace);
    let Some(found) = read(client, namespace, secret).await? else {
        return Ok(());
    };
    finalizer::add(&api, &found, &finalizers::CREDENTIALS_IN_USE, FIELD_MANAGER).await
}

/// Takes the finalizer off the Secret `secret` for `leaving`, the set that
/// no longer needs it, then looks for a set that names it once more.
pub async fn release(
    client: &Client,
    namespace: &str,
    secret: &str,
    leaving: &AutoscalingRunnerSet,
) -> Result<Released, kube::Error> {
    let api: Api<PartialObjectMeta<Secret>> = Api::namespaced(client.clone(), namespace);
    let Some(found) = read(client, namespace, secret).await? else {
        return Ok(Released::Released);
    };
    if !finalizer::held(&found, &finalizers::CREDENTIALS_IN_USE) {
        return Ok(Released::Released);
    }
    finalizer::remove(&api, &found, &finalizers::CREDENTIALS_IN_USE, FIELD_MANAGER).await?;
    let sets: Api<AutoscalingRunnerSet> = Api::namespaced(client.clone(), namespace);
    if !named_by_another(&sets, leaving, secret).await? {
        return Ok(Released::Released);
    }
    hold(client, namespace, secret).await?;
    tracing::info!(
        %namespace,
        %secret,
        "a scale set created while the credentials Secret was released names it; held again"
    );
    Ok(Released::HeldForAnother)
}

/// Whether a set other than `set` names the Secret `name`, read from the
/// API server (a cache could miss the set just created); a set being
/// deleted counts too: its teardown needs the Secret until it is gone.
pub async fn named_by_another(
    sets: &Api<AutoscalingRunnerSet>,
    set: &AutoscalingRunnerSet,
    name: &str,
) -> Result<bool, kube::Error> {
    Ok(sets
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .any(|other| other.uid() != set.uid() && other.spec.github_config_secret == name))
}

async fn read(
    client: &Client,
    namespace: &str,
    secret: &str,
) -> Result<Option<PartialObjectMeta<Secret>>, kube::Error> {
    Api::<Secret>::namespaced(client.clone(), namespace)
        .get_metadata_opt(secret)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_seen_held_is_known_until_released_and_others_are_not() {
        let known = KnownHeld::default();
        assert!(!known.held("ns", "github"));
        known.saw("ns", "github", true);
        assert!(known.held("ns", "github"));
        assert!(!known.held("other", "github"));
        assert!(!known.held("ns", "other"));
        known.saw("ns", "github", false);
        assert!(!known.held("ns", "github"));
    }

    #[test]
    fn a_secret_seen_held_too_long_ago_is_read_again_and_forgotten() {
        let known = KnownHeld::default();
        let long_ago = Instant::now()
            .checked_sub(RECHECK)
            .expect("the clock is past a minute");
        known
            .seen
            .lock()
            .unwrap()
            .insert(("ns".into(), "stale".into()), long_ago);
        assert!(!known.held("ns", "stale"));
        known.saw("ns", "fresh", true);
        let seen = known.seen.lock().unwrap();
        assert_eq!(seen.len(), 1, "the stale entry went when another came");
    }
}
