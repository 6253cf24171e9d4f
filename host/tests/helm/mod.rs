//! Helm, built beside the local control plane, for the tests of the charts:
//! rendering, installing into the test's API server, and the chart's list of
//! granted rules.
#![allow(dead_code)] // each test binary uses its part

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use arcwright_harness::TestEnv;
use serde::Deserialize;
use serde_json::Value;

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub fn controller_chart() -> PathBuf {
    repo().join("charts").join("arcwright")
}

pub fn scale_set_chart() -> PathBuf {
    repo().join("charts").join("arcwright-scale-set")
}

/// Helm's own state (cache, config, data) in a directory of this test
/// binary, so the tests never read or write the user's.
pub fn helm_home() -> &'static Path {
    static HOME: OnceLock<tempfile::TempDir> = OnceLock::new();
    HOME.get_or_init(|| tempfile::tempdir().expect("temporary helm home"))
        .path()
}

/// Runs helm; its stdout on success, its stderr on failure.
pub fn helm(args: &[&str]) -> Result<String, String> {
    let bin = arcwright_harness::binaries::ensure_built(&|line| eprintln!("{line}"))
        .expect("the local control plane's binaries (helm among them)");
    let home = helm_home();
    let output = Command::new(bin.join("helm"))
        .args(args)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .output()
        .expect("running helm");
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

/// The objects of a multi-document YAML stream, empty documents left out.
pub fn documents(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|document| Value::deserialize(document).expect("helm renders valid YAML"))
        .filter(|value| !value.is_null())
        .collect()
}

/// The chart's single list of granted rules.
pub fn rules_file() -> Value {
    let text = std::fs::read_to_string(controller_chart().join("rbac").join("rules.yaml"))
        .expect("charts/arcwright/rbac/rules.yaml");
    serde_yaml::from_str(&text).expect("rules.yaml is YAML")
}

/// Runs a helm command (`install`, `uninstall`) for `release` against the
/// test's control plane, in the test's namespace.
pub fn helm_in(env: &TestEnv, command: &str, release: &str, extra: &[&str]) {
    let kubeconfig = env.control_plane().kubeconfig_path();
    let mut args = vec![
        command,
        release,
        "--namespace",
        env.namespace(),
        "--kubeconfig",
        kubeconfig.to_str().expect("UTF-8 path"),
    ];
    args.extend_from_slice(extra);
    helm(&args).unwrap_or_else(|e| panic!("helm {command} {release}: {e}"));
}

/// Installs a chart into the test's control plane.
pub fn install(env: &TestEnv, release: &str, chart: &Path, extra: &[&str]) {
    let mut args = vec![chart.to_str().expect("UTF-8 path")];
    args.extend_from_slice(extra);
    helm_in(env, "install", release, &args);
}

/// Uninstalls a release, waiting until its objects are gone.
pub fn uninstall(env: &TestEnv, release: &str) {
    helm_in(env, "uninstall", release, &["--wait"]);
}
