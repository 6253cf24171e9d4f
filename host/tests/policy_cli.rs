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

/// Runs `arcwright policy eval` on `input`, written to a file, with `extra`
/// arguments after it.
fn eval(kind: &str, module: &str, input: &str, extra: &[&str]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("input.json");
    fs::write(&path, input).unwrap();
    let mut args = vec![
        "policy",
        "eval",
        "--kind",
        kind,
        "--module",
        module,
        "--input",
        path.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    arcwright(&args)
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
    let out = eval(
        "scaling",
        "builtin:default",
        r#"{"scaleSet": {"minRunners": 2, "maxRunners": 10}, "statistics": {"assignedJobs": 5}}"#,
        &[],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let decision: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(decision["desired"], 7);
    assert!(decision["reason"].is_string());

    let out = eval(
        "deregistration",
        "builtin:exit-code",
        r#"{"phase": "Succeeded", "exitCode": 0, "registered": true}"#,
        &[],
    );
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
    let out = eval("deregistration", "builtin:scaling/buffered", "{}", &[]);
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

#[test]
fn eval_takes_settings_inline_or_from_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let settings = dir.path().join("settings.json");
    fs::write(&settings, r#"{"idle": 3}"#).unwrap();
    let at_path = format!("@{}", settings.display());
    let input = r#"{"scaleSet": {"maxRunners": 100}, "statistics": {"assignedJobs": 5}}"#;
    for extra in [
        &["--settings", r#"{"idle": 3}"#][..],
        &["--settings-file", settings.to_str().unwrap()][..],
        &["--settings", at_path.as_str()][..],
    ] {
        let out = eval("scaling", "builtin:buffered", input, extra);
        assert!(
            out.status.success(),
            "{extra:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let decision: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(decision["desired"], 8, "{extra:?}: {decision}");
    }
    // A path given where JSON is expected says how to give a file.
    let out = eval(
        "scaling",
        "builtin:buffered",
        input,
        &["--settings", settings.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--settings-file PATH"), "{err}");
}

#[test]
fn eval_names_a_misspelt_input_key() {
    let out = eval(
        "scaling",
        "builtin:default",
        r#"{"scaleSet": {"minRunner": 3, "maxRunners": 10}}"#,
        &[],
    );
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("`scaleSet.minRunner` is not a field; did you mean `minRunners`?"),
        "{err}"
    );
}

/// The README and every document under `docs/`: where a policy author
/// reads the commands, wherever a section moves.
fn documents() -> Vec<(std::path::PathBuf, String)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut paths = vec![root.join("README.md")];
    let mut docs: Vec<_> = fs::read_dir(root.join("docs"))
        .expect("docs/ exists")
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.sort();
    paths.extend(docs);
    paths
        .into_iter()
        .map(|path| {
            let text = fs::read_to_string(&path).unwrap();
            (path, text)
        })
        .collect()
}

/// The `arcwright policy ...` commands of the documents' fenced shell
/// blocks, continuation lines joined.
fn documented_commands() -> Vec<String> {
    documents()
        .iter()
        .flat_map(|(_, text)| shell_commands(text))
        .filter(|command| command.starts_with("arcwright policy"))
        .collect()
}

/// The commands of `text`'s fenced `sh` blocks, continuation lines joined.
fn shell_commands(text: &str) -> Vec<String> {
    let mut commands = Vec::new();
    let mut in_shell = false;
    let mut pending = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with("```") {
            in_shell = !in_shell && trimmed == "```sh";
            continue;
        }
        if !in_shell {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(head) => {
                pending.push_str(head);
                pending.push(' ');
            }
            None => {
                pending.push_str(trimmed);
                commands.push(std::mem::take(&mut pending));
            }
        }
    }
    commands
}

/// Lays out, under `dir`, the files a documented command names: the module it
/// builds (the template's component), its suites (the template's), an input,
/// and the files of the repository it names by their path from its root (the
/// bundled sample trace), as a reader at the root of a checkout has them.
fn lay_out_files_for(command: &str, dir: &std::path::Path) {
    let template =
        arcwright_test_guests::path("policy-template").expect("the template guest is built");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let suites = root.join("policies/template/tests");
    for token in command.split_whitespace() {
        let token = token.trim_matches(|c| c == '\'' || c == '"');
        let path = dir.join(token);
        let in_checkout = root.join(token);
        if !token.starts_with('-') && !token.starts_with('/') && in_checkout.is_file() {
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::copy(&in_checkout, &path).unwrap();
        } else if token.ends_with(".wasm") {
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::copy(template, &path).unwrap();
        } else if let Some(folder) = token.strip_suffix("/*.yaml") {
            let folder = dir.join(folder);
            fs::create_dir_all(&folder).unwrap();
            for suite in fs::read_dir(&suites).unwrap() {
                let suite = suite.unwrap().path();
                fs::copy(&suite, folder.join(suite.file_name().unwrap())).unwrap();
            }
        } else if token.ends_with(".json") {
            fs::write(
                &path,
                r#"{"scaleSet": {"minRunners": 0, "maxRunners": 100}, "statistics": {"assignedJobs": 5}}"#,
            )
            .unwrap();
        }
    }
}

/// Every `arcwright policy` command the README and the docs show (the
/// policy author's guide, `docs/policies.md`, has one of each) runs as
/// written and does what the guide says it does.
#[test]
fn the_documented_policy_commands_run_as_written() {
    let commands = documented_commands();
    for sub in ["test", "eval", "inspect", "configmap"] {
        assert!(
            commands
                .iter()
                .any(|c| c.starts_with(&format!("arcwright policy {sub} "))),
            "the docs show no `arcwright policy {sub}`: {commands:#?}"
        );
    }
    let bin = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(
        env!("CARGO_BIN_EXE_arcwright"),
        bin.path().join("arcwright"),
    )
    .unwrap();
    let path = format!(
        "{}:{}",
        bin.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for command in &commands {
        let dir = tempfile::tempdir().unwrap();
        lay_out_files_for(command, dir.path());
        // What is piped to kubectl is checked here instead: there is no
        // cluster to apply it to.
        let (command, piped) = match command.split_once(" | ") {
            Some((command, piped)) => (command, Some(piped)),
            None => (command.as_str(), None),
        };
        let out = Command::new("sh")
            .arg("-c")
            .arg(command)
            .current_dir(dir.path())
            .env("PATH", &path)
            .output()
            .unwrap();
        let text = stdout(&out);
        assert!(
            out.status.success(),
            "{command}\n{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        if command.starts_with("arcwright policy test") {
            assert!(text.contains(" passed, 0 failed"), "{command}\n{text}");
        }
        if command.starts_with("arcwright policy eval") {
            let decision: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert!(decision["desired"].is_u64(), "{command}\n{text}");
        }
        if let Some(piped) = piped {
            assert_eq!(piped, "kubectl apply -f -", "{command}");
            let cm: k8s_openapi::api::core::v1::ConfigMap = serde_yaml::from_str(&text).unwrap();
            assert!(cm.binary_data.is_some(), "{command}\n{text}");
        }
    }
}
