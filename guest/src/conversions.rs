//! The conversions between the types generated from `wit/` and the plain
//! [`model`](crate::model) types, written once for both sides of the
//! component boundary.
//!
//! wit-bindgen (the guest, on `wasm32`) and wasmtime's `bindgen!` (the host,
//! once per engine flavour) generate types of the same shape from the same
//! WIT: records with the same fields, variants with the same cases. So one
//! list of fields or cases per type, in [`wit_conversions!`], gives the
//! `From` impls both ways on either side; each side uses its half. All
//! moves, but for a record's head lent to a store write.
//!
//! The response is a resource (`wit/types.wit`): in the WIT the record
//! travels without it (an `entry` carries it beside the record, `replace`
//! takes it as a parameter of its own), in the model it sits in the record.
//! Each side says what its handle type is (`response:`); the model's
//! generic `R` is that type at the boundary.

/// Implements `From` both ways between each model type and the type
/// generated for it, in the module that invokes it.
///
/// `types`, `store` and `guard` name the modules, in scope where it is
/// invoked, that hold the generated types of the `types`, `store` and
/// `guard` interfaces; `response` is the type a `response` handle has in
/// those types.
#[macro_export]
macro_rules! wit_conversions {
    (types: $types:ident, store: $store:ident, guard: $guard:ident, response: $response:ty $(,)?) => {
        $crate::wit_conversions!(@variant $crate::model::State = $types::State {
            Processing, Done
        });
        $crate::wit_conversions!(@record $crate::model::Checkpoint = $types::Checkpoint {
            phase, data
        });
        // A record's head, for a store write: the response goes beside it.
        impl<R> From<&$crate::model::Record<R>> for $types::Record {
            fn from(record: &$crate::model::Record<R>) -> Self {
                Self {
                    fingerprint: record.fingerprint.clone(),
                    state: record.state.into(),
                    holder: record.holder,
                    lease_until_ms: record.lease_until_ms,
                    expires_at_ms: record.expires_at_ms,
                    checkpoint: record.checkpoint.clone().map(Into::into),
                }
            }
        }
        // A head as written, without a response (what `insert` writes;
        // `replace` adds the one it is given).
        impl<R> From<$types::Record> for $crate::model::Record<R> {
            fn from(record: $types::Record) -> Self {
                Self {
                    fingerprint: record.fingerprint,
                    state: record.state.into(),
                    holder: record.holder,
                    lease_until_ms: record.lease_until_ms,
                    expires_at_ms: record.expires_at_ms,
                    response: None,
                    checkpoint: record.checkpoint.map(Into::into),
                }
            }
        }
        impl From<$types::Entry> for $crate::model::Entry<$response> {
            fn from(entry: $types::Entry) -> Self {
                let mut record: $crate::model::Record<$response> = entry.record.into();
                record.response = entry.response;
                Self { record, version: entry.version }
            }
        }
        impl From<$crate::model::Entry<$response>> for $types::Entry {
            fn from(entry: $crate::model::Entry<$response>) -> Self {
                let $crate::model::Record {
                    fingerprint, state, holder, lease_until_ms, expires_at_ms, response, checkpoint,
                } = entry.record;
                Self {
                    record: $types::Record {
                        fingerprint,
                        state: state.into(),
                        holder,
                        lease_until_ms,
                        expires_at_ms,
                        checkpoint: checkpoint.map(Into::into),
                    },
                    response,
                    version: entry.version,
                }
            }
        }
        $crate::wit_conversions!(@variant $crate::model::StoreFailure = $store::StoreError {
            Unavailable(why), Corrupt(why)
        });
        $crate::wit_conversions!(@variant $crate::model::InsertOutcome<$response> = $store::InsertOutcome {
            Inserted(version), Existing(entry)
        });
        $crate::wit_conversions!(@record $crate::model::Policy = $guard::Policy {
            lease_ms, retention_ms, max_response_bytes
        });
        $crate::wit_conversions!(@record $crate::model::Claim = $guard::Claim {
            key, fingerprint, fence, holder, lease_until_ms, expires_at_ms; optional checkpoint
        });
        // WIT cases carry their value unnamed; the model names `retry_after_ms`.
        $crate::wit_conversions!(@variant $crate::model::Decision<$response> = $guard::Decision {
            Proceed(claim), Replay(response), InFlight { retry_after_ms }, Conflict
        });
        $crate::wit_conversions!(@variant $crate::model::GuardError = $guard::GuardError {
            Unavailable(why), InvalidInput(why), StaleClaim(why)
        });
    };

    // A record: field by field, an `optional` field inside its option.
    (@record $model:ty = $wit:ty {
        $($field:ident),+ $(; optional $($optional:ident),+)?
    }) => {
        $crate::wit_conversions!(@record_into $model => $wit { $($field),+ ; $($($optional),+)? });
        $crate::wit_conversions!(@record_into $wit => $model { $($field),+ ; $($($optional),+)? });
    };
    (@record_into $from:ty => $to:ty { $($field:ident),+ ; $($optional:ident),* }) => {
        // A field of the same type on both sides goes through `into` too.
        #[allow(clippy::useless_conversion)]
        impl From<$from> for $to {
            fn from(value: $from) -> Self {
                Self {
                    $($field: value.$field.into(),)+
                    $($optional: value.$optional.map(Into::into),)*
                }
            }
        }
    };

    // A variant: case by case, a case's value converted; a model case may
    // name the value that the WIT case carries unnamed (`Case { name }`).
    (@variant $model:ty = $wit:ty {
        $($case:ident $(($inner:ident))? $({ $named:ident })?),+ $(,)?
    }) => {
        #[allow(clippy::useless_conversion)]
        impl From<$model> for $wit {
            fn from(value: $model) -> Self {
                type Model = $model;
                match value {
                    $(Model::$case $(($inner))? $({ $named })? =>
                        Self::$case $(($inner.into()))? $(($named.into()))?,)+
                }
            }
        }
        #[allow(clippy::useless_conversion)]
        impl From<$wit> for $model {
            fn from(value: $wit) -> Self {
                type Wit = $wit;
                match value {
                    $(Wit::$case $(($inner))? $(($named))? =>
                        Self::$case $(($inner.into()))? $({ $named: $named.into() })?,)+
                }
            }
        }
    };
}
