//! The idem guard.
//!
//! The decision logic lives in plain modules ([`decide`], [`guard`],
//! [`limits`], [`fingerprint`]) over plain types ([`model`]); on
//! `wasm32` this file adds the generated bindings, `export!` and the
//! conversions between the two ([`wit_conversions!`], which the host
//! expands over its own bindings too), and nothing else.

#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

mod conversions;
pub mod decide;
pub mod fingerprint;
pub mod guard;
pub mod limits;
pub mod model;

/// Invariant checks for the fuzz targets (cargo-fuzz builds with
/// `--cfg fuzzing`) and their regression test; not part of the library.
#[cfg(all(any(test, fuzzing), not(target_arch = "wasm32")))]
pub mod fuzzing;

#[cfg(target_arch = "wasm32")]
#[global_allocator]
static ALLOCATOR: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

/// A panic is a bug in the guard: trap, and the host answers unavailable.
#[cfg(target_arch = "wasm32")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    core::arch::wasm32::unreachable()
}

/// Without std there is no libc: the routines the compiler and the canonical
/// ABI expect from it that `compiler_builtins` does not provide on this target.
#[cfg(target_arch = "wasm32")]
#[allow(unsafe_code)]
mod libc {
    /// # Safety
    /// `a` and `b` are valid for `n` bytes, as the compiler guarantees for its own calls.
    #[unsafe(no_mangle)]
    pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
        for i in 0..n {
            // SAFETY: both point to at least `n` readable bytes.
            let (x, y) = unsafe { (*a.add(i), *b.add(i)) };
            if x != y {
                return i32::from(x) - i32::from(y);
            }
        }
        0
    }

    /// The canonical ABI's allocator, which the host calls to pass strings
    /// and lists in. std's libc provides it on wasip2; without std, we do.
    ///
    /// # Safety
    /// Called by the host per the canonical ABI: `old_ptr`/`old_len`/`align`
    /// describe a live allocation (or `old_len` is 0).
    #[unsafe(no_mangle)]
    pub unsafe extern "C" fn cabi_realloc(
        old_ptr: *mut u8,
        old_len: usize,
        align: usize,
        new_len: usize,
    ) -> *mut u8 {
        use alloc::alloc::{Layout, alloc, realloc};
        if new_len == 0 {
            return align as *mut u8;
        }
        // SAFETY: the host passes a power-of-two alignment and, when
        // `old_len` is non-zero, a pointer this allocator returned with that layout.
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

    /// # Safety
    /// As for `memcmp`.
    #[unsafe(no_mangle)]
    pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
        // SAFETY: forwarded with the caller's guarantee.
        unsafe { memcmp(a, b, n) }
    }
}

#[cfg(target_arch = "wasm32")]
#[allow(unsafe_code, clippy::pedantic)] // generated bindings
mod bindings {
    wit_bindgen::generate!({ path: "../wit", world: "idem" });
}

#[cfg(target_arch = "wasm32")]
#[allow(unsafe_code)] // `export!` expands to the component's exported symbols
mod component {
    use crate::bindings::exports::idem::guard::guard as wit;
    use crate::bindings::idem::guard::{clock, random, store, types};
    use crate::model;
    use alloc::string::String;

    struct Component;

    /// The imported store, as the pure guard sees it.
    struct ImportedStore;

    /// The host's response, as the guard sees it: its methods are imports.
    impl model::ResponseHandle for types::Response {
        fn status(&self) -> u16 {
            types::Response::status(self)
        }

        fn size(&self) -> u64 {
            types::Response::size(self)
        }

        fn same_as(&self, other: &Self) -> bool {
            types::Response::same_as(self, other)
        }
    }

    impl crate::guard::Primitives for ImportedStore {
        type Response = types::Response;

        fn now_ms(&mut self) -> u64 {
            clock::now_ms()
        }

        /// One import call per claim: the guest keeps no state between
        /// calls (see "Replaying a call" in `wit/guard.wit`).
        fn random_u64(&mut self) -> u64 {
            random::random_u64()
        }

        fn get(
            &mut self,
            key: &str,
            now_ms: u64,
        ) -> Result<Option<model::Entry<types::Response>>, model::StoreFailure> {
            store::get(key, now_ms)
                .map(|entry| entry.map(Into::into))
                .map_err(Into::into)
        }

        fn insert(
            &mut self,
            key: &str,
            record: &model::Record<types::Response>,
            now_ms: u64,
        ) -> Result<model::InsertOutcome<types::Response>, model::StoreFailure> {
            // The import borrows a record of its own types: the copy is the
            // fingerprint (and a checkpoint, after a takeover).
            store::insert(key, &record.into(), now_ms)
                .map(Into::into)
                .map_err(Into::into)
        }

        /// The response, when `complete` writes one, is lent as a handle.
        fn replace(
            &mut self,
            key: &str,
            expected_version: u64,
            record: &model::Record<types::Response>,
            now_ms: u64,
        ) -> Result<bool, model::StoreFailure> {
            store::replace(
                key,
                expected_version,
                &record.into(),
                record.response.as_ref(),
                now_ms,
            )
            .map_err(Into::into)
        }
    }

    impl wit::Guest for Component {
        fn begin(
            key: String,
            fingerprint: String,
            policy: wit::Policy,
        ) -> Result<wit::Decision, wit::GuardError> {
            #[cfg(feature = "misbehave")]
            if let Some(decision) = misbehave(&key) {
                return Ok(decision);
            }
            crate::guard::begin(&mut ImportedStore, &key, &fingerprint, &policy.into())
                .map(Into::into)
                .map_err(Into::into)
        }

        fn complete(
            claim: wit::Claim,
            response: types::Response,
            policy: wit::Policy,
        ) -> Result<(), wit::GuardError> {
            crate::guard::complete(&mut ImportedStore, &claim.into(), response, &policy.into())
                .map_err(Into::into)
        }

        fn release(claim: wit::Claim) -> Result<(), wit::GuardError> {
            crate::guard::release(&mut ImportedStore, &claim.into()).map_err(Into::into)
        }

        fn renew(claim: wit::Claim, policy: wit::Policy) -> Result<wit::Claim, wit::GuardError> {
            crate::guard::renew(&mut ImportedStore, &claim.into(), &policy.into())
                .map(Into::into)
                .map_err(Into::into)
        }

        fn save_checkpoint(
            claim: wit::Claim,
            checkpoint: types::Checkpoint,
            policy: wit::Policy,
        ) -> Result<wit::Claim, wit::GuardError> {
            crate::guard::checkpoint(
                &mut ImportedStore,
                &claim.into(),
                checkpoint.into(),
                &policy.into(),
            )
            .map(Into::into)
            .map_err(Into::into)
        }

        fn begin_request(
            key: String,
            request: wit::RequestParts,
            policy: wit::Policy,
        ) -> Result<wit::Decision, wit::GuardError> {
            crate::guard::begin_request(
                &mut ImportedStore,
                &key,
                &request.method,
                &request.path,
                &request.headers,
                &request.body,
                &policy.into(),
            )
            .map(Into::into)
            .map_err(Into::into)
        }

        fn fingerprint(request: wit::RequestParts) -> String {
            crate::fingerprint::fingerprint(
                &request.method,
                &request.path,
                &request.headers,
                &request.body,
            )
        }
    }

    bindings_export!();

    macro_rules! bindings_export {
        () => {
            crate::bindings::export!(Component with_types_in crate::bindings);
        };
    }
    use bindings_export;

    /// The test build's keys: three that break the guard on purpose, two
    /// that answer `conflict` without the store, so that the benchmark can
    /// measure what one call across the component boundary costs, and one
    /// (`!replay`) that crosses what a replay crosses and decides nothing.
    #[cfg(feature = "misbehave")]
    fn misbehave(key: &str) -> Option<wit::Decision> {
        match key {
            "!noop" => return Some(wit::Decision::Conflict),
            "!clock" => {
                core::hint::black_box(clock::now_ms());
                return Some(wit::Decision::Conflict);
            }
            // A replay's floor: the clock, then one `insert` that hands
            // back the stored record, whose response is returned as is —
            // the imports and values a replay must cross, no decision.
            "!replay" => {
                let now = clock::now_ms();
                let claim = types::Record {
                    fingerprint: String::from("fp"),
                    state: types::State::Processing,
                    holder: 1,
                    lease_until_ms: now,
                    expires_at_ms: now + 1,
                    checkpoint: None,
                };
                return Some(match store::insert(key, &claim, now) {
                    Ok(store::InsertOutcome::Existing(types::Entry {
                        response: Some(response),
                        ..
                    })) => wit::Decision::Replay(response),
                    _ => wit::Decision::Conflict,
                });
            }
            "!trap" => core::arch::wasm32::unreachable(),
            "!spin" => loop {
                core::hint::spin_loop();
            },
            "!grow" => {
                let mut hoard = alloc::vec::Vec::new();
                loop {
                    hoard.push(alloc::vec![1u8; 1 << 20]);
                }
            }
            _ => {}
        }
        None
    }

    crate::wit_conversions!(types: types, store: store, guard: wit, response: types::Response);
}
