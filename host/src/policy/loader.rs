//! Turning a policy reference into a [`Decider`], and keeping it current.
//!
//! A reference names a bundled policy (`builtin: NAME`) or a module in a
//! ConfigMap (`configMapRef: {name, key}`, the key defaulting to
//! `policy.wasm` in `binaryData`), optionally pinned by `sha256`, with
//! `settings` and per-policy limits. ConfigMaps are watched: each new
//! version is compiled and its settings validated beside the running one,
//! then swapped in atomically. A version that fails any step never decides;
//! the last good one stays (or the bundled default, when there never was a
//! good one), and a [`PolicyEvent::LoadFailed`] says why.
//!
//! # One watch per ConfigMap
//!
//! Many scale sets name the same ConfigMap (one policy for a whole
//! organisation is the common case), so the loader keeps one watch per
//! ConfigMap, not per reference: the references subscribe to it, each gets
//! every version in order, and the watch stops when the last reference is
//! dropped. Fifty scale sets cost the API server one watch, and the engine
//! one compilation per version (its cache is keyed by digest). What each
//! reference does with a version (its key, pin, settings and limits) stays
//! its own.
//!
//! # One configured policy per configuration
//!
//! A thousand scale sets that name no policy, or the same one, would
//! otherwise each pre-instantiate the module and run its
//! `validate-settings` three times over (the fallback, the reference, each
//! new version). A [`Policy`] is immutable and cheap to share, so the loader
//! keeps the ones it configured by what configured them (module digest,
//! label, settings, limits) and hands the same one to every reference that
//! asks for the same thing. They are held weakly: the last decider to drop
//! one frees it. Only successes are kept, so a version refused for a
//! transient reason is really tried again.
//!
//! # Transient and permanent failures
//!
//! A version that fails for a reason in its bytes or in the reference (not
//! WebAssembly, the wrong world, a pin mismatch, settings refused) fails the
//! same way every time, so it is reported once and left alone until the
//! ConfigMap changes. A version that failed because of the machine
//! (`validate-settings` missing its deadline on a loaded node, see
//! [`PolicyError::is_transient`]) is tried again with growing delays until
//! it loads or another version replaces it: otherwise a good version would
//! stay refused until someone happened to edit the ConfigMap.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::defaults::{DefaultPolicies, DefaultPoliciesError};
use super::metrics::PolicyMetrics;
use super::{
    CallLimits, Decider, Policy, PolicyEngine, PolicyError, PolicyEvent, PolicyKind, PolicyReporter,
};

/// The ConfigMap key a module is read from unless the reference says otherwise.
pub const DEFAULT_KEY: &str = "policy.wasm";

/// How an object refers to its policy. Omitting both `builtin` and
/// `configMapRef` selects the kind's bundled default.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyRef {
    /// A policy bundled in the controller, e.g. `default`, `buffered`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub builtin: Option<String>,
    /// A module stored in a ConfigMap in the object's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_ref: Option<ConfigMapPolicyRef>,
    /// The lower-case hex sha256 the module must have; any other version is
    /// refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Settings handed to the policy as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_json")]
    pub settings: Option<serde_json::Value>,
    /// Deadline of one decision in milliseconds (10..=1000, default 50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_millis: Option<u32>,
    /// Memory cap of one decision in MiB (2..=64, default 16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit_mib: Option<u32>,
}

/// Where in a ConfigMap a module is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMapPolicyRef {
    /// The ConfigMap's name.
    pub name: String,
    /// The `binaryData` key, `policy.wasm` by default.
    #[serde(default = "default_key")]
    pub key: String,
}

fn default_key() -> String {
    DEFAULT_KEY.to_string()
}

fn any_json(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({ "x-kubernetes-preserve-unknown-fields": true })
}

impl PolicyRef {
    /// The limits the reference asks for, checked against the host's bounds.
    pub fn limits(&self) -> Result<CallLimits, PolicyError> {
        let defaults = CallLimits::default();
        let limits = CallLimits {
            deadline: self
                .timeout_millis
                .map_or(defaults.deadline, |ms| Duration::from_millis(u64::from(ms))),
            memory: self.memory_limit_mib.map_or(defaults.memory, |mib| {
                (mib as usize).saturating_mul(1024 * 1024)
            }),
        };
        limits.validate()?;
        Ok(limits)
    }

    /// The label the policy is reported under.
    pub fn label(&self, kind: PolicyKind, namespace: &str) -> String {
        match (&self.builtin, &self.config_map_ref) {
            (_, Some(cm)) if cm.key == DEFAULT_KEY => format!("configmap:{namespace}/{}", cm.name),
            (_, Some(cm)) => format!("configmap:{namespace}/{}/{}", cm.name, cm.key),
            (Some(name), None) => format!("builtin:{name}"),
            (None, None) => format!("builtin:{}", kind.default_builtin()),
        }
    }
}

/// How long to wait before trying again a version that failed for a
/// transient reason: doubling from `first`, capped at `max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryBackoff {
    /// The wait after the first failure.
    pub first: Duration,
    /// The longest wait.
    pub max: Duration,
}

impl Default for RetryBackoff {
    /// Half a second, doubling up to five minutes: quick enough that a
    /// version refused by a hiccup is soon running, slow enough that a
    /// node that stays overloaded is not asked to compile and validate
    /// over and over.
    fn default() -> Self {
        Self {
            first: Duration::from_millis(500),
            max: Duration::from_secs(300),
        }
    }
}

impl RetryBackoff {
    /// The wait after `failures` failed attempts (1 for the first).
    pub fn delay(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(31);
        self.first
            .checked_mul(1 << doublings)
            .unwrap_or(self.max)
            .min(self.max)
    }
}

/// What follows a failed attempt to load a version: another attempt after a
/// delay, or none until the ConfigMap changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterFailure {
    /// Try the same bytes again after this long.
    RetryIn(Duration),
    /// The version fails the same way every time; leave it alone.
    GiveUp,
}

impl AfterFailure {
    /// Decides for the `failures`-th failed attempt at a version.
    pub fn decide(error: &PolicyError, failures: u32, backoff: &RetryBackoff) -> Self {
        if error.is_transient() {
            Self::RetryIn(backoff.delay(failures))
        } else {
            Self::GiveUp
        }
    }
}

/// A reference turned into a decider, plus the subscription keeping it
/// current. Held by the controller for as long as the object refers to the
/// policy; dropping it stops following the ConfigMap (and stops the watch
/// when no other reference follows it).
pub struct LoadedPolicy {
    decider: Decider,
    following: Option<Following>,
}

/// A reference's task and its share of the ConfigMap's watch.
struct Following {
    task: JoinHandle<()>,
    _watch: Arc<SharedWatch>,
}

impl LoadedPolicy {
    /// The decider the reconcilers call.
    pub fn decider(&self) -> &Decider {
        &self.decider
    }

    fn fixed(decider: Decider) -> Self {
        Self {
            decider,
            following: None,
        }
    }
}

impl Drop for LoadedPolicy {
    fn drop(&mut self) {
        if let Some(following) = self.following.take() {
            following.task.abort();
        }
    }
}

/// Loads policy references; one per controller.
#[derive(Clone)]
pub struct PolicyLoader {
    engine: PolicyEngine,
    client: Option<Client>,
    watches: Arc<Watches>,
    configured: Arc<Configured>,
    backoff: RetryBackoff,
    defaults: Arc<DefaultPolicies>,
    metrics: Option<PolicyMetrics>,
}

impl PolicyLoader {
    /// A loader for `engine`; `client` is needed for ConfigMap references.
    pub fn new(engine: PolicyEngine, client: Option<Client>) -> Self {
        Self {
            engine,
            client,
            watches: Arc::default(),
            configured: Arc::default(),
            backoff: RetryBackoff::default(),
            defaults: Arc::default(),
            metrics: None,
        }
    }

    /// Every decider this loader makes counts and times its decisions in
    /// `metrics` (`arcwright_policy_decisions_total` and the duration).
    pub fn with_metrics(mut self, metrics: PolicyMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Loads `defaults` for an object whose spec names no policy of a kind,
    /// instead of the bundled default (which stays the fallback).
    pub fn with_defaults(mut self, defaults: DefaultPolicies) -> Self {
        self.defaults = Arc::new(defaults);
        self
    }

    /// Configures every configured default once, so a default that cannot
    /// be used (an unknown builtin, settings it refuses, limits out of
    /// bounds) is found at start-up rather than on every scale set.
    pub async fn check_defaults(&self) -> Result<(), DefaultPoliciesError> {
        for kind in PolicyKind::ALL {
            let Some(spec) = self.defaults.get(kind) else {
                continue;
            };
            let unusable = |source| DefaultPoliciesError::Unusable { kind, source };
            let limits = spec.limits().map_err(unusable)?;
            let name = spec.builtin.as_deref().unwrap_or(kind.default_builtin());
            let label = spec.label(kind, "");
            self.builtin(kind, name, spec, &label, limits)
                .await
                .map_err(unusable)?;
        }
        Ok(())
    }

    /// Retries versions that failed for a transient reason with `backoff`
    /// instead of the default.
    pub fn with_retry_backoff(mut self, backoff: RetryBackoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// How many ConfigMaps are being watched now: one per ConfigMap that
    /// at least one loaded reference follows, however many follow it.
    pub fn configmap_watches(&self) -> usize {
        self.watches.live()
    }

    /// How many configured policies are alive: one per distinct module,
    /// label, settings and limits in use, however many objects use it.
    pub fn configured_policies(&self) -> usize {
        self.configured.live()
    }

    /// The bundled default of `kind`, configured with no settings.
    pub async fn default_policy(&self, kind: PolicyKind) -> Result<Arc<Policy>, PolicyError> {
        let name = kind.default_builtin();
        self.builtin(
            kind,
            name,
            &PolicyRef::default(),
            &format!("builtin:{name}"),
            CallLimits::default(),
        )
        .await
    }

    /// Loads `spec` (or the default when `None`) for an object in
    /// `namespace`. A reference that cannot be loaded is reported and the
    /// default decides until a good version appears; only a failure of the
    /// bundled default itself is an error.
    pub async fn load(
        &self,
        kind: PolicyKind,
        namespace: &str,
        spec: Option<&PolicyRef>,
        reporter: Arc<dyn PolicyReporter>,
    ) -> Result<LoadedPolicy, PolicyError> {
        let fallback = self.default_policy(kind).await?;
        let spec = spec
            .or_else(|| self.defaults.get(kind))
            .cloned()
            .unwrap_or_default();
        let label = spec.label(kind, namespace);
        let mut decider = Decider::new(Arc::clone(&fallback), fallback, Arc::clone(&reporter));
        if let Some(metrics) = &self.metrics {
            decider = decider.with_metrics(metrics.clone());
        }
        let fail = |error: PolicyError| {
            reporter.report(
                kind,
                &label,
                PolicyEvent::LoadFailed {
                    reason: error.reason().to_string(),
                    message: error.to_string(),
                },
            );
        };
        let limits = match spec.limits() {
            Ok(limits) => limits,
            Err(error) => {
                fail(error);
                return Ok(LoadedPolicy::fixed(decider));
            }
        };
        match (&spec.builtin, &spec.config_map_ref) {
            (Some(_), Some(_)) => {
                fail(PolicyError::InvalidReference(
                    "it names both a builtin and a configMapRef; choose one".into(),
                ));
                Ok(LoadedPolicy::fixed(decider))
            }
            (None, None)
                if spec.settings.is_none()
                    && spec.timeout_millis.is_none()
                    && spec.memory_limit_mib.is_none() =>
            {
                Ok(LoadedPolicy::fixed(decider))
            }
            (builtin, None) => {
                let name = builtin.as_deref().unwrap_or(kind.default_builtin());
                match self.builtin(kind, name, &spec, &label, limits).await {
                    Ok(policy) => {
                        reporter.report(
                            kind,
                            &label,
                            PolicyEvent::Loaded {
                                sha256: policy.module().sha256().to_string(),
                            },
                        );
                        decider.swap(policy);
                    }
                    Err(error) => fail(error),
                }
                Ok(LoadedPolicy::fixed(decider))
            }
            (None, Some(cm)) => {
                let Some(client) = &self.client else {
                    fail(PolicyError::InvalidReference(
                        "a configMapRef needs a connection to the API server".into(),
                    ));
                    return Ok(LoadedPolicy::fixed(decider));
                };
                let (watch, versions) = self.watches.subscribe(client, namespace, &cm.name);
                let follower = Follower {
                    engine: self.engine.clone(),
                    configured: Arc::clone(&self.configured),
                    kind,
                    namespace: namespace.to_string(),
                    reference: cm.clone(),
                    spec: spec.clone(),
                    limits,
                    label,
                    decider: decider.clone(),
                    backoff: self.backoff,
                    last_seen: None,
                    retry: None,
                };
                Ok(LoadedPolicy {
                    decider,
                    following: Some(Following {
                        task: tokio::spawn(follower.run(versions)),
                        _watch: watch,
                    }),
                })
            }
        }
    }

    async fn builtin(
        &self,
        kind: PolicyKind,
        name: &str,
        spec: &PolicyRef,
        label: &str,
        limits: CallLimits,
    ) -> Result<Arc<Policy>, PolicyError> {
        let builtin = super::bundled::find(kind, name)?;
        check_pin(spec, builtin.wasm)?;
        self.configured
            .get_or_configure(
                &self.engine,
                Cow::Borrowed(builtin.wasm),
                kind,
                label,
                spec.settings.as_ref(),
                limits,
            )
            .await
    }
}

/// Refuses bytes whose digest differs from the reference's pin.
fn check_pin(spec: &PolicyRef, wasm: &[u8]) -> Result<(), PolicyError> {
    if let Some(expected) = &spec.sha256 {
        let actual = hex::encode(Sha256::digest(wasm));
        if !expected.trim().eq_ignore_ascii_case(&actual) {
            return Err(PolicyError::DigestMismatch {
                expected: expected.clone(),
                actual,
            });
        }
    }
    Ok(())
}

/// What a watched ConfigMap holds, as its watch last saw it.
#[derive(Debug)]
enum Version {
    /// The ConfigMap as it is now.
    Present(Box<ConfigMap>),
    /// It does not exist (any more).
    Absent,
    /// The watch failed; it retries by itself.
    ReadFailed(String),
}

/// The watches the loader runs, by namespace and name. Entries are weak:
/// the references hold the watches, and the last one to go stops it.
#[derive(Default)]
struct Watches {
    live: Mutex<HashMap<(String, String), Weak<SharedWatch>>>,
}

impl Watches {
    fn live(&self) -> usize {
        let live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        live.values()
            .filter(|watch| watch.strong_count() > 0)
            .count()
    }

    /// A share of the watch of `namespace/name`, started if nobody holds
    /// one, and the versions it sees from now on (starting with the
    /// latest one it has seen, if any).
    fn subscribe(
        self: &Arc<Self>,
        client: &Client,
        namespace: &str,
        name: &str,
    ) -> (Arc<SharedWatch>, UnboundedReceiver<Arc<Version>>) {
        let key = (namespace.to_string(), name.to_string());
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        let watch = match live.get(&key).and_then(Weak::upgrade) {
            Some(watch) => watch,
            None => {
                let hub = Arc::new(Mutex::new(Hub::default()));
                let api = Api::namespaced(client.clone(), namespace);
                let watch = Arc::new(SharedWatch {
                    key: key.clone(),
                    hub: Arc::clone(&hub),
                    task: tokio::spawn(watch_configmap(api, name.to_string(), hub)),
                    registry: Arc::downgrade(self),
                });
                live.insert(key, Arc::downgrade(&watch));
                watch
            }
        };
        let versions = watch
            .hub
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .subscribe();
        (watch, versions)
    }
}

/// The watch of one ConfigMap, shared by every reference that follows it.
struct SharedWatch {
    key: (String, String),
    hub: Arc<Mutex<Hub>>,
    task: JoinHandle<()>,
    registry: Weak<Watches>,
}

impl Drop for SharedWatch {
    fn drop(&mut self) {
        self.task.abort();
        if let Some(registry) = self.registry.upgrade() {
            let mut live = registry.live.lock().unwrap_or_else(|e| e.into_inner());
            // A reference may have started a new watch of the same
            // ConfigMap while this one was being dropped; that one stays.
            if live
                .get(&self.key)
                .is_some_and(|watch| watch.strong_count() == 0)
            {
                live.remove(&self.key);
            }
        }
    }
}

/// Hands every version a watch sees to each subscriber, in order.
#[derive(Default)]
struct Hub {
    latest: Option<Arc<Version>>,
    subscribers: Vec<UnboundedSender<Arc<Version>>>,
}

impl Hub {
    fn publish(&mut self, version: Version) {
        let version = Arc::new(version);
        self.subscribers
            .retain(|subscriber| subscriber.send(Arc::clone(&version)).is_ok());
        self.latest = Some(version);
    }

    fn subscribe(&mut self) -> UnboundedReceiver<Arc<Version>> {
        let (sender, receiver) = unbounded_channel();
        if let Some(latest) = &self.latest {
            // Cannot fail: the receiver is right here.
            let _ = sender.send(Arc::clone(latest));
        }
        self.subscribers.push(sender);
        receiver
    }
}

/// The task behind a [`SharedWatch`]: follows one ConfigMap by name.
async fn watch_configmap(api: Api<ConfigMap>, name: String, hub: Arc<Mutex<Hub>>) {
    let publish = |version: Version| {
        hub.lock()
            .unwrap_or_else(|e| e.into_inner())
            .publish(version);
    };
    let config = crate::watch::config().fields(&format!("metadata.name={name}"));
    let mut events = watcher(api, config)
        .backoff(crate::watch::WatchBackoff::default())
        .boxed();
    let mut listed = false;
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Init) => listed = false,
            Ok(watcher::Event::InitApply(cm) | watcher::Event::Apply(cm)) => {
                listed = true;
                publish(Version::Present(Box::new(cm)));
            }
            Ok(watcher::Event::InitDone) if !listed => publish(Version::Absent),
            Ok(watcher::Event::InitDone) => {}
            Ok(watcher::Event::Delete(_)) => publish(Version::Absent),
            Err(err) => publish(Version::ReadFailed(err.to_string())),
        }
    }
}

/// What a ConfigMap held last time a reference looked at it, so an update
/// that does not change the module (a label, an annotation, a resync) is
/// not reloaded or reported again.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Seen {
    /// This digest decides.
    Loaded(String),
    /// This digest failed for a reason it will fail for again.
    Refused(String),
    /// This digest failed for a transient reason and is being retried.
    Retrying(String),
    /// The ConfigMap could not be used; the message says why.
    Problem(String),
    Absent,
}

/// A version waiting to be tried again.
struct Retry {
    wasm: Vec<u8>,
    digest: String,
    failures: u32,
    at: Instant,
}

/// One reference following its ConfigMap's versions.
struct Follower {
    engine: PolicyEngine,
    configured: Arc<Configured>,
    kind: PolicyKind,
    namespace: String,
    reference: ConfigMapPolicyRef,
    spec: PolicyRef,
    limits: CallLimits,
    label: String,
    decider: Decider,
    backoff: RetryBackoff,
    last_seen: Option<Seen>,
    retry: Option<Retry>,
}

impl Follower {
    async fn run(mut self, mut versions: UnboundedReceiver<Arc<Version>>) {
        loop {
            let retry_at = self.retry.as_ref().map(|retry| retry.at);
            tokio::select! {
                version = versions.recv() => match version {
                    Some(version) => self.on_version(&version).await,
                    None => return,
                },
                () = tokio::time::sleep_until(retry_at.unwrap_or_else(Instant::now)),
                    if retry_at.is_some() =>
                {
                    if let Some(retry) = self.retry.take() {
                        self.attempt(retry.wasm, retry.digest, retry.failures).await;
                    }
                }
            }
        }
    }

    fn report(&self, event: PolicyEvent) {
        self.decider
            .reporter()
            .report(self.kind, &self.label, event);
    }

    async fn on_version(&mut self, version: &Version) {
        match version {
            Version::Present(cm) => self.apply(cm).await,
            Version::Absent => {
                self.retry = None;
                self.absent();
            }
            Version::ReadFailed(message) => {
                let error = PolicyError::ConfigMapRead(message.clone());
                self.problem(error.to_string(), error);
            }
        }
    }

    fn problem(&mut self, key: String, error: PolicyError) {
        let seen = Seen::Problem(key);
        if self.last_seen.as_ref() == Some(&seen) {
            return;
        }
        self.last_seen = Some(seen);
        self.report(PolicyEvent::LoadFailed {
            reason: error.reason().to_string(),
            message: error.to_string(),
        });
    }

    fn absent(&mut self) {
        if self.last_seen == Some(Seen::Absent) {
            return;
        }
        self.last_seen = Some(Seen::Absent);
        let error = PolicyError::ConfigMapMissing {
            namespace: self.namespace.clone(),
            name: self.reference.name.clone(),
        };
        self.report(PolicyEvent::LoadFailed {
            reason: error.reason().to_string(),
            message: format!("{error}; the last good version keeps deciding"),
        });
    }

    async fn apply(&mut self, cm: &ConfigMap) {
        let key = &self.reference.key;
        let Some(bytes) = cm.binary_data.as_ref().and_then(|d| d.get(key)) else {
            let in_data = cm.data.as_ref().is_some_and(|d| d.contains_key(key));
            let mut keys: Vec<&String> = cm.binary_data.iter().flat_map(|d| d.keys()).collect();
            keys.extend(cm.data.iter().flat_map(|d| d.keys()));
            let hint = if in_data {
                " (it is under data; a module must be stored as binaryData)".to_string()
            } else if keys.is_empty() {
                " (the ConfigMap is empty)".to_string()
            } else {
                format!(
                    " (it holds {})",
                    keys.iter()
                        .map(|k| k.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            let error = PolicyError::ConfigMapKeyMissing {
                name: self.reference.name.clone(),
                key: key.clone(),
                hint,
            };
            self.retry = None;
            self.problem(error.to_string(), error);
            return;
        };
        let wasm = bytes.0.clone();
        let digest = hex::encode(Sha256::digest(&wasm));
        let judged = matches!(
            &self.last_seen,
            Some(Seen::Loaded(d) | Seen::Refused(d) | Seen::Retrying(d)) if *d == digest
        );
        if judged {
            // Unchanged; a version being retried keeps its own schedule.
            return;
        }
        self.retry = None;
        self.attempt(wasm, digest, 0).await;
    }

    /// Tries a version that has failed `failures` times before.
    async fn attempt(&mut self, wasm: Vec<u8>, digest: String, failures: u32) {
        let error = match self.load(wasm.clone()).await {
            Ok(policy) => {
                self.decider.swap(policy);
                self.last_seen = Some(Seen::Loaded(digest.clone()));
                self.report(PolicyEvent::Loaded { sha256: digest });
                return;
            }
            Err(error) => error,
        };
        let failures = failures + 1;
        let message = match AfterFailure::decide(&error, failures, &self.backoff) {
            AfterFailure::GiveUp => {
                self.last_seen = Some(Seen::Refused(digest));
                error.to_string()
            }
            AfterFailure::RetryIn(delay) => {
                self.last_seen = Some(Seen::Retrying(digest.clone()));
                self.retry = Some(Retry {
                    wasm,
                    digest,
                    failures,
                    at: Instant::now() + delay,
                });
                format!(
                    "{error}; this may pass, so it is tried again in {} ms (attempt {failures})",
                    delay.as_millis()
                )
            }
        };
        self.report(PolicyEvent::LoadFailed {
            reason: error.reason().to_string(),
            message,
        });
    }

    /// Compiles and configures a version beside the running one.
    async fn load(&self, wasm: Vec<u8>) -> Result<Arc<Policy>, PolicyError> {
        check_pin(&self.spec, &wasm)?;
        self.configured
            .get_or_configure(
                &self.engine,
                Cow::Owned(wasm),
                self.kind,
                &self.label,
                self.spec.settings.as_ref(),
                self.limits,
            )
            .await
    }
}

/// What makes two configured policies interchangeable.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Configuration {
    sha256: [u8; 32],
    kind: PolicyKind,
    label: String,
    /// The settings as JSON text; two spellings of the same settings are
    /// two entries, which costs a configuration, never a wrong answer.
    settings: String,
    deadline: Duration,
    memory: usize,
}

/// The configured policies alive now, by [`Configuration`]; see the
/// module's documentation.
#[derive(Default)]
struct Configured {
    /// Each slot is locked while its policy is configured, so a thousand
    /// scale sets reconciled at once configure it once and the others wait
    /// for that one.
    slots: Mutex<HashMap<Configuration, Arc<tokio::sync::Mutex<Weak<Policy>>>>>,
}

impl Configured {
    /// The policy configured from `wasm`, `settings` and `limits` under
    /// `label`: the live one if any, otherwise compiled (on the blocking
    /// pool: tens to hundreds of milliseconds the first time), validated
    /// and kept.
    async fn get_or_configure(
        &self,
        engine: &PolicyEngine,
        wasm: Cow<'static, [u8]>,
        kind: PolicyKind,
        label: &str,
        settings: Option<&serde_json::Value>,
        limits: CallLimits,
    ) -> Result<Arc<Policy>, PolicyError> {
        let settings = match settings {
            None | Some(serde_json::Value::Null) => None,
            Some(value) => Some(value.clone()),
        };
        let key = Configuration {
            sha256: Sha256::digest(&wasm).into(),
            kind,
            label: label.to_string(),
            settings: settings
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default(),
            deadline: limits.deadline,
            memory: limits.memory,
        };
        let slot = {
            let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            // Forget the slots nobody waits on whose policy is gone.
            slots.retain(|_, slot| {
                Arc::strong_count(slot) > 1
                    || slot.try_lock().map_or(true, |held| held.strong_count() > 0)
            });
            Arc::clone(slots.entry(key).or_default())
        };
        let mut held = slot.lock().await;
        if let Some(policy) = held.upgrade() {
            return Ok(policy);
        }
        let compiler = engine.clone();
        let module = tokio::task::spawn_blocking(move || compiler.load(&wasm, Some(kind)))
            .await
            .map_err(|e| PolicyError::Join(e.to_string()))??;
        let policy = Arc::new(Policy::configure(Arc::new(module), label, settings, limits).await?);
        *held = Arc::downgrade(&policy);
        Ok(policy)
    }

    /// How many configured policies are alive.
    fn live(&self) -> usize {
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots
            .values()
            .filter(|slot| slot.try_lock().map_or(true, |held| held.strong_count() > 0))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_parse_with_defaults() {
        let spec: PolicyRef =
            serde_yaml::from_str("configMapRef: {name: my-policy}\nsettings: {idle: 2}\n").unwrap();
        assert_eq!(spec.config_map_ref.as_ref().unwrap().key, "policy.wasm");
        assert_eq!(
            spec.label(PolicyKind::Scaling, "ci"),
            "configmap:ci/my-policy"
        );
        assert_eq!(spec.limits().unwrap(), CallLimits::default());
        assert_eq!(
            PolicyRef::default().label(PolicyKind::Deregistration, "ci"),
            "builtin:exit-code"
        );
    }

    #[test]
    fn limits_out_of_bounds_are_refused() {
        let spec = PolicyRef {
            timeout_millis: Some(5_000),
            ..PolicyRef::default()
        };
        assert!(matches!(
            spec.limits(),
            Err(PolicyError::LimitOutOfRange { .. })
        ));
        let spec = PolicyRef {
            memory_limit_mib: Some(32),
            timeout_millis: Some(100),
            ..PolicyRef::default()
        };
        let limits = spec.limits().unwrap();
        assert_eq!(limits.memory, 32 << 20);
        assert_eq!(limits.deadline, Duration::from_millis(100));
    }

    #[test]
    fn transient_failures_are_retried_with_growing_delays_and_others_are_not() {
        let backoff = RetryBackoff {
            first: Duration::from_millis(100),
            max: Duration::from_secs(1),
        };
        let timeout = PolicyError::Timeout {
            deadline: Duration::from_millis(50),
        };
        let table = [
            (
                &timeout,
                1,
                AfterFailure::RetryIn(Duration::from_millis(100)),
            ),
            (
                &timeout,
                2,
                AfterFailure::RetryIn(Duration::from_millis(200)),
            ),
            (
                &timeout,
                4,
                AfterFailure::RetryIn(Duration::from_millis(800)),
            ),
            (&timeout, 5, AfterFailure::RetryIn(Duration::from_secs(1))),
            (&timeout, 400, AfterFailure::RetryIn(Duration::from_secs(1))),
            (
                &PolicyError::Instantiate("pool".into()),
                1,
                AfterFailure::RetryIn(Duration::from_millis(100)),
            ),
            (&PolicyError::NotWebAssembly, 1, AfterFailure::GiveUp),
            (&PolicyError::Compile("bad".into()), 1, AfterFailure::GiveUp),
            (
                &PolicyError::SettingsRejected("idle".into()),
                1,
                AfterFailure::GiveUp,
            ),
            (
                &PolicyError::DigestMismatch {
                    expected: "a".into(),
                    actual: "b".into(),
                },
                1,
                AfterFailure::GiveUp,
            ),
            (
                &PolicyError::WrongKind {
                    found: PolicyKind::Deregistration,
                    expected: PolicyKind::Scaling,
                },
                1,
                AfterFailure::GiveUp,
            ),
        ];
        for (error, failures, expected) in table {
            assert_eq!(
                AfterFailure::decide(error, failures, &backoff),
                expected,
                "{error} after {failures} failures"
            );
        }
        assert_eq!(
            RetryBackoff::default().delay(u32::MAX),
            Duration::from_secs(300)
        );
    }

    #[test]
    fn pins_compare_digests() {
        let wasm = b"module bytes";
        let actual = hex::encode(Sha256::digest(wasm));
        let pinned = PolicyRef {
            sha256: Some(actual.to_uppercase()),
            ..PolicyRef::default()
        };
        assert!(check_pin(&pinned, wasm).is_ok());
        let wrong = PolicyRef {
            sha256: Some("00".repeat(32)),
            ..PolicyRef::default()
        };
        let message = check_pin(&wrong, wasm).unwrap_err().to_string();
        assert!(message.contains(&actual), "{message}");
    }
}
