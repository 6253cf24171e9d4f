//! The EphemeralRunner controller against the real API server, the fake
//! Actions service and the runner simulator: one test per behaviour, named
//! after it.
//!
//! Orderings ("the registration is removed before the pod is deleted") are
//! checked at the moment the later event is observed, from a watch, never by
//! sleeping and looking.

mod common;

use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arcwright::actions::{
    ActionsClient, ConfigUrl, Credentials, JitRunnerSetting, RunnerScaleSet, Secret as Token,
};
use arcwright::api::{DebugSpec, SecretKeyRef, SlackSpec};
use arcwright::api::{
    EphemeralRunner, EphemeralRunnerPhase, EphemeralRunnerSpec, EphemeralRunnerStatus,
    RunnerRenewal, annotations::RENEWAL as RENEWAL_ANNOTATION, ephemeral_runner::RunnerCondition,
};
use arcwright::controllers::ephemeral_runner::{
    self, Config, Dependencies, SlackConfig, plan::Settings,
};
use arcwright::controllers::kit::Synced;
use arcwright::controllers::metrics::ControllerMetrics;
use arcwright::controllers::metrics::RunnerLabels;
use arcwright::credentials::ActionsClients;
use arcwright::debug::HOLD_UNTIL_ANNOTATION;
use arcwright::debug::hold::format_hold_until;
use arcwright::policy::loader::PolicyLoader;
use arcwright::policy::reporter::TracingReporter;
use arcwright::policy::{EngineConfig, PolicyEngine};
use arcwright::unregistration::PoolConfig;
use arcwright_harness::{TcpRelay, TestEnv, eventually, eventually_explained};
use fake_actions::{
    Endpoint, FakeActions, FakeConfig, Fault, FaultKind, JobOutcome, JobPhase, JobSpec,
};
use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::{
    Container, Event, Pod, PodSpec, Secret, SecurityContext, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use runner_simulator::{Rule, Scenario, Simulator, SimulatorConfig, Stage, Step};
use serde::de::DeserializeOwned;
use serde_json::json;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(60);

/// The EphemeralRunnerSet the tests' runners are made the runners of (no
/// controller serves it): the runner controller registers only a runner
/// its set owns.
const SET: &str = "set";

/// Fast versions of the production knobs.
fn fast_settings() -> Settings {
    Settings {
        failure_limit: 5,
        backoff_base: Duration::from_millis(200),
        backoff_max: Duration::from_secs(1),
        registration_timeout: Duration::from_secs(600),
        terminating_timeout: Duration::from_secs(600),
        removal_recheck: Duration::from_secs(5),
        removal_retry: Duration::from_secs(1),
        result_wait: Duration::from_secs(10),
    }
}

/// A namespace with the CRDs, the GitHub Secret, a scale set in the fake,
/// the simulator, and the controller.
struct World {
    env: TestEnv,
    fake: FakeActions,
    actions: ActionsClient,
    scale_set_id: i64,
    sim: Simulator,
    shutdown: CancellationToken,
    controller: Option<tokio::task::JoinHandle<()>>,
    settings: Settings,
    metrics: ControllerMetrics,
    slack: SlackConfig,
    /// The running controller's policy loader.
    loader: Option<PolicyLoader>,
    /// The client the controller talks to the API server with, when not
    /// the test's own (one through a relay that counts what it is sent).
    controller_client: Option<kube::Client>,
    /// The runners "made by the set controller", as a process's set
    /// controller hands them to the runner controller.
    made: arcwright::controllers::kit::made::MadeRunners,
}

impl World {
    async fn new(name: &str, settings: Settings) -> World {
        World::with_slack(name, settings, SlackConfig::default()).await
    }

    async fn with_slack(name: &str, settings: Settings, slack: SlackConfig) -> World {
        let env = TestEnv::new(name).await;
        common::install_crds(env.client()).await;
        let fake = FakeActions::start(FakeConfig::default()).await.unwrap();
        common::github_secret(env.client(), env.namespace(), fake.pat()).await;
        let actions = ActionsClient::new(
            ConfigUrl::parse(&fake.org_url("octo")).unwrap(),
            Credentials::Token(Token::new(fake.pat())),
            common::fast_client_options(),
        )
        .unwrap();
        let set = actions
            .create_runner_scale_set(&RunnerScaleSet::new("linux", 1, &[]))
            .await
            .unwrap();
        let sim = Simulator::start(
            env.client(),
            fake.url(),
            SimulatorConfig::namespaced(env.namespace()),
        )
        .unwrap();
        let mut world = World {
            env,
            fake,
            actions,
            scale_set_id: set.id,
            sim,
            shutdown: CancellationToken::new(),
            controller: None,
            settings,
            metrics: ControllerMetrics::default(),
            slack,
            loader: None,
            controller_client: None,
            made: Default::default(),
        };
        world.start_controller();
        world
    }

    fn start_controller(&mut self) {
        let client = self
            .controller_client
            .clone()
            .unwrap_or_else(|| self.env.client());
        let loader = PolicyLoader::new(
            PolicyEngine::new(EngineConfig::default()).unwrap(),
            Some(client.clone()),
        );
        self.loader = Some(loader.clone());
        let deps = Dependencies {
            client: client.clone(),
            clients: ActionsClients::new(client.clone(), common::fast_client_options()),
            loader,
            reporter: Arc::new(TracingReporter::default()),
            metrics: self.metrics.clone(),
            unregistration: Default::default(),
            shards: arcwright::sharding::Shards::single(),
            backlogs: Default::default(),
            status_budget: Default::default(),
            made_runners: self.made.clone(),
        };
        let config = Config {
            namespace: Some(self.env.namespace().to_string()),
            settings: self.settings.clone(),
            pool: PoolConfig {
                workers: 4,
                retry_delay: Duration::from_millis(300),
                max_idle_wait: Duration::from_secs(1),
            },
            error_retry: Duration::from_millis(300),
            slack: self.slack.clone(),
            ..Config::default()
        };
        self.shutdown = CancellationToken::new();
        self.controller = Some(tokio::spawn(ephemeral_runner::run(
            deps,
            config,
            self.shutdown.clone(),
            Synced::default(),
        )));
    }

    /// Stops the controller the way a crash does: mid-flight, nothing
    /// finished on the way out.
    fn crash_controller(&mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.controller.take() {
            task.abort();
        }
    }

    fn runners(&self) -> Api<EphemeralRunner> {
        Api::namespaced(self.env.client(), self.env.namespace())
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.env.client(), self.env.namespace())
    }

    fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.env.client(), self.env.namespace())
    }

    async fn create_runner(&self, name: &str) -> EphemeralRunner {
        self.create_runner_with(name, |_| {}).await
    }

    async fn create_runner_with(
        &self,
        name: &str,
        customise: impl FnOnce(&mut EphemeralRunnerSpec),
    ) -> EphemeralRunner {
        let mut spec = EphemeralRunnerSpec {
            github_config_url: self.fake.org_url("octo"),
            github_config_secret: "github-auth".into(),
            runner_scale_set_id: self.scale_set_id,
            spec: PodSpec {
                restart_policy: Some("Never".into()),
                containers: vec![Container {
                    name: "runner".into(),
                    image: Some("ghcr.io/actions/actions-runner:latest".into()),
                    ..Container::default()
                }],
                ..PodSpec::default()
            },
            ..EphemeralRunnerSpec::default()
        };
        customise(&mut spec);
        let runner = common::owned_by_a_set(
            self.env.client(),
            self.env.namespace(),
            SET,
            EphemeralRunner::new(name, spec),
        )
        .await;
        self.runners()
            .create(&PostParams::default(), &runner)
            .await
            .unwrap()
    }

    /// Enqueues jobs for the scale set and acquires them, as a listener
    /// would, so the next runners that come online take them.
    async fn acquire_jobs(&self, spec: JobSpec) {
        let ids = self.fake.control().enqueue_jobs(spec);
        let session = self
            .actions
            .create_message_session(self.scale_set_id, "test-listener")
            .await
            .unwrap();
        let ids: Vec<i64> = ids.into_iter().map(|i| i as i64).collect();
        let acquired = session.acquire_jobs(&ids).await.unwrap();
        assert_eq!(acquired.len(), ids.len());
        session.close().await.unwrap();
    }

    /// Waits until the runner satisfies `done`, or panics with its last state.
    async fn wait_runner(
        &self,
        name: &str,
        what: &str,
        done: impl Fn(&EphemeralRunner) -> bool,
    ) -> EphemeralRunner {
        let runners = self.runners();
        let last = Mutex::new(None);
        eventually_explained(
            format!("{name} {what}"),
            WAIT,
            || async {
                let runner = runners.get_opt(name).await.unwrap();
                let done = runner.clone().filter(|r| done(r));
                *last.lock().unwrap() = runner;
                done
            },
            || format!("last seen: {:#?}", last.lock().unwrap()),
        )
        .await
    }

    /// Deletes the runner as a user (or its set) would, and waits until its
    /// finalizer let it go.
    /// Creates `name` with a `maxIdleAge` of 3 s and no job for it, and
    /// waits until it runs; its registration id.
    async fn idle_runner_with_max_idle_age(&self, name: &str) -> i64 {
        self.create_runner_with(name, |spec| spec.max_idle_age = Some("3s".into()))
            .await;
        let first = self
            .wait_runner(name, "ran", |r| {
                phase(r) == Some(EphemeralRunnerPhase::Running)
            })
            .await;
        first.status.unwrap().runner_id
    }

    async fn delete_and_wait_gone(&self, name: &str) {
        self.runners()
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
        self.wait_gone(name).await;
    }

    async fn wait_gone(&self, name: &str) {
        wait_absent(&self.runners(), name, "deleted").await;
    }

    async fn events(&self, name: &str) -> Vec<(String, String)> {
        let events: Api<Event> = Api::namespaced(self.env.client(), self.env.namespace());
        let all = events.list(&Default::default()).await.unwrap();
        let mut out: Vec<(String, String)> = all
            .items
            .into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(name))
            .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
            .collect();
        // events.k8s.io events show up in the core API with their note as message.
        out.sort();
        out
    }

    /// Waits until a runner works on a job; returns the job's id.
    async fn wait_working(&self) -> u64 {
        let working = |r: &runner_simulator::RunnerRecord| match r.stage {
            Stage::Working { job } => Some(job),
            _ => None,
        };
        let records = self
            .sim
            .wait_until(WAIT, |records| records.iter().any(|r| working(r).is_some()))
            .await
            .expect("the runner took its job");
        records.iter().find_map(working).unwrap()
    }

    /// Writes the runner's status as the listener does on job messages.
    async fn record_job(&self, name: &str, fields: serde_json::Value) {
        self.runners()
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": fields })),
            )
            .await
            .unwrap();
    }

    async fn annotate_hold_until(&self, name: &str, at: Timestamp) {
        self.runners()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {
                    HOLD_UNTIL_ANNOTATION: format_hold_until(at),
                }}})),
            )
            .await
            .unwrap();
    }

    fn ledger(&self) -> fake_actions::Ledger {
        self.fake.control().ledger()
    }
}

impl Drop for World {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

fn phase(r: &EphemeralRunner) -> Option<EphemeralRunnerPhase> {
    r.status.as_ref().and_then(|s| s.phase)
}

/// Waits until `api` has no object named `name`.
async fn wait_absent<K>(api: &Api<K>, name: &str, what: &str)
where
    K: Clone + DeserializeOwned + Debug,
{
    eventually(format!("{name} {what}"), WAIT, || async {
        api.get_opt(name).await.unwrap().is_none().then_some(())
    })
    .await;
}

/// Watches the runner's pod; returns, for the first update that shows the
/// pod deleted or being deleted, what `check` said at that moment.
async fn at_pod_deletion<T: Send + 'static>(
    pods: Api<Pod>,
    name: &str,
    check: impl Fn() -> T + Send + 'static,
) -> tokio::task::JoinHandle<T> {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let handle = tokio::spawn(async move {
        let mut stream = watcher::watcher(pods, config).boxed();
        let mut ready = Some(ready_tx);
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::InitDone) => {
                    if let Some(tx) = ready.take() {
                        let _ = tx.send(());
                    }
                }
                Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod))
                    if pod.metadata.deletion_timestamp.is_some() =>
                {
                    return check();
                }
                Ok(watcher::Event::Delete(_)) => return check(),
                _ => {}
            }
        }
        panic!("the pod watch ended");
    });
    let _ = ready_rx.await;
    handle
}

#[tokio::test]
async fn jit_config_to_secret_to_pod_to_running_to_succeeded() {
    let world = World::new("jit-to-succeeded", fast_settings()).await;
    world
        .acquire_jobs(JobSpec::new(1, &[]).lasting(Duration::from_secs(2)))
        .await;
    let created = world.create_runner("r-ok").await;

    let running = world
        .wait_runner("r-ok", "ran", |r| {
            phase(r) == Some(EphemeralRunnerPhase::Running)
        })
        .await;
    let status = running.status.clone().unwrap();
    assert!(status.runner_id > 0);
    assert_eq!(status.runner_name.as_deref(), Some("r-ok"));
    let registered = world.fake.control().runners();
    assert!(
        registered
            .iter()
            .any(|r| r.id as i64 == status.runner_id && r.name == "r-ok")
    );

    // The Secret holds the config and is owned by the runner.
    let secret = world.secrets().get("r-ok").await.unwrap();
    let owner = &secret.metadata.owner_references.clone().unwrap()[0];
    assert_eq!(owner.uid, created.metadata.uid.clone().unwrap());
    assert!(secret.data.unwrap().contains_key("jitToken"));

    // The pod reads it from the Secret: never a literal in the spec.
    let pod = world.pods().get("r-ok").await.unwrap();
    let env = pod.spec.unwrap().containers[0].env.clone().unwrap();
    let jit = env
        .iter()
        .find(|e| e.name == "ACTIONS_RUNNER_INPUT_JITCONFIG")
        .unwrap();
    assert!(jit.value.is_none());
    assert_eq!(
        jit.value_from
            .as_ref()
            .unwrap()
            .secret_key_ref
            .as_ref()
            .unwrap()
            .name,
        "r-ok"
    );
    assert_eq!(
        pod.metadata.owner_references.unwrap()[0].uid,
        created.metadata.uid.unwrap()
    );

    let done = world
        .wait_runner("r-ok", "succeeded and cleaned up", |r| {
            phase(r) == Some(EphemeralRunnerPhase::Succeeded)
        })
        .await;
    assert_eq!(done.status.as_ref().unwrap().exit_code, Some(0));
    wait_absent(&world.pods(), "r-ok", "pod deleted").await;
    assert_eq!(world.ledger().jobs_succeeded, 1);
    // The Secret stays for a renewal to write over (its registration is
    // gone, so its config is good for nothing), and goes with the runner.
    assert!(world.secrets().get_opt("r-ok").await.unwrap().is_some());
    world.delete_and_wait_gone("r-ok").await;
    assert!(world.secrets().get_opt("r-ok").await.unwrap().is_none());
    assert_eq!(world.ledger().still_registered, 0);
    // Nothing in status or events carries the config.
    let text = serde_json::to_string(&done).unwrap() + &format!("{:?}", world.events("r-ok").await);
    assert!(!text.contains("jitToken\":\""), "{text}");
}

/// Anyone who may write Secrets in a namespace can label them as
/// arcwright's. The controller watches its JIT config Secrets by that label,
/// so it watches metadata only: eight labelled Secrets of a mebibyte each
/// cost the controller's connection a few KiB, not the 8 MiB a watch of
/// whole Secrets lists (and would keep). The runner's lifecycle, whose end
/// waits on the watch seeing its Secret deleted, still runs.
#[tokio::test]
async fn labelled_secrets_data_never_reaches_the_controller() {
    use kube::api::ObjectMeta;

    const SECRETS: usize = 8;
    const SIZE: usize = 1 << 20;
    let mut world = World::new("secret-metadata-only", fast_settings()).await;
    world.crash_controller();
    for n in 0..SECRETS {
        let filler = Secret {
            metadata: ObjectMeta {
                name: Some(format!("tenant-{n}")),
                labels: Some([("app.kubernetes.io/managed-by".into(), "arcwright".into())].into()),
                ..ObjectMeta::default()
            },
            data: Some(
                [(
                    "filler".to_string(),
                    k8s_openapi::ByteString(vec![b'x'; SIZE - 4096]),
                )]
                .into(),
            ),
            ..Secret::default()
        };
        world
            .secrets()
            .create(&PostParams::default(), &filler)
            .await
            .unwrap();
    }
    let plane = world.env.control_plane();
    let relay = TcpRelay::start(plane.address()).await.unwrap();
    world.controller_client = Some(plane.client_via(relay.address()));
    world.start_controller();

    world
        .acquire_jobs(JobSpec::new(1, &[]).lasting(Duration::from_millis(300)))
        .await;
    world.create_runner("r-meta").await;
    world
        .wait_runner("r-meta", "succeeded", |r| {
            phase(r) == Some(EphemeralRunnerPhase::Succeeded)
        })
        .await;
    // The finalizer goes once the Secret watch has seen the JIT Secret
    // deleted: the watch listed (the tenant's Secrets among what it
    // listed) before it could see that.
    world.delete_and_wait_gone("r-meta").await;
    let delivered = relay.delivered();
    assert!(
        delivered < (SECRETS * SIZE / 4) as u64,
        "the controller was sent {delivered} bytes: the labelled Secrets' data reached it"
    );
    assert_eq!(world.ledger().still_registered, 0);
}

#[tokio::test]
async fn a_renewed_runner_runs_its_next_job_on_a_new_registration_and_pod() {
    let world = World::new("renewed-runner", fast_settings()).await;
    let job = || JobSpec::new(1, &[]).lasting(Duration::from_millis(300));
    world.acquire_jobs(job()).await;
    world.create_runner("r-again").await;
    let gone = |r: &EphemeralRunner| {
        r.status
            .as_ref()
            .and_then(|s| s.condition("Registered"))
            .is_some_and(|c| c.status == "False")
    };
    let first = world
        .wait_runner("r-again", "succeeded, its registration gone", |r| {
            phase(r) == Some(EphemeralRunnerPhase::Succeeded) && gone(r)
        })
        .await;
    let first_id = first.status.as_ref().unwrap().runner_id;
    let first_secret = world.secrets().get("r-again").await.unwrap();

    // Renewed as its set renews it: the whole status written anew.
    world.acquire_jobs(job()).await;
    let renewed = EphemeralRunner {
        status: Some(EphemeralRunnerStatus {
            renewal: Some(RunnerRenewal {
                count: 1,
                patch_id: 2,
                set_generation: 1,
                renewed_at: Time(jiff::Timestamp::now()),
                previous: None,
            }),
            ..EphemeralRunnerStatus::default()
        }),
        ..first.clone()
    };
    world
        .runners()
        .replace_status("r-again", &PostParams::default(), &renewed)
        .await
        .unwrap();
    let second = world
        .wait_runner("r-again", "succeeded again", |r| {
            phase(r) == Some(EphemeralRunnerPhase::Succeeded)
                && gone(r)
                && r.status.as_ref().is_some_and(|s| s.renewals() == 1)
        })
        .await;
    let status = second.status.unwrap();
    assert_ne!(status.runner_id, first_id, "a registration of its own");
    assert_eq!(second.metadata.uid, first.metadata.uid, "the same runner");

    // The Secret was written over, not deleted and created: the same
    // object, holding the new registration and saying for which renewal.
    let secret = world.secrets().get("r-again").await.unwrap();
    assert_eq!(secret.metadata.uid, first_secret.metadata.uid);
    assert_eq!(
        secret
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(RENEWAL_ANNOTATION))
            .map(String::as_str),
        Some("1")
    );
    let data = secret.data.unwrap();
    assert_eq!(
        data["runnerId"].0,
        status.runner_id.to_string().into_bytes()
    );
    // Two pods, one after the other, each with its own registration.
    let runs = world.sim.runners();
    assert_eq!(runs.len(), 2, "{runs:?}");
    let ledger = world.ledger();
    assert_eq!(
        (
            ledger.jobs_succeeded,
            ledger.self_deregistered,
            ledger.still_registered
        ),
        (2, 2, 0),
        "{ledger:?}"
    );
}

#[tokio::test]
async fn a_clean_exit_costs_no_removal_call() {
    let world = World::new("clean-exit-no-removal", fast_settings()).await;
    world
        .acquire_jobs(JobSpec::new(1, &[]).lasting(Duration::from_millis(300)))
        .await;
    world.create_runner("r-clean").await;
    world
        .wait_runner("r-clean", "recorded its registration gone", |r| {
            r.status
                .as_ref()
                .and_then(|s| s.condition("Registered"))
                .is_some_and(|c| c.status == "False")
        })
        .await;
    world.delete_and_wait_gone("r-clean").await;
    let ledger = world.ledger();
    assert_eq!(ledger.self_deregistered, 1);
    assert_eq!(ledger.still_registered, 0);
    assert_eq!(
        world
            .fake
            .control()
            .counters()
            .calls(Endpoint::RemoveRunner),
        0,
        "a self-deregistered runner costs no removal call"
    );
}

/// A tenant editing a deregistration policy's reference (its ConfigMap,
/// its settings) makes a new one each time; the controller keeps a loaded
/// policy, its ConfigMap watch and its task, only while a runner names it.
#[tokio::test]
async fn a_deregistration_policy_no_runner_names_any_more_goes_with_its_watch() {
    use arcwright::policy::loader::{ConfigMapPolicyRef, PolicyRef};
    use arcwright::policy::{PolicyKind, bundled};
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    let world = World::new("dereg-policy-dropped", fast_settings()).await;
    let wasm = bundled::find(PolicyKind::Deregistration, "exit-code")
        .unwrap()
        .wasm;
    let config_maps: Api<ConfigMap> = Api::namespaced(world.env.client(), world.env.namespace());
    for name in ["dereg-a", "dereg-b"] {
        let module = ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            binary_data: Some([("policy.wasm".to_string(), ByteString(wasm.to_vec()))].into()),
            ..ConfigMap::default()
        };
        config_maps
            .create(&PostParams::default(), &module)
            .await
            .unwrap();
    }
    let naming = |name: &str| {
        let reference = PolicyRef {
            config_map_ref: Some(ConfigMapPolicyRef {
                name: name.into(),
                key: "policy.wasm".into(),
            }),
            ..PolicyRef::default()
        };
        move |spec: &mut EphemeralRunnerSpec| {
            spec.policies.deregistration_policy = Some(reference);
        }
    };
    let loader = world.loader.clone().unwrap();
    // A runner ends, and its verdict loads the policy it names.
    let run_to_verdict = |runner: &'static str, policy: &'static str| {
        let world = &world;
        let naming = &naming;
        async move {
            world
                .acquire_jobs(JobSpec::new(1, &[]).lasting(Duration::from_millis(300)))
                .await;
            world.create_runner_with(runner, naming(policy)).await;
            world
                .wait_runner(runner, "had its verdict", |r| {
                    r.status
                        .as_ref()
                        .and_then(|s| s.condition("Registered"))
                        .is_some_and(|c| c.status == "False")
                })
                .await;
        }
    };
    run_to_verdict("r-a", "dereg-a").await;
    assert_eq!(loader.configmap_watches(), 1, "dereg-a is followed");
    world.delete_and_wait_gone("r-a").await;
    // r-b's creation reaches the controller's watch after r-a's deletion,
    // so when r-b's verdict loads dereg-b, nothing names dereg-a.
    run_to_verdict("r-b", "dereg-b").await;
    assert_eq!(
        loader.configmap_watches(),
        1,
        "dereg-a went with its last runner; only dereg-b is followed"
    );
}

#[tokio::test]
async fn a_failed_runners_registration_is_removed_before_its_pod_is_deleted() {
    let settings = Settings {
        failure_limit: 1,
        ..fast_settings()
    };
    let world = World::new("failed-removed-before-pod", settings).await;
    world.sim.add_rule(Rule::next(1, Scenario::fail()));
    // The removal is slow: the pod must wait for it.
    world.fake.control().inject(Fault::new(
        Endpoint::RemoveRunner,
        FaultKind::delay(Duration::from_secs(2)),
        1,
    ));
    let fake = world.fake.control();
    let watch = at_pod_deletion(world.pods(), "r-fail", move || fake.ledger()).await;
    world.create_runner("r-fail").await;
    let ledger_at_deletion = tokio::time::timeout(WAIT, watch).await.unwrap().unwrap();
    assert_eq!(
        ledger_at_deletion.removed_by_api, 1,
        "the registration was removed before the pod was deleted"
    );
    let failed = world
        .wait_runner("r-fail", "failed", |r| {
            phase(r) == Some(EphemeralRunnerPhase::Failed)
        })
        .await;
    assert_eq!(failed.status.unwrap().exit_code, Some(1));
    assert_eq!(world.ledger().still_registered, 0);
}

#[tokio::test]
async fn job_still_running_keeps_the_pod() {
    let world = World::new("job-still-running", fast_settings()).await;
    world
        .acquire_jobs(JobSpec::new(1, &[]).lasting(Duration::from_secs(3)))
        .await;
    world.create_runner("r-busy").await;
    world.wait_working().await;
    let fake = world.fake.control();
    let watch = at_pod_deletion(world.pods(), "r-busy", move || fake.jobs()).await;
    world
        .runners()
        .delete("r-busy", &DeleteParams::default())
        .await
        .unwrap();
    let jobs_at_deletion = tokio::time::timeout(WAIT, watch).await.unwrap().unwrap();
    assert_eq!(
        jobs_at_deletion[0].phase,
        JobPhase::Finished,
        "the pod stayed until its job was over"
    );
    world.wait_gone("r-busy").await;
    let ledger = world.ledger();
    assert!(ledger.remove_calls_refused_job_running >= 1, "{ledger:?}");
    assert_eq!(ledger.jobs_succeeded, 1);
    assert_eq!(
        ledger.jobs_cancelled_runner_vanished, 0,
        "the job was never cancelled"
    );
    assert_eq!(ledger.still_registered, 0);
}

#[tokio::test]
async fn registration_timeout_recreates() {
    let settings = Settings {
        registration_timeout: Duration::from_secs(2),
        ..fast_settings()
    };
    let world = World::new("registration-timeout", settings).await;
    world
        .sim
        .add_rule(Rule::next(1, Scenario::never_registers()));
    world.create_runner("r-silent").await;
    let records = world
        .sim
        .wait_until(WAIT, |records| {
            records.len() >= 2 && records[1].stage == Stage::Connected
        })
        .await
        .expect("a second pod came up and connected");
    assert_eq!(records[0].stage, Stage::Deleted);
    assert_ne!(records[0].uid, records[1].uid);
    let runner = world.runners().get("r-silent").await.unwrap();
    let status = runner.status.unwrap();
    assert_eq!(status.failures.len(), 1);
    let ledger = world.ledger();
    assert_eq!(ledger.runners_created, 2, "registered again");
    assert_eq!(
        ledger.removed_by_api, 1,
        "the silent registration was removed"
    );
    assert!(
        world
            .events("r-silent")
            .await
            .iter()
            .any(|(reason, _)| reason == "RegistrationTimeout")
    );
}

#[tokio::test]
async fn a_warm_up_longer_than_the_registration_timeout_is_not_a_failure() {
    let settings = Settings {
        registration_timeout: Duration::from_secs(2),
        ..fast_settings()
    };
    let world = World::new("registration-warm-up", settings).await;
    // Init containers that run for twice the timeout (seed 003's cache
    // fill), then a runner that connects at once.
    world.sim.add_rule(Rule::next(
        1,
        Scenario::succeed().with_init_delay(Duration::from_secs(4)),
    ));
    world.create_runner("r-warm").await;
    let records = world
        .sim
        .wait_until(WAIT, |records| {
            records.iter().any(|r| r.stage == Stage::Connected)
        })
        .await
        .expect("a runner connected");
    // The pod that connected is the first and only one: timed from pod
    // creation, it would have been deleted during its warm-up.
    assert_eq!(records.len(), 1, "{records:?}");
    assert!(records[0].when(Step::Initialising).is_some(), "{records:?}");
    let runner = world
        .wait_runner("r-warm", "seen online", |r| {
            r.status
                .as_ref()
                .is_some_and(|s| s.is_true(RunnerCondition::RunnerOnline) == Some(true))
        })
        .await;
    let status = runner.status.unwrap();
    assert!(status.failures.is_empty(), "{:?}", status.failures);
    assert_eq!(world.ledger().runners_created, 1);
}

/// A ValidatingAdmissionPolicy bound to the world's namespace: what
/// `rules` match is refused with `message` unless `expression` holds. The
/// API server plays the failure of one write this way, as a crash or an
/// outage at that point would leave it.
struct AdmissionPolicy {
    name: String,
    message: &'static str,
    policies: Api<ValidatingAdmissionPolicy>,
    bindings: Api<ValidatingAdmissionPolicyBinding>,
}

impl AdmissionPolicy {
    async fn create(
        world: &World,
        what: &str,
        rules: serde_json::Value,
        expression: &str,
        message: &'static str,
    ) -> Self {
        let name = format!("{what}-{}", world.env.namespace());
        let policy = AdmissionPolicy {
            name,
            message,
            policies: Api::all(world.env.client()),
            bindings: Api::all(world.env.client()),
        };
        let spec = json!({
            "metadata": {"name": policy.name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": rules},
                "validations": [{"expression": expression, "message": message}],
            },
        });
        policy
            .policies
            .create(
                &PostParams::default(),
                &serde_json::from_value(spec).unwrap(),
            )
            .await
            .unwrap();
        let binding = json!({
            "metadata": {"name": policy.name},
            "spec": {
                "policyName": policy.name,
                "validationActions": ["Deny"],
                "matchResources": {"namespaceSelector": {"matchLabels": {
                    "kubernetes.io/metadata.name": world.env.namespace(),
                }}},
            },
        });
        policy
            .bindings
            .create(
                &PostParams::default(),
                &serde_json::from_value(binding).unwrap(),
            )
            .await
            .unwrap();
        policy
    }

    /// Whether `result` is this policy's refusal.
    fn refused<T>(&self, result: &kube::Result<T>) -> bool {
        matches!(result, Err(kube::Error::Api(status)) if status.message.contains(self.message))
    }

    /// A policy takes effect once the API server's admission has loaded
    /// it, a moment after its creation: waits until `probe` (a write the
    /// policy refuses, tried again until it is) is refused, the proof.
    async fn wait_loaded<T, Fut>(&self, mut probe: impl FnMut(u32) -> Fut)
    where
        Fut: std::future::Future<Output = kube::Result<T>>,
    {
        let mut attempt = 0;
        eventually("the admission policy refuses", WAIT, || {
            attempt += 1;
            let tried = probe(attempt);
            async move { self.refused(&tried.await).then_some(()) }
        })
        .await;
    }

    async fn remove(self) {
        let _ = self
            .bindings
            .delete(&self.name, &DeleteParams::default())
            .await;
        let _ = self
            .policies
            .delete(&self.name, &DeleteParams::default())
            .await;
    }
}

#[tokio::test]
async fn a_registration_made_just_before_its_secret_failed_is_found_and_removed_on_deletion() {
    let world = World::new("registration-orphan", fast_settings()).await;
    // The API server refuses the runner's JIT config Secret, as a crash
    // between registering and storing the config would leave it: the
    // service has a registration the runner records nowhere.
    let policy = AdmissionPolicy::create(
        &world,
        "refuse-secrets",
        json!([{
            "apiGroups": [""], "apiVersions": ["v1"],
            "operations": ["CREATE"], "resources": ["secrets"],
        }]),
        "false",
        "no secrets today",
    )
    .await;
    let secrets = world.secrets();
    policy
        .wait_loaded(|attempt| {
            let probe: Secret = serde_json::from_value(json!({
                "metadata": {"name": format!("probe-{attempt}")},
            }))
            .unwrap();
            let secrets = secrets.clone();
            async move { secrets.create(&PostParams::default(), &probe).await }
        })
        .await;
    world.create_runner("r-orphan").await;
    world
        .fake
        .control()
        .wait_until(WAIT, |s| s.ledger.runners_created >= 1)
        .await
        .expect("the runner registered");
    let runner = world.runners().get("r-orphan").await.unwrap();
    assert_eq!(
        runner.status.map(|s| s.runner_id).unwrap_or_default(),
        0,
        "no registration recorded"
    );

    world.delete_and_wait_gone("r-orphan").await;
    let ledger = world.ledger();
    assert_eq!(ledger.still_registered, 0, "nothing leaked: {ledger:?}");
    policy.remove().await;
}

#[tokio::test]
async fn a_recycled_runner_whose_new_registration_was_not_recorded_has_it_removed_on_deletion() {
    let mut world = World::new("recycle-unrecorded", fast_settings()).await;
    // The API server refuses any status write that moves a runner's
    // registration to another, as a crash right after a recycled runner's
    // new Secret would leave it: the status names the removed
    // registration, the Secret the live one. Loaded with no controller
    // running, and proven on a runner nothing else touches.
    world.crash_controller();
    let policy = AdmissionPolicy::create(
        &world,
        "refuse-reregistration",
        json!([{
            "apiGroups": ["arcwright.dev"], "apiVersions": ["*"],
            "operations": ["UPDATE"], "resources": ["ephemeralrunners/status"],
        }]),
        "!has(oldObject.status) || !has(oldObject.status.runnerId) \
         || oldObject.status.runnerId == 0 \
         || (has(object.status.runnerId) && object.status.runnerId == oldObject.status.runnerId)",
        "no new registrations today",
    )
    .await;
    world.create_runner("probe").await;
    let runners = world.runners();
    let status = |id: u32| Patch::Merge(json!({"status": {"runnerId": id}}));
    runners
        .patch_status("probe", &PatchParams::default(), &status(1))
        .await
        .unwrap();
    policy
        .wait_loaded(|attempt| {
            let runners = runners.clone();
            async move {
                runners
                    .patch_status("probe", &PatchParams::default(), &status(attempt + 1))
                    .await
            }
        })
        .await;
    runners
        .delete("probe", &DeleteParams::default())
        .await
        .unwrap();
    world.wait_gone("probe").await;
    world.start_controller();

    let first_id = world.idle_runner_with_max_idle_age("r-idle").await;
    // Recycled past maxIdleAge: the first registration removed, a second
    // made and stored in the Secret, and its status write refused.
    let secrets = world.secrets();
    let second_id = eventually("re-registered, recorded only in the Secret", WAIT, || {
        let secrets = secrets.clone();
        async move {
            let secret = secrets.get_opt("r-idle").await.ok()??;
            let id = ephemeral_runner::resources::read_jit_secret(&secret)?.runner_id;
            (id != first_id).then_some(id)
        }
    })
    .await;
    let runner = world.runners().get("r-idle").await.unwrap();
    assert_eq!(
        runner.status.unwrap().runner_id,
        first_id,
        "the status names the first"
    );
    assert!(
        world
            .fake
            .control()
            .runners()
            .iter()
            .any(|r| r.id == second_id as u64),
        "the second is registered"
    );

    // Deleted so: the Secret's registration is the one removed. (While
    // the policy refuses the status write that records it, the deletion
    // waits; it is lifted once the deletion is asked for.)
    world
        .runners()
        .delete("r-idle", &DeleteParams::default())
        .await
        .unwrap();
    policy.remove().await;
    world.wait_gone("r-idle").await;
    let ledger = world.ledger();
    assert_eq!(ledger.still_registered, 0, "nothing leaked: {ledger:?}");
    assert!(world.fake.control().runners().is_empty());
}

#[tokio::test]
async fn stuck_terminating_pod_force_deleted() {
    let settings = Settings {
        terminating_timeout: Duration::from_secs(2),
        ..fast_settings()
    };
    let world = World::new("stuck-terminating", settings).await;
    world.sim.add_rule(Rule::next(1, Scenario::node_lost()));
    world
        .acquire_jobs(JobSpec::new(1, &[]).lasting(Duration::from_secs(600)))
        .await;
    world.create_runner("r-lost").await;
    // Its node is lost while it works: nothing will confirm its deletion.
    world
        .sim
        .wait_until(WAIT, |records| {
            records.iter().any(|r| r.stage == Stage::NodeLost)
        })
        .await
        .expect("its node was lost");
    world.delete_and_wait_gone("r-lost").await;
    assert!(world.pods().get_opt("r-lost").await.unwrap().is_none());
    let events = world.events("r-lost").await;
    assert!(
        events.iter().any(|(reason, _)| reason == "PodForceDeleted"),
        "{events:?}"
    );
    assert_eq!(world.ledger().still_registered, 0);
}

#[tokio::test]
async fn failure_backoff_and_limit() {
    let settings = Settings {
        failure_limit: 3,
        ..fast_settings()
    };
    let world = World::new("failure-backoff-limit", settings).await;
    world.sim.set_default_scenario(Scenario::fail());
    world.create_runner("r-crash").await;
    let failed = world
        .wait_runner("r-crash", "failed for good", |r| {
            phase(r) == Some(EphemeralRunnerPhase::Failed)
                && r.status
                    .as_ref()
                    .and_then(|s| s.condition("Registered"))
                    .is_some_and(|c| c.status == "False")
        })
        .await;
    let status = failed.status.unwrap();
    assert_eq!(status.reason.as_deref(), Some("TooManyFailures"));
    assert_eq!(status.failures.len(), 3);
    assert_eq!(world.sim.runners().len(), 3, "three pods, one per start");
    let events = world.events("r-crash").await;
    let retries: Vec<_> = events
        .iter()
        .filter(|(r, _)| r == "RunnerPodFailed")
        .collect();
    // Repeats of one reason form a series on the first event (events.k8s.io),
    // so the retries show up as one event.
    assert!(!retries.is_empty(), "{events:?}");
    assert!(
        retries
            .iter()
            .all(|(_, m)| m.contains("recreating the runner in"))
    );
    assert!(
        events
            .iter()
            .any(|(r, m)| r == "RunnerFailed" && m.contains("3 failed starts"))
    );
    eventually_explained(
        "no registration left, and the last pod deleted",
        WAIT,
        || async {
            let pod = world.pods().get_opt("r-crash").await.unwrap();
            (world.ledger().still_registered == 0 && pod.is_none()).then_some(())
        },
        || format!("{:?}", world.ledger()),
    )
    .await;
    let ledger = world.ledger();
    assert_eq!((ledger.runners_created, ledger.removed_by_api), (3, 3));
}

#[tokio::test]
async fn exit_7_gives_outdated() {
    let world = World::new("exit-7-outdated", fast_settings()).await;
    world.sim.set_default_scenario(Scenario::outdated());
    world.create_runner("r-old").await;
    let outdated = world
        .wait_runner("r-old", "became Outdated", |r| {
            phase(r) == Some(EphemeralRunnerPhase::Outdated)
        })
        .await;
    let status = outdated.status.unwrap();
    assert_eq!(status.exit_code, Some(7));
    assert_eq!(status.reason.as_deref(), Some("Outdated"));
    assert_eq!(
        world.sim.runners().len(),
        1,
        "an outdated runner is not recreated"
    );
    eventually_explained(
        "the outdated runner's registration removed",
        WAIT,
        || async { (world.ledger().still_registered == 0).then_some(()) },
        || format!("{:?}", world.ledger()),
    )
    .await;
}

#[tokio::test]
async fn a_pod_the_api_server_refuses_fails_the_runner_and_leaks_no_registration() {
    let world = World::new("invalid-pod", fast_settings()).await;
    // A mount of a volume the pod does not have: the pod-validation
    // policy has nothing against it, the API server refuses the pod.
    world
        .create_runner_with("r-invalid", |spec| {
            spec.spec.containers[0].volume_mounts = Some(vec![VolumeMount {
                name: "absent".into(),
                mount_path: "/absent".into(),
                ..VolumeMount::default()
            }]);
        })
        .await;
    let failed = world
        .wait_runner("r-invalid", "failed, its registration gone", |r| {
            phase(r) == Some(EphemeralRunnerPhase::Failed) && registration_gone(r)
        })
        .await;
    let status = failed.status.unwrap();
    assert_eq!(status.reason.as_deref(), Some("InvalidPod"));
    assert!(
        status
            .message
            .as_deref()
            .is_some_and(|m| m.starts_with("the runner pod is invalid: ")),
        "{status:?}"
    );
    assert_ne!(status.runner_id, 0, "its registration is on record");
    let events = world.events("r-invalid").await;
    assert!(
        events.iter().any(|(reason, _)| reason == "InvalidPod"),
        "{events:?}"
    );
    wait_absent(&world.secrets(), "r-invalid", "Secret deleted").await;
    assert!(world.sim.runners().is_empty(), "no pod was ever made");
    assert_eq!(world.ledger().still_registered, 0);
}

#[tokio::test]
async fn a_runner_its_set_did_not_make_is_never_registered() {
    let world = World::new("not-owned", fast_settings()).await;
    let spec = world.create_runner("r-owned").await.spec;
    // Written by hand: no set, a set that does not exist, and a set's name
    // with another object's uid.
    let mut bogus = common::owned_by_a_set(
        world.env.client(),
        world.env.namespace(),
        SET,
        EphemeralRunner::new("r-bogus-uid", spec.clone()),
    )
    .await;
    bogus.metadata.owner_references.as_mut().unwrap()[0].uid =
        "00000000-0000-0000-0000-000000000000".into();
    let mut absent = bogus.clone();
    absent.metadata.name = Some("r-absent-set".into());
    absent.metadata.owner_references.as_mut().unwrap()[0].name = "absent".into();
    absent.metadata.labels.as_mut().unwrap().insert(
        arcwright::api::labels::EPHEMERAL_RUNNER_SET.into(),
        "absent".into(),
    );
    let orphan = EphemeralRunner::new("r-orphan", spec);
    for runner in [&bogus, &absent, &orphan] {
        world
            .runners()
            .create(&PostParams::default(), runner)
            .await
            .unwrap();
    }
    for (name, says) in [
        ("r-orphan", "no EphemeralRunnerSet controls the runner"),
        ("r-absent-set", "does not exist"),
        ("r-bogus-uid", "its uid differs"),
    ] {
        let failed = world
            .wait_runner(name, "failed, not its set's", |r| {
                phase(r) == Some(EphemeralRunnerPhase::Failed)
            })
            .await;
        let status = failed.status.unwrap();
        assert_eq!(status.reason.as_deref(), Some("NotOwned"), "{name}");
        assert!(
            status.message.as_deref().is_some_and(|m| m.contains(says)),
            "{name}: {status:?}"
        );
        assert_eq!(status.runner_id, 0, "{name} was never registered");
        let events = world.events(name).await;
        assert!(
            events.iter().any(|(reason, _)| reason == "NotOwned"),
            "{name}: {events:?}"
        );
        assert!(world.secrets().get_opt(name).await.unwrap().is_none());
    }
    // The set's own runner runs beside them, and it is the only one the
    // service and the cluster ever saw.
    world
        .wait_runner("r-owned", "running", |r| {
            phase(r) == Some(EphemeralRunnerPhase::Running)
        })
        .await;
    let pods: Vec<String> = world.sim.runners().into_iter().map(|r| r.pod).collect();
    assert!(
        !pods.is_empty() && pods.iter().all(|pod| pod.starts_with("r-owned")),
        "{pods:?}"
    );
    assert_eq!(world.ledger().still_registered, 1);
}

/// A runner the set controller of the same process made is known to be its
/// set's from the create's answer, handed over in memory: its admission
/// reads nothing. Proven with a runner whose named set does not exist at
/// all, which a read would refuse: recorded as made, it is registered and
/// runs; its twin, not recorded, is refused.
#[tokio::test]
async fn a_runner_its_set_made_in_this_process_is_admitted_without_a_read() {
    let mut world = World::new("made-here", fast_settings()).await;
    let spec = world.create_runner("r-first").await.spec;
    world.crash_controller();
    let owned = common::owned_by_a_set(
        world.env.client(),
        world.env.namespace(),
        SET,
        EphemeralRunner::new("r-made", spec),
    )
    .await;
    let mut made = owned.clone();
    let missing_set = "22222222-0000-0000-0000-000000000000";
    made.metadata.owner_references.as_mut().unwrap()[0].uid = missing_set.into();
    let mut twin = made.clone();
    twin.metadata.name = Some("r-twin".into());
    let made = world
        .runners()
        .create(&PostParams::default(), &made)
        .await
        .unwrap();
    world
        .runners()
        .create(&PostParams::default(), &twin)
        .await
        .unwrap();
    world
        .made
        .made(made.metadata.uid.as_deref().unwrap(), missing_set);
    world.start_controller();

    world
        .wait_runner("r-made", "running", |r| {
            phase(r) == Some(EphemeralRunnerPhase::Running)
        })
        .await;
    let twin = world
        .wait_runner("r-twin", "failed, not its set's", |r| {
            phase(r) == Some(EphemeralRunnerPhase::Failed)
        })
        .await;
    assert_eq!(
        twin.status.unwrap().reason.as_deref(),
        Some("NotOwned"),
        "only the recorded pair skips the read"
    );
    assert!(world.made.is_empty(), "the record was taken at admission");
}

#[tokio::test]
async fn a_runner_whose_pod_its_policy_refuses_is_never_registered() {
    let world = World::new("pod-refused", fast_settings()).await;
    // A privileged runner: the template its set was judged by would have
    // been refused, and so is this one, written past the set.
    world
        .create_runner_with("r-privileged", |spec| {
            spec.spec.containers[0].security_context = Some(SecurityContext {
                privileged: Some(true),
                ..SecurityContext::default()
            });
        })
        .await;
    let failed = world
        .wait_runner("r-privileged", "failed, its pod refused", |r| {
            phase(r) == Some(EphemeralRunnerPhase::Failed)
        })
        .await;
    let status = failed.status.unwrap();
    assert_eq!(status.reason.as_deref(), Some("PodRefused"));
    assert!(
        status.message.as_deref().is_some_and(|m| m
            .starts_with("the pod-validation policy default refused")
            && m.contains("privileged")),
        "{status:?}"
    );
    assert_eq!(status.runner_id, 0);
    assert!(
        world
            .secrets()
            .get_opt("r-privileged")
            .await
            .unwrap()
            .is_none()
    );

    // A policy that never loads (its ConfigMap does not exist) judges
    // nothing and lets nothing through: the runner waits, saying why.
    world
        .create_runner_with("r-unjudged", |spec| {
            spec.policies.pod_validation_policy = Some(
                serde_json::from_value(json!({"configMapRef": {"name": "absent-checks"}})).unwrap(),
            );
        })
        .await;
    let said = eventually("the runner says its policy cannot judge", WAIT, || async {
        let events = world.events("r-unjudged").await;
        events
            .into_iter()
            .find(|(reason, _)| reason == "PodValidationUnavailable")
    })
    .await;
    assert!(said.1.contains("absent-checks"), "{said:?}");
    let runner = world.runners().get("r-unjudged").await.unwrap();
    let status = runner.status.unwrap_or_default();
    assert_eq!(status.runner_id, 0);
    assert_ne!(status.phase, Some(EphemeralRunnerPhase::Failed));
    assert!(
        world
            .secrets()
            .get_opt("r-unjudged")
            .await
            .unwrap()
            .is_none()
    );
    assert!(world.sim.runners().is_empty(), "no pod was ever made");
    assert_eq!(world.ledger().still_registered, 0);
}

#[tokio::test]
async fn deleting_a_runner_whose_registration_is_already_gone() {
    let world = World::new("delete-registration-gone", fast_settings()).await;
    world.sim.set_default_scenario(Scenario::never_registers());
    world.create_runner("r-orphan").await;
    let running = world
        .wait_runner("r-orphan", "ran", |r| {
            phase(r) == Some(EphemeralRunnerPhase::Running)
        })
        .await;
    // The service forgets the runner behind the controller's back.
    world
        .actions
        .remove_runner(running.status.unwrap().runner_id)
        .await
        .unwrap();
    world.delete_and_wait_gone("r-orphan").await;
    assert!(world.pods().get_opt("r-orphan").await.unwrap().is_none());
    assert!(world.secrets().get_opt("r-orphan").await.unwrap().is_none());
    assert_eq!(world.ledger().remove_calls_for_absent_runners, 1);
}

#[tokio::test]
async fn host_restarted_between_jit_config_and_pod_leaks_no_registration() {
    let mut world = World::new("restart-leaks-nothing", fast_settings()).await;
    // A host registered the runner and died before writing its Secret.
    world.crash_controller();
    world
        .actions
        .generate_jit_runner_config(
            world.scale_set_id,
            &JitRunnerSetting {
                name: "r-crash-window".into(),
                work_folder: String::new(),
            },
        )
        .await
        .unwrap();
    world.create_runner("r-crash-window").await;
    // The new host starts.
    world.start_controller();
    world
        .wait_runner("r-crash-window", "ran", |r| {
            phase(r) == Some(EphemeralRunnerPhase::Running)
        })
        .await;
    let events = world.events("r-crash-window").await;
    assert!(
        events.iter().any(|(r, _)| r == "StaleRegistrationRemoved"),
        "{events:?}"
    );
    // A second restart with the Secret in place reuses it.
    world.crash_controller();
    let generated = world
        .fake
        .control()
        .counters()
        .calls(Endpoint::GenerateJitConfig);
    world.start_controller();
    world.delete_and_wait_gone("r-crash-window").await;
    assert_eq!(
        world
            .fake
            .control()
            .counters()
            .calls(Endpoint::GenerateJitConfig),
        generated,
        "the config in the Secret was reused"
    );
    let ledger = world.ledger();
    assert_eq!(ledger.runners_created, 2);
    assert_eq!(ledger.duplicate_runner_names, 1);
    assert_eq!(
        ledger.still_registered, 0,
        "no registration leaked: {ledger:?}"
    );
}

fn debug(hold: &str, max_hold: &str, max_held: i32) -> DebugSpec {
    DebugSpec {
        hold_failed_for: Some(hold.into()),
        max_hold: Some(max_hold.into()),
        max_held: Some(max_held),
        slack: None,
    }
}

fn hold_times(r: &EphemeralRunner) -> Option<(Timestamp, Timestamp)> {
    let status = r.status.as_ref()?;
    Some((status.held_since.as_ref()?.0, status.hold_until.as_ref()?.0))
}

fn registration_gone(r: &EphemeralRunner) -> bool {
    r.status
        .as_ref()
        .and_then(|s| s.condition("Registered"))
        .is_some_and(|c| c.status == "False")
}

#[tokio::test]
async fn a_failed_jobs_runner_is_held_deregistered_extended_within_the_cap_and_released() {
    let world = World::new("debug-hold", fast_settings()).await;
    world
        .acquire_jobs(
            JobSpec::new(1, &[])
                .lasting(Duration::from_secs(2))
                .ending(JobOutcome::Failed),
        )
        .await;
    world
        .create_runner_with("r-held", |spec| spec.debug = Some(debug("10m", "1h", 1)))
        .await;

    // The listener's part: the job on JobStarted, its result on JobCompleted.
    let job = world.wait_working().await;
    world
        .record_job(
            "r-held",
            json!({"jobRequestId": job, "jobId": format!("job-{job}"), "jobRepositoryName": "octo/app"}),
        )
        .await;
    let snapshot = world
        .fake
        .control()
        .wait_until(WAIT, |s| {
            s.jobs.iter().any(|j| j.phase == JobPhase::Finished)
        })
        .await
        .expect("the job finished");
    assert_eq!(snapshot.jobs[0].result.as_deref(), Some("failed"));
    world
        .record_job(
            "r-held",
            json!({"jobResult": "failed", "jobFinishedAt": Time(Timestamp::now())}),
        )
        .await;

    // Held: Debugging until 10 minutes after the job's end, the
    // registration removed, the pod kept.
    let held = world
        .wait_runner("r-held", "was held with its registration gone", |r| {
            phase(r) == Some(EphemeralRunnerPhase::Debugging) && registration_gone(r)
        })
        .await;
    let (since, until) = hold_times(&held).unwrap();
    let recorded_end = held
        .status
        .as_ref()
        .unwrap()
        .job_finished_at
        .clone()
        .unwrap()
        .0;
    assert_eq!(since, recorded_end, "counted from the job's end");
    assert_eq!(until.as_second() - since.as_second(), 600);
    let runner_id = held.status.as_ref().unwrap().runner_id as u64;
    assert!(
        !world
            .fake
            .control()
            .runners()
            .iter()
            .any(|r| r.id == runner_id),
        "the registration is gone from the service"
    );
    let pod = world.pods().get("r-held").await.unwrap();
    assert!(pod.metadata.deletion_timestamp.is_none());
    let labels = RunnerLabels {
        namespace: world.env.namespace().to_string(),
        scale_set: String::new(),
        phase: "Debugging".into(),
    };
    eventually("the gauge shows the held runner", WAIT, || async {
        (world.metrics.runners.get_or_create(&labels).get() == 1).then_some(())
    })
    .await;

    // Extended past the cap: held until the cap, an hour after the job.
    world
        .annotate_hold_until("r-held", since + jiff::SignedDuration::from_hours(3))
        .await;
    let extended = world
        .wait_runner("r-held", "was extended", |r| {
            hold_times(r).is_some_and(|(_, u)| u != until)
        })
        .await;
    let (_, capped) = hold_times(&extended).unwrap();
    assert_eq!(
        capped.as_second() - since.as_second(),
        3600,
        "capped by maxHold"
    );
    assert_eq!(phase(&extended), Some(EphemeralRunnerPhase::Debugging));

    // Moved to a few seconds from now: the pod goes when that time comes,
    // not before.
    let watch = at_pod_deletion(world.pods(), "r-held", Timestamp::now).await;
    let soon = Timestamp::from_second(Timestamp::now().as_second() + 3).unwrap();
    world.annotate_hold_until("r-held", soon).await;
    let deleted_at = tokio::time::timeout(WAIT, watch).await.unwrap().unwrap();
    assert!(
        deleted_at.as_second() >= soon.as_second(),
        "the pod was deleted at {deleted_at}, before the hold ended at {soon}"
    );
    let released = world
        .wait_runner("r-held", "was released", |r| {
            phase(r) == Some(EphemeralRunnerPhase::Failed)
        })
        .await;
    let status = released.status.unwrap();
    assert_eq!(status.reason.as_deref(), Some("HoldEnded"));
    assert_eq!(status.hold_until.unwrap().0.as_second(), soon.as_second());
    wait_absent(&world.secrets(), "r-held", "Secret goes too").await;
    assert_eq!(world.ledger().still_registered, 0);
}

#[tokio::test]
async fn max_held_caps_the_runners_held_at_once() {
    let world = World::new("debug-max-held", fast_settings()).await;
    // Both runners crash while they have a job (the listener recorded it):
    // their registrations stay in the service unless the controller
    // removes them.
    world.sim.add_rule(Rule::next(
        2,
        Scenario::fail().with_start_delay(Duration::from_millis(500)),
    ));
    for name in ["r-first", "r-second"] {
        world
            .create_runner_with(name, |spec| spec.debug = Some(debug("10m", "1h", 1)))
            .await;
        world
            .record_job(name, json!({"jobRequestId": 1, "jobId": "job-1"}))
            .await;
        let ended = world
            .wait_runner(name, "ended", |r| {
                matches!(
                    phase(r),
                    Some(EphemeralRunnerPhase::Debugging | EphemeralRunnerPhase::Failed)
                )
            })
            .await;
        let status = ended.status.unwrap();
        let held = status.condition("HeldForDebugging").unwrap();
        if name == "r-first" {
            assert_eq!(status.phase, Some(EphemeralRunnerPhase::Debugging));
            assert_eq!(status.exit_code, Some(1));
        } else {
            assert_eq!(status.phase, Some(EphemeralRunnerPhase::Failed));
            assert_eq!(status.reason.as_deref(), Some("JobFailed"));
            assert_eq!(held.reason, "MaxHeld", "{held:?}");
        }
    }
    // The one not held is cleaned up as usual; the held one keeps its pod,
    // and both registrations are gone from the service.
    world
        .wait_runner("r-second", "lost its registration", registration_gone)
        .await;
    wait_absent(&world.pods(), "r-second", "pod goes").await;
    let first = world
        .wait_runner("r-first", "lost its registration", registration_gone)
        .await;
    assert_eq!(phase(&first), Some(EphemeralRunnerPhase::Debugging));
    assert!(world.pods().get_opt("r-first").await.unwrap().is_some());
    assert_eq!(world.ledger().still_registered, 0);
    assert!(world.fake.control().runners().is_empty());
}

#[tokio::test]
async fn a_held_failure_is_posted_to_slack_with_the_job_and_the_buttons() {
    let slack = fake_slack::FakeSlack::start("xoxb-bot-token")
        .await
        .unwrap();
    // Slack sheds the first two posts: the post is made again until it is
    // accepted, and recorded then.
    slack.refuse_next(2);
    let world = World::with_slack(
        "debug-slack",
        fast_settings(),
        SlackConfig {
            api_url: slack.api_url().parse().unwrap(),
            extend_by: Duration::from_secs(1800),
        },
    )
    .await;
    let token: Secret = serde_json::from_value(json!({
        "metadata": {"name": "slack-bot"},
        "stringData": {"bot-token": "xoxb-bot-token"},
    }))
    .unwrap();
    world
        .secrets()
        .create(&PostParams::default(), &token)
        .await
        .unwrap();
    world.sim.add_rule(Rule::next(
        1,
        Scenario::fail().with_start_delay(Duration::from_millis(500)),
    ));
    world
        .create_runner_with("r-told", |spec| {
            spec.debug = Some(DebugSpec {
                slack: Some(SlackSpec {
                    channel: "#ci-failures".into(),
                    token_secret_ref: SecretKeyRef {
                        name: "slack-bot".into(),
                        key: Some("bot-token".into()),
                    },
                }),
                ..debug("10m", "1h", 1)
            })
        })
        .await;
    world
        .record_job(
            "r-told",
            json!({
                "jobRequestId": 1, "jobId": "job-1",
                "jobRepositoryName": "octo/app",
                "jobWorkflowRef": "octo/app/.github/workflows/ci.yaml@refs/heads/main",
                "jobDisplayName": "unit tests",
                "jobFinishedAt": Time(Timestamp::from_second(Timestamp::now().as_second()).unwrap()),
            }),
        )
        .await;
    let held = world
        .wait_runner("r-told", "was held", |r| {
            phase(r) == Some(EphemeralRunnerPhase::Debugging)
        })
        .await;
    let until = held.status.unwrap().hold_until.unwrap().0;
    let posts = slack.wait_for_posts(3, WAIT).await.expect("Slack was told");
    assert_eq!(
        posts.iter().map(|p| p.accepted).collect::<Vec<_>>(),
        [false, false, true]
    );
    assert_eq!(posts[0].body, posts[2].body, "the same post, made again");
    let post = &posts[2];
    let told = world
        .wait_runner("r-told", "recorded the post", |r| {
            r.status
                .as_ref()
                .and_then(|s| s.condition("SlackNotified"))
                .is_some_and(|c| c.status == "True")
        })
        .await;
    assert_eq!(phase(&told), Some(EphemeralRunnerPhase::Debugging));
    // The buttons are bound to the message Slack accepted: its channel by
    // id and its own timestamp (the third post).
    let message = told.status.as_ref().unwrap().slack_message.clone();
    assert_eq!(
        message.map(|m| (m.channel, m.ts)),
        Some((
            fake_slack::channel_id("#ci-failures"),
            "1700000000.000003".to_owned()
        ))
    );
    assert!(
        world
            .events("r-told")
            .await
            .iter()
            .any(|(reason, _)| reason == "SlackNotificationFailed"),
        "the refusal is told as an event"
    );
    // Recorded: the passes that follow do not post again. A pass of the
    // held runner after the record is made to happen and waited for (its
    // hold extended, which it writes), then the hold is ended (a pass that
    // asked for a post would have started it before its reconcile ended,
    // and the release takes reconciles of its own): still three posts.
    let extended = Timestamp::from_second(until.as_second() + 300).unwrap();
    world.annotate_hold_until("r-told", extended).await;
    world
        .wait_runner("r-told", "extended its hold", |r| {
            r.status
                .as_ref()
                .and_then(|s| s.hold_until.as_ref())
                .is_some_and(|t| t.0.as_second() == extended.as_second())
        })
        .await;
    world.annotate_hold_until("r-told", Timestamp::now()).await;
    world
        .wait_runner("r-told", "ended its hold", |r| {
            phase(r) == Some(EphemeralRunnerPhase::Failed)
        })
        .await;
    assert_eq!(slack.posts().len(), 3);
    assert_eq!(post.token.as_deref(), Some("xoxb-bot-token"));
    assert_eq!(post.body["channel"], "#ci-failures");
    let text = post.body.to_string();
    for needle in [
        "octo/app",
        "ci.yaml@refs/heads/main",
        "unit tests",
        &format!("{}/r-told", world.env.namespace()),
        &format!("kubectl exec -it -n {} r-told -- sh", world.env.namespace()),
        &format_hold_until(until),
        "Extend 30m",
        "Release",
        &format!("\"value\":\"{}/r-told\"", world.env.namespace()),
    ] {
        assert!(text.contains(needle), "{needle} in {text}");
    }
    // The token is in no status and no event.
    let runner = serde_json::to_string(&world.runners().get("r-told").await.unwrap()).unwrap();
    let events = format!("{:?}", world.events("r-told").await);
    assert!(!runner.contains("xoxb") && !events.contains("xoxb"));
}

#[tokio::test]
async fn an_idle_runner_past_max_idle_age_gets_a_new_registration_and_pod_registration_first() {
    let world = World::new("max-idle-age", fast_settings()).await;
    // No job is queued: the runner connects and stays idle.
    let first_id = world.idle_runner_with_max_idle_age("r-idle").await;
    let first_pod = world.pods().get("r-idle").await.unwrap();
    let fake = world.fake.control();
    let watch = at_pod_deletion(world.pods(), "r-idle", move || fake.runners()).await;
    let Ok(registered_at_deletion) = tokio::time::timeout(WAIT, watch).await else {
        panic!(
            "the pod was never deleted: {:#?} {:?}",
            world.runners().get("r-idle").await.unwrap().status,
            world.events("r-idle").await
        );
    };
    let registered_at_deletion = registered_at_deletion.unwrap();
    assert!(
        !registered_at_deletion
            .iter()
            .any(|r| r.id == first_id as u64),
        "registration {first_id} was removed before the pod was deleted: {registered_at_deletion:?}"
    );
    // Registered anew under the same name, also when the simulated runner
    // noticed its registration was gone and exited 0 before its pod was
    // deleted (a race a loaded machine shows): that exit is the recycling's.
    let recycled = world
        .wait_runner("r-idle", "was recycled", |r| {
            r.status
                .as_ref()
                .is_some_and(|s| s.runner_id != 0 && s.runner_id != first_id)
        })
        .await;
    let status = recycled.status.unwrap();
    assert!(
        status.failures.is_empty(),
        "not a failed start: {:?}",
        status.failures
    );
    assert_ne!(
        status.phase,
        Some(EphemeralRunnerPhase::Succeeded),
        "recycled, not finished"
    );
    if let Some(pod) = world.pods().get_opt("r-idle").await.unwrap() {
        assert_ne!(pod.metadata.uid, first_pod.metadata.uid);
    }
    assert!(
        world
            .events("r-idle")
            .await
            .iter()
            .any(|(reason, _)| reason == "MaxIdleAge")
    );
}
