//! The listener task: the thin layer that does what the pure functions
//! decide, in ARC's order but for one step (see `Run::handle`).

use std::sync::Arc;

use jiff::Timestamp;
use tokio_util::sync::CancellationToken;

use super::backoff::recovery;
use super::batch::{plan_batch, scaling_input};
use super::jobs::JobSink;
use super::memory::JobRecord;
use super::metrics::ScaleSetLabels;
use super::patch::PatchSequence;
use super::source::ListenerClient;
use super::status::{DecisionReport, Health, Reporting, StatusSink};
use super::target::ScaleTarget;
use super::{Cause, ListenerError, ListenerSpec};
use crate::actions::{ActionsError, JobMessage, MessageSession, RunnerScaleSetStatistic};
use crate::policy::loader::PolicyLoader;
use crate::policy::reporter::{LoadState, Loading};
use crate::policy::shadow::ShadowTracker;
use crate::policy::types::ScalingInput;
use crate::policy::{Decider, PolicyKind};
use crate::recording::{self, Entry};

/// How a session's loop ended.
enum Ended {
    /// Shutdown was asked for.
    Shutdown,
    /// The session is beyond use; the error says why.
    Renew(ActionsError),
}

/// A shadow scaling policy as a listener runs it: loaded as any policy, so
/// a ConfigMap's new version is picked up, but answering alone (no
/// fallback) and reporting only to the log and its [`LoadState`], never to
/// the scale set's policy conditions and events: what goes wrong with a
/// candidate is said in `status.scaling.shadow`, and nothing of the active
/// policy's path changes.
struct Shadow {
    /// Kept for its ConfigMap watch.
    _policy: crate::policy::loader::LoadedPolicy,
    decider: Decider,
    loading: Arc<LoadState>,
    label: String,
    tracker: ShadowTracker,
}

impl Shadow {
    /// The shadow's answer to `input`: desired and reason, or why none.
    async fn decide(&self, input: ScalingInput) -> Result<(u32, String), String> {
        match self.loading.current() {
            Loading::Loaded => {}
            Loading::Pending => return Err("the shadow policy is not loaded yet".to_owned()),
            Loading::Failed { message, .. } => {
                return Err(format!("the shadow policy could not be loaded: {message}"));
            }
        }
        self.decider
            .scaling(input)
            .await
            .map(|decided| (decided.decision.desired, decided.decision.reason))
            .map_err(|error| error.to_string())
    }
}

/// A listener's parts.
pub(crate) struct Run<C, T, J, S> {
    pub(crate) client: C,
    pub(crate) loader: PolicyLoader,
    pub(crate) spec: ListenerSpec,
    pub(crate) target: T,
    pub(crate) jobs: J,
    pub(crate) status: Arc<Reporting<S>>,
    pub(crate) shutdown: CancellationToken,
}

/// What a listener keeps between polls and sessions.
struct Memory {
    /// Failed attempts in a row, for the backoff.
    attempt: u32,
    /// Numbering of decisions; set from the target on the first decision.
    sequence: Option<PatchSequence>,
    /// The latest statistics from the service.
    statistics: Option<RunnerScaleSetStatistic>,
    /// Jobs offered that could not be acquired yet (the acquire call
    /// failed); tried again with the next batch.
    unacquired: Vec<i64>,
    /// The last decision's runner count, for its metric's direction.
    desired: Option<u32>,
    /// The shadow scaling policy, if the spec names one.
    shadow: Option<Shadow>,
    /// When the last message arrived, if the next poll is still to wait
    /// out the batch window.
    message_received: Option<std::time::Instant>,
    /// The last message's offers were acquired.
    acquired: bool,
    /// The last poll went without waiting out the window.
    polled_early: bool,
    /// The last message was as large as the service makes them: more is
    /// waiting.
    full: bool,
}

impl<C: ListenerClient, T: ScaleTarget, J: JobSink, S: StatusSink> Run<C, T, J, S> {
    pub(crate) async fn run(self) -> Result<(), ListenerError> {
        let reporter: Arc<dyn crate::policy::PolicyReporter> = self.status.clone();
        let policy = self
            .loader
            .load(
                PolicyKind::Scaling,
                &self.spec.scale_set.namespace,
                self.spec.scaling_policy.as_ref(),
                reporter,
            )
            .await?;
        let decider = policy.decider().clone();
        let shadow = self.load_shadow().await;
        self.spec.metrics.started(
            &self.labels(),
            self.spec.scale_set.min_runners,
            self.spec.scale_set.max_runners,
        );
        let mut memory = Memory {
            attempt: 0,
            sequence: None,
            statistics: None,
            unacquired: Vec::new(),
            desired: None,
            shadow,
            message_received: None,
            acquired: false,
            polled_early: false,
            full: false,
        };
        loop {
            // Asked again for every session: the credentials may have been
            // rotated since the last one (see `super::source`).
            let client = match self.client.client().await {
                Ok(client) => client,
                Err(message) => {
                    if self.pause(Cause::Unauthorized, message, &mut memory).await {
                        continue;
                    }
                    break;
                }
            };
            let created = tokio::select! {
                biased;
                () = self.shutdown.cancelled() => break,
                created = client
                    .create_message_session(self.spec.scale_set_id, &self.spec.owner) => created,
            };
            let session = match created {
                Ok(session) => session,
                Err(error) => {
                    if self.pause_after(&error, &mut memory).await {
                        continue;
                    }
                    break;
                }
            };
            tracing::debug!(scale_set = %self.spec.scale_set.name, session = %session.id(), "message session created");
            match self.listen(&session, &decider, &mut memory).await {
                Ended::Shutdown => {
                    self.close(session).await;
                    break;
                }
                Ended::Renew(error) => {
                    self.close(session).await;
                    if !self.pause_after(&error, &mut memory).await {
                        break;
                    }
                }
            }
        }
        self.status.health(Health::Stopped);
        self.spec.metrics.forget(&self.labels());
        if let Some((backlogs, set)) = &self.spec.backlog {
            backlogs.deaf(set);
        }
        // Keep the policy (and its ConfigMap watch) alive to the end.
        drop(policy);
        Ok(())
    }

    /// Keeps what the service's statistics say: in the metrics, and, for
    /// the runners finishing their jobs, how many jobs the scale set has
    /// (see [`crate::backlog`]).
    fn heard(&self, statistics: &RunnerScaleSetStatistic) {
        self.spec.metrics.statistics(&self.labels(), statistics);
        if let Some((backlogs, set)) = &self.spec.backlog {
            // The set's jobs, counted from below: those acquired and not
            // running yet (past the capacity the listener announces, the
            // service keeps acquired jobs unassigned) and those running.
            // Jobs assigned to the set and acquired are counted once, a job
            // handed to a runner that has not started it not at all, and
            // jobs merely offered (another set may take them) not at all:
            // short of the truth, never past it.
            let jobs = statistics
                .total_acquired_jobs
                .max(0)
                .saturating_add(statistics.total_running_jobs.max(0));
            backlogs.heard(set, u32::try_from(jobs).unwrap_or(u32::MAX));
        }
    }

    /// Polls one session until it is beyond use or shutdown is asked for.
    async fn listen(
        &self,
        session: &MessageSession,
        decider: &Decider,
        memory: &mut Memory,
    ) -> Ended {
        if let Some(statistics) = session.statistics() {
            self.heard(&statistics);
            memory.statistics = Some(statistics);
        }
        // Everything between polls races shutdown too. A listener told to
        // stop may be a leader stepping down, cut off from the API server:
        // a decision's write would hang there until the client's timeout
        // (30 s), the session would live on, and the replica taking over
        // would be refused its own session (409) all that while. Stopping
        // mid-message loses nothing: jobs not acquired are offered to the
        // next session, acquired ones are in its statistics, and a record
        // not written trails its job's start as it may anyway.
        tokio::select! {
            biased;
            () = self.shutdown.cancelled() => return Ended::Shutdown,
            () = self.decide(decider, memory) => {}
        }
        let mut last_message_id = 0;
        loop {
            if let Some(received) = memory.message_received.take() {
                // See `ListenerSpec::batch_window`: after an acquisition,
                // the next poll goes at once, once in a row unless the
                // message was full.
                let acquired = std::mem::take(&mut memory.acquired);
                let full = std::mem::take(&mut memory.full);
                let early = acquired && (full || !memory.polled_early);
                memory.polled_early = early;
                let rest = if early {
                    std::time::Duration::ZERO
                } else {
                    self.spec.batch_window.saturating_sub(received.elapsed())
                };
                if !rest.is_zero() {
                    tokio::select! {
                        biased;
                        () = self.shutdown.cancelled() => return Ended::Shutdown,
                        () = tokio::time::sleep(rest) => {}
                    }
                }
            }
            let polled = tokio::select! {
                biased;
                () = self.shutdown.cancelled() => return Ended::Shutdown,
                polled = session.get_message(last_message_id, self.spec.scale_set.max_runners) => polled,
            };
            let step = self.step(session, polled, decider, memory, &mut last_message_id);
            let ended = tokio::select! {
                biased;
                () = self.shutdown.cancelled() => return Ended::Shutdown,
                ended = step => ended,
            };
            if let Some(ended) = ended {
                return ended;
            }
        }
    }

    /// What one poll's answer leads to: the message handled, the decision,
    /// the job records. `Some` when listening on this session is over.
    async fn step(
        &self,
        session: &MessageSession,
        polled: Result<Option<crate::actions::Message>, ActionsError>,
        decider: &Decider,
        memory: &mut Memory,
        last_message_id: &mut i64,
    ) -> Option<Ended> {
        let handled = match polled {
            Ok(None) => Ok(Vec::new()),
            Ok(Some(message)) => {
                memory.message_received = Some(std::time::Instant::now());
                memory.full = message.jobs.len() >= super::SERVICE_BATCH_MAX;
                let handled = self.handle(session, &message, memory).await;
                // Past a message only once it is acknowledged: one
                // whose acknowledgement failed is delivered again.
                if handled.is_ok() {
                    *last_message_id = message.id;
                }
                handled
            }
            Err(error) => Err(error),
        };
        let records = match handled {
            Ok(records) => {
                memory.attempt = 0;
                records
            }
            Err(error) if recovery(&error).new_session => return Some(Ended::Renew(error)),
            Err(error) => {
                self.reload_if_refused(&error, session).await;
                if !self.pause_after(&error, memory).await {
                    return Some(Ended::Shutdown);
                }
                return None;
            }
        };
        self.decide(decider, memory).await;
        self.record(records).await;
        None
    }

    /// Handles one message in ARC's order, acknowledge then acquire, and
    /// returns the job records it asks for, to be written after the
    /// decision.
    ///
    /// ARC records before it decides. Deciding first keeps the decision
    /// close to the statistics it is made on: the records are an API server
    /// write each, a few dozen under a burst, and every runner that ends
    /// while they are written is missing from the set's count but still
    /// counted by the statistics, so the decision replaced it with a runner
    /// no job was left for (a registration, and its removal, wasted: two
    /// Actions calls). The records come later by the decision's write (by
    /// hundreds of milliseconds for the last of a long message either
    /// way), and no scale-down gets between: a message with job events is decided with a
    /// numbered patch, which never scales down, and the records are written
    /// right after it, whether or not it went out, so before the next poll and any
    /// decision that could carry patch id 0. A record always trails its
    /// job's start (by a batch window and more), whichever comes first; the
    /// service refusing to remove a runner whose job runs is what protects
    /// a busy runner whose record is not there yet. What a custom policy
    /// reads of the runners is as of before this message's records; it was
    /// never later than the listener's watch anyway.
    async fn handle(
        &self,
        session: &MessageSession,
        message: &crate::actions::Message,
        memory: &mut Memory,
    ) -> Result<Vec<JobRecord>, ActionsError> {
        let mut plan = plan_batch(message, Timestamp::now());
        // Acknowledged first, as ARC does: a message whose jobs cannot be
        // acquired or recorded must not come back forever and block the
        // queue behind it. Acquiring and recording twice is harmless, so a
        // message whose acknowledgement failed is simply handled again.
        session.delete_message(message.id).await?;
        if let Some(statistics) = &plan.statistics {
            self.heard(statistics);
            memory.statistics = plan.statistics;
        }
        self.count_jobs(message);
        if self.spec.recording.is_some() {
            let now = Timestamp::now();
            for job in &message.jobs {
                if let Some(job) = recording::Job::from_message(job, now) {
                    self.recorded(&Entry::Job(job));
                }
            }
        }

        let mut acquire = std::mem::take(&mut memory.unacquired);
        acquire.retain(|id| !plan.completed.iter().any(|c| c.runner_request_id == *id));
        for id in &plan.acquire {
            if !acquire.contains(id) {
                acquire.push(*id);
            }
        }
        if !acquire.is_empty() {
            match session.acquire_jobs(&acquire).await {
                Ok(acquired) => {
                    tracing::debug!(
                        scale_set = %self.spec.scale_set.name,
                        offered = acquire.len(),
                        acquired = acquired.len(),
                        "jobs acquired"
                    );
                    memory.acquired = !acquired.is_empty();
                }
                Err(error) => {
                    // Kept for the next message, in this session or the
                    // next: the message offering them is acknowledged.
                    memory.unacquired = acquire;
                    if recovery(&error).new_session {
                        return Err(error);
                    }
                    tracing::warn!(scale_set = %self.spec.scale_set.name, "jobs not acquired, trying again with the next message: {error}");
                    self.reload_if_refused(&error, session).await;
                }
            }
        }

        if (plan.job_events || plan.assigned > 0)
            && let Some(sequence) = memory.sequence.as_mut()
        {
            sequence.note_job_events();
        }
        Ok(plan.records())
    }

    /// Writes a message's job records on the runners, in the message's
    /// order; a record that fails is logged and left (see [`JobSink`]).
    async fn record(&self, records: Vec<JobRecord>) {
        for record in records {
            let (runner, recorded) = match record {
                JobRecord::Started(job) => {
                    let runner = job.runner_name.clone();
                    (runner, self.jobs.job_started(job).await)
                }
                JobRecord::Completed(job) => {
                    let runner = job.runner_name.clone();
                    (runner, self.jobs.job_completed(job).await)
                }
            };
            if let Err(error) = recorded {
                tracing::warn!(scale_set = %self.spec.scale_set.name, runner, "job not recorded: {error}");
            }
        }
    }

    /// Asks the policy and applies its answer.
    async fn decide(&self, decider: &Decider, memory: &mut Memory) {
        let observed = match self.target.observe().await {
            Ok(observed) => observed,
            Err(error) => return self.target_failed(&error),
        };
        let sequence = memory
            .sequence
            .get_or_insert_with(|| PatchSequence::resume(observed.patch_id, observed.replicas));
        let input = scaling_input(
            &self.spec.scale_set,
            memory.statistics.as_ref(),
            &observed,
            Timestamp::now(),
        );
        let recorded = self.spec.recording.as_ref().map(|_| input.clone());
        let shadow_input = memory.shadow.as_ref().map(|_| input.clone());
        let decided = match decider.scaling(input).await {
            Ok(decided) => decided,
            Err(error) => {
                self.status.health(Health::Retrying {
                    cause: Cause::PolicyUnavailable,
                    message: crate::causes::of(&error),
                    retry_in: std::time::Duration::ZERO,
                });
                return;
            }
        };
        self.spec.metrics.decision(
            &self.labels(),
            &decided.policy,
            memory.desired,
            decided.decision.desired,
        );
        memory.desired = Some(decided.decision.desired);
        if let Some(input) = recorded {
            self.recorded(&Entry::Decision(recording::Decision::of(input, &decided)));
        }
        let shadow = match (memory.shadow.as_mut(), shadow_input) {
            (Some(shadow), Some(input)) => {
                let answer = shadow.decide(input).await;
                let report = shadow.tracker.observe(
                    &shadow.label,
                    decided.decision.desired,
                    answer,
                    Timestamp::now(),
                );
                self.spec.metrics.shadow(
                    &self.labels(),
                    report.agreement.map_or("failed", |a| a.as_str()),
                    report.desired,
                );
                Some(report)
            }
            _ => None,
        };
        self.status.decision(DecisionReport {
            desired: decided.decision.desired,
            reason: decided.decision.reason.clone(),
            policy: decided.policy.clone(),
            fallback_reason: decided.fallback_reason.clone(),
            shadow,
        });
        if let Some(patch) =
            sequence.next(decided.decision.desired, self.spec.scale_set.min_runners)
        {
            match self.target.apply(patch).await {
                Ok(()) => sequence.applied(&patch),
                Err(error) => return self.target_failed(&error),
            }
        }
        self.status.health(Health::Listening);
    }

    /// Loads the shadow scaling policy the spec names, if any. Nothing about
    /// it can stop the listener: when even its loading fails, the listener
    /// runs without it and says so in the log.
    async fn load_shadow(&self) -> Option<Shadow> {
        let reference = self.spec.shadow_scaling_policy.as_ref()?;
        let namespace = &self.spec.scale_set.namespace;
        let loading = Arc::new(LoadState::new(Arc::new(
            crate::policy::reporter::TracingReporter::default(),
        )));
        let reporter: Arc<dyn crate::policy::PolicyReporter> = loading.clone();
        match self
            .loader
            .load(PolicyKind::Scaling, namespace, Some(reference), reporter)
            .await
        {
            Ok(policy) => Some(Shadow {
                decider: policy.decider().clone().alone(),
                _policy: policy,
                loading,
                label: reference.label(PolicyKind::Scaling, namespace),
                tracker: ShadowTracker::default(),
            }),
            Err(error) => {
                tracing::warn!(scale_set = %self.spec.scale_set.name, "the shadow scaling policy is not run: {error}");
                None
            }
        }
    }

    /// Adds `entry` to the scale set's recording, if it has one.
    fn recorded(&self, entry: &Entry) {
        if let Some(recording) = &self.spec.recording {
            recording
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(entry);
        }
    }

    /// The scale set's metric labels.
    fn labels(&self) -> ScaleSetLabels {
        self.spec.metric_labels.clone()
    }

    /// Counts and times the message's job starts and completions, as
    /// ARC's listener does. A message handled twice (its acknowledgement
    /// failed) is counted twice, as in ARC.
    fn count_jobs(&self, message: &crate::actions::Message) {
        let labels = self.labels();
        let chosen = &self.spec.job_metrics;
        for item in &message.jobs {
            match item {
                JobMessage::JobStarted { job, .. } => {
                    self.spec.metrics.job_started(&labels, chosen, job);
                }
                JobMessage::JobCompleted { result, job, .. } => {
                    self.spec
                        .metrics
                        .job_completed(&labels, chosen, job, result);
                }
                _ => {}
            }
        }
    }

    fn target_failed(&self, error: &ListenerError) {
        self.status.health(Health::Retrying {
            cause: Cause::TargetUnavailable,
            message: crate::causes::of(error),
            // The next decision comes after the next poll.
            retry_in: std::time::Duration::ZERO,
        });
    }

    /// If `error` is the service refusing the credentials, the session goes
    /// on with the client the source gives now: a new one if the Secret was
    /// rotated (the same one otherwise, to be refused again and reported
    /// until it is).
    async fn reload_if_refused(&self, error: &ActionsError, session: &MessageSession) {
        if recovery(error).cause != Cause::Unauthorized {
            return;
        }
        match self.client.client().await {
            Ok(client) => session.use_client(client),
            Err(message) => {
                tracing::warn!(scale_set = %self.spec.scale_set.name, "the credentials could not be read again: {message}");
            }
        }
    }

    /// [`Self::pause`] for a failed call.
    async fn pause_after(&self, error: &ActionsError, memory: &mut Memory) -> bool {
        self.pause(recovery(error).cause, crate::causes::of(error), memory)
            .await
    }

    /// Reports a failure and waits out the backoff; `false` when shutdown
    /// was asked for meanwhile.
    async fn pause(&self, cause: Cause, message: String, memory: &mut Memory) -> bool {
        let delay = self.spec.backoff.delay(memory.attempt, rand::random());
        memory.attempt = memory.attempt.saturating_add(1);
        self.status.health(Health::Retrying {
            cause,
            message,
            retry_in: delay,
        });
        tokio::select! {
            biased;
            () = self.shutdown.cancelled() => false,
            () = tokio::time::sleep(delay) => true,
        }
    }

    /// Deletes the session, so the next listener of the scale set (this one
    /// again, or another replica after a failover) need not wait for it to
    /// expire. A session the service already dropped cannot be deleted;
    /// that is not worth more than a debug line.
    async fn close(&self, session: MessageSession) {
        if let Err(error) = session.close().await {
            tracing::debug!(scale_set = %self.spec.scale_set.name, "message session not deleted: {error}");
        }
    }
}
