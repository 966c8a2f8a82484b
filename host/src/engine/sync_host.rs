//! The sync flavour, for stores that never wait on I/O (`Store::as_sync`):
//! imports and exports are plain calls, with no fiber and no future in
//! between. Several times cheaper per call than the async flavour.
//!
//! What is this flavour's own: bindings without `async` (`glue::bindings!`
//! with no options), a `State` holding a `dyn SyncStore`, store calls that
//! are plain calls of its `*_now` methods (`call_store!`), and
//! `instantiate`. The rest is the body both flavours share
//! (`glue::flavour!`), expanded with no `async` and no `.await`.

use crate::store::SyncStore;
use std::sync::Arc;
use wasmtime::Result;

super::glue::bindings!();

/// What the host gives one instance: its imports reach a sync store.
type State = super::State<Arc<dyn SyncStore>>;

/// A store import's call: a plain call of the sync store's method
/// (`state.get(..)` calls `SyncStore::get_now`).
macro_rules! call_store {
    ($state:ident.get($($arg:expr),*)) => { $state.store.get_now($($arg),*) };
    ($state:ident.insert($($arg:expr),*)) => { $state.store.insert_now($($arg),*) };
    ($state:ident.replace($($arg:expr),*)) => { $state.store.replace_now($($arg),*) };
    ($state:ident.delete($($arg:expr),*)) => { $state.store.delete_now($($arg),*) };
}

super::glue::flavour! {
    asyncness: [],
    awaiting: [],
    call_store: call_store,
}

impl Instance {
    pub(super) fn new(pre: &Pre, mut store: wasmtime::Store<State>) -> Result<Instance> {
        let guard = pre.instantiate(&mut store)?;
        Ok(Instance { store, guard })
    }
}
