//! Readiness: `/readyz` answers 200 only once every component has said it
//! is ready (its caches synced, its first list done).
//!
//! Each component gets one [`ReadinessGate`] when it is added, before it
//! starts, so a component that is slow to start holds readiness back from
//! the first request on instead of being missed until it registers. A
//! component with nothing to wait for opens its gate at once. When shutdown
//! begins every gate is overridden: the process says it is not ready, so a
//! Service stops sending it work while it drains.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// The readiness of the whole process: every gate handed out.
#[derive(Clone, Debug, Default)]
pub struct Readiness {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    gates: Mutex<Vec<(String, Arc<AtomicBool>)>>,
    shutting_down: AtomicBool,
}

/// One component's say in readiness; closed until the component opens it.
/// Clones share the gate.
#[derive(Clone, Debug)]
pub struct ReadinessGate {
    open: Arc<AtomicBool>,
}

impl ReadinessGate {
    /// Says the component is ready: its caches are synced.
    pub fn ready(&self) {
        self.open.store(true, Ordering::Release);
    }

    /// Says the component is not ready (again), e.g. while a watch it needs
    /// is being re-established from scratch.
    pub fn not_ready(&self) {
        self.open.store(false, Ordering::Release);
    }

    /// Whether the gate is open.
    pub fn is_ready(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }
}

/// What `/readyz` answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every component is ready.
    Ready,
    /// These components are not ready yet, in the order they were added.
    Waiting(Vec<String>),
    /// Shutdown has begun.
    ShuttingDown,
}

impl Verdict {
    /// The verdict for gates in the order they were added.
    pub fn of<'a>(shutting_down: bool, gates: impl IntoIterator<Item = (&'a str, bool)>) -> Self {
        if shutting_down {
            return Self::ShuttingDown;
        }
        let waiting: Vec<String> = gates
            .into_iter()
            .filter(|(_, ready)| !ready)
            .map(|(name, _)| name.to_owned())
            .collect();
        if waiting.is_empty() {
            Self::Ready
        } else {
            Self::Waiting(waiting)
        }
    }
}

impl Readiness {
    /// Adds a closed gate for the component `name`.
    pub fn gate(&self, name: &str) -> ReadinessGate {
        let open = Arc::new(AtomicBool::new(false));
        self.inner
            .gates
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((name.to_owned(), Arc::clone(&open)));
        ReadinessGate { open }
    }

    /// From now on the process is not ready, whatever the gates say.
    pub fn shutting_down(&self) {
        self.inner.shutting_down.store(true, Ordering::Release);
    }

    /// What `/readyz` answers now.
    pub fn verdict(&self) -> Verdict {
        let gates = self
            .inner
            .gates
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Verdict::of(
            self.inner.shutting_down.load(Ordering::Acquire),
            gates
                .iter()
                .map(|(name, open)| (name.as_str(), open.load(Ordering::Acquire))),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verdict_names_every_component_not_ready() {
        type Gates = &'static [(&'static str, bool)];
        let cases: &[(bool, Gates, Verdict)] = &[
            (false, &[], Verdict::Ready),
            (false, &[("a", true), ("b", true)], Verdict::Ready),
            (
                false,
                &[("a", false), ("b", true), ("c", false)],
                Verdict::Waiting(vec!["a".into(), "c".into()]),
            ),
            (true, &[("a", true)], Verdict::ShuttingDown),
            (true, &[("a", false)], Verdict::ShuttingDown),
        ];
        for (shutting_down, gates, want) in cases {
            assert_eq!(
                &Verdict::of(*shutting_down, gates.iter().copied()),
                want,
                "{gates:?}"
            );
        }
    }

    #[test]
    fn a_gate_is_closed_until_opened_and_can_close_again() {
        let readiness = Readiness::default();
        let gate = readiness.gate("cache");
        assert_eq!(readiness.verdict(), Verdict::Waiting(vec!["cache".into()]));
        gate.clone().ready();
        assert_eq!(readiness.verdict(), Verdict::Ready);
        gate.not_ready();
        assert!(!gate.is_ready());
        assert_eq!(readiness.verdict(), Verdict::Waiting(vec!["cache".into()]));
        gate.ready();
        readiness.shutting_down();
        assert_eq!(readiness.verdict(), Verdict::ShuttingDown);
    }
}
