//! What an EphemeralRunnerSet should do next, decided from a snapshot of the
//! set and its runners, without I/O.
//!
//! The rules, in the order they are applied:
//!
//! 1. A set being deleted releases every runner that is not running a job
//!    and keeps its finalizer until no runner is left; a runner with a job
//!    finishes it first.
//! 2. A new `spec.actionableRevision` is applied by cleanup first: every
//!    runner built from an older revision that has no job is deleted (busy
//!    ones are left to finish), and `status.appliedActionableRevision` moves
//!    only once none of them remains. The marker lives in the status and is
//!    written last, so a controller that dies part-way comes back behind the
//!    spec and redoes the cleanup instead of skipping runners of the old
//!    spec (seed 004).
//! 3. Finished runners (Succeeded, or Failed, which the runner's own
//!    controller only reports once its failure limit is spent) are deleted;
//!    the runner's finalizer takes care of its registration. A runner that
//!    succeeded, whose registration is gone, and that was built from the
//!    applied revision is renewable instead: a decision that wants runners
//!    renews it (a new registration and pod under the same object, see
//!    `RunnerRenewal`) rather than creating one, and it waits up to
//!    [`RENEWAL_WINDOW`] for such a decision before it is deleted (at once
//!    on patch id 0, which says no decision is coming).
//! 4. An Outdated runner built from an older revision than the applied one
//!    judged a spec that no longer exists: it is deleted and replaced. One
//!    built from the applied revision judged the current spec: it holds the
//!    set in phase Outdated and no runner is created, since a fresh runner of
//!    the same spec would only report Outdated again, forever.
//! 5. Scaling follows ARC's patch-id contract with the listener: runners are
//!    created up to `replicas` unless the current patch id was already acted
//!    on (a runner carries it); scale-down happens only on patch id 0, and
//!    removes only idle runners (registered, no job). One departure: a
//!    decision a pass found satisfied (nothing to create, so no runner
//!    carries its id) stays armed in ARC, and the next runner to finish is
//!    replaced under it, though the statistics it was made on counted that
//!    runner's job. At the end of a burst this replaced runners that no job
//!    was left for: a registration made and removed again, two Actions
//!    calls each. Here, once a pass has applied a decision, later passes
//!    under it count the runners that succeeded and are still kept for
//!    renewal as filling their places, unless the listener recorded their
//!    job's end: it records the end of a job whose runner it still sees
//!    running while jobs wait for runners, so a runner whose end the
//!    decision had already seen (it was still counted only because its pod
//!    had not exited) is replaced as soon as the record is there, as in ARC
//!    (a record that lands after the runner succeeded wakes the set). What
//!    a record cannot say is which decision saw the end: a set still on an
//!    earlier decision takes it as seen by that one too, at worst one
//!    surplus registration. A runner that failed or vanished is still replaced,
//!    so a decision satisfied in a quiet hour still makes up for a runner
//!    lost after it.
//! 6. A runner held for debugging (Debugging) is neither live nor finished:
//!    it does not count towards `replicas` (the set creates its
//!    replacement, as for a finished runner not cleaned up yet, so a hold
//!    never blocks scaling), and no rule here deletes it, not even the
//!    set's deletion or a revision cleanup: its own controller ends the
//!    hold (Failed, then rule 3) within the scale set's `maxHold`.
//! 7. A view of the set older than a runner it made (the runner records the
//!    set's generation it was built from) decides nothing: the cache is
//!    behind, and acting on it could remove runners a newer decision asked
//!    for.
//! 8. A renewal (rule 3) is written on the condition that the runner is
//!    still the version the pass listed. One refused because the runner
//!    changed since asks for the runner again ([`Need::Reread`]) and is
//!    written once more if it is still renewable; a renewal that does not
//!    go through is made up for by a creation under the same decision
//!    ([`renewal`], [`Plan::creation`]).
//! 9. A decision is acted on only in full. A pass creates at most
//!    [`CREATION_BATCH`] runners, and only the write that completes the
//!    decision (the last creation of the pass that completes it, or its
//!    renewals when no creation is left) carries the decision's patch id;
//!    the others carry 0, which no decision has. A pass that stops short (the
//!    batch is full, a creation failed, the API server refused one) thus
//!    leaves the decision armed, and the next pass, reading the runners
//!    from the API server, creates the rest. Were every runner to carry the
//!    id, one created before a failure would mark the decision acted on,
//!    and the runners after it would never be made: jobs left waiting
//!    until the listener's next decision, if one came.
//! 10. A status whose only change is the runner counts is written at most
//!     once a second ([`counts_deferred`]); events report the deletions off
//!     the everyday path and the status changes people wait on
//!     ([`Plan::deletion_events`], [`Plan::status_events`]).

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::{EphemeralRunnerPhase, EphemeralRunnerSetPhase, EphemeralRunnerSetStatus};
use crate::controllers::kit::Notice;

mod renewal;

pub use renewal::{Need, RenewalStep, Tried, Written, renewal};

/// How soon a set whose cleanup waits on runners being deleted looks again.
/// Deletions wake it through the owned watch; this is the safety net.
pub const CLEANUP_POLL: Duration = Duration::from_secs(10);

/// The most runners one pass creates. A decision for more is applied over
/// several passes, one after another (rule 9): a pass stays short, so a
/// set's deletion, a spec change or a scale-down is seen between batches
/// rather than after thousands of writes, and one set does not hold a
/// worker for minutes.
pub const CREATION_BATCH: i32 = 100;

/// How often a settled set is looked at even if nothing wakes it: the
/// eventual-consistency net for a missed watch event.
pub const RESYNC: Duration = Duration::from_secs(300);

/// How long a renewable runner (rule 3) waits for a decision that renews
/// it before it is deleted.
///
/// Under a burst, a runner finishes its job a little before the listener
/// hears of it and asks for a replacement (its messages are read in
/// batches): a runner deleted the moment it finished would be gone by
/// then, and the replacement made from scratch, three API server writes
/// more than a renewal (the runner created, deleted and finalized). A few
/// batch windows cover that; a longer wait only keeps a finished runner's
/// object (its pod is gone already) a little longer when no job follows.
pub const RENEWAL_WINDOW: Duration = Duration::from_secs(10);

/// The least time between two status writes of a set that only move its
/// runner counts.
pub const COUNTS_INTERVAL: Duration = Duration::from_secs(1);

/// How long to put off writing `after` over `before`, if at all: a status
/// whose only change is the runner counts, written less than
/// [`COUNTS_INTERVAL`] after the last write (`since_last`), waits for the
/// rest of it. Under a burst the counts move with every runner, several
/// times a second, and a status write each time was about one API server
/// write per job; no one reads the counts to the second (the listener
/// counts runners from its own watch). Everything else the status says
/// (phase, applied revision, observed generation, conditions) is written
/// at once: the revision marks a cleanup done, and people and tests wait on
/// the others.
pub fn counts_deferred(
    before: &EphemeralRunnerSetStatus,
    after: &EphemeralRunnerSetStatus,
    since_last: Option<Duration>,
) -> Option<Duration> {
    let rest = COUNTS_INTERVAL.saturating_sub(since_last?);
    (counts_only(before, after) && !rest.is_zero()).then_some(rest)
}

/// Whether `after` differs from `before` in the runner counts alone: a
/// write that only informs, which the apply layer also holds to the
/// host's status budget (a set's interval bounds one set; a fleet of them
/// needs a bound for the sum).
pub fn counts_only(before: &EphemeralRunnerSetStatus, after: &EphemeralRunnerSetStatus) -> bool {
    after.phase == before.phase
        && after.applied_actionable_revision == before.applied_actionable_revision
        && after.observed_generation == before.observed_generation
        && after.conditions == before.conditions
}

/// What the plan needs to know about the set.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SetView {
    /// `metadata.generation`.
    pub generation: i64,
    /// Whether the set is being deleted.
    pub deleting: bool,
    /// Whether our finalizer is on it.
    pub has_finalizer: bool,
    /// `spec.replicas`.
    pub replicas: i32,
    /// `spec.patchID`.
    pub patch_id: i32,
    /// `spec.actionableRevision`.
    pub actionable_revision: i64,
    /// The status as it is now.
    pub status: EphemeralRunnerSetStatus,
    /// Whether a pass of this controller already applied this generation's
    /// decision (rule 5; [`Plan::decided`] of that pass). Kept in memory:
    /// after a restart it is false, which at worst lets one decision
    /// replace a succeeded runner, as ARC would.
    pub decision_applied: bool,
    /// How long ago this controller last wrote the status, if it remembers
    /// (rule 10). Kept in memory: after a restart the first write is never
    /// put off.
    pub since_status_written: Option<Duration>,
}

/// What the plan needs to know about one runner of the set.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunnerView {
    /// Its name.
    pub name: String,
    /// Its creation time, to remove the oldest first.
    pub created: Option<Time>,
    /// Whether it is being deleted.
    pub deleting: bool,
    /// `status.phase`.
    pub phase: Option<EphemeralRunnerPhase>,
    /// `status.runnerId`: non-zero once registered.
    pub runner_id: i64,
    /// Whether the listener recorded a job for it.
    pub has_job: bool,
    /// Whether the listener recorded the end of its job (rule 5).
    pub job_ended: bool,
    /// The patch id it was created under (annotation).
    pub patch_id: Option<i32>,
    /// The revision it was built from (annotation); absent counts as 0.
    pub revision: i64,
    /// The set generation it was built from (annotation).
    pub set_generation: Option<i64>,
    /// How long ago it succeeded with its registration gone, when it did
    /// and it is built as the set builds runners now (spec and metadata):
    /// it can be renewed (rule 3).
    pub renewable_for: Option<Duration>,
}

impl RunnerView {
    /// Whether a renewal of it may be written (rule 8): it is renewable
    /// and not being deleted.
    fn can_be_renewed(&self) -> bool {
        !self.deleting && self.renewable_for.is_some()
    }
}

impl RunnerView {
    fn phase(&self) -> EphemeralRunnerPhase {
        self.phase.unwrap_or_default()
    }

    /// Held for debugging (rule 6).
    fn held(&self) -> bool {
        self.phase() == EphemeralRunnerPhase::Debugging
    }

    /// Registered and without a job: the only runners scale-down may take.
    fn idle(&self) -> bool {
        self.runner_id != 0 && !self.has_job
    }

    /// Running a job, as far as the set can tell: a job recorded on a
    /// runner that has not ended. A runner that succeeded or failed can
    /// carry the record of the job it ran (the listener's record can come
    /// after the end), and waiting for that job to finish would wait
    /// forever: a set being deleted would keep its finalizer.
    fn running_a_job(&self) -> bool {
        self.has_job
            && !matches!(
                self.phase(),
                EphemeralRunnerPhase::Succeeded | EphemeralRunnerPhase::Failed
            )
    }
}

/// Why a runner is deleted; also the reason of the event that reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeleteReason {
    /// The set is being deleted.
    SetDeleted,
    /// Built from an older revision than the one being applied.
    OldRevision,
    /// Succeeded or Failed.
    Finished,
    /// Outdated against a revision that is no longer applied.
    StaleOutdated,
    /// More runners than `replicas`, on patch id 0.
    ScaleDown,
}

impl DeleteReason {
    /// A stable name for events and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SetDeleted => "SetDeleted",
            Self::OldRevision => "OldRevision",
            Self::Finished => "Finished",
            Self::StaleOutdated => "StaleOutdated",
            Self::ScaleDown => "ScaleDown",
        }
    }
}

/// Runners to create, all alike.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Creation {
    /// How many.
    pub count: i32,
    /// The patch id to record on them.
    pub patch_id: i32,
    /// The revision they are built from.
    pub revision: i64,
    /// The set generation they are built from.
    pub set_generation: i64,
    /// Whether these creations (or, with none, the renewals made under
    /// them) complete the decision: only then does the write that
    /// completes it carry its patch id (rule 9).
    pub completes: bool,
}

impl Creation {
    /// The patch id recorded on the runner written `index`-th of `count`
    /// (creations, or renewals when no creation follows): the decision's
    /// on the last write that completes it, 0 on every other.
    pub fn patch_id_of(&self, index: i32, count: i32) -> i32 {
        if self.completes && index + 1 >= count {
            self.patch_id
        } else {
            0
        }
    }
}

/// What to do, in the order the apply layer does it: finalizer, deletions,
/// renewals, creations, then the status, last.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// Add our finalizer, then look again (nothing else is done first, so
    /// no runner exists that a deletion could orphan).
    pub add_finalizer: bool,
    /// Runners to delete, by name.
    pub delete: Vec<(String, DeleteReason)>,
    /// Runners to renew, by name, in place of creating as many: under the
    /// patch id and set generation a creation would carry.
    pub renew: Vec<String>,
    /// Runners to create, and the decision the renewals are made under.
    /// Once the renewals are done, [`Plan::creation`] says how many.
    pub create: Option<Creation>,
    /// Events to publish once the deletions are made.
    pub deletion_events: Vec<Notice>,
    /// The status to write, when it differs from the current one and is
    /// not put off (rule 10). It carries the applied revision, so it is
    /// written only after the deletions and creations succeeded.
    pub status: Option<EphemeralRunnerSetStatus>,
    /// Events to publish once the status is written.
    pub status_events: Vec<Notice>,
    /// Whether the status only moves the runner counts ([`counts_only`]).
    pub status_informs_only: bool,
    /// Remove our finalizer: the set is deleted and no runner is left.
    pub remove_finalizer: bool,
    /// When to look again without being woken.
    pub requeue: Duration,
    /// The generation whose numbered decision this pass applies, to be
    /// remembered once the plan is carried out (see
    /// [`SetView::decision_applied`]).
    pub decided: Option<i64>,
}

impl Plan {
    /// The runners to create once the renewals are done, `not_renewed` of
    /// them having not gone through (rule 8): the plan's count, and one
    /// more for each of those. The renewals done carry the decision's
    /// patch id, so the next pass takes the decision as acted on and would
    /// not make up for them.
    pub fn creation(&self, not_renewed: usize) -> Option<Creation> {
        self.create
            .map(|c| Creation {
                count: c
                    .count
                    .saturating_add(i32::try_from(not_renewed).unwrap_or(i32::MAX)),
                ..c
            })
            .filter(|c| c.count > 0)
    }
}

/// The applied revision a set renews its runners on, if it renews any now
/// (see [`crate::backlog`]): not while it is being deleted or without its
/// finalizer, not while a revision cleanup is under way (the plan's status
/// moves the applied revision once it is done), and not while a runner of
/// the applied revision reports Outdated (rule 4: a runner of that spec
/// would only report Outdated again). The same conditions as the set's own
/// renewals (rule 3).
pub fn renewal_terms(set: &SetView, plan: &Plan) -> Option<i64> {
    let status = plan.status.as_ref().unwrap_or(&set.status);
    let open = !set.deleting
        && set.has_finalizer
        && !plan.add_finalizer
        && status.applied_actionable_revision >= set.actionable_revision
        && status.phase != Some(EphemeralRunnerSetPhase::Outdated);
    open.then_some(status.applied_actionable_revision)
}

/// Decides what the set does next.
pub fn plan(set: &SetView, runners: &[RunnerView]) -> Plan {
    if set.deleting {
        return plan_deletion(set, runners);
    }
    if !set.has_finalizer {
        return Plan {
            add_finalizer: true,
            requeue: RESYNC,
            ..Plan::default()
        };
    }
    if let Some(newest) = runners.iter().filter_map(|r| r.set_generation).max()
        && newest > set.generation
    {
        // Rule 7: our copy of the set predates a runner it made.
        return Plan {
            requeue: CLEANUP_POLL,
            ..Plan::default()
        };
    }

    let mut delete = Vec::new();
    let mut applied = set.status.applied_actionable_revision;
    let mut waiting = false;
    if set.actionable_revision > applied {
        // Rule 2.
        for r in runners
            .iter()
            .filter(|r| r.revision < set.actionable_revision)
        {
            if r.running_a_job() || r.held() {
                continue;
            }
            if r.deleting {
                waiting = true;
            } else {
                delete.push((r.name.clone(), DeleteReason::OldRevision));
            }
        }
        if delete.is_empty() && !waiting {
            applied = set.actionable_revision;
        }
    }
    let cleanup_done = applied >= set.actionable_revision;

    let mut live: Vec<&RunnerView> = Vec::new();
    let mut renewable: Vec<&RunnerView> = Vec::new();
    let mut current_outdated = false;
    for r in runners.iter().filter(|r| !r.deleting) {
        if delete.iter().any(|(name, _)| *name == r.name) {
            continue;
        }
        match r.phase() {
            EphemeralRunnerPhase::Succeeded
                if cleanup_done && r.revision >= applied && r.renewable_for.is_some() =>
            {
                renewable.push(r);
            }
            EphemeralRunnerPhase::Succeeded | EphemeralRunnerPhase::Failed => {
                delete.push((r.name.clone(), DeleteReason::Finished));
            }
            EphemeralRunnerPhase::Outdated if r.revision < applied => {
                delete.push((r.name.clone(), DeleteReason::StaleOutdated));
            }
            EphemeralRunnerPhase::Outdated => current_outdated = true,
            // Rule 6.
            EphemeralRunnerPhase::Debugging => {}
            EphemeralRunnerPhase::Pending | EphemeralRunnerPhase::Running => live.push(r),
        }
    }

    let total = i32::try_from(live.len()).unwrap_or(i32::MAX);
    let latest_patch_id = runners.iter().filter_map(|r| r.patch_id).max();
    let acted_on = set.patch_id != 0 && latest_patch_id == Some(set.patch_id);
    let mut create = None;
    let mut renew = Vec::new();
    // Those that waited longest first: they are the nearest to deletion.
    renewable.sort_by(|a, b| (b.renewable_for, &a.name).cmp(&(a.renewable_for, &b.name)));
    let mut renewable = renewable.into_iter();
    let scaling = cleanup_done && !current_outdated;
    // Rule 5's departure: under a decision already applied, the runners
    // kept for renewal whose job's end the listener has not recorded fill
    // their places.
    let filled = if set.patch_id != 0 && set.decision_applied {
        let unheard = renewable.as_slice().iter().filter(|r| !r.job_ended).count();
        total.saturating_add(i32::try_from(unheard).unwrap_or(i32::MAX))
    } else {
        total
    };
    let mut requeue = if cleanup_done { RESYNC } else { CLEANUP_POLL };
    let mut completes = true;
    if scaling && !acted_on && filled < set.replicas {
        let wanted = usize::try_from(set.replicas - filled).unwrap_or(0);
        renew.extend(renewable.by_ref().take(wanted).map(|r| r.name.clone()));
        // Rule 9: a batch at most; the next pass, at once, makes the rest.
        let missing = set.replicas - filled - i32::try_from(renew.len()).unwrap_or(i32::MAX);
        completes = missing <= CREATION_BATCH;
        if !completes {
            requeue = Duration::ZERO;
        }
        // Even when renewals cover it all (a count of 0): a renewal that
        // fails is made up for by a creation of the same decision.
        create = Some(Creation {
            count: missing.min(CREATION_BATCH),
            patch_id: set.patch_id,
            revision: applied,
            set_generation: set.generation,
            completes,
        });
    }
    for r in renewable {
        let waited = r.renewable_for.unwrap_or(RENEWAL_WINDOW);
        if set.patch_id == 0 || waited >= RENEWAL_WINDOW {
            delete.push((r.name.clone(), DeleteReason::Finished));
        } else {
            requeue = requeue.min(RENEWAL_WINDOW - waited);
        }
    }
    if set.patch_id == 0 && total > set.replicas {
        // Rule 5: pending runners go before running ones, oldest first.
        let mut idle: Vec<&RunnerView> = live.iter().copied().filter(|r| r.idle()).collect();
        idle.sort_by(|a, b| {
            let rank = |r: &RunnerView| r.phase() != EphemeralRunnerPhase::Pending;
            (rank(a), &a.created, &a.name).cmp(&(rank(b), &b.created, &b.name))
        });
        let excess = usize::try_from(total - set.replicas).unwrap_or(0);
        delete.extend(
            idle.into_iter()
                .take(excess)
                .map(|r| (r.name.clone(), DeleteReason::ScaleDown)),
        );
    }

    let status = Some(status(set, runners, applied, current_outdated, &renew))
        .filter(|status| *status != set.status);
    let deferred = status
        .as_ref()
        .and_then(|status| counts_deferred(&set.status, status, set.since_status_written));
    let status = status.filter(|_| deferred.is_none());
    let status_informs_only = status
        .as_ref()
        .is_some_and(|after| counts_only(&set.status, after));
    Plan {
        deletion_events: deletion_events(&delete),
        status_events: status
            .as_ref()
            .map_or_else(Vec::new, |after| status_events(&set.status, after)),
        delete,
        renew,
        create,
        status,
        status_informs_only,
        requeue: deferred.map_or(requeue, |wait| wait.min(requeue)),
        // A decision is applied once a pass completes it (rule 9).
        decided: (scaling && set.patch_id != 0 && completes).then_some(set.generation),
        ..Plan::default()
    }
}

fn plan_deletion(set: &SetView, runners: &[RunnerView]) -> Plan {
    if !set.has_finalizer {
        return Plan {
            requeue: RESYNC,
            ..Plan::default()
        };
    }
    let delete: Vec<_> = runners
        .iter()
        .filter(|r| !r.deleting && !r.running_a_job() && !r.held())
        .map(|r| (r.name.clone(), DeleteReason::SetDeleted))
        .collect();
    Plan {
        deletion_events: deletion_events(&delete),
        delete,
        remove_finalizer: runners.is_empty(),
        requeue: CLEANUP_POLL,
        ..Plan::default()
    }
}

/// Events for the deletions off the everyday path, one per reason. A
/// finished runner deleted is every job's end: an event for it would be a
/// write per job for what the status counts say.
fn deletion_events(delete: &[(String, DeleteReason)]) -> Vec<Notice> {
    [
        DeleteReason::SetDeleted,
        DeleteReason::OldRevision,
        DeleteReason::StaleOutdated,
        DeleteReason::ScaleDown,
    ]
    .into_iter()
    .filter_map(|reason| {
        let names: Vec<&str> = delete
            .iter()
            .filter(|(_, r)| *r == reason)
            .map(|(n, _)| n.as_str())
            .collect();
        (!names.is_empty()).then(|| {
            let note = format!("Deleted runner(s) {}", names.join(", "));
            Notice::normal(reason.as_str(), note)
        })
    })
    .collect()
}

/// Events for a status written over `before`: a revision applied (its
/// cleanup done) and a phase changed. The counts get none: they move with
/// every job.
fn status_events(
    before: &EphemeralRunnerSetStatus,
    after: &EphemeralRunnerSetStatus,
) -> Vec<Notice> {
    let mut events = Vec::new();
    if after.applied_actionable_revision != before.applied_actionable_revision {
        let note = format!(
            "Runners of revisions before {} are cleaned up",
            after.applied_actionable_revision
        );
        events.push(Notice::normal("RevisionApplied", note));
    }
    if after.phase != before.phase {
        let phase = after.phase.map(|p| format!("{p:?}")).unwrap_or_default();
        events.push(Notice::normal("PhaseChanged", format!("Phase is {phase}")));
    }
    events
}

/// The counts as ARC reports them (runners being deleted are not counted),
/// the phase, and the revision that is applied once this plan is.
fn status(
    set: &SetView,
    runners: &[RunnerView],
    applied: i64,
    current_outdated: bool,
    renewed: &[String],
) -> EphemeralRunnerSetStatus {
    let count = |phase: EphemeralRunnerPhase| {
        let n = runners
            .iter()
            .filter(|r| !r.deleting)
            .map(|r| {
                if renewed.contains(&r.name) {
                    EphemeralRunnerPhase::Pending
                } else {
                    r.phase()
                }
            })
            .filter(|p| *p == phase)
            .count();
        i32::try_from(n).unwrap_or(i32::MAX)
    };
    let pending = count(EphemeralRunnerPhase::Pending);
    let running = count(EphemeralRunnerPhase::Running);
    let failed = count(EphemeralRunnerPhase::Failed);
    EphemeralRunnerSetStatus {
        current_replicas: pending + running + failed,
        pending_ephemeral_runners: pending,
        running_ephemeral_runners: running,
        failed_ephemeral_runners: failed,
        phase: Some(if current_outdated {
            EphemeralRunnerSetPhase::Outdated
        } else {
            EphemeralRunnerSetPhase::Running
        }),
        applied_actionable_revision: applied,
        observed_generation: Some(set.generation),
        conditions: set.status.conditions.clone(),
    }
}

#[cfg(test)]
mod tests;
