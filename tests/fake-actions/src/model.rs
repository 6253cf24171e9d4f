//! The vocabulary tests use to drive and inspect the fake: job specs, faults,
//! the registration ledger and the call counters.
//!
//! These types cross the in-process API and the JSON control API unchanged,
//! so a demo script and a Rust test describe the same job the same way.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::endpoint::Endpoint;

/// Jobs to enqueue, as if `count` workflow jobs with these `runs-on` labels
/// had been triggered.
///
/// A job goes to the first scale set (lowest id) whose labels include all of
/// the job's labels, which is how the service matches `runs-on`; a job that
/// no scale set matches waits until one is created or relabelled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct JobSpec {
    /// How many identical jobs.
    pub count: u32,
    /// The job's `runs-on` labels; empty matches any scale set.
    pub labels: Vec<String>,
    /// How long a runner works on the job once it has started it.
    #[serde(rename = "duration_ms", with = "millis")]
    pub duration: Duration,
    /// How the job ends when its runner finishes it.
    pub outcome: JobOutcome,
    /// `owner/repo` shown in the job messages; defaults to the scale set's
    /// configuration owner and a repository named `app`.
    pub repository: Option<String>,
}

impl Default for JobSpec {
    fn default() -> Self {
        JobSpec {
            count: 1,
            labels: Vec::new(),
            duration: Duration::from_secs(1),
            outcome: JobOutcome::Succeeded,
            repository: None,
        }
    }
}

impl JobSpec {
    /// `count` jobs with `labels`, lasting a second each and succeeding.
    pub fn new(count: u32, labels: &[&str]) -> Self {
        JobSpec {
            count,
            labels: labels.iter().map(|l| (*l).to_owned()).collect(),
            ..JobSpec::default()
        }
    }

    /// The same jobs, lasting `duration` once started.
    pub fn lasting(mut self, duration: Duration) -> Self {
        self.duration = duration;
        self
    }

    /// The same jobs, ending with `outcome`.
    pub fn ending(mut self, outcome: JobOutcome) -> Self {
        self.outcome = outcome;
        self
    }
}

/// How a job ends when its runner completes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobOutcome {
    /// The job's steps passed.
    Succeeded,
    /// A step failed; the runner still exits 0, as a real runner does.
    Failed,
    /// The workflow run was cancelled while the job ran.
    Cancelled,
}

impl JobOutcome {
    /// The `result` the service reports in `JobCompleted`.
    pub fn result(self) -> &'static str {
        match self {
            JobOutcome::Succeeded => "succeeded",
            JobOutcome::Failed => "failed",
            JobOutcome::Cancelled => "canceled",
        }
    }
}

/// What the service does with a job whose runner vanished (its pod was killed
/// or its registration removed) before the job finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VanishedJobPolicy {
    /// Report the job cancelled to the scale set and offer it again as
    /// available, up to three times, as the service does; then cancel it.
    Requeue,
    /// Cancel the job for good.
    Cancel,
}

/// How often the service offers one job again after cancelling it, before it
/// gives up and leaves it cancelled (the scaleset README's "up to 3 times").
///
/// One budget per job, whatever the cancellations were for: a runner that
/// vanished with the job, or no runner of the scale set taking it within the
/// assignment timeout.
pub const MAX_REQUEUES: u32 = 3;

/// The service behaviour a test may change while the fake runs, through
/// [`Control::settings`](crate::Control::settings) or `PATCH /_fake/settings`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeSettings {
    /// How long a job assigned to a scale set (`JobAssigned`) waits for a
    /// runner of the set to take it before the service cancels it
    /// (`JobCompleted` with `canceled`) and offers it again, up to
    /// [`MAX_REQUEUES`] times.
    #[serde(rename = "assignment_timeout_ms", with = "millis")]
    pub assignment_timeout: Duration,
}

/// A change to [`RuntimeSettings`]: absent fields are left alone, unknown
/// ones are refused so that a misspelt knob is an error rather than a no-op.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SettingsPatch {
    /// A new [`RuntimeSettings::assignment_timeout`], in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assignment_timeout_ms: Option<u64>,
}

impl SettingsPatch {
    /// `settings` with this patch applied.
    pub fn apply(self, mut settings: RuntimeSettings) -> RuntimeSettings {
        if let Some(ms) = self.assignment_timeout_ms {
            settings.assignment_timeout = Duration::from_millis(ms);
        }
        settings
    }
}

/// A misbehaviour to inject into the next `times` calls of one endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fault {
    /// Which endpoint misbehaves.
    pub endpoint: Endpoint,
    /// How it misbehaves.
    pub kind: FaultKind,
    /// How many calls in a row are affected; each call consumes one.
    pub times: u32,
}

impl Fault {
    /// The next `times` calls to `endpoint` misbehave as `kind`.
    pub fn new(endpoint: Endpoint, kind: FaultKind, times: u32) -> Self {
        Fault {
            endpoint,
            kind,
            times,
        }
    }
}

/// How an injected fault misbehaves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum FaultKind {
    /// Answer with this status and an error body, without doing the work.
    Status {
        /// The HTTP status, e.g. 500, 502, 429.
        status: u16,
        /// A `Retry-After` header, in seconds, as rate limits carry.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_after_secs: Option<u64>,
    },
    /// Wait this long, then handle the call normally.
    Delay {
        /// The delay in milliseconds.
        millis: u64,
    },
    /// Close the connection without any response, as a dropped TCP
    /// connection or a crashed proxy would.
    Reset,
    /// Do the work, then send the status, the headers and the first half of
    /// the body (with the whole body's `Content-Length`) and close the
    /// connection: an answer cut off by a proxy or a dying load balancer.
    /// Unlike the faults above, the call's effect is committed, so a
    /// client that gives up on it must find what it did later (a runner
    /// registered whose id it never read).
    Truncate,
    /// Do the work, then wait this long before answering: slower than the
    /// client's timeout, the effect is committed and the answer lost.
    LateAnswer {
        /// The wait in milliseconds.
        millis: u64,
    },
}

impl FaultKind {
    /// An error status with no `Retry-After`.
    pub fn status(status: u16) -> Self {
        FaultKind::Status {
            status,
            retry_after_secs: None,
        }
    }

    /// A 429 Too Many Requests, optionally telling the client when to retry.
    pub fn rate_limited(retry_after_secs: Option<u64>) -> Self {
        FaultKind::Status {
            status: 429,
            retry_after_secs,
        }
    }

    /// A delay before normal handling.
    pub fn delay(delay: Duration) -> Self {
        FaultKind::Delay {
            millis: u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
        }
    }

    /// Normal handling, answered after `delay`.
    pub fn late_answer(delay: Duration) -> Self {
        FaultKind::LateAnswer {
            millis: u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
        }
    }
}

/// The registration ledger: what happened to runners and jobs, for tests to
/// check that nothing leaked and nothing was lost.
///
/// Invariants the fake keeps (and its tests check under concurrency):
/// `runners_created == runners_removed + still_registered`, where
/// `runners_removed == removed_by_api + self_deregistered + removed_with_scale_set`;
/// `jobs_enqueued == jobs_succeeded + jobs_failed + jobs_cancelled + jobs_unfinished`;
/// and every cancellation by the service is either requeued or final:
/// `jobs_cancelled_runner_vanished + jobs_cancelled_unclaimed == jobs_requeued +`
/// (the part of `jobs_cancelled` that was not the job's own outcome).
///
/// Fields added later default to zero when an older ledger is read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Ledger {
    /// Runner registrations created by `generatejitconfig`.
    pub runners_created: u64,
    /// Registrations gone, for any reason.
    pub runners_removed: u64,
    /// Removed by `DELETE agents/{id}` while registered.
    pub removed_by_api: u64,
    /// Removed by the runner itself after finishing its job, as ephemeral runners do.
    pub self_deregistered: u64,
    /// Removed because their scale set was deleted.
    pub removed_with_scale_set: u64,
    /// Registrations that exist now.
    pub still_registered: u64,
    /// `DELETE agents/{id}` calls for a runner that was already gone (answered 204).
    pub remove_calls_for_absent_runners: u64,
    /// `DELETE agents/{id}` calls refused with `JobStillRunningException`.
    pub remove_calls_refused_job_running: u64,
    /// `generatejitconfig` calls refused because the name was taken.
    pub duplicate_runner_names: u64,
    /// Jobs enqueued through the control API.
    pub jobs_enqueued: u64,
    /// Jobs whose runner completed them with the `succeeded` result.
    pub jobs_succeeded: u64,
    /// Jobs whose runner completed them with the `failed` result.
    pub jobs_failed: u64,
    /// Jobs that ended cancelled: by their spec, or for good after the
    /// service cancelled them more often than it requeues a job.
    pub jobs_cancelled: u64,
    /// Jobs not finished yet, in any state.
    pub jobs_unfinished: u64,
    /// Times a job was cancelled because the runner holding it vanished: its
    /// pod was killed mid-job, or its registration was removed while the job
    /// was assigned but not started. This is the race seed 001 is about.
    pub jobs_cancelled_runner_vanished: u64,
    /// Times a job assigned to a scale set was cancelled because no runner
    /// of the set took it within the assignment timeout: the listener did
    /// not scale up for it, or its runners never came online.
    pub jobs_cancelled_unclaimed: u64,
    /// Times a cancelled job (runner vanished, or unclaimed) was offered
    /// again instead of cancelled for good.
    pub jobs_requeued: u64,
}

/// Calls to one endpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointCount {
    /// Every request routed to the endpoint, including faulted ones.
    pub calls: u64,
    /// Requests answered by an injected fault instead of normal handling
    /// (delays count here too, although the call then proceeds).
    pub faults: u64,
}

/// Call counts of every endpoint, by stable name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Counters(pub BTreeMap<Endpoint, EndpointCount>);

impl Counters {
    /// Requests routed to `endpoint`.
    pub fn calls(&self, endpoint: Endpoint) -> u64 {
        self.0.get(&endpoint).map_or(0, |c| c.calls)
    }

    /// Requests to `endpoint` that met an injected fault.
    pub fn faults(&self, endpoint: Endpoint) -> u64 {
        self.0.get(&endpoint).map_or(0, |c| c.faults)
    }

    /// Requests to any endpoint.
    pub fn total_calls(&self) -> u64 {
        self.0.values().map(|c| c.calls).sum()
    }
}

/// Every message session the service held and every job acquisition, so a
/// test can say who listened for a scale set when: two listeners for one
/// set (a leader that did not step down) show as overlapping sessions or as
/// conflicts, and a job acquired by a listener that should have stopped
/// shows as an acquisition through its session.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionHistory {
    /// Every session ever created, oldest first.
    pub sessions: Vec<SessionRecord>,
    /// Session creations refused because the set had a live session.
    pub conflicts: Vec<SessionConflict>,
    /// Every `acquirejobs` call that acquired at least one job.
    pub acquisitions: Vec<Acquisition>,
}

impl SessionHistory {
    /// The sessions of one scale set, oldest first.
    pub fn of_scale_set(&self, scale_set_id: u64) -> impl Iterator<Item = &SessionRecord> {
        self.sessions
            .iter()
            .filter(move |s| s.scale_set_id == scale_set_id)
    }

    /// The session `id`.
    pub fn session(&self, id: &str) -> Option<&SessionRecord> {
        self.sessions.iter().find(|s| s.id == id)
    }
}

/// One message session's life.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRecord {
    /// The session id.
    pub id: String,
    /// Its scale set.
    pub scale_set_id: u64,
    /// The `ownerName` its creator gave.
    pub owner: String,
    /// When it was created.
    pub created: SystemTime,
    /// How many message polls it received.
    pub polls: u64,
    /// When its last poll began.
    pub last_poll: Option<SystemTime>,
    /// When it was deleted or expired; `None` while it lives.
    pub ended: Option<SystemTime>,
}

/// A session creation refused with 409 because another lived.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionConflict {
    /// When.
    pub at: SystemTime,
    /// The scale set.
    pub scale_set_id: u64,
    /// The `ownerName` of the refused creator.
    pub owner: String,
}

/// Jobs acquired through one session's queue token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Acquisition {
    /// When.
    pub at: SystemTime,
    /// The session whose token made the call.
    pub session: String,
    /// The jobs acquired.
    pub jobs: Vec<u64>,
}

/// Where a job is in its life, as the control API reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobPhase {
    /// No scale set matches its labels yet.
    Queued,
    /// Offered to a scale set (`JobAvailable`), not acquired.
    Available,
    /// Acquired by the scale set's listener, held back by the service because
    /// the set already has as many jobs as its listener's last
    /// `X-ScaleSetMaxCapacity` allows; assigned to the set when one ends.
    Held,
    /// Acquired and assigned to the scale set (`JobAssigned` sent), waiting
    /// for an online idle runner of the set; cancelled and offered again if
    /// none takes it within the assignment timeout.
    Acquired,
    /// Handed to a runner of the set (it came online) that has not started it.
    Assigned,
    /// Being run by its runner.
    Running,
    /// Over; see the result.
    Finished,
}

/// One job as the control API reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSnapshot {
    /// The job's `runnerRequestId`.
    pub id: u64,
    /// Its `runs-on` labels.
    pub labels: Vec<String>,
    /// Where it is.
    pub phase: JobPhase,
    /// The scale set it was offered to, if any.
    pub scale_set_id: Option<u64>,
    /// The runner it is assigned to or ran on, if any.
    pub runner_id: Option<u64>,
    /// `succeeded`, `failed` or `canceled` once finished.
    pub result: Option<String>,
    /// Times it was requeued after its runner vanished.
    pub requeues: u32,
}

/// The most job messages [`JobHistory`] keeps: a long demo keeps its
/// newest, and the memory stays bounded (a message is about 600 bytes).
pub const HISTORY_LIMIT: usize = 100_000;

/// Every job message the service posted to a scale set's queue, oldest
/// first: what a listener of each set was told and when, for a recording of
/// the traffic (`arcwright recording from-history`) made without one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobHistory {
    /// Messages left out, the oldest, past [`HISTORY_LIMIT`].
    pub dropped: u64,
    /// The messages kept.
    pub messages: Vec<PostedMessage>,
}

/// One job message as posted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PostedMessage {
    /// When it was posted, RFC 3339.
    pub at: String,
    /// The scale set it was posted to.
    pub scale_set_id: u64,
    /// The message as the queue delivers it (`messageType`,
    /// `runnerRequestId`, the times, ...).
    pub message: serde_json::Value,
}

/// One registered runner as the control API reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunnerSnapshot {
    /// The runner id.
    pub id: u64,
    /// The runner name (the EphemeralRunner's name, for arcwright).
    pub name: String,
    /// Its scale set.
    pub scale_set_id: u64,
    /// Whether it has presented its JIT config and not vanished since.
    pub online: bool,
    /// The job it holds, assigned or running.
    pub job_id: Option<u64>,
}

/// One scale set as the control API reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScaleSetSnapshot {
    /// The scale set id.
    pub id: u64,
    /// Its name.
    pub name: String,
    /// Its runner group.
    pub runner_group_id: u64,
    /// Its label names.
    pub labels: Vec<String>,
    /// Whether a listener holds its message session.
    pub session_active: bool,
    /// The `X-ScaleSetMaxCapacity` of the listener's last message poll: at
    /// most this many jobs are assigned to the set at once. `None` until a
    /// poll carries the header, and then unbounded.
    #[serde(default)]
    pub max_capacity: Option<u64>,
    /// The statistics a listener would get now.
    pub statistics: crate::state::Statistics,
}

/// A [`Duration`] as whole milliseconds in JSON.
pub(crate) mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_spec_json_uses_milliseconds_and_defaults() {
        let spec: JobSpec =
            serde_json::from_str(r#"{"count":3,"labels":["gpu"],"duration_ms":250}"#).unwrap();
        assert_eq!(spec.count, 3);
        assert_eq!(spec.duration, Duration::from_millis(250));
        assert_eq!(spec.outcome, JobOutcome::Succeeded);
        let back = serde_json::to_value(&spec).unwrap();
        assert_eq!(back["duration_ms"], 250);
    }

    #[test]
    fn a_settings_patch_changes_what_it_names_and_refuses_misspellings() {
        let settings = RuntimeSettings {
            assignment_timeout: Duration::from_secs(60),
        };
        let patch: SettingsPatch =
            serde_json::from_str(r#"{"assignment_timeout_ms":250}"#).unwrap();
        assert_eq!(
            patch.apply(settings).assignment_timeout,
            Duration::from_millis(250)
        );
        let empty: SettingsPatch = serde_json::from_str("{}").unwrap();
        assert_eq!(empty.apply(settings), settings);
        let error = serde_json::from_str::<SettingsPatch>(r#"{"assignment_timeout":250}"#)
            .unwrap_err()
            .to_string();
        assert!(error.contains("assignment_timeout"), "{error}");
        assert_eq!(
            serde_json::to_value(settings).unwrap(),
            serde_json::json!({"assignment_timeout_ms": 60_000})
        );
    }

    #[test]
    fn fault_json_is_tagged() {
        let fault: Fault = serde_json::from_str(
            r#"{"endpoint":"remove-runner","kind":{"type":"status","status":429,"retry_after_secs":2},"times":2}"#,
        )
        .unwrap();
        assert_eq!(
            fault,
            Fault::new(Endpoint::RemoveRunner, FaultKind::rate_limited(Some(2)), 2)
        );
        let reset: FaultKind = serde_json::from_str(r#"{"type":"reset"}"#).unwrap();
        assert_eq!(reset, FaultKind::Reset);
    }
}
