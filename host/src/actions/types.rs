//! The Actions service's JSON, as it is on the wire.
//!
//! Field names and omission rules follow the Go client's structs
//! (`actions/scaleset` `types.go`) exactly, because the service is .NET and
//! particular: `RunnerSetting` is capitalised, `createdOn` is always sent
//! (Go's zero time when unset), a message `body` is a JSON document inside a
//! JSON string. The conformance tests at the bottom round-trip the shapes
//! from the protocol notes byte-for-byte as JSON values.

use std::fmt;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::auth::Secret;

/// Go's zero `time.Time`, which the service sends and expects for "unset".
const GO_ZERO_TIME: &str = "0001-01-01T00:00:00Z";

/// A runner scale set: the service-side object that jobs are routed to by
/// name and labels.
///
/// The same struct is the body of create and update calls; an update sends
/// only the fields that are set, exactly as the Go client does.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunnerScaleSet {
    /// The service-assigned id; 0 on create.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub id: i64,
    /// The name, which is also the `runs-on` label.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// The runner group the scale set belongs to.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub runner_group_id: i64,
    /// The runner group's name, as the service reports it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub runner_group_name: String,
    /// The labels jobs are matched against.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<Label>,
    /// Runner settings (capitalised on the wire).
    #[serde(rename = "RunnerSetting", default)]
    pub runner_setting: RunnerSetting,
    /// When the scale set was created; `None` is sent as Go's zero time.
    #[serde(with = "go_time", default)]
    pub created_on: Option<Timestamp>,
    /// The URL JIT configs are generated at.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub runner_jit_config_url: String,
    /// Job and runner statistics, when the service includes them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub statistics: Option<RunnerScaleSetStatistic>,
}

impl RunnerScaleSet {
    /// The scale set to create for `name` in a runner group: labelled with
    /// its own name (what `runs-on` matches) and each extra label once, all
    /// of type `System`, with runner self-update disabled because the
    /// runner image pins the version and an update mid-job would be a
    /// restart the controller did not ask for.
    pub fn new(name: impl Into<String>, runner_group_id: i64, extra_labels: &[String]) -> Self {
        let name = name.into();
        let mut labels = vec![Label::system(name.clone())];
        for label in extra_labels {
            let label = label.trim();
            if !label.is_empty() && !labels.iter().any(|l| l.name == label) {
                labels.push(Label::system(label));
            }
        }
        Self {
            name,
            runner_group_id,
            labels,
            runner_setting: RunnerSetting {
                disable_update: true,
                ..RunnerSetting::default()
            },
            ..Self::default()
        }
    }
}

/// One label of a scale set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Label {
    /// `System` for labels the scale set defines.
    #[serde(rename = "type")]
    pub kind: String,
    /// The label.
    pub name: String,
}

impl Label {
    /// A `System` label, the kind scale sets are created with.
    pub fn system(name: impl Into<String>) -> Self {
        Self {
            kind: "System".into(),
            name: name.into(),
        }
    }
}

/// Runner settings of a scale set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunnerSetting {
    /// Runners take one job and are removed.
    #[serde(default, skip_serializing_if = "is_false")]
    pub ephemeral: bool,
    /// The scale set is elastic.
    #[serde(default, skip_serializing_if = "is_false")]
    pub is_elastic: bool,
    /// Runners must not update themselves (the image pins the version).
    #[serde(default, skip_serializing_if = "is_false")]
    pub disable_update: bool,
}

/// The job and runner counts the service reports with every message, and
/// the only numbers scaling should be based on (a message batch holds at
/// most 50 items and jobs can be requeued, so counting messages drifts).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunnerScaleSetStatistic {
    /// Jobs waiting to be acquired.
    #[serde(default)]
    pub total_available_jobs: i64,
    /// Jobs acquired but not yet assigned to a runner.
    #[serde(default)]
    pub total_acquired_jobs: i64,
    /// Jobs assigned to this scale set; what ARC's formula scales on.
    #[serde(default)]
    pub total_assigned_jobs: i64,
    /// Jobs running on a runner.
    #[serde(default)]
    pub total_running_jobs: i64,
    /// Runners registered with the scale set.
    #[serde(default)]
    pub total_registered_runners: i64,
    /// Registered runners running a job.
    #[serde(default)]
    pub total_busy_runners: i64,
    /// Registered runners without a job.
    #[serde(default)]
    pub total_idle_runners: i64,
}

/// A runner group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunnerGroup {
    /// The group id; 1 is the default group.
    pub id: i64,
    /// The group name.
    pub name: String,
    /// How many runners the group holds.
    #[serde(default)]
    pub size: i64,
    /// Whether this is the default group.
    #[serde(rename = "isDefaultGroup", default)]
    pub is_default: bool,
}

/// A runner registration, as the service reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunnerReference {
    /// The runner id.
    pub id: i64,
    /// The runner name (the EphemeralRunner's name).
    pub name: String,
    /// The scale set the runner belongs to; 0 for runners outside any.
    #[serde(default)]
    pub runner_scale_set_id: i64,
    /// `online` once the runner has connected, `offline` before and after;
    /// what tells a runner that never came up from one that did.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub status: String,
    /// Whether the runner is executing a job. Left out when false, as the
    /// service's own answers for idle runners may.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub busy: bool,
}

/// What a runner is asked to be named and where it works.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JitRunnerSetting {
    /// The runner name; unique in the scale set's scope.
    pub name: String,
    /// The runner's work folder; empty for the runner's default.
    #[serde(default)]
    pub work_folder: String,
}

/// A just-in-time runner configuration: the registration, and the encoded
/// configuration the runner starts with.
///
/// The encoded configuration holds the runner's credentials, so `Debug`
/// redacts it (through [`Secret`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JitConfig {
    /// The registration the configuration belongs to.
    pub runner: RunnerReference,
    /// The base64 configuration for `ACTIONS_RUNNER_INPUT_JITCONFIG`.
    #[serde(rename = "encodedJITConfig")]
    pub encoded_jit_config: Secret,
}

/// A message session: the listener's lease on its scale set's queue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunnerScaleSetSession {
    /// The session id (a UUID).
    pub session_id: String,
    /// Who holds the session (the host name, in ARC).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub owner_name: String,
    /// The scale set, as the service sees it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_scale_set: Option<RunnerScaleSet>,
    /// Where messages are long-polled.
    #[serde(default)]
    pub message_queue_url: String,
    /// The bearer token for the queue; it expires and is renewed by a
    /// session refresh.
    #[serde(default)]
    pub message_queue_access_token: Secret,
    /// Statistics at session creation: what a listener scales on before
    /// its first message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub statistics: Option<RunnerScaleSetStatistic>,
}

/// The request body that creates a session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CreateSessionRequest {
    pub(crate) session_id: String,
    pub(crate) owner_name: String,
}

/// A message as the service sends it, with its body still a JSON string.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageEnvelope {
    /// The message id; acknowledged with delete-message and passed back as
    /// `lastMessageId`.
    pub message_id: i64,
    /// Always `RunnerScaleSetJobMessages` for the messages the client knows.
    pub message_type: String,
    /// A JSON array of job messages, serialised into a string.
    #[serde(default)]
    pub body: String,
    /// The statistics at the time of the message.
    #[serde(default)]
    pub statistics: Option<RunnerScaleSetStatistic>,
}

/// The only envelope type the service sends to scale sets.
pub const JOB_MESSAGES_TYPE: &str = "RunnerScaleSetJobMessages";

/// A decoded message: its id, the statistics, and the job messages it
/// carried.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// The message id.
    pub id: i64,
    /// The statistics at the time of the message.
    pub statistics: Option<RunnerScaleSetStatistic>,
    /// The job messages, in the order the service sent them.
    pub jobs: Vec<JobMessage>,
}

impl MessageEnvelope {
    /// Decodes the body. An envelope of another type, or a body that is not
    /// a JSON array of job messages, is an error naming what was wrong.
    pub fn decode(self) -> Result<Message, String> {
        if self.message_type != JOB_MESSAGES_TYPE {
            return Err(format!(
                "message {} has unknown type {:?}",
                self.message_id, self.message_type
            ));
        }
        let jobs: Vec<JobMessage> = if self.body.trim().is_empty() {
            Vec::new()
        } else {
            serde_json::from_str(&self.body).map_err(|e| {
                format!(
                    "the body of message {} is not a list of job messages: {e}",
                    self.message_id
                )
            })?
        };
        Ok(Message {
            id: self.message_id,
            statistics: self.statistics,
            jobs,
        })
    }
}

impl Message {
    /// Encodes the message back into its wire envelope (the fake service and
    /// the conformance tests use this).
    pub fn to_envelope(&self) -> MessageEnvelope {
        MessageEnvelope {
            message_id: self.id,
            message_type: JOB_MESSAGES_TYPE.to_string(),
            body: serde_json::to_string(&self.jobs).unwrap_or_else(|_| "[]".to_string()),
            statistics: self.statistics,
        }
    }
}

/// One item of a message body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "messageType")]
pub enum JobMessage {
    /// A job matching the scale set is waiting; acquire it to claim it.
    JobAvailable {
        /// Where the job can be acquired (informational; the client
        /// acquires through `acquirejobs`).
        #[serde(rename = "acquireJobUrl", default)]
        acquire_job_url: String,
        /// What every job message carries.
        #[serde(flatten)]
        job: JobInfo,
    },
    /// The job was assigned to the scale set.
    JobAssigned {
        /// What every job message carries.
        #[serde(flatten)]
        job: JobInfo,
    },
    /// A runner started the job; the runner is busy from now on.
    JobStarted {
        /// The runner running the job.
        #[serde(rename = "runnerId", default)]
        runner_id: i64,
        /// Its name, which is the EphemeralRunner's name.
        #[serde(rename = "runnerName", default)]
        runner_name: String,
        /// What every job message carries.
        #[serde(flatten)]
        job: JobInfo,
    },
    /// The job finished (or was canceled before it started).
    JobCompleted {
        /// `succeeded`, `failed`, `canceled`, …
        #[serde(default)]
        result: String,
        /// The runner that ran the job; 0 if none did.
        #[serde(rename = "runnerId", default)]
        runner_id: i64,
        /// Its name.
        #[serde(rename = "runnerName", default)]
        runner_name: String,
        /// What every job message carries.
        #[serde(flatten)]
        job: JobInfo,
    },
    /// A job message of a type this client does not know. It is kept as a
    /// placeholder, so a new message type from the service does not make a
    /// whole batch unreadable.
    #[serde(other)]
    Unknown,
}

impl JobMessage {
    /// The job fields, for every known message type.
    pub fn job(&self) -> Option<&JobInfo> {
        match self {
            Self::JobAvailable { job, .. }
            | Self::JobAssigned { job }
            | Self::JobStarted { job, .. }
            | Self::JobCompleted { job, .. } => Some(job),
            Self::Unknown => None,
        }
    }
}

/// The fields every job message carries.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobInfo {
    /// The id acquire-jobs takes.
    #[serde(default)]
    pub runner_request_id: i64,
    /// The repository (without owner).
    #[serde(default)]
    pub repository_name: String,
    /// The repository owner.
    #[serde(default)]
    pub owner_name: String,
    /// The job id.
    #[serde(default)]
    pub job_id: String,
    /// `owner/repo/.github/workflows/x.yml@ref`.
    #[serde(default)]
    pub job_workflow_ref: String,
    /// The job's display name.
    #[serde(default)]
    pub job_display_name: String,
    /// The workflow run.
    #[serde(default)]
    pub workflow_run_id: i64,
    /// The event that triggered the run.
    #[serde(default)]
    pub event_name: String,
    /// The job's `runs-on` labels.
    #[serde(default)]
    pub request_labels: Vec<String>,
    /// When the job was queued.
    #[serde(default, with = "go_time_opt", skip_serializing_if = "Option::is_none")]
    pub queue_time: Option<Timestamp>,
    /// When the job was assigned to the scale set.
    #[serde(default, with = "go_time_opt", skip_serializing_if = "Option::is_none")]
    pub scale_set_assign_time: Option<Timestamp>,
    /// When a runner was assigned.
    #[serde(default, with = "go_time_opt", skip_serializing_if = "Option::is_none")]
    pub runner_assign_time: Option<Timestamp>,
    /// When the job finished.
    #[serde(default, with = "go_time_opt", skip_serializing_if = "Option::is_none")]
    pub finish_time: Option<Timestamp>,
}

/// `{"count": n, "value": [...]}`, the service's list envelope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ListResponse<T> {
    #[serde(default)]
    pub(crate) count: usize,
    #[serde(default = "Vec::new")]
    pub(crate) value: Vec<T>,
}

fn is_zero(v: &i64) -> bool {
    *v == 0
}

fn is_false(v: &bool) -> bool {
    !*v
}

fn parse_time<E: serde::de::Error>(s: &str) -> Result<Option<Timestamp>, E> {
    if s.is_empty() || s == GO_ZERO_TIME || s.starts_with("0001-01-01T00:00:00") {
        return Ok(None);
    }
    s.parse::<Timestamp>().map(Some).map_err(E::custom)
}

/// `createdOn`: always present on the wire, Go's zero time meaning unset.
mod go_time {
    use super::*;

    pub(super) fn serialize<S: serde::Serializer>(
        t: &Option<Timestamp>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => s.collect_str(t),
            None => s.serialize_str(GO_ZERO_TIME),
        }
    }

    pub(super) fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Timestamp>, D::Error> {
        let s: Option<String> = Option::deserialize(d)?;
        match s {
            Some(s) => parse_time(&s),
            None => Ok(None),
        }
    }
}

/// Job message times: omitted when unset, Go's zero time read as unset.
mod go_time_opt {
    use super::*;

    pub(super) fn serialize<S: serde::Serializer>(
        t: &Option<Timestamp>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => s.collect_str(t),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Timestamp>, D::Error> {
        super::go_time::deserialize(d)
    }
}

impl fmt::Display for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.kind, self.name)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    /// Decodes `wire` into `T`, encodes it again, and requires the same JSON
    /// value back.
    fn round_trip<T: Serialize + for<'de> Deserialize<'de>>(wire: &str) -> T {
        let typed: T = serde_json::from_str(wire).unwrap_or_else(|e| panic!("decode {wire}: {e}"));
        let back = serde_json::to_value(&typed).unwrap();
        let original: Value = serde_json::from_str(wire).unwrap();
        assert_eq!(back, original, "round trip changed the JSON");
        typed
    }

    #[test]
    fn scale_set_round_trips_with_capitalised_runner_setting() {
        let wire = r#"{"id":42,"name":"my-set","runnerGroupId":1,"runnerGroupName":"Default",
            "labels":[{"type":"System","name":"my-set"},{"type":"System","name":"gpu"}],
            "RunnerSetting":{"disableUpdate":true},
            "createdOn":"2026-01-01T00:00:00Z",
            "runnerJitConfigUrl":"https://pipelines.example/_apis/runtime/runnerscalesets/42/generatejitconfig",
            "statistics":{"totalAvailableJobs":1,"totalAcquiredJobs":2,"totalAssignedJobs":3,"totalRunningJobs":4,
                          "totalRegisteredRunners":5,"totalBusyRunners":6,"totalIdleRunners":7}}"#;
        let set: RunnerScaleSet = round_trip(wire);
        assert!(set.runner_setting.disable_update);
        assert_eq!(set.labels[1], Label::system("gpu"));
        let stats = set.statistics.unwrap();
        assert_eq!(
            (
                stats.total_available_jobs,
                stats.total_acquired_jobs,
                stats.total_assigned_jobs,
                stats.total_running_jobs
            ),
            (1, 2, 3, 4)
        );
        assert_eq!(
            (
                stats.total_registered_runners,
                stats.total_busy_runners,
                stats.total_idle_runners
            ),
            (5, 6, 7)
        );
    }

    #[test]
    fn a_new_scale_set_is_labelled_with_its_name_and_each_extra_label_once() {
        let extra = [
            "gpu".to_string(),
            " ".to_string(),
            "my-set".to_string(),
            "gpu".to_string(),
        ];
        let set = RunnerScaleSet::new("my-set", 3, &extra);
        assert_eq!(
            serde_json::to_value(&set).unwrap(),
            json!({"name":"my-set","runnerGroupId":3,
                   "labels":[{"type":"System","name":"my-set"},{"type":"System","name":"gpu"}],
                   "RunnerSetting":{"disableUpdate":true},"createdOn":"0001-01-01T00:00:00Z"})
        );
    }

    #[test]
    fn partial_update_sends_what_the_go_client_sends() {
        let update = RunnerScaleSet {
            runner_group_id: 3,
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(&update).unwrap(),
            json!({"runnerGroupId":3,"RunnerSetting":{},"createdOn":"0001-01-01T00:00:00Z"})
        );
        let _: RunnerScaleSet = round_trip(
            r#"{"runnerGroupId":3,"RunnerSetting":{},"createdOn":"0001-01-01T00:00:00Z"}"#,
        );
    }

    #[test]
    fn message_envelope_body_is_a_json_string() {
        let wire = r#"{"messageId":7,"messageType":"RunnerScaleSetJobMessages",
 "statistics":{"totalAvailableJobs":0,"totalAcquiredJobs":1,"totalAssignedJobs":1,"totalRunningJobs":0,
               "totalRegisteredRunners":0,"totalBusyRunners":0,"totalIdleRunners":0},
 "body":"[{\"messageType\":\"JobAvailable\",\"runnerRequestId\":1001,\"acquireJobUrl\":\"…\",\"repositoryName\":\"repo\",\"ownerName\":\"org\",\"jobId\":\"a1\",\"jobWorkflowRef\":\"org/repo/.github/workflows/ci.yml@refs/heads/main\",\"jobDisplayName\":\"build\",\"workflowRunId\":55,\"eventName\":\"push\",\"requestLabels\":[\"my-set\"],\"queueTime\":\"2026-01-01T00:00:00Z\"}]"}"#;
        let envelope: MessageEnvelope = round_trip(wire);
        let body_before: Value = serde_json::from_str(&envelope.body).unwrap();
        let message = envelope.clone().decode().unwrap();
        assert_eq!(message.id, 7);
        assert_eq!(message.statistics.unwrap().total_assigned_jobs, 1);
        let [
            JobMessage::JobAvailable {
                acquire_job_url,
                job,
            },
        ] = message.jobs.as_slice()
        else {
            panic!("unexpected {:?}", message.jobs)
        };
        assert_eq!(acquire_job_url, "…");
        assert_eq!(job.runner_request_id, 1001);
        assert_eq!(job.request_labels, ["my-set"]);
        assert_eq!(
            job.queue_time,
            Some("2026-01-01T00:00:00Z".parse().unwrap())
        );
        assert_eq!(job.scale_set_assign_time, None);

        // Re-encoding yields the same body JSON inside a string.
        let again = message.to_envelope();
        let body_after: Value = serde_json::from_str(&again.body).unwrap();
        assert_eq!(body_before, body_after);
        // Everything but the body's key order (a string, so compared as JSON
        // above) is identical.
        assert_eq!(
            MessageEnvelope {
                body: envelope.body.clone(),
                ..again
            },
            envelope
        );
    }

    #[test]
    fn every_job_message_type_decodes() {
        let body = json!([
            {"messageType":"JobAssigned","runnerRequestId":1,"jobId":"j1","scaleSetAssignTime":"2026-01-01T00:00:01Z"},
            {"messageType":"JobStarted","runnerRequestId":1,"runnerId":9,"runnerName":"set-abc","runnerAssignTime":"2026-01-01T00:00:02Z"},
            {"messageType":"JobCompleted","runnerRequestId":1,"result":"succeeded","runnerId":9,"runnerName":"set-abc",
             "finishTime":"2026-01-01T00:00:03Z","runnerAssignTime":"0001-01-01T00:00:00Z"},
            {"messageType":"SomethingNew","x":1}
        ]);
        let envelope = MessageEnvelope {
            message_id: 3,
            message_type: JOB_MESSAGES_TYPE.into(),
            body: body.to_string(),
            statistics: None,
        };
        let jobs = envelope.decode().unwrap().jobs;
        assert!(
            matches!(&jobs[0], JobMessage::JobAssigned { job } if job.job_id == "j1" && job.scale_set_assign_time.is_some())
        );
        assert!(
            matches!(&jobs[1], JobMessage::JobStarted { runner_id: 9, runner_name, .. } if runner_name == "set-abc")
        );
        match &jobs[2] {
            JobMessage::JobCompleted { result, job, .. } => {
                assert_eq!(result, "succeeded");
                assert!(job.finish_time.is_some());
                assert_eq!(
                    job.runner_assign_time, None,
                    "Go's zero time reads as unset"
                );
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(jobs[3], JobMessage::Unknown);
    }

    #[test]
    fn malformed_envelopes_are_errors() {
        let wrong_type = MessageEnvelope {
            message_id: 1,
            message_type: "Other".into(),
            body: "[]".into(),
            statistics: None,
        };
        assert!(wrong_type.decode().unwrap_err().contains("unknown type"));
        let bad_body = MessageEnvelope {
            message_id: 2,
            message_type: JOB_MESSAGES_TYPE.into(),
            body: "{not json".into(),
            statistics: None,
        };
        assert!(bad_body.decode().unwrap_err().contains("message 2"));
    }

    #[test]
    fn jit_config_session_and_runner_shapes_round_trip() {
        let jit: JitConfig = round_trip(
            r#"{"runner":{"id":123,"name":"x","runnerScaleSetId":42},"encodedJITConfig":"ZW5jb2RlZA=="}"#,
        );
        assert_eq!(jit.encoded_jit_config.expose(), "ZW5jb2RlZA==");
        assert!(!format!("{jit:?}").contains("ZW5jb2RlZA=="));

        let session: RunnerScaleSetSession = round_trip(
            r#"{"sessionId":"6f1c1b1e-0000-4000-8000-000000000001","ownerName":"host-1",
                "runnerScaleSet":{"id":42,"name":"my-set","RunnerSetting":{},"createdOn":"0001-01-01T00:00:00Z"},
                "messageQueueUrl":"https://broker.example/queue/1","messageQueueAccessToken":"queue-secret",
                "statistics":{"totalAvailableJobs":0,"totalAcquiredJobs":0,"totalAssignedJobs":2,"totalRunningJobs":0,
                              "totalRegisteredRunners":0,"totalBusyRunners":0,"totalIdleRunners":0}}"#,
        );
        assert_eq!(session.statistics.unwrap().total_assigned_jobs, 2);
        assert!(!format!("{session:?}").contains("queue-secret"));

        let _: CreateSessionRequest = round_trip(
            r#"{"sessionId":"00000000-0000-0000-0000-000000000000","ownerName":"host-1"}"#,
        );
        let _: ListResponse<RunnerGroup> = round_trip(
            r#"{"count":1,"value":[{"id":2,"name":"n","size":0,"isDefaultGroup":false}]}"#,
        );
        let _: ListResponse<RunnerReference> =
            round_trip(r#"{"count":1,"value":[{"id":5,"name":"r","runnerScaleSetId":42}]}"#);
        let _: ListResponse<i64> = round_trip(r#"{"count":2,"value":[1001,1002]}"#);
        let _: JitRunnerSetting = round_trip(r#"{"name":"set-runner-abc","workFolder":"/work"}"#);
    }
}
