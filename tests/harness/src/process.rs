//! Child processes that cannot outlive the test that started them.
//!
//! A test binary can end in three ways: normally, with a failed (panicking)
//! test, or killed from outside (a timeout, Ctrl-C, `kill -9`). The first two
//! run destructors or `atexit` handlers and stop the children there. The third
//! runs nothing, so every child also asks the kernel to kill it when its
//! parent goes (`PR_SET_PDEATHSIG`).
//!
//! That signal fires when the *thread* that forked the child exits, not the
//! process. Test threads and tokio's blocking threads come and go, so children
//! are forked from one dedicated thread that lives as long as the process.

use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use crate::HarnessError;

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// Forks `command` from the long-lived spawner thread.
fn spawn_from_spawner(command: Command) -> std::io::Result<Child> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let sender = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        thread::Builder::new()
            .name("control-plane-spawner".into())
            .spawn(move || {
                // The receiver lives in a static sender's channel, so this loop
                // (and the thread) lasts until the process exits.
                for (mut command, reply) in rx {
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("spawn the control plane spawner thread");
        Mutex::new(tx)
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    sender
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .send((command, reply_tx))
        .map_err(|_| std::io::Error::other("the spawner thread is gone"))?;
    reply_rx
        .recv()
        .map_err(|_| std::io::Error::other("the spawner thread is gone"))?
}

/// A running child whose output goes to a log file.
pub struct Supervised {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Supervised {
    /// Starts `program` with `args`, output to `log`.
    pub fn start(
        name: &'static str,
        program: &Path,
        args: &[String],
        log: PathBuf,
    ) -> Result<Self, HarnessError> {
        Self::start_with_env(name, program, args, &[], log)
    }

    /// [`Supervised::start`] with `env` added to the inherited environment.
    pub fn start_with_env(
        name: &'static str,
        program: &Path,
        args: &[String],
        env: &[(&str, &str)],
        log: PathBuf,
    ) -> Result<Self, HarnessError> {
        let out = File::create(&log).map_err(|source| HarnessError::Io {
            path: log.clone(),
            source,
        })?;
        let err = out.try_clone().map_err(|source| HarnessError::Io {
            path: log.clone(),
            source,
        })?;
        let mut command = Command::new(program);
        command
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        // SAFETY: the closure runs in the forked child before exec and only
        // makes an async-signal-safe system call.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = spawn_from_spawner(command).map_err(|e| {
            HarnessError::Start(format!(
                "could not start {name} ({}): {e}",
                program.display()
            ))
        })?;
        Ok(Self { name, child, log })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Fails if the process has already exited, quoting its log.
    pub fn ensure_running(&mut self) -> Result<(), HarnessError> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(HarnessError::Start(format!(
                "{} exited early ({status}); last lines of its log:\n{}",
                self.name,
                tail(&self.log, 40)
            ))),
            Err(e) => Err(HarnessError::Start(format!("{}: {e}", self.name))),
        }
    }

    /// Stops the process: SIGTERM, then SIGKILL if it has not gone within
    /// `grace`. Always reaps it, so no zombie is left.
    pub fn stop(&mut self, grace: Duration) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: signalling our own child, which has not been reaped yet.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The log's last `lines` lines.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log, lines)
    }

    /// The process name used in messages.
    pub fn name(&self) -> &'static str {
        self.name
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(2));
    }
}

/// The last `lines` lines of a log file (reads at most its last 256 KiB).
pub fn tail(path: &Path, lines: usize) -> String {
    const WINDOW: u64 = 256 * 1024;
    let Ok(mut file) = File::open(path) else {
        return format!("(no log at {})", path.display());
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(WINDOW)));
    let mut text = String::new();
    let mut bytes = Vec::new();
    if file.read_to_end(&mut bytes).is_ok() {
        text = String::from_utf8_lossy(&bytes).into_owned();
    }
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Removes data directories left behind by test processes that were killed
/// before they could clean up (their pid is no longer alive).
pub fn sweep_stale(root: &Path, prefix: &str) {
    let Ok(entries) = fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(prefix)) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        // SAFETY: signal 0 only checks whether the process exists.
        let alive = unsafe { libc::kill(pid, 0) } == 0
            || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
        if !alive {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}
