//! A loaded, checked and pre-instantiated policy component.

use std::fmt;

use wasmtime::component::Component;
use wasmtime::component::types::ComponentItem;

use super::bindings::{deregistration, pod_validation, scaling};
use super::{PolicyEngine, PolicyError, PolicyKind, WIT_VERSION};

/// The one interface a policy may import, without its version.
const HOST_INTERFACE: &str = "arcwright:policy/host";

/// What `arcwright policy inspect` shows, and what the loader reports.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ModuleInfo {
    /// The kind of decision the component makes.
    pub kind: PolicyKind,
    /// The WIT world it implements.
    pub world: String,
    /// Lower-case hex sha256 of the module bytes.
    pub sha256: String,
    /// Size of the module in bytes.
    pub size: usize,
    /// Every export of the component (interfaces with their functions).
    pub exports: Vec<String>,
    /// Every import of the component (at most the host interface).
    pub imports: Vec<String>,
}

/// The typed pre-instance of one world: imports resolved and export indices
/// looked up once, so a call only allocates and initialises.
pub(crate) enum Pre {
    Scaling(scaling::ScalingPolicyPre<super::bindings::HostState>),
    Deregistration(deregistration::DeregistrationPolicyPre<super::bindings::HostState>),
    PodValidation(pod_validation::PodValidationPolicyPre<super::bindings::HostState>),
}

/// A policy component that passed every load-time check and is ready to be
/// instantiated per call.
pub struct PolicyModule {
    pub(crate) engine: PolicyEngine,
    pub(crate) pre: Pre,
    info: ModuleInfo,
}

impl fmt::Debug for PolicyModule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PolicyModule")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

impl PolicyModule {
    pub(crate) fn new(
        engine: PolicyEngine,
        component: Component,
        sha256: String,
        size: usize,
        expected: Option<PolicyKind>,
    ) -> Result<Self, PolicyError> {
        let wasmtime = engine.wasmtime();
        let ty = component.component_type();
        let imports: Vec<String> = ty
            .imports(wasmtime)
            .map(|(name, _)| name.to_string())
            .collect();
        check_imports(&imports)?;

        let mut exports = Vec::new();
        let mut interfaces = Vec::new();
        for (name, item) in ty.exports(wasmtime) {
            interfaces.push(name.to_string());
            match item.ty {
                ComponentItem::ComponentInstance(instance) => {
                    for (func, _) in instance.exports(wasmtime) {
                        exports.push(format!("{name}#{func}"));
                    }
                }
                _ => exports.push(name.to_string()),
            }
        }
        let kind = kind_of(&interfaces)?;
        if let Some(expected) = expected
            && expected != kind
        {
            return Err(PolicyError::WrongKind {
                found: kind,
                expected,
            });
        }

        let contract = |e: wasmtime::Error| PolicyError::Contract {
            kind,
            message: format!("{e:#}"),
        };
        let instance_pre = engine
            .linker()
            .instantiate_pre(&component)
            .map_err(contract)?;
        let pre = match kind {
            PolicyKind::Scaling => {
                Pre::Scaling(scaling::ScalingPolicyPre::new(instance_pre).map_err(contract)?)
            }
            PolicyKind::Deregistration => Pre::Deregistration(
                deregistration::DeregistrationPolicyPre::new(instance_pre).map_err(contract)?,
            ),
            PolicyKind::PodValidation => Pre::PodValidation(
                pod_validation::PodValidationPolicyPre::new(instance_pre).map_err(contract)?,
            ),
        };
        Ok(Self {
            engine,
            pre,
            info: ModuleInfo {
                kind,
                world: format!("arcwright:policy/{}@{WIT_VERSION}", kind.world()),
                sha256,
                size,
                exports,
                imports,
            },
        })
    }

    /// What the module is.
    pub fn info(&self) -> &ModuleInfo {
        &self.info
    }

    /// The kind of decision the module makes.
    pub fn kind(&self) -> PolicyKind {
        self.info.kind
    }

    /// Lower-case hex sha256 of the module bytes.
    pub fn sha256(&self) -> &str {
        &self.info.sha256
    }
}

/// Splits `ns:pkg/iface@version` into (`ns:pkg/iface`, version).
fn split_version(name: &str) -> (&str, Option<&str>) {
    match name.split_once('@') {
        Some((base, version)) => (base, Some(version)),
        None => (name, None),
    }
}

/// Allows only `arcwright:policy/host` of this package version.
fn check_imports(imports: &[String]) -> Result<(), PolicyError> {
    let mut forbidden = Vec::new();
    for import in imports {
        match split_version(import) {
            (HOST_INTERFACE, Some(WIT_VERSION)) => {}
            (HOST_INTERFACE, version) => {
                return Err(PolicyError::WitVersionMismatch {
                    found: format!("{HOST_INTERFACE}@{}", version.unwrap_or("(no version)")),
                    expected: WIT_VERSION.to_string(),
                });
            }
            _ => forbidden.push(import.clone()),
        }
    }
    if forbidden.is_empty() {
        Ok(())
    } else {
        Err(PolicyError::ForbiddenImports { forbidden })
    }
}

/// Finds which policy interface the component exports, refusing other
/// versions of the package by name.
fn kind_of(exports: &[String]) -> Result<PolicyKind, PolicyError> {
    for export in exports {
        let (base, version) = split_version(export);
        let Some(interface) = base.strip_prefix("arcwright:policy/") else {
            continue;
        };
        let Some(kind) = PolicyKind::parse(interface) else {
            continue;
        };
        if version != Some(WIT_VERSION) {
            return Err(PolicyError::WitVersionMismatch {
                found: export.clone(),
                expected: WIT_VERSION.to_string(),
            });
        }
        return Ok(kind);
    }
    Err(PolicyError::NotAPolicy {
        exports: exports.to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn only_the_host_interface_may_be_imported() {
        assert!(check_imports(&[]).is_ok());
        assert!(check_imports(&names(&["arcwright:policy/host@0.1.0"])).is_ok());
        let err = check_imports(&names(&[
            "arcwright:policy/host@0.1.0",
            "wasi:filesystem/preopens@0.2.6",
            "wasi:sockets/tcp@0.2.6",
        ]))
        .unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains("wasi:filesystem/preopens@0.2.6, wasi:sockets/tcp@0.2.6"),
            "{message}"
        );
        assert_eq!(err.reason(), "forbidden-imports");
    }

    #[test]
    fn another_package_version_is_named_in_the_refusal() {
        let err = kind_of(&names(&["arcwright:policy/scaling@0.2.0"])).unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains("arcwright:policy/scaling@0.2.0"),
            "{message}"
        );
        assert!(message.contains("0.1.0"), "{message}");
        let err = check_imports(&names(&["arcwright:policy/host@0.3.0"])).unwrap_err();
        assert!(matches!(err, PolicyError::WitVersionMismatch { .. }));
    }

    #[test]
    fn the_world_is_found_from_the_exports() {
        assert_eq!(
            kind_of(&names(&["arcwright:policy/pod-validation@0.1.0"])).unwrap(),
            PolicyKind::PodValidation
        );
        assert_eq!(
            kind_of(&names(&[
                "other:thing/x",
                "arcwright:policy/deregistration@0.1.0"
            ]))
            .unwrap(),
            PolicyKind::Deregistration
        );
        let err = kind_of(&names(&["wasi:cli/run@0.2.6"])).unwrap_err();
        assert!(err.to_string().contains("wasi:cli/run@0.2.6"));
    }
}
