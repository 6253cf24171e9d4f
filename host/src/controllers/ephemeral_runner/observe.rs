//! Reading what a reconcile decides on, and asking the costly questions the
//! plan asks for.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::ListParams;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};

use super::plan::{
    self, Admission, Need, Observed, PodView, PoolView, Presence, RUNNER_CONTAINER, Refusal,
    RunnerContainer, VerdictView,
};
use super::resources::{read_jit_secret, read_jit_secret_meta};
use super::{Context, EphemeralRunnerError, github_target, kube_error};
use crate::actions::ActionsError;
use crate::api::{EphemeralRunner, EphemeralRunnerPhase, EphemeralRunnerSet, annotations, labels};
use crate::backlog::{Peer, SetKey};
use crate::controllers::kit::expectations::{Known, Look};
use crate::policy::gate::{TemplateVerdict, violations_message};
use crate::unregistration::Removal;
use std::time::Duration;

/// Whether `object` is owned by `runner` (a same-named object someone else
/// made is not the runner's to use or delete).
fn owned_by<K: Resource>(object: &K, runner: &EphemeralRunner) -> bool {
    let uid = runner.meta().uid.as_deref();
    object
        .owner_references()
        .iter()
        .any(|o| Some(o.uid.as_str()) == uid)
}

/// The pod as the plan sees it; also the projection the pod watch filters
/// on, so the watch drops exactly the updates the plan cannot see.
pub(super) fn pod_view(pod: &Pod) -> PodView {
    let status = pod.status.clone().unwrap_or_default();
    let runner_state = status
        .container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == RUNNER_CONTAINER)
        .and_then(|c| c.state.as_ref());
    let finished = runner_state
        .and_then(|s| s.terminated.as_ref())
        .and_then(|t| t.finished_at.as_ref())
        .map(|t| t.0);
    let runner = runner_state.map_or(RunnerContainer::Waiting, |state| {
        if let Some(t) = &state.terminated {
            RunnerContainer::Terminated {
                exit_code: t.exit_code,
                reason: t.reason.clone().unwrap_or_default(),
            }
        } else if state.running.is_some() {
            RunnerContainer::Running
        } else {
            RunnerContainer::Waiting
        }
    });
    let runner_started = runner_state
        .and_then(|s| {
            s.running
                .as_ref()
                .and_then(|r| r.started_at.as_ref())
                .or_else(|| s.terminated.as_ref().and_then(|t| t.started_at.as_ref()))
        })
        .map(|t| t.0);
    let initialized = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Initialized" && c.status == "True")
        .map(|c| c.last_transition_time.as_ref().map(|t| t.0));
    let failed_init_containers = status
        .init_container_statuses
        .iter()
        .flatten()
        .filter(|c| {
            c.state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .is_some_and(|t| t.exit_code != 0)
        })
        .map(|c| c.name.clone())
        .collect();
    let eviction_protected = pod
        .annotations()
        .get(annotations::SAFE_TO_EVICT)
        .is_some_and(|v| v == "false");
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    let failed = status.phase.as_deref() == Some("Failed");
    let failure_message = failed.then(|| {
        format!(
            "{}: {}",
            status.reason.clone().unwrap_or_else(|| "Failed".into()),
            status.message.clone().unwrap_or_default()
        )
    });
    let created = pod
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or_else(Timestamp::now, |t| t.0);
    PodView {
        uid: pod.uid().unwrap_or_default(),
        created,
        deleting_since: pod.metadata.deletion_timestamp.as_ref().map(|t| t.0),
        runner,
        // A kubelet always stamps the condition; one that did not is taken
        // to have initialised the pod when it was created.
        registration_clock: runner_started.or_else(|| initialized.map(|t| t.unwrap_or(created))),
        failed,
        failed_init_containers,
        eviction_protected,
        ready,
        finished,
        failure_message,
        renewal: super::resources::renewal_of(&pod.metadata),
    }
}

/// What a pass decides on, nothing asked of the policy, the service or
/// the API server yet.
fn observed<'a>(
    runner: &'a EphemeralRunner,
    pod: Option<PodView>,
    secret: Option<plan::SecretView>,
    pool: PoolView,
    now: Timestamp,
) -> Observed<'a> {
    Observed {
        runner,
        pod,
        secret,
        pool,
        verdict: None,
        presence: None,
        registered_by_name: None,
        held: None,
        hook_objects: None,
        refused_pod: None,
        renewal: None,
        admission: None,
        now,
    }
}

/// A plan, what it was decided on, and when it holds a runner for
/// debugging, the gate that keeps another runner from counting the held
/// runners until this one's status is written (so two failures at once
/// cannot both take the last place under `maxHeld`). Drop it after
/// applying the plan.
pub(super) struct Planned<'a> {
    pub(super) plan: plan::Plan,
    observed: Observed<'a>,
    _hold_gate: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl<'a> Planned<'a> {
    /// Nothing done while the caches catch up with this controller's own
    /// writes; looked at again after `rest` unless the watch wakes the
    /// runner first.
    fn waiting(runner: &'a EphemeralRunner, rest: Duration) -> Self {
        Planned {
            plan: plan::Plan {
                steps: Vec::new(),
                requeue: Some(rest),
            },
            observed: observed(runner, None, None, PoolView::Idle, Timestamp::now()),
            _hold_gate: None,
        }
    }

    /// The plan made again, on the same reading, with the API server's
    /// refusal of the runner pod the plan asked for recorded.
    pub(super) fn with_refused_pod(
        &self,
        refusal: String,
        settings: &plan::Settings,
    ) -> plan::Plan {
        let observed = Observed {
            refused_pod: Some(refusal),
            ..self.observed.clone()
        };
        // A refusal is decided before anything the plan could ask for.
        plan::plan(&observed, settings).unwrap_or_default()
    }
}

/// How many runners of `runner`'s scale set, other than it, are held.
async fn held_count(
    runner: &EphemeralRunner,
    ctx: &Context,
) -> Result<usize, EphemeralRunnerError> {
    let namespace = runner.namespace().unwrap_or_default();
    let api: Api<EphemeralRunner> = Api::namespaced(ctx.deps.client.clone(), &namespace);
    let selector = match runner.labels().get(labels::SCALE_SET_NAME) {
        Some(scale_set) => format!("{}={scale_set}", labels::SCALE_SET_NAME),
        None => format!("!{}", labels::SCALE_SET_NAME),
    };
    let listed = api
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(kube_error("list the scale set's runners"))?;
    Ok(listed
        .items
        .iter()
        .filter(|r| r.uid() != runner.uid())
        .filter(|r| {
            r.status.as_ref().and_then(|s| s.phase) == Some(EphemeralRunnerPhase::Debugging)
        })
        .count())
}

/// What the unregistration pool says about the runner's current
/// registration. With `take`, a finished removal's outcome is taken (read
/// once); without, an outcome waiting is `None`: the caller is to look
/// again with `take`.
fn pool_view(
    runner: &EphemeralRunner,
    secret: Option<&plan::SecretView>,
    ctx: &Context,
    take: bool,
) -> Option<PoolView> {
    let none = crate::api::EphemeralRunnerStatus::default();
    let runner_id = plan::registration_id(runner.status.as_ref().unwrap_or(&none), secret);
    if runner_id == 0 {
        return Some(PoolView::Idle);
    }
    let key = ctx.key(runner, runner_id);
    if ctx.pool.is_claimed(&key) {
        return Some(PoolView::Claimed);
    }
    if !take {
        return (!ctx.pool.has_finished(&key)).then_some(PoolView::Idle);
    }
    Some(match ctx.pool.take_finished(&key) {
        None => PoolView::Idle,
        Some(Removal::Removed) => PoolView::Removed,
        Some(Removal::NotFound) => PoolView::NotFound,
        // The pool hands JobStillRunning back to itself; seen here only if
        // that changes, and then it means "not yet".
        Some(Removal::JobStillRunning) => PoolView::Claimed,
        Some(Removal::Failed(message)) => PoolView::Failed(message),
    })
}

/// How long a reconcile waits for the watch caches to show an answer of
/// the API server to this controller's own write before it reads the API
/// server instead. The watch delivers in milliseconds, and its delivery
/// wakes the runner; a cache later than this is one whose watch is broken
/// or re-listing, and a read is cheaper than a runner left waiting.
const CACHE_WAIT: Duration = Duration::from_secs(2);

/// How the watch caches stand for a runner's pod and Secret.
enum CacheLook {
    /// Both show at least what the API server last told this controller
    /// of them ([`Expectations`](crate::controllers::kit::expectations)):
    /// as good as a read for every decision, steps included.
    Current(Box<(Option<PodView>, Option<plan::SecretView>)>),
    /// One is behind an answer to the controller's own write, for at most
    /// this much longer: deciding on it could register the runner twice
    /// (its Secret missing right after it was written), and the watch
    /// delivering the write wakes the runner.
    Behind(Duration),
    /// Nothing is known of one (a host that just started, a shard just
    /// taken), or it has been behind for longer than [`CACHE_WAIT`].
    Unknown,
}

fn look_in_cache(runner: &EphemeralRunner, ctx: &Context) -> CacheLook {
    let namespace = runner.namespace().unwrap_or_default();
    let name = runner.name_any();
    let pod = ctx.pods.get(&ObjectRef::new(&name).within(&namespace));
    let secret = ctx.secrets.get(&ObjectRef::new(&name).within(&namespace));
    let looks = [
        ctx.known_pods
            .look(&namespace, &name, pod.as_deref().map(|p| &p.metadata)),
        ctx.known_secrets
            .look(&namespace, &name, secret.as_deref().map(|s| &s.metadata)),
    ];
    let mut behind = None;
    for look in looks {
        match look {
            Look::Current => {}
            Look::Unknown => return CacheLook::Unknown,
            Look::Behind(age) => match CACHE_WAIT.checked_sub(age) {
                Some(rest) => behind = Some(behind.map_or(rest, |b: Duration| b.max(rest))),
                None => return CacheLook::Unknown,
            },
        }
    }
    if let Some(rest) = behind {
        return CacheLook::Behind(rest);
    }
    let pod = pod.filter(|p| owned_by(p.as_ref(), runner));
    let secret = match secret.filter(|s| owned_by(s.as_ref(), runner)) {
        Some(s) => match read_jit_secret_meta(&s.metadata) {
            Some(view) => Some(view),
            // Its registration not in its annotations (written by an earlier
            // version): read whole from the API server.
            None => return CacheLook::Unknown,
        },
        None => None,
    };
    CacheLook::Current(Box::new((pod.as_deref().map(pod_view), secret)))
}

/// The plan as the watch caches see the runner's pod and Secret, if it is
/// to do nothing at all, for a runner whose caches are not known to be
/// current ([`look_in_cache`]).
///
/// Most reconciles of a runner change nothing: they are woken by the
/// runner's own status writes, by the listener recording a job, by pod
/// updates that leave the plan where it was. Deciding those from the
/// caches saves two reads from the API server each. Anything else (a step
/// to take, a question to ask, an outcome of the pool to take) is decided
/// again from the API server by the caller. A stale cache can only make
/// this say "nothing to do" early; the cache catching up is itself a watch
/// event that wakes the runner again.
fn settled_in_cache<'a>(runner: &'a EphemeralRunner, ctx: &Context) -> Option<Planned<'a>> {
    let namespace = runner.namespace().unwrap_or_default();
    let name = runner.name_any();
    let pod = ctx
        .pods
        .get(&ObjectRef::new(&name).within(&namespace))
        .filter(|p| owned_by(p.as_ref(), runner));
    let secret = ctx
        .secrets
        .get(&ObjectRef::new(&name).within(&namespace))
        .filter(|s| owned_by(s.as_ref(), runner))
        .and_then(|s| read_jit_secret_meta(&s.metadata));
    // An outcome of the pool is taken only by a pass that acts on it.
    let pool = pool_view(runner, secret.as_ref(), ctx, false)?;
    let observed = observed(
        runner,
        pod.as_deref().map(pod_view),
        secret,
        pool,
        Timestamp::now(),
    );
    let plan = plan::plan(&observed, &ctx.config.settings)
        .ok()
        .filter(|plan| plan.steps.is_empty())?;
    Some(Planned {
        plan,
        observed,
        _hold_gate: None,
    })
}

/// Reads the object named after `runner` from the API server, and records
/// what the answer said of it in `known`.
async fn read_and_record<K>(
    ctx: &Context,
    known: &crate::controllers::kit::expectations::Expectations,
    runner: &EphemeralRunner,
    action: &'static str,
) -> Result<Option<K>, EphemeralRunnerError>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let namespace = runner.namespace().unwrap_or_default();
    let name = runner.name_any();
    let api: Api<K> = Api::namespaced(ctx.deps.client.clone(), &namespace);
    let found = api.get_opt(&name).await.map_err(kube_error(action))?;
    known.record(
        &namespace,
        &name,
        Known::read(found.as_ref().map(|o| o.meta())),
    );
    Ok(found)
}

/// Reads the runner's pod and Secret from the API server, and records what
/// it said of them, so the next pass can trust the caches once they show
/// as much.
async fn read_from_server(
    runner: &EphemeralRunner,
    ctx: &Context,
) -> Result<(Option<PodView>, Option<plan::SecretView>), EphemeralRunnerError> {
    let pod: Option<Pod> =
        read_and_record(ctx, &ctx.known_pods, runner, "read the runner pod").await?;
    let secret: Option<Secret> = read_and_record(
        ctx,
        &ctx.known_secrets,
        runner,
        "read the JIT config Secret",
    )
    .await?;
    let pod = pod.filter(|p| owned_by(p, runner));
    let secret = secret.filter(|s| owned_by(s, runner));
    // A Secret without a complete config is as good as none: it is
    // replaced when the runner registers.
    Ok((
        pod.as_ref().map(pod_view),
        secret.as_ref().and_then(read_jit_secret),
    ))
}

/// What this controller plans for `runner` as given (a copy that may be
/// far older than the cluster) with its `pod` and `secret` as they are
/// now, as a host that just started would: the unregistration pool idle,
/// the service's answer by name given in `registered_by_name`. Nothing in
/// the controller calls it: it is the seam the stale-view check
/// (`tests/stack/tests/stale_views.rs`, after Sieve, OSDI'22) replays every
/// recorded version of every runner through, to show that no earlier view
/// leads to a harmful step.
pub fn replay(
    runner: &EphemeralRunner,
    pod: Option<&Pod>,
    secret: Option<&Secret>,
    registered_by_name: Option<Option<i64>>,
    settings: &plan::Settings,
    now: Timestamp,
) -> Result<plan::Plan, Need> {
    let observed = Observed {
        registered_by_name,
        // The runners replayed are their sets': what a stale view would
        // make of them is the question, not whether they may have a pod.
        admission: Some(Admission::Admitted),
        ..observed(
            runner,
            pod.filter(|p| owned_by(*p, runner)).map(pod_view),
            secret
                .filter(|s| owned_by(*s, runner))
                .and_then(read_jit_secret),
            PoolView::Idle,
            now,
        )
    };
    plan::plan(&observed, settings)
}

/// The selector of the pods and Secrets the runner container hooks made for
/// the runner's jobs.
pub(super) fn hook_selector(runner: &EphemeralRunner) -> ListParams {
    ListParams::default().labels(&format!(
        "{}={}",
        labels::arc::HOOK_RUNNER_POD,
        runner.name_any()
    ))
}

/// How many pods and Secrets the hooks made for the runner are not being
/// deleted yet (metadata only: their specs and data are not the
/// controller's business).
async fn hook_objects(
    runner: &EphemeralRunner,
    ctx: &Context,
) -> Result<usize, EphemeralRunnerError> {
    let namespace = runner.namespace().unwrap_or_default();
    let selector = hook_selector(runner);
    let pods: Api<Pod> = Api::namespaced(ctx.deps.client.clone(), &namespace);
    let secrets: Api<Secret> = Api::namespaced(ctx.deps.client.clone(), &namespace);
    let live = |meta: &kube::api::ObjectMeta| meta.deletion_timestamp.is_none();
    let pods = pods
        .list_metadata(&selector)
        .await
        .map_err(kube_error("list the container hooks' pods"))?;
    let secrets = secrets
        .list_metadata(&selector)
        .await
        .map_err(kube_error("list the container hooks' Secrets"))?;
    Ok(pods.items.iter().filter(|p| live(&p.metadata)).count()
        + secrets.items.iter().filter(|s| live(&s.metadata)).count())
}

/// Asks the runner's set whether the runner, which just finished its job,
/// is renewed in place for a job waiting ([`crate::backlog`]), counting the
/// set's other runners as the controller's watch shows them.
fn renewal_grant(runner: &EphemeralRunner, ctx: &Context) -> Option<plan::RenewalGrant> {
    let namespace = runner.namespace()?;
    let set = runner.labels().get(labels::EPHEMERAL_RUNNER_SET)?;
    let of_set = |r: &EphemeralRunner| {
        r.metadata.namespace.as_deref() == Some(namespace.as_str())
            && r.labels().get(labels::EPHEMERAL_RUNNER_SET) == Some(set)
    };
    let peers: Vec<Peer> = ctx
        .runners
        .state()
        .iter()
        .filter(|r| of_set(r))
        .map(|r| {
            let status = r.status.as_ref();
            Peer {
                name: r.name_any(),
                live: r.metadata.deletion_timestamp.is_none()
                    && matches!(
                        status.and_then(|s| s.phase).unwrap_or_default(),
                        EphemeralRunnerPhase::Pending | EphemeralRunnerPhase::Running
                    ),
            }
        })
        .collect();
    let key = SetKey::new(&namespace, set);
    let name = runner.name_any();
    let backlogs = &ctx.deps.backlogs;
    let granted = backlogs
        .claim(&key, &name, &peers, |terms| terms.admit(runner))
        .map(|terms| plan::RenewalGrant {
            set_generation: terms.generation,
            job_id: runner
                .status
                .as_ref()
                .and_then(|s| backlogs.job_on(&key, &name, s.runner_id))
                .map(|job| job.job_id),
        });
    tracing::debug!(runner = %runner.name_any(), renewed = granted.is_some(), "asked the set for a renewal in place");
    granted
}

/// Whether `runner` may have a pod made ([`Admission`]).
///
/// Before its first registration its set's ownership is proven: the
/// controlling owner its references name is an EphemeralRunnerSet the
/// API server holds under that uid, and the runner carries that set's
/// label, so the set counts it against its `maxRunners` (and deletes it
/// past them). That is one read of the set's metadata per runner object,
/// none per renewal, and none of the runner's own objects.
///
/// Before every pod its template is judged by the pod-validation policy
/// its spec names, as the AutoscalingRunnerSet controller judged its set's
/// (about 15 µs once loaded; loads are kept per namespace and reference).
/// A runner its set built passes as its set's template did; one written
/// or edited past the set is held to the same policy.
async fn admission(
    runner: &EphemeralRunner,
    first: bool,
    ctx: &Context,
) -> Result<Admission, EphemeralRunnerError> {
    let namespace = runner.namespace().unwrap_or_default();
    if first && let Some(message) = not_owned(runner, &namespace, ctx).await? {
        return Ok(Admission::Refused {
            refusal: Refusal::NotOwned,
            message,
        });
    }
    let gate = match ctx
        .pod_gate(
            &namespace,
            runner.spec.policies.pod_validation_policy.as_ref(),
        )
        .await
    {
        Ok(gate) => gate,
        Err(error) => return Ok(Admission::Waiting(format!("pod validation: {error}"))),
    };
    let template = serde_json::json!({
        "metadata": runner.spec.metadata,
        "spec": runner.spec.spec,
    });
    Ok(match gate.judge(template).await {
        Ok(TemplateVerdict::Accepted) => Admission::Admitted,
        Ok(TemplateVerdict::Rejected(violations)) => Admission::Refused {
            refusal: Refusal::PodRefused,
            message: format!(
                "the pod-validation policy {} refused the runner's pod: {}",
                gate.label(),
                violations_message(&violations)
            ),
        },
        Err(error) => Admission::Waiting(error.to_string()),
    })
}

/// Why `runner` is not its set's, if it is not (see [`admission`]).
async fn not_owned(
    runner: &EphemeralRunner,
    namespace: &str,
    ctx: &Context,
) -> Result<Option<String>, EphemeralRunnerError> {
    let set_kind = EphemeralRunnerSet::kind(&());
    let Some(owner) = runner
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == set_kind)
    else {
        return Ok(Some(format!(
            "no {set_kind} controls the runner: only a runner its set created is \
             registered, so that the set counts it against its maxRunners"
        )));
    };
    if runner.labels().get(labels::EPHEMERAL_RUNNER_SET) != Some(&owner.name) {
        return Ok(Some(format!(
            "the runner's label {} does not name its owner {set_kind} {:?}, so the set \
             would not count it",
            labels::EPHEMERAL_RUNNER_SET,
            owner.name
        )));
    }
    // Made by this process's set controller: the create's answer proved
    // it already.
    if let Some(uid) = runner.uid()
        && ctx.deps.made_runners.take(&uid, &owner.uid)
    {
        return Ok(None);
    }
    let sets: Api<EphemeralRunnerSet> = Api::namespaced(ctx.deps.client.clone(), namespace);
    let set = sets
        .get_metadata_opt(&owner.name)
        .await
        .map_err(kube_error("read the runner's EphemeralRunnerSet"))?;
    Ok(match set {
        Some(set) if set.metadata.uid.as_deref() == Some(owner.uid.as_str()) => None,
        Some(_) => Some(format!(
            "the {set_kind} {:?} the runner names as its owner is another object (its uid \
             differs)",
            owner.name
        )),
        None => Some(format!(
            "the {set_kind} {:?} the runner names as its owner does not exist",
            owner.name
        )),
    })
}

/// Reads the runner's pod and Secret, asks the pool about its registration,
/// and runs the plan, answering what it needs until it decides.
pub(super) async fn observe_and_plan<'a>(
    runner: &'a EphemeralRunner,
    ctx: &Context,
) -> Result<Planned<'a>, EphemeralRunnerError> {
    let (pod, secret) = match look_in_cache(runner, ctx) {
        CacheLook::Current(cached) => *cached,
        CacheLook::Behind(rest) => return Ok(Planned::waiting(runner, rest)),
        CacheLook::Unknown => {
            if let Some(planned) = settled_in_cache(runner, ctx) {
                return Ok(planned);
            }
            read_from_server(runner, ctx).await?
        }
    };
    let namespace = runner.namespace().unwrap_or_default();
    let pool = pool_view(runner, secret.as_ref(), ctx, true).unwrap_or(PoolView::Idle);
    let mut observed = observed(runner, pod, secret, pool, Timestamp::now());
    let mut hold_gate = None;
    // Each need is answered once, so this ends after at most six rounds.
    for _ in 0..6 {
        match plan::plan(&observed, &ctx.config.settings) {
            Ok(plan) => {
                return Ok(Planned {
                    plan,
                    observed,
                    _hold_gate: hold_gate,
                });
            }
            Err(Need::HeldCount) => {
                hold_gate = Some(ctx.hold_gate.clone().lock_owned().await);
                observed.held = Some(held_count(runner, ctx).await?);
            }
            Err(Need::Verdict(ending)) => {
                let loaded = ctx
                    .deregistration_policy(
                        &namespace,
                        runner.spec.policies.deregistration_policy.as_ref(),
                    )
                    .await?;
                let shadow = runner.spec.policies.shadow_deregistration_policy.as_ref();
                let shadow_ending = shadow.map(|_| ending.clone());
                let decided = loaded.decider().deregistration(ending).await?;
                if let (Some(reference), Some(ending)) = (shadow, shadow_ending) {
                    shadow_verdict(ctx, &namespace, reference, ending, decided.decision.verdict)
                        .await;
                }
                observed.verdict = Some(VerdictView {
                    verdict: decided.decision.verdict,
                    fallback_reason: decided.fallback_reason,
                });
            }
            Err(Need::RegistrationByName) => {
                let client = ctx.deps.clients.get(&github_target(runner)).await?;
                let found = client.get_runner_by_name(&runner.name_any()).await?;
                if let Some(found) = &found {
                    tracing::warn!(
                        runner = %runner.name_any(),
                        id = found.id,
                        "found a registration the runner never recorded; removing it"
                    );
                }
                observed.registered_by_name = Some(found.map(|f| f.id));
            }
            Err(Need::HookObjects) => {
                observed.hook_objects = Some(hook_objects(runner, ctx).await?);
            }
            Err(Need::Renewal) => observed.renewal = Some(renewal_grant(runner, ctx)),
            Err(Need::Admission { first }) => {
                observed.admission = Some(admission(runner, first, ctx).await?);
            }
            Err(Need::Presence(runner_id)) => {
                let client = ctx.deps.clients.get(&github_target(runner)).await?;
                observed.presence = Some(match client.get_runner(runner_id).await {
                    Ok(found) if found.status.eq_ignore_ascii_case("online") || found.busy => {
                        Presence::Online
                    }
                    Ok(_) => Presence::Offline,
                    Err(ActionsError::RunnerNotFound { .. }) => Presence::Absent,
                    Err(error) => return Err(error.into()),
                });
            }
        }
    }
    // Unreachable with a well-formed plan; answered as "look again".
    Ok(Planned {
        plan: plan::Plan {
            steps: Vec::new(),
            requeue: Some(ctx.config.error_retry),
        },
        observed,
        _hold_gate: None,
    })
}

/// Asks the shadow deregistration policy what it would say of `ending`,
/// beside the active policy's `active` verdict, and counts the pair. Never
/// acted on, and nothing about it fails the reconcile: a shadow that cannot
/// load or answer is counted as `failed`.
async fn shadow_verdict(
    ctx: &Context,
    namespace: &str,
    reference: &crate::policy::loader::PolicyRef,
    ending: crate::policy::types::RunnerEnding,
    active: crate::policy::types::Verdict,
) {
    let answer = match ctx.deregistration_policy(namespace, Some(reference)).await {
        Ok(loaded) => loaded
            .decider()
            .clone()
            .alone()
            .deregistration(ending)
            .await
            .map(|decided| decided.decision.verdict),
        Err(error) => Err(error),
    };
    let name = |verdict: crate::policy::types::Verdict| {
        serde_json::to_value(verdict)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default()
    };
    let (shadow, agreement) = match answer {
        Ok(verdict) if verdict == active => (name(verdict), "same"),
        Ok(verdict) => (name(verdict), "different"),
        Err(error) => {
            tracing::debug!(%namespace, "the shadow deregistration policy gave no verdict: {error}");
            ("failed".to_owned(), "different")
        }
    };
    ctx.deps
        .metrics
        .shadow_verdicts
        .get_or_create(&crate::controllers::metrics::ShadowVerdictLabels {
            namespace: namespace.to_owned(),
            active: name(active),
            shadow,
            agreement,
        })
        .inc();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ephemeral_runner::{RegisteredReason, RunnerCondition};
    use crate::api::{EphemeralRunnerPhase, EphemeralRunnerSpec, EphemeralRunnerStatus};
    use crate::controllers::ephemeral_runner::plan::{SecretView, Settings, Step};
    use crate::controllers::ephemeral_runner_set::plan::{self as set_plan, RunnerView, SetView};
    use k8s_openapi::api::core::v1::{Container, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    /// A runner pod whose init container (the slow setup: warming caches,
    /// booting a VM) still runs, as the kubelet reports it.
    fn initialising_pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "r", "uid": "pod-1", "creationTimestamp": "2026-12-01T08:00:00Z"},
            "spec": {
                "initContainers": [{"name": "setup", "image": "setup"}],
                "containers": [{"name": "runner", "image": "runner"}],
            },
            "status": {
                "phase": "Pending",
                "conditions": [
                    {"type": "Initialized", "status": "False", "reason": "ContainersNotInitialized"},
                    {"type": "Ready", "status": "False", "reason": "ContainersNotReady"},
                ],
                "initContainerStatuses": [{
                    "name": "setup", "image": "setup", "imageID": "", "ready": false, "restartCount": 0,
                    "state": {"running": {"startedAt": "2026-12-01T08:00:01Z"}},
                }],
                "containerStatuses": [{
                    "name": "runner", "image": "runner", "imageID": "", "ready": false, "restartCount": 0,
                    "state": {"waiting": {"reason": "PodInitializing"}},
                }],
            },
        }))
        .unwrap()
    }

    #[test]
    fn a_runner_still_initialising_is_pending_and_never_idle() {
        let view = pod_view(&initialising_pod());
        assert_eq!(view.runner, RunnerContainer::Waiting);
        assert!(!view.ready && view.failed_init_containers.is_empty() && !view.failed);

        // Registered before its pod was made, five minutes into its setup
        // (within the registration timeout, which counts the setup too),
        // with a maxIdleAge of one minute.
        let mut runner = EphemeralRunner::new(
            "r",
            EphemeralRunnerSpec {
                max_idle_age: Some("1m".into()),
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
        runner.metadata.finalizers =
            Some(vec![crate::api::finalizers::EPHEMERAL_RUNNER.name.into()]);
        runner.status = Some(EphemeralRunnerStatus {
            runner_id: 7,
            conditions: vec![Condition {
                type_: RunnerCondition::Registered.as_str().into(),
                status: "True".into(),
                reason: RegisteredReason::JitConfigCreated.as_str().into(),
                message: String::new(),
                last_transition_time: Time(view.created),
                observed_generation: None,
            }],
            ..EphemeralRunnerStatus::default()
        });
        let observed = observed(
            &runner,
            Some(view.clone()),
            Some(SecretView {
                runner_id: 7,
                runner_name: "r".into(),
                renewal: 0,
                resource_version: "1".into(),
            }),
            PoolView::Idle,
            view.created + jiff::SignedDuration::from_mins(5),
        );
        let plan = plan::plan(&observed, &Settings::default()).unwrap();
        // Pending (no phase yet reads as Pending, so nothing is written)
        // and not ready: not renewed as an old idle runner, not
        // deregistered, its pod left to finish its setup.
        assert_eq!(plan.steps, [], "{:?}", plan.steps);
        // Had its status said Running, it would be put back to Pending.
        let mut said_running = runner.clone();
        if let Some(status) = said_running.status.as_mut() {
            status.phase = Some(EphemeralRunnerPhase::Running);
        }
        let plan = plan::plan(
            &Observed {
                runner: &said_running,
                ..observed.clone()
            },
            &Settings::default(),
        )
        .unwrap();
        let [Step::InformStatus(change)] = plan.steps.as_slice() else {
            panic!("{:?}", plan.steps)
        };
        assert_eq!(change.status.phase, Some(EphemeralRunnerPhase::Pending));
        assert_eq!(change.status.ready, None, "stays false");

        // The set counts it as pending, not running: the scaling input and
        // the status see a warm pool still filling, not idle capacity.
        let set = SetView {
            generation: 1,
            has_finalizer: true,
            replicas: 1,
            ..SetView::default()
        };
        let runners = [RunnerView {
            name: "r".into(),
            phase: None,
            runner_id: 7,
            ..RunnerView::default()
        }];
        let status = set_plan::plan(&set, &runners).status.unwrap();
        assert_eq!(
            (
                status.pending_ephemeral_runners,
                status.running_ephemeral_runners
            ),
            (1, 0)
        );
    }
}

/// The pod watch's projection is the plan's own view of the pod.
#[cfg(test)]
mod pod_watch_tests {
    use kube::runtime::watcher::Event;
    use serde_json::json;

    use super::*;
    use crate::controllers::kit::projection::ProjectionFilter;

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "r", "namespace": "ns", "uid": "u1",
                         "creationTimestamp": "2026-12-01T08:00:00Z", "resourceVersion": "1"},
            "spec": {"containers": [{"name": "runner", "image": "runner"}]},
            "status": {"phase": "Pending"},
        }))
        .unwrap()
    }

    fn with_status(status: impl serde::Serialize) -> Pod {
        let mut pod = pod();
        pod.status = Some(serde_json::from_value(serde_json::to_value(status).unwrap()).unwrap());
        pod
    }

    #[test]
    fn the_pod_watch_passes_exactly_what_the_plan_reads() {
        type Case = (&'static str, fn() -> Pod, bool);
        let cases: [Case; 8] = [
            (
                "a new resource version",
                || {
                    let mut p = pod();
                    p.metadata.resource_version = Some("2".into());
                    p
                },
                false,
            ),
            (
                "bound to a node",
                || {
                    let mut p = pod();
                    p.spec.as_mut().unwrap().node_name = Some("node".into());
                    p
                },
                false,
            ),
            (
                "an IP and a start time",
                || {
                    with_status(json!({"phase": "Pending", "podIP": "10.0.0.1",
                                      "startTime": "2026-12-01T08:00:01Z"}))
                },
                false,
            ),
            (
                "scheduled",
                || {
                    with_status(json!({"phase": "Pending",
                    "conditions": [{"type": "PodScheduled", "status": "True"}]}))
                },
                false,
            ),
            (
                "ready",
                || {
                    with_status(json!({"phase": "Running",
                    "conditions": [{"type": "Ready", "status": "True"}]}))
                },
                true,
            ),
            (
                "the runner container started",
                || {
                    with_status(json!({"phase": "Pending", "containerStatuses": [
                    {"name": "runner", "ready": false, "restartCount": 0, "image": "runner",
                     "imageID": "", "state": {"running": {}}}]}))
                },
                true,
            ),
            (
                "being deleted",
                || {
                    let mut p = pod();
                    p.metadata.deletion_timestamp =
                        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                            "2026-12-01T08:05:00Z".parse().unwrap(),
                        ));
                    p
                },
                true,
            ),
            (
                "evicted",
                || {
                    with_status(json!({"phase": "Failed", "reason": "Evicted",
                                      "message": "the node ran out of memory"}))
                },
                true,
            ),
        ];
        for (name, change, delivered) in cases {
            let mut filter = ProjectionFilter::new(pod_view);
            assert!(filter.admit(&Event::Apply(pod())), "first sight passes");
            assert_eq!(filter.admit(&Event::Apply(change())), delivered, "{name}");
        }
    }
}
