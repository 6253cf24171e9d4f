//! Typed bindings of `wit/policy.wit` and the per-call host state.
//!
//! The three worlds share the `host` interface; it is generated once (with the
//! scaling world) and reused by the other two, so one `Linker` serves every
//! kind.

use wasmtime::ResourceLimiter;

pub(crate) mod scaling {
    wasmtime::component::bindgen!({
        world: "scaling-policy",
        path: "../wit",
    });
}

pub(crate) mod deregistration {
    wasmtime::component::bindgen!({
        world: "deregistration-policy",
        path: "../wit",
        with: { "arcwright:policy/host": super::scaling::arcwright::policy::host },
    });
}

pub(crate) mod pod_validation {
    wasmtime::component::bindgen!({
        world: "pod-validation-policy",
        path: "../wit",
        with: { "arcwright:policy/host": super::scaling::arcwright::policy::host },
    });
}

use scaling::arcwright::policy::host::{Host, LogLevel};

/// The longest log line a policy can write; the rest is cut.
const MAX_LOG_LINE: usize = 1024;

/// How many lines one call may log. A policy that logs in a loop would
/// otherwise turn the controller's log into its own, and cost a host call
/// per line on the decision path.
const MAX_LOG_LINES_PER_CALL: u32 = 16;

/// What a `Store` carries for one call: the limits and the log budget.
pub(crate) struct HostState {
    /// The policy's label, attached to its log lines.
    pub(crate) policy: String,
    /// The memory cap of this call, in bytes.
    pub(crate) memory_limit: usize,
    /// Set when the guest asked for more memory than `memory_limit`, so the
    /// resulting error is reported as a memory overrun rather than a trap.
    pub(crate) memory_denied: Option<usize>,
    /// Lines logged so far in this call.
    pub(crate) lines_logged: u32,
}

impl HostState {
    pub(crate) fn new(policy: String, memory_limit: usize) -> Self {
        Self {
            policy,
            memory_limit,
            memory_denied: None,
            lines_logged: 0,
        }
    }
}

impl ResourceLimiter for HostState {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory_limit {
            self.memory_denied = Some(desired);
            // An error (not `Ok(false)`) traps at once: a Rust guest whose
            // allocation fails aborts anyway, and this way the failure is
            // reported as what it is.
            wasmtime::bail!(
                "policy memory limit of {} bytes exceeded (asked for {desired})",
                self.memory_limit
            );
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // Tables hold function references; a policy needs a few hundred.
        Ok(desired <= 100_000)
    }

    fn instances(&self) -> usize {
        // A no_std policy is one core instance; allow the adapter-shaped
        // layouts some toolchains produce, nothing more.
        4
    }

    fn tables(&self) -> usize {
        4
    }

    fn memories(&self) -> usize {
        2
    }
}

impl Host for HostState {
    fn log(&mut self, level: LogLevel, message: String) {
        self.lines_logged = self.lines_logged.saturating_add(1);
        if self.lines_logged > MAX_LOG_LINES_PER_CALL {
            if self.lines_logged == MAX_LOG_LINES_PER_CALL + 1 {
                tracing::warn!(policy = %self.policy, "policy logged more than {MAX_LOG_LINES_PER_CALL} lines in one call; the rest are dropped");
            }
            return;
        }
        let message = clip(message);
        let policy = self.policy.as_str();
        match level {
            LogLevel::Debug => tracing::debug!(policy, "{message}"),
            LogLevel::Info => tracing::info!(policy, "{message}"),
            LogLevel::Warn => tracing::warn!(policy, "{message}"),
            LogLevel::Error => tracing::error!(policy, "{message}"),
        }
    }
}

/// Cuts a log line to [`MAX_LOG_LINE`] bytes on a character boundary, and
/// turns control characters into spaces: a policy writes one line, and a
/// newline in it could otherwise forge a log line that seems to come from the
/// controller.
fn clip(message: String) -> String {
    let mut message = if message.chars().any(char::is_control) {
        message.replace(|c: char| c.is_control(), " ")
    } else {
        message
    };
    if message.len() > MAX_LOG_LINE {
        let mut cut = MAX_LOG_LINE;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
        message.push_str("...");
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_cannot_start_a_new_log_line() {
        assert_eq!(
            clip("ok\nERROR controller: forged\r\x1b[31m".into()),
            "ok ERROR controller: forged  [31m"
        );
    }

    #[test]
    fn long_lines_are_cut_on_a_character_boundary() {
        assert_eq!(clip("short".into()), "short");
        let clipped = clip("é".repeat(MAX_LOG_LINE));
        assert!(clipped.len() <= MAX_LOG_LINE + 3);
        assert!(clipped.ends_with("é..."));
    }

    #[test]
    fn chatty_policies_are_counted_per_call() {
        let mut state = HostState::new("p".into(), 1 << 20);
        for _ in 0..MAX_LOG_LINES_PER_CALL + 5 {
            state.log(LogLevel::Info, "line".into());
        }
        assert_eq!(state.lines_logged, MAX_LOG_LINES_PER_CALL + 5);
    }

    #[test]
    fn memory_above_the_cap_is_denied_and_remembered() {
        let mut state = HostState::new("p".into(), 1 << 20);
        assert!(state.memory_growing(0, 1 << 20, None).unwrap());
        assert!(state.memory_growing(0, (1 << 20) + 1, None).is_err());
        assert_eq!(state.memory_denied, Some((1 << 20) + 1));
    }
}
