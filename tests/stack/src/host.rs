//! `arcwright run` as a child process: started, watched, killed.
//!
//! The host runs as it does in a cluster, a process of its own, so what the
//! stack measures and tests is the shipped binary: its flag parsing, its
//! signal handling, its memory. The process is started through the
//! harness's [`Supervised`], which forks from one long-lived thread with
//! `PR_SET_PDEATHSIG`: a test, benchmark or demo that is killed from outside
//! (Ctrl-C, a CI timeout, `kill -9`) takes the host with it, and dropping
//! the handle stops it. Nothing is left behind.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result, bail};
use arcwright_harness::poll_within;
use arcwright_harness::process::{Supervised, tail};

/// How the log line the binary prints once its HTTP endpoints listen
/// begins (what follows lists the endpoints, which grow); its `address`
/// field says where (the stack passes port 0).
const SERVING: &str = "serving /healthz";

/// How long a start may take: the bundled policies are compiled before the
/// host is ready, which takes seconds on a loaded 2-core machine.
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// Where the `arcwright` binary is: `$ARCWRIGHT_BIN`, or the one cargo built
/// beside the running executable (`target/<profile>/arcwright`), which
/// `cargo test --workspace` (and so `cargo xtask test`) builds for the
/// host's own tests and `cargo xtask demo` / `bench scale` build first.
///
/// A binary older than the host's sources is run with a warning on stderr:
/// a test passing against yesterday's controller proves little about
/// today's, but refusing would fail every test while someone edits the
/// host. Cargo cannot build it from here (a nested cargo on the same target
/// directory waits for the lock the outer one holds).
pub fn arcwright_binary() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("ARCWRIGHT_BIN") {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe().context("finding the running executable")?;
    let mut dir = exe.parent().context("the executable has a directory")?;
    if dir.ends_with("deps") {
        dir = dir.parent().context("deps/ has a parent")?;
    }
    let binary = dir.join("arcwright");
    let profile = if dir.ends_with("release") {
        " --release"
    } else {
        ""
    };
    let built = std::fs::metadata(&binary)
        .and_then(|m| m.modified())
        .with_context(|| {
            format!(
                "no arcwright binary at {}: build it with `cargo build{profile} --workspace --bin arcwright` (or set ARCWRIGHT_BIN)",
                binary.display()
            )
        })?;
    let sources = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../host");
    if let Some(newest) = newest_modification(&sources.join("src"))
        && newest > built
    {
        eprintln!(
            "warning: {} is older than the host's sources: rebuild it with `cargo build{profile} --workspace --bin arcwright`",
            binary.display()
        );
    }
    Ok(binary)
}

/// The latest modification time of any file under `dir`.
fn newest_modification(dir: &Path) -> Option<SystemTime> {
    let mut newest = None;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).ok()?.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                stack.push(entry.path());
            } else if let Ok(modified) = meta.modified() {
                newest = newest.max(Some(modified));
            }
        }
    }
    newest
}

/// A running `arcwright run`.
pub struct HostProcess {
    process: Supervised,
    base: String,
    log: PathBuf,
}

/// What the OS says the host used.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Usage {
    /// User plus system CPU time since the process started.
    pub cpu: Duration,
    /// The peak resident set (`VmHWM`), in bytes.
    pub peak_rss_bytes: u64,
    /// The resident set now (`VmRSS`), in bytes.
    pub rss_bytes: u64,
}

impl HostProcess {
    /// Starts `binary run --kubeconfig K --namespace NS --listen-address
    /// 127.0.0.1:0 --log-format json --allow-plain-http --actions-hosts
    /// 127.0.0.1,localhost` (the fake speaks plain http on loopback, or TLS
    /// as `localhost` behind a terminator) plus `extra`, with `env` added to its environment,
    /// output to `log`, and waits until it says where it serves.
    pub async fn start(
        binary: &Path,
        kubeconfig: &Path,
        namespace: &str,
        log: PathBuf,
        extra: &[String],
        env: &[(&str, &str)],
    ) -> Result<Self> {
        let mut args: Vec<String> = [
            "run",
            "--kubeconfig",
            &kubeconfig.display().to_string(),
            "--namespace",
            namespace,
            "--listen-address",
            "127.0.0.1:0",
            "--log-format",
            "json",
            "--allow-plain-http",
            "--actions-hosts",
            "127.0.0.1,localhost",
        ]
        .map(str::to_owned)
        .to_vec();
        args.extend(extra.iter().cloned());
        let mut process = Supervised::start_with_env("arcwright", binary, &args, env, log.clone())
            .with_context(|| format!("starting {}", binary.display()))?;
        // Each look either finds the address, finds the process gone (an
        // answer too: there is nothing left to wait for), or looks again.
        let serving = poll_within(START_TIMEOUT, || {
            let found = serving_address(&std::fs::read_to_string(&log).unwrap_or_default())
                .map(|address| Ok(format!("http://{address}")))
                .or_else(|| process.ensure_running().err().map(Err));
            async move { found }
        })
        .await;
        let Some(base) = serving else {
            bail!("arcwright never served its endpoints:\n{}", tail(&log, 40));
        };
        let base = base.context("arcwright run")?;
        Ok(HostProcess { process, base, log })
    }

    /// Waits until `/readyz` answers 200: the API server answered, the
    /// bundled policies compiled and every controller listed its objects.
    pub async fn ready(&mut self) -> Result<()> {
        let http = reqwest::Client::new();
        let url = format!("{}/readyz", self.base);
        let process = &mut self.process;
        let ready = poll_within(START_TIMEOUT, || {
            let exited = process.ensure_running().err();
            let (http, url) = (&http, &url);
            async move {
                if let Ok(response) = http.get(url).send().await
                    && response.status() == 200
                {
                    return Some(Ok(()));
                }
                exited.map(Err)
            }
        })
        .await;
        match ready {
            Some(ready) => ready.context("arcwright run"),
            None => bail!("arcwright never became ready:\n{}", self.log_tail(40)),
        }
    }

    /// `http://127.0.0.1:PORT`, where `/healthz`, `/readyz`, `/metrics` are.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.process.ensure_running().is_ok()
    }

    /// SIGKILL, as the OOM killer or a lost node ends a process: no
    /// shutdown code runs, message sessions are not deleted. Reaps it.
    pub fn kill(mut self) {
        // SAFETY: signalling our own child, not reaped yet (we hold it).
        unsafe {
            libc::kill(self.process.pid() as libc::pid_t, libc::SIGKILL);
        }
        // SIGKILL cannot be caught: the grace only covers the reaping.
        self.process.stop(Duration::from_secs(5));
    }

    /// SIGTERM, waiting up to `grace` for the clean shutdown (listeners
    /// delete their sessions), then SIGKILL.
    pub async fn terminate(mut self, grace: Duration) {
        // `stop` polls with a blocking sleep; keep it off the runtime.
        let _ = tokio::task::spawn_blocking(move || self.process.stop(grace)).await;
    }

    /// CPU time and peak memory, from `/proc/PID/stat` and `/proc/PID/status`.
    pub fn usage(&self) -> Result<Usage> {
        process_usage(self.process.pid())
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log, lines)
    }

    /// Its log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }
}

/// CPU time and peak memory of process `pid`, from `/proc/PID/stat` and
/// `/proc/PID/status`.
pub fn process_usage(pid: u32) -> Result<Usage> {
    let stat =
        std::fs::read_to_string(format!("/proc/{pid}/stat")).context("reading /proc/PID/stat")?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .context("reading /proc/PID/status")?;
    // SAFETY: sysconf only reads a constant.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let ticks = u64::try_from(ticks).ok().filter(|&t| t > 0).unwrap_or(100);
    parse_usage(&stat, &status, ticks).context("parsing /proc")
}

/// The `address` of the first JSON log line saying the endpoints serve.
fn serving_address(log: &str) -> Option<String> {
    log.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|json| {
            json["message"]
                .as_str()
                .is_some_and(|m| m.starts_with(SERVING))
        })
        .and_then(|json| json["address"].as_str().map(str::to_owned))
}

/// CPU (utime + stime, fields 14 and 15 of `stat`, after the command name
/// in parentheses, which may itself hold spaces), and `VmHWM` and `VmRSS`
/// from `status`.
fn parse_usage(stat: &str, status: &str, ticks_per_second: u64) -> Option<Usage> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // `after_name` starts at field 3 (state): utime is field 14.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    let ticks = utime + stime;
    let cpu = Duration::from_secs(ticks / ticks_per_second)
        + Duration::from_nanos((ticks % ticks_per_second) * 1_000_000_000 / ticks_per_second);
    let kib = |field: &str| -> Option<u64> {
        status
            .lines()
            .find_map(|line| line.strip_prefix(field))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    Some(Usage {
        cpu,
        peak_rss_bytes: kib("VmHWM:")? * 1024,
        rss_bytes: kib("VmRSS:")? * 1024,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_usage_is_read_past_a_command_name_with_spaces() {
        let stat = "4242 (tokio worker) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 50 0 0 20 0 9 0 100 1000000 2000 18446744073709551615";
        let status =
            "Name:\tarcwright\nVmPeak:\t  900000 kB\nVmHWM:\t   40960 kB\nVmRSS:\t   30000 kB\n";
        let usage = parse_usage(stat, status, 100).unwrap();
        assert_eq!(usage.cpu, Duration::from_secs(3));
        assert_eq!(usage.peak_rss_bytes, 40 * 1024 * 1024);
        assert_eq!(usage.rss_bytes, 30000 * 1024);
        assert_eq!(parse_usage("garbage", status, 100), None);
    }

    #[test]
    fn the_serving_address_is_read_from_the_json_log() {
        let log = "not json\n{\"message\":\"starting\"}\n{\"message\":\"serving /healthz, /readyz, /metrics and more\",\"address\":\"127.0.0.1:4321\"}\n";
        assert_eq!(serving_address(log).as_deref(), Some("127.0.0.1:4321"));
        assert_eq!(serving_address("{\"message\":\"starting\"}"), None);
    }
}
