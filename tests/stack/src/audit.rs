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
        // No rotation: a run's log is read whole afterwards.
        "--audit-log-maxbackup=0".to_owned(),
    ]
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
}
