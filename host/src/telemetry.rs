//! Logging: one subscriber for the whole process, writing to stderr.
//!
//! stdout belongs to the commands that print results (`arcwright policy
//! eval`, `configmap`), so logs never go there. `arcwright run` chooses the
//! format and the level from its flags ([`LogOptions`]); the policy author's
//! commands keep the quiet default (warnings, or `RUST_LOG`), because their
//! output is what the user reads. Text lines are coloured only when stderr
//! is a terminal: in a file, a pipe or `kubectl logs`, ANSI escapes are
//! noise around every timestamp and level.

use std::io::IsTerminal;

use clap::{Args, ValueEnum};
use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines, for a terminal or `kubectl logs`.
    #[default]
    Text,
    /// One JSON object per line, for log collectors: the event's fields at
    /// the top level, the spans it happened in under `spans`.
    Json,
}

/// The logging flags of `arcwright run`.
#[derive(Clone, Debug, PartialEq, Eq, Args)]
pub struct LogOptions {
    /// Log line format.
    #[arg(long, env = "ARCWRIGHT_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Log level or filter directives (`info`, `arcwright=debug,kube=warn`).
    #[arg(
        long,
        env = "ARCWRIGHT_LOG_LEVEL",
        default_value = "info",
        value_name = "FILTER",
        value_parser = parse_filter
    )]
    pub log_level: String,
}

/// Refuses a filter `tracing_subscriber` would not understand, when the
/// flags are parsed rather than half-way through start-up.
fn parse_filter(text: &str) -> Result<String, String> {
    EnvFilter::try_new(text)
        .map(|_| text.to_owned())
        .map_err(|e| format!("not a log level or filter: {e}"))
}

/// Installs the process's subscriber: the run command's choice, or for the
/// other commands text at `RUST_LOG` (default `warn`).
pub fn init(options: Option<&LogOptions>) {
    let (format, filter) = match options {
        Some(LogOptions {
            log_format,
            log_level,
        }) => (
            *log_format,
            EnvFilter::try_new(log_level).unwrap_or_else(|_| EnvFilter::new("info")),
        ),
        None => (
            LogFormat::Text,
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")),
        ),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(coloured(format, std::io::stderr().is_terminal()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

/// Whether log lines carry ANSI colour: text lines written to a terminal,
/// nothing else (a JSON line is read by a machine; a file or a pipe is read
/// by someone who did not ask for escape codes).
fn coloured(format: LogFormat, terminal: bool) -> bool {
    format == LogFormat::Text && terminal
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_text_on_a_terminal_is_coloured() {
        assert!(coloured(LogFormat::Text, true));
        assert!(!coloured(LogFormat::Text, false), "a file or a pipe");
        assert!(!coloured(LogFormat::Json, true));
        assert!(!coloured(LogFormat::Json, false));
    }
}
