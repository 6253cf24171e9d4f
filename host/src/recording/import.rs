//! Traces made from job histories kept elsewhere, for a scale set that has
//! no recording yet (a new cluster, recording off, a history longer than
//! the bounds keep): GitHub's workflow jobs exported as CSV, and the fake
//! Actions service's job history. Only job entries come out: no decisions
//! were made, so such a trace can be simulated, not replayed.
//!
//! The conversions are pure (text or values in, entries out); fetching and
//! writing files is the command line's ([`super::cli`]).
//!
//! # The CSV
//!
//! One row per workflow job, as `GET /repos/{owner}/{repo}/actions/runs/{run_id}/jobs`
//! answers them, the columns named after its fields (extra columns are
//! ignored, so a whole export works):
//!
//! | column | required | what |
//! |---|---|---|
//! | `id` | yes, a value | the job's id, the entries' `runnerRequestId` |
//! | `created_at` | yes, a value | when it was queued (RFC 3339) |
//! | `started_at` | the column | when a runner started it; empty: never started |
//! | `completed_at` | the column | when it ended; empty: not ended |
//! | `conclusion` | the column | `success`, `failure`, `cancelled`, `timed_out`, ...; `skipped` jobs are left out |
//! | `labels` | no | its `runs-on` labels, separated by `;`, `,` or spaces |
//!
//! Each job becomes `available` and `assigned` at `created_at`, `started`
//! at `started_at` and `completed` at `completed_at` with the conclusion
//! as the service says results (`succeeded`, `failed`, `canceled`). A time
//! earlier than the one before it is taken as that one, as the service
//! never reports a job started before it was queued. Jobs GitHub skipped
//! never reached a runner, so they are not traffic a scale set would see.

use std::collections::HashMap;

use jiff::Timestamp;
use serde::Deserialize;

use super::{Entry, FORMAT, Header, Job, JobEvent, Trace};
use crate::actions::JobMessage;

/// The columns a CSV must have.
pub const REQUIRED_COLUMNS: [&str; 5] = [
    "id",
    "created_at",
    "started_at",
    "completed_at",
    "conclusion",
];

/// A history that cannot be made a trace.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The CSV's header lacks columns.
    #[error(
        "line 1 of the CSV (its header) lacks the column(s) {}: a job needs {}",
        .missing.join(", "),
        REQUIRED_COLUMNS.join(", ")
    )]
    MissingColumns {
        /// The columns not found.
        missing: Vec<&'static str>,
    },
    /// A row is not what it should be.
    #[error("line {line} of the CSV: {message}")]
    Row {
        /// Its line, from 1.
        line: u64,
        /// What is wrong with it.
        message: String,
    },
    /// The CSV has no header.
    #[error("the CSV is empty: its first line must name the columns ({})", REQUIRED_COLUMNS.join(", "))]
    Empty,
    /// A message of the fake's history cannot be read.
    #[error("message {index} of the job history: {message}")]
    History {
        /// Its index, from 0.
        index: usize,
        /// What is wrong with it.
        message: String,
    },
}

/// One workflow job of the CSV.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CsvJob {
    /// `id`.
    pub id: i64,
    /// `created_at`.
    pub created_at: Timestamp,
    /// `started_at`, if it started.
    pub started_at: Option<Timestamp>,
    /// `completed_at`, if it ended.
    pub completed_at: Option<Timestamp>,
    /// `conclusion`, if any.
    pub conclusion: Option<String>,
    /// `labels`.
    pub labels: Vec<String>,
}

/// Reads the CSV's jobs, in the order of its rows.
pub fn read_csv(text: &str) -> Result<Vec<CsvJob>, ImportError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut reader = csv::ReaderBuilder::new()
        .flexible(true)
        .trim(csv::Trim::All)
        .from_reader(text.as_bytes());
    let header = reader.headers().map_err(|e| row_error(&e, 1))?.clone();
    if header.iter().all(str::is_empty) {
        return Err(ImportError::Empty);
    }
    let column = |name: &str| header.iter().position(|c| c.eq_ignore_ascii_case(name));
    let missing: Vec<&'static str> = REQUIRED_COLUMNS
        .into_iter()
        .filter(|name| column(name).is_none())
        .collect();
    if !missing.is_empty() {
        return Err(ImportError::MissingColumns { missing });
    }
    let at = |name: &str| column(name).unwrap_or_default();
    let (id, created, started, completed, conclusion) = (
        at("id"),
        at("created_at"),
        at("started_at"),
        at("completed_at"),
        at("conclusion"),
    );
    let labels = column("labels");
    let mut jobs = Vec::new();
    for record in reader.records() {
        let record = record.map_err(|e| row_error(&e, 0))?;
        let line = record.position().map_or(0, csv::Position::line);
        if record.iter().all(str::is_empty) {
            continue;
        }
        let field = |i: usize| record.get(i).unwrap_or_default();
        let failed = |message: String| ImportError::Row { line, message };
        let id_text = field(id);
        if id_text.is_empty() {
            return Err(failed("the job has no id".into()));
        }
        let id = id_text
            .parse::<i64>()
            .map_err(|_| failed(format!("id {id_text:?} is not a whole number")))?;
        let time = |name: &str, i: usize| -> Result<Option<Timestamp>, ImportError> {
            let text = field(i);
            if text.is_empty() {
                return Ok(None);
            }
            text.parse().map(Some).map_err(|_| {
                failed(format!(
                    "{name} {text:?} is not an RFC 3339 time (e.g. 2026-12-04T10:00:00Z)"
                ))
            })
        };
        let created_at = time("created_at", created)?
            .ok_or_else(|| failed(format!("job {id} has no created_at")))?;
        jobs.push(CsvJob {
            id,
            created_at,
            started_at: time("started_at", started)?,
            completed_at: time("completed_at", completed)?,
            conclusion: Some(field(conclusion))
                .filter(|c| !c.is_empty())
                .map(str::to_owned),
            labels: labels.map_or_else(Vec::new, |i| {
                field(i)
                    .split([';', ',', ' ', '\t'])
                    .filter(|l| !l.is_empty())
                    .map(str::to_owned)
                    .collect()
            }),
        });
    }
    Ok(jobs)
}

fn row_error(error: &csv::Error, default_line: u64) -> ImportError {
    ImportError::Row {
        line: error.position().map_or(default_line, csv::Position::line),
        message: error.to_string(),
    }
}

/// A GitHub conclusion as the Actions service reports the job's result;
/// `None` for a job GitHub skipped, which no runner ever saw.
pub fn result_of(conclusion: &str) -> Option<String> {
    let conclusion = conclusion.to_ascii_lowercase();
    Some(match conclusion.as_str() {
        "skipped" => return None,
        "success" => "succeeded".to_owned(),
        "failure" | "timed_out" | "startup_failure" => "failed".to_owned(),
        "cancelled" => "canceled".to_owned(),
        _ => conclusion,
    })
}

/// The job entries of `jobs`, in time order (a job's own events in their
/// order at equal times, jobs by id).
pub fn csv_entries(jobs: &[CsvJob]) -> Vec<Entry> {
    let mut timed: Vec<(Timestamp, i64, JobEvent, Job)> = Vec::new();
    for job in jobs {
        let result = match job.conclusion.as_deref().map(result_of) {
            Some(None) => continue,
            Some(Some(result)) => Some(result),
            None => None,
        };
        let queued = job.created_at;
        let started = job.started_at.map(|t| t.max(queued));
        let completed = job.completed_at.map(|t| t.max(started.unwrap_or(queued)));
        let text = |t: Timestamp| t.to_string();
        let base = Job {
            at: text(queued),
            event: JobEvent::Available,
            runner_request_id: job.id,
            labels: job.labels.clone(),
            queue_time: Some(text(queued)),
            scale_set_assign_time: None,
            runner_assign_time: None,
            finish_time: None,
            result: None,
        };
        let mut push = |at: Timestamp, entry: Job| timed.push((at, job.id, entry.event, entry));
        push(queued, base.clone());
        let assigned = Job {
            event: JobEvent::Assigned,
            scale_set_assign_time: Some(text(queued)),
            ..base
        };
        push(queued, assigned.clone());
        let mut last = assigned;
        if let Some(started) = started {
            last = Job {
                at: text(started),
                event: JobEvent::Started,
                runner_assign_time: Some(text(started)),
                ..last
            };
            push(started, last.clone());
        }
        if let Some(completed) = completed {
            push(
                completed,
                Job {
                    at: text(completed),
                    event: JobEvent::Completed,
                    finish_time: Some(text(completed)),
                    result: result.clone(),
                    ..last
                },
            );
        }
    }
    timed.sort_by_key(|(at, id, event, _)| (*at, *id, rank(*event)));
    timed
        .into_iter()
        .map(|(_, _, _, job)| Entry::Job(job))
        .collect()
}

fn rank(event: JobEvent) -> u8 {
    match event {
        JobEvent::Available => 0,
        JobEvent::Assigned => 1,
        JobEvent::Started => 2,
        JobEvent::Completed => 3,
    }
}

/// The entries of a CSV of workflow jobs ([`read_csv`], then [`csv_entries`]).
pub fn from_csv(text: &str) -> Result<Vec<Entry>, ImportError> {
    Ok(csv_entries(&read_csv(text)?))
}

/// The fake Actions service's job history, `GET /_fake/history`: every job
/// message it posted to a scale set, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct FakeHistory {
    /// Messages it no longer holds, of any scale set.
    #[serde(default)]
    pub dropped: u64,
    /// The messages it holds.
    pub messages: Vec<PostedMessage>,
}

/// One job message the fake posted.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct PostedMessage {
    /// When, RFC 3339: the listener would have seen it then.
    pub at: String,
    /// The scale set's id.
    pub scale_set_id: u64,
    /// The job message as the queue delivers it.
    pub message: serde_json::Value,
}

/// The job entries of `history` (of the scale set `scale_set` only, when
/// given), as the listener records the messages it reads. A message that
/// repeats its job's last event (the service announces jobs still on offer
/// again to a new session) is left out: it is no new traffic.
pub fn history_entries(
    history: &FakeHistory,
    scale_set: Option<u64>,
) -> Result<Vec<Entry>, ImportError> {
    let mut last: HashMap<i64, JobEvent> = HashMap::new();
    let mut entries = Vec::new();
    for (index, posted) in history.messages.iter().enumerate() {
        if scale_set.is_some_and(|id| id != posted.scale_set_id) {
            continue;
        }
        let failed = |message: String| ImportError::History { index, message };
        let at: Timestamp = posted
            .at
            .parse()
            .map_err(|_| failed(format!("{:?} is not an RFC 3339 time", posted.at)))?;
        let message: JobMessage = serde_json::from_value(posted.message.clone())
            .map_err(|e| failed(format!("not a job message: {e}")))?;
        let Some(job) = Job::from_message(&message, at) else {
            continue;
        };
        if last.insert(job.runner_request_id, job.event) == Some(job.event) {
            continue;
        }
        entries.push(Entry::Job(job));
    }
    Ok(entries)
}

/// A trace of `entries` for the scale set `namespace/name`, `dropped`
/// entries missing before them.
pub fn trace(namespace: &str, name: &str, dropped: u64, entries: Vec<Entry>) -> Trace {
    Trace {
        header: Header {
            format: FORMAT.to_owned(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            dropped,
        },
        entries,
    }
}

/// `trace` as JSON lines, as [`super::read`] reads it and the recording
/// API serves it.
pub fn render(trace: &Trace) -> Result<String, serde_json::Error> {
    let mut out = serde_json::to_string(&trace.header)?;
    out.push('\n');
    for entry in &trace.entries {
        out.push_str(&serde_json::to_string(entry)?);
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording::read;

    const CSV: &str = "\
id,run_id,status,conclusion,created_at,started_at,completed_at,name,labels
7001,55,completed,success,2026-12-04T10:00:00Z,2026-12-04T10:00:40Z,2026-12-04T10:05:00Z,build,\"self-hosted;linux\"
7002,55,completed,failure,2026-12-04T10:00:10Z,2026-12-04T10:00:20Z,2026-12-04T10:01:00Z,\"test, unit\",self-hosted linux
7003,55,completed,skipped,2026-12-04T10:00:10Z,2026-12-04T10:00:10Z,2026-12-04T10:00:10Z,deploy,
7004,55,in_progress,,2026-12-04T10:02:00Z,2026-12-04T10:03:00Z,,lint,linux
7005,55,completed,cancelled,2026-12-04T10:04:00Z,,2026-12-04T10:04:30Z,docs,linux
";

    fn events(entries: &[Entry]) -> Vec<(i64, JobEvent, String)> {
        entries
            .iter()
            .map(|e| match e {
                Entry::Job(j) => (j.runner_request_id, j.event, j.at.clone()),
                Entry::Decision(_) => panic!("a decision from a job history"),
            })
            .collect()
    }

    fn job(entries: &[Entry], id: i64, event: JobEvent) -> Job {
        entries
            .iter()
            .find_map(|e| match e {
                Entry::Job(j) if j.runner_request_id == id && j.event == event => Some(j.clone()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no {event:?} of job {id}"))
    }

    #[test]
    fn a_csv_of_workflow_jobs_becomes_their_events_in_time_order() {
        use JobEvent::*;
        let entries = from_csv(CSV).unwrap();
        let t = |s: &str| format!("2026-12-04T10:{s}Z");
        assert_eq!(
            events(&entries),
            [
                (7001, Available, t("00:00")),
                (7001, Assigned, t("00:00")),
                (7002, Available, t("00:10")),
                (7002, Assigned, t("00:10")),
                (7002, Started, t("00:20")),
                (7001, Started, t("00:40")),
                (7002, Completed, t("01:00")),
                (7004, Available, t("02:00")),
                (7004, Assigned, t("02:00")),
                (7004, Started, t("03:00")),
                (7005, Available, t("04:00")),
                (7005, Assigned, t("04:00")),
                (7005, Completed, t("04:30")),
                (7001, Completed, t("05:00")),
            ],
            "the skipped job is left out; the running one has not completed"
        );
        let done = job(&entries, 7001, Completed);
        assert_eq!(done.labels, ["self-hosted", "linux"]);
        assert_eq!(done.result.as_deref(), Some("succeeded"));
        assert_eq!(done.queue_time.as_deref(), Some("2026-12-04T10:00:00Z"));
        assert_eq!(
            done.scale_set_assign_time.as_deref(),
            Some("2026-12-04T10:00:00Z")
        );
        assert_eq!(
            done.runner_assign_time.as_deref(),
            Some("2026-12-04T10:00:40Z")
        );
        assert_eq!(done.finish_time.as_deref(), Some("2026-12-04T10:05:00Z"));
        let failed = job(&entries, 7002, Completed);
        assert_eq!(failed.labels, ["self-hosted", "linux"], "space separated");
        assert_eq!(failed.result.as_deref(), Some("failed"));
        let cancelled = job(&entries, 7005, Completed);
        assert_eq!(cancelled.result.as_deref(), Some("canceled"));
        assert_eq!(cancelled.runner_assign_time, None, "it never started");
        assert_eq!(job(&entries, 7004, Started).result, None);
    }

    #[test]
    fn what_is_written_reads_back_with_the_same_jobs() {
        let entries = from_csv(CSV).unwrap();
        let written = render(&trace("ci", "linux", 0, entries.clone())).unwrap();
        let back = read(&written).unwrap();
        assert_eq!(back.header.format, FORMAT);
        assert_eq!(
            (back.header.namespace.as_str(), back.header.name.as_str()),
            ("ci", "linux")
        );
        assert_eq!(back.entries, entries);
    }

    #[test]
    fn times_out_of_order_are_taken_as_the_one_before() {
        let entries = from_csv(
            "id,created_at,started_at,completed_at,conclusion\n\
             1,2026-12-04T10:00:00Z,2026-12-04T09:59:00Z,2026-12-04T09:58:00Z,success\n",
        )
        .unwrap();
        let at: Vec<String> = events(&entries).into_iter().map(|(_, _, at)| at).collect();
        assert_eq!(at, ["2026-12-04T10:00:00Z"; 4]);
        assert_eq!(
            job(&entries, 1, JobEvent::Completed).finish_time.as_deref(),
            Some("2026-12-04T10:00:00Z")
        );
    }

    #[test]
    fn missing_columns_and_bad_values_are_refused_naming_the_line() {
        let error = from_csv("id,created_at,labels\n1,2026-12-04T10:00:00Z,linux\n").unwrap_err();
        let text = error.to_string();
        assert!(text.starts_with("line 1 of the CSV"), "{text}");
        assert!(
            text.contains("started_at, completed_at, conclusion"),
            "{text}"
        );
        let header = "id,created_at,started_at,completed_at,conclusion\n";
        let refused = [
            ("x,2026-12-04T10:00:00Z,,,\n", "line 2", "id \"x\""),
            ("1,yesterday,,,\n", "line 2", "created_at \"yesterday\""),
            (
                "1,2026-12-04T10:00:00Z,,,\n2,,,,\n",
                "line 3",
                "job 2 has no created_at",
            ),
            (
                "1,2026-12-04T10:00:00Z,soon,,\n",
                "line 2",
                "started_at \"soon\"",
            ),
            (",2026-12-04T10:00:00Z,,,\n", "line 2", "no id"),
        ];
        for (rows, line, says) in refused {
            let text = from_csv(&format!("{header}{rows}"))
                .unwrap_err()
                .to_string();
            assert!(
                text.starts_with(&format!("{line} of the CSV")),
                "{rows}: {text}"
            );
            assert!(text.contains(says), "{rows}: {text}");
        }
        assert!(matches!(from_csv(""), Err(ImportError::Empty)));
    }

    #[test]
    fn a_header_with_a_byte_order_mark_and_capitals_is_read() {
        let entries = from_csv(
            "\u{feff}ID,Created_At,Started_At,Completed_At,Conclusion\n\
             9,2026-12-04T10:00:00Z,,,\n",
        )
        .unwrap();
        assert_eq!(events(&entries).len(), 2, "queued: available and assigned");
    }

    fn posted(at: &str, set: u64, message: serde_json::Value) -> PostedMessage {
        PostedMessage {
            at: at.to_owned(),
            scale_set_id: set,
            message,
        }
    }

    #[test]
    fn the_fakes_history_becomes_the_entries_a_listener_would_record() {
        use JobEvent::*;
        let message = |kind: &str, id: i64, extra: serde_json::Value| {
            let mut m = serde_json::json!({
                "messageType": kind,
                "runnerRequestId": id,
                "requestLabels": ["linux"],
                "queueTime": "2026-12-04T10:00:00Z",
            });
            m.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            m
        };
        let none = serde_json::json!({});
        let history = FakeHistory {
            dropped: 3,
            messages: vec![
                posted(
                    "2026-12-04T10:00:00Z",
                    1,
                    message("JobAvailable", 5, none.clone()),
                ),
                posted(
                    "2026-12-04T10:00:01Z",
                    2,
                    message("JobAvailable", 6, none.clone()),
                ),
                // Announced again to a new session.
                posted(
                    "2026-12-04T10:00:02Z",
                    1,
                    message("JobAvailable", 5, none.clone()),
                ),
                posted(
                    "2026-12-04T10:00:03Z",
                    1,
                    message(
                        "JobAssigned",
                        5,
                        serde_json::json!({"scaleSetAssignTime": "2026-12-04T10:00:03Z"}),
                    ),
                ),
                posted(
                    "2026-12-04T10:00:09Z",
                    1,
                    message(
                        "JobCompleted",
                        5,
                        serde_json::json!({"result": "canceled", "finishTime": "2026-12-04T10:00:09Z"}),
                    ),
                ),
                // Offered again after the cancellation: new traffic.
                posted("2026-12-04T10:00:09Z", 1, message("JobAvailable", 5, none)),
            ],
        };
        let entries = history_entries(&history, Some(1)).unwrap();
        assert_eq!(
            events(&entries),
            [
                (5, Available, "2026-12-04T10:00:00Z".to_owned()),
                (5, Assigned, "2026-12-04T10:00:03Z".to_owned()),
                (5, Completed, "2026-12-04T10:00:09Z".to_owned()),
                (5, Available, "2026-12-04T10:00:09Z".to_owned()),
            ]
        );
        let completed = job(&entries, 5, Completed);
        assert_eq!(completed.result.as_deref(), Some("canceled"));
        assert_eq!(completed.labels, ["linux"]);
        assert_eq!(history_entries(&history, None).unwrap().len(), 5);

        let written = render(&trace("ci", "linux", history.dropped, entries.clone())).unwrap();
        let back = read(&written).unwrap();
        assert_eq!(back.entries, entries);
        assert_eq!(back.header.dropped, 3);
    }

    #[test]
    fn a_history_message_that_is_not_a_job_message_is_refused_naming_it() {
        let history = FakeHistory {
            dropped: 0,
            messages: vec![
                posted(
                    "2026-12-04T10:00:00Z",
                    1,
                    serde_json::json!({"messageType": "JobAvailable", "runnerRequestId": 1}),
                ),
                posted(
                    "later",
                    1,
                    serde_json::json!({"messageType": "JobAvailable"}),
                ),
            ],
        };
        let text = history_entries(&history, None).unwrap_err().to_string();
        assert!(text.starts_with("message 1 of the job history"), "{text}");
        assert!(text.contains("\"later\""), "{text}");
    }
}
