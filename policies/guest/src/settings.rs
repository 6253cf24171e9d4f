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

/// A policy's parsed settings.
#[derive(Debug, Default)]
pub struct Settings {
    map: Map<String, Value>,
}

impl Settings {
    /// Parses settings text, accepting only the keys in `accepted`.
    ///
    /// `""` (no settings written) and `"{}"` both mean "all defaults".
    /// Anything else must be a JSON object.
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
    pub fn none(text: &str) -> Result<(), String> {
        Self::parse(text, &[]).map(drop)
    }

    /// The raw value of `key`, if it was given (and is not `null`).
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.map.get(key).filter(|value| !value.is_null())
    }

    /// `key` as a whole number in `0..=max`, or `None` when absent.
    pub fn u32_up_to(&self, key: &str, max: u32) -> Result<Option<u32>, String> {
        self.get(key)
            .map(|value| whole_number(key, value, 0, i64::from(max)).map(|n| n as u32))
            .transpose()
    }

    /// `key` as a whole number in `min..=max`, or `None` when absent.
    pub fn i64_between(&self, key: &str, min: i64, max: i64) -> Result<Option<i64>, String> {
        self.get(key)
            .map(|value| whole_number(key, value, min, max))
            .transpose()
    }

    /// `key` as `true` or `false`, or `None` when absent.
    pub fn bool(&self, key: &str) -> Result<Option<bool>, String> {
        self.get(key)
            .map(|value| {
                value.as_bool().ok_or_else(|| {
                    format!("`{key}` must be true or false, got {}", describe(value))
                })
            })
            .transpose()
    }

    /// `key` as a list, or `None` when absent.
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

/// The message for a key that is not one of `accepted`.
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
