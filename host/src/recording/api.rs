//! The recording API: `GET /api/v1/namespaces/{ns}/autoscalingrunnersets/{name}/recording`
//! answers the scale set's trace ([`super::FORMAT`], JSON lines) as
//! [`CONTENT_TYPE`].
//!
//! A recording holds every scaling input of the scale set (its job counts,
//! its runners, its policy's kept state) and the labels of its jobs: not
//! secrets, but more than `get` on the AutoscalingRunnerSet shows. So
//! reading it takes a verb of its own, [`VERB`] on `autoscalingrunnersets`,
//! granted by a Role like any other: `get` on the scale set does not grant
//! it, and of the built-in ClusterRoles only those granting every verb
//! (`cluster-admin`) do. The caller is authorised as
//! the hold API's are ([`crate::access`]): a bearer token, reviewed, within
//! the client's review budget, and 401, 403 or 429 as there.
//!
//! The recording is authorised before it is looked up, so a caller without
//! the verb cannot learn which scale sets this replica records. A scale set
//! this replica has no recording of is a 404 saying why: recording is off,
//! or the replica does not listen for it (with leader election only the
//! leader does, and a Service may route to a standby).

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE as CONTENT_TYPE_HEADER};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use kube::Client;

use super::Recordings;
use crate::access::{Action, Peer, Throttle, answer, authorise, peer_ip};
use crate::api::GROUP;

/// The route the router serves.
pub const PATH: &str = "/api/v1/namespaces/{namespace}/autoscalingrunnersets/{name}/recording";

/// The RBAC verb on `autoscalingrunnersets` (group [`GROUP`]) that lets its
/// holder read a scale set's recording.
pub const VERB: &str = "read-recording";

/// The media type of a trace: JSON lines.
pub const CONTENT_TYPE: &str = "application/jsonl";

/// [`PATH`] for one scale set.
pub fn path(namespace: &str, name: &str) -> String {
    format!("/api/v1/namespaces/{namespace}/autoscalingrunnersets/{name}/recording")
}

/// The router serving [`PATH`] from `recordings`, with the default review
/// budget per client.
pub fn router(client: Client, recordings: Recordings) -> Router {
    router_with(client, recordings, Throttle::default())
}

/// [`router`] with the review budget `throttle`: give the `Arc` the hold
/// API's router has, so a client has one budget for both.
pub fn router_with(
    client: Client,
    recordings: Recordings,
    throttle: impl Into<Arc<Throttle>>,
) -> Router {
    Router::new()
        .route(PATH, get(serve))
        .with_state(Arc::new(Shared {
            client,
            recordings,
            throttle: throttle.into(),
        }))
}

struct Shared {
    client: Client,
    recordings: Recordings,
    throttle: Arc<Throttle>,
}

async fn serve(
    State(shared): State<Arc<Shared>>,
    peer: Peer,
    Path((namespace, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, Response> {
    let action = Action {
        verb: VERB,
        group: GROUP,
        resource: "autoscalingrunnersets",
        namespace: &namespace,
        name: &name,
    };
    let user = authorise(
        &shared.client,
        &shared.throttle,
        peer_ip(&peer),
        &headers,
        action,
    )
    .await?;
    let Some(trace) = shared.recordings.trace(&namespace, &name) else {
        return Err(answer(
            StatusCode::NOT_FOUND,
            missing(shared.recordings.enabled(), &namespace, &name),
        ));
    };
    tracing::info!(
        user = user.username.as_deref().unwrap_or_default(),
        %namespace,
        scale_set = %name,
        bytes = trace.len(),
        "recording served"
    );
    Ok((
        StatusCode::OK,
        [
            (CONTENT_TYPE_HEADER, CONTENT_TYPE),
            // A trace is a moment's copy; a cache would serve a stale one.
            (CACHE_CONTROL, "no-store"),
        ],
        trace,
    )
        .into_response())
}

/// Why there is no recording of `namespace/name` here.
fn missing(enabled: bool, namespace: &str, name: &str) -> String {
    if enabled {
        format!(
            "this replica has no recording of autoscalingrunnerset {namespace}/{name}: it has \
             not listened for that scale set since it started (with leader election only the \
             leader listens: ask the leader's pod)"
        )
    } else {
        format!(
            "recording is off on this replica (--recording-entries 0): there is no recording \
             of autoscalingrunnerset {namespace}/{name}"
        )
    }
}
