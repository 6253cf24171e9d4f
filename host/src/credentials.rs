//! From a scale set's GitHub configuration to a shared Actions client.
//!
//! A scale set names its GitHub configuration URL and a Secret holding the
//! credentials, with ARC's keys: `github_token` for a personal access token,
//! or `github_app_id`, `github_app_installation_id` and
//! `github_app_private_key` for a GitHub App. Every scale set of a
//! credential, every runner of those scale sets and the unregistration pool
//! want a client for it, and they must share one: a client holds the
//! connection pool and the Actions admin token, and a client per runner
//! would mean a bootstrap (three GitHub calls) per runner.
//!
//! [`ActionsClients`] reads the Secret when asked for a client (at most once
//! per [`CREDENTIALS_FRESHNESS`] per target) and keeps one client per target
//! and Secret version, so a rotated Secret gives a new client within that
//! time and nothing has to be restarted. [`ActionsRemover`] is
//! the unregistration pool's production [`Remover`] on top of it.
//!
//! Errors name the Secret (or ConfigMap) and the key, never a value: they
//! end up in events and on the status of user-visible objects.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;

use crate::actions::{
    self, ActionsClient, ActionsError, AppCredentials, ClientOptions, ConfigUrl, Credentials,
    ProxyAuth, ProxyConfig,
};
use crate::tenant_cache::{Limits, TenantCache};
use crate::unregistration::{Removal, Remover};

/// The Secret key of a personal access token (ARC's).
pub const GITHUB_TOKEN_KEY: &str = "github_token";
/// The Secret key of a GitHub App's id or client id (ARC's).
pub const GITHUB_APP_ID_KEY: &str = "github_app_id";
/// The Secret key of a GitHub App installation id (ARC's).
pub const GITHUB_APP_INSTALLATION_ID_KEY: &str = "github_app_installation_id";
/// The Secret key of a GitHub App's PEM private key (ARC's).
pub const GITHUB_APP_PRIVATE_KEY_KEY: &str = "github_app_private_key";
/// The key of the proxy user name in a proxy credential Secret (ARC's).
pub const PROXY_USERNAME_KEY: &str = "username";
/// The key of the proxy password in a proxy credential Secret (ARC's).
pub const PROXY_PASSWORD_KEY: &str = "password";

/// The proxy a target's client goes through, in plain strings: the CRD's
/// `proxy` block converted by whoever reads the CRD, so this module knows
/// nothing of the API types.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ProxyTarget {
    /// The proxy for `http://` URLs.
    pub http_url: Option<String>,
    /// The proxy for `https://` URLs.
    pub https_url: Option<String>,
    /// Hosts reached directly.
    pub no_proxy: Vec<String>,
    /// A Secret in the target's namespace with `username` and `password`
    /// for the `http` proxy.
    pub http_credential_secret: Option<String>,
    /// The same for the `https` proxy: each proxy gets its own, so one's
    /// password never reaches the other.
    pub https_credential_secret: Option<String>,
}

/// Where a runner's (or a scale set's) GitHub configuration lives: ARC's
/// fields.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GitHubTarget {
    /// The namespace of the Secret (and of the object that names it).
    pub namespace: String,
    /// `spec.githubConfigUrl`.
    pub config_url: String,
    /// `spec.githubConfigSecret`.
    pub secret_name: String,
    /// `spec.proxy`, converted.
    pub proxy: Option<ProxyTarget>,
    /// `spec.githubServerTLS.certificateFrom.configMapKeyRef` as (name,
    /// key): a PEM bundle trusted in addition to the platform's roots.
    pub ca_config_map: Option<(String, String)>,
}

/// Why no client could be had for a target. Messages name the object and
/// the key, never a value.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    /// The Secret (the credentials, or the proxy's) does not exist.
    #[error("secret {namespace}/{name} does not exist")]
    SecretNotFound {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// A key the credentials need is absent (or empty).
    #[error("{kind} {namespace}/{name} has no {key}")]
    MissingKey {
        /// `secret` or `configmap`.
        kind: &'static str,
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// The key, or the choice of keys, that is missing.
        key: String,
    },
    /// A key holds something that cannot be used.
    #[error("{kind} {namespace}/{name}: {key} is invalid: {reason}")]
    Invalid {
        /// `secret` or `configmap`.
        kind: &'static str,
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// The offending key.
        key: String,
        /// What is wrong with it, without its value.
        reason: String,
    },
    /// A proxy URL of `spec.proxy` does not parse (the URL is not repeated:
    /// someone may have written credentials into it).
    #[error("spec.proxy.{field}.url is not a URL: {reason}")]
    ProxyUrl {
        /// `http` or `https`.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// The ConfigMap holding the CA bundle does not exist.
    #[error("configmap {namespace}/{name} does not exist")]
    ConfigMapNotFound {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// The API server could not be asked.
    #[error("reading {kind} {namespace}/{name}: {source}")]
    Kube {
        /// `secret` or `configmap`.
        kind: &'static str,
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// The client's error (boxed: it is most of the enum's size, and
        /// the rarest variant).
        #[source]
        source: Box<kube::Error>,
    },
    /// The client could not be built (a bad configuration URL, proxy or CA
    /// bundle).
    #[error("the Actions client for {config_url} cannot be built: {source}")]
    Actions {
        /// The configuration URL, as the target gave it.
        config_url: String,
        /// The client's error.
        #[source]
        source: ActionsError,
    },
}

impl CredentialsError {
    /// A short, stable name for this kind of error, for metric labels and
    /// Kubernetes event reasons.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::SecretNotFound { .. } => "secret_not_found",
            Self::MissingKey { .. } => "missing_key",
            Self::Invalid { .. } => "invalid_key",
            Self::ConfigMapNotFound { .. } => "configmap_not_found",
            Self::ProxyUrl { .. } => "invalid_proxy_url",
            Self::Kube { .. } => "kube",
            Self::Actions { .. } => "client_setup",
        }
    }
}

/// Gives an Actions client for a GitHub target: the one way a controller
/// asks for a client. [`ActionsClients`] is the production source; the
/// trait keeps a controller independent of how that cache is built.
///
/// A listener asks differently ([`crate::listener::ListenerClient`]): it is
/// bound to its one scale set's target and asks again for the same target
/// whenever the service refuses its credentials.
pub trait ActionsClientSource: Send + Sync + 'static {
    /// The client for `target`; an error names what is missing or
    /// unusable, never a value.
    fn client(
        &self,
        target: &GitHubTarget,
    ) -> impl std::future::Future<Output = Result<ActionsClient, CredentialsError>> + Send;

    /// Forgets what is kept for `target`, which the caller no longer
    /// refers to (its scale set is gone, or names another target now).
    fn forget(&self, target: &GitHubTarget);
}

impl ActionsClientSource for ActionsClients {
    async fn client(&self, target: &GitHubTarget) -> Result<ActionsClient, CredentialsError> {
        self.get(target).await
    }

    fn forget(&self, target: &GitHubTarget) {
        ActionsClients::forget(self, target);
    }
}

/// The versions of everything a client was built from. A change in any of
/// them means the client is stale.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Versions {
    secret: Option<String>,
    proxy_secrets: [Option<String>; 2],
    ca_config_map: Option<String>,
}

/// The proxy credential Secrets a client was built from, `http`'s and
/// `https`'s.
#[derive(Default)]
pub struct ProxySecrets {
    /// The `http` proxy's credentials, when it names a Secret.
    pub http: Option<Secret>,
    /// The `https` proxy's.
    pub https: Option<Secret>,
}

impl ProxySecrets {
    /// The credential Secrets `proxy` names, read from `secrets` (the
    /// target's `namespace`): what a client is built from, and what the
    /// runners' proxy Secret is written from.
    pub async fn read(
        secrets: &Api<Secret>,
        namespace: &str,
        proxy: &ProxyTarget,
    ) -> Result<ProxySecrets, CredentialsError> {
        let mut read = ProxySecrets::default();
        if let Some(name) = &proxy.http_credential_secret {
            read.http = Some(read_secret(secrets, namespace, name).await?);
        }
        if let Some(name) = &proxy.https_credential_secret {
            read.https = Some(read_secret(secrets, namespace, name).await?);
        }
        Ok(read)
    }
}

/// The Secret `name`, from `secrets` (in `namespace`); missing is an error
/// that names it.
async fn read_secret(
    secrets: &Api<Secret>,
    namespace: &str,
    name: &str,
) -> Result<Secret, CredentialsError> {
    match secrets.get_opt(name).await {
        Ok(Some(secret)) => Ok(secret),
        Ok(None) => Err(CredentialsError::SecretNotFound {
            namespace: namespace.to_string(),
            name: name.to_string(),
        }),
        Err(source) => Err(CredentialsError::Kube {
            kind: "secret",
            namespace: namespace.to_string(),
            name: name.to_string(),
            source: Box::new(source),
        }),
    }
}

/// How long a read of a target's Secret (and proxy Secrets and CA
/// ConfigMap) stands for them: asked again within it, [`ActionsClients`]
/// answers with the client of that read.
///
/// Every runner's registration, every scale set's reconcile and every
/// listener start asks for a client, and a read from the API server each
/// time was one request per job and five per scale set at every start of
/// the host, most of them for a Secret a whole fleet shares. A second is
/// far below anything a person rotating a credential waits for, and under
/// a burst it makes the reads one a second per credential, not one per
/// runner.
pub const CREDENTIALS_FRESHNESS: Duration = Duration::from_secs(1);

/// One Actions client per credential, shared by the reconcilers, the
/// unregistration pool and the listeners.
///
/// Clients are keyed by the whole target (one client serves one
/// configuration URL) and remembered with the `resourceVersion` of the
/// Secret (and of the proxy Secret and CA ConfigMap, when the target has
/// them): the objects are read again once the last read is older than
/// [`CREDENTIALS_FRESHNESS`], so a rotated credential is used within a
/// second, with no watch to keep and no restart. One caller reads for a
/// target at a time, and callers that waited for it take its answer: a
/// thousand scale sets starting at once read their shared Secret once.
/// Building a client makes no network call, and a failed read is not kept
/// (the next caller reads again).
///
/// Targets are what tenants write, so the cache is bounded by
/// [`CLIENT_LIMITS`] ([`crate::tenant_cache`]): a client nobody asked for
/// in a while goes with its connection pool, a namespace keeps at most so
/// many, and a scale set's deletion forgets its target. What is forgotten
/// is built again on the next use, from one read of its Secret.
///
/// Clones share the cache.
#[derive(Clone)]
pub struct ActionsClients {
    kube: kube::Client,
    options: ClientOptions,
    cache: Arc<Mutex<TenantCache<GitHubTarget, Slot>>>,
}

/// How many clients [`ActionsClients`] keeps: a thousand targets a
/// namespace (a scale set per repository, each with its own URL, fits),
/// each kept while used within a quarter of an hour. A listener holds a
/// clone of its client for as long as it runs, so an idle scale set's
/// long poll is not cut when its entry goes.
pub const CLIENT_LIMITS: Limits = Limits {
    per_namespace: 1024,
    idle: Duration::from_secs(15 * 60),
};

/// A target's place in the cache: locked while it is read.
type Slot = Arc<tokio::sync::Mutex<Option<Cached>>>;

/// A target's client, what it was built from, and when that was last read.
struct Cached {
    versions: Versions,
    client: ActionsClient,
    read_at: Instant,
}

impl std::fmt::Debug for ActionsClients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActionsClients")
            .field("options", &self.options)
            .field("cached", &self.cached())
            .finish_non_exhaustive()
    }
}

impl ActionsClients {
    /// A cache that reads Secrets and ConfigMaps with `kube` and builds
    /// clients with `options` (the proxy and CA of each target replace the
    /// options' own).
    pub fn new(kube: kube::Client, options: ClientOptions) -> Self {
        Self::with_limits(kube, options, CLIENT_LIMITS)
    }

    /// The same, keeping at most what `limits` allows.
    pub fn with_limits(kube: kube::Client, options: ClientOptions, limits: Limits) -> Self {
        Self {
            kube,
            options,
            cache: Arc::new(Mutex::new(TenantCache::new(limits, Instant::now()))),
        }
    }

    fn lock(&self) -> MutexGuard<'_, TenantCache<GitHubTarget, Slot>> {
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The slot of `target`: its cached one, or a new one, kept unless the
    /// target's namespace is full (then this caller reads for itself).
    fn slot(&self, target: &GitHubTarget) -> Slot {
        let mut cache = self.lock();
        let now = Instant::now();
        if let Some(slot) = cache.get(target, now) {
            return slot;
        }
        let slot = Slot::default();
        if !cache.insert(target.clone(), &target.namespace, slot.clone(), now)
            && cache.refused().is_power_of_two()
        {
            tracing::warn!(
                namespace = %target.namespace,
                refused = cache.refused(),
                "a namespace refers to more Actions targets than the host keeps clients for; \
                 the others' clients are built for each use"
            );
        }
        slot
    }

    /// The client for `target`: the cached one while the Secret (and proxy
    /// Secret and CA ConfigMap) are unchanged, a new one otherwise.
    pub async fn get(&self, target: &GitHubTarget) -> Result<ActionsClient, CredentialsError> {
        let slot = self.slot(target);
        let mut cached = slot.lock().await;
        if let Some(cached) = cached.as_ref()
            && cached.read_at.elapsed() < CREDENTIALS_FRESHNESS
        {
            return Ok(cached.client.clone());
        }
        let read_at = Instant::now();
        let secrets: Api<Secret> = Api::namespaced(self.kube.clone(), &target.namespace);
        let secret = read_secret(&secrets, &target.namespace, &target.secret_name).await?;
        let proxy_secrets = match &target.proxy {
            Some(proxy) => ProxySecrets::read(&secrets, &target.namespace, proxy).await?,
            None => ProxySecrets::default(),
        };
        let ca = match &target.ca_config_map {
            Some((name, key)) => Some(self.ca_bundle(&target.namespace, name, key).await?),
            None => None,
        };
        let versions = Versions {
            secret: secret.metadata.resource_version.clone(),
            proxy_secrets: [&proxy_secrets.http, &proxy_secrets.https]
                .map(|s| s.as_ref().and_then(|s| s.metadata.resource_version.clone())),
            ca_config_map: ca.as_ref().and_then(|(version, _)| version.clone()),
        };
        if let Some(cached) = cached.as_mut()
            && cached.versions == versions
        {
            cached.read_at = read_at;
            return Ok(cached.client.clone());
        }
        let client = build_client(
            target,
            &secret,
            &proxy_secrets,
            ca.map(|(_, pem)| pem),
            &self.options,
        )?;
        *cached = Some(Cached {
            versions,
            client: client.clone(),
            read_at,
        });
        Ok(client)
    }

    /// Forgets the client of a target nothing refers to any more (its scale
    /// set was deleted). A later [`ActionsClients::get`] builds a new one.
    pub fn forget(&self, target: &GitHubTarget) {
        self.lock().remove(target);
    }

    /// How many clients are cached (a target being read for the first time
    /// counts once its read is done).
    pub fn cached(&self) -> usize {
        self.lock()
            .values()
            .filter(|slot| slot.try_lock().map_or(true, |cached| cached.is_some()))
            .count()
    }

    /// The PEM bundle at `key` of the ConfigMap, with the ConfigMap's
    /// version.
    async fn ca_bundle(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
    ) -> Result<(Option<String>, String), CredentialsError> {
        let api: Api<ConfigMap> = Api::namespaced(self.kube.clone(), namespace);
        let config_map = match api.get_opt(name).await {
            Ok(Some(config_map)) => config_map,
            Ok(None) => {
                return Err(CredentialsError::ConfigMapNotFound {
                    namespace: namespace.to_string(),
                    name: name.to_string(),
                });
            }
            Err(source) => {
                return Err(CredentialsError::Kube {
                    kind: "configmap",
                    namespace: namespace.to_string(),
                    name: name.to_string(),
                    source: Box::new(source),
                });
            }
        };
        let object = Object {
            kind: "configmap",
            namespace,
            name,
        };
        let pem = config_map
            .data
            .as_ref()
            .and_then(|data| data.get(key).cloned())
            .or_else(|| {
                config_map
                    .binary_data
                    .as_ref()
                    .and_then(|data| data.get(key))
                    .and_then(|bytes| String::from_utf8(bytes.0.clone()).ok())
            })
            .filter(|pem| !pem.trim().is_empty())
            .ok_or_else(|| object.missing(key))?;
        Ok((config_map.metadata.resource_version, pem))
    }
}

/// The object a key is read from, for error messages.
struct Object<'a> {
    kind: &'static str,
    namespace: &'a str,
    name: &'a str,
}

impl Object<'_> {
    fn missing(&self, key: &str) -> CredentialsError {
        CredentialsError::MissingKey {
            kind: self.kind,
            namespace: self.namespace.to_string(),
            name: self.name.to_string(),
            key: key.to_string(),
        }
    }

    fn invalid(&self, key: &str, reason: impl Into<String>) -> CredentialsError {
        CredentialsError::Invalid {
            kind: self.kind,
            namespace: self.namespace.to_string(),
            name: self.name.to_string(),
            key: key.to_string(),
            reason: reason.into(),
        }
    }

    /// The value at `key` as text; `None` when absent or empty, as ARC
    /// treats an empty key as an absent one.
    fn text(
        &self,
        data: &BTreeMap<String, ByteString>,
        key: &str,
    ) -> Result<Option<String>, CredentialsError> {
        match data.get(key) {
            None => Ok(None),
            Some(bytes) => {
                let text = std::str::from_utf8(&bytes.0)
                    .map_err(|_| self.invalid(key, "it is not UTF-8 text"))?
                    .trim();
                Ok((!text.is_empty()).then(|| text.to_string()))
            }
        }
    }

    fn required(
        &self,
        data: &BTreeMap<String, ByteString>,
        key: &str,
    ) -> Result<String, CredentialsError> {
        self.text(data, key)?.ok_or_else(|| self.missing(key))
    }
}

/// Reads the credentials out of a Secret's data, ARC's way: a token, or all
/// three App keys, and not both.
pub fn credentials_from_secret(
    namespace: &str,
    name: &str,
    data: &BTreeMap<String, ByteString>,
) -> Result<Credentials, CredentialsError> {
    let object = Object {
        kind: "secret",
        namespace,
        name,
    };
    let token = object.text(data, GITHUB_TOKEN_KEY)?;
    let app_id = object.text(data, GITHUB_APP_ID_KEY)?;
    match (token, app_id) {
        (Some(_), Some(_)) => Err(object.invalid(
            GITHUB_TOKEN_KEY,
            format!("the secret holds both a token and {GITHUB_APP_ID_KEY}; keep only one"),
        )),
        (Some(token), None) => Ok(Credentials::Token(actions::Secret::new(token))),
        (None, Some(app_id)) => {
            let installation = object.required(data, GITHUB_APP_INSTALLATION_ID_KEY)?;
            let installation_id = installation
                .parse::<u64>()
                .ok()
                .filter(|id| *id > 0)
                .ok_or_else(|| {
                    object.invalid(GITHUB_APP_INSTALLATION_ID_KEY, "it is not a positive number")
                })?;
            let private_key = object.required(data, GITHUB_APP_PRIVATE_KEY_KEY)?;
            let app = AppCredentials::new(app_id, installation_id, &private_key)
                .map_err(|err| object.invalid(GITHUB_APP_PRIVATE_KEY_KEY, reason_of(err)))?;
            Ok(Credentials::App(app))
        }
        (None, None) => Err(object.missing(&format!(
            "{GITHUB_TOKEN_KEY} (or {GITHUB_APP_ID_KEY}, {GITHUB_APP_INSTALLATION_ID_KEY} and {GITHUB_APP_PRIVATE_KEY_KEY})"
        ))),
    }
}

/// The reason inside a credentials error, without the prefix the Secret's
/// error adds itself.
fn reason_of(err: ActionsError) -> String {
    match err {
        ActionsError::InvalidCredentials(reason) => reason,
        other => other.to_string(),
    }
}

fn build_client(
    target: &GitHubTarget,
    secret: &Secret,
    proxy_secrets: &ProxySecrets,
    ca_pem: Option<String>,
    options: &ClientOptions,
) -> Result<ActionsClient, CredentialsError> {
    let empty = BTreeMap::new();
    let credentials = credentials_from_secret(
        &target.namespace,
        &target.secret_name,
        secret.data.as_ref().unwrap_or(&empty),
    )?;
    let proxy = match &target.proxy {
        Some(proxy) => Some(proxy_config(&target.namespace, proxy, proxy_secrets)?),
        None => options.proxy.clone(),
    };
    let options = ClientOptions {
        proxy,
        root_ca_pem: ca_pem.or_else(|| options.root_ca_pem.clone()),
        ..options.clone()
    };
    let actions = |source| CredentialsError::Actions {
        config_url: crate::actions::config_url::shown(&target.config_url),
        source,
    };
    let config_url = ConfigUrl::parse(&target.config_url).map_err(actions)?;
    ActionsClient::new(config_url, credentials, options).map_err(actions)
}

/// The user name and password in the proxy credential Secret `name`, when
/// the proxy names one (`secret` is what was read under that name).
fn proxy_auth(
    namespace: &str,
    secret: Option<&Secret>,
    name: Option<&String>,
) -> Result<Option<ProxyAuth>, CredentialsError> {
    let (Some(secret), Some(name)) = (secret, name) else {
        return Ok(None);
    };
    let object = Object {
        kind: "secret",
        namespace,
        name,
    };
    let empty = BTreeMap::new();
    let data = secret.data.as_ref().unwrap_or(&empty);
    Ok(Some(ProxyAuth {
        username: object.required(data, PROXY_USERNAME_KEY)?,
        password: object
            .text(data, PROXY_PASSWORD_KEY)?
            .map(actions::Secret::new),
    }))
}

fn proxy_config(
    namespace: &str,
    proxy: &ProxyTarget,
    secrets: &ProxySecrets,
) -> Result<ProxyConfig, CredentialsError> {
    Ok(ProxyConfig {
        http: proxy.http_url.clone(),
        https: proxy.https_url.clone(),
        no_proxy: proxy.no_proxy.clone(),
        http_auth: proxy_auth(
            namespace,
            secrets.http.as_ref(),
            proxy.http_credential_secret.as_ref(),
        )?,
        https_auth: proxy_auth(
            namespace,
            secrets.https.as_ref(),
            proxy.https_credential_secret.as_ref(),
        )?,
    })
}

/// What runner pods read their proxy variables from (ARC's runner proxy
/// Secret: `http_proxy`, `https_proxy`, `no_proxy`): each proxy's URL with
/// its credentials in it, percent-encoded as a URL's user part must be, so
/// a password with `@` or `/` in it still works. `secrets` are the http and
/// https proxies' credential Secrets as read, in that order.
pub fn runner_proxy_data(
    namespace: &str,
    proxy: &ProxyTarget,
    secrets: &ProxySecrets,
) -> Result<BTreeMap<String, String>, CredentialsError> {
    let config = proxy_config(namespace, proxy, secrets)?;
    let mut out = BTreeMap::new();
    for (key, field, url, auth) in [
        ("http_proxy", "http", &config.http, &config.http_auth),
        ("https_proxy", "https", &config.https, &config.https_auth),
    ] {
        let Some(url) = url else { continue };
        let mut parsed = url::Url::parse(url).map_err(|error| CredentialsError::ProxyUrl {
            field,
            reason: error.to_string(),
        })?;
        if let Some(auth) = auth {
            let cannot = |_| CredentialsError::ProxyUrl {
                field,
                reason: "it cannot carry a user name".to_owned(),
            };
            parsed.set_username(&auth.username).map_err(cannot)?;
            parsed
                .set_password(auth.password.as_ref().map(actions::Secret::expose))
                .map_err(cannot)?;
        }
        out.insert(key.to_owned(), parsed.to_string());
    }
    if !config.no_proxy.is_empty() {
        out.insert("no_proxy".to_owned(), config.no_proxy.join(","));
    }
    Ok(out)
}

/// Turns the answer to a removal call into the pool's terms: gone is gone
/// whoever removed it, a busy runner is retried by the pool, and everything
/// else is a failure described without secrets (the client's errors carry
/// none).
pub fn removal_of(result: Result<(), ActionsError>) -> Removal {
    match result {
        Ok(()) => Removal::Removed,
        Err(ActionsError::RunnerNotFound { .. }) => Removal::NotFound,
        Err(ActionsError::JobStillRunning { .. }) => Removal::JobStillRunning,
        Err(err) => Removal::Failed(err.to_string()),
    }
}

/// The unregistration pool's production [`Remover`]: finds the client of the
/// runner's credentials and asks the service to remove the runner.
#[derive(Clone, Debug)]
pub struct ActionsRemover {
    clients: ActionsClients,
}

impl ActionsRemover {
    /// A remover sharing `clients` with the rest of the controller.
    pub fn new(clients: ActionsClients) -> Self {
        Self { clients }
    }
}

impl Remover for ActionsRemover {
    type Target = GitHubTarget;

    async fn remove(&self, target: &GitHubTarget, runner_id: i64) -> Removal {
        match self.clients.get(target).await {
            Ok(client) => removal_of(client.remove_runner(runner_id).await),
            Err(err) => Removal::Failed(err.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actions::Operation;

    const KEY: &str = fake_actions::TEST_APP_PRIVATE_KEY;

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, ByteString> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_string(), ByteString(v.as_bytes().to_vec())))
            .collect()
    }

    fn read(pairs: &[(&str, &str)]) -> Result<Credentials, CredentialsError> {
        credentials_from_secret("ns", "gh", &data(pairs))
    }

    #[test]
    fn a_token_or_a_whole_app_is_accepted() {
        assert!(matches!(
            read(&[("github_token", "ghp_x\n")]),
            Ok(Credentials::Token(t)) if t.expose() == "ghp_x"
        ));
        let app = read(&[
            ("github_app_id", "Iv1.abc"),
            ("github_app_installation_id", " 42 "),
            ("github_app_private_key", KEY),
        ]);
        assert!(
            matches!(&app, Ok(Credentials::App(a)) if a.issuer() == "Iv1.abc" && a.installation_id() == 42),
            "{app:?}"
        );
        // An empty token is an absent one, as in ARC.
        assert!(matches!(
            read(&[
                ("github_token", ""),
                ("github_app_id", "1"),
                ("github_app_installation_id", "2"),
                ("github_app_private_key", KEY),
            ]),
            Ok(Credentials::App(_))
        ));
    }

    #[test]
    fn bad_secrets_name_the_key_and_never_the_value() {
        // The secret's pairs, the error's label, and what its message says.
        type Case<'a> = (&'a [(&'a str, &'a str)], &'a str, &'a str);
        let cases: &[Case] = &[
            (&[], "missing_key", "has no github_token (or github_app_id"),
            (
                &[
                    ("github_app_id", "Iv1.appIdValue"),
                    ("github_app_private_key", KEY),
                ],
                "missing_key",
                "has no github_app_installation_id",
            ),
            (
                &[
                    ("github_app_id", "Iv1.appIdValue"),
                    ("github_app_installation_id", "7007007"),
                ],
                "missing_key",
                "has no github_app_private_key",
            ),
            (
                &[
                    ("github_app_id", "Iv1.appIdValue"),
                    ("github_app_installation_id", "seven-secret"),
                    ("github_app_private_key", KEY),
                ],
                "invalid_key",
                "github_app_installation_id is invalid",
            ),
            (
                &[
                    ("github_app_id", "Iv1.appIdValue"),
                    ("github_app_installation_id", "7007007"),
                    (
                        "github_app_private_key",
                        "-----BEGIN RSA PRIVATE KEY-----\nc2VjcmV0LXZhbHVl\n-----END RSA PRIVATE KEY-----\n",
                    ),
                ],
                "invalid_key",
                "github_app_private_key is invalid",
            ),
            (
                &[
                    ("github_token", "ghp_secretvalue"),
                    ("github_app_id", "Iv1.appIdValue"),
                ],
                "invalid_key",
                "holds both",
            ),
        ];
        for (pairs, label, needle) in cases {
            let err = read(pairs).expect_err(needle);
            let shown = format!("{err} {err:?}");
            assert_eq!(err.metric_label(), *label, "{shown}");
            assert!(shown.contains("secret ns/gh"), "{shown}");
            assert!(shown.contains(needle), "{shown}");
            for (_, value) in *pairs {
                assert!(!shown.contains(value), "{shown} shows a value");
            }
        }
        let err = credentials_from_secret(
            "ns",
            "gh",
            &BTreeMap::from([("github_token".to_string(), ByteString(vec![0xff, 0xfe]))]),
        )
        .expect_err("not UTF-8");
        assert!(err.to_string().contains("not UTF-8"), "{err}");
    }

    #[test]
    fn service_answers_map_to_removals() {
        let op = Operation::RemoveRunner;
        let message = || "m".to_string();
        assert_eq!(removal_of(Ok(())), Removal::Removed);
        assert_eq!(
            removal_of(Err(ActionsError::RunnerNotFound {
                operation: op,
                message: message()
            })),
            Removal::NotFound
        );
        assert_eq!(
            removal_of(Err(ActionsError::JobStillRunning {
                operation: op,
                message: message()
            })),
            Removal::JobStillRunning
        );
        for err in [
            ActionsError::AdminTokenExpired { operation: op },
            ActionsError::Status {
                operation: op,
                status: 500,
                type_name: None,
                message: message(),
                request_id: None,
                retries: 3,
            },
            ActionsError::InvalidCredentials("bad".into()),
        ] {
            let shown = err.to_string();
            assert_eq!(removal_of(Err(err)), Removal::Failed(shown));
        }
    }
}
