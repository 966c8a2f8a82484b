//! What every backend needs to turn a record into its own columns or bytes
//! and back, written once.

use super::StoreError;

/// `store` could not be reached, or did not answer as it should.
pub(super) fn unavailable(store: &'static str, reason: impl Into<String>) -> StoreError {
    StoreError::Unavailable {
        store,
        reason: reason.into(),
    }
}
