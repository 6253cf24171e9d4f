//! How the AutoscalingRunnerSet controller starts and stops the listener of
//! a scale set: the seam between the controller and the listeners, kept
//! here so the listener depends on nothing of the controllers.
//!
//! The controller only decides *that* a listener must run with a given
//! configuration, or must not run; the listener itself (message session,
//! long poll, scaling decisions) lives in this module's parent as one task per
//! scale set. This trait is the seam between the two: the production
//! implementation wraps those tasks (it is written alongside the listener,
//! and spawns or cancels one task per scale set, deleting the message
//! session on stop); [`InMemoryListeners`] records starts and stops so the
//! controller's ordering rules can be tested against the real API server
//! without an Actions message queue.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::credentials::GitHubTarget;
use crate::policy::loader::PolicyRef;

/// Everything a listener is built from. Two equal configurations are the
/// same listener; any difference (a label included, since labels propagate
/// to the listener) is a restart.
#[derive(Clone, Debug, PartialEq)]
pub struct ListenerConfig {
    /// The AutoscalingRunnerSet's namespace.
    pub namespace: String,
    /// The AutoscalingRunnerSet's name.
    pub name: String,
    /// The AutoscalingRunnerSet's uid: a set deleted and created again
    /// under the same name gets a listener of its own, and events name the
    /// right object.
    pub uid: Option<String>,
    /// The EphemeralRunnerSet the listener scales.
    pub runner_set_name: String,
    /// The scale set's id in the Actions service.
    pub scale_set_id: i64,
    /// Where the scale set's GitHub configuration and credentials live
    /// (URL, Secret, proxy, CA): a change of any of them is a new client,
    /// so a new listener.
    pub github: GitHubTarget,
    /// The effective minimum (0 when unset).
    pub min_runners: i32,
    /// The maximum; unbounded when `None`.
    pub max_runners: Option<i32>,
    /// The scale set's `runs-on` labels.
    pub scale_set_labels: Vec<String>,
    /// The AutoscalingRunnerSet's labels.
    pub labels: BTreeMap<String, String>,
    /// The scaling policy reference.
    pub scaling_policy: Option<PolicyRef>,
    /// The shadow scaling policy's, if there is one.
    pub shadow_scaling_policy: Option<PolicyRef>,
    /// Whether failed runners are held for debugging (`debug.holdFailedFor`):
    /// their controller then waits for every job's result, successes
    /// included, so the listener records them all; otherwise only results
    /// other than success are recorded (see
    /// [`RunnerJobs`](crate::listener::cluster::RunnerJobs)).
    pub holds_failures: bool,
    /// The labels of its per-job metrics (`spec.listenerMetrics`).
    pub job_metrics: super::metrics::JobMetricLabels,
}

/// Why a listener could not be started (the listener's own failures,
/// once it runs, are [`ListenerError`](super::ListenerError)s).
#[derive(Debug, thiserror::Error)]
#[error("the listener of {namespace}/{name} could not be started: {message}")]
pub struct StartError {
    /// The AutoscalingRunnerSet's namespace.
    pub namespace: String,
    /// The AutoscalingRunnerSet's name.
    pub name: String,
    /// What went wrong (never a secret).
    pub message: String,
}

/// Starts and stops listeners. Calls for one scale set never overlap (the
/// controller reconciles an object at most once at a time).
pub trait ListenerControl: Send + Sync + 'static {
    /// The configuration of the listener running for `namespace/name`.
    fn running(&self, namespace: &str, name: &str) -> Option<ListenerConfig>;
    /// Makes a listener with `config` run (starting it; the caller stops a
    /// listener with another configuration first).
    fn ensure(&self, config: ListenerConfig)
    -> impl Future<Output = Result<(), StartError>> + Send;
    /// Stops the listener of `namespace/name`, if one runs, and waits until
    /// it has stopped, so nothing acquires jobs after this returns.
    fn stop(&self, namespace: &str, name: &str) -> impl Future<Output = ()> + Send;
}

/// What happened to a listener, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum ListenerEvent {
    /// Started with this configuration.
    Started(Box<ListenerConfig>),
    /// The listener of `(namespace, name)` stopped.
    Stopped(String, String),
}

/// Listeners held in memory: what runs and the history of starts and
/// stops, which tests wait on.
#[derive(Clone)]
pub struct InMemoryListeners {
    inner: Arc<Mutex<Listeners>>,
    changed: Arc<watch::Sender<u64>>,
}

#[derive(Default)]
struct Listeners {
    running: BTreeMap<(String, String), ListenerConfig>,
    history: Vec<ListenerEvent>,
}

impl Default for InMemoryListeners {
    fn default() -> Self {
        Self {
            inner: Arc::default(),
            changed: Arc::new(watch::channel(0).0),
        }
    }
}

impl InMemoryListeners {
    /// Every start and stop so far.
    pub fn history(&self) -> Vec<ListenerEvent> {
        self.lock().history.clone()
    }

    /// Waits until the history satisfies `done`; returns it.
    pub async fn wait_for(&self, done: impl Fn(&[ListenerEvent]) -> bool) -> Vec<ListenerEvent> {
        let mut changes = self.changed.subscribe();
        loop {
            let history = self.history();
            if done(&history) {
                return history;
            }
            if changes.changed().await.is_err() {
                return history;
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Listeners> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn record(&self, change: impl FnOnce(&mut Listeners)) {
        change(&mut self.lock());
        self.changed.send_modify(|version| *version += 1);
    }
}

impl ListenerControl for InMemoryListeners {
    fn running(&self, namespace: &str, name: &str) -> Option<ListenerConfig> {
        self.lock()
            .running
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    async fn ensure(&self, config: ListenerConfig) -> Result<(), StartError> {
        self.record(|listeners| {
            let key = (config.namespace.clone(), config.name.clone());
            if listeners.running.get(&key) != Some(&config) {
                listeners.running.insert(key, config.clone());
                listeners
                    .history
                    .push(ListenerEvent::Started(Box::new(config)));
            }
        });
        Ok(())
    }

    async fn stop(&self, namespace: &str, name: &str) {
        self.record(|listeners| {
            let key = (namespace.to_string(), name.to_string());
            if listeners.running.remove(&key).is_some() {
                listeners.history.push(ListenerEvent::Stopped(key.0, key.1));
            }
        });
    }
}
