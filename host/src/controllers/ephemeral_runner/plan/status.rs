//! The status a pass writes, typed: [`StatusChange`] is the merge patch
//! itself, each field typed as the status holds it, so a misspelt field or
//! a reason of the wrong kind does not compile; [`StatusDraft`] is how a
//! pass assembles it.
//!
//! Only the fields a pass changes are written, and a field set to what the
//! status holds already is not (a write that changes nothing would still
//! wake every watcher of the runner). "What it holds already" is judged as
//! the API server sees it: times are written to the second, so a time that
//! differs below the second is no change.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde::{Serialize, Serializer};

use crate::api::ephemeral_runner::{
    ConditionReason, HoldCause, PhaseReason, RegisteredReason, RunnerCondition,
};
use crate::api::{EphemeralRunnerPhase, EphemeralRunnerStatus};
use crate::controllers::kit::conditions::{self, Setting};

/// A write of the runner's status: a merge patch of the fields it sets,
/// conditional on the runner's resourceVersion when it has to be (see
/// `StatusDraft::into_change`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StatusChange {
    /// The precondition, when the write must fail should the runner have
    /// changed since it was read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Precondition>,
    /// The fields written.
    pub status: StatusFields,
}

/// The resourceVersion a write is conditional on.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Precondition {
    /// The runner's, as read.
    pub resource_version: Option<String>,
}

/// The status fields a write sets; `None` leaves a field as it is. The
/// phase's reason and message are cleared (written null) with `Some(None)`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusFields {
    /// `phase`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<EphemeralRunnerPhase>,
    /// `reason`, the phase's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<Option<PhaseReason>>,
    /// `message`, the phase's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<Option<String>>,
    /// `ready`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
    /// `exitCode`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// `terminationReason`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub termination_reason: Option<String>,
    /// `runnerId`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runner_id: Option<i64>,
    /// `runnerName`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runner_name: Option<String>,
    /// `failures`, whole.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failures: Option<BTreeMap<String, Time>>,
    /// `heldSince`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_since: Option<Time>,
    /// `holdUntil`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hold_until: Option<Time>,
    /// `holdCause`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hold_cause: Option<HoldCause>,
    /// `slackMessage`: the post the hold's buttons are bound to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slack_message: Option<crate::api::ephemeral_runner::SlackMessage>,
    /// `conditions`, whole.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
    /// The listener's job record, cleared.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub cleared_job: Option<ClearedJobRecord>,
}

impl StatusFields {
    /// Whether nothing is set.
    fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// `status` as it is once these fields are written (the job record
    /// aside: what is decided on never sees it).
    fn written_over(&self, status: &EphemeralRunnerStatus) -> EphemeralRunnerStatus {
        let mut out = status.clone();
        if let Some(phase) = self.phase {
            out.phase = Some(phase);
        }
        if let Some(reason) = self.reason {
            out.reason = reason.map(|r| r.as_str().to_owned());
        }
        if let Some(message) = &self.message {
            out.message.clone_from(message);
        }
        if let Some(ready) = self.ready {
            out.ready = ready;
        }
        if let Some(code) = self.exit_code {
            out.exit_code = Some(code);
        }
        if let Some(reason) = &self.termination_reason {
            out.termination_reason = Some(reason.clone());
        }
        if let Some(id) = self.runner_id {
            out.runner_id = id;
        }
        if let Some(name) = &self.runner_name {
            out.runner_name = Some(name.clone());
        }
        if let Some(failures) = &self.failures {
            out.failures.clone_from(failures);
        }
        if let Some(since) = &self.held_since {
            out.held_since = Some(since.clone());
        }
        if let Some(until) = &self.hold_until {
            out.hold_until = Some(until.clone());
        }
        if let Some(cause) = self.hold_cause {
            out.hold_cause = Some(cause);
        }
        if let Some(posted) = &self.slack_message {
            out.slack_message = Some(posted.clone());
        }
        if let Some(conditions) = &self.conditions {
            out.conditions.clone_from(conditions);
        }
        out
    }
}

/// A field written as null: cleared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cleared;

impl Serialize for Cleared {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_none()
    }
}

/// The listener's job fields ([`crate::api::JOB_FIELDS`]) that a status
/// holds, each written null.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClearedJobRecord {
    #[serde(skip_serializing_if = "Option::is_none")]
    job_request_id: Option<Cleared>,
    #[serde(skip_serializing_if = "Option::is_none")]
    job_runner_id: Option<Cleared>,
    #[serde(skip_serializing_if = "Option::is_none")]
    job_id: Option<Cleared>,
    #[serde(skip_serializing_if = "Option::is_none")]
    job_repository_name: Option<Cleared>,
    #[serde(skip_serializing_if = "Option::is_none")]
    job_workflow_ref: Option<Cleared>,
    #[serde(skip_serializing_if = "Option::is_none")]
    workflow_run_id: Option<Cleared>,
    #[serde(skip_serializing_if = "Option::is_none")]
    job_display_name: Option<Cleared>,
    #[serde(skip_serializing_if = "Option::is_none")]
    job_started_at: Option<Cleared>,
    #[serde(skip_serializing_if = "Option::is_none")]
    job_result: Option<Cleared>,
    #[serde(skip_serializing_if = "Option::is_none")]
    job_finished_at: Option<Cleared>,
}

impl ClearedJobRecord {
    /// The job fields `status` holds, as it is written: the counters
    /// (`jobRequestId`, `workflowRunId`) are written even when 0, the rest
    /// only when set.
    pub fn of(status: &EphemeralRunnerStatus) -> Self {
        let held = |present: bool| present.then_some(Cleared);
        Self {
            job_request_id: Some(Cleared),
            job_runner_id: held(status.job_runner_id != 0),
            job_id: held(status.job_id.is_some()),
            job_repository_name: held(status.job_repository_name.is_some()),
            job_workflow_ref: held(status.job_workflow_ref.is_some()),
            workflow_run_id: Some(Cleared),
            job_display_name: held(status.job_display_name.is_some()),
            job_started_at: held(status.job_started_at.is_some()),
            job_result: held(status.job_result.is_some()),
            job_finished_at: held(status.job_finished_at.is_some()),
        }
    }
}

/// How condition `R::CONDITION` is set with `reason` (its status follows
/// from the reason).
pub fn setting<R: ConditionReason>(reason: R, message: &str) -> Setting<'_> {
    Setting {
        type_: R::CONDITION.as_str(),
        status: reason.holds(),
        reason: reason.name(),
        message,
        observed_generation: None,
    }
}

/// Whether `value` is written as `current` is: the same JSON, so times
/// equal to the second are equal.
fn written_alike<T: Serialize>(value: &T, current: &T) -> bool {
    serde_json::to_value(value).ok() == serde_json::to_value(current).ok()
}

/// A status change being assembled by one pass.
#[derive(Clone, Debug)]
pub(super) struct StatusDraft {
    /// The status as read.
    current: EphemeralRunnerStatus,
    fields: StatusFields,
    /// The job record of an earlier registration, cleared with the next
    /// write if there is one: tidying that is no reason for a write of its
    /// own.
    cleared_job: Option<ClearedJobRecord>,
    conditions: Vec<Condition>,
    conditions_changed: bool,
    /// The conditions set in this pass, changed or not.
    decided: Vec<RunnerCondition>,
}

impl StatusDraft {
    pub(super) fn new(status: &EphemeralRunnerStatus) -> Self {
        Self {
            current: status.clone(),
            fields: StatusFields::default(),
            cleared_job: None,
            conditions: status.conditions.clone(),
            conditions_changed: false,
            decided: Vec::new(),
        }
    }

    pub(super) fn phase(&mut self, phase: EphemeralRunnerPhase) {
        self.fields.phase = (self.current.phase != Some(phase)).then_some(phase);
    }

    /// The phase's reason; `None` clears it.
    pub(super) fn reason(&mut self, reason: Option<PhaseReason>) {
        let unchanged = self.current.reason.as_deref() == reason.map(PhaseReason::as_str);
        self.fields.reason = (!unchanged).then_some(reason);
    }

    /// The phase's message; `None` clears it.
    pub(super) fn message(&mut self, message: Option<String>) {
        let unchanged = self.current.message == message;
        self.fields.message = (!unchanged).then_some(message);
    }

    /// The phase with its reason and message.
    pub(super) fn phase_because(
        &mut self,
        phase: EphemeralRunnerPhase,
        reason: PhaseReason,
        message: impl Into<String>,
    ) {
        self.phase(phase);
        self.reason(Some(reason));
        self.message(Some(message.into()));
    }

    pub(super) fn ready(&mut self, ready: bool) {
        self.fields.ready = (self.current.ready != ready).then_some(ready);
    }

    /// The runner container's exit code and termination reason.
    pub(super) fn exit(&mut self, code: i32, reason: &str) {
        self.fields.exit_code = (self.current.exit_code != Some(code)).then_some(code);
        let unchanged = self.current.termination_reason.as_deref() == Some(reason);
        self.fields.termination_reason = (!unchanged).then(|| reason.to_owned());
    }

    pub(super) fn failures(&mut self, failures: BTreeMap<String, Time>) {
        let unchanged = written_alike(&failures, &self.current.failures);
        self.fields.failures = (!unchanged).then_some(failures);
    }

    pub(super) fn held_since(&mut self, at: Timestamp) {
        let since = Some(Time(at));
        let unchanged = written_alike(&since, &self.current.held_since);
        self.fields.held_since = since.filter(|_| !unchanged);
    }

    pub(super) fn hold_until(&mut self, at: Timestamp) {
        let until = Some(Time(at));
        let unchanged = written_alike(&until, &self.current.hold_until);
        self.fields.hold_until = until.filter(|_| !unchanged);
    }

    pub(super) fn hold_cause(&mut self, cause: HoldCause) {
        self.fields.hold_cause = (self.current.hold_cause != Some(cause)).then_some(cause);
    }

    /// Clears the listener's job record with the next write, if there is
    /// one (see `Self::into_change`).
    pub(super) fn clear_job_record(&mut self) {
        self.cleared_job = Some(ClearedJobRecord::of(&self.current));
    }

    /// Sets condition `R::CONDITION` with `reason` as of `now`.
    pub(super) fn condition<R: ConditionReason>(
        &mut self,
        reason: R,
        message: &str,
        now: Timestamp,
    ) {
        self.decided.push(R::CONDITION);
        if conditions::set(&mut self.conditions, setting(reason, message), now) {
            self.conditions_changed = true;
        }
    }

    /// Records the registration of a Secret as the runner's: its id and
    /// name, and `Registered` True, unless this pass already decided what
    /// became of it (a runner that ended before its first status write).
    pub(super) fn record_registration(
        &mut self,
        runner_id: i64,
        runner_name: &str,
        now: Timestamp,
    ) {
        self.fields.runner_id = (self.current.runner_id != runner_id).then_some(runner_id);
        let unchanged = self.current.runner_name.as_deref() == Some(runner_name);
        self.fields.runner_name = (!unchanged).then(|| runner_name.to_owned());
        if !self.decided.contains(&RunnerCondition::Registered) {
            self.condition(
                RegisteredReason::JitConfigCreated,
                &format!("registered as runner {runner_id}"),
                now,
            );
        }
    }

    /// Whether anything is to be written.
    pub(super) fn changes(&self) -> bool {
        self.conditions_changed || !self.fields.is_empty()
    }

    /// The status as it will be once the change is written.
    pub(super) fn projected(&self) -> EphemeralRunnerStatus {
        let mut status = self.fields.written_over(&self.current);
        if self.conditions_changed {
            status.conditions.clone_from(&self.conditions);
        }
        status
    }

    /// The write, if any; `resource_version` is the runner's as read.
    ///
    /// A change that clears the job record (of the registration before) is
    /// made conditional on the runner being as read: the listener may have
    /// recorded this registration's job since, and a blind clear would
    /// erase it (a busy runner would look idle). A conflict only means the
    /// next pass decides on what is there now.
    pub(super) fn into_change(mut self, resource_version: Option<&str>) -> Option<StatusChange> {
        if self.conditions_changed {
            self.fields.conditions = Some(self.conditions);
        }
        if self.fields.is_empty() {
            return None;
        }
        let metadata = self.cleared_job.map(|_| Precondition {
            resource_version: resource_version.map(str::to_owned),
        });
        self.fields.cleared_job = self.cleared_job;
        Some(StatusChange {
            metadata,
            status: self.fields,
        })
    }
}

impl StatusChange {
    /// Whether the change only informs: the pod started or is still
    /// starting (phase Pending or Running, its reason and message cleared)
    /// and whether it is ready, nothing else. No decision reads those (see
    /// [`crate::controllers::kit::budget`]), so such a write is made as the
    /// host's budget allows.
    pub fn informs_only(&self) -> bool {
        let s = &self.status;
        let informing = StatusFields {
            phase: s.phase,
            reason: s.reason.filter(Option::is_none),
            message: s.message.clone().filter(Option::is_none),
            ready: s.ready,
            ..StatusFields::default()
        };
        self.metadata.is_none()
            && matches!(
                s.phase,
                None | Some(EphemeralRunnerPhase::Pending | EphemeralRunnerPhase::Running)
            )
            && informing == *s
    }
}

/// What the write that records a registration after the first says
/// besides the registration (see `Step::Register`): the runner starts over
/// as Pending, not ready, and not yet seen online.
#[derive(Clone, Debug, PartialEq)]
pub struct RegistrationRecord {
    /// The conditions as they were, without `Registered` and
    /// `RunnerOnline`: both are about the registration before.
    conditions: Vec<Condition>,
    /// When the registration was decided on.
    at: Timestamp,
}

impl RegistrationRecord {
    pub(super) fn new(status: &EphemeralRunnerStatus, at: Timestamp) -> Self {
        let mut conditions = status.conditions.clone();
        conditions.retain(|c| {
            c.type_ != RunnerCondition::Registered.as_str()
                && c.type_ != RunnerCondition::RunnerOnline.as_str()
        });
        Self { conditions, at }
    }

    /// The write recording registration `runner_id`, named `runner_name`.
    pub fn change(&self, runner_id: i64, runner_name: &str) -> StatusChange {
        let mut conditions = self.conditions.clone();
        conditions::set(
            &mut conditions,
            setting(
                RegisteredReason::JitConfigCreated,
                &format!("registered as runner {runner_id}"),
            ),
            self.at,
        );
        StatusChange {
            metadata: None,
            status: StatusFields {
                runner_id: Some(runner_id),
                runner_name: Some(runner_name.to_owned()),
                phase: Some(EphemeralRunnerPhase::Pending),
                ready: Some(false),
                conditions: Some(conditions),
                ..StatusFields::default()
            },
        }
    }
}
