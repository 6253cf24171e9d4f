//! The listener's seams in a cluster: decisions go to the scale set's
//! EphemeralRunnerSet, jobs to the EphemeralRunners' status, and the
//! listener's health and decisions to the AutoscalingRunnerSet's status.
//!
//! A listener observes its target before every decision, which is after
//! every long poll, so [`ClusterView`] answers from informer caches: one
//! watch on EphemeralRunnerSets and one on EphemeralRunners for the whole
//! process, however many scale sets it runs, instead of a GET and a LIST
//! per poll per scale set. A cache may lag a write by a moment; that is
//! harmless here, since the listener numbers its own decisions after the
//! first ([`super::PatchSequence`]) and the runner counts only inform the
//! policy.
//!
//! Every write names its own field manager, [`FIELD_MANAGER`], and touches
//! only the listener's fields: `spec.replicas` and `spec.patchID` of the
//! set, the job fields of a runner's status, `status.listener` and
//! `status.scaling` of the scale set.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::ListenerError;
use super::jobs::{JobCompleted, JobSink, JobStarted};
use super::status::{Health, StatusSink, StatusUpdate};
use super::target::{Observed, ScalePatch, ScaleTarget};
use crate::api::labels::EPHEMERAL_RUNNER_SET as SET;
use crate::api::{
    AutoscalingRunnerSet, EphemeralRunner, EphemeralRunnerPhase, EphemeralRunnerSet,
    ListenerStatus, ScalingStatus, ShadowScalingStatus,
};
use crate::backlog::{Backlogs, SetKey, Started};
use crate::controllers::kit::budget::{self, WriteBudget};
use crate::events::{Notice, Publisher, Severity};
use crate::policy::PolicyEvent;
use crate::policy::types::RunnerCounts;

/// The field manager of every write a listener makes.
pub use crate::api::field_managers::LISTENER as FIELD_MANAGER;

/// Informer caches of the EphemeralRunnerSets and EphemeralRunners every
/// listener of the process reads. Clones share the caches.
#[derive(Clone)]
pub struct ClusterView {
    scopes: Arc<Vec<Scope>>,
}

/// The caches of one watched namespace (`None`: all of them).
struct Scope {
    namespace: Option<String>,
    runner_sets: Store<EphemeralRunnerSet>,
    runners: Store<EphemeralRunner>,
    /// Whether each cache has had its first full listing. Kept here rather
    /// than awaited on the stores: kube-runtime 5's
    /// `Store::wait_until_ready` wakes only the last of several waiters,
    /// and every listener waits.
    listed: [watch::Receiver<bool>; 2],
}

impl ClusterView {
    /// Starts two watches per scope (a namespace, or `None` for all), on
    /// the current runtime; they run until `shutdown` is cancelled. A watch
    /// error is retried with the watcher's own backoff, never fatal. One
    /// watch per namespace, rather than one over the cluster, keeps the
    /// host within a namespaced Role when it is given one.
    pub fn watch(client: &Client, scopes: &[Option<String>], shutdown: &CancellationToken) -> Self {
        let scopes = scopes
            .iter()
            .map(|namespace| {
                let (runner_sets, sets_writer) = reflector::store();
                let (runners, runners_writer) = reflector::store();
                let sets_listed = drive(
                    watcher(
                        api::<EphemeralRunnerSet>(client, namespace),
                        crate::watch::config(),
                    )
                    .backoff(crate::watch::WatchBackoff::default())
                    .modify(crate::watch::without_managed_fields)
                    .reflect(sets_writer),
                    shutdown,
                );
                let runners_listed = drive(
                    watcher(
                        api::<EphemeralRunner>(client, namespace),
                        crate::watch::config().labels(SET),
                    )
                    .backoff(crate::watch::WatchBackoff::default())
                    .modify(crate::watch::without_managed_fields)
                    .reflect(runners_writer),
                    shutdown,
                );
                Scope {
                    namespace: namespace.clone(),
                    runner_sets,
                    runners,
                    listed: [sets_listed, runners_listed],
                }
            })
            .collect();
        Self {
            scopes: Arc::new(scopes),
        }
    }

    /// Waits until every cache holds its first full listing.
    pub async fn wait_until_ready(&self) {
        for scope in self.scopes.iter() {
            for listed in &scope.listed {
                // An error means the watch ended: shutdown, nothing to wait for.
                let _ = listed.clone().wait_for(|listed| *listed).await;
            }
        }
    }

    /// The caches that hold `namespace`.
    fn scope(&self, namespace: &str) -> Option<&Scope> {
        self.scopes.iter().find(|scope| {
            scope.namespace.is_none() || scope.namespace.as_deref() == Some(namespace)
        })
    }

    /// The runner `namespace/name` as the cache holds it.
    pub fn runner(&self, namespace: &str, name: &str) -> Option<Arc<EphemeralRunner>> {
        self.scope(namespace)?
            .runners
            .get(&ObjectRef::new(name).within(namespace))
    }

    /// What the set `namespace/name` holds, with its runners counted by
    /// phase.
    fn observe(&self, namespace: &str, name: &str) -> Option<Observed> {
        let scope = self.scope(namespace)?;
        let set = scope
            .runner_sets
            .get(&ObjectRef::new(name).within(namespace))?;
        let runners = scope
            .runners
            .state()
            .into_iter()
            .filter(|runner| {
                runner.metadata.namespace.as_deref() == Some(namespace)
                    && runner.metadata.labels.as_ref().and_then(|l| l.get(SET))
                        == Some(&name.to_owned())
            })
            .fold(RunnerCounts::default(), |counts, runner| {
                count(counts, &runner)
            });
        Some(Observed {
            replicas: u32::try_from(set.spec.replicas).ok(),
            patch_id: i64::from(set.spec.patch_id),
            runners,
        })
    }
}

fn api<K>(client: &Client, namespace: &Option<String>) -> Api<K>
where
    K: Resource<Scope = kube::core::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Runs a reflector's stream on its own task until `shutdown`; the
/// receiver turns true at the end of the first listing.
fn drive<K, S>(stream: S, shutdown: &CancellationToken) -> watch::Receiver<bool>
where
    K: Send + 'static,
    S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
{
    let (listed, receiver) = watch::channel(false);
    let shutdown = shutdown.clone();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                next = stream.next() => match next {
                    None => return,
                    Some(Ok(watcher::Event::InitDone)) => { listed.send_replace(true); }
                    Some(Err(error)) => tracing::debug!("listener cache watch: {error}"),
                    Some(Ok(_)) => {}
                },
            }
        }
    });
    receiver
}

/// Adds one runner to the counts the scaling policy reads.
fn count(mut counts: RunnerCounts, runner: &EphemeralRunner) -> RunnerCounts {
    if runner.metadata.deletion_timestamp.is_some() {
        counts.deleting += 1;
        return counts;
    }
    let status = runner.status.clone().unwrap_or_default();
    match status.phase.unwrap_or_default() {
        EphemeralRunnerPhase::Pending => counts.pending += 1,
        EphemeralRunnerPhase::Running => {
            counts.running += 1;
            if status.has_job() {
                counts.busy += 1;
            }
        }
        EphemeralRunnerPhase::Succeeded => counts.succeeded += 1,
        // A runner held for debugging is a failed job's runner that takes no
        // new job: to a scaling policy it is one more failed runner.
        EphemeralRunnerPhase::Failed | EphemeralRunnerPhase::Debugging => counts.failed += 1,
        EphemeralRunnerPhase::Outdated => counts.outdated += 1,
    }
    counts
}

/// A scale set's EphemeralRunnerSet as a listener's [`ScaleTarget`].
pub struct RunnerSetTarget {
    view: ClusterView,
    api: Api<EphemeralRunnerSet>,
    namespace: String,
    name: String,
}

impl RunnerSetTarget {
    /// The set `namespace/name`, read through `view`.
    pub fn new(client: Client, view: ClusterView, namespace: &str, name: &str) -> Self {
        Self {
            view,
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }
    }
}

impl ScaleTarget for RunnerSetTarget {
    async fn observe(&self) -> Result<Observed, ListenerError> {
        self.view.wait_until_ready().await;
        self.view
            .observe(&self.namespace, &self.name)
            .ok_or_else(|| {
                ListenerError::Target(format!(
                    "the EphemeralRunnerSet {}/{} does not exist (yet)",
                    self.namespace, self.name
                ))
            })
    }

    async fn apply(&self, patch: ScalePatch) -> Result<(), ListenerError> {
        let replicas = i32::try_from(patch.replicas).unwrap_or(i32::MAX);
        // The CRD's patch id is ARC's int32; a listener would need two
        // billion decisions to pass it, and wrapping to 1 keeps the id
        // non-zero (a zero would read as "steady").
        let patch_id = i32::try_from(patch.patch_id).unwrap_or(1);
        self.api
            .patch(
                &self.name,
                &PatchParams::apply(FIELD_MANAGER),
                &Patch::Merge(json!({"spec": {"replicas": replicas, "patchID": patch_id}})),
            )
            .await
            .map(drop)
            .map_err(|error| {
                ListenerError::Target(format!(
                    "patching the EphemeralRunnerSet {}/{}: {error}",
                    self.namespace, self.name
                ))
            })
    }
}

/// The EphemeralRunners of a namespace as a listener's [`JobSink`]: a job
/// goes on its runner's status, where the EphemeralRunnerSet controller
/// sees that the runner is busy.
#[derive(Clone)]
pub struct RunnerJobs {
    api: Api<EphemeralRunner>,
    namespace: String,
    record_successes: bool,
    view: Option<ClusterView>,
    unsent: Arc<Unsent>,
    heard: Option<Heard>,
}

/// Where a listener whose runners are renewed in place says which job each
/// runner runs ([`RunnerJobs::telling`]).
#[derive(Clone)]
struct Heard {
    backlogs: Backlogs,
    set: SetKey,
    budget: WriteBudget,
}

/// Job records the API server did not take because it could not be
/// reached (or answered 5xx, 429 or not at all), kept to be written again.
///
/// Lost, a record costs more than its own field: the end of a job whose
/// runner still ran is what lets the EphemeralRunnerSet replace that
/// runner at once for a waiting job, so after a 30 s API server outage a
/// lost one left the job waiting out the renewal window (a minute), and
/// the service cancelled it meanwhile (found by the fault matrix). A
/// record refused for good (4xx) is still only logged: retrying a poison
/// record would change nothing.
///
/// One record per runner, the later fields over the earlier (they are
/// status fields, and a later record of the same runner supersedes what
/// it repeats), written under one lock with the listener's own writes, so
/// an older record never lands after a newer one. The listener's writes
/// wait behind a retry only while the API server is failing anyway.
#[derive(Default)]
struct Unsent {
    records: tokio::sync::Mutex<BTreeMap<String, (serde_json::Value, Instant)>>,
    retrying: std::sync::atomic::AtomicBool,
}

/// How long an unsent record is tried again before it is dropped with a
/// warning: past it, the runner has long been renewed or deleted.
const UNSENT_FOR: Duration = Duration::from_secs(600);
/// The wait between two rounds of retries.
const UNSENT_RETRY: Duration = Duration::from_secs(1);

/// Whether the API server did not really answer (the call may succeed as
/// it is later).
fn unanswered(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => status.code >= 500 || status.code == 429,
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::HttpError(_) => true,
        _ => false,
    }
}

/// `later`'s fields over `earlier`'s.
fn merged(mut earlier: serde_json::Value, later: serde_json::Value) -> serde_json::Value {
    match (earlier.as_object_mut(), later) {
        (Some(fields), serde_json::Value::Object(newer)) => {
            fields.extend(newer);
            earlier
        }
        (_, later) => later,
    }
}

impl RunnerJobs {
    /// The runners of `namespace`; only results other than success are
    /// recorded unless [`Self::recording_successes`] says otherwise.
    pub fn new(client: Client, namespace: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_owned(),
            record_successes: false,
            view: None,
            unsent: Arc::default(),
            heard: None,
        }
    }

    /// Tells the runner set `set`, through `backlogs`, which job each
    /// runner started, and writes the start on the runner's status only
    /// as the host's status `budget` allows.
    ///
    /// Under a burst the start's record is a write a job (about one in
    /// five of a renewed job's), and with the set reading who is busy from
    /// `backlogs` no decision reads the record: it tells people which job
    /// a runner runs, and the renewal that follows the job names it in
    /// `status.renewal.previous` anyway. A start is written once it has
    /// held [`budget::RETRY`] and the budget allows, unless the job or its
    /// runner ended first (nothing would read it then): under a burst most
    /// jobs are over by then. Two kinds of runner still get the
    /// record at once: one whose set protects busy runners (its pod is
    /// marked from the record) and one the cache does not show (whose set
    /// nothing is known of). Ends are written as before.
    pub fn telling(mut self, backlogs: Backlogs, set: SetKey, budget: WriteBudget) -> Self {
        self.heard = Some(Heard {
            backlogs,
            set,
            budget,
        });
        self
    }

    /// Whether the start of a job on `runner` may wait for the budget: the
    /// cache shows the runner, and its set does not protect busy runners.
    fn start_may_wait(&self, runner: &str) -> bool {
        self.view
            .as_ref()
            .and_then(|view| view.runner(&self.namespace, runner))
            .is_some_and(|r| r.spec.protect_busy_runners != Some(true))
    }

    /// Writes the start of `job` (`status`) once it has held a while and
    /// the budget allows, unless the job or its runner ended first.
    fn start_later(&self, heard: Heard, job: &JobStarted, status: serde_json::Value) {
        let (jobs, runner, runner_id) = (self.clone(), job.runner_name.clone(), job.runner_id);
        tokio::spawn(async move {
            let running = || {
                heard
                    .backlogs
                    .job_on(&heard.set, &runner, runner_id)
                    .is_some()
                    && !jobs.ended(&runner, runner_id)
            };
            loop {
                tokio::time::sleep(budget::RETRY).await;
                if !running() {
                    return;
                }
                if heard.budget.take() {
                    break;
                }
            }
            if let Err(error) = jobs.record_while(&runner, status, running).await {
                tracing::debug!(%error, "a job's start, put off, was not written");
            }
        });
    }

    /// Leaves out the start of a job whose registration the cache shows
    /// ended already (the runner Succeeded with it).
    ///
    /// Under a burst the starts come late, the job often over and its
    /// runner succeeded by the time its message is read: the record is then
    /// a write that nothing reads (the job no longer runs, and a renewal
    /// writes the runner's status anew), and one that lands while the
    /// runner is being renewed makes that renewal's conditional write fail.
    /// Only an end the cache has seen is taken for one: a cache behind
    /// shows the runner before it ended, and the start is written as
    /// before. Ends are always written (a failed job's result is what a
    /// held runner waits for).
    ///
    /// With the cache, the success of a job whose runner it still shows
    /// running on that registration (its pod not exited yet) is recorded
    /// too when jobs wait for runners: the EphemeralRunnerSet learns from
    /// it that the listener's decisions have seen the job end, so the
    /// runner, once it succeeds, does not fill its own place under a
    /// decision already applied (rule 5 of its plan) and a waiting job gets
    /// it at once, renewed, if the record is there by then (else it waits
    /// for the next decision or the end of the renewal window). With no job
    /// waiting, nobody wants the place and the write is saved; nor is a
    /// success whose runner the cache shows ended written: the set's pass
    /// on the decision that saw it most likely found the runner gone.
    pub fn seeing(mut self, view: ClusterView) -> Self {
        self.view = Some(view);
        self
    }

    /// The phase the cache shows `runner` in, if it shows it on
    /// registration `runner_id`.
    fn phase_on(&self, runner: &str, runner_id: i64) -> Option<EphemeralRunnerPhase> {
        let cached = self.view.as_ref()?.runner(&self.namespace, runner)?;
        let status = cached.status.as_ref()?;
        (runner_id != 0 && status.runner_id == runner_id).then(|| status.phase.unwrap_or_default())
    }

    /// Whether the cache shows `runner` succeeded on registration
    /// `runner_id`.
    fn ended(&self, runner: &str, runner_id: i64) -> bool {
        self.phase_on(runner, runner_id) == Some(EphemeralRunnerPhase::Succeeded)
    }

    /// Whether the cache shows `runner` still running on registration
    /// `runner_id`.
    fn still_running(&self, runner: &str, runner_id: i64) -> bool {
        matches!(
            self.phase_on(runner, runner_id),
            Some(EphemeralRunnerPhase::Pending | EphemeralRunnerPhase::Running)
        )
    }

    /// Whether every successful job's result is recorded too.
    ///
    /// A job's end is a status write on its runner, one per job, and for a
    /// job that succeeded little reads it: the runner exits 0 and ends as
    /// Succeeded on its own (the one reader is the set, see
    /// [`Self::seeing`]). A result other than success is worth the
    /// write (it says why the runner ended). Only a scale set that holds
    /// failed runners needs every result: its runners, having exited 0,
    /// wait for the result to tell a failed job (held) from a successful
    /// one (ended), and without the success recorded would wait out the
    /// whole result wait.
    pub fn recording_successes(mut self, record: bool) -> Self {
        self.record_successes = record;
        self
    }

    async fn record(&self, runner: &str, status: serde_json::Value) -> Result<(), ListenerError> {
        self.record_while(runner, status, || true).await
    }

    /// Writes `status` on `runner` if `still` holds once the listener's
    /// records are its to write: a start put off is never written over an
    /// end recorded meanwhile.
    async fn record_while(
        &self,
        runner: &str,
        status: serde_json::Value,
        still: impl FnOnce() -> bool,
    ) -> Result<(), ListenerError> {
        let mut unsent = self.unsent.records.lock().await;
        if !still() {
            return Ok(());
        }
        let (status, since) = match unsent.remove(runner) {
            Some((earlier, since)) => (merged(earlier, status), since),
            None => (status, Instant::now()),
        };
        match write_record(&self.api, runner, &status).await {
            Ok(()) => Ok(()),
            Err(error) if unanswered(&error) => {
                unsent.insert(runner.to_owned(), (status, since));
                drop(unsent);
                self.retry_unsent();
                Err(ListenerError::JobRecord {
                    runner: runner.to_owned(),
                    message: format!("{error}; written again once the API server answers"),
                })
            }
            Err(error) => Err(ListenerError::JobRecord {
                runner: runner.to_owned(),
                message: error.to_string(),
            }),
        }
    }

    /// Starts the retries of the unsent records unless they run already;
    /// they end when none is left.
    fn retry_unsent(&self) {
        use std::sync::atomic::Ordering;
        if self.unsent.retrying.swap(true, Ordering::SeqCst) {
            return;
        }
        let (unsent, api) = (Arc::clone(&self.unsent), self.api.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(UNSENT_RETRY).await;
                let mut records = unsent.records.lock().await;
                for (runner, (status, since)) in std::mem::take(&mut *records) {
                    match write_record(&api, &runner, &status).await {
                        Ok(()) => tracing::debug!(runner, "job record written on a retry"),
                        Err(error) if unanswered(&error) && since.elapsed() < UNSENT_FOR => {
                            records.insert(runner, (status, since));
                        }
                        Err(error) => {
                            tracing::warn!(runner, %error, "job record dropped after retries");
                        }
                    }
                }
                if records.is_empty() {
                    // Cleared under the lock: a record failing after this
                    // starts the retries again.
                    unsent.retrying.store(false, Ordering::SeqCst);
                    return;
                }
            }
        });
    }
}

/// Writes job fields on a runner's status; a runner gone already (it
/// finished before the message arrived) is not an error.
async fn write_record(
    api: &Api<EphemeralRunner>,
    runner: &str,
    status: &serde_json::Value,
) -> Result<(), kube::Error> {
    match api
        .patch_status(
            runner,
            &PatchParams::apply(FIELD_MANAGER),
            &Patch::Merge(json!({ "status": status })),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(error) => Err(error),
    }
}

fn time(at: Timestamp) -> Time {
    Time(at)
}

/// The status fields of a job's start. The registration that runs the job
/// goes with it, and a result left from the job before is cleared: a
/// renewed runner carries one job after another (see `RunnerRenewal`), and
/// neither a late record of the one before nor its result is to be taken
/// for this one's.
fn started_fields(job: &JobStarted) -> serde_json::Value {
    json!({
        "jobRequestId": job.runner_request_id,
        "jobRunnerId": job.runner_id,
        "jobResult": null,
        "jobFinishedAt": null,
        "jobId": job.job_id,
        "jobRepositoryName": job.repository,
        "jobWorkflowRef": job.workflow_ref,
        "workflowRunId": job.workflow_run_id,
        "jobDisplayName": job.job_display_name,
        "jobStartedAt": time(job.started_at),
    })
}

impl JobSink for RunnerJobs {
    async fn job_started(&self, job: JobStarted) -> Result<(), ListenerError> {
        if self.ended(&job.runner_name, job.runner_id) {
            return Ok(());
        }
        let status = started_fields(&job);
        let Some(heard) = &self.heard else {
            return self.record(&job.runner_name, status).await;
        };
        heard.backlogs.started(
            &heard.set,
            &job.runner_name,
            Started {
                runner_id: job.runner_id,
                job_id: job.job_id.clone(),
            },
        );
        if !self.start_may_wait(&job.runner_name) {
            return self.record(&job.runner_name, status).await;
        }
        self.start_later(heard.clone(), &job, status);
        Ok(())
    }

    async fn job_completed(&self, job: JobCompleted) -> Result<(), ListenerError> {
        if job.runner_name.is_empty() {
            // Cancelled before any runner took it: nothing to record.
            return Ok(());
        }
        if let Some(heard) = &self.heard {
            heard
                .backlogs
                .ended(&heard.set, &job.runner_name, job.runner_id);
        }
        if !self.record_successes
            && job.result.eq_ignore_ascii_case("succeeded")
            && !(job.jobs_waiting && self.still_running(&job.runner_name, job.runner_id))
        {
            return Ok(());
        }
        let mut status = job
            .started
            .as_ref()
            .map_or_else(|| json!({}), started_fields);
        status["jobRunnerId"] = json!(job.runner_id);
        status["jobResult"] = json!(job.result);
        status["jobFinishedAt"] = json!(time(job.finished_at));
        self.record(&job.runner_name, status).await
    }
}

/// The AutoscalingRunnerSet's status and events as a listener's
/// [`StatusSink`].
///
/// [`StatusSink::update`] must not block, so updates go through a channel
/// to a writer task. Under load the writer folds what queued up while it
/// was writing into one status patch (the latest health and decision win)
/// before it writes again: the status says what is true now, not every
/// step on the way.
pub struct ScaleSetStatus {
    updates: mpsc::UnboundedSender<StatusUpdate>,
}

impl ScaleSetStatus {
    /// Starts the writer for `set`, a reference to the AutoscalingRunnerSet
    /// (namespace, name and uid, so events show in `kubectl describe`). It
    /// ends once every sender is dropped, i.e. when its listener has ended.
    pub fn start(client: Client, events: Publisher, set: ObjectReference) -> Self {
        let (updates, queue) = mpsc::unbounded_channel();
        let api: Api<AutoscalingRunnerSet> =
            Api::namespaced(client, set.namespace.as_deref().unwrap_or_default());
        tokio::spawn(write_statuses(api, events, set, queue));
        Self { updates }
    }

    /// The publisher a listener's events go out through
    /// (`arcwright-listener`).
    pub fn publisher(client: Client) -> Publisher {
        Publisher::new(client, "listener")
    }

    /// A reference to `set` for [`ScaleSetStatus::start`].
    pub fn reference(namespace: &str, name: &str, uid: Option<String>) -> ObjectReference {
        ObjectReference {
            api_version: Some(AutoscalingRunnerSet::api_version(&()).into_owned()),
            kind: Some(AutoscalingRunnerSet::kind(&()).into_owned()),
            namespace: Some(namespace.to_owned()),
            name: Some(name.to_owned()),
            uid,
            ..ObjectReference::default()
        }
    }
}

impl StatusSink for ScaleSetStatus {
    fn update(&self, update: StatusUpdate) {
        // The writer is gone only when the process is shutting down.
        let _ = self.updates.send(update);
    }
}

/// What one status patch and its events say, folded from queued updates.
/// The writer keeps one for the listener's life: it remembers the answer
/// last announced, so a decision whose reason moved (a job count in it) but
/// whose answer did not is written to the status without another event.
#[derive(Default)]
struct Batch {
    health: Option<Health>,
    decision: Option<super::DecisionReport>,
    events: Vec<Notice>,
    announced: Option<(u32, String)>,
    /// Whether the shadow was last announced agreeing.
    shadow_agreed: bool,
}

impl Batch {
    fn add(&mut self, update: StatusUpdate) {
        match update {
            StatusUpdate::Health(health) => {
                self.events.push(health_event(&health));
                self.health = Some(health);
            }
            StatusUpdate::Decision(decision) => {
                let answer = (decision.desired, decision.policy.clone());
                if self.announced.as_ref() != Some(&answer) {
                    self.events.push(decision_event(&decision));
                    self.announced = Some(answer);
                }
                if let Some(shadow) = &decision.shadow
                    && shadow.agrees() != self.shadow_agreed
                {
                    self.shadow_agreed = shadow.agrees();
                    self.events.push(shadow_event(&decision, shadow));
                }
                self.decision = Some(decision);
            }
            StatusUpdate::Policy { policy, event } => {
                self.events.push(policy_event(&policy, &event));
            }
        }
    }

    /// The status patch and the events gathered since the last call.
    fn take(&mut self, now: Timestamp) -> (serde_json::Value, Vec<Notice>) {
        let status = self.status(now);
        self.health = None;
        self.decision = None;
        (status, std::mem::take(&mut self.events))
    }

    fn status(&self, now: Timestamp) -> serde_json::Value {
        let mut status = serde_json::Map::new();
        if let Some(health) = &self.health {
            status.insert(
                "listener".into(),
                serde_json::to_value(listener_status(health, now)).unwrap_or_default(),
            );
        }
        if let Some(decision) = &self.decision {
            status.insert(
                "scaling".into(),
                serde_json::to_value(ScalingStatus {
                    desired_runners: i32::try_from(decision.desired).unwrap_or(i32::MAX),
                    reason: decision.reason.clone(),
                    policy: decision.policy.clone(),
                    fallback_reason: decision.fallback_reason.clone(),
                    last_decision_time: Some(Time(now)),
                    shadow: decision.shadow.as_ref().map(|shadow| ShadowScalingStatus {
                        policy: shadow.policy.clone(),
                        desired_runners: shadow
                            .desired
                            .map(|d| i32::try_from(d).unwrap_or(i32::MAX)),
                        reason: shadow.reason.clone(),
                        agreement: shadow.agreement.map(|a| a.as_str().to_owned()),
                        error: shadow.error.clone(),
                        since: Some(Time(shadow.since)),
                    }),
                })
                .unwrap_or_default(),
            );
        }
        serde_json::Value::Object(status)
    }
}

/// The status a health report is shown as.
pub fn listener_status(health: &Health, now: Timestamp) -> ListenerStatus {
    let (state, reason, message) = match health {
        Health::Listening => ("Listening", None, None),
        Health::Retrying { cause, message, .. } => (
            "Retrying",
            Some(cause.as_str().to_owned()),
            Some(message.clone()),
        ),
        Health::Stopped => ("Stopped", None, None),
    };
    ListenerStatus {
        state: state.into(),
        reason,
        message,
        last_transition_time: Some(Time(now)),
    }
}

fn health_event(health: &Health) -> Notice {
    let (type_, reason, note) = match health {
        Health::Listening => (
            Severity::Normal,
            "Listening",
            "the listener holds its message session".to_owned(),
        ),
        Health::Retrying {
            cause,
            message,
            retry_in,
        } => (
            Severity::Warning,
            cause.as_str(),
            format!("the listener retries in {retry_in:?}: {message}"),
        ),
        Health::Stopped => (
            Severity::Normal,
            "ListenerStopped",
            "the listener stopped and deleted its message session".to_owned(),
        ),
    };
    Notice::new(type_, reason, note).during("Listen")
}

fn decision_event(decision: &super::DecisionReport) -> Notice {
    let mut note = format!(
        "{} runners desired by {}: {}",
        decision.desired, decision.policy, decision.reason
    );
    if let Some(fallback) = &decision.fallback_reason {
        note.push_str(&format!(
            " (the configured policy did not decide: {fallback})"
        ));
    }
    Notice::normal("ScalingDecision", note).during("Scale")
}

/// Agreement started or ended: the only shadow events, so a shadow that
/// answers on every poll does not fill the event log.
fn shadow_event(
    decision: &super::DecisionReport,
    shadow: &crate::policy::shadow::ShadowReport,
) -> Notice {
    if shadow.agrees() {
        return Notice::normal(
            "ShadowAgreed",
            format!(
                "shadow scaling policy {} now agrees with {}: {} runners",
                shadow.policy, decision.policy, decision.desired
            ),
        )
        .during("Scale");
    }
    let answer = match (shadow.desired, &shadow.error) {
        (Some(desired), _) => format!("{desired} runners ({})", shadow.reason),
        (None, Some(error)) => format!("no answer: {error}"),
        (None, None) => "no answer".to_owned(),
    };
    Notice::normal(
        "ShadowDisagreed",
        format!(
            "shadow scaling policy {} no longer agrees with {}: {} decided {} runners, the shadow {answer}",
            shadow.policy, decision.policy, decision.policy, decision.desired
        ),
    )
    .during("Scale")
}

fn policy_event(policy: &str, event: &PolicyEvent) -> Notice {
    let (type_, reason, note) = match event {
        PolicyEvent::Loaded { sha256 } => (
            Severity::Normal,
            "PolicyLoaded",
            format!("scaling policy {policy} loaded (sha256 {sha256})"),
        ),
        PolicyEvent::LoadFailed { reason, message } => (
            Severity::Warning,
            "PolicyLoadFailed",
            format!("scaling policy {policy} not loaded ({reason}): {message}"),
        ),
        PolicyEvent::Fallback {
            reason,
            message,
            fallback,
        } => (
            Severity::Warning,
            "PolicyFallback",
            format!("scaling policy {policy} failed ({reason}), {fallback} decided: {message}"),
        ),
        PolicyEvent::Clamped { requested, max } => (
            Severity::Warning,
            "PolicyClamped",
            format!("scaling policy {policy} asked for {requested} runners; clamped to {max}"),
        ),
    };
    Notice::new(type_, reason, note).during("Scale")
}

/// The writer task: folds what is queued, writes it, repeats until the
/// listener is gone. A failed write is logged and not retried: the next
/// change writes the whole picture again, and the status is informative,
/// not something any controller decides on.
async fn write_statuses(
    api: Api<AutoscalingRunnerSet>,
    events: Publisher,
    set: ObjectReference,
    mut queue: mpsc::UnboundedReceiver<StatusUpdate>,
) {
    let name = set.name.clone().unwrap_or_default();
    let mut batch = Batch::default();
    while let Some(first) = queue.recv().await {
        batch.add(first);
        while let Ok(next) = queue.try_recv() {
            batch.add(next);
        }
        let (status, notices) = batch.take(Timestamp::now());
        if status.as_object().is_some_and(|fields| !fields.is_empty()) {
            let written = api
                .patch_status(
                    &name,
                    &PatchParams::apply(FIELD_MANAGER),
                    &Patch::Merge(json!({ "status": status })),
                )
                .await;
            match written {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(error) => {
                    tracing::warn!(scale_set = %name, "listener status not written: {error}");
                }
            }
        }
        for notice in notices {
            events.publish(&set, notice).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn every_job_field_the_listener_writes_is_one_a_late_record_is_cleared_of() {
        let job = JobStarted {
            runner_name: "r".into(),
            runner_id: 1,
            runner_request_id: 2,
            repository: "o/r".into(),
            workflow_ref: "w".into(),
            workflow_run_id: 3,
            job_id: "j".into(),
            job_display_name: "d".into(),
            started_at: Timestamp::UNIX_EPOCH,
        };
        let cleared = crate::api::JOB_FIELDS;
        for key in started_fields(&job).as_object().unwrap().keys() {
            assert!(cleared.contains(&key.as_str()), "{key}");
        }
    }
    use crate::listener::{Cause, DecisionReport};

    fn decision(desired: u32, reason: &str) -> StatusUpdate {
        StatusUpdate::Decision(DecisionReport {
            desired,
            reason: reason.into(),
            policy: "builtin:default".into(),
            fallback_reason: None,
            shadow: None,
        })
    }

    #[test]
    fn a_batch_writes_the_latest_health_and_decision_and_announces_each_new_answer() {
        let mut batch = Batch::default();
        batch.add(StatusUpdate::Health(Health::Retrying {
            cause: Cause::SessionConflict,
            message: "held elsewhere".into(),
            retry_in: Duration::from_secs(2),
        }));
        batch.add(decision(3, "3 jobs assigned"));
        batch.add(decision(3, "3 jobs assigned, 1 running"));
        batch.add(decision(5, "5 jobs assigned"));
        batch.add(StatusUpdate::Health(Health::Listening));
        let now: Timestamp = "2026-12-01T08:00:00Z".parse().unwrap();
        assert_eq!(
            batch.status(now),
            json!({
                "listener": {"state": "Listening", "lastTransitionTime": "2026-12-01T08:00:00Z"},
                "scaling": {"desiredRunners": 5, "reason": "5 jobs assigned",
                            "policy": "builtin:default", "lastDecisionTime": "2026-12-01T08:00:00Z"},
            })
        );
        let reasons = |events: &[Notice]| -> Vec<String> {
            events.iter().map(|e| e.reason.clone()).collect()
        };
        let (_, events) = batch.take(now);
        assert_eq!(
            reasons(&events),
            [
                "SessionConflict",
                "ScalingDecision",
                "ScalingDecision",
                "Listening"
            ],
            "a new reason for the same answer is status only"
        );

        batch.add(decision(5, "5 jobs assigned, 2 running"));
        let (status, events) = batch.take(now);
        assert_eq!(status["scaling"]["reason"], "5 jobs assigned, 2 running");
        assert!(status.get("listener").is_none(), "only what changed");
        assert!(events.is_empty(), "the answer was announced already");
    }

    #[test]
    fn a_retrying_listener_shows_its_cause_and_error() {
        let now: Timestamp = "2026-12-01T08:00:00Z".parse().unwrap();
        let status = listener_status(
            &Health::Retrying {
                cause: Cause::ScaleSetNotFound,
                message: "scale set 7 not found".into(),
                retry_in: Duration::from_secs(8),
            },
            now,
        );
        assert_eq!(
            (
                status.state.as_str(),
                status.reason.as_deref(),
                status.message.as_deref()
            ),
            (
                "Retrying",
                Some("ScaleSetNotFound"),
                Some("scale set 7 not found")
            )
        );
    }

    fn runner(phase: EphemeralRunnerPhase, job: bool, deleting: bool) -> EphemeralRunner {
        let mut runner: EphemeralRunner = serde_json::from_value(json!({
            "apiVersion": "arcwright.dev/v1alpha1", "kind": "EphemeralRunner",
            "metadata": {"name": "r", "namespace": "ns"},
            "spec": {"githubConfigUrl": "https://github.com/o", "githubConfigSecret": "s",
                     "runnerScaleSetId": 1, "spec": {"containers": []}},
        }))
        .unwrap();
        let mut status = crate::api::EphemeralRunnerStatus {
            phase: Some(phase),
            ..Default::default()
        };
        if job {
            status.job_id = Some("j".into());
        }
        runner.status = Some(status);
        if deleting {
            runner.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        }
        runner
    }

    #[test]
    fn runners_are_counted_by_phase_busy_and_deleting() {
        use EphemeralRunnerPhase::*;
        let runners = [
            runner(Pending, false, false),
            runner(Running, false, false),
            runner(Running, true, false),
            runner(Running, true, true),
            runner(Succeeded, false, false),
            runner(Failed, false, false),
            runner(Outdated, false, false),
        ];
        let counts = runners.iter().fold(RunnerCounts::default(), count);
        assert_eq!(
            counts,
            RunnerCounts {
                pending: 1,
                running: 2,
                busy: 1,
                succeeded: 1,
                failed: 1,
                outdated: 1,
                deleting: 1,
            }
        );
    }
}
