//! idem: the idempotency layer.
//!
//! The guard's decisions live in a WebAssembly component (`guest/`); this
//! crate hosts it with wasmtime and tokio and supplies the store primitives
//! it imports. See [`Guard::run`] for the one call most users need.
//!
//! Feature `engine` (on by default) is all of that. Without it only the
//! pure parsing the gateway does on its inputs is built —
//! [`server::parse`], [`server::config`], [`server::problem`] and the fault
//! rules' grammar ([`store::FaultRule`]) — for the `gateway` fuzz target,
//! which so builds without wasmtime. Feature `cli` (also on by default)
//! adds [`cli`], the `idem` command itself, with its flag parser and the
//! console; a library user turns it off.

#[cfg(feature = "cli")]
pub mod cli;
#[cfg(feature = "engine")]
pub mod clock;
#[cfg(feature = "engine")]
pub mod component;
#[cfg(feature = "engine")]
pub mod engine;
/// Invariant checks for the `gateway` fuzz target (cargo-fuzz builds with
/// `--cfg fuzzing`) and their regression test; not part of the library.
#[cfg(any(test, fuzzing))]
pub mod fuzzing;
#[cfg(feature = "engine")]
pub mod guard;
pub mod lease;
#[cfg(feature = "engine")]
pub mod ledger;
pub mod server;
pub mod store;

#[cfg(feature = "engine")]
pub use clock::{Clock, LocalClock, ManualClock, SyncedClock};
#[cfg(feature = "engine")]
pub use engine::{Limits, PoolStats, Runtime};
#[cfg(feature = "engine")]
pub use guard::{
    Fence, Guard, GuardBuilder, OnHandlerError, Outcome, Progress, RequestParts, RunError, Settle,
    Settled,
};
pub use idem_guest::model::{
    Checkpoint, Claim, Decision, Entry, GuardError, Policy, Record, Response, State,
};
pub use lease::check_lease_renewable;
#[cfg(feature = "engine")]
pub use store::{FaultHandle, Faulty, MemoryStore, Store, StoreError, SyncStore};
pub use store::{FaultKind, FaultRule, Op};
