//! What a message batch asks of a listener, as pure functions: which jobs
//! to acquire, what to record on which runner, and the input of the next
//! scaling decision.

use jiff::Timestamp;

use super::jobs::{JobCompleted, JobStarted};
use super::memory::JobRecord;
use super::target::Observed;
use crate::actions::{JobInfo, JobMessage, Message, RunnerScaleSetStatistic};
use crate::policy::types::{JobStatistics, ScaleSet, ScalingInput};

/// Everything one message asks for, in the order the listener does it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BatchPlan {
    /// The statistics the message carried; the listener scales on the
    /// latest it has seen, never on counts of messages (a batch holds at
    /// most 50 items and jobs are requeued, so counting drifts).
    pub statistics: Option<RunnerScaleSetStatistic>,
    /// Job requests to acquire, each once, in the order offered.
    pub acquire: Vec<i64>,
    /// Jobs runners started, to record on the runners.
    pub started: Vec<JobStarted>,
    /// Jobs that ended on a runner, to record on the runners.
    pub completed: Vec<JobCompleted>,
    /// Whether any job started or ended: the runners changed under the last
    /// decision, so the next one is applied even if its answer is the same.
    pub job_events: bool,
    /// JobAssigned items (informational: the statistics carry their effect).
    pub assigned: usize,
    /// Items of a type this listener does not know.
    pub unknown: usize,
    /// Whether each record, in the message's order, is a start (the next
    /// of `started`) or an end (the next of `completed`).
    order: Vec<bool>,
}

impl BatchPlan {
    /// The records in the order the message gave them: a renewed runner
    /// can have one job's end and the next job's start in one message, and
    /// the end written last would leave the start recorded with the job
    /// before's registration (and then cleared as the job before's).
    pub fn records(&mut self) -> Vec<JobRecord> {
        let mut started = std::mem::take(&mut self.started).into_iter();
        let mut completed = std::mem::take(&mut self.completed).into_iter();
        std::mem::take(&mut self.order)
            .into_iter()
            .filter_map(|is_start| {
                if is_start {
                    started.next().map(JobRecord::Started)
                } else {
                    completed.next().map(JobRecord::Completed)
                }
            })
            .collect()
    }
}

/// Plans the handling of one message; `now` stands in for times the
/// service left out.
///
/// A job offered and then completed in the same batch (cancelled while on
/// offer) is not acquired; one completed and then offered again (requeued
/// after its runner vanished) is. JobStarted and JobCompleted without a
/// runner name cannot be recorded on a runner and only count as job events.
///
/// A job that started and ended on a runner within the batch is one record,
/// its completion carrying its start, not two: the job is not running any
/// more (no scale-down has a busy runner to spare), and the start would be
/// a write per job that lands, under the batch window, after the runner
/// ended and may have been renewed for another job. Whether the completion
/// is written at all is the sink's call; when it is not (a success, where
/// failed jobs are not held), the runner's status never names the job. The
/// one thing that changes: a runner that then exits non-zero is taken for
/// one that failed before it ran a job (recreated, its registration
/// removed), not for one that failed during a job, which the job's own
/// success belies.
pub fn plan_batch(message: &Message, now: Timestamp) -> BatchPlan {
    let mut plan = BatchPlan {
        statistics: message.statistics,
        ..BatchPlan::default()
    };
    for item in &message.jobs {
        match item {
            JobMessage::JobAvailable { job, .. } => {
                if !plan.acquire.contains(&job.runner_request_id) {
                    plan.acquire.push(job.runner_request_id);
                }
            }
            JobMessage::JobAssigned { .. } => plan.assigned += 1,
            JobMessage::JobStarted {
                runner_id,
                runner_name,
                job,
            } => {
                plan.job_events = true;
                if !runner_name.is_empty() {
                    plan.order.push(true);
                    plan.started.push(JobStarted {
                        runner_name: runner_name.clone(),
                        runner_id: *runner_id,
                        runner_request_id: job.runner_request_id,
                        repository: repository(job),
                        workflow_ref: job.job_workflow_ref.clone(),
                        workflow_run_id: job.workflow_run_id,
                        job_id: job.job_id.clone(),
                        job_display_name: job.job_display_name.clone(),
                        started_at: job.runner_assign_time.unwrap_or(now),
                    });
                }
            }
            JobMessage::JobCompleted {
                result,
                runner_id,
                runner_name,
                job,
            } => {
                plan.job_events = true;
                plan.acquire.retain(|id| *id != job.runner_request_id);
                if !runner_name.is_empty() {
                    plan.order.push(false);
                    plan.completed.push(JobCompleted {
                        runner_name: runner_name.clone(),
                        runner_id: *runner_id,
                        runner_request_id: job.runner_request_id,
                        job_id: job.job_id.clone(),
                        result: if result.is_empty() {
                            "unknown".to_string()
                        } else {
                            result.clone()
                        },
                        finished_at: job.finish_time.unwrap_or(now),
                        started: None,
                        jobs_waiting: message
                            .statistics
                            .is_some_and(|s| s.total_assigned_jobs > s.total_running_jobs),
                    });
                }
            }
            JobMessage::Unknown => plan.unknown += 1,
        }
    }
    for completed in &mut plan.completed {
        if let Some(at) = plan.started.iter().position(|s| {
            s.runner_request_id == completed.runner_request_id
                && s.runner_name == completed.runner_name
        }) {
            completed.started = Some(plan.started.remove(at));
            // The start's place in the order goes with it.
            let place = plan
                .order
                .iter()
                .enumerate()
                .filter(|(_, is_start)| **is_start)
                .nth(at)
                .map(|(i, _)| i);
            if let Some(place) = place {
                plan.order.remove(place);
            }
        }
    }
    plan
}

/// `owner/repo`, as ARC records it; the service sends the two apart.
fn repository(job: &JobInfo) -> String {
    if job.owner_name.is_empty() || job.repository_name.contains('/') {
        job.repository_name.clone()
    } else {
        format!("{}/{}", job.owner_name, job.repository_name)
    }
}

/// The input of a scaling decision.
///
/// `state` is left empty on purpose: each listener has its own
/// [`Decider`](crate::policy::Decider), which keeps the state its policy
/// returned, per scale set and in memory, and hands it back only to the
/// module version that wrote it. Passing it here would override that
/// check when a new version is swapped in.
pub fn scaling_input(
    scale_set: &ScaleSet,
    statistics: Option<&RunnerScaleSetStatistic>,
    observed: &Observed,
    now: Timestamp,
) -> ScalingInput {
    let count = |n: i64| u32::try_from(n.max(0)).unwrap_or(u32::MAX);
    let statistics = statistics.map_or_else(JobStatistics::default, |s| JobStatistics {
        available_jobs: count(s.total_available_jobs),
        acquired_jobs: count(s.total_acquired_jobs),
        assigned_jobs: count(s.total_assigned_jobs),
        running_jobs: count(s.total_running_jobs),
        registered_runners: count(s.total_registered_runners),
        busy_runners: count(s.total_busy_runners),
        idle_runners: count(s.total_idle_runners),
    });
    ScalingInput {
        scale_set: scale_set.clone(),
        statistics,
        runners: observed.runners.clone(),
        current_desired: observed.replicas.unwrap_or(0),
        now: Some(now.to_string()),
        state: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::types::RunnerCounts;

    fn info(id: i64) -> JobInfo {
        JobInfo {
            runner_request_id: id,
            repository_name: "app".into(),
            owner_name: "octo".into(),
            job_id: format!("job-{id}"),
            job_workflow_ref: "octo/app/.github/workflows/ci.yml@refs/heads/main".into(),
            job_display_name: format!("build-{id}"),
            workflow_run_id: 500 + id,
            ..JobInfo::default()
        }
    }

    fn available(id: i64) -> JobMessage {
        JobMessage::JobAvailable {
            acquire_job_url: String::new(),
            job: info(id),
        }
    }

    fn started(id: i64, runner: &str) -> JobMessage {
        JobMessage::JobStarted {
            runner_id: 7,
            runner_name: runner.into(),
            job: JobInfo {
                runner_assign_time: Some("2026-12-01T10:00:00Z".parse().unwrap()),
                ..info(id)
            },
        }
    }

    fn completed(id: i64, runner: &str, result: &str) -> JobMessage {
        JobMessage::JobCompleted {
            result: result.into(),
            runner_id: 7,
            runner_name: runner.into(),
            job: info(id),
        }
    }

    fn message(jobs: Vec<JobMessage>) -> Message {
        Message {
            id: 1,
            statistics: Some(RunnerScaleSetStatistic {
                total_assigned_jobs: 4,
                ..RunnerScaleSetStatistic::default()
            }),
            jobs,
        }
    }

    fn now() -> Timestamp {
        "2026-12-01T12:00:00Z".parse().unwrap()
    }

    /// (case, batch, acquire, started on, completed on, job events)
    type Case = (
        &'static str,
        Vec<JobMessage>,
        Vec<i64>,
        Vec<&'static str>,
        Vec<&'static str>,
        bool,
    );

    #[test]
    fn batches_plan_acquisitions_records_and_job_events() {
        let assigned = JobMessage::JobAssigned { job: info(1) };
        let cases: Vec<Case> = vec![
            ("empty", vec![], vec![], vec![], vec![], false),
            (
                "offers are acquired once each, in order",
                vec![available(3), available(1), available(3)],
                vec![3, 1],
                vec![],
                vec![],
                false,
            ),
            (
                "assignment alone is no job event",
                vec![assigned],
                vec![],
                vec![],
                vec![],
                false,
            ),
            (
                "started and completed are recorded on their runners",
                vec![started(1, "r-1"), completed(2, "r-2", "failed")],
                vec![],
                vec!["r-1"],
                vec!["r-2"],
                true,
            ),
            (
                "cancelled while on offer: not acquired",
                vec![available(5), completed(5, "", "canceled")],
                vec![],
                vec![],
                vec![],
                true,
            ),
            (
                "requeued after cancel: acquired again",
                vec![completed(5, "r-5", "canceled"), available(5)],
                vec![5],
                vec![],
                vec!["r-5"],
                true,
            ),
            (
                "a start without a runner name is an event, not a record",
                vec![started(1, "")],
                vec![],
                vec![],
                vec![],
                true,
            ),
            (
                "unknown items are skipped",
                vec![JobMessage::Unknown, available(9)],
                vec![9],
                vec![],
                vec![],
                false,
            ),
        ];
        for (name, jobs, acquire, started_on, completed_on, events) in cases {
            let plan = plan_batch(&message(jobs), now());
            assert_eq!(plan.acquire, acquire, "{name}");
            let runners = |names: Vec<&String>| names.into_iter().cloned().collect::<Vec<_>>();
            assert_eq!(
                runners(plan.started.iter().map(|s| &s.runner_name).collect()),
                started_on,
                "{name}"
            );
            assert_eq!(
                runners(plan.completed.iter().map(|c| &c.runner_name).collect()),
                completed_on,
                "{name}"
            );
            assert_eq!(plan.job_events, events, "{name}");
            assert_eq!(plan.statistics.unwrap().total_assigned_jobs, 4, "{name}");
        }
    }

    #[test]
    fn an_end_says_whether_jobs_waited_for_runners_when_it_came() {
        let waiting = |statistics: Option<(i64, i64)>| {
            let mut m = message(vec![completed(1, "r-1", "succeeded")]);
            m.statistics = statistics.map(|(assigned, running)| RunnerScaleSetStatistic {
                total_assigned_jobs: assigned,
                total_running_jobs: running,
                ..RunnerScaleSetStatistic::default()
            });
            plan_batch(&m, now()).completed[0].jobs_waiting
        };
        assert!(waiting(Some((3, 2))), "one assigned job not running");
        assert!(!waiting(Some((2, 2))), "every assigned job running");
        assert!(!waiting(None), "no statistics: nothing known to wait");
    }

    #[test]
    fn records_keep_the_messages_order() {
        // One runner: the end of its job before (a failure, recorded), then
        // the start of its next job.
        let mut plan = plan_batch(
            &message(vec![
                completed(1, "r-1", "failed"),
                started(2, "r-1"),
                started(3, "r-3"),
                completed(3, "r-3", "succeeded"),
            ]),
            now(),
        );
        let order: Vec<(bool, i64)> = plan
            .records()
            .iter()
            .map(|r| match r {
                JobRecord::Started(s) => (true, s.runner_request_id),
                JobRecord::Completed(c) => (false, c.runner_request_id),
            })
            .collect();
        assert_eq!(order, [(false, 1), (true, 2), (false, 3)]);
    }

    #[test]
    fn a_job_started_and_ended_in_one_batch_is_one_record() {
        let plan = plan_batch(
            &message(vec![
                started(1, "r-1"),
                started(2, "r-2"),
                completed(1, "r-1", "succeeded"),
                // The same request on another runner (requeued): its own.
                completed(2, "r-9", "failed"),
            ]),
            now(),
        );
        let started = |c: &JobCompleted| c.started.as_ref().map(|s| s.runner_request_id);
        assert_eq!(
            plan.completed.iter().map(started).collect::<Vec<_>>(),
            [Some(1), None]
        );
        assert_eq!(
            plan.started
                .iter()
                .map(|s| s.runner_name.as_str())
                .collect::<Vec<_>>(),
            ["r-2"]
        );
    }

    #[test]
    fn records_carry_what_the_runner_status_shows() {
        let plan = plan_batch(
            &message(vec![started(1, "r-1"), completed(1, "r-1", "")]),
            now(),
        );
        // One record, the completion carrying the start.
        assert_eq!(plan.started, []);
        assert_eq!(
            plan.completed[0].started.as_slice(),
            [JobStarted {
                runner_name: "r-1".into(),
                runner_id: 7,
                runner_request_id: 1,
                repository: "octo/app".into(),
                workflow_ref: "octo/app/.github/workflows/ci.yml@refs/heads/main".into(),
                workflow_run_id: 501,
                job_id: "job-1".into(),
                job_display_name: "build-1".into(),
                started_at: "2026-12-01T10:00:00Z".parse().unwrap(),
            }]
        );
        assert_eq!(plan.completed[0].result, "unknown");
        assert_eq!(
            plan.completed[0].finished_at,
            now(),
            "the service gave no time"
        );

        let mut job = info(2);
        job.repository_name = "other/repo".into();
        assert_eq!(repository(&job), "other/repo");
        job.owner_name.clear();
        job.repository_name = "repo".into();
        assert_eq!(repository(&job), "repo");
    }

    #[test]
    fn the_scaling_input_takes_statistics_and_what_the_target_holds() {
        let scale_set = ScaleSet {
            name: "linux".into(),
            namespace: "ci".into(),
            min_runners: 1,
            max_runners: 4,
            labels: vec!["linux".into()],
        };
        let observed = Observed {
            replicas: Some(3),
            patch_id: 9,
            runners: RunnerCounts {
                running: 2,
                busy: 1,
                ..RunnerCounts::default()
            },
        };
        let stats = RunnerScaleSetStatistic {
            total_available_jobs: 1,
            total_acquired_jobs: 2,
            total_assigned_jobs: 5,
            total_running_jobs: 3,
            total_registered_runners: 4,
            total_busy_runners: -1,
            total_idle_runners: i64::MAX,
        };
        let input = scaling_input(&scale_set, Some(&stats), &observed, now());
        assert_eq!(input.scale_set, scale_set);
        assert_eq!(
            input.statistics,
            JobStatistics {
                available_jobs: 1,
                acquired_jobs: 2,
                assigned_jobs: 5,
                running_jobs: 3,
                registered_runners: 4,
                busy_runners: 0,
                idle_runners: u32::MAX,
            }
        );
        assert_eq!(input.runners, observed.runners);
        assert_eq!(input.current_desired, 3);
        assert_eq!(input.now.as_deref(), Some("2026-12-01T12:00:00Z"));
        assert_eq!(input.state, None);

        let first = scaling_input(&scale_set, None, &Observed::default(), now());
        assert_eq!(first.statistics, JobStatistics::default());
        assert_eq!(first.current_desired, 0);
    }
}
