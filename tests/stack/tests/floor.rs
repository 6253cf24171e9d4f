//! The scale benchmark's quick form, floor included, so that neither can
//! rot: a few jobs through arcwright and then through the floor on the same
//! stack, and a report line with every figure. No timing is asserted.

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
        host_args: Vec::new(),
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
    assert!(
        line.contains(" floor_jobs_per_s=") && line.contains(" floor_ratio="),
        "{line}"
    );
}
