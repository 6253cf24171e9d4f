//! Carrying out a plan: one call to the Kubernetes API, the Actions service
//! or the listeners per step, in order, with this controller's field
//! manager. Nothing here decides; a call that finds its object already gone
//! (a 404 on a deletion) counts as done.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde_json::json;

use super::observe::{Apis, actions_client};
use super::plan::{ProxySecretData, RunnerSetPublication, StatusChange, Step};
use super::{Context, Error, credentials_hold};
use crate::actions::{ActionsClient, ActionsError};
use crate::api::{
    AutoscalingRunnerSet, AutoscalingRunnerSetPhase, AutoscalingRunnerSetStatus,
    EphemeralRunnerSet, annotations, field_managers, finalizers, labels,
};
use crate::controllers::kit::finalizer;
use crate::credentials::{ActionsClientSource, CredentialsError};
use crate::listener::control::ListenerControl;

const FIELD_MANAGER: &str = field_managers::AUTOSCALING_RUNNER_SET;

pub(super) fn kube_err(action: &'static str) -> impl FnOnce(kube::Error) -> Error {
    move |source| Error::Kube { action, source }
}

pub(super) fn actions_err(action: &'static str) -> impl FnOnce(ActionsError) -> Error {
    move |source| Error::Actions { action, source }
}

/// Where the steps leave the reconcile.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Applied {
    /// Every step was carried out.
    All,
    /// The credentials Secret went between the look and the call that
    /// needed it; the next pass sees it gone and says so.
    SecretGone,
}

/// Applies `steps` in order to `set`, the copy they were planned from;
/// `client` is the pass's Actions client, got on first use.
pub(super) async fn apply<L: ListenerControl, S: ActionsClientSource>(
    steps: Vec<Step>,
    set: &AutoscalingRunnerSet,
    client: &mut Option<ActionsClient>,
    context: &Context<L, S>,
    apis: &Apis,
) -> Result<Applied, Error> {
    for step in steps {
        if apply_step(step, set, client, context, apis).await? == Applied::SecretGone {
            return Ok(Applied::SecretGone);
        }
    }
    Ok(Applied::All)
}

async fn apply_step<L: ListenerControl, S: ActionsClientSource>(
    step: Step,
    set: &AutoscalingRunnerSet,
    client: &mut Option<ActionsClient>,
    context: &Context<L, S>,
    apis: &Apis,
) -> Result<Applied, Error> {
    let namespace = set.namespace().unwrap_or_default();
    let name = set.name_any();
    match step {
        Step::AddFinalizer => finalizer::add(
            &apis.sets,
            set,
            &finalizers::AUTOSCALING_RUNNER_SET,
            FIELD_MANAGER,
        )
        .await
        .map_err(kube_err("adding the finalizer"))?,
        Step::RemoveFinalizer => {
            finalizer::remove(
                &apis.sets,
                set,
                &finalizers::AUTOSCALING_RUNNER_SET,
                FIELD_MANAGER,
            )
            .await
            .map_err(kube_err("removing the finalizer"))?;
            context.forget(&namespace, &name);
            context.metrics().forget_scale_set(&namespace, &name);
            // Its runners and their registrations are gone with it; a set
            // of the same target still here builds the client again.
            context.actions.forget(&super::github_target(set));
        }
        Step::HoldCredentials => {
            let secret = &set.spec.github_config_secret;
            credentials_hold::hold(&context.client, &namespace, secret)
                .await
                .map_err(kube_err("holding the credentials Secret"))?;
            context.held_credentials.saw(&namespace, secret, true);
        }
        Step::ReleaseCredentials => {
            let secret = &set.spec.github_config_secret;
            let released = credentials_hold::release(&context.client, &namespace, secret, set)
                .await
                .map_err(kube_err("releasing the credentials Secret"))?;
            let held = released == credentials_hold::Released::HeldForAnother;
            context.held_credentials.saw(&namespace, secret, held);
        }
        Step::ReleaseFormerCredentials(secret) => {
            let released = credentials_hold::release(&context.client, &namespace, &secret, set)
                .await
                .map_err(kube_err("releasing the former credentials Secret"))?;
            let held = released == credentials_hold::Released::HeldForAnother;
            context.held_credentials.saw(&namespace, &secret, held);
        }
        Step::RecordCredentials => {
            let patch = json!({"metadata": {"annotations": {
                annotations::CREDENTIALS_SECRET: set.spec.github_config_secret,
            }}});
            apis.sets
                .patch(
                    &name,
                    &PatchParams::apply(FIELD_MANAGER),
                    &Patch::Merge(&patch),
                )
                .await
                .map_err(kube_err("recording the credentials Secret"))?;
        }
        Step::UpdateScaleSet { id, to } => {
            actions_client(context, set, client)
                .await?
                .update_runner_scale_set(id, &to)
                .await
                .map_err(actions_err("updating the scale set"))?;
            tracing::info!(id, "updated the scale set");
        }
        Step::DeleteScaleSet(id) => {
            let client = match actions_client(context, set, client).await {
                Ok(client) => client,
                Err(CredentialsError::SecretNotFound { .. }) => return Ok(Applied::SecretGone),
                Err(error) => return Err(error.into()),
            };
            match client.delete_runner_scale_set(id).await {
                Ok(()) | Err(ActionsError::ScaleSetNotFound { .. }) => {
                    tracing::info!(id, "deleted the scale set");
                }
                Err(error) => return Err(actions_err("deleting the scale set")(error)),
            }
        }
        Step::AnnotateScaleSetId(id) => {
            let patch =
                json!({"metadata": {"annotations": {annotations::SCALE_SET_ID: id.to_string()}}});
            apis.sets
                .patch(
                    &name,
                    &PatchParams::apply(FIELD_MANAGER),
                    &Patch::Merge(&patch),
                )
                .await
                .map_err(kube_err("recording the scale set id"))?;
        }
        Step::WriteStatus(change) => write_status(&apis.sets, &name, &change).await?,
        Step::WriteRunnerProxy(data) => {
            write_runner_proxy(&apis.secrets, set, &data).await?;
        }
        Step::PublishRunnerSet(publication) => {
            let written = publish_runner_set(&apis.runner_sets, set, &publication).await;
            context.wrote_runner_set(&namespace, &name, &written);
            written?;
        }
        Step::PinRunnerSet => {
            let pinned = apis
                .runner_sets
                .patch(
                    &name,
                    &PatchParams::apply(FIELD_MANAGER),
                    &Patch::Merge(json!({"spec": {"replicas": 0, "patchID": 0}})),
                )
                .await;
            context.wrote_runner_set(&namespace, &name, &pinned);
            pinned.map_err(kube_err("pinning the EphemeralRunnerSet"))?;
        }
        Step::DeleteRunner(runner) => ignore_not_found(
            apis.runners
                .delete(&runner, &DeleteParams::default())
                .await
                .map(|_| ()),
        )
        .map_err(kube_err("deleting an idle runner"))?,
        Step::DeleteRunnerSet => {
            context.known_runner_sets.forget(&namespace, &name);
            ignore_not_found(
                apis.runner_sets
                    .delete(&name, &DeleteParams::default())
                    .await
                    .map(|_| ()),
            )
            .map_err(kube_err("deleting the EphemeralRunnerSet"))?
        }
        Step::StopListener => context.listeners.stop(&namespace, &name).await,
        Step::StartListener(config) => context.listeners.ensure(*config).await?,
        Step::Publish(notice) => context.events.publish(&set.object_ref(&()), notice).await,
        Step::NoteCountsMoved => context.note_counts_moved(&namespace, &name),
    }
    Ok(Applied::All)
}

/// Writes the runners' proxy Secret, owned by the set (it goes with it).
async fn write_runner_proxy(
    secrets: &Api<Secret>,
    set: &AutoscalingRunnerSet,
    data: &ProxySecretData,
) -> Result<(), Error> {
    let name = super::observe::runner_proxy_secret_name(set);
    let owner = set
        .controller_owner_ref(&())
        .ok_or(Error::Incomplete("uid"))?;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: set.namespace(),
            labels: Some(BTreeMap::from([(
                labels::MANAGED_BY.to_owned(),
                labels::ARCWRIGHT.to_owned(),
            )])),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        data: Some(
            data.0
                .iter()
                .map(|(key, value)| (key.clone(), ByteString(value.clone().into_bytes())))
                .collect(),
        ),
        type_: Some("Opaque".to_owned()),
        ..Secret::default()
    };
    secrets
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&secret),
        )
        .await
        .map_err(kube_err("writing the runners' proxy Secret"))?;
    Ok(())
}

/// The named fields of a status change, as a merge patch writes them.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
struct StatusFields<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    phase: Option<AutoscalingRunnerSetPhase>,
    #[serde(skip_serializing_if = "Option::is_none")]
    runner_scale_set_id: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    conditions: Option<&'a [Condition]>,
}

/// A status change as the merge patch it is: only the fields it names are
/// written, and never the listener's (a whole status leaves them out).
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum StatusBody<'a> {
    Fields(StatusFields<'a>),
    Whole(&'a AutoscalingRunnerSetStatus),
}

#[derive(Debug, Serialize)]
struct StatusPatch<'a> {
    status: StatusBody<'a>,
}

async fn write_status(
    sets: &kube::Api<AutoscalingRunnerSet>,
    name: &str,
    change: &StatusChange,
) -> Result<(), Error> {
    let (status, action) = match change {
        StatusChange::Pending => (
            StatusBody::Fields(StatusFields {
                phase: Some(AutoscalingRunnerSetPhase::Pending),
                ..StatusFields::default()
            }),
            "marking the set pending",
        ),
        StatusChange::ScaleSetId(id) => (
            StatusBody::Fields(StatusFields {
                runner_scale_set_id: Some(*id),
                ..StatusFields::default()
            }),
            "recording the scale set id",
        ),
        StatusChange::Conditions(conditions) => (
            StatusBody::Fields(StatusFields {
                conditions: Some(conditions),
                ..StatusFields::default()
            }),
            "writing the conditions",
        ),
        StatusChange::Settled(status) => (StatusBody::Whole(status), "writing the status"),
    };
    sets.patch_status(
        name,
        &PatchParams::apply(FIELD_MANAGER),
        &Patch::Merge(StatusPatch { status }),
    )
    .await
    .map_err(kube_err(action))?;
    Ok(())
}

/// Creates or updates the EphemeralRunnerSet with server-side apply, owned
/// by the set (so it goes with it).
async fn publish_runner_set(
    runner_sets: &kube::Api<EphemeralRunnerSet>,
    set: &AutoscalingRunnerSet,
    publication: &RunnerSetPublication,
) -> Result<EphemeralRunnerSet, Error> {
    let owner = OwnerReference {
        api_version: AutoscalingRunnerSet::api_version(&()).into_owned(),
        kind: AutoscalingRunnerSet::kind(&()).into_owned(),
        name: set.name_any(),
        uid: set.uid().ok_or(Error::Incomplete("uid"))?,
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    let mut spec = json!({
        "actionableRevision": publication.revision,
        "ephemeralRunnerSpec": publication.runner_spec,
    });
    if let Some(metadata) = &publication.runner_metadata {
        spec["ephemeralRunnerMetadata"] = json!(metadata);
    }
    let object = json!({
        "apiVersion": EphemeralRunnerSet::api_version(&()),
        "kind": EphemeralRunnerSet::kind(&()),
        "metadata": {
            "name": set.name_any(),
            "labels": publication.labels,
            "annotations": publication.annotations,
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
        .map_err(kube_err("applying the EphemeralRunnerSet"))
}

fn ignore_not_found(result: Result<(), kube::Error>) -> Result<(), kube::Error> {
    match result {
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        other => other,
    }
}
