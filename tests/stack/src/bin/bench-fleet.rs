//! `cargo xtask bench fleet`: one run of the fleet benchmark, one line of
//! figures on stdout (progress on stderr). See `arcwright_stack::fleet`.

use std::process::ExitCode;

use arcwright_stack::fleet::{self, FleetOptions};
use clap::Parser;

/// Serves K scale sets from one host, idle and then busy, and prints what
/// a scale set costs it.
#[derive(Parser)]
#[command(name = "bench-fleet")]
struct Args {
    #[command(flatten)]
    options: FleetOptions,
}

fn main() -> ExitCode {
    let options = Args::parse().options;
    arcwright_stack::report_main(
        "fleet",
        fleet::run(&options, &|line| eprintln!("fleet: {line}")),
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
