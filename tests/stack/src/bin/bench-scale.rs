//! `cargo xtask bench scale`: one run of the scale benchmark, one line of
//! figures on stdout (progress on stderr). See `arcwright_stack::bench`
//! for where each figure comes from.

use std::process::ExitCode;

use arcwright_stack::bench::{self, BenchOptions};
use clap::Parser;

/// Drives N jobs through one scale set of at most M runners and prints
/// the figures.
#[derive(Parser)]
#[command(name = "bench-scale")]
struct Args {
    /// Jobs, all enqueued at once.
    #[arg(long, default_value_t = 200)]
    jobs: u32,
    /// The scale set's maxRunners.
    #[arg(long, default_value_t = 20)]
    max_runners: u32,
    /// How long each job runs, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    job_ms: u64,
    /// Vary each job's duration by up to this percentage either way.
    #[arg(long, default_value_t = 0)]
    jitter_pct: u32,
    /// Seeds the jitter: the same seed gives the same scenario.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Extra `arcwright run` flags, after `--`.
    #[arg(last = true)]
    host_args: Vec<String>,
}

fn main() -> ExitCode {
    let Args {
        jobs,
        max_runners,
        job_ms,
        jitter_pct,
        seed,
        host_args,
    } = Args::parse();
    let options = BenchOptions {
        jobs,
        max_runners,
        job_ms,
        jitter_pct,
        seed,
        host_args,
    };
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let result = runtime.block_on(async {
        tokio::select! {
            result = bench::run(&options, &|line| eprintln!("bench: {line}")) => result,
            _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        }
    });
    match result {
        Ok(report) => {
            println!("{report}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("bench: {error:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_cli_is_well_formed() {
        use clap::CommandFactory;
        super::Args::command().debug_assert();
    }
}
