//! Where a listener gets its Actions client, and gets it again.
//!
//! A listener lives as long as its scale set, which outlives credentials:
//! a platform team rotates a GitHub App key or a PAT by editing the
//! scale set's Secret, and revokes the old one. A listener that kept the
//! client it started with would, from the revocation on, fail every call
//! that needs the admin token (opening or refreshing its message session,
//! which it must do whenever the queue token expires) until the host was
//! restarted: no job of the scale set acquired, no runner created, and
//! only a status condition to say why.
//!
//! So the listener asks its [`ListenerClient`] again whenever the service
//! refuses its credentials, and before every new session. The answer is
//! put into the session it already has: the session id and its queue
//! token stay valid across a credential change, and keeping the session
//! keeps the messages the service holds for it. The production one is
//! [`CachedClient`], the scale set's target in the host's shared client
//! cache, which reads the Secret and builds a new client only when the
//! Secret changed; a credential that changes without the old one being
//! revoked is used from the next session on (no read of the Secret per
//! poll).

use std::future::Future;

use crate::actions::ActionsClient;
use crate::credentials::{ActionsClientSource, ActionsClients, GitHubTarget};

/// Gives a listener the Actions client of its scale set, asked again
/// whenever the service refuses its credentials. Unlike
/// [`ActionsClientSource`], which gives a client for any target, it is
/// bound to one scale set's target, so a listener needs to know nothing
/// of where the credentials live.
pub trait ListenerClient: Send + Sync + 'static {
    /// The client to use from now on; an error says why there is none
    /// (the Secret is missing or unusable), and the listener retries.
    fn client(&self) -> impl Future<Output = Result<ActionsClient, String>> + Send;
}

/// A client whose credentials never change.
impl ListenerClient for ActionsClient {
    async fn client(&self) -> Result<ActionsClient, String> {
        Ok(self.clone())
    }
}

/// The scale set's client as its Secret holds the credentials now, through
/// the host's client cache.
#[derive(Clone, Debug)]
pub struct CachedClient {
    /// The host's client cache.
    pub clients: ActionsClients,
    /// The scale set's configuration URL and Secret.
    pub target: GitHubTarget,
}

impl ListenerClient for CachedClient {
    async fn client(&self) -> Result<ActionsClient, String> {
        ActionsClientSource::client(&self.clients, &self.target)
            .await
            .map_err(|error| error.to_string())
    }
}
