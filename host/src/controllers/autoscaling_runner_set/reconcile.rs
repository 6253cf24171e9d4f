//! Observing an AutoscalingRunnerSet and applying its plan: every call to
//! the Kubernetes API and the Actions service this controller makes.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference, Time};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Resource, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::actions::{ActionsClient, ActionsError, RunnerScaleSet};
use crate::api::{
    AutoscalingRunnerSet, AutoscalingRunnerSetPhase, EphemeralRunner, EphemeralRunnerSet,
    EphemeralRunnerSetPhase, EphemeralRunnerSpec, labels,
};
use crate::controllers::metrics::ControllerMetrics;
use crate::credentials::{ActionsClientSource, CredentialsError};
use crate::policy::loader::{LoadedPolicy, PolicyLoader, PolicyRef};
use crate::policy::types::{PodValidationInput, Violation};
use crate::policy::{PolicyKind, PolicyReporter};

use super::plan::{
    self, DeletionObserved, DeletionStep, ListenerStep, Observed, RunnerObserved,
    RunnerSetObserved, RunnerSetStep, StatusOutcome, TemplateVerdict,
};
use super::{
    CONTROLLER, DELETION_CONDITION, Error, FIELD_MANAGER, FINALIZER, FORCE_DELETE_ANNOTATION,
    ListenerConfig, ListenerControl, SCALE_SET_ID_ANNOTATION, TEMPLATE_CONDITION, watch,
};

/// How often a settled scale set is looked at again anyway.
const RESYNC: Duration = Duration::from_secs(300);

/// How soon to look again while the runner counts copied from the
/// EphemeralRunnerSet are moving. The owned watch does not wake the scale
/// set on counter changes (a reconcile and a status write per runner
/// otherwise), so during a burst the copy is refreshed on this beat, and
/// settles back to [`RESYNC`] once they have not changed for
/// [`COUNTS_SETTLED`].
const COUNTS_RESYNC: Duration = Duration::from_secs(10);

/// How long after the counts last changed they count as moving. Any
/// reconcile sets the next look (the scale set's own status write wakes
/// it too), so "moving" is remembered, not judged from one pass.
const COUNTS_SETTLED: Duration = Duration::from_secs(60);
/// How soon a deletion waiting for runners looks again.
const DELETION_POLL: Duration = Duration::from_secs(1);
/// How soon a blocked deletion looks again (an annotation or a restored
/// Secret wakes it sooner through the watch).
const BLOCKED_POLL: Duration = Duration::from_secs(30);
/// How soon a failed reconcile is retried.
const RETRY: Duration = Duration::from_secs(5);

/// What the reconciler needs: the API client, the listeners, the Actions
/// clients and the pod-validation policies.
pub struct Context<L, S> {
    client: kube::Client,
    listeners: L,
    actions: S,
    policies: PolicyLoader,
    reporter: Arc<dyn PolicyReporter>,
    recorder: Recorder,
    metrics: ControllerMetrics,
    /// One loaded pod-validation policy per scale set, kept while its
    /// reference is unchanged, so a ConfigMap-backed policy is watched once
    /// and not reloaded on every reconcile.
    validators: Mutex<HashMap<(String, String), Validator>>,
    /// When each scale set's copied runner counts last changed.
    counts_changed: Mutex<HashMap<(String, String), std::time::Instant>>,
}

/// A loaded pod-validation policy and the reference it was loaded for.
type Validator = (Option<PolicyRef>, Arc<LoadedPolicy>);

impl<L: ListenerControl, S: ActionsClientSource> Context<L, S> {
    /// A context; `reporter` hears about policies that fail to load.
    pub fn new(
        client: kube::Client,
        listeners: L,
        actions: S,
        policies: PolicyLoader,
        reporter: Arc<dyn PolicyReporter>,
    ) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: FIELD_MANAGER.into(),
                instance: None,
            },
        );
        Self {
            client,
            listeners,
            actions,
            policies,
            reporter,
            recorder,
            metrics: ControllerMetrics::default(),
            validators: Mutex::default(),
            counts_changed: Mutex::default(),
        }
    }

    /// Reports reconcile durations and errors in `metrics` (the process's
    /// registered ones) instead of unregistered ones.
    pub fn with_metrics(mut self, metrics: ControllerMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The metrics reconciles report to.
    pub fn metrics(&self) -> &ControllerMetrics {
        &self.metrics
    }

    /// The listeners this controller starts and stops.
    pub fn listeners(&self) -> &L {
        &self.listeners
    }
}

/// Runs the controller until `shutdown` resolves: every
/// AutoscalingRunnerSet in `namespace` (all when `None`), woken by its own
/// updates and by the updates of its EphemeralRunnerSet that change what
/// it reads ([`watch`]). `synced` hears when the sets are listed.
pub async fn run<L: ListenerControl, S: ActionsClientSource>(
    context: Arc<Context<L, S>>,
    namespace: Option<&str>,
    shutdown: CancellationToken,
    synced: crate::controllers::kit::Synced,
) {
    let client = context.client.clone();
    let (sets, runner_sets): (Api<AutoscalingRunnerSet>, Api<EphemeralRunnerSet>) = match namespace
    {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client, ns),
        ),
        None => (Api::all(client.clone()), Api::all(client)),
    };
    let metrics = context.metrics.clone();
    let owned = watch::filtered(
        watcher::watcher(runner_sets, watcher::Config::default()),
        move |delivered| metrics.owned_update(CONTROLLER, delivered),
    );
    let (reader, writer) = reflector::store();
    let (events, listed) = synced.on_listed(
        watcher::watcher(sets, watcher::Config::default())
            .default_backoff()
            .reflect(writer),
    );
    let controller = Controller::for_stream(events.applied_objects(), reader)
        .owns_stream(owned)
        .graceful_shutdown_on(shutdown.clone().cancelled_owned())
        .run(reconcile, error_policy, context)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::warn!(%error, "autoscaling runner set reconcile failed");
            }
        });
    crate::controllers::kit::until_shutdown(controller, &shutdown, listed).await;
}

fn error_policy<L: ListenerControl, S: ActionsClientSource>(
    set: Arc<AutoscalingRunnerSet>,
    error: &Error,
    context: Arc<Context<L, S>>,
) -> Action {
    context.metrics.error(CONTROLLER, error.metric_label());
    tracing::warn!(
        name = %set.name_any(),
        namespace = set.namespace().unwrap_or_default(),
        kind = error.metric_label(),
        %error,
        "reconcile failed; retrying"
    );
    Action::requeue(RETRY)
}

fn kube_err(action: &'static str) -> impl FnOnce(kube::Error) -> Error {
    move |source| Error::Kube { action, source }
}

fn actions_err(action: &'static str) -> impl FnOnce(ActionsError) -> Error {
    move |source| Error::Actions { action, source }
}

/// One reconcile of one AutoscalingRunnerSet.
pub async fn reconcile<L: ListenerControl, S: ActionsClientSource>(
    set: Arc<AutoscalingRunnerSet>,
    context: Arc<Context<L, S>>,
) -> Result<Action, Error> {
    let span = tracing::info_span!(
        "reconcile",
        namespace = set.namespace().unwrap_or_default(),
        name = set.name_any()
    );
    let _timer = context.metrics.time(CONTROLLER);
    reconcile_set(set, context).instrument(span).await
}

async fn reconcile_set<L: ListenerControl, S: ActionsClientSource>(
    set: Arc<AutoscalingRunnerSet>,
    context: Arc<Context<L, S>>,
) -> Result<Action, Error> {
    let namespace = set.namespace().ok_or(Error::Incomplete("namespace"))?;
    let name = set.name_any();
    let apis = Apis::new(&context.client, &namespace);
    if set.metadata.deletion_timestamp.is_some() {
        if !set.finalizers().iter().any(|f| f == FINALIZER) {
            return Ok(Action::await_change());
        }
        return delete(&set, &context, &apis).await;
    }

    let mut set = set;
    let verdict = validate(&set, &context).await?;
    let runner_set = apis
        .runner_sets
        .get_opt(&name)
        .await
        .map_err(kube_err("reading the EphemeralRunnerSet"))?;
    let mut observed = observe(
        &set,
        runner_set.as_ref(),
        &context.listeners,
        verdict.clone(),
    );
    let mut decided = plan::plan(&observed);
    // As in the EphemeralRunner controller, a reconcile with nothing to do
    // is decided from the cache, a step on the API server's copy. The cache
    // may not hold this controller's own last status write yet: a reconcile
    // queued by the writes of the one before it can start from the copy in
    // between, with the id recorded but the generation not yet observed.
    // Acting on that copy would mark a running set Pending and sync the
    // scale set with the service a second time. So a plan that would do
    // either is made again from a quorum read (one per spec change); the
    // verdict is kept when the spec is the same, the runner set just read.
    if decided.sync_scale_set || decided.mark_pending {
        let fresh = apis
            .sets
            .get_opt(&name)
            .await
            .map_err(kube_err("reading the AutoscalingRunnerSet"))?;
        match fresh {
            Some(fresh) if fresh.resource_version() == set.resource_version() => {}
            // A deletion, or the object gone: the event that says so is
            // queued behind this reconcile, which the controller runs next.
            Some(fresh) if fresh.metadata.deletion_timestamp.is_some() => {
                return Ok(Action::await_change());
            }
            None => return Ok(Action::await_change()),
            Some(fresh) => {
                let verdict = if fresh.metadata.generation == set.metadata.generation {
                    verdict
                } else {
                    validate(&fresh, &context).await?
                };
                set = Arc::new(fresh);
                observed = observe(&set, runner_set.as_ref(), &context.listeners, verdict);
                decided = plan::plan(&observed);
            }
        }
    }
    if decided.add_finalizer {
        let mut finalizers = set.finalizers().to_vec();
        finalizers.push(FINALIZER.into());
        patch_finalizers(&apis.sets, &set, finalizers).await?;
    }
    let mut pending_written = false;
    if decided.sync_scale_set {
        if decided.mark_pending {
            mark_pending(&apis.sets, &name).await?;
            pending_written = true;
        }
        let client = context.actions.client(&super::github_target(&set)).await?;
        let id = sync_scale_set(&client, &set, observed.scale_set_id).await?;
        if observed.scale_set_id != Some(id) {
            let patch =
                json!({"metadata": {"annotations": {SCALE_SET_ID_ANNOTATION: id.to_string()}}});
            apis.sets
                .patch(
                    &name,
                    &PatchParams::apply(FIELD_MANAGER),
                    &Patch::Merge(&patch),
                )
                .await
                .map_err(kube_err("recording the scale set id"))?;
            apis.sets
                .patch_status(
                    &name,
                    &PatchParams::apply(FIELD_MANAGER),
                    &Patch::Merge(json!({"status": {"runnerScaleSetId": id}})),
                )
                .await
                .map_err(kube_err("recording the scale set id"))?;
        }
        observed.scale_set_synced = true;
        observed.scale_set_id = Some(id);
        observed.desired_runner_spec = desired_runner_spec(&set, id);
        observed.desired_listener = Some(desired_listener(&set, id));
        decided = plan::plan(&observed);
    }
    if decided.mark_pending && !pending_written {
        mark_pending(&apis.sets, &name).await?;
        pending_written = true;
    }

    match decided.runner_set {
        RunnerSetStep::Keep => {}
        RunnerSetStep::Create { revision } | RunnerSetStep::Publish { revision } => {
            publish_runner_set(&apis.runner_sets, &set, &observed, revision).await?;
        }
        RunnerSetStep::Park => {
            pin_runner_set(&apis.runner_sets, &name).await?;
        }
    }
    match decided.listener {
        ListenerStep::Keep => {}
        ListenerStep::Stop => context.listeners.stop(&namespace, &name).await,
        ListenerStep::Restart(config) => {
            context.listeners.stop(&namespace, &name).await;
            context.listeners.ensure(config).await?;
        }
        ListenerStep::Start(config) => context.listeners.ensure(config).await?,
    }

    if let Some(violations) = &decided.status.violations {
        announce_rejection(&context, &set, violations).await;
    }
    let counts_moved = write_status(
        &apis.sets,
        &set,
        &decided.status,
        observed.scale_set_id,
        runner_set.as_ref(),
        pending_written,
    )
    .await?;
    let key = (namespace.clone(), name.clone());
    let mut changed = context
        .counts_changed
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if counts_moved {
        changed.insert(key.clone(), std::time::Instant::now());
    }
    let moving = changed
        .get(&key)
        .is_some_and(|at| at.elapsed() < COUNTS_SETTLED);
    Ok(Action::requeue(if moving { COUNTS_RESYNC } else { RESYNC }))
}

struct Apis {
    sets: Api<AutoscalingRunnerSet>,
    runner_sets: Api<EphemeralRunnerSet>,
    runners: Api<EphemeralRunner>,
    secrets: Api<Secret>,
}

impl Apis {
    fn new(client: &kube::Client, namespace: &str) -> Self {
        Self {
            sets: Api::namespaced(client.clone(), namespace),
            runner_sets: Api::namespaced(client.clone(), namespace),
            runners: Api::namespaced(client.clone(), namespace),
            secrets: Api::namespaced(client.clone(), namespace),
        }
    }
}

/// The scale set id: the status, or the annotation when the status was
/// lost.
fn scale_set_id(set: &AutoscalingRunnerSet) -> Option<i64> {
    set.status
        .as_ref()
        .and_then(|s| s.runner_scale_set_id)
        .or_else(|| {
            set.annotations()
                .get(SCALE_SET_ID_ANNOTATION)
                .and_then(|id| id.parse().ok())
        })
        .filter(|id| *id > 0)
}

fn scale_set_name(set: &AutoscalingRunnerSet) -> String {
    set.spec
        .runner_scale_set_name
        .clone()
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| set.name_any())
}

fn desired_runner_spec(set: &AutoscalingRunnerSet, id: i64) -> EphemeralRunnerSpec {
    let spec = &set.spec;
    EphemeralRunnerSpec {
        github_config_url: spec.github_config_url.clone(),
        github_config_secret: spec.github_config_secret.clone(),
        runner_scale_set_id: id,
        proxy: spec.proxy.clone(),
        proxy_secret_ref: None,
        github_server_tls: spec.github_server_tls.clone(),
        ephemeral_runner_config_secret_metadata: spec
            .ephemeral_runner_config_secret_metadata
            .clone(),
        policies: spec.policies.clone(),
        debug: spec.debug.clone(),
        max_idle_age: spec.max_idle_age.clone(),
        metadata: spec.template.metadata.clone(),
        spec: spec.template.spec.clone().unwrap_or_default(),
    }
}

fn desired_listener(set: &AutoscalingRunnerSet, id: i64) -> ListenerConfig {
    ListenerConfig {
        namespace: set.namespace().unwrap_or_default(),
        name: set.name_any(),
        uid: set.uid(),
        runner_set_name: set.name_any(),
        scale_set_id: id,
        github: super::github_target(set),
        min_runners: set.spec.min_runners.unwrap_or(0),
        max_runners: set.spec.max_runners,
        scale_set_labels: set.spec.runner_scale_set_labels.clone(),
        labels: set.labels().clone(),
        scaling_policy: set.spec.policies.scaling_policy.clone(),
        holds_failures: set
            .spec
            .debug
            .as_ref()
            .is_some_and(|debug| debug.hold_failed_for.is_some()),
    }
}

fn desired_runner_set_labels(set: &AutoscalingRunnerSet) -> BTreeMap<String, String> {
    let mut wanted: BTreeMap<String, String> = set
        .spec
        .ephemeral_runner_set_metadata
        .as_ref()
        .and_then(|meta| meta.labels.clone())
        .unwrap_or_default();
    wanted.insert(labels::SCALE_SET_NAME.into(), set.name_any());
    wanted.insert(
        labels::SCALE_SET_NAMESPACE.into(),
        set.namespace().unwrap_or_default(),
    );
    wanted.insert(labels::COMPONENT.into(), "runner-set".into());
    wanted.insert(labels::PART_OF.into(), "arcwright".into());
    wanted
}

fn observe(
    set: &AutoscalingRunnerSet,
    runner_set: Option<&EphemeralRunnerSet>,
    listeners: &impl ListenerControl,
    template: TemplateVerdict,
) -> Observed {
    let status = set.status.clone().unwrap_or_default();
    let id = scale_set_id(set);
    Observed {
        generation: set.metadata.generation.unwrap_or(0),
        observed_generation: status.observed_generation,
        phase: status.phase,
        has_finalizer: set.finalizers().iter().any(|f| f == FINALIZER),
        template,
        scale_set_id: id,
        scale_set_synced: false,
        desired_runner_spec: desired_runner_spec(set, id.unwrap_or(0)),
        desired_runner_metadata: set.spec.ephemeral_runner_metadata.clone(),
        desired_runner_set_labels: desired_runner_set_labels(set),
        runner_set: runner_set.map(|runner_set| RunnerSetObserved {
            labels: runner_set.labels().clone(),
            spec: runner_set.spec.clone(),
            phase: runner_set
                .status
                .as_ref()
                .and_then(|s| s.phase)
                .unwrap_or(EphemeralRunnerSetPhase::Running),
            applied_revision: runner_set
                .status
                .as_ref()
                .map_or(0, |s| s.applied_actionable_revision),
        }),
        listener: listeners.running(&set.namespace().unwrap_or_default(), &set.name_any()),
        desired_listener: id.map(|id| desired_listener(set, id)),
    }
}

/// Runs the pod-validation policy on the template.
async fn validate<L: ListenerControl, S: ActionsClientSource>(
    set: &AutoscalingRunnerSet,
    context: &Context<L, S>,
) -> Result<TemplateVerdict, Error> {
    let namespace = set.namespace().unwrap_or_default();
    let reference = set.spec.policies.pod_validation_policy.clone();
    let key = (namespace.clone(), set.name_any());
    let cached = context
        .validators
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .get(&key)
        .filter(|(loaded_for, _)| *loaded_for == reference)
        .map(|(_, loaded)| Arc::clone(loaded));
    let loaded = match cached {
        Some(loaded) => loaded,
        None => {
            let loaded = Arc::new(
                context
                    .policies
                    .load(
                        PolicyKind::PodValidation,
                        &namespace,
                        reference.as_ref(),
                        Arc::clone(&context.reporter),
                    )
                    .await?,
            );
            context
                .validators
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .insert(key, (reference, Arc::clone(&loaded)));
            loaded
        }
    };
    let template = serde_json::to_value(&set.spec.template).unwrap_or_default();
    let decided = loaded
        .decider()
        .pod_validation(PodValidationInput { template })
        .await?;
    Ok(if decided.decision.violations.is_empty() {
        TemplateVerdict::Accepted
    } else {
        TemplateVerdict::Rejected(decided.decision.violations)
    })
}

fn violations_message(violations: &[Violation]) -> String {
    violations
        .iter()
        .map(|v| format!("{}: {}", v.path, v.message))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Publishes an event for a refused template, once per distinct set of
/// violations (the condition still carrying the same message means it was
/// announced).
async fn announce_rejection<L: ListenerControl, S: ActionsClientSource>(
    context: &Context<L, S>,
    set: &AutoscalingRunnerSet,
    violations: &[Violation],
) {
    let message = violations_message(violations);
    let announced = set
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == TEMPLATE_CONDITION))
        .is_some_and(|c| c.status == "False" && c.message == message);
    if announced {
        return;
    }
    let note = crate::events::note(format!(
        "the pod-validation policy refused the template: {message}"
    ));
    let event = Event {
        type_: EventType::Warning,
        reason: "PodTemplateRejected".into(),
        note: Some(note),
        action: "ValidatePodTemplate".into(),
        secondary: None,
    };
    if let Err(error) = context.recorder.publish(&event, &set.object_ref(&())).await {
        tracing::warn!(%error, "could not publish the template rejection event");
    }
}

async fn patch_finalizers(
    sets: &Api<AutoscalingRunnerSet>,
    set: &AutoscalingRunnerSet,
    finalizers: Vec<String>,
) -> Result<(), Error> {
    // The resource version makes this a compare-and-swap: a finalizer
    // another controller added meanwhile is not clobbered.
    let patch = json!({"metadata": {
        "finalizers": finalizers,
        "resourceVersion": set.resource_version(),
    }});
    sets.patch(
        &set.name_any(),
        &PatchParams::apply(FIELD_MANAGER),
        &Patch::Merge(&patch),
    )
    .await
    .map_err(kube_err("updating the finalizers"))?;
    Ok(())
}

async fn mark_pending(sets: &Api<AutoscalingRunnerSet>, name: &str) -> Result<(), Error> {
    sets.patch_status(
        name,
        &PatchParams::apply(FIELD_MANAGER),
        &Patch::Merge(json!({"status": {"phase": AutoscalingRunnerSetPhase::Pending}})),
    )
    .await
    .map_err(kube_err("marking the set pending"))?;
    Ok(())
}

/// Brings the scale set in the Actions service in line with the spec:
/// found by id when known (so a group change moves it rather than
/// registering a second one), else adopted by name, else created; its
/// labels, name and group updated only when they differ.
async fn sync_scale_set(
    client: &ActionsClient,
    set: &AutoscalingRunnerSet,
    known: Option<i64>,
) -> Result<i64, Error> {
    let group_id = match set.spec.runner_group.as_deref() {
        Some(group) if !group.is_empty() => {
            client
                .get_runner_group_by_name(group)
                .await
                .map_err(actions_err("resolving the runner group"))?
                .id
        }
        _ => 1,
    };
    let desired = RunnerScaleSet::new(
        scale_set_name(set),
        group_id,
        &set.spec.runner_scale_set_labels,
    );
    let mut existing = None;
    if let Some(id) = known {
        match client.get_runner_scale_set_by_id(id).await {
            Ok(found) => existing = Some(found),
            Err(ActionsError::ScaleSetNotFound { .. }) => {}
            Err(error) => return Err(actions_err("reading the scale set")(error)),
        }
    }
    if existing.is_none() {
        existing = client
            .get_runner_scale_set(group_id, &desired.name)
            .await
            .map_err(actions_err("looking the scale set up by name"))?;
    }
    let Some(current) = existing else {
        let created = client
            .create_runner_scale_set(&desired)
            .await
            .map_err(actions_err("creating the scale set"))?;
        tracing::info!(id = created.id, "registered the scale set");
        return Ok(created.id);
    };
    let mut current_labels: Vec<&str> = current.labels.iter().map(|l| l.name.as_str()).collect();
    let mut desired_labels: Vec<&str> = desired.labels.iter().map(|l| l.name.as_str()).collect();
    current_labels.sort_unstable();
    desired_labels.sort_unstable();
    if current.name != desired.name
        || current.runner_group_id != desired.runner_group_id
        || current_labels != desired_labels
    {
        client
            .update_runner_scale_set(current.id, &desired)
            .await
            .map_err(actions_err("updating the scale set"))?;
        tracing::info!(id = current.id, "updated the scale set");
    }
    Ok(current.id)
}

/// Creates or updates the EphemeralRunnerSet with server-side apply.
/// `replicas` and `patchID` are left out: they belong to the listener, and
/// owning them here would reset a scaling decision on every publish.
async fn publish_runner_set(
    runner_sets: &Api<EphemeralRunnerSet>,
    set: &AutoscalingRunnerSet,
    observed: &Observed,
    revision: i64,
) -> Result<(), Error> {
    let owner = OwnerReference {
        api_version: AutoscalingRunnerSet::api_version(&()).into_owned(),
        kind: AutoscalingRunnerSet::kind(&()).into_owned(),
        name: set.name_any(),
        uid: set.uid().ok_or(Error::Incomplete("uid"))?,
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    let annotations = set
        .spec
        .ephemeral_runner_set_metadata
        .as_ref()
        .and_then(|meta| meta.annotations.clone())
        .unwrap_or_default();
    let mut spec = json!({
        "actionableRevision": revision,
        "ephemeralRunnerSpec": observed.desired_runner_spec,
    });
    if let Some(metadata) = &observed.desired_runner_metadata {
        spec["ephemeralRunnerMetadata"] = json!(metadata);
    }
    let object = json!({
        "apiVersion": EphemeralRunnerSet::api_version(&()),
        "kind": EphemeralRunnerSet::kind(&()),
        "metadata": {
            "name": set.name_any(),
            "labels": observed.desired_runner_set_labels,
            "annotations": annotations,
            "ownerReferences": [owner],
        },
        "spec": spec,
    });
    runner_sets
        .patch(
            &set.name_any(),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&object),
        )
        .await
        .map_err(kube_err("applying the EphemeralRunnerSet"))?;
    Ok(())
}

/// `conditions` with the condition of `type_` set; its transition time
/// kept when its status did not change.
fn with_condition(
    conditions: &[Condition],
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
) -> Vec<Condition> {
    let status = if status { "True" } else { "False" };
    let previous = conditions.iter().find(|c| c.type_ == type_);
    let last_transition_time = previous
        .filter(|c| c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| Time(jiff::Timestamp::now()));
    let mut next: Vec<Condition> = conditions
        .iter()
        .filter(|c| c.type_ != type_)
        .cloned()
        .collect();
    next.push(Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        observed_generation: generation,
        last_transition_time,
    });
    next
}

/// Writes the status the plan ended with, unless it is already there (an
/// unchanged status is not written, so the set does not wake itself).
async fn write_status(
    sets: &Api<AutoscalingRunnerSet>,
    set: &AutoscalingRunnerSet,
    outcome: &StatusOutcome,
    scale_set_id: Option<i64>,
    runner_set: Option<&EphemeralRunnerSet>,
    pending_written: bool,
) -> Result<bool, Error> {
    // The listener's fields are the listener's: left out of the comparison
    // and of the patch, so a status written here never undoes one the
    // listener wrote meanwhile.
    let mut current = set.status.clone().unwrap_or_default();
    current.listener = None;
    current.scaling = None;
    let mut next = current.clone();
    next.phase = Some(outcome.phase);
    next.observed_generation = outcome.observed_generation;
    next.runner_scale_set_id = scale_set_id.or(current.runner_scale_set_id);
    if let Some(counts) = runner_set.and_then(|r| r.status.as_ref()) {
        next.current_runners = counts.current_replicas;
        next.pending_ephemeral_runners = counts.pending_ephemeral_runners;
        next.running_ephemeral_runners = counts.running_ephemeral_runners;
        next.failed_ephemeral_runners = counts.failed_ephemeral_runners;
    }
    let generation = set.metadata.generation;
    next.conditions = match &outcome.violations {
        Some(violations) => with_condition(
            &current.conditions,
            TEMPLATE_CONDITION,
            false,
            "PolicyViolation",
            violations_message(violations),
            generation,
        ),
        None => with_condition(
            &current.conditions,
            TEMPLATE_CONDITION,
            true,
            "Accepted",
            "the pod-validation policy accepts the template".into(),
            generation,
        ),
    };
    let counts_moved = (
        next.current_runners,
        next.pending_ephemeral_runners,
        next.running_ephemeral_runners,
        next.failed_ephemeral_runners,
    ) != (
        current.current_runners,
        current.pending_ephemeral_runners,
        current.running_ephemeral_runners,
        current.failed_ephemeral_runners,
    );
    // After Pending was written in this pass, the stored status no longer
    // equals `current`: write regardless.
    if next == current && !pending_written {
        return Ok(false);
    }
    sets.patch_status(
        &set.name_any(),
        &PatchParams::apply(FIELD_MANAGER),
        &Patch::Merge(json!({"status": next})),
    )
    .await
    .map_err(kube_err("writing the status"))?;
    Ok(counts_moved)
}

async fn delete<L: ListenerControl, S: ActionsClientSource>(
    set: &AutoscalingRunnerSet,
    context: &Context<L, S>,
    apis: &Apis,
) -> Result<Action, Error> {
    let namespace = set.namespace().unwrap_or_default();
    let name = set.name_any();
    let runner_set = apis
        .runner_sets
        .get_opt(&name)
        .await
        .map_err(kube_err("reading the EphemeralRunnerSet"))?;
    let owner_uid = runner_set.as_ref().and_then(|r| r.uid());
    let runners = apis
        .runners
        .list(&ListParams::default())
        .await
        .map_err(kube_err("listing the runners"))?
        .items
        .into_iter()
        .filter(|runner| {
            runner.labels().get(labels::SCALE_SET_NAME) == Some(&name)
                || runner
                    .owner_references()
                    .iter()
                    .any(|owner| Some(&owner.uid) == owner_uid.as_ref())
        })
        .map(|runner| RunnerObserved {
            name: runner.name_any(),
            busy: runner.status.as_ref().is_some_and(|s| s.has_job()),
            deleting: runner.metadata.deletion_timestamp.is_some(),
        })
        .collect();
    let secret_name = set.spec.github_config_secret.clone();
    let secret_present = apis
        .secrets
        .get_metadata_opt(&secret_name)
        .await
        .map_err(kube_err("reading the credentials Secret"))?
        .is_some();
    let observed = DeletionObserved {
        listener_running: context.listeners.running(&namespace, &name).is_some(),
        runner_set: runner_set.as_ref().map(|r| {
            (
                r.spec.replicas == 0 && r.spec.patch_id == 0,
                r.metadata.deletion_timestamp.is_some(),
            )
        }),
        runners,
        scale_set_id: scale_set_id(set),
        secret_present,
        secret_name,
        force: set
            .annotations()
            .get(FORCE_DELETE_ANNOTATION)
            .is_some_and(|v| v == "true"),
    };
    for step in plan::plan_deletion(&observed) {
        match step {
            DeletionStep::StopListener => context.listeners.stop(&namespace, &name).await,
            DeletionStep::PinRunnerSet => {
                pin_runner_set(&apis.runner_sets, &name).await?;
            }
            DeletionStep::DeleteRunners(names) => {
                for runner in names {
                    ignore_not_found(
                        apis.runners
                            .delete(&runner, &DeleteParams::default())
                            .await
                            .map(|_| ()),
                    )
                    .map_err(kube_err("deleting an idle runner"))?;
                }
            }
            DeletionStep::DeleteRunnerSet => {
                ignore_not_found(
                    apis.runner_sets
                        .delete(&name, &DeleteParams::default())
                        .await
                        .map(|_| ()),
                )
                .map_err(kube_err("deleting the EphemeralRunnerSet"))?;
            }
            DeletionStep::Wait(why) => {
                tracing::debug!(%why, "deletion waits");
                return Ok(Action::requeue(DELETION_POLL));
            }
            DeletionStep::DeleteScaleSet(id) => {
                let client = match context.actions.client(&super::github_target(set)).await {
                    Ok(client) => client,
                    Err(CredentialsError::SecretNotFound { .. }) => {
                        // Gone between the look and the call: the next
                        // pass sees it and says so.
                        return Ok(Action::requeue(DELETION_POLL));
                    }
                    Err(error) => return Err(error.into()),
                };
                match client.delete_runner_scale_set(id).await {
                    Ok(()) | Err(ActionsError::ScaleSetNotFound { .. }) => {
                        tracing::info!(id, "deleted the scale set");
                    }
                    Err(error) => return Err(actions_err("deleting the scale set")(error)),
                }
            }
            DeletionStep::Blocked(why) => {
                let current = set.status.clone().unwrap_or_default();
                let conditions = with_condition(
                    &current.conditions,
                    DELETION_CONDITION,
                    true,
                    "SecretMissing",
                    why.clone(),
                    set.metadata.generation,
                );
                if conditions != current.conditions {
                    apis.sets
                        .patch_status(
                            &name,
                            &PatchParams::apply(FIELD_MANAGER),
                            &Patch::Merge(json!({"status": {"conditions": conditions}})),
                        )
                        .await
                        .map_err(kube_err("reporting the blocked deletion"))?;
                    let event = Event {
                        type_: EventType::Warning,
                        reason: "DeletionBlocked".into(),
                        note: Some(why),
                        action: "Delete".into(),
                        secondary: None,
                    };
                    if let Err(error) = context.recorder.publish(&event, &set.object_ref(&())).await
                    {
                        tracing::warn!(%error, "could not publish the deletion event");
                    }
                }
                return Ok(Action::requeue(BLOCKED_POLL));
            }
            DeletionStep::RemoveFinalizer => {
                let finalizers = set
                    .finalizers()
                    .iter()
                    .filter(|f| *f != FINALIZER)
                    .cloned()
                    .collect();
                patch_finalizers(&apis.sets, set, finalizers).await?;
                context
                    .validators
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .remove(&(namespace.clone(), name.clone()));
                context
                    .counts_changed
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .remove(&(namespace.clone(), name.clone()));
            }
        }
    }
    Ok(Action::await_change())
}

/// Pins the set at zero replicas and patch id 0: every runner not executing
/// a job is released, and a later decision of the listener (a higher patch
/// id) is what scales it again.
async fn pin_runner_set(runner_sets: &Api<EphemeralRunnerSet>, name: &str) -> Result<(), Error> {
    runner_sets
        .patch(
            name,
            &PatchParams::apply(FIELD_MANAGER),
            &Patch::Merge(json!({"spec": {"replicas": 0, "patchID": 0}})),
        )
        .await
        .map_err(kube_err("pinning the EphemeralRunnerSet"))?;
    Ok(())
}

fn ignore_not_found(result: Result<(), kube::Error>) -> Result<(), kube::Error> {
    match result {
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        other => other,
    }
}
