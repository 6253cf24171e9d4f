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
//! It also holds what every policy does the same way, so that a policy is
//! its decision and little else:
//!
//! | helper | what it is for |
//! |---|---|
//! | [`Settings`] | parse the settings text once, refusing unknown keys; typed getters ([`Settings::u32_up_to`], [`Settings::i64_between`], [`Settings::bool`], [`Settings::list`]) whose errors name the key |
//! | [`settings::whole_number`], [`settings::describe`], [`settings::unknown_key`] | the same messages for nested settings (`windows[0].minRunners`) |
//! | [`scaling::Demand`] | ARC's formula, `min(minRunners + assignedJobs, maxRunners)`, in 64 bits, with [`Demand::explain`](scaling::Demand::explain) for the `reason` |
//! | [`time::LocalTime`] | weekday and minute of day from the input's `now-unix-seconds` and a fixed UTC offset |
//! | [`time::parse_hh_mm`], [`time::format_hh_mm`] | `"08:30"` to minutes since midnight and back |
//! | [`json::parse`] | JSON text to a [`serde_json::Value`] without overflowing the 32 KiB stack |
//!
//! A scaling policy's decision with them, in full:
//!
//! ```
//! use arcwright_guest::Settings;
//! use arcwright_guest::scaling::Demand;
//! use arcwright_guest::time::LocalTime;
//!
//! /// At least `nightly` runners from 22:00 UTC, otherwise ARC's formula.
//! fn desired(settings: &str, min: u32, assigned: u32, max: u32, now: i64)
//!     -> Result<(u32, String), String>
//! {
//!     let settings = Settings::parse(settings, &["nightly"])?;
//!     let nightly = settings.u32_up_to("nightly", 1000)?.unwrap_or(0);
//!     let at_night = LocalTime::at(now, 0).minute >= 22 * 60;
//!     let floor = if at_night { min.max(nightly) } else { min };
//!     let demand = Demand::new(floor, assigned, max);
//!     Ok((demand.desired, demand.explain()))
//! }
//!
//! // 2026-11-30 was a Monday; 23:00 UTC is night.
//! let night = 1_796_083_200 - 3600;
//! assert_eq!(
//!     desired(r#"{"nightly": 3}"#, 1, 1, 10, night),
//!     Ok((4, "minRunners 3 + assignedJobs 1 = 4".to_string()))
//! );
//! assert_eq!(
//!     desired(r#"{"nighty": 3}"#, 1, 1, 10, night),
//!     Err("unknown setting `nighty`: accepted keys are nightly".to_string())
//! );
//! ```
//!
//! On the host architecture the crate is ordinary `std` Rust with none of
//! the wasm runtime pieces, so the workspace builds, the pure helpers are
//! unit-tested natively, and a policy's own `cargo test` runs its logic with
//! them.
#![cfg_attr(target_arch = "wasm32", no_std)]
#![deny(missing_docs)]

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
