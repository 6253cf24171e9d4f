//! The rules of [`plan`](super), one test or more each.

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
            set_generation: 3,
            completes: true
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
fn a_decision_for_more_than_a_batch_is_created_over_passes_and_acted_on_only_in_full() {
    let ids =
        |c: Creation| -> Vec<i32> { (0..c.count).map(|i| c.patch_id_of(i, c.count)).collect() };
    // 250 wanted, none there: a batch, which does not complete the
    // decision; looked at again at once.
    let p = plan(&set(250, 4), &[]);
    let first = p.create.unwrap();
    assert_eq!((first.count, first.completes), (CREATION_BATCH, false));
    assert_eq!(p.requeue, Duration::ZERO);
    assert_eq!(p.decided, None, "not applied yet");
    // None of its runners carries the decision's id, so the next pass
    // does not take the decision as acted on.
    assert!(ids(first).iter().all(|id| *id == 0));
    let mut made: Vec<RunnerView> = (0..200)
        .map(|i| runner(&format!("r{i}")).patch(0))
        .collect();
    let p = plan(&set(250, 4), &made);
    let last = p.create.unwrap();
    assert_eq!((last.count, last.completes), (50, true));
    // The last runner of the batch that completes it carries the id.
    let last_ids = ids(last);
    assert_eq!(last_ids[49], 4);
    assert!(last_ids[..49].iter().all(|id| *id == 0));
    assert_eq!(p.decided, Some(3));
    assert_ne!(p.requeue, Duration::ZERO);
    // Then the decision is acted on: a runner of it that ends is not
    // replaced until the next decision, as in ARC.
    made.extend((200..249).map(|i| runner(&format!("r{i}")).patch(0)));
    made.push(runner("r249").patch(4));
    made.remove(0);
    assert_eq!(created(&plan(&set(250, 4), &made)), 0);
}

#[test]
fn a_creation_cut_short_leaves_its_decision_armed() {
    // Five wanted; three made before the API server refused the fourth.
    // They carry 0, so the next pass makes the other two under the same
    // decision (with every runner carrying 4, they would never be made).
    let made = [
        runner("a").patch(0),
        runner("b").patch(0),
        runner("c").patch(0),
    ];
    let p = plan(&set(5, 4), &made);
    let c = p.create.unwrap();
    assert_eq!((c.count, c.completes), (2, true));
    assert_eq!((c.patch_id_of(0, 2), c.patch_id_of(1, 2)), (0, 4));
    // A pass made of renewals alone completes the decision with them.
    let renewals_only = Creation {
        count: 0,
        completes: true,
        ..c
    };
    assert_eq!(renewals_only.patch_id_of(0, 1), 4);
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
fn a_renewal_refused_is_made_up_for_by_a_creation_of_the_same_decision() {
    let runners = [
        runner("live").running().patch(3),
        runner("young").renewable(1),
        runner("old").renewable(5),
    ];
    let p = plan(&set(3, 4), &runners);
    assert_eq!(p.renew, ["old", "young"]);
    // Both renewed: nothing to create.
    assert_eq!(p.creation(0), None);
    // One not: one runner created, under the decision the renewal was.
    assert_eq!(
        p.creation(1),
        Some(Creation {
            count: 1,
            patch_id: 4,
            revision: 1,
            set_generation: 3,
            completes: true
        })
    );
    // On top of what the plan creates anyway.
    let p = plan(&set(4, 4), &runners);
    assert_eq!(p.creation(2).map(|c| c.count), Some(3));
    // A plan that creates nothing has no renewal to make up for.
    assert_eq!(plan(&set(1, 4), &runners).creation(1), None);
}

#[test]
fn a_renewal_of_a_runner_that_changed_reads_it_again_once() {
    use Tried::{Reread, Written as W};
    let done = |renewed| Ok(RenewalStep::Done { renewed });
    // The common case: one write.
    assert_eq!(renewal(&[]), Ok(RenewalStep::Write));
    assert_eq!(renewal(&[W(Written::Renewed)]), done(true));
    // Refused for a change: read again, and written once more if it is
    // still renewable.
    let changed = W(Written::Changed);
    assert_eq!(renewal(std::slice::from_ref(&changed)), Err(Need::Reread));
    let still = Reread(Some(runner("done").renewable(2)));
    assert_eq!(
        renewal(&[changed.clone(), still.clone()]),
        Ok(RenewalStep::Write)
    );
    assert_eq!(
        renewal(&[changed.clone(), still.clone(), W(Written::Renewed)]),
        done(true)
    );
    // Refused again: given up, not read a second time.
    assert_eq!(
        renewal(&[changed.clone(), still, changed.clone()]),
        done(false)
    );
    // Gone, being deleted, or no longer renewable (it runs again,
    // its template changed): given up.
    for now in [
        None,
        Some(runner("done").renewable(2).deleting()),
        Some(runner("done").running()),
    ] {
        assert_eq!(renewal(&[changed.clone(), Reread(now)]), done(false));
    }
    // Failed otherwise: given up at once.
    assert_eq!(renewal(&[W(Written::Failed)]), done(false));
}

#[test]
fn a_status_of_counts_alone_is_put_off_and_looked_at_again_when_due() {
    let runners = [runner("a").running()];
    let mut s = set(1, 0);
    s.status = plan(&s, &runners).status.unwrap();
    let more = [runner("a").running(), runner("b").running()];
    s.replicas = 2;
    s.since_status_written = Some(Duration::from_millis(300));
    let p = plan(&s, &more);
    assert_eq!(p.status, None);
    assert_eq!(p.requeue, Duration::from_millis(700));
    assert!(p.status_events.is_empty());
    // A second after the last write, it goes, as a write that only
    // informs (held to the host's budget by the apply layer).
    s.since_status_written = Some(COUNTS_INTERVAL);
    let p = plan(&s, &more);
    assert!(p.status_informs_only);
    assert_eq!(p.status.unwrap().current_replicas, 2);
    // A status that says more than the counts is never held.
    s.generation += 1;
    let p = plan(&s, &more);
    assert!(p.status.is_some() && !p.status_informs_only, "{p:?}");
}

#[test]
fn events_report_deletions_off_the_everyday_path_and_status_changes() {
    let reasons = |events: &[Notice]| -> Vec<(String, String)> {
        events
            .iter()
            .map(|e| (e.reason.clone(), e.note.clone()))
            .collect()
    };
    // A finished runner deleted is every job's end: no event.
    let p = plan(&set(1, 0), &[runner("ok").in_phase(Succeeded)]);
    assert_eq!(deleted(&p), [("ok", DeleteReason::Finished)]);
    assert!(p.deletion_events.is_empty());
    let p = plan(&set(0, 0), &[runner("a").running(), runner("b").running()]);
    assert_eq!(
        reasons(&p.deletion_events),
        [("ScaleDown".into(), "Deleted runner(s) a, b".into())]
    );
    // The revision applied and the phase changed.
    let mut s = set(1, 0);
    s.actionable_revision = 2;
    s.status.phase = Some(EphemeralRunnerSetPhase::Outdated);
    let p = plan(&s, &[]);
    assert_eq!(
        reasons(&p.status_events),
        [
            (
                "RevisionApplied".into(),
                "Runners of revisions before 2 are cleaned up".into()
            ),
            ("PhaseChanged".into(), "Phase is Running".into())
        ]
    );
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
            set_generation: 3,
            completes: true
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
