//! Every guest's YAML suites (`policies/*/tests/*.yaml`), run through
//! wasmtime against the artifact the build produced: the bundled policies
//! are proven by the engine that runs them, not as native Rust.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arcwright::policy::bundled::{self, BUILTINS};
use arcwright::policy::suite::{self, Suite};
use arcwright::policy::{EngineConfig, PolicyEngine, PolicyKind};

fn policies_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies")
}

/// The package name of a guest crate directory.
fn package_name(dir: &Path) -> Option<String> {
    let manifest = fs::read_to_string(dir.join("Cargo.toml")).ok()?;
    manifest.lines().find_map(|line| {
        line.trim()
            .strip_prefix("name = ")
            .map(|v| v.trim().trim_matches('"').to_string())
    })
}

fn suites_of(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(dir.join("tests")) else {
        return Vec::new();
    };
    let mut suites: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.extension()
                .is_some_and(|ext| ext == "yaml" || ext == "yml")
        })
        .collect();
    suites.sort();
    suites
}

#[test]
fn every_guest_suite_passes_through_wasmtime() {
    let engine = PolicyEngine::new(EngineConfig::default()).unwrap();
    let mut failures = Vec::new();
    let mut cases = 0;
    let mut dirs: Vec<PathBuf> = fs::read_dir(policies_dir())
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    dirs.sort();
    for dir in dirs {
        let suites = suites_of(&dir);
        if suites.is_empty() {
            continue;
        }
        let package = package_name(&dir).unwrap();
        let artifact = bundled::artifact(&package).unwrap_or_else(|| {
            panic!("{package} has suites but the build produced no artifact for it")
        });
        let wasm = fs::read(artifact).unwrap();
        let module = Arc::new(
            engine
                .load(&wasm, None)
                .unwrap_or_else(|e| panic!("{package}: {e}")),
        );
        for path in suites {
            let suite = Suite::from_yaml(&fs::read_to_string(&path).unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            for outcome in
                suite::run(&module, &suite).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            {
                cases += 1;
                if let Some(why) = outcome.failure {
                    failures.push(format!("{} / {}: {why}", path.display(), outcome.name));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {cases} cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(cases > 0, "no suites were found under policies/*/tests");
}

#[test]
fn every_builtin_has_a_suite() {
    let mut missing = Vec::new();
    for dir in fs::read_dir(policies_dir())
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
    {
        let Some(package) = package_name(&dir) else {
            continue;
        };
        if BUILTINS.iter().any(|b| b.package == package) && suites_of(&dir).is_empty() {
            missing.push(package);
        }
    }
    assert!(
        missing.is_empty(),
        "bundled policies without a suite: {missing:?}"
    );
}

#[test]
fn each_kind_has_its_bundled_default_and_it_loads_with_no_imports() {
    let engine = PolicyEngine::new(EngineConfig::default()).unwrap();
    for kind in PolicyKind::ALL {
        let module = engine
            .load_builtin(kind, kind.default_builtin())
            .unwrap_or_else(|e| panic!("the default {kind} policy: {e}"));
        assert_eq!(module.kind(), kind);
        assert!(
            module
                .info()
                .imports
                .iter()
                .all(|i| i.starts_with("arcwright:policy/host@")),
            "{:?}",
            module.info().imports
        );
    }
    for builtin in BUILTINS {
        let module = engine.load(builtin.wasm, Some(builtin.kind)).unwrap();
        assert_eq!(module.info().size, builtin.wasm.len());
    }
}
