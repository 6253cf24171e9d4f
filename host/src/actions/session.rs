//! `MessageSession`: a listener's lease on its scale set's message queue.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use http::{HeaderName, HeaderValue};
use reqwest::Method;
use url::Url;

use super::client::{ActionsClient, QueueRequest, Response};
use super::types::{
    ListResponse, Message, MessageEnvelope, RunnerScaleSetSession, RunnerScaleSetStatistic,
};
use super::{ActionsError, Operation};

/// The header that tells the service how many jobs the listener can take.
const MAX_CAPACITY_HEADER: &str = "x-scalesetmaxcapacity";

/// An open message session.
///
/// Holds the session and its queue token. Every queue call (get message,
/// delete message, acquire jobs) retries exactly once after refreshing the
/// session when the service says the queue token expired: tokens are
/// short-lived and expiry is routine, but a second rejection right after a
/// refresh means something else is wrong and is reported.
///
/// The session is not deleted on drop (that would need an async call in
/// `Drop`); call [`MessageSession::close`] on the way out. A session that is
/// never closed expires on the service side, and until then a new one for
/// the same scale set gets [`ActionsError::SessionConflict`].
pub struct MessageSession {
    /// Replaced whole when the credentials change
    /// ([`MessageSession::use_client`]); calls take a clone.
    client: Mutex<ActionsClient>,
    scale_set_id: i64,
    /// The current session, swapped whole on refresh. Callers take a
    /// snapshot and make their call without holding the lock.
    session: Mutex<Arc<RunnerScaleSetSession>>,
    /// Where acquire-jobs goes: the Actions service URL the session was
    /// opened at. Kept here so that acquiring jobs, like polling, needs
    /// nothing but the session: asking the client for the admin token just
    /// to build this URL would make every acquisition wait whenever the
    /// admin token is being renewed, which is when GitHub is slow.
    acquire_jobs_url: Url,
}

impl fmt::Debug for MessageSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MessageSession")
            .field("scale_set_id", &self.scale_set_id)
            .field("session", &self.snapshot())
            .finish()
    }
}

impl MessageSession {
    pub(crate) fn new(
        client: ActionsClient,
        scale_set_id: i64,
        session: RunnerScaleSetSession,
        acquire_jobs_url: Url,
    ) -> Self {
        Self {
            client: Mutex::new(client),
            scale_set_id,
            session: Mutex::new(Arc::new(session)),
            acquire_jobs_url,
        }
    }

    fn client(&self) -> ActionsClient {
        self.client
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Makes the session's calls with `client` from now on: the same
    /// session (its id, its queue token, the messages the service holds
    /// for it) with the credentials its scale set has now. The session
    /// belongs to the scale set, not to the credentials that opened it.
    pub fn use_client(&self, client: ActionsClient) {
        *self.client.lock().unwrap_or_else(PoisonError::into_inner) = client;
    }

    fn snapshot(&self) -> Arc<RunnerScaleSetSession> {
        self.session
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The scale set the session belongs to.
    pub fn scale_set_id(&self) -> i64 {
        self.scale_set_id
    }

    /// The session id.
    pub fn id(&self) -> String {
        self.snapshot().session_id.clone()
    }

    /// The session as last created or refreshed.
    pub fn session(&self) -> Arc<RunnerScaleSetSession> {
        self.snapshot()
    }

    /// The statistics the session came with: what to scale on before the
    /// first message arrives.
    pub fn statistics(&self) -> Option<RunnerScaleSetStatistic> {
        self.snapshot().statistics
    }

    /// Refreshes the session, which renews its queue token.
    pub async fn refresh(&self) -> Result<(), ActionsError> {
        let current = self.snapshot();
        let fresh = self
            .client()
            .refresh_session(self.scale_set_id, &current.session_id)
            .await?;
        *self.session.lock().unwrap_or_else(PoisonError::into_inner) = Arc::new(fresh);
        Ok(())
    }

    /// Deletes the session so another listener can open one at once.
    pub async fn close(self) -> Result<(), ActionsError> {
        let current = self.snapshot();
        self.client()
            .delete_session(self.scale_set_id, &current.session_id)
            .await
    }

    /// Makes a queue call, refreshing the session and trying once more if
    /// the queue token has expired.
    async fn with_queue_token<F, Fut>(&self, call: F) -> Result<Response, ActionsError>
    where
        F: Fn(Arc<RunnerScaleSetSession>) -> Fut,
        Fut: Future<Output = Result<Response, ActionsError>>,
    {
        match call(self.snapshot()).await {
            Err(ActionsError::QueueTokenExpired { operation }) => {
                tracing::debug!(operation = %operation, "message queue token expired; refreshing the session");
                self.refresh().await?;
                call(self.snapshot()).await
            }
            other => other,
        }
    }

    /// Long-polls for the next message after `last_message_id` (0 for the
    /// first poll). `None` means the poll ended with nothing to deliver.
    ///
    /// `max_capacity` is how many more jobs the listener could take; the
    /// service uses it to hold back jobs a full scale set cannot run.
    pub async fn get_message(
        &self,
        last_message_id: i64,
        max_capacity: u32,
    ) -> Result<Option<Message>, ActionsError> {
        let op = Operation::GetMessage;
        let timeout = self.client().options().message_timeout;
        let capacity = HeaderValue::from(max_capacity);
        let response = self
            .with_queue_token(|session| {
                let capacity = capacity.clone();
                async move {
                    let mut url = parse_queue_url(&session.message_queue_url, op)?;
                    if last_message_id > 0 {
                        url.query_pairs_mut()
                            .append_pair("lastMessageId", &last_message_id.to_string());
                    }
                    let headers = vec![(HeaderName::from_static(MAX_CAPACITY_HEADER), capacity)];
                    let request = QueueRequest {
                        operation: op,
                        method: Method::GET,
                        url,
                        headers,
                        body: None,
                        timeout,
                    };
                    self.client()
                        .queue_call(request, &session.message_queue_access_token)
                        .await
                }
            })
            .await?;
        if response.status == 202
            || response.status == 204
            || response.body.iter().all(u8::is_ascii_whitespace)
        {
            return Ok(None);
        }
        let envelope: MessageEnvelope = response.json(op)?;
        envelope
            .decode()
            .map(Some)
            .map_err(|reason| ActionsError::Decode {
                operation: op,
                reason,
            })
    }

    /// Acknowledges a message so it is not delivered again.
    pub async fn delete_message(&self, message_id: i64) -> Result<(), ActionsError> {
        let op = Operation::DeleteMessage;
        let timeout = self.client().options().timeout;
        self.with_queue_token(|session| async move {
            let mut url = parse_queue_url(&session.message_queue_url, op)?;
            let path = format!("{}/{message_id}", url.path().trim_end_matches('/'));
            url.set_path(&path);
            let request = QueueRequest {
                operation: op,
                method: Method::DELETE,
                url,
                headers: Vec::new(),
                body: None,
                timeout,
            };
            self.client()
                .queue_call(request, &session.message_queue_access_token)
                .await
        })
        .await?;
        Ok(())
    }

    /// Claims available jobs by their `runnerRequestId`s and returns the ids
    /// the service actually handed over (others were taken elsewhere or
    /// canceled).
    ///
    /// Authorised by the session's queue token and addressed with the
    /// session's own service URL, so it never waits for an admin token
    /// bootstrap.
    pub async fn acquire_jobs(&self, request_ids: &[i64]) -> Result<Vec<i64>, ActionsError> {
        let op = Operation::AcquireJobs;
        if request_ids.is_empty() {
            return Ok(Vec::new());
        }
        let timeout = self.client().options().timeout;
        let body = serde_json::to_vec(request_ids).map_err(|e| ActionsError::Decode {
            operation: op,
            reason: e.to_string(),
        })?;
        let url = &self.acquire_jobs_url;
        let response = self
            .with_queue_token(|session| {
                let (url, body) = (url.clone(), body.clone());
                async move {
                    let request = QueueRequest {
                        operation: op,
                        method: Method::POST,
                        url,
                        headers: Vec::new(),
                        body: Some(body),
                        timeout,
                    };
                    self.client()
                        .queue_call(request, &session.message_queue_access_token)
                        .await
                }
            })
            .await?;
        let list: ListResponse<i64> = response.json(op)?;
        Ok(list.value)
    }
}

fn parse_queue_url(url: &str, operation: Operation) -> Result<Url, ActionsError> {
    Url::parse(url).map_err(|e| ActionsError::Decode {
        operation,
        reason: format!("the message queue URL is invalid: {e}"),
    })
}
