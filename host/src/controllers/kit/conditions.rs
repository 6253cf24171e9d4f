//! Setting a status condition, the one way every controller does it.
//!
//! A condition's `lastTransitionTime` moves only when its status does: a
//! reason or message changing is not a transition, and a dashboard that
//! shows "False for 3h" must not be reset by a retry's new message. The
//! time is the caller's `now`, never read here, so a plan that sets
//! conditions stays a pure function of what it observed.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// What a condition is set to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Setting<'a> {
    /// Its type (`Registered`, `PodTemplateAccepted`...).
    pub type_: &'a str,
    /// True or False.
    pub status: bool,
    /// A PascalCase reason.
    pub reason: &'a str,
    /// For people.
    pub message: &'a str,
    /// The object's generation it was decided on, where that means
    /// something (a spec's verdict); `None` for what is not about the spec.
    pub observed_generation: Option<i64>,
}

/// Sets a condition in `conditions` as of `now`; returns whether anything
/// changed (an unchanged condition is not worth a write).
pub fn set(conditions: &mut Vec<Condition>, setting: Setting<'_>, now: Timestamp) -> bool {
    let status = if setting.status { "True" } else { "False" };
    if let Some(existing) = conditions.iter_mut().find(|c| c.type_ == setting.type_) {
        if existing.status == status
            && existing.reason == setting.reason
            && existing.message == setting.message
            && existing.observed_generation == setting.observed_generation
        {
            return false;
        }
        if existing.status != status {
            existing.last_transition_time = Time(now);
        }
        existing.status = status.to_owned();
        existing.reason = setting.reason.to_owned();
        existing.message = setting.message.to_owned();
        existing.observed_generation = setting.observed_generation;
    } else {
        conditions.push(Condition {
            type_: setting.type_.to_owned(),
            status: status.to_owned(),
            reason: setting.reason.to_owned(),
            message: setting.message.to_owned(),
            last_transition_time: Time(now),
            observed_generation: setting.observed_generation,
        });
    }
    true
}

/// Whether the condition of `type_` is True (`Some(true)`), False
/// (`Some(false)`), or not set (`None`).
pub fn is_true(conditions: &[Condition], type_: &str) -> Option<bool> {
    conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn registered<'a>(status: bool, reason: &'a str, message: &'a str) -> Setting<'a> {
        Setting {
            type_: "Registered",
            status,
            reason,
            message,
            observed_generation: None,
        }
    }

    #[test]
    fn the_transition_time_moves_with_the_status_only() {
        let mut conditions = Vec::new();
        assert!(set(
            &mut conditions,
            registered(true, "JitConfigCreated", "as 1"),
            at(0)
        ));
        assert!(!set(
            &mut conditions,
            registered(true, "JitConfigCreated", "as 1"),
            at(5)
        ));
        assert!(set(
            &mut conditions,
            registered(true, "RemoveNow", "removing 1"),
            at(10)
        ));
        assert_eq!(conditions[0].last_transition_time, Time(at(0)));
        assert_eq!(conditions[0].reason, "RemoveNow");
        assert!(set(
            &mut conditions,
            registered(false, "Removed", "gone"),
            at(20)
        ));
        assert_eq!(conditions[0].last_transition_time, Time(at(20)));
        assert_eq!(conditions.len(), 1);
        assert_eq!(is_true(&conditions, "Registered"), Some(false));
        assert_eq!(is_true(&conditions, "RunnerOnline"), None);
    }

    #[test]
    fn a_new_observed_generation_is_a_change() {
        let mut conditions = Vec::new();
        let accepted = |generation| Setting {
            type_: "PodTemplateAccepted",
            status: true,
            reason: "Accepted",
            message: "ok",
            observed_generation: Some(generation),
        };
        assert!(set(&mut conditions, accepted(1), at(0)));
        assert!(set(&mut conditions, accepted(2), at(1)));
        assert_eq!(conditions[0].observed_generation, Some(2));
        assert_eq!(conditions[0].last_transition_time, Time(at(0)));
    }
}
