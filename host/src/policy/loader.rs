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

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::task::JoinHandle;

use super::{
    CallLimits, Decider, Policy, PolicyEngine, PolicyError, PolicyEvent, PolicyKind, PolicyReporter,
};

/// How often a version that failed for a transient reason is tried again
/// before it is reported as failed.
const TRANSIENT_RETRIES: u32 = 3;

/// The wait before the first retry; later retries wait longer (linearly).
const TRANSIENT_RETRY_DELAY: Duration = Duration::from_millis(200);

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

/// A reference turned into a decider, plus the watch keeping it current.
/// Dropping it stops the watch.
pub struct LoadedPolicy {
    decider: Decider,
    watch: Option<JoinHandle<()>>,
}

impl LoadedPolicy {
    /// The decider the reconcilers call.
    pub fn decider(&self) -> &Decider {
        &self.decider
    }
}

impl Drop for LoadedPolicy {
    fn drop(&mut self) {
        if let Some(watch) = self.watch.take() {
            watch.abort();
        }
    }
}

/// Loads policy references; one per controller.
#[derive(Clone)]
pub struct PolicyLoader {
    engine: PolicyEngine,
    client: Option<Client>,
}

impl PolicyLoader {
    /// A loader for `engine`; `client` is needed for ConfigMap references.
    pub fn new(engine: PolicyEngine, client: Option<Client>) -> Self {
        Self { engine, client }
    }

    /// The bundled default of `kind`, configured with no settings.
    pub async fn default_policy(&self, kind: PolicyKind) -> Result<Arc<Policy>, PolicyError> {
        let name = kind.default_builtin();
        let module = Arc::new(self.engine.load_builtin(kind, name)?);
        Ok(Arc::new(
            Policy::configure(
                module,
                format!("builtin:{name}"),
                None,
                CallLimits::default(),
            )
            .await?,
        ))
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
        let spec = spec.cloned().unwrap_or_default();
        let label = spec.label(kind, namespace);
        let decider = Decider::new(Arc::clone(&fallback), fallback, Arc::clone(&reporter));
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
                return Ok(LoadedPolicy {
                    decider,
                    watch: None,
                });
            }
        };
        match (&spec.builtin, &spec.config_map_ref) {
            (Some(_), Some(_)) => {
                fail(PolicyError::InvalidReference(
                    "it names both a builtin and a configMapRef; choose one".into(),
                ));
                Ok(LoadedPolicy {
                    decider,
                    watch: None,
                })
            }
            (None, None)
                if spec.settings.is_none()
                    && spec.timeout_millis.is_none()
                    && spec.memory_limit_mib.is_none() =>
            {
                Ok(LoadedPolicy {
                    decider,
                    watch: None,
                })
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
                Ok(LoadedPolicy {
                    decider,
                    watch: None,
                })
            }
            (None, Some(cm)) => {
                let Some(client) = self.client.clone() else {
                    fail(PolicyError::InvalidReference(
                        "a configMapRef needs a connection to the API server".into(),
                    ));
                    return Ok(LoadedPolicy {
                        decider,
                        watch: None,
                    });
                };
                let watch = ConfigMapWatch {
                    engine: self.engine.clone(),
                    api: Api::namespaced(client, namespace),
                    kind,
                    namespace: namespace.to_string(),
                    reference: cm.clone(),
                    spec: spec.clone(),
                    limits,
                    label,
                    decider: decider.clone(),
                    last_seen: None,
                };
                Ok(LoadedPolicy {
                    decider,
                    watch: Some(tokio::spawn(watch.run())),
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
        let module = Arc::new(self.engine.load(builtin.wasm, Some(kind))?);
        let policy = Policy::configure(module, label, spec.settings.clone(), limits).await?;
        Ok(Arc::new(policy))
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

/// What a ConfigMap held last time it was looked at, so an update that does
/// not change the module (a label, an annotation, a resync) is not reloaded
/// or reported again.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Seen {
    Module(String),
    Problem(String),
    Absent,
}

/// The task that follows one ConfigMap.
struct ConfigMapWatch {
    engine: PolicyEngine,
    api: Api<ConfigMap>,
    kind: PolicyKind,
    namespace: String,
    reference: ConfigMapPolicyRef,
    spec: PolicyRef,
    limits: CallLimits,
    label: String,
    decider: Decider,
    last_seen: Option<Seen>,
}

impl ConfigMapWatch {
    async fn run(mut self) {
        let config =
            watcher::Config::default().fields(&format!("metadata.name={}", self.reference.name));
        let mut events = watcher(self.api.clone(), config).default_backoff().boxed();
        let mut listed = false;
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::Init) => listed = false,
                Ok(watcher::Event::InitApply(cm) | watcher::Event::Apply(cm)) => {
                    listed = true;
                    self.apply(&cm).await;
                }
                Ok(watcher::Event::InitDone) if !listed => self.absent(),
                Ok(watcher::Event::InitDone) => {}
                Ok(watcher::Event::Delete(_)) => self.absent(),
                Err(err) => {
                    let error = PolicyError::ConfigMapRead(err.to_string());
                    self.problem(error.to_string(), error);
                }
            }
        }
    }

    fn report(&self, event: PolicyEvent) {
        self.decider
            .reporter()
            .report(self.kind, &self.label, event);
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
            self.problem(error.to_string(), error);
            return;
        };
        let wasm = bytes.0.clone();
        let digest = hex::encode(Sha256::digest(&wasm));
        if self.last_seen == Some(Seen::Module(digest.clone())) {
            return;
        }
        self.last_seen = Some(Seen::Module(digest.clone()));
        // A version is judged once per digest, so a failure that only the
        // machine caused (validate-settings missing its deadline on a loaded
        // node) is retried here: otherwise a good version would stay
        // refused until someone edited the ConfigMap again.
        let mut attempt = 0;
        let outcome = loop {
            match self.load(wasm.clone()).await {
                Err(error) if error.is_transient() && attempt < TRANSIENT_RETRIES => {
                    attempt += 1;
                    tokio::time::sleep(TRANSIENT_RETRY_DELAY * attempt).await;
                }
                other => break other,
            }
        };
        match outcome {
            Ok(policy) => {
                self.decider.swap(policy);
                self.report(PolicyEvent::Loaded { sha256: digest });
            }
            Err(error) => self.report(PolicyEvent::LoadFailed {
                reason: error.reason().to_string(),
                message: error.to_string(),
            }),
        }
    }

    /// Compiles and configures a version beside the running one.
    async fn load(&self, wasm: Vec<u8>) -> Result<Arc<Policy>, PolicyError> {
        check_pin(&self.spec, &wasm)?;
        let engine = self.engine.clone();
        let kind = self.kind;
        // Compiling is CPU-bound for tens to hundreds of milliseconds.
        let module = tokio::task::spawn_blocking(move || engine.load(&wasm, Some(kind)))
            .await
            .map_err(|e| PolicyError::Join(e.to_string()))??;
        let policy = Policy::configure(
            Arc::new(module),
            self.label.clone(),
            self.spec.settings.clone(),
            self.limits,
        )
        .await?;
        Ok(Arc::new(policy))
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
