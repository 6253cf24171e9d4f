//! In-memory scale target and sinks: what tests (and anything embedding a
//! listener without Kubernetes) plug in. Each keeps everything it was given,
//! in order, and can wait for a condition on it.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::ListenerError;
use super::jobs::{JobCompleted, JobSink, JobStarted};
use super::status::{StatusSink, StatusUpdate};
use super::target::{Observed, ScalePatch, ScaleTarget};
use crate::policy::types::RunnerCounts;

/// An append-only log that can be waited on.
#[derive(Debug)]
pub struct Recorder<T> {
    log: watch::Sender<Vec<T>>,
}

impl<T> Default for Recorder<T> {
    fn default() -> Self {
        Self {
            log: watch::Sender::new(Vec::new()),
        }
    }
}

impl<T: Clone> Recorder<T> {
    /// Appends an entry and wakes waiters.
    pub fn push(&self, entry: T) {
        self.log.send_modify(|log| log.push(entry));
    }

    /// Every entry so far.
    pub fn all(&self) -> Vec<T> {
        self.log.borrow().clone()
    }

    /// Waits until `done` holds for the entries, re-checking on every push,
    /// for at most `timeout`. Returns the entries that satisfied it, or the
    /// entries at the deadline for the failure message.
    pub async fn wait_until(
        &self,
        timeout: Duration,
        mut done: impl FnMut(&[T]) -> bool,
    ) -> Result<Vec<T>, Vec<T>> {
        let mut changes = self.log.subscribe();
        let waited = tokio::time::timeout(timeout, changes.wait_for(|log| done(log))).await;
        match waited {
            Ok(Ok(log)) => Ok(log.clone()),
            _ => Err(self.all()),
        }
    }
}

/// A scale target in memory: the patches applied, in order, and runner
/// counts a test sets.
#[derive(Clone, Debug, Default)]
pub struct MemoryScaleTarget {
    inner: Arc<TargetInner>,
}

#[derive(Debug, Default)]
struct TargetInner {
    patches: Recorder<ScalePatch>,
    runners: std::sync::Mutex<RunnerCounts>,
    /// Patch calls to refuse before accepting again.
    refuse: std::sync::Mutex<u32>,
}

impl MemoryScaleTarget {
    /// A target that has never been patched.
    pub fn new() -> Self {
        Self::default()
    }

    /// A target that already holds `patch`, as one left by an earlier
    /// listener.
    pub fn holding(patch: ScalePatch) -> Self {
        let target = Self::default();
        target.inner.patches.push(patch);
        target
    }

    /// Sets the runner counts [`ScaleTarget::observe`] reports.
    pub fn set_runners(&self, runners: RunnerCounts) {
        *self.inner.runners.lock().unwrap_or_else(|e| e.into_inner()) = runners;
    }

    /// Refuses the next `times` patches, as an unreachable API server would.
    pub fn refuse_next(&self, times: u32) {
        *self.inner.refuse.lock().unwrap_or_else(|e| e.into_inner()) = times;
    }

    /// The patches applied, oldest first.
    pub fn patches(&self) -> &Recorder<ScalePatch> {
        &self.inner.patches
    }

    /// The last patch applied.
    pub fn current(&self) -> Option<ScalePatch> {
        self.inner.patches.all().last().copied()
    }
}

impl ScaleTarget for MemoryScaleTarget {
    async fn observe(&self) -> Result<Observed, ListenerError> {
        let current = self.current();
        Ok(Observed {
            replicas: current.map(|p| p.replicas),
            patch_id: current.map_or(0, |p| p.patch_id),
            runners: self
                .inner
                .runners
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        })
    }

    async fn apply(&self, patch: ScalePatch) -> Result<(), ListenerError> {
        {
            let mut refuse = self.inner.refuse.lock().unwrap_or_else(|e| e.into_inner());
            if *refuse > 0 {
                *refuse -= 1;
                return Err(ListenerError::Target("the target refused the patch".into()));
            }
        }
        self.inner.patches.push(patch);
        Ok(())
    }
}

/// One job record: what a listener writes on a runner, in the order of
/// its message, and what [`MemoryJobSink`] keeps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobRecord {
    /// A runner started a job.
    Started(JobStarted),
    /// A job ended.
    Completed(JobCompleted),
}

/// A job sink in memory.
#[derive(Clone, Debug, Default)]
pub struct MemoryJobSink {
    records: Arc<Recorder<JobRecord>>,
}

impl MemoryJobSink {
    /// An empty sink.
    pub fn new() -> Self {
        Self::default()
    }

    /// The records, oldest first.
    pub fn records(&self) -> &Recorder<JobRecord> {
        &self.records
    }
}

impl JobSink for MemoryJobSink {
    async fn job_started(&self, job: JobStarted) -> Result<(), ListenerError> {
        self.records.push(JobRecord::Started(job));
        Ok(())
    }

    async fn job_completed(&self, job: JobCompleted) -> Result<(), ListenerError> {
        self.records.push(JobRecord::Completed(job));
        Ok(())
    }
}

/// A status sink in memory.
#[derive(Clone, Debug, Default)]
pub struct MemoryStatusSink {
    updates: Arc<Recorder<StatusUpdate>>,
}

impl MemoryStatusSink {
    /// An empty sink.
    pub fn new() -> Self {
        Self::default()
    }

    /// The updates, oldest first.
    pub fn updates(&self) -> &Recorder<StatusUpdate> {
        &self.updates
    }
}

impl StatusSink for MemoryStatusSink {
    fn update(&self, update: StatusUpdate) {
        self.updates.push(update);
    }
}
