//! A real Kubernetes control plane for arcwright's tests and demo.
//!
//! arcwright is a controller, so every claim it makes is a claim about how it
//! behaves against a Kubernetes API server. This crate runs a real one: etcd
//! and kube-apiserver built from the Kubernetes Go modules
//! ([`binaries`]), started on free loopback ports with generated
//! certificates ([`control_plane`]), and handed to tests one namespace at a
//! time ([`TestEnv`]).
//!
//! ```no_run
//! # async fn example() {
//! let env = arcwright_harness::TestEnv::new("my-test").await;
//! let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
//!     kube::Api::namespaced(env.client(), env.namespace());
//! # }
//! ```
#![deny(missing_docs)]

pub mod binaries;
pub mod certs;
pub mod control_plane;
mod env;
mod eventually;
pub mod hostile;
pub mod process;
mod relay;

pub use control_plane::ControlPlane;
pub use env::{TestEnv, namespace_name, shared_control_plane};
pub use eventually::{POLL, eventually, eventually_explained, poll_within};
pub use relay::TcpRelay;

use std::path::PathBuf;

/// Why the control plane could not be built or started.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// The Go build of the binaries failed or could not run.
    #[error("building the control plane: {0}")]
    Build(String),
    /// A process did not start or did not become ready.
    #[error("starting the control plane: {0}")]
    Start(String),
    /// Generating certificates failed.
    #[error("generating certificates: {0}")]
    Certificates(#[from] rcgen::Error),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}
