//! What each scale set's listener last heard of jobs waiting for a runner,
//! and on what terms its runner set renews runners, handed to the runner
//! controller in memory so that a runner finishing its job is renewed at
//! once, in the pass that sees it finish, when a job waits for it.
//!
//! Before this, a runner that finished was written Succeeded, and renewed
//! by its set only at the listener's next decision: every renewal waited
//! up to the message batch window (2 s) and cost three status writes (the
//! runner Succeeded, the set's renewal, the next registration copied in).
//! The listener, the runner set and the runners share one process and one
//! shard, so the three can share what each knows instead of saying it
//! through the API server:
//!
//! - the listener says, with every message that carries statistics, how
//!   many jobs the scale set has: acquired and not running yet (the
//!   service keeps what is past the capacity the listener announces
//!   acquired, not assigned), or running ([`Backlogs::heard`]);
//! - the runner set says, with every pass, whether it renews runners now
//!   and what a runner it would renew must be built as ([`Terms`],
//!   [`Backlogs::offer`]): never while the set is being deleted or a
//!   revision cleanup is under way;
//! - a runner that finished asks ([`Backlogs::claim`]), and is renewed in
//!   place only when a job is left that no other live runner of the set
//!   holds or is to take, counting the jobs finished since the listener
//!   was heard (see [`uncovered`]).
//!
//! The listener also says which job each runner started
//! ([`Backlogs::started`]), so that the runner set never takes a runner
//! for idle while it runs a job whose record is not written yet: with
//! renewal in place the record on the runner's status only informs (it is
//! written as the host's status budget allows, and a renewal carries the
//! job's id into `status.renewal.previous`), while this is what the set's
//! scale-down reads. After a restart nothing here is known, and a runner
//! whose record was never written can be taken for idle: its deletion
//! then deregisters it first, which the Actions service refuses while the
//! job runs, so the job still runs to its end (seed 000).
//!
//! What this deliberately does not do: it never creates a runner, and it
//! never renews one when no job waits (the count of registrations stays at
//! most the jobs plus what the set itself creates). A backlog heard long
//! ago ([`HEARD_WITHIN`]) or not at all renews nothing: the set's own
//! renewal, under the listener's next decision, remains for those. All of
//! it lives in memory: after a restart nothing is known until the
//! listener's first message, and runners end and are renewed the old way
//! meanwhile.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use kube::ResourceExt;

use crate::api::{EphemeralRunner, EphemeralRunnerSpec, annotations};

/// How recent the listener's word must be for a renewal to rest on it. A
/// listener polls at least once a minute (an empty long poll), and every
/// message carries statistics; older than this, the listener is likely
/// stopped or cut off, and what it heard says nothing of now.
pub const HEARD_WITHIN: Duration = Duration::from_secs(90);

/// A runner set, by namespace and name: what its runners' set label says.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SetKey {
    /// The namespace.
    pub namespace: String,
    /// The EphemeralRunnerSet's name.
    pub name: String,
}

impl SetKey {
    /// The set `namespace/name`.
    pub fn new(namespace: &str, name: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }
    }
}

/// What a runner set renews on: a runner built as `prototype` (a runner the
/// set would create now) from at least `applied_revision`, renewed under
/// the set's `generation`.
#[derive(Clone, Debug)]
pub struct Terms {
    /// A runner as the set builds them now.
    pub prototype: EphemeralRunner,
    /// The set's applied actionable revision.
    pub applied_revision: i64,
    /// The set's `metadata.generation`.
    pub generation: i64,
}

impl Terms {
    /// Whether `runner` may be renewed on these terms: built from the
    /// applied revision or a later one, and as the set builds runners now.
    pub fn admit(&self, runner: &EphemeralRunner) -> bool {
        let revision: i64 = runner
            .annotations()
            .get(annotations::REVISION)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        revision >= self.applied_revision
            && built_as(
                &runner.spec,
                runner.labels(),
                runner.annotations(),
                &self.prototype,
            )
    }
}

/// Whether a runner of `spec`, `labels` and `annotations` has the spec,
/// labels and annotations of `template`, a runner its set creates now. A
/// renewal keeps the object as it is, so a runner built from an older
/// template (a metadata change does not move the revision) is not renewed:
/// it ends, and a new one is built. What marks one runner's creation (its
/// patch id, revision and set generation) is not compared.
pub fn built_as(
    spec: &EphemeralRunnerSpec,
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
    template: &EphemeralRunner,
) -> bool {
    let has_all = |want: &BTreeMap<String, String>, have: &BTreeMap<String, String>| {
        want.iter()
            .filter(|(key, _)| {
                ![
                    annotations::PATCH_ID,
                    annotations::REVISION,
                    annotations::SET_GENERATION,
                ]
                .contains(&key.as_str())
            })
            .all(|(key, value)| have.get(key) == Some(value))
    };
    *spec == template.spec
        && has_all(template.labels(), labels)
        && has_all(template.annotations(), annotations)
}

/// One runner of the set as the runner controller's watch shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// Its name.
    pub name: String,
    /// Whether it is live: Pending or Running, not being deleted.
    pub live: bool,
}

/// What the listener heard.
#[derive(Clone, Copy, Debug)]
struct Heard {
    assigned: u32,
    at: Instant,
}

/// A job the listener heard start on a runner, and not end yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Started {
    /// The registration that runs it (JobStarted's runner id).
    pub runner_id: i64,
    /// The job's id.
    pub job_id: String,
}

#[derive(Debug, Default)]
struct Entry {
    heard: Option<Heard>,
    terms: Option<Arc<Terms>>,
    /// Runners that finished a job since the listener was last heard,
    /// renewed or not: each finished one of the jobs it heard of.
    finished: u32,
    /// The job each runner was last heard to start, by runner name, until
    /// its end is heard or the runner is gone. One per runner at most, and
    /// a start on a later registration replaces it.
    jobs: HashMap<String, Started>,
}

impl Entry {
    fn is_empty(&self) -> bool {
        self.heard.is_none() && self.terms.is_none() && self.jobs.is_empty()
    }
}

/// The backlogs of every scale set the process serves. Clones share them.
#[derive(Clone, Debug, Default)]
pub struct Backlogs {
    sets: Arc<Mutex<HashMap<SetKey, Entry>>>,
}

impl Backlogs {
    /// No set known.
    pub fn new() -> Self {
        Self::default()
    }

    fn with<R>(&self, f: impl FnOnce(&mut HashMap<SetKey, Entry>) -> R) -> R {
        let mut sets = self.sets.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut sets)
    }

    /// The listener of `set` heard that the scale set has `assigned` jobs,
    /// running or waiting for a runner.
    pub fn heard(&self, set: &SetKey, assigned: u32) {
        let at = Instant::now();
        self.with(|sets| {
            let entry = sets.entry(set.clone()).or_default();
            // The statistics count every job a runner took since as running.
            entry.heard = Some(Heard { assigned, at });
            entry.finished = 0;
        });
    }

    /// The listener of `set` stopped: what it heard no longer holds.
    pub fn deaf(&self, set: &SetKey) {
        self.with(|sets| {
            if let Some(entry) = sets.get_mut(set) {
                entry.heard = None;
                if entry.is_empty() {
                    sets.remove(set);
                }
            }
        });
    }

    /// The listener of `set` heard that `runner` started a job.
    pub fn started(&self, set: &SetKey, runner: &str, job: Started) {
        self.with(|sets| {
            sets.entry(set.clone())
                .or_default()
                .jobs
                .insert(runner.to_owned(), job);
        });
    }

    /// The listener of `set` heard that the job of `runner` on registration
    /// `runner_id` ended (or a runner it had is gone).
    pub fn ended(&self, set: &SetKey, runner: &str, runner_id: i64) {
        self.with(|sets| {
            if let Some(entry) = sets.get_mut(set) {
                if entry
                    .jobs
                    .get(runner)
                    .is_some_and(|j| j.runner_id == runner_id)
                {
                    entry.jobs.remove(runner);
                }
                if entry.is_empty() {
                    sets.remove(set);
                }
            }
        });
    }

    /// The job `runner` of `set` runs on registration `runner_id`, as far
    /// as the listener heard. A job heard of an earlier registration of the
    /// runner (renewed since) is not this one's.
    pub fn job_on(&self, set: &SetKey, runner: &str, runner_id: i64) -> Option<Started> {
        if runner_id == 0 {
            return None;
        }
        self.with(|sets| {
            sets.get(set)?
                .jobs
                .get(runner)
                .filter(|j| j.runner_id == runner_id)
                .cloned()
        })
    }

    /// The runners of `set` with a job heard of, by name, and the
    /// registration each runs it on; a runner `present` does not know of
    /// is forgotten (it is gone, its end perhaps never heard).
    pub fn jobs_of(&self, set: &SetKey, present: impl Fn(&str) -> bool) -> HashMap<String, i64> {
        self.with(|sets| {
            let Some(entry) = sets.get_mut(set) else {
                return HashMap::new();
            };
            entry.jobs.retain(|runner, _| present(runner));
            let jobs = entry
                .jobs
                .iter()
                .map(|(runner, job)| (runner.clone(), job.runner_id))
                .collect();
            if entry.is_empty() {
                sets.remove(set);
            }
            jobs
        })
    }

    /// The runner set `set` renews on `terms` from now on, or renews
    /// nothing (`None`: being deleted, cleaning up, gone).
    pub fn offer(&self, set: &SetKey, terms: Option<Arc<Terms>>) {
        self.with(|sets| match terms {
            Some(terms) => sets.entry(set.clone()).or_default().terms = Some(terms),
            None => {
                if let Some(entry) = sets.get_mut(set) {
                    entry.terms = None;
                    if entry.is_empty() {
                        sets.remove(set);
                    }
                }
            }
        });
    }

    /// The runner `runner` of `set` finished its job: the set's terms if
    /// it is to be renewed in place, claimed for it.
    ///
    /// It is, when the set offers terms `admits` accepts, the listener was
    /// heard within [`HEARD_WITHIN`], and more jobs wait than runners will
    /// take them without it (see [`uncovered`]).
    pub fn claim(
        &self,
        set: &SetKey,
        runner: &str,
        peers: &[Peer],
        admits: impl FnOnce(&Terms) -> bool,
    ) -> Option<Arc<Terms>> {
        let now = Instant::now();
        self.with(|sets| {
            let entry = sets.get_mut(set)?;
            let heard = entry
                .heard
                .filter(|h| now.duration_since(h.at) <= HEARD_WITHIN);
            let (Some(terms), Some(heard)) = (entry.terms.clone(), heard) else {
                tracing::debug!(set = %set.name, runner, terms = entry.terms.is_some(), heard = heard.is_some(), "no renewal in place: the set or its listener says nothing");
                return None;
            };
            entry.finished = entry.finished.saturating_add(1);
            let left = uncovered(heard.assigned, entry.finished, runner, peers);
            tracing::debug!(set = %set.name, runner, assigned = heard.assigned, finished = entry.finished, left, "a job left for a runner finishing?");
            if left == 0 || !admits(&terms) {
                return None;
            }
            Some(terms)
        })
    }
}

/// How many of the `assigned` jobs the listener heard of no runner but
/// `runner` will take, once `finished` of them (`runner`'s included) are
/// done: every other live runner of the set (starting, or running, a job
/// record or not, renewed since or not) has one of the jobs or is to take
/// one.
///
/// Counting runners rather than jobs waiting is deliberate: the listener
/// hears "assigned and not running" with its messages, and the runners
/// starting when it heard (the set's creations for that very burst) take
/// some of those jobs; counted as waiting for a renewal, they made a
/// registration for nothing at the end of every burst.
pub fn uncovered(assigned: u32, finished: u32, runner: &str, peers: &[Peer]) -> u32 {
    let others = peers.iter().filter(|p| p.live && p.name != runner).count();
    assigned
        .saturating_sub(finished)
        .saturating_sub(u32::try_from(others).unwrap_or(u32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(name: &str, live: bool) -> Peer {
        Peer {
            name: name.to_owned(),
            live,
        }
    }

    fn terms() -> Arc<Terms> {
        Arc::new(Terms {
            prototype: EphemeralRunner::new("prototype", Default::default()),
            applied_revision: 1,
            generation: 4,
        })
    }

    #[test]
    fn a_job_is_uncovered_only_beyond_the_other_live_runners() {
        let peers = [peer("a", true), peer("b", false), peer("me", true)];
        assert_eq!(uncovered(2, 1, "me", &peers), 0, "a takes the other");
        assert_eq!(uncovered(3, 1, "me", &peers), 1, "b is not live");
        assert_eq!(uncovered(3, 2, "me", &peers), 0, "one more finished");
        assert_eq!(uncovered(0, 1, "me", &peers), 0);
    }

    #[test]
    fn a_burst_renews_its_runners_until_every_job_heard_of_has_one() {
        let backlogs = Backlogs::new();
        let set = SetKey::new("ci", "linux");
        let live = [peer("a", true), peer("b", true), peer("c", true)];
        let claim = |runner: &str| backlogs.claim(&set, runner, &live, |_| true).is_some();
        assert!(!claim("a"), "nothing known");
        backlogs.heard(&set, 10);
        assert!(!claim("a"), "no terms");
        backlogs.offer(&set, Some(terms()));
        assert!(
            backlogs.claim(&set, "a", &live, |_| false).is_none(),
            "not admitted"
        );
        // Ten jobs on three runners (one finish counted above): the
        // runners finishing before the listener is heard again take seven
        // more, and no more.
        let granted = ["b", "c", "a", "b", "c", "a", "b", "c", "a"]
            .into_iter()
            .filter(|r| claim(r))
            .count();
        assert_eq!(granted, 6, "one of the seven was the refused claim's");
        // Heard again: what it heard counts only the jobs still assigned.
        backlogs.heard(&set, 4);
        assert!(claim("b"));
        assert!(!claim("c"));
        backlogs.offer(&set, None);
        backlogs.heard(&set, 9);
        assert!(!claim("c"), "terms withdrawn");
    }

    #[test]
    fn a_job_heard_to_start_is_the_runners_until_its_end_or_the_runner_goes() {
        let backlogs = Backlogs::new();
        let set = SetKey::new("ci", "linux");
        let job = |runner_id, id: &str| Started {
            runner_id,
            job_id: id.to_owned(),
        };
        backlogs.started(&set, "a", job(7, "j1"));
        backlogs.started(&set, "b", job(8, "j2"));
        assert_eq!(backlogs.job_on(&set, "a", 7), Some(job(7, "j1")));
        assert_eq!(backlogs.job_on(&set, "a", 9), None, "renewed since");
        assert_eq!(backlogs.job_on(&set, "a", 0), None, "not registered");
        // An end heard of an earlier registration leaves the later job.
        backlogs.started(&set, "a", job(9, "j3"));
        backlogs.ended(&set, "a", 7);
        assert_eq!(backlogs.job_on(&set, "a", 9), Some(job(9, "j3")));
        backlogs.ended(&set, "a", 9);
        assert_eq!(backlogs.job_on(&set, "a", 9), None);
        // A runner the set no longer has is forgotten, and with it the set.
        let jobs = backlogs.jobs_of(&set, |runner| runner == "b");
        assert_eq!(jobs, HashMap::from([("b".to_owned(), 8)]));
        assert!(backlogs.jobs_of(&set, |_| false).is_empty());
        assert!(backlogs.with(|sets| sets.is_empty()));
    }

    #[test]
    fn a_stopped_listener_renews_nothing_and_a_forgotten_set_leaves_no_entry() {
        let backlogs = Backlogs::new();
        let set = SetKey::new("ci", "linux");
        backlogs.heard(&set, 5);
        backlogs.offer(&set, Some(terms()));
        backlogs.deaf(&set);
        assert!(backlogs.claim(&set, "a", &[], |_| true).is_none());
        backlogs.offer(&set, None);
        assert!(backlogs.with(|sets| sets.is_empty()));
    }
}
