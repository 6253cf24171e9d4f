//! Listeners: one tokio task per scale set, turning the Actions service's
//! messages into scaling decisions.
//!
//! ARC runs a listener pod per scale set; arcwright runs them as tasks in the
//! host, so a thousand scale sets are a thousand long polls on one
//! connection pool, not a thousand pods. A listener:
//!
//! 1. creates the scale set's message session (a conflict means another
//!    holder's session has not expired yet: it waits and tries again);
//! 2. long-polls for messages, telling the service through
//!    `X-ScaleSetMaxCapacity` how many jobs the set can take;
//! 3. for each message, in ARC's order: keeps its statistics, acknowledges
//!    it, acquires the jobs offered;
//! 4. lets the scaling policy decide ([`crate::policy::Decider`], loaded
//!    through [`PolicyLoader`], so a policy swapped in its ConfigMap decides
//!    the next time without a restart, and a failing one falls back to the
//!    bundled default);
//! 5. applies the answer with its patch id, 0 once steady at minRunners
//!    ([`ScaleTarget`], [`PatchSequence`]), and tells
//!    the status what changed ([`StatusSink`]);
//! 6. records the message's JobStarted and JobCompleted on their runners
//!    ([`JobSink`]). ARC records before it decides; recording after keeps
//!    the decision close to its statistics (see `task::Run::handle`).
//!
//! Every failure of the service (session conflict, scale set gone, session
//! or token lost, outages, credentials refused) is retried with capped,
//! jittered exponential backoff ([`Backoff`]) and reported; none ends the
//! task. Refused credentials are read again from the scale set's Secret
//! ([`ListenerClient`]), so a rotated key is picked up without a restart. Shutdown stops
//! the poll and deletes the session.
//!
//! The decisions are pure functions with table tests: [`plan_batch`] (a
//! message to what to acquire and record), [`scaling_input`],
//! [`PatchSequence`] (which decisions are sent, with which id),
//! [`recovery`] and [`Backoff::delay`] (what a failure means, how long to
//! wait), [`StatusTracker`] (what is news). The task is the thin layer that
//! does what they say.
//!
//! The listener knows Kubernetes only through its three seams. The
//! production implementations ([`cluster`]) patch the EphemeralRunnerSet,
//! the EphemeralRunners' status and the AutoscalingRunnerSet's status;
//! [`MemoryScaleTarget`], [`MemoryJobSink`] and [`MemoryStatusSink`] keep
//! everything in memory. [`Supervisor`] runs one listener per scale set for
//! the AutoscalingRunnerSet controller.

/// The default [`ListenerSpec::batch_window`]: under a steady stream of
/// jobs a message then carries about two seconds of job events (the
/// service's 50 at 25 events a second), which brings polls and
/// acknowledgements to about a tenth of a call per job.
pub const DEFAULT_BATCH_WINDOW: std::time::Duration = std::time::Duration::from_secs(2);

/// The most job messages the service puts in one message.
pub const SERVICE_BATCH_MAX: usize = 50;

mod backoff;
mod batch;
pub mod cluster;
pub mod control;
mod error;
mod jobs;
mod memory;
pub mod metrics;
mod patch;
mod source;
mod status;
mod supervisor;
mod target;
mod task;

use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub use backoff::{Backoff, Cause, Recovery, recovery};
pub use batch::{BatchPlan, plan_batch, scaling_input};
pub use control::{InMemoryListeners, ListenerConfig, ListenerControl, ListenerEvent, StartError};
pub use error::ListenerError;
pub use jobs::{JobCompleted, JobSink, JobStarted};
pub use memory::{JobRecord, MemoryJobSink, MemoryScaleTarget, MemoryStatusSink, Recorder};
pub use patch::PatchSequence;
pub use source::{CachedClient, ListenerClient};
pub use status::{DecisionReport, Health, StatusSink, StatusTracker, StatusUpdate};
pub use supervisor::Supervisor;
pub use target::{Observed, ScalePatch, ScaleTarget};

use crate::policy::loader::{PolicyLoader, PolicyRef};
use crate::policy::types::ScaleSet;
pub use metrics::ListenerMetrics;

/// What a listener serves.
#[derive(Clone, Debug)]
pub struct ListenerSpec {
    /// The scale set's id in the Actions service.
    pub scale_set_id: i64,
    /// The scale set as its AutoscalingRunnerSet declares it: name,
    /// namespace (where a ConfigMap policy is looked up), min and max
    /// runners (max is also the capacity announced on each poll), labels.
    pub scale_set: ScaleSet,
    /// Who holds the session, as the service shows it (the host's name).
    pub owner: String,
    /// The scaling policy; `None` is the bundled default.
    pub scaling_policy: Option<PolicyRef>,
    /// A candidate scaling policy asked beside it and never applied
    /// (see `task::Run::shadow`).
    pub shadow_scaling_policy: Option<PolicyRef>,
    /// How long to wait between failed attempts.
    pub backoff: Backoff,
    /// The least time from one message to the next poll.
    ///
    /// The service batches whatever job messages are pending when a poll
    /// arrives (up to 50) into one message, and every message costs two
    /// calls, the poll and its acknowledgement. A listener that polls again
    /// the moment it has handled a message gets, under a burst, a message
    /// per handful of job events: about two calls per job on top of its
    /// JIT config. Waiting a moment lets the events of many jobs gather in
    /// one message instead.
    ///
    /// What decides capacity is not held back by it. The first message of
    /// a burst reaches a listener already waiting in its long poll; every
    /// message carries the service's statistics as of its delivery, not of
    /// its oldest event; a decision is applied as soon as its message is
    /// handled. Jobs the listener acquires are assigned to the scale set
    /// right after, which the next message's statistics show: so after a
    /// message whose offers were acquired, the next poll goes at once (once
    /// in a row, so a steady stream of offers still meets the window every
    /// other poll). A message of offers as large as the service makes them
    /// ([`SERVICE_BATCH_MAX`] job messages) means more are waiting, so
    /// after one the next poll goes at once even in a row: a burst of a
    /// thousand jobs is offered, acquired and decided on in a few
    /// back-to-back polls. A full message of starts and completions waits
    /// out the window like any other. What waits is the
    /// bookkeeping of jobs started and completed, by at most this long. An
    /// empty long poll is followed by the next poll at once.
    pub batch_window: std::time::Duration,
    /// Where the service's statistics and the decisions are reported.
    pub metrics: ListenerMetrics,
    /// The scale set's labels on them.
    pub metric_labels: metrics::ScaleSetLabels,
    /// The labels of its per-job metrics.
    pub job_metrics: metrics::JobMetricLabels,
    /// Where its decisions and job events are recorded, if anywhere.
    pub recording: Option<crate::recording::Shared>,
    /// Where it says how many jobs wait for a runner, and for which runner
    /// set (see [`crate::backlog`]); `None` says it nowhere.
    pub backlog: Option<(crate::backlog::Backlogs, crate::backlog::SetKey)>,
}

/// A running listener. Dropping it leaves the task running until the
/// shutdown token given to [`spawn`] is cancelled; [`ListenerHandle::stop`]
/// stops this one alone.
#[derive(Debug)]
pub struct ListenerHandle {
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), ListenerError>>,
}

impl ListenerHandle {
    /// Stops polling, deletes the message session and waits for the task.
    pub async fn stop(self) -> Result<(), ListenerError> {
        self.cancel();
        self.join().await
    }

    /// Tells the listener to stop (it deletes its session on the way out)
    /// without waiting for it: [`Self::join`] does.
    pub fn cancel(&self) {
        self.shutdown.cancel();
    }

    /// Waits for the task to end (after its shutdown token is cancelled).
    pub async fn join(self) -> Result<(), ListenerError> {
        match self.task.await {
            Ok(result) => result,
            Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
            Err(_) => Ok(()),
        }
    }

    /// Whether the task has ended.
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }
}

/// Starts a listener on the current runtime. It runs until `shutdown` (or a
/// parent of it, e.g. the host's SIGTERM token) is cancelled or
/// [`ListenerHandle::stop`] is called.
pub fn spawn<C, T, J, S>(
    client: C,
    loader: PolicyLoader,
    spec: ListenerSpec,
    target: T,
    jobs: J,
    status: S,
    shutdown: &CancellationToken,
) -> ListenerHandle
where
    C: ListenerClient,
    T: ScaleTarget,
    J: JobSink,
    S: StatusSink,
{
    let shutdown = shutdown.child_token();
    let span = tracing::info_span!(
        "listener",
        scale_set = %spec.scale_set.name,
        namespace = %spec.scale_set.namespace,
        scale_set_id = spec.scale_set_id,
    );
    let status = status::Reporting::new(
        status,
        spec.scale_set.name.clone(),
        spec.metrics.policy_reporter(),
    );
    let run = task::Run {
        client,
        loader,
        spec,
        target,
        jobs,
        status: Arc::clone(&status),
        shutdown: shutdown.clone(),
    };
    ListenerHandle {
        shutdown,
        task: tokio::spawn(run.run().instrument(span)),
    }
}
