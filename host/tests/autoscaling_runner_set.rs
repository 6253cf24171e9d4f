//! The AutoscalingRunnerSet controller against the real API server and the
//! fake Actions service over HTTP, with listeners held in memory (the
//! controller's seam to the listener tasks), one test per behaviour.

mod common;

use std::sync::Arc;
use std::time::Duration;

use arcwright::api::autoscaling_runner_set::{
    AutoscalingRunnerSetCondition, AutoscalingRunnerSetEvent, DeletionBlockedReason, StalledReason,
};
use arcwright::api::{
    AutoscalingRunnerSet, AutoscalingRunnerSetPhase, EphemeralRunner, EphemeralRunnerSet,
    EphemeralRunnerSetPhase, annotations, finalizers, labels,
};
use arcwright::controllers::autoscaling_runner_set::{
    self as controller, CONTROLLER, Context, InMemoryListeners, ListenerEvent,
};
use arcwright::controllers::kit::Synced;
use arcwright::controllers::metrics::ControllerMetrics;
use arcwright::credentials::ActionsClients;
use arcwright::policy::reporter::RecordingReporter;
use arcwright::policy::{EngineConfig, PolicyEngine, loader::PolicyLoader};
use arcwright_harness::{TestEnv, eventually};
use fake_actions::{FakeActions, FakeConfig};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(30);
const NAME: &str = "linux";
const TEMPLATE_CONDITION: &str = AutoscalingRunnerSetCondition::PodTemplateAccepted.as_str();
const DELETION_CONDITION: &str = AutoscalingRunnerSetCondition::DeletionBlocked.as_str();
const STALLED_CONDITION: &str = AutoscalingRunnerSetCondition::Stalled.as_str();

struct Harness {
    env: TestEnv,
    fake: FakeActions,
    listeners: InMemoryListeners,
    metrics: ControllerMetrics,
    context: Arc<Context<InMemoryListeners, ActionsClients>>,
    shutdown: CancellationToken,
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl Harness {
    async fn start(name: &str) -> Self {
        let env = TestEnv::new(name).await;
        common::install_crds(env.client()).await;
        let fake = FakeActions::start(FakeConfig::default())
            .await
            .expect("the fake starts");
        common::github_secret(env.client(), env.namespace(), fake.pat()).await;
        let options = common::fast_client_options();
        let listeners = InMemoryListeners::default();
        let metrics = ControllerMetrics::default();
        let engine = PolicyEngine::new(EngineConfig::default()).unwrap();
        let context = Arc::new(
            Context::new(
                env.client(),
                listeners.clone(),
                ActionsClients::new(env.client(), options),
                PolicyLoader::new(engine, Some(env.client())),
                Arc::new(RecordingReporter::new()),
            )
            .with_metrics(metrics.clone()),
        );
        let shutdown = CancellationToken::new();
        let namespace = env.namespace().to_string();
        let stop = shutdown.clone();
        let running = context.clone();
        tokio::spawn(async move {
            controller::run(running, Some(&namespace), stop, Synced::default()).await
        });
        Self {
            env,
            fake,
            listeners,
            metrics,
            context,
            shutdown,
        }
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

    fn spec(&self, template: Value) -> Value {
        json!({
            "githubConfigUrl": self.fake.org_url("octo-org"),
            "githubConfigSecret": "github-auth",
            "maxRunners": 5,
            "template": template,
        })
    }

    async fn create(&self, template: Value) -> AutoscalingRunnerSet {
        let set: AutoscalingRunnerSet = serde_json::from_value(json!({
            "apiVersion": "arcwright.dev/v1alpha1",
            "kind": "AutoscalingRunnerSet",
            "metadata": {"name": NAME},
            "spec": self.spec(template),
        }))
        .unwrap();
        self.sets()
            .create(&PostParams::default(), &set)
            .await
            .unwrap()
    }

    /// Waits until the set satisfies `done`.
    async fn set_until(
        &self,
        what: &str,
        done: impl Fn(&AutoscalingRunnerSet) -> bool,
    ) -> AutoscalingRunnerSet {
        tokio::time::timeout(
            WAIT,
            await_condition(self.sets(), NAME, |set: Option<&AutoscalingRunnerSet>| {
                set.is_some_and(&done)
            }),
        )
        .await
        .unwrap_or_else(|_| panic!("timed out waiting until {what}"))
        .unwrap()
        .unwrap()
    }

    async fn runner_set_until(
        &self,
        what: &str,
        done: impl Fn(&EphemeralRunnerSet) -> bool,
    ) -> EphemeralRunnerSet {
        tokio::time::timeout(
            WAIT,
            await_condition(
                self.runner_sets(),
                NAME,
                |set: Option<&EphemeralRunnerSet>| set.is_some_and(&done),
            ),
        )
        .await
        .unwrap_or_else(|_| panic!("timed out waiting until {what}"))
        .unwrap()
        .unwrap()
    }

    /// Creates the set and waits until it runs: registered, its
    /// EphemeralRunnerSet created, its listener started.
    async fn running(&self, template: Value) -> AutoscalingRunnerSet {
        self.create(template).await;
        self.set_until("the set runs", |set| {
            phase(set) == Some(AutoscalingRunnerSetPhase::Running)
                && set.status.as_ref().and_then(|s| s.observed_generation)
                    == set.metadata.generation
        })
        .await
    }

    async fn patch_spec(&self, spec: Value) -> i64 {
        self.sets()
            .patch(
                NAME,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": spec})),
            )
            .await
            .unwrap()
            .metadata
            .generation
            .unwrap()
    }

    /// Records every phase the set's status goes through from now on.
    fn record_phases(&self) -> tokio::sync::watch::Receiver<Vec<AutoscalingRunnerSetPhase>> {
        let (tx, rx) = tokio::sync::watch::channel(Vec::new());
        let stream = watcher::watcher(
            self.sets(),
            watcher::Config::default().fields(&format!("metadata.name={NAME}")),
        )
        .applied_objects();
        let stop = self.shutdown.clone();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream.take_until(stop.cancelled_owned()));
            while let Some(Ok(set)) = stream.next().await {
                if let Some(phase) = phase(&set) {
                    tx.send_modify(|phases| {
                        if phases.last() != Some(&phase) {
                            phases.push(phase);
                        }
                    });
                }
            }
        });
        rx
    }
}

fn phase(set: &AutoscalingRunnerSet) -> Option<AutoscalingRunnerSetPhase> {
    set.status.as_ref().and_then(|s| s.phase)
}

fn template(env: Value) -> Value {
    json!({
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "runner", "image": "ghcr.io/actions/actions-runner:2.330.0",
                            "env": env}]
        }
    })
}

fn privileged_template() -> Value {
    json!({
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "runner", "image": "ghcr.io/actions/actions-runner:2.330.0",
                            "securityContext": {"privileged": true}}]
        }
    })
}

async fn wait_phases(
    phases: &mut tokio::sync::watch::Receiver<Vec<AutoscalingRunnerSetPhase>>,
    done: impl Fn(&[AutoscalingRunnerSetPhase]) -> bool,
) -> Vec<AutoscalingRunnerSetPhase> {
    tokio::time::timeout(WAIT, phases.wait_for(|seen| done(seen)))
        .await
        .expect("the phases were seen")
        .unwrap()
        .clone()
}

async fn wait_listeners(
    listeners: &InMemoryListeners,
    done: impl Fn(&[ListenerEvent]) -> bool,
) -> Vec<ListenerEvent> {
    tokio::time::timeout(WAIT, listeners.wait_for(done))
        .await
        .expect("the listener history was reached")
}

#[tokio::test]
async fn scale_set_goes_from_nothing_to_registered_in_the_service() {
    let h = Harness::start("ars-registered").await;
    let set = h
        .running(template(json!([{"name": "A", "value": "1"}])))
        .await;

    let id = set
        .status
        .as_ref()
        .unwrap()
        .runner_scale_set_id
        .expect("the id in status");
    assert_eq!(
        set.annotations().get(annotations::SCALE_SET_ID),
        Some(&id.to_string())
    );
    assert!(
        set.finalizers()
            .contains(&finalizers::AUTOSCALING_RUNNER_SET.name.to_string())
    );
    let registered = h.fake.control().scale_sets();
    assert_eq!(registered.len(), 1, "one scale set: {registered:?}");
    assert_eq!(registered[0].id as i64, id);
    assert_eq!(registered[0].name, NAME);
    assert_eq!(registered[0].labels, vec![NAME.to_string()]);

    let runner_set = h.runner_sets().get(NAME).await.unwrap();
    assert_eq!(runner_set.spec.actionable_revision, 1);
    assert_eq!(
        runner_set.spec.ephemeral_runner_spec.runner_scale_set_id,
        id
    );
    assert_eq!(
        runner_set.owner_references()[0].uid,
        set.uid().unwrap(),
        "owned by the scale set"
    );
    match &h.listeners.history()[..] {
        [ListenerEvent::Started(config)] => assert_eq!(config.scale_set_id, id),
        other => panic!("one listener start: {other:?}"),
    }
}

#[tokio::test]
async fn rejected_pod_template_creates_nothing_and_recovers_when_fixed() {
    let h = Harness::start("ars-rejected").await;
    h.create(privileged_template()).await;

    let set = h
        .set_until("the template is refused", |set| {
            set.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == TEMPLATE_CONDITION && c.status == "False")
            })
        })
        .await;
    let condition = set
        .status
        .as_ref()
        .unwrap()
        .conditions
        .iter()
        .find(|c| c.type_ == TEMPLATE_CONDITION)
        .unwrap()
        .clone();
    assert!(
        condition.message.contains("spec.containers[0]")
            && condition.message.contains("privileged"),
        "the condition names the path and the problem: {}",
        condition.message
    );
    assert_eq!(phase(&set), Some(AutoscalingRunnerSetPhase::Pending));
    assert_eq!(set.status.as_ref().unwrap().observed_generation, None);
    assert!(
        h.runner_sets().get_opt(NAME).await.unwrap().is_none(),
        "no EphemeralRunnerSet"
    );
    assert!(
        h.fake.control().scale_sets().is_empty(),
        "no scale set registered"
    );
    assert!(h.listeners.history().is_empty(), "no listener");
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(h.env.client(), h.env.namespace());
    let rejected = AutoscalingRunnerSetEvent::PodTemplateRejected.as_str();
    let event = eventually("a rejection event", WAIT, || async {
        let list = events.list(&Default::default()).await.unwrap();
        list.items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some(rejected))
    })
    .await;
    assert!(event.note.unwrap_or_default().contains("privileged"));

    h.sets()
        .patch(
            NAME,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": template(json!(null))}})),
        )
        .await
        .unwrap();
    let set = h
        .set_until("the fixed template runs", |set| {
            phase(set) == Some(AutoscalingRunnerSetPhase::Running)
        })
        .await;
    assert_eq!(
        set.status.as_ref().unwrap().observed_generation,
        set.metadata.generation
    );
    assert_eq!(h.fake.control().scale_sets().len(), 1);
    assert!(h.runner_sets().get_opt(NAME).await.unwrap().is_some());
}

#[tokio::test]
async fn spec_change_shows_pending_then_observed_generation_catches_up() {
    let h = Harness::start("ars-generation").await;
    let set = h
        .running(template(json!([{"name": "A", "value": "1"}])))
        .await;
    let before = set.metadata.generation.unwrap();
    let mut phases = h.record_phases();
    wait_phases(&mut phases, |seen| {
        seen == [AutoscalingRunnerSetPhase::Running]
    })
    .await;

    let generation = h
        .patch_spec(json!({"template": template(json!([{"name": "A", "value": "2"}]))}))
        .await;
    assert!(generation > before);
    let seen = wait_phases(&mut phases, |seen| {
        seen.ends_with(&[
            AutoscalingRunnerSetPhase::Pending,
            AutoscalingRunnerSetPhase::Running,
        ])
    })
    .await;
    assert_eq!(seen.len(), 3, "Running, Pending, Running: {seen:?}");
    let set = h
        .set_until("the change is applied", |set| {
            set.status.as_ref().and_then(|s| s.observed_generation) == Some(generation)
        })
        .await;
    assert_eq!(phase(&set), Some(AutoscalingRunnerSetPhase::Running));
    let runner_set = h.runner_sets().get(NAME).await.unwrap();
    assert_eq!(
        runner_set.spec.actionable_revision, 2,
        "the runner spec changed"
    );
}

#[tokio::test]
async fn explicitly_empty_env_round_trips_without_drift() {
    let h = Harness::start("ars-empty-env").await;
    h.running(template(json!([]))).await;
    // A spec change elsewhere makes the controller compare the runner spec
    // it reads back with the one it would write.
    let generation = h.patch_spec(json!({"maxRunners": 7})).await;
    h.set_until("the change is applied", |set| {
        set.status.as_ref().and_then(|s| s.observed_generation) == Some(generation)
    })
    .await;
    let runner_set = h.runner_sets().get(NAME).await.unwrap();
    assert_eq!(
        runner_set.spec.actionable_revision, 1,
        "no drift, no new revision"
    );
}

#[tokio::test]
async fn outdated_parks_the_set_and_a_spec_change_that_leaves_the_runner_spec_alone_recovers() {
    let h = Harness::start("ars-outdated").await;
    h.running(template(json!(null))).await;
    // The listener scaled the set; then its runners reject the spec.
    h.runner_sets()
        .patch(
            NAME,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 3, "patchID": 5}})),
        )
        .await
        .unwrap();
    merge_status(
        &h.runner_sets(),
        NAME,
        json!({"status": {"phase": "Outdated", "appliedActionableRevision": 1}}),
    )
    .await;

    h.set_until("the set is Outdated", |set| {
        phase(set) == Some(AutoscalingRunnerSetPhase::Outdated)
    })
    .await;
    let parked = h
        .runner_set_until("the set is pinned at zero", |set| {
            set.spec.replicas == 0 && set.spec.patch_id == 0
        })
        .await;
    assert_eq!(parked.spec.actionable_revision, 1, "kept, not deleted");
    wait_listeners(&h.listeners, |events| {
        matches!(events.last(), Some(ListenerEvent::Stopped(..)))
    })
    .await;

    let runner_spec = parked.spec.ephemeral_runner_spec.clone();
    let generation = h.patch_spec(json!({"minRunners": 1})).await;
    let set = h
        .set_until("the set recovers", |set| {
            set.status.as_ref().and_then(|s| s.observed_generation) == Some(generation)
        })
        .await;
    assert_eq!(phase(&set), Some(AutoscalingRunnerSetPhase::Running));
    let recovered = h.runner_sets().get(NAME).await.unwrap();
    assert_eq!(
        recovered.spec.actionable_revision, 2,
        "an advanced revision"
    );
    assert_eq!(
        recovered.spec.ephemeral_runner_spec, runner_spec,
        "the same runner spec"
    );
    let history = wait_listeners(&h.listeners, |events| {
        matches!(events.last(), Some(ListenerEvent::Started(..)))
    })
    .await;
    assert_eq!(history.len(), 3, "started, stopped, started: {history:?}");
    assert_eq!(
        recovered.status.and_then(|s| s.phase),
        Some(EphemeralRunnerSetPhase::Outdated),
        "the set's own verdict is about the old revision until it applies the new one"
    );
}

#[tokio::test]
async fn label_only_change_shows_pending_and_restarts_the_listener() {
    let h = Harness::start("ars-labels").await;
    let set = h.running(template(json!(null))).await;
    let generation = set.metadata.generation;
    let mut phases = h.record_phases();
    wait_phases(&mut phases, |seen| {
        seen == [AutoscalingRunnerSetPhase::Running]
    })
    .await;

    h.sets()
        .patch(
            NAME,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"team": "ci"}}})),
        )
        .await
        .unwrap();
    let seen = wait_phases(&mut phases, |seen| {
        seen.ends_with(&[
            AutoscalingRunnerSetPhase::Pending,
            AutoscalingRunnerSetPhase::Running,
        ])
    })
    .await;
    assert_eq!(seen.len(), 3, "Running, Pending, Running: {seen:?}");
    let history = wait_listeners(&h.listeners, |events| events.len() == 3).await;
    match &history[..] {
        [
            ListenerEvent::Started(first),
            ListenerEvent::Stopped(..),
            ListenerEvent::Started(second),
        ] => {
            assert!(!first.labels.contains_key("team"));
            assert_eq!(second.labels.get("team").map(String::as_str), Some("ci"));
        }
        other => panic!("a restart: {other:?}"),
    }
    let set = h.sets().get(NAME).await.unwrap();
    assert_eq!(
        set.metadata.generation, generation,
        "labels do not move the generation"
    );
}

#[tokio::test]
async fn a_reconcile_from_a_copy_older_than_its_own_status_write_changes_nothing() {
    let h = Harness::start("ars-stale-copy").await;
    let created = h.create(template(json!(null))).await;
    let set = h
        .set_until("the set runs", |set| {
            phase(set) == Some(AutoscalingRunnerSetPhase::Running)
                && set.status.as_ref().and_then(|s| s.observed_generation)
                    == set.metadata.generation
        })
        .await;
    // The copy a watch can still hold when the reconcile that wrote the
    // last status is followed by the one its own writes queued: the id
    // recorded, the generation not yet observed.
    let mut stale = set.clone();
    stale.metadata.resource_version = created.metadata.resource_version.clone();
    let status = stale.status.as_mut().unwrap();
    status.phase = Some(AutoscalingRunnerSetPhase::Pending);
    status.observed_generation = None;
    let calls = h.fake.control().counters().total_calls();

    controller::reconcile(Arc::new(stale), h.context.clone())
        .await
        .expect("the reconcile succeeds");

    let after = h.sets().get(NAME).await.unwrap();
    assert_eq!(
        after.resource_version(),
        set.resource_version(),
        "nothing written: no Pending flap, no status rewrite"
    );
    assert_eq!(
        h.fake.control().counters().total_calls(),
        calls,
        "the scale set is not synced with the service again"
    );
    assert_eq!(h.listeners.history().len(), 1, "the listener kept running");
}

/// Waits until `name` is gone.
async fn until_gone<K>(api: Api<K>, name: &str, what: &str)
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    tokio::time::timeout(
        WAIT,
        await_condition(api, name, |o: Option<&K>| o.is_none()),
    )
    .await
    .expect(what)
    .unwrap();
}

/// Merges `patch` into the status of `name`, as another controller would.
async fn merge_status<K>(api: &Api<K>, name: &str, patch: Value)
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
}

/// An EphemeralRunner of the set, as its controller would have created it.
async fn runner(h: &Harness, runner_set: &EphemeralRunnerSet, name: &str, busy: bool) {
    let runner: EphemeralRunner = serde_json::from_value(json!({
        "apiVersion": "arcwright.dev/v1alpha1",
        "kind": "EphemeralRunner",
        "metadata": {
            "name": name,
            "labels": {labels::SCALE_SET_NAME: NAME},
            "ownerReferences": [{
                "apiVersion": "arcwright.dev/v1alpha1", "kind": "EphemeralRunnerSet",
                "name": runner_set.name_any(), "uid": runner_set.uid().unwrap(), "controller": true
            }]
        },
        "spec": runner_set.spec.ephemeral_runner_spec,
    }))
    .unwrap();
    h.runners()
        .create(&PostParams::default(), &runner)
        .await
        .unwrap();
    if busy {
        merge_status(
            &h.runners(),
            name,
            json!({"status": {"jobId": "job-1", "jobRequestId": 11}}),
        )
        .await;
    }
}

#[tokio::test]
async fn deletion_stops_the_listener_waits_for_the_busy_runner_then_deletes_the_scale_set() {
    let h = Harness::start("ars-deletion").await;
    h.running(template(json!(null))).await;
    let runner_set = h.runner_sets().get(NAME).await.unwrap();
    runner(&h, &runner_set, "idle", false).await;
    runner(&h, &runner_set, "busy", true).await;

    h.sets()
        .delete(NAME, &DeleteParams::default())
        .await
        .unwrap();
    wait_listeners(&h.listeners, |events| {
        matches!(events.last(), Some(ListenerEvent::Stopped(..)))
    })
    .await;
    until_gone(h.runners(), "idle", "the idle runner goes").await;
    h.runner_set_until("the set is pinned at zero", |set| {
        set.spec.replicas == 0 && set.spec.patch_id == 0
    })
    .await;
    let busy = h
        .runners()
        .get("busy")
        .await
        .expect("the busy runner stays");
    assert!(
        busy.metadata.deletion_timestamp.is_none(),
        "its job is not cancelled"
    );
    assert_eq!(
        h.fake.control().scale_sets().len(),
        1,
        "the scale set outlives the runners"
    );
    assert!(h.sets().get_opt(NAME).await.unwrap().is_some());

    // The job ends.
    merge_status(
        &h.runners(),
        "busy",
        json!({"status": {"jobId": null, "jobRequestId": 0}}),
    )
    .await;
    until_gone(h.sets(), NAME, "the scale set object goes").await;
    assert!(h.runners().get_opt("busy").await.unwrap().is_none());
    assert!(h.runner_sets().get_opt(NAME).await.unwrap().is_none());
    assert!(
        h.fake.control().scale_sets().is_empty(),
        "deleted in the service"
    );
}

#[tokio::test]
async fn deletion_with_the_secret_gone_says_why_and_an_annotation_forces_it() {
    let h = Harness::start("ars-secret-gone").await;
    h.running(template(json!(null))).await;
    // The Secret is held while the set uses it; gone anyway, as when an
    // admin strips the finalizer from a Secret being deleted.
    let secrets = Api::<Secret>::namespaced(h.env.client(), h.env.namespace());
    common::wait_credentials_held(h.env.client(), h.env.namespace()).await;
    secrets
        .delete("github-auth", &DeleteParams::default())
        .await
        .unwrap();
    secrets
        .patch(
            "github-auth",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    eventually("the Secret is gone", WAIT, || async {
        secrets
            .get_opt("github-auth")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    h.sets()
        .delete(NAME, &DeleteParams::default())
        .await
        .unwrap();

    let set = h
        .set_until("the deletion is blocked", |set| {
            set.status
                .as_ref()
                .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == DELETION_CONDITION))
        })
        .await;
    let condition = set
        .status
        .as_ref()
        .unwrap()
        .conditions
        .iter()
        .find(|c| c.type_ == DELETION_CONDITION)
        .unwrap()
        .clone();
    assert_eq!(
        condition.reason,
        DeletionBlockedReason::SecretMissing.as_str()
    );
    assert!(
        condition.message.contains(annotations::FORCE_DELETE),
        "{}",
        condition.message
    );
    assert!(
        h.runner_sets().get_opt(NAME).await.unwrap().is_none(),
        "runners went first"
    );

    h.sets()
        .patch(
            NAME,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {annotations::FORCE_DELETE: "true"}}}),
            ),
        )
        .await
        .unwrap();
    until_gone(h.sets(), NAME, "the forced deletion finishes").await;
    assert_eq!(
        h.fake.control().scale_sets().len(),
        1,
        "without credentials the scale set stays registered"
    );
}

#[tokio::test]
async fn a_set_finalized_under_the_former_finalizer_name_is_still_cleaned_up() {
    let h = Harness::start("ars-former-finalizer").await;
    h.running(template(json!(null))).await;
    // As an older version left it: the finalizer under its former name.
    let former = finalizers::AUTOSCALING_RUNNER_SET.formerly[0];
    let set = h
        .sets()
        .patch(
            NAME,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": [former]}})),
        )
        .await
        .unwrap();
    assert_eq!(set.finalizers(), [former.to_string()]);

    h.sets()
        .delete(NAME, &DeleteParams::default())
        .await
        .unwrap();
    until_gone(h.sets(), NAME, "the set goes").await;
    assert!(
        matches!(
            h.listeners.history().last(),
            Some(ListenerEvent::Stopped(..))
        ),
        "the listener was stopped: {:?}",
        h.listeners.history()
    );
    assert!(h.runner_sets().get_opt(NAME).await.unwrap().is_none());
    assert!(
        h.fake.control().scale_sets().is_empty(),
        "the scale set was deleted in the service, not just the finalizer dropped"
    );
}

#[tokio::test]
async fn runner_set_updates_outside_the_projection_do_not_wake_the_scale_set() {
    let h = Harness::start("ars-predicate").await;
    h.running(template(json!([]))).await;
    let delivered = || h.metrics.owned_updates_of(CONTROLLER, true);
    let dropped = || h.metrics.owned_updates_of(CONTROLLER, false);
    eventually("the set is seen", WAIT, || async {
        (delivered() > 0).then_some(())
    })
    .await;
    let dropped_before = dropped();
    let delivered_before = delivered();

    // What the set's own controller and the listener write all the time:
    // counters, conditions, replicas and patch ids. Nothing the scale set
    // reads while it is not Outdated.
    for running in 1..=3 {
        merge_status(
            &h.runner_sets(),
            NAME,
            json!({"status": {"runningEphemeralRunners": running, "currentReplicas": running}}),
        )
        .await;
    }
    for (replicas, patch_id) in [(2, 1), (3, 2)] {
        h.runner_sets()
            .patch(
                NAME,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": replicas, "patchID": patch_id}})),
            )
            .await
            .unwrap();
    }
    // Then a change it reads. One watch delivers in order, so once this
    // one is judged the five before it have been.
    h.runner_sets()
        .patch(
            NAME,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"team": "ci"}}})),
        )
        .await
        .unwrap();
    eventually("the six writes are judged", WAIT, || async {
        (dropped() + delivered() >= dropped_before + delivered_before + 6).then_some(())
    })
    .await;
    assert_eq!(
        dropped() - dropped_before,
        5,
        "the five writes were dropped"
    );
    assert_eq!(
        delivered() - delivered_before,
        1,
        "one wake-up for six writes"
    );

    // The counts still reach the scale set's status: the wake-up copied
    // them, and while they move the scale set looks again on a short beat
    // (not the five-minute resync) to copy them again.
    h.set_until("the counts copied", |set| {
        set.status
            .as_ref()
            .is_some_and(|s| s.running_ephemeral_runners == 3)
    })
    .await;
    merge_status(
        &h.runner_sets(),
        NAME,
        json!({"status": {"runningEphemeralRunners": 5, "currentReplicas": 5}}),
    )
    .await;
    h.set_until("the moved counts copied without a wake-up", |set| {
        set.status
            .as_ref()
            .is_some_and(|s| s.running_ephemeral_runners == 5 && s.current_runners == 5)
    })
    .await;
}

/// The set's `Stalled` condition, once it is there.
async fn stalled_until(h: &Harness, what: &str, done: impl Fn(&Condition) -> bool) -> Condition {
    let set = h
        .set_until(what, |set| {
            set.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == STALLED_CONDITION && done(c))
            })
        })
        .await;
    set.status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == STALLED_CONDITION)
        .unwrap()
}

/// The notes of the set's `Stalled` events.
async fn stalled_notes(h: &Harness) -> Vec<String> {
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(h.env.client(), h.env.namespace());
    let stalled = AutoscalingRunnerSetEvent::Stalled.as_str();
    let list = events.list(&Default::default()).await.unwrap();
    list.items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(stalled))
        .filter_map(|e| e.note)
        .collect()
}

#[tokio::test]
async fn a_set_whose_credentials_are_missing_is_stalled_says_why_and_recovers() {
    let h = Harness::start("ars-stalled-credentials").await;
    let condition = stalled_by(&h, |spec| spec["githubConfigSecret"] = json!("other-auth")).await;
    assert_eq!(condition.status, "True");
    assert_eq!(
        condition.reason,
        StalledReason::CredentialsUnusable.as_str()
    );
    assert!(
        condition.message.contains("other-auth") && condition.message.contains("does not exist"),
        "{}",
        condition.message
    );
    let notes = eventually("a Stalled event", WAIT, || async {
        let notes = stalled_notes(&h).await;
        (!notes.is_empty()).then_some(notes)
    })
    .await;
    assert_eq!(
        notes,
        [format!("CredentialsUnusable: {}", condition.message)],
        "one event, naming the reason and the failure"
    );
    assert!(
        h.fake.control().scale_sets().is_empty(),
        "nothing registered"
    );

    // The Secret arrives: the set registers, runs, and is no longer stalled.
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "other-auth"},
        "stringData": {"github_token": h.fake.pat()},
    }))
    .unwrap();
    Api::<Secret>::namespaced(h.env.client(), h.env.namespace())
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    h.set_until("the set runs and is not stalled", |set| {
        set.status.as_ref().is_some_and(|s| {
            s.phase == Some(AutoscalingRunnerSetPhase::Running)
                && s.conditions.iter().all(|c| c.type_ != STALLED_CONDITION)
        })
    })
    .await;
    assert_eq!(h.fake.control().scale_sets().len(), 1);
}

#[tokio::test]
async fn a_set_whose_service_cannot_be_reached_says_why_with_the_cause() {
    let h = Harness::start("ars-stalled-unreachable").await;
    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let condition = stalled_by(&h, |spec| {
        spec["githubConfigUrl"] = json!(format!("http://127.0.0.1:{port}/octo-org"));
    })
    .await;
    assert_eq!(condition.reason, StalledReason::ActionsUnavailable.as_str());
    // The cause, not only "error sending request".
    assert!(
        condition.message.to_lowercase().contains("connect"),
        "{}",
        condition.message
    );
    assert!(
        !condition.message.contains(h.fake.pat()),
        "no credential in the message"
    );
    assert_eq!(
        phase(&h.sets().get(NAME).await.unwrap()),
        Some(AutoscalingRunnerSetPhase::Pending)
    );
}

#[tokio::test]
async fn a_secret_the_spec_no_longer_names_is_released_and_can_be_deleted() {
    let h = Harness::start("ars-rotated-credentials").await;
    h.running(template(json!(null))).await;
    common::wait_credentials_held(h.env.client(), h.env.namespace()).await;
    let secrets = Api::<Secret>::namespaced(h.env.client(), h.env.namespace());
    let holds = |secret: &Secret| {
        secret
            .finalizers()
            .iter()
            .any(|f| f == finalizers::CREDENTIALS_IN_USE.name)
    };

    // Rotated credentials: a new Secret, and the spec names it.
    let rotated: Secret = serde_json::from_value(json!({
        "metadata": {"name": "rotated-auth"},
        "stringData": {"github_token": h.fake.pat()},
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &rotated)
        .await
        .unwrap();
    h.patch_spec(json!({"githubConfigSecret": "rotated-auth"}))
        .await;
    eventually(
        "the new Secret is held and the old one let go",
        WAIT,
        || async {
            let new = secrets.get("rotated-auth").await.ok()?;
            let old = secrets.get("github-auth").await.ok()?;
            (holds(&new) && !holds(&old)).then_some(())
        },
    )
    .await;
    // The set records the Secret it holds now (written after the release,
    // in the same pass).
    eventually("the set records the new Secret", WAIT, || async {
        let set = h.sets().get(NAME).await.ok()?;
        (set.annotations()
            .get(annotations::CREDENTIALS_SECRET)
            .map(String::as_str)
            == Some("rotated-auth"))
        .then_some(())
    })
    .await;

    // The old Secret can go now; the set runs on.
    secrets
        .delete("github-auth", &DeleteParams::default())
        .await
        .unwrap();
    until_gone(secrets.clone(), "github-auth", "the old Secret is deleted").await;
    h.set_until("the set runs on the new Secret", |set| {
        phase(set) == Some(AutoscalingRunnerSetPhase::Running)
            && set.status.as_ref().and_then(|s| s.observed_generation) == set.metadata.generation
    })
    .await;
}

/// Creates the set with `spec` changed by `change`, and waits until it is
/// stalled; the condition.
async fn stalled_by(h: &Harness, change: impl FnOnce(&mut Value)) -> Condition {
    let mut spec = h.spec(template(json!(null)));
    change(&mut spec);
    let set: AutoscalingRunnerSet = serde_json::from_value(json!({
        "apiVersion": "arcwright.dev/v1alpha1",
        "kind": "AutoscalingRunnerSet",
        "metadata": {"name": NAME},
        "spec": spec,
    }))
    .unwrap();
    h.sets().create(&PostParams::default(), &set).await.unwrap();
    stalled_until(h, "the set is stalled", |_| true).await
}

#[tokio::test]
async fn an_app_key_that_is_not_a_key_is_stalled_as_unusable_credentials_without_the_key() {
    let h = Harness::start("ars-stalled-app-key").await;
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "app-auth"},
        "stringData": {
            "github_app_id": "12345",
            "github_app_installation_id": "67890",
            "github_app_private_key": "SECRET-MATERIAL-that-is-no-pem",
        },
    }))
    .unwrap();
    Api::<Secret>::namespaced(h.env.client(), h.env.namespace())
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let condition = stalled_by(&h, |spec| spec["githubConfigSecret"] = json!("app-auth")).await;
    assert_eq!(
        condition.reason,
        StalledReason::CredentialsUnusable.as_str()
    );
    assert!(
        condition.message.contains("github_app_private_key"),
        "{}",
        condition.message
    );
    assert!(
        !condition.message.contains("SECRET-MATERIAL"),
        "{}",
        condition.message
    );
    assert!(
        h.fake.control().scale_sets().is_empty(),
        "nothing registered"
    );
}

#[tokio::test]
async fn a_pod_validation_policy_that_cannot_be_loaded_stalls_the_set_saying_which_and_why() {
    let h = Harness::start("ars-stalled-policy").await;
    // An unknown builtin.
    let condition = stalled_by(&h, |spec| {
        spec["podValidationPolicy"] = json!({"builtin": "no-such-policy"});
    })
    .await;
    assert_eq!(condition.reason, StalledReason::PolicyUnavailable.as_str());
    assert!(
        condition.message.contains("no-such-policy"),
        "{}",
        condition.message
    );
    // A ConfigMap that does not exist.
    h.patch_spec(json!({"podValidationPolicy": {
        "builtin": null,
        "configMapRef": {"name": "checks"},
    }}))
    .await;
    let condition = stalled_until(&h, "the missing ConfigMap is named", |c| {
        c.message.contains("checks") && c.message.contains("does not exist")
    })
    .await;
    assert_eq!(condition.reason, StalledReason::PolicyUnavailable.as_str());
    // A ConfigMap without the module.
    let config_map: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "checks"},
        "data": {"notes": "the module was never added"},
    }))
    .unwrap();
    Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(h.env.client(), h.env.namespace())
        .create(&PostParams::default(), &config_map)
        .await
        .unwrap();
    stalled_until(&h, "the missing key is named", |c| {
        c.message.contains("no binaryData key")
    })
    .await;
    // Told in an event too. (Events of one reason on one object are one
    // series, which carries the first note.)
    let notes = eventually("a Stalled event", WAIT, || async {
        let notes = stalled_notes(&h).await;
        (!notes.is_empty()).then_some(notes)
    })
    .await;
    assert!(
        notes
            .iter()
            .all(|n| n.starts_with("PolicyUnavailable") && n.contains("pod validation")),
        "{notes:?}"
    );
    // Nothing registered while the template could not be judged.
    assert!(h.fake.control().scale_sets().is_empty());

    // The reference goes: the bundled default judges, and the set runs.
    h.patch_spec(json!({"podValidationPolicy": null})).await;
    h.set_until("the set runs and is not stalled", |set| {
        phase(set) == Some(AutoscalingRunnerSetPhase::Running)
            && set
                .status
                .as_ref()
                .is_some_and(|s| !s.conditions.iter().any(|c| c.type_ == STALLED_CONDITION))
    })
    .await;
}

#[tokio::test]
async fn a_template_of_thousands_of_containers_is_refused_when_applied() {
    let h = Harness::start("ars-many-containers").await;
    let runner = json!({"name": "runner", "image": "ghcr.io/actions/actions-runner:2.330.0"});
    let many = |n: usize| -> Vec<Value> {
        std::iter::once(runner.clone())
            .chain((1..n).map(|i| json!({"name": format!("side-{i}"), "image": "busybox"})))
            .collect()
    };
    let set = |template: Value| -> AutoscalingRunnerSet {
        serde_json::from_value(json!({
            "apiVersion": "arcwright.dev/v1alpha1",
            "kind": "AutoscalingRunnerSet",
            "metadata": {"name": NAME},
            "spec": h.spec(template),
        }))
        .unwrap()
    };
    for template in [
        json!({"spec": {"restartPolicy": "Never", "containers": many(3000)}}),
        json!({"spec": {
            "restartPolicy": "Never",
            "containers": many(1),
            "initContainers": many(3000)[1..].to_vec(),
        }}),
    ] {
        let refused = h
            .sets()
            .create(&PostParams::default(), &set(template))
            .await
            .expect_err("refused");
        let kube::Error::Api(status) = refused else {
            panic!("{refused:?}")
        };
        assert_eq!(status.code, 422, "{status:?}");
        assert!(
            status.message.contains("must have at most 64 items"),
            "{}",
            status.message
        );
    }
    // The bound itself is accepted.
    h.sets()
        .create(
            &PostParams::default(),
            &set(json!({"spec": {"restartPolicy": "Never", "containers": many(64)}})),
        )
        .await
        .unwrap();
}

/// A set created while another leaves, after the leaving one looked for
/// peers naming their shared Secret and before it took the finalizer off:
/// the newcomer read the finalizer as held and did nothing. The release
/// looks again after its write and gives the Secret back its finalizer.
#[tokio::test]
async fn a_set_created_while_another_releases_their_secret_finds_it_held() {
    let env = TestEnv::new("ars-credentials-race").await;
    common::install_crds(env.client()).await;
    common::github_secret(env.client(), env.namespace(), "ghp_unused").await;
    let sets: Api<AutoscalingRunnerSet> = Api::namespaced(env.client(), env.namespace());
    let secrets: Api<Secret> = Api::namespaced(env.client(), env.namespace());
    let create = |name: &'static str| {
        let sets = sets.clone();
        async move {
            let set: AutoscalingRunnerSet = serde_json::from_value(json!({
                "apiVersion": "arcwright.dev/v1alpha1",
                "kind": "AutoscalingRunnerSet",
                "metadata": {"name": name},
                "spec": {
                    "githubConfigUrl": "https://github.com/octo-org",
                    "githubConfigSecret": "github-auth",
                    "template": template(json!(null)),
                },
            }))
            .unwrap();
            sets.create(&PostParams::default(), &set).await.unwrap()
        }
    };
    let holds = || async {
        secrets
            .get("github-auth")
            .await
            .unwrap()
            .finalizers()
            .iter()
            .any(|f| f == finalizers::CREDENTIALS_IN_USE.name)
    };
    let leaving = create("leaving").await;
    controller::credentials_hold::hold(&env.client(), env.namespace(), "github-auth")
        .await
        .unwrap();
    // The newcomer arrives after the leaving set's pass found no peer.
    let newcomer = create("newcomer").await;
    let released = controller::credentials_hold::release(
        &env.client(),
        env.namespace(),
        "github-auth",
        &leaving,
    )
    .await
    .unwrap();
    assert_eq!(
        released,
        controller::credentials_hold::Released::HeldForAnother
    );
    assert!(holds().await, "the newcomer's Secret is held");

    // With both gone, the last release lets the Secret go.
    for name in ["leaving", "newcomer"] {
        sets.delete(name, &DeleteParams::default()).await.unwrap();
        until_gone(sets.clone(), name, "the set is deleted").await;
    }
    let released = controller::credentials_hold::release(
        &env.client(),
        env.namespace(),
        "github-auth",
        &newcomer,
    )
    .await
    .unwrap();
    assert_eq!(released, controller::credentials_hold::Released::Released);
    assert!(!holds().await, "released");
}
