//! The debug hold's arithmetic, with no I/O: what the declared settings
//! mean, when a hold ends, how far an extension may move it, and what
//! people are told of a held runner.
//!
//! Every path that changes a hold (the `arcwright.dev/hold-until`
//! annotation written by hand, the Slack button, the hold API) goes through
//! [`Hold::deadline`] in the runner's reconciler, so the cap is enforced in
//! one place: an annotation past it is read as the cap, not refused, since
//! `kubectl annotate` cannot be told no after the fact.
//!
//! It lives beside the EphemeralRunner's types, below the controllers and
//! the debugging conveniences, because both read it: the reconciler's pure
//! plan decides holds with it, and `crate::debug` and `crate::slack` change
//! and tell them with it (they re-export it as `crate::debug::hold`).

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};

use crate::api::DebugSpec;

/// The annotation on an EphemeralRunner that moves its hold's end.
pub use crate::api::annotations::HOLD_UNTIL as HOLD_UNTIL_ANNOTATION;

/// A runner held after its job failed, as Slack is told of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldFailure {
    /// The runner's namespace.
    pub namespace: String,
    /// The EphemeralRunner (and its pod's) name.
    pub runner: String,
    /// `owner/repo` of the job, when the listener recorded it.
    pub repository: Option<String>,
    /// The workflow reference, when recorded.
    pub workflow: Option<String>,
    /// The job's display name, when recorded.
    pub job: Option<String>,
    /// Why the runner is held (`the job failed`, `the runner exited 137`).
    pub why: String,
    /// When the hold ends.
    pub hold_until: Timestamp,
}

/// How many runners of a scale set are held at once when `maxHeld` is not
/// given; see [`DebugSpec::max_held`].
pub const DEFAULT_MAX_HELD: u32 = 5;

/// A debug spec that cannot be followed; the message names the field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DebugSpecError {
    /// Not a duration.
    #[error("`{field}` must be a duration like 30m or 1h30m, got {value:?}")]
    Duration {
        /// The field.
        field: &'static str,
        /// What it held.
        value: String,
    },
    /// Zero or negative.
    #[error("`{field}` must be longer than zero, got {value:?}")]
    NotPositive {
        /// The field.
        field: &'static str,
        /// What it held.
        value: String,
    },
    /// A cap below the hold itself.
    #[error("`maxHold` ({max_hold}) must not be shorter than `holdFailedFor` ({hold_for})")]
    CapBelowHold {
        /// `holdFailedFor` as written.
        hold_for: String,
        /// `maxHold` as written.
        max_hold: String,
    },
    /// A negative count.
    #[error("`maxHeld` must not be negative, got {0}")]
    NegativeMaxHeld(i32),
}

/// Parses a positive duration (`30m`, `1h30m`, `90s`; jiff's friendly
/// format, so `2 hours` is read too).
pub fn parse_duration(field: &'static str, value: &str) -> Result<Duration, DebugSpecError> {
    let signed: SignedDuration = value.trim().parse().map_err(|_| DebugSpecError::Duration {
        field,
        value: value.to_string(),
    })?;
    match Duration::try_from(signed) {
        Ok(d) if !d.is_zero() => Ok(d),
        _ => Err(DebugSpecError::NotPositive {
            field,
            value: value.to_string(),
        }),
    }
}

/// The debug settings of a runner, parsed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hold {
    /// How long a failed runner is held after its job ended.
    pub hold_for: Duration,
    /// The latest end of a hold, counted from the job's end.
    pub max_hold: Duration,
    /// Held runners per scale set at most.
    pub max_held: u32,
}

/// When a hold ends, and why an annotation was not followed, if it was not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Deadline {
    /// The end.
    pub at: Timestamp,
    /// Why the annotation was ignored or cut to the cap, for the status
    /// message; `None` when it was followed or absent.
    pub note: Option<String>,
}

impl Hold {
    /// The hold `spec` declares; `None` when it declares none (no spec, or
    /// no `holdFailedFor`).
    pub fn from_spec(spec: Option<&DebugSpec>) -> Result<Option<Hold>, DebugSpecError> {
        let Some(spec) = spec else { return Ok(None) };
        let Some(hold_text) = spec.hold_failed_for.as_deref() else {
            return Ok(None);
        };
        let hold_for = parse_duration("holdFailedFor", hold_text)?;
        let max_hold = match spec.max_hold.as_deref() {
            Some(text) => parse_duration("maxHold", text)?,
            None => hold_for,
        };
        if max_hold < hold_for {
            return Err(DebugSpecError::CapBelowHold {
                hold_for: hold_text.to_string(),
                max_hold: spec.max_hold.clone().unwrap_or_default(),
            });
        }
        let max_held = match spec.max_held {
            None => DEFAULT_MAX_HELD,
            Some(n) => u32::try_from(n).map_err(|_| DebugSpecError::NegativeMaxHeld(n))?,
        };
        Ok(Some(Hold {
            hold_for,
            max_hold,
            max_held,
        }))
    }

    /// The latest a hold counted from `since` may end.
    pub fn cap(&self, since: Timestamp) -> Timestamp {
        add(since, self.max_hold)
    }

    /// When a hold counted from `since` ends: the annotation's time if it
    /// has a readable one (earlier than the default too: that is a release),
    /// never past the cap; otherwise `holdFailedFor` after `since`.
    pub fn deadline(&self, since: Timestamp, annotation: Option<&str>) -> Deadline {
        let cap = self.cap(since);
        let default = add(since, self.hold_for).min(cap);
        let Some(text) = annotation else {
            return Deadline {
                at: default,
                note: None,
            };
        };
        match text.trim().parse::<Timestamp>() {
            Ok(asked) if asked > cap => Deadline {
                at: cap,
                note: Some(format!(
                    "{HOLD_UNTIL_ANNOTATION} {text} is past the cap (maxHold after the job's end); held until {cap}"
                )),
            },
            Ok(asked) => Deadline {
                at: asked,
                note: None,
            },
            Err(_) => Deadline {
                at: default,
                note: Some(format!(
                    "{HOLD_UNTIL_ANNOTATION} {text:?} is not an RFC 3339 time (2026-12-01T10:00:00Z); ignored"
                )),
            },
        }
    }

    /// The end of a hold that ends at `current`, extended by `by` (from now
    /// if it had ended already), capped.
    pub fn extended(
        &self,
        since: Timestamp,
        current: Timestamp,
        by: Duration,
        now: Timestamp,
    ) -> Timestamp {
        add(current.max(now), by).min(self.cap(since))
    }
}

/// `at + by`, saturating at the end of time rather than failing: a cap of
/// years is silly but not an error worth a crash.
fn add(at: Timestamp, by: Duration) -> Timestamp {
    SignedDuration::try_from(by)
        .ok()
        .and_then(|by| at.checked_add(by).ok())
        .unwrap_or(Timestamp::MAX)
}

/// The annotation value for `at`, to the second.
pub fn format_hold_until(at: Timestamp) -> String {
    at.round(jiff::Unit::Second).unwrap_or(at).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn spec(hold: Option<&str>, max: Option<&str>, held: Option<i32>) -> DebugSpec {
        DebugSpec {
            hold_failed_for: hold.map(String::from),
            max_hold: max.map(String::from),
            max_held: held,
            slack: None,
        }
    }

    #[test]
    fn settings_parse_or_say_what_is_wrong() {
        let rows: Vec<(DebugSpec, Result<Option<Hold>, &str>)> = vec![
            (spec(None, Some("1h"), None), Ok(None)),
            (
                spec(Some("30m"), None, None),
                Ok(Some(Hold {
                    hold_for: Duration::from_secs(1800),
                    max_hold: Duration::from_secs(1800),
                    max_held: DEFAULT_MAX_HELD,
                })),
            ),
            (
                spec(Some("1h30m"), Some("4h"), Some(0)),
                Ok(Some(Hold {
                    hold_for: Duration::from_secs(5400),
                    max_hold: Duration::from_secs(14400),
                    max_held: 0,
                })),
            ),
            (
                spec(Some("30 mins"), None, None),
                Ok(Some(Hold {
                    hold_for: Duration::from_secs(1800),
                    max_hold: Duration::from_secs(1800),
                    max_held: DEFAULT_MAX_HELD,
                })),
            ),
            (
                spec(Some("half an hour"), None, None),
                Err("`holdFailedFor` must be a duration like 30m or 1h30m, got \"half an hour\""),
            ),
            (
                spec(Some("0s"), None, None),
                Err("`holdFailedFor` must be longer than zero"),
            ),
            (
                spec(Some("-5m"), None, None),
                Err("`holdFailedFor` must be longer than zero"),
            ),
            (
                spec(Some("1h"), Some("30m"), None),
                Err("`maxHold` (30m) must not be shorter than `holdFailedFor` (1h)"),
            ),
            (
                spec(Some("1h"), Some("2x"), None),
                Err("`maxHold` must be a duration"),
            ),
            (
                spec(Some("1h"), None, Some(-1)),
                Err("`maxHeld` must not be negative, got -1"),
            ),
        ];
        for (spec, expected) in rows {
            let got = Hold::from_spec(Some(&spec));
            match (got, expected) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{spec:?}"),
                (Err(got), Err(want)) => {
                    assert!(got.to_string().contains(want), "{spec:?}: {got}")
                }
                (got, want) => panic!("{spec:?}: got {got:?}, want {want:?}"),
            }
        }
        assert_eq!(Hold::from_spec(None), Ok(None));
    }

    #[test]
    fn the_deadline_follows_the_annotation_within_the_cap() {
        let hold = Hold {
            hold_for: Duration::from_secs(600),
            max_hold: Duration::from_secs(3600),
            max_held: 1,
        };
        let rows: Vec<(&str, Option<String>, Timestamp, bool)> = vec![
            ("no annotation: holdFailedFor", None, at(600), false),
            (
                "an extension within the cap",
                Some(at(1800).to_string()),
                at(1800),
                false,
            ),
            (
                "an extension past the cap stops at it",
                Some(at(9999).to_string()),
                at(3600),
                true,
            ),
            (
                "an earlier time releases early",
                Some(at(5).to_string()),
                at(5),
                false,
            ),
            (
                "an unreadable annotation is ignored",
                Some("tomorrow".into()),
                at(600),
                true,
            ),
            (
                "an offset is read",
                Some("2027-01-15T09:20:00+01:00".into()),
                "2027-01-15T08:20:00Z".parse().unwrap(),
                false,
            ),
        ];
        for (name, annotation, want, noted) in rows {
            let since = if name == "an offset is read" {
                "2027-01-15T08:00:00Z".parse().unwrap()
            } else {
                at(0)
            };
            let got = hold.deadline(since, annotation.as_deref());
            assert_eq!(got.at, want, "{name}");
            assert_eq!(got.note.is_some(), noted, "{name}: {:?}", got.note);
        }
    }

    #[test]
    fn extending_adds_to_the_later_of_now_and_the_end_and_stops_at_the_cap() {
        let hold = Hold {
            hold_for: Duration::from_secs(600),
            max_hold: Duration::from_secs(3600),
            max_held: 1,
        };
        let step = Duration::from_secs(1800);
        assert_eq!(hold.extended(at(0), at(600), step, at(100)), at(2400));
        assert_eq!(hold.extended(at(0), at(600), step, at(1000)), at(2800));
        assert_eq!(hold.extended(at(0), at(2400), step, at(100)), at(3600));
        assert_eq!(format_hold_until(at(7)), "2027-01-15T08:00:07Z");
    }
}
