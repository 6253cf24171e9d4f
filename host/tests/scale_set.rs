//! The whole controller in one process, as `arcwright run` wires it, against
//! the real API server, the fake Actions service and the runner simulator:
//! an AutoscalingRunnerSet is applied and jobs get runners.
//!
//! These tests run [`arcwright::runtime::wiring::components`] unchanged, so
//! a controller missing from the wiring, or a seam between the listener and
//! the EphemeralRunnerSet that does not hold, fails here.

mod common;
mod helm;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arcwright::actions::ClientOptions;
use arcwright::api::{AutoscalingRunnerSet, EphemeralRunner, EphemeralRunnerSet};
use arcwright::credentials::ActionsClients;
use arcwright::runtime::leader::Election;
use arcwright::runtime::options::RunOptions;
use arcwright::runtime::shards::ShardElection;
use arcwright::runtime::{Runtime, RuntimeError, Shared, wiring};
use arcwright_harness::hostile::{Hostile, hostile_server, rss_bytes};
use arcwright_harness::{TestEnv, eventually_explained};
use clap::Parser;
use fake_actions::{Endpoint, FakeActions, FakeConfig, JobSpec, Ledger};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Pod, Secret};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use runner_simulator::{Simulator, SimulatorConfig};
use serde_json::json;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(120);

/// `arcwright run`'s flags.
#[derive(Parser)]
struct Run {
    #[command(flatten)]
    options: RunOptions,
}
const NAME: &str = "linux";

/// A namespace with the CRDs and the GitHub Secret, the fake, the
/// simulator, and the host running every component.
struct World {
    env: TestEnv,
    fake: FakeActions,
    _sim: Simulator,
    stop: CancellationToken,
    host: Option<JoinHandle<Result<(), RuntimeError>>>,
    /// The host's `/healthz`, `/readyz` and `/metrics`.
    base: String,
    /// Whether hosts campaign for leadership.
    elect: bool,
    /// The client hosts use, when not the test's own (an administrator).
    host_client: Option<kube::Client>,
    /// Flags the hosts get beyond the world's own.
    flags: Vec<String>,
    /// Shards the hosts split the scale sets into; above 1 they campaign
    /// for shard Leases instead of electing a leader.
    shards: u32,
}

/// A host started beside the world's own.
struct Host {
    stop: CancellationToken,
    task: JoinHandle<Result<(), RuntimeError>>,
    base: String,
}

impl World {
    async fn new(name: &str) -> Self {
        Self::with_election(name, false).await
    }

    async fn with_election(name: &str, elect: bool) -> Self {
        let mut world = Self::unstarted(name, elect).await;
        world.start_host().await;
        world
    }

    /// The world without its host, for a test that prepares the cluster
    /// first.
    async fn unstarted(name: &str, elect: bool) -> Self {
        let env = TestEnv::new(name).await;
        common::install_crds(env.client()).await;
        let fake = FakeActions::start(FakeConfig::default()).await.unwrap();
        common::github_secret(env.client(), env.namespace(), fake.pat()).await;
        let sim = Simulator::start(
            env.client(),
            fake.url(),
            SimulatorConfig::namespaced(env.namespace()),
        )
        .unwrap();
        World {
            env,
            fake,
            _sim: sim,
            stop: CancellationToken::new(),
            host: None,
            base: String::new(),
            elect,
            host_client: None,
            flags: Vec::new(),
            shards: 1,
        }
    }

    /// Starts the host as `arcwright run --namespace <ns>` would, with an
    /// Actions client that retries quickly.
    async fn start_host(&mut self) {
        let host = self.spawn_host(self.elect).await;
        self.stop = host.stop;
        self.host = Some(host.task);
        self.base = host.base;
    }

    /// A host of its own; with `elect`, it campaigns for a Lease in the
    /// test namespace (3 s long) as `--leader-elect` makes it.
    async fn spawn_host(&self, elect: bool) -> Host {
        let options = Run::parse_from(
            [
                "run",
                "--namespace",
                self.env.namespace(),
                "--listen-address",
                "127.0.0.1:0",
                // The jobs here last a fraction of a second, less than the
                // default window, and the burst asserts each was recorded on
                // its runner while that runner lived; the window itself is
                // covered by the listener's tests and the binary's.
                "--message-batch-window",
                "0s",
            ]
            .into_iter()
            .chain(self.flags.iter().map(String::as_str)),
        )
        .options;
        let client = self
            .host_client
            .clone()
            .unwrap_or_else(|| self.env.client());
        let mut shared = Shared::new(client.clone(), &options).unwrap();
        let fast = ClientOptions {
            // Still counted on the host's /metrics.
            metrics: shared.actions.metrics.clone(),
            ..common::fast_client_options()
        };
        shared.clients = ActionsClients::new(client, fast.clone());
        shared.actions = fast;
        let identity = format!("host-{:08x}", rand::random::<u32>());
        let shards = (self.shards > 1).then(|| ShardElection {
            namespace: self.env.namespace().to_string(),
            count: self.shards,
            identity: identity.clone(),
            duration: Duration::from_secs(3),
        });
        let election = (elect && shards.is_none()).then(|| Election {
            namespace: self.env.namespace().to_string(),
            lease: "arcwright-controller".into(),
            identity,
            duration: Duration::from_secs(3),
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let stop = CancellationToken::new();
        let signal = stop.clone();
        let task = tokio::spawn(
            Runtime::new(shared, listener, Duration::from_secs(30))
                .with_election(election)
                .with_shards(shards)
                .components(wiring::components())
                .run_until(async move { signal.cancelled().await }),
        );
        Host { stop, task, base }
    }

    /// Stops the host as SIGTERM does, and waits for a clean exit.
    async fn stop_host(&mut self) {
        self.stop.cancel();
        let host = self.host.take().expect("the host runs");
        tokio::time::timeout(WAIT, host)
            .await
            .expect("the host shuts down within the bound")
            .unwrap()
            .expect("the host shuts down cleanly");
    }

    /// Waits until `/readyz` says the host is ready.
    async fn ready(&self) {
        self.ready_at(&self.base).await;
    }

    /// Waits until the `/readyz` of the host at `base` says it is ready.
    async fn ready_at(&self, base: &str) {
        let http = reqwest::Client::new();
        let url = format!("{base}/readyz");
        self.until("the host is ready", || async {
            let response = http.get(&url).send().await.ok()?;
            (response.status() == 200).then_some(())
        })
        .await;
    }

    fn sets(&self) -> Api<AutoscalingRunnerSet> {
        Api::namespaced(self.env.client(), self.env.namespace())
    }

    fn runner_sets(&self) -> Api<EphemeralRunnerSet> {
        Api::namespaced(self.env.client(), self.env.namespace())
    }

    fn runners(&self) -> Api<EphemeralRunner> {
        Api::namespaced(self.env.client(), self.env.namespace())
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.env.client(), self.env.namespace())
    }

    async fn create_set(&self, min: i32, max: i32) {
        self.create_set_with(min, max, json!(null)).await;
    }

    /// A scale set whose scaling policy is `scaling` (`null` for none).
    async fn create_set_with(&self, min: i32, max: i32, scaling: serde_json::Value) {
        let set: AutoscalingRunnerSet = serde_json::from_value(json!({
            "apiVersion": "arcwright.dev/v1alpha1",
            "kind": "AutoscalingRunnerSet",
            "metadata": {"name": NAME},
            "spec": {
                "githubConfigUrl": self.fake.org_url("octo"),
                "githubConfigSecret": "github-auth",
                "minRunners": min,
                "maxRunners": max,
                "scalingPolicy": scaling,
                "template": {"spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "runner", "image": "ghcr.io/actions/actions-runner:2.330.0"}],
                }},
            },
        }))
        .unwrap();
        self.sets()
            .create(&PostParams::default(), &set)
            .await
            .unwrap();
    }

    /// Deletes the scale set and waits until it is gone (its finalizer
    /// released, so its runners and registrations went first).
    async fn delete_set(&self) {
        self.sets()
            .delete(NAME, &DeleteParams::default())
            .await
            .unwrap();
        self.until("the scale set is gone", || async {
            self.sets()
                .get_opt(NAME)
                .await
                .unwrap()
                .is_none()
                .then_some(())
        })
        .await;
    }

    /// Polls `probe` until it answers, naming the fake's ledger if it
    /// never does.
    async fn until<T, Fut>(&self, what: &str, probe: impl FnMut() -> Fut) -> T
    where
        Fut: std::future::Future<Output = Option<T>>,
    {
        eventually_explained(what, WAIT, probe, || format!("ledger: {:?}", self.ledger())).await
    }

    async fn set_until(
        &self,
        what: &str,
        done: impl Fn(&AutoscalingRunnerSet) -> bool,
    ) -> AutoscalingRunnerSet {
        self.until(what, || async {
            self.sets().get_opt(NAME).await.unwrap().filter(|s| done(s))
        })
        .await
    }

    /// Waits until the set has exactly `count` runners, none being deleted,
    /// and as many pods.
    async fn settled_at(&self, count: usize) {
        self.until(&format!("settled at {count} runners"), || async {
            let runners = self.runners().list(&ListParams::default()).await.unwrap();
            let pods = self.pods().list(&ListParams::default()).await.unwrap();
            let steady = runners.items.len() == count
                && runners
                    .items
                    .iter()
                    .all(|r| r.metadata.deletion_timestamp.is_none())
                && pods.items.len() == count;
            steady.then_some(())
        })
        .await;
    }

    /// Waits until the scale set's listener says it listens; the set.
    async fn listening(&self) -> AutoscalingRunnerSet {
        self.set_until("the listener listens", |set| {
            set.status
                .as_ref()
                .and_then(|s| s.listener.as_ref())
                .is_some_and(|l| l.state == "Listening")
        })
        .await
    }

    /// Enqueues `count` jobs for the scale set and waits until all
    /// succeeded.
    async fn run_jobs(&self, count: u32, lasting: Duration) {
        let control = self.fake.control();
        let before = control.ledger().jobs_succeeded;
        control.enqueue_jobs(JobSpec::new(count, &[NAME]).lasting(lasting));
        control
            .wait_until(WAIT, |s| {
                s.ledger.jobs_succeeded == before + u64::from(count)
            })
            .await
            .unwrap_or_else(|s| panic!("the jobs did not all run: {:?}", s.ledger));
    }

    fn ledger(&self) -> Ledger {
        self.fake.control().ledger()
    }

    fn scale_set_id(set: &AutoscalingRunnerSet) -> u64 {
        let id = set.status.as_ref().and_then(|s| s.runner_scale_set_id);
        u64::try_from(id.expect("registered")).unwrap()
    }

    async fn event_reasons(&self) -> BTreeSet<String> {
        let events: Api<Event> = Api::namespaced(self.env.client(), self.env.namespace());
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.involved_object.kind.as_deref() == Some("AutoscalingRunnerSet"))
            .filter_map(|e| e.reason)
            .collect()
    }

    /// Records every `(replicas, patchID)` the EphemeralRunnerSet holds.
    fn record_decisions(&self) -> Arc<Mutex<Vec<(i32, i32)>>> {
        let decisions = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&decisions);
        let stream =
            watcher::watcher(self.runner_sets(), watcher::Config::default()).applied_objects();
        let stop = self.stop.clone();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream.take_until(stop.cancelled_owned()));
            while let Some(Ok(set)) = stream.next().await {
                seen.lock()
                    .unwrap()
                    .push((set.spec.replicas, set.spec.patch_id));
            }
        });
        decisions
    }

    /// Records the name of every runner seen with a job on its status.
    /// The jobs recorded on runners, with the runner and the registration
    /// that ran each.
    fn record_busy_runners(&self) -> Arc<Mutex<BTreeSet<(String, String, i64)>>> {
        let busy = Arc::new(Mutex::new(BTreeSet::new()));
        let seen = Arc::clone(&busy);
        let stream = watcher::watcher(self.runners(), watcher::Config::default()).applied_objects();
        let stop = self.stop.clone();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream.take_until(stop.cancelled_owned()));
            while let Some(Ok(runner)) = stream.next().await {
                let status = runner.status.unwrap_or_default();
                if let Some(job) = status.job_id.clone()
                    && status.job_repository_name.is_some()
                {
                    seen.lock().unwrap().insert((
                        job,
                        runner.metadata.name.unwrap_or_default(),
                        status.job_runner_id,
                    ));
                }
            }
        });
        busy
    }
}

impl Drop for World {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// After a scenario: no registration is left that belongs to no live
/// runner, and no job was cancelled under a runner.
fn assert_nothing_leaked(ledger: &Ledger, live_runners: u64) {
    assert_eq!(
        ledger.still_registered, live_runners,
        "registrations left behind: {ledger:?}"
    );
    assert_eq!(
        ledger.jobs_cancelled_runner_vanished, 0,
        "a job lost its runner: {ledger:?}"
    );
    assert_eq!(ledger.jobs_cancelled, 0, "{ledger:?}");
}

#[tokio::test]
async fn a_burst_gets_runners_up_to_max_and_the_set_returns_to_zero() {
    let mut world = World::unstarted("scale-set-burst", false).await;
    // The job records on the runners' statuses, which this burst asserts
    // one by one, are what keeps scale-down off a busy runner without
    // renewal in place. With it (the default) the listener tells the set
    // in memory and writes a start only once it has run two seconds: that
    // path is `a_job_heard_and_not_yet_recorded_keeps_its_runner_from_scale_down`
    // (tests/ephemeral_runner_set.rs) and the stack's lifecycle tests.
    world.flags = vec!["--renew-in-place=false".into()];
    world.start_host().await;
    world.ready().await;
    world.create_set(0, 3).await;
    let set = world.listening().await;
    let id = World::scale_set_id(&set);
    assert!(world.fake.control().has_session(id));
    let busy = world.record_busy_runners();
    let decisions = world.record_decisions();

    world.run_jobs(6, Duration::from_millis(500)).await;
    {
        let decisions = decisions.lock().unwrap();
        assert!(
            decisions
                .iter()
                .any(|&(replicas, id)| replicas == 3 && id != 0),
            "a scale-up to maxRunners, naming its decision: {decisions:?}"
        );
        assert!(
            decisions.iter().all(|&(replicas, _)| replicas <= 3),
            "never above maxRunners: {decisions:?}"
        );
    }

    // Back to zero: the decision settles at 0 with patch id 0, and the set
    // removes what is left.
    world
        .until("the set scaled back to zero", || async {
            world
                .runner_sets()
                .get_opt(NAME)
                .await
                .unwrap()
                .filter(|s| s.spec.replicas == 0 && s.spec.patch_id == 0)
        })
        .await;
    world.settled_at(0).await;
    let set = world
        .set_until("the decision is on the status", |set| {
            set.status
                .as_ref()
                .and_then(|s| s.scaling.as_ref())
                .is_some_and(|s| s.desired_runners == 0 && s.policy == "builtin:default")
        })
        .await;
    assert!(
        !set.status.unwrap().scaling.unwrap().reason.is_empty(),
        "the policy says why"
    );
    let reasons = world.event_reasons().await;
    assert!(reasons.contains("ScalingDecision"), "{reasons:?}");

    // Every job was recorded on the runner that ran it, which is what
    // keeps a busy runner from being scaled down.
    let busy = busy.lock().unwrap().clone();
    let jobs: BTreeSet<&String> = busy.iter().map(|(job, _, _)| job).collect();
    assert_eq!((jobs.len(), busy.len()), (6, 6), "{busy:?}");
    // Each on a registration of its own, though runners that succeeded
    // are renewed for the next job rather than replaced.
    let registrations: BTreeSet<i64> = busy.iter().map(|(_, _, id)| *id).collect();
    assert_eq!(registrations.len(), 6, "{busy:?}");
    assert!(!registrations.contains(&0), "{busy:?}");
    let ledger = world.ledger();
    // Each job's runner deregistered itself; a runner created for demand
    // that was gone by the time it came up is removed by the host.
    assert_eq!(ledger.self_deregistered, 6, "{ledger:?}");
    assert_eq!(
        ledger.runners_created - 6,
        ledger.removed_by_api,
        "{ledger:?}"
    );
    assert_nothing_leaked(&ledger, 0);

    // What the burst left on /metrics, read as Prometheus reads it.
    let text = reqwest::get(format!("{}/metrics", world.base))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let (types, samples) = common::parse_exposition(&text);
    let ns = world.env.namespace();
    let sample = |name: &str, labels: &[(&str, &str)]| {
        samples
            .iter()
            .find(|s| {
                s.name == name
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|s| s.value)
    };
    let scale_set = [("namespace", ns), ("name", NAME)];
    // The service's statistics and the decision, per scale set, as ARC
    // names them; settled at zero after the burst.
    for gauge in [
        "gha_assigned_jobs",
        "gha_running_jobs",
        "gha_desired_runners",
    ] {
        assert_eq!(sample(gauge, &scale_set), Some(0.0), "{gauge} in {text}");
    }
    assert!(
        sample("gha_registered_runners", &scale_set).is_some(),
        "{text}"
    );
    // ARC's other names, with ARC's labels: an ARC dashboard reads them.
    let arc_labelled = |name: &str| {
        samples
            .iter()
            .filter(|s| s.name == name && s.labels.get("name").map(String::as_str) == Some(NAME))
            .map(|s| s.labels.keys().map(String::as_str).collect::<BTreeSet<_>>())
            .next()
            .unwrap_or_else(|| panic!("{name} for the scale set is not on /metrics:\n{text}"))
    };
    for gauge in [
        "gha_min_runners",
        "gha_max_runners",
        "gha_controller_running_listeners",
        "gha_controller_pending_ephemeral_runners",
        "gha_controller_running_ephemeral_runners",
        "gha_controller_failed_ephemeral_runners",
        "gha_assigned_jobs",
    ] {
        assert_eq!(
            arc_labelled(gauge),
            BTreeSet::from([
                "name",
                "namespace",
                "enterprise",
                "organization",
                "repository"
            ]),
            "{gauge}"
        );
    }
    assert_eq!(
        sample("gha_controller_running_listeners", &scale_set),
        Some(1.0)
    );
    let jobs = |name: &str| {
        samples
            .iter()
            .filter(|s| s.name == name && s.labels.get("name").map(String::as_str) == Some(NAME))
            .map(|s| s.value)
            .sum::<f64>()
    };
    assert_eq!(jobs("gha_started_jobs_total"), 6.0, "{text}");
    assert_eq!(jobs("gha_completed_jobs_total"), 6.0, "{text}");
    assert_eq!(
        jobs("gha_job_startup_duration_seconds_count"),
        6.0,
        "{text}"
    );
    assert_eq!(
        jobs("gha_job_execution_duration_seconds_count"),
        6.0,
        "{text}"
    );
    let completed = arc_labelled("gha_completed_jobs_total");
    for label in [
        "enterprise",
        "organization",
        "repository",
        "event_name",
        "job_result",
    ] {
        assert!(
            completed.contains(label),
            "{label} on gha_completed_jobs_total: {completed:?}"
        );
    }
    let ups = sample(
        "arcwright_scale_decisions_total",
        &[
            ("namespace", ns),
            ("scale_set", NAME),
            ("policy", "builtin:default"),
            ("direction", "up"),
        ],
    );
    assert!(ups.is_some_and(|n| n >= 1.0), "{text}");
    let downs = sample(
        "arcwright_scale_decisions_total",
        &[
            ("namespace", ns),
            ("scale_set", NAME),
            ("direction", "down"),
        ],
    );
    assert!(downs.is_some_and(|n| n >= 1.0), "{text}");
    // Every Actions call, by endpoint: six jobs acquired and six JIT
    // configs at least, every poll.
    let calls = |endpoint: &str| {
        sample(
            "arcwright_actions_requests_total",
            &[("endpoint", endpoint), ("outcome", "ok")],
        )
        .unwrap_or(0.0)
    };
    assert!(calls("generate_jit_config") >= 6.0, "{text}");
    assert!(calls("get_message") >= 1.0, "{text}");
    // Runner counts by phase, policy decisions, reconcile durations.
    assert!(
        sample("arcwright_policy_decisions_total", &[("kind", "scaling")])
            .is_some_and(|n| n >= 1.0),
        "{text}"
    );
    assert!(
        sample(
            "arcwright_reconcile_duration_seconds_count",
            &[("controller", "ephemeral-runner")]
        )
        .is_some_and(|n| n >= 1.0),
        "{text}"
    );
    assert_eq!(
        sample("arcwright_unregistration_queue_depth", &[]),
        Some(0.0),
        "{text}"
    );
    // Every series the chart's dashboard and alerts query is one the host
    // declares: a renamed metric breaks them here, not on a wall display.
    // A family shows on /metrics once it has a series; policy failures
    // and reconcile errors have none in a healthy burst, and their names
    // are proven where they are made (`policy::metrics`' and
    // `controllers::metrics`' tests).
    let listed = std::fs::read_to_string(helm::controller_chart().join("metrics.txt")).unwrap();
    for series in listed
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter(|l| {
            ![
                "arcwright_policy_failures_total",
                "arcwright_reconcile_errors_total",
            ]
            .contains(l)
        })
    {
        let family = ["_total", "_bucket", "_count", "_sum"]
            .iter()
            .find_map(|suffix| series.strip_suffix(suffix))
            .unwrap_or(series);
        assert!(
            types.contains_key(family),
            "{series} (queried by the dashboard or alerts) is not on /metrics:\n{text}"
        );
    }
}

#[tokio::test]
async fn a_warm_pool_of_min_runners_is_kept_through_a_burst() {
    let world = World::new("scale-set-warm").await;
    world.create_set(2, 4).await;
    world.settled_at(2).await;
    world
        .until("both warm runners registered", || async {
            (world.ledger().still_registered == 2).then_some(())
        })
        .await;

    world.run_jobs(5, Duration::from_millis(300)).await;
    world.settled_at(2).await;
    world
        .until("the two warm runners registered again", || async {
            (world.ledger().still_registered == 2).then_some(())
        })
        .await;
    assert_nothing_leaked(&world.ledger(), 2);
}

#[tokio::test]
async fn a_scale_set_asking_beyond_the_hosts_cap_gets_the_cap_and_says_so() {
    let mut world = World::unstarted("scale-set-capped", false).await;
    world.flags = vec!["--max-runners-per-scale-set".into(), "3".into()];
    world.start_host().await;
    world.create_set(2_000_000_000, 2_000_000_000).await;
    let set = world
        .set_until("the cap is on the status", |set| {
            set.status.as_ref().is_some_and(|s| {
                s.conditions.iter().any(|c| {
                    c.type_ == "RunnersCapped" && c.status == "True" && c.reason == "AboveHostLimit"
                })
            })
        })
        .await;
    let message = &set
        .status
        .unwrap()
        .conditions
        .iter()
        .find(|c| c.type_ == "RunnersCapped")
        .unwrap()
        .message
        .clone();
    assert!(
        message.contains("minRunners 2000000000 and maxRunners 2000000000")
            && message.contains("limit of 3 runners"),
        "{message}"
    );
    world.listening().await;
    world
        .until("the listener asked for the cap", || async {
            let runner_set = world.runner_sets().get_opt(NAME).await.unwrap()?;
            (runner_set.spec.replicas == 3).then_some(())
        })
        .await;
    world.settled_at(3).await;
    world
        .until("three warm runners registered", || async {
            (world.ledger().still_registered == 3).then_some(())
        })
        .await;
    // Everything the host ever registered: never more than the cap.
    assert_eq!(world.ledger().runners_created, 3, "{:?}", world.ledger());
}

#[tokio::test]
async fn shutdown_deletes_the_message_session_and_a_new_host_takes_over() {
    let mut world = World::new("scale-set-shutdown").await;
    world.create_set(0, 2).await;
    let set = world.listening().await;
    let id = World::scale_set_id(&set);
    assert!(world.fake.control().has_session(id));

    world.stop_host().await;
    assert!(
        !world.fake.control().has_session(id),
        "the session was deleted on the way out"
    );

    // A restarted host holds the session at once and runs jobs.
    world.start_host().await;
    world
        .until("the new host holds the session", || async {
            world.fake.control().has_session(id).then_some(())
        })
        .await;
    world.run_jobs(2, Duration::from_millis(200)).await;
    world.settled_at(0).await;
    assert_nothing_leaked(&world.ledger(), 0);
    world.stop_host().await;
}

#[tokio::test]
async fn deleting_the_scale_set_removes_runners_registrations_and_the_scale_set() {
    let world = World::new("scale-set-delete").await;
    world.create_set(2, 2).await;
    world.settled_at(2).await;
    let set = world
        .set_until("registered", |set| {
            set.status
                .as_ref()
                .is_some_and(|s| s.runner_scale_set_id.is_some())
        })
        .await;
    let id = World::scale_set_id(&set);

    world.delete_set().await;
    world.settled_at(0).await;
    let control = world.fake.control();
    assert!(!control.has_session(id), "the listener stopped first");
    assert!(
        control.scale_sets().iter().all(|s| s.id != id),
        "the scale set is deleted in the service"
    );
    assert_nothing_leaked(&world.ledger(), 0);
}

#[tokio::test]
async fn deleting_the_scale_set_and_its_secret_together_still_tears_everything_down() {
    let world = World::new("scale-set-uninstall").await;
    world.create_set(2, 2).await;
    world.settled_at(2).await;
    let secrets: Api<Secret> = Api::namespaced(world.env.client(), world.env.namespace());
    let set = world
        .set_until("registered", |set| {
            set.status
                .as_ref()
                .is_some_and(|s| s.runner_scale_set_id.is_some())
        })
        .await;
    let id = World::scale_set_id(&set);
    common::wait_credentials_held(world.env.client(), world.env.namespace()).await;

    // As `helm uninstall` does: both at once.
    secrets
        .delete("github-auth", &DeleteParams::default())
        .await
        .unwrap();
    world.delete_set().await;
    world.settled_at(0).await;
    let control = world.fake.control();
    assert!(
        control.scale_sets().iter().all(|s| s.id != id),
        "the scale set is deleted in the service"
    );
    assert_nothing_leaked(&world.ledger(), 0);
    world
        .until("the released Secret is gone", || async {
            secrets
                .get_opt("github-auth")
                .await
                .unwrap()
                .is_none()
                .then_some(())
        })
        .await;
}

#[tokio::test]
async fn deleted_scale_sets_leave_no_metric_series_behind() {
    const SETS: usize = 100;
    let world = World::new("scale-set-series").await;
    world.ready().await;
    let name = |i: usize| format!("series-{i:03}");
    // Every tenth keeps a warm runner, so runner series exist too.
    for i in 0..SETS {
        let set: AutoscalingRunnerSet = serde_json::from_value(json!({
            "apiVersion": "arcwright.dev/v1alpha1",
            "kind": "AutoscalingRunnerSet",
            "metadata": {"name": name(i)},
            "spec": {
                "githubConfigUrl": world.fake.org_url("octo"),
                "githubConfigSecret": "github-auth",
                "minRunners": if i % 10 == 0 { 1 } else { 0 },
                "maxRunners": 2,
                "template": {"spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "runner", "image": "ghcr.io/actions/actions-runner:2.330.0"}],
                }},
            },
        }))
        .unwrap();
        world
            .sets()
            .create(&PostParams::default(), &set)
            .await
            .unwrap();
    }
    let metrics = || async {
        reqwest::get(format!("{}/metrics", world.base))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    };
    let series_of = |text: &str, i: usize| {
        let set = name(i);
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter(|l| {
                l.contains(&format!("name=\"{set}\""))
                    || l.contains(&format!("scale_set=\"{set}\""))
            })
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    world
        .until("every set listens, its warm runners running", || async {
            let sets = world.sets().list(&ListParams::default()).await.unwrap();
            let listening = sets
                .items
                .iter()
                .filter(|s| {
                    s.status
                        .as_ref()
                        .and_then(|s| s.listener.as_ref())
                        .is_some_and(|l| l.state == "Listening")
                })
                .count();
            let text = metrics().await;
            let runner_series = text
                .lines()
                .filter(|l| l.starts_with("arcwright_ephemeral_runners{") && l.contains("series-"))
                .count();
            (listening == SETS && runner_series > 0).then_some(())
        })
        .await;
    let before = metrics().await;
    assert!(!series_of(&before, 0).is_empty(), "{before}");

    for i in 0..SETS {
        world
            .sets()
            .delete(&name(i), &DeleteParams::default())
            .await
            .unwrap();
    }
    world
        .until("every set is gone", || async {
            world
                .sets()
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .is_empty()
                .then_some(())
        })
        .await;
    world.settled_at(0).await;
    let after = metrics().await;
    let left: Vec<String> = (0..SETS).flat_map(|i| series_of(&after, i)).collect();
    assert!(left.is_empty(), "series left behind:\n{}", left.join("\n"));
}

#[tokio::test]
async fn a_scale_set_deleted_in_the_service_is_registered_again_and_runs_the_next_job() {
    let world = World::new("scale-set-lost").await;
    world.create_set(0, 2).await;
    let set = world.listening().await;
    let lost = World::scale_set_id(&set);
    world.run_jobs(1, Duration::from_millis(200)).await;
    world.settled_at(0).await;

    // An admin deletes it in GitHub's settings.
    assert!(world.fake.control().delete_scale_set(lost));
    let set = world
        .set_until("a new scale set is recorded", |set| {
            set.status
                .as_ref()
                .and_then(|s| s.runner_scale_set_id)
                .is_some_and(|id| u64::try_from(id).ok() != Some(lost))
        })
        .await;
    let found = World::scale_set_id(&set);
    world
        .until("the listener listens on the new scale set", || async {
            world.fake.control().has_session(found).then_some(())
        })
        .await;
    world.run_jobs(1, Duration::from_millis(200)).await;
    assert!(world.event_reasons().await.contains("ScaleSetLost"));
    world.settled_at(0).await;
    assert_nothing_leaked(&world.ledger(), 0);
}

#[tokio::test]
async fn two_sets_of_one_name_never_share_a_scale_set() {
    let mut world = World::unstarted("scale-set-conflict", false).await;
    // A second namespace the host watches too, where the first set is.
    let other = format!("{}-b", world.env.namespace());
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(world.env.client());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": other}})).unwrap(),
        )
        .await
        .unwrap();
    common::github_secret(world.env.client(), &other, world.fake.pat()).await;
    world.flags = vec!["--namespace".into(), other.clone()];
    world.start_host().await;
    let first_sets: Api<AutoscalingRunnerSet> = Api::namespaced(world.env.client(), &other);
    let first: AutoscalingRunnerSet = serde_json::from_value(json!({
        "apiVersion": "arcwright.dev/v1alpha1",
        "kind": "AutoscalingRunnerSet",
        "metadata": {"name": NAME},
        "spec": {
            "githubConfigUrl": world.fake.org_url("octo"),
            "githubConfigSecret": "github-auth",
            "minRunners": 0,
            "maxRunners": 1,
            "template": {"spec": {"containers": [{"name": "runner", "image": "runner:1"}]}},
        },
    }))
    .unwrap();
    first_sets
        .create(&PostParams::default(), &first)
        .await
        .unwrap();
    let held = world
        .until("the first set holds the scale set", || async {
            first_sets
                .get(NAME)
                .await
                .unwrap()
                .status
                .and_then(|s| s.runner_scale_set_id)
        })
        .await;

    // The second, of the same name in the same organisation, waits and
    // says for whom.
    world.create_set(0, 2).await;
    let waiting = world
        .set_until("the second set says why it waits", |set| {
            set.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "ScaleSetConflict" && c.status == "True")
            })
        })
        .await;
    let status = waiting.status.unwrap();
    let condition = status
        .conditions
        .iter()
        .find(|c| c.type_ == "ScaleSetConflict")
        .unwrap();
    assert!(
        condition.message.contains(&format!("{other}/{NAME}")),
        "{}",
        condition.message
    );
    assert_eq!(status.runner_scale_set_id, None, "nothing adopted");
    assert!(world.event_reasons().await.contains("ScaleSetConflict"));

    // The first goes (and its scale set with it): the second takes over.
    first_sets
        .delete(NAME, &DeleteParams::default())
        .await
        .unwrap();
    let set = world
        .set_until("the second set registers a scale set of its own", |set| {
            set.status.as_ref().is_some_and(|s| {
                s.runner_scale_set_id.is_some()
                    && !s.conditions.iter().any(|c| c.type_ == "ScaleSetConflict")
            })
        })
        .await;
    assert_ne!(set.status.unwrap().runner_scale_set_id, Some(held));
    world.listening().await;
    world.run_jobs(1, Duration::from_millis(200)).await;
    world.settled_at(0).await;
    assert_nothing_leaked(&world.ledger(), 0);
}

#[tokio::test]
async fn a_hostile_service_url_neither_fills_the_hosts_memory_nor_stops_other_sets() {
    let world = World::new("scale-set-hostile").await;
    world.ready().await;
    let before = rss_bytes();
    let hostile: AutoscalingRunnerSet = serde_json::from_value(json!({
        "apiVersion": "arcwright.dev/v1alpha1",
        "kind": "AutoscalingRunnerSet",
        "metadata": {"name": "hostile"},
        "spec": {
            "githubConfigUrl": format!("http://{}/tenant", hostile_server(Hostile::Endless).await.0),
            "githubConfigSecret": "github-auth",
            "minRunners": 1,
            "maxRunners": 2,
            "template": {"spec": {"containers": [{"name": "runner", "image": "runner:1"}]}},
        },
    }))
    .unwrap();
    world
        .sets()
        .create(&PostParams::default(), &hostile)
        .await
        .unwrap();
    world.create_set(0, 2).await;
    world.listening().await;
    // Jobs run on the other set while the hostile one's calls are cut off
    // at their size limit and retried.
    world.run_jobs(3, Duration::from_millis(200)).await;
    world.run_jobs(3, Duration::from_millis(200)).await;
    let hostile = world.sets().get("hostile").await.unwrap();
    assert_eq!(
        hostile.status.and_then(|s| s.runner_scale_set_id),
        None,
        "nothing registered there"
    );
    let grown = rss_bytes().saturating_sub(before);
    assert!(
        grown < 256 * 1024 * 1024,
        "the resident set grew by {} MiB",
        grown / (1024 * 1024)
    );
    world.settled_at(0).await;
    assert_nothing_leaked(&world.ledger(), 0);
}

#[tokio::test]
async fn only_the_leader_listens_and_a_standby_takes_over_when_it_leaves() {
    let mut world = World::with_election("scale-set-leader", true).await;
    world.ready().await;
    world.create_set(0, 2).await;
    let set = world.listening().await;
    let id = World::scale_set_id(&set);

    // A second replica: healthy, ready, and quiet while the first leads.
    let standby = world.spawn_host(true).await;
    world.ready_at(&standby.base).await;
    let control = world.fake.control();
    assert_eq!(
        control.counters().calls(Endpoint::CreateSession),
        1,
        "only the leader opened a session"
    );

    // The leader leaves: it deletes its session and releases the Lease, so
    // the standby takes over without waiting for either to expire.
    world.stop_host().await;
    world
        .until("the standby holds the session", || async {
            control.has_session(id).then_some(())
        })
        .await;
    assert_eq!(control.counters().calls(Endpoint::CreateSession), 2);
    world.run_jobs(3, Duration::from_millis(200)).await;
    world.settled_at(0).await;
    assert_nothing_leaked(&world.ledger(), 0);

    standby.stop.cancel();
    tokio::time::timeout(WAIT, standby.task)
        .await
        .expect("the standby shuts down")
        .unwrap()
        .expect("cleanly");
}

/// One API call as RBAC sees it: API group, resource (with its
/// subresource), verb.
type Call = (String, String, String);

/// What RBAC checks of a request: `None` for what it does not (discovery,
/// `/version`).
fn rbac_call(method: &http::Method, uri: &http::Uri) -> Option<Call> {
    let segments: Vec<&str> = uri.path().trim_matches('/').split('/').collect();
    let (group, rest) = match segments.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return None,
    };
    let rest = match rest {
        ["namespaces", _namespace, inner @ ..] if !inner.is_empty() => inner,
        other => other,
    };
    let (resource, name, subresource) = match rest {
        [resource] => (*resource, None, None),
        [resource, name] => (*resource, Some(*name), None),
        [resource, name, subresource] => (*resource, Some(*name), Some(*subresource)),
        _ => return None,
    };
    let watching = uri.query().is_some_and(|q| {
        q.split('&')
            .any(|pair| pair == "watch=true" || pair == "watch=1")
    });
    let verb = match (method.as_str(), name) {
        ("GET", _) if watching => "watch",
        ("GET", Some(_)) => "get",
        ("GET", None) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", Some(_)) => "delete",
        ("DELETE", None) => "deletecollection",
        _ => return None,
    };
    let resource = match subresource {
        Some(sub) => format!("{resource}/{sub}"),
        None => resource.to_owned(),
    };
    Some((group.to_owned(), resource, verb.to_owned()))
}

#[test]
fn requests_are_read_as_rbac_reads_them() {
    let cases = [
        (
            "GET",
            "/api/v1/namespaces/ci/pods?watch=true&resourceVersion=5",
            ("", "pods", "watch"),
        ),
        (
            "GET",
            "/api/v1/namespaces/ci/pods?labelSelector=a",
            ("", "pods", "list"),
        ),
        ("GET", "/api/v1/pods", ("", "pods", "list")),
        (
            "GET",
            "/api/v1/namespaces/ci/secrets/github-auth",
            ("", "secrets", "get"),
        ),
        ("POST", "/api/v1/namespaces/ci/pods", ("", "pods", "create")),
        (
            "DELETE",
            "/api/v1/namespaces/ci/pods/r-1",
            ("", "pods", "delete"),
        ),
        (
            "PATCH",
            "/apis/arcwright.dev/v1alpha1/namespaces/ci/ephemeralrunners/r-1/status",
            ("arcwright.dev", "ephemeralrunners/status", "patch"),
        ),
        (
            "PUT",
            "/apis/coordination.k8s.io/v1/namespaces/ci/leases/arcwright-controller",
            ("coordination.k8s.io", "leases", "update"),
        ),
        (
            "POST",
            "/apis/authentication.k8s.io/v1/tokenreviews",
            ("authentication.k8s.io", "tokenreviews", "create"),
        ),
        ("GET", "/api/v1/namespaces/ci", ("", "namespaces", "get")),
    ];
    for (method, uri, (group, resource, verb)) in cases {
        let call = rbac_call(&method.parse().unwrap(), &uri.parse().unwrap());
        assert_eq!(
            call,
            Some((group.into(), resource.into(), verb.into())),
            "{method} {uri}"
        );
    }
    assert_eq!(
        rbac_call(&http::Method::GET, &"/version".parse().unwrap()),
        None
    );
    assert_eq!(
        rbac_call(&http::Method::GET, &"/apis".parse().unwrap()),
        None
    );
}

/// A client of the test's API server acting as `user` in `groups` (the
/// administrator may impersonate), recording every call it makes.
async fn impersonating(
    env: &TestEnv,
    user: &str,
    groups: Vec<String>,
) -> (kube::Client, Arc<Mutex<BTreeSet<Call>>>) {
    let kubeconfig =
        kube::config::Kubeconfig::read_from(env.control_plane().kubeconfig_path()).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    config.auth_info.impersonate = Some(user.to_owned());
    config.auth_info.impersonate_groups = Some(groups);
    let calls = Arc::new(Mutex::new(BTreeSet::new()));
    let record = Arc::clone(&calls);
    let layer =
        tower::util::MapRequestLayer::new(move |request: http::Request<kube::client::Body>| {
            if let Some(call) = rbac_call(request.method(), request.uri()) {
                record.lock().unwrap().insert(call);
            }
            request
        });
    let client = kube::client::ClientBuilder::try_from(config)
        .unwrap()
        .with_layer(&layer)
        .build();
    (client, calls)
}

/// Every `(group, resource, verb)` the chart's rules grant, by scope.
fn granted() -> BTreeMap<String, BTreeSet<Call>> {
    let rules = helm::rules_file();
    let mut granted = BTreeMap::new();
    for (scope, list) in rules.as_object().unwrap() {
        let calls: &mut BTreeSet<Call> = granted.entry(scope.clone()).or_default();
        for rule in list.as_array().unwrap() {
            let strings = |key: &str| -> Vec<String> {
                rule[key]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_str().unwrap().to_owned())
                    .collect()
            };
            for group in strings("apiGroups") {
                for resource in strings("resources") {
                    for verb in strings("verbs") {
                        calls.insert((group.clone(), resource.clone(), verb));
                    }
                }
            }
        }
    }
    granted
}

/// Whether the scenario below makes a granted call it is not counted on to
/// make.
#[derive(Clone, Copy, PartialEq)]
enum Uncalled {
    /// It cannot: a call of it after all means the reason is stale.
    Never,
    /// It may or may not, by a race the scenario does not control; either
    /// outcome passes, so the test never depends on which way it goes.
    Racy,
}

/// Granted, and needed, but not counted on in the scenario below; each says
/// why, and whether the scenario can make it anyway. Anything else granted
/// and never called fails the test: the rules stay exactly what the code
/// calls.
const GRANTED_NOT_CALLED: &[(&str, &str, &str, Uncalled, &str)] = &[
    (
        "arcwright.dev",
        "ephemeralrunners",
        "get",
        Uncalled::Racy,
        "a renewal that finds its runner changed since the set listed it (the listener's \
         late job record landing in between) reads it again; a burst may or may not race so",
    ),
    (
        "arcwright.dev",
        "ephemeralrunnersets",
        "create",
        Uncalled::Never,
        "server-side apply creates a runner set with a PATCH, which the API server \
         authorises as create as well",
    ),
    (
        "arcwright.dev",
        "autoscalingrunnersets/finalizers",
        "update",
        Uncalled::Never,
        FINALIZERS,
    ),
    (
        "arcwright.dev",
        "ephemeralrunnersets/finalizers",
        "update",
        Uncalled::Never,
        FINALIZERS,
    ),
    (
        "arcwright.dev",
        "ephemeralrunners/finalizers",
        "update",
        Uncalled::Never,
        FINALIZERS,
    ),
];

/// Why the finalizers subresources are granted though never called.
const FINALIZERS: &str = "an owner reference with blockOwnerDeletion needs it where the \
    OwnerReferencesPermissionEnforcement admission plugin runs; the test API server does not";

/// The host runs as the chart's ServiceAccount with RBAC enforced, through
/// a burst with a ConfigMap policy, shard Leases (whose calls include the
/// single leader's: get, create, patch), the hold API and the scale set's
/// deletion: the chart's rules are enough, and every rule they grant was
/// used. The one replica holds both shards, so the burst also runs through
/// the sharded path: the set's reconciles skipped until its shard is taken,
/// then all run again.
#[tokio::test]
async fn the_charts_rbac_is_enough_and_every_rule_it_grants_is_used() {
    let mut world = World::unstarted("scale-set-rbac", true).await;
    let ns = world.env.namespace().to_owned();
    let release = format!("rbac-{}", &ns[ns.len().saturating_sub(5)..]);
    helm::install(
        &world.env,
        &release,
        &helm::controller_chart(),
        &["--set", &format!("watchNamespaces={{{ns}}}")],
    );
    let account = format!("{release}-arcwright");
    let (client, calls) = impersonating(
        &world.env,
        &format!("system:serviceaccount:{ns}:{account}"),
        vec![
            "system:serviceaccounts".into(),
            format!("system:serviceaccounts:{ns}"),
            "system:authenticated".into(),
        ],
    )
    .await;
    world.host_client = Some(client);
    world.shards = 2;
    world.start_host().await;
    world.ready().await;

    // A scaling policy in a ConfigMap, so its watch runs.
    let policies: Api<ConfigMap> = Api::namespaced(world.env.client(), &ns);
    let wasm = arcwright::policy::bundled::find(arcwright::policy::PolicyKind::Scaling, "buffered")
        .unwrap()
        .wasm;
    policies
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "scaling"},
                "binaryData": {"policy.wasm": k8s_openapi::ByteString(wasm.to_vec())},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    world
        .create_set_with(
            0,
            3,
            json!({"configMapRef": {"name": "scaling"}, "settings": {"idle": 0}}),
        )
        .await;
    world.listening().await;
    world.run_jobs(4, Duration::from_millis(300)).await;
    world.settled_at(0).await;

    // The hold API, called by someone with a token: reviewed, then refused.
    let token = common::service_account_token(world.env.client(), &ns, "someone").await;
    let hold = reqwest::Client::new()
        .post(format!(
            "{}/api/v1/namespaces/{ns}/ephemeralrunners/absent/hold",
            world.base
        ))
        .bearer_auth(token)
        .json(&json!({"duration": "10m"}))
        .send()
        .await
        .unwrap();
    assert_eq!(hold.status(), 403, "{:?}", hold.text().await);

    world.delete_set().await;
    world.stop_host().await;
    assert_nothing_leaked(&world.ledger(), 0);

    let called = calls.lock().unwrap().clone();
    let granted = granted();
    let all: BTreeSet<&Call> = granted.values().flatten().collect();
    let refused: Vec<&Call> = called.iter().filter(|c| !all.contains(c)).collect();
    assert!(
        refused.is_empty(),
        "calls the rules do not grant (RBAC let them through some other rule?): {refused:?}"
    );
    let allowed: BTreeMap<Call, Uncalled> = GRANTED_NOT_CALLED
        .iter()
        .map(|&(g, r, v, uncalled, _)| ((g.into(), r.into(), v.into()), uncalled))
        .collect();
    let unused: Vec<&&Call> = all
        .iter()
        .filter(|c| !called.contains(**c) && !allowed.contains_key(**c))
        .collect();
    assert!(
        unused.is_empty(),
        "granted but never called (trim charts/arcwright/rbac/rules.yaml, or list why in \
         GRANTED_NOT_CALLED): {unused:?}\ncalled: {called:?}"
    );
    // Only a call the scenario cannot make is stale once made; a racy one
    // passes either way.
    let stale: Vec<&Call> = allowed
        .iter()
        .filter(|&(call, &uncalled)| uncalled == Uncalled::Never && called.contains(call))
        .map(|(call, _)| call)
        .collect();
    assert!(stale.is_empty(), "called after all: {stale:?}");
}
