//! The EphemeralRunnerSet controller against the real API server. No runner
//! controller runs here: each test plays its part (and the listener's) by
//! writing runner statuses itself (phase, runner id, job), and holds a
//! finalizer on runners where the runner controller's deregistration would
//! keep a deleted runner around.

mod common;

use std::sync::Arc;
use std::time::Duration;

use arcwright::api::{
    EphemeralRunner, EphemeralRunnerPhase, EphemeralRunnerSet, EphemeralRunnerSetPhase,
    EphemeralRunnerSetSpec, EphemeralRunnerSetStatus, EphemeralRunnerSpec, EphemeralRunnerStatus,
    annotations, finalizers, labels,
};
use arcwright::backlog::{Backlogs, SetKey};
use arcwright::controllers::ephemeral_runner_set::{self as controller, Context, SetMetrics};
use arcwright::controllers::kit::Synced;
use arcwright_harness::{TestEnv, eventually};
use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceQuota};
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// What a runner-controller finalizer looks like to the set: a deleted
/// runner stays until the test lets it go.
const HOLD: &str = "test.arcwright.dev/deregistration";
/// The runner controller's finalizer, which every runner is born with.
const RUNNER_FINALIZER: &str = finalizers::EPHEMERAL_RUNNER.name;
const SET: &str = "linux";
/// How long a test waits for what the controller must do.
const WITHIN: Duration = Duration::from_secs(30);

struct Harness {
    env: TestEnv,
    metrics: SetMetrics,
    controller: Option<JoinHandle<()>>,
    ctx: Option<Arc<Context>>,
    /// What a listener of the process says the set's runners do.
    backlogs: Backlogs,
}

impl Harness {
    async fn new(name: &str) -> Self {
        let env = TestEnv::new(name).await;
        common::install_crds(env.client()).await;
        tokio::spawn(release_runner_finalizers(Api::namespaced(
            env.client(),
            env.namespace(),
        )));
        let mut harness = Self {
            env,
            metrics: SetMetrics::default(),
            controller: None,
            ctx: None,
            backlogs: Backlogs::new(),
        };
        harness.start();
        harness
    }

    /// Starts the controller, as a fresh process would: nothing is carried
    /// over from a previous run but the metrics.
    fn start(&mut self) {
        let mut ctx = Context::new(self.env.client(), self.metrics.clone());
        ctx.backlogs = self.backlogs.clone();
        let ctx = Arc::new(ctx);
        self.ctx = Some(ctx.clone());
        let namespace = self.env.namespace().to_string();
        self.controller = Some(tokio::spawn(async move {
            controller::run(
                ctx,
                Some(&namespace),
                4,
                CancellationToken::new(),
                Synced::default(),
            )
            .await;
        }));
    }

    /// Kills the controller wherever it is, and waits until it is gone.
    async fn crash(&mut self) {
        let task = self.controller.take().expect("running");
        task.abort();
        assert!(task.await.unwrap_err().is_cancelled());
    }

    fn sets(&self) -> Api<EphemeralRunnerSet> {
        Api::namespaced(self.env.client(), self.env.namespace())
    }

    fn runners_api(&self) -> Api<EphemeralRunner> {
        Api::namespaced(self.env.client(), self.env.namespace())
    }

    async fn create_set(&self, replicas: i32, patch_id: i32) -> EphemeralRunnerSet {
        let spec = EphemeralRunnerSetSpec {
            replicas,
            patch_id,
            actionable_revision: 1,
            ephemeral_runner_spec: runner_spec("runner:1"),
            ephemeral_runner_metadata: None,
        };
        self.sets()
            .create(&PostParams::default(), &EphemeralRunnerSet::new(SET, spec))
            .await
            .unwrap()
    }

    /// Writes the listener's decision, as the listener does.
    async fn decide(&self, replicas: i32, patch_id: i32) -> i64 {
        let set = self
            .sets()
            .patch(
                SET,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": replicas, "patchID": patch_id}})),
            )
            .await
            .unwrap();
        set.metadata.generation.unwrap()
    }

    /// Publishes a new runner spec at `revision`, as the
    /// AutoscalingRunnerSet does.
    async fn publish(&self, revision: i64, image: &str) -> i64 {
        let set = self
            .sets()
            .patch(
                SET,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {
                    "actionableRevision": revision,
                    "ephemeralRunnerSpec": runner_spec(image),
                }})),
            )
            .await
            .unwrap();
        set.metadata.generation.unwrap()
    }

    /// Creates the set and waits for its first runners; their names, oldest
    /// first.
    async fn set_with_runners(&self, replicas: i32, patch_id: i32) -> Vec<String> {
        self.create_set(replicas, patch_id).await;
        let count = usize::try_from(replicas).unwrap();
        names(
            &self
                .until_runners("the first runners", |r| r.len() == count)
                .await,
        )
    }

    /// Creates the set with `replicas` runners, each reported registered
    /// and idle, and waits until the set counts them running.
    async fn idle_runners(&self, replicas: i32, patch_id: i32) -> Vec<String> {
        let runners = self.set_with_runners(replicas, patch_id).await;
        for runner in &runners {
            self.idle(runner).await;
        }
        let running = i64::from(replicas);
        self.until_status("reported", |s| {
            i64::from(s.running_ephemeral_runners) == running
        })
        .await;
        runners
    }

    /// Three runners of revision 1 (idle, busy, and pending unregistered),
    /// each held by a finalizer; then a new spec published at revision 2,
    /// and the cleanup under way. Returns the three names and the set's
    /// generation with the new spec.
    async fn spec_change_under_way(&self) -> (String, String, String, i64) {
        let runners = self.set_with_runners(3, 0).await;
        let [idle, busy, pending] = <[String; 3]>::try_from(runners).unwrap();
        self.idle(&idle).await;
        self.busy(&busy).await;
        for name in [&idle, &busy, &pending] {
            self.set_finalizers(name, &[HOLD]).await;
        }
        let generation = self.publish(2, "runner:2").await;
        self.until_runners("the idle and pending runners deleted", |r| {
            deleting(r, &idle) && deleting(r, &pending)
        })
        .await;
        (idle, busy, pending, generation)
    }

    /// Makes the controller take one more pass and waits for it: a spec
    /// change that only touches runners created later. The status it
    /// returns is the one that pass decided, so what it says is proven, not
    /// raced.
    async fn another_pass(&self, n: u32) -> EphemeralRunnerSetStatus {
        let set = self
            .sets()
            .patch(
                SET,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"ephemeralRunnerMetadata": {
                    "annotations": {"test.arcwright.dev/pass": n.to_string()}
                }}})),
            )
            .await
            .unwrap();
        let generation = set.metadata.generation;
        self.until_status("another pass", |s| s.observed_generation == generation)
            .await
    }

    async fn status(&self) -> EphemeralRunnerSetStatus {
        self.sets()
            .get_status(SET)
            .await
            .unwrap()
            .status
            .unwrap_or_default()
    }

    /// The set's runners, oldest first.
    async fn runners(&self) -> Vec<EphemeralRunner> {
        let mut runners = self
            .runners_api()
            .list(&ListParams::default().labels(&format!("{}={SET}", labels::EPHEMERAL_RUNNER_SET)))
            .await
            .unwrap()
            .items;
        runners.sort_by_key(|r| (r.metadata.creation_timestamp.clone(), r.name_any()));
        runners
    }

    async fn until_runners(
        &self,
        what: &str,
        test: impl Fn(&[EphemeralRunner]) -> bool,
    ) -> Vec<EphemeralRunner> {
        eventually(what, WITHIN, || async {
            let runners = self.runners().await;
            test(&runners).then_some(runners)
        })
        .await
    }

    async fn until_status(
        &self,
        what: &str,
        test: impl Fn(&EphemeralRunnerSetStatus) -> bool,
    ) -> EphemeralRunnerSetStatus {
        eventually(what, WITHIN, || async {
            let status = self.status().await;
            test(&status).then_some(status)
        })
        .await
    }

    /// Plays the runner controller and the listener: writes `status` of
    /// the runner.
    async fn report(&self, runner: &str, status: serde_json::Value) {
        self.runners_api()
            .patch_status(
                runner,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": status })),
            )
            .await
            .unwrap();
    }

    /// Reports the runner succeeded, its registration gone by itself, as
    /// the runner controller does in one write.
    async fn succeeded(&self, runner: &str, runner_id: i64) {
        self.report(
            runner,
            json!({"phase": "Succeeded", "runnerId": runner_id,
                   "conditions": [{"type": "Registered", "status": "False",
                      "reason": "SelfDeregistered", "message": "",
                      "lastTransitionTime": jiff::Timestamp::now().to_string()}]}),
        )
        .await;
    }

    async fn idle(&self, runner: &str) {
        self.report(
            runner,
            json!({"phase": "Running", "runnerId": 100, "ready": true}),
        )
        .await;
    }

    async fn busy(&self, runner: &str) {
        self.report(
            runner,
            json!({"phase": "Running", "runnerId": 101, "jobRequestId": 9, "jobId": "job-9"}),
        )
        .await;
    }

    async fn set_finalizers(&self, runner: &str, finalizers: &[&str]) {
        self.runners_api()
            .patch(
                runner,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": finalizers}})),
            )
            .await
            .unwrap();
    }
}

/// Plays the runner controller's finalizer: a runner is born with it (the
/// set creates it so; asserted here), and with nothing it owns to clean up
/// in these tests, it is released as soon as the runner is deleted. Tests that need a deleted runner
/// kept hold their own finalizer ([`HOLD`]).
async fn release_runner_finalizers(runners: Api<EphemeralRunner>) {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let events = watcher::watcher(runners.clone(), watcher::Config::default())
        .default_backoff()
        .applied_objects();
    let mut events = std::pin::pin!(events);
    let mut seen = std::collections::HashSet::new();
    while let Some(Ok(runner)) = events.next().await {
        if seen.insert(runner.uid()) {
            assert!(
                runner.finalizers().iter().any(|f| f == RUNNER_FINALIZER),
                "a runner is created with the runner controller's finalizer: {:?}",
                runner.finalizers()
            );
        }
        if runner.metadata.deletion_timestamp.is_none()
            || !runner.finalizers().iter().any(|f| f == RUNNER_FINALIZER)
        {
            continue;
        }
        let kept: Vec<&String> = runner
            .finalizers()
            .iter()
            .filter(|f| *f != RUNNER_FINALIZER)
            .collect();
        let patch = json!({"metadata": {
            "finalizers": kept, "resourceVersion": runner.resource_version(),
        }});
        // A conflict is a newer version, which comes as its own event.
        let _ = runners
            .patch(
                &runner.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await;
    }
}

fn runner_spec(image: &str) -> EphemeralRunnerSpec {
    EphemeralRunnerSpec {
        github_config_url: "https://github.com/octo-org".into(),
        github_config_secret: "github-auth".into(),
        runner_scale_set_id: 7,
        spec: PodSpec {
            restart_policy: Some("Never".into()),
            containers: vec![Container {
                name: "runner".into(),
                image: Some(image.into()),
                ..Container::default()
            }],
            ..PodSpec::default()
        },
        ..EphemeralRunnerSpec::default()
    }
}

fn names(runners: &[EphemeralRunner]) -> Vec<String> {
    runners.iter().map(ResourceExt::name_any).collect()
}

fn annotation(runner: &EphemeralRunner, key: &str) -> String {
    runner.annotations().get(key).cloned().unwrap_or_default()
}

fn deleting(runners: &[EphemeralRunner], name: &str) -> bool {
    runners
        .iter()
        .any(|r| r.name_any() == name && r.metadata.deletion_timestamp.is_some())
}

/// Passes of the running controller so far.
impl Harness {
    fn reconciles(&self) -> u64 {
        self.ctx
            .as_ref()
            .expect("started")
            .controller_metrics
            .reconciles_of("ephemeral-runner-set")
    }
}

#[tokio::test]
async fn a_creation_refused_part_way_is_completed_under_the_same_decision() {
    let h = Harness::new("ers-quota").await;
    // A quota of three runners: the API server refuses the fourth, as it
    // refuses writes under load or an admission webhook refuses one. No
    // controller manager runs here, so the quota's status (what admission
    // enforces) is written by hand; admission keeps its usage after.
    let quotas: Api<ResourceQuota> = Api::namespaced(h.env.client(), h.env.namespace());
    const RESOURCE: &str = "count/ephemeralrunners.arcwright.dev";
    let quota = |hard: &str| -> ResourceQuota {
        serde_json::from_value(json!({
            "metadata": {"name": "runners"},
            "spec": {"hard": {RESOURCE: hard}},
            "status": {"hard": {RESOURCE: hard}, "used": {RESOURCE: "0"}},
        }))
        .unwrap()
    };
    let created = quotas
        .create(&PostParams::default(), &quota("3"))
        .await
        .unwrap();
    quotas
        .replace_status(
            "runners",
            &PostParams::default(),
            &ResourceQuota {
                metadata: created.metadata,
                ..quota("3")
            },
        )
        .await
        .unwrap();

    h.create_set(5, 4).await;
    h.until_runners("three runners", |r| r.len() == 3).await;
    // Two passes more: the one that met the refusal has ended, and one
    // after it tried again. (A set that took the decision as acted on by
    // the three would try nothing more until the next decision.)
    let after = h.reconciles() + 1;
    eventually("the set trying again", WITHIN, || async {
        (h.reconciles() > after).then_some(())
    })
    .await;
    let runners = h.runners().await;
    assert!(
        runners
            .iter()
            .all(|r| annotation(r, annotations::PATCH_ID) == "0"),
        "no runner marks the decision acted on before it is complete"
    );

    // Room for two more: the same decision, no new patch id, is completed.
    let mut room = quotas.get("runners").await.unwrap();
    let hard = k8s_openapi::apimachinery::pkg::api::resource::Quantity("10".into());
    room.spec.as_mut().unwrap().hard = Some([(RESOURCE.to_owned(), hard.clone())].into());
    let room = quotas
        .replace("runners", &PostParams::default(), &room)
        .await
        .unwrap();
    let mut status = room.clone();
    status.status.as_mut().unwrap().hard = Some([(RESOURCE.to_owned(), hard)].into());
    quotas
        .replace_status("runners", &PostParams::default(), &status)
        .await
        .unwrap();
    let runners = h.until_runners("five runners", |r| r.len() == 5).await;
    let marked: Vec<_> = runners
        .iter()
        .filter(|r| annotation(r, annotations::PATCH_ID) == "4")
        .collect();
    assert_eq!(marked.len(), 1, "the runner that completed the decision");
}

#[tokio::test]
async fn scale_up_creates_the_runners_asked_for() {
    let h = Harness::new("ers-scale-up").await;
    let set = h.create_set(3, 4).await;
    let runners = h.until_runners("three runners", |r| r.len() == 3).await;
    // The decision is acted on in full: its last runner says so.
    let mut patch_ids: Vec<_> = runners
        .iter()
        .map(|r| annotation(r, annotations::PATCH_ID))
        .collect();
    patch_ids.sort_unstable();
    assert_eq!(patch_ids, ["0", "0", "4"]);
    for runner in &runners {
        let owner = &runner.owner_references()[0];
        assert_eq!(owner.uid, set.uid().unwrap());
        assert_eq!(owner.controller, Some(true));
        assert!(runner.name_any().starts_with("linux-runner-"));
        assert_eq!(annotation(runner, annotations::REVISION), "1");
        assert_eq!(runner.spec, set.spec.ephemeral_runner_spec);
    }
    let status = h
        .until_status("the counts", |s| s.current_replicas == 3)
        .await;
    assert_eq!(status.pending_ephemeral_runners, 3);
    assert_eq!(status.observed_generation, set.metadata.generation);
    assert_eq!(status.applied_actionable_revision, 1);
    assert_eq!(status.phase, Some(EphemeralRunnerSetPhase::Running));
    let held = h.sets().get(SET).await.unwrap().finalizers().to_vec();
    assert_eq!(held, [finalizers::EPHEMERAL_RUNNER_SET.name]);

    // Registered and running, as the runner controller reports them.
    for name in names(&runners) {
        h.idle(&name).await;
    }
    h.until_status("running counted", |s| s.running_ephemeral_runners == 3)
        .await;
}

/// A set finalized by an older version carries the finalizer under its
/// former name: that counts as held (it is not added again) and is removed
/// when the set's runners are gone, so the set is deleted, not stuck.
#[tokio::test]
async fn a_set_holding_the_finalizer_under_its_former_name_is_still_cleaned_up() {
    const FORMER: &str = "ephemeralrunnerset.arcwright.dev/finalizer";
    assert!(finalizers::EPHEMERAL_RUNNER_SET.formerly.contains(&FORMER));
    let h = Harness::new("ers-former-finalizer").await;
    let mut set = EphemeralRunnerSet::new(
        SET,
        EphemeralRunnerSetSpec {
            replicas: 2,
            actionable_revision: 1,
            ephemeral_runner_spec: runner_spec("runner:1"),
            ..EphemeralRunnerSetSpec::default()
        },
    );
    set.metadata.finalizers = Some(vec![FORMER.to_owned()]);
    h.sets().create(&PostParams::default(), &set).await.unwrap();
    h.until_runners("the runners", |r| r.len() == 2).await;
    h.until_status("a pass over the set", |s| s.current_replicas == 2)
        .await;
    let held = h.sets().get(SET).await.unwrap().finalizers().to_vec();
    assert_eq!(
        held,
        [FORMER],
        "held under its former name, not added again"
    );

    h.sets().delete(SET, &Default::default()).await.unwrap();
    eventually("the set gone", WITHIN, || async {
        h.sets().get_opt(SET).await.unwrap().is_none().then_some(())
    })
    .await;
    assert!(h.runners().await.is_empty());
}

#[tokio::test]
async fn scale_down_removes_only_idle_runners_and_leaves_busy_ones() {
    let h = Harness::new("ers-scale-down").await;
    let runners = h.set_with_runners(4, 1).await;
    let (idle_a, idle_b, busy, unregistered) = (&runners[0], &runners[1], &runners[2], &runners[3]);
    h.idle(idle_a).await;
    h.idle(idle_b).await;
    h.busy(busy).await;
    h.until_status("reported", |s| s.running_ephemeral_runners == 3)
        .await;

    h.decide(0, 0).await;
    let left = h
        .until_runners("the idle runners gone", |r| r.len() == 2)
        .await;
    assert_eq!(names(&left), [busy.clone(), unregistered.clone()]);

    // The unregistered runner registers: now it is idle, and goes. The
    // busy one has been looked at twice more and is still there.
    h.idle(unregistered).await;
    let left = h
        .until_runners("the newly idle runner gone", |r| r.len() == 1)
        .await;
    assert_eq!(names(&left), std::slice::from_ref(busy));
    assert!(left[0].metadata.deletion_timestamp.is_none());
    h.until_status("one runner counted", |s| s.current_replicas == 1)
        .await;
}

#[tokio::test]
async fn a_runner_that_succeeded_is_renewed_by_the_next_decision_not_replaced() {
    let h = Harness::new("ers-renewal").await;
    let runners = h.set_with_runners(2, 1).await;
    let (done, live) = (&runners[0], &runners[1]);
    h.idle(live).await;
    // It ran its job and succeeded, its registration gone, as the runner
    // controller reports it (one write). The decision it ran under was
    // acted on: it waits for the next.
    h.report(
        done,
        json!({"phase": "Succeeded", "runnerId": 100, "exitCode": 0,
               "jobRequestId": 9, "jobId": "job-9", "jobRunnerId": 100,
               "conditions": [{"type": "Registered", "status": "False",
                  "reason": "SelfDeregistered", "message": "",
                  "lastTransitionTime": jiff::Timestamp::now().to_string()}]}),
    )
    .await;
    // A pass saw it (deletions come before the status write).
    let seen = |s: &EphemeralRunnerSetStatus| {
        (s.pending_ephemeral_runners, s.running_ephemeral_runners) == (0, 1)
    };
    h.until_status("the finished runner seen", seen).await;
    assert_eq!(names(&h.runners().await), runners, "kept in its window");
    h.decide(2, 2).await;
    let renewed = h
        .until_runners("the runner renewed", |r| {
            r.iter().any(|r| {
                r.name_any() == *done && r.status.as_ref().is_some_and(|s| s.renewals() == 1)
            })
        })
        .await;
    assert_eq!(names(&renewed), runners, "no runner created or deleted");
    let status = renewed[0].status.clone().unwrap();
    let renewal = status.renewal.clone().unwrap();
    assert_eq!((renewal.patch_id, renewal.count), (2, 1));
    assert_eq!(
        status,
        EphemeralRunnerStatus {
            renewal: Some(renewal),
            ..EphemeralRunnerStatus::default()
        },
        "nothing of the job before is left"
    );
    h.until_status("counted as pending", |s| {
        (s.pending_ephemeral_runners, s.running_ephemeral_runners) == (1, 1)
    })
    .await;

    // The renewal carries the decision's patch id: a later pass of the
    // same decision, with the runner succeeded again, does not renew it
    // (the listener's next decision will, or patch id 0 removes it).
    h.succeeded(done, 102).await;
    h.until_status("the finished runner seen again", seen).await;
    let after = h.runners().await;
    assert_eq!(names(&after), runners);
    assert_eq!(after[0].status.as_ref().unwrap().renewals(), 1);
    assert!(
        after[0].metadata.deletion_timestamp.is_none(),
        "waits in its window"
    );
    h.decide(1, 0).await;
    h.until_runners("the finished runner deleted on patch id 0", |r| {
        names(r) == [live.clone()]
    })
    .await;

    // A runner built before the set's runner metadata changed is not
    // renewed (a renewal keeps the object as it is): it ends, and a new
    // runner is built.
    h.another_pass(1).await;
    h.succeeded(live, 100).await;
    h.decide(1, 3).await;
    let after = h
        .until_runners("a new runner in place of the old one", |r| {
            r.len() == 1 && names(r) != [live.clone()]
        })
        .await;
    assert!(after[0].status.as_ref().is_none_or(|s| s.renewal.is_none()));
}

#[tokio::test]
async fn a_stale_decision_removes_nothing() {
    let h = Harness::new("ers-stale-decision").await;
    let runners = h.idle_runners(3, 5).await;

    // A decision older than the runners it would remove.
    let generation = h.decide(1, 3).await;
    h.until_status("the decision seen", |s| {
        s.observed_generation == Some(generation)
    })
    .await;
    // Deletions come before the status write, so a pass that wanted any
    // had made them by now.
    let after = h.runners().await;
    assert_eq!(names(&after), runners);
    assert!(
        after
            .iter()
            .all(|r| r.metadata.deletion_timestamp.is_none())
    );

    // The same runners are removable: patch id 0 takes two of them.
    h.decide(1, 0).await;
    h.until_runners("scaled down to one", |r| r.len() == 1)
        .await;
}

#[tokio::test]
async fn a_spec_change_replaces_idle_runners_not_busy_ones_and_applies_the_revision_after_cleanup()
{
    let h = Harness::new("ers-spec-change").await;
    let (idle, busy, pending, generation) = h.spec_change_under_way().await;
    let after = h.runners().await;
    assert!(
        !deleting(&after, &busy),
        "a runner with a job is left to finish"
    );
    let status = h
        .until_status("the new spec seen", |s| {
            s.observed_generation == Some(generation)
        })
        .await;
    assert_eq!(
        status.applied_actionable_revision, 1,
        "not applied while deleted runners of the old spec are still there"
    );
    assert_eq!(h.runners().await.len(), 3, "nothing created during cleanup");

    h.set_finalizers(&idle, &[]).await;
    h.until_runners("one deleted runner gone", |r| r.len() == 2)
        .await;
    assert_eq!(h.another_pass(1).await.applied_actionable_revision, 1);

    h.set_finalizers(&pending, &[]).await;
    h.until_status("the revision applied", |s| {
        s.applied_actionable_revision == 2
    })
    .await;
    let runners = h.until_runners("two new runners", |r| r.len() == 3).await;
    let (old, new): (Vec<_>, Vec<_>) = runners.iter().partition(|r| r.name_any() == busy);
    assert_eq!(old.len(), 1, "the busy runner is untouched");
    assert_eq!(annotation(old[0], annotations::REVISION), "1");
    assert!(old[0].metadata.deletion_timestamp.is_none());
    for new in new {
        assert_eq!(annotation(new, annotations::REVISION), "2");
        assert_eq!(
            new.spec.spec.containers[0].image.as_deref(),
            Some("runner:2")
        );
    }
}

#[tokio::test]
async fn a_controller_killed_mid_cleanup_applies_the_revision_after_restart() {
    let mut h = Harness::new("ers-crash-cleanup").await;
    let (idle, busy, pending, _) = h.spec_change_under_way().await;
    assert_eq!(h.another_pass(1).await.applied_actionable_revision, 1);
    h.crash().await;

    // While it is down: the deleted runners finish deregistering, and the
    // busy one's job ends, leaving an idle runner of the old spec that the
    // first run never deleted.
    h.set_finalizers(&idle, &[]).await;
    h.set_finalizers(&pending, &[]).await;
    h.report(&busy, json!({"jobRequestId": 0, "jobId": ""}))
        .await;
    h.until_runners("the deleted runners gone", |r| r.len() == 1)
        .await;

    h.start();
    h.until_runners("the cleanup redone", |r| deleting(r, &busy))
        .await;
    assert_eq!(
        h.another_pass(2).await.applied_actionable_revision,
        1,
        "still behind while a runner of the old spec remains"
    );
    h.set_finalizers(&busy, &[]).await;
    h.until_status("the revision applied", |s| {
        s.applied_actionable_revision == 2
    })
    .await;
    let runners = h
        .until_runners("three runners of the new spec", |r| r.len() == 3)
        .await;
    for runner in &runners {
        assert_eq!(annotation(runner, annotations::REVISION), "2");
    }
}

#[tokio::test]
async fn a_current_outdated_runner_holds_the_set_outdated_until_the_revision_advances() {
    let h = Harness::new("ers-outdated").await;
    let runners = h.set_with_runners(2, 0).await;
    h.report(
        &runners[0],
        json!({"phase": "Outdated", "runnerId": 5, "reason": "Outdated"}),
    )
    .await;
    h.until_status("the set outdated", |s| {
        s.phase == Some(EphemeralRunnerSetPhase::Outdated)
    })
    .await;
    // Creations come before the status write: the pass that found the
    // verdict created nothing to replace the outdated runner.
    assert_eq!(names(&h.runners().await), runners);

    // Recovery: the same runner spec, republished at a new revision.
    h.publish(2, "runner:1").await;
    let status = h
        .until_status("the set running again", |s| {
            s.phase == Some(EphemeralRunnerSetPhase::Running) && s.applied_actionable_revision == 2
        })
        .await;
    assert_eq!(status.applied_actionable_revision, 2);
    let runners = h
        .until_runners("two runners of the new revision", |r| {
            r.len() == 2
                && r.iter()
                    .all(|r| annotation(r, annotations::REVISION) == "2")
        })
        .await;
    assert!(runners.iter().all(|r| r.status.is_none()));
}

#[tokio::test]
async fn runner_updates_outside_the_projection_do_not_wake_the_set() {
    let h = Harness::new("ers-predicate").await;
    let runners = h.set_with_runners(2, 0).await;
    let ns = h.env.namespace().to_string();
    let delivered = || h.metrics.runner_updates_of(&ns, SET, "delivered");
    let dropped = || h.metrics.runner_updates_of(&ns, SET, "dropped");
    eventually("both creations delivered", WITHIN, || async {
        (delivered() == 2).then_some(())
    })
    .await;
    assert_eq!(dropped(), 0);
    let reconciles_before = h.metrics.reconciles_of(&ns, SET);

    // Readiness, messages and the job's display name: nothing the set reads.
    h.report(&runners[0], json!({"message": "pulling image"}))
        .await;
    h.report(&runners[0], json!({"message": "starting"})).await;
    h.report(&runners[0], json!({"ready": true})).await;
    h.report(&runners[1], json!({"jobDisplayName": "build"}))
        .await;
    // Then a change it reads. Events of one watch arrive in order, so once
    // this one is delivered the four before it have been judged.
    h.report(&runners[1], json!({"phase": "Running", "runnerId": 3}))
        .await;
    eventually("the phase change delivered", WITHIN, || async {
        (delivered() == 3).then_some(())
    })
    .await;
    assert_eq!(dropped(), 4, "the four updates were dropped");
    h.until_status("the phase change reconciled", |s| {
        s.running_ephemeral_runners == 1
    })
    .await;
    let reconciles = h.metrics.reconciles_of(&ns, SET) - reconciles_before;
    assert!(
        reconciles >= 1,
        "the delivered update woke the reconciler ({reconciles} reconciles)"
    );
    assert_eq!(delivered(), 3, "one wake-up for five runner writes");
}

/// The listener's part next to the set: the start of a job whose runner the
/// listener's cache shows succeeded on that very registration is not
/// written (the job is over, and a renewal of the runner would be refused
/// for the write landing under it); any other start is. A success is
/// written while the runner still runs and jobs wait for runners, for the
/// set to know the job's end was seen.
#[tokio::test]
async fn the_listener_records_a_job_on_its_runner_as_far_as_the_set_needs_it() {
    use arcwright::listener::JobSink;
    use arcwright::listener::cluster::{ClusterView, RunnerJobs};

    let mut h = Harness::new("late-start").await;
    let [done, busy] = <[String; 2]>::try_from(h.set_with_runners(2, 1).await).unwrap();
    // Nothing but the test writes the runners from here on.
    h.crash().await;
    h.succeeded(&done, 7).await;
    h.idle(&busy).await;
    let shutdown = CancellationToken::new();
    let view = ClusterView::watch(
        &h.env.client(),
        &[Some(h.env.namespace().to_owned())],
        &shutdown,
    );
    view.wait_until_ready().await;
    eventually("the cache sees the runner succeeded", WITHIN, || async {
        view.runner(h.env.namespace(), &done).filter(|r| {
            r.status.as_ref().and_then(|s| s.phase) == Some(EphemeralRunnerPhase::Succeeded)
        })
    })
    .await;
    let jobs = RunnerJobs::new(h.env.client(), h.env.namespace()).seeing(view);
    let start = |runner: &str, runner_id: i64| arcwright::listener::JobStarted {
        runner_name: runner.to_owned(),
        runner_id,
        runner_request_id: 5,
        repository: "octo/app".into(),
        workflow_ref: "octo/app/.github/workflows/ci.yml@main".into(),
        workflow_run_id: 6,
        job_id: format!("job-of-{runner_id}"),
        job_display_name: "build".into(),
        started_at: jiff::Timestamp::now(),
    };
    let job_of = |runners: &[EphemeralRunner], name: &str| {
        runners
            .iter()
            .find(|r| r.name_any() == name)
            .and_then(|r| r.status.as_ref()?.job_id.clone())
    };

    jobs.job_started(start(&done, 7)).await.unwrap();
    jobs.job_started(start(&busy, 100)).await.unwrap();
    let runners = h.runners().await;
    assert_eq!(
        job_of(&runners, &done),
        None,
        "the ended registration's job"
    );
    assert_eq!(job_of(&runners, &busy).as_deref(), Some("job-of-100"));
    // A start on a registration the cache does not show ended (a newer
    // one, the cache behind) is written.
    jobs.job_started(start(&done, 8)).await.unwrap();
    let runners = h.runners().await;
    assert_eq!(job_of(&runners, &done).as_deref(), Some("job-of-8"));

    // A success is recorded only while the cache shows its runner still
    // running on that registration: the set then knows the listener saw
    // the job end. Failures always are.
    let end = |runner: &str, runner_id: i64, result: &str| arcwright::listener::JobCompleted {
        runner_name: runner.to_owned(),
        runner_id,
        runner_request_id: 5,
        job_id: format!("job-of-{runner_id}"),
        result: result.to_owned(),
        finished_at: jiff::Timestamp::now(),
        started: None,
        jobs_waiting: true,
    };
    let result_of = |runners: &[EphemeralRunner], name: &str| {
        runners
            .iter()
            .find(|r| r.name_any() == name)
            .and_then(|r| r.status.as_ref()?.job_result.clone())
    };
    jobs.job_completed(end(&done, 7, "succeeded"))
        .await
        .unwrap();
    // With no job waiting for a runner, nobody wants the place.
    let unwanted = arcwright::listener::JobCompleted {
        jobs_waiting: false,
        ..end(&busy, 100, "succeeded")
    };
    jobs.job_completed(unwanted).await.unwrap();
    let runners = h.runners().await;
    assert_eq!(result_of(&runners, &done), None, "its runner had ended");
    assert_eq!(result_of(&runners, &busy), None, "no job waiting");
    jobs.job_completed(end(&busy, 100, "succeeded"))
        .await
        .unwrap();
    let runners = h.runners().await;
    assert_eq!(result_of(&runners, &busy).as_deref(), Some("succeeded"));
    jobs.job_completed(end(&done, 7, "failed")).await.unwrap();
    let runners = h.runners().await;
    assert_eq!(result_of(&runners, &done).as_deref(), Some("failed"));
    shutdown.cancel();
}

/// With renewal in place the listener tells the set which job each runner
/// started, and writes the start on the runner's status only as the host's
/// status budget allows: a runner whose start is heard and not written is
/// busy all the same, and scale-down leaves it. Its end heard, the job is
/// forgotten, and the start put off is never written over it.
#[tokio::test]
async fn a_job_heard_and_not_yet_recorded_keeps_its_runner_from_scale_down() {
    use arcwright::controllers::kit::budget::WriteBudget;
    use arcwright::listener::JobSink;
    use arcwright::listener::cluster::{ClusterView, RunnerJobs};

    let h = Harness::new("heard-busy").await;
    let runners = h.idle_runners(3, 1).await;
    let shutdown = CancellationToken::new();
    let view = ClusterView::watch(
        &h.env.client(),
        &[Some(h.env.namespace().to_owned())],
        &shutdown,
    );
    view.wait_until_ready().await;
    let set = SetKey::new(h.env.namespace(), SET);
    // No budget at all: every start the cache shows a runner for waits.
    let jobs = RunnerJobs::new(h.env.client(), h.env.namespace())
        .seeing(view)
        .telling(h.backlogs.clone(), set.clone(), WriteBudget::new(0));
    let busy = &runners[1];
    jobs.job_started(arcwright::listener::JobStarted {
        runner_name: busy.clone(),
        runner_id: 100,
        runner_request_id: 5,
        repository: "octo/app".into(),
        workflow_ref: "octo/app/.github/workflows/ci.yml@main".into(),
        workflow_run_id: 6,
        job_id: "job-5".into(),
        job_display_name: "build".into(),
        started_at: jiff::Timestamp::now(),
    })
    .await
    .unwrap();
    assert_eq!(
        h.backlogs
            .job_on(&set, busy, 100)
            .map(|j| j.job_id)
            .as_deref(),
        Some("job-5")
    );

    h.decide(0, 0).await;
    let left = h
        .until_runners("the idle runners gone", |r| r.len() == 1)
        .await;
    assert_eq!(names(&left), std::slice::from_ref(busy));
    assert!(left[0].metadata.deletion_timestamp.is_none());
    assert_eq!(
        left[0].status.as_ref().and_then(|s| s.job_id.clone()),
        None,
        "the start is put off: no budget"
    );

    jobs.job_completed(arcwright::listener::JobCompleted {
        runner_name: busy.clone(),
        runner_id: 100,
        runner_request_id: 5,
        job_id: "job-5".into(),
        result: "failed".into(),
        finished_at: jiff::Timestamp::now(),
        started: None,
        jobs_waiting: false,
    })
    .await
    .unwrap();
    assert_eq!(h.backlogs.job_on(&set, busy, 100), None);
    let runner = h.runners_api().get(busy).await.unwrap();
    let status = runner.status.unwrap_or_default();
    assert_eq!(status.job_result.as_deref(), Some("failed"));
    // Its job over, the runner is idle: the next scale-down takes it.
    h.decide(1, 2).await;
    h.decide(0, 0).await;
    h.until_runners("the runner whose job ended gone", |r| {
        r.iter().all(|r| r.metadata.deletion_timestamp.is_some())
    })
    .await;
    shutdown.cancel();
}
