//! The runner simulator: plays the kubelet and the runner for runner pods,
//! against the fake Actions service, because the test control plane has no
//! kubelet and no real runner could reach the fake anyway.
//!
//! ```no_run
//! # async fn demo(client: kube::Client, fake_url: &str) -> Result<(), runner_simulator::SimulatorError> {
//! use runner_simulator::{Rule, Scenario, Simulator, SimulatorConfig};
//! let sim = Simulator::start(client, fake_url, SimulatorConfig::namespaced("ns"))?;
//! sim.add_rule(Rule::next(1, Scenario::oom_killed())); // the next runner pod OOMs mid-job
//! # Ok(()) }
//! ```
//!
//! For every pod that carries `ACTIONS_RUNNER_INPUT_JITCONFIG` (literal or
//! from a Secret), the simulator:
//!
//! 1. binds it to a node through `pods/binding`, as the scheduler would. A
//!    bound pod is not removed at once when deleted: it stays terminating
//!    until its kubelet confirms, which the simulator does with a grace-0
//!    delete once the runner has stopped. This is the window in which real
//!    controllers race runners, so the tests must have it;
//! 2. after the scenario's start delay, writes a Running status;
//! 3. plays the runner: presents the JIT config to the fake (which then
//!    treats the runner as online and may assign it a job), takes the job,
//!    runs it for its duration and reports it, or fails per the scenario;
//! 4. writes the runner container's terminated state and the pod phase;
//! 5. on deletion stops the runner (telling the fake it vanished if it was
//!    connected) and confirms the deletion, unless its node is "lost".

mod kubelet;
mod runner;
mod scenario;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::watcher;
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

pub use kubelet::{Exit, JIT_CONFIG_ENV};
pub use scenario::{Fate, PodSelector, Rule, Scenario};

use kubelet::EnvSource;
use runner::RunnerClient;
use scenario::Scenarios;

/// Something the simulator could not do.
#[derive(Debug, thiserror::Error)]
pub enum SimulatorError {
    /// The HTTP client for the fake could not be built.
    #[error("cannot build the HTTP client for the fake Actions service: {0}")]
    HttpClient(#[source] reqwest::Error),
    /// A call to the fake did not get an answer.
    #[error("the fake Actions service did not answer {call}: {source}")]
    Unreachable {
        /// The runner call.
        call: String,
        /// Why.
        #[source]
        source: reqwest::Error,
    },
    /// The fake answered a runner call with an error status.
    #[error("the fake Actions service refused {call} with HTTP {status}")]
    Refused {
        /// The runner call.
        call: String,
        /// The status.
        status: u16,
        /// Whether retrying makes sense (5xx, 429).
        transient: bool,
    },
    /// The fake answered something the simulator cannot read.
    #[error("the fake Actions service answered something unreadable: {0}")]
    BadAnswer(String),
    /// A Kubernetes API call failed.
    #[error("the Kubernetes API refused to {action}: {source}")]
    Kube {
        /// What the simulator was doing.
        action: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
}

impl SimulatorError {
    /// Whether the same call may succeed if tried again.
    fn is_transient(&self) -> bool {
        matches!(
            self,
            SimulatorError::Unreachable { .. }
                | SimulatorError::Refused {
                    transient: true,
                    ..
                }
        )
    }
}

fn kube_error(action: impl Into<String>) -> impl FnOnce(kube::Error) -> SimulatorError {
    let action = action.into();
    move |source| SimulatorError::Kube { action, source }
}

/// How the simulator runs.
#[derive(Debug, Clone)]
pub struct SimulatorConfig {
    /// The namespace to watch; `None` watches all.
    pub namespace: Option<String>,
    /// The node runner pods are bound to.
    pub node_name: String,
    /// The scenario of pods no rule matches.
    pub default_scenario: Scenario,
    /// Rules tried in order when a runner pod is first seen.
    pub rules: Vec<Rule>,
}

impl SimulatorConfig {
    /// Watches one namespace; every runner pod succeeds.
    pub fn namespaced(namespace: &str) -> SimulatorConfig {
        SimulatorConfig {
            namespace: Some(namespace.to_owned()),
            ..SimulatorConfig::default()
        }
    }
}

impl Default for SimulatorConfig {
    fn default() -> Self {
        SimulatorConfig {
            namespace: None,
            node_name: "simulated-node".to_owned(),
            default_scenario: Scenario::succeed(),
            rules: Vec::new(),
        }
    }
}

/// Where a simulated runner pod is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stage {
    /// Seen and bound, not running yet (start delay, or its Secret is missing).
    Pending,
    /// Running; the runner has not connected (or never will).
    Running,
    /// Connected to the fake, waiting for a job.
    Connected,
    /// Working on a job.
    Working {
        /// The job's `runnerRequestId`.
        job: u64,
    },
    /// The runner container ended.
    Exited {
        /// Its exit code.
        code: i32,
    },
    /// Its node is lost: nothing about it changes any more.
    NodeLost,
    /// Stopped because its pod was deleted; the deletion was confirmed.
    Deleted,
    /// The simulator could not play it; the message says why.
    Broken(String),
}

/// A step the simulator took for a runner pod, kept so that a test can wait
/// for the step that proves something did *not* happen (a runner that did
/// not connect, a deletion that was not confirmed) instead of sleeping and
/// hoping the simulator got there, and can read when the pod was bound and
/// started rather than sample its phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Bound to its node (or found bound already).
    Bound,
    /// Its init containers started (a scenario with an init delay).
    Initialising,
    /// Its Running status was written, after the scenario's start delay.
    Started,
    /// Its runner reached the point where a real runner presents its JIT
    /// config, and per its scenario did not: the fake never hears of it.
    DeclinedToConnect,
    /// Its deletion was seen while its node is lost, and deliberately left
    /// unconfirmed, as an unreachable kubelet leaves it.
    DeletionUnanswered,
    /// Its container hooks made the job's pod and Secret.
    HookObjectsCreated,
    /// Its container hooks deleted them again at the end of the job, as
    /// their cleanup step does when the job ends normally.
    HookObjectsCleaned,
}

/// One runner pod the simulator has played.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerRecord {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The pod's uid (names are reused when a pod is recreated).
    pub uid: String,
    /// The runner's name from its JIT config, once read.
    pub runner_name: Option<String>,
    /// The scenario it was given.
    pub scenario: Scenario,
    /// Where it is.
    pub stage: Stage,
    /// The jobs it took.
    pub jobs: Vec<u64>,
    /// The service its runner talked to, from its JIT config.
    pub service_url: Option<String>,
    /// The proxy its runner's calls went through (from the pod's
    /// `http_proxy` or `https_proxy`, credentials left out), if any.
    pub proxy: Option<String>,
    /// The pods and Secrets its container hooks made (kubernetes mode).
    pub hook_objects: Vec<String>,
    /// The steps taken for it, in order, with when each was taken.
    pub trace: Vec<(Instant, Step)>,
}

impl RunnerRecord {
    /// When `step` was first taken, if it was.
    pub fn when(&self, step: Step) -> Option<Instant> {
        self.trace
            .iter()
            .find_map(|&(at, s)| (s == step).then_some(at))
    }
}

struct Inner {
    client: kube::Client,
    runner: RunnerClient,
    node_name: String,
    scenarios: Mutex<Scenarios>,
    records: Mutex<Vec<RunnerRecord>>,
    changes: watch::Sender<u64>,
    next_ip: AtomicU32,
}

impl Inner {
    fn update(&self, uid: &str, f: impl FnOnce(&mut RunnerRecord)) {
        {
            let mut records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(record) = records.iter_mut().find(|r| r.uid == uid) {
                f(record);
            }
        }
        self.changes.send_modify(|v| *v = v.wrapping_add(1));
    }
}

/// A running simulator; stops when dropped.
pub struct Simulator {
    inner: Arc<Inner>,
    shutdown: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Simulator {
    /// Starts watching pods in the background of the current runtime.
    /// `fake_url` is the fake's root URL, where runners connect.
    pub fn start(
        client: kube::Client,
        fake_url: &str,
        config: SimulatorConfig,
    ) -> Result<Simulator, SimulatorError> {
        let SimulatorConfig {
            namespace,
            node_name,
            default_scenario,
            rules,
        } = config;
        let inner = Arc::new(Inner {
            client,
            runner: RunnerClient::new(fake_url)?,
            node_name,
            scenarios: Mutex::new(Scenarios {
                default: default_scenario,
                rules,
            }),
            records: Mutex::new(Vec::new()),
            changes: watch::Sender::new(0),
            next_ip: AtomicU32::new(1),
        });
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(watch_pods(inner.clone(), namespace, shutdown.clone()));
        Ok(Simulator {
            inner,
            shutdown,
            task: Some(task),
        })
    }

    /// Sets the scenario of pods no rule matches, from now on.
    pub fn set_default_scenario(&self, scenario: Scenario) {
        self.inner
            .scenarios
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .default = scenario;
    }

    /// Adds a rule after the existing ones.
    pub fn add_rule(&self, rule: Rule) {
        self.inner
            .scenarios
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .rules
            .push(rule);
    }

    /// Removes every rule.
    pub fn clear_rules(&self) {
        self.inner
            .scenarios
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .rules
            .clear();
    }

    /// Every runner pod seen so far, in the order seen.
    pub fn runners(&self) -> Vec<RunnerRecord> {
        self.inner
            .records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Waits until `done` holds for the records, for at most `timeout`;
    /// returns the last records seen either way.
    pub async fn wait_until(
        &self,
        timeout: Duration,
        mut done: impl FnMut(&[RunnerRecord]) -> bool,
    ) -> Result<Vec<RunnerRecord>, Vec<RunnerRecord>> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let mut changes = self.inner.changes.subscribe();
            let records = self.runners();
            if done(&records) {
                return Ok(records);
            }
            tokio::select! {
                _ = changes.changed() => {}
                () = tokio::time::sleep_until(deadline) => return Err(records),
            }
        }
    }

    /// Stops watching and abandons every pod in play.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Simulator {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// A pod in play: the signals its task waits on.
struct Tracked {
    terminating: CancellationToken,
    gone: CancellationToken,
}

/// The watch loop: starts a task per new runner pod and forwards deletions.
async fn watch_pods(inner: Arc<Inner>, namespace: Option<String>, shutdown: CancellationToken) {
    let api: Api<Pod> = match &namespace {
        Some(ns) => Api::namespaced(inner.client.clone(), ns),
        None => Api::all(inner.client.clone()),
    };
    // The server ends a quiet watch after 20 s, below a client's read
    // timeout, so a watch that hangs on an API server starting again is
    // the only kind that times out, and it is retried.
    let stream = watcher::watcher(api, watcher::Config::default().timeout(20));
    let mut stream = std::pin::pin!(stream);
    let mut tracked: HashMap<String, Tracked> = HashMap::new();
    // Pods listed since the watch restarted: a pod deleted while the watch
    // was down gets no Delete event, so after a re-list every tracked pod
    // not listed is treated as gone.
    let mut relisted: Option<HashSet<String>> = None;
    let mut tasks = JoinSet::new();
    loop {
        let event = tokio::select! {
            () = shutdown.cancelled() => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
            event = stream.next() => event,
        };
        match event {
            Some(Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod))) => {
                let Some(uid) = pod.metadata.uid.clone() else {
                    continue;
                };
                if let Some(seen) = &mut relisted {
                    seen.insert(uid.clone());
                }
                if let Some(known) = tracked.get(&uid) {
                    if pod.metadata.deletion_timestamp.is_some() {
                        known.terminating.cancel();
                    }
                    continue;
                }
                let Some((container, source)) = kubelet::runner_container(&pod) else {
                    continue;
                };
                let entry = Tracked {
                    terminating: CancellationToken::new(),
                    gone: CancellationToken::new(),
                };
                if pod.metadata.deletion_timestamp.is_some() {
                    entry.terminating.cancel();
                }
                let task = PodTask::new(&inner, pod, uid.clone(), container, source, &entry);
                tracked.insert(uid, entry);
                tasks.spawn(task.run());
            }
            Some(Ok(watcher::Event::Delete(pod))) => {
                if let Some(uid) = &pod.metadata.uid
                    && let Some(gone) = tracked.remove(uid)
                {
                    gone.terminating.cancel();
                    gone.gone.cancel();
                }
            }
            Some(Ok(watcher::Event::Init)) => relisted = Some(HashSet::new()),
            Some(Ok(watcher::Event::InitDone)) => {
                if let Some(seen) = relisted.take() {
                    tracked.retain(|uid, entry| {
                        let listed = seen.contains(uid);
                        if !listed {
                            entry.terminating.cancel();
                            entry.gone.cancel();
                        }
                        listed
                    });
                }
            }
            Some(Err(error)) => {
                tracing::warn!(%error, "watching pods failed; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            None => break,
        }
    }
    tasks.abort_all();
}

/// Waits `delay`; `false` if the pod began terminating meanwhile.
async fn pause(delay: Duration, terminating: &CancellationToken) -> bool {
    tokio::select! {
        () = tokio::time::sleep(delay) => true,
        () = terminating.cancelled() => false,
    }
}

/// How long a crashing or outdated runner runs before it exits.
const CRASH_AFTER: Duration = Duration::from_millis(200);
/// How long to wait before retrying a transient failure.
const RETRY_AFTER: Duration = Duration::from_millis(200);
/// How long an API server call is retried while the server cannot be
/// reached or answers 5xx or 429, before the pod's simulation fails.
const API_RETRY_FOR: Duration = Duration::from_secs(300);

/// Runs an API server call until it is answered, as a kubelet does: while
/// the server cannot be reached (restarted, partitioned) or answers 5xx or
/// 429, the call is tried again, for up to [`API_RETRY_FOR`]. Without it a
/// pod whose status write met an API server restart stopped being played,
/// and its runner never started.
async fn answered<T, F, Fut>(mut call: F) -> Result<T, kube::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let deadline = tokio::time::Instant::now() + API_RETRY_FOR;
    loop {
        match call().await {
            Err(error) if unanswered(&error) && tokio::time::Instant::now() < deadline => {
                tracing::debug!(%error, "retrying an API server call");
                tokio::time::sleep(RETRY_AFTER).await;
            }
            result => return result,
        }
    }
}

/// Whether `error` says the server did not really answer the call.
fn unanswered(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => status.code >= 500 || status.code == 429,
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::HttpError(_) => true,
        _ => false,
    }
}

/// One runner pod's life, from binding to confirmed deletion.
struct PodTask {
    inner: Arc<Inner>,
    pods: Api<Pod>,
    pod: Pod,
    uid: String,
    name: String,
    container: String,
    source: EnvSource,
    scenario: Scenario,
    terminating: CancellationToken,
    gone: CancellationToken,
}

/// How the runner part ended.
enum Ending {
    /// The container exited.
    Exited(Exit),
    /// The pod is being deleted; `connected` says whether the fake knows the runner.
    Terminating { jit: Option<String> },
    /// The node went away with the runner on it.
    NodeLost { jit: Option<String> },
}

impl PodTask {
    fn new(
        inner: &Arc<Inner>,
        pod: Pod,
        uid: String,
        container: String,
        source: EnvSource,
        tracked: &Tracked,
    ) -> PodTask {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        let scenario = inner
            .scenarios
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .choose(&name, &labels);
        inner
            .records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(RunnerRecord {
                namespace: namespace.clone(),
                pod: name.clone(),
                uid: uid.clone(),
                runner_name: None,
                scenario,
                stage: Stage::Pending,
                jobs: Vec::new(),
                service_url: None,
                proxy: None,
                hook_objects: Vec::new(),
                trace: Vec::new(),
            });
        inner.changes.send_modify(|v| *v = v.wrapping_add(1));
        PodTask {
            inner: inner.clone(),
            pods: Api::namespaced(inner.client.clone(), &namespace),
            pod,
            uid,
            name,
            container,
            source,
            scenario,
            terminating: tracked.terminating.clone(),
            gone: tracked.gone.clone(),
        }
    }

    fn stage(&self, stage: Stage) {
        self.inner.update(&self.uid, |r| r.stage = stage);
    }

    fn record(&self, step: Step) {
        let at = Instant::now();
        self.inner.update(&self.uid, |r| r.trace.push((at, step)));
    }

    async fn run(self) {
        if let Err(error) = self.drive().await {
            tracing::warn!(pod = %self.name, %error, "simulating the runner pod failed");
            self.stage(Stage::Broken(error.to_string()));
        }
    }

    async fn drive(&self) -> Result<(), SimulatorError> {
        let node = if self.scenario.fate == Fate::NodeLost {
            // A node of its own, so losing it affects no other pod.
            let node = format!("{}-lost-{}", self.inner.node_name, short(&self.uid));
            self.ensure_node(&node).await;
            node
        } else {
            self.inner.node_name.clone()
        };
        if self
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .is_none()
        {
            self.bind(&node).await?;
        }
        self.record(Step::Bound);
        if kubelet::is_terminal(&self.pod) {
            return self.await_deletion().await;
        }
        if !pause(self.scenario.start_delay, &self.terminating).await {
            return self.deleted_before_start(&node).await;
        }
        if !self.scenario.init_delay.is_zero() {
            self.patch_status(kubelet::initialising_status(&self.pod, &now()))
                .await?;
            self.record(Step::Initialising);
            if !pause(self.scenario.init_delay, &self.terminating).await {
                return self.deleted_before_start(&node).await;
            }
        }
        let Some(jit) = self.jit_config().await? else {
            return self.deleted_before_start(&node).await;
        };
        // A runner talks to the service its JIT config names.
        let mut service_url = None;
        if let Ok(config) = fake_actions::JitConfig::decode(&jit) {
            service_url = Some(config.service_url.clone());
            self.inner.update(&self.uid, |r| {
                r.runner_name = Some(config.runner_name);
                r.service_url = Some(config.service_url);
            });
        }
        let started = now();
        let n = self.inner.next_ip.fetch_add(1, Ordering::Relaxed);
        let pod_ip = format!("10.244.{}.{}", (n / 250) % 250, n % 250 + 2);
        self.patch_status(kubelet::running_status(
            &self.pod, "10.0.0.2", &pod_ip, &started,
        ))
        .await?;
        self.record(Step::Started);
        self.stage(Stage::Running);
        let Some(runner) = self.runner_client(service_url).await? else {
            return self.confirm_deletion().await;
        };

        match self.play(&runner, jit).await? {
            Ending::Exited(exit) => {
                self.patch_status(kubelet::exited_status(
                    &self.pod,
                    &self.container,
                    &exit,
                    &started,
                    &now(),
                ))
                .await?;
                self.stage(Stage::Exited { code: exit.code });
                self.await_deletion().await
            }
            Ending::Terminating { jit } => {
                if let Some(jit) = jit {
                    self.tell_vanished(&jit).await;
                }
                self.confirm_deletion().await
            }
            Ending::NodeLost { jit } => {
                if let Some(jit) = jit {
                    self.tell_vanished(&jit).await;
                }
                self.stay_lost(&node).await;
                Ok(())
            }
        }
    }

    /// The pod was deleted before its runner started: confirmed at once,
    /// unless its node is the one that gets lost.
    async fn deleted_before_start(&self, node: &str) -> Result<(), SimulatorError> {
        if self.scenario.fate != Fate::NodeLost {
            return self.confirm_deletion().await;
        }
        self.stay_lost(node).await;
        Ok(())
    }

    /// Loses the node, then never confirms the pod's deletion: it stays
    /// terminating until someone force-deletes it.
    async fn stay_lost(&self, node: &str) {
        self.lose_node(node).await;
        self.stage(Stage::NodeLost);
        tokio::select! {
            // A pod removed outright was never left unanswered.
            biased;
            () = self.gone.cancelled() => return,
            () = self.terminating.cancelled() => self.record(Step::DeletionUnanswered),
        }
        self.gone.cancelled().await;
    }

    /// The runner process, per the scenario.
    async fn play(&self, runner: &RunnerClient, jit: String) -> Result<Ending, SimulatorError> {
        let terminating = || match self.scenario.fate {
            Fate::NodeLost => Ending::NodeLost { jit: None },
            _ => Ending::Terminating { jit: None },
        };
        match self.scenario.fate {
            Fate::NeverRegisters => {
                self.record(Step::DeclinedToConnect);
                self.terminating.cancelled().await;
                return Ok(terminating());
            }
            Fate::Fail | Fate::Outdated => {
                if !pause(CRASH_AFTER, &self.terminating).await {
                    return Ok(terminating());
                }
                let code = if self.scenario.fate == Fate::Fail {
                    1
                } else {
                    7
                };
                return Ok(Ending::Exited(Exit::error(code)));
            }
            Fate::Succeed | Fate::OomKilled | Fate::NodeLost => {}
        }

        let connected = self.retrying(|| runner.connect(&jit)).await?;
        match connected {
            None => return Ok(terminating()),
            // The registration is gone: the runner cannot start.
            Some(false) => return Ok(Ending::Exited(Exit::error(1))),
            Some(true) => {}
        }
        self.stage(Stage::Connected);
        let with_jit = |ending: Ending| match ending {
            Ending::Terminating { .. } => Ending::Terminating {
                jit: Some(jit.clone()),
            },
            Ending::NodeLost { .. } => Ending::NodeLost {
                jit: Some(jit.clone()),
            },
            exited => exited,
        };

        let job = loop {
            match self.retrying(|| runner.next_job(&jit)).await? {
                None => return Ok(with_jit(terminating())),
                Some(Ok(Some(job))) => break job,
                Some(Ok(None)) => {}
                // Removed while idle (scaled down): the runner exits cleanly.
                Some(Err(())) => return Ok(Ending::Exited(Exit::OK)),
            }
        };
        self.inner.update(&self.uid, |r| {
            r.jobs.push(job.runner_request_id);
            r.stage = Stage::Working {
                job: job.runner_request_id,
            };
        });
        let duration = Duration::from_millis(job.duration_ms);
        let hooks = self.prepare_job(job.runner_request_id).await?;
        match self.scenario.fate {
            Fate::NodeLost => Ok(Ending::NodeLost {
                jit: Some(jit.clone()),
            }),
            Fate::OomKilled => {
                if !pause(duration / 2, &self.terminating).await {
                    return Ok(with_jit(terminating()));
                }
                self.tell_vanished(&jit).await;
                Ok(Ending::Exited(Exit::OOM_KILLED))
            }
            _ => {
                if !pause(duration, &self.terminating).await {
                    return Ok(with_jit(terminating()));
                }
                self.cleanup_job(&hooks).await?;
                match self.retrying(|| runner.complete(&jit)).await? {
                    None => Ok(with_jit(terminating())),
                    Some(()) => Ok(Ending::Exited(Exit::OK)),
                }
            }
        }
    }

    /// Runs a runner call until it succeeds, fails for good, or the pod
    /// starts terminating (`None`), as the runner retries its service calls.
    async fn retrying<T, F, Fut>(&self, mut call: F) -> Result<Option<T>, SimulatorError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, SimulatorError>>,
    {
        loop {
            let result = tokio::select! {
                () = self.terminating.cancelled() => return Ok(None),
                result = call() => result,
            };
            match result {
                Ok(value) => return Ok(Some(value)),
                Err(error) if error.is_transient() => {
                    tracing::debug!(pod = %self.name, %error, "retrying a runner call");
                    if !pause(RETRY_AFTER, &self.terminating).await {
                        return Ok(None);
                    }
                }
                Err(error) => return Err(error),
            }
        }
    }

    async fn tell_vanished(&self, jit: &str) {
        // Best effort: a runner that dies tells nobody; the fake's
        // bookkeeping is what needs this, and it tolerates a miss.
        for _ in 0..10 {
            match self.inner.runner.vanished(jit).await {
                Err(error) if error.is_transient() => tokio::time::sleep(RETRY_AFTER).await,
                Err(error) => {
                    tracing::debug!(pod = %self.name, %error, "reporting the runner gone");
                    return;
                }
                Ok(()) => return,
            }
        }
    }

    /// The JIT config: the literal, or the Secret's key; `None` if the pod
    /// is deleted before it can be read.
    async fn jit_config(&self) -> Result<Option<String>, SimulatorError> {
        let source = self.source.clone();
        self.resolve(&source).await
    }

    /// The value of a variable of the runner container, read as the
    /// kubelet reads it: the literal, or the Secret's key. A missing Secret
    /// is reported on the pod as the kubelet does and looked for again
    /// until it appears; `None` if the pod is deleted meanwhile.
    async fn resolve(&self, source: &EnvSource) -> Result<Option<String>, SimulatorError> {
        let (name, key) = match source {
            EnvSource::Literal(value) => return Ok(Some(value.clone())),
            EnvSource::Secret { name, key } => (name, key),
        };
        let secrets: Api<Secret> = Api::namespaced(
            self.inner.client.clone(),
            self.pod.metadata.namespace.as_deref().unwrap_or_default(),
        );
        let mut reported = false;
        loop {
            let found = answered(|| secrets.get_opt(name))
                .await
                .map_err(kube_error(format!("read Secret {name}")))?;
            if let Some(value) = found
                .and_then(|s| s.data)
                .and_then(|data| data.get(key).cloned())
                .and_then(|bytes| String::from_utf8(bytes.0).ok())
            {
                return Ok(Some(value));
            }
            if !reported {
                let message = format!("secret {name:?} or its key {key:?} not found");
                self.patch_status(kubelet::config_error_status(
                    &self.pod,
                    &self.container,
                    &message,
                    &now(),
                ))
                .await?;
                reported = true;
            }
            if !pause(Duration::from_millis(500), &self.terminating).await {
                return Ok(None);
            }
        }
    }

    /// The runner container's variable `name`, resolved; `Ok(None)` when it
    /// has none, `Err(None)` when the pod was deleted while reading it.
    async fn env(&self, name: &str) -> Result<Result<Option<String>, ()>, SimulatorError> {
        let Some(source) = kubelet::container(&self.pod, &self.container)
            .and_then(|c| kubelet::env_source(c, name))
        else {
            return Ok(Ok(None));
        };
        Ok(self.resolve(&source).await?.map(Some).ok_or(()))
    }

    /// The client the runner talks to the service with, at `service_url`
    /// (the fake's own address when the JIT config names none): through
    /// the proxy the pod's environment names for the service's scheme
    /// (`http_proxy` or `https_proxy`, credentials and all), unless
    /// `no_proxy` names the service's host, and trusting the CA file
    /// `NODE_EXTRA_CA_CERTS` names, read from the ConfigMap mounted there,
    /// as the runner's own HTTP stack does. `None` if the pod was deleted
    /// meanwhile.
    async fn runner_client(
        &self,
        service_url: Option<String>,
    ) -> Result<Option<RunnerClient>, SimulatorError> {
        let base = service_url.unwrap_or_else(|| self.inner.runner.base().to_owned());
        let variable = if base.starts_with("https:") {
            "https_proxy"
        } else {
            "http_proxy"
        };
        let Ok(proxy) = self.env(variable).await? else {
            return Ok(None);
        };
        let Ok(no_proxy) = self.env("no_proxy").await? else {
            return Ok(None);
        };
        let Ok(ca_file) = self.env("NODE_EXTRA_CA_CERTS").await? else {
            return Ok(None);
        };
        let host = reqwest::Url::parse(&base)
            .ok()
            .and_then(|u| u.host_str().map(str::to_owned))
            .unwrap_or_default();
        let bypassed = no_proxy
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .any(|entry| !entry.is_empty() && (entry == "*" || entry == host));
        let proxy = proxy.filter(|p| !p.is_empty() && !bypassed);
        let ca = match ca_file {
            Some(path) => Some(self.mounted_config_map_file(&path).await?),
            None => None,
        };
        if let Some(proxy) = &proxy {
            let shown = reqwest::Url::parse(proxy).map_or_else(
                |_| "<unreadable>".to_owned(),
                |mut url| {
                    let _ = url.set_username("");
                    let _ = url.set_password(None);
                    url.to_string()
                },
            );
            self.inner.update(&self.uid, |r| r.proxy = Some(shown));
        }
        if proxy.is_none() && ca.is_none() && base == self.inner.runner.base() {
            // The plain case, shared: a fleet of pods needs no client each.
            return Ok(Some(self.inner.runner.clone()));
        }
        RunnerClient::configured(&base, proxy.as_deref(), ca.as_deref().map(str::as_bytes))
            .map(Some)
    }

    /// The file at `path` in the runner container, where a ConfigMap's
    /// key is mounted (with a `subPath`, or in a directory), read from the
    /// ConfigMap as the kubelet would project it.
    async fn mounted_config_map_file(&self, path: &str) -> Result<String, SimulatorError> {
        let unreadable = |why: String| SimulatorError::BadAnswer(format!("{path}: {why}"));
        let spec = self
            .pod
            .spec
            .as_ref()
            .ok_or_else(|| unreadable("no spec".into()))?;
        let container = kubelet::container(&self.pod, &self.container)
            .ok_or_else(|| unreadable("no runner container".into()))?;
        let (mount, file) = container
            .volume_mounts
            .iter()
            .flatten()
            .find_map(|m| {
                if m.mount_path == path {
                    Some((m, m.sub_path.clone().unwrap_or_default()))
                } else {
                    let dir = m.mount_path.trim_end_matches('/');
                    let rest = path.strip_prefix(dir)?.strip_prefix('/')?;
                    Some((m, rest.to_owned()))
                }
            })
            .ok_or_else(|| unreadable("no volume is mounted there".into()))?;
        let source = spec
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == mount.name)
            .and_then(|v| v.config_map.as_ref())
            .ok_or_else(|| unreadable(format!("volume {} is no ConfigMap", mount.name)))?;
        let key = source
            .items
            .iter()
            .flatten()
            .find(|item| item.path == file)
            .map_or(file.clone(), |item| item.key.clone());
        let maps: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(
            self.inner.client.clone(),
            self.pod.metadata.namespace.as_deref().unwrap_or_default(),
        );
        let map = answered(|| maps.get(&source.name))
            .await
            .map_err(kube_error(format!("read ConfigMap {}", source.name)))?;
        map.data
            .and_then(|data| data.get(&key).cloned())
            .ok_or_else(|| unreadable(format!("ConfigMap {} has no key {key}", source.name)))
    }

    /// What the runner container hooks' prepare step does in kubernetes
    /// mode (`ACTIONS_RUNNER_CONTAINER_HOOKS` set): a pod for the job's
    /// containers and a Secret of its environment, labelled
    /// `runner-pod=<runner pod>`. The job pod is no runner pod, so the
    /// simulator does not play it; it stays Pending, which is all a
    /// controller sees of it.
    async fn prepare_job(&self, job: u64) -> Result<Vec<(bool, String)>, SimulatorError> {
        let Some(runner) = kubelet::container(&self.pod, &self.container) else {
            return Ok(Vec::new());
        };
        if kubelet::env_source(runner, "ACTIONS_RUNNER_CONTAINER_HOOKS").is_none() {
            return Ok(Vec::new());
        }
        let namespace = self.pod.metadata.namespace.clone().unwrap_or_default();
        let name = format!("{}-workflow-{job}", self.name);
        let labels = json!({"runner-pod": self.name});
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "job", "image": "ubuntu:24.04"}],
            },
        }))
        .map_err(|e| SimulatorError::BadAnswer(e.to_string()))?;
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": format!("{name}-env"), "labels": labels},
            "stringData": {"GITHUB_JOB": job.to_string()},
        }))
        .map_err(|e| SimulatorError::BadAnswer(e.to_string()))?;
        let secrets: Api<Secret> = Api::namespaced(self.inner.client.clone(), &namespace);
        let params = PostParams::default();
        // A create retried after an unanswered one may find its own work.
        let made_already = |e: &kube::Error| matches!(e, kube::Error::Api(e) if e.code == 409);
        match answered(|| self.pods.create(&params, &pod)).await {
            Err(e) if !made_already(&e) => {
                return Err(kube_error(format!("create the job pod {name}"))(e));
            }
            _ => {}
        }
        match answered(|| secrets.create(&params, &secret)).await {
            Err(e) if !made_already(&e) => {
                return Err(kube_error(format!("create the job Secret {name}-env"))(e));
            }
            _ => {}
        }
        let made = vec![(true, name.clone()), (false, format!("{name}-env"))];
        self.inner.update(&self.uid, |r| {
            r.hook_objects.extend(made.iter().map(|(_, n)| n.clone()));
        });
        self.record(Step::HookObjectsCreated);
        Ok(made)
    }

    /// The hooks' cleanup step at a job's normal end: what prepare made,
    /// deleted, unless the scenario's hooks leave them. A runner that dies
    /// mid-job never gets here either; what is left is its controller's to
    /// remove.
    async fn cleanup_job(&self, made: &[(bool, String)]) -> Result<(), SimulatorError> {
        if made.is_empty() || !self.scenario.hooks_clean_up {
            return Ok(());
        }
        let namespace = self.pod.metadata.namespace.clone().unwrap_or_default();
        let secrets: Api<Secret> = Api::namespaced(self.inner.client.clone(), &namespace);
        let params = DeleteParams::default();
        for (is_pod, name) in made {
            let result = if *is_pod {
                answered(|| self.pods.delete(name, &params)).await.map(drop)
            } else {
                answered(|| secrets.delete(name, &params)).await.map(drop)
            };
            match result {
                Ok(()) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(kube_error(format!("delete {name}"))(e)),
            }
        }
        self.record(Step::HookObjectsCleaned);
        Ok(())
    }

    async fn bind(&self, node: &str) -> Result<(), SimulatorError> {
        let binding = json!({
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": self.name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        });
        let params = PostParams::default();
        answered(|| {
            self.pods.create_subresource::<_, serde_json::Value>(
                "binding", &self.name, &params, &binding,
            )
        })
        .await
        .map(drop)
        .map_err(kube_error(format!("bind pod {} to {node}", self.name)))
    }

    async fn patch_status(&self, status: serde_json::Value) -> Result<(), SimulatorError> {
        let (params, patch) = (PatchParams::default(), Patch::Merge(status));
        match answered(|| self.pods.patch_status(&self.name, &params, &patch)).await {
            Ok(_) => Ok(()),
            // Deleted under us: nothing left to report on.
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(source) => Err(SimulatorError::Kube {
                action: format!("write the status of pod {}", self.name),
                source,
            }),
        }
    }

    /// Waits for the deletion to begin, then confirms it.
    async fn await_deletion(&self) -> Result<(), SimulatorError> {
        tokio::select! {
            () = self.terminating.cancelled() => self.confirm_deletion().await,
            () = self.gone.cancelled() => Ok(()),
        }
    }

    /// The kubelet's last word: the pod is deleted with grace 0, for this
    /// pod's uid only (a recreated pod of the same name is left alone).
    async fn confirm_deletion(&self) -> Result<(), SimulatorError> {
        if !self.terminating.is_cancelled() {
            tokio::select! {
                () = self.terminating.cancelled() => {}
                () = self.gone.cancelled() => return Ok(()),
            }
        }
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(self.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match answered(|| self.pods.delete(&self.name, &params)).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
            Err(source) => {
                return Err(SimulatorError::Kube {
                    action: format!("confirm the deletion of pod {}", self.name),
                    source,
                });
            }
        }
        self.stage(Stage::Deleted);
        Ok(())
    }

    /// Creates a Ready node object for a pod that will lose it. Best effort:
    /// binding does not need the Node to exist; it only makes the loss
    /// visible to a controller that looks.
    async fn ensure_node(&self, node: &str) {
        let nodes: Api<Node> = Api::all(self.inner.client.clone());
        let object: Node = match serde_json::from_value(json!({
            "metadata": {"name": node, "labels": {"arcwright.dev/simulated": "true"}},
        })) {
            Ok(object) => object,
            Err(_) => return,
        };
        if let Err(error) = nodes.create(&PostParams::default(), &object).await {
            tracing::debug!(%node, %error, "creating the simulated node");
        }
        let ready = json!({"status": {"conditions": [{
            "type": "Ready", "status": "True", "reason": "KubeletReady",
            "lastHeartbeatTime": now(), "lastTransitionTime": now(),
        }]}});
        let _ = nodes
            .patch_status(node, &PatchParams::default(), &Patch::Merge(ready))
            .await;
    }

    /// Marks the node unreachable, as the node controller does when a
    /// kubelet stops posting status.
    async fn lose_node(&self, node: &str) {
        let nodes: Api<Node> = Api::all(self.inner.client.clone());
        let lost = json!({"status": {"conditions": [{
            "type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
            "message": "Kubelet stopped posting node status.",
            "lastHeartbeatTime": now(), "lastTransitionTime": now(),
        }]}});
        if let Err(error) = nodes
            .patch_status(node, &PatchParams::default(), &Patch::Merge(lost))
            .await
        {
            tracing::debug!(%node, %error, "marking the simulated node lost");
        }
    }
}

fn now() -> String {
    jiff::Timestamp::now()
        .round(jiff::Unit::Second)
        .unwrap_or_else(|_| jiff::Timestamp::now())
        .to_string()
}

fn short(uid: &str) -> String {
    uid.chars().take(8).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transient_errors_are_the_retryable_ones() {
        let refused = |status, transient| SimulatorError::Refused {
            call: "job".into(),
            status,
            transient,
        };
        assert!(refused(503, true).is_transient());
        assert!(!refused(400, false).is_transient());
        assert!(!SimulatorError::BadAnswer("x".into()).is_transient());
    }

    #[test]
    fn timestamps_are_whole_seconds_as_the_api_stores_them() {
        let t = now();
        assert!(t.ends_with('Z') && !t.contains('.'), "{t}");
    }
}
