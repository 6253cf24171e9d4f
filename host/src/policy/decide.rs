//! The decision point the reconcilers call: the configured policy, with the
//! bundled default behind it.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use arc_swap::ArcSwap;

use super::engine::CallPermit;
use super::metrics::{DecisionLabels, PolicyMetrics};
use super::types::{
    DeregistrationDecision, PodValidationDecision, PodValidationInput, RunnerEnding,
    ScalingDecision, ScalingInput,
};
use super::{Policy, PolicyError, PolicyEvent, PolicyKind, PolicyReporter};

/// A decision and who made it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decided<T> {
    /// The answer.
    pub decision: T,
    /// The label of the policy that answered.
    pub policy: String,
    /// The SHA-256 of the module that answered.
    pub sha256: String,
    /// Why the configured policy did not answer, when the fallback did.
    pub fallback_reason: Option<String>,
    /// For a scaling decision, the state the answering policy was handed
    /// (the input's, or its own kept state): what a recording keeps so a
    /// replay can hand the same.
    pub state_in: Option<Vec<u8>>,
}

/// Decides with the configured policy and falls back to the bundled default.
///
/// The configured policy sits behind an [`ArcSwap`]: the loader swaps a new
/// version in while decisions are running, and each decision uses the
/// version it loaded at its start. A failing policy (trap, timeout, memory,
/// oversized or invalid answer, or its own error) never leaves a reconciler
/// without an answer: the default answers, and the reporter hears why. Only
/// when the default itself fails, which the bundled suites rule out for
/// well-formed input, is an error returned.
///
/// A decider serves one object (one scale set), and for scaling it keeps the
/// state blob the policy returned and hands it back on the next call. The
/// state is tied to the module that wrote it: when a new version is swapped
/// in, or the default answers instead, it is not passed on, because another
/// module cannot be trusted to read it. It lives in memory only, as the WIT
/// contract says. Clones share the policy, the state and the reporter.
///
/// A caller that holds the state itself passes it as `ScalingInput::state`,
/// exactly as `arcwright policy eval` and the suites do, and that state is
/// the one the policy gets; the kept state is used only when the input
/// carries none. So a sequence of decisions gives the same answers here as
/// the same sequence in a suite, whichever side keeps the state.
#[derive(Clone)]
pub struct Decider {
    current: Arc<ArcSwap<Policy>>,
    fallback: Arc<Policy>,
    reporter: Arc<dyn PolicyReporter>,
    metrics: Option<PolicyMetrics>,
    state: Arc<Mutex<Option<KeptState>>>,
    /// Held for the whole of a scaling decision. The state one call returns
    /// must be the state the next call reads: two decisions racing would
    /// both read the same state and the slower one would overwrite the
    /// other's, so a cooldown could forget a scale-up. Calls for one scale
    /// set come from its one listener, so this is almost never contended.
    scaling_turn: Arc<Mutex<()>>,
    /// A shadow's decider: when its policy fails, nothing answers for it
    /// (see [`Decider::alone`]).
    alone: bool,
}

/// A scaling policy's state and the digest of the module that wrote it.
struct KeptState {
    sha256: String,
    bytes: Vec<u8>,
}

impl Decider {
    /// A decider using `current`, with `fallback` (the kind's bundled default)
    /// behind it.
    pub fn new(
        current: Arc<Policy>,
        fallback: Arc<Policy>,
        reporter: Arc<dyn PolicyReporter>,
    ) -> Self {
        Self {
            current: Arc::new(ArcSwap::new(current)),
            fallback,
            reporter,
            metrics: None,
            state: Arc::new(Mutex::new(None)),
            scaling_turn: Arc::new(Mutex::new(())),
            alone: false,
        }
    }

    /// A decider whose policy answers alone: its failures are errors, the
    /// default does not answer for it. A shadow policy's: what it would
    /// have done is the question, and the default's answer in its place
    /// would pass for its own and make a broken candidate look fine.
    pub fn alone(mut self) -> Self {
        self.alone = true;
        self
    }

    /// Also counts decisions and their duration in `metrics`.
    pub fn with_metrics(mut self, metrics: PolicyMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// The policy that decides now.
    pub fn current(&self) -> Arc<Policy> {
        self.current.load_full()
    }

    /// The bundled default behind it.
    pub fn fallback(&self) -> &Arc<Policy> {
        &self.fallback
    }

    /// Swaps in a new version atomically; decisions already running finish
    /// with the old one.
    pub fn swap(&self, policy: Arc<Policy>) {
        self.current.store(policy);
    }

    /// The reporter events go to.
    pub fn reporter(&self) -> &Arc<dyn PolicyReporter> {
        &self.reporter
    }

    /// A scaling decision, off the async workers. The policy gets
    /// `input.state` when given, otherwise the state it returned last time.
    pub async fn scaling(
        &self,
        input: ScalingInput,
    ) -> Result<Decided<ScalingDecision>, PolicyError> {
        let this = self.clone();
        let engine = self.fallback.module().engine.clone();
        engine
            .spawn(move |permit| this.scaling_with(permit, &input))
            .await?
    }

    /// A deregistration decision, off the async workers.
    pub async fn deregistration(
        &self,
        input: RunnerEnding,
    ) -> Result<Decided<DeregistrationDecision>, PolicyError> {
        let this = self.clone();
        let engine = self.fallback.module().engine.clone();
        engine
            .spawn(move |permit| {
                this.decide(permit, |policy, permit| {
                    policy.deregistration_with(permit, &input)
                })
            })
            .await?
    }

    /// A pod-validation decision, off the async workers.
    pub async fn pod_validation(
        &self,
        input: PodValidationInput,
    ) -> Result<Decided<PodValidationDecision>, PolicyError> {
        let this = self.clone();
        let engine = self.fallback.module().engine.clone();
        engine
            .spawn(move |permit| {
                this.decide(permit, |policy, permit| {
                    policy.pod_validation_with(permit, &input)
                })
            })
            .await?
    }

    /// A scaling decision on the current thread (benchmarks, CLI), with the
    /// kept state as in [`Decider::scaling`].
    pub fn scaling_blocking(
        &self,
        input: &ScalingInput,
    ) -> Result<Decided<ScalingDecision>, PolicyError> {
        let permit = self.fallback.module().engine.permit_blocking();
        self.scaling_with(&permit, input)
    }

    fn scaling_with(
        &self,
        permit: &CallPermit,
        input: &ScalingInput,
    ) -> Result<Decided<ScalingDecision>, PolicyError> {
        let _turn = self.scaling_turn.lock().unwrap_or_else(|e| e.into_inner());
        let kept = |sha256: &str| {
            let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            state
                .as_ref()
                .filter(|kept| kept.sha256 == sha256)
                .map(|kept| kept.bytes.clone())
        };
        let given = input.state.as_ref().map(|state| state.as_bytes().to_vec());
        let handed = std::cell::RefCell::new(None);
        let mut decided = self.decide(permit, |policy, permit| {
            let sha256 = policy.module().sha256();
            let state = given.clone().or_else(|| kept(sha256));
            handed.replace(state.clone());
            let decision = policy.scaling_with_state(permit, input, state)?;
            // Only the configured policy's state is kept: the default
            // answering for a failed policy must not overwrite it.
            if !Arc::ptr_eq(policy, &self.fallback) || Arc::ptr_eq(&self.current(), &self.fallback)
            {
                let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
                *state = decision.state.clone().map(|bytes| KeptState {
                    sha256: sha256.to_string(),
                    bytes,
                });
            }
            Ok(decision)
        })?;
        decided.state_in = handed.into_inner();
        if let Some(requested) = decided.decision.clamped_from {
            self.reporter.report(
                PolicyKind::Scaling,
                &decided.policy,
                PolicyEvent::Clamped {
                    requested,
                    max: decided.decision.desired,
                },
            );
        }
        Ok(decided)
    }

    fn decide<T>(
        &self,
        permit: &CallPermit,
        call: impl Fn(&Arc<Policy>, &CallPermit) -> Result<T, PolicyError>,
    ) -> Result<Decided<T>, PolicyError> {
        let policy = self.current.load_full();
        let started = Instant::now();
        let result = call(&policy, permit);
        self.observe(&policy, started);
        let error = match result {
            Ok(decision) => {
                return Ok(Decided {
                    decision,
                    policy: policy.label().to_string(),
                    sha256: policy.module().sha256().to_string(),
                    fallback_reason: None,
                    state_in: None,
                });
            }
            Err(error) => error,
        };
        let is_fallback = Arc::ptr_eq(&policy, &self.fallback);
        if !is_fallback && !self.alone {
            self.reporter.report(
                policy.kind(),
                policy.label(),
                PolicyEvent::Fallback {
                    reason: error.reason().to_string(),
                    message: error.to_string(),
                    fallback: self.fallback.label().to_string(),
                },
            );
        }
        if is_fallback || self.alone {
            return Err(error);
        }
        let started = Instant::now();
        let decision = call(&self.fallback, permit)?;
        self.observe(&self.fallback, started);
        Ok(Decided {
            decision,
            policy: self.fallback.label().to_string(),
            sha256: self.fallback.module().sha256().to_string(),
            fallback_reason: Some(error.to_string()),
            state_in: None,
        })
    }

    fn observe(&self, policy: &Policy, started: Instant) {
        if let Some(metrics) = &self.metrics {
            let labels = DecisionLabels {
                kind: policy.kind().as_str().to_string(),
                policy: policy.label().to_string(),
            };
            metrics.decisions.get_or_create(&labels).inc();
            metrics
                .duration
                .get_or_create(&labels)
                .observe(started.elapsed().as_secs_f64());
        }
    }
}
