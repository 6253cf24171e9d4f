//! Carrying out a plan: one API call per step, in order, and no decisions.
//! What a call's answer means for the runner is the plan's to decide: an
//! answer that changes the plan (the API server refusing the pod) is
//! reported back (`Applied`), and the plan is made again with it.
//!
//! The registration step is the one that spans several calls, for two
//! reasons. The JIT config is a secret: it goes from the Actions service
//! into the Secret here and never through the plan. And a registration
//! is never left without a record: if its Secret cannot be written it is
//! removed at once, and one an earlier attempt left under the runner's
//! name without a Secret is removed before the name is registered again
//! (see `register`).

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Api, Resource, ResourceExt};

use super::plan::{Plan, RegistrationRecord, StatusChange, Step};
use super::resources::{jit_secret, runner_pod};
use super::{Context, EphemeralRunnerError, github_target, kube_error};
use crate::actions::{ActionsClient, ActionsError, JitConfig, JitRunnerSetting};
use crate::api::ephemeral_runner::EventReason;
use crate::api::{EphemeralRunner, EphemeralRunnerStatus, annotations, field_managers, finalizers};
use crate::controllers::kit::expectations::Known;
use crate::controllers::kit::{Notice, finalizer};

/// What applying a plan came to.
#[derive(Debug, Default)]
pub(super) struct Applied {
    /// The finalizer was removed: the runner is going away.
    pub(super) finalized: bool,
    /// The API server refused the runner pod as invalid (a 422), with its
    /// message. The steps after the pod's creation were not taken: they
    /// were planned on the pod being made.
    pub(super) refused_pod: Option<String>,
    /// A status write that only informs was put off: the host's budget of
    /// them was spent (see [`crate::controllers::kit::budget`]).
    pub(super) put_off: bool,
}

/// How every write of the controller names itself.
pub(super) fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(field_managers::EPHEMERAL_RUNNER.to_owned()),
        ..PatchParams::default()
    }
}

fn post_params() -> PostParams {
    PostParams {
        field_manager: Some(field_managers::EPHEMERAL_RUNNER.to_owned()),
        ..PostParams::default()
    }
}

/// Applies `plan`.
pub(super) async fn apply(
    runner: &EphemeralRunner,
    plan: &Plan,
    ctx: &Context,
) -> Result<Applied, EphemeralRunnerError> {
    let namespace = runner.namespace().unwrap_or_default();
    let name = runner.name_any();
    let client = ctx.deps.client.clone();
    let runners: Api<EphemeralRunner> = Api::namespaced(client.clone(), &namespace);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let mut applied = Applied::default();
    // The runner as renewed in place, once it is: the pod after the
    // renewal is made for the renewal.
    let mut renewed: Option<EphemeralRunner> = None;
    for step in &plan.steps {
        match step {
            Step::AddFinalizer => finalizer::add(
                &runners,
                runner,
                &finalizers::EPHEMERAL_RUNNER,
                field_managers::EPHEMERAL_RUNNER,
            )
            .await
            .map_err(kube_error("add the finalizer"))?,
            Step::RemoveFinalizer => {
                finalizer::remove(
                    &runners,
                    runner,
                    &finalizers::EPHEMERAL_RUNNER,
                    field_managers::EPHEMERAL_RUNNER,
                )
                .await
                .map_err(kube_error("remove the finalizer"))?;
                applied.finalized = true;
            }
            Step::PatchStatus(change) => patch_status(&runners, &name, change).await?,
            Step::InformStatus(change) => {
                if ctx.deps.status_budget.take() {
                    patch_status(&runners, &name, change).await?;
                } else {
                    applied.put_off = true;
                }
            }
            Step::Register { replacing, record } => {
                let replacing = replacing.as_deref();
                register(runner, ctx, &runners, &secrets, replacing, record.as_ref()).await?;
            }
            Step::Renew {
                replacing,
                renewal,
                resource_version,
                registered,
            } => {
                let replacing = replacing.as_deref();
                let under = RenewalUnder {
                    renewal,
                    resource_version: resource_version.as_deref(),
                    registered: registered.as_ref(),
                };
                renewed = Some(renew(runner, ctx, &runners, &secrets, replacing, under).await?);
            }
            Step::CreatePod => {
                let pod = runner_pod(renewed.as_ref().unwrap_or(runner), &ctx.config.user_agent);
                match pods.create(&post_params(), &pod).await {
                    // No event (see `Step::Event`).
                    Ok(pod) => {
                        ctx.known_pods
                            .record(&namespace, &name, Known::of(&pod.metadata));
                        tracing::debug!(runner = %name, "runner pod created");
                    }
                    // An older pod of the same name is still terminating; its
                    // deletion wakes the next reconcile.
                    Err(kube::Error::Api(e)) if e.code == 409 => {
                        ctx.known_pods.forget(&namespace, &name);
                    }
                    // Refused: nothing changed.
                    Err(kube::Error::Api(e)) if e.code == 422 => {
                        applied.refused_pod = Some(e.message);
                        return Ok(applied);
                    }
                    Err(e) => {
                        ctx.known_pods.forget(&namespace, &name);
                        return Err(kube_error("create the runner pod")(e));
                    }
                }
            }
            Step::DeletePod { uid } => {
                let deleted = delete(&pods, &name, uid, None, "delete the runner pod").await;
                ctx.known_pods
                    .record(&namespace, &name, deleted_known(&deleted, uid));
                deleted?;
            }
            Step::ForceDeletePod { uid } => {
                let action = "force-delete the runner pod";
                let deleted = delete(&pods, &name, uid, Some(0), action).await;
                ctx.known_pods
                    .record(&namespace, &name, deleted_known(&deleted, uid));
                deleted?;
            }
            Step::DeleteSecret => {
                let deleted = match secrets.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => Ok(true),
                    Err(kube::Error::Api(e)) if e.code == 404 => Ok(true),
                    Err(e) => Err(kube_error("delete the JIT config Secret")(e)),
                };
                let known = matches!(deleted, Ok(true)).then_some(Known::Absent { uid: None });
                ctx.known_secrets.record(&namespace, &name, known);
                deleted?;
            }
            Step::ProtectFromEviction { uid } => {
                // The uid in the patch is a precondition: a newer pod of
                // the same name is not the busy one.
                let patch = serde_json::json!({"metadata": {
                    "uid": uid,
                    "annotations": {
                        annotations::SAFE_TO_EVICT: "false",
                        annotations::DO_NOT_DISRUPT: "true",
                    },
                }});
                let patched = pods
                    .patch(&name, &patch_params(), &Patch::Merge(&patch))
                    .await;
                let known = patched.as_ref().ok().and_then(|p| Known::of(&p.metadata));
                ctx.known_pods.record(&namespace, &name, known);
                match patched {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                    Err(e) => return Err(kube_error("mark the busy runner pod")(e)),
                }
            }
            Step::DeleteHookObjects => delete_hook_objects(runner, &pods, &secrets).await?,
            Step::Deregister { runner_id } => {
                ctx.pool
                    .push(ctx.key(runner, *runner_id), github_target(runner));
            }
            Step::Event {
                severity,
                reason,
                note,
            } => {
                let notice = Notice::new(*severity, reason.as_str(), note.clone());
                ctx.publisher.publish(&runner.object_ref(&()), notice).await;
            }
            Step::CountDeregistration { verdict, outcome } => {
                ctx.deps.metrics.deregistration(verdict, outcome);
            }
            Step::NotifySlack(failure) => super::notify::notify(runner, failure.clone(), ctx),
        }
    }
    Ok(applied)
}

/// Writes `change` to the runner's status (a merge patch).
async fn patch_status(
    runners: &Api<EphemeralRunner>,
    name: &str,
    change: &StatusChange,
) -> Result<(), EphemeralRunnerError> {
    runners
        .patch_status(name, &patch_params(), &Patch::Merge(change))
        .await
        .map_err(kube_error("patch the runner status"))?;
    Ok(())
}

/// What a deletion of the object with `uid` that came to `deleted` says
/// of it: gone or going (whatever the answer carried) when it went through
/// or found nothing; nothing known when a newer object has the name or the
/// outcome is not known.
fn deleted_known(deleted: &Result<bool, EphemeralRunnerError>, uid: &str) -> Option<Known> {
    matches!(deleted, Ok(true)).then(|| Known::Absent {
        uid: Some(uid.to_owned()),
    })
}

/// Deletes the object `name` if it is still the one with `uid`: `true`
/// when it is gone or going, `false` when a newer object has the name.
async fn delete<K>(
    api: &Api<K>,
    name: &str,
    uid: &str,
    grace: Option<u32>,
    action: &'static str,
) -> Result<bool, EphemeralRunnerError>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let params = DeleteParams {
        grace_period_seconds: grace,
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(true),
        // A newer object of the same name: not ours to delete.
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(kube_error(action)(e)),
    }
}

/// Deletes the pods and Secrets the runner container hooks made for the
/// runner's jobs, each by its uid (one made again since under the same name
/// is the next look's to find), those already going left alone.
async fn delete_hook_objects(
    runner: &EphemeralRunner,
    pods: &Api<Pod>,
    secrets: &Api<Secret>,
) -> Result<(), EphemeralRunnerError> {
    let selector = super::observe::hook_selector(runner);
    let pod_list = pods
        .list_metadata(&selector)
        .await
        .map_err(kube_error("list the container hooks' pods"))?;
    for pod in pod_list
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
    {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        delete(
            pods,
            &pod.name_any(),
            &uid,
            None,
            "delete a container hooks' pod",
        )
        .await?;
    }
    let secret_list = secrets
        .list_metadata(&selector)
        .await
        .map_err(kube_error("list the container hooks' Secrets"))?;
    for secret in &secret_list.items {
        let uid = secret.metadata.uid.clone().unwrap_or_default();
        let action = "delete a container hooks' Secret";
        delete(secrets, &secret.name_any(), &uid, None, action).await?;
    }
    Ok(())
}

/// Registers the runner, stores its JIT config in its Secret, and, for a
/// registration after the first, writes `record` with it.
///
/// A registration of this name that already exists in the scale set is one
/// an earlier attempt made and lost before writing the Secret (a crash, a
/// timeout after the service acted): its config cannot be read back, so it
/// is removed and the runner registered again. It is never left behind.
///
/// Both removals here are made inline, not through the unregistration
/// pool: they are of registrations nobody has recorded (not in the status,
/// not in a Secret), so there is no runner record for the pool's outcome to
/// settle, and the registration cannot go on until the name is free.
///
/// A renewed runner's Secret of the job before (`replacing`, its
/// resourceVersion) is written over, on the condition that it is still
/// that one: a Secret written since is a registration this pass does not
/// know of, and is never lost to it.
async fn register(
    runner: &EphemeralRunner,
    ctx: &Context,
    runners: &Api<EphemeralRunner>,
    secrets: &Api<Secret>,
    replacing: Option<&str>,
    record: Option<&RegistrationRecord>,
) -> Result<(), EphemeralRunnerError> {
    let name = runner.name_any();
    let (runner_id, runner_name) = register_into_secret(runner, ctx, secrets, replacing).await?;
    if let Some(record) = record {
        patch_status(runners, &name, &record.change(runner_id, &runner_name)).await?;
    }
    // No event (see `Step::Event`): the Registered condition says it.
    tracing::debug!(runner = %name, runner_id, "registered");
    Ok(())
}

/// Registers `runner` (a JIT config) and stores the config in its Secret,
/// made for the renewal `runner`'s status names: the registration's id and
/// name. A registration whose Secret cannot be written is removed.
async fn register_into_secret(
    runner: &EphemeralRunner,
    ctx: &Context,
    secrets: &Api<Secret>,
    replacing: Option<&str>,
) -> Result<(i64, String), EphemeralRunnerError> {
    let name = runner.name_any();
    let scale_set = runner.spec.runner_scale_set_id;
    let client = ctx.deps.clients.get(&github_target(runner)).await?;
    let setting = JitRunnerSetting {
        name: name.clone(),
        work_folder: String::new(),
    };
    let jit = match client.generate_jit_runner_config(scale_set, &setting).await {
        Ok(jit) => jit,
        Err(ActionsError::RunnerExists { .. }) => {
            remove_stale(runner, ctx, &client).await?;
            client
                .generate_jit_runner_config(scale_set, &setting)
                .await?
        }
        Err(error) => return Err(error.into()),
    };
    let runner_id = jit.runner.id;
    let mut secret = jit_secret(runner, runner_id, &jit.runner.name, jit_value(&jit));
    let written = match replacing {
        None => secrets.create(&post_params(), &secret).await,
        Some(version) => {
            secret.metadata.resource_version = Some(version.to_owned());
            secrets.replace(&name, &post_params(), &secret).await
        }
    };
    let known = written.as_ref().ok().and_then(|s| Known::of(&s.metadata));
    ctx.known_secrets
        .record(&runner.namespace().unwrap_or_default(), &name, known);
    if let Err(error) = written {
        // The registration is useless without its Secret: remove it
        // rather than leak it. Best effort; the next attempt's
        // RunnerExists path removes it otherwise.
        if let Err(removal) = client.remove_runner(runner_id).await {
            tracing::warn!(runner = %name, runner_id, error = %removal, "removing a registration whose Secret could not be written");
        }
        return Err(kube_error("write the JIT config Secret")(error));
    }
    Ok((runner_id, jit.runner.name.clone()))
}

/// What a renewal in place is written under: the renewal, and the
/// resourceVersion of the runner the pass read.
struct RenewalUnder<'a> {
    renewal: &'a crate::api::RunnerRenewal,
    resource_version: Option<&'a str>,
    /// The registration the Secret holds for the renewal already.
    registered: Option<&'a (i64, String)>,
}

/// Renews `runner` in place (see `Step::Renew`): a new registration into
/// its Secret, then the whole status written anew with it, on the
/// condition that the runner is still the version the pass read. The
/// runner as renewed, from which its next pod is made.
///
/// A status write refused because the runner changed since (the
/// listener's record of the job just ended, typically) is made once more
/// on the runner as it is now, if no renewal came in between. One that
/// does not go through leaves the Secret a renewal ahead of the status,
/// which the next pass completes (`plan::renew::resume`): the registration
/// is on record in the Secret, and is never lost.
async fn renew(
    runner: &EphemeralRunner,
    ctx: &Context,
    runners: &Api<EphemeralRunner>,
    secrets: &Api<Secret>,
    replacing: Option<&str>,
    under: RenewalUnder<'_>,
) -> Result<EphemeralRunner, EphemeralRunnerError> {
    let name = runner.name_any();
    let mut next = EphemeralRunner {
        status: Some(EphemeralRunnerStatus {
            renewal: Some(under.renewal.clone()),
            ..EphemeralRunnerStatus::default()
        }),
        ..runner.clone()
    };
    next.metadata.resource_version = under.resource_version.map(str::to_owned);
    let (runner_id, runner_name) = match under.registered {
        Some(registered) => registered.clone(),
        None => register_into_secret(&next, ctx, secrets, replacing).await?,
    };
    let at = under.renewal.renewed_at.0;
    next.status = Some(EphemeralRunnerStatus {
        renewal: Some(under.renewal.clone()),
        ..super::plan::registered_status(runner_id, &runner_name, at)
    });
    let written = match runners.replace_status(&name, &post_params(), &next).await {
        Err(kube::Error::Api(e)) if e.code == 409 => {
            let now = runners
                .get_status(&name)
                .await
                .map_err(kube_error("read the runner renewed"))?;
            let renewals = now
                .status
                .as_ref()
                .map_or(0, EphemeralRunnerStatus::renewals);
            if renewals.saturating_add(1) != under.renewal.count {
                return Err(EphemeralRunnerError::RenewedMeanwhile(name));
            }
            next.metadata.resource_version = now.metadata.resource_version;
            runners.replace_status(&name, &post_params(), &next).await
        }
        written => written,
    };
    let written = written.map_err(kube_error("write the runner's renewal"))?;
    tracing::debug!(runner = %name, runner_id, renewal = under.renewal.count, "renewed in place");
    Ok(written)
}

/// The encoded config, only ever handed to the Secret.
fn jit_value(jit: &JitConfig) -> &str {
    jit.encoded_jit_config.expose()
}

/// Removes the registration an earlier attempt left under this runner's
/// name, if it is in the runner's scale set.
async fn remove_stale(
    runner: &EphemeralRunner,
    ctx: &Context,
    client: &ActionsClient,
) -> Result<(), EphemeralRunnerError> {
    let name = runner.name_any();
    let ours = runner.spec.runner_scale_set_id;
    match client.get_runner_by_name(&name).await? {
        Some(found) if found.runner_scale_set_id == ours => {
            match client.remove_runner(found.id).await {
                Ok(()) | Err(ActionsError::RunnerNotFound { .. }) => {}
                Err(error) => return Err(error.into()),
            }
            let notice = Notice::normal(
                EventReason::StaleRegistrationRemoved.as_str(),
                format!(
                    "registration {} of this runner was left by an earlier attempt without its JIT config; removed it",
                    found.id
                ),
            );
            ctx.publisher.publish(&runner.object_ref(&()), notice).await;
            Ok(())
        }
        Some(found) => Err(EphemeralRunnerError::NameTakenElsewhere {
            name,
            other: found.runner_scale_set_id,
            ours,
        }),
        None => Err(EphemeralRunnerError::NameTakenButAbsent(name)),
    }
}
