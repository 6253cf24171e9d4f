//! Kubernetes events, as every part of the host writes them: one
//! [`Publisher`] for the reconcilers, the listeners and the tasks that
//! outlive a reconcile (the Slack posts).
//!
//! Events are best effort: one that cannot be written is logged, never a
//! reason to fail what reported it, since the state it tells of is in the
//! objects' status already.
//!
//! The API server refuses an event whose note is over 1 KiB, and a refused
//! event is a warning nobody reads: a policy's violations or an Actions
//! error can be longer than that, so every note goes through [`note`].

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// Whether an event is a warning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    /// Something a user may want to know.
    Normal,
    /// Something went wrong.
    Warning,
}

/// One event: what a person reading `kubectl describe` sees.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    /// Normal or warning.
    pub severity: Severity,
    /// A PascalCase reason.
    pub reason: String,
    /// What happened, for people; never a secret.
    pub note: String,
    /// What the reporter was doing (`Reconcile`, `Scale`, `Listen`...).
    pub action: &'static str,
}

impl Notice {
    /// A Normal event of a reconcile.
    pub fn normal(reason: impl Into<String>, note: impl Into<String>) -> Self {
        Self::new(Severity::Normal, reason, note)
    }

    /// A Warning event of a reconcile.
    pub fn warning(reason: impl Into<String>, note: impl Into<String>) -> Self {
        Self::new(Severity::Warning, reason, note)
    }

    /// An event of a reconcile.
    pub fn new(severity: Severity, reason: impl Into<String>, note: impl Into<String>) -> Self {
        Self {
            severity,
            reason: reason.into(),
            note: note.into(),
            action: "Reconcile",
        }
    }

    /// The same event, reported as done while `action`.
    pub fn during(self, action: &'static str) -> Self {
        Self { action, ..self }
    }
}

/// Publishes events as one reporter (`arcwright-<component>`).
#[derive(Clone)]
pub struct Publisher {
    recorder: Recorder,
}

impl Publisher {
    /// A publisher reporting as `arcwright-{component}`.
    pub fn new(client: kube::Client, component: &str) -> Self {
        Self {
            recorder: Recorder::new(
                client,
                Reporter {
                    controller: format!("arcwright-{component}"),
                    instance: None,
                },
            ),
        }
    }

    /// Publishes `notice` on the object `on`; a failure is logged.
    pub async fn publish(&self, on: &ObjectReference, notice: Notice) {
        let event = Event {
            type_: match notice.severity {
                Severity::Normal => EventType::Normal,
                Severity::Warning => EventType::Warning,
            },
            reason: notice.reason,
            note: Some(note(notice.note)),
            action: notice.action.to_owned(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, on).await {
            let object = on.name.as_deref().unwrap_or_default();
            let kind = on.kind.as_deref().unwrap_or_default();
            tracing::warn!(kind, object, reason = %event.reason, %error, "publishing an event failed");
        }
    }
}

/// The longest note the API server accepts, in bytes.
pub const MAX_NOTE: usize = 1024;

/// `text` cut to what an event note may hold, on a character boundary,
/// with `...` marking the cut.
pub fn note(text: impl Into<String>) -> String {
    let mut text = text.into();
    if text.len() <= MAX_NOTE {
        return text;
    }
    let mut end = MAX_NOTE - 3;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push_str("...");
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_notes_are_kept_and_long_ones_cut_on_a_character() {
        assert_eq!(note("fine"), "fine");
        let exact = "a".repeat(MAX_NOTE);
        assert_eq!(note(exact.clone()), exact);
        let long = format!("{}é{}", "a".repeat(MAX_NOTE - 4), "b".repeat(50));
        let cut = note(long);
        assert!(cut.len() <= MAX_NOTE, "{}", cut.len());
        assert!(cut.ends_with("..."));
        assert!(cut.starts_with(&"a".repeat(MAX_NOTE - 4)));
    }
}
