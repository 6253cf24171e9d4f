//! arcwright runs GitHub Actions self-hosted runners on Kubernetes.
//!
//! The library holds everything the `arcwright` binary does, in layers a
//! reader can see: [`policy`] (the sandboxed WebAssembly decisions) and
//! [`actions`] (the GitHub Actions service client) know nothing of the
//! reconcilers built on top of them.
#![deny(missing_docs)]

pub mod access;
pub mod actions;
pub mod api;
pub mod backlog;
pub mod causes;
pub mod controllers;
pub mod credentials;
pub mod debug;
pub mod events;
#[cfg(test)]
mod fuzz;
pub mod lab;
pub mod listener;
pub mod migrate;
pub mod policy;
pub mod recording;
pub mod runtime;
pub mod sharding;
pub mod slack;
pub mod telemetry;
pub mod tenant_cache;
pub mod unregistration;
pub mod watch;
