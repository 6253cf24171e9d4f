//! The ledger adds up when many clients race: runners created, taking jobs,
//! completing them, vanishing and being removed all at once, while a
//! listener acquires jobs.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::*;
use fake_actions::{FakeConfig, JobSpec};
use reqwest::{Method, StatusCode};

#[derive(Default)]
struct Tally {
    created: AtomicU64,
    completed: AtomicU64,
    removed_204: AtomicU64,
    refused: AtomicU64,
    vanished: AtomicU64,
}

const WORKERS: u64 = 8;
const ROUNDS: u64 = 12;
const JOBS: u32 = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ledger_adds_up_under_concurrent_use() {
    let fake = Arc::new(
        start(FakeConfig {
            long_poll: Duration::from_millis(150),
            ..FakeConfig::default()
        })
        .await,
    );
    let http = http();
    let admin = register(&http, &fake, "org").await;
    let set = scale_set(&http, &admin, "set", &["linux"]).await;
    let session = Arc::new(session(&http, &admin, set).await);
    let enqueued = fake
        .control()
        .enqueue_jobs(JobSpec::new(JOBS, &["linux"]).lasting(Duration::ZERO));
    assert_eq!(enqueued.len(), JOBS as usize);

    // The listener: read, acknowledge, acquire what is offered.
    let stop = Arc::new(AtomicBool::new(false));
    let listener = {
        let (http, admin, session, stop) =
            (http.clone(), admin.clone(), session.clone(), stop.clone());
        tokio::spawn(async move {
            let mut last = 0;
            while !stop.load(Ordering::Relaxed) {
                let message = session.get(&http, last).await;
                if message.status != StatusCode::OK {
                    continue;
                }
                last = message.json["messageId"].as_u64().unwrap();
                let offered: Vec<u64> = items(&message.json)
                    .iter()
                    .filter(|m| m["messageType"] == "JobAvailable")
                    .map(|m| m["runnerRequestId"].as_u64().unwrap())
                    .collect();
                session.delete(&http, last).await;
                if !offered.is_empty() {
                    session.acquire(&http, &admin, set, &offered).await;
                }
            }
        })
    };

    let tally = Arc::new(Tally::default());
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let (http, admin, fake, tally) = (http.clone(), admin.clone(), fake.clone(), tally.clone());
        workers.push(tokio::spawn(async move {
            for round in 0..ROUNDS {
                let (id, config) = jit(&http, &admin, set, &format!("w{w}-r{round}")).await;
                tally.created.fetch_add(1, Ordering::Relaxed);
                runner(&http, &fake, "connect", &config).await;
                let remove = || async {
                    let answer = admin
                        .call(
                            &http,
                            Method::DELETE,
                            &format!("distributedtask/pools/0/agents/{id}"),
                            None,
                        )
                        .await;
                    match answer.status {
                        StatusCode::NO_CONTENT => tally.removed_204.fetch_add(1, Ordering::Relaxed),
                        StatusCode::BAD_REQUEST => tally.refused.fetch_add(1, Ordering::Relaxed),
                        other => panic!("unexpected {other} removing runner {id}"),
                    };
                    answer.status
                };
                match (w + round) % 3 {
                    // A runner that works: takes a job if one comes, finishes it.
                    0 => {
                        let job = runner(&http, &fake, "job", &config).await;
                        if job.status == StatusCode::OK {
                            // While it runs, a removal is refused.
                            assert_eq!(remove().await, StatusCode::BAD_REQUEST);
                            let done = runner(&http, &fake, "complete", &config).await;
                            assert_eq!(done.status, StatusCode::OK, "{done:?}");
                            tally.completed.fetch_add(1, Ordering::Relaxed);
                        } else {
                            // Scaled down idle; a job may have been assigned
                            // in between, which the removal cancels.
                            remove().await;
                        }
                    }
                    // Scaled down as soon as it came up.
                    1 => {
                        remove().await;
                    }
                    // Its pod is killed, maybe mid-job; then it is removed.
                    _ => {
                        runner(&http, &fake, "job", &config).await;
                        let gone = runner(&http, &fake, "vanished", &config).await;
                        assert_eq!(gone.status, StatusCode::NO_CONTENT);
                        tally.vanished.fetch_add(1, Ordering::Relaxed);
                        assert_eq!(remove().await, StatusCode::NO_CONTENT);
                    }
                }
                // Removing twice is harmless and counted as absent.
                if round % 4 == 0 {
                    remove().await;
                }
            }
        }));
    }
    for worker in workers {
        worker.await.expect("a worker finished");
    }

    // Drain: well-behaved runners until every job has finished.
    let control = fake.control();
    for n in 0.. {
        if control.ledger().jobs_unfinished == 0 {
            break;
        }
        assert!(n < 400, "jobs never drained: {:?}", control.ledger());
        let (_, config) = jit(&http, &admin, set, &format!("drain-{n}")).await;
        tally.created.fetch_add(1, Ordering::Relaxed);
        runner(&http, &fake, "connect", &config).await;
        let job = runner(&http, &fake, "job", &config).await;
        if job.status == StatusCode::OK {
            runner(&http, &fake, "complete", &config).await;
            tally.completed.fetch_add(1, Ordering::Relaxed);
        } else {
            runner(&http, &fake, "vanished", &config).await;
            let id = fake_actions::JitConfig::decode(&config).unwrap().runner_id;
            let answer = admin
                .call(
                    &http,
                    Method::DELETE,
                    &format!("distributedtask/pools/0/agents/{id}"),
                    None,
                )
                .await;
            assert_eq!(answer.status, StatusCode::NO_CONTENT);
            tally.removed_204.fetch_add(1, Ordering::Relaxed);
            tally.vanished.fetch_add(1, Ordering::Relaxed);
        }
    }
    stop.store(true, Ordering::Relaxed);
    listener.await.unwrap();

    let ledger = control.ledger();
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    // Registrations: every one created is accounted for, and none leaked.
    assert_eq!(ledger.runners_created, load(&tally.created), "{ledger:?}");
    assert_eq!(
        ledger.runners_created,
        ledger.runners_removed + ledger.still_registered,
        "{ledger:?}"
    );
    assert_eq!(
        ledger.runners_removed,
        ledger.removed_by_api + ledger.self_deregistered + ledger.removed_with_scale_set,
        "{ledger:?}"
    );
    assert_eq!(ledger.still_registered, 0, "{ledger:?}");
    assert!(control.runners().is_empty());
    assert_eq!(ledger.self_deregistered, load(&tally.completed));
    assert_eq!(
        ledger.removed_by_api + ledger.remove_calls_for_absent_runners,
        load(&tally.removed_204),
        "{ledger:?}"
    );
    assert_eq!(
        ledger.remove_calls_refused_job_running,
        load(&tally.refused)
    );

    // Jobs: every one enqueued ended exactly once.
    assert_eq!(ledger.jobs_enqueued, u64::from(JOBS));
    assert_eq!(ledger.jobs_unfinished, 0);
    assert_eq!(
        ledger.jobs_enqueued,
        ledger.jobs_succeeded + ledger.jobs_failed + ledger.jobs_cancelled,
        "{ledger:?}"
    );
    assert_eq!(ledger.jobs_succeeded, load(&tally.completed));
    // Each cancellation by the service (a runner vanished, or no runner
    // took the job in time) was either requeued or final; no job here is
    // cancelled by its own spec.
    assert_eq!(
        ledger.jobs_cancelled_runner_vanished + ledger.jobs_cancelled_unclaimed,
        ledger.jobs_requeued + ledger.jobs_cancelled,
        "{ledger:?}"
    );
    // The races this test is for did happen.
    assert!(ledger.jobs_cancelled_runner_vanished > 0, "{ledger:?}");
    assert!(ledger.remove_calls_refused_job_running > 0, "{ledger:?}");
}
