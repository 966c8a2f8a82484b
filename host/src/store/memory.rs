//! Records in this process's memory: fast, and gone when it exits.

use super::{Entry, InsertOutcome, ListQuery, Record, Result, Store, SyncStore};
use crate::clock::{Clock, LocalClock};
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
    inner: Arc<Inner>,
}

struct Inner {
    hasher: RandomState,
    shards: Vec<Mutex<HashMap<String, Entry>>>,
    /// Where the purge goes on from: each shard is scanned once a sweep.
    purge: Mutex<PurgeCursor>,
}

/// The purge's place between calls, so that freeing `n` expired records in
/// batches costs one scan of the store, not one per batch.
#[derive(Default)]
struct PurgeCursor {
    /// The shard to scan next.
    next: usize,
    /// Expired keys of shard `pending_shard` found by its scan but past the
    /// last call's limit; each is checked again before it is removed.
    pending: Vec<String>,
    pending_shard: usize,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    pub fn new() -> Self {
        MemoryStore {
            inner: Arc::new(Inner {
                hasher: RandomState::new(),
                shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
                purge: Mutex::default(),
            }),
        }
    }

    fn shard(&self, key: &str) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        let i = (self.inner.hasher.hash_one(key) as usize) % SHARDS;
        lock(&self.inner.shards[i])
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

    /// Removes up to `limit` expired records and gives a shard's spare
    /// capacity back once it is mostly empty, so memory follows the live
    /// keys after a burst.
    ///
    /// The shards are swept round robin from where the last call stopped:
    /// a shard is scanned once (its lock held for that scan), the expired
    /// keys past the limit are kept for the next call, and each is looked at
    /// again before it goes. So purging `n` records in batches costs one scan
    /// of the store plus `n` removals. A call returns fewer than `limit` only
    /// after it has itself scanned every shard.
    fn purge(&self, now_ms: u64, limit: usize) -> usize {
        let mut cursor = lock(&self.inner.purge);
        let mut purged = 0;
        let mut scanned = 0;
        while purged < limit {
            if cursor.pending.is_empty() {
                if scanned == SHARDS {
                    break;
                }
                let i = cursor.next;
                cursor.next = (i + 1) % SHARDS;
                scanned += 1;
                let mut map = lock(&self.inner.shards[i]);
                let pending = &mut cursor.pending;
                map.retain(|key, e| {
                    if e.record.is_live(now_ms) {
                        return true;
                    }
                    if purged < limit {
                        purged += 1;
                        return false;
                    }
                    pending.push(key.clone());
                    true
                });
                cursor.pending_shard = i;
                give_back_spare(&mut map);
                continue;
            }
            let mut map = lock(&self.inner.shards[cursor.pending_shard]);
            while purged < limit {
                let Some(key) = cursor.pending.pop() else {
                    break;
                };
                if map.get(&key).is_some_and(|e| !e.record.is_live(now_ms)) {
                    map.remove(&key);
                    purged += 1;
                }
            }
            give_back_spare(&mut map);
        }
        purged
    }
}

/// Locks a shard or the purge cursor. A poisoned lock only means a panic
/// elsewhere mid-operation; every operation leaves its map consistent.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Shrinks a shard that is mostly empty to twice what it holds.
fn give_back_spare(map: &mut HashMap<String, Entry>) {
    if map.capacity() > 1024 && map.len() < map.capacity() / 4 {
        map.shrink_to(map.len() * 2);
    }
}

/// The memory store's operations: each holds one shard's lock for one
/// hash-map operation and never waits on anything else.
impl SyncStore for MemoryStore {
    fn get_now(&self, key: &str, now_ms: u64) -> Result<Option<Entry>> {
        Ok(self
            .shard(key)
            .get(key)
            .filter(|e| e.record.is_live(now_ms))
            .cloned())
    }

    fn insert_now(&self, key: &str, record: Record, now_ms: u64) -> Result<InsertOutcome> {
        let mut shard = self.shard(key);
        Ok(match shard.get_mut(key) {
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
        })
    }

    fn replace_now(&self, key: &str, expected: u64, record: Record, now_ms: u64) -> Result<bool> {
        let mut shard = self.shard(key);
        Ok(match shard.get_mut(key) {
            // At u64's end there is no version to write (`wit/store.wit`).
            Some(entry)
                if entry.version == expected
                    && expected < u64::MAX
                    && entry.record.is_live(now_ms) =>
            {
                entry.version += 1;
                entry.record = record;
                true
            }
            _ => false,
        })
    }

    fn delete_now(&self, key: &str, expected_version: Option<u64>, now_ms: u64) -> Result<bool> {
        let mut shard = self.shard(key);
        Ok(match (shard.get(key), expected_version) {
            (Some(entry), _) if !entry.record.is_live(now_ms) => {
                shard.remove(key); // absent already: only its space is freed
                false
            }
            (Some(entry), Some(v)) if entry.version != v => false,
            (Some(_), _) => shard.remove(key).is_some(),
            (None, _) => false,
        })
    }
}

/// The async side answers at once, from the sync side.
#[async_trait]
impl Store for MemoryStore {
    async fn get(&self, key: &str, now_ms: u64) -> Result<Option<Entry>> {
        self.get_now(key, now_ms)
    }

    async fn insert(&self, key: &str, record: Record, now_ms: u64) -> Result<InsertOutcome> {
        self.insert_now(key, record, now_ms)
    }

    async fn replace(&self, key: &str, expected: u64, record: Record, now_ms: u64) -> Result<bool> {
        self.replace_now(key, expected, record, now_ms)
    }

    async fn delete(&self, key: &str, expected_version: Option<u64>, now_ms: u64) -> Result<bool> {
        self.delete_now(key, expected_version, now_ms)
    }

    fn name(&self) -> &'static str {
        "memory"
    }

    async fn list(&self, query: &ListQuery, now_ms: u64) -> Result<Vec<(String, Entry)>> {
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
                let entry = self.get_now(&k, now_ms).ok().flatten()?;
                Some((k, entry))
            })
            .collect())
    }

    async fn purge_expired(&self, now_ms: u64, limit: usize) -> Result<usize> {
        Ok(self.purge(now_ms, limit))
    }

    fn as_sync(&self) -> Option<Arc<dyn SyncStore>> {
        Some(Arc::new(self.clone()))
    }

    /// The records live and die with this process: its own clock.
    fn clock(&self) -> Arc<dyn Clock> {
        Arc::new(LocalClock)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::State;

    fn done(expires_at_ms: u64) -> Record {
        Record {
            fingerprint: "fp".into(),
            state: State::Done,
            holder: 1,
            lease_until_ms: 0,
            expires_at_ms,
            response: None,
            checkpoint: None,
        }
    }

    #[test]
    fn a_purge_in_batches_frees_every_expired_record_once_and_spares_the_live() {
        let store = MemoryStore::new();
        for i in 0..5_000 {
            store.insert_now(&format!("old{i}"), done(10), 0).unwrap();
            store
                .insert_now(&format!("live{i}"), done(1_000), 0)
                .unwrap();
        }
        let mut batches = Vec::new();
        loop {
            let n = store.purge(10, 700);
            batches.push(n);
            if n < 700 {
                break;
            }
        }
        // Full batches until the last: the cursor carries each call on
        // from where the last one stopped.
        assert_eq!(batches.iter().sum::<usize>(), 5_000, "{batches:?}");
        assert!(batches[..batches.len() - 1].iter().all(|&n| n == 700));
        assert_eq!(store.len(), 5_000);
        assert!((0..5_000).all(|i| store.get_now(&format!("live{i}"), 10).unwrap().is_some()));
        assert_eq!(store.purge(10, 700), 0);
    }

    #[test]
    fn a_key_claimed_again_after_the_scan_that_found_it_expired_is_spared() {
        let store = MemoryStore::new();
        for i in 0..2_000 {
            store.insert_now(&format!("k{i}"), done(10), 0).unwrap();
        }
        // One call scans a shard and keeps its expired keys past the limit.
        assert_eq!(store.purge(10, 1), 1);
        // Every key still held is claimed again before the next call.
        let mut reclaimed = 0;
        for i in 0..2_000 {
            if let InsertOutcome::Inserted(_) =
                store.insert_now(&format!("k{i}"), done(1_000), 20).unwrap()
            {
                reclaimed += 1;
            }
        }
        assert_eq!(reclaimed, 2_000);
        assert_eq!(store.purge(20, 10_000), 0);
        assert_eq!(store.len(), 2_000);
    }
}
