//! Which scale sets this replica serves, when the fleet is split into
//! shards across replicas (`arcwright run --shards N`).
//!
//! A scale set belongs to one shard, the one its `namespace/name` hashes
//! to ([`shard_of`]); a replica serves the scale sets of the shards it
//! holds, and everything of a scale set follows it: its listener, its
//! reconciles, its runner set's and its runners' reconciles (and so their
//! unregistrations). Who holds which shard is decided by Leases
//! (`runtime::shards`); this module is only the view the controllers and
//! the listener supervisor consult, [`Shards`].
//!
//! ## Why the name, not the uid
//!
//! The key must be known from every object of a scale set alone, without
//! a read: a runner's reconcile decides whether it is this replica's from
//! the runner it was handed. The runner sets and runners carry their scale
//! set's name and namespace as labels (`arcwright.dev/scale-set-name`,
//! `arcwright.dev/scale-set-namespace`), set when they are created; the
//! scale set's uid is on none of them. A scale set deleted and created
//! again under its name lands in the same shard, which is harmless: its
//! old runners, still being cleaned up, are served by the same replica as
//! its new ones.
//!
//! ## The hash is part of the wire
//!
//! Replicas of two releases run side by side during a rolling upgrade, and
//! must agree on every scale set's shard, or a set would be served twice
//! or not at all. So the hash is FNV-1a (64-bit) of the UTF-8 bytes of
//! `namespace/name`, reduced modulo the shard count: defined here, not by
//! a standard library whose hasher may change, and pinned by a test.
//!
//! ## Unsharded
//!
//! With one shard (the default) [`Shards::single`] owns everything and
//! never changes: the controllers behave exactly as they did before
//! sharding existed.

use std::collections::BTreeSet;

use futures::Stream;
use kube::ResourceExt;
use tokio::sync::watch;

use crate::api::labels;

/// The shard of the scale set `namespace/name`, among `count` shards.
pub fn shard_of(namespace: &str, name: &str, count: u32) -> u32 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut hash = OFFSET;
    for byte in namespace
        .bytes()
        .chain(std::iter::once(b'/'))
        .chain(name.bytes())
    {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(PRIME);
    }
    u32::try_from(hash % u64::from(count.max(1))).unwrap_or(0)
}

/// The scale set `object` belongs to, as `(namespace, name)`: a scale set
/// itself, or a runner set or runner by its labels. `None` for an object
/// that carries no scale set's name (made by hand, or by a release that
/// predates the labels): it is served by shard 0's holder, so it is served
/// by exactly one replica all the same.
pub fn scale_set_key<K: ResourceExt>(object: &K, is_scale_set: bool) -> Option<(String, String)> {
    let namespace = object.namespace()?;
    if is_scale_set {
        return Some((namespace, object.name_any()));
    }
    let labels = object.labels();
    let name = labels.get(labels::SCALE_SET_NAME)?;
    let namespace = labels
        .get(labels::SCALE_SET_NAMESPACE)
        .cloned()
        .unwrap_or(namespace);
    Some((namespace, name.clone()))
}

/// The shards this replica holds now, as they change.
///
/// Cheap to clone: every clone sees the same holdings.
#[derive(Clone, Debug)]
pub struct Shards {
    count: u32,
    held: watch::Receiver<BTreeSet<u32>>,
}

impl Shards {
    /// One shard, always held: the unsharded process serves every scale
    /// set.
    pub fn single() -> Self {
        let (tell, held) = watch::channel(BTreeSet::from([0]));
        // Kept open forever so the holdings never read as "closed".
        std::mem::forget(tell);
        Self { count: 1, held }
    }

    /// `count` shards, the ones held told through `held`.
    pub fn new(count: u32, held: watch::Receiver<BTreeSet<u32>>) -> Self {
        Self {
            count: count.max(1),
            held,
        }
    }

    /// How many shards the fleet is split into.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Whether the fleet is split at all.
    pub fn is_sharded(&self) -> bool {
        self.count > 1
    }

    /// The shards held now.
    pub fn held(&self) -> BTreeSet<u32> {
        self.held.borrow().clone()
    }

    /// Whether this replica serves the scale set `namespace/name` now.
    pub fn owns(&self, namespace: &str, name: &str) -> bool {
        self.count == 1
            || self
                .held
                .borrow()
                .contains(&shard_of(namespace, name, self.count))
    }

    /// Whether this replica serves the scale set `object` belongs to
    /// ([`scale_set_key`]).
    pub fn owns_object<K: ResourceExt>(&self, object: &K, is_scale_set: bool) -> bool {
        if self.count == 1 {
            return true;
        }
        match scale_set_key(object, is_scale_set) {
            Some((namespace, name)) => self.owns(&namespace, &name),
            None => self.held.borrow().contains(&0),
        }
    }

    /// A receiver of the holdings, to wait on their changes.
    pub fn subscribe(&self) -> watch::Receiver<BTreeSet<u32>> {
        self.held.clone()
    }

    /// An item each time a shard is gained: what a controller needs to
    /// reconcile every object again (those of the new shard were skipped
    /// until now). Losing a shard needs no reconcile: the skipped objects
    /// are another replica's to act on. Never yields when unsharded.
    pub fn gained(&self) -> impl Stream<Item = ()> + Send + 'static {
        let mut held = self.held.clone();
        let seen = held.borrow_and_update().clone();
        futures::stream::unfold((held, seen), |(mut held, mut seen)| async move {
            loop {
                held.changed().await.ok()?;
                let now = held.borrow_and_update().clone();
                let gained = now.difference(&seen).next().is_some();
                seen = now;
                if gained {
                    return Some(((), (held, seen)));
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    #[test]
    fn the_hash_is_pinned_so_replicas_of_two_releases_agree() {
        // FNV-1a of "ci/linux": a change here moves scale sets between
        // shards while replicas of two releases run side by side.
        assert_eq!(
            shard_of("ci", "linux", u32::MAX),
            u32::try_from(0xcb9f_2718_09d0_f880_u64 % u64::from(u32::MAX)).unwrap()
        );
        assert_eq!(shard_of("ci", "linux", u32::MAX), 3_580_895_128);
        assert_eq!(shard_of("ci", "linux", 1), 0);
        let spread: BTreeSet<u32> = (0..100)
            .map(|i| shard_of("ci", &format!("set-{i}"), 4))
            .collect();
        assert_eq!(
            spread,
            BTreeSet::from([0, 1, 2, 3]),
            "every shard gets sets"
        );
    }

    fn runner(labels: &[(&str, &str)]) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some("runner-abc".into()),
                namespace: Some("ci".into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }
    }

    #[test]
    fn a_runner_belongs_to_the_scale_set_its_labels_name() {
        let labelled = runner(&[(labels::SCALE_SET_NAME, "linux")]);
        assert_eq!(
            scale_set_key(&labelled, false),
            Some(("ci".into(), "linux".into()))
        );
        assert_eq!(
            scale_set_key(&labelled, true),
            Some(("ci".into(), "runner-abc".into())),
            "a scale set is its own key"
        );
        assert_eq!(scale_set_key(&runner(&[]), false), None);
    }

    #[test]
    fn only_the_held_shards_are_owned_and_unlabelled_objects_go_to_shard_zero() {
        let linux = shard_of("ci", "linux", 3);
        let (tell, held) = watch::channel(BTreeSet::from([linux]));
        let shards = Shards::new(3, held);
        assert!(shards.owns("ci", "linux"));
        assert!(shards.owns_object(&runner(&[(labels::SCALE_SET_NAME, "linux")]), false));
        assert_eq!(shards.owns_object(&runner(&[]), false), linux == 0);
        tell.send_replace(BTreeSet::new());
        assert!(!shards.owns("ci", "linux"), "a lost shard is seen at once");
        assert!(Shards::single().owns("any", "thing"));
    }

    #[tokio::test]
    async fn gaining_a_shard_wakes_the_controllers_and_losing_one_does_not() {
        let (tell, held) = watch::channel(BTreeSet::from([0]));
        let shards = Shards::new(3, held);
        let mut gained = std::pin::pin!(shards.gained());
        tell.send_replace(BTreeSet::new());
        tell.send_replace(BTreeSet::from([2]));
        assert_eq!(gained.next().await, Some(()));
        tell.send_replace(BTreeSet::from([1, 2]));
        assert_eq!(gained.next().await, Some(()));
        drop(tell);
        assert_eq!(gained.next().await, None, "ends with the campaign");
    }
}
