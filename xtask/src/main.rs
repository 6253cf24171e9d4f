//! arcwright's entry points: `cargo xtask test`, `cargo xtask bench`,
//! `cargo xtask crds`, `cargo xtask control-plane`.
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
        Task::Test { args } => {
            setup()?;
            // `--workspace` takes in the policy guests too: their native unit
            // tests run here, and their YAML suites run through wasmtime in the
            // host's tests.
            let command = ["test".to_owned(), "--workspace".to_owned()];
            cargo(&command.into_iter().chain(args).collect::<Vec<_>>())
        }
        Task::Bench { args } => {
            ensure_wasm_target()?;
            let command = ["bench", "-p", "arcwright", "--bench", "policy"].map(str::to_owned);
            cargo(&command.into_iter().chain(args).collect::<Vec<_>>())
        }
        Task::Crds { check } => {
            ensure_wasm_target()?;
            let mut command = ["run", "-q", "-p", "arcwright", "--bin", "crdgen", "--"]
                .map(str::to_owned)
                .to_vec();
            if check {
                command.push("--check".to_owned());
            }
            command.push(workspace_root().join("crds").display().to_string());
            cargo(&command)
        }
        Task::ControlPlane => {
            let bin = control_plane()?;
            println!("{}", bin.display());
            Ok(())
        }
        Task::Setup => setup(),
    }
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

/// The workspace root: the xtask crate's parent directory.
fn workspace_root() -> std::path::PathBuf {
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

fn cargo(args: &[String]) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let status = Command::new(&cargo)
        .args(args)
        .status()
        .with_context(|| format!("running {cargo} {}", args.join(" ")))?;
    if !status.success() {
        bail!("`cargo {}` failed ({status})", args.join(" "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_cli_is_well_formed() {
        Cli::command().debug_assert();
    }
}
