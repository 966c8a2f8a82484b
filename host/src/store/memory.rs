//! Records in this process's memory: fast, and gone when it exits.

use super::{Entry, InsertOutcome, ListQuery, Record, Store, StoreError, SyncStore};
use async_trait::async_trait;
use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex};

/// Enough shards that 2–64 cores rarely wait on one another.
const SHARDS: usize = 64;

/// An in-memory store, sharded by key hash.
///
/// Each shard is a `std::sync::Mutex`: it is held only for a hash-map
/// operation, never across an `.await`, so an async mutex would only add cost.
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Shards>,
}

struct Shards {
    hasher: RandomState,
    shards: Vec<Mutex<HashMap<String, Entry>>>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    pub fn new() -> Self {
        MemoryStore {
            inner: Arc::new(Shards {
                hasher: RandomState::new(),
                shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            }),
        }
    }

    fn shard(&self, key: &str) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        let i = (self.inner.hasher.hash_one(key) as usize) % SHARDS;
        // A poisoned shard only means a panic elsewhere mid-operation; every
        // operation below leaves the map consistent, so keep serving.
        self.inner.shards[i]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn get_live(&self, key: &str, now_ms: u64) -> Option<Entry> {
        self.shard(key)
            .get(key)
            .filter(|e| e.record.is_live(now_ms))
            .cloned()
    }

    fn insert_live(&self, key: &str, record: Record, now_ms: u64) -> InsertOutcome {
        let mut shard = self.shard(key);
        match shard.get_mut(key) {
            Some(entry) if entry.record.is_live(now_ms) => InsertOutcome::Existing(entry.clone()),
            Some(expired) => {
                expired.version += 1;
                expired.record = record;
                InsertOutcome::Inserted(expired.version)
            }
            None => {
                shard.insert(key.to_owned(), Entry { record, version: 1 });
                InsertOutcome::Inserted(1)
            }
        }
    }

    fn replace_live(
        &self,
        key: &str,
        expected_version: u64,
        record: Record,
        now_ms: u64,
    ) -> Option<u64> {
        let mut shard = self.shard(key);
        match shard.get_mut(key) {
            Some(entry) if entry.version == expected_version && entry.record.is_live(now_ms) => {
                entry.version += 1;
                entry.record = record;
                Some(entry.version)
            }
            _ => None,
        }
    }

    /// How many records are held, live or expired-but-not-purged.
    pub fn len(&self) -> usize {
        self.inner
            .shards
            .iter()
            .map(|s| s.lock().map_or(0, |m| m.len()))
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn delete_at(&self, key: &str, expected_version: Option<u64>) -> bool {
        let mut shard = self.shard(key);
        match (shard.get(key), expected_version) {
            (Some(entry), Some(v)) if entry.version != v => false,
            (Some(_), _) => shard.remove(key).is_some(),
            (None, _) => false,
        }
    }

    /// Removes up to `limit` expired records, a shard at a time, and gives
    /// a shard's spare capacity back once it is mostly empty, so memory
    /// follows the live keys after a burst.
    fn purge(&self, now_ms: u64, limit: usize) -> usize {
        let mut purged = 0;
        for shard in &self.inner.shards {
            if purged >= limit {
                break;
            }
            let mut map = shard
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            map.retain(|_, e| {
                let expired = purged < limit && !e.record.is_live(now_ms);
                purged += usize::from(expired);
                !expired
            });
            if map.capacity() > 1024 && map.len() < map.capacity() / 4 {
                let keep = map.len() * 2;
                map.shrink_to(keep);
            }
        }
        purged
    }
}

impl SyncStore for MemoryStore {
    fn get_now(&self, key: &str, now_ms: u64) -> Result<Option<Entry>, StoreError> {
        Ok(self.get_live(key, now_ms))
    }

    fn insert_now(
        &self,
        key: &str,
        record: Record,
        now_ms: u64,
    ) -> Result<InsertOutcome, StoreError> {
        Ok(self.insert_live(key, record, now_ms))
    }

    fn replace_now(
        &self,
        key: &str,
        expected_version: u64,
        record: Record,
        now_ms: u64,
    ) -> Result<Option<u64>, StoreError> {
        Ok(self.replace_live(key, expected_version, record, now_ms))
    }

    fn delete_now(&self, key: &str, expected_version: Option<u64>) -> Result<bool, StoreError> {
        Ok(self.delete_at(key, expected_version))
    }
}

#[async_trait]
impl Store for MemoryStore {
    fn name(&self) -> &'static str {
        "memory"
    }

    async fn get(&self, key: &str, now_ms: u64) -> Result<Option<Entry>, StoreError> {
        Ok(self.get_live(key, now_ms))
    }

    async fn insert(
        &self,
        key: &str,
        record: Record,
        now_ms: u64,
    ) -> Result<InsertOutcome, StoreError> {
        Ok(self.insert_live(key, record, now_ms))
    }

    async fn replace(
        &self,
        key: &str,
        expected_version: u64,
        record: Record,
        now_ms: u64,
    ) -> Result<Option<u64>, StoreError> {
        Ok(self.replace_live(key, expected_version, record, now_ms))
    }

    async fn delete(&self, key: &str, expected_version: Option<u64>) -> Result<bool, StoreError> {
        Ok(self.delete_at(key, expected_version))
    }

    async fn list(
        &self,
        query: &ListQuery,
        now_ms: u64,
    ) -> Result<Vec<(String, Entry)>, StoreError> {
        // Sort and page on keys alone; clone only the page's records, so an
        // operator paging through 100,000 keys does not copy every response.
        let mut keys: Vec<String> = Vec::new();
        for shard in &self.inner.shards {
            let map = shard
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            keys.extend(
                map.iter()
                    .filter(|(k, e)| {
                        e.record.is_live(now_ms)
                            && k.starts_with(&query.prefix)
                            && query.state.is_none_or(|s| s == e.record.state)
                            && query.after.as_ref().is_none_or(|a| k.as_str() > a.as_str())
                    })
                    .map(|(k, _)| k.clone()),
            );
        }
        keys.sort_unstable();
        keys.truncate(query.limit);
        Ok(keys
            .into_iter()
            .filter_map(|k| {
                let entry = self
                    .shard(&k)
                    .get(&k)
                    .filter(|e| e.record.is_live(now_ms))
                    .cloned();
                entry.map(|e| (k, e))
            })
            .collect())
    }

    async fn purge_expired(&self, now_ms: u64, limit: usize) -> Result<usize, StoreError> {
        Ok(self.purge(now_ms, limit))
    }

    fn as_sync(&self) -> Option<Arc<dyn SyncStore>> {
        Some(Arc::new(self.clone()))
    }
}
