//! Kubernetes events, as every part of the host writes them.
//!
//! The API server refuses an event whose note is over 1 KiB, and a refused
//! event is a warning nobody reads: a policy's violations or an Actions
//! error can be longer than that, so every note goes through [`note`].

/// The longest note the API server accepts, in bytes.
pub const MAX_NOTE: usize = 1024;

/// `text` cut to what an event note may hold, on a character boundary,
/// with `...` marking the cut.
pub fn note(text: impl Into<String>) -> String {
    let mut text = text.into();
    if text.len() <= MAX_NOTE {
        return text;
    }
    let mut end = MAX_NOTE - 3;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push_str("...");
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_notes_are_kept_and_long_ones_cut_on_a_character() {
        assert_eq!(note("fine"), "fine");
        let exact = "a".repeat(MAX_NOTE);
        assert_eq!(note(exact.clone()), exact);
        let long = format!("{}é{}", "a".repeat(MAX_NOTE - 4), "b".repeat(50));
        let cut = note(long);
        assert!(cut.len() <= MAX_NOTE, "{}", cut.len());
        assert!(cut.ends_with("..."));
        assert!(cut.starts_with(&"a".repeat(MAX_NOTE - 4)));
    }
}
