//! The admin token: bootstrapped once, shared, renewed behind the calls.
//!
//! Every service call needs the Actions service admin token, which takes a
//! three-step bootstrap (GitHub token, registration token, admin token).
//! [`AdminSlot`] holds the token and the bootstrap under way so that a
//! burst of calls shares one bootstrap and a call with a usable token never
//! waits for one; the decision of which is [`plan_admin_token`], pure, in
//! `auth`.

use std::sync::{Arc, MutexGuard, PoisonError};

use jiff::Timestamp;
use reqwest::Method;
use tokio::sync::{oneshot, watch};
use url::Url;

use super::{ActionsClient, Auth, Call, join};
use crate::actions::auth::{
    AdminToken, Credentials, RegistrationResponse, TokenPlan, TokenResponse, jwt_expiry,
    plan_admin_token,
};
use crate::actions::{ActionsError, Operation};

/// The result of one bootstrap as the calls that joined it see it: the
/// token, or the error's text (an error cannot be cloned; the call that
/// started the bootstrap gets the error itself).
type SharedBootstrap = Result<Arc<AdminToken>, String>;

/// The admin token and the bootstrap under way.
///
/// One bootstrap at a time: a burst of calls that find no usable token
/// joins the bootstrap under way and shares its outcome, failure included.
/// With a thousand listeners waiting on a GitHub outage, the alternative is
/// a thousand bootstraps, each with its full retry schedule. Calls that
/// arrive after a failure start a new one.
///
/// A call that finds a usable token never waits: inside the renewal window
/// it starts the renewal in the background and goes on with the token it
/// has ([`plan_admin_token`]).
#[derive(Default)]
pub(super) struct AdminSlot {
    token: Option<Arc<AdminToken>>,
    /// The bootstrap under way, if any: its result is published here.
    flight: Option<watch::Receiver<Option<SharedBootstrap>>>,
    /// When the last background renewal started.
    last_background_renewal: Option<Timestamp>,
}

impl ActionsClient {
    fn admin_slot(&self) -> MutexGuard<'_, AdminSlot> {
        self.inner
            .admin
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The current admin token. A call that finds none it may use waits for
    /// a bootstrap (one at a time, shared); a call that finds one in the
    /// renewal window uses it and starts the renewal in the background.
    pub(crate) async fn admin_token(&self) -> Result<Arc<AdminToken>, ActionsError> {
        let (mut shared, started) = {
            let mut slot = self.admin_slot();
            let plan = plan_admin_token(
                slot.token.as_deref(),
                Timestamp::now(),
                slot.last_background_renewal,
            );
            match (plan, slot.token.clone()) {
                (TokenPlan::Use, Some(token)) => return Ok(token),
                (TokenPlan::UseAndRenew, Some(token)) => {
                    if slot.flight.is_none() {
                        slot.last_background_renewal = Some(Timestamp::now());
                        self.start_bootstrap(&mut slot, None);
                    }
                    return Ok(token);
                }
                _ => match &slot.flight {
                    Some(flight) => (flight.clone(), None),
                    None => {
                        let (tx, rx) = oneshot::channel();
                        (self.start_bootstrap(&mut slot, Some(tx)), Some(rx))
                    }
                },
            }
        };
        if let Some(own) = started
            && let Ok(result) = own.await
        {
            return result;
        }
        match shared.wait_for(Option::is_some).await.as_deref() {
            Ok(Some(Ok(token))) => Ok(token.clone()),
            Ok(Some(Err(reason))) => Err(ActionsError::BootstrapFailed {
                reason: reason.clone(),
            }),
            Ok(None) | Err(_) => Err(ActionsError::BootstrapFailed {
                reason: "the bootstrap was abandoned".into(),
            }),
        }
    }

    /// Starts a bootstrap as a task of its own, so that it completes (and
    /// the calls that joined it hear how it went) even if the call that
    /// started it is cancelled, and so that a renewal can run behind calls
    /// that do not wait for it. `starter` gets the bootstrap's own error.
    fn start_bootstrap(
        &self,
        slot: &mut AdminSlot,
        starter: Option<oneshot::Sender<Result<Arc<AdminToken>, ActionsError>>>,
    ) -> watch::Receiver<Option<SharedBootstrap>> {
        let (publish, flight) = watch::channel(None);
        slot.flight = Some(flight.clone());
        let client = self.clone();
        tokio::spawn(async move {
            let result = client.bootstrap().await.map(Arc::new);
            let shared = match &result {
                Ok(token) => Ok(token.clone()),
                Err(error) => Err(error.to_string()),
            };
            {
                let mut slot = client.admin_slot();
                slot.flight = None;
                if let Ok(token) = &shared {
                    slot.token = Some(token.clone());
                }
            }
            publish.send_replace(Some(shared));
            match (starter, result) {
                (Some(starter), result) => {
                    let _ = starter.send(result);
                }
                (None, Err(error)) => tracing::warn!(
                    error = %error,
                    "renewing the Actions service admin token failed; the current token serves until it expires"
                ),
                (None, Ok(_)) => {}
            }
        });
        flight
    }

    /// Forgets an admin token the service rejected, unless another call has
    /// already replaced it.
    pub(super) fn forget_admin_token(&self, rejected: &Arc<AdminToken>) {
        let mut slot = self.admin_slot();
        if slot
            .token
            .as_ref()
            .is_some_and(|t| Arc::ptr_eq(t, rejected))
        {
            slot.token = None;
        }
    }

    /// The three-step bootstrap: GitHub token, registration token, admin
    /// token.
    async fn bootstrap(&self) -> Result<AdminToken, ActionsError> {
        let api = self.inner.config_url.api_base();
        let timeout = self.inner.options.timeout;
        let github_token = match &self.inner.credentials {
            Credentials::Token(token) => token.clone(),
            Credentials::App(app) => {
                let jwt = app.jwt(Timestamp::now())?;
                let url = join(
                    api,
                    &format!("app/installations/{}/access_tokens", app.installation_id()),
                    Operation::InstallationToken,
                )?;
                let response = self
                    .execute(
                        Call {
                            operation: Operation::InstallationToken,
                            method: Method::POST,
                            url,
                            auth: Auth::Bearer(&jwt),
                            content_type: "application/vnd.github+json",
                            accept: Some("application/vnd.github+json"),
                            headers: Vec::new(),
                            body: None,
                            timeout,
                        },
                        &[&jwt],
                    )
                    .await?;
                response
                    .json::<TokenResponse>(Operation::InstallationToken)?
                    .token
            }
        };

        let url = join(
            api,
            &self.inner.config_url.registration_token_path(),
            Operation::RegistrationToken,
        )?;
        let response = self
            .execute(
                Call {
                    operation: Operation::RegistrationToken,
                    method: Method::POST,
                    url,
                    auth: Auth::Bearer(&github_token),
                    content_type: "application/vnd.github.v3+json",
                    accept: Some("application/vnd.github+json"),
                    headers: Vec::new(),
                    body: None,
                    timeout,
                },
                &[&github_token],
            )
            .await?;
        let registration_token = response
            .json::<TokenResponse>(Operation::RegistrationToken)?
            .token;

        let url = join(
            api,
            "actions/runner-registration",
            Operation::RunnerRegistration,
        )?;
        let body = serde_json::json!({
            "url": self.inner.config_url.url().as_str(),
            "runner_event": "register",
        });
        let response = self
            .execute(
                Call {
                    operation: Operation::RunnerRegistration,
                    method: Method::POST,
                    url,
                    auth: Auth::RemoteAuth(&registration_token),
                    content_type: "application/json",
                    accept: Some("application/json"),
                    headers: Vec::new(),
                    body: Some(body.to_string().into_bytes()),
                    timeout,
                },
                &[&registration_token, &github_token],
            )
            .await?;
        let registration: RegistrationResponse = response.json(Operation::RunnerRegistration)?;
        let mut service_url = Url::parse(&registration.url).map_err(|e| ActionsError::Decode {
            operation: Operation::RunnerRegistration,
            reason: format!("the Actions service URL is invalid: {e}"),
        })?;
        if !service_url.path().ends_with('/') {
            let path = format!("{}/", service_url.path());
            service_url.set_path(&path);
        }
        let expires_at = jwt_expiry(registration.token.expose())?;
        tracing::debug!(service = %service_url, expires_at = %expires_at, "obtained Actions service admin token");
        Ok(AdminToken {
            service_url,
            token: registration.token,
            expires_at,
        })
    }
}
