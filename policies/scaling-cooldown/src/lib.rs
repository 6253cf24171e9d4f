//! The bundled `cooldown` scaling policy: scale up at once, scale down only
//! after demand has stayed lower for a while.
//!
//! ARC's formula follows the job count exactly, so a burst of short jobs
//! makes the scale set shrink the moment they finish and grow again for the
//! next burst, and every runner created pays a pod start and a registration.
//! This policy keeps the runners through short lulls: it holds the current
//! count until ARC's formula (the *demand*) has been below it for
//! `scaleDownAfterSeconds` (default 300), then scales down to the highest
//! demand seen in that time, the same stabilisation Kubernetes' HPA applies
//! to scale-downs. Scale-ups are never delayed: a queued job waiting for a
//! runner costs more than an idle runner.
//!
//! The memory of "lower since when, and how high it got" lives in the state
//! blob the host hands back on the next call, as JSON text:
//! `{"lowerSince":1796029200,"peak":3}`. The host keeps it in memory only; a
//! restart loses it and the cooldown simply starts again, which errs towards
//! keeping runners.
#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use arcwright_guest::Settings;
use arcwright_guest::scaling::Demand;
use exports::arcwright::policy::scaling::{Guest, ScalingDecision, ScalingInput};

wit_bindgen::generate!({ world: "scaling-policy", path: "../../wit" });

const KEYS: &[&str] = &["scaleDownAfterSeconds"];
const DEFAULT_SCALE_DOWN_AFTER: u32 = 300;
/// A week. Longer than that, the state blob (lost on every restart) could
/// not be relied on to ever reach it.
const MAX_SCALE_DOWN_AFTER: u32 = 7 * 24 * 3600;

fn parse_settings(text: &str) -> Result<u32, String> {
    let settings = Settings::parse(text, KEYS)?;
    Ok(settings
        .u32_up_to("scaleDownAfterSeconds", MAX_SCALE_DOWN_AFTER)?
        .unwrap_or(DEFAULT_SCALE_DOWN_AFTER))
}

/// A lull in progress: demand has been below the current count since
/// `since`, and `peak` is the highest it has been in that time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Lull {
    since: i64,
    peak: u32,
}

impl Lull {
    /// Reads the state blob. Anything unreadable (another policy's state
    /// after a swap, a truncated blob) is `None`: the cooldown restarts,
    /// which keeps runners longer rather than dropping them early.
    fn read(state: Option<&[u8]>) -> Option<Self> {
        let value = arcwright_guest::json::parse("state", state?).ok()?;
        Some(Self {
            since: value.get("lowerSince")?.as_i64()?,
            peak: u32::try_from(value.get("peak")?.as_u64()?).ok()?,
        })
    }

    fn write(self) -> Vec<u8> {
        format!("{{\"lowerSince\":{},\"peak\":{}}}", self.since, self.peak).into_bytes()
    }
}

fn decide(input: &ScalingInput, scale_down_after: u32) -> ScalingDecision {
    let set = &input.scale_set;
    let demand = Demand::new(
        set.min_runners,
        input.statistics.assigned_jobs,
        set.max_runners,
    );
    let now = input.now_unix_seconds;
    // A lowered maxRunners takes effect at once; holding above the cap
    // would only be clamped by the host anyway.
    let hold = input.current_desired.min(set.max_runners);

    if demand.desired >= hold {
        let reason = if demand.desired > input.current_desired {
            format!("scaling up at once: {}", demand.explain())
        } else if demand.desired == input.current_desired {
            format!("demand matches: {}", demand.explain())
        } else {
            format!(
                "maxRunners {} is below the current {}: {}",
                set.max_runners,
                input.current_desired,
                demand.explain()
            )
        };
        return ScalingDecision {
            desired: demand.desired,
            reason,
            state: None,
        };
    }

    let previous = Lull::read(input.state.as_deref()).filter(|lull| lull.since <= now);
    let lull = match previous {
        Some(lull) => Lull {
            since: lull.since,
            peak: lull.peak.max(demand.desired).min(hold),
        },
        None => Lull {
            since: now,
            peak: demand.desired,
        },
    };
    let lower_for = now.saturating_sub(lull.since);
    if lower_for >= i64::from(scale_down_after) {
        // Down to the highest demand of the lull, never below the formula.
        let desired = lull.peak;
        let next = (demand.desired < desired).then(|| {
            Lull {
                since: now,
                peak: demand.desired,
            }
            .write()
        });
        return ScalingDecision {
            desired,
            reason: format!(
                "scaling down from {hold} to {desired}, the highest demand of the last {lower_for}s \
                 (scaleDownAfterSeconds {scale_down_after}); now {}",
                demand.explain()
            ),
            state: next,
        };
    }
    ScalingDecision {
        desired: hold,
        reason: format!(
            "holding {hold}: demand has been lower for {lower_for}s of {scale_down_after}s \
             (highest {}); now {}",
            lull.peak,
            demand.explain()
        ),
        state: Some(lull.write()),
    }
}

struct Policy;

impl Guest for Policy {
    fn validate_settings(settings: String) -> Result<(), String> {
        parse_settings(&settings).map(drop)
    }

    fn decide(input: ScalingInput) -> Result<ScalingDecision, String> {
        let scale_down_after = parse_settings(&input.settings)?;
        Ok(decide(&input, scale_down_after))
    }
}

export!(Policy);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_round_trips_and_garbage_reads_as_none() {
        let lull = Lull { since: -5, peak: 7 };
        assert_eq!(Lull::read(Some(&lull.write())), Some(lull));
        assert_eq!(Lull::read(Some(b"not json")), None);
        assert_eq!(Lull::read(Some(br#"{"lowerSince":1,"peak":-1}"#)), None);
        assert_eq!(Lull::read(None), None);
    }
}
