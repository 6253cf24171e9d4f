//! What a held failure looks like in Slack: a Block Kit message with the
//! job, how to get into the runner, when the hold ends, and the Extend and
//! Release buttons. Pure: the tests read the JSON.

use std::time::Duration;

use serde_json::{Value, json};

use crate::debug::hold::format_hold_until;

/// The `action_id` of the Extend button.
pub const EXTEND: &str = "arcwright_extend_hold";
/// The `action_id` of the Release button.
pub const RELEASE: &str = "arcwright_release_hold";

/// A runner held after its job failed, as Slack is told of it; the
/// runner's plan builds it, so it lives beside the runner's types.
pub use crate::api::ephemeral_runner::hold::HeldFailure;

/// The value the buttons carry: which runner. The interaction endpoint
/// trusts it only because the request is signed by Slack, and Slack only
/// sends back what arcwright posted.
pub fn button_value(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// The runner a button value names.
pub fn parse_button_value(value: &str) -> Option<(&str, &str)> {
    let (namespace, name) = value.split_once('/')?;
    (!namespace.is_empty() && !name.is_empty() && !name.contains('/')).then_some((namespace, name))
}

/// Slack's mrkdwn gives `&`, `<` and `>` meaning; a job name is the user's.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn human(duration: Duration) -> String {
    let minutes = duration.as_secs() / 60;
    match (minutes / 60, minutes % 60) {
        (0, m) => format!("{m}m"),
        (h, 0) => format!("{h}h"),
        (h, m) => format!("{h}h{m}m"),
    }
}

/// The exec line someone copies to get into the held pod.
pub fn exec_command(namespace: &str, runner: &str) -> String {
    format!("kubectl exec -it -n {namespace} {runner} -- sh")
}

/// The fallback text (notifications, screen readers) and the blocks.
pub fn held_failure(failure: &HeldFailure, extend_by: Duration) -> (String, Value) {
    let unknown = || "(not recorded)".to_string();
    let repository = failure.repository.clone().unwrap_or_else(unknown);
    let text = format!(
        "A job of {} failed; runner {} is held for debugging until {}",
        repository,
        failure.runner,
        format_hold_until(failure.hold_until)
    );
    let value = button_value(&failure.namespace, &failure.runner);
    let blocks = json!([
        {
            "type": "section",
            "text": {"type": "mrkdwn", "text": format!(
                ":red_circle: *A job failed; its runner is held for debugging* ({})",
                escape(&failure.why)
            )},
        },
        {
            "type": "section",
            "fields": [
                {"type": "mrkdwn", "text": format!("*Repository*\n{}", escape(&repository))},
                {"type": "mrkdwn", "text": format!("*Workflow*\n{}", escape(&failure.workflow.clone().unwrap_or_else(unknown)))},
                {"type": "mrkdwn", "text": format!("*Job*\n{}", escape(&failure.job.clone().unwrap_or_else(unknown)))},
                {"type": "mrkdwn", "text": format!("*Runner*\n{}/{}", escape(&failure.namespace), escape(&failure.runner))},
            ],
        },
        {
            "type": "section",
            "text": {"type": "mrkdwn", "text": format!(
                "Held until *{}*. Get in with:\n```{}```",
                format_hold_until(failure.hold_until),
                exec_command(&failure.namespace, &failure.runner)
            )},
        },
        {
            "type": "actions",
            "elements": [
                {
                    "type": "button",
                    "action_id": EXTEND,
                    "text": {"type": "plain_text", "text": format!("Extend {}", human(extend_by))},
                    "value": value,
                },
                {
                    "type": "button",
                    "action_id": RELEASE,
                    "style": "danger",
                    "text": {"type": "plain_text", "text": "Release"},
                    "value": value,
                },
            ],
        },
    ]);
    (text, blocks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_says_what_failed_how_to_get_in_and_offers_the_buttons() {
        let failure = HeldFailure {
            namespace: "ci".into(),
            runner: "linux-abc".into(),
            repository: Some("octo/app".into()),
            workflow: Some("octo/app/.github/workflows/ci.yaml@refs/heads/main".into()),
            job: Some("test <unit>".into()),
            why: "the job failed".into(),
            hold_until: "2026-12-01T10:00:00Z".parse().unwrap(),
        };
        let (text, blocks) = held_failure(&failure, Duration::from_secs(5400));
        assert!(
            text.contains("octo/app") && text.contains("2026-12-01T10:00:00Z"),
            "{text}"
        );
        let all = blocks.to_string();
        for needle in [
            "octo/app",
            "ci.yaml@refs/heads/main",
            "test &lt;unit&gt;",
            "ci/linux-abc",
            "kubectl exec -it -n ci linux-abc -- sh",
            "2026-12-01T10:00:00Z",
            "Extend 1h30m",
        ] {
            assert!(all.contains(needle), "{needle} in {all}");
        }
        let buttons = blocks[3]["elements"].as_array().unwrap();
        assert_eq!(buttons[0]["action_id"], EXTEND);
        assert_eq!(buttons[1]["action_id"], RELEASE);
        assert_eq!(
            parse_button_value(buttons[0]["value"].as_str().unwrap()),
            Some(("ci", "linux-abc"))
        );
        assert_eq!(parse_button_value("ci/"), None);
        assert_eq!(parse_button_value("a/b/c"), None);
        assert_eq!(human(Duration::from_secs(1800)), "30m");
        assert_eq!(human(Duration::from_secs(7200)), "2h");
    }
}
