//! Who may call arcwright's own HTTP APIs (the hold API, the recording
//! API): the cluster decides, never arcwright.
//!
//! A caller proves who they are with a Kubernetes bearer token (a
//! ServiceAccount token, or whatever the cluster's authenticators accept),
//! checked with a TokenReview, and may act only if the cluster would let
//! them do the [`Action`] asked of the API, checked with a
//! SubjectAccessReview. So an API that authorises here grants nothing the
//! cluster's RBAC does not: the permission is a rule in a Role, revoked as
//! any other. The controller's own ServiceAccount needs `create` on
//! `tokenreviews` and `subjectaccessreviews` for this.
//!
//! Every review is a call the API server answers for anyone who can reach
//! the endpoint, so each costs one unit of the client's [`Throttle`]
//! budget; past it the answer is 429 with `Retry-After` and costs nothing.
//! The routers of one server share one budget, so a client cannot double
//! its reviews by alternating between APIs.
//!
//! A token is accepted only if it was made for arcwright: the review asks
//! for the audience [`AUDIENCE`], and the API server authenticates a token
//! for it only if the token names it (`kubectl create token ACCOUNT
//! --audience arcwright`). A token made for the API server itself, the
//! kind every kubeconfig and pod holds, is refused: whoever receives a
//! token can replay it, and one that arcwright accepted must not open the
//! rest of the cluster to whoever sees it on the way.
//!
//! The token is read from `Authorization: Bearer`, or from
//! [`TOKEN_HEADER`] when the request came through the API server's service
//! proxy, which removes `Authorization` once it has authenticated the
//! caller with it. The token goes to the TokenReview and nowhere else: it
//! is never logged, nor put in an answer.

use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

use axum::Extension;
use axum::extract::ConnectInfo;
use axum::extract::connect_info::Connected;
use axum::http::header::RETRY_AFTER;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::serve::IncomingStream;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::json;

pub use crate::debug::throttle::Throttle;

/// The header a caller's token travels in when `Authorization` cannot
/// reach the controller: `X-Arcwright-Authorization: Bearer TOKEN`. The API
/// server's service proxy (`/api/v1/namespaces/NS/services/NAME:PORT/proxy/`)
/// authenticates the caller by their own `Authorization` and deletes it
/// before forwarding; other headers pass. The token in it is reviewed
/// exactly as one in `Authorization` is, so it opens nothing more.
pub const TOKEN_HEADER: &str = "x-arcwright-authorization";

/// The audience a token must be made for to be accepted here.
pub const AUDIENCE: &str = "arcwright";

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

/// The address a request came from, when the server says: a handler's
/// extractor.
pub type Peer = Option<Extension<ConnectInfo<ClientAddr>>>;

/// The client's IP address, the key of its review budget; `None` (one
/// budget for all such clients) when the server does not provide it.
pub fn peer_ip(peer: &Peer) -> Option<IpAddr> {
    peer.as_ref()
        .map(|Extension(ConnectInfo(addr))| addr.0.ip())
}

/// What a caller asks to do, as a SubjectAccessReview's resource
/// attributes name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Action<'a> {
    /// The verb: `update`, or one of arcwright's own (RBAC takes any word).
    pub verb: &'a str,
    /// The API group.
    pub group: &'a str,
    /// The resource, plural.
    pub resource: &'a str,
    /// The object's namespace.
    pub namespace: &'a str,
    /// The object's name.
    pub name: &'a str,
}

/// The JSON answer `{"message": ...}` every refusal is.
pub fn answer(status: StatusCode, message: impl Into<String>) -> Response {
    (status, axum::Json(json!({ "message": message.into() }))).into_response()
}

/// The bearer token of a request: `Authorization` first, then
/// [`TOKEN_HEADER`]; `None` when neither holds a non-empty one.
pub fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let bearer = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
    };
    bearer("authorization").or_else(|| bearer(TOKEN_HEADER))
}

/// Authenticates the request's bearer token and checks that its user may
/// do `action`, within `peer`'s review budget; `Ok` is the user, `Err` the
/// response to send (401 without a valid token, 403 when not allowed, 429
/// past the budget, 502 when the API server cannot review).
pub async fn authorise(
    client: &Client,
    throttle: &Throttle,
    peer: Option<IpAddr>,
    headers: &HeaderMap,
    action: Action<'_>,
) -> Result<UserInfo, Response> {
    let token = bearer_token(headers).ok_or_else(|| {
        answer(
            StatusCode::UNAUTHORIZED,
            format!(
                "a bearer token is required (Authorization: Bearer TOKEN, or {TOKEN_HEADER}: \
                 Bearer TOKEN through the API server's proxy)"
            ),
        )
    })?;
    if let Err(wait) = throttle.spend(peer, Instant::now()) {
        tracing::warn!(client = ?peer, verb = action.verb, resource = action.resource, "review budget spent; refusing");
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
            audiences: Some(vec![AUDIENCE.to_owned()]),
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
        (Some(true), Some(user)) if meant_for_arcwright(status.audiences.as_deref()) => user,
        _ => {
            return Err(answer(
                StatusCode::UNAUTHORIZED,
                format!(
                    "the token is not valid for the audience {AUDIENCE} (make one with \
                     `kubectl create token ACCOUNT -n NAMESPACE --audience {AUDIENCE}`)"
                ),
            ));
        }
    };
    let access = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: user.username.clone(),
            uid: user.uid.clone(),
            groups: user.groups.clone(),
            extra: user.extra.clone(),
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(action.namespace.to_string()),
                verb: Some(action.verb.to_string()),
                group: Some(action.group.to_string()),
                resource: Some(action.resource.to_string()),
                name: Some(action.name.to_string()),
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
    if decided.status.is_some_and(|s| s.allowed) {
        return Ok(user);
    }
    let Action {
        verb,
        group,
        resource,
        namespace,
        name,
    } = action;
    let username = user.username.unwrap_or_default();
    tracing::info!(user = %username, verb, resource, %namespace, %name, "refused: not allowed");
    Err(answer(
        StatusCode::FORBIDDEN,
        format!("{username} may not {verb} {resource}.{group} {namespace}/{name}"),
    ))
}

/// Whether a TokenReview's answer says the token is valid for
/// [`AUDIENCE`]. An authenticator that knows nothing of audiences answers
/// none, which means "valid for the API server" (the TokenReview API's
/// rule), so none is a refusal too.
fn meant_for_arcwright(audiences: Option<&[String]>) -> bool {
    audiences.is_some_and(|audiences| audiences.iter().any(|a| a == AUDIENCE))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_review_that_names_arcwright_as_audience_accepts() {
        assert!(meant_for_arcwright(Some(&[AUDIENCE.to_owned()])));
        assert!(meant_for_arcwright(Some(&[
            "https://kubernetes.default.svc".to_owned(),
            AUDIENCE.to_owned()
        ])));
        // The API server's own audience, or an authenticator that ignores
        // audiences.
        assert!(!meant_for_arcwright(Some(&[
            "https://kubernetes.default.svc".to_owned()
        ])));
        assert!(!meant_for_arcwright(Some(&[])));
        assert!(!meant_for_arcwright(None));
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn the_token_is_read_from_authorization_then_from_the_proxy_header() {
        assert_eq!(
            bearer_token(&headers(&[("authorization", "Bearer abc")])),
            Some("abc")
        );
        assert_eq!(
            bearer_token(&headers(&[(TOKEN_HEADER, "Bearer def")])),
            Some("def")
        );
        assert_eq!(
            bearer_token(&headers(&[
                ("authorization", "Bearer abc"),
                (TOKEN_HEADER, "Bearer def")
            ])),
            Some("abc"),
            "Authorization, when it holds one, is the caller's own"
        );
        assert_eq!(
            bearer_token(&headers(&[
                ("authorization", "Basic dXNlcjpwdw=="),
                (TOKEN_HEADER, "Bearer def")
            ])),
            Some("def")
        );
        for refused in [
            headers(&[]),
            headers(&[("authorization", "Bearer ")]),
            headers(&[("authorization", "abc")]),
            headers(&[(TOKEN_HEADER, "abc")]),
        ] {
            assert_eq!(bearer_token(&refused), None, "{refused:?}");
        }
    }
}
