//! The Slack Web API, as much of it as arcwright uses: `chat.postMessage`.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret as KubeSecret;
use kube::{Api, Client};
use serde::Deserialize;
use url::Url;

use super::SlackError;
use crate::actions::{ClientOptions, Secret, build_http};
use crate::api::SecretKeyRef;
use crate::api::ephemeral_runner::SlackMessage;

/// The key of the bot token in its Secret when the reference names none.
pub const DEFAULT_TOKEN_KEY: &str = "token";

/// One Slack Web API endpoint and an HTTP client for it; shared by every
/// scale set (each brings its own token).
#[derive(Clone, Debug)]
pub struct SlackClient {
    http: reqwest::Client,
    api_url: Url,
    timeout: Duration,
}

#[derive(Deserialize)]
struct Answer {
    ok: bool,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    ts: Option<String>,
    #[serde(default)]
    channel: Option<String>,
}

impl SlackClient {
    /// A client for the Web API at `api_url` (`https://slack.com/api/`, or a
    /// fake's); proxies come from the environment as for the Actions client.
    pub fn new(api_url: Url) -> Result<Self, SlackError> {
        let timeout = Duration::from_secs(10);
        let http = build_http(&ClientOptions {
            timeout,
            ..ClientOptions::default()
        })
        .map_err(|e| SlackError::Setup(e.to_string()))?;
        let api_url = if api_url.path().ends_with('/') {
            api_url
        } else {
            let mut with_slash = api_url;
            with_slash.set_path(&format!("{}/", with_slash.path()));
            with_slash
        };
        Ok(Self {
            http,
            api_url,
            timeout,
        })
    }

    /// Posts `text` (the notification's fallback) with `blocks` to
    /// `channel`; returns the message as Slack names it (the channel's id
    /// and the message's timestamp id).
    pub async fn post_message(
        &self,
        token: &Secret,
        channel: &str,
        text: &str,
        blocks: serde_json::Value,
    ) -> Result<SlackMessage, SlackError> {
        const METHOD: &str = "chat.postMessage";
        let url = self
            .api_url
            .join(METHOD)
            .map_err(|e| SlackError::Setup(e.to_string()))?;
        let response = self
            .http
            .post(url)
            .timeout(self.timeout)
            .bearer_auth(token.expose())
            .json(&serde_json::json!({
                "channel": channel,
                "text": text,
                "blocks": blocks,
                "unfurl_links": false,
            }))
            .send()
            .await
            .map_err(|source| SlackError::Unreachable {
                method: METHOD,
                source,
            })?;
        let status = response.status();
        if !status.is_success() {
            return Err(SlackError::Status {
                method: METHOD,
                status: status.as_u16(),
            });
        }
        let answer: Answer = response
            .json()
            .await
            .map_err(|source| SlackError::Unreachable {
                method: METHOD,
                source,
            })?;
        if !answer.ok {
            return Err(SlackError::Api {
                method: METHOD,
                error: answer.error.unwrap_or_else(|| "unknown_error".into()),
            });
        }
        Ok(SlackMessage {
            channel: answer.channel.unwrap_or_else(|| channel.to_owned()),
            ts: answer.ts.unwrap_or_default(),
        })
    }
}

/// Reads the bot token from the Secret `reference` names in `namespace`.
pub async fn read_token(
    client: &Client,
    namespace: &str,
    reference: &SecretKeyRef,
) -> Result<Secret, SlackError> {
    let key = reference.key.as_deref().unwrap_or(DEFAULT_TOKEN_KEY);
    let secrets: Api<KubeSecret> = Api::namespaced(client.clone(), namespace);
    let secret = secrets
        .get_opt(&reference.name)
        .await
        .map_err(|e| SlackError::Token(format!("reading Secret {}: {e}", reference.name)))?
        .ok_or_else(|| SlackError::Token(format!("Secret {} does not exist", reference.name)))?;
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| b.0.clone())
        .ok_or_else(|| SlackError::Token(format!("Secret {} has no key {key}", reference.name)))?;
    let token = String::from_utf8(bytes).map_err(|_| {
        SlackError::Token(format!(
            "key {key} of Secret {} is not text",
            reference.name
        ))
    })?;
    let token = token.trim();
    if token.is_empty() {
        return Err(SlackError::Token(format!(
            "key {key} of Secret {} is empty",
            reference.name
        )));
    }
    Ok(Secret::new(token))
}
