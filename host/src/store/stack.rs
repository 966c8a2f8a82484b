//! The store a gateway guards with, built in this one place for the proxy
//! and the in-process layer alike, so that its type says what it is.

use super::{FaultHandle, Faulty, Latencies, ReadFallback, Store, Timed};
use std::sync::Arc;

/// The backend, whose refused claims of live keys are answered from a read
/// ([`ReadFallback`]: replays while the store refuses writes); faults
/// injected nearest to it, outside that; every atomic operation timed
/// outside them, so that an injected delay shows in the latency as a client
/// would see it. Over the memory store every layer keeps its sync side.
pub type Stack = Timed<Faulty<ReadFallback<Arc<dyn Store>>>>;

/// Builds the [`Stack`] over `backend`: no fault set yet, operations timed
/// into `latencies`.
pub fn stack(backend: Arc<dyn Store>, latencies: Latencies) -> Stack {
    let (faulty, _faults) = Faulty::new(ReadFallback::new(backend));
    Timed::new(faulty, latencies)
}

impl Stack {
    /// The handle that sets the stack's faults.
    pub fn faults(&self) -> &FaultHandle {
        self.inner().hook()
    }

    pub fn latencies(&self) -> &Latencies {
        self.hook()
    }
}
