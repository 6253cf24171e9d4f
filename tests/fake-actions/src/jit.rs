//! The fake's JIT runner configuration.
//!
//! The real `encodedJITConfig` is base64 of a JSON map of the runner's
//! settings and credentials files; whoever holds it can act as the runner.
//! The fake keeps that property with less ceremony: base64 of a JSON object
//! naming the runner, its scale set, where to connect, and a random secret.
//! The secret is the only credential the runner-facing endpoints accept.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};

/// The decoded content of an `encodedJITConfig`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JitConfig {
    /// The runner id the registration got.
    pub runner_id: u64,
    /// The runner name (unique per configuration URL).
    pub runner_name: String,
    /// The scale set the runner belongs to.
    pub scale_set_id: u64,
    /// Where the runner connects: the fake's root URL.
    pub service_url: String,
    /// The runner's credential.
    pub secret: String,
}

/// The string is not an encoded JIT config of this fake.
#[derive(Debug, thiserror::Error)]
pub enum JitConfigError {
    /// Not base64.
    #[error("the JIT config is not base64")]
    NotBase64,
    /// Base64 of something that is not the expected JSON.
    #[error("the JIT config does not decode to a runner configuration: {0}")]
    NotAConfig(String),
}

impl JitConfig {
    /// The `encodedJITConfig` string for this configuration.
    pub fn encode(&self) -> String {
        // Serialising a struct of strings and integers cannot fail.
        let json = serde_json::to_vec(self).unwrap_or_default();
        STANDARD.encode(json)
    }

    /// Decodes an `encodedJITConfig` (surrounding whitespace ignored, as a
    /// value read from a Secret or an env var may carry a newline).
    pub fn decode(encoded: &str) -> Result<JitConfig, JitConfigError> {
        let bytes = STANDARD
            .decode(encoded.trim())
            .map_err(|_| JitConfigError::NotBase64)?;
        serde_json::from_slice(&bytes).map_err(|e| JitConfigError::NotAConfig(e.to_string()))
    }
}

/// Redacts the secret: a JIT config is a credential.
impl std::fmt::Debug for JitConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JitConfig")
            .field("runner_id", &self.runner_id)
            .field("runner_name", &self.runner_name)
            .field("scale_set_id", &self.scale_set_id)
            .field("service_url", &self.service_url)
            .field("secret", &"<redacted>")
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> JitConfig {
        JitConfig {
            runner_id: 7,
            runner_name: "set-abc".into(),
            scale_set_id: 2,
            service_url: "http://127.0.0.1:1".into(),
            secret: "s3cret-value".into(),
        }
    }

    #[test]
    fn round_trips_and_tolerates_a_trailing_newline() {
        let encoded = format!("{}\n", sample().encode());
        assert_eq!(JitConfig::decode(&encoded).unwrap(), sample());
    }

    #[test]
    fn debug_hides_the_secret() {
        let shown = format!("{:?}", sample());
        assert!(!shown.contains("s3cret-value"), "{shown}");
        assert!(shown.contains("set-abc"));
    }

    #[test]
    fn garbage_is_a_clear_error() {
        assert!(matches!(
            JitConfig::decode("!!!"),
            Err(JitConfigError::NotBase64)
        ));
        assert!(matches!(
            JitConfig::decode(&STANDARD.encode("{}")),
            Err(JitConfigError::NotAConfig(_))
        ));
    }
}
