//! One control plane per test binary, a namespace per test.
//!
//! Starting etcd and the API server takes seconds, a namespace takes
//! milliseconds, so tests in one binary share the processes and get isolation
//! from their own namespace. Nothing in a namespace is cleaned up one test at
//! a time: without a controller-manager a deleted namespace would only sit in
//! `Terminating`, and the whole control plane is discarded when the binary
//! exits anyway.
//!
//! The shared control plane lives in a static, which Rust never drops, so an
//! `atexit` handler stops it: libtest ends the process with `exit`, after
//! passing and failing tests alike. A binary killed from outside is covered by
//! the children's parent-death signal (see [`crate::process`]).

use std::sync::Once;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ObjectMeta, PostParams};
use rand::Rng;
use tokio::sync::OnceCell;

use crate::control_plane::ControlPlane;

static SHARED: OnceCell<Result<ControlPlane, String>> = OnceCell::const_new();

extern "C" fn stop_shared_control_plane() {
    if let Some(Ok(plane)) = SHARED.get() {
        plane.shutdown();
    }
}

/// The control plane shared by every test in this binary, started on first
/// use. A failure to start is remembered, so every test reports it at once
/// instead of each trying (and waiting) again.
pub async fn shared_control_plane() -> &'static ControlPlane {
    let result = SHARED
        .get_or_init(|| async {
            static REGISTER: Once = Once::new();
            REGISTER.call_once(|| {
                // SAFETY: registers a plain function with no captured state.
                unsafe {
                    libc::atexit(stop_shared_control_plane);
                }
            });
            ControlPlane::start().await.map_err(|e| e.to_string())
        })
        .await;
    match result {
        Ok(plane) => plane,
        Err(message) => panic!("the local control plane could not start: {message}"),
    }
}

/// What a test gets: a client of its own and a namespace of its own on the
/// shared control plane.
pub struct TestEnv {
    plane: &'static ControlPlane,
    client: kube::Client,
    namespace: String,
}

impl TestEnv {
    /// Creates a fresh namespace named after the test (plus a random suffix)
    /// on the shared control plane, starting it if needed.
    ///
    /// Panics with the reason if the control plane cannot start: a test that
    /// needs an API server cannot do anything useful without one.
    pub async fn new(name: &str) -> Self {
        let plane = shared_control_plane().await;
        let client = plane.client();
        let namespace = namespace_name(name);
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let object = Namespace {
            metadata: ObjectMeta {
                name: Some(namespace.clone()),
                labels: Some([("arcwright.dev/test".to_owned(), sanitize(name))].into()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        namespaces
            .create(&PostParams::default(), &object)
            .await
            .unwrap_or_else(|e| panic!("creating test namespace {namespace}: {e}"));
        Self {
            plane,
            client,
            namespace,
        }
    }

    /// An admin client made for this test.
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// The test's namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The shared control plane (kubeconfig path, server URL, logs).
    pub fn control_plane(&self) -> &'static ControlPlane {
        self.plane
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "test namespace {} on {}\n{}",
                self.namespace,
                self.plane.server(),
                self.plane.log_tails(60)
            );
        }
    }
}

/// A DNS-1123 label: the test's name, shortened, plus five random characters
/// (a namespace name no earlier run on the same control plane took).
pub fn namespace_name(name: &str) -> String {
    let mut base = sanitize(name);
    base.truncate(50);
    let base = base.trim_end_matches('-');
    let suffix: String = rand::rng()
        .sample_iter(rand::distr::Alphanumeric)
        .filter(u8::is_ascii_alphabetic)
        .take(5)
        .map(|c| (c as char).to_ascii_lowercase())
        .collect();
    if base.is_empty() {
        format!("test-{suffix}")
    } else {
        format!("{base}-{suffix}")
    }
}

fn sanitize(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_alphanumeric() {
            out.push(c);
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    let trimmed = out.trim_matches('-');
    let mut label = trimmed.to_owned();
    label.truncate(63);
    label.trim_end_matches('-').to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_names_are_dns_labels() {
        for name in [
            "simple",
            "Upper_Case and spaces",
            "---",
            "a".repeat(100).as_str(),
        ] {
            let ns = namespace_name(name);
            assert!(ns.len() <= 63, "{ns}");
            assert!(
                ns.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
                "{ns}"
            );
            assert!(!ns.starts_with('-') && !ns.ends_with('-'), "{ns}");
        }
        assert_ne!(namespace_name("same"), namespace_name("same"));
    }
}
