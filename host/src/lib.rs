//! idem: the idempotency layer.
//!
//! The guard's decisions live in a WebAssembly component (`guest/`); this
//! crate hosts it with wasmtime and tokio and supplies the store primitives
//! it imports. See [`Guard::run`] for the one call most users need.

pub mod clock;
pub mod component;
pub mod engine;
pub mod guard;
pub mod ledger;
pub mod server;
pub mod store;

pub use clock::{Clock, ManualClock, SystemClock};
pub use engine::{Limits, PoolStats, Runtime};
pub use guard::{Fence, Guard, GuardBuilder, OnHandlerError, Outcome, RequestParts, RunError};
pub use idem_guest::model::{Claim, Decision, Entry, GuardError, Policy, Record, Response, State};
pub use store::{
    FaultHandle, FaultKind, FaultRule, Faulty, MemoryStore, Op, Store, StoreError, SyncStore,
};
