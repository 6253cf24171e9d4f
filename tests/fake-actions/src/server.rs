//! The HTTP face of the fake: authentication, long polls, rendering, fault
//! injection and the accept loop. Every rule about what a call does is in
//! [`crate::state`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{MatchedPath, Path, Query, Request, State as Ext};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodFilter, on};
use http::{HeaderMap, Method, StatusCode};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

use crate::auth::{Keys, check_admin_token, check_app_jwt, credential, issue_admin_token};
use crate::endpoint::Endpoint;
use crate::error::{ResetConnection, ServiceError};
use crate::jit::JitConfig;
use crate::model::FaultKind;
use crate::state::{Removal, State};

/// Settings the HTTP layer reads; fixed at start.
pub(crate) struct Settings {
    pub long_poll: Duration,
    pub admin_token_lifetime: Duration,
    pub installation_token_lifetime: Duration,
    pub registration_token_lifetime: Duration,
    pub app_id: u64,
    pub client_id: String,
    pub installation_id: u64,
    pub app_private_key_pem: Arc<str>,
    pub utf8_bom: bool,
}

/// What every handler shares: the state behind one lock, a version number
/// bumped after every change (long polls wait on it), keys and settings.
pub(crate) struct Shared {
    state: Mutex<State>,
    version: watch::Sender<u64>,
    pub keys: Keys,
    pub settings: Settings,
}

impl Shared {
    pub(crate) fn new(state: State, keys: Keys, settings: Settings) -> Shared {
        Shared {
            state: Mutex::new(state),
            version: watch::Sender::new(0),
            keys,
            settings,
        }
    }

    /// Reads the state. A panic while the lock was held cannot leave the
    /// state half-changed in a way a test would miss (the panicking test
    /// fails anyway), so a poisoned lock is simply taken over.
    pub(crate) fn read<T>(&self, f: impl FnOnce(&State) -> T) -> T {
        f(&self.state.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Changes the state and wakes every waiter.
    pub(crate) fn write<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let result = f(&mut self.state.lock().unwrap_or_else(PoisonError::into_inner));
        self.version.send_modify(|v| *v = v.wrapping_add(1));
        result
    }

    /// A receiver that fires on the next change after this call.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    /// Waits until `poll` yields a value or `wait` passes. Subscribing before
    /// each check means a change between the check and the wait is not lost.
    async fn long_poll<T>(
        &self,
        wait: Duration,
        mut poll: impl FnMut(&Shared) -> Result<Option<T>, ServiceError>,
    ) -> Result<Option<T>, ServiceError> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let mut changes = self.subscribe();
            if let Some(found) = poll(self)? {
                return Ok(Some(found));
            }
            tokio::select! {
                changed = changes.changed() => {
                    if changed.is_err() {
                        return Ok(None);
                    }
                }
                () = tokio::time::sleep_until(deadline) => return Ok(None),
            }
        }
    }
}

type Shr = Ext<Arc<Shared>>;

/// The protocol router: GitHub API, Actions service, message queue and the
/// runner-facing endpoints, each behind the counting and fault layer.
pub(crate) fn router(shared: Arc<Shared>) -> Router {
    let mut router = Router::new();
    for endpoint in Endpoint::ALL {
        let (method, path) = endpoint.route();
        let mut paths = vec![path];
        paths.extend(endpoint.alias_routes());
        for path in paths {
            router = router.route(&path, on(filter(&method), handler(endpoint)));
        }
    }
    router
        .route_layer(middleware::from_fn_with_state(shared.clone(), gate))
        .layer(middleware::from_fn_with_state(shared.clone(), bom))
        .merge(crate::control::router())
        .with_state(shared)
}

fn filter(method: &Method) -> MethodFilter {
    match *method {
        Method::GET => MethodFilter::GET,
        Method::POST => MethodFilter::POST,
        Method::PATCH => MethodFilter::PATCH,
        Method::DELETE => MethodFilter::DELETE,
        _ => MethodFilter::PUT,
    }
}

fn handler(endpoint: Endpoint) -> axum::routing::MethodRouter<Arc<Shared>> {
    use axum::routing::any as a;
    match endpoint {
        Endpoint::AppInstallationToken => a(app_installation_token),
        Endpoint::RegistrationToken => a(registration_token),
        Endpoint::RunnerRegistration => a(runner_registration),
        Endpoint::GetRunnerGroupByName => a(runner_groups),
        Endpoint::GetScaleSetByName => a(scale_sets_by_name),
        Endpoint::GetScaleSet => a(get_scale_set),
        Endpoint::CreateScaleSet => a(create_scale_set),
        Endpoint::UpdateScaleSet => a(update_scale_set),
        Endpoint::DeleteScaleSet => a(delete_scale_set),
        Endpoint::GenerateJitConfig => a(generate_jit_config),
        Endpoint::GetRunner => a(get_runner),
        Endpoint::GetRunnerByName => a(runners_by_name),
        Endpoint::RemoveRunner => a(remove_runner),
        Endpoint::CreateSession => a(create_session),
        Endpoint::RefreshSession => a(refresh_session),
        Endpoint::DeleteSession => a(delete_session),
        Endpoint::GetMessage => a(get_message),
        Endpoint::DeleteMessage => a(delete_message),
        Endpoint::AcquireJobs => a(acquire_jobs),
        Endpoint::RunnerConnect => a(runner_connect),
        Endpoint::RunnerJob => a(runner_job),
        Endpoint::RunnerComplete => a(runner_complete),
        Endpoint::RunnerVanished => a(runner_vanished),
    }
}

/// Counts every call by endpoint and applies an armed fault: before the
/// handler runs, so the faulted call has no effect on the state (a status,
/// a delay, a reset), or after it, so the effect is committed and only the
/// answer is spoilt (a truncated body, an answer later than the client
/// waits).
async fn gate(Ext(shared): Shr, matched: MatchedPath, req: Request, next: Next) -> Response {
    let Some(endpoint) = Endpoint::from_route(req.method(), matched.as_str()) else {
        return next.run(req).await;
    };
    let fault = shared.write(|s| s.enter(endpoint));
    if let Some(fault) = &fault {
        tracing::debug!(%endpoint, ?fault, "injecting a fault");
    }
    let response = match fault {
        None => next.run(req).await,
        Some(FaultKind::Delay { millis }) => {
            tokio::time::sleep(Duration::from_millis(millis)).await;
            next.run(req).await
        }
        Some(FaultKind::Status {
            status,
            retry_after_secs,
        }) => ServiceError::Injected {
            status,
            retry_after_secs,
        }
        .into_response(),
        Some(FaultKind::Reset) => ServiceError::Reset.into_response(),
        Some(FaultKind::Truncate) => truncated(next.run(req).await).await,
        Some(FaultKind::LateAnswer { millis }) => {
            let response = next.run(req).await;
            tokio::time::sleep(Duration::from_millis(millis)).await;
            response
        }
    };
    tracing::debug!(%endpoint, status = response.status().as_u16(), "answered");
    response
}

/// `response` with its whole body's `Content-Length` but only its first
/// half sent: the body stream then fails, and hyper closes the connection
/// mid-body, as a cut-off answer looks on the wire.
///
/// A bodiless answer (a 204 to a deletion) has no half to send: cut, it is
/// the work done and the connection closed before the status line, which
/// a client sees as a reset after its request took effect. Sent whole with
/// `Content-Length: 0`, the fault would never strike.
async fn truncated(response: Response) -> Response {
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return ServiceError::Reset.into_response();
    };
    if bytes.is_empty() {
        return ServiceError::Reset.into_response();
    }
    parts.headers.insert(
        http::header::CONTENT_LENGTH,
        http::HeaderValue::from(bytes.len()),
    );
    let half = bytes.slice(..bytes.len() / 2);
    // The failure comes a moment after the first half, so that the status,
    // the headers and the half are usually on the wire before the
    // connection closes (hyper may still close it first).
    let first = futures::stream::once(async move { Ok::<Bytes, std::io::Error>(half) });
    let failure = futures::stream::once(async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        Err(std::io::Error::other("injected truncation"))
    });
    Response::from_parts(
        parts,
        Body::from_stream(futures::StreamExt::chain(first, failure)),
    )
}

/// Prefixes JSON bodies of the Actions service and the message queue with a
/// UTF-8 byte order mark when configured: the real service sends one at
/// times, and a client that does not strip it fails to parse.
async fn bom(Ext(shared): Shr, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    let wanted =
        shared.settings.utf8_bom && (path.starts_with("/tenant/") || path.starts_with("/broker/"));
    let response = next.run(req).await;
    let is_json = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !wanted || !is_json {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let mut with_bom = b"\xEF\xBB\xBF".to_vec();
    with_bom.extend_from_slice(&bytes);
    parts.headers.remove(http::header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(with_bom))
}

fn parse<T: DeserializeOwned>(body: &Bytes) -> Result<T, ServiceError> {
    serde_json::from_slice(body)
        .map_err(|e| ServiceError::BadRequest(format!("the request body is not valid: {e}")))
}

fn json_status(status: StatusCode, value: Value) -> Response {
    (status, axum::Json(value)).into_response()
}

fn ok(value: Value) -> Response {
    json_status(StatusCode::OK, value)
}

// ----- GitHub API ------------------------------------------------------------

async fn app_installation_token(
    Ext(shared): Shr,
    Path(installation): Path<u64>,
    headers: HeaderMap,
) -> Result<Response, ServiceError> {
    let jwt = credential(&headers, &["bearer"]).ok_or(ServiceError::MissingCredentials)?;
    let settings = &shared.settings;
    check_app_jwt(&shared.keys, jwt, settings.app_id, &settings.client_id)?;
    if installation != settings.installation_id {
        return Err(ServiceError::NotFound(format!(
            "installation {installation} does not exist"
        )));
    }
    let lifetime = secs(settings.installation_token_lifetime);
    let (token, expires) = shared.write(|s| s.issue_installation_token(lifetime));
    Ok(json_status(
        StatusCode::CREATED,
        json!({"token": token, "expires_at": rfc3339(expires)}),
    ))
}

/// Whether a GitHub API caller presents the PAT or a live installation token.
fn github_caller(shared: &Shared, headers: &HeaderMap) -> Result<(), ServiceError> {
    let token =
        credential(headers, &["bearer", "token"]).ok_or(ServiceError::MissingCredentials)?;
    shared.read(|s| {
        if s.is_pat(token) {
            Ok(())
        } else {
            s.check_installation_token(token)
        }
    })
}

async fn registration_token(
    Ext(shared): Shr,
    Path(params): Path<HashMap<String, String>>,
    headers: HeaderMap,
) -> Result<Response, ServiceError> {
    github_caller(&shared, &headers)?;
    let scope = match (
        params.get("org"),
        params.get("owner").zip(params.get("repo")),
        params.get("enterprise"),
    ) {
        (Some(org), _, _) => format!("/{org}"),
        (_, Some((owner, repo)), _) => format!("/{owner}/{repo}"),
        (_, _, Some(ent)) => format!("/enterprises/{ent}"),
        _ => return Err(ServiceError::NotFound("no such registration scope".into())),
    };
    let lifetime = secs(shared.settings.registration_token_lifetime);
    let (token, expires) = shared.write(|s| s.issue_registration_token(scope, lifetime));
    Ok(json_status(
        StatusCode::CREATED,
        json!({"token": token, "expires_at": rfc3339(expires)}),
    ))
}

#[derive(Deserialize)]
struct RegistrationRequest {
    url: String,
    #[serde(default)]
    runner_event: Option<String>,
}

async fn runner_registration(
    Ext(shared): Shr,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ServiceError> {
    let token = credential(&headers, &["RemoteAuth"]).ok_or(ServiceError::MissingCredentials)?;
    let request: RegistrationRequest = parse(&body)?;
    if request
        .runner_event
        .as_deref()
        .is_some_and(|e| e != "register")
    {
        return Err(ServiceError::BadRequest(format!(
            "runner_event must be \"register\", not {:?}",
            request.runner_event
        )));
    }
    let (tenant, generation) = shared.write(|s| {
        s.register(token, &request.url)
            .map(|t| (t, s.admin_generation))
    })?;
    let now = jiff::Timestamp::now().as_second();
    let jwt = issue_admin_token(
        &shared.keys,
        tenant,
        generation,
        now,
        secs(shared.settings.admin_token_lifetime),
    );
    let base = shared.read(|s| s.base_url().to_owned());
    Ok(ok(
        json!({"url": format!("{base}/tenant/{tenant}/"), "token": jwt}),
    ))
}

// ----- Actions service ---------------------------------------------------------

/// Checks the admin token and that it is good for the tenant in the path.
fn admin(shared: &Shared, headers: &HeaderMap, tenant: u32) -> Result<u32, ServiceError> {
    let token = credential(headers, &["bearer"]).ok_or(ServiceError::MissingCredentials)?;
    let generation = shared.read(|s| s.admin_generation);
    let granted = check_admin_token(&shared.keys, token, generation)?;
    if granted != tenant {
        return Err(ServiceError::InvalidCredentials);
    }
    Ok(tenant)
}

type Q = Query<HashMap<String, String>>;

async fn runner_groups(
    Ext(shared): Shr,
    Path(tenant): Path<u32>,
    Query(q): Q,
    headers: HeaderMap,
) -> Result<Response, ServiceError> {
    admin(&shared, &headers, tenant)?;
    let name = q.get("groupName").map(String::as_str).unwrap_or_default();
    Ok(ok(shared.read(|s| s.runner_groups_by_name(name))))
}

async fn scale_sets_by_name(
    Ext(shared): Shr,
    Path(tenant): Path<u32>,
    Query(q): Q,
    headers: HeaderMap,
) -> Result<Response, ServiceError> {
    admin(&shared, &headers, tenant)?;
    let group = match q.get("runnerGroupId") {
        Some(g) => Some(g.parse::<u64>().map_err(|_| {
            ServiceError::BadRequest(format!("runnerGroupId {g:?} is not a number"))
        })?),
        None => None,
    };
    let name = q.get("name").map(String::as_str).unwrap_or_default();
    Ok(ok(
        shared.read(|s| s.scale_sets_by_name(tenant, group, name))
    ))
}

async fn get_scale_set(
    Ext(shared): Shr,
    Path((tenant, id)): Path<(u32, u64)>,
    headers: HeaderMap,
) -> Result<Response, ServiceError> {
    admin(&shared, &headers, tenant)?;
    shared.read(|s| s.get_scale_set(tenant, id)).map(ok)
}

async fn create_scale_set(
    Ext(shared): Shr,
    Path(tenant): Path<u32>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ServiceError> {
    admin(&shared, &headers, tenant)?;
    let request = parse(&body)?;
    shared
        .write(|s| s.create_scale_set(tenant, request))
        .map(ok)
}

async fn update_scale_set(
    Ext(shared): Shr,
    Path((tenant, id)): Path<(u32, u64)>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ServiceError> {
    admin(&shared, &headers, tenant)?;
    let request = parse(&body)?;
    shared
        .write(|s| s.update_scale_set(tenant, id, request))
        .map(ok)
}

async fn delete_scale_set(
    Ext(shared): Shr,
    Path((tenant, id)): Path<(u32, u64)>,
    headers: HeaderMap,
) -> Result<Response, ServiceError> {
    admin(&shared, &headers, tenant)?;
    shared.write(|s| s.delete_scale_set(tenant, id))?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// The `generatejitconfig` body; `workFolder` is accepted and ignored, as
/// the fake runs no work.
#[derive(Deserialize)]
struct JitRequest {
    name: String,
}

async fn generate_jit_config(
    Ext(shared): Shr,
    Path((tenant, scale_set)): Path<(u32, u64)>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ServiceError> {
    admin(&shared, &headers, tenant)?;
    let request: JitRequest = parse(&body)?;
    shared
        .write(|s| s.generate_jit_config(tenant, scale_set, &request.name))
        .map(ok)
}

async fn get_runner(
    Ext(shared): Shr,
    Path((tenant, _pool, id)): Path<(u32, u64, u64)>,
    headers: HeaderMap,
) -> Result<Response, ServiceError> {
    admin(&shared, &headers, tenant)?;
    shared.read(|s| s.get_runner(tenant, id)).map(ok)
}

async fn runners_by_name(
    Ext(shared): Shr,
    Path((tenant, _pool)): Path<(u32, u64)>,
    Query(q): Q,
    headers: HeaderMap,
) -> Result<Response, ServiceError> {
    admin(&shared, &headers, tenant)?;
    let name = q.get("agentName").map(String::as_str).unwrap_or_default();
    Ok(ok(shared.read(|s| s.runners_by_name(tenant, name))))
}

async fn remove_runner(
    Ext(shared): Shr,
    Path((tenant, _pool, id)): Path<(u32, u64, u64)>,
    headers: HeaderMap,
) -> Result<Response, ServiceError> {
    admin(&shared, &headers, tenant)?;
    match shared.write(|s| s.remove_runner(tenant, id))? {
        Removal::Removed | Removal::AlreadyGone => Ok(StatusCode::NO_CONTENT.into_response()),
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SessionRequest {
    #[serde(default)]
    owner_name: String,
}

async fn create_session(
    Ext(shared): Shr,
    Path((tenant, scale_set)): Path<(u32, u64)>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ServiceError> {
    admin(&shared, &headers, tenant)?;
    let request: SessionRequest = parse(&body)?;
    shared
        .write(|s| s.create_session(tenant, scale_set, &request.owner_name))
        .map(ok)
}

async fn refresh_session(
    Ext(shared): Shr,
    Path((tenant, scale_set, session)): Path<(u32, u64, String)>,
    headers: HeaderMap,
) -> Result<Response, ServiceError> {
    admin(&shared, &headers, tenant)?;
    shared
        .write(|s| s.refresh_session(tenant, scale_set, &session))
        .map(ok)
}

async fn delete_session(
    Ext(shared): Shr,
    Path((tenant, scale_set, session)): Path<(u32, u64, String)>,
    headers: HeaderMap,
) -> Result<Response, ServiceError> {
    admin(&shared, &headers, tenant)?;
    shared.write(|s| s.delete_session(tenant, scale_set, &session))?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

// ----- message queue -----------------------------------------------------------

/// The scale set whose session the queue token belongs to; `session`, when
/// given, must be that session.
fn queue_caller(
    shared: &Shared,
    headers: &HeaderMap,
    session: Option<&str>,
) -> Result<u64, ServiceError> {
    let token = credential(headers, &["bearer"]).ok_or(ServiceError::MissingCredentials)?;
    let (owner, scale_set) = shared.read(|s| s.check_queue_token(token))?;
    if session.is_some_and(|s| s != owner) {
        return Err(ServiceError::InvalidCredentials);
    }
    Ok(scale_set)
}

async fn get_message(
    Ext(shared): Shr,
    Path(session): Path<String>,
    Query(q): Q,
    headers: HeaderMap,
) -> Result<Response, ServiceError> {
    let scale_set = queue_caller(&shared, &headers, Some(&session))?;
    let last_id = match q.get("lastMessageId") {
        Some(v) => v.parse::<u64>().map_err(|_| {
            ServiceError::BadRequest(format!("lastMessageId {v:?} is not a number"))
        })?,
        None => 0,
    };
    let capacity = max_capacity(&headers)?;
    shared.write_when(|s| s.set_max_capacity(scale_set, capacity), |c| *c);
    shared.write_when(|s| s.note_poll(&session), |_| false);
    let found = shared
        .long_poll(shared.settings.long_poll, |shared| {
            // Re-checked on every wake-up: a session dropped or a token
            // expired during the poll ends it with the error.
            let scale_set = queue_caller(shared, &headers, Some(&session))?;
            Ok(shared.write_when(|s| s.next_message(scale_set, last_id), Option::is_some))
        })
        .await?;
    Ok(match found {
        Some(message) => ok(message),
        None => StatusCode::ACCEPTED.into_response(),
    })
}

/// The header a listener tells the service its scale set's capacity with.
const MAX_CAPACITY_HEADER: &str = "X-ScaleSetMaxCapacity";

/// The poll's `X-ScaleSetMaxCapacity`, if it sent one.
fn max_capacity(headers: &HeaderMap) -> Result<Option<u64>, ServiceError> {
    let Some(value) = headers.get(MAX_CAPACITY_HEADER) else {
        return Ok(None);
    };
    value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Some)
        .ok_or_else(|| {
            ServiceError::BadRequest(format!(
                "{MAX_CAPACITY_HEADER} {value:?} is not a non-negative whole number"
            ))
        })
}

async fn delete_message(
    Ext(shared): Shr,
    Path((session, message)): Path<(String, u64)>,
    headers: HeaderMap,
) -> Result<Response, ServiceError> {
    let scale_set = queue_caller(&shared, &headers, Some(&session))?;
    shared.write(|s| s.delete_message(scale_set, message));
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn acquire_jobs(
    Ext(shared): Shr,
    Path((_tenant, scale_set)): Path<(u32, u64)>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ServiceError> {
    let token = credential(&headers, &["bearer"]).ok_or(ServiceError::MissingCredentials)?;
    let (session, owner) = shared.read(|s| s.check_queue_token(token))?;
    if owner != scale_set {
        return Err(ServiceError::InvalidCredentials);
    }
    let ids: Vec<u64> = parse(&body)?;
    let acquired = shared.write(|s| {
        let acquired = s.acquire(scale_set, &ids);
        s.note_acquisition(&session, &acquired);
        acquired
    });
    Ok(ok(json!({"count": acquired.len(), "value": acquired})))
}

// ----- runner-facing ---------------------------------------------------------------

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RunnerRequest {
    jit_config: String,
}

fn jit(body: &Bytes) -> Result<JitConfig, ServiceError> {
    let request: RunnerRequest = parse(body)?;
    JitConfig::decode(&request.jit_config).map_err(|e| ServiceError::BadRequest(e.to_string()))
}

async fn runner_connect(Ext(shared): Shr, body: Bytes) -> Result<Response, ServiceError> {
    let config = jit(&body)?;
    shared.write(|s| s.connect(&config)).map(ok)
}

async fn runner_job(Ext(shared): Shr, body: Bytes) -> Result<Response, ServiceError> {
    let config = jit(&body)?;
    let found = shared
        .long_poll(shared.settings.long_poll, |shared| {
            shared.write_when(|s| s.take_job(&config), |r| !matches!(r, Ok(None)))
        })
        .await?;
    Ok(match found {
        Some(job) => ok(serde_json::to_value(job).unwrap_or_default()),
        None => StatusCode::NO_CONTENT.into_response(),
    })
}

async fn runner_complete(Ext(shared): Shr, body: Bytes) -> Result<Response, ServiceError> {
    let config = jit(&body)?;
    shared.write(|s| s.complete(&config)).map(ok)
}

async fn runner_vanished(Ext(shared): Shr, body: Bytes) -> Result<Response, ServiceError> {
    let config = jit(&body)?;
    shared.write(|s| s.vanish(&config))?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

impl Shared {
    /// Like [`Shared::write`], but wakes waiters only when `changed` says the
    /// call did something: a long poll that found nothing changed nothing,
    /// and waking every other poller for it would make them spin.
    fn write_when<T>(&self, f: impl FnOnce(&mut State) -> T, changed: impl Fn(&T) -> bool) -> T {
        let result = f(&mut self.state.lock().unwrap_or_else(PoisonError::into_inner));
        if changed(&result) {
            self.version.send_modify(|v| *v = v.wrapping_add(1));
        }
        result
    }
}

fn secs(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}

fn rfc3339(unix: i64) -> String {
    jiff::Timestamp::from_second(unix)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

// ----- the service's own clock -------------------------------------------------------

/// Cancels jobs that no runner took within the assignment timeout, for as
/// long as the fake serves.
///
/// It sleeps until the earliest deadline the state reports, or until the
/// state changes (a job assigned, the timeout changed), whichever comes
/// first, so a timeout fires on time without polling.
pub(crate) async fn expire_unclaimed_jobs(shared: Arc<Shared>, shutdown: CancellationToken) {
    loop {
        let mut changes = shared.subscribe();
        let now = jiff::Timestamp::now();
        let expiry = shared.write_when(|s| s.expire_unclaimed(now), |e| e.cancelled > 0);
        let wait = expiry.next_deadline.map(|deadline| {
            Duration::try_from(deadline.duration_since(now)).unwrap_or(Duration::ZERO)
        });
        tokio::select! {
            () = shutdown.cancelled() => return,
            changed = changes.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            () = tokio::time::sleep(wait.unwrap_or(Duration::ZERO)), if wait.is_some() => {}
        }
    }
}

// ----- serving -----------------------------------------------------------------------

/// Serves `router` on `listener` until `shutdown`, one task per connection.
///
/// A hand-rolled accept loop rather than `axum::serve` for one reason: an
/// injected reset must close the connection without sending anything, which
/// needs the service to fail, and axum's server only accepts infallible
/// services. Connections are aborted on shutdown, so a long poll in flight
/// does not keep a stopped fake alive.
pub(crate) async fn serve(listener: TcpListener, router: Router, shutdown: CancellationToken) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(error) => {
                        tracing::warn!(%error, "accepting a connection failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let router = router.clone();
                connections.spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let router = router.clone();
                        async move {
                            let response = match router.oneshot(req).await {
                                Ok(response) => response,
                                Err(never) => match never {},
                            };
                            if response.extensions().get::<ResetConnection>().is_some() {
                                return Err(std::io::Error::other("injected connection reset"));
                            }
                            Ok::<_, std::io::Error>(response)
                        }
                    });
                    let io = hyper_util::rt::TokioIo::new(stream);
                    // A client going away mid-request is normal here.
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, service)
                        .await;
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    connections.abort_all();
}

/// The socket address to report: the bound one.
pub(crate) fn local_url(addr: SocketAddr) -> String {
    format!("http://{addr}")
}
