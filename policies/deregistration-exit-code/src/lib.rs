//! The bundled `exit-code` deregistration policy: ARC's
//! `runnerSelfDeregistered`, extended to say *when* a removal may happen.
//!
//! Whether a finished runner still holds a registration in the Actions
//! service is inferred from what the controller already knows, because the
//! point is to avoid an API call on the hottest path the controller has.
//! The inference is deliberately conservative in the direction that costs
//! an API call rather than the one that leaks a registration: a wrong
//! "remove" costs one call that the service answers with "not found" (which
//! the unregistration pool counts as done), while a wrong
//! "self-deregistered" leaves an offline runner listed in the repository
//! until the service expires it.
//!
//! - Only a clean exit (phase succeeded, exit code 0 or not recorded) means
//!   the runner removed its own registration: runners are ephemeral, and an
//!   ephemeral runner deregisters itself on the way out of a clean exit.
//! - Everything else may still hold one. That includes a runner that was
//!   never *seen* registered: its JIT config was generated, and generating
//!   it registered the runner, before the controller could record an id.
//! - A runner that took a job and did not finish cleanly may still be
//!   reported as running that job; the service refuses to remove such a
//!   runner, so the removal is queued to happen after the job.
#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::format;
use alloc::string::String;
use arcwright_guest::Settings;
use exports::arcwright::policy::deregistration::{
    DeregistrationDecision, Guest, RunnerEnding, RunnerPhase, Verdict,
};

wit_bindgen::generate!({ world: "deregistration-policy", path: "../../wit" });

fn phase_name(phase: RunnerPhase) -> &'static str {
    match phase {
        RunnerPhase::Pending => "pending",
        RunnerPhase::Running => "running",
        RunnerPhase::Succeeded => "succeeded",
        RunnerPhase::Failed => "failed",
        RunnerPhase::Outdated => "outdated",
    }
}

/// How the runner ended, in words: `phase failed, exit code 137 (OOMKilled)`.
fn ending(input: &RunnerEnding) -> String {
    let mut text = format!("phase {}", phase_name(input.phase));
    if let Some(code) = input.exit_code {
        text.push_str(&format!(", exit code {code}"));
    }
    if !input.reason.is_empty() {
        text.push_str(&format!(" ({})", shorten(&input.reason)));
    }
    text
}

/// Termination reasons are short words ("OOMKilled", "Evicted"), but they
/// come from the cluster, and the host refuses a reason over 4 KiB; an
/// overlong one is cut rather than turning the decision into a failure.
fn shorten(reason: &str) -> &str {
    const MAX: usize = 128;
    if reason.len() <= MAX {
        return reason;
    }
    let mut end = MAX;
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    &reason[..end]
}

fn decide(input: &RunnerEnding) -> DeregistrationDecision {
    let how = ending(input);
    let clean_exit =
        input.phase == RunnerPhase::Succeeded && matches!(input.exit_code, None | Some(0));
    let (verdict, reason) = if clean_exit {
        (
            Verdict::SelfDeregistered,
            format!("{how}: an ephemeral runner that exits cleanly removes its own registration"),
        )
    } else if input.had_job {
        (
            Verdict::RemoveAfterJob,
            format!(
                "{how} after taking a job: the service may still report the job running, \
                 so the registration is removed once it no longer does"
            ),
        )
    } else if !input.registered {
        (
            Verdict::RemoveNow,
            format!(
                "{how}, never seen registered: its JIT config may still hold a registration, \
                 so it is removed (not found counts as done)"
            ),
        )
    } else {
        (
            Verdict::RemoveNow,
            format!("{how} without a clean exit: the runner did not remove its own registration"),
        )
    };
    DeregistrationDecision { verdict, reason }
}

struct Policy;

impl Guest for Policy {
    fn validate_settings(settings: String) -> Result<(), String> {
        Settings::none(&settings)
    }

    fn decide(input: RunnerEnding) -> Result<DeregistrationDecision, String> {
        Settings::none(&input.settings)?;
        Ok(decide(&input))
    }
}

export!(Policy);

#[cfg(test)]
mod tests {
    use super::*;

    fn ending(
        phase: RunnerPhase,
        exit_code: Option<i32>,
        had_job: bool,
        registered: bool,
    ) -> RunnerEnding {
        RunnerEnding {
            name: "r".into(),
            namespace: "ns".into(),
            phase,
            exit_code,
            reason: String::new(),
            had_job,
            registered,
            settings: String::new(),
        }
    }

    #[test]
    fn long_termination_reasons_are_cut_on_a_character_boundary() {
        let mut input = ending(RunnerPhase::Failed, Some(1), false, true);
        input.reason = "é".repeat(5_000);
        let reason = decide(&input).reason;
        assert!(reason.len() < 400, "{}", reason.len());
        assert!(reason.contains(&"é".repeat(64)));
    }

    /// Only a clean exit skips the API call, whatever else is true: every
    /// other combination of inputs ends in a removal.
    #[test]
    fn only_a_clean_exit_skips_the_call() {
        let phases = [
            RunnerPhase::Pending,
            RunnerPhase::Running,
            RunnerPhase::Succeeded,
            RunnerPhase::Failed,
            RunnerPhase::Outdated,
        ];
        for phase in phases {
            for exit_code in [None, Some(0), Some(1), Some(137)] {
                for had_job in [false, true] {
                    for registered in [false, true] {
                        let verdict =
                            decide(&ending(phase, exit_code, had_job, registered)).verdict;
                        let clean =
                            phase == RunnerPhase::Succeeded && matches!(exit_code, None | Some(0));
                        assert_eq!(
                            verdict == Verdict::SelfDeregistered,
                            clean,
                            "{phase:?} {exit_code:?} {had_job} {registered}"
                        );
                        if !clean && had_job {
                            assert_eq!(verdict, Verdict::RemoveAfterJob);
                        }
                    }
                }
            }
        }
    }
}
