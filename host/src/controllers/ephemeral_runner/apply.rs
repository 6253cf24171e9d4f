//! Carrying out a plan: one API call per step, in order.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use super::plan::{Plan, REGISTERED, Severity, Step};
use super::resources::{jit_secret, runner_pod};
use super::{Context, EphemeralRunnerError, FINALIZER, github_target, kube_error};
use crate::actions::{ActionsClient, ActionsError, JitConfig, JitRunnerSetting};
use crate::api::{EphemeralRunner, EphemeralRunnerPhase};

/// Applies `plan`; returns whether the finalizer was removed (the runner is
/// going away).
pub(super) async fn apply(
    runner: &EphemeralRunner,
    plan: &Plan,
    ctx: &Context,
) -> Result<bool, EphemeralRunnerError> {
    let namespace = runner.namespace().unwrap_or_default();
    let name = runner.name_any();
    let client = ctx.deps.client.clone();
    let runners: Api<EphemeralRunner> = Api::namespaced(client.clone(), &namespace);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let mut finalized = false;
    for step in &plan.steps {
        match step {
            Step::AddFinalizer => {
                let mut finalizers = runner.finalizers().to_vec();
                finalizers.push(FINALIZER.to_string());
                set_finalizers(runner, &runners, finalizers, "add the finalizer").await?;
            }
            Step::RemoveFinalizer => {
                let finalizers = runner
                    .finalizers()
                    .iter()
                    .filter(|f| *f != FINALIZER)
                    .cloned()
                    .collect();
                set_finalizers(runner, &runners, finalizers, "remove the finalizer").await?;
                finalized = true;
            }
            Step::PatchStatus(status) => {
                runners
                    .patch_status(&name, &PatchParams::default(), &Patch::Merge(status))
                    .await
                    .map_err(kube_error("patch the runner status"))?;
            }
            Step::Register { replacing } => {
                register(runner, ctx, &runners, &secrets, replacing.as_deref()).await?;
            }
            Step::CreatePod => {
                let pod = runner_pod(runner, &ctx.config.user_agent);
                match pods.create(&PostParams::default(), &pod).await {
                    // No event (see `publish`).
                    Ok(_) => tracing::debug!(runner = %name, "runner pod created"),
                    // An older pod of the same name is still terminating; its
                    // deletion wakes the next reconcile.
                    Err(kube::Error::Api(e)) if e.code == 409 => {}
                    Err(kube::Error::Api(e)) if e.code == 422 => {
                        let message = format!("the runner pod is invalid: {}", e.message);
                        let status = json!({"status": {
                            "phase": EphemeralRunnerPhase::Failed, "reason": "InvalidPod", "message": message,
                        }});
                        runners
                            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                            .await
                            .map_err(kube_error("patch the runner status"))?;
                        publish(ctx, runner, Severity::Warning, "InvalidPod", message).await;
                    }
                    Err(e) => return Err(kube_error("create the runner pod")(e)),
                }
            }
            Step::DeletePod { uid } => {
                delete(&pods, &name, uid, None, "delete the runner pod").await?
            }
            Step::ForceDeletePod { uid } => {
                delete(&pods, &name, uid, Some(0), "force-delete the runner pod").await?;
            }
            Step::DeleteSecret => match secrets.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(kube_error("delete the JIT config Secret")(e)),
            },
            Step::Deregister { runner_id } => {
                ctx.pool
                    .push(ctx.key(runner, *runner_id), github_target(runner));
            }
            Step::Event {
                severity,
                reason,
                note,
            } => {
                publish(ctx, runner, *severity, reason, note.clone()).await;
            }
            Step::CountDeregistration { verdict, outcome } => {
                ctx.deps.metrics.deregistration(verdict, outcome);
            }
            Step::NotifySlack(failure) => super::notify::notify(runner, failure.clone(), ctx),
        }
    }
    Ok(finalized)
}

/// Writes the finalizer list, on the condition that the runner is still the
/// version read (the resourceVersion makes the merge patch conditional), so
/// a finalizer another controller added meanwhile is never dropped.
async fn set_finalizers(
    runner: &EphemeralRunner,
    api: &Api<EphemeralRunner>,
    finalizers: Vec<String>,
    action: &'static str,
) -> Result<(), EphemeralRunnerError> {
    let patch = json!({"metadata": {
        "finalizers": finalizers,
        "resourceVersion": runner.resource_version(),
    }});
    match api
        .patch(
            &runner.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        // Gone already: nothing to hold.
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(kube_error(action)(e)),
    }
}

async fn delete(
    pods: &Api<Pod>,
    name: &str,
    uid: &str,
    grace: Option<u32>,
    action: &'static str,
) -> Result<(), EphemeralRunnerError> {
    let params = DeleteParams {
        grace_period_seconds: grace,
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match pods.delete(name, &params).await {
        Ok(_) => Ok(()),
        // Gone, or a newer pod of the same name: not ours to delete.
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(e) => Err(kube_error(action)(e)),
    }
}

/// Publishes an event on the runner. Best effort: an event that cannot be
/// written is logged, never a reason to fail the reconcile.
///
/// Events are kept to what a person looking at a runner needs: warnings,
/// and the steps off the everyday path (a registration removed by the
/// pool, a hold, a stale registration cleaned up). The everyday steps of
/// every runner (registered, pod created, succeeded) are not events: each
/// would be an API server write per job (and the event's own watch
/// traffic), for what the runner's status and conditions already say.
pub(super) async fn publish(
    ctx: &Context,
    runner: &EphemeralRunner,
    severity: Severity,
    reason: &str,
    note: String,
) {
    publish_with(
        &ctx.recorder,
        &runner.object_ref(&()),
        severity,
        reason,
        note,
    )
    .await;
}

/// [`publish`] from outside a reconcile (a task that outlives it).
pub(super) async fn publish_with(
    recorder: &Recorder,
    reference: &ObjectReference,
    severity: Severity,
    reason: &str,
    note: String,
) {
    let event = Event {
        type_: match severity {
            Severity::Normal => EventType::Normal,
            Severity::Warning => EventType::Warning,
        },
        reason: reason.to_string(),
        note: Some(note),
        action: "Reconcile".to_string(),
        secondary: None,
    };
    if let Err(error) = recorder.publish(&event, reference).await {
        let runner = reference.name.as_deref().unwrap_or_default();
        tracing::warn!(runner, %error, "publishing an event failed");
    }
}

/// Registers the runner and stores its JIT config in its Secret, once.
///
/// A registration of this name that already exists in the scale set is one
/// an earlier attempt made and lost before writing the Secret (a crash, a
/// timeout after the service acted): its config cannot be read back, so it
/// is removed and the runner registered again. It is never left behind.
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
) -> Result<(), EphemeralRunnerError> {
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
        None => secrets.create(&PostParams::default(), &secret).await,
        Some(version) => {
            secret.metadata.resource_version = Some(version.to_owned());
            secrets
                .replace(&name, &PostParams::default(), &secret)
                .await
        }
    };
    match written {
        Ok(_) => {}
        Err(error) => {
            // The registration is useless without its Secret: remove it
            // rather than leak it. Best effort; the next attempt's
            // RunnerExists path removes it otherwise.
            if let Err(removal) = client.remove_runner(runner_id).await {
                tracing::warn!(runner = %name, runner_id, error = %removal, "removing a registration whose Secret could not be written");
            }
            return Err(kube_error("write the JIT config Secret")(error));
        }
    }
    let status = runner.status.clone().unwrap_or_default();
    if status.runner_id == 0 && status.condition(REGISTERED).is_none() {
        // The first registration: the Secret is its record, and the plan
        // copies it into the status with the next status write (the pod
        // running, or ending), a write per runner saved. A later one is
        // written now: the status names the registration before it, and
        // the plan must not take that one's end for this one's.
        tracing::debug!(runner = %name, runner_id, scale_set, "registered");
        return Ok(());
    }
    let now = jiff::Timestamp::now();
    let mut conditions = status.conditions.clone();
    conditions.retain(|c| c.type_ != REGISTERED && c.type_ != super::plan::ONLINE);
    conditions.push(k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
        type_: REGISTERED.to_string(),
        status: "True".to_string(),
        reason: "JitConfigCreated".to_string(),
        message: format!("registered as runner {runner_id}"),
        last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now),
        observed_generation: None,
    });
    let status = json!({"status": {
        "runnerId": runner_id,
        "runnerName": jit.runner.name,
        "phase": EphemeralRunnerPhase::Pending,
        "ready": false,
        "conditions": conditions,
    }});
    runners
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .map_err(kube_error("patch the runner status"))?;
    // No event (see `publish`): the Registered condition says it.
    tracing::debug!(runner = %name, runner_id, scale_set, "registered");
    Ok(())
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
            publish(
                ctx,
                runner,
                Severity::Normal,
                "StaleRegistrationRemoved",
                format!(
                    "registration {} of this runner was left by an earlier attempt without its JIT config; removed it",
                    found.id
                ),
            )
            .await;
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
