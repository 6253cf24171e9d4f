//! Reading an AutoscalingRunnerSet and what it owns into an [`Observed`]
//! (the set, its EphemeralRunnerSet, its listener, the pod-validation
//! verdict), and answering the plan's [`Need`]s: the API server's copy of
//! the set, the scale set the Actions service holds, and its registration.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

use super::apply::{actions_err, kube_err};
use super::credentials_hold::{self, KnownHeld};
use super::plan::{
    DeletionObserved, FormerCredentials, Need, Observed, ProxySecretData, RunnerCounts,
    RunnerObserved, RunnerProxy, RunnerSetObserved, RunnerSetState, ServiceScaleSet,
    ShadowTemplateVerdict, TemplateVerdict,
};
use super::{Context, Error, github_target};
use crate::actions::{ActionsClient, ActionsError};
use crate::api::{
    AutoscalingRunnerSet, EphemeralRunner, EphemeralRunnerSet, EphemeralRunnerSetPhase,
    EphemeralRunnerSpec, annotations, finalizers, labels,
};
use crate::controllers::kit::finalizer;
use crate::credentials::{ActionsClientSource, CredentialsError, ProxySecrets};
use crate::listener::Cause;
use crate::listener::control::{ListenerConfig, ListenerControl};
use crate::policy::PolicyKind;
use crate::policy::gate::Gate;

/// The API of each kind the controller reads and writes, in the set's
/// namespace.
pub(super) struct Apis {
    pub sets: Api<AutoscalingRunnerSet>,
    pub runner_sets: Api<EphemeralRunnerSet>,
    pub runners: Api<EphemeralRunner>,
    pub secrets: Api<Secret>,
}

impl Apis {
    pub fn new(client: &kube::Client, namespace: &str) -> Self {
        Self {
            sets: Api::namespaced(client.clone(), namespace),
            runner_sets: Api::namespaced(client.clone(), namespace),
            runners: Api::namespaced(client.clone(), namespace),
            secrets: Api::namespaced(client.clone(), namespace),
        }
    }
}

/// One reconcile's reading of a live set: the copy being acted on, what
/// was read with it, and the [`Observed`] the plan decides from.
pub(super) struct Observation<'a, L, S> {
    context: &'a Context<L, S>,
    apis: &'a Apis,
    /// The copy of the set the steps act on: the watch's, or the API
    /// server's once [`Need::FreshCopy`] is answered.
    pub set: Arc<AutoscalingRunnerSet>,
    /// Read once: a fresh copy of the set does not read it again.
    runner_set: Option<EphemeralRunnerSet>,
    /// The verdict on `set`'s template, kept for a fresh copy of the same
    /// generation (the same template).
    verdict: TemplateVerdict,
    /// The shadow pod-validation policy's, kept with it.
    shadow_verdict: Option<ShadowTemplateVerdict>,
    /// The Actions client, once the service was asked.
    pub client: Option<ActionsClient>,
    /// Whether the credentials Secret is held, read once.
    credentials_held: Option<bool>,
    /// The Secret the set held before its spec named another, read once.
    former_credentials: Option<FormerCredentials>,
    /// What the plan decides from.
    pub observed: Observed,
}

impl<'a, L: ListenerControl, S: ActionsClientSource> Observation<'a, L, S> {
    /// Reads `set`'s EphemeralRunnerSet, its listener and the verdict on its
    /// template.
    pub async fn read(
        set: Arc<AutoscalingRunnerSet>,
        context: &'a Context<L, S>,
        apis: &'a Apis,
    ) -> Result<Self, Error> {
        let verdict = validate(&set, context).await?;
        let shadow_verdict = shadow_validate(&set, context).await;
        let (namespace, name) = (set.namespace().unwrap_or_default(), set.name_any());
        let runner_set = match context.cached_runner_set(&namespace, &name) {
            Some(cached) => cached,
            None => {
                let read = apis
                    .runner_sets
                    .get_opt(&name)
                    .await
                    .map_err(kube_err("reading the EphemeralRunnerSet"))?;
                context.read_runner_set(&namespace, &name, read.as_ref().map(|r| &r.metadata));
                read
            }
        };
        let credentials_held = credentials_held(&set, apis, &context.held_credentials).await?;
        let former_credentials = former_credentials(&set, apis).await?;
        let runner_proxy = runner_proxy(&set, apis).await?;
        let mut observed = observed(&set, runner_set.as_ref(), context, verdict.clone());
        observed.shadow_template = shadow_verdict.clone();
        observed.credentials_held = credentials_held;
        observed.former_credentials = former_credentials.clone();
        observed.runner_proxy = runner_proxy;
        Ok(Self {
            context,
            apis,
            set,
            runner_set,
            verdict,
            shadow_verdict,
            client: None,
            credentials_held,
            former_credentials,
            observed,
        })
    }

    /// Answers `need` into the [`Observed`]; `false` when the set turns out
    /// to be deleted or gone, and the reconcile stops (the event that says
    /// so is queued behind it, and the controller runs it next).
    pub async fn answer(&mut self, need: Need) -> Result<bool, Error> {
        match need {
            Need::FreshCopy => return self.fresh_copy().await,
            Need::ScaleSet => {
                let found = self.scale_set_in_service().await?;
                self.observed.service = Some(found);
            }
            Need::Registration(scale_set) => {
                let client = self.client().await?;
                let created = client
                    .create_runner_scale_set(&scale_set)
                    .await
                    .map_err(actions_err("creating the scale set"))?;
                tracing::info!(id = created.id, "registered the scale set");
                self.observed.service = Some(ServiceScaleSet::Registered { id: created.id });
            }
        }
        Ok(true)
    }

    /// The API server's copy of the set (a quorum read). The same version
    /// as the watch's changes nothing; another one is observed again,
    /// keeping the verdict when the generation (so the template) is the
    /// same and the EphemeralRunnerSet read a moment ago.
    async fn fresh_copy(&mut self) -> Result<bool, Error> {
        let fresh = self
            .apis
            .sets
            .get_opt(&self.set.name_any())
            .await
            .map_err(kube_err("reading the AutoscalingRunnerSet"))?;
        match fresh {
            Some(fresh) if fresh.resource_version() == self.set.resource_version() => {}
            Some(fresh) if fresh.metadata.deletion_timestamp.is_some() => return Ok(false),
            None => return Ok(false),
            Some(fresh) => {
                if fresh.metadata.generation != self.set.metadata.generation {
                    self.verdict = validate(&fresh, self.context).await?;
                    self.shadow_verdict = shadow_validate(&fresh, self.context).await;
                }
                // What was read of the credentials Secrets belongs to the
                // Secrets the first copy named; a fresh copy naming others
                // (a rotation the watch had not shown yet) reads them anew.
                let names = |set: &AutoscalingRunnerSet| {
                    (
                        set.spec.github_config_secret.clone(),
                        set.annotations()
                            .get(annotations::CREDENTIALS_SECRET)
                            .cloned(),
                    )
                };
                let renamed = names(&fresh) != names(&self.set);
                self.set = Arc::new(fresh);
                if renamed {
                    self.credentials_held =
                        credentials_held(&self.set, self.apis, &self.context.held_credentials)
                            .await?;
                    self.former_credentials = former_credentials(&self.set, self.apis).await?;
                }
                self.observed = observed(
                    &self.set,
                    self.runner_set.as_ref(),
                    self.context,
                    self.verdict.clone(),
                );
                self.observed.shadow_template = self.shadow_verdict.clone();
                self.observed.credentials_held = self.credentials_held;
                self.observed.former_credentials = self.former_credentials.clone();
                self.observed.runner_proxy = runner_proxy(&self.set, self.apis).await?;
            }
        }
        self.observed.from_api_server = true;
        Ok(true)
    }

    /// The client for the set's credentials, got once a reconcile.
    async fn client(&mut self) -> Result<ActionsClient, Error> {
        Ok(actions_client(self.context, &self.set, &mut self.client).await?)
    }

    /// The scale set the service holds for the set: by its recorded id
    /// when known (so a group change moves it rather than registering a
    /// second one), else by name in the runner group.
    async fn scale_set_in_service(&mut self) -> Result<ServiceScaleSet, Error> {
        let client = self.client().await?;
        let group_id = match self.set.spec.runner_group.as_deref() {
            Some(group) if !group.is_empty() => {
                client
                    .get_runner_group_by_name(group)
                    .await
                    .map_err(actions_err("resolving the runner group"))?
                    .id
            }
            _ => 1,
        };
        if let Some(id) = self.observed.scale_set_id {
            match client.get_runner_scale_set_by_id(id).await {
                Ok(scale_set) => {
                    return Ok(ServiceScaleSet::Found {
                        group_id,
                        scale_set: Box::new(scale_set),
                    });
                }
                Err(ActionsError::ScaleSetNotFound { .. }) => {}
                Err(error) => return Err(actions_err("reading the scale set")(error)),
            }
        }
        let by_name = client
            .get_runner_scale_set(group_id, &self.observed.scale_set_name)
            .await
            .map_err(actions_err("looking the scale set up by name"))?;
        Ok(match by_name {
            Some(scale_set) => match self.context.holder_of(
                scale_set.id,
                &self.set.spec.github_config_url,
                self.set.uid().as_deref(),
            ) {
                Some(holder) => ServiceScaleSet::HeldByAnother {
                    id: scale_set.id,
                    holder,
                },
                None => ServiceScaleSet::Found {
                    group_id,
                    scale_set: Box::new(scale_set),
                },
            },
            None => ServiceScaleSet::Absent { group_id },
        })
    }
}

/// The Actions client for `set`'s credentials, got once a pass: `cached`
/// holds it after the first call.
pub(super) async fn actions_client<L, S: ActionsClientSource>(
    context: &Context<L, S>,
    set: &AutoscalingRunnerSet,
    cached: &mut Option<ActionsClient>,
) -> Result<ActionsClient, CredentialsError> {
    if let Some(client) = cached {
        return Ok(client.clone());
    }
    let client = context.actions.client(&github_target(set)).await?;
    *cached = Some(client.clone());
    Ok(client)
}

/// What the plan decides from, for `set` as it is now.
fn observed<L: ListenerControl, S>(
    set: &AutoscalingRunnerSet,
    runner_set: Option<&EphemeralRunnerSet>,
    context: &Context<L, S>,
    template: TemplateVerdict,
) -> Observed {
    let mut status = set.status.clone().unwrap_or_default();
    let scale_set_lost = status.listener.as_ref().is_some_and(|l| {
        l.state == "Retrying" && l.reason.as_deref() == Some(Cause::ScaleSetNotFound.as_str())
    });
    // The listener's fields are the listener's: left out of the comparison
    // and of the patch, so a status written here never undoes one the
    // listener wrote meanwhile.
    status.listener = None;
    status.scaling = None;
    let id = scale_set_id(set);
    let namespace = set.namespace().unwrap_or_default();
    let name = set.name_any();
    let counts_moved_ago = context
        .counts_changed
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .get(&(namespace.clone(), name.clone()))
        .map(Instant::elapsed);
    Observed {
        generation: set.metadata.generation.unwrap_or(0),
        status,
        has_finalizer: finalizer::held(set, &finalizers::AUTOSCALING_RUNNER_SET),
        template,
        shadow_template: None,
        scale_set_id: id,
        scale_set_name: scale_set_name(set),
        scale_set_labels: set.spec.runner_scale_set_labels.clone(),
        desired_runner_spec: desired_runner_spec(set, id.unwrap_or(0)),
        desired_runner_metadata: set.spec.ephemeral_runner_metadata.clone(),
        desired_runner_set_labels: desired_runner_set_labels(set),
        desired_runner_set_annotations: set
            .spec
            .ephemeral_runner_set_metadata
            .as_ref()
            .and_then(|meta| meta.annotations.clone())
            .unwrap_or_default(),
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
        runner_counts: runner_set
            .and_then(|r| r.status.as_ref())
            .map(|counts| RunnerCounts {
                current: counts.current_replicas,
                pending: counts.pending_ephemeral_runners,
                running: counts.running_ephemeral_runners,
                failed: counts.failed_ephemeral_runners,
            }),
        listener: context.listeners.running(&namespace, &name),
        desired_listener: desired_listener(set, id.unwrap_or(0), context.runner_cap),
        from_api_server: false,
        service: None,
        counts_moved_ago,
        capped: capped(set, context.runner_cap),
        scale_set_lost,
        credentials_held: None,
        credentials_recorded: set.annotations().get(annotations::CREDENTIALS_SECRET)
            == Some(&set.spec.github_config_secret),
        former_credentials: None,
        runner_proxy: None,
        now: jiff::Timestamp::now(),
    }
}

/// The name of the Secret the set's runner pods read their proxy
/// variables from.
pub(super) fn runner_proxy_secret_name(set: &AutoscalingRunnerSet) -> String {
    format!("{}-runner-proxy", set.name_any())
}

/// The runners' proxy Secret against what it should hold, when the spec
/// has a proxy: the proxy credential Secrets are read (a missing one is
/// the same failure the set's own client reports), and so is the Secret.
async fn runner_proxy(
    set: &AutoscalingRunnerSet,
    apis: &Apis,
) -> Result<Option<RunnerProxy>, Error> {
    let target = github_target(set);
    let Some(proxy) = &target.proxy else {
        return Ok(None);
    };
    let secrets = ProxySecrets::read(&apis.secrets, &target.namespace, proxy).await?;
    let wanted = crate::credentials::runner_proxy_data(&target.namespace, proxy, &secrets)?;
    let held = apis
        .secrets
        .get_opt(&runner_proxy_secret_name(set))
        .await
        .map_err(kube_err("reading the runners' proxy Secret"))?
        .and_then(|secret| secret.data)
        .map(|data| {
            data.into_iter()
                .map(|(key, value)| (key, String::from_utf8_lossy(&value.0).into_owned()))
                .collect::<BTreeMap<_, _>>()
        });
    Ok(Some(if held.as_ref() == Some(&wanted) {
        RunnerProxy::Current
    } else {
        RunnerProxy::Stale(ProxySecretData(wanted))
    }))
}

/// The scale set id: the status, or the annotation when the status was
/// lost.
pub(super) fn scale_set_id(set: &AutoscalingRunnerSet) -> Option<i64> {
    set.status
        .as_ref()
        .and_then(|s| s.runner_scale_set_id)
        .or_else(|| {
            set.annotations()
                .get(annotations::SCALE_SET_ID)
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
        proxy_secret_ref: spec.proxy.as_ref().map(|_| runner_proxy_secret_name(set)),
        github_server_tls: spec.github_server_tls.clone(),
        ephemeral_runner_config_secret_metadata: spec
            .ephemeral_runner_config_secret_metadata
            .clone(),
        policies: spec.policies.clone(),
        debug: spec.debug.clone(),
        max_idle_age: spec.max_idle_age.clone(),
        registration_timeout: spec.registration_timeout.clone(),
        protect_busy_runners: spec.protect_busy_runners,
        metadata: spec.template.metadata.clone(),
        spec: spec.template.spec.clone().unwrap_or_default(),
    }
}

/// What in the spec is above the host's runner cap, as a sentence.
fn capped(set: &AutoscalingRunnerSet, cap: u32) -> Option<String> {
    let above = |field: &str, value: Option<i32>| {
        value
            .filter(|&v| u32::try_from(v).is_ok_and(|v| v > cap))
            .map(|v| format!("{field} {v}"))
    };
    let fields: Vec<String> = [
        above("minRunners", set.spec.min_runners),
        above("maxRunners", set.spec.max_runners),
    ]
    .into_iter()
    .flatten()
    .collect();
    (!fields.is_empty()).then(|| {
        format!(
            "{} above this host's limit of {cap} runners per scale set \
             (--max-runners-per-scale-set): at most {cap} run",
            fields.join(" and "),
        )
    })
}

/// The listener's configuration, its runner bounds within the host's cap:
/// a policy answering more than the cap (or a scale set with no
/// `maxRunners`) is clamped to it, and the clamp is reported as any other.
fn desired_listener(set: &AutoscalingRunnerSet, id: i64, cap: u32) -> ListenerConfig {
    let cap = i32::try_from(cap).unwrap_or(i32::MAX);
    ListenerConfig {
        namespace: set.namespace().unwrap_or_default(),
        name: set.name_any(),
        uid: set.uid(),
        runner_set_name: set.name_any(),
        scale_set_id: id,
        github: github_target(set),
        min_runners: set.spec.min_runners.unwrap_or(0).min(cap),
        max_runners: Some(set.spec.max_runners.map_or(cap, |max| max.min(cap))),
        scale_set_labels: set.spec.runner_scale_set_labels.clone(),
        labels: set.labels().clone(),
        scaling_policy: set.spec.policies.scaling_policy.clone(),
        shadow_scaling_policy: set.spec.policies.shadow_scaling_policy.clone(),
        holds_failures: set
            .spec
            .debug
            .as_ref()
            .is_some_and(|debug| debug.hold_failed_for.is_some()),
        job_metrics: crate::listener::metrics::JobMetricLabels::from_config(
            set.spec.listener_metrics.as_ref(),
        ),
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
    wanted.insert(labels::PART_OF.into(), labels::ARCWRIGHT.into());
    wanted
}

/// Runs the pod-validation policy on the template. The loaded policy is
/// kept per scale set while its reference is unchanged, so a
/// ConfigMap-backed policy is watched once and not reloaded on every
/// reconcile.
///
/// Only the policy the set names judges its template: one that never
/// loaded (an unknown builtin, a ConfigMap missing or without the module)
/// fails the pass, and the set is stalled saying why, rather than the
/// bundled default standing in as it does for scaling. A version that
/// fails after a good one leaves the good one judging.
async fn validate<L, S>(
    set: &AutoscalingRunnerSet,
    context: &Context<L, S>,
) -> Result<TemplateVerdict, Error> {
    let reference = set.spec.policies.pod_validation_policy.clone();
    validate_with(set, context, reference, set.name_any()).await
}

/// What `spec.shadowPodValidationPolicy` says of the template, if the set
/// names one. Never an error: whatever goes wrong with a candidate is its
/// verdict, shown in a condition, and blocks nothing.
async fn shadow_validate<L, S>(
    set: &AutoscalingRunnerSet,
    context: &Context<L, S>,
) -> Option<ShadowTemplateVerdict> {
    let reference = set.spec.policies.shadow_pod_validation_policy.clone()?;
    let namespace = set.namespace().unwrap_or_default();
    let policy = reference.label(PolicyKind::PodValidation, &namespace);
    let verdict = validate_with(set, context, Some(reference), shadow_key(&set.name_any())).await;
    Some(ShadowTemplateVerdict {
        policy,
        verdict: verdict.map_err(|error| crate::causes::of(&error)),
    })
}

/// The key a set's shadow validator is kept under, beside its own.
pub(super) fn shadow_key(name: &str) -> String {
    format!("{name}/shadow")
}

async fn validate_with<L, S>(
    set: &AutoscalingRunnerSet,
    context: &Context<L, S>,
    reference: Option<crate::policy::loader::PolicyRef>,
    key: String,
) -> Result<TemplateVerdict, Error> {
    let namespace = set.namespace().unwrap_or_default();
    let key = (namespace.clone(), key);
    let cached = context
        .validators
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .get(&key)
        .filter(|gate| gate.reference() == reference.as_ref())
        .cloned();
    let gate = match cached {
        Some(gate) => gate,
        None => {
            let gate = Arc::new(
                Gate::load(
                    &context.policies,
                    &namespace,
                    reference,
                    Arc::clone(&context.reporter),
                )
                .await?,
            );
            context
                .validators
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .insert(key, Arc::clone(&gate));
            gate
        }
    };
    let template = serde_json::to_value(&set.spec.template).unwrap_or_default();
    Ok(gate.judge(template).await?)
}

/// Whether the credentials Secret holds our finalizer; `None` when it is
/// absent or already being deleted (no finalizer can be added then).
async fn credentials_held(
    set: &AutoscalingRunnerSet,
    apis: &Apis,
    known: &KnownHeld,
) -> Result<Option<bool>, Error> {
    let namespace = set.namespace().unwrap_or_default();
    let name = &set.spec.github_config_secret;
    if set.metadata.deletion_timestamp.is_none() && known.held(&namespace, name) {
        return Ok(Some(true));
    }
    let secret = apis
        .secrets
        .get_metadata_opt(name)
        .await
        .map_err(kube_err("reading the credentials Secret"))?;
    let held = secret.and_then(|secret| {
        let held = finalizer::held(&secret, &finalizers::CREDENTIALS_IN_USE);
        (held || secret.metadata.deletion_timestamp.is_none()).then_some(held)
    });
    known.saw(&namespace, name, held == Some(true));
    Ok(held)
}

/// The Secret `set` records holding when its spec now names another: its
/// name, whether it still carries our finalizer, and (only then worth a
/// list) whether another set names it.
async fn former_credentials(
    set: &AutoscalingRunnerSet,
    apis: &Apis,
) -> Result<Option<FormerCredentials>, Error> {
    let Some(name) = set
        .annotations()
        .get(annotations::CREDENTIALS_SECRET)
        .filter(|name| **name != set.spec.github_config_secret)
    else {
        return Ok(None);
    };
    let held = apis
        .secrets
        .get_metadata_opt(name)
        .await
        .map_err(kube_err("reading the former credentials Secret"))?
        .is_some_and(|secret| finalizer::held(&secret, &finalizers::CREDENTIALS_IN_USE));
    let shared = held
        && credentials_hold::named_by_another(&apis.sets, set, name)
            .await
            .map_err(kube_err("listing the scale sets"))?;
    Ok(Some(FormerCredentials {
        name: name.clone(),
        held,
        shared,
    }))
}

/// What [`super::plan::plan_deletion`] decides from: the EphemeralRunnerSet,
/// the runners of the set (by label, or owned by the EphemeralRunnerSet),
/// whether the credentials Secret exists, and the listener.
pub(super) async fn deletion<L: ListenerControl, S>(
    set: &AutoscalingRunnerSet,
    context: &Context<L, S>,
    apis: &Apis,
) -> Result<DeletionObserved, Error> {
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
    let secret = apis
        .secrets
        .get_metadata_opt(&secret_name)
        .await
        .map_err(kube_err("reading the credentials Secret"))?;
    let credentials_held = secret
        .as_ref()
        .is_some_and(|secret| finalizer::held(secret, &finalizers::CREDENTIALS_IN_USE));
    // Only worth a list when there is something to release.
    let credentials_shared = credentials_held
        && credentials_hold::named_by_another(&apis.sets, set, &secret_name)
            .await
            .map_err(kube_err("listing the scale sets"))?;
    let former_credentials = former_credentials(set, apis).await?;
    Ok(DeletionObserved {
        listener_running: context.listeners.running(&namespace, &name).is_some(),
        runner_set: runner_set.as_ref().map(|r| RunnerSetState {
            pinned: r.spec.replicas == 0 && r.spec.patch_id == 0,
            deleting: r.metadata.deletion_timestamp.is_some(),
        }),
        runners,
        scale_set_id: scale_set_id(set),
        secret_present: secret.is_some(),
        credentials_held,
        credentials_shared,
        secret_name,
        former_credentials,
        force: set
            .annotations()
            .get(annotations::FORCE_DELETE)
            .is_some_and(|v| v == "true"),
        keep_scale_set: set
            .annotations()
            .get(annotations::KEEP_SCALE_SET)
            .is_some_and(|v| v == "true"),
        conditions: set
            .status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default(),
        generation: set.metadata.generation,
        now: jiff::Timestamp::now(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set_with(min: Option<i32>, max: Option<i32>) -> AutoscalingRunnerSet {
        let mut set: AutoscalingRunnerSet = serde_json::from_value(serde_json::json!({
            "apiVersion": "actions.github.com/v1alpha1",
            "kind": "AutoscalingRunnerSet",
            "metadata": {"name": "linux", "namespace": "ns"},
            "spec": {
                "githubConfigUrl": "https://github.com/octo-org",
                "githubConfigSecret": "github-auth",
                "template": {"spec": {"containers": [{"name": "runner"}]}}
            }
        }))
        .unwrap();
        set.spec.min_runners = min;
        set.spec.max_runners = max;
        set
    }

    #[test]
    fn the_listener_is_bounded_by_the_hosts_cap_whatever_the_spec_says() {
        let bounds = |min, max| {
            let config = desired_listener(&set_with(min, max), 7, 1000);
            (config.min_runners, config.max_runners)
        };
        assert_eq!(
            bounds(None, None),
            (0, Some(1000)),
            "no maxRunners: the cap"
        );
        assert_eq!(bounds(Some(2), Some(10)), (2, Some(10)));
        assert_eq!(bounds(Some(2_000_000_000), None), (1000, Some(1000)));
        assert_eq!(bounds(Some(1), Some(5000)), (1, Some(1000)));
    }

    #[test]
    fn only_a_spec_above_the_cap_is_reported() {
        assert_eq!(capped(&set_with(None, None), 1000), None);
        assert_eq!(capped(&set_with(Some(1000), Some(1000)), 1000), None);
        assert_eq!(
            capped(&set_with(Some(2_000_000_000), Some(3000)), 1000).as_deref(),
            Some(
                "minRunners 2000000000 and maxRunners 3000 above this host's limit of 1000 \
                 runners per scale set (--max-runners-per-scale-set): at most 1000 run"
            )
        );
    }
}
