//! Types the three kinds share: where GitHub is and how to reach it, extra
//! metadata for the objects a kind creates, the policy references, and the
//! runner pod template's schema.
//!
//! Field names are ARC's, so a manifest moves over by changing the group.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMapKeySelector, PodSpec, PodTemplateSpec};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::policy::loader::PolicyRef;

/// An HTTP(S) proxy the controller (and the runners) reach GitHub through.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxySpec {
    /// The proxy for `http://` URLs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<ProxyServer>,
    /// The proxy for `https://` URLs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub https: Option<ProxyServer>,
    /// Hosts reached directly.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub no_proxy: Vec<String>,
}

/// One proxy server.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxyServer {
    /// The proxy URL, e.g. `http://proxy.internal:3128`.
    pub url: String,
    /// A Secret in the same namespace with `username` and `password`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_secret_ref: Option<String>,
}

/// TLS settings for a GitHub Enterprise Server with a private CA.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GitHubServerTls {
    /// Where the CA bundle is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_from: Option<TlsCertificateSource>,
    /// The directory the bundle is mounted in, in the runner container (as
    /// ARC's `runnerMountPath`): the runner and the actions it runs trust
    /// it (`NODE_EXTRA_CA_CERTS` names the file, `RUNNER_UPDATE_CA_CERTS=1`
    /// adds it to the system store). Omitted: the bundle is the
    /// controller's only, and runners must trust the server some other way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^/"))]
    pub runner_mount_path: Option<String>,
}

/// A CA bundle in a ConfigMap.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TlsCertificateSource {
    /// The ConfigMap key holding the PEM bundle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_key_ref: Option<ConfigMapKeySelector>,
}

/// Labels and annotations added to objects a kind creates.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourceMeta {
    /// Extra labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    /// Extra annotations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

/// The three policy references an AutoscalingRunnerSet declares, carried
/// down unchanged to its EphemeralRunnerSet and EphemeralRunners so each
/// reconciler reads the reference of the decision it makes from its own
/// object. Omitted means the bundled default of the kind.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyRefs {
    /// How many runners the scale set wants.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaling_policy: Option<PolicyRef>,
    /// Whether a finished runner still holds a registration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deregistration_policy: Option<PolicyRef>,
    /// Whether the runner pod template is acceptable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_validation_policy: Option<PolicyRef>,
    /// A candidate scaling policy, asked on every decision with the same
    /// input and its own state, and never applied: its answers are in
    /// `status.scaling.shadow` and the `arcwright_shadow_*` metrics. It has
    /// no fallback: when it fails, the status says why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow_scaling_policy: Option<PolicyRef>,
    /// A candidate deregistration policy, asked beside the active one for
    /// every finished runner; verdicts are compared and counted
    /// (`arcwright_shadow_verdicts_total`), never acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow_deregistration_policy: Option<PolicyRef>,
    /// A candidate pod-validation policy, judging every template beside
    /// the active one: what it would refuse is in the
    /// `ShadowPodTemplateAccepted` condition, and nothing is blocked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow_pod_validation_policy: Option<PolicyRef>,
}

impl PolicyRefs {
    /// The references with the shadows left out: what runners are built
    /// from. A shadow changes no runner, so adding or changing one must not
    /// count as a new revision of the runner spec.
    pub fn active(&self) -> PolicyRefs {
        PolicyRefs {
            scaling_policy: self.scaling_policy.clone(),
            deregistration_policy: self.deregistration_policy.clone(),
            pod_validation_policy: self.pod_validation_policy.clone(),
            shadow_scaling_policy: None,
            shadow_deregistration_policy: None,
            shadow_pod_validation_policy: None,
        }
    }
}

/// The shape of the durations the debug settings take: whole hours,
/// minutes and seconds (`30m`, `1h30m`, `90s`). Refused by the apiserver
/// otherwise, so `30 mins` fails at `kubectl apply` rather than when the first
/// job fails; the controller parses the same form ([`crate::debug::hold`]).
pub const DURATION_PATTERN: &str = r"^([0-9]+h([0-9]+m)?([0-9]+s)?|[0-9]+m([0-9]+s)?|[0-9]+s)$";

/// Holding a failed job's runner for someone to look inside (meows' debug
/// hold), declared on the AutoscalingRunnerSet and carried down unchanged to
/// its EphemeralRunnerSet and EphemeralRunners like the policies, so the
/// runner's reconciler reads it from its own object.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DebugSpec {
    /// How long the pod of a runner whose job failed is kept after the job
    /// ended (`30m`, `1h30m`). Its registration is removed at once, so it
    /// takes no other job. Omitted: failed runners are removed as usual.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub hold_failed_for: Option<String>,
    /// The latest a hold may be extended to, counted from the job's end
    /// (the `arcwright.dev/hold-until` annotation, the Slack button and the
    /// hold API are capped by it). Omitted: `holdFailedFor`, so nothing is
    /// held longer than declared unless extensions are allowed here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub max_hold: Option<String>,
    /// At most this many runners of the scale set are held at once; a
    /// failure beyond it is removed as usual. Omitted: 5, because every
    /// held pod keeps its node resources while the set creates replacements
    /// (a broken main branch must not fill the cluster with held pods).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub max_held: Option<i32>,
    /// Where a held failure is announced in Slack.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slack: Option<SlackSpec>,
}

/// A Slack channel and the bot token that posts to it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SlackSpec {
    /// The channel id (`C0123456789`) or name (`#ci-failures`).
    #[schemars(length(min = 1))]
    pub channel: String,
    /// The Secret key holding the bot token (`xoxb-...`), in the scale
    /// set's namespace.
    pub token_secret_ref: SecretKeyRef,
}

/// A key of a Secret in the same namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// The Secret's name.
    #[schemars(length(min = 1))]
    pub name: String,
    /// The key; `token` when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// Which labels the listener's per-job metrics carry, in the shape of ARC's
/// `listenerMetrics` (metric name to its labels), so an ARC values file
/// keeps its choice. The per-job metrics are the ones whose labels are
/// chosen here: `gha_started_jobs_total` and `gha_completed_jobs_total`
/// under `counters`, `gha_job_startup_duration_seconds` and
/// `gha_job_execution_duration_seconds` under `histograms`. Every series
/// also carries `name` and `namespace`, since one host serves many scale
/// sets. Omitted: `enterprise`, `organization`, `repository`, `event_name`
/// (and `job_result` on completions), which stays small however many
/// workflows there are; add `job_name` or the `job_workflow_*` labels for
/// per-workflow panels, at a series per job name.
///
/// The gauges' labels (`gauges`) and histogram `buckets` are accepted from
/// ARC values and not changed: the gauges are per scale set, and the
/// buckets are ARC's defaults, 10 ms to an hour.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetricsConfig {
    /// Counters by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub counters: BTreeMap<String, MetricLabels>,
    /// Gauges by name (accepted, not changed).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub gauges: BTreeMap<String, MetricLabels>,
    /// Histograms by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub histograms: BTreeMap<String, HistogramMetric>,
}

/// The labels of one metric.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MetricLabels {
    /// The labels, by ARC's names.
    #[serde(default)]
    pub labels: Vec<JobLabel>,
}

/// The labels of one histogram, and its buckets (accepted, not changed).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct HistogramMetric {
    /// The labels, by ARC's names.
    #[serde(default)]
    pub labels: Vec<JobLabel>,
    /// ARC's bucket bounds, in seconds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub buckets: Vec<f64>,
}

/// A label a listener metric may carry, by ARC's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobLabel {
    /// The AutoscalingRunnerSet's name (always carried).
    Name,
    /// Its namespace (always carried).
    Namespace,
    /// The enterprise of the configuration URL.
    Enterprise,
    /// The organisation (the repository's owner).
    Organization,
    /// The job's repository.
    Repository,
    /// The job's display name.
    JobName,
    /// The event that started the workflow run.
    EventName,
    /// `owner/repo/.github/workflows/file.yml@ref`.
    JobWorkflowRef,
    /// The workflow file's name without its extension.
    JobWorkflowName,
    /// The ref the workflow ran on (`heads/main`, `pull/42`).
    JobWorkflowTarget,
    /// `succeeded`, `failed`, `canceled`, ... (completions only).
    JobResult,
}

/// The schema of a full `PodTemplateSpec`, as k8s-openapi describes it, with
/// what the API server refuses in a CRD corrected.
///
/// The template is validated, not preserved as unknown fields: a typo in a
/// runner template is caught when the manifest is applied, not when the
/// hundredth runner pod fails to be created. k8s-openapi describes
/// `Quantity` as a plain string, but Kubernetes accepts `cpu: 1` as well as
/// `cpu: "1"`, so quantities are declared int-or-string as the built-in
/// types do; otherwise a manifest that works for a Deployment would be
/// refused here.
///
/// A pod's `containers` and `initContainers` are bounded
/// ([`MAX_CONTAINERS`]), which Kubernetes itself does not do: every runner
/// copies the template into its EphemeralRunner and its pod, so a template
/// of thousands of containers, accepted, would cost etcd its size times the
/// number of runners. Refused at `kubectl apply`, it costs nothing.
pub fn pod_template_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    corrected::<PodTemplateSpec>(generator)
}

/// The schema of a `PodSpec` (the EphemeralRunner inlines its template), corrected
/// as [`pod_template_schema`] says.
pub fn pod_spec_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    corrected::<PodSpec>(generator)
}

/// The most containers, and the most init containers, a runner pod
/// template may have: far above what a runner needs (ARC's dind mode has
/// two and one), far below what would make every runner object a burden.
pub const MAX_CONTAINERS: u64 = 64;

fn corrected<T: JsonSchema>(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = generator.subschema_for::<T>();
    if let Some(map) = schema.as_object_mut() {
        map.values_mut().for_each(fix_quantities);
        let mut root = serde_json::Value::Object(std::mem::take(map));
        bound_containers(&mut root);
        if let serde_json::Value::Object(root) = root {
            *map = root;
        }
    }
    schema
}

/// Sets `maxItems` on the container lists of every pod spec in the schema
/// (an object schema whose properties hold `containers` and
/// `restartPolicy`).
fn bound_containers(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            if let Some(serde_json::Value::Object(properties)) = map.get_mut("properties")
                && properties.contains_key("containers")
                && properties.contains_key("restartPolicy")
            {
                for list in ["containers", "initContainers"] {
                    if let Some(serde_json::Value::Object(list)) = properties.get_mut(list) {
                        list.insert("maxItems".into(), MAX_CONTAINERS.into());
                    }
                }
            }
            map.values_mut().for_each(bound_containers);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(bound_containers),
        _ => {}
    }
}

/// Rewrites every `Quantity` (recognised by its description, the only
/// marker k8s-openapi leaves once subschemas are inlined) as int-or-string.
fn fix_quantities(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            let is_quantity = map.get("type").and_then(|t| t.as_str()) == Some("string")
                && map
                    .get("description")
                    .and_then(|d| d.as_str())
                    .is_some_and(|d| d.starts_with("Quantity is a fixed-point"));
            if is_quantity {
                map.remove("type");
                map.remove("format");
                map.insert("x-kubernetes-int-or-string".into(), true.into());
            }
            for child in map.values_mut() {
                fix_quantities(child);
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(fix_quantities),
        _ => {}
    }
}
