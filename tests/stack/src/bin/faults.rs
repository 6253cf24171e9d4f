//! `cargo xtask faults [--quick]`: the fault matrix. Progress on stderr,
//! the table on stdout, its last line the summary; the exit status says
//! whether every invariant held. See `arcwright_stack::faults` for the
//! cells and what is counted.

use std::process::ExitCode;

use arcwright_stack::faults::{self, MatrixOptions};
use clap::Parser;

/// Runs the fault matrix against the `arcwright` binary.
#[derive(Parser)]
#[command(name = "faults")]
struct Args {
    /// One run per cell and one faulted call per Actions cell (what CI
    /// runs); otherwise three runs per cell, three faulted calls in a row,
    /// twenty kills per phase.
    #[arg(long)]
    quick: bool,
    /// Runs of each Actions and API server cell (overrides the form's).
    #[arg(long)]
    runs: Option<u32>,
    /// Runs of each kill cell (overrides the form's).
    #[arg(long)]
    kills: Option<u32>,
    /// Faulted calls in a row per Actions cell (overrides the form's).
    #[arg(long)]
    times: Option<u32>,
    /// Runs at once.
    #[arg(long, default_value_t = 4)]
    parallel: usize,
    /// Only the cells whose labels contain this (e.g. `GenerateJitConfig`,
    /// `truncated`, `SIGKILL`).
    #[arg(long)]
    filter: Option<String>,
    /// The seed the kill points are drawn from.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let mut options = if args.quick {
        MatrixOptions::quick()
    } else {
        MatrixOptions::full()
    };
    options.runs = args.runs.unwrap_or(options.runs);
    options.kills = args.kills.unwrap_or(options.kills);
    options.times = args.times.unwrap_or(options.times);
    options.parallel = args.parallel;
    options.filter = args.filter;
    options.seed = args.seed;
    let result = arcwright_stack::run_until_interrupted(faults::run(&options, &|line| {
        eprintln!("faults: {line}")
    }));
    match result {
        Ok(reports) => {
            print!("{}", faults::table(&reports));
            println!();
            if faults::clean(&reports) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(error) => {
            eprintln!("faults: {error:#}");
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
