//! Counting the host's own API server requests from the API server's audit
//! log.
//!
//! The API server's `apiserver_request_total` counts requests by verb and
//! resource, not by client, and kube-rs sends no `User-Agent`, so neither
//! tells the host's requests from the simulator's and the stack's. The audit
//! log does: every request is one event carrying the authenticated user,
//! and the host runs as a ServiceAccount of its own (see
//! [`crate::identity`]), as it does in a cluster. The policy logs every
//! request at level `Metadata` (no bodies: cheap) and omits the
//! `RequestReceived` stage, so a request is one `ResponseComplete` event, a
//! watch one `ResponseStarted` plus one `ResponseComplete` when it ends;
//! counting distinct `auditID`s counts each request once either way.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use serde::Deserialize;

/// The audit policy: every request, metadata only.
pub const POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [\"RequestReceived\"]
rules:
- level: Metadata
";

/// The API server flags that write the audit log to `log` with the policy
/// at `policy` (which [`write_policy`] creates).
pub fn apiserver_args(policy: &Path, log: &Path) -> Vec<String> {
    vec![
        format!("--audit-policy-file={}", policy.display()),
        format!("--audit-log-path={}", log.display()),
        "--audit-log-format=json".to_owned(),
        // The log rotates at 100 MiB unless told otherwise (0 means the
        // default, not "never"), which a thousand-set run passes: 100 GiB
        // here, and [`read`] reads every file kept should it rotate still.
        format!("--audit-log-maxsize={MAX_SIZE_MIB}"),
        "--audit-log-maxbackup=0".to_owned(),
    ]
}

/// How large the audit log grows before it rotates, in MiB.
const MAX_SIZE_MIB: u64 = 100 * 1024;

/// The audit log at `path` with every file rotated out of it beside it
/// (named `<stem>-<time>.<extension>`), oldest first, and how many of
/// those there were: a count a report prints, since a run whose log
/// rotated is one whose figures were read from several files.
pub fn read(path: &Path) -> std::io::Result<(String, usize)> {
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or_default();
    let extension = path
        .extension()
        .and_then(|s| s.to_str())
        .unwrap_or_default();
    let prefix = format!("{stem}-");
    let mut rotated: Vec<_> = std::fs::read_dir(path.parent().unwrap_or(Path::new(".")))?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(extension))
        })
        .collect();
    // The time in a rotated file's name sorts as text.
    rotated.sort();
    let mut log = String::new();
    for file in rotated.iter().chain(std::iter::once(&path.to_path_buf())) {
        log.push_str(&std::fs::read_to_string(file)?);
        if !log.ends_with('\n') {
            log.push('\n');
        }
    }
    Ok((log, rotated.len()))
}

/// Writes [`POLICY`] to `path`.
pub fn write_policy(path: &Path) -> std::io::Result<()> {
    std::fs::write(path, POLICY)
}

/// Requests of one user in a time window.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Requests {
    /// Every request (reads, watches and writes).
    pub total: u64,
    /// Those that change something: create, update, patch, delete,
    /// deletecollection.
    pub writes: u64,
    /// The same requests by `verb resource[/subresource]`, for telling what
    /// a figure is made of.
    pub by_kind: BTreeMap<String, u64>,
    /// The same requests by the HTTP status they were answered with (409
    /// for a conflict, 429 for a request priority and fairness turned
    /// away); requests without a recorded status are left out.
    pub by_status: BTreeMap<u16, u64>,
    /// How many files the log had rotated into when it was read (0 when
    /// it never rotated).
    pub rotated_files: usize,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Event {
    #[serde(rename = "auditID")]
    audit_id: String,
    verb: String,
    user: User,
    request_received_timestamp: jiff::Timestamp,
    #[serde(default)]
    object_ref: Option<ObjectRef>,
    #[serde(default)]
    response_status: Option<ResponseStatus>,
}

#[derive(Deserialize)]
struct ResponseStatus {
    #[serde(default)]
    code: u16,
}

#[derive(Deserialize)]
struct ObjectRef {
    #[serde(default)]
    resource: String,
    #[serde(default)]
    subresource: String,
}

#[derive(Deserialize)]
struct User {
    #[serde(default)]
    username: String,
}

/// Counts the requests of `username` received in `[from, to]`, from the
/// lines of an audit log. Lines that are not events are skipped: the log
/// may end in a half-written line while the server runs.
pub fn count(log: &str, username: &str, from: jiff::Timestamp, to: jiff::Timestamp) -> Requests {
    let mut seen = HashSet::new();
    let mut requests = Requests::default();
    for line in log.lines() {
        let Ok(event) = serde_json::from_str::<Event>(line) else {
            continue;
        };
        if event.user.username != username
            || event.request_received_timestamp < from
            || event.request_received_timestamp > to
            || !seen.insert(event.audit_id)
        {
            continue;
        }
        requests.total += 1;
        let kind = match &event.object_ref {
            Some(r) if r.subresource.is_empty() => format!("{} {}", event.verb, r.resource),
            Some(r) => format!("{} {}/{}", event.verb, r.resource, r.subresource),
            None => event.verb.clone(),
        };
        *requests.by_kind.entry(kind).or_default() += 1;
        if let Some(status) = event.response_status.filter(|s| s.code != 0) {
            *requests.by_status.entry(status.code).or_default() += 1;
        }
        if matches!(
            event.verb.as_str(),
            "create" | "update" | "patch" | "delete" | "deletecollection"
        ) {
            requests.writes += 1;
        }
    }
    requests
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(id: &str, user: &str, verb: &str, at: &str, stage: &str) -> String {
        serde_json::json!({
            "kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Metadata",
            "auditID": id, "stage": stage, "verb": verb,
            "user": {"username": user, "groups": ["system:authenticated"]},
            "requestReceivedTimestamp": at, "stageTimestamp": at,
        })
        .to_string()
    }

    #[test]
    fn only_the_users_requests_in_the_window_count_once_each() {
        let host = "system:serviceaccount:ns:arcwright";
        let log = [
            event(
                "a",
                host,
                "get",
                "2026-01-01T10:00:01.000000Z",
                "ResponseComplete",
            ),
            // A watch: two stages, one request.
            event(
                "b",
                host,
                "watch",
                "2026-01-01T10:00:02.000000Z",
                "ResponseStarted",
            ),
            event(
                "b",
                host,
                "watch",
                "2026-01-01T10:00:02.000000Z",
                "ResponseComplete",
            ),
            event(
                "c",
                host,
                "patch",
                "2026-01-01T10:00:03.000000Z",
                "ResponseComplete",
            ),
            event(
                "d",
                host,
                "create",
                "2026-01-01T10:00:04.000000Z",
                "ResponseComplete",
            ),
            // Someone else.
            event(
                "e",
                "admin",
                "create",
                "2026-01-01T10:00:04.000000Z",
                "ResponseComplete",
            ),
            // Before the window.
            event(
                "f",
                host,
                "delete",
                "2026-01-01T09:59:59.000000Z",
                "ResponseComplete",
            ),
            serde_json::json!({
                "auditID": "h", "verb": "patch", "stage": "ResponseComplete",
                "user": {"username": host},
                "objectRef": {"resource": "ephemeralrunners", "subresource": "status"},
                "responseStatus": {"code": 409},
                "requestReceivedTimestamp": "2026-01-01T10:00:05.000000Z",
            })
            .to_string(),
            "{\"kind\":\"Event\",\"auditID\":\"g\",\"ver".to_owned(),
        ]
        .join("\n");
        let from: jiff::Timestamp = "2026-01-01T10:00:00Z".parse().unwrap();
        let to: jiff::Timestamp = "2026-01-01T10:01:00Z".parse().unwrap();
        let counted = count(&log, host, from, to);
        assert_eq!((counted.total, counted.writes), (5, 3));
        assert_eq!(counted.by_status, BTreeMap::from([(409, 1)]));
        assert_eq!(
            counted.by_kind.into_iter().collect::<Vec<_>>(),
            [
                ("create".to_owned(), 1),
                ("get".to_owned(), 1),
                ("patch".to_owned(), 1),
                ("patch ephemeralrunners/status".to_owned(), 1),
                ("watch".to_owned(), 1)
            ]
        );
        assert_eq!(count(&log, "nobody", from, to), Requests::default());
    }

    #[test]
    fn a_rotated_log_is_read_from_every_file_oldest_first_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("audit.log");
        let at = "2026-01-01T00:00:01Z";
        std::fs::write(&log, event("c", "host", "get", at, "ResponseComplete")).unwrap();
        std::fs::write(
            dir.path().join("audit-2026-01-01T00-00-00.500.log"),
            event("b", "host", "get", at, "ResponseComplete"),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("audit-2026-01-01T00-00-00.100.log"),
            event("a", "host", "create", at, "ResponseComplete") + "\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("other.log"), "not ours").unwrap();
        let (text, rotated) = read(&log).unwrap();
        assert_eq!(rotated, 2);
        let ids: Vec<_> = text
            .lines()
            .map(|l| serde_json::from_str::<Event>(l).unwrap().audit_id)
            .collect();
        assert_eq!(ids, ["a", "b", "c"]);
        let (from, to) = (
            "2026-01-01T00:00:00Z".parse().unwrap(),
            "2026-01-02T00:00:00Z".parse().unwrap(),
        );
        let requests = count(&text, "host", from, to);
        assert_eq!((requests.total, requests.writes), (3, 1));
    }
}
