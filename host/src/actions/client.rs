//! `ActionsClient`: the HTTP half of the Actions protocol.
//!
//! Here: the client's options, the HTTP client, one call's attempts and
//! retries ([`ActionsClient::execute`]) and the endpoints. How the admin
//! token every service call needs is obtained, shared and renewed is in
//! `admin_token`.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::header::{
    ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER,
    USER_AGENT,
};
use jiff::Timestamp;
use reqwest::Method;
use serde::Serialize;
use serde::de::DeserializeOwned;
use url::Url;

use super::auth::{Credentials, Secret};
use super::error::{classify_response, strip_bom};
use super::retry::{History, Next, Outcome, RetryPolicy, next_step};
use super::session::MessageSession;
use super::types::{
    CreateSessionRequest, JitConfig, JitRunnerSetting, ListResponse, RunnerGroup, RunnerReference,
    RunnerScaleSet, RunnerScaleSetSession,
};
use super::{ActionsError, ActionsMetrics, ConfigUrl, Operation};

mod admin_token;

use admin_token::AdminSlot;

/// The Actions service API version every service call is made with.
pub const API_VERSION: &str = "6.0-preview";

/// Who is calling, sent as a JSON `User-Agent` so GitHub can tell
/// controllers, versions and scale sets apart when diagnosing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SystemInfo {
    /// The product (`arcwright`).
    pub system: String,
    /// The product version.
    pub version: String,
    /// The commit the product was built from.
    pub commit_sha: String,
    /// The scale set the client serves; 0 for a client shared by several.
    pub scale_set_id: i64,
    /// The part of the product making the calls (`controller`, `listener`).
    pub subsystem: String,
}

impl Default for SystemInfo {
    fn default() -> Self {
        Self {
            system: "arcwright".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            commit_sha: String::new(),
            scale_set_id: 0,
            subsystem: "controller".into(),
        }
    }
}

impl SystemInfo {
    fn user_agent(&self) -> String {
        #[derive(Serialize)]
        struct Agent<'a> {
            system: &'a str,
            version: &'a str,
            commit_sha: &'a str,
            scale_set_id: i64,
            subsystem: &'a str,
            build_version: &'a str,
            build_commit_sha: &'a str,
            kind: &'a str,
        }
        serde_json::to_string(&Agent {
            system: &self.system,
            version: &self.version,
            commit_sha: &self.commit_sha,
            scale_set_id: self.scale_set_id,
            subsystem: &self.subsystem,
            build_version: &self.version,
            build_commit_sha: &self.commit_sha,
            kind: "scaleset",
        })
        .unwrap_or_else(|_| "arcwright".into())
    }
}

/// An HTTP(S) proxy for every call the client makes, overriding the
/// environment's.
///
/// Without one ([`ClientOptions::proxy`] is `None`) the client takes its
/// proxies from `HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY` and `NO_PROXY`
/// (or their lower-case forms), read when the client is built, as Go's and
/// reqwest's clients do: a controller deployed behind a corporate proxy
/// works with the same environment as everything else in its pod. A
/// `ProxyConfig` replaces the environment entirely, so
/// `ProxyConfig::default()` means "connect directly, whatever the
/// environment says".
///
/// Each proxy has its own credentials, sent to it alone: the `http` and
/// `https` proxies may be different servers, and one's password must not
/// reach the other (nor any host reached directly).
#[derive(Clone, Default)]
pub struct ProxyConfig {
    /// The proxy for `http://` URLs.
    pub http: Option<String>,
    /// The proxy for `https://` URLs.
    pub https: Option<String>,
    /// Hosts (and `.domain` suffixes, IPs, CIDRs) reached directly.
    pub no_proxy: Vec<String>,
    /// Basic-auth credentials for the `http` proxy.
    pub http_auth: Option<ProxyAuth>,
    /// Basic-auth credentials for the `https` proxy.
    pub https_auth: Option<ProxyAuth>,
}

/// Basic-auth credentials for one proxy.
#[derive(Clone, Debug)]
pub struct ProxyAuth {
    /// The user name.
    pub username: String,
    /// The password, if the proxy wants one.
    pub password: Option<Secret>,
}

impl ProxyAuth {
    /// A user name and password.
    pub fn new(username: impl Into<String>, password: impl Into<String>) -> Self {
        Self {
            username: username.into(),
            password: Some(Secret::new(password)),
        }
    }
}

impl fmt::Debug for ProxyConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProxyConfig")
            .field("http", &self.http.as_deref().map(redact_userinfo))
            .field("https", &self.https.as_deref().map(redact_userinfo))
            .field("no_proxy", &self.no_proxy)
            .field("http_auth", &self.http_auth)
            .field("https_auth", &self.https_auth)
            .finish()
    }
}

/// Drops any `user:password@` from a URL before it is shown.
fn redact_userinfo(url: &str) -> String {
    match Url::parse(url) {
        Ok(mut u) => {
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.to_string()
        }
        Err(_) => "[unparsable URL]".into(),
    }
}

/// How the client behaves, beyond who it is and where it calls.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// What the `User-Agent` says.
    pub system_info: SystemInfo,
    /// The limit on each attempt of every call except the message long poll.
    pub timeout: Duration,
    /// The limit on each attempt of get-message. The service holds a long
    /// poll for about 50 s before answering 202, so this must be well above
    /// that or every empty poll becomes a timeout.
    pub message_timeout: Duration,
    /// When and how failed attempts are retried.
    pub retry: RetryPolicy,
    /// Extra trusted roots in PEM (a GitHub Enterprise Server with a private
    /// CA), added to the platform's roots.
    pub root_ca_pem: Option<String>,
    /// A proxy for every call; `None` takes the proxies from the
    /// environment (see [`ProxyConfig`]).
    pub proxy: Option<ProxyConfig>,
    /// Where every attempt is counted.
    pub metrics: ActionsMetrics,
    /// Whether calls may go over plain `http`. Off, every call to an `http`
    /// URL (the configuration URL, or a service or message-queue URL the
    /// service hands back) fails with [`ActionsError::PlainHttpRefused`]
    /// before anything is sent, so no token crosses a network in clear text
    /// because a manifest said `http://`. Tests and labs against a local
    /// fake turn it on.
    pub allow_plain_http: bool,
    /// The hosts calls may go to ([`super::hosts`]): every host unless
    /// told; `arcwright run` always tells.
    pub hosts: super::hosts::HostPolicy,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            system_info: SystemInfo::default(),
            timeout: Duration::from_secs(30),
            message_timeout: Duration::from_secs(90),
            retry: RetryPolicy::default(),
            root_ca_pem: None,
            proxy: None,
            metrics: ActionsMetrics::default(),
            allow_plain_http: false,
            hosts: super::hosts::HostPolicy::Any,
        }
    }
}

/// A client of GitHub and the Actions service for one credential and one
/// configuration URL.
///
/// Cheap to clone (the clones share the connection pool and the admin
/// token), and meant to be shared: one client serves every scale set of a
/// credential, so thousands of long polls ride one pool and one bootstrap.
///
/// Every call is bounded by a per-attempt timeout and retried with jittered
/// exponential backoff on connection errors, timeouts, 429 (honouring
/// `Retry-After`) and 5xx, as far as the call is safe to repeat
/// ([`retry::verdict`](super::retry::verdict)): a create is not repeated
/// after an answer that does not prove the service did not act.
///
/// The admin token is renewed in the background from five minutes before
/// its `exp` while calls go on using it; only calls that find no usable
/// token (none yet, within a minute of `exp`, or rejected by the service)
/// wait, and they share one bootstrap. Calls on a message session use the
/// session's own queue token and never wait for the admin token.
#[derive(Clone)]
pub struct ActionsClient {
    inner: Arc<Inner>,
}

struct Inner {
    http: reqwest::Client,
    config_url: ConfigUrl,
    credentials: Credentials,
    options: ClientOptions,
    user_agent: HeaderValue,
    /// The admin token and the bootstrap under way. The lock is never held
    /// across an await: a call takes the token or a ticket for the
    /// bootstrap's result, and lets go.
    admin: Mutex<AdminSlot>,
}

impl fmt::Debug for ActionsClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ActionsClient")
            .field("config_url", &self.inner.config_url.url().as_str())
            .field("credentials", &self.inner.credentials)
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

/// How a request is authorised.
enum Auth<'a> {
    /// `Authorization: Bearer <token>`.
    Bearer(&'a Secret),
    /// `Authorization: RemoteAuth <token>` (runner-registration only).
    RemoteAuth(&'a Secret),
}

/// One call, ready to be attempted as often as the retry policy allows.
struct Call<'a> {
    operation: Operation,
    method: Method,
    url: Url,
    auth: Auth<'a>,
    content_type: &'static str,
    accept: Option<&'static str>,
    headers: Vec<(HeaderName, HeaderValue)>,
    body: Option<Vec<u8>>,
    timeout: Duration,
}

/// A call authorised by a session's message queue token.
pub(crate) struct QueueRequest {
    pub(crate) operation: Operation,
    pub(crate) method: Method,
    pub(crate) url: Url,
    pub(crate) headers: Vec<(HeaderName, HeaderValue)>,
    pub(crate) body: Option<Vec<u8>>,
    pub(crate) timeout: Duration,
}

/// What an unsuccessful attempt came to, before it is turned into a retry
/// [`Outcome`] (which borrows the `Retry-After` header).
#[derive(Clone, Copy)]
enum AttemptKind {
    Status(u16),
    Connect,
    Transport,
    Certificate,
    Timeout,
}

/// Whether a transport error is the server's certificate being rejected.
fn is_certificate_error(error: &reqwest::Error) -> bool {
    matches!(
        find_rustls_error(error),
        Some(rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented)
    )
}

/// Finds rustls' error in a chain. It travels wrapped in `io::Error`s
/// (sometimes two deep) inside hyper's and reqwest's errors, and
/// `io::Error::source` skips the error it wraps, so wrapped errors are
/// searched through `get_ref` as well as `source`.
fn find_rustls_error<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a rustls::Error> {
    if let Some(found) = error.downcast_ref::<rustls::Error>() {
        return Some(found);
    }
    if let Some(inner) = error
        .downcast_ref::<std::io::Error>()
        .and_then(std::io::Error::get_ref)
        && let Some(found) = find_rustls_error(inner)
    {
        return Some(found);
    }
    error.source().and_then(find_rustls_error)
}

/// The JIT config a `generatejitconfig` answer holds, refused unless it
/// names a registration (an id above zero) and carries a configuration: a
/// registration recorded as id `0` reads as "never registered", and nobody
/// would ever remove it; an empty configuration starts a runner that can
/// only fail.
pub(crate) fn jit_config(response: &Response) -> Result<JitConfig, ActionsError> {
    let op = Operation::GenerateJitConfig;
    let jit: JitConfig = response.json(op)?;
    let refused = |reason: &str| ActionsError::Decode {
        operation: op,
        reason: reason.to_string(),
    };
    if jit.runner.id <= 0 {
        return Err(refused(
            "the answer names no registration (its runner id is not above 0)",
        ));
    }
    if jit.encoded_jit_config.expose().is_empty() {
        return Err(refused("the answer carries an empty JIT configuration"));
    }
    Ok(jit)
}

/// A successful response: its status and its body with any BOM removed.
pub(crate) struct Response {
    pub(crate) status: u16,
    pub(crate) body: Vec<u8>,
}

impl Response {
    pub(crate) fn json<T: DeserializeOwned>(
        &self,
        operation: Operation,
    ) -> Result<T, ActionsError> {
        serde_json::from_slice(&self.body).map_err(|e| ActionsError::Decode {
            operation,
            // serde_json quotes the offending value, and in a token or JIT
            // config response that value may be the secret itself.
            reason: if operation.response_carries_secret() {
                format!(
                    "{:?} error at line {} column {}",
                    e.classify(),
                    e.line(),
                    e.column()
                )
            } else {
                e.to_string()
            },
        })
    }
}

/// Makes sure rustls has a crypto provider. reqwest is built without one (to
/// keep aws-lc out of the build), so the ring provider is installed as the
/// process default; if something else installed one first, that one is used.
fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// Builds the HTTP client with the custom CA and proxy, if any.
pub(crate) fn build_http(options: &ClientOptions) -> Result<reqwest::Client, ActionsError> {
    ensure_crypto_provider();
    let mut builder = reqwest::Client::builder()
        .connect_timeout(options.timeout)
        .pool_idle_timeout(Duration::from_secs(90))
        // Redirects would carry the Authorization header to wherever the
        // Location points; the protocol has none, so none are followed.
        .redirect(reqwest::redirect::Policy::none());
    if let Some(pem) = &options.root_ca_pem {
        let certs = reqwest::Certificate::from_pem_bundle(pem.as_bytes()).map_err(|e| {
            ActionsError::ClientSetup(format!("the custom CA bundle cannot be read: {e}"))
        })?;
        if certs.is_empty() {
            return Err(ActionsError::ClientSetup(
                "the custom CA bundle holds no PEM certificate".into(),
            ));
        }
        builder = builder.tls_certs_merge(certs);
    }
    if let Some(proxy) = &options.proxy {
        // An explicit setting replaces the environment's, whole: a proxy
        // given for one scheme does not leave the other to HTTP_PROXY.
        builder = builder.no_proxy();
        let no_proxy = reqwest::NoProxy::from_string(&proxy.no_proxy.join(","));
        let configure = |p: reqwest::Proxy, auth: &Option<ProxyAuth>| {
            let p = match auth {
                Some(auth) => p.basic_auth(
                    &auth.username,
                    auth.password.as_ref().map(Secret::expose).unwrap_or(""),
                ),
                None => p,
            };
            p.no_proxy(no_proxy.clone())
        };
        if let Some(url) = &proxy.http {
            let p = reqwest::Proxy::http(url.as_str()).map_err(|_| {
                ActionsError::ClientSetup(format!(
                    "the http proxy URL {} is invalid",
                    redact_userinfo(url)
                ))
            })?;
            builder = builder.proxy(configure(p, &proxy.http_auth));
        }
        if let Some(url) = &proxy.https {
            let p = reqwest::Proxy::https(url.as_str()).map_err(|_| {
                ActionsError::ClientSetup(format!(
                    "the https proxy URL {} is invalid",
                    redact_userinfo(url)
                ))
            })?;
            builder = builder.proxy(configure(p, &proxy.https_auth));
        }
    }
    builder
        .build()
        .map_err(|e| ActionsError::ClientSetup(e.without_url().to_string()))
}

/// Adds `api-version` to a service URL unless it already has one.
pub(crate) fn with_api_version(mut url: Url) -> Url {
    if !url.query_pairs().any(|(k, _)| k == "api-version") {
        url.query_pairs_mut()
            .append_pair("api-version", API_VERSION);
    }
    url
}

/// The most bytes of an error response kept for its message. Longer bodies
/// (an HTML error page, or a server that never stops) are cut here: the
/// status already says the call failed, and a message this long helps no
/// one.
const ERROR_BODY_LIMIT: usize = 64 * 1024;

/// A response body read to at most a limit.
struct Capped {
    body: Vec<u8>,
    /// Whether the body went on past the limit (the rest is not read; the
    /// connection is dropped with the response).
    cut: bool,
}

/// Reads a body chunk by chunk and stops at `limit`, so memory is bounded
/// by what the call accepts rather than by what the server sends. A
/// `Content-Length` above the limit is refused before anything is read.
async fn read_capped(mut response: reqwest::Response, limit: usize) -> reqwest::Result<Capped> {
    if response
        .content_length()
        .is_some_and(|length| length > limit as u64)
    {
        return Ok(Capped {
            body: Vec::new(),
            cut: true,
        });
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        let room = limit - body.len();
        if chunk.len() > room {
            body.extend_from_slice(&chunk[..room]);
            return Ok(Capped { body, cut: true });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Capped { body, cut: false })
}

/// Replaces every occurrence of the given secrets in a service message, so
/// a service that echoes a token back in an error cannot leak it into ours.
fn scrub(text: &[u8], secrets: &[&Secret]) -> Vec<u8> {
    let mut text = String::from_utf8_lossy(text).into_owned();
    for secret in secrets {
        if secret.expose().len() >= 4 {
            text = text.replace(secret.expose(), "[redacted]");
        }
    }
    text.into_bytes()
}

fn header_str(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

impl ActionsClient {
    /// Builds a client. Nothing is called yet: the first call bootstraps.
    pub fn new(
        config_url: ConfigUrl,
        credentials: Credentials,
        options: ClientOptions,
    ) -> Result<Self, ActionsError> {
        if let Credentials::Token(token) = &credentials
            && token.is_empty()
        {
            return Err(ActionsError::InvalidCredentials(
                "the GitHub token is empty".into(),
            ));
        }
        if config_url.url().scheme() == "http" && !options.allow_plain_http {
            return Err(ActionsError::InvalidConfigUrl {
                url: config_url.url().to_string(),
                reason: "plain http would carry the credentials in clear text; use https \
                         (--allow-plain-http permits it in tests and labs)"
                    .into(),
            });
        }
        if let Err(reason) = options.hosts.check_config(config_url.url()) {
            return Err(ActionsError::InvalidConfigUrl {
                url: config_url.url().to_string(),
                reason,
            });
        }
        let http = build_http(&options)?;
        let user_agent =
            HeaderValue::from_str(&options.system_info.user_agent()).map_err(|_| {
                ActionsError::ClientSetup("the system info cannot be sent as a User-Agent".into())
            })?;
        Ok(Self {
            inner: Arc::new(Inner {
                http,
                config_url,
                credentials,
                options,
                user_agent,
                admin: Mutex::new(AdminSlot::default()),
            }),
        })
    }

    /// The configuration URL the client registers runners under.
    pub fn config_url(&self) -> &ConfigUrl {
        &self.inner.config_url
    }

    /// The options the client was built with.
    pub fn options(&self) -> &ClientOptions {
        &self.inner.options
    }

    /// Makes one call, retrying as the policy allows, and returns the first
    /// successful response or the error of the last attempt.
    async fn execute(&self, call: Call<'_>, secrets: &[&Secret]) -> Result<Response, ActionsError> {
        let policy = &self.inner.options.retry;
        let mut retries = 0u32;
        // Whether an earlier attempt may have been carried out although it
        // failed, which changes what a 404 or a 409 means (see `verdict`).
        let mut may_have_acted = false;
        let (auth_scheme, token) = match call.auth {
            Auth::Bearer(t) => ("Bearer", t),
            Auth::RemoteAuth(t) => ("RemoteAuth", t),
        };
        let mut authorization = HeaderValue::from_str(&format!("{auth_scheme} {}", token.expose()))
            .map_err(|_| {
                ActionsError::InvalidCredentials(
                    "a token holds characters not allowed in a header".into(),
                )
            })?;
        authorization.set_sensitive(true);
        if call.url.scheme() == "http" && !self.inner.options.allow_plain_http {
            let mut shown = call.url.clone();
            shown.set_query(None);
            return Err(ActionsError::PlainHttpRefused {
                operation: call.operation,
                url: shown.to_string(),
            });
        }
        if !self
            .inner
            .options
            .hosts
            .allows_call(self.inner.config_url.url(), &call.url)
        {
            return Err(ActionsError::HostRefused {
                operation: call.operation,
                host: call.url.host_str().unwrap_or_default().to_owned(),
            });
        }

        loop {
            let mut request = self
                .inner
                .http
                .request(call.method.clone(), call.url.clone())
                .header(USER_AGENT, self.inner.user_agent.clone())
                .header(AUTHORIZATION, authorization.clone())
                .header(CONTENT_TYPE, call.content_type);
            if let Some(accept) = call.accept {
                request = request.header(ACCEPT, accept);
            }
            for (name, value) in &call.headers {
                request = request.header(name.clone(), value.clone());
            }
            if let Some(body) = &call.body {
                request = request.body(body.clone());
            }
            let attempt = tokio::time::timeout(call.timeout, async {
                let response = request.send().await?;
                let status = response.status().as_u16();
                let headers = response.headers().clone();
                let limit = if (200..300).contains(&status) {
                    call.operation.body_limit()
                } else {
                    ERROR_BODY_LIMIT
                };
                let body = read_capped(response, limit).await?;
                Ok::<_, reqwest::Error>((status, headers, body))
            })
            .await;

            // The error to report if this attempt is the last, and what the
            // retry policy needs to know about it.
            let (error, retry_after, kind) = match attempt {
                Ok(Ok((status, _, Capped { cut: true, .. }))) if (200..300).contains(&status) => {
                    self.inner.options.metrics.attempt(call.operation, false);
                    return Err(ActionsError::BodyTooLarge {
                        operation: call.operation,
                        limit: call.operation.body_limit(),
                    });
                }
                Ok(Ok((status, _headers, Capped { body, .. }))) if (200..300).contains(&status) => {
                    self.inner.options.metrics.attempt(call.operation, true);
                    return Ok(Response {
                        status,
                        body: strip_bom(&body).to_vec(),
                    });
                }
                Ok(Ok((status, headers, Capped { body, .. }))) => {
                    let request_id = header_str(&headers, "ActivityId")
                        .or_else(|| header_str(&headers, "X-GitHub-Request-Id"));
                    let content_type = header_str(&headers, CONTENT_TYPE.as_str());
                    let body = scrub(&body, secrets);
                    let error = classify_response(
                        call.operation,
                        status,
                        content_type.as_deref(),
                        &body,
                        request_id,
                        retries,
                    );
                    let retry_after = header_str(&headers, RETRY_AFTER.as_str());
                    (error, retry_after, AttemptKind::Status(status))
                }
                Ok(Err(source)) => {
                    let kind = if is_certificate_error(&source) {
                        AttemptKind::Certificate
                    } else if source.is_connect() {
                        AttemptKind::Connect
                    } else {
                        AttemptKind::Transport
                    };
                    let error = ActionsError::Transport {
                        operation: call.operation,
                        retries,
                        source: source.without_url(),
                    };
                    (error, None, kind)
                }
                Err(_) => {
                    let error = ActionsError::Timeout {
                        operation: call.operation,
                        after: call.timeout,
                        retries,
                    };
                    (error, None, AttemptKind::Timeout)
                }
            };
            self.inner.options.metrics.attempt(call.operation, false);
            let outcome = match kind {
                AttemptKind::Status(status) => Outcome::Status {
                    status,
                    retry_after: retry_after.as_deref(),
                },
                AttemptKind::Connect => Outcome::Connect,
                AttemptKind::Transport => Outcome::Transport,
                AttemptKind::Certificate => Outcome::Certificate,
                AttemptKind::Timeout => Outcome::Timeout,
            };
            let history = History {
                retries_done: retries,
                may_have_acted,
            };
            let wait = match next_step(
                policy,
                call.operation,
                &outcome,
                history,
                Timestamp::now(),
                rand::random::<f64>(),
            ) {
                Next::Retry(wait) => wait,
                Next::Report => return Err(error),
                Next::Done => {
                    tracing::debug!(
                        operation = %call.operation,
                        error = %error,
                        "nothing left to delete after an attempt that may have deleted it"
                    );
                    let AttemptKind::Status(status) = kind else {
                        return Err(error);
                    };
                    return Ok(Response {
                        status,
                        body: Vec::new(),
                    });
                }
            };
            may_have_acted |= outcome.may_have_acted();
            tracing::debug!(
                operation = %call.operation,
                retry = retries + 1,
                wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                error = %error,
                "retrying Actions call"
            );
            tokio::time::sleep(wait).await;
            retries += 1;
        }
    }

    /// Calls the Actions service with the admin token. A 401 means the token
    /// was revoked or expired early: it is dropped, the bootstrap redone, and
    /// the call made once more.
    async fn service_call(
        &self,
        operation: Operation,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Response, ActionsError> {
        self.service_call_at(operation, method, path, body)
            .await
            .map(|(response, _)| response)
    }

    /// [`Self::service_call`], also returning the service URL the call was
    /// made at (the base URL of the admin token it used).
    async fn service_call_at(
        &self,
        operation: Operation,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(Response, Url), ActionsError> {
        let mut renewed = false;
        loop {
            let admin = self.admin_token().await?;
            let url = with_api_version(join(&admin.service_url, path, operation)?);
            let result = self
                .execute(
                    Call {
                        operation,
                        method: method.clone(),
                        url,
                        auth: Auth::Bearer(&admin.token),
                        content_type: "application/json",
                        accept: Some("application/json"),
                        headers: Vec::new(),
                        body: body.clone(),
                        timeout: self.inner.options.timeout,
                    },
                    &[&admin.token],
                )
                .await;
            match result {
                Err(ActionsError::Status { status: 401, .. }) if !renewed => {
                    tracing::debug!(operation = %operation, "admin token rejected; bootstrapping again");
                    self.forget_admin_token(&admin);
                    renewed = true;
                }
                Err(ActionsError::Status { status: 401, .. }) => {
                    return Err(ActionsError::AdminTokenExpired { operation });
                }
                other => return other.map(|response| (response, admin.service_url.clone())),
            }
        }
    }

    /// Calls an endpoint with the message queue token of a session.
    pub(crate) async fn queue_call(
        &self,
        request: QueueRequest,
        queue_token: &Secret,
    ) -> Result<Response, ActionsError> {
        let accept = if request.operation == Operation::GetMessage {
            Some("application/json; api-version=6.0-preview")
        } else {
            Some("application/json")
        };
        self.execute(
            Call {
                operation: request.operation,
                method: request.method,
                url: request.url,
                auth: Auth::Bearer(queue_token),
                content_type: "application/json",
                accept,
                headers: request.headers,
                body: request.body,
                timeout: request.timeout,
            },
            &[queue_token],
        )
        .await
    }

    /// Looks a runner group up by name.
    pub async fn get_runner_group_by_name(&self, name: &str) -> Result<RunnerGroup, ActionsError> {
        let op = Operation::GetRunnerGroup;
        let path = format!("_apis/runtime/runnergroups/?groupName={}", encode(name));
        let list: ListResponse<RunnerGroup> = self
            .service_call(op, Method::GET, &path, None)
            .await?
            .json(op)?;
        at_most_one(op, list)?.ok_or_else(|| ActionsError::RunnerGroupNotFound {
            name: name.to_string(),
        })
    }

    /// Looks a scale set up by runner group and name; `None` when there is
    /// none.
    pub async fn get_runner_scale_set(
        &self,
        runner_group_id: i64,
        name: &str,
    ) -> Result<Option<RunnerScaleSet>, ActionsError> {
        let op = Operation::GetScaleSet;
        let path = format!(
            "_apis/runtime/runnerscalesets?runnerGroupId={runner_group_id}&name={}",
            encode(name)
        );
        let list: ListResponse<RunnerScaleSet> = self
            .service_call(op, Method::GET, &path, None)
            .await?
            .json(op)?;
        at_most_one(op, list)
    }

    /// Gets a scale set by id.
    pub async fn get_runner_scale_set_by_id(
        &self,
        id: i64,
    ) -> Result<RunnerScaleSet, ActionsError> {
        let op = Operation::GetScaleSetById;
        self.service_call(
            op,
            Method::GET,
            &format!("_apis/runtime/runnerscalesets/{id}"),
            None,
        )
        .await?
        .json(op)
    }

    /// Creates a scale set and returns it as the service stored it.
    pub async fn create_runner_scale_set(
        &self,
        scale_set: &RunnerScaleSet,
    ) -> Result<RunnerScaleSet, ActionsError> {
        let op = Operation::CreateScaleSet;
        self.service_call(
            op,
            Method::POST,
            "_apis/runtime/runnerscalesets",
            Some(to_body(scale_set, op)?),
        )
        .await?
        .json(op)
    }

    /// Updates the fields of a scale set that are set in `patch` (an empty
    /// name or a zero group id is left as it is).
    pub async fn update_runner_scale_set(
        &self,
        id: i64,
        patch: &RunnerScaleSet,
    ) -> Result<RunnerScaleSet, ActionsError> {
        let op = Operation::UpdateScaleSet;
        let path = format!("_apis/runtime/runnerscalesets/{id}");
        self.service_call(op, Method::PATCH, &path, Some(to_body(patch, op)?))
            .await?
            .json(op)
    }

    /// Deletes a scale set. The service refuses while jobs are assigned to
    /// its runners. A 404 on a retry after an attempt that may have deleted
    /// it is success; a 404 on the first attempt is
    /// [`ActionsError::ScaleSetNotFound`].
    pub async fn delete_runner_scale_set(&self, id: i64) -> Result<(), ActionsError> {
        let op = Operation::DeleteScaleSet;
        self.service_call(
            op,
            Method::DELETE,
            &format!("_apis/runtime/runnerscalesets/{id}"),
            None,
        )
        .await?;
        Ok(())
    }

    /// Registers a runner in a scale set and returns its JIT configuration.
    /// A name that is already registered is [`ActionsError::RunnerExists`].
    pub async fn generate_jit_runner_config(
        &self,
        scale_set_id: i64,
        setting: &JitRunnerSetting,
    ) -> Result<JitConfig, ActionsError> {
        let op = Operation::GenerateJitConfig;
        let path = format!("_apis/runtime/runnerscalesets/{scale_set_id}/generatejitconfig");
        jit_config(
            &self
                .service_call(op, Method::POST, &path, Some(to_body(setting, op)?))
                .await?,
        )
    }

    /// Gets a runner by id; [`ActionsError::RunnerNotFound`] when there is
    /// none.
    pub async fn get_runner(&self, runner_id: i64) -> Result<RunnerReference, ActionsError> {
        let op = Operation::GetRunner;
        self.service_call(
            op,
            Method::GET,
            &format!("_apis/distributedtask/pools/0/agents/{runner_id}"),
            None,
        )
        .await?
        .json(op)
    }

    /// Gets a runner by name; `None` when there is none.
    pub async fn get_runner_by_name(
        &self,
        name: &str,
    ) -> Result<Option<RunnerReference>, ActionsError> {
        let op = Operation::GetRunnerByName;
        let path = format!(
            "_apis/distributedtask/pools/0/agents?agentName={}",
            encode(name)
        );
        let list: ListResponse<RunnerReference> = self
            .service_call(op, Method::GET, &path, None)
            .await?
            .json(op)?;
        at_most_one(op, list)
    }

    /// Removes a runner's registration. The service answers success when the
    /// runner is already gone, and [`ActionsError::JobStillRunning`] while
    /// its job runs.
    pub async fn remove_runner(&self, runner_id: i64) -> Result<(), ActionsError> {
        let op = Operation::RemoveRunner;
        self.service_call(
            op,
            Method::DELETE,
            &format!("_apis/distributedtask/pools/0/agents/{runner_id}"),
            None,
        )
        .await?;
        Ok(())
    }

    /// Creates the message session of a scale set. Only one session per
    /// scale set may exist; a second is [`ActionsError::SessionConflict`].
    ///
    /// An attempt whose answer was lost may have opened a session no one
    /// holds; the retry that meets it as a conflict backs off and tries
    /// again, as a listener does, until the service lets the orphan go or
    /// the retries run out.
    pub async fn create_message_session(
        &self,
        scale_set_id: i64,
        owner: &str,
    ) -> Result<MessageSession, ActionsError> {
        let (session, service_url) = self.create_session(scale_set_id, owner).await?;
        let acquire_jobs_url = with_api_version(join(
            &service_url,
            &format!("_apis/runtime/runnerscalesets/{scale_set_id}/acquirejobs"),
            Operation::AcquireJobs,
        )?);
        Ok(MessageSession::new(
            self.clone(),
            scale_set_id,
            session,
            acquire_jobs_url,
        ))
    }

    /// `POST …/sessions`, with the service URL the session was opened at.
    async fn create_session(
        &self,
        scale_set_id: i64,
        owner: &str,
    ) -> Result<(RunnerScaleSetSession, Url), ActionsError> {
        let op = Operation::CreateSession;
        let request = CreateSessionRequest {
            session_id: "00000000-0000-0000-0000-000000000000".into(),
            owner_name: owner.to_string(),
        };
        let path = format!("_apis/runtime/runnerscalesets/{scale_set_id}/sessions");
        let (response, service_url) = self
            .service_call_at(op, Method::POST, &path, Some(to_body(&request, op)?))
            .await?;
        let session = check_session(response.json(op)?, op)?;
        Ok((session, service_url))
    }

    /// `PATCH …/sessions/{id}`: a fresh queue token for the same session.
    pub(crate) async fn refresh_session(
        &self,
        scale_set_id: i64,
        session_id: &str,
    ) -> Result<RunnerScaleSetSession, ActionsError> {
        let op = Operation::RefreshSession;
        let path = format!(
            "_apis/runtime/runnerscalesets/{scale_set_id}/sessions/{}",
            encode(session_id)
        );
        let session: RunnerScaleSetSession = self
            .service_call(op, Method::PATCH, &path, None)
            .await?
            .json(op)?;
        check_session(session, op)
    }

    /// `DELETE …/sessions/{id}`. A 404 on a retry after an attempt that may
    /// have deleted the session is success.
    pub(crate) async fn delete_session(
        &self,
        scale_set_id: i64,
        session_id: &str,
    ) -> Result<(), ActionsError> {
        let op = Operation::DeleteSession;
        let path = format!(
            "_apis/runtime/runnerscalesets/{scale_set_id}/sessions/{}",
            encode(session_id)
        );
        self.service_call(op, Method::DELETE, &path, None).await?;
        Ok(())
    }
}

/// A session must come with a queue to poll and a token to poll it with.
fn check_session(
    session: RunnerScaleSetSession,
    operation: Operation,
) -> Result<RunnerScaleSetSession, ActionsError> {
    if session.session_id.is_empty()
        || session.message_queue_url.is_empty()
        || session.message_queue_access_token.is_empty()
    {
        return Err(ActionsError::Decode {
            operation,
            reason: "the session lacks an id, a message queue URL or a queue token".into(),
        });
    }
    Url::parse(&session.message_queue_url).map_err(|e| ActionsError::Decode {
        operation,
        reason: format!("the message queue URL is invalid: {e}"),
    })?;
    Ok(session)
}

fn join(base: &Url, path: &str, operation: Operation) -> Result<Url, ActionsError> {
    base.join(path).map_err(|e| ActionsError::Decode {
        operation,
        reason: format!("cannot build the request URL: {e}"),
    })
}

fn to_body<T: Serialize>(value: &T, operation: Operation) -> Result<Vec<u8>, ActionsError> {
    serde_json::to_vec(value).map_err(|e| ActionsError::Decode {
        operation,
        reason: e.to_string(),
    })
}

/// Percent-encodes a query or path value.
fn encode(value: &str) -> String {
    url::form_urlencoded::byte_serialize(value.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

/// The one element of a lookup by name. The service's filters are exact, so a
/// second match means the answer cannot be trusted to be the object asked
/// for, and acting on either could touch another scale set's runners.
fn at_most_one<T>(operation: Operation, list: ListResponse<T>) -> Result<Option<T>, ActionsError> {
    let count = list.value.len();
    let mut items = list.value.into_iter();
    match (items.next(), count) {
        (first, 0 | 1) => Ok(first),
        _ => Err(ActionsError::AmbiguousResult { operation, count }),
    }
}

#[cfg(test)]
mod tests;
