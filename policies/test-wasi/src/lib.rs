//! A scaling policy built with the standard library that reads the
//! filesystem. Built for `wasm32-wasip2`, the component imports
//! `wasi:filesystem` (and the rest of WASI); the controller must refuse to
//! load it, naming the import, rather than link WASI or let the call trap
//! at decision time.

use exports::arcwright::policy::scaling::{Guest, ScalingDecision, ScalingInput};

wit_bindgen::generate!({ world: "scaling-policy", path: "../../wit" });

struct Policy;

impl Guest for Policy {
    fn validate_settings(_settings: String) -> Result<(), String> {
        Ok(())
    }

    fn decide(_input: ScalingInput) -> Result<ScalingDecision, String> {
        let entries = std::fs::read_dir("/").map(|dir| dir.count()).unwrap_or(0);
        Ok(ScalingDecision {
            desired: u32::try_from(entries).unwrap_or(u32::MAX),
            reason: format!("found {entries} entries in /"),
            state: None,
        })
    }
}

export!(Policy);
