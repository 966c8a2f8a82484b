//! The async flavour: store imports are awaited, so a guard call runs on a
//! wasmtime fiber and may wait on a network or disk store without blocking
//! the runtime's thread.
//!
//! What is this flavour's own: `async` bindings (the options it gives
//! `glue::bindings!`), a `State` holding a `dyn Store` and the store timeout,
//! store calls awaited within that timeout (`call_store!`), and
//! `instantiate_async`. The rest is the body both flavours share
//! (`glue::flavour!`), expanded with `async`/`.await`.

use super::HostState;
use crate::clock::Clock;
use crate::store::{Store, StoreError};
use std::sync::Arc;
use std::time::Duration;
use wasmtime::{Result, StoreLimits};

super::glue::bindings!(async);

/// What the host gives one instance.
pub(super) struct State {
    pub(super) store: Arc<dyn Store>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) limits: StoreLimits,
    /// The `response` handles the guest holds during a call.
    pub(super) table: wasmtime::component::ResourceTable,
    /// The expiry of the last done record a store call of this guard call
    /// wrote or returned (`complete` reports it).
    pub(super) done_expires_at_ms: Option<u64>,
    /// How long one store call may take. Past it the import answers
    /// `unavailable` (a write may still be applied, as with a lost reply),
    /// so a hung store fails the guard call closed instead of holding it.
    pub(super) store_timeout: Duration,
}

/// A store call awaited within the store timeout. It borrows the store
/// alone, not the whole `State` (whose handle table is not `Sync`).
async fn bounded<T>(
    store: &Arc<dyn Store>,
    timeout: Duration,
    op: &str,
    call: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(timeout, call).await {
        Ok(result) => result,
        Err(_) => Err(StoreError::Unavailable {
            store: store.name(),
            reason: format!(
                "{op} did not answer within the store timeout of {} ms",
                timeout.as_millis()
            ),
            source: None,
        }),
    }
}

/// A store import's call: the store's own method, awaited within the store
/// timeout (`state.get(..)` calls `Store::get`).
macro_rules! call_store {
    ($state:ident.$op:ident($($arg:expr),*)) => {
        bounded(
            &$state.store,
            $state.store_timeout,
            stringify!($op),
            $state.store.$op($($arg),*),
        )
        .await
    };
}

super::glue::flavour! {
    asyncness: [async],
    awaiting: [.await],
    call_store: call_store,
}

impl Instance {
    pub(super) async fn new(pre: &Pre, mut store: wasmtime::Store<State>) -> Result<Instance> {
        let guard = pre.instantiate_async(&mut store).await?;
        Ok(Instance { store, guard })
    }
}
