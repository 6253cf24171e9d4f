//! `cargo xtask bench scale`: one run of the scale benchmark, arcwright's
//! and then the floor's, one line of figures on stdout (progress on
//! stderr). See `arcwright_stack::bench` for where each figure comes from,
//! and `arcwright_stack::floor` for what the floor does.

use std::process::ExitCode;

use arcwright_stack::bench::{self, BenchOptions};
use clap::Parser;

/// Drives N jobs through one scale set of at most M runners, then the
/// same jobs through the floor, and prints the figures.
#[derive(Parser)]
#[command(name = "bench-scale")]
struct Args {
    #[command(flatten)]
    options: BenchOptions,
}

fn main() -> ExitCode {
    let options = Args::parse().options;
    arcwright_stack::report_main(
        "bench",
        bench::run(&options, &|line| eprintln!("bench: {line}")),
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_cli_is_well_formed() {
        use clap::CommandFactory;
        super::Args::command().debug_assert();
    }
}
