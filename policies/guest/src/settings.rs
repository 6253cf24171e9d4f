//! Reading a policy's settings: the JSON object an admin wrote next to the
//! policy reference.
//!
//! Settings are read by hand from a [`serde_json::Value`] rather than
//! derived with serde, because serde's messages name a type, not a key
//! ("invalid value: integer `-1`, expected u32 at line 1 column 9"), and the
//! person reading them is an admin looking at a manifest, not a Rust
//! programmer. Every message here names the key, says what was expected and
//! shows what was found.
//!
//! Unknown keys are errors, not ignored: a misspelt `idlePercent` that is
//! silently dropped looks like a policy that does not work.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use serde_json::{Map, Value};

/// A policy's parsed settings: the JSON object an admin wrote beside the
/// policy reference, with only the keys the policy accepts.
///
/// Parse once into your own type, from both `validate_settings` and
/// `decide`, so settings cannot be valid in one and not in the other:
///
/// ```
/// use arcwright_guest::Settings;
///
/// struct Spare { idle: u32, weekends: bool }
///
/// fn parse(text: &str) -> Result<Spare, String> {
///     let settings = Settings::parse(text, &["idle", "weekends"])?;
///     Ok(Spare {
///         idle: settings.u32_up_to("idle", 1000)?.unwrap_or(0),
///         weekends: settings.bool("weekends")?.unwrap_or(true),
///     })
/// }
///
/// assert_eq!(parse("").map(|s| s.idle), Ok(0)); // no settings: defaults
/// assert_eq!(parse(r#"{"idle": 2}"#).map(|s| s.idle), Ok(2));
/// assert_eq!(
///     parse(r#"{"idle": -1}"#).map(|s| s.idle),
///     Err("`idle` must be from 0 to 1000, got -1".to_string())
/// );
/// assert_eq!(
///     parse(r#"{"weekend": false}"#).map(|s| s.idle),
///     Err("unknown setting `weekend`: accepted keys are idle, weekends".to_string())
/// );
/// ```
#[derive(Debug, Default)]
pub struct Settings {
    map: Map<String, Value>,
}

impl Settings {
    /// Parses settings text, accepting only the keys in `accepted`.
    ///
    /// `""` (no settings written) and `"{}"` both mean "all defaults".
    /// Anything else must be a JSON object, nested at most
    /// [`json::MAX_DEPTH`](crate::json::MAX_DEPTH) levels.
    ///
    /// ```
    /// # use arcwright_guest::Settings;
    /// assert!(Settings::parse("{}", &["batch"]).is_ok());
    /// assert_eq!(
    ///     Settings::parse("[4]", &["batch"]).unwrap_err(),
    ///     "settings must be an object of keys and values, got a list"
    /// );
    /// ```
    pub fn parse(text: &str, accepted: &[&str]) -> Result<Self, String> {
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        let value = crate::json::parse("settings", text.as_bytes())?;
        let Value::Object(map) = value else {
            return Err(format!(
                "settings must be an object of keys and values, got {}",
                describe(&value)
            ));
        };
        if let Some(unknown) = map.keys().find(|key| !accepted.contains(&key.as_str())) {
            return Err(unknown_key("setting", unknown, accepted));
        }
        Ok(Self { map })
    }

    /// Parses settings for a policy that takes none: only `""` and `"{}"`.
    ///
    /// ```
    /// # use arcwright_guest::Settings;
    /// assert_eq!(Settings::none("{}"), Ok(()));
    /// assert_eq!(
    ///     Settings::none(r#"{"idle": 1}"#),
    ///     Err("unknown setting `idle`: this policy takes no settings".to_string())
    /// );
    /// ```
    pub fn none(text: &str) -> Result<(), String> {
        Self::parse(text, &[]).map(drop)
    }

    /// The raw value of `key`, if it was given (and is not `null`), for
    /// settings the typed getters do not cover (a text, an object).
    ///
    /// ```
    /// # use arcwright_guest::Settings;
    /// let settings = Settings::parse(r#"{"zone": "ci", "idle": null}"#, &["zone", "idle"]).unwrap();
    /// assert_eq!(settings.get("zone").and_then(|v| v.as_str()), Some("ci"));
    /// assert!(settings.get("idle").is_none()); // null is absent
    /// ```
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.map.get(key).filter(|value| !value.is_null())
    }

    /// `key` as a whole number in `0..=max`, or `None` when absent.
    /// `3.0` is accepted as 3; `2.5`, `"3"` and `-1` are refused with the key
    /// named.
    ///
    /// ```
    /// # use arcwright_guest::Settings;
    /// let settings = Settings::parse(r#"{"idle": 3.0, "max": 2.5}"#, &["idle", "max"]).unwrap();
    /// assert_eq!(settings.u32_up_to("idle", 10), Ok(Some(3)));
    /// assert_eq!(settings.u32_up_to("spare", 10), Ok(None));
    /// assert_eq!(
    ///     settings.u32_up_to("max", 10),
    ///     Err("`max` must be a whole number from 0 to 10, got 2.5".to_string())
    /// );
    /// ```
    pub fn u32_up_to(&self, key: &str, max: u32) -> Result<Option<u32>, String> {
        self.get(key)
            .map(|value| whole_number(key, value, 0, i64::from(max)).map(|n| n as u32))
            .transpose()
    }

    /// `key` as a whole number in `min..=max`, or `None` when absent: for
    /// ranges that do not start at 0 or go below it.
    ///
    /// ```
    /// # use arcwright_guest::Settings;
    /// let settings = Settings::parse(r#"{"utcOffsetMinutes": -300}"#, &["utcOffsetMinutes"]).unwrap();
    /// assert_eq!(settings.i64_between("utcOffsetMinutes", -1440, 1440), Ok(Some(-300)));
    /// ```
    pub fn i64_between(&self, key: &str, min: i64, max: i64) -> Result<Option<i64>, String> {
        self.get(key)
            .map(|value| whole_number(key, value, min, max))
            .transpose()
    }

    /// `key` as `true` or `false`, or `None` when absent.
    ///
    /// ```
    /// # use arcwright_guest::Settings;
    /// let settings = Settings::parse(r#"{"strict": "yes"}"#, &["strict"]).unwrap();
    /// assert_eq!(
    ///     settings.bool("strict"),
    ///     Err("`strict` must be true or false, got the text \"yes\"".to_string())
    /// );
    /// ```
    pub fn bool(&self, key: &str) -> Result<Option<bool>, String> {
        self.get(key)
            .map(|value| {
                value.as_bool().ok_or_else(|| {
                    format!("`{key}` must be true or false, got {}", describe(value))
                })
            })
            .transpose()
    }

    /// `key` as a list, or `None` when absent. Check each element with
    /// [`whole_number`] and [`describe`], naming it by its path.
    ///
    /// ```
    /// # use arcwright_guest::Settings;
    /// # use arcwright_guest::settings::whole_number;
    /// let settings = Settings::parse(r#"{"sizes": [2, 4, -8]}"#, &["sizes"]).unwrap();
    /// let sizes = settings.list("sizes").unwrap().unwrap();
    /// let checked: Result<Vec<i64>, String> = sizes
    ///     .iter()
    ///     .enumerate()
    ///     .map(|(i, v)| whole_number(&format!("sizes[{i}]"), v, 1, 64))
    ///     .collect();
    /// assert_eq!(checked, Err("`sizes[2]` must be from 1 to 64, got -8".to_string()));
    /// ```
    pub fn list(&self, key: &str) -> Result<Option<&Vec<Value>>, String> {
        self.get(key)
            .map(|value| {
                value
                    .as_array()
                    .ok_or_else(|| format!("`{key}` must be a list, got {}", describe(value)))
            })
            .transpose()
    }
}

/// Checks that `value` is a whole number in `min..=max`, naming `key` in the
/// error. Used for nested settings too, where `key` is a path such as
/// `windows[0].minRunners`.
///
/// ```
/// # use arcwright_guest::settings::whole_number;
/// # use serde_json::json;
/// assert_eq!(whole_number("windows[0].minRunners", &json!(4), 0, 100), Ok(4));
/// assert_eq!(
///     whole_number("windows[0].minRunners", &json!("4"), 0, 100),
///     Err("`windows[0].minRunners` must be a whole number from 0 to 100, got the text \"4\"".to_string())
/// );
/// ```
pub fn whole_number(key: &str, value: &Value, min: i64, max: i64) -> Result<i64, String> {
    let number = value.as_i64().or_else(|| {
        // 3.0 is a whole number an admin may well write; 3.5 is not.
        value
            .as_f64()
            .filter(|f| (i64::MIN as f64..i64::MAX as f64).contains(f) && (*f as i64) as f64 == *f)
            .map(|f| f as i64)
    });
    match number {
        Some(n) if (min..=max).contains(&n) => Ok(n),
        Some(n) => Err(format!("`{key}` must be from {min} to {max}, got {n}")),
        None if value.is_u64() => Err(format!(
            "`{key}` must be from {min} to {max}, got {}",
            value
        )),
        None => Err(format!(
            "`{key}` must be a whole number from {min} to {max}, got {}",
            describe(value)
        )),
    }
}

/// The message for a key that is not one of `accepted`; `what` names the
/// kind of key (`setting`, `window key`).
///
/// ```
/// # use arcwright_guest::settings::unknown_key;
/// assert_eq!(
///     unknown_key("window key", "form", &["days", "from", "to"]),
///     "unknown window key `form`: accepted keys are days, from, to"
/// );
/// ```
pub fn unknown_key(what: &str, key: &str, accepted: &[&str]) -> String {
    let key = shorten(key);
    if accepted.is_empty() {
        format!("unknown {what} `{key}`: this policy takes no settings")
    } else {
        format!(
            "unknown {what} `{key}`: accepted keys are {}",
            accepted.join(", ")
        )
    }
}

/// `text` cut to at most 64 bytes on a character boundary, with `…` when
/// cut. Messages echo what the admin wrote, and the host refuses messages
/// over 4 KiB; a pasted blob must not turn a clear error into that one.
///
/// ```
/// # use arcwright_guest::settings::shorten;
/// assert_eq!(shorten("mon"), "mon");
/// assert_eq!(shorten(&"x".repeat(100)), format!("{}…", "x".repeat(64)));
/// ```
pub fn shorten(text: &str) -> String {
    const MAX: usize = 64;
    if text.len() <= MAX {
        return text.to_string();
    }
    let mut end = MAX;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// A short description of a JSON value for error messages: its type, and
/// the value itself when that is short.
///
/// ```
/// # use arcwright_guest::settings::describe;
/// # use serde_json::json;
/// assert_eq!(describe(&json!("mon")), "the text \"mon\"");
/// assert_eq!(describe(&json!({"a": 1})), "an object");
/// ```
pub fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".to_string(),
        Value::Bool(b) => format!("{b}"),
        Value::Number(n) => format!("{n}"),
        Value::String(s) if s.len() <= 40 => format!("the text {s:?}"),
        Value::String(_) => "a long text".to_string(),
        Value::Array(_) => "a list".to_string(),
        Value::Object(_) => "an object".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_text_and_empty_object_mean_defaults() {
        for text in ["", "  ", "{}"] {
            let settings = Settings::parse(text, &["idle"]).unwrap();
            assert_eq!(settings.u32_up_to("idle", 10).unwrap(), None);
        }
    }

    #[test]
    fn null_counts_as_absent() {
        let settings = Settings::parse(r#"{"idle": null}"#, &["idle"]).unwrap();
        assert_eq!(settings.u32_up_to("idle", 10).unwrap(), None);
    }

    #[test]
    fn rejects_text_that_is_not_json() {
        let error = Settings::parse("{idle: 2", &["idle"]).unwrap_err();
        assert!(error.starts_with("settings is not valid JSON"), "{error}");
    }

    #[test]
    fn rejects_json_that_is_not_an_object() {
        let error = Settings::parse("[1]", &["idle"]).unwrap_err();
        assert_eq!(
            error,
            "settings must be an object of keys and values, got a list"
        );
    }

    #[test]
    fn unknown_keys_name_the_key_and_the_accepted_ones() {
        let error = Settings::parse(r#"{"idel": 2}"#, &["idle", "idlePercent"]).unwrap_err();
        assert_eq!(
            error,
            "unknown setting `idel`: accepted keys are idle, idlePercent"
        );
        let error = Settings::none(r#"{"x": 1}"#).unwrap_err();
        assert_eq!(error, "unknown setting `x`: this policy takes no settings");
    }

    #[test]
    fn numbers_are_range_checked_with_the_key_named() {
        let settings = Settings::parse(
            r#"{"a": -1, "b": 2.5, "c": "3", "d": 3.0, "e": 18446744073709551615}"#,
            &["a", "b", "c", "d", "e"],
        )
        .unwrap();
        assert_eq!(
            settings.u32_up_to("a", 100).unwrap_err(),
            "`a` must be from 0 to 100, got -1"
        );
        assert_eq!(
            settings.u32_up_to("b", 100).unwrap_err(),
            "`b` must be a whole number from 0 to 100, got 2.5"
        );
        assert_eq!(
            settings.u32_up_to("c", 100).unwrap_err(),
            "`c` must be a whole number from 0 to 100, got the text \"3\""
        );
        assert_eq!(settings.u32_up_to("d", 100).unwrap(), Some(3));
        assert_eq!(
            settings.u32_up_to("e", 100).unwrap_err(),
            "`e` must be from 0 to 100, got 18446744073709551615"
        );
        assert_eq!(settings.i64_between("a", -5, 5).unwrap(), Some(-1));
    }

    #[test]
    fn long_keys_are_shortened_in_messages() {
        let key = "ü".repeat(1000);
        let error = Settings::parse(&format!(r#"{{"{key}": 1}}"#), &["idle"]).unwrap_err();
        assert!(error.len() < 150, "{error}");
        assert!(
            error.starts_with(&format!("unknown setting `{}…`", "ü".repeat(32))),
            "{error}"
        );
    }

    #[test]
    fn booleans_must_be_booleans() {
        let settings = Settings::parse(r#"{"on": "yes"}"#, &["on"]).unwrap();
        assert_eq!(
            settings.bool("on").unwrap_err(),
            "`on` must be true or false, got the text \"yes\""
        );
    }
}
