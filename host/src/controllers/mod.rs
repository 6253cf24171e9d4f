//! The reconcilers. Each has the same shape, in the same files:
//!
//! - `mod.rs`: the wiring, and `run`;
//! - `observe.rs`: reads the object and what it owns (from the API server
//!   or the watch caches) into an `Observed`, and answers the plan's
//!   requests for more input;
//! - `plan.rs` or `plan/`: the pure decision, `Observed` to typed steps;
//!   when it needs an answer that costs something to get, it returns a
//!   `Need` and is run again with the answer;
//! - `apply.rs`: one API call per step, and no decisions;
//! - `watch.rs`: which events of owned objects wake the owner.
//!
//! [`kit`] is what they share (finalizers, events, conditions, the owned
//! watches' projection filter, start-up and shutdown); [`metrics`] is what
//! they report in common.

pub mod autoscaling_runner_set;
pub mod ephemeral_runner;
pub mod ephemeral_runner_set;
pub mod kit;
pub mod metrics;

use crate::api::{GitHubServerTls, ProxySpec};
use crate::credentials::{GitHubTarget, ProxyTarget};

/// Where a GitHub configuration lives, for the shared credentials cache,
/// from the fields an AutoscalingRunnerSet and its runners both carry.
///
/// The CRD gives each proxy server its own credential Secret, and each
/// proxy is sent its own alone.
pub fn github_target(
    namespace: &str,
    config_url: &str,
    secret_name: &str,
    proxy: Option<&ProxySpec>,
    tls: Option<&GitHubServerTls>,
) -> GitHubTarget {
    GitHubTarget {
        namespace: namespace.to_owned(),
        config_url: config_url.to_owned(),
        secret_name: secret_name.to_owned(),
        proxy: proxy.map(|proxy| ProxyTarget {
            http_url: proxy.http.as_ref().map(|server| server.url.clone()),
            https_url: proxy.https.as_ref().map(|server| server.url.clone()),
            no_proxy: proxy.no_proxy.clone(),
            http_credential_secret: proxy
                .http
                .as_ref()
                .and_then(|server| server.credential_secret_ref.clone()),
            https_credential_secret: proxy
                .https
                .as_ref()
                .and_then(|server| server.credential_secret_ref.clone()),
        }),
        ca_config_map: tls
            .and_then(|tls| tls.certificate_from.as_ref())
            .and_then(|from| from.config_map_key_ref.as_ref())
            .map(|selector| (selector.name.clone(), selector.key.clone())),
    }
}
