//! A scale set's recording: the scaling decisions its listener made (each
//! with its whole input, the state handed in, the answer and the policy
//! that gave it) and the job events it saw, kept so that a candidate policy
//! can be replayed or simulated on the traffic it would really have met.
//!
//! The recording is bounded twice: per scale set, by entries and bytes, and
//! across the host, by a byte budget all scale sets share. The oldest
//! entries of the scale set that records go first; an entry that would not
//! fit even in an empty recording is dropped and counted, never truncated,
//! because half an input cannot be replayed. What was dropped is said in
//! the trace's header, so a replay knows where its history has holes.
//!
//! Each entry is kept encoded, as the line it is served as: the bytes
//! counted are the bytes that leave, and serving a recording copies lines
//! instead of encoding under a lock.
//!
//! A trace is JSON lines: a [`Header`] first, then [`Entry`]s oldest first.
//! The header names the format ([`FORMAT`]); a reader refuses any other, so
//! a trace from a future version fails with that said rather than with a
//! field it cannot read.

pub mod api;
pub mod cli;
pub mod import;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::actions::JobMessage;
use crate::policy::Decided;
use crate::policy::types::{ScalingDecision, ScalingInput};

/// The format's name and version, the header's `format`.
pub const FORMAT: &str = "arcwright.dev/recording/v1";

/// The first line of a trace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Header {
    /// [`FORMAT`].
    pub format: String,
    /// The scale set's namespace.
    pub namespace: String,
    /// The AutoscalingRunnerSet's name.
    pub name: String,
    /// Entries dropped before the oldest one here (the bounds).
    #[serde(default)]
    pub dropped: u64,
}

/// One line after the header.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Entry {
    /// A scaling decision.
    Decision(Decision),
    /// A job event the listener saw.
    Job(Job),
}

/// A scaling decision as the listener made it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Decision {
    /// The input as handed to the policy, `now` included, with `state` the
    /// state the policy was handed (its own kept state when the input had
    /// none), so a replay can thread state as production did.
    pub input: ScalingInput,
    /// The desired runners answered (after clamping).
    pub desired: u32,
    /// The policy's reason.
    pub reason: String,
    /// The state it returned, as text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_out: Option<String>,
    /// The label of the policy that answered.
    pub policy: String,
    /// The SHA-256 of the module that answered, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Why the configured policy did not answer, when the fallback did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback_reason: Option<String>,
}

impl Decision {
    /// The entry for a decision made on `input` (as it was before the
    /// decider handed the policy its kept state).
    pub fn of(mut input: ScalingInput, decided: &Decided<ScalingDecision>) -> Decision {
        input.state = decided
            .state_in
            .as_ref()
            .map(|state| String::from_utf8_lossy(state).into_owned());
        Decision {
            input,
            desired: decided.decision.desired,
            reason: decided.decision.reason.clone(),
            state_out: decided
                .decision
                .state
                .as_ref()
                .map(|state| String::from_utf8_lossy(state).into_owned()),
            policy: decided.policy.clone(),
            sha256: Some(decided.sha256.clone()),
            fallback_reason: decided.fallback_reason.clone(),
        }
    }
}

/// What happened to a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum JobEvent {
    /// Offered to the scale set.
    Available,
    /// Assigned to it.
    Assigned,
    /// A runner started it.
    Started,
    /// It finished (or was cancelled before it started).
    Completed,
}

/// A job event with the service's times, as a simulation needs them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Job {
    /// When the listener saw it, RFC 3339.
    pub at: String,
    /// What happened.
    pub event: JobEvent,
    /// The job's request id, the same across its events.
    pub runner_request_id: i64,
    /// The labels it asked for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<String>,
    /// When it was queued (RFC 3339, as the service sent it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_time: Option<String>,
    /// When the service assigned it to the scale set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_set_assign_time: Option<String>,
    /// When a runner took it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_assign_time: Option<String>,
    /// When it finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_time: Option<String>,
    /// The result, on completion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
}

impl Job {
    /// The entry for a job message seen at `at`; `None` for a message type
    /// this host does not know.
    pub fn from_message(message: &JobMessage, at: jiff::Timestamp) -> Option<Job> {
        let (event, result) = match message {
            JobMessage::JobAvailable { .. } => (JobEvent::Available, None),
            JobMessage::JobAssigned { .. } => (JobEvent::Assigned, None),
            JobMessage::JobStarted { .. } => (JobEvent::Started, None),
            JobMessage::JobCompleted { result, .. } => (JobEvent::Completed, Some(result.clone())),
            JobMessage::Unknown => return None,
        };
        let info = message.job()?;
        let time = |t: Option<jiff::Timestamp>| t.map(|t| t.to_string());
        Some(Job {
            at: at.to_string(),
            event,
            runner_request_id: info.runner_request_id,
            labels: info.request_labels.clone(),
            queue_time: time(info.queue_time),
            scale_set_assign_time: time(info.scale_set_assign_time),
            runner_assign_time: time(info.runner_assign_time),
            finish_time: time(info.finish_time),
            result,
        })
    }
}

/// How much one scale set's recording may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Entries.
    pub entries: usize,
    /// Encoded bytes.
    pub bytes: usize,
}

/// The bytes every recording of the host holds together, and their cap.
/// Shared by all scale sets' recordings: one busy scale set cannot make the
/// host's memory grow past the cap, and a quiet one keeps its history until
/// its own entries are the oldest it holds.
#[derive(Debug)]
pub struct Budget {
    cap: usize,
    used: AtomicUsize,
}

impl Budget {
    /// A budget of `cap` bytes.
    pub fn new(cap: usize) -> Arc<Budget> {
        Arc::new(Budget {
            cap,
            used: AtomicUsize::new(0),
        })
    }

    /// The bytes held now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    fn reserve(&self, bytes: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|total| *total <= self.cap)
            })
            .is_ok()
    }

    fn release(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// One scale set's recording.
#[derive(Debug)]
pub struct Recording {
    header: Header,
    limits: Limits,
    budget: Arc<Budget>,
    lines: VecDeque<String>,
    bytes: usize,
}

impl Recording {
    /// An empty recording of the scale set `namespace/name`.
    pub fn new(namespace: &str, name: &str, limits: Limits, budget: Arc<Budget>) -> Recording {
        Recording {
            header: Header {
                format: FORMAT.to_owned(),
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                dropped: 0,
            },
            limits,
            budget,
            lines: VecDeque::new(),
            bytes: 0,
        }
    }

    /// Records `entry`, dropping the oldest entries until it fits this
    /// recording's limits and the host's budget; an entry that fits in
    /// neither even alone is dropped itself.
    pub fn push(&mut self, entry: &Entry) {
        let Ok(line) = serde_json::to_string(entry) else {
            self.header.dropped += 1;
            return;
        };
        let size = line.len() + 1;
        if size > self.limits.bytes || self.limits.entries == 0 {
            self.header.dropped += 1;
            return;
        }
        while self.lines.len() >= self.limits.entries || self.bytes + size > self.limits.bytes {
            self.drop_oldest();
        }
        while !self.budget.reserve(size) {
            if self.lines.is_empty() {
                // Other scale sets hold the budget: this one has nothing
                // of its own left to give up.
                self.header.dropped += 1;
                return;
            }
            self.drop_oldest();
        }
        self.bytes += size;
        self.lines.push_back(line);
    }

    fn drop_oldest(&mut self) {
        if let Some(line) = self.lines.pop_front() {
            let size = line.len() + 1;
            self.bytes -= size;
            self.budget.release(size);
            self.header.dropped += 1;
        }
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.lines.len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    /// Encoded bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The trace: the header, then every entry held, oldest first, one per
    /// line.
    pub fn trace(&self) -> String {
        let header = serde_json::to_string(&self.header).unwrap_or_default();
        let mut out = String::with_capacity(header.len() + 1 + self.bytes);
        out.push_str(&header);
        out.push('\n');
        for line in &self.lines {
            out.push_str(line);
            out.push('\n');
        }
        out
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        self.budget.release(self.bytes);
    }
}

/// The recordings of every scale set the host listens for, by namespace
/// and name, with the limits and the budget they share.
///
/// A scale set's recording outlives its listener: a listener restarted for
/// a changed spec, or after a failover within the process, goes on
/// recording where the last one stopped, so a trace spans a policy change
/// (which is when an admin wants one). It is forgotten with the scale set.
#[derive(Clone, Debug)]
pub struct Recordings {
    limits: Limits,
    budget: Arc<Budget>,
    held: Arc<Mutex<HashMap<(String, String), Shared>>>,
}

/// One scale set's recording, shared by its listener and the endpoint.
pub type Shared = Arc<Mutex<Recording>>;

/// The defaults of `--recording-entries`, `--recording-bytes` and
/// `--recording-total-bytes`: an entry is about 700 bytes (a decision with
/// its input) or 300 (a job event), so a scale set keeps some ten thousand
/// entries, a busy day of one scale set's decisions and job events, in at
/// most 4 MiB; the host keeps at most 64 MiB of recordings whatever the
/// number of scale sets.
pub const DEFAULT_LIMITS: Limits = Limits {
    entries: 10_000,
    bytes: 4 << 20,
};

/// See [`DEFAULT_LIMITS`].
pub const DEFAULT_TOTAL_BYTES: usize = 64 << 20;

impl Recordings {
    /// Recordings bounded by `limits` each and `total` bytes together;
    /// `limits.entries == 0` records nothing.
    pub fn new(limits: Limits, total: usize) -> Recordings {
        Recordings {
            limits,
            budget: Budget::new(total),
            held: Arc::default(),
        }
    }

    /// Recordings that record nothing.
    pub fn off() -> Recordings {
        Recordings::new(
            Limits {
                entries: 0,
                bytes: 0,
            },
            0,
        )
    }

    /// Whether anything is recorded.
    pub fn enabled(&self) -> bool {
        self.limits.entries > 0 && self.limits.bytes > 0
    }

    /// The recording of `namespace/name`, made if there is none yet;
    /// `None` when recording is off.
    pub fn open(&self, namespace: &str, name: &str) -> Option<Shared> {
        if !self.enabled() {
            return None;
        }
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let recording = held
            .entry((namespace.to_owned(), name.to_owned()))
            .or_insert_with(|| {
                Arc::new(Mutex::new(Recording::new(
                    namespace,
                    name,
                    self.limits,
                    self.budget.clone(),
                )))
            });
        Some(recording.clone())
    }

    /// The trace of `namespace/name`, if it has a recording.
    pub fn trace(&self, namespace: &str, name: &str) -> Option<String> {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let recording = held.get(&(namespace.to_owned(), name.to_owned()))?;
        let recording = recording.lock().unwrap_or_else(|e| e.into_inner());
        Some(recording.trace())
    }

    /// Forgets the recording of a scale set that is gone; its bytes go
    /// back to the budget once the listener holding it ends.
    pub fn forget(&self, namespace: &str, name: &str) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.remove(&(namespace.to_owned(), name.to_owned()));
    }

    /// The bytes every recording holds together.
    pub fn used(&self) -> usize {
        self.budget.used()
    }
}

/// A trace read back.
#[derive(Clone, Debug, PartialEq)]
pub struct Trace {
    /// Its header.
    pub header: Header,
    /// Its entries, oldest first.
    pub entries: Vec<Entry>,
}

/// A trace that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// Nothing in it.
    #[error("the trace is empty: its first line must be a header naming {FORMAT}")]
    Empty,
    /// Its header names another format.
    #[error("the trace is in the format {found:?}; this arcwright reads {FORMAT}")]
    Format {
        /// What it names.
        found: String,
    },
    /// A line is not what it should be.
    #[error("line {line} of the trace: {message}")]
    Line {
        /// Its number, from 1.
        line: usize,
        /// What is wrong with it.
        message: String,
    },
}

/// Reads a trace: its header, then its entries. Blank lines are skipped.
pub fn read(text: &str) -> Result<Trace, TraceError> {
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty());
    let (number, first) = lines.next().ok_or(TraceError::Empty)?;
    let header: serde_json::Value = serde_json::from_str(first).map_err(|e| TraceError::Line {
        line: number + 1,
        message: format!("not JSON: {e}"),
    })?;
    let format = header["format"].as_str().unwrap_or_default();
    if format != FORMAT {
        return Err(TraceError::Format {
            found: format.to_owned(),
        });
    }
    let header: Header = serde_json::from_value(header).map_err(|e| TraceError::Line {
        line: number + 1,
        message: format!("not a header: {e}"),
    })?;
    let entries = lines
        .map(|(number, line)| {
            serde_json::from_str(line).map_err(|e| TraceError::Line {
                line: number + 1,
                message: e.to_string(),
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(Trace { header, entries })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(desired: u32) -> Entry {
        Entry::Decision(Decision {
            input: ScalingInput {
                current_desired: desired.saturating_sub(1),
                now: Some("2026-12-04T10:00:00Z".to_owned()),
                state: Some("{\"since\":3}".to_owned()),
                ..ScalingInput::default()
            },
            desired,
            reason: format!("{desired} jobs waiting"),
            state_out: Some("{\"since\":4}".to_owned()),
            policy: "builtin:default".to_owned(),
            sha256: Some("ab".repeat(32)),
            fallback_reason: None,
        })
    }

    fn job(id: i64) -> Entry {
        Entry::Job(Job {
            at: "2026-12-04T10:00:01Z".to_owned(),
            event: JobEvent::Completed,
            runner_request_id: id,
            labels: vec!["linux".to_owned()],
            queue_time: Some("2026-12-04T09:59:00Z".to_owned()),
            scale_set_assign_time: None,
            runner_assign_time: Some("2026-12-04T09:59:30Z".to_owned()),
            finish_time: Some("2026-12-04T10:00:00Z".to_owned()),
            result: Some("succeeded".to_owned()),
        })
    }

    fn roomy() -> Limits {
        Limits {
            entries: 1000,
            bytes: 1 << 20,
        }
    }

    #[test]
    fn a_trace_reads_back_as_it_was_recorded() {
        let mut recording = Recording::new("ci", "linux", roomy(), Budget::new(1 << 20));
        let entries = [decision(3), job(7), decision(2)];
        for entry in &entries {
            recording.push(entry);
        }
        let trace = read(&recording.trace()).unwrap();
        assert_eq!(trace.header.format, FORMAT);
        assert_eq!(
            (trace.header.namespace.as_str(), trace.header.name.as_str()),
            ("ci", "linux")
        );
        assert_eq!(trace.header.dropped, 0);
        assert_eq!(trace.entries, entries);
    }

    #[test]
    fn the_oldest_go_first_past_either_limit_and_are_counted() {
        let line = serde_json::to_string(&decision(1)).unwrap().len() + 1;
        let budget = Budget::new(1 << 20);
        let mut by_count = Recording::new(
            "ci",
            "a",
            Limits {
                entries: 2,
                bytes: 1 << 20,
            },
            budget.clone(),
        );
        let mut by_bytes = Recording::new(
            "ci",
            "b",
            Limits {
                entries: 1000,
                bytes: line * 3,
            },
            budget.clone(),
        );
        for desired in 1..=5 {
            by_count.push(&decision(desired));
            by_bytes.push(&decision(desired));
        }
        let kept = |r: &Recording| -> Vec<u32> {
            read(&r.trace())
                .unwrap()
                .entries
                .into_iter()
                .map(|e| match e {
                    Entry::Decision(d) => d.desired,
                    Entry::Job(_) => 0,
                })
                .collect()
        };
        assert_eq!(kept(&by_count), [4, 5]);
        assert_eq!(kept(&by_bytes), [3, 4, 5]);
        assert_eq!(read(&by_count.trace()).unwrap().header.dropped, 3);
        assert_eq!(read(&by_bytes.trace()).unwrap().header.dropped, 2);
        assert_eq!(budget.used(), by_count.bytes() + by_bytes.bytes());
        drop(by_count);
        drop(by_bytes);
        assert_eq!(
            budget.used(),
            0,
            "a recording gives its bytes back when dropped"
        );
    }

    #[test]
    fn the_host_budget_bounds_every_recording_together() {
        let line = serde_json::to_string(&decision(1)).unwrap().len() + 1;
        let budget = Budget::new(line * 4);
        let mut busy = Recording::new("ci", "busy", roomy(), budget.clone());
        let mut quiet = Recording::new("ci", "quiet", roomy(), budget.clone());
        quiet.push(&decision(1));
        // Entries of one size, so the count of those kept is exact.
        for _ in 1..=10 {
            busy.push(&decision(1));
        }
        // The busy set gave up its own oldest; the quiet one kept its entry.
        assert_eq!((busy.len(), quiet.len()), (3, 1));
        assert!(budget.used() <= line * 4);
        // With the budget full of another set's entries, a set with none of
        // its own to give up drops what it is handed.
        let mut late = Recording::new("ci", "late", roomy(), budget.clone());
        late.push(&decision(1));
        assert!(late.is_empty());
        assert_eq!(read(&late.trace()).unwrap().header.dropped, 1);
    }

    #[test]
    fn an_entry_larger_than_the_recording_is_dropped_whole() {
        let mut recording = Recording::new(
            "ci",
            "linux",
            Limits {
                entries: 10,
                bytes: 16,
            },
            Budget::new(1 << 20),
        );
        recording.push(&decision(1));
        assert!(recording.is_empty());
        assert_eq!(read(&recording.trace()).unwrap().header.dropped, 1);
    }

    #[test]
    fn a_trace_of_another_format_or_with_a_bad_line_is_refused_saying_where() {
        let error = read("").unwrap_err();
        assert!(matches!(error, TraceError::Empty), "{error}");
        let error = read(
            "{\"format\":\"arcwright.dev/recording/v9\",\"namespace\":\"ci\",\"name\":\"x\"}\n",
        )
        .unwrap_err();
        assert!(error.to_string().contains("recording/v9"), "{error}");
        let mut recording = Recording::new("ci", "linux", roomy(), Budget::new(1 << 20));
        recording.push(&job(1));
        let text = format!(
            "{}{{\"kind\":\"decision\",\"desired\":\"three\"}}\n",
            recording.trace()
        );
        let error = read(&text).unwrap_err();
        assert!(
            error.to_string().starts_with("line 3 of the trace"),
            "{error}"
        );
    }

    #[test]
    fn job_messages_become_entries_with_the_services_times() {
        let message: JobMessage = serde_json::from_value(serde_json::json!({
            "messageType": "JobCompleted",
            "runnerRequestId": 42,
            "result": "failed",
            "requestLabels": ["linux"],
            "queueTime": "2026-12-04T09:59:00Z",
            "runnerAssignTime": "2026-12-04T09:59:30Z",
            "finishTime": "2026-12-04T10:00:00Z",
        }))
        .unwrap();
        let at: jiff::Timestamp = "2026-12-04T10:00:01Z".parse().unwrap();
        let entry = Job::from_message(&message, at).unwrap();
        assert_eq!(entry.event, JobEvent::Completed);
        assert_eq!(entry.runner_request_id, 42);
        assert_eq!(entry.result.as_deref(), Some("failed"));
        assert_eq!(entry.queue_time.as_deref(), Some("2026-12-04T09:59:00Z"));
        assert_eq!(entry.labels, ["linux"]);
        assert!(Job::from_message(&JobMessage::Unknown, at).is_none());
    }
}
