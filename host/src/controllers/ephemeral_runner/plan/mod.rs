//! The decision of one reconcile, as a pure function of what was observed.
//!
//! [`plan`] reads a snapshot ([`Observed`]: the runner, its pod, its Secret,
//! what the unregistration pool says, the clock) and returns the [`Step`]s
//! to take, in order. It performs no I/O, so every rule below is a row in a
//! table test. When a rule needs an answer that costs something to get (the
//! deregistration policy's verdict, or whether the service sees the runner
//! online), the plan asks for it ([`Need`]) and is run again with it; the
//! costly questions are asked only when the answer decides something.
//!
//! The rule everything else bends around (seeds 001/002): **a runner pod is
//! never deleted while its registration may still be handed a job.** Every
//! path that removes a pod (the runner finished, it failed before it ran and
//! is recreated, it never registered, the EphemeralRunner is deleted) first
//! makes sure the registration is gone (`delete::ensure_gone`): the runner
//! removed it itself (the policy's `self-deregistered`), or the pool
//! reported it removed or not found. Only then are the pod and the Secret
//! deleted. The one exception is a pod already terminating past the bound
//! (its node is lost): it is force-deleted, since nothing arcwright does can
//! make that runner take a job any more, and leaving it would hold the
//! runner forever.
//!
//! The `Registered` condition records, across reconciles and restarts,
//! whether the registration of `status.runnerId` exists. It turns False
//! only on proof (removed, not found, self-deregistered, never registered)
//! and True when a new JIT config is created, which happens only once the
//! previous registration is gone, so it always describes the current id.
//!
//! A runner that succeeded may be renewed by its set for another job (see
//! `RunnerRenewal`): the set writes its status anew only once it is
//! Succeeded with `Registered` False, so no registration is ever forgotten,
//! and from there the runner starts over as a new one would, except that
//! the pod and Secret left by the job before (the pod is deleted when the
//! job ends; the Secret is kept for this) are told apart by the renewal
//! they were made for: the pod is waited out, the Secret written over.
//! "Renewal" means only that; an idle runner given a new registration
//! after `maxIdleAge` is *recycled* (module `recycle`).
//!
//! # The rules, in the order [`plan`] applies them
//!
//! Each names the function that decides it and the tests that hold it to
//! it (in `tests/`, by file: `lifecycle`, `deletion`, `starts`, `hold`,
//! `renewal`, `recycle`; `status` checks the writes as the API server
//! receives them). Every rule that deletes a pod goes through
//! `delete::ensure_gone` first.
//!
//! 1. A runner being deleted, if it holds the finalizer, has its
//!    registration made gone (the policy asked), then its pod and Secret of
//!    any renewal deleted, then the finalizer removed
//!    (`delete::deleted`; tests `deletion::deletion_holds_the_finalizer_until_everything_is_gone`,
//!    `renewal::a_renewed_runner_deleted_cleans_up_the_job_befores_objects`,
//!    `hold::a_held_runner_being_deleted_is_cleaned_up_as_usual`).
//! 2. A runner without the finalizer gets it, and nothing else
//!    ([`plan`]; `lifecycle::the_lifecycle_table`).
//! 3. A pod the API server refused fails the runner, `InvalidPod`
//!    (`register::refused`; `lifecycle::a_refused_pod_fails_the_runner_and_nothing_else`).
//! 4. The pod of the job before a renewal is waited out: the next pod has
//!    its name (`delete::terminate`; `renewal::a_renewed_runner_registers_anew_over_the_secret_of_the_job_before`).
//! 5. A job record naming another registration than the runner's (a late
//!    record of the job before a renewal) is no job of this runner's: it is
//!    decided on as absent and cleared with the next write
//!    (`without_earlier_job`; `renewal::a_late_record_of_the_job_before_a_renewal_is_not_the_runners_job`).
//! 6. A held runner keeps its pod until its hold ends, then is Failed
//!    (`HoldEnded`) and cleaned up, registration first
//!    (`hold::debugging`; `hold::a_held_runner_keeps_its_pod_until_the_hold_ends`,
//!    `hold::the_annotation_extends_or_releases_within_the_cap`,
//!    `hold::a_hold_is_told_to_slack_until_slack_accepted_it`).
//! 7. A runner that ended (Succeeded, Failed, Outdated) has its
//!    registration made gone (the policy asked), then its pod and Secret
//!    deleted; a Succeeded one keeps its Secret for a renewal to write over
//!    (`delete::ended`; `deletion::a_finished_runner_keeps_its_pod_until_its_registration_is_gone`,
//!    `deletion::a_self_deregistered_runner_costs_no_removal`,
//!    `deletion::a_policy_fallback_is_reported_on_the_runner`).
//! 8. A template without a runner container fails the runner,
//!    `InvalidTemplate` ([`plan`]; `lifecycle::the_lifecycle_table`).
//! 9. A pod being deleted is waited for up to the bound, then force-deleted
//!    (`delete::terminate`; `deletion::a_pod_stuck_terminating_is_force_deleted_after_the_bound`).
//! 10. A pod is followed into the status (`run::running`): its exit (0
//!     Succeeded, 7 Outdated, anything else with a job `JobFailed`), a
//!     failed start counted and retried after a backoff up to the limit
//!     (`run::failed_start`), a job that failed held for debugging
//!     (`hold::hold`), a clean exit after a job given a moment for its
//!     result (`run::result_pending`), an idle runner past `maxIdleAge`
//!     recycled (`recycle::recycle`), and a runner that does not come
//!     online within the registration timeout recreated
//!     (`lifecycle::the_lifecycle_table`, `starts::failed_starts_back_off_and_stop_at_the_limit`,
//!     `starts::a_runner_that_never_comes_online_is_recreated`,
//!     `hold::a_failed_job_holds_the_runner_and_removes_its_registration`,
//!     `hold::a_failure_is_not_held_without_a_hold_beyond_max_held_or_with_a_bad_spec`,
//!     `hold::a_clean_exit_after_a_job_waits_a_little_for_the_jobs_result`,
//!     `recycle::an_idle_runner_past_max_idle_age_gets_a_new_registration_and_pod`).
//! 11. Without a pod, the runner registers (once: a Secret that holds a
//!     registration is used; one whose registration is gone is deleted; a
//!     registration whose Secret is lost is removed first) and its pod is
//!     created, minding the backoff; a registration after the first is
//!     recorded in the status by the registration step (`register::absent`;
//!     `lifecycle::the_lifecycle_table`,
//!     `lifecycle::a_later_registration_is_recorded_with_the_registration_step`,
//!     `deletion::a_lost_secret_means_a_new_registration_after_the_old_one_goes`).
//!     Before it, the runner must be admitted: its template accepted by
//!     the pod-validation policy before every pod, and before its first
//!     registration its set's ownership proven; refused, it is Failed
//!     (`NotOwned`, `PodRefused`), and while the policy cannot judge,
//!     nothing is made (`register::admitted`;
//!     `lifecycle::a_runner_is_admitted_before_its_pod`).
//! 12. A runner that ends in this pass goes on to its ending (rule 7) in
//!     the same pass ([`plan`]; `lifecycle::the_lifecycle_table`); one that
//!     succeeded, its registration gone, is renewed in place instead when
//!     its set says a job waits for it (`renew::in_place`;
//!     `renewal::a_runner_finishing_while_a_job_waits_is_renewed_in_one_status_write`).
//!
//! And before them all, rule 0: a Secret made for the renewal after the
//! status's (a renewal in place whose status write did not go through)
//! holds a live registration; the renewal is completed with it, its
//! status written, before anything else is decided (`renew::resume`;
//! `renewal::a_renewal_whose_status_write_failed_is_completed_from_its_secret`).
//! 13. A first registration is copied from its Secret into the status with
//!     the next status write, and the status write goes first (`Pass::finish`;
//!     `lifecycle::a_first_registration_is_copied_into_the_status_with_the_next_write`).

mod delete;
mod hold;
mod recycle;
mod register;
mod renew;
mod run;
mod status;
#[cfg(test)]
mod tests;

use std::time::Duration;

use jiff::Timestamp;

use crate::api::ephemeral_runner::hold::HeldFailure;
use crate::api::ephemeral_runner::{ConditionReason, EventReason, PhaseReason};
use crate::api::{EphemeralRunner, EphemeralRunnerPhase, EphemeralRunnerStatus, finalizers};
use crate::controllers::kit::budget::SETTLED;
use crate::controllers::kit::{Severity, finalizer};
use crate::policy::types::{RunnerEnding, Verdict};

pub use status::{
    Cleared, ClearedJobRecord, Precondition, RegistrationRecord, StatusChange, StatusFields,
    setting,
};

/// The name of the container the runner runs in (ARC's).
pub const RUNNER_CONTAINER: &str = "runner";

/// Exit code of a runner whose version the service no longer accepts.
pub const OUTDATED_EXIT_CODE: i32 = 7;

/// The knobs of the rules, with ARC's values as defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Failed starts before the runner is marked Failed (ARC: 5).
    pub failure_limit: usize,
    /// The wait before the second start; doubled for each further failure
    /// (ARC: 5 s, 10 s, 20 s, 40 s, 80 s).
    pub backoff_base: Duration,
    /// The longest wait between starts.
    pub backoff_max: Duration,
    /// How long a runner may take, from its container's start (see
    /// [`PodView::registration_clock`]), to be seen online by the service
    /// before it is removed and recreated; a runner's own
    /// `spec.registrationTimeout` overrides it.
    pub registration_timeout: Duration,
    /// How long a pod may stay terminating before it is force-deleted.
    pub terminating_timeout: Duration,
    /// How often to look again while the pool works on a removal; the pool
    /// wakes the reconciler when it is done, so this is only a backstop.
    pub removal_recheck: Duration,
    /// The wait before a removal the pool gave up on is pushed again.
    pub removal_retry: Duration,
    /// How long, after a runner that had a job exited 0, to wait for the
    /// listener to record the job's result before calling it Succeeded,
    /// when failed jobs are held: a runner exits 0 after a failed job too,
    /// and its exit can be seen before the listener's JobCompleted lands.
    pub result_wait: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            failure_limit: 5,
            backoff_base: Duration::from_secs(5),
            backoff_max: Duration::from_secs(80),
            registration_timeout: Duration::from_secs(10 * 60),
            terminating_timeout: Duration::from_secs(60),
            removal_recheck: Duration::from_secs(30),
            removal_retry: Duration::from_secs(15),
            result_wait: Duration::from_secs(15),
        }
    }
}

impl Settings {
    /// The wait after the `failures`-th failed start.
    pub fn backoff(&self, failures: usize) -> Duration {
        if failures == 0 {
            return Duration::ZERO;
        }
        let exponent = u32::try_from(failures - 1).unwrap_or(u32::MAX).min(16);
        self.backoff_base
            .saturating_mul(1 << exponent)
            .min(self.backoff_max)
    }
}

/// The runner container as the pod reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunnerContainer {
    /// No status yet, or waiting (pulling, creating).
    Waiting,
    /// Running.
    Running,
    /// Terminated.
    Terminated {
        /// Its exit code.
        exit_code: i32,
        /// The kubelet's reason (`Completed`, `Error`, `OOMKilled`).
        reason: String,
    },
}

/// What the plan needs to know about the runner pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodView {
    /// Its uid (names are reused when the pod is recreated).
    pub uid: String,
    /// When it was created.
    pub created: Timestamp,
    /// When its deletion was requested, if it was.
    pub deleting_since: Option<Timestamp>,
    /// The runner container.
    pub runner: RunnerContainer,
    /// When the registration timeout starts counting: when the runner
    /// container started, or, before it has, when the pod's init containers
    /// were done (its `Initialized` condition turned true), so an image that
    /// cannot be pulled still times out. `None` while init containers run: a
    /// warm-up (seed 003's cache fill, say) may take longer than the timeout
    /// and is not the runner failing to register.
    pub registration_clock: Option<Timestamp>,
    /// The pod phase is Failed (evicted, a failed init container...).
    pub failed: bool,
    /// The init containers that terminated non-zero. A native sidecar
    /// (`restartPolicy: Always`, dind's) among them is not a failed start:
    /// the kubelet restarts it, and the plan leaves it out
    /// ([`init_failed`]).
    pub failed_init_containers: Vec<String>,
    /// Whether the kubelet marks the pod to be kept from node scale-down
    /// (`safe-to-evict: "false"`), which a busy runner's pod gets when its
    /// scale set protects busy runners.
    pub eviction_protected: bool,
    /// The pod's Ready condition.
    pub ready: bool,
    /// When the runner container terminated, if it did and the kubelet
    /// said.
    pub finished: Option<Timestamp>,
    /// The pod's reason and message when it failed, for events.
    pub failure_message: Option<String>,
    /// The renewal of the runner it was made for.
    pub renewal: u32,
}

/// The non-secret half of the JIT config Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretView {
    /// The registration the Secret holds the config of.
    pub runner_id: i64,
    /// Its name.
    pub runner_name: String,
    /// The renewal of the runner it was made for.
    pub renewal: u32,
    /// Its resourceVersion, so that replacing one made for an earlier
    /// renewal is conditional on it being that one still.
    pub resource_version: String,
}

/// What the unregistration pool says about the registration of the current
/// runner id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolView {
    /// Nothing queued or being worked, and no outcome waiting.
    Idle,
    /// Queued, being worked, or waiting out JobStillRunning.
    Claimed,
    /// The service removed it.
    Removed,
    /// The service did not know it: already gone.
    NotFound,
    /// The pool gave up on it; the message says why (no secret in it).
    Failed(String),
}

/// Whether the service sees the runner online (asked only once the
/// registration timeout has passed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Presence {
    /// Online: it registered.
    Online,
    /// Registered but never came online.
    Offline,
    /// The service has no such runner.
    Absent,
}

/// The deregistration policy's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerdictView {
    /// The verdict.
    pub verdict: Verdict,
    /// Why the configured policy did not answer, when the default did.
    pub fallback_reason: Option<String>,
}

/// Everything one reconcile saw.
#[derive(Clone, Debug)]
pub struct Observed<'a> {
    /// The runner.
    pub runner: &'a EphemeralRunner,
    /// Its pod.
    pub pod: Option<PodView>,
    /// Its JIT config Secret.
    pub secret: Option<SecretView>,
    /// The pool's view of the current registration.
    pub pool: PoolView,
    /// The deregistration verdict, when the plan asked for it.
    pub verdict: Option<VerdictView>,
    /// Whether the runner is online, when the plan asked for it.
    pub presence: Option<Presence>,
    /// The registration the service has under the runner's name, when the
    /// plan asked ([`Need::RegistrationByName`]): `Some(None)` for none.
    pub registered_by_name: Option<Option<i64>>,
    /// How many other runners of the same scale set are held for
    /// debugging, when the plan asked for it.
    pub held: Option<usize>,
    /// How many pods and Secrets the runner container hooks made for the
    /// runner are not yet being deleted, when the plan asked
    /// ([`Need::HookObjects`]).
    pub hook_objects: Option<usize>,
    /// Why the API server refused the runner pod this reconcile asked for
    /// (a 422: the pod the template makes is invalid), when it did.
    pub refused_pod: Option<String>,
    /// Whether the runner, finishing its job in this pass, is renewed in
    /// place for a job waiting, when the plan asked ([`Need::Renewal`]):
    /// `Some(None)` for no.
    pub renewal: Option<Option<RenewalGrant>>,
    /// Whether the runner may have a pod made, when the plan asked
    /// ([`Need::Admission`]).
    pub admission: Option<Admission>,
    /// Now.
    pub now: Timestamp,
}

/// Whether a runner about to have a pod made may have it.
///
/// A set builds its runners from a template the AutoscalingRunnerSet
/// controller judged, and counts them against its `maxRunners`; an
/// EphemeralRunner written by hand (or edited, or made by an
/// EphemeralRunnerSet written by hand) has been through neither. So before
/// each pod the runner's own template is judged by the pod-validation
/// policy its spec names, and before its first registration the runner
/// must be its set's (see `observe::admission`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Its set's, and its template accepted.
    Admitted,
    /// Refused for good: the runner fails, saying why.
    Refused {
        /// What was refused.
        refusal: Refusal,
        /// Why, for the status and the event.
        message: String,
    },
    /// The policy cannot judge yet (it never loaded, or its ConfigMap's
    /// first version has not come): nothing is made, and the runner is
    /// looked at again.
    Waiting(String),
}

/// What refused a runner its pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No EphemeralRunnerSet the API server holds owns it.
    NotOwned,
    /// The pod-validation policy refused its template.
    PodRefused,
}

/// How soon a runner whose pod-validation policy cannot judge is looked at
/// again.
pub const ADMISSION_RETRY: Duration = Duration::from_secs(15);

/// A renewal in place granted on the runner set's terms (see
/// [`crate::backlog`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenewalGrant {
    /// The set's generation the terms were offered at.
    pub set_generation: i64,
    /// The job the listener heard the runner's registration start, whose
    /// record may not be on the status (with renewal in place it is
    /// written as the status budget allows): the renewal names it as the
    /// job before.
    pub job_id: Option<String>,
}

/// An answer the plan needs before it can decide.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Need {
    /// Ask the deregistration policy about this ending.
    Verdict(RunnerEnding),
    /// Ask the service whether this runner id is online.
    Presence(i64),
    /// Count the other runners of the scale set held for debugging.
    HeldCount,
    /// Look the runner's name up in the service: it records no
    /// registration, but a host that stopped between registering it and
    /// storing its JIT config left one nobody records.
    RegistrationByName,
    /// Count the pods and Secrets the runner container hooks made for the
    /// runner (label `runner-pod=<runner>`) that are not being deleted.
    HookObjects,
    /// Ask the runner's set whether a job waits for the runner, which just
    /// finished its job (see [`crate::backlog`]).
    Renewal,
    /// Ask whether the runner may have a pod made ([`Admission`]):
    /// `first`, before its first registration, when its set's ownership is
    /// checked too.
    Admission {
        /// Whether the runner was never registered.
        first: bool,
    },
}

/// One thing to do.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Add the finalizer.
    AddFinalizer,
    /// Remove the finalizer: everything the runner owned is gone.
    RemoveFinalizer,
    /// Write this change of the status.
    PatchStatus(StatusChange),
    /// Write this change of the status, which only informs
    /// ([`StatusChange::informs_only`]), if the host's budget of such
    /// writes allows; else it is put off.
    InformStatus(StatusChange),
    /// Register the runner (a JIT config) and store it in its Secret.
    ///
    /// A first registration is recorded by its Secret alone, and copied
    /// into the status with the next status write (the pod running, or
    /// ending): a write per runner saved. A later one is written to the
    /// status at once (`record`), since the status then names the
    /// registration before it, and the plan must not take that one's end
    /// for this one's.
    Register {
        /// The resourceVersion of the Secret of the job before a renewal,
        /// which the new one replaces (the same name); none: it is created.
        replacing: Option<String>,
        /// The status write recording the registration, for one after the
        /// first.
        record: Option<RegistrationRecord>,
    },
    /// Renew the runner in place, for a job waiting: register it anew
    /// into its Secret (`replacing` names the version of the Secret of the
    /// job before, written over), then write its whole status anew as
    /// `renewal`, with the registration, in one write. The pod of the job
    /// before is deleted and the next one created by the steps after,
    /// from the runner as renewed.
    Renew {
        /// The resourceVersion of the Secret written over, if there is one.
        replacing: Option<String>,
        /// The renewal, the job before's outcome included.
        renewal: crate::api::RunnerRenewal,
        /// The resourceVersion of the runner the pass read: the status is
        /// written on the condition it is still that one.
        resource_version: Option<String>,
        /// The registration already in the Secret, made for this renewal
        /// by a renewal whose status write did not go through: then no
        /// registration is made, and the status records this one.
        registered: Option<(i64, String)>,
    },
    /// Create the runner pod from the template.
    CreatePod,
    /// Delete the pod with this uid.
    DeletePod {
        /// The pod's uid, so a newer pod of the same name is never hit.
        uid: String,
    },
    /// Delete the pod with this uid now, with grace 0.
    ForceDeletePod {
        /// The pod's uid.
        uid: String,
    },
    /// Mark the busy runner's pod (this uid) to be kept from node
    /// scale-down: `safe-to-evict: "false"` and `do-not-disrupt: "true"`.
    ProtectFromEviction {
        /// The pod's uid.
        uid: String,
    },
    /// Delete the JIT config Secret.
    DeleteSecret,
    /// Delete the pods and Secrets the runner container hooks made for the
    /// runner's jobs (label `runner-pod=<runner>`), as ARC's finalizer does:
    /// nothing owns them, so nothing else would.
    DeleteHookObjects,
    /// Hand the removal of this registration to the pool.
    Deregister {
        /// The registration.
        runner_id: i64,
    },
    /// Publish an event on the runner.
    ///
    /// Events are kept to what a person looking at a runner needs: warnings,
    /// and the steps off the everyday path (a registration removed by the
    /// pool, a hold, a stale registration cleaned up). The everyday steps of
    /// every runner (registered, pod created, succeeded) are not events:
    /// each would be an API server write per job (and the event's own watch
    /// traffic), for what the runner's status and conditions already say.
    Event {
        /// Normal or warning.
        severity: Severity,
        /// Its reason.
        reason: EventReason,
        /// What happened, for people; never a secret.
        note: String,
    },
    /// Tell the scale set's Slack channel that the runner is held, unless a
    /// post about it is under way (off the reconcile path, retried until
    /// Slack accepts it or the hold ends; see `super::notify`).
    NotifySlack(HeldFailure),
    /// Count a deregistration in the metrics.
    CountDeregistration {
        /// The verdict (`self-deregistered`, `remove-now`, ...).
        verdict: &'static str,
        /// How it ended (`skipped`, `removed`, `not-found`, `failed`).
        outcome: &'static str,
    },
}

/// The steps of one reconcile and when to look again.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// What to do, in order.
    pub steps: Vec<Step>,
    /// Look again after this long even if nothing changes.
    pub requeue: Option<Duration>,
}

/// One pass of the plan: what it decides on, and what it has decided so
/// far. Every rule takes the pass whole, so they all read the same facts
/// and add to the same steps and status change.
struct Pass<'a> {
    /// What was observed, of the runner's current renewal only: the rules
    /// decide on this.
    obs: &'a Observed<'a>,
    /// What was observed, with the pod and Secret left by the job before a
    /// renewal: what cleaning up a runner that ended or is deleted takes.
    all: &'a Observed<'a>,
    /// The knobs.
    settings: &'a Settings,
    /// The status decided on: the runner's, without a job record of
    /// another registration (rule 5).
    status: &'a EphemeralRunnerStatus,
    /// The registration the steps are about ([`registration_id`]).
    runner_id: i64,
    /// The status change decided so far.
    change: status::StatusDraft,
    /// The steps decided so far.
    plan: Plan,
}

impl Pass<'_> {
    fn step(&mut self, step: Step) {
        self.plan.steps.push(step);
    }

    fn event(&mut self, severity: Severity, reason: EventReason, note: impl Into<String>) {
        self.plan.steps.push(Step::Event {
            severity,
            reason,
            note: note.into(),
        });
    }

    fn requeue_after(&mut self, after: Duration) {
        self.plan.requeue = Some(self.plan.requeue.map_or(after, |r| r.min(after)));
    }

    /// Ends the runner in `phase` (Failed or Outdated) for `reason`, and
    /// tells it as a warning event saying the same: a runner that ends
    /// otherwise than Succeeded is for a person to look at.
    fn end_badly(
        &mut self,
        phase: EphemeralRunnerPhase,
        reason: PhaseReason,
        event: EventReason,
        message: impl Into<String>,
    ) {
        let message = message.into();
        self.change.phase_because(phase, reason, message.clone());
        self.event(Severity::Warning, event, message);
    }

    /// Sets a condition as of now.
    fn condition<R: ConditionReason>(&mut self, reason: R, message: &str) {
        self.change.condition(reason, message, self.obs.now);
    }

    /// The runner's pod and Secret, when they are about to go with it: the
    /// registration the Secret holds goes before them, so whatever rule
    /// deletes them is the one that made sure of that.
    fn delete_pod_and_secret(&mut self, pod: &PodView) {
        self.step(Step::DeletePod {
            uid: pod.uid.clone(),
        });
        if self.obs.secret.is_some() {
            self.step(Step::DeleteSecret);
        }
    }

    /// Ends the pass (rule 13).
    fn finish(mut self) -> Plan {
        // A runner's first registration is on record in its Secret, and is
        // copied into the status with the next status write, not a write of
        // its own (see `Step::Register`). Only the first: a later one is
        // written at once, since the status then names an older registration.
        if self.status.runner_id == 0
            && let Some(secret) = &self.obs.secret
            && self.change.changes()
        {
            self.change
                .record_registration(secret.runner_id, &secret.runner_name, self.obs.now);
        }
        // The status goes first: what the other steps do must be on record
        // before they are done, so a crash in between repeats them rather than
        // forgetting them.
        let resource_version = self.obs.runner.metadata.resource_version.as_deref();
        if let Some(change) = self.change.into_change(resource_version) {
            if !change.informs_only() {
                self.plan.steps.insert(0, Step::PatchStatus(change));
            } else if let Some(rest) = self.obs.pod.as_ref().and_then(|pod| {
                Some(SETTLED.saturating_sub(elapsed(pod.created, self.obs.now)))
                    .filter(|rest| !rest.is_zero())
            }) {
                // What it says of a pod this young may not hold when read.
                self.plan.requeue = Some(self.plan.requeue.map_or(rest, |r| r.min(rest)));
            } else {
                self.plan.steps.insert(0, Step::InformStatus(change));
            }
        }
        self.plan
    }
}

fn elapsed(since: Timestamp, now: Timestamp) -> Duration {
    Duration::try_from(now.duration_since(since)).unwrap_or(Duration::ZERO)
}

/// The variable that turns the runner container hooks on (ARC's kubernetes
/// container modes): the runner then creates a pod of its own for each job.
pub const CONTAINER_HOOKS_ENV: &str = "ACTIONS_RUNNER_CONTAINER_HOOKS";

/// Whether the runner's jobs run in pods the runner container hooks create
/// (and label [`crate::api::labels::arc::HOOK_RUNNER_POD`]), as ARC tells:
/// the runner container sets [`CONTAINER_HOOKS_ENV`].
pub fn uses_container_hooks(runner: &EphemeralRunner) -> bool {
    runner
        .spec
        .spec
        .containers
        .iter()
        .filter(|c| c.name == RUNNER_CONTAINER)
        .flat_map(|c| c.env.iter().flatten())
        .any(|e| e.name == CONTAINER_HOOKS_ENV)
}

/// Whether an init container of the pod failed, leaving out the native
/// sidecars of the runner's template (restarted by the kubelet, not a
/// failure of the pod's start).
fn init_failed(runner: &EphemeralRunner, pod: &PodView) -> bool {
    let sidecars: Vec<&str> = runner
        .spec
        .spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"))
        .map(|c| c.name.as_str())
        .collect();
    pod.failed_init_containers
        .iter()
        .any(|name| !sidecars.contains(&name.as_str()))
}

fn has_runner_container(runner: &EphemeralRunner) -> bool {
    runner
        .spec
        .spec
        .containers
        .iter()
        .any(|c| c.name == RUNNER_CONTAINER)
}

/// The registration the runner's steps are about: the Secret's, if it was
/// made for the runner's current renewal (one of the job before a renewal
/// holds a registration that is gone), else the status's.
///
/// The Secret is the truth because it is written first: a registration is
/// stored in its Secret before the status records it, so the Secret is never
/// the older of the two. Where they differ, the status's write failed, or
/// is not made yet: a first registration is copied in with the next status
/// write (see [`Step::Register`]); a later one (a runner recycled past
/// `maxIdleAge`) left the status naming the registration it replaced, which
/// is removed. Taking the status's then would remove that one again, find
/// it gone, and delete the Secret holding the live registration: a leak.
pub fn registration_id(status: &EphemeralRunnerStatus, secret: Option<&SecretView>) -> i64 {
    secret
        .filter(|s| s.renewal == status.renewals() && s.runner_id != 0)
        .map_or(status.runner_id, |s| s.runner_id)
}

/// The status without a job record that names another registration than
/// `runner_id`, if it holds one: a record of the runner's job before a
/// renewal that reached it after the renewal (the listener writes what the
/// service says when it gets to it, and the set may renew a runner before
/// then). Such a record is not this runner's job: taken for one, it would
/// make an idle runner look busy, and no scale-down would ever take it.
fn without_earlier_job(
    status: &EphemeralRunnerStatus,
    runner_id: i64,
) -> Option<EphemeralRunnerStatus> {
    if status.job_runner_id == 0 || status.job_runner_id == runner_id {
        return None;
    }
    let mut without = status.clone();
    without.clear_job_record();
    Some(without)
}

/// The status of a runner just registered as `runner_id`, named
/// `runner_name`, at `at`: nothing else in it.
pub fn registered_status(
    runner_id: i64,
    runner_name: &str,
    at: Timestamp,
) -> EphemeralRunnerStatus {
    let mut conditions = Vec::new();
    crate::controllers::kit::conditions::set(
        &mut conditions,
        setting(
            crate::api::ephemeral_runner::RegisteredReason::JitConfigCreated,
            &format!("registered as runner {runner_id}"),
        ),
        at,
    );
    EphemeralRunnerStatus {
        phase: Some(EphemeralRunnerPhase::Pending),
        runner_id,
        runner_name: Some(runner_name.to_owned()),
        conditions,
        ..EphemeralRunnerStatus::default()
    }
}

/// Decides one reconcile of an EphemeralRunner; see the module docs for
/// the rules.
pub fn plan(obs: &Observed<'_>, settings: &Settings) -> Result<Plan, Need> {
    let runner = obs.runner;
    let default_status = EphemeralRunnerStatus::default();
    let status = runner.status.as_ref().unwrap_or(&default_status);
    // A renewed runner's pod and Secret are its own only once made for its
    // current renewal; until then the ones there are the job before's, to
    // be deleted or written over, never used (see `RunnerRenewal`). The
    // rules below see only the current ones; cleaning up takes any.
    let renewals = status.renewals();
    let earlier_pod = obs.pod.as_ref().filter(|p| p.renewal != renewals);
    let current = Observed {
        pod: obs.pod.clone().filter(|p| p.renewal == renewals),
        secret: obs.secret.clone().filter(|s| s.renewal == renewals),
        ..obs.clone()
    };
    let mut change = status::StatusDraft::new(status);
    // A registration after the first whose Secret was written but not its
    // status (see `registration_id`): recorded with this pass's write, and
    // decided on as recorded already, in every rule, deletion included.
    let recorded;
    let status = match current.secret.as_ref() {
        Some(secret) if status.runner_id != 0 && status.runner_id != secret.runner_id => {
            change.record_registration(secret.runner_id, &secret.runner_name, obs.now);
            recorded = change.projected();
            &recorded
        }
        _ => status,
    };
    let cleared;
    let mut pass = Pass {
        obs: &current,
        all: obs,
        settings,
        status,
        runner_id: registration_id(status, current.secret.as_ref()),
        change,
        plan: Plan::default(),
    };
    let holds_finalizer = finalizer::held(runner, &finalizers::EPHEMERAL_RUNNER);

    // Rule 0.
    if let Some(secret) = obs.secret.as_ref().filter(|s| s.renewal == renewals + 1) {
        return Ok(renew::resume(pass, secret));
    }
    // Rule 1.
    if runner.metadata.deletion_timestamp.is_some() {
        if !holds_finalizer {
            return Ok(Plan::default());
        }
        delete::deleted(&mut pass)?;
        return Ok(pass.finish());
    }
    // Rule 2.
    if !holds_finalizer {
        pass.step(Step::AddFinalizer);
        return Ok(pass.plan);
    }
    // Rule 3.
    if let Some(refusal) = &obs.refused_pod {
        return Ok(register::refused(pass, refusal));
    }
    // Rule 4.
    if let Some(pod) = earlier_pod {
        // The pod of the job before the renewal, deleted when that job
        // ended: the next pod has its name, so it is waited out (its
        // deletion wakes this runner).
        delete::terminate(&mut pass, pod);
        return Ok(pass.finish());
    }
    // Rule 5. A record of the job before is no job of this runner's:
    // decided on as absent, and cleared with the next status write (which
    // the runner running, at the latest, makes). Until then the set, which
    // cannot tell it from a record of this runner's while the status names
    // no registration, takes the runner for busy: a set deletion or
    // revision cleanup waits for that write (scale-down takes no runner
    // that is not registered anyway).
    if let Some(without) = without_earlier_job(status, pass.runner_id) {
        pass.change.clear_job_record();
        cleared = without;
        pass.status = &cleared;
    }

    let phase = pass.status.phase.unwrap_or_default();
    // Rule 6.
    if phase == EphemeralRunnerPhase::Debugging {
        hold::debugging(&mut pass)?;
        return Ok(pass.finish());
    }
    // Rule 7.
    if phase.is_done() {
        delete::ended(&mut pass, phase)?;
        return Ok(pass.finish());
    }
    // Rule 8.
    if !has_runner_container(runner) {
        let message = format!("the pod template has no container named {RUNNER_CONTAINER:?}");
        pass.end_badly(
            EphemeralRunnerPhase::Failed,
            PhaseReason::InvalidTemplate,
            EventReason::InvalidTemplate,
            message,
        );
        return Ok(pass.finish());
    }

    match &current.pod {
        // Rule 9.
        Some(pod) if pod.deleting_since.is_some() => delete::terminate(&mut pass, pod),
        // Rule 10.
        Some(pod) => run::running(&mut pass, pod)?,
        // Rule 11.
        None => register::absent(&mut pass)?,
    }
    // Rule 12. A runner that ends in this reconcile goes on to its ending
    // at once, as the next reconcile would from the status written: one
    // status write (the phase and what became of the registration
    // together) and one reconcile less for every runner that finishes.
    let ended = pass.change.projected();
    if let Some(phase) = ended.phase.filter(|p| p.is_done())
        && let delete::Registration::Gone = delete::ensure_gone(&mut pass, &ended, true)?
    {
        if renew::in_place(&mut pass, &ended, phase)? {
            return Ok(pass.plan);
        }
        let current = pass.obs;
        delete::clean_up(&mut pass, current, delete::Keep::for_ended(phase));
    }
    Ok(pass.finish())
}
