//! What an AutoscalingRunnerSet reconcile does, decided from a snapshot with
//! no I/O.
//!
//! The reconciler observes (the set, its EphemeralRunnerSet, its listener,
//! the pod-validation verdict), calls [`plan`] or [`plan_deletion`], and
//! applies the steps. When the plan needs something that costs a call to
//! know (the API server's own copy of the set, the scale set the Actions
//! service holds), it says so with a [`Need`]; the reconciler answers it
//! and plans again. Keeping the decision pure is what lets every rule of
//! seed 004 be pinned in a table: observedGeneration that catches up only
//! when a change was applied, the Outdated parking that must not churn, the
//! forced revision bump that recovers from it, and the deletion order that
//! never cancels a job.
//!
//! The rules, in the order [`plan`] applies them:
//!
//! 1. **A refused template builds nothing** and changes nothing in the
//!    service: what runs keeps running on the last accepted spec, the
//!    generation stays unapplied so the fix is picked up as a change, and
//!    the refusal is announced once per distinct set of violations
//!    ([`rejected`]; tests: `a rejected template ...`).
//! 2. **Outdated parks the scale set** (the runners rejected the current
//!    spec): the EphemeralRunnerSet pinned at zero, the listener stopped,
//!    and nothing but a spec change switches it back on ([`parked`];
//!    tests: `... Outdated ...`).
//! 3. **A spec change, or a scale set not yet known, is brought to the
//!    service first**: the finalizer, then phase Pending, then the scale
//!    set ([`Need::ScaleSet`]), found by id, adopted by name or registered
//!    ([`Need::Registration`]), and updated only where it differs
//!    ([`in_service`]). A plan that would write Pending or ask the service
//!    is made again from the API server's copy ([`Need::FreshCopy`]): the
//!    watch's copy may predate this controller's last status write (tests:
//!    `a spec change ...`, `a new object ...`, `a stale copy ...`).
//! 4. **The EphemeralRunnerSet** is created at revision 1; runner spec
//!    drift, or a recovery from Outdated, publishes the next revision;
//!    labels and runner metadata are published at the same revision, since
//!    runners are rebuilt only for a new one; what the API server drops
//!    (empty lists and maps) is no drift ([`runner_set_step`],
//!    [`semantically_equal`]; tests: `... revision ...`, `... empty env
//!    ...`).
//! 5. **The listener** starts once the scale set's id is known and is
//!    restarted when its configuration changes (a label edit), with phase
//!    Pending written at the teardown ([`listener_steps`]; tests: `a
//!    label-only change ...`).
//! 6. **The status** is written only when it changes, or when Pending was
//!    written in the same pass; the runner counts are copied from the
//!    EphemeralRunnerSet, and while they move the set is looked at on a
//!    short beat ([`settle`]; tests: `... counts ...`).
//! 7. **Deletion** goes listener, runners (idle ones deleted, busy ones
//!    waited for), EphemeralRunnerSet, scale set in the service (or a
//!    reason why it cannot be, or an admin's force), the credentials
//!    Secret released, finalizer ([`plan_deletion`]; tests in
//!    [`deletion`]).
//! 8. **The credentials Secret is held** with a finalizer while the set
//!    exists, so deleting both together (`helm uninstall`) still leaves
//!    the teardown its credentials; a deletion releases it once the scale
//!    set is gone from the service, unless another set names the same
//!    Secret; the set records the Secret it holds, so one its spec no
//!    longer names (rotated credentials) is let go of once the new one is
//!    held (tests: `... credentials ...`).
//! 9. **One scale set, one set**: a scale set found by name whose id
//!    another AutoscalingRunnerSet records is not adopted; the set waits,
//!    saying which set holds it ([`conflicted`]); and a scale set the
//!    listener finds gone from the service is found again or registered
//!    anew ([`Observed::scale_set_lost`]; tests: `... conflict ...`, `...
//!    lost ...`).
//! 10. **A failure is said once**: a reconcile of a live set that fails on
//!     something the admin can act on, or must know of (credentials, the
//!     service unreachable or refusing, a policy, a refused object), sets
//!     `Stalled` with the failure's reason and its causes and publishes one
//!     event per distinct failure; the next reconcile that settles removes
//!     it ([`stalled`], [`failure`](super::failure); tests: `... stalled
//!     ...`).
//! 11. **The runners' proxy Secret** (`http_proxy`, `https_proxy`,
//!     `no_proxy`, credentials in the URLs, as ARC keeps it) is written
//!     before the runner spec that names it is published, whenever what it
//!     should hold differs from what it holds, so runner pods never carry a
//!     proxy password in their spec and a rotated password reaches the next
//!     runner (tests: `... proxy ...`).

mod deletion;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde_json::Value;

use super::failure::Failure;
use crate::actions::RunnerScaleSet;
use crate::api::autoscaling_runner_set::{
    AutoscalingRunnerSetCondition, AutoscalingRunnerSetEvent, PodTemplateReason,
    RunnersCappedReason, ScaleSetConflictReason, ShadowPodTemplateReason,
};
use crate::api::{
    AutoscalingRunnerSetPhase, AutoscalingRunnerSetStatus, EphemeralRunnerSetPhase,
    EphemeralRunnerSetSpec, EphemeralRunnerSpec, ResourceMeta,
};
use crate::controllers::kit::{Notice, conditions};
use crate::listener::control::ListenerConfig;
use crate::policy::types::Violation;

pub use deletion::{
    BLOCKED_POLL, DELETION_POLL, Deletion, DeletionObserved, DeletionPlan, RunnerObserved,
    RunnerSetState, plan_deletion,
};

/// How often a settled scale set is looked at again anyway.
pub const RESYNC: Duration = Duration::from_secs(300);

/// How soon to look again while the runner counts copied from the
/// EphemeralRunnerSet are moving. The owned watch does not wake the scale
/// set on counter changes (a reconcile and a status write per runner
/// otherwise), so during a burst the copy is refreshed on this beat, and
/// settles back to [`RESYNC`] once they have not changed for
/// [`COUNTS_SETTLED`].
pub const COUNTS_RESYNC: Duration = Duration::from_secs(10);

/// How long after the counts last changed they count as moving. Any
/// reconcile sets the next look (the scale set's own status write wakes
/// it too), so "moving" is remembered, not judged from one pass.
pub const COUNTS_SETTLED: Duration = Duration::from_secs(60);

pub use crate::policy::gate::{TemplateVerdict, violations_message};

/// What a shadow pod-validation policy says of the template: shown in the
/// `ShadowPodTemplateAccepted` condition, never acted on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShadowTemplateVerdict {
    /// The shadow policy's label.
    pub policy: String,
    /// Its verdict, or why it gave none.
    pub verdict: Result<TemplateVerdict, String>,
}

/// The EphemeralRunnerSet as the AutoscalingRunnerSet reads it: exactly the
/// projection its owned watch compares (seed 004), so a field read here and
/// not compared there cannot be missed.
#[derive(Clone, Debug, PartialEq)]
pub struct RunnerSetObserved {
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its spec.
    pub spec: EphemeralRunnerSetSpec,
    /// Its phase.
    pub phase: EphemeralRunnerSetPhase,
    /// `status.appliedActionableRevision`.
    pub applied_revision: i64,
}

/// The EphemeralRunnerSet's runner counts, copied into the scale set's
/// status. Not part of [`RunnerSetObserved`]: the owned watch does not wake
/// the scale set for them, which is why moving counts are looked at again
/// on [`COUNTS_RESYNC`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunnerCounts {
    /// `status.currentReplicas`.
    pub current: i32,
    /// `status.pendingEphemeralRunners`.
    pub pending: i32,
    /// `status.runningEphemeralRunners`.
    pub running: i32,
    /// `status.failedEphemeralRunners`.
    pub failed: i32,
}

/// The scale set as the Actions service holds it: the answer to
/// [`Need::ScaleSet`], then to [`Need::Registration`].
#[derive(Clone, Debug, PartialEq)]
pub enum ServiceScaleSet {
    /// Found by its recorded id, or else adopted by name, in the runner
    /// group.
    Found {
        /// The runner group's id.
        group_id: i64,
        /// The scale set.
        scale_set: Box<RunnerScaleSet>,
    },
    /// Neither: one is to be registered in the runner group.
    Absent {
        /// The runner group's id.
        group_id: i64,
    },
    /// Registered by this reconcile, with this id.
    Registered {
        /// The id the service gave it.
        id: i64,
    },
    /// Found by name, but another AutoscalingRunnerSet records its id: two
    /// sets driving one scale set would each scale it, and the first
    /// deleted would delete it under the other.
    HeldByAnother {
        /// Its id.
        id: i64,
        /// The other set, `namespace/name`.
        holder: String,
    },
}

/// What a plan needs before it can decide the rest; the reconciler answers
/// it into the [`Observed`] and plans again. Each is asked at most once a
/// reconcile.
#[derive(Clone, Debug, PartialEq)]
pub enum Need {
    /// The API server's copy of the set (a quorum read), because the plan
    /// would write Pending or bring the scale set to the service and the
    /// copy it has is the watch's. The watch may not hold this
    /// controller's own last status write yet: a reconcile queued by the
    /// writes of the one before it can start from the copy in between,
    /// with the id recorded but the generation not yet observed, and
    /// acting on it would mark a running set Pending and sync the scale
    /// set a second time. One read per spec change; none in the steady
    /// state. A copy of the same generation keeps the verdict already
    /// made on its template, and the EphemeralRunnerSet is not read again.
    FreshCopy,
    /// The scale set the service holds for this set. Asked once the
    /// finalizer and Pending are written, so a reconcile that fails in the
    /// service leaves the set held and visibly pending.
    ScaleSet,
    /// This scale set registered in the service: nothing after it can be
    /// decided without the id the service gives it.
    Registration(Box<RunnerScaleSet>),
}

/// A change of the set's status, typed so that a misspelt field does not
/// compile. Each is one merge patch of the status subresource that leaves
/// the listener's fields alone.
#[derive(Clone, Debug, PartialEq)]
pub enum StatusChange {
    /// Phase Pending, nothing else (observedGeneration unchanged).
    Pending,
    /// The scale set's id, recorded as soon as it is known.
    ScaleSetId(i64),
    /// The status the reconcile ends with; its `listener` and `scaling`
    /// are left out (they are the listener's).
    Settled(Box<AutoscalingRunnerSetStatus>),
    /// The conditions alone.
    Conditions(Vec<Condition>),
}

/// The EphemeralRunnerSet as it is published, with server-side apply.
/// `replicas` and `patchID` are not in it: they belong to the listener,
/// and owning them here would reset a scaling decision on every publish.
#[derive(Clone, Debug, PartialEq)]
pub struct RunnerSetPublication {
    /// `spec.actionableRevision`.
    pub revision: i64,
    /// `spec.ephemeralRunnerSpec`.
    pub runner_spec: EphemeralRunnerSpec,
    /// `spec.ephemeralRunnerMetadata`.
    pub runner_metadata: Option<ResourceMeta>,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its annotations.
    pub annotations: BTreeMap<String, String>,
}

/// One thing to do: one call to the Kubernetes API, the Actions service or
/// the listeners.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Add the finalizer.
    AddFinalizer,
    /// Add [`finalizers::CREDENTIALS_IN_USE`](crate::api::finalizers::CREDENTIALS_IN_USE)
    /// to the credentials Secret.
    HoldCredentials,
    /// Remove it: the scale set is gone from the service and no other set
    /// names the Secret.
    ReleaseCredentials,
    /// Remove it from this Secret, which the set held before its spec named
    /// another, and which no other set names.
    ReleaseFormerCredentials(String),
    /// Record the spec's Secret as the one the set holds
    /// ([`annotations::CREDENTIALS_SECRET`](crate::api::annotations::CREDENTIALS_SECRET)).
    RecordCredentials,
    /// Bring the scale set's name, runner group and labels in line.
    UpdateScaleSet {
        /// Its id.
        id: i64,
        /// What it should be.
        to: Box<RunnerScaleSet>,
    },
    /// Record the scale set's id in the annotation, which survives a
    /// restore from a backup that loses the status.
    AnnotateScaleSetId(i64),
    /// Change the status.
    WriteStatus(StatusChange),
    /// Write the runners' proxy Secret.
    WriteRunnerProxy(ProxySecretData),
    /// Create or update the EphemeralRunnerSet.
    PublishRunnerSet(Box<RunnerSetPublication>),
    /// Pin the EphemeralRunnerSet at zero replicas and patch id 0: every
    /// runner not executing a job is released, and a later decision of the
    /// listener (a higher patch id) is what scales it again.
    PinRunnerSet,
    /// Stop the listener and wait until it has stopped.
    StopListener,
    /// Start the listener with this configuration.
    StartListener(Box<ListenerConfig>),
    /// Publish an event on the set.
    Publish(Notice),
    /// Remember that the runner counts moved now (see [`COUNTS_SETTLED`]).
    NoteCountsMoved,
    /// Delete this idle runner.
    DeleteRunner(String),
    /// Delete the EphemeralRunnerSet.
    DeleteRunnerSet,
    /// Delete the scale set in the Actions service.
    DeleteScaleSet(i64),
    /// Remove the finalizer (under its former names too): the object goes,
    /// and what the controller remembers of it is forgotten.
    RemoveFinalizer,
}

/// What comes after a plan's steps.
#[derive(Clone, Debug, PartialEq)]
pub enum Then {
    /// Answer this and plan again.
    Ask(Need),
    /// The reconcile is done; look again after this long.
    LookAgainIn(Duration),
}

/// One round of a reconcile: steps to apply in order, then what comes next.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The steps, in order.
    pub steps: Vec<Step>,
    /// What comes after them.
    pub then: Then,
}

/// Everything [`plan`] decides from.
#[derive(Clone, Debug, PartialEq)]
pub struct Observed {
    /// `metadata.generation`.
    pub generation: i64,
    /// The status as stored, without the listener's fields (`listener`,
    /// `scaling`): those are the listener's, so they are neither compared
    /// nor written here, and a status written here never undoes one the
    /// listener wrote meanwhile.
    pub status: AutoscalingRunnerSetStatus,
    /// Whether the finalizer is on the object (under any of its names).
    pub has_finalizer: bool,
    /// The verdict on `spec.template`.
    pub template: TemplateVerdict,
    /// The shadow pod-validation policy's, when the spec names one.
    pub shadow_template: Option<ShadowTemplateVerdict>,
    /// The scale set's id in the Actions service, when known: the status,
    /// or the annotation when the status was lost.
    pub scale_set_id: Option<i64>,
    /// The scale set's name in the service (and `runs-on` label).
    pub scale_set_name: String,
    /// Its extra labels.
    pub scale_set_labels: Vec<String>,
    /// The runner spec the set should publish; its scale set id is the
    /// known one (0 when none is), and the plan sets the one it resolves.
    pub desired_runner_spec: EphemeralRunnerSpec,
    /// The metadata new runners should get.
    pub desired_runner_metadata: Option<ResourceMeta>,
    /// The labels the EphemeralRunnerSet should carry.
    pub desired_runner_set_labels: BTreeMap<String, String>,
    /// The annotations the EphemeralRunnerSet should carry.
    pub desired_runner_set_annotations: BTreeMap<String, String>,
    /// The EphemeralRunnerSet, when it exists.
    pub runner_set: Option<RunnerSetObserved>,
    /// Its runner counts, once it has a status.
    pub runner_counts: Option<RunnerCounts>,
    /// The configuration of the running listener, when one runs.
    pub listener: Option<ListenerConfig>,
    /// The configuration the listener should have; its scale set id is
    /// set by the plan, as the runner spec's is.
    pub desired_listener: ListenerConfig,
    /// Whether the object was read from the API server in this reconcile
    /// (the answer to [`Need::FreshCopy`]), rather than from the watch.
    pub from_api_server: bool,
    /// The scale set in the service, once asked ([`Need::ScaleSet`]).
    pub service: Option<ServiceScaleSet>,
    /// How long ago the copied runner counts last moved, if this
    /// controller remembers them moving.
    pub counts_moved_ago: Option<Duration>,
    /// What in the spec the host's runner cap overrides, when something
    /// does: the `RunnersCapped` condition's message.
    pub capped: Option<String>,
    /// Whether the listener reports the scale set gone from the service
    /// (it retries with `ScaleSetNotFound`): the set finds it again by name
    /// or registers it anew, and the listener restarts with its id.
    pub scale_set_lost: bool,
    /// Whether the credentials Secret holds
    /// [`finalizers::CREDENTIALS_IN_USE`](crate::api::finalizers::CREDENTIALS_IN_USE);
    /// `None` when there is nothing to hold (the Secret is absent, or
    /// already being deleted, when no finalizer can be added).
    pub credentials_held: Option<bool>,
    /// Whether the set records its spec's Secret as the one it holds
    /// ([`annotations::CREDENTIALS_SECRET`](crate::api::annotations::CREDENTIALS_SECRET)).
    pub credentials_recorded: bool,
    /// The Secret the set records holding, when its spec now names another.
    pub former_credentials: Option<FormerCredentials>,
    /// The runners' proxy Secret, when the spec has a proxy.
    pub runner_proxy: Option<RunnerProxy>,
    /// Now, for the conditions' transition times.
    pub now: Timestamp,
}

/// What the runners' proxy Secret holds: proxy URLs with their
/// credentials. Never printed: `Debug` names the keys only.
#[derive(Clone, PartialEq, Eq)]
pub struct ProxySecretData(pub BTreeMap<String, String>);

impl std::fmt::Debug for ProxySecretData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

/// The runners' proxy Secret, compared with what it should hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunnerProxy {
    /// It holds what it should.
    Current,
    /// It is absent or holds something else; this is what it should hold.
    Stale(ProxySecretData),
}

/// A credentials Secret the set held before its spec named another.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FormerCredentials {
    /// Its name.
    pub name: String,
    /// Whether it still carries our finalizer.
    pub held: bool,
    /// Whether another set names it, which then keeps it held.
    pub shared: bool,
}

impl FormerCredentials {
    /// Whether this set is the one to let go of it.
    pub fn to_release(&self) -> bool {
        self.held && !self.shared
    }
}

/// Decides one round of a reconcile of a live (not deleting)
/// AutoscalingRunnerSet.
pub fn plan(observed: &Observed) -> Plan {
    let plan = decide(observed);
    // Rule 3: what writes Pending or goes to the service is decided from
    // the API server's copy.
    let touches = plan.then == Then::Ask(Need::ScaleSet)
        || plan
            .steps
            .contains(&Step::WriteStatus(StatusChange::Pending));
    if touches && !observed.from_api_server {
        return Plan {
            steps: Vec::new(),
            then: Then::Ask(Need::FreshCopy),
        };
    }
    plan
}

fn decide(observed: &Observed) -> Plan {
    let spec_changed = observed.status.observed_generation != Some(observed.generation);
    // The service is asked only after the finalizer and a spec change's
    // Pending are written: once it has answered, they are.
    let written_before_asking = observed.service.is_some();
    let mut steps = Vec::new();
    if !observed.has_finalizer && !written_before_asking {
        steps.push(Step::AddFinalizer);
    }
    // Rule 8: the credentials stay while the scale set does, so a Secret
    // deleted with the set is still there for its teardown. The set records the Secret it holds before holding it, and a
    // Secret the spec no longer names is let go before the record moves on
    // from it; a pass cut short anywhere leaves nothing held unrecorded.
    if observed.credentials_held.is_some() && !written_before_asking {
        if let Some(former) = observed
            .former_credentials
            .as_ref()
            .filter(|f| f.to_release())
        {
            steps.push(Step::ReleaseFormerCredentials(former.name.clone()));
        }
        if !observed.credentials_recorded {
            steps.push(Step::RecordCredentials);
        }
    }
    if observed.credentials_held == Some(false) && !written_before_asking {
        steps.push(Step::HoldCredentials);
    }
    if let TemplateVerdict::Rejected(violations) = &observed.template {
        return rejected(observed, steps, violations);
    }
    if !spec_changed && outdated(observed) {
        return parked(observed, steps);
    }
    if spec_changed && !written_before_asking {
        steps.push(Step::WriteStatus(StatusChange::Pending));
    }
    if let Some(ServiceScaleSet::HeldByAnother { id, holder }) = &observed.service {
        return conflicted(observed, steps, *id, holder);
    }
    let id = match (
        spec_changed || observed.scale_set_id.is_none() || observed.scale_set_lost,
        observed.scale_set_id,
    ) {
        (false, Some(id)) => id,
        _ => match in_service(observed, &mut steps) {
            Ok(id) => id,
            Err(need) => {
                return Plan {
                    steps,
                    then: Then::Ask(need),
                };
            }
        },
    };
    if observed.scale_set_id != Some(id) {
        if observed.scale_set_lost {
            steps.push(Step::Publish(
                Notice::warning(
                    AutoscalingRunnerSetEvent::ScaleSetLost.as_str(),
                    format!(
                        "the scale set {} is gone from the Actions service; the set now drives \
                         scale set {id}",
                        observed.scale_set_id.unwrap_or_default()
                    ),
                )
                .during("Register"),
            ));
        }
        steps.push(Step::AnnotateScaleSetId(id));
        steps.push(Step::WriteStatus(StatusChange::ScaleSetId(id)));
    }

    let mut listener = observed.desired_listener.clone();
    listener.scale_set_id = id;
    let (restart, listener_steps) = listener_steps(observed, listener);
    // Pending at the point the listener is torn down: that is what the
    // phase means, whatever triggered the rebuild (seed 004). A spec
    // change wrote it already.
    if restart && !spec_changed {
        steps.push(Step::WriteStatus(StatusChange::Pending));
    }
    // Rule 11.
    if let Some(RunnerProxy::Stale(data)) = &observed.runner_proxy {
        steps.push(Step::WriteRunnerProxy(data.clone()));
    }
    if let Some(publication) = runner_set_step(observed, id, spec_changed) {
        steps.push(Step::PublishRunnerSet(Box::new(publication)));
    }
    steps.extend(listener_steps);
    let pending_written = spec_changed || restart;
    settle(
        observed,
        steps,
        Settled {
            phase: AutoscalingRunnerSetPhase::Running,
            observed_generation: Some(observed.generation),
            scale_set_id: Some(id),
            violations: None,
            pending_written,
            conflict: None,
        },
    )
}

/// The shadow pod-validation policy's condition, or none without one.
fn set_shadow_template(conditions: &mut Vec<Condition>, observed: &Observed) {
    let type_ = AutoscalingRunnerSetCondition::ShadowPodTemplateAccepted.as_str();
    let Some(shadow) = &observed.shadow_template else {
        conditions.retain(|c| c.type_ != type_);
        return;
    };
    let (status, reason, message) = match &shadow.verdict {
        Ok(TemplateVerdict::Accepted) => (
            true,
            ShadowPodTemplateReason::Accepted,
            format!("the shadow policy {} accepts the template", shadow.policy),
        ),
        Ok(TemplateVerdict::Rejected(violations)) => (
            false,
            ShadowPodTemplateReason::WouldReject,
            format!(
                "the shadow policy {} would reject: {}",
                shadow.policy,
                violations_message(violations)
            ),
        ),
        Err(error) => (
            false,
            ShadowPodTemplateReason::ShadowPolicyFailed,
            format!(
                "the shadow policy {} could not judge: {error}",
                shadow.policy
            ),
        ),
    };
    conditions::set(
        conditions,
        conditions::Setting {
            type_,
            status,
            reason: reason.as_str(),
            message: &message,
            observed_generation: Some(observed.generation),
        },
        observed.now,
    );
}

/// Rule 1: a refused template leaves the set Pending with the generation
/// unapplied, and says why once per distinct set of violations (the
/// condition still carrying the same message means it was announced).
fn rejected(observed: &Observed, mut steps: Vec<Step>, violations: &[Violation]) -> Plan {
    let message = violations_message(violations);
    let announced = observed
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == AutoscalingRunnerSetCondition::PodTemplateAccepted.as_str())
        .is_some_and(|c| c.status == "False" && c.message == message);
    if !announced {
        steps.push(Step::Publish(
            Notice::warning(
                AutoscalingRunnerSetEvent::PodTemplateRejected.as_str(),
                format!("the pod-validation policy refused the template: {message}"),
            )
            .during("ValidatePodTemplate"),
        ));
    }
    settle(
        observed,
        steps,
        Settled {
            phase: AutoscalingRunnerSetPhase::Pending,
            observed_generation: observed.status.observed_generation,
            scale_set_id: observed.scale_set_id,
            violations: Some(violations),
            pending_written: false,
            conflict: None,
        },
    )
}

/// How soon a set waiting for another's scale set looks again: the holder's
/// deletion frees the name, and nothing else tells this set.
pub const CONFLICT_POLL: Duration = Duration::from_secs(15);

/// Rule 9: the scale set of this name is another set's. Nothing is
/// registered, adopted, built or deleted for it; the set says why it waits
/// (an event once per holder) and looks again, with its spec left
/// unapplied, so every look asks the service anew.
fn conflicted(observed: &Observed, mut steps: Vec<Step>, id: i64, holder: &str) -> Plan {
    let message = format!(
        "the scale set {:?} (id {id}) is held by the AutoscalingRunnerSet {holder}; this set \
         waits until it is free (rename one of them, or give it another runner group)",
        observed.scale_set_name
    );
    let announced = observed.status.conditions.iter().any(|c| {
        c.type_ == AutoscalingRunnerSetCondition::ScaleSetConflict.as_str() && c.message == message
    });
    if !announced {
        steps.push(Step::Publish(
            Notice::warning(
                AutoscalingRunnerSetEvent::ScaleSetConflict.as_str(),
                message.clone(),
            )
            .during("Register"),
        ));
    }
    if observed.listener.is_some() {
        steps.push(Step::StopListener);
    }
    let plan = settle(
        observed,
        steps,
        Settled {
            phase: AutoscalingRunnerSetPhase::Pending,
            observed_generation: observed.status.observed_generation,
            scale_set_id: observed.scale_set_id,
            violations: None,
            pending_written: true,
            conflict: Some(&message),
        },
    );
    Plan {
        then: Then::LookAgainIn(CONFLICT_POLL),
        ..plan
    }
}

/// Rule 2: whether the scale set is parked, or must be: the runners
/// rejected the spec the set applied.
fn outdated(observed: &Observed) -> bool {
    observed.status.phase == Some(AutoscalingRunnerSetPhase::Outdated)
        || observed.runner_set.as_ref().is_some_and(|set| {
            set.phase == EphemeralRunnerSetPhase::Outdated
                && set.applied_revision >= set.spec.actionable_revision
        })
}

/// Rule 2: parked. Nothing but a spec change may switch the scale set back
/// on, so the set stays pinned and the listener stopped.
fn parked(observed: &Observed, mut steps: Vec<Step>) -> Plan {
    if let Some(set) = &observed.runner_set
        && (set.spec.replicas != 0 || set.spec.patch_id != 0)
    {
        steps.push(Step::PinRunnerSet);
    }
    if observed.listener.is_some() {
        steps.push(Step::StopListener);
    }
    settle(
        observed,
        steps,
        Settled {
            phase: AutoscalingRunnerSetPhase::Outdated,
            observed_generation: Some(observed.generation),
            scale_set_id: observed.scale_set_id,
            violations: None,
            pending_written: false,
            conflict: None,
        },
    )
}

/// Rule 3: the scale set's id once the service has been asked, or what the
/// plan needs to know it. Found by id (so a group change moves it rather
/// than registering a second one), else adopted by name, else registered;
/// its labels, name and group updated only when they differ.
fn in_service(observed: &Observed, steps: &mut Vec<Step>) -> Result<i64, Need> {
    let desired = |group_id| {
        RunnerScaleSet::new(
            observed.scale_set_name.clone(),
            group_id,
            &observed.scale_set_labels,
        )
    };
    match &observed.service {
        None => Err(Need::ScaleSet),
        Some(ServiceScaleSet::Absent { group_id }) => {
            Err(Need::Registration(Box::new(desired(*group_id))))
        }
        Some(ServiceScaleSet::Registered { id }) => Ok(*id),
        Some(ServiceScaleSet::HeldByAnother { .. }) => {
            unreachable!("decide() answers a conflict before asking the service's scale set")
        }
        Some(ServiceScaleSet::Found {
            group_id,
            scale_set,
        }) => {
            let desired = desired(*group_id);
            if !same_scale_set(scale_set, &desired) {
                steps.push(Step::UpdateScaleSet {
                    id: scale_set.id,
                    to: Box::new(desired),
                });
            }
            Ok(scale_set.id)
        }
    }
}

/// Whether the service's scale set has the name, group and labels asked
/// for (labels in any order).
fn same_scale_set(current: &RunnerScaleSet, desired: &RunnerScaleSet) -> bool {
    let names = |set: &RunnerScaleSet| {
        let mut names: Vec<String> = set.labels.iter().map(|l| l.name.clone()).collect();
        names.sort_unstable();
        names
    };
    current.name == desired.name
        && current.runner_group_id == desired.runner_group_id
        && names(current) == names(desired)
}

/// Rule 4: what to publish of the EphemeralRunnerSet, if anything.
fn runner_set_step(
    observed: &Observed,
    id: i64,
    spec_changed: bool,
) -> Option<RunnerSetPublication> {
    let mut runner_spec = observed.desired_runner_spec.clone();
    runner_spec.runner_scale_set_id = id;
    let revision = match &observed.runner_set {
        None => 1,
        Some(set) => {
            let without_shadows = |spec: &EphemeralRunnerSpec| EphemeralRunnerSpec {
                policies: spec.policies.active(),
                ..spec.clone()
            };
            let drift = !semantically_equal(
                &without_shadows(&set.spec.ephemeral_runner_spec),
                &without_shadows(&runner_spec),
            );
            let was_outdated = observed.status.phase == Some(AutoscalingRunnerSetPhase::Outdated);
            // Recovering from Outdated republishes at a new revision even
            // when the runner spec did not change: the revision is what
            // tells the set to stop judging itself by the runners that
            // rejected the old one.
            if drift || (spec_changed && was_outdated) {
                set.spec.actionable_revision + 1
            } else if !semantically_equal(
                &set.spec.ephemeral_runner_metadata,
                &observed.desired_runner_metadata,
            ) || set.spec.ephemeral_runner_spec.policies != runner_spec.policies
                || !observed
                    .desired_runner_set_labels
                    .iter()
                    .all(|(key, value)| set.labels.get(key) == Some(value))
            {
                // Only the labels, the runner metadata or a shadow policy
                // moved: the same revision, since runners are rebuilt only
                // for a new one. Runners made from now on carry it.
                set.spec.actionable_revision
            } else {
                return None;
            }
        }
    };
    Some(RunnerSetPublication {
        revision,
        runner_spec,
        runner_metadata: observed.desired_runner_metadata.clone(),
        labels: observed.desired_runner_set_labels.clone(),
        annotations: observed.desired_runner_set_annotations.clone(),
    })
}

/// Rule 5: the listener's steps, and whether they tear a running one down
/// (a label edit propagates to the listener, so it is a restart).
fn listener_steps(observed: &Observed, desired: ListenerConfig) -> (bool, Vec<Step>) {
    match &observed.listener {
        None => (false, vec![Step::StartListener(Box::new(desired))]),
        Some(running) if *running == desired => (false, Vec::new()),
        Some(_) => (
            true,
            vec![Step::StopListener, Step::StartListener(Box::new(desired))],
        ),
    }
}

/// The status a reconcile ends with, as [`settle`] writes it.
struct Settled<'a> {
    phase: AutoscalingRunnerSetPhase,
    /// The object's generation when this reconcile applied it, else the
    /// previous value.
    observed_generation: Option<i64>,
    scale_set_id: Option<i64>,
    /// The template's violations, when it was refused.
    violations: Option<&'a [Violation]>,
    /// Whether this pass wrote Pending: the stored status then no longer
    /// equals the observed one, so the final one is written regardless.
    pending_written: bool,
    /// Why the set waits for another's scale set (the `ScaleSetConflict`
    /// condition's message), when it does.
    conflict: Option<&'a str>,
}

/// Rule 6: the status write that ends a reconcile, unless the status is
/// already that (an unchanged status is not written, so the set does not
/// wake itself), and when to look again.
fn settle(observed: &Observed, mut steps: Vec<Step>, settled: Settled<'_>) -> Plan {
    let current = &observed.status;
    let mut next = current.clone();
    next.phase = Some(settled.phase);
    next.observed_generation = settled.observed_generation;
    next.runner_scale_set_id = settled.scale_set_id.or(current.runner_scale_set_id);
    if let Some(counts) = observed.runner_counts {
        next.current_runners = counts.current;
        next.pending_ephemeral_runners = counts.pending;
        next.running_ephemeral_runners = counts.running;
        next.failed_ephemeral_runners = counts.failed;
    }
    let message = settled.violations.map(violations_message);
    let (status, reason, message) = match &message {
        Some(message) => (false, PodTemplateReason::PolicyViolation, message.as_str()),
        None => (
            true,
            PodTemplateReason::Accepted,
            "the pod-validation policy accepts the template",
        ),
    };
    conditions::set(
        &mut next.conditions,
        conditions::Setting {
            type_: AutoscalingRunnerSetCondition::PodTemplateAccepted.as_str(),
            status,
            reason: reason.as_str(),
            message,
            observed_generation: Some(observed.generation),
        },
        observed.now,
    );
    set_shadow_template(&mut next.conditions, observed);
    // Conditions that exist only while what they report is so.
    let present = [
        (
            AutoscalingRunnerSetCondition::ScaleSetConflict,
            ScaleSetConflictReason::HeldByAnotherSet.as_str(),
            settled.conflict,
        ),
        (
            AutoscalingRunnerSetCondition::RunnersCapped,
            RunnersCappedReason::AboveHostLimit.as_str(),
            observed.capped.as_deref(),
        ),
    ];
    for (type_, reason, message) in present {
        match message {
            Some(message) => {
                conditions::set(
                    &mut next.conditions,
                    conditions::Setting {
                        type_: type_.as_str(),
                        status: true,
                        reason,
                        message,
                        observed_generation: Some(observed.generation),
                    },
                    observed.now,
                );
            }
            None => next.conditions.retain(|c| c.type_ != type_.as_str()),
        }
    }
    // A reconcile that settles is not stalled (rule 10).
    next.conditions
        .retain(|c| c.type_ != AutoscalingRunnerSetCondition::Stalled.as_str());
    let counts = |s: &AutoscalingRunnerSetStatus| {
        (
            s.current_runners,
            s.pending_ephemeral_runners,
            s.running_ephemeral_runners,
            s.failed_ephemeral_runners,
        )
    };
    let counts_moved = counts(&next) != counts(current);
    if next != *current || settled.pending_written {
        steps.push(Step::WriteStatus(StatusChange::Settled(Box::new(next))));
    }
    if counts_moved {
        steps.push(Step::NoteCountsMoved);
    }
    let moving = counts_moved
        || observed
            .counts_moved_ago
            .is_some_and(|ago| ago < COUNTS_SETTLED);
    Plan {
        steps,
        then: Then::LookAgainIn(if moving { COUNTS_RESYNC } else { RESYNC }),
    }
}

/// Rule 10: `Stalled` set from `failure` and one event, unless the status
/// already says exactly this (the same reason and message), so a failure
/// retried every few seconds is announced once.
pub fn stalled(
    status: &AutoscalingRunnerSetStatus,
    failure: &Failure,
    now: Timestamp,
) -> Vec<Step> {
    let mut conditions = status.conditions.clone();
    let changed = conditions::set(
        &mut conditions,
        conditions::Setting {
            type_: AutoscalingRunnerSetCondition::Stalled.as_str(),
            status: true,
            reason: failure.reason.as_str(),
            message: &failure.message,
            observed_generation: None,
        },
        now,
    );
    if !changed {
        return Vec::new();
    }
    vec![
        Step::WriteStatus(StatusChange::Conditions(conditions)),
        Step::Publish(Notice::warning(
            AutoscalingRunnerSetEvent::Stalled.as_str(),
            format!("{}: {}", failure.reason, failure.message),
        )),
    ]
}

/// Whether two values are the same once what Kubernetes does not preserve
/// is set aside: nulls, empty lists and empty maps.
///
/// The runner spec is written into the EphemeralRunnerSet and read back;
/// a template with an explicitly empty field (`env: []`) may read back
/// with the field absent. A strict comparison would call that drift on
/// every reconcile, bump the revision each time and have the set delete
/// every idle runner forever (seed 004). Quantities are compared as
/// written: the API server stores a custom resource's `500m` as `500m`.
pub fn semantically_equal<T: serde::Serialize>(left: &T, right: &T) -> bool {
    let normal = |value: &T| serde_json::to_value(value).ok().map(normalize);
    normal(left) == normal(right)
}

fn normalize(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(key, value)| (key, normalize(value)))
                .filter(|(_, value)| !is_empty(value))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(normalize).collect()),
        other => other,
    }
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Array(items) => items.is_empty(),
        Value::Object(map) => map.is_empty(),
        _ => false,
    }
}
