//! Owned watches that wake the owner only when something it reads changed
//! (seed 004's predicates).
//!
//! An owned object is rewritten far more often than its owner cares: a
//! runner pod's status moves with every probe and image pull, an
//! EphemeralRunnerSet's counters with every runner. Each owned watch is
//! given a projection, the part of the object its owner's reconciler
//! reads, and an update whose projection equals the last one delivered for
//! that object is dropped. A predicate may only ever be an optimisation, so
//! a projection must be exactly what the reconciler reads (best: the very
//! function that builds the reconciler's view), first sights and deletions
//! always pass, and primary watches are never filtered.

use std::collections::HashMap;

use futures::{Stream, StreamExt};
use kube::Resource;
use kube::runtime::watcher;

/// Remembers the last projection delivered per object (by uid).
pub struct ProjectionFilter<K, P> {
    project: fn(&K) -> P,
    seen: HashMap<String, P>,
}

impl<K: Resource, P: PartialEq> ProjectionFilter<K, P> {
    /// A filter judging objects by `project`.
    pub fn new(project: fn(&K) -> P) -> Self {
        Self {
            project,
            seen: HashMap::new(),
        }
    }

    /// Whether `event` should wake the owner: a change of the projection, a
    /// first sight, or a deletion (which also forgets the object).
    pub fn admit(&mut self, event: &watcher::Event<K>) -> bool {
        match event {
            watcher::Event::Apply(object) | watcher::Event::InitApply(object) => {
                let key = object.meta().uid.clone().unwrap_or_default();
                let projection = (self.project)(object);
                if self.seen.get(&key) == Some(&projection) {
                    return false;
                }
                self.seen.insert(key, projection);
                true
            }
            watcher::Event::Delete(object) => {
                self.seen
                    .remove(&object.meta().uid.clone().unwrap_or_default());
                true
            }
            watcher::Event::Init | watcher::Event::InitDone => true,
        }
    }
}

/// The objects of a watch that should wake their owner; `judged` hears,
/// for each object event, whether it passed (for
/// `arcwright_owned_updates_total`).
pub fn filtered<K, P>(
    events: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    project: fn(&K) -> P,
    judged: impl Fn(bool) + Send + 'static,
) -> impl Stream<Item = Result<K, watcher::Error>>
where
    K: Resource,
    P: PartialEq,
{
    let mut filter = ProjectionFilter::new(project);
    events
        .filter_map(move |event| {
            let keep = match &event {
                Ok(event) => {
                    let keep = filter.admit(event);
                    if !matches!(event, watcher::Event::Init | watcher::Event::InitDone) {
                        judged(keep);
                    }
                    keep
                }
                Err(_) => true,
            };
            futures::future::ready(keep.then_some(event))
        })
        .flat_map(|event| {
            futures::stream::iter(match event {
                Ok(watcher::Event::Apply(object))
                | Ok(watcher::Event::InitApply(object))
                | Ok(watcher::Event::Delete(object)) => vec![Ok(object)],
                Ok(_) => Vec::new(),
                Err(error) => vec![Err(error)],
            })
        })
}
