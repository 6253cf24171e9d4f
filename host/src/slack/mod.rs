//! Telling Slack about held failures, and taking the Extend / Release
//! buttons back (meows' Slack agent, without its separate deployment).
//!
//! - [`client`]: the Web API, `chat.postMessage` with a bot token; the only
//!   place the token is sent, and it is never logged.
//! - [`message`]: what a held failure looks like in Slack (Block Kit), as a
//!   pure function.
//! - [`signature`]: Slack's `v0` request signature, checked before anything
//!   in a request is read.
//! - [`interactions`]: the HTTP endpoint the buttons post to; it writes the
//!   runner's `arcwright.dev/hold-until` annotation and nothing else.
//!
//! Slack is told off the reconcile path, so a slow or absent Slack never
//! delays a runner, and at least once per hold: a post Slack refused, or
//! one a restart cut off, is made again while the runner is held, and the
//! runner's `SlackNotified` condition records when Slack accepted it
//! (`controllers::ephemeral_runner::notify`). The post is what brings
//! someone to the runner before its hold ends; a duplicate, only possible
//! when the host stops between Slack's answer and the condition's write,
//! costs a line in a channel.

pub mod client;
pub mod interactions;
pub mod message;
pub mod signature;

use std::time::Duration;

pub use client::SlackClient;
pub use interactions::{InteractionsConfig, router};
pub use message::HeldFailure;

/// Slack's Web API.
pub const DEFAULT_API_URL: &str = "https://slack.com/api/";

/// How much later the Extend button moves a hold's end (capped by the scale
/// set's `maxHold`): long enough to be worth a click, short enough that a
/// forgotten hold is not kept for the day.
pub const DEFAULT_EXTEND_BY: Duration = Duration::from_secs(30 * 60);

/// Everything that can go wrong talking to Slack. Never carries a token.
#[derive(Debug, thiserror::Error)]
pub enum SlackError {
    /// The HTTP client could not be built.
    #[error("the Slack HTTP client cannot be built: {0}")]
    Setup(String),
    /// The request did not get an answer.
    #[error("Slack did not answer {method}: {source}")]
    Unreachable {
        /// The Web API method.
        method: &'static str,
        /// Why.
        #[source]
        source: reqwest::Error,
    },
    /// Slack answered with an HTTP error (429 when rate-limited).
    #[error("Slack refused {method} with HTTP {status}")]
    Status {
        /// The Web API method.
        method: &'static str,
        /// The HTTP status.
        status: u16,
    },
    /// Slack answered `ok: false` (`channel_not_found`, `invalid_auth`...).
    #[error("Slack refused {method}: {error}")]
    Api {
        /// The Web API method.
        method: &'static str,
        /// Slack's error code.
        error: String,
    },
    /// The bot token could not be read from its Secret.
    #[error("the Slack bot token cannot be read: {0}")]
    Token(String),
}

impl SlackError {
    /// A stable label for logs and events.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Setup(_) => "setup",
            Self::Unreachable { .. } => "unreachable",
            Self::Status { .. } => "status",
            Self::Api { .. } => "api",
            Self::Token(_) => "token",
        }
    }
}
