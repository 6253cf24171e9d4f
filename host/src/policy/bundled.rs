//! The policies compiled into the binary.
//!
//! `host/build.rs` builds each crate under `policies/` that declares
//! `[package.metadata.arcwright]` with a `builtin` name and generates the
//! table below. Nothing else is here on purpose: the guests only tests run
//! (the template, `policy-test-hostile`, ...) are built by the
//! `arcwright-test-guests` dev-dependency, so the binary carries neither
//! their bytes nor the paths of the machine that built it.

use std::borrow::Cow;

use anyhow::{Context, bail};

use super::{PolicyEngine, PolicyError, PolicyKind, PolicyModule};

/// A policy embedded in the binary, referenced as `builtin: NAME`.
#[derive(Clone, Copy)]
pub struct Builtin {
    /// The kind of decision it makes.
    pub kind: PolicyKind,
    /// The name used in `builtin: NAME`.
    pub name: &'static str,
    /// The guest crate it was built from.
    pub package: &'static str,
    /// The component bytes.
    pub wasm: &'static [u8],
}

impl std::fmt::Debug for Builtin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builtin")
            .field("kind", &self.kind)
            .field("name", &self.name)
            .field("package", &self.package)
            .field("size", &self.wasm.len())
            .finish()
    }
}

include!(concat!(env!("OUT_DIR"), "/guests.rs"));

/// The bundled policy of `kind` named `name`.
pub fn find(kind: PolicyKind, name: &str) -> Result<&'static Builtin, PolicyError> {
    BUILTINS
        .iter()
        .find(|b| b.kind == kind && b.name == name)
        .ok_or_else(|| PolicyError::UnknownBuiltin {
            kind,
            name: name.to_string(),
            available: BUILTINS
                .iter()
                .filter(|b| b.kind == kind)
                .map(|b| b.name.to_string())
                .collect(),
        })
}

/// Every bundled policy named `name`, of any kind (`default` exists for
/// several kinds; callers that know the kind use [`find`]).
pub fn named(name: &str) -> impl Iterator<Item = &'static Builtin> + '_ {
    BUILTINS.iter().filter(move |b| b.name == name)
}

/// Loads a module from a path or `builtin:NAME`, refusing another kind
/// than `kind` when one is given.
pub fn load(
    engine: &PolicyEngine,
    spec: &str,
    kind: Option<PolicyKind>,
) -> anyhow::Result<PolicyModule> {
    let wasm = module_bytes(spec, kind)?;
    engine
        .load(&wasm, kind)
        .with_context(|| format!("loading {spec}"))
}

/// The bytes of a module given as a path or `builtin:NAME`; the kind, when
/// known, picks among bundled policies sharing a name (`builtin:KIND/NAME`
/// says it explicitly).
pub fn module_bytes(spec: &str, kind: Option<PolicyKind>) -> anyhow::Result<Cow<'static, [u8]>> {
    let Some(name) = spec.strip_prefix("builtin:") else {
        return Ok(Cow::Owned(
            std::fs::read(spec).with_context(|| format!("reading {spec}"))?,
        ));
    };
    let builtin = match (name.split_once('/'), kind) {
        (Some((kind, name)), _) => {
            find(
            PolicyKind::parse(kind).ok_or_else(|| {
                anyhow::anyhow!(
                    "{kind:?} is not a kind of policy: expected scaling, deregistration or pod-validation"
                )
            })?,
            name,
        )?
        }
        (None, Some(kind)) => find(kind, name)?,
        (None, None) => {
            let found: Vec<_> = named(name).collect();
            match found.as_slice() {
                [one] => *one,
                [] => bail!(
                    "there is no bundled policy named {name:?} (bundled: {})",
                    BUILTINS
                        .iter()
                        .map(|b| format!("{}/{}", b.kind, b.name))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                several => bail!(
                    "several bundled policies are named {name:?}; say which: {}",
                    several
                        .iter()
                        .map(|b| format!("builtin:{}/{}", b.kind, b.name))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }
        }
    };
    Ok(Cow::Borrowed(builtin.wasm))
}
