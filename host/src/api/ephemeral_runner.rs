//! `EphemeralRunner`: one runner, its registration, its JIT config Secret and
//! its pod; the names its status is written with (phase reasons, condition
//! types and their reasons, event reasons), and the debug hold's arithmetic
//! ([`hold`]).
//!
//! The names are enums rather than strings so that what the controller
//! writes and what it reads back are the same words by construction: a
//! misspelt reason does not compile, and a state is read from a
//! condition's reason by parsing it ([`EphemeralRunnerStatus::reason_of`]),
//! never by comparing free strings or splitting a message.

pub mod hold;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::shared::{
    DURATION_PATTERN, DebugSpec, GitHubServerTls, PolicyRefs, ProxySpec, ResourceMeta,
    pod_spec_schema,
};

/// One ephemeral runner: registered once with the Actions service, run in one
/// pod at a time, removed from the service before its pod goes.
///
/// As in ARC, the pod template is inlined: `spec.metadata` and `spec.spec`
/// are the runner pod's metadata and spec.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "arcwright.dev",
    version = "v1alpha1",
    kind = "EphemeralRunner",
    namespaced,
    status = "EphemeralRunnerStatus",
    shortname = "ephr",
    category = "arcwright",
    category = "runners",
    printcolumn = r#"{"name":"GitHub Config URL","type":"string","jsonPath":".spec.githubConfigUrl"}"#,
    printcolumn = r#"{"name":"RunnerId","type":"integer","jsonPath":".status.runnerId"}"#,
    printcolumn = r#"{"name":"Status","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"JobRepository","type":"string","jsonPath":".status.jobRepositoryName"}"#,
    printcolumn = r#"{"name":"Hold Until","type":"string","jsonPath":".status.holdUntil"}"#,
    printcolumn = r#"{"name":"JobWorkflowRef","type":"string","jsonPath":".status.jobWorkflowRef","priority":1}"#,
    printcolumn = r#"{"name":"WorkflowRunId","type":"integer","jsonPath":".status.workflowRunId","priority":1}"#,
    printcolumn = r#"{"name":"JobDisplayName","type":"string","jsonPath":".status.jobDisplayName","priority":1}"#,
    printcolumn = r#"{"name":"Message","type":"string","jsonPath":".status.message","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct EphemeralRunnerSpec {
    /// The enterprise, organisation or repository URL the runner registers with.
    #[schemars(regex(pattern = r"^https?://[^/\s]+(/[^/\s]+){1,2}/?$"))]
    pub github_config_url: String,
    /// The Secret with the GitHub credentials (ARC's keys).
    pub github_config_secret: String,
    /// The scale set the runner registers in.
    #[serde(default)]
    pub runner_scale_set_id: i64,
    /// A proxy to GitHub.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<ProxySpec>,
    /// The Secret holding the proxy settings handed to the runner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_secret_ref: Option<String>,
    /// A private CA for GitHub Enterprise Server.
    #[serde(
        default,
        rename = "githubServerTLS",
        skip_serializing_if = "Option::is_none"
    )]
    pub github_server_tls: Option<GitHubServerTls>,
    /// Extra metadata for the JIT config Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ephemeral_runner_config_secret_metadata: Option<ResourceMeta>,
    /// The policies, as the AutoscalingRunnerSet declared them.
    #[serde(flatten)]
    pub policies: PolicyRefs,
    /// Holding the runner for debugging when its job fails, as the
    /// AutoscalingRunnerSet declared it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debug: Option<DebugSpec>,
    /// The age of its pod past which the runner, while idle, gets a new
    /// registration and pod, as the AutoscalingRunnerSet declared it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub max_idle_age: Option<String>,
    /// How long the runner may take, from its container's start, to be seen
    /// online, as the AutoscalingRunnerSet declared it; omitted, the host's
    /// `--registration-timeout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub registration_timeout: Option<String>,
    /// Whether the runner pod is kept from the cluster autoscaler and
    /// Karpenter while it runs a job, as the AutoscalingRunnerSet declared
    /// it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protect_busy_runners: Option<bool>,
    /// The runner pod's metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<ObjectMeta>,
    /// The runner pod's spec; its runner container is named `runner`.
    #[schemars(schema_with = "pod_spec_schema")]
    pub spec: PodSpec,
}

/// A message posted to Slack: where, and which.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SlackMessage {
    /// The channel's id (`C0123...`), as Slack answered, not the name the
    /// spec may give.
    pub channel: String,
    /// The message's timestamp id (`1700000000.000100`).
    pub ts: String,
}

/// Where a runner is in its life.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum EphemeralRunnerPhase {
    /// Registered or being registered; its pod is not running yet.
    #[default]
    Pending,
    /// Its pod runs.
    Running,
    /// The runner exited 0.
    Succeeded,
    /// The runner failed for good (too many failed starts, a lost job, an
    /// invalid pod).
    Failed,
    /// The runner refused to run because its version is outdated (exit code
    /// 7); the scale set reacts to it.
    Outdated,
    /// Its job failed and it is held for someone to look inside until
    /// `status.holdUntil`: its registration is removed, so it takes no
    /// other job, but its pod is kept. The set does not count it towards
    /// its replicas (a replacement is created) and never deletes it; the
    /// runner's own controller ends the hold (phase Failed, reason
    /// `HoldEnded`) and removes the pod.
    Debugging,
}

impl EphemeralRunnerPhase {
    /// The name used in status and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Running => "Running",
            Self::Succeeded => "Succeeded",
            Self::Failed => "Failed",
            Self::Outdated => "Outdated",
            Self::Debugging => "Debugging",
        }
    }

    /// Succeeded, Failed and Outdated are final (ARC's `IsDone`). Debugging
    /// is not: the hold ends in Failed.
    pub fn is_done(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Outdated)
    }
}

/// What the controller and the listener know about a runner. Never holds the
/// JIT config or any other secret.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EphemeralRunnerStatus {
    /// The phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<EphemeralRunnerPhase>,
    /// A short machine-readable reason for the phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A human-readable message for the phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Whether the runner pod is ready.
    #[serde(default)]
    pub ready: bool,
    /// The registration's id in the Actions service; 0 until registered.
    #[serde(default)]
    pub runner_id: i64,
    /// The registration's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_name: Option<String>,
    /// Failed starts, by pod uid, with when they were seen: the backoff's
    /// bookkeeping.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub failures: BTreeMap<String, Time>,
    /// The runner container's exit code, once it terminated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The runner container's termination reason (`Completed`, `Error`,
    /// `OOMKilled`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_reason: Option<String>,
    /// The job's request id, set by the listener on JobStarted.
    #[serde(default)]
    pub job_request_id: i64,
    /// The registration that ran the job (JobStarted's runner id), set by
    /// the listener with the job. A runner renewed for another job gets a
    /// new registration, so a record that reaches it late, about the job
    /// of its registration before, names an id that is not the runner's:
    /// it is not taken for the runner's job and is cleared. 0 when unknown.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub job_runner_id: i64,
    /// The job's id; set means the runner has a job (ARC's `HasJob`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
    /// `owner/repo` of the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_repository_name: Option<String>,
    /// The workflow reference of the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_workflow_ref: Option<String>,
    /// The workflow run id of the job.
    #[serde(default)]
    pub workflow_run_id: i64,
    /// The job's display name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_display_name: Option<String>,
    /// When the job started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_started_at: Option<Time>,
    /// How the job ended (`succeeded`, `failed`, `canceled`...), set by the
    /// listener on JobCompleted. The runner's exit code says whether the
    /// runner process worked; this says whether the job did, which is what
    /// someone debugging CI cares about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_result: Option<String>,
    /// When the job ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_finished_at: Option<Time>,
    /// The standard conditions: `Registered`, `PolicyFallback`...
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Where a debug hold is counted from: the job's end as the listener
    /// recorded it, or when the failure was seen. The cap (`maxHold`) is
    /// counted from here, so extending cannot move it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_since: Option<Time>,
    /// When the debug hold ends: `holdFailedFor` after the job's end, or
    /// the `arcwright.dev/hold-until` annotation, capped by `maxHold`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_until: Option<Time>,
    /// Why the runner is held for debugging, written with phase
    /// `Debugging`: what the Slack post about the hold says, on every later
    /// pass that posts it again. A runner held by a version that did not
    /// write it reads as [`HoldCause::JobFailed`], which is true of every
    /// hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_cause: Option<HoldCause>,
    /// The Slack message that told of the current hold (its channel id and
    /// timestamp, as Slack answered the post). A button press acts on the
    /// runner only from this message: a press naming the runner from any
    /// other message, another host's, or a forged one, is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slack_message: Option<SlackMessage>,
    /// Set when the EphemeralRunnerSet renewed the runner for another job
    /// after it succeeded (see [`RunnerRenewal`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renewal: Option<RunnerRenewal>,
}

/// What made a runner's job fail, when the runner is held for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum HoldCause {
    /// The listener recorded the job's result as failed.
    JobFailed,
    /// The runner container exited non-zero while it had a job (its code
    /// and reason are the status's `exitCode` and `terminationReason`).
    RunnerExited,
    /// The runner pod failed (evicted, an init container failed) while it
    /// had a job.
    PodFailed,
}

impl HoldCause {
    /// For people: the Slack post and the hold's messages. `exit` is the
    /// runner container's exit code and termination reason, when it
    /// exited.
    pub fn why(self, exit: Option<(i32, &str)>) -> String {
        match (self, exit) {
            (Self::JobFailed, _) => "the job failed".to_owned(),
            (Self::RunnerExited, Some((code, reason))) => {
                format!("the runner exited {code} ({reason}) while running a job")
            }
            (Self::RunnerExited | Self::PodFailed, _) => {
                "the runner pod failed while running a job".to_owned()
            }
        }
    }
}

/// Declares an enum of names written to the API: each variant is written
/// as its own name, and a name read back is parsed into the variant
/// ([`None`] for one this version does not know).
macro_rules! wire_names {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident),* $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant),*
        }

        impl $name {
            /// Every value.
            pub const ALL: &'static [Self] = &[$(Self::$variant),*];

            /// The name written to the API.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => stringify!($variant)),*
                }
            }

            /// The value `text` names, if this version knows it.
            pub fn parse(text: &str) -> Option<Self> {
                Self::ALL.iter().copied().find(|value| value.as_str() == text)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }
    };
}

/// Declares the reasons of one condition: [`wire_names`], and for each
/// reason whether the condition is True with it.
macro_rules! condition_reasons {
    ($(#[$meta:meta])* $name:ident of $condition:ident {
        $($(#[$vmeta:meta])* $variant:ident => $holds:literal),* $(,)?
    }) => {
        wire_names!($(#[$meta])* $name { $($(#[$vmeta])* $variant),* });

        impl ConditionReason for $name {
            const CONDITION: RunnerCondition = RunnerCondition::$condition;

            fn holds(self) -> bool {
                match self {
                    $(Self::$variant => $holds),*
                }
            }

            fn name(self) -> &'static str {
                self.as_str()
            }

            fn from_name(text: &str) -> Option<Self> {
                Self::parse(text)
            }
        }
    };
}

wire_names! {
    /// The conditions of an EphemeralRunner's status.
    RunnerCondition {
        /// Whether the registration of `status.runnerId` exists. It turns
        /// False only on proof (removed, not found, self-deregistered,
        /// never registered) and True when a new JIT config is created.
        Registered,
        /// The service has seen the runner online, so the registration
        /// timeout no longer applies.
        RunnerOnline,
        /// The deregistration policy failed and the bundled default
        /// decided.
        DeregistrationPolicyFallback,
        /// Whether the runner is held for debugging after its job failed,
        /// and if not, why not.
        HeldForDebugging,
        /// Whether Slack accepted the post about the hold (True), or the
        /// last attempt failed (False). Until it is True, every pass of a
        /// held runner asks for the post again: the post is what gets
        /// someone to look before the hold ends, so it must not be lost to
        /// a restart or to Slack being down.
        SlackNotified,
    }
}

/// A reason of one of the runner's conditions. A reason says the
/// condition's status too (a registration `Removed` is False, one whose
/// removal was asked for, `RemoveNow`, still True), so a condition is set
/// from its reason alone, and a reason of one condition cannot be set on
/// another.
pub trait ConditionReason: Copy {
    /// The condition it is a reason of.
    const CONDITION: RunnerCondition;
    /// Whether the condition is True with this reason.
    fn holds(self) -> bool;
    /// The name written to the API.
    fn name(self) -> &'static str;
    /// The reason `text` names, if this version knows it.
    fn from_name(text: &str) -> Option<Self>;
}

condition_reasons! {
    /// The reasons of [`RunnerCondition::Registered`].
    RegisteredReason of Registered {
        /// A JIT config was created: the registration exists.
        JitConfigCreated => true,
        /// Its removal was handed to the pool (`remove-now`).
        RemoveNow => true,
        /// Its removal was handed to the pool, the service to wait for the
        /// job (`remove-after-job`).
        RemoveAfterJob => true,
        /// The service removed it.
        Removed => false,
        /// The service did not know it.
        NotFound => false,
        /// The runner removed it itself (the policy's `self-deregistered`).
        SelfDeregistered => false,
        /// There never was one.
        NeverRegistered => false,
    }
}

condition_reasons! {
    /// The reasons of [`RunnerCondition::RunnerOnline`].
    OnlineReason of RunnerOnline {
        /// The service sees the runner online.
        Online => true,
    }
}

condition_reasons! {
    /// The reasons of [`RunnerCondition::DeregistrationPolicyFallback`].
    PolicyFallbackReason of DeregistrationPolicyFallback {
        /// The configured policy failed; the bundled default decided.
        Fallback => true,
        /// The configured policy decided again.
        PolicyAnswered => false,
    }
}

condition_reasons! {
    /// The reasons of [`RunnerCondition::HeldForDebugging`].
    HeldReason of HeldForDebugging {
        /// Held.
        HeldForDebugging => true,
        /// Not held: the scale set holds `maxHeld` runners already.
        MaxHeld => false,
        /// Not held: the debug spec cannot be followed.
        InvalidDebugSpec => false,
        /// The hold ended.
        HoldEnded => false,
    }
}

condition_reasons! {
    /// The reasons of [`RunnerCondition::SlackNotified`].
    SlackNotifiedReason of SlackNotified {
        /// Slack accepted the post.
        Posted => true,
        /// The last attempt failed; it is made again.
        PostFailed => false,
    }
}

wire_names! {
    /// The reasons of a runner's phase (`status.reason`).
    PhaseReason {
        /// Succeeded: the runner exited 0.
        Completed,
        /// Outdated: the runner exited 7.
        Outdated,
        /// Failed: the runner or its pod failed while it had a job.
        JobFailed,
        /// Failed: the failed starts reached the limit.
        TooManyFailures,
        /// Failed: the pod template has no runner container.
        InvalidTemplate,
        /// Failed: the API server refused the runner pod.
        InvalidPod,
        /// Failed: no EphemeralRunnerSet owns the runner, so none would
        /// count it against its `maxRunners`; it was never registered.
        NotOwned,
        /// Failed: the pod-validation policy the runner names refused its
        /// pod template.
        PodRefused,
        /// Debugging: held after its job failed.
        HeldForDebugging,
        /// Failed: the debug hold ended.
        HoldEnded,
    }
}

wire_names! {
    /// The reasons of the events published on a runner.
    EventReason {
        /// The pool removed the registration, or found it gone.
        RegistrationRemoved,
        /// The pool gave up on a removal for now.
        DeregistrationFailed,
        /// The deregistration policy failed; the bundled default decided.
        PolicyFallback,
        /// The registration's removal was handed to the pool.
        Deregistering,
        /// A pod stuck terminating was deleted with grace 0.
        PodForceDeleted,
        /// The pod template has no runner container.
        InvalidTemplate,
        /// The API server refused the runner pod.
        InvalidPod,
        /// No EphemeralRunnerSet owns the runner: it is not registered.
        NotOwned,
        /// The pod-validation policy refused the runner's pod template.
        PodRefused,
        /// The pod-validation policy cannot judge the runner's pod yet:
        /// none is made.
        PodValidationUnavailable,
        /// The runner exited 7.
        RunnerOutdated,
        /// The runner failed for good.
        RunnerFailed,
        /// A start failed: the pod failed before the runner ran a job.
        RunnerPodFailed,
        /// A start failed: the runner did not come online in time.
        RegistrationTimeout,
        /// The debug spec cannot be followed.
        InvalidDebugSpec,
        /// A failure was not held: `maxHeld` runners are held already.
        NotHeld,
        /// Held for debugging.
        HeldForDebugging,
        /// The hold ended.
        HoldEnded,
        /// An idle runner past `maxIdleAge` is recycled.
        MaxIdleAge,
        /// A registration an earlier attempt left without its Secret was
        /// removed.
        StaleRegistrationRemoved,
        /// Telling Slack of the hold failed; it is tried again.
        SlackNotificationFailed,
    }
}

/// A runner that succeeded, renewed by its set for another job instead of
/// being deleted and replaced by a new runner.
///
/// A one-job runner costs the API server ten writes: the runner, its Secret
/// and its pod created, three status writes, the three deleted, and the
/// finalizer removed. Renewed, the same object and Secret serve the next
/// job: the set resets the status (this write), the runner registers anew
/// into its Secret (an update, not a delete and a create) and gets a new
/// pod, and no runner is created, deleted or finalized; seven writes a job.
/// What stays one-job is what must: every job still runs on a fresh
/// registration, in a fresh pod.
///
/// The set writes the whole status when it renews, so nothing of the job
/// before (phase, registration, job, conditions) survives into the next.
/// The pod and Secret carry the count they were made for
/// (the [`RENEWAL`](super::annotations::RENEWAL) annotation), so those of the job before are never taken for
/// the current one's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunnerRenewal {
    /// How many times the runner was renewed.
    pub count: u32,
    /// The listener's patch id the runner was renewed under; it stands for
    /// the creation annotation's from then on.
    #[serde(rename = "patchID")]
    pub patch_id: i32,
    /// The set's `metadata.generation` the renewal was decided on.
    pub set_generation: i64,
    /// When.
    pub renewed_at: Time,
    /// How the job before ended, when the runner was renewed the moment it
    /// finished, by its own controller, because a job was waiting (see
    /// [`crate::backlog`]): its status never said Succeeded, so the
    /// renewal's one write says how the job before went. Absent when the
    /// set renewed a runner whose status said it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<PreviousJob>,
}

/// How the job before a renewal ended, as the runner's controller saw it
/// (see [`RunnerRenewal::previous`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PreviousJob {
    /// The registration that ran it.
    pub runner_id: i64,
    /// The job's id, if the listener had recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
    /// The job's result, if the listener had recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_result: Option<String>,
    /// The runner container's exit code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// When the runner's controller saw it end.
    pub ended_at: Time,
}

/// The job fields of the status the listener writes (its record of the
/// job a runner took); cleared together when they are about another
/// registration than the runner's (see `EphemeralRunnerStatus::job_runner_id`).
pub const JOB_FIELDS: [&str; 10] = [
    "jobRequestId",
    "jobRunnerId",
    "jobId",
    "jobRepositoryName",
    "jobWorkflowRef",
    "workflowRunId",
    "jobDisplayName",
    "jobStartedAt",
    "jobResult",
    "jobFinishedAt",
];

fn is_zero(value: &i64) -> bool {
    *value == 0
}

impl EphemeralRunnerStatus {
    /// Whether the listener recorded a job for this runner's registration:
    /// a record naming another registration than the status's is of the
    /// runner's job before a renewal (see [`Self::job_runner_id`]).
    pub fn has_job(&self) -> bool {
        let recorded =
            self.job_id.as_deref().is_some_and(|id| !id.is_empty()) || self.job_request_id != 0;
        recorded && self.record_is_current()
    }

    /// Whether the listener recorded the end of this registration's job
    /// (its result): the listener has then seen the job end, and so has any
    /// scaling decision it made since (the set may still be applying an
    /// earlier one, which a record cannot tell).
    pub fn job_ended(&self) -> bool {
        self.job_result.is_some() && self.record_is_current()
    }

    /// Whether the job fields are of this runner's registration, not a late
    /// record of the one before a renewal.
    fn record_is_current(&self) -> bool {
        self.job_runner_id == 0 || self.runner_id == 0 || self.job_runner_id == self.runner_id
    }

    /// How many times the runner was renewed: which pod and Secret are its
    /// current ones.
    pub fn renewals(&self) -> u32 {
        self.renewal.as_ref().map_or(0, |r| r.count)
    }

    /// The condition of `type_`, if any.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }

    /// Whether condition `type_` is True (`Some(true)`), False
    /// (`Some(false)`), or not set (`None`).
    pub fn is_true(&self, type_: RunnerCondition) -> Option<bool> {
        self.condition(type_.as_str()).map(|c| c.status == "True")
    }

    /// The reason condition `R::CONDITION` was last set with, if it is set
    /// with a reason this version knows.
    pub fn reason_of<R: ConditionReason>(&self) -> Option<R> {
        self.condition(R::CONDITION.as_str())
            .and_then(|c| R::from_name(&c.reason))
    }

    /// Why the runner is held ([`Self::hold_cause`]), for people.
    pub fn why_held(&self) -> String {
        let exit = self
            .exit_code
            .map(|code| (code, self.termination_reason.as_deref().unwrap_or_default()));
        self.hold_cause.unwrap_or(HoldCause::JobFailed).why(exit)
    }

    /// Forgets the listener's record of a job ([`JOB_FIELDS`]), as if it
    /// had never been written.
    pub fn clear_job_record(&mut self) {
        self.job_request_id = 0;
        self.job_runner_id = 0;
        self.job_id = None;
        self.job_repository_name = None;
        self.job_workflow_ref = None;
        self.workflow_run_id = 0;
        self.job_display_name = None;
        self.job_started_at = None;
        self.job_result = None;
        self.job_finished_at = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_record_counts_only_for_the_registration_it_names() {
        let status = |runner_id, job_runner_id, result: Option<&str>| EphemeralRunnerStatus {
            runner_id,
            job_runner_id,
            job_id: Some("job-1".into()),
            job_result: result.map(str::to_owned),
            ..EphemeralRunnerStatus::default()
        };
        // Its own registration's job, running, then ended.
        assert!(status(7, 7, None).has_job());
        assert!(!status(7, 7, None).job_ended());
        assert!(status(7, 7, Some("succeeded")).job_ended());
        // A record without a registration, or a runner not registered yet:
        // taken as the runner's.
        assert!(status(7, 0, Some("failed")).job_ended());
        assert!(status(0, 7, None).has_job());
        // A late record of the registration before a renewal.
        assert!(!status(8, 7, None).has_job());
        assert!(!status(8, 7, Some("succeeded")).job_ended());
        // No record at all.
        assert!(!EphemeralRunnerStatus::default().has_job());
        assert!(!EphemeralRunnerStatus::default().job_ended());
    }

    #[test]
    fn clearing_the_job_record_leaves_none_of_the_job_fields() {
        let mut status: EphemeralRunnerStatus = serde_json::from_value(serde_json::json!({
            "phase": "Running", "runnerId": 9, "jobRequestId": 3, "jobRunnerId": 7,
            "jobId": "j", "jobRepositoryName": "o/r", "jobWorkflowRef": "w",
            "workflowRunId": 4, "jobDisplayName": "d", "jobStartedAt": "2026-12-01T08:00:00Z",
            "jobResult": "failed", "jobFinishedAt": "2026-12-01T08:01:00Z",
        }))
        .unwrap();
        status.clear_job_record();
        let written = serde_json::to_value(&status).unwrap();
        for key in JOB_FIELDS {
            let left = &written[key];
            assert!(left.is_null() || left == 0, "{key}: {left}");
        }
        assert_eq!(
            (status.phase, status.runner_id),
            (Some(EphemeralRunnerPhase::Running), 9)
        );
    }

    #[test]
    fn names_read_back_are_the_names_written() {
        for reason in RegisteredReason::ALL {
            assert_eq!(RegisteredReason::parse(reason.as_str()), Some(*reason));
        }
        assert_eq!(
            RegisteredReason::parse("Renewed"),
            None,
            "unknown: no state"
        );
        assert_eq!(
            serde_json::to_value(PhaseReason::InvalidTemplate).unwrap(),
            "InvalidTemplate"
        );
        let status = EphemeralRunnerStatus {
            conditions: vec![Condition {
                type_: "Registered".into(),
                status: "True".into(),
                reason: "RemoveAfterJob".into(),
                message: String::new(),
                last_transition_time: Time(jiff::Timestamp::UNIX_EPOCH),
                observed_generation: None,
            }],
            ..EphemeralRunnerStatus::default()
        };
        assert_eq!(
            status.reason_of::<RegisteredReason>(),
            Some(RegisteredReason::RemoveAfterJob)
        );
        assert_eq!(status.reason_of::<HeldReason>(), None);
        assert_eq!(status.is_true(RunnerCondition::Registered), Some(true));
    }

    #[test]
    fn a_hold_says_why_also_on_objects_that_never_recorded_it() {
        let held = |cause, exit_code| EphemeralRunnerStatus {
            hold_cause: cause,
            exit_code,
            termination_reason: exit_code.map(|_| "Error".to_owned()),
            ..EphemeralRunnerStatus::default()
        };
        assert_eq!(
            held(Some(HoldCause::JobFailed), Some(1)).why_held(),
            "the job failed"
        );
        assert_eq!(
            held(Some(HoldCause::RunnerExited), Some(1)).why_held(),
            "the runner exited 1 (Error) while running a job"
        );
        assert_eq!(
            held(Some(HoldCause::PodFailed), None).why_held(),
            "the runner pod failed while running a job"
        );
        assert_eq!(held(None, Some(1)).why_held(), "the job failed");
    }
}
