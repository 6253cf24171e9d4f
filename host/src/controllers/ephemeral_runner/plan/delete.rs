//! How a runner's registration, pod and Secret go: the registration first
//! (`ensure_gone`), always, then the pod and Secret (`clean_up`,
//! `terminate`); for a runner being deleted (`deleted`) and one that
//! ended (`ended`).

use std::time::Duration;

use super::{Need, Observed, Pass, PodView, PoolView, Step, VerdictView, elapsed};
use crate::api::ephemeral_runner::RunnerCondition;
use crate::api::ephemeral_runner::{EventReason, PolicyFallbackReason, RegisteredReason};
use crate::api::{EphemeralRunner, EphemeralRunnerPhase, EphemeralRunnerStatus};
use crate::controllers::kit::Severity;
use crate::policy::types::{RunnerEnding, RunnerPhase, Verdict};

/// Whether the registration is gone, or its going is under way.
pub(super) enum Registration {
    Gone,
    Pending,
}

/// What a clean-up leaves.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Keep {
    Nothing,
    /// The Secret of a runner that succeeded: if its set renews it, the
    /// next registration is written over it (one write, where deleting it
    /// now would make two); if not, it goes with the runner. It holds a
    /// config whose registration is gone, which nothing can use.
    Secret,
}

impl Keep {
    pub(super) fn for_ended(phase: EphemeralRunnerPhase) -> Self {
        if phase == EphemeralRunnerPhase::Succeeded {
            Self::Secret
        } else {
            Self::Nothing
        }
    }
}

/// Rule 1: a runner being deleted lets its finalizer go once its
/// registration, and then its pod and Secret of any renewal and what the
/// runner container hooks made for its jobs, are gone.
pub(super) fn deleted(pass: &mut Pass<'_>) -> Result<(), Need> {
    let status = pass.status;
    if let Registration::Gone = ensure_gone(pass, status, true)? {
        let all = pass.all;
        let owned_gone = clean_up(pass, all, Keep::Nothing);
        if hook_objects_gone(pass)? && owned_gone {
            pass.step(Step::RemoveFinalizer);
        }
    }
    Ok(())
}

/// Whether the pods and Secrets the runner container hooks made for the
/// runner are all gone or being deleted; deletes those that are not. Asked
/// only once the registration is gone, since a job pod deleted earlier is a
/// job killed. Those already being deleted are not waited for: a pod on a
/// lost node would hold the runner forever, and nothing of the runner's
/// needs them gone.
fn hook_objects_gone(pass: &mut Pass<'_>) -> Result<bool, Need> {
    if !super::uses_container_hooks(pass.obs.runner) {
        return Ok(true);
    }
    match pass.obs.hook_objects {
        None => Err(Need::HookObjects),
        Some(0) => Ok(true),
        Some(_) => {
            pass.step(Step::DeleteHookObjects);
            pass.requeue_after(Duration::from_secs(1));
            Ok(false)
        }
    }
}

/// Rule 7: a runner that ended has its registration made gone, then its pod
/// and Secret (of any renewal) deleted, but for what it keeps.
pub(super) fn ended(pass: &mut Pass<'_>, phase: EphemeralRunnerPhase) -> Result<(), Need> {
    let status = pass.status;
    if let Registration::Gone = ensure_gone(pass, status, true)? {
        let all = pass.all;
        clean_up(pass, all, Keep::for_ended(phase));
    }
    Ok(())
}

/// The verdict a removal in progress was requested with, from the reason
/// the `Registered` condition recorded when it was handed to the pool.
fn requested_verdict(status: &EphemeralRunnerStatus) -> &'static str {
    match status.reason_of::<RegisteredReason>() {
        Some(RegisteredReason::RemoveAfterJob) => "remove-after-job",
        _ => "remove-now",
    }
}

fn verdict_label(verdict: Verdict) -> &'static str {
    match verdict {
        Verdict::SelfDeregistered => "self-deregistered",
        Verdict::RemoveNow => "remove-now",
        Verdict::RemoveAfterJob => "remove-after-job",
    }
}

/// How the runner ended, for the deregistration policy.
fn ending(
    runner: &EphemeralRunner,
    status: &EphemeralRunnerStatus,
    runner_id: i64,
) -> RunnerEnding {
    let phase = match status.phase.unwrap_or_default() {
        EphemeralRunnerPhase::Pending => RunnerPhase::Pending,
        EphemeralRunnerPhase::Running => RunnerPhase::Running,
        EphemeralRunnerPhase::Succeeded => RunnerPhase::Succeeded,
        // The policy world has no Debugging: a held runner's job failed.
        EphemeralRunnerPhase::Failed | EphemeralRunnerPhase::Debugging => RunnerPhase::Failed,
        EphemeralRunnerPhase::Outdated => RunnerPhase::Outdated,
    };
    RunnerEnding {
        name: runner.metadata.name.clone().unwrap_or_default(),
        namespace: runner.metadata.namespace.clone().unwrap_or_default(),
        phase,
        exit_code: status.exit_code,
        reason: status.termination_reason.clone().unwrap_or_default(),
        had_job: status.has_job(),
        registered: runner_id != 0,
    }
}

/// Makes sure the pass's registration is gone, as `status` tells of it:
/// proven gone already, self-deregistered (per the policy, when
/// `ask_policy`), or handed to the pool and waited for. Adds the steps and
/// status fields that takes.
pub(super) fn ensure_gone(
    pass: &mut Pass<'_>,
    status: &EphemeralRunnerStatus,
    ask_policy: bool,
) -> Result<Registration, Need> {
    let mut ask_policy = ask_policy;
    if status.is_true(RunnerCondition::Registered) == Some(false) {
        return Ok(Registration::Gone);
    }
    if pass.runner_id == 0 {
        // Nothing recorded, which is not proof of nothing registered: the
        // service is asked by name (a host that stopped between the
        // registration and its Secret left one), and what it has is
        // recorded and removed like any registration, with no policy to
        // ask (it never ran).
        match pass.obs.registered_by_name {
            None => return Err(Need::RegistrationByName),
            Some(None) => {
                pass.condition(
                    RegisteredReason::NeverRegistered,
                    "the runner was never registered",
                );
                return Ok(Registration::Gone);
            }
            Some(Some(found)) => {
                let name = pass.obs.runner.metadata.name.clone().unwrap_or_default();
                pass.change.record_registration(found, &name, pass.obs.now);
                pass.runner_id = found;
                ask_policy = false;
            }
        }
    }
    let runner_id = pass.runner_id;
    let obs = pass.obs;
    let settings = pass.settings;
    let verdict = || -> Result<(&'static str, Option<&VerdictView>), Need> {
        if !ask_policy {
            return Ok(("remove-now", None));
        }
        match &obs.verdict {
            Some(v) => Ok((verdict_label(v.verdict), Some(v))),
            None => Err(Need::Verdict(ending(obs.runner, status, runner_id))),
        }
    };
    match &obs.pool {
        PoolView::Claimed => {
            pass.requeue_after(settings.removal_recheck);
            Ok(Registration::Pending)
        }
        PoolView::Removed | PoolView::NotFound => {
            let (reason, outcome, message) = if obs.pool == PoolView::Removed {
                (
                    RegisteredReason::Removed,
                    "removed",
                    format!("registration {runner_id} was removed from the service"),
                )
            } else {
                (
                    RegisteredReason::NotFound,
                    "not-found",
                    format!("registration {runner_id} was already gone from the service"),
                )
            };
            pass.condition(reason, &message);
            pass.event(Severity::Normal, EventReason::RegistrationRemoved, message);
            pass.step(Step::CountDeregistration {
                verdict: requested_verdict(status),
                outcome,
            });
            Ok(Registration::Gone)
        }
        PoolView::Failed(message) => {
            pass.event(
                Severity::Warning,
                EventReason::DeregistrationFailed,
                format!(
                    "removing registration {runner_id} failed, retrying in {:?}: {message}",
                    settings.removal_retry
                ),
            );
            pass.step(Step::CountDeregistration {
                verdict: requested_verdict(status),
                outcome: "failed",
            });
            pass.requeue_after(settings.removal_retry);
            Ok(Registration::Pending)
        }
        PoolView::Idle => {
            let (label, view) = verdict()?;
            if let Some(view) = view {
                report_fallback(pass, status, view);
                if view.verdict == Verdict::SelfDeregistered {
                    let message =
                        format!("registration {runner_id} was removed by the runner itself");
                    pass.condition(RegisteredReason::SelfDeregistered, &message);
                    pass.step(Step::CountDeregistration {
                        verdict: label,
                        outcome: "skipped",
                    });
                    return Ok(Registration::Gone);
                }
            }
            let reason = if label == "remove-after-job" {
                RegisteredReason::RemoveAfterJob
            } else {
                RegisteredReason::RemoveNow
            };
            pass.condition(
                reason,
                &format!("removal of registration {runner_id} requested ({label})"),
            );
            pass.step(Step::Deregister { runner_id });
            pass.event(
                Severity::Normal,
                EventReason::Deregistering,
                format!("removing registration {runner_id} from the service ({label}) before the pod is deleted"),
            );
            pass.requeue_after(settings.removal_recheck);
            Ok(Registration::Pending)
        }
    }
}

/// Records whether the configured deregistration policy decided or its
/// bundled default did; a fallback is told once as an event.
fn report_fallback(pass: &mut Pass<'_>, status: &EphemeralRunnerStatus, view: &VerdictView) {
    let fell_back = status.is_true(RunnerCondition::DeregistrationPolicyFallback);
    match &view.fallback_reason {
        Some(reason) => {
            let message = format!(
                "the deregistration policy failed and the bundled default decided: {reason}"
            );
            if fell_back != Some(true) {
                pass.event(
                    Severity::Warning,
                    EventReason::PolicyFallback,
                    message.clone(),
                );
            }
            pass.condition(PolicyFallbackReason::Fallback, &message);
        }
        None if fell_back == Some(true) => {
            pass.condition(
                PolicyFallbackReason::PolicyAnswered,
                "the configured policy decided",
            );
        }
        None => {}
    }
}

/// Deletes the pod (or force-deletes one stuck terminating) and the Secret
/// that `seen` shows, unless it is kept. Returns whether both are gone
/// already.
pub(super) fn clean_up(pass: &mut Pass<'_>, seen: &Observed<'_>, keep: Keep) -> bool {
    let mut gone = true;
    if let Some(pod) = &seen.pod {
        gone = false;
        terminate(pass, pod);
    }
    if seen.secret.is_some() && keep != Keep::Secret {
        gone = false;
        pass.step(Step::DeleteSecret);
    }
    gone
}

/// Deletes the pod, or, when it is already terminating, waits for it up to
/// the bound and then force-deletes it (rules 4 and 9).
pub(super) fn terminate(pass: &mut Pass<'_>, pod: &PodView) {
    match pod.deleting_since {
        None => {
            pass.step(Step::DeletePod {
                uid: pod.uid.clone(),
            });
        }
        Some(since) => {
            let waited = elapsed(since, pass.obs.now);
            let bound = pass.settings.terminating_timeout;
            if waited >= bound {
                pass.step(Step::ForceDeletePod {
                    uid: pod.uid.clone(),
                });
                pass.event(
                    Severity::Warning,
                    EventReason::PodForceDeleted,
                    format!(
                        "pod was still terminating {}s after its deletion (its node is probably lost); deleted it with grace 0",
                        waited.as_secs()
                    ),
                );
                pass.requeue_after(Duration::from_secs(1));
            } else {
                pass.requeue_after(bound - waited);
            }
        }
    }
}
