//! The policy guests that arcwright's tests and benchmarks run but its
//! binary does not bundle: the template, the guests that misbehave on
//! purpose (`policy-test-hostile`, `policy-test-wasi`), the benchmarks'
//! floor (`policy-test-empty`), and any other guest in the workspace without
//! a `builtin` name.
//!
//! The build script compiles them when a test needs them, that is when this
//! crate (a dev-dependency of `arcwright`) is built, so a production build
//! neither compiles them nor embeds their bytes or paths. Tests find a guest
//! by package name here rather than by a hard-coded path, so adding a guest
//! crate is what makes it available to them (wasmtime's `test-programs` do
//! the same). The bundled policies are in `arcwright::policy::bundled`.
//!
//! ```no_run
//! let wasm = arcwright_test_guests::wasm("policy-test-hostile");
//! assert!(wasm.starts_with(b"\0asm"));
//! ```

use std::path::Path;

/// A guest built for the tests.
#[derive(Clone, Copy, Debug)]
pub struct Guest {
    /// The crate name, e.g. `policy-test-hostile`.
    pub package: &'static str,
    /// The kind the crate declares: `scaling`, `deregistration` or
    /// `pod-validation`.
    pub kind: &'static str,
    /// The path of the built component.
    pub path: &'static str,
}

include!(concat!(env!("OUT_DIR"), "/guests.rs"));

/// Every guest built for the tests, by package name.
pub fn all() -> &'static [Guest] {
    GUESTS
}

/// The built component of guest crate `package`, if it is one of these.
pub fn path(package: &str) -> Option<&'static Path> {
    GUESTS
        .iter()
        .find(|guest| guest.package == package)
        .map(|guest| Path::new(guest.path))
}

/// The bytes of guest crate `package`.
///
/// # Panics
///
/// When `package` is not a guest built for the tests (a bundled policy is
/// in `arcwright::policy::bundled`), or its component cannot be read.
pub fn wasm(package: &str) -> Vec<u8> {
    let path = path(package).unwrap_or_else(|| {
        panic!(
            "{package} is not a test guest; these are: {:?}",
            GUESTS.iter().map(|g| g.package).collect::<Vec<_>>()
        )
    });
    std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}
