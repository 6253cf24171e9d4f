//! The fleet benchmark (`cargo xtask bench fleet`): what a scale set costs
//! the host when there are many of them, idle and busy.
//!
//! One `arcwright run` serves K AutoscalingRunnerSets (`minRunners` and
//! `maxRunners` small, 0 and 3 by default) against the stack's own control
//! plane (with an audit log, so the host's API server requests are
//! counted), the fake Actions service and the runner simulator. The fake
//! holds an empty long poll for 50 s, as the real service does: with the
//! tests' one second, a thousand idle sets would poll a thousand times a
//! second and measure the fake, not the host.
//!
//! The run, in order:
//! 1. the host alone, its resident set once ready: the baseline a set's
//!    cost is measured from;
//! 2. the K sets created, and every one listening (a session in the fake)
//!    with its standing runners running;
//! 3. the host restarted (a clean stop, which deletes its sessions, and a
//!    new process): `ready_s` is from the new process's start to every set
//!    listening again, what a platform team waits for after an upgrade or
//!    a failover; `settled_s` until the host has gone [`QUIET`] without an
//!    API server request but its watches, and `restart_requests_per_set`
//!    what it asked of the API server meanwhile (the fleet also settles
//!    before the restart, so nothing of its creation is counted);
//! 4. the idle window (`--idle-s`): the host's CPU, the Actions calls it
//!    makes (only long polls are expected, one per set per 50 s) and its
//!    API server requests, per minute, and the resident set's highest
//!    sample;
//! 5. `--jobs` jobs spread round-robin over all sets, at once: jobs per
//!    second from enqueue to the last success, the wait from enqueued to
//!    started, and the host's Actions calls, API server requests and
//!    writes per job, counted until every set is back to its standing
//!    runners (a job's runner cleaned up is part of its cost);
//! 6. with `--floor`, the same jobs through the scale benchmark's floor
//!    ([`crate::floor`]) with the host stopped, on one scale set with as
//!    many runners as the whole fleet (K × `maxRunners`): `floor_ratio` is
//!    the fleet's jobs per second over the floor's.
//!
//! `rss_per_set_kib` is the idle resident set over the baseline, per set.
//! `actions_calls_lower_bound`, beside `actions_calls_per_job`, is the
//! fewest calls the protocol allows a job for that many jobs per set
//! ([`actions_calls_lower_bound`]).
//! With `--min-runners` above 0 the fleet also stands that many idle
//! runners per set (each an EphemeralRunner, a JIT Secret, a pod, a
//! registration), and the line adds what a runner costs.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use fake_actions::{Endpoint, FakeConfig};
use futures::StreamExt as _;
use kube::api::ListParams;

use crate::stats::{intervals, per_second, percentile};
use crate::timeline::Recorder;
use crate::{ScaleSet, Stack, StackConfig};

/// How long the fleet may go without one more set listening, or one more
/// runner pod running, before it is taken as standing as far as it will.
const STALL: Duration = Duration::from_secs(120);

/// How long the host must go without an API server request (its watches
/// aside) to be taken as settled.
const QUIET: Duration = Duration::from_secs(5);

/// Scale sets created at once: enough to keep the API server busy,
/// few enough not to be turned away by its priority and fairness.
const CREATING_AT_ONCE: usize = 8;

/// One fleet run; also `bench-fleet`'s command line.
#[derive(Debug, Clone, clap::Args)]
pub struct FleetOptions {
    /// Scale sets (K).
    #[arg(long, default_value_t = 50)]
    pub scale_sets: u32,
    /// Each set's minRunners: idle runners it keeps standing.
    #[arg(long, default_value_t = 0)]
    pub min_runners: u32,
    /// Each set's maxRunners.
    #[arg(long, default_value_t = 3)]
    pub max_runners: u32,
    /// How long the standing fleet idles while measured, in seconds.
    #[arg(long, default_value_t = 60)]
    pub idle_s: u64,
    /// Jobs after the idle window, spread over all sets (0: none).
    #[arg(long, default_value_t = 0)]
    pub jobs: u32,
    /// How long each job runs, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub job_ms: u64,
    /// How long the fake holds an empty long poll, in seconds (the real
    /// service's 50).
    #[arg(long, default_value_t = 50)]
    pub long_poll_s: u64,
    /// How long each phase may take, in seconds.
    #[arg(long, default_value_t = 1800)]
    pub bound_secs: u64,
    /// After the jobs, run the same jobs through the floor.
    #[arg(long)]
    pub floor: bool,
    /// Extra `arcwright run` flags, after `--`.
    #[arg(last = true)]
    pub host_args: Vec<String>,
}

/// The figures of one run.
#[derive(Debug, Clone, Default)]
pub struct FleetReport {
    /// Scale sets.
    pub scale_sets: u32,
    /// Standing runners in all (`minRunners` × sets).
    pub standing_runners: u64,
    /// From the restarted host's start until every set listened.
    pub ready: Duration,
    /// From the restarted host's start until its last request before
    /// going [`QUIET`].
    pub settled: Duration,
    /// The restarted host's API server requests until it settled.
    pub restart_requests: u64,
    /// The host's resident set once ready with no scale set, in bytes.
    pub baseline_rss_bytes: u64,
    /// The highest resident set sampled in the idle window, in bytes.
    pub idle_rss_bytes: u64,
    /// The host's CPU over the idle window, in percent of one core.
    pub idle_cpu_pct: f64,
    /// The length of the idle window.
    pub idle: Duration,
    /// The host's Actions calls in the idle window, by endpoint.
    pub idle_actions_calls: BTreeMap<String, u64>,
    /// The host's API server requests in the idle window, by
    /// `verb resource`.
    pub idle_apiserver_requests: BTreeMap<String, u64>,
    /// Jobs run after the idle window.
    pub jobs: u64,
    /// From their enqueueing until the last succeeded.
    pub jobs_wall: Duration,
    /// Enqueued to started, 50th percentile.
    pub p50_wait: Duration,
    /// The same, 95th percentile.
    pub p95_wait: Duration,
    /// The restarted host's lifetime peak, in bytes.
    pub peak_rss_bytes: u64,
    /// The host's Actions calls while the jobs ran.
    pub jobs_actions_calls: u64,
    /// Its API server requests while the jobs ran, from the audit log.
    pub jobs_apiserver: crate::audit::Requests,
    /// The floor's jobs per second on the same jobs, when it ran.
    pub floor_jobs_per_s: Option<f64>,
}

/// The fewest Actions calls a job can cost when `jobs` jobs arrive at once
/// spread over `sets` scale sets that stand no runner for them.
///
/// Each job needs a registration of its own (runners are ephemeral): one
/// JIT config. Each scale set that gets any job must hear of them, in at
/// least one message (its long poll, and the acknowledgement that lets the
/// next message come), and must acquire them (one call for all it heard
/// of). Nothing else is needed for the jobs to run: a runner takes its job
/// from the broker, not through the listener, a runner that finishes is
/// renewed for the next without a message, and the runners end on their
/// own. So a set of `j` jobs costs at least `j + 3` calls.
pub fn actions_calls_lower_bound(jobs: u64, sets: u32) -> f64 {
    if jobs == 0 {
        return 0.0;
    }
    let busy_sets = jobs.min(u64::from(sets));
    (jobs + 3 * busy_sets) as f64 / jobs as f64
}

impl FleetReport {
    /// `count` per minute of the idle window.
    fn per_minute(&self, count: u64) -> f64 {
        per_second(count, self.idle) * 60.0
    }

    /// Idle long polls per set per minute: about 1.2 with the service's
    /// 50 s polls.
    pub fn idle_polls_per_set_min(&self) -> f64 {
        let polls = self
            .idle_actions_calls
            .get(&format!("{:?}", Endpoint::GetMessage))
            .copied()
            .unwrap_or(0);
        self.per_minute(polls) / f64::from(self.scale_sets.max(1))
    }

    /// Idle Actions calls other than long polls: none are expected.
    pub fn idle_other_actions_calls(&self) -> u64 {
        let poll = format!("{:?}", Endpoint::GetMessage);
        self.idle_actions_calls
            .iter()
            .filter(|(endpoint, _)| **endpoint != poll)
            .map(|(_, n)| n)
            .sum()
    }

    /// The idle resident set over the baseline, per set, in KiB.
    pub fn rss_per_set_kib(&self) -> f64 {
        self.idle_rss_bytes.saturating_sub(self.baseline_rss_bytes) as f64
            / 1024.0
            / f64::from(self.scale_sets.max(1))
    }
}

impl std::fmt::Display for FleetReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        let sets = f64::from(self.scale_sets.max(1));
        let all_calls: u64 = self.idle_actions_calls.values().sum();
        let requests: u64 = self.idle_apiserver_requests.values().sum();
        write!(
            f,
            "scale_sets={} ready_s={:.1} settled_s={:.1} restart_requests_per_set={:.1} \
             idle_rss_mib={:.1} idle_cpu_pct={:.2} \
             idle_actions_calls_per_set_min={:.2} idle_apiserver_requests_min={:.1} \
             jobs_per_s={:.2} p50_wait_ms={} p95_wait_ms={} peak_rss_mib={:.1} \
             rss_per_set_kib={:.1} baseline_rss_mib={:.1} idle_polls_per_set_min={:.2} \
             idle_other_actions_calls={}",
            self.scale_sets,
            self.ready.as_secs_f64(),
            self.settled.as_secs_f64(),
            self.restart_requests as f64 / sets,
            mib(self.idle_rss_bytes),
            self.idle_cpu_pct,
            self.per_minute(all_calls) / sets,
            self.per_minute(requests),
            per_second(self.jobs, self.jobs_wall),
            self.p50_wait.as_millis(),
            self.p95_wait.as_millis(),
            mib(self.peak_rss_bytes),
            self.rss_per_set_kib(),
            mib(self.baseline_rss_bytes),
            self.idle_polls_per_set_min(),
            self.idle_other_actions_calls(),
        )?;
        if self.jobs > 0 {
            let per_job = |n: u64| n as f64 / self.jobs as f64;
            write!(
                f,
                " actions_calls_per_job={:.2} actions_calls_lower_bound={:.2} \
                 apiserver_requests_per_job={:.2} apiserver_writes_per_job={:.2}",
                per_job(self.jobs_actions_calls),
                actions_calls_lower_bound(self.jobs, self.scale_sets),
                per_job(self.jobs_apiserver.total),
                per_job(self.jobs_apiserver.writes),
            )?;
        }
        if let Some(floor) = self.floor_jobs_per_s {
            write!(
                f,
                " floor_jobs_per_s={floor:.2} floor_ratio={:.2}",
                crate::stats::ratio(per_second(self.jobs, self.jobs_wall), floor)
            )?;
        }
        if self.standing_runners > 0 {
            write!(
                f,
                " standing_runners={} rss_per_runner_kib={:.1}",
                self.standing_runners,
                self.idle_rss_bytes.saturating_sub(self.baseline_rss_bytes) as f64
                    / 1024.0
                    / self.standing_runners as f64
            )?;
        }
        Ok(())
    }
}

/// Runs the fleet on a stack of its own; `progress` hears what happens.
pub async fn run(options: &FleetOptions, progress: &dyn Fn(&str)) -> Result<FleetReport> {
    let FleetOptions {
        scale_sets,
        min_runners,
        max_runners,
        idle_s,
        jobs,
        job_ms,
        long_poll_s,
        bound_secs,
        floor,
        host_args,
    } = options.clone();
    if scale_sets == 0 || max_runners == 0 || min_runners > max_runners {
        bail!(
            "--scale-sets and --max-runners must be at least 1, --min-runners at most --max-runners"
        );
    }
    let min = i32::try_from(min_runners).context("--min-runners is too large")?;
    let max = i32::try_from(max_runners).context("--max-runners is too large")?;
    let standing = u64::from(scale_sets) * u64::from(min_runners);
    progress(
        "starting the control plane (with an audit log), the fake, the simulator and arcwright",
    );
    let mut config = StackConfig::new("fleet");
    config.audit = true;
    config.host_args = host_args;
    config.fake = FakeConfig {
        long_poll: Duration::from_secs(long_poll_s),
        assignment_timeout: Duration::from_secs(3600),
        ..FakeConfig::default()
    };
    let mut stack = Stack::start(config).await?;
    stack.set_bound(Duration::from_secs(bound_secs));
    // The host alone: what it holds before any scale set.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let baseline_rss_bytes = stack.host().context("the host runs")?.usage()?.rss_bytes;

    let names: Vec<String> = (0..scale_sets).map(|i| format!("fleet-{i:04}")).collect();
    let created = Instant::now();
    let results: Vec<Result<()>> = futures::stream::iter(&names)
        .map(|name| {
            let stack = &stack;
            async move { stack.create_scale_set(&ScaleSet::new(name, min, max)).await }
        })
        .buffer_unordered(CREATING_AT_ONCE)
        .collect()
        .await;
    results.into_iter().collect::<Result<Vec<()>>>()?;
    progress(&format!(
        "{scale_sets} scale sets created in {:.1} s; waiting for every one to listen",
        created.elapsed().as_secs_f64()
    ));
    all_listening(&stack, scale_sets as usize, progress).await?;
    if standing > 0 {
        all_running(&stack, standing as usize, progress).await?;
    }
    settle(&stack, created, progress).await?;
    progress(&format!(
        "the fleet stands and the host is quiet after {:.1} s; restarting the host",
        created.elapsed().as_secs_f64()
    ));

    stack.stop_host(Duration::from_secs(60)).await;
    let restarted = Instant::now();
    let restart_start = jiff::Timestamp::now();
    stack.start_host().await?;
    all_listening(&stack, scale_sets as usize, progress).await?;
    let ready = restarted.elapsed();
    progress(&format!(
        "every set listens {:.1} s after the host's start; waiting for it to settle",
        ready.as_secs_f64()
    ));
    let settled = settle(&stack, restarted, progress).await?;
    let restart = stack
        .host_apiserver_requests(restart_start, jiff::Timestamp::now())
        .context("the stack's audit log")?;
    progress(&format!(
        "settled {:.1} s after the host's start; its requests meanwhile: {:?}; idle for {idle_s} s",
        settled.as_secs_f64(),
        restart.by_kind
    ));

    let host = stack.host().context("the host runs")?;
    let cpu_before = host.usage()?.cpu;
    let calls_before = stack.host_actions_calls_by_endpoint();
    let window_start = jiff::Timestamp::now();
    let idle_started = Instant::now();
    let mut idle_rss_bytes = 0u64;
    while idle_started.elapsed() < Duration::from_secs(idle_s) {
        idle_rss_bytes = idle_rss_bytes.max(host.usage()?.rss_bytes);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let idle = idle_started.elapsed();
    let window_end = jiff::Timestamp::now();
    let idle_cpu = host.usage()?.cpu.saturating_sub(cpu_before);
    let idle_actions_calls = stack
        .host_actions_calls_since(&calls_before)
        .into_iter()
        .map(|(endpoint, n)| (format!("{endpoint:?}"), n))
        .collect();
    let idle_apiserver_requests = stack
        .host_apiserver_requests(window_start, window_end)
        .context("the stack's audit log")?
        .by_kind;

    let mut report = FleetReport {
        scale_sets,
        standing_runners: standing,
        ready,
        settled,
        restart_requests: restart.total - watches(&restart),
        baseline_rss_bytes,
        idle_rss_bytes,
        idle_cpu_pct: idle_cpu.as_secs_f64() / idle.as_secs_f64() * 100.0,
        idle,
        idle_actions_calls,
        idle_apiserver_requests,
        ..FleetReport::default()
    };
    progress(&format!(
        "idle: Actions calls {:?}; API server requests {:?}",
        report.idle_actions_calls, report.idle_apiserver_requests
    ));

    if jobs > 0 {
        progress(&format!("{jobs} jobs over {scale_sets} sets"));
        let recorder = Recorder::start(stack.fake().control(), stack.client(), stack.namespace());
        let before = stack.fake().control().ledger().jobs_succeeded;
        let calls_before = stack.host_actions_calls_by_endpoint();
        let window_start = jiff::Timestamp::now();
        let enqueued = Instant::now();
        for (set, count) in spread(jobs, &names) {
            let ids = stack.enqueue(set, count, Duration::from_millis(job_ms));
            recorder.enqueued(&ids, enqueued);
        }
        stack.jobs_succeeded(before + u64::from(jobs)).await?;
        report.jobs = u64::from(jobs);
        report.jobs_wall = enqueued.elapsed();
        // A job's cost includes its runner's going: counted until every
        // set is back to its standing runners, as the scale benchmark
        // counts until every runner is gone.
        progress("all jobs done; waiting for the runners to be cleaned up");
        let standing_left = usize::try_from(standing).unwrap_or(usize::MAX);
        stack
            .until("the sets back to their standing runners", || async {
                let pods = stack.pods().list(&ListParams::default()).await.ok()?;
                let runners = stack.runners().list(&ListParams::default()).await.ok()?;
                (pods.items.len() <= standing_left && runners.items.len() <= standing_left)
                    .then_some(())
            })
            .await?;
        report.jobs_actions_calls = stack
            .host_actions_calls_since(&calls_before)
            .into_iter()
            .map(|(_, n)| n)
            .sum();
        report.jobs_apiserver = stack
            .host_apiserver_requests(window_start, jiff::Timestamp::now())
            .context("the stack's audit log")?;
        let timeline = recorder.timeline();
        let waits = intervals(&timeline.enqueued, &timeline.started);
        report.p50_wait = percentile(&waits, 50).unwrap_or_default();
        report.p95_wait = percentile(&waits, 95).unwrap_or_default();
        let per_job = |n: u64| n as f64 / f64::from(jobs);
        progress(&format!(
            "jobs: API server requests per job by kind: {}",
            crate::bench::breakdown(
                report
                    .jobs_apiserver
                    .by_kind
                    .iter()
                    .map(|(k, n)| (k.clone(), per_job(*n)))
            )
        ));
    }
    report.peak_rss_bytes = stack
        .host()
        .context("the host runs")?
        .usage()?
        .peak_rss_bytes;
    if floor && jobs > 0 {
        let runners = scale_sets.saturating_mul(max_runners);
        progress(&format!(
            "stopping arcwright; the floor runs the {jobs} jobs on {runners} runners"
        ));
        stack.stop_host(Duration::from_secs(60)).await;
        let durations = vec![job_ms; jobs as usize];
        let floor = crate::floor::run(
            &stack,
            runners,
            &durations,
            crate::bench::Arrival::Burst,
            Duration::from_secs(bound_secs),
            progress,
        )
        .await
        .context("the floor")?;
        report.floor_jobs_per_s = Some(per_second(floor.jobs, floor.wall));
        return Ok(report);
    }
    Ok(report)
}

/// The long-running watch requests among `requests`, which say nothing of
/// what the host is doing.
fn watches(requests: &crate::audit::Requests) -> u64 {
    requests
        .by_kind
        .iter()
        .filter(|(kind, _)| kind.starts_with("watch "))
        .map(|(_, n)| n)
        .sum()
}

/// Waits until the host has gone [`QUIET`] without an API server request
/// but its watches (read from the audit log), and answers how long after
/// `since` its last request came.
async fn settle(stack: &Stack, since: Instant, progress: &dyn Fn(&str)) -> Result<Duration> {
    let mut said = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let now = jiff::Timestamp::now();
        let recent = stack
            .host_apiserver_requests(now - QUIET, now)
            .context("the stack's audit log")?;
        let busy = recent.total - watches(&recent);
        if busy == 0 && since.elapsed() >= QUIET {
            return Ok(since.elapsed().saturating_sub(QUIET));
        }
        if since.elapsed() > STALL * 10 {
            bail!(
                "the host never went {QUIET:?} without a request: {:?}",
                recent.by_kind
            );
        }
        if said.elapsed() > Duration::from_secs(15) {
            said = Instant::now();
            progress(&format!(
                "still busy: {busy} requests in the last {QUIET:?}"
            ));
        }
    }
}

/// `jobs` spread round-robin over `sets`: each set's share, the first ones
/// taking the remainder.
pub fn spread(jobs: u32, sets: &[String]) -> Vec<(&str, u32)> {
    let count = u32::try_from(sets.len()).unwrap_or(u32::MAX).max(1);
    sets.iter()
        .enumerate()
        .map(|(i, set)| {
            let extra = u32::from((i as u32) < jobs % count);
            (set.as_str(), jobs / count + extra)
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// Waits until `count` scale sets hold a message session in the fake, or
/// none has been added for [`STALL`].
async fn all_listening(stack: &Stack, count: usize, progress: &dyn Fn(&str)) -> Result<()> {
    let listening = || {
        stack
            .fake()
            .control()
            .scale_sets()
            .iter()
            .filter(|s| s.session_active)
            .count()
    };
    until_all(stack, "set listening", count, progress, || async {
        Some(listening())
    })
    .await
}

/// Waits until `count` runner pods run, or none has been added for
/// [`STALL`].
async fn all_running(stack: &Stack, count: usize, progress: &dyn Fn(&str)) -> Result<()> {
    until_all(stack, "runner pod running", count, progress, || async {
        let pods = stack.pods().list(&ListParams::default()).await.ok()?;
        Some(
            pods.items
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .count(),
        )
    })
    .await
}

/// Polls `count_now` until it reaches `count`; fails, saying how far it
/// got, when it goes [`STALL`] without growing.
async fn until_all<Fut>(
    stack: &Stack,
    what: &str,
    count: usize,
    progress: &dyn Fn(&str),
    mut count_now: impl FnMut() -> Fut,
) -> Result<()>
where
    Fut: std::future::Future<Output = Option<usize>>,
{
    let mut best = (0usize, Instant::now());
    let mut said = Instant::now();
    loop {
        let now = count_now().await.unwrap_or(best.0);
        if now >= count {
            return Ok(());
        }
        if now > best.0 {
            best = (now, Instant::now());
        }
        if best.1.elapsed() > STALL {
            let host = stack.host().map(|h| h.log_tail(30)).unwrap_or_default();
            bail!(
                "only {now} of {count} ({what}) after {STALL:?} without progress\nhost log:\n{host}"
            );
        }
        if said.elapsed() > Duration::from_secs(15) {
            said = Instant::now();
            progress(&format!("{now} of {count} ({what})"));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_are_spread_round_robin_the_first_sets_taking_the_remainder() {
        let sets: Vec<String> = (0..4).map(|i| format!("s{i}")).collect();
        assert_eq!(
            spread(10, &sets),
            vec![("s0", 3), ("s1", 3), ("s2", 2), ("s3", 2)]
        );
        assert_eq!(spread(2, &sets), vec![("s0", 1), ("s1", 1)]);
        assert!(spread(0, &sets).is_empty());
    }

    #[test]
    fn the_report_line_has_every_figure_per_set_and_per_minute() {
        let report = FleetReport {
            scale_sets: 100,
            ready: Duration::from_millis(12_340),
            settled: Duration::from_secs(20),
            restart_requests: 300,
            baseline_rss_bytes: 20 << 20,
            idle_rss_bytes: 30 << 20,
            idle_cpu_pct: 0.5,
            idle: Duration::from_secs(120),
            idle_actions_calls: BTreeMap::from([
                (format!("{:?}", Endpoint::GetMessage), 240),
                (format!("{:?}", Endpoint::AcquireJobs), 2),
            ]),
            idle_apiserver_requests: BTreeMap::from([("list pods".to_owned(), 10)]),
            jobs: 50,
            jobs_wall: Duration::from_secs(10),
            p50_wait: Duration::from_millis(900),
            p95_wait: Duration::from_millis(2100),
            peak_rss_bytes: 40 << 20,
            ..FleetReport::default()
        };
        let line = report.to_string();
        for figure in [
            "scale_sets=100 ",
            "ready_s=12.3 ",
            "settled_s=20.0 ",
            "restart_requests_per_set=3.0 ",
            "idle_rss_mib=30.0 ",
            "idle_cpu_pct=0.50 ",
            "idle_actions_calls_per_set_min=1.21 ",
            "idle_apiserver_requests_min=5.0 ",
            "jobs_per_s=5.00 ",
            "p50_wait_ms=900 ",
            "p95_wait_ms=2100 ",
            "peak_rss_mib=40.0 ",
            "rss_per_set_kib=102.4 ",
            "idle_polls_per_set_min=1.20 ",
            "idle_other_actions_calls=2",
        ] {
            assert!(line.contains(figure), "{figure} in {line}");
        }
        assert!(!line.contains("standing_runners"), "{line}");
        assert!((actions_calls_lower_bound(1000, 200) - 1.6).abs() < 1e-9);
        assert!((actions_calls_lower_bound(250, 50) - 1.6).abs() < 1e-9);

        let busy = FleetReport {
            jobs_actions_calls: 60,
            jobs_apiserver: crate::audit::Requests {
                total: 500,
                writes: 250,
                ..crate::audit::Requests::default()
            },
            floor_jobs_per_s: Some(10.0),
            ..report
        };
        let line = busy.to_string();
        for figure in [
            "actions_calls_per_job=1.20 ",
            // 50 jobs on 100 sets: one a set, four calls each at least.
            "actions_calls_lower_bound=4.00 ",
            "apiserver_requests_per_job=10.00 ",
            "apiserver_writes_per_job=5.00",
            "floor_jobs_per_s=10.00 floor_ratio=0.50",
        ] {
            assert!(line.contains(figure), "{figure} in {line}");
        }
    }
}
