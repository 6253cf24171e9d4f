//! The bundled `schedule` scaling policy: a higher minimum of warm runners
//! during configured time windows, ARC's formula otherwise.
//!
//! The use is the working day: keeping ten runners warm from 08:00 to 18:00
//! on weekdays removes the start-up wait for the morning's first pushes,
//! without paying for idle runners all night. Outside every window the
//! policy is exactly ARC's formula, so a mistake in the windows can only
//! cost warm runners, never capacity for assigned jobs.
//!
//! Settings:
//!
//! ```json
//! {"utcOffsetMinutes": 60,
//!  "windows": [{"days": ["weekdays"], "from": "08:00", "to": "18:00", "minRunners": 10}]}
//! ```
//!
//! - `utcOffsetMinutes`: the local zone as minutes east of UTC (default 0).
//!   There is no time zone database in a policy; daylight saving time is a
//!   settings change.
//! - `days`: `mon` … `sun`, `weekdays` (mon–fri), `weekends` (sat, sun).
//! - `from`/`to`: local `HH:MM`; `to` may be `24:00`. A window whose `to` is
//!   earlier than its `from` crosses midnight and belongs to the day it
//!   starts on: `{"days": ["fri"], "from": "22:00", "to": "02:00"}` covers
//!   Friday 22:00 to Saturday 02:00. `from` is inclusive, `to` exclusive.
//! - `minRunners`: replaces the scale set's `minRunners` while the window is
//!   active, when larger. When windows overlap the largest applies.
#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use arcwright_guest::Settings;
use arcwright_guest::scaling::Demand;
use arcwright_guest::settings::{describe, shorten, whole_number};
use arcwright_guest::time::{LocalTime, Weekday, format_hh_mm, parse_hh_mm};
use exports::arcwright::policy::scaling::{Guest, ScalingDecision, ScalingInput};
use serde_json::Value;

wit_bindgen::generate!({ world: "scaling-policy", path: "../../wit" });

const KEYS: &[&str] = &["utcOffsetMinutes", "windows"];
const WINDOW_KEYS: &[&str] = &["days", "from", "to", "minRunners"];

/// One window: the days it starts on (a bit per weekday, Monday = bit 0),
/// its local start and end in minutes since midnight, and its minimum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Window {
    days: u8,
    from: u32,
    to: u32,
    min_runners: u32,
}

impl Window {
    fn parse(index: usize, value: &Value) -> Result<Self, String> {
        let at = |key: &str| format!("windows[{index}].{key}");
        let Value::Object(map) = value else {
            return Err(format!(
                "`windows[{index}]` must be an object with days, from, to and minRunners, got {}",
                describe(value)
            ));
        };
        if let Some(unknown) = map.keys().find(|k| !WINDOW_KEYS.contains(&k.as_str())) {
            return Err(format!(
                "unknown key `{}` in `windows[{index}]`: accepted keys are {}",
                shorten(unknown),
                WINDOW_KEYS.join(", ")
            ));
        }
        let field = |key: &str| {
            map.get(key)
                .filter(|v| !v.is_null())
                .ok_or_else(|| format!("`{}` is required", at(key)))
        };
        let days = parse_days(&at("days"), field("days")?)?;
        let time = |key: &str, end: bool| -> Result<u32, String> {
            let value = field(key)?;
            let text = value.as_str().ok_or_else(|| {
                format!(
                    "`{}` must be a time of day such as \"08:00\", got {}",
                    at(key),
                    describe(value)
                )
            })?;
            parse_hh_mm(text, end).map_err(|error| format!("`{}`: {error}", at(key)))
        };
        let from = time("from", false)?;
        let to = time("to", true)?;
        if from == to {
            return Err(format!(
                "`{}` and `{}` are both {}: a window must not be empty (for all day, write \"00:00\" to \"24:00\")",
                at("from"),
                at("to"),
                format_hh_mm(from)
            ));
        }
        let min_runners = whole_number(
            &at("minRunners"),
            field("minRunners")?,
            0,
            i64::from(u32::MAX),
        )? as u32;
        Ok(Self {
            days,
            from,
            to,
            min_runners,
        })
    }

    /// Whether the window is active at `now`. A window crossing midnight is
    /// active after `from` on its own days and before `to` on the day after.
    fn active(&self, now: LocalTime) -> bool {
        let on = |day: Weekday| self.days & (1 << day.index()) != 0;
        if self.from < self.to {
            on(now.weekday) && (self.from..self.to).contains(&now.minute)
        } else {
            (on(now.weekday) && now.minute >= self.from)
                || (on(now.weekday.previous()) && now.minute < self.to)
        }
    }

    fn describe(&self) -> String {
        let days: Vec<&str> = Weekday::ALL
            .iter()
            .filter(|day| self.days & (1 << day.index()) != 0)
            .map(|day| day.name())
            .collect();
        format!(
            "{} {}-{}",
            days.join(","),
            format_hh_mm(self.from),
            format_hh_mm(self.to)
        )
    }
}

fn parse_days(key: &str, value: &Value) -> Result<u8, String> {
    let list = value.as_array().ok_or_else(|| {
        format!(
            "`{key}` must be a list of days such as [\"mon\", \"tue\"] or [\"weekdays\"], got {}",
            describe(value)
        )
    })?;
    if list.is_empty() {
        return Err(format!(
            "`{key}` is empty: the window would never be active"
        ));
    }
    let mut days = 0u8;
    for entry in list {
        let name = entry.as_str().unwrap_or("");
        days |= match name {
            "weekdays" => 0b001_1111,
            "weekends" => 0b110_0000,
            _ => match Weekday::ALL.iter().find(|day| day.name() == name) {
                Some(day) => 1 << day.index(),
                None => {
                    return Err(format!(
                        "`{key}`: {} is not a day; use mon, tue, wed, thu, fri, sat, sun, weekdays or weekends",
                        describe(entry)
                    ));
                }
            },
        };
    }
    Ok(days)
}

/// Parsed settings.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Schedule {
    offset_minutes: i32,
    windows: Vec<Window>,
}

impl Schedule {
    fn parse(text: &str) -> Result<Self, String> {
        let settings = Settings::parse(text, KEYS)?;
        let offset_minutes = settings
            .i64_between("utcOffsetMinutes", -1439, 1439)?
            .unwrap_or(0) as i32;
        let windows = settings
            .list("windows")?
            .map(|list| {
                list.iter()
                    .enumerate()
                    .map(|(index, value)| Window::parse(index, value))
                    .collect::<Result<Vec<_>, _>>()
            })
            .transpose()?
            .unwrap_or_default();
        Ok(Self {
            offset_minutes,
            windows,
        })
    }

    /// The active window with the largest minimum, and its index.
    fn active(&self, now_unix_seconds: i64) -> Option<(usize, &Window)> {
        let now = LocalTime::at(now_unix_seconds, self.offset_minutes);
        self.windows
            .iter()
            .enumerate()
            .filter(|(_, window)| window.active(now))
            .max_by_key(|(index, window)| (window.min_runners, core::cmp::Reverse(*index)))
    }
}

fn decide(input: &ScalingInput, schedule: &Schedule) -> ScalingDecision {
    let set = &input.scale_set;
    let assigned = input.statistics.assigned_jobs;
    let (desired, reason) = match schedule.active(input.now_unix_seconds) {
        Some((index, window)) if window.min_runners > set.min_runners => {
            let demand = Demand::new(window.min_runners, assigned, set.max_runners);
            let reason = format!(
                "window {index} ({}) raises minRunners from {} to {}: {}",
                window.describe(),
                set.min_runners,
                window.min_runners,
                demand.explain()
            );
            (demand.desired, reason)
        }
        Some((index, window)) => {
            let demand = Demand::new(set.min_runners, assigned, set.max_runners);
            let reason = format!(
                "window {index} ({}) is active but its minRunners {} is not above the scale set's: {}",
                window.describe(),
                window.min_runners,
                demand.explain()
            );
            (demand.desired, reason)
        }
        None => {
            let demand = Demand::new(set.min_runners, assigned, set.max_runners);
            (
                demand.desired,
                format!("no window active: {}", demand.explain()),
            )
        }
    };
    ScalingDecision {
        desired,
        reason,
        state: None,
    }
}

struct Policy;

impl Guest for Policy {
    fn validate_settings(settings: String) -> Result<(), String> {
        Schedule::parse(&settings).map(drop)
    }

    fn decide(input: ScalingInput) -> Result<ScalingDecision, String> {
        let schedule = Schedule::parse(&input.settings)?;
        Ok(decide(&input, &schedule))
    }
}

export!(Policy);

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-11-30T00:00:00Z, a Monday.
    const MONDAY: i64 = 1_795_996_800;

    fn at(day: i64, hh: i64, mm: i64) -> i64 {
        MONDAY + day * 86_400 + hh * 3_600 + mm * 60
    }

    #[test]
    fn windows_crossing_midnight_belong_to_their_start_day() {
        let schedule = Schedule::parse(
            r#"{"windows": [{"days": ["fri"], "from": "22:00", "to": "02:00", "minRunners": 3}]}"#,
        )
        .unwrap();
        assert!(schedule.active(at(4, 21, 59)).is_none());
        assert!(schedule.active(at(4, 22, 0)).is_some());
        assert!(schedule.active(at(5, 1, 59)).is_some());
        assert!(schedule.active(at(5, 2, 0)).is_none());
        assert!(schedule.active(at(5, 22, 30)).is_none());
        // Thursday night's late hours are not Friday's window.
        assert!(schedule.active(at(4, 1, 0)).is_none());
    }

    #[test]
    fn the_offset_moves_the_window() {
        let schedule = Schedule::parse(
            r#"{"utcOffsetMinutes": -300, "windows": [{"days": ["mon"], "from": "08:00", "to": "09:00", "minRunners": 3}]}"#,
        )
        .unwrap();
        assert!(schedule.active(at(0, 8, 30)).is_none());
        assert!(schedule.active(at(0, 13, 30)).is_some());
    }

    #[test]
    fn overlapping_windows_take_the_largest_minimum() {
        let schedule = Schedule::parse(
            r#"{"windows": [
                {"days": ["weekdays"], "from": "00:00", "to": "24:00", "minRunners": 2},
                {"days": ["mon"], "from": "09:00", "to": "10:00", "minRunners": 7}]}"#,
        )
        .unwrap();
        assert_eq!(schedule.active(at(0, 9, 0)).unwrap().0, 1);
        assert_eq!(schedule.active(at(0, 10, 0)).unwrap().0, 0);
        assert!(schedule.active(at(5, 10, 0)).is_none());
    }

    #[test]
    fn rejects_empty_windows() {
        let error = Schedule::parse(
            r#"{"windows": [{"days": ["mon"], "from": "08:00", "to": "08:00", "minRunners": 1}]}"#,
        )
        .unwrap_err();
        assert!(error.contains("must not be empty"), "{error}");
    }
}
