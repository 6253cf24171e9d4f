//! The JSON form of policy inputs and decisions.
//!
//! `arcwright policy eval --input`, the YAML suites and the reconcilers all
//! speak this form: camelCase keys, every field optional with a zero default,
//! so a suite case states only what the policy under test looks at. The
//! runtime converts it to the generated WIT types at the call boundary;
//! nothing outside this layer sees those.
//!
//! Because every field defaults to zero, a misspelt key would silently be a
//! zero (`minRunner: 3` is a scale set with no minimum), and a suite would
//! pass while testing something else. So unknown keys are refused, and
//! [`from_json`] says where and what was probably meant:
//! `` `scaleSet.minRunner` is not a field; did you mean `minRunners`? ``.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A scale set as its AutoscalingRunnerSet declares it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
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
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
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
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
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
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
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
    /// A [`Decider`](super::Decider) hands the policy its own kept state
    /// when this is `None`; `eval` and the suites hand it exactly this.
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
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
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
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
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

/// Parses the JSON form of an input (or any strict document), naming the
/// path of the first problem and suggesting the field a misspelt key meant.
pub fn from_json<T: DeserializeOwned>(value: &serde_json::Value) -> Result<T, String> {
    from_json_at("", value)
}

/// [`from_json`] for a value found at `prefix` of a larger document
/// (`cases[2].input`), so the message names the whole path.
pub fn from_json_at<T: DeserializeOwned>(
    prefix: &str,
    value: &serde_json::Value,
) -> Result<T, String> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = match e.path().to_string() {
            path if path == "." => String::new(),
            path => path,
        };
        describe(&join_path(prefix, &path), e.inner())
    })
}

/// `prefix` and `path` as one path: `cases[0]` + `input.now`, `cases` + `[0]`.
pub(crate) fn join_path(prefix: &str, path: &str) -> String {
    match (prefix, path) {
        ("", path) => path.to_string(),
        (prefix, "") => prefix.to_string(),
        (prefix, path) if path.starts_with('[') => format!("{prefix}{path}"),
        (prefix, path) => format!("{prefix}.{path}"),
    }
}

/// Says what went wrong at `path` in words a policy author can act on.
fn describe(path: &str, error: &impl std::fmt::Display) -> String {
    let message = error.to_string();
    // serde's wording, stable since 1.0: unknown field `x`, expected `a`,
    // `a` or `b`, one of `a`, `b`, ..., or "there are no fields".
    if let Some(rest) = message.strip_prefix("unknown field `") {
        let mut quoted = rest.split('`').step_by(2);
        let field = quoted.next().unwrap_or_default();
        let fields: Vec<&str> = quoted.collect();
        // The path usually ends with the unknown key already.
        let parent = match path.strip_suffix(field) {
            Some(parent) if parent.is_empty() || parent.ends_with('.') => {
                parent.trim_end_matches('.')
            }
            _ => path,
        };
        return not_a_field(parent, field, &fields);
    }
    match path {
        "" => message,
        path => format!("at `{path}`: {message}"),
    }
}

/// The message for a key `field` found at `parent` where only `fields` are
/// accepted: `` `scaleSet.minRunner` is not a field; did you mean `minRunners`? ``.
pub(crate) fn not_a_field(parent: &str, field: &str, fields: &[&str]) -> String {
    let location = join_path(parent, field);
    let hint = match (closest(field, fields), fields) {
        (_, []) => " (it takes no fields)".to_string(),
        (Some(best), _) => format!("; did you mean `{best}`?"),
        (None, fields) => format!("; the fields are {}", fields.join(", ")),
    };
    format!("`{location}` is not a field{hint}")
}

/// The candidate a misspelling most likely meant: the nearest by edit
/// distance (ignoring case), if it is near enough to be a slip of the
/// fingers rather than another word.
pub(crate) fn closest<'a>(word: &str, candidates: &[&'a str]) -> Option<&'a str> {
    let word = word.to_lowercase();
    candidates
        .iter()
        .map(|candidate| {
            let distance = strsim::damerau_levenshtein(&word, &candidate.to_lowercase());
            (distance, *candidate)
        })
        .filter(|(distance, candidate)| *distance <= (candidate.chars().count() / 3).max(1))
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn misspelt_keys_are_named_with_their_path_and_a_suggestion() {
        let cases: &[(&str, &str)] = &[
            (
                r#"{"scaleSet": {"minRunner": 3}}"#,
                "`scaleSet.minRunner` is not a field; did you mean `minRunners`?",
            ),
            (
                r#"{"statistics": {"assignedjobs": 3}}"#,
                "`statistics.assignedjobs` is not a field; did you mean `assignedJobs`?",
            ),
            (
                r#"{"curentDesired": 1}"#,
                "`curentDesired` is not a field; did you mean `currentDesired`?",
            ),
            (
                r#"{"runners": {"zebra": 1}}"#,
                "`runners.zebra` is not a field; the fields are pending, running, busy, succeeded, failed, outdated, deleting",
            ),
            (
                r#"{"scaleSet": {"maxRunners": "ten"}}"#,
                "at `scaleSet.maxRunners`: invalid type: string \"ten\", expected u32",
            ),
        ];
        for (json, expected) in cases {
            let value: serde_json::Value = serde_json::from_str(json).unwrap();
            assert_eq!(
                from_json::<ScalingInput>(&value).unwrap_err(),
                *expected,
                "{json}"
            );
        }
        let value = serde_json::json!({"exitcode": 1});
        assert_eq!(
            from_json::<RunnerEnding>(&value).unwrap_err(),
            "`exitcode` is not a field; did you mean `exitCode`?"
        );
        let value = serde_json::json!({"template": {}, "templat": {}});
        assert_eq!(
            from_json::<PodValidationInput>(&value).unwrap_err(),
            "`templat` is not a field; did you mean `template`?"
        );
    }

    #[test]
    fn suggestions_are_near_misses_only() {
        let fields = ["desired", "reason", "state"];
        assert_eq!(closest("desird", &fields), Some("desired"));
        assert_eq!(closest("Reason", &fields), Some("reason"));
        assert_eq!(closest("sate", &fields), Some("state"));
        assert_eq!(closest("verdict", &fields), None);
        assert_eq!(closest("x", &fields), None);
    }

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
