//! The policy lab: what a candidate scaling policy would have done on a
//! scale set's own traffic, before it acts. Replay puts every recorded
//! decision input through the candidate; simulate runs a recorded job
//! stream through a model of the scale set under each policy. Both use the
//! production engine, with the limits and fallback `arcwright run` uses, so
//! what an admin sees here is what would run.

pub mod replay;
pub mod simulate;
pub mod workday;

use std::sync::Arc;

use crate::policy::reporter::RecordingReporter;
use crate::policy::{CallLimits, Decider, Policy, PolicyEngine, PolicyKind, bundled};

/// A scaling policy as the lab runs it: `spec` (`builtin:NAME` or a
/// `.wasm` path) with `settings` and `limits`, and the bundled default
/// behind it, as `arcwright run` would configure it for a scale set. Its
/// events (fallbacks, clamps) are kept in memory, not logged: the lab
/// reports them itself.
pub fn candidate(
    engine: &PolicyEngine,
    spec: &str,
    settings: Option<&serde_json::Value>,
    limits: CallLimits,
) -> anyhow::Result<Decider> {
    use anyhow::Context as _;
    let module = Arc::new(bundled::load(engine, spec, Some(PolicyKind::Scaling))?);
    let label = if spec.starts_with("builtin:") {
        spec.to_owned()
    } else {
        format!("file:{spec}")
    };
    let policy = Policy::new(module, label, settings, limits)
        .with_context(|| format!("configuring {spec}"))?;
    let name = PolicyKind::Scaling.default_builtin();
    let fallback = Arc::new(engine.load_builtin(PolicyKind::Scaling, name)?);
    let fallback = Policy::new(
        fallback,
        format!("builtin:{name}"),
        None,
        CallLimits::default(),
    )?;
    Ok(Decider::new(
        Arc::new(policy),
        Arc::new(fallback),
        Arc::new(RecordingReporter::new()),
    ))
}
