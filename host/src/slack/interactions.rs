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
use crate::debug::{HoldChange, change_hold};

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
        match change_hold(&shared.client, namespace, name, change).await {
            Ok(until) => {
                tracing::info!(%namespace, runner = %name, slack_user = %user, ?change, %until, "hold changed from Slack");
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
