//! The production [`ListenerControl`]: one listener task per scale set, in
//! this process.
//!
//! The AutoscalingRunnerSet controller decides that a listener must run
//! with a configuration, or must not; the supervisor keeps exactly those
//! tasks, each wired to the cluster ([`RunnerSetTarget`], [`RunnerJobs`],
//! [`ScaleSetStatus`]). A listener gets its Actions client from the shared
//! cache ([`ActionsClients`]), so a thousand scale sets under one GitHub App
//! share its tokens and connections, and asks it again when its
//! credentials are refused ([`CachedClient`]).
//!
//! Stopping is waited for: [`ListenerControl::stop`] returns once the task
//! has deleted its message session, so the controller's deletion order
//! (listener, runners, scale set) holds, and [`Supervisor::stop_all`] lets
//! the process exit only after every session is gone.
//!
//! With the fleet split into shards, the supervisor is also where a lost
//! shard's listeners stop ([`Supervisor::keep_owned`]): at once, each
//! deleting its session, before the shard's Lease can pass to another
//! replica. A listener is never started for a scale set of a shard not
//! held, even by a reconcile that began while it was.

use std::collections::HashMap;
use std::sync::Mutex;

use kube::Client;
use tokio_util::sync::CancellationToken;

use super::cluster::{ClusterView, RunnerJobs, RunnerSetTarget, ScaleSetStatus};
use super::control::{ListenerConfig, ListenerControl, StartError};
use super::{Backoff, CachedClient, ListenerHandle, ListenerMetrics, ListenerSpec};
use crate::backlog::{Backlogs, SetKey};
use crate::controllers::kit::budget::WriteBudget;
use crate::credentials::ActionsClients;
use crate::policy::loader::PolicyLoader;
use crate::policy::types::ScaleSet;
use crate::recording::Recordings;
use crate::sharding::Shards;

type Key = (String, String);

/// Runs the listeners the AutoscalingRunnerSet controller asks for.
pub struct Supervisor {
    kube: Client,
    clients: ActionsClients,
    loader: PolicyLoader,
    view: ClusterView,
    events: crate::events::Publisher,
    owner: String,
    backoff: Backoff,
    batch_window: std::time::Duration,
    metrics: ListenerMetrics,
    recordings: Recordings,
    shards: Shards,
    backlogs: Backlogs,
    /// The host's status budget, once listeners tell the runner sets which
    /// job each runner runs ([`Self::with_backlogs`]).
    start_budget: Option<WriteBudget>,
    shutdown: CancellationToken,
    running: Mutex<HashMap<Key, (ListenerConfig, ListenerHandle)>>,
}

impl Supervisor {
    /// A supervisor whose listeners read the cluster through `view`, hold
    /// their sessions as `owner` (the host's name, shown by the service),
    /// and end when `shutdown` is cancelled.
    pub fn new(
        kube: Client,
        clients: ActionsClients,
        loader: PolicyLoader,
        view: ClusterView,
        owner: String,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            events: ScaleSetStatus::publisher(kube.clone()),
            kube,
            clients,
            loader,
            view,
            owner,
            backoff: Backoff::default(),
            batch_window: super::DEFAULT_BATCH_WINDOW,
            metrics: ListenerMetrics::default(),
            recordings: Recordings::off(),
            shards: Shards::single(),
            backlogs: Backlogs::new(),
            start_budget: None,
            shutdown,
            running: Mutex::new(HashMap::new()),
        }
    }

    /// Listeners wait this long after a failure at first (default 1 s, up
    /// to a minute).
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Listeners wait this long from a message to their next poll
    /// ([`ListenerSpec::batch_window`]; [`super::DEFAULT_BATCH_WINDOW`]
    /// unless told).
    pub fn with_batch_window(mut self, window: std::time::Duration) -> Self {
        self.batch_window = window;
        self
    }

    /// Listeners report to `metrics` (registered by the caller).
    pub fn with_metrics(mut self, metrics: ListenerMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Listeners record their decisions and job events in `recordings`
    /// (none unless told).
    pub fn with_recordings(mut self, recordings: Recordings) -> Self {
        self.recordings = recordings;
        self
    }

    /// Runs listeners only for the scale sets of the shards `shards` holds
    /// (all of them unless told).
    pub fn with_shards(mut self, shards: Shards) -> Self {
        self.shards = shards;
        self
    }

    /// Listeners say how many jobs wait for a runner, and which job each
    /// runner started, in `backlogs`, which the runner controllers read
    /// (see [`crate::backlog`]), and write the starts as the host's status
    /// `budget` allows (see [`RunnerJobs::telling`]); unless told, a
    /// backlog of their own, read by nobody, and every start written.
    pub fn with_backlogs(mut self, backlogs: Backlogs, budget: WriteBudget) -> Self {
        self.backlogs = backlogs;
        self.start_budget = Some(budget);
        self
    }

    /// Where the listener of `config` records its jobs.
    fn jobs(&self, config: &ListenerConfig) -> RunnerJobs {
        let jobs = RunnerJobs::new(self.kube.clone(), &config.namespace)
            .recording_successes(config.holds_failures)
            .seeing(self.view.clone());
        match &self.start_budget {
            Some(budget) => jobs.telling(
                self.backlogs.clone(),
                SetKey::new(&config.namespace, &config.runner_set_name),
                budget.clone(),
            ),
            None => jobs,
        }
    }

    /// Stops the listeners of scale sets whose shard is no longer held,
    /// each deleting its session; returns how many stopped. Their
    /// recordings go with them: the replica that holds the shard now
    /// records the set, and one kept here for a shard that may never come
    /// back would stay for the life of the process.
    pub async fn keep_owned(&self) -> usize {
        let lost: Vec<_> = {
            let mut running = self.lock();
            let lost: Vec<Key> = running
                .keys()
                .filter(|(namespace, name)| !self.shards.owns(namespace, name))
                .cloned()
                .collect();
            lost.into_iter()
                .filter_map(|key| running.remove(&key).map(|(_, handle)| (key, handle)))
                .collect()
        };
        let stopped = lost.len();
        for (namespace, name) in lost.iter().map(|(key, _)| key) {
            tracing::info!(
                %namespace,
                scale_set = %name,
                "the scale set's shard is no longer held: stopping its listener"
            );
        }
        for (namespace, name) in lost.iter().map(|(key, _)| key) {
            self.recordings.forget(namespace, name);
        }
        stop_together(lost).await;
        stopped
    }

    /// Stops lost shards' listeners ([`Self::keep_owned`]) each time the
    /// shards held change, until `shutdown`.
    pub async fn follow_shards(&self, shutdown: &CancellationToken) {
        if !self.shards.is_sharded() {
            return;
        }
        let mut held = self.shards.subscribe();
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                changed = held.changed() => if changed.is_err() { return },
            }
            self.keep_owned().await;
        }
    }

    /// How many listeners run.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no listener runs.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stops every listener and waits until each has deleted its session.
    pub async fn stop_all(&self) {
        let all: Vec<_> = self
            .lock()
            .drain()
            .map(|(key, (_, handle))| (key, handle))
            .collect();
        stop_together(all).await;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, (ListenerConfig, ListenerHandle)>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn spec(&self, config: &ListenerConfig) -> ListenerSpec {
        let max = config.max_runners.unwrap_or(i32::MAX);
        ListenerSpec {
            scale_set_id: config.scale_set_id,
            scale_set: ScaleSet {
                name: config.name.clone(),
                namespace: config.namespace.clone(),
                min_runners: u32::try_from(config.min_runners).unwrap_or(0),
                max_runners: u32::try_from(max).unwrap_or(0),
                labels: config.scale_set_labels.clone(),
            },
            owner: self.owner.clone(),
            scaling_policy: config.scaling_policy.clone(),
            shadow_scaling_policy: config.shadow_scaling_policy.clone(),
            metrics: self.metrics.clone(),
            metric_labels: super::metrics::ScaleSetLabels::new(
                &config.namespace,
                &config.name,
                &config.github.config_url,
            ),
            job_metrics: config.job_metrics.clone(),
            backoff: self.backoff,
            batch_window: self.batch_window,
            recording: self.recordings.open(&config.namespace, &config.name),
            backlog: Some((
                self.backlogs.clone(),
                SetKey::new(&config.namespace, &config.runner_set_name),
            )),
        }
    }
}

/// Tells every one of `listeners` to stop, then waits for them all at
/// once. One after another, a thousand listeners each deleting its
/// session would take a thousand round trips, while a shard lost or a
/// leadership lost leaves a few seconds before another replica starts
/// listening for the same scale sets: every session is to be gone by then.
async fn stop_together(listeners: Vec<(Key, ListenerHandle)>) {
    for (_, handle) in &listeners {
        handle.cancel();
    }
    futures::future::join_all(listeners.into_iter().map(
        |((namespace, name), handle)| async move {
            finish(&namespace, &name, handle.join().await);
        },
    ))
    .await;
}

fn finish(namespace: &str, name: &str, ended: Result<(), super::ListenerError>) {
    if let Err(error) = ended {
        tracing::warn!(
            namespace,
            scale_set = name,
            "the listener ended with an error: {error}"
        );
    }
}

impl ListenerControl for Supervisor {
    fn running(&self, namespace: &str, name: &str) -> Option<ListenerConfig> {
        self.lock()
            .get(&(namespace.to_owned(), name.to_owned()))
            .filter(|(_, handle)| !handle.is_finished())
            .map(|(config, _)| config.clone())
    }

    async fn ensure(&self, config: ListenerConfig) -> Result<(), StartError> {
        if !self.shards.owns(&config.namespace, &config.name) {
            return Ok(());
        }
        let key = (config.namespace.clone(), config.name.clone());
        let previous = {
            let mut running = self.lock();
            match running.get(&key) {
                Some((current, handle)) if *current == config && !handle.is_finished() => {
                    return Ok(());
                }
                _ => running.remove(&key),
            }
        };
        if let Some((_, handle)) = previous {
            finish(&key.0, &key.1, handle.stop().await);
        }
        // Credentials that cannot be used are the scale set's error, not a
        // listener retrying in the background.
        self.clients
            .get(&config.github)
            .await
            .map_err(|error| StartError {
                namespace: config.namespace.clone(),
                name: config.name.clone(),
                message: error.to_string(),
            })?;
        let client = CachedClient {
            clients: self.clients.clone(),
            target: config.github.clone(),
        };
        let status = ScaleSetStatus::start(
            self.kube.clone(),
            self.events.clone(),
            ScaleSetStatus::reference(&config.namespace, &config.name, config.uid.clone()),
        );
        let handle = super::spawn(
            client,
            self.loader.clone(),
            self.spec(&config),
            RunnerSetTarget::new(
                self.kube.clone(),
                self.view.clone(),
                &config.namespace,
                &config.runner_set_name,
            ),
            self.jobs(&config),
            status,
            &self.shutdown,
        );
        self.lock().insert(key.clone(), (config, handle));
        // The shard was lost while this listener started: the stop that
        // followed the loss may have run before the insert.
        if !self.shards.owns(&key.0, &key.1) {
            self.keep_owned().await;
        }
        Ok(())
    }

    async fn stop(&self, namespace: &str, name: &str) {
        let stopped = self.lock().remove(&(namespace.to_owned(), name.to_owned()));
        if let Some((_, handle)) = stopped {
            finish(namespace, name, handle.stop().await);
        }
        // Stopped for good (the scale set is going, or no longer this
        // host's): its history goes with it.
        self.recordings.forget(namespace, name);
    }
}
