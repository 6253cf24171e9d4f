//! `arcwright policy ...` run as a process, the way a policy author runs it.

use std::fs;
use std::process::{Command, Output};

use arcwright::policy::bundled;
use base64::Engine as _;

fn arcwright(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_arcwright"))
        .args(args)
        .output()
        .expect("the arcwright binary runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

const PASSING: &str = r#"
kind: scaling
cases:
  - name: min plus assigned
    input: {scaleSet: {minRunners: 1, maxRunners: 10}, statistics: {assignedJobs: 3}}
    expect: {desired: 4}
  - name: capped at max
    input: {scaleSet: {minRunners: 2, maxRunners: 5}, statistics: {assignedJobs: 30}}
    expect: {desired: 5}
"#;

const FAILING: &str = r#"
kind: scaling
cases:
  - name: min plus assigned
    input: {scaleSet: {minRunners: 1, maxRunners: 10}, statistics: {assignedJobs: 3}}
    expect: {desired: 4}
  - name: wrong on purpose
    input: {scaleSet: {minRunners: 1, maxRunners: 10}, statistics: {assignedJobs: 3}}
    expect: {desired: 9}
"#;

#[test]
fn test_runs_suites_and_summarises() {
    let dir = tempfile::tempdir().unwrap();
    let passing = dir.path().join("passing.yaml");
    let failing = dir.path().join("failing.yaml");
    fs::write(&passing, PASSING).unwrap();
    fs::write(&failing, FAILING).unwrap();

    let ok = arcwright(&[
        "policy",
        "test",
        "builtin:default",
        passing.to_str().unwrap(),
    ]);
    assert!(
        ok.status.success(),
        "{}{}",
        stdout(&ok),
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(
        stdout(&ok).contains("ok    min plus assigned"),
        "{}",
        stdout(&ok)
    );
    assert!(
        stdout(&ok).contains("2 passed, 0 failed"),
        "{}",
        stdout(&ok)
    );

    let bad = arcwright(&[
        "policy",
        "test",
        "builtin:default",
        passing.to_str().unwrap(),
        failing.to_str().unwrap(),
    ]);
    assert_eq!(bad.status.code(), Some(1));
    let text = stdout(&bad);
    assert!(
        text.contains("FAIL  wrong on purpose: desired is 4, expected 9"),
        "{text}"
    );
    assert!(text.contains("3 passed, 1 failed"), "{text}");
}

#[test]
fn eval_prints_the_decision_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("input.json");
    fs::write(
        &input,
        r#"{"scaleSet": {"minRunners": 2, "maxRunners": 10}, "statistics": {"assignedJobs": 5}}"#,
    )
    .unwrap();
    let out = arcwright(&[
        "policy",
        "eval",
        "--kind",
        "scaling",
        "--module",
        "builtin:default",
        "--input",
        input.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let decision: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(decision["desired"], 7);
    assert!(decision["reason"].is_string());

    let ending = dir.path().join("ending.json");
    fs::write(
        &ending,
        r#"{"phase": "Succeeded", "exitCode": 0, "registered": true}"#,
    )
    .unwrap();
    let out = arcwright(&[
        "policy",
        "eval",
        "--kind",
        "deregistration",
        "--module",
        "builtin:exit-code",
        "--input",
        ending.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let decision: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(decision["verdict"], "self-deregistered");
}

#[test]
fn eval_refuses_a_module_of_another_kind() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("input.json");
    fs::write(&input, "{}").unwrap();
    let out = arcwright(&[
        "policy",
        "eval",
        "--kind",
        "deregistration",
        "--module",
        "builtin:scaling/buffered",
        "--input",
        input.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is a scaling policy, but a deregistration policy is required"),
        "{err}"
    );
}

#[test]
fn inspect_shows_world_exports_imports_size_and_digest() {
    let builtin = bundled::find(arcwright::policy::PolicyKind::Scaling, "default").unwrap();
    let out = arcwright(&["policy", "inspect", "builtin:scaling/default"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = stdout(&out);
    assert!(
        text.contains("world:   arcwright:policy/scaling-policy@0.1.0"),
        "{text}"
    );
    assert!(
        text.contains("arcwright:policy/scaling@0.1.0#decide"),
        "{text}"
    );
    assert!(
        text.contains(&format!("size:    {} bytes", builtin.wasm.len())),
        "{text}"
    );
    use sha2::Digest as _;
    assert!(
        text.contains(&hex::encode(sha2::Sha256::digest(builtin.wasm))),
        "{text}"
    );

    let ambiguous = arcwright(&["policy", "inspect", "builtin:default"]);
    assert_eq!(ambiguous.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&ambiguous.stderr).contains("builtin:pod-validation/default"));
}

#[test]
fn configmap_carries_the_module_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let builtin = bundled::find(arcwright::policy::PolicyKind::Scaling, "buffered").unwrap();
    let path = dir.path().join("buffered.wasm");
    fs::write(&path, builtin.wasm).unwrap();
    let out = arcwright(&[
        "policy",
        "configmap",
        path.to_str().unwrap(),
        "--name",
        "warm-pool",
        "--namespace",
        "ci",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cm: k8s_openapi::api::core::v1::ConfigMap = serde_yaml::from_slice(&out.stdout).unwrap();
    assert_eq!(cm.metadata.name.as_deref(), Some("warm-pool"));
    assert_eq!(cm.metadata.namespace.as_deref(), Some("ci"));
    let bytes = &cm.binary_data.unwrap()["policy.wasm"].0;
    assert_eq!(bytes.as_slice(), builtin.wasm);
    // The YAML is base64 as kubectl expects; the typed decode above proves it.
    assert!(
        stdout(&out)
            .contains(&base64::engine::general_purpose::STANDARD.encode(&builtin.wasm[..30])[..20])
    );

    let garbage = dir.path().join("garbage.wasm");
    fs::write(&garbage, b"definitely not wasm").unwrap();
    let out = arcwright(&[
        "policy",
        "configmap",
        garbage.to_str().unwrap(),
        "--name",
        "x",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a WebAssembly binary"));
}
