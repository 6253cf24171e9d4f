//! The reconcilers. Each observes its object and what it owns, decides in a
//! pure `plan` module, and applies the decision in a thin layer around it;
//! [`metrics`] is what they report in common.

pub mod autoscaling_runner_set;
pub mod ephemeral_runner;
pub mod ephemeral_runner_set;
pub mod metrics;
