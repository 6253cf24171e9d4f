//! Adding and removing a controller's finalizer, the one way every
//! controller does it.
//!
//! The write is a merge patch of the whole finalizer list carrying the
//! resourceVersion the object was read at, which makes it a
//! compare-and-swap: a finalizer another controller added after the read
//! is never dropped by a list built from the older copy; the write fails
//! with a conflict instead, and the next reconcile works from the new copy.
//! An object already gone has nothing left to hold or release, so a 404 is
//! success. Former names of the finalizer ([`Finalizer::formerly`]) count
//! as held and are removed with it, so objects finalized by an older
//! version are released by this one.

use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::api::Finalizer;

/// Whether `object` holds `finalizer` (under its name or a former one).
pub fn held<K: Resource>(object: &K, finalizer: &Finalizer) -> bool {
    finalizer.held_in(object.meta().finalizers.as_deref().unwrap_or_default())
}

/// Adds `finalizer` to `object`, unless it holds it already.
pub async fn add<K>(
    api: &Api<K>,
    object: &K,
    finalizer: &Finalizer,
    field_manager: &str,
) -> Result<(), kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    if held(object, finalizer) {
        return Ok(());
    }
    write(
        api,
        object,
        finalizer.added_to(object.finalizers()),
        field_manager,
    )
    .await
}

/// Removes `finalizer` (and its former names) from `object`.
pub async fn remove<K>(
    api: &Api<K>,
    object: &K,
    finalizer: &Finalizer,
    field_manager: &str,
) -> Result<(), kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    if !held(object, finalizer) {
        return Ok(());
    }
    write(
        api,
        object,
        finalizer.removed_from(object.finalizers()),
        field_manager,
    )
    .await
}

async fn write<K>(
    api: &Api<K>,
    object: &K,
    finalizers: Vec<String>,
    field_manager: &str,
) -> Result<(), kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let patch = json!({"metadata": {
        "finalizers": finalizers,
        "resourceVersion": object.resource_version(),
    }});
    let params = PatchParams {
        field_manager: Some(field_manager.to_owned()),
        ..PatchParams::default()
    };
    match api
        .patch(&object.name_any(), &params, &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(error) => Err(error),
    }
}
