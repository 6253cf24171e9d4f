//! The whole arcwright stack on one machine, for the lifecycle tests, the
//! scale benchmark and the demo.
//!
//! | part | what runs |
//! |---|---|
//! | control plane | the real etcd + kube-apiserver of `arcwright_harness`, with the CRDs of `crds/` installed |
//! | GitHub Actions | the fake Actions service, over real HTTP, in this process |
//! | kubelet and runners | the runner simulator, in this process |
//! | the controller | `arcwright run`, the shipped binary, as a child process |
//!
//! The controller is deliberately a separate process, as in a cluster: the
//! host's in-process wiring is tested in `host/tests`; here the binary's
//! flags, signals, exit and memory are part of what is tested and measured,
//! and a host killed with SIGKILL is really gone.
//!
//! A [`Stack`] owns everything it starts, and dropping it stops all of it
//! (the host with SIGTERM, then SIGKILL), so neither a failed test nor
//! Ctrl-C in the demo leaves a process behind.

pub mod audit;
pub mod bench;
pub mod demo;
pub mod faults;
pub mod fleet;
pub mod floor;
mod host;
pub mod identity;
pub mod ledger;
pub mod stats;
pub mod timeline;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use arcwright::api::{AutoscalingRunnerSet, EphemeralRunner, EphemeralRunnerSet};
use arcwright_harness::{ControlPlane, TcpRelay};
use fake_actions::{Endpoint, FakeActions, FakeConfig, JobSpec};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use runner_simulator::{Scenario, Simulator, SimulatorConfig};
use serde_json::json;

pub use host::{HostProcess, Usage, arcwright_binary, process_usage};

/// The endpoints only runners call (the simulator plays them); every other
/// endpoint of the fake is called by the host alone.
pub const RUNNER_ENDPOINTS: [Endpoint; 4] = [
    Endpoint::RunnerConnect,
    Endpoint::RunnerJob,
    Endpoint::RunnerComplete,
    Endpoint::RunnerVanished,
];

/// How long a wait for the stack to reach a state may take before the
/// scenario is called failed. Generous: CI machines are slow and shared,
/// and a wait ends as soon as the state is reached.
pub const WAIT: Duration = Duration::from_secs(180);

/// What to start.
#[derive(Debug, Clone)]
pub struct StackConfig {
    /// Names the namespace (a random suffix is added).
    pub name: String,
    /// Start a control plane of its own with an audit log, so the host's
    /// API server requests can be counted; otherwise share the test
    /// binary's control plane, a namespace each.
    pub audit: bool,
    /// How the fake Actions service behaves.
    pub fake: FakeConfig,
    /// What a runner pod does when no simulator rule says otherwise.
    pub scenario: Scenario,
    /// The `arcwright` binary; [`arcwright_binary`] when `None`.
    pub binary: Option<PathBuf>,
    /// Extra `arcwright run` flags (e.g. `--log-level warn`).
    pub host_args: Vec<String>,
    /// Extra API server flags. Any makes the stack start a control plane
    /// of its own (with an audit log), as `audit` does.
    pub apiserver_args: Vec<String>,
    /// Send the host's API server traffic through a [`TcpRelay`] the test
    /// can cut ([`Stack::host_relay`]); replicas started with
    /// [`Stack::start_replica`] reach the server directly.
    pub host_relay: bool,
}

impl StackConfig {
    /// A stack on the shared control plane, every runner succeeding.
    pub fn new(name: &str) -> Self {
        StackConfig {
            name: name.to_owned(),
            audit: false,
            fake: FakeConfig::default(),
            scenario: Scenario::succeed(),
            binary: None,
            host_args: Vec::new(),
            apiserver_args: Vec::new(),
            host_relay: false,
        }
    }
}

enum Plane {
    Shared(&'static ControlPlane),
    Owned(Box<ControlPlane>),
}

impl Plane {
    fn get(&self) -> &ControlPlane {
        match self {
            Plane::Shared(plane) => plane,
            Plane::Owned(plane) => plane,
        }
    }
}

/// A scale set as a scenario declares it.
#[derive(Debug, Clone)]
pub struct ScaleSet {
    /// Its name, which is also its only label: jobs `runs-on` it by name.
    pub name: String,
    /// `minRunners`.
    pub min: i32,
    /// `maxRunners`.
    pub max: i32,
    /// `scalingPolicy`, as the CRD has it; the bundled default when `None`.
    pub scaling_policy: Option<serde_json::Value>,
    /// The runner image (changing it is a spec change).
    pub image: String,
    /// Fields of the spec set over the ones above (a `template` of its
    /// own, `proxy`, `podValidationPolicy`, ...).
    pub spec: serde_json::Map<String, serde_json::Value>,
}

impl ScaleSet {
    /// `name` with `min..=max` runners and the default policy.
    pub fn new(name: &str, min: i32, max: i32) -> Self {
        ScaleSet {
            name: name.to_owned(),
            min,
            max,
            scaling_policy: None,
            image: "ghcr.io/actions/actions-runner:2.330.0".to_owned(),
            spec: serde_json::Map::new(),
        }
    }

    /// The same set with `field` of its spec set to `value`.
    pub fn with(mut self, field: &str, value: serde_json::Value) -> Self {
        self.spec.insert(field.to_owned(), value);
        self
    }

    /// The same set with its scaling policy read from the ConfigMap `name`.
    pub fn with_policy_config_map(mut self, name: &str) -> Self {
        self.scaling_policy = Some(json!({"configMapRef": {"name": name}}));
        self
    }

    fn manifest(&self, config_url: &str) -> Result<AutoscalingRunnerSet> {
        let mut spec = json!({
            "githubConfigUrl": config_url,
            "githubConfigSecret": "github-auth",
            "minRunners": self.min,
            "maxRunners": self.max,
            "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "runner", "image": self.image}],
            }},
        });
        if let Some(policy) = &self.scaling_policy {
            spec["scalingPolicy"] = policy.clone();
        }
        for (field, value) in &self.spec {
            spec[field] = value.clone();
        }
        Ok(serde_json::from_value(json!({
            "apiVersion": "arcwright.dev/v1alpha1",
            "kind": "AutoscalingRunnerSet",
            "metadata": {"name": self.name},
            "spec": spec,
        }))?)
    }
}

/// The running stack. Fields drop in order: the host first, the control
/// plane last.
pub struct Stack {
    host: Option<HostProcess>,
    sim: Simulator,
    fake: FakeActions,
    client: kube::Client,
    namespace: String,
    host_kubeconfig: PathBuf,
    /// The host's kubeconfig without the relay, for replicas.
    direct_kubeconfig: PathBuf,
    relay: Option<TcpRelay>,
    binary: PathBuf,
    host_args: Vec<String>,
    audit_log: Option<PathBuf>,
    starts: u32,
    /// How long a wait for a state may take ([`WAIT`] unless changed).
    bound: Duration,
    plane: Plane,
    dir: tempfile::TempDir,
}

impl Stack {
    /// Starts everything and waits until the host is ready.
    pub async fn start(config: StackConfig) -> Result<Stack> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let StackConfig {
            name,
            audit,
            fake,
            scenario,
            binary,
            host_args,
            apiserver_args,
            host_relay,
        } = config;
        let binary = match binary {
            Some(binary) => binary,
            None => arcwright_binary()?,
        };
        let dir = tempfile::Builder::new()
            .prefix("arcwright-stack-")
            .tempdir()
            .context("creating the stack's directory")?;
        let (plane, audit_log) = if audit || !apiserver_args.is_empty() {
            let policy = dir.path().join("audit-policy.yaml");
            let log = dir.path().join("audit.log");
            audit::write_policy(&policy)?;
            let mut args = audit::apiserver_args(&policy, &log);
            args.extend(apiserver_args);
            let plane = ControlPlane::start_with_apiserver_args(args)
                .await
                .context("starting the control plane")?;
            (Plane::Owned(Box::new(plane)), Some(log))
        } else {
            (
                Plane::Shared(arcwright_harness::shared_control_plane().await),
                None,
            )
        };
        let client = plane.get().client();
        let namespace = create_namespace(client.clone(), &name).await?;
        install_crds(client.clone()).await?;
        let fake = FakeActions::start(fake)
            .await
            .context("starting the fake Actions service")?;
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": "github-auth"},
            "stringData": {"github_token": fake.pat()},
        }))?;
        Api::<Secret>::namespaced(client.clone(), &namespace)
            .create(&PostParams::default(), &secret)
            .await
            .context("creating the GitHub Secret")?;
        // The kubelet's client gives up on an unanswered request after 30 s,
        // as the host's does: an API server starting again can accept a
        // request and never answer it, and a pod's life is played through
        // its watch.
        let mut kubelet = plane.get().config().clone();
        kubelet.read_timeout = Some(Duration::from_secs(30));
        let kubelet = kube::Client::try_from(kubelet).context("a client for the simulator")?;
        let sim = Simulator::start(
            kubelet,
            fake.url(),
            SimulatorConfig {
                default_scenario: scenario,
                ..SimulatorConfig::namespaced(&namespace)
            },
        )
        .context("starting the runner simulator")?;
        let identity = identity::host_identity(client.clone(), plane.get(), &namespace).await?;
        let direct_kubeconfig = dir.path().join("host-kubeconfig");
        identity.write_kubeconfig(plane.get().server(), &direct_kubeconfig)?;
        let (host_kubeconfig, relay) = if host_relay {
            let relay = TcpRelay::start(plane.get().address())
                .await
                .context("starting the host's relay")?;
            let path = dir.path().join("host-kubeconfig-relayed");
            identity.write_kubeconfig(&format!("https://{}", relay.address()), &path)?;
            (path, Some(relay))
        } else {
            (direct_kubeconfig.clone(), None)
        };
        let mut stack = Stack {
            host: None,
            sim,
            fake,
            client,
            namespace,
            host_kubeconfig,
            direct_kubeconfig,
            relay,
            binary,
            host_args,
            audit_log,
            starts: 0,
            bound: WAIT,
            plane,
            dir,
        };
        stack.start_host().await?;
        Ok(stack)
    }

    /// Starts a host (a new process, its own log) and waits until it is
    /// ready. Fails if one runs.
    pub async fn start_host(&mut self) -> Result<()> {
        if self.host.is_some() {
            bail!("a host runs already");
        }
        self.starts += 1;
        let name = format!("arcwright-{}", self.starts);
        let host = self.start_process(&name, &self.host_kubeconfig).await?;
        self.host = Some(host);
        Ok(())
    }

    /// Starts another replica beside the host, with the same flags but
    /// reaching the API server directly, and waits until it is ready. Its
    /// message sessions' owner (and its Lease identity's prefix) is `name`;
    /// the host's are `arcwright-N`, N counting its starts. The caller owns
    /// the process: dropping it stops it.
    pub async fn start_replica(&self, name: &str) -> Result<HostProcess> {
        self.start_process(name, &self.direct_kubeconfig).await
    }

    async fn start_process(&self, name: &str, kubeconfig: &Path) -> Result<HostProcess> {
        let log = self.dir.path().join(format!("{name}.log"));
        let mut host = HostProcess::start(
            &self.binary,
            kubeconfig,
            &self.namespace,
            log,
            &self.host_args,
            // What a pod's downward API gives it: the Lease lives in the
            // stack's namespace, and sessions name their replica.
            &[("HOSTNAME", name), ("POD_NAMESPACE", &self.namespace)],
        )
        .await?;
        host.ready().await?;
        Ok(host)
    }

    /// The relay the host's API server traffic goes through, with
    /// [`StackConfig::host_relay`].
    pub fn host_relay(&self) -> Option<&TcpRelay> {
        self.relay.as_ref()
    }

    /// The running host, to ask whether it still runs.
    pub fn host_mut(&mut self) -> Option<&mut HostProcess> {
        self.host.as_mut()
    }

    /// Kills the host with SIGKILL: no shutdown code runs.
    pub fn kill_host(&mut self) {
        if let Some(host) = self.host.take() {
            host.kill();
        }
    }

    /// Stops the host with SIGTERM, giving it `grace` to shut down cleanly.
    pub async fn stop_host(&mut self, grace: Duration) {
        if let Some(host) = self.host.take() {
            host.terminate(grace).await;
        }
    }

    /// The stack's own control plane; `None` when it shares the test
    /// binary's, which one stack must not stop under the others.
    pub fn own_control_plane(&self) -> Option<&ControlPlane> {
        match &self.plane {
            Plane::Owned(plane) => Some(plane),
            Plane::Shared(_) => None,
        }
    }

    /// The running host.
    pub fn host(&self) -> Option<&HostProcess> {
        self.host.as_ref()
    }

    /// An admin client.
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// The stack's namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The admin kubeconfig (for `kubectl`).
    pub fn kubeconfig_path(&self) -> &Path {
        self.plane.get().kubeconfig_path()
    }

    /// The control plane's process ids, as `kube-apiserver=PID etcd=PID`.
    pub fn control_plane_pids(&self) -> String {
        let pids = self.plane.get().pids();
        ["kube-apiserver", "etcd"]
            .iter()
            .zip(pids)
            .map(|(name, pid)| format!("{name}={pid}"))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// CPU time used so far by the API server, etcd, and this process (the
    /// fake and the simulator, with whatever else the caller runs), from
    /// `/proc`: where a run's time goes besides the host.
    pub fn neighbour_cpu(&self) -> Result<[Duration; 3]> {
        let pids = self.plane.get().pids();
        let cpu = |pid: Option<&u32>| -> Result<Duration> {
            Ok(process_usage(*pid.context("a control plane process")?)?.cpu)
        };
        Ok([
            cpu(pids.first())?,
            cpu(pids.get(1))?,
            process_usage(std::process::id())?.cpu,
        ])
    }

    /// The fake Actions service.
    pub fn fake(&self) -> &FakeActions {
        &self.fake
    }

    /// The runner simulator.
    pub fn sim(&self) -> &Simulator {
        &self.sim
    }

    /// The API server's audit log, when the stack has its own control plane.
    pub fn audit_log(&self) -> Option<&Path> {
        self.audit_log.as_deref()
    }

    /// The name the API server knows the host by.
    pub fn host_username(&self) -> String {
        identity::username(&self.namespace)
    }

    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// The scale sets.
    pub fn scale_sets(&self) -> Api<AutoscalingRunnerSet> {
        self.api()
    }

    /// The EphemeralRunnerSets.
    pub fn runner_sets(&self) -> Api<EphemeralRunnerSet> {
        self.api()
    }

    /// The EphemeralRunners.
    pub fn runners(&self) -> Api<EphemeralRunner> {
        self.api()
    }

    /// The pods.
    pub fn pods(&self) -> Api<Pod> {
        self.api()
    }

    /// Creates the scale set.
    pub async fn create_scale_set(&self, set: &ScaleSet) -> Result<()> {
        let manifest = set.manifest(&self.fake.org_url("octo"))?;
        self.scale_sets()
            .create(&PostParams::default(), &manifest)
            .await
            .with_context(|| format!("creating the scale set {}", set.name))?;
        Ok(())
    }

    /// Deletes the scale set (its teardown then runs).
    pub async fn delete_scale_set(&self, name: &str) -> Result<()> {
        self.scale_sets()
            .delete(name, &kube::api::DeleteParams::default())
            .await
            .with_context(|| format!("deleting the scale set {name}"))?;
        Ok(())
    }

    /// Changes the scale set's runner image: a spec change.
    pub async fn set_image(&self, name: &str, image: &str) -> Result<()> {
        let patch = json!({"spec": {"template": {"spec": {"containers": [
            {"name": "runner", "image": image, }
        ]}}}});
        self.scale_sets()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .with_context(|| format!("changing the image of {name}"))?;
        Ok(())
    }

    /// Creates or replaces the ConfigMap `name` holding a policy module
    /// under `policy.wasm` (the key a `configMapRef` reads by default).
    pub async fn put_policy(&self, name: &str, wasm: &[u8]) -> Result<()> {
        let config_map = ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some(name.to_owned()),
                ..Default::default()
            },
            binary_data: Some(BTreeMap::from([(
                arcwright::policy::loader::DEFAULT_KEY.to_owned(),
                ByteString(wasm.to_vec()),
            )])),
            ..ConfigMap::default()
        };
        let mut value = serde_json::to_value(&config_map)?;
        value["apiVersion"] = json!("v1");
        value["kind"] = json!("ConfigMap");
        self.api::<ConfigMap>()
            .patch(
                name,
                &PatchParams::apply("arcwright-stack").force(),
                &Patch::Apply(&value),
            )
            .await
            .with_context(|| format!("writing the policy ConfigMap {name}"))?;
        Ok(())
    }

    /// Enqueues `count` jobs for the scale set `set`, each lasting
    /// `duration` once started; their ids.
    pub fn enqueue(&self, set: &str, count: u32, duration: Duration) -> Vec<u64> {
        self.fake
            .control()
            .enqueue_jobs(JobSpec::new(count, &[set]).lasting(duration))
    }

    /// Sets how long each wait for a state may take from now on ([`WAIT`]
    /// until then): the fault matrix holds each phase to a tighter bound.
    pub fn set_bound(&mut self, bound: Duration) {
        self.bound = bound;
    }

    /// Polls `probe` until it answers, for at most the bound ([`WAIT`]
    /// unless [`Stack::set_bound`] changed it); an error
    /// naming what never happened, with the ledger and the host's log,
    /// otherwise. The tests' [`arcwright_harness::eventually`] underneath,
    /// returning the timeout rather than panicking, so the demo can report
    /// it and tear its stack down.
    pub async fn until<T, Fut>(&self, what: &str, probe: impl FnMut() -> Fut) -> Result<T>
    where
        Fut: std::future::Future<Output = Option<T>>,
    {
        if let Some(found) = arcwright_harness::poll_within(self.bound, probe).await {
            return Ok(found);
        }
        let host = self
            .host
            .as_ref()
            .map(|h| h.log_tail(30))
            .unwrap_or_default();
        bail!(
            "never: {what}\nledger: {:?}\nhost log:\n{host}",
            self.fake.control().ledger()
        );
    }

    /// Waits until the scale set satisfies `done`.
    pub async fn scale_set_until(
        &self,
        name: &str,
        what: &str,
        done: impl Fn(&AutoscalingRunnerSet) -> bool,
    ) -> Result<AutoscalingRunnerSet> {
        self.until(what, || async {
            self.scale_sets()
                .get_opt(name)
                .await
                .ok()
                .flatten()
                .filter(|s| done(s))
        })
        .await
    }

    /// Waits until the scale set's listener listens; the set.
    pub async fn listening(&self, name: &str) -> Result<AutoscalingRunnerSet> {
        self.scale_set_until(name, "the listener listens", |set| {
            set.status
                .as_ref()
                .and_then(|s| s.listener.as_ref())
                .is_some_and(|l| l.state == "Listening")
        })
        .await
    }

    /// Waits until `total` jobs have succeeded in all.
    pub async fn jobs_succeeded(&self, total: u64) -> Result<()> {
        self.fake
            .control()
            .wait_until(self.bound, |s| s.ledger.jobs_succeeded >= total)
            .await
            .map(drop)
            .map_err(|s| {
                anyhow!(
                    "{} of {total} jobs succeeded: {:?}",
                    s.ledger.jobs_succeeded,
                    s.ledger
                )
            })
    }

    /// Waits until exactly `count` runners exist, none being deleted, with
    /// as many pods, and as many registrations in the fake.
    pub async fn settled_at(&self, count: usize) -> Result<()> {
        self.until(&format!("settled at {count} runners"), || async {
            self.is_settled_at(count).await.filter(|s| *s).map(drop)
        })
        .await
    }

    /// Whether exactly `count` runners exist now, none being deleted, with
    /// as many pods and registrations; `None` if the API server did not
    /// answer.
    pub async fn is_settled_at(&self, count: usize) -> Option<bool> {
        let runners = self.runners().list(&ListParams::default()).await.ok()?;
        let pods = self.pods().list(&ListParams::default()).await.ok()?;
        let registered = self.fake.control().ledger().still_registered;
        Some(
            runners.items.len() == count
                && runners
                    .items
                    .iter()
                    .all(|r| r.metadata.deletion_timestamp.is_none())
                && pods.items.len() == count
                && registered == count as u64,
        )
    }

    /// Checks the ledger invariant ([`ledger::check`]) against the runners
    /// alive now, after `jobs_expected` jobs were enqueued in all.
    pub async fn check_ledger(&self, jobs_expected: u64) -> Result<()> {
        let runners = self.runners().list(&ListParams::default()).await?;
        let live_runners = runners
            .items
            .into_iter()
            .filter(|r| r.metadata.deletion_timestamp.is_none())
            .filter_map(|r| r.metadata.name)
            .collect();
        let snapshot = self.fake.control().snapshot();
        let observation = ledger::Observation {
            ledger: snapshot.ledger,
            registrations: snapshot.runners,
            live_runners,
            jobs_expected,
        };
        let violations = ledger::check(&observation);
        if violations.is_empty() {
            return Ok(());
        }
        let list: Vec<String> = violations.iter().map(ToString::to_string).collect();
        bail!(
            "the ledger invariant does not hold:\n- {}\n{observation:?}",
            list.join("\n- ")
        )
    }

    /// Calls the host made to the fake so far: every endpoint but the
    /// runners' own.
    pub fn host_actions_calls(&self) -> u64 {
        self.host_actions_calls_by_endpoint()
            .iter()
            .map(|(_, n)| n)
            .sum()
    }

    /// [`Self::host_actions_calls`] by endpoint, in [`Endpoint::ALL`]'s
    /// order.
    pub fn host_actions_calls_by_endpoint(&self) -> Vec<(Endpoint, u64)> {
        let counters = self.fake.control().counters();
        Endpoint::ALL
            .into_iter()
            .filter(|e| !RUNNER_ENDPOINTS.contains(e))
            .map(|e| (e, counters.calls(e)))
            .collect()
    }

    /// The host's Actions calls by endpoint since `before` (an earlier
    /// [`Stack::host_actions_calls_by_endpoint`]), the endpoints not called
    /// left out.
    pub fn host_actions_calls_since(&self, before: &[(Endpoint, u64)]) -> Vec<(Endpoint, u64)> {
        self.host_actions_calls_by_endpoint()
            .into_iter()
            .zip(before)
            .map(|((endpoint, after), (_, before))| (endpoint, after - before))
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    /// The host's API server requests received in `[from, to]`, from the
    /// audit log; `None` without one.
    pub fn host_apiserver_requests(
        &self,
        from: jiff::Timestamp,
        to: jiff::Timestamp,
    ) -> Option<audit::Requests> {
        let (log, rotated_files) = audit::read(self.audit_log.as_ref()?).ok()?;
        if rotated_files > 0 {
            eprintln!("the audit log rotated into {rotated_files} more files; all were read");
        }
        Some(audit::Requests {
            rotated_files,
            ..audit::count(&log, &self.host_username(), from, to)
        })
    }
}

/// Every version of every `K` the watch delivers, in order, recorded in
/// the background for as long as the runtime runs: what a test reads to
/// prove a state was seen, whenever it came and went.
pub fn record<K>(api: Api<K>) -> std::sync::Arc<std::sync::Mutex<Vec<K>>>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = seen.clone();
    use futures::StreamExt as _;
    use kube::runtime::WatchStreamExt as _;
    let stream = kube::runtime::watcher::watcher(api, kube::runtime::watcher::Config::default())
        .applied_objects();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            if let Ok(object) = event {
                sink.lock().unwrap().push(object);
            }
        }
    });
    seen
}

/// Runs `work` on a new multi-threaded runtime until it ends or Ctrl-C
/// arrives (then an `interrupted` error, after everything `work` started
/// is dropped and so stopped): the entry of the stack's binaries.
pub fn run_until_interrupted<T>(work: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    let runtime = tokio::runtime::Runtime::new().context("a tokio runtime")?;
    runtime.block_on(async {
        tokio::select! {
            result = work => result,
            _ = tokio::signal::ctrl_c() => Err(anyhow!("interrupted")),
        }
    })
}

/// The whole `main` of a stack binary that prints one report: `work` run
/// until it ends or Ctrl-C arrives, its report on stdout, or its error
/// (with causes) on stderr after `label:`, and the exit code to match.
pub fn report_main<T: std::fmt::Display>(
    label: &str,
    work: impl std::future::Future<Output = Result<T>>,
) -> std::process::ExitCode {
    match run_until_interrupted(work) {
        Ok(report) => {
            println!("{report}");
            std::process::ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("{label}: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn create_namespace(client: kube::Client, name: &str) -> Result<String> {
    let namespace = arcwright_harness::namespace_name(name);
    let object: Namespace = serde_json::from_value(json!({"metadata": {"name": namespace}}))?;
    Api::<Namespace>::all(client)
        .create(&PostParams::default(), &object)
        .await
        .with_context(|| format!("creating the namespace {namespace}"))?;
    Ok(namespace)
}

/// Applies every CRD in `crds/` and waits until each is established.
async fn install_crds(client: kube::Client) -> Result<()> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../crds");
    let crds: Api<CustomResourceDefinition> = Api::all(client);
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let crd: CustomResourceDefinition = serde_yaml::from_str(&std::fs::read_to_string(&path)?)
            .with_context(|| format!("{} is a CRD", path.display()))?;
        let name = crd.metadata.name.clone().context("a CRD has a name")?;
        crds.patch(
            &name,
            &PatchParams::apply("arcwright-stack").force(),
            &Patch::Apply(&crd),
        )
        .await
        .with_context(|| format!("applying {}", path.display()))?;
        names.push(name);
    }
    for name in &names {
        tokio::time::timeout(
            Duration::from_secs(60),
            await_condition(crds.clone(), name, conditions::is_crd_established()),
        )
        .await
        .with_context(|| format!("{name} established"))??;
    }
    Ok(())
}
