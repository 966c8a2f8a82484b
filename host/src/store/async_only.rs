//! `AsyncOnly<S>`: a store with its sync side hidden, so that the guard
//! calls it through the async flavour as it does a disk or network store.
//! For tests and benchmarks of that flavour over the memory store.

use super::{Entry, InsertOutcome, ListQuery, Record, Store, StoreError};
use async_trait::async_trait;

/// `S` with [`Store::as_sync`] answering `None`.
pub struct AsyncOnly<S>(pub S);

#[async_trait]
impl<S: Store> Store for AsyncOnly<S> {
    fn name(&self) -> &'static str {
        self.0.name()
    }
    async fn get(&self, key: &str, now_ms: u64) -> Result<Option<Entry>, StoreError> {
        self.0.get(key, now_ms).await
    }
    async fn insert(
        &self,
        key: &str,
        record: Record,
        now_ms: u64,
    ) -> Result<InsertOutcome, StoreError> {
        self.0.insert(key, record, now_ms).await
    }
    async fn replace(
        &self,
        key: &str,
        expected_version: u64,
        record: Record,
        now_ms: u64,
    ) -> Result<Option<u64>, StoreError> {
        self.0.replace(key, expected_version, record, now_ms).await
    }
    async fn delete(&self, key: &str, expected_version: Option<u64>) -> Result<bool, StoreError> {
        self.0.delete(key, expected_version).await
    }
    async fn list(
        &self,
        query: &ListQuery,
        now_ms: u64,
    ) -> Result<Vec<(String, Entry)>, StoreError> {
        self.0.list(query, now_ms).await
    }
    async fn purge_expired(&self, now_ms: u64, limit: usize) -> Result<usize, StoreError> {
        self.0.purge_expired(now_ms, limit).await
    }
    fn purges_itself(&self) -> bool {
        self.0.purges_itself()
    }
}
