//! The reconcilers: each observes its object and what it owns, plans with
//! a pure function, and applies the plan in one thin layer.

pub mod autoscaling_runner_set;
