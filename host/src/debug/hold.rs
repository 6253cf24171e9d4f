//! The debug hold's arithmetic, shared with the runner's reconciler: it
//! lives beside the EphemeralRunner's types
//! ([`crate::api::ephemeral_runner::hold`]), where the reconciler's pure
//! plan reads it without depending on the debugging conveniences.

pub use crate::api::ephemeral_runner::hold::{
    DEFAULT_MAX_HELD, Deadline, DebugSpecError, HOLD_UNTIL_ANNOTATION, Hold, format_hold_until,
    parse_duration,
};
