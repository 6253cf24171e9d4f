//! The fleet benchmark (`cargo xtask bench fleet`): how much memory the
//! host holds for many scale sets and thousands of runners.
//!
//! Every scale set is created with `minRunners = maxRunners = N`, so the
//! host builds `sets × N` idle runners (each an EphemeralRunner, a JIT
//! Secret, a pod the simulator plays, a registration in the fake) and keeps
//! them: one listener per set, every runner and pod in the controllers'
//! caches, every registration tracked. Once all are running, the host's
//! resident set is sampled for a while; then one job per set runs, so the
//! figure includes the work a busy fleet does, not only an idle one.
//!
//! Reported: how long the fleet took to build, the resident set once it
//! stood (the highest of the samples), the lifetime peak (`VmHWM`, which
//! includes the build), and both per runner. The memory a runner costs is
//! what a platform team sizes the controller's limits by.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use fake_actions::FakeConfig;
use kube::api::ListParams;

use crate::{ScaleSet, Stack, StackConfig};

/// How long the fleet may go without one more pod running before it is
/// taken as standing as far as it will.
const STALL: Duration = Duration::from_secs(120);

/// One fleet run; also `bench-fleet`'s command line.
#[derive(Debug, Clone, clap::Args)]
pub struct FleetOptions {
    /// Scale sets.
    #[arg(long, default_value_t = 50)]
    pub sets: u32,
    /// Idle runners per scale set (its minRunners and maxRunners).
    #[arg(long, default_value_t = 100)]
    pub runners: u32,
    /// How long the standing fleet's memory is sampled, in seconds.
    #[arg(long, default_value_t = 60)]
    pub sample_secs: u64,
    /// How long the fleet may take to stand, in seconds.
    #[arg(long, default_value_t = 1800)]
    pub bound_secs: u64,
    /// Extra `arcwright run` flags, after `--`.
    #[arg(last = true)]
    pub host_args: Vec<String>,
}

/// The figures of one run.
#[derive(Debug, Clone)]
pub struct FleetReport {
    /// Scale sets.
    pub sets: u32,
    /// Runners in all.
    pub runners: u32,
    /// Runner pods that ran (all of them, unless the simulator failed some).
    pub running: usize,
    /// From the first scale set's creation until every runner ran.
    pub built_in: Duration,
    /// The highest resident set sampled while the fleet stood and ran its
    /// jobs, in bytes.
    pub standing_rss_bytes: u64,
    /// The process's lifetime peak, in bytes.
    pub peak_rss_bytes: u64,
    /// The host's CPU time over the run.
    pub cpu: Duration,
}

impl std::fmt::Display for FleetReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        let per = |b: u64| b as f64 / 1024.0 / f64::from(self.runners.max(1));
        write!(
            f,
            "fleet: sets={} runners={} running={} built_in={:.1}s standing_rss={:.1}MiB ({:.1} KiB/runner) \
             peak_rss={:.1}MiB ({:.1} KiB/runner) cpu={:.1}s",
            self.sets,
            self.runners,
            self.running,
            self.built_in.as_secs_f64(),
            mib(self.standing_rss_bytes),
            per(self.standing_rss_bytes),
            mib(self.peak_rss_bytes),
            per(self.peak_rss_bytes),
            self.cpu.as_secs_f64(),
        )
    }
}

/// Runs the fleet on a stack of its own; `progress` hears what happens.
pub async fn run(options: &FleetOptions, progress: &dyn Fn(&str)) -> Result<FleetReport> {
    let FleetOptions {
        sets,
        runners,
        sample_secs,
        bound_secs,
        host_args,
    } = options.clone();
    if sets == 0 || runners == 0 {
        bail!("--sets and --runners must be at least 1");
    }
    let total = sets.checked_mul(runners).context("too many runners")?;
    let per_set = i32::try_from(runners).context("--runners is too large")?;
    progress("starting the control plane, the fake, the simulator and arcwright");
    let mut config = StackConfig::new("fleet");
    config.host_args = host_args;
    config.fake = FakeConfig {
        assignment_timeout: Duration::from_secs(3600),
        ..FakeConfig::default()
    };
    let mut stack = Stack::start(config).await?;
    stack.set_bound(Duration::from_secs(bound_secs));
    let names: Vec<String> = (0..sets).map(|i| format!("fleet-{i:03}")).collect();
    let started = Instant::now();
    for name in &names {
        stack
            .create_scale_set(&ScaleSet::new(name, per_set, per_set))
            .await?;
    }
    progress(&format!(
        "{sets} scale sets created; waiting for {total} runners"
    ));
    // Waits until every runner pod runs, or until no more start for
    // STALL: a pod the simulator failed to play (it says why) must not
    // hold the figure back, and is reported.
    let last = std::cell::Cell::new(Instant::now());
    let progress_at = std::cell::Cell::new((0usize, Instant::now()));
    let running = stack
        .until(&format!("{total} runners run"), || async {
            let pods = stack.pods().list(&ListParams::default()).await.ok()?;
            let running = pods
                .items
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .count();
            let (before, since) = progress_at.get();
            if running > before {
                progress_at.set((running, Instant::now()));
            }
            if last.get().elapsed() > Duration::from_secs(15) {
                last.set(Instant::now());
                progress(&format!("{running} of {total} runner pods running"));
            }
            let stalled = running == before && since.elapsed() > STALL;
            (running >= total as usize || stalled).then_some(running)
        })
        .await?;
    if running < total as usize {
        let broken: Vec<String> = stack
            .sim()
            .runners()
            .into_iter()
            .filter_map(|r| match r.stage {
                runner_simulator::Stage::Broken(why) => Some(format!("{}: {why}", r.pod)),
                _ => None,
            })
            .collect();
        progress(&format!(
            "only {running} of {total} runner pods run after {STALL:?} without progress; \
             the simulator failed {} pods: {}",
            broken.len(),
            broken.join("; ")
        ));
    }
    let built_in = started.elapsed();
    progress(&format!(
        "{total} runners run after {:.0} s; sampling memory for {sample_secs} s",
        built_in.as_secs_f64()
    ));
    let host = stack.host().context("the stack runs a host")?;
    let mut standing = 0u64;
    let until = Instant::now() + Duration::from_secs(sample_secs);
    while Instant::now() < until {
        standing = standing.max(host.usage()?.rss_bytes);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    progress("one job per scale set");
    for name in &names {
        stack.enqueue(name, 1, Duration::from_secs(1));
    }
    let sampler = async {
        let mut most = 0u64;
        loop {
            if let Some(host) = stack.host()
                && let Ok(usage) = host.usage()
            {
                most = most.max(usage.rss_bytes);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            if stack.fake().control().ledger().jobs_succeeded >= u64::from(sets) {
                return most;
            }
        }
    };
    let during_jobs = tokio::time::timeout(Duration::from_secs(bound_secs), sampler)
        .await
        .context("the jobs did not all succeed")?;
    standing = standing.max(during_jobs);
    let usage = stack.host().context("the stack runs a host")?.usage()?;
    Ok(FleetReport {
        sets,
        runners: total,
        running,
        built_in,
        standing_rss_bytes: standing,
        peak_rss_bytes: usage.peak_rss_bytes,
        cpu: usage.cpu,
    })
}
