//! `arcwright_actions_requests_total{endpoint, outcome}`: every attempt at
//! a call to GitHub or the Actions service, retries included, by the
//! operation it served and whether it got a 2xx answer (`ok`) or not
//! (`error`: a status, a timeout, a refused connection).
//!
//! Attempts rather than calls, because what the service rate-limits and
//! what an outage shows is attempts; a call retried three times is three.
//! The endpoint label is the operation's name (`get_message`,
//! `generate_jit_config`, ...), a fixed set, never a URL.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::Operation;

/// An attempt's labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// The operation (see [`Operation::as_str`]).
    pub endpoint: &'static str,
    /// `ok` or `error`.
    pub outcome: &'static str,
}

/// The Actions clients' metrics; clones share the series. The default is
/// registered nowhere (tests, the policy CLI).
#[derive(Clone, Debug, Default)]
pub struct ActionsMetrics {
    requests: Family<RequestLabels, Counter>,
}

impl ActionsMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "arcwright_actions_requests",
            "Attempts at calls to GitHub and the Actions service, by operation and outcome",
            metrics.requests.clone(),
        );
        metrics
    }

    /// Counts one attempt at `operation`.
    pub fn attempt(&self, operation: Operation, ok: bool) {
        self.requests
            .get_or_create(&RequestLabels {
                endpoint: operation.as_str(),
                outcome: if ok { "ok" } else { "error" },
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempts_are_counted_by_operation_and_outcome() {
        let mut registry = Registry::default();
        let metrics = ActionsMetrics::register(&mut registry);
        metrics.attempt(Operation::GetMessage, true);
        metrics.attempt(Operation::GetMessage, true);
        metrics.attempt(Operation::GenerateJitConfig, false);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let get = Operation::GetMessage.as_str();
        let jit = Operation::GenerateJitConfig.as_str();
        for line in [
            format!(r#"arcwright_actions_requests_total{{endpoint="{get}",outcome="ok"}} 2"#),
            format!(r#"arcwright_actions_requests_total{{endpoint="{jit}",outcome="error"}} 1"#),
        ] {
            assert!(text.contains(&line), "{line} in {text}");
        }
    }
}
