//! The fleet benchmark's quick form, so that it cannot rot: a few scale
//! sets through every phase the full run goes through (created, listening,
//! the host restarted and every set listening again, idle, a burst spread
//! over all of them, the same jobs through the floor), and a report line
//! with every figure.

use arcwright_stack::fleet::{self, FleetOptions};

#[tokio::test]
async fn a_small_fleet_listens_again_after_a_restart_and_runs_its_jobs() {
    let options = FleetOptions {
        scale_sets: 4,
        min_runners: 0,
        max_runners: 2,
        idle_s: 3,
        jobs: 10,
        job_ms: 300,
        long_poll_s: 50,
        bound_secs: 300,
        floor: true,
        host_args: Vec::new(),
    };
    let report = fleet::run(&options, &|line| eprintln!("fleet: {line}"))
        .await
        .expect("the fleet runs");
    // `run` itself waits until every set holds a session again after the
    // restart and until every job succeeded; what it measured on the way:
    assert_eq!(report.scale_sets, 4);
    assert_eq!(report.jobs, 10);
    assert!(!report.ready.is_zero(), "{report}");
    assert!(
        report.idle_rss_bytes > 0 && report.baseline_rss_bytes > 0,
        "{report}"
    );
    assert!(
        report.peak_rss_bytes >= report.idle_rss_bytes,
        "the lifetime peak covers the idle samples: {report}"
    );
    assert!(report.p95_wait >= report.p50_wait, "{report}");
    assert!(
        report.jobs_actions_calls >= 10,
        "a JIT config per job at least: {report}"
    );
    assert!(report.jobs_apiserver.writes > 0, "{report}");
    assert!(report.floor_jobs_per_s.is_some_and(|f| f > 0.0), "{report}");
    let line = report.to_string();
    eprintln!("{line}");
    // What a job costs through the burst and its runners' cleanup,
    // counted, with room for a slow machine's retries (four sets scaling
    // from zero for ten jobs).
    let per_job = |n: u64| n as f64 / report.jobs as f64;
    assert!(per_job(report.jobs_apiserver.total) <= 24.0, "{line}");
    assert!(per_job(report.jobs_apiserver.writes) <= 16.0, "{line}");
    for field in [
        "scale_sets=",
        "ready_s=",
        "settled_s=",
        "restart_requests_per_set=",
        "idle_rss_mib=",
        "idle_cpu_pct=",
        "idle_actions_calls_per_set_min=",
        "idle_apiserver_requests_min=",
        "jobs_per_s=",
        "p50_wait_ms=",
        "p95_wait_ms=",
        "peak_rss_mib=",
        "rss_per_set_kib=",
        "actions_calls_per_job=",
        "actions_calls_lower_bound=",
        "apiserver_writes_per_job=",
        "floor_ratio=",
    ] {
        assert!(line.contains(field), "{field} in {line}");
    }
}
