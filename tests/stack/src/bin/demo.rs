//! `cargo xtask demo`: see `arcwright_stack::demo`.

use std::process::ExitCode;

use arcwright_stack::demo::{self, DemoOptions};
use clap::Parser;

/// arcwright's whole job on one machine: a burst of jobs through a scale
/// set, a live policy swap, and the figures.
#[derive(Parser)]
#[command(name = "demo")]
struct Args {
    /// Jobs in the burst.
    #[arg(long, default_value_t = 60)]
    jobs: u32,
    /// The scale set's maxRunners.
    #[arg(long, default_value_t = 10)]
    max_runners: u32,
    /// How long each job runs, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    job_ms: u64,
    /// Keep everything up after the summary and print a kubeconfig, until
    /// Ctrl-C.
    #[arg(long)]
    keep: bool,
    /// Plain log lines instead of progress bars (the default when stdout
    /// is not a terminal).
    #[arg(long)]
    non_interactive: bool,
}

fn main() -> ExitCode {
    let Args {
        jobs,
        max_runners,
        job_ms,
        keep,
        non_interactive,
    } = Args::parse();
    let options = DemoOptions {
        jobs,
        max_runners,
        job_ms,
        keep,
        plain: non_interactive || DemoOptions::plain_unless_terminal(),
    };
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    // Ctrl-C drops the demo's future, and with it the stack: the host, the
    // simulator, the fake and the control plane stop before the process
    // exits.
    let result = runtime.block_on(async {
        tokio::select! {
            result = demo::run(&options) => result.map(drop),
            _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        }
    });
    drop(runtime);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) if error.to_string() == "interrupted" => {
            eprintln!("demo: interrupted; everything it started is stopped");
            ExitCode::from(130)
        }
        Err(error) => {
            eprintln!("demo: {error:#}");
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
