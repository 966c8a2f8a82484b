//! idem: the idempotency layer.
//!
//! The guard's decisions live in a WebAssembly component (`guest/`); this
//! crate hosts it with wasmtime and tokio and supplies the store primitives
//! it imports. See [`Guard::run`] for the one call most users need.
//!
//! Feature `engine` is all of that, with the memory store; the features
//! `sqlite`, `redis` and `postgres` add those stores (each its own driver).
//! Without `engine` only the pure parsing the gateway does on its inputs is
//! built — [`server::parse`], [`server::config`], [`server::problem`] and
//! the fault rules' grammar ([`store::FaultRule`]) — for the `gateway` fuzz
//! target, which so builds without wasmtime. Feature `cli` (on by default,
//! with every store) adds [`cli`], the `idem` command itself, with its flag
//! parser and the console; a library user turns it off.

/// The `idem` command, for the binary and for test rigs that run it in a
/// process of their own: [`cli::main`], or [`cli::Cli`] parsed and
/// [`cli::run`].
#[cfg(feature = "cli")]
pub mod cli;
#[cfg(feature = "engine")]
pub mod clock;
#[cfg(feature = "engine")]
mod component;
#[cfg(feature = "engine")]
mod engine;
/// Invariant checks for the `gateway` fuzz target (cargo-fuzz builds with
/// `--cfg fuzzing`) and their regression test; not part of the library.
#[cfg(any(test, fuzzing))]
pub mod fuzzing;
#[cfg(feature = "engine")]
pub mod guard;
// A flag set once and its wait: the gate's body progress, the Redis connection's loss.
#[cfg(feature = "engine")]
mod latch;
pub mod lease;
// The demo upstream: `idem ledger` and `idem demo` run it, and the tests
// through [`testing`].
#[cfg(any(feature = "cli", feature = "testing"))]
mod ledger;
pub mod server;
pub mod store;

#[cfg(feature = "engine")]
pub use clock::{Clock, LocalClock, ManualClock, SyncedClock};
#[cfg(feature = "engine")]
pub use component::{COMPONENT, WIT};
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
pub use lease::{LeaseTooShort, check_lease_renewable};
#[cfg(feature = "engine")]
pub use store::{FaultHandle, Faulty, MemoryStore, Store, StoreError, SyncStore};
pub use store::{FaultKind, FaultRule, Op};

/// What this crate's own tests, benchmarks and test rigs reach for, with the
/// feature `testing`; not part of the library's API.
#[cfg(feature = "testing")]
pub mod testing {
    use crate::Response;
    pub use crate::component::MISBEHAVING_COMPONENT;
    pub use crate::ledger::{Books, Ledger, Order, Run, run};

    /// The guard bench's small response: 200, no header, `paid`.
    pub fn paid() -> Response {
        Response {
            status: 200,
            headers: vec![],
            body: b"paid".to_vec(),
        }
    }

    /// The guard bench's large response: 200, one header, a 64 KiB body.
    pub fn large() -> Response {
        Response {
            status: 200,
            headers: vec![("content-type".into(), b"application/json".to_vec())],
            body: vec![b'x'; 64 << 10],
        }
    }
}
