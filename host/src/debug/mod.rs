//! meows' debugging conveniences on top of ephemeral runners: a failed job's
//! runner is held for someone to look inside ([`hold`]), and its hold can
//! be extended or released ([`control`]), by Slack ([`crate::slack`]) or
//! the hold API ([`api`]).
//!
//! The runner's reconciler owns the hold's life (entering, the deadline,
//! the release); what lives here is what every path that touches a hold
//! shares, so the annotation, the cap and the arithmetic mean the same
//! thing to all of them.

pub mod api;
pub mod control;
pub mod hold;
pub mod throttle;

pub use control::{HoldChange, HoldControlError, Press, change_hold};
pub use hold::{DebugSpecError, HOLD_UNTIL_ANNOTATION, Hold};
