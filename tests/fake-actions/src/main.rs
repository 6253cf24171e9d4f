//! `fake-actions`: the fake Actions service as a process, for the demo and
//! for poking at a controller by hand.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use fake_actions::{FakeActions, FakeConfig, VanishedJobPolicy};

/// A fake of the GitHub Actions service (scale-set protocol), with a control
/// API under /_fake/ to enqueue jobs, inject faults and read the ledger.
#[derive(Debug, Parser)]
#[command(name = "fake-actions", version)]
struct Args {
    /// Address to listen on.
    #[arg(long, env = "FAKE_ACTIONS_LISTEN", default_value = "127.0.0.1:8099")]
    listen: SocketAddr,
    /// Seconds an empty long poll waits before answering 202 (the real
    /// service waits about 50).
    #[arg(long, env = "FAKE_ACTIONS_LONG_POLL_SECONDS", default_value_t = 50)]
    long_poll_seconds: u64,
    /// Lifetime of admin tokens, in seconds.
    #[arg(long, env = "FAKE_ACTIONS_ADMIN_TOKEN_SECONDS", default_value_t = 600)]
    admin_token_seconds: u64,
    /// Prefix Actions-service JSON bodies with a UTF-8 byte order mark.
    #[arg(long)]
    utf8_bom: bool,
    /// Seconds a job assigned to a scale set waits for a runner of the set
    /// before the service cancels it and offers it again (also changeable at
    /// run time: PATCH /_fake/settings {"assignment_timeout_ms": N}).
    #[arg(
        long,
        env = "FAKE_ACTIONS_ASSIGNMENT_TIMEOUT_SECONDS",
        default_value_t = 60
    )]
    assignment_timeout_seconds: u64,
    /// Cancel, rather than requeue, jobs whose runner vanished.
    #[arg(long)]
    cancel_vanished_jobs: bool,
    /// A runner group besides Default; repeat for more.
    #[arg(long = "runner-group")]
    runner_groups: Vec<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "fake_actions=info".into()),
        )
        .init();
    let Args {
        listen,
        long_poll_seconds,
        admin_token_seconds,
        utf8_bom,
        assignment_timeout_seconds,
        cancel_vanished_jobs,
        runner_groups,
    } = Args::parse();
    let config = FakeConfig {
        listen,
        long_poll: Duration::from_secs(long_poll_seconds),
        admin_token_lifetime: Duration::from_secs(admin_token_seconds),
        utf8_bom,
        assignment_timeout: Duration::from_secs(assignment_timeout_seconds),
        vanished_jobs: if cancel_vanished_jobs {
            VanishedJobPolicy::Cancel
        } else {
            VanishedJobPolicy::Requeue
        },
        extra_runner_groups: runner_groups,
        ..FakeConfig::default()
    };
    let fake = FakeActions::start(config)
        .await
        .context("starting the fake Actions service")?;
    let app = fake.app_credentials();
    // Test credentials of a fake: printing them is the point.
    println!("url: {}", fake.url());
    println!("pat: {}", fake.pat());
    println!(
        "app: id {} installation {} (private key at {}/_fake/credentials)",
        app.app_id,
        app.installation_id,
        fake.url()
    );
    tokio::signal::ctrl_c()
        .await
        .context("waiting for Ctrl-C")?;
    fake.stop().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        super::Args::command().debug_assert();
    }
}
