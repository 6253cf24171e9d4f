//! The JSON form of policy inputs and decisions.
//!
//! `arcwright policy eval --input`, the YAML suites and the reconcilers all
//! speak this form: camelCase keys, every field optional with a zero default,
//! so a suite case states only what the policy under test looks at. The
//! runtime converts it to the generated WIT types at the call boundary;
//! nothing outside this layer sees those.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A scale set as its AutoscalingRunnerSet declares it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ScaleSet {
    /// The scale set's name.
    pub name: String,
    /// Its namespace.
    pub namespace: String,
    /// The minimum number of idle runners (ARC's minRunners).
    pub min_runners: u32,
    /// The hard cap; answers above it are clamped.
    pub max_runners: u32,
    /// The `runs-on` labels.
    pub labels: Vec<String>,
}

/// The job statistics of the last message from the Actions service.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct JobStatistics {
    /// Jobs waiting for a runner.
    pub available_jobs: u32,
    /// Jobs acquired by the scale set.
    pub acquired_jobs: u32,
    /// Jobs assigned to the scale set.
    pub assigned_jobs: u32,
    /// Jobs running on its runners.
    pub running_jobs: u32,
    /// Runners the service knows.
    pub registered_runners: u32,
    /// Runners executing a job.
    pub busy_runners: u32,
    /// Runners waiting for a job.
    pub idle_runners: u32,
}

/// The scale set's EphemeralRunners by phase.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct RunnerCounts {
    /// Pending runners.
    pub pending: u32,
    /// Running runners.
    pub running: u32,
    /// Running runners with a job.
    pub busy: u32,
    /// Succeeded runners.
    pub succeeded: u32,
    /// Failed runners.
    pub failed: u32,
    /// Outdated runners.
    pub outdated: u32,
    /// Runners being deleted.
    pub deleting: u32,
}

/// The input of a scaling decision.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ScalingInput {
    /// The scale set.
    pub scale_set: ScaleSet,
    /// The last job statistics.
    pub statistics: JobStatistics,
    /// Runner counts by phase.
    pub runners: RunnerCounts,
    /// The replica count currently on the EphemeralRunnerSet.
    pub current_desired: u32,
    /// The time of the decision as RFC 3339. Omitted means the Unix epoch,
    /// not "now": suites must be reproducible, so the clock is always input.
    pub now: Option<String>,
    /// The state the policy returned last time for this scale set, as text.
    pub state: Option<String>,
}

impl ScalingInput {
    /// `now` in seconds since the Unix epoch, or a clear error.
    pub fn now_unix_seconds(&self) -> Result<i64, String> {
        match &self.now {
            None => Ok(0),
            Some(text) => text
                .parse::<jiff::Timestamp>()
                .map(|ts| ts.as_second())
                .map_err(|e| format!("`now` is not an RFC 3339 time ({text:?}): {e}")),
        }
    }
}

/// A scaling policy's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ScalingDecision {
    /// The desired number of runners (after clamping to maxRunners).
    pub desired: u32,
    /// The policy's answer when it was above maxRunners and clamped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clamped_from: Option<u32>,
    /// Why, for status and events.
    pub reason: String,
    /// State to hand back on the next call; shown as text in JSON.
    #[serde(serialize_with = "state_as_text")]
    pub state: Option<Vec<u8>>,
}

fn state_as_text<S: Serializer>(state: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
    match state {
        Some(bytes) => s.serialize_some(&String::from_utf8_lossy(bytes)),
        None => s.serialize_none(),
    }
}

/// The phase an EphemeralRunner ended in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum RunnerPhase {
    /// Never started.
    #[default]
    Pending,
    /// Was running.
    Running,
    /// Exited 0.
    Succeeded,
    /// Failed.
    Failed,
    /// Found outdated.
    Outdated,
}

impl<'de> Deserialize<'de> for RunnerPhase {
    /// Accepts both `succeeded` and Kubernetes' `Succeeded`.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        match text.to_ascii_lowercase().as_str() {
            "pending" => Ok(Self::Pending),
            "running" => Ok(Self::Running),
            "succeeded" => Ok(Self::Succeeded),
            "failed" => Ok(Self::Failed),
            "outdated" => Ok(Self::Outdated),
            _ => Err(serde::de::Error::custom(format!(
                "unknown runner phase {text:?}; expected pending, running, succeeded, failed or outdated"
            ))),
        }
    }
}

/// How a runner ended: the input of a deregistration decision.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct RunnerEnding {
    /// The EphemeralRunner's name.
    pub name: String,
    /// Its namespace.
    pub namespace: String,
    /// Its phase when it ended.
    pub phase: RunnerPhase,
    /// The runner container's exit code, if it terminated.
    pub exit_code: Option<i32>,
    /// The termination reason ("OOMKilled", "Evicted"), "" for none.
    pub reason: String,
    /// Whether the runner took a job.
    pub had_job: bool,
    /// Whether the runner registered.
    pub registered: bool,
}

/// What to do about a finished runner's registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// It removed its own registration; no API call.
    SelfDeregistered,
    /// Remove the registration now.
    RemoveNow,
    /// Remove it once its job is over.
    RemoveAfterJob,
}

/// A deregistration policy's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeregistrationDecision {
    /// The verdict.
    pub verdict: Verdict,
    /// Why.
    pub reason: String,
}

/// The input of a pod-validation decision.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PodValidationInput {
    /// The runner PodTemplateSpec, as JSON.
    pub template: serde_json::Value,
}

/// One reason a pod template is refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Violation {
    /// Where, e.g. `spec.containers[0].image`.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

/// A pod-validation policy's answer; empty accepts the template.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodValidationDecision {
    /// The violations found.
    pub violations: Vec<Violation>,
}

/// Any policy's answer, for code that handles every kind alike (the CLI,
/// the suites).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Decision {
    /// A scaling answer.
    Scaling(ScalingDecision),
    /// A deregistration answer.
    Deregistration(DeregistrationDecision),
    /// A pod-validation answer.
    PodValidation(PodValidationDecision),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn omitted_fields_default_to_zero() {
        let input: ScalingInput = serde_json::from_str(
            r#"{"scaleSet": {"maxRunners": 5}, "statistics": {"assignedJobs": 3}}"#,
        )
        .unwrap();
        assert_eq!(input.scale_set.max_runners, 5);
        assert_eq!(input.statistics.assigned_jobs, 3);
        assert_eq!(input.runners, RunnerCounts::default());
        assert_eq!(input.now_unix_seconds(), Ok(0));
    }

    #[test]
    fn now_is_rfc3339() {
        let input = ScalingInput {
            now: Some("2026-01-05T09:30:00Z".into()),
            ..ScalingInput::default()
        };
        assert_eq!(input.now_unix_seconds(), Ok(1_767_605_400));
        let bad = ScalingInput {
            now: Some("yesterday".into()),
            ..ScalingInput::default()
        };
        assert!(bad.now_unix_seconds().unwrap_err().contains("yesterday"));
    }

    #[test]
    fn phases_accept_kubernetes_capitalisation() {
        let ending: RunnerEnding =
            serde_json::from_str(r#"{"phase": "Succeeded", "exitCode": 0}"#).unwrap();
        assert_eq!(ending.phase, RunnerPhase::Succeeded);
        assert_eq!(ending.exit_code, Some(0));
        assert!(serde_json::from_str::<RunnerEnding>(r#"{"phase": "Gone"}"#).is_err());
    }

    #[test]
    fn decisions_serialise_state_as_text() {
        let decision = ScalingDecision {
            desired: 2,
            clamped_from: None,
            reason: "r".into(),
            state: Some(br#"{"since":1}"#.to_vec()),
        };
        let json = serde_json::to_value(&decision).unwrap();
        assert_eq!(json["state"], r#"{"since":1}"#);
    }
}
