//! The sandboxed WebAssembly policies that make arcwright's judgement calls.
//!
//! Three decisions are delegated ([`PolicyKind`]): how many runners a scale
//! set wants, whether a finished runner still holds a registration, and
//! whether a runner pod template is acceptable. Each is a WebAssembly
//! component implementing one world of `wit/policy.wit`.
//!
//! # The five names
//!
//! - [`PolicyRef`](loader::PolicyRef): what an object's spec says about its
//!   policy (a builtin or a ConfigMap, a pin, settings, limits); held in the
//!   spec of the object it belongs to.
//! - [`PolicyModule`]: one module's bytes compiled, checked against the WIT
//!   contract and pre-instantiated, once per digest; held by every `Policy`
//!   made from it.
//! - [`Policy`]: a module bound to validated settings and limits, the thing
//!   that makes one decision in a fresh instance; held by a `Decider` (and by
//!   the suites and `arcwright policy eval`, which make it directly).
//! - [`Decider`]: the decision point of one object: the current `Policy`,
//!   swapped atomically when a new version loads, the bundled default behind
//!   it, and a scaling policy's state; held by the reconcilers and the
//!   listener of that object.
//! - [`LoadedPolicy`](loader::LoadedPolicy): a `Decider` together with its
//!   share of the ConfigMap watch that keeps it current; held by the
//!   controller for as long as the object exists, and dropping it stops
//!   following.
//!
//! # The sandbox: no WASI at all
//!
//! A policy may import `arcwright:policy/host` (a rate-limited `log`) and
//! nothing else. No WASI is linked, not even a deny-all one, and a component
//! that imports anything else (`wasi:filesystem`, `wasi:sockets`,
//! `wasi:clocks`, ...) is refused when it loads, with the forbidden imports
//! listed. The alternatives were weighed and rejected:
//!
//! - linking WASI with a deny-all context still hands the guest a wall clock
//!   and randomness, so a decision would stop being a pure function of its
//!   input and `arcwright policy test` suites would stop being trustworthy;
//!   it also costs ~70 lowered functions and two extra core instances per
//!   call, which made instantiation three to five times slower when measured
//!   with the pooling allocator;
//! - defining unknown imports as traps accepts components that fail only
//!   when an unusual input reaches the code path that touches WASI, which is
//!   a latent production failure rather than an error at load time.
//!
//! The bundled guests are therefore `#![no_std]` (with a small allocator and
//! their own `cabi_realloc`): a no_std guest compiled for `wasm32-wasip2` has
//! zero imports. Policy authors start from `policies/template`.
//!
//! # Calls
//!
//! One [`PolicyEngine`] per process compiles each module once per digest,
//! pre-instantiates it ([`PolicyModule`]), and runs every call in a fresh
//! `Store` from the pooling allocator, so no state leaks between objects and
//! a trapped instance (which wasmtime poisons) is simply dropped. Every call
//! is bounded: an epoch deadline (default 50 ms), a memory cap (default
//! 16 MiB) and caps on the size of the answer. State a scaling policy wants to
//! keep travels through its input and output (the [`Decider`] of a scale set
//! hands it back), never through the instance.
//!
//! Fuel metering is deliberately off. The budget that matters on the
//! reconcile path is wall-clock time, which the epoch deadline bounds at a
//! fraction of fuel's cost (fuel slows compilation by a quarter or more and
//! every call a little); a deterministic instruction budget would only buy
//! reproducible timeouts for policies that are already far outside their
//! budget.
//!
//! Failures never reach the reconcilers as crashes: [`Decider`] falls back to
//! the bundled default of the kind and reports why through a
//! [`PolicyReporter`], which the reconcilers turn into conditions, events and
//! `arcwright_policy_failures_total`.

mod bindings;
pub mod bundled;
mod call;
mod decide;
pub mod defaults;
mod engine;
mod error;
pub mod gate;
pub mod loader;
pub mod metrics;
mod module;
pub mod reporter;
pub mod shadow;
pub mod suite;
pub mod types;

use std::fmt;

pub use call::{CallLimits, DEFAULT_DEADLINE, DEFAULT_MEMORY_LIMIT, MAX_DEADLINE, Policy};
pub use decide::{Decided, Decider};
pub use engine::{EngineConfig, PolicyEngine};
pub use error::PolicyError;
pub use module::{ModuleInfo, PolicyModule};
pub use reporter::{PolicyEvent, PolicyReporter};

/// The version of the `arcwright:policy` WIT package this host implements.
pub const WIT_VERSION: &str = "0.1.0";

/// The three judgement calls a policy can make; one WIT world each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyKind {
    /// How many runners a scale set should have.
    Scaling,
    /// Whether a finished runner still holds a registration, and when to remove it.
    Deregistration,
    /// Whether a runner pod template is acceptable.
    PodValidation,
}

impl PolicyKind {
    /// Every kind, in a stable order.
    pub const ALL: [PolicyKind; 3] = [Self::Scaling, Self::Deregistration, Self::PodValidation];

    /// The name used in YAML, labels and the WIT interface (`pod-validation`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Scaling => "scaling",
            Self::Deregistration => "deregistration",
            Self::PodValidation => "pod-validation",
        }
    }

    /// The WIT world a component of this kind implements.
    pub fn world(self) -> &'static str {
        match self {
            Self::Scaling => "scaling-policy",
            Self::Deregistration => "deregistration-policy",
            Self::PodValidation => "pod-validation-policy",
        }
    }

    /// The bundled policy used when nothing else is configured and whenever a
    /// configured policy fails: ARC's formula for scaling, seed 000's
    /// self-deregistration rule, the churn checks for pod templates.
    pub fn default_builtin(self) -> &'static str {
        match self {
            Self::Scaling => "default",
            Self::Deregistration => "exit-code",
            Self::PodValidation => "default",
        }
    }

    /// Parses the name used in YAML and on the command line.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.as_str() == name)
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
