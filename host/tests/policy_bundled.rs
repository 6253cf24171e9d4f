//! Every guest's YAML suites (`policies/*/tests/*.yaml`), run through
//! wasmtime against the artifact the build produced: the bundled policies
//! are proven by the engine that runs them, not as native Rust.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arcwright::policy::bundled::BUILTINS;
use arcwright::policy::suite::{self, Suite};
use arcwright::policy::{CallLimits, EngineConfig, MAX_DEADLINE, PolicyEngine, PolicyKind};

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

/// The limits the suites run under here: the host's longest deadline. The
/// suites claim outputs; what a case costs in time is no claim of theirs,
/// and on a loaded machine (a test run on two cores) a call that takes a
/// millisecond can be kept off the CPU past production's 50 ms. The
/// deadline itself is proven by `policy_hostile`, and `arcwright policy
/// test` runs an author's suites under production's limits.
const OUTPUT_ONLY: CallLimits = CallLimits {
    deadline: MAX_DEADLINE,
    memory: arcwright::policy::DEFAULT_MEMORY_LIMIT,
};

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
        // Bundled policies are run from the bytes the binary embeds; the
        // others (the template, an author's policy) from the test guests.
        let wasm = match BUILTINS.iter().find(|b| b.package == package) {
            Some(builtin) => builtin.wasm.to_vec(),
            None => arcwright_test_guests::wasm(&package),
        };
        let module = Arc::new(
            engine
                .load(&wasm, None)
                .unwrap_or_else(|e| panic!("{package}: {e}")),
        );
        for path in suites {
            let suite = Suite::from_yaml(&fs::read_to_string(&path).unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            for outcome in suite::run(&module, &suite, OUTPUT_ONLY)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
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

/// The table the build script generates for the library names the bundled
/// policies and nothing else: no guest only tests run, and no path of the
/// machine that built it (the components are included relative to
/// `OUT_DIR`, whatever that is).
#[test]
fn the_generated_table_has_only_the_builtins_and_no_path() {
    let table = include_str!(concat!(env!("OUT_DIR"), "/guests.rs"));
    for guest in arcwright_test_guests::all() {
        assert!(!table.contains(guest.package), "{table}");
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    for path in [workspace, Path::new(env!("OUT_DIR"))] {
        assert!(!table.contains(path.to_str().unwrap()), "{table}");
    }
    for include in table.split("include_bytes!(").skip(1) {
        assert!(
            include.starts_with("concat!(env!(\"OUT_DIR\"), \"/"),
            "a component included by another path:\n{table}"
        );
    }
    assert_eq!(
        table.matches("Builtin {").count(),
        BUILTINS.len(),
        "{table}"
    );
}

/// The production binary carries the bundled policies and nothing of the
/// guests only tests run: not their bytes or names, and not the directory
/// they were built in, a path of the build machine.
#[test]
fn the_binary_embeds_no_test_guest_and_no_build_path() {
    let binary = fs::read(env!("CARGO_BIN_EXE_arcwright")).unwrap();
    // Searched as text with std's substring search: a debug binary is
    // hundreds of megabytes.
    let binary = String::from_utf8_lossy(&binary);
    let guests = arcwright_test_guests::all();
    assert!(
        guests.iter().any(|g| g.package == "policy-test-hostile"),
        "{guests:?}"
    );
    // <target>/wasm-guests/wasm32-wasip2/release/<guest>.wasm
    let guests_dir = Path::new(guests[0].path).ancestors().nth(3).unwrap();
    assert!(guests_dir.ends_with("wasm-guests"), "{guests_dir:?}");
    let mut needles = vec![guests_dir.to_str().unwrap().to_string()];
    for guest in guests {
        needles.push(guest.package.to_string());
        needles.push(guest.package.replace('-', "_"));
    }
    for needle in needles {
        assert!(
            !binary.contains(&needle),
            "the arcwright binary contains {needle:?}"
        );
    }
    // The bundled policies themselves are in it.
    assert!(!BUILTINS.is_empty());
}

/// Guests are built under the target directory cargo uses, so a machine
/// that keeps it elsewhere gets no stray `target/` in the checkout.
#[test]
fn test_guests_are_built_under_the_target_directory() {
    let target = match option_env!("CARGO_TARGET_DIR") {
        Some(dir) if Path::new(dir).is_absolute() => PathBuf::from(dir),
        _ => Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap()
            .join("target"),
    };
    for guest in arcwright_test_guests::all() {
        let path = Path::new(guest.path);
        assert!(
            path.starts_with(target.join("wasm-guests")),
            "{} is outside {}",
            path.display(),
            target.display()
        );
        assert!(path.is_file(), "{} was not built", path.display());
    }
}

/// The policy author's guide (`docs/policies.md`) shows the suite a copy of
/// the template starts with: it is the template's own suite, so a copy run as the guide says
/// passes (the template's suites run in `every_guest_suite_passes_...`),
/// and there is one suite to edit, not a second one beside the template's.
#[test]
fn the_guides_suite_is_the_template_suite_a_copy_starts_with() {
    let guide = fs::read_to_string(policies_dir().join("../docs/policies.md")).unwrap();
    let step = guide
        .split_once("## 4. Write a suite")
        .expect("the guide has a step 4")
        .1;
    let example = step
        .split_once("```yaml\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("step 4 shows a suite")
        .0;
    let template = policies_dir().join("template");
    let suites = suites_of(&template);
    assert_eq!(
        suites,
        [template.join("tests/policy.yaml")],
        "the template has one suite, the one the guide names"
    );
    let suite = fs::read_to_string(&suites[0]).unwrap();
    assert!(
        suite.contains(example),
        "the guide's suite is not the start of {}:\n{example}",
        suites[0].display()
    );
    assert!(step.contains("policies/my-policy/tests/policy.yaml"));
}
