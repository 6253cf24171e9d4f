//! The cluster-wide default policies: what a scale set gets when its spec
//! names no policy of a kind (`--default-policies`, the controller chart's
//! `defaultPolicies`).
//!
//! A default is a bundled policy with settings and limits, never a
//! ConfigMap: a ConfigMap reference is looked up in the object's own
//! namespace, so a cluster-wide one would mean a different module in each
//! namespace, or none. Teams that want their own module name it in their
//! scale set.
//!
//! The file is read and every default configured once at start-up, and a
//! bad one stops the process with its reason. That is stricter than a bad
//! reference in a scale set (reported on the object, the bundled default
//! decides meanwhile): a scale set's mistake is its own, but a wrong
//! default would quietly apply to every scale set that trusted it, and the
//! admin who wrote it is the one watching the rollout.
//!
//! The bundled default stays the fallback whatever is configured here: a
//! policy that fails mid-decision falls back to code that ships with the
//! controller and cannot be misconfigured.

use serde::Deserialize;

use super::PolicyKind;
use super::loader::PolicyRef;

/// The default reference of each kind; a kind left out keeps its bundled
/// default.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DefaultPolicies {
    /// How many runners a scale set needs.
    #[serde(default)]
    pub scaling: Option<PolicyRef>,
    /// Whether a finished runner still holds a registration.
    #[serde(default)]
    pub deregistration: Option<PolicyRef>,
    /// Whether a runner pod template is acceptable.
    #[serde(default)]
    pub pod_validation: Option<PolicyRef>,
}

/// Why a default-policies file is refused.
#[derive(Debug, thiserror::Error)]
pub enum DefaultPoliciesError {
    /// Not the documented shape.
    #[error("the default policies are not valid YAML of the documented shape: {0}")]
    Parse(#[from] serde_yaml::Error),
    /// A default names a ConfigMap.
    #[error(
        "the default {kind} policy names a configMapRef; a default must be a builtin (a \
         ConfigMap is looked up in each scale set's namespace, so name it in the scale set)"
    )]
    ConfigMap {
        /// The kind.
        kind: PolicyKind,
    },
    /// A default names no builtin (an empty reference is the bundled default
    /// anyway, so this is a typo such as `buildin:`).
    #[error("the default {kind} policy names no builtin")]
    NoBuiltin {
        /// The kind.
        kind: PolicyKind,
    },
    /// A default cannot be configured (unknown builtin, settings it refuses,
    /// limits out of bounds, a pin that does not match).
    #[error("the default {kind} policy cannot be used: {source}")]
    Unusable {
        /// The kind.
        kind: PolicyKind,
        /// Why.
        #[source]
        source: super::PolicyError,
    },
}

impl DefaultPolicies {
    /// Parses the file's text and checks its shape; whether each builtin
    /// exists and accepts its settings is checked by
    /// [`PolicyLoader::check_defaults`](super::loader::PolicyLoader::check_defaults).
    pub fn from_yaml(text: &str) -> Result<Self, DefaultPoliciesError> {
        // An empty file (a chart with every default removed) is no defaults.
        let parsed: Option<Self> = serde_yaml::from_str(text)?;
        let parsed = parsed.unwrap_or_default();
        for kind in PolicyKind::ALL {
            let Some(spec) = parsed.get(kind) else {
                continue;
            };
            if spec.config_map_ref.is_some() {
                return Err(DefaultPoliciesError::ConfigMap { kind });
            }
            if spec.builtin.is_none() {
                return Err(DefaultPoliciesError::NoBuiltin { kind });
            }
        }
        Ok(parsed)
    }

    /// The configured default of `kind`, if any.
    pub fn get(&self, kind: PolicyKind) -> Option<&PolicyRef> {
        match kind {
            PolicyKind::Scaling => self.scaling.as_ref(),
            PolicyKind::Deregistration => self.deregistration.as_ref(),
            PolicyKind::PodValidation => self.pod_validation.as_ref(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_charts_shape_parses() {
        let text = "scaling:\n  builtin: buffered\n  settings:\n    idle: 2\n\
                    deregistration:\n  builtin: exit-code\n";
        let defaults = DefaultPolicies::from_yaml(text).unwrap();
        let scaling = defaults.get(PolicyKind::Scaling).unwrap();
        assert_eq!(scaling.builtin.as_deref(), Some("buffered"));
        assert_eq!(scaling.settings, Some(serde_json::json!({"idle": 2})));
        assert_eq!(
            defaults
                .get(PolicyKind::Deregistration)
                .and_then(|r| r.builtin.as_deref()),
            Some("exit-code")
        );
        assert_eq!(defaults.get(PolicyKind::PodValidation), None);
    }

    #[test]
    fn an_empty_file_is_no_defaults() {
        assert_eq!(
            DefaultPolicies::from_yaml("").unwrap(),
            DefaultPolicies::default()
        );
    }

    #[test]
    fn bad_files_are_refused_with_their_reason() {
        let cases = [
            ("scaling: [", "not valid YAML"),
            (
                "scalling:\n  builtin: default\n",
                "unknown field `scalling`",
            ),
            (
                "scaling:\n  configMapRef:\n    name: mine\n",
                "names a configMapRef",
            ),
            ("podValidation:\n  buildin: default\n", "names no builtin"),
            ("podValidation:\n  settings: {}\n", "names no builtin"),
        ];
        for (text, want) in cases {
            let error = DefaultPolicies::from_yaml(text).unwrap_err().to_string();
            assert!(error.contains(want), "{text:?}: {error}");
        }
    }
}
