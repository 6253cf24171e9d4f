//! `cargo xtask demo`: arcwright doing its whole job on one machine, in
//! front of the person who ran it.
//!
//! The demo brings up the stack (its own control plane, with an audit log
//! so the host's API server requests can be counted), creates a scale set
//! whose scaling policy is a module in a ConfigMap (the bundled `default`,
//! ARC's formula), enqueues a burst of jobs and shows, live:
//!
//! - jobs queued / running / done (the fake Actions service's view);
//! - runners desired (the policy's last decision) / pending / busy (running
//!   a job, by the Actions service's record of running jobs) / idle (the
//!   cluster's EphemeralRunners);
//! - the policy and the reason it gave, from the scale set's
//!   `status.scaling`;
//! - beside it, what a shadow policy (the bundled `buffered`, two spare
//!   runners) would have asked for on the same input, from
//!   `status.scaling.shadow`: decided on every decision, never applied, so
//!   the runners follow the active policy's count while the shadow's is
//!   shown next to it. This is how an admin tries a candidate on live
//!   traffic before swapping it in.
//!
//! Half-way through the burst it replaces the module in the ConfigMap with
//! the bundled `cooldown` policy, live, without touching the scale set or
//! the host: from then on the set no longer shrinks as the queue drains
//! (cooldown holds the peak for `scaleDownAfterSeconds`, 300 by default),
//! and the reason line says so. The run ends with a summary: jobs done,
//! p50/p95 wait (job available to job started), Actions calls per job, API
//! server requests per job.
//!
//! Output is progress bars on a terminal and plain log lines otherwise
//! (CI, a pipe, `--non-interactive`). Ctrl-C at any point stops everything
//! the demo started: the host, the fake, the simulator and the control
//! plane go with the stack when it is dropped, and the child processes are
//! also tied to the demo's life by the kernel (`PR_SET_PDEATHSIG`).

use std::collections::BTreeSet;
use std::fmt;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use arcwright::api::{EphemeralRunner, EphemeralRunnerPhase};
use arcwright::policy::PolicyKind;
use fake_actions::{FakeConfig, JobPhase, JobSnapshot};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use kube::api::ListParams;

use crate::stats::{intervals, percentile};
use crate::timeline::Recorder;
use crate::{ScaleSet, Stack, StackConfig};

/// The scale set's name and the jobs' label.
const SET: &str = "demo";
/// The ConfigMap holding the scaling policy.
const POLICY_CONFIG_MAP: &str = "scaling-policy";
/// The shadow scaling policy, as the spec names it: a warm buffer of two,
/// a candidate whose answers differ visibly from ARC's formula (it asks
/// for two more while jobs run, and two when idle).
const SHADOW: &str = "buffered";
/// The shadow's settings.
const SHADOW_IDLE: u32 = 2;

/// How the demo runs.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Jobs in the burst.
    pub jobs: u32,
    /// The scale set's `maxRunners`.
    pub max_runners: u32,
    /// How long each job runs.
    pub job_ms: u64,
    /// Keep everything up after the summary, until Ctrl-C.
    pub keep: bool,
    /// Plain log lines instead of progress bars.
    pub plain: bool,
}

impl DemoOptions {
    /// Plain output unless stdout is a terminal.
    pub fn plain_unless_terminal() -> bool {
        !std::io::stdout().is_terminal()
    }
}

/// One moment of the run, as the view shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct View {
    /// Jobs not started yet.
    pub queued: usize,
    /// Jobs running.
    pub running: usize,
    /// Jobs finished.
    pub done: usize,
    /// The policy's last decision.
    pub desired: i32,
    /// Runners not running a job whose pod is not running yet.
    pub pending: usize,
    /// Runners running a job: the service runs one on the runner's
    /// registration, or the listener recorded one that has not ended. Not
    /// the runner's phase, which lags the job (a runner can be Pending, or
    /// Running with no job recorded yet, while its job runs).
    pub busy: usize,
    /// Runners running without a job.
    pub idle: usize,
    /// The policy that decided, and why.
    pub policy: String,
    /// The reason it gave.
    pub reason: String,
    /// The shadow policy's last answer, never applied; `None` before its
    /// first answer or when it gave none.
    pub shadow_desired: Option<i32>,
    /// How that answer compares with the active policy's (`same`,
    /// `higher`, `lower`), or why there was none.
    pub shadow_agreement: String,
}

impl View {
    /// Counts jobs by phase and runners by state.
    pub fn from_parts(jobs: &[JobSnapshot], runners: &[EphemeralRunner]) -> View {
        let mut view = View::default();
        let mut running_on = BTreeSet::new();
        for job in jobs {
            match job.phase {
                JobPhase::Running => {
                    view.running += 1;
                    running_on.extend(job.runner_id);
                }
                JobPhase::Finished => view.done += 1,
                _ => view.queued += 1,
            }
        }
        for runner in runners
            .iter()
            .filter(|r| r.metadata.deletion_timestamp.is_none())
        {
            let status = runner.status.clone().unwrap_or_default();
            let running = status.phase == Some(EphemeralRunnerPhase::Running);
            let runs_a_job = u64::try_from(status.runner_id)
                .is_ok_and(|registration| running_on.contains(&registration))
                || (running && status.has_job() && !status.job_ended());
            match status.phase {
                _ if runs_a_job => view.busy += 1,
                Some(EphemeralRunnerPhase::Running) => view.idle += 1,
                None | Some(EphemeralRunnerPhase::Pending) => view.pending += 1,
                // Finished, held or outdated runners are on their way out.
                Some(_) => {}
            }
        }
        view
    }

    /// The view as one plain log line.
    pub fn line(&self) -> String {
        format!(
            "jobs queued={} running={} done={} | runners desired={} pending={} busy={} idle={} | {} | {}: {}",
            self.queued,
            self.running,
            self.done,
            self.desired,
            self.pending,
            self.busy,
            self.idle,
            self.shadow_text(),
            self.policy,
            self.reason
        )
    }

    /// The shadow's answer beside the active one's, as the view shows it.
    pub fn shadow_text(&self) -> String {
        match self.shadow_desired {
            Some(desired) => format!(
                "shadow {SHADOW} desired={desired} ({}, not applied)",
                self.shadow_agreement
            ),
            None if self.shadow_agreement.is_empty() => format!("shadow {SHADOW} desired=-"),
            None => format!("shadow {SHADOW} gave no answer: {}", self.shadow_agreement),
        }
    }
}

/// What the demo reports at the end.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// Jobs that finished.
    pub jobs_done: u64,
    /// Wait from available to started, 50th percentile.
    pub p50_wait: Duration,
    /// The same, 95th percentile.
    pub p95_wait: Duration,
    /// Host calls to the Actions service and GitHub API.
    pub actions_calls: u64,
    /// Host requests to the API server.
    pub apiserver_requests: u64,
    /// The reason of the last decision before the swap.
    pub reason_before_swap: String,
    /// The reason of the last decision seen.
    pub reason_after_swap: String,
    /// What the shadow made of the run: its answers seen, and how they
    /// compared with the active policy's.
    pub shadow: ShadowTally,
}

/// The shadow's answers over the run, as the view sampled them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShadowTally {
    /// Views in which the shadow had answered.
    pub answered: u64,
    /// Of those, views in which it asked for more runners than the active
    /// policy.
    pub higher: u64,
    /// ... for fewer.
    pub lower: u64,
    /// The most it asked for.
    pub peak_desired: i32,
    /// The most runners alive at once, which follow the active policy.
    pub peak_alive: usize,
}

impl ShadowTally {
    fn add(&mut self, view: &View) {
        self.peak_alive = self.peak_alive.max(view.pending + view.busy + view.idle);
        let Some(desired) = view.shadow_desired else {
            return;
        };
        self.answered += 1;
        self.peak_desired = self.peak_desired.max(desired);
        match desired.cmp(&view.desired) {
            std::cmp::Ordering::Greater => self.higher += 1,
            std::cmp::Ordering::Less => self.lower += 1,
            std::cmp::Ordering::Equal => {}
        }
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let jobs = self.jobs_done.max(1) as f64;
        writeln!(f, "summary: jobs done: {}", self.jobs_done)?;
        writeln!(
            f,
            "summary: wait from job available to job started: p50 {} ms, p95 {} ms",
            self.p50_wait.as_millis(),
            self.p95_wait.as_millis()
        )?;
        writeln!(
            f,
            "summary: Actions calls per job: {:.2}",
            self.actions_calls as f64 / jobs
        )?;
        writeln!(
            f,
            "summary: API server requests per job: {:.2}",
            self.apiserver_requests as f64 / jobs
        )?;
        writeln!(
            f,
            "summary: policy before the swap: {}",
            self.reason_before_swap
        )?;
        writeln!(
            f,
            "summary: policy after the swap: {}",
            self.reason_after_swap
        )?;
        write!(
            f,
            "summary: shadow {SHADOW} (never applied): answered in {} views, higher than the active policy in {}, lower in {}; it asked for at most {} runners, at most {} were alive",
            self.shadow.answered,
            self.shadow.higher,
            self.shadow.lower,
            self.shadow.peak_desired,
            self.shadow.peak_alive
        )
    }
}

/// Where the view goes.
enum Display {
    Bars {
        multi: MultiProgress,
        jobs: ProgressBar,
        runners: ProgressBar,
        policy: ProgressBar,
    },
    Plain {
        last: Option<String>,
        printed: Instant,
    },
}

impl Display {
    fn new(plain: bool, jobs: u32, max_runners: u32) -> Display {
        if plain {
            return Display::Plain {
                last: None,
                printed: Instant::now(),
            };
        }
        let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stdout());
        let bar = |len: u32, template: &str| {
            let bar = multi.add(ProgressBar::new(u64::from(len)));
            bar.set_style(
                ProgressStyle::with_template(template)
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
            );
            bar
        };
        let jobs = bar(
            jobs,
            "jobs    [{bar:40.green/white}] {pos:>5}/{len:<5} done  {msg}",
        );
        let runners = bar(
            max_runners,
            "runners [{bar:40.cyan/white}] {pos:>5}/{len:<5} alive {msg}",
        );
        let policy = multi.add(ProgressBar::new_spinner());
        policy.set_style(
            ProgressStyle::with_template("policy  {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        Display::Bars {
            multi,
            jobs,
            runners,
            policy,
        }
    }

    fn show(&mut self, view: &View) {
        match self {
            Display::Bars {
                jobs,
                runners,
                policy,
                ..
            } => {
                jobs.set_position(view.done as u64);
                jobs.set_message(format!("queued {} running {}", view.queued, view.running));
                runners.set_position((view.pending + view.busy + view.idle) as u64);
                runners.set_message(format!(
                    "desired {} pending {} busy {} idle {}",
                    view.desired, view.pending, view.busy, view.idle
                ));
                policy.set_message(format!(
                    "{}: {}\n        {}",
                    view.policy,
                    view.reason,
                    view.shadow_text()
                ));
            }
            Display::Plain { last, printed } => {
                let line = view.line();
                // A line when something changed, at most every second.
                if last.as_deref() != Some(line.as_str())
                    && (last.is_none() || printed.elapsed() >= Duration::from_secs(1))
                {
                    println!("{line}");
                    *last = Some(line);
                    *printed = Instant::now();
                }
            }
        }
    }

    fn say(&self, message: &str) {
        match self {
            Display::Bars { multi, .. } => {
                let _ = multi.println(message);
            }
            Display::Plain { .. } => println!("{message}"),
        }
    }

    fn finish(&self) {
        if let Display::Bars {
            jobs,
            runners,
            policy,
            ..
        } = self
        {
            // `abandon` leaves each bar as last drawn; `finish` would fill
            // the runners' bar to its length, which is not what is alive.
            jobs.abandon();
            runners.abandon();
            policy.abandon();
        }
    }
}

/// Runs the demo; prints as it goes and returns the summary (printed too).
pub async fn run(options: &DemoOptions) -> Result<Summary> {
    let DemoOptions {
        jobs,
        max_runners,
        job_ms,
        keep,
        plain,
    } = options.clone();
    println!(
        "arcwright demo: {jobs} jobs of {job_ms} ms, at most {max_runners} runners; starting the control plane, the fake Actions service, the runner simulator and `arcwright run`"
    );
    let mut config = StackConfig::new("demo");
    config.audit = true;
    config.fake = FakeConfig {
        assignment_timeout: Duration::from_secs(3600),
        ..FakeConfig::default()
    };
    let stack = Stack::start(config).await?;
    let host = stack.host().context("the host runs")?;
    println!(
        "processes: arcwright={} {}",
        host.pid(),
        stack.control_plane_pids()
    );

    stack
        .put_policy(POLICY_CONFIG_MAP, bundled("default")?)
        .await?;
    let max = i32::try_from(max_runners).context("--max-runners is too large")?;
    stack
        .create_scale_set(
            &ScaleSet::new(SET, 0, max)
                .with_policy_config_map(POLICY_CONFIG_MAP)
                .with(
                    "shadowScalingPolicy",
                    serde_json::json!({"builtin": SHADOW, "settings": {"idle": SHADOW_IDLE}}),
                ),
        )
        .await?;
    stack.listening(SET).await?;
    println!(
        "scale set {SET} listening in namespace {}, scaling policy from ConfigMap {POLICY_CONFIG_MAP} (bundled `default`: ARC's formula); shadow policy bundled `{SHADOW}` ({SHADOW_IDLE} spare runners), decided beside it and never applied",
        stack.namespace()
    );

    let recorder = Recorder::start(stack.fake().control(), stack.client(), stack.namespace());
    let calls_before = stack.host_actions_calls();
    let window_start = jiff::Timestamp::now();
    let mut display = Display::new(plain, jobs, max_runners);
    let ids = stack.enqueue(SET, jobs, Duration::from_millis(job_ms));
    recorder.enqueued(&ids, Instant::now());
    display.say(&format!("enqueued {jobs} jobs"));

    let total = ids.len();
    let mut swapped = false;
    let mut reason_before_swap = String::new();
    let mut view = View::default();
    let mut shadow = ShadowTally::default();
    loop {
        view = observe(&stack).await.unwrap_or(view);
        display.show(&view);
        shadow.add(&view);
        if !swapped && view.done * 2 >= total {
            reason_before_swap = format!("{}: {}", view.policy, view.reason);
            stack
                .put_policy(POLICY_CONFIG_MAP, bundled("cooldown")?)
                .await?;
            swapped = true;
            display.say(
                "swapped the scaling policy: ConfigMap scaling-policy now holds the bundled `cooldown` (scale down only after 300 s); the host and the scale set are untouched",
            );
        }
        if view.done >= total {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // The swapped policy decides on the next message; show its reason, and
    // the shadow's answer beside it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while (is_formula(&view.reason) || view.shadow_desired.is_none()) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
        view = observe(&stack).await.unwrap_or(view);
        display.show(&view);
        shadow.add(&view);
    }
    display.finish();

    let calls = stack.host_actions_calls() - calls_before;
    let requests = stack
        .host_apiserver_requests(window_start, jiff::Timestamp::now())
        .unwrap_or_default();
    let timeline = recorder.timeline();
    let waits = intervals(&timeline.enqueued, &timeline.started);
    let summary = Summary {
        jobs_done: view.done as u64,
        p50_wait: percentile(&waits, 50).unwrap_or_default(),
        p95_wait: percentile(&waits, 95).unwrap_or_default(),
        actions_calls: calls,
        apiserver_requests: requests.total,
        reason_before_swap,
        reason_after_swap: format!("{}: {}", view.policy, view.reason),
        shadow,
    };
    println!("{summary}");

    if keep {
        println!(
            "everything stays up until Ctrl-C; try:\n  export KUBECONFIG={}\n  kubectl -n {} get autoscalingrunnersets,ephemeralrunnersets,ephemeralrunners,pods\n  curl {}/metrics",
            stack.kubeconfig_path().display(),
            stack.namespace(),
            host.base()
        );
        tokio::signal::ctrl_c().await.ok();
    }
    Ok(summary)
}

/// The view now: the fake's jobs, the cluster's runners, the scale set's
/// last decision.
async fn observe(stack: &Stack) -> Option<View> {
    let jobs = stack.fake().control().jobs();
    let runners = stack.runners().list(&ListParams::default()).await.ok()?;
    let mut view = View::from_parts(&jobs, &runners.items);
    let set = stack.scale_sets().get_opt(SET).await.ok()??;
    if let Some(scaling) = set.status.and_then(|s| s.scaling) {
        view.desired = scaling.desired_runners;
        view.policy = scaling.policy;
        view.reason = scaling.reason;
        if let Some(shadow) = scaling.shadow {
            view.shadow_desired = shadow.desired_runners;
            view.shadow_agreement = shadow.error.or(shadow.agreement).unwrap_or_default();
        }
    }
    Some(view)
}

/// Whether a reason is the `default` policy's (ARC's formula, which starts
/// with its first term) rather than `cooldown`'s, which starts with what it
/// does: "holding 3: ...", "scaling up at once: ...".
pub fn is_formula(reason: &str) -> bool {
    reason.starts_with("minRunners")
}

fn bundled(name: &str) -> Result<&'static [u8]> {
    Ok(arcwright::policy::bundled::find(PolicyKind::Scaling, name)
        .with_context(|| format!("the bundled scaling policy {name}"))?
        .wasm)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(phase: JobPhase) -> JobSnapshot {
        JobSnapshot {
            id: 1,
            labels: vec![],
            phase,
            scale_set_id: Some(1),
            runner_id: None,
            result: None,
            requeues: 0,
        }
    }

    /// A job the service runs on registration `runner_id`.
    fn running_on(runner_id: u64) -> JobSnapshot {
        JobSnapshot {
            runner_id: Some(runner_id),
            ..job(JobPhase::Running)
        }
    }

    /// A runner registered as `registration` (0: not yet).
    fn registered(
        phase: Option<EphemeralRunnerPhase>,
        registration: i64,
        job: i64,
    ) -> EphemeralRunner {
        let mut runner = runner(phase, job, false);
        if let Some(status) = runner.status.as_mut() {
            status.runner_id = registration;
        }
        runner
    }

    fn runner(phase: Option<EphemeralRunnerPhase>, job: i64, deleting: bool) -> EphemeralRunner {
        let mut runner: EphemeralRunner = serde_json::from_value(serde_json::json!({
            "apiVersion": "arcwright.dev/v1alpha1", "kind": "EphemeralRunner",
            "metadata": {"name": "r"},
            "spec": {"githubConfigUrl": "u", "githubConfigSecret": "s", "runnerScaleSetId": 1,
                     "spec": {"containers": []}},
        }))
        .unwrap();
        let mut status = runner.status.clone().unwrap_or_default();
        status.phase = phase;
        status.job_request_id = job;
        runner.status = Some(status);
        if deleting {
            runner.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::now(),
                ));
        }
        runner
    }

    #[test]
    fn the_view_counts_jobs_by_phase_and_runners_by_state() {
        use EphemeralRunnerPhase::*;
        let jobs = [
            job(JobPhase::Available),
            job(JobPhase::Acquired),
            job(JobPhase::Running),
            job(JobPhase::Finished),
            job(JobPhase::Finished),
        ];
        let runners = [
            runner(None, 0, false),
            runner(Some(Pending), 0, false),
            runner(Some(Running), 7, false),
            runner(Some(Running), 0, false),
            runner(Some(Succeeded), 7, false),
            runner(Some(Running), 0, true),
        ];
        let view = View::from_parts(&jobs, &runners);
        assert_eq!(
            (view.queued, view.running, view.done),
            (2, 1, 2),
            "{view:?}"
        );
        assert_eq!((view.pending, view.busy, view.idle), (2, 1, 1), "{view:?}");
        assert!(view.line().starts_with(
            "jobs queued=2 running=1 done=2 | runners desired=0 pending=2 busy=1 idle=1 | shadow buffered desired=-"
        ));
    }

    /// A runner's phase and job record lag its job: the service running a
    /// job on its registration is what makes it busy.
    #[test]
    fn a_runner_is_busy_while_the_service_runs_its_job_whatever_its_status_says() {
        use EphemeralRunnerPhase::*;
        let jobs = [running_on(11), running_on(12), job(JobPhase::Finished)];
        let runners = [
            // Running, the listener's record of the job not written yet.
            registered(Some(Running), 11, 0),
            // Still Pending as far as its status goes.
            registered(Some(Pending), 12, 0),
            // Registered, waiting for a job.
            registered(Some(Running), 13, 0),
            registered(None, 0, 0),
        ];
        let view = View::from_parts(&jobs, &runners);
        assert_eq!((view.pending, view.busy, view.idle), (1, 2, 1), "{view:?}");
        assert_eq!(view.running, view.busy, "every running job has its runner");
    }

    #[test]
    fn the_summary_reports_per_job_figures() {
        let summary = Summary {
            jobs_done: 10,
            p50_wait: Duration::from_millis(1200),
            p95_wait: Duration::from_millis(2500),
            actions_calls: 12,
            apiserver_requests: 75,
            reason_before_swap: "a".into(),
            reason_after_swap: "b".into(),
            shadow: ShadowTally {
                answered: 9,
                higher: 4,
                lower: 1,
                peak_desired: 5,
                peak_alive: 3,
            },
        };
        let text = summary.to_string();
        assert!(text.contains("jobs done: 10"), "{text}");
        assert!(text.contains("p50 1200 ms, p95 2500 ms"), "{text}");
        assert!(text.contains("Actions calls per job: 1.20"), "{text}");
        assert!(text.contains("API server requests per job: 7.50"), "{text}");
        assert!(
            text.contains("answered in 9 views, higher than the active policy in 4, lower in 1; it asked for at most 5 runners, at most 3 were alive"),
            "{text}"
        );
    }

    /// The shadow's answer is counted against the active one's in the
    /// same view, and views before its first answer count for nothing.
    #[test]
    fn the_shadow_tally_compares_each_answer_with_the_active_one() {
        let mut tally = ShadowTally::default();
        let view = |desired, shadow, busy| View {
            desired,
            shadow_desired: shadow,
            busy,
            ..View::default()
        };
        tally.add(&view(0, None, 0));
        tally.add(&view(3, Some(5), 3));
        tally.add(&view(3, Some(3), 2));
        tally.add(&view(2, Some(1), 1));
        assert_eq!(
            tally,
            ShadowTally {
                answered: 3,
                higher: 1,
                lower: 1,
                peak_desired: 5,
                peak_alive: 3,
            }
        );
        let failed = View {
            shadow_agreement: "not loaded".into(),
            ..View::default()
        };
        assert_eq!(
            failed.shadow_text(),
            "shadow buffered gave no answer: not loaded"
        );
        let answered = view(1, Some(3), 0);
        let answered = View {
            shadow_agreement: "higher".into(),
            ..answered
        };
        assert_eq!(
            answered.shadow_text(),
            "shadow buffered desired=3 (higher, not applied)"
        );
    }
}
