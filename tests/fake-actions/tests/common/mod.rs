//! A raw-HTTP client of the fake for its own tests: each call spelled out as
//! the protocol has it, so these tests check the fake, not a client library.

#![allow(dead_code)]

use std::time::Duration;

use base64::Engine as _;
use fake_actions::{FakeActions, FakeConfig};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

pub fn http() -> reqwest::Client {
    // reqwest is built without a default TLS provider; plain HTTP needs none,
    // but the builder still wants one installed.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("an HTTP client")
}

pub async fn start(config: FakeConfig) -> FakeActions {
    FakeActions::start(config).await.expect("the fake starts")
}

pub async fn fake() -> FakeActions {
    start(FakeConfig::default()).await
}

/// A response read whole: status, headers and JSON body (if any).
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: reqwest::header::HeaderMap,
    pub raw: Vec<u8>,
    pub json: Value,
}

impl Answer {
    pub fn type_name(&self) -> &str {
        self.json["typeName"].as_str().unwrap_or_default()
    }
}

pub async fn call(
    http: &reqwest::Client,
    method: Method,
    url: &str,
    auth: Option<&str>,
    body: Option<Value>,
) -> Answer {
    let mut request = http.request(method, url);
    if let Some(auth) = auth {
        request = request.header("Authorization", auth);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    read(request.send().await.expect("the request is answered")).await
}

/// A response read whole, a BOM before JSON tolerated.
async fn read(response: reqwest::Response) -> Answer {
    let status = response.status();
    let headers = response.headers().clone();
    let raw = response.bytes().await.expect("a body").to_vec();
    let text = String::from_utf8_lossy(&raw);
    let json = serde_json::from_str(text.trim_start_matches('\u{feff}')).unwrap_or(Value::Null);
    Answer {
        status,
        headers,
        raw,
        json,
    }
}

/// What runner-registration hands a client: the service base and admin token.
#[derive(Debug, Clone)]
pub struct Admin {
    pub base: String,
    pub token: String,
}

impl Admin {
    pub fn bearer(&self) -> String {
        format!("Bearer {}", self.token)
    }

    /// `{base}_apis/{path}?api-version=6.0-preview` (or `&api-version` when
    /// the path has a query).
    pub fn url(&self, path: &str) -> String {
        let sep = if path.contains('?') { '&' } else { '?' };
        format!("{}_apis/{path}{sep}api-version=6.0-preview", self.base)
    }

    pub async fn call(
        &self,
        http: &reqwest::Client,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Answer {
        call(http, method, &self.url(path), Some(&self.bearer()), body).await
    }
}

/// Registration token with the PAT, then runner-registration, for `/org`.
pub async fn register(http: &reqwest::Client, fake: &FakeActions, org: &str) -> Admin {
    let pat = format!("Bearer {}", fake.pat());
    let token = call(
        http,
        Method::POST,
        &format!(
            "{}/api/v3/orgs/{org}/actions/runners/registration-token",
            fake.url()
        ),
        Some(&pat),
        None,
    )
    .await;
    assert_eq!(token.status, StatusCode::CREATED, "{token:?}");
    let registration = call(
        http,
        Method::POST,
        &format!("{}/api/v3/actions/runner-registration", fake.url()),
        Some(&format!(
            "RemoteAuth {}",
            token.json["token"].as_str().unwrap()
        )),
        Some(json!({"url": fake.org_url(org), "runner_event": "register"})),
    )
    .await;
    assert_eq!(registration.status, StatusCode::OK, "{registration:?}");
    Admin {
        base: registration.json["url"].as_str().unwrap().to_owned(),
        token: registration.json["token"].as_str().unwrap().to_owned(),
    }
}

/// The claims of a JWT, read without verification, as clients do.
pub fn jwt_claims(token: &str) -> Value {
    let payload = token.split('.').nth(1).expect("a JWT has three parts");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .expect("base64url");
    serde_json::from_slice(&bytes).expect("JSON claims")
}

/// Creates a scale set and returns its id.
pub async fn scale_set(http: &reqwest::Client, admin: &Admin, name: &str, labels: &[&str]) -> u64 {
    let labels: Vec<Value> = labels
        .iter()
        .map(|l| json!({"type": "System", "name": l}))
        .collect();
    let created = admin
        .call(
            http,
            Method::POST,
            "runtime/runnerscalesets",
            Some(json!({"name": name, "runnerGroupId": 1, "labels": labels,
                        "RunnerSetting": {"disableUpdate": true}})),
        )
        .await;
    assert_eq!(created.status, StatusCode::OK, "{created:?}");
    created.json["id"].as_u64().unwrap()
}

/// A JIT config for a new runner: (runner id, encoded config).
pub async fn jit(http: &reqwest::Client, admin: &Admin, set: u64, name: &str) -> (u64, String) {
    let answer = admin
        .call(
            http,
            Method::POST,
            &format!("runtime/runnerscalesets/{set}/generatejitconfig"),
            Some(json!({"name": name, "workFolder": "_work"})),
        )
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    (
        answer.json["runner"]["id"].as_u64().unwrap(),
        answer.json["encodedJITConfig"].as_str().unwrap().to_owned(),
    )
}

/// A message session: (session id, queue URL, queue token).
pub struct Session {
    pub id: String,
    pub queue_url: String,
    pub token: String,
    pub json: Value,
}

impl Session {
    pub fn bearer(&self) -> String {
        format!("Bearer {}", self.token)
    }

    /// GetMessage as the client does it.
    pub async fn get(&self, http: &reqwest::Client, last: u64) -> Answer {
        call(
            http,
            Method::GET,
            &self.poll_url(last),
            Some(&self.bearer()),
            None,
        )
        .await
    }

    /// GetMessage as a listener does it, telling the service its capacity
    /// in `X-ScaleSetMaxCapacity`.
    pub async fn poll(&self, http: &reqwest::Client, last: u64, capacity: u64) -> Answer {
        let response = http
            .get(self.poll_url(last))
            .header("Authorization", self.bearer())
            .header("X-ScaleSetMaxCapacity", capacity.to_string())
            .send()
            .await
            .expect("the poll is answered");
        read(response).await
    }

    fn poll_url(&self, last: u64) -> String {
        if last > 0 {
            format!("{}?lastMessageId={last}", self.queue_url)
        } else {
            self.queue_url.clone()
        }
    }

    pub async fn delete(&self, http: &reqwest::Client, id: u64) -> Answer {
        let url = format!("{}/{id}", self.queue_url);
        call(http, Method::DELETE, &url, Some(&self.bearer()), None).await
    }

    pub async fn acquire(
        &self,
        http: &reqwest::Client,
        admin: &Admin,
        set: u64,
        ids: &[u64],
    ) -> Answer {
        let url = admin.url(&format!("runtime/runnerscalesets/{set}/acquirejobs"));
        call(
            http,
            Method::POST,
            &url,
            Some(&self.bearer()),
            Some(json!(ids)),
        )
        .await
    }
}

pub async fn session(http: &reqwest::Client, admin: &Admin, set: u64) -> Session {
    let answer = admin
        .call(
            http,
            Method::POST,
            &format!("runtime/runnerscalesets/{set}/sessions"),
            Some(json!({"sessionId": "00000000-0000-0000-0000-000000000000", "ownerName": "test"})),
        )
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    Session {
        id: answer.json["sessionId"].as_str().unwrap().to_owned(),
        queue_url: answer.json["messageQueueUrl"].as_str().unwrap().to_owned(),
        token: answer.json["messageQueueAccessToken"]
            .as_str()
            .unwrap()
            .to_owned(),
        json: answer.json,
    }
}

/// The job messages inside a message's `body` string.
pub fn items(message: &Value) -> Vec<Value> {
    let body = message["body"].as_str().expect("body is a JSON string");
    serde_json::from_str(body).expect("body holds a JSON array")
}

pub fn kinds(message: &Value) -> Vec<String> {
    items(message)
        .iter()
        .map(|m| m["messageType"].as_str().unwrap().to_owned())
        .collect()
}

/// A runner-facing call with the JIT config.
pub async fn runner(http: &reqwest::Client, fake: &FakeActions, what: &str, jit: &str) -> Answer {
    call(
        http,
        Method::POST,
        &format!("{}/_runner/{what}", fake.url()),
        None,
        Some(json!({"jitConfig": jit})),
    )
    .await
}
