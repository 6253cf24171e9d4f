//! The figures a run reports, computed from what was recorded, without I/O.

use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, Instant};

/// The `p`-th percentile (0..=100) by nearest rank: the smallest sample
/// with at least `p` % of the samples at or below it. Nearest rank reports
/// a value that was measured, never an interpolation between two. `None`
/// for no samples.
pub fn percentile(samples: &[Duration], p: u32) -> Option<Duration> {
    if samples.is_empty() {
        return None;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let n = sorted.len();
    let rank = (usize::try_from(p.min(100)).unwrap_or(100) * n).div_ceil(100);
    Some(sorted[rank.clamp(1, n) - 1])
}

/// `count` over `over`, per second; 0 over no time, not infinity or NaN.
pub fn per_second(count: u64, over: Duration) -> f64 {
    let seconds = over.as_secs_f64();
    if seconds > 0.0 {
        count as f64 / seconds
    } else {
        0.0
    }
}

/// `numerator` over `denominator`; 0 over 0, not infinity or NaN, as
/// [`per_second`].
pub fn ratio(numerator: f64, denominator: f64) -> f64 {
    if denominator > 0.0 {
        numerator / denominator
    } else {
        0.0
    }
}

/// Per-job differences `to[job] - from[job]` for the jobs that have both.
pub fn intervals(from: &HashMap<u64, Instant>, to: &HashMap<u64, Instant>) -> Vec<Duration> {
    from.iter()
        .filter_map(|(job, start)| to.get(job).map(|end| end.saturating_duration_since(*start)))
        .collect()
}

/// When the live count first reached `target`, from `(when, count)` samples
/// in time order.
///
/// Also [`peak`]: the highest count and when it was first reached, for
/// saying how far a run that never reached its target got.
pub fn first_reaching(history: &[(Instant, usize)], target: usize) -> Option<Instant> {
    history
        .iter()
        .find(|(_, count)| *count >= target)
        .map(|(at, _)| *at)
}

/// The highest count of `(when, count)` samples and when it was first
/// reached.
pub fn peak(history: &[(Instant, usize)]) -> Option<(Instant, usize)> {
    history.iter().fold(
        None,
        |best: Option<(Instant, usize)>, &(at, count)| match best {
            Some((_, top)) if top >= count => best,
            _ => Some((at, count)),
        },
    )
}

/// The scale benchmark's result: the one line `cargo xtask bench scale`
/// prints.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchReport {
    /// Jobs run.
    pub jobs: u64,
    /// Burst enqueued to last job finished.
    pub wall: Duration,
    /// Wait from enqueued to started, 50th percentile.
    pub p50_wait: Duration,
    /// The same, 95th percentile.
    pub p95_wait: Duration,
    /// Burst enqueued to `min(jobs, max runners)` runner pods existing at
    /// once; `None` when the pods never all existed at the same time
    /// (printed `never`: a figure made up for it would hide the miss).
    pub scaleup: Option<Duration>,
    /// Job finished to its runner pod gone, 50th percentile.
    pub p50_cleanup: Duration,
    /// Calls the host made to the Actions service and GitHub API.
    pub actions_calls: u64,
    /// Requests the host made to the API server.
    pub apiserver_requests: u64,
    /// Of those, writes.
    pub apiserver_writes: u64,
    /// Host CPU time over the run.
    pub host_cpu: Duration,
    /// Host peak resident set, bytes.
    pub host_peak_rss_bytes: u64,
    /// Jobs the floor ran: the same jobs, after arcwright's run, through
    /// the benchmark's own minimal loop ([`crate::floor`]).
    pub floor_jobs: u64,
    /// The floor's first job enqueued to its last finished.
    pub floor_wall: Duration,
}

impl BenchReport {
    /// arcwright's throughput: jobs over the wall time.
    pub fn jobs_per_second(&self) -> f64 {
        per_second(self.jobs, self.wall)
    }

    /// The floor's throughput on the same jobs.
    pub fn floor_jobs_per_second(&self) -> f64 {
        per_second(self.floor_jobs, self.floor_wall)
    }

    /// arcwright's throughput over the floor's: 1 is as fast as the floor.
    pub fn floor_ratio(&self) -> f64 {
        ratio(self.jobs_per_second(), self.floor_jobs_per_second())
    }
}

impl fmt::Display for BenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let jobs = self.jobs.max(1) as f64;
        let wall = self.wall.as_secs_f64();
        write!(
            f,
            "jobs={} wall_s={:.2} jobs_per_s={:.2} p50_wait_ms={} p95_wait_ms={} scaleup_ms={} \
             p50_cleanup_ms={} actions_calls_per_job={:.2} apiserver_requests_per_job={:.2} \
             apiserver_writes_per_job={:.2} host_cpu_s={:.2} host_peak_rss_mib={:.1} \
             floor_jobs_per_s={:.2} floor_ratio={:.2}",
            self.jobs,
            wall,
            self.jobs_per_second(),
            self.p50_wait.as_millis(),
            self.p95_wait.as_millis(),
            self.scaleup
                .map_or_else(|| "never".to_owned(), |d| d.as_millis().to_string()),
            self.p50_cleanup.as_millis(),
            self.actions_calls as f64 / jobs,
            self.apiserver_requests as f64 / jobs,
            self.apiserver_writes as f64 / jobs,
            self.host_cpu.as_secs_f64(),
            self.host_peak_rss_bytes as f64 / (1024.0 * 1024.0),
            self.floor_jobs_per_second(),
            self.floor_ratio(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let samples: Vec<Duration> = (1..=20).rev().map(|v| ms(v * 10)).collect();
        assert_eq!(percentile(&samples, 50), Some(ms(100)));
        assert_eq!(percentile(&samples, 95), Some(ms(190)));
        assert_eq!(percentile(&samples, 100), Some(ms(200)));
        assert_eq!(percentile(&samples, 0), Some(ms(10)));
        assert_eq!(percentile(&[ms(7)], 95), Some(ms(7)));
        assert_eq!(percentile(&[], 50), None);
    }

    #[test]
    fn intervals_pair_jobs_and_skip_the_unfinished() {
        let t0 = Instant::now();
        let from: HashMap<u64, Instant> = [(1, t0), (2, t0), (3, t0)].into();
        let to: HashMap<u64, Instant> = [(1, t0 + ms(5)), (3, t0 + ms(9))].into();
        let mut got = intervals(&from, &to);
        got.sort();
        assert_eq!(got, [ms(5), ms(9)]);
    }

    #[test]
    fn the_first_sample_at_the_target_counts() {
        let t0 = Instant::now();
        let history = [(t0, 0), (t0 + ms(5), 2), (t0 + ms(9), 3), (t0 + ms(12), 1)];
        assert_eq!(first_reaching(&history, 3), Some(t0 + ms(9)));
        assert_eq!(first_reaching(&history, 4), None);
        assert_eq!(peak(&history), Some((t0 + ms(9), 3)));
        assert_eq!(peak(&[]), None);
    }

    #[test]
    fn the_report_is_one_line_with_every_field_in_order() {
        let report = BenchReport {
            jobs: 200,
            wall: Duration::from_secs(20),
            p50_wait: ms(1500),
            p95_wait: ms(3000),
            scaleup: Some(ms(1800)),
            p50_cleanup: ms(400),
            actions_calls: 220,
            apiserver_requests: 1300,
            apiserver_writes: 1000,
            host_cpu: ms(4500),
            host_peak_rss_bytes: 40 * 1024 * 1024 + 512 * 1024,
            floor_jobs: 200,
            floor_wall: Duration::from_secs(16),
        };
        let line = report.to_string();
        assert!(!line.contains('\n'));
        let keys: Vec<&str> = line
            .split(' ')
            .map(|pair| pair.split_once('=').unwrap().0)
            .collect();
        assert_eq!(
            keys,
            [
                "jobs",
                "wall_s",
                "jobs_per_s",
                "p50_wait_ms",
                "p95_wait_ms",
                "scaleup_ms",
                "p50_cleanup_ms",
                "actions_calls_per_job",
                "apiserver_requests_per_job",
                "apiserver_writes_per_job",
                "host_cpu_s",
                "host_peak_rss_mib",
                "floor_jobs_per_s",
                "floor_ratio"
            ]
        );
        assert!(line.contains("jobs_per_s=10.00"), "{line}");
        assert!(line.contains("actions_calls_per_job=1.10"), "{line}");
        assert!(line.contains("apiserver_writes_per_job=5.00"), "{line}");
        assert!(line.contains("host_peak_rss_mib=40.5"), "{line}");
        assert!(line.contains("scaleup_ms=1800 "), "{line}");
        assert!(line.contains("floor_jobs_per_s=12.50"), "{line}");
        assert!(line.ends_with(" floor_ratio=0.80"), "{line}");
        let missed = BenchReport {
            scaleup: None,
            ..report
        };
        assert!(missed.to_string().contains("scaleup_ms=never "), "{missed}");
        let no_floor = BenchReport {
            floor_jobs: 0,
            floor_wall: Duration::ZERO,
            ..missed
        };
        assert!(
            no_floor
                .to_string()
                .ends_with(" floor_jobs_per_s=0.00 floor_ratio=0.00"),
            "{no_floor}"
        );
    }

    #[test]
    fn a_ratio_over_nothing_is_zero() {
        assert_eq!(ratio(8.0, 10.0), 0.8);
        assert_eq!(ratio(8.0, 0.0), 0.0);
        assert_eq!(per_second(10, Duration::ZERO), 0.0);
    }
}
