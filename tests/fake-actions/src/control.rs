//! Driving and inspecting the fake: in-process through [`Control`], and the
//! same operations over HTTP under `/_fake/` for the standalone binary.
//!
//! | method and path | body / answer |
//! |---|---|
//! | `POST /_fake/jobs` | a [`JobSpec`] → `{"ids": [...]}` |
//! | `GET /_fake/jobs` | `[JobSnapshot]` |
//! | `GET /_fake/history` | the [`JobHistory`]: every job message posted to a scale set, when |
//! | `GET /_fake/runners` | `[RunnerSnapshot]` |
//! | `GET /_fake/scale-sets` | `[ScaleSetSnapshot]` (with each set's last `max_capacity`) |
//! | `GET /_fake/settings` | the [`RuntimeSettings`]: `{"assignment_timeout_ms": n}` |
//! | `PATCH /_fake/settings` | a [`SettingsPatch`] (e.g. `{"assignment_timeout_ms": 200}`) → the new [`RuntimeSettings`]; an unknown key is a 400 |
//! | `POST /_fake/tokens/{admin,queue,github}/expire` | 204 |
//! | `PUT /_fake/pat` | `{"pat": "..."}` → 204: the new PAT is accepted, the old one refused and the tokens issued so far expire |
//! | `POST /_fake/sessions/{scaleSetId}/drop` | 204, or 404 when it had none |
//! | `POST /_fake/faults` | a [`Fault`] → 204; `DELETE /_fake/faults` clears them |
//! | `GET /_fake/counters` | `{"<endpoint>": {"calls": n, "faults": n}}` |
//! | `GET /_fake/ledger` | the [`Ledger`] |
//! | `GET /_fake/credentials` | `{"pat", "app_id", "client_id", "installation_id", "private_key_pem"}` |

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State as Ext};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::StatusCode;
use serde_json::{Value, json};

use crate::error::ServiceError;
use crate::model::{
    Counters, Fault, JobHistory, JobSnapshot, JobSpec, Ledger, RunnerSnapshot, RuntimeSettings,
    ScaleSetSnapshot, SessionHistory, SettingsPatch,
};
use crate::server::Shared;

/// The in-process control handle; cheap to clone, usable from any task.
#[derive(Clone)]
pub struct Control {
    shared: Arc<Shared>,
}

/// Everything the control API can show at one instant.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The registration ledger.
    pub ledger: Ledger,
    /// Every job.
    pub jobs: Vec<JobSnapshot>,
    /// Every registered runner.
    pub runners: Vec<RunnerSnapshot>,
    /// Call counters.
    pub counters: Counters,
}

impl Control {
    pub(crate) fn new(shared: Arc<Shared>) -> Control {
        Control { shared }
    }

    /// Enqueues jobs and returns their `runnerRequestId`s.
    pub fn enqueue_jobs(&self, spec: JobSpec) -> Vec<u64> {
        self.shared.write(|s| s.enqueue(&spec))
    }

    /// Expires every admin token issued so far; clients must register again.
    pub fn expire_admin_tokens(&self) {
        self.shared.write(|s| s.admin_generation += 1);
    }

    /// Expires every message queue token; listeners must refresh their session.
    pub fn expire_queue_tokens(&self) {
        self.shared.write(|s| s.expire_queue_tokens());
    }

    /// Expires every installation and registration token issued so far.
    pub fn expire_github_tokens(&self) {
        self.shared.write(|s| s.expire_github_tokens());
    }

    /// Rotates the PAT: `pat` is accepted from now on, the old one is
    /// refused, and every token issued so far expires (a credential
    /// rotation that revokes the old one).
    pub fn rotate_pat(&self, pat: &str) {
        self.shared.write(|s| s.rotate_pat(pat.to_owned()));
    }

    /// Serves behind `public_url` (a TLS terminator in front of the fake,
    /// as GitHub Enterprise Server sits behind its certificate): every URL
    /// the fake hands out from now on (the Actions service's, the message
    /// queue's, the runners' in their JIT configs) is under it.
    pub fn serve_behind(&self, public_url: &str) {
        let url = public_url.trim_end_matches('/').to_owned();
        self.shared.write(|s| s.set_base_url(url));
    }

    /// Deletes the scale set as an admin does in GitHub's settings (or the
    /// service after seven dormant days): its session and registrations go
    /// with it; returns whether it was deleted (not while a job runs).
    pub fn delete_scale_set(&self, scale_set_id: u64) -> bool {
        self.shared.write(|s| s.remove_scale_set(scale_set_id))
    }

    /// Drops the scale set's message session, as the service does when it
    /// loses a listener; returns whether there was one.
    pub fn drop_session(&self, scale_set_id: u64) -> bool {
        self.shared.write(|s| s.drop_session(scale_set_id))
    }

    /// The settings a test may change while the fake runs.
    pub fn settings(&self) -> RuntimeSettings {
        self.shared.read(|s| s.runtime_settings())
    }

    /// Changes the settings named in `patch` and returns them all. A new
    /// assignment timeout applies at once, to jobs already waiting too.
    pub fn update_settings(&self, patch: SettingsPatch) -> RuntimeSettings {
        self.shared.write(|s| {
            let settings = patch.apply(s.runtime_settings());
            s.set_runtime_settings(settings);
            settings
        })
    }

    /// Sets how long a job assigned to a scale set waits for a runner
    /// before the service cancels it and offers it again.
    pub fn set_assignment_timeout(&self, timeout: Duration) {
        self.update_settings(SettingsPatch {
            assignment_timeout_ms: Some(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)),
        });
    }

    /// Arms a fault. Faults on one endpoint apply in the order armed.
    pub fn inject(&self, fault: Fault) {
        self.shared.write(|s| s.inject(fault));
    }

    /// Disarms every fault.
    pub fn clear_faults(&self) {
        self.shared.write(|s| s.clear_faults());
    }

    /// Calls by endpoint.
    pub fn counters(&self) -> Counters {
        self.shared.read(|s| s.counters())
    }

    /// The registration ledger.
    pub fn ledger(&self) -> Ledger {
        self.shared.read(|s| s.ledger())
    }

    /// Every job, oldest first.
    pub fn jobs(&self) -> Vec<JobSnapshot> {
        self.shared.read(|s| s.jobs())
    }

    /// Every job message posted to a scale set so far, oldest first, with
    /// when it was posted.
    pub fn job_history(&self) -> JobHistory {
        self.shared.read(|s| s.job_history())
    }

    /// Every registered runner, by id.
    pub fn runners(&self) -> Vec<RunnerSnapshot> {
        self.shared.read(|s| s.runners())
    }

    /// Every scale set, by id.
    pub fn scale_sets(&self) -> Vec<ScaleSetSnapshot> {
        self.shared.read(|s| s.scale_set_summaries())
    }

    /// Every session, conflict and acquisition so far.
    pub fn session_history(&self) -> SessionHistory {
        self.shared.read(|s| s.session_history())
    }

    /// Whether the scale set has an active message session.
    pub fn has_session(&self, scale_set_id: u64) -> bool {
        self.scale_sets()
            .iter()
            .any(|s| s.id == scale_set_id && s.session_active)
    }

    /// The current state, all at once.
    pub fn snapshot(&self) -> Snapshot {
        self.shared.read(|s| Snapshot {
            ledger: s.ledger(),
            jobs: s.jobs(),
            runners: s.runners(),
            counters: s.counters(),
        })
    }

    /// Waits until `done` holds for the state, re-checking on every change,
    /// for at most `timeout`. Returns the snapshot that satisfied it, or the
    /// last one seen when time ran out, for the failure message.
    pub async fn wait_until(
        &self,
        timeout: Duration,
        mut done: impl FnMut(&Snapshot) -> bool,
    ) -> Result<Snapshot, Box<Snapshot>> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let mut changes = self.shared.subscribe();
            let snapshot = self.snapshot();
            if done(&snapshot) {
                return Ok(snapshot);
            }
            tokio::select! {
                _ = changes.changed() => {}
                () = tokio::time::sleep_until(deadline) => return Err(Box::new(snapshot)),
            }
        }
    }

    fn credentials(&self) -> Value {
        let settings = &self.shared.settings;
        json!({
            "pat": self.shared.read(|s| s.pat().to_owned()),
            "app_id": settings.app_id,
            "client_id": settings.client_id,
            "installation_id": settings.installation_id,
            "private_key_pem": &*settings.app_private_key_pem,
        })
    }
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control").finish_non_exhaustive()
    }
}

type C = Ext<Arc<Shared>>;

/// The `/_fake/` routes; not counted, never faulted.
pub(crate) fn router() -> Router<Arc<Shared>> {
    Router::new()
        .route("/_fake/jobs", post(enqueue).get(jobs))
        .route("/_fake/history", get(job_history))
        .route("/_fake/runners", get(runners))
        .route("/_fake/scale-sets", get(scale_sets))
        .route("/_fake/settings", get(settings).patch(update_settings))
        .route("/_fake/tokens/{kind}/expire", post(expire))
        .route("/_fake/pat", axum::routing::put(rotate_pat))
        .route("/_fake/sessions/{scale_set}/drop", post(drop_session))
        .route("/_fake/faults", post(inject).delete(clear_faults))
        .route("/_fake/counters", get(counters))
        .route("/_fake/ledger", get(ledger))
        .route("/_fake/credentials", get(credentials))
}

fn control(shared: Arc<Shared>) -> Control {
    Control::new(shared)
}

fn parse<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, ServiceError> {
    serde_json::from_slice(body)
        .map_err(|e| ServiceError::BadRequest(format!("the request body is not valid: {e}")))
}

async fn enqueue(Ext(shared): C, body: Bytes) -> Result<Response, ServiceError> {
    let spec: JobSpec = parse(&body)?;
    let ids = control(shared).enqueue_jobs(spec);
    Ok(axum::Json(json!({"ids": ids})).into_response())
}

async fn jobs(Ext(shared): C) -> Response {
    axum::Json(control(shared).jobs()).into_response()
}

async fn job_history(Ext(shared): C) -> Response {
    axum::Json(control(shared).job_history()).into_response()
}

async fn runners(Ext(shared): C) -> Response {
    axum::Json(control(shared).runners()).into_response()
}

async fn scale_sets(Ext(shared): C) -> Response {
    axum::Json(control(shared).scale_sets()).into_response()
}

async fn settings(Ext(shared): C) -> Response {
    axum::Json(control(shared).settings()).into_response()
}

async fn update_settings(Ext(shared): C, body: Bytes) -> Result<Response, ServiceError> {
    let patch: SettingsPatch = parse(&body)?;
    Ok(axum::Json(control(shared).update_settings(patch)).into_response())
}

async fn rotate_pat(Ext(shared): C, body: Bytes) -> Result<Response, ServiceError> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Rotation {
        pat: String,
    }
    let rotation: Rotation = parse(&body)?;
    if rotation.pat.is_empty() {
        return Err(ServiceError::BadRequest("the PAT is empty".into()));
    }
    control(shared).rotate_pat(&rotation.pat);
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn expire(Ext(shared): C, Path(kind): Path<String>) -> Result<Response, ServiceError> {
    let control = control(shared);
    match kind.as_str() {
        "admin" => control.expire_admin_tokens(),
        "queue" => control.expire_queue_tokens(),
        "github" => control.expire_github_tokens(),
        other => {
            return Err(ServiceError::BadRequest(format!(
                "token kind {other:?} is not one of admin, queue, github"
            )));
        }
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn drop_session(Ext(shared): C, Path(scale_set): Path<u64>) -> Response {
    if control(shared).drop_session(scale_set) {
        StatusCode::NO_CONTENT.into_response()
    } else {
        StatusCode::NOT_FOUND.into_response()
    }
}

async fn inject(Ext(shared): C, body: Bytes) -> Result<Response, ServiceError> {
    let fault: Fault = parse(&body)?;
    control(shared).inject(fault);
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn clear_faults(Ext(shared): C) -> Response {
    control(shared).clear_faults();
    StatusCode::NO_CONTENT.into_response()
}

async fn counters(Ext(shared): C) -> Response {
    axum::Json(control(shared).counters()).into_response()
}

async fn ledger(Ext(shared): C) -> Response {
    axum::Json(control(shared).ledger()).into_response()
}

async fn credentials(Ext(shared): C) -> Response {
    axum::Json(control(shared).credentials()).into_response()
}
