//! Splitting the fleet across replicas: each replica campaigns for shard
//! Leases and serves the scale sets of the shards it holds
//! ([`crate::sharding`] says which scale set is in which shard).
//!
//! One leader ([`super::leader`]) is the simple answer up to the point
//! where one process cannot serve the whole fleet, or where a team wants a
//! replica's crash to pause a part of it, not all of it. Past that point
//! the work is split, with Kubernetes as the distributed engine: a
//! `coordination.k8s.io` Lease per shard, `arcwright-shard-0` to
//! `arcwright-shard-{N-1}`, held and renewed exactly as the leader's Lease
//! is (the same record, the same expiry rule, the same renew deadline), and
//! a membership Lease per replica, `arcwright-member-{identity}`, renewed
//! beside them, so that every replica knows how many are alive.
//!
//! ## Fair share
//!
//! With `R` replicas alive, a replica holds at most `ceil(N / R)` shards.
//! It takes free or expired shards up to that share, and lets the excess
//! go when a replica joins. Letting go means no longer serving the shard
//! at once and no longer renewing it: the Lease expires a lease duration
//! later and the newcomer takes it. Releasing it outright would hand it
//! over sooner, but only once this replica's listeners of that shard had
//! deleted their message sessions; expiry needs no such handshake, and a
//! replica joining is rare (a rollout, a scale-up), so a pause of one
//! lease duration for the moved scale sets is the price, said here.
//!
//! Which free shards a replica prefers is a rendezvous hash of its
//! identity and the shard's number: replicas starting together prefer
//! different shards, so they seldom collide on one Lease (a collision is
//! harmless, one conditional write wins, but costs a round).
//!
//! ## Losing a shard
//!
//! A shard not renewed within the renew deadline (two thirds of the lease)
//! is dropped: this replica stops serving it a third of a lease before
//! any other replica may take it, as a leader steps down
//! ([`leader::still_leading`]). A replica that is killed simply stops
//! renewing; the survivors take its shards once their Leases have not
//! changed for a lease duration, as they observe them. A replica shutting
//! down cleanly releases its Leases after its listeners have deleted their
//! sessions, so its shards move at once.
//!
//! ## Changing the number of shards
//!
//! Replicas must agree on `N`, or they disagree on which shard a scale set
//! is in. Change it with all replicas restarted together (a `Recreate`
//! rollout or a scale to zero), not a rolling update.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, Preconditions};
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::leader::{
    Attempt, ElectionError, Record, Timing, attempt, holder_spec, patch_params, post_params,
    release_if_held, sleep_until, still_leading, write_if_unchanged,
};
use crate::api::labels;
use crate::sharding::Shards;

/// The label that tells arcwright's shard and membership Leases apart from
/// any other Lease in the namespace, so one list reads them all.
pub const LEASE_LABEL: &str = "arcwright.dev/lease";

/// The name of shard `index`'s Lease.
pub fn shard_lease(index: u32) -> String {
    format!("arcwright-shard-{index}")
}

/// The name of the membership Lease of the replica `identity`.
pub fn member_lease(identity: &str) -> String {
    format!("arcwright-member-{identity}")
}

/// How many shards, where their Leases live, and who this replica is.
#[derive(Clone, Debug)]
pub struct ShardElection {
    /// The Leases' namespace.
    pub namespace: String,
    /// How many shards the fleet is split into (at least 2).
    pub count: u32,
    /// This replica's identity.
    pub identity: String,
    /// How long an unrenewed Lease stays with its holder.
    pub duration: Duration,
}

/// What one shard's Lease said, as this replica observed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    /// The Lease's record.
    pub record: Record,
    /// How long the record has been seen unchanged, on this replica's clock.
    pub unchanged_for: Duration,
}

/// What a round decides, from what it read ([`plan`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Shards this replica holds and keeps: renewed.
    pub renew: Vec<u32>,
    /// Free or expired shards to take, best first.
    pub take: Vec<u32>,
    /// Shards held beyond the fair share: no longer served or renewed.
    pub let_go: Vec<u32>,
}

/// The most shards one of `alive` replicas holds: `ceil(count / alive)`.
pub fn fair_share(count: u32, alive: usize) -> usize {
    let alive = u32::try_from(alive.max(1)).unwrap_or(u32::MAX);
    usize::try_from(count.div_ceil(alive)).unwrap_or(usize::MAX)
}

/// How much `identity` prefers `shard` (higher first): a rendezvous hash,
/// so replicas prefer different shards.
pub fn preference(identity: &str, shard: u32) -> u64 {
    u64::from(crate::sharding::shard_of(
        identity,
        &shard.to_string(),
        u32::MAX,
    ))
}

/// A round's decision. `shards` has one entry per shard (a missing Lease is
/// free); `letting_go` are shards this replica let go whose Leases still
/// name it, not to be taken back before they expire.
pub fn plan(
    shards: &[Option<Observed>],
    me: &str,
    share: usize,
    letting_go: &BTreeSet<u32>,
) -> Plan {
    let mut mine = Vec::new();
    let mut free = Vec::new();
    for (index, observed) in shards.iter().enumerate() {
        let index = u32::try_from(index).unwrap_or(u32::MAX);
        let Some(observed) = observed else {
            free.push(index);
            continue;
        };
        let ours = observed.record.holder.as_deref() == Some(me);
        let expired = observed.unchanged_for >= observed.record.duration;
        if ours && !letting_go.contains(&index) {
            mine.push(index);
        } else if (ours && expired)
            || (!ours && attempt(&observed.record, me, observed.unchanged_for) == Attempt::Take)
        {
            free.push(index);
        }
    }
    // The shards it least prefers go first; the ones it keeps or takes are
    // those it prefers most, so a rebalance moves as few as it can.
    mine.sort_by_key(|&shard| std::cmp::Reverse(preference(me, shard)));
    free.sort_by_key(|&shard| std::cmp::Reverse(preference(me, shard)));
    let let_go = mine.split_off(mine.len().min(share));
    let room = share.saturating_sub(mine.len());
    free.truncate(room);
    Plan {
        renew: mine,
        take: free,
        let_go,
    }
}

/// A campaign under way: the shards held, as they change.
pub struct ShardHoldings {
    shards: Shards,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl ShardElection {
    /// Checks that the shard Leases can be read (creating the missing
    /// ones, so a missing RBAC rule fails at start-up) and starts
    /// campaigning.
    pub async fn start(self, client: Client) -> Result<ShardHoldings, ElectionError> {
        let api: Api<Lease> = Api::namespaced(client, &self.namespace);
        for index in 0..self.count {
            let name = shard_lease(index);
            let lease_error = |source| ElectionError::Lease {
                namespace: self.namespace.clone(),
                name: name.clone(),
                source,
            };
            if api.get_opt(&name).await.map_err(lease_error)?.is_some() {
                continue;
            }
            match api.create(&post_params(), &lease(&name, "shard")).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(error) => return Err(lease_error(error)),
            }
        }
        let timing = Timing::of(self.duration);
        tracing::info!(
            shards = self.count,
            namespace = %self.namespace,
            identity = %self.identity,
            lease_duration = ?timing.lease_duration,
            "campaigning for shards"
        );
        let (tell, held) = watch::channel(BTreeSet::new());
        let stop = CancellationToken::new();
        let campaign = Campaign {
            api,
            election: self.clone(),
            timing,
            observed: HashMap::new(),
            held: BTreeMap::new(),
            letting_go: BTreeSet::new(),
        };
        let task = tokio::spawn(campaign.run(tell, stop.clone()));
        Ok(ShardHoldings {
            shards: Shards::new(self.count, held),
            stop,
            task,
        })
    }
}

impl ShardHoldings {
    /// The view the controllers consult.
    pub fn shards(&self) -> Shards {
        self.shards.clone()
    }

    /// Ends the campaign: the shards still held are released and the
    /// membership Lease deleted, so the others take over at once.
    pub async fn release(self) {
        self.stop.cancel();
        if tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .is_err()
        {
            tracing::warn!("the shard Leases were not released in time");
        }
    }
}

/// A Lease of arcwright's, labelled with its `role` (`shard`, `member`).
fn lease(name: &str, role: &str) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(BTreeMap::from([
                (LEASE_LABEL.to_owned(), role.to_owned()),
                (labels::MANAGED_BY.to_owned(), labels::ARCWRIGHT.to_owned()),
            ])),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec::default()),
    }
}

/// The campaign task's state.
struct Campaign {
    api: Api<Lease>,
    election: ShardElection,
    timing: Timing,
    /// Every Lease read, by name: its record and when it was first seen so.
    observed: HashMap<String, (Record, Instant)>,
    /// The shards held, with when each was last renewed.
    held: BTreeMap<u32, Instant>,
    /// Shards let go whose Leases may still name this replica.
    letting_go: BTreeSet<u32>,
}

impl Campaign {
    async fn run(mut self, tell: watch::Sender<BTreeSet<u32>>, stop: CancellationToken) {
        loop {
            let deadline = self.earliest_deadline();
            tokio::select! {
                () = stop.cancelled() => break,
                () = sleep_until(deadline) => {}
                round = tokio::time::timeout(self.timing.renew_deadline, self.round()) => {
                    match round {
                        Ok(Ok(())) => {}
                        Ok(Err(error)) => tracing::warn!("the shard Leases could not be read or written: {error}"),
                        Err(_) => tracing::warn!("the API server did not answer the shard round in time"),
                    }
                }
            }
            self.drop_overdue();
            tell.send_if_modified(|held| {
                let now: BTreeSet<u32> = self.held.keys().copied().collect();
                let changed = *held != now;
                if changed {
                    tracing::info!(shards = ?now, "serving shards");
                    *held = now;
                }
                changed
            });
            let deadline = self.earliest_deadline();
            tokio::select! {
                () = stop.cancelled() => break,
                () = sleep_until(deadline) => {}
                () = tokio::time::sleep(self.timing.retry_period) => {}
            }
        }
        tell.send_replace(BTreeSet::new());
        self.release().await;
    }

    /// The earliest renew deadline among the held shards.
    fn earliest_deadline(&self) -> Option<Instant> {
        self.held
            .values()
            .min()
            .map(|renewed| *renewed + self.timing.renew_deadline)
    }

    /// Drops the shards whose renew deadline has passed.
    fn drop_overdue(&mut self) {
        let timing = self.timing;
        self.held.retain(|shard, renewed| {
            let keep = still_leading(&timing, renewed.elapsed());
            if !keep {
                tracing::error!(
                    shard,
                    renew_deadline = ?timing.renew_deadline,
                    "no renewal within the renew deadline: no longer serving the shard, before its Lease can pass to another replica"
                );
            }
            keep
        });
    }

    /// One round: read every Lease, renew this replica's membership, and
    /// renew, take and let go of shards as [`plan`] says.
    async fn round(&mut self) -> Result<(), kube::Error> {
        let me = self.election.identity.clone();
        let listed = self
            .api
            .list(&ListParams::default().labels(LEASE_LABEL))
            .await?;
        let now = Instant::now();
        let mut shards: Vec<Option<(Lease, Observed)>> = vec![None; self.count()];
        let mut alive = 1;
        let mut mine_member = None;
        for lease in listed.items {
            let name = lease.metadata.name.clone().unwrap_or_default();
            let record = Record::of(&lease, self.timing.lease_duration);
            let since = self.observe(&name, &record, now);
            let role = lease
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(LEASE_LABEL))
                .map(String::as_str);
            match role {
                Some("member") if name == member_lease(&me) => mine_member = Some(lease),
                Some("member") => {
                    if since < record.duration {
                        alive += 1;
                    } else if since >= record.duration * 5 {
                        self.forget_member(&lease).await;
                    }
                }
                Some("shard") => {
                    let index = name
                        .strip_prefix("arcwright-shard-")
                        .and_then(|i| i.parse::<usize>().ok())
                        .filter(|i| *i < shards.len());
                    if let Some(index) = index {
                        shards[index] = Some((
                            lease,
                            Observed {
                                record,
                                unchanged_for: since,
                            },
                        ));
                    }
                }
                _ => {}
            }
        }
        self.renew_membership(mine_member).await?;

        let share = fair_share(self.election.count, alive);
        // Let-go shards stay let go until their Lease names someone else or
        // has expired.
        self.letting_go.retain(|shard| {
            shards
                .get(*shard as usize)
                .and_then(Option::as_ref)
                .is_some_and(|(_, o)| {
                    o.record.holder.as_deref() == Some(me.as_str())
                        && o.unchanged_for < o.record.duration
                })
        });
        let view: Vec<Option<Observed>> = shards
            .iter()
            .map(|s| s.as_ref().map(|(_, o)| o.clone()))
            .collect();
        let decided = plan(&view, &me, share, &self.letting_go);
        for shard in &decided.let_go {
            tracing::info!(shard, share, alive, "letting a shard go to another replica");
            self.held.remove(shard);
            self.letting_go.insert(*shard);
        }
        // Shards the Leases no longer give this replica (another took one
        // that expired while this replica could not renew): not served.
        self.held
            .retain(|shard, _| decided.renew.contains(shard) || decided.take.contains(shard));
        for shard in decided.renew.iter().chain(&decided.take) {
            let index = *shard as usize;
            let read = shards[index].as_ref().map(|(lease, _)| lease);
            // Renewed as of the write's sending, not its answer (see
            // `leader::Campaign::try_take`).
            let sent = Instant::now();
            match self.write(*shard, read).await {
                Ok(()) => {
                    if self.held.insert(*shard, sent).is_none() {
                        tracing::info!(shard, share, alive, "took a shard");
                    }
                }
                // Another replica wrote it first: read again next round.
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    tracing::debug!(shard, "the shard's Lease changed under us");
                }
                Err(error) => tracing::warn!(shard, "the shard's Lease was not written: {error}"),
            }
        }
        Ok(())
    }

    fn count(&self) -> usize {
        usize::try_from(self.election.count).unwrap_or(0)
    }

    /// How long `name`'s record has been seen as it is now.
    fn observe(&mut self, name: &str, record: &Record, now: Instant) -> Duration {
        match self.observed.get(name) {
            Some((seen, at)) if seen == record => now.duration_since(*at),
            _ => {
                self.observed.insert(name.to_owned(), (record.clone(), now));
                Duration::ZERO
            }
        }
    }

    /// Writes this replica into shard `shard`'s Lease, on the condition
    /// that it is still the version `read` (a missing one is created).
    async fn write(&mut self, shard: u32, read: Option<&Lease>) -> Result<(), kube::Error> {
        let name = shard_lease(shard);
        let me = &self.election.identity;
        let stamp = MicroTime(Timestamp::now());
        let duration = i32::try_from(self.timing.lease_duration.as_secs()).unwrap_or(i32::MAX);
        let Some(read) = read else {
            let mut lease = lease(&name, "shard");
            lease.spec = Some(LeaseSpec {
                holder_identity: Some(me.clone()),
                lease_duration_seconds: Some(duration),
                acquire_time: Some(stamp.clone()),
                renew_time: Some(stamp),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            });
            let written = self.api.create(&post_params(), &lease).await?;
            self.note_written(&name, &written);
            return Ok(());
        };
        let ours = read
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref())
            == Some(me.as_str());
        let taking = !ours || self.letting_go.contains(&shard);
        let spec = holder_spec(me, self.timing.lease_duration, read, taking);
        let written = write_if_unchanged(&self.api, &name, read, spec).await?;
        self.letting_go.remove(&shard);
        self.note_written(&name, &written);
        Ok(())
    }

    /// A Lease this replica wrote counts as just changed.
    fn note_written(&mut self, name: &str, written: &Lease) {
        let record = Record::of(written, self.timing.lease_duration);
        self.observed
            .insert(name.to_owned(), (record, Instant::now()));
    }

    /// Renews (or creates) this replica's membership Lease.
    async fn renew_membership(&mut self, current: Option<Lease>) -> Result<(), kube::Error> {
        let name = member_lease(&self.election.identity);
        let stamp = MicroTime(Timestamp::now());
        let duration = i32::try_from(self.timing.lease_duration.as_secs()).unwrap_or(i32::MAX);
        if current.is_none() {
            let mut lease = lease(&name, "member");
            lease.spec = Some(LeaseSpec {
                holder_identity: Some(self.election.identity.clone()),
                lease_duration_seconds: Some(duration),
                renew_time: Some(stamp),
                ..LeaseSpec::default()
            });
            return match self.api.create(&post_params(), &lease).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
                Err(error) => Err(error),
            };
        }
        let patch = json!({"spec": {"renewTime": stamp, "leaseDurationSeconds": duration}});
        self.api
            .patch(&name, &patch_params(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
    }

    /// Deletes the membership Lease of a replica gone for five lease
    /// durations (killed, so it never deleted its own), on the condition
    /// that nobody renewed it since it was read.
    async fn forget_member(&mut self, lease: &Lease) {
        let name = lease.metadata.name.clone().unwrap_or_default();
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: lease.metadata.resource_version.clone(),
                uid: None,
            }),
            ..DeleteParams::default()
        };
        match self.api.delete(&name, &params).await {
            Ok(_) => {
                tracing::info!(member = %name, "forgot a replica gone for five lease durations");
                self.observed.remove(&name);
            }
            Err(error) => tracing::debug!(member = %name, "a gone replica's Lease stays: {error}"),
        }
    }

    /// Gives up every shard still held and deletes the membership Lease,
    /// so the other replicas take over without waiting for expiry.
    async fn release(&mut self) {
        let me = self.election.identity.clone();
        let held: Vec<u32> = self
            .held
            .keys()
            .copied()
            .chain(self.letting_go.iter().copied())
            .collect();
        let released = async {
            for shard in held {
                let name = shard_lease(shard);
                match release_if_held(&self.api, &name, &me).await {
                    Ok(true) => tracing::info!(shard, "shard released"),
                    Ok(false) => {}
                    Err(error) => tracing::warn!(shard, "the shard was not released: {error}"),
                }
            }
            let _ = self
                .api
                .delete(&member_lease(&me), &DeleteParams::default())
                .await;
        };
        if tokio::time::timeout(Duration::from_secs(5), released)
            .await
            .is_err()
        {
            tracing::warn!("the shards were not released: the API server did not answer");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held_by(holder: Option<&str>, unchanged_secs: u64) -> Option<Observed> {
        Some(Observed {
            record: Record {
                holder: holder.map(str::to_owned),
                renewed: Some(Timestamp::UNIX_EPOCH),
                duration: Duration::from_secs(15),
            },
            unchanged_for: Duration::from_secs(unchanged_secs),
        })
    }

    #[test]
    fn the_fair_share_rounds_up_so_every_shard_has_room() {
        assert_eq!(fair_share(3, 1), 3);
        assert_eq!(fair_share(3, 2), 2);
        assert_eq!(fair_share(3, 3), 1);
        assert_eq!(fair_share(3, 5), 1);
        assert_eq!(fair_share(8, 3), 3);
    }

    #[test]
    fn a_replica_takes_free_and_expired_shards_up_to_its_share() {
        let shards = [
            None,
            held_by(None, 0),
            held_by(Some("b"), 3),
            held_by(Some("c"), 15),
        ];
        let all = plan(&shards, "a", 4, &BTreeSet::new());
        assert!(all.renew.is_empty() && all.let_go.is_empty());
        let mut taken = all.take.clone();
        taken.sort_unstable();
        assert_eq!(taken, [0, 1, 3], "b's live shard is left alone");
        let two = plan(&shards, "a", 2, &BTreeSet::new());
        assert_eq!(two.take.len(), 2);
        assert!(two.take.iter().all(|s| all.take.contains(s)));
    }

    #[test]
    fn a_replica_over_its_share_lets_the_excess_go_and_keeps_the_rest() {
        let shards = [
            held_by(Some("a"), 0),
            held_by(Some("a"), 0),
            held_by(Some("a"), 0),
            held_by(None, 0),
        ];
        let decided = plan(&shards, "a", 2, &BTreeSet::new());
        assert_eq!(decided.renew.len(), 2);
        assert_eq!(decided.let_go.len(), 1);
        assert!(decided.take.is_empty(), "a full share takes nothing");
        // Once let go, the shard is not taken back before it expires.
        let gone = BTreeSet::from([decided.let_go[0]]);
        let mut fewer = shards.clone();
        fewer[decided.renew[0] as usize] = held_by(Some("b"), 0);
        let next = plan(&fewer, "a", 2, &gone);
        assert_eq!(next.take, [3], "a free shard, not the one let go");
        fewer[decided.let_go[0] as usize] = held_by(Some("a"), 15);
        fewer[3] = held_by(Some("b"), 0);
        let expired = plan(&fewer, "a", 2, &gone);
        assert_eq!(
            expired.take, decided.let_go,
            "expired, it is anyone's again"
        );
    }

    #[test]
    fn replicas_prefer_different_shards() {
        let free = vec![None; 6];
        let a = plan(&free, "replica-a", 2, &BTreeSet::new()).take;
        let b = plan(&free, "replica-b", 2, &BTreeSet::new()).take;
        let c = plan(&free, "replica-c", 2, &BTreeSet::new()).take;
        let distinct: BTreeSet<u32> = a.iter().chain(&b).chain(&c).copied().collect();
        assert!(distinct.len() > 2, "{a:?} {b:?} {c:?}");
    }
}
