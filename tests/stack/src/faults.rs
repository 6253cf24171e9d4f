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
//!   scale-down, the spec change or the deletion, and started again; a
//!   kill after its phase ended is no hit.
//! - **leadership breaks** mid-burst: the leader is cut off from the API
//!   server while a standby waits, or every answer it is sent comes later
//!   than a third of the lease.
//! - **the shards move** mid-burst: the replica serving the set is killed,
//!   or a replica joins and takes the set's shard.
//! - **the host's client is rate-limited** (`--kube-qps 5`) under the
//!   burst, with its Lease renewals beside the burst's writes.
//!
//! After every run the invariants are counted, not asserted, so one table
//! shows everything: registrations leaked (a registration no live runner
//! owns after the burst, any registration left once the set is gone, or
//! one the service removed only because its scale set went: the host
//! never removed it), jobs cancelled because a pod went under them,
//! duplicates (runners that had two pods of one registration at once, and
//! jobs a listener acquired after another replica's session for its scale
//! set had begun: split brain), and runs that did not converge (a phase
//! that did not reach its state within [`PHASE_BOUND`] of the fault's end,
//! or a job that did not complete). The matrix passes when all four are
//! zero and every cell's fault struck.
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
use fake_actions::{Endpoint, Fault, FaultKind, SessionHistory};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Resource as _;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::{HostProcess, RUNNER_ENDPOINTS, ScaleSet, Stack, StackConfig, identity};

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

/// How leadership is broken in a cell: the host leads with
/// `--leader-elect --lease-duration 6s`, its API server traffic through a
/// relay, and a standby replica reaches the API server directly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ElectionFault {
    /// The leader is cut off from the API server mid-burst (a partition:
    /// requests hang), while the Actions service stays reachable; the
    /// standby must lead once the Lease has gone unrenewed, and the old
    /// leader must have stopped taking jobs before then.
    CutOff,
    /// Every answer the leader is sent comes [`RENEW_LATE`] late through
    /// the burst, over a third of the lease: renewals are acknowledged
    /// late, so the leader may step down, and must do so before the
    /// standby can lead.
    RenewLate,
}

impl ElectionFault {
    /// Every kind, in table order.
    pub const ALL: [ElectionFault; 2] = [ElectionFault::CutOff, ElectionFault::RenewLate];

    fn name(self) -> &'static str {
        match self {
            ElectionFault::CutOff => "leader cut off mid-burst",
            ElectionFault::RenewLate => "answers 3 s late (lease 6 s)",
        }
    }
}

/// How the split of the fleet changes in a cell: the host runs with
/// `--shards 2 --lease-duration 6s`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ShardFault {
    /// Two replicas hold a shard each; the one serving the set is SIGKILLed
    /// mid-burst, and the survivor takes its shard once the Lease expires.
    ReplicaKilled,
    /// The host holds both shards; a replica joins mid-burst and takes the
    /// shard the host lets go, which is the set's.
    ReplicaAdded,
}

impl ShardFault {
    /// Every kind, in table order.
    pub const ALL: [ShardFault; 2] = [ShardFault::ReplicaKilled, ShardFault::ReplicaAdded];

    fn name(self) -> &'static str {
        match self {
            ShardFault::ReplicaKilled => "set's replica killed mid-burst",
            ShardFault::ReplicaAdded => "a replica added mid-burst",
        }
    }
}

/// How the host's own client is held back in a cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum HostFault {
    /// `--kube-qps 5`: the burst's writes wait for the client's limiter,
    /// and Lease renewals must not wait behind them.
    RateLimited,
}

impl HostFault {
    /// Every kind, in table order.
    pub const ALL: [HostFault; 1] = [HostFault::RateLimited];

    fn name(self) -> &'static str {
        match self {
            HostFault::RateLimited => "--kube-qps 5 under the burst",
        }
    }
}

/// The lease of the election and shard cells: short, so that a hand-over
/// costs seconds.
const LEASE: &str = "6s";

/// How late every answer comes in [`ElectionFault::RenewLate`]: more than
/// a third of [`LEASE`], the period at which a holder renews.
const RENEW_LATE: Duration = Duration::from_secs(3);

/// The standby or second replica's name (its sessions' owner).
const REPLICA: &str = "replica";

/// The shards of the shard cells.
const SHARDS: u32 = 2;

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
    /// Leadership is broken.
    Election(ElectionFault),
    /// The split of the fleet changes.
    Shards(ShardFault),
    /// The host's own client is held back.
    Host(HostFault),
}

impl Cell {
    /// Every cell of the matrix: each Actions endpoint the host calls in
    /// the lifecycle with each fault, the API server's four, a kill in each
    /// phase, the elections', the shards' and the rate-limited host.
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
        cells.extend(ElectionFault::ALL.map(Cell::Election));
        cells.extend(ShardFault::ALL.map(Cell::Shards));
        cells.extend(HostFault::ALL.map(Cell::Host));
        cells
    }

    /// The table's first two columns.
    pub fn labels(&self) -> (String, String) {
        match self {
            Cell::Actions(endpoint, fault) => (format!("actions {endpoint}"), fault.name().into()),
            Cell::ApiServer(fault) => ("api server".into(), fault.name().into()),
            Cell::Kill(phase) => ("host SIGKILL".into(), phase.name().into()),
            Cell::Election(fault) => ("leader election".into(), fault.name().into()),
            Cell::Shards(fault) => ("shards".into(), fault.name().into()),
            Cell::Host(fault) => ("host".into(), fault.name().into()),
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
    /// The share of each phase's kill window a kill may land in: small in
    /// the quick form, so its one kill lands while the phase is still
    /// under way; the whole window in the full form, where a kill after
    /// the phase ended is run but not counted as a hit.
    pub kill_window: f64,
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
            kill_window: 0.05,
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
            kill_window: 1.0,
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
            let (times, kill_window) = (options.times, options.kill_window);
            running.spawn(async move {
                let outcome = run_once(cell, times, kill_window, seed, binary).await;
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
async fn run_once(
    cell: Cell,
    times: u32,
    kill_window: f64,
    seed: u64,
    binary: PathBuf,
) -> Result<RunOutcome> {
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
    let extra: &[&str] = match cell {
        Cell::Election(_) => &["--leader-elect", "--lease-duration", LEASE],
        Cell::Shards(_) => &["--shards", "2", "--lease-duration", LEASE],
        Cell::Host(HostFault::RateLimited) => &["--kube-qps", "5"],
        _ => &[],
    };
    config.host_args.extend(extra.iter().map(|a| a.to_string()));
    config.host_relay = matches!(cell, Cell::Election(_));
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
        kill_window,
        set: SET.to_owned(),
        replica: None,
    };
    run.arrange(&stack, cell).await?;
    let started = Instant::now();
    let from = jiff::Timestamp::now();
    let pods = watch_duplicate_pods(&stack);
    let writer = (cell == Cell::ApiServer(ApiServerFault::Conflicts))
        .then(|| touch_all(&stack, run.set.clone()));
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
    let history = stack.fake().control().session_history();
    run.outcome.duplicates = pods_seen_twice(&pods) + split_brain(&history);
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
        Cell::Election(ElectionFault::RenewLate) => {
            run.outcome.hits = stack.host_relay().map_or(0, |r| r.held());
        }
        Cell::Host(HostFault::RateLimited) => {
            run.outcome.hits = match stack.host() {
                Some(host) => rate_limited(host.base()).await.unwrap_or(0),
                None => 0,
            };
        }
        Cell::ApiServer(_) | Cell::Kill(_) | Cell::Election(_) | Cell::Shards(_) => {}
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
    /// See [`MatrixOptions::kill_window`].
    kill_window: f64,
    /// The set's name: [`SET`], or in the shard cells a name chosen for
    /// the shard the fault moves.
    set: String,
    /// The standby or second replica of the election and shard cells.
    replica: Option<HostProcess>,
}

impl Run {
    /// What a cell needs before the lifecycle: the standby, the replicas
    /// and their split, and the set's name in the shard that will move.
    async fn arrange(&mut self, stack: &Stack, cell: Cell) -> Result<()> {
        match cell {
            Cell::Election(_) => {
                stack
                    .until("the host leads", || async {
                        let holder = lease_holder(stack, LEADER_LEASE).await?;
                        holder.starts_with("arcwright-1-").then_some(())
                    })
                    .await?;
                self.replica = Some(stack.start_replica(REPLICA).await?);
            }
            Cell::Shards(ShardFault::ReplicaKilled) => {
                self.replica = Some(stack.start_replica(REPLICA).await?);
                let holders = stack
                    .until("a shard for each replica", || async {
                        let holders = shard_holders(stack).await?;
                        let replica = holders.iter().position(|h| owner_of(h) == REPLICA)?;
                        let host = holders.iter().position(|h| owner_of(h) != REPLICA)?;
                        Some((replica, host))
                    })
                    .await?;
                self.set = set_in_shard(stack.namespace(), holders.0 as u32);
            }
            Cell::Shards(ShardFault::ReplicaAdded) => {
                let host = stack
                    .until("the host holds both shards", || async {
                        let holders = shard_holders(stack).await?;
                        let first = holders.first()?.clone();
                        holders.iter().all(|h| *h == first).then_some(first)
                    })
                    .await?;
                // The host lets go the shards it prefers least once a
                // replica joins (`runtime::shards::plan`).
                let let_go = (0..SHARDS)
                    .min_by_key(|&shard| arcwright::runtime::shards::preference(&host, shard))
                    .unwrap_or(0);
                self.set = set_in_shard(stack.namespace(), let_go);
            }
            _ => {}
        }
        Ok(())
    }

    /// The lifecycle, with the cell's fault at its point. Leaks and lost
    /// jobs are counted on the way; an error is a phase that did not
    /// converge.
    async fn lifecycle(&mut self, stack: &mut Stack, cell: Cell) -> Result<()> {
        let set = self.set.clone();
        stack.set_bound(PHASE_BOUND);
        stack.create_scale_set(&ScaleSet::new(&set, 1, 3)).await?;
        stack.listening(&set).await?;

        // The burst.
        stack.enqueue(&set, BURST, JOB);
        let mut down = Duration::ZERO;
        match cell {
            Cell::Kill(Phase::ScaleUp) => self.kill_within(stack, Phase::ScaleUp, 3000).await?,
            Cell::ApiServer(ApiServerFault::Restart) => down = Duration::from_secs(2),
            Cell::ApiServer(ApiServerFault::Outage) => down = Duration::from_secs(30),
            Cell::Election(fault) => self.break_leadership(stack, fault).await?,
            Cell::Shards(fault) => self.move_the_set(stack, fault).await?,
            _ => {}
        }
        if !down.is_zero() {
            self.apiserver_down_within(stack, 2000, down).await?;
        }
        stack.jobs_succeeded(u64::from(BURST)).await?;
        if let Some(relay) = stack.host_relay() {
            relay.delay_answers(Duration::ZERO);
        }
        if cell == Cell::Kill(Phase::ScaleDown) {
            self.kill_within(stack, Phase::ScaleDown, 2000).await?;
        }
        stack.settled_at(1).await?;
        self.count_leaks(stack).await?;

        // The spec change: the warm runner is replaced by one on the new
        // image.
        stack.set_image(&set, NEXT_IMAGE).await?;
        if cell == Cell::Kill(Phase::SpecChange) {
            self.kill_within(stack, Phase::SpecChange, 2000).await?;
        }
        stack
            .until("the warm runner runs the new image", || async {
                replaced(stack).await?.then_some(())
            })
            .await?;
        stack.settled_at(1).await?;
        self.count_leaks(stack).await?;

        // The deletion: everything goes, in the cluster and in the service.
        stack.delete_scale_set(&set).await?;
        if cell == Cell::Kill(Phase::Deletion) {
            self.kill_within(stack, Phase::Deletion, 2000).await?;
        }
        stack
            .until("the scale set and everything it made are gone", || async {
                gone(stack, &set).await?.then_some(())
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

    /// Whether `phase` is still under way: a kill after its end proves
    /// nothing about it.
    async fn under_way(&self, stack: &Stack, phase: Phase) -> bool {
        match phase {
            Phase::ScaleUp => burst_under_way(stack),
            Phase::ScaleDown => stack.is_settled_at(1).await == Some(false),
            Phase::SpecChange => replaced(stack).await == Some(false),
            Phase::Deletion => gone(stack, &self.set).await == Some(false),
        }
    }

    /// Breaks the leadership mid-burst; the standby must then lead and
    /// serve the set.
    async fn break_leadership(&mut self, stack: &Stack, fault: ElectionFault) -> Result<()> {
        let relay = stack
            .host_relay()
            .context("an election cell relays the host's traffic")?;
        self.sleep_within(2000).await;
        match fault {
            ElectionFault::CutOff => {
                if !burst_under_way(stack) {
                    return Ok(());
                }
                relay.cut();
                stack
                    .until("the standby leads and serves the set", || async {
                        let holder = lease_holder(stack, LEADER_LEASE).await?;
                        (owner_of(&holder) == REPLICA && served_by(stack, &self.set, REPLICA))
                            .then_some(())
                    })
                    .await?;
                self.outcome.hits += 1;
            }
            // The answers stay late until the burst is done; the hits are
            // the answers held.
            ElectionFault::RenewLate => relay.delay_answers(RENEW_LATE),
        }
        Ok(())
    }

    /// Moves the set's shard mid-burst: kills the replica serving it, or
    /// adds one that takes it; the other must then serve the set.
    async fn move_the_set(&mut self, stack: &Stack, fault: ShardFault) -> Result<()> {
        self.sleep_within(2000).await;
        let to = match fault {
            ShardFault::ReplicaKilled => {
                let replica = self.replica.take().context("the replica runs")?;
                let struck = burst_under_way(stack);
                replica.kill();
                if !struck {
                    return Ok(());
                }
                "arcwright-1"
            }
            ShardFault::ReplicaAdded => {
                if !burst_under_way(stack) {
                    return Ok(());
                }
                self.replica = Some(stack.start_replica(REPLICA).await?);
                REPLICA
            }
        };
        stack
            .until(&format!("the set served by {to}"), || async {
                served_by(stack, &self.set, to).then_some(())
            })
            .await?;
        self.outcome.hits += 1;
        Ok(())
    }

    /// Sleeps a random share of `within_ms`, scaled by the kill window.
    async fn sleep_within(&mut self, within_ms: u64) {
        let window = ((within_ms as f64) * self.kill_window).max(1.0) as u64;
        let wait = self.rng.random_range(0..window);
        tokio::time::sleep(Duration::from_millis(wait)).await;
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

    /// Kills the host at a random point in the next `within_ms` (scaled by
    /// the kill window), and starts another; a hit only if `phase` was
    /// still under way. The killed listener's message session is left as
    /// a crash leaves it: the new host meets it and waits until the
    /// service expires it (10 s in these runs), as it would after a real
    /// crash.
    async fn kill_within(&mut self, stack: &mut Stack, phase: Phase, within_ms: u64) -> Result<()> {
        self.sleep_within(within_ms).await;
        let struck = self.under_way(stack, phase).await;
        stack.kill_host();
        self.outcome.hits += u64::from(struck);
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

/// The leader's Lease (the host's default `--leader-election-lease`).
const LEADER_LEASE: &str = "arcwright-controller";

/// The holder of the Lease `name` in the stack's namespace.
async fn lease_holder(stack: &Stack, name: &str) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(stack.client(), stack.namespace());
    leases.get_opt(name).await.ok()??.spec?.holder_identity
}

/// Each shard's holder, in shard order; `None` until every shard has one.
async fn shard_holders(stack: &Stack) -> Option<Vec<String>> {
    let mut holders = Vec::new();
    for shard in 0..SHARDS {
        let lease = arcwright::runtime::shards::shard_lease(shard);
        holders.push(lease_holder(stack, &lease).await?);
    }
    Some(holders)
}

/// The replica an identity names: the identity is the replica's
/// `HOSTNAME` (its sessions' owner), a dash and eight hex digits.
fn owner_of(identity: &str) -> &str {
    identity
        .rsplit_once('-')
        .map_or(identity, |(owner, _)| owner)
}

/// A set name in `shard` of the stack's namespace.
fn set_in_shard(namespace: &str, shard: u32) -> String {
    (0u32..)
        .map(|n| format!("{SET}-{n}"))
        .find(|name| arcwright::sharding::shard_of(namespace, name, SHARDS) == shard)
        .unwrap_or_else(|| SET.to_owned())
}

/// Whether the one live message session of the scale set `set` is
/// `owner`'s.
fn served_by(stack: &Stack, set: &str, owner: &str) -> bool {
    let control = stack.fake().control();
    let Some(id) = control.scale_sets().into_iter().find(|s| s.name == set) else {
        return false;
    };
    let history = control.session_history();
    let live: Vec<_> = history
        .of_scale_set(id.id)
        .filter(|s| s.ended.is_none())
        .collect();
    live.len() == 1 && live[0].owner == owner
}

/// Whether the burst's jobs are not all done yet.
fn burst_under_way(stack: &Stack) -> bool {
    stack.fake().control().ledger().jobs_succeeded < u64::from(BURST)
}

/// Whether the set's one pod runs the new image and nothing else is left;
/// `None` if the API server did not answer.
async fn replaced(stack: &Stack) -> Option<bool> {
    let pods = stack.pods().list(&ListParams::default()).await.ok()?;
    Some(
        pods.items.len() == 1
            && pods.items.iter().all(|p| {
                p.metadata.deletion_timestamp.is_none()
                    && p.spec.as_ref().is_some_and(|s| {
                        s.containers
                            .iter()
                            .all(|c| c.image.as_deref() == Some(NEXT_IMAGE))
                    })
            }),
    )
}

/// Whether the scale set and everything it made are gone, in the cluster
/// and in the service; `None` if the API server did not answer.
async fn gone(stack: &Stack, set: &str) -> Option<bool> {
    let scale_set = stack.scale_sets().get_opt(set).await.ok()?;
    let runners = stack.runners().list(&ListParams::default()).await.ok()?;
    let pods = stack.pods().list(&ListParams::default()).await.ok()?;
    let service = stack.fake().control().scale_sets();
    Some(
        scale_set.is_none()
            && runners.items.is_empty()
            && pods.items.is_empty()
            && service.is_empty(),
    )
}

/// Jobs acquired by a listener after another replica's session for the
/// same scale set had begun: two holders acting at once, which elections
/// and shard Leases exist to prevent. (The session of a host restarted
/// after a kill has another owner too, but a killed host acquires
/// nothing.)
fn split_brain(history: &SessionHistory) -> u64 {
    history
        .acquisitions
        .iter()
        .filter(|acquisition| {
            let Some(session) = history.session(&acquisition.session) else {
                return false;
            };
            history.of_scale_set(session.scale_set_id).any(|successor| {
                successor.owner != session.owner
                    && successor.created > session.created
                    && successor.created <= acquisition.at
            })
        })
        .map(|acquisition| acquisition.jobs.len() as u64)
        .sum()
}

/// The host's `arcwright_kube_client_rate_limited_total`: requests its
/// `--kube-qps` held back.
async fn rate_limited(base: &str) -> Result<u64> {
    let text = reqwest::get(format!("{base}/metrics"))
        .await?
        .error_for_status()?
        .text()
        .await?;
    text.lines()
        .find_map(|line| {
            let mut words = line.split_whitespace();
            let name = words.next()?;
            let metric = name.split('{').next()?;
            (metric == "arcwright_kube_client_rate_limited_total")
                .then(|| words.next()?.parse::<f64>().ok())?
        })
        .map(|v| v as u64)
        .context("no arcwright_kube_client_rate_limited_total on /metrics")
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
fn touch_all(stack: &Stack, set: String) -> tokio::task::JoinHandle<()> {
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
            let _ = scale_sets.patch(&set, &params, &patch).await;
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
        assert_eq!(cells.len(), (18 - UNCALLED.len()) * 5 + 4 + 4 + 2 + 2 + 1);
        assert!(cells.contains(&Cell::Election(ElectionFault::RenewLate)));
        assert!(cells.contains(&Cell::Shards(ShardFault::ReplicaAdded)));
        assert!(Cell::Host(HostFault::RateLimited).matches("kube-qps"));
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
    fn jobs_a_holder_acquired_after_its_successor_began_are_split_brain() {
        use fake_actions::{Acquisition, SessionRecord};
        use std::time::UNIX_EPOCH;
        let at = |s: u64| UNIX_EPOCH + Duration::from_secs(s);
        let session = |id: &str, set: u64, owner: &str, created: u64| SessionRecord {
            id: id.into(),
            scale_set_id: set,
            owner: owner.into(),
            created: at(created),
            polls: 0,
            last_poll: None,
            ended: None,
        };
        let acquired = |s: u64, session: &str, jobs: Vec<u64>| Acquisition {
            at: at(s),
            session: session.into(),
            jobs,
        };
        let history = SessionHistory {
            sessions: vec![
                session("old", 1, "arcwright-1", 10),
                session("new", 1, "replica", 20),
                session("other-set", 2, "replica", 5),
            ],
            conflicts: Vec::new(),
            acquisitions: vec![
                // Before its successor began: the old holder's to take.
                acquired(15, "old", vec![1]),
                // After: two holders at once.
                acquired(21, "old", vec![2, 3]),
                // The successor's own, and another set's.
                acquired(22, "new", vec![4]),
                acquired(23, "other-set", vec![5]),
            ],
        };
        assert_eq!(split_brain(&history), 2);
    }

    #[test]
    fn a_set_is_named_into_the_shard_asked_for() {
        for shard in 0..SHARDS {
            let name = set_in_shard("faults-ns", shard);
            assert_eq!(
                arcwright::sharding::shard_of("faults-ns", &name, SHARDS),
                shard
            );
        }
        assert_eq!(owner_of("arcwright-1-0badcafe"), "arcwright-1");
        assert_eq!(owner_of("replica-12345678"), "replica");
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
