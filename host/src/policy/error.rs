//! The one error type of the policy layer.

use std::time::Duration;

use super::PolicyKind;

/// Why loading, configuring or calling a policy failed.
///
/// Each variant reads as a sentence an admin can act on, and
/// [`PolicyError::reason`] maps it to the short label used in
/// `arcwright_policy_failures_total{reason}` and in events. Messages name
/// sizes, digests and versions but never echo the module's bytes or the
/// input, so nothing a policy was handed leaks into logs through an error.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The bytes do not start with the WebAssembly magic number.
    #[error("the module is not a WebAssembly binary (it does not start with \\0asm)")]
    NotWebAssembly,
    /// A core module was given where a component is required.
    #[error(
        "the module is a core WebAssembly module, not a component; build it for wasm32-wasip2 \
         (or wrap it with `wasm-tools component new`)"
    )]
    CoreModule,
    /// The module is larger than the loader accepts.
    #[error("the module is {size} bytes, above the limit of {limit} bytes")]
    TooLarge {
        /// Size of the module in bytes.
        size: usize,
        /// The accepted maximum.
        limit: usize,
    },
    /// The module's sha256 differs from the pin in the policy reference.
    #[error("the module's sha256 is {actual}, but the policy reference pins {expected}")]
    DigestMismatch {
        /// The pinned digest.
        expected: String,
        /// The digest of the bytes found.
        actual: String,
    },
    /// wasmtime could not compile or validate the component.
    #[error("the component could not be compiled: {0}")]
    Compile(String),
    /// The component imports something other than the policy host interface.
    #[error(
        "the component imports {}, but a policy may import nothing but arcwright:policy/host@{}: \
         no filesystem, network, environment or clock is linked",
        .forbidden.join(", "), super::WIT_VERSION
    )]
    ForbiddenImports {
        /// Every import outside the allow-list.
        forbidden: Vec<String>,
    },
    /// The component was built against another version of the WIT package.
    #[error(
        "the component was built for {found}, but this arcwright speaks version {expected} of \
         arcwright:policy; rebuild it against wit/policy.wit of this release"
    )]
    WitVersionMismatch {
        /// The interface the component exports, with its version.
        found: String,
        /// The version of the package this host implements.
        expected: String,
    },
    /// The component exports none of the policy interfaces.
    #[error(
        "the component exports no arcwright policy interface (it exports: {}); a policy exports \
         one of arcwright:policy/scaling, deregistration or pod-validation",
        if .exports.is_empty() { "nothing".to_string() } else { .exports.join(", ") }
    )]
    NotAPolicy {
        /// What the component exports instead.
        exports: Vec<String>,
    },
    /// The component is a policy of another kind than the one asked for.
    #[error("the component is a {found} policy, but a {expected} policy is required here")]
    WrongKind {
        /// The kind the component implements.
        found: PolicyKind,
        /// The kind the reference asked for.
        expected: PolicyKind,
    },
    /// The exported interface does not have the functions and types of the contract.
    #[error("the component's {kind} export does not match the contract: {message}")]
    Contract {
        /// The kind whose interface is malformed.
        kind: PolicyKind,
        /// wasmtime's type-check message.
        message: String,
    },
    /// No bundled policy has this name for this kind.
    #[error("there is no bundled {kind} policy named {name:?} (bundled: {})", .available.join(", "))]
    UnknownBuiltin {
        /// The kind asked for.
        kind: PolicyKind,
        /// The name asked for.
        name: String,
        /// The bundled names of that kind.
        available: Vec<String>,
    },
    /// The settings are not valid JSON, or could not be encoded.
    #[error("the policy settings are not valid JSON: {0}")]
    SettingsEncoding(String),
    /// The policy's `validate-settings` rejected the settings.
    #[error("the policy rejected its settings: {0}")]
    SettingsRejected(String),
    /// A per-policy limit is outside what the host allows.
    #[error("{what} of {value} is outside the allowed range {min}..={max}")]
    LimitOutOfRange {
        /// Which limit.
        what: &'static str,
        /// The requested value.
        value: u64,
        /// The smallest allowed value.
        min: u64,
        /// The largest allowed value.
        max: u64,
    },
    /// The policy ran past its deadline and was interrupted.
    #[error("the policy ran longer than its deadline of {} ms and was stopped", .deadline.as_millis())]
    Timeout {
        /// The deadline that was exceeded.
        deadline: Duration,
    },
    /// The policy tried to grow its memory past its cap.
    #[error(
        "the policy tried to grow its memory to {requested} bytes, above its limit of {limit} bytes"
    )]
    MemoryLimit {
        /// The size it asked for.
        requested: usize,
        /// The cap.
        limit: usize,
    },
    /// The guest trapped (panic, unreachable, stack overflow, bad memory access...).
    #[error("the policy trapped: {0}")]
    Trap(String),
    /// The policy's answer is larger than the host accepts.
    #[error("the policy's {what} is {size} bytes, above the limit of {limit} bytes")]
    OutputTooLarge {
        /// Which part of the answer.
        what: &'static str,
        /// Its size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// The strings and lists the policy handed to the host, counted as they
    /// were copied, went over the per-crossing budget.
    #[error(
        "the policy handed the host more than {limit} bytes of strings and lists in one answer or log call"
    )]
    CrossingTooLarge {
        /// The budget.
        limit: usize,
    },
    /// The policy's answer does not make sense.
    #[error("the policy's answer is invalid: {0}")]
    InvalidOutput(String),
    /// The policy answered with its own error for this input.
    #[error("the policy returned an error: {0}")]
    Decision(String),
    /// The input could not be converted for the policy.
    #[error("the policy input is invalid: {0}")]
    Input(String),
    /// An instance could not be created (pool exhausted, instantiation failure).
    #[error("the policy could not be instantiated: {0}")]
    Instantiate(String),
    /// The policy reference names both a builtin and a ConfigMap, or is malformed.
    #[error("the policy reference is invalid: {0}")]
    InvalidReference(String),
    /// The referenced ConfigMap does not exist.
    #[error("the ConfigMap {namespace}/{name} holding the policy does not exist")]
    ConfigMapMissing {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// The ConfigMap has no binaryData entry under the key.
    #[error("the ConfigMap {name} has no binaryData key {key:?}{hint}")]
    ConfigMapKeyMissing {
        /// The ConfigMap's name.
        name: String,
        /// The key looked for.
        key: String,
        /// What else the ConfigMap holds, for the message.
        hint: String,
    },
    /// The ConfigMap could not be read from the API server.
    #[error("the ConfigMap holding the policy could not be read: {0}")]
    ConfigMapRead(String),
    /// The engine itself could not be configured.
    #[error("the policy engine could not be created: {0}")]
    Engine(String),
    /// The blocking call was cancelled or panicked in its worker thread.
    #[error("the policy call did not complete: {0}")]
    Join(String),
}

impl PolicyError {
    /// Whether the same module, tried again, might load: the failure came
    /// from the machine (a deadline missed under load, a full instance
    /// pool, a lost blocking task) rather than from the module's bytes or
    /// its settings. Everything else fails the same way every time.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::Timeout { .. } | Self::Instantiate(_) | Self::Join(_) | Self::Engine(_)
        )
    }

    /// The short label used for `reason` in metrics and events.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NotWebAssembly | Self::CoreModule | Self::Compile(_) => "invalid-module",
            Self::TooLarge { .. } => "module-too-large",
            Self::DigestMismatch { .. } => "digest-mismatch",
            Self::ForbiddenImports { .. } => "forbidden-imports",
            Self::WitVersionMismatch { .. } => "wit-version",
            Self::NotAPolicy { .. } | Self::WrongKind { .. } | Self::Contract { .. } => {
                "wrong-world"
            }
            Self::UnknownBuiltin { .. } => "unknown-builtin",
            Self::SettingsEncoding(_) | Self::SettingsRejected(_) => "settings",
            Self::LimitOutOfRange { .. } => "limits",
            Self::Timeout { .. } => "timeout",
            Self::MemoryLimit { .. } => "memory",
            Self::Trap(_) => "trap",
            Self::OutputTooLarge { .. } | Self::CrossingTooLarge { .. } => "output-too-large",
            Self::InvalidOutput(_) => "invalid-output",
            Self::Decision(_) => "decision-error",
            Self::Input(_) => "input",
            Self::Instantiate(_) => "instantiate",
            Self::InvalidReference(_) => "invalid-reference",
            Self::ConfigMapMissing { .. } => "configmap-missing",
            Self::ConfigMapKeyMissing { .. } => "configmap-key-missing",
            Self::ConfigMapRead(_) => "configmap-read",
            Self::Engine(_) => "engine",
            Self::Join(_) => "join",
        }
    }
}
