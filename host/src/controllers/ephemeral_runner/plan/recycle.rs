//! Recycling an idle runner past `maxIdleAge` (within rule 10): a new
//! registration and pod for the same runner, so a warm pool does not keep
//! runners for days. Not to be confused with a *renewal*, the runner set's
//! reuse of a runner that succeeded for its next job (`RunnerRenewal`).

use std::time::Duration;

use super::delete::{Registration, ensure_gone};
use super::{Need, Pass, PodView, Step, elapsed};
use crate::api::EphemeralRunner;
use crate::api::EphemeralRunnerStatus;
use crate::api::ephemeral_runner::hold::parse_duration;
use crate::api::ephemeral_runner::{EventReason, RegisteredReason};
use crate::controllers::kit::Severity;

/// Whether this runner's registration removal was asked for while it
/// lives (not deleted, not done): only recycling does that. Covers the
/// removal under way (`RemoveNow`) and done (`Removed`, `NotFound`), since
/// the runner may exit in either window.
pub(super) fn recycling(status: &EphemeralRunnerStatus) -> bool {
    matches!(
        status.reason_of::<RegisteredReason>(),
        Some(RegisteredReason::RemoveNow | RegisteredReason::Removed | RegisteredReason::NotFound)
    )
}

/// The runner's `maxIdleAge`, if it has a usable one. The apiserver refuses
/// what is not a duration; `0s`, which it lets through, means none.
pub(super) fn max_idle_age(runner: &EphemeralRunner) -> Option<Duration> {
    let text = runner.spec.max_idle_age.as_deref()?;
    parse_duration("maxIdleAge", text).ok()
}

/// An idle runner past `maxIdleAge` gets a new registration and pod: its
/// registration is removed first (if a job reached it meanwhile, the
/// service says so and the pool waits the job out, as for any removal),
/// then its pod and Secret go, and the runner registers again from
/// scratch. This is not a failed start: nothing is counted towards the
/// failure limit.
pub(super) fn recycle(
    pass: &mut Pass<'_>,
    pod: &PodView,
    max_idle_age: Duration,
) -> Result<(), Need> {
    let before = pass.plan.steps.len();
    let status = pass.status;
    let registration = ensure_gone(pass, status, false)?;
    if pass.plan.steps[before..]
        .iter()
        .any(|s| matches!(s, Step::Deregister { .. }))
    {
        pass.event(
            Severity::Normal,
            EventReason::MaxIdleAge,
            format!(
                "idle for {}s, past maxIdleAge ({}s): replacing its registration and pod",
                elapsed(pod.created, pass.obs.now).as_secs(),
                max_idle_age.as_secs()
            ),
        );
    }
    if let Registration::Gone = registration {
        pass.delete_pod_and_secret(pod);
    }
    Ok(())
}
