//! Parsing JSON text within a policy's stack.
//!
//! serde_json parses nested arrays and objects recursively, and a policy's
//! shadow stack is deliberately small (32 KiB, see `.cargo/config.toml`): a
//! small stack is what keeps a fresh instance inside the memory the host
//! keeps resident. serde_json's own limit (128 levels) is deeper than that
//! stack allows, so an input nested 100 levels deep would overflow it and
//! trap. Instead, the depth is checked first, in a loop that uses no stack,
//! and a deep input is an error that names the limit.
//!
//! Nothing a policy reads legitimately comes close: a pod template nests
//! about a dozen levels, settings two or three.

use alloc::format;
use alloc::string::String;
use serde_json::Value;

/// The deepest nesting of arrays and objects accepted. Measured: the pod
/// template parse of `pod-validation-default` overflows 32 KiB at about 85
/// levels, so this leaves a quarter of the stack spare.
pub const MAX_DEPTH: usize = 64;

/// Parses `text` as JSON, refusing nesting deeper than [`MAX_DEPTH`].
/// `what` names the text in errors ("settings", "the pod template").
///
/// Use it (not `serde_json::from_slice`) for anything a policy receives as
/// JSON text, a state blob included: a deeply nested input then fails the
/// decision with a message instead of overflowing the stack, which traps.
///
/// ```
/// use arcwright_guest::json;
///
/// let state = json::parse("the state", br#"{"since": 1796029200}"#).unwrap();
/// assert_eq!(state["since"], 1_796_029_200);
///
/// let deep = "[".repeat(100) + &"]".repeat(100);
/// assert_eq!(
///     json::parse("the state", deep.as_bytes()).unwrap_err(),
///     "the state is nested more than 64 levels deep"
/// );
/// ```
pub fn parse(what: &str, text: &[u8]) -> Result<Value, String> {
    check_depth(what, text)?;
    serde_json::from_slice(text).map_err(|error| format!("{what} is not valid JSON: {error}"))
}

fn check_depth(what: &str, text: &[u8]) -> Result<(), String> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for &byte in text {
        if in_string {
            match (escaped, byte) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Err(format!(
                        "{what} is nested more than {MAX_DEPTH} levels deep"
                    ));
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;

    fn nested(depth: usize) -> String {
        "[".repeat(depth) + &"]".repeat(depth)
    }

    #[test]
    fn accepts_nesting_up_to_the_limit() {
        assert!(parse("x", nested(MAX_DEPTH).as_bytes()).is_ok());
    }

    #[test]
    fn refuses_deeper_nesting_before_parsing() {
        assert_eq!(
            parse("the pod template", nested(MAX_DEPTH + 1).as_bytes()).unwrap_err(),
            "the pod template is nested more than 64 levels deep"
        );
        // Unbalanced input is refused just the same.
        assert!(parse("x", "[".repeat(10_000).as_bytes()).is_err());
    }

    #[test]
    fn brackets_inside_strings_do_not_count() {
        let text = format!(
            r#"{{"a": "{}", "b": "\"{}"}}"#,
            "[".repeat(100),
            "{".repeat(100)
        );
        assert!(parse("x", text.as_bytes()).is_ok());
    }

    #[test]
    fn reports_invalid_json_with_what_it_was() {
        let error = parse("settings", b"{idle: 2").unwrap_err();
        assert!(error.starts_with("settings is not valid JSON"), "{error}");
        assert_eq!(parse("x", b"12").unwrap(), Value::from(12));
        assert!(parse("x", b"").unwrap_err().to_string().contains("EOF"));
    }
}
