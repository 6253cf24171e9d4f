//! The job sink: where a listener records what runners are doing.
//!
//! JobStarted is the only signal that a runner is busy (the runner itself
//! says nothing to Kubernetes), and the EphemeralRunnerSet controller must
//! never scale down a busy runner; so the production sink writes it to the
//! EphemeralRunner's status, as ARC's listener does. JobCompleted carries the
//! result for the same status. [`MemoryJobSink`](super::MemoryJobSink) keeps
//! the records in memory for tests.

use std::future::Future;

use jiff::Timestamp;

use super::ListenerError;

/// A runner started a job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobStarted {
    /// The runner's name, which is its EphemeralRunner's name.
    pub runner_name: String,
    /// The runner's id in the Actions service.
    pub runner_id: i64,
    /// The job request id (what `acquirejobs` took).
    pub runner_request_id: i64,
    /// `owner/repo`.
    pub repository: String,
    /// `owner/repo/.github/workflows/x.yml@ref`.
    pub workflow_ref: String,
    /// The workflow run.
    pub workflow_run_id: i64,
    /// The job id.
    pub job_id: String,
    /// The job's display name.
    pub job_display_name: String,
    /// When the runner was handed the job (the service's time, or the
    /// listener's when the service gave none).
    pub started_at: Timestamp,
}

/// A job ended, on a runner or before one took it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobCompleted {
    /// The runner's name.
    pub runner_name: String,
    /// The runner's id in the Actions service.
    pub runner_id: i64,
    /// The job request id.
    pub runner_request_id: i64,
    /// The job id.
    pub job_id: String,
    /// `succeeded`, `failed`, `canceled`, ...
    pub result: String,
    /// When it finished.
    pub finished_at: Timestamp,
    /// The job's start, when the same message carried it: then it is not
    /// recorded on its own (see [`super::batch::plan_batch`]).
    pub started: Option<JobStarted>,
    /// Whether the statistics of the message that carried it show jobs
    /// assigned to the scale set and not running yet: then a place this
    /// runner leaves is wanted at once (see
    /// [`RunnerJobs::seeing`](super::cluster::RunnerJobs::seeing)).
    pub jobs_waiting: bool,
}

/// Where a listener records jobs on their runners.
///
/// A record that fails does not hold up the queue: the message carrying it
/// is already acknowledged (ARC's order, so a poison record cannot block the
/// queue), and a busy runner stays protected by the Actions service, which
/// refuses to remove a runner whose job is running. The production sink
/// writes a record the API server did not answer again in the background
/// (see `RunnerJobs`); one it refused is logged and left.
pub trait JobSink: Send + Sync + 'static {
    /// Records that a runner started a job. A runner that no longer exists
    /// is not an error.
    fn job_started(
        &self,
        job: JobStarted,
    ) -> impl Future<Output = Result<(), ListenerError>> + Send;

    /// Records that a runner's job ended.
    fn job_completed(
        &self,
        job: JobCompleted,
    ) -> impl Future<Output = Result<(), ListenerError>> + Send;
}
