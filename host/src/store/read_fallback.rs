//! Replays while a store refuses writes: [`ReadFallback<S>`] answers an
//! `insert` that failed as unavailable from one `get`, when that read finds
//! the key live. A Redis replica (`READONLY`), a PostgreSQL standby or
//! read-only session, a disk that refuses writes: a key that is done is
//! replayed from the read; anything that needs a write still fails closed.
//!
//! `wit/store.wit` allows it: `insert` on a live key MUST NOT write and MUST
//! return `existing` with the live record, which is what the read found. If
//! the failed insert was in fact applied (its reply lost), the read finds
//! that claim: the guard answers "in flight" (409) instead of 503, and the
//! claim is taken over after its lease as it would have been.
//!
//! ```
//! use idem::store::{FaultRule, Faulty, InsertOutcome, MemoryStore, Op, ReadFallback, Store};
//! use idem::{Record, State};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let (store, faults) = Faulty::new(MemoryStore::new());
//! let store = ReadFallback::new(store);
//! let record = Record {
//!     fingerprint: "fp".into(),
//!     state: State::Processing,
//!     holder: 7,
//!     lease_until_ms: 2_000,
//!     expires_at_ms: 10_000,
//!     response: None,
//!     checkpoint: None,
//! };
//! store.insert("order-1", record.clone(), 1_000).await.unwrap();
//! faults.set(Op::Insert, FaultRule::error("READONLY")).unwrap();
//! // The write is refused; the live record answers from a read.
//! let again = store.insert("order-1", record.clone(), 1_000).await.unwrap();
//! assert!(matches!(again, InsertOutcome::Existing(e) if e.record.holder == 7));
//! // A new key needs the write: it fails closed.
//! assert!(store.insert("order-2", record, 1_000).await.is_err());
//! # }
//! ```

use super::{Entry, InsertOutcome, ListQuery, Record, Result, Store, StoreError, SyncStore};
use crate::clock::Clock;
use async_trait::async_trait;
use std::sync::Arc;

/// `S`, with an `insert` that failed as unavailable answered from a read of
/// a live record. Every other call is handed on as it is.
pub struct ReadFallback<S> {
    inner: S,
}

impl<S: Store> ReadFallback<S> {
    pub fn new(inner: S) -> Self {
        ReadFallback { inner }
    }
}

#[async_trait]
impl<S: Store> Store for ReadFallback<S> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    async fn get(&self, key: &str, now_ms: u64) -> Result<Option<Entry>> {
        self.inner.get(key, now_ms).await
    }

    async fn insert(&self, key: &str, record: Record, now_ms: u64) -> Result<InsertOutcome> {
        match self.inner.insert(key, record, now_ms).await {
            Err(refused @ StoreError::Unavailable { .. }) => {
                match self.inner.get(key, now_ms).await {
                    Ok(Some(live)) => Ok(InsertOutcome::Existing(live)),
                    // Absent or expired (the write was needed), or the read
                    // failed too: the insert's own error.
                    Ok(None) | Err(_) => Err(refused),
                }
            }
            answered => answered,
        }
    }

    async fn replace(&self, key: &str, expected: u64, record: Record, now_ms: u64) -> Result<bool> {
        self.inner.replace(key, expected, record, now_ms).await
    }

    async fn delete(&self, key: &str, expected_version: Option<u64>, now_ms: u64) -> Result<bool> {
        self.inner.delete(key, expected_version, now_ms).await
    }

    async fn list(&self, query: &ListQuery, now_ms: u64) -> Result<Vec<(String, Entry)>> {
        self.inner.list(query, now_ms).await
    }

    async fn purge_expired(&self, now_ms: u64, limit: usize) -> Result<usize> {
        self.inner.purge_expired(now_ms, limit).await
    }

    fn purges_itself(&self) -> bool {
        self.inner.purges_itself()
    }

    fn clock(&self) -> Arc<dyn Clock> {
        self.inner.clock()
    }

    /// The inner store's own: a store with a sync side never waits on I/O
    /// (the memory store), and never has a write refused.
    fn as_sync(&self) -> Option<Arc<dyn SyncStore>> {
        self.inner.as_sync()
    }
}
