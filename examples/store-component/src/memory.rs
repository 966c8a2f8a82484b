//! The store's logic over plain values: every MUST of `wit/store.wit`, with
//! no generated type in sight, so `cargo test` runs it natively.
//!
//! A store makes no decisions: it never looks at fingerprints, states or
//! leases, only at when a record expires. So what it keeps for a key is any
//! `V` that says that ([`Expiring`]); the component keeps the WIT record and
//! the bytes of its response (`lib.rs`), the tests a number and an instant.
//!
//! ```
//! use idem_store_component::memory::{Expiring, Inserted, MemoryStore};
//!
//! #[derive(Clone, Debug, PartialEq)]
//! struct Held { until_ms: u64 }
//! impl Expiring for Held {
//!     fn expires_at_ms(&self) -> u64 { self.until_ms }
//! }
//!
//! let mut store = MemoryStore::new();
//! assert_eq!(store.insert("k", Held { until_ms: 10 }, 0), Inserted::Inserted(1));
//! assert!(store.replace("k", 1, Held { until_ms: 20 }, 5));
//! assert_eq!(store.get("k", 19).map(|(held, version)| (held.until_ms, version)), Some((20, 2)));
//! assert!(store.get("k", 20).is_none(), "at expires-at-ms the record is absent");
//! ```

use alloc::collections::BTreeMap;
use alloc::string::String;
use core::ops::Bound;

/// What the store needs to know of what it keeps.
pub trait Expiring {
    /// From this instant on the record is absent to every primitive.
    fn expires_at_ms(&self) -> u64;
}

/// What `insert` did.
#[derive(Debug, PartialEq, Eq)]
pub enum Inserted<'a, V> {
    /// The key was absent or expired and now holds the value at this version.
    Inserted(u64),
    /// The key holds a live record (value, version); nothing was written.
    Existing(&'a V, u64),
}

/// How many keys each `insert` looks at, from where the last one stopped
/// (in key order, wrapping around), to free those expired for at least
/// [`GRACE_MS`]. An insert adds at most one key and looks at four, so a pass
/// over a store of `n` keys ends within `n / 3` inserts however the keys are
/// used, and memory follows the live keys.
pub const SWEEP_PER_INSERT: usize = 4;

/// How long (by the `now-ms` the guard passes) an expired record is kept
/// before a sweep frees it, as Redis keeps one past its expiry
/// (`wit/store-layout/README.md`): until then a new claim of the key goes on
/// from the expired record's version, so a claim made soon after a key
/// expired still has a higher fence than the last holder's. A freed key
/// starts again at version 1 (it is absent), as a dropped Redis key does.
pub const GRACE_MS: u64 = 60_000;

/// The records of one store, by key, each with the version the store gave it.
#[derive(Debug)]
pub struct MemoryStore<V> {
    records: BTreeMap<String, Slot<V>>,
    /// The last key the sweep looked at; it goes on after it.
    swept_to: Option<String>,
}

impl<V: Expiring> Default for MemoryStore<V> {
    fn default() -> Self {
        MemoryStore::new()
    }
}

#[derive(Debug)]
struct Slot<V> {
    value: V,
    version: u64,
}

impl<V> Slot<V>
where
    V: Expiring,
{
    fn is_live(&self, now_ms: u64) -> bool {
        now_ms < self.value.expires_at_ms()
    }
}

impl<V: Expiring> MemoryStore<V> {
    pub const fn new() -> Self {
        MemoryStore {
            records: BTreeMap::new(),
            swept_to: None,
        }
    }

    /// How many records are held, live or expired but not freed yet.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The live record for `key` and its version; `None` when it is absent
    /// or expired (`expires-at-ms` at or before `now_ms`).
    pub fn get(&self, key: &str, now_ms: u64) -> Option<(&V, u64)> {
        self.records
            .get(key)
            .filter(|slot| slot.is_live(now_ms))
            .map(|slot| (&slot.value, slot.version))
    }

    /// Writes `value` only if `key` is absent or expired: version 1 for an
    /// absent key, the expired record's version plus one over an expired
    /// one (a record at `u64::MAX` is replaced at 1: no fence of it can be
    /// live, its record having expired). A live record is returned instead.
    pub fn insert(&mut self, key: &str, value: V, now_ms: u64) -> Inserted<'_, V> {
        self.sweep(key, now_ms);
        // Lookups rather than `entry`: a key already held (every repeat)
        // is not copied to look it up.
        match self.records.get(key).map(|slot| slot.is_live(now_ms)) {
            Some(true) => {
                let slot = &self.records[key];
                Inserted::Existing(&slot.value, slot.version)
            }
            Some(false) => {
                let slot = self.records.get_mut(key).expect("looked up above");
                slot.version = slot.version.checked_add(1).unwrap_or(1);
                slot.value = value;
                Inserted::Inserted(slot.version)
            }
            None => {
                self.records.insert(key.into(), Slot { value, version: 1 });
                Inserted::Inserted(1)
            }
        }
    }

    /// Overwrites the live record at `expected_version` with `value` at
    /// `expected_version + 1`; `false`, writing nothing, when the key is
    /// absent, expired, at another version, or the next version would
    /// overflow a u64.
    pub fn replace(&mut self, key: &str, expected_version: u64, value: V, now_ms: u64) -> bool {
        let Some(slot) = self.records.get_mut(key) else {
            return false;
        };
        let Some(next) = expected_version.checked_add(1) else {
            return false;
        };
        if slot.version != expected_version || !slot.is_live(now_ms) {
            return false;
        }
        *slot = Slot {
            value,
            version: next,
        };
        true
    }

    /// Removes the live record (with `expected_version`, only at that
    /// version); whether one was removed. An expired record is freed and
    /// counts as absent.
    pub fn delete(&mut self, key: &str, expected_version: Option<u64>, now_ms: u64) -> bool {
        let Some(slot) = self.records.get(key) else {
            return false;
        };
        if !slot.is_live(now_ms) {
            self.records.remove(key);
            return false;
        }
        if expected_version.is_some_and(|v| v != slot.version) {
            return false;
        }
        self.records.remove(key).is_some()
    }

    /// Frees the records expired for [`GRACE_MS`] among the next
    /// [`SWEEP_PER_INSERT`] keys after the last one swept (wrapping around),
    /// leaving `keep` alone (the key being inserted: its version goes on
    /// from the expired record's).
    fn sweep(&mut self, keep: &str, now_ms: u64) {
        let from = match self.swept_to.take() {
            Some(last) => Bound::Excluded(last),
            None => Bound::Unbounded,
        };
        let mut expired = alloc::vec::Vec::new();
        let mut last = None;
        let after = self.records.range::<String, _>((from, Bound::Unbounded));
        let wrapped = self.records.iter();
        for (key, slot) in after
            .chain(wrapped)
            .take(SWEEP_PER_INSERT.min(self.records.len()))
        {
            let freeable = now_ms >= slot.value.expires_at_ms().saturating_add(GRACE_MS);
            if freeable && key != keep {
                expired.push(key.clone());
            }
            last = Some(key);
        }
        self.swept_to = last.cloned();
        for key in expired {
            self.records.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::format;
    use alloc::string::ToString;

    #[derive(Clone, Debug, PartialEq, Eq)]
    struct Held {
        name: &'static str,
        until_ms: u64,
    }

    impl Expiring for Held {
        fn expires_at_ms(&self) -> u64 {
            self.until_ms
        }
    }

    fn held(name: &'static str, until_ms: u64) -> Held {
        Held { name, until_ms }
    }

    fn read(store: &MemoryStore<Held>, key: &str, now_ms: u64) -> Option<(&'static str, u64)> {
        store.get(key, now_ms).map(|(v, version)| (v.name, version))
    }

    #[test]
    fn absent_keys_are_inserted_at_version_1_and_read_back() {
        let mut store = MemoryStore::new();
        assert_eq!(read(&store, "k", 0), None);
        assert_eq!(store.insert("k", held("a", 100), 0), Inserted::Inserted(1));
        assert_eq!(read(&store, "k", 99), Some(("a", 1)));
    }

    #[test]
    fn a_live_record_is_returned_by_insert_and_not_overwritten() {
        let mut store = MemoryStore::new();
        store.insert("k", held("a", 100), 0);
        assert_eq!(
            store.insert("k", held("b", 200), 99),
            Inserted::Existing(&held("a", 100), 1)
        );
        assert_eq!(read(&store, "k", 50), Some(("a", 1)));
    }

    /// `expires-at-ms` at or before now: absent to every primitive, purged or not.
    #[test]
    fn a_record_is_absent_from_its_expiry_instant_on() {
        let mut store = MemoryStore::new();
        store.insert("k", held("a", 100), 0);
        assert_eq!(read(&store, "k", 99), Some(("a", 1)));
        assert_eq!(read(&store, "k", 100), None);
        assert!(!store.replace("k", 1, held("b", 300), 100));
        assert!(!store.delete("k", None, 100));
        assert_eq!(read(&store, "k", 50), None, "delete freed it");
    }

    #[test]
    fn an_expired_record_is_overwritten_at_a_greater_version() {
        let mut store = MemoryStore::new();
        store.insert("k", held("a", 100), 0);
        assert!(store.replace("k", 1, held("a2", 100), 10));
        assert_eq!(
            store.insert("k", held("b", 300), 100),
            Inserted::Inserted(3)
        );
        assert_eq!(read(&store, "k", 299), Some(("b", 3)));
    }

    #[test]
    fn replace_writes_only_at_the_expected_version_and_raises_it_by_one() {
        let mut store = MemoryStore::new();
        store.insert("k", held("a", 100), 0);
        assert!(!store.replace("k", 2, held("x", 100), 1), "another version");
        assert!(!store.replace("absent", 1, held("x", 100), 1));
        assert!(store.replace("k", 1, held("b", 100), 1));
        assert!(
            !store.replace("k", 1, held("c", 100), 1),
            "the version moved"
        );
        assert_eq!(read(&store, "k", 1), Some(("b", 2)));
        assert!(store.replace("k", 2, held("c", 100), 1));
        assert_eq!(read(&store, "k", 1), Some(("c", 3)));
    }

    /// `expected-version + 1` overflows: nothing is written.
    #[test]
    fn replace_at_the_last_version_writes_nothing() {
        let mut store = MemoryStore::new();
        store.insert("k", held("a", 100), 0);
        store.records.get_mut("k").unwrap().version = u64::MAX;
        assert!(!store.replace("k", u64::MAX, held("b", 100), 1));
        assert_eq!(read(&store, "k", 1), Some(("a", u64::MAX)));
    }

    #[test]
    fn delete_removes_the_live_record_at_any_or_the_given_version() {
        let mut store = MemoryStore::new();
        store.insert("k", held("a", 100), 0);
        assert!(!store.delete("k", Some(2), 1), "another version");
        assert_eq!(read(&store, "k", 1), Some(("a", 1)));
        assert!(store.delete("k", Some(1), 1));
        assert!(!store.delete("k", None, 1), "already gone");
        assert_eq!(store.insert("k", held("b", 100), 2), Inserted::Inserted(1));
        assert!(store.delete("k", None, 2));
        assert!(store.is_empty());
    }

    /// Keys written once and never read again do not stay forever.
    #[test]
    fn inserts_free_expired_records_as_they_go() {
        let mut store = MemoryStore::new();
        for i in 0..1000 {
            store.insert(&format!("old-{i:04}"), held("old", 10), 0);
        }
        store.insert("live", held("live", 1_000_000), 0);
        assert_eq!(store.len(), 1001);
        // A pass over 1001 keys, which each insert looks at four of and
        // adds one to, ends within 1001 / 3 inserts (the new keys sort
        // before the old ones: the pass goes over them too).
        let inserts = 1001 / (SWEEP_PER_INSERT - 1) + 1;
        for i in 0..inserts {
            store.insert(
                &format!("new-{i:04}"),
                held("new", 1_000_000),
                10 + GRACE_MS,
            );
        }
        assert!(
            !store.records.keys().any(|k| k.starts_with("old-")),
            "{} expired records left",
            store
                .records
                .keys()
                .filter(|k| k.starts_with("old-"))
                .count()
        );
        assert_eq!(read(&store, "live", 10), Some(("live", 1)));
        assert_eq!(store.len(), 1 + inserts);
    }

    /// Within the grace an expired record stays, so a new claim of its key
    /// gets a higher version than the last holder's fence.
    #[test]
    fn expired_records_are_kept_for_the_grace() {
        let mut store = MemoryStore::new();
        store.insert("a", held("a", 10), 0);
        assert!(store.replace("a", 1, held("a", 10), 0));
        for i in 0..10 {
            store.insert(&format!("b{i}"), held("b", 1_000_000), 10 + GRACE_MS - 1);
        }
        assert_eq!(store.len(), 11, "nothing freed");
        assert_eq!(
            store.insert("a", held("a2", 1_000_000), 10 + GRACE_MS - 1),
            Inserted::Inserted(3)
        );
        // Now "a" expires at 20 and is freed once the grace has passed.
        store.records.get_mut("a").unwrap().value.until_ms = 20;
        for i in 0..10 {
            store.insert(&format!("c{i}"), held("c", 1_000_000), 20 + GRACE_MS);
        }
        assert_eq!(read(&store, "a", 0), None, "freed once the grace is over");
        assert_eq!(
            store.insert("a", held("a3", 1_000_000), 20 + GRACE_MS),
            Inserted::Inserted(1)
        );
    }

    /// The expired record of the key being inserted stays, so the new
    /// version goes on from its version.
    #[test]
    fn the_sweep_leaves_the_inserted_keys_expired_record_alone() {
        let mut store = MemoryStore::new();
        store.insert("a", held("a", 10), 0);
        assert!(store.replace("a", 1, held("a", 10), 0));
        // Long past the grace: the sweep this insert makes looks at "a" and
        // would free it, but it is the key being inserted.
        let later = 10 + GRACE_MS + 1;
        assert_eq!(
            store.insert("a", held("a2", later + 100), later),
            Inserted::Inserted(3)
        );
        assert_eq!(read(&store, "a", later), Some(("a2", 3)));
        assert_eq!("a".to_string(), store.swept_to.unwrap());
    }
}
