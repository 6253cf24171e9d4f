//! The hold API: `POST /api/v1/namespaces/{ns}/ephemeralrunners/{name}/hold`
//! with `{"duration": "30m"}` extends a hold (capped by `maxHold`), and
//! `DELETE` on the same path releases it now. Both answer
//! `{"holdUntil": "<RFC 3339>"}`.
//!
//! The caller proves who they are with a Kubernetes bearer token (a
//! ServiceAccount token, or whatever the cluster's authenticators accept),
//! checked with a TokenReview, and may act only if the cluster would let
//! them `update` that EphemeralRunner, checked with a SubjectAccessReview.
//! So the hold API grants nothing `kubectl annotate` would not: it is a
//! convenience for tools and chat bots that hold a token, not a new
//! permission. The controller's own ServiceAccount needs `create` on
//! `tokenreviews` and `subjectaccessreviews` for this. How many tokens one
//! client may have reviewed is bounded ([`Throttle`]): past it, 429.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::ConnectInfo;
use axum::extract::connect_info::Connected;
use axum::extract::{Path, State};
use axum::http::HeaderValue;
use axum::http::header::RETRY_AFTER;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::serve::IncomingStream;
use axum::{Extension, Router};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::{Api, Client};
use serde::Deserialize;
use serde_json::json;

use super::control::{HoldChange, HoldControlError, change_hold};
use super::hold::{format_hold_until, parse_duration};
pub use super::throttle::Throttle;
use crate::api::GROUP;

/// The route the router serves.
pub const PATH: &str = "/api/v1/namespaces/{namespace}/ephemeralrunners/{name}/hold";

/// The router serving [`PATH`], for the runtime's server to mount, with
/// the default review budget per client.
pub fn router(client: Client) -> Router {
    router_with(client, Throttle::default())
}

/// [`router`] with the review budget `throttle`. The client's address is
/// read from the connection (`into_make_service_with_connect_info`); a
/// server that does not provide it gives all its clients one budget.
pub fn router_with(client: Client, throttle: Throttle) -> Router {
    Router::new()
        .route(PATH, post(extend).delete(release))
        .with_state(Arc::new(Shared { client, throttle }))
}

struct Shared {
    client: Client,
    throttle: Throttle,
}

/// The address a client connected from, for the review budget: what a
/// server hands the routers when made with
/// `into_make_service_with_connect_info::<ClientAddr>()`, over plain TCP or
/// TLS alike.
#[derive(Clone, Copy, Debug)]
pub struct ClientAddr(pub SocketAddr);

impl Connected<IncomingStream<'_, tokio::net::TcpListener>> for ClientAddr {
    fn connect_info(stream: IncomingStream<'_, tokio::net::TcpListener>) -> Self {
        Self(*stream.remote_addr())
    }
}

/// The address a request came from, when the server says.
type Peer = Option<Extension<ConnectInfo<ClientAddr>>>;

fn peer_ip(peer: &Peer) -> Option<IpAddr> {
    peer.as_ref()
        .map(|Extension(ConnectInfo(addr))| addr.0.ip())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExtendBody {
    duration: String,
}

fn answer(status: StatusCode, message: impl Into<String>) -> Response {
    (status, axum::Json(json!({ "message": message.into() }))).into_response()
}

async fn extend(
    State(shared): State<Arc<Shared>>,
    peer: Peer,
    Path((namespace, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let client = &shared.client;
    if let Err(refused) = authorise(&shared, peer_ip(&peer), &headers, &namespace, &name).await {
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
    if let Err(refused) = authorise(&shared, peer_ip(&peer), &headers, &namespace, &name).await {
        return refused;
    }
    apply(&shared.client, &namespace, &name, HoldChange::Release).await
}

async fn apply(client: &Client, namespace: &str, name: &str, change: HoldChange) -> Response {
    match change_hold(client, namespace, name, change).await {
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
                HoldControlError::NotHeld { .. } | HoldControlError::Contended { .. } => {
                    StatusCode::CONFLICT
                }
                HoldControlError::Spec(_) => StatusCode::UNPROCESSABLE_ENTITY,
                HoldControlError::Kube { .. } => StatusCode::BAD_GATEWAY,
            };
            answer(status, error.to_string())
        }
    }
}

/// Authenticates the bearer token and checks that its user may update the
/// runner; the error is the response to send. The token is handed only to
/// the TokenReview, never logged, and only within `peer`'s review budget.
async fn authorise(
    shared: &Shared,
    peer: Option<IpAddr>,
    headers: &HeaderMap,
    namespace: &str,
    name: &str,
) -> Result<(), Response> {
    let client = &shared.client;
    let token = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| answer(StatusCode::UNAUTHORIZED, "a bearer token is required"))?;
    if let Err(wait) = shared.throttle.spend(peer, Instant::now()) {
        tracing::warn!(client = ?peer, "hold API review budget spent; refusing");
        let mut refused = answer(
            StatusCode::TOO_MANY_REQUESTS,
            "too many tokens to review from this client; try again later",
        );
        if let Ok(value) = HeaderValue::from_str(&wait.as_secs().max(1).to_string()) {
            refused.headers_mut().insert(RETRY_AFTER, value);
        }
        return Err(refused);
    }
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: token.to_string(),
            audiences: None,
        },
        ..TokenReview::default()
    };
    let reviewed = Api::<TokenReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .map_err(|error| {
            tracing::warn!(%error, "a TokenReview failed");
            answer(StatusCode::BAD_GATEWAY, "the token could not be reviewed")
        })?;
    let status = reviewed.status.unwrap_or_default();
    let user = match (status.authenticated, status.user) {
        (Some(true), Some(user)) => user,
        _ => return Err(answer(StatusCode::UNAUTHORIZED, "the token is not valid")),
    };
    let access = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: user.username.clone(),
            uid: user.uid.clone(),
            groups: user.groups.clone(),
            extra: user.extra.clone(),
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(namespace.to_string()),
                verb: Some("update".into()),
                group: Some(GROUP.into()),
                resource: Some("ephemeralrunners".into()),
                name: Some(name.to_string()),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    let decided = Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &access)
        .await
        .map_err(|error| {
            tracing::warn!(%error, "a SubjectAccessReview failed");
            answer(StatusCode::BAD_GATEWAY, "access could not be reviewed")
        })?;
    let username = user.username.unwrap_or_default();
    if decided.status.is_some_and(|s| s.allowed) {
        Ok(())
    } else {
        tracing::info!(user = %username, %namespace, runner = %name, "hold change refused: not allowed to update the runner");
        Err(answer(
            StatusCode::FORBIDDEN,
            format!("{username} may not update ephemeralrunners.{GROUP} {namespace}/{name}"),
        ))
    }
}
