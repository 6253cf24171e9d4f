//! arcwright's entry points: `cargo xtask demo`, `cargo xtask test`,
//! `cargo xtask bench` (and `bench scale`), `cargo xtask crds`,
//! `cargo xtask control-plane`, `cargo xtask setup`.
//!
//! These are the commands the README promises. They make sure of what a fresh
//! machine lacks (the `wasm32-wasip2` target, the locally built control
//! plane) before running anything, so the same command works on a laptop, in
//! CI and on a machine that has never built the project.

use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

/// The target the policy guests are compiled to.
const WASM_TARGET: &str = "wasm32-wasip2";

#[derive(Parser)]
#[command(about = "arcwright's development entry points")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Brings up the whole stack on this machine (control plane, fake
    /// Actions service, runner simulator, `arcwright run`), runs a burst of
    /// jobs with a live view, swaps the scaling policy mid-run and sums up.
    ///
    /// Its flags (`--jobs`, `--max-runners`, `--job-ms`, `--keep`,
    /// `--non-interactive`) go to the demo; `cargo xtask demo --help` lists
    /// them.
    #[command(disable_help_flag = true)]
    Demo {
        /// The demo's flags.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Runs every test the project has: unit, policy (through wasmtime),
    /// integration against a real kube-apiserver, end-to-end.
    ///
    /// A package filter (`-p NAME`) among the arguments narrows the run.
    Test {
        /// Extra arguments for `cargo test` (e.g. a test name filter).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Runs the benchmarks (criterion) and prints their tables: policy
    /// decision latency beside the empty-component floor and native Rust.
    ///
    /// `cargo xtask bench scale --jobs N --max-runners M [--job-ms MS]
    /// [--seed S]` runs the scale benchmark instead: N jobs through one
    /// scale set against the release build of `arcwright run`, one line of
    /// figures (`bench scale --help` for its flags).
    Bench {
        /// Extra arguments for `cargo bench` (e.g. a benchmark filter).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Writes `crds/` from the Rust types in `host/src/api`; with `--check`,
    /// fails when the committed files are stale instead.
    Crds {
        /// Compare instead of writing.
        #[arg(long)]
        check: bool,
    },
    /// Builds (once per machine) the local kube-apiserver, etcd and helm,
    /// and prints where they are.
    ControlPlane,
    /// Installs the prerequisites a fresh machine lacks (the wasm target and
    /// the control plane) without running anything else.
    Setup,
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("xtask: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Task::Demo { args } => {
            setup()?;
            // The debug build: `cargo xtask test` keeps it warm, and the
            // demo shows behaviour, not speed.
            cargo(&build_host(false))?;
            run_stack_binary("demo", false, args)
        }
        Task::Bench { args } if args.first().map(String::as_str) == Some("scale") => {
            setup()?;
            // Figures are only worth reporting from an optimised host.
            cargo(&build_host(true))?;
            run_stack_binary("bench-scale", true, args.into_iter().skip(1).collect())
        }
        Task::Test { args } => {
            setup()?;
            cargo(&test_command(args))
        }
        Task::Bench { args } => {
            ensure_wasm_target()?;
            let command = ["bench", "-p", "arcwright", "--bench", "policy"].map(str::to_owned);
            cargo(&command.into_iter().chain(args).collect::<Vec<_>>())
        }
        Task::Crds { check: true } => {
            // The check is a test of the workspace build, so CI does not
            // compile the controller a second time with the feature set a
            // lone `-p arcwright` would select.
            ensure_wasm_target()?;
            cargo(
                &[
                    "test",
                    "--workspace",
                    "--test",
                    "crds",
                    "--",
                    "--exact",
                    "the_committed_crds_are_the_ones_the_types_generate",
                ]
                .map(str::to_owned),
            )
        }
        Task::Crds { check: false } => {
            ensure_wasm_target()?;
            let crds = workspace_root().join("crds").display().to_string();
            cargo(
                &[
                    "run",
                    "-q",
                    "-p",
                    "arcwright",
                    "--bin",
                    "crdgen",
                    "--",
                    &crds,
                ]
                .map(str::to_owned),
            )
        }
        Task::ControlPlane => {
            let bin = control_plane()?;
            println!("{}", bin.display());
            Ok(())
        }
        Task::Setup => setup(),
    }
}

/// `cargo build [--release] -p arcwright --bin arcwright`: the binary the
/// stack runs as a separate process, built before the stack's own binary
/// runs (which finds it beside itself in `target/<profile>/`).
fn build_host(release: bool) -> Vec<String> {
    let mut command = vec!["build".to_owned()];
    if release {
        command.push("--release".to_owned());
    }
    command.extend(["-p", "arcwright", "--bin", "arcwright"].map(str::to_owned));
    command
}

/// Runs one of the stack's binaries through `cargo run`, with SIGINT
/// ignored here meanwhile: Ctrl-C reaches the whole foreground process
/// group, and the stack's binary handles it by stopping everything it
/// started; xtask waits for that and passes its exit status on, rather
/// than returning the prompt while the clean-up is still printing.
fn run_stack_binary(bin: &str, release: bool, args: Vec<String>) -> Result<()> {
    let command = stack_command(bin, release, args);
    // SAFETY: installs the default "ignore" disposition; no handler runs.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
    }
    cargo(&command)
}

/// `cargo run -q [--release] -p arcwright-stack --bin BIN -- ARGS`.
fn stack_command(bin: &str, release: bool, args: Vec<String>) -> Vec<String> {
    let mut command = vec!["run".to_owned(), "-q".to_owned()];
    if release {
        command.push("--release".to_owned());
    }
    command.extend(["-p", "arcwright-stack", "--bin", bin, "--"].map(str::to_owned));
    command.extend(args);
    command
}

/// The `cargo test` arguments for `cargo xtask test ARGS`.
///
/// Without a package selection the whole workspace is tested: `--workspace`
/// takes in the policy guests too (their native unit tests run here; their
/// YAML suites run through wasmtime in the host's tests), which a plain
/// `cargo test` at the root would leave out (they are not default members).
/// With `-p NAME` (or `--package`, `--workspace`, `--exclude`) the caller
/// has chosen, and `--workspace` must not be added: cargo would test every
/// package and the selection would silently mean nothing.
fn test_command(args: Vec<String>) -> Vec<String> {
    let selects_packages = args
        .iter()
        // Everything after `--` goes to the test binaries, not to cargo.
        .take_while(|arg| arg.as_str() != "--")
        .any(|arg| {
            arg.starts_with("-p")
                || arg == "--package"
                || arg.starts_with("--package=")
                || arg == "--workspace"
                || arg == "--all"
                || arg == "--exclude"
                || arg.starts_with("--exclude=")
        });
    let mut command = vec!["test".to_owned()];
    if !selects_packages {
        command.push("--workspace".to_owned());
    }
    command.extend(args);
    command
}

fn setup() -> Result<()> {
    ensure_wasm_target()?;
    control_plane()?;
    Ok(())
}

/// Adds the wasm target through rustup when it is missing. The host's build
/// script compiles the policy guests for it, and fails without it.
fn ensure_wasm_target() -> Result<()> {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .context("running `rustup target list --installed` (is rustup installed?)")?;
    if String::from_utf8_lossy(&installed.stdout)
        .lines()
        .any(|line| line.trim() == WASM_TARGET)
    {
        return Ok(());
    }
    eprintln!("xtask: installing the {WASM_TARGET} target");
    let status = Command::new("rustup")
        .args(["target", "add", WASM_TARGET])
        .status()
        .context("running `rustup target add`")?;
    if !status.success() {
        bail!("`rustup target add {WASM_TARGET}` failed ({status})");
    }
    Ok(())
}

fn control_plane() -> Result<std::path::PathBuf> {
    arcwright_harness::binaries::ensure_built(&|line| eprintln!("xtask: {line}"))
        .context("building the local control plane")
}

/// The workspace root: the xtask crate's parent directory. Where `cargo
/// run` says the crate is, before where it was compiled from: a target
/// directory shared with another checkout can hold an xtask compiled
/// there, which would otherwise write the CRDs into that checkout.
fn workspace_root() -> std::path::PathBuf {
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR").map_or_else(
        || env!("CARGO_MANIFEST_DIR").into(),
        std::path::PathBuf::from,
    );
    manifest.parent().unwrap_or(&manifest).to_path_buf()
}

fn cargo(args: &[String]) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut command = Command::new(&cargo);
    // `cargo xtask` is `cargo run`, which describes the xtask package to it
    // in the environment (`CARGO_MANIFEST_DIR`, `CARGO_PKG_NAME`, ...).
    // Passed on, they reach the build scripts of the cargo run here, and
    // some of them watch those variables (ring's watches
    // `CARGO_MANIFEST_DIR`): every switch between `cargo xtask test` and a
    // plain `cargo test` would rebuild ring and everything above it
    // (rustls, kube, the controller), minutes of a clean build.
    for (key, _) in std::env::vars_os() {
        if key.to_str().is_some_and(describes_the_running_package) {
            command.env_remove(&key);
        }
    }
    let status = command
        .args(args)
        .status()
        .with_context(|| format!("running {cargo} {}", args.join(" ")))?;
    if !status.success() {
        bail!("`cargo {}` failed ({status})", args.join(" "));
    }
    Ok(())
}

/// Whether `key` is one of the variables cargo sets for the package it
/// builds or runs, rather than one a person sets to configure cargo.
fn describes_the_running_package(key: &str) -> bool {
    key.starts_with("CARGO_PKG_")
        || matches!(
            key,
            "CARGO_MANIFEST_DIR"
                | "CARGO_MANIFEST_PATH"
                | "CARGO_MANIFEST_LINKS"
                | "CARGO_CRATE_NAME"
                | "CARGO_BIN_NAME"
                | "CARGO_PRIMARY_PACKAGE"
                | "CARGO_TARGET_TMPDIR"
                | "OUT_DIR"
        )
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn what_cargo_run_sets_is_not_passed_on_and_what_configures_cargo_is() {
        for key in [
            "CARGO_MANIFEST_DIR",
            "CARGO_MANIFEST_PATH",
            "CARGO_PKG_NAME",
            "CARGO_PKG_VERSION_MAJOR",
            "CARGO_CRATE_NAME",
            "CARGO_PRIMARY_PACKAGE",
        ] {
            assert!(describes_the_running_package(key), "{key}");
        }
        for key in [
            "CARGO",
            "CARGO_HOME",
            "CARGO_TARGET_DIR",
            "CARGO_INCREMENTAL",
            "CARGO_BUILD_JOBS",
            "CARGO_PROFILE_DEV_DEBUG",
            "RUSTFLAGS",
            "RUSTC_WORKSPACE_WRAPPER",
        ] {
            assert!(!describes_the_running_package(key), "{key}");
        }
    }

    #[test]
    fn the_cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn a_package_selection_replaces_the_workspace() {
        let cases: &[(&[&str], &[&str])] = &[
            (&[], &["test", "--workspace"]),
            (&["policy_"], &["test", "--workspace", "policy_"]),
            (
                &["-p", "arcwright-harness"],
                &["test", "-p", "arcwright-harness"],
            ),
            (&["-parcwright"], &["test", "-parcwright"]),
            (
                &["--package", "arcwright", "--test", "policy_cli"],
                &["test", "--package", "arcwright", "--test", "policy_cli"],
            ),
            (&["--package=xtask"], &["test", "--package=xtask"]),
            (
                &["--workspace", "--exclude", "xtask"],
                &["test", "--workspace", "--exclude", "xtask"],
            ),
            // After `--` the words belong to the test binary: `-p` there is
            // no package selection.
            (
                &["--", "-p", "--nocapture"],
                &["test", "--workspace", "--", "-p", "--nocapture"],
            ),
        ];
        for (args, expected) in cases {
            let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
            assert_eq!(test_command(args.clone()), *expected, "{args:?}");
        }
    }

    /// `bench scale` and `demo` pass their flags through untouched, to the
    /// release build for the figures and the debug build for the demo.
    #[test]
    fn bench_scale_and_demo_reach_the_stack_binaries_with_their_flags() {
        let cli = Cli::try_parse_from([
            "xtask",
            "bench",
            "scale",
            "--jobs",
            "200",
            "--max-runners",
            "20",
            "--help",
        ])
        .unwrap();
        let Task::Bench { args } = cli.command else {
            panic!("bench");
        };
        assert_eq!(
            args,
            ["scale", "--jobs", "200", "--max-runners", "20", "--help"]
        );
        assert_eq!(
            stack_command("bench-scale", true, args[1..].to_vec()),
            [
                "run",
                "-q",
                "--release",
                "-p",
                "arcwright-stack",
                "--bin",
                "bench-scale",
                "--",
                "--jobs",
                "200",
                "--max-runners",
                "20",
                "--help"
            ]
        );
        assert_eq!(
            build_host(true),
            [
                "build",
                "--release",
                "-p",
                "arcwright",
                "--bin",
                "arcwright"
            ]
        );
        let cli = Cli::try_parse_from(["xtask", "demo", "--keep", "--help"]).unwrap();
        let Task::Demo { args } = cli.command else {
            panic!("demo");
        };
        assert_eq!(
            stack_command("demo", false, args),
            [
                "run",
                "-q",
                "-p",
                "arcwright-stack",
                "--bin",
                "demo",
                "--",
                "--keep",
                "--help"
            ]
        );
    }

    /// The package description is what `cargo` and crates listings show:
    /// it names exactly the commands that exist, no more.
    #[test]
    fn the_description_names_exactly_the_commands() {
        let description = env!("CARGO_PKG_DESCRIPTION");
        let (_, listed) = description
            .split_once(": ")
            .expect("the description lists the commands after a colon");
        let mut listed: Vec<&str> = listed.split(", ").collect();
        listed.sort_unstable();
        let mut commands: Vec<String> = Cli::command()
            .get_subcommands()
            .map(|c| c.get_name().to_owned())
            .collect();
        commands.sort_unstable();
        assert_eq!(listed, commands);
    }
}
