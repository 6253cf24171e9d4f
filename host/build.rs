//! Builds the policy guests under `policies/` into WebAssembly components and
//! embeds the bundled ones into the `arcwright` binary.
//!
//! A guest crate takes part when its `Cargo.toml` carries
//! `[package.metadata.arcwright]` with a `kind` (`scaling`, `deregistration`
//! or `pod-validation`); one that also names a `builtin` is embedded with
//! `include_bytes!` and can be referenced as `builtin: NAME`. Every guest,
//! bundled or not, is exposed by crate name as an artifact path, so tests and
//! benchmarks run exactly the bytes this script produced (wasmtime's
//! `test-programs` do the same).
//!
//! All guests are compiled by ONE nested `cargo build --target wasm32-wasip2`
//! into `target/wasm-guests`. A separate target directory is what keeps the
//! nested cargo from waiting forever on the build-directory lock the outer
//! cargo holds, and one invocation lets cargo share the guests' dependency
//! graph instead of compiling `wit-bindgen` once per guest. The environment
//! the outer cargo hands a build script (rustflags for the host target, the
//! jobserver, the profile, wrappers) describes the host build, not the guest
//! one, so it is stripped before the nested build starts.
//!
//! Metadata is read with a line scanner rather than a TOML parser: the keys
//! are ours, written in one documented shape, and a build dependency would
//! cost every build of the host for three lines of parsing.

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The target every guest is compiled for; its toolchain ships
/// `wasm-component-ld`, so cargo emits a component directly.
const GUEST_TARGET: &str = "wasm32-wasip2";

/// A guest crate found under `policies/`.
struct Guest {
    package: String,
    kind: String,
    builtin: Option<String>,
}

fn main() {
    let manifest_dir =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let workspace = manifest_dir
        .parent()
        .expect("the host crate lives one level below the workspace root")
        .to_path_buf();
    let policies_dir = workspace.join("policies");
    println!("cargo:rerun-if-changed={}", policies_dir.display());
    println!("cargo:rerun-if-changed={}", workspace.join("wit").display());
    println!("cargo:rerun-if-changed=build.rs");

    let guests = discover(&policies_dir);
    let target_dir = workspace.join("target").join("wasm-guests");
    if !guests.is_empty() {
        require_guest_target();
        build_guests(&workspace, &target_dir, &guests);
    }

    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let generated = generate(&guests, &target_dir.join(GUEST_TARGET).join("release"));
    fs::write(out_dir.join("guests.rs"), generated).expect("OUT_DIR is writable");
}

/// Finds `policies/*/Cargo.toml` files carrying arcwright metadata, sorted by
/// package name so the generated table is stable.
fn discover(policies_dir: &Path) -> Vec<Guest> {
    let Ok(entries) = fs::read_dir(policies_dir) else {
        return Vec::new();
    };
    let mut guests: Vec<Guest> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let manifest = entry.path().join("Cargo.toml");
            let text = fs::read_to_string(&manifest).ok()?;
            let guest = parse_manifest(&text)?;
            println!("cargo:rerun-if-changed={}", manifest.display());
            Some(guest)
        })
        .collect();
    guests.sort_by(|a, b| a.package.cmp(&b.package));
    guests
}

/// Reads `[package] name` and `[package.metadata.arcwright] kind/builtin`.
fn parse_manifest(text: &str) -> Option<Guest> {
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
        let key = key.trim();
        let value = value.trim().trim_matches('"').to_string();
        match (section.as_str(), key) {
            ("package", "name") => package = Some(value),
            ("package.metadata.arcwright", "kind") => kind = Some(value),
            ("package.metadata.arcwright", "builtin") => builtin = Some(value),
            _ => {}
        }
    }
    let kind = kind?;
    assert!(
        matches!(
            kind.as_str(),
            "scaling" | "deregistration" | "pod-validation"
        ),
        "guest {package:?} declares kind {kind:?}; expected scaling, deregistration or pod-validation"
    );
    Some(Guest {
        package: package?,
        kind,
        builtin,
    })
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

/// Runs the one nested cargo build for every guest.
fn build_guests(workspace: &Path, target_dir: &Path, guests: &[Guest]) {
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
        let set_for_this_build = [
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
            );
        if set_for_this_build {
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
    assert!(
        output.status.success(),
        "building the policy guests for {GUEST_TARGET} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Writes the table of bundled policies and artifact paths.
fn generate(guests: &[Guest], artifact_dir: &Path) -> String {
    let mut builtins = String::new();
    let mut artifacts = String::new();
    for guest in guests {
        let path = artifact_dir.join(format!("{}.wasm", guest.package.replace('-', "_")));
        let path = path.to_str().expect("the workspace path is UTF-8");
        let kind = match guest.kind.as_str() {
            "scaling" => "PolicyKind::Scaling",
            "deregistration" => "PolicyKind::Deregistration",
            _ => "PolicyKind::PodValidation",
        };
        if let Some(name) = &guest.builtin {
            writeln!(
                builtins,
                "    Builtin {{ kind: {kind}, name: {name:?}, package: {package:?}, wasm: include_bytes!({path:?}) }},",
                package = guest.package,
            )
            .expect("writing to a String");
        }
        writeln!(
            artifacts,
            "    Artifact {{ kind: {kind}, package: {package:?}, path: {path:?} }},",
            package = guest.package
        )
        .expect("writing to a String");
    }
    format!(
        "// Generated by host/build.rs from policies/*/Cargo.toml.\n\
         /// The policies compiled into this binary, referenced as `builtin: NAME`.\n\
         pub static BUILTINS: &[Builtin] = &[\n{builtins}];\n\n\
         /// Every guest built from `policies/`, bundled or not, by package name.\n\
         pub static ARTIFACTS: &[Artifact] = &[\n{artifacts}];\n"
    )
}
