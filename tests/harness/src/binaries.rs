//! Where the control plane's binaries come from: built from the Go module in
//! `tests/control-plane`, once per machine, into a cache outside the work tree.
//!
//! No binary is ever downloaded. The Go module proxy serves `k8s.io/kubernetes`
//! and etcd as source, so `kube-apiserver`, `etcd` and `helm` are compiled here
//! (several minutes on two cores) and kept under a directory named after the
//! Kubernetes release and a digest of the module files. Changing a pinned
//! version changes the digest, which builds into a fresh directory instead of
//! reusing binaries that no longer match the source; an unchanged checkout
//! finds its binaries and pays nothing.

use std::fs;
use std::io::{self, BufRead, BufReader};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::HarnessError;

/// The binaries a complete build provides, all in one `bin` directory.
pub const BINARIES: [&str; 3] = ["kube-apiserver", "etcd", "helm"];

/// Overrides the directory holding the binaries (skips the cache entirely),
/// for a machine that builds them some other way.
pub const BIN_DIR_ENV: &str = "ARCWRIGHT_CONTROL_PLANE_BIN";

/// Overrides the cache root (default `$XDG_CACHE_HOME/arcwright`, then
/// `$HOME/.cache/arcwright`).
pub const CACHE_DIR_ENV: &str = "ARCWRIGHT_CACHE_DIR";

/// Written last into a finished build directory. A directory without it is
/// the remains of an interrupted build and is never used.
const COMPLETE_MARKER: &str = ".complete";

/// The Go module's files whose content decides the build: the pins, the
/// checksums and the two mains. Anything else in the directory cannot change
/// the binaries.
const KEY_FILES: [&str; 6] = [
    "go.mod",
    "go.sum",
    "cmd/kube-apiserver/main.go",
    "cmd/etcd/main.go",
    "helm/go.mod",
    "helm/go.sum",
];

/// The Go module in this repository that pins the control plane.
pub fn module_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("control-plane")
}

/// The root of arcwright's machine-wide cache.
pub fn cache_root() -> PathBuf {
    if let Some(dir) = std::env::var_os(CACHE_DIR_ENV) {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(dir).join("arcwright");
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into());
    PathBuf::from(home).join(".cache").join("arcwright")
}

/// The pinned Kubernetes release, read from the module's `require` line.
pub fn kubernetes_version() -> Result<String, HarnessError> {
    let go_mod = read(&module_dir().join("go.mod"))?;
    go_mod
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let first = words.next()?;
            let module = if first == "require" {
                words.next()?
            } else {
                first
            };
            (module == "k8s.io/kubernetes").then(|| words.next().map(str::to_owned))?
        })
        .next()
        .ok_or_else(|| {
            HarnessError::Build(
                "tests/control-plane/go.mod does not require k8s.io/kubernetes".into(),
            )
        })
}

/// The cache key: the Kubernetes release plus a digest of the module files.
pub fn cache_key() -> Result<String, HarnessError> {
    let dir = module_dir();
    let mut digest = Sha256::new();
    for file in KEY_FILES {
        digest.update(file.as_bytes());
        digest.update(read(&dir.join(file))?.as_bytes());
    }
    let hash = hex::encode(digest.finalize());
    Ok(format!("k8s-{}-{}", kubernetes_version()?, &hash[..16]))
}

/// The directory the binaries of this checkout live in.
pub fn bin_dir() -> Result<PathBuf, HarnessError> {
    if let Some(dir) = std::env::var_os(BIN_DIR_ENV) {
        return Ok(PathBuf::from(dir));
    }
    Ok(cache_root()
        .join("control-plane")
        .join(cache_key()?)
        .join("bin"))
}

/// Returns the binaries' directory if a complete build is there.
pub fn find() -> Result<Option<PathBuf>, HarnessError> {
    let bin = bin_dir()?;
    let complete = if std::env::var_os(BIN_DIR_ENV).is_some() {
        BINARIES.iter().all(|name| bin.join(name).is_file())
    } else {
        bin.join(COMPLETE_MARKER).is_file()
    };
    Ok(complete.then_some(bin))
}

/// Makes sure the binaries are built, building them if they are not, and
/// returns their directory.
///
/// `progress` receives a line now and then while the build runs, because a
/// cold build takes minutes and silence would look like a hang.
///
/// The build goes into a scratch directory that is renamed into place only
/// when every binary is there, so two concurrent builds (two test binaries on a
/// fresh machine) cannot leave a half-written directory that looks complete:
/// the loser of the rename simply discards its copy.
pub fn ensure_built(progress: &dyn Fn(&str)) -> Result<PathBuf, HarnessError> {
    if let Some(bin) = find()? {
        return Ok(bin);
    }
    // One build at a time: tests of one binary start control planes
    // concurrently, and several test binaries may start at once on a fresh
    // machine. A thread lock serialises the first, a file lock the second;
    // whoever waited then finds the finished build.
    static IN_PROCESS: Mutex<()> = Mutex::new(());
    let _thread = IN_PROCESS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let _file = BuildLock::acquire()?;
    if let Some(bin) = find()? {
        return Ok(bin);
    }
    if std::env::var_os(BIN_DIR_ENV).is_some() {
        return Err(HarnessError::Build(format!(
            "{BIN_DIR_ENV} is set but does not hold all of {BINARIES:?}"
        )));
    }
    let bin = bin_dir()?;
    let key_dir = bin.parent().expect("bin dir has a parent").to_path_buf();
    let scratch = key_dir.with_extension(format!("building-{}", std::process::id()));
    let _ = fs::remove_dir_all(&scratch);
    // A failed or interrupted build must not leave hundreds of megabytes of
    // partial binaries behind.
    let _cleanup = RemoveOnDrop(scratch.clone());
    let scratch_bin = scratch.join("bin");
    fs::create_dir_all(&scratch_bin).map_err(|e| io_error(&scratch_bin, e))?;

    let started = Instant::now();
    progress(&format!(
        "building the local control plane (kube-apiserver, etcd, helm; Kubernetes {}) into {}",
        kubernetes_version()?,
        key_dir.display()
    ));
    progress("a cold build takes several minutes on two cores; later runs reuse it");

    let module = module_dir();
    go_build(
        &module,
        &["./cmd/kube-apiserver", "./cmd/etcd"],
        &scratch_bin,
        progress,
    )?;
    go_build(
        &module.join("helm"),
        &["helm.sh/helm/v3/cmd/helm"],
        &scratch_bin,
        progress,
    )?;
    for name in BINARIES {
        if !scratch_bin.join(name).is_file() {
            return Err(HarnessError::Build(format!(
                "go build finished but {name} is missing from {}",
                scratch_bin.display()
            )));
        }
    }
    fs::write(scratch_bin.join(COMPLETE_MARKER), b"").map_err(|e| io_error(&scratch_bin, e))?;

    if fs::rename(&scratch, &key_dir).is_err() {
        // Another build won the race; its result is as good as ours.
        let _ = fs::remove_dir_all(&scratch);
        if find()?.is_none() {
            return Err(HarnessError::Build(format!(
                "could not move the build into {}",
                key_dir.display()
            )));
        }
    }
    progress(&format!(
        "control plane built in {:.0} s",
        started.elapsed().as_secs_f64()
    ));
    Ok(bin)
}

/// An exclusive `flock` on a file beside the cache directories, held for the
/// length of a build and released when the process exits, however it exits.
struct BuildLock(fs::File);

impl BuildLock {
    fn acquire() -> Result<Self, HarnessError> {
        let dir = cache_root().join("control-plane");
        fs::create_dir_all(&dir).map_err(|e| io_error(&dir, e))?;
        let path = dir.join(".build.lock");
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| io_error(&path, e))?;
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(io_error(&path, io::Error::last_os_error()));
        }
        Ok(Self(file))
    }
}

impl Drop for BuildLock {
    fn drop(&mut self) {
        // SAFETY: unlocking the descriptor locked in `acquire`.
        unsafe {
            libc::flock(self.0.as_raw_fd(), libc::LOCK_UN);
        }
    }
}

/// Removes a directory when dropped, unless it was renamed away first.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Runs `go build` for `packages` in `dir`, reporting elapsed time every 30 s.
fn go_build(
    dir: &Path,
    packages: &[&str],
    out: &Path,
    progress: &dyn Fn(&str),
) -> Result<(), HarnessError> {
    let mut out_arg = out.as_os_str().to_owned();
    out_arg.push("/");
    let mut child = Command::new("go")
        .arg("build")
        .arg("-trimpath")
        .arg("-o")
        .arg(&out_arg)
        .args(packages)
        .current_dir(dir)
        .env("CGO_ENABLED", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            HarnessError::Build(format!(
                "could not run `go` ({e}); install Go 1.26 or newer to build the local control plane"
            ))
        })?;

    // Collect output on threads so a chatty build cannot fill a pipe and stall.
    let (tx, rx) = mpsc::channel::<String>();
    let readers: Vec<_> = [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn io::Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn io::Read + Send>),
    ]
    .into_iter()
    .flatten()
    .map(|stream| {
        let tx = tx.clone();
        thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        })
    })
    .collect();
    drop(tx);

    let started = Instant::now();
    let mut output = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(line) => output.push(line),
            Err(mpsc::RecvTimeoutError::Timeout) => progress(&format!(
                "  still building {} ({:.0} s)",
                packages.join(" "),
                started.elapsed().as_secs_f64()
            )),
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    for reader in readers {
        let _ = reader.join();
    }
    let status = child
        .wait()
        .map_err(|e| HarnessError::Build(format!("waiting for go build: {e}")))?;
    if !status.success() {
        return Err(HarnessError::Build(format!(
            "go build {} in {} failed ({status}):\n{}",
            packages.join(" "),
            dir.display(),
            output.join("\n")
        )));
    }
    Ok(())
}

fn read(path: &Path) -> Result<String, HarnessError> {
    fs::read_to_string(path).map_err(|e| io_error(path, e))
}

fn io_error(path: &Path, error: io::Error) -> HarnessError {
    HarnessError::Io {
        path: path.to_path_buf(),
        source: error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_names_the_pinned_release_and_changes_with_the_module() {
        let key = cache_key().unwrap();
        let version = kubernetes_version().unwrap();
        assert!(version.starts_with("v1."), "{version}");
        assert!(key.starts_with(&format!("k8s-{version}-")), "{key}");
        assert_eq!(key.len(), format!("k8s-{version}-").len() + 16);
        assert_eq!(key, cache_key().unwrap(), "the key is deterministic");
    }
}
