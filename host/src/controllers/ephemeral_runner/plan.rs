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
//! makes sure the registration is gone: the runner removed it itself (the
//! policy's `self-deregistered`), or the pool reported it removed or not
//! found. Only then are the pod and the Secret deleted. The one exception is
//! a pod already terminating past the bound (its node is lost): it is
//! force-deleted, since nothing arcwright does can make that runner take a
//! job any more, and leaving it would hold the runner forever.
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

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde_json::json;

use crate::api::annotations::HOLD_UNTIL as HOLD_UNTIL_ANNOTATION;
use crate::api::{EphemeralRunner, EphemeralRunnerPhase, EphemeralRunnerStatus, JOB_FIELDS};
use crate::debug::Hold;
use crate::policy::types::{RunnerEnding, RunnerPhase, Verdict};
use crate::slack::HeldFailure;

/// The name of the container the runner runs in (ARC's).
pub const RUNNER_CONTAINER: &str = "runner";

/// Exit code of a runner whose version the service no longer accepts.
pub const OUTDATED_EXIT_CODE: i32 = 7;

/// The condition saying whether the registration of `status.runnerId` exists.
pub const REGISTERED: &str = "Registered";

/// The condition saying the service has seen the runner online, so the
/// registration timeout no longer applies.
pub const ONLINE: &str = "RunnerOnline";

/// The condition saying the deregistration policy failed and the bundled
/// default decided.
pub const POLICY_FALLBACK: &str = "DeregistrationPolicyFallback";

/// The condition saying whether the runner is held for debugging after its
/// job failed, and if not, why not (`MaxHeld`, `InvalidDebugSpec`).
pub const HELD: &str = "HeldForDebugging";

/// The condition saying whether Slack accepted the post about the hold
/// (True), or the last attempt failed (False, `PostFailed`). Until it is
/// True, every pass of a held runner asks for the post again (see
/// `super::notify`): the post is what gets someone to look before the hold
/// ends, so it must not be lost to a restart or to Slack being down.
pub const SLACK_NOTIFIED: &str = "SlackNotified";

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
    /// How long a runner pod may exist without the service seeing the runner
    /// online before the runner is removed and recreated.
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
    /// The pod phase is Failed (evicted, a failed init container...).
    pub failed: bool,
    /// An init container terminated non-zero.
    pub init_failed: bool,
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
    /// How many other runners of the same scale set are held for
    /// debugging, when the plan asked for it.
    pub held: Option<usize>,
    /// Now.
    pub now: Timestamp,
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
}

/// Whether an event is a warning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    /// Something a user may want to know.
    Normal,
    /// Something went wrong.
    Warning,
}

/// One thing to do.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Add the finalizer.
    AddFinalizer,
    /// Remove the finalizer: everything the runner owned is gone.
    RemoveFinalizer,
    /// Merge-patch the status with this JSON.
    PatchStatus(serde_json::Value),
    /// Register the runner (a JIT config), store it in its Secret and record
    /// the registration in the status.
    Register {
        /// The resourceVersion of the Secret of the job before a renewal,
        /// which the new one replaces (the same name); none: it is created.
        replacing: Option<String>,
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
    /// Delete the JIT config Secret.
    DeleteSecret,
    /// Hand the removal of this registration to the pool.
    Deregister {
        /// The registration.
        runner_id: i64,
    },
    /// Publish an event on the runner.
    Event {
        /// Normal or warning.
        severity: Severity,
        /// A PascalCase reason.
        reason: &'static str,
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

impl Plan {
    fn step(&mut self, step: Step) {
        self.steps.push(step);
    }

    fn event(&mut self, severity: Severity, reason: &'static str, note: impl Into<String>) {
        self.steps.push(Step::Event {
            severity,
            reason,
            note: note.into(),
        });
    }

    fn requeue_after(&mut self, after: Duration) {
        self.requeue = Some(self.requeue.map_or(after, |r| r.min(after)));
    }
}

/// A status being assembled: only the fields the plan changes are patched.
struct StatusPatch {
    current: serde_json::Value,
    fields: serde_json::Map<String, serde_json::Value>,
    /// Fields written only along with others: tidying that is no reason
    /// for a write of its own.
    along: serde_json::Map<String, serde_json::Value>,
    conditions: Vec<Condition>,
    conditions_changed: bool,
    /// The condition types set in this pass.
    decided: Vec<String>,
}

impl StatusPatch {
    fn new(status: &EphemeralRunnerStatus) -> Self {
        Self {
            current: serde_json::to_value(status).unwrap_or_default(),
            fields: serde_json::Map::new(),
            along: serde_json::Map::new(),
            conditions: status.conditions.clone(),
            conditions_changed: false,
            decided: Vec::new(),
        }
    }

    /// Sets a field, unless it already has that value (a patch that
    /// changes nothing would still wake every watcher of the runner).
    fn set(&mut self, key: &str, value: serde_json::Value) {
        let current = self.current.get(key).unwrap_or(&serde_json::Value::Null);
        if *current == value {
            self.fields.remove(key);
        } else {
            self.fields.insert(key.to_string(), value);
        }
    }

    /// Sets a field with the next write, if there is one.
    fn set_along(&mut self, key: &str, value: serde_json::Value) {
        if self.current.get(key).unwrap_or(&serde_json::Value::Null) != &value {
            self.along.insert(key.to_string(), value);
        }
    }

    fn condition(
        &mut self,
        type_: &str,
        status: bool,
        reason: &str,
        message: &str,
        now: Timestamp,
    ) {
        self.decided.push(type_.to_string());
        if set_condition(&mut self.conditions, type_, status, reason, message, now) {
            self.conditions_changed = true;
        }
    }

    /// Records the Secret's registration as the runner's: its id and name,
    /// and `Registered` True, unless this pass already decided what became
    /// of it (a runner that ended before its first status write).
    fn record_registration(&mut self, secret: &SecretView, now: Timestamp) {
        self.set("runnerId", json!(secret.runner_id));
        self.set("runnerName", json!(secret.runner_name));
        if !self.decided.iter().any(|t| t == REGISTERED) {
            self.condition(
                REGISTERED,
                true,
                "JitConfigCreated",
                &format!("registered as runner {}", secret.runner_id),
                now,
            );
        }
    }

    /// Whether anything is to be written.
    fn changes(&self) -> bool {
        self.conditions_changed || !self.fields.is_empty()
    }

    /// The status as it will be once the patch is written.
    fn projected(&self) -> Option<EphemeralRunnerStatus> {
        let mut status = self.current.clone();
        let fields = status.as_object_mut()?;
        for (key, value) in &self.fields {
            fields.insert(key.clone(), value.clone());
        }
        if self.conditions_changed {
            fields.insert("conditions".into(), json!(self.conditions));
        }
        serde_json::from_value(status).ok()
    }

    /// The write, if any; `resource_version` is the runner's as read.
    ///
    /// A patch that clears fields along (a job record of the registration
    /// before) is made conditional on the runner being as read: the
    /// listener may have recorded this registration's job since, and a
    /// blind clear would erase it (a busy runner would look idle). A
    /// conflict only means the next pass decides on what is there now.
    fn into_step(mut self, resource_version: Option<&str>) -> Option<Step> {
        if self.conditions_changed {
            self.fields
                .insert("conditions".into(), json!(self.conditions));
        }
        if self.fields.is_empty() {
            return None;
        }
        if self.along.is_empty() {
            return Some(Step::PatchStatus(json!({ "status": self.fields })));
        }
        for (key, value) in self.along {
            self.fields.entry(key).or_insert(value);
        }
        Some(Step::PatchStatus(json!({
            "metadata": {"resourceVersion": resource_version},
            "status": self.fields,
        })))
    }
}

/// Whether the registration is gone, and if not, what is being done.
enum Registration {
    Gone,
    Pending,
}

/// Sets condition `type_` in `conditions` (its transition time moves only
/// when its status does); returns whether anything changed.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> bool {
    let status = if status { "True" } else { "False" };
    if let Some(existing) = conditions.iter_mut().find(|c| c.type_ == type_) {
        if existing.status == status && existing.reason == reason && existing.message == message {
            return false;
        }
        if existing.status != status {
            existing.last_transition_time = Time(now);
        }
        existing.status = status.to_string();
        existing.reason = reason.to_string();
        existing.message = message.to_string();
    } else {
        conditions.push(Condition {
            type_: type_.to_string(),
            status: status.to_string(),
            reason: reason.to_string(),
            message: message.to_string(),
            last_transition_time: Time(now),
            observed_generation: None,
        });
    }
    true
}

fn is_true(status: &EphemeralRunnerStatus, type_: &str) -> Option<bool> {
    status.condition(type_).map(|c| c.status == "True")
}

/// The verdict a removal in progress was requested with, from the reason
/// the `Registered` condition recorded when it was handed to the pool.
fn requested_verdict(status: &EphemeralRunnerStatus) -> &'static str {
    match status.condition(REGISTERED).map(|c| c.reason.as_str()) {
        Some("RemoveAfterJob") => "remove-after-job",
        _ => "remove-now",
    }
}

fn verdict_label(verdict: Verdict) -> &'static str {
    match verdict {
        Verdict::SelfDeregistered => "self-deregistered",
        Verdict::RemoveNow => "remove-now",
        Verdict::RemoveAfterJob => "remove-after-job",
    }
}

/// How the runner ended, for the deregistration policy.
fn ending(
    runner: &EphemeralRunner,
    status: &EphemeralRunnerStatus,
    runner_id: i64,
) -> RunnerEnding {
    let phase = match status.phase.unwrap_or_default() {
        EphemeralRunnerPhase::Pending => RunnerPhase::Pending,
        EphemeralRunnerPhase::Running => RunnerPhase::Running,
        EphemeralRunnerPhase::Succeeded => RunnerPhase::Succeeded,
        // The policy world has no Debugging: a held runner's job failed.
        EphemeralRunnerPhase::Failed | EphemeralRunnerPhase::Debugging => RunnerPhase::Failed,
        EphemeralRunnerPhase::Outdated => RunnerPhase::Outdated,
    };
    RunnerEnding {
        name: runner.metadata.name.clone().unwrap_or_default(),
        namespace: runner.metadata.namespace.clone().unwrap_or_default(),
        phase,
        exit_code: status.exit_code,
        reason: status.termination_reason.clone().unwrap_or_default(),
        had_job: status.has_job(),
        registered: runner_id != 0,
    }
}

/// Makes sure the registration of `runner_id` is gone: proven gone already,
/// self-deregistered (per the policy, when `ask_policy`), or handed to the
/// pool and waited for. Adds the steps and status fields that takes.
fn ensure_gone(
    obs: &Observed<'_>,
    settings: &Settings,
    status: &EphemeralRunnerStatus,
    runner_id: i64,
    ask_policy: bool,
    patch: &mut StatusPatch,
    plan: &mut Plan,
) -> Result<Registration, Need> {
    if is_true(status, REGISTERED) == Some(false) {
        return Ok(Registration::Gone);
    }
    if runner_id == 0 {
        patch.condition(
            REGISTERED,
            false,
            "NeverRegistered",
            "the runner was never registered",
            obs.now,
        );
        return Ok(Registration::Gone);
    }
    let verdict = || -> Result<(&'static str, Option<&VerdictView>), Need> {
        if !ask_policy {
            return Ok(("remove-now", None));
        }
        match &obs.verdict {
            Some(v) => Ok((verdict_label(v.verdict), Some(v))),
            None => Err(Need::Verdict(ending(obs.runner, status, runner_id))),
        }
    };
    match &obs.pool {
        PoolView::Claimed => {
            plan.requeue_after(settings.removal_recheck);
            Ok(Registration::Pending)
        }
        PoolView::Removed | PoolView::NotFound => {
            let (reason, outcome, message) = if obs.pool == PoolView::Removed {
                (
                    "Removed",
                    "removed",
                    format!("registration {runner_id} was removed from the service"),
                )
            } else {
                (
                    "NotFound",
                    "not-found",
                    format!("registration {runner_id} was already gone from the service"),
                )
            };
            patch.condition(REGISTERED, false, reason, &message, obs.now);
            plan.event(Severity::Normal, "RegistrationRemoved", message);
            plan.step(Step::CountDeregistration {
                verdict: requested_verdict(status),
                outcome,
            });
            Ok(Registration::Gone)
        }
        PoolView::Failed(message) => {
            plan.event(
                Severity::Warning,
                "DeregistrationFailed",
                format!(
                    "removing registration {runner_id} failed, retrying in {:?}: {message}",
                    settings.removal_retry
                ),
            );
            plan.step(Step::CountDeregistration {
                verdict: requested_verdict(status),
                outcome: "failed",
            });
            plan.requeue_after(settings.removal_retry);
            Ok(Registration::Pending)
        }
        PoolView::Idle => {
            let (label, view) = verdict()?;
            if let Some(view) = view {
                match &view.fallback_reason {
                    Some(reason) => {
                        let message = format!(
                            "the deregistration policy failed and the bundled default decided: {reason}"
                        );
                        if is_true(status, POLICY_FALLBACK) != Some(true) {
                            plan.event(Severity::Warning, "PolicyFallback", message.clone());
                        }
                        patch.condition(POLICY_FALLBACK, true, "Fallback", &message, obs.now);
                    }
                    None if is_true(status, POLICY_FALLBACK) == Some(true) => {
                        patch.condition(
                            POLICY_FALLBACK,
                            false,
                            "PolicyAnswered",
                            "the configured policy decided",
                            obs.now,
                        );
                    }
                    None => {}
                }
                if view.verdict == Verdict::SelfDeregistered {
                    let message =
                        format!("registration {runner_id} was removed by the runner itself");
                    patch.condition(REGISTERED, false, "SelfDeregistered", &message, obs.now);
                    plan.step(Step::CountDeregistration {
                        verdict: label,
                        outcome: "skipped",
                    });
                    return Ok(Registration::Gone);
                }
            }
            let reason = if label == "remove-after-job" {
                "RemoveAfterJob"
            } else {
                "RemoveNow"
            };
            patch.condition(
                REGISTERED,
                true,
                reason,
                &format!("removal of registration {runner_id} requested ({label})"),
                obs.now,
            );
            plan.step(Step::Deregister { runner_id });
            plan.event(
                Severity::Normal,
                "Deregistering",
                format!("removing registration {runner_id} from the service ({label}) before the pod is deleted"),
            );
            plan.requeue_after(settings.removal_recheck);
            Ok(Registration::Pending)
        }
    }
}

/// What a clean-up leaves.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Keep {
    Nothing,
    /// The Secret of a runner that succeeded: if its set renews it, the
    /// next registration is written over it (one write, where deleting it
    /// now would make two); if not, it goes with the runner. It holds a
    /// config whose registration is gone, which nothing can use.
    Secret,
}

impl Keep {
    fn for_ended(phase: EphemeralRunnerPhase) -> Self {
        if phase == EphemeralRunnerPhase::Succeeded {
            Self::Secret
        } else {
            Self::Nothing
        }
    }
}

/// Deletes the pod (or force-deletes one stuck terminating) and the Secret
/// unless it is kept. Returns whether both are gone already.
fn clean_up(obs: &Observed<'_>, settings: &Settings, keep: Keep, plan: &mut Plan) -> bool {
    let mut gone = true;
    if let Some(pod) = &obs.pod {
        gone = false;
        terminate(obs, pod, settings, plan);
    }
    if obs.secret.is_some() && keep != Keep::Secret {
        gone = false;
        plan.step(Step::DeleteSecret);
    }
    gone
}

/// Deletes the pod, or, when it is already terminating, waits for it up to
/// the bound and then force-deletes it.
fn terminate(obs: &Observed<'_>, pod: &PodView, settings: &Settings, plan: &mut Plan) {
    match pod.deleting_since {
        None => {
            plan.step(Step::DeletePod {
                uid: pod.uid.clone(),
            });
        }
        Some(since) => {
            let waited = elapsed(since, obs.now);
            if waited >= settings.terminating_timeout {
                plan.step(Step::ForceDeletePod {
                    uid: pod.uid.clone(),
                });
                plan.event(
                    Severity::Warning,
                    "PodForceDeleted",
                    format!(
                        "pod was still terminating {}s after its deletion (its node is probably lost); deleted it with grace 0",
                        waited.as_secs()
                    ),
                );
                plan.requeue_after(Duration::from_secs(1));
            } else {
                plan.requeue_after(settings.terminating_timeout - waited);
            }
        }
    }
}

fn elapsed(since: Timestamp, now: Timestamp) -> Duration {
    Duration::try_from(now.duration_since(since)).unwrap_or(Duration::ZERO)
}

fn has_runner_container(runner: &EphemeralRunner) -> bool {
    runner
        .spec
        .spec
        .containers
        .iter()
        .any(|c| c.name == RUNNER_CONTAINER)
}

/// The registration the runner's steps are about: the status's, or while
/// the status names none (a first registration not copied in yet, see
/// [`Step::Register`]), the Secret's, if it was made for the runner's
/// current renewal (one of the job before a renewal holds a registration
/// that is gone).
pub fn registration_id(status: &EphemeralRunnerStatus, secret: Option<&SecretView>) -> i64 {
    if status.runner_id != 0 {
        status.runner_id
    } else {
        secret
            .filter(|s| s.renewal == status.renewals())
            .map_or(0, |s| s.runner_id)
    }
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
    let mut value = serde_json::to_value(status).ok()?;
    let fields = value.as_object_mut()?;
    for key in JOB_FIELDS {
        fields.remove(key);
    }
    serde_json::from_value(value).ok()
}

/// Decides one reconcile of an EphemeralRunner; see the module docs.
pub fn plan(obs: &Observed<'_>, settings: &Settings, finalizer: &str) -> Result<Plan, Need> {
    let runner = obs.runner;
    let default_status = EphemeralRunnerStatus::default();
    let status = runner.status.as_ref().unwrap_or(&default_status);
    let mut plan = Plan::default();
    let mut patch = StatusPatch::new(status);
    // A renewed runner's pod and Secret are its own only once made for its
    // current renewal; until then the ones there are the job before's, to
    // be deleted or written over, never used (see `RunnerRenewal`). The
    // rules below see only the current ones; cleaning up takes any.
    let all = obs;
    let renewals = status.renewals();
    let earlier_pod = obs.pod.as_ref().filter(|p| p.renewal != renewals);
    let earlier_secret = obs.secret.as_ref().filter(|s| s.renewal != renewals);
    let current = Observed {
        pod: obs.pod.clone().filter(|p| p.renewal == renewals),
        secret: obs.secret.clone().filter(|s| s.renewal == renewals),
        ..obs.clone()
    };
    let obs = &current;
    let runner_id = registration_id(status, obs.secret.as_ref());
    let has_finalizer = runner
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|f| f == finalizer));

    if runner.metadata.deletion_timestamp.is_some() {
        if !has_finalizer {
            return Ok(plan);
        }
        if let Registration::Gone = ensure_gone(
            obs, settings, status, runner_id, true, &mut patch, &mut plan,
        )? && clean_up(all, settings, Keep::Nothing, &mut plan)
        {
            plan.step(Step::RemoveFinalizer);
        }
        return Ok(finish(obs, status, plan, patch));
    }
    if !has_finalizer {
        plan.step(Step::AddFinalizer);
        return Ok(plan);
    }

    if let Some(pod) = earlier_pod {
        // The pod of the job before the renewal, deleted when that job
        // ended: the next pod has its name, so it is waited out (its
        // deletion wakes this runner).
        terminate(obs, pod, settings, &mut plan);
        return Ok(finish(obs, status, plan, patch));
    }
    // A record of the job before is no job of this runner's: decided on
    // as absent, and cleared with the next status write (which the runner
    // running, at the latest, makes). Until then the set, which cannot tell
    // it from a record of this runner's while the status names no
    // registration, takes the runner for busy: a set deletion or revision
    // cleanup waits for that write (scale-down takes no runner that is not
    // registered anyway).
    let cleared;
    let status = match without_earlier_job(status, runner_id) {
        Some(without) => {
            for key in JOB_FIELDS {
                patch.set_along(key, serde_json::Value::Null);
            }
            cleared = without;
            &cleared
        }
        None => status,
    };

    let phase = status.phase.unwrap_or_default();
    if phase == EphemeralRunnerPhase::Debugging {
        debugging(obs, settings, status, runner_id, &mut patch, &mut plan)?;
        return Ok(finish(obs, status, plan, patch));
    }
    if phase.is_done() {
        if let Registration::Gone = ensure_gone(
            obs, settings, status, runner_id, true, &mut patch, &mut plan,
        )? {
            clean_up(all, settings, Keep::for_ended(phase), &mut plan);
        }
        return Ok(finish(obs, status, plan, patch));
    }

    if !has_runner_container(runner) {
        patch.set("phase", json!(EphemeralRunnerPhase::Failed));
        patch.set("reason", json!("InvalidTemplate"));
        let message = format!("the pod template has no container named {RUNNER_CONTAINER:?}");
        patch.set("message", json!(message));
        plan.event(Severity::Warning, "InvalidTemplate", message);
        return Ok(finish(obs, status, plan, patch));
    }

    match &obs.pod {
        Some(pod) if pod.deleting_since.is_some() => {
            terminate(obs, pod, settings, &mut plan);
        }
        Some(pod) => running(obs, settings, status, runner_id, pod, &mut patch, &mut plan)?,
        None => absent(
            obs,
            settings,
            status,
            runner_id,
            earlier_secret,
            &mut patch,
            &mut plan,
        )?,
    }
    // A runner that ends in this reconcile goes on to its ending at once,
    // as the next reconcile would from the status written: one status
    // write (the phase and what became of the registration together) and
    // one reconcile less for every runner that finishes.
    if let Some(ended) = patch
        .projected()
        .filter(|s| s.phase.is_some_and(EphemeralRunnerPhase::is_done))
        && let Registration::Gone = ensure_gone(
            obs, settings, &ended, runner_id, true, &mut patch, &mut plan,
        )?
    {
        let keep = Keep::for_ended(ended.phase.unwrap_or_default());
        clean_up(obs, settings, keep, &mut plan);
    }
    Ok(finish(obs, status, plan, patch))
}

fn finish(
    obs: &Observed<'_>,
    status: &EphemeralRunnerStatus,
    mut plan: Plan,
    mut patch: StatusPatch,
) -> Plan {
    // A runner's first registration is on record in its Secret, and is
    // copied into the status with the next status write, not a write of
    // its own (see `Step::Register`). Only the first: a later one is
    // written at once, since the status then names an older registration.
    if status.runner_id == 0
        && let Some(secret) = &obs.secret
        && patch.changes()
    {
        patch.record_registration(secret, obs.now);
    }
    // The status goes first: what the other steps do must be on record
    // before they are done, so a crash in between repeats them rather than
    // forgetting them.
    if let Some(step) = patch.into_step(obs.runner.metadata.resource_version.as_deref()) {
        plan.steps.insert(0, step);
    }
    plan
}

/// The pod exists and is not terminating.
fn running(
    obs: &Observed<'_>,
    settings: &Settings,
    status: &EphemeralRunnerStatus,
    runner_id: i64,
    pod: &PodView,
    patch: &mut StatusPatch,
    plan: &mut Plan,
) -> Result<(), Need> {
    let terminated = match &pod.runner {
        RunnerContainer::Terminated { exit_code, reason } => Some((*exit_code, reason.clone())),
        _ => None,
    };
    if let Some(max_idle_age) = max_idle_age(obs.runner)
        && renewing(status)
        && !status.has_job()
        && matches!(terminated, Some((0, _)))
    {
        // A runner exits 0 once its registration is gone: when the
        // renewal removed it, that exit is the renewal's own doing, not the
        // runner finishing, so the renewal goes on (pod and Secret deleted,
        // a new registration) instead of the runner ending Succeeded and
        // its set replacing it under a new name.
        return renew(
            obs,
            settings,
            status,
            runner_id,
            pod,
            max_idle_age,
            patch,
            plan,
        );
    }
    if let Some(why) = job_failure(status, terminated.as_ref(), pod) {
        if hold(
            obs,
            settings,
            status,
            runner_id,
            terminated.as_ref(),
            &why,
            patch,
            plan,
        )? {
            return Ok(());
        }
    } else if let Some(wait) = result_pending(obs, settings, status, terminated.as_ref(), pod) {
        plan.requeue_after(wait);
        return Ok(());
    }
    if let Some((code, reason)) = &terminated {
        patch.set("exitCode", json!(code));
        patch.set("terminationReason", json!(reason));
        patch.set("ready", json!(false));
        if *code == 0 {
            patch.set("phase", json!(EphemeralRunnerPhase::Succeeded));
            patch.set("reason", json!("Completed"));
            patch.set("message", json!("the runner exited 0"));
            // No event: a runner succeeding is the everyday case, and an
            // event per runner would be a write per job that tells nothing
            // the phase does not.
            return Ok(());
        }
        if *code == OUTDATED_EXIT_CODE {
            let message = "the runner exited 7: its version is outdated and the service refuses it";
            patch.set("phase", json!(EphemeralRunnerPhase::Outdated));
            patch.set("reason", json!("Outdated"));
            patch.set("message", json!(message));
            plan.event(Severity::Warning, "RunnerOutdated", message);
            return Ok(());
        }
    }
    if terminated.is_some() || pod.failed || pod.init_failed {
        let why = match (&terminated, &pod.failure_message) {
            (Some((code, reason)), _) => format!("the runner exited {code} ({reason})"),
            (None, Some(message)) => format!("the pod failed: {message}"),
            (None, None) if pod.init_failed => "an init container failed".to_string(),
            (None, None) => "the pod failed".to_string(),
        };
        if status.has_job() {
            // The job is lost with the runner; a new pod cannot take it back.
            patch.set("phase", json!(EphemeralRunnerPhase::Failed));
            patch.set("reason", json!("JobFailed"));
            patch.set("message", json!(format!("{why} while running a job")));
            plan.event(
                Severity::Warning,
                "RunnerFailed",
                format!("{why} while running a job"),
            );
            return Ok(());
        }
        return failed_start(
            obs,
            settings,
            status,
            runner_id,
            pod,
            "RunnerPodFailed",
            &why,
            patch,
            plan,
        );
    }

    let phase = if pod.runner == RunnerContainer::Running {
        EphemeralRunnerPhase::Running
    } else {
        EphemeralRunnerPhase::Pending
    };
    // No phase reads as Pending: a pod still starting costs no write.
    if status.phase.unwrap_or_default() != phase {
        patch.set("phase", json!(phase));
        patch.set("reason", serde_json::Value::Null);
        patch.set("message", serde_json::Value::Null);
    }
    if status.ready != pod.ready {
        patch.set("ready", json!(pod.ready));
    }

    if let Some(max_idle_age) = max_idle_age(obs.runner)
        && pod.runner == RunnerContainer::Running
        && runner_id != 0
        && !status.has_job()
    {
        let age = elapsed(pod.created, obs.now);
        if age >= max_idle_age {
            return renew(
                obs,
                settings,
                status,
                runner_id,
                pod,
                max_idle_age,
                patch,
                plan,
            );
        }
        plan.requeue_after(max_idle_age - age);
    }

    if is_true(status, ONLINE) == Some(true) || status.has_job() {
        return Ok(());
    }
    let age = elapsed(pod.created, obs.now);
    if age < settings.registration_timeout {
        plan.requeue_after(settings.registration_timeout - age);
        return Ok(());
    }
    match obs.presence {
        None => Err(Need::Presence(runner_id)),
        Some(Presence::Online) => {
            patch.condition(
                ONLINE,
                true,
                "Online",
                "the service sees the runner online",
                obs.now,
            );
            Ok(())
        }
        Some(presence) => {
            let why = format!(
                "the runner did not come online within {}s of its pod's creation ({})",
                settings.registration_timeout.as_secs(),
                if presence == Presence::Absent {
                    "the service does not know it"
                } else {
                    "offline"
                }
            );
            failed_start(
                obs,
                settings,
                status,
                runner_id,
                pod,
                "RegistrationTimeout",
                &why,
                patch,
                plan,
            )
        }
    }
}

/// Why the runner's job failed, if it did: the result the listener recorded
/// on JobCompleted, or the runner ending badly while it had a job.
fn job_failure(
    status: &EphemeralRunnerStatus,
    terminated: Option<&(i32, String)>,
    pod: &PodView,
) -> Option<String> {
    if status
        .job_result
        .as_deref()
        .is_some_and(|r| r.eq_ignore_ascii_case("failed"))
    {
        return Some("the job failed".to_string());
    }
    if !status.has_job() {
        return None;
    }
    match terminated {
        Some((0 | OUTDATED_EXIT_CODE, _)) => None,
        Some((code, reason)) => Some(format!(
            "the runner exited {code} ({reason}) while running a job"
        )),
        None if pod.failed || pod.init_failed => {
            Some("the runner pod failed while running a job".to_string())
        }
        None => None,
    }
}

/// How long to wait before calling a runner that exited 0 after a job
/// Succeeded, when its job's result may still be on its way and a failed
/// one would be held (see [`Settings::result_wait`]).
fn result_pending(
    obs: &Observed<'_>,
    settings: &Settings,
    status: &EphemeralRunnerStatus,
    terminated: Option<&(i32, String)>,
    pod: &PodView,
) -> Option<Duration> {
    let exited_clean = matches!(terminated, Some((0, _)));
    if !exited_clean || !status.has_job() || status.job_result.is_some() {
        return None;
    }
    if !matches!(Hold::from_spec(obs.runner.spec.debug.as_ref()), Ok(Some(_))) {
        return None;
    }
    let waited = elapsed(pod.finished?, obs.now);
    (waited < settings.result_wait).then(|| settings.result_wait - waited)
}

fn hold_annotation(runner: &EphemeralRunner) -> Option<&str> {
    runner
        .metadata
        .annotations
        .as_ref()?
        .get(HOLD_UNTIL_ANNOTATION)
        .map(String::as_str)
}

/// Holds the runner for debugging if its debug spec says so and the scale
/// set's `maxHeld` allows: phase Debugging, the registration handed to the
/// pool (so it takes no other job), the pod left alone. Returns whether it
/// did; when it did not, the runner ends as it would have without a hold.
#[allow(clippy::too_many_arguments)]
fn hold(
    obs: &Observed<'_>,
    settings: &Settings,
    status: &EphemeralRunnerStatus,
    runner_id: i64,
    terminated: Option<&(i32, String)>,
    why: &str,
    patch: &mut StatusPatch,
    plan: &mut Plan,
) -> Result<bool, Need> {
    let already = |reason: &str| status.condition(HELD).is_some_and(|c| c.reason == reason);
    let hold = match Hold::from_spec(obs.runner.spec.debug.as_ref()) {
        Ok(Some(hold)) => hold,
        Ok(None) => return Ok(false),
        Err(error) => {
            let message = format!("{why}; not held for debugging: {error}");
            if !already("InvalidDebugSpec") {
                plan.event(Severity::Warning, "InvalidDebugSpec", message.clone());
            }
            patch.condition(HELD, false, "InvalidDebugSpec", &message, obs.now);
            return Ok(false);
        }
    };
    let Some(held) = obs.held else {
        return Err(Need::HeldCount);
    };
    if held >= usize::try_from(hold.max_held).unwrap_or(usize::MAX) {
        let message = format!(
            "{why}; not held for debugging: {held} runner(s) of the scale set are held already (maxHeld {})",
            hold.max_held
        );
        if !already("MaxHeld") {
            plan.event(Severity::Normal, "NotHeld", message.clone());
        }
        patch.condition(HELD, false, "MaxHeld", &message, obs.now);
        return Ok(false);
    }
    let since = status.job_finished_at.as_ref().map_or(obs.now, |t| t.0);
    let deadline = hold.deadline(since, hold_annotation(obs.runner));
    if deadline.at <= obs.now {
        // The failure was learnt after its hold would have ended (the
        // controller was down): holding now would only tell Slack of a
        // runner about to go.
        return Ok(false);
    }
    let message = format!(
        "{why}{HELD_UNTIL}{}{}",
        deadline.at,
        deadline.note.map(|n| format!(" ({n})")).unwrap_or_default()
    );
    patch.set("phase", json!(EphemeralRunnerPhase::Debugging));
    patch.set("reason", json!("HeldForDebugging"));
    patch.set("message", json!(message));
    patch.set("ready", json!(false));
    patch.set("heldSince", json!(Time(since)));
    patch.set("holdUntil", json!(Time(deadline.at)));
    if let Some((code, reason)) = terminated {
        patch.set("exitCode", json!(code));
        patch.set("terminationReason", json!(reason));
    }
    patch.condition(HELD, true, "HeldForDebugging", &message, obs.now);
    plan.event(Severity::Warning, "HeldForDebugging", message);
    if tells_slack(obs.runner) {
        plan.step(Step::NotifySlack(held_failure(
            obs.runner,
            status,
            why,
            deadline.at,
        )));
    }
    ensure_gone(obs, settings, status, runner_id, false, patch, plan)?;
    plan.requeue_after(elapsed(obs.now, deadline.at));
    Ok(true)
}

/// What joins the reason of a hold to its end in the `HeldForDebugging`
/// condition's message; [`why_held`] splits it there again.
const HELD_UNTIL: &str = "; held for debugging until ";

/// Why the runner is held, from the `HeldForDebugging` condition [`hold`]
/// wrote.
fn why_held(status: &EphemeralRunnerStatus) -> String {
    status
        .condition(HELD)
        .map(|c| c.message.split(HELD_UNTIL).next().unwrap_or_default())
        .filter(|why| !why.is_empty())
        .unwrap_or("the job failed")
        .to_string()
}

/// Whether the runner's debug spec names a Slack channel.
fn tells_slack(runner: &EphemeralRunner) -> bool {
    runner
        .spec
        .debug
        .as_ref()
        .is_some_and(|d| d.slack.is_some())
}

/// The Slack post about a held runner: the job as the listener recorded it.
fn held_failure(
    runner: &EphemeralRunner,
    status: &EphemeralRunnerStatus,
    why: &str,
    hold_until: Timestamp,
) -> HeldFailure {
    HeldFailure {
        namespace: runner.metadata.namespace.clone().unwrap_or_default(),
        runner: runner.metadata.name.clone().unwrap_or_default(),
        repository: status.job_repository_name.clone(),
        workflow: status.job_workflow_ref.clone(),
        job: status.job_display_name.clone(),
        why: why.to_string(),
        hold_until,
    }
}

/// A held runner: its registration goes (if it has not yet), its pod stays
/// until the hold ends, then phase Failed (`HoldEnded`) and the pod and
/// Secret go, registration first as always. A pod that vanished or is
/// being deleted ends the hold at once: there is nothing left to look at.
fn debugging(
    obs: &Observed<'_>,
    settings: &Settings,
    status: &EphemeralRunnerStatus,
    runner_id: i64,
    patch: &mut StatusPatch,
    plan: &mut Plan,
) -> Result<(), Need> {
    let since = status
        .held_since
        .as_ref()
        .or(status.job_finished_at.as_ref())
        .map_or(obs.now, |t| t.0);
    let deadline = match Hold::from_spec(obs.runner.spec.debug.as_ref()) {
        Ok(Some(hold)) => Some(hold.deadline(since, hold_annotation(obs.runner))),
        Ok(None) | Err(_) => None,
    };
    let pod_kept = obs.pod.as_ref().is_some_and(|p| p.deleting_since.is_none());
    let registration = ensure_gone(obs, settings, status, runner_id, false, patch, plan)?;
    match deadline {
        Some(deadline) if pod_kept && obs.now < deadline.at => {
            patch.set("holdUntil", json!(Time(deadline.at)));
            if let Some(note) = deadline.note {
                patch.set("message", json!(note));
            }
            // Slack has not accepted a post about this hold yet: the host
            // stopped before it was made, or Slack refused it.
            if tells_slack(obs.runner) && is_true(status, SLACK_NOTIFIED) != Some(true) {
                plan.step(Step::NotifySlack(held_failure(
                    obs.runner,
                    status,
                    &why_held(status),
                    deadline.at,
                )));
            }
            plan.requeue_after(elapsed(obs.now, deadline.at));
        }
        _ => {
            let why = match deadline {
                _ if !pod_kept => "the runner pod is gone".to_string(),
                None => "the runner's debug spec no longer holds it".to_string(),
                Some(deadline) => format!("the debug hold ended at {}", deadline.at),
            };
            patch.set("phase", json!(EphemeralRunnerPhase::Failed));
            patch.set("reason", json!("HoldEnded"));
            patch.set("message", json!(why));
            patch.condition(HELD, false, "HoldEnded", &why, obs.now);
            plan.event(Severity::Normal, "HoldEnded", why);
            if let Registration::Gone = registration {
                clean_up(obs, settings, Keep::Nothing, plan);
            }
        }
    }
    Ok(())
}

/// Whether this runner's registration removal was asked for while it
/// lives (not deleted, not done): only a `maxIdleAge` renewal does that.
/// Covers the removal under way (`RemoveNow`) and done (`Removed`,
/// `NotFound`), since the runner may exit in either window.
fn renewing(status: &EphemeralRunnerStatus) -> bool {
    status
        .condition(REGISTERED)
        .is_some_and(|c| matches!(c.reason.as_str(), "RemoveNow" | "Removed" | "NotFound"))
}

/// The runner's `maxIdleAge`, if it has a usable one. The apiserver refuses
/// what is not a duration; `0s`, which it lets through, means none.
fn max_idle_age(runner: &EphemeralRunner) -> Option<Duration> {
    let text = runner.spec.max_idle_age.as_deref()?;
    crate::debug::hold::parse_duration("maxIdleAge", text).ok()
}

/// An idle runner past `maxIdleAge` gets a new registration and pod, so a
/// warm pool does not keep runners for days: its registration is removed
/// first (if a job reached it meanwhile, the service says so and the pool
/// waits the job out, as for any removal), then its pod and Secret go,
/// and the runner registers again from scratch. This is not a failed
/// start: nothing is counted towards the failure limit.
#[allow(clippy::too_many_arguments)]
fn renew(
    obs: &Observed<'_>,
    settings: &Settings,
    status: &EphemeralRunnerStatus,
    runner_id: i64,
    pod: &PodView,
    max_idle_age: Duration,
    patch: &mut StatusPatch,
    plan: &mut Plan,
) -> Result<(), Need> {
    let before = plan.steps.len();
    let registration = ensure_gone(obs, settings, status, runner_id, false, patch, plan)?;
    if plan.steps[before..]
        .iter()
        .any(|s| matches!(s, Step::Deregister { .. }))
    {
        plan.event(
            Severity::Normal,
            "MaxIdleAge",
            format!(
                "idle for {}s, past maxIdleAge ({}s): replacing its registration and pod",
                elapsed(pod.created, obs.now).as_secs(),
                max_idle_age.as_secs()
            ),
        );
    }
    if let Registration::Gone = registration {
        plan.step(Step::DeletePod {
            uid: pod.uid.clone(),
        });
        if obs.secret.is_some() {
            plan.step(Step::DeleteSecret);
        }
    }
    Ok(())
}

/// A start that failed before the runner could run a job: counted, and the
/// runner is recreated (registration removed first, then pod and Secret)
/// after a backoff, or marked Failed once the limit is reached.
#[allow(clippy::too_many_arguments)]
fn failed_start(
    obs: &Observed<'_>,
    settings: &Settings,
    status: &EphemeralRunnerStatus,
    runner_id: i64,
    pod: &PodView,
    reason: &'static str,
    why: &str,
    patch: &mut StatusPatch,
    plan: &mut Plan,
) -> Result<(), Need> {
    let mut failures: BTreeMap<String, Time> = status.failures.clone();
    if !failures.contains_key(&pod.uid) {
        failures.insert(pod.uid.clone(), Time(obs.now));
        patch.set("failures", json!(failures));
        if failures.len() >= settings.failure_limit {
            let message = format!(
                "{why}; {} failed starts, the limit, so the runner is not recreated",
                failures.len()
            );
            patch.set("phase", json!(EphemeralRunnerPhase::Failed));
            patch.set("reason", json!("TooManyFailures"));
            patch.set("message", json!(message));
            plan.event(Severity::Warning, "RunnerFailed", message);
            return Ok(());
        }
        plan.event(
            Severity::Warning,
            reason,
            format!(
                "{why}; failed start {} of {}, recreating the runner in {:?}",
                failures.len(),
                settings.failure_limit,
                settings.backoff(failures.len())
            ),
        );
        patch.set("phase", json!(EphemeralRunnerPhase::Pending));
        patch.set("ready", json!(false));
    }
    if let Registration::Gone = ensure_gone(obs, settings, status, runner_id, false, patch, plan)? {
        plan.step(Step::DeletePod {
            uid: pod.uid.clone(),
        });
        if obs.secret.is_some() {
            plan.step(Step::DeleteSecret);
        }
    }
    Ok(())
}

/// No pod: register if needed, then create the pod, minding the backoff.
#[allow(clippy::too_many_arguments)]
fn absent(
    obs: &Observed<'_>,
    settings: &Settings,
    status: &EphemeralRunnerStatus,
    runner_id: i64,
    earlier_secret: Option<&SecretView>,
    patch: &mut StatusPatch,
    plan: &mut Plan,
) -> Result<(), Need> {
    let gone = is_true(status, REGISTERED) == Some(false);
    if let Some(secret) = &obs.secret {
        if status.runner_id != 0 && status.runner_id != secret.runner_id {
            // A registration after the first whose Secret was written but
            // not its status (a crash between the two): the Secret is the
            // record. (The first is copied with the next status write.)
            patch.record_registration(secret, obs.now);
        } else if gone {
            // Its registration is gone (a crash before the Secret was
            // deleted): a pod made from it could not start.
            plan.step(Step::DeleteSecret);
            return Ok(());
        }
    } else if runner_id != 0 && !gone {
        // The Secret vanished while the registration exists: the config
        // cannot be read back, so the registration goes and a new one is made.
        ensure_gone(obs, settings, status, runner_id, false, patch, plan)?;
        return Ok(());
    }
    if let Some(last) = status.failures.values().map(|t| t.0).max() {
        let wait = settings.backoff(status.failures.len());
        let waited = elapsed(last, obs.now);
        if waited < wait {
            plan.requeue_after(wait - waited);
            return Ok(());
        }
    }
    if obs.secret.is_none() {
        // The pod in the same pass: registering records the registration
        // (Secret, then status) before it returns, and a pod that cannot be
        // created is retried from that record.
        plan.step(Step::Register {
            replacing: earlier_secret.map(|s| s.resource_version.clone()),
        });
        plan.step(Step::CreatePod);
    } else {
        plan.step(Step::CreatePod);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::EphemeralRunnerSpec;
    use k8s_openapi::api::core::v1::{Container, PodSpec};

    const FIN: &str = "arcwright.dev/test-finalizer";

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    /// A runner fixture that reads as a sentence:
    /// `Runner::new().registered(7).phase(Running)`.
    #[derive(Clone)]
    struct Runner(EphemeralRunner);

    impl Runner {
        fn new() -> Self {
            let mut r = EphemeralRunner::new(
                "r",
                EphemeralRunnerSpec {
                    spec: PodSpec {
                        containers: vec![Container {
                            name: "runner".into(),
                            ..Container::default()
                        }],
                        ..PodSpec::default()
                    },
                    ..EphemeralRunnerSpec::default()
                },
            );
            r.metadata.namespace = Some("ns".into());
            r.metadata.finalizers = Some(vec![FIN.into()]);
            r.status = Some(EphemeralRunnerStatus::default());
            Self(r)
        }
        fn status(mut self, f: impl FnOnce(&mut EphemeralRunnerStatus)) -> Self {
            f(self.0.status.get_or_insert_with(Default::default));
            self
        }
        fn registered(self, id: i64) -> Self {
            self.status(|s| {
                s.runner_id = id;
                s.conditions
                    .push(cond(REGISTERED, true, "JitConfigCreated"));
            })
        }
        fn gone(self, reason: &str) -> Self {
            let reason = reason.to_string();
            self.status(|s| {
                s.conditions.retain(|c| c.type_ != REGISTERED);
                s.conditions.push(cond(REGISTERED, false, &reason));
            })
        }
        fn phase(self, phase: EphemeralRunnerPhase) -> Self {
            self.status(|s| s.phase = Some(phase))
        }
        fn failures(self, n: usize, last: i64) -> Self {
            self.status(|s| {
                for i in 0..n {
                    s.failures
                        .insert(format!("old-{i}"), Time(at(last - i as i64)));
                }
            })
        }
        fn with_job(self) -> Self {
            self.status(|s| {
                s.job_id = Some("job".into());
                s.job_request_id = 3;
            })
        }
        fn no_finalizer(mut self) -> Self {
            self.0.metadata.finalizers = None;
            self
        }
        fn deleting(mut self) -> Self {
            self.0.metadata.deletion_timestamp = Some(Time(at(0)));
            self
        }
        fn debug(mut self, hold: &str, max_hold: &str, max_held: i32) -> Self {
            self.0.spec.debug = Some(crate::api::DebugSpec {
                hold_failed_for: Some(hold.into()),
                max_hold: Some(max_hold.into()),
                max_held: Some(max_held),
                slack: None,
            });
            self
        }
        fn job_failed_at(self, secs: i64) -> Self {
            self.with_job().status(|s| {
                s.job_result = Some("failed".into());
                s.job_finished_at = Some(Time(at(secs)));
            })
        }
        fn held(self, since: i64, until: i64) -> Self {
            self.phase(Debugging).status(|s| {
                s.held_since = Some(Time(at(since)));
                s.hold_until = Some(Time(at(until)));
            })
        }
        fn max_idle_age(mut self, value: &str) -> Self {
            self.0.spec.max_idle_age = Some(value.into());
            self
        }
        fn hold_until(mut self, value: &str) -> Self {
            self.0
                .metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(HOLD_UNTIL_ANNOTATION.into(), value.into());
            self
        }
        fn without_runner_container(mut self) -> Self {
            self.0.spec.spec.containers[0].name = "main".into();
            self
        }
    }

    fn cond(type_: &str, status: bool, reason: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: if status { "True" } else { "False" }.into(),
            reason: reason.into(),
            message: String::new(),
            last_transition_time: Time(at(-1000)),
            observed_generation: None,
        }
    }

    fn pod(runner: RunnerContainer) -> PodView {
        PodView {
            uid: "pod-1".into(),
            created: at(0),
            deleting_since: None,
            ready: runner == RunnerContainer::Running,
            finished: matches!(runner, RunnerContainer::Terminated { .. }).then(|| at(5)),
            runner,
            failed: false,
            init_failed: false,
            failure_message: None,
            renewal: 0,
        }
    }

    fn exited(code: i32) -> PodView {
        pod(RunnerContainer::Terminated {
            exit_code: code,
            reason: if code == 0 { "Completed" } else { "Error" }.into(),
        })
    }

    fn secret(id: i64) -> Option<SecretView> {
        Some(SecretView {
            runner_id: id,
            runner_name: "r".into(),
            renewal: 0,
            resource_version: "1".into(),
        })
    }

    #[derive(Clone)]
    struct Case {
        runner: Runner,
        pod: Option<PodView>,
        secret: Option<SecretView>,
        pool: PoolView,
        verdict: Option<Verdict>,
        presence: Option<Presence>,
        held: Option<usize>,
        now: i64,
    }

    fn case(runner: Runner) -> Case {
        Case {
            runner,
            pod: None,
            secret: None,
            pool: PoolView::Idle,
            verdict: None,
            presence: None,
            held: None,
            now: 10,
        }
    }

    impl Case {
        fn pod(mut self, pod: PodView) -> Self {
            self.pod = Some(pod);
            self
        }
        fn secret(mut self, id: i64) -> Self {
            self.secret = secret(id);
            self
        }
        fn pool(mut self, pool: PoolView) -> Self {
            self.pool = pool;
            self
        }
        fn verdict(mut self, verdict: Verdict) -> Self {
            self.verdict = Some(verdict);
            self
        }
        fn presence(mut self, presence: Presence) -> Self {
            self.presence = Some(presence);
            self
        }
        fn now(mut self, now: i64) -> Self {
            self.now = now;
            self
        }
        fn held(mut self, held: usize) -> Self {
            self.held = Some(held);
            self
        }
        fn run(&self) -> Result<Plan, Need> {
            let obs = Observed {
                runner: &self.runner.0,
                pod: self.pod.clone(),
                secret: self.secret.clone(),
                pool: self.pool.clone(),
                verdict: self.verdict.map(|verdict| VerdictView {
                    verdict,
                    fallback_reason: None,
                }),
                presence: self.presence,
                held: self.held,
                now: at(self.now),
            };
            plan(&obs, &settings(), FIN)
        }
        /// The steps, with the deregistration policy's verdict, if the
        /// plan asks for one the case did not give, answered as the
        /// bundled default does for these cases (a runner that exited 0
        /// removed its registration itself; anything else is removed now).
        fn steps(&self) -> Vec<Step> {
            match self.run() {
                Err(Need::Verdict(ending)) if self.verdict.is_none() => {
                    let verdict = if ending.exit_code == Some(0) {
                        Verdict::SelfDeregistered
                    } else {
                        Verdict::RemoveNow
                    };
                    let mut answered = self.clone();
                    answered.verdict = Some(verdict);
                    answered.run().expect("no more input needed").steps
                }
                planned => planned.expect("no input needed").steps,
            }
        }
    }

    fn settings() -> Settings {
        Settings {
            failure_limit: 5,
            backoff_base: Duration::from_secs(5),
            backoff_max: Duration::from_secs(80),
            registration_timeout: Duration::from_secs(600),
            terminating_timeout: Duration::from_secs(60),
            removal_recheck: Duration::from_secs(30),
            removal_retry: Duration::from_secs(15),
            result_wait: Duration::from_secs(15),
        }
    }

    /// The step kinds, without payloads, for compact expectations.
    fn kinds(steps: &[Step]) -> Vec<&'static str> {
        steps
            .iter()
            .map(|s| match s {
                Step::AddFinalizer => "add-finalizer",
                Step::RemoveFinalizer => "remove-finalizer",
                Step::PatchStatus(_) => "status",
                Step::Register { .. } => "register",
                Step::CreatePod => "create-pod",
                Step::DeletePod { .. } => "delete-pod",
                Step::ForceDeletePod { .. } => "force-delete-pod",
                Step::DeleteSecret => "delete-secret",
                Step::Deregister { .. } => "deregister",
                Step::Event { .. } => "event",
                Step::CountDeregistration { .. } => "count",
                Step::NotifySlack(_) => "slack",
            })
            .collect()
    }

    fn status_of(steps: &[Step]) -> serde_json::Value {
        steps
            .iter()
            .find_map(|s| match s {
                Step::PatchStatus(v) => Some(v["status"].clone()),
                _ => None,
            })
            .unwrap_or_default()
    }

    fn registered_condition(steps: &[Step]) -> Option<(String, String)> {
        let status = status_of(steps);
        status["conditions"].as_array()?.iter().find_map(|c| {
            (c["type"] == REGISTERED).then(|| {
                (
                    c["status"].as_str().unwrap().to_string(),
                    c["reason"].as_str().unwrap().to_string(),
                )
            })
        })
    }

    use EphemeralRunnerPhase::*;

    #[test]
    fn the_lifecycle_table() {
        let rows: Vec<(&str, Case, Vec<&str>)> = vec![
            (
                "a new runner gets the finalizer first",
                case(Runner::new().no_finalizer()),
                vec!["add-finalizer"],
            ),
            (
                "then a registration and its pod",
                case(Runner::new()),
                vec!["register", "create-pod"],
            ),
            (
                "then its pod, if the first pass could not make it",
                case(Runner::new().registered(7)).secret(7),
                vec!["create-pod"],
            ),
            (
                "a first registration's Secret is its record until the next status write",
                case(Runner::new()).secret(7),
                vec!["create-pod"],
            ),
            (
                "a later registration whose status write was lost is adopted at once",
                case(Runner::new().registered(5).gone("Removed")).secret(7),
                vec!["status", "create-pod"],
            ),
            (
                "a running pod is mirrored",
                case(Runner::new().registered(7).phase(Pending))
                    .secret(7)
                    .pod(pod(RunnerContainer::Running)),
                vec!["status"],
            ),
            (
                "nothing changes, nothing is done",
                case(
                    Runner::new()
                        .registered(7)
                        .phase(Running)
                        .status(|s| s.ready = true),
                )
                .secret(7)
                .pod(pod(RunnerContainer::Running)),
                vec![],
            ),
            (
                "exit 0 is Succeeded, and in the same pass, the runner having \
                 removed its registration itself, its pod goes (its Secret \
                 waits for a renewal to be written over, or the runner's end)",
                case(Runner::new().registered(7).phase(Running))
                    .secret(7)
                    .pod(exited(0)),
                vec!["status", "count", "delete-pod"],
            ),
            (
                "exit 7 is Outdated, and its registration is handed to the pool at once",
                case(Runner::new().registered(7).phase(Running))
                    .secret(7)
                    .pod(exited(7)),
                vec!["status", "event", "deregister", "event"],
            ),
            (
                "a template without a runner container fails the runner",
                case(Runner::new().without_runner_container()),
                vec!["status", "event"],
            ),
        ];
        for (name, case, expected) in rows {
            assert_eq!(kinds(&case.steps()), expected, "{name}");
        }
    }

    #[test]
    fn a_first_registration_is_copied_into_the_status_with_the_next_write() {
        // The pod runs: the Running write carries the registration.
        let steps = case(Runner::new())
            .secret(7)
            .pod(pod(RunnerContainer::Running))
            .steps();
        assert_eq!(kinds(&steps), vec!["status"]);
        let status = status_of(&steps);
        assert_eq!(status["phase"], "Running");
        assert_eq!(status["runnerId"], 7);
        assert_eq!(
            registered_condition(&steps),
            Some(("True".into(), "JitConfigCreated".into()))
        );
        // Still starting: nothing to write, nothing written.
        assert_eq!(
            case(Runner::new())
                .secret(7)
                .pod(pod(RunnerContainer::Waiting))
                .steps(),
            vec![]
        );
        // Ended before any write: the ending names the registration, and
        // what became of it is not overwritten by the copy.
        let steps = case(Runner::new()).secret(7).pod(exited(0)).steps();
        assert_eq!(status_of(&steps)["runnerId"], 7);
        assert_eq!(
            registered_condition(&steps),
            Some(("False".into(), "SelfDeregistered".into()))
        );
        // A pod that failed to start: its registration (the Secret's) is
        // the one handed to the pool.
        let steps = case(Runner::new()).secret(7).pod(exited(1)).steps();
        assert!(
            steps.contains(&Step::Deregister { runner_id: 7 }),
            "{steps:?}"
        );
        assert_eq!(status_of(&steps)["runnerId"], 7);
    }

    #[test]
    fn a_finished_runner_keeps_its_pod_until_its_registration_is_gone() {
        let done = || Runner::new().registered(7).phase(Failed);
        // The policy is asked first.
        let need = case(done()).secret(7).pod(exited(1)).run().unwrap_err();
        assert!(
            matches!(need, Need::Verdict(ref e) if e.phase == RunnerPhase::Failed && e.registered),
            "{need:?}"
        );
        // remove-now: handed to the pool, the pod stays.
        let steps = case(done())
            .secret(7)
            .pod(exited(1))
            .verdict(Verdict::RemoveNow)
            .steps();
        assert_eq!(kinds(&steps), vec!["status", "deregister", "event"]);
        assert!(steps.contains(&Step::Deregister { runner_id: 7 }));
        assert_eq!(
            registered_condition(&steps),
            Some(("True".into(), "RemoveNow".into()))
        );
        // While the pool works (also while it waits out JobStillRunning), the pod stays.
        let steps = case(done())
            .secret(7)
            .pod(exited(1))
            .pool(PoolView::Claimed)
            .steps();
        assert!(!kinds(&steps).contains(&"delete-pod"), "{steps:?}");
        // Removed: recorded, and only then the pod and Secret go.
        let steps = case(done())
            .secret(7)
            .pod(exited(1))
            .pool(PoolView::Removed)
            .steps();
        assert_eq!(
            kinds(&steps),
            vec!["status", "event", "count", "delete-pod", "delete-secret"]
        );
        assert_eq!(
            registered_condition(&steps),
            Some(("False".into(), "Removed".into()))
        );
        // Not found counts as gone.
        let steps = case(done())
            .secret(7)
            .pod(exited(1))
            .pool(PoolView::NotFound)
            .steps();
        assert!(kinds(&steps).contains(&"delete-pod"));
        // The pool gave up: retried later, the pod stays.
        let plan = case(done())
            .secret(7)
            .pod(exited(1))
            .pool(PoolView::Failed("503".into()))
            .run()
            .unwrap();
        assert_eq!(kinds(&plan.steps), vec!["event", "count"]);
        assert_eq!(plan.requeue, Some(Duration::from_secs(15)));
        // Gone already: the rest is cleaned up, nothing asked.
        let steps = case(done().gone("Removed"))
            .secret(7)
            .pod(exited(1))
            .steps();
        assert_eq!(kinds(&steps), vec!["delete-pod", "delete-secret"]);
    }

    impl Runner {
        /// Renewed by its set `count` times: the status written anew.
        fn renewed(self, count: u32) -> Self {
            self.status(|s| {
                *s = EphemeralRunnerStatus {
                    renewal: Some(crate::api::RunnerRenewal {
                        count,
                        patch_id: 4,
                        set_generation: 1,
                        renewed_at: Time(at(0)),
                    }),
                    ..EphemeralRunnerStatus::default()
                }
            })
        }
    }

    impl Case {
        /// The pod and Secret there were made for renewal `renewal`.
        fn made_for(mut self, renewal: u32) -> Self {
            if let Some(pod) = self.pod.as_mut() {
                pod.renewal = renewal;
            }
            if let Some(secret) = self.secret.as_mut() {
                secret.renewal = renewal;
            }
            self
        }
    }

    #[test]
    fn a_renewed_runner_registers_anew_over_the_secret_of_the_job_before() {
        // The job before's pod went when it ended; its Secret stayed.
        let steps = case(Runner::new().renewed(1)).secret(7).made_for(0).steps();
        assert_eq!(
            steps,
            vec![
                Step::Register {
                    replacing: Some("1".into())
                },
                Step::CreatePod
            ],
            "no status write: the reset status is the renewal's own"
        );
        // Its registration 7 is gone with that job: nothing asks about it.
        assert_eq!(
            registration_id(
                &Runner::new().renewed(1).0.status.unwrap(),
                secret(7).as_ref()
            ),
            0
        );

        // The job before's pod, still going: waited out (the next pod has
        // its name), nothing registered meanwhile.
        let mut going = exited(0);
        going.deleting_since = Some(at(9));
        let steps = case(Runner::new().renewed(1))
            .secret(7)
            .pod(going)
            .made_for(0)
            .steps();
        assert_eq!(kinds(&steps), Vec::<&str>::new());
        let steps = case(Runner::new().renewed(1))
            .secret(7)
            .pod(exited(0))
            .made_for(0)
            .steps();
        assert_eq!(
            kinds(&steps),
            vec!["delete-pod"],
            "not taken for this job's exit"
        );

        // Registered and running: the Running write carries the new
        // registration, as a first one's does.
        let steps = case(Runner::new().renewed(1))
            .secret(9)
            .pod(pod(RunnerContainer::Running))
            .made_for(1)
            .steps();
        let status = status_of(&steps);
        assert_eq!(kinds(&steps), vec!["status"]);
        assert_eq!(
            (status["runnerId"].as_i64(), status["phase"].as_str()),
            (Some(9), Some("Running"))
        );
        assert_eq!(
            registered_condition(&steps),
            Some(("True".into(), "JitConfigCreated".into()))
        );
    }

    #[test]
    fn a_late_record_of_the_job_before_a_renewal_is_not_the_runners_job() {
        let late = |r: Runner| {
            r.status(|s| {
                s.job_id = Some("old-job".into());
                s.job_request_id = 3;
                s.job_runner_id = 7;
                s.job_result = Some("failed".into());
            })
        };
        // Its pod, made for the renewal, runs registration 9.
        let running_on_9 = |r: Runner| {
            case(r)
                .secret(9)
                .pod(pod(RunnerContainer::Running))
                .made_for(1)
                .steps()
        };
        // Running on registration 9, it reads as idle; the record is no
        // reason for a write of its own.
        let runner = late(Runner::new().renewed(1).registered(9).phase(Running));
        assert!(!runner.0.status.as_ref().unwrap().has_job());
        let ready = runner.clone().status(|s| s.ready = true);
        let steps = running_on_9(ready);
        assert_eq!(steps, vec![]);
        // It goes with the next write (the pod turning ready, here), on the
        // condition that the runner is as read: a record of this
        // registration's job written since is not cleared blind.
        let mut runner = runner;
        runner.0.metadata.resource_version = Some("41".into());
        let steps = running_on_9(runner);
        assert_eq!(kinds(&steps), vec!["status"]);
        let Step::PatchStatus(patch) = &steps[0] else {
            unreachable!()
        };
        assert_eq!(patch["metadata"]["resourceVersion"], "41");
        let status = status_of(&steps);
        assert_eq!(status["ready"], true);
        for key in ["jobId", "jobRequestId", "jobRunnerId", "jobResult"] {
            assert!(
                status[key].is_null() && status.get(key).is_some(),
                "{key} cleared: {status}"
            );
        }
        // Its job is, and stays.
        let own = late(Runner::new().renewed(1).registered(9).phase(Running)).status(|s| {
            s.ready = true;
            s.job_runner_id = 9;
            s.job_result = None;
        });
        assert!(own.0.status.as_ref().unwrap().has_job());
        let steps = running_on_9(own);
        assert_eq!(steps, vec![]);
        // Before the runner registered again, any record is of the job
        // before: it registers, and the record goes with its Running write.
        let steps = case(late(Runner::new().renewed(1)))
            .secret(7)
            .made_for(0)
            .steps();
        assert_eq!(kinds(&steps), vec!["register", "create-pod"]);
        let steps = running_on_9(late(Runner::new().renewed(1)));
        let status = status_of(&steps);
        assert_eq!(
            (status["runnerId"].as_i64(), &status["jobId"]),
            (Some(9), &serde_json::Value::Null)
        );
        assert!(status.get("jobId").is_some(), "{status}");
    }

    #[test]
    fn a_renewed_runner_deleted_cleans_up_the_job_befores_objects() {
        let steps = case(Runner::new().renewed(1).deleting())
            .secret(7)
            .pod(exited(0))
            .made_for(0)
            .steps();
        assert!(!kinds(&steps).contains(&"deregister"), "{steps:?}");
        assert_eq!(
            registered_condition(&steps),
            Some(("False".into(), "NeverRegistered".into()))
        );
        assert!(
            kinds(&steps).ends_with(&["delete-pod", "delete-secret"]),
            "{steps:?}"
        );
    }

    #[test]
    fn a_self_deregistered_runner_costs_no_removal() {
        let runner = Runner::new()
            .registered(7)
            .phase(Succeeded)
            .status(|s| s.exit_code = Some(0));
        let steps = case(runner)
            .secret(7)
            .pod(exited(0))
            .verdict(Verdict::SelfDeregistered)
            .steps();
        assert!(!kinds(&steps).contains(&"deregister"), "{steps:?}");
        assert_eq!(
            registered_condition(&steps),
            Some(("False".into(), "SelfDeregistered".into()))
        );
        assert!(steps.contains(&Step::CountDeregistration {
            verdict: "self-deregistered",
            outcome: "skipped"
        }));
        assert_eq!(kinds(&steps), vec!["status", "count", "delete-pod"]);
    }

    #[test]
    fn a_policy_fallback_is_reported_on_the_runner() {
        let runner = Runner::new().registered(7).phase(Failed);
        let obs = Observed {
            runner: &runner.0,
            pod: Some(exited(1)),
            secret: secret(7),
            pool: PoolView::Idle,
            verdict: Some(VerdictView {
                verdict: Verdict::RemoveNow,
                fallback_reason: Some("timeout".into()),
            }),
            presence: None,
            held: None,
            now: at(10),
        };
        let steps = plan(&obs, &settings(), FIN).unwrap().steps;
        let status = status_of(&steps);
        let fallback = status["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == POLICY_FALLBACK)
            .unwrap();
        assert_eq!(fallback["status"], "True");
        assert!(steps.iter().any(|s| matches!(
            s,
            Step::Event {
                reason: "PolicyFallback",
                severity: Severity::Warning,
                ..
            }
        )));
    }

    #[test]
    fn failed_starts_back_off_and_stop_at_the_limit() {
        let running = || Runner::new().registered(7).phase(Running);
        // First failure: recorded, the registration removed before the pod goes.
        let steps = case(running()).secret(7).pod(exited(1)).steps();
        assert_eq!(
            kinds(&steps),
            vec!["status", "event", "deregister", "event"]
        );
        let status = status_of(&steps);
        assert!(status["failures"]["pod-1"].is_string(), "{status}");
        assert_eq!(status["phase"], "Pending");
        // The policy is not asked for a start that failed: the registration surely exists.
        // Once gone: pod and Secret deleted.
        // (as the first pass left it: failure recorded, exit code seen)
        let recorded = running().gone("Removed").phase(Pending).status(|s| {
            s.failures.insert("pod-1".into(), Time(at(0)));
            s.exit_code = Some(1);
            s.termination_reason = Some("Error".into());
        });
        let steps = case(recorded).secret(7).pod(exited(1)).steps();
        assert_eq!(kinds(&steps), vec!["delete-pod", "delete-secret"]);
        // Then the backoff: 5 s after the first failure, 10 s after the second.
        let plan = case(Runner::new().registered(7).gone("Removed").failures(1, 8))
            .now(10)
            .run()
            .unwrap();
        assert_eq!(plan.steps, vec![]);
        assert_eq!(plan.requeue, Some(Duration::from_secs(3)));
        let plan = case(Runner::new().registered(7).gone("Removed").failures(2, 8))
            .now(10)
            .run()
            .unwrap();
        assert_eq!(plan.requeue, Some(Duration::from_secs(8)));
        // After it: registered again.
        assert_eq!(
            kinds(
                &case(Runner::new().registered(7).gone("Removed").failures(1, 0))
                    .now(10)
                    .steps()
            ),
            vec!["register", "create-pod"]
        );
        // The fifth failure marks it Failed.
        let steps = case(running().failures(4, 0))
            .secret(7)
            .pod(exited(1))
            .steps();
        assert_eq!(status_of(&steps)["phase"], "Failed");
        assert_eq!(status_of(&steps)["reason"], "TooManyFailures");
        assert!(!kinds(&steps).contains(&"delete-pod"));
        // A failure with a job is not retried: the job is lost.
        let steps = case(running().with_job()).secret(7).pod(exited(1)).steps();
        assert_eq!(status_of(&steps)["phase"], "Failed");
        assert_eq!(status_of(&steps)["reason"], "JobFailed");
    }

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let s = settings();
        let waits: Vec<u64> = (0..8).map(|n| s.backoff(n).as_secs()).collect();
        assert_eq!(waits, vec![0, 5, 10, 20, 40, 80, 80, 80]);
    }

    #[test]
    fn a_runner_that_never_comes_online_is_recreated() {
        let running = || {
            Runner::new()
                .registered(7)
                .phase(Running)
                .status(|s| s.ready = true)
        };
        // Before the timeout: look again when it passes, ask nothing.
        let plan = case(running())
            .secret(7)
            .pod(pod(RunnerContainer::Running))
            .now(100)
            .run()
            .unwrap();
        assert_eq!(plan.requeue, Some(Duration::from_secs(500)));
        // At the timeout: ask the service.
        let need = case(running())
            .secret(7)
            .pod(pod(RunnerContainer::Running))
            .now(600)
            .run()
            .unwrap_err();
        assert_eq!(need, Need::Presence(7));
        // Online: remembered, never asked again.
        let steps = case(running())
            .secret(7)
            .pod(pod(RunnerContainer::Running))
            .now(600)
            .presence(Presence::Online)
            .steps();
        assert_eq!(kinds(&steps), vec!["status"]);
        let online = running().status(|s| s.conditions.push(cond(ONLINE, true, "Online")));
        assert!(
            case(online)
                .secret(7)
                .pod(pod(RunnerContainer::Running))
                .now(6000)
                .run()
                .is_ok()
        );
        // Offline: a failed start; the registration is removed before the pod goes.
        let steps = case(running())
            .secret(7)
            .pod(pod(RunnerContainer::Running))
            .now(600)
            .presence(Presence::Offline)
            .steps();
        assert_eq!(
            kinds(&steps),
            vec!["status", "event", "deregister", "event"]
        );
        assert!(steps.iter().any(|s| matches!(
            s,
            Step::Event {
                reason: "RegistrationTimeout",
                ..
            }
        )));
    }

    #[test]
    fn a_pod_stuck_terminating_is_force_deleted_after_the_bound() {
        let terminating = |since| {
            let mut p = exited(1);
            p.deleting_since = Some(at(since));
            p
        };
        let done = || Runner::new().registered(7).phase(Failed).gone("Removed");
        let plan = case(done()).pod(terminating(0)).now(30).run().unwrap();
        assert_eq!(plan.steps, vec![]);
        assert_eq!(plan.requeue, Some(Duration::from_secs(30)));
        let steps = case(done()).pod(terminating(0)).now(60).steps();
        assert_eq!(kinds(&steps), vec!["force-delete-pod", "event"]);
        // Also a pod someone else deleted while the runner was running.
        let steps = case(Runner::new().registered(7).phase(Running))
            .secret(7)
            .pod(terminating(0))
            .now(61)
            .steps();
        assert_eq!(kinds(&steps), vec!["force-delete-pod", "event"]);
    }

    #[test]
    fn deletion_holds_the_finalizer_until_everything_is_gone() {
        let deleting = || Runner::new().registered(7).phase(Running).deleting();
        assert!(matches!(
            case(deleting())
                .secret(7)
                .pod(pod(RunnerContainer::Running))
                .run(),
            Err(Need::Verdict(_))
        ));
        let steps = case(deleting())
            .secret(7)
            .pod(pod(RunnerContainer::Running))
            .verdict(Verdict::RemoveNow)
            .steps();
        assert_eq!(kinds(&steps), vec!["status", "deregister", "event"]);
        // Job still running: the pool keeps retrying; the pod stays.
        let steps = case(deleting())
            .secret(7)
            .pod(pod(RunnerContainer::Running))
            .pool(PoolView::Claimed)
            .steps();
        assert_eq!(kinds(&steps), Vec::<&str>::new());
        // Unknown to the service: does not hang.
        let steps = case(deleting())
            .secret(7)
            .pod(pod(RunnerContainer::Running))
            .pool(PoolView::NotFound)
            .steps();
        assert_eq!(
            kinds(&steps),
            vec!["status", "event", "count", "delete-pod", "delete-secret"]
        );
        // Pod and Secret gone: the finalizer goes.
        let steps = case(deleting().gone("NotFound")).steps();
        assert_eq!(kinds(&steps), vec!["remove-finalizer"]);
        // Never registered: nothing to remove.
        let steps = case(Runner::new().deleting()).steps();
        assert_eq!(kinds(&steps), vec!["status", "remove-finalizer"]);
        assert_eq!(
            registered_condition(&steps),
            Some(("False".into(), "NeverRegistered".into()))
        );
        // Without the finalizer, nothing is ours to do.
        assert_eq!(
            kinds(&case(Runner::new().deleting().no_finalizer()).steps()),
            Vec::<&str>::new()
        );
    }

    #[test]
    fn a_lost_secret_means_a_new_registration_after_the_old_one_goes() {
        // Registered, the Secret is gone: the old registration is removed first.
        let steps = case(Runner::new().registered(7).phase(Pending)).steps();
        assert_eq!(kinds(&steps), vec!["status", "deregister", "event"]);
        // A Secret whose registration is gone is deleted, then a new one is made.
        let steps = case(Runner::new().registered(7).gone("Removed"))
            .secret(7)
            .steps();
        assert_eq!(kinds(&steps), vec!["delete-secret"]);
        // A Secret newer than the status (a crash after writing it) is adopted.
        let steps = case(Runner::new().registered(7).gone("Removed"))
            .secret(8)
            .steps();
        assert_eq!(kinds(&steps), vec!["status", "create-pod"]);
        assert_eq!(status_of(&steps)["runnerId"], 8);
        assert_eq!(
            registered_condition(&steps),
            Some(("True".into(), "JitConfigCreated".into()))
        );
    }

    fn event_reasons(steps: &[Step]) -> Vec<&'static str> {
        steps
            .iter()
            .filter_map(|s| match s {
                Step::Event { reason, .. } => Some(*reason),
                _ => None,
            })
            .collect()
    }

    /// A runner of a scale set that holds failures 10 minutes, up to an
    /// hour, one at a time.
    fn holding() -> Runner {
        Runner::new()
            .registered(7)
            .phase(Running)
            .debug("10m", "1h", 1)
    }

    #[test]
    fn a_failed_job_holds_the_runner_and_removes_its_registration() {
        // The listener recorded the failure while the pod still runs.
        let failed = || holding().job_failed_at(4);
        let need = case(failed())
            .secret(7)
            .pod(pod(RunnerContainer::Running))
            .run()
            .unwrap_err();
        assert_eq!(need, Need::HeldCount, "maxHeld is checked first");
        let plan = case(failed())
            .secret(7)
            .pod(pod(RunnerContainer::Running))
            .held(0)
            .run()
            .unwrap();
        assert_eq!(
            kinds(&plan.steps),
            vec!["status", "event", "deregister", "event"]
        );
        let status = status_of(&plan.steps);
        assert_eq!(status["phase"], "Debugging");
        assert_eq!(status["heldSince"], json!(Time(at(4))));
        assert_eq!(
            status["holdUntil"],
            json!(Time(at(604))),
            "10m after the job's end"
        );
        assert_eq!(
            plan.requeue,
            Some(Duration::from_secs(30)),
            "the removal recheck"
        );
        assert!(event_reasons(&plan.steps).contains(&"HeldForDebugging"));
        // The runner crashing mid-job holds it too, counted from when it was seen.
        let steps = case(holding().with_job())
            .secret(7)
            .pod(exited(1))
            .held(0)
            .steps();
        let status = status_of(&steps);
        assert_eq!(status["phase"], "Debugging");
        assert_eq!(status["exitCode"], 1);
        assert_eq!(status["heldSince"], json!(Time(at(10))));
        assert!(kinds(&steps).contains(&"deregister"));
        assert!(!kinds(&steps).contains(&"delete-pod"));
    }

    #[test]
    fn a_failure_is_not_held_without_a_hold_beyond_max_held_or_with_a_bad_spec() {
        // No debug spec: a failed job's runner ends as usual, nothing asked.
        let steps = case(Runner::new().registered(7).phase(Running).job_failed_at(4))
            .secret(7)
            .pod(exited(0))
            .steps();
        assert_eq!(status_of(&steps)["phase"], "Succeeded");
        // maxHeld reached: it ends as usual, and says why once.
        let steps = case(holding().job_failed_at(4))
            .secret(7)
            .pod(exited(0))
            .held(1)
            .steps();
        let status = status_of(&steps);
        assert_eq!(status["phase"], "Succeeded");
        let held = status["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == HELD)
            .unwrap();
        assert_eq!(held["reason"], "MaxHeld");
        assert!(event_reasons(&steps).contains(&"NotHeld"));
        // An invalid spec is reported and not followed.
        let mut bad = holding().job_failed_at(4);
        bad.0.spec.debug.as_mut().unwrap().max_hold = Some("5m".into());
        let steps = case(bad).secret(7).pod(exited(0)).steps();
        assert_eq!(status_of(&steps)["phase"], "Succeeded");
        assert!(event_reasons(&steps).contains(&"InvalidDebugSpec"));
        // A failure learnt after its hold would have ended is not held.
        let steps = case(holding().job_failed_at(4))
            .secret(7)
            .pod(exited(0))
            .held(0)
            .now(604)
            .steps();
        assert_eq!(status_of(&steps)["phase"], "Succeeded");
        // A job that succeeded is never held.
        let ok = holding()
            .with_job()
            .status(|s| s.job_result = Some("succeeded".into()));
        let steps = case(ok).secret(7).pod(exited(0)).steps();
        assert_eq!(status_of(&steps)["phase"], "Succeeded");
    }

    #[test]
    fn a_clean_exit_after_a_job_waits_a_little_for_the_jobs_result() {
        // Exited 0 at 5 with no result recorded yet: wait until 20.
        let plan = case(holding().with_job())
            .secret(7)
            .pod(exited(0))
            .now(10)
            .run()
            .unwrap();
        assert_eq!(plan.steps, vec![]);
        assert_eq!(plan.requeue, Some(Duration::from_secs(10)));
        // No result by then: Succeeded, as without a hold.
        let steps = case(holding().with_job())
            .secret(7)
            .pod(exited(0))
            .now(20)
            .steps();
        assert_eq!(status_of(&steps)["phase"], "Succeeded");
        // Without a hold there is nothing to wait for.
        let steps = case(Runner::new().registered(7).phase(Running).with_job())
            .secret(7)
            .pod(exited(0))
            .now(10)
            .steps();
        assert_eq!(status_of(&steps)["phase"], "Succeeded");
    }

    #[test]
    fn a_hold_is_told_to_slack_until_slack_accepted_it() {
        let with_slack = |runner: Runner| {
            let mut runner = runner;
            runner.0.spec.debug.as_mut().unwrap().slack = Some(crate::api::SlackSpec {
                channel: "#ci".into(),
                token_secret_ref: crate::api::SecretKeyRef {
                    name: "slack".into(),
                    key: None,
                },
            });
            runner
        };
        let slack_posts = |steps: &[Step]| -> Vec<HeldFailure> {
            steps
                .iter()
                .filter_map(|s| match s {
                    Step::NotifySlack(failure) => Some(failure.clone()),
                    _ => None,
                })
                .collect()
        };
        // The hold begins: the post is asked for with the status write.
        let steps = case(with_slack(holding().job_failed_at(4)))
            .secret(7)
            .pod(pod(RunnerContainer::Running))
            .held(0)
            .steps();
        let posts = slack_posts(&steps);
        assert_eq!(posts.len(), 1);
        assert_eq!(posts[0].why, "the job failed");
        assert_eq!(posts[0].hold_until, at(604));
        // A later pass of the hold, with no post accepted (the host stopped
        // before it, or Slack refused it): asked again, saying the same.
        let held = || {
            with_slack(holding().job_failed_at(4).held(4, 604)).status(|s| {
                s.conditions.push(Condition {
                    message: format!("the job failed{HELD_UNTIL}{}", at(604)),
                    ..cond(HELD, true, "HeldForDebugging")
                });
            })
        };
        // Later passes: 100 s in, the registration removed.
        let later = |runner: Runner| {
            case(runner.gone("Removed"))
                .secret(7)
                .pod(pod(RunnerContainer::Running))
                .now(100)
                .run()
                .unwrap()
        };
        let plan = later(held());
        let posts = slack_posts(&plan.steps);
        assert_eq!(posts.len(), 1);
        assert_eq!(posts[0].why, "the job failed");
        assert_eq!(posts[0].hold_until, at(604));
        assert_eq!(plan.requeue, Some(Duration::from_secs(504)));
        let refused =
            held().status(|s| s.conditions.push(cond(SLACK_NOTIFIED, false, "PostFailed")));
        assert_eq!(slack_posts(&later(refused).steps).len(), 1);
        // Accepted: never again.
        let told = held().status(|s| s.conditions.push(cond(SLACK_NOTIFIED, true, "Posted")));
        let steps = later(told).steps;
        assert!(slack_posts(&steps).is_empty(), "{steps:?}");
        // Without a Slack channel there is nothing to tell.
        let steps = later(holding().job_failed_at(4).held(4, 604)).steps;
        assert!(slack_posts(&steps).is_empty(), "{steps:?}");
    }

    #[test]
    fn a_held_runner_keeps_its_pod_until_the_hold_ends() {
        let held = || holding().job_failed_at(0).held(0, 600);
        // Its registration being removed: the pod stays.
        let plan = case(held().status(|s| {
            s.conditions.retain(|c| c.type_ != REGISTERED);
            s.conditions.push(cond(REGISTERED, true, "RemoveNow"));
        }))
        .secret(7)
        .pod(exited(0))
        .pool(PoolView::Claimed)
        .now(100)
        .run()
        .unwrap();
        assert_eq!(plan.steps, vec![]);
        assert_eq!(plan.requeue, Some(Duration::from_secs(30)));
        // Removed: recorded; the pod stays until the deadline.
        let plan = case(held())
            .secret(7)
            .pod(exited(0))
            .pool(PoolView::Removed)
            .now(100)
            .run()
            .unwrap();
        assert_eq!(
            registered_condition(&plan.steps),
            Some(("False".into(), "Removed".into()))
        );
        assert!(!kinds(&plan.steps).contains(&"delete-pod"));
        assert_eq!(plan.requeue, Some(Duration::from_secs(500)));
        // Gone, before the deadline: nothing to do but wait.
        let gone = || held().gone("Removed");
        let plan = case(gone())
            .secret(7)
            .pod(exited(0))
            .now(100)
            .run()
            .unwrap();
        assert_eq!(plan.steps, vec![]);
        assert_eq!(plan.requeue, Some(Duration::from_secs(500)));
        // At the deadline: Failed, and the pod and Secret go.
        let steps = case(gone()).secret(7).pod(exited(0)).now(600).steps();
        assert_eq!(
            kinds(&steps),
            vec!["status", "event", "delete-pod", "delete-secret"]
        );
        let status = status_of(&steps);
        assert_eq!(status["phase"], "Failed");
        assert_eq!(status["reason"], "HoldEnded");
        // At the deadline with the removal still under way: Failed, the pod
        // still waits for the registration to go.
        let steps = case(held())
            .secret(7)
            .pod(exited(0))
            .pool(PoolView::Claimed)
            .now(600)
            .steps();
        assert_eq!(status_of(&steps)["phase"], "Failed");
        assert!(!kinds(&steps).contains(&"delete-pod"));
        // A pod someone deleted ends the hold.
        let steps = case(gone()).secret(7).now(100).steps();
        assert_eq!(status_of(&steps)["reason"], "HoldEnded");
        assert_eq!(kinds(&steps), vec!["status", "event", "delete-secret"]);
    }

    #[test]
    fn the_annotation_extends_or_releases_within_the_cap() {
        let held = || holding().job_failed_at(0).held(0, 600).gone("Removed");
        let rows: Vec<(&str, String, i64, Option<&str>)> = vec![
            ("extended", at(1800).to_string(), 1800, None),
            (
                "capped at an hour after the job",
                at(99_999).to_string(),
                3600,
                Some("past the cap"),
            ),
            (
                "unreadable: the default",
                "soon".into(),
                600,
                Some("not an RFC 3339 time"),
            ),
        ];
        for (name, value, until, note) in rows {
            let plan = case(held().hold_until(&value))
                .secret(7)
                .pod(exited(0))
                .now(100)
                .run()
                .unwrap();
            let status = status_of(&plan.steps);
            if until == 600 {
                assert!(status.get("holdUntil").is_none(), "{name}: unchanged");
            } else {
                assert_eq!(status["holdUntil"], json!(Time(at(until))), "{name}");
            }
            assert_eq!(
                plan.requeue,
                Some(Duration::from_secs((until - 100) as u64)),
                "{name}"
            );
            match note {
                Some(note) => assert!(
                    status["message"].as_str().unwrap().contains(note),
                    "{name}: {status}"
                ),
                None => assert!(status.get("message").is_none(), "{name}"),
            }
            // Past the effective end, the hold ends.
            let steps = case(held().hold_until(&value))
                .secret(7)
                .pod(exited(0))
                .now(until)
                .steps();
            assert_eq!(status_of(&steps)["phase"], "Failed", "{name}");
        }
        // A time in the past releases now.
        let steps = case(held().hold_until(&at(50).to_string()))
            .secret(7)
            .pod(exited(0))
            .now(100)
            .steps();
        assert_eq!(status_of(&steps)["reason"], "HoldEnded");
        assert!(kinds(&steps).contains(&"delete-pod"));
    }

    #[test]
    fn a_held_runner_being_deleted_is_cleaned_up_as_usual() {
        let deleting = holding()
            .job_failed_at(0)
            .held(0, 600)
            .gone("Removed")
            .deleting();
        let steps = case(deleting).secret(7).pod(exited(0)).now(100).steps();
        assert_eq!(kinds(&steps), vec!["delete-pod", "delete-secret"]);
    }

    #[test]
    fn an_idle_runner_past_max_idle_age_gets_a_new_registration_and_pod() {
        // Pod created at 0, maxIdleAge 60 s.
        let idle = || {
            Runner::new()
                .registered(7)
                .phase(Running)
                .status(|s| s.ready = true)
                .max_idle_age("1m")
        };
        let rows: Vec<(&str, Case, Vec<&str>, Option<u64>)> = vec![
            (
                "younger: looked at again when it comes of age",
                case(idle())
                    .secret(7)
                    .pod(pod(RunnerContainer::Running))
                    .now(45),
                vec![],
                Some(15),
            ),
            (
                "of age: the registration goes first",
                case(idle())
                    .secret(7)
                    .pod(pod(RunnerContainer::Running))
                    .now(60),
                vec!["status", "deregister", "event", "event"],
                Some(30),
            ),
            (
                "while the removal is under way, the pod stays",
                case(idle())
                    .secret(7)
                    .pod(pod(RunnerContainer::Running))
                    .pool(PoolView::Claimed)
                    .now(70),
                vec![],
                Some(30),
            ),
            (
                "removed: then the pod and the Secret",
                case(idle())
                    .secret(7)
                    .pod(pod(RunnerContainer::Running))
                    .pool(PoolView::Removed)
                    .now(70),
                vec!["status", "event", "count", "delete-pod", "delete-secret"],
                None,
            ),
            (
                "exited 0 while its removal is under way: the renewal goes on",
                case(idle().status(|s| {
                    s.conditions.retain(|c| c.type_ != REGISTERED);
                    s.conditions.push(cond(REGISTERED, true, "RemoveNow"));
                }))
                .secret(7)
                .pod(exited(0))
                .pool(PoolView::Claimed)
                .now(70),
                vec![],
                Some(30),
            ),
            (
                "exited 0 after its removal: pod and Secret go, not Succeeded",
                case(idle().gone("Removed"))
                    .secret(7)
                    .pod(exited(0))
                    .now(70),
                vec!["delete-pod", "delete-secret"],
                None,
            ),
            (
                "with a job it is not idle",
                case(idle().with_job())
                    .secret(7)
                    .pod(pod(RunnerContainer::Running))
                    .now(600),
                vec![],
                None,
            ),
            (
                "a pod still starting is not idle",
                case(idle())
                    .secret(7)
                    .pod(pod(RunnerContainer::Waiting))
                    .now(100),
                vec!["status"],
                Some(500),
            ),
            (
                "without maxIdleAge nothing happens",
                case(idle().max_idle_age("0s"))
                    .secret(7)
                    .pod(pod(RunnerContainer::Running))
                    .now(100),
                vec![],
                Some(500),
            ),
        ];
        for (name, case, want, requeue) in rows {
            let plan = case.run().unwrap();
            assert_eq!(kinds(&plan.steps), want, "{name}");
            assert_eq!(plan.requeue.map(|d| d.as_secs()), requeue, "{name}");
            assert!(
                status_of(&plan.steps).get("failures").is_none(),
                "{name}: not a failed start"
            );
        }
        // Once the pod is gone, a new registration, with no backoff.
        let renewed = idle().gone("Removed");
        assert_eq!(
            kinds(&case(renewed).now(75).steps()),
            vec!["register", "create-pod"]
        );
        let steps = case(idle())
            .secret(7)
            .pod(pod(RunnerContainer::Running))
            .now(60)
            .steps();
        assert!(event_reasons(&steps).contains(&"MaxIdleAge"));
    }
}
