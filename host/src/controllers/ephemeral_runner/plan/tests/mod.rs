//! The plan's tests, by lifecycle stage, and the fixtures they share: a
//! runner that reads as a sentence (`Runner::new().registered(7).phase(Running)`),
//! a [`Case`] of what a reconcile observed, and ways to read the steps.

mod deletion;
mod hold;
mod lifecycle;
mod recycle;
mod renewal;
mod starts;
mod status;

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::*;
use crate::api::ephemeral_runner::{
    ConditionReason, HeldReason, OnlineReason, RegisteredReason, RunnerCondition,
    SlackNotifiedReason,
};
use crate::api::{EphemeralRunnerSpec, RunnerRenewal};

use crate::api::EphemeralRunnerPhase::*;

pub(super) fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap()
}

/// A runner fixture that reads as a sentence:
/// `Runner::new().registered(7).phase(Running)`.
#[derive(Clone)]
pub(super) struct Runner(pub(super) EphemeralRunner);

impl Runner {
    pub(super) fn new() -> Self {
        let mut r = EphemeralRunner::new(
            "r",
            EphemeralRunnerSpec {
                spec: PodSpec {
                    containers: vec![Container {
                        name: "runner".into(),
                        ..Container::default()
                    }],
                    ..PodSpec::default()
                },
                ..EphemeralRunnerSpec::default()
            },
        );
        r.metadata.namespace = Some("ns".into());
        r.metadata.finalizers = Some(vec![finalizers::EPHEMERAL_RUNNER.name.into()]);
        r.status = Some(EphemeralRunnerStatus::default());
        Self(r)
    }
    pub(super) fn status(mut self, f: impl FnOnce(&mut EphemeralRunnerStatus)) -> Self {
        f(self.0.status.get_or_insert_with(Default::default));
        self
    }
    pub(super) fn registered(self, id: i64) -> Self {
        self.status(|s| {
            s.runner_id = id;
            s.conditions.push(cond(RegisteredReason::JitConfigCreated));
        })
    }
    /// The `Registered` condition set with `reason` instead.
    pub(super) fn registration(self, reason: RegisteredReason) -> Self {
        self.status(|s| {
            s.conditions
                .retain(|c| c.type_ != RunnerCondition::Registered.as_str());
            s.conditions.push(cond(reason));
        })
    }
    pub(super) fn gone(self, reason: RegisteredReason) -> Self {
        assert!(!reason.holds(), "{reason} says the registration exists");
        self.registration(reason)
    }
    pub(super) fn phase(self, phase: EphemeralRunnerPhase) -> Self {
        self.status(|s| s.phase = Some(phase))
    }
    pub(super) fn failures(self, n: usize, last: i64) -> Self {
        self.status(|s| {
            for i in 0..n {
                s.failures
                    .insert(format!("old-{i}"), Time(at(last - i as i64)));
            }
        })
    }
    pub(super) fn with_job(self) -> Self {
        self.status(|s| {
            s.job_id = Some("job".into());
            s.job_request_id = 3;
        })
    }
    pub(super) fn no_finalizer(mut self) -> Self {
        self.0.metadata.finalizers = None;
        self
    }
    pub(super) fn deleting(mut self) -> Self {
        self.0.metadata.deletion_timestamp = Some(Time(at(0)));
        self
    }
    pub(super) fn debug(mut self, hold: &str, max_hold: &str, max_held: i32) -> Self {
        self.0.spec.debug = Some(crate::api::DebugSpec {
            hold_failed_for: Some(hold.into()),
            max_hold: Some(max_hold.into()),
            max_held: Some(max_held),
            slack: None,
        });
        self
    }
    pub(super) fn job_failed_at(self, secs: i64) -> Self {
        self.with_job().status(|s| {
            s.job_result = Some("failed".into());
            s.job_finished_at = Some(Time(at(secs)));
        })
    }
    pub(super) fn held(self, since: i64, until: i64) -> Self {
        self.phase(Debugging).status(|s| {
            s.held_since = Some(Time(at(since)));
            s.hold_until = Some(Time(at(until)));
        })
    }
    pub(super) fn registration_timeout(mut self, value: &str) -> Self {
        self.0.spec.registration_timeout = Some(value.into());
        self
    }
    pub(super) fn max_idle_age(mut self, value: &str) -> Self {
        self.0.spec.max_idle_age = Some(value.into());
        self
    }
    pub(super) fn hold_until(mut self, value: &str) -> Self {
        self.0
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(crate::api::annotations::HOLD_UNTIL.into(), value.into());
        self
    }
    /// Its jobs run in pods of the runner container hooks (a kubernetes
    /// container mode).
    pub(super) fn with_container_hooks(mut self) -> Self {
        self.0.spec.spec.containers[0].env = Some(vec![k8s_openapi::api::core::v1::EnvVar {
            name: CONTAINER_HOOKS_ENV.into(),
            value: Some("/home/runner/k8s/index.js".into()),
            ..Default::default()
        }]);
        self
    }
    pub(super) fn without_runner_container(mut self) -> Self {
        self.0.spec.spec.containers[0].name = "main".into();
        self
    }
    /// Renewed by its set `count` times: the status written anew.
    pub(super) fn renewed(self, count: u32) -> Self {
        self.status(|s| {
            *s = EphemeralRunnerStatus {
                renewal: Some(RunnerRenewal {
                    count,
                    patch_id: 4,
                    set_generation: 1,
                    renewed_at: Time(at(0)),
                    previous: None,
                }),
                ..EphemeralRunnerStatus::default()
            }
        })
    }
}

/// A condition set long ago with `reason`.
pub(super) fn cond<R: ConditionReason>(reason: R) -> Condition {
    Condition {
        type_: R::CONDITION.as_str().into(),
        status: if reason.holds() { "True" } else { "False" }.into(),
        reason: reason.name().into(),
        message: String::new(),
        last_transition_time: Time(at(-1000)),
        observed_generation: None,
    }
}

pub(super) fn pod(runner: RunnerContainer) -> PodView {
    PodView {
        uid: "pod-1".into(),
        created: at(0),
        deleting_since: None,
        ready: runner == RunnerContainer::Running,
        finished: matches!(runner, RunnerContainer::Terminated { .. }).then(|| at(5)),
        registration_clock: Some(at(0)),
        runner,
        failed: false,
        failed_init_containers: Vec::new(),
        eviction_protected: false,
        failure_message: None,
        renewal: 0,
    }
}

pub(super) fn exited(code: i32) -> PodView {
    pod(RunnerContainer::Terminated {
        exit_code: code,
        reason: if code == 0 { "Completed" } else { "Error" }.into(),
    })
}

pub(super) fn secret(id: i64) -> Option<SecretView> {
    Some(SecretView {
        runner_id: id,
        runner_name: "r".into(),
        renewal: 0,
        resource_version: "1".into(),
    })
}

/// What one reconcile observed.
#[derive(Clone)]
pub(super) struct Case {
    pub(super) runner: Runner,
    pub(super) pod: Option<PodView>,
    pub(super) secret: Option<SecretView>,
    pub(super) pool: PoolView,
    pub(super) verdict: Option<VerdictView>,
    pub(super) presence: Option<Presence>,
    pub(super) registered_by_name: Option<Option<i64>>,
    pub(super) held: Option<usize>,
    pub(super) hook_objects: Option<usize>,
    pub(super) refused_pod: Option<String>,
    pub(super) renewal: Option<Option<RenewalGrant>>,
    pub(super) admission: Option<Admission>,
    pub(super) now: i64,
}

pub(super) fn case(runner: Runner) -> Case {
    Case {
        runner,
        pod: None,
        secret: None,
        pool: PoolView::Idle,
        verdict: None,
        presence: None,
        // Asked, and the service has nothing under the name: what every
        // case but those about unrecorded registrations assumes.
        registered_by_name: Some(None),
        held: None,
        hook_objects: None,
        refused_pod: None,
        // Asked, and no job waits: what every case but those about a
        // renewal in place assumes.
        renewal: Some(None),
        // Asked, and admitted: what every case but those about admission
        // assumes.
        admission: Some(Admission::Admitted),
        now: 10,
    }
}

impl Case {
    pub(super) fn pod(mut self, pod: PodView) -> Self {
        self.pod = Some(pod);
        self
    }
    pub(super) fn secret(mut self, id: i64) -> Self {
        self.secret = secret(id);
        self
    }
    pub(super) fn pool(mut self, pool: PoolView) -> Self {
        self.pool = pool;
        self
    }
    pub(super) fn verdict(mut self, verdict: Verdict) -> Self {
        self.verdict = Some(VerdictView {
            verdict,
            fallback_reason: None,
        });
        self
    }
    pub(super) fn presence(mut self, presence: Presence) -> Self {
        self.presence = Some(presence);
        self
    }
    /// What the service has under the runner's name (`None`: not asked).
    pub(super) fn by_name(mut self, found: Option<Option<i64>>) -> Self {
        self.registered_by_name = found;
        self
    }
    pub(super) fn now(mut self, now: i64) -> Self {
        self.now = now;
        self
    }
    /// What the set says of a renewal in place (`None`: not asked).
    pub(super) fn renewal(mut self, renewal: Option<Option<RenewalGrant>>) -> Self {
        self.renewal = renewal;
        self
    }
    /// Whether the runner may have a pod made (`None`: not asked).
    pub(super) fn admission(mut self, admission: Option<Admission>) -> Self {
        self.admission = admission;
        self
    }
    pub(super) fn held(mut self, held: usize) -> Self {
        self.held = Some(held);
        self
    }
    /// How many objects of the runner container hooks are not being
    /// deleted.
    pub(super) fn hook_objects(mut self, live: usize) -> Self {
        self.hook_objects = Some(live);
        self
    }
    /// The pod and Secret there were made for renewal `renewal`.
    pub(super) fn made_for(mut self, renewal: u32) -> Self {
        if let Some(pod) = self.pod.as_mut() {
            pod.renewal = renewal;
        }
        if let Some(secret) = self.secret.as_mut() {
            secret.renewal = renewal;
        }
        self
    }
    pub(super) fn run(&self) -> Result<Plan, Need> {
        let obs = Observed {
            runner: &self.runner.0,
            pod: self.pod.clone(),
            secret: self.secret.clone(),
            pool: self.pool.clone(),
            verdict: self.verdict.clone(),
            presence: self.presence,
            registered_by_name: self.registered_by_name,
            held: self.held,
            hook_objects: self.hook_objects,
            refused_pod: self.refused_pod.clone(),
            renewal: self.renewal.clone(),
            admission: self.admission.clone(),
            now: at(self.now),
        };
        plan(&obs, &settings())
    }
    /// The plan, with the deregistration policy's verdict, if the plan
    /// asks for one the case did not give, answered as the bundled default
    /// does for these cases (a runner that exited 0 removed its
    /// registration itself; anything else is removed now).
    fn planned(&self) -> Result<Plan, Need> {
        match self.run() {
            Err(Need::Verdict(ending)) if self.verdict.is_none() => {
                let verdict = if ending.exit_code == Some(0) {
                    Verdict::SelfDeregistered
                } else {
                    Verdict::RemoveNow
                };
                self.clone().verdict(verdict).run()
            }
            planned => planned,
        }
    }
    /// The steps, described, or the first need but the verdict.
    pub(super) fn steps_or_need(&self) -> Result<Vec<String>, Need> {
        self.planned().map(|plan| describe(&plan.steps))
    }
    /// The steps (see [`Case::planned`]).
    pub(super) fn steps(&self) -> Vec<Step> {
        self.planned().expect("no more input needed").steps
    }
}

pub(super) fn settings() -> Settings {
    Settings {
        failure_limit: 5,
        backoff_base: Duration::from_secs(5),
        backoff_max: Duration::from_secs(80),
        registration_timeout: Duration::from_secs(600),
        terminating_timeout: Duration::from_secs(60),
        removal_recheck: Duration::from_secs(30),
        removal_retry: Duration::from_secs(15),
        result_wait: Duration::from_secs(15),
    }
}

/// The step kinds, without payloads, for compact expectations.
pub(super) fn kinds(steps: &[Step]) -> Vec<&'static str> {
    steps
        .iter()
        .map(|s| match s {
            Step::AddFinalizer => "add-finalizer",
            Step::RemoveFinalizer => "remove-finalizer",
            Step::PatchStatus(_) => "status",
            Step::InformStatus(_) => "inform",
            Step::Register { .. } => "register",
            Step::Renew { .. } => "renew",
            Step::CreatePod => "create-pod",
            Step::DeletePod { .. } => "delete-pod",
            Step::ForceDeletePod { .. } => "force-delete-pod",
            Step::DeleteSecret => "delete-secret",
            Step::ProtectFromEviction { .. } => "protect-from-eviction",
            Step::DeleteHookObjects => "delete-hook-objects",
            Step::Deregister { .. } => "deregister",
            Step::Event { .. } => "event",
            Step::CountDeregistration { .. } => "count",
            Step::NotifySlack(_) => "slack",
        })
        .collect()
}

/// Each step with what it carries, in a line: a status write names every
/// field it sets (the phase's message aside) and every condition by its
/// reason; an event its severity and reason; a deletion what it deletes.
pub(super) fn describe(steps: &[Step]) -> Vec<String> {
    steps.iter().map(describe_step).collect()
}

fn describe_step(step: &Step) -> String {
    match step {
        Step::PatchStatus(change) | Step::InformStatus(change) => {
            let s = &change.status;
            let kind = if matches!(step, Step::PatchStatus(_)) {
                "status"
            } else {
                "inform"
            };
            let mut out = vec![kind.to_owned()];
            let mut field = |name: &str, value: Option<String>| {
                if let Some(value) = value {
                    out.push(format!("{name}={value}"));
                }
            };
            field("phase", s.phase.map(|p| p.as_str().to_owned()));
            field(
                "reason",
                s.reason.map(|r| r.map_or("null".into(), |r| r.to_string())),
            );
            field("ready", s.ready.map(|r| r.to_string()));
            field("exit", s.exit_code.map(|c| c.to_string()));
            field("runnerId", s.runner_id.map(|id| id.to_string()));
            field("failures", s.failures.as_ref().map(|f| f.len().to_string()));
            field("heldSince", s.held_since.as_ref().map(|t| t.0.to_string()));
            field("holdUntil", s.hold_until.as_ref().map(|t| t.0.to_string()));
            field("holdCause", s.hold_cause.map(|c| format!("{c:?}")));
            for c in s.conditions.iter().flatten() {
                out.push(format!("{}={}", c.type_, c.reason));
            }
            if s.cleared_job.is_some() {
                out.push("job-record-cleared".into());
            }
            out.join(" ")
        }
        Step::Register { replacing, record } => format!(
            "register{}{}",
            replacing
                .as_ref()
                .map(|v| format!(" over secret@{v}"))
                .unwrap_or_default(),
            if record.is_some() { " recorded" } else { "" },
        ),
        Step::Renew {
            replacing,
            renewal,
            registered,
            ..
        } => {
            let previous = renewal.previous.as_ref();
            format!(
                "renew {} previous={}/{}{}{}",
                renewal.count,
                previous.map_or(0, |p| p.runner_id),
                previous
                    .and_then(|p| p.exit_code)
                    .map_or("-".into(), |c| c.to_string()),
                replacing
                    .as_ref()
                    .map(|v| format!(" over secret@{v}"))
                    .unwrap_or_default(),
                registered
                    .as_ref()
                    .map(|(id, _)| format!(" with {id}"))
                    .unwrap_or_default(),
            )
        }
        Step::DeletePod { uid } => format!("delete-pod {uid}"),
        Step::ForceDeletePod { uid } => format!("force-delete-pod {uid}"),
        Step::Deregister { runner_id } => format!("deregister {runner_id}"),
        Step::Event {
            severity, reason, ..
        } => format!("event {severity:?} {reason}"),
        Step::CountDeregistration { verdict, outcome } => format!("count {verdict} {outcome}"),
        Step::NotifySlack(failure) => format!("slack {}", failure.why),
        other => kinds(std::slice::from_ref(other))[0].to_owned(),
    }
}

/// What a pass that hands registration 7 to the pool does: the removal
/// recorded as asked for, then asked for, then told.
pub(super) const HANDED_TO_THE_POOL: [&str; 3] = [
    "status Registered=RemoveNow",
    "deregister 7",
    "event Normal Deregistering",
];

/// What a pass that hears the pool removed registration 7 does: records
/// it, tells it, counts it, and only then deletes the pod and Secret.
pub(super) const REMOVED_THEN_CLEANED_UP: [&str; 5] = [
    "status Registered=Removed",
    "event Normal RegistrationRemoved",
    "count remove-now removed",
    "delete-pod pod-1",
    "delete-secret",
];

/// The status fields the steps write (none: the default).
pub(super) fn status_of(steps: &[Step]) -> StatusFields {
    steps
        .iter()
        .find_map(|s| match s {
            Step::PatchStatus(change) | Step::InformStatus(change) => Some(change.status.clone()),
            _ => None,
        })
        .unwrap_or_default()
}

/// The `Registered` condition the steps write: whether True, and why.
pub(super) fn registered_condition(steps: &[Step]) -> Option<(bool, RegisteredReason)> {
    condition_of::<RegisteredReason>(steps)
}

/// Condition `R::CONDITION` as the steps write it.
pub(super) fn condition_of<R: ConditionReason>(steps: &[Step]) -> Option<(bool, R)> {
    let conditions = status_of(steps).conditions?;
    let c = conditions
        .iter()
        .find(|c| c.type_ == R::CONDITION.as_str())?;
    Some((c.status == "True", R::from_name(&c.reason)?))
}

pub(super) fn event_reasons(steps: &[Step]) -> Vec<EventReason> {
    steps
        .iter()
        .filter_map(|s| match s {
            Step::Event { reason, .. } => Some(*reason),
            _ => None,
        })
        .collect()
}

/// The phase's message the steps write.
pub(super) fn message_of(steps: &[Step]) -> Option<String> {
    status_of(steps).message.flatten()
}

/// A runner of a scale set that holds failures 10 minutes, up to an
/// hour, one at a time.
pub(super) fn holding() -> Runner {
    Runner::new()
        .registered(7)
        .phase(Running)
        .debug("10m", "1h", 1)
}
