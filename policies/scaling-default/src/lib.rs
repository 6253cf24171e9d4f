//! The bundled `default` scaling policy: ARC's formula,
//! `min(minRunners + assignedJobs, maxRunners)`.
//!
//! This is what a scale set gets when it names no policy, and what every
//! scaling decision falls back to when a custom policy fails, so it is kept
//! to exactly ARC's behaviour: a manifest moved over from ARC scales the same
//! way. It ignores the runner counts and the current replica count on purpose;
//! the formula is stateless, so a lost message or a restart cannot leave it
//! in a wrong mode.
#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use arcwright_guest::Settings;
use arcwright_guest::scaling::Demand;
use exports::arcwright::policy::scaling::{Guest, ScalingDecision, ScalingInput};

wit_bindgen::generate!({ world: "scaling-policy", path: "../../wit" });

struct Policy;

impl Guest for Policy {
    fn validate_settings(settings: alloc::string::String) -> Result<(), alloc::string::String> {
        Settings::none(&settings)
    }

    fn decide(input: ScalingInput) -> Result<ScalingDecision, alloc::string::String> {
        Settings::none(&input.settings)?;
        let demand = Demand::new(
            input.scale_set.min_runners,
            input.statistics.assigned_jobs,
            input.scale_set.max_runners,
        );
        Ok(ScalingDecision {
            desired: demand.desired,
            reason: demand.explain(),
            state: None,
        })
    }
}

export!(Policy);
