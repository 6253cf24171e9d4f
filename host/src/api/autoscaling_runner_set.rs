//! `AutoscalingRunnerSet`: what a user declares, one scale set.

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::shared::{
    DURATION_PATTERN, DebugSpec, GitHubServerTls, MetricsConfig, PolicyRefs, ProxySpec,
    ResourceMeta, pod_template_schema,
};

/// The longest name an AutoscalingRunnerSet may have: each runner is named
/// `<name>-runner-xxxxx`, and that name is a label value on the runner's
/// pod and Secret, which Kubernetes limits to 63 characters. A longer name
/// is refused at `kubectl apply`, rather than accepted and every runner pod
/// then refused.
pub const MAX_NAME: usize = 63 - "-runner-xxxxx".len();

/// Why a name longer than [`MAX_NAME`] is refused.
const NAME_TOO_LONG: &str = "the name must be at most 50 characters: each runner is named <name>-runner-xxxxx, \
     and that name is a label value on its pod, which Kubernetes limits to 63 characters";

/// A runner scale set: where it registers, how its runners look, how many
/// it may have, and the policies that make its judgement calls.
///
/// The apiserver refuses `minRunners > maxRunners` and a configuration URL
/// that is not an enterprise, organisation or repository URL, so a typo
/// fails at `kubectl apply` rather than in the controller's logs.
#[derive(CustomResource, KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "arcwright.dev",
    version = "v1alpha1",
    kind = "AutoscalingRunnerSet",
    namespaced,
    status = "AutoscalingRunnerSetStatus",
    shortname = "ars",
    category = "arcwright",
    category = "runners",
    printcolumn = r#"{"name":"Minimum Runners","type":"integer","jsonPath":".spec.minRunners"}"#,
    printcolumn = r#"{"name":"Maximum Runners","type":"integer","jsonPath":".spec.maxRunners"}"#,
    printcolumn = r#"{"name":"Current Runners","type":"integer","jsonPath":".status.currentRunners"}"#,
    printcolumn = r#"{"name":"State","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Pending Runners","type":"integer","jsonPath":".status.pendingEphemeralRunners"}"#,
    printcolumn = r#"{"name":"Running Runners","type":"integer","jsonPath":".status.runningEphemeralRunners"}"#,
    printcolumn = r#"{"name":"Failed Runners","type":"integer","jsonPath":".status.failedEphemeralRunners"}"#,
    printcolumn = r#"{"name":"Desired","type":"integer","jsonPath":".status.scaling.desiredRunners"}"#,
    printcolumn = r#"{"name":"Listener","type":"string","jsonPath":".status.listener.state"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","priority":1,"jsonPath":".status.scaling.reason"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    validation = Rule::new(format!("size(self.metadata.name) <= {MAX_NAME}")).message(NAME_TOO_LONG)
)]
#[x_kube(validation = Rule::new("!has(self.minRunners) || !has(self.maxRunners) || self.minRunners <= self.maxRunners").message("minRunners must not be greater than maxRunners"))]
#[serde(rename_all = "camelCase")]
pub struct AutoscalingRunnerSetSpec {
    /// The enterprise (`https://github.com/enterprises/NAME`), organisation
    /// (`https://github.com/ORG`) or repository (`https://github.com/ORG/REPO`)
    /// URL; a GitHub Enterprise Server host is allowed.
    #[schemars(regex(pattern = r"^https?://[^/\s]+(/[^/\s]+){1,2}/?$"))]
    pub github_config_url: String,
    /// The Secret with `github_token`, or `github_app_id`,
    /// `github_app_installation_id` and `github_app_private_key`.
    #[schemars(length(min = 1))]
    pub github_config_secret: String,
    /// The runner group; the default group when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_group: Option<String>,
    /// The scale set's name and `runs-on` label; the object's name when
    /// omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_scale_set_name: Option<String>,
    /// Extra labels, applied when the scale set is created.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runner_scale_set_labels: Vec<String>,
    /// A proxy to GitHub.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<ProxySpec>,
    /// A private CA for GitHub Enterprise Server.
    #[serde(
        default,
        rename = "githubServerTLS",
        skip_serializing_if = "Option::is_none"
    )]
    pub github_server_tls: Option<GitHubServerTls>,
    /// The runner pod template; its runner container is named `runner`.
    #[schemars(schema_with = "pod_template_schema")]
    pub template: PodTemplateSpec,
    /// At most this many runners; unbounded when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub max_runners: Option<i32>,
    /// At least this many runners; 0 when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub min_runners: Option<i32>,
    /// The policies making the scale set's judgement calls.
    #[serde(flatten)]
    pub policies: PolicyRefs,
    /// Holding failed runners for debugging, and telling Slack.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debug: Option<DebugSpec>,
    /// Idle runners (registered, running, no job) whose pod is older than
    /// this are replaced, their registration removed first, so a
    /// long-lived warm pool does not age (`12h`). Omitted: idle runners
    /// live until they take a job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub max_idle_age: Option<String>,
    /// How long a runner may take, from the start of its runner container
    /// (init containers, a cache warm-up say, do not count), to be seen
    /// online by the service before it is removed and recreated (`15m`).
    /// Omitted: the host's `--registration-timeout` (10 minutes by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub registration_timeout: Option<String>,
    /// Keep busy runner pods from node scale-down: a pod whose runner
    /// takes a job is annotated `cluster-autoscaler.kubernetes.io/safe-to-evict:
    /// "false"` and `karpenter.sh/do-not-disrupt: "true"` (one pod write per
    /// job); idle ones are created `safe-to-evict: "true"`, so their nodes
    /// still scale down (the autoscaler otherwise keeps pods with local
    /// storage, such as dind's volumes). A drain (`kubectl drain`) does not
    /// read these; a PodDisruptionBudget is what holds it. Omitted: false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protect_busy_runners: Option<bool>,
    /// The labels of the listener's per-job metrics, as ARC's
    /// `listenerMetrics` (see [`MetricsConfig`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listener_metrics: Option<MetricsConfig>,
    /// Extra metadata for the EphemeralRunnerSet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ephemeral_runner_set_metadata: Option<ResourceMeta>,
    /// Extra metadata for EphemeralRunners.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ephemeral_runner_metadata: Option<ResourceMeta>,
    /// Extra metadata for the runners' JIT config Secrets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ephemeral_runner_config_secret_metadata: Option<ResourceMeta>,
}

/// Where a scale set is.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum AutoscalingRunnerSetPhase {
    /// Its listener is not started yet (or is being rebuilt).
    #[default]
    Pending,
    /// Its listener runs.
    Running,
    /// Its runners reported an outdated runner version; it rests at zero
    /// until the spec changes.
    Outdated,
}

/// The scale set's counts, copied from its EphemeralRunnerSet.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AutoscalingRunnerSetStatus {
    /// Pending + running + failed runners.
    #[serde(default)]
    pub current_runners: i32,
    /// The phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<AutoscalingRunnerSetPhase>,
    /// Runners not running yet.
    #[serde(default)]
    pub pending_ephemeral_runners: i32,
    /// Runners running.
    #[serde(default)]
    pub running_ephemeral_runners: i32,
    /// Runners failed.
    #[serde(default)]
    pub failed_ephemeral_runners: i32,
    /// The generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The standard conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The scale set's id in the Actions service, once registered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_scale_set_id: Option<i64>,
    /// How the scale set's listener is doing. Written by the listener alone
    /// (the controller's status writes leave it out), so the two never
    /// overwrite each other.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listener: Option<ListenerStatus>,
    /// The scaling policy's last decision, written by the listener when it
    /// changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaling: Option<ScalingStatus>,
}

/// What the scale set's listener last said about itself.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListenerStatus {
    /// `Listening`, `Retrying` or `Stopped`.
    pub state: String,
    /// Why it is retrying (`SessionConflict`, `ScaleSetNotFound`,
    /// `ServiceUnavailable`...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The error it is retrying after (never a secret).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When the state or reason last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
}

/// The scaling policy's last decision.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScalingStatus {
    /// The runners the policy asked for.
    pub desired_runners: i32,
    /// The policy's reason.
    pub reason: String,
    /// The policy that decided (`builtin:default`, `configmap:ns/name`).
    pub policy: String,
    /// Why the configured policy did not decide, when the bundled default
    /// did instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback_reason: Option<String>,
    /// When the decision was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_decision_time: Option<Time>,
    /// What `spec.shadowScalingPolicy` answered to the same input (never
    /// applied).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow: Option<ShadowScalingStatus>,
}

/// The shadow scaling policy's last answer, beside the active one's.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShadowScalingStatus {
    /// The shadow policy (`builtin:buffered`, `configmap:ns/name`).
    pub policy: String,
    /// The runners it asked for; absent when it gave no answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_runners: Option<i32>,
    /// Its reason.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// `same`, `higher` or `lower` than the active policy's answer; absent
    /// when it gave no answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agreement: Option<String>,
    /// Why it gave no answer (it failed, timed out, or is not loaded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Since when it has agreed with the active policy, or disagreed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Time>,
}

/// An enum of names written into the cluster (a condition's type, a
/// reason), each variant spelt as it is written, so a misspelt one does not
/// compile and the tests match on the variant rather than on a string.
macro_rules! wire_names {
    ($(#[$meta:meta])* $name:ident { $($(#[$variant_meta:meta])* $variant:ident,)+ }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$variant_meta])* $variant,)+
        }

        impl $name {
            /// The name as it is written in the status or the event.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => stringify!($variant),)+
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

wire_names! {
    /// The conditions the controller sets on an AutoscalingRunnerSet.
    AutoscalingRunnerSetCondition {
        /// Whether the pod-validation policy accepts `spec.template`
        /// ([`PodTemplateReason`]): while it is False nothing is built or
        /// registered for the spec, and the message lists every violation.
        PodTemplateAccepted,
        /// Why a deletion does not finish by itself, and what an admin can
        /// do about it ([`DeletionBlockedReason`]).
        DeletionBlocked,
        /// True when `minRunners` or `maxRunners` is above the host's
        /// `--max-runners-per-scale-set`, which then bounds the scale set
        /// ([`RunnersCappedReason`]); absent otherwise.
        RunnersCapped,
        /// True while the scale set of this name is held by another
        /// AutoscalingRunnerSet, which the message names
        /// ([`ScaleSetConflictReason`]): this one waits, registering and
        /// deleting nothing, until the name is free. Absent otherwise.
        ScaleSetConflict,
        /// True while reconciles fail on something that retrying alone
        /// will not mend, or has not yet (credentials, the Actions service
        /// unreachable or refusing, a policy that cannot be had); the
        /// message is the failure with its causes ([`StalledReason`]).
        /// Absent once a reconcile succeeds. The name and polarity are
        /// kstatus's, so `kubectl wait`, Flux and Argo CD read it.
        Stalled,
        /// What `spec.shadowPodValidationPolicy` says of the template,
        /// never acted on ([`ShadowPodTemplateReason`]): False with "would
        /// reject: ..." where it would refuse what the active policy let
        /// through. Absent without a shadow policy.
        ShadowPodTemplateAccepted,
    }
}

wire_names! {
    /// Why `ShadowPodTemplateAccepted` is what it is.
    ShadowPodTemplateReason {
        /// The shadow policy finds nothing wrong (True).
        Accepted,
        /// The shadow policy would refuse the template (False).
        WouldReject,
        /// The shadow policy could not judge (False): not loaded, or it
        /// failed.
        ShadowPolicyFailed,
    }
}

wire_names! {
    /// Why `Stalled` is True.
    StalledReason {
        /// The credentials Secret is missing, lacks a key, or holds one
        /// that cannot be used (an App key that is not a key); or the
        /// service refused the credentials.
        CredentialsUnusable,
        /// The TLS or proxy settings cannot make a client (a CA bundle
        /// that is not PEM, a proxy URL that does not parse), or the
        /// configuration URL is not one the client accepts.
        ConnectionSettingsInvalid,
        /// The Actions service could not be reached, did not answer in
        /// time, answered 5xx or 429 after the client's retries, or sent
        /// an answer that cannot be read.
        ActionsUnavailable,
        /// The Actions service answered, and refused (a 4xx; a runner
        /// group that does not exist).
        ActionsRefused,
        /// The pod-validation policy could not be loaded or run (an
        /// unknown builtin, a ConfigMap missing or too large).
        PolicyUnavailable,
        /// The listener could not be started.
        ListenerNotStarted,
        /// The API server refused what the set asks for (a 4xx other
        /// than a conflict: a name too long for the objects made from it,
        /// a template the server will not store).
        KubernetesRefused,
    }
}

wire_names! {
    /// Why `ScaleSetConflict` is True.
    ScaleSetConflictReason {
        /// Another set records the scale set's id as its own.
        HeldByAnotherSet,
    }
}

wire_names! {
    /// Why `RunnersCapped` is True.
    RunnersCappedReason {
        /// The spec asks for more runners than the host allows one scale
        /// set.
        AboveHostLimit,
    }
}

wire_names! {
    /// Why `PodTemplateAccepted` is what it is.
    PodTemplateReason {
        /// The policy found nothing wrong (True).
        Accepted,
        /// The policy refused the template (False).
        PolicyViolation,
    }
}

wire_names! {
    /// Why `DeletionBlocked` is True.
    DeletionBlockedReason {
        /// The credentials Secret is gone, so the scale set cannot be
        /// deleted in the Actions service; restoring it, or the force-delete
        /// annotation, lets the deletion go on.
        SecretMissing,
    }
}

wire_names! {
    /// The reasons of the events the controller publishes on an
    /// AutoscalingRunnerSet.
    AutoscalingRunnerSetEvent {
        /// The pod-validation policy refused the template (once per
        /// distinct set of violations).
        PodTemplateRejected,
        /// The deletion is blocked (once per new reason).
        DeletionBlocked,
        /// The scale set of this name is another set's (once per holder).
        ScaleSetConflict,
        /// The scale set the set recorded is gone from the service; it is
        /// found again by name or registered anew.
        ScaleSetLost,
        /// Reconciles fail, with the `Stalled` condition's reason and
        /// message as the note (once per distinct failure).
        Stalled,
    }
}
