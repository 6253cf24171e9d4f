//! The `arcwright` binary: the command line parsed, logging set up, the
//! command run.

mod cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    arcwright::telemetry::init(cli.logging());
    match cli.run() {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {}", describe(&err));
            ExitCode::from(2)
        }
    }
}

/// The error and its causes on one line. Most of arcwright's errors already
/// say their cause in their own message (so a log line or a status condition
/// is whole on its own); a cause is added only where it is not already said.
fn describe(err: &anyhow::Error) -> String {
    let mut text = err.to_string();
    for cause in err.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("the file is gone")]
    struct Gone;

    #[derive(Debug, thiserror::Error)]
    #[error("the default cannot be used: {0}")]
    struct Says(#[source] Gone);

    #[test]
    fn a_cause_is_told_once() {
        let told = anyhow::Error::new(Says(Gone)).context("starting");
        assert_eq!(
            describe(&told),
            "starting: the default cannot be used: the file is gone"
        );
        let untold = anyhow::Error::new(Gone).context("reading the defaults");
        assert_eq!(describe(&untold), "reading the defaults: the file is gone");
    }
}
