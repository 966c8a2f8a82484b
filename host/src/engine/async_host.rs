//! The async flavour: store imports are awaited, so a guard call runs on a
//! wasmtime fiber and may wait on a network or disk store without blocking
//! the runtime's thread.

use super::HostState;
use crate::clock::Clock;
use crate::store::Store;
use std::sync::Arc;
use std::time::Duration;
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Engine, Result, StoreLimits};

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

super::glue::wit_glue!();

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
    pub(super) async fn new(pre: &Pre, mut store: wasmtime::Store<State>) -> Result<Instance> {
        let guard = pre.instantiate_async(&mut store).await?;
        Ok(Instance { store, guard })
    }

    pub(super) fn set_epoch_deadline(&mut self, ticks: u64) {
        self.store.set_epoch_deadline(ticks);
    }

    pub(super) async fn begin(
        &mut self,
        key: &str,
        fingerprint: &str,
        policy: &model::Policy,
    ) -> Result<Result<model::Decision, GuardError>> {
        let Instance { store, guard } = self;
        let r = guard
            .idem_guard_guard()
            .call_begin(store, key, fingerprint, to_wit_policy(policy))
            .await?;
        Ok(r.map(from_wit_decision).map_err(from_wit_error))
    }

    /// The response comes back whatever happened.
    pub(super) async fn complete(
        &mut self,
        claim: model::Claim,
        response: model::Response,
        policy: &model::Policy,
    ) -> (model::Response, Result<Result<(), GuardError>>) {
        let Instance { store, guard } = self;
        let claim = to_wit_claim(claim);
        let response = to_wit_response(response);
        let r = guard
            .idem_guard_guard()
            .call_complete(store, &claim, &response, to_wit_policy(policy))
            .await;
        (
            from_wit_response(response),
            r.map(|r| r.map_err(from_wit_error)),
        )
    }

    pub(super) async fn release(&mut self, claim: model::Claim) -> Result<Result<(), GuardError>> {
        let Instance { store, guard } = self;
        let r = guard
            .idem_guard_guard()
            .call_release(store, &to_wit_claim(claim))
            .await?;
        Ok(r.map_err(from_wit_error))
    }

    pub(super) async fn renew(
        &mut self,
        claim: model::Claim,
        policy: &model::Policy,
    ) -> Result<Result<model::Claim, GuardError>> {
        let Instance { store, guard } = self;
        let r = guard
            .idem_guard_guard()
            .call_renew(store, &to_wit_claim(claim), to_wit_policy(policy))
            .await?;
        Ok(r.map(from_wit_claim).map_err(from_wit_error))
    }

    pub(super) async fn fingerprint(&mut self, parts: &crate::RequestParts) -> Result<String> {
        let Instance { store, guard } = self;
        guard
            .idem_guard_guard()
            .call_fingerprint(store, &to_wit_parts(parts))
            .await
    }
}

impl wit_types::Host for State {}

impl bindings::idem::guard::clock::Host for State {
    async fn now_ms(&mut self) -> u64 {
        self.clock.now_ms()
    }
}

impl wit_store::Host for State {
    async fn get(
        &mut self,
        key: String,
        now_ms: u64,
    ) -> Result<Option<wit_types::Entry>, wit_store::StoreError> {
        match self.bounded("get", self.store.get(&key, now_ms)).await {
            Ok(entry) => Ok(entry.map(to_wit_entry)),
            Err(e) => Err(to_wit_store_error(e)),
        }
    }

    async fn insert(
        &mut self,
        key: String,
        record: wit_types::Record,
        now_ms: u64,
    ) -> Result<wit_store::InsertOutcome, wit_store::StoreError> {
        let insert = self.store.insert(&key, from_wit_record(record), now_ms);
        to_wit_insert_outcome(self.bounded("insert", insert).await)
    }

    async fn replace(
        &mut self,
        key: String,
        expected_version: u64,
        record: wit_types::Record,
        now_ms: u64,
    ) -> Result<Option<u64>, wit_store::StoreError> {
        let replace = self
            .store
            .replace(&key, expected_version, from_wit_record(record), now_ms);
        self.bounded("replace", replace)
            .await
            .map_err(to_wit_store_error)
    }

    async fn delete(
        &mut self,
        key: String,
        expected_version: Option<u64>,
    ) -> Result<bool, wit_store::StoreError> {
        self.bounded("delete", self.store.delete(&key, expected_version))
            .await
            .map_err(to_wit_store_error)
    }
}
