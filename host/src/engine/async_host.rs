//! The async flavour: store imports are awaited, so a guard call runs on a
//! wasmtime fiber and may wait on a network or disk store without blocking
//! the runtime's thread.
//!
//! What is this flavour's own: `async` bindings, a `State` holding a
//! `dyn Store` and the store timeout, store calls awaited within that
//! timeout (`call_store!`), and `instantiate_async`. The rest is the body
//! both flavours share (`glue::flavour!`), expanded with `async`/`.await`.

use super::HostState;
use crate::clock::Clock;
use crate::store::{Store, StoreError};
use std::sync::Arc;
use std::time::Duration;
use wasmtime::{Result, StoreLimits};

#[allow(clippy::pedantic)] // generated
mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "idem",
        imports: { default: async },
        exports: { default: async },
    });
}

use bindings::exports::idem::guard::guard as wit;
use bindings::idem::guard::{store as wit_store, types as wit_types};

/// What the host gives one instance.
pub(super) struct State {
    pub(super) store: Arc<dyn Store>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) limits: StoreLimits,
    /// How long one store call may take. Past it the import answers
    /// `unavailable` (a write may still be applied, as with a lost reply),
    /// so a hung store fails the guard call closed instead of holding it.
    pub(super) store_timeout: Duration,
}

impl State {
    async fn bounded<T>(
        &self,
        op: &str,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.store_timeout, call).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Unavailable {
                store: self.store.name(),
                reason: format!(
                    "{op} did not answer within the store timeout of {} ms",
                    self.store_timeout.as_millis()
                ),
            }),
        }
    }
}

/// A store import's call: the store's own method, awaited within the store
/// timeout (`state.get(..)` calls `Store::get`).
macro_rules! call_store {
    ($state:ident.$op:ident($($arg:expr),*)) => {
        $state
            .bounded(stringify!($op), $state.store.$op($($arg),*))
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
