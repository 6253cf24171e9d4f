//! The hold API: `POST /api/v1/namespaces/{ns}/ephemeralrunners/{name}/hold`
//! with `{"duration": "30m"}` extends a hold (capped by `maxHold`), and
//! `DELETE` on the same path releases it now. Both answer
//! `{"holdUntil": "<RFC 3339>"}`.
//!
//! The caller proves who they are with a Kubernetes bearer token and may
//! act only if the cluster would let them `update` that EphemeralRunner
//! ([`crate::access`]: a TokenReview, then a SubjectAccessReview). So the
//! hold API grants nothing `kubectl annotate` would not: it is a
//! convenience for tools and chat bots that hold a token, not a new
//! permission. How many tokens one client may have reviewed is bounded
//! ([`Throttle`]): past it, 429.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use kube::Client;
use serde::Deserialize;
use serde_json::json;

use super::control::{HoldChange, HoldControlError, change_hold};
use super::hold::{format_hold_until, parse_duration};
pub use super::throttle::Throttle;
pub use crate::access::ClientAddr;
use crate::access::{Action, Peer, answer, authorise, peer_ip};
use crate::api::GROUP;

/// The route the router serves.
pub const PATH: &str = "/api/v1/namespaces/{namespace}/ephemeralrunners/{name}/hold";

/// The router serving [`PATH`], for the runtime's server to mount, with
/// the default review budget per client.
pub fn router(client: Client) -> Router {
    router_with(client, Throttle::default())
}

/// [`router`] with the review budget `throttle` (shared with the other
/// routers of the server when given as an `Arc`). The client's address is
/// read from the connection (`into_make_service_with_connect_info`); a
/// server that does not provide it gives all its clients one budget.
pub fn router_with(client: Client, throttle: impl Into<Arc<Throttle>>) -> Router {
    Router::new()
        .route(PATH, post(extend).delete(release))
        .with_state(Arc::new(Shared {
            client,
            throttle: throttle.into(),
        }))
}

struct Shared {
    client: Client,
    throttle: Arc<Throttle>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExtendBody {
    duration: String,
}

async fn extend(
    State(shared): State<Arc<Shared>>,
    peer: Peer,
    Path((namespace, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let client = &shared.client;
    if let Err(refused) = authorise_update(&shared, &peer, &headers, &namespace, &name).await {
        return refused;
    }
    let by = match serde_json::from_slice::<ExtendBody>(&body) {
        Ok(body) => match parse_duration("duration", &body.duration) {
            Ok(by) => by,
            Err(error) => return answer(StatusCode::BAD_REQUEST, error.to_string()),
        },
        Err(error) => {
            return answer(
                StatusCode::BAD_REQUEST,
                format!("the body must be {{\"duration\": \"30m\"}}: {error}"),
            );
        }
    };
    apply(client, &namespace, &name, HoldChange::Extend(by)).await
}

async fn release(
    State(shared): State<Arc<Shared>>,
    peer: Peer,
    Path((namespace, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    if let Err(refused) = authorise_update(&shared, &peer, &headers, &namespace, &name).await {
        return refused;
    }
    apply(&shared.client, &namespace, &name, HoldChange::Release).await
}

async fn apply(client: &Client, namespace: &str, name: &str, change: HoldChange) -> Response {
    match change_hold(client, namespace, name, change, None).await {
        Ok(until) => {
            tracing::info!(%namespace, runner = %name, ?change, %until, "hold changed through the API");
            (
                StatusCode::OK,
                axum::Json(json!({ "holdUntil": format_hold_until(until) })),
            )
                .into_response()
        }
        Err(error) => {
            let status = match &error {
                HoldControlError::NotFound { .. } => StatusCode::NOT_FOUND,
                HoldControlError::NotHeld { .. }
                | HoldControlError::Contended { .. }
                | HoldControlError::Taken { .. } => StatusCode::CONFLICT,
                HoldControlError::Spec(_) => StatusCode::UNPROCESSABLE_ENTITY,
                HoldControlError::Kube { .. } => StatusCode::BAD_GATEWAY,
            };
            answer(status, error.to_string())
        }
    }
}

/// The hold API's authorisation: may the caller `update` the runner.
async fn authorise_update(
    shared: &Shared,
    peer: &Peer,
    headers: &HeaderMap,
    namespace: &str,
    name: &str,
) -> Result<(), Response> {
    let action = Action {
        verb: "update",
        group: GROUP,
        resource: "ephemeralrunners",
        namespace,
        name,
    };
    authorise(
        &shared.client,
        &shared.throttle,
        peer_ip(peer),
        headers,
        action,
    )
    .await
    .map(drop)
}
