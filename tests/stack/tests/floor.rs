//! The scale benchmark's quick form, floor included, so that neither can
//! rot: a few jobs through arcwright and then through the floor on the same
//! stack, and a report line with every figure. No timing is asserted; what
//! a job costs (requests, writes, calls) is, within bounds.

use arcwright_stack::bench::{self, Arrival, BenchOptions};

#[tokio::test]
async fn the_floor_runs_the_same_jobs_after_arcwright_and_gives_a_ratio() {
    let options = BenchOptions {
        jobs: 10,
        arrival: Arrival::Burst,
        max_runners: 3,
        job_ms: 300,
        jitter_pct: 0,
        seed: 1,
        protect_busy_runners: false,
        // A finished runner renewed in place when a job waits for it.
        host_args: vec![
            "--renew-in-place".to_owned(),
            "--log-level".to_owned(),
            std::env::var("FLOOR_LOG").unwrap_or("info".into()),
        ],
    };
    let report = bench::run(&options, &|line| eprintln!("bench: {line}"))
        .await
        .expect("the benchmark runs, the floor included");
    // `run` itself checks the ledger after each part (every job succeeded,
    // no registration left behind); what it measured on the way:
    assert_eq!(report.jobs, 10);
    assert_eq!(report.floor_jobs, 10, "the floor did every job: {report}");
    assert!(!report.floor_wall.is_zero(), "{report}");
    let ratio = report.floor_ratio();
    assert!(ratio.is_finite() && ratio > 0.0, "{ratio}: {report}");
    let line = report.to_string();
    eprintln!("{line}");
    assert!(
        line.contains(" floor_jobs_per_s=") && line.contains(" floor_ratio="),
        "{line}"
    );
    // What a job costs, counted, with room for a slow machine's retries:
    // about 9 requests, 8 writes and 1.8 Actions calls a job at this size
    // (a set scaling from zero to three for ten jobs pays its runners'
    // creation and deletion over few jobs). A runner renewed by its set
    // under the next decision instead of in place costs about 2 writes
    // more a job; a reconcile that read its pod and Secret from the API
    // server again, or a runner set that listed its runners on every
    // pass, 8 to 9 more requests.
    let per_job = |n: u64| n as f64 / report.jobs as f64;
    assert!(
        per_job(report.apiserver_requests) <= REQUESTS_PER_JOB,
        "{line}"
    );
    assert!(per_job(report.apiserver_writes) <= WRITES_PER_JOB, "{line}");
    assert!(
        per_job(report.actions_calls) <= ACTIONS_CALLS_PER_JOB,
        "{line}"
    );
}

/// The bounds on what a job costs in this run.
const REQUESTS_PER_JOB: f64 = 12.0;
const WRITES_PER_JOB: f64 = 9.0;
const ACTIONS_CALLS_PER_JOB: f64 = 3.0;
