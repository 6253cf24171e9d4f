//! What a controller last learnt of an object from the API server itself
//! (the answer to its own write, or a read), so that a watch cache is
//! trusted exactly when it shows at least that much.
//!
//! A watch cache is always behind the API server, and for most decisions
//! that is harmless: a pod that finished a moment ago and still reads as
//! running only delays a step until the watch delivers it, and that
//! delivery wakes the object again. The one harm a cache can do is to be
//! behind the controller's *own* writes: a runner whose JIT config Secret
//! was written a moment ago, read from a cache that does not show it yet,
//! would be registered twice. ReplicaSets meet the same problem with
//! expectations (counts of creations and deletions not yet seen); here it
//! is met per object, since a runner has one pod and one Secret: each
//! write's answer is recorded (`Present` with its uid and resourceVersion,
//! or `Absent`), and a cache whose copy is at least as new is current.
//! Where nothing is recorded (a host that just started, a shard just
//! taken from a replica that may have written a moment before) the caller
//! reads the API server once and records what it found.
//!
//! ResourceVersions are compared as numbers, as Kubernetes 1.35 made
//! them comparable between objects of one resource (KEP-5504, client-go's
//! `CompareResourceVersion`): positive integers, larger is later. One that
//! does not parse is never taken as current, so a server that broke the
//! rule would only cost reads.
//!
//! Holdings of shards change what may have been written behind this
//! replica's back: any change to them forgets everything recorded.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::api::ObjectMeta;
use tokio::sync::watch;

/// What the controller last learnt of one object from the API server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Known {
    /// It existed, as the object with this uid at this resourceVersion
    /// (or later).
    Present {
        /// Its uid: another object under the same name is a different one.
        uid: String,
        /// Its resourceVersion, as a number.
        resource_version: u64,
    },
    /// It did not exist, or was being deleted.
    Absent {
        /// The object deleted, when the answer named it (for the log).
        uid: Option<String>,
    },
}

impl Known {
    /// What `meta` (an answer of the API server) says of the object; `None`
    /// when its resourceVersion cannot be compared.
    pub fn of(meta: &ObjectMeta) -> Option<Self> {
        if meta.deletion_timestamp.is_some() {
            return Some(Self::Absent {
                uid: meta.uid.clone(),
            });
        }
        Some(Self::Present {
            uid: meta.uid.clone()?,
            resource_version: meta.resource_version.as_deref()?.parse().ok()?,
        })
    }

    /// What a read of the object that found `meta` (or nothing) says of it.
    pub fn read(meta: Option<&ObjectMeta>) -> Option<Self> {
        match meta {
            Some(meta) => Self::of(meta),
            None => Some(Self::Absent { uid: None }),
        }
    }

    /// Whether a cache whose copy of the object is `cached` shows at least
    /// this much: the same object at this version or later, or, for an
    /// object known gone, no copy of it that is not being deleted.
    pub fn shown_by(&self, cached: Option<&ObjectMeta>) -> bool {
        match (self, cached) {
            (Self::Present { .. }, None) => false,
            (
                Self::Present {
                    uid,
                    resource_version,
                },
                Some(meta),
            ) => {
                meta.uid.as_deref() == Some(uid.as_str())
                    && meta
                        .resource_version
                        .as_deref()
                        .and_then(|v| v.parse::<u64>().ok())
                        .is_some_and(|v| v >= *resource_version)
            }
            (Self::Absent { .. }, None) => true,
            // A live copy is either the one from before the deletion or
            // one this controller does not know of: neither is current.
            (Self::Absent { .. }, Some(meta)) => meta.deletion_timestamp.is_some(),
        }
    }
}

/// The shards this replica holds, watched for any change since the last
/// look (a loss and a gain in between included).
struct Holdings(watch::Receiver<BTreeSet<u32>>);

impl Holdings {
    fn new(shards: &crate::sharding::Shards) -> Self {
        let mut holdings = shards.subscribe();
        holdings.mark_unchanged();
        Self(holdings)
    }

    /// Whether they changed since the last call. A closed channel (the
    /// holdings' owner gone) changes nothing more.
    fn changed(&mut self) -> bool {
        let changed = self.0.has_changed().unwrap_or(false);
        self.0.mark_unchanged();
        changed
    }
}

/// The objects of one kind a controller knows of, by namespace and name.
pub struct Expectations {
    state: Mutex<State>,
}

struct State {
    known: HashMap<(String, String), (Known, Instant)>,
    holdings: Holdings,
}

/// How a cache's copy of an object stands against what is known of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Look {
    /// It shows at least what is known: decide on it.
    Current,
    /// It is behind an answer of the API server received this long ago: the
    /// watch delivering that answer is on its way, and wakes the object.
    Behind(Duration),
    /// Nothing is known: only a read says.
    Unknown,
}

impl Expectations {
    /// Nothing known yet; everything forgotten whenever `shards`' holdings
    /// change.
    pub fn new(shards: &crate::sharding::Shards) -> Self {
        Self {
            state: Mutex::new(State {
                known: HashMap::new(),
                holdings: Holdings::new(shards),
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.holdings.changed() {
            state.known.clear();
        }
        state
    }

    /// Records what an answer of the API server said of `namespace/name`;
    /// `None` (an answer that cannot be compared, or no answer: a write
    /// whose outcome is not known) forgets it, so the next look reads.
    pub fn record(&self, namespace: &str, name: &str, known: Option<Known>) {
        let key = (namespace.to_owned(), name.to_owned());
        let mut state = self.state();
        match known {
            Some(known) => state.known.insert(key, (known, Instant::now())),
            None => state.known.remove(&key),
        };
    }

    /// Forgets `namespace/name`: the object it belongs to is gone.
    pub fn forget(&self, namespace: &str, name: &str) {
        self.record(namespace, name, None);
    }

    /// Whether a cache whose copy of `namespace/name` is `cached` can be
    /// decided on: something is known of the object, and the copy shows it.
    pub fn current(&self, namespace: &str, name: &str, cached: Option<&ObjectMeta>) -> bool {
        self.look(namespace, name, cached) == Look::Current
    }

    /// How a cache whose copy of `namespace/name` is `cached` stands.
    pub fn look(&self, namespace: &str, name: &str, cached: Option<&ObjectMeta>) -> Look {
        match self
            .state()
            .known
            .get(&(namespace.to_owned(), name.to_owned()))
        {
            None => Look::Unknown,
            Some((known, _)) if known.shown_by(cached) => Look::Current,
            Some((_, at)) => Look::Behind(at.elapsed()),
        }
    }

    /// How many objects are known: bounded by the runners there are.
    pub fn len(&self) -> usize {
        self.state().known.len()
    }

    /// Whether nothing is known.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The same for groups of objects a controller owns (a runner set's
/// runners), by the group's uid and each object's name: a group is known
/// once a list of it from the API server was recorded ([`Self::listed`]),
/// and stays known through the answers to the controller's own writes to
/// its members. A list is what makes a group known because a cache that
/// does not show a member it is missing cannot be told from one that
/// shows all: only the API server's list says which members exist.
pub struct GroupExpectations {
    state: Mutex<GroupState>,
}

struct GroupState {
    groups: HashMap<String, HashMap<String, Known>>,
    holdings: Holdings,
}

impl GroupExpectations {
    /// Nothing known yet; everything forgotten whenever `shards`' holdings
    /// change.
    pub fn new(shards: &crate::sharding::Shards) -> Self {
        Self {
            state: Mutex::new(GroupState {
                groups: HashMap::new(),
                holdings: Holdings::new(shards),
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, GroupState> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.holdings.changed() {
            state.groups.clear();
        }
        state
    }

    /// What a list of the group from the API server found: its members,
    /// by name. Replaces whatever was known of the group. A member whose
    /// version cannot be compared leaves the group unknown.
    pub fn listed<'a>(&self, group: &str, members: impl IntoIterator<Item = &'a ObjectMeta>) {
        let known: Option<HashMap<String, Known>> = members
            .into_iter()
            .map(|meta| Some((meta.name.clone()?, Known::of(meta)?)))
            .collect();
        let mut state = self.state();
        match known {
            Some(known) => state.groups.insert(group.to_owned(), known),
            None => state.groups.remove(group),
        };
    }

    /// Records what an answer of the API server said of the member `name`
    /// of a known group (nothing, for a group not known: its list comes
    /// first). `None` (a write whose outcome is not known: a creation that
    /// timed out may have made a member under a name never learnt) forgets
    /// the whole group, so the next look lists it.
    pub fn record(&self, group: &str, name: &str, known: Option<Known>) {
        let mut state = self.state();
        match known {
            Some(known) => {
                if let Some(members) = state.groups.get_mut(group) {
                    members.insert(name.to_owned(), known);
                }
            }
            None => {
                state.groups.remove(group);
            }
        }
    }

    /// Forgets the group: it is gone, or its next look is to list it.
    pub fn forget(&self, group: &str) {
        self.state().groups.remove(group);
    }

    /// Whether a cache whose copy of each member is `cached(name)` can be
    /// decided on: the group is known, and every member known is shown.
    pub fn current<'a>(
        &self,
        group: &str,
        cached: impl Fn(&str) -> Option<&'a ObjectMeta>,
    ) -> bool {
        self.state().groups.get(group).is_some_and(|members| {
            members
                .iter()
                .all(|(name, known)| known.shown_by(cached(name)))
        })
    }

    /// How many groups are known.
    pub fn len(&self) -> usize {
        self.state().groups.len()
    }

    /// Whether no group is known.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn meta(uid: &str, version: &str) -> ObjectMeta {
        ObjectMeta {
            uid: Some(uid.into()),
            resource_version: Some(version.into()),
            ..ObjectMeta::default()
        }
    }

    fn deleting(mut meta: ObjectMeta) -> ObjectMeta {
        meta.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        meta
    }

    #[test]
    fn a_written_object_is_shown_by_its_copy_or_a_later_one_only() {
        let known = Known::of(&meta("a", "120")).unwrap();
        assert!(!known.shown_by(None), "the write not seen yet");
        assert!(!known.shown_by(Some(&meta("a", "119"))), "an older copy");
        assert!(known.shown_by(Some(&meta("a", "120"))));
        assert!(known.shown_by(Some(&meta("a", "7000"))), "a later copy");
        assert!(
            !known.shown_by(Some(&meta("b", "7000"))),
            "another object of the name"
        );
        assert!(
            !known.shown_by(Some(&meta("a", "not-a-number"))),
            "a version that cannot be compared is never current"
        );
    }

    #[test]
    fn a_deleted_object_is_shown_by_no_copy_or_a_deleting_one() {
        let known = Known::Absent {
            uid: Some("a".into()),
        };
        assert!(known.shown_by(None));
        assert!(known.shown_by(Some(&deleting(meta("a", "130")))));
        assert!(
            !known.shown_by(Some(&meta("a", "120"))),
            "the copy from before the deletion"
        );
        assert!(
            !known.shown_by(Some(&meta("b", "140"))),
            "an object this controller does not know of"
        );
        let read = Known::read(None).unwrap();
        assert!(read.shown_by(None));
        assert!(!read.shown_by(Some(&meta("b", "140"))));
    }

    #[test]
    fn an_answer_that_cannot_be_compared_is_not_recorded() {
        assert_eq!(Known::of(&meta("a", "x")), None);
        assert_eq!(
            Known::of(&deleting(meta("a", "x"))),
            Some(Known::Absent {
                uid: Some("a".into())
            })
        );
    }

    #[test]
    fn nothing_known_is_never_current_and_a_change_of_shards_forgets() {
        let (tell, held) = watch::channel(BTreeSet::from([0]));
        let shards = crate::sharding::Shards::new(2, held);
        let expectations = Expectations::new(&shards);
        assert_eq!(expectations.look("ns", "r", None), Look::Unknown);
        expectations.record("ns", "r", Known::read(None));
        assert!(expectations.current("ns", "r", None));
        let live = meta("b", "9");
        assert!(matches!(
            expectations.look("ns", "r", Some(&live)),
            Look::Behind(_)
        ));
        // Lost and taken back before the next look: still forgotten.
        tell.send(BTreeSet::new()).unwrap();
        tell.send(BTreeSet::from([0])).unwrap();
        assert!(!expectations.current("ns", "r", None));
        assert!(expectations.is_empty());
        expectations.record("ns", "r", Known::read(None));
        expectations.forget("ns", "r");
        assert!(!expectations.current("ns", "r", None));
    }

    fn named(name: &str, uid: &str, version: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            ..meta(uid, version)
        }
    }

    #[test]
    fn a_group_is_current_once_listed_and_while_the_cache_shows_every_write() {
        let shards = crate::sharding::Shards::single();
        let groups = GroupExpectations::new(&shards);
        let none = |_: &str| None;
        assert!(!groups.current("set", none), "never listed");
        groups.listed("set", []);
        assert!(groups.current("set", none), "listed empty");
        // A runner created: the cache must show it before it is current.
        groups.record("set", "r1", Known::of(&named("r1", "u1", "10")));
        assert!(!groups.current("set", none));
        let r1 = named("r1", "u1", "11");
        let cache = |name: &str| (name == "r1").then_some(&r1);
        assert!(groups.current("set", cache));
        // Deleted by the set: the live copy of before is not current.
        groups.record("set", "r1", Some(Known::Absent { uid: None }));
        assert!(!groups.current("set", cache));
        assert!(groups.current("set", none));
        // A write whose outcome is not known: listed again.
        groups.record("set", "r2", None);
        assert!(!groups.current("set", none));
        groups.record("set", "r2", Known::of(&named("r2", "u2", "12")));
        assert!(
            !groups.current("set", none),
            "not recorded into a group not known"
        );
        groups.listed("set", [&named("r2", "u2", "12")]);
        let r2 = named("r2", "u2", "12");
        assert!(groups.current("set", |name: &str| (name == "r2").then_some(&r2)));
        groups.listed("set", [&named("r3", "u3", "x")]);
        assert!(groups.is_empty(), "a version that cannot be compared");
    }
}
