//! A cache keyed by what a tenant writes.
//!
//! Some of the host's caches are keyed by values a tenant chooses: a
//! deregistration policy's reference and its settings, a scale set's
//! configuration URL, Secret, proxy and CA. A key costs the tenant one edit,
//! and every distinct key costs the host something that lasts (a ConfigMap
//! watch and a follower task, an HTTP client and its connection pool). A
//! cache that only grows lets one tenant fill the host's memory by editing a
//! field in a loop, and every other tenant's runners pay for it.
//!
//! [`TenantCache`] bounds that growth three ways:
//! - an entry belongs to a namespace, and a namespace holds at most
//!   [`Limits::per_namespace`] entries: past that a key is not kept, and the
//!   caller builds its value for the one use, so the cost of a namespace's
//!   churn falls on that namespace's requests, not on the host's memory;
//! - an entry unused for [`Limits::idle`] goes (a key a tenant edited away
//!   is never asked for again);
//! - the owner drops at once what it knows nothing refers to any more
//!   ([`TenantCache::remove`], [`TenantCache::retain`]).
//!
//! It is a cache and nothing else: whatever it forgets is built again on
//! the next use. Nothing here may hold state a caller cannot rebuild.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Duration;

use tokio::time::Instant;

/// How much a [`TenantCache`] keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Entries kept for one namespace.
    pub per_namespace: usize,
    /// How long an entry nobody asked for stays.
    pub idle: Duration,
}

/// Values keyed by tenant input, bounded per namespace and by idleness; see
/// the module's documentation.
#[derive(Debug)]
pub struct TenantCache<K, V> {
    entries: HashMap<K, Entry<V>>,
    /// Entries per namespace, kept beside `entries` so an insertion does not
    /// count them.
    namespaces: HashMap<String, usize>,
    limits: Limits,
    /// When idle entries were last looked for: at most a few times per idle
    /// period, so a lookup stays O(1) however many entries there are.
    swept_at: Instant,
    refused: u64,
}

#[derive(Debug)]
struct Entry<V> {
    namespace: String,
    value: V,
    used_at: Instant,
}

impl<K: Eq + Hash, V: Clone> TenantCache<K, V> {
    /// An empty cache; `now` starts its idleness clock.
    pub fn new(limits: Limits, now: Instant) -> Self {
        Self {
            entries: HashMap::new(),
            namespaces: HashMap::new(),
            limits,
            swept_at: now,
            refused: 0,
        }
    }

    /// The value under `key`, marked used at `now`.
    pub fn get(&mut self, key: &K, now: Instant) -> Option<V> {
        self.expire(now);
        let entry = self.entries.get_mut(key)?;
        entry.used_at = now;
        Some(entry.value.clone())
    }

    /// Keeps `value` under `key`, which belongs to `namespace`, unless that
    /// namespace already holds its limit; says whether it was kept. A key
    /// already present has its value replaced.
    pub fn insert(&mut self, key: K, namespace: &str, value: V, now: Instant) -> bool {
        self.expire(now);
        if let Some(entry) = self.entries.get_mut(&key) {
            entry.value = value;
            entry.used_at = now;
            return true;
        }
        let held = self.namespaces.get(namespace).copied().unwrap_or(0);
        if held >= self.limits.per_namespace {
            self.refused += 1;
            return false;
        }
        *self.namespaces.entry(namespace.to_owned()).or_insert(0) += 1;
        self.entries.insert(
            key,
            Entry {
                namespace: namespace.to_owned(),
                value,
                used_at: now,
            },
        );
        true
    }

    /// The value under `key`, or `make`'s, kept when the namespace has room.
    pub fn get_or_insert_with(
        &mut self,
        key: &K,
        namespace: &str,
        now: Instant,
        make: impl FnOnce() -> V,
    ) -> V
    where
        K: Clone,
    {
        if let Some(value) = self.get(key, now) {
            return value;
        }
        let value = make();
        self.insert(key.clone(), namespace, value.clone(), now);
        value
    }

    /// Forgets `key`.
    pub fn remove(&mut self, key: &K) -> Option<V> {
        let entry = self.entries.remove(key)?;
        self.uncount(&entry.namespace);
        Some(entry.value)
    }

    /// Keeps only the entries `keep` says something still refers to.
    pub fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        let namespaces = &mut self.namespaces;
        self.entries.retain(|key, entry| {
            let kept = keep(key);
            if !kept {
                uncount(namespaces, &entry.namespace);
            }
            kept
        });
    }

    /// How many entries are kept.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is kept.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The values kept.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.entries.values().map(|entry| &entry.value)
    }

    /// How many keys were not kept because their namespace was full, since
    /// the cache was made: callers log when it reaches a power of two, so a
    /// tenant past its limit is reported without a line per lookup.
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// Drops the entries idle past the limit, at most four times per idle
    /// period.
    fn expire(&mut self, now: Instant) {
        if now.saturating_duration_since(self.swept_at) < self.limits.idle / 4 {
            return;
        }
        self.swept_at = now;
        let idle = self.limits.idle;
        let namespaces = &mut self.namespaces;
        self.entries.retain(|_, entry| {
            let kept = now.saturating_duration_since(entry.used_at) < idle;
            if !kept {
                uncount(namespaces, &entry.namespace);
            }
            kept
        });
    }

    fn uncount(&mut self, namespace: &str) {
        uncount(&mut self.namespaces, namespace);
    }
}

fn uncount(namespaces: &mut HashMap<String, usize>, namespace: &str) {
    if let Some(held) = namespaces.get_mut(namespace) {
        *held -= 1;
        if *held == 0 {
            namespaces.remove(namespace);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        per_namespace: 2,
        idle: Duration::from_secs(60),
    };

    #[test]
    fn a_namespace_keeps_at_most_its_limit_and_others_are_unaffected() {
        let now = Instant::now();
        let mut cache = TenantCache::new(LIMITS, now);
        assert!(cache.insert("a1", "a", 1, now));
        assert!(cache.insert("a2", "a", 2, now));
        assert!(!cache.insert("a3", "a", 3, now), "a is full");
        assert_eq!(cache.get(&"a3", now), None);
        assert_eq!(cache.refused(), 1);
        // Another tenant's keys still fit.
        assert!(cache.insert("b1", "b", 4, now));
        // Replacing a kept key is not growth.
        assert!(cache.insert("a1", "a", 5, now));
        assert_eq!(cache.get(&"a1", now), Some(5));
        assert_eq!(cache.len(), 3);
        // Room made by a removal is usable again.
        assert_eq!(cache.remove(&"a2"), Some(2));
        assert!(cache.insert("a3", "a", 3, now));
        assert_eq!(cache.len(), 3);
    }

    #[test]
    fn entries_unused_for_the_idle_time_go_and_used_ones_stay() {
        let start = Instant::now();
        let mut cache = TenantCache::new(LIMITS, start);
        cache.insert("old", "a", 1, start);
        cache.insert("used", "a", 2, start);
        let later = start + Duration::from_secs(40);
        assert_eq!(cache.get(&"used", later), Some(2));
        let past = start + Duration::from_secs(70);
        assert_eq!(cache.get(&"old", past), None, "idle for 70 s");
        assert_eq!(cache.get(&"used", past), Some(2), "used 30 s ago");
        // The namespace's count went down with the entry.
        assert!(cache.insert("new", "a", 3, past));
    }

    #[test]
    fn retain_drops_what_nothing_refers_to_and_frees_the_namespace() {
        let now = Instant::now();
        let mut cache = TenantCache::new(LIMITS, now);
        cache.insert("a1", "a", 1, now);
        cache.insert("a2", "a", 2, now);
        cache.retain(|key| *key == "a2");
        assert_eq!(cache.values().copied().collect::<Vec<_>>(), [2]);
        assert!(cache.insert("a3", "a", 3, now));
        assert!(!cache.insert("a4", "a", 4, now));
    }

    #[test]
    fn a_key_past_the_limit_is_still_made_for_its_use() {
        let now = Instant::now();
        let mut cache = TenantCache::new(LIMITS, now);
        let mut made = 0;
        for key in ["a1", "a2", "a3", "a3"] {
            cache.get_or_insert_with(&key, "a", now, || {
                made += 1;
                made
            });
        }
        // a3 is made each time it is asked for, and never kept.
        assert_eq!(made, 4);
        assert_eq!(cache.len(), 2);
    }
}
