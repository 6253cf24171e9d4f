//! The endpoint Slack posts button presses to (the app's Interactivity
//! Request URL): `POST /slack/interactions`.
//!
//! The signature is checked on the raw body before anything is parsed; a
//! request that is unsigned, wrongly signed or older than five minutes gets
//! 401 and changes nothing. A signed press of Extend or Release writes the
//! runner's `arcwright.dev/hold-until` annotation through
//! [`change_hold`](crate::debug::change_hold), and the reconciler does the
//! rest. Who pressed is logged with their Slack user id: Slack, not
//! Kubernetes RBAC, decides who may press, so the channel the scale set
//! posts to should be one whose members may hold its runners.
//!
//! A signature proves only that Slack sent the press, not that the button
//! came from this host, so a press acts only on a runner whose scale set
//! tells Slack at all, and only from the message posted about its hold (the
//! channel and timestamp recorded in `status.slackMessage`): a button
//! crafted in another message, naming a runner in a namespace that never
//! posted, changes nothing (403). And each press is taken once: the same
//! signed request again within the signature's five minutes (a replay) is
//! answered 200 and changes nothing, whichever replica it reaches, since
//! the press is recorded on the runner in the write that changes its hold
//! ([`Press`]).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use serde::Deserialize;

use super::message::{EXTEND, RELEASE, parse_button_value};
use super::signature::verify;
use crate::actions::Secret;
use crate::api::EphemeralRunner;
use crate::api::ephemeral_runner::SlackMessage;
use crate::debug::{HoldChange, HoldControlError, Press, change_hold};
use kube::Api;

/// The path the router serves.
pub const PATH: &str = "/slack/interactions";

/// How the endpoint is set up.
#[derive(Clone, Debug)]
pub struct InteractionsConfig {
    /// The Slack app's signing secret.
    pub signing_secret: Secret,
    /// How much later Extend moves a hold (the message's button says so).
    pub extend_by: Duration,
}

struct Shared {
    client: kube::Client,
    config: InteractionsConfig,
}

/// The router serving [`PATH`], for the runtime's server to mount.
pub fn router(client: kube::Client, config: InteractionsConfig) -> Router {
    Router::new()
        .route(PATH, post(interaction))
        .with_state(Arc::new(Shared { client, config }))
}

#[derive(Deserialize)]
struct Payload {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    user: Option<User>,
    #[serde(default)]
    actions: Vec<Action>,
    /// The message the button is in.
    #[serde(default)]
    container: Option<Container>,
}

#[derive(Deserialize)]
struct Container {
    #[serde(default)]
    channel_id: String,
    #[serde(default)]
    message_ts: String,
}

#[derive(Deserialize)]
struct User {
    #[serde(default)]
    id: String,
}

#[derive(Deserialize)]
struct Action {
    action_id: String,
    #[serde(default)]
    value: String,
}

async fn interaction(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, String) {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Err(error) = verify(
        shared.config.signing_secret.expose().as_bytes(),
        header("x-slack-request-timestamp"),
        header("x-slack-signature"),
        &body,
        jiff::Timestamp::now().as_second(),
    ) {
        tracing::warn!(%error, "refused a Slack interaction");
        return (StatusCode::UNAUTHORIZED, error.to_string());
    }
    let signed_at = header("x-slack-request-timestamp")
        .and_then(|t| t.parse::<i64>().ok())
        .unwrap_or_else(|| jiff::Timestamp::now().as_second());
    let press = Press::new(header("x-slack-signature").unwrap_or_default(), signed_at);
    let Some(payload) = url::form_urlencoded::parse(&body)
        .find(|(key, _)| key == "payload")
        .and_then(|(_, value)| serde_json::from_str::<Payload>(&value).ok())
    else {
        return (StatusCode::BAD_REQUEST, "no interaction payload".into());
    };
    if payload.kind != "block_actions" {
        return (StatusCode::OK, String::new());
    }
    let user = payload.user.map(|u| u.id).unwrap_or_default();
    for action in &payload.actions {
        let change = match action.action_id.as_str() {
            EXTEND => HoldChange::Extend(shared.config.extend_by),
            RELEASE => HoldChange::Release,
            _ => continue,
        };
        let Some((namespace, name)) = parse_button_value(&action.value) else {
            return (StatusCode::BAD_REQUEST, "the button names no runner".into());
        };
        let from = payload.container.as_ref().map(|c| SlackMessage {
            channel: c.channel_id.clone(),
            ts: c.message_ts.clone(),
        });
        if let Err(refusal) = posted_by_us(&shared.client, namespace, name, from.as_ref()).await {
            tracing::warn!(%namespace, runner = %name, slack_user = %user, %refusal, "refused a Slack press");
            return refusal.answer();
        }
        match change_hold(&shared.client, namespace, name, change, Some(&press)).await {
            Ok(until) => {
                tracing::info!(%namespace, runner = %name, slack_user = %user, ?change, %until, "hold changed from Slack");
            }
            Err(HoldControlError::Taken { .. }) => {
                tracing::info!(%namespace, runner = %name, slack_user = %user, "ignored a Slack press already taken (a replay)");
            }
            Err(error) => {
                // Slack shows a failed interaction to the presser as an
                // error, which is what they need to see; the reason is in
                // the log.
                tracing::warn!(%namespace, runner = %name, slack_user = %user, %error, "hold change from Slack refused");
                return (StatusCode::CONFLICT, error.to_string());
            }
        }
    }
    (StatusCode::OK, String::new())
}

/// Why a press is not taken before the hold is looked at.
#[derive(Debug, thiserror::Error)]
enum Refusal {
    #[error("the runner {0} does not exist")]
    NoRunner(String),
    #[error("the runner {0}'s scale set does not tell Slack")]
    NoSlack(String),
    #[error("the button is not in the message posted about {0}'s hold")]
    OtherMessage(String),
    #[error("the runner could not be read: {0}")]
    Unreadable(kube::Error),
}

impl Refusal {
    fn answer(&self) -> (StatusCode, String) {
        let status = match self {
            Self::NoRunner(_) => StatusCode::CONFLICT,
            Self::NoSlack(_) | Self::OtherMessage(_) => StatusCode::FORBIDDEN,
            Self::Unreadable(_) => StatusCode::SERVICE_UNAVAILABLE,
        };
        (status, self.to_string())
    }
}

/// Whether the press of a button in the message `from` may act on the
/// runner `namespace/name`: its scale set tells Slack, and `from` is the
/// message this host posted about its hold.
async fn posted_by_us(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    from: Option<&SlackMessage>,
) -> Result<(), Refusal> {
    let runners: Api<EphemeralRunner> = Api::namespaced(client.clone(), namespace);
    let shown = format!("{namespace}/{name}");
    let runner = runners
        .get_opt(name)
        .await
        .map_err(Refusal::Unreadable)?
        .ok_or_else(|| Refusal::NoRunner(shown.clone()))?;
    if runner
        .spec
        .debug
        .as_ref()
        .and_then(|d| d.slack.as_ref())
        .is_none()
    {
        return Err(Refusal::NoSlack(shown));
    }
    let posted = runner
        .status
        .as_ref()
        .and_then(|s| s.slack_message.as_ref());
    match (posted, from) {
        (Some(posted), Some(from)) if posted == from && !posted.ts.is_empty() => Ok(()),
        _ => Err(Refusal::OtherMessage(shown)),
    }
}
