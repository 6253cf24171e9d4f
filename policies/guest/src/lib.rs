//! Runtime support shared by arcwright's policy components.
//!
//! Policies are `#![no_std]` on `wasm32-wasip2` so that the component
//! imports nothing: with the standard library linked, a component imports
//! some two dozen WASI interfaces (filesystem, sockets, clocks) whether or
//! not it uses them, and the host would have to stub them out. Without it,
//! the only import a policy can have is the `host` interface of the WIT
//! package, and a sandbox escape through WASI is impossible by construction
//! rather than by configuration.
//!
//! Giving up `std` means each component must bring what `std` would have
//! provided, and this crate is where that lives so every policy gets the
//! same, measured choices:
//!
//! - a global allocator ([`dlmalloc`], the allocator `std` itself uses on
//!   wasm, small and with no start-up work);
//! - a panic handler that traps at once. The host treats any trap as a failed
//!   decision and falls back to the bundled default, so formatting a panic
//!   message that nobody can read would only add code to every component;
//! - the `cabi_realloc` export the component model needs to pass strings and
//!   lists into a guest. `wit-bindgen` provides it only where it expects no
//!   libc (`wasm32-unknown-unknown`, `wasip1`); on `wasip2` it relies on
//!   wasi-libc, which a no_std component does not link.
//!
//! It also holds what every policy does the same way: parsing JSON within
//! the small stack ([`json`]), reading settings ([`settings`]), ARC's
//! scaling formula ([`scaling`]) and the calendar arithmetic of time windows
//! ([`time`]).
//!
//! On the host architecture the crate is ordinary `std` Rust with none of
//! the wasm runtime pieces, so the workspace builds and the pure helpers are
//! unit-tested natively.
#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

pub mod json;
pub mod scaling;
pub mod settings;
pub mod time;

pub use settings::Settings;

#[cfg(target_arch = "wasm32")]
mod wasm {
    /// dlmalloc asks the engine for memory in 64 KiB pages as it needs
    /// them, so an instance that allocates little stays at the few pages its
    /// data and stack need, which keeps a fresh instance cheap.
    #[global_allocator]
    static ALLOCATOR: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

    /// Traps without formatting anything. The host sees
    /// `unreachable` and reports the policy as failed; a message could not
    /// reach it anyway, as a trap carries none.
    #[panic_handler]
    fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
        core::arch::wasm32::unreachable()
    }

    /// The component model's allocation hook: the host calls it to make room
    /// in the guest's memory for the strings and lists it passes in.
    ///
    /// Same contract as `wit-bindgen`'s own version: a zero-sized request
    /// returns a dangling, aligned pointer, and running out of memory traps
    /// rather than returning null, which the canonical ABI would treat as a
    /// valid address.
    ///
    /// # Safety
    ///
    /// Called by the component model with `(ptr, old_len)` describing a block
    /// this function returned earlier (or `(_, 0)`), and a power-of-two
    /// `align`.
    #[unsafe(no_mangle)]
    pub unsafe extern "C" fn cabi_realloc(
        old_ptr: *mut u8,
        old_len: usize,
        align: usize,
        new_len: usize,
    ) -> *mut u8 {
        use alloc::alloc::{Layout, alloc, realloc};

        if old_len == 0 && new_len == 0 {
            return align as *mut u8;
        }
        // SAFETY: the canonical ABI only passes power-of-two alignments and
        // sizes that fit the 32-bit address space, and (old_ptr, old_len)
        // always describes a block this allocator handed out.
        let ptr = unsafe {
            if old_len == 0 {
                alloc(Layout::from_size_align_unchecked(new_len, align))
            } else {
                realloc(
                    old_ptr,
                    Layout::from_size_align_unchecked(old_len, align),
                    new_len,
                )
            }
        };
        if ptr.is_null() {
            core::arch::wasm32::unreachable();
        }
        ptr
    }

    /// `memcmp` for the compiler's slice and string comparisons.
    ///
    /// `std` on `wasip2` gets it from wasi-libc and the toolchain's
    /// `compiler_builtins` therefore leaves it out; without this a component
    /// would import it from `env` and fail to link. (`memcpy` and `memset`
    /// are not needed: the target enables bulk memory, so they compile to
    /// `memory.copy` and `memory.fill`.)
    ///
    /// # Safety
    ///
    /// `a` and `b` are valid for reads of `n` bytes.
    #[unsafe(no_mangle)]
    pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
        let mut i = 0;
        while i < n {
            // SAFETY: i < n and both pointers are valid for n bytes.
            let (x, y) = unsafe { (*a.add(i), *b.add(i)) };
            if x != y {
                return i32::from(x) - i32::from(y);
            }
            i += 1;
        }
        0
    }

    /// `bcmp` is `memcmp` where only equality matters; LLVM emits it for
    /// `==` on slices.
    ///
    /// # Safety
    ///
    /// As for [`memcmp`].
    #[unsafe(no_mangle)]
    pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
        // SAFETY: same contract.
        unsafe { memcmp(a, b, n) }
    }
}
