//! The thin layers around [`plan`](super::plan): what a set and its runners
//! look like to the plan, and how a plan is carried out.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::metrics::SetLabels;
use super::plan::{self, Creation, DeleteReason, Plan, RunnerView, SetView};
use super::{Context, Error, SetMemory};
use crate::api::field_managers::EPHEMERAL_RUNNER_SET as FIELD_MANAGER;
use crate::api::{
    EphemeralRunner, EphemeralRunnerPhase, EphemeralRunnerSet, EphemeralRunnerStatus,
    RunnerRenewal, annotations, finalizers, labels,
};
use crate::controllers::kit::{ErrorLabel, Notice, finalizer};

/// Retries a failed reconcile soon: everything it does is idempotent.
pub fn error_policy(set: Arc<EphemeralRunnerSet>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(set = %set.name_any(), error = %error, kind = error.label(), "reconcile failed");
    ctx.controller_metrics
        .error(super::CONTROLLER_NAME, error.label());
    Action::requeue(Duration::from_secs(5))
}

/// One pass: observe, plan, apply.
pub async fn reconcile(set: Arc<EphemeralRunnerSet>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _timer = ctx.controller_metrics.time(super::CONTROLLER_NAME);
    let namespace = set.namespace().ok_or(Error::MissingMetadata("namespace"))?;
    let name = set.name_any();
    let uid = set.uid().ok_or(Error::MissingMetadata("uid"))?;
    let set_labels = SetLabels {
        namespace: namespace.clone(),
        name: name.clone(),
    };
    ctx.metrics.reconciles.get_or_create(&set_labels).inc();

    let runners_api: Api<EphemeralRunner> = Api::namespaced(ctx.client.clone(), &namespace);
    let runners: Vec<EphemeralRunner> = runners_api
        .list(&ListParams::default().labels(&format!("{}={name}", labels::EPHEMERAL_RUNNER_SET)))
        .await
        .map_err(Error::List)?
        .items
        .into_iter()
        .filter(|r| r.owner_references().iter().any(|o| o.uid == uid))
        .collect();
    let now = jiff::Timestamp::now();
    // What a runner built now looks like, once for the pass.
    let template = new_runner(&set, Creation::default());
    let views: Vec<RunnerView> = runners
        .iter()
        .map(|r| runner_view(r, &template, now))
        .collect();
    // By uid: a set deleted and made again under its name starts afresh.
    let key = uid.clone();
    let memory = ctx
        .memory
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&key)
        .copied()
        .unwrap_or_default();
    let plan = plan::plan(
        &SetView {
            decision_applied: memory.decided.is_some() && memory.decided == set.metadata.generation,
            ..set_view(&set)
        },
        &views,
    );

    let sets_api: Api<EphemeralRunnerSet> = Api::namespaced(ctx.client.clone(), &namespace);
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    if plan.add_finalizer {
        finalizer::add(
            &sets_api,
            &set,
            &finalizers::EPHEMERAL_RUNNER_SET,
            FIELD_MANAGER,
        )
        .await
        .map_err(Error::Update)?;
        return Ok(Action::requeue(Duration::ZERO));
    }

    delete_runners(&runners_api, &runners, &plan).await?;
    report_deletions(&ctx, &set, &plan).await;
    // No event either, for the same reason.
    let not_renewed =
        renew_runners(&runners_api, &runners, &set, &template, &plan.renew, now).await;
    // A runner not renewed (it changed since the list) is made up for by a
    // new one: the renewals done carry the decision's patch id, so the next
    // pass takes the decision as acted on and would not.
    let creation = plan.create.map(|c| Creation {
        count: c.count + i32::try_from(not_renewed.len()).unwrap_or(i32::MAX),
        ..c
    });
    if let Some(creation) = creation.filter(|c| c.count > 0) {
        // No event: runners are created and deleted as jobs come and go,
        // an event write per job for what the status counts say (see
        // `report_deletions`).
        create_runners(&runners_api, &set, creation).await?;
    }
    if let Some(error) = not_renewed.into_iter().next() {
        return Err(error);
    }
    if let Some(generation) = plan.decided {
        remember(&ctx, &key, |m| m.decided = Some(generation));
    }
    let since_last = memory.status_written.map(|at| at.elapsed());
    let before = set.status.clone().unwrap_or_default();
    let deferred = plan
        .status
        .as_ref()
        .and_then(|status| plan::counts_deferred(&before, status, since_last));
    if let Some(status) = plan.status.as_ref().filter(|_| deferred.is_none()) {
        // Last: the applied revision it may carry must not be recorded
        // before the cleanup it stands for went through.
        sets_api
            .patch_status(&name, &params, &Patch::Merge(json!({ "status": status })))
            .await
            .map_err(Error::Update)?;
        remember(&ctx, &key, |m| m.status_written = Some(Instant::now()));
        if status.applied_actionable_revision != before.applied_actionable_revision {
            let note = format!(
                "Runners of revisions before {} are cleaned up",
                status.applied_actionable_revision
            );
            event(&ctx, &set, Notice::normal("RevisionApplied", note)).await;
        }
        if status.phase != before.phase {
            let phase = status.phase.map(|p| format!("{p:?}")).unwrap_or_default();
            let note = format!("Phase is {phase}");
            event(&ctx, &set, Notice::normal("PhaseChanged", note)).await;
        }
        ctx.metrics
            .current
            .get_or_create(&set_labels)
            .set(i64::from(status.current_replicas));
    }
    ctx.metrics
        .desired
        .get_or_create(&set_labels)
        .set(i64::from(set.spec.replicas));
    if plan.remove_finalizer {
        finalizer::remove(
            &sets_api,
            &set,
            &finalizers::EPHEMERAL_RUNNER_SET,
            FIELD_MANAGER,
        )
        .await
        .map_err(Error::Update)?;
        ctx.metrics.current.remove(&set_labels);
        ctx.metrics.desired.remove(&set_labels);
        ctx.memory
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key);
        return Ok(Action::await_change());
    }
    Ok(Action::requeue(
        deferred.map_or(plan.requeue, |wait| wait.min(plan.requeue)),
    ))
}

/// Changes what the controller remembers of the set whose uid is `key`.
fn remember(ctx: &Context, key: &str, change: impl FnOnce(&mut SetMemory)) {
    let mut memory = ctx.memory.lock().unwrap_or_else(|e| e.into_inner());
    change(memory.entry(key.to_owned()).or_default());
}

/// What the plan needs of the set; what the controller remembers of it
/// ([`SetView::decision_applied`]) is the caller's to add.
pub fn set_view(set: &EphemeralRunnerSet) -> SetView {
    SetView {
        generation: set.metadata.generation.unwrap_or_default(),
        deleting: set.metadata.deletion_timestamp.is_some(),
        has_finalizer: finalizer::held(set, &finalizers::EPHEMERAL_RUNNER_SET),
        replicas: set.spec.replicas,
        patch_id: set.spec.patch_id,
        actionable_revision: set.spec.actionable_revision,
        status: set.status.clone().unwrap_or_default(),
        decision_applied: false,
    }
}

/// What the plan needs of a runner, at `now`; `template` is a runner its
/// set builds now ([`new_runner`]). A renewed runner's patch id and set
/// generation are its renewal's (see `RunnerRenewal`).
pub fn runner_view(
    runner: &EphemeralRunner,
    template: &EphemeralRunner,
    now: jiff::Timestamp,
) -> RunnerView {
    let annotation = |key: &str| runner.annotations().get(key).and_then(|v| v.parse().ok());
    let status = runner.status.clone().unwrap_or_default();
    // Its registration gone since: the runner's controller records it with
    // the phase, in the same write, when the runner ends.
    let registration_gone = status
        .condition(crate::controllers::ephemeral_runner::plan::REGISTERED)
        .filter(|c| c.status == "False")
        .map(|c| c.last_transition_time.0);
    let renewable_for = registration_gone
        .filter(|_| status.phase == Some(EphemeralRunnerPhase::Succeeded))
        .filter(|_| built_as_now(runner, template))
        .map(|since| Duration::try_from(now.duration_since(since)).unwrap_or(Duration::ZERO));
    let (patch_id, set_generation) = match &status.renewal {
        Some(renewal) => (Some(renewal.patch_id), Some(renewal.set_generation)),
        None => (
            annotation(annotations::PATCH_ID).and_then(|v: i64| i32::try_from(v).ok()),
            annotation(annotations::SET_GENERATION),
        ),
    };
    RunnerView {
        name: runner.name_any(),
        created: runner.metadata.creation_timestamp.clone(),
        deleting: runner.metadata.deletion_timestamp.is_some(),
        phase: status.phase,
        runner_id: status.runner_id,
        has_job: status.has_job(),
        job_ended: status.job_ended(),
        patch_id,
        revision: annotation(annotations::REVISION).unwrap_or(0),
        set_generation,
        renewable_for,
    }
}

/// Whether `runner` has the spec, labels and annotations of `now`, a
/// runner the set creates now. A renewal keeps the object as it is, so a
/// runner built from an older template (a metadata change does not move
/// the revision) is not renewed: it ends, and a new one is built.
fn built_as_now(runner: &EphemeralRunner, now: &EphemeralRunner) -> bool {
    let has_all = |want: &BTreeMap<String, String>, have: &BTreeMap<String, String>| {
        want.iter()
            .filter(|(key, _)| {
                ![
                    annotations::PATCH_ID,
                    annotations::REVISION,
                    annotations::SET_GENERATION,
                ]
                .contains(&key.as_str())
            })
            .all(|(key, value)| have.get(key) == Some(value))
    };
    runner.spec == now.spec
        && has_all(now.labels(), runner.labels())
        && has_all(now.annotations(), runner.annotations())
}

/// Renews what the plan says: the whole status written anew (see
/// `RunnerRenewal`), on the condition that the runner is still the version
/// the plan saw (its resourceVersion), so a runner that changed since is
/// decided on again by the next pass rather than renewed on an old view.
///
/// A renewal that finds the runner changed since the pass read it reads it
/// again and renews it if it still can be (it succeeded, its registration
/// is gone, it is built as now, it is not being deleted), once. What
/// changes a finished runner meanwhile is nearly always the listener's
/// late record of the job it ran, which a renewal is meant to replace; a
/// renewal given up for it would be made up for with a creation, three
/// API server writes more.
async fn renew_runners(
    api: &Api<EphemeralRunner>,
    runners: &[EphemeralRunner],
    set: &EphemeralRunnerSet,
    template: &EphemeralRunner,
    names: &[String],
    now: jiff::Timestamp,
) -> Vec<Error> {
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PostParams::default()
    };
    let renewal = |runner: &EphemeralRunner| RunnerRenewal {
        count: runner
            .status
            .as_ref()
            .map_or(0, EphemeralRunnerStatus::renewals)
            .saturating_add(1),
        patch_id: set.spec.patch_id,
        set_generation: set.metadata.generation.unwrap_or_default(),
        renewed_at: Time(now),
    };
    let renewed = |runner: &EphemeralRunner| EphemeralRunner {
        status: Some(EphemeralRunnerStatus {
            renewal: Some(renewal(runner)),
            ..EphemeralRunnerStatus::default()
        }),
        ..runner.clone()
    };
    let (params, renewed) = (&params, &renewed);
    each_named(runners, names.iter(), "renewed", |runner| {
        let name = runner.name_any();
        let first = renewed(runner);
        async move {
            let error = match api.replace_status(&name, params, &first).await {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(e)) if e.code == 409 => kube::Error::Api(e),
                Err(source) => return Err(Error::Renew { name, source }),
            };
            let fresh = match api.get_opt(&name).await {
                Ok(Some(fresh)) => fresh,
                // Gone after it changed: not renewed, so that a creation
                // makes up for it.
                Ok(None) => {
                    return Err(Error::Renew {
                        name,
                        source: error,
                    });
                }
                Err(source) => return Err(Error::Renew { name, source }),
            };
            let view = runner_view(&fresh, template, now);
            if view.deleting || view.renewable_for.is_none() {
                return Err(Error::Renew {
                    name,
                    source: error,
                });
            }
            api.replace_status(&name, params, &renewed(&fresh))
                .await
                .map(drop)
                .map_err(|source| Error::Renew { name, source })
        }
    })
    .await
}

/// Does `write` to each runner of `names` this pass read, all of them even
/// when one fails; a deletion of a runner gone meanwhile is skipped, and the
/// other failures are returned (typically conflicts: the runner changed since the
/// pass read it, and the next pass decides again).
async fn each_named<'a, W, F>(
    runners: &'a [EphemeralRunner],
    names: impl Iterator<Item = &'a String>,
    done: &str,
    mut write: W,
) -> Vec<Error>
where
    W: FnMut(&'a EphemeralRunner) -> F,
    F: std::future::Future<Output = Result<(), Error>>,
{
    let mut failures = Vec::new();
    for name in names {
        let Some(runner) = runners.iter().find(|r| r.name_any() == *name) else {
            continue;
        };
        match write(runner).await {
            Ok(()) => {}
            // A runner gone needs no deletion; one gone before it was
            // renewed is a failure, which a creation makes up for.
            Err(Error::Delete {
                source: kube::Error::Api(e),
                ..
            }) if e.code == 404 => {}
            Err(error) => {
                tracing::info!(%error, "runner not {done}; the next pass decides again");
                failures.push(error);
            }
        }
    }
    failures
}

/// Builds one runner of `set`.
pub fn new_runner(set: &EphemeralRunnerSet, creation: Creation) -> EphemeralRunner {
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

async fn create_runners(
    api: &Api<EphemeralRunner>,
    set: &EphemeralRunnerSet,
    creation: Creation,
) -> Result<(), Error> {
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PostParams::default()
    };
    let runner = new_runner(set, creation);
    for _ in 0..creation.count {
        api.create(&params, &runner).await.map_err(Error::Create)?;
    }
    Ok(())
}

/// Deletes what the plan says, each with the uid and resourceVersion the
/// plan saw as preconditions: a runner that changed since (the listener
/// recorded a job on it) makes the deletion fail with a conflict, and the
/// next pass decides again, instead of this one taking a busy runner.
async fn delete_runners(
    api: &Api<EphemeralRunner>,
    runners: &[EphemeralRunner],
    plan: &Plan,
) -> Result<(), Error> {
    each_named(
        runners,
        plan.delete.iter().map(|(name, _)| name),
        "deleted",
        |runner| {
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: runner.uid(),
                    resource_version: runner.resource_version(),
                }),
                ..DeleteParams::default()
            };
            let (api, name) = (api.clone(), runner.name_any());
            async move {
                api.delete(&name, &params)
                    .await
                    .map(drop)
                    .map_err(|source| Error::Delete { name, source })
            }
        },
    )
    .await
    .into_iter()
    .next()
    .map_or(Ok(()), Err)
}

/// Events for the deletions off the everyday path. A finished runner
/// deleted is every job's end: an event for it would be a write per job.
async fn report_deletions(ctx: &Context, set: &EphemeralRunnerSet, plan: &Plan) {
    for reason in [
        DeleteReason::SetDeleted,
        DeleteReason::OldRevision,
        DeleteReason::StaleOutdated,
        DeleteReason::ScaleDown,
    ] {
        let names: Vec<&str> = plan
            .delete
            .iter()
            .filter(|(_, r)| *r == reason)
            .map(|(n, _)| n.as_str())
            .collect();
        if !names.is_empty() {
            let note = format!("Deleted runner(s) {}", names.join(", "));
            event(ctx, set, Notice::normal(reason.as_str(), note)).await;
        }
    }
}

/// Publishes `notice` on the set.
async fn event(ctx: &Context, set: &EphemeralRunnerSet, notice: Notice) {
    ctx.publisher.publish(&set.object_ref(&()), notice).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{EphemeralRunnerSetSpec, ResourceMeta};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

    fn set(team: &str, image: &str) -> EphemeralRunnerSet {
        let mut spec = EphemeralRunnerSetSpec::default();
        spec.ephemeral_runner_spec.spec.containers = vec![k8s_openapi::api::core::v1::Container {
            name: "runner".into(),
            image: Some(image.into()),
            ..Default::default()
        }];
        spec.ephemeral_runner_metadata = Some(ResourceMeta {
            labels: Some([("team".to_string(), team.to_string())].into()),
            ..Default::default()
        });
        let mut set = EphemeralRunnerSet::new("linux", spec);
        set.metadata.namespace = Some("ns".into());
        set.metadata.uid = Some("uid".into());
        set
    }

    #[test]
    fn only_a_runner_built_as_the_set_builds_them_now_is_renewable() {
        let now: jiff::Timestamp = "2026-12-01T00:00:10Z".parse().unwrap();
        let current = set("ci", "runner:1");
        let mut runner = new_runner(&current, Creation::default());
        runner.metadata.name = Some("linux-runner-a".into());
        runner.status = Some(EphemeralRunnerStatus {
            phase: Some(EphemeralRunnerPhase::Succeeded),
            conditions: vec![Condition {
                type_: "Registered".into(),
                status: "False".into(),
                reason: "SelfDeregistered".into(),
                message: String::new(),
                last_transition_time: Time("2026-12-01T00:00:07Z".parse().unwrap()),
                observed_generation: None,
            }],
            ..Default::default()
        });
        let renewable = |set: &EphemeralRunnerSet| {
            runner_view(&runner, &new_runner(set, Creation::default()), now).renewable_for
        };
        assert_eq!(renewable(&current), Some(Duration::from_secs(3)));
        assert_eq!(
            renewable(&set("platform", "runner:1")),
            None,
            "metadata changed"
        );
        assert_eq!(renewable(&set("ci", "runner:2")), None, "spec changed");
    }
}
