//! The body both engine flavours share, written once and expanded into each
//! flavour's module by `flavour!`: the `Instance` calls into the guard,
//! the store, clock and random imports, the linking, and the conversions between
//! the generated types and the model (`idem_guest::wit_conversions!`; the
//! async and the sync bindings generate distinct, identical types).
//!
//! What differs between the flavours is in their own modules, and only that:
//! - the options given to `bindings!`: `async` store imports and exports, or
//!   none;
//! - `State`'s store: the store the imports reach (`dyn Store` and a store
//!   timeout, or `dyn SyncStore`);
//! - `call_store!`: how an import calls that store (awaited within the store
//!   timeout, or a plain call of the sync store);
//! - `Instance::new`: `instantiate_async` or `instantiate`;
//! - the tokens given to `flavour!`: `async` before each function that
//!   calls into the guest or the store and `.await` after each such call,
//!   or nothing — so the sync flavour stays plain calls, with no future
//!   in between.
//!
//! The expanding module must have in scope what `bindings!` brings (`wit`,
//! the exported guard interface; `wit_store` and `wit_types`, the imported
//! interfaces) and `State`. The expansion brings `model` and
//! `GuardError` into it.

/// The world's bindings, with the host's `response` resource, in a module
/// `bindings`; a flavour says whether its store imports and its exports are
/// `async`. The clock, `random` and the response's functions are plain calls
/// in both flavours: they never wait, and an `async` import costs a boxed
/// future per call.
/// The response's functions may trap (a handle the table does not hold, a
/// table full of responses a guest made): a trap, never a host panic.
macro_rules! bindings {
    (async) => {
        $crate::engine::glue::bindings!(@generate
            imports: { "idem:guard/store": async, "idem:guard/types": trappable },
            exports: { default: async },
        );
    };
    () => {
        $crate::engine::glue::bindings!(@generate imports: { "idem:guard/types": trappable },);
    };
    (@generate $($option:tt)*) => {
        #[allow(clippy::pedantic)] // generated
        mod bindings {
            wasmtime::component::bindgen!({
                path: "../wit",
                world: "idem",
                with: { "idem:guard/types.response": crate::engine::ResponseRep },
                $($option)*
            });
        }

        use bindings::exports::idem::guard::guard as wit;
        use bindings::idem::guard::{store as wit_store, types as wit_types};
    };
}

macro_rules! flavour {
    (asyncness: [$($async:tt)?], awaiting: [$($await:tt)*], call_store: $call_store:ident $(,)?) => {
        use idem_guest::fingerprint::RequestParts;
        use idem_guest::model::{self, GuardError};
        use wasmtime::component::{Resource, ResourceTable, ResourceTableError};
        use super::ResponseRep;

        idem_guest::wit_conversions!(
            types: wit_types,
            store: wit_store,
            guard: wit,
            response: Resource<ResponseRep>,
        );

        /// A stored response handed to the guest: a handle in the table,
        /// which remembers when its record expires (a replay tells the
        /// client).
        fn lend(
            table: &mut ResourceTable,
            entry: model::Entry,
        ) -> Result<wit_types::Entry, wit_store::StoreError> {
            let expires_at_ms = entry.record.expires_at_ms;
            entry
                .try_map_response(|response| {
                    table.push(ResponseRep { response: Arc::new(response), expires_at_ms: Some(expires_at_ms) })
                })
                .map(Into::into)
                .map_err(handle_failed)
        }

        /// The table refused a handle (it is full: the guest is holding on
        /// to handles without bound). The import fails closed.
        fn handle_failed(e: ResourceTableError) -> wit_store::StoreError {
            wit_store::StoreError::Unavailable(format!("response handle: {e}"))
        }

        impl From<crate::store::StoreError> for wit_store::StoreError {
            fn from(e: crate::store::StoreError) -> Self {
                use crate::store::StoreError;
                match e {
                    StoreError::Unavailable { .. } => Self::Unavailable(e.to_string()),
                    StoreError::Corrupt { .. } => Self::Corrupt(e.to_string()),
                }
            }
        }

        impl From<&RequestParts> for wit::RequestParts {
            fn from(parts: &RequestParts) -> Self {
                Self {
                    method: parts.method.clone(),
                    path: parts.path.clone(),
                    headers: parts.headers.clone(),
                    body: parts.body.clone(),
                }
            }
        }

        pub(super) type Pre = bindings::IdemPre<State>;

        pub(super) fn link(
            engine: &wasmtime::Engine,
            component: &wasmtime::component::Component,
        ) -> wasmtime::Result<Pre> {
            let mut linker = wasmtime::component::Linker::<State>::new(engine);
            bindings::Idem::add_to_linker::<_, wasmtime::component::HasSelf<_>>(
                &mut linker,
                |state| state,
            )?;
            Pre::new(linker.instantiate_pre(component)?)
        }

        pub(super) struct Instance {
            store: wasmtime::Store<State>,
            guard: bindings::Idem,
        }

        impl Instance {
            pub(super) fn set_epoch_deadline(&mut self, ticks: u64) {
                self.store.set_epoch_deadline(ticks);
            }

            pub(super) $($async)? fn begin(
                &mut self,
                key: &str,
                fingerprint: &str,
                policy: &model::Policy,
            ) -> wasmtime::Result<Result<(model::Decision, Option<u64>), GuardError>> {
                let Instance { store, guard } = self;
                let r = guard
                    .idem_guard_guard()
                    .call_begin(&mut *store, key, fingerprint, (*policy).into())
                    $($await)*?;
                match r {
                    // A replay hands back a handle the store lent: take
                    // the response out of the table, with its record's expiry.
                    Ok(decision) => {
                        let table = &mut store.data_mut().table;
                        let mut expires_at_ms = None;
                        let decision = model::Decision::from(decision).try_map_response(|handle| {
                            table.delete(handle).map(|rep| {
                                expires_at_ms = rep.expires_at_ms;
                                ResponseRep::unshare(rep.response)
                            })
                        })?;
                        Ok(Ok((decision, expires_at_ms)))
                    }
                    Err(e) => Ok(Err(e.into())),
                }
            }

            /// The response comes back whatever happened; a success says
            /// when the stored record expires: the `expires-at-ms` of the
            /// done record the guest wrote, or read back (a retried
            /// completion writes nothing).
            pub(super) $($async)? fn complete(
                &mut self,
                claim: model::Claim,
                response: model::Response,
                policy: &model::Policy,
            ) -> (model::Response, wasmtime::Result<Result<u64, GuardError>>) {
                let Instance { store, guard } = self;
                let response = Arc::new(response);
                store.data_mut().done_expires_at_ms = None;
                let rep = ResponseRep { response: response.clone(), expires_at_ms: None };
                let r = match store.data_mut().table.push(rep) {
                    Ok(handle) => guard
                        .idem_guard_guard()
                        .call_complete(&mut *store, &claim.into(), handle, (*policy).into())
                        $($await)*
                        .map(|r| r.map_err(Into::into)),
                    Err(e) => Err(e.into()),
                };
                let expires_at_ms = store.data().done_expires_at_ms;
                let r = r.map(|r| {
                    r.and_then(|()| {
                        expires_at_ms.ok_or_else(|| {
                            GuardError::Unavailable(
                                "the guard completed without a done record passing through the store".into(),
                            )
                        })
                    })
                });
                // The guest dropped its handle; a trapped instance is
                // discarded with its table (and the response is copied).
                (ResponseRep::unshare(response), r)
            }

            pub(super) $($async)? fn release(
                &mut self,
                claim: model::Claim,
            ) -> wasmtime::Result<Result<(), GuardError>> {
                let Instance { store, guard } = self;
                let r = guard
                    .idem_guard_guard()
                    .call_release(store, &claim.into())
                    $($await)*?;
                Ok(r.map_err(Into::into))
            }

            pub(super) $($async)? fn renew(
                &mut self,
                claim: model::Claim,
                policy: &model::Policy,
            ) -> wasmtime::Result<Result<model::Claim, GuardError>> {
                let Instance { store, guard } = self;
                let r = guard
                    .idem_guard_guard()
                    .call_renew(store, &claim.into(), (*policy).into())
                    $($await)*?;
                Ok(r.map(Into::into).map_err(Into::into))
            }

            pub(super) $($async)? fn save_checkpoint(
                &mut self,
                claim: model::Claim,
                checkpoint: model::Checkpoint,
                policy: &model::Policy,
            ) -> wasmtime::Result<Result<model::Claim, GuardError>> {
                let Instance { store, guard } = self;
                let r = guard
                    .idem_guard_guard()
                    .call_save_checkpoint(store, &claim.into(), &checkpoint.into(), (*policy).into())
                    $($await)*?;
                Ok(r.map(Into::into).map_err(Into::into))
            }

            pub(super) $($async)? fn fingerprint(
                &mut self,
                parts: &RequestParts,
            ) -> wasmtime::Result<String> {
                let Instance { store, guard } = self;
                guard
                    .idem_guard_guard()
                    .call_fingerprint(store, &parts.into())
                    $($await)*
            }
        }

        impl wit_types::Host for State {}

        /// The `response` resource's functions: the guest asks, the
        /// response stays here. A handle the table does not hold cannot
        /// reach these (wasmtime checks handles), so a failed lookup traps.
        /// The guard calls `status`, `size` and `same-as`; the constructor,
        /// `headers` and `body` are for a store written as a component.
        impl wit_types::HostResponse for State {
            fn new(
                &mut self,
                status: u16,
                headers: Vec<(String, Vec<u8>)>,
                body: Vec<u8>,
            ) -> wasmtime::Result<Resource<ResponseRep>> {
                let response = model::Response { status, headers, body };
                Ok(self.table.push(ResponseRep { response: Arc::new(response), expires_at_ms: None })?)
            }

            fn status(&mut self, response: Resource<ResponseRep>) -> wasmtime::Result<u16> {
                Ok(self.table.get(&response)?.response.status)
            }

            fn size(&mut self, response: Resource<ResponseRep>) -> wasmtime::Result<u64> {
                Ok(self.table.get(&response)?.response.size_bytes() as u64)
            }

            fn same_as(
                &mut self,
                response: Resource<ResponseRep>,
                other: Resource<ResponseRep>,
            ) -> wasmtime::Result<bool> {
                let a = &self.table.get(&response)?.response;
                let b = &self.table.get(&other)?.response;
                Ok(Arc::ptr_eq(a, b) || a == b)
            }

            fn headers(
                &mut self,
                response: Resource<ResponseRep>,
            ) -> wasmtime::Result<Vec<(String, Vec<u8>)>> {
                Ok(self.table.get(&response)?.response.headers.clone())
            }

            fn body(&mut self, response: Resource<ResponseRep>) -> wasmtime::Result<Vec<u8>> {
                Ok(self.table.get(&response)?.response.body.clone())
            }

            fn drop(&mut self, response: Resource<ResponseRep>) -> wasmtime::Result<()> {
                self.table.delete(response)?;
                Ok(())
            }
        }

        impl bindings::idem::guard::clock::Host for State {
            fn now_ms(&mut self) -> u64 {
                self.clock.now_ms()
            }
        }

        impl bindings::idem::guard::random::Host for State {
            /// Holder ids: a per-thread wyrand generator seeded from the
            /// OS's randomness (`fastrand`). Unique, not secret: an id
            /// only tells a holder's own writes from another's.
            fn random_u64(&mut self) -> u64 {
                fastrand::u64(..)
            }
        }

        impl wit_store::Host for State {
            $($async)? fn get(
                &mut self,
                key: String,
                now_ms: u64,
            ) -> Result<Option<wit_types::Entry>, wit_store::StoreError> {
                let entry = $call_store!(self.get(&key, now_ms))?;
                if let Some(entry) = &entry {
                    self.saw(&entry.record);
                }
                entry.map(|entry| lend(&mut self.table, entry)).transpose()
            }

            $($async)? fn insert(
                &mut self,
                key: String,
                record: wit_types::Record,
                now_ms: u64,
            ) -> Result<wit_store::InsertOutcome, wit_store::StoreError> {
                Ok(match $call_store!(self.insert(&key, record.into(), now_ms))? {
                    model::InsertOutcome::Inserted(version) => {
                        wit_store::InsertOutcome::Inserted(version)
                    }
                    model::InsertOutcome::Existing(entry) => {
                        self.saw(&entry.record);
                        wit_store::InsertOutcome::Existing(lend(&mut self.table, entry)?)
                    }
                })
            }

            $($async)? fn replace(
                &mut self,
                key: String,
                expected_version: u64,
                record: wit_types::Record,
                response: Option<Resource<ResponseRep>>,
                now_ms: u64,
            ) -> Result<bool, wit_store::StoreError> {
                // Lent, not given: the store gets a copy of the bytes.
                let mut record: model::Record = record.into();
                record.response = match response {
                    Some(handle) => Some(self.table.get(&handle).map_err(handle_failed)?.response.as_ref().clone()),
                    None => None,
                };
                let done_expires_at_ms = (record.state == model::State::Done).then_some(record.expires_at_ms);
                let replaced = $call_store!(self.replace(&key, expected_version, record, now_ms))?;
                if replaced {
                    self.done_expires_at_ms = done_expires_at_ms.or(self.done_expires_at_ms);
                }
                Ok(replaced)
            }

            $($async)? fn delete(
                &mut self,
                key: String,
                expected_version: Option<u64>,
                now_ms: u64,
            ) -> Result<bool, wit_store::StoreError> {
                $call_store!(self.delete(&key, expected_version, now_ms)).map_err(Into::into)
            }
        }
    };
}

pub(super) use {bindings, flavour};
