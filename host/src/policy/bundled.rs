//! The policies compiled into the binary, and the paths of every guest
//! artifact the build produced.
//!
//! `host/build.rs` builds each crate under `policies/` that declares
//! `[package.metadata.arcwright]` and generates the two tables below. Tests
//! and benchmarks find guests through [`artifact`] rather than hard-coded
//! paths, so adding a guest crate is what makes it available to them.

use std::path::Path;

use super::{PolicyError, PolicyKind};

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

/// A guest component on disk, by crate name.
#[derive(Clone, Copy, Debug)]
pub struct Artifact {
    /// The kind the crate declares.
    pub kind: PolicyKind,
    /// The crate name, e.g. `policy-test-hostile`.
    pub package: &'static str,
    /// The absolute path of the built component.
    pub path: &'static str,
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

/// The built component of guest crate `package`, if the build produced one.
pub fn artifact(package: &str) -> Option<&'static Path> {
    ARTIFACTS
        .iter()
        .find(|a| a.package == package)
        .map(|a| Path::new(a.path))
}
