//! A scaling policy to copy: ARC's formula, rounded up to whole batches.
//!
//! Why batches: when runner pods are sized so that a fixed number fit on a
//! node, asking for 5 runners on 4-runner nodes pays for a second node and
//! uses a quarter of it. Rounding up to a multiple of the batch uses the
//! node that is paid for anyway. Settings: `{"batch": 4}` (default 1, which
//! makes this exactly ARC's formula).
//!
//! To write your own policy, copy this directory, rename the package in
//! `Cargo.toml`, and change `decide` and `Batch::parse`, and the cases of
//! `tests/policy.yaml` with them (as copied, they pass). Everything the
//! policy may look at is in its input: there is no clock, filesystem or
//! network, and the only thing it can ask of the controller is a log line.
//! The walk-through is the policy author's guide, `docs/policies.md`.

// No standard library on wasm: the component then imports nothing, which is
// what the controller requires. `arcwright-guest` provides the allocator,
// the panic handler and the memory hooks the component model needs. On the
// host architecture the crate is ordinary Rust, so `cargo test` runs the
// unit tests natively.
#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::format;
use alloc::string::String;
use arcwright::policy::host::{LogLevel, log};
use arcwright_guest::Settings;
use arcwright_guest::scaling::Demand;
use exports::arcwright::policy::scaling::{Guest, ScalingDecision, ScalingInput};

// Generates the Rust types of the WIT contract (`ScalingInput`,
// `ScalingDecision`, the `log` import) and the `Guest` trait to implement.
// The world decides the kind of policy: `scaling-policy`,
// `deregistration-policy` or `pod-validation-policy`.
wit_bindgen::generate!({ world: "scaling-policy", path: "../../wit" });

/// The settings keys this policy accepts. Anything else is rejected, so a
/// typo shows up when the admin applies the settings, not as a policy that
/// silently ignores them.
const KEYS: &[&str] = &["batch"];

/// A batch larger than this is certainly a mistake, and the bound keeps the
/// arithmetic well inside 64 bits.
const MAX_BATCH: i64 = 1_000;

/// Parsed settings. Parse into a type once and use the type, so that a
/// setting cannot be valid in `validate_settings` and invalid in `decide`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Batch(u32);

impl Batch {
    fn parse(text: &str) -> Result<Self, String> {
        let settings = Settings::parse(text, KEYS)?;
        // Absent means 1: every runner count is a whole batch.
        let batch = settings.i64_between("batch", 1, MAX_BATCH)?.unwrap_or(1);
        Ok(Self(batch as u32))
    }
}

/// The decision itself: a pure function of the input, with no bindings in
/// the way, so it is easy to read and to unit-test.
fn decide(input: &ScalingInput, batch: Batch) -> ScalingDecision {
    let set = &input.scale_set;
    let demand = Demand::new(
        set.min_runners,
        input.statistics.assigned_jobs,
        set.max_runners,
    );
    let rounded = u64::from(demand.desired).div_ceil(u64::from(batch.0)) * u64::from(batch.0);
    // The cap is the admin's hard limit and always wins over rounding.
    let desired = rounded.min(u64::from(set.max_runners)) as u32;
    ScalingDecision {
        desired,
        // The reason is shown in the scale set's status and events: say
        // which numbers led to the answer.
        reason: format!(
            "{}, rounded up to a multiple of {} = {desired}",
            demand.explain(),
            batch.0
        ),
        // This policy remembers nothing between calls. A policy that needs
        // memory returns bytes here and gets them back as `input.state`.
        state: None,
    }
}

struct Policy;

impl Guest for Policy {
    /// Called when an admin applies settings, before they are ever used:
    /// an error here is shown on the scale set and the settings are refused.
    fn validate_settings(settings: String) -> Result<(), String> {
        Batch::parse(&settings).map(drop)
    }

    /// Called for every scaling decision, on a fresh instance each time.
    /// An `Err`, a trap or running over the time or memory limit makes the
    /// controller use the bundled default policy for this decision instead.
    fn decide(input: ScalingInput) -> Result<ScalingDecision, String> {
        let batch = Batch::parse(&input.settings)?;
        let decision = decide(&input, batch);
        let set = &input.scale_set;
        if set.max_runners > 0 && decision.desired == set.max_runners {
            // Logging costs a call into the host, which also rate-limits
            // it; keep it for what an operator would want to see in the
            // controller's log (the decision and its reason are recorded
            // anyway).
            log(
                LogLevel::Info,
                &format!(
                    "{}/{} is at maxRunners {}: further jobs wait for a free runner",
                    set.namespace, set.name, set.max_runners
                ),
            );
        }
        Ok(decision)
    }
}

export!(Policy);

#[cfg(test)]
mod tests {
    use super::*;
    use exports::arcwright::policy::scaling::{JobStatistics, RunnerCounts, ScaleSet};

    fn input(min: u32, max: u32, assigned: u32) -> ScalingInput {
        ScalingInput {
            scale_set: ScaleSet {
                name: "linux".into(),
                namespace: "ci".into(),
                min_runners: min,
                max_runners: max,
                labels: alloc::vec!["linux".into()],
            },
            statistics: JobStatistics {
                available_jobs: 0,
                acquired_jobs: 0,
                assigned_jobs: assigned,
                running_jobs: 0,
                registered_runners: 0,
                busy_runners: 0,
                idle_runners: 0,
            },
            runners: RunnerCounts {
                pending: 0,
                running: 0,
                busy: 0,
                succeeded: 0,
                failed: 0,
                outdated: 0,
                deleting: 0,
            },
            current_desired: 0,
            now_unix_seconds: 0,
            settings: String::new(),
            state: None,
        }
    }

    #[test]
    fn rounds_up_to_whole_batches() {
        assert_eq!(decide(&input(0, 100, 5), Batch(4)).desired, 8);
        assert_eq!(decide(&input(0, 100, 8), Batch(4)).desired, 8);
        assert_eq!(decide(&input(0, 100, 0), Batch(4)).desired, 0);
    }

    #[test]
    fn the_cap_wins_over_rounding() {
        assert_eq!(decide(&input(0, 6, 5), Batch(4)).desired, 6);
    }

    #[test]
    fn a_batch_of_zero_is_refused() {
        assert_eq!(
            Batch::parse(r#"{"batch": 0}"#),
            Err("`batch` must be from 1 to 1000, got 0".into())
        );
        assert_eq!(Batch::parse(""), Ok(Batch(1)));
    }
}
