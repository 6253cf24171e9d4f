//! The floor of the scale benchmark: the least a controller can do to run
//! a job on a runner of its own, on the same stack, so that arcwright's
//! throughput can be read against it rather than against nothing.
//!
//! After arcwright's run, with arcwright's host stopped (so that nothing
//! else can take the jobs), the floor runs a loop of its own on the same
//! control plane, the same fake Actions service and the same simulator,
//! for the same N jobs of the same durations, arriving the same way, on a
//! scale set of its own (`floor`, also the jobs' only label) with the same
//! at most M runners. What a job irreducibly needs, and so what the floor
//! does for each job:
//!
//! 1. **An offer taken.** The jobs arrive as messages on the scale set's
//!    message session: one long poll delivers many, one acknowledgement
//!    (delete) per message, one `acquirejobs` per message that offered
//!    any. Without acquiring, the service assigns the job to no one.
//! 2. **A registration** (`generatejitconfig`): one Actions call per job.
//!    An ephemeral runner runs one job and deregisters itself, so every
//!    job needs a registration of its own, and it is the only per-job
//!    Actions call.
//! 3. **A Secret** holding the JIT config: the config is the runner's
//!    credential, and a pod spec is readable by whoever can list pods, so
//!    it is never written into the spec.
//! 4. **A pod** whose runner container reads `ACTIONS_RUNNER_INPUT_JITCONFIG`
//!    from that Secret (`secretKeyRef`), as arcwright's runner pods do:
//!    the runner that takes the job.
//! 5. **Both deleted** once the pod has ended (phase `Succeeded`, which the
//!    simulator writes when its runner finished the job): a pod and a
//!    Secret left behind per job would grow without bound. The runner
//!    removed its own registration on finishing, so no Actions call.
//!
//! That is four API server writes and one Actions call per job, plus the
//! polls, acknowledgements and acquisitions a message of up to 50 job
//! events shares, and a watch of the pods.
//!
//! What the floor deliberately does not do, and arcwright does: no
//! custom resources (no AutoscalingRunnerSet, EphemeralRunnerSet or
//! EphemeralRunner objects, their statuses or finalizers), no scaling
//! policy (a runner per acquired job, at most M at once), no job records,
//! no renewal of a runner for a next job, no batch window between polls,
//! no reads from the API server (the watch alone tells it a pod ended),
//! no retries of API server writes, no recovery of any kind: a runner
//! that fails, a pod that never starts, an Actions outage or a host
//! restart fail the run instead. It is the throughput of the work itself
//! on this stack, not a controller anyone could run.
//!
//! The floor makes its API server requests as the host's ServiceAccount
//! (the host is stopped by then), so the audit log counts them exactly as
//! it counts the host's; its Actions calls are the fake's counters over the
//! same window, as for the host.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use arcwright::actions::{
    ActionsClient, ClientOptions, ConfigUrl, Credentials, JitRunnerSetting, JobMessage,
    MessageSession, RunnerScaleSet, Secret as ActionsSecret,
};
use fake_actions::Endpoint;
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use serde_json::json;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::bench::{Arrival, enqueue};
use crate::stats::{intervals, percentile};
use crate::timeline::Recorder;
use crate::{ScaleSet, Stack};

/// The floor's scale set in the fake, and its jobs' only label: not one
/// arcwright manages.
pub const SET: &str = "floor";

/// The label on the floor's pods and Secrets, and its value.
const LABEL: (&str, &str) = ("arcwright-stack/floor", "runner");

/// The Secret key the JIT config is under (the key arcwright's Secrets use).
const JIT_KEY: &str = "jitToken";

/// The runner group every scale set of the stack is in.
const RUNNER_GROUP: &str = "Default";

/// The owner of the floor's message session.
const OWNER: &str = "arcwright-stack-floor";

/// What one floor run did and measured.
#[derive(Debug, Clone)]
pub struct FloorReport {
    /// Jobs that succeeded while the floor ran (its own).
    pub jobs: u64,
    /// The first job enqueued to the last succeeded.
    pub wall: Duration,
    /// Runner pods the floor created.
    pub runners: u64,
    /// Wait from enqueued to started, 50th percentile.
    pub p50_wait: Duration,
    /// The same, 95th percentile.
    pub p95_wait: Duration,
    /// Actions calls by endpoint, from the first job enqueued to the last
    /// pod gone (the runners' own endpoints left out).
    pub actions_calls: Vec<(Endpoint, u64)>,
    /// Its API server requests over the same window, from the audit log;
    /// `None` when the stack has none.
    pub apiserver: Option<crate::audit::Requests>,
}

/// Runs the floor on `stack` (whose host must be stopped, or at least not
/// serve a scale set labelled [`SET`]): jobs of `durations`, arriving per
/// `arrival`, on at most `max_runners` runners at once. Fails when the jobs
/// do not all succeed within `bound`, or a runner fails.
pub async fn run(
    stack: &Stack,
    max_runners: u32,
    durations: &[u64],
    arrival: Arrival,
    bound: Duration,
    progress: &dyn Fn(&str),
) -> Result<FloorReport> {
    if max_runners == 0 {
        bail!("the floor needs at least one runner");
    }
    let client = floor_client(stack).await?;
    let actions = ActionsClient::new(
        ConfigUrl::parse(&stack.fake().org_url("octo"))?,
        Credentials::Token(ActionsSecret::new(stack.fake().pat())),
        ClientOptions {
            allow_plain_http: true,
            ..ClientOptions::default()
        },
    )?;
    // Set-up, as arcwright's before its burst: not counted.
    let group = actions.get_runner_group_by_name(RUNNER_GROUP).await?;
    let set = match actions.get_runner_scale_set(group.id, SET).await? {
        Some(set) => set,
        None => {
            actions
                .create_runner_scale_set(&RunnerScaleSet::new(SET, group.id, &[]))
                .await?
        }
    };
    let session = actions.create_message_session(set.id, OWNER).await?;

    let control = stack.fake().control();
    let succeeded_before = control.ledger().jobs_succeeded;
    let jobs = u64::try_from(durations.len())?;
    let recorder = Recorder::start(control.clone(), stack.client(), stack.namespace());
    let calls_before = stack.host_actions_calls_by_endpoint();
    let window_start = jiff::Timestamp::now();
    let runners = Runners {
        actions,
        scale_set_id: set.id,
        pods: Api::namespaced(client.clone(), stack.namespace()),
        secrets: Api::namespaced(client, stack.namespace()),
        // The runner image of the stack's scale sets.
        image: ScaleSet::new(SET, 0, 0).image,
    };
    // The pods are watched from before the first job, so that no pod's
    // end can be missed.
    let watch = watcher::watcher(
        runners.pods.clone(),
        watcher::Config::default().labels(&format!("{}={}", LABEL.0, LABEL.1)),
    )
    .default_backoff()
    .applied_objects();
    let (acquired_tx, acquired_rx) = mpsc::unbounded_channel();
    let stop = CancellationToken::new();
    let listener = tokio::spawn(listen(session, max_runners, acquired_tx, stop.clone()));

    progress(&format!("floor: enqueueing {jobs} jobs ({arrival})"));
    let started = Instant::now();
    let done = {
        let control = control.clone();
        tokio::spawn(async move {
            control
                .wait_until(bound, |s| {
                    s.ledger.jobs_succeeded >= succeeded_before + jobs
                })
                .await
                .map(|_| Instant::now())
                .map_err(|s| anyhow!("the floor's jobs did not all run: {:?}", s.ledger))
        })
    };
    let work = async {
        let (_, created) = tokio::try_join!(
            async {
                enqueue(&control, &recorder, SET, durations, arrival).await;
                anyhow::Ok(())
            },
            runners.serve(jobs, max_runners, acquired_rx, watch),
        )?;
        anyhow::Ok(created)
    };
    let served = tokio::time::timeout(bound, work).await;
    stop.cancel();
    // A message loop that failed ended the runner loop too (its channel
    // closed): its error is the one worth reporting.
    let session = listener
        .await
        .context("the floor's message loop panicked")?
        .context("the floor's message loop failed")?;
    let created =
        served.map_err(|_| anyhow!("the floor did not finish its jobs within {bound:?}"))??;
    let done = done.await.context("waiting for the floor's jobs")??;
    // Looked for as the stack's admin, not counted with the floor's own.
    let secrets: Api<Secret> = Api::namespaced(stack.client(), stack.namespace());
    stack
        .until("every floor pod and Secret is gone", || async {
            let selector = ListParams::default().labels(&format!("{}={}", LABEL.0, LABEL.1));
            let pods = stack.pods().list(&selector).await.ok()?;
            let secrets = secrets.list(&selector).await.ok()?;
            (pods.items.is_empty() && secrets.items.is_empty()).then_some(())
        })
        .await?;
    let actions_calls: Vec<(Endpoint, u64)> = stack.host_actions_calls_since(&calls_before);
    let window_end = jiff::Timestamp::now();
    // After the window: a listener that stops deletes its session.
    session
        .close()
        .await
        .context("deleting the floor's session")?;
    let jobs_done = control.ledger().jobs_succeeded - succeeded_before;
    let timeline = recorder.timeline();
    let waits = intervals(&timeline.enqueued, &timeline.started);
    Ok(FloorReport {
        jobs: jobs_done,
        wall: done.saturating_duration_since(started),
        runners: created,
        p50_wait: percentile(&waits, 50).unwrap_or_default(),
        p95_wait: percentile(&waits, 95).unwrap_or_default(),
        actions_calls,
        apiserver: stack.host_apiserver_requests(window_start, window_end),
    })
}

/// A client acting as the host's ServiceAccount, so that the audit log
/// counts the floor's requests as it counts the host's; the stack's admin
/// client when the stack shares a control plane (and has no audit log).
async fn floor_client(stack: &Stack) -> Result<kube::Client> {
    let Some(plane) = stack.own_control_plane() else {
        return Ok(stack.client());
    };
    let identity = crate::identity::host_identity(stack.client(), plane, stack.namespace()).await?;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("floor-kubeconfig");
    identity.write_kubeconfig(plane.server(), &path)?;
    let kubeconfig = kube::config::Kubeconfig::read_from(&path)?;
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    Ok(kube::Client::try_from(config)?)
}

/// The message loop: polls the session, acknowledges each message, and
/// acquires every job it offers, in ARC's order (acknowledge, then
/// acquire); tells the runner loop how many jobs it got. Polls again at
/// once: no batch window. Returns the session when stopped, to be closed.
async fn listen(
    session: MessageSession,
    capacity: u32,
    acquired: mpsc::UnboundedSender<u64>,
    stop: CancellationToken,
) -> Result<MessageSession> {
    let mut last = 0;
    loop {
        let polled = tokio::select! {
            () = stop.cancelled() => return Ok(session),
            polled = session.get_message(last, capacity) => polled?,
        };
        let Some(message) = polled else {
            continue;
        };
        session.delete_message(message.id).await?;
        last = message.id;
        let offered: Vec<i64> = message
            .jobs
            .iter()
            .filter_map(|item| match item {
                JobMessage::JobAvailable { job, .. } => Some(job.runner_request_id),
                _ => None,
            })
            .collect();
        // No call when nothing was offered.
        let got = session.acquire_jobs(&offered).await?;
        if !got.is_empty() {
            // The runner loop is gone only when the floor is over.
            let _ = acquired.send(u64::try_from(got.len())?);
        }
    }
}

/// What starting and removing a runner needs.
#[derive(Clone)]
struct Runners {
    actions: ActionsClient,
    scale_set_id: i64,
    pods: Api<Pod>,
    secrets: Api<Secret>,
    image: String,
}

impl Runners {
    /// The runner loop: a runner for each acquired job, at most `max` at
    /// once, each removed when its pod has ended, until `jobs` runners have
    /// finished. Returns the runners created.
    async fn serve(
        &self,
        jobs: u64,
        max: u32,
        mut acquired: mpsc::UnboundedReceiver<u64>,
        pods: impl futures::Stream<Item = Result<Pod, watcher::Error>> + Send,
    ) -> Result<u64> {
        let mut pods = std::pin::pin!(pods);
        let max = u64::from(max);
        // Acquired jobs no runner was started for yet.
        let mut waiting = 0u64;
        // Runners started and not ended.
        let mut live = 0u64;
        let mut created = 0u64;
        let mut finished = 0u64;
        let mut ended: HashSet<String> = HashSet::new();
        let mut calls = JoinSet::new();
        while finished < jobs || !calls.is_empty() {
            tokio::select! {
                got = acquired.recv() => match got {
                    Some(n) => waiting += n,
                    None => bail!("the floor's message loop stopped"),
                },
                pod = pods.next() => {
                    let pod = match pod {
                        Some(Ok(pod)) => pod,
                        // The watch starts again by itself, after a backoff.
                        Some(Err(_)) => continue,
                        None => bail!("the pod watch ended"),
                    };
                    let (Some(uid), Some(name)) = (pod.metadata.uid.clone(), pod.metadata.name.clone()) else {
                        continue;
                    };
                    match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
                        Some("Succeeded") if ended.insert(uid) => {
                            live = live.saturating_sub(1);
                            finished += 1;
                            calls.spawn(self.clone().remove(name));
                        }
                        Some("Failed") => bail!("the floor's runner pod {name} failed: the floor does not recover"),
                        _ => {}
                    }
                },
                Some(call) = calls.join_next(), if !calls.is_empty() => {
                    call.context("a runner call")??;
                }
            }
            while waiting > 0 && live < max {
                waiting -= 1;
                live += 1;
                created += 1;
                calls.spawn(self.clone().start(format!("{SET}-{created}")));
            }
        }
        Ok(created)
    }

    /// A registration, its Secret, and the pod that runs on it, in that
    /// order: the kubelet holds a pod whose Secret is missing.
    async fn start(self, name: String) -> Result<()> {
        let jit = self
            .actions
            .generate_jit_runner_config(
                self.scale_set_id,
                &JitRunnerSetting {
                    name: name.clone(),
                    work_folder: "_work".to_owned(),
                },
            )
            .await
            .with_context(|| format!("registering the runner {name}"))?;
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {LABEL.0: LABEL.1}},
            "type": "Opaque",
            "stringData": {JIT_KEY: jit.encoded_jit_config.expose()},
        }))?;
        self.secrets
            .create(&PostParams::default(), &secret)
            .await
            .with_context(|| format!("creating the Secret {name}"))?;
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {LABEL.0: LABEL.1}},
            "spec": {
                "restartPolicy": "Never",
                "containers": [{
                    "name": "runner",
                    "image": self.image,
                    "env": [{
                        "name": runner_simulator::JIT_CONFIG_ENV,
                        "valueFrom": {"secretKeyRef": {"name": name, "key": JIT_KEY}},
                    }],
                }],
            },
        }))?;
        self.pods
            .create(&PostParams::default(), &pod)
            .await
            .with_context(|| format!("creating the pod {name}"))?;
        Ok(())
    }

    /// The ended runner's pod and Secret deleted, together. Its
    /// registration went when its runner finished the job.
    async fn remove(self, name: String) -> Result<()> {
        let delete = DeleteParams::default();
        let (pod, secret) = tokio::join!(
            self.pods.delete(&name, &delete),
            self.secrets.delete(&name, &delete)
        );
        pod.with_context(|| format!("deleting the pod {name}"))?;
        secret.with_context(|| format!("deleting the Secret {name}"))?;
        Ok(())
    }
}
