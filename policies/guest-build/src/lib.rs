//! Builds the policy guests under `policies/` into WebAssembly components,
//! for the build scripts that need them.
//!
//! Two build scripts use it, and they split the guests between them:
//!
//! - `host/build.rs` builds the **bundled** policies (a guest whose
//!   `Cargo.toml` names a `builtin`) and embeds them in the controller with
//!   `include_bytes!`;
//! - `policies/test-guests/build.rs` builds **every other** guest (the
//!   template, the test guests that misbehave on purpose, a policy an author
//!   added to the workspace) for the tests and benchmarks. That crate is a
//!   dev-dependency of the host, so a production build (`cargo build`,
//!   `cargo install`) neither compiles those guests nor carries a trace of
//!   them, not even a path.
//!
//! A guest crate takes part when its `Cargo.toml` carries
//! `[package.metadata.arcwright]` with a `kind` (`scaling`, `deregistration`
//! or `pod-validation`), optionally a `builtin` name.
//!
//! Each build script compiles its guests with ONE nested
//! `cargo build --target wasm32-wasip2`, into `wasm-guests` under the target
//! directory (`$CARGO_TARGET_DIR`, or `target/` at the workspace root). A
//! directory of its own is what keeps the nested cargo from waiting forever
//! on the build-directory lock the outer cargo holds, and one invocation
//! lets cargo share the guests' dependency graph instead of compiling
//! `wit-bindgen` once per guest. When both build scripts run at once, the
//! second nested cargo waits for the first on that directory's lock and then
//! finds the shared dependencies already built.
//!
//! Metadata is read with a line scanner rather than a TOML parser: the keys
//! are ours, written in one documented shape, and a dependency here would be
//! compiled before every build of the host.

use std::env;
use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The target every guest is compiled for; its toolchain ships
/// `wasm-component-ld`, so cargo emits a component directly.
pub const GUEST_TARGET: &str = "wasm32-wasip2";

/// A guest crate found under `policies/`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Guest {
    /// The package name, e.g. `policy-scaling-default`.
    pub package: String,
    /// `scaling`, `deregistration` or `pod-validation`.
    pub kind: String,
    /// The name it is bundled under (`builtin: NAME`), if it is bundled.
    pub builtin: Option<String>,
    /// The crate's directory.
    pub dir: PathBuf,
}

/// The root of the workspace these guests belong to: the nearest directory
/// above the calling build script's package (cargo tells a build script
/// where its own package is, `CARGO_MANIFEST_DIR`, at run time) whose
/// `Cargo.toml` declares a `[workspace]`.
///
/// Not where this crate was compiled from: cargo does not key a compiled
/// path crate by its absolute location, so with a target directory shared
/// between two checkouts (a CI cache, a second clone), a path fixed at
/// compile time names the first checkout, and once that is gone no guest
/// is found and the controller is built without its bundled policies.
pub fn workspace() -> PathBuf {
    let compiled = Path::new(env!("CARGO_MANIFEST_DIR"));
    let caller = env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from);
    let start = caller.as_deref().unwrap_or(compiled);
    start
        .ancestors()
        .find(|dir| {
            fs::read_to_string(dir.join("Cargo.toml"))
                .is_ok_and(|manifest| manifest.lines().any(|l| l.trim() == "[workspace]"))
        })
        .unwrap_or_else(|| {
            panic!(
                "no Cargo.toml declaring a [workspace] above {}",
                start.display()
            )
        })
        .to_path_buf()
}

/// Every guest crate under `workspace/policies`, sorted by package name so
/// that generated tables are stable. Tells cargo to run the calling build
/// script again when any guest's manifest (or the workspace's) changes.
pub fn discover(workspace: &Path) -> Vec<Guest> {
    // Adding a guest means adding it to the workspace members.
    println!(
        "cargo:rerun-if-changed={}",
        workspace.join("Cargo.toml").display()
    );
    let Ok(entries) = fs::read_dir(workspace.join("policies")) else {
        return Vec::new();
    };
    let mut guests: Vec<Guest> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let manifest = entry.path().join("Cargo.toml");
            let text = fs::read_to_string(&manifest).ok()?;
            println!("cargo:rerun-if-changed={}", manifest.display());
            let (package, kind, builtin) = parse_manifest(&text)
                .unwrap_or_else(|error| panic!("{}: {error}", manifest.display()))?;
            Some(Guest {
                package,
                kind,
                builtin,
                dir: entry.path(),
            })
        })
        .collect();
    guests.sort_by(|a, b| a.package.cmp(&b.package));
    guests
}

/// Reads `[package] name` and `[package.metadata.arcwright] kind/builtin`:
/// `Ok(None)` for a crate that is not a guest.
fn parse_manifest(text: &str) -> Result<Option<(String, String, Option<String>)>, String> {
    let mut section = String::new();
    let (mut package, mut kind, mut builtin) = (None, None, None);
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            section = line
                .trim_matches(|c| c == '[' || c == ']')
                .trim()
                .to_string();
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let value = value.trim().trim_matches('"').to_string();
        match (section.as_str(), key.trim()) {
            ("package", "name") => package = Some(value),
            ("package.metadata.arcwright", "kind") => kind = Some(value),
            ("package.metadata.arcwright", "builtin") => builtin = Some(value),
            _ => {}
        }
    }
    let Some(kind) = kind else {
        return Ok(None);
    };
    if !matches!(
        kind.as_str(),
        "scaling" | "deregistration" | "pod-validation"
    ) {
        return Err(format!(
            "[package.metadata.arcwright] kind is {kind:?}; expected scaling, deregistration or pod-validation"
        ));
    }
    let package = package.ok_or("the manifest has no [package] name")?;
    Ok(Some((package, kind, builtin)))
}

/// Where the guests are built: `wasm-guests` under the target directory
/// cargo uses (`cargo_target_dir`, the value of `CARGO_TARGET_DIR`, taken
/// relative to the workspace root when relative), or under `target/` at the
/// workspace root when it is unset. Guests then live beside everything else
/// the build produced, and a machine that keeps target directories elsewhere
/// (a shared cache, a faster disk) gets no stray `target/` in the checkout.
pub fn guest_target_dir(workspace: &Path, cargo_target_dir: Option<&OsStr>) -> PathBuf {
    let target = match cargo_target_dir.filter(|dir| !dir.is_empty()) {
        Some(dir) => workspace.join(dir),
        None => workspace.join("target"),
    };
    target.join("wasm-guests")
}

/// [`guest_target_dir`] for the environment the build script runs in.
pub fn target_dir(workspace: &Path) -> PathBuf {
    println!("cargo:rerun-if-env-changed=CARGO_TARGET_DIR");
    guest_target_dir(workspace, env::var_os("CARGO_TARGET_DIR").as_deref())
}

/// The component a guest build leaves for `package` under `target_dir`.
pub fn artifact(target_dir: &Path, package: &str) -> PathBuf {
    target_dir
        .join(GUEST_TARGET)
        .join("release")
        .join(format!("{}.wasm", package.replace('-', "_")))
}

/// Builds `guests` with one nested cargo into `target_dir`, and tells cargo
/// to run the calling build script again when anything they are built from
/// changes. Panics (failing the calling build script) with cargo's output,
/// and with the fix when the cause is a known one.
pub fn build(workspace: &Path, target_dir: &Path, guests: &[&Guest]) {
    for path in [
        workspace.join("Cargo.lock"),
        workspace.join(".cargo").join("config.toml"),
        workspace.join("wit"),
        workspace.join("policies").join("guest"),
    ] {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    for guest in guests {
        println!("cargo:rerun-if-changed={}", guest.dir.display());
    }
    if guests.is_empty() {
        return;
    }
    require_guest_target();
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(workspace)
        .args([
            "build",
            "--release",
            "--target",
            GUEST_TARGET,
            "--target-dir",
        ])
        .arg(target_dir);
    for guest in guests {
        cmd.args(["-p", &guest.package]);
    }
    // The nested build must not see what cargo set for *this* build script
    // (the host's target, features, flags, jobserver): that describes the
    // host build. The user's own cargo settings (offline mode, registries,
    // proxies, profiles) are kept, so a mirrored or offline build stays one.
    for (key, _) in env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        if set_for_this_build(key) {
            cmd.env_remove(key);
        }
    }
    // The lock file is the outer build's, already resolved: the nested build
    // must not rewrite it. Its parallelism stays within the outer build's.
    cmd.arg("--locked");
    if let Ok(jobs) = env::var("NUM_JOBS") {
        cmd.args(["--jobs", &jobs]);
    }
    let output = cmd.output().unwrap_or_else(|err| {
        panic!("could not start the nested cargo build of the policy guests: {err}")
    });
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let advice = explain(&stderr).map(|a| a + "\n\n").unwrap_or_default();
        panic!("{advice}building the policy guests for {GUEST_TARGET} failed:\n{stderr}");
    }
}

/// Whether cargo set `key` for the build script that is running, rather
/// than the user for every build.
fn set_for_this_build(key: &str) -> bool {
    [
        "CARGO_CFG_",
        "CARGO_FEATURE_",
        "CARGO_PKG_",
        "CARGO_MANIFEST_",
    ]
    .iter()
    .any(|prefix| key.starts_with(prefix))
        || matches!(
            key,
            "CARGO_ENCODED_RUSTFLAGS"
                | "CARGO_PRIMARY_PACKAGE"
                | "CARGO_MAKEFLAGS"
                | "CARGO_CRATE_NAME"
                | "CARGO_TARGET_TMPDIR"
                | "CARGO_RUSTC_CURRENT_DIR"
                | "CARGO_BUILD_RUSTFLAGS"
                | "CARGO_BUILD_TARGET"
                | "CARGO_TARGET_DIR"
                | "CARGO_BUILD_TARGET_DIR"
                | "RUSTFLAGS"
                | "RUSTDOCFLAGS"
                | "RUSTC_WRAPPER"
                | "RUSTC_WORKSPACE_WRAPPER"
                | "OUT_DIR"
                | "TARGET"
                | "HOST"
                | "PROFILE"
                | "OPT_LEVEL"
                | "DEBUG"
                | "NUM_JOBS"
                | "RUSTC_LINKER"
                | "__CARGO_FIX_YOLO"
        )
}

/// Fails the build with the exact fix when the guest target is missing.
fn require_guest_target() {
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".to_string());
    let sysroot = Command::new(&rustc)
        .args(["--print", "sysroot"])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()));
    let installed =
        sysroot.is_some_and(|root| root.join("lib/rustlib").join(GUEST_TARGET).is_dir());
    assert!(
        installed,
        "the {GUEST_TARGET} target is not installed, and the policy guests are compiled for it; \
         install it with:\n\n    rustup target add {GUEST_TARGET}\n"
    );
}

/// What to do about a failed guest build, when rustc's message does not
/// say it: `None` when the failure is not one this knows.
///
/// The one it knows is the standard library linked into a guest. A policy
/// is `no_std` on wasm, and `arcwright-guest` supplies the panic handler
/// `std` would have; when `std` is linked anyway (the policy lacks
/// `#![no_std]`, or a dependency uses `std`) rustc reports two panic
/// handlers, `duplicate lang item ... panic_impl`, which names neither the
/// cause nor the fix. The crate that brought `std` in is named in rustc's
/// notes (`crate `std` (which `X` depends on)`), and that decides the fix.
///
/// rustc cannot be made to say this itself: the clash is found while
/// compiling the policy, and `arcwright-guest`, compiled before it, cannot
/// know whether something else in the final crate graph will link `std`.
/// The same advice is in the troubleshooting table of the policy author's
/// guide (`docs/policies.md`), for builds that do not go through a build
/// script.
pub fn explain(stderr: &str) -> Option<String> {
    if !(stderr.contains("E0152") && stderr.contains("panic_impl")) {
        return None;
    }
    let user = stderr
        .split("crate `std` (which `")
        .nth(1)
        .and_then(|rest| rest.split('`').next())
        .unwrap_or("one of its crates");
    let compiling = stderr
        .split("could not compile `")
        .nth(1)
        .and_then(|rest| rest.split('`').next());
    let culprit = match compiling {
        Some(package) if package.replace('-', "_") == user => format!(
            "`{package}` uses the standard library: put\n\n    \
             #![cfg_attr(target_arch = \"wasm32\", no_std)]\n    \
             extern crate alloc;\n\n\
             at the top of its src/lib.rs, and take `String`, `Vec` and `format!` from `alloc`"
        ),
        _ => format!(
            "`{user}`, a dependency, uses the standard library: turn off its default features \
             (`default-features = false`, then add its `alloc` feature if it has one) or use a \
             crate that works without `std`"
        ),
    };
    Some(format!(
        "a policy guest links the standard library (rustc: duplicate lang item `panic_impl`).\n\
         A policy is no_std on wasm: with std, a component imports WASI, which the controller \
         refuses, and std's panic handler clashes with arcwright-guest's.\n\
         Fix: {culprit}."
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_target_dir_follows_cargo_target_dir() {
        let workspace = Path::new("/src/arcwright");
        let cases: &[(Option<&str>, &str)] = &[
            (None, "/src/arcwright/target/wasm-guests"),
            (Some(""), "/src/arcwright/target/wasm-guests"),
            (Some("/cache/targets/a"), "/cache/targets/a/wasm-guests"),
            (Some("build/out"), "/src/arcwright/build/out/wasm-guests"),
        ];
        for (env, expected) in cases {
            assert_eq!(
                guest_target_dir(workspace, env.map(OsStr::new)),
                Path::new(expected),
                "CARGO_TARGET_DIR={env:?}"
            );
        }
    }

    #[test]
    fn artifacts_are_named_as_cargo_names_them() {
        assert_eq!(
            artifact(Path::new("/t/wasm-guests"), "policy-scaling-default"),
            Path::new("/t/wasm-guests/wasm32-wasip2/release/policy_scaling_default.wasm")
        );
    }

    #[test]
    fn manifests_declare_guests() {
        let bundled = "[package]\nname = \"policy-a\"\n\n[package.metadata.arcwright]\n\
                       kind = \"scaling\"\nbuiltin = \"a\"\n";
        assert_eq!(
            parse_manifest(bundled),
            Ok(Some((
                "policy-a".into(),
                "scaling".into(),
                Some("a".into())
            )))
        );
        let not_bundled = "[package]\nname = \"policy-b\"\n[package.metadata.arcwright]\nkind = \"deregistration\"\n";
        assert_eq!(
            parse_manifest(not_bundled),
            Ok(Some(("policy-b".into(), "deregistration".into(), None)))
        );
        assert_eq!(parse_manifest("[package]\nname = \"helper\"\n"), Ok(None));
        let wrong = "[package]\nname = \"p\"\n[package.metadata.arcwright]\nkind = \"scale\"\n";
        assert!(parse_manifest(wrong).unwrap_err().contains("\"scale\""));
    }

    /// rustc's output for a policy without `#![no_std]`: std is linked
    /// because the policy itself depends on it.
    const POLICY_USES_STD: &str = "   Compiling policy-my-policy v0.1.0 (/src/policies/my-policy)
error[E0152]: duplicate lang item in crate `arcwright_guest` (which `policy_my_policy` depends on): `panic_impl`
  |
  = note: the lang item is first defined in crate `std` (which `policy_my_policy` depends on)
  = note: first definition in `std` loaded from /rust/lib/libstd-1.rlib
  = note: second definition in `arcwright_guest` loaded from /t/libarcwright_guest-2.rlib

For more information about this error, try `rustc --explain E0152`.
error: could not compile `policy-my-policy` (lib) due to 1 previous error
";

    /// rustc's output when a dependency of a no_std policy uses std (the
    /// order of the two definitions is rustc's, not ours).
    const DEPENDENCY_USES_STD: &str = "error[E0152]: duplicate lang item in crate `std` (which `chrono` depends on): `panic_impl`
  |
  = note: the lang item is first defined in crate `arcwright_guest` (which `policy_my_policy` depends on)
  = note: first definition in `arcwright_guest` loaded from /t/libarcwright_guest-2.rlib
  = note: second definition in `std` loaded from /rust/lib/libstd-1.rlib

error: could not compile `policy-my-policy` (lib) due to 1 previous error
";

    #[test]
    fn std_in_a_guest_is_explained_with_the_fix_for_its_cause() {
        let cases = [
            (
                POLICY_USES_STD,
                [
                    "`policy-my-policy` uses the standard library",
                    "#![cfg_attr(target_arch = \"wasm32\", no_std)]",
                ],
            ),
            (
                DEPENDENCY_USES_STD,
                [
                    "`chrono`, a dependency, uses the standard library",
                    "default-features = false",
                ],
            ),
        ];
        for (stderr, expected) in cases {
            let advice = explain(stderr).unwrap();
            for text in expected {
                assert!(advice.contains(text), "{advice}");
            }
        }
    }

    #[test]
    fn other_failures_are_left_to_rustc() {
        assert_eq!(
            explain("error[E0425]: cannot find value `x` in this scope"),
            None
        );
    }
}
