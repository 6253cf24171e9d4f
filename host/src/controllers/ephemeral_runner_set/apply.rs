//! Carrying out a plan: each write one API call, made with the set's field
//! manager; which writes, in what order, the plan and the reconcile say.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::plan::Creation;
use super::{Context, Error};
use crate::api::field_managers::EPHEMERAL_RUNNER_SET as FIELD_MANAGER;
use crate::api::{
    EphemeralRunner, EphemeralRunnerSet, EphemeralRunnerSetStatus, EphemeralRunnerStatus,
    RunnerRenewal, annotations, finalizers, labels,
};
use crate::backlog::SetKey;
use crate::controllers::kit::expectations::Known;
use crate::controllers::kit::{Notice, finalizer};

/// The writes of one pass over `set`.
pub(super) struct Apply<'a> {
    ctx: &'a Context,
    set: &'a EphemeralRunnerSet,
    sets: Api<EphemeralRunnerSet>,
    /// The set's runners' namespace.
    pub runners: Api<EphemeralRunner>,
}

impl<'a> Apply<'a> {
    /// The writes to `set` and its runners.
    pub fn new(ctx: &'a Context, set: &'a EphemeralRunnerSet) -> Self {
        let namespace = set.namespace().unwrap_or_default();
        Self {
            ctx,
            set,
            sets: Api::namespaced(ctx.client.clone(), &namespace),
            runners: Api::namespaced(ctx.client.clone(), &namespace),
        }
    }

    /// Adds the set's finalizer (the kit's compare-and-swap).
    pub async fn add_finalizer(&self) -> Result<(), Error> {
        finalizer::add(
            &self.sets,
            self.set,
            &finalizers::EPHEMERAL_RUNNER_SET,
            FIELD_MANAGER,
        )
        .await
        .map_err(Error::Update)
    }

    /// Removes the set's finalizer, under its name or a former one.
    pub async fn remove_finalizer(&self) -> Result<(), Error> {
        finalizer::remove(
            &self.sets,
            self.set,
            &finalizers::EPHEMERAL_RUNNER_SET,
            FIELD_MANAGER,
        )
        .await
        .map_err(Error::Update)
    }

    /// Deletes `runner`, with the uid and resourceVersion the pass read as
    /// preconditions: a runner that changed since (the listener recorded a
    /// job on it) makes the deletion fail with a conflict, and the next
    /// pass decides again, instead of this one taking a busy runner. The
    /// same holds of a job the listener was heard to start and has not
    /// recorded (see [`crate::backlog`]), looked up again just before the
    /// deletion. A runner gone already needs no deletion.
    pub async fn delete(&self, runner: &EphemeralRunner) -> Result<(), Error> {
        let name = runner.name_any();
        let set = SetKey::new(
            &runner.namespace().unwrap_or_default(),
            &self.set.name_any(),
        );
        let registration = runner.status.as_ref().map_or(0, |s| s.runner_id);
        if self
            .ctx
            .backlogs
            .job_on(&set, &name, registration)
            .is_some()
        {
            return Err(Error::Busy(name));
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: runner.uid(),
                resource_version: runner.resource_version(),
            }),
            ..DeleteParams::default()
        };
        let deleted = match self.runners.delete(&name, &params).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(source) => Err(Error::Delete {
                name: name.clone(),
                source,
            }),
        };
        // Refused (the runner changed since it was read) or not known:
        // the next pass lists the set's runners again.
        let known = deleted.is_ok().then(|| Known::Absent { uid: runner.uid() });
        self.record(&name, known);
        deleted
    }

    /// Renews `runner` under the decision `under` stands for: the whole
    /// status written anew (see `RunnerRenewal`), on the condition that the
    /// runner is still the version given (its resourceVersion), so a runner
    /// that changed since is refused with a conflict rather than renewed on
    /// an old view.
    pub async fn renew(
        &self,
        runner: &EphemeralRunner,
        under: Creation,
        now: Timestamp,
    ) -> Result<(), kube::Error> {
        let count = runner
            .status
            .as_ref()
            .map_or(0, EphemeralRunnerStatus::renewals)
            .saturating_add(1);
        let renewed = EphemeralRunner {
            status: Some(EphemeralRunnerStatus {
                renewal: Some(RunnerRenewal {
                    count,
                    patch_id: under.patch_id,
                    set_generation: under.set_generation,
                    renewed_at: Time(now),
                    previous: None,
                }),
                ..EphemeralRunnerStatus::default()
            }),
            ..runner.clone()
        };
        let name = runner.name_any();
        let written = self
            .runners
            .replace_status(&name, &post_params(), &renewed)
            .await;
        self.record(
            &name,
            written.as_ref().ok().and_then(|r| Known::of(&r.metadata)),
        );
        written.map(drop)
    }

    /// Records what the API server said of the set's runner `name`.
    fn record(&self, name: &str, known: Option<Known>) {
        self.ctx
            .record_runner(&self.set.uid().unwrap_or_default(), name, known);
    }

    /// Creates one runner of `creation`, recording `patch_id` on it
    /// ([`Creation::patch_id_of`]).
    pub async fn create(&self, creation: Creation, patch_id: i32) -> Result<(), Error> {
        let creation = Creation {
            patch_id,
            ..creation
        };
        let created = self
            .runners
            .create(&post_params(), &new_runner(self.set, creation))
            .await;
        match &created {
            Ok(runner) => {
                self.record(&runner.name_any(), Known::of(&runner.metadata));
                if let (Some(runner), Some(set)) = (runner.uid(), self.set.uid()) {
                    self.ctx.made_runners.made(&runner, &set);
                }
            }
            // It may have been made under a name never learnt.
            Err(_) => self.record("", None),
        }
        created.map(drop).map_err(Error::Create)
    }

    /// Writes the set's status.
    pub async fn write_status(&self, status: &EphemeralRunnerSetStatus) -> Result<(), Error> {
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..PatchParams::default()
        };
        self.sets
            .patch_status(
                &self.set.name_any(),
                &params,
                &Patch::Merge(json!({ "status": status })),
            )
            .await
            .map(drop)
            .map_err(Error::Update)
    }

    /// Publishes `notice` on the set.
    pub async fn publish(&self, notice: Notice) {
        self.ctx
            .publisher
            .publish(&self.set.object_ref(&()), notice)
            .await;
    }
}

fn post_params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PostParams::default()
    }
}

/// Builds one runner of `set`: also what a runner built now looks like,
/// which a runner must still match to be renewed.
pub(super) fn new_runner(set: &EphemeralRunnerSet, creation: Creation) -> EphemeralRunner {
    let name = set.name_any();
    let extra = set
        .spec
        .ephemeral_runner_metadata
        .clone()
        .unwrap_or_default();
    let mut runner_labels: BTreeMap<String, String> = extra.labels.unwrap_or_default();
    for (key, value) in set.labels() {
        runner_labels
            .entry(key.clone())
            .or_insert_with(|| value.clone());
    }
    runner_labels.insert(labels::EPHEMERAL_RUNNER_SET.into(), name.clone());
    runner_labels.insert(labels::COMPONENT.into(), "runner".into());
    runner_labels.insert(labels::PART_OF.into(), labels::ARCWRIGHT.into());
    let mut runner_annotations = extra.annotations.unwrap_or_default();
    runner_annotations.insert(annotations::PATCH_ID.into(), creation.patch_id.to_string());
    runner_annotations.insert(annotations::REVISION.into(), creation.revision.to_string());
    runner_annotations.insert(
        annotations::SET_GENERATION.into(),
        creation.set_generation.to_string(),
    );
    EphemeralRunner {
        metadata: ObjectMeta {
            generate_name: Some(format!("{name}-runner-")),
            namespace: set.namespace(),
            labels: Some(runner_labels),
            annotations: Some(runner_annotations),
            // Born with the runner controller's finalizer: adding it after
            // creation is a write and a reconcile per runner, and nothing
            // the runner owns exists before its controller first sees it.
            finalizers: Some(vec![finalizers::EPHEMERAL_RUNNER.name.to_owned()]),
            owner_references: Some(vec![OwnerReference {
                api_version: EphemeralRunnerSet::api_version(&()).into(),
                kind: EphemeralRunnerSet::kind(&()).into(),
                name,
                uid: set.uid().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..ObjectMeta::default()
        },
        spec: set.spec.ephemeral_runner_spec.clone(),
        status: None,
    }
}
