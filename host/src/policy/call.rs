//! A module bound to its settings and limits, and the bounded call itself.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use wasmtime::{ResourceLimiter, Store, Trap};

use super::bindings::{HostState, deregistration, pod_validation, scaling};
use super::engine::CallPermit;
use super::module::Pre;
use super::types::{
    Decision, DeregistrationDecision, PodValidationDecision, PodValidationInput, RunnerEnding,
    RunnerPhase, ScalingDecision, ScalingInput, Verdict, Violation, from_json,
};
use super::{PolicyError, PolicyKind, PolicyModule};

/// The deadline of a call unless the policy reference sets one.
pub const DEFAULT_DEADLINE: Duration = Duration::from_millis(50);
/// The shortest deadline a policy may ask for; below it the epoch tick
/// itself would be most of the budget.
pub const MIN_DEADLINE: Duration = Duration::from_millis(10);
/// The longest deadline a policy may ask for. Decisions sit on the
/// reconcile path; a policy that needs more than a second is doing I/O-like
/// work it has no business doing.
pub const MAX_DEADLINE: Duration = Duration::from_secs(1);
/// The memory cap of a call unless the policy reference sets one.
pub const DEFAULT_MEMORY_LIMIT: usize = 16 * 1024 * 1024;
/// The smallest memory cap: a guest's initial memory holds its stack (1 MiB
/// for Rust unless linked smaller) and static data before it allocates.
pub const MIN_MEMORY_LIMIT: usize = 2 * 1024 * 1024;
/// The largest memory cap, also the pooling allocator's per-memory maximum.
pub const MAX_MEMORY_LIMIT: usize = 64 * 1024 * 1024;

/// The longest `reason` or error message accepted from a policy. Reasons go
/// into status conditions and events, which the API server caps too.
pub const MAX_TEXT: usize = 4 * 1024;
/// The largest state blob a scaling policy may return (the WIT contract).
pub const MAX_STATE: usize = 64 * 1024;
/// The most violations a pod-validation policy may return.
pub const MAX_VIOLATIONS: usize = 256;

/// How many bytes of strings and lists the host copies out of a guest in one
/// crossing: a decision's answer, or one `log` call.
///
/// The caps above are checked on the copy the host already made, and
/// wasmtime's own default allows 128 MiB per crossing, outside the memory
/// cap and the deadline. A guest can return hundreds of list entries that all
/// point at one large string, and each is copied separately: without this
/// budget one decision could make the host allocate over 100 MiB, and every
/// reconcile would do it again. The largest honest answer is
/// `MAX_VIOLATIONS` entries of two `MAX_TEXT` strings (2 MiB) or a
/// `MAX_STATE` blob with a `MAX_TEXT` reason; this leaves room for both.
pub const MAX_CROSSING_BYTES: usize = 3 * 1024 * 1024;

/// What wasmtime says when a crossing exceeds [`MAX_CROSSING_BYTES`].
const CROSSING_EXHAUSTED: &str = "fuel allocated for hostcalls has been exhausted";

/// The bounds of one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallLimits {
    /// Wall-clock budget of one call, from instantiation to answer.
    pub deadline: Duration,
    /// Cap on the guest's linear memory, in bytes.
    pub memory: usize,
}

impl Default for CallLimits {
    fn default() -> Self {
        Self {
            deadline: DEFAULT_DEADLINE,
            memory: DEFAULT_MEMORY_LIMIT,
        }
    }
}

impl CallLimits {
    /// Checks the limits against the host's bounds.
    pub fn validate(&self) -> Result<(), PolicyError> {
        let millis = u64::try_from(self.deadline.as_millis()).unwrap_or(u64::MAX);
        let (min, max) = (
            MIN_DEADLINE.as_millis() as u64,
            MAX_DEADLINE.as_millis() as u64,
        );
        if !(min..=max).contains(&millis) {
            return Err(PolicyError::LimitOutOfRange {
                what: "the deadline in milliseconds",
                value: millis,
                min,
                max,
            });
        }
        if !(MIN_MEMORY_LIMIT..=MAX_MEMORY_LIMIT).contains(&self.memory) {
            return Err(PolicyError::LimitOutOfRange {
                what: "the memory limit in bytes",
                value: self.memory as u64,
                min: MIN_MEMORY_LIMIT as u64,
                max: MAX_MEMORY_LIMIT as u64,
            });
        }
        Ok(())
    }
}

/// A policy ready to decide: a module, its validated settings and its limits.
///
/// Every call instantiates the module in a fresh `Store` and drops it
/// afterwards, so calls for different objects share nothing and a trap
/// leaves nothing behind. Cheap to share behind an `Arc`.
pub struct Policy {
    module: Arc<PolicyModule>,
    label: String,
    settings: String,
    limits: CallLimits,
}

impl fmt::Debug for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Policy")
            .field("label", &self.label)
            .field("sha256", &self.module.sha256())
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl Policy {
    /// Binds `module` to `settings` (any JSON value, `None` for none) and
    /// `limits`, running the policy's `validate-settings` first. Blocks the
    /// current thread; see [`Policy::configure`] for async code.
    pub fn new(
        module: Arc<PolicyModule>,
        label: impl Into<String>,
        settings: Option<&serde_json::Value>,
        limits: CallLimits,
    ) -> Result<Self, PolicyError> {
        let permit = module.engine.permit_blocking();
        Self::new_with(&permit, module, label.into(), settings, limits)
    }

    /// [`Policy::new`] on the blocking pool.
    pub async fn configure(
        module: Arc<PolicyModule>,
        label: impl Into<String>,
        settings: Option<serde_json::Value>,
        limits: CallLimits,
    ) -> Result<Self, PolicyError> {
        let engine = module.engine.clone();
        let label = label.into();
        engine
            .spawn(move |permit| Self::new_with(permit, module, label, settings.as_ref(), limits))
            .await?
    }

    pub(crate) fn new_with(
        permit: &CallPermit,
        module: Arc<PolicyModule>,
        label: String,
        settings: Option<&serde_json::Value>,
        limits: CallLimits,
    ) -> Result<Self, PolicyError> {
        limits.validate()?;
        let settings = match settings {
            None | Some(serde_json::Value::Null) => String::new(),
            Some(value) => serde_json::to_string(value)
                .map_err(|e| PolicyError::SettingsEncoding(e.to_string()))?,
        };
        let policy = Self {
            module,
            label,
            settings,
            limits,
        };
        policy.validate_settings(permit)?;
        Ok(policy)
    }

    /// A policy with no settings whose `validate-settings` has not run: the
    /// suites call `validate-settings` only for cases that give settings.
    pub(crate) fn unvalidated(
        module: Arc<PolicyModule>,
        label: impl Into<String>,
        limits: CallLimits,
    ) -> Self {
        Self {
            module,
            label: label.into(),
            settings: String::new(),
            limits,
        }
    }

    /// The module this policy runs.
    pub fn module(&self) -> &Arc<PolicyModule> {
        &self.module
    }

    /// The label used in logs, metrics and events (`builtin:default`,
    /// `configmap:ns/name`).
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The kind of decision this policy makes.
    pub fn kind(&self) -> PolicyKind {
        self.module.kind()
    }

    /// The limits of each call.
    pub fn limits(&self) -> CallLimits {
        self.limits
    }

    /// A scaling decision, clamped to `maxRunners`. Blocks the current thread.
    pub fn scaling(&self, input: &ScalingInput) -> Result<ScalingDecision, PolicyError> {
        self.scaling_with(&self.module.engine.permit_blocking(), input)
    }

    /// A deregistration decision. Blocks the current thread.
    pub fn deregistration(
        &self,
        input: &RunnerEnding,
    ) -> Result<DeregistrationDecision, PolicyError> {
        self.deregistration_with(&self.module.engine.permit_blocking(), input)
    }

    /// A pod-validation decision. Blocks the current thread.
    pub fn pod_validation(
        &self,
        input: &PodValidationInput,
    ) -> Result<PodValidationDecision, PolicyError> {
        self.pod_validation_with(&self.module.engine.permit_blocking(), input)
    }

    /// Any kind's decision from the JSON form of its input (the CLI and the
    /// suites). Blocks the current thread.
    pub fn decide_json(&self, input: &serde_json::Value) -> Result<Decision, PolicyError> {
        match self.kind() {
            PolicyKind::Scaling => {
                let input: ScalingInput = from_json(input).map_err(PolicyError::Input)?;
                self.scaling(&input).map(Decision::Scaling)
            }
            PolicyKind::Deregistration => {
                let input: RunnerEnding = from_json(input).map_err(PolicyError::Input)?;
                self.deregistration(&input).map(Decision::Deregistration)
            }
            PolicyKind::PodValidation => {
                let input: PodValidationInput = from_json(input).map_err(PolicyError::Input)?;
                self.pod_validation(&input).map(Decision::PodValidation)
            }
        }
    }

    /// A fresh store with this policy's limits and deadline.
    fn store(&self) -> Store<HostState> {
        let engine = &self.module.engine;
        let mut store = Store::new(
            engine.wasmtime(),
            HostState::new(self.label.clone(), self.limits.memory),
        );
        store.limiter(|state| state as &mut dyn ResourceLimiter);
        store.set_hostcall_fuel(MAX_CROSSING_BYTES);
        // The trap fires when the epoch reaches the deadline; the ticker may
        // be anywhere in its current tick, so one tick is added to make the
        // budget a floor rather than a ceiling.
        let tick = engine.config().epoch_tick.as_nanos().max(1);
        let ticks = self.limits.deadline.as_nanos().div_ceil(tick) + 1;
        store.set_epoch_deadline(u64::try_from(ticks).unwrap_or(u64::MAX));
        store
    }

    /// Maps a wasmtime failure to what happened, using what the limiter saw.
    fn classify(
        &self,
        store: &Store<HostState>,
        err: wasmtime::Error,
        instantiating: bool,
    ) -> PolicyError {
        if let Some(requested) = store.data().memory_denied {
            return PolicyError::MemoryLimit {
                requested,
                limit: self.limits.memory,
            };
        }
        tracing::debug!(policy = %self.label, "policy call failed: {err:?}");
        if err
            .chain()
            .any(|cause| cause.to_string().contains(CROSSING_EXHAUSTED))
        {
            return PolicyError::CrossingTooLarge {
                limit: MAX_CROSSING_BYTES,
            };
        }
        match err.downcast_ref::<Trap>() {
            Some(Trap::Interrupt) => PolicyError::Timeout {
                deadline: self.limits.deadline,
            },
            Some(trap) => PolicyError::Trap(trap.to_string()),
            None if instantiating => PolicyError::Instantiate(first_line(&err)),
            // Lifting the answer failed: bad UTF-8, an out-of-range enum,
            // a pointer outside memory.
            None => PolicyError::InvalidOutput(first_line(&err)),
        }
    }

    fn validate_settings(&self, _permit: &CallPermit) -> Result<(), PolicyError> {
        let mut store = self.store();
        let result = match &self.module.pre {
            Pre::Scaling(pre) => {
                let instance = pre
                    .instantiate(&mut store)
                    .map_err(|e| self.classify(&store, e, true))?;
                instance
                    .arcwright_policy_scaling()
                    .call_validate_settings(&mut store, &self.settings)
            }
            Pre::Deregistration(pre) => {
                let instance = pre
                    .instantiate(&mut store)
                    .map_err(|e| self.classify(&store, e, true))?;
                instance
                    .arcwright_policy_deregistration()
                    .call_validate_settings(&mut store, &self.settings)
            }
            Pre::PodValidation(pre) => {
                let instance = pre
                    .instantiate(&mut store)
                    .map_err(|e| self.classify(&store, e, true))?;
                instance
                    .arcwright_policy_pod_validation()
                    .call_validate_settings(&mut store, &self.settings)
            }
        };
        match result.map_err(|e| self.classify(&store, e, false))? {
            Ok(()) => Ok(()),
            Err(message) => Err(PolicyError::SettingsRejected(checked_text(
                "settings error",
                message,
            )?)),
        }
    }

    pub(crate) fn scaling_with(
        &self,
        permit: &CallPermit,
        input: &ScalingInput,
    ) -> Result<ScalingDecision, PolicyError> {
        let state = input.state.as_ref().map(|s| s.as_bytes().to_vec());
        self.scaling_with_state(permit, input, state)
    }

    /// A scaling decision with the state given as bytes (what the policy
    /// returned last time) instead of `input.state`.
    pub(crate) fn scaling_with_state(
        &self,
        _permit: &CallPermit,
        input: &ScalingInput,
        state: Option<Vec<u8>>,
    ) -> Result<ScalingDecision, PolicyError> {
        use scaling::exports::arcwright::policy::scaling as wit;
        let Pre::Scaling(pre) = &self.module.pre else {
            return Err(self.wrong_kind(PolicyKind::Scaling));
        };
        let wit_input = wit::ScalingInput {
            scale_set: wit::ScaleSet {
                name: input.scale_set.name.clone(),
                namespace: input.scale_set.namespace.clone(),
                min_runners: input.scale_set.min_runners,
                max_runners: input.scale_set.max_runners,
                labels: input.scale_set.labels.clone(),
            },
            statistics: wit::JobStatistics {
                available_jobs: input.statistics.available_jobs,
                acquired_jobs: input.statistics.acquired_jobs,
                assigned_jobs: input.statistics.assigned_jobs,
                running_jobs: input.statistics.running_jobs,
                registered_runners: input.statistics.registered_runners,
                busy_runners: input.statistics.busy_runners,
                idle_runners: input.statistics.idle_runners,
            },
            runners: wit::RunnerCounts {
                pending: input.runners.pending,
                running: input.runners.running,
                busy: input.runners.busy,
                succeeded: input.runners.succeeded,
                failed: input.runners.failed,
                outdated: input.runners.outdated,
                deleting: input.runners.deleting,
            },
            current_desired: input.current_desired,
            now_unix_seconds: input.now_unix_seconds().map_err(PolicyError::Input)?,
            settings: self.settings.clone(),
            state,
        };
        let mut store = self.store();
        let instance = pre
            .instantiate(&mut store)
            .map_err(|e| self.classify(&store, e, true))?;
        let answer = instance
            .arcwright_policy_scaling()
            .call_decide(&mut store, &wit_input)
            .map_err(|e| self.classify(&store, e, false))?;
        drop(store);
        let decision = answer.map_err(|message| match checked_text("error message", message) {
            Ok(message) => PolicyError::Decision(message),
            Err(too_large) => too_large,
        })?;
        if let Some(state) = &decision.state
            && state.len() > MAX_STATE
        {
            return Err(PolicyError::OutputTooLarge {
                what: "state",
                size: state.len(),
                limit: MAX_STATE,
            });
        }
        let reason = checked_text("reason", decision.reason)?;
        let max = input.scale_set.max_runners;
        Ok(ScalingDecision {
            desired: decision.desired.min(max),
            clamped_from: (decision.desired > max).then_some(decision.desired),
            reason,
            state: decision.state,
        })
    }

    pub(crate) fn deregistration_with(
        &self,
        _permit: &CallPermit,
        input: &RunnerEnding,
    ) -> Result<DeregistrationDecision, PolicyError> {
        use deregistration::exports::arcwright::policy::deregistration as wit;
        let Pre::Deregistration(pre) = &self.module.pre else {
            return Err(self.wrong_kind(PolicyKind::Deregistration));
        };
        let wit_input = wit::RunnerEnding {
            name: input.name.clone(),
            namespace: input.namespace.clone(),
            phase: match input.phase {
                RunnerPhase::Pending => wit::RunnerPhase::Pending,
                RunnerPhase::Running => wit::RunnerPhase::Running,
                RunnerPhase::Succeeded => wit::RunnerPhase::Succeeded,
                RunnerPhase::Failed => wit::RunnerPhase::Failed,
                RunnerPhase::Outdated => wit::RunnerPhase::Outdated,
            },
            exit_code: input.exit_code,
            reason: input.reason.clone(),
            had_job: input.had_job,
            registered: input.registered,
            settings: self.settings.clone(),
        };
        let mut store = self.store();
        let instance = pre
            .instantiate(&mut store)
            .map_err(|e| self.classify(&store, e, true))?;
        let answer = instance
            .arcwright_policy_deregistration()
            .call_decide(&mut store, &wit_input)
            .map_err(|e| self.classify(&store, e, false))?;
        drop(store);
        let decision = answer.map_err(|message| match checked_text("error message", message) {
            Ok(message) => PolicyError::Decision(message),
            Err(too_large) => too_large,
        })?;
        Ok(DeregistrationDecision {
            verdict: match decision.verdict {
                wit::Verdict::SelfDeregistered => Verdict::SelfDeregistered,
                wit::Verdict::RemoveNow => Verdict::RemoveNow,
                wit::Verdict::RemoveAfterJob => Verdict::RemoveAfterJob,
            },
            reason: checked_text("reason", decision.reason)?,
        })
    }

    pub(crate) fn pod_validation_with(
        &self,
        _permit: &CallPermit,
        input: &PodValidationInput,
    ) -> Result<PodValidationDecision, PolicyError> {
        use pod_validation::exports::arcwright::policy::pod_validation as wit;
        let Pre::PodValidation(pre) = &self.module.pre else {
            return Err(self.wrong_kind(PolicyKind::PodValidation));
        };
        let wit_input = wit::PodValidationInput {
            template: serde_json::to_string(&input.template)
                .map_err(|e| PolicyError::Input(e.to_string()))?,
            settings: self.settings.clone(),
        };
        let mut store = self.store();
        let instance = pre
            .instantiate(&mut store)
            .map_err(|e| self.classify(&store, e, true))?;
        let answer = instance
            .arcwright_policy_pod_validation()
            .call_validate(&mut store, &wit_input)
            .map_err(|e| self.classify(&store, e, false))?;
        drop(store);
        let violations =
            answer.map_err(|message| match checked_text("error message", message) {
                Ok(message) => PolicyError::Decision(message),
                Err(too_large) => too_large,
            })?;
        if violations.len() > MAX_VIOLATIONS {
            return Err(PolicyError::OutputTooLarge {
                what: "list of violations",
                size: violations.len(),
                limit: MAX_VIOLATIONS,
            });
        }
        let violations = violations
            .into_iter()
            .map(|v| {
                Ok(Violation {
                    path: checked_text("violation path", v.path)?,
                    message: checked_text("violation message", v.message)?,
                })
            })
            .collect::<Result<Vec<_>, PolicyError>>()?;
        Ok(PodValidationDecision { violations })
    }

    fn wrong_kind(&self, expected: PolicyKind) -> PolicyError {
        PolicyError::WrongKind {
            found: self.kind(),
            expected,
        }
    }
}

/// Refuses text longer than [`MAX_TEXT`].
fn checked_text(what: &'static str, text: String) -> Result<String, PolicyError> {
    if text.len() > MAX_TEXT {
        return Err(PolicyError::OutputTooLarge {
            what,
            size: text.len(),
            limit: MAX_TEXT,
        });
    }
    Ok(text)
}

fn first_line(err: &wasmtime::Error) -> String {
    let text = format!("{err:#}");
    text.lines().next().unwrap_or_default().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_bounded() {
        assert!(CallLimits::default().validate().is_ok());
        let too_short = CallLimits {
            deadline: Duration::from_millis(1),
            ..CallLimits::default()
        };
        assert!(matches!(
            too_short.validate(),
            Err(PolicyError::LimitOutOfRange { .. })
        ));
        let too_big = CallLimits {
            memory: 1 << 30,
            ..CallLimits::default()
        };
        let message = too_big.validate().unwrap_err().to_string();
        assert!(message.contains("memory limit"), "{message}");
    }

    #[test]
    fn long_text_is_refused() {
        assert!(checked_text("reason", "x".repeat(MAX_TEXT)).is_ok());
        let err = checked_text("reason", "x".repeat(MAX_TEXT + 1)).unwrap_err();
        assert_eq!(err.reason(), "output-too-large");
    }
}
