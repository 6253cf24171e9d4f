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

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::{EphemeralRunnerPhase, EphemeralRunnerSetPhase, EphemeralRunnerSetStatus};

/// How soon a set whose cleanup waits on runners being deleted looks again.
/// Deletions wake it through the owned watch; this is the safety net.
pub const CLEANUP_POLL: Duration = Duration::from_secs(10);

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
    let counts_only = after.phase == before.phase
        && after.applied_actionable_revision == before.applied_actionable_revision
        && after.observed_generation == before.observed_generation
        && after.conditions == before.conditions;
    let rest = COUNTS_INTERVAL.saturating_sub(since_last?);
    (counts_only && !rest.is_zero()).then_some(rest)
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
    /// Runners to create.
    pub create: Option<Creation>,
    /// The status to write, when it differs from the current one. It
    /// carries the applied revision, so it is written only after the
    /// deletions and creations succeeded.
    pub status: Option<EphemeralRunnerSetStatus>,
    /// Remove our finalizer: the set is deleted and no runner is left.
    pub remove_finalizer: bool,
    /// When to look again without being woken.
    pub requeue: Duration,
    /// The generation whose numbered decision this pass applies, to be
    /// remembered once the plan is carried out (see
    /// [`SetView::decision_applied`]).
    pub decided: Option<i64>,
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
    if scaling && !acted_on && filled < set.replicas {
        let wanted = usize::try_from(set.replicas - filled).unwrap_or(0);
        renew.extend(renewable.by_ref().take(wanted).map(|r| r.name.clone()));
        // Even when renewals cover it all (a count of 0): a renewal that
        // fails is made up for by a creation of the same decision.
        create = Some(Creation {
            count: set.replicas - filled - i32::try_from(renew.len()).unwrap_or(i32::MAX),
            patch_id: set.patch_id,
            revision: applied,
            set_generation: set.generation,
        });
    }
    let mut requeue = if cleanup_done { RESYNC } else { CLEANUP_POLL };
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

    let status = status(set, runners, applied, current_outdated, &renew);
    Plan {
        delete,
        renew,
        create,
        status: (status != set.status).then_some(status),
        requeue,
        decided: (scaling && set.patch_id != 0).then_some(set.generation),
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
        delete,
        remove_finalizer: runners.is_empty(),
        requeue: CLEANUP_POLL,
        ..Plan::default()
    }
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
mod tests {
    use super::*;
    use EphemeralRunnerPhase::*;

    fn set(replicas: i32, patch_id: i32) -> SetView {
        SetView {
            generation: 3,
            has_finalizer: true,
            replicas,
            patch_id,
            actionable_revision: 1,
            status: EphemeralRunnerSetStatus {
                applied_actionable_revision: 1,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// A runner builder that reads as the state it describes.
    fn runner(name: &str) -> RunnerView {
        RunnerView {
            name: name.into(),
            phase: Some(Pending),
            revision: 1,
            set_generation: Some(1),
            ..Default::default()
        }
    }

    impl RunnerView {
        fn registered(mut self) -> Self {
            self.runner_id = 42;
            self
        }
        fn running(mut self) -> Self {
            self.phase = Some(Running);
            self.registered()
        }
        fn busy(mut self) -> Self {
            self.has_job = true;
            self
        }
        fn in_phase(mut self, phase: EphemeralRunnerPhase) -> Self {
            self.phase = Some(phase);
            self
        }
        fn revision(mut self, revision: i64) -> Self {
            self.revision = revision;
            self
        }
        fn patch(mut self, id: i32) -> Self {
            self.patch_id = Some(id);
            self
        }
        fn deleting(mut self) -> Self {
            self.deleting = true;
            self
        }
        fn created_at(mut self, second: u8) -> Self {
            self.created = Some(Time(
                format!("2026-01-01T00:00:{second:02}Z").parse().unwrap(),
            ));
            self
        }
    }

    fn deleted(plan: &Plan) -> Vec<(&str, DeleteReason)> {
        plan.delete.iter().map(|(n, r)| (n.as_str(), *r)).collect()
    }

    fn created(plan: &Plan) -> i32 {
        plan.create.map_or(0, |c| c.count)
    }

    #[test]
    fn a_set_without_the_finalizer_only_gets_it() {
        let mut s = set(3, 0);
        s.has_finalizer = false;
        let p = plan(&s, &[]);
        assert!(p.add_finalizer);
        assert_eq!(created(&p), 0);
        assert!(p.status.is_none());
    }

    #[test]
    fn scale_up_creates_the_missing_runners_with_the_patch_id_and_revision() {
        let p = plan(&set(3, 4), &[runner("a").running()]);
        assert_eq!(
            p.create,
            Some(Creation {
                count: 2,
                patch_id: 4,
                revision: 1,
                set_generation: 3
            })
        );
        assert!(p.delete.is_empty());
    }

    #[test]
    fn a_patch_id_already_acted_on_creates_nothing() {
        // One runner of patch 4 finished and was removed: the listener has
        // to send a new patch for a replacement, as in ARC.
        let p = plan(&set(3, 4), &[runner("a").running().patch(4)]);
        assert_eq!(created(&p), 0);
        // Patch 0 is never "acted on": it always reconciles the count.
        let p = plan(&set(3, 0), &[runner("a").running().patch(0)]);
        assert_eq!(created(&p), 2);
    }

    #[test]
    fn scale_down_on_patch_zero_takes_idle_runners_pending_first_oldest_first() {
        let runners = [
            runner("running-old").running().created_at(1),
            runner("busy").running().busy().created_at(0),
            runner("pending-new").registered().created_at(5),
            runner("pending-old").registered().created_at(2),
            runner("unregistered").created_at(0),
            runner("running-new").running().created_at(9),
        ];
        let p = plan(&set(2, 0), &runners);
        assert_eq!(
            deleted(&p),
            [
                ("pending-old", DeleteReason::ScaleDown),
                ("pending-new", DeleteReason::ScaleDown),
                ("running-old", DeleteReason::ScaleDown),
                ("running-new", DeleteReason::ScaleDown),
            ],
            "neither the busy nor the unregistered runner is taken"
        );
    }

    #[test]
    fn a_held_runner_is_replaced_and_never_deleted_by_the_set() {
        let held = || runner("held").running().busy().in_phase(Debugging);
        // It does not count towards replicas: a replacement is created.
        let p = plan(&set(2, 5), &[runner("a").running().patch(4), held()]);
        assert_eq!(created(&p), 1);
        assert!(p.delete.is_empty());
        // Scale-down on patch 0 takes idle runners, never the held one, and
        // does not see it as an excess runner.
        let p = plan(&set(1, 0), &[runner("a").running(), held()]);
        assert!(p.delete.is_empty(), "{:?}", p.delete);
        let p = plan(&set(0, 0), &[runner("a").running(), held()]);
        assert_eq!(deleted(&p), [("a", DeleteReason::ScaleDown)]);
        // A held runner without a job record (the runner crashed before the
        // listener wrote it) is not idle either.
        let mut unrecorded = held();
        unrecorded.has_job = false;
        let p = plan(&set(0, 0), &[unrecorded.clone()]);
        assert!(p.delete.is_empty());
        // A revision cleanup passes over it and still completes.
        let mut s = set(1, 0);
        s.actionable_revision = 2;
        let p = plan(&s, &[unrecorded.clone().revision(1)]);
        assert!(p.delete.is_empty());
        assert_eq!(p.status.unwrap().applied_actionable_revision, 2);
        // The set's deletion leaves it to end its hold.
        let mut s = set(1, 0);
        s.deleting = true;
        let p = plan(&s, &[unrecorded.clone(), runner("idle").running()]);
        assert_eq!(deleted(&p), [("idle", DeleteReason::SetDeleted)]);
        assert!(!p.remove_finalizer);
        // Once the hold ends (Failed), it is deleted like any finished runner.
        let p = plan(&set(1, 0), &[held().in_phase(Failed)]);
        assert_eq!(deleted(&p), [("held", DeleteReason::Finished)]);
        // Not counted as pending, running or failed.
        let p = plan(&set(1, 0), &[held(), runner("a").running()]);
        let status = p.status.unwrap();
        assert_eq!(status.current_replicas, 1);
        assert_eq!(status.failed_ephemeral_runners, 0);
    }

    #[test]
    fn scale_down_never_takes_a_runner_with_a_job_even_when_short() {
        let runners = [runner("a").running().busy(), runner("b").running().busy()];
        let p = plan(&set(0, 0), &runners);
        assert!(p.delete.is_empty());
    }

    #[test]
    fn a_decision_with_a_patch_id_never_scales_down() {
        // Patch ids restart at 0 when the listener goes quiet, so they are
        // not ordered across sequences: a non-zero id cannot prove that the
        // runners it would remove predate it. Older, newer or equal, such a
        // decision removes nothing.
        let runners = [
            runner("a").running().patch(5),
            runner("b").running().patch(5),
            runner("c").running().patch(5),
        ];
        for patch_id in [3, 5, 8] {
            let p = plan(&set(1, patch_id), &runners);
            assert!(p.delete.is_empty(), "patch {patch_id}");
            assert_eq!(created(&p), 0);
        }
        assert_eq!(plan(&set(1, 0), &runners).delete.len(), 2);
    }

    #[test]
    fn a_view_of_the_set_older_than_its_runners_decides_nothing() {
        let mut young = runner("a").running().patch(0);
        young.set_generation = Some(4);
        let p = plan(&set(0, 0), &[young.clone(), runner("b").running()]);
        assert!(p.delete.is_empty() && p.create.is_none() && p.status.is_none());
        young.set_generation = Some(3);
        assert_eq!(
            plan(&set(0, 0), &[young, runner("b").running()])
                .delete
                .len(),
            2
        );
    }

    #[test]
    fn finished_runners_are_deleted_and_replaced() {
        let runners = [
            runner("ok").in_phase(Succeeded),
            runner("failed").in_phase(Failed).busy(),
            runner("live").running(),
        ];
        let p = plan(&set(3, 0), &runners);
        assert_eq!(
            deleted(&p),
            [
                ("ok", DeleteReason::Finished),
                ("failed", DeleteReason::Finished)
            ]
        );
        assert_eq!(created(&p), 2);
        let status = p.status.clone().unwrap();
        assert_eq!(
            (
                status.current_replicas,
                status.running_ephemeral_runners,
                status.failed_ephemeral_runners
            ),
            (2, 1, 1),
            "counted as ARC counts them until they are gone"
        );
    }

    impl RunnerView {
        /// Succeeded `secs` ago, its registration gone.
        fn renewable(mut self, secs: u64) -> Self {
            self.phase = Some(Succeeded);
            self.renewable_for = Some(Duration::from_secs(secs));
            self
        }
        /// The listener recorded its job's end.
        fn end_heard(mut self) -> Self {
            self.job_ended = true;
            self
        }
    }

    #[test]
    fn a_decision_renews_runners_that_succeeded_before_creating_any() {
        let runners = [
            runner("live").running().patch(3),
            runner("young").renewable(1),
            runner("old").renewable(5),
        ];
        // Three wanted, one live: the two that succeeded are renewed, the
        // one that waited longest first, and nothing is created.
        let p = plan(&set(3, 4), &runners);
        assert_eq!(p.renew, ["old", "young"]);
        assert_eq!(created(&p), 0);
        assert!(p.delete.is_empty());
        let status = p.status.unwrap();
        assert_eq!(
            (status.current_replicas, status.pending_ephemeral_runners),
            (3, 2),
            "renewed runners count as pending at once"
        );
        // Four wanted: one more is created.
        let p = plan(&set(4, 4), &runners);
        assert_eq!(p.renew.len(), 2);
        assert_eq!(created(&p), 1);
        // Two wanted: the one left waits for a later decision, and the set
        // looks again when its wait would end.
        let p = plan(&set(2, 4), &runners);
        assert_eq!(p.renew, ["old"]);
        assert!(p.delete.is_empty());
        assert_eq!(p.requeue, RENEWAL_WINDOW - Duration::from_secs(1));
    }

    #[test]
    fn a_runner_no_decision_renews_is_deleted_after_the_window_or_on_patch_zero() {
        // The decision was acted on: nothing is renewed; the runner waits
        // out the window, then goes.
        let acted = [
            runner("live").running().patch(4),
            runner("done").renewable(3),
        ];
        let p = plan(&set(2, 4), &acted);
        assert!(p.renew.is_empty() && p.delete.is_empty());
        let late = [
            runner("live").running().patch(4),
            runner("done").renewable(10),
        ];
        assert_eq!(
            deleted(&plan(&set(2, 4), &late)),
            [("done", DeleteReason::Finished)]
        );
        // Patch 0 says no decision is coming: deleted at once.
        let settled = [runner("live").running(), runner("done").renewable(1)];
        assert_eq!(
            deleted(&plan(&set(1, 0), &settled)),
            [("done", DeleteReason::Finished)]
        );
        // ... unless it is wanted.
        assert_eq!(plan(&set(2, 0), &settled).renew, ["done"]);
    }

    #[test]
    fn a_decision_applied_once_does_not_replace_runners_that_succeeded_under_it() {
        let applied = |replicas, patch_id| SetView {
            decision_applied: true,
            ..set(replicas, patch_id)
        };
        // A pass found patch 4 satisfied (three live for three wanted), so
        // no runner carries it. One of the three then succeeded.
        let after = [
            runner("a").running().patch(3),
            runner("b").running().patch(3),
            runner("done").renewable(0),
        ];
        // ARC would replace it: its job was counted by the statistics of
        // the decision, and no job may be left for the replacement.
        let p = plan(&set(3, 4), &after);
        assert_eq!(p.renew, ["done"]);
        // Once the decision was applied, it fills its place.
        let p = plan(&applied(3, 4), &after);
        assert!(p.renew.is_empty() && created(&p) == 0, "{p:?}");
        // A runner lost without succeeding is still made up for, by
        // renewing one kept for renewal when there is one.
        let lost = [runner("a").running().patch(3)];
        assert_eq!(created(&plan(&applied(3, 4), &lost)), 2);
        let lost_and_done = [runner("a").running().patch(3), runner("done").renewable(0)];
        let p = plan(&applied(3, 4), &lost_and_done);
        assert_eq!((p.renew.len(), created(&p)), (1, 0));
        // Patch 0 keeps the count whatever was applied before.
        assert_eq!(plan(&applied(3, 0), &after).renew, ["done"]);
        // A runner whose job's end the listener recorded (it saw the end
        // while the runner still ran): the decision had seen it end, and
        // counted the runner only because its pod had not exited yet.
        let heard = [
            runner("a").running().patch(3),
            runner("b").running().patch(3),
            runner("done").renewable(0).end_heard(),
        ];
        assert_eq!(plan(&applied(3, 4), &heard).renew, ["done"]);
    }

    #[test]
    fn a_pass_reports_the_numbered_decision_it_applied() {
        let runners = [runner("a").running().patch(3)];
        assert_eq!(plan(&set(1, 4), &runners).decided, Some(3));
        // Patch 0 is applied on every pass: nothing to remember.
        assert_eq!(plan(&set(1, 0), &runners).decided, None);
        // A decision held back (a revision being cleaned up, the set
        // parked as Outdated, a view older than its runners) is not
        // applied yet.
        let mut cleanup = set(1, 4);
        cleanup.actionable_revision = 2;
        let old = [runner("old").running().revision(1)];
        assert_eq!(plan(&cleanup, &old).decided, None);
        let outdated = [runner("o").in_phase(Outdated)];
        assert_eq!(plan(&set(1, 4), &outdated).decided, None);
        let newer = [RunnerView {
            set_generation: Some(9),
            ..runner("n")
        }];
        assert_eq!(plan(&set(1, 4), &newer).decided, None);
    }

    #[test]
    fn only_a_runner_of_the_applied_revision_whose_registration_is_gone_is_renewed() {
        // A Succeeded runner whose registration is not known gone yet is
        // not renewable: deleted and replaced, its finalizer deregisters.
        let p = plan(&set(1, 4), &[runner("done").in_phase(Succeeded)]);
        assert_eq!(deleted(&p), [("done", DeleteReason::Finished)]);
        assert!(p.renew.is_empty());
        assert_eq!(created(&p), 1);
        // Built from a revision being cleaned up: deleted.
        let mut s = set(1, 4);
        s.actionable_revision = 2;
        let p = plan(&s, &[runner("done").renewable(1)]);
        assert_eq!(deleted(&p), [("done", DeleteReason::OldRevision)]);
        assert!(p.renew.is_empty());
        // Failed runners are never renewed.
        let mut failed = runner("failed").renewable(1);
        failed.phase = Some(Failed);
        let p = plan(&set(1, 4), &[failed]);
        assert_eq!(deleted(&p), [("failed", DeleteReason::Finished)]);
    }

    #[test]
    fn a_new_revision_deletes_idle_runners_of_older_ones_and_leaves_busy_ones() {
        let mut s = set(3, 0);
        s.actionable_revision = 2;
        let runners = [
            runner("idle").running(),
            runner("pending"),
            runner("busy").running().busy(),
            runner("done").in_phase(Outdated),
            runner("new").running().revision(2),
        ];
        let p = plan(&s, &runners);
        assert_eq!(
            deleted(&p),
            [
                ("idle", DeleteReason::OldRevision),
                ("pending", DeleteReason::OldRevision),
                ("done", DeleteReason::OldRevision),
            ]
        );
        assert_eq!(created(&p), 0, "nothing is created while cleaning up");
        let status = p.status.clone().unwrap();
        assert_eq!(status.applied_actionable_revision, 1, "not applied yet");
        assert_eq!(p.requeue, CLEANUP_POLL);
    }

    #[test]
    fn a_revision_is_applied_only_once_its_deleted_runners_are_gone() {
        let mut s = set(2, 0);
        s.actionable_revision = 2;
        // Deleted but still there (its finalizer deregisters it): it could
        // still be handed a job with the old spec, so the cleanup waits.
        let waiting = [runner("going").deleting(), runner("busy").running().busy()];
        let p = plan(&s, &waiting);
        assert!(p.delete.is_empty());
        assert_eq!(p.status.clone().unwrap().applied_actionable_revision, 1);
        assert_eq!(created(&p), 0);

        let p = plan(&s, &[runner("busy").running().busy()]);
        let status = p.status.clone().unwrap();
        assert_eq!(status.applied_actionable_revision, 2);
        assert_eq!(
            p.create,
            Some(Creation {
                count: 1,
                patch_id: 0,
                revision: 2,
                set_generation: 3
            }),
            "new runners are built from the applied revision"
        );
    }

    #[test]
    fn a_crash_before_the_status_write_redoes_the_cleanup() {
        // The status still says revision 1 applied: the plan is the same as
        // before the crash, whatever part of the deletions went through.
        let mut s = set(1, 0);
        s.actionable_revision = 2;
        let before = plan(&s, &[runner("a").running(), runner("b").running()]);
        assert_eq!(before.delete.len(), 2);
        let after_half = plan(&s, &[runner("b").running()]);
        assert_eq!(deleted(&after_half), [("b", DeleteReason::OldRevision)]);
        assert_eq!(after_half.status.unwrap().applied_actionable_revision, 1);
    }

    #[test]
    fn stale_outdated_runners_are_replaced() {
        let mut s = set(2, 0);
        s.actionable_revision = 2;
        s.status.applied_actionable_revision = 2;
        let p = plan(
            &s,
            &[runner("old").in_phase(Outdated), runner("new").revision(2)],
        );
        assert_eq!(deleted(&p), [("old", DeleteReason::StaleOutdated)]);
        assert_eq!(created(&p), 1);
        assert_eq!(
            p.status.clone().unwrap().phase,
            Some(EphemeralRunnerSetPhase::Running)
        );
    }

    #[test]
    fn a_current_outdated_runner_holds_the_set_outdated_and_creates_nothing() {
        let runners = [runner("out").in_phase(Outdated), runner("idle").running()];
        let p = plan(&set(5, 0), &runners);
        assert_eq!(created(&p), 0);
        assert!(p.delete.is_empty(), "the verdict is kept, not replaced");
        assert_eq!(
            p.status.clone().unwrap().phase,
            Some(EphemeralRunnerSetPhase::Outdated)
        );
        // Pinned to zero by its owner, the idle runner goes.
        let p = plan(&set(0, 0), &runners);
        assert_eq!(deleted(&p), [("idle", DeleteReason::ScaleDown)]);
    }

    #[test]
    fn an_advanced_revision_releases_an_outdated_set() {
        let mut s = set(1, 0);
        s.actionable_revision = 2;
        s.status.phase = Some(EphemeralRunnerSetPhase::Outdated);
        let p = plan(&s, &[runner("out").in_phase(Outdated)]);
        assert_eq!(deleted(&p), [("out", DeleteReason::OldRevision)]);
        let p = plan(&s, &[]);
        let status = p.status.clone().unwrap();
        assert_eq!(status.phase, Some(EphemeralRunnerSetPhase::Running));
        assert_eq!(status.applied_actionable_revision, 2);
        assert_eq!(created(&p), 1);
    }

    #[test]
    fn an_unchanged_status_is_not_written() {
        let mut s = set(1, 0);
        let runners = [runner("a").running()];
        s.status = plan(&s, &runners).status.unwrap();
        let p = plan(&s, &runners);
        assert_eq!(
            p,
            Plan {
                requeue: RESYNC,
                ..Plan::default()
            }
        );
    }

    #[test]
    fn deletion_releases_idle_runners_and_waits_for_busy_ones() {
        let mut s = set(3, 0);
        s.deleting = true;
        let p = plan(
            &s,
            &[runner("idle").running(), runner("busy").running().busy()],
        );
        assert_eq!(deleted(&p), [("idle", DeleteReason::SetDeleted)]);
        assert!(!p.remove_finalizer);
        let p = plan(&s, &[runner("idle").deleting()]);
        assert!(p.delete.is_empty() && !p.remove_finalizer);
        assert!(plan(&s, &[]).remove_finalizer);
        assert!(p.create.is_none());
        // A runner that ended with its job still recorded runs nothing.
        let ended = [
            runner("succeeded").running().busy().in_phase(Succeeded),
            runner("failed").running().busy().in_phase(Failed),
        ];
        assert_eq!(
            deleted(&plan(&s, &ended)),
            [
                ("succeeded", DeleteReason::SetDeleted),
                ("failed", DeleteReason::SetDeleted)
            ]
        );
    }

    #[test]
    fn counts_alone_are_written_at_most_once_a_second() {
        let before = EphemeralRunnerSetStatus {
            current_replicas: 3,
            phase: Some(EphemeralRunnerSetPhase::Running),
            observed_generation: Some(2),
            ..EphemeralRunnerSetStatus::default()
        };
        let counts = EphemeralRunnerSetStatus {
            current_replicas: 4,
            running_ephemeral_runners: 2,
            ..before.clone()
        };
        let ms = Duration::from_millis;
        // The first write, or one a second after the last: at once.
        assert_eq!(counts_deferred(&before, &counts, None), None);
        assert_eq!(counts_deferred(&before, &counts, Some(ms(1000))), None);
        // Sooner: put off for the rest of the second.
        assert_eq!(
            counts_deferred(&before, &counts, Some(ms(300))),
            Some(ms(700))
        );
        // Anything besides the counts goes at once.
        let phase = EphemeralRunnerSetStatus {
            phase: Some(EphemeralRunnerSetPhase::Outdated),
            ..counts.clone()
        };
        let generation = EphemeralRunnerSetStatus {
            observed_generation: Some(3),
            ..counts.clone()
        };
        let revision = EphemeralRunnerSetStatus {
            applied_actionable_revision: 2,
            ..counts
        };
        for after in [phase, generation, revision] {
            assert_eq!(
                counts_deferred(&before, &after, Some(ms(10))),
                None,
                "{after:?}"
            );
        }
    }
}
