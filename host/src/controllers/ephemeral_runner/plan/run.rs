//! A runner whose pod exists and is not being deleted (rule 10): its pod
//! followed into the status, its exit turned into its ending, a start that
//! failed counted and retried, and the registration timeout kept.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::delete::{Registration, ensure_gone};
use super::{Need, OUTDATED_EXIT_CODE, Pass, PodView, Presence, RunnerContainer, Step, elapsed};
use super::{hold, recycle};
use crate::api::EphemeralRunnerPhase;
use crate::api::ephemeral_runner::hold::{Hold, parse_duration};
use crate::api::ephemeral_runner::{
    EventReason, HoldCause, OnlineReason, PhaseReason, RunnerCondition,
};
use crate::controllers::kit::Severity;

/// How the runner container ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Exit<'p> {
    /// Its exit code.
    pub(super) code: i32,
    /// The kubelet's reason (`Completed`, `Error`, `OOMKilled`).
    pub(super) reason: &'p str,
}

/// The pod exists and is not terminating.
pub(super) fn running(pass: &mut Pass<'_>, pod: &PodView) -> Result<(), Need> {
    let (obs, status) = (pass.obs, pass.status);
    let exit = match &pod.runner {
        RunnerContainer::Terminated { exit_code, reason } => Some(Exit {
            code: *exit_code,
            reason,
        }),
        _ => None,
    };
    let exited_clean = exit.is_some_and(|e| e.code == 0);
    if let Some(max_idle_age) = recycle::max_idle_age(obs.runner)
        && recycle::recycling(status)
        && !status.has_job()
        && exited_clean
    {
        // A runner exits 0 once its registration is gone: when recycling
        // removed it, that exit is the recycling's own doing, not the
        // runner finishing, so the recycling goes on (pod and Secret
        // deleted, a new registration) instead of the runner ending
        // Succeeded and its set replacing it under a new name.
        return recycle::recycle(pass, pod, max_idle_age);
    }
    if let Some(cause) = job_failure(pass, exit, pod) {
        if hold::hold(pass, exit, cause)? {
            return Ok(());
        }
    } else if let Some(wait) = result_pending(pass, exit, pod) {
        pass.requeue_after(wait);
        return Ok(());
    }
    if let Some(exit) = exit {
        pass.change.exit(exit.code, exit.reason);
        pass.change.ready(false);
        if exit.code == 0 {
            pass.change.phase_because(
                EphemeralRunnerPhase::Succeeded,
                PhaseReason::Completed,
                "the runner exited 0",
            );
            // No event: a runner succeeding is the everyday case, and an
            // event per runner would be a write per job that tells nothing
            // the phase does not.
            return Ok(());
        }
        if exit.code == OUTDATED_EXIT_CODE {
            let message = "the runner exited 7: its version is outdated and the service refuses it";
            pass.end_badly(
                EphemeralRunnerPhase::Outdated,
                PhaseReason::Outdated,
                EventReason::RunnerOutdated,
                message,
            );
            return Ok(());
        }
    }
    let init_failed = super::init_failed(obs.runner, pod);
    if exit.is_some() || pod.failed || init_failed {
        let why = match (exit, &pod.failure_message) {
            (Some(exit), _) => format!("the runner exited {} ({})", exit.code, exit.reason),
            (None, Some(message)) => format!("the pod failed: {message}"),
            (None, None) if init_failed => "an init container failed".to_string(),
            (None, None) => "the pod failed".to_string(),
        };
        if status.has_job() {
            // The job is lost with the runner; a new pod cannot take it back.
            pass.end_badly(
                EphemeralRunnerPhase::Failed,
                PhaseReason::JobFailed,
                EventReason::RunnerFailed,
                format!("{why} while running a job"),
            );
            return Ok(());
        }
        return failed_start(pass, pod, EventReason::RunnerPodFailed, &why);
    }

    let phase = if pod.runner == RunnerContainer::Running {
        EphemeralRunnerPhase::Running
    } else {
        EphemeralRunnerPhase::Pending
    };
    // No phase reads as Pending: a pod still starting costs no write.
    if status.phase.unwrap_or_default() != phase {
        pass.change.phase(phase);
        pass.change.reason(None);
        pass.change.message(None);
    }
    if status.ready != pod.ready {
        pass.change.ready(pod.ready);
    }
    // A busy runner's node is kept from scale-down when its set asks: one
    // pod write per job, the idle pod having been created evictable.
    if obs.runner.spec.protect_busy_runners == Some(true)
        && status.has_job()
        && pod.runner == RunnerContainer::Running
        && !pod.eviction_protected
    {
        pass.step(Step::ProtectFromEviction {
            uid: pod.uid.clone(),
        });
    }

    if let Some(max_idle_age) = recycle::max_idle_age(obs.runner)
        && pod.runner == RunnerContainer::Running
        && pass.runner_id != 0
        && !status.has_job()
    {
        let age = elapsed(pod.created, obs.now);
        if age >= max_idle_age {
            return recycle::recycle(pass, pod, max_idle_age);
        }
        pass.requeue_after(max_idle_age - age);
    }

    if status.is_true(RunnerCondition::RunnerOnline) == Some(true) || status.has_job() {
        return Ok(());
    }
    let timeout = registration_timeout(pass);
    // Still initialising: the clock has not started, and the pod's next
    // status change wakes the runner.
    let Some(since) = pod.registration_clock else {
        return Ok(());
    };
    let age = elapsed(since, obs.now);
    if age < timeout {
        pass.requeue_after(timeout - age);
        return Ok(());
    }
    match obs.presence {
        None => Err(Need::Presence(pass.runner_id)),
        Some(Presence::Online) => {
            pass.condition(OnlineReason::Online, "the service sees the runner online");
            Ok(())
        }
        Some(presence) => {
            let why = format!(
                "the runner did not come online within {}s of its container's start ({})",
                timeout.as_secs(),
                if presence == Presence::Absent {
                    "the service does not know it"
                } else {
                    "offline"
                }
            );
            failed_start(pass, pod, EventReason::RegistrationTimeout, &why)
        }
    }
}

/// The runner's `spec.registrationTimeout` when it has a usable one (the
/// apiserver refuses what is not a duration; `0s` means the default), else
/// the host's.
fn registration_timeout(pass: &Pass<'_>) -> Duration {
    pass.obs
        .runner
        .spec
        .registration_timeout
        .as_deref()
        .and_then(|text| parse_duration("registrationTimeout", text).ok())
        .filter(|timeout| !timeout.is_zero())
        .unwrap_or(pass.settings.registration_timeout)
}

/// Why the runner's job failed, if it did: the result the listener recorded
/// on JobCompleted, or the runner ending badly while it had a job.
fn job_failure(pass: &Pass<'_>, exit: Option<Exit<'_>>, pod: &PodView) -> Option<HoldCause> {
    let status = pass.status;
    if status
        .job_result
        .as_deref()
        .is_some_and(|r| r.eq_ignore_ascii_case("failed"))
    {
        return Some(HoldCause::JobFailed);
    }
    if !status.has_job() {
        return None;
    }
    match exit {
        Some(Exit {
            code: 0 | OUTDATED_EXIT_CODE,
            ..
        }) => None,
        Some(_) => Some(HoldCause::RunnerExited),
        None if pod.failed || super::init_failed(pass.obs.runner, pod) => {
            Some(HoldCause::PodFailed)
        }
        None => None,
    }
}

/// How long to wait before calling a runner that exited 0 after a job
/// Succeeded, when its job's result may still be on its way and a failed
/// one would be held (see `super::Settings::result_wait`).
fn result_pending(pass: &Pass<'_>, exit: Option<Exit<'_>>, pod: &PodView) -> Option<Duration> {
    let status = pass.status;
    let exited_clean = exit.is_some_and(|e| e.code == 0);
    if !exited_clean || !status.has_job() || status.job_result.is_some() {
        return None;
    }
    if !matches!(
        Hold::from_spec(pass.obs.runner.spec.debug.as_ref()),
        Ok(Some(_))
    ) {
        return None;
    }
    let wait = pass.settings.result_wait;
    let waited = elapsed(pod.finished?, pass.obs.now);
    (waited < wait).then(|| wait - waited)
}

/// A start that failed before the runner could run a job: counted, and the
/// runner is recreated (registration removed first, then pod and Secret)
/// after a backoff, or marked Failed once the limit is reached.
pub(super) fn failed_start(
    pass: &mut Pass<'_>,
    pod: &PodView,
    reason: EventReason,
    why: &str,
) -> Result<(), Need> {
    let status = pass.status;
    let limit = pass.settings.failure_limit;
    let mut failures: BTreeMap<String, Time> = status.failures.clone();
    if !failures.contains_key(&pod.uid) {
        failures.insert(pod.uid.clone(), Time(pass.obs.now));
        let failed = failures.len();
        pass.change.failures(failures);
        if failed >= limit {
            let message =
                format!("{why}; {failed} failed starts, the limit, so the runner is not recreated");
            pass.end_badly(
                EphemeralRunnerPhase::Failed,
                PhaseReason::TooManyFailures,
                EventReason::RunnerFailed,
                message,
            );
            return Ok(());
        }
        pass.event(
            Severity::Warning,
            reason,
            format!(
                "{why}; failed start {failed} of {limit}, recreating the runner in {:?}",
                pass.settings.backoff(failed)
            ),
        );
        pass.change.phase(EphemeralRunnerPhase::Pending);
        pass.change.ready(false);
    }
    if let Registration::Gone = ensure_gone(pass, status, false)? {
        pass.delete_pod_and_secret(pod);
    }
    Ok(())
}
