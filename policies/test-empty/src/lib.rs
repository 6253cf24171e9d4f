//! The cheapest possible scaling policy: a constant answer that does not
//! read its input. Benchmarks measure other policies against it, so the
//! figure they report is the cost of the policy's own work, not of the
//! sandbox around it.
#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::string::String;
// Linked for its allocator, panic handler and `cabi_realloc` only.
use arcwright_guest as _;
use exports::arcwright::policy::scaling::{Guest, ScalingDecision, ScalingInput};

wit_bindgen::generate!({ world: "scaling-policy", path: "../../wit" });

struct Policy;

impl Guest for Policy {
    fn validate_settings(_settings: String) -> Result<(), String> {
        Ok(())
    }

    fn decide(_input: ScalingInput) -> Result<ScalingDecision, String> {
        Ok(ScalingDecision {
            desired: 1,
            reason: String::from("constant"),
            state: None,
        })
    }
}

export!(Policy);
