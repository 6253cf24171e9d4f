//! The simulator against a real API server and the in-process fake: runner
//! pods created by hand (as any controller would), each scenario end to end.

use std::time::Duration;

use arcwright_harness::TestEnv;
use fake_actions::{FakeActions, FakeConfig, JobOutcome, JobSpec};
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::wait::{Condition, await_condition, conditions};
use runner_simulator::{
    JIT_CONFIG_ENV, Rule, RunnerRecord, Scenario, Simulator, SimulatorConfig, Stage, Step,
};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);

/// A namespace, a fake with one registered scale set and a listener that
/// acquires every job offered, and a simulator on the namespace.
struct World {
    env: TestEnv,
    fake: FakeActions,
    sim: Simulator,
    http: reqwest::Client,
    base: String,
    admin: String,
    set: u64,
    listener: tokio::task::JoinHandle<()>,
}

impl Drop for World {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

async fn post(http: &reqwest::Client, url: &str, auth: &str, body: Value) -> Value {
    let response = http
        .post(url)
        .header("Authorization", auth)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(
        response.status().is_success(),
        "{url}: {}",
        response.status()
    );
    response.json().await.unwrap_or(Value::Null)
}

async fn world(name: &str, sim: SimulatorConfig) -> World {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let env = TestEnv::new(name).await;
    let fake = FakeActions::start(FakeConfig::default()).await.unwrap();
    let http = reqwest::Client::new();
    let token = post(
        &http,
        &format!(
            "{}/api/v3/orgs/org/actions/runners/registration-token",
            fake.url()
        ),
        &format!("Bearer {}", fake.pat()),
        json!({}),
    )
    .await;
    let registration = post(
        &http,
        &format!("{}/api/v3/actions/runner-registration", fake.url()),
        &format!("RemoteAuth {}", token["token"].as_str().unwrap()),
        json!({"url": fake.org_url("org"), "runner_event": "register"}),
    )
    .await;
    let base = registration["url"].as_str().unwrap().to_owned();
    let admin = format!("Bearer {}", registration["token"].as_str().unwrap());
    let set = post(
        &http,
        &format!("{base}_apis/runtime/runnerscalesets?api-version=6.0-preview"),
        &admin,
        json!({"name": "set", "runnerGroupId": 1, "labels": []}),
    )
    .await["id"]
        .as_u64()
        .unwrap();
    let session = post(
        &http,
        &format!("{base}_apis/runtime/runnerscalesets/{set}/sessions"),
        &admin,
        json!({"ownerName": "test"}),
    )
    .await;
    let listener = {
        let http = http.clone();
        let queue = session["messageQueueUrl"].as_str().unwrap().to_owned();
        let bearer = format!(
            "Bearer {}",
            session["messageQueueAccessToken"].as_str().unwrap()
        );
        let acquire = format!("{base}_apis/runtime/runnerscalesets/{set}/acquirejobs");
        tokio::spawn(async move {
            let mut last = 0;
            loop {
                let Ok(response) = http
                    .get(format!("{queue}?lastMessageId={last}"))
                    .header("Authorization", &bearer)
                    .send()
                    .await
                else {
                    continue;
                };
                if response.status() != reqwest::StatusCode::OK {
                    continue;
                }
                let message: Value = response.json().await.unwrap();
                last = message["messageId"].as_u64().unwrap();
                let items: Vec<Value> =
                    serde_json::from_str(message["body"].as_str().unwrap()).unwrap();
                let offered: Vec<u64> = items
                    .iter()
                    .filter(|m| m["messageType"] == "JobAvailable")
                    .map(|m| m["runnerRequestId"].as_u64().unwrap())
                    .collect();
                let _ = http
                    .delete(format!("{queue}/{last}"))
                    .header("Authorization", &bearer)
                    .send()
                    .await;
                if !offered.is_empty() {
                    let _ = http
                        .post(&acquire)
                        .header("Authorization", &bearer)
                        .json(&offered)
                        .send()
                        .await;
                }
            }
        })
    };
    let sim = Simulator::start(
        env.client(),
        fake.url(),
        SimulatorConfig {
            namespace: Some(env.namespace().to_owned()),
            ..sim
        },
    )
    .unwrap();
    World {
        env,
        fake,
        sim,
        http,
        base,
        admin,
        set,
        listener,
    }
}

impl World {
    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.env.client(), self.env.namespace())
    }

    /// A JIT config for a runner of the scale set, as a controller gets it.
    async fn jit(&self, runner: &str) -> (u64, String) {
        let answer = post(
            &self.http,
            &format!(
                "{}_apis/runtime/runnerscalesets/{}/generatejitconfig",
                self.base, self.set
            ),
            &self.admin,
            json!({"name": runner, "workFolder": "_work"}),
        )
        .await;
        (
            answer["runner"]["id"].as_u64().unwrap(),
            answer["encodedJITConfig"].as_str().unwrap().to_owned(),
        )
    }

    async fn create_pod(&self, name: &str, env: Value, labels: Value) -> Pod {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "runner", "image": "ghcr.io/actions/actions-runner:2.330.0",
                                "env": env}],
            },
        }))
        .unwrap();
        self.pods()
            .create(&PostParams::default(), &pod)
            .await
            .unwrap()
    }

    async fn runner_pod(&self, name: &str) -> Pod {
        let (_, jit) = self.jit(name).await;
        self.create_pod(
            name,
            json!([{"name": JIT_CONFIG_ENV, "value": jit},
                   {"name": "ACTIONS_RUNNER_RETURN_VERSION_DEPRECATED_EXIT_CODE", "value": "1"}]),
            json!({}),
        )
        .await
    }

    async fn wait_pod(&self, name: &str, what: &str, cond: impl Condition<Pod>) -> Pod {
        match tokio::time::timeout(WAIT, await_condition(self.pods(), name, cond)).await {
            Ok(Ok(Some(pod))) => pod,
            other => panic!(
                "pod {name} never {what}: {other:?}; simulator saw {:?}",
                self.sim.runners()
            ),
        }
    }

    async fn wait_gone(&self, pod: &Pod) {
        let uid = pod.metadata.uid.clone().unwrap();
        let name = pod.metadata.name.clone().unwrap();
        tokio::time::timeout(
            WAIT,
            await_condition(self.pods(), &name, conditions::is_deleted(&uid)),
        )
        .await
        .unwrap_or_else(|_| panic!("pod {name} was never deleted"))
        .unwrap();
    }

    async fn wait_stage(&self, pod: &str, stage: impl Fn(&Stage) -> bool) {
        self.sim
            .wait_until(WAIT, |records| {
                records.iter().any(|r| r.pod == pod && stage(&r.stage))
            })
            .await
            .unwrap_or_else(|records| panic!("{pod} never reached the stage: {records:?}"));
    }

    /// Waits until the simulator has taken `step` for the pod; its record.
    async fn wait_step(&self, pod: &str, step: Step) -> RunnerRecord {
        let took = |r: &RunnerRecord| r.pod == pod && r.when(step).is_some();
        let records = self
            .sim
            .wait_until(WAIT, |records| records.iter().any(took))
            .await
            .unwrap_or_else(|records| panic!("{pod} never took {step:?}: {records:?}"));
        records.into_iter().find(took).unwrap()
    }
}

fn phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref()?.phase.as_deref()
}

fn has_phase(expected: &'static str) -> impl Condition<Pod> {
    move |pod: Option<&Pod>| pod.and_then(phase) == Some(expected)
}

/// The runner container's terminated state: (exit code, reason).
fn terminated(pod: &Pod) -> Option<(i32, String)> {
    let status = pod.status.as_ref()?.container_statuses.as_ref()?;
    let runner = status.iter().find(|c| c.name == "runner")?;
    let state = runner.state.as_ref()?.terminated.as_ref()?;
    Some((state.exit_code, state.reason.clone().unwrap_or_default()))
}

#[tokio::test]
async fn a_pod_with_a_literal_jit_config_runs_its_job_and_succeeds() {
    let w = world("sim-literal", SimulatorConfig::default()).await;
    let ids = w
        .fake
        .control()
        .enqueue_jobs(JobSpec::new(1, &[]).lasting(Duration::from_millis(300)));
    let created = w.runner_pod("runner-a").await;

    let pod = w
        .wait_pod("runner-a", "succeeded", has_phase("Succeeded"))
        .await;
    assert_eq!(
        pod.spec.as_ref().unwrap().node_name.as_deref(),
        Some("simulated-node"),
        "bound as the scheduler would"
    );
    assert_eq!(terminated(&pod), Some((0, "Completed".to_owned())));
    let ledger = w.fake.control().ledger();
    assert_eq!(ledger.jobs_succeeded, 1, "{ledger:?}");
    assert_eq!(ledger.self_deregistered, 1);
    assert_eq!(ledger.still_registered, 0);
    let record = &w.sim.runners()[0];
    assert_eq!(record.jobs, ids);
    assert_eq!(record.runner_name.as_deref(), Some("runner-a"));

    // A default (graceful) delete is confirmed by the simulator.
    w.pods()
        .delete("runner-a", &DeleteParams::default())
        .await
        .unwrap();
    w.wait_gone(&created).await;
}

#[tokio::test]
async fn a_jit_config_is_read_from_a_secret_once_it_exists() {
    let w = world("sim-secret", SimulatorConfig::default()).await;
    w.fake.control().enqueue_jobs(
        JobSpec::new(1, &[])
            .lasting(Duration::from_millis(100))
            .ending(JobOutcome::Failed),
    );
    let (_, jit) = w.jit("runner-s").await;
    w.create_pod(
        "runner-s",
        json!([{"name": JIT_CONFIG_ENV,
                "valueFrom": {"secretKeyRef": {"name": "runner-s", "key": "jitToken"}}}]),
        json!({}),
    )
    .await;
    // Without its Secret the container cannot be created, as on a node.
    w.wait_pod(
        "runner-s",
        "reported its missing secret",
        |pod: Option<&Pod>| {
            pod.and_then(|p| {
                p.status
                    .as_ref()?
                    .container_statuses
                    .as_ref()?
                    .first()
                    .cloned()
            })
            .and_then(|c| c.state?.waiting?.reason)
            .as_deref()
                == Some("CreateContainerConfigError")
        },
    )
    .await;

    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "runner-s"},
        "stringData": {"jitToken": jit},
    }))
    .unwrap();
    Api::<Secret>::namespaced(w.env.client(), w.env.namespace())
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();

    let pod = w
        .wait_pod("runner-s", "succeeded", has_phase("Succeeded"))
        .await;
    // The job failed; the runner still exits 0.
    assert_eq!(terminated(&pod), Some((0, "Completed".to_owned())));
    assert_eq!(w.fake.control().ledger().jobs_failed, 1);
}

#[tokio::test]
async fn crashing_and_outdated_runners_exit_before_taking_a_job() {
    let w = world(
        "sim-exit",
        SimulatorConfig {
            rules: vec![
                Rule::name_prefix("crash-", Scenario::fail()),
                Rule::name_prefix("old-", Scenario::outdated()),
            ],
            ..SimulatorConfig::default()
        },
    )
    .await;
    w.fake.control().enqueue_jobs(JobSpec::new(2, &[]));
    w.runner_pod("crash-1").await;
    w.runner_pod("old-1").await;

    let crashed = w.wait_pod("crash-1", "failed", has_phase("Failed")).await;
    assert_eq!(terminated(&crashed), Some((1, "Error".to_owned())));
    let outdated = w.wait_pod("old-1", "failed", has_phase("Failed")).await;
    assert_eq!(terminated(&outdated), Some((7, "Error".to_owned())));

    // Neither connected: both registrations are left, offline, and no job
    // was assigned to them.
    let control = w.fake.control();
    let ledger = control.ledger();
    assert_eq!(ledger.still_registered, 2, "{ledger:?}");
    assert!(
        control
            .runners()
            .iter()
            .all(|r| !r.online && r.job_id.is_none())
    );
    assert_eq!(ledger.jobs_unfinished, 2);
}

#[tokio::test]
async fn an_oom_killed_runner_dies_mid_job_and_its_job_is_requeued() {
    let w = world(
        "sim-oom",
        SimulatorConfig {
            default_scenario: Scenario::oom_killed(),
            ..SimulatorConfig::default()
        },
    )
    .await;
    w.fake
        .control()
        .enqueue_jobs(JobSpec::new(1, &[]).lasting(Duration::from_secs(1)));
    w.runner_pod("runner-oom").await;
    let pod = w
        .wait_pod("runner-oom", "failed", has_phase("Failed"))
        .await;
    assert_eq!(terminated(&pod), Some((137, "OOMKilled".to_owned())));
    let ledger = w.fake.control().ledger();
    assert_eq!(ledger.jobs_cancelled_runner_vanished, 1, "{ledger:?}");
    assert_eq!(ledger.jobs_requeued, 1);
    assert_eq!(ledger.still_registered, 1, "the controller must remove it");
    assert_eq!(w.sim.runners()[0].jobs.len(), 1);
}

#[tokio::test]
async fn a_runner_that_never_registers_stays_running_until_deleted() {
    let w = world(
        "sim-never",
        SimulatorConfig {
            default_scenario: Scenario::never_registers(),
            ..SimulatorConfig::default()
        },
    )
    .await;
    w.fake.control().enqueue_jobs(JobSpec::new(1, &[]));
    let created = w.runner_pod("runner-n").await;
    w.wait_pod("runner-n", "ran", has_phase("Running")).await;
    // The runner got to where it would connect and did not: from here on
    // nothing would tell the fake it is online.
    w.wait_step("runner-n", Step::DeclinedToConnect).await;
    let control = w.fake.control();
    assert!(control.runners().iter().all(|r| !r.online));
    assert_eq!(control.ledger().jobs_unfinished, 1);

    w.pods()
        .delete("runner-n", &DeleteParams::default())
        .await
        .unwrap();
    w.wait_gone(&created).await;
    w.wait_stage("runner-n", |s| *s == Stage::Deleted).await;
}

#[tokio::test]
async fn deleting_a_pod_mid_job_tells_the_fake_its_runner_vanished() {
    let w = world("sim-delete", SimulatorConfig::default()).await;
    w.fake
        .control()
        .enqueue_jobs(JobSpec::new(1, &[]).lasting(Duration::from_secs(300)));
    let created = w.runner_pod("runner-d").await;
    w.wait_stage("runner-d", |s| matches!(s, Stage::Working { .. }))
        .await;

    w.pods()
        .delete("runner-d", &DeleteParams::default())
        .await
        .unwrap();
    w.wait_gone(&created).await;
    let ledger = w.fake.control().ledger();
    assert_eq!(ledger.jobs_cancelled_runner_vanished, 1, "{ledger:?}");
    assert_eq!(
        ledger.still_registered, 1,
        "its registration outlives the pod"
    );
}

#[tokio::test]
async fn a_lost_node_leaves_its_pod_terminating_until_forced() {
    let w = world(
        "sim-lost",
        SimulatorConfig {
            rules: vec![Rule::label("sim", "lost", Scenario::node_lost())],
            ..SimulatorConfig::default()
        },
    )
    .await;
    w.fake
        .control()
        .enqueue_jobs(JobSpec::new(1, &[]).lasting(Duration::from_secs(300)));
    let (_, jit) = w.jit("runner-l").await;
    let created = w
        .create_pod(
            "runner-l",
            json!([{"name": JIT_CONFIG_ENV, "value": jit}]),
            json!({"sim": "lost"}),
        )
        .await;
    w.wait_stage("runner-l", |s| *s == Stage::NodeLost).await;
    assert_eq!(w.fake.control().ledger().jobs_cancelled_runner_vanished, 1);

    let pod = w.pods().get("runner-l").await.unwrap();
    let node_name = pod.spec.unwrap().node_name.unwrap();
    assert!(node_name.starts_with("simulated-node-lost-"), "{node_name}");
    let node = Api::<Node>::all(w.env.client())
        .get(&node_name)
        .await
        .unwrap();
    let ready = node
        .status
        .and_then(|s| s.conditions)
        .and_then(|c| c.into_iter().find(|c| c.type_ == "Ready"))
        .unwrap();
    assert_eq!(ready.status, "Unknown");

    w.pods()
        .delete("runner-l", &DeleteParams::default())
        .await
        .unwrap();
    // The simulator, the only kubelet, saw the deletion and left it be.
    let record = w.wait_step("runner-l", Step::DeletionUnanswered).await;
    assert_eq!(record.stage, Stage::NodeLost);
    let stuck = w.pods().get("runner-l").await.unwrap();
    assert!(
        stuck.metadata.deletion_timestamp.is_some(),
        "still terminating"
    );

    w.pods()
        .delete("runner-l", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    w.wait_gone(&created).await;
}

#[tokio::test]
async fn a_slow_start_keeps_the_pod_pending_for_its_delay() {
    let w = world(
        "sim-slow",
        SimulatorConfig {
            rules: vec![Rule::next(
                1,
                Scenario::succeed().with_start_delay(Duration::from_secs(2)),
            )],
            ..SimulatorConfig::default()
        },
    )
    .await;
    w.runner_pod("runner-slow").await;
    // Bound at once, but not running before its delay is over.
    let bound = w
        .wait_pod("runner-slow", "was bound", |pod: Option<&Pod>| {
            pod.and_then(|p| p.spec.as_ref()?.node_name.clone())
                .is_some()
        })
        .await;
    assert_ne!(phase(&bound), Some("Running"));
    w.wait_pod("runner-slow", "ran", has_phase("Running")).await;
    let slow = w.wait_step("runner-slow", Step::Started).await;
    let (bound_at, started_at) = (slow.when(Step::Bound), slow.when(Step::Started));
    let waited = started_at.unwrap() - bound_at.unwrap();
    assert!(
        waited >= Duration::from_secs(2),
        "Running was written {waited:?} after binding"
    );
    // The counted rule is used up: the next pod starts at once.
    w.runner_pod("runner-quick").await;
    w.wait_pod("runner-quick", "ran", has_phase("Running"))
        .await;
    let delays: Vec<Duration> = w
        .sim
        .runners()
        .iter()
        .map(|r| r.scenario.start_delay)
        .collect();
    assert_eq!(delays, [Duration::from_secs(2), Duration::ZERO]);
}

#[tokio::test]
async fn a_runner_removed_while_idle_exits_cleanly() {
    let w = world("sim-idle", SimulatorConfig::default()).await;
    let (id, jit) = w.jit("runner-i").await;
    w.create_pod(
        "runner-i",
        json!([{"name": JIT_CONFIG_ENV, "value": jit}]),
        json!({}),
    )
    .await;
    w.wait_stage("runner-i", |s| *s == Stage::Connected).await;
    let removed = w
        .http
        .delete(format!(
            "{}_apis/distributedtask/pools/0/agents/{id}",
            w.base
        ))
        .header("Authorization", &w.admin)
        .send()
        .await
        .unwrap();
    assert_eq!(removed.status(), reqwest::StatusCode::NO_CONTENT);
    let pod = w
        .wait_pod("runner-i", "succeeded", has_phase("Succeeded"))
        .await;
    assert_eq!(terminated(&pod), Some((0, "Completed".to_owned())));
}

#[tokio::test]
async fn pods_without_a_jit_config_are_left_alone() {
    let w = world("sim-ignore", SimulatorConfig::default()).await;
    w.create_pod("plain", json!([{"name": "X", "value": "1"}]), json!({}))
        .await;
    w.fake
        .control()
        .enqueue_jobs(JobSpec::new(1, &[]).lasting(Duration::from_millis(50)));
    w.runner_pod("runner-b").await;
    w.wait_pod("runner-b", "succeeded", has_phase("Succeeded"))
        .await;
    let plain = w.pods().get("plain").await.unwrap();
    assert!(plain.spec.unwrap().node_name.is_none(), "not bound");
    assert!(plain.status.and_then(|s| s.phase).as_deref() != Some("Running"));
    assert!(w.sim.runners().iter().all(|r| r.pod != "plain"));
}
