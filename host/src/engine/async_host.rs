//! The async flavour: store imports are awaited, so a guard call runs on a
//! wasmtime fiber and may wait on a network or disk store without blocking
//! the runtime's thread.
//!
//! What is this flavour's own: `async` bindings (the options it gives
//! `glue::bindings!`), a `State` whose store is a `dyn Store` with the store
//! timeout (`Timed`), store calls awaited within that timeout
//! (`call_store!`), and `instantiate_async`. The rest is the body both
//! flavours share (`glue::flavour!`), expanded with `async`/`.await`.

use crate::store::{Store, StoreError};
use std::sync::Arc;
use std::time::Duration;
use wasmtime::Result;

super::glue::bindings!(async);

/// What this flavour's imports reach: the store, and how long one call of
/// it may take. Past that the import answers `unavailable` (a write may
/// still be applied, as with a lost reply), so a hung store fails the guard
/// call closed instead of holding it.
pub(super) struct Timed {
    pub(super) store: Arc<dyn Store>,
    pub(super) timeout: Duration,
}

/// What the host gives one instance: its imports reach a store within the timeout.
type State = super::State<Timed>;

/// A store call awaited within the store timeout. It borrows the store
/// alone, not the whole `State` (whose handle table is not `Sync`).
async fn bounded<T>(
    timed: &Timed,
    op: &str,
    call: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let timeout = timed.timeout;
    match tokio::time::timeout(timeout, call).await {
        Ok(result) => result,
        Err(_) => Err(StoreError::Unavailable {
            store: timed.store.name(),
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
        bounded(&$state.store, stringify!($op), $state.store.store.$op($($arg),*)).await
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
