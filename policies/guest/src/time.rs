//! Calendar arithmetic for policies that look at the time of day.
//!
//! A policy has no clock: the only time it sees is the decision's
//! `now-unix-seconds`, so that a suite can pin the time and a decision is
//! reproducible. Policies also have no time zone database (it would be
//! hundreds of kilobytes in every component), so local time is UTC plus a
//! fixed offset the admin configures; daylight saving time means changing
//! the offset, which is a settings change and takes effect at once.
//!
//! ```
//! use arcwright_guest::time::{LocalTime, Weekday, parse_hh_mm};
//!
//! // Is `now` inside a Monday-to-Friday 08:00-18:00 window in UTC-5?
//! fn in_office_hours(now_unix_seconds: i64) -> Result<bool, String> {
//!     let (from, to) = (parse_hh_mm("08:00", false)?, parse_hh_mm("18:00", true)?);
//!     let local = LocalTime::at(now_unix_seconds, -300);
//!     Ok(local.weekday <= Weekday::Fri && (from..to).contains(&local.minute))
//! }
//!
//! // 2026-11-30T14:00:00Z is Monday 09:00 in UTC-5.
//! assert_eq!(in_office_hours(1_796_047_200), Ok(true));
//! // 2026-11-30T04:00:00Z is still Sunday 23:00 there.
//! assert_eq!(in_office_hours(1_796_011_200), Ok(false));
//! ```

use alloc::format;
use alloc::string::String;

/// Days of the week, Monday first (ISO 8601).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Weekday {
    /// Monday.
    Mon,
    /// Tuesday.
    Tue,
    /// Wednesday.
    Wed,
    /// Thursday.
    Thu,
    /// Friday.
    Fri,
    /// Saturday.
    Sat,
    /// Sunday.
    Sun,
}

impl Weekday {
    /// All days, Monday first.
    pub const ALL: [Weekday; 7] = [
        Weekday::Mon,
        Weekday::Tue,
        Weekday::Wed,
        Weekday::Thu,
        Weekday::Fri,
        Weekday::Sat,
        Weekday::Sun,
    ];

    /// The day from its index, Monday = 0 (taken modulo 7).
    pub fn from_index(index: u32) -> Self {
        Self::ALL[(index % 7) as usize]
    }

    /// Monday = 0 … Sunday = 6.
    pub fn index(self) -> u32 {
        self as u32
    }

    /// The day before.
    pub fn previous(self) -> Self {
        Self::from_index(self.index() + 6)
    }

    /// The three-letter lower-case name settings use (`mon` … `sun`).
    pub fn name(self) -> &'static str {
        ["mon", "tue", "wed", "thu", "fri", "sat", "sun"][self as usize]
    }
}

/// A moment in local time: the day of the week and the minute of that day.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalTime {
    /// The local day of the week.
    pub weekday: Weekday,
    /// Minutes since local midnight, `0..1440`.
    pub minute: u32,
}

impl LocalTime {
    /// Local time at `unix_seconds` (the input's `now_unix_seconds`) for a
    /// zone `offset_minutes` east of UTC (negative west of it).
    ///
    /// Works for any `i64`, including instants before 1970: the arithmetic
    /// is Euclidean, so a negative remainder never yields a minute of -5.
    ///
    /// ```
    /// # use arcwright_guest::time::{LocalTime, Weekday};
    /// // The Unix epoch was a Thursday; in UTC+1 it was 01:00.
    /// assert_eq!(
    ///     LocalTime::at(0, 60),
    ///     LocalTime { weekday: Weekday::Thu, minute: 60 }
    /// );
    /// ```
    pub fn at(unix_seconds: i64, offset_minutes: i32) -> Self {
        let local = i128::from(unix_seconds) + i128::from(offset_minutes) * 60;
        let days = local.div_euclid(86_400);
        let second_of_day = local.rem_euclid(86_400);
        // 1970-01-01 was a Thursday, index 3 with Monday = 0.
        let weekday = Weekday::from_index((days + 3).rem_euclid(7) as u32);
        Self {
            weekday,
            minute: (second_of_day / 60) as u32,
        }
    }
}

/// Parses a `HH:MM` time of day into minutes since midnight.
///
/// `24:00` is accepted (as 1440) only when `allow_end_of_day`, so a window
/// can say "until midnight" without the reader having to know that
/// `00:00` as an end means the same. The error says how to write it.
///
/// ```
/// # use arcwright_guest::time::parse_hh_mm;
/// assert_eq!(parse_hh_mm("08:30", false), Ok(510));
/// assert_eq!(parse_hh_mm("24:00", true), Ok(1440));
/// assert_eq!(
///     parse_hh_mm("8:30", false),
///     Err("\"8:30\" is not a time of day; write it as HH:MM, e.g. \"08:30\"".to_string())
/// );
/// ```
pub fn parse_hh_mm(text: &str, allow_end_of_day: bool) -> Result<u32, String> {
    let invalid = || format!("{text:?} is not a time of day; write it as HH:MM, e.g. \"08:30\"");
    let (hours, minutes) = text.split_once(':').ok_or_else(invalid)?;
    let two_digits = |part: &str| part.len() == 2 && part.bytes().all(|b| b.is_ascii_digit());
    if !two_digits(hours) || !two_digits(minutes) {
        return Err(invalid());
    }
    let hours: u32 = hours.parse().map_err(|_| invalid())?;
    let minutes: u32 = minutes.parse().map_err(|_| invalid())?;
    if hours == 24 && minutes == 0 && allow_end_of_day {
        return Ok(1440);
    }
    if hours > 23 || minutes > 59 {
        return Err(invalid());
    }
    Ok(hours * 60 + minutes)
}

/// Formats minutes since midnight as `HH:MM`, for reasons and messages.
///
/// ```
/// # use arcwright_guest::time::format_hh_mm;
/// assert_eq!(format_hh_mm(510), "08:30");
/// ```
pub fn format_hh_mm(minute: u32) -> String {
    format!("{:02}:{:02}", minute / 60, minute % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_epoch_was_a_thursday() {
        assert_eq!(
            LocalTime::at(0, 0),
            LocalTime {
                weekday: Weekday::Thu,
                minute: 0
            }
        );
    }

    #[test]
    fn known_dates() {
        // 2026-11-30T09:15:00Z is a Monday.
        let monday = 1_796_029_200 + 15 * 60;
        assert_eq!(
            LocalTime::at(monday, 0),
            LocalTime {
                weekday: Weekday::Mon,
                minute: 9 * 60 + 15
            }
        );
        // Ten hours west of UTC it is still Sunday evening.
        assert_eq!(
            LocalTime::at(monday, -600),
            LocalTime {
                weekday: Weekday::Sun,
                minute: 23 * 60 + 15
            }
        );
    }

    #[test]
    fn instants_before_1970_are_handled() {
        // 1969-12-31T23:59:00Z was a Wednesday.
        assert_eq!(
            LocalTime::at(-60, 0),
            LocalTime {
                weekday: Weekday::Wed,
                minute: 1439
            }
        );
        LocalTime::at(i64::MIN, -1439);
        LocalTime::at(i64::MAX, 1439);
    }

    #[test]
    fn parses_times_of_day() {
        assert_eq!(parse_hh_mm("08:30", false), Ok(510));
        assert_eq!(parse_hh_mm("00:00", false), Ok(0));
        assert_eq!(parse_hh_mm("23:59", false), Ok(1439));
        assert_eq!(parse_hh_mm("24:00", true), Ok(1440));
        for bad in ["24:00", "8:30", "08:60", "0830", "aa:bb", "", "+1:00"] {
            assert!(parse_hh_mm(bad, false).is_err(), "{bad}");
        }
        assert_eq!(format_hh_mm(510), "08:30");
    }

    #[test]
    fn previous_day_wraps() {
        assert_eq!(Weekday::Mon.previous(), Weekday::Sun);
        assert_eq!(Weekday::Sun.previous(), Weekday::Sat);
    }
}
