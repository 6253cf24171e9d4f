//! `EphemeralRunnerSet`: the runners of one scale set, scaled by the listener.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::ephemeral_runner::EphemeralRunnerSpec;
use super::shared::ResourceMeta;

/// The set of EphemeralRunners of a scale set. The listener writes
/// `replicas` and `patchID`; the set creates and deletes runners to match.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "arcwright.dev",
    version = "v1alpha1",
    kind = "EphemeralRunnerSet",
    namespaced,
    status = "EphemeralRunnerSetStatus",
    shortname = "ers",
    category = "arcwright",
    category = "runners",
    printcolumn = r#"{"name":"DesiredReplicas","type":"integer","jsonPath":".spec.replicas"}"#,
    printcolumn = r#"{"name":"CurrentReplicas","type":"integer","jsonPath":".status.currentReplicas"}"#,
    printcolumn = r#"{"name":"Pending Runners","type":"integer","jsonPath":".status.pendingEphemeralRunners"}"#,
    printcolumn = r#"{"name":"Running Runners","type":"integer","jsonPath":".status.runningEphemeralRunners"}"#,
    printcolumn = r#"{"name":"Failed Runners","type":"integer","jsonPath":".status.failedEphemeralRunners"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct EphemeralRunnerSetSpec {
    /// How many runners the listener wants.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub replicas: i32,
    /// The listener's patch sequence number; 0 means "scale down freely".
    #[serde(default, rename = "patchID")]
    pub patch_id: i32,
    /// The revision of the runner spec: the AutoscalingRunnerSet bumps it
    /// whenever it publishes a spec, and the set cleans up runners of older
    /// revisions before recording it as applied in its status.
    #[serde(default)]
    pub actionable_revision: i64,
    /// What every runner of the set is made from.
    pub ephemeral_runner_spec: EphemeralRunnerSpec,
    /// Extra metadata for runners created from now on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ephemeral_runner_metadata: Option<ResourceMeta>,
}

/// Where a set is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum EphemeralRunnerSetPhase {
    /// Runners are created as the listener asks.
    #[default]
    Running,
    /// A runner of the current revision reported Outdated; the set holds at
    /// zero until the spec changes.
    Outdated,
}

/// The set's counts, as ARC reports them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EphemeralRunnerSetStatus {
    /// Pending + running + failed runners.
    #[serde(default)]
    pub current_replicas: i32,
    /// Runners not running yet.
    #[serde(default)]
    pub pending_ephemeral_runners: i32,
    /// Runners running.
    #[serde(default)]
    pub running_ephemeral_runners: i32,
    /// Runners failed.
    #[serde(default)]
    pub failed_ephemeral_runners: i32,
    /// The phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<EphemeralRunnerSetPhase>,
    /// The last `spec.actionableRevision` whose cleanup finished; written
    /// last, so a crash part-way through leaves it behind and the cleanup is
    /// redone.
    #[serde(default)]
    pub applied_actionable_revision: i64,
    /// The generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The standard conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}
