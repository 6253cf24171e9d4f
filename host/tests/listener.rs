//! Listeners against the fake Actions service over real HTTP, with the
//! in-memory scale target and sinks: scaling on a burst and back, the
//! failures a listener must ride out, shutdown, and its scaling policy.

use std::collections::BTreeMap;
use std::time::Duration;

use arcwright::actions::{
    ActionsClient, ClientOptions, ConfigUrl, Credentials, JitRunnerSetting, RetryPolicy,
    RunnerScaleSet, Secret,
};
use arcwright::listener::{
    self, Backoff, Cause, Health, JobCompleted, JobRecord, JobSink, JobStarted, ListenerError,
    ListenerHandle, ListenerMetrics, ListenerSpec, MemoryJobSink, MemoryScaleTarget,
    MemoryStatusSink, ScalePatch, StatusUpdate,
};
use arcwright::policy::bundled;
use arcwright::policy::loader::{ConfigMapPolicyRef, PolicyLoader, PolicyRef};
use arcwright::policy::types::ScaleSet;
use arcwright::policy::{EngineConfig, PolicyEngine, PolicyEvent, PolicyKind};
use arcwright_harness::eventually;
use fake_actions::{Endpoint, FakeActions, FakeConfig, Fault, FaultKind, JobSpec, RunnerJob};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// How long any awaited condition may take before the test fails.
const WAIT: Duration = Duration::from_secs(30);

const LABEL: &str = "linux";

fn fast_options() -> ClientOptions {
    ClientOptions {
        timeout: Duration::from_secs(5),
        message_timeout: Duration::from_secs(10),
        retry: RetryPolicy {
            max_retries: 2,
            base_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(40),
            max_retry_after: Duration::from_secs(5),
        },
        allow_plain_http: true,
        ..ClientOptions::default()
    }
}

/// Short polls, so a poll in flight never holds a test up.
fn fake_config() -> FakeConfig {
    FakeConfig {
        long_poll: Duration::from_millis(300),
        ..FakeConfig::default()
    }
}

/// A fake, a client of one of its organisations, and a scale set.
struct Service {
    fake: FakeActions,
    client: ActionsClient,
    scale_set: RunnerScaleSet,
}

async fn service() -> Service {
    // Shown with a failing test's output.
    let _ = tracing_subscriber::fmt()
        .with_env_filter("arcwright=debug,fake_actions=debug")
        .with_test_writer()
        .try_init();
    let fake = FakeActions::start(fake_config())
        .await
        .expect("the fake starts");
    let client = ActionsClient::new(
        ConfigUrl::parse(&fake.org_url("octo-org")).unwrap(),
        Credentials::Token(Secret::new(fake.pat())),
        fast_options(),
    )
    .unwrap();
    let scale_set = client
        .create_runner_scale_set(&RunnerScaleSet::new(LABEL, 1, &[]))
        .await
        .expect("scale set created");
    Service {
        fake,
        client,
        scale_set,
    }
}

fn spec(service: &Service, min: u32, max: u32, policy: Option<PolicyRef>) -> ListenerSpec {
    ListenerSpec {
        scale_set_id: service.scale_set.id,
        scale_set: ScaleSet {
            name: LABEL.into(),
            namespace: "ci".into(),
            min_runners: min,
            max_runners: max,
            labels: vec![LABEL.into()],
        },
        owner: "arcwright-test".into(),
        scaling_policy: policy,
        shadow_scaling_policy: None,
        backoff: Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(200),
        },
        metrics: ListenerMetrics::default(),
        metric_labels: Default::default(),
        job_metrics: Default::default(),
        // Most tests follow messages one by one; the window has a test of
        // its own.
        batch_window: Duration::ZERO,
        recording: None,
        backlog: None,
    }
}

fn loader(client: Option<kube::Client>) -> PolicyLoader {
    PolicyLoader::new(PolicyEngine::new(EngineConfig::default()).unwrap(), client)
}

/// A listener and what it reports to.
struct Running {
    target: MemoryScaleTarget,
    jobs: MemoryJobSink,
    status: MemoryStatusSink,
    handle: ListenerHandle,
}

fn start_with(
    service: &Service,
    spec: ListenerSpec,
    loader: PolicyLoader,
    target: MemoryScaleTarget,
) -> Running {
    let jobs = MemoryJobSink::new();
    let status = MemoryStatusSink::new();
    let handle = listener::spawn(
        service.client.clone(),
        loader,
        spec,
        target.clone(),
        jobs.clone(),
        status.clone(),
        &CancellationToken::new(),
    );
    Running {
        target,
        jobs,
        status,
        handle,
    }
}

fn start(service: &Service, spec: ListenerSpec) -> Running {
    start_with(service, spec, loader(None), MemoryScaleTarget::new())
}

/// A listener with minRunners 0, once it listens.
async fn listening_on(service: &Service, max: u32) -> Running {
    let running = start(service, spec(service, 0, max, None));
    status_after(&running, 0, listening).await;
    running
}

fn is_health(update: &StatusUpdate, wanted: impl Fn(&Health) -> bool) -> bool {
    matches!(update, StatusUpdate::Health(health) if wanted(health))
}

fn retrying(cause: Cause) -> impl Fn(&StatusUpdate) -> bool {
    move |u: &StatusUpdate| {
        is_health(
            u,
            |h| matches!(h, Health::Retrying { cause: c, .. } if *c == cause),
        )
    }
}

fn listening(update: &StatusUpdate) -> bool {
    is_health(update, |h| *h == Health::Listening)
}

/// Waits for an update matching `wanted` after the first `after` updates.
async fn status_after(
    running: &Running,
    after: usize,
    wanted: impl Fn(&StatusUpdate) -> bool,
) -> Vec<StatusUpdate> {
    running
        .status
        .updates()
        .wait_until(WAIT, |log| log.iter().skip(after).any(&wanted))
        .await
        .unwrap_or_else(|log| panic!("no such status update; got {log:#?}"))
}

async fn patches_until(
    target: &MemoryScaleTarget,
    done: impl Fn(&[ScalePatch]) -> bool,
) -> Vec<ScalePatch> {
    target
        .patches()
        .wait_until(WAIT, done)
        .await
        .unwrap_or_else(|log| panic!("the decisions never got there: {log:?}"))
}

/// ARC's numbering: the non-zero ids increase, and a 0 (steady at
/// minRunners) only ever repeats the decision before it.
fn assert_ids_follow_arc(patches: &[ScalePatch], min: u32) {
    let numbered: Vec<_> = patches.iter().filter(|p| p.patch_id != 0).collect();
    assert!(
        numbered.windows(2).all(|w| w[0].patch_id < w[1].patch_id),
        "non-zero patch ids must increase: {patches:?}"
    );
    assert!(
        patches
            .windows(2)
            .all(|w| w[1].patch_id != 0 || (w[1].replicas == min && w[0].replicas == min)),
        "0 is only sent steady at minRunners: {patches:?}"
    );
}

/// Posts to the fake's runner-facing API as the runner holding `jit`.
async fn runner_call(
    http: &reqwest::Client,
    base: &str,
    what: &str,
    jit: &str,
) -> reqwest::Response {
    http.post(format!("{base}/_runner/{what}"))
        .json(&serde_json::json!({"jitConfig": jit}))
        .send()
        .await
        .expect("runner call sent")
}

/// One ephemeral runner: registers, comes online, takes one job, runs it
/// for its duration, completes it and is gone (the fake deregisters it).
async fn ephemeral_runner(client: ActionsClient, base: String, scale_set_id: i64, name: String) {
    let jit = client
        .generate_jit_runner_config(
            scale_set_id,
            &JitRunnerSetting {
                name,
                work_folder: String::new(),
            },
        )
        .await
        .expect("runner registered");
    let jit = jit.encoded_jit_config.expose().to_string();
    let http = reqwest::Client::new();
    assert!(
        runner_call(&http, &base, "connect", &jit)
            .await
            .status()
            .is_success()
    );
    loop {
        let response = runner_call(&http, &base, "job", &jit).await;
        match response.status().as_u16() {
            200 => {
                let job: RunnerJob = response.json().await.expect("a job");
                tokio::time::sleep(Duration::from_millis(job.duration_ms)).await;
                let done = runner_call(&http, &base, "complete", &jit).await;
                assert!(done.status().is_success(), "{}", done.status());
                return;
            }
            204 => continue,
            other => panic!("the runner's job poll answered {other}"),
        }
    }
}

/// [`runner_pool`] running for a listener's target, until stopped.
struct Pool {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Pool {
    fn start(service: &Service, target: &MemoryScaleTarget) -> Self {
        let stop = CancellationToken::new();
        let task = tokio::spawn(runner_pool(
            service.client.clone(),
            service.fake.url().to_string(),
            service.scale_set.id,
            target.clone(),
            stop.clone(),
        ));
        Self { stop, task }
    }

    async fn stop(self) {
        self.stop.cancel();
        self.task.await.expect("the runner pool failed");
    }
}

/// Plays the EphemeralRunnerSet: keeps as many runners alive as the last
/// decision asks for, replacing those that finished their job.
async fn runner_pool(
    client: ActionsClient,
    base: String,
    scale_set_id: i64,
    target: MemoryScaleTarget,
    stop: CancellationToken,
) {
    let mut runners = JoinSet::new();
    let mut created = 0;
    while !stop.is_cancelled() {
        while let Some(finished) = runners.try_join_next() {
            finished.expect("a runner failed");
        }
        let wanted = target.current().map_or(0, |p| p.replicas) as usize;
        while runners.len() < wanted {
            created += 1;
            runners.spawn(ephemeral_runner(
                client.clone(),
                base.clone(),
                scale_set_id,
                format!("{LABEL}-runner-{created}"),
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    runners.abort_all();
}

#[tokio::test]
async fn a_burst_scales_from_zero_up_to_max_runners_and_back_to_zero() {
    burst_and_back(0).await;
}

#[tokio::test]
async fn a_warm_pool_of_min_runners_takes_a_burst_and_returns_to_min() {
    burst_and_back(1).await;
}

/// Six jobs on a scale set of `min`..=4 runners, with runners kept as the
/// decisions ask (the EphemeralRunnerSet's part): the decisions reach
/// maxRunners and never pass it, every job runs and is recorded on its
/// runner, and the decision returns to `min`.
async fn burst_and_back(min: u32) {
    let service = service().await;
    let running = start(&service, spec(&service, min, 4, None));
    let pool = Pool::start(&service, &running.target);

    // minRunners first, with nothing assigned.
    patches_until(&running.target, |p| {
        p.last().is_some_and(|p| p.replicas == min)
    })
    .await;
    service
        .fake
        .control()
        .enqueue_jobs(JobSpec::new(6, &[LABEL]).lasting(Duration::from_millis(300)));

    // Up to maxRunners (min + 6 assigned, capped at 4), never above it.
    patches_until(&running.target, |p| p.iter().any(|p| p.replicas == 4)).await;
    // Every job runs, and with nothing left the decision returns to min.
    service
        .fake
        .control()
        .wait_until(WAIT, |s| s.ledger.jobs_succeeded == 6)
        .await
        .unwrap_or_else(|s| panic!("the jobs did not all run: {:?}", s.jobs));
    // Once settled at min the last decision carries patch id 0, which lets
    // the EphemeralRunnerSet remove idle runners above min.
    let settled = ScalePatch {
        replicas: min,
        patch_id: 0,
    };
    let patches = patches_until(&running.target, |p| {
        p.last() == Some(&settled) && p.iter().any(|p| p.replicas == 4)
    })
    .await;
    assert!(patches.iter().all(|p| p.replicas <= 4), "{patches:?}");
    assert_ids_follow_arc(&patches, min);

    // Each job's start and end were recorded on the runner that ran it.
    let records = running
        .jobs
        .records()
        .wait_until(WAIT, |r| {
            r.iter()
                .filter(|r| matches!(r, JobRecord::Completed(_)))
                .count()
                == 6
        })
        .await
        .unwrap_or_else(|r| panic!("not every job was recorded: {r:#?}"));
    // A start the same message ended comes with its completion.
    let started: Vec<_> = records
        .iter()
        .filter_map(|r| match r {
            JobRecord::Started(s) => Some(s),
            JobRecord::Completed(c) => c.started.as_ref(),
        })
        .collect();
    assert_eq!(started.len(), 6, "{records:#?}");
    for job in &started {
        assert!(job.runner_name.starts_with("linux-runner-"), "{job:?}");
        assert_eq!(job.repository, "octo-org/app");
        assert_eq!(
            job.workflow_ref,
            "octo-org/app/.github/workflows/ci.yml@refs/heads/main"
        );
        assert!(!job.job_id.is_empty());
        let completed = records.iter().find_map(|r| match r {
            JobRecord::Completed(c) if c.runner_request_id == job.runner_request_id => Some(c),
            _ => None,
        });
        let completed = completed.unwrap_or_else(|| panic!("{job:?} never completed"));
        assert_eq!(completed.runner_name, job.runner_name);
        assert_eq!(completed.result, "succeeded");
    }

    // The decision's reason is on the status.
    let updates = running.status.updates().all();
    assert!(
        updates.iter().any(|u| matches!(u, StatusUpdate::Decision(d)
            if d.desired == 4 && d.policy == "builtin:default" && d.fallback_reason.is_none())),
        "{updates:#?}"
    );

    pool.stop().await;
    running.handle.stop().await.unwrap();
}

/// A job sink that notes, for each record, how many decisions the target
/// had been sent when it was written.
#[derive(Clone, Default)]
struct DecisionsAtRecord {
    target: MemoryScaleTarget,
    seen: std::sync::Arc<std::sync::Mutex<Vec<usize>>>,
}

impl DecisionsAtRecord {
    fn note(&self) {
        let decisions = self.target.patches().all().len();
        self.seen.lock().unwrap().push(decisions);
    }
}

impl JobSink for DecisionsAtRecord {
    async fn job_started(&self, _job: JobStarted) -> Result<(), ListenerError> {
        self.note();
        Ok(())
    }

    async fn job_completed(&self, _job: JobCompleted) -> Result<(), ListenerError> {
        self.note();
        Ok(())
    }
}

/// The decision a message leads to is sent before the message's job
/// records are written: under a burst those are a write each, and a
/// decision held up behind them counts runners that ended meanwhile as
/// missing, though its statistics still count their jobs.
#[tokio::test]
async fn a_decision_goes_out_before_the_job_records_of_its_message() {
    let service = service().await;
    let sink = DecisionsAtRecord::default();
    let handle = listener::spawn(
        service.client.clone(),
        loader(None),
        spec(&service, 0, 1, None),
        sink.target.clone(),
        sink.clone(),
        MemoryStatusSink::new(),
        &CancellationToken::new(),
    );
    let pool = Pool::start(&service, &sink.target);
    let control = service.fake.control();
    control.enqueue_jobs(JobSpec::new(1, &[LABEL]).lasting(Duration::from_millis(300)));
    control
        .wait_until(WAIT, |s| s.ledger.jobs_succeeded == 1)
        .await
        .unwrap_or_else(|s| panic!("the job did not run: {:?}", s.jobs));
    let first_record = || sink.seen.lock().unwrap().first().copied();
    let seen = eventually("the job is recorded", WAIT, || async { first_record() }).await;
    let patches = sink.target.patches().all();
    // The job's assignment asked for its runner; the next message (its
    // start, perhaps with its end) is a job event, so it is decided again,
    // with the next id, and that decision precedes its record.
    let assigned = patches
        .iter()
        .position(|p| p.replicas == 1)
        .unwrap_or_else(|| panic!("no decision asked for a runner: {patches:?}"));
    assert_eq!(
        seen,
        assigned + 2,
        "decisions sent when the first record was written; all: {patches:?}"
    );
    pool.stop().await;
    handle.stop().await.unwrap();
}

#[tokio::test]
async fn a_batch_window_gathers_the_job_events_of_a_burst_into_few_messages() {
    let service = service().await;
    let window = Duration::from_millis(600);
    let mut spec = spec(&service, 0, 4, None);
    spec.batch_window = window;
    let running = start(&service, spec);
    status_after(&running, 0, listening).await;
    let pool = Pool::start(&service, &running.target);
    let control = service.fake.control();
    let acks_before = control.counters().calls(Endpoint::DeleteMessage);
    let started = std::time::Instant::now();
    control.enqueue_jobs(JobSpec::new(12, &[LABEL]).lasting(Duration::from_millis(200)));

    // The first message of the burst is not held back: the decision
    // reaches maxRunners within the first window.
    patches_until(&running.target, |p| p.iter().any(|p| p.replicas == 4)).await;
    control
        .wait_until(WAIT, |s| s.ledger.jobs_succeeded == 12)
        .await
        .unwrap_or_else(|s| panic!("the jobs did not all run: {:?}", s.jobs));
    // Every start and end is still recorded, only in fewer messages (a
    // start that came in the message of its end, with the end).
    let starts_and_ends = |records: &[JobRecord]| {
        records
            .iter()
            .map(|r| match r {
                JobRecord::Started(_) => 1,
                JobRecord::Completed(c) => 1 + usize::from(c.started.is_some()),
            })
            .sum::<usize>()
    };
    running
        .jobs
        .records()
        .wait_until(WAIT, |r| starts_and_ends(r) == 24)
        .await
        .unwrap_or_else(|r| panic!("not every job was recorded: {r:#?}"));
    let elapsed = started.elapsed();
    // 48 job events (available, assigned, started, completed per job),
    // none of them a full message: at most two messages a window (one
    // polled early after its offers were acquired), the first at once.
    let messages = control.counters().calls(Endpoint::DeleteMessage) - acks_before;
    let bound = 2 * (1 + (elapsed.as_millis() / window.as_millis()) as u64);
    assert!(
        messages <= bound,
        "{messages} messages in {elapsed:?}: more than two per {window:?}"
    );
    assert!(messages < 48, "{messages} messages for 48 job events");

    pool.stop().await;
    running.handle.stop().await.unwrap();
}

#[tokio::test]
async fn a_burst_larger_than_a_message_is_acquired_in_back_to_back_polls() {
    let service = service().await;
    // A window no test waits out: anything taken within it was taken in
    // polls that did not wait.
    let mut spec = spec(&service, 0, 4, None);
    spec.batch_window = Duration::from_secs(60);
    let running = start(&service, spec);
    status_after(&running, 0, listening).await;
    let control = service.fake.control();
    // 120 offers: messages of 50, 50 and 20. The first two are full, so
    // the polls after them go at once; the third's offers are acquired
    // after an early poll too.
    control.enqueue_jobs(JobSpec::new(120, &[LABEL]).lasting(Duration::from_secs(60)));
    control
        .wait_until(Duration::from_secs(20), |s| {
            s.jobs
                .iter()
                .all(|j| j.phase != fake_actions::JobPhase::Available)
        })
        .await
        .unwrap_or_else(|s| panic!("offers left unacquired: {:?}", s.counters));
    running.handle.stop().await.unwrap();
}

#[tokio::test]
async fn the_policy_state_is_kept_between_decisions_of_a_scale_set() {
    let service = service().await;
    // The cooldown policy scales down only once demand has stayed lower for
    // a second, which it can only know from the state it wrote the last
    // time: without it, every decision would start the lull afresh.
    let policy = PolicyRef {
        builtin: Some("cooldown".into()),
        settings: Some(serde_json::json!({"scaleDownAfterSeconds": 1})),
        ..PolicyRef::default()
    };
    let running = start(&service, spec(&service, 0, 4, Some(policy)));
    let pool = Pool::start(&service, &running.target);
    service
        .fake
        .control()
        .enqueue_jobs(JobSpec::new(2, &[LABEL]).lasting(Duration::from_millis(100)));

    let decided = |prefix: &'static str, desired: u32| {
        move |u: &StatusUpdate| {
            matches!(u, StatusUpdate::Decision(d)
                if d.desired == desired && d.reason.starts_with(prefix) && d.policy == "builtin:cooldown")
        }
    };
    status_after(&running, 0, decided("scaling up at once", 2)).await;
    status_after(&running, 0, decided("holding 2", 2)).await;
    // Down to the highest demand of the lull: 0 when both ends came in one
    // message, 1 when the first came alone (then 0 a lull later).
    let down = |u: &StatusUpdate| {
        matches!(u, StatusUpdate::Decision(d)
            if d.desired < 2 && d.reason.starts_with("scaling down from 2 to ") && d.policy == "builtin:cooldown")
    };
    status_after(&running, 0, down).await;
    patches_until(&running.target, |p| {
        p.last().is_some_and(|p| p.replicas == 0)
    })
    .await;

    pool.stop().await;
    running.handle.stop().await.unwrap();
}

#[tokio::test]
async fn a_listener_resumes_the_patch_ids_of_the_one_before() {
    let service = service().await;
    let target = MemoryScaleTarget::holding(ScalePatch {
        replicas: 3,
        patch_id: 41,
    });
    let running = start_with(&service, spec(&service, 0, 5, None), loader(None), target);
    let patches = patches_until(&running.target, |p| p.len() == 2).await;
    assert_eq!(
        patches[1],
        ScalePatch {
            replicas: 0,
            patch_id: 42
        }
    );
    running.handle.stop().await.unwrap();
}

#[tokio::test]
async fn a_session_conflict_is_retried_until_the_other_session_is_gone() {
    let service = service().await;
    let control = service.fake.control();
    let other = service
        .client
        .create_message_session(service.scale_set.id, "another-host")
        .await
        .unwrap();
    let running = start(&service, spec(&service, 0, 2, None));

    status_after(&running, 0, retrying(Cause::SessionConflict)).await;
    // It keeps trying, and reports the conflict once, not once per try.
    control
        .wait_until(WAIT, |s| s.counters.calls(Endpoint::CreateSession) >= 4)
        .await
        .unwrap();
    let conflicts = running.status.updates().all();
    let conflict = retrying(Cause::SessionConflict);
    assert_eq!(
        conflicts.iter().filter(|u| conflict(u)).count(),
        1,
        "{conflicts:#?}"
    );
    assert!(running.target.patches().all().is_empty());

    other.close().await.unwrap();
    status_after(&running, 0, listening).await;
    patches_until(&running.target, |p| !p.is_empty()).await;
    running.handle.stop().await.unwrap();
}

#[tokio::test]
async fn a_deleted_scale_set_is_reported_and_retried_without_ending_the_listener() {
    let service = service().await;
    let control = service.fake.control();
    let running = listening_on(&service, 2).await;

    service
        .client
        .delete_runner_scale_set(service.scale_set.id)
        .await
        .unwrap();
    let seen = running.status.updates().all().len();
    status_after(&running, seen, retrying(Cause::ScaleSetNotFound)).await;
    let before = control.counters().calls(Endpoint::CreateSession);
    control
        .wait_until(WAIT, |s| {
            s.counters.calls(Endpoint::CreateSession) >= before + 3
        })
        .await
        .unwrap_or_else(|s| panic!("no more attempts: {:?}", s.counters));
    assert!(
        !running.handle.is_finished(),
        "the listener must keep trying"
    );
    running.handle.stop().await.unwrap();
    let last = running.status.updates().all();
    assert_eq!(last.last(), Some(&StatusUpdate::Health(Health::Stopped)));
}

#[tokio::test]
async fn an_outage_is_reported_and_the_listener_recovers() {
    let service = service().await;
    let control = service.fake.control();
    let running = listening_on(&service, 3).await;
    let seen = running.status.updates().all().len();

    // More failures than the client retries on its own.
    control.inject(Fault::new(Endpoint::GetMessage, FaultKind::status(503), 9));
    status_after(&running, seen, retrying(Cause::ServiceUnavailable)).await;
    control
        .wait_until(WAIT, |s| s.counters.faults(Endpoint::GetMessage) == 9)
        .await
        .unwrap();
    status_after(&running, seen, listening).await;

    // It is listening for real: the same session takes a new job and
    // scales for it.
    control.enqueue_jobs(JobSpec::new(1, &[LABEL]));
    patches_until(&running.target, |p| p.iter().any(|p| p.replicas == 1)).await;
    assert_eq!(control.counters().calls(Endpoint::CreateSession), 1);
    running.handle.stop().await.unwrap();
}

#[tokio::test]
async fn a_decision_the_target_refuses_is_reported_and_sent_again() {
    let service = service().await;
    let target = MemoryScaleTarget::new();
    target.refuse_next(2);
    let running = start_with(&service, spec(&service, 2, 4, None), loader(None), target);

    status_after(&running, 0, retrying(Cause::TargetUnavailable)).await;
    let patches = patches_until(&running.target, |p| !p.is_empty()).await;
    // The refused decisions used up ids 1 and 2; the one applied is the
    // third, so no id ever named a decision the target did not get. (A
    // second one, steady at min, may follow with id 0.)
    assert_eq!(
        patches[0],
        ScalePatch {
            replicas: 2,
            patch_id: 3
        }
    );
    status_after(&running, 0, listening).await;
    running.handle.stop().await.unwrap();
}

#[tokio::test]
async fn an_expired_queue_token_is_refreshed_without_a_new_session() {
    let service = service().await;
    let control = service.fake.control();
    let running = listening_on(&service, 3).await;

    control.expire_queue_tokens();
    let refreshed = control
        .wait_until(WAIT, |s| s.counters.calls(Endpoint::RefreshSession) == 1)
        .await
        .unwrap();
    // Two more polls begun: the one retried after the refresh was answered.
    let polls = refreshed.counters.calls(Endpoint::GetMessage);
    control
        .wait_until(WAIT, |s| {
            s.counters.calls(Endpoint::GetMessage) >= polls + 2
        })
        .await
        .unwrap();
    assert_eq!(control.counters().calls(Endpoint::CreateSession), 1);
    let updates = running.status.updates().all();
    assert!(
        !updates
            .iter()
            .any(|u| is_health(u, |h| matches!(h, Health::Retrying { .. }))),
        "{updates:#?}"
    );
    running.handle.stop().await.unwrap();
}

/// A client source whose answer the test changes, as editing the scale
/// set's Secret changes what the host's client cache gives.
#[derive(Clone)]
struct EditableSecret(std::sync::Arc<std::sync::Mutex<ActionsClient>>);

impl listener::ListenerClient for EditableSecret {
    async fn client(&self) -> Result<ActionsClient, String> {
        Ok(self.0.lock().unwrap().clone())
    }
}

#[tokio::test]
async fn a_rotated_credential_is_picked_up_by_the_session_without_a_restart() {
    let service = service().await;
    let control = service.fake.control();
    let secret = EditableSecret(std::sync::Arc::new(std::sync::Mutex::new(
        service.client.clone(),
    )));
    let target = MemoryScaleTarget::new();
    let status = MemoryStatusSink::new();
    let handle = listener::spawn(
        secret.clone(),
        loader(None),
        spec(&service, 0, 3, None),
        target.clone(),
        MemoryJobSink::new(),
        status.clone(),
        &CancellationToken::new(),
    );
    let running = Running {
        target,
        jobs: MemoryJobSink::new(),
        status,
        handle,
    };
    status_after(&running, 0, listening).await;
    let seen = running.status.updates().all().len();

    // The old PAT is revoked, and the queue token expires, so the session
    // needs the admin token, which the old PAT can no longer get.
    control.rotate_pat("ghp_rotated");
    control.expire_queue_tokens();
    control.enqueue_jobs(JobSpec::new(1, &[LABEL]));
    status_after(&running, seen, retrying(Cause::Unauthorized)).await;
    assert!(
        running
            .target
            .patches()
            .all()
            .iter()
            .all(|p| p.replicas == 0),
        "nothing scales while the credentials are refused"
    );

    // The Secret gets the new PAT: the same session goes on with it.
    let rotated = ActionsClient::new(
        ConfigUrl::parse(&service.fake.org_url("octo-org")).unwrap(),
        Credentials::Token(Secret::new("ghp_rotated")),
        fast_options(),
    )
    .unwrap();
    *secret.0.lock().unwrap() = rotated;
    patches_until(&running.target, |p| p.iter().any(|p| p.replicas == 1)).await;
    status_after(&running, seen, listening).await;
    assert_eq!(
        control.counters().calls(Endpoint::CreateSession),
        1,
        "the session was kept"
    );
    let jobs = control.jobs();
    assert!(
        jobs.iter()
            .all(|j| j.phase == fake_actions::JobPhase::Acquired),
        "the job offered while the credentials were refused was acquired: {jobs:?}"
    );
    running.handle.stop().await.unwrap();
}

#[tokio::test]
async fn a_session_the_service_dropped_is_reported_and_replaced() {
    let service = service().await;
    let control = service.fake.control();
    let running = listening_on(&service, 3).await;

    assert!(control.drop_session(running_scale_set(&service)));
    let seen = running.status.updates().all().len();
    status_after(&running, seen, retrying(Cause::SessionLost)).await;
    status_after(&running, seen, listening).await;
    assert_eq!(control.counters().calls(Endpoint::CreateSession), 2);
    assert!(control.has_session(running_scale_set(&service)));
    running.handle.stop().await.unwrap();
}

fn running_scale_set(service: &Service) -> u64 {
    u64::try_from(service.scale_set.id).unwrap()
}

#[tokio::test]
async fn shutdown_stops_polling_and_deletes_the_session() {
    let service = service().await;
    let control = service.fake.control();
    let running = listening_on(&service, 2).await;
    assert!(control.has_session(running_scale_set(&service)));

    running.handle.stop().await.unwrap();
    let counters = control.counters();
    assert_eq!(counters.calls(Endpoint::DeleteSession), 1);
    assert!(!control.has_session(running_scale_set(&service)));
    let polls = counters.calls(Endpoint::GetMessage);
    // A new session can be had at once: nothing holds the old one.
    service
        .client
        .create_message_session(service.scale_set.id, "next-host")
        .await
        .expect("the session was released");
    assert_eq!(control.counters().calls(Endpoint::GetMessage), polls);
    assert_eq!(
        running.status.updates().all().last(),
        Some(&StatusUpdate::Health(Health::Stopped))
    );
}

#[tokio::test]
async fn a_broken_scaling_policy_falls_back_to_the_default_and_is_reported() {
    let service = service().await;
    let policy = PolicyRef {
        builtin: Some("no-such-policy".into()),
        ..PolicyRef::default()
    };
    let running = start(&service, spec(&service, 2, 5, Some(policy)));
    let updates = status_after(&running, 0, |u| matches!(u, StatusUpdate::Decision(_))).await;
    assert!(
        updates.iter().any(|u| matches!(u, StatusUpdate::Policy {
            policy, event: PolicyEvent::LoadFailed { reason, message }
        } if policy == "builtin:no-such-policy" && reason == "unknown-builtin" && message.contains("no-such-policy"))),
        "{updates:#?}"
    );
    let decision = updates.iter().find_map(|u| match u {
        StatusUpdate::Decision(d) => Some(d),
        _ => None,
    });
    assert_eq!(decision.unwrap().policy, "builtin:default");
    patches_until(&running.target, |p| {
        p.last().is_some_and(|p| p.replicas == 2)
    })
    .await;
    running.handle.stop().await.unwrap();
}

#[tokio::test]
async fn a_scaling_policy_swapped_through_its_configmap_decides_the_next_time() {
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::Api;
    use kube::api::{ObjectMeta, PostParams};
    use sha2::Digest as _;

    let env = arcwright_harness::TestEnv::new("listener-policy-swap").await;
    let configmaps: Api<ConfigMap> = Api::namespaced(env.client(), env.namespace());
    let module = |wasm: &[u8]| {
        Some(BTreeMap::from([(
            "policy.wasm".to_string(),
            ByteString(wasm.to_vec()),
        )]))
    };
    // The first version holds runners through a lull (cooldown, five
    // minutes); the second is ARC's formula, which drops them at once.
    let first = bundled::find(PolicyKind::Scaling, "cooldown").unwrap().wasm;
    let second = bundled::find(PolicyKind::Scaling, "default").unwrap().wasm;
    configmaps
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: ObjectMeta {
                    name: Some("scaler".into()),
                    ..ObjectMeta::default()
                },
                binary_data: module(first),
                ..ConfigMap::default()
            },
        )
        .await
        .unwrap();

    let service = service().await;
    let policy = PolicyRef {
        config_map_ref: Some(ConfigMapPolicyRef {
            name: "scaler".into(),
            key: "policy.wasm".into(),
        }),
        ..PolicyRef::default()
    };
    let mut spec = spec(&service, 0, 5, Some(policy));
    spec.scale_set.namespace = env.namespace().to_string();
    let running = start_with(
        &service,
        spec,
        loader(Some(env.client())),
        MemoryScaleTarget::new(),
    );
    let loaded = |wasm: &[u8]| {
        let sha256 = hex::encode(sha2::Sha256::digest(wasm));
        move |u: &StatusUpdate| matches!(u, StatusUpdate::Policy { event: PolicyEvent::Loaded { sha256: s }, .. } if *s == sha256)
    };
    status_after(&running, 0, loaded(first)).await;
    let pool = Pool::start(&service, &running.target);
    service
        .fake
        .control()
        .enqueue_jobs(JobSpec::new(2, &[LABEL]).lasting(Duration::from_millis(100)));
    let label = format!("configmap:{}/scaler", env.namespace());
    let decided = |prefix: &'static str, desired: u32| {
        let label = label.clone();
        move |u: &StatusUpdate| {
            matches!(u, StatusUpdate::Decision(d)
                if d.policy == label && d.desired == desired && d.reason.starts_with(prefix))
        }
    };
    // The jobs ran; the first version holds the two runners.
    status_after(&running, 0, decided("holding 2", 2)).await;
    let applied = running.target.patches().all().len();

    let mut cm = configmaps.get("scaler").await.unwrap();
    cm.binary_data = module(second);
    configmaps
        .replace("scaler", &PostParams::default(), &cm)
        .await
        .unwrap();
    status_after(&running, 0, loaded(second)).await;
    // The next decision is the second version's: down to zero at once.
    status_after(&running, 0, decided("minRunners 0 + assignedJobs 0", 0)).await;
    let patches = patches_until(&running.target, |p| {
        p.len() > applied && p.last().is_some_and(|p| p.replicas == 0)
    })
    .await;
    assert_ids_follow_arc(&patches, 0);
    pool.stop().await;
    assert!(!running.handle.is_finished(), "no restart was needed");
    running.handle.stop().await.unwrap();
}
