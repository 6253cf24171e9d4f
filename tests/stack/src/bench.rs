//! The scale benchmark: N jobs at once (or one at a time, `--arrival
//! every:5s`) through one scale set of at most M runners, measured end to
//! end, and then the same jobs through the floor ([`crate::floor`]): the
//! least a controller can do for them on the same stack.
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
//! - the floor: once arcwright's runners are gone and the ledger checked,
//!   the host is stopped and [`crate::floor::run`] runs the same jobs
//!   (same durations, same arrival, same M) on a scale set of its own;
//!   `floor_jobs_per_s` is its N over its first job enqueued to its last
//!   succeeded, `floor_ratio` arcwright's jobs per second over it. The
//!   ledger is checked again after it.
//!
//! Runs are reproducible: the scenario is fixed by its flags, and the only
//! randomness, the jitter of job durations (`--jitter-pct`, 0 by default),
//! is drawn from `--seed`.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use fake_actions::{Control, FakeConfig, JobSpec};
use kube::api::ListParams;
use rand::{Rng, SeedableRng};

use crate::stats::{BenchReport, first_reaching, intervals, peak, percentile, ratio};
use crate::timeline::Recorder;
use crate::{ScaleSet, Stack, StackConfig};

/// The scale set's name, and the jobs' only label.
const SET: &str = "bench";

/// Set to a path, the API server's audit log of arcwright's part is copied
/// there before the floor runs (the log of every request, to see what a
/// job's writes were, one by one), and the host's log beside it
/// (`<path>.host.log`).
pub const KEEP_AUDIT: &str = "ARCWRIGHT_BENCH_KEEP_AUDIT";

/// How the jobs arrive.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Arrival {
    /// All at once (`burst`).
    #[default]
    Burst,
    /// One at a time, this far apart (`every:5s`): with a gap longer than
    /// a job, each job meets an idle scale set, and the wait is a single
    /// job's, queued to started.
    Every(Duration),
}

impl Arrival {
    /// How long enqueueing `jobs` jobs takes.
    pub fn span(self, jobs: u32) -> Duration {
        match self {
            Arrival::Burst => Duration::ZERO,
            Arrival::Every(gap) => gap * jobs.saturating_sub(1),
        }
    }
}

impl FromStr for Arrival {
    type Err = String;

    /// `burst`, or `every:<duration>` with a duration such as `5s`,
    /// `500ms` or `1m30s`, longer than zero.
    fn from_str(text: &str) -> Result<Self, String> {
        let usage = "an arrival is `burst` or `every:<duration>` (e.g. every:5s)";
        if text == "burst" {
            return Ok(Arrival::Burst);
        }
        let Some(gap) = text.strip_prefix("every:") else {
            return Err(format!("{text:?}: {usage}"));
        };
        let signed: jiff::SignedDuration = gap
            .parse()
            .map_err(|e| format!("{gap:?} is not a duration like 5s or 500ms: {e}"))?;
        match Duration::try_from(signed) {
            Ok(gap) if !gap.is_zero() => Ok(Arrival::Every(gap)),
            _ => Err(format!("{text:?}: the gap must be longer than zero")),
        }
    }
}

impl fmt::Display for Arrival {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Arrival::Burst => f.write_str("burst"),
            Arrival::Every(gap) => write!(f, "every:{gap:?}"),
        }
    }
}

/// One benchmark run; also `bench-scale`'s command line.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchOptions {
    /// Jobs, enqueued as `--arrival` says.
    #[arg(long, default_value_t = 200)]
    pub jobs: u32,
    /// How the jobs arrive: `burst` (all at once) or `every:<duration>`
    /// (one at a time, e.g. `every:5s`, to measure one job on an idle set).
    #[arg(long, default_value = "burst")]
    pub arrival: Arrival,
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
        arrival,
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
    let mut stack = Stack::start(config).await?;
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
    progress(&format!("enqueueing {jobs} jobs ({arrival})"));
    let started = Instant::now();
    let control = stack.fake().control();
    let durations = durations(jobs, job_ms, jitter_pct, seed);
    enqueue(&control, &recorder, SET, &durations, arrival).await;
    // At most ten times the ideal, plus the arrivals and start-up: a
    // stuck run fails instead of hanging CI.
    let ideal = Duration::from_millis(job_ms * u64::from(jobs.div_ceil(max_runners)));
    let bound = arrival.span(jobs) + ideal * 10 + Duration::from_secs(120);
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
    let calls_by_endpoint: Vec<(fake_actions::Endpoint, u64)> =
        stack.host_actions_calls_since(&calls_before);
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
    if let (Some(kept), Some(log)) = (std::env::var_os(KEEP_AUDIT), stack.audit_log()) {
        std::fs::copy(log, &kept).context("keeping the audit log")?;
        progress(&format!("kept the audit log in {}", kept.to_string_lossy()));
        if let Some(host) = stack.host() {
            let mut host_log = kept.clone();
            host_log.push(".host.log");
            std::fs::copy(host.log_path(), &host_log).context("keeping the host's log")?;
        }
    }
    let per_job = |n: u64| n as f64 / f64::from(jobs);
    let host_cpu = usage.cpu.saturating_sub(cpu_before);
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
    drop(recorder);

    // The floor, on the same stack with arcwright's host stopped.
    progress("stopping arcwright; running the floor");
    stack.stop_host(Duration::from_secs(30)).await;
    let neighbours_before = stack.neighbour_cpu()?;
    let floor = crate::floor::run(&stack, max_runners, &durations, arrival, bound, progress)
        .await
        .context("the floor")?;
    let neighbours = stack.neighbour_cpu()?;
    stack.check_ledger(2 * u64::from(jobs)).await?;
    let [apiserver, etcd, driver] = [0, 1, 2].map(|i| {
        neighbours[i]
            .saturating_sub(neighbours_before[i])
            .as_secs_f64()
    });
    let floor_per_job = |n: u64| n as f64 / floor.jobs.max(1) as f64;
    progress(&format!(
        "floor: {} jobs on {} runners in {:.2} s; wait p50 {} ms, p95 {} ms",
        floor.jobs,
        floor.runners,
        floor.wall.as_secs_f64(),
        floor.p50_wait.as_millis(),
        floor.p95_wait.as_millis(),
    ));
    progress(&format!(
        "floor: Actions calls per job {:.2}: {}",
        floor_per_job(floor.actions_calls.iter().map(|(_, n)| n).sum()),
        breakdown(
            floor
                .actions_calls
                .iter()
                .map(|(e, n)| (e.to_string(), floor_per_job(*n)))
        )
    ));
    if let Some(requests) = &floor.apiserver {
        progress(&format!(
            "floor: API server requests per job {:.2}, writes {:.2}: {}",
            floor_per_job(requests.total),
            floor_per_job(requests.writes),
            breakdown(
                requests
                    .by_kind
                    .iter()
                    .map(|(k, n)| (k.clone(), floor_per_job(*n)))
            )
        ));
    }
    progress(&format!(
        "floor: CPU kube-apiserver {apiserver:.2} s, etcd {etcd:.2} s, \
         fake Actions service + simulator + the floor {driver:.2} s"
    ));
    let report = BenchReport {
        jobs: u64::from(jobs),
        wall: done - started,
        p50_wait: percentile(&waits, 50).unwrap_or_default(),
        p95_wait: percentile(&waits, 95).unwrap_or_default(),
        scaleup,
        p50_cleanup: percentile(&cleanups, 50).unwrap_or_default(),
        actions_calls: calls,
        apiserver_requests: requests.total,
        apiserver_writes: requests.writes,
        host_cpu,
        host_peak_rss_bytes: usage.peak_rss_bytes,
        floor_jobs: floor.jobs,
        floor_wall: floor.wall,
    };
    progress(&format!(
        "arcwright at {:.2} of the floor's throughput",
        ratio(report.jobs_per_second(), report.floor_jobs_per_second())
    ));
    Ok(report)
}

/// Enqueues a job of each of `durations` (milliseconds) for `label`, as
/// `arrival` says, noting when each was enqueued in `recorder`; returns
/// once the last is enqueued. A burst without jitter is one call for all.
pub async fn enqueue(
    control: &Control,
    recorder: &Recorder,
    label: &str,
    durations: &[u64],
    arrival: Arrival,
) {
    match arrival {
        Arrival::Burst => {
            let at = Instant::now();
            for (ms, count) in runs(durations) {
                let ids = control
                    .enqueue_jobs(JobSpec::new(count, &[label]).lasting(Duration::from_millis(ms)));
                recorder.enqueued(&ids, at);
            }
        }
        Arrival::Every(gap) => {
            let first = tokio::time::Instant::now();
            let mut next = first;
            for &ms in durations {
                tokio::time::sleep_until(next).await;
                let ids = control
                    .enqueue_jobs(JobSpec::new(1, &[label]).lasting(Duration::from_millis(ms)));
                recorder.enqueued(&ids, Instant::now());
                next += gap;
            }
        }
    }
}

/// `name value` pairs, largest first, to two decimals.
pub(crate) fn breakdown(items: impl Iterator<Item = (String, f64)>) -> String {
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
    fn arrivals_parse_as_burst_or_every_duration() {
        assert_eq!("burst".parse::<Arrival>(), Ok(Arrival::Burst));
        assert_eq!(
            "every:5s".parse::<Arrival>(),
            Ok(Arrival::Every(Duration::from_secs(5)))
        );
        assert_eq!(
            "every:500ms".parse::<Arrival>(),
            Ok(Arrival::Every(Duration::from_millis(500)))
        );
        assert_eq!(
            "every:1m30s".parse::<Arrival>(),
            Ok(Arrival::Every(Duration::from_secs(90)))
        );
        for (text, says) in [
            ("", "`burst` or `every:<duration>`"),
            ("Burst", "`burst` or `every:<duration>`"),
            ("every", "`burst` or `every:<duration>`"),
            ("5s", "`burst` or `every:<duration>`"),
            ("every:", "not a duration"),
            ("every:soon", "not a duration"),
            ("every:0s", "longer than zero"),
            ("every:-5s", "longer than zero"),
        ] {
            let error = text.parse::<Arrival>().unwrap_err();
            assert!(error.contains(says), "{text:?}: {error}");
        }
        for arrival in [Arrival::Burst, Arrival::Every(Duration::from_secs(5))] {
            assert_eq!(arrival.to_string().parse::<Arrival>(), Ok(arrival));
        }
        assert_eq!(Arrival::default(), Arrival::Burst);
    }

    #[test]
    fn spaced_arrivals_take_the_gaps_between_them() {
        assert_eq!(Arrival::Burst.span(100), Duration::ZERO);
        let every = Arrival::Every(Duration::from_secs(5));
        assert_eq!(every.span(10), Duration::from_secs(45));
        assert_eq!(every.span(1), Duration::ZERO);
        assert_eq!(every.span(0), Duration::ZERO);
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
