//! Rule 12, for a runner that succeeded in this pass: renewed in place, in
//! the same pass, when a job waits for it (see [`crate::backlog`]).
//!
//! The set's own renewal (see `RunnerRenewal`) waits for the runner's
//! status to say Succeeded, then for the listener's next decision, and
//! costs three status writes a job: the runner Succeeded, the set's
//! renewal, the next registration copied in. Here the pass that sees the
//! runner exit 0 with its registration gone asks its set whether a job
//! waits that no other runner covers; if one does, it registers the runner
//! anew and writes the whole status once (the renewal, how the job before
//! ended, the new registration), then deletes the pod of the job before
//! and creates the next. Four writes a job: the Secret, the status, the
//! two pods. The registration goes first into the Secret, as every
//! registration does, so none is ever without a record (see
//! `registration_id`).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::{Need, Pass, Plan, RunnerContainer, SecretView, Step};
use crate::api::{EphemeralRunnerPhase, EphemeralRunnerStatus, PreviousJob, RunnerRenewal};

/// Renews the runner in place if it succeeded in this pass (`ended` is its
/// status as this pass ends it, registration gone) and its set grants it:
/// `true` when the pass's steps are the renewal's.
pub(super) fn in_place(
    pass: &mut Pass<'_>,
    ended: &EphemeralRunnerStatus,
    phase: EphemeralRunnerPhase,
) -> Result<bool, Need> {
    if phase != EphemeralRunnerPhase::Succeeded || ended.exit_code != Some(0) {
        return Ok(false);
    }
    let Some(pod) = pass.obs.pod.as_ref().filter(|p| p.deleting_since.is_none()) else {
        return Ok(false);
    };
    let grant = match &pass.obs.renewal {
        None => return Err(Need::Renewal),
        Some(None) => return Ok(false),
        Some(Some(grant)) => grant.clone(),
    };
    let now = pass.obs.now;
    let renewal = RunnerRenewal {
        count: pass.status.renewals().saturating_add(1),
        // No decision's: the set counts the runner as one it has, and a
        // decision it has not acted on is still to be acted on.
        patch_id: 0,
        set_generation: grant.set_generation,
        renewed_at: Time(now),
        previous: Some(PreviousJob {
            runner_id: pass.runner_id,
            job_id: grant.job_id.or_else(|| ended.job_id.clone()),
            job_result: ended.job_result.clone(),
            exit_code: ended.exit_code,
            ended_at: Time(now),
        }),
    };
    let uid = pod.uid.clone();
    // The steps the ending decided but its status write (the metrics of
    // the deregistration) stay; the status is the renewal's.
    pass.step(Step::Renew {
        replacing: pass.obs.secret.as_ref().map(|s| s.resource_version.clone()),
        renewal,
        resource_version: pass.obs.runner.metadata.resource_version.clone(),
        registered: None,
    });
    pass.step(Step::DeletePod { uid });
    pass.step(Step::CreatePod);
    pass.plan.requeue = None;
    Ok(true)
}

/// Rule 0: the Secret was made for the renewal after the status's, by a
/// renewal in place whose status write did not go through. Its
/// registration is live and recorded nowhere else, so the renewal is
/// completed with it before anything else is decided: the status written
/// anew, the job before's pod deleted and the next created. The job
/// before's outcome is what its pod still says.
pub(super) fn resume(mut pass: Pass<'_>, secret: &SecretView) -> Plan {
    let obs = pass.all;
    let now = obs.now;
    let status = pass.status;
    let exit_code = obs
        .pod
        .as_ref()
        .filter(|p| p.renewal < secret.renewal)
        .and_then(|p| match &p.runner {
            RunnerContainer::Terminated { exit_code, .. } => Some(*exit_code),
            _ => None,
        });
    let renewal = RunnerRenewal {
        count: secret.renewal,
        patch_id: 0,
        set_generation: 0,
        renewed_at: Time(now),
        previous: Some(PreviousJob {
            runner_id: status.runner_id,
            job_id: status.job_id.clone(),
            job_result: status.job_result.clone(),
            exit_code,
            ended_at: Time(now),
        }),
    };
    pass.step(Step::Renew {
        replacing: None,
        renewal,
        resource_version: obs.runner.metadata.resource_version.clone(),
        registered: Some((secret.runner_id, secret.runner_name.clone())),
    });
    // Only the job before's: a pod made for this renewal is its own.
    if let Some(pod) = obs
        .pod
        .as_ref()
        .filter(|p| p.deleting_since.is_none() && p.renewal < secret.renewal)
    {
        pass.step(Step::DeletePod {
            uid: pod.uid.clone(),
        });
    }
    pass.plan
}
