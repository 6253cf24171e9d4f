//! Jobs assigned to a scale set, as a listener sees them when it scales only
//! on `statistics.totalAssignedJobs`, which is what GitHub's scale-set
//! library tells every client to do: the assignment is a message, a job no
//! runner takes comes back, and the listener's capacity bounds it all.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use fake_actions::{FakeActions, FakeConfig, JobPhase, JobSpec, MAX_REQUEUES};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::task::JoinSet;

/// Far longer than any of these tests needs; reached only when the fake
/// never gives the listener what it waits for.
const PATIENCE: Duration = Duration::from_secs(60);

/// A fake with a short long poll, one scale set, and a listener's session.
struct World {
    fake: Arc<FakeActions>,
    http: reqwest::Client,
    admin: Admin,
    set: u64,
    session: Session,
}

async fn world(name: &str, labels: &[&str]) -> World {
    let fake = Arc::new(
        start(FakeConfig {
            long_poll: Duration::from_millis(200),
            ..FakeConfig::default()
        })
        .await,
    );
    let http = http();
    let admin = register(&http, &fake, "org").await;
    let set = scale_set(&http, &admin, name, labels).await;
    let session = session(&http, &admin, set).await;
    World {
        fake,
        http,
        admin,
        set,
        session,
    }
}

/// The job messages of a 200 answer, after acknowledging it and acquiring
/// every job it offers, as a listener does; `None` for an empty long poll.
async fn handle(
    http: &reqwest::Client,
    admin: &Admin,
    session: &Session,
    set: u64,
    answer: &Answer,
) -> Option<Vec<Value>> {
    match answer.status {
        StatusCode::ACCEPTED => return None,
        StatusCode::OK => {}
        other => panic!("the poll failed with {other}: {answer:?}"),
    }
    let id = answer.json["messageId"].as_u64().unwrap();
    assert_eq!(
        session.delete(http, id).await.status,
        StatusCode::NO_CONTENT
    );
    let items = items(&answer.json);
    let offered: Vec<u64> = items
        .iter()
        .filter(|m| m["messageType"] == "JobAvailable")
        .map(|m| m["runnerRequestId"].as_u64().unwrap())
        .collect();
    if !offered.is_empty() {
        let acquired = session.acquire(http, admin, set, &offered).await;
        assert_eq!(acquired.status, StatusCode::OK, "{acquired:?}");
    }
    Some(items)
}

/// An ephemeral runner started from its JIT config: comes online, waits
/// for its job, works on it for its duration, reports it done.
async fn run_one_job(http: reqwest::Client, fake: Arc<FakeActions>, jit: String) {
    let connected = runner(&http, &fake, "connect", &jit).await;
    assert_eq!(connected.status, StatusCode::OK, "{connected:?}");
    loop {
        let job = runner(&http, &fake, "job", &jit).await;
        match job.status {
            StatusCode::NO_CONTENT => continue,
            StatusCode::OK => {
                let ms = job.json["durationMs"].as_u64().unwrap();
                tokio::time::sleep(Duration::from_millis(ms)).await;
                let done = runner(&http, &fake, "complete", &jit).await;
                assert_eq!(done.status, StatusCode::OK, "{done:?}");
                return;
            }
            other => panic!("the runner's job poll failed with {other}: {job:?}"),
        }
    }
}

fn time(item: &Value, field: &str) -> jiff::Timestamp {
    item[field]
        .as_str()
        .unwrap_or_else(|| panic!("{field} missing from {item}"))
        .parse()
        .unwrap_or_else(|e| panic!("{field} of {item} is not ISO 8601: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_scaling_on_statistics_alone_runs_every_job() {
    const JOBS: u32 = 10;
    const MAX_RUNNERS: u64 = 4;
    let World {
        fake,
        http,
        admin,
        set,
        session,
    } = world("stats-set", &["linux"]).await;
    fake.control()
        .enqueue_jobs(JobSpec::new(JOBS, &["linux"]).lasting(Duration::from_millis(20)));

    // minRunners 0: the desired count is min(0 + totalAssignedJobs,
    // maxRunners), from the session's statistics and then the latest
    // message's, kept through empty polls; runners that finished their job
    // are gone, so only live ones count towards it.
    let control = fake.control();
    let mut assigned = session.json["statistics"]["totalAssignedJobs"]
        .as_u64()
        .unwrap();
    let mut seen: Vec<Value> = Vec::new();
    let mut runners = JoinSet::new();
    let mut started = 0;
    let mut last = 0;
    let listening = async {
        while control.ledger().jobs_unfinished > 0 {
            let answer = session.poll(&http, last, MAX_RUNNERS).await;
            if let Some(items) = handle(&http, &admin, &session, set, &answer).await {
                last = answer.json["messageId"].as_u64().unwrap();
                assigned = answer.json["statistics"]["totalAssignedJobs"]
                    .as_u64()
                    .unwrap();
                seen.extend(items);
            }
            while let Some(finished) = runners.try_join_next() {
                finished.expect("a runner ran its job");
            }
            let desired = assigned.min(MAX_RUNNERS);
            for _ in runners.len() as u64..desired {
                let (_, jit) = jit(&http, &admin, set, &format!("stats-set-{started}")).await;
                started += 1;
                runners.spawn(run_one_job(http.clone(), fake.clone(), jit));
            }
        }
    };
    if tokio::time::timeout(PATIENCE, listening).await.is_err() {
        panic!(
            "the jobs never all ran: {:?}; the listener saw {:?}",
            control.snapshot(),
            seen.iter()
                .map(|m| m["messageType"].as_str().unwrap_or_default())
                .collect::<Vec<_>>()
        );
    }

    let ledger = control.ledger();
    assert_eq!(ledger.jobs_succeeded, u64::from(JOBS), "{ledger:?}");
    assert_eq!(ledger.jobs_cancelled, 0, "{ledger:?}");
    assert_eq!(ledger.jobs_cancelled_unclaimed, 0, "{ledger:?}");
    assert_eq!(ledger.jobs_requeued, 0, "{ledger:?}");
    assert!(started >= u64::from(JOBS), "one ephemeral runner per job");

    // The durations a listener computes from these are never negative.
    let completed: Vec<&Value> = seen
        .iter()
        .filter(|m| m["messageType"] == "JobCompleted")
        .collect();
    assert!(!completed.is_empty());
    for item in seen.iter().filter(|m| m["messageType"] != "JobAvailable") {
        let assign = time(item, "scaleSetAssignTime");
        if item["messageType"] == "JobAssigned" {
            continue;
        }
        let runner = time(item, "runnerAssignTime");
        assert!(assign <= runner, "{item}");
        if item["messageType"] == "JobCompleted" {
            assert_eq!(item["result"], "succeeded");
            assert!(runner <= time(item, "finishTime"), "{item}");
        }
    }
}

#[tokio::test]
async fn a_job_no_runner_takes_is_cancelled_offered_again_and_given_up_after_three_times() {
    let World {
        fake,
        http,
        admin,
        set,
        session,
    } = world("idle-set", &[]).await;
    // The knob, through the control API as a script would turn it.
    let settings = format!("{}/_fake/settings", fake.url());
    let patch = async |body: Value| call(&http, Method::PATCH, &settings, None, Some(body)).await;
    let misspelt = patch(json!({"assignment_timeout": 100})).await;
    assert_eq!(misspelt.status, StatusCode::BAD_REQUEST, "{misspelt:?}");
    let changed = patch(json!({"assignment_timeout_ms": 100})).await;
    assert_eq!(changed.json, json!({"assignment_timeout_ms": 100}));
    assert_eq!(
        fake.control().settings().assignment_timeout,
        Duration::from_millis(100)
    );

    let ids = fake.control().enqueue_jobs(JobSpec::new(1, &[]));

    // A listener that acquires what is offered and never scales.
    let cancellations = |seen: &[Value]| {
        seen.iter()
            .filter(|m| m["messageType"] == "JobCompleted")
            .count()
    };
    let mut seen: Vec<Value> = Vec::new();
    let mut last = 0;
    let listening = async {
        while cancellations(&seen) <= MAX_REQUEUES as usize {
            let answer = session.poll(&http, last, 10).await;
            if let Some(items) = handle(&http, &admin, &session, set, &answer).await {
                last = answer.json["messageId"].as_u64().unwrap();
                seen.extend(items);
            }
        }
    };
    tokio::time::timeout(PATIENCE, listening)
        .await
        .unwrap_or_else(|_| panic!("the job was never given up: {seen:?}"));

    let mut expected = vec!["JobAvailable"];
    for _ in 0..MAX_REQUEUES {
        expected.extend(["JobAssigned", "JobCompleted", "JobAvailable"]);
    }
    expected.extend(["JobAssigned", "JobCompleted"]);
    let kinds: Vec<&str> = seen
        .iter()
        .map(|m| m["messageType"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, expected);
    for item in &seen {
        assert_eq!(item["runnerRequestId"], ids[0]);
        if item["messageType"] == "JobCompleted" {
            assert_eq!(item["result"], "canceled");
            assert!(item.get("runnerAssignTime").is_none(), "no runner: {item}");
            assert!(time(item, "scaleSetAssignTime") <= time(item, "finishTime"));
        }
    }

    let control = fake.control();
    let job = &control.jobs()[0];
    assert_eq!(
        (job.phase, job.result.as_deref(), job.requeues),
        (JobPhase::Finished, Some("canceled"), MAX_REQUEUES)
    );
    let ledger = control.ledger();
    assert_eq!(
        ledger.jobs_cancelled_unclaimed,
        u64::from(MAX_REQUEUES) + 1,
        "{ledger:?}"
    );
    assert_eq!(ledger.jobs_requeued, u64::from(MAX_REQUEUES));
    assert_eq!(ledger.jobs_cancelled, 1);
    assert_eq!(ledger.jobs_unfinished, 0);
}

#[tokio::test]
async fn the_max_capacity_a_listener_polls_with_bounds_what_is_assigned() {
    let World {
        fake,
        http,
        admin,
        set,
        session,
    } = world("small-set", &[]).await;
    let control = fake.control();
    control.enqueue_jobs(JobSpec::new(5, &[]).lasting(Duration::ZERO));

    let offered = session.poll(&http, 0, 2).await;
    assert_eq!(kinds(&offered.json), ["JobAvailable"; 5]);
    handle(&http, &admin, &session, set, &offered).await;
    assert_eq!(control.scale_sets()[0].max_capacity, Some(2));
    // Assignment happens within the acquisition, so this is where it
    // settled, not a moment of a race.
    let phases = || control.jobs().iter().map(|j| j.phase).collect::<Vec<_>>();
    use JobPhase::{Acquired, Held};
    assert_eq!(phases(), [Acquired, Acquired, Held, Held, Held]);

    let mut last = offered.json["messageId"].as_u64().unwrap();
    let mut next = async |capacity: u64| {
        let answer = session.poll(&http, last, capacity).await;
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        last = answer.json["messageId"].as_u64().unwrap();
        session.delete(&http, last).await;
        answer.json
    };
    let assigned = next(2).await;
    assert_eq!(kinds(&assigned), ["JobAssigned"; 2]);
    assert_eq!(assigned["statistics"]["totalAssignedJobs"], 2);
    assert_eq!(assigned["statistics"]["totalAcquiredJobs"], 5);

    // A runner finishing a job frees its place for the oldest held job.
    let (_, jit) = jit(&http, &admin, set, "small-set-0").await;
    run_one_job(http.clone(), fake.clone(), jit).await;
    let after = next(2).await;
    assert_eq!(kinds(&after), ["JobStarted", "JobCompleted", "JobAssigned"]);
    assert_eq!(after["statistics"]["totalAssignedJobs"], 2);

    // A listener with more room gets the rest with its next poll.
    let rest = next(10).await;
    assert_eq!(kinds(&rest), ["JobAssigned"; 2]);
    assert_eq!(rest["statistics"]["totalAssignedJobs"], 4);
    assert_eq!(rest["statistics"]["totalAcquiredJobs"], 4);

    let garbage = http
        .get(&session.queue_url)
        .header("Authorization", session.bearer())
        .header("X-ScaleSetMaxCapacity", "lots")
        .send()
        .await
        .unwrap();
    assert_eq!(garbage.status(), StatusCode::BAD_REQUEST);
    let error: Value = garbage.json().await.unwrap();
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("X-ScaleSetMaxCapacity"),
        "{error}"
    );
}
