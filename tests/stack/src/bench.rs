//! The scale benchmark: N jobs at once through one scale set of at most M
//! runners, measured end to end.
//!
//! Where each figure comes from:
//!
//! - waits, scale-up and cleanup: the [`Recorder`]'s timeline (the fake's
//!   job phases on every change, the pods through a watch). Wait is job
//!   enqueued to job running; scale-up is the burst enqueued to
//!   `min(N, M)` runner pods existing; cleanup is a job finished to the pod
//!   that ran it deleted from the API server.
//! - Actions calls: the fake's per-endpoint counters, every endpoint but the
//!   four only runners call, from the burst to the last pod gone (so
//!   removals and acknowledgements after the last job count; the set-up
//!   before the burst, creating the scale set and its session, does not).
//! - API server requests and writes: the API server's audit log, counting
//!   the requests of the host's ServiceAccount received in the same window
//!   (`apiserver_request_total` has no per-client label; see
//!   [`crate::audit`]).
//! - host CPU: `/proc/PID/stat` (user + system) over the same window; peak
//!   RSS: `VmHWM` of `/proc/PID/status`, the process's lifetime peak.
//!
//! Runs are reproducible: the scenario is fixed by its flags, and the only
//! randomness, the jitter of job durations (`--jitter-pct`, 0 by default),
//! is drawn from `--seed`.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use fake_actions::{FakeConfig, JobSpec};
use kube::api::ListParams;
use rand::{Rng, SeedableRng};

use crate::stats::{BenchReport, first_reaching, intervals, peak, percentile};
use crate::timeline::Recorder;
use crate::{ScaleSet, Stack, StackConfig};

/// The scale set's name, and the jobs' only label.
const SET: &str = "bench";

/// One benchmark run; also `bench-scale`'s command line.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchOptions {
    /// Jobs, all enqueued at once.
    #[arg(long, default_value_t = 200)]
    pub jobs: u32,
    /// The scale set's maxRunners (minRunners is 0).
    #[arg(long, default_value_t = 20)]
    pub max_runners: u32,
    /// How long each job runs once started, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub job_ms: u64,
    /// Vary each job's duration by up to this percentage either way.
    #[arg(long, default_value_t = 0)]
    pub jitter_pct: u32,
    /// Seeds the jitter: the same seed gives the same scenario.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Run the set with `protectBusyRunners`: what drain protection costs
    /// shows in the API writes per job.
    #[arg(long)]
    pub protect_busy_runners: bool,
    /// Extra `arcwright run` flags, after `--`.
    #[arg(last = true)]
    pub host_args: Vec<String>,
}

/// The job durations of a run, in milliseconds: `job_ms` each, varied by
/// up to `jitter_pct` % either way, drawn from `seed`.
pub fn durations(jobs: u32, job_ms: u64, jitter_pct: u32, seed: u64) -> Vec<u64> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let spread = job_ms * u64::from(jitter_pct.min(100)) / 100;
    (0..jobs)
        .map(|_| {
            if spread == 0 {
                job_ms
            } else {
                job_ms - spread + rng.random_range(0..=2 * spread)
            }
        })
        .collect()
}

/// Runs the benchmark on a stack of its own and returns the figures.
/// `progress` is told what is happening (for a person watching).
pub async fn run(options: &BenchOptions, progress: &dyn Fn(&str)) -> Result<BenchReport> {
    let BenchOptions {
        jobs,
        max_runners,
        job_ms,
        jitter_pct,
        seed,
        protect_busy_runners,
        host_args,
    } = options.clone();
    if jobs == 0 || max_runners == 0 {
        bail!("--jobs and --max-runners must be at least 1");
    }
    progress("starting the control plane, the fake, the simulator and arcwright");
    let mut config = StackConfig::new("bench");
    config.audit = true;
    config.host_args = host_args;
    config.fake = FakeConfig {
        // A job waits for its runner as long as the burst may take.
        assignment_timeout: Duration::from_secs(3600),
        ..FakeConfig::default()
    };
    let stack = Stack::start(config).await?;
    let max = i32::try_from(max_runners).context("--max-runners is too large")?;
    let mut set = ScaleSet::new(SET, 0, max);
    if protect_busy_runners {
        set = set.with("protectBusyRunners", serde_json::json!(true));
    }
    stack.create_scale_set(&set).await?;
    stack.listening(SET).await?;
    let recorder = Recorder::start(stack.fake().control(), stack.client(), stack.namespace());

    // When the decision (the EphemeralRunnerSet's replicas) first reached
    // the target: beside the pods' own scale-up, it tells the listener's
    // share of the time from the runner controllers'.
    let target = usize::try_from(jobs.min(max_runners))?;
    let decided = std::sync::Arc::new(std::sync::Mutex::new(None::<Instant>));
    let watch = {
        let decided = decided.clone();
        let stream = kube::runtime::watcher::watcher(
            stack.runner_sets(),
            kube::runtime::watcher::Config::default(),
        );
        tokio::spawn(async move {
            use futures::StreamExt;
            use kube::runtime::WatchStreamExt;
            let mut stream = std::pin::pin!(stream.applied_objects());
            while let Some(Ok(set)) = stream.next().await {
                if usize::try_from(set.spec.replicas).unwrap_or(0) >= target {
                    let mut decided = decided.lock().unwrap_or_else(|p| p.into_inner());
                    decided.get_or_insert_with(Instant::now);
                }
            }
        })
    };

    let host = stack.host().context("the host runs")?;
    let cpu_before = host.usage()?.cpu;
    let neighbours_before = stack.neighbour_cpu()?;
    let calls_before = stack.host_actions_calls_by_endpoint();
    let window_start = jiff::Timestamp::now();
    progress(&format!("enqueueing {jobs} jobs"));
    let started = Instant::now();
    let control = stack.fake().control();
    for (ms, count) in runs(&durations(jobs, job_ms, jitter_pct, seed)) {
        let ids =
            control.enqueue_jobs(JobSpec::new(count, &[SET]).lasting(Duration::from_millis(ms)));
        recorder.enqueued(&ids, started);
    }
    // At most ten times the ideal, plus start-up: a stuck run fails
    // instead of hanging CI.
    let ideal = Duration::from_millis(job_ms * u64::from(jobs.div_ceil(max_runners)));
    let bound = ideal * 10 + Duration::from_secs(120);
    control
        .wait_until(bound, |s| s.ledger.jobs_succeeded >= u64::from(jobs))
        .await
        .map_err(|s| anyhow::anyhow!("the jobs did not all run: {:?}", s.ledger))?;
    let done = Instant::now();
    progress("all jobs done; waiting for the runners to be cleaned up");
    stack
        .until("every runner pod is gone", || async {
            let pods = stack.pods().list(&ListParams::default()).await.ok()?;
            let runners = stack.runners().list(&ListParams::default()).await.ok()?;
            (pods.items.is_empty() && runners.items.is_empty()).then_some(())
        })
        .await?;
    let host = stack.host().context("the host runs")?;
    let usage = host.usage()?;
    let calls_by_endpoint: Vec<(fake_actions::Endpoint, u64)> = stack
        .host_actions_calls_by_endpoint()
        .into_iter()
        .zip(&calls_before)
        .map(|((endpoint, after), (_, before))| (endpoint, after - before))
        .filter(|(_, n)| *n > 0)
        .collect();
    let calls = calls_by_endpoint.iter().map(|(_, n)| n).sum();
    let neighbours = stack.neighbour_cpu()?;
    let [apiserver, etcd, driver] = [0, 1, 2].map(|i| {
        neighbours[i]
            .saturating_sub(neighbours_before[i])
            .as_secs_f64()
    });
    progress(&format!(
        "CPU over the run besides the host: kube-apiserver {apiserver:.2} s, etcd {etcd:.2} s, \
         fake Actions service + simulator + this driver {driver:.2} s"
    ));
    let window_end = jiff::Timestamp::now();
    stack.check_ledger(u64::from(jobs)).await?;

    let timeline = recorder.timeline();
    let waits = intervals(&timeline.enqueued, &timeline.started);
    let pod_jobs: Vec<(String, Vec<u64>)> = stack
        .sim()
        .runners()
        .into_iter()
        .map(|r| (r.uid, r.jobs))
        .collect();
    let cleanups = timeline.cleanups(&pod_jobs);
    // A runner's start-up: its pod first seen to the job it ran started.
    let startups: Vec<Duration> = pod_jobs
        .iter()
        .filter_map(|(pod, jobs)| {
            let created = timeline.pod_created.get(pod)?;
            let started = timeline.started.get(jobs.first()?)?;
            Some(started.saturating_duration_since(*created))
        })
        .collect();
    if let Some(p50) = percentile(&startups, 50) {
        progress(&format!(
            "runner pod created to its job started: p50 {} ms",
            p50.as_millis()
        ));
    }
    watch.abort();
    if let Some(at) = *decided.lock().unwrap_or_else(|p| p.into_inner()) {
        progress(&format!(
            "the decision reached {target} runners {} ms after the burst",
            at.saturating_duration_since(started).as_millis()
        ));
    }
    let scaleup =
        first_reaching(&timeline.live_pods, target).map(|at| at.saturating_duration_since(started));
    if scaleup.is_none()
        && let Some((at, top)) = peak(&timeline.live_pods)
    {
        progress(&format!(
            "the runner pods never reached {target} at once: at most {top}, {} ms after the burst",
            at.saturating_duration_since(started).as_millis()
        ));
    }
    let requests = stack
        .host_apiserver_requests(window_start, window_end)
        .context("the audit log is readable")?;
    let per_job = |n: u64| n as f64 / f64::from(jobs);
    progress(&format!(
        "Actions calls per job by endpoint: {}",
        breakdown(
            calls_by_endpoint
                .iter()
                .map(|(e, n)| (e.to_string(), per_job(*n)))
        )
    ));
    progress(&format!(
        "API server requests per job by kind: {}",
        breakdown(
            requests
                .by_kind
                .iter()
                .map(|(k, n)| (k.clone(), per_job(*n)))
        )
    ));
    Ok(BenchReport {
        jobs: u64::from(jobs),
        wall: done - started,
        p50_wait: percentile(&waits, 50).unwrap_or_default(),
        p95_wait: percentile(&waits, 95).unwrap_or_default(),
        scaleup,
        p50_cleanup: percentile(&cleanups, 50).unwrap_or_default(),
        actions_calls: calls,
        apiserver_requests: requests.total,
        apiserver_writes: requests.writes,
        host_cpu: usage.cpu.saturating_sub(cpu_before),
        host_peak_rss_bytes: usage.peak_rss_bytes,
    })
}

/// `name value` pairs, largest first, to two decimals.
fn breakdown(items: impl Iterator<Item = (String, f64)>) -> String {
    let mut items: Vec<(String, f64)> = items.collect();
    items.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    items
        .iter()
        .map(|(name, value)| format!("{name} {value:.2}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Consecutive equal durations grouped, so that a run without jitter is
/// enqueued as one burst of N identical jobs: `(duration, count)`.
fn runs(durations: &[u64]) -> Vec<(u64, u32)> {
    let mut runs: Vec<(u64, u32)> = Vec::new();
    for &d in durations {
        match runs.last_mut() {
            Some((last, count)) if *last == d => *count += 1,
            _ => runs.push((d, 1)),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_jitter_every_job_lasts_the_same_and_is_one_burst() {
        let d = durations(5, 1000, 0, 42);
        assert_eq!(d, [1000; 5]);
        assert_eq!(runs(&d), [(1000, 5)]);
    }

    #[test]
    fn jitter_is_bounded_and_the_seed_reproduces_it() {
        let a = durations(100, 1000, 10, 7);
        assert_eq!(a, durations(100, 1000, 10, 7));
        assert_ne!(a, durations(100, 1000, 10, 8));
        assert!(a.iter().all(|&ms| (900..=1100).contains(&ms)), "{a:?}");
        assert_eq!(runs(&a).iter().map(|r| r.1).sum::<u32>(), 100);
    }
}
