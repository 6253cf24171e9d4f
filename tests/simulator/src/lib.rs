//! The runner simulator.
