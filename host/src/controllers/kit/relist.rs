//! Owned objects that went while their watch was re-listing.
//!
//! A watch that breaks (the API server restarted, a `410 Gone`) lists
//! again, and an object deleted in between is simply absent from the new
//! list: the watcher yields no event for it, the reflector's store drops it
//! silently, and its owner is never woken. For an EphemeralRunner that had
//! just deleted its JIT Secret and waits for that deletion to be seen
//! before it lets go of its finalizer, that meant a runner left
//! terminating for good (the fault matrix's API server restart cell found
//! it). [`with_vanished`] remembers the objects a watch has delivered and,
//! when a re-list ends, delivers a deletion for each one it did not list.
//!
//! What is remembered is a tombstone: name, namespace, uid and owner
//! references, which is all an owner lookup reads, so the memory is a
//! small fraction of the store's.

use std::collections::{HashMap, HashSet};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::core::{PartialObjectMeta, PartialObjectMetaExt};
use kube::runtime::watcher;

use crate::api::{EphemeralRunner, EphemeralRunnerSet};

/// An object standing for a deleted one of its kind: only its metadata.
pub trait Tombstone: Resource + Sized {
    /// An object with `metadata` and nothing else.
    fn tombstone(metadata: ObjectMeta) -> Self;
}

impl Tombstone for Pod {
    fn tombstone(metadata: ObjectMeta) -> Self {
        Self {
            metadata,
            ..Self::default()
        }
    }
}

/// The watches that keep metadata only (Secrets: see
/// `ephemeral_runner::resources::read_jit_secret_meta`).
impl<K: Resource> Tombstone for PartialObjectMeta<K>
where
    PartialObjectMeta<K>: Resource,
{
    fn tombstone(metadata: ObjectMeta) -> Self {
        metadata.into_response_partial()
    }
}

impl Tombstone for EphemeralRunner {
    fn tombstone(metadata: ObjectMeta) -> Self {
        Self {
            metadata,
            spec: Default::default(),
            status: None,
        }
    }
}

impl Tombstone for EphemeralRunnerSet {
    fn tombstone(metadata: ObjectMeta) -> Self {
        Self {
            metadata,
            spec: Default::default(),
            status: None,
        }
    }
}

/// What a watch has delivered, by uid, and what the re-list under way has
/// listed so far.
#[derive(Debug, Default)]
pub struct Relist {
    seen: HashMap<String, ObjectMeta>,
    listing: Option<HashSet<String>>,
}

impl Relist {
    /// `event`, followed (when it ends a re-list) by a deletion for every
    /// object delivered before and not listed this time.
    pub fn observe<K: Tombstone>(&mut self, event: watcher::Event<K>) -> Vec<watcher::Event<K>> {
        match &event {
            watcher::Event::Init => self.listing = Some(HashSet::new()),
            watcher::Event::InitApply(object) | watcher::Event::Apply(object) => {
                if let Some(uid) = object.meta().uid.clone() {
                    if let (Some(listing), watcher::Event::InitApply(_)) =
                        (&mut self.listing, &event)
                    {
                        listing.insert(uid.clone());
                    }
                    self.seen.insert(uid, tombstone_meta(object.meta()));
                }
            }
            watcher::Event::Delete(object) => {
                if let Some(uid) = &object.meta().uid {
                    self.seen.remove(uid);
                }
            }
            watcher::Event::InitDone => {
                let Some(listed) = self.listing.take() else {
                    return vec![event];
                };
                let gone: Vec<String> = self
                    .seen
                    .keys()
                    .filter(|uid| !listed.contains(*uid))
                    .cloned()
                    .collect();
                let mut events = vec![event];
                events.extend(
                    gone.into_iter()
                        .filter_map(|uid| self.seen.remove(&uid))
                        .map(|meta| watcher::Event::Delete(K::tombstone(meta))),
                );
                return events;
            }
        }
        vec![event]
    }
}

fn tombstone_meta(meta: &ObjectMeta) -> ObjectMeta {
    ObjectMeta {
        name: meta.name.clone(),
        namespace: meta.namespace.clone(),
        uid: meta.uid.clone(),
        owner_references: meta.owner_references.clone(),
        ..ObjectMeta::default()
    }
}

/// `events` with a deletion delivered for each object that went while the
/// watch was re-listing (see the module's documentation).
pub fn with_vanished<K, E>(
    events: impl Stream<Item = Result<watcher::Event<K>, E>>,
) -> impl Stream<Item = Result<watcher::Event<K>, E>>
where
    K: Tombstone,
{
    let mut relist = Relist::default();
    events.flat_map(move |event| {
        futures::stream::iter(match event {
            Ok(event) => relist.observe(event).into_iter().map(Ok).collect(),
            Err(error) => vec![Err(error)],
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Secrets as the runner controller watches them: metadata only.
    type Secret = PartialObjectMeta<k8s_openapi::api::core::v1::Secret>;

    fn secret(uid: &str) -> Secret {
        ObjectMeta {
            name: Some(format!("secret-{uid}")),
            namespace: Some("ns".into()),
            uid: Some(uid.into()),
            owner_references: Some(vec![Default::default()]),
            labels: Some([("a".to_string(), "b".to_string())].into()),
            ..ObjectMeta::default()
        }
        .into_response_partial()
    }

    fn deleted(events: &[watcher::Event<Secret>]) -> Vec<String> {
        events
            .iter()
            .filter_map(|e| match e {
                watcher::Event::Delete(s) => s.metadata.uid.clone(),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn an_object_missing_from_a_relist_is_delivered_as_deleted_with_its_owners() {
        let mut relist = Relist::default();
        for uid in ["a", "b", "c"] {
            relist.observe(watcher::Event::Apply(secret(uid)));
        }
        relist.observe(watcher::Event::Delete(secret("c")));
        assert!(relist.observe::<Secret>(watcher::Event::Init).len() == 1);
        relist.observe(watcher::Event::InitApply(secret("a")));
        let done = relist.observe::<Secret>(watcher::Event::InitDone);
        assert!(matches!(done[0], watcher::Event::InitDone));
        assert_eq!(
            deleted(&done),
            ["b"],
            "c was deleted in sight, a was listed"
        );
        let watcher::Event::Delete(gone) = &done[1] else {
            unreachable!()
        };
        assert_eq!(gone.metadata.name.as_deref(), Some("secret-b"));
        assert_eq!(
            gone.metadata.owner_references.as_ref().map(Vec::len),
            Some(1)
        );
        assert!(
            gone.metadata.labels.is_none(),
            "a tombstone keeps what owners read"
        );
        // A second InitDone, or one outside a relist, delivers nothing more.
        assert!(deleted(&relist.observe::<Secret>(watcher::Event::InitDone)).is_empty());
    }

    #[test]
    fn the_first_list_delivers_no_deletion() {
        let mut relist = Relist::default();
        relist.observe::<Secret>(watcher::Event::Init);
        relist.observe(watcher::Event::InitApply(secret("a")));
        assert!(deleted(&relist.observe::<Secret>(watcher::Event::InitDone)).is_empty());
    }
}
