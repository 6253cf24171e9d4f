//! arcwright's entry points: `cargo xtask demo`, `cargo xtask test`,
//! `cargo xtask bench` (and `bench scale`), `cargo xtask faults`, `cargo xtask crds`,
//! `cargo xtask control-plane`, `cargo xtask setup`.
//!
//! These are the commands the README promises. They make sure of what a fresh
//! machine lacks (the `wasm32-wasip2` target, the locally built control
//! plane) before running anything, so the same command works on a laptop, in
//! CI and on a machine that has never built the project.

use std::path::PathBuf;
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
    /// figures (`bench scale --help` for its flags). `cargo xtask bench
    /// fleet --scale-sets K [--jobs N] [--idle-s S]` serves K scale sets
    /// from one host, idle for S seconds and then running N jobs, and
    /// reports what a scale set costs (`bench fleet --help`).
    Bench {
        /// Extra arguments for `cargo bench` (e.g. a benchmark filter).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Runs the fault matrix: the whole stack through a scale set's life
    /// while an Actions endpoint, the API server or the host itself fails,
    /// cell by cell, and prints the table; the last line sums it up.
    ///
    /// `--quick` runs each cell once (as `cargo xtask test` does); without
    /// it, three runs per cell and twenty kills per phase. `cargo xtask
    /// faults --help` lists the other flags (`--filter`, `--parallel`,
    /// `--seed`, ...).
    #[command(disable_help_flag = true)]
    Faults {
        /// The matrix's flags.
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
            // The debug build `cargo xtask test` leaves behind: the demo
            // shows behaviour, not speed.
            run_stack_binary("demo", Profile::Tests, args)
        }
        Task::Bench { args } if args.first().map(String::as_str) == Some("scale") => {
            setup()?;
            // Figures are only worth reporting from an optimised host.
            run_stack_binary(
                "bench-scale",
                Profile::Release,
                args.into_iter().skip(1).collect(),
            )
        }
        Task::Bench { args } if args.first().map(String::as_str) == Some("fleet") => {
            setup()?;
            run_stack_binary(
                "bench-fleet",
                Profile::Release,
                args.into_iter().skip(1).collect(),
            )
        }
        Task::Faults { args } => {
            setup()?;
            // The debug build `cargo xtask test` leaves behind: what is
            // counted is behaviour, not speed.
            run_stack_binary("faults", Profile::Tests, args)
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
            // Built as the tests build it, rather than with the feature
            // set a lone `-p arcwright` would select.
            let [crdgen] = build_binaries(["crdgen"], Profile::Tests)?;
            let crds = workspace_root().join("crds");
            succeed(Command::new(&crdgen).arg(&crds))
        }
        Task::ControlPlane => {
            let bin = control_plane()?;
            println!("{}", bin.display());
            Ok(())
        }
        Task::Setup => setup(),
    }
}

/// Which build a binary xtask runs comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Profile {
    /// The debug build with the features `cargo test --workspace` unifies,
    /// so that after `cargo xtask test` nothing but what changed compiles.
    Tests,
    /// The release build, without the test-only features (tokio's
    /// `test-util`): what the figures of `bench scale` are measured on.
    Release,
}

/// The `cargo build` of the binaries `bins`, together: one package
/// selection, so one feature unification for all of them (`-p arcwright`
/// and then `-p arcwright-stack` unified differently and compiled kube,
/// hyper and wasmtime twice), and `--workspace`, the selection `cargo xtask
/// test` builds with.
///
/// For [`Profile::Tests`], `--examples` (the workspace has none) makes
/// cargo resolve features with the dev-dependencies, as a test build does:
/// without it the dependencies that tests build with other features
/// (tokio, wasmtime) are compiled again. Cargo's messages go to stdout as
/// JSON, so the binaries are found where cargo says it put them.
fn build_command(bins: &[&str], profile: Profile) -> Vec<String> {
    let mut command = vec!["build".to_owned(), "--workspace".to_owned()];
    match profile {
        Profile::Tests => command.push("--examples".to_owned()),
        Profile::Release => command.push("--release".to_owned()),
    }
    for bin in bins {
        command.extend(["--bin".to_owned(), (*bin).to_owned()]);
    }
    command.push("--message-format=json-render-diagnostics".to_owned());
    command
}

/// Builds the binaries `bins` ([`build_command`]); their paths, in order.
fn build_binaries<const N: usize>(bins: [&str; N], profile: Profile) -> Result<[PathBuf; N]> {
    let messages = cargo_output(&build_command(&bins, profile))?;
    built_binaries(&messages, bins)
}

/// Reads the executables `bins` off cargo's JSON messages
/// (`compiler-artifact` lines with an `executable`).
fn built_binaries<const N: usize>(messages: &str, bins: [&str; N]) -> Result<[PathBuf; N]> {
    let mut found: [Option<PathBuf>; N] = std::array::from_fn(|_| None);
    for line in messages.lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let (Some(name), Some(executable)) = (
            message["target"]["name"].as_str(),
            message["executable"].as_str(),
        ) else {
            continue;
        };
        if let Some(at) = bins.iter().position(|bin| *bin == name) {
            found[at] = Some(PathBuf::from(executable));
        }
    }
    let mut paths = Vec::with_capacity(N);
    for (path, bin) in found.into_iter().zip(bins) {
        paths.push(path.with_context(|| format!("cargo built no {bin} binary"))?);
    }
    Ok(paths.try_into().expect("one path per binary"))
}

/// Builds the host and the stack's binary `bin` and runs it, pointed at
/// that host binary (`ARCWRIGHT_BIN`), with SIGINT ignored here meanwhile:
/// Ctrl-C reaches the whole foreground process group, and the stack's
/// binary handles it by stopping everything it started; xtask waits for
/// that and passes its exit status on, rather than returning the prompt
/// while the clean-up is still printing.
fn run_stack_binary(bin: &str, profile: Profile, args: Vec<String>) -> Result<()> {
    let [host, stack] = build_binaries(["arcwright", bin], profile)?;
    // SAFETY: installs the default "ignore" disposition; no handler runs.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
    }
    let mut command = Command::new(&stack);
    command.args(&args).env("ARCWRIGHT_BIN", &host);
    without_the_running_package(&mut command);
    succeed(&mut command)
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
    succeed(&mut cargo_command(args))
}

/// [`cargo`], returning what it printed on stdout (its diagnostics and
/// progress still go to the terminal, on stderr).
fn cargo_output(args: &[String]) -> Result<String> {
    let mut command = cargo_command(args);
    let output = command
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", shown(&command)))?;
    if !output.status.success() {
        bail!("`{}` failed ({})", shown(&command), output.status);
    }
    String::from_utf8(output.stdout).context("cargo's messages are not UTF-8")
}

/// `cargo ARGS`, with the cargo that runs xtask.
fn cargo_command(args: &[String]) -> Command {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut command = Command::new(cargo);
    without_the_running_package(&mut command);
    command.args(args);
    command
}

/// Runs `command` to its end; an error unless it succeeded.
fn succeed(command: &mut Command) -> Result<()> {
    let status = command
        .status()
        .with_context(|| format!("running {}", shown(command)))?;
    if !status.success() {
        bail!("`{}` failed ({status})", shown(command));
    }
    Ok(())
}

/// A command as a person would type it.
fn shown(command: &Command) -> String {
    std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(|word| word.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
}

/// `cargo xtask` is `cargo run`, which describes the xtask package to it in
/// the environment (`CARGO_MANIFEST_DIR`, `CARGO_PKG_NAME`, ...). Passed on,
/// they reach the build scripts of the cargo run here, and some of them
/// watch those variables (ring's watches `CARGO_MANIFEST_DIR`): every
/// switch between `cargo xtask test` and a plain `cargo test` would rebuild
/// ring and everything above it (rustls, kube, the controller), minutes of
/// a clean build. Nor do they describe a stack binary run from here.
fn without_the_running_package(command: &mut Command) {
    for (key, _) in std::env::vars_os() {
        if key.to_str().is_some_and(describes_the_running_package) {
            command.env_remove(&key);
        }
    }
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

    /// `bench scale` and `demo` pass their flags through untouched.
    #[test]
    fn bench_scale_and_demo_pass_their_flags_on() {
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
        let cli = Cli::try_parse_from(["xtask", "demo", "--keep", "--help"]).unwrap();
        let Task::Demo { args } = cli.command else {
            panic!("demo");
        };
        assert_eq!(args, ["--keep", "--help"]);
    }

    /// The host and the stack's binary are built by one cargo, of the whole
    /// workspace: the demo's with the tests' features, the benchmark's
    /// optimised.
    #[test]
    fn the_stack_binaries_are_built_with_the_host_in_one_selection() {
        assert_eq!(
            build_command(&["arcwright", "demo"], Profile::Tests),
            [
                "build",
                "--workspace",
                "--examples",
                "--bin",
                "arcwright",
                "--bin",
                "demo",
                "--message-format=json-render-diagnostics"
            ]
        );
        assert_eq!(
            build_command(&["arcwright", "bench-scale"], Profile::Release),
            [
                "build",
                "--workspace",
                "--release",
                "--bin",
                "arcwright",
                "--bin",
                "bench-scale",
                "--message-format=json-render-diagnostics"
            ]
        );
    }

    #[test]
    fn the_binaries_are_found_where_cargo_says_it_put_them() {
        let messages = [
            r#"{"reason":"compiler-artifact","target":{"name":"arcwright_harness","kind":["lib"]},"executable":null}"#,
            r#"{"reason":"compiler-artifact","target":{"name":"arcwright","kind":["bin"]},"executable":"/t/debug/arcwright"}"#,
            "not JSON: a line cargo does not write, skipped",
            r#"{"reason":"compiler-artifact","target":{"name":"demo","kind":["bin"]},"executable":"/t/debug/demo"}"#,
            r#"{"reason":"build-finished","success":true}"#,
        ]
        .join("\n");
        assert_eq!(
            built_binaries(&messages, ["arcwright", "demo"]).unwrap(),
            [PathBuf::from("/t/debug/arcwright"), "/t/debug/demo".into()]
        );
        let err = built_binaries(&messages, ["arcwright", "bench-scale"]).unwrap_err();
        assert!(err.to_string().contains("no bench-scale binary"), "{err}");
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
