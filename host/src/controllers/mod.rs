//! The reconcilers. Each observes its object and what it owns, decides in a
//! pure `plan` module, and applies the decision in a thin layer around it.

pub mod ephemeral_runner_set;
