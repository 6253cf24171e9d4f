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
