//! The one Prometheus registry of the process.
//!
//! Every component registers its metrics as a struct into the same registry
//! (as [`PolicyMetrics::register`](crate::policy::metrics::PolicyMetrics::register)
//! does), so `/metrics` shows the whole controller in one scrape and two
//! components cannot each think they own a name: prometheus-client keeps
//! both, and the duplicate shows in the text where a test sees it.

use std::sync::{Arc, Mutex, PoisonError};

use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

/// The content type of [`MetricsRegistry::encode`]'s text: OpenMetrics,
/// which Prometheus scrapes natively.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The shared registry. Clones share it.
///
/// A plain mutex: registration happens a handful of times at start-up and
/// a scrape holds the lock only while it formats text, so there is nothing
/// to gain from anything finer.
#[derive(Clone, Debug, Default)]
pub struct MetricsRegistry {
    registry: Arc<Mutex<Registry>>,
}

impl MetricsRegistry {
    /// A registry holding `arcwright_build_info{version}`, so a scrape
    /// always says which release answered it.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        registry.register(
            "arcwright_build",
            "The arcwright release this process runs",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        Self {
            registry: Arc::new(Mutex::new(registry)),
        }
    }

    /// Registers metrics: `register` gets the registry, typically a
    /// `FooMetrics::register`, and what it returns is handed back.
    pub fn register<T>(&self, register: impl FnOnce(&mut Registry) -> T) -> T {
        register(&mut self.registry.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Every registered metric in the OpenMetrics text format.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(
            &mut text,
            &self.registry.lock().unwrap_or_else(PoisonError::into_inner),
        )?;
        Ok(text)
    }
}
