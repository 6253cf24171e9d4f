//! A sample trace: one working day of one scale set, for trying
//! `arcwright policy simulate` without a recording of one's own, and for
//! the tests that compare the bundled policies on traffic with a shape.
//!
//! The day (Tuesday 2026-12-01, UTC) has a quiet night, a morning peak from
//! 09:00 to 11:00, a lunch dip and a smaller afternoon peak from 14:00 to
//! 16:00. Workflow runs arrive as a Poisson process whose rate follows
//! that shape; a run queues one to six jobs at once, each of one to
//! fifteen minutes. The scale set (`ci/linux`, maxRunners 20, minRunners
//! 0) is what ARC's formula would have made of it: each job assigned gets a
//! runner of its own, which takes 15 to 40 s to come online (most near the
//! low end), and at 20 jobs assigned the rest wait for a place. The trace
//! holds what a listener would have recorded of that: the four events of
//! every job with the service's times, and the decisions (on each
//! assignment, and on completions a batch window apart).
//!
//! Everything is integer arithmetic on [`Rng`]: a float's logarithm can
//! differ in its last bit between platforms' maths libraries, and the
//! committed file must be the same wherever CI regenerates it.

use jiff::Timestamp;

use super::simulate::Rng;
use crate::policy::types::{JobStatistics, RunnerCounts, ScaleSet, ScalingInput};
use crate::recording::{self, Decision, Entry, Header, Job, JobEvent};

/// The seed of the committed `policies/traces/workday.jsonl`.
pub const SEED: u64 = 1;

/// The committed trace, relative to the workspace root.
pub const PATH: &str = "policies/traces/workday.jsonl";

/// 2026-12-01T00:00:00Z, a Tuesday, in Unix ms.
const DAY_START_MS: i64 = 1_796_083_200_000;
const DAY_MS: i64 = 86_400_000;
const MAX_RUNNERS: u32 = 20;
const BATCH_WINDOW_MS: i64 = 2_000;

/// Workflow runs per hour, in thousandths, at minutes of the day; linear
/// in between.
const RATE: &[(i64, i64)] = &[
    (0, 2_000),
    (6 * 60, 2_000),
    (7 * 60 + 30, 20_000),
    (9 * 60, 55_000),
    (11 * 60, 55_000),
    (12 * 60, 20_000),
    (13 * 60, 20_000),
    (14 * 60, 35_000),
    (16 * 60, 35_000),
    (17 * 60 + 30, 10_000),
    (19 * 60, 3_000),
    (24 * 60, 2_000),
];

/// The rate at `second` of the day, runs per hour in thousandths.
fn rate(second: i64) -> i64 {
    let at = second * 1000;
    RATE.windows(2)
        .find(|pair| at < pair[1].0 * 60_000)
        .map_or(RATE[RATE.len() - 1].1, |pair| {
            let ((from, low), (to, high)) = (pair[0], pair[1]);
            let (from, to) = (from * 60_000, to * 60_000);
            low + (high - low) * (at - from) / (to - from)
        })
}

/// One job as production ran it, all times Unix ms.
struct Ran {
    id: i64,
    queued: i64,
    assigned: i64,
    /// The decision that created its runner.
    decided: i64,
    started: i64,
    finished: i64,
    failed: bool,
}

/// The workday trace for `seed`, in the recording format.
pub fn workday(seed: u64) -> String {
    let mut rng = Rng::new(seed);
    let arrivals = arrivals(&mut rng);
    let ran = run_day(&mut rng, arrivals);
    let scale_set = ScaleSet {
        name: "linux".to_owned(),
        namespace: "ci".to_owned(),
        min_runners: 0,
        max_runners: MAX_RUNNERS,
        labels: vec!["linux".to_owned()],
    };
    let mut entries: Vec<(i64, Entry)> = Vec::new();
    for job in &ran {
        entries.extend(job_entries(job));
    }
    let mut desired = 0;
    for at in decision_times(&ran) {
        let (input, answer) = decision_input(&ran, &scale_set, at, desired);
        desired = answer;
        entries.push((
            at,
            Entry::Decision(Decision {
                input,
                desired,
                reason: format!("minRunners 0 + assignedJobs {desired} = {desired}"),
                state_out: None,
                policy: "builtin:default".to_owned(),
                sha256: None,
                fallback_reason: None,
            }),
        ));
    }
    entries.sort_by_key(|(at, _)| *at);
    let header = Header {
        format: recording::FORMAT.to_owned(),
        namespace: scale_set.namespace.clone(),
        name: scale_set.name.clone(),
        dropped: 0,
    };
    let mut out = serde_json::to_string(&header).unwrap_or_default();
    out.push('\n');
    for (_, entry) in &entries {
        out.push_str(&serde_json::to_string(entry).unwrap_or_default());
        out.push('\n');
    }
    out
}

/// Queue times and durations of the day's jobs, in queue order.
fn arrivals(rng: &mut Rng) -> Vec<(i64, i64)> {
    let mut jobs = Vec::new();
    for second in 0..DAY_MS / 1000 {
        // A run in this second with probability rate / 3600.
        if (rng.below(3_600_000) as i64) >= rate(second) {
            continue;
        }
        let at = DAY_START_MS + second * 1000 + rng.below(1000) as i64;
        let count = match rng.below(100) {
            0..45 => 1,
            45..70 => 2,
            70..85 => 3,
            _ => 4 + rng.below(3) as i64,
        };
        for _ in 0..count {
            let seconds = match rng.below(100) {
                0..35 => 60 + rng.below(120),
                35..80 => 180 + rng.below(300),
                _ => 480 + rng.below(421),
            } as i64;
            jobs.push((at, seconds * 1000 + rng.below(1000) as i64));
        }
    }
    jobs.sort_unstable();
    jobs
}

/// What ARC's formula makes of the arrivals: a place among
/// [`MAX_RUNNERS`] in queue order, the earliest one to free, and a runner
/// of its own per job.
fn run_day(rng: &mut Rng, arrivals: Vec<(i64, i64)>) -> Vec<Ran> {
    let mut places: std::collections::BinaryHeap<std::cmp::Reverse<i64>> =
        std::collections::BinaryHeap::new();
    let mut ran = Vec::with_capacity(arrivals.len());
    for (index, (queued, duration)) in arrivals.into_iter().enumerate() {
        let free = if places.len() < MAX_RUNNERS as usize {
            queued
        } else {
            places.pop().map_or(queued, |place| place.0.max(queued))
        };
        let assigned = free + 500;
        let decided = assigned + 300;
        // 15 to 40 s, most near the low end.
        let spread = rng.below(1001) as i64;
        let start = 15_000 + 25_000 * spread * spread / 1_000_000;
        let started = decided + start;
        let finished = started + duration;
        places.push(std::cmp::Reverse(finished));
        ran.push(Ran {
            id: 100_000 + index as i64,
            queued,
            assigned,
            decided,
            started,
            finished,
            failed: rng.below(100) < 8,
        });
    }
    ran
}

fn rfc3339(ms: i64) -> String {
    Timestamp::from_millisecond(ms)
        .unwrap_or_default()
        .to_string()
}

/// The four events the listener saw of a job, at the times it saw them,
/// each with the service's times reached by then.
fn job_entries(job: &Ran) -> [(i64, Entry); 4] {
    let seen = |at: i64, event: JobEvent| {
        let reached = |time: i64| (time <= at).then(|| rfc3339(time));
        let completed = event == JobEvent::Completed;
        let result = if job.failed { "failed" } else { "succeeded" };
        (
            at,
            Entry::Job(Job {
                at: rfc3339(at),
                event,
                runner_request_id: job.id,
                labels: vec!["linux".to_owned()],
                queue_time: Some(rfc3339(job.queued)),
                scale_set_assign_time: reached(job.assigned),
                runner_assign_time: reached(job.started),
                finish_time: completed.then(|| rfc3339(job.finished)),
                result: completed.then(|| result.to_owned()),
            }),
        )
    };
    [
        seen(job.queued + 150, JobEvent::Available),
        seen(job.assigned + 150, JobEvent::Assigned),
        seen(job.started + 250, JobEvent::Started),
        seen(job.finished + 250, JobEvent::Completed),
    ]
}

/// When the listener decided: at the day's start and end, after each
/// assignment, and after completions, no two of those within a batch
/// window.
fn decision_times(ran: &[Ran]) -> Vec<i64> {
    let mut times: Vec<i64> = ran.iter().map(|job| job.decided).collect();
    times.sort_unstable();
    let mut completions: Vec<i64> = ran.iter().map(|job| job.finished + 400).collect();
    completions.sort_unstable();
    let mut kept: Vec<i64> = Vec::new();
    for at in completions {
        let near = |t: &i64| (at - BATCH_WINDOW_MS..=at).contains(t);
        let nearest = times.partition_point(|t| *t < at - BATCH_WINDOW_MS);
        let busy = times.get(nearest).is_some_and(near) || kept.last().is_some_and(near);
        if !busy {
            kept.push(at);
        }
    }
    times.extend(kept);
    times.extend([DAY_START_MS, DAY_START_MS + DAY_MS - 10_000]);
    times.sort_unstable();
    times.dedup();
    times
}

/// The input of a decision at `at` and the formula's answer, from the
/// jobs' times as the service and the controller would have counted them.
fn decision_input(
    ran: &[Ran],
    scale_set: &ScaleSet,
    at: i64,
    current_desired: u32,
) -> (ScalingInput, u32) {
    let count = |holds: &dyn Fn(&Ran) -> bool| ran.iter().filter(|job| holds(job)).count() as u32;
    let assigned = count(&|job| job.assigned <= at && at < job.finished);
    let running = count(&|job| job.started <= at && at < job.finished);
    let pending = count(&|job| job.decided < at && at < job.started);
    let statistics = JobStatistics {
        available_jobs: 0,
        acquired_jobs: count(&|job| job.queued <= at && at < job.started),
        assigned_jobs: assigned,
        running_jobs: running,
        registered_runners: pending + running,
        busy_runners: running,
        idle_runners: 0,
    };
    let runners = RunnerCounts {
        pending,
        running,
        busy: count(&|job| job.started + 250 <= at && at < job.finished),
        ..RunnerCounts::default()
    };
    let input = ScalingInput {
        scale_set: scale_set.clone(),
        statistics,
        runners,
        current_desired,
        now: Some(rfc3339(at)),
        state: None,
    };
    (input, assigned.min(scale_set.max_runners))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn committed_path() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(PATH)
    }

    /// Only what CI proves matches its source may be committed: the file is
    /// regenerated here and compared. `ARCWRIGHT_REGENERATE=1` rewrites it.
    #[test]
    fn the_committed_workday_trace_is_what_the_generator_makes() {
        let fresh = workday(SEED);
        let path = committed_path();
        if std::env::var_os("ARCWRIGHT_REGENERATE").is_some() {
            std::fs::write(&path, &fresh).unwrap();
            return;
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        if committed != fresh {
            let line = committed
                .lines()
                .zip(fresh.lines())
                .position(|(a, b)| a != b)
                .unwrap_or_else(|| committed.lines().count().min(fresh.lines().count()));
            panic!(
                "{PATH} is not what workday({SEED}) makes (first difference at line {}); \
                 regenerate it with\n  ARCWRIGHT_REGENERATE=1 cargo test --workspace --lib -- \
                 lab::workday::tests::the_committed_workday_trace_is_what_the_generator_makes",
                line + 1
            );
        }
    }

    #[test]
    fn the_day_has_a_morning_peak_a_smaller_afternoon_one_and_a_quiet_night() {
        let text = workday(SEED);
        assert!(text.len() < 1_500_000, "{} bytes", text.len());
        let trace = recording::read(&text).unwrap();
        let queued: Vec<i64> = trace
            .entries
            .iter()
            .filter_map(|entry| match entry {
                Entry::Job(job) if job.event == JobEvent::Completed => job
                    .queue_time
                    .as_deref()
                    .and_then(|t| t.parse::<Timestamp>().ok())
                    .map(|t| t.as_millisecond()),
                _ => None,
            })
            .collect();
        assert!(
            (300..=2000).contains(&queued.len()),
            "{} jobs",
            queued.len()
        );
        let between = |from: i64, to: i64| {
            queued
                .iter()
                .filter(|q| {
                    (DAY_START_MS + from * 3_600_000..DAY_START_MS + to * 3_600_000).contains(q)
                })
                .count()
        };
        // Jobs per hour of each part of the day.
        let (morning, afternoon, night) =
            (between(9, 11) / 2, between(14, 16) / 2, between(0, 6) / 6);
        assert!(
            morning > afternoon && afternoon > 4 * night,
            "{morning} {afternoon} {night}"
        );
    }

    #[test]
    fn durations_are_one_to_fifteen_minutes_and_waits_follow_the_formula() {
        let trace = recording::read(&workday(SEED)).unwrap();
        let ms = |t: &Option<String>| {
            t.as_deref()
                .unwrap()
                .parse::<Timestamp>()
                .unwrap()
                .as_millisecond()
        };
        let mut some_waited_for_a_place = false;
        for entry in &trace.entries {
            let Entry::Job(job) = entry else { continue };
            if job.event != JobEvent::Completed {
                continue;
            }
            let duration = ms(&job.finish_time) - ms(&job.runner_assign_time);
            assert!((60_000..=901_000).contains(&duration), "{duration}");
            let wait = ms(&job.runner_assign_time) - ms(&job.queue_time);
            assert!(wait >= 15_800, "{wait}");
            some_waited_for_a_place |= wait > 41_000;
        }
        assert!(some_waited_for_a_place, "the peak never reached maxRunners");
    }

    #[test]
    fn another_seed_is_another_day() {
        assert_ne!(workday(SEED), workday(SEED + 1));
        assert_eq!(workday(7), workday(7));
    }
}
