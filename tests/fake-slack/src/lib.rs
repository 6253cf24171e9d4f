//! A fake of the Slack side of arcwright's Slack integration, over real
//! HTTP on 127.0.0.1:
//!
//! - [`FakeSlack`] serves `POST /api/chat.postMessage` like the Web API:
//!   `{"ok": true, "channel": <id>, "ts": ...}` (a timestamp id per
//!   message) for the bot token it was started with,
//!   `{"ok": false, "error": "invalid_auth"}` for any other, and records
//!   every post (token, body) for the test to read. [`FakeSlack::refuse_next`]
//!   makes it answer `ratelimited` for a while, as Slack does when it sheds
//!   load.
//! - [`Interaction`] sends a button press to an interactivity endpoint the
//!   way Slack does: form-encoded `payload=<json>`, with Slack's `v0`
//!   signature headers made from a signing secret, or deliberately without
//!   them, with another secret, or with an old timestamp.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;
use tokio::sync::watch;

/// One `chat.postMessage` call.
#[derive(Clone, Debug, PartialEq)]
pub struct Post {
    /// The bearer token it carried, if any.
    pub token: Option<String>,
    /// Its JSON body.
    pub body: Value,
    /// Whether the fake accepted it (the token was right).
    pub accepted: bool,
}

struct Shared {
    bot_token: String,
    /// Posts still to be refused with `ratelimited`.
    refusals: Mutex<usize>,
    posts: Mutex<Vec<Post>>,
    changed: watch::Sender<usize>,
}

/// The fake Web API. Stops when dropped.
pub struct FakeSlack {
    addr: SocketAddr,
    shared: Arc<Shared>,
    server: tokio::task::JoinHandle<()>,
}

impl FakeSlack {
    /// Starts on a free port of 127.0.0.1, accepting `bot_token`.
    pub async fn start(bot_token: &str) -> std::io::Result<FakeSlack> {
        let shared = Arc::new(Shared {
            bot_token: bot_token.to_string(),
            refusals: Mutex::new(0),
            posts: Mutex::new(Vec::new()),
            changed: watch::channel(0).0,
        });
        let app = axum::Router::new()
            .route("/api/chat.postMessage", post(post_message))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(FakeSlack {
            addr,
            shared,
            server,
        })
    }

    /// The Web API base URL to configure (`http://127.0.0.1:PORT/api/`).
    pub fn api_url(&self) -> String {
        format!("http://{}/api/", self.addr)
    }

    /// Refuses the next `count` posts (with the right token) with
    /// `{"ok": false, "error": "ratelimited"}`; they are recorded as not
    /// accepted.
    pub fn refuse_next(&self, count: usize) {
        *self
            .shared
            .refusals
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = count;
    }

    /// Every post so far.
    pub fn posts(&self) -> Vec<Post> {
        self.shared
            .posts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Waits until `count` posts arrived; returns them, or what there was
    /// at the timeout.
    pub async fn wait_for_posts(
        &self,
        count: usize,
        timeout: Duration,
    ) -> Result<Vec<Post>, Vec<Post>> {
        let mut changes = self.shared.changed.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let posts = self.posts();
            if posts.len() >= count {
                return Ok(posts);
            }
            if tokio::time::timeout_at(deadline, changes.changed())
                .await
                .is_err()
            {
                return Err(self.posts());
            }
        }
    }
}

impl Drop for FakeSlack {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn post_message(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Json<Value> {
    let token = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(String::from);
    let authorised = token.as_deref() == Some(shared.bot_token.as_str());
    let refused = authorised && {
        let mut refusals = shared
            .refusals
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let refused = *refusals > 0;
        *refusals = refusals.saturating_sub(1);
        refused
    };
    let accepted = authorised && !refused;
    let answer = if !authorised {
        json!({"ok": false, "error": "invalid_auth"})
    } else if refused {
        json!({"ok": false, "error": "ratelimited"})
    } else if body["channel"].as_str().is_none_or(str::is_empty) {
        json!({"ok": false, "error": "channel_not_found"})
    } else {
        json!({"ok": true})
    };
    let (count, answer) = {
        let mut posts = shared.posts.lock().unwrap_or_else(PoisonError::into_inner);
        let mut answer = answer;
        if accepted {
            // As Slack: the channel by its id, whatever name the post gave,
            // and a timestamp id of the message's own.
            answer["channel"] = json!(channel_id(body["channel"].as_str().unwrap_or_default()));
            answer["ts"] = json!(format!("1700000000.{:06}", posts.len() + 1));
        }
        posts.push(Post {
            token,
            body,
            accepted,
        });
        (posts.len(), answer)
    };
    shared.changed.send_replace(count);
    Json(answer)
}

/// The id the fake gives the channel `name` (`#ci-failures` is
/// `CCI-FAILURES`), as Slack answers a post with the channel's id.
pub fn channel_id(name: &str) -> String {
    format!("C{}", name.trim_start_matches('#').to_uppercase())
}

/// How an interaction is signed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Signing {
    /// With this signing secret, as Slack does.
    With(String),
    /// With no signature headers at all.
    Unsigned,
}

/// A button press, as Slack sends it to an interactivity endpoint.
#[derive(Clone, Debug)]
pub struct Interaction {
    /// The `payload` JSON.
    pub payload: Value,
    /// How it is signed.
    pub signing: Signing,
    /// Its `X-Slack-Request-Timestamp`, in Unix seconds.
    pub timestamp: i64,
}

impl Interaction {
    /// A press of the button `action_id` carrying `value`, by user `U0TEST`,
    /// signed with `secret`, timestamped now.
    pub fn press(action_id: &str, value: &str, secret: &str) -> Interaction {
        Interaction {
            // Every press of a real button has a trigger id and an action
            // timestamp of its own, so no two presses are the same request.
            payload: json!({
                "type": "block_actions",
                "trigger_id": format!("{:016x}", rand::random::<u64>()),
                "user": {"id": "U0TEST", "username": "tester"},
                "actions": [{
                    "action_id": action_id,
                    "value": value,
                    "type": "button",
                    "action_ts": format!("{}.{:06}", jiff::Timestamp::now().as_second(), rand::random::<u32>() % 1_000_000),
                }],
            }),
            signing: Signing::With(secret.to_string()),
            timestamp: jiff::Timestamp::now().as_second(),
        }
    }

    /// The same press, of a button in the message `ts` of `channel` (by
    /// id), as Slack says where the button was.
    pub fn in_message(mut self, channel: &str, ts: &str) -> Interaction {
        self.payload["container"] = json!({
            "type": "message",
            "channel_id": channel,
            "message_ts": ts,
        });
        self
    }

    /// The same press, unsigned.
    pub fn unsigned(mut self) -> Interaction {
        self.signing = Signing::Unsigned;
        self
    }

    /// The same press, signed with another secret.
    pub fn signed_with(mut self, secret: &str) -> Interaction {
        self.signing = Signing::With(secret.to_string());
        self
    }

    /// The same press, sent `age` ago (a replay), correctly signed for
    /// that time.
    pub fn aged(mut self, age: Duration) -> Interaction {
        self.timestamp -= i64::try_from(age.as_secs()).unwrap_or(i64::MAX);
        self
    }

    /// Posts it to `url`; returns the HTTP status.
    pub async fn send(&self, url: &str) -> reqwest::Result<u16> {
        let body = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("payload", &self.payload.to_string())
            .finish();
        // reqwest is built without a TLS provider; plain HTTP still needs one installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut request = reqwest::Client::new()
            .post(url)
            .header("content-type", "application/x-www-form-urlencoded");
        if let Signing::With(secret) = &self.signing {
            request = request
                .header("x-slack-request-timestamp", self.timestamp.to_string())
                .header("x-slack-signature", sign(secret, self.timestamp, &body));
        }
        Ok(request.body(body).send().await?.status().as_u16())
    }
}

/// Slack's `v0` signature of `body` sent at `timestamp`.
pub fn sign(secret: &str, timestamp: i64, body: &str) -> String {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret.as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
    mac.update(format!("v0:{timestamp}:{body}").as_bytes());
    format!("v0={}", hex::encode(mac.finalize().into_bytes()))
}
