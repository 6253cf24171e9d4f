//! `arcwright policy simulate`: a recorded job stream run through a model
//! of one scale set under each candidate policy, to compare what each
//! would cost in waiting and in runners before any of them acts.
//!
//! Replaying recorded decisions answers "what would this policy have said
//! to those inputs"; it cannot answer "how long would jobs have waited",
//! because a different answer changes every input after it. So the model
//! here closes the loop: jobs arrive at their recorded queue time and run
//! for their recorded duration, and everything in between (when a runner
//! exists to take them) follows from the policy's decisions.
//!
//! # The model
//!
//! It is a discrete-event simulation on a millisecond clock, with three
//! actors that follow production's rules, each as far as it shapes a wait
//! or a runner's cost:
//!
//! - **The service** (as `tests/fake-actions` models it): a job is offered
//!   (`JobAvailable`), acquired by the listener, assigned to the scale set
//!   while fewer than `maxRunners` jobs hold a place there (`JobAssigned`),
//!   handed, oldest first, to an online runner without a job, lowest runner
//!   first (`JobStarted`), and completed after its recorded duration
//!   (`JobCompleted`), when the ephemeral runner's registration goes with
//!   it. Its statistics are counted from those states exactly as the fake
//!   counts them.
//! - **The listener**: messages batch the pending job events, at most
//!   [`SERVICE_BATCH_MAX`]; a message is acquired from, decided on (with
//!   the statistics it carried, through [`scaling_input`], with a
//!   [`PatchSequence`] numbering the answers) and its job starts recorded
//!   on the runners, in that order; the next poll waits out the batch
//!   window, except right after an acquisition as in
//!   `ListenerSpec::batch_window`; an empty long poll ends after
//!   [`LONG_POLL`] and is decided on too. The policy answers through a
//!   [`Decider`], which keeps its state between calls and falls back to the
//!   bundled default as in production; `now` is the model's clock.
//! - **The EphemeralRunnerSet controller**: a numbered decision creates
//!   runners up to its replica count; only a decision with patch id 0
//!   (steady at minRunners) removes runners above it, and only runners
//!   without a job, those still starting first, then the oldest. A runner
//!   created is registered (a JIT config) at once and online after the
//!   runner-start time. Its counts for the policy are ARC's phases:
//!   pending until online, running after, busy once the listener recorded
//!   its job's start.
//!
//! Deliberately not modelled, because each would need data a trace does
//! not hold or would change a comparison less than the noise of the
//! runner-start time: API latencies (a decision is applied the instant it
//! is made, with no creation batches), the controller's watch lag (except
//! for job records, which trail a decision by design), runner renewals (a
//! renewal is a registration like a creation, so the count is the same),
//! finished runners lingering as `Succeeded` (they are gone at once), a
//! decision left armed replacing a runner between two decisions, job
//! cancellations, requeues, runner failures and the service's assignment
//! timeout, label matching (every job of the trace is the scale set's),
//! and dependencies between jobs (queue times are taken as given, though a
//! job that waits for another would queue later behind a slow policy).
//!
//! The model is deterministic: the same trace, options and seed give the
//! same numbers. The one draw is each runner's start time when it is
//! estimated from the trace ([`RunnerStart::Estimated`]), from a seeded
//! generator of this module's own, so an upgrade of a random-number crate
//! cannot change a table.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use jiff::Timestamp;
use serde::Serialize;

use crate::actions::RunnerScaleSetStatistic;
use crate::listener::{
    DEFAULT_BATCH_WINDOW, Observed, PatchSequence, SERVICE_BATCH_MAX, ScalePatch, scaling_input,
};
use crate::policy::types::{RunnerCounts, ScaleSet};
use crate::policy::{
    CallLimits, Decider, EngineConfig, MAX_DEADLINE, Policy, PolicyEngine, PolicyEvent, PolicyKind,
    PolicyReporter,
};
use crate::recording::{self, Entry, JobEvent, Trace};

/// The seed when none is given.
pub const DEFAULT_SEED: u64 = 1;

/// The runner-start time when neither `--runner-start` nor the trace says
/// one: a runner pod scheduled on a warm node, its image cached, the runner
/// registered and connected, in the range ARC users report (20 to 40 s).
pub const DEFAULT_RUNNER_START: Duration = Duration::from_secs(30);

/// How long the service holds a long poll with nothing to deliver (the
/// Actions service answers an empty poll after about 50 s).
pub const LONG_POLL: Duration = Duration::from_secs(50);

/// How long past the end of the trace the model goes on for jobs still
/// waiting or running. A policy that leaves jobs waiting longer than this
/// has them counted as unserved, waiting until then.
pub const DRAIN: Duration = Duration::from_secs(3600);

/// The fewest estimates from the trace the model samples from; fewer are
/// too few to stand for a distribution, and [`DEFAULT_RUNNER_START`] is
/// used instead.
pub const MIN_START_SAMPLES: usize = 5;

/// The longest gap between a scale-up and the next job start that is still
/// taken for a runner start; longer, something else held the job (the
/// runner failed, the node pool grew) and it would skew the estimate.
pub const MAX_START_SAMPLE: Duration = Duration::from_secs(600);

/// What the model is told besides the trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// How long a runner takes from creation to online; `None` estimates
    /// it from the trace ([`estimate_runner_start`]).
    pub runner_start: Option<Duration>,
    /// Replaces the trace's maxRunners (also the capacity the listener
    /// announces).
    pub max_runners: Option<u32>,
    /// Replaces the trace's minRunners.
    pub min_runners: Option<u32>,
    /// The seed of the runner-start draws.
    pub seed: u64,
    /// The listener's batch window.
    pub batch_window: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            runner_start: None,
            max_runners: None,
            min_runners: None,
            seed: DEFAULT_SEED,
            batch_window: DEFAULT_BATCH_WINDOW,
        }
    }
}

/// How long each runner takes to come online.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunnerStart {
    /// As given (`--runner-start`), the same for every runner.
    Given(Duration),
    /// Drawn, for each runner, from the starts estimated from the trace
    /// (at least [`MIN_START_SAMPLES`]): the spread of real pod starts is
    /// what the slow tail of waits is made of, which a mean would hide.
    Estimated(Vec<Duration>),
    /// [`DEFAULT_RUNNER_START`] for every runner: the trace shows too few
    /// starts to estimate from.
    Assumed(Duration),
}

impl RunnerStart {
    fn draw(&self, rng: &mut Rng) -> i64 {
        let start = match self {
            Self::Given(start) | Self::Assumed(start) => *start,
            Self::Estimated(samples) => {
                let index = rng.below(samples.len() as u64) as usize;
                samples.get(index).copied().unwrap_or(DEFAULT_RUNNER_START)
            }
        };
        millis(start)
    }

    /// In words, for the table's heading.
    pub fn describe(&self) -> String {
        match self {
            Self::Given(start) => format!("{} (given)", seconds(millis(*start))),
            Self::Estimated(samples) => {
                let mut sorted: Vec<i64> = samples.iter().map(|s| millis(*s)).collect();
                sorted.sort_unstable();
                format!(
                    "drawn from {} scale-ups in the trace (median {}, p95 {})",
                    samples.len(),
                    seconds(percentile(&sorted, 50)),
                    seconds(percentile(&sorted, 95))
                )
            }
            Self::Assumed(start) => format!(
                "{} (assumed: fewer than {MIN_START_SAMPLES} scale-ups in the trace to estimate from)",
                seconds(millis(*start))
            ),
        }
    }
}

/// A job as the model runs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceJob {
    /// Its request id in the trace.
    pub runner_request_id: i64,
    /// When it was queued, Unix milliseconds.
    pub queued_ms: i64,
    /// How long it ran (its runner's assignment to its finish), ms.
    pub duration_ms: i64,
}

/// A trace made ready for the model: the scale set, the jobs in queue
/// order, the span and the runner-start model. Built once and run under
/// every policy, so all of them meet the same jobs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    /// The scale set, as the trace's last decision saw it, with the
    /// options' overrides.
    pub scale_set: ScaleSet,
    /// The jobs, by queue time.
    pub jobs: Vec<TraceJob>,
    /// Jobs of the trace left out for lack of the times the model needs.
    pub skipped: usize,
    /// The earliest time in the trace, Unix ms: where the model starts,
    /// with no runners.
    pub start_ms: i64,
    /// The latest time in the trace, Unix ms.
    pub end_ms: i64,
    /// How long runners take to come online.
    pub runner_start: RunnerStart,
    /// The seed of its draws.
    pub seed: u64,
    /// The listener's batch window.
    pub batch_window: Duration,
}

/// A trace the model cannot run.
#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    /// No job with a queue time, a runner assignment and a finish.
    #[error(
        "the trace holds no job the model can run: {skipped} job(s) lack a queue time, a runner \
         assignment or a finish (cancelled before a runner took them, or not completed within \
         the trace)"
    )]
    NoJobs {
        /// The jobs seen, all skipped.
        skipped: usize,
    },
    /// No decision to read maxRunners from, and none given.
    #[error(
        "the trace holds no decision to read the scale set's maxRunners from; give --max-runners"
    )]
    NoScaleSet,
    /// maxRunners is 0: no job could ever run.
    #[error("maxRunners is 0, so no job could run; give --max-runners")]
    NoCapacity,
    /// minRunners above maxRunners.
    #[error("minRunners {min} is above maxRunners {max}")]
    MinAboveMax {
        /// minRunners.
        min: u32,
        /// maxRunners.
        max: u32,
    },
}

impl Workload {
    /// Reads what the model needs from `trace`.
    ///
    /// A job is run from its last completion carrying a queue time, a
    /// runner assignment and a finish: a requeued job then runs once, as it
    /// finally did. Jobs without one are counted in [`Workload::skipped`].
    pub fn from_trace(trace: &Trace, options: &Options) -> Result<Self, SimulateError> {
        let last_decision = trace.entries.iter().rev().find_map(|entry| match entry {
            Entry::Decision(decision) => Some(decision),
            Entry::Job(_) => None,
        });
        let mut scale_set = match last_decision {
            Some(decision) => decision.input.scale_set.clone(),
            None if options.max_runners.is_some() => ScaleSet {
                name: trace.header.name.clone(),
                namespace: trace.header.namespace.clone(),
                ..ScaleSet::default()
            },
            None => return Err(SimulateError::NoScaleSet),
        };
        if let Some(max) = options.max_runners {
            scale_set.max_runners = max;
        }
        if let Some(min) = options.min_runners {
            scale_set.min_runners = min;
        }
        if scale_set.max_runners == 0 {
            return Err(SimulateError::NoCapacity);
        }
        if scale_set.min_runners > scale_set.max_runners {
            return Err(SimulateError::MinAboveMax {
                min: scale_set.min_runners,
                max: scale_set.max_runners,
            });
        }
        let (jobs, skipped) = runnable_jobs(trace);
        if jobs.is_empty() {
            return Err(SimulateError::NoJobs { skipped });
        }
        let (start_ms, end_ms) = span(trace, &jobs);
        let runner_start = match options.runner_start {
            Some(start) => RunnerStart::Given(start),
            None => {
                let samples = estimate_runner_start(trace);
                if samples.len() >= MIN_START_SAMPLES {
                    RunnerStart::Estimated(samples)
                } else {
                    RunnerStart::Assumed(DEFAULT_RUNNER_START)
                }
            }
        };
        Ok(Self {
            scale_set,
            jobs,
            skipped,
            start_ms,
            end_ms,
            runner_start,
            seed: options.seed,
            batch_window: options.batch_window,
        })
    }
}

fn parse_ms(text: Option<&str>) -> Option<i64> {
    text?.parse::<Timestamp>().ok().map(|t| t.as_millisecond())
}

/// The jobs the model can run, by queue time, and how many it cannot.
fn runnable_jobs(trace: &Trace) -> (Vec<TraceJob>, usize) {
    let mut seen = BTreeSet::new();
    let mut runnable = BTreeMap::new();
    for entry in &trace.entries {
        let Entry::Job(job) = entry else { continue };
        seen.insert(job.runner_request_id);
        if job.event != JobEvent::Completed {
            continue;
        }
        let times = (
            parse_ms(job.queue_time.as_deref()),
            parse_ms(job.runner_assign_time.as_deref()),
            parse_ms(job.finish_time.as_deref()),
        );
        if let (Some(queued_ms), Some(assigned), Some(finished)) = times
            && finished >= assigned
        {
            runnable.insert(
                job.runner_request_id,
                TraceJob {
                    runner_request_id: job.runner_request_id,
                    queued_ms,
                    duration_ms: finished - assigned,
                },
            );
        }
    }
    let skipped = seen.len() - runnable.len();
    let mut jobs: Vec<TraceJob> = runnable.into_values().collect();
    jobs.sort_by_key(|job| (job.queued_ms, job.runner_request_id));
    (jobs, skipped)
}

/// The earliest and latest times the trace mentions.
fn span(trace: &Trace, jobs: &[TraceJob]) -> (i64, i64) {
    let mut times: Vec<i64> = Vec::new();
    for entry in &trace.entries {
        match entry {
            Entry::Decision(decision) => times.extend(parse_ms(decision.input.now.as_deref())),
            Entry::Job(job) => {
                times.extend(parse_ms(Some(&job.at)));
                times.extend(parse_ms(job.finish_time.as_deref()));
            }
        }
    }
    times.extend(jobs.iter().map(|job| job.queued_ms));
    let start = times.iter().copied().min().unwrap_or_default();
    let end = times.iter().copied().max().unwrap_or_default();
    (start, end)
}

/// The runner starts the trace shows: for every recorded decision that
/// scaled up while jobs waited with no runner idle or starting (so the next
/// job to start can only start on a runner this decision created), the time
/// from the decision to that start. Gaps over [`MAX_START_SAMPLE`] are left
/// out. The estimate includes what production adds to a pod's start (the
/// controller's reaction, scheduling, the runner's registration), which is
/// what a waiting job feels.
pub fn estimate_runner_start(trace: &Trace) -> Vec<Duration> {
    let starts: Vec<i64> = trace
        .entries
        .iter()
        .filter_map(|entry| match entry {
            Entry::Job(job) => parse_ms(job.runner_assign_time.as_deref()),
            Entry::Decision(_) => None,
        })
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let mut samples = Vec::new();
    for entry in &trace.entries {
        let Entry::Decision(decision) = entry else {
            continue;
        };
        let input = &decision.input;
        let waiting = input.statistics.assigned_jobs > input.statistics.running_jobs;
        let nothing_ready = input.runners.pending == 0 && input.statistics.idle_runners == 0;
        let scales_up = decision.desired > input.current_desired
            && decision.desired > input.runners.running + input.runners.pending;
        let Some(at) = parse_ms(input.now.as_deref()) else {
            continue;
        };
        if !(waiting && nothing_ready && scales_up) {
            continue;
        }
        let next = starts.partition_point(|start| *start <= at);
        if let Some(start) = starts.get(next)
            && start - at <= millis(MAX_START_SAMPLE)
        {
            samples.push(Duration::from_millis((start - at) as u64));
        }
    }
    samples
}

/// A module and its settings, as `--policy` names them.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicySpec {
    /// `builtin:NAME` or a path to a `.wasm` component.
    pub module: String,
    /// The settings, `None` for none.
    pub settings: Option<serde_json::Value>,
}

impl PolicySpec {
    /// `MODULE` or `MODULE=SETTINGS`, split at the first `=`; `SETTINGS` is
    /// inline JSON, or `@PATH` of a JSON or YAML file (a module path with a
    /// `=` in it cannot be named; rename the file).
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let Some((module, settings)) = text.split_once('=') else {
            return Ok(Self {
                module: text.to_owned(),
                settings: None,
            });
        };
        let settings = match settings.strip_prefix('@') {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading the settings file {path}"))?;
                serde_yaml::from_str(&text)
                    .with_context(|| format!("the settings file {path} is not JSON or YAML"))?
            }
            None => serde_json::from_str(settings).with_context(|| {
                format!(
                    "the settings {settings:?} are not JSON (write MODULE=JSON or MODULE=@PATH)"
                )
            })?,
        };
        Ok(Self {
            module: module.to_owned(),
            settings: Some(settings),
        })
    }

    /// How the table names it: the module, and the settings as compact JSON.
    pub fn label(&self) -> String {
        match &self.settings {
            None => self.module.clone(),
            Some(settings) => format!("{} {settings}", self.module),
        }
    }
}

/// A policy ready to be simulated: what production would run, and the
/// bundled default behind it. Each simulation makes its own [`Decider`]
/// from them, so no state carries over from one run to the next.
#[derive(Clone, Debug)]
pub struct PolicyUnderTest {
    label: String,
    policy: Arc<Policy>,
    fallback: Arc<Policy>,
}

impl PolicyUnderTest {
    /// `policy`, labelled `label` in the table, with `fallback` behind it.
    pub fn new(label: impl Into<String>, policy: Arc<Policy>, fallback: Arc<Policy>) -> Self {
        Self {
            label: label.into(),
            policy,
            fallback,
        }
    }

    /// The policies `decider` decides with (not its state: a simulation
    /// starts its own), such as one [`super::candidate`] configured.
    pub fn from_decider(label: impl Into<String>, decider: &Decider) -> Self {
        Self::new(label, decider.current(), Arc::clone(decider.fallback()))
    }

    /// Loads `spec` as [`super::candidate`] does for the lab: the
    /// production memory cap, its settings validated as the controller
    /// would, and the bundled default behind it; but the longest deadline a
    /// call may be given ([`MAX_DEADLINE`]), not the production 50 ms.
    ///
    /// A simulation replays thousands of decisions in a moment, and its
    /// table must be the same for the same workload on any machine: held
    /// to the production deadline, a call that a loaded machine (a CI run,
    /// a laptop building) stalls for 50 ms fell back to the default, and
    /// the table changed with the load. Whether a policy is fast enough
    /// for production is what `arcwright policy test` and the policy
    /// benchmark say.
    ///
    /// A policy that cannot be loaded is an error here, where production
    /// would let the default stand in: a table that silently showed the
    /// default under the candidate's name would be worse than none.
    pub fn load(engine: &PolicyEngine, spec: &PolicySpec) -> anyhow::Result<Self> {
        let decider = super::candidate(
            engine,
            &spec.module,
            spec.settings.as_ref(),
            CallLimits {
                deadline: MAX_DEADLINE,
                ..CallLimits::default()
            },
        )?;
        Ok(Self::from_decider(spec.label(), &decider))
    }

    /// The label the table shows.
    pub fn label(&self) -> &str {
        &self.label
    }
}

/// How a runner's life ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum RunnerEnd {
    /// Its job finished, and its registration with it.
    Finished,
    /// Removed by a scale-down.
    ScaledDown,
    /// Still there when the model stopped.
    Remaining,
}

/// One runner, from creation to its end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunnerLife {
    /// Created (and registered), Unix ms.
    pub created_ms: i64,
    /// Came online, if it did.
    pub online_ms: Option<i64>,
    /// The job it ran (an index into [`Workload::jobs`]), if any.
    pub job: Option<usize>,
    /// When it took that job.
    pub job_started_ms: Option<i64>,
    /// When it ended (the horizon for one remaining).
    pub ended_ms: i64,
    /// How.
    pub end: RunnerEnd,
}

/// One policy's numbers. Everything here follows from the trace, the
/// options and the seed alone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// Jobs run.
    pub jobs: usize,
    /// Jobs that never started before the model stopped; their wait is
    /// counted up to then, so the percentiles are a lower bound.
    pub unserved: usize,
    /// Median wait, queue to runner start, ms.
    pub wait_p50_ms: i64,
    /// 95th percentile wait, ms.
    pub wait_p95_ms: i64,
    /// Longest wait, ms.
    pub wait_max_ms: i64,
    /// Runner time running jobs, ms.
    pub busy_runner_ms: i64,
    /// Runner time online without a job, ms: the cost of warm capacity.
    pub idle_runner_ms: i64,
    /// Runner time from creation to online, ms: a pod that costs while it
    /// boots.
    pub starting_runner_ms: i64,
    /// Runners created, each a JIT config (a registration).
    pub registrations: usize,
    /// Runners removed by scale-downs.
    pub scaled_down: usize,
    /// The most runners at once (starting or online).
    pub peak_runners: usize,
    /// Policy calls.
    pub decisions: u64,
    /// Decisions the bundled default made because the policy failed.
    pub fallbacks: u64,
    /// Decisions not made at all (the default failed too): nothing applied.
    pub undecided: u64,
    /// When the model stopped, Unix ms: the end of the trace, or later
    /// when jobs were still waiting or running then.
    pub horizon_ms: i64,
}

/// What one policy did on a workload.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The policy's label.
    pub policy: String,
    /// Its numbers.
    pub summary: Summary,
    /// Every runner it had.
    pub runners: Vec<RunnerLife>,
    /// Why the policy failed the first time the default answered for it.
    pub first_fallback: Option<String>,
    /// Wall time the simulation took (not deterministic: not in the
    /// summary).
    pub wall: Duration,
}

impl Outcome {
    /// Decisions made per second of wall time: how fast the model runs the
    /// policy, which is mostly how fast the policy runs.
    pub fn decisions_per_second(&self) -> f64 {
        self.summary.decisions as f64 / self.wall.as_secs_f64().max(1e-9)
    }
}

/// Runs `workload` under `policy`.
pub fn simulate(workload: &Workload, policy: &PolicyUnderTest) -> Outcome {
    let started = Instant::now();
    let decider = Decider::new(
        Arc::clone(&policy.policy),
        Arc::clone(&policy.fallback),
        Arc::new(Unreported),
    );
    let (summary, runners, first_fallback) = Model::new(workload, decider).run();
    Outcome {
        policy: policy.label.clone(),
        summary,
        runners,
        first_fallback,
        wall: started.elapsed(),
    }
}

/// The model counts fallbacks from the decisions themselves; the events
/// production reports (log lines, metrics) have no one to go to here.
struct Unreported;

impl PolicyReporter for Unreported {
    fn report(&self, _kind: PolicyKind, _policy: &str, _event: PolicyEvent) {}
}

/// The table: the workload in a heading, then one row per policy.
pub fn render_table(workload: &Workload, outcomes: &[Outcome]) -> String {
    let set = &workload.scale_set;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}/{}: {} jobs ({} skipped) from {} to {}; minRunners {}, maxRunners {}",
        set.namespace,
        set.name,
        workload.jobs.len(),
        workload.skipped,
        timestamp(workload.start_ms),
        timestamp(workload.end_ms),
        set.min_runners,
        set.max_runners,
    );
    let _ = writeln!(
        out,
        "runner start: {}; seed {}; batch window {}\n",
        workload.runner_start.describe(),
        workload.seed,
        seconds(millis(workload.batch_window)),
    );
    let headers = [
        "policy",
        "wait p50",
        "wait p95",
        "busy runner-s",
        "idle runner-s",
        "starting runner-s",
        "registrations",
        "peak",
        "decisions",
        "decisions/s",
    ];
    let rows: Vec<Vec<String>> = outcomes
        .iter()
        .map(|outcome| {
            let s = &outcome.summary;
            vec![
                outcome.policy.clone(),
                seconds(s.wait_p50_ms),
                seconds(s.wait_p95_ms),
                whole_seconds(s.busy_runner_ms),
                whole_seconds(s.idle_runner_ms),
                whole_seconds(s.starting_runner_ms),
                s.registrations.to_string(),
                s.peak_runners.to_string(),
                s.decisions.to_string(),
                format!("{:.0}", outcome.decisions_per_second()),
            ]
        })
        .collect();
    let widths: Vec<usize> = (0..headers.len())
        .map(|column| {
            rows.iter()
                .map(|row| row[column].chars().count())
                .chain([headers[column].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: &[&str]| {
        let mut text = String::new();
        for (column, cell) in cells.iter().enumerate() {
            let width = widths[column];
            if column == 0 {
                let _ = write!(text, "{cell:<width$}");
            } else {
                let _ = write!(text, "  {cell:>width$}");
            }
        }
        text.trim_end().to_owned()
    };
    out.push_str(&line(&headers));
    out.push('\n');
    for row in &rows {
        let cells: Vec<&str> = row.iter().map(String::as_str).collect();
        out.push_str(&line(&cells));
        out.push('\n');
    }
    for outcome in outcomes {
        let s = &outcome.summary;
        if s.unserved > 0 {
            let _ = writeln!(
                out,
                "{}: {} job(s) never started before {}; their waits count up to then",
                outcome.policy,
                s.unserved,
                timestamp(s.horizon_ms)
            );
        }
        if let Some(reason) = &outcome.first_fallback {
            let _ = writeln!(
                out,
                "{}: {} of {} decisions fell back to the bundled default; the first because: {reason}",
                outcome.policy, s.fallbacks, s.decisions
            );
        }
        if s.undecided > 0 {
            let _ = writeln!(
                out,
                "{}: {} decisions were not made (the default failed too)",
                outcome.policy, s.undecided
            );
        }
    }
    out
}

/// The JSON form: the workload and, per policy, its summary.
pub fn render_json(workload: &Workload, outcomes: &[Outcome]) -> serde_json::Value {
    serde_json::json!({
        "scaleSet": workload.scale_set,
        "jobs": workload.jobs.len(),
        "skipped": workload.skipped,
        "start": timestamp(workload.start_ms),
        "end": timestamp(workload.end_ms),
        "runnerStart": workload.runner_start.describe(),
        "seed": workload.seed,
        "batchWindowMs": millis(workload.batch_window),
        "policies": outcomes.iter().map(|outcome| serde_json::json!({
            "policy": outcome.policy,
            "summary": outcome.summary,
            "firstFallback": outcome.first_fallback,
            "wallSeconds": outcome.wall.as_secs_f64(),
            "decisionsPerSecond": outcome.decisions_per_second(),
        })).collect::<Vec<_>>(),
    })
}

/// `arcwright policy simulate`: runs a recorded trace through a model of
/// its scale set under each policy and prints one row per policy.
#[derive(Debug, clap::Args)]
pub struct SimulateArgs {
    /// A trace in the recording format (`arcwright.dev/recording/v1`), such
    /// as policies/traces/workday.jsonl.
    pub trace: PathBuf,
    /// A policy to simulate, repeated for each: `builtin:NAME` or a path to
    /// a `.wasm` component, optionally with settings after `=`, inline JSON
    /// or `@PATH` of a JSON or YAML file:
    /// `--policy 'builtin:buffered={"idle": 2}'`.
    #[arg(long = "policy", required = true, value_name = "MODULE[=SETTINGS]")]
    pub policies: Vec<String>,
    /// How long a runner takes from creation to online, in milliseconds;
    /// by default estimated from the trace's scale-ups, or 30 s when it
    /// shows fewer than 5.
    #[arg(long, value_name = "MS")]
    pub runner_start: Option<u64>,
    /// Replaces the trace's maxRunners.
    #[arg(long, value_name = "N")]
    pub max_runners: Option<u32>,
    /// Replaces the trace's minRunners.
    #[arg(long, value_name = "N")]
    pub min_runners: Option<u32>,
    /// The seed of the runner-start draws (used when they are estimated).
    #[arg(long, default_value_t = DEFAULT_SEED)]
    pub seed: u64,
    /// The listener's batch window, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = DEFAULT_BATCH_WINDOW.as_millis() as u64)]
    pub batch_window: u64,
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
}

impl SimulateArgs {
    /// Runs every policy and prints the table (or JSON).
    pub fn run(self) -> anyhow::Result<ExitCode> {
        print!("{}", self.report()?);
        Ok(ExitCode::SUCCESS)
    }

    /// What [`SimulateArgs::run`] prints. Every policy is loaded before the
    /// first simulation starts, so a mistake in the last `--policy` is
    /// found at once.
    pub fn report(self) -> anyhow::Result<String> {
        let path = self.trace.display().to_string();
        let text = std::fs::read_to_string(&self.trace)
            .with_context(|| format!("reading the trace {path}"))?;
        let trace = recording::read(&text).with_context(|| format!("in {path}"))?;
        let options = Options {
            runner_start: self.runner_start.map(Duration::from_millis),
            max_runners: self.max_runners,
            min_runners: self.min_runners,
            seed: self.seed,
            batch_window: Duration::from_millis(self.batch_window),
        };
        let workload =
            Workload::from_trace(&trace, &options).with_context(|| format!("in {path}"))?;
        let engine = PolicyEngine::new(EngineConfig::default())?;
        let policies = self
            .policies
            .iter()
            .map(|text| {
                PolicySpec::parse(text)
                    .and_then(|spec| PolicyUnderTest::load(&engine, &spec))
                    .with_context(|| format!("--policy {text}"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let outcomes: Vec<Outcome> = policies
            .iter()
            .map(|policy| simulate(&workload, policy))
            .collect();
        Ok(if self.json {
            format!(
                "{}\n",
                serde_json::to_string_pretty(&render_json(&workload, &outcomes))?
            )
        } else {
            render_table(&workload, &outcomes)
        })
    }
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

fn timestamp(ms: i64) -> String {
    Timestamp::from_millisecond(ms)
        .unwrap_or_default()
        .to_string()
}

fn seconds(ms: i64) -> String {
    format!("{:.1}s", ms as f64 / 1000.0)
}

fn whole_seconds(ms: i64) -> String {
    format!("{:.0}", ms as f64 / 1000.0)
}

/// The nearest-rank percentile of sorted values; 0 for none.
fn percentile(sorted: &[i64], percent: usize) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (sorted.len() * percent).div_ceil(100).max(1);
    sorted[rank - 1]
}

/// SplitMix64: small, fast, and fixed here, so a seed means the same draws
/// whatever version of a random-number crate the workspace uses (the
/// committed sample trace depends on it too).
#[derive(Clone, Debug)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A draw from `0..n` (0 when `n` is 0).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

/// What happens next in the model. Ties on the clock go in the order the
/// events were scheduled, so events of one instant are all in the service's
/// queue before a delivery scheduled at that instant takes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// A job is queued.
    Arrive(usize),
    /// A runner comes online.
    Online(usize),
    /// A job finishes.
    Finish(usize),
    /// The listener polls.
    Poll,
    /// The long poll of this generation gets a message.
    Deliver(u64),
    /// The long poll of this generation ends empty.
    PollTimeout(u64),
}

/// A job message waiting in the service's queue.
#[derive(Clone, Copy, Debug)]
enum Item {
    Available(usize),
    Assigned,
    Started { runner: usize },
    Completed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum JobPhase {
    NotQueued,
    Available,
    /// Acquired, held back by the scale set's capacity.
    Held,
    /// Assigned to the scale set, waiting for a runner.
    Waiting,
    Running {
        runner: usize,
    },
    Finished,
}

#[derive(Clone, Debug)]
struct JobState {
    phase: JobPhase,
    started_ms: Option<i64>,
}

#[derive(Clone, Debug)]
struct RunnerState {
    created_ms: i64,
    online_ms: Option<i64>,
    job: Option<usize>,
    job_started_ms: Option<i64>,
    /// The listener wrote its job's start on it: the controller counts it
    /// busy.
    recorded: bool,
    ended: Option<(i64, RunnerEnd)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Listening {
    /// Between a message and the next poll.
    Sleeping,
    /// In the long poll of this generation.
    Waiting(u64),
}

/// The scale set, its listener, its controller and the service, on one
/// clock.
struct Model<'a> {
    workload: &'a Workload,
    decider: Decider,
    rng: Rng,
    clock: i64,
    scheduled: u64,
    events: BinaryHeap<Reverse<(i64, u64, Event)>>,
    jobs: Vec<JobState>,
    runners: Vec<RunnerState>,

    // The service.
    queue: VecDeque<Item>,
    available: usize,
    held: BTreeSet<usize>,
    waiting: BTreeSet<usize>,
    running: usize,
    /// Online runners without a job, by id (the service hands jobs to the
    /// lowest first).
    idle: BTreeSet<usize>,
    /// Runners neither finished nor removed, by id (creation order).
    alive: BTreeSet<usize>,

    // The listener.
    listening: Listening,
    generation: u64,
    delivery_due: bool,
    statistics: Option<RunnerScaleSetStatistic>,
    sequence: PatchSequence,
    polled_early: bool,

    // The EphemeralRunnerSet.
    replicas: Option<u32>,

    // Tallies.
    decisions: u64,
    fallbacks: u64,
    undecided: u64,
    first_fallback: Option<String>,
    peak: usize,
    finished: usize,
    last_finish_ms: i64,
}

impl<'a> Model<'a> {
    fn new(workload: &'a Workload, decider: Decider) -> Self {
        Self {
            workload,
            decider,
            rng: Rng::new(workload.seed),
            clock: workload.start_ms,
            scheduled: 0,
            events: BinaryHeap::new(),
            jobs: vec![
                JobState {
                    phase: JobPhase::NotQueued,
                    started_ms: None,
                };
                workload.jobs.len()
            ],
            runners: Vec::new(),
            queue: VecDeque::new(),
            available: 0,
            held: BTreeSet::new(),
            waiting: BTreeSet::new(),
            running: 0,
            idle: BTreeSet::new(),
            alive: BTreeSet::new(),
            listening: Listening::Sleeping,
            generation: 0,
            delivery_due: false,
            statistics: None,
            sequence: PatchSequence::resume(0, None),
            polled_early: false,
            replicas: None,
            decisions: 0,
            fallbacks: 0,
            undecided: 0,
            first_fallback: None,
            peak: 0,
            finished: 0,
            last_finish_ms: workload.start_ms,
        }
    }

    fn run(mut self) -> (Summary, Vec<RunnerLife>, Option<String>) {
        for (index, job) in self.workload.jobs.iter().enumerate() {
            self.schedule(job.queued_ms, Event::Arrive(index));
        }
        // A new session: decided on at once, on the session's statistics
        // (the service's at its creation), then the first poll.
        self.statistics = Some(self.service_statistics());
        self.decide();
        self.poll();
        let end = self.workload.end_ms;
        let hard_stop = end.saturating_add(millis(DRAIN));
        while let Some(Reverse((at, _, event))) = self.events.pop() {
            let all_done = self.finished == self.jobs.len();
            if at > hard_stop || (all_done && at > end) {
                break;
            }
            self.clock = at;
            self.handle(event);
        }
        let horizon = if self.finished == self.jobs.len() {
            end.max(self.last_finish_ms)
        } else {
            hard_stop
        };
        self.tally(horizon)
    }

    fn schedule(&mut self, at: i64, event: Event) {
        self.scheduled += 1;
        self.events.push(Reverse((at, self.scheduled, event)));
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Arrive(job) => {
                self.jobs[job].phase = JobPhase::Available;
                self.available += 1;
                self.post(Item::Available(job));
            }
            Event::Online(runner) => {
                if self.runners[runner].ended.is_some() {
                    return;
                }
                self.runners[runner].online_ms = Some(self.clock);
                self.idle.insert(runner);
                self.hand_to_runners();
            }
            Event::Finish(job) => self.finish(job),
            Event::Poll => self.poll(),
            Event::Deliver(generation) => {
                self.delivery_due = false;
                if self.listening == Listening::Waiting(generation) {
                    self.deliver();
                }
            }
            Event::PollTimeout(generation) => {
                if self.listening == Listening::Waiting(generation) && !self.delivery_due {
                    self.decide();
                    self.poll();
                }
            }
        }
    }

    // The service.

    fn post(&mut self, item: Item) {
        self.queue.push_back(item);
        if let Listening::Waiting(generation) = self.listening
            && !self.delivery_due
        {
            self.delivery_due = true;
            self.schedule(self.clock, Event::Deliver(generation));
        }
    }

    fn service_statistics(&self) -> RunnerScaleSetStatistic {
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        RunnerScaleSetStatistic {
            total_available_jobs: count(self.available),
            total_acquired_jobs: count(self.held.len() + self.waiting.len()),
            total_assigned_jobs: count(self.waiting.len() + self.running),
            total_running_jobs: count(self.running),
            total_registered_runners: count(self.alive.len()),
            total_busy_runners: count(self.running),
            total_idle_runners: count(self.idle.len()),
        }
    }

    /// Acquires the offered jobs still available; whether any was.
    fn acquire(&mut self, offered: &[usize]) -> bool {
        let mut any = false;
        for &job in offered {
            if self.jobs[job].phase == JobPhase::Available {
                self.jobs[job].phase = JobPhase::Held;
                self.available -= 1;
                self.held.insert(job);
                any = true;
            }
        }
        self.dispatch();
        any
    }

    fn dispatch(&mut self) {
        let capacity = self.workload.scale_set.max_runners as usize;
        let room = capacity.saturating_sub(self.waiting.len() + self.running);
        let assigned: Vec<usize> = self.held.iter().take(room).copied().collect();
        for job in assigned {
            self.held.remove(&job);
            self.waiting.insert(job);
            self.jobs[job].phase = JobPhase::Waiting;
            self.post(Item::Assigned);
        }
        self.hand_to_runners();
    }

    fn hand_to_runners(&mut self) {
        while let (Some(&job), Some(&runner)) = (self.waiting.first(), self.idle.first()) {
            self.waiting.remove(&job);
            self.idle.remove(&runner);
            self.jobs[job].phase = JobPhase::Running { runner };
            self.jobs[job].started_ms = Some(self.clock);
            self.running += 1;
            let state = &mut self.runners[runner];
            state.job = Some(job);
            state.job_started_ms = Some(self.clock);
            self.post(Item::Started { runner });
            let ends = self.clock + self.workload.jobs[job].duration_ms;
            self.schedule(ends, Event::Finish(job));
        }
    }

    fn finish(&mut self, job: usize) {
        let JobPhase::Running { runner } = self.jobs[job].phase else {
            return;
        };
        self.jobs[job].phase = JobPhase::Finished;
        self.running -= 1;
        self.finished += 1;
        self.last_finish_ms = self.clock;
        self.runners[runner].ended = Some((self.clock, RunnerEnd::Finished));
        self.alive.remove(&runner);
        self.post(Item::Completed);
        self.dispatch();
    }

    // The listener.

    fn poll(&mut self) {
        if self.queue.is_empty() {
            self.generation += 1;
            self.listening = Listening::Waiting(self.generation);
            let timeout = self.clock + millis(LONG_POLL);
            self.schedule(timeout, Event::PollTimeout(self.generation));
        } else {
            self.deliver();
        }
    }

    /// Hands the listener a message and lets it do what it does with one.
    /// It is out of its long poll from here: what the handling posts (the
    /// jobs it acquires are assigned, idle runners start them) waits for
    /// the next poll.
    fn deliver(&mut self) {
        self.listening = Listening::Sleeping;
        let count = self.queue.len().min(SERVICE_BATCH_MAX);
        let items: Vec<Item> = self.queue.drain(..count).collect();
        self.statistics = Some(self.service_statistics());
        let offered: Vec<usize> = items
            .iter()
            .filter_map(|item| match item {
                Item::Available(job) => Some(*job),
                _ => None,
            })
            .collect();
        let acquired = self.acquire(&offered);
        if items.iter().any(|item| !matches!(item, Item::Available(_))) {
            self.sequence.note_job_events();
        }
        self.decide();
        for item in &items {
            if let Item::Started { runner } = item {
                self.runners[*runner].recorded = true;
            }
        }
        let early = acquired && (count >= SERVICE_BATCH_MAX || !self.polled_early);
        self.polled_early = early;
        let next = if early {
            self.clock
        } else {
            self.clock + millis(self.workload.batch_window)
        };
        self.schedule(next, Event::Poll);
    }

    fn decide(&mut self) {
        let observed = Observed {
            replicas: self.replicas,
            patch_id: 0,
            runners: self.runner_counts(),
        };
        let now = Timestamp::from_millisecond(self.clock).unwrap_or_default();
        let input = scaling_input(
            &self.workload.scale_set,
            self.statistics.as_ref(),
            &observed,
            now,
        );
        self.decisions += 1;
        let Ok(decided) = self.decider.scaling_blocking(&input) else {
            self.undecided += 1;
            return;
        };
        if let Some(reason) = decided.fallback_reason {
            self.fallbacks += 1;
            self.first_fallback.get_or_insert(reason);
        }
        let min = self.workload.scale_set.min_runners;
        if let Some(patch) = self.sequence.next(decided.decision.desired, min) {
            self.apply(patch);
            self.sequence.applied(&patch);
        }
    }

    // The EphemeralRunnerSet controller.

    fn runner_counts(&self) -> RunnerCounts {
        let mut counts = RunnerCounts::default();
        for &runner in &self.alive {
            let state = &self.runners[runner];
            if state.online_ms.is_none() {
                counts.pending += 1;
            } else {
                counts.running += 1;
                if state.job.is_some() && state.recorded {
                    counts.busy += 1;
                }
            }
        }
        counts
    }

    fn apply(&mut self, patch: ScalePatch) {
        self.replicas = Some(patch.replicas);
        let live = self.alive.len();
        let replicas = patch.replicas as usize;
        if patch.patch_id != 0 {
            for _ in live..replicas {
                self.create_runner();
            }
        } else if live > replicas {
            let mut idle: Vec<usize> = self
                .alive
                .iter()
                .copied()
                .filter(|&runner| self.runners[runner].job.is_none())
                .collect();
            idle.sort_by_key(|&runner| {
                let state = &self.runners[runner];
                (state.online_ms.is_some(), state.created_ms, runner)
            });
            for runner in idle.into_iter().take(live - replicas) {
                self.runners[runner].ended = Some((self.clock, RunnerEnd::ScaledDown));
                self.alive.remove(&runner);
                self.idle.remove(&runner);
            }
        }
    }

    fn create_runner(&mut self) {
        let id = self.runners.len();
        let start = self.workload.runner_start.draw(&mut self.rng);
        self.runners.push(RunnerState {
            created_ms: self.clock,
            online_ms: None,
            job: None,
            job_started_ms: None,
            recorded: false,
            ended: None,
        });
        self.alive.insert(id);
        self.peak = self.peak.max(self.alive.len());
        self.schedule(self.clock + start, Event::Online(id));
    }

    // The numbers.

    fn tally(self, horizon: i64) -> (Summary, Vec<RunnerLife>, Option<String>) {
        let mut waits: Vec<i64> = Vec::with_capacity(self.jobs.len());
        let mut unserved = 0;
        for (state, job) in self.jobs.iter().zip(&self.workload.jobs) {
            match state.started_ms {
                Some(started) => waits.push(started - job.queued_ms),
                None => {
                    unserved += 1;
                    waits.push(horizon - job.queued_ms);
                }
            }
        }
        waits.sort_unstable();
        let (mut busy, mut idle, mut starting) = (0, 0, 0);
        let mut lives = Vec::with_capacity(self.runners.len());
        for state in &self.runners {
            let (ended_ms, end) = state.ended.unwrap_or((horizon, RunnerEnd::Remaining));
            let ended_ms = ended_ms.min(horizon);
            let online = state.online_ms.filter(|online| *online <= ended_ms);
            starting += online.unwrap_or(ended_ms) - state.created_ms;
            if let Some(online) = online {
                let took_job = state.job_started_ms.filter(|s| *s <= ended_ms);
                idle += took_job.unwrap_or(ended_ms) - online;
                busy += took_job.map_or(0, |s| ended_ms - s);
            }
            lives.push(RunnerLife {
                created_ms: state.created_ms,
                online_ms: state.online_ms,
                job: state.job,
                job_started_ms: state.job_started_ms,
                ended_ms,
                end,
            });
        }
        let summary = Summary {
            jobs: self.jobs.len(),
            unserved,
            wait_p50_ms: percentile(&waits, 50),
            wait_p95_ms: percentile(&waits, 95),
            wait_max_ms: waits.last().copied().unwrap_or(0),
            busy_runner_ms: busy,
            idle_runner_ms: idle,
            starting_runner_ms: starting,
            registrations: self.runners.len(),
            scaled_down: lives
                .iter()
                .filter(|life| life.end == RunnerEnd::ScaledDown)
                .count(),
            peak_runners: self.peak,
            decisions: self.decisions,
            fallbacks: self.fallbacks,
            undecided: self.undecided,
            horizon_ms: horizon,
        };
        (summary, lives, self.first_fallback)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::LazyLock;

    use super::*;
    use crate::lab::workday::{SEED, workday};
    use crate::policy::types::ScalingInput;
    use crate::recording::{Decision, Header, Job};

    /// 2026-12-01T10:00:00Z, a Tuesday.
    const T0_MS: i64 = 1_796_119_200_000;

    static ENGINE: LazyLock<PolicyEngine> =
        LazyLock::new(|| PolicyEngine::new(EngineConfig::default()).unwrap());

    fn policy(text: &str) -> PolicyUnderTest {
        PolicyUnderTest::load(&ENGINE, &PolicySpec::parse(text).unwrap()).unwrap()
    }

    fn at(seconds: i64) -> String {
        timestamp(T0_MS + seconds * 1000)
    }

    fn decision_at(seconds: i64, scale_set: ScaleSet) -> Entry {
        Entry::Decision(Decision {
            input: ScalingInput {
                scale_set,
                now: Some(at(seconds)),
                ..ScalingInput::default()
            },
            desired: 0,
            reason: String::new(),
            state_out: None,
            policy: "builtin:default".into(),
            sha256: None,
            fallback_reason: None,
        })
    }

    fn completed(id: i64, queued: i64, duration: i64) -> Entry {
        Entry::Job(Job {
            at: at(queued + duration),
            event: JobEvent::Completed,
            runner_request_id: id,
            labels: vec!["linux".into()],
            queue_time: Some(at(queued)),
            scale_set_assign_time: None,
            runner_assign_time: Some(at(queued)),
            finish_time: Some(at(queued + duration)),
            result: Some("succeeded".into()),
        })
    }

    fn header() -> Header {
        Header {
            format: recording::FORMAT.into(),
            namespace: "ci".into(),
            name: "linux".into(),
            dropped: 0,
        }
    }

    /// A scale set's decision at T0, then jobs of (queued, duration)
    /// seconds after T0.
    fn hand_trace(min: u32, max: u32, jobs: &[(i64, i64)]) -> Trace {
        let scale_set = ScaleSet {
            name: "linux".into(),
            namespace: "ci".into(),
            min_runners: min,
            max_runners: max,
            labels: vec!["linux".into()],
        };
        let mut entries = vec![decision_at(0, scale_set)];
        for (index, (queued, duration)) in jobs.iter().enumerate() {
            entries.push(completed(index as i64 + 1, *queued, *duration));
        }
        Trace {
            header: header(),
            entries,
        }
    }

    fn starting_in(seconds: u64) -> Options {
        Options {
            runner_start: Some(Duration::from_secs(seconds)),
            ..Options::default()
        }
    }

    fn run(trace: &Trace, options: &Options, policy_text: &str) -> Outcome {
        let workload = Workload::from_trace(trace, options).unwrap();
        simulate(&workload, &policy(policy_text))
    }

    fn workday_workload() -> Workload {
        let trace = recording::read(&workday(SEED)).unwrap();
        Workload::from_trace(&trace, &Options::default()).unwrap()
    }

    /// What every runner of an ephemeral scale set must have done: run
    /// one job and end with it, or run none; a scale-down never takes one
    /// that ran a job.
    fn assert_ephemeral(outcome: &Outcome) {
        let mut runs = vec![0; outcome.summary.jobs];
        for life in &outcome.runners {
            match (life.end, life.job) {
                (RunnerEnd::ScaledDown, job) => {
                    assert_eq!(
                        job, None,
                        "{}: a busy runner was scaled down",
                        outcome.policy
                    )
                }
                (RunnerEnd::Finished | RunnerEnd::Remaining, Some(job)) => runs[job] += 1,
                (RunnerEnd::Finished, None) => {
                    panic!("{}: a runner finished without a job", outcome.policy)
                }
                (RunnerEnd::Remaining, None) => {}
            }
            assert!(
                life.online_ms
                    .is_none_or(|online| online >= life.created_ms)
            );
            assert!(
                life.job_started_ms
                    .is_none_or(|s| life.online_ms.is_some_and(|online| online <= s))
            );
        }
        assert!(
            runs.iter().all(|n| *n <= 1),
            "{}: a job ran twice",
            outcome.policy
        );
        let ran = runs.iter().filter(|n| **n == 1).count();
        assert_eq!(ran, outcome.summary.jobs - outcome.summary.unserved);
    }

    #[test]
    fn one_job_on_an_idle_set_waits_the_runner_start() {
        let trace = hand_trace(0, 5, &[(600, 120)]);
        let outcome = run(&trace, &starting_in(45), "builtin:default");
        let s = &outcome.summary;
        assert_eq!((s.wait_p50_ms, s.wait_p95_ms), (45_000, 45_000));
        assert_eq!((s.registrations, s.peak_runners, s.unserved), (1, 1, 0));
        assert_eq!(
            (s.busy_runner_ms, s.idle_runner_ms, s.starting_runner_ms),
            (120_000, 0, 45_000)
        );
        assert_eq!(s.fallbacks, 0);
        assert_ephemeral(&outcome);
    }

    #[test]
    fn a_warm_runner_takes_the_job_at_once_and_a_new_one_replaces_it() {
        let trace = hand_trace(0, 5, &[(600, 120)]);
        let options = Options {
            min_runners: Some(1),
            ..starting_in(45)
        };
        let outcome = run(&trace, &options, "builtin:default");
        let s = &outcome.summary;
        assert_eq!((s.wait_p50_ms, s.wait_p95_ms), (0, 0));
        // The warm runner (online at 45 s, busy from 600 s to 720 s) and
        // its replacement for minRunners (created at 600 s, online at 645 s,
        // idle until the trace ends at 720 s).
        assert_eq!((s.registrations, s.peak_runners), (2, 2));
        assert_eq!(s.busy_runner_ms, 120_000);
        assert_eq!(s.idle_runner_ms, (600 - 45 + 720 - 645) * 1000);
        assert_eq!(s.starting_runner_ms, 90_000);
        assert_ephemeral(&outcome);
    }

    #[test]
    fn beyond_max_runners_a_job_waits_for_a_place_and_then_a_runner() {
        let trace = hand_trace(0, 1, &[(600, 60), (600, 60)]);
        let outcome = run(&trace, &starting_in(45), "builtin:default");
        let s = &outcome.summary;
        // The second job: the first's runner start and run, then its own
        // runner's start.
        assert_eq!((s.wait_p50_ms, s.wait_p95_ms), (45_000, 150_000));
        assert_eq!((s.registrations, s.peak_runners), (2, 1));
    }

    #[test]
    fn scale_down_takes_idle_runners_and_leaves_the_one_just_handed_a_job() {
        // Three warm runners from 10:00 to 10:15, a fourth for the job at
        // 10:14. Job 2 arrives after job 1's end has been decided on: the
        // message offering it carries statistics from before its
        // acquisition (nothing assigned), so the decision is steady at
        // minRunners 0 with patch id 0 and scales down, while the runner
        // the service handed job 2 to is not yet recorded busy.
        let trace = hand_trace(0, 10, &[(840, 300), (1150, 60)]);
        let window = r#"builtin:schedule={"windows": [{"days": ["tue"], "from": "10:00", "to": "10:15", "minRunners": 3}]}"#;
        let outcome = run(&trace, &starting_in(45), window);
        let s = &outcome.summary;
        assert_eq!((s.wait_p50_ms, s.wait_p95_ms), (0, 0));
        assert_eq!((s.registrations, s.scaled_down), (4, 2));
        let ends: Vec<(RunnerEnd, Option<usize>, i64)> = outcome
            .runners
            .iter()
            .map(|life| (life.end, life.job, (life.ended_ms - T0_MS) / 1000))
            .collect();
        assert_eq!(
            ends,
            [
                (RunnerEnd::Finished, Some(0), 1140),
                (RunnerEnd::Finished, Some(1), 1210),
                (RunnerEnd::ScaledDown, None, 1150),
                (RunnerEnd::ScaledDown, None, 1150),
            ]
        );
        assert_ephemeral(&outcome);
    }

    #[test]
    fn the_same_trace_and_seed_give_the_same_outcome() {
        let workload = workday_workload();
        assert!(matches!(workload.runner_start, RunnerStart::Estimated(_)));
        let cooldown = policy("builtin:cooldown");
        let first = simulate(&workload, &cooldown);
        let again = simulate(&workload, &cooldown);
        assert_eq!(first.summary, again.summary);
        assert_eq!(first.runners, again.runners);
        assert_eq!(first.summary.fallbacks, 0);
        let other_seed = Workload {
            seed: workload.seed + 1,
            ..workload.clone()
        };
        let other = simulate(&other_seed, &cooldown);
        assert_ne!(first.runners, other.runners, "the seed draws the starts");
    }

    #[test]
    fn on_the_workday_a_buffer_buys_shorter_waits_with_idle_runners() {
        let workload = workday_workload();
        let default = simulate(&workload, &policy("builtin:default"));
        let buffered = simulate(&workload, &policy(r#"builtin:buffered={"idle": 2}"#));
        let (d, b) = (&default.summary, &buffered.summary);
        assert!(b.wait_p50_ms < d.wait_p50_ms, "{d:?}\n{b:?}");
        assert!(b.wait_p95_ms <= d.wait_p95_ms, "{d:?}\n{b:?}");
        assert!(b.idle_runner_ms > d.idle_runner_ms, "{d:?}\n{b:?}");
        assert_eq!(
            (d.unserved, b.unserved, d.fallbacks, b.fallbacks),
            (0, 0, 0, 0)
        );
        // What runs is the trace's work, whatever the policy.
        let work: i64 = workload.jobs.iter().map(|job| job.duration_ms).sum();
        assert_eq!((d.busy_runner_ms, b.busy_runner_ms), (work, work));
        assert!(d.peak_runners <= 20 && b.peak_runners <= 20);
        assert_ephemeral(&default);
        assert_ephemeral(&buffered);
    }

    #[test]
    fn runners_stay_ephemeral_under_every_bundled_policy() {
        let workload = workday_workload();
        let window = r#"builtin:schedule={"windows": [{"days": ["weekdays"], "from": "08:00", "to": "18:00", "minRunners": 5}]}"#;
        let mut scaled_down = 0;
        for text in [window, "builtin:cooldown"] {
            let outcome = simulate(&workload, &policy(text));
            assert_ephemeral(&outcome);
            scaled_down += outcome.summary.scaled_down;
        }
        assert!(
            scaled_down > 0,
            "nothing was scaled down: the check proved nothing"
        );
    }

    #[test]
    fn a_failing_policy_falls_back_to_the_default_for_each_decision() {
        let trace = hand_trace(0, 1, &[(600, 60), (600, 60), (1200, 300)]);
        let options = starting_in(45);
        let default = run(&trace, &options, "builtin:default");
        let hostile = arcwright_test_guests::path("policy-test-hostile")
            .unwrap()
            .display()
            .to_string();
        for misbehave in ["error", "panic"] {
            let text = format!(r#"{hostile}={{"misbehave": "{misbehave}"}}"#);
            let failing = run(&trace, &options, &text);
            let s = &failing.summary;
            assert_eq!(s.fallbacks, s.decisions, "{misbehave}");
            assert_eq!(
                *s,
                Summary {
                    fallbacks: s.decisions,
                    ..default.summary.clone()
                },
                "{misbehave}"
            );
            assert!(failing.first_fallback.is_some(), "{misbehave}");
        }
    }

    #[test]
    fn the_runner_start_is_estimated_from_scale_ups_with_nothing_else_ready() {
        let scale_up = |seconds: i64, pending: u32| {
            let mut entry = decision_at(seconds, ScaleSet::default());
            if let Entry::Decision(decision) = &mut entry {
                decision.input.statistics.assigned_jobs = 1;
                decision.input.runners.pending = pending;
                decision.desired = 1;
            }
            entry
        };
        let started = |id: i64, seconds: i64| {
            Entry::Job(Job {
                at: at(seconds),
                event: JobEvent::Started,
                runner_request_id: id,
                labels: Vec::new(),
                queue_time: Some(at(seconds - 40)),
                scale_set_assign_time: None,
                runner_assign_time: Some(at(seconds)),
                finish_time: None,
                result: None,
            })
        };
        let trace = Trace {
            header: header(),
            entries: vec![
                scale_up(100, 0),
                started(1, 133),
                // A runner was starting already: the next start may be its.
                scale_up(200, 1),
                started(2, 205),
                scale_up(300, 0),
                started(3, 327),
            ],
        };
        assert_eq!(
            estimate_runner_start(&trace),
            [Duration::from_secs(33), Duration::from_secs(27)]
        );
        let workload =
            Workload::from_trace(&hand_trace(0, 5, &[(600, 60)]), &Options::default()).unwrap();
        assert_eq!(
            workload.runner_start,
            RunnerStart::Assumed(DEFAULT_RUNNER_START)
        );
        let RunnerStart::Estimated(samples) = workday_workload().runner_start else {
            panic!("the workday shows its starts");
        };
        let mut samples: Vec<i64> = samples.iter().map(|s| millis(*s)).collect();
        samples.sort_unstable();
        // The generator's runners take 15 to 40 s.
        let median = percentile(&samples, 50);
        assert!((15_000..=40_000).contains(&median), "{median}");
    }

    #[test]
    fn traces_the_model_cannot_run_are_refused_saying_why() {
        let no_jobs = Trace {
            header: header(),
            entries: vec![
                decision_at(
                    0,
                    ScaleSet {
                        max_runners: 5,
                        ..ScaleSet::default()
                    },
                ),
                Entry::Job(Job {
                    at: at(10),
                    event: JobEvent::Available,
                    runner_request_id: 7,
                    labels: Vec::new(),
                    queue_time: Some(at(10)),
                    scale_set_assign_time: None,
                    runner_assign_time: None,
                    finish_time: None,
                    result: None,
                }),
            ],
        };
        let error = Workload::from_trace(&no_jobs, &Options::default()).unwrap_err();
        assert!(
            matches!(error, SimulateError::NoJobs { skipped: 1 }),
            "{error}"
        );

        let mut no_decision = hand_trace(0, 5, &[(600, 60)]);
        no_decision.entries.remove(0);
        let error = Workload::from_trace(&no_decision, &Options::default()).unwrap_err();
        assert!(error.to_string().contains("--max-runners"), "{error}");
        let given = Options {
            max_runners: Some(3),
            ..Options::default()
        };
        let workload = Workload::from_trace(&no_decision, &given).unwrap();
        assert_eq!(
            (
                workload.scale_set.name.as_str(),
                workload.scale_set.max_runners
            ),
            ("linux", 3)
        );

        let above = Options {
            min_runners: Some(9),
            ..Options::default()
        };
        let error = Workload::from_trace(&hand_trace(0, 5, &[(1, 1)]), &above).unwrap_err();
        assert!(matches!(
            error,
            SimulateError::MinAboveMax { min: 9, max: 5 }
        ));
    }

    fn args(trace: &std::path::Path, policies: &[&str]) -> SimulateArgs {
        SimulateArgs {
            trace: trace.to_owned(),
            policies: policies.iter().map(|p| p.to_string()).collect(),
            runner_start: Some(45_000),
            max_runners: None,
            min_runners: None,
            seed: DEFAULT_SEED,
            batch_window: 2000,
            json: false,
        }
    }

    fn write_trace(dir: &std::path::Path, trace: &Trace) -> PathBuf {
        let mut text = serde_json::to_string(&trace.header).unwrap();
        for entry in &trace.entries {
            text.push('\n');
            text.push_str(&serde_json::to_string(entry).unwrap());
        }
        let path = dir.join("trace.jsonl");
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn the_command_prints_one_row_per_policy_or_json() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_trace(dir.path(), &hand_trace(0, 5, &[(600, 120)]));
        let table = args(
            &path,
            &["builtin:default", r#"builtin:buffered={"idle":1}"#],
        )
        .report()
        .unwrap();
        let rows: Vec<&str> = table
            .lines()
            .filter(|line| line.starts_with("builtin:"))
            .collect();
        assert_eq!(rows.len(), 2, "{table}");
        assert!(rows[0].starts_with("builtin:default "), "{table}");
        assert!(
            rows[1].starts_with(r#"builtin:buffered {"idle":1} "#),
            "{table}"
        );
        assert!(rows[0].contains("45.0s"), "{table}");

        let json = SimulateArgs {
            json: true,
            ..args(&path, &["builtin:cooldown"])
        }
        .report()
        .unwrap();
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(value["policies"][0]["policy"], "builtin:cooldown");
        assert_eq!(value["policies"][0]["summary"]["waitP50Ms"], 45_000);
    }

    #[test]
    fn the_command_says_what_is_wrong_with_its_inputs() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_trace(dir.path(), &hand_trace(0, 5, &[(600, 120)]));
        let error = |args: SimulateArgs| format!("{:#}", args.report().unwrap_err());

        let missing = dir.path().join("nowhere.wasm").display().to_string();
        let message = error(args(&path, &["builtin:default", &missing]));
        assert!(message.contains("nowhere.wasm"), "{message}");

        let message = error(args(&path, &["builtin:nonesuch"]));
        assert!(message.contains("nonesuch"), "{message}");

        let message = error(args(&path, &["builtin:buffered={idle: 2}"]));
        assert!(message.contains("not JSON"), "{message}");

        let message = error(args(&path, &[r#"builtin:buffered={"idel": 2}"#]));
        assert!(message.contains("idel"), "{message}");

        let bad = dir.path().join("bad.jsonl");
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&bad, format!("{text}\n{{\"kind\": \"job\"}}\n")).unwrap();
        let message = error(args(&bad, &["builtin:default"]));
        assert!(message.contains("line 4 of the trace"), "{message}");

        let empty = dir.path().join("empty.jsonl");
        std::fs::write(&empty, serde_json::to_string(&header()).unwrap()).unwrap();
        let message = error(SimulateArgs {
            max_runners: Some(4),
            ..args(&empty, &["builtin:default"])
        });
        assert!(message.contains("no job the model can run"), "{message}");
    }

    #[test]
    fn policy_specs_split_at_the_first_equals_sign() {
        let spec = PolicySpec::parse(r#"builtin:buffered={"idle": 2, "note": "a=b"}"#).unwrap();
        assert_eq!(spec.module, "builtin:buffered");
        assert_eq!(
            spec.settings,
            Some(serde_json::json!({"idle": 2, "note": "a=b"}))
        );
        assert_eq!(spec.label(), r#"builtin:buffered {"idle":2,"note":"a=b"}"#);
        let plain = PolicySpec::parse("./mine.wasm").unwrap();
        assert_eq!(
            (plain.module.as_str(), plain.settings),
            ("./mine.wasm", None)
        );

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("settings.yaml");
        std::fs::write(&file, "idle: 3\n").unwrap();
        let spec = PolicySpec::parse(&format!("builtin:buffered=@{}", file.display())).unwrap();
        assert_eq!(spec.settings, Some(serde_json::json!({"idle": 3})));
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        assert_eq!(percentile(&[], 50), 0);
        assert_eq!(percentile(&[7], 95), 7);
        assert_eq!(percentile(&[1, 2], 50), 1);
        assert_eq!(percentile(&[1, 2], 95), 2);
        let hundred: Vec<i64> = (1..=100).collect();
        assert_eq!(
            (percentile(&hundred, 50), percentile(&hundred, 95)),
            (50, 95)
        );
    }
}
