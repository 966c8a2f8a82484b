//! Where records live. A store does atomic reads and writes on one key and
//! nothing else: every decision is the guard's.
//!
//! The atomic operations are required methods with no default, so no store
//! can fall back to a racy read-then-write.
//!
//! ```
//! use idem::store::{MemoryStore, Store, InsertOutcome};
//! use idem::{Record, State};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let store = MemoryStore::new();
//! let record = Record {
//!     fingerprint: "fp".into(),
//!     state: State::Processing,
//!     holder: 42,
//!     lease_until_ms: 2_000,
//!     expires_at_ms: 10_000,
//!     response: None,
//!     checkpoint: None,
//! };
//! let first = store.insert("order-1", record.clone(), 1_000).await.unwrap();
//! assert_eq!(first, InsertOutcome::Inserted(1));
//! // A second insert finds the live record instead of writing.
//! assert!(matches!(store.insert("order-1", record, 1_000).await.unwrap(), InsertOutcome::Existing(_)));
//! # }
//! ```

mod fault_rule;
pub use fault_rule::{FaultKind, FaultRule, Op, ParseFaultError};
pub use idem_guest::model::{Entry, InsertOutcome, Record, State};

// Everything below is the engine's (feature `engine`, on by default); the
// rules above are all the `gateway` fuzz target needs.
#[cfg(feature = "engine")]
mod codec;
#[cfg(feature = "engine")]
mod deferred;
#[cfg(feature = "dynamodb")]
mod dynamodb;
#[cfg(feature = "engine")]
mod faulty;
#[cfg(feature = "engine")]
mod hooked;
#[cfg(feature = "engine")]
mod memory;
#[cfg(feature = "engine")]
mod open;
// What the network stores read from their URLs.
#[cfg(any(feature = "redis", feature = "postgres", feature = "dynamodb"))]
mod params;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "engine")]
mod purge;
#[cfg(feature = "engine")]
mod read_fallback;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "sqlite")]
mod sqlite;
#[cfg(feature = "engine")]
mod stack;
#[cfg(feature = "engine")]
mod timing;

#[cfg(feature = "engine")]
pub use self::{
    deferred::{ATTEMPT_TIMEOUT, Connection, FIRST_RETRY, LAST_RETRY, connect},
    faulty::{FaultHandle, Faulty},
    hooked::{AsyncOnly, HideSync, Hook, Hooked, Plan},
    memory::MemoryStore,
    open::{OpenError, open, store_name},
    purge::{PurgeStats, Purger, purge_all},
    read_fallback::ReadFallback,
    stack::{Stack, stack},
    timing::{CallListener, Latencies, Percentiles, Timed, Timing},
};
#[cfg(feature = "dynamodb")]
pub use dynamodb::DynamoDbStore;
#[cfg(feature = "postgres")]
pub use postgres::PostgresStore;
#[cfg(feature = "redis")]
pub use redis::RedisStore;
#[cfg(feature = "sqlite")]
pub use sqlite::{SqliteOptions, SqliteStore, Synchronous};

#[cfg(feature = "engine")]
use crate::clock::Clock;
#[cfg(feature = "engine")]
use async_trait::async_trait;
#[cfg(feature = "engine")]
use std::sync::Arc;

/// Why a store operation failed. The guard fails closed on either.
#[cfg(feature = "engine")]
#[derive(Clone, Debug)]
pub enum StoreError {
    /// The store could not be reached or did not answer in time. A write
    /// whose reply was lost may have been applied.
    Unavailable {
        store: &'static str,
        reason: String,
        /// The driver's own error, when one caused this, for a caller that
        /// acts on its kind (its text is already in `reason`). Shared, so
        /// that one failed batch answers each of its writes.
        source: Option<Arc<dyn std::error::Error + Send + Sync>>,
    },
    /// The bytes stored for a key do not decode.
    Corrupt {
        store: &'static str,
        key: String,
        reason: String,
    },
}

#[cfg(feature = "engine")]
impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Unavailable { store, reason, .. } => {
                write!(f, "{store} store unavailable: {reason}")
            }
            StoreError::Corrupt { store, key, reason } => write!(
                f,
                "{store} store: the record for key {key:?} does not decode: {reason}"
            ),
        }
    }
}

/// Written out rather than derived: the source is the driver's error itself
/// (so a caller can downcast it), not the `Arc` that shares it.
#[cfg(feature = "engine")]
impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StoreError::Unavailable {
                source: Some(source),
                ..
            } => Some(&**source),
            _ => None,
        }
    }
}

/// Equal when they say the same; the driver's error, which has no equality
/// of its own, is not compared.
#[cfg(feature = "engine")]
impl PartialEq for StoreError {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (
                StoreError::Unavailable { store, reason, .. },
                StoreError::Unavailable {
                    store: other_store,
                    reason: other_reason,
                    ..
                },
            ) => store == other_store && reason == other_reason,
            (
                StoreError::Corrupt { store, key, reason },
                StoreError::Corrupt {
                    store: other_store,
                    key: other_key,
                    reason: other_reason,
                },
            ) => store == other_store && key == other_key && reason == other_reason,
            _ => false,
        }
    }
}

#[cfg(feature = "engine")]
impl Eq for StoreError {}

/// What a store operation returns: its value, or why it failed.
#[cfg(feature = "engine")]
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// A page of live records for operators, in key order.
#[cfg(feature = "engine")]
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListQuery {
    /// Only keys starting with this.
    pub prefix: String,
    /// Only records in this state.
    pub state: Option<State>,
    /// Only keys after this one (the previous page's last key).
    pub after: Option<String>,
    pub limit: usize,
}

/// The atomic primitives of `wit/store.wit`, for one key at a time.
///
/// Every method treats a record whose `expires_at_ms` is at or before
/// `now_ms` as absent, whether or not a purge has removed it yet.
#[cfg(feature = "engine")]
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// A short name for errors and metrics: `memory`, `sqlite`, `redis`, `postgres`, `dynamodb`.
    fn name(&self) -> &'static str;

    /// The live record for `key`, or `None` when absent or expired.
    async fn get(&self, key: &str, now_ms: u64) -> Result<Option<Entry>>;

    /// Writes `record` only if `key` is absent or expired (version 1, or the
    /// expired record's version + 1); otherwise returns the live record.
    async fn insert(&self, key: &str, record: Record, now_ms: u64) -> Result<InsertOutcome>;

    /// Overwrites the live record only if its version is `expected`, which
    /// makes it `expected + 1`; whether it did. The new version is not the
    /// store's to choose, so it is not returned: the engine hands
    /// `expected + 1` to the component (`wit/store.wit`'s `replace`).
    async fn replace(&self, key: &str, expected: u64, record: Record, now_ms: u64) -> Result<bool>;

    /// Removes the live record (only at `expected_version`, when given);
    /// whether it did. An expired record is absent: false (it may be freed).
    async fn delete(&self, key: &str, expected_version: Option<u64>, now_ms: u64) -> Result<bool>;

    /// The store's time authority (`wit/clock.wit`): the clock every guard
    /// on this store judges leases and retention by, unless a test gives
    /// the guard another. A store shared by several hosts answers its
    /// server's clock ([`SyncedClock`](crate::clock::SyncedClock)); one
    /// private to this process, [`LocalClock`](crate::clock::LocalClock).
    /// Never the host's wall clock: it steps, and hosts disagree.
    fn clock(&self) -> Arc<dyn Clock>;

    /// Live records matching `query`, in key order.
    async fn list(&self, query: &ListQuery, now_ms: u64) -> Result<Vec<(String, Entry)>>;

    /// Frees the space of up to `limit` expired records; returns how many.
    /// Reads never depend on it. Fewer than `limit` means this call found no
    /// more expired by `now_ms` (the [`Purger`] stops there), so a store that
    /// goes on between calls from where the last stopped (memory, Redis) must
    /// have looked at every record within the short call itself.
    async fn purge_expired(&self, now_ms: u64, limit: usize) -> Result<usize>;

    /// Whether the store frees expired records by itself (Redis, by the
    /// keys' own expiry), so that a guard starts no [`Purger`] for it.
    fn purges_itself(&self) -> bool {
        false
    }

    /// The same store, when it answers without waiting on I/O (the memory
    /// store). The guard then calls the component synchronously, with no
    /// async machinery in between: several times faster per call. A store
    /// that talks to a server or a disk answers `None`, the default.
    fn as_sync(&self) -> Option<Arc<dyn SyncStore>> {
        None
    }
}

/// The atomic primitives for a store that never waits on I/O: each call
/// finishes in a bounded, short time without `.await`. Same contracts as the
/// [`Store`] methods of the same names.
#[cfg(feature = "engine")]
pub trait SyncStore: Send + Sync + 'static {
    fn get_now(&self, key: &str, now_ms: u64) -> Result<Option<Entry>>;
    fn insert_now(&self, key: &str, record: Record, now_ms: u64) -> Result<InsertOutcome>;
    fn replace_now(&self, key: &str, expected: u64, record: Record, now_ms: u64) -> Result<bool>;
    fn delete_now(&self, key: &str, expected_version: Option<u64>, now_ms: u64) -> Result<bool>;

    /// Whether a call made now might have to wait (a [`Faulty`] store with
    /// an injected delay). The guard then makes that call through the async
    /// flavour, which can wait without holding up the thread.
    fn would_wait(&self) -> bool {
        false
    }
}

/// `Arc<S>` hands each call to `S`.
#[cfg(feature = "engine")]
#[async_trait]
impl<S: Store + ?Sized> Store for Arc<S> {
    fn name(&self) -> &'static str {
        (**self).name()
    }
    async fn get(&self, key: &str, now_ms: u64) -> Result<Option<Entry>> {
        (**self).get(key, now_ms).await
    }
    async fn insert(&self, key: &str, record: Record, now_ms: u64) -> Result<InsertOutcome> {
        (**self).insert(key, record, now_ms).await
    }
    async fn replace(&self, key: &str, expected: u64, record: Record, now_ms: u64) -> Result<bool> {
        (**self).replace(key, expected, record, now_ms).await
    }
    async fn delete(&self, key: &str, expected_version: Option<u64>, now_ms: u64) -> Result<bool> {
        (**self).delete(key, expected_version, now_ms).await
    }
    fn clock(&self) -> Arc<dyn Clock> {
        (**self).clock()
    }
    async fn list(&self, query: &ListQuery, now_ms: u64) -> Result<Vec<(String, Entry)>> {
        (**self).list(query, now_ms).await
    }
    async fn purge_expired(&self, now_ms: u64, limit: usize) -> Result<usize> {
        (**self).purge_expired(now_ms, limit).await
    }
    fn purges_itself(&self) -> bool {
        (**self).purges_itself()
    }
    fn as_sync(&self) -> Option<Arc<dyn SyncStore>> {
        (**self).as_sync()
    }
}
