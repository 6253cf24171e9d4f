//! The GitHub Actions service client.
//!
//! Everything arcwright says to GitHub goes through [`ActionsClient`]: the
//! bootstrap that turns a PAT or a GitHub App into an Actions service admin
//! token, scale sets, JIT runner configurations, runner registrations, and
//! the message sessions listeners long-poll ([`MessageSession`]).
//!
//! The protocol is the one ARC's Go client (`actions/scaleset`) speaks, down
//! to the JSON field names ([`types`]), with the choices it leaves to callers
//! made here once: every call has a timeout and bounded, jittered retries
//! of what is safe to repeat ([`retry`]), the service's `{typeName, message}`
//! errors become typed [`ActionsError`] variants, the admin token is renewed
//! in the background before it expires (calls that have a usable token, and
//! every call on a message session, never wait for a bootstrap), an expired
//! queue token costs one refresh, not a failed poll, and proxies come from
//! the environment unless [`ProxyConfig`] says otherwise.
//!
//! Tokens, private keys and JIT configurations are held in [`Secret`], whose
//! `Debug` is redacted and which has no `Display`; errors carry no request
//! URLs or headers, and service messages are scrubbed of the tokens the
//! request carried.

pub mod auth;
pub(crate) mod client;
pub mod config_url;
pub(crate) mod error;
pub mod hosts;
pub mod metrics;
mod operation;
pub mod retry;
mod session;
pub mod types;

pub use auth::{AdminToken, AppCredentials, Credentials, Secret};
pub(crate) use client::build_http;
pub use client::{API_VERSION, ActionsClient, ClientOptions, ProxyAuth, ProxyConfig, SystemInfo};
pub use config_url::{ConfigUrl, Scope};
pub use error::ActionsError;
pub use metrics::ActionsMetrics;
pub use operation::Operation;
pub use retry::RetryPolicy;
pub use session::MessageSession;
pub use types::{
    JitConfig, JitRunnerSetting, JobInfo, JobMessage, Label, Message, RunnerGroup, RunnerReference,
    RunnerScaleSet, RunnerScaleSetSession, RunnerScaleSetStatistic, RunnerSetting,
};
