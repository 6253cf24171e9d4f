//! The scale target: where a listener's decisions go.
//!
//! In production this is the scale set's EphemeralRunnerSet
//! (`spec.replicas` and `spec.patchID`, one JSON merge patch per decision);
//! [`MemoryScaleTarget`](super::MemoryScaleTarget) keeps decisions in memory
//! for tests. The listener knows nothing of Kubernetes: it reads what the
//! target holds, decides, and hands back a [`ScalePatch`].

use std::future::Future;

use crate::policy::types::RunnerCounts;

use super::ListenerError;

/// One decision as the target receives it: how many runners, and which
/// decision this is.
///
/// `patch_id` follows ARC's scaler, so the EphemeralRunnerSet can apply
/// ARC's rule unchanged: a non-zero id names one decision (the set creates
/// up to `replicas` unless a runner already carries the id, and never
/// scales down), and 0 says the scale set is steady at minRunners, so idle
/// runners above `replicas` may go. Non-zero ids grow for a scale set, also
/// across listener restarts (a listener resumes after the id the target
/// holds); [`PatchSequence`](super::PatchSequence) says when a
/// decision is 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScalePatch {
    /// The desired number of runners.
    pub replicas: u32,
    /// The decision's place in the scale set's sequence, from 1, or 0 when
    /// steady at minRunners.
    pub patch_id: i64,
}

/// What the target holds now, read before each decision.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observed {
    /// The replica count last applied; `None` before any.
    pub replicas: Option<u32>,
    /// The patch id last applied; 0 before any.
    pub patch_id: i64,
    /// The scale set's runners by phase, which scaling policies may read.
    pub runners: RunnerCounts,
}

/// Where a listener applies its decisions.
///
/// Implementations should answer [`ScaleTarget::observe`] from a cache (an
/// informer's store): it is called before every decision, which is after
/// every long poll.
pub trait ScaleTarget: Send + Sync + 'static {
    /// What the target holds now.
    fn observe(&self) -> impl Future<Output = Result<Observed, ListenerError>> + Send;

    /// Applies one decision. A failure is reported and the decision is sent
    /// again (with a new patch id) after the next poll.
    fn apply(&self, patch: ScalePatch) -> impl Future<Output = Result<(), ListenerError>> + Send;
}
