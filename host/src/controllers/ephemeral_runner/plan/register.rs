//! A runner without a pod: registered (once) and its pod created
//! (`absent`, rule 11), or failed when the API server refuses the pod
//! (`refused`, rule 3).

use super::delete::ensure_gone;
use super::{Need, Pass, Plan, RegistrationRecord, Step, elapsed};
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
    if obs.secret.is_none() {
        // The Secret of the job before a renewal, written over by the new
        // registration.
        let earlier = pass
            .all
            .secret
            .as_ref()
            .filter(|s| s.renewal != status.renewals());
        // Whether this is the runner's first registration is decided here,
        // on the status as read: only a later one is written to the status
        // with it (see `Step::Register`).
        let first = status.runner_id == 0 && status.is_true(RunnerCondition::Registered).is_none();
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
