//! The bundled `buffered` scaling policy: ARC's formula plus a warm buffer
//! of idle runners on top of the jobs already assigned.
//!
//! ARC's `minRunners` is a fixed floor; it costs the same at 3 a.m. as at
//! peak and does not grow with load. A buffer proportional to the assigned
//! jobs (`idlePercent`) follows the load instead, and a fixed `idle` count
//! keeps a few runners warm when the load is small. The larger of the two
//! wins, so `{"idle": 2, "idlePercent": 20}` means "20 % headroom, but never
//! fewer than 2 spare runners".
//!
//! Settings: `idle` (runners, default 0) and `idlePercent` (percent of the
//! assigned jobs, rounded up, default 0). With neither, the policy is ARC's
//! formula exactly.
#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::format;
use alloc::string::String;
use arcwright_guest::Settings;
use exports::arcwright::policy::scaling::{Guest, ScalingDecision, ScalingInput};

wit_bindgen::generate!({ world: "scaling-policy", path: "../../wit" });

/// The settings this policy accepts.
const KEYS: &[&str] = &["idle", "idlePercent"];

/// Percentages above this are almost certainly a typo (10000 % is a
/// hundredfold over-provision); a cap keeps the product far from overflow.
const MAX_PERCENT: u32 = 10_000;

/// The headroom configuration.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Buffer {
    idle: u32,
    idle_percent: u32,
}

impl Buffer {
    fn parse(text: &str) -> Result<Self, String> {
        let settings = Settings::parse(text, KEYS)?;
        Ok(Self {
            idle: settings.u32_up_to("idle", u32::MAX)?.unwrap_or(0),
            idle_percent: settings.u32_up_to("idlePercent", MAX_PERCENT)?.unwrap_or(0),
        })
    }

    /// The spare runners wanted for `assigned` jobs.
    fn headroom(self, assigned: u32) -> u64 {
        let proportional = (u64::from(assigned) * u64::from(self.idle_percent)).div_ceil(100);
        proportional.max(u64::from(self.idle))
    }
}

/// The decision for an input and parsed settings, free of bindings so the
/// arithmetic reads on its own.
fn decide(min: u32, max: u32, assigned: u32, buffer: Buffer) -> (u32, String) {
    let headroom = buffer.headroom(assigned);
    let wanted = u64::from(min) + u64::from(assigned) + headroom;
    let desired = wanted.min(u64::from(max)) as u32;
    let source = if buffer.idle == 0 && buffer.idle_percent == 0 {
        String::from("no buffer configured")
    } else if headroom == u64::from(buffer.idle) && headroom > 0 {
        format!("idle {}", buffer.idle)
    } else {
        format!(
            "idlePercent {} of {} assigned jobs, rounded up",
            buffer.idle_percent, assigned
        )
    };
    let mut reason = format!(
        "minRunners {min} + assignedJobs {assigned} + buffer {headroom} ({source}) = {wanted}"
    );
    if wanted > u64::from(max) {
        reason.push_str(&format!(", capped at maxRunners {max}"));
    }
    (desired, reason)
}

struct Policy;

impl Guest for Policy {
    fn validate_settings(settings: String) -> Result<(), String> {
        Buffer::parse(&settings).map(drop)
    }

    fn decide(input: ScalingInput) -> Result<ScalingDecision, String> {
        let buffer = Buffer::parse(&input.settings)?;
        let (desired, reason) = decide(
            input.scale_set.min_runners,
            input.scale_set.max_runners,
            input.statistics.assigned_jobs,
            buffer,
        );
        Ok(ScalingDecision {
            desired,
            reason,
            state: None,
        })
    }
}

export!(Policy);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_larger_buffer_wins() {
        let buffer = Buffer {
            idle: 2,
            idle_percent: 20,
        };
        assert_eq!(buffer.headroom(5), 2);
        assert_eq!(buffer.headroom(11), 3);
        assert_eq!(buffer.headroom(100), 20);
    }

    #[test]
    fn huge_numbers_are_capped_not_wrapped() {
        let buffer = Buffer {
            idle: u32::MAX,
            idle_percent: MAX_PERCENT,
        };
        let (desired, reason) = decide(u32::MAX, u32::MAX, u32::MAX, buffer);
        assert_eq!(desired, u32::MAX);
        assert!(
            reason.ends_with("capped at maxRunners 4294967295"),
            "{reason}"
        );
    }

    #[test]
    fn settings_errors_name_the_key() {
        assert_eq!(
            Buffer::parse(r#"{"idlePercent": 20000}"#).unwrap_err(),
            "`idlePercent` must be from 0 to 10000, got 20000"
        );
    }
}
