//! Holding a failed job's runner for someone to look inside: entering the
//! hold ([`hold`], within rule 10) and keeping it until it ends
//! (`debugging`, rule 6).

use jiff::Timestamp;

use super::delete::{Keep, Registration, clean_up, ensure_gone};
use super::run::Exit;
use super::{Need, Pass, Step, elapsed};
use crate::api::annotations::HOLD_UNTIL;
use crate::api::ephemeral_runner::hold::{HeldFailure, Hold};
use crate::api::ephemeral_runner::{
    EventReason, HeldReason, HoldCause, PhaseReason, RunnerCondition,
};
use crate::api::{EphemeralRunner, EphemeralRunnerPhase, EphemeralRunnerStatus};
use crate::controllers::kit::Severity;

fn hold_annotation(runner: &EphemeralRunner) -> Option<&str> {
    runner
        .metadata
        .annotations
        .as_ref()?
        .get(HOLD_UNTIL)
        .map(String::as_str)
}

/// Holds the runner for debugging if its debug spec says so and the scale
/// set's `maxHeld` allows: phase Debugging, the registration handed to the
/// pool (so it takes no other job), the pod left alone. Returns whether it
/// did; when it did not, the runner ends as it would have without a hold.
pub(super) fn hold(
    pass: &mut Pass<'_>,
    exit: Option<Exit<'_>>,
    cause: HoldCause,
) -> Result<bool, Need> {
    let (obs, status) = (pass.obs, pass.status);
    let why = cause.why(exit.map(|e| (e.code, e.reason)));
    let already = |reason| status.reason_of::<HeldReason>() == Some(reason);
    let hold = match Hold::from_spec(obs.runner.spec.debug.as_ref()) {
        Ok(Some(hold)) => hold,
        Ok(None) => return Ok(false),
        Err(error) => {
            let message = format!("{why}; not held for debugging: {error}");
            if !already(HeldReason::InvalidDebugSpec) {
                pass.event(
                    Severity::Warning,
                    EventReason::InvalidDebugSpec,
                    message.clone(),
                );
            }
            pass.condition(HeldReason::InvalidDebugSpec, &message);
            return Ok(false);
        }
    };
    let Some(held) = obs.held else {
        return Err(Need::HeldCount);
    };
    if held >= usize::try_from(hold.max_held).unwrap_or(usize::MAX) {
        let message = format!(
            "{why}; not held for debugging: {held} runner(s) of the scale set are held already (maxHeld {})",
            hold.max_held
        );
        if !already(HeldReason::MaxHeld) {
            pass.event(Severity::Normal, EventReason::NotHeld, message.clone());
        }
        pass.condition(HeldReason::MaxHeld, &message);
        return Ok(false);
    }
    let since = status.job_finished_at.as_ref().map_or(obs.now, |t| t.0);
    let deadline = hold.deadline(since, hold_annotation(obs.runner));
    if deadline.at <= obs.now {
        // The failure was learnt after its hold would have ended (the
        // controller was down): holding now would only tell Slack of a
        // runner about to go.
        return Ok(false);
    }
    // The message is for people; why the runner is held is kept in the
    // status for the passes to come (`holdCause`), never read back from it.
    let message = format!(
        "{why}; held for debugging until {}{}",
        deadline.at,
        deadline.note.map(|n| format!(" ({n})")).unwrap_or_default()
    );
    pass.change.phase_because(
        EphemeralRunnerPhase::Debugging,
        PhaseReason::HeldForDebugging,
        message.clone(),
    );
    pass.change.ready(false);
    pass.change.held_since(since);
    pass.change.hold_until(deadline.at);
    pass.change.hold_cause(cause);
    if let Some(exit) = exit {
        pass.change.exit(exit.code, exit.reason);
    }
    pass.condition(HeldReason::HeldForDebugging, &message);
    pass.event(Severity::Warning, EventReason::HeldForDebugging, message);
    if tells_slack(obs.runner) {
        pass.step(Step::NotifySlack(held_failure(
            obs.runner,
            status,
            &why,
            deadline.at,
        )));
    }
    ensure_gone(pass, status, false)?;
    pass.requeue_after(elapsed(obs.now, deadline.at));
    Ok(true)
}

/// Whether the runner's debug spec names a Slack channel.
fn tells_slack(runner: &EphemeralRunner) -> bool {
    runner
        .spec
        .debug
        .as_ref()
        .is_some_and(|d| d.slack.is_some())
}

/// What the Slack post about a held runner says: the job as the listener
/// recorded it.
fn held_failure(
    runner: &EphemeralRunner,
    status: &EphemeralRunnerStatus,
    why: &str,
    hold_until: Timestamp,
) -> HeldFailure {
    HeldFailure {
        namespace: runner.metadata.namespace.clone().unwrap_or_default(),
        runner: runner.metadata.name.clone().unwrap_or_default(),
        repository: status.job_repository_name.clone(),
        workflow: status.job_workflow_ref.clone(),
        job: status.job_display_name.clone(),
        why: why.to_string(),
        hold_until,
    }
}

/// A held runner: its registration goes (if it has not yet), its pod stays
/// until the hold ends, then phase Failed (`HoldEnded`) and the pod and
/// Secret go, registration first as always. A pod that vanished or is
/// being deleted ends the hold at once: there is nothing left to look at.
pub(super) fn debugging(pass: &mut Pass<'_>) -> Result<(), Need> {
    let (obs, status) = (pass.obs, pass.status);
    let since = status
        .held_since
        .as_ref()
        .or(status.job_finished_at.as_ref())
        .map_or(obs.now, |t| t.0);
    let deadline = match Hold::from_spec(obs.runner.spec.debug.as_ref()) {
        Ok(Some(hold)) => Some(hold.deadline(since, hold_annotation(obs.runner))),
        Ok(None) | Err(_) => None,
    };
    let pod_kept = obs.pod.as_ref().is_some_and(|p| p.deleting_since.is_none());
    let registration = ensure_gone(pass, status, false)?;
    match deadline {
        Some(deadline) if pod_kept && obs.now < deadline.at => {
            pass.change.hold_until(deadline.at);
            if let Some(note) = deadline.note {
                pass.change.message(Some(note));
            }
            // Slack has not accepted a post about this hold yet: the host
            // stopped before it was made, or Slack refused it.
            if tells_slack(obs.runner)
                && status.is_true(RunnerCondition::SlackNotified) != Some(true)
            {
                pass.step(Step::NotifySlack(held_failure(
                    obs.runner,
                    status,
                    &status.why_held(),
                    deadline.at,
                )));
            }
            pass.requeue_after(elapsed(obs.now, deadline.at));
        }
        _ => {
            let why = match deadline {
                _ if !pod_kept => "the runner pod is gone".to_string(),
                None => "the runner's debug spec no longer holds it".to_string(),
                Some(deadline) => format!("the debug hold ended at {}", deadline.at),
            };
            pass.change.phase_because(
                EphemeralRunnerPhase::Failed,
                PhaseReason::HoldEnded,
                why.clone(),
            );
            pass.condition(HeldReason::HoldEnded, &why);
            pass.event(Severity::Normal, EventReason::HoldEnded, why);
            if let Registration::Gone = registration {
                let current = pass.obs;
                clean_up(pass, current, Keep::Nothing);
            }
        }
    }
    Ok(())
}
