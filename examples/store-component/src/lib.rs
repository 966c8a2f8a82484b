//! A reference store for the idem guard, written as a WebAssembly component.
//!
//! It exports `idem:guard/store@0.3.0` (`wit/store.wit`) and keeps records
//! and response bytes in its own memory: `replace` reads the bytes of the
//! response it is lent (`headers()`, `body()`, `status()` of the host's
//! `response`), and every read hands them back as a new response made with
//! the resource's constructor. Composed into the guard's `store` import
//! (`scripts/compose-store.sh`, `wac plug`), it gives a host a guard whose
//! records live inside the component: the host provides only `clock`,
//! `random` and the `response` resource (`world idem-with-store`).
//!
//! The logic lives in plain modules tested natively ([`memory`], the
//! primitives; [`faults`], the tests' faults); on `wasm32` this file adds the
//! bindings, `export!` and the conversions, and nothing else.

#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

pub mod faults;
pub mod memory;

#[cfg(target_arch = "wasm32")]
#[global_allocator]
static ALLOCATOR: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

/// A panic is a bug in the store: trap, and the guard's host answers
/// unavailable (fails closed).
#[cfg(target_arch = "wasm32")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    core::arch::wasm32::unreachable()
}

/// Without std there is no libc: what the compiler (comparing keys) and the
/// canonical ABI (`cabi_realloc`, to pass strings and lists in) expect of it
/// that `compiler_builtins` does not provide on this target. As `guest/`.
#[cfg(target_arch = "wasm32")]
#[allow(unsafe_code)]
mod libc {
    /// # Safety
    /// `a` and `b` are valid for `n` bytes, as the compiler guarantees for its own calls.
    #[unsafe(no_mangle)]
    pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
        // SAFETY: both point to at least `n` readable bytes.
        let (a, b) = unsafe {
            (
                core::slice::from_raw_parts(a, n),
                core::slice::from_raw_parts(b, n),
            )
        };
        a.iter()
            .zip(b)
            .find(|(x, y)| x != y)
            .map_or(0, |(x, y)| i32::from(*x) - i32::from(*y))
    }

    /// # Safety
    /// As for `memcmp`.
    #[unsafe(no_mangle)]
    pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
        // SAFETY: forwarded with the caller's guarantee.
        unsafe { memcmp(a, b, n) }
    }

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
            let old = Layout::from_size_align_unchecked(old_len, align);
            if old_len == 0 {
                alloc(Layout::from_size_align_unchecked(new_len, align))
            } else {
                realloc(old_ptr, old, new_len)
            }
        };
        if ptr.is_null() {
            core::arch::wasm32::unreachable();
        }
        ptr
    }
}

#[cfg(target_arch = "wasm32")]
#[allow(unsafe_code, clippy::pedantic)] // generated bindings
mod bindings {
    wit_bindgen::generate!({
        path: ["../../wit", "wit"],
        world: "idem:store-example/memory-store@0.1.0",
        // The contract (`idem:guard`, from ../../wit) is generated here too.
        generate_all,
    });
}

#[cfg(target_arch = "wasm32")]
#[allow(unsafe_code)] // `export!`, and the instance's one global (see `Global`)
mod component {
    use crate::bindings::exports::idem::guard::store;
    use crate::bindings::exports::idem::store_example::testing;
    use crate::bindings::idem::guard::types;
    use crate::faults::{FaultKind, Faults, Hit, Primitive};
    use crate::memory::{Expiring, Inserted, MemoryStore};
    use alloc::string::String;
    use alloc::vec::Vec;
    use core::cell::RefCell;

    struct Component;

    /// What the store keeps for a key: the record as written, and the bytes
    /// of its response (never the handle it was lent).
    struct Kept {
        record: types::Record,
        response: Option<Bytes>,
    }

    struct Bytes {
        status: u16,
        headers: Vec<(String, Vec<u8>)>,
        body: Vec<u8>,
    }

    impl Expiring for Kept {
        fn expires_at_ms(&self) -> u64 {
            self.record.expires_at_ms
        }
    }

    struct State {
        store: MemoryStore<Kept>,
        faults: Faults,
    }

    /// The instance's records and faults.
    struct Global(RefCell<State>);

    // SAFETY: a component instance runs on one thread (wasm32, no threads),
    // one export call at a time: the component model does not re-enter an
    // instance while it is in a call, not even from one of its own imports
    // (the response methods and constructor called with the state borrowed).
    unsafe impl Sync for Global {}

    static STATE: Global = Global(RefCell::new(State {
        store: MemoryStore::new(),
        faults: Faults::new(),
    }));

    /// Runs one primitive as its fault says: not at all (`error`), or
    /// applied and its answer dropped (`lost`).
    fn primitive<T>(
        which: Primitive,
        apply: impl FnOnce(&mut MemoryStore<Kept>) -> T,
    ) -> Result<T, store::StoreError> {
        let mut state = STATE.0.borrow_mut();
        let State { store, faults } = &mut *state;
        match faults.hit(which) {
            None => Ok(apply(store)),
            Some(Hit::Error(why)) => Err(store::StoreError::Unavailable(why)),
            Some(Hit::Lost(why)) => {
                drop(apply(store));
                Err(store::StoreError::Unavailable(why))
            }
        }
    }

    /// A kept record as the guard reads it: its response a new host
    /// response with the kept bytes, the guard's to keep or drop.
    fn entry(kept: &Kept, version: u64) -> types::Entry {
        types::Entry {
            record: kept.record.clone(),
            response: kept
                .response
                .as_ref()
                .map(|r| types::Response::new(r.status, &r.headers, &r.body)),
            version,
        }
    }

    impl store::Guest for Component {
        fn get(key: String, now_ms: u64) -> Result<Option<types::Entry>, store::StoreError> {
            primitive(Primitive::Get, |store| {
                store
                    .get(&key, now_ms)
                    .map(|(kept, version)| entry(kept, version))
            })
        }

        fn insert(
            key: String,
            record: types::Record,
            now_ms: u64,
        ) -> Result<store::InsertOutcome, store::StoreError> {
            let kept = Kept {
                record,
                response: None,
            };
            primitive(Primitive::Insert, |store| {
                match store.insert(&key, kept, now_ms) {
                    Inserted::Inserted(version) => store::InsertOutcome::Inserted(version),
                    Inserted::Existing(kept, version) => {
                        store::InsertOutcome::Existing(entry(kept, version))
                    }
                }
            })
        }

        /// The lent response's bytes are copied in only when the write is
        /// applied.
        fn replace(
            key: String,
            expected_version: u64,
            record: types::Record,
            response: Option<&types::Response>,
            now_ms: u64,
        ) -> Result<bool, store::StoreError> {
            primitive(Primitive::Replace, |store| {
                let response = response.map(|r| Bytes {
                    status: r.status(),
                    headers: r.headers(),
                    body: r.body(),
                });
                store.replace(&key, expected_version, Kept { record, response }, now_ms)
            })
        }

        fn delete(
            key: String,
            expected_version: Option<u64>,
            now_ms: u64,
        ) -> Result<bool, store::StoreError> {
            primitive(Primitive::Delete, |store| {
                store.delete(&key, expected_version, now_ms)
            })
        }
    }

    impl testing::Guest for Component {
        fn set_fault(
            primitive: testing::Primitive,
            kind: testing::FaultKind,
            message: String,
            count: Option<u32>,
        ) {
            let primitive = match primitive {
                testing::Primitive::Get => Primitive::Get,
                testing::Primitive::Insert => Primitive::Insert,
                testing::Primitive::Replace => Primitive::Replace,
                testing::Primitive::Delete => Primitive::Delete,
            };
            let kind = match kind {
                testing::FaultKind::Error => FaultKind::Error,
                testing::FaultKind::Lost => FaultKind::Lost,
            };
            STATE
                .0
                .borrow_mut()
                .faults
                .set(primitive, kind, &message, count);
        }

        fn clear_faults() {
            STATE.0.borrow_mut().faults.clear();
        }

        fn peek(key: String, now_ms: u64) -> Option<types::Entry> {
            let state = STATE.0.borrow();
            state
                .store
                .get(&key, now_ms)
                .map(|(kept, version)| entry(kept, version))
        }
    }

    crate::bindings::export!(Component with_types_in crate::bindings);
}
