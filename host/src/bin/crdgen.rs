//! Writes the CRDs generated from `arcwright::api` into a directory, or with
//! `--check` fails when the directory's files differ from them.
//!
//! `cargo xtask crds [--check]` runs this; it lives in the host crate so the
//! xtask does not have to build the controller (and its policy guests) to
//! start, which matters on a machine that lacks the wasm target yet.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("crdgen: {error:#}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<bool> {
    let mut check = false;
    let mut dir = None;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--check" => check = true,
            _ if dir.is_none() => dir = Some(PathBuf::from(arg)),
            other => anyhow::bail!("unexpected argument {other:?}; usage: crdgen [--check] DIR"),
        }
    }
    let dir = dir.context("usage: crdgen [--check] DIR")?;
    let files = arcwright::api::crd_files().context("rendering the CRDs")?;
    if !check {
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        for (name, body) in &files {
            let path = dir.join(name);
            std::fs::write(&path, body).with_context(|| format!("writing {}", path.display()))?;
            println!("wrote {}", path.display());
        }
        return Ok(true);
    }
    let mut fresh = true;
    let expected: BTreeSet<&str> = files.iter().map(|(name, _)| name.as_str()).collect();
    for (name, body) in &files {
        let path = dir.join(name);
        match std::fs::read_to_string(&path) {
            Ok(current) if current == *body => {}
            Ok(_) => {
                eprintln!("{} is stale", path.display());
                fresh = false;
            }
            Err(_) => {
                eprintln!("{} is missing", path.display());
                fresh = false;
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".yaml") && !expected.contains(name.as_str()) {
                eprintln!(
                    "{} is not generated from the types any more",
                    entry.path().display()
                );
                fresh = false;
            }
        }
    }
    if !fresh {
        eprintln!("run `cargo xtask crds` and commit crds/");
    }
    Ok(fresh)
}
