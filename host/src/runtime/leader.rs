//! Leader election: with several replicas of the host, only the holder of a
//! `coordination.k8s.io` Lease runs the controllers and the listeners.
//!
//! Two leaders would each hold message sessions and each scale the same
//! sets; the Actions service refuses a second session for a scale set, so
//! the second listener would retry forever, but two EphemeralRunnerSet
//! controllers would race on the same runners. One leader is the simple
//! answer, and the standbys cost only a read of the Lease now and then.
//!
//! What the runtime does with it:
//! - components marked [`Component::leader_only`](super::Component::leader_only)
//!   start once this replica holds the Lease (the policy warm-up and the API
//!   check run on every replica, so a standby is ready to take over);
//! - a standby is *ready* (`/readyz` 200): a rollout must not wait for a
//!   replica that is healthy but not leading;
//! - losing the Lease after holding it stops the process with an error, as
//!   controller-runtime does: the controllers' caches and the listeners'
//!   state are not built to pause, and a restart makes the replica a clean
//!   standby;
//! - shutdown releases the Lease after the components returned (message
//!   sessions deleted), so the next leader takes over at once instead of
//!   waiting for the Lease to expire.
//!
//! ## Stepping down in time
//!
//! A leader that cannot reach the API server cannot renew, and cannot
//! learn that a standby took the Lease once it expired. If it carried on,
//! two replicas would lead: both polling for jobs, both scaling. So a
//! leader gives up on its own clock, as client-go's leader election does:
//! once [`Timing::renew_deadline`] has passed since its last successful
//! renewal (watched beside the attempt under way, so a request the API
//! server never answers cannot hold it) it counts itself no longer leading, a margin before the Lease can expire
//! for anyone else ([`Timing::lease_duration`]). The runtime then stops the
//! listeners (each deletes its message session, the Actions service being
//! reachable even when the API server is not) and the controllers.
//!
//! ## Clocks
//!
//! A Lease records its holder's `renewTime` on the holder's clock. A
//! standby does not compare that time with its own (the two clocks may
//! disagree by more than the lease): it takes a Lease for expired once
//! the record has not *changed*, as it observes it, for a whole
//! `leaseDurationSeconds` on its own monotonic clock (client-go's rule).
//! The holder, for its part, measures its renew deadline from when its own
//! renewal was acknowledged. Both sides only ever measure durations on
//! their own clock.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::api::field_managers;

/// Which Lease, and who this replica is.
#[derive(Clone, Debug)]
pub struct Election {
    /// The Lease's namespace.
    pub namespace: String,
    /// The Lease's name.
    pub lease: String,
    /// This replica's identity (its pod name and a random suffix, so two
    /// processes of one pod, old and new, are told apart).
    pub identity: String,
    /// How long an unrenewed Lease stays with its holder.
    pub duration: Duration,
}

/// The three durations of an election, derived from the lease duration in
/// client-go's proportions (15 s, 10 s, 2 s by default).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// How long a Lease not renewed stays with its holder, for others.
    pub lease_duration: Duration,
    /// How long the holder keeps leading without a successful renewal:
    /// two thirds of the lease, so it has stopped well before another
    /// replica may take the Lease.
    pub renew_deadline: Duration,
    /// How often the holder renews and a standby looks.
    pub retry_period: Duration,
}

impl Timing {
    /// The timing of a lease of `lease_duration`.
    pub fn of(lease_duration: Duration) -> Self {
        let renew_deadline = lease_duration.mul_f64(2.0 / 3.0);
        let retry_period = (lease_duration / 7).max(Duration::from_millis(200));
        Self {
            lease_duration,
            renew_deadline,
            retry_period,
        }
    }
}

/// What the Lease said when it was last read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Who holds it; `None` or empty when released.
    pub holder: Option<String>,
    /// Its `renewTime`, as the holder wrote it (compared only for change).
    pub renewed: Option<Timestamp>,
    /// Its `leaseDurationSeconds`.
    pub duration: Duration,
}

impl Record {
    /// The record of `lease`; `fallback` when it names no duration.
    pub fn of(lease: &Lease, fallback: Duration) -> Self {
        let spec = lease.spec.clone().unwrap_or_default();
        Self {
            holder: spec.holder_identity.filter(|h| !h.is_empty()),
            renewed: spec.renew_time.map(|t| t.0),
            duration: spec
                .lease_duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .map_or(fallback, Duration::from_secs),
        }
    }
}

/// What one attempt does with the Lease it read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// Write ourselves in as holder: the Lease is ours (a renewal), free,
    /// or expired.
    Take,
    /// Another replica holds it and it has not expired: leave it.
    Leave,
}

/// Whether `me` may write itself into the Lease whose record is `record`,
/// unchanged since `unchanged_for` as this replica observed it.
pub fn attempt(record: &Record, me: &str, unchanged_for: Duration) -> Attempt {
    match record.holder.as_deref() {
        None => Attempt::Take,
        Some(holder) if holder == me => Attempt::Take,
        Some(_) if unchanged_for >= record.duration => Attempt::Take,
        Some(_) => Attempt::Leave,
    }
}

/// Whether the holder still leads, `since_renewal` after its last
/// acknowledged renewal.
pub fn still_leading(timing: &Timing, since_renewal: Duration) -> bool {
    since_renewal < timing.renew_deadline
}

/// Why the campaign could not start.
#[derive(Debug, thiserror::Error)]
pub enum ElectionError {
    /// The Lease could not be read or created.
    #[error("the Lease {namespace}/{name} cannot be read or created: {source}")]
    Lease {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
}

/// A campaign under way: whether this replica leads, as it changes.
pub struct Leadership {
    leading: watch::Receiver<bool>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Election {
    /// Checks that the Lease can be read (creating it when missing, so a
    /// missing RBAC rule fails at start-up, not minutes later) and starts
    /// campaigning for it.
    pub async fn start(self, client: Client) -> Result<Leadership, ElectionError> {
        let api: Api<Lease> = Api::namespaced(client, &self.namespace);
        let lease_error = |source| ElectionError::Lease {
            namespace: self.namespace.clone(),
            name: self.lease.clone(),
            source,
        };
        if api
            .get_opt(&self.lease)
            .await
            .map_err(lease_error)?
            .is_none()
        {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.lease.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec::default()),
            };
            match api.create(&post_params(), &lease).await {
                Ok(_) => {}
                // Another replica created it first.
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(error) => return Err(lease_error(error)),
            }
        }
        let timing = Timing::of(self.duration);
        tracing::info!(
            lease = %self.lease,
            namespace = %self.namespace,
            identity = %self.identity,
            lease_duration = ?timing.lease_duration,
            renew_deadline = ?timing.renew_deadline,
            "campaigning for leadership"
        );
        let (tell, leading) = watch::channel(false);
        let stop = CancellationToken::new();
        let campaign = Campaign {
            api,
            name: self.lease,
            identity: self.identity,
            timing,
            observed: None,
        };
        let task = tokio::spawn(campaign.run(tell, stop.clone()));
        Ok(Leadership {
            leading,
            stop,
            task,
        })
    }
}

impl Leadership {
    /// A receiver of whether this replica leads now.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.leading.clone()
    }

    /// Resolves when leadership, once held, is lost: another replica took
    /// the Lease, or no renewal succeeded within the renew deadline. Never
    /// resolves for a standby that never led.
    pub async fn lost(&mut self) {
        if self.leading.wait_for(|leading| *leading).await.is_err() {
            return std::future::pending().await;
        }
        let _ = self.leading.wait_for(|leading| !*leading).await;
    }

    /// Ends the campaign and releases the Lease if this replica still
    /// holds it (a conditional write: a Lease another replica took
    /// meanwhile is left alone).
    pub async fn release(self) {
        self.stop.cancel();
        match tokio::time::timeout(Duration::from_secs(5), self.task).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) | Err(_) => tracing::warn!("the Lease was not released in time"),
        }
    }
}

/// The campaign task's state.
struct Campaign {
    api: Api<Lease>,
    name: String,
    identity: String,
    timing: Timing,
    /// The record last read and when it was first seen as it is.
    observed: Option<(Record, Instant)>,
}

impl Campaign {
    async fn run(mut self, tell: watch::Sender<bool>, stop: CancellationToken) {
        let mut last_renewal: Option<Instant> = None;
        loop {
            // While leading, the renew deadline is watched beside the
            // attempt, not after it: an API server that holds a request
            // open must not hold this replica in the lead past it.
            let deadline = last_renewal.map(|at| at + self.timing.renew_deadline);
            let attempt = tokio::select! {
                () = stop.cancelled() => break,
                () = sleep_until(deadline) => {
                    self.step_down(&tell, &mut last_renewal, "the last attempt is still unanswered");
                    continue;
                }
                attempt = tokio::time::timeout(self.timing.renew_deadline, self.try_take()) => attempt,
            };
            match attempt {
                Ok(Ok(Some(sent))) => {
                    if last_renewal.is_none() {
                        tracing::info!(identity = %self.identity, "leading");
                    }
                    last_renewal = Some(sent);
                    tell.send_replace(true);
                }
                Ok(Ok(None)) => {
                    if last_renewal.take().is_some() {
                        tracing::error!(identity = %self.identity, "another replica holds the Lease");
                        tell.send_replace(false);
                    }
                }
                Ok(Err(error)) => self.failed(&tell, &mut last_renewal, &error.to_string()),
                Err(_) => self.failed(
                    &tell,
                    &mut last_renewal,
                    "the API server did not answer in time",
                ),
            }
            let deadline = last_renewal.map(|at| at + self.timing.renew_deadline);
            tokio::select! {
                () = stop.cancelled() => break,
                () = sleep_until(deadline) => {
                    self.step_down(&tell, &mut last_renewal, "no attempt succeeded");
                }
                () = tokio::time::sleep(self.timing.retry_period) => {}
            }
        }
        if last_renewal.is_some() {
            self.release().await;
        }
    }

    /// A failed attempt: logged, and the end of leading once the renew
    /// deadline has passed.
    fn failed(&self, tell: &watch::Sender<bool>, last_renewal: &mut Option<Instant>, why: &str) {
        match *last_renewal {
            None => tracing::debug!(%why, "the Lease could not be read or taken"),
            Some(renewed) if still_leading(&self.timing, renewed.elapsed()) => {
                tracing::warn!(%why, since_renewal = ?renewed.elapsed(), "the Lease was not renewed; retrying");
            }
            Some(_) => self.step_down(tell, last_renewal, why),
        }
    }

    /// Stops leading: the renew deadline passed without a renewal.
    fn step_down(&self, tell: &watch::Sender<bool>, last_renewal: &mut Option<Instant>, why: &str) {
        tracing::error!(
            %why,
            renew_deadline = ?self.timing.renew_deadline,
            "no renewal within the renew deadline: stepping down before the Lease can pass to another replica"
        );
        *last_renewal = None;
        tell.send_replace(false);
    }

    /// Reads the Lease and writes this replica in as holder when it may;
    /// returns, if it holds the Lease now, when the write that renewed it
    /// was sent. That, not when the answer came, is when the renewal
    /// counts from: the API server may have stored the write, and a
    /// standby started its clock on it, long before a slow answer arrived,
    /// and a leader counting from the answer would lead on past the moment
    /// the standby may take over. A write that meets a newer
    /// Lease (409) is an error: of two replicas taking an expired Lease at
    /// once, one wins and the other reads again next time.
    async fn try_take(&mut self) -> Result<Option<Instant>, kube::Error> {
        let lease = self.api.get(&self.name).await?;
        let record = Record::of(&lease, self.timing.lease_duration);
        let now = Instant::now();
        let since = match &self.observed {
            Some((seen, at)) if *seen == record => now.duration_since(*at),
            _ => {
                self.observed = Some((record.clone(), now));
                Duration::ZERO
            }
        };
        if attempt(&record, &self.identity, since) == Attempt::Leave {
            return Ok(None);
        }
        let ours = record.holder.as_deref() == Some(self.identity.as_str());
        let spec = holder_spec(&self.identity, self.timing.lease_duration, &lease, !ours);
        // Conditional on the resourceVersion read. Someone wrote the Lease
        // since (409) is a failed attempt, not yet a loss: the next one
        // reads who holds it now.
        let sent = Instant::now();
        let written = write_if_unchanged(&self.api, &self.name, &lease, spec).await?;
        self.observed = Some((Record::of(&written, self.timing.lease_duration), now));
        Ok(Some(sent))
    }

    /// Gives the Lease up, if this replica still holds it, so the next
    /// leader need not wait for it to expire.
    async fn release(&self) {
        let released = release_if_held(&self.api, &self.name, &self.identity);
        match tokio::time::timeout(
            self.timing.retry_period.max(Duration::from_secs(2)),
            released,
        )
        .await
        {
            Ok(Ok(true)) => tracing::info!("leadership released"),
            Ok(Ok(false)) => tracing::info!("the Lease is another replica's already"),
            Ok(Err(error)) => tracing::warn!("the Lease was not released: {error}"),
            Err(_) => tracing::warn!("the Lease was not released: the API server did not answer"),
        }
    }
}

/// The spec that writes `identity` in as the holder of the Lease `read`,
/// for `duration`; `taking` (it was another's, or nobody's) also stamps the
/// acquisition and counts a transition.
pub(super) fn holder_spec(
    identity: &str,
    duration: Duration,
    read: &Lease,
    taking: bool,
) -> serde_json::Value {
    let stamp = MicroTime(Timestamp::now());
    let seconds = i32::try_from(duration.as_secs()).unwrap_or(i32::MAX);
    let mut spec = json!({
        "holderIdentity": identity,
        "leaseDurationSeconds": seconds,
        "renewTime": stamp,
    });
    if taking {
        spec["acquireTime"] = json!(stamp);
        spec["leaseTransitions"] = json!(
            read.spec
                .as_ref()
                .and_then(|s| s.lease_transitions)
                .unwrap_or(0)
                + 1
        );
    }
    spec
}

/// Merge-patches the Lease `name`'s spec, on the condition that it is
/// still the version `read` (409 otherwise).
pub(super) async fn write_if_unchanged(
    api: &Api<Lease>,
    name: &str,
    read: &Lease,
    spec: serde_json::Value,
) -> Result<Lease, kube::Error> {
    let patch = json!({
        "metadata": {"resourceVersion": read.metadata.resource_version},
        "spec": spec,
    });
    api.patch(name, &patch_params(), &Patch::Merge(&patch))
        .await
}

/// Empties the Lease `name` if `identity` still holds it, so the next
/// holder need not wait for it to expire; whether it did.
pub(super) async fn release_if_held(
    api: &Api<Lease>,
    name: &str,
    identity: &str,
) -> Result<bool, kube::Error> {
    let lease = api.get(name).await?;
    let holder = lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref());
    if holder != Some(identity) {
        return Ok(false);
    }
    let spec = json!({"holderIdentity": null, "renewTime": null, "acquireTime": null});
    write_if_unchanged(api, name, &lease, spec)
        .await
        .map(|_| true)
}

/// Sleeps until `deadline`; forever when there is none.
pub(super) async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

pub(super) fn post_params() -> PostParams {
    PostParams {
        field_manager: Some(field_managers::LEADER_ELECTION.to_owned()),
        ..PostParams::default()
    }
}

pub(super) fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(field_managers::LEADER_ELECTION.to_owned()),
        ..PatchParams::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held_by(holder: Option<&str>) -> Record {
        Record {
            holder: holder.map(str::to_owned),
            renewed: Some(Timestamp::UNIX_EPOCH),
            duration: Duration::from_secs(15),
        }
    }

    #[test]
    fn a_free_own_or_expired_lease_is_taken_and_a_live_one_left() {
        let secs = Duration::from_secs;
        assert_eq!(attempt(&held_by(None), "a", secs(0)), Attempt::Take);
        assert_eq!(attempt(&held_by(Some("a")), "a", secs(0)), Attempt::Take);
        assert_eq!(attempt(&held_by(Some("b")), "a", secs(14)), Attempt::Leave);
        assert_eq!(
            attempt(&held_by(Some("b")), "a", secs(15)),
            Attempt::Take,
            "unchanged for a whole lease duration, as this replica saw it"
        );
    }

    #[test]
    fn the_holder_steps_down_before_the_lease_can_pass_on() {
        let timing = Timing::of(Duration::from_secs(15));
        assert_eq!(timing.renew_deadline, Duration::from_secs(10));
        assert!(still_leading(&timing, Duration::from_secs(9)));
        assert!(!still_leading(&timing, Duration::from_secs(10)));
        // The holder stops a third of the lease before another replica
        // may take over, and has several attempts before that.
        for seconds in [2, 3, 5, 15, 60] {
            let timing = Timing::of(Duration::from_secs(seconds));
            assert!(timing.renew_deadline < timing.lease_duration, "{timing:?}");
            assert!(
                timing.retry_period * 3 < timing.renew_deadline,
                "{timing:?}"
            );
        }
    }
}
