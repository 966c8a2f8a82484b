//! Conversions between the types `bindgen!` generates and the plain model
//! types, written once and expanded into each flavour's module (the async
//! and the sync bindings generate distinct, identical types).
//!
//! The expanding module must have in scope: `wit` (the exported guard
//! interface), `wit_store` and `wit_types` (the imported interfaces).
//! All moves: no string or body is copied.

macro_rules! wit_glue {
    () => {
        use crate::store::StoreError;
        use idem_guest::model::{self, GuardError};

        #[allow(clippy::needless_pass_by_value)] // used as `map_err(to_wit_store_error)`
        fn to_wit_store_error(e: StoreError) -> wit_store::StoreError {
            match e {
                StoreError::Unavailable { .. } => wit_store::StoreError::Unavailable(e.to_string()),
                StoreError::Corrupt { .. } => wit_store::StoreError::Corrupt(e.to_string()),
            }
        }

        fn to_wit_insert_outcome(
            r: Result<model::InsertOutcome, StoreError>,
        ) -> Result<wit_store::InsertOutcome, wit_store::StoreError> {
            match r {
                Ok(model::InsertOutcome::Inserted(v)) => Ok(wit_store::InsertOutcome::Inserted(v)),
                Ok(model::InsertOutcome::Existing(e)) => {
                    Ok(wit_store::InsertOutcome::Existing(to_wit_entry(e)))
                }
                Err(e) => Err(to_wit_store_error(e)),
            }
        }

        fn to_wit_entry(e: model::Entry) -> wit_types::Entry {
            let r = e.record;
            wit_types::Entry {
                record: wit_types::Record {
                    fingerprint: r.fingerprint,
                    state: match r.state {
                        model::State::Processing => wit_types::State::Processing,
                        model::State::Done => wit_types::State::Done,
                    },
                    lease_until_ms: r.lease_until_ms,
                    expires_at_ms: r.expires_at_ms,
                    response: r.response.map(to_wit_response),
                },
                version: e.version,
            }
        }

        fn from_wit_record(r: wit_types::Record) -> model::Record {
            model::Record {
                fingerprint: r.fingerprint,
                state: match r.state {
                    wit_types::State::Processing => model::State::Processing,
                    wit_types::State::Done => model::State::Done,
                },
                lease_until_ms: r.lease_until_ms,
                expires_at_ms: r.expires_at_ms,
                response: r.response.map(from_wit_response),
            }
        }

        fn to_wit_response(r: model::Response) -> wit_types::Response {
            wit_types::Response {
                status: r.status,
                headers: r.headers,
                body: r.body,
            }
        }

        fn from_wit_response(r: wit_types::Response) -> model::Response {
            model::Response {
                status: r.status,
                headers: r.headers,
                body: r.body,
            }
        }

        fn to_wit_policy(p: &model::Policy) -> wit::Policy {
            wit::Policy {
                lease_ms: p.lease_ms,
                retention_ms: p.retention_ms,
                max_response_bytes: p.max_response_bytes,
            }
        }

        fn to_wit_claim(c: model::Claim) -> wit::Claim {
            wit::Claim {
                key: c.key,
                fingerprint: c.fingerprint,
                fence: c.fence,
                lease_until_ms: c.lease_until_ms,
                expires_at_ms: c.expires_at_ms,
            }
        }

        fn from_wit_claim(c: wit::Claim) -> model::Claim {
            model::Claim {
                key: c.key,
                fingerprint: c.fingerprint,
                fence: c.fence,
                lease_until_ms: c.lease_until_ms,
                expires_at_ms: c.expires_at_ms,
            }
        }

        fn from_wit_decision(d: wit::Decision) -> model::Decision {
            match d {
                wit::Decision::Proceed(c) => model::Decision::Proceed(from_wit_claim(c)),
                wit::Decision::Replay(r) => model::Decision::Replay(from_wit_response(r)),
                wit::Decision::InFlight(ms) => model::Decision::InFlight { retry_after_ms: ms },
                wit::Decision::Conflict => model::Decision::Conflict,
            }
        }

        fn from_wit_error(e: wit::GuardError) -> GuardError {
            match e {
                wit::GuardError::Unavailable(why) => GuardError::Unavailable(why),
                wit::GuardError::InvalidInput(why) => GuardError::InvalidInput(why),
                wit::GuardError::StaleClaim(why) => GuardError::StaleClaim(why),
            }
        }

        fn to_wit_parts(parts: &crate::RequestParts) -> wit::RequestParts {
            wit::RequestParts {
                method: parts.method.clone(),
                path: parts.path.clone(),
                headers: parts.headers.clone(),
                body: parts.body.clone(),
            }
        }
    };
}

pub(super) use wit_glue;
