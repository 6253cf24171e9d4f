//! Replay: every scaling decision a recording holds, asked again of a
//! candidate policy, and the candidate's answers set beside the recorded
//! ones.
//!
//! Each recorded input goes to the candidate as production would have
//! handed it: the same statistics, runner counts and clock, and the
//! candidate's own state threaded from one decision to the next, never the
//! state the recorded policy kept (another module cannot read it). The one
//! exception is the start: when the candidate is the module that made the
//! recording (the same digest), it starts from the state the recording
//! starts with, so a recording whose oldest decisions were dropped still
//! replays to the same answers. A candidate that fails is answered for by
//! the bundled default, exactly as `arcwright run` would: its answer is
//! what would have been applied, and the failure is listed beside it.
//!
//! What replay cannot say is what would have happened next: a candidate
//! asking for more runners would have changed the runner counts the later
//! inputs show. That is [`super::simulate`]'s question; replay answers
//! "where, on this traffic, would it have decided otherwise".

use std::fmt::Write as _;

use serde::Serialize;

pub use crate::policy::shadow::Agreement;
use crate::policy::types::ScalingInput;
use crate::policy::{Decider, PolicyError};
use crate::recording::{Entry, Trace};

/// One decision where the candidate answered otherwise.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Difference {
    /// The decision's time (its input's `now`).
    pub at: String,
    /// What was decided then.
    pub recorded: u32,
    /// What the candidate answers.
    pub candidate: u32,
    /// The candidate's reason.
    pub reason: String,
    /// The input both were asked.
    pub input: ScalingInput,
}

impl Difference {
    /// How far apart the answers are.
    pub fn size(&self) -> u32 {
        self.recorded.abs_diff(self.candidate)
    }
}

/// A decision the candidate did not answer itself.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Failure {
    /// The decision's time.
    pub at: String,
    /// Why (a trap, the deadline, the memory cap, a bad answer).
    pub error: String,
}

/// What a replay found.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Replay {
    /// Recorded decisions asked again.
    pub decisions: usize,
    /// Answered the same.
    pub same: usize,
    /// Answered with more runners.
    pub higher: usize,
    /// Answered with fewer.
    pub lower: usize,
    /// The largest differences, largest first, earliest first among equals.
    pub largest: Vec<Difference>,
    /// Where the candidate failed and the default answered for it.
    pub failures: Vec<Failure>,
    /// Entries dropped before the trace's oldest, as its header says.
    pub dropped_before: u64,
}

impl Replay {
    /// The share of decisions answered the same, in percent (100 for none).
    pub fn agreement_percent(&self) -> f64 {
        if self.decisions == 0 {
            return 100.0;
        }
        self.same as f64 * 100.0 / self.decisions as f64
    }
}

/// Replays every decision of `trace` through `candidate`, keeping the
/// `top` largest differences.
///
/// `candidate` must be a fresh decider (its kept state is the candidate's
/// own, threaded here), with the bundled default behind it as in
/// production. Only an error of the default itself, which the bundled
/// suites rule out for well-formed input, ends the replay.
pub fn replay(trace: &Trace, candidate: &Decider, top: usize) -> Result<Replay, PolicyError> {
    let sha256 = candidate.current().module().sha256().to_owned();
    let mut replay = Replay {
        dropped_before: trace.header.dropped,
        ..Replay::default()
    };
    let mut differences = Vec::new();
    let mut first = true;
    for entry in &trace.entries {
        let Entry::Decision(recorded) = entry else {
            continue;
        };
        let mut input = recorded.input.clone();
        let same_module = recorded.sha256.as_deref() == Some(sha256.as_str());
        if !(first && same_module) {
            // The decider hands the candidate its own kept state.
            input.state = None;
        }
        first = false;
        let decided = candidate.scaling_blocking(&input)?;
        let at = input.now.clone().unwrap_or_default();
        if let Some(error) = decided.fallback_reason {
            replay.failures.push(Failure {
                at: at.clone(),
                error,
            });
        }
        replay.decisions += 1;
        let answer = decided.decision.desired;
        match Agreement::of(recorded.desired, answer) {
            Agreement::Same => replay.same += 1,
            Agreement::Higher => replay.higher += 1,
            Agreement::Lower => replay.lower += 1,
        }
        if answer != recorded.desired {
            differences.push(Difference {
                at,
                recorded: recorded.desired,
                candidate: answer,
                reason: decided.decision.reason,
                input: recorded.input.clone(),
            });
        }
    }
    // Stable: among equal sizes the earliest stays first.
    differences.sort_by_key(|d| std::cmp::Reverse(d.size()));
    differences.truncate(top);
    replay.largest = differences;
    Ok(replay)
}

/// The replay as the table `arcwright policy replay` prints.
pub fn render(replay: &Replay, candidate: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "candidate   {candidate}");
    let _ = writeln!(out, "decisions   {}", replay.decisions);
    let _ = writeln!(
        out,
        "agreement   {:.1} % ({} same, {} higher, {} lower)",
        replay.agreement_percent(),
        replay.same,
        replay.higher,
        replay.lower
    );
    let _ = writeln!(
        out,
        "failures    {} (the default answered for the candidate)",
        replay.failures.len()
    );
    if replay.dropped_before > 0 {
        let _ = writeln!(
            out,
            "note        the recording had dropped {} older entries; the replay starts after them",
            replay.dropped_before
        );
    }
    if !replay.largest.is_empty() {
        let _ = writeln!(out, "\nlargest differences:");
        let _ = writeln!(
            out,
            "  {:<26} {:>8} {:>9}  {:<40} reason",
            "at", "recorded", "candidate", "input"
        );
        for d in &replay.largest {
            let s = &d.input.statistics;
            let r = &d.input.runners;
            let input = format!(
                "assigned {} running {} idle {} / runners {}+{}",
                s.assigned_jobs, s.running_jobs, s.idle_runners, r.pending, r.running
            );
            let _ = writeln!(
                out,
                "  {:<26} {:>8} {:>9}  {:<40} {}",
                d.at, d.recorded, d.candidate, input, d.reason
            );
        }
    }
    if !replay.failures.is_empty() {
        let _ = writeln!(out, "\nfailures:");
        for f in replay.failures.iter().take(10) {
            let _ = writeln!(out, "  {:<26} {}", f.at, f.error);
        }
        if replay.failures.len() > 10 {
            let _ = writeln!(out, "  ... and {} more", replay.failures.len() - 10);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::policy::reporter::RecordingReporter;
    use crate::policy::types::{JobStatistics, ScaleSet};
    use crate::policy::{CallLimits, EngineConfig, Policy, PolicyEngine, PolicyKind};
    use crate::recording::{Budget, Decision, Limits, Recording};

    fn engine() -> PolicyEngine {
        PolicyEngine::new(EngineConfig::default()).unwrap()
    }

    fn decider(engine: &PolicyEngine, name: &str, settings: Option<serde_json::Value>) -> Decider {
        let module = Arc::new(engine.load_builtin(PolicyKind::Scaling, name).unwrap());
        let policy = Policy::new(
            module,
            format!("builtin:{name}"),
            settings.as_ref(),
            CallLimits::default(),
        )
        .unwrap();
        let fallback = Arc::new(engine.load_builtin(PolicyKind::Scaling, "default").unwrap());
        let fallback =
            Policy::new(fallback, "builtin:default", None, CallLimits::default()).unwrap();
        Decider::new(
            Arc::new(policy),
            Arc::new(fallback),
            Arc::new(RecordingReporter::new()),
        )
    }

    fn input(assigned: u32, second: u32) -> ScalingInput {
        ScalingInput {
            scale_set: ScaleSet {
                name: "linux".into(),
                namespace: "ci".into(),
                min_runners: 0,
                max_runners: 20,
                labels: vec!["linux".into()],
            },
            statistics: JobStatistics {
                assigned_jobs: assigned,
                ..JobStatistics::default()
            },
            now: Some(format!("2026-12-04T09:00:{second:02}Z")),
            ..ScalingInput::default()
        }
    }

    /// A trace recorded as a listener records: each input through the
    /// active decider, the entry made from what it decided.
    fn recorded(active: &Decider, loads: &[u32]) -> Trace {
        let mut recording = Recording::new(
            "ci",
            "linux",
            Limits {
                entries: 1000,
                bytes: 1 << 20,
            },
            Budget::new(1 << 20),
        );
        for (second, assigned) in loads.iter().enumerate() {
            let input = input(*assigned, second as u32);
            let decided = active.scaling_blocking(&input).unwrap();
            recording.push(&Entry::Decision(Decision::of(input, &decided)));
        }
        crate::recording::read(&recording.trace()).unwrap()
    }

    const LOADS: &[u32] = &[0, 3, 8, 8, 2, 0, 0, 5, 1, 0];

    #[test]
    fn the_recorded_policy_agrees_with_itself_everywhere_state_included() {
        let engine = engine();
        // cooldown keeps state: a replay that did not thread it would
        // scale down early and disagree.
        let settings = serde_json::json!({"scaleDownAfterSeconds": 4});
        let trace = recorded(&decider(&engine, "cooldown", Some(settings.clone())), LOADS);
        let replay = replay(&trace, &decider(&engine, "cooldown", Some(settings)), 5).unwrap();
        assert_eq!(replay.decisions, LOADS.len());
        assert_eq!(replay.same, LOADS.len(), "{replay:?}");
        assert!(replay.largest.is_empty() && replay.failures.is_empty());
        assert_eq!(replay.agreement_percent(), 100.0);
    }

    #[test]
    fn a_different_candidate_is_reported_where_it_differs() {
        let engine = engine();
        let trace = recorded(&decider(&engine, "default", None), LOADS);
        let spare = serde_json::json!({"idle": 2});
        let replay = replay(&trace, &decider(&engine, "buffered", Some(spare)), 3).unwrap();
        assert_eq!(replay.decisions, LOADS.len());
        assert_eq!(replay.lower, 0, "spares never ask for fewer: {replay:?}");
        assert!(replay.higher > 0, "{replay:?}");
        assert_eq!(replay.same + replay.higher, LOADS.len());
        assert!(replay.largest.len() <= 3);
        for d in &replay.largest {
            assert!(d.candidate > d.recorded, "{d:?}");
            assert_eq!(d.recorded, d.input.statistics.assigned_jobs);
        }
        let table = render(&replay, "builtin:buffered");
        assert!(table.contains("largest differences"), "{table}");
    }
}
