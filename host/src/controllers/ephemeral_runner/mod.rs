//! The EphemeralRunner controller: registers a runner once, runs it in a pod
//! built from its template, follows the pod into the status, and removes the
//! registration before the pod whenever the pod has to go.
//!
//! The decisions live in [`plan`], a pure function of what a reconcile saw;
//! the objects a runner owns are built in [`resources`].

pub mod plan;
pub mod resources;
