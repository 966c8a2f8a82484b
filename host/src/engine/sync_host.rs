//! The sync flavour, for stores that never wait on I/O (`Store::as_sync`):
//! imports and exports are plain calls, with no fiber and no future in
//! between. Several times cheaper per call than the async flavour.

use super::HostState;
use crate::clock::Clock;
use crate::store::SyncStore;
use std::sync::Arc;
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Engine, Result, StoreLimits};

#[allow(clippy::pedantic)] // generated
mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "idem",
    });
}

use bindings::exports::idem::guard::guard as wit;
use bindings::idem::guard::{store as wit_store, types as wit_types};

super::glue::wit_glue!();

/// What the host gives one instance.
pub(super) struct State {
    pub(super) store: Arc<dyn SyncStore>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) limits: StoreLimits,
}

impl HostState for State {
    fn limits(&mut self) -> &mut StoreLimits {
        &mut self.limits
    }
}

pub(super) type Pre = bindings::IdemPre<State>;

pub(super) fn link(engine: &Engine, component: &Component) -> Result<Pre> {
    let mut linker = Linker::<State>::new(engine);
    bindings::Idem::add_to_linker::<_, HasSelf<_>>(&mut linker, |state| state)?;
    Pre::new(linker.instantiate_pre(component)?)
}

pub(super) struct Instance {
    store: wasmtime::Store<State>,
    guard: bindings::Idem,
}

impl Instance {
    pub(super) fn new(pre: &Pre, mut store: wasmtime::Store<State>) -> Result<Instance> {
        let guard = pre.instantiate(&mut store)?;
        Ok(Instance { store, guard })
    }

    pub(super) fn set_epoch_deadline(&mut self, ticks: u64) {
        self.store.set_epoch_deadline(ticks);
    }

    pub(super) fn begin(
        &mut self,
        key: &str,
        fingerprint: &str,
        policy: &model::Policy,
    ) -> Result<Result<model::Decision, GuardError>> {
        let r = self.guard.idem_guard_guard().call_begin(
            &mut self.store,
            key,
            fingerprint,
            to_wit_policy(policy),
        )?;
        Ok(r.map(from_wit_decision).map_err(from_wit_error))
    }

    /// The response comes back whatever happened.
    pub(super) fn complete(
        &mut self,
        claim: model::Claim,
        response: model::Response,
        policy: &model::Policy,
    ) -> (model::Response, Result<Result<(), GuardError>>) {
        let claim = to_wit_claim(claim);
        let response = to_wit_response(response);
        let r = self.guard.idem_guard_guard().call_complete(
            &mut self.store,
            &claim,
            &response,
            to_wit_policy(policy),
        );
        (
            from_wit_response(response),
            r.map(|r| r.map_err(from_wit_error)),
        )
    }

    pub(super) fn release(&mut self, claim: model::Claim) -> Result<Result<(), GuardError>> {
        let r = self
            .guard
            .idem_guard_guard()
            .call_release(&mut self.store, &to_wit_claim(claim))?;
        Ok(r.map_err(from_wit_error))
    }

    pub(super) fn renew(
        &mut self,
        claim: model::Claim,
        policy: &model::Policy,
    ) -> Result<Result<model::Claim, GuardError>> {
        let r = self.guard.idem_guard_guard().call_renew(
            &mut self.store,
            &to_wit_claim(claim),
            to_wit_policy(policy),
        )?;
        Ok(r.map(from_wit_claim).map_err(from_wit_error))
    }

    pub(super) fn fingerprint(&mut self, parts: &crate::RequestParts) -> Result<String> {
        self.guard
            .idem_guard_guard()
            .call_fingerprint(&mut self.store, &to_wit_parts(parts))
    }
}

impl wit_types::Host for State {}

impl bindings::idem::guard::clock::Host for State {
    fn now_ms(&mut self) -> u64 {
        self.clock.now_ms()
    }
}

impl wit_store::Host for State {
    fn get(
        &mut self,
        key: String,
        now_ms: u64,
    ) -> Result<Option<wit_types::Entry>, wit_store::StoreError> {
        match self.store.get_now(&key, now_ms) {
            Ok(entry) => Ok(entry.map(to_wit_entry)),
            Err(e) => Err(to_wit_store_error(e)),
        }
    }

    fn insert(
        &mut self,
        key: String,
        record: wit_types::Record,
        now_ms: u64,
    ) -> Result<wit_store::InsertOutcome, wit_store::StoreError> {
        to_wit_insert_outcome(self.store.insert_now(&key, from_wit_record(record), now_ms))
    }

    fn replace(
        &mut self,
        key: String,
        expected_version: u64,
        record: wit_types::Record,
        now_ms: u64,
    ) -> Result<Option<u64>, wit_store::StoreError> {
        self.store
            .replace_now(&key, expected_version, from_wit_record(record), now_ms)
            .map_err(to_wit_store_error)
    }

    fn delete(
        &mut self,
        key: String,
        expected_version: Option<u64>,
    ) -> Result<bool, wit_store::StoreError> {
        self.store
            .delete_now(&key, expected_version)
            .map_err(to_wit_store_error)
    }
}
