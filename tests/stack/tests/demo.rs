//! The README's main command, run as a user runs it (the `demo` binary
//! that `cargo xtask demo` starts), small and non-interactive: so that it
//! cannot rot, and so that Ctrl-C is known to leave nothing behind.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

fn start(args: &[&str]) -> (Child, mpsc::UnboundedReceiver<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_demo"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("the demo starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

/// The pids of the `processes:` line: the host's and the control plane's.
fn pids(line: &str) -> Vec<i32> {
    line.split_whitespace()
        .filter_map(|pair| pair.split_once('=')?.1.parse().ok())
        .collect()
}

fn alive(pid: i32) -> bool {
    // A zombie still answers signal 0; /proc says whether it is one.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat[stat.rfind(')')? + 1..].split_whitespace().next()?;
            Some(state != "Z")
        })
        .unwrap_or(false)
}

/// Waits until none of `pids` runs (their parent is gone, so init reaps
/// whatever it did not).
async fn all_gone(pids: &[i32]) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while pids.iter().any(|&pid| alive(pid)) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "left behind: {:?}",
            pids.iter().filter(|&&p| alive(p)).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_short_demo_runs_a_burst_swaps_the_policy_and_sums_up() {
    let (mut child, mut lines) = start(&[
        "--non-interactive",
        "--jobs",
        "8",
        "--max-runners",
        "3",
        "--job-ms",
        "500",
    ]);
    let status = tokio::time::timeout(Duration::from_secs(300), child.wait())
        .await
        .expect("the demo ends")
        .unwrap();
    let mut output = Vec::new();
    while let Ok(line) = lines.try_recv() {
        output.push(line);
    }
    let text = output.join("\n");
    assert!(status.success(), "{status}\n{text}");
    let processes = output
        .iter()
        .find(|l| l.starts_with("processes:"))
        .unwrap_or_else(|| panic!("{text}"));
    assert_eq!(pids(processes).len(), 3, "{processes}");
    all_gone(&pids(processes)).await;
    // Progress as plain lines, the swap, and the summary.
    assert!(
        output.iter().any(|l| l.starts_with("jobs queued=")),
        "{text}"
    );
    assert!(
        output
            .iter()
            .any(|l| l.starts_with("swapped the scaling policy")),
        "{text}"
    );
    assert!(text.contains("summary: jobs done: 8"), "{text}");
    for figure in [
        "p50 ",
        "Actions calls per job: ",
        "API server requests per job: ",
    ] {
        assert!(text.contains(figure), "{figure} in {text}");
    }
    let before = output
        .iter()
        .find_map(|l| l.strip_prefix("summary: policy before the swap: "))
        .unwrap_or_else(|| panic!("{text}"));
    let after = output
        .iter()
        .find_map(|l| l.strip_prefix("summary: policy after the swap: "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        before.contains("minRunners"),
        "ARC's formula decided: {before}"
    );
    assert!(
        !after.contains(": minRunners"),
        "cooldown decided after the swap: {after}"
    );
    // The shadow's answers shown live beside the active policy's, and
    // summed up.
    assert!(
        output
            .iter()
            .any(|l| l.starts_with("jobs queued=") && l.contains("| shadow buffered desired=")),
        "{text}"
    );
    let shadow = output
        .iter()
        .find_map(|l| l.strip_prefix("summary: shadow buffered (never applied): answered in "))
        .unwrap_or_else(|| panic!("{text}"));
    let answered: u64 = shadow
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{shadow}"));
    assert!(answered >= 1, "the shadow answered: {shadow}");
}

#[tokio::test]
async fn ctrl_c_stops_the_demo_and_everything_it_started() {
    let (mut child, mut lines) = start(&[
        "--non-interactive",
        "--jobs",
        "50",
        "--max-runners",
        "2",
        "--job-ms",
        "5000",
    ]);
    let mut processes = None;
    let wait = async {
        while let Some(line) = lines.recv().await {
            if line.starts_with("processes:") {
                processes = Some(pids(&line));
            }
            if line.starts_with("jobs queued=") {
                return;
            }
        }
        panic!("the demo ended before showing progress");
    };
    tokio::time::timeout(Duration::from_secs(300), wait)
        .await
        .expect("the demo shows progress");
    let processes = processes.expect("the demo names its processes");

    let pid = child.id().unwrap() as i32;
    // SAFETY: signalling our own child, not reaped yet.
    unsafe {
        libc::kill(pid, libc::SIGINT);
    }
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .expect("the demo exits after Ctrl-C")
        .unwrap();
    assert_eq!(status.code(), Some(130), "{status}");
    all_gone(&processes).await;
}
