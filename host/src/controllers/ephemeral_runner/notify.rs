//! Telling Slack that a runner is held: at least once per hold.
//!
//! The plan asks for the post ([`Step::NotifySlack`](super::plan::Step))
//! when the hold begins and on every later pass of the held runner until
//! its `SlackNotified` condition is True. The post is made off the reconcile
//! path (Slack may be slow or down, and a reconcile must not wait on it),
//! retried with a growing wait while the runner stays held, and recorded in
//! the condition once Slack accepted it. So a host that stops between the
//! hold and the post posts after its restart, and a Slack outage delays the
//! post instead of losing it. One post per runner is under way at a time:
//! the passes that ask while one is (the condition is not written yet) are
//! no-ops.
//!
//! The price of at-least-once: a host that stops after Slack accepted a
//! post and before the condition is written posts it again. Twice is
//! better than never: the post is what gets someone to look at the runner
//! before its hold ends.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use jiff::Timestamp;
use kube::api::Patch;
use kube::{Api, Resource, ResourceExt};

use super::Context;
use super::apply::patch_params;
use super::plan::{Precondition, StatusChange, StatusFields};
use crate::api::ephemeral_runner::{EventReason, SlackMessage, SlackNotifiedReason};
use crate::api::{EphemeralRunner, EphemeralRunnerPhase};
use crate::controllers::kit::{Notice, conditions};
use crate::slack::HeldFailure;
use crate::slack::client::read_token;
use crate::slack::message;

/// The wait after the first failed post; doubled after each further one.
const FIRST_RETRY: Duration = Duration::from_secs(1);

/// The longest wait between two attempts.
const LAST_RETRY: Duration = Duration::from_secs(60);

/// The runners (by uid) whose post is under way in this process.
#[derive(Clone, Debug, Default)]
pub(super) struct Outbox {
    under_way: Arc<Mutex<HashSet<String>>>,
}

impl Outbox {
    /// Takes the runner's post, unless it is under way already.
    fn take(&self, uid: &str) -> bool {
        self.lock().insert(uid.to_owned())
    }

    fn done(&self, uid: &str) {
        self.lock().remove(uid);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.under_way
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// Posts `failure` to the runner's Slack channel until Slack accepts it or
/// the runner is no longer held, then records it; see the module docs.
pub(super) fn notify(runner: &EphemeralRunner, failure: HeldFailure, ctx: &Context) {
    let (Some(slack), Some(spec), Some(uid)) = (
        ctx.slack.clone(),
        runner.spec.debug.as_ref().and_then(|d| d.slack.clone()),
        runner.uid(),
    ) else {
        return;
    };
    if !ctx.outbox.take(&uid) {
        return;
    }
    let outbox = ctx.outbox.clone();
    let client = ctx.deps.client.clone();
    let publisher = ctx.publisher.clone();
    let reference = runner.object_ref(&());
    let extend_by = ctx.config.slack.extend_by;
    let runners: Api<EphemeralRunner> =
        Api::namespaced(client.clone(), &runner.namespace().unwrap_or_default());
    let name = runner.name_any();
    tokio::spawn(async move {
        let mut wait = FIRST_RETRY;
        for attempt in 0u32.. {
            let posted = async {
                let token = read_token(&client, &failure.namespace, &spec.token_secret_ref).await?;
                let (text, blocks) = message::held_failure(&failure, extend_by);
                slack
                    .post_message(&token, &spec.channel, &text, blocks)
                    .await
            }
            .await;
            match posted {
                Ok(posted) => {
                    tracing::info!(runner = %name, channel = %spec.channel, "told Slack of a held failure");
                    let told = format!("posted to {}", spec.channel);
                    let posted = Some(posted);
                    record(
                        &runners,
                        &name,
                        &uid,
                        SlackNotifiedReason::Posted,
                        &told,
                        posted,
                    )
                    .await;
                    break;
                }
                Err(error) => {
                    tracing::warn!(runner = %name, channel = %spec.channel, %error, attempt, "telling Slack of a held failure failed");
                    let why = format!(
                        "telling Slack channel {} failed: {error}; trying again",
                        spec.channel
                    );
                    if attempt == 0 {
                        let reason = EventReason::SlackNotificationFailed.as_str();
                        publisher
                            .publish(&reference, Notice::warning(reason, why.clone()))
                            .await;
                    }
                    let failed = SlackNotifiedReason::PostFailed;
                    if !record(&runners, &name, &uid, failed, &why, None).await {
                        break;
                    }
                }
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(LAST_RETRY);
        }
        outbox.done(&uid);
    });
}

/// Writes the `SlackNotified` condition on the runner (with the message
/// `posted`, which its buttons are bound to), if it is still the one the
/// post is about and still held; returns whether it is (whether a post is
/// still wanted). A conflicting write is retried on a fresh read.
async fn record(
    runners: &Api<EphemeralRunner>,
    name: &str,
    uid: &str,
    reason: SlackNotifiedReason,
    message: &str,
    posted: Option<SlackMessage>,
) -> bool {
    for _ in 0..5 {
        let runner = match runners.get_opt(name).await {
            Ok(Some(runner)) => runner,
            Ok(None) => return false,
            Err(error) => {
                tracing::warn!(runner = %name, %error, "reading the runner to record the Slack post failed");
                tokio::time::sleep(FIRST_RETRY).await;
                continue;
            }
        };
        let status = runner.status.clone().unwrap_or_default();
        if runner.uid().as_deref() != Some(uid)
            || status.phase != Some(EphemeralRunnerPhase::Debugging)
        {
            return false;
        }
        let mut conditions = status.conditions.clone();
        let setting = super::plan::setting(reason, message);
        let changed = conditions::set(&mut conditions, setting, Timestamp::now());
        if !changed && (posted.is_none() || status.slack_message == posted) {
            return true;
        }
        // The resourceVersion makes the patch fail rather than overwrite
        // conditions written since the read.
        let change = StatusChange {
            metadata: Some(Precondition {
                resource_version: runner.resource_version(),
            }),
            status: StatusFields {
                conditions: Some(conditions),
                slack_message: posted.clone(),
                ..StatusFields::default()
            },
        };
        match runners
            .patch_status(name, &patch_params(), &Patch::Merge(&change))
            .await
        {
            Ok(_) => return true,
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(kube::Error::Api(e)) if e.code == 404 => return false,
            Err(error) => {
                tracing::warn!(runner = %name, %error, "recording the Slack post failed");
                tokio::time::sleep(FIRST_RETRY).await;
            }
        }
    }
    true
}
