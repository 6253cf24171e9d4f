//! The reconcilers. Each keeps its decisions in a pure `plan` module and its
//! I/O in a thin layer around it; [`metrics`] is what they report.

pub mod ephemeral_runner;
pub mod metrics;
