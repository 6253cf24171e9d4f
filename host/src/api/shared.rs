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
pub fn pod_template_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    corrected::<PodTemplateSpec>(generator)
}

/// The schema of a `PodSpec` (the EphemeralRunner inlines its template), corrected
/// as [`pod_template_schema`] says.
pub fn pod_spec_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    corrected::<PodSpec>(generator)
}

fn corrected<T: JsonSchema>(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = generator.subschema_for::<T>();
    if let Some(map) = schema.as_object_mut() {
        map.values_mut().for_each(fix_quantities);
    }
    schema
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
