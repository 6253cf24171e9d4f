//! The fault matrix: the whole stack (`arcwright run` as a process) taken
//! through one scale set's life while something breaks, cell by cell, and
//! what the breakage cost, counted.
//!
//! Every run is the same lifecycle, on a stack of its own: a set with
//! `minRunners: 1, maxRunners: 3` is created, a burst of jobs runs, the set
//! settles at its warm runner, its runner image changes (a spec change that
//! replaces the runner), and the set is deleted. A cell breaks one thing
//! during it:
//!
//! - **an Actions endpoint the host calls** answers 500, 429 with
//!   `Retry-After`, later than the host waits (the work done, the answer
//!   lost), resets the connection, or cuts its body short (the work done,
//!   half an answer). The fault is armed before the set exists and takes
//!   the endpoint's next calls, whichever phase makes them; how many calls
//!   it took is the cell's `hits`. The endpoints this lifecycle never calls
//!   ([`UNCALLED`]) have no cells: a fault that cannot strike proves
//!   nothing, and a cell whose fault did not strike is not a pass
//!   (`unstruck` in the summary).
//! - **the API server** is restarted over the same etcd in the burst, is
//!   down for 30 s in the burst, has a real concurrent writer touching
//!   every object the host writes (so its preconditioned writes meet 409),
//!   or turns the host's requests away with 429 through API priority and
//!   fairness (a priority level of one seat, rejecting). These cells run
//!   on a control plane of their own, with an audit log that counts the
//!   409s and 429s the host was answered with (`hits`).
//! - **the host is SIGKILLed** at a random point of the scale-up, the
//!   scale-down, the spec change or the deletion, and started again.
//!
//! After every run the invariants are counted, not asserted, so one table
//! shows everything: registrations leaked (a registration no live runner
//! owns after the burst, any registration left once the set is gone, or
//! one the service removed only because its scale set went: the host
//! never removed it),
//! jobs cancelled because a pod went under them, runners that had two pods
//! at once, and runs that did not converge (a phase that did not reach its
//! state within [`PHASE_BOUND`] of the fault's end, or a job that did not
//! complete). The
//! matrix passes when all four are zero and every cell's fault struck.
//!
//! Deliberately not here: faults in the runners' own endpoints (a runner
//! mid-job is not the host's to save), the App-installation endpoint (the
//! stacks authenticate with a PAT), and stale views in the manner of
//! Sieve, which need the controllers in-process.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use arcwright::api::EphemeralRunner;
use fake_actions::{Endpoint, Fault, FaultKind};
use k8s_openapi::api::core::v1::Pod;
use kube::Resource as _;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::{RUNNER_ENDPOINTS, ScaleSet, Stack, StackConfig, identity};

/// The set every run creates.
const SET: &str = "faults";

/// Jobs in a run's burst, and how long each runs.
const BURST: u32 = 4;
const JOB: Duration = Duration::from_millis(500);

/// The host's Actions call timeout in these runs, and the fake's long poll
/// under its message timeout: short, so that a late answer costs seconds.
const CALL_TIMEOUT: &str = "2s";
const MESSAGE_TIMEOUT: &str = "10s";
/// A late answer comes after both timeouts.
const LATE: Duration = Duration::from_secs(12);

/// How long each phase of a run may take to reach its state, beyond the
/// time the fault itself takes the API server away: a phase takes a few
/// seconds when nothing breaks; two minutes leave room for a job the
/// service cancelled and offered again (after its assignment timeout, a
/// minute in the fake) while the API server was away, which the `requeued`
/// column counts.
pub const PHASE_BOUND: Duration = Duration::from_secs(120);

/// The image the spec change moves the runners to.
const NEXT_IMAGE: &str = "ghcr.io/actions/actions-runner:2.331.0";

/// How an Actions endpoint misbehaves in a cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ActionsFault {
    /// 500 Internal Server Error.
    ServerError,
    /// 429 with `Retry-After: 2`.
    RateLimited,
    /// The work done, the answer after the host's timeout.
    Late,
    /// The connection closed without an answer.
    Reset,
    /// The work done, half the body sent.
    Truncated,
}

impl ActionsFault {
    /// Every kind, in table order.
    pub const ALL: [ActionsFault; 5] = [
        ActionsFault::ServerError,
        ActionsFault::RateLimited,
        ActionsFault::Late,
        ActionsFault::Reset,
        ActionsFault::Truncated,
    ];

    fn kind(self) -> FaultKind {
        match self {
            ActionsFault::ServerError => FaultKind::status(500),
            ActionsFault::RateLimited => FaultKind::rate_limited(Some(2)),
            ActionsFault::Late => FaultKind::late_answer(LATE),
            ActionsFault::Reset => FaultKind::Reset,
            ActionsFault::Truncated => FaultKind::Truncate,
        }
    }

    fn name(self) -> &'static str {
        match self {
            ActionsFault::ServerError => "500",
            ActionsFault::RateLimited => "429+retry-after",
            ActionsFault::Late => "late answer",
            ActionsFault::Reset => "reset",
            ActionsFault::Truncated => "truncated body",
        }
    }
}

/// How the API server misbehaves in a cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ApiServerFault {
    /// Stopped and started again over the same etcd, mid-burst.
    Restart,
    /// Down for 30 s, mid-burst.
    Outage,
    /// A concurrent writer touches every runner, runner set and scale set
    /// ten times a second.
    Conflicts,
    /// API priority and fairness turns the host's concurrent requests away.
    Throttled,
}

impl ApiServerFault {
    /// Every kind, in table order.
    pub const ALL: [ApiServerFault; 4] = [
        ApiServerFault::Restart,
        ApiServerFault::Outage,
        ApiServerFault::Conflicts,
        ApiServerFault::Throttled,
    ];

    fn name(self) -> &'static str {
        match self {
            ApiServerFault::Restart => "restarted mid-burst",
            ApiServerFault::Outage => "30 s outage",
            ApiServerFault::Conflicts => "409s from a concurrent writer",
            ApiServerFault::Throttled => "429s from priority and fairness",
        }
    }
}

/// Where in the lifecycle the host is killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    /// While the burst's runners come up.
    ScaleUp,
    /// While the burst's runners go.
    ScaleDown,
    /// While the runner is replaced for a new image.
    SpecChange,
    /// While the set is torn down.
    Deletion,
}

impl Phase {
    /// Every phase, in lifecycle order.
    pub const ALL: [Phase; 4] = [
        Phase::ScaleUp,
        Phase::ScaleDown,
        Phase::SpecChange,
        Phase::Deletion,
    ];

    fn name(self) -> &'static str {
        match self {
            Phase::ScaleUp => "scale-up",
            Phase::ScaleDown => "scale-down",
            Phase::SpecChange => "spec change",
            Phase::Deletion => "deletion",
        }
    }
}

/// The host's endpoints this lifecycle never calls, so a fault armed on
/// them never strikes: `get-runner-group-by-name` (the set names no runner
/// group), `update-scale-set` (no label or group changes), `get-runner` and
/// `get-runner-by-name` (called only after a registration's answer was lost
/// with its name taken, which the `generate-jit-config` cells bring about
/// and count), `refresh-session` (no session outlives its token here). Their
/// answers' handling is tested against the fake in the host's own tests.
pub const UNCALLED: [Endpoint; 5] = [
    Endpoint::GetRunnerGroupByName,
    Endpoint::UpdateScaleSet,
    Endpoint::GetRunner,
    Endpoint::GetRunnerByName,
    Endpoint::RefreshSession,
];

/// What breaks in a cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Cell {
    /// An Actions endpoint misbehaves.
    Actions(Endpoint, ActionsFault),
    /// The API server misbehaves.
    ApiServer(ApiServerFault),
    /// The host is SIGKILLed.
    Kill(Phase),
}

impl Cell {
    /// Every cell of the matrix: each Actions endpoint the host calls in
    /// the lifecycle with each fault, the API server's four, a kill in each
    /// phase.
    pub fn all() -> Vec<Cell> {
        let endpoints = Endpoint::ALL.into_iter().filter(|e| {
            !RUNNER_ENDPOINTS.contains(e)
                && !UNCALLED.contains(e)
                && *e != Endpoint::AppInstallationToken
        });
        let mut cells: Vec<Cell> = endpoints
            .flat_map(|e| ActionsFault::ALL.map(|f| Cell::Actions(e, f)))
            .collect();
        cells.extend(ApiServerFault::ALL.map(Cell::ApiServer));
        cells.extend(Phase::ALL.map(Cell::Kill));
        cells
    }

    /// The table's first two columns.
    pub fn labels(&self) -> (String, String) {
        match self {
            Cell::Actions(endpoint, fault) => (format!("actions {endpoint}"), fault.name().into()),
            Cell::ApiServer(fault) => ("api server".into(), fault.name().into()),
            Cell::Kill(phase) => ("host SIGKILL".into(), phase.name().into()),
        }
    }

    /// Whether `filter` (a substring of either label) selects the cell.
    pub fn matches(&self, filter: &str) -> bool {
        let (what, how) = self.labels();
        what.contains(filter) || how.contains(filter)
    }
}

/// How many runs, how many at once.
#[derive(Debug, Clone)]
pub struct MatrixOptions {
    /// Runs of each Actions and API server cell.
    pub runs: u32,
    /// Runs of each kill cell (each a kill at a random point).
    pub kills: u32,
    /// How many faulted calls each Actions cell arms in a row.
    pub times: u32,
    /// Runs at once (each its own namespace, fake, simulator and host).
    pub parallel: usize,
    /// Only the cells whose labels contain this.
    pub filter: Option<String>,
    /// Cells left out (after the filter).
    pub exclude: Vec<Cell>,
    /// The seed of the kill points; each run's is derived from it.
    pub seed: u64,
    /// The `arcwright` binary; the stack's default when `None`.
    pub binary: Option<PathBuf>,
}

impl MatrixOptions {
    /// One run per cell, one faulted call per Actions cell: the form CI runs.
    pub fn quick() -> Self {
        MatrixOptions {
            runs: 1,
            kills: 1,
            times: 1,
            parallel: 4,
            filter: None,
            exclude: Vec::new(),
            seed: 1,
            binary: None,
        }
    }

    /// Three runs per cell, three faulted calls in a row, twenty kills per
    /// phase.
    pub fn full() -> Self {
        MatrixOptions {
            runs: 3,
            kills: 20,
            times: 3,
            ..MatrixOptions::quick()
        }
    }

    fn runs_of(&self, cell: &Cell) -> u32 {
        match cell {
            Cell::Kill(_) => self.kills,
            _ => self.runs,
        }
    }
}

/// What one run cost.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunOutcome {
    /// How often the fault struck: faulted Actions calls, 409s or 429s the
    /// host was answered with, kills, restarts.
    pub hits: u64,
    /// Jobs that succeeded.
    pub jobs: u64,
    /// Registrations no live runner owned.
    pub leaked: u64,
    /// Jobs cancelled because their runner's pod went.
    pub cancelled: u64,
    /// Times the service cancelled a job no runner took within its
    /// assignment timeout and offered it again: the job still ran, later.
    pub requeued: u64,
    /// Runners seen with more than one pod of one registration at once.
    pub duplicates: u64,
    /// Times the duplicate watch could not see (a watch error, a re-list):
    /// a duplicate could have come and gone unseen in each.
    pub watch_gaps: u64,
    /// Whether a phase missed its bound or a job did not complete, and why.
    pub unconverged: Option<String>,
    /// The run's length, lifecycle only (not the stack's start).
    pub took: Duration,
}

/// A cell and its runs.
#[derive(Debug, Clone)]
pub struct CellReport {
    /// The cell.
    pub cell: Cell,
    /// Its runs, in order.
    pub runs: Vec<RunOutcome>,
}

impl CellReport {
    fn sum(&self, f: impl Fn(&RunOutcome) -> u64) -> u64 {
        self.runs.iter().map(f).sum()
    }

    fn unconverged(&self) -> u64 {
        self.runs.iter().filter(|r| r.unconverged.is_some()).count() as u64
    }

    /// Whether the cell's fault never struck in any of its runs: the runs
    /// then say nothing about the fault.
    fn unstruck(&self) -> bool {
        self.sum(|r| r.hits) == 0
    }
}

/// The matrix as a table, one row per cell, then the summary line.
pub fn table(reports: &[CellReport]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<32} {:<32} {:>4} {:>5} {:>5} {:>8} {:>6} {:>9} {:>10} {:>4} {:>11} {:>7}",
        "cell",
        "fault",
        "runs",
        "hits",
        "jobs",
        "requeued",
        "leaked",
        "cancelled",
        "duplicates",
        "gaps",
        "unconverged",
        "worst s"
    );
    for report in reports {
        let (what, how) = report.cell.labels();
        let worst = report.runs.iter().map(|r| r.took).max().unwrap_or_default();
        let _ = writeln!(
            out,
            "{what:<32} {how:<32} {:>4} {:>5} {:>5} {:>8} {:>6} {:>9} {:>10} {:>4} {:>11} {:>7.1}",
            report.runs.len(),
            report.sum(|r| r.hits),
            report.sum(|r| r.jobs),
            report.sum(|r| r.requeued),
            report.sum(|r| r.leaked),
            report.sum(|r| r.cancelled),
            report.sum(|r| r.duplicates),
            report.sum(|r| r.watch_gaps),
            report.unconverged(),
            worst.as_secs_f64(),
        );
    }
    for report in reports.iter().filter(|r| r.unstruck()) {
        let (what, how) = report.cell.labels();
        let _ = writeln!(out, "unstruck: {what} / {how}: the fault never struck");
    }
    for report in reports {
        for (n, run) in report.runs.iter().enumerate() {
            if let Some(why) = &run.unconverged {
                let (what, how) = report.cell.labels();
                let _ = writeln!(out, "unconverged: {what} / {how} run {}: {why}", n + 1);
            }
        }
    }
    out.push_str(&summary(reports));
    out
}

/// The last line: `faults: cells=... runs=... leaked=0 cancelled=0
/// duplicates=0 unconverged=0 unstruck=0`.
pub fn summary(reports: &[CellReport]) -> String {
    let total = |f: &dyn Fn(&CellReport) -> u64| reports.iter().map(f).sum::<u64>();
    let runs = total(&|r| r.runs.len() as u64);
    let unstruck = reports.iter().filter(|r| r.unstruck()).count();
    format!(
        "faults: cells={} runs={runs} leaked={} cancelled={} duplicates={} unconverged={} unstruck={unstruck}",
        reports.len(),
        total(&|r| r.sum(|o| o.leaked)),
        total(&|r| r.sum(|o| o.cancelled)),
        total(&|r| r.sum(|o| o.duplicates)),
        total(&|r| r.unconverged()),
    )
}

/// Whether every invariant held in every run, and every cell's fault
/// struck.
pub fn clean(reports: &[CellReport]) -> bool {
    reports.iter().all(|r| {
        !r.unstruck()
            && r.runs.iter().all(|o| {
                o.leaked == 0 && o.cancelled == 0 && o.duplicates == 0 && o.unconverged.is_none()
            })
    })
}

/// Runs the matrix: every selected cell `runs` (or `kills`) times,
/// `parallel` runs at once, `progress` told of each run as it ends.
pub async fn run(options: &MatrixOptions, progress: &dyn Fn(&str)) -> Result<Vec<CellReport>> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cells: Vec<Cell> = Cell::all()
        .into_iter()
        .filter(|c| options.filter.as_deref().is_none_or(|f| c.matches(f)))
        .filter(|c| !options.exclude.contains(c))
        .collect();
    if cells.is_empty() {
        bail!("no cell matches {:?}", options.filter);
    }
    let binary = match &options.binary {
        Some(binary) => binary.clone(),
        None => crate::arcwright_binary()?,
    };
    let work: Vec<(usize, u32)> = cells
        .iter()
        .enumerate()
        .flat_map(|(i, cell)| (0..options.runs_of(cell)).map(move |n| (i, n)))
        .collect();
    let total = work.len();
    let mut outcomes: BTreeMap<(usize, u32), RunOutcome> = BTreeMap::new();
    let mut pending = work.into_iter();
    let mut running = tokio::task::JoinSet::new();
    loop {
        while running.len() < options.parallel.max(1) {
            let Some((i, n)) = pending.next() else { break };
            let cell = cells[i];
            let seed = options.seed ^ ((i as u64) << 32) ^ u64::from(n);
            let binary = binary.clone();
            let times = options.times;
            running.spawn(async move {
                let outcome = run_once(cell, times, seed, binary).await;
                (i, n, outcome)
            });
        }
        let Some(done) = running.join_next().await else {
            break;
        };
        let (i, n, outcome) = done.context("a run panicked")?;
        let outcome = outcome.unwrap_or_else(|error| RunOutcome {
            unconverged: Some(format!("the run could not be carried out: {error:#}")),
            ..RunOutcome::default()
        });
        let (what, how) = cells[i].labels();
        progress(&format!(
            "[{}/{total}] {what} / {how} run {}: {} in {:.1} s",
            outcomes.len() + 1,
            n + 1,
            verdict(&outcome),
            outcome.took.as_secs_f64()
        ));
        outcomes.insert((i, n), outcome);
    }
    Ok(cells
        .iter()
        .enumerate()
        .map(|(i, &cell)| CellReport {
            cell,
            runs: outcomes
                .range((i, 0)..(i + 1, 0))
                .map(|(_, o)| o.clone())
                .collect(),
        })
        .collect())
}

fn verdict(outcome: &RunOutcome) -> String {
    if outcome.leaked + outcome.cancelled + outcome.duplicates == 0 && outcome.unconverged.is_none()
    {
        return format!("clean ({} hits)", outcome.hits);
    }
    format!(
        "leaked={} cancelled={} duplicates={} unconverged={}",
        outcome.leaked,
        outcome.cancelled,
        outcome.duplicates,
        outcome.unconverged.as_deref().unwrap_or("no")
    )
}

/// One run of `cell`'s lifecycle on a stack of its own.
async fn run_once(cell: Cell, times: u32, seed: u64, binary: PathBuf) -> Result<RunOutcome> {
    let mut config = StackConfig::new("faults");
    config.binary = Some(binary);
    config.fake.long_poll = Duration::from_secs(1);
    // A session whose creation answer was lost is the service's to expire;
    // a short expiry keeps such a run to seconds.
    config.fake.session_idle_expiry = Duration::from_secs(10);
    let level = std::env::var(LOG_LEVEL).unwrap_or_else(|_| "arcwright=info".into());
    config.host_args = [
        "--log-level",
        &level,
        "--actions-call-timeout",
        CALL_TIMEOUT,
        "--actions-message-timeout",
        MESSAGE_TIMEOUT,
        "--runner-failure-backoff",
        "1s",
    ]
    .map(str::to_owned)
    .to_vec();
    if let Cell::ApiServer(fault) = cell {
        config.audit = true;
        if fault == ApiServerFault::Throttled {
            // Few seats in all, so a priority level of one share gets one.
            config.apiserver_args = vec![
                "--max-requests-inflight=10".into(),
                "--max-mutating-requests-inflight=5".into(),
            ];
        }
    }
    let mut stack = Stack::start(config).await?;
    let mut run = Run {
        rng: rand::rngs::StdRng::seed_from_u64(seed),
        outcome: RunOutcome::default(),
    };
    let started = Instant::now();
    let from = jiff::Timestamp::now();
    let pods = watch_duplicate_pods(&stack);
    let writer = (cell == Cell::ApiServer(ApiServerFault::Conflicts)).then(|| touch_all(&stack));
    if cell == Cell::ApiServer(ApiServerFault::Throttled) {
        throttle_host(&stack).await?;
    }
    if let Cell::Actions(endpoint, fault) = cell {
        stack
            .fake()
            .control()
            .inject(Fault::new(endpoint, fault.kind(), times));
    }
    let lifecycle = run.lifecycle(&mut stack, cell).await;
    if let Some(writer) = writer {
        writer.abort();
    }
    pods.abort();
    run.outcome.duplicates = pods_seen_twice(&pods);
    run.outcome.watch_gaps = pods.gaps();
    run.outcome.took = started.elapsed();
    if let Err(error) = lifecycle {
        // The first lines say what never happened and the ledger; the
        // host's log tail that follows is kept in a file below.
        let text = format!("{error:#}");
        run.outcome.unconverged = Some(text.lines().take(2).collect::<Vec<_>>().join("; "));
    }
    let ledger = stack.fake().control().ledger();
    run.outcome.jobs = ledger.jobs_succeeded;
    run.outcome.cancelled = ledger.jobs_cancelled_runner_vanished;
    run.outcome.requeued = ledger.jobs_cancelled_unclaimed;
    match cell {
        Cell::Actions(endpoint, _) => {
            run.outcome.hits = stack.fake().control().counters().faults(endpoint);
        }
        Cell::ApiServer(ApiServerFault::Conflicts | ApiServerFault::Throttled) => {
            let code = if cell == Cell::ApiServer(ApiServerFault::Conflicts) {
                409
            } else {
                429
            };
            let requests = stack.host_apiserver_requests(from, jiff::Timestamp::now());
            run.outcome.hits = requests
                .and_then(|r| r.by_status.get(&code).copied())
                .unwrap_or(0);
        }
        Cell::ApiServer(_) | Cell::Kill(_) => {}
    }
    // The stack's directory goes with it; the host's log is what tells why
    // a run did not converge (or, with KEEP_LOGS set, how any run went), so
    // it is kept.
    let keep = run.outcome.unconverged.is_some() || std::env::var_os(KEEP_LOGS).is_some();
    if let (true, Some(host)) = (keep, stack.host()) {
        let kept = std::env::temp_dir().join(format!("arcwright-faults-{seed:016x}.log"));
        if std::fs::copy(host.log_path(), &kept).is_ok() {
            progress_note(&mut run.outcome, &kept);
        }
    }
    Ok(run.outcome)
}

/// Set, every run's host log is kept in the temp dir, not only those of
/// runs that did not converge.
pub const KEEP_LOGS: &str = "ARCWRIGHT_FAULTS_KEEP_LOGS";

/// The hosts' `--log-level` (`arcwright=info` when unset).
pub const LOG_LEVEL: &str = "ARCWRIGHT_FAULTS_LOG_LEVEL";

fn progress_note(outcome: &mut RunOutcome, kept: &std::path::Path) {
    match &mut outcome.unconverged {
        Some(why) => {
            let _ = write!(why, " (the host's log: {})", kept.display());
        }
        None => eprintln!("faults: kept the host's log in {}", kept.display()),
    }
}

struct Run {
    rng: rand::rngs::StdRng,
    outcome: RunOutcome,
}

impl Run {
    /// The lifecycle, with the cell's fault at its point. Leaks and lost
    /// jobs are counted on the way; an error is a phase that did not
    /// converge.
    async fn lifecycle(&mut self, stack: &mut Stack, cell: Cell) -> Result<()> {
        stack.set_bound(PHASE_BOUND);
        stack.create_scale_set(&ScaleSet::new(SET, 1, 3)).await?;
        stack.listening(SET).await?;

        // The burst.
        stack.enqueue(SET, BURST, JOB);
        let mut down = Duration::ZERO;
        match cell {
            Cell::Kill(Phase::ScaleUp) => self.kill_within(stack, 3000).await?,
            Cell::ApiServer(ApiServerFault::Restart) => down = Duration::from_secs(2),
            Cell::ApiServer(ApiServerFault::Outage) => down = Duration::from_secs(30),
            _ => {}
        }
        if !down.is_zero() {
            self.apiserver_down_within(stack, 2000, down).await?;
        }
        stack.jobs_succeeded(u64::from(BURST)).await?;
        if cell == Cell::Kill(Phase::ScaleDown) {
            self.kill_within(stack, 2000).await?;
        }
        stack.settled_at(1).await?;
        self.count_leaks(stack).await?;

        // The spec change: the warm runner is replaced by one on the new
        // image.
        stack.set_image(SET, NEXT_IMAGE).await?;
        if cell == Cell::Kill(Phase::SpecChange) {
            self.kill_within(stack, 2000).await?;
        }
        stack
            .until("the warm runner runs the new image", || async {
                let pods = stack.pods().list(&ListParams::default()).await.ok()?;
                let replaced = pods.items.len() == 1
                    && pods.items.iter().all(|p| {
                        p.metadata.deletion_timestamp.is_none()
                            && p.spec.as_ref().is_some_and(|s| {
                                s.containers
                                    .iter()
                                    .all(|c| c.image.as_deref() == Some(NEXT_IMAGE))
                            })
                    });
                replaced.then_some(())
            })
            .await?;
        stack.settled_at(1).await?;
        self.count_leaks(stack).await?;

        // The deletion: everything goes, in the cluster and in the service.
        stack.delete_scale_set(SET).await?;
        if cell == Cell::Kill(Phase::Deletion) {
            self.kill_within(stack, 2000).await?;
        }
        stack
            .until("the scale set and everything it made are gone", || async {
                let set = stack.scale_sets().get_opt(SET).await.ok()?;
                let runners = stack.runners().list(&ListParams::default()).await.ok()?;
                let pods = stack.pods().list(&ListParams::default()).await.ok()?;
                let service = stack.fake().control().scale_sets();
                (set.is_none()
                    && runners.items.is_empty()
                    && pods.items.is_empty()
                    && service.is_empty())
                .then_some(())
            })
            .await?;
        // Left registered, or removed by the service only because their
        // scale set went: either way the host never removed them.
        let ledger = stack.fake().control().ledger();
        let left = ledger.still_registered + ledger.removed_with_scale_set;
        self.outcome.leaked = self.outcome.leaked.max(left);
        if ledger.jobs_succeeded != u64::from(BURST) || ledger.jobs_unfinished != 0 {
            bail!(
                "{} of {BURST} jobs succeeded, {} unfinished, {} cancelled",
                ledger.jobs_succeeded,
                ledger.jobs_unfinished,
                ledger.jobs_cancelled
            );
        }
        Ok(())
    }

    /// Registrations no live runner owns, now; the most seen is kept.
    async fn count_leaks(&mut self, stack: &Stack) -> Result<()> {
        let runners = stack.runners().list(&ListParams::default()).await?;
        let live: BTreeSet<String> = runners
            .items
            .into_iter()
            .filter(|r| r.metadata.deletion_timestamp.is_none())
            .filter_map(|r| r.metadata.name)
            .collect();
        let leaked = stack
            .fake()
            .control()
            .runners()
            .iter()
            .filter(|r| !live.contains(&r.name))
            .count() as u64;
        self.outcome.leaked = self.outcome.leaked.max(leaked);
        Ok(())
    }

    /// Kills the host at a random point in the next `within_ms`, and starts
    /// another. The killed listener's message session is left as a crash
    /// leaves it: the new host meets it and waits until the service expires
    /// it (10 s in these runs), as it would after a real crash.
    async fn kill_within(&mut self, stack: &mut Stack, within_ms: u64) -> Result<()> {
        let wait = self.rng.random_range(0..within_ms);
        tokio::time::sleep(Duration::from_millis(wait)).await;
        stack.kill_host();
        self.outcome.hits += 1;
        stack.start_host().await
    }

    /// Stops the API server at a random point in the next `within_ms`, for
    /// `down`.
    async fn apiserver_down_within(
        &mut self,
        stack: &Stack,
        within_ms: u64,
        down: Duration,
    ) -> Result<()> {
        let plane = stack
            .own_control_plane()
            .context("an API server cell has a control plane of its own")?;
        let wait = self.rng.random_range(0..within_ms);
        tokio::time::sleep(Duration::from_millis(wait)).await;
        // The stop waits for the process (seconds of graceful shutdown):
        // off the async workers, which carry the fake and the simulator.
        tokio::task::block_in_place(|| plane.stop_apiserver());
        self.outcome.hits += 1;
        tokio::time::sleep(down).await;
        plane.start_apiserver().await?;
        Ok(())
    }
}

/// Watches, in the background, for a runner with two pods of one
/// registration at once (a pod of a runner is one it owns; its renewal
/// annotation says which registration it runs). Terminating pods count: a
/// pod being deleted may still run its runner.
///
/// A watch, not a poll: after an API server outage it resumes from the
/// last version it saw and delivers every change it missed, and nothing
/// can change while the server is away. What it cannot see (a watch error,
/// a re-list after its history was compacted) is counted as a gap, so a
/// run that could have hidden a duplicate says so.
struct PodWatch {
    seen_twice: Arc<Mutex<BTreeSet<String>>>,
    gaps: Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl PodWatch {
    fn abort(&self) {
        self.task.abort();
    }

    fn gaps(&self) -> u64 {
        self.gaps.load(std::sync::atomic::Ordering::SeqCst)
    }
}

fn watch_duplicate_pods(stack: &Stack) -> PodWatch {
    use futures::StreamExt as _;
    use kube::runtime::{WatchStreamExt as _, watcher};

    let seen_twice = Arc::new(Mutex::new(BTreeSet::new()));
    let gaps = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (sink, gap_sink) = (seen_twice.clone(), gaps.clone());
    let pods: Api<Pod> = stack.pods();
    let task = tokio::spawn(async move {
        let mut events = watcher(pods, watcher::Config::default())
            .backoff(arcwright::watch::WatchBackoff::default())
            .boxed();
        let mut live: BTreeMap<String, Pod> = BTreeMap::new();
        let mut relisted: Option<BTreeMap<String, Pod>> = None;
        let key = |pod: &Pod| pod.metadata.uid.clone().unwrap_or_default();
        while let Some(event) = events.next().await {
            let pods = match event {
                Err(_) => {
                    gap_sink.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    continue;
                }
                Ok(watcher::Event::Init) => {
                    relisted = Some(BTreeMap::new());
                    continue;
                }
                Ok(watcher::Event::InitApply(pod)) => {
                    let listing = relisted.get_or_insert_with(BTreeMap::new);
                    listing.insert(key(&pod), pod);
                    &*listing
                }
                Ok(watcher::Event::InitDone) => {
                    if let Some(listing) = relisted.take() {
                        live = listing;
                    }
                    &live
                }
                Ok(watcher::Event::Apply(pod)) => {
                    live.insert(key(&pod), pod);
                    &live
                }
                Ok(watcher::Event::Delete(pod)) => {
                    live.remove(&key(&pod));
                    continue;
                }
            };
            let twice = registrations_seen_twice(pods.values());
            sink.lock().unwrap_or_else(|p| p.into_inner()).extend(twice);
        }
    });
    PodWatch {
        seen_twice,
        gaps,
        task,
    }
}

/// The runners among `pods` with two pods of one registration (the same
/// renewal).
fn registrations_seen_twice<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> Vec<String> {
    let mut per_registration: BTreeMap<(String, String), u32> = BTreeMap::new();
    for pod in pods {
        let owner = pod
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.kind == EphemeralRunner::kind(&()));
        if let Some(owner) = owner {
            let renewal = pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(arcwright::api::annotations::RENEWAL))
                .cloned()
                .unwrap_or_default();
            *per_registration
                .entry((owner.name.clone(), renewal))
                .or_default() += 1;
        }
    }
    per_registration
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|((runner, _), _)| runner)
        .collect()
}

fn pods_seen_twice(watch: &PodWatch) -> u64 {
    watch
        .seen_twice
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .len() as u64
}

/// A concurrent writer: every runner, runner set and scale set gets a new
/// annotation ten times a second, so every write the host sends with a
/// resourceVersion it read a moment ago can meet a 409.
fn touch_all(stack: &Stack) -> tokio::task::JoinHandle<()> {
    let runners = stack.runners();
    let runner_sets = stack.runner_sets();
    let scale_sets = stack.scale_sets();
    tokio::spawn(async move {
        let mut n = 0u64;
        loop {
            n += 1;
            let patch = json!({"metadata": {"annotations": {"faults.arcwright.dev/touched": n.to_string()}}});
            let patch = Patch::Merge(&patch);
            let params = PatchParams::default();
            if let Ok(list) = runners.list(&ListParams::default()).await {
                for name in list.items.iter().filter_map(|r| r.metadata.name.as_deref()) {
                    let _ = runners.patch(name, &params, &patch).await;
                }
            }
            if let Ok(list) = runner_sets.list(&ListParams::default()).await {
                for name in list.items.iter().filter_map(|r| r.metadata.name.as_deref()) {
                    let _ = runner_sets.patch(name, &params, &patch).await;
                }
            }
            let _ = scale_sets.patch(SET, &params, &patch).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

/// Puts the host's ServiceAccount in a priority level of its own with one
/// seat, no borrowing and no queue: every request it sends while another
/// is in flight is answered 429, as a crowded API server answers a
/// low-priority client. Waits until the API server has taken the schema.
async fn throttle_host(stack: &Stack) -> Result<()> {
    use k8s_openapi::api::flowcontrol::v1::{FlowSchema, PriorityLevelConfiguration};
    let client = stack.client();
    let name = format!("arcwright-throttled-{}", stack.namespace());
    let level: PriorityLevelConfiguration = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"type": "Limited", "limited": {
            "nominalConcurrencyShares": 1,
            "lendablePercent": 0,
            "borrowingLimitPercent": 0,
            "limitResponse": {"type": "Reject"},
        }},
    }))?;
    Api::<PriorityLevelConfiguration>::all(client.clone())
        .create(&PostParams::default(), &level)
        .await
        .context("creating the priority level")?;
    let schema: FlowSchema = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "priorityLevelConfiguration": {"name": name},
            "matchingPrecedence": 100,
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [{
                "subjects": [{"kind": "ServiceAccount", "serviceAccount": {
                    "name": identity::SERVICE_ACCOUNT, "namespace": stack.namespace(),
                }}],
                "resourceRules": [{
                    "verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
                    "clusterScope": true, "namespaces": ["*"],
                }],
                "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
            }],
        },
    }))?;
    let schemas = Api::<FlowSchema>::all(client);
    schemas
        .create(&PostParams::default(), &schema)
        .await
        .context("creating the flow schema")?;
    stack
        .until("the API server applies the flow schema", || async {
            let schema = schemas.get(&name).await.ok()?;
            let conditions = schema.status?.conditions?;
            conditions
                .iter()
                .any(|c| c.type_ == "Dangling" && c.status.as_deref() == Some("False"))
                .then_some(())
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(cell: Cell, runs: Vec<RunOutcome>) -> CellReport {
        CellReport { cell, runs }
    }

    #[test]
    fn the_matrix_has_every_host_endpoint_with_every_fault_and_each_phase() {
        let cells = Cell::all();
        assert_eq!(cells.len(), (18 - UNCALLED.len()) * 5 + 4 + 4);
        assert!(cells.contains(&Cell::Actions(
            Endpoint::GenerateJitConfig,
            ActionsFault::Truncated
        )));
        assert!(!cells.iter().any(
            |c| matches!(c, Cell::Actions(e, _) if RUNNER_ENDPOINTS.contains(e) || UNCALLED.contains(e))
        ));
        assert!(Cell::Kill(Phase::Deletion).matches("deletion"));
        assert!(Cell::Actions(Endpoint::GetMessage, ActionsFault::Late).matches("late"));
    }

    #[test]
    fn two_pods_of_one_registration_are_a_duplicate_terminating_or_not_and_renewals_are_not() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
        let pod = |name: &str, runner: &str, renewal: Option<&str>, terminating: bool| Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                owner_references: Some(vec![OwnerReference {
                    kind: "EphemeralRunner".into(),
                    name: runner.into(),
                    ..OwnerReference::default()
                }]),
                annotations: renewal.map(|r| {
                    [(
                        arcwright::api::annotations::RENEWAL.to_string(),
                        r.to_string(),
                    )]
                    .into()
                }),
                deletion_timestamp: terminating.then_some(Time(jiff::Timestamp::UNIX_EPOCH)),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        };
        let pods = [
            pod("a-1", "a", None, true),
            pod("a-2", "a", None, false),
            pod("b-1", "b", None, true),
            pod("b-2", "b", Some("1"), false),
            pod("c-1", "c", Some("2"), false),
        ];
        assert_eq!(registrations_seen_twice(&pods), ["a"]);
    }

    #[test]
    fn the_summary_counts_every_violation_and_the_cells_never_struck() {
        let clean_run = RunOutcome {
            hits: 1,
            jobs: 4,
            ..RunOutcome::default()
        };
        let reports = vec![
            report(
                Cell::Kill(Phase::ScaleUp),
                vec![clean_run.clone(), clean_run.clone()],
            ),
            report(
                Cell::ApiServer(ApiServerFault::Restart),
                vec![RunOutcome {
                    leaked: 2,
                    cancelled: 1,
                    duplicates: 1,
                    unconverged: Some("never: settled at 1 runners".into()),
                    ..clean_run.clone()
                }],
            ),
            report(
                Cell::Actions(Endpoint::RefreshSession, ActionsFault::Reset),
                vec![RunOutcome::default()],
            ),
        ];
        assert_eq!(
            summary(&reports),
            "faults: cells=3 runs=4 leaked=2 cancelled=1 duplicates=1 unconverged=1 unstruck=1"
        );
        assert!(!clean(&reports));
        assert!(clean(&reports[..1]));
        assert!(!clean(&reports[2..]), "a cell that never struck is no pass");
        let table = table(&reports);
        assert!(
            table.contains("unconverged: api server / restarted mid-burst run 1: never: settled"),
            "{table}"
        );
        assert!(
            table.contains("unstruck: actions refresh-session / reset: the fault never struck"),
            "{table}"
        );
        assert!(
            table.lines().last().unwrap().starts_with("faults: cells=3"),
            "{table}"
        );
    }
}
