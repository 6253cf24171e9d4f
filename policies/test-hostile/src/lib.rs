//! A scaling policy that misbehaves on request, for testing the sandbox.
//!
//! `{"misbehave": "..."}` in the settings chooses what goes wrong:
//!
//! | value | what it does | what the host must do |
//! |---|---|---|
//! | `spin` | loops forever | interrupt it at the deadline |
//! | `memory-bomb` | allocates until memory runs out | refuse growth at the cap; the guest traps |
//! | `panic` | panics | treat the trap as a failed decision |
//! | `huge-output` | returns a 4 MiB reason | refuse output over its caps |
//! | `huge-state` | returns a 1 MiB state blob | refuse state over 64 KiB |
//! | `bad-desired` | returns `desired = u32::MAX` | clamp to maxRunners |
//! | `log-flood` | logs 10 000 lines (the first 8 KiB long), then answers normally | truncate and rate-limit |
//! | `error` | returns `Err` | fall back, report the message |
//!
//! Without settings it answers with ARC's formula, so the same component
//! can first be shown to work. `validate-settings` accepts anything: the
//! point is to reach `decide`.
#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::format;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;
use arcwright::policy::host::{LogLevel, log};
use arcwright_guest::scaling::Demand;
use exports::arcwright::policy::scaling::{Guest, ScalingDecision, ScalingInput};
use serde_json::Value;

wit_bindgen::generate!({ world: "scaling-policy", path: "../../wit" });

struct Policy;

impl Guest for Policy {
    fn validate_settings(_settings: String) -> Result<(), String> {
        Ok(())
    }

    fn decide(input: ScalingInput) -> Result<ScalingDecision, String> {
        let settings: Value = serde_json::from_str(&input.settings).unwrap_or(Value::Null);
        let misbehave = settings
            .get("misbehave")
            .and_then(Value::as_str)
            .unwrap_or("");
        let demand = Demand::new(
            input.scale_set.min_runners,
            input.statistics.assigned_jobs,
            input.scale_set.max_runners,
        );
        let mut decision = ScalingDecision {
            desired: demand.desired,
            reason: demand.explain(),
            state: None,
        };
        match misbehave {
            "spin" => {
                let mut counter = 0u64;
                loop {
                    // Volatile so the loop cannot be proven side-effect free.
                    unsafe { core::ptr::write_volatile(&mut counter, counter.wrapping_add(1)) };
                }
            }
            "memory-bomb" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    // Touch every page, so that the memory is really used.
                    hoard.push(vec![0x5a; 1 << 20]);
                }
            }
            "panic" => panic!("asked to panic"),
            "huge-output" => decision.reason = "x".repeat(4 << 20),
            "huge-state" => decision.state = Some(vec![b's'; 1 << 20]),
            "bad-desired" => decision.desired = u32::MAX,
            "log-flood" => {
                // The first line is 8 KiB, far over the host's line limit.
                log(
                    LogLevel::Warn,
                    &format!("flood line 0 {}", "x".repeat(8 << 10)),
                );
                for line in 1..10_000 {
                    log(LogLevel::Warn, &format!("flood line {line}"));
                }
            }
            "error" => return Err(String::from("asked to fail")),
            _ => {}
        }
        Ok(decision)
    }
}

export!(Policy);
