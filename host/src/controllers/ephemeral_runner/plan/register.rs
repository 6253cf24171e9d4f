//! A runner without a pod: admitted (`admitted`), registered (once) and
//! its pod created (`absent`, rule 11), or failed when the API server
//! refuses the pod (`refused`, rule 3).

use super::delete::ensure_gone;
use super::{
    ADMISSION_RETRY, Admission, Need, Pass, Plan, Refusal, RegistrationRecord, Severity, Step,
    elapsed,
};
use crate::api::EphemeralRunnerPhase;
use crate::api::ephemeral_runner::{EventReason, PhaseReason, RunnerCondition};

/// No pod: register if needed, then create the pod, minding the backoff.
pub(super) fn absent(pass: &mut Pass<'_>) -> Result<(), Need> {
    let (obs, status) = (pass.obs, pass.status);
    let gone = status.is_true(RunnerCondition::Registered) == Some(false);
    if obs.secret.is_some() {
        // A Secret naming another registration than the status was
        // recorded before the rules (see `registration_id`).
        if gone {
            // Its registration is gone (a crash before the Secret was
            // deleted): a pod made from it could not start.
            pass.step(Step::DeleteSecret);
            return Ok(());
        }
    } else if pass.runner_id != 0 && !gone {
        // The Secret vanished while the registration exists: the config
        // cannot be read back, so the registration goes and a new one is made.
        ensure_gone(pass, status, false)?;
        return Ok(());
    }
    if let Some(last) = status.failures.values().map(|t| t.0).max() {
        let wait = pass.settings.backoff(status.failures.len());
        let waited = elapsed(last, obs.now);
        if waited < wait {
            pass.requeue_after(wait - waited);
            return Ok(());
        }
    }
    let first = obs.secret.is_none()
        && status.runner_id == 0
        && status.is_true(RunnerCondition::Registered).is_none();
    if !admitted(pass, first)? {
        return Ok(());
    }
    if obs.secret.is_none() {
        // The Secret of the job before a renewal, written over by the new
        // registration.
        let earlier = pass
            .all
            .secret
            .as_ref()
            .filter(|s| s.renewal != status.renewals());
        // Whether this is the runner's first registration is decided on
        // the status as read: only a later one is written to the status
        // with it (see `Step::Register`).
        // The pod in the same pass: registering records the registration
        // (Secret, then status) before it returns, and a pod that cannot be
        // created is retried from that record.
        pass.step(Step::Register {
            replacing: earlier.map(|s| s.resource_version.clone()),
            record: (!first).then(|| RegistrationRecord::new(status, obs.now)),
        });
    }
    pass.step(Step::CreatePod);
    Ok(())
}

/// Whether the runner may go on to its registration and pod
/// ([`Admission`]); if not, what it does instead is planned.
fn admitted(pass: &mut Pass<'_>, first: bool) -> Result<bool, Need> {
    match &pass.obs.admission {
        None => Err(Need::Admission { first }),
        Some(Admission::Admitted) => Ok(true),
        Some(Admission::Refused { refusal, message }) => {
            let (phase_reason, event) = match refusal {
                Refusal::NotOwned => (PhaseReason::NotOwned, EventReason::NotOwned),
                Refusal::PodRefused => (PhaseReason::PodRefused, EventReason::PodRefused),
            };
            pass.end_badly(
                EphemeralRunnerPhase::Failed,
                phase_reason,
                event,
                message.clone(),
            );
            Ok(false)
        }
        Some(Admission::Waiting(message)) => {
            pass.event(
                Severity::Warning,
                EventReason::PodValidationUnavailable,
                format!("{message}; no pod is made until it judges"),
            );
            pass.requeue_after(ADMISSION_RETRY);
            Ok(false)
        }
    }
}

/// The API server refused the runner pod as invalid: the template makes a
/// pod that is refused every time, so the runner is Failed (`InvalidPod`)
/// rather than retried.
///
/// This plan is made again on the reconcile's own reading, after the steps
/// of the first (which may have registered the runner) were applied. That
/// reading does not show what those steps did, so it decides the refusal
/// and nothing else: the runner's ending (its registration's removal,
/// then its pod's and Secret's) is decided by the next reconcile, which
/// the status write wakes, on a fresh reading.
pub(super) fn refused(mut pass: Pass<'_>, refusal: &str) -> Plan {
    let message = format!("the runner pod is invalid: {refusal}");
    pass.end_badly(
        EphemeralRunnerPhase::Failed,
        PhaseReason::InvalidPod,
        EventReason::InvalidPod,
        message,
    );
    // Not `Pass::finish`: copying a first registration into the status is
    // for a write decided on a reading that shows it.
    let resource_version = pass.obs.runner.metadata.resource_version.as_deref();
    if let Some(change) = pass.change.into_change(resource_version) {
        pass.plan.steps.insert(0, Step::PatchStatus(change));
    }
    pass.plan
}
